"""sdpa's sink token and score statistics (score_max, score_sum_exp) and sdpa_backward's sink
gradient (dSink_token), with the frontend's keywords, on the CPU engine against numpy: the sink a
logit per query head appended to each row's softmax with no value; dsink against central finite
differences of the numpy forward pass."""

import math

import numpy as np
import pytest

import ferrodnn as cudnn

F32 = cudnn.data_type.FLOAT
D = cudnn.data_type.DOUBLE


def run(g, pack):
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    g.execute(pack, np.empty(g.get_workspace_size(), dtype=np.uint8))


def reference(q, k, v, sink, scale, lens=None, bottom_right=False):
    """o, stats, score_max, score_sum_exp in f64 (padded rows: 0, -inf, -inf, 0)."""
    b, hq, sq, _ = q.shape
    hk, skv = k.shape[1], k.shape[2]
    k = np.repeat(k, hq // hk, 1)
    v = np.repeat(v, hq // hk, 1)
    o = np.zeros((b, hq, sq, v.shape[3]))
    stats = np.full((b, hq, sq, 1), -np.inf)
    mx = np.full((b, hq, sq, 1), -np.inf)
    sm = np.zeros((b, hq, sq, 1))
    for bi in range(b):
        lq, lkv = lens[bi] if lens else (sq, skv)
        for h in range(hq):
            for i in range(lq):
                keys = [j for j in range(lkv) if not bottom_right or j <= i + lkv - lq]
                logits = [scale * q[bi, h, i] @ k[bi, h, j] for j in keys]
                if sink is not None:
                    logits.append(float(sink[0, h, 0, 0]))
                if not logits:
                    continue
                m = max(logits)
                e = np.exp(np.array(logits) - m)
                mx[bi, h, i, 0], sm[bi, h, i, 0] = m, e.sum()
                stats[bi, h, i, 0] = m + math.log(e.sum())
                for n, j in enumerate(keys):
                    o[bi, h, i] += e[n] / e.sum() * v[bi, h, j]
    return o, stats, mx, sm


def forward_graph(b, hq, hk, sq, skv, d, io, sink=True, lens=False, bottom_right=False, stats=True):
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=F32, compute_data_type=F32, handle=cudnn.create_cpu_handle())
    bhsd = lambda h, s: g.tensor(dim=[b, h, s, d], stride=[h * s * d, s * d, d, 1], data_type=io)
    Q, K, V = bhsd(hq, sq), bhsd(hk, skv), bhsd(hk, skv)
    row = lambda: g.tensor(dim=[b, hq, sq, 1], stride=[hq * sq, sq, 1, 1], data_type=F32).set_output(True)
    SMAX, SSUM = row(), row()
    SINK = g.tensor(dim=[1, hq, 1, 1], stride=[hq, 1, 1, 1], data_type=F32) if sink else None
    extra = {}
    if lens:
        LQ = g.tensor(dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT32)
        LKV = g.tensor(dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT32)
        extra = dict(use_padding_mask=True, seq_len_q=LQ, seq_len_kv=LKV)
    O, STATS = g.sdpa(q=Q, k=K, v=V, generate_stats=stats, attn_scale=0.4, use_causal_mask_bottom_right=bottom_right,
                      score_max=SMAX, score_sum_exp=SSUM, sink_token=SINK, **extra)
    O.set_output(True)
    if stats:
        STATS.set_output(True).set_data_type(F32)
    return g, Q, K, V, SINK, O, STATS, SMAX, SSUM, extra


@pytest.mark.parametrize("io", [F32, D])
def test_forward_with_the_sink_and_the_score_statistics(io):
    r = np.random.default_rng(5)
    b, hq, hk, sq, skv, d = 2, 4, 2, 5, 7, 8
    dt = np.float32 if io == F32 else np.float64
    q, k, v = (r.standard_normal(s).astype(dt) for s in ((b, hq, sq, d), (b, hk, skv, d), (b, hk, skv, d)))
    sink = r.standard_normal((1, hq, 1, 1)).astype(np.float32)
    g, Q, K, V, SINK, O, STATS, SMAX, SSUM, _ = forward_graph(b, hq, hk, sq, skv, d, io)
    o = np.full((b, hq, sq, d), np.nan, dt)
    st, mx, sm = (np.full((b, hq, sq, 1), np.nan, np.float32) for _ in range(3))
    run(g, {Q: q, K: k, V: v, SINK: sink, O: o, STATS: st, SMAX: mx, SSUM: sm})
    ro, rst, rmx, rsm = reference(q.astype(np.float64), k, v, sink, 0.4)
    tol = 1e-5
    np.testing.assert_allclose(o, ro, rtol=tol, atol=tol)
    np.testing.assert_allclose(st, rst, rtol=tol, atol=tol)
    np.testing.assert_allclose(mx, rmx, rtol=tol, atol=tol)
    np.testing.assert_allclose(sm, rsm, rtol=tol, atol=tol)
    # The sink took part of the mass: the same attention without it differs.
    assert not np.allclose(ro, reference(q.astype(np.float64), k, v, None, 0.4)[0], atol=1e-3)


def test_score_statistics_without_stats_or_sink_and_empty_rows():
    """score_max / score_sum_exp alone (inference), a bottom-right causal mask with rows that
    see no key, padding: rows with the sink hold it, padded rows -inf and 0."""
    r = np.random.default_rng(6)
    b, hq, hk, sq, skv, d = 2, 2, 1, 6, 3, 8
    q, k, v = (r.standard_normal(s) for s in ((b, hq, sq, d), (b, hk, skv, d), (b, hk, skv, d)))
    lens = [(6, 3), (4, 3)]
    for with_sink in (False, True):
        sink = r.standard_normal((1, hq, 1, 1)).astype(np.float32) if with_sink else None
        g, Q, K, V, SINK, O, STATS, SMAX, SSUM, extra = forward_graph(b, hq, hk, sq, skv, d, D, sink=with_sink, lens=True, bottom_right=True, stats=False)
        assert STATS is None
        o = np.full((b, hq, sq, d), np.nan)
        mx, sm = (np.full((b, hq, sq, 1), np.nan, np.float32) for _ in range(2))
        pack = {Q: q, K: k, V: v, O: o, SMAX: mx, SSUM: sm, extra["seq_len_q"]: np.array([6, 4], np.int32).reshape(2, 1, 1, 1),
                extra["seq_len_kv"]: np.array([3, 3], np.int32).reshape(2, 1, 1, 1)}
        if with_sink:
            pack[SINK] = sink
        run(g, pack)
        ro, _, rmx, rsm = reference(q, k, v, sink, 0.4, lens=lens, bottom_right=True)
        np.testing.assert_allclose(o, ro, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(mx, rmx, rtol=1e-6)
        np.testing.assert_allclose(sm, rsm, rtol=1e-6)
        # Batch 0, rows 0..2 see no key; batch 1, rows 4 and 5 are padding.
        want = (sink[0, :, 0, 0], 1.0) if with_sink else (-np.inf, 0.0)
        np.testing.assert_array_equal(mx[0, :, 0, 0], want[0])
        np.testing.assert_array_equal(sm[0, :, 0, 0], want[1])
        assert (mx[1, :, 4:] == -np.inf).all() and (sm[1, :, 4:] == 0).all()


def test_backward_sink_gradient_against_finite_differences():
    r = np.random.default_rng(7)
    b, hq, hk, sq, skv, d = 2, 4, 2, 5, 6, 8
    q, k, v, do = (r.standard_normal(s) for s in ((b, hq, sq, d), (b, hk, skv, d), (b, hk, skv, d), (b, hq, sq, d)))
    # Sink logits f32 holds exactly, stepped by 2^-10 (also exact).
    sink = (r.integers(-512, 512, (1, hq, 1, 1)) / 256).astype(np.float32)
    o, st, _, _ = reference(q, k, v, sink, 0.4, bottom_right=True)

    g = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D, handle=cudnn.create_cpu_handle())
    Q, K, V, O, DO = (g.tensor_like(a) for a in (q, k, v, o, do))
    STATS = g.tensor(dim=[b, hq, sq, 1], stride=[hq * sq, sq, 1, 1], data_type=F32)
    SINK = g.tensor(dim=[1, hq, 1, 1], stride=[hq, 1, 1, 1], data_type=F32)
    DSINK = g.tensor(dim=[1, hq, 1, 1], stride=[hq, 1, 1, 1], data_type=F32).set_output(True)
    DQ, DK, DV = g.sdpa_backward(q=Q, k=K, v=V, o=O, dO=DO, stats=STATS, attn_scale=0.4, use_causal_mask_bottom_right=True,
                                 sink_token=SINK, dSink_token=DSINK)
    for t in (DQ, DK, DV):
        t.set_output(True)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    dsink = np.full((1, hq, 1, 1), np.nan, np.float32)
    st32 = st.astype(np.float32)
    run(g, {Q: q, K: k, V: v, O: o, DO: do, STATS: st32, SINK: sink, DSINK: dsink, DQ: dq, DK: dk, DV: dv})

    # The formula, from the f32 stats the graph read...
    want = -(np.exp(sink.astype(np.float64) - st32) * (do * o).sum(-1, keepdims=True)).sum((0, 2), keepdims=True)
    np.testing.assert_allclose(dsink, want, rtol=1e-6)
    # ... and the derivative of sum(o * do) in each sink logit.
    h = 2.0**-10
    for head in range(hq):
        up, down = sink.copy(), sink.copy()
        up[0, head] += h
        down[0, head] -= h
        num = ((reference(q, k, v, up, 0.4, bottom_right=True)[0] - reference(q, k, v, down, 0.4, bottom_right=True)[0]) * do).sum() / (2 * h)
        assert abs(dsink[0, head, 0, 0] - num) < 1e-4 * max(1.0, abs(num)), (head, dsink[0, head, 0, 0], num)

    # The sink changes dQ, dK, dV only through the stats: the same graph without dSink_token
    # (the sink then not read) gives the same gradients.
    g2 = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D, handle=cudnn.create_cpu_handle())
    Q2, K2, V2, O2, DO2 = (g2.tensor_like(a) for a in (q, k, v, o, do))
    STATS2 = g2.tensor(dim=[b, hq, sq, 1], stride=[hq * sq, sq, 1, 1], data_type=F32)
    SINK2 = g2.tensor(dim=[1, hq, 1, 1], stride=[hq, 1, 1, 1], data_type=F32)
    grads = g2.sdpa_backward(q=Q2, k=K2, v=V2, o=O2, dO=DO2, stats=STATS2, attn_scale=0.4, use_causal_mask_bottom_right=True, sink_token=SINK2)
    outs = [np.zeros_like(a) for a in (q, k, v)]
    for t in grads:
        t.set_output(True)
    run(g2, {Q2: q, K2: k, V2: v, O2: o, DO2: do, STATS2: st32, **dict(zip(grads, outs))})
    for a, e in zip(outs, (dq, dk, dv)):
        np.testing.assert_array_equal(a, e)


