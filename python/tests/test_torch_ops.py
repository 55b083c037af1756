"""ferrodnn.torch's functional ops (torch.library custom ops with autograd) and module wrappers
against PyTorch's own ops: outputs and every input's gradient, on the CPU in float32 (and
float64 gradchecks on tiny shapes), and on CUDA in float32, float16 and bfloat16 where a GPU is
present; opcheck of every registered op; swap_modules on a small conv net and an MLP."""

import copy

import pytest

torch = pytest.importorskip("torch")

import ferrodnn  # noqa: E402
import ferrodnn.torch as ft  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

CUDA = torch.cuda.is_available() and ferrodnn.gpu_available()
F64 = torch.float64

# (device, dtype): the CPU in float32, CUDA in the three training dtypes.
CASES = [("cpu", torch.float32)] + [
    pytest.param("cuda", dt, marks=pytest.mark.skipif(not CUDA, reason="no CUDA GPU")) for dt in (torch.float32, torch.float16, torch.bfloat16)
]
# Largest error allowed, relative to the reference's largest magnitude (f32 on CUDA may run a
# tf32 pass, 10 bits of mantissa).
TOL = {("cpu", torch.float32): 2e-5, ("cuda", torch.float32): 5e-3, ("cuda", torch.float16): 1e-2, ("cuda", torch.bfloat16): 4e-2}


def close(actual, expected, device, dtype, what):
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    err = (a - e).abs().max().item()
    scale = e.abs().max().item() + 1e-3
    assert err <= TOL[(device, dtype)] * scale, f"{what} ({device}, {dtype}): max error {err:.3g}, reference max {scale:.3g}"


def check(ours, ref, inputs, device, dtype, seed=0):
    """Runs `ours` on `inputs` (CPU float64 tensors; those requiring grad get grads) moved to
    (device, dtype) and `ref` on the float64 tensors, and compares the outputs and, for a random
    output gradient, every input's gradient. Returns our outputs."""
    gen = torch.Generator().manual_seed(seed)
    mine = [t.detach().to(device, dtype).requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t for t in inputs]
    # The reference sees the inputs as rounded to `dtype` (for float16 and bfloat16).
    theirs = [t.detach().to(dtype).double().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t for t in inputs]
    ys, rs = ours(*mine), ref(*theirs)
    ys, rs = (ys if isinstance(ys, tuple) else (ys,)), (rs if isinstance(rs, tuple) else (rs,))
    for i, (y, r) in enumerate(zip(ys, rs)):
        assert y.dtype == dtype and y.device.type == device, f"output {i}: {y.dtype} on {y.device}"
        close(y, r, device, dtype, f"output {i}")
    grads = [torch.randn(r.shape, generator=gen, dtype=F64) for r in rs]
    need = [i for i, t in enumerate(theirs) if isinstance(t, torch.Tensor) and t.requires_grad]
    if need:
        g_ours = torch.autograd.grad(ys, [mine[i] for i in need], [g.to(device, dtype) for g in grads])
        g_ref = torch.autograd.grad(rs, [theirs[i] for i in need], grads)
        for i, a, e in zip(need, g_ours, g_ref):
            close(a, e, device, dtype, f"grad of input {i}")
    return ys


def rand(*shape, grad=True, seed=None, scale=1.0, channels_last=False):
    gen = torch.Generator().manual_seed(seed if seed is not None else hash(shape) % 1000)
    t = torch.randn(shape, generator=gen, dtype=F64) * scale
    if channels_last:
        t = t.contiguous(memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d)
    return t.requires_grad_(grad)


