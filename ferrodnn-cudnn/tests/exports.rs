//! Our library exports every function a program linked against NVIDIA's cuDNN 9 can import: the
//! C functions of NVIDIA's libcudnn.so.9 and of its sub-libraries (graph, ops, cnn, adv, ext),
//! compared by `nm -D`. Names a sub-library exports that neither libcudnn.so.9 nor a public
//! header has (internal helpers no program links to) are listed and left out.
//!
//! Where NVIDIA's libraries are not installed (or `nm` is missing) the test says so on standard
//! error and passes: set `FERRODNN_CUDNN_LIB` to the folder of NVIDIA's libcudnn*.so.9 (and
//! `FERRODNN_CUDNN_INCLUDE` to that of its headers; default: `../include` beside it).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const DEFAULT_WHEEL: &str = "/work/benchenv/venv/lib/python3.11/site-packages/nvidia/cudnn";

/// The C functions (`cudnn*`) a shared library defines, or None when `nm` cannot read it.
fn exported(lib: &Path) -> Option<BTreeSet<String>> {
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(lib).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Some(
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 3 && f[1] == "T").then(|| f[2].split('@').next().unwrap_or("").to_string())
            })
            .filter(|n| n.starts_with("cudnn"))
            .collect(),
    )
}

/// Our built library: the cdylib cargo builds beside the test binary's folder.
fn ours() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?.parent()?;
    let lib = dir.join("libferrodnn_cudnn.so");
    lib.exists().then_some(lib)
}

#[test]
fn exports_cover_nvidias_libraries() {
    let lib_dir = std::env::var("FERRODNN_CUDNN_LIB").map(PathBuf::from).unwrap_or_else(|_| Path::new(DEFAULT_WHEEL).join("lib"));
    let main = lib_dir.join("libcudnn.so.9");
    let Some(nv_main) = exported(&main) else {
        eprintln!("exports test skipped: NVIDIA's libcudnn.so.9 is not at {} (or nm is missing); set FERRODNN_CUDNN_LIB", main.display());
        return;
    };
    let Some(our_lib) = ours() else {
        eprintln!("exports test skipped: libferrodnn_cudnn.so was not built beside the test binary");
        return;
    };
    let include = std::env::var("FERRODNN_CUDNN_INCLUDE").map(PathBuf::from).unwrap_or_else(|_| lib_dir.join("../include"));
    let headers: String = std::fs::read_dir(&include)
        .map(|d| d.filter_map(|e| e.ok()).filter(|e| e.file_name().to_string_lossy().ends_with(".h")).filter_map(|e| std::fs::read_to_string(e.path()).ok()).collect())
        .unwrap_or_default();
    let mut union = nv_main.clone();
    for sub in ["graph", "ops", "cnn", "adv", "ext"] {
        if let Some(names) = exported(&lib_dir.join(format!("libcudnn_{sub}.so.9"))) {
            union.extend(names);
        }
    }
    let (required, internal): (BTreeSet<String>, BTreeSet<String>) = union.into_iter().partition(|n| nv_main.contains(n) || headers.contains(n.as_str()));
    if !internal.is_empty() {
        eprintln!("left out (exported by a sub-library, in no header and not by libcudnn.so.9): {internal:?}");
    }
    let ours = exported(&our_lib).expect("nm reads our library");
    let missing: Vec<&String> = required.iter().filter(|n| !ours.contains(*n)).collect();
    assert!(missing.is_empty(), "{} of NVIDIA's {} functions are not exported by {}: {missing:?}", missing.len(), required.len(), our_lib.display());
    eprintln!("ours exports all {} of NVIDIA's functions ({} in all)", required.len(), ours.len());
}

/// A stub answers NOT_SUPPORTED and says which function it is.
#[test]
fn stubs_return_not_supported_naming_the_function() {
    use ferrodnn_cudnn::types::*;
    let s = ferrodnn_cudnn::stubs::cudnnCreateCTCLossDescriptor(std::ptr::null_mut());
    assert_eq!(s, CUDNN_STATUS_NOT_SUPPORTED);
    let msg = ferrodnn_cudnn::api::last_error();
    assert!(msg.contains("cudnnCreateCTCLossDescriptor") && msg.contains("not implemented"), "{msg}");
    let s = ferrodnn_cudnn::stubs::cudnnSetBackdoor();
    assert_eq!(s, CUDNN_STATUS_NOT_SUPPORTED);
    assert!(ferrodnn_cudnn::api::last_error().contains("cudnnSetBackdoor"));
}
