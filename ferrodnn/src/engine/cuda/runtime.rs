//! The device side of the CUDA runtime: the driver library, devices, streams and device memory.
//!
//! Everything goes through the CUDA driver API (`libcuda`), which cudarc loads with `dlopen` on
//! first use. cudarc panics when the library or one of its symbols is missing, so before the
//! first driver call we probe: is the library there, and does it export every symbol this module
//! calls? Only then do we call into it. A machine without a driver gets
//! `Err(Error::Device("no GPU: ..."))`, never a panic.
//!
//! Each type owns one resource and releases it in `Drop`, as cudarc's safe layer does:
//! [`CudaDevice`] a retained primary context, [`Stream`] a stream it created (never one it merely
//! wraps), [`DeviceBuffer`] an allocation.

use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::{c_void, CStr};
use std::sync::{Arc, OnceLock};

/// The oldest architecture ferrodnn supports: its tensor-core kernels use `mma.sync` (sm_80).
pub const MIN_COMPUTE_CAPABILITY: (u32, u32) = (8, 0);

/// Every driver symbol this module calls (the names cudarc's `sys` layer loads). The probe checks
/// them all up front, so that a driver too old to export one gives an error instead of cudarc's
/// "Missing symbol" panic.
const REQUIRED_DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuPointerGetAttribute",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuMemsetD8_v2",
    "cuMemsetD8Async",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoD_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
];

/// What the probe found: the driver's version (e.g. 13000 for CUDA 13.0), or why it is unusable.
pub(super) fn driver() -> Result<i32> {
    static PROBE: OnceLock<std::result::Result<i32, String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            // The probe below is written so that nothing in it can panic; catch_unwind is a second
            // line of defence should a future cudarc version panic where this one returns.
            std::panic::catch_unwind(probe_driver)
                .unwrap_or_else(|_| Err("no GPU: loading the CUDA driver library panicked inside cudarc; ferrodnn treats this machine as having no GPU".to_string()))
        })
        .clone()
        .map_err(Error::Device)
}

fn probe_driver() -> std::result::Result<i32, String> {
    // SAFETY: is_culib_present dlopens each candidate name of the driver library ("libcuda.so",
    // "libcuda.so.1", ...) and drops the handle at once. Loading libcuda runs only its own
    // initializers, as in every CUDA program; no symbol is called.
    if !unsafe { sys::is_culib_present() } {
        let names = cudarc::get_lib_name_candidates("cuda");
        return Err(format!(
            "no GPU: the CUDA driver library could not be loaded (looked for {}); install the NVIDIA driver, or add the folder holding libcuda.so.1 to LD_LIBRARY_PATH. The CPU engine still works",
            names.join(", ")
        ));
    }
    // SAFETY: culib() opens the same candidates in the same order as is_culib_present, which just
    // found one, so it returns a library instead of panicking. The library lives in a static and
    // is never closed.
    let lib = unsafe { sys::culib() };
    let missing: Vec<&str> = REQUIRED_DRIVER_SYMBOLS
        .iter()
        .copied()
        // SAFETY: we only look the symbol up (dlsym) and drop the address without calling it;
        // the pointer type is irrelevant for a lookup.
        .filter(|name| unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_err())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "no GPU: the CUDA driver library lacks {} (the driver is too old for ferrodnn, which needs a CUDA 12 or 13 driver); update the NVIDIA driver",
            missing.join(", ")
        ));
    }
    // cuInit is the call that reports a broken installation, and a driver newer than these
    // bindings may answer with a code cudarc's CUresult enum does not list; an out-of-range value
    // in a Rust enum is undefined behaviour. So we call it, and name its errors, through pointers
    // typed to return a plain int.
    type CuInit = unsafe extern "C" fn(std::ffi::c_uint) -> std::ffi::c_int;
    type CuGetErrorName = unsafe extern "C" fn(std::ffi::c_int, *mut *const std::ffi::c_char) -> std::ffi::c_int;
    // SAFETY: both symbols are present (checked above) and these are their C signatures
    // (CUresult is a C enum, i.e. an int). The library stays loaded for the life of the process.
    let (cu_init, cu_error_name) = unsafe {
        match (lib.get::<CuInit>(b"cuInit"), lib.get::<CuGetErrorName>(b"cuGetErrorName")) {
            (Ok(a), Ok(b)) => (*a, *b),
            _ => return Err("no GPU: the CUDA driver library lacks cuInit".to_string()),
        }
    };
    // SAFETY: cuInit takes flags 0 and may be called any number of times, from any thread.
    let init = unsafe { cu_init(0) };
    if init != 0 {
        let mut name: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: `name` is a valid out pointer; on success the driver points it at a static,
        // NUL-terminated string.
        let named = unsafe { cu_error_name(init, &mut name) } == 0 && !name.is_null();
        // SAFETY: see above: a static NUL-terminated string when `named`.
        let name = if named { unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned() } else { format!("CUresult {init}") };
        let hint = match init {
            100 => "the driver sees no GPU (CUDA_ERROR_NO_DEVICE): check `nvidia-smi` and CUDA_VISIBLE_DEVICES",
            803 => "the kernel module and libcuda are of different driver versions (CUDA_ERROR_SYSTEM_DRIVER_MISMATCH): reboot after a driver update, or reinstall the driver",
            34 => "the libcuda found is the toolkit's stub: remove the stubs folder from LD_LIBRARY_PATH and install the NVIDIA driver",
            _ => "check `nvidia-smi`; the CPU engine still works",
        };
        return Err(format!("no GPU: cuInit failed with {name}; {hint}"));
    }
    let mut version = 0;
    // SAFETY: the symbol is present and the driver initialized; `version` is a valid out pointer.
    check(unsafe { sys::cuDriverGetVersion(&mut version) }, "cuDriverGetVersion").map_err(|e| e.to_string())?;
    Ok(version)
}

/// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)". Only called once the driver probe has passed.
fn describe(code: sys::CUresult) -> String {
    let mut name: *const std::ffi::c_char = std::ptr::null();
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: both symbols are in REQUIRED_DRIVER_SYMBOLS, checked by the probe before any driver
    // call; the driver writes pointers to static strings (or leaves them null on an unknown code).
    let (rn, rs) = unsafe { (sys::cuGetErrorName(code, &mut name), sys::cuGetErrorString(code, &mut text)) };
    // SAFETY: on success each pointer is a NUL-terminated static string owned by the driver.
    let name = if rn == sys::CUresult::CUDA_SUCCESS && !name.is_null() { unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned() } else { format!("{code:?}") };
    // SAFETY: as above.
    let text = if rs == sys::CUresult::CUDA_SUCCESS && !text.is_null() { unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned() } else { String::new() };
    if text.is_empty() {
        name
    } else {
        format!("{name} ({text})")
    }
}

pub(super) fn check(code: sys::CUresult, call: &str) -> Result<()> {
    if code == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Device(format!("{call} failed: {}", describe(code))))
    }
}

/// The CUDA driver's version as (major, minor), e.g. (13, 0); an error says why there is none.
pub fn driver_version() -> Result<(u32, u32)> {
    let v = driver()? as u32;
    Ok((v / 1000, (v % 1000) / 10))
}

