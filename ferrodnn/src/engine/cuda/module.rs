//! Loaded kernels and how to launch them: [`Module`] (a cubin loaded into a device's context),
//! [`Function`] (one kernel of it: attributes, dynamic shared memory, [`Function::launch`] and
//! [`Function::launch_cluster`]) and [`Event`] (stream timing, and waits that time out).
//!
//! As in [`runtime`](super::runtime), every driver symbol called here is probed before the first
//! call, so an old driver gives an [`Error::Device`] naming what it lacks instead of cudarc's
//! "Missing symbol" panic. One symbol is optional: `cuLaunchKernelEx` (cluster launches; CUDA
//! 11.8+ drivers), which cudarc exposes with the `cuda-13000` feature this crate enables.
//!
//! ```no_run
//! use ferrodnn::engine::cuda::{self, CompileOptions, CudaDevice, Module};
//! use std::ffi::c_void;
//! let dev = CudaDevice::open(0).unwrap();
//! let src = r#"extern "C" __global__ void fill(float* y, float v, int n) {
//!     int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = v; }"#;
//! let cubin = cuda::compile_cubin(src, "fill", &CompileOptions::new(dev.arch())).unwrap();
//! let module = Module::load(&dev, &cubin).unwrap();
//! let fill = module.function("fill").unwrap();
//! let stream = dev.new_stream().unwrap();
//! let y = dev.alloc(1024 * 4).unwrap();
//! let (mut ptr, mut v, mut n) = (y.device_ptr(), 2.5f32, 1024i32);
//! let mut params = [&mut ptr as *mut u64 as *mut c_void, &mut v as *mut f32 as *mut c_void, &mut n as *mut i32 as *mut c_void];
//! // SAFETY: the arguments match fill's parameters and `y` outlives the kernel (we synchronize).
//! unsafe { fill.launch(&stream, (4, 1, 1), (256, 1, 1), 0, &mut params) }.unwrap();
//! cuda::synchronize_timeout(&stream, std::time::Duration::from_secs(10)).unwrap();
//! ```

use super::runtime::{check, driver, CudaDevice, Stream};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::{c_void, CStr, CString};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Every driver symbol this module calls unconditionally.
const REQUIRED_MODULE_SYMBOLS: &[&str] = &[
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuFuncGetAttribute",
    "cuFuncSetAttribute",
    "cuLaunchKernel",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
];

/// `cuEventElapsedTime_v2` (CUDA 12.8+) and the older `cuEventElapsedTime` share this signature;
/// cudarc's cuda-13000 bindings only know the first, so we look it up ourselves and fall back.
type ElapsedFn = unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult;

/// What the probe found in the driver beyond the required symbols.
struct Api {
    /// `cuLaunchKernelEx` is exported (cluster launches).
    launch_ex: bool,
    elapsed: ElapsedFn,
}

fn api() -> Result<&'static Api> {
    // The driver probe first: its error (no GPU, old driver) is the one to report.
    driver()?;
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| std::panic::catch_unwind(probe_api).unwrap_or_else(|_| Err("the CUDA driver probe for module and launch symbols panicked".to_string())))
        .as_ref()
        .map_err(|e| Error::Device(e.clone()))
}

fn probe_api() -> std::result::Result<Api, String> {
    // SAFETY: driver() succeeded, so the driver library loads and culib() returns it (it lives in
    // a static and is never closed).
    let lib = unsafe { sys::culib() };
    // SAFETY: a dlsym lookup only; the address is not called.
    let has = |name: &str| unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_ok();
    let missing: Vec<&str> = REQUIRED_MODULE_SYMBOLS.iter().copied().filter(|n| !has(n)).collect();
    if !missing.is_empty() {
        return Err(format!(
            "the CUDA driver library lacks {} (the driver is too old for ferrodnn, which needs a CUDA 12 or 13 driver); update the NVIDIA driver",
            missing.join(", ")
        ));
    }
    let mut elapsed = None;
    for name in ["cuEventElapsedTime_v2", "cuEventElapsedTime"] {
        // SAFETY: both names have the C signature `CUresult (float*, CUevent, CUevent)`, which is
        // ElapsedFn; the library stays loaded for the life of the process, so the copied function
        // pointer stays valid.
        if let Ok(f) = unsafe { lib.get::<ElapsedFn>(name.as_bytes()) } {
            elapsed = Some(*f);
            break;
        }
    }
    let Some(elapsed) = elapsed else {
        return Err("the CUDA driver library lacks cuEventElapsedTime_v2 and cuEventElapsedTime; update the NVIDIA driver".to_string());
    };
    Ok(Api { launch_ex: has("cuLaunchKernelEx"), elapsed })
}

