"""Every op family through the Python API on numpy arrays (the CPU engine), against numpy
references written here: seeded random inputs, odd sizes, non-contiguous arrays."""

import math

import numpy as np
import pytest

import ferrodnn as cudnn

F32 = cudnn.data_type.FLOAT


def rng(seed=0):
    return np.random.default_rng(seed)


def new_graph(io=F32):
    return cudnn.pygraph(io_data_type=io, intermediate_data_type=F32, compute_data_type=F32, handle=cudnn.create_cpu_handle())


def run(g, pack, strict=False):
    """The frontend's build sequence, then execute (with `strict`, every array must have its
    tensor's dims and strides)."""
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    workspace = np.empty(g.get_workspace_size(), dtype=np.uint8)
    g.execute(pack, workspace, strict=strict)


def close(actual, expected, tol=1e-5):
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol)


# -- convolution ------------------------------------------------------------------------------

def conv_ref(x, w, pre, post, stride, dil):
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    groups = c // cg
    xp = np.pad(x, ((0, 0), (0, 0), (pre[0], post[0]), (pre[1], post[1])))
    oh = (h + pre[0] + post[0] - dil[0] * (r - 1) - 1) // stride[0] + 1
    ow = (wd + pre[1] + post[1] - dil[1] * (s - 1) - 1) // stride[1] + 1
    y = np.zeros((n, k, oh, ow))
    kg = k // groups
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride[0] : i * stride[0] + dil[0] * (r - 1) + 1 : dil[0], j * stride[1] : j * stride[1] + dil[1] * (s - 1) + 1 : dil[1]]
            for gi in range(groups):
                y[:, gi * kg : (gi + 1) * kg, i, j] = np.einsum("nchw,kchw->nk", patch[:, gi * cg : (gi + 1) * cg], w[gi * kg : (gi + 1) * kg])
    return y


