//! Runtime compilation: CUDA C++ text to a cubin with NVRTC, for one architecture.
//!
//! NVRTC needs no GPU, so every kernel can be compiled (and test-compiled) on any machine that
//! has `libnvrtc`. Two things must be found:
//!
//! - **libnvrtc**, which cudarc loads by name through the dynamic loader (`libnvrtc.so`,
//!   `libnvrtc.so.13`, `libnvrtc.so.12`, ...), so `LD_LIBRARY_PATH` or the system's loader
//!   configuration decides. When that fails we look for the library by path (`FERRODNN_NVRTC_LIB`,
//!   the CUDA toolkit, and the `nvidia-cuda-nvrtc` pip wheel in Python's site-packages) and load
//!   it first: the loader then resolves cudarc's `libnvrtc.so.13` to the copy already loaded (same
//!   soname).
//! - **the CUDA headers** kernels include (`cuda_fp16.h`, `cuda_bf16.h`): `FERRODNN_CUDA_INCLUDE`,
//!   the toolkit (`CUDA_HOME`, `CUDA_PATH`, `/usr/local/cuda`), an `include` folder beside a lib
//!   folder on `LD_LIBRARY_PATH`, or the `nvidia-cuda-runtime` wheel's `nvidia/cu13/include` in
//!   Python's site-packages (`PYTHONPATH`, virtualenv, conda, `~/.local`, `/usr/local`, `/usr`; as
//!   a last resort, `python3` is asked where the `nvidia` package is). A kernel that includes a header none of them has fails with an error
//!   that lists every place we looked.

use crate::error::{Error, Result};
use cudarc::nvrtc::sys;
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// Every NVRTC symbol this module calls; checked before the first call so that an old or
/// truncated library gives an error instead of cudarc's "Missing symbol" panic.
const REQUIRED_NVRTC_SYMBOLS: &[&str] = &[
    "nvrtcVersion",
    "nvrtcGetErrorString",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcDestroyProgram",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
];

/// The NVRTC that was loaded: its version and where it was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvrtcInfo {
    pub major: u32,
    pub minor: u32,
    /// "dynamic loader (LD_LIBRARY_PATH, ld.so.cache)" or the file we preloaded.
    pub source: String,
}

impl NvrtcInfo {
    /// "13.0": part of every kernel cache key, so a new NVRTC never loads old cubins.
    pub fn version_string(&self) -> String {
        format!("{}.{}", self.major, self.minor)
    }
}

/// Load NVRTC (once per process) and report its version, or say why it cannot be loaded.
pub fn nvrtc() -> Result<&'static NvrtcInfo> {
    static PROBE: OnceLock<std::result::Result<NvrtcInfo, String>> = OnceLock::new();
    PROBE
        .get_or_init(|| std::panic::catch_unwind(probe_nvrtc).unwrap_or_else(|_| Err("NVRTC not found: loading libnvrtc panicked inside cudarc".to_string())))
        .as_ref()
        .map_err(|e| Error::Device(e.clone()))
}

/// The NVRTC version as (major, minor).
pub fn nvrtc_version() -> Result<(u32, u32)> {
    nvrtc().map(|i| (i.major, i.minor))
}

/// True when NVRTC can be loaded.
pub fn nvrtc_available() -> bool {
    nvrtc().is_ok()
}

/// Libraries preloaded by path; kept open for the life of the process so that cudarc's later
/// load by name finds them.
fn preloaded() -> &'static Mutex<Vec<libloading::Library>> {
    static LIBS: OnceLock<Mutex<Vec<libloading::Library>>> = OnceLock::new();
    LIBS.get_or_init(|| Mutex::new(Vec::new()))
}

fn preload(path: &Path) -> std::result::Result<(), String> {
    // SAFETY: loading libnvrtc runs only its own initializers (it has no dangerous ones; it is
    // designed to be dlopen'ed); we keep the handle open forever so no symbol outlives it.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| format!("{}: {e}", path.display()))?;
    preloaded().lock().unwrap_or_else(|p| p.into_inner()).push(lib);
    Ok(())
}

