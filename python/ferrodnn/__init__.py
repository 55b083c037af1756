"""ferrodnn: deep-learning primitives with the cudnn frontend's Python graph API.

``import ferrodnn as cudnn`` gives the names of the frontend's ``cudnn`` module. Graphs run on
host arrays (numpy, CPU PyTorch tensors) with the CPU engine, and on device arrays (CUDA PyTorch
tensors, anything with ``__cuda_array_interface__``) with the CUDA engine of the handle.

``backend_version()`` and ``backend_version_string()`` report the cuDNN API level this module
implements (9.19.0); ferrodnn's own version is ``__version__``.
"""

from contextlib import contextmanager
from functools import wraps

from ._ferrodnn import (  # noqa: F401
    DeviceError,
    FerrodnnError,
    InvalidArgumentError,
    InvalidGraphError,
    NotSupportedError,
    SerializationError,
    __version__,
    _Graph,
    attention_implementation,
    backend_version,
    backend_version_string,
    behavior_note,
    build_plan_policy,
    convolution_mode,
    create_cpu_handle,
    create_device_properties,
    create_handle,
    create_kernel_cache,
    cudnnGraphNotSupportedError,
    data_type,
    destroy_handle,
    device_properties,
    diagonal_alignment,
    get_cudnn_version,
    get_last_error_string,
    get_stream,
    get_strict_buffers,
    gpu_available,
    handle,
    heur_mode,
    kernel_cache,
    kernel_cache_stats,
    knob,
    knob_type,
    moe_grouped_matmul_mode,
    norm_forward_phase,
    numerical_note,
    padding_mode,
    reduction_mode,
    resample_mode,
    reshape_mode,
    rng_distribution,
    run_graph_json,
    scalar_type,
    set_stream,
    set_strict_buffers,
    tensor,
    tensor_reordering,
)

_NOT_SET = None


