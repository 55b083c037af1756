//! `ferrodnn._ferrodnn`: the Python module with the cudnn frontend's graph API over ferrodnn.
//!
//! `import ferrodnn as cudnn` gives the names of the frontend's `cudnn` module: the enums
//! (`data_type`, `heur_mode`, `norm_forward_phase`, `build_plan_policy`, ...), handles, and the
//! graph (`pygraph`, defined in `ferrodnn/__init__.py` on top of [`graph::PyGraph`]) whose
//! tensors are [`graph::PyTensor`]. Host arrays run on the CPU engine; device arrays on the
//! CUDA engine of the handle, on the stream given to `set_stream`.

mod array;
mod frontend;
mod graph;
mod rnn;

use ferrodnn::testing::run_cpu_random;
use ferrodnn::{DataType, Graph, Handle};
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

create_exception!(ferrodnn, FerrodnnError, PyRuntimeError, "Base class of every error ferrodnn raises.");
create_exception!(ferrodnn, InvalidGraphError, FerrodnnError, "The graph is malformed: a shape, type, attribute or connection is wrong.");
create_exception!(ferrodnn, InvalidArgumentError, FerrodnnError, "Buffers given at execution do not match the graph.");
create_exception!(ferrodnn, NotSupportedError, FerrodnnError, "The graph is valid but no engine of the handle can run it.");
create_exception!(ferrodnn, SerializationError, FerrodnnError, "Text that is not a well-formed serialized graph.");
create_exception!(ferrodnn, DeviceError, FerrodnnError, "The device, driver or runtime compiler failed or is missing.");

/// The message of the last error the ferrodnn library reported (`get_last_error_string`).
static LAST_ERROR: Mutex<String> = Mutex::new(String::new());

/// A ferrodnn error as the matching Python exception, with the library's message (also kept
/// for `get_last_error_string`).
pub fn to_py_err(e: ferrodnn::Error) -> PyErr {
    use ferrodnn::Error as E;
    if let Ok(mut last) = LAST_ERROR.lock() {
        *last = e.to_string();
    }
    match e {
        E::InvalidGraph(m) => InvalidGraphError::new_err(m),
        E::InvalidArgument(m) => InvalidArgumentError::new_err(m),
        E::NotSupported(m) => NotSupportedError::new_err(m),
        E::Serialization(m) => SerializationError::new_err(m),
        E::Device(m) => DeviceError::new_err(m),
    }
}

/// `cudnn.data_type`: the element types of the frontend. The ones ferrodnn lacks exist so that
/// code naming them imports, and are refused when used.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[pyclass(eq, eq_int, hash, frozen, name = "data_type", module = "ferrodnn")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PyDataType {
    NOT_SET,
    FLOAT,
    DOUBLE,
    HALF,
    INT8,
    INT32,
    INT8x4,
    UINT8,
    UINT8x4,
    INT8x32,
    BFLOAT16,
    INT64,
    BOOLEAN,
    FP8_E4M3,
    FP8_E5M2,
    FAST_FLOAT_FOR_FP8,
    FP8_E8M0,
    FP4_E2M1,
    INT4,
}

impl PyDataType {
    /// The ferrodnn type: `Ok(None)` for NOT_SET, an error for types ferrodnn does not have.
    pub fn to_rust(self) -> PyResult<Option<DataType>> {
        use PyDataType as P;
        Ok(Some(match self {
            P::NOT_SET => return Ok(None),
            P::FLOAT => DataType::F32,
            P::DOUBLE => DataType::F64,
            P::HALF => DataType::F16,
            P::BFLOAT16 => DataType::Bf16,
            P::INT8 => DataType::I8,
            P::UINT8 => DataType::U8,
            P::INT32 => DataType::I32,
            P::INT64 => DataType::I64,
            P::BOOLEAN => DataType::Bool,
            P::FP8_E4M3 => DataType::Fp8E4m3,
            P::FP8_E5M2 => DataType::Fp8E5m2,
            other => return Err(NotSupportedError::new_err(format!("data_type.{other:?} is not supported by ferrodnn"))),
        }))
    }

