//! What kernel generation may assume: the device ([`Target`]) and the plan's options
//! ([`Options`]). A kernel's text is a pure function of the graph, the target and the options.

/// The device kernels are generated for: the NVRTC architecture (`sm_80`, `sm_90a`, ...), the
/// number of SMs (for one-wave and persistent grids) and whether kernels may be launched as
/// programmatic dependents.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub arch: String,
    pub sm_count: u32,
    /// Programmatic dependent launch (sm_90 or newer, with `cuLaunchKernelEx`): each kernel
    /// launched as a [`Pdl::Dependent`](super::Pdl) waits at its `pdl_site()` for the kernels
    /// before it and then lets the next one launch, so that a kernel's launch and the scheduling
    /// of its blocks overlap its predecessor's last wave instead of following it.
    pub pdl: bool,
}

impl Target {
    /// A target with programmatic dependent launch where the architecture has it.
    pub fn new(arch: &str, sm_count: u32) -> Target {
        let mut t = Target { arch: arch.to_string(), sm_count, pdl: false };
        t.pdl = t.cc() >= 90;
        t
    }
    /// This target with programmatic dependent launch on or off (off below sm_90).
    pub fn with_pdl(mut self, on: bool) -> Target {
        self.pdl = on && self.cc() >= 90;
        self
    }
    /// An A100 (sm_80, 108 SMs): the mma.sync / cp.async generation.
    pub fn sm80() -> Target {
        Target::new("sm_80", 108)
    }
    /// An H100 SXM (sm_90a, 132 SMs): wgmma, TMA, clusters.
    pub fn sm90a() -> Target {
        Target::new("sm_90a", 132)
    }
    /// The compute capability as a number: 80, 86, 89, 90, ...
    pub fn cc(&self) -> u32 {
        self.arch.trim_start_matches("sm_").trim_end_matches('a').parse().unwrap_or(80)
    }
    /// Hopper's arch-specific features (wgmma, setmaxnreg) need the `a` target (`sm_90a`).
    pub fn hopper(&self) -> bool {
        self.arch == "sm_90a"
    }
}

/// What a plan's knobs ask of kernel generation, and the process's tuning switches.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Options {
    /// The tuning switches ([`Tuning::get`]).
    pub tuning: Tuning,
    /// f32 matmuls may run as tf32 (one tensor-core pass on inputs rounded to a 10-bit mantissa)
    /// instead of 3xTF32 (about f32 accuracy): the `tf32` knob, which makes the plan's behavior
    /// notes say reduced precision.
    pub tf32: bool,
    /// fp8 matmuls may accumulate in the tensor cores' own adder (Hopper's fp8 `wgmma`, twice
    /// the 16-bit rate, whose sums keep fewer bits than f32: cuBLASLt's "fast accumulation")
    /// instead of converting to f16 and accumulating in f32: the `fp8_fast_accum` knob, which
    /// makes the plan's behavior notes say reduced precision.
    pub fp8_fast_accum: bool,
    /// Kernels may accumulate with float atomics, whose order varies from run to run: the
    /// `atomics` knob (attention backward's dQ in one pass over K/V), which makes the plan's
    /// behavior notes say non-deterministic.
    pub atomics: bool,
    /// Each Hopper GEMM runs in the configuration its autotuning kept (`gemm::tune`), where there
    /// is one: the `autotune` knob.
    pub autotune: bool,
    /// Every Hopper GEMM runs in tuning candidate `i` of its problem (`sm90::tuning_configs`;
    /// the heuristic's where there is no such candidate): the `gemm_config` knob of the plans an
    /// autotuning times.
    pub gemm_config: Option<u8>,
}

impl Options {
    /// These options with f32 matmuls allowed (or not) to run as tf32.
    pub fn with_tf32(mut self, allow: bool) -> Options {
        self.tf32 = allow;
        self
    }
    /// These options with fp8 matmuls allowed (or not) to accumulate in the tensor cores' adder.
    pub fn with_fp8_fast_accum(mut self, allow: bool) -> Options {
        self.fp8_fast_accum = allow;
        self
    }
    /// These options with float atomics allowed (or not).
    pub fn with_atomics(mut self, allow: bool) -> Options {
        self.atomics = allow;
        self
    }
}

/// Tuning switches: developer settings for comparing a kernel variant against the default in the
/// benchmark harness, each read from its environment variable once per process. They are part of
/// every plan's key ([`Tuning::key`]), so a plan built under one setting is never reused under
/// another. The defaults are what the heuristics measured best. Every switch is listed here and
/// nowhere else:
///
/// | variable | default | effect |
/// |---|---|---|
/// | `FERRODNN_PDL=0` | on | no programmatic dependent launches: every kernel an ordinary launch |
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tuning {
    /// Launch kernels as programmatic dependents where the device allows (`FERRODNN_PDL`).
    pub pdl: bool,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning { pdl: true }
    }
}

impl Tuning {
    /// The switches of this process, read from the environment on first use.
    pub fn get() -> &'static Tuning {
        static TUNING: std::sync::OnceLock<Tuning> = std::sync::OnceLock::new();
        TUNING.get_or_init(|| Tuning::from_env(|name| std::env::var(name).ok()))
    }

    /// The switches as `var` reads them (the defaults where a variable is unset or unparsable).
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Tuning {
        let mut t = Tuning::default();
        if let Some(v) = var("FERRODNN_PDL") {
            t.pdl = v != "0";
        }
        t
    }

    /// What of these switches differs from the defaults, as text for plan keys ("" for the
    /// defaults).
    pub fn key(&self) -> String {
        let d = Tuning::default();
        let mut parts = Vec::new();
        if self.pdl != d.pdl {
            parts.push(format!("pdl={}", self.pdl as u8));
        }
        parts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::Tuning;

    #[test]
    fn tuning_reads_its_switches_and_keys_what_differs() {
        let t = Tuning::from_env(|_| None);
        assert_eq!(t, Tuning::default());
        assert_eq!(t.key(), "");
        let off = Tuning::from_env(|n| (n == "FERRODNN_PDL").then(|| "0".to_string()));
        assert!(!off.pdl);
        assert_eq!(off.key(), "pdl=0");
    }
}