fn nvrtc_present() -> bool {
    // SAFETY: is_culib_present dlopens each candidate name and drops the handle; no symbol is
    // called.
    unsafe { sys::is_culib_present() }
}

fn probe_nvrtc() -> std::result::Result<NvrtcInfo, String> {
    let names = cudarc::get_lib_name_candidates("nvrtc");
    let mut source = "dynamic loader (LD_LIBRARY_PATH, ld.so.cache)".to_string();
    let mut tried = Vec::new();
    if let Some(path) = std::env::var_os("FERRODNN_NVRTC_LIB").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        if let Some(dir) = path.parent() {
            preload_builtins(dir);
        }
        preload(&path).map_err(|e| format!("NVRTC not found: FERRODNN_NVRTC_LIB names a library that does not load ({e}); point it at libnvrtc.so.13 or unset it"))?;
        source = path.display().to_string();
    }
    if !nvrtc_present() {
        let mut found = false;
        for dir in nvrtc_library_dirs() {
            tried.push(dir.display().to_string());
            if let Some(path) = preload_from_dir(&dir) {
                if nvrtc_present() {
                    source = path.display().to_string();
                    found = true;
                    break;
                }
            }
        }
        if !found {
            return Err(format!(
                "NVRTC not found: the dynamic loader found none of {}, and no libnvrtc.so.13 or libnvrtc.so.12 was in {}. Install it (`pip install nvidia-cuda-nvrtc`, or the CUDA toolkit) and add its lib folder to LD_LIBRARY_PATH, or set FERRODNN_NVRTC_LIB to the library file",
                names.join(", "),
                tried.join(", ")
            ));
        }
    }
    // SAFETY: nvrtc_present() just succeeded with the same candidates culib() tries, in the same
    // order, so culib() returns the library instead of panicking.
    let lib = unsafe { sys::culib() };
    let missing: Vec<&str> = REQUIRED_NVRTC_SYMBOLS
        .iter()
        .copied()
        // SAFETY: a dlsym lookup only; the address is dropped without being called.
        .filter(|name| unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_err())
        .collect();
    if !missing.is_empty() {
        return Err(format!("NVRTC not found: the loaded libnvrtc lacks {}; install NVRTC 12.0 or newer", missing.join(", ")));
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the symbol is present (checked above); both are valid out pointers.
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("NVRTC not found: nvrtcVersion failed with {}", nvrtc_error(r)));
    }
    Ok(NvrtcInfo { major: major as u32, minor: minor as u32, source })
}

fn nvrtc_error(r: sys::nvrtcResult) -> String {
    // SAFETY: only called after the probe found nvrtcGetErrorString; it returns a static string.
    let p = unsafe { sys::nvrtcGetErrorString(r) };
    if p.is_null() {
        format!("{r:?}")
    } else {
        // SAFETY: a NUL-terminated static string owned by NVRTC.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Folders that may hold Python packages (site-packages), in the order we search them. The
/// `python3` interpreter is asked only by [`python_site_dirs`], as a last resort.
fn site_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(pp) = std::env::var_os("PYTHONPATH") {
        dirs.extend(std::env::split_paths(&pp).filter(|p| !p.as_os_str().is_empty()));
    }
    let mut prefixes: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
            prefixes.push(PathBuf::from(p));
        }
    }
    if let Some(home) = std::env::var_os("HOME").filter(|p| !p.is_empty()) {
        prefixes.push(PathBuf::from(home).join(".local"));
    }
    prefixes.push("/usr/local".into());
    prefixes.push("/usr".into());
    for prefix in prefixes {
        let lib = prefix.join("lib");
        let mut versions: Vec<PathBuf> = std::fs::read_dir(&lib)
            .map(|rd| rd.filter_map(|e| e.ok()).filter(|e| e.file_name().to_string_lossy().starts_with("python3")).map(|e| e.path()).collect())
            .unwrap_or_default();
        versions.sort();
        versions.reverse(); // the newest Python first
        for v in versions {
            dirs.push(v.join("site-packages"));
            dirs.push(v.join("dist-packages"));
        }
        dirs.push(lib.join("python3").join("dist-packages"));
    }
    dirs.dedup();
    dirs
}

