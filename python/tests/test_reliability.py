"""Misuse of the Python API: every buffer of a variant pack checked (type, place, a non-null
pointer, memory enough for the tensor's dims and strides), strict mode, by-value scalars of
exactly one element, unknown keyword arguments, and graphs repaired after a failed build. Each
case checks the exception's type and that its message names the argument or tensor at fault."""

import inspect
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ferrodnn as cudnn

F32 = cudnn.data_type.FLOAT


def cpu_graph(name="g", io=F32):
    return cudnn.pygraph(io_data_type=io, intermediate_data_type=F32, compute_data_type=F32, handle=cudnn.create_cpu_handle(), name=name)


def matmul_graph():
    """Y = X @ W with X [8, 64] and W [64, 32], row-major, built."""
    g = cpu_graph("mm")
    X = g.tensor(name="X", dim=[8, 64], stride=[64, 1])
    W = g.tensor(name="W", dim=[64, 32], stride=[32, 1])
    Y = g.matmul(A=X, B=W, name="mm")
    Y.set_output(True)
    g.build([cudnn.heur_mode.A])
    return g, X, W, Y


def scale_graph():
    """Y = X * alpha with alpha a by-value scalar, built."""
    g = cpu_graph("scale")
    X = g.tensor(name="X", dim=[2, 3], stride=[3, 1])
    ALPHA = g.tensor(name="alpha", dim=[1, 1], is_pass_by_value=True)
    Y = g.scale(input=X, scale=ALPHA, name="sc")
    Y.set_output(True)
    g.build([cudnn.heur_mode.A])
    return g, X, ALPHA, Y


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class Interface:
    """An object with only `__array_interface__`, describing whatever it is told to."""

    def __init__(self, shape, typestr="<f4", ptr=0, offset=None, strides=None, readonly=False):
        self.__array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (ptr, readonly), "version": 3, "strides": strides}
        if offset is not None:
            self.__array_interface__["offset"] = offset


class FakeDevice:
    """A device array for a machine without a GPU (never dereferenced)."""

    def __init__(self, shape, ptr=1 << 20):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": "<f4", "data": (ptr, False), "version": 3, "strides": None}


# -- 1. every buffer checked ---------------------------------------------------------------------

def test_too_small_input_names_tensor_and_bytes():
    g, X, W, Y = matmul_graph()
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: rand(8, 63), W: rand(64, 32), Y: np.empty((8, 32), np.float32)}, None)
    msg = str(e.value)
    assert '"X"' in msg and "2048 bytes" in msg and "2016 bytes" in msg, msg


def test_too_small_flat_input():
    g, X, W, Y = matmul_graph()
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: rand(100), W: rand(64, 32), Y: np.empty((8, 32), np.float32)}, None)
    assert '"X"' in str(e.value) and "400 bytes" in str(e.value)


def test_too_small_output():
    g, X, W, Y = matmul_graph()
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: rand(8, 64), W: rand(64, 32), Y: np.empty((8, 31), np.float32)}, None)
    msg = str(e.value)
    assert '"mm::c"' in msg and "1024 bytes" in msg and "992 bytes" in msg, msg


def test_view_counts_its_own_extent_not_its_base():
    # The base array is large, but the view passed spans only 4 rows.
    g, X, W, Y = matmul_graph()
    base = rand(16, 64)
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: base[:4], W: rand(64, 32), Y: np.empty((8, 32), np.float32)}, None)
    assert '"X"' in str(e.value) and "1024 bytes" in str(e.value)


def test_zero_element_array_for_a_tensor():
    g, X, W, Y = matmul_graph()
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: np.empty((0, 64), np.float32), W: rand(64, 32), Y: np.empty((8, 32), np.float32)}, None)
    assert '"X"' in str(e.value) and "spans 0 bytes" in str(e.value)


def test_pointer_semantics_other_dims_with_memory_enough():
    # A (9, 65) array for an [8, 64] tensor is memory: the tensor's strides [64, 1] read its first
    # 512 elements; so does a (64, 8) array of the same size.
    g, X, W, Y = matmul_graph()
    w = rand(64, 32, seed=1)
    big = rand(9, 65, seed=2)
    y = np.zeros((8, 32), np.float32)
    g.execute({X: big, W: w, Y: y}, None)
    np.testing.assert_allclose(y, big.reshape(-1)[:512].reshape(8, 64) @ w, rtol=1e-4, atol=1e-4)
    other = rand(64, 8, seed=3)
    g.execute({X: other, W: w, Y: y}, None)
    np.testing.assert_allclose(y, other.reshape(8, 64) @ w, rtol=1e-4, atol=1e-4)


def test_pointer_semantics_for_an_output_view_of_other_strides():
    # As the frontend, which takes an output's pointer and writes it with the graph's strides: a
    # transposed view whose memory holds the tensor's extent is written row-major from its
    # first element; an array too small for the extent is an error naming the tensor.
    g, X, W, Y = matmul_graph()
    x, w = rand(8, 64), rand(64, 32, seed=1)
    store = np.full((32, 8), np.nan, np.float32)
    g.execute({X: x, W: w, Y: store.T}, None)
    np.testing.assert_allclose(store.reshape(8, 32), x @ w, rtol=1e-4, atol=1e-4)
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: x, W: w, Y: np.zeros((8, 31), np.float32)}, None)
    msg = str(e.value)
    assert '"mm::c" (uid 3)' in msg and "needs 1024 bytes" in msg and "spans 992 bytes" in msg, msg


