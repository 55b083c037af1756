"""ferrodnn.torch's drop-in modules (LSTM, GRU, RNN with autograd) against PyTorch's nn.LSTM,
nn.GRU and nn.RNN with copied parameters: forward outputs, final states, and after backward every
parameter's grad, x.grad and the initial states' grads. On the CPU (f32, and f64 gradchecks)
wherever torch is importable; on CUDA (f32 and f16) where a GPU usable by ferrodnn is present.
Every assertion message names the case (mode, layers, directions, layout, dtype) and the tensor."""

import copy

import pytest

torch = pytest.importorskip("torch")

import ferrodnn  # noqa: E402
from ferrodnn import torch as ftorch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence  # noqa: E402

T_LEN, BATCH, N_IN, HID = 7, 4, 5, 6
LENGTHS = [7, 3, 5, 1]  # unequal and unsorted (enforce_sorted=False)


def make(mode, layers=1, bidirectional=False, batch_first=False, proj=0, bias=True, dtype=torch.float32, device="cpu"):
    """A PyTorch module and ferrodnn's copy of it."""
    kw = dict(num_layers=layers, bidirectional=bidirectional, batch_first=batch_first, bias=bias, dtype=dtype, device=device)
    if mode == "lstm":
        ref = nn.LSTM(N_IN, HID, proj_size=proj, **kw)
        ours = ftorch.LSTM.from_torch(ref)
    elif mode == "gru":
        ref = nn.GRU(N_IN, HID, **kw)
        ours = ftorch.GRU.from_torch(ref)
    else:
        ref = nn.RNN(N_IN, HID, nonlinearity=mode, **kw)
        ours = ftorch.RNN.from_torch(ref)
    return ref, ours


class Case:
    """Inputs of one comparison, and the run of a module on them (fresh leaves per module)."""

    def __init__(self, mode, layers, bidirectional, batch_first, proj, packed, with_hx, dtype=torch.float32, device="cpu", seed=0):
        self.mode, self.packed, self.with_hx, self.batch_first = mode, packed, with_hx, batch_first
        self.name = f"{mode} layers={layers} bidirectional={bidirectional} batch_first={batch_first} proj={proj} packed={packed} hx={with_hx} {dtype} {device}"
        g = torch.Generator().manual_seed(seed)
        dirs = 2 if bidirectional else 1
        shape = (BATCH, T_LEN, N_IN) if batch_first else (T_LEN, BATCH, N_IN)
        rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype).to(device)  # noqa: E731
        self.x = rnd(*shape)
        self.h0 = rnd(layers * dirs, BATCH, proj or HID)
        self.c0 = rnd(layers * dirs, BATCH, HID)
        out = dirs * (proj or HID)
        self.dy = rnd(*(shape[:2] + (out,)))
        self.dh = rnd(layers * dirs, BATCH, proj or HID)
        self.dc = rnd(layers * dirs, BATCH, HID)

    def run(self, module):
        """-> (y padded, h_n, c_n or None, {grad name: tensor})."""
        x = self.x.clone().requires_grad_()
        h0 = self.h0.clone().requires_grad_()
        c0 = self.c0.clone().requires_grad_()
        inp = x
        if self.packed:
            inp = pack_padded_sequence(x, torch.tensor(LENGTHS), batch_first=self.batch_first, enforce_sorted=False)
        hx = None
        if self.with_hx:
            hx = (h0, c0) if self.mode == "lstm" else h0
        y, hn = module(inp, hx)
        if self.packed:
            assert isinstance(y, PackedSequence), f"{self.name}: a PackedSequence in gives a PackedSequence out, got {type(y).__name__}"
            y, _ = torch.nn.utils.rnn.pad_packed_sequence(y, batch_first=self.batch_first, total_length=T_LEN)
        h, c = hn if self.mode == "lstm" else (hn, None)
        loss = (y * self.dy).sum() + (h * self.dh).sum() + ((c * self.dc).sum() if c is not None else 0)
        module.zero_grad(set_to_none=True)
        loss.backward()
        grads = {"x": x.grad}
        if self.with_hx:
            grads["h0"] = h0.grad
            if self.mode == "lstm":
                grads["c0"] = c0.grad
        for k, v in module.named_parameters():
            grads[k] = v.grad
        return y.detach(), h.detach(), (c.detach() if c is not None else None), grads