/// Ask `python3` where the `nvidia` namespace package lives (the last resort).
fn python_site_dirs() -> Vec<PathBuf> {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(|| {
        let out = std::process::Command::new("python3")
            .args(["-c", "import nvidia, os; print('\\n'.join(os.path.dirname(p) for p in nvidia.__path__))"])
            .stderr(std::process::Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).lines().filter(|l| !l.trim().is_empty()).map(|l| PathBuf::from(l.trim())).collect(),
            _ => Vec::new(),
        }
    })
    .clone()
}

fn toolkit_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
            roots.push(PathBuf::from(p));
        }
    }
    roots.push("/usr/local/cuda".into());
    roots
}

const NVRTC_FILES: [&str; 2] = ["libnvrtc.so.13", "libnvrtc.so.12"];

/// libnvrtc opens its companion `libnvrtc-builtins.so.<major>.<minor>` by name at its first
/// compile; when we loaded libnvrtc by path that name is not on the loader's path, so load the
/// builtins from the same folder first: the loader then matches the name to this copy (soname).
fn preload_builtins(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("libnvrtc-builtins.so.") {
            let _ = preload(&e.path());
        }
    }
}

/// Load libnvrtc (and its builtins) from `dir`; the path loaded, if any.
fn preload_from_dir(dir: &Path) -> Option<PathBuf> {
    let path = NVRTC_FILES.iter().map(|f| dir.join(f)).find(|p| p.is_file())?;
    preload_builtins(dir);
    preload(&path).ok()?;
    Some(std::fs::canonicalize(&path).unwrap_or(path))
}

/// Folders that may hold libnvrtc, for when the dynamic loader does not find it by name.
fn nvrtc_library_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(inc) = std::env::var_os("FERRODNN_CUDA_INCLUDE").filter(|p| !p.is_empty()) {
        // The wheels put lib/ beside include/ (nvidia/cu13/{include,lib}).
        if let Some(parent) = PathBuf::from(inc).parent() {
            dirs.push(parent.join("lib"));
            dirs.push(parent.join("lib64"));
        }
    }
    for root in toolkit_roots() {
        dirs.push(root.join("lib64"));
        dirs.push(root.join("lib"));
    }
    let wheel_dirs = |site: &Path| [site.join("nvidia/cu13/lib"), site.join("nvidia/cuda_nvrtc/lib")];
    for site in site_dirs() {
        dirs.extend(wheel_dirs(&site));
    }
    let has_lib = |d: &PathBuf| NVRTC_FILES.iter().any(|f| d.join(f).is_file());
    if !dirs.iter().any(has_lib) {
        for site in python_site_dirs() {
            dirs.extend(wheel_dirs(&site));
        }
    }
    let mut unique = Vec::new();
    for d in dirs {
        if !unique.contains(&d) {
            unique.push(d);
        }
    }
    unique
}

/// Where we looked for the CUDA headers, and the first folder that has them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderSearch {
    /// A folder holding `cuda_fp16.h`, if any.
    pub found: Option<PathBuf>,
    /// Every folder examined, in order.
    pub searched: Vec<PathBuf>,
}

impl HeaderSearch {
    /// The folders searched, for an error message.
    pub fn searched_list(&self) -> String {
        self.searched.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    }
}

/// Find the CUDA headers (once per process; see the module docs for the order).
pub fn cuda_include_dir() -> &'static HeaderSearch {
    static SEARCH: OnceLock<HeaderSearch> = OnceLock::new();
    SEARCH.get_or_init(search_cuda_include)
}