def test_wrong_dtype_names_tensor():
    g, X, W, Y = matmul_graph()
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: rand(8, 64).astype(np.float64), W: rand(64, 32), Y: np.empty((8, 32), np.float32)}, None)
    assert '"X"' in str(e.value) and "f32" in str(e.value)


def test_null_pointer_input_output_and_workspace():
    g, X, W, Y = matmul_graph()
    x, w, y = rand(8, 64), rand(64, 32), np.empty((8, 32), np.float32)
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: Interface((8, 64)), W: w, Y: y}, None)
    assert '"X"' in str(e.value) and "null data pointer" in str(e.value)
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: x, W: w, Y: Interface((8, 32))}, None)
    assert '"mm::c"' in str(e.value) and "null data pointer" in str(e.value)
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: x, W: w, Y: y}, Interface((64,), "|u1"))
    assert "workspace" in str(e.value) and "null data pointer" in str(e.value)


def test_null_pointer_plus_offset():
    g, X, W, Y = matmul_graph()
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: rand(8, 64), W: Interface((64, 32), offset=256), Y: np.empty((8, 32), np.float32)}, None)
    assert '"W"' in str(e.value) and "null data pointer (0x100)" in str(e.value)


def test_null_pointer_object_does_not_crash_the_interpreter():
    # In a child process, so that a crash shows as a failed test rather than ending the suite.
    code = textwrap.dedent(
        """
        import numpy as np
        import ferrodnn as cudnn

        class Null:
            def __init__(self, shape):
                self.__array_interface__ = {"shape": shape, "typestr": "<f4", "data": (0, False), "version": 3}

        g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, handle=cudnn.create_cpu_handle())
        X = g.tensor(name="X", dim=[4, 4])
        Y = g.exp(input=X)
        Y.set_output(True)
        g.build([cudnn.heur_mode.A])
        for pack in ({X: Null((4, 4)), Y: np.empty((4, 4), np.float32)}, {X: np.ones((4, 4), np.float32), Y: Null((4, 4))}):
            try:
                g.execute(pack, None)
            except cudnn.InvalidArgumentError as e:
                print("refused:", e)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr)
    lines = [l for l in r.stdout.splitlines() if l.startswith("refused:")]
    assert len(lines) == 2 and '"X"' in lines[0] and "null data pointer" in lines[1], r.stdout


def test_interface_extent_overflow():
    g, X, W, Y = matmul_graph()
    with pytest.raises(ValueError, match="overflows"):
        g.execute({X: Interface((2**62, 8), ptr=1 << 20), W: rand(64, 32), Y: np.empty((8, 32), np.float32)}, None)


def test_interface_range_past_the_address_space():
    g, X, W, Y = matmul_graph()
    with pytest.raises(ValueError, match="address space"):
        g.execute({X: Interface((8, 64), ptr=2**64 - 64), W: rand(64, 32), Y: np.empty((8, 32), np.float32)}, None)


@pytest.mark.parametrize(
    "iface, match",
    [
        ({"shape": (8, 64), "typestr": "<f0", "data": (1 << 20, False), "version": 3}, "typestr"),
        ({"shape": (8, -64), "typestr": "<f4", "data": (1 << 20, False), "version": 3}, "negative dim"),
        ({"shape": (8, 64), "typestr": "<f4", "data": None, "version": 3}, "no data pointer"),
        ({"shape": (8, 64), "typestr": "<f4", "data": (1 << 20, False), "version": 3, "strides": (4,)}, "1 strides for 2 dims"),
        ({"shape": (8, 64), "typestr": "<f4", "data": (1 << 20, False), "version": 3, "strides": (256, 3)}, "not multiples"),
    ],
)
def test_malformed_array_interface(iface, match):
    class Bad:
        __array_interface__ = iface

    g, X, W, Y = matmul_graph()
    with pytest.raises(ValueError, match=match) as e:
        g.execute({X: Bad(), W: rand(64, 32), Y: np.empty((8, 32), np.float32)}, None)
    assert "__array_interface__" in str(e.value)


def test_pack_changed_while_it_is_read():
    # An array whose __array_interface__ empties the pack dict while it is read: the arrays
    # already read stay alive, and the pack as read runs.
    g, X, W, Y = matmul_graph()
    x, w, y = rand(8, 64), rand(64, 32), np.zeros((8, 32), np.float32)
    pack = {}

    class Mutating:
        @property
        def __array_interface__(self):
            pack.clear()
            pack.update({i: i for i in range(64)})
            return w.__array_interface__

    pack.update({X: x, W: Mutating(), Y: y})
    g.execute(pack, None)
    np.testing.assert_allclose(y, x @ w, rtol=1e-4, atol=1e-4)


def test_workspace_that_is_not_an_array():
    g, X, W, Y = matmul_graph()
    with pytest.raises(TypeError, match="expected an array"):
        g.execute({X: rand(8, 64), W: rand(64, 32), Y: np.empty((8, 32), np.float32)}, "workspace")


def test_workspace_as_a_python_int_on_a_host_plan():
    # (A Python int workspace is a device pointer, for a CUDA plan; a host plan uses its own.)
    g, X, W, Y = matmul_graph()
    x, w, y = rand(8, 64), rand(64, 32), np.zeros((8, 32), np.float32)
    g.execute({X: x, W: w, Y: y}, 4096)
    np.testing.assert_allclose(y, x @ w, rtol=1e-4, atol=1e-4)
    with pytest.raises(cudnn.InvalidArgumentError, match="not a device pointer"):
        g.execute({X: x, W: w, Y: y}, -16)


def test_host_and_device_arrays_mixed():
    g, X, W, Y = matmul_graph()
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: FakeDevice((8, 64)), W: rand(64, 32), Y: np.empty((8, 32), np.float32)}, None)
    assert "X" in str(e.value) and "W" in str(e.value) and "mixes host arrays" in str(e.value)


def test_read_only_output():
    g, X, W, Y = matmul_graph()
    y = np.empty((8, 32), np.float32)
    y.flags.writeable = False
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: rand(8, 64), W: rand(64, 32), Y: y}, None)
    assert '"mm::c"' in str(e.value) and "read-only" in str(e.value)


class TorchLike:
    """Looks like a CPU PyTorch tensor to ferrodnn (its module's name starts with torch)."""

    __module__ = "torch.fake"

    def __init__(self, shape, ptr):
        self.shape, self._ptr = shape, ptr
        self.dtype = "torch.float32"
        self.is_cuda = False

    def element_size(self):
        return 4

    def stride(self):
        return tuple(int(np.prod(self.shape[i + 1 :])) for i in range(len(self.shape)))

    def data_ptr(self):
        return self._ptr


def test_torch_like_tensor_with_null_data_ptr():
    g, X, W, Y = matmul_graph()
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: TorchLike((8, 64), 0), W: rand(64, 32), Y: np.empty((8, 32), np.float32)}, None)
    assert '"X"' in str(e.value) and "null data pointer" in str(e.value)