/// How many CUDA devices the driver sees (0 when it sees none).
pub fn device_count() -> Result<usize> {
    match driver() {
        Ok(_) => {}
        Err(e) if e.to_string().contains("CUDA_ERROR_NO_DEVICE") => return Ok(0),
        Err(e) => return Err(e),
    }
    let mut n = 0;
    // SAFETY: the driver probe passed (library loaded, symbols present, cuInit succeeded); `n`
    // is a valid out pointer.
    check(unsafe { sys::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    Ok(n.max(0) as usize)
}

/// True when the probe passed and at least one device is sm_80 or newer.
pub(crate) fn any_supported_device() -> bool {
    let Ok(n) = device_count() else { return false };
    (0..n).any(|i| DeviceInfo::query(i).is_ok_and(|d| d.compute_capability >= MIN_COMPUTE_CAPABILITY))
}

/// What a device is, as the driver reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// (major, minor): (9, 0) for H100/H200.
    pub compute_capability: (u32, u32),
    pub sm_count: u32,
    pub total_memory: usize,
    pub l2_cache_bytes: usize,
    /// The most shared memory one block may use once it opts in (cuFuncSetAttribute).
    pub max_shared_memory_per_block_optin: usize,
}

impl DeviceInfo {
    /// Query the device at `ordinal` without creating a context.
    pub fn query(ordinal: usize) -> Result<DeviceInfo> {
        let count = device_count()?;
        if count == 0 {
            return Err(Error::Device("no GPU: the CUDA driver is installed but sees no device; check `nvidia-smi` and CUDA_VISIBLE_DEVICES".into()));
        }
        if ordinal >= count {
            return Err(Error::Device(format!("no GPU {ordinal}: the driver sees {count} device(s), numbered 0 to {}", count - 1)));
        }
        let mut dev: sys::CUdevice = 0;
        // SAFETY: the probe passed (device_count succeeded) and `ordinal < count`.
        check(unsafe { sys::cuDeviceGet(&mut dev, ordinal as i32) }, "cuDeviceGet")?;
        let mut name = [0 as std::ffi::c_char; 256];
        // SAFETY: `dev` came from cuDeviceGet; the buffer is 256 bytes and we pass its length, so
        // the driver writes a NUL-terminated string inside it.
        check(unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev) }, "cuDeviceGetName")?;
        name[255] = 0; // in case a driver filled the buffer completely
                       // SAFETY: the buffer now holds a NUL (the driver's terminator, or the last byte).
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
        let attr = |a: sys::CUdevice_attribute, what: &str| -> Result<u32> {
            let mut v = 0;
            // SAFETY: `dev` came from cuDeviceGet and `v` is a valid out pointer.
            check(unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) }, &format!("cuDeviceGetAttribute({what})"))?;
            Ok(v.max(0) as u32)
        };
        use sys::CUdevice_attribute as A;
        let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "compute capability major")?;
        let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "compute capability minor")?;
        let sm_count = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "SM count")?;
        let l2 = attr(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, "L2 size")? as usize;
        let smem = attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, "shared memory per block")? as usize;
        let mut total = 0usize;
        // SAFETY: `dev` came from cuDeviceGet and `total` is a valid out pointer.
        check(unsafe { sys::cuDeviceTotalMem_v2(&mut total, dev) }, "cuDeviceTotalMem")?;
        Ok(DeviceInfo { ordinal, name, compute_capability: (major, minor), sm_count, total_memory: total, l2_cache_bytes: l2, max_shared_memory_per_block_optin: smem })
    }

    /// The NVRTC architecture to compile for: `sm_80`, `sm_86`, `sm_89`, and the
    /// architecture-specific `sm_90a`, `sm_100a`, ... from Hopper on (wgmma, TMA, setmaxnreg).
    pub fn arch(&self) -> String {
        let (major, minor) = self.compute_capability;
        if major >= 9 {
            format!("sm_{major}{minor}a")
        } else {
            format!("sm_{major}{minor}")
        }
    }
}

/// One GPU, with its primary context retained (the context PyTorch and the CUDA runtime use, so
/// pointers and streams from them work here).
pub struct CudaDevice {
    info: DeviceInfo,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
}

// SAFETY: a CUcontext is a handle the driver lets any thread make current; CudaDevice never hands
// out the context without binding it first, and the primary context is released exactly once, in
// Drop. The driver API is thread-safe.
unsafe impl Send for CudaDevice {}
// SAFETY: all methods take &self and only bind the context and call thread-safe driver functions.
unsafe impl Sync for CudaDevice {}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice").field("info", &self.info).finish()
    }
}