fn search_cuda_include() -> HeaderSearch {
    let mut searched = Vec::new();
    let has_headers = |d: &Path| d.join("cuda_fp16.h").is_file();
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("FERRODNN_CUDA_INCLUDE").filter(|p| !p.is_empty()) {
        candidates.push(PathBuf::from(p));
    }
    candidates.extend(toolkit_roots().into_iter().map(|r| r.join("include")));
    // Beside a lib folder on LD_LIBRARY_PATH (the toolkit's lib64, or a wheel's nvidia/cu13/lib).
    if let Some(paths) = std::env::var_os("LD_LIBRARY_PATH") {
        candidates.extend(std::env::split_paths(&paths).filter_map(|p| p.parent().map(|d| d.join("include"))));
    }
    let wheel_dirs = |site: &Path| [site.join("nvidia/cu13/include"), site.join("nvidia/cuda_runtime/include")];
    for site in site_dirs() {
        candidates.extend(wheel_dirs(&site));
    }
    for c in candidates {
        if !searched.contains(&c) {
            searched.push(c.clone());
        }
        if has_headers(&c) {
            return HeaderSearch { found: Some(c), searched };
        }
    }
    for site in python_site_dirs() {
        for c in wheel_dirs(&site) {
            searched.push(c.clone());
            if has_headers(&c) {
                return HeaderSearch { found: Some(c), searched };
            }
        }
    }
    HeaderSearch { found: None, searched }
}

/// How to compile one kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileOptions {
    /// `sm_80`, `sm_86`, `sm_90a`, `sm_100a`, ...: a real architecture, since we want a cubin.
    pub arch: String,
    /// `--use_fast_math` (off by default: approximate division, exp, flush denormals).
    pub fast_math: bool,
    /// More `-I` folders, searched before the CUDA headers.
    pub include_dirs: Vec<PathBuf>,
    /// Further NVRTC options, passed as given.
    pub extra: Vec<String>,
}

impl CompileOptions {
    pub fn new(arch: impl Into<String>) -> CompileOptions {
        CompileOptions { arch: arch.into(), fast_math: false, include_dirs: Vec::new(), extra: Vec::new() }
    }
    pub fn fast_math(mut self, on: bool) -> CompileOptions {
        self.fast_math = on;
        self
    }
    pub fn option(mut self, opt: impl Into<String>) -> CompileOptions {
        self.extra.push(opt.into());
        self
    }

    /// The options that change the generated code (not the header folders), for cache keys.
    pub fn fingerprint(&self) -> String {
        let mut s = format!("arch={};fast_math={}", self.arch, self.fast_math);
        for e in &self.extra {
            s.push(';');
            s.push_str(e);
        }
        s
    }

    fn check_arch(&self) -> Result<()> {
        let a = &self.arch;
        let digits = a.strip_prefix("sm_").map(|r| r.trim_end_matches(['a', 'f'])).unwrap_or("");
        if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) || a.len() - 3 - digits.len() > 1 {
            return Err(Error::InvalidArgument(format!("NVRTC architecture `{a}` is not of the form sm_80, sm_90a, sm_100a; a cubin needs a real architecture")));
        }
        Ok(())
    }

    /// The NVRTC command line.
    pub fn args(&self, cuda_include: Option<&Path>) -> Vec<String> {
        let mut args = vec![format!("--gpu-architecture={}", self.arch), "-std=c++17".to_string(), "-default-device".to_string()];
        if self.fast_math {
            args.push("--use_fast_math".into());
        }
        for d in self.include_dirs.iter().map(|d| d.as_path()).chain(cuda_include) {
            args.push(format!("-I{}", d.display()));
        }
        args.extend(self.extra.iter().cloned());
        args
    }
}

