"""Coverage-guided fuzzing of the Python argument layer (issue 29, item 7) with atheris.

Each input drives a short session on a CPU handle: tensors made with fuzzed dims, strides, data
types and flags; ops of the graph picked by name and called with fuzzed keyword arguments (the
graph's tensors, numbers, lists, strings, data types, None, and now and then an unknown keyword);
outputs marked; build; execute with a variant pack of fuzzed arrays (the right ones, too small,
wrong dtype, non-contiguous, scalars, lists, other objects) and by-value scalars. Every failure
must be an error the layer documents (a ``FerrodnnError``, ``TypeError``, ``ValueError`` or
``OverflowError``) with a message: a Rust panic (pyo3's ``PanicException``), an abort, a
segfault or another exception leaking from the layer's code (``AttributeError``,
``KeyError``...) is a crash, which atheris reports with the input that caused it.

Coverage: atheris instruments the Python code of the ``ferrodnn`` package (``__init__``,
``wrapper``, ``rnn``) and this script; the Rust extension's argument checks are not instrumented
(its coverage counters would need the extension built with SanitizerCoverage against atheris's
libFuzzer), so the search is guided by the Python side and by which exceptions come back (each kind a branch of the driver).

Run through ``scripts/fuzz.sh run python_args SECONDS`` (needs ``pip install atheris`` and the
package installed), or directly: ``python python/fuzz/fuzz_args.py CORPUS_DIR -max_total_time=60``.
"""

import os
import sys

# The fuzzers' host limits (as ferrodnn::testing::fuzz::set_limits), before the library loads.
os.environ.setdefault("FERRODNN_MAX_HOST_BYTES", "256M")
os.environ.setdefault("FERRODNN_CPU_MAX_WORK", "268435456")

import atheris  # noqa: E402

with atheris.instrument_imports(include=["ferrodnn"]):
    import ferrodnn as cudnn  # noqa: E402

import inspect  # noqa: E402

import numpy as np  # noqa: E402

DT = cudnn.data_type
TYPES = [DT.FLOAT, DT.HALF, DT.BFLOAT16, DT.DOUBLE, DT.INT32, DT.INT64, DT.INT8, DT.UINT8, DT.BOOLEAN, DT.FP8_E4M3, DT.NOT_SET]
NP_TYPES = [np.float32, np.float16, np.uint16, np.float64, np.int32, np.int64, np.int8, np.uint8, np.bool_]
# The graph's ops (their keyword names come from their signatures).
OPS = [
    "abs", "add", "add_square", "batchnorm", "batchnorm_inference", "bias", "binary_select", "ceil", "cmp_eq", "cmp_gt", "concatenate",
    "conv_dgrad", "conv_fprop", "conv_wgrad", "copy", "cos", "div", "elu", "erf", "exp", "gelu", "gen_index", "genstats", "group_norm",
    "identity", "instancenorm", "layernorm", "leaky_relu", "log", "logical_and", "logical_not", "matmul", "max", "min", "mod", "mul",
    "neg", "pow", "reciprocal", "reduction", "relu", "relu_backward", "resample", "reshape", "rmsnorm", "rng", "rsqrt", "scale", "sdpa",
    "sdpa_backward", "sigmoid", "slice", "softmax", "softmax_backward", "softplus", "sqrt", "sub", "swish", "tanh", "tensor_scalar",
    "transpose",
]
ENUMS = [getattr(cudnn, n) for n in ("norm_forward_phase", "reduction_mode", "heur_mode", "resample_mode", "padding_mode") if hasattr(cudnn, n)]
JUNK_KEYWORDS = ["strides", "io_datatype", "hnadle", "dims", "axis_", "epsilon_"]


def signature(f):
    """(name, required) of each parameter."""
    try:
        return [(n, p.default is inspect.Parameter.empty) for n, p in inspect.signature(f).parameters.items()]
    except (TypeError, ValueError):
        return []


def small_int(fdp):
    return fdp.PickValueInList([0, 1, 2, 3, 4, 8, 16, -1, -2, 1 << 20, 1 << 40, (1 << 63) - 1, -(1 << 63)]) if fdp.ConsumeBool() else fdp.ConsumeIntInRange(0, 9)


def int_list(fdp, n=None):
    return [small_int(fdp) for _ in range(fdp.ConsumeIntInRange(0, 5) if n is None else n)]


def enum_value(fdp):
    e = fdp.PickValueInList(ENUMS)
    names = [n for n in dir(e) if n.isupper()]
    return getattr(e, fdp.PickValueInList(names)) if names else None