def test_torch_cpu_tensors_too_small_and_strict():
    torch = pytest.importorskip("torch")
    g, X, W, Y = matmul_graph()
    w, y = torch.randn(64, 32), torch.zeros(8, 32)
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: torch.randn(8, 63), W: w, Y: y}, None)
    assert '"X"' in str(e.value) and "2016 bytes" in str(e.value)
    # A view: its own extent counts, not its storage's.
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: torch.randn(16, 64)[:4], W: w, Y: y}, None)
    assert '"X"' in str(e.value) and "1024 bytes" in str(e.value)
    with pytest.raises(cudnn.InvalidArgumentError, match="strict"):
        g.execute({X: torch.randn(9, 65), W: w, Y: y}, None, strict=True)
    x = torch.randn(8, 64)
    g.execute({X: x, W: w, Y: y}, None, strict=True)
    torch.testing.assert_close(y, x @ w, rtol=1e-4, atol=1e-4)


def test_torch_by_value_scalar_of_two_elements():
    torch = pytest.importorskip("torch")
    g, X, ALPHA, Y = scale_graph()
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: torch.ones(2, 3), ALPHA: torch.tensor([2.0, 3.0]), Y: torch.zeros(2, 3)}, None)
    assert '"alpha"' in str(e.value) and "has 2" in str(e.value)


# -- 2. strict mode -------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(9, 65), (64, 8), (512,), (1, 8, 64)])
def test_strict_refuses_other_dims(shape):
    g, X, W, Y = matmul_graph()
    pack = {X: rand(*shape), W: rand(64, 32), Y: np.empty((8, 32), np.float32)}
    g.execute(pack, None)  # the frontend's pointer semantics: accepted
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute(pack, None, strict=True)
    msg = str(e.value)
    assert '"X"' in msg and "strict" in msg and "[8, 64]" in msg and str(list(shape)) in msg, msg


def test_strict_refuses_other_strides():
    g, X, W, Y = matmul_graph()
    x_cols = np.asfortranarray(rand(8, 64))  # dims [8, 64], strides [1, 8]
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: x_cols, W: rand(64, 32), Y: np.empty((8, 32), np.float32)}, None, strict=True)
    assert '"X"' in str(e.value) and "[1, 8]" in str(e.value)
    # A padded row-major view: same dims, strides [65, 1].
    padded = rand(8, 65)[:, :64]
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: padded, W: rand(64, 32), Y: np.empty((8, 32), np.float32)}, None, strict=True)
    assert '"X"' in str(e.value) and "[65, 1]" in str(e.value)


def test_strict_output_dims():
    g, X, W, Y = matmul_graph()
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: rand(8, 64), W: rand(64, 32), Y: np.empty((16, 16), np.float32)}, None, strict=True)
    assert '"mm::c"' in str(e.value) and "[16, 16]" in str(e.value)