/// Owns an nvrtcProgram and destroys it on every path out of `compile_cubin`.
struct Program(sys::nvrtcProgram);
impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram and destroyed exactly once, here.
        unsafe {
            sys::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

impl Program {
    fn log(&self) -> String {
        let mut size = 0usize;
        // SAFETY: a live program and a valid out pointer.
        if unsafe { sys::nvrtcGetProgramLogSize(self.0, &mut size) } != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        // SAFETY: the buffer holds the `size` bytes NVRTC asked for, NUL included.
        if unsafe { sys::nvrtcGetProgramLog(self.0, buf.as_mut_ptr() as *mut c_char) } != sys::nvrtcResult::NVRTC_SUCCESS {
            return String::new();
        }
        String::from_utf8_lossy(&buf).trim_end_matches('\0').trim_end().to_string()
    }
}

/// Compile `source` (CUDA C++) for `opts.arch` and return the cubin. `name` names the program
/// in NVRTC's messages. Errors carry NVRTC's log.
pub fn compile_cubin(source: &str, name: &str, opts: &CompileOptions) -> Result<Vec<u8>> {
    compile_cubin_logged(source, name, opts).map(|(cubin, _)| cubin)
}

/// What ptxas says when it makes every `wgmma` of a function wait for the one before (for lack
/// of registers, say): a Hopper kernel compiled so runs correctly at a fraction of its speed.
pub const WGMMA_SERIALIZED: &str = "wgmma.mma_async instructions are serialized";

/// ptxas's performance notes in an NVRTC log: "Potential Performance Loss: ..." (serialized
/// wgmmas among them) and the lines on waits it injected around wgmma (each a sign of an
/// operand register live across an asynchronous product).
pub fn ptxas_perf_notes(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains("Potential Performance Loss") || l.contains(" is injected ")).map(str::trim).collect()
}

/// [`compile_cubin`], with NVRTC's log of a successful compilation: ptxas's performance notes
/// ("Potential Performance Loss: ...", [`WGMMA_SERIALIZED`]) are there.
pub fn compile_cubin_logged(source: &str, name: &str, opts: &CompileOptions) -> Result<(Vec<u8>, String)> {
    compile_with_ptx(source, name, opts).map(|(cubin, _, log)| (cubin, log))
}

/// [`compile_cubin_logged`], with the PTX the cubin was assembled from.
pub fn compile_with_ptx(source: &str, name: &str, opts: &CompileOptions) -> Result<(Vec<u8>, String, String)> {
    opts.check_arch()?;
    let (prog, log) = compile_program(source, name, opts)?;
    let ptx = program_ptx(&prog, name, &opts.arch)?;
    let mut size = 0usize;
    // SAFETY: a compiled program and a valid out pointer.
    let r = unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return Err(Error::Device(format!("kernel `{name}`: NVRTC produced no cubin for {} ({}); is it a real architecture such as sm_90a?", opts.arch, nvrtc_error(r))));
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: the buffer holds exactly the size NVRTC reported.
    let r = unsafe { sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr() as *mut c_char) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Device(format!("kernel `{name}`: nvrtcGetCUBIN failed: {}", nvrtc_error(r))));
    }
    Ok((cubin, ptx, log))
}

/// Compile `source` to PTX for the virtual architecture of `opts.arch` (`sm_90a` gives
/// `compute_90a`): no ptxas pass, so much faster than [`compile_cubin`]. The PTX is what NVRTC's
/// front end made of the source, so two sources with the same PTX compile to the same machine
/// code: the kernel-layer refactors are checked that way (`ferrodnn compile-cases --ptx-manifest`).
pub fn compile_ptx(source: &str, name: &str, opts: &CompileOptions) -> Result<String> {
    opts.check_arch()?;
    let virtual_opts = CompileOptions { arch: opts.arch.replacen("sm_", "compute_", 1), ..opts.clone() };
    let (prog, _) = compile_program(source, name, &virtual_opts)?;
    program_ptx(&prog, name, &virtual_opts.arch)
}