ACT = {None: lambda t: t, "relu": F.relu, "silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}


# -- conv ------------------------------------------------------------------------------------

# (bias, activation, residual, stride, padding, dilation, groups)
CONV_OPTIONS = [
    (False, None, False, 1, 0, 1, 1),
    (True, "relu", False, 2, 1, 1, 1),
    (True, "silu", True, (2, 1), (1, 0), (1, 2), 2),
    (False, "gelu", True, 1, 1, 1, 3),
    (True, "gelu_tanh", False, 1, (2, 1), 2, 1),
]


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("options", CONV_OPTIONS)
def test_conv2d(device, dtype, channels_last, options):
    has_bias, act, has_res, stride, padding, dilation, groups = options
    x = rand(2, 6, 9, 7, channels_last=channels_last, seed=1)
    w = rand(6, 6 // groups, 3, 2, seed=2, scale=0.3)
    b = rand(6, seed=3) if has_bias else None
    out = F.conv2d(x.detach(), w.detach(), None, stride, padding, dilation, groups).shape
    r = rand(*out, seed=4, channels_last=channels_last) if has_res else None

    def ours(x, w, b, r):
        return ft.conv2d(x, w, b, stride, padding, dilation, groups, activation=act, residual=r)

    def ref(x, w, b, r):
        y = F.conv2d(x, w, b, stride, padding, dilation, groups)
        return ACT[act](y + r if r is not None else y)

    (y,) = check(ours, ref, [x, w, b, r], device, dtype)
    assert y.is_contiguous(memory_format=torch.channels_last) if channels_last else y.is_contiguous(), f"output strides {y.stride()}"


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_conv3d(device, dtype, channels_last):
    x = rand(2, 4, 5, 6, 4, channels_last=channels_last, seed=5)
    w = rand(3, 4, 2, 3, 2, seed=6, scale=0.3)
    b = rand(3, seed=7)
    check(lambda x, w, b: ft.conv3d(x, w, b, (1, 2, 1), 1, activation="relu"), lambda x, w, b: F.relu(F.conv3d(x, w, b, (1, 2, 1), 1)), [x, w, b], device, dtype)


@pytest.mark.parametrize("act", [None, "relu"])
def test_conv2d_grad_of_the_residual_alone(act):
    x, w = torch.randn(1, 2, 4, 4), torch.randn(2, 2, 3, 3)
    r = torch.randn(1, 2, 2, 2, requires_grad=True)
    g = torch.randn(1, 2, 2, 2)
    (dr,) = torch.autograd.grad(ft.conv2d(x, w, activation=act, residual=r), r, g)
    (want,) = torch.autograd.grad(ACT[act](F.conv2d(x, w) + r), r, g)
    torch.testing.assert_close(dr, want)


# -- linear ----------------------------------------------------------------------------------


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("act", list(ACT))
@pytest.mark.parametrize("has_bias", [False, True])
def test_linear(device, dtype, act, has_bias):
    x, w = rand(3, 5, 13, seed=8), rand(7, 13, seed=9, scale=0.3)
    b = rand(7, seed=10) if has_bias else None
    check(lambda x, w, b: ft.linear(x, w, b, activation=act), lambda x, w, b: ACT[act](F.linear(x, w, b)), [x, w, b], device, dtype)


@pytest.mark.parametrize("device,dtype", CASES)
def test_linear_strided_input_and_frozen_weight(device, dtype):
    # A transposed (non-contiguous) input, a weight without grad.
    x = rand(6, 4, 11, seed=11).transpose(0, 1).detach().requires_grad_(True)
    w = rand(5, 11, seed=12, grad=False)
    check(lambda x, w: ft.linear(x, w), F.linear, [x, w], device, dtype)


@pytest.mark.parametrize("device,dtype", CASES)
def test_linear_square_shapes(device, dtype):
    # Square weight and input: the transposed views have the same dims as the tensors.
    x, w, b = rand(16, 16, seed=13), rand(16, 16, seed=14, scale=0.3), rand(16, seed=15)
    check(lambda x, w, b: ft.linear(x, w, b, activation="relu"), lambda x, w, b: F.relu(F.linear(x, w, b)), [x, w, b], device, dtype)


# -- layer_norm, rms_norm ----------------------------------------------------------------------


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_layer_norm(device, dtype, affine, residual):
    x = rand(3, 5, 4, 6, seed=13, scale=2.0)
    w, b = (rand(4, 6, seed=14), rand(4, 6, seed=15)) if affine else (None, None)
    r = rand(3, 5, 4, 6, seed=16) if residual else None

    def ref(x, w, b, r):
        s = x + r if r is not None else x
        y = F.layer_norm(s, (4, 6), w, b, 1e-4)
        return (y, s) if r is not None else y

    check(lambda x, w, b, r: ft.layer_norm(x, (4, 6), w, b, 1e-4, residual=r), ref, [x, w, b, r], device, dtype)


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm(device, dtype, affine, residual):
    x = rand(7, 3, 10, seed=17)
    w = rand(10, seed=18) if affine else None
    r = rand(7, 3, 10, seed=19) if residual else None

    def ref(x, w, r):
        s = x + r if r is not None else x
        y = F.rms_norm(s, (10,), w, 1e-5)
        return (y, s) if r is not None else y

    check(lambda x, w, r: ft.rms_norm(x, (10,), w, 1e-5, residual=r), ref, [x, w, r], device, dtype)


# -- attention -------------------------------------------------------------------------------

# (key/value heads, causal, mask, value head dim)
SDPA_OPTIONS = [(4, False, None, 8), (2, True, None, 8), (1, False, "float", 6), (4, False, "bool", 8), (2, True, None, 16)]


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("options", SDPA_OPTIONS)
def test_sdpa(device, dtype, options):
    hk, causal, mask, dv = options
    q, k, v = rand(2, 4, 5, 8, seed=20), rand(2, hk, 7, 8, seed=21), rand(2, hk, 7, dv, seed=22)
    m = None
    if mask == "float":
        m = rand(5, 7, seed=23, grad=False)
    elif mask == "bool":
        m = torch.rand(2, 1, 5, 7, generator=torch.Generator().manual_seed(24)) > 0.3
        m[..., 0] = True
    gqa = hk != 4

    def ours(q, k, v):
        mm = m.to(q.device, q.dtype) if m is not None and m.dtype != torch.bool else (m.to(q.device) if m is not None else None)
        return ft.scaled_dot_product_attention(q, k, v, mm, is_causal=causal, scale=0.4, enable_gqa=gqa)

    def ref(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, m, is_causal=causal, scale=0.4, enable_gqa=gqa)

    check(ours, ref, [q, k, v], device, dtype)


@pytest.mark.parametrize("device,dtype", CASES)
def test_sdpa_bshd_views(device, dtype):
    # [B, S, H, D] memory seen as [B, H, S, D], as models make q, k and v.
    q, k, v = (rand(2, 6, 3, 8, seed=s).transpose(1, 2).detach().requires_grad_(True) for s in (25, 26, 27))
    check(lambda q, k, v: ft.scaled_dot_product_attention(q, k, v, is_causal=True), lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), [q, k, v], device, dtype)


# -- batch_norm, group_norm --------------------------------------------------------------------


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("affine", [False, True])
def test_batch_norm(device, dtype, channels_last, training, affine):
    x = rand(3, 5, 4, 7, seed=28, scale=2.0, channels_last=channels_last)
    w, b = (rand(5, seed=29), rand(5, seed=30)) if affine else (None, None)
    rm0, rv0 = rand(5, seed=31, grad=False), rand(5, seed=32, grad=False).abs() + 0.5
    stats_dtype = torch.float32 if dtype != torch.float64 else dtype
    mine = [rm0.to(device, stats_dtype), rv0.to(device, stats_dtype)]
    theirs = [rm0.clone(), rv0.clone()]

    def ours(x, w, b):
        return ft.batch_norm(x, mine[0], mine[1], w, b, training, 0.3, 1e-4)

    def ref(x, w, b):
        return F.batch_norm(x, theirs[0], theirs[1], w, b, training, 0.3, 1e-4)

    # float32 parameters beside a 16-bit input, as autocast leaves them.
    wb = [t.float() if t is not None and dtype in (torch.float16, torch.bfloat16) else t for t in (w, b)]
    if dtype in (torch.float16, torch.bfloat16) and affine:
        wb = [t.detach().to(device).requires_grad_(True) for t in wb]
        y = ours(x.detach().to(device, dtype), *wb)
        close(y, ref(x.detach().to(dtype).double(), w, b), device, dtype, "output beside float32 parameters")
    else:
        (y,) = check(ours, ref, [x, w, b], device, dtype)
    assert y.stride() == x.stride(), f"output strides {y.stride()}, input {x.stride()}"
    for a, e, name in zip(mine, theirs, ("running_mean", "running_var")):
        close(a, e, device, dtype, name)


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("act,residual", [("relu", False), ("relu", True), (None, True), ("silu", True)])
def test_batch_norm_fused_epilogue(device, dtype, channels_last, training, act, residual):
    """activation(batch_norm(x) + residual), as a ResNet block's norms use it: the output, every
    gradient (the residual's included) and the running statistics."""
    x = rand(3, 5, 4, 7, seed=61, scale=2.0, channels_last=channels_last)
    w, b = rand(5, seed=62), rand(5, seed=63)
    r = rand(3, 5, 4, 7, seed=64, channels_last=channels_last) if residual else None
    stats_dtype = torch.float32 if dtype != torch.float64 else dtype
    rm0, rv0 = rand(5, seed=65, grad=False), rand(5, seed=66, grad=False).abs() + 0.5
    mine, theirs = [rm0.to(device, stats_dtype), rv0.to(device, stats_dtype)], [rm0.clone(), rv0.clone()]

    def ours(x, w, b, r):
        return ft.batch_norm(x, mine[0], mine[1], w, b, training, 0.2, 1e-4, activation=act, residual=r)

    def ref(x, w, b, r):
        y = F.batch_norm(x, theirs[0], theirs[1], w, b, training, 0.2, 1e-4)
        return ACT[act](y + r if r is not None else y)

    (y,) = check(ours, ref, [x, w, b, r], device, dtype)
    assert y.stride() == x.stride(), f"output strides {y.stride()}, input {x.stride()}"
    for a, e, name in zip(mine, theirs, ("running_mean", "running_var")):
        close(a, e, device, dtype, name)


def test_batch_norm_float64_scalars_are_doubles():
    """In float64, epsilon and momentum reach the graph as doubles (as PyTorch takes them): the
    running statistics and the output agree to float64 rounding, not float32's."""
    x = (torch.randn(4, 6, 3, 3, dtype=F64) * 3 + 5).contiguous(memory_format=torch.channels_last)
    mine, theirs = [torch.zeros(6, dtype=F64), torch.ones(6, dtype=F64)], [torch.zeros(6, dtype=F64), torch.ones(6, dtype=F64)]
    y = ft.batch_norm(x, *mine, None, None, True, 0.1, 1e-5)
    e = F.batch_norm(x, *theirs, None, None, True, 0.1, 1e-5)
    torch.testing.assert_close(y, e, rtol=0, atol=1e-13)
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)


