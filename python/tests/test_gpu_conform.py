"""On a GPU with PyTorch: what the cudnn frontend's own tests ask of buffers and attention, as
they ask it. Inputs that are expanded or overlapping views of their memory (the frontend's GQA
references and broadcast operands), K and V with different head counts, the band on the
bottom-right diagonal with a positive right bound, and the dropout mask as an output
(`rng_dump`), each against PyTorch. Skipped where torch or a CUDA device is missing."""

import pytest

torch = pytest.importorskip("torch")

import ferrodnn as cudnn  # noqa: E402

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and cudnn.gpu_available()), reason="needs a CUDA device usable by ferrodnn and PyTorch")

HALF, FLOAT = cudnn.data_type.HALF, cudnn.data_type.FLOAT


def new_graph(handle, io=HALF):
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    return cudnn.pygraph(io_data_type=io, intermediate_data_type=FLOAT, compute_data_type=FLOAT, handle=handle)


def build(graph):
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    return torch.empty(graph.get_workspace_size(), device="cuda", dtype=torch.uint8)


@pytest.mark.parametrize("view", ["rows_expanded", "rows_overlap", "b_transposed_expanded"])
def test_matmul_reads_views_whose_elements_share_memory(handle, view):
    torch.manual_seed(1)
    m, k, n = 128, 64, 96
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    if view == "rows_expanded":
        a = torch.randn(1, k, device="cuda", dtype=torch.float16).expand(m, k)
    elif view == "rows_overlap":
        a = torch.randn(m * 8 + k, device="cuda", dtype=torch.float16).as_strided((m, k), (8, 1))
    else:
        b = torch.randn(1, k, device="cuda", dtype=torch.float16).t().expand(k, n)
    graph = new_graph(handle)
    A, B = graph.tensor_like(a), graph.tensor_like(b)
    assert A.get_stride() == list(a.stride()) and B.get_stride() == list(b.stride())
    C = graph.matmul(A=A, B=B)
    C.set_output(True)
    workspace = build(graph)
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
    graph.execute({A: a, B: b, C: c}, workspace)
    torch.cuda.synchronize()
    torch.testing.assert_close(c.float(), a.float() @ b.float(), atol=5e-2, rtol=1e-2)