def assert_same(case, got, want, rtol, atol):
    y, h, c, grads = got
    y_r, h_r, c_r, grads_r = want

    def close(a, b, what):
        assert a is not None, f"{case.name}: {what} is None (no gradient reached it)"
        torch.testing.assert_close(a.double().cpu(), b.double().cpu(), rtol=rtol, atol=atol, msg=lambda m: f"{case.name}: {what} differs from PyTorch's: {m}")

    close(y, y_r, "output")
    close(h, h_r, "h_n")
    if c_r is not None:
        close(c, c_r, "c_n")
    assert set(grads) == set(grads_r), f"{case.name}: grads of {sorted(grads)} vs PyTorch's {sorted(grads_r)}"
    for k in grads_r:
        close(grads[k], grads_r[k], f"grad of {k}")


CPU_CASES = [
    # mode, layers, bidirectional, batch_first, proj, packed, with_hx
    ("lstm", 1, False, False, 0, False, True),
    ("lstm", 2, True, False, 0, False, True),
    ("lstm", 2, True, True, 0, True, True),
    ("lstm", 1, False, True, 3, False, False),
    ("lstm", 2, True, False, 3, True, True),
    ("gru", 1, False, False, 0, False, False),
    ("gru", 2, True, True, 0, False, True),
    ("gru", 2, False, False, 0, True, True),
    ("tanh", 2, True, False, 0, False, True),
    ("tanh", 1, False, True, 0, True, True),
    ("relu", 1, True, False, 0, False, True),
    ("relu", 2, False, True, 0, True, False),
]


@pytest.mark.parametrize("mode,layers,bidirectional,batch_first,proj,packed,with_hx", CPU_CASES)
def test_against_torch_on_the_cpu(mode, layers, bidirectional, batch_first, proj, packed, with_hx):
    torch.manual_seed(1)
    ref, ours = make(mode, layers, bidirectional, batch_first, proj)
    case = Case(mode, layers, bidirectional, batch_first, proj, packed, with_hx)
    assert_same(case, case.run(ours), case.run(ref), rtol=2e-5, atol=2e-5)


def test_without_bias_and_unbatched_input():
    torch.manual_seed(2)
    ref, ours = make("lstm", 2, True, bias=False)
    assert [k for k, _ in ours.named_parameters()] == [k for k, _ in ref.named_parameters()]
    x = torch.randn(T_LEN, N_IN)
    hx = (torch.randn(4, HID), torch.randn(4, HID))
    y, (h, c) = ours(x, hx)
    y_r, (h_r, c_r) = ref(x, hx)
    assert y.shape == (T_LEN, 2 * HID) and h.shape == (4, HID), f"unbatched shapes: y {tuple(y.shape)}, h {tuple(h.shape)}"
    for a, b, what in ((y, y_r, "output"), (h, h_r, "h_n"), (c, c_r, "c_n")):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5, msg=lambda m, what=what: f"unbatched bias=False LSTM {what}: {m}")


def test_sorted_packed_sequence_and_strided_input():
    """A PackedSequence with enforce_sorted=True (no permutation), and a non-contiguous input and
    states (views with other strides), both with grad."""
    torch.manual_seed(13)
    ref, ours = make("lstm", 2, True)
    base = torch.randn(BATCH, T_LEN, N_IN)
    h_base, c_base = torch.randn(BATCH, 4, HID), torch.randn(BATCH, 4, HID)
    results = []
    for m in (ours, ref):
        xb = base.clone().requires_grad_()
        x = xb.transpose(0, 1)  # [T, B, input], not contiguous
        hx = (h_base.transpose(0, 1), c_base.transpose(0, 1))
        seq = pack_padded_sequence(x, torch.tensor([7, 6, 4, 2]))
        y, (h, c) = m(seq, hx)
        assert y.sorted_indices is None
        (y.data.square().sum() + h.sum() + 2 * c.sum()).backward()
        results.append((y.data.detach(), h.detach(), c.detach(), xb.grad) + tuple(p.grad for p in m.parameters()))
    for i, (a, b) in enumerate(zip(*results)):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5, msg=lambda m, i=i: f"sorted packed LSTM with strided input, result {i} (y, h_n, c_n, x.grad, then parameters' grads): {m}")


