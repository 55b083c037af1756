//! `explain`: what the CUDA engine makes of a graph, without a GPU. For one plan (its knobs), the
//! units in launch order: the nodes each covers (a fusion group or one node), the engine that
//! generated it and the fast engines that declined its node with their reasons, and its kernels
//! with their launch shapes; with `source`, the text of every kernel exactly as NVRTC compiles it.
//!
//! ```
//! use ferrodnn::engine::cuda::{explain, Target};
//! use ferrodnn::{DataType, Graph, TensorDesc};
//! let mut g = Graph::new("scale_relu").io_data_type(DataType::F16);
//! let x = g.tensor(TensorDesc::new("x", &[64, 256], DataType::F16));
//! let s = g.tensor(TensorDesc::new("s", &[1, 256], DataType::F16));
//! let y = g.mul(x, s);
//! let y = g.relu(y);
//! g.set_output(y);
//! let e = explain(&g, &Target::sm90a(), &[]).unwrap();
//! assert_eq!(e.units.len(), 1); // one fused pointwise kernel
//! assert!(e.to_text(false).contains("pointwise fusion"));
//! ```

use super::engine::{candidate_knobs, fused_knob, options_of, runtime_scalars, scalar_launches};
use super::kernel::{kernel_text, Grid, Launch, Target};
use super::planner;
use crate::engine::Knob;
use crate::error::Result;
use crate::graph::Graph;
use serde::Serialize;
use std::fmt::Write;

/// A plan's kernels and how the planner chose them.
#[derive(Clone, Debug, Serialize)]
pub struct Explanation {
    pub graph: String,
    pub arch: String,
    pub sm_count: u32,
    /// The plan's knobs (the engine's first candidate when none were given).
    pub knobs: Vec<Knob>,
    /// Every candidate plan's knobs, best first, as the engine ranks them.
    pub candidates: Vec<Vec<Knob>>,
    pub units: Vec<UnitExplained>,
}

/// One unit of the plan.
#[derive(Clone, Debug, Serialize)]
pub struct UnitExplained {
    /// The nodes it covers, in topological order: (index, op kind, name).
    pub nodes: Vec<(usize, String, String)>,
    /// The engine that generated it.
    pub engine: String,
    /// The fast engines that could have taken its node and declined, with why.
    pub declined: Vec<(String, String)>,
    pub kernels: Vec<KernelExplained>,
    /// The kernels run instead when a buffer is not 16-byte aligned at execute time, and the
    /// tensors whose alignment decides.
    pub unaligned: Vec<KernelExplained>,
    pub unaligned_tensors: Vec<String>,
}

/// One kernel launch.
#[derive(Clone, Debug, Serialize)]
pub struct KernelExplained {
    pub entry: String,
    /// "exact (x, y, z)" or "cover N threads".
    pub grid: String,
    pub block: u32,
    pub shared_bytes: u32,
    pub cluster: Option<(u32, u32, u32)>,
    /// Launched as a programmatic dependent of the kernel before it.
    pub dependent: bool,
    pub args: usize,
    /// The text NVRTC compiles, exactly.
    pub source: String,
}