/// Whether the driver exports `cuLaunchKernelEx` (clusters, programmatic dependent launch).
pub(crate) fn has_launch_ex() -> bool {
    api().is_ok_and(|a| a.launch_ex)
}

/// A hint appended to module-load errors whose usual cause we know.
fn load_hint(msg: &str, device: &CudaDevice) -> String {
    let driver = super::runtime::driver_version().map(|(a, b)| format!("{a}.{b}")).unwrap_or_else(|_| "?".into());
    let nvrtc = super::nvrtc::nvrtc_version().map(|(a, b)| format!("{a}.{b}")).unwrap_or_else(|_| "?".into());
    if msg.contains("CUDA_ERROR_NO_BINARY_FOR_GPU") {
        format!("; the cubin was compiled for another architecture: compile it for {} (this device)", device.arch())
    } else if msg.contains("CUDA_ERROR_INVALID_IMAGE") || msg.contains("CUDA_ERROR_UNSUPPORTED_PTX_VERSION") || msg.contains("CUDA_ERROR_INVALID_PTX") {
        format!("; the driver (CUDA {driver}) may be older than the compiler that made the cubin (NVRTC {nvrtc}): update the driver, or use an NVRTC no newer than the driver")
    } else {
        String::new()
    }
}

/// Check that `image` looks like a whole 64-bit little-endian ELF file (a cubin): the driver
/// reads the file's size from its headers, so a truncated buffer would make it read past the end.
fn check_cubin(image: &[u8]) -> Result<()> {
    let bad = |why: &str| Err(Error::InvalidArgument(format!("Module::load: {why}; pass a cubin from compile_cubin")));
    if image.len() < 64 || &image[..4] != b"\x7fELF" {
        return bad("the image is not an ELF file (cubin)");
    }
    if image[4] != 2 || image[5] != 1 {
        return bad("the ELF file is not 64-bit little-endian");
    }
    let u16_at = |o: usize| u16::from_le_bytes([image[o], image[o + 1]]) as u64;
    let u64_at = |o: usize| u64::from_le_bytes(image[o..o + 8].try_into().unwrap());
    let (phoff, shoff) = (u64_at(0x20), u64_at(0x28));
    let (phentsize, phnum, shentsize, shnum) = (u16_at(0x36), u16_at(0x38), u16_at(0x3A), u16_at(0x3C));
    let end = |off: u64, size: u64, num: u64| off.checked_add(size.checked_mul(num)?);
    let len = image.len() as u64;
    match (end(phoff, phentsize, phnum), end(shoff, shentsize, shnum)) {
        (Some(p), Some(s)) if p <= len && s <= len => Ok(()),
        _ => bad("the ELF headers point past the end of the image (truncated)"),
    }
}

/// A cubin loaded into a device's (primary) context; unloaded when the last [`Function`] taken
/// from it, and the module itself, are dropped.
pub struct Module {
    raw: sys::CUmodule,
    device: Arc<CudaDevice>,
    image_bytes: usize,
}

// SAFETY: a CUmodule is a handle valid in its context from any thread; every method binds the
// context first, and the module is unloaded exactly once, in Drop.
unsafe impl Send for Module {}
// SAFETY: all methods take &self and only call thread-safe driver functions.
unsafe impl Sync for Module {}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module").field("raw", &self.raw).field("image_bytes", &self.image_bytes).field("device", &self.device.ordinal()).finish()
    }
}

impl Module {
    /// Load a cubin (as [`compile_cubin`](super::compile_cubin) returns) into `device`'s context.
    pub fn load(device: &Arc<CudaDevice>, cubin: &[u8]) -> Result<Arc<Module>> {
        api()?;
        check_cubin(cubin)?;
        // An 8-byte-aligned copy: the driver parses the ELF in place, and a Vec<u8> has no
        // alignment guarantee.
        let mut aligned = vec![0u64; cubin.len().div_ceil(8)];
        // SAFETY: `aligned` has at least cubin.len() bytes; u64 has no invalid bit patterns.
        unsafe { std::ptr::copy_nonoverlapping(cubin.as_ptr(), aligned.as_mut_ptr() as *mut u8, cubin.len()) };
        device.bind()?;
        let mut raw: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: the symbol was probed; the context is current; `aligned` holds a whole ELF image
        // (checked above: its headers lie inside it) and outlives the call, which copies it.
        let r = check(unsafe { sys::cuModuleLoadData(&mut raw, aligned.as_ptr() as *const c_void) }, "cuModuleLoadData");
        if let Err(Error::Device(msg)) = r {
            let mut hint = load_hint(&msg, device);
            if msg.contains("OUT_OF_MEMORY") {
                if let Ok((free, total)) = device.memory_info() {
                    hint = format!("; the device has {} free of {}", crate::layout::format_bytes(free as u128), crate::layout::format_bytes(total as u128));
                }
            }
            return Err(Error::Device(format!("loading a {}-byte cubin on device {} ({}): {msg}{hint}", cubin.len(), device.ordinal(), device.arch())));
        }
        r?;
        Ok(Arc::new(Module { raw, device: device.clone(), image_bytes: cubin.len() }))
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }
    pub fn raw(&self) -> sys::CUmodule {
        self.raw
    }