def test_a_cpu_plan_runs_on_the_given_workspace_unless_it_overlaps_a_buffer():
    # An NCHW 3x3 convolution (whose plan packs its image into the workspace): a workspace of
    # the plan's size is written (the plan runs on it); one that overlaps the output is not used
    # (the plan takes its own) and the result is the same.
    r = rng(4)
    x = r.standard_normal((2, 5, 9, 8)).astype(np.float32)
    w = r.standard_normal((16, 5, 3, 3)).astype(np.float32)
    g = new_graph()
    X, W = g.tensor_like(x), g.tensor_like(w)
    Y = g.conv_fprop(image=X, weight=W, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    Y.set_output(True).set_data_type(F32)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    want = conv_ref(x, w, (1, 1), (1, 1), (1, 1), (1, 1))
    need = g.get_workspace_size()
    assert need > 0
    y = np.empty((2, 16, 9, 8), np.float32)
    ws = np.full(need, 0xAB, np.uint8)
    g.execute({X: x, W: w, Y: y}, ws)
    close(y, want, 1e-4)
    assert (ws != 0xAB).any()
    # The output's own bytes as the workspace: refused as a workspace, not clobbered.
    big = np.zeros(max(need, y.nbytes) + 64, np.uint8)
    y2 = big[: y.nbytes].view(np.float32).reshape(y.shape)
    g.execute({X: x, W: w, Y: y2}, big[:need])
    close(y2, want, 1e-4)


def test_conv_fprop_bias_relu_channels_last():
    r = rng(1)
    # Channels-last image and filter: logical NCHW views of NHWC memory (non-contiguous).
    x = r.standard_normal((2, 7, 6, 3)).astype(np.float32).transpose(0, 3, 1, 2)
    w = r.standard_normal((4, 3, 2, 3)).astype(np.float32).transpose(0, 3, 1, 2)
    b = r.standard_normal((1, 4, 1, 1)).astype(np.float32)
    assert not x.flags["C_CONTIGUOUS"]
    g = new_graph()
    X, W, B = g.tensor_like(x), g.tensor_like(w), g.tensor_like(b)
    conv = g.conv_fprop(image=X, weight=W, pre_padding=[1, 0], post_padding=[1, 1], stride=[2, 1], dilation=[1, 2])
    Y = g.relu(input=g.bias(input=conv, bias=B))
    Y.set_output(True)
    g.validate()
    ref = np.maximum(conv_ref(x.astype(np.float64), w.astype(np.float64), [1, 0], [1, 1], [2, 1], [1, 2]) + b, 0)
    assert Y.get_dim() == list(ref.shape)
    # The output follows the image's layout (channels-last).
    y = np.zeros(ref.shape, np.float32).transpose(0, 2, 3, 1).copy().transpose(0, 3, 1, 2)
    run(g, {X: x, W: w, B: b, Y: y})
    close(y, ref, 1e-4)


def test_conv_grouped_padding_kwarg():
    r = rng(2)
    x = r.standard_normal((1, 4, 5, 5)).astype(np.float32)
    w = r.standard_normal((6, 2, 3, 3)).astype(np.float32)
    g = new_graph()
    X = g.tensor(name="X", dim=x.shape, stride=[s // 4 for s in x.strides], data_type=F32)
    W = g.tensor(name="W", dim=w.shape, stride=[s // 4 for s in w.strides], data_type=F32)
    Y = g.conv_fprop(image=X, weight=W, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    Y.set_output(True)
    y = np.zeros((1, 6, 5, 5), np.float32)
    run(g, {X: x, W: w, Y: y})
    close(y, conv_ref(x, w, [1, 1], [1, 1], [1, 1], [1, 1]), 1e-4)


def test_conv_dgrad_wgrad():
    r = rng(3)
    x = r.standard_normal((2, 3, 6, 5))
    w = r.standard_normal((4, 3, 3, 3))
    pre, post, st, dil = [1, 1], [1, 1], [2, 1], [1, 1]
    y = conv_ref(x, w, pre, post, st, dil)
    dy = r.standard_normal(y.shape)
    # References: the adjoints of the forward convolution.
    xp_shape = (2, 3, 6 + 2, 5 + 2)
    dxp = np.zeros(xp_shape)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    dw = np.zeros_like(w)
    for i in range(y.shape[2]):
        for j in range(y.shape[3]):
            for a in range(3):
                for b in range(3):
                    hi, wj = i * st[0] + a, j * st[1] + b
                    dxp[:, :, hi, wj] += np.einsum("nk,kc->nc", dy[:, :, i, j], w[:, :, a, b])
                    dw[:, :, a, b] += np.einsum("nk,nc->kc", dy[:, :, i, j], xp[:, :, hi, wj])
    dx = dxp[:, :, 1:-1, 1:-1]

    g = cudnn.pygraph(io_data_type=cudnn.data_type.DOUBLE, compute_data_type=cudnn.data_type.DOUBLE)
    DY, W = g.tensor_like(dy), g.tensor_like(w)
    DX = g.conv_dgrad(loss=DY, filter=W, padding=pre, stride=st, dilation=dil)
    DX.set_output(True).set_dim(list(x.shape))
    out = np.zeros(x.shape)
    run(g, {DY: dy, W: w, DX: out})
    close(out, dx, 1e-10)

    g = cudnn.pygraph(io_data_type=cudnn.data_type.DOUBLE, compute_data_type=cudnn.data_type.DOUBLE)
    X, DY = g.tensor_like(x), g.tensor_like(dy)
    DW = g.conv_wgrad(image=X, loss=DY, padding=pre, stride=st, dilation=dil)
    DW.set_output(True).set_dim(list(w.shape))
    out = np.zeros(w.shape)
    run(g, {X: x, DY: dy, DW: out})
    close(out, dw, 1e-10)


def nhwc(a):
    """A channels-last copy of an NCHW array, as a logical NCHW view (PyTorch's channels_last)."""
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


def conv_adjoints(x, w, dy, pad, st):
    """dx and dw of conv_ref(x, w, pad, pad, st, [1, 1]) for the output gradient dy."""
    r, s = w.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    dxp, dw = np.zeros_like(xp), np.zeros_like(w)
    for i in range(dy.shape[2]):
        for j in range(dy.shape[3]):
            for a in range(r):
                for b in range(s):
                    hi, wj = i * st[0] + a, j * st[1] + b
                    dxp[:, :, hi, wj] += np.einsum("nk,kc->nc", dy[:, :, i, j], w[:, :, a, b])
                    dw[:, :, a, b] += np.einsum("nk,nc->kc", dy[:, :, i, j], xp[:, :, hi, wj])
    return dxp[:, :, pad[0] : pad[0] + x.shape[2], pad[1] : pad[1] + x.shape[3]], dw


# The cudnn frontend's convolution samples (python/tests/test_gpu_conv.py runs them on the GPU
# against PyTorch): the same graphs on channels-last host arrays.

def test_conv_dgrad_drelu_channels_last():
    """dgrad's output gets its dims by set_dim, then drelu takes it (the frontend's "Dgrad
    Drelu Graph"): drelu's output follows dy's channels-last layout, like dgrad's."""
    r = rng(40)
    x, w = r.standard_normal((2, 3, 7, 6)), r.standard_normal((4, 3, 3, 3))
    pad, st = [1, 1], [2, 2]
    dy = r.standard_normal(conv_ref(x, w, pad, pad, st, [1, 1]).shape)
    dx_ref = conv_adjoints(x, w, dy, pad, st)[0] * (x > 0)
    x, w, dy = nhwc(x), nhwc(w), nhwc(dy)
    D = cudnn.data_type.DOUBLE
    g = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D)
    DY, W, X = g.tensor_like(dy), g.tensor_like(w), g.tensor_like(x)
    dgrad = g.conv_dgrad(loss=DY, filter=W, padding=pad, stride=st, dilation=[1, 1])
    dgrad.set_dim(list(x.shape))
    DX = g.relu_backward(loss=dgrad, input=X)
    DX.set_output(True)
    g.validate()
    assert DX.get_stride() == [s // 8 for s in x.strides]
    out = nhwc(np.full(x.shape, np.nan))
    run(g, {DY: dy, W: w, X: x, DX: out}, strict=True)
    close(out, dx_ref, 1e-10)


def test_scale_bias_relu_conv_genstats():
    """The frontend's "SBRCS": y = conv(relu(x * scale + bias), w) with the per-channel sum and
    sum of squares of y. The zero padding pads the activation, not x."""
    r = rng(41)
    x, w = r.standard_normal((2, 3, 5, 6)), r.standard_normal((4, 3, 3, 3))
    s, b = 1 + 0.5 * r.standard_normal((1, 3, 1, 1)), r.standard_normal((1, 3, 1, 1))
    y_ref = conv_ref(np.maximum(x * s + b, 0), w, [1, 1], [1, 1], [1, 1], [1, 1])
    x, w = nhwc(x), nhwc(w)
    D = cudnn.data_type.DOUBLE
    g = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D)
    X, W, S, B = (g.tensor_like(a) for a in (x, w, s, b))
    act = g.relu(input=g.bias(input=g.scale(input=X, scale=S), bias=B))
    Y = g.conv_fprop(image=act, weight=W, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    Y.set_output(True)
    SUM, SQ = g.genstats(input=Y)
    SUM.set_output(True)
    SQ.set_output(True)
    y = nhwc(np.full(y_ref.shape, np.nan))
    s1, s2 = np.full((1, 4, 1, 1), np.nan), np.full((1, 4, 1, 1), np.nan)
    run(g, {X: x, W: w, S: s, B: b, Y: y, SUM: s1, SQ: s2}, strict=True)
    close(y, y_ref, 1e-10)
    close(s1, y_ref.sum((0, 2, 3), keepdims=True), 1e-9)
    close(s2, (y_ref * y_ref).sum((0, 2, 3), keepdims=True), 1e-9)


def test_scale_bias_relu_wgrad_channels_last():
    """The frontend's scale-bias-relu-wgrad: dw of conv(relu(x * scale + bias)), strided; dw
    follows the image's channels-last layout."""
    r = rng(42)
    x = r.standard_normal((2, 3, 7, 6))
    s, b = 1 + 0.5 * r.standard_normal((1, 3, 1, 1)), r.standard_normal((1, 3, 1, 1))
    act = np.maximum(x * s + b, 0)
    pad, st = [1, 1], [2, 2]
    dy = r.standard_normal(conv_ref(act, np.zeros((4, 3, 3, 3)), pad, pad, st, [1, 1]).shape)
    dw_ref = conv_adjoints(act, np.zeros((4, 3, 3, 3)), dy, pad, st)[1]
    x, dy = nhwc(x), nhwc(dy)
    D = cudnn.data_type.DOUBLE
    g = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D)
    X, DY, S, B = (g.tensor_like(a) for a in (x, dy, s, b))
    image = g.relu(input=g.bias(input=g.scale(input=X, scale=S), bias=B))
    DW = g.conv_wgrad(image=image, loss=DY, padding=pad, stride=st, dilation=[1, 1])
    DW.set_output(True).set_dim([4, 3, 3, 3])
    out = nhwc(np.full((4, 3, 3, 3), np.nan))
    run(g, {X: x, DY: dy, S: s, B: b, DW: out}, strict=True)
    close(out, dw_ref, 1e-10)


# -- matmul -----------------------------------------------------------------------------------

def test_matmul_bias_relu_batched_transposed():
    r = rng(4)
    a = r.standard_normal((3, 5, 7)).astype(np.float32)
    b = r.standard_normal((9, 7)).astype(np.float32).T  # [7, 9], column-major view, broadcast batch
    bias = r.standard_normal((1, 1, 9)).astype(np.float32)
    g = new_graph()
    A, B, BIAS = g.tensor_like(a), g.tensor_like(b), g.tensor_like(bias)
    Y = g.relu(input=g.bias(input=g.matmul(A=A, B=B), bias=BIAS), name="relu")
    Y.set_output(True)
    y = np.zeros((3, 5, 9), np.float32)
    run(g, {A: a, B: b, BIAS: bias, Y: y})
    close(y, np.maximum(a.astype(np.float64) @ b + bias, 0), 1e-4)


def test_matmul_int8_to_int32_and_float16():
    r = rng(5)
    a = r.integers(-8, 8, (4, 6)).astype(np.int8)
    b = r.integers(-8, 8, (6, 3)).astype(np.int8)
    g = cudnn.pygraph()
    A, B = g.tensor_like(a), g.tensor_like(b)
    C = g.matmul(A=A, B=B)
    C.set_output(True).set_data_type(cudnn.data_type.INT32)
    c = np.zeros((4, 3), np.int32)
    run(g, {A: a, B: b, C: c})
    np.testing.assert_array_equal(c, a.astype(np.int32) @ b.astype(np.int32))

    a16 = r.standard_normal((4, 6)).astype(np.float16)
    b16 = r.standard_normal((6, 3)).astype(np.float16)
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF)
    A, B = g.tensor_like(a16), g.tensor_like(b16)
    C = g.matmul(A=A, B=B)
    C.set_output(True)
    c16 = np.zeros((4, 3), np.float16)
    run(g, {A: a16, B: b16, C: c16})
    close(c16.astype(np.float64), (a16.astype(np.float64) @ b16).astype(np.float16), 2e-3)


# -- pointwise ------------------------------------------------------------------------------

_erf = np.vectorize(math.erf)


def _sig(x):
    return 1 / (1 + np.exp(-x))


UNARY = {
    "abs": np.abs,
    "neg": np.negative,
    "exp": np.exp,
    "sqrt": lambda x: np.sqrt(np.abs(x)),
    "log": lambda x: np.log(np.abs(x)),
    "rsqrt": lambda x: 1 / np.sqrt(np.abs(x)),
    "reciprocal": lambda x: 1 / x,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "tanh": np.tanh,
    "sigmoid": _sig,
    "erf": _erf,
    "floor": np.floor,
    "ceil": np.ceil,
    "identity": lambda x: x,
    "gelu": lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))),
    "gelu_approx_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "elu": lambda x: np.where(x > 0, x, np.exp(x) - 1),
    "softplus": lambda x: np.log1p(np.exp(x)),
    "swish": lambda x: x * _sig(x),
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op):
    r = rng(hash(op) % 1000)
    x = r.standard_normal((3, 5, 7)) * 2
    if op in ("sqrt", "log", "rsqrt"):
        x = np.abs(x) + 0.1
    g = cudnn.pygraph(io_data_type=cudnn.data_type.DOUBLE, compute_data_type=cudnn.data_type.DOUBLE)
    X = g.tensor_like(x)
    Y = getattr(g, op)(input=X)
    Y.set_output(True)
    y = np.zeros_like(x)
    run(g, {X: x, Y: y})
    close(y, UNARY[op](x), 1e-9)


BINARY = {
    "add": (("a", "b"), np.add),
    "sub": (("a", "b"), np.subtract),
    "mul": (("a", "b"), np.multiply),
    "div": (("a", "b"), np.divide),
    "add_square": (("a", "b"), lambda a, b: a + b * b),
    "max": (("input0", "input1"), np.maximum),
    "min": (("input0", "input1"), np.minimum),
    "pow": (("input0", "input1"), lambda a, b: np.abs(a) ** b),
    "mod": (("input0", "input1"), np.fmod),
    "bias": (("input", "bias"), np.add),
    "scale": (("input", "scale"), np.multiply),
}


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_broadcast(op):
    (na, nb), ref = BINARY[op]
    r = rng(7)
    a = r.standard_normal((4, 1, 6)).astype(np.float32) + 0.5
    b = r.standard_normal((3, 1)).astype(np.float32) + 2.0
    if op == "pow":
        a = np.abs(a) + 0.1
    g = new_graph()
    A, B = g.tensor_like(a), g.tensor_like(b)
    Y = getattr(g, op)(**{na: A, nb: B})
    Y.set_output(True)
    assert Y.get_dim() == [4, 3, 6]
    y = np.zeros((4, 3, 6), np.float32)
    run(g, {A: a, B: b, Y: y})
    close(y, ref(a.astype(np.float64), b.astype(np.float64)), 1e-5)


@pytest.mark.parametrize("op,ref", [("cmp_eq", np.equal), ("cmp_neq", np.not_equal), ("cmp_gt", np.greater), ("cmp_ge", np.greater_equal), ("cmp_lt", np.less), ("cmp_le", np.less_equal)])
def test_compare_to_bool(op, ref):
    r = rng(8)
    a = r.integers(0, 3, (5, 4)).astype(np.float32)
    b = r.integers(0, 3, (5, 4)).astype(np.float32)
    g = new_graph()
    A, B = g.tensor_like(a), g.tensor_like(b)
    Y = getattr(g, op)(input=A, comparison=B)
    Y.set_output(True).set_data_type(cudnn.data_type.BOOLEAN)
    y = np.zeros((5, 4), np.bool_)
    run(g, {A: a, B: b, Y: y})
    np.testing.assert_array_equal(y, ref(a, b))


def test_logic_and_binary_select():
    r = rng(9)
    p = r.integers(0, 2, (6,)).astype(np.bool_)
    q = r.integers(0, 2, (6,)).astype(np.bool_)
    a = r.standard_normal(6).astype(np.float32)
    b = r.standard_normal(6).astype(np.float32)
    g = new_graph()
    P, Q, A, B = g.tensor_like(p), g.tensor_like(q), g.tensor_like(a), g.tensor_like(b)
    AND = g.logical_and(a=P, b=Q)
    OR = g.logical_or(a=P, b=Q)
    NOT = g.logical_not(input=P)
    SEL = g.binary_select(input0=A, input1=B, mask=AND)
    for t in (AND, OR, NOT):
        t.set_output(True).set_data_type(cudnn.data_type.BOOLEAN)
    SEL.set_output(True)
    out = {t: np.zeros(6, np.bool_) for t in (AND, OR, NOT)}
    sel = np.zeros(6, np.float32)
    run(g, {P: p, Q: q, A: a, B: b, SEL: sel, **out})
    np.testing.assert_array_equal(out[AND], p & q)
    np.testing.assert_array_equal(out[OR], p | q)
    np.testing.assert_array_equal(out[NOT], ~p)
    np.testing.assert_array_equal(sel, np.where(p & q, a, b))


def test_relu_clips_and_leaky():
    x = np.linspace(-3, 3, 13)
    g = cudnn.pygraph(io_data_type=cudnn.data_type.DOUBLE)
    X = g.tensor_like(x)
    Y1 = g.relu(input=X, lower_clip=-1.0, upper_clip=2.0, negative_slope=0.5)
    Y2 = g.leaky_relu(input=X, negative_slope=0.1)
    Y1.set_output(True)
    Y2.set_output(True)
    y1, y2 = np.zeros_like(x), np.zeros_like(x)
    run(g, {X: x, Y1: y1, Y2: y2})
    close(y1, np.minimum(np.where(x < -1, -1 + 0.5 * (x + 1), x), 2.0), 1e-12)
    close(y2, np.where(x < 0, 0.1 * x, x), 1e-12)


BACKWARD = {
    "relu_backward": lambda x: (x > 0).astype(float),
    "tanh_backward": lambda x: 1 - np.tanh(x) ** 2,
    "sigmoid_backward": lambda x: _sig(x) * (1 - _sig(x)),
    "gelu_backward": lambda x: 0.5 * (1 + _erf(x / math.sqrt(2))) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi),
    "elu_backward": lambda x: np.where(x > 0, 1.0, np.exp(x)),
    "softplus_backward": _sig,
    "swish_backward": lambda x: _sig(x) + x * _sig(x) * (1 - _sig(x)),
}