    pub fn from_rust(dt: Option<DataType>) -> PyDataType {
        match dt {
            None => PyDataType::NOT_SET,
            Some(DataType::F32) => PyDataType::FLOAT,
            Some(DataType::F64) => PyDataType::DOUBLE,
            Some(DataType::F16) => PyDataType::HALF,
            Some(DataType::Bf16) => PyDataType::BFLOAT16,
            Some(DataType::I8) => PyDataType::INT8,
            Some(DataType::U8) => PyDataType::UINT8,
            Some(DataType::I32) => PyDataType::INT32,
            Some(DataType::I64) => PyDataType::INT64,
            Some(DataType::Bool) => PyDataType::BOOLEAN,
            Some(DataType::Fp8E4m3) => PyDataType::FP8_E4M3,
            Some(DataType::Fp8E5m2) => PyDataType::FP8_E5M2,
        }
    }
}

/// A data type argument: a `data_type`, a torch or numpy dtype, or a name ("float32").
pub fn parse_dtype(obj: Option<&Bound<PyAny>>) -> PyResult<Option<DataType>> {
    let Some(obj) = obj else { return Ok(None) };
    if obj.is_none() {
        return Ok(None);
    }
    if let Ok(d) = obj.extract::<PyDataType>() {
        return d.to_rust();
    }
    let mut names: Vec<String> = Vec::new();
    if let Ok(s) = obj.extract::<String>() {
        names.push(s);
    }
    for attr in ["name", "__name__"] {
        if let Ok(s) = obj.getattr(attr).and_then(|v| v.extract::<String>()) {
            names.push(s);
        }
    }
    if let Ok(s) = obj.str().and_then(|s| s.extract::<String>()) {
        names.push(s);
    }
    for n in &names {
        if let Some(dt) = array::dtype_from_name(n) {
            return Ok(Some(dt));
        }
    }
    Err(PyTypeError::new_err(format!("cannot use {} as a data type (expected a ferrodnn.data_type, a torch or numpy dtype)", names.last().cloned().unwrap_or_default())))
}

#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[pyclass(eq, eq_int, hash, frozen, name = "heur_mode", module = "ferrodnn")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PyHeurMode {
    A,
    B,
    FALLBACK,
    OPENSOURCE,
}

#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[pyclass(eq, eq_int, hash, frozen, name = "norm_forward_phase", module = "ferrodnn")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PyNormPhase {
    TRAINING,
    INFERENCE,
    NOT_SET,
}

#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[pyclass(eq, eq_int, hash, frozen, name = "build_plan_policy", module = "ferrodnn")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PyBuildPlanPolicy {
    HEURISTICS_CHOICE,
    ALL,
}

#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[pyclass(eq, eq_int, hash, frozen, name = "reduction_mode", module = "ferrodnn")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PyReductionMode {
    ADD,
    MUL,
    MIN,
    MAX,
    AMAX,
    AVG,
    NORM1,
    NORM2,
    MUL_NO_ZEROS,
    NOT_SET,
}

#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[pyclass(eq, eq_int, hash, frozen, name = "diagonal_alignment", module = "ferrodnn")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PyDiagonalAlignment {
    TOP_LEFT,
    BOTTOM_RIGHT,
}

#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[pyclass(eq, eq_int, hash, frozen, name = "convolution_mode", module = "ferrodnn")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PyConvolutionMode {
    CROSS_CORRELATION,
    CONVOLUTION,
}

#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[pyclass(eq, eq_int, hash, frozen, name = "resample_mode", module = "ferrodnn")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PyResampleMode {
    MAXPOOL,
    AVGPOOL_INCLUDE_PADDING,
    AVGPOOL_EXCLUDE_PADDING,
}

#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[pyclass(eq, eq_int, hash, frozen, name = "padding_mode", module = "ferrodnn")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PyPaddingMode {
    ZERO_PAD,
    NEG_INF_PAD,
    EDGE_VAL_PAD,
}

