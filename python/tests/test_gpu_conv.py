"""On a GPU with PyTorch: the cudnn frontend's convolution samples (conv + bias + relu, conv +
genstats, scale-bias-relu-conv, dgrad + drelu, wgrad, an NCHW fprop and a 3D conv), written as the
frontend writes them and checked against PyTorch (issue 26). Skipped where torch or a CUDA device
(usable by ferrodnn) is missing.

Every input is seeded random data in the graph's type; references are computed in float32 on the
host from those same values (no TF32 there), and results are compared with tolerances by type.
Filters (and wgrad's output gradient) are scaled by 1/sqrt(fan-in) so that results are of order
one whatever the size, and every output buffer starts as NaN so that an element left unwritten
fails the comparison. Each sample is a function of the device, so the same graphs also run on
the CPU engine with host tensors (`_run_samples_on_host` at the bottom, for debugging without a
GPU)."""

import math

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import ferrodnn as cudnn  # noqa: E402

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and cudnn.gpu_available()), reason="needs a CUDA device usable by ferrodnn and PyTorch")

HALF, BF16, FLOAT = torch.float16, torch.bfloat16, torch.float32

# Tolerances of a result of order one against a float32 reference of the same inputs: the
# output's rounding to its type, plus an intermediate (the prologue's x', a fused epilogue's
# input) that an engine may keep in the io type. FLOAT allows one TF32 pass.
TOL = {
    HALF: dict(atol=1e-2, rtol=1e-2),
    BF16: dict(atol=5e-2, rtol=2e-2),
    FLOAT: dict(atol=1e-2, rtol=1e-2),
}
# The unit roundoff of each type (statistics tolerances scale with it).
EPS = {HALF: 2.0**-11, BF16: 2.0**-8, FLOAT: 2.0**-11}


def cudnn_type(torch_type):
    return {HALF: cudnn.data_type.HALF, BF16: cudnn.data_type.BFLOAT16, FLOAT: cudnn.data_type.FLOAT}[torch_type]


def memory_format(rank, channels_last):
    if not channels_last:
        return torch.contiguous_format
    return {4: torch.channels_last, 5: torch.channels_last_3d}[rank]


def randn(gen, shape, dtype, device, channels_last=True, scale=1.0, shift=0.0):
    """Seeded normal values (never zeros), rounded to `dtype`, in the layout asked for."""
    t = torch.randn(*shape, generator=gen, dtype=torch.float32) * scale + shift
    return t.to(dtype).to(device).contiguous(memory_format=memory_format(len(shape), channels_last))


def nan_output(shape, dtype, device, channels_last=True):
    t = torch.full(shape, float("nan"), dtype=dtype, device=device)
    return t.contiguous(memory_format=memory_format(len(shape), channels_last))


def f32(t):
    """The host float32 copy a reference is computed from."""
    return t.detach().to("cpu", torch.float32)


def build_and_execute(graph, pack, handle, device):
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    workspace = torch.empty(graph.get_workspace_size(), device=device, dtype=torch.uint8)
    # strict: every array must have its tensor's dims and strides (the layouts the graph
    # inferred for its outputs are the ones allocated here).
    graph.execute(pack, workspace, handle=handle, strict=True)
    if device == "cuda":
        torch.cuda.synchronize()


def assert_layout(tensor, array):
    """The graph's tensor has the array's dims and, where a dim is above 1, its strides."""
    assert tensor.get_dim() == list(array.shape)
    strides = [(a, b) for n, a, b in zip(array.shape, tensor.get_stride(), array.stride()) if n > 1]
    assert all(a == b for a, b in strides), f"graph strides {tensor.get_stride()}, array strides {list(array.stride())}"


def check(actual, expected, dtype):
    torch.testing.assert_close(f32(actual), expected, **TOL[dtype])


def set_stream(handle, device):
    if device == "cuda":
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)