impl CudaDevice {
    /// Open device `ordinal`. Errors: no driver, no such device, or a device older than sm_80.
    pub fn open(ordinal: usize) -> Result<Arc<CudaDevice>> {
        let info = DeviceInfo::query(ordinal)?;
        if info.compute_capability < MIN_COMPUTE_CAPABILITY {
            let (major, minor) = info.compute_capability;
            return Err(Error::Device(format!(
                "ferrodnn needs sm_80 or newer; device {ordinal} ({}) is sm_{major}{minor}; pick a newer GPU with CUDA_VISIBLE_DEVICES, or use the CPU engine",
                info.name
            )));
        }
        let mut dev: sys::CUdevice = 0;
        // SAFETY: the probe passed and the ordinal was checked by DeviceInfo::query.
        check(unsafe { sys::cuDeviceGet(&mut dev, ordinal as i32) }, "cuDeviceGet")?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `dev` is valid; retaining the primary context is reference counted and paired
        // with the release in Drop.
        check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) }, "cuDevicePrimaryCtxRetain")?;
        let device = CudaDevice { info, dev, ctx };
        device.bind()?;
        Ok(Arc::new(device))
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }
    pub fn ordinal(&self) -> usize {
        self.info.ordinal
    }
    pub fn name(&self) -> &str {
        &self.info.name
    }
    pub fn compute_capability(&self) -> (u32, u32) {
        self.info.compute_capability
    }
    pub fn sm_count(&self) -> u32 {
        self.info.sm_count
    }
    pub fn total_memory(&self) -> usize {
        self.info.total_memory
    }
    /// The NVRTC architecture for this device (see [`DeviceInfo::arch`]).
    pub fn arch(&self) -> String {
        self.info.arch()
    }
    /// The raw primary context, for interop.
    pub fn raw_context(&self) -> sys::CUcontext {
        self.ctx
    }

    /// Make this device's context current on the calling thread. Every method calls it first, so
    /// users need not.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: `ctx` is the primary context retained in `open` and not yet released (Drop has
        // not run while &self exists).
        check(unsafe { sys::cuCtxSetCurrent(self.ctx) }, "cuCtxSetCurrent")
    }

    /// Whether `ptr` is memory this device's kernels can read and write: device memory of this
    /// device, or managed memory. Host memory (pageable or pinned), another device's memory and
    /// unknown addresses give false, so that such a pointer handed to the GPU engine is an
    /// error, not a crash ([`pointer_location`](Self::pointer_location) says which).
    pub fn is_device_pointer(&self, ptr: u64) -> bool {
        matches!(self.pointer_location(ptr), PointerLocation::ThisDevice | PointerLocation::Managed)
    }

    /// Where `ptr` points, as the driver knows it (`cuPointerGetAttribute`): this device's
    /// memory, another device's, managed memory, page-locked host memory, or an address the
    /// driver does not know (pageable host memory, or nothing at all).
    pub fn pointer_location(&self, ptr: u64) -> PointerLocation {
        if self.bind().is_err() {
            return PointerLocation::Unknown;
        }
        let mut kind: u32 = 0;
        // SAFETY: cuPointerGetAttribute only inspects the address (it never dereferences it) and
        // writes an unsigned int (CUmemorytype) into `kind`, a valid out pointer of that size.
        let r = unsafe {
            sys::cuPointerGetAttribute(&mut kind as *mut u32 as *mut std::ffi::c_void, sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr as sys::CUdeviceptr)
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return PointerLocation::Unknown;
        }
        if kind == sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED as u32 {
            return PointerLocation::Managed;
        }
        if kind == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32 {
            return PointerLocation::PinnedHost;
        }
        if kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            return PointerLocation::Unknown;
        }
        let mut ordinal: i32 = -1;
        // SAFETY: as above; CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL writes an int into `ordinal`.
        let r = unsafe {
            sys::cuPointerGetAttribute(&mut ordinal as *mut i32 as *mut std::ffi::c_void, sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr as sys::CUdeviceptr)
        };
        match r {
            sys::CUresult::CUDA_SUCCESS if ordinal >= 0 && ordinal as usize != self.ordinal() => PointerLocation::OtherDevice(ordinal as usize),
            // (A driver without the ordinal attribute: device memory, taken to be ours as before.)
            _ => PointerLocation::ThisDevice,
        }
    }

    /// Check that `raw` is a stream ferrodnn may enqueue this device's work on: null (the legacy
    /// default stream), the per-thread or legacy stream handles (1, 2), or a live stream of this
    /// device's primary context (`cuStreamGetCtx`). A stream of another context (one the caller
    /// created with `cuCtxCreate`, or another device's) is refused: kernels loaded here cannot
    /// run there. The driver cannot vouch for a handle already destroyed; a stale handle the
    /// driver still recognizes is refused, any other is undefined, as in every CUDA API.
    pub fn check_stream(&self, raw: u64) -> Result<()> {
        if raw <= 2 {
            return Ok(());
        }
        self.bind()?;
        if !has_symbol("cuStreamGetCtx") {
            return Ok(());
        }
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the symbol is present (checked above); cuStreamGetCtx reads the handle's
        // context and writes it into `ctx`, a valid out pointer. The caller promises `raw` is a
        // stream handle (see set_stream's contract); the driver rejects ones it does not know.
        let r = unsafe { sys::cuStreamGetCtx(raw as sys::CUstream, &mut ctx) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(Error::InvalidArgument(format!("stream {raw:#x} is not a live CUDA stream: cuStreamGetCtx failed with {}", describe(r))));
        }
        if ctx != self.ctx {
            return Err(Error::InvalidArgument(format!(
                "stream {raw:#x} belongs to another CUDA context, not device {}'s primary context (the one ferrodnn, PyTorch and the CUDA runtime use); create the stream in the primary context",
                self.ordinal()
            )));
        }
        Ok(())
    }

    /// (free, total) device memory in bytes.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: the context is current; both are valid out pointers.
        check(unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) }, "cuMemGetInfo")?;
        Ok((free, total))
    }

    /// Wait for all work on the device's context to finish.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: the context is current.
        check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
    }

    /// A new stream that does not synchronize with the legacy default stream.
    pub fn new_stream(self: &Arc<Self>) -> Result<Stream> {
        self.bind()?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        // SAFETY: the context is current and `raw` is a valid out pointer.
        check(unsafe { sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) }, "cuStreamCreate")?;
        Ok(Stream { raw, owned: true, device: self.clone() })
    }

    /// Wrap a stream someone else created and owns (PyTorch's `torch.cuda.current_stream().cuda_stream`,
    /// or null for the legacy default stream). The wrapper never destroys it.
    ///
    /// # Safety
    /// `raw` must be null or a live stream of this device's primary context, and must outlive the
    /// returned [`Stream`] and all work enqueued through it.
    pub unsafe fn wrap_stream(self: &Arc<Self>, raw: sys::CUstream) -> Stream {
        Stream { raw, owned: false, device: self.clone() }
    }

    /// Allocate `bytes` of device memory (uninitialized), freed when the buffer drops.
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> Result<DeviceBuffer> {
        self.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        if bytes > 0 {
            // SAFETY: the context is current and `ptr` is a valid out pointer; a zero-byte request
            // is skipped because the driver rejects it.
            let r = check(unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) }, "cuMemAlloc");
            if let Err(e) = r {
                let free = match self.memory_info() {
                    Ok((free, total)) => format!("; the device has {} free of {}", crate::layout::format_bytes(free as u128), crate::layout::format_bytes(total as u128)),
                    Err(_) => String::new(),
                };
                return Err(Error::Device(format!("allocating {bytes} bytes ({}) on device {}: {e}{free}", crate::layout::format_bytes(bytes as u128), self.ordinal())));
            }
        }
        Ok(DeviceBuffer { ptr, bytes, device: self.clone() })
    }

    /// [`alloc`](Self::alloc) for a named purpose ("the workspace of graph \"g\""): its error
    /// starts with `what`, then says how many bytes were asked and how many are free.
    pub fn alloc_for(self: &Arc<Self>, bytes: usize, what: &str) -> Result<DeviceBuffer> {
        self.alloc(bytes).map_err(|e| match e {
            Error::Device(m) => Error::Device(format!("{what}: {m}")),
            e => e,
        })
    }

    /// Allocate and fill with zeros.
    pub fn alloc_zeroed(self: &Arc<Self>, bytes: usize) -> Result<DeviceBuffer> {
        let buf = self.alloc(bytes)?;
        if bytes > 0 {
            // SAFETY: `buf` owns `bytes` bytes at `ptr` in this (current) context.
            check(unsafe { sys::cuMemsetD8_v2(buf.ptr, 0, bytes) }, "cuMemsetD8")?;
        }
        Ok(buf)
    }

    /// Copy host bytes into a new device buffer (synchronous).
    pub fn upload(self: &Arc<Self>, data: &[u8]) -> Result<DeviceBuffer> {
        let mut buf = self.alloc(data.len())?;
        buf.copy_from_host(data)?;
        Ok(buf)
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // SAFETY: pairs the retain in `open`; every Stream and DeviceBuffer holds an Arc to this
        // device, so none outlives the context. Errors at teardown have nowhere to go.
        unsafe {
            sys::cuDevicePrimaryCtxRelease_v2(self.dev);
        }
    }
}

