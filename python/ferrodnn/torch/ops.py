"""PyTorch ops that run ferrodnn graphs, registered with ``torch.library`` in the ``ferrodnn``
namespace (``torch.ops.ferrodnn.*``): each has a fake (meta) implementation, so ``torch.compile``
traces through it as one opaque op, and an autograd formula whose backward is another
``ferrodnn`` op running ferrodnn's backward graphs (conv_dgrad / conv_wgrad, the norms' backward
ops, sdpa_backward, matmuls).

The functions of this module are the public calls (PyTorch's argument names and defaults, plus
the fused options); they check their arguments, raising ``ValueError`` naming the op and the
argument for what ferrodnn does not run, and call the registered ops.

Each call builds its graph once per (op, options, shapes, strides, dtypes, device) and keeps it
in a process-wide cache (``ferrodnn.torch.GRAPH_CACHE_SIZE`` graphs, least recently used dropped
first). Outputs and workspaces are torch tensors from PyTorch's allocator on the inputs' device;
on CUDA the graphs run on PyTorch's current stream.
"""

import math
from typing import Optional, Sequence

import torch
from torch import Tensor

import ferrodnn as _fd

from ._common import Built, Eager, Graph, cached, fd_dtype, signature

__all__ = [
    "conv2d",
    "conv3d",
    "linear",
    "layer_norm",
    "rms_norm",
    "scaled_dot_product_attention",
    "batch_norm",
    "group_norm",
    "softmax",
    "max_pool2d",
    "avg_pool2d",
]

_ACTIVATIONS = {
    "none": (None, None),
    "relu": ("relu", "relu_backward"),
    "silu": ("swish", "swish_backward"),
    "gelu": ("gelu", "gelu_backward"),
    "gelu_tanh": ("gelu_approx_tanh", "gelu_approx_tanh_backward"),
}
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _empty(like):
    """The placeholder for an output a call does not produce."""
    return like.new_empty((0,))


def _activation(op, activation, allowed=tuple(_ACTIVATIONS)):
    name = "none" if activation is None else activation
    if name not in allowed:
        raise ValueError(f"ferrodnn.torch.{op}: activation must be one of {', '.join(repr(a) for a in allowed if a != 'none')} or None, got {activation!r}")
    return name


