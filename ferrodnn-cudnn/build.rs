//! The shared library's identity: the soname programs linked against NVIDIA's cuDNN 9 ask for.
//!
//! Symbol versions: NVIDIA's library gives every exported symbol the version `libcudnn.so.9`
//! (programs linked against it record that version on each import). rustc hands the linker a
//! version script of its own for a cdylib, which overrides ours, so `scripts/capi_build.sh`
//! links the released `libcudnn.so.9` itself, from the crate built as a static library, with
//! `libcudnn.map`. The cdylib cargo builds (`libferrodnn_cudnn.so`) has the soname and
//! unversioned symbols, which the dynamic loader also accepts (with a warning) for programs
//! linked against NVIDIA's library.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default() == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcudnn.so.9");
    }
}