/// Where a pointer points ([`CudaDevice::pointer_location`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PointerLocation {
    /// Device memory of this device.
    ThisDevice,
    /// Device memory of the device with this ordinal.
    OtherDevice(usize),
    /// Managed (unified) memory: any device may use it.
    Managed,
    /// Page-locked host memory (cuMemHostAlloc, cudaHostAlloc, pinned tensors).
    PinnedHost,
    /// An address the driver does not know: pageable host memory, or none at all.
    Unknown,
}

impl PointerLocation {
    /// What the pointer is, for an error message about a pointer that is not device memory of
    /// device `ordinal`.
    pub fn describe(&self, ordinal: usize) -> String {
        match self {
            PointerLocation::ThisDevice => format!("device memory of device {ordinal}"),
            PointerLocation::OtherDevice(o) => format!("device memory of device {o}, not of device {ordinal} (the handle's)"),
            PointerLocation::Managed => "managed memory".into(),
            PointerLocation::PinnedHost => "page-locked host memory, not device memory".into(),
            PointerLocation::Unknown => "not device memory (a host pointer, or an address the CUDA driver does not know)".into(),
        }
    }
}

/// Whether the driver library exports `name` (for calls newer drivers added). False when there
/// is no driver.
pub(super) fn has_symbol(name: &str) -> bool {
    if driver().is_err() {
        return false;
    }
    // SAFETY: driver() succeeded, so culib() returns the loaded library (kept in a static); the
    // lookup (dlsym) does not call the symbol.
    unsafe { sys::culib().get::<*const c_void>(name.as_bytes()) }.is_ok()
}

