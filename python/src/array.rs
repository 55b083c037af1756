//! Reading arrays of other libraries at run time, with no build-time dependency on them:
//! PyTorch tensors (CPU and CUDA), numpy arrays (`__array_interface__`), anything with
//! `__cuda_array_interface__` (CuPy, Numba, PyTorch) and anything with `__dlpack__`.
//!
//! What comes out is an [`ArrayDesc`]: the address of element `[0, ..., 0]`, the number of bytes
//! from there that the array's shape and strides reach, its dims and strides in elements, its
//! type, and whether it lives on the host or on a CUDA device.

use crate::InvalidArgumentError;
use ferrodnn::DataType;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyDict, PyTuple, PyType};
use std::borrow::Cow;
use std::ffi::{c_void, CStr};

/// Addresses below this are the null page: never mapped on the host, never a device allocation.
const NULL_PAGE: usize = 4096;

/// An array's memory as the array protocols describe it.
pub struct ArrayDesc {
    /// Address of element `[0, ..., 0]`.
    pub ptr: usize,
    /// Bytes from `ptr` that the shape and strides reach (0 for an empty array).
    pub bytes: usize,
    pub dims: Vec<i64>,
    /// Strides in elements (non-negative).
    pub strides: Vec<i64>,
    /// The element type, when ferrodnn has one for it.
    pub dtype: Option<DataType>,
    pub itemsize: usize,
    /// The library's name of the type (for messages; a torch dtype's is borrowed, not made on
    /// every call).
    pub type_name: Cow<'static, str>,
    /// Device (CUDA) memory rather than host memory.
    pub device: bool,
    /// The producer says the memory must not be written.
    pub readonly: bool,
    /// Objects that must stay alive while the memory is used (a DLPack capsule): held, never read.
    #[allow(dead_code)]
    pub keep_alive: Vec<Py<PyAny>>,
}

impl ArrayDesc {
    /// The number of elements (i64::MAX when the product overflows).
    pub fn element_count(&self) -> i64 {
        self.dims.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d)).unwrap_or(i64::MAX)
    }
}

/// The ferrodnn type of a type name as numpy, PyTorch or DLPack spell it.
pub fn dtype_from_name(name: &str) -> Option<DataType> {
    let n = name.strip_prefix("torch.").unwrap_or(name);
    Some(match n {
        "float64" | "double" | "f64" => DataType::F64,
        "float32" | "float" | "f32" => DataType::F32,
        "float16" | "half" | "f16" => DataType::F16,
        "bfloat16" | "bf16" => DataType::Bf16,
        "float8_e4m3fn" | "float8_e4m3" | "fp8_e4m3" => DataType::Fp8E4m3,
        "float8_e5m2" | "fp8_e5m2" => DataType::Fp8E5m2,
        "int8" | "i8" => DataType::I8,
        "uint8" | "u8" => DataType::U8,
        "int32" | "int" | "i32" => DataType::I32,
        "int64" | "long" | "i64" => DataType::I64,
        "bool" | "bool_" => DataType::Bool,
        _ => return None,
    })
}

/// Bytes that dims with element strides reach from the first element.
fn extent_bytes(dims: &[i64], strides: &[i64], itemsize: usize, what: &str) -> PyResult<usize> {
    if dims.contains(&0) {
        return Ok(0);
    }
    let overflow = || PyValueError::new_err(format!("{what}: the extent of shape {dims:?} with strides {strides:?} overflows"));
    let mut last = 0usize;
    for (&d, &s) in dims.iter().zip(strides) {
        if d < 0 {
            return Err(PyValueError::new_err(format!("{what}: negative dim in shape {dims:?}")));
        }
        let span = usize::try_from(d - 1).ok().and_then(|d| d.checked_mul(s as usize)).ok_or_else(overflow)?;
        last = last.checked_add(span).ok_or_else(overflow)?;
    }
    last.checked_mul(itemsize).and_then(|b| b.checked_add(itemsize)).ok_or_else(overflow)
}