def _check_tensor(op, name, t, like=None, dim=None):
    if not isinstance(t, Tensor):
        raise TypeError(f"ferrodnn.torch.{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPES:
        raise ValueError(f"ferrodnn.torch.{op}: {name} must be float32, float16, bfloat16 or float64, got {t.dtype}")
    if like is not None and (t.dtype != like.dtype or t.device != like.device):
        raise ValueError(f"ferrodnn.torch.{op}: {name} must be {like.dtype} on {like.device} as the input, got {t.dtype} on {t.device}")
    if dim is not None and t.dim() not in (dim if isinstance(dim, tuple) else (dim,)):
        raise ValueError(f"ferrodnn.torch.{op}: {name} must be {dim}-D, got shape {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError(f"ferrodnn.torch.{op}: {name} must not be empty, got shape {tuple(t.shape)}")


def _check_shape(op, name, t, shape):
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"ferrodnn.torch.{op}: {name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


def _needs_grad(*tensors):
    return torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in tensors)


def _dense(t):
    """`t` itself when its memory is dense (contiguous in some dim order), else a contiguous copy."""
    if t is None or t.is_contiguous() or _channels_last(t):
        return t
    return t.contiguous()


_CL_FORMATS = {4: torch.channels_last, 5: torch.channels_last_3d}


def _channels_last(t):
    """Whether `t` is channels-last (and not also contiguous)."""
    fmt = _CL_FORMATS.get(t.dim())
    return fmt is not None and not t.is_contiguous() and t.is_contiguous(memory_format=fmt)


def _strides(dims, channels_last=False):
    """Row-major strides of `dims`, or channels-last ones ([N, C, *spatial] with C innermost)."""
    order = [0] + list(range(2, len(dims))) + [1] if channels_last else list(range(len(dims)))
    strides = [0] * len(dims)
    acc = 1
    for i in reversed(order):
        strides[i] = acc
        acc *= dims[i]
    return strides


def _fmt(t):
    return _CL_FORMATS[t.dim()] if _channels_last(t) else torch.contiguous_format


def _key(op, device, *parts):
    return (op, device) + tuple(signature(p) if isinstance(p, Tensor) or p is None else p for p in parts)


def _act(g, name, T):
    fwd = _ACTIVATIONS[name][0]
    return getattr(g.g, fwd)(input=T) if fwd else T


def _act_backward(g, name, DY, S):
    """The gradient of the activation's input, stored in the graph's io type as PyTorch stores
    it (an f32 intermediate beside 16-bit inputs would keep the norm backwards that read it off
    their fast kernels, which take one type for dy and x)."""
    bwd = _ACTIVATIONS[name][1]
    if not bwd:
        return DY
    return getattr(g.g, bwd)(loss=DY, input=S).set_data_type(fd_dtype(g.dtype))


def _need_stats(op, stats):
    if stats.numel() == 0:
        raise RuntimeError(f"ferrodnn.torch.{op}: backward of a call made with training=False (the op kept no statistics); call it with training=True when a gradient is needed")


def _saves_preact(activation):
    """Whether the backward of `activation` reads its input (the pre-activation) rather than its
    output (relu's gradient needs only y > 0)."""
    return activation not in ("none", "relu")


# -- convolution -----------------------------------------------------------------------------


def _conv_out_dims(x, w, stride, padding, dilation):
    spatial = [(x.shape[2 + i] + 2 * padding[i] - dilation[i] * (w.shape[2 + i] - 1) - 1) // stride[i] + 1 for i in range(x.dim() - 2)]
    return [x.shape[0], w.shape[0]] + spatial


@torch.library.custom_op("ferrodnn::conv", mutates_args=())
def _conv(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    residual: Optional[Tensor],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    activation: str,
    save_preact: bool,
) -> tuple[Tensor, Tensor]:
    x, weight, residual = _dense(x), _dense(weight), _dense(residual)
    cl = _channels_last(x)
    dims = _conv_out_dims(x, weight, stride, padding, dilation)
    strides = _strides(dims, cl)
    k = weight.shape[0]
    key = _key("conv", x.device, x, weight, bias, residual, tuple(stride), tuple(padding), tuple(dilation), activation, save_preact)

    def make():
        g = Graph(x.device, x.dtype)
        X, W = g.input(x), g.input(weight)
        ones = [1] * (x.dim() - 2)
        B = g.input(bias, [1, k] + ones, [k, 1] + ones) if bias is not None else g.input(None)
        R = g.input(residual)
        Z = g.g.conv_fprop(image=X, weight=W, pre_padding=list(padding), post_padding=list(padding), stride=list(stride), dilation=list(dilation))
        if B is not None:
            Z = g.g.add(Z, B)
        if R is not None:
            Z = g.g.add(Z, R)
        Y = _act(g, activation, Z)
        g.output(Y, dims, strides)
        if save_preact:
            g.output(Z, dims, strides)
        return Built(g)

    outs = cached(key, make).run(x.device, x, weight, bias, residual)
    return outs[0], (outs[1] if save_preact else _empty(x))


@_conv.register_fake
def _(x, weight, bias, residual, stride, padding, dilation, activation, save_preact):
    dims = _conv_out_dims(x, weight, stride, padding, dilation)
    y = x.new_empty(dims).contiguous(memory_format=_fmt(x))
    return y, (torch.empty_like(y) if save_preact else _empty(x))


@torch.library.custom_op("ferrodnn::conv_backward", mutates_args=())
def _conv_backward(
    grad: Tensor,
    x: Tensor,
    weight: Tensor,
    saved: Tensor,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    activation: str,
    need_x: bool,
    need_w: bool,
    need_b: bool,
    need_dz: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    x, weight = _dense(x), _dense(weight)
    cl = _channels_last(x)
    grad = grad.contiguous(memory_format=_fmt(x)) if cl else grad.contiguous()
    saved = saved.contiguous(memory_format=_fmt(x)) if activation != "none" else None
    need_dz = need_dz and activation != "none"
    k = weight.shape[0]
    key = _key("conv_backward", x.device, grad, x, weight, saved, tuple(stride), tuple(padding), tuple(dilation), activation, need_x, need_w, need_b, need_dz)
    conv = dict(pre_padding=list(padding), post_padding=list(padding), stride=list(stride), dilation=list(dilation))

    def make():
        g = Graph(x.device, x.dtype)
        DY, X, W, S = g.input(grad), g.input(x), g.input(weight), g.input(saved)
        DZ = _act_backward(g, activation, DY, S)
        if need_x:
            DX = g.g.conv_dgrad(loss=DZ, filter=W, **conv)
            g.output(DX, x.shape, _strides(list(x.shape), cl))
        if need_w:
            DW = g.g.conv_wgrad(image=X, loss=DZ, **conv)
            g.output(DW, weight.shape, weight.stride())
        if need_b:
            ones = [1] * (x.dim() - 2)
            DB = g.g.reduction(input=DZ, mode=_fd.reduction_mode.ADD, axes=[0] + list(range(2, x.dim())))
            g.output(DB, [1, k] + ones, [k, 1] + ones)
        if need_dz:
            g.output(DZ, grad.shape, grad.stride())
        return Built(g)

    outs = iter(cached(key, make).run(x.device, grad, x, weight, saved))
    dx = next(outs) if need_x else _empty(x)
    dw = next(outs) if need_w else _empty(x)
    db = next(outs).reshape(k) if need_b else _empty(x)
    dz = next(outs) if need_dz else _empty(x)
    return dx, dw, db, dz


@_conv_backward.register_fake
def _(grad, x, weight, saved, stride, padding, dilation, activation, need_x, need_w, need_b, need_dz):
    dx = x.new_empty(x.shape).contiguous(memory_format=_fmt(x)) if need_x else _empty(x)
    dw = torch.empty_strided(weight.shape, _dense_strides(weight), dtype=weight.dtype, device=weight.device) if need_w else _empty(x)
    db = x.new_empty((weight.shape[0],)) if need_b else _empty(x)
    dz = grad.new_empty(grad.shape).contiguous(memory_format=_fmt(x)) if need_dz and activation != "none" else _empty(x)
    return dx, dw, db, dz


def _dense_strides(t):
    return t.stride() if t.is_contiguous() or _channels_last(t) else _strides(list(t.shape))


def _conv_setup(ctx, inputs, output):
    x, weight, bias, residual, stride, padding, dilation, activation, save_preact = inputs
    y, z = output
    saved = {"none": None, "relu": y}.get(activation, z)
    ctx.save_for_backward(x, weight, saved)
    ctx.opts = (stride, padding, dilation, activation)
    # (The outputs a caller does not use get no zero-filled gradient: one allocation and fill
    # fewer a call on the host.)
    ctx.set_materialize_grads(False)


def _conv_grad(ctx, grad, _grad_z):
    if grad is None:
        return (None,) * 9
    x, weight, saved = ctx.saved_tensors
    stride, padding, dilation, activation = ctx.opts
    nx, nw, nb, nr = ctx.needs_input_grad[:4]
    saved = saved if saved is not None else _empty(x)
    if nx or nw or nb or (nr and activation != "none"):
        dx, dw, db, dz = _conv_backward_eager(grad, x, weight, saved, stride, padding, dilation, activation, nx, nw, nb, nr)
    else:  # only the residual, whose gradient is the output's
        dx = dw = db = dz = None
    dres = (dz if activation != "none" else grad) if nr else None
    return dx if nx else None, dw if nw else None, db if nb else None, dres, None, None, None, None, None


_conv.register_autograd(_conv_grad, setup_context=_conv_setup)
_conv_eager = Eager(_conv, (0, 1, 2, 3), _conv_setup, _conv_grad)
_conv_backward_eager = Eager(_conv_backward, (0, 1, 2, 3))


def _tuple(op, name, v, n):
    if isinstance(v, int):
        v = (v,) * n
    v = tuple(int(i) for i in v)
    if len(v) == 1:
        v = v * n
    if len(v) != n:
        raise ValueError(f"ferrodnn.torch.{op}: {name} must be an int or {n} ints, got {v}")
    return v


def _conv_nd(op, nd, x, weight, bias, stride, padding, dilation, groups, activation, residual):
    _check_tensor(op, "input", x, dim=nd + 2)
    _check_tensor(op, "weight", weight, x, dim=nd + 2)
    if isinstance(padding, str):
        if padding != "valid":
            raise ValueError(f"ferrodnn.torch.{op}: padding must be ints or 'valid', got {padding!r} (give 'same' as explicit padding)")
        padding = 0
    stride, padding, dilation = _tuple(op, "stride", stride, nd), _tuple(op, "padding", padding, nd), _tuple(op, "dilation", dilation, nd)
    if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        raise ValueError(f"ferrodnn.torch.{op}: stride and dilation must be >= 1 and padding >= 0, got stride={stride}, padding={padding}, dilation={dilation}")
    if groups < 1 or x.shape[1] != weight.shape[1] * groups or weight.shape[0] % groups:
        raise ValueError(f"ferrodnn.torch.{op}: groups={groups} does not fit input channels {x.shape[1]} and weight shape {tuple(weight.shape)} (input channels = weight.shape[1] * groups, out channels a multiple of groups)")
    if bias is not None:
        _check_tensor(op, "bias", bias, x)
        _check_shape(op, "bias", bias, (weight.shape[0],))
    dims = _conv_out_dims(x, weight, stride, padding, dilation)
    if min(dims[2:]) < 1:
        raise ValueError(f"ferrodnn.torch.{op}: the output would have no elements (shape {tuple(dims)}) for input {tuple(x.shape)} and weight {tuple(weight.shape)}")
    if residual is not None:
        _check_tensor(op, "residual", residual, x)
        _check_shape(op, "residual", residual, dims)
    act = _activation(op, activation)
    save = _saves_preact(act) and _needs_grad(x, weight, bias, residual)
    return _conv_eager(x, weight, bias, residual, list(stride), list(padding), list(dilation), act, save)[0]


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, activation=None, residual=None):
    """``torch.nn.functional.conv2d`` with an optional fused epilogue:
    ``activation(conv2d(input, weight) + bias + residual)``, activation one of "relu", "silu",
    "gelu", "gelu_tanh" or None, residual a tensor of the output's shape. A channels-last input
    gives a channels-last output. padding: ints or "valid"."""
    return _conv_nd("conv2d", 2, input, weight, bias, stride, padding, dilation, groups, activation, residual)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, activation=None, residual=None):
    """``torch.nn.functional.conv3d`` with the fused epilogue of :func:`conv2d`."""
    return _conv_nd("conv3d", 3, input, weight, bias, stride, padding, dilation, groups, activation, residual)


# -- linear ----------------------------------------------------------------------------------


def _rows(t):
    """`t` as a 2-D [rows, last dim] view (a contiguous copy when no view has that shape)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(1) == 1 else t2.contiguous()


@torch.library.custom_op("ferrodnn::linear", mutates_args=())
def _linear(x: Tensor, weight: Tensor, bias: Optional[Tensor], activation: str, save_preact: bool) -> tuple[Tensor, Tensor]:
    n, k = weight.shape
    x2 = _rows(x)
    m = x2.shape[0]
    y = x.new_empty(tuple(x.shape[:-1]) + (n,))
    z = x.new_empty(y.shape) if save_preact else _empty(x)
    key = _key("linear", x.device, x2, weight, bias, activation, save_preact)

    def make():
        g = Graph(x.device, x.dtype)
        X = g.input(x2)
        WT = g.input(weight, [k, n], [weight.stride(1), weight.stride(0)])
        B = g.input(bias, [1, n], [n, 1]) if bias is not None else g.input(None)
        Z = g.g.matmul(A=X, B=WT)
        if B is not None:
            Z = g.g.add(Z, B)
        g.output(_act(g, activation, Z), [m, n], [n, 1])
        if save_preact:
            g.output(Z, [m, n], [n, 1])
        return Built(g)

    cached(key, make).run(x.device, x2, weight, bias, out=[y, z if save_preact else None])
    return y, z


@_linear.register_fake
def _(x, weight, bias, activation, save_preact):
    y = x.new_empty(tuple(x.shape[:-1]) + (weight.shape[0],))
    return y, (torch.empty_like(y) if save_preact else _empty(x))


@torch.library.custom_op("ferrodnn::linear_backward", mutates_args=())
def _linear_backward(grad: Tensor, x: Tensor, weight: Tensor, saved: Tensor, activation: str, need_x: bool, need_w: bool, need_b: bool) -> tuple[Tensor, Tensor, Tensor]:
    n, k = weight.shape
    x2, g2 = _rows(x), grad.reshape(-1, n).contiguous()
    s2 = saved.reshape(-1, n).contiguous() if activation != "none" else None
    m = x2.shape[0]
    dx = x.new_empty(x.shape) if need_x else _empty(x)
    dw = weight.new_empty((n, k)) if need_w else _empty(x)
    db = x.new_empty((n,)) if need_b else _empty(x)
    key = _key("linear_backward", x.device, g2, x2, weight, s2, activation, need_x, need_w, need_b)

    def make():
        g = Graph(x.device, x.dtype)
        DY, X, W, S = g.input(g2), g.input(x2), g.input(weight), g.input(s2)
        DZ = _act_backward(g, activation, DY, S)
        if need_x:
            g.output(g.g.matmul(A=DZ, B=W), [m, k], [k, 1])
        if need_w:
            # dW^T = X^T @ dZ, written transposed: dW [n, k] row-major.
            XT = g.input(None, [k, m], [x2.stride(1), x2.stride(0)], x.dtype)
            g.output(g.g.matmul(A=XT, B=DZ), [k, n], [1, k])
        if need_b:
            g.output(g.g.reduction(input=DZ, mode=_fd.reduction_mode.ADD, axes=[0]), [1, n], [n, 1])
        return Built(g)

    extra = (x2,) if need_w else ()
    outs = [o for o, need in ((dx, need_x), (dw, need_w), (db, need_b)) if need]
    cached(key, make).run(x.device, g2, x2, weight, s2, *extra, out=outs)
    return dx, dw, db


@_linear_backward.register_fake
def _(grad, x, weight, saved, activation, need_x, need_w, need_b):
    return (
        x.new_empty(x.shape) if need_x else _empty(x),
        weight.new_empty(tuple(weight.shape)) if need_w else _empty(x),
        x.new_empty((weight.shape[0],)) if need_b else _empty(x),
    )


def _linear_setup(ctx, inputs, output):
    x, weight, bias, activation, save_preact = inputs
    y, z = output
    ctx.save_for_backward(x, weight, {"none": None, "relu": y}.get(activation, z))
    ctx.activation = activation
    ctx.set_materialize_grads(False)


def _linear_grad(ctx, grad, _grad_z):
    if grad is None:
        return (None,) * 5
    x, weight, saved = ctx.saved_tensors
    nx, nw, nb = ctx.needs_input_grad[:3]
    saved = saved if saved is not None else _empty(x)
    dx, dw, db = _linear_backward_eager(grad, x, weight, saved, ctx.activation, nx, nw, nb)
    return dx if nx else None, dw if nw else None, db if nb else None, None, None


_linear.register_autograd(_linear_grad, setup_context=_linear_setup)
_linear_eager = Eager(_linear, (0, 1, 2), _linear_setup, _linear_grad)
_linear_backward_eager = Eager(_linear_backward, (0, 1, 2, 3))


def linear(input, weight, bias=None, activation=None):
    """``torch.nn.functional.linear`` (``input @ weight.T + bias``, input ``[..., in]``) with an
    optional fused activation ("relu", "silu", "gelu", "gelu_tanh")."""
    op = "linear"
    _check_tensor(op, "input", input)
    _check_tensor(op, "weight", weight, input, dim=2)
    if input.dim() < 1 or input.shape[-1] != weight.shape[1]:
        raise ValueError(f"ferrodnn.torch.{op}: input's last dim must be weight.shape[1] = {weight.shape[1]}, got input shape {tuple(input.shape)}")
    if bias is not None:
        _check_tensor(op, "bias", bias, input)
        _check_shape(op, "bias", bias, (weight.shape[0],))
    act = _activation(op, activation)
    save = _saves_preact(act) and _needs_grad(input, weight, bias)
    return _linear_eager(input, weight, bias, act, save)[0]


# -- layer_norm, rms_norm --------------------------------------------------------------------


def _norm_rows(op, x, normalized_shape, weight, bias, residual):
    _check_tensor(op, "input", x)
    normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    nd = len(normalized_shape)
    if nd < 1 or nd > x.dim() or tuple(x.shape[x.dim() - nd :]) != normalized_shape:
        raise ValueError(f"ferrodnn.torch.{op}: normalized_shape {normalized_shape} must be the input's last dims, got input shape {tuple(x.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            _check_tensor(op, name, t, x)
            _check_shape(op, name, t, normalized_shape)
    if residual is not None:
        _check_tensor(op, "residual", residual, x)
        _check_shape(op, "residual", residual, x.shape)
    return nd


def _norm_forward(op, x, weight, bias, residual, nd, eps, training):
    """layernorm / rmsnorm of x (+ residual) over its last `nd` dims: (y, sum, mean, rstd)."""
    d = math.prod(x.shape[x.dim() - nd :])
    x2 = x.reshape(-1, d).contiguous()
    r2 = residual.reshape(-1, d).contiguous() if residual is not None else None
    m = x2.shape[0]
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = x.new_empty(x.shape)
    s = x.new_empty(x.shape) if residual is not None else _empty(x)
    mean = x.new_empty((m, 1), dtype=wide) if training and op == "layer_norm" else _empty(x)
    rstd = x.new_empty((m, 1), dtype=wide) if training else _empty(x)
    weight = weight.contiguous() if weight is not None else None
    bias = bias.contiguous() if bias is not None else None
    key = _key(op, x.device, x2, weight, bias, r2, eps, training)

    def make():
        g = Graph(x.device, x.dtype)
        X, R = g.input(x2), g.input(r2)
        S = g.input(weight, [1, d], [d, 1]) if weight is not None else g.input(None)
        B = g.input(bias, [1, d], [d, 1]) if bias is not None else g.input(None)
        if S is None:
            S = g.input(None, [1, d], [d, 1], x.dtype)
        if B is None and op == "layer_norm":
            B = g.input(None, [1, d], [d, 1], x.dtype)
        if R is not None:
            X = g.g.add(X, R)
            g.output(X, [m, d], [d, 1])
        phase = _fd.norm_forward_phase.TRAINING if training else _fd.norm_forward_phase.INFERENCE
        if op == "layer_norm":
            Y, M, V = g.g.layernorm(norm_forward_phase=phase, input=X, scale=S, bias=B, epsilon=eps)
        else:
            Y, V = g.g.rmsnorm(norm_forward_phase=phase, input=X, scale=S, bias=B, epsilon=eps)
            M = None
        g.output(Y, [m, d], [d, 1])
        if training:
            if M is not None:
                g.output(M, [m, 1], [1, 1], wide)
            g.output(V, [m, 1], [1, 1], wide)
        return Built(g)

    built = cached(key, make)
    ins = [x2, r2, weight, bias]
    if weight is None:
        ins.append(x.new_ones((1, d)))
    if bias is None and op == "layer_norm":
        ins.append(x.new_zeros((1, d)))
    outs = [s if residual is not None else None, y] + ([mean] if training and op == "layer_norm" else []) + ([rstd] if training else [])
    built.run(x.device, *ins, out=[o for o in outs if o is not None])
    return y, s, mean, rstd


def _norm_fake(op, x, residual, nd, training):
    m = math.prod(x.shape[: x.dim() - nd])
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = x.new_empty(x.shape)
    s = x.new_empty(x.shape) if residual is not None else _empty(x)
    mean = x.new_empty((m, 1), dtype=wide) if training and op == "layer_norm" else _empty(x)
    rstd = x.new_empty((m, 1), dtype=wide) if training else _empty(x)
    return y, s, mean, rstd


@torch.library.custom_op("ferrodnn::layer_norm", mutates_args=())
def _layer_norm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], residual: Optional[Tensor], nd: int, eps: float, training: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _norm_forward("layer_norm", x, weight, bias, residual, nd, eps, training)


@_layer_norm.register_fake
def _(x, weight, bias, residual, nd, eps, training):
    return _norm_fake("layer_norm", x, residual, nd, training)


@torch.library.custom_op("ferrodnn::rms_norm", mutates_args=())
def _rms_norm(x: Tensor, weight: Optional[Tensor], residual: Optional[Tensor], nd: int, eps: float, training: bool) -> tuple[Tensor, Tensor, Tensor]:
    y, s, _, rstd = _norm_forward("rms_norm", x, weight, None, residual, nd, eps, training)
    return y, s, rstd


@_rms_norm.register_fake
def _(x, weight, residual, nd, eps, training):
    y, s, _, rstd = _norm_fake("rms_norm", x, residual, nd, training)
    return y, s, rstd


@torch.library.custom_op("ferrodnn::norm_backward", mutates_args=())
def _norm_backward(
    grad: Tensor, grad_sum: Optional[Tensor], x: Tensor, weight: Optional[Tensor], mean: Optional[Tensor], rstd: Tensor, nd: int, need_w: bool, need_b: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """The backward of layer_norm (mean given) or rms_norm (mean None): dx (+ grad_sum, the
    gradient of the residual sum), dweight, dbias."""
    op = "layer_norm" if mean is not None else "rms_norm"
    d = math.prod(x.shape[x.dim() - nd :])
    x2, g2 = x.reshape(-1, d).contiguous(), grad.reshape(-1, d).contiguous()
    gs2 = grad_sum.reshape(-1, d).contiguous() if grad_sum is not None else None
    m = x2.shape[0]
    dx = x.new_empty(x.shape)
    dw = x.new_empty(weight.shape) if need_w else _empty(x)
    db = x.new_empty(weight.shape) if need_b else _empty(x)
    w = weight.contiguous() if weight is not None else x.new_ones((1, d))
    key = _key(op + "_backward", x.device, g2, gs2, x2, w, mean, rstd, need_w, need_b)

    def make():
        g = Graph(x.device, x.dtype)
        DY, GS, X, M, V = g.input(g2), g.input(gs2), g.input(x2), g.input(mean), g.input(rstd)
        S = g.input(w, [1, d], [d, 1])
        if op == "layer_norm":
            DX, DS, DB = g.g.layernorm_backward(grad=DY, input=X, scale=S, mean=M, inv_variance=V)
        else:
            DX, DS, DB = g.g.rmsnorm_backward(grad=DY, input=X, scale=S, inv_variance=V, has_dbias=False)
        if GS is not None:
            DX = g.g.add(DX, GS)
        g.output(DX, [m, d], [d, 1])
        if need_w:
            g.output(DS, [1, d], [d, 1])
        if need_b:
            g.output(DB, [1, d], [d, 1])
        return Built(g)

    outs = [o for o, need in ((dx, True), (dw, need_w), (db, need_b)) if need]
    cached(key, make).run(x.device, g2, gs2, x2, mean, rstd, w, out=outs)
    return dx, dw, db


@_norm_backward.register_fake
def _(grad, grad_sum, x, weight, mean, rstd, nd, need_w, need_b):
    return (x.new_empty(x.shape), x.new_empty(weight.shape) if need_w else _empty(x), x.new_empty(weight.shape) if need_b else _empty(x))


def _norm_setup(ctx, inputs, output):
    if len(inputs) == 7:  # layer_norm
        x, weight, bias, residual, nd, eps, training = inputs
        y, s, mean, rstd = output
    else:
        x, weight, residual, nd, eps, training = inputs
        y, s, rstd = output
        mean = None
    ctx.layer = len(inputs) == 7
    ctx.has_residual = residual is not None
    ctx.nd = nd
    ctx.save_for_backward(s if residual is not None else x, weight, mean, rstd)
    ctx.set_materialize_grads(False)


def _norm_grad(ctx, grad, grad_sum, *_stats):
    if grad is None and grad_sum is None:
        return (None,) * (7 if ctx.layer else 6)
    x, weight, mean, rstd = ctx.saved_tensors
    if grad is None:  # only the residual sum is read on: y's gradient is zero
        grad = torch.zeros_like(x)
    _need_stats("layer_norm" if ctx.layer else "rms_norm", rstd)
    need = ctx.needs_input_grad
    nw = need[1] and weight is not None
    nb = ctx.layer and need[2]
    dx, dw, db = _norm_backward_eager(grad, grad_sum if ctx.has_residual else None, x, weight, mean, rstd, ctx.nd, nw, nb)
    dres = dx if ctx.has_residual and need[3 if ctx.layer else 2] else None
    if ctx.layer:
        return dx, dw if nw else None, db if nb else None, dres, None, None, None
    return dx, dw if nw else None, dres, None, None, None


_layer_norm.register_autograd(_norm_grad, setup_context=_norm_setup)
_rms_norm.register_autograd(_norm_grad, setup_context=_norm_setup)
_layer_norm_eager = Eager(_layer_norm, (0, 1, 2, 3), _norm_setup, _norm_grad)
_rms_norm_eager = Eager(_rms_norm, (0, 1, 2), _norm_setup, _norm_grad)
_norm_backward_eager = Eager(_norm_backward, (0, 1, 2, 3, 4, 5))


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, residual=None):
    """``torch.nn.functional.layer_norm``; with ``residual`` the norm is of ``input + residual``
    and the call returns ``(y, input + residual)`` (a pre-norm transformer block's two
    results)."""
    nd = _norm_rows("layer_norm", input, normalized_shape, weight, bias, residual)
    training = _needs_grad(input, weight, bias, residual)
    y, s, _, _ = _layer_norm_eager(input, weight, bias, residual, nd, float(eps), training)
    return (y, s) if residual is not None else y


def rms_norm(input, normalized_shape, weight=None, eps=None, residual=None):
    """``torch.nn.functional.rms_norm`` (eps None: the dtype's machine epsilon, as PyTorch); with
    ``residual``, the norm of ``input + residual`` and ``(y, input + residual)``."""
    nd = _norm_rows("rms_norm", input, normalized_shape, weight, None, residual)
    eps = torch.finfo(input.dtype).eps if eps is None else float(eps)
    training = _needs_grad(input, weight, residual)
    y, s, _ = _rms_norm_eager(input, weight, residual, nd, eps, training)
    return (y, s) if residual is not None else y


# -- batch_norm, group_norm ------------------------------------------------------------------


def _channel_view(t, x):
    """Dims and strides of a per-channel vector `t` ([C]) seen as [1, C, 1, ...] for `x`."""
    ones = [1] * (x.dim() - 2)
    return [1, t.shape[0]] + ones, [t.shape[0], t.stride(0)] + ones


def _check_param(op, name, t, x, shape):
    """A parameter of x's dtype, or float32 beside a float16 / bfloat16 input (as autocast
    leaves a norm's parameters)."""
    _check_tensor(op, name, t)
    ok = t.dtype == x.dtype or (t.dtype == torch.float32 and x.dtype in (torch.float16, torch.bfloat16))
    if not ok or t.device != x.device:
        raise ValueError(f"ferrodnn.torch.{op}: {name} must be {x.dtype} (or float32 beside a 16-bit input) on {x.device}, got {t.dtype} on {t.device}")
    _check_shape(op, name, t, shape)


def _param(x, t, fill, c):
    """`t`, or a [C] tensor of `fill` for an absent affine parameter."""
    return t if t is not None else torch.full((c,), fill, dtype=x.dtype, device=x.device)


def _channel_grads_fake(x, weight, need_x, need_wb):
    """The fake (dx, dweight, dbias) of a per-channel norm's backward."""
    dx = torch.empty_strided(x.shape, _dense_strides(x), dtype=x.dtype, device=x.device) if need_x else _empty(x)
    pdt = weight.dtype if weight is not None else x.dtype
    c = x.shape[1]
    return (dx,) + ((x.new_empty((c,), dtype=pdt), x.new_empty((c,), dtype=pdt)) if need_wb else (_empty(x), _empty(x)))


_bump_version = getattr(torch.autograd.graph, "increment_version", lambda t: None)


def _plus_residual(g, Y, residual):
    """`Y + residual` in graph `g` (the residual an input made from the tensor), or `Y` itself
    (with a None input in its place) when there is none."""
    R = g.input(residual)
    return g.g.add(Y, R) if R is not None else Y


@torch.library.custom_op("ferrodnn::batch_norm", mutates_args=())
def _batch_norm(
    x: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    running_mean: Optional[Tensor],
    running_var: Optional[Tensor],
    residual: Optional[Tensor],
    training: bool,
    momentum: float,
    eps: float,
    activation: str,
    save_preact: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """y = activation(batchnorm(x) + residual), its pre-activation (when `save_preact`), the
    batch's mean and 1 / sqrt(var + eps) (training) or the running ones, and the next running
    statistics (training with running statistics; the caller copies them in: an op with
    autograd cannot mutate its inputs)."""
    return _batch_norm_impl(x, weight, bias, running_mean, running_var, residual, training, momentum, eps, activation, save_preact, False)


def _batch_norm_in_place(*args):
    """`_batch_norm` writing the next running statistics into `running_mean` and `running_var`
    themselves (None in their places among the results): the eager call's implementation (see
    `Eager`), which saves the caller two copies (a device-to-device memcpy each on CUDA) and two
    allocations a call. The graph reads each running statistic and writes its update in the same
    buffer: on the CPU the binding reads an input that shares memory with an output from a copy
    taken before the plan runs; the CUDA kernels read channel c's running value and store its
    update in the same thread, one channel after the other (a read before the write of the same
    element, no other thread touching it)."""
    return _batch_norm_impl(*args, True)


def _batch_norm_impl(x, weight, bias, running_mean, running_var, residual, training, momentum, eps, activation, save_preact, in_place):
    x = _dense(x)
    c = x.shape[1]
    w, b = _param(x, weight, 1.0, c), _param(x, bias, 0.0, c)
    residual = residual.contiguous(memory_format=_fmt(x)) if residual is not None else None
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = torch.empty_like(x)
    z = torch.empty_like(x) if save_preact else _empty(x)
    cdims, cstrides = [1, c] + [1] * (x.dim() - 2), [c] + [1] * (x.dim() - 1)
    running = running_mean is not None
    if in_place:  # (no placeholders: the eager call's results are not the op's schema)
        new_rm = new_rv = None
    else:
        new_rm = torch.empty_like(running_mean) if training and running else _empty(x)
        new_rv = torch.empty_like(running_var) if training and running else _empty(x)
    if training:
        mean, inv = x.new_empty((c,), dtype=wide), x.new_empty((c,), dtype=wide)
        key = _key("batch_norm", x.device, x, w, b, running_mean, running_var, residual, activation, save_preact)

        def make():
            g = Graph(x.device, x.dtype)
            X, S, B = g.input(x), g.input(w, *_channel_view(w, x)), g.input(b, *_channel_view(b, x))
            RM = g.input(running_mean, *_channel_view(running_mean, x)) if running else g.input(None)
            RV = g.input(running_var, *_channel_view(running_var, x)) if running else g.input(None)
            EPS, MOM = g.scalar(), g.scalar()
            Y, M, V, NM, NV = g.g.batchnorm(input=X, scale=S, bias=B, in_running_mean=RM, in_running_var=RV, epsilon=EPS, momentum=MOM)
            Z = _plus_residual(g, Y, residual)
            g.output(_act(g, activation, Z), x.shape, x.stride())
            if save_preact:
                g.output(Z, x.shape, x.stride())
            g.output(M, cdims, cstrides, wide)
            g.output(V, cdims, cstrides, wide)
            if running:
                g.output(NM, *_channel_view(running_mean, x), running_mean.dtype)
                g.output(NV, *_channel_view(running_var, x), running_var.dtype)
            return Built(g)

        outs = [y] + ([z] if save_preact else []) + [mean, inv] + (([running_mean, running_var] if in_place else [new_rm, new_rv]) if running else [])
        cached(key, make).run(x.device, x, w, b, running_mean, running_var, eps, momentum, residual, out=outs)
        if in_place and running:
            # (As an in-place op of PyTorch's would: autograd sees the buffers changed.)
            _bump_version(running_mean)
            _bump_version(running_var)
        return y, z, mean, inv, new_rm, new_rv
    # Inference: the running statistics, as mean and 1 / sqrt(var + eps).
    mean = running_mean.to(wide, copy=True)
    inv = torch.rsqrt(running_var.to(wide) + eps)
    key = _key("batch_norm_inference", x.device, x, w, b, mean, inv, residual, activation, save_preact)

    def make():
        g = Graph(x.device, x.dtype)
        X, S, B = g.input(x), g.input(w, *_channel_view(w, x)), g.input(b, *_channel_view(b, x))
        M, V = g.input(mean, *_channel_view(mean, x)), g.input(inv, *_channel_view(inv, x))
        Y = g.g.batchnorm_inference(input=X, mean=M, inv_variance=V, scale=S, bias=B)
        Z = _plus_residual(g, Y, residual)
        g.output(_act(g, activation, Z), x.shape, x.stride())
        if save_preact:
            g.output(Z, x.shape, x.stride())
        return Built(g)

    cached(key, make).run(x.device, x, w, b, mean, inv, residual, out=[y, z] if save_preact else [y])
    return y, z, mean, inv, new_rm, new_rv


@_batch_norm.register_fake
def _(x, weight, bias, running_mean, running_var, residual, training, momentum, eps, activation, save_preact):
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = torch.empty_strided(x.shape, _dense_strides(x), dtype=x.dtype, device=x.device)
    running = training and running_mean is not None
    new_rm = torch.empty_like(running_mean) if running else _empty(x)
    new_rv = torch.empty_like(running_var) if running else _empty(x)
    z = torch.empty_like(y) if save_preact else _empty(x)
    return y, z, x.new_empty((x.shape[1],), dtype=wide), x.new_empty((x.shape[1],), dtype=wide), new_rm, new_rv


@torch.library.custom_op("ferrodnn::batch_norm_backward", mutates_args=())
def _batch_norm_backward(
    grad: Tensor, x: Tensor, weight: Optional[Tensor], saved: Tensor, mean: Tensor, inv: Tensor, training: bool, activation: str, need_x: bool, need_wb: bool, need_dz: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """dx, dweight, dbias and (`need_dz`: the residual's gradient) the gradient of the
    activation's input, from `saved` (the output for relu, else the pre-activation)."""
    x = _dense(x)
    fmt = _fmt(x)
    grad = grad.contiguous(memory_format=fmt)
    saved = saved.contiguous(memory_format=fmt) if activation != "none" else None
    need_dz = need_dz and activation != "none"
    c = x.shape[1]
    w = _param(x, weight, 1.0, c)
    pdt = w.dtype
    dx = torch.empty_like(x) if need_x else _empty(x)
    dw, db = (w.new_empty((c,)), w.new_empty((c,))) if need_wb else (_empty(x), _empty(x))
    dz = torch.empty_like(grad) if need_dz else _empty(x)
    outs = [o for o, n in ((dx, need_x), (dw, need_wb), (db, need_wb), (dz, need_dz)) if n]
    axes = [0] + list(range(2, x.dim()))
    if training:
        key = _key("batch_norm_backward", x.device, grad, x, w, saved, mean, inv, activation, need_x, need_wb, need_dz)

        def make():
            g = Graph(x.device, x.dtype)
            DY, X, S, SV = g.input(grad), g.input(x), g.input(w, *_channel_view(w, x)), g.input(saved)
            M, V = g.input(mean, *_channel_view(mean, x)), g.input(inv, *_channel_view(inv, x))
            DZ = _act_backward(g, activation, DY, SV)
            if need_x or need_wb:
                DX, DS, DB = g.g.batchnorm_backward(grad=DZ, input=X, scale=S, mean=M, inv_variance=V)
                if need_x:
                    g.output(DX, x.shape, x.stride())
                if need_wb:
                    g.output(DS, *_channel_view(w, x), pdt)
                    g.output(DB, *_channel_view(w, x), pdt)
            if need_dz:
                g.output(DZ, grad.shape, grad.stride())
            return Built(g)

        cached(key, make).run(x.device, grad, x, w, saved, mean, inv, out=outs)
        return dx, dw, db, dz
    # Inference statistics are constants: dx = dz * w * inv, dw = sum(dz * (x - mean) * inv),
    # db = sum(dz).
    winv = (w.to(inv.dtype) * inv).contiguous()
    key = _key("batch_norm_backward_inference", x.device, grad, x, winv, saved, mean, inv, activation, need_x, need_wb, need_dz)

    def make():
        g = Graph(x.device, x.dtype)
        DY, X, SV = g.input(grad), g.input(x), g.input(saved)
        WI, M, V = g.input(winv, *_channel_view(winv, x)), g.input(mean, *_channel_view(mean, x)), g.input(inv, *_channel_view(inv, x))
        DZ = _act_backward(g, activation, DY, SV)
        if need_x:
            g.output(g.g.mul(DZ, WI), x.shape, x.stride())
        if need_wb:
            xhat = g.g.mul(g.g.sub(X, M), V)
            g.output(g.g.reduction(input=g.g.mul(DZ, xhat), mode=_fd.reduction_mode.ADD, axes=axes), *_channel_view(w, x), pdt)
            g.output(g.g.reduction(input=DZ, mode=_fd.reduction_mode.ADD, axes=axes), *_channel_view(w, x), pdt)
        if need_dz:
            g.output(DZ, grad.shape, grad.stride())
        return Built(g)

    cached(key, make).run(x.device, grad, x, saved, winv, mean, inv, out=outs)
    return dx, dw, db, dz


@_batch_norm_backward.register_fake
def _(grad, x, weight, saved, mean, inv, training, activation, need_x, need_wb, need_dz):
    dz = grad.new_empty(grad.shape).contiguous(memory_format=_fmt(x)) if need_dz and activation != "none" else _empty(x)
    return _channel_grads_fake(x, weight, need_x, need_wb) + (dz,)


def _batch_norm_setup(ctx, inputs, output):
    x, weight, bias, running_mean, running_var, residual, training, momentum, eps, activation, save_preact = inputs
    y, z, mean, inv, _, _ = output
    ctx.save_for_backward(x, weight, {"none": None, "relu": y}.get(activation, z), mean, inv)
    ctx.opts = (training, activation)
    # (No zero-filled gradients for the statistics and placeholders, which no loss reads.)
    ctx.set_materialize_grads(False)


def _batch_norm_grad(ctx, grad, *_rest):
    if grad is None:
        return (None,) * 11
    x, weight, saved, mean, inv = ctx.saved_tensors
    training, activation = ctx.opts
    need = ctx.needs_input_grad
    nx, nr = need[0], need[5]
    nwb = (need[1] or need[2]) and weight is not None
    saved = saved if saved is not None else _empty(x)
    if nx or nwb or (nr and activation != "none"):
        dx, dw, db, dz = _batch_norm_backward_eager(grad, x, weight, saved, mean, inv, training, activation, nx, nwb, nr)
    else:  # only the residual, whose gradient is the output's
        dx = dw = db = dz = None
    dres = (dz if activation != "none" else grad) if nr else None
    return dx if nx else None, dw if nwb and need[1] else None, db if nwb and need[2] else None, None, None, dres, None, None, None, None, None


_batch_norm.register_autograd(_batch_norm_grad, setup_context=_batch_norm_setup)
_batch_norm_eager = Eager(_batch_norm, (0, 1, 2, 3, 4, 5), _batch_norm_setup, _batch_norm_grad, impl=_batch_norm_in_place)
_batch_norm_backward_eager = Eager(_batch_norm_backward, (0, 1, 2, 3, 4, 5))


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5, activation=None, residual=None):
    """``torch.nn.functional.batch_norm`` on ``[N, C, H, W]`` or ``[N, C, D, H, W]`` input (either
    memory format): in training, batch statistics and (when given) the running statistics
    updated in place with ``momentum`` (PyTorch's unbiased variance); else the running ones.
    Optional fused epilogue: ``activation(batch_norm(input) + residual)``, activation "relu",
    "silu" or None, residual a tensor of the input's shape (a ResNet block's last norm, the
    shortcut add and the ReLU in one call)."""
    op = "batch_norm"
    _check_tensor(op, "input", input, dim=(4, 5))
    c = input.shape[1]
    for name, t in (("weight", weight), ("bias", bias), ("running_mean", running_mean), ("running_var", running_var)):
        if t is not None:
            _check_param(op, name, t, input, (c,))
    if residual is not None:
        _check_tensor(op, "residual", residual, input)
        _check_shape(op, "residual", residual, input.shape)
    if (running_mean is None) != (running_var is None):
        raise ValueError(f"ferrodnn.torch.{op}: give both running_mean and running_var, or neither")
    if not training and running_mean is None:
        raise ValueError(f"ferrodnn.torch.{op}: inference (training=False) needs running_mean and running_var")
    if momentum is None:
        raise ValueError(f"ferrodnn.torch.{op}: momentum must be a number (the modules pass 1 / num_batches_tracked for a cumulative average)")
    if training and input.numel() // c < 2:
        raise ValueError(f"ferrodnn.torch.{op}: training needs more than one value per channel, got input shape {tuple(input.shape)}")
    act = _activation(op, activation, ("none", "relu", "silu"))
    save = _saves_preact(act) and _needs_grad(input, weight, bias, residual)
    y, _, _, _, new_rm, new_rv = _batch_norm_eager(input, weight, bias, running_mean, running_var, residual, bool(training), float(momentum), float(eps), act, save)
    # (An eager call wrote the running statistics in place, returning None for them.)
    if training and running_mean is not None and new_rm is not None:
        with torch.no_grad():
            running_mean.copy_(new_rm)
            running_var.copy_(new_rv)
    return y


@torch.library.custom_op("ferrodnn::group_norm", mutates_args=())
def _group_norm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], groups: int, eps: float, activation: str, training: bool, save_preact: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    x = _dense(x)
    c = x.shape[1]
    w, b = _param(x, weight, 1.0, c), _param(x, bias, 0.0, c)
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    sdims = [x.shape[0], groups] + [1] * (x.dim() - 2)
    y = torch.empty_like(x)
    z = torch.empty_like(x) if save_preact else _empty(x)
    mean, inv = (x.new_empty(sdims, dtype=wide), x.new_empty(sdims, dtype=wide)) if training else (_empty(x), _empty(x))
    key = _key("group_norm", x.device, x, w, b, groups, eps, activation, training, save_preact)

    def make():
        g = Graph(x.device, x.dtype)
        X, S, B = g.input(x), g.input(w, *_channel_view(w, x)), g.input(b, *_channel_view(b, x))
        phase = _fd.norm_forward_phase.TRAINING if training else _fd.norm_forward_phase.INFERENCE
        Z, M, V = g.g.group_norm(input=X, scale=S, bias=B, epsilon=eps, groups=groups, norm_forward_phase=phase)
        g.output(_act(g, activation, Z), x.shape, x.stride())
        if save_preact:
            g.output(Z, x.shape, x.stride())
        if training:
            g.output(M, sdims, _strides(sdims), wide)
            g.output(V, sdims, _strides(sdims), wide)
        return Built(g)

    outs = [y] + ([z] if save_preact else []) + ([mean, inv] if training else [])
    cached(key, make).run(x.device, x, w, b, out=outs)
    return y, z, mean, inv


@_group_norm.register_fake
def _(x, weight, bias, groups, eps, activation, training, save_preact):
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = torch.empty_strided(x.shape, _dense_strides(x), dtype=x.dtype, device=x.device)
    sdims = [x.shape[0], groups] + [1] * (x.dim() - 2)
    stats = (x.new_empty(sdims, dtype=wide), x.new_empty(sdims, dtype=wide)) if training else (_empty(x), _empty(x))
    return (y, torch.empty_like(y) if save_preact else _empty(x)) + stats


@torch.library.custom_op("ferrodnn::group_norm_backward", mutates_args=())
def _group_norm_backward(
    grad: Tensor, x: Tensor, weight: Optional[Tensor], saved: Tensor, mean: Tensor, inv: Tensor, groups: int, activation: str, need_x: bool, need_wb: bool
) -> tuple[Tensor, Tensor, Tensor]:
    x = _dense(x)
    fmt = _fmt(x)
    grad = grad.contiguous(memory_format=fmt)
    saved = saved.contiguous(memory_format=fmt) if activation != "none" else None
    c = x.shape[1]
    w = _param(x, weight, 1.0, c)
    dx = torch.empty_like(x) if need_x else _empty(x)
    dw, db = (w.new_empty((c,)), w.new_empty((c,))) if need_wb else (_empty(x), _empty(x))
    key = _key("group_norm_backward", x.device, grad, x, w, saved, mean, inv, groups, activation, need_x, need_wb)

    def make():
        g = Graph(x.device, x.dtype)
        DY, X, S, SV, M, V = g.input(grad), g.input(x), g.input(w, *_channel_view(w, x)), g.input(saved), g.input(mean), g.input(inv)
        DZ = _act_backward(g, activation, DY, SV)
        DX, DS, DB = g.g.group_norm_backward(grad=DZ, input=X, scale=S, mean=M, inv_variance=V, groups=groups)
        if need_x:
            g.output(DX, x.shape, x.stride())
        if need_wb:
            g.output(DS, *_channel_view(w, x), w.dtype)
            g.output(DB, *_channel_view(w, x), w.dtype)
        return Built(g)

    cached(key, make).run(x.device, grad, x, w, saved, mean, inv, out=[o for o, n in ((dx, need_x), (dw, need_wb), (db, need_wb)) if n])
    return dx, dw, db


@_group_norm_backward.register_fake
def _(grad, x, weight, saved, mean, inv, groups, activation, need_x, need_wb):
    return _channel_grads_fake(x, weight, need_x, need_wb)


def _group_norm_setup(ctx, inputs, output):
    x, weight, bias, groups, eps, activation, training, save_preact = inputs
    y, z, mean, inv = output
    ctx.save_for_backward(x, weight, {"none": None, "relu": y}.get(activation, z), mean, inv)
    ctx.opts = (groups, activation)


def _group_norm_grad(ctx, grad, _gz, _gm, _gi):
    x, weight, saved, mean, inv = ctx.saved_tensors
    _need_stats("group_norm", inv)
    groups, activation = ctx.opts
    need = ctx.needs_input_grad
    nwb = need[1] or need[2]
    saved = saved if saved is not None else _empty(x)
    dx, dw, db = _group_norm_backward_eager(grad, x, weight, saved, mean, inv, groups, activation, need[0], nwb)
    return dx if need[0] else None, dw if need[1] else None, db if need[2] else None, None, None, None, None, None


_group_norm.register_autograd(_group_norm_grad, setup_context=_group_norm_setup)
_group_norm_eager = Eager(_group_norm, (0, 1, 2), _group_norm_setup, _group_norm_grad)
_group_norm_backward_eager = Eager(_group_norm_backward, (0, 1, 2, 3, 4, 5))


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5, activation=None):
    """``torch.nn.functional.group_norm`` (input ``[N, C, ...]``, either memory format) with an
    optional fused activation ("relu", "silu")."""
    op = "group_norm"
    _check_tensor(op, "input", input, dim=(3, 4, 5))
    c = input.shape[1]
    if num_groups < 1 or c % num_groups:
        raise ValueError(f"ferrodnn.torch.{op}: num_groups={num_groups} must divide the {c} channels")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            _check_param(op, name, t, input, (c,))
    act = _activation(op, activation, ("none", "relu", "silu"))
    grad = _needs_grad(input, weight, bias)
    return _group_norm_eager(input, weight, bias, int(num_groups), float(eps), act, grad, grad and _saves_preact(act))[0]


# -- scaled_dot_product_attention ------------------------------------------------------------


def _sdpa_graph(g, q, k, v, bias, causal, scale):
    Q, K, V = g.input(q), g.input(k), g.input(v)
    B = g.input(bias)
    return Q, K, V, dict(attn_scale=scale, bias=B, use_causal_mask=causal)


@torch.library.custom_op("ferrodnn::sdpa", mutates_args=())
def _sdpa(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], causal: bool, scale: float, training: bool) -> tuple[Tensor, Tensor]:
    b, h, sq, _ = q.shape
    dv = v.shape[3]
    wide = torch.float64 if q.dtype == torch.float64 else torch.float32
    o = q.new_empty((b, h, sq, dv))
    stats = q.new_empty((b, h, sq, 1), dtype=wide) if training else _empty(q)
    key = _key("sdpa", q.device, q, k, v, bias, causal, scale, training)

    def make():
        g = Graph(q.device, q.dtype)
        Q, K, V, kw = _sdpa_graph(g, q, k, v, bias, causal, scale)
        O, S = g.g.sdpa(q=Q, k=K, v=V, generate_stats=training, **kw)
        g.output(O, o.shape, o.stride())
        if training:
            g.output(S, stats.shape, stats.stride(), wide)
        return Built(g)

    cached(key, make).run(q.device, q, k, v, bias, out=[o, stats] if training else [o])
    return o, stats