#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[pyclass(eq, eq_int, hash, frozen, name = "reshape_mode", module = "ferrodnn")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PyReshapeMode {
    VIEW_ONLY,
    LOGICAL,
}

/// `cudnn.attention_implementation`: which of cuDNN's attention implementations to use. ferrodnn
/// picks its own; the values exist so that code passing `implementation=` runs.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[pyclass(eq, eq_int, hash, frozen, name = "attention_implementation", module = "ferrodnn")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PyAttentionImplementation {
    AUTO,
    COMPOSITE,
    UNIFIED,
}

#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[pyclass(eq, eq_int, hash, frozen, name = "rng_distribution", module = "ferrodnn")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PyRngDistribution {
    BERNOULLI,
    UNIFORM,
}

/// The members the frontend's enums (pybind11's) have beyond a value: `name` and `value`, and
/// pickling (`copy.deepcopy`, multiprocessing and pytest's parameters copy them) by the class
/// and the member's name, which `getattr` gives back.
macro_rules! enum_members {
    ($($t:ty),* $(,)?) => {$(
        #[pymethods]
        impl $t {
            #[getter]
            fn name(&self) -> String {
                format!("{self:?}")
            }

            #[getter]
            fn value(&self) -> isize {
                *self as isize
            }

            fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, pyo3::types::PyType>, String))> {
                Ok((py.import("builtins")?.getattr("getattr")?, (py.get_type::<Self>(), self.name())))
            }
        }
    )*};
}

enum_members!(
    PyDataType,
    PyHeurMode,
    PyNormPhase,
    PyBuildPlanPolicy,
    PyReductionMode,
    PyDiagonalAlignment,
    PyConvolutionMode,
    PyResampleMode,
    PyPaddingMode,
    PyReshapeMode,
    PyAttentionImplementation,
    PyRngDistribution,
    frontend::PyBehaviorNote,
    frontend::PyNumericalNote,
    frontend::PyKnobType,
    frontend::PyTensorReordering,
    frontend::PyScalarType,
    frontend::PyMoeGroupedMatmulMode,
);

/// A handle: the engines of this machine (the CUDA engine on GPU 0 when there is one, and the
/// CPU engine), bound to a stream.
#[pyclass(name = "handle", module = "ferrodnn", frozen)]
pub struct PyHandle {
    pub inner: Arc<Handle>,
}

#[pymethods]
impl PyHandle {
    /// The engines of this handle, best first ("cuda", "cpu").
    fn engines(&self) -> Vec<&'static str> {
        self.inner.engines().map(|e| e.name()).collect()
    }

    fn __repr__(&self) -> String {
        let device = self.inner.cuda_device().map(|d| format!(", device {}", d.name())).unwrap_or_default();
        format!("<ferrodnn.handle engines={:?}{device}>", self.engines())
    }
}

/// The handle graphs use when they are given none.
pub fn default_handle() -> Arc<Handle> {
    static DEFAULT: OnceLock<Arc<Handle>> = OnceLock::new();
    DEFAULT.get_or_init(|| Arc::new(Handle::new())).clone()
}

/// `cudnn.create_handle()`: a handle with every engine of this machine.
#[pyfunction]
fn create_handle(py: Python<'_>) -> PyHandle {
    PyHandle { inner: Arc::new(py.allow_threads(Handle::new)) }
}

/// A handle with only the CPU engine (ferrodnn's own addition).
#[pyfunction]
fn create_cpu_handle() -> PyHandle {
    PyHandle { inner: Arc::new(Handle::cpu()) }
}

/// `cudnn.destroy_handle(handle)`: the handle is freed when its last user is gone.
#[pyfunction]
fn destroy_handle(handle: &Bound<'_, PyHandle>) {
    let _ = handle;
}

