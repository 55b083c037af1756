//! The shared library's identity (the soname programs linked against NVIDIA's cuDNN 9 ask for),
//! and the NOT_SUPPORTED stubs generated from `stubs.txt`.
//!
//! Symbol versions: NVIDIA's library gives every exported symbol the version `libcudnn.so.9`
//! (programs linked against it record that version on each import). rustc hands the linker a
//! version script of its own for a cdylib, which overrides ours, so `scripts/capi_build.sh`
//! links the released `libcudnn.so.9` itself, from the crate built as a static library, with
//! `libcudnn.map`. The cdylib cargo builds (`libferrodnn_cudnn.so`) has the soname and
//! unversioned symbols, which the dynamic loader also accepts (with a warning) for programs
//! linked against NVIDIA's library.

use std::fmt::Write as _;

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default() == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcudnn.so.9");
    }
    println!("cargo:rerun-if-changed=stubs.txt");
    let list = std::fs::read_to_string("stubs.txt").expect("ferrodnn-cudnn/stubs.txt");
    let mut out = String::new();
    for (n, line) in list.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (head, params) = line.split_once('(').unwrap_or_else(|| panic!("stubs.txt:{}: no parameter list in `{line}`", n + 1));
        let params = params.strip_suffix(')').unwrap_or_else(|| panic!("stubs.txt:{}: `{line}` does not end with `)`", n + 1));
        let (ret, name) = head.trim().rsplit_once(' ').unwrap_or_else(|| panic!("stubs.txt:{}: no return type in `{line}`", n + 1));
        assert_eq!(ret, "cudnnStatus_t", "stubs.txt:{}: only cudnnStatus_t functions are listed", n + 1);
        let args: Vec<String> = if params.trim() == "..." || params.trim().is_empty() {
            Vec::new()
        } else {
            params.split(',').enumerate().map(|(i, t)| format!("_a{i}: {}", rust_type(t.trim(), n + 1))).collect()
        };
        writeln!(out, "#[no_mangle]\n#[allow(clippy::too_many_arguments)]\npub extern \"C\" fn {name}({}) -> Status {{", args.join(", ")).unwrap();
        writeln!(out, "    static LOGGED: AtomicBool = AtomicBool::new(false);\n    not_supported(\"{name}\", &LOGGED)\n}}").unwrap();
    }
    let dest = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("stubs.rs");
    std::fs::write(dest, out).expect("write the generated stubs");
}

/// The Rust type of a C parameter type of the list: pointers, handles and descriptors are
/// pointers, enums C ints.
fn rust_type(c: &str, line: usize) -> &'static str {
    match c {
        _ if c.ends_with('*') => "*mut c_void",
        "int" | "int32_t" => "i32",
        "unsigned" | "unsigned int" | "uint32_t" => "u32",
        "int64_t" | "long long" => "i64",
        "size_t" => "usize",
        "double" => "f64",
        "float" => "f32",
        "cudnnHandle_t" | "cudaStream_t" | "cudaGraph_t" | "cudnnCallback_t" => "*mut c_void",
        _ if c.ends_with("Descriptor_t") || c.ends_with("Pack_t") || c.ends_with("Plan_t") => "*mut c_void",
        _ if c.starts_with("cudnn") && c.ends_with("_t") => "i32",
        _ => panic!("stubs.txt:{line}: parameter type `{c}` has no mapping in build.rs"),
    }
}
