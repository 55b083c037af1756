"""The API surface: names, tensors, handles, variant packs (by tensor and by uid), array
protocols, serialization, and errors raised as Python exceptions (never a crash)."""

import numpy as np
import pytest

import ferrodnn as cudnn


def simple_graph():
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, handle=cudnn.create_cpu_handle(), name="simple")
    X = g.tensor(name="X", dim=[2, 3], stride=[3, 1], data_type=cudnn.data_type.FLOAT)
    Y = g.relu(input=X, name="relu")
    Y.set_output(True)
    return g, X, Y


def test_enums_and_module_functions():
    for name in ["FLOAT", "HALF", "BFLOAT16", "DOUBLE", "INT8", "INT32", "INT64", "UINT8", "BOOLEAN", "FP8_E4M3", "FP8_E5M2", "NOT_SET"]:
        assert hasattr(cudnn.data_type, name)
    assert {m for m in ("A", "B", "FALLBACK") if hasattr(cudnn.heur_mode, m)} == {"A", "B", "FALLBACK"}
    assert cudnn.norm_forward_phase.TRAINING != cudnn.norm_forward_phase.INFERENCE
    assert cudnn.build_plan_policy.ALL != cudnn.build_plan_policy.HEURISTICS_CHOICE
    assert cudnn.backend_version() >= 90000
    assert cudnn.backend_version_string() == "9.19.0" and cudnn.__version__ != cudnn.backend_version_string()
    h = cudnn.create_handle()
    assert "cpu" in h.engines()
    cudnn.set_stream(handle=h, stream=0)
    cudnn.destroy_handle(h)
    assert issubclass(cudnn.InvalidGraphError, cudnn.FerrodnnError)
    assert issubclass(cudnn.FerrodnnError, RuntimeError)
    assert cudnn.cudnnGraphNotSupportedError is cudnn.NotSupportedError


def test_tensor_methods_chain_and_uids():
    g, X, Y = simple_graph()
    assert X.get_name() == "X" and X.get_dim() == [2, 3] and X.get_stride() == [3, 1]
    assert X.get_data_type() == cudnn.data_type.FLOAT
    assert Y.get_dim() == [2, 3]
    assert X.get_uid() == -1
    assert X.set_uid(7) is X
    g.validate()
    assert X.get_uid() == 7 and Y.get_uid() not in (-1, 7)
    assert g.query_tensor_attributes_of_uid(7) == X
    Z = g.tensor(name="Z", dim=[4], data_type=np.float32)
    Z.set_name("Z2").set_dim([5]).set_is_virtual(False).set_is_pass_by_value(False)
    assert Z.get_name() == "Z2" and Z.get_dim() == [5] and Z.get_stride() == [1]
    assert Y.get_is_output() and not X.get_is_output()
    with pytest.raises(ValueError):
        Z.set_uid(7)


def test_variant_pack_by_uid_and_by_tensor():
    g, X, Y = simple_graph()
    g.build([cudnn.heur_mode.A])
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    y = np.zeros_like(x)
    g.execute({X.get_uid(): x, Y.get_uid(): y}, None)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    y[:] = 0
    g.execute({X: x, Y: y}, np.empty(0, np.uint8), handle=cudnn.create_cpu_handle())
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    assert g.get_execution_plan_count() >= 1
    g.execute_plan_at_index({X: x, Y: y}, None, 0)