@pytest.mark.parametrize("act", [None, "relu", "silu"])
def test_batch_norm_grad_of_the_residual_alone(act):
    """Only the residual requires grad: its gradient is the activation's backward of the
    output's gradient."""
    x, w = torch.randn(2, 3, 4, 4), torch.randn(3)
    r = torch.randn(2, 3, 4, 4, requires_grad=True)
    rr = r.detach().clone().requires_grad_(True)
    g = torch.randn(2, 3, 4, 4)
    (dr,) = torch.autograd.grad(ft.batch_norm(x, None, None, w, None, True, activation=act, residual=r), r, g)
    (er,) = torch.autograd.grad(ACT[act](F.batch_norm(x, None, None, w, None, True) + rr), rr, g)
    torch.testing.assert_close(dr, er)


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("act", [None, "relu", "silu"])
def test_group_norm(device, dtype, channels_last, act):
    x = rand(2, 6, 5, 3, seed=33, channels_last=channels_last)
    w, b = rand(6, seed=34), rand(6, seed=35)
    check(lambda x, w, b: ft.group_norm(x, 3, w, b, 1e-4, activation=act), lambda x, w, b: ACT[act](F.group_norm(x, 3, w, b, 1e-4)), [x, w, b], device, dtype)


# -- softmax, pooling ----------------------------------------------------------------------


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("dim", [0, -1, 1])
@pytest.mark.parametrize("use_log", [False, True])
def test_softmax(device, dtype, dim, use_log):
    x = rand(3, 5, 7, seed=36, scale=2.0)
    check(lambda x: ft.softmax(x, dim, use_log), lambda x: (F.log_softmax if use_log else F.softmax)(x, dim), [x], device, dtype)


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("mode", ["max", "avg", "avg_exclude_padding"])
def test_pool2d(device, dtype, channels_last, mode):
    x = rand(2, 3, 9, 8, seed=37, channels_last=channels_last)
    if mode == "max":
        ours, ref = (lambda x: ft.max_pool2d(x, 3, 2, 1)), (lambda x: F.max_pool2d(x, 3, 2, 1))
    else:
        inc = mode == "avg"
        ours = lambda x: ft.avg_pool2d(x, (3, 2), (2, 1), 1, count_include_pad=inc)  # noqa: E731
        ref = lambda x: F.avg_pool2d(x, (3, 2), (2, 1), 1, count_include_pad=inc)  # noqa: E731
    (y,) = check(ours, ref, [x], device, dtype)
    assert y.is_contiguous(memory_format=torch.channels_last) if channels_last else y.is_contiguous(), f"output strides {y.stride()}"


