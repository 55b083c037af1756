"""What ferrodnn.torch's modules and ops share: the handles (one per device, on PyTorch's current
stream), workspaces from PyTorch's allocator, dtype maps, and the process-wide cache of built
graphs for the functional ops."""

from collections import OrderedDict

import torch

import ferrodnn as _fd

_HANDLES = {}
_TORCH_DTYPES = {}
_FD_DTYPES = {}

# Built graphs of the functional ops kept per key (the least recently used is dropped first).
GRAPH_CACHE_SIZE = 256
_GRAPHS = OrderedDict()


def torch_dtype(dt):
    """The torch dtype of a ferrodnn data_type."""
    if not _TORCH_DTYPES:
        _TORCH_DTYPES.update(
            {
                _fd.data_type.FLOAT: torch.float32,
                _fd.data_type.DOUBLE: torch.float64,
                _fd.data_type.HALF: torch.float16,
                _fd.data_type.BFLOAT16: torch.bfloat16,
            }
        )
    return _TORCH_DTYPES[dt]


def fd_dtype(dtype):
    """The ferrodnn data_type of a torch floating dtype."""
    if not _FD_DTYPES:
        _FD_DTYPES.update(
            {
                torch.float32: _fd.data_type.FLOAT,
                torch.float64: _fd.data_type.DOUBLE,
                torch.float16: _fd.data_type.HALF,
                torch.bfloat16: _fd.data_type.BFLOAT16,
            }
        )
    return _FD_DTYPES[dtype]


def handle(device):
    """The handle for tensors on `device` (one per process and device), its stream set to
    PyTorch's current one on CUDA."""
    if device.type == "cpu":
        h = _HANDLES.get("cpu")
        if h is None:
            h = _HANDLES["cpu"] = _fd.create_cpu_handle()
        return h
    return _cuda_handle(device)[0]


def _cuda_handle(device):
    """(the CUDA handle, PyTorch's current stream on `device`, as an integer), the handle's
    stream set to that stream when it was another (a call on an unchanged stream calls nothing
    in ferrodnn)."""
    if device.type != "cuda":
        raise ValueError(f"ferrodnn.torch: tensors on {device} are not supported (CPU and cuda:0 are)")
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index != 0:
        raise ValueError(f"ferrodnn.torch: ferrodnn's handles run on GPU 0 only; the input is on cuda:{index} (use cuda:0, or CUDA_VISIBLE_DEVICES to make this GPU the first)")
    h = _HANDLES.get("cuda")
    if h is None:
        h = _fd.create_handle()
        if "cuda" not in h.engines():
            raise RuntimeError("ferrodnn.torch: the input is on cuda:0 but ferrodnn found no usable CUDA device (ferrodnn.gpu_available() is False)")
        _HANDLES["cuda"] = h
    stream = _raw_stream(index)
    # The handle is this module's own (no caller gets it to set another stream), so the stream
    # it was last given is the one it has.
    if _HANDLES.get("cuda_stream") != stream:
        _fd.set_stream(handle=h, stream=stream)
        _HANDLES["cuda_stream"] = stream
    return h, stream


def _raw_stream(index):
    """PyTorch's current stream on cuda:`index` as an integer (cudaStream_t)."""
    return torch.cuda.current_stream(index).cuda_stream


# (torch._C's function, where this torch has it: the same integer without a Stream object.)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", _raw_stream)


# Workspaces kept for reuse, one per (device, stream): a uint8 tensor at least as large as the
# largest workspace asked for on that stream (up to WORKSPACE_KEEP_BYTES; a larger one is
# allocated for its call and freed after, as every workspace was before).
#
# Why reuse is safe: on the CPU a plan runs inside `execute`, with the GIL held, so one call's
# workspace is free again before any other call starts. On CUDA every graph that gets the
# workspace of stream S runs its kernels on S (the handle's stream is set to S before the call),
# so they run one after another and never share the workspace at the same time. When a larger
# workspace replaces a kept one, the old tensor is freed while kernels queued on S may still
# read it; PyTorch's caching allocator hands a freed block only to later allocations on the
# stream it was allocated on (S), whose work is queued behind those kernels (the allocator's
# stream semantics, as for any tensor freed after its last use on its stream). Under CUDA-graph
# capture a workspace is allocated for each call (from the graph's private pool, kept alive with
# the graph): a kept one could be replaced, and its memory reused, while a captured graph still
# names it.
WORKSPACE_KEEP_BYTES = 64 << 20
_WORKSPACES = {}


def workspace(graph, device):
    """A workspace for `graph`'s plan on `device` (see `workspace_of`)."""
    size = int(graph.get_workspace_size())
    stream = _cuda_handle(device)[1] if device.type == "cuda" else 0
    return workspace_of(size, device, stream)


