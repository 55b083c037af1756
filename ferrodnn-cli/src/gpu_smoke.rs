//! `ferrodnn gpu-check-runtime`: a smoke check of the CUDA runtime on a real GPU. It prints one
//! JSON object (device, driver, NVRTC, and a list of checks, each {"name", "ok", "detail", "ms"})
//! and exits non-zero if any check failed. Without a GPU it says so and exits 0 with
//! {"gpu": false}. Every wait on the device has a time limit: a hung kernel ends the run with
//! the report so far and exit code 2, never a hang.
//!
//! ferrodnn's tests include this file (`#[path]`) to compile the same kernels without a GPU.

use ferrodnn::engine::cuda::{self, CompileOptions, CudaDevice, DeviceBuffer, Event, Function, KernelCache, Module, Stream};
use ferrodnn::testing::SplitMix64;
use ferrodnn::DataType;
use serde_json::{json, Value};
use std::ffi::c_void;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// y = a * x + b over n elements of f16 and bf16, with a grid-stride loop.
pub const AXPB_SOURCE: &str = r#"
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void axpb_f16(const __half* __restrict__ x, __half* __restrict__ y, float a, float b, unsigned long long n) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x)
        y[i] = __float2half(a * __half2float(x[i]) + b);
}
extern "C" __global__ void axpb_bf16(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y, float a, float b, unsigned long long n) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16(a * __bfloat162float(x[i]) + b);
}
"#;

/// One warp computes D (16x8, f32, row-major) = A (16x16, f16, row-major) * B (16x8, f16,
/// row-major) with one `mma.sync.m16n8k16`; the fragments follow the PTX ISA's layout tables
/// (groupID = lane / 4, t = lane % 4).
pub const MMA_SOURCE: &str = r#"
#include <cuda_fp16.h>
__device__ __forceinline__ unsigned pack_half2(__half lo, __half hi) {
    return (unsigned)__half_as_ushort(lo) | ((unsigned)__half_as_ushort(hi) << 16);
}
extern "C" __global__ void mma_16x8x16(const __half* __restrict__ A, const __half* __restrict__ B, float* __restrict__ D) {
    const unsigned lane = threadIdx.x & 31u, g = lane >> 2, t = lane & 3u;
    unsigned a0 = pack_half2(A[g * 16 + 2 * t],           A[g * 16 + 2 * t + 1]);
    unsigned a1 = pack_half2(A[(g + 8) * 16 + 2 * t],     A[(g + 8) * 16 + 2 * t + 1]);
    unsigned a2 = pack_half2(A[g * 16 + 2 * t + 8],       A[g * 16 + 2 * t + 9]);
    unsigned a3 = pack_half2(A[(g + 8) * 16 + 2 * t + 8], A[(g + 8) * 16 + 2 * t + 9]);
    unsigned b0 = pack_half2(B[(2 * t) * 8 + g],     B[(2 * t + 1) * 8 + g]);
    unsigned b1 = pack_half2(B[(2 * t + 8) * 8 + g], B[(2 * t + 9) * 8 + g]);
    float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    D[g * 8 + 2 * t] = d0;       D[g * 8 + 2 * t + 1] = d1;
    D[(g + 8) * 8 + 2 * t] = d2; D[(g + 8) * 8 + 2 * t + 1] = d3;
}
"#;

/// Each block writes its rank in its cluster and the cluster's size (sm_90+).
pub const CLUSTER_SOURCE: &str = r#"
extern "C" __global__ void cluster_ids(unsigned* out) {
    unsigned rank, size;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(size));
    if (threadIdx.x == 0) { out[2 * blockIdx.x] = rank; out[2 * blockIdx.x + 1] = size; }
}
"#;

/// The smoke kernels: (program name, source, the oldest compute capability major it needs).
#[allow(dead_code)] // used by ferrodnn's tests, which include this file
pub const KERNELS: [(&str, &str, u32); 3] = [("axpb", AXPB_SOURCE, 8), ("mma_16x8x16", MMA_SOURCE, 8), ("cluster_ids", CLUSTER_SOURCE, 9)];