@pytest.mark.parametrize("op", sorted(BACKWARD))
def test_activation_backward(op):
    r = rng(10)
    x = r.standard_normal((4, 9)) + 0.01
    dy = r.standard_normal((4, 9))
    g = cudnn.pygraph(io_data_type=cudnn.data_type.DOUBLE, compute_data_type=cudnn.data_type.DOUBLE)
    DY, X = g.tensor_like(dy), g.tensor_like(x)
    DX = getattr(g, op)(loss=DY, input=X)
    DX.set_output(True)
    dx = np.zeros_like(x)
    run(g, {DY: dy, X: x, DX: dx})
    close(dx, dy * BACKWARD[op](x), 1e-9)


def test_gen_index():
    x = np.zeros((3, 4), np.float32)
    g = new_graph()
    X = g.tensor_like(x)
    Y = g.gen_index(input=X, axis=1)
    Y.set_output(True).set_data_type(cudnn.data_type.INT32)
    y = np.zeros((3, 4), np.int32)
    run(g, {X: x, Y: y})
    np.testing.assert_array_equal(y, np.broadcast_to(np.arange(4), (3, 4)))


# -- reduction --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "mode,ref",
    [
        ("ADD", lambda x, ax: x.sum(ax, keepdims=True)),
        ("MAX", lambda x, ax: x.max(ax, keepdims=True)),
        ("MIN", lambda x, ax: x.min(ax, keepdims=True)),
        ("AVG", lambda x, ax: x.mean(ax, keepdims=True)),
        ("MUL", lambda x, ax: x.prod(ax, keepdims=True)),
        ("AMAX", lambda x, ax: np.abs(x).max(ax, keepdims=True)),
        ("NORM1", lambda x, ax: np.abs(x).sum(ax, keepdims=True)),
        ("NORM2", lambda x, ax: np.sqrt((x * x).sum(ax, keepdims=True))),
    ],
)
def test_reduction_axes_from_output_dims(mode, ref):
    r = rng(11)
    x = r.standard_normal((3, 5, 4)) * 0.8
    g = cudnn.pygraph(io_data_type=cudnn.data_type.DOUBLE, compute_data_type=cudnn.data_type.DOUBLE)
    X = g.tensor_like(x)
    Y = g.reduction(input=X, mode=getattr(cudnn.reduction_mode, mode))
    # As in the frontend: the reduced axes are the ones the output's dims set to 1.
    Y.set_output(True).set_dim([3, 1, 1])
    y = np.zeros((3, 1, 1))
    run(g, {X: x, Y: y})
    close(y, ref(x, (1, 2)), 1e-10)