# -- float64 gradchecks, opcheck, torch.compile -------------------------------------------------


def tiny(*shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=F64).requires_grad_(True)


GRADCHECKS = {
    "conv2d": (lambda x, w, b, r: ft.conv2d(x, w, b, 2, 1, activation="silu", residual=r), lambda: (tiny(1, 2, 4, 3, seed=1), tiny(3, 2, 2, 2, seed=2), tiny(3, seed=3), tiny(1, 3, 3, 2, seed=4))),
    "conv2d_channels_last": (
        lambda x, w: ft.conv2d(x, w, None, 1, 1, groups=2, activation="relu"),
        lambda: (tiny(1, 4, 3, 3, seed=5).detach().contiguous(memory_format=torch.channels_last).requires_grad_(True), tiny(2, 2, 2, 2, seed=6)),
    ),
    "linear": (lambda x, w, b: ft.linear(x, w, b, activation="gelu"), lambda: (tiny(2, 3, 4, seed=7), tiny(5, 4, seed=8), tiny(5, seed=9))),
    "layer_norm": (lambda x, w, b, r: ft.layer_norm(x, (4,), w, b, residual=r), lambda: (tiny(3, 4, seed=10), tiny(4, seed=11), tiny(4, seed=12), tiny(3, 4, seed=13))),
    "rms_norm": (lambda x, w, r: ft.rms_norm(x, (4,), w, residual=r), lambda: (tiny(3, 4, seed=14), tiny(4, seed=15), tiny(3, 4, seed=16))),
    "sdpa": (lambda q, k, v: ft.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), lambda: (tiny(1, 2, 3, 4, seed=17), tiny(1, 1, 3, 4, seed=18), tiny(1, 1, 3, 4, seed=19))),
    "batch_norm": (lambda x, w, b: ft.batch_norm(x, None, None, w, b, True), lambda: (tiny(2, 2, 3, 2, seed=20), tiny(2, seed=21), tiny(2, seed=22))),
    "batch_norm_eval": (
        lambda x, w, b: ft.batch_norm(x, torch.zeros(2, dtype=F64) + 0.1, torch.ones(2, dtype=F64) * 1.5, w, b, False),
        lambda: (tiny(2, 2, 3, 2, seed=23), tiny(2, seed=24), tiny(2, seed=25)),
    ),
    "batch_norm_relu_residual": (
        lambda x, w, b, r: ft.batch_norm(x, None, None, w, b, True, activation="relu", residual=r),
        lambda: (tiny(2, 2, 3, 2, seed=54), tiny(2, seed=55), tiny(2, seed=56), tiny(2, 2, 3, 2, seed=57)),
    ),
    "batch_norm_eval_silu_residual": (
        lambda x, w, r: ft.batch_norm(x, torch.zeros(2, dtype=F64) + 0.1, torch.ones(2, dtype=F64) * 1.5, w, None, False, activation="silu", residual=r),
        lambda: (tiny(2, 2, 3, 2, seed=58), tiny(2, seed=59), tiny(2, 2, 3, 2, seed=60)),
    ),
    "group_norm": (lambda x, w, b: ft.group_norm(x, 2, w, b, activation="silu"), lambda: (tiny(2, 4, 2, 2, seed=26), tiny(4, seed=27), tiny(4, seed=28))),
    "log_softmax": (lambda x: ft.softmax(x, 1, use_log=True), lambda: (tiny(2, 3, 2, seed=29),)),
    "avg_pool2d": (lambda x: ft.avg_pool2d(x, 2, 1, 1, count_include_pad=False), lambda: (tiny(1, 2, 3, 3, seed=30),)),
    "max_pool2d": (lambda x: ft.max_pool2d(x, 2, 1), lambda: (tiny(1, 2, 3, 3, seed=31),)),
}