def test_graph_context_manager_and_jit():
    handle = cudnn.create_cpu_handle()
    with cudnn.graph(handle, io_data_type=cudnn.data_type.FLOAT) as (g, uids):
        X = g.tensor(name="X", dim=[4], stride=[1])
        Y = g.neg(input=X)
        Y.set_output(True)
    assert uids == []

    @cudnn.jit(heur_modes=[cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    def make():
        g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, handle=handle)
        X = g.tensor(name="X", dim=[4], stride=[1])
        Y = g.neg(input=X)
        Y.set_output(True)
        return g, [X, Y]

    g, (x_uid, y_uid) = make()
    x = np.arange(4, dtype=np.float32)
    y = np.zeros(4, np.float32)
    g.execute({x_uid: x, y_uid: y}, None)
    np.testing.assert_array_equal(y, -x)


def test_serialize_deserialize():
    r = np.random.default_rng(3)
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT)
    x = r.standard_normal((3, 4)).astype(np.float32)
    X = g.tensor_like(x)
    S = g.tensor(name="s", dim=[1, 4], data_type=cudnn.data_type.FLOAT)
    B = g.tensor(name="b", dim=[1, 4], data_type=cudnn.data_type.FLOAT)
    E = g.tensor(name="eps", dim=[1, 1], is_pass_by_value=True, data_type=cudnn.data_type.FLOAT)
    Y, _, _ = g.layernorm(norm_forward_phase=cudnn.norm_forward_phase.INFERENCE, input=X, scale=S, bias=B, epsilon=E)
    Y.set_output(True)
    g.validate()
    data = g.serialize()
    uids = {t: t.get_uid() for t in (X, S, B, E, Y)}

    g2 = cudnn.pygraph()
    g2.deserialize(data)
    s, b = np.ones((1, 4), np.float32), np.zeros((1, 4), np.float32)
    y = np.zeros_like(x)
    g2.execute({uids[X]: x, uids[S]: s, uids[B]: b, uids[E]: 1e-5, uids[Y]: y}, None)
    ref = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)
    assert g2.key() == g.key()

    g3 = cudnn.pygraph()
    g3.deserialize(None, list(data))
    with pytest.raises(cudnn.SerializationError):
        cudnn.pygraph().deserialize(b"{not json")
    with pytest.raises(cudnn.SerializationError):
        cudnn.pygraph().deserialize('{"format": "other", "graph": {}}')