def workspace_of(size, device, stream):
    """A uint8 tensor of at least `size` bytes (at least one, so that it has a real data
    pointer) for a plan that runs on `stream` of `device`: the one kept for (device, stream) when
    it is large enough, else a new one (kept when at most WORKSPACE_KEEP_BYTES and not under
    CUDA-graph capture)."""
    key = (device.type, stream)
    ws = _WORKSPACES.get(key)
    if ws is not None and ws.numel() >= size:
        if device.type != "cuda" or not torch._C._cuda_isCurrentStreamCapturing():
            return ws
    ws = torch.empty(max(size, 1), dtype=torch.uint8, device=device)
    if size <= WORKSPACE_KEEP_BYTES and (device.type != "cuda" or not torch._C._cuda_isCurrentStreamCapturing()):
        _WORKSPACES[key] = ws
    return ws


def clear_workspaces():
    """Frees the kept workspaces (each is allocated again on its next use)."""
    _WORKSPACES.clear()


def compute(dtype):
    return _fd.data_type.DOUBLE if dtype == torch.float64 else None


def build(graph, outs):
    """Marks `outs` as the graph's outputs, validates and builds it: their (dims, torch dtype)."""
    for o in outs:
        o.set_output(True)
    graph.validate()
    graph.build([_fd.heur_mode.A])
    return [(o.get_dim(), torch_dtype(o.get_data_type())) for o in outs]


# -- the functional ops' graphs ----------------------------------------------------------------


def signature(t):
    """What a graph built for tensor `t` depends on: shape, strides, dtype (None for no tensor)."""
    if t is None:
        return None
    return (t.shape, t.stride(), t.dtype)


class Graph:
    """A pygraph for one call of an op, with helpers that make its tensors from torch tensors."""

    def __init__(self, device, dtype):
        self.dtype = dtype
        wide = _fd.data_type.DOUBLE if dtype == torch.float64 else _fd.data_type.FLOAT
        self.acc = torch.float64 if dtype == torch.float64 else torch.float32
        self.g = _fd.pygraph(io_data_type=fd_dtype(dtype), intermediate_data_type=wide, compute_data_type=wide, handle=handle(device))
        self.inputs = []
        self.layouts = []
        self.outputs = []

    def input(self, t, dims=None, strides=None, dtype=None):
        """A graph tensor for torch tensor `t` (None gives None), with `t`'s dims and strides or
        the ones given (a view of its memory; at run time the tensor is passed as that view).
        With `t` None and dims given, an input made from dims, strides and `dtype` alone."""
        if t is None and dims is None:
            self.inputs.append(None)
            self.layouts.append(None)
            return None
        dims = list(t.shape) if dims is None else list(dims)
        strides = list(t.stride()) if strides is None else list(strides)
        dtype = t.dtype if dtype is None else dtype
        T = self.g.tensor(dim=dims or [1], stride=strides or [1], data_type=fd_dtype(dtype))
        self.inputs.append(T)
        self.layouts.append((tuple(dims or [1]), tuple(strides or [1])))
        return T

    def scalar(self):
        """A by-value scalar input (epsilon, momentum: one plan serves every value), f64 in a
        float64 graph (PyTorch takes these as doubles) and f32 otherwise."""
        T = self.g.tensor(dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], is_pass_by_value=True, data_type=fd_dtype(self.acc))
        self.inputs.append(T)
        self.layouts.append(None)
        return T

    def output(self, T, dims, strides, dtype=None):
        """Marks graph tensor `T` an output written with `dims` and `strides` (`dtype`, the io
        dtype unless given)."""
        dtype = self.dtype if dtype is None else dtype
        T.set_output(True).set_dim(list(dims)).set_stride(list(strides)).set_data_type(fd_dtype(dtype))
        self.outputs.append((T, tuple(dims), tuple(strides), dtype))
        return T


class Built:
    """A built graph: runs on torch tensors in the order its inputs were made, returning new
    output tensors in the order its outputs were marked."""

    def __init__(self, g):
        g.g.validate()
        g.g.build([_fd.heur_mode.A])
        self.graph, self.inputs, self.layouts, self.outputs = g.g, g.inputs, g.layouts, g.outputs
        # The plan is built: its workspace size is known once for every call.
        self.workspace_size = int(g.g.get_workspace_size())
        self._execute = g.g.execute

    def run(self, device, *tensors, out=None):
        """Executes the graph on `tensors` (torch tensors, None where the graph has no input,
        or numbers for by-value scalars); `out` gives buffers for some outputs (None: a new
        one). Each tensor is read as a view with its graph tensor's dims and strides
        (`execute(as_views=True)`: the binding checks that the view stays inside the tensor's
        memory), so no `as_strided` view is made here."""
        # (On CUDA: the handle's stream set to PyTorch's current one.)
        stream = _cuda_handle(device)[1] if device.type == "cuda" else 0
        if len(tensors) != len(self.inputs):
            raise RuntimeError(f"ferrodnn.torch: a graph of {len(self.inputs)} inputs got {len(tensors)} tensors")
        # (A None key, for an input the graph does not have, is skipped by execute.)
        pack = dict(zip(self.inputs, tensors))
        outs = []
        for i, (T, dims, strides, dtype) in enumerate(self.outputs):
            o = out[i] if out is not None and out[i] is not None else torch.empty_strided(dims, strides, dtype=dtype, device=device)
            pack[T] = o
            outs.append(o)
        ws = workspace_of(self.workspace_size, device, stream)
        if torch.autograd._profiler_enabled():
            # Under torch.profiler, ferrodnn's own time (the execute call: buffer checks, the
            # launches or the CPU engine's work) shows apart from the custom op's Python.
            with torch.profiler.record_function("ferrodnn::execute"):
                self._execute(pack, ws, as_views=True)
        else:
            self._execute(pack, ws, as_views=True)
        return outs