# -- normalizations ---------------------------------------------------------------------------

def ln_ref(x, s, b, eps, axes):
    mean = x.mean(axes, keepdims=True)
    var = x.var(axes, keepdims=True)
    inv = 1 / np.sqrt(var + eps)
    return (x - mean) * inv * s + b, mean, inv


def norm_bwd_ref(dy, x, s, mean, inv, axes):
    n = np.prod([x.shape[a] for a in axes])
    xhat = (x - mean) * inv
    red = tuple(a for a in range(x.ndim) if s.shape[a] == 1)
    dscale = (dy * xhat).sum(red, keepdims=True)
    dbias = dy.sum(red, keepdims=True)
    g = dy * s
    dx = inv / n * (n * g - g.sum(axes, keepdims=True) - xhat * (g * xhat).sum(axes, keepdims=True))
    return dx, dscale, dbias


def test_layernorm_training_and_backward_epsilon_tensor():
    r = rng(12)
    x = r.standard_normal((5, 3, 4)) * 2 + 1
    s = r.standard_normal((1, 3, 4))
    b = r.standard_normal((1, 3, 4))
    eps = 1e-3
    D = cudnn.data_type.DOUBLE
    g = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D)
    X, S, B = g.tensor_like(x), g.tensor_like(s), g.tensor_like(b)
    E = g.tensor(name="epsilon", dim=[1, 1, 1], stride=[1, 1, 1], is_pass_by_value=True, data_type=cudnn.data_type.FLOAT)
    Y, M, V = g.layernorm(name="LN", norm_forward_phase=cudnn.norm_forward_phase.TRAINING, input=X, scale=S, bias=B, epsilon=E)
    for t in (Y, M, V):
        t.set_output(True)
    assert M.get_dim() == [5, 1, 1]
    y, m, v = np.zeros_like(x), np.zeros((5, 1, 1)), np.zeros((5, 1, 1))
    eps_cpu = np.full((1, 1, 1), eps, np.float32)
    run(g, {X: x, S: s, B: b, E: eps_cpu, Y: y, M: m, V: v})
    ry, rm, rv = ln_ref(x, s, b, float(np.float32(eps)), (1, 2))
    close(y, ry, 1e-10)
    close(m, rm, 1e-12)
    close(v, rv, 1e-10)

    # The epsilon value comes from the variant pack: another value, another result.
    g.execute({X: x, S: s, B: b, E: 0.5, Y: y, M: m, V: v}, None)
    close(y, ln_ref(x, s, b, 0.5, (1, 2))[0], 1e-10)

    dy = r.standard_normal(x.shape)
    bg = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D)
    DY = bg.tensor_like(dy)
    Xb, Sb, Mb, Vb = bg.tensor_like(X, name="X"), bg.tensor_like(S), bg.tensor_like(M), bg.tensor_like(V)
    DX, DS, DB = bg.layernorm_backward(grad=DY, input=Xb, scale=Sb, mean=Mb, inv_variance=Vb)
    for t in (DX, DS, DB):
        t.set_output(True)
    dx, ds, db = np.zeros_like(x), np.zeros_like(s), np.zeros_like(b)
    run(bg, {DY: dy, Xb: x, Sb: s, Mb: rm, Vb: rv, DX: dx, DS: ds, DB: db})
    rdx, rds, rdb = norm_bwd_ref(dy, x, s, rm, rv, (1, 2))
    close(dx, rdx, 1e-9)
    close(ds, rds, 1e-9)
    close(db, rdb, 1e-9)


def test_layernorm_inference_returns_none_stats():
    x = rng(13).standard_normal((2, 6)).astype(np.float32)
    s = np.ones((1, 6), np.float32)
    b = np.zeros((1, 6), np.float32)
    g = new_graph()
    X, S, B = g.tensor_like(x), g.tensor_like(s), g.tensor_like(b)
    Y, M, V = g.layernorm(norm_forward_phase=cudnn.norm_forward_phase.INFERENCE, input=X, scale=S, bias=B, epsilon=1e-5)
    assert M is None and V is None
    Y.set_output(True)
    y = np.zeros_like(x)
    run(g, {X: x, S: s, B: b, Y: y})
    close(y, ln_ref(x.astype(np.float64), s, b, 1e-5, (1,))[0], 1e-5)


def test_rmsnorm_training_and_backward():
    r = rng(14)
    x = r.standard_normal((4, 7))
    s = r.standard_normal((1, 7))
    D = cudnn.data_type.DOUBLE
    g = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D)
    X, S = g.tensor_like(x), g.tensor_like(s)
    Y, V = g.rmsnorm(norm_forward_phase=cudnn.norm_forward_phase.TRAINING, input=X, scale=S, epsilon=1e-5)
    Y.set_output(True)
    V.set_output(True)
    y, v = np.zeros_like(x), np.zeros((4, 1))
    run(g, {X: x, S: s, Y: y, V: v})
    inv = 1 / np.sqrt((x * x).mean(1, keepdims=True) + 1e-5)
    close(v, inv, 1e-10)
    close(y, x * inv * s, 1e-10)

    dy = r.standard_normal(x.shape)
    bg = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D)
    DY, Xb, Sb, Vb = bg.tensor_like(dy), bg.tensor_like(x), bg.tensor_like(s), bg.tensor_like(v)
    DX, DS, DB = bg.rmsnorm_backward(grad=DY, input=Xb, scale=Sb, inv_variance=Vb, has_dbias=False)
    assert DB is None
    DX.set_output(True)
    DS.set_output(True)
    dx, ds = np.zeros_like(x), np.zeros_like(s)
    run(bg, {DY: dy, Xb: x, Sb: s, Vb: v, DX: dx, DS: ds})
    n = x.shape[1]
    xhat = x * inv
    gsc = dy * s
    close(ds, (dy * xhat).sum(0, keepdims=True), 1e-9)
    close(dx, inv * (gsc - xhat * (gsc * xhat).sum(1, keepdims=True) / n), 1e-9)


def test_batchnorm_training_running_stats_in_place_and_backward():
    r = rng(15)
    n, c, h, w = 3, 4, 5, 3
    x = (r.standard_normal((n, h, w, c)) * 2 + 0.5).transpose(0, 3, 1, 2)  # channels-last
    s = r.standard_normal((1, c, 1, 1))
    b = r.standard_normal((1, c, 1, 1))
    running_mean = r.standard_normal((1, c, 1, 1))
    running_var = np.abs(r.standard_normal((1, c, 1, 1))) + 0.5
    rm0, rv0 = running_mean.copy(), running_var.copy()
    D = cudnn.data_type.DOUBLE
    g = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D)
    X, S, B = g.tensor_like(x), g.tensor_like(s), g.tensor_like(b)
    RM, RV = g.tensor_like(running_mean), g.tensor_like(running_var)
    EPS = g.tensor(name="epsilon", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], is_pass_by_value=True, data_type=F32)
    MOM = g.tensor(name="momentum", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], is_pass_by_value=True, data_type=F32)
    Y, M, V, ORM, ORV = g.batchnorm(name="BN", input=X, scale=S, bias=B, in_running_mean=RM, in_running_var=RV, epsilon=EPS, momentum=MOM)
    for t in (Y, M, V, ORM, ORV):
        t.set_output(True)
    y = np.zeros_like(x)
    m, v = np.zeros((1, c, 1, 1)), np.zeros((1, c, 1, 1))
    # Running statistics updated in place: the same arrays as input and output.
    run(g, {X: x, S: s, B: b, RM: running_mean, RV: running_var, EPS: np.float32(1e-3).reshape(1, 1, 1, 1), MOM: 0.25,
            Y: y, M: m, V: v, ORM: running_mean, ORV: running_var})
    eps = float(np.float32(1e-3))
    ry, rmean, rinv = ln_ref(x, s, b, eps, (0, 2, 3))
    close(y, ry, 1e-10)
    close(m, rmean, 1e-12)
    close(v, rinv, 1e-10)
    cnt = n * h * w
    close(running_mean, 0.75 * rm0 + 0.25 * rmean, 1e-10)
    close(running_var, 0.75 * rv0 + 0.25 * x.var((0, 2, 3), keepdims=True) * cnt / (cnt - 1), 1e-10)

    dy = r.standard_normal(x.shape)
    bg = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D)
    DY, Xb, Sb, Mb, Vb = bg.tensor_like(dy), bg.tensor_like(x), bg.tensor_like(s), bg.tensor_like(m), bg.tensor_like(v)
    DX, DS, DB = bg.batchnorm_backward(grad=DY, input=Xb, scale=Sb, mean=Mb, inv_variance=Vb)
    for t in (DX, DS, DB):
        t.set_output(True)
    dx, ds, db = np.zeros_like(x), np.zeros_like(s), np.zeros_like(b)
    run(bg, {DY: dy, Xb: x, Sb: s, Mb: m, Vb: v, DX: dx, DS: ds, DB: db})
    rdx, rds, rdb = norm_bwd_ref(dy, x, s, rmean, rinv, (0, 2, 3))
    close(dx, rdx, 1e-9)
    close(ds, rds, 1e-9)
    close(db, rdb, 1e-9)