def test_strict_accepts_exact_arrays_and_scalars():
    g, X, ALPHA, Y = scale_graph()
    x, y = rand(2, 3), np.zeros((2, 3), np.float32)
    # By-value scalars take one element of any shape, strict or not.
    g.execute({X: x, ALPHA: np.array(2.0, np.float32), Y: y}, None, strict=True)
    np.testing.assert_allclose(y, 2 * x)
    g.execute({X: x, ALPHA: 3.0, Y: y}, None, strict=True)
    np.testing.assert_allclose(y, 3 * x)
    # Strides of size-1 dims are not compared.
    g2 = cpu_graph("bias")
    X2 = g2.tensor(name="X", dim=[4, 5])
    B2 = g2.tensor(name="b", dim=[1, 5], stride=[5, 1])
    Y2 = g2.bias(input=X2, bias=B2)
    Y2.set_output(True)
    b = rand(3, 5)[1:2]  # dims [1, 5], strides [5, 1] here but any value for the size-1 dim
    b2 = np.lib.stride_tricks.as_strided(b, shape=(1, 5), strides=(4, 4))
    x2, y2 = rand(4, 5), np.zeros((4, 5), np.float32)
    g2.execute({X2: x2, B2: b2, Y2: y2}, None, strict=True)
    np.testing.assert_allclose(y2, x2 + b)


def test_as_views_reads_arrays_with_the_tensors_layout():
    """execute(as_views=True): each array is read with its tensor's dims and strides from its
    first element (an input of the tensor's dims but other strides is no longer refused), the
    memory check still applies, and strict=True cannot be added."""
    g, X, W, Y = matmul_graph()
    x, w = rand(8, 64), rand(64, 32)
    # The same bytes as x, seen column-major: refused without as_views, read as x with it.
    x_cols = np.lib.stride_tricks.as_strided(x, shape=(8, 64), strides=(4, 32))
    y = np.zeros((8, 32), np.float32)
    with pytest.raises(cudnn.InvalidArgumentError, match="strides"):
        g.execute({X: x_cols, W: w, Y: y}, None)
    g.execute({X: x_cols, W: w, Y: y}, None, as_views=True)
    np.testing.assert_allclose(y, x @ w, rtol=1e-4, atol=1e-4)
    # Other dims spanning the same memory (w as [2048]): read as the tensor's [64, 32].
    y2 = np.zeros(256, np.float32)
    g.execute({X: x, W: w.reshape(-1), Y: y2}, None, as_views=True)
    np.testing.assert_allclose(y2.reshape(8, 32), x @ w, rtol=1e-4, atol=1e-4)
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: rand(8, 63), W: w, Y: y}, None, as_views=True)
    assert '"X"' in str(e.value) and "2016 bytes" in str(e.value)
    with pytest.raises(cudnn.InvalidArgumentError, match="strict=True and as_views=True"):
        g.execute({X: x, W: w, Y: y}, None, strict=True, as_views=True)


def test_module_level_strict_default():
    g, X, W, Y = matmul_graph()
    pack = {X: rand(9, 65), W: rand(64, 32), Y: np.empty((8, 32), np.float32)}
    assert cudnn.get_strict_buffers() is False
    cudnn.set_strict_buffers(True)
    try:
        assert cudnn.get_strict_buffers() is True
        with pytest.raises(cudnn.InvalidArgumentError, match='"X".*strict'):
            g.execute(pack, None)
        with pytest.raises(cudnn.InvalidArgumentError, match='"X".*strict'):
            g.execute_plan_at_index(pack, None, 0)
        g.execute(pack, None, strict=False)  # a call's own argument wins
    finally:
        cudnn.set_strict_buffers(False)
    g.execute(pack, None)


# -- 3. by-value scalars take exactly one element -----------------------------------------------

@pytest.mark.parametrize("value, count", [(np.array([2.0, 3.0], np.float32), 2), (np.zeros((1, 2), np.float32), 2), (np.zeros(0, np.float32), 0), (np.ones((3, 3), np.float32), 9)])
def test_by_value_scalar_element_count(value, count):
    g, X, ALPHA, Y = scale_graph()
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: rand(2, 3), ALPHA: value, Y: np.zeros((2, 3), np.float32)}, None)
    msg = str(e.value)
    assert '"alpha"' in msg and f"exactly one element, but its array has {count}" in msg, msg


def test_by_value_scalar_as_a_python_int_and_a_number_for_an_array():
    # The frontend's packs give by-value scalars as plain Python numbers, ints too.
    g, X, ALPHA, Y = scale_graph()
    x, y = rand(2, 3), np.zeros((2, 3), np.float32)
    g.execute({X: x, ALPHA: 3, Y: y}, None)
    np.testing.assert_allclose(y, 3 * x, rtol=1e-6)
    # A number for a tensor that is not by-value: an error naming the tensor and its uid.
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: 1.5, ALPHA: 3, Y: y}, None)
    msg = str(e.value)
    assert f"(uid {X.get_uid()})" in msg and "only accepted for a by-value scalar" in msg, msg


def test_a_python_int_for_a_tensor_is_a_device_pointer():
    # The frontend takes `tensor.data_ptr()` (a Python int) as a device pointer: a CPU-only
    # handle refuses it by name; a by-value scalar's int stays its value (above).
    g, X, ALPHA, Y = scale_graph()
    x, y = rand(2, 3), np.zeros((2, 3), np.float32)
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: x.ctypes.data, ALPHA: 3, Y: y}, None)
    msg = str(e.value)
    assert f"(uid {X.get_uid()})" in msg and "device pointer" in msg and "no GPU engine" in msg, msg
    # Nothing written when refused.
    assert not y.any()


