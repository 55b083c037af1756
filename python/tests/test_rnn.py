"""Recurrent networks through the Python API on the CPU engine: the graph ops against a numpy
recurrence written here, the PyTorch-semantics functions and the parameter converter against
PyTorch's nn.LSTM / nn.GRU / nn.RNN (outputs, final states and every gradient) when PyTorch is
importable, and bad arguments."""

import numpy as np
import pytest

import ferrodnn as cudnn
from ferrodnn import rnn

try:
    import torch
except ImportError:  # CI has no PyTorch: those tests skip.
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")


def sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def numpy_forward(mode, x, h0, c0, params, lengths):
    """One layer, one direction, sequence-major, written from the equations (PyTorch's)."""
    t_len, b, _ = x.shape
    w_ih, w_hh = params["weight_ih_l0"].astype(np.float64), params["weight_hh_l0"].astype(np.float64)
    b_ih, b_hh = params["bias_ih_l0"].astype(np.float64), params["bias_hh_l0"].astype(np.float64)
    hsz = w_hh.shape[1]
    y = np.zeros((t_len, b, hsz))
    h_n, c_n = h0.astype(np.float64).copy(), (c0.astype(np.float64).copy() if c0 is not None else None)
    for s in range(b):
        h = h_n[0, s].copy()
        c = c_n[0, s].copy() if c_n is not None else None
        for t in range(lengths[s]):
            gi = w_ih @ x[t, s] + b_ih
            gh = w_hh @ h + b_hh
            if mode == "lstm":
                i, f, g, o = np.split(gi + gh, 4)
                c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
                h = sigmoid(o) * np.tanh(c)
            elif mode == "gru":
                r = sigmoid(gi[:hsz] + gh[:hsz])
                z = sigmoid(gi[hsz : 2 * hsz] + gh[hsz : 2 * hsz])
                n = np.tanh(gi[2 * hsz :] + r * gh[2 * hsz :])
                h = (1 - z) * n + z * h
            elif mode == "tanh":
                h = np.tanh(gi + gh)
            else:
                h = np.maximum(gi + gh, 0)
            y[t, s] = h
        h_n[0, s] = h
        if c_n is not None:
            c_n[0, s] = c
    return y, h_n, c_n