@_sdpa.register_fake
def _(q, k, v, bias, causal, scale, training):
    b, h, sq, _ = q.shape
    wide = torch.float64 if q.dtype == torch.float64 else torch.float32
    return q.new_empty((b, h, sq, v.shape[3])), (q.new_empty((b, h, sq, 1), dtype=wide) if training else _empty(q))


@torch.library.custom_op("ferrodnn::sdpa_backward", mutates_args=())
def _sdpa_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, stats: Tensor, bias: Optional[Tensor], causal: bool, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    grad = grad.contiguous()
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    key = _key("sdpa_backward", q.device, grad, q, k, v, o, stats, bias, causal, scale)

    def make():
        g = Graph(q.device, q.dtype)
        Q, K, V, kw = _sdpa_graph(g, q, k, v, bias, causal, scale)
        O, DO, S = g.input(o), g.input(grad), g.input(stats)
        DQ, DK, DV = g.g.sdpa_backward(q=Q, k=K, v=V, o=O, dO=DO, stats=S, **kw)
        for T, t in ((DQ, dq), (DK, dk), (DV, dv)):
            g.output(T, t.shape, t.stride())
        return Built(g)

    cached(key, make).run(q.device, q, k, v, bias, o, grad, stats, out=[dq, dk, dv])
    return dq, dk, dv