/// Compile every smoke kernel that `arch` supports (no GPU needed): (name, cubin bytes) each.
#[allow(dead_code)] // used by ferrodnn's tests, which include this file
pub fn compile_all(arch: &str) -> Result<Vec<(&'static str, usize)>, String> {
    let major: u32 = arch.trim_start_matches("sm_").trim_end_matches(['a', 'f']).parse::<u32>().map_err(|e| format!("bad arch {arch}: {e}"))? / 10;
    let mut out = Vec::new();
    for (name, src, min_major) in KERNELS {
        if major >= min_major {
            let cubin = cuda::compile_cubin(src, name, &CompileOptions::new(arch)).map_err(|e| format!("{name} for {arch}: {e}"))?;
            out.push((name, cubin.len()));
        }
    }
    Ok(out)
}

/// How long any one wait on the device may take before the run is declared hung.
const WAIT: Duration = Duration::from_secs(60);
const N: usize = 1_000_003;
const A: f32 = 1.5;
const B: f32 = -0.25;

/// The checks so far, and what to do when one hangs.
struct Recorder {
    header: serde_json::Map<String, Value>,
    checks: Vec<Value>,
    out: Option<PathBuf>,
    /// Exit the process (with the report) when a wait times out; false in tests, which fail.
    exit_on_hang: bool,
}

impl Recorder {
    fn report(&self) -> Value {
        let failed: Vec<Value> = self.checks.iter().filter(|c| c["ok"] != Value::Bool(true)).map(|c| c["name"].clone()).collect();
        let mut v = self.header.clone();
        v.insert("checks".into(), Value::Array(self.checks.clone()));
        v.insert("ok".into(), Value::Bool(failed.is_empty()));
        v.insert("failed".into(), Value::Array(failed));
        Value::Object(v)
    }

    /// Run one check, catching panics; its closure returns (detail, extra fields, value).
    fn run<T>(&mut self, name: &str, f: impl FnOnce() -> Result<(String, Value, T), String>) -> Option<T> {
        let start = Instant::now();
        let result = std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
            let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
            Err(format!("panicked: {msg}"))
        });
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let (ok, detail, extra, value) = match result {
            Ok((detail, extra, value)) => (true, detail, extra, Some(value)),
            Err(e) => (false, e, Value::Null, None),
        };
        eprintln!("[{}] {name} ({ms:.3} ms): {detail}", if ok { " ok " } else { "FAIL" });
        let mut c = json!({ "name": name, "ok": ok, "detail": detail, "ms": ms });
        if let (Value::Object(extra), Value::Object(c)) = (extra, &mut c) {
            c.extend(extra);
        }
        self.checks.push(c);
        if !ok && detail.contains("timed out after") && self.exit_on_hang {
            let mut report = self.report();
            report["aborted"] = Value::String(format!("check {name} hung; the remaining checks did not run"));
            emit(&report, self.out.as_deref());
            eprintln!("gpu-check-runtime: aborted: a kernel hung in check {name}");
            // Exit without running destructors: freeing memory or unloading a module that a hung
            // kernel still uses could block.
            std::process::exit(2);
        }
        value
    }

    fn skip(&mut self, name: &str, why: &str, ok: bool) {
        eprintln!("[{}] {name}: {why}", if ok { "skip" } else { "FAIL" });
        self.checks.push(json!({ "name": name, "ok": ok, "detail": why, "ms": 0.0 }));
    }
}

/// Print the report and write it to `out`.
fn emit(report: &Value, out: Option<&Path>) {
    let text = serde_json::to_string_pretty(report).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    println!("{text}");
    if let Some(path) = out {
        if let Err(e) = std::fs::write(path, format!("{text}\n")) {
            eprintln!("gpu-check-runtime: cannot write {}: {e}", path.display());
        }
    }
}

