//! The frontend's enums and small classes that describe plans and devices rather than ops:
//! `behavior_note`, `numerical_note`, `knob_type` and `knob`, `tensor_reordering`, `scalar_type`,
//! `moe_grouped_matmul_mode`, `kernel_cache`, `device_properties`, and how ferrodnn's
//! [`BehaviorNotes`] read as the frontend's notes.

use crate::{InvalidArgumentError, NotSupportedError};
use ferrodnn::engine::BehaviorNotes;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyString;

/// `cudnn.behavior_note`: what cuDNN says of how an engine behaves. Of ferrodnn's plans, those
/// of the CUDA engine carry `RUNTIME_COMPILATION` (their kernels are compiled when the plan is
/// built); the other notes describe cuDNN engines ferrodnn does not have.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[pyclass(eq, eq_int, hash, frozen, name = "behavior_note", module = "ferrodnn")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PyBehaviorNote {
    RUNTIME_COMPILATION,
    REQUIRES_FILTER_INT8x32_REORDER,
    REQUIRES_BIAS_INT8x32_REORDER,
    SUPPORTS_CUDA_GRAPH_NATIVE_API,
    CUBLASLT_DEPENDENCY,
}

/// `cudnn.numerical_note`: what cuDNN says of how an engine computes. ferrodnn's plans carry
/// `NONDETERMINISTIC` when two runs may differ in the last bits (float atomics), and both
/// `DOWN_CONVERT_INPUTS` and `REDUCED_PRECISION_REDUCTION` when they compute below the inputs'
/// precision (one tf32 pass for f32 matmuls, fp8 products summed in the tensor cores' adder):
/// ferrodnn's notes have one flag for both, so filtering on either note catches them.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[pyclass(eq, eq_int, hash, frozen, name = "numerical_note", module = "ferrodnn")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PyNumericalNote {
    TENSOR_CORE,
    DOWN_CONVERT_INPUTS,
    REDUCED_PRECISION_REDUCTION,
    FFT,
    NONDETERMINISTIC,
    WINOGRAD,
    WINOGRAD_TILE_4x4,
    WINOGRAD_TILE_6x6,
    WINOGRAD_TILE_13x13,
    STRICT_NAN_PROP,
}

/// The frontend's behavior notes of a ferrodnn plan.
pub fn behavior_notes(n: &BehaviorNotes) -> Vec<PyBehaviorNote> {
    let mut v = Vec::new();
    if n.runtime_compiled {
        v.push(PyBehaviorNote::RUNTIME_COMPILATION);
    }
    v
}

/// The frontend's numerical notes of a ferrodnn plan (see [`PyNumericalNote`]).
pub fn numerical_notes(n: &BehaviorNotes) -> Vec<PyNumericalNote> {
    let mut v = Vec::new();
    if n.reduced_precision {
        v.push(PyNumericalNote::DOWN_CONVERT_INPUTS);
        v.push(PyNumericalNote::REDUCED_PRECISION_REDUCTION);
    }
    if !n.deterministic {
        v.push(PyNumericalNote::NONDETERMINISTIC);
    }
    v
}

/// `cudnn.knob_type`: the kinds of tuning knobs cuDNN's engines have. ferrodnn's knobs are named
/// (`fused`, `tf32`, ...) and match none of these kinds: their `knob` objects have the type
/// `NOT_SET` and their name in `name`.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[pyclass(eq, eq_int, hash, frozen, name = "knob_type", module = "ferrodnn")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PyKnobType {
    NOT_SET,
    SWIZZLE,
    TILE_SIZE,
    EDGE,
    MULTIPLY,
    SPLIT_K_BUF,
    TILEK,
    STAGES,
    REDUCTION_MODE,
    SPLIT_K_SLC,
    IDX_MODE,
    SPECFILT,
    KERNEL_CFG,
    WORKSPACE,
    TILE_CGA_M,
    TILE_CGA_N,
    BLOCK_SIZE,
    OCCUPANCY,
    ARRAY_SIZE_PER_THREAD,
    SPLIT_COLS,
    TILE_ROWS,
    TILE_COLS,
    LOAD_SIZE,
    CTA_COUNT,
    STREAM_K,
    SPLIT_P_SLC,
    TILE_M,
    TILE_N,
    WARP_SPEC_CFG,
}

