//! The planner: which kernels run a validated graph. It partitions the graph into units (a node,
//! or a fused group of nodes) and asks each engine family in turn for a unit's kernels: GEMM
//! groups (a matmul with the epilogue it absorbs) and attention first, then the memory-bound
//! kernels (norms with their pointwise prologue, groupnorm with its pointwise epilogue, pointwise
//! chains, rows, batchnorm, instance and group norm, pooling); whatever none of them covers runs
//! on the generic fallback.

use super::kernel::{Options, Target, Unit};
use super::{attention, conv, fallback, fused, gemm, rnn};
use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::ops::Op;
use crate::graph::Graph;
use std::collections::{HashMap, HashSet};

/// The engines of the CUDA engine a unit can come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// Tensor-core GEMM with its fused prologue and epilogue (`gemm/`).
    Gemm,
    /// Convolutions that are matrix products, on the GEMM kernels with their epilogue (`conv/`).
    Conv,
    /// Flash attention forward, backward and decode (`attention/`).
    Attention,
    /// A norm with the pointwise chain that makes its input, in one kernel (`fused/`).
    NormPrologue,
    /// Groupnorm with the pointwise chain after it (its SiLU), in its kernels
    /// (`fused/groupnorm.rs`).
    NormEpilogue,
    /// A chain of pointwise ops in one kernel (`fused/pointwise.rs`).
    Pointwise,
    /// The row kernels: layernorm, rmsnorm, adalayernorm, instance norm over packed rows,
    /// softmax, forward and backward (`fused/`).
    Rows,
    /// Batchnorm, genstats, bn_finalize, channels-last instance norm, group norm and pooling
    /// (`fused/`).
    Spatial,
    /// Recurrent networks, forward and backward (`rnn/`).
    Rnn,
    /// The generic fallback, one kernel (or a few) per node, in double (`fallback/`).
    Fallback,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::Gemm => "gemm",
            Family::Conv => "conv",
            Family::Attention => "attention",
            Family::NormPrologue => "norm+prologue",
            Family::NormEpilogue => "norm+epilogue",
            Family::Pointwise => "pointwise fusion",
            Family::Rows => "rows",
            Family::Spatial => "spatial",
            Family::Rnn => "rnn",
            Family::Fallback => "fallback",
        }
    }
}

/// A unit and how the planner came to it: the engine that generated it, and the fast engines
/// that could have taken its node and declined, each with the reason (a fallback unit whose op
/// no fast engine takes says so as the fallback's own entry).
#[derive(Clone, Debug)]
pub struct Planned {
    pub unit: Unit,
    pub family: Family,
    pub declined: Vec<(Family, String)>,
}

/// The units of a validated graph: with `fused`, memory-bound chains are fused and specialized
/// kernels (GEMM, attention, rows, spatial) replace the fallback's where they apply on `target`;
/// without, one fallback unit per node.
pub fn units(graph: &Graph, target: &Target, options: &Options, fused: bool) -> Result<Vec<Unit>> {
    Ok(plan(graph, target, options, fused)?.into_iter().map(|p| p.unit).collect())
}

/// [`units`], each with its engine and the fast engines that declined it.
pub fn plan(graph: &Graph, target: &Target, options: &Options, fused: bool) -> Result<Vec<Planned>> {
    if fused {
        fused_units(graph, target, options)
    } else {
        graph.topological_order()?.into_iter().map(|ni| fallback_unit(graph, ni, Vec::new())).collect()
    }
}

/// One fallback unit per node, in topological order.
pub fn fallback_units(graph: &Graph) -> Result<Vec<Unit>> {
    units(graph, &Target::sm80(), &Options::default(), false)
}

fn fallback_unit(graph: &Graph, ni: usize, declined: Vec<(Family, String)>) -> Result<Planned> {
    let writes = graph.nodes[ni].outputs.iter().map(|p| p.tensor).collect();
    // An RNN node's fallback is the RNN engine's standard kernels with double accumulators (a
    // recurrence is one algorithm); asked here so that the fallback module does not import the
    // RNN engine, which imports the GEMM engine, which imports the fallback.
    let kernels = if rnn::is_rnn(&graph.nodes[ni].op) { rnn::kernels(graph, ni, true)? } else { fallback::generate(graph, ni)? };
    Ok(Planned { unit: Unit { nodes: vec![ni], kernels, writes, unaligned: None }, family: Family::Fallback, declined })
}

/// The kinds of multi-node groups.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Group {
    Gemm,
    /// A convolution and its epilogue on the GEMM engine, over view `i` of the graph.
    Conv(usize),
    NormPrologue,
    NormEpilogue,
    Pointwise,
}