fn nvrtc_json() -> Value {
    let headers = cuda::cuda_include_dir();
    let header_dir = headers.found.as_ref().map(|p| Value::String(p.display().to_string())).unwrap_or(Value::Null);
    match cuda::nvrtc() {
        Ok(info) => json!({ "available": true, "version": info.version_string(), "library": info.source, "header_dir": header_dir }),
        Err(e) => json!({ "available": false, "error": e.to_string(), "header_dir": header_dir, "headers_searched": headers.searched_list() }),
    }
}

/// The CLI entry point: run the checks, print and write the report; the process exit code.
pub fn main(device: usize, out: Option<&Path>) -> std::process::ExitCode {
    if !cuda::gpu_available() {
        let reason = match CudaDevice::open(device) {
            Err(e) => e.to_string(),
            Ok(_) => "no supported GPU (sm_80 or newer) found".to_string(),
        };
        eprintln!("gpu-check-runtime: {reason}; nothing to check");
        emit(&json!({ "gpu": false, "reason": reason, "nvrtc": nvrtc_json() }), out);
        return std::process::ExitCode::SUCCESS;
    }
    let report = run_checks(device, out, true);
    if report["ok"] == Value::Bool(true) {
        eprintln!("gpu-check-runtime: all {} checks passed", report["checks"].as_array().map_or(0, |a| a.len()));
        std::process::ExitCode::SUCCESS
    } else {
        eprintln!("gpu-check-runtime: FAILED: {}", report["failed"]);
        std::process::ExitCode::FAILURE
    }
}

/// Helpers the checks share.
fn launch_params(ptrs: &mut [u64], a: &mut f32, b: &mut f32, n: &mut u64) -> Vec<*mut c_void> {
    let mut p: Vec<*mut c_void> = ptrs.iter_mut().map(|x| x as *mut u64 as *mut c_void).collect();
    p.push(a as *mut f32 as *mut c_void);
    p.push(b as *mut f32 as *mut c_void);
    p.push(n as *mut u64 as *mut c_void);
    p
}

/// Enqueue y = A * x + B on `stream` (any shared memory size the kernel allows).
fn launch_axpb(f: &Function, stream: &Stream, x: &DeviceBuffer, y: &DeviceBuffer, n: usize, grid: u32, shared: u32) -> Result<(), String> {
    let (mut a, mut b, mut nn) = (A, B, n as u64);
    let mut ptrs = [x.device_ptr(), y.device_ptr()];
    let mut params = launch_params(&mut ptrs, &mut a, &mut b, &mut nn);
    // SAFETY: the parameters match axpb_*(const T* x, T* y, float a, float b, unsigned long long
    // n); x and y hold n elements each and are kept alive, and untouched by the host, until the
    // caller synchronizes the stream.
    unsafe { f.launch(stream, (grid, 1, 1), (256, 1, 1), shared, &mut params) }.map_err(|e| e.to_string())
}

/// Compare a device result of y = A * x + B with the CPU's (f32 fma, rounded to the type):
/// within 1 ulp, or 1e-3 relative for f16; any NaN or infinity fails.
fn compare_axpb(dtype: DataType, x: &[f64], got: &[u8]) -> Result<String, String> {
    let reference: Vec<f64> = x.iter().map(|&v| A.mul_add(v as f32, B) as f64).collect();
    let want = dtype.encode(&reference);
    if got.len() != want.len() {
        return Err(format!("got {} bytes, expected {}", got.len(), want.len()));
    }
    let got_values = dtype.decode(got);
    let want_values = dtype.decode(&want);
    let ordered = |lo: u8, hi: u8| {
        let bits = u16::from_le_bytes([lo, hi]);
        if bits & 0x8000 != 0 {
            -((bits & 0x7fff) as i32)
        } else {
            bits as i32
        }
    };
    let (mut exact, mut max_ulp, mut bad, mut first_bad) = (0usize, 0i32, 0usize, None);
    for i in 0..x.len() {
        let (g, w) = (got_values[i], want_values[i]);
        if !g.is_finite() {
            return Err(format!("element {i} is {g} (x = {}, expected {w}): the kernel did not write it, or computed garbage", x[i]));
        }
        let ulp = (ordered(got[2 * i], got[2 * i + 1]) - ordered(want[2 * i], want[2 * i + 1])).abs();
        let rel = (g - w).abs() / w.abs().max(1e-30);
        max_ulp = max_ulp.max(ulp);
        if ulp == 0 {
            exact += 1;
        } else if !(ulp <= 1 || (dtype == DataType::F16 && rel <= 1e-3)) {
            bad += 1;
            first_bad.get_or_insert((i, g, w));
        }
    }
    let summary = format!("{} of {} elements exact, max {max_ulp} ulp", exact, x.len());
    match first_bad {
        None => Ok(summary),
        Some((i, g, w)) => Err(format!("{bad} elements off by more than 1 ulp; first: element {i}: got {g}, expected {w} (x = {}); {summary}", x[i])),
    }
}