    /// The kernel named `name` (its `extern "C"` name, or the mangled C++ name).
    pub fn function(self: &Arc<Self>, name: &str) -> Result<Function> {
        api()?;
        let c_name = CString::new(name).map_err(|_| Error::InvalidArgument(format!("kernel name `{name}` contains a NUL byte")))?;
        self.device.bind()?;
        let mut raw: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: the module is loaded in this (current) context; the name is NUL-terminated and
        // outlives the call.
        check(unsafe { sys::cuModuleGetFunction(&mut raw, self.raw, c_name.as_ptr()) }, "cuModuleGetFunction")
            .map_err(|e| Error::Device(format!("kernel `{name}`: {e} (is it declared extern \"C\"?)")))?;
        let max_threads = func_attr(raw, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, name)?;
        let max_dynamic = func_attr(raw, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, name)?;
        Ok(Function { raw, module: self.clone(), name: name.to_string(), max_threads, max_dynamic_shared: AtomicU32::new(max_dynamic) })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded by cuModuleLoadData in this context and unloaded exactly once; every
        // Function holds an Arc to the module, so none outlives it. Callers synchronize before
        // dropping modules whose kernels may still run (documented on Function::launch).
        unsafe {
            let _ = self.device.bind();
            sys::cuModuleUnload(self.raw);
        }
    }
}

/// One attribute of a function; the caller has bound the function's context.
fn func_attr(raw: sys::CUfunction, attr: sys::CUfunction_attribute, name: &str) -> Result<u32> {
    let mut v = 0;
    // SAFETY: `raw` came from cuModuleGetFunction on a loaded module; `v` is a valid out pointer.
    check(unsafe { sys::cuFuncGetAttribute(&mut v, attr, raw) }, &format!("cuFuncGetAttribute({attr:?}) for kernel `{name}`"))?;
    Ok(v.max(0) as u32)
}

/// What the compiler gave a kernel, for reports (`cuFuncGetAttribute`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionAttributes {
    pub num_regs: u32,
    pub static_shared_bytes: u32,
    pub const_bytes: u32,
    /// Local memory per thread (register spills, local arrays).
    pub local_bytes: u32,
    pub max_threads_per_block: u32,
    /// The most dynamic shared memory a launch may ask for now.
    pub max_dynamic_shared_bytes: u32,
    /// PTX and SASS versions, major*10+minor (90 for sm_90).
    pub ptx_version: u32,
    pub binary_version: u32,
}

/// One kernel of a [`Module`]; keeps the module loaded.
pub struct Function {
    raw: sys::CUfunction,
    module: Arc<Module>,
    name: String,
    max_threads: u32,
    max_dynamic_shared: AtomicU32,
}

// SAFETY: a CUfunction is a handle valid from any thread while its module is loaded (our Arc);
// the driver serializes attribute changes and launches.
unsafe impl Send for Function {}
// SAFETY: as above; &self methods only call thread-safe driver functions.
unsafe impl Sync for Function {}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Function").field("name", &self.name).field("raw", &self.raw).finish()
    }
}

impl Function {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn module(&self) -> &Arc<Module> {
        &self.module
    }
    pub fn raw(&self) -> sys::CUfunction {
        self.raw
    }

