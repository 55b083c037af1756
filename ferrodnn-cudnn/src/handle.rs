//! Handles and streams, versions and error strings.
//!
//! `cudnnCreate` gives a GPU handle (ferrodnn's CUDA engine on the current CUDA context's device,
//! or device 0) when a supported GPU is present, else a CPU handle (the fast CPU engine) whose
//! calls take host pointers: a ferrodnn extension that lets the same C programs run without a
//! GPU. `FERRODNN_CUDNN_DEVICE=cpu` asks for a CPU handle even where there is a GPU.

use crate::api::*;
use crate::exec::{gpu, PlanCache};
use crate::registry::Registry;
use crate::types::*;
use ferrodnn::engine::cuda::DeviceBuffer;
use std::collections::HashMap;
use std::ffi::{c_char, CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

/// What a `cudnnHandle_t` stands for.
pub struct HandleState {
    pub fd: ferrodnn::Handle,
    /// Whether calls take device pointers (the CUDA engine) or host pointers (the CPU engines).
    pub gpu: bool,
    /// The raw stream given to cudnnSetStream (null: the default stream).
    pub stream: Mutex<usize>,
    /// Plans by call key (the function and every descriptor and mode it depends on).
    pub plans: PlanCache,
    /// Device memory for what a call needs beyond the caller's buffers (copies of inputs that
    /// alias outputs, outputs the caller discards, a workspace the caller did not give), reused
    /// from call to call on the handle's stream.
    pub scratch: Mutex<Option<DeviceBuffer>>,
}

pub static HANDLES: Registry<Arc<HandleState>> = Registry::new("cudnnHandle_t");

/// The state behind a handle argument.
pub fn handle(h: cudnnHandle_t) -> R<Arc<HandleState>> {
    HANDLES.get(h)
}

fn new_handle(force_cpu: bool) -> R<HandleState> {
    let want_cpu = force_cpu || std::env::var("FERRODNN_CUDNN_DEVICE").map(|v| v.eq_ignore_ascii_case("cpu")).unwrap_or(false);
    let (fd, is_gpu) = if !want_cpu && ferrodnn::engine::cuda::gpu_available() {
        let ordinal = gpu::current_device().unwrap_or(0);
        let h = ferrodnn::Handle::cuda(ordinal).map_err(|e| ApiError::new(CUDNN_STATUS_NOT_INITIALIZED, format!("the GPU {ordinal} could not be opened: {e}")))?;
        // A new cuDNN handle works on the default (null) stream until cudnnSetStream.
        // SAFETY: null is the legacy default stream, which is always live.
        unsafe { h.set_stream(0) }?;
        (h, true)
    } else {
        (ferrodnn::Handle::cpu(), false)
    };
    Ok(HandleState { fd, gpu: is_gpu, stream: Mutex::new(0), plans: PlanCache::default(), scratch: Mutex::new(None) })
}

/// The handle backend descriptors fall back on when a program gives them none (an operation
/// graph without CUDNN_ATTR_OPERATIONGRAPH_HANDLE): one per process, of the kind cudnnCreate
/// gives.
pub fn default_handle() -> R<Arc<HandleState>> {
    static DEFAULT: OnceLock<Arc<HandleState>> = OnceLock::new();
    if let Some(h) = DEFAULT.get() {
        return Ok(h.clone());
    }
    let h = Arc::new(new_handle(false)?);
    Ok(DEFAULT.get_or_init(|| h).clone())
}

#[no_mangle]
pub extern "C" fn cudnnCreate(out: *mut cudnnHandle_t) -> Status {
    guard("cudnnCreate", || {
        non_null(out, "handle")?;
        let h = HANDLES.create(Arc::new(new_handle(false)?));
        // SAFETY: checked not null; the caller gives a writable cudnnHandle_t.
        unsafe { write_out(out, "handle", h) }
    })
}

/// A handle on the CPU whatever the machine has: its calls take host pointers (a ferrodnn
/// extension; destroy it with cudnnDestroy).
#[no_mangle]
pub extern "C" fn ferrodnnCreateCpu(out: *mut cudnnHandle_t) -> Status {
    guard("ferrodnnCreateCpu", || {
        non_null(out, "handle")?;
        let h = HANDLES.create(Arc::new(new_handle(true)?));
        // SAFETY: checked not null; the caller gives a writable cudnnHandle_t.
        unsafe { write_out(out, "handle", h) }
    })
}

#[no_mangle]
pub extern "C" fn cudnnDestroy(h: cudnnHandle_t) -> Status {
    guard("cudnnDestroy", || {
        // Work this handle enqueued may still use its scratch memory and its plans' modules,
        // which go with it: wait for it first. The whole device is synchronized, as cuDNN's
        // cudnnDestroy does (an implicit cudaDeviceSynchronize), not the handle's stream: that is
        // the caller's, which a program may already have destroyed (waiting on a destroyed stream
        // is undefined), and the device's synchronization covers it whichever stream it was.
        // (A failure here is an earlier kernel's sticky error; the handle is destroyed anyway.)
        if let Ok(state) = handle(h) {
            if let Some(dev) = state.fd.cuda_device() {
                let _ = dev.synchronize();
            }
        }
        HANDLES.destroy(h)
    })
}

#[no_mangle]
pub extern "C" fn cudnnSetStream(h: cudnnHandle_t, stream: cudaStream_t) -> Status {
    guard("cudnnSetStream", || {
        let state = handle(h)?;
        let same = *state.stream.lock().unwrap_or_else(|p| p.into_inner()) == stream as usize;
        // Frameworks set the stream before every call, mostly to the one already set: nothing
        // to do then (and no wait).
        if state.gpu && !same {
            // The scratch memory is reused in stream order: let the old stream finish with it.
            if state.scratch.lock().map(|s| s.is_some()).unwrap_or(false) {
                if let Some(s) = state.fd.stream() {
                    s.synchronize().map_err(ApiError::from)?;
                }
            }
            // SAFETY: as cuDNN requires of its caller, `stream` is null or a live stream of the
            // handle's device that outlives the work enqueued on it.
            unsafe { state.fd.set_stream(stream as u64) }?;
        }
        *state.stream.lock().unwrap_or_else(|p| p.into_inner()) = stream as usize;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cudnnGetStream(h: cudnnHandle_t, out: *mut cudaStream_t) -> Status {
    guard("cudnnGetStream", || {
        let state = handle(h)?;
        let s = *state.stream.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the caller gives a writable cudaStream_t (null is refused).
        unsafe { write_out(out, "streamId", s as cudaStream_t) }
    })
}

/// The cuDNN version reported: [`REPORTED_VERSION`] or `FERRODNN_CUDNN_VERSION`.
pub fn reported_version() -> usize {
    std::env::var("FERRODNN_CUDNN_VERSION").ok().and_then(|v| v.trim().parse::<usize>().ok()).filter(|v| (90000..100000).contains(v)).unwrap_or(REPORTED_VERSION)
}

#[no_mangle]
pub extern "C" fn cudnnGetVersion() -> usize {
    reported_version()
}

#[no_mangle]
pub extern "C" fn cudnnGetProperty(kind: i32, value: *mut i32) -> Status {
    guard("cudnnGetProperty", || {
        let v = reported_version();
        let x = match kind {
            MAJOR_VERSION => v / 10000,
            MINOR_VERSION => (v / 100) % 100,
            PATCH_LEVEL => v % 100,
            _ => return Err(bad(format!("type {kind} is not a libraryPropertyType (MAJOR_VERSION 0, MINOR_VERSION 1, PATCH_LEVEL 2)"))),
        };
        // SAFETY: the caller gives a writable int (null is refused).
        unsafe { write_out(value, "value", x as i32) }
    })
}

/// The CUDA version of the driver ferrodnn runs on (`major * 1000 + minor * 10`; ferrodnn loads
/// the driver rather than linking a CUDA runtime), or 0 where there is no driver;
/// `FERRODNN_CUDNN_CUDART_VERSION` reports another (for programs run on the CPU handle that
/// check it, such as the cudnn frontend's samples).
#[no_mangle]
pub extern "C" fn cudnnGetCudartVersion() -> usize {
    if let Some(v) = std::env::var("FERRODNN_CUDNN_CUDART_VERSION").ok().and_then(|v| v.trim().parse::<usize>().ok()) {
        return v;
    }
    std::panic::catch_unwind(|| ferrodnn::engine::cuda::driver_version().map_or(0, |(major, minor)| (major * 1000 + minor * 10) as usize)).unwrap_or(0)
}

/// The newest compute capability ferrodnn's kernels are compiled for at run time (NVRTC targets
/// the device's own architecture): reported as 12.0, `major * 100 + minor * 10`.
#[no_mangle]
pub extern "C" fn cudnnGetMaxDeviceVersion() -> usize {
    1200
}

/// The sub-library version checks: one library, always consistent.
#[no_mangle]
pub extern "C" fn cudnnGraphVersionCheck() -> Status {
    CUDNN_STATUS_SUCCESS
}
#[no_mangle]
pub extern "C" fn cudnnOpsVersionCheck() -> Status {
    CUDNN_STATUS_SUCCESS
}
#[no_mangle]
pub extern "C" fn cudnnCnnVersionCheck() -> Status {
    CUDNN_STATUS_SUCCESS
}

/// Errors kernels found while running (cuDNN's batchnorm overflow checks): ferrodnn's kernels
/// report none, so `rstatus` is success once the handle is known.
#[no_mangle]
pub extern "C" fn cudnnQueryRuntimeError(h: cudnnHandle_t, rstatus: *mut Status, mode: i32, _tag: *mut std::ffi::c_void) -> Status {
    guard("cudnnQueryRuntimeError", || {
        handle(h)?;
        if !(CUDNN_ERRQUERY_RAWCODE..=CUDNN_ERRQUERY_BLOCKING).contains(&mode) {
            return Err(bad(format!("mode {mode} is not a cudnnErrQueryMode_t")));
        }
        // SAFETY: the caller gives a writable cudnnStatus_t (null is refused).
        unsafe { write_out(rstatus, "rstatus", CUDNN_STATUS_SUCCESS) }
    })
}

/// ferrodnn's own version, `major * 10000 + minor * 100 + patch` (cudnnGetVersion reports the
/// cuDNN version frameworks check for).
#[no_mangle]
pub extern "C" fn ferrodnnGetVersion() -> usize {
    let p = |s: &str| s.parse::<usize>().unwrap_or(0);
    p(env!("CARGO_PKG_VERSION_MAJOR")) * 10000 + p(env!("CARGO_PKG_VERSION_MINOR")) * 100 + p(env!("CARGO_PKG_VERSION_PATCH"))
}

/// "ferrodnn <version>": how a program tells this library from NVIDIA's.
#[no_mangle]
pub extern "C" fn ferrodnnGetVersionString() -> *const c_char {
    static S: OnceLock<CString> = OnceLock::new();
    S.get_or_init(|| CString::new(format!("ferrodnn {}", env!("CARGO_PKG_VERSION"))).unwrap_or_default()).as_ptr()
}

/// Whether `handle` runs on a GPU (1, device pointers) or on the CPU (0, host pointers).
#[no_mangle]
pub extern "C" fn ferrodnnHandleIsGpu(h: cudnnHandle_t, is_gpu: *mut i32) -> Status {
    guard("ferrodnnHandleIsGpu", || {
        let state = handle(h)?;
        // SAFETY: the caller gives a writable int (null is refused).
        unsafe { write_out(is_gpu, "isGpu", state.gpu as i32) }
    })
}

#[no_mangle]
pub extern "C" fn cudnnGetErrorString(status: Status) -> *const c_char {
    static NAMES: OnceLock<Mutex<HashMap<Status, &'static CStr>>> = OnceLock::new();
    std::panic::catch_unwind(|| {
        let map = NAMES.get_or_init(Default::default);
        let mut m = map.lock().unwrap_or_else(|p| p.into_inner());
        let s = m.entry(status).or_insert_with(|| Box::leak(CString::new(status_name(status)).unwrap_or_default().into_boxed_c_str()));
        s.as_ptr()
    })
    .unwrap_or(c"CUDNN_STATUS_INTERNAL_ERROR".as_ptr())
}

/// Copies the calling thread's last error message into `message` (at most `max_size` bytes with
/// the terminating NUL).
#[no_mangle]
pub extern "C" fn cudnnGetLastErrorString(message: *mut c_char, max_size: usize) {
    if message.is_null() || max_size == 0 {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        let msg = last_error();
        let n = msg.len().min(max_size - 1);
        // SAFETY: the caller gives `max_size` writable bytes at `message` (checked not null);
        // we write n + 1 <= max_size of them.
        unsafe {
            std::ptr::copy_nonoverlapping(msg.as_ptr(), message as *mut u8, n);
            *message.add(n) = 0;
        }
    });
}
