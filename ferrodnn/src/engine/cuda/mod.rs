//! The CUDA runtime under the GPU engines: the device ([`CudaDevice`], [`Stream`],
//! [`DeviceBuffer`]), runtime compilation with NVRTC ([`compile_cubin`]), the kernel cache
//! ([`KernelCache`]), and loading and launching kernels ([`Module`], [`Function`], [`Event`]).
//!
//! Nothing here needs CUDA at build time: cudarc loads `libcuda` and `libnvrtc` with `dlopen`
//! on first use, after we have checked they exist, so a machine without them gets an
//! [`Error::Device`](crate::Error::Device) that says what to install, never a panic. NVRTC needs
//! no GPU, so kernels compile (and their tests run) on any machine with `libnvrtc`.
//!
//! ```
//! use ferrodnn::engine::cuda::{self, CompileOptions, CudaDevice};
//! if cuda::gpu_available() {
//!     let dev = CudaDevice::open(0).unwrap();
//!     assert!(dev.compute_capability() >= (8, 0));
//! } else {
//!     assert!(CudaDevice::open(0).is_err()); // says why, e.g. "no GPU: ..."
//! }
//! if cuda::nvrtc_available() {
//!     let src = r#"extern "C" __global__ void fill(float* y, float v) { y[threadIdx.x] = v; }"#;
//!     let cubin = cuda::compile_cubin(src, "fill", &CompileOptions::new("sm_80")).unwrap();
//!     assert_eq!(&cubin[..4], b"\x7fELF");
//! }
//! ```
//!
//! Environment: `FERRODNN_NVRTC_LIB` (the libnvrtc file to load), `FERRODNN_CUDA_INCLUDE` (a
//! folder with `cuda_fp16.h`), `FERRODNN_CACHE_DIR` and `FERRODNN_KERNEL_CACHE=0` (the kernel
//! cache's folder, or no disk cache).

pub mod attention;
pub mod cache;
pub mod conv;
pub mod engine;
pub mod explain;
pub mod fallback;
pub mod fused;
pub mod gemm;
pub mod kernel;
pub mod module;
pub mod nvrtc;
pub mod planner;
pub mod pointwise;
pub mod rnn;
pub mod runtime;
pub mod tma;

pub use cache::{CacheStats, KernelCache, KernelKey};
pub use engine::{candidate_knobs, inject_launch_failure, kernel_sources, plan_launches, CudaEngine, SharedStream};
pub use explain::{explain, Explanation};
pub use kernel::{Options, Target};
pub use module::{graph_capture_available, synchronize_timeout, CapturedGraph, Event, Function, FunctionAttributes, Module};
pub use nvrtc::{
    compile_cached, compile_cubin, compile_cubin_logged, compile_ptx, compile_with_ptx, cuda_include_dir, nvrtc, nvrtc_available, nvrtc_version, ptxas_perf_notes, CompileOptions,
    HeaderSearch, NvrtcInfo, WGMMA_SERIALIZED,
};
pub use runtime::{device_count, driver_version, CudaDevice, DeviceBuffer, DeviceInfo, ForeignContextStream, PointerLocation, Stream, MIN_COMPUTE_CAPABILITY};

/// True when a CUDA driver is installed and sees at least one GPU ferrodnn supports (sm_80 or
/// newer). Never panics; [`CudaDevice::open`] says why when this is false.
pub fn gpu_available() -> bool {
    runtime::any_supported_device()
}