    /// Registers, shared, local and constant memory, limits and versions.
    pub fn attributes(&self) -> Result<FunctionAttributes> {
        self.module.device.bind()?;
        use sys::CUfunction_attribute as A;
        let a = |attr| func_attr(self.raw, attr, &self.name);
        Ok(FunctionAttributes {
            num_regs: a(A::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            static_shared_bytes: a(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            const_bytes: a(A::CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES)?,
            local_bytes: a(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            max_threads_per_block: a(A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            max_dynamic_shared_bytes: a(A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)?,
            ptx_version: a(A::CU_FUNC_ATTRIBUTE_PTX_VERSION)?,
            binary_version: a(A::CU_FUNC_ATTRIBUTE_BINARY_VERSION)?,
        })
    }

    /// Allow launches with up to `bytes` of dynamic shared memory (above the default 48 KiB needs
    /// this opt-in). Static plus dynamic shared memory must fit the device's per-block limit.
    pub fn set_max_dynamic_shared_memory(&self, bytes: u32) -> Result<()> {
        let device = &self.module.device;
        device.bind()?;
        let static_bytes = func_attr(self.raw, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, &self.name)? as u64;
        let limit = device.info().max_shared_memory_per_block_optin as u64;
        if static_bytes + bytes as u64 > limit {
            return Err(Error::InvalidArgument(format!(
                "kernel `{}`: {bytes} bytes of dynamic shared memory plus {static_bytes} static exceed the device's {limit} bytes per block",
                self.name
            )));
        }
        // SAFETY: a live function of the current context; the value is in range (checked above).
        check(
            unsafe { sys::cuFuncSetAttribute(self.raw, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes as i32) },
            &format!("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES = {bytes}) for kernel `{}`", self.name),
        )?;
        self.max_dynamic_shared.store(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// The checks both launch paths share: same device, sane dimensions, shared memory within the
    /// opted-in limit, the argument count (when known) and no null argument pointer.
    fn check_launch(&self, stream: &Stream, grid: (u32, u32, u32), block: (u32, u32, u32), shared_bytes: u32, params: &[*mut c_void]) -> Result<()> {
        let err = |why: String| Err(Error::InvalidArgument(format!("launching kernel `{}`: {why}", self.name)));
        same_device(&format!("launching kernel `{}`: the kernel", self.name), &self.module.device, stream)?;
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 || block.0 == 0 || block.1 == 0 || block.2 == 0 {
            return err(format!("grid {grid:?} and block {block:?} must have no zero dimension"));
        }
        if grid.0 > i32::MAX as u32 || grid.1 > 65535 || grid.2 > 65535 {
            return err(format!("grid {grid:?} exceeds (2^31-1, 65535, 65535)"));
        }
        if block.0 > 1024 || block.1 > 1024 || block.2 > 64 {
            return err(format!("block {block:?} exceeds (1024, 1024, 64)"));
        }
        let threads = block.0 as u64 * block.1 as u64 * block.2 as u64;
        if threads > self.max_threads as u64 {
            return err(format!("block {block:?} has {threads} threads; this kernel allows at most {}", self.max_threads));
        }
        let max_dynamic = self.max_dynamic_shared.load(Ordering::Relaxed);
        if shared_bytes > max_dynamic {
            return err(format!("{shared_bytes} bytes of dynamic shared memory exceed the kernel's limit of {max_dynamic}; call set_max_dynamic_shared_memory first"));
        }
        if let Some(i) = params.iter().position(|p| p.is_null()) {
            return err(format!("parameter {i} is a null pointer; each entry must point to the argument's value"));
        }
        Ok(())
    }

    /// Enqueue the kernel on `stream` (`cuLaunchKernel`). Returns once it is enqueued; errors
    /// from its execution surface at the next synchronization (see [`synchronize_timeout`]).
    ///
    /// # Safety
    /// `params[i]` must point to a value of the kernel's i-th parameter type (a device pointer is
    /// a `u64`), one entry per parameter; the driver copies the values before returning. Every
    /// device address passed must stay allocated, and every buffer the kernel reads or writes must
    /// not be used by the host or other streams, until the kernel has finished. The module must
    /// not be dropped before then either.
    pub unsafe fn launch(&self, stream: &Stream, grid: (u32, u32, u32), block: (u32, u32, u32), shared_bytes: u32, params: &mut [*mut c_void]) -> Result<()> {
        self.check_launch(stream, grid, block, shared_bytes, params)?;
        self.module.device.bind()?;
        let params_ptr = if params.is_empty() { std::ptr::null_mut() } else { params.as_mut_ptr() };
        // SAFETY: the symbol was probed (api() succeeded when the function was created); the
        // function and stream belong to the current context (checked); dimensions and shared
        // memory are within limits (checked); `params` holds one valid pointer per parameter
        // (the caller's contract, count checked when the driver can tell); `extra` is null.
        let r = unsafe { sys::cuLaunchKernel(self.raw, grid.0, grid.1, grid.2, block.0, block.1, block.2, shared_bytes, stream.raw(), params_ptr, std::ptr::null_mut()) };
        // The message is only formatted on failure: launches are on the execute path.
        if r == sys::CUresult::CUDA_SUCCESS {
            return Ok(());
        }
        check(r, &format!("cuLaunchKernel(`{}`, grid {grid:?}, block {block:?}, {shared_bytes} B shared)", self.name))
    }

    /// A launch the driver itself rejects, for fault-injection checks: `cuLaunchKernel` with the
    /// given arguments but more dynamic shared memory than the device has per block, past the
    /// checks [`launch`](Self::launch) makes, so that the error comes from the driver as a real
    /// launch failure would. Nothing is enqueued (the driver refuses the configuration before
    /// anything runs) and the error is not sticky: the context stays usable.
    ///
    /// # Safety
    /// As for [`launch`](Self::launch) (the arguments are those the kernel takes), though the
    /// kernel never runs.
    #[doc(hidden)]
    pub unsafe fn launch_rejected(&self, stream: &Stream, grid: (u32, u32, u32), block: (u32, u32, u32), params: &mut [*mut c_void]) -> Result<()> {
        self.module.device.bind()?;
        let too_much = (self.module.device.info().max_shared_memory_per_block_optin as u32).saturating_add(64 * 1024);
        let params_ptr = if params.is_empty() { std::ptr::null_mut() } else { params.as_mut_ptr() };
        // SAFETY: as in `launch`, but for the shared memory size, which the driver validates
        // (and rejects) before it reads the parameters or enqueues anything.
        let r = unsafe { sys::cuLaunchKernel(self.raw, grid.0, grid.1, grid.2, block.0, block.1, block.2, too_much, stream.raw(), params_ptr, std::ptr::null_mut()) };
        if r == sys::CUresult::CUDA_SUCCESS {
            return Err(Error::Device(format!("kernel `{}`: a launch with {too_much} B of shared memory was accepted; the fault injection did not fault", self.name)));
        }
        check(r, &format!("cuLaunchKernel(`{}`, grid {grid:?}, block {block:?}, {too_much} B shared; injected fault)", self.name))
    }

    /// How many clusters of `cluster` blocks of this kernel can run at once on the device
    /// (`cuOccupancyMaxActiveClusters`): the grid of a persistent cluster kernel. `None` when
    /// the driver cannot say (no `cuLaunchKernelEx`-era API, or an error).
    pub fn max_active_clusters(&self, block: (u32, u32, u32), cluster: (u32, u32, u32), shared_bytes: u32) -> Option<u32> {
        let api = api().ok()?;
        if !api.launch_ex || self.module.device.bind().is_err() {
            return None;
        }
        // SAFETY: all-zero bytes are a valid CUlaunchAttribute (see launch_cluster).
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attr.value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x: cluster.0, y: cluster.1, z: cluster.2 };
        let config = sys::CUlaunchConfig {
            gridDimX: cluster.0,
            gridDimY: cluster.1,
            gridDimZ: cluster.2,
            blockDimX: block.0,
            blockDimY: block.1,
            blockDimZ: block.2,
            sharedMemBytes: shared_bytes,
            hStream: std::ptr::null_mut(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        let mut n: std::ffi::c_int = 0;
        // SAFETY: the symbol exists in drivers that have cuLaunchKernelEx (CUDA 12.0+, probed
        // above); `config` and `attr` live across the call, which only writes `n`.
        let r = unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, self.raw, &config) };
        (r == sys::CUresult::CUDA_SUCCESS && n > 0).then_some(n as u32)
    }

    /// As [`launch`](Self::launch), with thread-block clusters of `cluster` blocks
    /// (`cuLaunchKernelEx` with `CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`; sm_90 or newer). Each grid
    /// dimension must be a multiple of the cluster's; clusters above 8 blocks also need the
    /// kernel's non-portable cluster size attribute.
    ///
    /// # Safety
    /// As for [`launch`](Self::launch).
    pub unsafe fn launch_cluster(
        &self,
        stream: &Stream,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        cluster: (u32, u32, u32),
        shared_bytes: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        // SAFETY: the caller's contract is launch_ex's, without the dependent-launch part.
        unsafe { self.launch_ex(stream, grid, block, Some(cluster), false, shared_bytes, params) }
    }

    /// As [`launch`](Self::launch), through `cuLaunchKernelEx` (sm_90 or newer) with thread-block
    /// clusters of `cluster` blocks (see [`launch_cluster`](Self::launch_cluster)) and, with
    /// `dependent`, programmatic dependent launch
    /// (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`): the kernel may start before
    /// the previous kernel in the stream has finished, so its launch overlaps that kernel's tail.
    ///
    /// # Safety
    /// As for [`launch`](Self::launch); and with `dependent`, every thread of the kernel must
    /// execute `griddepcontrol.wait` before it touches memory that an earlier kernel in the stream
    /// reads or writes (the wait returns once those kernels have completed and their writes are
    /// visible).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_ex(
        &self,
        stream: &Stream,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        cluster: Option<(u32, u32, u32)>,
        dependent: bool,
        shared_bytes: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let api = api()?;
        self.check_launch(stream, grid, block, shared_bytes, params)?;
        let what = if cluster.is_some() { "cluster launch" } else { "dependent launch" };
        let err = |why: String| Err(Error::InvalidArgument(format!("{what} of kernel `{}`: {why}", self.name)));
        if !api.launch_ex {
            return Err(Error::Device(format!("{what} of kernel `{}`: the CUDA driver lacks cuLaunchKernelEx (CUDA 11.8+); update the driver", self.name)));
        }
        let (major, minor) = self.module.device.compute_capability();
        if major < 9 {
            return err(format!("thread-block clusters and dependent launches need sm_90 or newer; this device is sm_{major}{minor}"));
        }
        // SAFETY: all-zero bytes are a valid CUlaunchAttribute (id 0 is CU_LAUNCH_ATTRIBUTE_IGNORE,
        // the value is a union of plain integers and pointers).
        let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
        let mut n = 0usize;
        if let Some(cluster) = cluster {
            if cluster.0 == 0 || cluster.1 == 0 || cluster.2 == 0 {
                return err(format!("cluster {cluster:?} must have no zero dimension"));
            }
            #[allow(clippy::manual_is_multiple_of)] // is_multiple_of needs Rust 1.87; the MSRV is 1.80
            let divisible = grid.0 % cluster.0 == 0 && grid.1 % cluster.1 == 0 && grid.2 % cluster.2 == 0;
            if !divisible {
                return err(format!("grid {grid:?} is not a multiple of cluster {cluster:?}"));
            }
            attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            attrs[n].value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x: cluster.0, y: cluster.1, z: cluster.2 };
            n += 1;
        }
        if dependent {
            attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attrs[n].value.programmaticStreamSerializationAllowed = 1;
            n += 1;
        }
        self.module.device.bind()?;
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block.0,
            blockDimY: block.1,
            blockDimZ: block.2,
            sharedMemBytes: shared_bytes,
            hStream: stream.raw(),
            attrs: attrs.as_mut_ptr(),
            numAttrs: n as u32,
        };
        let params_ptr = if params.is_empty() { std::ptr::null_mut() } else { params.as_mut_ptr() };
        // SAFETY: cuLaunchKernelEx was found by the probe; `config` and `attrs` live across the
        // call; the function and stream belong to the current context; the parameters follow the
        // caller's contract, as for `launch`, and so does a dependent kernel's wait.
        let r = unsafe { sys::cuLaunchKernelEx(&config, self.raw, params_ptr, std::ptr::null_mut()) };
        if r == sys::CUresult::CUDA_SUCCESS {
            return Ok(());
        }
        check(r, &format!("cuLaunchKernelEx(`{}`, grid {grid:?}, block {block:?}, cluster {cluster:?}, dependent {dependent}, {shared_bytes} B shared)", self.name))
    }
}

/// The driver calls stream capture and CUDA graphs need (CUDA 11.4+ drivers have them all).
const GRAPH_SYMBOLS: &[&str] = &["cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuGraphInstantiateWithFlags", "cuGraphLaunch", "cuGraphExecDestroy", "cuGraphDestroy"];

/// Whether the driver has what [`CapturedGraph`] calls.
pub fn graph_capture_available() -> bool {
    GRAPH_SYMBOLS.iter().all(|s| super::runtime::has_symbol(s))
}

/// Ok when `stream` is of `device`, else an error naming `what` (e.g. "the event") and both
/// devices.
fn same_device(what: &str, device: &CudaDevice, stream: &Stream) -> Result<()> {
    if stream.device().ordinal() == device.ordinal() {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!("{what} belongs to device {}, the stream to device {}", device.ordinal(), stream.device().ordinal())))
}

/// A CUDA graph recorded by stream capture (`cuStreamBeginCapture` in global mode, the work
/// enqueued on the stream, `cuStreamEndCapture`) and instantiated (`cuGraphInstantiateWithFlags`),
/// to be replayed with [`launch`](Self::launch). The graph and its executable are destroyed on
/// drop. A plan's `execute` enqueues only launches (no allocation, no synchronization), so it
/// can be captured: the replay runs the same kernels on the same buffers, with the by-value
/// scalars' values of the capture.
pub struct CapturedGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    device: Arc<CudaDevice>,
}