/// Explains the plan of `graph` with `knobs` (the engine's first candidate when empty) for
/// `target`. The graph is validated first.
pub fn explain(graph: &Graph, target: &Target, knobs: &[Knob]) -> Result<Explanation> {
    let mut g = graph.clone();
    g.validate()?;
    let candidates = candidate_knobs(&g, target.hopper());
    let knobs = if knobs.is_empty() { candidates.first().cloned().unwrap_or_default() } else { knobs.to_vec() };
    let options = options_of(&knobs);
    let planned = planner::plan(&g, target, &options, fused_knob(&knobs))?;
    let kernel = |l: &Launch| {
        let (source, dependent) = kernel_text(l, target);
        let grid = match l.grid {
            Grid::Exact(x, y, z) => format!("exact ({x}, {y}, {z})"),
            Grid::Cover(n) => format!("cover {n} threads"),
        };
        KernelExplained { entry: l.entry.clone(), grid, block: l.block, shared_bytes: l.shared_bytes, cluster: l.cluster, dependent, args: l.args.len(), source }
    };
    // The by-value scalars the variant pack gives: written where kernels read them first.
    let scalars = scalar_launches(&g);
    let scalar_unit = (!scalars.is_empty()).then(|| UnitExplained {
        nodes: Vec::new(),
        engine: "runtime scalars".into(),
        declined: vec![(
            "runtime scalars".into(),
            format!(
                "the variant pack's by-value scalars {} are written where the kernels read them",
                runtime_scalars(&g).iter().map(|&t| format!("\"{}\"", g.tensors[t].name)).collect::<Vec<_>>().join(", ")
            ),
        )],
        kernels: scalars.iter().map(kernel).collect(),
        unaligned: Vec::new(),
        unaligned_tensors: Vec::new(),
    });
    let units = scalar_unit
        .into_iter()
        .chain(planned.iter().map(|p| UnitExplained {
            nodes: p.unit.nodes.iter().map(|&n| (n, g.nodes[n].op.kind().to_string(), g.nodes[n].name.clone())).collect(),
            engine: p.family.name().to_string(),
            declined: p.declined.iter().map(|(f, why)| (f.name().to_string(), why.clone())).collect(),
            kernels: p.unit.kernels.launches.iter().map(kernel).collect(),
            unaligned: p.unit.unaligned.iter().flat_map(|a| a.kernels.launches.iter().map(kernel)).collect(),
            unaligned_tensors: p.unit.unaligned.iter().flat_map(|a| a.tensors.iter().map(|t| g.desc(*t).name.clone())).collect(),
        }))
        .collect();
    Ok(Explanation { graph: g.name.clone(), arch: target.arch.clone(), sm_count: target.sm_count, knobs, candidates, units })
}

impl Explanation {
    /// The explanation as text: one paragraph per unit, and with `source` every kernel's text.
    pub fn to_text(&self, source: bool) -> String {
        let knobs = |k: &[Knob]| k.iter().map(|k| format!("{}={}", k.name, k.value)).collect::<Vec<_>>().join(" ");
        let mut s = String::new();
        let _ = writeln!(s, "graph \"{}\" on {} ({} SMs), plan knobs [{}]", self.graph, self.arch, self.sm_count, knobs(&self.knobs));
        let _ = writeln!(s, "candidate plans, best first: {}", self.candidates.iter().map(|c| format!("[{}]", knobs(c))).collect::<Vec<_>>().join(", "));
        for (i, u) in self.units.iter().enumerate() {
            let nodes: Vec<String> = u.nodes.iter().map(|(n, kind, name)| format!("{n}:{kind} \"{name}\"")).collect();
            let _ = writeln!(s, "\nunit {i}: {} -> {}", nodes.join(", "), u.engine);
            for (engine, why) in &u.declined {
                if *engine == u.engine {
                    let _ = writeln!(s, "  {why}");
                } else {
                    let _ = writeln!(s, "  declined by {engine}: {why}");
                }
            }
            list(&mut s, "kernel ", &u.kernels);
            if !u.unaligned.is_empty() {
                let _ = writeln!(s, "  when {} is not 16-byte aligned:", u.unaligned_tensors.join(" or "));
                list(&mut s, "  kernel ", &u.unaligned);
            }
        }
        if source {
            for k in self.units.iter().flat_map(|u| u.kernels.iter().chain(&u.unaligned)) {
                let _ = writeln!(s, "\n// ===== {} =====\n{}", k.entry, k.source);
            }
        }
        s
    }
}

/// One line per kernel: its entry and launch shape.
fn list(s: &mut String, title: &str, kernels: &[KernelExplained]) {
    for k in kernels {
        let cluster = k.cluster.map(|c| format!(", cluster {c:?}")).unwrap_or_default();
        let dep = if k.dependent { ", dependent launch" } else { "" };
        let _ = writeln!(s, "  {title}{}: grid {}, block {}, shared {} B{cluster}{dep}, {} args", k.entry, k.grid, k.block, k.shared_bytes, k.args);
    }
}