/// `cudnn.set_stream(handle=, stream=)`: the handle's GPU work goes to `stream`, a raw
/// CUstream (an int such as `torch.cuda.current_stream().cuda_stream`, or an object with a
/// `cuda_stream` attribute). As with cuDNN, the stream must belong to the handle's device and
/// outlive the work enqueued on it.
#[pyfunction]
#[pyo3(signature = (handle, stream))]
fn set_stream(handle: &Bound<'_, PyHandle>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
    let raw: u64 = if stream.is_none() {
        0
    } else if let Ok(v) = stream.extract::<u64>() {
        v
    } else {
        stream.getattr("cuda_stream")?.extract()?
    };
    let h = &handle.get().inner;
    if h.cuda_device().is_none() {
        if raw == 0 {
            return Ok(());
        }
        return Err(InvalidArgumentError::new_err("set_stream: this handle has no GPU engine (no CUDA device was found)"));
    }
    // SAFETY: this is the contract of cudnnSetStream, which the frontend's API passes on to the
    // caller: `raw` is null or a live stream of the handle's device that outlives the work
    // enqueued on it. An integer cannot be checked further here.
    unsafe { h.set_stream(raw) }.map_err(to_py_err)
}

/// What the process's kernel cache has done: kernels found in memory, found on disk, and compiled
/// with NVRTC (a dict of counts). Plans whose kernels were built before (for another value of an
/// epsilon or a scale, say) find them in memory and compile nothing.
#[pyfunction]
fn kernel_cache_stats(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let s = ferrodnn::engine::cuda::KernelCache::global().stats();
    let d = pyo3::types::PyDict::new(py);
    d.set_item("memory_hits", s.memory_hits)?;
    d.set_item("disk_hits", s.disk_hits)?;
    d.set_item("compiles", s.compiles)?;
    Ok(d)
}

/// The cuDNN API level the Python module implements (cuDNN 9.19): what `backend_version()` and
/// `backend_version_string()` report, so that code gating features on cuDNN's version (and the
/// frontend's tests, which compare `LooseVersion(backend_version_string())`) runs. ferrodnn's own
/// version is `ferrodnn.__version__`.
pub const CUDNN_API_LEVEL: (i64, i64, i64) = (9, 19, 0);

/// `cudnn.backend_version()`: the API level as cuDNN 9 encodes its version (major * 10000 +
/// minor * 100 + patch), 91900.
#[pyfunction]
fn backend_version() -> i64 {
    let (major, minor, patch) = CUDNN_API_LEVEL;
    major * 10000 + minor * 100 + patch
}

#[pyfunction]
fn get_cudnn_version() -> i64 {
    backend_version()
}

/// `cudnn.backend_version_string()`: the API level as "major.minor.patch", "9.19.0".
#[pyfunction]
fn backend_version_string() -> String {
    let (major, minor, patch) = CUDNN_API_LEVEL;
    format!("{major}.{minor}.{patch}")
}

/// `cudnn.get_last_error_string()`: the message of the last error the ferrodnn library reported
/// in this process (empty when there was none). Errors of the Python layer itself (a wrong
/// argument type, say) are only in their exceptions.
#[pyfunction]
fn get_last_error_string() -> String {
    LAST_ERROR.lock().map(|s| s.clone()).unwrap_or_default()
}

/// `cudnn.get_stream(handle)`: the raw CUstream the handle's GPU work goes to, as an int (0 for
/// a handle without a GPU engine, whose work runs on the calling thread).
#[pyfunction]
fn get_stream(handle: &Bound<'_, PyHandle>) -> u64 {
    handle.get().inner.stream().map_or(0, |s| s.raw() as u64)
}

/// Whether `execute` checks buffers strictly when its call does not say (`strict=`).
static STRICT_BUFFERS: AtomicBool = AtomicBool::new(false);

/// The process-wide default of `execute(strict=)`.
pub fn strict_buffers_default() -> bool {
    STRICT_BUFFERS.load(Ordering::Relaxed)
}

/// `set_strict_buffers(True)`: from now on, `execute` and `execute_plan_at_index` without a
/// `strict=` argument require every array's dims and strides (in elements) to equal its
/// tensor's, instead of only checking that the tensor fits in the array's memory (ferrodnn's
/// own addition; the default is False, the frontend's pointer semantics).
#[pyfunction]
#[pyo3(signature = (enabled = true))]
fn set_strict_buffers(enabled: bool) {
    STRICT_BUFFERS.store(enabled, Ordering::Relaxed);
}