/// The units of a validated graph with fusion and specialized kernels applied.
fn fused_units(graph: &Graph, target: &Target, options: &Options) -> Result<Vec<Planned>> {
    let order = graph.topological_order()?;
    // Multi-node groups: GEMM groups first (a matmul and the epilogue it absorbs), then norms
    // with the pointwise prologue that makes their input, then pointwise chains among the
    // remaining nodes. Each group runs where its last node (in topological order) would.
    let mut groups: Vec<(Group, Vec<usize>)> = gemm::groups(graph, &order, target, options).into_iter().map(|g| (Group::Gemm, g)).collect();
    // Convolutions that are matrix products, with their epilogues: GEMM groups over a view of
    // the graph (conv/mod.rs).
    let mut views: Vec<conv::View> = Vec::new();
    for &ni in order.iter().filter(|&&n| conv::conv_op(&graph.nodes[n].op)) {
        let Some(view) = conv::as_gemm(graph, ni) else { continue };
        if let Some(g) = gemm::groups_gathered(&view.graph, &[ni], target, options, view.gathers.as_ref()).into_iter().next().filter(|g| view.takes_group(graph, ni, g)) {
            groups.push((Group::Conv(views.len()), g));
            views.push(view);
        }
    }
    let claimed: HashSet<usize> = groups.iter().flat_map(|(_, g)| g.iter().copied()).collect();
    groups.extend(fused::norm::prologue_groups(graph, &order, target).into_iter().filter(|g| g.iter().all(|n| !claimed.contains(n))).map(|g| (Group::NormPrologue, g)));
    let claimed: HashSet<usize> = groups.iter().flat_map(|(_, g)| g.iter().copied()).collect();
    groups.extend(fused::groupnorm::epilogue_groups(graph, &order, target).into_iter().filter(|g| g.iter().all(|n| !claimed.contains(n))).map(|g| (Group::NormEpilogue, g)));
    let claimed: HashSet<usize> = groups.iter().flat_map(|(_, g)| g.iter().copied()).collect();
    groups.extend(fused::pointwise::groups(graph, &order, &claimed).into_iter().map(|g| (Group::Pointwise, g)));
    let mut group_of: HashMap<usize, usize> = HashMap::new();
    for (gi, (_, grp)) in groups.iter().enumerate() {
        for &n in grp {
            group_of.insert(n, gi);
        }
    }
    let position: HashMap<usize, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let mut out = Vec::new();
    for &ni in &order {
        if let Some(&gi) = group_of.get(&ni) {
            let (kind, grp) = &groups[gi];
            let last = grp.iter().copied().max_by_key(|n| position[n]).unwrap_or(ni);
            if ni == last {
                let (unit, family) = match kind {
                    Group::Gemm => (gemm::unit(graph, grp, target, options)?, Family::Gemm),
                    Group::Conv(v) => (conv::group_unit(graph, &views[*v], grp, target, options)?, Family::Conv),
                    Group::NormPrologue => (fused::norm::prologue_unit(graph, grp, target)?, Family::NormPrologue),
                    Group::NormEpilogue => (fused::groupnorm::epilogue_unit(graph, grp, target)?, Family::NormEpilogue),
                    Group::Pointwise => (fused::pointwise::unit(graph, grp)?, Family::Pointwise),
                };
                match unit {
                    Some(unit) => out.push(Planned { unit, family, declined: Vec::new() }),
                    // The group could not be generated after all: run its nodes one by one.
                    None => {
                        let mut nodes = grp.clone();
                        nodes.sort_by_key(|n| position[n]);
                        for n in nodes {
                            let mut p = single(graph, n, target, options)?;
                            p.declined.insert(0, (family, format!("the group of nodes {grp:?} could not be generated as one kernel")));
                            out.push(p);
                        }
                    }
                }
            }
            continue;
        }
        out.push(single(graph, ni, target, options)?);
    }
    Ok(out)
}

/// One node: a specialized kernel when one applies, else the fallback's. Each fast engine that
/// takes the node's kind of op and declines it is recorded.
fn single(graph: &Graph, ni: usize, target: &Target, options: &Options) -> Result<Planned> {
    let op = &graph.nodes[ni].op;
    let mut declined = Vec::new();
    let tries: [(Family, bool); 6] = [
        (Family::Gemm, matches!(op, Op::Matmul(_))),
        (Family::Conv, conv::conv_op(op)),
        (Family::Attention, matches!(op, Op::Sdpa(_) | Op::SdpaBackward(_))),
        (Family::Rnn, rnn::is_rnn(op)),
        (Family::Rows, rows_op(op)),
        (Family::Spatial, spatial_op(op)),
    ];
    for (family, takes) in tries {
        let unit = match family {
            Family::Gemm => gemm::unit(graph, &[ni], target, options)?,
            Family::Conv => conv::unit(graph, ni, target, options)?,
            Family::Attention => attention::unit(graph, ni, target, options)?,
            Family::Rnn => rnn::unit(graph, ni, target, options)?,
            Family::Rows => fused::rows::unit(graph, ni, target)?,
            _ => spatial_unit(graph, ni, target)?,
        };
        match unit {
            Some(unit) => return Ok(Planned { unit, family, declined }),
            None if takes => declined.push((family, decline_reason(graph, ni, family, target))),
            None => {}
        }
    }
    if matches!(op, Op::Pointwise(_)) {
        // A lone pointwise node on the fused pointwise kernels too (vectors, the layouts they
        // read at the bandwidth limit; the fallback's elementwise kernel indexes every operand
        // through its dims: a ReLU backward over a ResNet activation, 100M bf16 elements, took
        // 1.26 ms there on the H200).
        if let Some(unit) = fused::pointwise::single_unit(graph, ni)? {
            return Ok(Planned { unit, family: Family::Pointwise, declined });
        }
        declined.push((
            Family::Pointwise,
            "the fused pointwise kernels do not take this node (they take float tensors, f32 or f64 compute, no gen_index): it runs as one elementwise kernel".into(),
        ));
    }
    if tries.iter().all(|(_, takes)| !takes) && !matches!(op, Op::Pointwise(_)) {
        declined.push((Family::Fallback, format!("no fast engine takes {} yet", op.kind())));
    }
    fallback_unit(graph, ni, declined)
}

