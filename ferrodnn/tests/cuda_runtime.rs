//! The CUDA runtime foundation: device probing, NVRTC and the kernel cache. Every test here runs
//! on a machine with no GPU; the NVRTC test skips when libnvrtc is missing unless
//! FERRODNN_REQUIRE_NVRTC=1 (as in CI), where it fails instead.

use ferrodnn::engine::cuda::{self, CompileOptions, CudaDevice, KernelCache, KernelKey};
use ferrodnn::Error;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

fn temp_cache_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferrodnn-cache-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// A compile closure that counts its calls.
fn counting_compile<'a>(counter: &'a AtomicUsize, payload: &'static [u8]) -> impl FnOnce() -> ferrodnn::Result<Vec<u8>> + 'a {
    move || {
        counter.fetch_add(1, Ordering::SeqCst);
        Ok(payload.to_vec())
    }
}

#[test]
fn gpu_probe_never_panics() {
    let available = cuda::gpu_available();
    match CudaDevice::open(0) {
        Ok(dev) => {
            assert!(available, "a device opened but gpu_available() said false");
            assert!(dev.compute_capability() >= (8, 0), "opened a device below sm_80: {:?}", dev.info());
            assert!(dev.sm_count() > 0 && dev.total_memory() > 0);
            assert!(dev.arch().starts_with("sm_"));
            // Memory round trip and a wrapped (not owned) stream.
            let data: Vec<u8> = (0..=255).collect();
            let buf = dev.upload(&data).unwrap();
            assert_eq!(buf.to_host().unwrap(), data);
            let s = dev.new_stream().unwrap();
            // SAFETY: `s` outlives the wrapper, which is dropped first.
            let w = unsafe { dev.wrap_stream(s.raw()) };
            assert!(!w.is_owned());
            w.synchronize().unwrap();
            drop(w);
            s.synchronize().unwrap();
        }
        Err(e) => {
            assert!(!available, "gpu_available() said true but opening device 0 failed: {e}");
            let Error::Device(msg) = &e else { panic!("expected Error::Device, got {e:?}") };
            assert!(msg.contains("no GPU") || msg.contains("sm_80"), "unclear error: {msg}");
            eprintln!("no usable GPU here, as expected: {msg}");
        }
    }
    // Asking again gives the same answer (the probe is cached, and does not panic the second time).
    assert_eq!(cuda::gpu_available(), available);
    assert!(CudaDevice::open(10_000).is_err());
}