def test_batchnorm_inference_instancenorm_genstats():
    r = rng(16)
    x = r.standard_normal((2, 3, 4, 5))
    s, b = r.standard_normal((1, 3, 1, 1)), r.standard_normal((1, 3, 1, 1))
    mean, inv = r.standard_normal((1, 3, 1, 1)), np.abs(r.standard_normal((1, 3, 1, 1))) + 0.1
    D = cudnn.data_type.DOUBLE
    g = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D)
    X, S, B, M, V = (g.tensor_like(a) for a in (x, s, b, mean, inv))
    Y = g.batchnorm_inference(input=X, mean=M, inv_variance=V, scale=S, bias=B)
    Yi, Mi, Vi = g.instancenorm(norm_forward_phase=cudnn.norm_forward_phase.TRAINING, input=X, scale=S, bias=B, epsilon=1e-4)
    SUM, SQ = g.genstats(input=X)
    for t in (Y, Yi, Mi, Vi, SUM, SQ):
        t.set_output(True)
    y, yi = np.zeros_like(x), np.zeros_like(x)
    mi, vi = np.zeros((2, 3, 1, 1)), np.zeros((2, 3, 1, 1))
    s1, s2 = np.zeros((1, 3, 1, 1)), np.zeros((1, 3, 1, 1))
    run(g, {X: x, S: s, B: b, M: mean, V: inv, Y: y, Yi: yi, Mi: mi, Vi: vi, SUM: s1, SQ: s2})
    close(y, (x - mean) * inv * s + b, 1e-10)
    ry, rm, rv = ln_ref(x, s, b, 1e-4, (2, 3))
    close(yi, ry, 1e-10)
    close(mi, rm, 1e-12)
    close(vi, rv, 1e-10)
    close(s1, x.sum((0, 2, 3), keepdims=True), 1e-10)
    close(s2, (x * x).sum((0, 2, 3), keepdims=True), 1e-10)


def group_norm_ref(x, s, b, groups, eps):
    """numpy group normalization over [N, C, ...]: y, and mean and inv_variance [N, G, 1, ...]."""
    n, c = x.shape[:2]
    xg = x.reshape(n, groups, -1)
    mean = xg.mean(2, keepdims=True)
    inv = 1 / np.sqrt(xg.var(2, keepdims=True) + eps)
    y = ((xg - mean) * inv).reshape(x.shape) * s + b
    stats = (n, groups) + (1,) * (x.ndim - 2)
    return y, mean.reshape(stats), inv.reshape(stats)


def group_norm_bwd_ref(dy, x, s, mean, inv, groups):
    """numpy gradient of group normalization: dx, dscale, dbias."""
    n, c = x.shape[:2]
    red = tuple(a for a in range(x.ndim) if a != 1)
    xg = x.reshape(n, groups, -1)
    xhat = (xg - mean.reshape(n, groups, 1)) * inv.reshape(n, groups, 1)
    dscale = (dy * xhat.reshape(x.shape)).sum(red, keepdims=True)
    dbias = dy.sum(red, keepdims=True)
    g = (dy * s).reshape(n, groups, -1)
    m = g.shape[2]
    dx = inv.reshape(n, groups, 1) / m * (m * g - g.sum(2, keepdims=True) - xhat * (g * xhat).sum(2, keepdims=True))
    return dx.reshape(x.shape), dscale, dbias


@pytest.mark.parametrize("channels_last", [False, True])
def test_group_norm_silu_and_backward(channels_last):
    """group_norm (12 channels in 3 groups) with a SiLU after it, and its backward, in double
    against numpy; channels-last arrays are non-contiguous views."""
    r = rng(30)
    x = r.standard_normal((2, 12, 5, 7)) * 2 + 1
    if channels_last:
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    s, b = r.standard_normal((1, 12, 1, 1)), r.standard_normal((1, 12, 1, 1))
    D = cudnn.data_type.DOUBLE
    g = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D)
    X, S, B = g.tensor_like(x), g.tensor_like(s), g.tensor_like(b)
    Y, M, V = g.group_norm(input=X, scale=S, bias=B, epsilon=1e-4, groups=3, norm_forward_phase=cudnn.norm_forward_phase.TRAINING)
    Z = g.swish(input=Y)
    for t in (Z, M, V):
        t.set_output(True)
    z = np.zeros_like(x)
    m, v = np.zeros((2, 3, 1, 1)), np.zeros((2, 3, 1, 1))
    run(g, {X: x, S: s, B: b, Z: z, M: m, V: v})
    ry, rm, rv = group_norm_ref(x, s, b, 3, 1e-4)
    close(z, ry / (1 + np.exp(-ry)), 1e-10)
    close(m, rm, 1e-12)
    close(v, rv, 1e-10)

    dy = r.standard_normal(x.shape)
    bg = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D)
    DY, Xb, Sb, Mb, Vb = bg.tensor_like(dy), bg.tensor_like(x), bg.tensor_like(s), bg.tensor_like(m), bg.tensor_like(v)
    DX, DS, DB = bg.group_norm_backward(grad=DY, input=Xb, scale=Sb, mean=Mb, inv_variance=Vb, groups=3)
    for t in (DX, DS, DB):
        t.set_output(True)
    dx, ds, db = np.zeros_like(x), np.zeros_like(s), np.zeros_like(b)
    run(bg, {DY: dy, Xb: x, Sb: s, Mb: m, Vb: v, DX: dx, DS: ds, DB: db})
    rdx, rds, rdb = group_norm_bwd_ref(dy, x, s, rm, rv, 3)
    close(dx, rdx, 1e-9)
    close(ds, rds, 1e-9)
    close(db, rdb, 1e-9)


def test_group_norm_inference_f32_and_bad_groups():
    r = rng(31)
    x = r.standard_normal((3, 8, 9)).astype(np.float32)
    s, b = r.standard_normal((1, 8, 1)).astype(np.float32), r.standard_normal((1, 8, 1)).astype(np.float32)
    g = new_graph()
    X, S, B = g.tensor_like(x), g.tensor_like(s), g.tensor_like(b)
    Y, M, V = g.group_norm(norm_forward_phase=cudnn.norm_forward_phase.INFERENCE, input=X, scale=S, bias=B, groups=4)
    assert M is None and V is None
    Y.set_output(True)
    y = np.zeros_like(x)
    run(g, {X: x, S: s, B: b, Y: y})
    close(y, group_norm_ref(x.astype(np.float64), s, b, 4, 1e-5)[0], 1e-5)
    bad = new_graph()
    Xb, Sb, Bb = bad.tensor_like(x), bad.tensor_like(s), bad.tensor_like(b)
    bad.group_norm(input=Xb, scale=Sb, bias=Bb, groups=3)[0].set_output(True)
    with pytest.raises(cudnn.FerrodnnError, match="8 channels, which 3 groups do not divide"):
        bad.validate()
    with pytest.raises(ValueError, match="group_norm needs groups"):
        bad.group_norm(input=Xb, scale=Sb, bias=Bb)


# -- softmax and pooling ----------------------------------------------------------------------