def test_inference_path_and_weight_cache():
    """Without grad the inference forward runs on a packed weight space cached by the
    parameters' versions: an in-place update (an optimizer step) must be seen by the next call."""
    torch.manual_seed(3)
    ref, ours = make("gru", 2, True)
    x = torch.randn(T_LEN, BATCH, N_IN)
    with torch.no_grad():
        y1, _ = ours(x)
        torch.testing.assert_close(y1, ref(x)[0], rtol=2e-5, atol=2e-5, msg=lambda m: f"GRU inference output: {m}")
        assert not y1.requires_grad
        for p, q in zip(ours.parameters(), ref.parameters()):
            p.mul_(0.5)
            q.mul_(0.5)
        y2, h2 = ours(x)
        y2_r, h2_r = ref(x)
    torch.testing.assert_close(y2, y2_r, rtol=2e-5, atol=2e-5, msg=lambda m: f"GRU output after an in-place update of the parameters (stale weight cache?): {m}")
    torch.testing.assert_close(h2, h2_r, rtol=2e-5, atol=2e-5, msg=lambda m: f"GRU h_n after an in-place update: {m}")
    # Only the input requires grad: x.grad flows, no parameter gets one.
    for p in ours.parameters():
        p.requires_grad_(False)
    xg = x.clone().requires_grad_()
    ours(xg)[0].sum().backward()
    xr = x.clone().requires_grad_()
    ref(xr)[0].sum().backward()
    torch.testing.assert_close(xg.grad, xr.grad, rtol=2e-5, atol=2e-5, msg=lambda m: f"GRU x.grad with frozen parameters: {m}")
    assert all(p.grad is None for p in ours.parameters()), "frozen parameters got a grad"