def test_by_value_scalar_null_pointer_and_device_memory():
    g, X, ALPHA, Y = scale_graph()
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: rand(2, 3), ALPHA: Interface((1, 1)), Y: np.zeros((2, 3), np.float32)}, None)
    assert '"alpha"' in str(e.value) and "null data pointer" in str(e.value)
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: rand(2, 3), ALPHA: FakeDevice((1, 1)), Y: np.zeros((2, 3), np.float32)}, None)
    assert '"alpha"' in str(e.value) and "host memory" in str(e.value)


def test_attribute_tensor_of_several_elements():
    # An epsilon tensor that is not by-value: its value is read at execution, from one element.
    g = cpu_graph("ln", io=cudnn.data_type.DOUBLE)
    X = g.tensor(name="X", dim=[3, 4], data_type=cudnn.data_type.DOUBLE)
    S = g.tensor(name="s", dim=[1, 4], data_type=cudnn.data_type.DOUBLE)
    B = g.tensor(name="b", dim=[1, 4], data_type=cudnn.data_type.DOUBLE)
    E = g.tensor(name="eps", dim=[1, 1], data_type=cudnn.data_type.DOUBLE)
    Y, _, _ = g.layernorm(norm_forward_phase=cudnn.norm_forward_phase.INFERENCE, input=X, scale=S, bias=B, epsilon=E)
    Y.set_output(True)
    x, s, b = np.ones((3, 4)), np.ones((1, 4)), np.zeros((1, 4))
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: x, S: s, B: b, E: np.array([1e-5, 1.0]), Y: np.zeros((3, 4))}, None)
    assert '"eps"' in str(e.value) and "has 2" in str(e.value)


def test_number_for_a_tensor_that_is_not_by_value():
    g, X, ALPHA, Y = scale_graph()
    with pytest.raises(cudnn.InvalidArgumentError) as e:
        g.execute({X: 1.0, ALPHA: 2.0, Y: np.zeros((2, 3), np.float32)}, None)
    assert '"X"' in str(e.value) and "by-value" in str(e.value)


# -- 4. unknown keyword arguments raise TypeError -----------------------------------------------

def _tensors():
    g = cpu_graph("kw")
    X = g.tensor(name="X", dim=[1, 2, 4, 8])
    return g, X


UNKNOWN = [
    ("pygraph", "io_datatype", lambda g, X: cudnn.pygraph(io_datatype=F32)),
    ("pygraph", "hnadle", lambda g, X: cudnn.pygraph(hnadle=cudnn.create_cpu_handle())),
    ("tensor", "strides", lambda g, X: g.tensor(dim=[2, 3], strides=[1, 2])),
    ("tensor", "dtype", lambda g, X: g.tensor(dim=[2, 3], dtype=F32)),
    ("execute", "hnadle", lambda g, X: g.execute({X: np.zeros((1, 2, 4, 8), np.float32)}, None, hnadle=None)),
    ("execute_plan_at_index", "hnadle", lambda g, X: g.execute_plan_at_index({}, None, 0, hnadle=None)),
    ("get_workspace_size", "plan", lambda g, X: g.get_workspace_size(plan=0)),
    ("matmul", "hnadle", lambda g, X: g.matmul(A=X, B=X, hnadle=None)),
    ("conv_fprop", "paddings", lambda g, X: g.conv_fprop(image=X, weight=X, paddings=[1, 1])),
    ("layernorm", "eps", lambda g, X: g.layernorm(norm_forward_phase=cudnn.norm_forward_phase.TRAINING, input=X, scale=X, bias=X, eps=1e-5)),
    ("sdpa", "hnadle", lambda g, X: g.sdpa(q=X, k=X, v=X, hnadle=None)),
    ("sdpa", "causal", lambda g, X: g.sdpa(q=X, k=X, v=X, causal=True)),
    ("sdpa_backward", "use_causal", lambda g, X: g.sdpa_backward(q=X, k=X, v=X, o=X, dO=X, stats=X, use_causal=True)),
    ("reduction", "axis", lambda g, X: g.reduction(input=X, mode=cudnn.reduction_mode.ADD, axis=1)),
    ("relu", "slope", lambda g, X: g.relu(input=X, slope=0.1)),
    ("add", "c", lambda g, X: g.add(a=X, b=X, c=X)),
    ("set_dim", "dims", lambda g, X: X.set_dim(dims=[1])),
    ("set_stream", "strem", lambda g, X: cudnn.set_stream(handle=cudnn.create_cpu_handle(), strem=0)),
    ("build_plans", "polcy", lambda g, X: g.build_plans(polcy=cudnn.build_plan_policy.ALL)),
    ("pygraph", "io_datatype", lambda g, X: cudnn.graph(cudnn.create_cpu_handle(), io_datatype=F32).__enter__()),
]