def test_softmax_log_softmax_and_backward():
    r = rng(17)
    x = r.standard_normal((3, 7)) * 3
    D = cudnn.data_type.DOUBLE
    g = cudnn.pygraph(io_data_type=D, compute_data_type=D)
    X = g.tensor_like(x)
    Y = g.softmax(input=X, axis=-1)
    L = g.softmax(input=X, axis=1, use_log=True)
    Y.set_output(True)
    L.set_output(True)
    y, l = np.zeros_like(x), np.zeros_like(x)
    run(g, {X: x, Y: y, L: l})
    e = np.exp(x - x.max(1, keepdims=True))
    ref = e / e.sum(1, keepdims=True)
    close(y, ref, 1e-12)
    close(l, np.log(ref), 1e-12)

    dy = r.standard_normal(x.shape)
    bg = cudnn.pygraph(io_data_type=D, compute_data_type=D)
    Yb, DY = bg.tensor_like(y), bg.tensor_like(dy)
    DX = bg.softmax_backward(y=Yb, loss=DY, axis=1)
    DX.set_output(True)
    dx = np.zeros_like(x)
    run(bg, {Yb: y, DY: dy, DX: dx})
    close(dx, y * (dy - (dy * y).sum(1, keepdims=True)), 1e-12)


def test_pooling_max_and_avg():
    r = rng(18)
    x = r.standard_normal((2, 3, 7, 6)).astype(np.float32)
    g = new_graph()
    X = g.tensor_like(x)
    MX, _ = g.resample(input=X, resampling_mode=cudnn.resample_mode.MAXPOOL, window=[3, 2], stride=[2, 2], pre_padding=[1, 0], post_padding=[1, 0])
    AV, _ = g.resample(input=X, resampling_mode=cudnn.resample_mode.AVGPOOL_INCLUDE_PADDING, window=[2, 2], stride=[2, 2])
    MX.set_output(True)
    AV.set_output(True)
    assert MX.get_dim() == [2, 3, 4, 3] and AV.get_dim() == [2, 3, 3, 3]
    mx, av = np.zeros((2, 3, 4, 3), np.float32), np.zeros((2, 3, 3, 3), np.float32)
    run(g, {X: x, MX: mx, AV: av})
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (0, 0)), constant_values=-np.inf)
    ref_mx = np.stack([np.stack([xp[:, :, 2 * i : 2 * i + 3, 2 * j : 2 * j + 2].max((2, 3)) for j in range(3)], -1) for i in range(4)], -2)
    ref_av = x[:, :, :6, :6].reshape(2, 3, 3, 2, 3, 2).mean((3, 5))
    close(mx, ref_mx, 1e-6)
    close(av, ref_av, 1e-6)


# -- attention --------------------------------------------------------------------------------

