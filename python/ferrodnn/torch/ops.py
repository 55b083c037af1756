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

from . import _common
from ._common import Built, Graph, cached, signature

__all__ = [
    "conv2d",
    "conv3d",
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


def _channels_last(t):
    """Whether `t` is channels-last (and not also contiguous)."""
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(t.dim())
    return fmt is not None and t.is_contiguous(memory_format=fmt) and not t.is_contiguous()


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
    return {4: torch.channels_last, 5: torch.channels_last_3d}[t.dim()] if _channels_last(t) else torch.contiguous_format


def _key(op, device, *parts):
    return (op, str(device)) + tuple(signature(p) if isinstance(p, Tensor) or p is None else p for p in parts)


def _act(g, name, T):
    fwd = _ACTIVATIONS[name][0]
    return getattr(g.g, fwd)(input=T) if fwd else T


def _act_backward(g, name, DY, S):
    bwd = _ACTIVATIONS[name][1]
    return getattr(g.g, bwd)(loss=DY, input=S) if bwd else DY


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


def _conv_grad(ctx, grad, _grad_z):
    x, weight, saved = ctx.saved_tensors
    stride, padding, dilation, activation = ctx.opts
    nx, nw, nb, nr = ctx.needs_input_grad[:4]
    saved = saved if saved is not None else _empty(x)
    dx, dw, db, dz = torch.ops.ferrodnn.conv_backward(grad, x, weight, saved, stride, padding, dilation, activation, nx, nw, nb, nr)
    dres = (dz if activation != "none" else grad) if nr else None
    return dx if nx else None, dw if nw else None, db if nb else None, dres, None, None, None, None, None


_conv.register_autograd(_conv_grad, setup_context=_conv_setup)


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
    return _conv(x, weight, bias, residual, list(stride), list(padding), list(dilation), act, save)[0]


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, activation=None, residual=None):
    """``torch.nn.functional.conv2d`` with an optional fused epilogue:
    ``activation(conv2d(input, weight) + bias + residual)``, activation one of "relu", "silu",
    "gelu", "gelu_tanh" or None, residual a tensor of the output's shape. A channels-last input
    gives a channels-last output. padding: ints or "valid"."""
    return _conv_nd("conv2d", 2, input, weight, bias, stride, padding, dilation, groups, activation, residual)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, activation=None, residual=None):
    """``torch.nn.functional.conv3d`` with the fused epilogue of :func:`conv2d`."""
    return _conv_nd("conv3d", 3, input, weight, bias, stride, padding, dilation, groups, activation, residual)
