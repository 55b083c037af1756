"""The cudnn frontend's module surface on ferrodnn (CPU engine, numpy): the version the frontend's
tests compare, its enums and classes, and its plan methods called as its tests and samples call
them (test/python/test_conv_bias.py, test_matmul_bias_relu.py, test_conv_fprop.py and
samples/python/02_low_level_api.ipynb of NVIDIA/cudnn-frontend), each result checked: plan counts
against the plans built, notes against ferrodnn's, plans built by index and executed against
numpy. Errors are checked for the names they must give."""

import json
import re

import numpy as np
import pytest

import ferrodnn as cudnn

F32 = cudnn.data_type.FLOAT
RNG = np.random.default_rng(7)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def cpu_graph(name="fe"):
    return cudnn.pygraph(name=name, io_data_type=F32, intermediate_data_type=F32, compute_data_type=F32, handle=cudnn.create_cpu_handle())


def matmul_bias_relu(g):
    """Y = relu(X @ W + B) as test_matmul_bias_relu builds it (3-d, broadcast bias)."""
    X = g.tensor(name="X", dim=[2, 4, 8], stride=[32, 8, 1], data_type=F32)
    W = g.tensor(name="W", dim=[1, 8, 5], stride=[40, 5, 1], data_type=F32)
    B = g.tensor(name="B", dim=[1, 1, 5], stride=[5, 5, 1], data_type=F32)
    response = g.matmul(name="matmul", A=X, B=W)
    Y = g.relu(name="relu", input=g.bias(name="bias", input=response, bias=B))
    Y.set_output(True).set_data_type(F32)
    return X, W, B, Y


def matmul_bias_relu_data():
    x, w, b = rand(2, 4, 8), rand(1, 8, 5), rand(1, 1, 5)
    return x, w, b, np.maximum(x @ w + b, 0)


# ---------------------------------------------------------------------------------------------
# Version


