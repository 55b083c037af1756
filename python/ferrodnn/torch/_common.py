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
    _fd.set_stream(handle=h, stream=torch.cuda.current_stream(device).cuda_stream)
    return h


def workspace(graph, device):
    # At least one byte, so the workspace always has a real data pointer.
    return torch.empty(max(int(graph.get_workspace_size()), 1), dtype=torch.uint8, device=device)


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
    return (tuple(t.shape), tuple(t.stride()), t.dtype)


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

    def run(self, device, *tensors, out=None):
        """Executes the graph on `tensors` (torch tensors, None where the graph has no input,
        or numbers for by-value scalars); `out` gives buffers for some outputs (None: a new
        one). Each tensor is passed as a view with its graph tensor's dims and strides, so
        that the buffer checks see the very layout the graph was built for."""
        handle(device)  # sets the CUDA handle's stream to PyTorch's current one
        if len(tensors) != len(self.inputs):
            raise RuntimeError(f"ferrodnn.torch: a graph of {len(self.inputs)} inputs got {len(tensors)} tensors")
        pack = {T: _view(v, layout) for T, v, layout in zip(self.inputs, tensors, self.layouts) if T is not None}
        outs = []
        for i, (T, dims, strides, dtype) in enumerate(self.outputs):
            o = out[i] if out is not None and out[i] is not None else torch.empty_strided(dims, strides, dtype=dtype, device=device)
            pack[T] = _view(o, (dims, strides))
            outs.append(o)
        ws = workspace(self.graph, device)
        if torch.autograd._profiler_enabled():
            # Under torch.profiler, ferrodnn's own time (the execute call: buffer checks, the
            # launches or the CPU engine's work) shows apart from the custom op's Python.
            with torch.profiler.record_function("ferrodnn::execute"):
                self.graph.execute(pack, ws)
        else:
            self.graph.execute(pack, ws)
        return outs


def _view(t, layout):
    """`t` seen with `layout` (dims, strides) when it has another (the same memory)."""
    if layout is None or not isinstance(t, torch.Tensor):
        return t
    dims, strides = layout
    if tuple(t.shape) == dims and tuple(t.stride()) == strides:
        return t
    return t.as_strided(dims, strides)


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
