"""On a GPU with PyTorch: the RNN graph ops (forward in training mode, backward data, backward
weights) on CUDA tensors against PyTorch's nn.LSTM / nn.GRU / nn.RNN (computed in float64 on the
CPU, so that no TF32 or cuDNN choice moves the reference): outputs, final states and every
gradient. Skipped where torch or a CUDA device (usable by ferrodnn) is missing."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ferrodnn as cudnn  # noqa: E402
from ferrodnn import rnn  # noqa: E402

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and cudnn.gpu_available()), reason="needs a CUDA device usable by ferrodnn and PyTorch")

TOL = {torch.float32: (2e-4, 2e-4), torch.float16: (3e-2, 3e-2), torch.bfloat16: (8e-2, 8e-2)}


def module(mode, n_in, hsz, layers, bidirectional, proj):
    kw = dict(num_layers=layers, bidirectional=bidirectional, dtype=torch.float64)
    if mode == "lstm":
        return torch.nn.LSTM(n_in, hsz, proj_size=proj, **kw)
    if mode == "gru":
        return torch.nn.GRU(n_in, hsz, **kw)
    return torch.nn.RNN(n_in, hsz, nonlinearity=mode, **kw)


@pytest.mark.parametrize(
    "mode,layers,bidirectional,proj,dtype",
    [
        ("lstm", 2, True, 0, torch.float32),
        ("lstm", 1, False, 5, torch.float32),
        ("gru", 2, True, 0, torch.float32),
        ("tanh", 2, False, 0, torch.float32),
        ("relu", 1, True, 0, torch.float32),
        ("lstm", 2, True, 0, torch.float16),
        ("gru", 1, True, 0, torch.bfloat16),
    ],
)
def test_rnn_on_the_gpu_against_torch(handle, mode, layers, bidirectional, proj, dtype):
    torch.manual_seed(0)
    t_len, b, n_in, hsz = 9, 5, 7, 13
    dirs = 2 if bidirectional else 1
    p = proj or hsz
    m = module(mode, n_in, hsz, layers, bidirectional, proj)
    lengths = np.array([9, 8, 6, 3, 1])
    # Inputs representable in the GPU type, so both sides start from the same values.
    x = torch.randn(t_len, b, n_in, dtype=torch.float64).to(dtype).double().requires_grad_()
    h0 = torch.randn(layers * dirs, b, p, dtype=torch.float64).to(dtype).double().requires_grad_()
    c0 = torch.randn(layers * dirs, b, hsz, dtype=torch.float64).to(dtype).double().requires_grad_()
    with torch.no_grad():
        for v in m.parameters():
            v.copy_(v.to(dtype).double())
    seq = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor(lengths))
    out, hn = m(seq, (h0, c0) if mode == "lstm" else h0)
    y_t, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=t_len)
    h_t, c_t = hn if mode == "lstm" else (hn, None)
    dy = torch.randn(y_t.shape, dtype=torch.float64).to(dtype).double()
    dh = torch.randn(h_t.shape, dtype=torch.float64).to(dtype).double()
    dc = torch.randn(c_t.shape, dtype=torch.float64).to(dtype).double() if c_t is not None else None
    loss = (y_t * dy).sum() + (h_t * dh).sum() + ((c_t * dc).sum() if c_t is not None else 0)
    loss.backward()

    desc = rnn.rnn_desc(mode, n_in, hsz, t_len, b, num_layers=layers, bidirectional=bidirectional, proj_size=proj or None, training=True)
    w = torch.from_numpy(rnn.pack_torch_params(desc, {k: v.detach().numpy() for k, v in m.named_parameters()})).to("cuda", dtype)
    dev = lambda v: v.detach().to("cuda", dtype).contiguous()  # noqa: E731
    xg, h0g, dyg, dhg = dev(x), dev(h0), dev(dy), dev(dh)
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    graph = cudnn.pygraph(handle=handle)
    X, W, H0, L, DY, DH = (graph.tensor_like(v) for v in (xg, w, h0g, lens, dyg, dhg))
    C0 = DC = None
    if mode == "lstm":
        c0g, dcg = dev(c0), dev(dc)
        C0, DC = graph.tensor_like(c0g), graph.tensor_like(dcg)
    y, hy, cy, reserve = graph.rnn(X, W, desc, hx=H0, cx=C0, seq_lengths=L)
    dx, dhx, dcx, dgates = graph.rnn_backward_data(DY, W, reserve, desc, hx=H0, cx=C0, dhy=DH, dcy=DC, seq_lengths=L)
    dw = graph.rnn_backward_weights(X, reserve, dgates, desc, hx=H0, seq_lengths=L)
    outs = [o for o in (y, hy, cy, dx, dhx, dcx, dw) if o is not None]
    for o in outs:
        o.set_output(True)
    graph.validate()
    graph.build([cudnn.heur_mode.A])
    bufs = {o: torch.full(o.get_dim(), float("nan"), device="cuda", dtype=dtype) for o in outs}
    pack = {X: xg, W: w, H0: h0g, L: lens, DY: dyg, DH: dhg, **bufs}
    if C0 is not None:
        pack.update({C0: c0g, DC: dcg})
    graph.execute(pack, torch.empty(graph.get_workspace_size(), device="cuda", dtype=torch.uint8))
    torch.cuda.synchronize()

    rtol, atol = TOL[dtype]

    def close(got, want, what):
        torch.testing.assert_close(got.double().cpu(), want.detach(), rtol=rtol, atol=atol, msg=lambda m: f"{mode} {what}: {m}")

    close(bufs[y], y_t, "y")
    close(bufs[hy], h_t, "hy")
    close(bufs[dx], x.grad, "dx")
    close(bufs[dhx], h0.grad, "dhx")
    if c_t is not None:
        close(bufs[cy], c_t, "cy")
        close(bufs[dcx], c0.grad, "dcx")
    grads = rnn.unpack_torch_params(desc, bufs[dw].double().cpu().numpy())
    for k, v in m.named_parameters():
        close(torch.from_numpy(grads[k]), v.grad, f"d{k}")