// SAFETY: CUgraph and CUgraphExec are handles the driver lets any thread use; both are destroyed
// exactly once, in Drop, and launches are serialized by the driver.
unsafe impl Send for CapturedGraph {}
// SAFETY: as above; &self methods only call thread-safe driver functions.
unsafe impl Sync for CapturedGraph {}

impl std::fmt::Debug for CapturedGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapturedGraph").field("graph", &self.graph).field("exec", &self.exec).field("device", &self.device.ordinal()).finish()
    }
}

impl CapturedGraph {
    /// Capture the work `record` enqueues on `stream` into a graph and instantiate it. The
    /// stream's capture always ends, whether `record` succeeds or not, so the stream is usable
    /// afterwards; an error of `record` is returned first (it is what broke the capture).
    pub fn capture(stream: &Stream, record: impl FnOnce() -> Result<()>) -> Result<CapturedGraph> {
        api()?;
        if !graph_capture_available() {
            return Err(Error::Device(format!("stream capture: the CUDA driver lacks one of {}; update the driver", GRAPH_SYMBOLS.join(", "))));
        }
        let device = stream.device().clone();
        device.bind()?;
        // SAFETY: the symbols are present (checked); the stream is live (a Stream keeps that
        // promise) and of the current context.
        check(unsafe { sys::cuStreamBeginCapture_v2(stream.raw(), sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL) }, "cuStreamBeginCapture")?;
        let recorded = record();
        let _ = device.bind();
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: the stream is capturing (begun above); `graph` is a valid out pointer.
        let ended = check(unsafe { sys::cuStreamEndCapture(stream.raw(), &mut graph) }, "cuStreamEndCapture");
        let destroy = |g: sys::CUgraph| {
            if !g.is_null() {
                // SAFETY: a graph cuStreamEndCapture returned, destroyed once, here.
                unsafe { sys::cuGraphDestroy(g) };
            }
        };
        if let Err(e) = recorded.and(ended) {
            destroy(graph);
            return Err(Error::Device(format!("stream capture: {e}")));
        }
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: `graph` is the captured graph; `exec` is a valid out pointer.
        if let Err(e) = check(unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }, "cuGraphInstantiateWithFlags") {
            destroy(graph);
            return Err(e);
        }
        Ok(CapturedGraph { graph, exec, device })
    }

    /// Enqueue one replay of the graph on `stream` (of the same device).
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        same_device("CapturedGraph::launch: the graph", &self.device, stream)?;
        self.device.bind()?;
        // SAFETY: a live executable graph of this context and a live stream of it; the buffers
        // it touches are the caller's to keep alive (as for every launch).
        check(unsafe { sys::cuGraphLaunch(self.exec, stream.raw()) }, "cuGraphLaunch")
    }
}