@pytest.mark.parametrize("mode", ["lstm", "gru", "tanh"])
def test_gradcheck_f64(mode):
    """The backward against finite differences of the forward (f64 on the CPU engine)."""
    torch.manual_seed(4)
    _, m = make(mode, 2, True, dtype=torch.float64)
    x = torch.randn(3, 2, N_IN, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(4, 2, HID, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(4, 2, HID, dtype=torch.float64, requires_grad=True)

    def fn(x, h0, c0=None):
        y, hn = m(x, (h0, c0) if mode == "lstm" else h0)
        return (y,) + (hn if isinstance(hn, tuple) else (hn,))

    inputs = (x, h0, c0) if mode == "lstm" else (x, h0)
    assert torch.autograd.gradcheck(fn, inputs, atol=1e-6, rtol=1e-5), f"{mode}: gradcheck failed"


def test_dropout_between_layers():
    """Training mode with dropout: masks from torch's seed (repeatable with manual_seed), off in
    eval mode, and the backward consistent with the forward's masks (finite differences)."""
    torch.manual_seed(5)
    _, m = make("lstm", 2, False, dtype=torch.float64)
    m.dropout = 0.5
    x = torch.randn(4, 3, N_IN, dtype=torch.float64, requires_grad=True)
    m.train()
    torch.manual_seed(7)
    y1, _ = m(x)
    torch.manual_seed(7)
    y2, _ = m(x)
    torch.manual_seed(8)
    y3, _ = m(x)
    m.eval()
    y_eval, _ = m(x)
    assert torch.equal(y1, y2), "dropout: the same torch seed gave different outputs"
    assert not torch.equal(y1, y3), "dropout: another torch seed gave the same outputs"
    assert not torch.equal(y1, y_eval), "dropout: training and eval outputs are equal"
    m.train()

    def fn(x):
        torch.manual_seed(9)
        return m(x)[0]

    assert torch.autograd.gradcheck(fn, (x,), atol=1e-6, rtol=1e-5), "dropout: gradcheck failed"


def test_module_behaviour():
    torch.manual_seed(6)
    m = ftorch.LSTM(N_IN, HID, num_layers=2, proj_size=3)
    ref = nn.LSTM(N_IN, HID, num_layers=2, proj_size=3)
    assert isinstance(m, nn.LSTM)
    assert [(k, tuple(v.shape)) for k, v in m.named_parameters()] == [(k, tuple(v.shape)) for k, v in ref.named_parameters()]
    # PyTorch's initialization: same seed, same parameters.
    torch.manual_seed(6)
    m2 = ftorch.LSTM(N_IN, HID, num_layers=2, proj_size=3)
    torch.manual_seed(6)
    r2 = nn.LSTM(N_IN, HID, num_layers=2, proj_size=3)
    for (k, a), (_, b) in zip(m2.named_parameters(), r2.named_parameters()):
        assert torch.equal(a, b), f"initialization of {k} differs from nn.LSTM's"
    r = ftorch.RNN(N_IN, HID, nonlinearity="relu")
    assert r.nonlinearity == "relu" and ftorch.RNN.from_torch(nn.RNN(N_IN, HID, nonlinearity="relu")).nonlinearity == "relu"
    # A module that has run (graphs cached) can be deep-copied and its state loaded elsewhere.
    x = torch.randn(T_LEN, BATCH, N_IN)
    y, _ = m(x)
    m3 = copy.deepcopy(m)
    torch.testing.assert_close(m3(x)[0], y, msg=lambda s: f"deep copy's output: {s}")
    r2.load_state_dict(m.state_dict())
    torch.testing.assert_close(r2(x)[0], y, rtol=2e-5, atol=2e-5, msg=lambda s: f"state_dict into nn.LSTM: {s}")
    # Another shape builds another graph; the first is reused after it.
    m(torch.randn(3, 2, N_IN))
    torch.testing.assert_close(m(x)[0], y, msg=lambda s: f"output after a call of another shape: {s}")


def test_inference_mode():
    torch.manual_seed(12)
    with torch.inference_mode():
        ref, ours = make("tanh", 2, True)
        x = torch.randn(T_LEN, BATCH, N_IN)
        for _ in range(2):
            torch.testing.assert_close(ours(x)[0], ref(x)[0], rtol=2e-5, atol=2e-5, msg=lambda m: f"RNN under inference_mode: {m}")


def test_lazy_import_and_docstring_example():
    assert ferrodnn.torch is ftorch
    import re

    (block,) = re.findall(r"```python\n(.*?)```", ftorch.__doc__, flags=re.S)
    scope = {}
    exec(compile(block, "ferrodnn/torch.py docstring", "exec"), scope)
    assert scope["y"].shape == (9, 5, 26) and scope["x"].grad is not None, "the docstring example's results"


def test_errors():
    m = ftorch.LSTM(N_IN, HID, num_layers=2)
    x = torch.randn(T_LEN, BATCH, N_IN)
    with pytest.raises(ValueError, match=r"LSTM: input must have input_size = 5 features, got shape \(7, 4, 3\)"):
        m(torch.randn(T_LEN, BATCH, 3))
    with pytest.raises(ValueError, match=r"LSTM: input must be 2-D \(unbatched\) or 3-D, got shape \(1, 7, 4, 5\)"):
        m(x.unsqueeze(0))
    with pytest.raises(TypeError, match=r"LSTM: hx must be a tuple \(h0, c0\) for an LSTM, got Tensor"):
        m(x, torch.zeros(2, BATCH, HID))
    with pytest.raises(ValueError, match=r"LSTM: h0 must have shape \(2, 4, 6\).*got \(1, 4, 6\)"):
        m(x, (torch.zeros(1, BATCH, HID), torch.zeros(2, BATCH, HID)))
    with pytest.raises(ValueError, match=r"LSTM: c0 must have shape \(2, 4, 6\).*got \(2, 4, 5\)"):
        m(x, (torch.zeros(2, BATCH, HID), torch.zeros(2, BATCH, 5)))
    with pytest.raises(ValueError, match=r"LSTM: h0 must be torch.float32 on cpu as the input, got torch.float64 on cpu"):
        m(x, (torch.zeros(2, BATCH, HID, dtype=torch.float64), torch.zeros(2, BATCH, HID)))
    with pytest.raises(ValueError, match=r"LSTM: input is torch.float64 on cpu but the parameters are torch.float32 on cpu"):
        m(x.double())
    with pytest.raises(ValueError, match=r"for batched 3-D input, h0 must be 3-D, got shape \(4, 6\)"):
        ftorch.GRU(N_IN, HID)(x, torch.zeros(BATCH, HID))
    with pytest.raises(TypeError, match=r"GRU: input must be a torch.Tensor or a PackedSequence, got list"):
        ftorch.GRU(N_IN, HID)([1.0, 2.0])
    with pytest.raises(ValueError, match=r"RNN: input must have at least one step and one sample, got shape \(0, 4, 5\)"):
        ftorch.RNN(N_IN, HID)(torch.randn(0, BATCH, N_IN))
    with pytest.raises(TypeError, match=r"GRU.from_torch: expected a torch.nn.GRU, got LSTM"):
        ftorch.GRU.from_torch(nn.LSTM(N_IN, HID))
    with pytest.raises(ValueError, match=r"ferrodnn.torch: tensors on meta are not supported \(CPU and cuda:0 are\)"):
        ftorch.GRU(N_IN, HID, device="meta")(torch.empty(T_LEN, BATCH, N_IN, device="meta"))
    with pytest.raises(ValueError, match=r"RNN: input must be float16, bfloat16, float32 or float64, got torch.int64"):
        ftorch.RNN(N_IN, HID, dtype=torch.float32)(torch.ones(T_LEN, BATCH, N_IN, dtype=torch.int64))


# --- CUDA ----------------------------------------------------------------------------------------

GPU = torch.cuda.is_available() and ferrodnn.gpu_available()
needs_gpu = pytest.mark.skipif(not GPU, reason="needs a CUDA device usable by ferrodnn and PyTorch")

GPU_CASES = [
    # mode, layers, bidirectional, batch_first, proj, packed, with_hx
    ("lstm", 1, False, False, 0, False, True),
    ("lstm", 2, True, True, 0, True, True),
    ("lstm", 2, True, False, 3, False, True),
    ("gru", 2, True, False, 0, True, True),
    ("gru", 1, False, True, 0, False, False),
    ("tanh", 2, False, False, 0, True, True),
    ("relu", 1, True, True, 0, False, True),
]


def rel_err(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("mode,layers,bidirectional,batch_first,proj,packed,with_hx", GPU_CASES)
def test_against_torch_on_cuda(mode, layers, bidirectional, batch_first, proj, packed, with_hx, dtype):
    """ferrodnn on cuda:0 against the same PyTorch module in f64 on the CPU (inputs and parameters
    rounded to `dtype` first), element-wise at the dtype's tolerance; in f16 also against
    PyTorch's own f16 module on CUDA (cuDNN), by relative norm of the difference."""
    if proj and dtype == torch.float16:
        pytest.skip("covered in f32")
    torch.manual_seed(10)
    ref64, _ = make(mode, layers, bidirectional, batch_first, proj, dtype=torch.float64)
    with torch.no_grad():
        for p in ref64.parameters():
            p.copy_(p.to(dtype).double())
    cls = {"lstm": ftorch.LSTM, "gru": ftorch.GRU}.get(mode, ftorch.RNN)
    ours = cls.from_torch(ref64).to("cuda", dtype)
    case = Case(mode, layers, bidirectional, batch_first, proj, packed, with_hx, dtype=dtype, device="cuda")
    got = case.run(ours)
    torch.cuda.synchronize()
    ref_case = Case(mode, layers, bidirectional, batch_first, proj, packed, with_hx, dtype=dtype, device="cuda")
    for k in ("x", "h0", "c0", "dy", "dh", "dc"):
        setattr(ref_case, k, getattr(case, k).double().cpu())
    want = ref_case.run(ref64)
    rtol, atol = (2e-4, 2e-4) if dtype == torch.float32 else (3e-2, 3e-2)
    assert_same(case, got, want, rtol, atol)
    if dtype == torch.float16:
        ref16 = copy.deepcopy(ref64).to("cuda", dtype)
        y, h, c, grads = case.run(ref16)
        gy, gh, gc, ggrads = got
        pairs = [("output", gy, y), ("h_n", gh, h)] + ([("c_n", gc, c)] if c is not None else [])
        pairs += [(f"grad of {k}", ggrads[k], grads[k]) for k in grads]
        for what, a, b in pairs:
            e = rel_err(a, b)
            assert e < 3e-2, f"{case.name}: {what} vs PyTorch's f16 module on CUDA: relative error {e:.3g} (limit 3e-2)"


@needs_gpu
def test_cuda_current_stream_and_f16_vs_f32():
    """Work goes to PyTorch's current stream (a side stream here); the f16 module is within a few
    1e-2 (relative norm) of the f32 one on the same inputs."""
    torch.manual_seed(11)
    _, m32 = make("lstm", 2, True, device="cuda")
    m16 = copy.deepcopy(m32).half()
    x = torch.randn(T_LEN, BATCH, N_IN, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y32, (h32, c32) = m32(x)
        y16, (h16, c16) = m16(x.half())
        xg = x.half().requires_grad_()
        y16g, _ = m16(xg)
        y16g.float().square().sum().backward()
    torch.cuda.synchronize()
    y_default, _ = m32(x)
    torch.cuda.synchronize()
    torch.testing.assert_close(y32, y_default, msg=lambda s: f"LSTM f32 on a side stream vs the default stream: {s}")
    for what, a, b in (("output", y16, y32), ("h_n", h16, h32), ("c_n", c16, c32)):
        e = rel_err(a, b)
        assert e < 3e-2, f"LSTM f16 vs f32 on CUDA: {what} relative error {e:.3g} (limit 3e-2)"
    xr = x.clone().requires_grad_()
    m32(xr)[0].square().sum().backward()
    e = rel_err(xg.grad, xr.grad)
    assert e < 5e-2, f"LSTM f16 vs f32 on CUDA: x.grad relative error {e:.3g} (limit 5e-2)"