@pytest.mark.parametrize("method, arg, call", UNKNOWN, ids=[f"{m}-{a}" for m, a, _ in UNKNOWN])
def test_unknown_keyword_raises_type_error(method, arg, call):
    g, X = _tensors()
    with pytest.raises(TypeError) as e:
        call(g, X)
    msg = str(e.value)
    assert f"'{arg}'" in msg and f"{method}(" in msg, msg


# The keyword arguments the cudnn frontend's Python methods take (from its pybind11 bindings and
# its Python wrappers), for the methods ferrodnn has: each must still be accepted.
FRONTEND_KWARGS = {
    "tensor": ["dim", "stride", "data_type", "is_virtual", "is_pass_by_value", "ragged_offset", "reordering_type", "name", "uid"],
    "tensor_like": ["input", "name"],
    "genstats": ["input", "compute_data_type", "name"],
    "slice": ["input", "slices", "compute_data_type", "name"],
    "conv_fprop": ["image", "weight", "padding", "pre_padding", "post_padding", "stride", "dilation", "convolution_mode", "compute_data_type", "name"],
    "conv_wgrad": ["image", "loss", "padding", "pre_padding", "post_padding", "stride", "dilation", "convolution_mode", "compute_data_type", "name"],
    "conv_dgrad": ["loss", "filter", "padding", "pre_padding", "post_padding", "stride", "dilation", "convolution_mode", "compute_data_type", "name"],
    "matmul": ["A", "B", "compute_data_type", "padding", "name"],
    "reduction": ["input", "mode", "compute_data_type", "name"],
    "reshape": ["input", "name", "reshape_mode"],
    "transpose": ["input", "permutation", "compute_data_type", "name"],
    "concatenate": ["inputs", "axis", "in_place_index", "name"],
    "build_plans": ["policy"],
    "build_plan_at_index": ["index"],
    "get_workspace_size_plan_at_index": ["index"],
    "query_tensor_attributes_of_uid": ["uid"],
    "tensor_scalar": ["value", "scalar_type"],
    "get_plan_name_at_index": ["index"],
    "deserialize": ["handle_", "pyobj"],
    "execute": ["tensor_to_device_buffer", "workspace", "handle", "override_uids", "override_shapes", "override_strides"],
    "execute_plan_at_index": ["tensor_to_device_buffer", "workspace", "index", "handle", "override_uids", "override_shapes", "override_strides"],
    "batchnorm": ["input", "scale", "bias", "in_running_mean", "in_running_var", "epsilon", "momentum", "peer_stats", "compute_data_type", "name"],
    "layernorm": ["norm_forward_phase", "input", "scale", "bias", "epsilon", "compute_data_type", "name"],
    "adalayernorm": ["norm_forward_phase", "input", "scale", "bias", "epsilon", "compute_data_type", "name"],
    "rmsnorm": ["norm_forward_phase", "input", "scale", "bias", "epsilon", "compute_data_type", "name"],
    "instancenorm": ["norm_forward_phase", "input", "scale", "bias", "epsilon", "compute_data_type", "name"],
    "batchnorm_inference": ["input", "mean", "inv_variance", "scale", "bias", "compute_data_type", "name"],
    "batchnorm_backward": ["grad", "input", "scale", "mean", "inv_variance", "peer_stats", "compute_data_type", "name"],
    "layernorm_backward": ["grad", "input", "scale", "mean", "inv_variance", "compute_data_type", "name"],
    "adalayernorm_backward": ["grad", "input", "scale", "mean", "inv_variance", "compute_data_type", "name"],
    "instancenorm_backward": ["grad", "input", "scale", "mean", "inv_variance", "compute_data_type", "name"],
    "rmsnorm_backward": ["grad", "input", "scale", "inv_variance", "has_dbias", "compute_data_type", "name"],
    "relu": ["input", "negative_slope", "lower_clip", "upper_clip", "compute_data_type", "name"],
    "relu_backward": ["loss", "input", "negative_slope", "lower_clip", "upper_clip", "compute_data_type", "name"],
    "leaky_relu": ["input", "negative_slope", "compute_data_type", "name"],
    "swish": ["input", "swish_beta", "compute_data_type", "name"],
    "swish_backward": ["loss", "input", "swish_beta", "compute_data_type", "name"],
    "gen_index": ["input", "axis", "compute_data_type", "name"],
    "add": ["a", "b", "compute_data_type", "name"],
    "bias": ["input", "bias", "compute_data_type", "name"],
    "scale": ["input", "scale", "compute_data_type", "name"],
    "max": ["input0", "input1", "compute_data_type", "name"],
    "cmp_gt": ["input", "comparison", "compute_data_type", "name"],
    "binary_select": ["input0", "input1", "mask", "compute_data_type", "name"],
    "sdpa": [
        "q", "k", "v", "is_inference", "attn_scale", "bias", "block_mask", "use_alibi_mask", "use_padding_mask", "seq_len_q", "seq_len_kv",
        "use_causal_mask", "use_causal_mask_bottom_right", "sliding_window_length", "diagonal_alignment", "diagonal_band_left_bound",
        "diagonal_band_right_bound", "dropout", "rng_dump", "paged_attention_k_table", "paged_attention_v_table", "paged_attention_max_seq_len_kv",
        "compute_data_type", "name", "score_mod", "generate_stats", "implementation", "score_max", "score_sum_exp", "sink_token", "unfuse_fma",
    ],
    "sdpa_backward": [
        "q", "k", "v", "o", "dO", "stats", "attn_scale", "bias", "dBias", "use_alibi_mask", "use_padding_mask", "seq_len_q", "seq_len_kv",
        "max_total_seq_len_q", "max_total_seq_len_kv", "use_causal_mask", "use_causal_mask_bottom_right", "sliding_window_length",
        "diagonal_alignment", "diagonal_band_left_bound", "diagonal_band_right_bound", "dropout", "rng_dump", "use_deterministic_algorithm",
        "compute_data_type", "name", "score_mod", "score_mod_bprop", "sink_token", "dSink_token",
    ],
}