impl Drop for CapturedGraph {
    fn drop(&mut self) {
        // SAFETY: created in `capture` and destroyed exactly once; the driver defers freeing an
        // executable graph whose launches are still pending.
        unsafe {
            let _ = self.device.bind();
            sys::cuGraphExecDestroy(self.exec);
            sys::cuGraphDestroy(self.graph);
        }
    }
}

/// A CUDA event: a marker in a stream, for timing and for waits that can time out.
pub struct Event {
    raw: sys::CUevent,
    device: Arc<CudaDevice>,
    timing: bool,
}

// SAFETY: a CUevent may be recorded, queried and waited on from any thread; the driver
// serializes access; it is destroyed exactly once, in Drop.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event").field("raw", &self.raw).field("timing", &self.timing).field("device", &self.device.ordinal()).finish()
    }
}

impl Event {
    /// An event that records timestamps (for [`elapsed_ms`](Self::elapsed_ms)).
    pub fn new(device: &Arc<CudaDevice>) -> Result<Event> {
        Event::create(device, true)
    }

    /// An event without timing (cheaper; for waiting only).
    pub fn without_timing(device: &Arc<CudaDevice>) -> Result<Event> {
        Event::create(device, false)
    }

    fn create(device: &Arc<CudaDevice>, timing: bool) -> Result<Event> {
        api()?;
        device.bind()?;
        let flags = if timing { sys::CUevent_flags::CU_EVENT_DEFAULT as u32 } else { sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32 };
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: the symbol was probed; the context is current; `raw` is a valid out pointer.
        check(unsafe { sys::cuEventCreate(&mut raw, flags) }, "cuEventCreate")?;
        Ok(Event { raw, device: device.clone(), timing })
    }