@pytest.mark.parametrize("name", list(GRADCHECKS))
def test_gradcheck_float64(name):
    fn, make = GRADCHECKS[name]
    assert torch.autograd.gradcheck(fn, make(), eps=1e-6, atol=1e-6, rtol=1e-5), name


def _opcheck_cases():
    x = tiny(2, 4, 5, 4, seed=30)
    xcl = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_(True)
    w, b = tiny(6, 2, 3, 3, seed=31), tiny(6, seed=32)
    r = tiny(2, 6, 3, 1, seed=33)
    q, k = tiny(1, 2, 3, 4, seed=34), tiny(1, 1, 5, 4, seed=35)
    c4 = tiny(4, seed=36)
    return {
        "conv": [(x, w, b, r, [1, 2], [0, 0], [1, 1], "silu", True), (xcl, w, None, None, [1, 1], [1, 1], [1, 1], "relu", False)],
        "linear": [(tiny(3, 5, seed=37), tiny(4, 5, seed=38), tiny(4, seed=39), "gelu", True), (tiny(2, 3, 5, seed=40), tiny(4, 5, seed=41), None, "none", False)],
        "layer_norm": [(tiny(3, 4, seed=42), c4, c4, tiny(3, 4, seed=43), 1, 1e-5, True), (tiny(3, 4, seed=44).detach(), None, None, None, 1, 1e-5, False)],
        "rms_norm": [(tiny(3, 4, seed=45), c4, tiny(3, 4, seed=46), 1, 1e-5, True)],
        "sdpa": [(q, k, k.detach().clone().requires_grad_(True), None, True, 0.5, True)],
        "batch_norm": [
            (x, c4, c4, torch.zeros(4, dtype=F64), torch.ones(4, dtype=F64), None, True, 0.1, 1e-5, "none", False),
            (xcl, c4, None, torch.zeros(4, dtype=F64), torch.ones(4, dtype=F64), None, False, 0.1, 1e-5, "none", False),
            (xcl, c4, c4, None, None, tiny(2, 4, 5, 4, seed=47).detach().contiguous(memory_format=torch.channels_last).requires_grad_(True), True, 0.1, 1e-5, "relu", False),
            (x, c4, c4, torch.zeros(4, dtype=F64), torch.ones(4, dtype=F64), tiny(2, 4, 5, 4, seed=48), False, 0.1, 1e-5, "silu", True),
        ],
        "softmax": [(x, 1, False), (xcl, 3, True)],
        "pool2d": [(x, "max", [2, 2], [2, 1], [1, 0]), (xcl, "avg_exclude", [3, 3], [1, 1], [1, 1])],
        "group_norm": [(x, c4, c4, 2, 1e-5, "silu", True, True), (xcl, None, None, 2, 1e-5, "relu", True, False), (xcl.detach(), c4.detach(), None, 2, 1e-5, "none", False, False)],
    }


@pytest.mark.parametrize("op", ["conv", "linear", "layer_norm", "rms_norm", "sdpa", "batch_norm", "group_norm", "softmax", "pool2d"])
def test_opcheck(op):
    """torch.library.opcheck: schema, fake (meta) implementation against the real one (shapes,
    strides, dtypes), autograd registration, and AOT dispatch with dynamic shapes (which runs
    the backward ops on fake tensors)."""
    for args in _opcheck_cases()[op]:
        torch.library.opcheck(getattr(torch.ops.ferrodnn, op).default, args)


def test_torch_compile_eager_backend():
    torch._dynamo.reset()

    def block(x, w, b, wl):
        y = ft.conv2d(x, w, b, padding=1, activation="relu")
        return ft.linear(y.flatten(1), wl, activation="silu").sum()

    x, w, b, wl = tiny(2, 3, 4, 4, seed=50), tiny(4, 3, 3, 3, seed=51), tiny(4, seed=52), tiny(5, 64, seed=53)
    compiled = torch.compile(block, backend="eager", fullgraph=True)
    out = compiled(x, w, b, wl)
    grads = torch.autograd.grad(out, (x, w, b, wl))
    ref = block(x, w, b, wl)
    ref_grads = torch.autograd.grad(ref, (x, w, b, wl))
    torch.testing.assert_close(out, ref)
    for a, e in zip(grads, ref_grads):
        torch.testing.assert_close(a, e)


def test_graph_cache_reuses_built_graphs():
    ft.clear_graph_cache()
    x, w = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)
    ft.conv2d(x, w, padding=1)
    assert ft.graph_cache_info()[0] == 1
    ft.conv2d(torch.randn(2, 3, 6, 6), w, padding=1)
    assert ft.graph_cache_info()[0] == 1, "the same shapes reuse the built graph"
    ft.conv2d(x.contiguous(memory_format=torch.channels_last), w, padding=1)
    ft.conv2d(x, w, padding=0)
    assert ft.graph_cache_info()[0] == 3, "another layout or option builds another graph"