/// A CUDA context of its own (not the primary one) with one stream in it, for checks that need a
/// stream ferrodnn must refuse ([`CudaDevice::check_stream`]). Destroyed on drop.
pub struct ForeignContextStream {
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    device: Arc<CudaDevice>,
}

impl ForeignContextStream {
    /// Create a context on `device` (`cuCtxCreate_v4`) and a stream in it; the device's primary
    /// context is made current again before returning. An error when the driver lacks
    /// `cuCtxCreate_v4` (CUDA 12.5+) or cannot create one.
    pub fn new(device: &Arc<CudaDevice>) -> Result<ForeignContextStream> {
        device.bind()?;
        if !has_symbol("cuCtxDestroy_v2") {
            return Err(Error::Device("the CUDA driver lacks cuCtxDestroy_v2".into()));
        }
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        if !has_symbol("cuCtxCreate_v4") {
            return Err(Error::Device("the CUDA driver lacks cuCtxCreate_v4 (CUDA 12.5+)".into()));
        }
        // SAFETY: the symbol is present (checked); `ctx` is a valid out pointer, `dev` a device
        // from cuDeviceGet, and null creation parameters ask for a plain context. The new
        // context is pushed onto this thread's stack.
        check(unsafe { sys::cuCtxCreate_v4(&mut ctx, std::ptr::null_mut(), 0, device.dev) }, "cuCtxCreate_v4")?;
        let mut stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: the new context is current; `stream` is a valid out pointer.
        let r = check(unsafe { sys::cuStreamCreate(&mut stream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) }, "cuStreamCreate");
        let out = ForeignContextStream { ctx, stream: if r.is_ok() { stream } else { std::ptr::null_mut() }, device: device.clone() };
        device.bind()?;
        r.map(|()| out)
    }

