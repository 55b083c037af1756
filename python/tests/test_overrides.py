"""Shape overrides at execution, as the frontend's dynamic-shape tests use them
(test_sdpa_thd.py): a graph made with is_override_shape_enabled=True is built once at a cache
shape, then executed with override_uids / override_shapes / override_strides at other shapes.
Each result is checked against the same graph built directly at that shape (and numpy); bad
overrides raise errors that name the tensor or the argument."""

import math

import numpy as np
import pytest

import ferrodnn as cudnn

F32 = cudnn.data_type.FLOAT


def rng(seed):
    return np.random.default_rng(seed)


def graph(overridable=True):
    return cudnn.pygraph(io_data_type=F32, intermediate_data_type=F32, compute_data_type=F32, handle=cudnn.create_cpu_handle(),
                         is_override_shape_enabled=overridable)


def strides(a):
    return [s // a.itemsize for s in a.strides]


def overrides(arrays):
    """The frontend's three lists for {uid: array}."""
    uids = list(arrays)
    return dict(override_uids=uids, override_shapes=[list(arrays[u].shape) for u in uids], override_strides=[strides(arrays[u]) for u in uids])


def matmul_graph(b, m, n, k, overridable=True):
    g = graph(overridable)
    A = g.tensor(name="A", dim=[b, m, k], stride=[m * k, k, 1], uid=1)
    B = g.tensor(name="B", dim=[b, k, n], stride=[n * k, 1, k], uid=2)  # column-major, as the frontend's sample
    C = g.matmul(A=A, B=B)
    C.set_output(True).set_uid(3)
    g.build([cudnn.heur_mode.FALLBACK])
    return g


def col_major(r, b, k, n):
    return np.ascontiguousarray(r.standard_normal((b, n, k)).astype(np.float32)).transpose(0, 2, 1)


@pytest.mark.parametrize("shape", [(2, 16, 16, 16), (2, 32, 24, 40), (1, 5, 7, 3)])
def test_matmul_built_once_runs_at_other_shapes(shape):
    g = matmul_graph(1, 16, 16, 16)
    b, m, n, k = shape
    r = rng(sum(shape))
    a, bb = r.standard_normal((b, m, k)).astype(np.float32), col_major(r, b, k, n)
    c = np.full((b, m, n), np.nan, np.float32)
    pack = {1: a, 2: bb, 3: c}
    g.execute(pack, np.empty(g.get_workspace_size(), np.uint8), **overrides(pack))
    direct = matmul_graph(*shape, overridable=False)
    want = np.full((b, m, n), np.nan, np.float32)
    direct.execute({1: a, 2: bb, 3: want}, None)
    np.testing.assert_array_equal(c, want)
    np.testing.assert_allclose(c, a @ bb, rtol=1e-4, atol=1e-4)
    # The graph's own shape still runs without overrides.
    a0, b0 = r.standard_normal((1, 16, 16)).astype(np.float32), col_major(r, 1, 16, 16)
    c0 = np.empty((1, 16, 16), np.float32)
    g.execute({1: a0, 2: b0, 3: c0}, None)
    np.testing.assert_allclose(c0, a0 @ b0, rtol=1e-4, atol=1e-4)


def test_overriding_only_the_inputs_infers_the_output():
    g = matmul_graph(1, 16, 16, 16)
    r = rng(1)
    a, bb = r.standard_normal((3, 9, 5)).astype(np.float32), col_major(r, 3, 5, 11)
    c = np.full((3, 9, 11), np.nan, np.float32)
    g.execute({1: a, 2: bb, 3: c}, None, **overrides({1: a, 2: bb}))
    np.testing.assert_allclose(c, a @ bb, rtol=1e-4, atol=1e-4)


def test_execute_plan_at_index_takes_overrides():
    g = matmul_graph(1, 16, 16, 16)
    r = rng(2)
    a, bb = r.standard_normal((2, 4, 8)).astype(np.float32), col_major(r, 2, 8, 6)
    c = np.full((2, 4, 6), np.nan, np.float32)
    pack = {1: a, 2: bb, 3: c}
    g.execute_plan_at_index(pack, None, 0, **overrides(pack))
    np.testing.assert_allclose(c, a @ bb, rtol=1e-4, atol=1e-4)


def pointwise_graph(n, c, overridable=True):
    g = graph(overridable)
    X = g.tensor(name="X", dim=[n, c], stride=[c, 1], uid=1)
    S = g.tensor(name="S", dim=[1, c], stride=[c, 1], uid=2)
    Y = g.tensor(name="Y", dim=[n, c], stride=[1, n], uid=3)
    Z = g.relu(input=g.add(a=g.mul(a=X, b=S), b=Y))
    Z.set_output(True).set_uid(4)
    g.build([cudnn.heur_mode.A])
    return g


@pytest.mark.parametrize("shape", [(3, 32), (64, 48), (1, 1)])
def test_pointwise_chain_runs_at_other_shapes(shape):
    g = pointwise_graph(8, 32)
    n, c = shape
    r = rng(n * c)
    x, s = r.standard_normal((n, c)).astype(np.float32), r.standard_normal((1, c)).astype(np.float32)
    y = np.asfortranarray(r.standard_normal((n, c)).astype(np.float32))
    z = np.full((n, c), np.nan, np.float32)
    pack = {1: x, 2: s, 3: y, 4: z}
    g.execute(pack, None, **overrides(pack))
    want = np.full((n, c), np.nan, np.float32)
    pointwise_graph(n, c, overridable=False).execute({1: x, 2: s, 3: y, 4: want}, None)
    np.testing.assert_array_equal(z, want)
    np.testing.assert_allclose(z, np.maximum(x * s + y, 0), rtol=1e-6, atol=1e-6)


def layernorm_graph(n, h, overridable=True):
    g = graph(overridable)
    X = g.tensor(name="X", dim=[n, h], stride=[h, 1], uid=1)
    S = g.tensor(name="S", dim=[1, h], stride=[h, 1], uid=2)
    B = g.tensor(name="B", dim=[1, h], stride=[h, 1], uid=3)
    Y, M, V = g.layernorm(norm_forward_phase=cudnn.norm_forward_phase.TRAINING, input=X, scale=S, bias=B, epsilon=1e-5)
    Y.set_output(True).set_uid(4)
    M.set_output(True).set_uid(5)
    V.set_output(True).set_uid(6)
    g.build([cudnn.heur_mode.A])
    return g


@pytest.mark.parametrize("shape", [(7, 64), (2, 40), (33, 8)])
def test_layernorm_runs_at_other_shapes(shape):
    g = layernorm_graph(4, 64)
    n, h = shape
    r = rng(n + h)
    x, s, b = (r.standard_normal(d).astype(np.float32) for d in ((n, h), (1, h), (1, h)))
    outs = [np.full(d, np.nan, np.float32) for d in ((n, h), (n, 1), (n, 1))]
    pack = {1: x, 2: s, 3: b, 4: outs[0], 5: outs[1], 6: outs[2]}
    g.execute(pack, None, **overrides(pack))
    want = [np.full_like(o, np.nan) for o in outs]
    layernorm_graph(n, h, overridable=False).execute({1: x, 2: s, 3: b, 4: want[0], 5: want[1], 6: want[2]}, None)
    for o, w in zip(outs, want):
        np.testing.assert_array_equal(o, w)
    mean, var = x.mean(1, keepdims=True), x.var(1, keepdims=True)
    np.testing.assert_allclose(outs[0], (x - mean) / np.sqrt(var + 1e-5) * s + b, rtol=1e-4, atol=1e-4)


# -- attention in the THD layout, as the frontend's test_sdpa_thd.py -----------------------------

Q_UID, K_UID, V_UID, O_UID, RAGGED_Q_UID, RAGGED_O_UID, LEN_Q_UID, LEN_KV_UID = range(1, 9)
H, D = 2, 8


def thd_graph(b, s_q, s_kv, overridable=True):
    """Q and O packed ([tokens, h, d], ragged), K and V [b, h, s_kv, d] with BSHD strides."""
    g = graph(overridable)
    Q = g.tensor(name="Q", dim=[b, H, s_q, D], stride=[H * D, D, H * D, 1], uid=Q_UID)
    Q.set_ragged_offset(g.tensor(name="Q_ragged", dim=[b + 1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT64, uid=RAGGED_Q_UID))
    kv = lambda name, uid: g.tensor(name=name, dim=[b, H, s_kv, D], stride=[s_kv * H * D, D, H * D, 1], uid=uid)
    K, V = kv("K", K_UID), kv("V", V_UID)
    LQ = g.tensor(name="seq_len_q", dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT32, uid=LEN_Q_UID)
    LKV = g.tensor(name="seq_len_kv", dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT32, uid=LEN_KV_UID)
    O, _ = g.sdpa(name="sdpa_thd", q=Q, k=K, v=V, attn_scale=1 / math.sqrt(D), use_padding_mask=True, seq_len_q=LQ, seq_len_kv=LKV,
                  generate_stats=False)
    O.set_output(True).set_dim([b, H, s_q, D]).set_stride([H * D, D, H * D, 1]).set_uid(O_UID)
    O.set_ragged_offset(g.tensor(name="O_ragged", dim=[b + 1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT64, uid=RAGGED_O_UID))
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return g


def thd_inputs(b, s_q, s_kv, seed):
    r = rng(seed)
    lq = r.integers(1, s_q + 1, b).astype(np.int32)
    lkv = np.minimum(np.maximum(r.integers(1, s_kv + 1, b), lq), s_kv).astype(np.int32)
    offs = (np.concatenate([[0], np.cumsum(lq)]) * H * D).astype(np.int64).reshape(-1, 1, 1, 1)
    q = r.standard_normal((int(lq.sum()), H, D)).astype(np.float32)
    kv = [np.ascontiguousarray(r.standard_normal((b, s_kv, H, D)).astype(np.float32)).transpose(0, 2, 1, 3) for _ in range(2)]
    return lq, lkv, offs, q, kv[0], kv[1]


def thd_reference(lq, lkv, q, k, v):
    out, at = np.zeros_like(q), 0
    for i, (n, m) in enumerate(zip(lq, lkv)):
        qi = q[at:at + n].transpose(1, 0, 2)  # [h, n, d]
        s = np.einsum("hid,hjd->hij", qi, k[i, :, :m]) / math.sqrt(D)
        p = np.exp(s - s.max(-1, keepdims=True))
        out[at:at + n] = np.einsum("hij,hjd->hid", p / p.sum(-1, keepdims=True), v[i, :, :m]).transpose(1, 0, 2)
        at += n
    return out


def run_thd(g, b, s_q, s_kv, seed, with_overrides=True):
    lq, lkv, offs, q, k, v = thd_inputs(b, s_q, s_kv, seed)
    o = np.full_like(q, np.nan)
    lq4, lkv4 = lq.reshape(-1, 1, 1, 1), lkv.reshape(-1, 1, 1, 1)
    pack = {Q_UID: q, RAGGED_Q_UID: offs, K_UID: k, V_UID: v, LEN_Q_UID: lq4, LEN_KV_UID: lkv4, O_UID: o, RAGGED_O_UID: offs}
    kw = {}
    if with_overrides:
        # As the frontend's test: the logical [b, h, s_q, d] shape of Q and O with the packed
        # array's strides; every other tensor as its array.
        shapes = {Q_UID: [b, H, s_q, D], O_UID: [b, H, s_q, D]}
        uids = list(pack)
        kw = dict(override_uids=uids, override_shapes=[shapes.get(u, list(pack[u].shape)) for u in uids],
                  override_strides=[[H * D, D, H * D, 1] if u in shapes else strides(pack[u]) for u in uids])
    g.execute(pack, np.empty(g.get_workspace_size(), np.uint8), **kw)
    return o, (lq, lkv, q, k, v)


@pytest.mark.parametrize("shape", [(4, 12, 16), (4, 16, 16), (3, 5, 20), (1, 1, 9)])
def test_sdpa_thd_built_once_runs_at_other_batch_and_sequence_lengths(shape):
    g = thd_graph(4, 8, 16)
    o, args = run_thd(g, *shape, seed=sum(shape))
    want, _ = run_thd(thd_graph(*shape, overridable=False), *shape, seed=sum(shape), with_overrides=False)
    np.testing.assert_array_equal(o, want)
    np.testing.assert_allclose(o, thd_reference(*args), rtol=1e-4, atol=1e-4)


def test_one_graph_serves_several_shapes_in_turn():
    g = thd_graph(2, 4, 8)
    for i, shape in enumerate([(2, 6, 8), (3, 4, 8), (2, 4, 8), (2, 6, 8)]):
        o, args = run_thd(g, *shape, seed=i)
        np.testing.assert_allclose(o, thd_reference(*args), rtol=1e-4, atol=1e-4)


# -- errors -----------------------------------------------------------------------------------------

def mm_pack(b=2, m=16, n=16, k=16):
    r = rng(5)
    return {1: r.standard_normal((b, m, k)).astype(np.float32), 2: col_major(r, b, k, n), 3: np.empty((b, m, n), np.float32)}


def test_a_graph_not_made_for_overrides_says_how_to_enable_them():
    g = matmul_graph(1, 16, 16, 16, overridable=False)
    pack = mm_pack()
    with pytest.raises(cudnn.InvalidArgumentError, match=r"is_override_shape_enabled=True"):
        g.execute(pack, None, **overrides(pack))
    # Empty lists are no overrides.
    g.execute(mm_pack(1), None, override_uids=[], override_shapes=[], override_strides=[])


def test_unknown_uid():
    g = matmul_graph(1, 16, 16, 16)
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute(mm_pack(1), None, override_uids=[9], override_shapes=[[1, 16, 16]], override_strides=[[256, 16, 1]])
    assert "uid 9" in str(e.value) and '1 "A"' in str(e.value)


def test_wrong_rank():
    g = matmul_graph(1, 16, 16, 16)
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute(mm_pack(1), None, override_uids=[1], override_shapes=[[16, 16]], override_strides=[[16, 1]])
    assert 'tensor "A" (uid 1) has rank 3' in str(e.value)
    with pytest.raises(cudnn.InvalidArgumentError, match="2 strides"):
        g.execute(mm_pack(1), None, override_uids=[1], override_shapes=[[1, 16, 16]], override_strides=[[16, 1]])


@pytest.mark.parametrize("lists", [([1, 2], [[2, 16, 16]], [[256, 16, 1], [256, 1, 16]]), ([1], [[2, 16, 16]], None), ([1, 1], [[2, 16, 16]] * 2, [[256, 16, 1]] * 2)])
def test_lists_that_do_not_pair_up(lists):
    g = matmul_graph(1, 16, 16, 16)
    uids, shapes, st = lists
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute(mm_pack(), None, override_uids=uids, override_shapes=shapes, override_strides=st)
    assert "override_uids" in str(e.value) or "twice" in str(e.value)


def test_lists_of_the_wrong_type():
    g = matmul_graph(1, 16, 16, 16)
    with pytest.raises(TypeError, match="override_shapes"):
        g.execute(mm_pack(), None, override_uids=[1], override_shapes=[16, 16], override_strides=[[16, 1]])


def test_bigger_than_the_buffers():
    g = matmul_graph(1, 16, 16, 16)
    pack = mm_pack(1)
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute(pack, None, override_uids=[1, 2], override_shapes=[[4, 16, 16], [4, 16, 16]], override_strides=[[256, 16, 1], [256, 1, 16]])
    assert 'tensor "A"' in str(e.value) and "bytes" in str(e.value)


def test_bigger_than_a_tensor_may_be():
    g = matmul_graph(1, 16, 16, 16)
    big = 2**46
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute(mm_pack(1), None, override_uids=[1, 2], override_shapes=[[8, 1, big], [8, big, 1]], override_strides=[[big, big, 1], [big, 1, big]])
    assert 'tensor "A"' in str(e.value) and "elements is more than" in str(e.value)


def test_shapes_the_op_cannot_take():
    g = matmul_graph(1, 16, 16, 16)
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute(mm_pack(1), None, override_uids=[1], override_shapes=[[1, 16, 8]], override_strides=[[128, 8, 1]])
    assert "matmul" in str(e.value) and "shape overrides" in str(e.value)
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute(mm_pack(1), None, override_uids=[3], override_shapes=[[1, 16, 8]], override_strides=[[128, 8, 1]])
    assert "[1, 16, 8]" in str(e.value) and "[1, 16, 16]" in str(e.value)


def test_the_flag_survives_serialization():
    g = matmul_graph(1, 16, 16, 16)
    g2 = cudnn.pygraph(handle=cudnn.create_cpu_handle())
    g2.deserialize(g.serialize())
    pack = mm_pack(3, 5, 7, 9)
    g2.execute(pack, None, **overrides(pack))
    np.testing.assert_allclose(pack[3], pack[1] @ pack[2], rtol=1e-4, atol=1e-4)