def reference(q, k, v, scale, left=None, right=None, align_br=False, keep=None, p=0.0):
    """softmax(q k^T scale, the band masked) v in float, K and V repeated to q's heads, as the
    frontend's reference computes it (left: keys at or below diag - left masked; right: keys
    above diag + right)."""
    hq = q.shape[1]
    k = k.float().repeat_interleave(hq // k.shape[1], 1)
    v = v.float().repeat_interleave(hq // v.shape[1], 1)
    s = torch.einsum("bhid,bhjd->bhij", q.float(), k) * scale
    sq, skv = q.shape[2], k.shape[2]
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(skv, device=q.device)[None, :]
    diag = i + (skv - sq if align_br else 0)
    mask = torch.zeros(sq, skv, dtype=torch.bool, device=q.device)
    if right is not None:
        mask |= j > diag + right
    if left is not None:
        mask |= j <= diag - left
    s = s.masked_fill(mask, float("-inf"))
    probs = torch.softmax(s, -1)
    if keep is not None:
        probs = probs * keep / (1 - p)
    return probs @ v


def test_sdpa_reads_expanded_and_overlapping_q_k_v(handle):
    """K expanded over its heads (the frontend's GQA reference expands K and V so), Q's rows
    overlapping, V expanded over the batch; the fast attention kernels read them (or decline)."""
    torch.manual_seed(2)
    b, h, sq, skv, d = 2, 4, 96, 128, 64
    q = torch.randn(b * h * sq * 8 + d, device="cuda", dtype=torch.float16).as_strided((b, h, sq, d), (h * sq * 8, sq * 8, 8, 1))
    k = torch.randn(b, 1, skv, d, device="cuda", dtype=torch.float16).expand(b, h, skv, d)
    v = torch.randn(1, h, skv, d, device="cuda", dtype=torch.float16).expand(b, h, skv, d)
    graph = new_graph(handle)
    Q, K, V = graph.tensor_like(q), graph.tensor_like(k), graph.tensor_like(v)
    O, _ = graph.sdpa(q=Q, k=K, v=V, generate_stats=False, attn_scale=0.125, use_causal_mask=True)
    o = torch.empty(b, h, sq, d, device="cuda", dtype=torch.float16)
    O.set_output(True).set_dim(list(o.shape)).set_stride(list(o.stride()))
    workspace = build(graph)
    graph.execute({Q: q, K: k, V: v, O: o}, workspace)
    torch.cuda.synchronize()
    torch.testing.assert_close(o.float(), reference(q, k, v, 0.125, right=0), atol=5e-3, rtol=3e-3)


def test_sdpa_kv_heads_differ_bottom_right_band_and_rng_dump(handle):
    """The frontend's keywords: K and V of different head counts and head dims, the band on the
    bottom-right diagonal with both bounds, dropout with its mask in `rng_dump`; forward and
    backward against PyTorch with that mask."""
    torch.manual_seed(3)
    b, hq, hk, hv, sq, skv, d, dv = 2, 4, 2, 1, 48, 80, 64, 32
    scale, left, right, p = 0.125, 24, 8, 0.2
    q = torch.randn(b, hq, sq, d, device="cuda", dtype=torch.float16)
    k = torch.randn(b, hk, skv, d, device="cuda", dtype=torch.float16)
    v = torch.randn(b, hv, skv, dv, device="cuda", dtype=torch.float16)
    seed = torch.full((1, 1, 1, 1), 123456, dtype=torch.int64, device="cuda")
    offset = torch.full((1, 1, 1, 1), 1, dtype=torch.int64, device="cuda")
    mask = torch.full((b, hq, sq, skv), 7.0, dtype=torch.float32, device="cuda")
    band = dict(diagonal_alignment=cudnn.diagonal_alignment.BOTTOM_RIGHT, diagonal_band_left_bound=left, diagonal_band_right_bound=right)

    graph = new_graph(handle)
    Q, K, V = graph.tensor_like(q), graph.tensor_like(k), graph.tensor_like(v)
    SEED, OFFSET, DUMP = graph.tensor_like(seed), graph.tensor_like(offset), graph.tensor_like(mask)
    O, STATS = graph.sdpa(q=Q, k=K, v=V, generate_stats=True, attn_scale=scale, dropout=(p, SEED, OFFSET), rng_dump=DUMP, **band)
    o = torch.empty(b, hq, sq, dv, device="cuda", dtype=torch.float16)
    stats = torch.empty(b, hq, sq, 1, device="cuda", dtype=torch.float32)
    O.set_output(True).set_dim(list(o.shape)).set_stride(list(o.stride()))
    STATS.set_output(True).set_data_type(FLOAT)
    workspace = build(graph)
    graph.execute({Q: q, K: k, V: v, SEED: seed, OFFSET: offset, DUMP: mask, O: o, STATS: stats}, workspace)
    torch.cuda.synchronize()
    assert set(mask.unique().tolist()) == {0.0, 1.0}
    assert 0.1 < 1 - mask.mean().item() < 0.3
    q_ref, k_ref, v_ref = (x.detach().float().requires_grad_() for x in (q, k, v))
    o_ref = reference(q_ref, k_ref, v_ref, scale, left, right, True, mask, p)
    torch.testing.assert_close(o.float(), o_ref, atol=5e-3, rtol=3e-3)

    dO = torch.randn_like(o)
    bg = new_graph(handle)
    tq, tk, tv, to, tdo, tst = (bg.tensor_like(x) for x in (q, k, v, o, dO, stats))
    tseed, toff = bg.tensor_like(seed), bg.tensor_like(offset)
    dQ, dK, dV = bg.sdpa_backward(q=tq, k=tk, v=tv, o=to, dO=tdo, stats=tst, attn_scale=scale, dropout=(p, tseed, toff), **band)
    dq, dk, dv_ = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    for t, x in ((dQ, dq), (dK, dk), (dV, dv_)):
        t.set_output(True).set_dim(list(x.shape)).set_stride(list(x.stride()))
    workspace = build(bg)
    bg.execute({tq: q, tk: k, tv: v, to: o, tdo: dO, tst: stats, tseed: seed, toff: offset, dQ: dq, dK: dk, dV: dv_}, workspace)
    torch.cuda.synchronize()
    gq, gk, gv = torch.autograd.grad(o_ref, (q_ref, k_ref, v_ref), dO.float())
    for got, want in ((dq, gq), (dk, gk), (dv_, gv)):
        torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=1e-2)


def test_matmul_shape_overrides_on_the_gpu(handle):
    """The frontend's dynamic shapes on the CUDA engine: one graph built at 1 x 64 x 64 x 64
    (is_override_shape_enabled), executed at larger and smaller shapes through override_uids /
    override_shapes / override_strides, each against torch.matmul."""
    torch.manual_seed(2)
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    g = cudnn.pygraph(io_data_type=HALF, intermediate_data_type=FLOAT, compute_data_type=FLOAT, handle=handle, is_override_shape_enabled=True)
    A = g.tensor(name="A", dim=[1, 64, 64], stride=[64 * 64, 64, 1], data_type=HALF)
    B = g.tensor(name="B", dim=[1, 64, 64], stride=[64 * 64, 64, 1], data_type=HALF)
    C = g.matmul(A=A, B=B)
    C.set_output(True).set_data_type(HALF)
    build(g)
    for b, m, n, k in [(2, 256, 192, 320), (3, 33, 40, 24), (1, 64, 64, 64)]:
        a = torch.randn(b, m, k, device="cuda", dtype=torch.float16)
        bb = torch.randn(b, k, n, device="cuda", dtype=torch.float16)
        c = torch.full((b, m, n), float("nan"), device="cuda", dtype=torch.float16)
        ws = torch.empty(64 << 20, device="cuda", dtype=torch.uint8)
        uids = [A.get_uid(), B.get_uid(), C.get_uid()]
        g.execute({A: a, B: bb, C: c}, ws, override_uids=uids, override_shapes=[list(t.shape) for t in (a, bb, c)],
                  override_strides=[list(t.stride()) for t in (a, bb, c)])
        torch.cuda.synchronize()
        torch.testing.assert_close(c.float(), torch.matmul(a.float(), bb.float()), atol=0.05, rtol=0.01)