@pytest.mark.parametrize("method", sorted(FRONTEND_KWARGS))
def test_frontend_keywords_are_accepted(method):
    params = inspect.signature(getattr(cudnn.pygraph, method)).parameters
    assert not any(p.kind == p.VAR_KEYWORD for p in params.values()), f"{method} swallows unknown keywords"
    missing = [k for k in FRONTEND_KWARGS[method] if k not in params]
    assert not missing, f"{method} lacks the frontend's {missing}"


def test_frontend_graph_keywords_accepted_and_ignored():
    g = cudnn.pygraph(name="fe", io_data_type=F32, intermediate_data_type=F32, compute_data_type=F32, handle=cudnn.create_cpu_handle(),
                      sm_count=8, sm_version=90, kernel_cache=None, device_property=None, is_dynamic_shape_enabled=True, is_override_shape_enabled=False)
    X = g.tensor(name="X", dim=[2, 2], stride=[2, 1], data_type=F32, is_virtual=False, is_pass_by_value=False, ragged_offset=None, reordering_type=None, uid=5)
    Y = g.neg(input=X)
    Y.set_output(True)
    g.build_plans(policy=cudnn.build_plan_policy.HEURISTICS_CHOICE)
    x, y = rand(2, 2), np.zeros((2, 2), np.float32)
    g.execute(tensor_to_device_buffer={X: x, Y: y}, workspace=None, handle=None, override_uids=None, override_shapes=None, override_strides=None)
    np.testing.assert_array_equal(y, -x)
    y[:] = 0
    g.execute_plan_at_index(tensor_to_device_buffer={X: x, Y: y, None: x}, workspace=None, index=0, override_uids=[])
    np.testing.assert_array_equal(y, -x)
    with pytest.raises(TypeError, match="twice"):
        g.execute({X: x, Y: y}, None, tensor_to_device_buffer={X: x, Y: y})
    with pytest.raises(TypeError, match="variant_pack"):
        g.execute(workspace=None)


@pytest.mark.parametrize("arg", ["block_mask", "score_mod"])
def test_sdpa_arguments_ferrodnn_cannot_honour(arg):
    g, X = _tensors()
    with pytest.raises(cudnn.NotSupportedError) as e:
        g.sdpa(q=X, k=X, v=X, generate_stats=False, **{arg: X})
    assert f"`{arg}`" in str(e.value) and "sdpa" in str(e.value)


@pytest.mark.parametrize("arg", ["rng_dump", "score_mod", "score_mod_bprop"])
def test_sdpa_backward_arguments_ferrodnn_cannot_honour(arg):
    g, X = _tensors()
    with pytest.raises(cudnn.NotSupportedError) as e:
        g.sdpa_backward(q=X, k=X, v=X, o=X, dO=X, stats=X, **{arg: X})
    assert f"`{arg}`" in str(e.value) and "sdpa_backward" in str(e.value)


def test_sdpa_harmless_frontend_arguments_accepted():
    g, X = _tensors()
    O, stats = g.sdpa(q=X, k=X, v=X, generate_stats=False, implementation=cudnn.attention_implementation.AUTO, unfuse_fma=True,
                      paged_attention_max_seq_len_kv=None)
    assert stats is None and O.get_dim() == [1, 2, 4, 8]
    O.set_output(True)
    g.validate()


def test_deserialize_with_frontend_keywords():
    g, X, W, Y = matmul_graph()
    data = g.serialize()
    g2 = cudnn.pygraph()
    g2.deserialize(pyobj=data)
    g3 = cudnn.pygraph()
    g3.deserialize(handle_=cudnn.create_cpu_handle(), pyobj=data)
    assert g2.key() == g3.key() == g.key()
    with pytest.raises(TypeError, match="deserialize"):
        cudnn.pygraph().deserialize(data, data, pyobj=data)


# -- 5. a graph that failed to build can be repaired -----------------------------------------------

def test_set_dim_after_a_build_reinfers_the_outputs():
    g = cpu_graph("repair")
    A = g.tensor(name="A", dim=[8, 64], stride=[64, 1])
    B = g.tensor(name="B", dim=[64, 32], stride=[32, 1])
    C = g.relu(input=g.matmul(A=A, B=B))
    C.set_output(True)
    g.build([cudnn.heur_mode.A])
    assert C.get_dim() == [8, 32]
    A.set_dim([4, 64])
    g.build([cudnn.heur_mode.A])
    assert C.get_dim() == [4, 32]
    a, b, c = rand(4, 64), rand(64, 32, seed=1), np.zeros((4, 32), np.float32)
    g.execute({A: a, B: b, C: c}, None, strict=True)
    np.testing.assert_allclose(c, np.maximum(a @ b, 0), rtol=1e-4, atol=1e-4)