/// The PTX of a compiled program.
fn program_ptx(prog: &Program, name: &str, arch: &str) -> Result<String> {
    let mut size = 0usize;
    // SAFETY: a compiled program and a valid out pointer.
    let r = unsafe { sys::nvrtcGetPTXSize(prog.0, &mut size) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return Err(Error::Device(format!("kernel `{name}`: NVRTC produced no PTX for {arch} ({})", nvrtc_error(r))));
    }
    let mut ptx = vec![0u8; size];
    // SAFETY: the buffer holds exactly the size NVRTC reported, NUL included.
    let r = unsafe { sys::nvrtcGetPTX(prog.0, ptx.as_mut_ptr() as *mut c_char) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Device(format!("kernel `{name}`: nvrtcGetPTX failed: {}", nvrtc_error(r))));
    }
    Ok(String::from_utf8_lossy(&ptx).trim_end_matches('\0').to_string())
}

/// Runs NVRTC on `source` with `opts` (whose architecture the caller checked): the compiled
/// program and its log, or an error with the log.
fn compile_program(source: &str, name: &str, opts: &CompileOptions) -> Result<(Program, String)> {
    nvrtc()?;
    let headers = cuda_include_dir();
    let args = opts.args(headers.found.as_deref());
    let c_src = CString::new(source).map_err(|_| Error::InvalidArgument(format!("kernel `{name}`: the source contains a NUL byte")))?;
    let c_name = CString::new(format!("{name}.cu")).map_err(|_| Error::InvalidArgument(format!("kernel name `{name}` contains a NUL byte")))?;
    let c_args: Vec<CString> = args
        .iter()
        .map(|a| CString::new(a.as_str()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| Error::InvalidArgument(format!("kernel `{name}`: an NVRTC option contains a NUL byte")))?;
    let arg_ptrs: Vec<*const c_char> = c_args.iter().map(|a| a.as_ptr()).collect();

    let mut raw: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: NVRTC was loaded and its symbols checked by nvrtc(); the source and name are
    // NUL-terminated and outlive the call (NVRTC copies them); no headers are passed (0, null).
    let r = unsafe { sys::nvrtcCreateProgram(&mut raw, c_src.as_ptr(), c_name.as_ptr(), 0, std::ptr::null(), std::ptr::null()) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Device(format!("kernel `{name}`: nvrtcCreateProgram failed: {}", nvrtc_error(r))));
    }
    let prog = Program(raw);
    // SAFETY: a live program; `arg_ptrs` holds arg_ptrs.len() NUL-terminated strings that
    // outlive the call.
    let r = unsafe { sys::nvrtcCompileProgram(prog.0, arg_ptrs.len() as i32, arg_ptrs.as_ptr()) };
    let log = prog.log();
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        let mut msg = format!("NVRTC could not compile kernel `{name}` for {} ({}); options: {}\n{log}", opts.arch, nvrtc_error(r), args.join(" "));
        if headers.found.is_none() && (log.contains("cannot open source file") || log.contains("could not open source file")) {
            msg.push_str(&format!(
                "\nthe CUDA headers were not found; looked in: {}. Install them (`pip install nvidia-cuda-runtime`, or the CUDA toolkit) or set FERRODNN_CUDA_INCLUDE to a folder that holds cuda_fp16.h",
                headers.searched_list()
            ));
        }
        return Err(Error::Device(msg));
    }
    Ok((prog, log))
}

/// Compile through a [`KernelCache`](super::KernelCache): the key covers the source, the
/// options' fingerprint (architecture included) and the NVRTC version.
pub fn compile_cached(cache: &super::KernelCache, source: &str, name: &str, opts: &CompileOptions) -> Result<std::sync::Arc<Vec<u8>>> {
    let info = nvrtc()?;
    let key = super::KernelKey::new(source, &opts.fingerprint(), &format!("nvrtc {}", info.version_string()));
    cache.get_or_compile_key(key, || compile_cubin(source, name, opts))
}