    /// The stream's raw handle.
    pub fn raw(&self) -> u64 {
        self.stream as u64
    }
}

impl Drop for ForeignContextStream {
    fn drop(&mut self) {
        // SAFETY: the stream and context were created in `new` and are destroyed once; the
        // stream has no work (nothing is enqueued on it: ferrodnn refuses it). Destroying the
        // context pops it if current; the primary context is bound again afterwards.
        unsafe {
            if !self.stream.is_null() {
                sys::cuCtxSetCurrent(self.ctx);
                sys::cuStreamDestroy_v2(self.stream);
            }
            sys::cuCtxDestroy_v2(self.ctx);
        }
        let _ = self.device.bind();
    }
}

/// A CUDA stream: created (and destroyed on drop) by ferrodnn, or borrowed from the user.
pub struct Stream {
    raw: sys::CUstream,
    owned: bool,
    device: Arc<CudaDevice>,
}

// SAFETY: a CUstream may be used from any thread of the process; the driver serializes access.
unsafe impl Send for Stream {}
// SAFETY: as above; Stream's methods only enqueue or wait through thread-safe driver calls.
unsafe impl Sync for Stream {}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("raw", &self.raw).field("owned", &self.owned).field("device", &self.device.ordinal()).finish()
    }
}

impl Stream {
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }
    /// False for a stream wrapped with [`CudaDevice::wrap_stream`].
    pub fn is_owned(&self) -> bool {
        self.owned
    }
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }
    /// Block until all work enqueued on the stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: `raw` is a live stream of this context (created by us, or promised live by the
        // caller of wrap_stream), or null for the default stream.
        check(unsafe { sys::cuStreamSynchronize(self.raw) }, "cuStreamSynchronize")
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: we created this stream in new_stream and destroy it exactly once; the device
            // (and so the context) is alive through our Arc. Pending work still completes: the
            // driver defers the destruction until the stream is idle.
            unsafe {
                let _ = self.device.bind();
                sys::cuStreamDestroy_v2(self.raw);
            }
        }
    }
}

/// Device memory owned by ferrodnn, freed on drop.
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    device: Arc<CudaDevice>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({:#x}, {} bytes, device {})", self.ptr, self.bytes, self.device.ordinal())
    }
}