/// `cudnn.knob`: a tuning knob of an engine and the values it takes (`min_value` to `max_value`
/// in steps of `stride`), as `get_knobs_for_engine` returns them. `name` is ferrodnn's name of
/// the knob (ferrodnn's addition; `create_execution_plan` takes it as a key).
#[pyclass(frozen, name = "knob", module = "ferrodnn")]
#[derive(Clone, Debug)]
pub struct PyKnob {
    #[pyo3(get, name = "type")]
    pub knob_type: PyKnobType,
    #[pyo3(get)]
    pub max_value: i64,
    #[pyo3(get)]
    pub min_value: i64,
    #[pyo3(get)]
    pub stride: i64,
    #[pyo3(get)]
    pub name: Option<String>,
}

#[pymethods]
impl PyKnob {
    #[new]
    #[pyo3(signature = (knob_type = PyKnobType::NOT_SET, max_value = 0, min_value = 0, stride = 1, name = None))]
    fn new(knob_type: PyKnobType, max_value: i64, min_value: i64, stride: i64, name: Option<String>) -> PyResult<Self> {
        if stride < 1 {
            return Err(pyo3::exceptions::PyValueError::new_err(format!("knob: stride must be at least 1, got {stride}")));
        }
        if min_value > max_value {
            return Err(pyo3::exceptions::PyValueError::new_err(format!("knob: min_value {min_value} is greater than max_value {max_value}")));
        }
        Ok(PyKnob { knob_type, max_value, min_value, stride, name })
    }

    fn __repr__(&self) -> String {
        let name = self.name.as_ref().map(|n| format!(", \"name\": {n:?}")).unwrap_or_default();
        format!("{{\"knob_type\": \"{:?}\", \"max_value\": {}, \"min_value\": {}, \"stride\": {}{name}}}", self.knob_type, self.max_value, self.min_value, self.stride)
    }
}

/// `cudnn.tensor_reordering`: layouts cuDNN reorders some tensors into. ferrodnn only has `NONE`;
/// the others are refused where a tensor is given them.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[pyclass(eq, eq_int, hash, frozen, name = "tensor_reordering", module = "ferrodnn")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PyTensorReordering {
    NONE,
    INT8x32,
    F16x16,
    F8_128x4,
}

/// A `reordering_type` argument: None or a `tensor_reordering`; ferrodnn only takes `NONE`.
pub fn check_reordering(what: &str, v: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let Some(v) = v.filter(|v| !v.is_none()) else { return Ok(()) };
    let r = v.extract::<PyTensorReordering>().map_err(|_| PyTypeError::new_err(format!("{what}: reordering_type must be a tensor_reordering, got {}", type_name(v))))?;
    if r != PyTensorReordering::NONE {
        return Err(NotSupportedError::new_err(format!("{what}: reordering_type tensor_reordering.{r:?} is not supported by ferrodnn (only NONE)")));
    }
    Ok(())
}