@pytest.mark.parametrize("mode", ["lstm", "gru", "tanh", "relu"])
def test_functions_match_a_numpy_recurrence(mode):
    g = np.random.default_rng(3)
    t_len, b, n_in, hsz = 9, 5, 7, 13
    params = rnn.init_params(mode, n_in, hsz, seed=2, dtype=np.float64)
    x = g.standard_normal((t_len, b, n_in))
    h0 = g.standard_normal((1, b, hsz))
    c0 = g.standard_normal((1, b, hsz)) if mode == "lstm" else None
    lengths = np.array([9, 4, 7, 1, 9])
    want_y, want_h, want_c = numpy_forward(mode, x, h0, c0, params, lengths)
    if mode == "lstm":
        y, (h, c) = rnn.lstm(x, (h0, c0), params, lengths=lengths)
        np.testing.assert_allclose(c, want_c, rtol=1e-12, atol=1e-12)
    elif mode == "gru":
        y, h = rnn.gru(x, h0, params, lengths=lengths)
    else:
        y, h = rnn.rnn(x, h0, params, nonlinearity=mode, lengths=lengths)
    np.testing.assert_allclose(y, want_y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(h, want_h, rtol=1e-12, atol=1e-12)


def test_pack_and_unpack_are_inverse_and_follow_weight_params():
    params = rnn.init_params("lstm", 7, 13, num_layers=2, bidirectional=True, proj_size=5, seed=4)
    desc = rnn.rnn_desc("lstm", 7, 13, 9, 5, num_layers=2, bidirectional=True, proj_size=5)
    flat = rnn.pack_torch_params(desc, params)
    assert flat.shape == (rnn.sizes(desc)["weight_space"],)
    back = rnn.unpack_torch_params(desc, flat)
    assert set(back) == set(params) == set(rnn.torch_param_names(desc))
    for k in params:
        np.testing.assert_array_equal(back[k], params[k])
    # Gate f of the reverse direction of layer 1: rows 13..26 of weight_hh_l1_reverse.
    moff, rows, cols, boff, blen = rnn.weight_params(desc, 3, 5)
    assert (rows, cols, blen) == (13, 5, 13)
    np.testing.assert_array_equal(flat[moff : moff + rows * cols].reshape(rows, cols), params["weight_hh_l1_reverse"][13:26])
    np.testing.assert_array_equal(flat[boff : boff + blen], params["bias_hh_l1_reverse"][13:26])


def test_bad_arguments_name_what_is_wrong():
    with pytest.raises(ValueError, match="cell_mode must be one of"):
        rnn.rnn_desc("lstmp", 7, 13, 9, 5)
    desc = rnn.rnn_desc("gru", 7, 13, 9, 5)
    with pytest.raises(cudnn.InvalidArgumentError, match=r"pseudo_layer must be in \[0, 1\) and lin_id in \[0, 6\)"):
        rnn.weight_params(desc, 0, 6)
    with pytest.raises(cudnn.InvalidArgumentError, match="proj_size 5 is for LSTM only"):
        rnn.sizes(dict(desc, proj_size=5))
    with pytest.raises(cudnn.InvalidArgumentError, match="unknown field"):
        rnn.sizes(dict(desc, hiden_size=5))
    with pytest.raises(TypeError, match="must be a dict"):
        rnn.sizes([1, 2])
    with pytest.raises(ValueError, match="x must be 3-D"):
        rnn.gru(np.zeros((9, 7), np.float32), None, rnn.init_params("gru", 7, 13))
    # A graph whose weights do not fit the descriptor.
    g = cudnn.pygraph(handle=cudnn.create_cpu_handle())
    x = g.tensor_like(np.zeros((9, 5, 7), np.float32))
    w = g.tensor_like(np.zeros(10, np.float32))
    y, hy, cy, reserve = g.rnn(x, w, desc)
    assert cy is None and reserve is None
    y.set_output(True)
    with pytest.raises(cudnn.InvalidGraphError, match=r"rnn .*`weights`.*\[10\]"):
        g.validate()


def test_graph_ops_train_on_numpy():
    """Forward, backward data and backward weights through pygraph: the gradients of a tiny GRU
    against central differences of the forward function."""
    g0 = np.random.default_rng(5)
    t_len, b, n_in, hsz = 4, 2, 3, 2
    desc = rnn.rnn_desc("gru", n_in, hsz, t_len, b, training=True)
    params = rnn.init_params("gru", n_in, hsz, seed=6, dtype=np.float64)
    w = rnn.pack_torch_params(desc, params)
    x = g0.standard_normal((t_len, b, n_in))
    dy = g0.standard_normal((t_len, b, hsz))
    graph = cudnn.pygraph(handle=cudnn.create_cpu_handle())
    X, W, DY = graph.tensor_like(x), graph.tensor_like(w), graph.tensor_like(dy)
    y, hy, _, reserve = graph.rnn(X, W, desc)
    dx, dhx, _, dgates = graph.rnn_backward_data(DY, W, reserve, desc)
    dw = graph.rnn_backward_weights(X, reserve, dgates, desc)
    for o in (y, dx, dw):
        o.set_output(True)
    graph.validate()
    out = {o: np.empty(o.get_dim(), np.float64) for o in (y, dx, dw)}
    graph.build([cudnn.heur_mode.A])
    graph.execute({X: x, W: w, DY: dy, **out}, np.empty(graph.get_workspace_size(), np.uint8))

    def loss(xv, pv):
        yv, _ = rnn.gru(xv, None, pv)
        return float((yv * dy).sum())

    eps = 1e-6
    num_dx = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        num_dx[i] = (loss(xp, params) - loss(xm, params)) / (2 * eps)
    np.testing.assert_allclose(out[dx], num_dx, rtol=1e-6, atol=1e-8)
    grads = rnn.unpack_torch_params(desc, out[dw])
    k = "weight_hh_l0"
    num = np.zeros_like(params[k])
    for i in np.ndindex(num.shape):
        pp = {**params, k: params[k].copy()}
        pm = {**params, k: params[k].copy()}
        pp[k][i] += eps
        pm[k][i] -= eps
        num[i] = (loss(x, pp) - loss(x, pm)) / (2 * eps)
    np.testing.assert_allclose(grads[k], num, rtol=1e-6, atol=1e-8)


def torch_module(mode, n_in, hsz, layers, bidirectional, proj, batch_first):
    kw = dict(num_layers=layers, bidirectional=bidirectional, batch_first=batch_first, dtype=torch.float64)
    if mode == "lstm":
        return torch.nn.LSTM(n_in, hsz, proj_size=proj, **kw)
    if mode == "gru":
        return torch.nn.GRU(n_in, hsz, **kw)
    return torch.nn.RNN(n_in, hsz, nonlinearity=mode, **kw)


@needs_torch
@pytest.mark.parametrize(
    "mode,layers,bidirectional,proj,batch_first,packed",
    [
        ("lstm", 2, True, 0, False, True),
        ("lstm", 1, False, 5, True, False),
        ("lstm", 2, True, 6, False, True),
        ("gru", 2, True, 0, True, True),
        ("gru", 1, False, 0, False, False),
        ("tanh", 2, False, 0, False, True),
        ("relu", 1, True, 0, True, False),
    ],
)
def test_against_torch_forward_and_gradients(mode, layers, bidirectional, proj, batch_first, packed):
    torch.manual_seed(0)
    t_len, b, n_in, hsz = 9, 5, 7, 13
    m = torch_module(mode, n_in, hsz, layers, bidirectional, proj, batch_first)
    dirs = 2 if bidirectional else 1
    p = proj or hsz
    x = torch.randn((b, t_len, n_in) if batch_first else (t_len, b, n_in), dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(layers * dirs, b, p, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(layers * dirs, b, hsz, dtype=torch.float64, requires_grad=True)
    lengths = np.array([9, 8, 6, 3, 1]) if packed else np.full(b, t_len)
    state = (h0, c0) if mode == "lstm" else h0
    if packed:
        seq = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor(lengths), batch_first=batch_first)
        out, hn = m(seq, state)
        y_t, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=batch_first, total_length=t_len)
    else:
        y_t, hn = m(x, state)
    h_t, c_t = hn if mode == "lstm" else (hn, None)
    g = np.random.default_rng(1)
    dy, dh = g.standard_normal(tuple(y_t.shape)), g.standard_normal(tuple(h_t.shape))
    dc = g.standard_normal(tuple(c_t.shape)) if c_t is not None else None
    loss = (y_t * torch.from_numpy(dy)).sum() + (h_t * torch.from_numpy(dh)).sum()
    if c_t is not None:
        loss = loss + (c_t * torch.from_numpy(dc)).sum()
    loss.backward()

    # The function with PyTorch's semantics.
    params = {k: v.detach().numpy() for k, v in m.named_parameters()}
    xn, h0n, c0n = x.detach().numpy(), h0.detach().numpy(), c0.detach().numpy()
    lens = lengths if packed else None
    if mode == "lstm":
        y, (h, c) = rnn.lstm(xn, (h0n, c0n), params, batch_first=batch_first, lengths=lens)
        np.testing.assert_allclose(c, c_t.detach().numpy(), rtol=1e-10, atol=1e-12)
    elif mode == "gru":
        y, h = rnn.gru(xn, h0n, params, batch_first=batch_first, lengths=lens)
    else:
        y, h = rnn.rnn(xn, h0n, params, nonlinearity=mode, batch_first=batch_first, lengths=lens)
    np.testing.assert_allclose(y, y_t.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(h, h_t.detach().numpy(), rtol=1e-10, atol=1e-12)

    # The graph ops' gradients against autograd's.
    desc = rnn.rnn_desc(
        mode, n_in, hsz, t_len, b, num_layers=layers, bidirectional=bidirectional, proj_size=proj or None,
        layout="batch_major_unpacked" if batch_first else "seq_major_unpacked", training=True,
    )
    w = rnn.pack_torch_params(desc, params)
    graph = cudnn.pygraph(handle=cudnn.create_cpu_handle())
    X, W, H0, L = graph.tensor_like(xn), graph.tensor_like(w), graph.tensor_like(h0n), graph.tensor_like(lengths.astype(np.int32))
    DY, DH = graph.tensor_like(dy), graph.tensor_like(dh)
    C0 = graph.tensor_like(c0n) if mode == "lstm" else None
    DC = graph.tensor_like(dc) if mode == "lstm" else None
    _, _, _, reserve = graph.rnn(X, W, desc, hx=H0, cx=C0, seq_lengths=L)
    dx, dhx, dcx, dgates = graph.rnn_backward_data(DY, W, reserve, desc, hx=H0, cx=C0, dhy=DH, dcy=DC, seq_lengths=L)
    dw = graph.rnn_backward_weights(X, reserve, dgates, desc, hx=H0, seq_lengths=L)
    outs = [o for o in (dx, dhx, dcx, dw) if o is not None]
    for o in outs:
        o.set_output(True)
    graph.validate()
    arrays = {o: np.empty(o.get_dim(), np.float64) for o in outs}
    feeds = {X: xn, W: w, H0: h0n, L: lengths.astype(np.int32), DY: dy, DH: dh, **arrays}
    if C0 is not None:
        feeds.update({C0: c0n, DC: dc})
    graph.build([cudnn.heur_mode.A])
    graph.execute(feeds, np.empty(graph.get_workspace_size(), np.uint8))
    # Past each length PyTorch's dx is 0, the graph's the padding fill (0 here).
    np.testing.assert_allclose(arrays[dx], x.grad.numpy(), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(arrays[dhx], h0.grad.numpy(), rtol=1e-9, atol=1e-11)
    if dcx is not None:
        np.testing.assert_allclose(arrays[dcx], c0.grad.numpy(), rtol=1e-9, atol=1e-11)
    grads = rnn.unpack_torch_params(desc, arrays[dw])
    for k, v in m.named_parameters():
        np.testing.assert_allclose(grads[k], v.grad.numpy(), rtol=1e-9, atol=1e-11, err_msg=k)