    pub fn raw(&self) -> sys::CUevent {
        self.raw
    }

    /// Mark the current end of `stream`'s work.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        same_device("Event::record: the event", &self.device, stream)?;
        self.device.bind()?;
        // SAFETY: a live event and a stream of the same (current) context.
        check(unsafe { sys::cuEventRecord(self.raw, stream.raw()) }, "cuEventRecord")
    }

    /// True when the work before the last record has finished; an error if that work failed.
    pub fn query(&self) -> Result<bool> {
        self.device.bind()?;
        // SAFETY: a live event of the current context.
        let r = unsafe { sys::cuEventQuery(self.raw) };
        match r {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            _ => check(r, "cuEventQuery").map(|()| false),
        }
    }

    /// Block until the recorded work has finished (no time limit; see
    /// [`wait_timeout`](Self::wait_timeout)).
    pub fn synchronize(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: a live event of the current context.
        check(unsafe { sys::cuEventSynchronize(self.raw) }, "cuEventSynchronize")
    }

    /// Wait until the recorded work has finished, or fail after `timeout`. Polls with sleeps that
    /// grow from 20 µs to 1 ms, so it does not spin a core; a kernel that never ends gives an
    /// error instead of a hang (it keeps running on the device: the caller should exit).
    pub fn wait_timeout(&self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        let mut nap = Duration::from_micros(20);
        loop {
            if self.query()? {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(Error::Device(format!(
                    "timed out after {:.1} s waiting for device {}: a kernel is still running (hung?); its work cannot be cancelled, exit the process",
                    waited.as_secs_f64(),
                    self.device.ordinal()
                )));
            }
            std::thread::sleep(nap.min(timeout - waited));
            nap = (nap * 2).min(Duration::from_millis(1));
        }
    }

    /// Milliseconds from `self` (recorded first) to `end`; both must have completed (wait first)
    /// and have timing enabled. Resolution is about half a microsecond.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        if !self.timing || !end.timing {
            return Err(Error::InvalidArgument("Event::elapsed_ms: both events need timing (create them with Event::new)".into()));
        }
        if self.device.ordinal() != end.device.ordinal() {
            return Err(Error::InvalidArgument("Event::elapsed_ms: the events belong to different devices".into()));
        }
        let api = api()?;
        self.device.bind()?;
        let mut ms = 0f32;
        // SAFETY: the function pointer came from the probe with the matching signature; both
        // events are live and of the current context; `ms` is a valid out pointer.
        check(unsafe { (api.elapsed)(&mut ms, self.raw, end.raw) }, "cuEventElapsedTime")?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by cuEventCreate in this context and destroyed exactly once; the driver
        // defers the destruction if the event is still pending.
        unsafe {
            let _ = self.device.bind();
            sys::cuEventDestroy_v2(self.raw);
        }
    }
}