class pygraph(_Graph):
    """A graph of operations, as the frontend's ``cudnn.pygraph``.

    ``pygraph(io_data_type=, intermediate_data_type=, compute_data_type=, handle=, name=)``.
    The operations that are not defined here (convolutions, matmul, normalizations, attention,
    transforms, ...) are methods of the Rust base class; these are the pointwise ones.
    """

    # -- arithmetic -------------------------------------------------------------------------
    def add(self, a, b, compute_data_type=_NOT_SET, name=""):
        return self._pointwise("add", [a, b], None, compute_data_type, name)

    def bias(self, input, bias, compute_data_type=_NOT_SET, name=""):
        return self._pointwise("bias", [input, bias], None, compute_data_type, name)

    def sub(self, a, b, compute_data_type=_NOT_SET, name=""):
        return self._pointwise("sub", [a, b], None, compute_data_type, name)

    def mul(self, a, b, compute_data_type=_NOT_SET, name=""):
        return self._pointwise("mul", [a, b], None, compute_data_type, name)

    def scale(self, input, scale, compute_data_type=_NOT_SET, name=""):
        return self._pointwise("scale", [input, scale], None, compute_data_type, name)

    def div(self, a, b, compute_data_type=_NOT_SET, name=""):
        return self._pointwise("div", [a, b], None, compute_data_type, name)

    def add_square(self, a, b, compute_data_type=_NOT_SET, name=""):
        return self._pointwise("add_square", [a, b], None, compute_data_type, name)

    def max(self, input0, input1, compute_data_type=_NOT_SET, name=""):
        return self._pointwise("max", [input0, input1], None, compute_data_type, name)

    def min(self, input0, input1, compute_data_type=_NOT_SET, name=""):
        return self._pointwise("min", [input0, input1], None, compute_data_type, name)

    def mod(self, input0, input1, compute_data_type=_NOT_SET, name=""):
        return self._pointwise("mod", [input0, input1], None, compute_data_type, name)

    def pow(self, input0, input1, compute_data_type=_NOT_SET, name=""):
        return self._pointwise("pow", [input0, input1], None, compute_data_type, name)

    # -- math ---------------------------------------------------------------------------------
    def _unary(mode):
        def op(self, input, compute_data_type=_NOT_SET, name=""):
            return self._pointwise(mode, [input], None, compute_data_type, name)

        op.__name__ = mode
        op.__doc__ = f"Pointwise {mode} of the input."
        return op

    abs = _unary("abs")
    neg = _unary("neg")
    exp = _unary("exp")
    log = _unary("log")
    sqrt = _unary("sqrt")
    rsqrt = _unary("rsqrt")
    reciprocal = _unary("reciprocal")
    sin = _unary("sin")
    cos = _unary("cos")
    tan = _unary("tan")
    tanh = _unary("tanh")
    sigmoid = _unary("sigmoid")
    erf = _unary("erf")
    floor = _unary("floor")
    ceil = _unary("ceil")
    identity = _unary("identity")
    gelu = _unary("gelu")
    gelu_approx_tanh = _unary("gelu_approx_tanh")
    logical_not = _unary("logical_not")
    del _unary

    # -- activations with parameters ------------------------------------------------------------
    def relu(self, input, negative_slope=None, lower_clip=None, upper_clip=None, compute_data_type=_NOT_SET, name=""):
        params = {"negative_slope": negative_slope, "lower_clip": lower_clip, "upper_clip": upper_clip}
        return self._pointwise("relu", [input], params, compute_data_type, name)

    def leaky_relu(self, input, negative_slope, compute_data_type=_NOT_SET, name=""):
        return self._pointwise("leaky_relu", [input], {"negative_slope": negative_slope}, compute_data_type, name)

    def elu(self, input, compute_data_type=_NOT_SET, name="", alpha=1.0):
        return self._pointwise("elu", [input], {"alpha": alpha}, compute_data_type, name)

    def swish(self, input, swish_beta=None, compute_data_type=_NOT_SET, name=""):
        beta = 1.0 if swish_beta is None else swish_beta
        return self._pointwise("swish", [input], {"beta": beta}, compute_data_type, name)

    def softplus(self, input, compute_data_type=_NOT_SET, name="", softplus_beta=1.0):
        return self._pointwise("softplus", [input], {"beta": softplus_beta}, compute_data_type, name)

    def gen_index(self, input, axis, compute_data_type=_NOT_SET, name=""):
        # (The axis is taken modulo the input's rank here, so the input's type is checked here.)
        if not isinstance(input, tensor):
            raise TypeError(f"gen_index: `input` must be a tensor of the graph, not {type(input).__name__}")
        rank = len(input.get_dim())
        return self._pointwise("gen_index", [input], {"axis": axis % rank if rank else axis}, compute_data_type, name)

    # -- backward activations: loss is dy, input the forward input ------------------------------
    def relu_backward(self, loss, input, negative_slope=None, lower_clip=None, upper_clip=None, compute_data_type=_NOT_SET, name=""):
        params = {"negative_slope": negative_slope, "lower_clip": lower_clip, "upper_clip": upper_clip}
        return self._pointwise("relu_backward", [loss, input], params, compute_data_type, name)

    def leaky_relu_backward(self, loss, input, negative_slope, compute_data_type=_NOT_SET, name=""):
        return self._pointwise("leaky_relu_backward", [loss, input], {"negative_slope": negative_slope}, compute_data_type, name)

    def _backward(mode):
        def op(self, loss, input, compute_data_type=_NOT_SET, name=""):
            return self._pointwise(mode, [loss, input], None, compute_data_type, name)

        op.__name__ = mode
        op.__doc__ = f"{mode}: the gradient of the input from the loss (dy) and the forward input."
        return op

    tanh_backward = _backward("tanh_backward")
    sigmoid_backward = _backward("sigmoid_backward")
    gelu_backward = _backward("gelu_backward")
    gelu_approx_tanh_backward = _backward("gelu_approx_tanh_backward")
    del _backward

    def elu_backward(self, loss, input, compute_data_type=_NOT_SET, name="", alpha=1.0):
        return self._pointwise("elu_backward", [loss, input], {"alpha": alpha}, compute_data_type, name)

    def softplus_backward(self, loss, input, compute_data_type=_NOT_SET, name="", softplus_beta=1.0):
        return self._pointwise("softplus_backward", [loss, input], {"beta": softplus_beta}, compute_data_type, name)

    def swish_backward(self, loss, input, compute_data_type=_NOT_SET, swish_beta=None, name=""):
        beta = 1.0 if swish_beta is None else swish_beta
        return self._pointwise("swish_backward", [loss, input], {"beta": beta}, compute_data_type, name)

    # -- comparisons, logic, selection ------------------------------------------------------
    def _cmp(mode):
        def op(self, input, comparison, compute_data_type=_NOT_SET, name=""):
            return self._pointwise(mode, [input, comparison], None, compute_data_type, name)

        op.__name__ = mode
        op.__doc__ = f"{mode}: a boolean tensor comparing input with comparison."
        return op

    cmp_eq = _cmp("cmp_eq")
    cmp_neq = _cmp("cmp_neq")
    cmp_gt = _cmp("cmp_gt")
    cmp_ge = _cmp("cmp_ge")
    cmp_lt = _cmp("cmp_lt")
    cmp_le = _cmp("cmp_le")
    del _cmp

    def logical_and(self, a, b, compute_data_type=_NOT_SET, name=""):
        return self._pointwise("logical_and", [a, b], None, compute_data_type, name)

    def logical_or(self, a, b, compute_data_type=_NOT_SET, name=""):
        return self._pointwise("logical_or", [a, b], None, compute_data_type, name)

    def binary_select(self, input0, input1, mask, compute_data_type=_NOT_SET, name=""):
        """``mask != 0 ? input0 : input1``."""
        return self._pointwise("binary_select", [input0, input1, mask], None, compute_data_type, name)

    # -- the frontend's ops that ferrodnn does not have: each raises NotSupportedError ---------
    def _refused(method, what):
        def op(self, *args, **kwargs):
            raise NotSupportedError(f"pygraph.{method}: {what} is not supported by ferrodnn")

        op.__name__ = method
        op.__doc__ = f"The frontend's {method}: {what} is not supported by ferrodnn (raises NotSupportedError)."
        return op

    sdpa_fp8 = _refused("sdpa_fp8", "fp8 attention")
    sdpa_fp8_backward = _refused("sdpa_fp8_backward", "fp8 attention")
    sdpa_mxfp8 = _refused("sdpa_mxfp8", "MXFP8 (block-scaled fp8) attention")
    sdpa_mxfp8_backward = _refused("sdpa_mxfp8_backward", "MXFP8 (block-scaled fp8) attention")
    block_scale_quantize = _refused("block_scale_quantize", "block-scaled quantization")
    block_scale_dequantize = _refused("block_scale_dequantize", "block-scaled dequantization")
    moe_grouped_matmul = _refused("moe_grouped_matmul", "the MoE grouped matmul")
    moe_grouped_matmul_bwd = _refused("moe_grouped_matmul_bwd", "the MoE grouped matmul")
    del _refused


