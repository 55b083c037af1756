"""``cudnn.Graph``: the frontend's higher-level graph, on ferrodnn.

Inside ``with Graph(...) as graph:`` the graph's ops take arrays (PyTorch tensors, numpy arrays,
anything ferrodnn reads) where tensors go: each array becomes a graph tensor like it
(``tensor_like``), once. Every op gets a node name (its ``name=``, else ``"<op>.<n>"``); the
tensors it takes are known as ``"<node>::<argument>"`` and those it makes by their names at the
time (``"<node>::<port>"`` for a named node) or ``"<node>::<index>"``. Leaving the block validates
the graph and builds its plans. Then ``graph(x, w)`` runs it on arrays given in the order of
``inputs=`` (or ``set_io_tuples``) and returns new output arrays in the order of ``outputs=``;
``graph({name: array, ...})`` takes arrays by name, tensor or uid, allocates the outputs it is not
given and returns the dict. Outputs are allocated with the library and device of the input
arrays (PyTorch or numpy).
"""

from . import _ferrodnn
from ._ferrodnn import data_type, heur_mode, tensor

# The graph's own plan calls: the wrapper builds and runs the graph itself.
_BLOCKED = {
    "build", "build_operation_graph", "build_plan_at_index", "build_plans", "check_support", "create_execution_plan",
    "create_execution_plans", "deselect_behavior_notes", "deselect_engines", "deselect_numeric_notes",
    "deselect_workspace_greater_than", "execute", "execute_plan_at_index", "get_behavior_notes",
    "get_behavior_notes_for_plan_at_index", "get_engine_count", "get_execution_plan_count", "get_knobs_for_engine",
    "get_plan_name_at_index", "key", "populate_cuda_graph", "select_behavior_notes", "select_numeric_notes",
    "update_cuda_graph", "validate",
}
_PASS_THROUGH = {"get_workspace_size", "get_workspace_size_plan_at_index", "serialize", "deserialize", "query_tensor_attributes_of_uid"}

# data_type -> (numpy dtype name, torch dtype name); numpy lacks bfloat16 and fp8, whose arrays
# ferrodnn takes as same-size unsigned integers.
_DTYPES = {
    data_type.FLOAT: ("float32", "float32"),
    data_type.DOUBLE: ("float64", "float64"),
    data_type.HALF: ("float16", "float16"),
    data_type.BFLOAT16: ("uint16", "bfloat16"),
    data_type.INT8: ("int8", "int8"),
    data_type.UINT8: ("uint8", "uint8"),
    data_type.INT32: ("int32", "int32"),
    data_type.INT64: ("int64", "int64"),
    data_type.BOOLEAN: ("bool", "bool"),
    data_type.FP8_E4M3: ("uint8", "float8_e4m3fn"),
    data_type.FP8_E5M2: ("uint8", "float8_e5m2"),
}


def _is_array(obj):
    if isinstance(obj, (tensor, str, bytes, int, float, bool)) or obj is None:
        return False
    return any(hasattr(obj, a) for a in ("__dlpack__", "__array_interface__", "__cuda_array_interface__"))


def _is_torch(obj):
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def _empty_like(t, like):
    """A new array for graph tensor ``t`` (its dims, strides and type), of ``like``'s library and
    device."""
    dims, strides, dt = t.get_dim(), t.get_stride(), t.get_data_type()
    if dt not in _DTYPES:
        raise TypeError(f"Graph: cannot allocate tensor {t.get_name()!r}: no array type for {dt}")
    np_name, torch_name = _DTYPES[dt]
    if like is not None and _is_torch(like):
        import torch

        return torch.empty_strided(dims, strides, dtype=getattr(torch, torch_name), device=like.device)
    if like is not None and not hasattr(like, "__array_interface__"):
        raise TypeError(f"Graph: cannot allocate output {t.get_name()!r} like a {type(like).__name__}; give it in the call")
    import numpy as np

    item = np.dtype(np_name).itemsize
    extent = 1 + sum((d - 1) * s for d, s in zip(dims, strides)) if all(d > 0 for d in dims) else 0
    buf = np.empty(max(extent, 1), np.dtype(np_name))
    return np.lib.stride_tricks.as_strided(buf, shape=dims, strides=[s * item for s in strides])