/// Element strides from byte strides (`None`: C-contiguous).
fn element_strides(dims: &[i64], byte_strides: Option<Vec<i64>>, itemsize: usize, what: &str) -> PyResult<Vec<i64>> {
    let Some(bs) = byte_strides else {
        let mut strides = vec![0i64; dims.len()];
        let mut acc = 1i64;
        for i in (0..dims.len()).rev() {
            strides[i] = acc;
            acc = acc.saturating_mul(dims[i].max(1));
        }
        return Ok(strides);
    };
    if bs.len() != dims.len() {
        return Err(PyValueError::new_err(format!("{what}: {} strides for {} dims", bs.len(), dims.len())));
    }
    let item = itemsize as i64;
    bs.iter()
        .zip(dims)
        .map(|(&s, &d)| {
            if d <= 1 {
                // A stride of a size-1 axis never moves; any value is harmless.
                Ok(if s < 0 || s % item != 0 { 0 } else { s / item })
            } else if s < 0 {
                Err(PyValueError::new_err(format!("{what}: negative strides (byte strides {bs:?}) are not supported; pass a copy (numpy.ascontiguousarray, tensor.contiguous())")))
            } else if s % item != 0 {
                Err(PyValueError::new_err(format!("{what}: byte strides {bs:?} are not multiples of the element size {itemsize}")))
            } else {
                Ok(s / item)
            }
        })
        .collect()
}

/// Type from an array-interface typestr (`<f4`, `|b1`, `<V2`, ...): (type, itemsize).
fn parse_typestr(ts: &str, what: &str) -> PyResult<(Option<DataType>, usize)> {
    let bytes = ts.as_bytes();
    if bytes.len() < 3 {
        return Err(PyValueError::new_err(format!("{what}: unreadable typestr {ts:?}")));
    }
    let (order, kind) = (bytes[0], bytes[1]);
    let size: usize = ts[2..].parse().ok().filter(|&n| n > 0).ok_or_else(|| PyValueError::new_err(format!("{what}: unreadable typestr {ts:?}")))?;
    let big_endian = order == b'>' || (order == b'=' && cfg!(target_endian = "big"));
    if big_endian && size > 1 {
        return Err(PyValueError::new_err(format!("{what}: big-endian data ({ts}) is not supported")));
    }
    let dt = match (kind, size) {
        (b'f', 8) => Some(DataType::F64),
        (b'f', 4) => Some(DataType::F32),
        (b'f', 2) => Some(DataType::F16),
        (b'i', 1) => Some(DataType::I8),
        (b'u', 1) => Some(DataType::U8),
        (b'i', 4) => Some(DataType::I32),
        (b'i', 8) => Some(DataType::I64),
        (b'b', 1) => Some(DataType::Bool),
        _ => None,
    };
    Ok((dt, size))
}

fn ints(obj: &Bound<PyAny>) -> PyResult<Vec<i64>> {
    obj.try_iter()?.map(|v| v?.extract::<i64>()).collect()
}

/// `__array_interface__` or `__cuda_array_interface__`.
fn from_interface(obj: &Bound<PyAny>, iface: &Bound<PyAny>, device: bool) -> PyResult<ArrayDesc> {
    let what = if device { "__cuda_array_interface__" } else { "__array_interface__" };
    let d = iface.downcast::<PyDict>().map_err(|_| PyTypeError::new_err(format!("{what} is not a dict")))?;
    let get = |k: &str| -> PyResult<Option<Bound<PyAny>>> { Ok(d.get_item(k)?.filter(|v| !v.is_none())) };
    if get("mask")?.is_some() {
        return Err(PyValueError::new_err(format!("{what}: masked arrays are not supported")));
    }
    let typestr: String = get("typestr")?.ok_or_else(|| PyValueError::new_err(format!("{what} has no typestr")))?.extract()?;
    let (dtype, itemsize) = parse_typestr(&typestr, what)?;
    let dims = ints(&get("shape")?.ok_or_else(|| PyValueError::new_err(format!("{what} has no shape")))?)?;
    let byte_strides = match get("strides")? {
        Some(s) => Some(ints(&s)?),
        None => None,
    };
    let data = get("data")?.ok_or_else(|| PyValueError::new_err(format!("{what}: the array exports no data pointer (data is None)")))?;
    let data = data.downcast::<PyTuple>().map_err(|_| PyTypeError::new_err(format!("{what}: data is not a (pointer, read_only) tuple")))?;
    let ptr: usize = data.get_item(0)?.extract()?;
    let readonly: bool = data.get_item(1)?.extract()?;
    let offset: usize = match get("offset")? {
        Some(o) => o.extract()?,
        None => 0,
    };
    let strides = element_strides(&dims, byte_strides, itemsize, what)?;
    let bytes = extent_bytes(&dims, &strides, itemsize, what)?;
    let type_name = Cow::Owned(format!("{} ({typestr})", obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()));
    let ptr = ptr.checked_add(offset).ok_or_else(|| PyValueError::new_err(format!("{what}: data pointer {ptr:#x} plus offset {offset} overflows")))?;
    Ok(ArrayDesc { ptr, bytes, dims, strides, dtype, itemsize, type_name, device, readonly, keep_alive: Vec::new() })
}