# -- calling the registered ops -----------------------------------------------------------------

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_functorch_level = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None)


def _plain_eager(tensors):
    """Whether a call on `tensors` (the op's tensor arguments, None for an absent one; the first
    one given) can skip PyTorch's dispatcher: eager mode (no torch.compile / dynamo tracing), no
    dispatch or torch-function mode (fake tensors, FlopCounterMode, ...), no functorch transform
    (vmap, grad), and tensors of plain types (torch.Tensor, nn.Parameter: no subclass, so no
    FakeTensor, FunctionalTensor or DTensor) on the CPU or a CUDA device (not meta). Anything
    else goes through the registered op, whose fake implementation and dispatch serve it."""
    return _eager_grad(tensors) is not None


def _eager_grad(tensors):
    """None when a call on `tensors` must go through the registered op (see `_plain_eager`),
    else whether it needs autograd (grad mode on and a tensor requiring grad)."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled():
        return None
    if _functorch_level is not None and _functorch_level() is not None:
        return None
    first, grad = True, False
    for t in tensors:
        if t is None:
            continue
        if type(t) not in _PLAIN:
            return None
        if first:
            if not (t.is_cuda or t.is_cpu):
                return None
            first = False
        grad = grad or t.requires_grad
    return grad and torch.is_grad_enabled()


class Eager:
    """A registered op (a ``torch.library.custom_op``) called from eager code: its implementation
    runs directly (no dispatcher, no boxing of the arguments), with its autograd formula through
    a ``torch.autograd.Function`` when a gradient is needed, whenever `_plain_eager` allows;
    else the call goes through the registered op (torch.compile, fake tensors, modes).

    `setup(ctx, inputs, output)` and `grad(ctx, *grads)` are the functions given to the op's
    ``register_autograd`` (the Function calls them as the op's generated one does); without them
    the op has no autograd formula, and a call that would need one goes through the registered
    op (which raises as before when differentiated). `tensors` are the indices of the op's
    tensor arguments; `impl` replaces the op's implementation in the direct call (the same
    arguments and results). Under torch.profiler the direct call is recorded under the op's name, as
    the dispatcher records it."""

    def __init__(self, op, tensors, setup=None, grad=None, impl=None):
        self.op = op
        self.impl = impl if impl is not None else op._init_fn
        self.tensors = tensors
        self.name = f"ferrodnn::{op._name}"
        self.fn = None
        if setup is not None:
            impl = self.impl

            class Fn(torch.autograd.Function):
                @staticmethod
                def forward(ctx, *args):
                    out = impl(*args)
                    setup(ctx, args, out)
                    return out

                @staticmethod
                def backward(ctx, *grads):
                    return grad(ctx, *grads)

            Fn.__name__ = Fn.__qualname__ = f"{op._name}_eager"
            self.fn = Fn.apply

    def __call__(self, *args):
        grad = _eager_grad([args[i] for i in self.tensors])
        if grad is None:
            return self.op(*args)
        if grad and self.fn is None:
            return self.op(*args)
        call = self.fn if grad else self.impl
        if torch.autograd._profiler_enabled():
            with torch.profiler.record_function(self.name):
                return call(*args)
        return call(*args)


def lru(cache, key, make, size):
    """`cache[key]` (an OrderedDict kept to `size` entries, the least recently used dropped
    first), made by `make()` on a miss."""
    entry = cache.get(key)
    if entry is None:
        entry = cache[key] = make()
        while len(cache) > size:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return entry


def cached(key, make):
    """The built graph of `key`, made by `make()` (-> Built) on the first call."""
    return lru(_GRAPHS, key, make, GRAPH_CACHE_SIZE)


def clear_graph_cache():
    """Drops every built graph of the functional ops (they are rebuilt on their next call)."""
    _GRAPHS.clear()


def graph_cache_info():
    """(graphs kept, most kept)."""
    return len(_GRAPHS), GRAPH_CACHE_SIZE