def test_ragged_score_statistics_take_the_stats_offsets():
    """THD q, k, v, o with score_max and score_sum_exp ragged on the stats' offsets, as
    test_mhas_v2 builds them: only each sequence's rows are written."""
    r = np.random.default_rng(8)
    hq, d = 2, 8
    lq, lkv = [3, 5], [4, 2]
    b, sq, skv = 2, 5, 4
    tq, tkv = sum(lq), sum(lkv)
    q, k, v = r.standard_normal((tq + 1, hq, d)), r.standard_normal((tkv + 1, hq, d)), r.standard_normal((tkv + 1, hq, d))
    sink = r.standard_normal((1, hq, 1, 1)).astype(np.float32)
    pre = lambda lens, row: (np.concatenate([[0], np.cumsum(lens)]) * row).astype(np.int64).reshape(-1, 1, 1, 1)
    g = cudnn.pygraph(io_data_type=D, intermediate_data_type=F32, compute_data_type=F32, handle=cudnn.create_cpu_handle())
    I64 = cudnn.data_type.INT64
    thd = lambda s: g.tensor(dim=[b, hq, s, d], stride=[s * hq * d, d, hq * d, 1], data_type=D)
    Q, K, V = thd(sq), thd(skv), thd(skv)
    OQ, OKV, OST = (g.tensor(dim=[b + 1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=I64) for _ in range(3))
    for t, off in ((Q, OQ), (K, OKV), (V, OKV)):
        t.set_ragged_offset(off)
    LQ, LKV = (g.tensor(dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT32) for _ in range(2))
    row = lambda: g.tensor(dim=[b, hq, sq, 1], stride=[sq * hq, 1, hq, 1], data_type=F32).set_output(True)
    SMAX, SSUM = row(), row()
    SINK = g.tensor(dim=[1, hq, 1, 1], stride=[hq, 1, 1, 1], data_type=F32)
    O, _ = g.sdpa(q=Q, k=K, v=V, generate_stats=False, attn_scale=0.5, use_padding_mask=True, seq_len_q=LQ, seq_len_kv=LKV,
                  score_max=SMAX, score_sum_exp=SSUM, sink_token=SINK)
    O.set_output(True).set_stride([sq * hq * d, d, hq * d, 1]).set_ragged_offset(OQ)
    SMAX.set_ragged_offset(OST)
    SSUM.set_ragged_offset(OST)
    o = np.full((tq + 1, hq, d), np.nan)
    mx, sm = np.full((tq + 1, hq, 1), np.nan, np.float32), np.full((tq + 1, hq, 1), np.nan, np.float32)
    lens = lambda l: np.array(l, np.int32).reshape(-1, 1, 1, 1)
    run(g, {Q: q, K: k, V: v, SINK: sink, LQ: lens(lq), LKV: lens(lkv), OQ: pre(lq, hq * d), OKV: pre(lkv, hq * d), OST: pre(lq, hq),
            O: o, SMAX: mx, SSUM: sm})
    assert np.isnan(mx[tq:]).all() and np.isnan(sm[tq:]).all() and np.isnan(o[tq:]).all()
    aq, akv = np.concatenate([[0], np.cumsum(lq)]), np.concatenate([[0], np.cumsum(lkv)])
    for i in range(b):
        per = lambda a, s, e: a[s:e].transpose(1, 0, 2)[None]
        ro, _, rmx, rsm = reference(per(q, aq[i], aq[i + 1]), per(k, akv[i], akv[i + 1]), per(v, akv[i], akv[i + 1]), sink, 0.5)
        np.testing.assert_allclose(per(o, aq[i], aq[i + 1]), ro, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(per(mx, aq[i], aq[i + 1]), rmx, rtol=1e-5)
        np.testing.assert_allclose(per(sm, aq[i], aq[i + 1]), rsm, rtol=1e-5)


def test_bad_sinks_and_a_dsink_without_a_sink():
    g = cudnn.pygraph(io_data_type=F32, handle=cudnn.create_cpu_handle())
    X = g.tensor(dim=[1, 2, 3, 8], stride=[48, 24, 8, 1], data_type=F32)
    bad = g.tensor(name="bad_sink", dim=[1, 3, 1, 1], stride=[3, 1, 1, 1], data_type=F32)
    O, _ = g.sdpa(q=X, k=X, v=X, generate_stats=False, sink_token=bad)
    O.set_output(True)
    with pytest.raises(cudnn.InvalidGraphError, match=r"sdpa.*sink_token.*bad_sink.*\[1, 2, 1, 1\].*\[1, 3, 1, 1\]"):
        g.validate()

    g = cudnn.pygraph(io_data_type=F32, handle=cudnn.create_cpu_handle())
    X = g.tensor(dim=[1, 2, 3, 8], stride=[48, 24, 8, 1], data_type=F32)
    half = g.tensor(name="half_sink", dim=[1, 2, 1, 1], stride=[2, 1, 1, 1], data_type=cudnn.data_type.HALF)
    O, _ = g.sdpa(q=X, k=X, v=X, generate_stats=False, sink_token=half)
    O.set_output(True)
    with pytest.raises(cudnn.InvalidGraphError, match=r"sdpa.*half_sink.*f32.*f16"):
        g.validate()

    g = cudnn.pygraph(io_data_type=F32, handle=cudnn.create_cpu_handle())
    X = g.tensor(dim=[1, 2, 3, 8], stride=[48, 24, 8, 1], data_type=F32)
    DS = g.tensor(dim=[1, 2, 1, 1], stride=[2, 1, 1, 1], data_type=F32)
    with pytest.raises(ValueError, match="dSink_token.*needs sink_token"):
        g.sdpa_backward(q=X, k=X, v=X, o=X, dO=X, stats=X, dSink_token=DS)