impl DeviceBuffer {
    /// The device address (for a variant pack's `Buffer::Device`, or kernel arguments).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.bytes
    }
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    fn check_len(&self, what: &str, n: usize) -> Result<()> {
        if n != self.bytes {
            return Err(Error::InvalidArgument(format!("{what}: the device buffer holds {} bytes but the host slice has {n}; sizes must match", self.bytes)));
        }
        Ok(())
    }

    /// Copy `src` (exactly `len()` bytes) into the buffer; returns when the copy is done.
    pub fn copy_from_host(&mut self, src: &[u8]) -> Result<()> {
        self.check_len("copy_from_host", src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.device.bind()?;
        // SAFETY: the buffer owns `bytes` bytes at `ptr`, `src` has exactly that many readable
        // bytes, and the synchronous copy has finished reading `src` when it returns.
        check(unsafe { sys::cuMemcpyHtoD_v2(self.ptr, src.as_ptr() as *const c_void, src.len()) }, "cuMemcpyHtoD")
    }

    /// Copy the buffer into `dst` (exactly `len()` bytes); returns when the copy is done.
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<()> {
        self.check_len("copy_to_host", dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.device.bind()?;
        // SAFETY: `dst` has exactly `bytes` writable bytes, the buffer owns as many, and the
        // synchronous copy has finished writing `dst` when it returns.
        check(unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr() as *mut c_void, self.ptr, dst.len()) }, "cuMemcpyDtoH")
    }

    /// The buffer's contents as a new Vec (synchronous).
    pub fn to_host(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.bytes];
        self.copy_to_host(&mut v)?;
        Ok(v)
    }

    /// Copy another device buffer of the same size into this one (synchronous).
    pub fn copy_from_device(&mut self, src: &DeviceBuffer) -> Result<()> {
        self.check_len("copy_from_device", src.bytes)?;
        if self.bytes == 0 {
            return Ok(());
        }
        self.device.bind()?;
        // SAFETY: both buffers own `bytes` bytes; they are distinct allocations (&mut self and
        // &src cannot alias), and unified addressing lets the copy read another device's memory.
        check(unsafe { sys::cuMemcpyDtoD_v2(self.ptr, src.ptr, self.bytes) }, "cuMemcpyDtoD")
    }

    /// Enqueue a copy of `src` into the buffer on `stream`.
    ///
    /// # Safety
    /// `src` must stay alive and unchanged until the stream has run the copy (synchronize the
    /// stream, or use page-locked memory you keep alive).
    pub unsafe fn copy_from_host_async(&mut self, src: &[u8], stream: &Stream) -> Result<()> {
        self.check_len("copy_from_host_async", src.len())?;
        self.device.bind()?;
        // SAFETY: sizes match (checked); the caller keeps `src` alive until the copy has run.
        check(unsafe { sys::cuMemcpyHtoDAsync_v2(self.ptr, src.as_ptr() as *const c_void, src.len(), stream.raw) }, "cuMemcpyHtoDAsync")
    }

    /// Enqueue a copy of the buffer into `dst` on `stream`.
    ///
    /// # Safety
    /// `dst` must stay alive, and must not be read, until the stream has run the copy.
    pub unsafe fn copy_to_host_async(&self, dst: &mut [u8], stream: &Stream) -> Result<()> {
        self.check_len("copy_to_host_async", dst.len())?;
        self.device.bind()?;
        // SAFETY: sizes match (checked); the caller keeps `dst` alive until the copy has run.
        check(unsafe { sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr() as *mut c_void, self.ptr, dst.len(), stream.raw) }, "cuMemcpyDtoHAsync")
    }

    /// Enqueue filling the buffer with `byte` on `stream`.
    pub fn fill_async(&mut self, byte: u8, stream: &Stream) -> Result<()> {
        if self.bytes == 0 {
            return Ok(());
        }
        self.device.bind()?;
        // SAFETY: the buffer owns `bytes` bytes and cannot be freed before the memset runs: Drop
        // frees with cuMemFree, which waits for outstanding work on the memory.
        check(unsafe { sys::cuMemsetD8Async(self.ptr, byte, self.bytes, stream.raw) }, "cuMemsetD8Async")
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 {
            // SAFETY: `ptr` came from cuMemAlloc in this context and is freed exactly once; the
            // context is alive through our Arc. cuMemFree synchronizes with pending work on it.
            unsafe {
                let _ = self.device.bind();
                sys::cuMemFree_v2(self.ptr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PointerLocation;

    /// Each location says what the pointer is, naming both devices for another device's memory.
    #[test]
    fn pointer_locations_say_what_they_are() {
        assert!(PointerLocation::OtherDevice(1).describe(0).contains("device memory of device 1, not of device 0"));
        assert!(PointerLocation::Unknown.describe(0).contains("not device memory"));
        assert!(PointerLocation::PinnedHost.describe(0).contains("host memory"));
        assert!(PointerLocation::ThisDevice.describe(2).contains("device 2"));
    }
}