def test_no_grad_builds_no_backward_and_keeps_no_preactivation():
    x, w = torch.randn(2, 5, requires_grad=True), torch.randn(3, 5, requires_grad=True)
    with torch.no_grad():
        y = ft.linear(x, w, activation="silu")
    assert y.grad_fn is None and not y.requires_grad
    torch.testing.assert_close(y, F.silu(F.linear(x, w)).detach())


# -- errors ------------------------------------------------------------------------------------


def test_refused_arguments_name_the_op_and_argument():
    x, w = torch.randn(1, 4, 5, 5), torch.randn(2, 4, 3, 3)
    cases = [
        (lambda: ft.conv2d(x, w, activation="tanh"), r"ferrodnn.torch.conv2d: activation must be one of 'relu', 'silu', 'gelu', 'gelu_tanh' or None, got 'tanh'"),
        (lambda: ft.conv2d(x, w, padding="same"), r"ferrodnn.torch.conv2d: padding must be ints or 'valid', got 'same'"),
        (lambda: ft.conv2d(x, w, groups=3), r"ferrodnn.torch.conv2d: groups=3 does not fit input channels 4"),
        (lambda: ft.conv2d(x, w.double()), r"ferrodnn.torch.conv2d: weight must be torch.float32 on cpu as the input, got torch.float64 on cpu"),
        (lambda: ft.conv2d(x, w, residual=torch.randn(1, 2, 4, 4)), r"ferrodnn.torch.conv2d: residual must have shape \(1, 2, 3, 3\), got \(1, 2, 4, 4\)"),
        (lambda: ft.conv2d(x, torch.randn(2, 4, 7, 7)), r"ferrodnn.torch.conv2d: the output would have no elements"),
        (lambda: ft.linear(torch.randn(3, 4), torch.randn(2, 5)), r"ferrodnn.torch.linear: input's last dim must be weight.shape\[1\] = 5"),
        (lambda: ft.linear(torch.randn(3, 4).int(), torch.randn(2, 4)), r"ferrodnn.torch.linear: input must be float32, float16, bfloat16 or float64, got torch.int32"),
        (lambda: ft.group_norm(x, 3), r"ferrodnn.torch.group_norm: num_groups=3 must divide the 4 channels"),
        (lambda: ft.group_norm(x, 2, activation="gelu"), r"ferrodnn.torch.group_norm: activation must be one of 'relu', 'silu' or None, got 'gelu'"),
        (lambda: ft.layer_norm(x, (4,)), r"ferrodnn.torch.layer_norm: normalized_shape \(4,\) must be the input's last dims"),
        (lambda: ft.batch_norm(x, None, None, training=False), r"ferrodnn.torch.batch_norm: inference \(training=False\) needs running_mean and running_var"),
        (lambda: ft.batch_norm(x, torch.zeros(4), torch.ones(4), training=True, momentum=None), r"ferrodnn.torch.batch_norm: momentum must be a number"),
        (lambda: ft.batch_norm(torch.randn(2, 4), None, None, training=True), r"ferrodnn.torch.batch_norm: input must be \(4, 5\)-D"),
    ]
    q = torch.randn(1, 4, 3, 8)
    kv = torch.randn(1, 2, 3, 8)
    cases += [
        (lambda: ft.scaled_dot_product_attention(q, q, q, dropout_p=0.1), r"ferrodnn.torch.scaled_dot_product_attention: dropout_p must be 0"),
        (lambda: ft.scaled_dot_product_attention(q, kv, kv), r"query has 4 heads and key/value 2: give enable_gqa=True"),
        (lambda: ft.scaled_dot_product_attention(q, q, q, torch.zeros(3, 3), is_causal=True), r"give attn_mask or is_causal, not both"),
        (lambda: ft.scaled_dot_product_attention(q, q, q, torch.zeros(3, 3, requires_grad=True)), r"attn_mask requires grad; its gradient is not supported"),
        (lambda: ft.scaled_dot_product_attention(q, q, q, torch.zeros(2, 3)), r"attn_mask of shape \(2, 3\) does not broadcast"),
        (lambda: ft.max_pool2d(x, 2, dilation=2), r"ferrodnn.torch.max_pool2d: dilation must be 1, got 2"),
        (lambda: ft.max_pool2d(x, 2, ceil_mode=True), r"ferrodnn.torch.max_pool2d: ceil_mode=True is not supported"),
        (lambda: ft.avg_pool2d(x, 2, divisor_override=3), r"ferrodnn.torch.avg_pool2d: divisor_override is not supported"),
        (lambda: ft.softmax(x, 4), r"ferrodnn.torch.softmax: dim must be in \[-4, 4\), got 4"),
    ]
    for fn, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            fn()
    # Meta tensors run the fake implementation (shapes only).
    y = ft.linear(torch.randn(2, 3, device="meta"), torch.randn(4, 3, device="meta"))
    assert y.device.type == "meta" and y.shape == (2, 4)