def test_failed_build_repaired_by_set_dim():
    g = cpu_graph("repair")
    A = g.tensor(name="A", dim=[8, 64], stride=[64, 1])
    B = g.tensor(name="B", dim=[64, 32], stride=[32, 1])
    C = g.exp(input=g.matmul(A=A, B=B))
    C.set_output(True)
    g.build([cudnn.heur_mode.A])
    B.set_dim([48, 32])  # k no longer matches: the build fails
    with pytest.raises(cudnn.InvalidGraphError, match="inner dims differ"):
        g.build([cudnn.heur_mode.A])
    A.set_dim([8, 48])
    g.build([cudnn.heur_mode.A])
    assert C.get_dim() == [8, 32]
    A.set_dim([2, 48]).set_stride([48, 1])
    g.build([cudnn.heur_mode.A])
    assert C.get_dim() == [2, 32]


def test_failed_first_build_repaired_by_set_dim():
    g = cpu_graph("repair")
    A = g.tensor(name="A", dim=[8, 63])
    B = g.tensor(name="B", dim=[64, 32])
    C = g.matmul(A=A, B=B)
    C.set_output(True)
    with pytest.raises(cudnn.InvalidGraphError, match='"A"'):
        g.build([cudnn.heur_mode.A])
    A.set_dim([8, 64])
    g.build([cudnn.heur_mode.A])
    assert C.get_dim() == [8, 32]


def test_set_stride_reinfers_the_output_layout():
    g = cpu_graph("strides")
    X = g.tensor(name="X", dim=[2, 3], stride=[1, 2])
    Y = g.relu(input=X)
    Y.set_output(True)
    g.validate()
    assert Y.get_stride() == [1, 2]
    X.set_stride([3, 1])
    g.validate()
    assert Y.get_stride() == [3, 1]
    x, y = rand(2, 3), np.zeros((2, 3), np.float32)
    g.execute({X: x, Y: y}, None, strict=True)
    np.testing.assert_allclose(y, np.maximum(x, 0))


def test_failed_build_repaired_by_set_data_type():
    g = cpu_graph("types")
    A = g.tensor(name="A", dim=[2, 3], data_type=cudnn.data_type.BOOLEAN)
    B = g.tensor(name="B", dim=[3, 2])
    C = g.matmul(A=A, B=B)
    C.set_output(True)
    with pytest.raises(cudnn.InvalidGraphError, match='"A".*bool'):
        g.build([cudnn.heur_mode.A])
    A.set_data_type(F32)
    g.build([cudnn.heur_mode.A])
    a, b, c = rand(2, 3), rand(3, 2), np.zeros((2, 2), np.float32)
    g.execute({A: a, B: b, C: c}, None)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_dims_the_user_set_are_kept():
    # A reduction's output dims are the user's: a change upstream does not forget them, and the
    # next build says which dims disagree.
    g = cpu_graph("red")
    X = g.tensor(name="X", dim=[4, 8])
    R = g.reduction(input=X, mode=cudnn.reduction_mode.ADD)
    R.set_dim([4, 1]).set_output(True)
    g.validate()
    X.set_dim([6, 8])
    assert R.get_dim() == [4, 1]
    with pytest.raises(cudnn.InvalidGraphError) as e:
        g.validate()
    assert "[4, 1]" in str(e.value) and "[6, 1]" in str(e.value)
    R.set_dim([6, 1])
    g.validate()
    x, r = rand(6, 8), np.zeros((6, 1), np.float32)
    g.execute({X: x, R: r}, None)
    np.testing.assert_allclose(r, x.sum(1, keepdims=True), rtol=1e-5, atol=1e-5)


def test_repair_after_deserialize():
    g = cpu_graph("ser")
    X = g.tensor(name="X", dim=[3, 5])
    Y = g.neg(input=X)
    Y.set_output(True)
    g.validate()
    data = g.serialize()
    meta = json.loads(data)["meta"]
    assert meta["inferred_dims"] and meta["inferred_strides"]
    g2 = cudnn.pygraph(handle=cudnn.create_cpu_handle())
    g2.deserialize(data)
    X2 = g2.query_tensor_attributes_of_uid(X.get_uid())
    Y2 = g2.query_tensor_attributes_of_uid(Y.get_uid())
    X2.set_dim([2, 5])
    g2.validate()
    assert Y2.get_dim() == [2, 5]


# -- found by the fuzzer (python/fuzz/fuzz_args.py) ------------------------------------------------

@pytest.mark.parametrize("bad", [[1, 2], None, 3])
def test_gen_index_of_a_non_tensor_raises_type_error(bad):
    # It raised AttributeError ('list' object has no attribute 'get_dim').
    g = cpu_graph("gi")
    with pytest.raises(TypeError) as e:
        g.gen_index(input=bad, axis=1)
    assert "gen_index" in str(e.value) and "input" in str(e.value), str(e.value)