/// `cudnn.scalar_type`: whether `tensor_scalar`'s value is compiled into the plan
/// (`COMPILE_TIME_CONST`) or passed to it at each execution (`RUNTIME_PARAM`).
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[pyclass(eq, eq_int, hash, frozen, name = "scalar_type", module = "ferrodnn")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PyScalarType {
    RUNTIME_PARAM,
    COMPILE_TIME_CONST,
}

/// `cudnn.moe_grouped_matmul_mode`: the modes of the frontend's MoE grouped matmul, which
/// ferrodnn does not have (the op is refused).
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[pyclass(eq, eq_int, hash, frozen, name = "moe_grouped_matmul_mode", module = "ferrodnn")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PyMoeGroupedMatmulMode {
    NONE,
    GATHER,
    SCATTER,
}

/// `cudnn.create_kernel_cache()`'s object. ferrodnn keeps compiled kernels in its own
/// process-wide cache, in memory and on disk (see `kernel_cache_stats`), which every graph uses;
/// this object is accepted by `pygraph(kernel_cache=)` and changes nothing, and it has no
/// contents of its own to serialize.
#[pyclass(frozen, name = "kernel_cache", module = "ferrodnn")]
pub struct PyKernelCache;

#[pymethods]
impl PyKernelCache {
    fn serialize(&self) -> PyResult<String> {
        Err(NotSupportedError::new_err(
            "kernel_cache.serialize: ferrodnn keeps compiled kernels in its own process-wide cache (memory and disk), shared by every graph; it has no per-object contents to serialize",
        ))
    }

    fn deserialize(&self, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let _ = data;
        Err(NotSupportedError::new_err(
            "kernel_cache.deserialize: ferrodnn keeps compiled kernels in its own process-wide cache (memory and disk), shared by every graph; it reads no serialized cache",
        ))
    }

    fn __repr__(&self) -> String {
        "<ferrodnn.kernel_cache (ferrodnn's process-wide kernel cache)>".to_string()
    }
}

/// `cudnn.create_kernel_cache()`.
#[pyfunction]
pub fn create_kernel_cache() -> PyKernelCache {
    PyKernelCache
}

/// `cudnn.create_device_properties(...)`'s object: a GPU's description (ordinal, name,
/// architecture, SM count, memory) as JSON text. ferrodnn compiles for the handle's own device,
/// so `pygraph(device_property=)` accepts one and does not use it.
#[pyclass(frozen, name = "device_properties", module = "ferrodnn")]
pub struct PyDeviceProperties {
    json: serde_json::Value,
}

#[pymethods]
impl PyDeviceProperties {
    /// The properties as JSON text (`create_device_properties` reads it back).
    fn serialize(&self) -> String {
        self.json.to_string()
    }

    fn __repr__(&self) -> String {
        format!("<ferrodnn.device_properties {}>", self.json)
    }
}

/// `cudnn.create_device_properties(device_id)` describes CUDA device `device_id` (a negative id
/// gives empty properties, as the frontend's do); `create_device_properties(json_text)` reads
/// what `serialize()` wrote.
#[pyfunction]
pub fn create_device_properties(source: &Bound<'_, PyAny>) -> PyResult<PyDeviceProperties> {
    const KEYS: [&str; 6] = ["device_id", "name", "compute_capability", "arch", "sm_count", "total_memory"];
    if let Ok(text) = source.downcast::<PyString>() {
        let text = text.to_str()?;
        let json: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| InvalidArgumentError::new_err(format!("create_device_properties: the text is not JSON written by device_properties.serialize(): {e}")))?;
        let obj = json.as_object().ok_or_else(|| InvalidArgumentError::new_err("create_device_properties: the JSON is not an object"))?;
        if !obj.is_empty() {
            if let Some(k) = KEYS.iter().find(|k| !obj.contains_key(**k)) {
                return Err(InvalidArgumentError::new_err(format!("create_device_properties: the JSON lacks \"{k}\" (expected the keys {KEYS:?})")));
            }
        }
        return Ok(PyDeviceProperties { json });
    }
    if source.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err("create_device_properties takes a device id (int) or JSON text (str), got bool"));
    }
    let id: i64 = source.extract().map_err(|_| PyTypeError::new_err(format!("create_device_properties takes a device id (int) or JSON text (str), got {}", type_name(source))))?;
    if id < 0 {
        return Ok(PyDeviceProperties { json: serde_json::json!({}) });
    }
    let info = ferrodnn::engine::cuda::DeviceInfo::query(id as usize).map_err(crate::to_py_err)?;
    let (major, minor) = info.compute_capability;
    Ok(PyDeviceProperties {
        json: serde_json::json!({
            "device_id": id,
            "name": info.name,
            "compute_capability": [major, minor],
            "arch": info.arch(),
            "sm_count": info.sm_count,
            "total_memory": info.total_memory,
        }),
    })
}

pub fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type().name().map(|n| n.to_string()).unwrap_or_default()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyBehaviorNote>()?;
    m.add_class::<PyNumericalNote>()?;
    m.add_class::<PyKnobType>()?;
    m.add_class::<PyKnob>()?;
    m.add_class::<PyTensorReordering>()?;
    m.add_class::<PyScalarType>()?;
    m.add_class::<PyMoeGroupedMatmulMode>()?;
    m.add_class::<PyKernelCache>()?;
    m.add_class::<PyDeviceProperties>()?;
    m.add_function(wrap_pyfunction!(create_kernel_cache, m)?)?;
    m.add_function(wrap_pyfunction!(create_device_properties, m)?)?;
    Ok(())
}