def new_graph(handle, dtype, intermediate=cudnn.data_type.FLOAT):
    return cudnn.pygraph(io_data_type=cudnn_type(dtype), intermediate_data_type=intermediate, compute_data_type=cudnn.data_type.FLOAT, handle=handle)


def pad_ref(x, pre, post):
    """Zero padding before / after each spatial dim (asymmetric padding for the references)."""
    pads = []
    for a, b in reversed(list(zip(pre, post))):
        pads += [a, b]
    return F.pad(x, pads)


# -- 1. conv + bias + relu (the frontend's test_conv_bias.py, samples/cpp/convolution/fprop.cpp
#       "CSBR"): channels-last fp16 / bf16 ------------------------------------------------------

CBR_CASES = {
    # name: (N, C, H, W, K, R, S, pre_padding, post_padding, stride, dilation)
    "3x3_pad1_stride2": (2, 24, 17, 19, 40, 3, 3, [1, 1], [1, 1], [2, 2], [1, 1]),
    "1x1": (3, 40, 13, 11, 24, 1, 1, [0, 0], [0, 0], [1, 1], [1, 1]),
    "3x3_asymmetric_pad_dilated": (2, 16, 15, 21, 32, 3, 3, [1, 0], [0, 2], [1, 2], [2, 1]),
    "7x7_stem_3_channels": (2, 3, 23, 21, 16, 7, 7, [3, 3], [3, 3], [2, 2], [1, 1]),
}


def sample_conv_bias_relu(handle, device, dtype, case, seed=0):
    n, c, h, w, k, r, s, pre, post, stride, dilation = CBR_CASES[case]
    gen = torch.Generator().manual_seed(seed)
    x_dev = randn(gen, (n, c, h, w), dtype, device)
    w_dev = randn(gen, (k, c, r, s), dtype, device, scale=1 / math.sqrt(c * r * s))
    b_dev = randn(gen, (1, k, 1, 1), dtype, device, scale=0.5)
    y_ref = torch.relu(F.conv2d(pad_ref(f32(x_dev), pre, post), f32(w_dev), bias=f32(b_dev).reshape(-1), stride=stride, dilation=dilation))

    set_stream(handle, device)
    graph = new_graph(handle, dtype)
    X = graph.tensor(name="X", dim=x_dev.size(), stride=x_dev.stride(), data_type=cudnn_type(dtype))
    W = graph.tensor(name="W", dim=w_dev.size(), stride=w_dev.stride(), data_type=cudnn_type(dtype))
    B = graph.tensor(name="B", dim=b_dev.size(), stride=b_dev.stride(), data_type=cudnn_type(dtype))
    if pre == post:
        conv = graph.conv_fprop(image=X, weight=W, padding=pre, stride=stride, dilation=dilation)
    else:
        conv = graph.conv_fprop(image=X, weight=W, pre_padding=pre, post_padding=post, stride=stride, dilation=dilation)
    Y = graph.relu(name="relu", input=graph.bias(name="bias", input=conv, bias=B))
    Y.set_output(True)
    graph.validate()
    # The output has the reference's dims and the image's layout (channels-last).
    y_dev = nan_output(y_ref.shape, dtype, device)
    assert_layout(Y, y_dev)

    build_and_execute(graph, {X: x_dev, W: w_dev, B: b_dev, Y: y_dev}, handle, device)
    check(y_dev, y_ref, dtype)