@contextmanager
def graph(
    handle,
    name="cudnn_graph",
    io_data_type=data_type.HALF,
    intermediate_data_type=data_type.FLOAT,
    compute_data_type=data_type.FLOAT,
    **graph_kwargs,
):
    """A graph as a context manager, as the frontend's ``cudnn.graph``: yields ``(graph, [])``."""
    g = pygraph(
        handle=handle,
        name=name,
        io_data_type=io_data_type,
        intermediate_data_type=intermediate_data_type,
        compute_data_type=compute_data_type,
        **graph_kwargs,
    )
    yield g, []


def jit(heur_modes=heur_mode.A, **kwargs):
    """Decorator: the wrapped function returns ``(graph, tensors)``; the graph is built and the
    tensors are turned into their uids, as the frontend's ``cudnn.jit``."""
    if not isinstance(heur_modes, list):
        heur_modes = [heur_modes]

    def decorator(func):
        @wraps(func)
        def wrapper(*args, **kw):
            g, tensors = func(*args, **kw)
            if g.get_execution_plan_count() <= 0:
                g.build(heur_modes)
            return g, [t.get_uid() for t in tensors]

        return wrapper

    return decorator


def graph_cache(key_fn, maxsize=256):
    """Memoize a graph-building function by ``key_fn(*args, **kwargs)``."""

    def decorator(func):
        cache = {}

        @wraps(func)
        def wrapper(*args, **kwargs):
            key = key_fn(*args, **kwargs)
            if key in cache:
                return cache[key]
            result = func(*args, **kwargs)
            if len(cache) >= maxsize:
                cache.pop(next(iter(cache)))
            cache[key] = result
            return result

        return wrapper

    return decorator


from .wrapper import Graph  # noqa: E402  (it builds on pygraph, defined above)
from . import rnn  # noqa: E402,F401  (its functions build pygraphs)


def __getattr__(name):
    # `ferrodnn.torch` (the PyTorch modules) is imported on first use, so that the package
    # works without PyTorch installed.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