fn random_input(dtype: DataType, n: usize, seed: u64) -> (Vec<f64>, Vec<u8>) {
    let mut rng = SplitMix64::new(seed);
    let raw: Vec<f64> = (0..n).map(|_| rng.uniform(-4.0, 4.0)).collect();
    let bytes = dtype.encode(&raw);
    (dtype.decode(&bytes), bytes) // the values the device sees
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Poison `y`, run `launch`, wait (with a time limit), download and compare with the CPU.
fn poisoned_run(stream: &Stream, y: &mut DeviceBuffer, dtype: DataType, x: &[f64], launch: impl FnOnce(&DeviceBuffer) -> Result<(), String>) -> Result<String, String> {
    y.fill_async(0xff, stream).map_err(err)?;
    launch(y)?;
    cuda::synchronize_timeout(stream, WAIT).map_err(err)?;
    let got = y.to_host().map_err(err)?;
    compare_axpb(dtype, x, &got)
}

/// Run every check on device `device`; the report (also printed, and written to `out`).
pub fn run_checks(device: usize, out: Option<&Path>, exit_on_hang: bool) -> Value {
    let mut rec = Recorder { header: serde_json::Map::new(), checks: Vec::new(), out: out.map(Path::to_path_buf), exit_on_hang };
    rec.header.insert("gpu".into(), Value::Bool(true));
    rec.header.insert("nvrtc".into(), nvrtc_json());
    rec.header.insert("driver_version".into(), cuda::driver_version().map(|(a, b)| Value::String(format!("{a}.{b}"))).unwrap_or(Value::Null));

    let Some(dev) = rec.run("open_device", || {
        let dev = CudaDevice::open(device).map_err(err)?;
        Ok((format!("{} ({})", dev.name(), dev.arch()), Value::Null, dev))
    }) else {
        return finish(rec);
    };
    let (free, total) = dev.memory_info().unwrap_or((0, dev.total_memory()));
    let info = dev.info();
    let (major, minor) = dev.compute_capability();
    let arch = dev.arch();
    rec.header.insert(
        "device".into(),
        json!({
            "ordinal": dev.ordinal(), "name": dev.name(), "compute_capability": format!("{major}.{minor}"), "arch": arch,
            "sm_count": dev.sm_count(), "total_memory_bytes": total, "free_memory_bytes": free, "l2_cache_bytes": info.l2_cache_bytes,
            "max_shared_memory_per_block_optin": info.max_shared_memory_per_block_optin,
        }),
    );
    eprintln!("device {}: {} sm_{major}{minor} ({arch}), {} SMs, {:.1} GiB", dev.ordinal(), dev.name(), dev.sm_count(), total as f64 / (1u64 << 30) as f64);

    // (a) A cold NVRTC compile for this device.
    let opts = CompileOptions::new(arch.clone());
    let Some(cubin) = rec.run("nvrtc_compile_cold", || {
        let cubin = cuda::compile_cubin(AXPB_SOURCE, "axpb", &opts).map_err(err)?;
        Ok((format!("{} bytes of cubin for {arch} (cuda_fp16.h and cuda_bf16.h)", cubin.len()), Value::Null, cubin))
    }) else {
        rec.skip("kernel_cache", "not run: the compile failed", false);
        return finish(rec);
    };

    // (b) The kernel cache: a compile, a memory hit, then a disk hit from a fresh cache.
    rec.run("kernel_cache", || {
        let version = cuda::nvrtc().map_err(err)?.version_string();
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!("ferrodnn-gpu-check-{}-{nanos}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let result = (|| {
            let toolchain = format!("nvrtc {version}");
            let cache = KernelCache::with_dir(Some(dir.clone()), &toolchain);
            let t = Instant::now();
            let first = cuda::compile_cached(&cache, AXPB_SOURCE, "axpb", &opts).map_err(err)?;
            let t_compile = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            let second = cuda::compile_cached(&cache, AXPB_SOURCE, "axpb", &opts).map_err(err)?;
            let t_memory = t.elapsed().as_secs_f64() * 1e3;
            let s = cache.stats();
            if s.compiles != 1 || s.memory_hits != 1 {
                return Err(format!("expected 1 compile then 1 memory hit, got {s:?}"));
            }
            let fresh = KernelCache::with_dir(Some(dir.clone()), &toolchain);
            let t = Instant::now();
            let third = cuda::compile_cached(&fresh, AXPB_SOURCE, "axpb", &opts).map_err(err)?;
            let t_disk = t.elapsed().as_secs_f64() * 1e3;
            let s2 = fresh.stats();
            if s2.disk_hits != 1 || s2.compiles != 0 {
                return Err(format!("expected a disk hit from a fresh cache on {}, got {s2:?}", dir.display()));
            }
            if first != second || first != third {
                return Err("the cached cubins differ".into());
            }
            let same_as_cold = *first == cubin;
            Ok((
                format!("compile {t_compile:.1} ms, memory hit {t_memory:.4} ms, disk hit {t_disk:.3} ms; identical to the cold compile: {same_as_cold}"),
                json!({ "times_ms": { "compile": t_compile, "memory_hit": t_memory, "disk_hit": t_disk } }),
                (),
            ))
        })();
        let _ = std::fs::remove_dir_all(&dir);
        result
    });

    // (c) Load, launch, compare every element with the CPU.
    let Some(module) = rec.run("module_load", || {
        let module = Module::load(&dev, &cubin).map_err(err)?;
        let mut attrs = serde_json::Map::new();
        for name in ["axpb_f16", "axpb_bf16"] {
            let f = module.function(name).map_err(err)?;
            let a = f.attributes().map_err(err)?;
            attrs.insert(
                name.into(),
                json!({ "registers": a.num_regs, "static_shared_bytes": a.static_shared_bytes, "local_bytes": a.local_bytes, "max_threads_per_block": a.max_threads_per_block, "max_dynamic_shared_bytes": a.max_dynamic_shared_bytes, "ptx_version": a.ptx_version, "binary_version": a.binary_version }),
            );
        }
        let detail = format!("loaded {} bytes; axpb_f16: {}", cubin.len(), attrs["axpb_f16"]);
        Ok((detail, json!({ "functions": attrs }), module))
    }) else {
        return finish(rec);
    };
    let grid = (N.div_ceil(256) as u32).min(dev.sm_count().max(1) * 4);
    let setup = rec.run("upload_and_poison", || {
        let stream = dev.new_stream().map_err(err)?;
        let (x16, x16_bytes) = random_input(DataType::F16, N, 0x5eed);
        let (xb16, xb16_bytes) = random_input(DataType::Bf16, N, 0xb16);
        let x16_dev = dev.upload(&x16_bytes).map_err(err)?;
        let xb16_dev = dev.upload(&xb16_bytes).map_err(err)?;
        // The uploads ran on the legacy default stream, which does not order work on our
        // non-blocking streams: wait for them before any kernel reads the inputs.
        dev.synchronize().map_err(err)?;
        let mut y = dev.alloc(N * 2).map_err(err)?;
        y.fill_async(0xff, &stream).map_err(err)?;
        cuda::synchronize_timeout(&stream, WAIT).map_err(err)?;
        let poisoned = y.to_host().map_err(err)?;
        if let Some(i) = poisoned.iter().position(|&b| b != 0xff) {
            return Err(format!("the 0xff poison did not reach byte {i} of the output"));
        }
        Ok((format!("{N} f16 and {N} bf16 inputs uploaded, output poisoned with 0xff"), Value::Null, (stream, x16, x16_dev, xb16, xb16_dev, y)))
    });
    let Some((stream, x16, x16_dev, xb16, xb16_dev, mut y)) = setup else {
        return finish(rec);
    };
    let f16_fn = module.function("axpb_f16");
    let bf16_fn = module.function("axpb_bf16");
    let (Ok(f16_fn), Ok(bf16_fn)) = (f16_fn, bf16_fn) else {
        rec.skip("launch_f16", "not run: cuModuleGetFunction failed", false);
        return finish(rec);
    };
    rec.run("launch_f16", || {
        let t = Instant::now();
        let detail = poisoned_run(&stream, &mut y, DataType::F16, &x16, |y| launch_axpb(&f16_fn, &stream, &x16_dev, y, N, grid, 0))?;
        Ok((format!("y = {A} * x + {B} over {N} f16 (grid {grid} x 256, grid-stride), {:.3} ms with checks: {detail}", t.elapsed().as_secs_f64() * 1e3), Value::Null, ()))
    });
    rec.run("launch_bf16", || {
        let detail = poisoned_run(&stream, &mut y, DataType::Bf16, &xb16, |y| launch_axpb(&bf16_fn, &stream, &xb16_dev, y, N, grid, 0))?;
        Ok((format!("y = {A} * x + {B} over {N} bf16: {detail}"), Value::Null, ()))
    });

    // (d) A stream we did not create, wrapped.
    rec.run("wrap_stream", || {
        let owner = dev.new_stream().map_err(err)?;
        let result = {
            // SAFETY: `owner` is a live stream of this device's primary context and outlives the
            // wrapper, which is dropped at the end of this block.
            let wrapped = unsafe { dev.wrap_stream(owner.raw()) };
            if wrapped.is_owned() {
                return Err("a wrapped stream claims ownership".into());
            }
            poisoned_run(&wrapped, &mut y, DataType::F16, &x16, |y| launch_axpb(&f16_fn, &wrapped, &x16_dev, y, N, grid, 0))
        };
        owner.synchronize().map_err(err)?;
        Ok((format!("launched on a wrapped raw stream {:?}: {}", owner.raw(), result?), Value::Null, ()))
    });

    // (e) 100 launches timed with events.
    rec.run("event_timing_100_launches", || {
        let (start, end) = (Event::new(&dev).map_err(err)?, Event::new(&dev).map_err(err)?);
        let detail = poisoned_run(&stream, &mut y, DataType::F16, &x16, |y| {
            launch_axpb(&f16_fn, &stream, &x16_dev, y, N, grid, 0)?; // warm-up
            start.record(&stream).map_err(err)?;
            for _ in 0..100 {
                launch_axpb(&f16_fn, &stream, &x16_dev, y, N, grid, 0)?;
            }
            end.record(&stream).map_err(err)
        })?;
        end.wait_timeout(WAIT).map_err(err)?;
        let ms = start.elapsed_ms(&end).map_err(err)?;
        if !(ms.is_finite() && ms > 0.0) {
            return Err(format!("elapsed time {ms} ms is not a positive number"));
        }
        let per_launch_us = ms as f64 * 10.0; // ms / 100 * 1000
        let gbps = (N * 4) as f64 / (per_launch_us * 1e-6) / 1e9;
        Ok((
            format!("100 launches in {ms:.3} ms: {per_launch_us:.2} us each, {gbps:.0} GB/s (2 bytes read + 2 written per element); result: {detail}"),
            json!({ "total_ms": ms, "per_launch_us": per_launch_us, "gb_per_s": gbps }),
            (),
        ))
    });

    // Dynamic shared memory above 48 KiB, after opting in.
    rec.run("dynamic_shared_optin", || {
        let attrs = f16_fn.attributes().map_err(err)?;
        let bytes = (dev.info().max_shared_memory_per_block_optin as u32).saturating_sub(attrs.static_shared_bytes);
        if bytes <= 48 * 1024 {
            return Ok((format!("skipped: the device allows only {bytes} bytes per block"), Value::Null, ()));
        }
        let refused = unsafe_launch_is_refused(&f16_fn, &stream, &x16_dev, &y, bytes);
        f16_fn.set_max_dynamic_shared_memory(bytes).map_err(err)?;
        let detail = poisoned_run(&stream, &mut y, DataType::F16, &x16, |y| launch_axpb(&f16_fn, &stream, &x16_dev, y, N, grid, bytes))?;
        let now = f16_fn.attributes().map_err(err)?.max_dynamic_shared_bytes;
        if now != bytes {
            return Err(format!("after cuFuncSetAttribute the limit reads {now}, not {bytes}"));
        }
        Ok((format!("launched with {bytes} bytes of dynamic shared memory (refused before opting in: {refused}): {detail}"), Value::Null, ()))
    });

    // Bad launches are refused with an error before reaching the driver.
    rec.run("launch_validation", || {
        let mut refusals = Vec::new();
        let too_many_threads = {
            let (mut a, mut b, mut n) = (A, B, N as u64);
            let mut ptrs = [x16_dev.device_ptr(), y.device_ptr()];
            let mut params = launch_params(&mut ptrs, &mut a, &mut b, &mut n);
            // SAFETY: refused by the block-size check before any driver call.
            unsafe { f16_fn.launch(&stream, (1, 1, 1), (2048, 1, 1), 0, &mut params) }
        };
        refusals.push(("2048-thread block", too_many_threads.is_err()));
        let null_param = {
            let mut params = vec![std::ptr::null_mut(); 5];
            // SAFETY: refused by the null-pointer check before any driver call.
            unsafe { f16_fn.launch(&stream, (1, 1, 1), (32, 1, 1), 0, &mut params) }.is_err()
        };
        refusals.push(("null parameter pointer", null_param));
        cuda::synchronize_timeout(&stream, WAIT).map_err(err)?;
        let missed: Vec<&str> = refusals.iter().filter(|(_, r)| !r).map(|(n, _)| *n).collect();
        if !missed.is_empty() {
            return Err(format!("accepted: {}", missed.join(", ")));
        }
        Ok((format!("refused: {}", refusals.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")), Value::Null, ()))
    });

    // (f) Tensor cores through inline PTX.
    rec.run("mma_sync_m16n8k16", || {
        let cubin = cuda::compile_cubin(MMA_SOURCE, "mma_16x8x16", &opts).map_err(err)?;
        let module = Module::load(&dev, &cubin).map_err(err)?;
        let f = module.function("mma_16x8x16").map_err(err)?;
        let mut rng = SplitMix64::new(0x3a3a);
        // Multiples of 1/4 in [-2, 2]: products and sums are exact in f32, so the check is exact.
        let mut quarter = || ((rng.next_u64() % 17) as f64 - 8.0) / 4.0;
        let a: Vec<f64> = (0..16 * 16).map(|_| quarter()).collect();
        let b: Vec<f64> = (0..16 * 8).map(|_| quarter()).collect();
        let a_dev = dev.upload(&DataType::F16.encode(&a)).map_err(err)?;
        let b_dev = dev.upload(&DataType::F16.encode(&b)).map_err(err)?;
        dev.synchronize().map_err(err)?;
        let mut d_dev = dev.alloc(16 * 8 * 4).map_err(err)?;
        d_dev.fill_async(0xff, &stream).map_err(err)?;
        let mut ptrs = [a_dev.device_ptr(), b_dev.device_ptr(), d_dev.device_ptr()];
        let mut params: Vec<*mut c_void> = ptrs.iter_mut().map(|p| p as *mut u64 as *mut c_void).collect();
        // SAFETY: mma_16x8x16(const __half* A, const __half* B, float* D) with A 16x16, B 16x8 and
        // D 16x8 elements allocated; we synchronize before touching or freeing them.
        unsafe { f.launch(&stream, (1, 1, 1), (32, 1, 1), 0, &mut params) }.map_err(err)?;
        cuda::synchronize_timeout(&stream, WAIT).map_err(err)?;
        let d = DataType::F32.decode(&d_dev.to_host().map_err(err)?);
        let mut max_err = 0f64;
        for m in 0..16 {
            for n in 0..8 {
                let want: f64 = (0..16).map(|k| a[m * 16 + k] * b[k * 8 + n]).sum();
                let got = d[m * 8 + n];
                if !got.is_finite() || (got - want).abs() > 1e-3 {
                    return Err(format!("D[{m}][{n}] = {got}, expected {want} (fragment layout or mma result wrong)"));
                }
                max_err = max_err.max((got - want).abs());
            }
        }
        Ok((format!("one m16n8k16 f16 -> f32 tile matches the CPU (max error {max_err:e}); {} bytes of cubin for {arch}", cubin.len()), Value::Null, ()))
    });

    // Thread-block clusters through cuLaunchKernelEx (sm_90+).
    if major >= 9 {
        rec.run("cluster_launch", || {
            let cubin = cuda::compile_cubin(CLUSTER_SOURCE, "cluster_ids", &opts).map_err(err)?;
            let module = Module::load(&dev, &cubin).map_err(err)?;
            let f = module.function("cluster_ids").map_err(err)?;
            let blocks = 8u32;
            let cluster = 2u32;
            let mut out_dev = dev.alloc(blocks as usize * 2 * 4).map_err(err)?;
            out_dev.fill_async(0xff, &stream).map_err(err)?;
            let mut ptr = out_dev.device_ptr();
            let mut params = [&mut ptr as *mut u64 as *mut c_void];
            // SAFETY: cluster_ids(unsigned* out) with 2 * blocks words allocated; we synchronize
            // before reading or freeing them.
            unsafe { f.launch_cluster(&stream, (blocks, 1, 1), (32, 1, 1), (cluster, 1, 1), 0, &mut params) }.map_err(err)?;
            cuda::synchronize_timeout(&stream, WAIT).map_err(err)?;
            let words: Vec<u32> = out_dev.to_host().map_err(err)?.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
            for blk in 0..blocks as usize {
                let (rank, size) = (words[2 * blk], words[2 * blk + 1]);
                if rank != blk as u32 % cluster || size != cluster {
                    return Err(format!("block {blk}: cluster rank {rank:#x} of {size:#x}, expected {} of {cluster}", blk as u32 % cluster));
                }
            }
            Ok((format!("{blocks} blocks in clusters of {cluster}: every block saw its rank and the cluster size"), Value::Null, ()))
        });
    } else {
        rec.skip("cluster_launch", &format!("skipped: clusters need sm_90, this is sm_{major}{minor}"), true);
    }

    finish(rec)
}

/// Before opting in, a launch asking for more than the default dynamic shared memory is refused.
fn unsafe_launch_is_refused(f: &Function, stream: &Stream, x: &DeviceBuffer, y: &DeviceBuffer, bytes: u32) -> bool {
    let (mut a, mut b, mut n) = (A, B, 0u64);
    let mut ptrs = [x.device_ptr(), y.device_ptr()];
    let mut params = launch_params(&mut ptrs, &mut a, &mut b, &mut n);
    // SAFETY: the parameters match axpb_f16; with n = 0 the kernel touches no memory even if the
    // launch were accepted.
    unsafe { f.launch(stream, (1, 1, 1), (256, 1, 1), bytes, &mut params) }.is_err()
}

fn finish(rec: Recorder) -> Value {
    let report = rec.report();
    emit(&report, rec.out.as_deref());
    report
}