@pytest.mark.parametrize("dtype", [HALF, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", ["3x3_pad1_stride2", "1x1"])
def test_conv_bias_relu(handle, dtype, case):
    sample_conv_bias_relu(handle, "cuda", dtype, case)


@pytest.mark.parametrize("case", ["3x3_asymmetric_pad_dilated", "7x7_stem_3_channels"])
def test_conv_bias_relu_more_shapes_fp16(handle, case):
    sample_conv_bias_relu(handle, "cuda", HALF, case)


# -- 2. conv + genstats (test_conv_genstats.py, fprop.cpp "SBRCS"): y = conv(x, w) and the
#       per-channel sum and sum of squares of y; with `prologue`, the frontend's sample as it
#       is: x' = relu(x * scale + bias) before the convolution -----------------------------------

def sample_conv_genstats(handle, device, dtype, prologue, seed=1):
    n, c, h, w, k = 2, 32, 17, 19, 48
    padding, stride, dilation = [1, 1], [1, 1], [1, 1]
    gen = torch.Generator().manual_seed(seed)
    x_dev = randn(gen, (n, c, h, w), dtype, device)
    w_dev = randn(gen, (k, c, 3, 3), dtype, device, scale=1 / math.sqrt(c * 9))
    s_dev = randn(gen, (1, c, 1, 1), dtype, device, scale=0.5, shift=1.0)
    b_dev = randn(gen, (1, c, 1, 1), dtype, device, scale=0.5)
    x_in = torch.relu(f32(x_dev) * f32(s_dev) + f32(b_dev)) if prologue else f32(x_dev)
    y_ref = F.conv2d(x_in, f32(w_dev), padding=padding, stride=stride, dilation=dilation)
    sum_ref = y_ref.sum(dim=(0, 2, 3), keepdim=True)
    sq_sum_ref = y_ref.square().sum(dim=(0, 2, 3), keepdim=True)

    set_stream(handle, device)
    # The frontend's sample keeps its intermediates (x') in HALF; the plain form in FLOAT.
    graph = new_graph(handle, dtype, intermediate=cudnn_type(dtype) if prologue else cudnn.data_type.FLOAT)
    X = graph.tensor(name="X", dim=x_dev.size(), stride=x_dev.stride(), data_type=x_dev.dtype)
    W = graph.tensor(name="W", dim=w_dev.size(), stride=w_dev.stride(), data_type=w_dev.dtype)
    pack = {X: x_dev, W: w_dev}
    conv_in = X
    if prologue:
        S = graph.tensor(name="S", dim=s_dev.size(), stride=s_dev.stride(), data_type=s_dev.dtype)
        B = graph.tensor(name="B", dim=b_dev.size(), stride=b_dev.stride(), data_type=b_dev.dtype)
        conv_in = graph.relu(name="relu", input=graph.bias(name="bias", input=graph.scale(name="scale", input=X, scale=S), bias=B))
        pack.update({S: s_dev, B: b_dev})
    Y = graph.conv_fprop(image=conv_in, weight=W, padding=padding, stride=stride, dilation=dilation)
    Y.set_output(True)
    SUM, SQ_SUM = graph.genstats(name="genstats", input=Y)
    SUM.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    SQ_SUM.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    graph.validate()
    y_dev = nan_output(y_ref.shape, dtype, device)
    sum_dev = nan_output((1, k, 1, 1), FLOAT, device, channels_last=False)
    sq_sum_dev = nan_output((1, k, 1, 1), FLOAT, device, channels_last=False)
    for tensor, array in ((Y, y_dev), (SUM, sum_dev), (SQ_SUM, sq_sum_dev)):
        assert_layout(tensor, array)
    pack.update({Y: y_dev, SUM: sum_dev, SQ_SUM: sq_sum_dev})
    build_and_execute(graph, pack, handle, device)

    check(y_dev, y_ref, dtype)
    # The statistics may be taken from y as written (rounded to its type) or before rounding:
    # both are within 8 roundoffs times sqrt(count) of the float32 reference's sums.
    count = n * y_ref.shape[2] * y_ref.shape[3]
    rms = y_ref.square().mean().sqrt().item()
    torch.testing.assert_close(f32(sum_dev), sum_ref, atol=8 * EPS[dtype] * math.sqrt(count) * max(rms, 1.0), rtol=1e-2)
    torch.testing.assert_close(f32(sq_sum_dev), sq_sum_ref, atol=8 * EPS[dtype] * math.sqrt(count) * max(rms, 1.0) ** 2, rtol=1e-2)


@pytest.mark.parametrize("dtype,prologue", [(HALF, False), (BF16, False), (HALF, True)], ids=["fp16", "bf16", "fp16_scale_bias_relu"])
def test_conv_genstats(handle, dtype, prologue):
    sample_conv_genstats(handle, "cuda", dtype, prologue)


# -- 3. scale-bias-relu-conv (cuDNN's ConvScaleBiasAct: batchnorm folded into the next conv):
#       y = conv(relu(x * scale + bias), w), scale and bias per channel [1, C, 1, 1]. The
#       convolution's zero padding pads x' (after the prologue), not x ------------------------

SBR_CASES = {
    # name: (N, C, H, W, K, R, S, padding, stride)
    "3x3_pad1": (2, 32, 17, 15, 48, 3, 3, [1, 1], [1, 1]),
    "3x3_pad1_stride2": (3, 16, 19, 21, 24, 3, 3, [1, 1], [2, 2]),
    "1x1": (2, 40, 9, 13, 32, 1, 1, [0, 0], [1, 1]),
}


def sample_scale_bias_relu_conv(handle, device, dtype, case, seed=2):
    n, c, h, w, k, r, s, padding, stride = SBR_CASES[case]
    gen = torch.Generator().manual_seed(seed)
    x_dev = randn(gen, (n, c, h, w), dtype, device)
    w_dev = randn(gen, (k, c, r, s), dtype, device, scale=1 / math.sqrt(c * r * s))
    # Biases of both signs and up to about +-1.5: relu(bias) != 0 on some channels, so a
    # prologue applied to the padding (rather than padding x') would show.
    s_dev = randn(gen, (1, c, 1, 1), dtype, device, scale=0.5, shift=1.0)
    b_dev = randn(gen, (1, c, 1, 1), dtype, device, scale=0.7)
    x_act = torch.relu(f32(x_dev) * f32(s_dev) + f32(b_dev))
    y_ref = F.conv2d(x_act, f32(w_dev), padding=padding, stride=stride)

    set_stream(handle, device)
    graph = new_graph(handle, dtype)
    X, W = graph.tensor_like(x_dev, name="X"), graph.tensor_like(w_dev, name="W")
    S, B = graph.tensor_like(s_dev, name="S"), graph.tensor_like(b_dev, name="B")
    scaled = graph.scale(name="scale", input=X, scale=S)
    biased = graph.bias(name="bias", input=scaled, bias=B)
    x_prime = graph.relu(name="relu", input=biased)
    Y = graph.conv_fprop(image=x_prime, weight=W, padding=padding, stride=stride, dilation=[1, 1], name="conv")
    Y.set_output(True)
    graph.validate()
    y_dev = nan_output(y_ref.shape, dtype, device)
    assert_layout(Y, y_dev)
    build_and_execute(graph, {X: x_dev, W: w_dev, S: s_dev, B: b_dev, Y: y_dev}, handle, device)
    check(y_dev, y_ref, dtype)


@pytest.mark.parametrize("dtype,case", [(HALF, "3x3_pad1"), (HALF, "3x3_pad1_stride2"), (HALF, "1x1"), (BF16, "3x3_pad1")])
def test_scale_bias_relu_conv(handle, dtype, case):
    sample_scale_bias_relu_conv(handle, "cuda", dtype, case)


# -- 4. dgrad + drelu (samples/cpp/convolution/dgrads.cpp "Dgrad Drelu Graph"):
#       dx = conv_dgrad(dy, w) * (x > 0), x the input of the forward's relu ------------------------

DGRAD_CASES = {
    # name: (N, C, H, W, K, R, S, padding, stride)
    "3x3_pad1": (2, 32, 15, 17, 48, 3, 3, [1, 1], [1, 1]),
    # W = 20: the forward's last column of taps is cut by the stride, dx's last column gets
    # gradient only from the filter's first taps (PyTorch's output_padding case).
    "3x3_pad1_stride2": (2, 24, 17, 20, 40, 3, 3, [1, 1], [2, 2]),
    "1x1": (3, 48, 11, 9, 24, 1, 1, [0, 0], [1, 1]),
}


def sample_dgrad_drelu(handle, device, dtype, case, drelu=True, seed=3):
    n, c, h, w, k, r, s, padding, stride = DGRAD_CASES[case]
    p = (h + 2 * padding[0] - r) // stride[0] + 1
    q = (w + 2 * padding[1] - s) // stride[1] + 1
    gen = torch.Generator().manual_seed(seed)
    dy_dev = randn(gen, (n, k, p, q), dtype, device)
    w_dev = randn(gen, (k, c, r, s), dtype, device, scale=1 / math.sqrt(k * r * s))
    x_dev = randn(gen, (n, c, h, w), dtype, device)
    dx_ref = torch.nn.grad.conv2d_input((n, c, h, w), f32(w_dev), f32(dy_dev), stride=stride, padding=padding)
    if drelu:
        dx_ref = dx_ref * (f32(x_dev) > 0)

    set_stream(handle, device)
    graph = new_graph(handle, dtype)
    DY = graph.tensor(name="DY", dim=dy_dev.size(), stride=dy_dev.stride(), data_type=cudnn_type(dtype))
    W = graph.tensor(name="W", dim=w_dev.size(), stride=w_dev.stride(), data_type=cudnn_type(dtype))
    dgrad = graph.conv_dgrad(name="dgrad", loss=DY, filter=W, padding=padding, stride=stride, dilation=[1, 1])
    dgrad.set_dim([n, c, h, w])
    pack = {DY: dy_dev, W: w_dev}
    if drelu:
        X = graph.tensor(name="X", dim=x_dev.size(), stride=x_dev.stride(), data_type=cudnn_type(dtype))
        DX = graph.relu_backward(name="drelu", loss=dgrad, input=X)
        pack[X] = x_dev
    else:
        DX = dgrad
    DX.set_output(True)
    graph.validate()
    # dx follows dy's layout: channels-last (drelu's output too).
    dx_dev = nan_output((n, c, h, w), dtype, device)
    assert_layout(DX, dx_dev)
    pack[DX] = dx_dev
    build_and_execute(graph, pack, handle, device)
    check(dx_dev, dx_ref, dtype)


@pytest.mark.parametrize("dtype,case", [(HALF, "3x3_pad1"), (HALF, "3x3_pad1_stride2"), (HALF, "1x1"), (BF16, "3x3_pad1_stride2")])
def test_dgrad_drelu(handle, dtype, case):
    sample_dgrad_drelu(handle, "cuda", dtype, case)


@pytest.mark.parametrize("case", ["3x3_pad1", "3x3_pad1_stride2"])
def test_dgrad(handle, case):
    sample_dgrad_drelu(handle, "cuda", HALF, case, drelu=False)


# -- 5. wgrad (test_wgrads.py, samples/cpp/convolution/wgrads.cpp): dw = conv_wgrad(dy, x);
#       with `prologue`, the frontend's scale-bias-relu-wgrad: x' = relu(x * scale + bias) -------

WGRAD_CASES = {
    # name: (N, C, H, W, K, R, S, padding, stride)
    "3x3_pad1_stride2": (2, 24, 17, 19, 40, 3, 3, [1, 1], [2, 2]),
    "3x3_pad1": (2, 32, 15, 13, 48, 3, 3, [1, 1], [1, 1]),
    "1x1": (3, 40, 11, 9, 24, 1, 1, [0, 0], [1, 1]),
}


def sample_wgrad(handle, device, dtype, case, prologue=False, seed=4):
    n, c, h, w, k, r, s, padding, stride = WGRAD_CASES[case]
    p = (h + 2 * padding[0] - r) // stride[0] + 1
    q = (w + 2 * padding[1] - s) // stride[1] + 1
    gen = torch.Generator().manual_seed(seed)
    x_dev = randn(gen, (n, c, h, w), dtype, device)
    # dw sums n * p * q products: dy scaled so that dw is of order one.
    dy_dev = randn(gen, (n, k, p, q), dtype, device, scale=1 / math.sqrt(n * p * q))
    s_dev = randn(gen, (1, c, 1, 1), dtype, device, scale=0.5, shift=1.0)
    b_dev = randn(gen, (1, c, 1, 1), dtype, device, scale=0.7)
    x_in = torch.relu(f32(x_dev) * f32(s_dev) + f32(b_dev)) if prologue else f32(x_dev)
    dw_ref = torch.nn.grad.conv2d_weight(x_in, (k, c, r, s), f32(dy_dev), stride=stride, padding=padding)

    set_stream(handle, device)
    graph = new_graph(handle, dtype)
    X = graph.tensor(name="X", dim=x_dev.size(), stride=x_dev.stride(), data_type=x_dev.dtype)
    DY = graph.tensor(name="DY", dim=dy_dev.size(), stride=dy_dev.stride(), data_type=dy_dev.dtype)
    pack = {X: x_dev, DY: dy_dev}
    image = X
    if prologue:
        B = graph.tensor(name="B", dim=b_dev.size(), stride=b_dev.stride(), data_type=b_dev.dtype)
        S = graph.tensor(name="S", dim=s_dev.size(), stride=s_dev.stride(), data_type=s_dev.dtype)
        image = graph.relu(name="relu", input=graph.bias(name="bias", input=graph.scale(name="scale", input=X, scale=S), bias=B))
        pack.update({S: s_dev, B: b_dev})
    DW = graph.conv_wgrad(name="wgrad", image=image, loss=DY, padding=padding, stride=stride, dilation=[1, 1])
    DW.set_output(True).set_dim([k, c, r, s])
    graph.validate()
    # dw follows the image's layout: channels-last.
    dw_dev = nan_output((k, c, r, s), dtype, device)
    assert_layout(DW, dw_dev)

    pack[DW] = dw_dev
    build_and_execute(graph, pack, handle, device)
    check(dw_dev, dw_ref, dtype)


@pytest.mark.parametrize("dtype", [HALF, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", ["3x3_pad1_stride2", "3x3_pad1", "1x1"])
def test_wgrad(handle, dtype, case):
    sample_wgrad(handle, "cuda", dtype, case)


def test_scale_bias_relu_wgrad(handle):
    sample_wgrad(handle, "cuda", HALF, "3x3_pad1", prologue=True)


# -- 6. an NCHW fprop (fprop.cpp "CBR Graph NCHW": PyTorch's default layout, no conversion by the
#       user) and a 3D convolution on NDHWC tensors (fprop.cpp "Convolution fprop large",
#       test_conv_bias.py's conv3d) ---------------------------------------------------------------

def sample_conv_bias_relu_nchw(handle, device, dtype, seed=5):
    n, c, h, w, k = 2, 24, 15, 17, 32
    padding, stride = [1, 1], [1, 1]
    gen = torch.Generator().manual_seed(seed)
    x_dev = randn(gen, (n, c, h, w), dtype, device, channels_last=False)
    w_dev = randn(gen, (k, c, 3, 3), dtype, device, channels_last=False, scale=1 / math.sqrt(c * 9))
    b_dev = randn(gen, (1, k, 1, 1), dtype, device, channels_last=False, scale=0.5)
    assert x_dev.is_contiguous() and w_dev.is_contiguous()
    y_ref = torch.relu(F.conv2d(f32(x_dev), f32(w_dev), bias=f32(b_dev).reshape(-1), padding=padding, stride=stride))

    set_stream(handle, device)
    graph = new_graph(handle, dtype)
    X, W, B = graph.tensor_like(x_dev), graph.tensor_like(w_dev), graph.tensor_like(b_dev)
    conv = graph.conv_fprop(image=X, weight=W, padding=padding, stride=stride, dilation=[1, 1])
    Y = graph.relu(input=graph.bias(input=conv, bias=B))
    Y.set_output(True)
    graph.validate()
    # The output follows the image: NCHW, packed.
    y_dev = nan_output(y_ref.shape, dtype, device, channels_last=False)
    assert_layout(Y, y_dev)

    build_and_execute(graph, {X: x_dev, W: w_dev, B: b_dev, Y: y_dev}, handle, device)
    check(y_dev, y_ref, dtype)


@pytest.mark.parametrize("dtype", [HALF, FLOAT], ids=["fp16", "fp32"])
def test_conv_bias_relu_nchw(handle, dtype):
    sample_conv_bias_relu_nchw(handle, "cuda", dtype)


def sample_conv3d_bias_relu(handle, device, dtype, seed=6):
    n, c, d, h, w, k = 2, 16, 5, 9, 11, 24
    t, r, s = 3, 3, 3
    padding, stride, dilation = [1, 1, 0], [1, 2, 2], [1, 1, 1]
    gen = torch.Generator().manual_seed(seed)
    x_dev = randn(gen, (n, c, d, h, w), dtype, device)
    w_dev = randn(gen, (k, c, t, r, s), dtype, device, scale=1 / math.sqrt(c * t * r * s))
    b_dev = randn(gen, (1, k, 1, 1, 1), dtype, device, scale=0.5)
    assert x_dev.stride()[1] == 1  # NDHWC memory
    y_ref = torch.relu(F.conv3d(f32(x_dev), f32(w_dev), bias=f32(b_dev).reshape(-1), padding=padding, stride=stride, dilation=dilation))

    set_stream(handle, device)
    graph = new_graph(handle, dtype)
    X = graph.tensor_like(x_dev, name="X")
    W = graph.tensor_like(w_dev, name="W")
    B = graph.tensor_like(b_dev, name="B")
    conv = graph.conv_fprop(image=X, weight=W, padding=padding, stride=stride, dilation=dilation)
    Y = graph.relu(name="relu", input=graph.bias(name="bias", input=conv, bias=B))
    Y.set_output(True)
    graph.validate()
    y_dev = nan_output(y_ref.shape, dtype, device)
    assert_layout(Y, y_dev)

    build_and_execute(graph, {X: x_dev, W: w_dev, B: b_dev, Y: y_dev}, handle, device)
    check(y_dev, y_ref, dtype)


@pytest.mark.parametrize("dtype", [HALF, BF16], ids=["fp16", "bf16"])
def test_conv3d_bias_relu_ndhwc(handle, dtype):
    sample_conv3d_bias_relu(handle, "cuda", dtype)


# -- the same samples on the host (CPU engine, CPU tensors): not collected by pytest ------------

def _run_samples_on_host():
    """Every sample above on the CPU engine with host tensors: `python -c "import
    test_gpu_conv as t; t._run_samples_on_host()"` from python/tests checks the graphs, layouts
    and references without a GPU."""
    h = cudnn.create_cpu_handle()
    for dtype in (HALF, BF16):
        for case in CBR_CASES:
            sample_conv_bias_relu(h, "cpu", dtype, case)
        for prologue in (False, True):
            sample_conv_genstats(h, "cpu", dtype, prologue)
        for case in SBR_CASES:
            sample_scale_bias_relu_conv(h, "cpu", dtype, case)
        for case in DGRAD_CASES:
            for drelu in (True, False):
                sample_dgrad_drelu(h, "cpu", dtype, case, drelu=drelu)
        for case in WGRAD_CASES:
            for prologue in (False, True):
                sample_wgrad(h, "cpu", dtype, case, prologue=prologue)
        sample_conv3d_bias_relu(h, "cpu", dtype)
    for dtype in (HALF, FLOAT):
        sample_conv_bias_relu_nchw(h, "cpu", dtype)