def sdpa_ref(q, k, v, scale, causal):
    hq, hk = q.shape[1], k.shape[1]
    k = np.repeat(k, hq // hk, 1)
    v = np.repeat(v, hq // hk, 1)
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    if causal:
        i = np.arange(q.shape[2])[:, None]
        j = np.arange(k.shape[2])[None, :]
        s = np.where(j > i, -np.inf, s)
    mx = s.max(-1, keepdims=True)
    p = np.exp(s - mx)
    lse = np.log(p.sum(-1, keepdims=True)) + mx
    p = p / p.sum(-1, keepdims=True)
    return np.einsum("bhij,bhjd->bhid", p, v), lse, p, k, v


def test_sdpa_forward_and_backward_gqa_causal():
    r = rng(19)
    b, hq, hk, sq, skv, d = 2, 4, 2, 5, 5, 8
    # BSHD memory, BHSD logical dims (non-contiguous views).
    q = r.standard_normal((b, sq, hq, d)).transpose(0, 2, 1, 3)
    k = r.standard_normal((b, skv, hk, d)).transpose(0, 2, 1, 3)
    v = r.standard_normal((b, skv, hk, d)).transpose(0, 2, 1, 3)
    scale = 1 / math.sqrt(d)
    D = cudnn.data_type.DOUBLE
    g = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D)
    Q, K, V = g.tensor_like(q), g.tensor_like(k), g.tensor_like(v)
    O, STATS = g.sdpa(name="sdpa", q=Q, k=K, v=V, generate_stats=True, attn_scale=scale, use_causal_mask=True)
    o = np.zeros((b, sq, hq, d)).transpose(0, 2, 1, 3)
    stats = np.zeros((b, hq, sq, 1))
    O.set_output(True).set_dim(list(o.shape)).set_stride([s // 8 for s in o.strides])
    STATS.set_output(True).set_data_type(D)
    run(g, {Q: q, K: k, V: v, O: o, STATS: stats})
    ro, lse, p, kk, vv = sdpa_ref(q, k, v, scale, True)
    close(o, ro, 1e-10)
    close(stats, lse, 1e-10)

    do = r.standard_normal(o.shape)
    bg = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D)
    Qb, Kb, Vb, Ob, DOb, Sb = (bg.tensor_like(a) for a in (q, k, v, o, do, stats))
    DQ, DK, DV = bg.sdpa_backward(name="sdpa_backward", q=Qb, k=Kb, v=Vb, o=Ob, dO=DOb, stats=Sb, attn_scale=scale, use_causal_mask=True)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for t, a in ((DQ, dq), (DK, dk), (DV, dv)):
        t.set_output(True).set_dim(list(a.shape)).set_stride([s // 8 for s in a.strides])
    run(bg, {Qb: q, Kb: k, Vb: v, Ob: o, DOb: do, Sb: stats, DQ: dq, DK: dk, DV: dv})
    dvv = np.einsum("bhij,bhid->bhjd", p, do)
    dp = np.einsum("bhid,bhjd->bhij", do, vv)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    rdq = np.einsum("bhij,bhjd->bhid", ds, kk) * scale
    rdk = np.einsum("bhij,bhid->bhjd", ds, q) * scale
    fold = lambda a: a.reshape(b, hk, hq // hk, skv, d).sum(2)
    close(dq, rdq, 1e-9)
    close(dk, fold(rdk), 1e-9)
    close(dv, fold(dvv), 1e-9)


def test_sdpa_attn_scale_tensor_and_inference():
    r = rng(20)
    q, k, v = (r.standard_normal((1, 2, 3, 4)).astype(np.float32) for _ in range(3))
    g = new_graph()
    Q, K, V = g.tensor_like(q), g.tensor_like(k), g.tensor_like(v)
    SC = g.tensor(name="scale", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], is_pass_by_value=True, data_type=F32)
    O, STATS = g.sdpa(q=Q, k=K, v=V, is_inference=True, attn_scale=SC)
    assert STATS is None
    O.set_output(True)
    o = np.zeros_like(q)
    run(g, {Q: q, K: k, V: v, SC: np.full((1, 1, 1, 1), 0.3, np.float32), O: o})
    close(o, sdpa_ref(q.astype(np.float64), k, v, float(np.float32(0.3)), False)[0], 1e-5)


def band_ref(q, k, v, scale, left, right, keep=None, p_drop=0.0):
    """softmax over the band of the bottom-right diagonal (keys diag - left < j <= diag + right,
    diag = i + s_kv - s_q, as the frontend's reference masks it) with K and V of their own head
    counts; `keep` the dropout mask."""
    hq = q.shape[1]
    k = np.repeat(k, hq // k.shape[1], 1)
    v = np.repeat(v, hq // v.shape[1], 1)
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    sq, skv = q.shape[2], k.shape[2]
    i = np.arange(sq)[:, None]
    j = np.arange(skv)[None, :]
    diag = i + skv - sq
    s = np.where((j > diag + right) | (j <= diag - left), -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    if keep is not None:
        p = p * keep / (1 - p_drop)
    return np.einsum("bhij,bhjd->bhid", p, v)


def test_sdpa_kv_heads_differ_on_a_bottom_right_band_with_the_dropout_mask():
    """K and V with different head counts (and head dims), the band on the bottom-right diagonal
    with a positive right bound, and rng_dump, with the frontend's keywords."""
    r = rng(23)
    b, hq, hk, hv, sq, skv, d, dv = 2, 6, 2, 3, 5, 9, 4, 3
    q = r.standard_normal((b, hq, sq, d))
    k = r.standard_normal((b, hk, skv, d))
    v = r.standard_normal((b, hv, skv, dv))
    D = cudnn.data_type.DOUBLE
    for dropout in (None, 0.3):
        g = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D, handle=cudnn.create_cpu_handle())
        Q, K, V = g.tensor_like(q), g.tensor_like(k), g.tensor_like(v)
        extra = {}
        if dropout:
            seed = g.tensor(dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT64)
            offset = g.tensor(dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT64)
            dump = g.tensor(dim=[b, hq, sq, skv], stride=[hq * sq * skv, sq * skv, skv, 1], data_type=cudnn.data_type.FLOAT)
            extra = dict(dropout=(dropout, seed, offset), rng_dump=dump)
        O, _ = g.sdpa(q=Q, k=K, v=V, generate_stats=False, attn_scale=0.5, diagonal_alignment=cudnn.diagonal_alignment.BOTTOM_RIGHT,
                      diagonal_band_left_bound=3, diagonal_band_right_bound=2, **extra)
        O.set_output(True)
        assert O.get_dim() == [b, hq, sq, dv]
        o = np.zeros((b, hq, sq, dv))
        pack = {Q: q, K: k, V: v, O: o}
        keep = None
        if dropout:
            mask = np.full((b, hq, sq, skv), 7.0, np.float32)
            pack.update({seed: np.full((1, 1, 1, 1), 1234, np.int64), offset: np.full((1, 1, 1, 1), 5, np.int64), dump: mask})
            run(g, pack)
            assert set(np.unique(mask)) == {0.0, 1.0}, np.unique(mask)
            assert 0.1 < 1 - mask.mean() < 0.5, mask.mean()
            keep = mask.astype(np.float64)
        else:
            run(g, pack)
        close(o, band_ref(q, k, v, 0.5, 3, 2, keep, dropout or 0.0), 1e-10)


def test_sdpa_rng_dump_needs_dropout_and_belongs_to_the_forward_pass():
    g = new_graph()
    Q = g.tensor(name="q", dim=[1, 2, 3, 4], stride=[24, 12, 4, 1])
    M = g.tensor(name="mask", dim=[1, 2, 3, 3], stride=[18, 9, 3, 1])
    with pytest.raises(ValueError, match="rng_dump.*needs dropout"):
        g.sdpa(q=Q, k=Q, v=Q, generate_stats=False, rng_dump=M)
    with pytest.raises(cudnn.NotSupportedError, match="rng_dump"):
        g.sdpa_backward(q=Q, k=Q, v=Q, o=Q, dO=Q, stats=Q, rng_dump=M)
    # A mask of the wrong dims is refused at validation, naming the port.
    seed = g.tensor(dim=[1], stride=[1], data_type=cudnn.data_type.INT64)
    bad = g.tensor(name="bad_mask", dim=[1, 2, 3, 4], stride=[24, 12, 4, 1])
    O, _ = g.sdpa(q=Q, k=Q, v=Q, generate_stats=False, dropout=(0.1, seed, seed), rng_dump=bad)
    O.set_output(True)
    with pytest.raises(cudnn.InvalidGraphError, match="rng_dump.*\\[1, 2, 3, 4\\].*\\[1, 2, 3, 3\\]"):
        g.validate()


def test_sdpa_overlapping_input_views():
    """Inputs may be views whose elements share memory (stride 0 and overlapping rows), as the
    frontend takes them; the output is written with its own strides."""
    r = rng(24)
    base = r.standard_normal(200)
    q = np.lib.stride_tricks.as_strided(base, (2, 3, 4, 8), (0, 40 * 8, 2 * 8, 8))
    k = np.broadcast_to(r.standard_normal((1, 1, 6, 8)), (2, 3, 6, 8))
    v = np.lib.stride_tricks.as_strided(base[5:], (2, 3, 6, 5), (8, 16, 3 * 8, 8))
    D = cudnn.data_type.DOUBLE
    g = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D, handle=cudnn.create_cpu_handle())
    Q, K, V = g.tensor_like(q), g.tensor_like(k), g.tensor_like(v)
    assert Q.get_stride() == [0, 40, 2, 1] and K.get_stride()[:2] == [0, 0]
    O, _ = g.sdpa(q=Q, k=K, v=V, generate_stats=False, attn_scale=0.3)
    O.set_output(True)
    o = np.zeros((2, 3, 4, 5))
    run(g, {Q: q, K: k, V: v, O: o})
    close(o, sdpa_ref(q, k, v, 0.3, False)[0], 1e-10)


# -- transforms -------------------------------------------------------------------------------

def test_slice_transpose_reshape_concatenate():
    r = rng(21)
    x = r.standard_normal((4, 6, 5)).astype(np.float32)
    z = r.standard_normal((4, 2, 5)).astype(np.float32)
    g = new_graph()
    X, Z = g.tensor_like(x), g.tensor_like(z)
    SL = g.slice(input=X, slices=[slice(1, 4), slice(0, 6, 2), slice(None)])
    TR = g.transpose(input=X, permutation=[2, 0, 1])
    RS = g.reshape(input=X)
    RS.set_dim([6, 20])
    CC = g.concatenate(inputs=[X, Z], axis=1)
    for t in (SL, TR, RS, CC):
        t.set_output(True)
    assert SL.get_dim() == [3, 3, 5] and TR.get_dim() == [5, 4, 6] and CC.get_dim() == [4, 8, 5]
    sl, tr = np.zeros((3, 3, 5), np.float32), np.zeros((5, 4, 6), np.float32)
    rs, cc = np.zeros((6, 20), np.float32), np.zeros((4, 8, 5), np.float32)
    run(g, {X: x, Z: z, SL: sl, TR: tr, RS: rs, CC: cc})
    np.testing.assert_array_equal(sl, x[1:4, 0:6:2, :])
    np.testing.assert_array_equal(tr, x.transpose(2, 0, 1))
    np.testing.assert_array_equal(rs, x.reshape(6, 20))
    np.testing.assert_array_equal(cc, np.concatenate([x, z], 1))


# -- rng --------------------------------------------------------------------------------------

def test_rng_uniform_and_bernoulli_distribution():
    g = cudnn.pygraph()
    SEED = g.tensor(name="seed", dim=[1], stride=[1], data_type=cudnn.data_type.INT64)
    OFF = g.tensor(name="offset", dim=[1], stride=[1], data_type=cudnn.data_type.INT64)
    U = g.rng(seed=SEED, offset=OFF, dim=[64, 64], distribution=cudnn.rng_distribution.UNIFORM)
    BE = g.rng(seed=SEED, offset=OFF, dim=[64, 64], bernoulli_probability=0.3)
    U.set_output(True).set_data_type(F32)
    BE.set_output(True).set_data_type(F32)
    u, be = np.zeros((64, 64), np.float32), np.zeros((64, 64), np.float32)
    run(g, {SEED: np.array([1234], np.int64), OFF: np.array([0], np.int64), U: u, BE: be})
    assert 0.0 <= u.min() and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.02 and abs(u.var() - 1 / 12) < 0.01
    assert set(np.unique(be)) <= {0.0, 1.0} and abs(be.mean() - 0.3) < 0.03
    u2 = np.zeros_like(u)
    g.execute({SEED: np.array([1234], np.int64), OFF: np.array([0], np.int64), U: u2, BE: be}, None)
    np.testing.assert_array_equal(u, u2)
    g.execute({SEED: np.array([99], np.int64), OFF: np.array([0], np.int64), U: u2, BE: be}, None)
    assert not np.array_equal(u, u2)


def test_sdpa_mask_flags_given_as_none_mean_false():
    # The frontend's attention tests pass use_alibi_mask=None, use_padding_mask=None, ...: the
    # same result as leaving them out.
    r = rng(23)
    b, h, s, d = 1, 2, 4, 8
    q, k, v = (r.standard_normal((b, h, s, d)) for _ in range(3))
    scale = 1 / math.sqrt(d)
    D = cudnn.data_type.DOUBLE
    outs = []
    for flags in ({}, dict(use_alibi_mask=None, use_padding_mask=None, use_causal_mask_bottom_right=None, unfuse_fma=None)):
        g = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D)
        Q, K, V = g.tensor_like(q), g.tensor_like(k), g.tensor_like(v)
        O, _ = g.sdpa(q=Q, k=K, v=V, attn_scale=scale, use_causal_mask=True, **flags)
        o = np.full((b, h, s, d), np.nan)
        O.set_output(True).set_dim(list(o.shape)).set_stride([x // 8 for x in o.strides])
        run(g, {Q: q, K: k, V: v, O: o})
        outs.append(o)
    close(outs[1], sdpa_ref(q, k, v, scale, True)[0], 1e-10)
    assert np.array_equal(outs[0], outs[1])
    bg = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D)
    t = [bg.tensor_like(a) for a in (q, k, v, outs[0], q, np.zeros((b, h, s, 1)))]
    grads = bg.sdpa_backward(q=t[0], k=t[1], v=t[2], o=t[3], dO=t[4], stats=t[5], attn_scale=scale, use_alibi_mask=None,
                             use_padding_mask=None, use_causal_mask=None, use_deterministic_algorithm=None)
    assert len(grads) == 3


def test_sdpa_ragged_thd_forward_and_backward():
    """Packed (THD) q, k, v, o, stats and gradients with ragged offsets, as the frontend's
    samples build them: each sequence matches attention on it alone, and no byte past a
    sequence's rows is written."""
    r = rng(23)
    hq, hk, d = 4, 2, 8
    lq, lkv = [3, 0, 5], [4, 2, 6]
    b, sq, skv = len(lq), max(lq), max(lkv)
    tq, tkv = sum(lq), sum(lkv)
    D = cudnn.data_type.DOUBLE
    INT64 = cudnn.data_type.INT64
    q = r.standard_normal((tq + 2, hq, d))
    k = r.standard_normal((tkv + 2, hk, d))
    v = r.standard_normal((tkv + 2, hk, d))
    do = r.standard_normal((tq + 2, hq, d))
    pre = lambda lens, row: (np.concatenate([[0], np.cumsum(lens)]) * row).astype(np.int64).reshape(-1, 1, 1, 1)
    off_q, off_kv, off_st = pre(lq, hq * d), pre(lkv, hk * d), pre(lq, hq)
    scale = 1 / math.sqrt(d)

    def graph():
        g = cudnn.pygraph(io_data_type=D, intermediate_data_type=D, compute_data_type=D, handle=cudnn.create_cpu_handle())
        thd = lambda h, s: g.tensor(dim=[b, h, s, d], stride=[s * h * d, d, h * d, 1], data_type=D)
        Q, K, V = thd(hq, sq), thd(hk, skv), thd(hk, skv)
        LQ = g.tensor(dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT32)
        LKV = g.tensor(dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT32)
        offs = {n: g.tensor(dim=[b + 1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=INT64) for n in ("q", "kv", "st")}
        return g, thd, Q, K, V, LQ, LKV, offs

    g, thd, Q, K, V, LQ, LKV, offs = graph()
    for t, n in ((Q, "q"), (K, "kv"), (V, "kv")):
        t.set_ragged_offset(offs[n])
    O, STATS = g.sdpa(q=Q, k=K, v=V, generate_stats=True, attn_scale=scale, use_padding_mask=True, seq_len_q=LQ, seq_len_kv=LKV,
                      use_causal_mask_bottom_right=True)
    O.set_output(True).set_stride([sq * hq * d, d, hq * d, 1]).set_ragged_offset(offs["q"])
    STATS.set_output(True).set_data_type(D).set_stride([sq * hq, 1, hq, 1]).set_ragged_offset(offs["st"])
    o = np.full((tq + 2, hq, d), np.nan)
    st = np.full((tq + 2, hq, 1), np.nan)
    lens = lambda l: np.array(l, np.int32).reshape(-1, 1, 1, 1)
    run(g, {Q: q, K: k, V: v, LQ: lens(lq), LKV: lens(lkv), offs["q"]: off_q, offs["kv"]: off_kv, offs["st"]: off_st, O: o, STATS: st})
    assert np.isnan(o[tq:]).all() and np.isnan(st[tq:]).all(), "rows past the last sequence were written"

    bg, thd, Qb, Kb, Vb, LQb, LKVb, offs_b = graph()
    Ob, DOb = thd(hq, sq), thd(hq, sq)
    Sb = bg.tensor(dim=[b, hq, sq, 1], stride=[sq * hq, 1, hq, 1], data_type=D)
    for t, n in ((Qb, "q"), (Kb, "kv"), (Vb, "kv"), (Ob, "q"), (DOb, "q"), (Sb, "st")):
        t.set_ragged_offset(offs_b[n])
    DQ, DK, DV = bg.sdpa_backward(q=Qb, k=Kb, v=Vb, o=Ob, dO=DOb, stats=Sb, attn_scale=scale, use_padding_mask=True, seq_len_q=LQb,
                                  seq_len_kv=LKVb, use_causal_mask_bottom_right=True)
    for t, n, s in ((DQ, "q", sq), (DK, "kv", skv), (DV, "kv", skv)):
        h = hq if n == "q" else hk
        t.set_output(True).set_stride([s * h * d, d, h * d, 1]).set_ragged_offset(offs_b[n])
    dq, dk, dv = np.full_like(q, np.nan), np.full_like(k, np.nan), np.full_like(v, np.nan)
    run(bg, {Qb: q, Kb: k, Vb: v, Ob: o, DOb: do, Sb: st, LQb: lens(lq), LKVb: lens(lkv), offs_b["q"]: off_q, offs_b["kv"]: off_kv,
             offs_b["st"]: off_st, DQ: dq, DK: dk, DV: dv})

    aq, akv = np.concatenate([[0], np.cumsum(lq)]), np.concatenate([[0], np.cumsum(lkv)])
    for i in range(b):
        if lq[i] == 0:
            continue
        sl = lambda a, s, e: a[s:e].transpose(1, 0, 2)[None]  # [1, h, len, d]
        qi, ki, vi, doi = sl(q, aq[i], aq[i + 1]), sl(k, akv[i], akv[i + 1]), sl(v, akv[i], akv[i + 1]), sl(do, aq[i], aq[i + 1])
        kk, vv = np.repeat(ki, hq // hk, 1), np.repeat(vi, hq // hk, 1)
        s = np.einsum("bhid,bhjd->bhij", qi, kk) * scale
        li, lj = lq[i], lkv[i]
        s = np.where(np.arange(lj)[None, :] <= np.arange(li)[:, None] + lj - li, s, -np.inf)
        m = s.max(-1, keepdims=True)
        e = np.exp(s - m)
        p = e / e.sum(-1, keepdims=True)
        close(sl(o, aq[i], aq[i + 1]), np.einsum("bhij,bhjd->bhid", p, vv), 1e-10)
        close(sl(st, aq[i], aq[i + 1]), m + np.log(e.sum(-1, keepdims=True)), 1e-10)
        dp = np.einsum("bhid,bhjd->bhij", doi, vv)
        ds = p * (dp - (dp * p).sum(-1, keepdims=True))
        fold = lambda a: a.reshape(1, hk, hq // hk, lj, d).sum(2)
        close(sl(dq, aq[i], aq[i + 1]), np.einsum("bhij,bhjd->bhid", ds, kk) * scale, 1e-9)
        close(sl(dk, akv[i], akv[i + 1]), fold(np.einsum("bhij,bhid->bhjd", ds, qi) * scale), 1e-9)
        close(sl(dv, akv[i], akv[i + 1]), fold(np.einsum("bhij,bhid->bhjd", p, doi)), 1e-9)
    # Batch 1 has no query rows but two keys: its dk/dv rows are zero gradients, written.
    assert np.all(dk[akv[1]:akv[2]] == 0) and np.all(dv[akv[1]:akv[2]] == 0)
    assert np.isnan(dq[tq:]).all() and np.isnan(dk[tkv:]).all() and np.isnan(dv[tkv:]).all()