def value(fdp, tensors, depth=0):
    """An argument: mostly a tensor of the graph, else one of many kinds of thing."""
    kind = fdp.ConsumeIntInRange(0, 11)
    if kind <= 3 and tensors:
        return fdp.PickValueInList(tensors)
    if kind == 4:
        return small_int(fdp)
    if kind == 5:
        return fdp.PickValueInList([0.0, 1.0, -1.0, 0.5, 1e-5, 1e30, float("inf"), float("nan"), -0.0])
    if kind == 6:
        return int_list(fdp)
    if kind == 7:
        return fdp.PickValueInList(TYPES)
    if kind == 8:
        return enum_value(fdp)
    if kind == 9:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 8))
    if kind == 10:
        return fdp.ConsumeBool()
    if kind == 11 and depth == 0 and tensors:
        return [value(fdp, tensors, 1) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    return None


def make_tensor(fdp, g, base):
    """A tensor: mostly of the session's dims `base` (so that ops on two of them agree)."""
    rank = fdp.ConsumeIntInRange(0, 5)
    dims = [fdp.ConsumeIntInRange(1, 6) if fdp.ConsumeProbability() < 0.9 else small_int(fdp) for _ in range(rank)]
    if fdp.ConsumeProbability() < 0.6:
        dims = list(base)
    kw = {"dim": dims, "name": "t%d" % fdp.ConsumeIntInRange(0, 3)}
    if fdp.ConsumeBool():
        kw["stride"] = int_list(fdp, rank if fdp.ConsumeProbability() < 0.8 else None)
    if fdp.ConsumeBool():
        kw["data_type"] = fdp.PickValueInList(TYPES)
    if fdp.ConsumeProbability() < 0.1:
        kw["is_pass_by_value"] = True
    if fdp.ConsumeProbability() < 0.05:
        kw["is_virtual"] = True
    if fdp.ConsumeProbability() < 0.05:
        kw["uid"] = small_int(fdp)
    if fdp.ConsumeProbability() < 0.05:
        kw[fdp.PickValueInList(JUNK_KEYWORDS)] = 1
    return g.tensor(**kw)


def array_for(fdp, t):
    """A buffer for tensor t: usually the right shape and dtype, else something a little off."""
    try:
        dims = [max(0, d) for d in t.get_dim()]
    except Exception:
        dims = [1]
    n = 1
    for d in dims:
        n *= max(d, 1)  # (a zero dim beside a huge one is still too many for numpy)
    shape = dims if n <= 1 << 16 else [4]
    kind = fdp.ConsumeIntInRange(0, 9)
    dtype = fdp.PickValueInList(NP_TYPES)
    if kind <= 4:
        return np.ones(shape, dtype=np.float32 if kind < 3 else dtype)
    if kind == 5:
        return np.ones([max(0, d - 1) for d in shape] or [0], dtype=np.float32)
    if kind == 6:
        a = np.ones([d * 2 for d in shape] or [2], dtype=np.float32)
        return a[tuple(slice(None, None, 2) for _ in a.shape)]
    if kind == 7:
        return fdp.PickValueInList([1.0, 2, [1.0, 2.0], np.float32(3.0), np.array(1.0), "x", None, object()])
    if kind == 8:
        return np.ones(fdp.ConsumeIntInRange(0, 64), dtype=dtype)
    return memoryview(np.ones(shape, dtype=np.float32))


def session(data):
    fdp = atheris.FuzzedDataProvider(data)
    io = fdp.PickValueInList(TYPES)
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT, handle=cudnn.create_cpu_handle(), name="fuzz")
    tensors = []
    base = [fdp.ConsumeIntInRange(1, 6) for _ in range(fdp.ConsumeIntInRange(1, 4))]
    for _ in range(fdp.ConsumeIntInRange(1, 3)):
        try:
            tensors.append(make_tensor(fdp, g, base))
        except Exception as e:
            check(e)
    for _ in range(fdp.ConsumeIntInRange(1, 3)):
        op = getattr(g, fdp.PickValueInList(OPS))
        # Required arguments mostly given, and mostly tensors; optional ones now and then.
        params = [(p, req) for p, req in signature(op) if p != "handle"]
        kw = {p: fdp.PickValueInList(tensors) if req and tensors and fdp.ConsumeProbability() < 0.7 else value(fdp, tensors) for p, req in params if fdp.ConsumeProbability() < (0.95 if req else 0.3)}
        if fdp.ConsumeProbability() < 0.05:
            kw[fdp.PickValueInList(JUNK_KEYWORDS)] = 0
        try:
            out = op(**kw)
        except Exception as e:
            check(e)
            continue
        outs = out if isinstance(out, (list, tuple)) else [out]
        tensors.extend(o for o in outs if isinstance(o, cudnn.tensor))
    for t in tensors:
        if fdp.ConsumeProbability() < 0.3:
            try:
                t.set_output(True)
            except Exception as e:
                check(e)
    try:
        g.build([cudnn.heur_mode.A])
    except Exception as e:
        check(e)
        if fdp.ConsumeBool():
            return
    pack = {}
    for t in tensors:
        if fdp.ConsumeProbability() < 0.9:
            pack[t if fdp.ConsumeProbability() < 0.9 else t.get_uid()] = array_for(fdp, t)
    strict = fdp.PickValueInList([None, True, False])
    workspace = fdp.PickValueInList([None, np.empty(0, np.uint8), np.empty(1 << 12, np.uint8)])
    try:
        g.execute(pack, workspace, strict=strict)
    except Exception as e:
        check(e)


def check(e):
    """An ordinary exception must say what went wrong (ferrodnn's own errors at least)."""
    kind = type(e).__name__
    # Each kind of error a distinct branch (a coverage feature for libFuzzer).
    if kind == "InvalidArgumentError":
        pass
    elif kind == "InvalidGraphError":
        pass
    elif kind == "NotSupportedError":
        pass
    elif kind == "TypeError":
        pass
    elif kind == "ValueError":
        pass
    elif kind == "OverflowError":
        pass
    # What the argument layer may raise (docs/python.md, "Errors"): ferrodnn's errors, TypeError
    # for wrong Python types, ValueError (OverflowError: a number out of range) for bad values.
    # Anything else (an AttributeError, KeyError, IndexError leaking from the layer's code) is
    # a finding.
    if not isinstance(e, (cudnn.FerrodnnError, TypeError, ValueError, OverflowError)):
        raise AssertionError("%s leaked from the argument layer: %s" % (kind, e)) from e
    if isinstance(e, cudnn.FerrodnnError) and not str(e).strip():
        raise AssertionError("a %s without a message" % type(e).__name__)


def test_one_input(data):
    session(data)


def main():
    # The driver's own branches (which op, which argument kinds, which exception came back) are
    # coverage too: the Rust side's answers show up as the paths this code takes on them.
    for f in (signature, small_int, int_list, enum_value, value, make_tensor, array_for, session, check):
        globals()[f.__name__] = atheris.instrument_func(f)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