/// The integers of a tuple (torch's `shape` and `stride()`), else of any iterable.
fn tuple_ints(obj: &Bound<PyAny>) -> PyResult<Vec<i64>> {
    match obj.downcast::<PyTuple>() {
        Ok(t) => t.iter().map(|v| v.extract::<i64>()).collect(),
        Err(_) => ints(obj),
    }
}

/// PyTorch's `Tensor` class and its dtype objects (each with ferrodnn's type, its element size
/// and its name), taken from `sys.modules` once torch has been imported by the caller (this
/// module never imports torch). Found once a process: a tensor is then recognized by one
/// `isinstance` and its dtype by identity, with no strings made (the execute path's host time).
struct TorchTypes {
    tensor: Py<PyType>,
    dtypes: Vec<(Py<PyAny>, Option<DataType>, usize, &'static str)>,
}

/// The torch dtypes recognized by identity, by their full names.
const TORCH_DTYPES: [&str; 11] = [
    "torch.float32",
    "torch.float16",
    "torch.bfloat16",
    "torch.float64",
    "torch.float8_e4m3fn",
    "torch.float8_e5m2",
    "torch.int8",
    "torch.uint8",
    "torch.int32",
    "torch.int64",
    "torch.bool",
];

static TORCH: GILOnceCell<TorchTypes> = GILOnceCell::new();
static SYS_MODULES: GILOnceCell<Py<PyDict>> = GILOnceCell::new();

fn torch_types(py: Python<'_>) -> Option<&'static TorchTypes> {
    if let Some(t) = TORCH.get(py) {
        return Some(t);
    }
    let modules = SYS_MODULES.get_or_try_init(py, || -> PyResult<Py<PyDict>> { Ok(py.import("sys")?.getattr("modules")?.downcast_into::<PyDict>()?.unbind()) }).ok()?.bind(py);
    let torch = modules.get_item("torch").ok()??;
    let tensor = torch.getattr("Tensor").ok()?.downcast_into::<PyType>().ok()?.unbind();
    let mut dtypes = Vec::new();
    for full in TORCH_DTYPES {
        let name = &full["torch.".len()..];
        if let Ok(d) = torch.getattr(name) {
            let itemsize = d.getattr("itemsize").and_then(|v| v.extract::<usize>()).unwrap_or(0);
            dtypes.push((d.unbind(), dtype_from_name(name), itemsize, full));
        }
    }
    let _ = TORCH.set(py, TorchTypes { tensor, dtypes });
    TORCH.get(py)
}

/// A PyTorch tensor, read through its attributes and methods (no import of torch).
fn from_torch(obj: &Bound<PyAny>) -> PyResult<ArrayDesc> {
    let py = obj.py();
    let dt = obj.getattr(intern!(py, "dtype"))?;
    let known = torch_types(py).and_then(|t| t.dtypes.iter().find(|(o, _, size, _)| *size > 0 && o.bind(py).is(&dt)));
    let (dtype, itemsize, dtype_name) = match known {
        Some((_, dtype, size, name)) => (*dtype, *size, Cow::Borrowed(*name)),
        None => {
            let name: String = dt.str()?.extract()?;
            let size: usize = obj.call_method0(intern!(py, "element_size"))?.extract()?;
            (dtype_from_name(&name), size, Cow::Owned(name))
        }
    };
    if itemsize == 0 {
        return Err(PyValueError::new_err(format!("torch tensor of {dtype_name} with element size 0")));
    }
    let dims = tuple_ints(&obj.getattr(intern!(py, "shape"))?)?;
    let strides = tuple_ints(&obj.call_method0(intern!(py, "stride"))?)?;
    if strides.iter().zip(&dims).any(|(&s, &d)| s < 0 && d > 1) {
        return Err(PyValueError::new_err("torch tensor with negative strides; pass tensor.contiguous()"));
    }
    let strides: Vec<i64> = strides.iter().map(|&s| s.max(0)).collect();
    let ptr: usize = obj.call_method0(intern!(py, "data_ptr"))?.extract()?;
    let device: bool = obj.getattr(intern!(py, "is_cuda"))?.extract()?;
    let bytes = extent_bytes(&dims, &strides, itemsize, "torch tensor")?;
    Ok(ArrayDesc { ptr, bytes, dims, strides, dtype, itemsize, type_name: dtype_name, device, readonly: false, keep_alive: Vec::new() })
}

// DLPack's C structures (dlpack.h, the unversioned ABI that `__dlpack__()` returns by default).
#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}
#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}
#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}
#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

const KDL_CPU: i32 = 1;
const KDL_CUDA: i32 = 2;
const KDL_CUDA_HOST: i32 = 3;
const KDL_CUDA_MANAGED: i32 = 13;

fn dl_dtype(t: DLDataType) -> Option<DataType> {
    if t.lanes != 1 {
        return None;
    }
    Some(match (t.code, t.bits) {
        (2, 64) => DataType::F64,
        (2, 32) => DataType::F32,
        (2, 16) => DataType::F16,
        (4, 16) => DataType::Bf16,
        (0, 8) => DataType::I8,
        (1, 8) => DataType::U8,
        (0, 32) => DataType::I32,
        (0, 64) => DataType::I64,
        (6, 8) => DataType::Bool,
        _ => return None,
    })
}

/// Anything with `__dlpack__`: the capsule is kept alive (and so the tensor it manages) for as
/// long as the description is; it is not consumed, so its own destructor frees it.
fn from_dlpack(obj: &Bound<PyAny>) -> PyResult<ArrayDesc> {
    let capsule = obj.call_method0("__dlpack__")?;
    const NAME: &CStr = c"dltensor";
    // SAFETY: `capsule` is a live object; PyCapsule_GetPointer checks that it is a capsule named
    // "dltensor" and returns null (with an exception set) otherwise.
    let raw = unsafe { pyo3::ffi::PyCapsule_GetPointer(capsule.as_ptr(), NAME.as_ptr()) } as *const DLManagedTensor;
    if raw.is_null() {
        let _ = PyErr::take(obj.py());
        return Err(PyTypeError::new_err("__dlpack__() did not return an unused \"dltensor\" capsule"));
    }
    // SAFETY: the DLPack protocol makes the capsule's pointer a valid DLManagedTensor, whose
    // shape (ndim entries) and strides (ndim entries or null) stay valid while the capsule is
    // alive, which it is for this whole function (and after, through `keep_alive`).
    let t = unsafe { &(*raw).dl_tensor };
    let ndim = usize::try_from(t.ndim).map_err(|_| PyValueError::new_err("DLPack tensor with negative ndim"))?;
    let dims: Vec<i64> = if ndim == 0 { Vec::new() } else { unsafe { std::slice::from_raw_parts(t.shape, ndim) }.to_vec() };
    let itemsize = (t.dtype.bits as usize).div_ceil(8) * t.dtype.lanes.max(1) as usize;
    if itemsize == 0 {
        return Err(PyValueError::new_err("DLPack tensor with a zero-bit element type"));
    }
    let strides = if t.strides.is_null() || ndim == 0 {
        element_strides(&dims, None, itemsize, "DLPack tensor")?
    } else {
        let s = unsafe { std::slice::from_raw_parts(t.strides, ndim) }.to_vec();
        if s.iter().zip(&dims).any(|(&s, &d)| s < 0 && d > 1) {
            return Err(PyValueError::new_err("DLPack tensor with negative strides; pass a contiguous copy"));
        }
        s.iter().map(|&s| s.max(0)).collect()
    };
    let device = match t.device.device_type {
        KDL_CPU | KDL_CUDA_HOST => false,
        KDL_CUDA | KDL_CUDA_MANAGED => true,
        other => return Err(PyValueError::new_err(format!("DLPack tensor on device type {other}; only CPU and CUDA memory are supported"))),
    };
    let ptr = (t.data as usize).checked_add(t.byte_offset as usize).ok_or_else(|| PyValueError::new_err("DLPack data pointer overflows"))?;
    let bytes = extent_bytes(&dims, &strides, itemsize, "DLPack tensor")?;
    let dtype = dl_dtype(t.dtype);
    let type_name = Cow::Owned(format!("DLPack code {} bits {}", t.dtype.code, t.dtype.bits));
    Ok(ArrayDesc { ptr, bytes, dims, strides, dtype, itemsize, type_name, device, readonly: false, keep_alive: vec![capsule.unbind()] })
}

/// An instance of `torch.Tensor` (or a subclass: parameters, tensor subclasses), when torch is
/// imported (one `isinstance`); else an object of a `torch` module's type with the tensor
/// methods this module reads (duck-typed, as before torch's classes were looked up).
fn is_torch_tensor(obj: &Bound<PyAny>) -> bool {
    if torch_types(obj.py()).is_some_and(|t| obj.is_instance(t.tensor.bind(obj.py())).unwrap_or(false)) {
        return true;
    }
    let module = obj.get_type().getattr("__module__").ok().and_then(|m| m.extract::<String>().ok()).unwrap_or_default();
    module.starts_with("torch") && obj.hasattr("data_ptr").unwrap_or(false) && obj.hasattr("element_size").unwrap_or(false)
}

/// Describe any supported array object. The memory it names is not touched here: a null data
/// pointer is only refused where the memory would be used (see [`ArrayDesc::check_memory`]), but
/// a range that wraps around the address space is refused at once.
pub fn describe(obj: &Bound<PyAny>) -> PyResult<ArrayDesc> {
    let a = if is_torch_tensor(obj) {
        from_torch(obj)?
    } else if let Ok(iface) = obj.getattr("__cuda_array_interface__") {
        from_interface(obj, &iface, true)?
    } else if let Ok(iface) = obj.getattr("__array_interface__") {
        from_interface(obj, &iface, false)?
    } else if obj.hasattr("__dlpack__")? {
        from_dlpack(obj)?
    } else {
        return Err(PyTypeError::new_err(format!(
            "expected an array (a PyTorch tensor, a numpy array, or an object with __cuda_array_interface__, __array_interface__ or __dlpack__), got {}",
            obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
        )));
    };
    // A slice over these bytes must not wrap around nor exceed isize::MAX bytes.
    if a.bytes > isize::MAX as usize || a.ptr.checked_add(a.bytes).is_none() {
        return Err(PyValueError::new_err(format!("{}: {} bytes from address {:#x} run past the end of the address space", a.type_name, a.bytes, a.ptr)));
    }
    Ok(a)
}

/// A raw device pointer given as a Python int, as the cudnn frontend takes one in a variant
/// pack (`x.data_ptr()`): the memory the tensor's dims, strides and type reach from `ptr`,
/// which the caller vouches for (nothing can check a bare address). `what` names the tensor;
/// `gpu` says whether the handle has a GPU engine (a pointer is device memory only).
pub fn from_pointer(what: &str, ptr: i128, dims: &[i64], strides: &[i64], dtype: DataType, gpu: bool) -> PyResult<ArrayDesc> {
    if !gpu {
        return Err(InvalidArgumentError::new_err(format!(
            "{what}: a Python int in the variant pack is a device pointer (as the frontend takes `tensor.data_ptr()`), but the handle has no GPU engine; give an array"
        )));
    }
    let ptr = usize::try_from(ptr).ok().filter(|&p| p > 0).ok_or_else(|| InvalidArgumentError::new_err(format!("{what}: {ptr} is not a device pointer (a positive address)")))?;
    if strides.len() != dims.len() {
        return Err(InvalidArgumentError::new_err(format!("{what}: a device pointer needs the tensor's strides (dims {dims:?}, strides {strides:?})")));
    }
    let bytes = extent_bytes(dims, strides, dtype.size(), what)?;
    if ptr.checked_add(bytes).is_none() {
        return Err(PyValueError::new_err(format!("{what}: {bytes} bytes from address {ptr:#x} run past the end of the address space")));
    }
    Ok(ArrayDesc {
        ptr,
        bytes,
        dims: dims.to_vec(),
        strides: strides.to_vec(),
        dtype: Some(dtype),
        itemsize: dtype.size(),
        type_name: Cow::Borrowed("a device pointer"),
        device: true,
        readonly: false,
        keep_alive: Vec::new(),
    })
}

/// Whether the object looks like an array at all (for tensor_like's overloads).
pub fn is_array(obj: &Bound<PyAny>) -> bool {
    is_torch_tensor(obj)
        || obj.hasattr("__cuda_array_interface__").unwrap_or(false)
        || obj.hasattr("__array_interface__").unwrap_or(false)
        || obj.hasattr("__dlpack__").unwrap_or(false)
}

impl ArrayDesc {
    /// A short description for messages: type, shape and strides in elements.
    pub fn summary(&self) -> String {
        format!("{}, shape {:?}, strides {:?}", self.type_name, self.dims, self.strides)
    }

    /// Whether the data pointer is null or in the null page (null plus a small offset), which
    /// no host or device allocation has.
    pub fn null_pointer(&self) -> bool {
        self.ptr < NULL_PAGE
    }

    /// Refuse memory that cannot be used: a null data pointer (or one in the null page) for an
    /// array that spans bytes. `what` names the buffer (`tensor "x" (uid 3)`, `the workspace`).
    pub fn check_memory(&self, what: &str) -> PyResult<()> {
        if self.null_pointer() && self.bytes > 0 {
            return Err(InvalidArgumentError::new_err(format!("{what}: the array ({}) has a null data pointer ({:#x}) but spans {} bytes", self.summary(), self.ptr, self.bytes)));
        }
        Ok(())
    }
}

/// The value of a by-value scalar given as an array: a host array of exactly one element, read
/// as f64.
pub fn read_scalar(a: &ArrayDesc, what: &str) -> PyResult<f64> {
    if a.device {
        return Err(InvalidArgumentError::new_err(format!(
            "{what}: a by-value scalar must be given in host memory (a CPU tensor, a numpy array or a Python number), not device memory"
        )));
    }
    let count = a.element_count();
    if count != 1 {
        return Err(InvalidArgumentError::new_err(format!("{what}: a by-value scalar takes exactly one element, but its array has {count} (shape {:?})", a.dims)));
    }
    let dt = a.dtype.ok_or_else(|| InvalidArgumentError::new_err(format!("{what}: unsupported element type {}", a.type_name)))?;
    if a.null_pointer() {
        return Err(InvalidArgumentError::new_err(format!("{what}: the array ({}) has a null data pointer ({:#x})", a.summary(), a.ptr)));
    }
    if a.bytes < dt.size() {
        return Err(InvalidArgumentError::new_err(format!("{what}: the array spans {} bytes, less than one {dt} element", a.bytes)));
    }
    // SAFETY: `a` describes live host memory of at least `a.bytes >= dt.size()` bytes from
    // `a.ptr`, which is not null (the object it came from is alive in the caller, and the range
    // was checked not to wrap when it was described), and nothing writes it while this shared
    // slice exists (the GIL is held and no plan runs).
    let bytes = unsafe { std::slice::from_raw_parts(a.ptr as *const u8, dt.size()) };
    Ok(dt.read(bytes, 0))
}