class DLPackOnly:
    """An array reachable only through __dlpack__."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_dlpack_arrays():
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    y = np.zeros_like(x)
    g, X, Y = simple_graph()
    g.execute({X: DLPackOnly(x), Y: DLPackOnly(y)}, None)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    g2 = cudnn.pygraph()
    T = g2.tensor_like(DLPackOnly(x[:, ::2]))
    assert T.get_dim() == [2, 2] and T.get_stride() == [3, 2] and T.get_data_type() == cudnn.data_type.FLOAT


def test_tensor_like_host_scalar_is_by_value():
    g = cudnn.pygraph()
    assert g.tensor_like(np.full((1, 1), 0.5, np.float32)).get_is_pass_by_value()
    assert not g.tensor_like(np.zeros((2, 1), np.float32)).get_is_pass_by_value()


# -- errors -----------------------------------------------------------------------------------

def test_invalid_graph_raises_with_library_message():
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT)
    A = g.tensor(name="A", dim=[2, 3])
    B = g.tensor(name="B", dim=[4, 5])
    C = g.matmul(A=A, B=B)
    C.set_output(True)
    with pytest.raises(cudnn.InvalidGraphError, match="inner dims differ"):
        g.validate()
    with pytest.raises(cudnn.InvalidGraphError):
        g.build_plans()


def test_empty_graph_and_bad_arguments():
    with pytest.raises(cudnn.InvalidGraphError, match="no operations"):
        cudnn.pygraph().validate()
    g, X, Y = simple_graph()
    other = cudnn.pygraph()
    with pytest.raises(ValueError, match="another graph"):
        other.relu(input=X)
    with pytest.raises(TypeError):
        g.relu(input="not a tensor")
    with pytest.raises(TypeError):
        g.tensor(name="T", dim=[2], data_type="no-such-type")
    with pytest.raises(cudnn.NotSupportedError):
        g.tensor(name="T", dim=[2], data_type=cudnn.data_type.INT4).get_dim()
        g.validate()


def test_execute_errors():
    g, X, Y = simple_graph()
    x = np.zeros((2, 3), np.float32)
    y = np.zeros((2, 3), np.float32)
    with pytest.raises(cudnn.InvalidArgumentError, match="no buffer"):
        g.execute({X: x}, None)
    with pytest.raises(cudnn.InvalidArgumentError, match="f32"):
        g.execute({X: x.astype(np.float64), Y: y}, None)
    with pytest.raises(cudnn.InvalidArgumentError, match="bytes"):
        g.execute({X: np.zeros(2, np.float32), Y: y}, None)
    ro = np.zeros((2, 3), np.float32)
    ro.flags.writeable = False
    with pytest.raises(cudnn.InvalidArgumentError, match="read-only"):
        g.execute({X: x, Y: ro}, None)
    with pytest.raises(cudnn.InvalidArgumentError, match="strides"):
        g.execute({X: np.zeros((3, 2), np.float32).T, Y: y}, None)
    with pytest.raises(cudnn.InvalidArgumentError, match="uid 999"):
        g.execute({999: x, Y: y}, None)
    with pytest.raises(TypeError):
        g.execute({X: "nope", Y: y}, None)
    with pytest.raises(ValueError, match="negative strides"):
        g.execute({X: x[::-1], Y: y}, None)
    # In-place on the host: the input is read before the output is written.
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    g.execute({X: x, Y: x}, None)
    np.testing.assert_array_equal(x, [[0, 2, 0], [4, 0, 6]])


def test_sdpa_unsupported_arguments_raise():
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT)
    Q = g.tensor(name="q", dim=[1, 1, 2, 4])
    with pytest.raises(cudnn.NotSupportedError, match="block_mask"):
        g.sdpa(q=Q, k=Q, v=Q, generate_stats=False, block_mask=Q)
    with pytest.raises(ValueError):
        g.sdpa(q=Q, k=Q, v=Q, generate_stats=False, use_causal_mask=True, use_causal_mask_bottom_right=True)


def test_device_arrays_without_gpu_raise():
    if cudnn.gpu_available():
        pytest.skip("a GPU is present")

    class FakeDevice:
        __cuda_array_interface__ = {"shape": (2, 3), "typestr": "<f4", "data": (1 << 20, False), "version": 3, "strides": None}

    g, X, Y = simple_graph()
    with pytest.raises(cudnn.FerrodnnError):
        g.execute({X: FakeDevice(), Y: FakeDevice()}, None)


def test_by_value_scalar_operand():
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, handle=cudnn.create_cpu_handle())
    X = g.tensor(name="X", dim=[2, 2])
    ALPHA = g.tensor(name="alpha", dim=[1, 1], is_pass_by_value=True)
    Y = g.scale(input=X, scale=ALPHA)
    Y.set_output(True)
    g.build([cudnn.heur_mode.A])
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    y = np.zeros_like(x)
    g.execute({X: x, ALPHA: 2.5, Y: y}, None)
    np.testing.assert_array_equal(y, 2.5 * x)
    g.execute({X: x, ALPHA: np.full((1, 1), -1.0, np.float32), Y: y}, None)
    np.testing.assert_array_equal(y, -x)
    with pytest.raises(cudnn.InvalidArgumentError, match="alpha"):
        g.execute({X: x, Y: y}, None)


def test_explain_names_the_engines_and_the_kernels():
    # A CPU handle: the CUDA engine's plan is explained for an H100 without a GPU.
    g = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=cudnn.create_cpu_handle(), name="scale_relu")
    X = g.tensor(name="X", dim=[64, 256], stride=[256, 1], data_type=cudnn.data_type.HALF)
    S = g.tensor(name="S", dim=[1, 256], stride=[256, 1], data_type=cudnn.data_type.HALF)
    Y = g.relu(input=g.mul(a=X, b=S, name="mul"), name="relu")
    Y.set_output(True)
    g.validate()
    text = g.explain()
    assert 'graph "scale_relu" on sm_90a (132 SMs)' in text
    assert "-> pointwise fusion" in text and "kernel n1_fused_pointwise" in text, text
    with_source = g.explain(source=True)
    assert "#define FDNN_PDL 1" in with_source and '__global__' in with_source
    import json
    units = json.loads(g.explain(as_json=True))["units"]
    assert [u["engine"] for u in units] == ["pointwise fusion"]