#[test]
fn cache_round_trip_memory_and_disk() {
    let dir = temp_cache_dir("roundtrip");
    let calls = AtomicUsize::new(0);
    let cache = KernelCache::with_dir(Some(dir.clone()), "nvrtc 13.0");
    let a = cache.get_or_compile("kernel A", "sm_80", counting_compile(&calls, b"cubin A")).unwrap();
    assert_eq!(a.as_slice(), b"cubin A");
    let b = cache.get_or_compile("kernel A", "sm_80", counting_compile(&calls, b"other")).unwrap();
    assert_eq!(b.as_slice(), b"cubin A");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the memory layer did not hit");
    let path = cache.entry_path(cache.key("kernel A", "sm_80")).unwrap();
    assert!(path.is_file(), "no disk entry at {}", path.display());

    // A new cache (a new process, in effect) finds it on disk.
    let cache2 = KernelCache::with_dir(Some(dir.clone()), "nvrtc 13.0");
    let c = cache2.get_or_compile("kernel A", "sm_80", counting_compile(&calls, b"other")).unwrap();
    assert_eq!(c.as_slice(), b"cubin A");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the disk layer did not hit");
    assert_eq!(cache2.stats().disk_hits, 1);

    // No temporary files are left behind.
    let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name()).filter(|n| n.to_string_lossy().ends_with(".tmp")).collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn corrupt_entries_are_rebuilt_never_loaded() {
    type Damage = fn(&mut Vec<u8>);
    let cases: [(&str, Damage); 5] = [
        ("flipped payload byte", |b| {
            let n = b.len();
            b[n - 3] ^= 0x40;
        }),
        ("flipped header byte", |b| b[20] ^= 0x01),
        ("truncated", |b| b.truncate(b.len() - 5)),
        ("truncated inside header", |b| b.truncate(10)),
        ("wrong magic", |b| b[0..8].copy_from_slice(b"NOTMAGIC")),
    ];
    for (what, damage) in cases {
        let dir = temp_cache_dir(&what.replace(' ', "-"));
        let calls = AtomicUsize::new(0);
        let cache = KernelCache::with_dir(Some(dir.clone()), "nvrtc 13.0");
        cache.get_or_compile("k", "sm_90a", counting_compile(&calls, b"the real cubin")).unwrap();
        let path = cache.entry_path(cache.key("k", "sm_90a")).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        damage(&mut bytes);
        std::fs::write(&path, &bytes).unwrap();

        let fresh = KernelCache::with_dir(Some(dir.clone()), "nvrtc 13.0");
        let got = fresh.get_or_compile("k", "sm_90a", counting_compile(&calls, b"the real cubin")).unwrap();
        assert_eq!(got.as_slice(), b"the real cubin", "{what}: a damaged entry was loaded");
        assert_eq!(calls.load(Ordering::SeqCst), 2, "{what}: the kernel was not recompiled");
        assert_eq!(fresh.stats().corrupt_entries, 1, "{what}");
        // The rebuilt entry is good again.
        let again = KernelCache::with_dir(Some(dir.clone()), "nvrtc 13.0");
        again.get_or_compile("k", "sm_90a", counting_compile(&calls, b"wrong")).unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 2, "{what}: the rebuilt entry was not stored");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn disabled_disk_layer_writes_nothing() {
    let calls = AtomicUsize::new(0);
    let cache = KernelCache::with_dir(None, "nvrtc 13.0");
    assert!(cache.dir().is_none());
    cache.get_or_compile("k", "sm_80", counting_compile(&calls, b"x")).unwrap();
    cache.get_or_compile("k", "sm_80", counting_compile(&calls, b"x")).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(cache.entry_path(cache.key("k", "sm_80")).is_none());
    // A second memory-only cache shares nothing with the first.
    let other = KernelCache::with_dir(None, "nvrtc 13.0");
    other.get_or_compile("k", "sm_80", counting_compile(&calls, b"x")).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[test]
fn cache_env_resolution() {
    // Through a lookup function: setting real variables would race with other tests' getenv.
    let env = |pairs: &'static [(&'static str, &'static str)]| move |var: &str| pairs.iter().find(|(k, _)| *k == var).map(|(_, v)| std::ffi::OsString::from(v));
    assert_eq!(KernelCache::dir_from(env(&[("HOME", "/home/u")])), Some(PathBuf::from("/home/u/.cache/ferrodnn/kernels")));
    assert_eq!(KernelCache::dir_from(env(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/xdg")])), Some(PathBuf::from("/xdg/ferrodnn/kernels")));
    assert_eq!(KernelCache::dir_from(env(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/xdg"), ("FERRODNN_CACHE_DIR", "/explicit")])), Some(PathBuf::from("/explicit")));
    assert_eq!(KernelCache::dir_from(env(&[("HOME", "/home/u"), ("FERRODNN_CACHE_DIR", "/explicit"), ("FERRODNN_KERNEL_CACHE", "0")])), None);
    assert_eq!(KernelCache::dir_from(env(&[("HOME", "/home/u"), ("FERRODNN_KERNEL_CACHE", "1")])), Some(PathBuf::from("/home/u/.cache/ferrodnn/kernels")));
    assert_eq!(KernelCache::dir_from(env(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "")])), Some(PathBuf::from("/home/u/.cache/ferrodnn/kernels")));
    assert_eq!(KernelCache::dir_from(env(&[])), None);
}

#[test]
fn key_depends_on_source_arch_and_toolchain() {
    let base = KernelKey::new("src", "sm_80", "nvrtc 13.0");
    assert_eq!(base, KernelKey::new("src", "sm_80", "nvrtc 13.0"), "the key is not stable");
    assert_ne!(base, KernelKey::new("src ", "sm_80", "nvrtc 13.0"));
    assert_ne!(base, KernelKey::new("src", "sm_90a", "nvrtc 13.0"));
    assert_ne!(base, KernelKey::new("src", "sm_80", "nvrtc 13.1"));
    let a = KernelCache::with_dir(None, "nvrtc 13.0");
    let b = KernelCache::with_dir(None, "nvrtc 12.9");
    assert_ne!(a.key("src", "sm_80"), b.key("src", "sm_80"));
    // A known value, so a change to the key function is a deliberate one (it orphans old entries).
    assert_eq!(base.hex().len(), 32);
    let mut opts = CompileOptions::new("sm_80");
    let f0 = opts.fingerprint();
    opts.fast_math = true;
    assert_ne!(f0, opts.fingerprint(), "fast math must change the key");
}

const SAXPY_HALF: &str = r#"
#include <cuda_fp16.h>
extern "C" __global__ void saxpy_half(int n, float a, const __half* x, __half* y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half(a * __half2float(x[i]) + __half2float(y[i]));
}
"#;

// One m16n8k16 f16 tensor-core step (sm_80+).
const MMA_SYNC: &str = r#"
extern "C" __global__ void mma_step(const unsigned* a, const unsigned* b, float* c) {
    unsigned a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], b0 = b[0], b1 = b[1];
    float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    c[threadIdx.x * 4 + 0] = d0; c[threadIdx.x * 4 + 1] = d1;
    c[threadIdx.x * 4 + 2] = d2; c[threadIdx.x * 4 + 3] = d3;
}
"#;

// wgmma needs the architecture-specific sm_90a.
const WGMMA_FENCE: &str = r#"
extern "C" __global__ void wgmma_fence(float* y) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    y[threadIdx.x] = 1.0f;
}
"#;

fn is_elf(cubin: &[u8]) -> bool {
    cubin.len() > 64 && &cubin[..4] == b"\x7fELF"
}

#[test]
fn nvrtc_compiles_for_sm80_and_sm90a() {
    let info = match cuda::nvrtc() {
        Ok(info) => info,
        Err(e) => {
            if std::env::var("FERRODNN_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
                panic!("FERRODNN_REQUIRE_NVRTC=1 but NVRTC could not be loaded: {e}");
            }
            eprintln!("skipped: NVRTC not found ({e})");
            return;
        }
    };
    eprintln!("NVRTC {} from {}", info.version_string(), info.source);
    let headers = cuda::cuda_include_dir();
    eprintln!("CUDA headers: {:?} (searched {} places)", headers.found, headers.searched.len());
    let required = std::env::var("FERRODNN_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    for arch in ["sm_80", "sm_90a"] {
        let opts = CompileOptions::new(arch);
        if headers.found.is_some() || required {
            let cubin = cuda::compile_cubin(SAXPY_HALF, "saxpy_half", &opts).unwrap_or_else(|e| panic!("saxpy_half for {arch}: {e}"));
            assert!(is_elf(&cubin), "saxpy_half for {arch}: not an ELF cubin");
        } else {
            eprintln!("skipped saxpy_half: CUDA headers not found (set FERRODNN_CUDA_INCLUDE)");
        }
        let cubin = cuda::compile_cubin(MMA_SYNC, "mma_step", &opts).unwrap_or_else(|e| panic!("mma_step for {arch}: {e}"));
        assert!(is_elf(&cubin), "mma_step for {arch}: not an ELF cubin");
        eprintln!("compiled saxpy_half and mma_step for {arch} ({} bytes)", cubin.len());
    }
    let cubin = cuda::compile_cubin(WGMMA_FENCE, "wgmma_fence", &CompileOptions::new("sm_90a")).unwrap_or_else(|e| panic!("wgmma_fence for sm_90a: {e}"));
    assert!(is_elf(&cubin));
    eprintln!("compiled wgmma_fence for sm_90a ({} bytes)", cubin.len());
    // wgmma is not available on sm_80: the error carries NVRTC's (ptxas') log.
    let err = cuda::compile_cubin(WGMMA_FENCE, "wgmma_fence", &CompileOptions::new("sm_80")).unwrap_err();
    assert!(err.to_string().contains("wgmma_fence") && err.to_string().contains("sm_80"), "{err}");

    // A syntax error reports NVRTC's log.
    let err = cuda::compile_cubin("extern \"C\" __global__ void broken( { }", "broken", &CompileOptions::new("sm_80")).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("broken") && msg.contains("error"), "no log in: {msg}");
    // A bad architecture string is refused before NVRTC runs.
    assert!(cuda::compile_cubin(SAXPY_HALF, "x", &CompileOptions::new("compute_80")).is_err());

    // Through the cache: the second request does not compile.
    let dir = temp_cache_dir("nvrtc");
    let cache = KernelCache::with_dir(Some(dir.clone()), &format!("nvrtc {}", info.version_string()));
    let opts = CompileOptions::new("sm_90a");
    let a = cuda::compile_cached(&cache, MMA_SYNC, "mma_step", &opts).unwrap();
    let b = cuda::compile_cached(&cache, MMA_SYNC, "mma_step", &opts).unwrap();
    assert_eq!(a, b);
    assert_eq!(cache.stats().compiles, 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn missing_headers_error_lists_where_we_looked() {
    if cuda::nvrtc().is_err() {
        eprintln!("skipped: NVRTC not found");
        return;
    }
    let src = "#include <ferrodnn_no_such_header.h>\nextern \"C\" __global__ void k() {}";
    let err = cuda::compile_cubin(src, "needs_header", &CompileOptions::new("sm_80")).unwrap_err();
    assert!(err.to_string().contains("ferrodnn_no_such_header.h"), "{err}");
    let search = cuda::cuda_include_dir();
    assert!(!search.searched.is_empty());
    if search.found.is_none() {
        assert!(err.to_string().contains("looked in"), "{err}");
    }
}

// The `ferrodnn gpu-check-runtime` kernels and checks, shared with the CLI so that CI compiles the
// very kernels the GPU check runs.
#[allow(dead_code)]
#[path = "../../ferrodnn-cli/src/gpu_smoke.rs"]
mod gpu_smoke;

#[test]
fn gpu_smoke_kernels_compile_for_sm80_and_sm90a() {
    let required = std::env::var("FERRODNN_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    if let Err(e) = cuda::nvrtc() {
        assert!(!required, "FERRODNN_REQUIRE_NVRTC=1 but NVRTC could not be loaded: {e}");
        eprintln!("skipped: NVRTC not found ({e})");
        return;
    }
    if cuda::cuda_include_dir().found.is_none() && !required {
        eprintln!("skipped: CUDA headers not found (set FERRODNN_CUDA_INCLUDE)");
        return;
    }
    // sm_80: the f16/bf16 kernels and mma.sync; sm_90a adds the cluster kernel.
    for (arch, expected) in [("sm_80", 2), ("sm_90a", 3)] {
        let built = gpu_smoke::compile_all(arch).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(built.len(), expected, "{arch}: {built:?}");
        eprintln!("{arch}: {built:?}");
    }
    // The cluster kernel needs sm_90: on sm_80 its special registers do not exist.
    assert!(cuda::compile_cubin(gpu_smoke::CLUSTER_SOURCE, "cluster_ids", &CompileOptions::new("sm_80")).is_err());
}

#[test]
fn gpu_smoke_checks_pass_on_a_gpu() {
    if !cuda::gpu_available() {
        eprintln!("skipped: no GPU (the launch path runs only where one is)");
        return;
    }
    let report = gpu_smoke::run_checks(0, None, false);
    assert_eq!(report["ok"], serde_json::Value::Bool(true), "{report:#}");
}
