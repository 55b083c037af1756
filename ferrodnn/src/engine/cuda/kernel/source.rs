//! Kernel text: how a generator writes one kernel ([`Source`], [`Signature`]) and what NVRTC
//! compiles for a launch ([`kernel_text`]).

use super::{Arg, Attr, Launch, Pdl, Target};
use crate::graph::TensorId;
use std::fmt::{Display, Write};

/// Included at the top of every kernel: types, loads and stores by data type, index helpers and
/// the dependent-launch site (`prelude.cuh`).
pub const PRELUDE: &str = include_str!("prelude.cuh");

/// The Hopper helpers the GEMM and attention kernels share (`hopper.cuh`): the tensor-map
/// parameter type, mbarriers, TMA copies, wgmma fences.
pub const HOPPER: &str = include_str!("hopper.cuh");

/// One kernel's text as a generator writes it: the configuration chosen in Rust, as `#define`s
/// (the entry's name and parameter list among them, see [`Source::entry`]), followed by the
/// `.cuh` templates (read with `include_str!`) that read it. This is the one way every generator
/// instantiates device code.
///
/// ```
/// use ferrodnn::engine::cuda::kernel::{Signature, Source};
/// use ferrodnn::graph::TensorId;
/// const TEMPLATE: &str = "extern \"C\" __global__ void KERNEL_NAME(KERNEL_PARAMS) { pdl_site(); y[threadIdx.x] = SCALE; }\n";
/// let mut sig = Signature::new();
/// sig.param("float* y", ferrodnn::engine::cuda::kernel::Arg::Ptr(TensorId(0)));
/// let text = Source::new().entry("n0_fill", &sig).define("SCALE", "2.0f").template(TEMPLATE).build();
/// assert!(text.starts_with("#define KERNEL_NAME n0_fill\n#define KERNEL_PARAMS float* y\n#define SCALE 2.0f\n"));
/// ```
#[derive(Clone, Debug, Default)]
pub struct Source {
    text: String,
    templates: bool,
}

impl Source {
    pub fn new() -> Source {
        Source::default()
    }

    /// `#define name value`. Every define comes before the first template.
    pub fn define(mut self, name: &str, value: impl Display) -> Source {
        debug_assert!(!self.templates, "define `{name}` after a template");
        let _ = writeln!(self.text, "#define {name} {value}");
        self
    }

    /// `#define name 1`, or `0` when `on` is false (for `#if name`).
    pub fn flag(self, name: &str, on: bool) -> Source {
        self.define(name, on as u8)
    }

    /// The entry's name (`KERNEL_NAME`) and parameter list (`KERNEL_PARAMS`), which the template
    /// declares as `extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS)`.
    pub fn entry(self, name: &str, sig: &Signature) -> Source {
        self.define("KERNEL_NAME", name).define("KERNEL_PARAMS", sig.list())
    }

    /// A template (or a header several templates share), after the defines.
    pub fn template(mut self, text: &str) -> Source {
        self.templates = true;
        self.text.push_str(text);
        if !text.ends_with('\n') {
            self.text.push('\n');
        }
        self
    }

    /// The kernel's text, without the prelude ([`kernel_text`] adds it).
    pub fn build(self) -> String {
        self.text
    }
}

/// A kernel's parameter list and the launch arguments that match it, built together so that they
/// cannot disagree.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Signature {
    params: Vec<String>,
    args: Vec<Arg>,
}

impl Signature {
    pub fn new() -> Signature {
        Signature::default()
    }
    /// Any parameter: its C declaration and the argument that fills it.
    pub fn param(&mut self, decl: impl Into<String>, arg: Arg) -> &mut Signature {
        self.params.push(decl.into());
        self.args.push(arg);
        self
    }
    /// A tensor's pointer as `[const ]void* name`.
    pub fn ptr(&mut self, name: &str, id: TensorId, write: bool) -> &mut Signature {
        self.param(format!("{}void* {name}", if write { "" } else { "const " }), Arg::Ptr(id))
    }
    /// A tensor's pointer as `[const ]void* name` and its layout as `TRef t<name>`.
    pub fn tensor(&mut self, name: &str, id: TensorId, write: bool) -> &mut Signature {
        self.ptr(name, id, write).param(format!("TRef t{name}"), Arg::Ref(id))
    }
    /// Scratch buffer `i` of the node as `[const ]<ctype>* name`.
    pub fn scratch(&mut self, ctype: &str, name: &str, i: usize, write: bool) -> &mut Signature {
        self.param(format!("{}{ctype}* {name}", if write { "" } else { "const " }), Arg::Scratch(i))
    }
    /// `long long name`.
    pub fn i64(&mut self, name: &str, v: i64) -> &mut Signature {
        self.param(format!("long long {name}"), Arg::I64(v))
    }
    /// `double name`.
    pub fn f64(&mut self, name: &str, v: f64) -> &mut Signature {
        self.param(format!("double {name}"), Arg::F64(v))
    }
    /// `float name`: a runtime value (see [`Arg::F32`]).
    pub fn f32(&mut self, name: &str, v: f64) -> &mut Signature {
        self.param(format!("float {name}"), Arg::F32(v as f32))
    }
    /// The value of by-value scalar tensor `id` as `double name` (when `double`) or `float name`.
    pub fn scalar(&mut self, name: &str, id: TensorId, double: bool) -> &mut Signature {
        self.attr(name, Attr::Tensor { tensor: id, times: 1.0 }, double)
    }
    /// A node attribute (see [`Attr`]) as `double name` (when `double`) or `float name`.
    pub fn attr(&mut self, name: &str, attr: Attr, double: bool) -> &mut Signature {
        self.param(format!("{} {name}", if double { "double" } else { "float" }), attr.arg(double))
    }
    /// The parameter list, as C.
    pub fn list(&self) -> String {
        self.params.join(", ")
    }
    pub fn args(&self) -> &[Arg] {
        &self.args
    }
    pub fn into_args(self) -> Vec<Arg> {
        self.args
    }
    pub fn len(&self) -> usize {
        self.args.len()
    }
    pub fn is_empty(&self) -> bool {
        self.args.is_empty()
    }
}

/// The text NVRTC compiles for a launch on `target`, exactly: the launch's dependent-launch mode
/// (`FDNN_PDL`), the prelude, then the launch's source; and whether the plan launches it as a
/// programmatic dependent. A kernel is launched as one only where its code calls `pdl_site()`
/// (where it waits for its predecessor): every template does, and a test checks it.
pub fn kernel_text(l: &Launch, target: &Target) -> (String, bool) {
    let dependent = target.pdl && l.pdl != Pdl::Independent && l.source.contains("pdl_site();");
    let mode = match (dependent, l.pdl) {
        (false, _) => 0,
        (true, Pdl::WaitOnly) => 2,
        (true, _) => 1,
    };
    (format!("#define FDNN_PDL {mode}\n{PRELUDE}\n{}", l.source), dependent)
}