/// The ops the row kernels take (under their conditions).
fn rows_op(op: &Op) -> bool {
    matches!(
        op,
        Op::Layernorm(_)
            | Op::Rmsnorm(_)
            | Op::Adalayernorm(_)
            | Op::Softmax(_)
            | Op::LayernormBackward(_)
            | Op::RmsnormBackward(_)
            | Op::AdalayernormBackward(_)
            | Op::SoftmaxBackward(_)
            | Op::Instancenorm(_)
            | Op::InstancenormBackward(_)
    )
}

/// The spatial family's kernels for one node: batchnorm's, instancenorm's, groupnorm's or
/// pooling's.
fn spatial_unit(graph: &Graph, ni: usize, target: &Target) -> Result<Option<Unit>> {
    if let Some(u) = fused::batchnorm::unit(graph, ni, target)? {
        return Ok(Some(u));
    }
    if let Some(u) = fused::instancenorm::unit(graph, ni, target)? {
        return Ok(Some(u));
    }
    if let Some(u) = fused::groupnorm::unit(graph, ni, target)? {
        return Ok(Some(u));
    }
    fused::pooling::unit(graph, ni, target)
}

/// The ops the spatial kernels take (under their conditions).
fn spatial_op(op: &Op) -> bool {
    matches!(
        op,
        Op::Batchnorm(_)
            | Op::BatchnormInference(_)
            | Op::BatchnormBackward(_)
            | Op::Genstats(_)
            | Op::BnFinalize(_)
            | Op::Instancenorm(_)
            | Op::InstancenormBackward(_)
            | Op::Groupnorm(_)
            | Op::GroupnormBackward(_)
            | Op::Resample(_)
            | Op::ResampleBackward(_)
    )
}

/// Why `family` declined node `ni`: what the planner can tell from the node's types and the
/// target, else the family's conditions in general.
fn decline_reason(graph: &Graph, ni: usize, family: Family, target: &Target) -> String {
    let node = &graph.nodes[ni];
    let types: Vec<String> = node.inputs.iter().chain(&node.outputs).map(|p| format!("{}: {}", p.name, graph.resolved_data_type(p.tensor).unwrap_or(DataType::F32))).collect();
    if graph.compute_type(node) == DataType::F64 {
        return "it computes in f64; the fast kernels compute in f32".into();
    }
    if family == Family::Conv {
        return conv::decline_reason(graph, ni);
    }
    let conditions = match family {
        Family::Gemm => "operand types the tensor cores take (f16, bf16, f32 as tf32, fp8), a batch that flattens, layouts its kernels read",
        Family::Conv => conv::CONDITIONS,
        Family::Attention => "f16 or bf16 q/k/v with head dims the kernels take, shared memory for the tiles on this target",
        Family::Rows => "f32/f16/bf16 tensors packed row-major over the normalized axes, rows of at most 32768 elements (16384 backward), a normal f32 epsilon",
        Family::Spatial => "f32/f16/bf16 tensors in the layouts its kernels read (channels-last or packed NCHW), per-channel (groupnorm: per-group) statistics",
        _ => "",
    };
    format!("its conditions are not met on {} ({}); it takes {conditions}", target.arch, types.join(", "))
}

/// Whether the graph has an attention backward whose kernels the `atomics` option changes.
pub fn has_atomic_sdpa_backward(graph: &Graph) -> bool {
    graph.nodes.iter().any(|n| matches!(&n.op, Op::SdpaBackward(a) if attention::atomic_dq_pays(a)))
}

/// Whether the graph has a matmul of two fp8 tensors (its inputs, or the sources of its scaled
/// operands): the `fp8_fast_accum` option changes its kernels.
pub fn has_fp8_matmul(graph: &Graph) -> bool {
    gemm::has_fp8_matmul(graph)
}

/// Whether the graph has a matmul (or a convolution the GEMM kernels run) with an f32 input: the
/// `tf32` option changes its kernels.
pub fn has_f32_matmul(graph: &Graph) -> bool {
    graph.nodes.iter().enumerate().any(|(ni, n)| {
        let gemm = matches!(n.op, Op::Matmul(_)) || (conv::conv_op(&n.op) && conv::as_gemm(graph, ni).is_some());
        gemm && n.inputs.iter().any(|p| graph.resolved_data_type(p.tensor).unwrap_or(DataType::F32) == DataType::F32)
    })
}