def loose(v):
    """The components distutils' LooseVersion compares for these strings: numbers as ints."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+|[a-z]+|\.)", v) if p and p != "."]


def test_backend_version_is_the_cudnn_api_level():
    s = cudnn.backend_version_string()
    assert re.fullmatch(r"\d+\.\d+\.\d+", s), s
    major, minor, patch = map(int, s.split("."))
    assert cudnn.backend_version() == major * 10000 + minor * 100 + patch
    assert (major, minor) >= (9, 0)
    # ferrodnn's own version is kept apart from the API level.
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", cudnn.__version__) and cudnn.__version__ != s


# Thresholds the frontend's tests compare with: all are below the API level ferrodnn reports.
FRONTEND_THRESHOLDS = ["8.6", "8.8", "8.9", "8.9.4", "8.9.5", "8.9.6", "9.5", "9.5.0", "9.10", "9.11"]


@pytest.mark.parametrize("threshold", FRONTEND_THRESHOLDS)
def test_version_string_compares_as_the_frontend_tests_compare_it(threshold):
    s = cudnn.backend_version_string()
    assert not loose(s) < loose(threshold)
    assert loose(s) > loose(threshold)


@pytest.mark.parametrize("threshold", FRONTEND_THRESHOLDS)
def test_version_string_with_looseversion(threshold):
    LooseVersion = pytest.importorskip("looseversion").LooseVersion
    v = LooseVersion(cudnn.backend_version_string())
    assert not v < threshold  # raised TypeError when the string was "ferrodnn 0.1.0"
    assert v >= LooseVersion(threshold)
    assert v < "99.0"


def test_backend_version_int_comparisons():
    v = cudnn.backend_version()
    assert isinstance(v, int) and not v < 90500 and not v < 91400
    assert cudnn.get_cudnn_version() == v


# ---------------------------------------------------------------------------------------------
# Enums and classes (NVIDIA/cudnn-frontend python/properties.cpp and python/cudnn/__init__.py)

FRONTEND_ENUMS = {
    "data_type": ["FLOAT", "DOUBLE", "HALF", "INT8", "INT32", "INT8x4", "UINT8", "UINT8x4", "INT8x32", "BFLOAT16", "INT64", "BOOLEAN",
                  "FP8_E4M3", "FP8_E5M2", "FAST_FLOAT_FOR_FP8", "FP8_E8M0", "FP4_E2M1", "INT4", "NOT_SET"],
    "tensor_reordering": ["NONE", "INT8x32", "F16x16", "F8_128x4"],
    "scalar_type": ["RUNTIME_PARAM", "COMPILE_TIME_CONST"],
    "reshape_mode": ["VIEW_ONLY", "LOGICAL"],
    "knob_type": ["NOT_SET", "SWIZZLE", "TILE_SIZE", "EDGE", "MULTIPLY", "SPLIT_K_BUF", "TILEK", "STAGES", "REDUCTION_MODE", "SPLIT_K_SLC",
                  "IDX_MODE", "SPECFILT", "KERNEL_CFG", "WORKSPACE", "TILE_CGA_M", "TILE_CGA_N", "BLOCK_SIZE", "OCCUPANCY",
                  "ARRAY_SIZE_PER_THREAD", "SPLIT_COLS", "TILE_ROWS", "TILE_COLS", "LOAD_SIZE", "CTA_COUNT", "STREAM_K", "SPLIT_P_SLC",
                  "TILE_M", "TILE_N", "WARP_SPEC_CFG"],
    "norm_forward_phase": ["INFERENCE", "TRAINING", "NOT_SET"],
    "heur_mode": ["A", "B", "FALLBACK", "OPENSOURCE"],
    "convolution_mode": ["CONVOLUTION", "CROSS_CORRELATION"],
    "reduction_mode": ["ADD", "MUL", "MIN", "MAX", "AMAX", "AVG", "NORM1", "NORM2", "MUL_NO_ZEROS", "NOT_SET"],
    "build_plan_policy": ["HEURISTICS_CHOICE", "ALL"],
    "numerical_note": ["TENSOR_CORE", "DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION", "FFT", "NONDETERMINISTIC", "WINOGRAD",
                       "WINOGRAD_TILE_4x4", "WINOGRAD_TILE_6x6", "WINOGRAD_TILE_13x13", "STRICT_NAN_PROP"],
    "behavior_note": ["RUNTIME_COMPILATION", "REQUIRES_FILTER_INT8x32_REORDER", "REQUIRES_BIAS_INT8x32_REORDER",
                      "SUPPORTS_CUDA_GRAPH_NATIVE_API", "CUBLASLT_DEPENDENCY"],
    "diagonal_alignment": ["TOP_LEFT", "BOTTOM_RIGHT"],
    "attention_implementation": ["AUTO", "COMPOSITE", "UNIFIED"],
    "moe_grouped_matmul_mode": ["NONE", "GATHER", "SCATTER"],
}

# The names the frontend's package takes from its compiled module, and its Python-level ones.
FRONTEND_SYMBOLS = [
    "backend_version", "backend_version_string", "get_last_error_string", "destroy_handle", "norm_forward_phase", "reduction_mode",
    "behavior_note", "knob_type", "create_handle", "create_kernel_cache", "create_device_properties", "get_stream", "numerical_note",
    "set_stream", "build_plan_policy", "data_type", "tensor_reordering", "heur_mode", "pygraph", "tensor", "knob",
    "cudnnGraphNotSupportedError", "diagonal_alignment", "attention_implementation", "moe_grouped_matmul_mode", "scalar_type",
    "reshape_mode", "convolution_mode", "graph", "jit", "graph_cache",
]


@pytest.mark.parametrize("name", sorted(FRONTEND_SYMBOLS))
def test_frontend_module_symbols_exist(name):
    assert hasattr(cudnn, name), name


@pytest.mark.parametrize("enum", sorted(FRONTEND_ENUMS))
def test_frontend_enums_have_the_frontend_members(enum):
    cls = getattr(cudnn, enum)
    members = [getattr(cls, m) for m in FRONTEND_ENUMS[enum]]
    assert len(set(members)) == len(members), f"{enum} members are not distinct"
    for m, name in zip(members, FRONTEND_ENUMS[enum]):
        assert isinstance(m, cls) and repr(m).endswith(name)


@pytest.mark.parametrize("enum", sorted(FRONTEND_ENUMS))
def test_frontend_enums_name_value_and_pickle_as_pybind11s(enum):
    # The frontend's tests read `.name` (attention_implementation in test_mhas's ids) and copy
    # their parameters (diagonal_alignment in test_mhas_v2's), as pybind11's enums allow.
    import copy
    import pickle

    cls = getattr(cudnn, enum)
    values = set()
    for name in FRONTEND_ENUMS[enum]:
        m = getattr(cls, name)
        assert m.name == name
        assert isinstance(m.value, int) and m.value == int(m)
        values.add(m.value)
        assert pickle.loads(pickle.dumps(m)) == m
        assert copy.deepcopy({"x": m})["x"] == m
    assert len(values) == len(FRONTEND_ENUMS[enum])


def test_error_classes():
    assert issubclass(cudnn.cudnnGraphNotSupportedError, RuntimeError)
    assert cudnn.cudnnGraphNotSupportedError is cudnn.NotSupportedError
    for e in (cudnn.InvalidGraphError, cudnn.InvalidArgumentError, cudnn.NotSupportedError, cudnn.SerializationError, cudnn.DeviceError):
        assert issubclass(e, cudnn.FerrodnnError)


def test_knob_class():
    k = cudnn.knob(knob_type=cudnn.knob_type.TILE_M, max_value=4, min_value=1, stride=1)
    assert (k.type, k.max_value, k.min_value, k.stride, k.name) == (cudnn.knob_type.TILE_M, 4, 1, 1, None)
    assert "TILE_M" in repr(k)
    with pytest.raises(ValueError, match="knob: stride"):
        cudnn.knob(cudnn.knob_type.TILE_M, 4, 1, 0)
    with pytest.raises(ValueError, match="min_value 5 is greater than max_value 4"):
        cudnn.knob(cudnn.knob_type.TILE_M, 4, 5, 1)


def test_reduction_mode_not_set_is_refused():
    g = cpu_graph()
    X = g.tensor(name="X", dim=[2, 3], stride=[3, 1])
    with pytest.raises(ValueError, match="reduction.*NOT_SET"):
        g.reduction(input=X, mode=cudnn.reduction_mode.NOT_SET)


# ---------------------------------------------------------------------------------------------
# Plans: counts, notes, building by index, engines and knobs


def test_plan_list_as_test_matmul_bias_relu_uses_it():
    g = cpu_graph("mbr")
    X, W, B, Y = matmul_bias_relu(g)
    g.validate()
    g.build_operation_graph()
    assert g.get_execution_plan_count() == 0
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    n = g.get_execution_plan_count()
    assert n >= 1
    for i in range(n):
        name = g.get_plan_name_at_index(i)
        assert name.split("[")[0] in ("cpu", "cuda", "reference")
        # ferrodnn's behavior notes: CUDA plans compile kernels when built, CPU plans (the fast
        # engine and the f64 reference) do not, and both CPU engines are deterministic at full
        # precision.
        notes = g.get_behavior_notes_for_plan_at_index(i)
        assert (cudnn.behavior_note.RUNTIME_COMPILATION in notes) == name.startswith("cuda"), (name, notes)
        if not name.startswith("cuda"):
            assert g.get_numerical_notes_for_plan_at_index(i) == []
        assert g.get_workspace_size_plan_at_index(i) == 0  # not built yet
    g.check_support()
    g.build_plans()
    assert g.get_execution_plan_count() == n  # building adds no plan
    notes = g.get_behavior_notes()
    assert notes == g.get_behavior_notes_for_plan_at_index(0)  # plan 0 builds on the CPU engine
    x, w, b, expected = matmul_bias_relu_data()
    y = np.zeros_like(expected)
    workspace = np.empty(g.get_workspace_size(), np.uint8)
    g.execute({X: x, W: w, B: b, Y: y}, workspace)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_the_reference_plan_runs_host_arrays_by_index():
    g = cpu_graph("reference_by_index")
    X, W, B, Y = matmul_bias_relu(g)
    g.create_execution_plans([cudnn.heur_mode.A])
    names = [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())]
    # The fast CPU engine ranks before the f64 reference.
    assert names.index("cpu[]") < names.index("reference[]"), names
    i = names.index("reference[]")
    g.build_plan_at_index(i)
    x, w, b, expected = matmul_bias_relu_data()
    y = np.zeros_like(expected)
    g.execute_plan_at_index({X: x, W: w, B: b, Y: y}, np.empty(g.get_workspace_size_plan_at_index(i), np.uint8), index=i)
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)


def test_build_plan_at_index_then_execute_it():
    g = cpu_graph("by_index")
    X, W, B, Y = matmul_bias_relu(g)
    g.create_execution_plans([cudnn.heur_mode.A])
    cpu = [i for i in range(g.get_execution_plan_count()) if g.get_plan_name_at_index(i).startswith("cpu")]
    assert cpu
    i = cpu[-1]
    g.build_plan_at_index(i)
    workspace = np.empty(g.get_workspace_size_plan_at_index(i), np.uint8)
    x, w, b, expected = matmul_bias_relu_data()
    y = np.zeros_like(expected)
    g.execute_plan_at_index({X: x, W: w, B: b, Y: y}, workspace, index=i)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    # The plan built by index is the one execute runs, as in the frontend.
    y[:] = 0
    g.execute({X: x, W: w, B: b, Y: y}, workspace)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    assert g.get_behavior_notes() == g.get_behavior_notes_for_plan_at_index(i)


def test_plans_built_by_policy_all():
    g = cpu_graph("all")
    X, W, B, Y = matmul_bias_relu(g)
    g.create_execution_plans([cudnn.heur_mode.A])
    g.create_execution_plan(0, {})  # a second CPU plan, so that ALL has two to build
    n = g.get_execution_plan_count()
    g.build_plans(cudnn.build_plan_policy.ALL)
    x, w, b, expected = matmul_bias_relu_data()
    for i in range(n):
        y = np.zeros_like(expected)
        g.execute_plan_at_index({X: x, W: w, B: b, Y: y}, None, i)
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_unbuilt_and_out_of_range_plans_are_errors():
    g = cpu_graph("errs")
    X, W, B, Y = matmul_bias_relu(g)
    g.create_execution_plans([cudnn.heur_mode.A])
    g.create_execution_plan(0, {})
    n = g.get_execution_plan_count()
    x, w, b, expected = matmul_bias_relu_data()
    pack = {X: x, W: w, B: b, Y: np.zeros_like(expected)}
    g.build_plan_at_index(0)
    with pytest.raises(cudnn.InvalidArgumentError, match=rf"execute_plan_at_index: plan {n - 1} \(cpu\[\]\) is not built.*build_plan_at_index\({n - 1}\)"):
        g.execute_plan_at_index(pack, None, n - 1)
    for method, call in [
        ("execute_plan_at_index", lambda: g.execute_plan_at_index(pack, None, n)),
        ("build_plan_at_index", lambda: g.build_plan_at_index(n)),
        ("get_plan_name_at_index", lambda: g.get_plan_name_at_index(-1)),
        ("get_behavior_notes_for_plan_at_index", lambda: g.get_behavior_notes_for_plan_at_index(n + 3)),
        ("get_workspace_size_plan_at_index", lambda: g.get_workspace_size_plan_at_index(n)),
    ]:
        with pytest.raises(cudnn.InvalidArgumentError) as e:
            call()
        msg = str(e.value)
        assert method in msg and "out of range" in msg and f"has {n} execution plans" in msg, msg


def test_engines_and_knobs_as_test_conv_bias_uses_them():
    """test_conv_relu_execution_plan_creation: every engine's KERNEL_CFG knob values, each as a
    plan, then check_support, build_plans and execute."""
    handle = cudnn.create_cpu_handle()
    g = cudnn.pygraph(io_data_type=F32, intermediate_data_type=F32, compute_data_type=F32, handle=handle)
    x, w = rand(2, 3, 6, 7), rand(4, 3, 3, 2)
    X = g.tensor(name="X", dim=x.shape, stride=[s // 4 for s in x.strides], data_type=F32)
    W = g.tensor(name="W", dim=w.shape, stride=[s // 4 for s in w.strides], data_type=F32)
    conv_output = g.conv_fprop(image=X, weight=W, padding=[0, 1], stride=[2, 1], dilation=[1, 1])
    Y = g.relu(name="relu", input=conv_output, lower_clip=0.0, upper_clip=2.0)
    Y.set_output(True)
    g.validate()
    g.build_operation_graph()
    # The fast CPU engine and the f64 reference.
    assert g.get_engine_count() == len(handle.engines()) == 2
    created = 0
    for engine in range(g.get_engine_count()):
        try:
            knobs = g.get_knobs_for_engine(engine)
        except RuntimeError:
            continue
        assert knobs == []  # the CPU engines have no knobs
        for knob in knobs:
            if knob.type == cudnn.knob_type.KERNEL_CFG:
                for kernel_cfg in range(knob.min_value, knob.max_value + 1, knob.stride):
                    try:
                        g.create_execution_plan(engine, {cudnn.knob_type.KERNEL_CFG: kernel_cfg})
                        created += 1
                    except RuntimeError:
                        continue
    assert created == g.get_execution_plan_count() == 0
    g.check_support()  # no plan was created: ferrodnn creates the handle's candidates
    g.build_plans()
    assert g.get_execution_plan_count() >= 1
    expected = np.clip(conv2d(x, w, (0, 1), (2, 1)), 0.0, 2.0)
    assert Y.get_dim() == list(expected.shape)
    y = np.zeros_like(expected)
    g.execute({X: x, W: w, Y: y}, np.empty(g.get_workspace_size(), np.uint8))
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def conv2d(x, w, pad, stride):
    """Cross-correlation of NCHW x with KCRS w, zero padding pad on both sides."""
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    oh = (h + 2 * pad[0] - r) // stride[0] + 1
    ow = (wd + 2 * pad[1] - s) // stride[1] + 1
    y = np.zeros((n, k, oh, ow), np.float64)
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride[0]:i * stride[0] + r, j * stride[1]:j * stride[1] + s]
            y[:, :, i, j] = np.einsum("ncrs,kcrs->nk", patch, w)
    return y.astype(np.float32)


def test_create_execution_plan_with_engine_and_knobs():
    g = cpu_graph("create")
    X, W, B, Y = matmul_bias_relu(g)
    g.validate()
    g.create_execution_plan(0, {})
    assert g.get_execution_plan_count() == 1 and g.get_plan_name_at_index(0) == "cpu[]"
    g.build_plan_at_index(0)
    x, w, b, expected = matmul_bias_relu_data()
    y = np.zeros_like(expected)
    g.execute_plan_at_index({X: x, W: w, B: b, Y: y}, None, 0)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "knobs, error, words",
    [
        ({cudnn.knob_type.KERNEL_CFG: 1}, cudnn.NotSupportedError, ["create_execution_plan", "cpu", "KERNEL_CFG"]),
        ({"tile": 2}, cudnn.NotSupportedError, ["create_execution_plan", "cpu", '"tile"']),
        ({cudnn.knob(cudnn.knob_type.SWIZZLE, 1, 0, 1): 1}, cudnn.NotSupportedError, ["SWIZZLE"]),
        ({3.5: 1}, TypeError, ["create_execution_plan", "knob keys", "float"]),
        ({"tile": True}, TypeError, ["create_execution_plan", "knob values", "bool"]),
        ({"tile": "2"}, TypeError, ["create_execution_plan", "knob values", "str"]),
    ],
)
def test_create_execution_plan_bad_knobs(knobs, error, words):
    g = cpu_graph("bad_knobs")
    matmul_bias_relu(g)
    with pytest.raises(error) as e:
        g.create_execution_plan(0, knobs)
    assert all(word in str(e.value) for word in words), str(e.value)
    assert g.get_execution_plan_count() == 0


@pytest.mark.parametrize("method", ["create_execution_plan", "get_knobs_for_engine"])
@pytest.mark.parametrize("engine_id", [2, -1, 99])
def test_engine_ids_out_of_range(method, engine_id):
    g = cpu_graph("engines")
    matmul_bias_relu(g)
    call = (lambda: g.create_execution_plan(engine_id, {})) if method == "create_execution_plan" else (lambda: g.get_knobs_for_engine(engine_id))
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        call()
    msg = str(e.value)
    assert method in msg and f"engine id {engine_id}" in msg and "2 engines (0: cpu, 1: reference)" in msg, msg


@pytest.mark.parametrize("modes", ["A", [1], [cudnn.heur_mode.A, "B"], 3.0])
def test_heur_modes_are_checked(modes):
    g = cpu_graph("modes")
    matmul_bias_relu(g)
    for method in ("create_execution_plans", "build"):
        with pytest.raises(TypeError, match=f"{method}: heur_modes"):
            getattr(g, method)(modes)


def test_heur_modes_single_value_and_opensource_accepted():
    g = cpu_graph("modes_ok")
    matmul_bias_relu(g)
    g.create_execution_plans(cudnn.heur_mode.OPENSOURCE)
    g.build([cudnn.heur_mode.B, cudnn.heur_mode.FALLBACK])
    assert g.get_execution_plan_count() >= 1


# ---------------------------------------------------------------------------------------------
# Filters


def test_deselecting_the_fast_cpu_engine_runs_the_reference():
    g = cpu_graph("deselect_fast")
    X, W, B, Y = matmul_bias_relu(g)
    g.deselect_engines(["cpu"])
    g.create_execution_plans([cudnn.heur_mode.A])
    g.build_plans()
    assert g.get_plan_name_at_index(1) == "reference[]"
    x, w, b, expected = matmul_bias_relu_data()
    y = np.zeros_like(expected)
    g.execute({X: x, W: w, B: b, Y: y}, None)
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)


def test_deselect_engines_by_name():
    g = cpu_graph("deselect")
    X, W, B, Y = matmul_bias_relu(g)
    g.deselect_engines(["cpu", "reference"])
    g.create_execution_plans([cudnn.heur_mode.A])
    with pytest.raises(cudnn.NotSupportedError) as e:
        g.build_plans()
    msg = str(e.value)
    assert '"deselect"' in msg and "plan 0 (cpu[])" in msg and "plan 1 (reference[])" in msg and "deselect_engines" in msg, msg
    with pytest.raises(cudnn.NotSupportedError, match=r"build_plan_at_index: plan 0 \(cpu\[\]\).*deselect_engines"):
        g.build_plan_at_index(0)
    x, w, b, expected = matmul_bias_relu_data()
    with pytest.raises(cudnn.NotSupportedError, match="host arrays, but every plan of the cpu engine is deselected"):
        g.execute({X: x, W: w, B: b, Y: np.zeros_like(expected)}, None)
    g.deselect_engines([])  # replaces the names, as the frontend's does
    g.build_plans()
    y = np.zeros_like(expected)
    g.execute({X: x, W: w, B: b, Y: y}, None)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "select, passes, word",
    [
        (lambda g: g.deselect_numeric_notes([cudnn.numerical_note.NONDETERMINISTIC]), True, None),
        (lambda g: g.deselect_numeric_notes([cudnn.numerical_note.REDUCED_PRECISION_REDUCTION, cudnn.numerical_note.DOWN_CONVERT_INPUTS]), True, None),
        (lambda g: g.deselect_behavior_notes([cudnn.behavior_note.RUNTIME_COMPILATION]), True, None),
        (lambda g: g.select_numeric_notes([cudnn.numerical_note.TENSOR_CORE]), False, "select_numeric_notes: it lacks numerical_note.TENSOR_CORE"),
        (lambda g: g.select_behavior_notes([cudnn.behavior_note.RUNTIME_COMPILATION]), False, "select_behavior_notes: it lacks behavior_note.RUNTIME_COMPILATION"),
        (lambda g: g.deselect_workspace_greater_than(0), True, None),
        (lambda g: g.deselect_workspace_greater_than(-1), False, "workspace of 0 bytes is greater than -1"),
    ],
)
def test_note_and_workspace_filters_on_cpu_plans(select, passes, word):
    """CPU plans are deterministic, full precision and not runtime compiled; the reference plan
    needs no workspace (so it runs when plans with one are deselected)."""
    g = cpu_graph("filters")
    X, W, B, Y = matmul_bias_relu(g)
    g.create_execution_plans([cudnn.heur_mode.A])
    select(g)
    if passes:
        g.build_plans()
        x, w, b, expected = matmul_bias_relu_data()
        y = np.zeros_like(expected)
        g.execute({X: x, W: w, B: b, Y: y}, None)
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    else:
        with pytest.raises(cudnn.NotSupportedError) as e:
            g.build_plans()
        assert word in str(e.value) and "plan 0 (cpu[])" in str(e.value), str(e.value)


def test_filters_take_note_enums():
    g = cpu_graph("filter_types")
    with pytest.raises(TypeError):
        g.deselect_numeric_notes(["NONDETERMINISTIC"])
    with pytest.raises(TypeError):
        g.select_behavior_notes([cudnn.numerical_note.TENSOR_CORE])


# ---------------------------------------------------------------------------------------------
# Tensors: query by uid, scalars, attributes


def test_query_tensor_attributes_of_uid():
    g = cpu_graph("query")
    X, W, B, Y = matmul_bias_relu(g)
    X.set_uid(10)
    g.validate()
    q = g.query_tensor_attributes_of_uid(10)
    assert q == X and q.get_name() == "X" and q.get_dim() == [2, 4, 8] and q.get_stride() == [32, 8, 1] and q.get_data_type() == F32
    assert g.query_tensor_attributes_of_uid(Y.get_uid()).get_dim() == [2, 4, 5]
    with pytest.raises(ValueError, match="uid 12345"):
        g.query_tensor_attributes_of_uid(12345)


@pytest.mark.parametrize("kind", ["RUNTIME_PARAM", "COMPILE_TIME_CONST"])
def test_tensor_scalar(kind):
    scalar_type = getattr(cudnn.scalar_type, kind)
    g = cpu_graph("scalar")
    X = g.tensor(name="X", dim=[2, 3], stride=[3, 1], data_type=F32)
    S = g.tensor_scalar(3.0, scalar_type)
    assert S.get_dim() == [1] and S.get_stride() == [1] and S.get_data_type() == F32 and S.get_is_pass_by_value()
    assert S.get_has_compile_time_constant() == (kind == "COMPILE_TIME_CONST")
    Y = g.mul(a=X, b=S)
    Y.set_output(True)
    g.build([cudnn.heur_mode.A])
    x, y = rand(2, 3), np.zeros((2, 3), np.float32)
    g.execute({X: x, Y: y}, None)  # the value comes from the graph
    np.testing.assert_allclose(y, 3 * x, rtol=1e-6)
    if kind == "RUNTIME_PARAM":
        g.execute({X: x, Y: y, S: 5.0}, None)  # a runtime parameter takes another value
        np.testing.assert_allclose(y, 5 * x, rtol=1e-6)
    else:
        with pytest.raises(cudnn.InvalidArgumentError, match="compile-time constant"):
            g.execute({X: x, Y: y, S: 5.0}, None)
    assert g.tensor_scalar(7, scalar_type).get_data_type() == cudnn.data_type.INT32
    assert g.tensor_scalar(2**40, scalar_type).get_data_type() == cudnn.data_type.INT64


@pytest.mark.parametrize("value, error, word", [(True, TypeError, "bool"), ("1", TypeError, "str"), (2**70, ValueError, "64 bits")])
def test_tensor_scalar_bad_values(value, error, word):
    g = cpu_graph("bad_scalar")
    with pytest.raises(error) as e:
        g.tensor_scalar(value, cudnn.scalar_type.RUNTIME_PARAM)
    assert "tensor_scalar" in str(e.value) and word in str(e.value), str(e.value)


def test_data_types_are_filled_in_at_validation():
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=F32, compute_data_type=F32, handle=cudnn.create_cpu_handle())
    X = g.tensor(name="X", dim=[2, 3], stride=[3, 1])
    T = g.relu(input=X)
    Y = g.neg(input=T)
    Y.set_output(True)
    assert [t.get_data_type() for t in (X, T, Y)] == [cudnn.data_type.NOT_SET] * 3
    g.validate()
    assert [t.get_data_type() for t in (X, T, Y)] == [cudnn.data_type.HALF, F32, cudnn.data_type.HALF]
    Y.set_data_type(F32)  # a type set stays the tensor's own
    assert Y.get_data_type() == F32


def test_tensor_attribute_methods():
    g = cpu_graph("attrs")
    X = g.tensor(name="X", dim=[2, 3], stride=[3, 1], data_type=F32, reordering_type=cudnn.tensor_reordering.NONE)
    assert X.get_reordering_type() == cudnn.tensor_reordering.NONE
    assert X.set_reordering_type(cudnn.tensor_reordering.NONE) is X
    assert X.get_alignment() == 16
    assert X.set_alignment(64) is X and X.get_alignment() == 64
    assert X.get_vector_count() == 1 and X.get_vector_dimension() == -1
    assert X.set_vector_count_and_dimension(1, 1) is X and X.get_vector_dimension() == 1
    assert not X.get_has_compile_time_constant()


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda g, X: X.set_reordering_type(cudnn.tensor_reordering.INT8x32), cudnn.NotSupportedError, ["set_reordering_type", "INT8x32"]),
        (lambda g, X: X.set_reordering_type("NONE"), TypeError, ["set_reordering_type", "str"]),
        (lambda g, X: g.tensor(name="Z", dim=[4], reordering_type=cudnn.tensor_reordering.F16x16), cudnn.NotSupportedError, ["tensor", "F16x16"]),
        (lambda g, X: X.set_alignment(3), ValueError, ["set_alignment", "3"]),
        (lambda g, X: X.set_alignment(0), ValueError, ["set_alignment", "0"]),
        (lambda g, X: X.set_vector_count_and_dimension(4, 1), cudnn.NotSupportedError, ["set_vector_count_and_dimension", "4"]),
        (lambda g, X: X.set_vector_count_and_dimension(1, 2), ValueError, ["set_vector_count_and_dimension", "dimension 2", "rank 2"]),
    ],
)
def test_tensor_attribute_errors(call, error, words):
    g = cpu_graph("attr_errs")
    X = g.tensor(name="X", dim=[2, 3], stride=[3, 1], data_type=F32)
    with pytest.raises(error) as e:
        call(g, X)
    assert all(w in str(e.value) for w in words), str(e.value)


# ---------------------------------------------------------------------------------------------
# Serialization (samples/python/02_low_level_api.ipynb)


def serialized_matmul_bias():
    g = cpu_graph("ser")
    a = g.tensor(name="a", dim=[2, 4, 8], stride=[32, 8, 1], data_type=F32)
    b = g.tensor(name="b", dim=[2, 8, 5], stride=[40, 5, 1], data_type=F32)
    d = g.tensor(name="d", dim=[1, 4, 5], stride=[20, 5, 1], data_type=F32)
    a.set_uid(0)
    b.set_uid(1)
    d.set_uid(2)
    ab = g.matmul(name="mm", A=a, B=b)
    c = g.bias(name="bias", input=ab, bias=d)
    c.set_output(True).set_uid(3)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return g, g.serialize()


def test_serialize_deserialize_keeps_the_plan():
    g, data = serialized_matmul_bias()
    newgraph = cudnn.pygraph(handle=cudnn.create_cpu_handle())
    newgraph.deserialize(data)
    assert newgraph.get_execution_plan_count() == 1
    assert newgraph.get_plan_name_at_index(0) == g.get_plan_name_at_index(0)
    workspace = np.empty(newgraph.get_workspace_size(), np.uint8)
    a, b, d = rand(2, 4, 8), rand(2, 8, 5), rand(1, 4, 5)
    c = np.zeros((2, 4, 5), np.float32)
    newgraph.execute({0: a, 1: b, 2: d, 3: c}, workspace)
    np.testing.assert_allclose(c, a @ b + d, rtol=1e-5, atol=1e-5)
    assert newgraph.get_behavior_notes() == g.get_behavior_notes()


def test_deserialize_refuses_a_plan_of_another_graph():
    _, data = serialized_matmul_bias()
    env = json.loads(bytes(data))
    env["plan"]["graph_key"] ^= 1
    newgraph = cudnn.pygraph(handle=cudnn.create_cpu_handle())
    with pytest.raises(cudnn.SerializationError, match=r"its plan \(cpu\[\]\) cannot be restored.*another graph"):
        newgraph.deserialize(json.dumps(env))
    assert newgraph.get_execution_plan_count() == 0  # the graph is left as it was


def test_deserialize_refuses_knobs_the_engine_lacks():
    _, data = serialized_matmul_bias()
    env = json.loads(bytes(data))
    env["plan"]["knobs"] = [{"name": "tile", "value": 3}]
    newgraph = cudnn.pygraph(handle=cudnn.create_cpu_handle())
    with pytest.raises(cudnn.SerializationError, match=r'its plan \(cpu\[tile=3\]\) cannot be restored: engine cpu has no knob "tile"'):
        newgraph.deserialize(json.dumps(env))


def test_deserialize_a_plan_of_an_engine_the_handle_lacks():
    """A graph serialized with a CUDA plan, read on a CPU handle: the graph gets its plans anew."""
    _, data = serialized_matmul_bias()
    env = json.loads(bytes(data))
    env["plan"] = {"engine": "cuda", "knobs": [{"name": "fused", "value": 1}], "graph_key": env["plan"]["graph_key"]}
    newgraph = cudnn.pygraph(handle=cudnn.create_cpu_handle())
    newgraph.deserialize(json.dumps(env))
    assert newgraph.get_execution_plan_count() == 0
    a, b, d = rand(2, 4, 8), rand(2, 8, 5), rand(1, 4, 5)
    c = np.zeros((2, 4, 5), np.float32)
    newgraph.execute({0: a, 1: b, 2: d, 3: c}, None)
    np.testing.assert_allclose(c, a @ b + d, rtol=1e-5, atol=1e-5)
    assert newgraph.get_plan_name_at_index(0) == "cpu[]"


def test_serialize_without_a_built_plan_has_none():
    g = cpu_graph("unbuilt")
    matmul_bias_relu(g)
    g.validate()
    env = json.loads(bytes(g.serialize()))
    assert env["plan"] is None
    newgraph = cudnn.pygraph(handle=cudnn.create_cpu_handle())
    newgraph.deserialize(g.serialize())
    assert newgraph.get_execution_plan_count() == 0


# ---------------------------------------------------------------------------------------------
# What ferrodnn cannot do: clear errors


REFUSED_OPS = ["sdpa_fp8", "sdpa_fp8_backward", "sdpa_mxfp8", "sdpa_mxfp8_backward", "block_scale_quantize", "block_scale_dequantize",
               "moe_grouped_matmul", "moe_grouped_matmul_bwd"]


@pytest.mark.parametrize("method", REFUSED_OPS)
def test_frontend_ops_ferrodnn_lacks_raise_not_supported(method):
    g = cpu_graph("refused")
    X = g.tensor(name="X", dim=[1, 2, 4, 8], stride=[64, 32, 8, 1])
    with pytest.raises(cudnn.NotSupportedError, match=f"pygraph.{method}: .* is not supported by ferrodnn"):
        getattr(g, method)(X, X, X, name="op")


@pytest.mark.parametrize("method", ["populate_cuda_graph", "update_cuda_graph"])
def test_cuda_graph_methods_raise_not_supported(method):
    g = cpu_graph("cuda_graph")
    with pytest.raises(cudnn.NotSupportedError, match=f"{method}: ferrodnn does not record its plans into CUDA graphs"):
        getattr(g, method)(cudnn.create_cpu_handle(), {}, 0, 0)


# ---------------------------------------------------------------------------------------------
# Module functions


def test_get_stream_of_a_cpu_handle():
    assert cudnn.get_stream(cudnn.create_cpu_handle()) == 0
    with pytest.raises(TypeError):
        cudnn.get_stream(0)


def test_kernel_cache_object():
    cache = cudnn.create_kernel_cache()
    g = cudnn.pygraph(io_data_type=F32, compute_data_type=F32, handle=cudnn.create_cpu_handle(), kernel_cache=cache, is_dynamic_shape_enabled=True)
    X = g.tensor(name="X", dim=[3], stride=[1])
    Y = g.neg(input=X)
    Y.set_output(True)
    x, y = rand(3), np.zeros(3, np.float32)
    g.execute({X: x, Y: y}, None)
    np.testing.assert_array_equal(y, -x)
    with pytest.raises(cudnn.NotSupportedError, match="kernel_cache.serialize"):
        cache.serialize()
    with pytest.raises(cudnn.NotSupportedError, match="kernel_cache.deserialize"):
        cache.deserialize("{}")


def test_device_properties():
    empty = cudnn.create_device_properties(-1)
    assert json.loads(empty.serialize()) == {}
    text = json.dumps({"device_id": 0, "name": "H100", "compute_capability": [9, 0], "arch": "sm_90a", "sm_count": 132, "total_memory": 1 << 30})
    props = cudnn.create_device_properties(text)
    assert json.loads(props.serialize()) == json.loads(text)
    assert json.loads(cudnn.create_device_properties(props.serialize()).serialize()) == json.loads(text)
    g = cudnn.pygraph(handle=cudnn.create_cpu_handle(), device_property=props)
    assert g.get_execution_plan_count() == 0
    if not cudnn.gpu_available():
        with pytest.raises(cudnn.DeviceError):
            cudnn.create_device_properties(0)
        assert cudnn.get_last_error_string() != ""


@pytest.mark.parametrize(
    "source, error, words",
    [
        ("not json", cudnn.InvalidArgumentError, ["create_device_properties", "not JSON"]),
        ("[1, 2]", cudnn.InvalidArgumentError, ["create_device_properties", "not an object"]),
        ('{"device_id": 0}', cudnn.InvalidArgumentError, ["create_device_properties", '"name"']),
        (1.5, TypeError, ["create_device_properties", "float"]),
        (True, TypeError, ["create_device_properties", "bool"]),
    ],
)
def test_device_properties_bad_sources(source, error, words):
    with pytest.raises(error) as e:
        cudnn.create_device_properties(source)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_get_last_error_string_gives_the_library_message():
    g = cpu_graph("last_error")
    X = g.tensor(name="X", dim=[2, 3], stride=[3, 1])
    W = g.tensor(name="W", dim=[4, 5], stride=[5, 1])
    Y = g.matmul(A=X, B=W, name="bad_mm")
    Y.set_output(True)
    with pytest.raises(cudnn.InvalidGraphError) as e:
        g.validate()
    assert cudnn.get_last_error_string() == str(e.value) != ""


# ---------------------------------------------------------------------------------------------
# cudnn.Graph, the frontend's wrapper (samples/python/00_introduction.ipynb), on numpy arrays


def conv_wrapper_graph(x, w, **kwargs):
    with cudnn.Graph(handle=cudnn.create_cpu_handle(), io_data_type=F32, **kwargs) as graph:
        Y = graph.conv_fprop(image=x, weight=w, padding=[1, 1], stride=[1, 1], dilation=[1, 1], compute_data_type=F32, name="conv2d")
        Y.set_output(True).set_data_type(F32).set_name("conv_out")
    return graph, Y


def test_graph_wrapper_positional_call():
    x, w = rand(2, 3, 6, 7), rand(4, 3, 3, 3)
    graph, Y = conv_wrapper_graph(x, w, inputs=["conv2d::image", "conv2d::weight"], outputs=["conv_out"])
    x2 = rand(2, 3, 6, 7)
    y = graph(x2, w)  # other values of the same layout
    assert isinstance(y, np.ndarray) and list(y.shape) == Y.get_dim()
    np.testing.assert_allclose(y, conv2d(x2, w, (1, 1), (1, 1)), rtol=1e-5, atol=1e-5)


def test_graph_wrapper_dict_call_allocates_outputs():
    x, w = rand(2, 3, 6, 7), rand(4, 3, 3, 3)
    graph, Y = conv_wrapper_graph(x, w)
    out = graph({"conv2d::image": x, "conv2d::weight": w})
    keys = [k for k in out if k not in ("conv2d::image", "conv2d::weight")]
    assert len(keys) == 1
    np.testing.assert_allclose(out[keys[0]], conv2d(x, w, (1, 1), (1, 1)), rtol=1e-5, atol=1e-5)
    # Arrays may be given by tensor or uid too, and an output array given is written.
    y = np.zeros(Y.get_dim(), np.float32)
    graph({"conv2d::image": x, "conv2d::weight": w, Y: y})
    np.testing.assert_allclose(y, conv2d(x, w, (1, 1), (1, 1)), rtol=1e-5, atol=1e-5)


def test_graph_wrapper_set_io_tuples_by_array_and_multiple_outputs():
    x = rand(4, 16)
    with cudnn.Graph(handle=cudnn.create_cpu_handle(), io_data_type=F32) as graph:
        A = graph.relu(input=x, name="r")
        B = graph.neg(input=x, name="n")
        A.set_output(True)
        B.set_output(True)
    graph.set_io_tuples([x], [A, B])
    a, b = graph(x)
    np.testing.assert_array_equal(a, np.maximum(x, 0))
    np.testing.assert_array_equal(b, -x)


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda g, x, w: g(x, w), ValueError, ["Graph", "order of inputs and outputs"]),
        (lambda g, x, w: g({"conv2d::image": x}), RuntimeError, ["Graph", "conv2d::weight"]),
        (lambda g, x, w: g.set_io_tuples(["conv2d::image", "nope"], ["conv_out"]), ValueError, ["set_io_tuples", "input 1", "nope"]),
        (lambda g, x, w: g.set_io_tuples(["conv2d::image"], ["conv_out"]), ValueError, ["set_io_tuples", "conv2d::weight", "neither"]),
        (lambda g, x, w: g.set_io_tuples("conv2d::image", ["conv_out"]), ValueError, ["set_io_tuples", "inputs", "list"]),
        (lambda g, x, w: g.build_plans(), RuntimeError, ["Graph.build_plans", "wrapper"]),
        (lambda g, x, w: g.execute({}, None), RuntimeError, ["Graph.execute", "wrapper"]),
    ],
)
def test_graph_wrapper_errors(call, error, words):
    x, w = rand(2, 3, 6, 7), rand(4, 3, 3, 3)
    graph, _ = conv_wrapper_graph(x, w)
    with pytest.raises(error) as e:
        call(graph, x, w)
    assert all(word in str(e.value) for word in words), str(e.value)


def test_graph_wrapper_misuse():
    x = rand(4)
    with pytest.raises(ValueError, match="Graph: inputs must be a list"):
        cudnn.Graph(inputs="x")
    g = cudnn.Graph(handle=cudnn.create_cpu_handle(), io_data_type=F32)
    with pytest.raises(RuntimeError, match="Graph.relu: use the graph inside its with-block"):
        g.relu(input=x)
    with g:
        Y = g.relu(input=x, name="r")
        Y.set_output(True)
        with pytest.raises(ValueError, match="Graph.neg: node name 'r' is used already"):
            g.neg(input=x, name="r")
        with pytest.raises(RuntimeError, match="call the graph after its with-block"):
            g({"r::input": x})
    with pytest.raises(RuntimeError, match="entered once"):
        g.__enter__()
    out = g({"r::input": x})  # the output is keyed by its name when the op made it
    assert sorted(out) == ["r::input", Y.get_name()]
    np.testing.assert_array_equal(out[Y.get_name()], np.maximum(x, 0))