/// Whether `execute` checks buffers strictly by default (see `set_strict_buffers`).
#[pyfunction]
fn get_strict_buffers() -> bool {
    strict_buffers_default()
}

/// `run_graph_json(text, seed=7)` (ferrodnn's own addition): what `ferrodnn run FILE --engine
/// cpu` does with a graph file of ferrodnn's JSON format (`pygraph.to_json()` writes one): parse
/// and validate it, build its CPU plan, fill its inputs with random values from `seed` and
/// execute it. Returns each output's values (dense, row-major, as floats) by tensor name; a graph
/// that cannot run is a ferrodnn exception naming the op and the tensor.
#[pyfunction]
#[pyo3(signature = (text, seed = 7))]
fn run_graph_json(py: Python<'_>, text: &str, seed: u64) -> PyResult<HashMap<String, Vec<f64>>> {
    let run = || -> ferrodnn::Result<_> {
        let graph = Graph::from_json(text)?;
        let outputs = run_cpu_random(&graph, seed)?;
        Ok(outputs.into_iter().map(|(id, nd)| (graph.desc(id).name.clone(), nd.data)).collect())
    };
    py.allow_threads(run).map_err(to_py_err)
}

/// Whether a CUDA GPU that ferrodnn can use is present (ferrodnn's own addition).
#[pyfunction]
fn gpu_available() -> bool {
    default_handle().cuda_device().is_some()
}

#[pymodule]
fn _ferrodnn(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("FerrodnnError", py.get_type::<FerrodnnError>())?;
    m.add("InvalidGraphError", py.get_type::<InvalidGraphError>())?;
    m.add("InvalidArgumentError", py.get_type::<InvalidArgumentError>())?;
    m.add("NotSupportedError", py.get_type::<NotSupportedError>())?;
    m.add("cudnnGraphNotSupportedError", py.get_type::<NotSupportedError>())?;
    m.add("SerializationError", py.get_type::<SerializationError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    m.add_class::<PyDataType>()?;
    m.add_class::<PyHeurMode>()?;
    m.add_class::<PyNormPhase>()?;
    m.add_class::<PyBuildPlanPolicy>()?;
    m.add_class::<PyReductionMode>()?;
    m.add_class::<PyDiagonalAlignment>()?;
    m.add_class::<PyConvolutionMode>()?;
    m.add_class::<PyResampleMode>()?;
    m.add_class::<PyPaddingMode>()?;
    m.add_class::<PyReshapeMode>()?;
    m.add_class::<PyRngDistribution>()?;
    m.add_class::<PyAttentionImplementation>()?;
    m.add_class::<PyHandle>()?;
    m.add_class::<graph::PyTensor>()?;
    m.add_class::<graph::PyGraph>()?;
    m.add_function(wrap_pyfunction!(create_handle, m)?)?;
    m.add_function(wrap_pyfunction!(create_cpu_handle, m)?)?;
    m.add_function(wrap_pyfunction!(destroy_handle, m)?)?;
    m.add_function(wrap_pyfunction!(set_stream, m)?)?;
    m.add_function(wrap_pyfunction!(backend_version, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_cache_stats, m)?)?;
    m.add_function(wrap_pyfunction!(get_cudnn_version, m)?)?;
    m.add_function(wrap_pyfunction!(backend_version_string, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_available, m)?)?;
    m.add_function(wrap_pyfunction!(run_graph_json, m)?)?;
    m.add_function(wrap_pyfunction!(set_strict_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(get_strict_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(get_last_error_string, m)?)?;
    m.add_function(wrap_pyfunction!(get_stream, m)?)?;
    m.add_function(wrap_pyfunction!(rnn::rnn_weight_params, m)?)?;
    m.add_function(wrap_pyfunction!(rnn::rnn_sizes, m)?)?;
    frontend::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