class Graph:
    """The frontend's ``cudnn.Graph(handle=, inputs=, outputs=, heuristics=, workspace_alloc=,
    **pygraph_arguments)`` (see the module's documentation)."""

    def __init__(self, *, handle=None, inputs=None, outputs=None, heuristics=None, workspace_alloc=True, **kwargs):
        for what, value in (("inputs", inputs), ("outputs", outputs), ("heuristics", heuristics)):
            if value is not None and not isinstance(value, (list, tuple)):
                raise ValueError(f"Graph: {what} must be a list or tuple, got {type(value).__name__}")
        self._kwargs = kwargs
        self._handle = _ferrodnn.create_handle() if handle == "auto" else handle
        self._auto = handle == "auto"
        self._graph = None
        self._arrays = {}  # id(array) -> (array, tensor): the array is held so its id stays its own
        self._like = None  # an array the graph was built from: outputs are allocated like it
        self._inputs = {}  # "node::argument" -> tensor
        self._outputs = {}  # name -> tensor
        self._created = []  # tensors made with tensor / tensor_like through the wrapper
        self._uses = {}
        self._nodes = set()
        self._io = None
        self._pending_io = (list(inputs or []), list(outputs or []))
        self._heuristics = list(heuristics or [heur_mode.A, heur_mode.FALLBACK])
        self._workspace_alloc = workspace_alloc
        self._workspace = None

    def __enter__(self):
        if self._graph is not None:
            raise RuntimeError("Graph: this graph was built already (a Graph is entered once)")
        from . import pygraph

        self._graph = pygraph(**({"handle": self._handle} if self._handle is not None else {}), **self._kwargs)
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self._graph = None
            return False
        g = self._graph
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans(self._heuristics)
        g.check_support()
        g.build_plans()
        size = g.get_workspace_size()
        if self._workspace_alloc and size > 0 and self._like is not None and _is_torch(self._like):
            import torch

            self._workspace = torch.empty(size, dtype=torch.uint8, device=self._like.device)
        if any(self._pending_io):
            self.set_io_tuples(*self._pending_io)
        return False

    # -- building -----------------------------------------------------------------------------
    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if self._graph is None:
            raise RuntimeError(f"Graph.{name}: use the graph inside its with-block (with Graph(...) as graph:)")
        attr = getattr(self._graph, name)
        if name in _PASS_THROUGH or not callable(attr):
            return attr
        if name in _BLOCKED:
            raise RuntimeError(f"Graph.{name}: not available through the wrapper, which builds and runs the graph itself")
        if name in ("tensor", "tensor_like", "tensor_scalar"):

            def make(*args, **kwargs):
                t = attr(*args, **kwargs)
                self._created.append(t)
                return t

            return make

        def op(*args, **kwargs):
            n = self._uses.get(name, 0)
            self._uses[name] = n + 1
            node = kwargs.get("name") or f"{name}.{n}"
            if node in self._nodes:
                raise ValueError(f"Graph.{name}: node name {node!r} is used already")
            self._nodes.add(node)
            kwargs["name"] = node
            args = [self._bind(f"{node}::{i}", a) for i, a in enumerate(args)]
            kwargs = {k: (v if k == "name" else self._bind(f"{node}::{k}", v)) for k, v in kwargs.items()}
            out = attr(*args, **kwargs)
            for i, t in enumerate(out if isinstance(out, (list, tuple)) else [out]):
                if isinstance(t, tensor):
                    self._outputs[t.get_name() or f"{node}::{i}"] = t
            return out

        return op

    def _bind(self, key, value):
        """An op's argument: arrays become graph tensors; tensors are recorded under ``key``."""
        if isinstance(value, tuple):  # sdpa's dropout: (probability, seed, offset)
            return tuple(self._bind(f"{key}::{j}", v) for j, v in enumerate(value))
        if _is_array(value):
            held = self._arrays.get(id(value))
            if held is None:
                source = value.detach() if _is_torch(value) and getattr(value, "requires_grad", False) else value
                held = self._arrays[id(value)] = (value, self._graph.tensor_like(source))
            if self._like is None:
                self._like = value
            value = held[1]
        if isinstance(value, tensor):
            self._inputs[key] = value
        return value

    # -- running ------------------------------------------------------------------------------
    def _find(self, item, where):
        """A graph tensor from a name (its key or its current name), a uid, a tensor or an array the
        graph was built from."""
        if isinstance(item, tensor):
            if item in self._created or item in where.values():
                return item
        elif isinstance(item, str):
            if item in where:
                return where[item]
            named = [t for t in where.values() if t.get_name() == item] + [t for t in self._created if t.get_name() == item]
            if named:
                return named[0]
        elif isinstance(item, int) and not isinstance(item, bool):
            found = [t for t in list(where.values()) + self._created if t.get_uid() == item]
            if found:
                return found[0]
        elif id(item) in self._arrays and self._arrays[id(item)][0] is item:
            t = self._arrays[id(item)][1]
            if t in where.values():
                return t
        return None

    def set_io_tuples(self, inputs, outputs):
        """The order of the arrays ``graph(...)`` takes and returns: names (``"node::argument"``,
        an output's key or a tensor's name), uids, tensors, or the arrays the graph was built from."""
        for what, value in (("inputs", inputs), ("outputs", outputs)):
            if not isinstance(value, (list, tuple)):
                raise ValueError(f"Graph.set_io_tuples: {what} must be a list or tuple, got {type(value).__name__}")
        if self._graph is None or not self._graph.get_execution_plan_count():
            self._pending_io = (list(inputs), list(outputs))
            return
        seen = []
        resolved = []
        for what, items, where in (("input", inputs, self._inputs), ("output", outputs, self._outputs)):
            ts = []
            for i, item in enumerate(items):
                t = self._find(item, where)
                if t is None:
                    raise ValueError(f"Graph.set_io_tuples: {what} {i} ({item!r}) is not one of the graph's {what} tensors")
                if any(t == s for s in seen):
                    raise ValueError(f"Graph.set_io_tuples: {what} {i} ({item!r}) is given twice")
                if what == "input" and t.get_is_virtual():
                    raise ValueError(f"Graph.set_io_tuples: input {i} ({item!r}) is a virtual tensor")
                seen.append(t)
                ts.append(t)
            resolved.append(tuple(ts))
        for what, where in (("output", self._outputs), ("input", self._inputs)):
            for key, t in where.items():
                if not t.get_is_virtual() and not any(t == s for s in seen):
                    raise ValueError(f"Graph.set_io_tuples: {what} {key!r} is not virtual but is neither among the inputs nor the outputs")
        self._io = tuple(resolved)

    def __call__(self, *args, **kwargs):
        if self._graph is None or not self._graph.get_execution_plan_count():
            raise RuntimeError("Graph: call the graph after its with-block (leaving the block builds it)")
        if len(args) == 1 and isinstance(args[0], dict):
            return self._call_with_dict(args[0], **kwargs)
        if self._io is None:
            raise ValueError("Graph: positional arguments need the order of inputs and outputs (Graph(inputs=, outputs=) or set_io_tuples)")
        ins, outs = self._io
        if len(args) != len(ins):
            raise ValueError(f"Graph: {len(args)} arguments for {len(ins)} inputs")
        like = next((a for a in args if _is_array(a)), self._like)
        results = [_empty_like(t, like) for t in outs]
        pack = {t.get_uid(): a for t, a in zip(ins, args)}
        pack.update({t.get_uid(): a for t, a in zip(outs, results)})
        self._run(pack, like, **kwargs)
        return results[0] if len(results) == 1 else tuple(results)

    def _call_with_dict(self, arrays, **kwargs):
        pack, missing = {}, []
        like = next((a for a in arrays.values() if _is_array(a)), self._like)
        for key, t in list(self._inputs.items()) + list(self._outputs.items()):
            if t.get_is_virtual() or t.get_uid() in pack:
                continue
            found = [arrays[k] for k in (key, t, t.get_name(), t.get_uid()) if k in arrays]
            if found:
                pack[t.get_uid()] = found[0]
            elif key in self._outputs:
                pack[t.get_uid()] = arrays[key] = _empty_like(t, like)
            else:
                missing.append(key)
        if missing:
            raise RuntimeError(f"Graph: no array for the inputs {missing}")
        self._run(pack, like, **kwargs)
        return arrays

    def _run(self, pack, like, handle=None, workspace=None, **kwargs):
        if handle is None:
            handle = self._handle
            if self._auto and like is not None and _is_torch(like) and like.is_cuda:
                import torch

                _ferrodnn.set_stream(handle=handle, stream=torch.cuda.current_stream(like.device).cuda_stream)
        if workspace is None:
            workspace = self._workspace
        self._graph.execute(pack, workspace, handle=handle, **kwargs)


__all__ = ["Graph"]