# -- modules ---------------------------------------------------------------------------------


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2, bias=False),
            nn.GroupNorm(4, 8),
            nn.SiLU(),
            nn.Conv2d(8, 8, 3, padding="same"),
            nn.Conv2d(8, 4, 1, padding_mode="reflect"),  # not supported: left as it is
        )
        self.head = nn.Sequential(nn.Linear(4 * 4 * 4, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 10), nn.RMSNorm(10))

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA GPU"))])
@pytest.mark.parametrize("channels_last", [False, True])
def test_swap_modules_same_outputs_and_grads(device, channels_last):
    torch.manual_seed(0)
    ref = ConvNet().to(device)
    ours = copy.deepcopy(ref)
    params = list(ours.parameters())
    skipped = []
    assert ft.swap_modules(ours, skipped) is ours
    assert skipped == [("features.7", "padding_mode='reflect' is not supported (only 'zeros')")]
    assert type(ours.features[0]) is ft.nn.Conv2d and type(ours.features[1]) is ft.nn.BatchNorm2d and type(ours.head[4]) is ft.nn.RMSNorm
    assert type(ours.features[7]) is nn.Conv2d
    assert list(ours.parameters()) == params, "the same parameter objects"
    assert ours.state_dict().keys() == ref.state_dict().keys()
    tol = dict(rtol=1e-4, atol=1e-4) if device == "cpu" else dict(rtol=2e-2, atol=2e-2)
    for step in range(2):
        x = torch.randn(4, 3, 8, 8, device=device)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        y, r = ours(x), ref(x)
        torch.testing.assert_close(y, r, **tol)
        y.square().sum().backward()
        r.square().sum().backward()
        for (name, p), (_, q) in zip(ours.named_parameters(), ref.named_parameters()):
            torch.testing.assert_close(p.grad, q.grad, **tol, msg=lambda m: f"step {step}, grad of {name}: {m}")
        for (name, p), (_, q) in zip(ours.named_buffers(), ref.named_buffers()):
            torch.testing.assert_close(p, q, **tol, msg=lambda m: f"step {step}, buffer {name}: {m}")
    ours.eval()
    ref.eval()
    torch.testing.assert_close(ours(x), ref(x), **tol)


def test_from_torch_copies_and_momentum_none():
    bn = nn.BatchNorm2d(3, momentum=None)
    ours = ft.nn.BatchNorm2d.from_torch(bn)
    assert type(ours) is ft.nn.BatchNorm2d and ours.weight is not bn.weight
    for _ in range(3):
        x = torch.randn(2, 3, 4, 4)
        torch.testing.assert_close(ours(x), bn(x))
    torch.testing.assert_close(ours.running_mean, bn.running_mean)
    torch.testing.assert_close(ours.running_var, bn.running_var)
    assert int(ours.num_batches_tracked) == 3
    lin = nn.Linear(4, 2)
    torch.testing.assert_close(ft.nn.Linear.from_torch(lin)(torch.ones(1, 4)), lin(torch.ones(1, 4)))
    with pytest.raises(TypeError, match="Conv2d.from_torch: expected a torch.nn.Conv2d, got Linear"):
        ft.nn.Conv2d.from_torch(lin)
    with pytest.raises(ValueError, match="Conv2d.from_torch: padding_mode='circular' is not supported"):
        ft.nn.Conv2d.from_torch(nn.Conv2d(2, 2, 3, padding_mode="circular"))


def test_module_fused_options():
    conv = ft.nn.Conv2d(4, 4, 3, padding=1)
    x = torch.randn(2, 4, 5, 5)
    torch.testing.assert_close(conv(x, activation="relu", residual=x), F.relu(F.conv2d(x, conv.weight, conv.bias, padding=1) + x))
    ln = ft.nn.LayerNorm(5)
    a, r = torch.randn(3, 5), torch.randn(3, 5)
    y, s = ln(a, residual=r)
    torch.testing.assert_close(s, a + r)
    torch.testing.assert_close(y, F.layer_norm(a + r, (5,), ln.weight, ln.bias))
    bn, ref = ft.nn.BatchNorm2d(4), nn.BatchNorm2d(4)
    torch.testing.assert_close(bn(x, activation="relu", residual=x), F.relu(ref(x) + x))
    torch.testing.assert_close(bn.running_var, ref.running_var)
    gn = ft.nn.GroupNorm(2, 4)
    torch.testing.assert_close(gn(x, activation="silu"), F.silu(F.group_norm(x, 2, gn.weight, gn.bias)))


# -- the host path: direct eager calls, kept workspaces, streams ---------------------------------

from ferrodnn.torch import _common  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402