@_sdpa_backward.register_fake
def _(grad, q, k, v, o, stats, bias, causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _sdpa_setup(ctx, inputs, output):
    q, k, v, bias, causal, scale, training = inputs
    o, stats = output
    ctx.save_for_backward(q, k, v, o, stats, bias)
    ctx.opts = (causal, scale)
    ctx.set_materialize_grads(False)


def _sdpa_grad(ctx, grad, _grad_stats):
    if grad is None:
        return (None,) * 7
    q, k, v, o, stats, bias = ctx.saved_tensors
    _need_stats("sdpa", stats)
    dq, dk, dv = _sdpa_backward_eager(grad, q, k, v, o, stats, bias, *ctx.opts)
    return dq, dk, dv, None, None, None, None


_sdpa.register_autograd(_sdpa_grad, setup_context=_sdpa_setup)
_sdpa_eager = Eager(_sdpa, (0, 1, 2, 3), _sdpa_setup, _sdpa_grad)
_sdpa_backward_eager = Eager(_sdpa_backward, (0, 1, 2, 3, 4, 5, 6))


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``torch.nn.functional.scaled_dot_product_attention`` on ``[B, H, S, D]`` tensors:
    ``is_causal`` (the top-left causal mask, as PyTorch's), a float ``attn_mask`` added to the
    scores (broadcast to ``[B, H_q, S_q, S_kv]``; a bool mask is turned into 0 / -inf), ``scale``
    (default ``1 / sqrt(D)``) and, with ``enable_gqa``, fewer key/value heads than query heads.
    Refused: dropout_p > 0, an attn_mask that requires grad, attn_mask with is_causal."""
    op = "scaled_dot_product_attention"
    _check_tensor(op, "query", query, dim=4)
    _check_tensor(op, "key", key, query, dim=4)
    _check_tensor(op, "value", value, query, dim=4)
    b, hq, sq, d = query.shape
    _, hk, skv, _ = key.shape
    if key.shape[0] != b or key.shape[3] != d or tuple(value.shape[:3]) != (b, hk, skv):
        raise ValueError(f"ferrodnn.torch.{op}: key must be [B, H_kv, S_kv, D] and value [B, H_kv, S_kv, D_v] for query {tuple(query.shape)}, got key {tuple(key.shape)} and value {tuple(value.shape)}")
    if hq != hk and not (enable_gqa and hq % hk == 0):
        raise ValueError(f"ferrodnn.torch.{op}: query has {hq} heads and key/value {hk}: give enable_gqa=True with query heads a multiple of key/value heads")
    if dropout_p:
        raise ValueError(f"ferrodnn.torch.{op}: dropout_p must be 0 (attention dropout is not supported), got {dropout_p}")
    bias = None
    if attn_mask is not None:
        if is_causal:
            raise ValueError(f"ferrodnn.torch.{op}: give attn_mask or is_causal, not both (as PyTorch)")
        if attn_mask.requires_grad and torch.is_grad_enabled():
            raise ValueError(f"ferrodnn.torch.{op}: attn_mask requires grad; its gradient is not supported")
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device).masked_fill_(~attn_mask, float("-inf"))
        _check_tensor(op, "attn_mask", attn_mask, query)
        try:
            bias = attn_mask.expand(b, hq, sq, skv)
        except RuntimeError:
            raise ValueError(f"ferrodnn.torch.{op}: attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to [B, H_q, S_q, S_kv] = {(b, hq, sq, skv)}") from None
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    training = _needs_grad(query, key, value)
    return _sdpa_eager(query, key, value, bias, bool(is_causal), scale, training)[0]


# -- softmax, pooling ------------------------------------------------------------------------


@torch.library.custom_op("ferrodnn::softmax", mutates_args=())
def _softmax(x: Tensor, dim: int, use_log: bool) -> Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    key = _key("softmax", x.device, x, dim, use_log)

    def make():
        g = Graph(x.device, x.dtype)
        g.output(g.g.softmax(input=g.input(x), axis=dim, use_log=use_log), x.shape, x.stride())
        return Built(g)

    cached(key, make).run(x.device, x, out=[y])
    return y


@_softmax.register_fake
def _(x, dim, use_log):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.custom_op("ferrodnn::softmax_backward", mutates_args=())
def _softmax_backward(grad: Tensor, y: Tensor, dim: int, use_log: bool) -> Tensor:
    grad = grad.contiguous()
    dx = torch.empty_like(y)
    key = _key("softmax_backward", y.device, grad, y, dim, use_log)

    def make():
        g = Graph(y.device, y.dtype)
        DY, Y = g.input(grad), g.input(y)
        g.output(g.g.softmax_backward(y=Y, loss=DY, axis=dim, use_log=use_log), y.shape, y.stride())
        return Built(g)

    cached(key, make).run(y.device, grad, y, out=[dx])
    return dx


@_softmax_backward.register_fake
def _(grad, y, dim, use_log):
    return torch.empty_like(y)


def _softmax_setup(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.opts = inputs[1:]


def _softmax_grad(ctx, grad):
    (y,) = ctx.saved_tensors
    return _softmax_backward_eager(grad, y, *ctx.opts), None, None


_softmax.register_autograd(_softmax_grad, setup_context=_softmax_setup)
_softmax_eager = Eager(_softmax, (0,), _softmax_setup, _softmax_grad)
_softmax_backward_eager = Eager(_softmax_backward, (0, 1))


def softmax(input, dim, use_log=False):
    """``torch.softmax(input, dim)`` (``torch.log_softmax`` with ``use_log``); the output is
    contiguous."""
    op = "softmax"
    _check_tensor(op, "input", input)
    if not -input.dim() <= dim < input.dim():
        raise ValueError(f"ferrodnn.torch.{op}: dim must be in [{-input.dim()}, {input.dim()}), got {dim}")
    return _softmax_eager(input, dim % input.dim(), bool(use_log))


def _pool_dims(x, window, stride, padding):
    return list(x.shape[:2]) + [(x.shape[2 + i] + 2 * padding[i] - window[i]) // stride[i] + 1 for i in range(2)]


def _pool_mode(mode):
    return {"max": _fd.resample_mode.MAXPOOL, "avg": _fd.resample_mode.AVGPOOL_INCLUDE_PADDING, "avg_exclude": _fd.resample_mode.AVGPOOL_EXCLUDE_PADDING}[mode]


@torch.library.custom_op("ferrodnn::pool2d", mutates_args=())
def _pool2d(x: Tensor, mode: str, window: Sequence[int], stride: Sequence[int], padding: Sequence[int]) -> Tensor:
    x = _dense(x)
    dims = _pool_dims(x, window, stride, padding)
    y = torch.empty(dims, dtype=x.dtype, device=x.device, memory_format=_fmt(x))
    key = _key("pool2d", x.device, x, mode, tuple(window), tuple(stride), tuple(padding))

    def make():
        g = Graph(x.device, x.dtype)
        Y, _ = g.g.resample(input=g.input(x), resampling_mode=_pool_mode(mode), window=list(window), stride=list(stride), pre_padding=list(padding), post_padding=list(padding))
        g.output(Y, y.shape, y.stride())
        return Built(g)

    cached(key, make).run(x.device, x, out=[y])
    return y


@_pool2d.register_fake
def _(x, mode, window, stride, padding):
    return x.new_empty(_pool_dims(x, window, stride, padding)).contiguous(memory_format=_fmt(x))


@torch.library.custom_op("ferrodnn::pool2d_backward", mutates_args=())
def _pool2d_backward(grad: Tensor, x: Tensor, mode: str, window: Sequence[int], stride: Sequence[int], padding: Sequence[int]) -> Tensor:
    x = _dense(x)
    grad = grad.contiguous(memory_format=_fmt(x))
    dx = torch.empty_like(x)
    key = _key("pool2d_backward", x.device, grad, x, mode, tuple(window), tuple(stride), tuple(padding))

    def make():
        g = Graph(x.device, x.dtype)
        DY, X = g.input(grad), g.input(x)
        DX = g.g.resample_backward(loss=DY, input=X, resampling_mode=_pool_mode(mode), window=list(window), stride=list(stride), pre_padding=list(padding), post_padding=list(padding))
        g.output(DX, dx.shape, dx.stride())
        return Built(g)

    cached(key, make).run(x.device, grad, x, out=[dx])
    return dx


@_pool2d_backward.register_fake
def _(grad, x, mode, window, stride, padding):
    return torch.empty_strided(x.shape, _dense_strides(x), dtype=x.dtype, device=x.device)


def _pool2d_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.opts = inputs[1:]


def _pool2d_grad(ctx, grad):
    (x,) = ctx.saved_tensors
    return _pool2d_backward_eager(grad, x, *ctx.opts), None, None, None, None


_pool2d.register_autograd(_pool2d_grad, setup_context=_pool2d_setup)
_pool2d_eager = Eager(_pool2d, (0,), _pool2d_setup, _pool2d_grad)
_pool2d_backward_eager = Eager(_pool2d_backward, (0, 1))


def _pool_args(op, x, kernel_size, stride, padding, ceil_mode):
    _check_tensor(op, "input", x, dim=4)
    window = _tuple(op, "kernel_size", kernel_size, 2)
    stride = window if stride is None or (not isinstance(stride, int) and len(stride) == 0) else _tuple(op, "stride", stride, 2)
    padding = _tuple(op, "padding", padding, 2)
    if ceil_mode:
        raise ValueError(f"ferrodnn.torch.{op}: ceil_mode=True is not supported")
    if min(window) < 1 or min(stride) < 1 or min(padding) < 0 or any(2 * p > k for p, k in zip(padding, window)):
        raise ValueError(f"ferrodnn.torch.{op}: kernel_size and stride must be >= 1 and padding between 0 and half the kernel, got kernel_size={window}, stride={stride}, padding={padding}")
    if min(_pool_dims(x, window, stride, padding)[2:]) < 1:
        raise ValueError(f"ferrodnn.torch.{op}: the output would have no elements for input {tuple(x.shape)} and kernel_size {window}")
    return list(window), list(stride), list(padding)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """``torch.nn.functional.max_pool2d`` (either memory format). Refused: dilation other than
    1, ceil_mode, return_indices (the backward reads the input instead)."""
    op = "max_pool2d"
    if _tuple(op, "dilation", dilation, 2) != (1, 1):
        raise ValueError(f"ferrodnn.torch.{op}: dilation must be 1, got {dilation}")
    if return_indices:
        raise ValueError(f"ferrodnn.torch.{op}: return_indices=True is not supported")
    return _pool2d_eager(input, "max", *_pool_args(op, input, kernel_size, stride, padding, ceil_mode))


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    """``torch.nn.functional.avg_pool2d`` (either memory format). Refused: ceil_mode,
    divisor_override."""
    op = "avg_pool2d"
    if divisor_override is not None:
        raise ValueError(f"ferrodnn.torch.{op}: divisor_override is not supported")
    return _pool2d_eager(input, "avg" if count_include_pad else "avg_exclude", *_pool_args(op, input, kernel_size, stride, padding, ceil_mode))