/// Wait for all work enqueued on `stream` so far, failing after `timeout` rather than hanging,
/// and report any error the work raised (the stream is synchronized once the wait succeeds).
pub fn synchronize_timeout(stream: &Stream, timeout: Duration) -> Result<()> {
    let event = Event::without_timing(stream.device())?;
    event.record(stream)?;
    event.wait_timeout(timeout)?;
    stream.synchronize()
}

/// The driver's name for a CUDA error code, e.g. "CUDA_ERROR_ILLEGAL_ADDRESS" (for reports).
pub fn error_name(code: sys::CUresult) -> String {
    let mut name: *const std::ffi::c_char = std::ptr::null();
    if driver().is_err() {
        return format!("{code:?}");
    }
    // SAFETY: the driver probe passed, which checked cuGetErrorName; it writes a pointer to a
    // static string or leaves it null.
    let ok = unsafe { sys::cuGetErrorName(code, &mut name) } == sys::CUresult::CUDA_SUCCESS && !name.is_null();
    if ok {
        // SAFETY: a NUL-terminated static string owned by the driver.
        unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
    } else {
        format!("{code:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_elf(len: usize, shoff: u64, shnum: u16) -> Vec<u8> {
        let mut v = vec![0u8; len];
        v[..4].copy_from_slice(b"\x7fELF");
        v[4] = 2;
        v[5] = 1;
        v[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        v[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes());
        v[0x3C..0x3E].copy_from_slice(&shnum.to_le_bytes());
        v
    }

    #[test]
    fn launch_config_matches_the_c_abi() {
        // cuda.h: CUlaunchAttribute is {id (4 bytes), pad[4], 64-byte value union}; CUlaunchConfig
        // is 7 unsigned ints, then the stream, the attribute pointer and their count.
        assert_eq!(std::mem::size_of::<sys::CUlaunchAttribute>(), 72);
        assert_eq!(std::mem::size_of::<sys::CUlaunchAttributeValue>(), 64);
        assert_eq!(std::mem::size_of::<sys::CUlaunchConfig>(), 56);
        assert_eq!(std::mem::offset_of!(sys::CUlaunchConfig, hStream), 32);
        assert_eq!(std::mem::offset_of!(sys::CUlaunchConfig, numAttrs), 48);
        assert_eq!(std::mem::offset_of!(sys::CUlaunchAttribute, value), 8);
        assert_eq!(sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION as u32, 4);
    }

    #[test]
    fn cubin_sanity_check() {
        assert!(check_cubin(&fake_elf(64 + 64 * 3, 64, 3)).is_ok());
        assert!(check_cubin(&fake_elf(64 + 64 * 3 - 1, 64, 3)).is_err(), "truncated section table accepted");
        assert!(check_cubin(&fake_elf(128, u64::MAX - 10, 3)).is_err(), "overflowing offset accepted");
        assert!(check_cubin(b"// PTX text, not a cubin").is_err());
        let mut be = fake_elf(256, 64, 1);
        be[5] = 2;
        assert!(check_cubin(&be).is_err());
    }
}