class _SeenOps(TorchDispatchMode):
    """Records the name of every op dispatched while active."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def test_eager_calls_skip_the_dispatcher_and_modes_see_the_registered_ops():
    """A plain eager call runs the op's implementation directly (a dispatch mode sees none of
    the registered ops); under a dispatch mode the call goes through torch.ops.ferrodnn, forward
    and backward, with the same results."""
    x, w, b = rand(3, 5), rand(4, 5), rand(4)
    y = ft.linear(x, w, b, activation="silu")
    grads = torch.autograd.grad(y.square().sum(), (x, w, b))
    mode = _SeenOps()
    with mode:
        y2 = ft.linear(x, w, b, activation="silu")
        grads2 = torch.autograd.grad(y2.square().sum(), (x, w, b))
    assert "ferrodnn.linear" in mode.names and "ferrodnn.linear_backward" in mode.names, mode.names
    torch.testing.assert_close(y2, y)
    for a, e in zip(grads2, grads):
        torch.testing.assert_close(a, e)
    # The direct call: a mode that sees the ops is the only way the registered op would show.
    assert _common._plain_eager([x, w, None])
    with _SeenOps():
        assert not _common._plain_eager([x, w, None])
    assert not _common._plain_eager([torch.empty(2, device="meta")])


def test_batch_norm_running_statistics_in_place_and_through_the_registered_op():
    """The eager call writes the running statistics into the buffers themselves (their storage
    kept, their version bumped); through the registered op (under a dispatch mode) they are
    copied in. Both match PyTorch's."""
    x, r = rand(2, 3, 4, 4), rand(2, 3, 4, 4)
    rm, rv = torch.zeros(3, dtype=F64), torch.ones(3, dtype=F64)
    ptr, version = rm.data_ptr(), rm._version
    ref_m, ref_v = rm.clone(), rv.clone()
    y = ft.batch_norm(x, rm, rv, training=True, activation="relu", residual=r)
    ref = F.relu(F.batch_norm(x, ref_m, ref_v, training=True) + r)
    torch.testing.assert_close(y, ref)
    torch.testing.assert_close(rm, ref_m)
    torch.testing.assert_close(rv, ref_v)
    assert rm.data_ptr() == ptr and rm._version > version
    with _SeenOps() as mode:
        ft.batch_norm(x, rm, rv, training=True, activation="relu", residual=r)
    assert "ferrodnn.batch_norm" in mode.names
    F.batch_norm(x, ref_m, ref_v, training=True)
    torch.testing.assert_close(rm, ref_m)
    torch.testing.assert_close(rv, ref_v)


def test_kept_workspace_serves_graphs_of_other_sizes(monkeypatch):
    """Graphs of different workspace sizes share the kept workspace of their (device, stream):
    it grows to the largest asked for and is reused after; interleaved calls keep their
    results. Above WORKSPACE_KEEP_BYTES each call gets its own."""
    _common.clear_workspaces()
    ft.clear_graph_cache()
    # (float32: the CPU plans of these graphs take workspaces of different sizes.)
    x, w, wl = (rand(*s, grad=False).float() for s in ((2, 3, 6, 6), (4, 3, 3, 3), (5, 8)))
    xl = rand(3, 8, grad=False).float()
    tol = dict(atol=1e-4, rtol=1e-4)
    sizes = set()
    for i in range(3):
        for xx, ww, pad in ((x, w, 1), (x[:, :, :5, :5].contiguous(), w, 0)):
            torch.testing.assert_close(ft.conv2d(xx, ww, padding=pad), F.conv2d(xx, ww, padding=pad), **tol)
            torch.testing.assert_close(ft.linear(xl, wl), F.linear(xl, wl), **tol)
        kept = _common._WORKSPACES[("cpu", 0)]
        sizes.add((kept.data_ptr(), kept.numel()))
        if i == 0:
            first = kept
    assert len(sizes) == 1, f"the kept workspace was replaced after the first round: {sizes}"
    need = sorted(b.workspace_size for b in _common._GRAPHS.values())
    assert need[0] != need[-1] and first.numel() >= need[-1], need
    # A workspace request larger than what is kept: a new one, kept in its place.
    big = _common.workspace_of(first.numel() + 1, torch.device("cpu"), 0)
    assert big.numel() == first.numel() + 1 and _common._WORKSPACES[("cpu", 0)] is big
    assert _common.workspace_of(1, torch.device("cpu"), 0) is big
    monkeypatch.setattr(_common, "WORKSPACE_KEEP_BYTES", 1)
    _common.clear_workspaces()
    torch.testing.assert_close(ft.linear(xl, wl), F.linear(xl, wl), **tol)
    assert _common._WORKSPACES.get(("cpu", 0)) is None or _common._WORKSPACES[("cpu", 0)].numel() <= 1
    assert _common.workspace_of(1000, torch.device("cpu"), 0).numel() == 1000
    assert _common._WORKSPACES.get(("cpu", 0)) is None or _common._WORKSPACES[("cpu", 0)].numel() <= 1


@pytest.mark.skipif(not CUDA, reason="no CUDA GPU")
def test_cuda_stream_changes_are_honoured():
    """A call on a side stream runs there (the handle's stream follows PyTorch's current one),
    with a workspace of its own; back on the default stream the handle follows again."""
    x, w = rand(64, 256, grad=False).float().cuda(), rand(128, 256, grad=False).float().cuda()
    ref = F.linear(x, w)
    y0 = ft.linear(x, w)
    default = torch.cuda.current_stream().cuda_stream
    assert _common._HANDLES["cuda_stream"] == default
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y1 = ft.linear(x, w)
        assert _common._HANDLES["cuda_stream"] == side.cuda_stream
        c = ft.conv2d(x.view(1, 1, 64, 256), w[:1, :9].reshape(1, 1, 3, 3), padding=1)
    side.synchronize()
    assert ("cuda", side.cuda_stream) in _common._WORKSPACES
    y2 = ft.linear(x, w)
    assert _common._HANDLES["cuda_stream"] == default
    for y in (y0, y1, y2):
        torch.testing.assert_close(y, ref, atol=5e-2, rtol=5e-3)
    torch.testing.assert_close(c, F.conv2d(x.view(1, 1, 64, 256), w[:1, :9].reshape(1, 1, 3, 3), padding=1), atol=5e-2, rtol=5e-3)
