//! The GEMM engine: matmul on tensor cores with a fused prologue and epilogue.
//!
//! [`groups`] finds each matmul and the pointwise epilogue it absorbs; [`unit`] generates the
//! kernels of a group for the target (wgmma + TMA on sm_90a, mma.sync elsewhere), or returns
//! `None` so the group's nodes run on the other engines.
//!
//! The pieces are separate so that convolution can reuse them: a [`GemmProblem`] says what to
//! multiply (operands as strided matrices, or gathered through index maps: [`gather`], a
//! convolution's implicit GEMM), an [`Epilogue`] what to do with each accumulator before it is
//! stored, and the kernel generators (`sm90`, `sm80`) how.

pub mod epilogue;
pub mod gather;
pub mod sm80;
pub mod sm90;
pub mod tune;

use super::kernel::{Arg, Options, Signature, Target, Unit};
use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::ops::pointwise::PointwiseMode;
use crate::graph::ops::reduction::ReductionMode;
use crate::graph::ops::Op;
use crate::graph::{Graph, TensorDesc, TensorId};
use std::collections::HashMap;

/// One matrix operand: element `(batch, row, col)` lies at
/// `batch * batch_stride + row * row_stride + col * col_stride` elements from the tensor's
/// pointer. A (`m x k`), B (`k x n`), and the stored result C (`m x n`).
#[derive(Clone, Debug, PartialEq)]
pub struct Operand {
    pub tensor: TensorId,
    pub dtype: DataType,
    pub rows: usize,
    pub cols: usize,
    pub row_stride: i64,
    pub col_stride: i64,
    /// 0 when the operand is broadcast over the batch. A gathered operand's is its offset per
    /// group instead ([`GemmProblem::groups`]).
    pub batch_stride: i64,
    /// Addressed through an index map instead of the strides (an implicit GEMM's operand,
    /// [`gather`]).
    pub gather: Option<Box<gather::Gather>>,
}

/// `C[b] = epilogue(A[b] x B[b])` for `b < batch`, accumulated in f32 (f64 for f64 inputs).
#[derive(Clone, Debug, PartialEq)]
pub struct GemmProblem {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: Operand,
    pub b: Operand,
    pub c: Operand,
    /// Groups of a grouped convolution (1 otherwise; only with gathered operands): the batch is
    /// images x groups, groups inner. Batch `b` reads group `b % groups` of each gathered
    /// operand (its map's element plus `(b % groups) * batch_stride`), and rows of image
    /// `b / groups` (a pixel index along A's m continues over the images); C and the epilogue see
    /// the batch as it is (C's view has the groups as a batch dim).
    pub groups: usize,
    /// f32 inputs may run as tf32 (the plan's `tf32` knob, `Options::tf32`: its behavior
    /// notes then say reduced precision); otherwise f32 runs as 3xTF32 (about f32 accuracy).
    pub allow_tf32: bool,
    /// fp8 inputs may accumulate in the tensor cores' adder (the plan's `fp8_fast_accum` knob,
    /// `Options::fp8_fast_accum`: reduced precision); otherwise they are converted to f16
    /// and accumulated in f32.
    pub fast_fp8: bool,
}

/// What happens to each accumulator before it is stored: the group's pointwise nodes after the
/// matmul, as one device function
/// `__device__ __forceinline__ float epilogue(float acc, long long batch, long long row, long long col EPI_PARAMS)`
/// (the `code`, `epilogue.cuh` instantiated, which also defines the `fz_*` conversions of
/// `pointwise/convert.cuh` and the `pw_*` ops of `pointwise/ops.cuh`), whose extra
/// parameters are declared by `params` (`, const void* __restrict__ e0, ...`: one pointer per
/// side input, offsets baked in; then `, float ea0, ...`: the chain's by-value scalars and
/// attributes) and passed by `names` (`, e0, ..., ea0, ...`); a kernel appends `params` to its
/// own parameter list and `args` to its own args, and names no variable `e<i>` or `ea<j>`
/// (`epilogue_v` and `epilogue_u` are macros that pass the `ea<j>` on). `batch`
/// is the row-major flat index over C's batch dims. An empty epilogue returns `acc`; C's
/// rounding to its type is the kernel's store.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Epilogue {
    /// The pointwise nodes absorbed, in topological order.
    pub nodes: Vec<usize>,
    pub code: String,
    pub params: String,
    pub names: String,
    pub args: Vec<Arg>,
    /// The side inputs' layouts, in parameter order, when `code` also defines
    /// `float epilogue_v(float acc, float x0, ...)` (the chain as a function of the side values,
    /// see `epilogue.rs`); None for a hand-written epilogue that defines only `epilogue`.
    pub sides: Option<Vec<epilogue::Side>>,
    /// The chain ends in a plain relu (`epilogue.rs`) and `code` also defines
    /// `float epilogue_u(float acc, float x0, ...)`: `epilogue_v` without that relu, for a kernel
    /// whose conversion to C's 16-bit type applies it (`cvt.rn.relu`).
    pub relu_last: bool,
    /// A reduction of the stored C (over all of it, its rows or its columns), folded into the
    /// kernel ([`Tap`]).
    pub tap: Option<Tap>,
    /// An 8-bit integer GEMM whose chain only passes the exact sums on (identity nodes, integer
    /// values) into an integer C: the kernel stores its i32 accumulators as they are (saturated
    /// to C's type), not through the f32 epilogue.
    pub int_exact: bool,
}

/// A reduction node that the GEMM computes from the values it stores: `y = reduce(C)` over every
/// element, along each row (`y [.., m, 1]`) or along each column (`y [.., 1, n]`), for max, min,
/// amax (an fp8 recipe's next scale is made from a GEMM output's amax, per tensor or per row) and
/// sums. The kernel folds the values as stored (rounded to C's type) into partials, one per
/// tile and warp (or row, or column), in the workspace, and a second launch folds the partials in
/// a fixed order, so the result does not depend on the schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct Tap {
    pub node: usize,
    pub mode: ReductionMode,
    pub axes: TapAxes,
    /// The reduction's output, its type and strides (elements; its dims are C's with the reduced
    /// ones 1).
    pub y: TensorId,
    pub dtype: DataType,
    pub y_dims: Vec<i64>,
    pub y_strides: Vec<i64>,
}

/// What a [`Tap`] reduces over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TapAxes {
    /// Every element: one value.
    All,
    /// Each row of each batch: along the columns.
    Rows,
    /// Each column of each batch: along the rows.
    Cols,
}

impl Tap {
    /// The tap of reduction node `n` over `out`, when it is one: mode max, min, amax or add,
    /// over all of `out`'s axes, or its last (rows) or second-last (columns) alone, an output in
    /// f32, f16 or bf16 with non-negative strides.
    fn of(graph: &Graph, n: usize, out: TensorId) -> Option<Tap> {
        let node = graph.nodes.get(n)?;
        let Op::Reduction(attrs) = &node.op else { return None };
        if !matches!(attrs.mode, ReductionMode::Amax | ReductionMode::Max | ReductionMode::Min | ReductionMode::Add) || node.input("x")? != out {
            return None;
        }
        let rank = graph.desc(out).dims.len();
        let mut axes = attrs.axes.clone();
        axes.sort_unstable();
        axes.dedup();
        let kind = if axes == (0..rank).collect::<Vec<_>>() {
            TapAxes::All
        } else if rank >= 2 && axes == [rank - 1] {
            TapAxes::Rows
        } else if rank >= 2 && axes == [rank - 2] {
            TapAxes::Cols
        } else {
            return None;
        };
        let y = node.output("y")?;
        let dt = dtype(graph, y);
        let yd = graph.desc(y);
        if !side_type(dt) || node.outputs.len() != 1 || yd.strides.len() != rank || yd.strides.iter().any(|&s| s < 0) {
            return None;
        }
        Some(Tap { node: n, mode: attrs.mode, axes: kind, y, dtype: dt, y_dims: yd.dims.clone(), y_strides: yd.strides.clone() })
    }
}

/// A pointwise node that scales a matmul operand, `a' = x * s` (mul or scale), moved into the
/// epilogue: the GEMM reads `x` and multiplies each result by `s` instead, which the product's
/// linearity allows for a scale per tensor, per row of A (`s [.., m, 1]`) or per column of B
/// (`s [.., 1, n]`). Only where the scaled operand is f32 (so the CPU engine's stored `a'` is the
/// exact product to 2^-24, as the GEMM's own) and read by the matmul alone; this is how an fp8
/// GEMM with dequantizing scales reads as a graph (`(a8 * sa) x (b8 * sb)`): it then runs as the
/// fp8 GEMM it is, with the scales in the epilogue.
#[derive(Clone, Debug, PartialEq)]
pub struct Prologue {
    pub node: usize,
    /// The operand's source and its scale (a by-value scalar or a tensor).
    pub src: TensorId,
    pub scale: TensorId,
}

impl Prologue {
    /// The prologue of operand `port` ("a" or "b") of matmul `mm`, when there is one.
    fn of(graph: &Graph, mm: usize, port: &str, cons: &HashMap<usize, Vec<usize>>) -> Option<Prologue> {
        let node = graph.nodes.get(mm)?;
        let t = node.input(port)?;
        let d = graph.desc(t);
        // (Both operands one tensor: the GEMM would read the unscaled tensor for one of them.)
        if node.input("a") == node.input("b") || !d.is_virtual || d.is_pass_by_value || dtype(graph, t) != DataType::F32 || cons.get(&t.0)? != &vec![mm] {
            return None;
        }
        let (n, node) = graph.nodes.iter().enumerate().find(|(_, n)| n.outputs.iter().any(|o| o.tensor == t))?;
        let Op::Pointwise(attrs) = &node.op else { return None };
        if !matches!(attrs.mode, PointwiseMode::Mul | PointwiseMode::Scale) || node.inputs.len() != 2 || node.outputs.len() != 1 || graph.compute_type(node) != DataType::F32 {
            return None;
        }
        let rank = d.dims.len();
        let (x, s) = (node.input("a")?, node.input("b")?);
        for (src, scale) in [(x, s), (s, x)] {
            let (sd, xd) = (graph.desc(scale), graph.desc(src));
            if xd.is_pass_by_value || xd.dims != d.dims {
                continue;
            }
            let ok = if sd.is_pass_by_value {
                sd.value.is_some()
            } else {
                // Ones but for A's rows (dim rank - 2) or B's columns (dim rank - 1).
                let keep = if port == "a" { rank - 2 } else { rank - 1 };
                let shift = rank.saturating_sub(sd.dims.len());
                !sd.is_virtual
                    && side_type(dtype(graph, scale))
                    && sd.dims.len() <= rank
                    && sd.strides.len() == sd.dims.len()
                    && sd.strides.iter().all(|&st| st >= 0)
                    && sd.dims.iter().enumerate().all(|(i, &e)| e == 1 || (i + shift == keep && e == d.dims[keep]))
            };
            if ok {
                return Some(Prologue { node: n, src, scale });
            }
        }
        None
    }
}

/// Whether the graph has a matmul of two fp8 tensors: its inputs, or the sources of its
/// operands' [`Prologue`]s.
pub fn has_fp8_matmul(graph: &Graph) -> bool {
    let cons = graph.consumers();
    graph.nodes.iter().enumerate().filter(|(_, n)| matches!(n.op, Op::Matmul(_))).any(|(mm, node)| {
        ["a", "b"].iter().all(|port| {
            let src = Prologue::of(graph, mm, port, &cons).map(|p| p.src).or_else(|| node.input(port));
            src.is_some_and(|t| dtype(graph, t).is_fp8())
        })
    })
}

/// A reduction node reading `out` that could be the GEMM's tap ([`Tap::of`]).
fn tap_candidate(graph: &Graph, out: TensorId, cons: &HashMap<usize, Vec<usize>>) -> Option<usize> {
    cons.get(&out.0)?.iter().copied().find(|&n| Tap::of(graph, n, out).is_some())
}

impl Epilogue {
    /// The empty epilogue (C = the accumulator), with `epilogue_v`.
    pub fn identity() -> Epilogue {
        epilogue::identity()
    }
}

/// Groups of nodes to run as one GEMM: the matmul first, then the epilogue nodes it absorbs,
/// in topological order. Only matmuls this engine runs and that absorb at least one node form
/// a group (a lone matmul is asked for through [`unit`] with one node).
pub fn groups(graph: &Graph, order: &[usize], target: &Target, options: &Options) -> Vec<Vec<usize>> {
    groups_gathered(graph, order, target, options, None)
}

/// [`groups`], where `gathers` (when some) addresses the operands of one matmul through index
/// maps (a convolution's view graph, `conv/`).
pub fn groups_gathered(graph: &Graph, order: &[usize], target: &Target, options: &Options, gathers: Option<&gather::Gathers>) -> Vec<Vec<usize>> {
    let cons = graph.consumers();
    let mut out = Vec::new();
    for &ni in order {
        if !matches!(graph.nodes.get(ni).map(|n| &n.op), Some(Op::Matmul(_))) {
            continue;
        }
        let chain = epilogue_chain(graph, ni, &cons);
        let Some(c) = graph.nodes[ni].output("c") else { continue };
        let last = chain.last().and_then(|&n| graph.nodes[n].outputs.first()).map_or(c, |p| p.tensor);
        // The operands' scales moved into the epilogue, and the reduction of the output folded
        // in, where the kernels can; else without.
        let pro: Vec<usize> = ["a", "b"].iter().filter_map(|port| Prologue::of(graph, ni, port, &cons)).map(|p| p.node).collect();
        let tap = tap_candidate(graph, last, &cons);
        let mut tries = Vec::new();
        for with_pro in [true, false] {
            for with_tap in [true, false] {
                if (with_pro && pro.is_empty()) || (with_tap && tap.is_none()) {
                    continue;
                }
                let mut nodes: Vec<usize> = if with_pro { pro.clone() } else { Vec::new() };
                nodes.push(ni);
                nodes.extend(&chain);
                nodes.extend(tap.filter(|_| with_tap));
                if nodes.len() > 1 {
                    tries.push(nodes);
                }
            }
        }
        if let Some(nodes) = tries.into_iter().find(|n| plan_group(graph, n, target, options, gathers).is_some()) {
            out.push(nodes);
        }
    }
    out
}

/// The unit of a GEMM group (or of a single matmul node), when this engine runs it.
pub fn unit(graph: &Graph, nodes: &[usize], target: &Target, options: &Options) -> Result<Option<Unit>> {
    unit_gathered(graph, nodes, target, options, None)
}

/// [`unit`] with [`groups_gathered`]'s index maps.
pub fn unit_gathered(graph: &Graph, nodes: &[usize], target: &Target, options: &Options, gathers: Option<&gather::Gathers>) -> Result<Option<Unit>> {
    let Some((problem, epi)) = plan_group(graph, nodes, target, options, gathers) else { return Ok(None) };
    if target.hopper() {
        if let Some(u) = sm90::unit(graph, nodes, &problem, &epi, target, options)? {
            return Ok(Some(u));
        }
    }
    // Only the Hopper kernel folds a reduction in (the group then runs node by node).
    if epi.tap.is_some() {
        return Ok(None);
    }
    sm80::unit(graph, nodes, &problem, &epi, target)
}

/// The GEMM problems of a graph that an autotuning can time on `target` (the Hopper kernel, more
/// than one candidate configuration), each with its operands' and output's descriptions (for a
/// graph of the matmul alone, see `CudaEngine::tune_gemms`).
pub fn tunable_problems(graph: &Graph, target: &Target, options: &Options) -> Vec<(GemmProblem, [TensorDesc; 3])> {
    if !target.hopper() {
        return Vec::new();
    }
    let Ok(order) = graph.topological_order() else { return Vec::new() };
    let grouped = groups(graph, &order, target, options);
    let lone = order.iter().filter(|&&n| matches!(graph.nodes[n].op, Op::Matmul(_)) && !grouped.iter().any(|g| g.contains(&n))).map(|&n| vec![n]);
    let mut out: Vec<(GemmProblem, [TensorDesc; 3])> = Vec::new();
    for nodes in grouped.iter().cloned().chain(lone) {
        let Some((p, _)) = plan_group(graph, &nodes, target, options, None) else { continue };
        let (a, b) = (p.a.tensor, p.b.tensor);
        if sm90::reject(&p, target).is_some() || sm90::tuning_configs(&p, target).len() < 2 || out.iter().any(|(q, _)| *q == p) {
            continue;
        }
        let with_type = |t: TensorId| {
            let mut d = graph.desc(t).clone();
            d.data_type = Some(dtype(graph, t));
            d
        };
        let descs = [with_type(a), with_type(b), with_type(p.c.tensor)];
        out.push((p, descs));
    }
    out
}

/// The problem and epilogue of a group `[matmul, epilogue nodes..., tap?]`, when this engine
/// takes it: the nodes must form a valid epilogue chain (checked again here: `unit` is also asked
/// about single nodes of any kind), and a last reduction node must be a [`Tap`] of the chain's
/// output that the Hopper kernel's configuration for the problem can fold in.
fn plan_group(graph: &Graph, nodes: &[usize], target: &Target, options: &Options, gathers: Option<&gather::Gathers>) -> Option<(GemmProblem, Epilogue)> {
    let at = nodes.iter().position(|&n| matches!(graph.nodes.get(n).map(|n| &n.op), Some(Op::Matmul(_))))?;
    let (pro_nodes, nodes) = nodes.split_at(at);
    let (&mm, rest) = nodes.split_first()?;
    let gathers = gathers.filter(|g| g.node == mm);
    // A gathered operand is read through its map, not through a prologue's source.
    if gathers.is_some() && !pro_nodes.is_empty() {
        return None;
    }
    // The operands' prologues (each node the prologue of A or of B), their sources and scales.
    let cons = graph.consumers();
    let (mut a_src, mut b_src) = (graph.nodes[mm].input("a")?, graph.nodes[mm].input("b")?);
    let mut scales = Vec::new();
    let (pa, pb) = (Prologue::of(graph, mm, "a", &cons), Prologue::of(graph, mm, "b", &cons));
    for &pn in pro_nodes {
        let (src, p) = match (&pa, &pb) {
            (Some(p), _) if p.node == pn => (&mut a_src, p),
            (_, Some(p)) if p.node == pn => (&mut b_src, p),
            _ => return None,
        };
        *src = p.src;
        scales.push(p.scale);
    }
    let (chain, tap) = match rest.split_last() {
        Some((&t, chain)) if matches!(graph.nodes.get(t)?.op, Op::Reduction(_)) => (chain, Some(t)),
        _ => (rest, None),
    };
    let full = epilogue_chain(graph, mm, &cons);
    if full.len() < chain.len() || full[..chain.len()] != *chain {
        return None;
    }
    let c = graph.nodes[mm].output("c")?;
    let out = match chain.last() {
        Some(&n) => graph.nodes[n].outputs.first()?.tensor,
        None => c,
    };
    let p = problem_of(graph, mm, a_src, b_src, out, target, options, gathers)?;
    let mut epi = epilogue::build(graph, mm, &scales, chain)?;
    // An integer GEMM whose chain passes its exact sums on into an integer C.
    let int_values = std::iter::once(c).chain(chain.iter().map(|&n| graph.nodes[n].outputs[0].tensor)).all(|t| dtype(graph, t).is_integer());
    epi.int_exact = byte_int(p.a.dtype) && byte_int(p.b.dtype) && scales.is_empty() && chain.iter().all(|&n| int_identity(graph, n)) && int_values;
    if let Some(t) = tap {
        let tap = Tap::of(graph, t, out)?;
        if !target.hopper() || !sm90::takes_tap(&p, target, options) {
            return None;
        }
        epi.tap = Some(tap);
    }
    Some((p, epi))
}

fn dtype(graph: &Graph, id: TensorId) -> DataType {
    graph.resolved_data_type(id).unwrap_or(DataType::F32)
}

/// What every GEMM template reads first (`common.cuh`): the data type codes.
const COMMON: &str = include_str!("common.cuh");

/// A data type as the GEMM templates name it (`common.cuh`): `DT_bf16`, `DT_fp8_e4m3`, ...
fn dt_code(dt: DataType) -> String {
    format!("DT_{}", dt.name())
}

/// The epilogue's extra parameters (`Epilogue::params`: one declaration per argument of
/// `Epilogue::args`) appended to a kernel's signature.
fn epilogue_params(sig: &mut Signature, epi: &Epilogue) {
    let decls: Vec<&str> = epi.params.split(',').map(str::trim).filter(|d| !d.is_empty()).collect();
    debug_assert_eq!(decls.len(), epi.args.len(), "epilogue parameters `{}` for {} arguments", epi.params, epi.args.len());
    for (decl, arg) in decls.into_iter().zip(&epi.args) {
        sig.param(decl, arg.clone());
    }
}

/// Types an epilogue reads side inputs in, and keeps intermediate values in.
fn side_type(dt: DataType) -> bool {
    matches!(dt, DataType::F32 | DataType::F16 | DataType::Bf16)
}

/// Types a GEMM kernel stores C in; integer types (i32, i8, u8: rounded and saturated) after
/// an integer GEMM's accumulators (`int_acc`).
fn store_type(dt: DataType, int_acc: bool) -> bool {
    matches!(dt, DataType::F32 | DataType::F16 | DataType::Bf16 | DataType::Fp8E4m3 | DataType::Fp8E5m2) || (int_acc && matches!(dt, DataType::I32 | DataType::I8 | DataType::U8))
}

/// An 8-bit integer type, which the tensor cores multiply exactly into i32 sums.
pub(crate) fn byte_int(dt: DataType) -> bool {
    matches!(dt, DataType::I8 | DataType::U8)
}

/// Whether matmul node `mm` multiplies 8-bit integers (its accumulators are i32 sums).
fn int_gemm(graph: &Graph, mm: usize) -> bool {
    let node = &graph.nodes[mm];
    ["a", "b"].iter().all(|p| node.input(p).is_some_and(|t| byte_int(dtype(graph, t))))
}

/// An identity node computing in an integer type: after an integer GEMM it passes the exact sums
/// on as they are.
fn int_identity(graph: &Graph, n: usize) -> bool {
    let node = &graph.nodes[n];
    matches!(&node.op, Op::Pointwise(a) if a.mode == PointwiseMode::Identity) && graph.compute_type(node).is_integer()
}

/// Whether `d` broadcasts to `out` (numpy: right-aligned, each dim equal or 1) with
/// non-negative strides.
fn broadcasts_to(d: &TensorDesc, out: &[i64]) -> bool {
    d.dims.len() <= out.len()
        && d.strides.len() == d.dims.len()
        && d.strides.iter().all(|&s| s >= 0)
        && d.dims.iter().zip(&out[out.len() - d.dims.len()..]).all(|(&a, &b)| a == 1 || a == b)
}

/// The pointwise nodes after matmul `mm` that can run in its epilogue, in order: each reads
/// the previous value (virtual, read by this node only, with c's dims) and otherwise only
/// by-value constants and non-virtual float tensors that broadcast to c; computes in f32; gives
/// c's dims. Cut so that intermediate values are f32 (or 16-bit under a 16-bit or fp8 output,
/// rounded as the CPU engine stores them) and the last output is a type C can be stored in.
/// After an 8-bit integer GEMM, the chain may begin with identity nodes computing in an integer
/// type (cudnn-frontend's int8 convolution has one), and the values up to them may be i32: the
/// exact sums.
pub(crate) fn epilogue_chain(graph: &Graph, mm: usize, cons: &HashMap<usize, Vec<usize>>) -> Vec<usize> {
    let Some(c) = graph.nodes.get(mm).and_then(|n| n.output("c")) else { return Vec::new() };
    let int_acc = int_gemm(graph, mm);
    let cdims = graph.desc(c).dims.clone();
    let mut chain = Vec::new();
    let mut prev = c;
    loop {
        let pd = graph.desc(prev);
        if !pd.is_virtual || pd.is_pass_by_value {
            break;
        }
        let Some(readers) = cons.get(&prev.0) else { break };
        if readers.len() != 1 {
            break;
        }
        let p = readers[0];
        let node = &graph.nodes[p];
        let Op::Pointwise(attrs) = &node.op else { break };
        let mode = attrs.mode;
        if matches!(mode, PointwiseMode::GenIndex { .. }) || node.outputs.len() != 1 || node.outputs[0].name != "y" {
            break;
        }
        let ports = ["a", "b", "c"];
        let arity = mode.arity();
        if arity > 3 || node.inputs.len() != arity || node.inputs.iter().any(|q| !ports[..arity].contains(&q.name.as_str())) {
            break;
        }
        let int_prefix = int_acc && chain.iter().all(|&n| int_identity(graph, n));
        if graph.compute_type(node) != DataType::F32 && !(int_prefix && int_identity(graph, p)) {
            break;
        }
        let y = node.outputs[0].tensor;
        let yd = graph.desc(y);
        if yd.is_pass_by_value || yd.dims != cdims || yd.strides.len() != yd.dims.len() || !store_type(dtype(graph, y), int_acc) {
            break;
        }
        let sides_ok = node.inputs.iter().all(|q| {
            if q.tensor == prev {
                return true;
            }
            let d = graph.desc(q.tensor);
            if d.is_pass_by_value {
                return d.value.is_some();
            }
            !d.is_virtual && side_type(dtype(graph, q.tensor)) && broadcasts_to(d, &cdims)
        });
        if !sides_ok {
            break;
        }
        chain.push(p);
        prev = y;
    }
    // Cut to the longest prefix whose value types work.
    while !chain.is_empty() {
        let outs: Vec<TensorId> = std::iter::once(c).chain(chain.iter().map(|&n| graph.nodes[n].outputs[0].tensor)).collect();
        let (last, inner) = outs.split_last().expect("non-empty");
        let lt = dtype(graph, *last);
        // (outs[..=exact]: the integer GEMM's sums and its integer identities' values.)
        let exact = if int_acc { chain.iter().take_while(|&&n| int_identity(graph, n)).count() } else { 0 };
        let ok = store_type(lt, int_acc)
            && inner.iter().enumerate().all(|(i, &t)| {
                let dt = dtype(graph, t);
                dt == DataType::F32 || (lt != DataType::F32 && side_type(dt)) || (int_acc && i <= exact && dt == DataType::I32)
            });
        if ok {
            break;
        }
        chain.pop();
    }
    chain
}

/// One linear batch stride for an operand whose batch dims (right-aligned with `out_batch`,
/// size-1 dims broadcast) are `dims`/`strides`, when the row-major flat batch index over
/// `out_batch` times it gives the operand's batch offset; None otherwise.
fn linear_batch_stride(dims: &[i64], strides: &[i64], out_batch: &[i64]) -> Option<i64> {
    if dims.len() > out_batch.len() {
        return None;
    }
    let shift = out_batch.len() - dims.len();
    // (size, effective stride) of the output's batch dims of size > 1, innermost first.
    let mut axes = Vec::new();
    for a in (0..out_batch.len()).rev() {
        if out_batch[a] == 1 {
            continue;
        }
        let e = if a < shift {
            0
        } else {
            let (d, s) = (dims[a - shift], strides[a - shift]);
            if d == 1 {
                0
            } else if d == out_batch[a] {
                s
            } else {
                return None;
            }
        };
        axes.push((out_batch[a], e));
    }
    if axes.iter().all(|&(_, e)| e == 0) {
        return Some(0);
    }
    for w in axes.windows(2) {
        let ((d0, e0), (_, e1)) = (w[0], w[1]);
        if e1 != e0.checked_mul(d0)? {
            return None;
        }
    }
    Some(axes[0].1)
}

/// A strided matrix operand over the output's batch: `rows x cols` are the last two dims of
/// `id`; dims of size 1 get stride 0.
fn operand(graph: &Graph, id: TensorId, out_batch: &[i64]) -> Option<Operand> {
    let d = graph.desc(id);
    let r = d.dims.len();
    if r < 2 || d.strides.len() != r || d.strides.iter().any(|&s| s < 0) {
        return None;
    }
    let (rows, cols) = (d.dims[r - 2], d.dims[r - 1]);
    if rows <= 0 || cols <= 0 || rows > i32::MAX as i64 || cols > i32::MAX as i64 {
        return None;
    }
    let norm = |dim: i64, s: i64| if dim == 1 { 0 } else { s };
    let batch = out_batch.iter().product::<i64>();
    let bs = linear_batch_stride(&d.dims[..r - 2], &d.strides[..r - 2], out_batch)?;
    Some(Operand {
        tensor: id,
        dtype: dtype(graph, id),
        rows: rows as usize,
        cols: cols as usize,
        row_stride: norm(rows, d.strides[r - 2]),
        col_stride: norm(cols, d.strides[r - 1]),
        batch_stride: if batch == 1 { 0 } else { bs },
        gather: None,
    })
}

/// A gathered operand: the extents of `id`'s (matrix) description in the view graph, read
/// through `map`; with the strides of the matrix it is when the map is a plain one after all
/// ([`gather::Gather::as_matrix`]: a kernel may then load it as a matrix), else zero strides.
/// `is_a`: A (`m x k`), else B (`k x n`). `group`: the operand's offset per group (its batch
/// stride, [`GemmProblem::groups`]).
fn gathered(graph: &Graph, id: TensorId, map: &gather::Gather, is_a: bool, group: i64) -> Option<Operand> {
    let d = graph.desc(id);
    if d.dims.len() != 2 || d.dims.iter().any(|&e| e <= 0 || e > i32::MAX as i64) || !map.valid() {
        return None;
    }
    let (mn, k) = map.as_matrix().unwrap_or((0, 0));
    let (row_stride, col_stride) = if is_a { (mn, k) } else { (k, mn) };
    Some(Operand {
        tensor: id,
        dtype: dtype(graph, id),
        rows: d.dims[0] as usize,
        cols: d.dims[1] as usize,
        row_stride,
        col_stride,
        batch_stride: group,
        gather: Some(Box::new(map.clone())),
    })
}

/// The GEMM of matmul node `mm` reading its operands from `a` and `b` (its own inputs, or the
/// sources of its operands' [`Prologue`]s) and storing into `out` (its own c, or the last node of
/// its epilogue, with c's dims), when the tensor-core kernels take it: float inputs other than f64
/// (mixed types as `sm80::mma_kind` allows; fp8 on sm_89+), batch dims that flatten to one
/// stride per operand, a C type of f32/f16/bf16/fp8, and a compute type that leaves the inputs
/// as they are (the CPU engine rounds inputs to it).
/// With `gathers`, A and B are read through their index maps: the view graph gives them only
/// their extents (A `m x k`, B `k x n`) and types.
#[allow(clippy::too_many_arguments)]
fn problem_of(graph: &Graph, mm: usize, a: TensorId, b: TensorId, out: TensorId, target: &Target, options: &Options, gathers: Option<&gather::Gathers>) -> Option<GemmProblem> {
    let node = graph.nodes.get(mm)?;
    if !matches!(node.op, Op::Matmul(_)) {
        return None;
    }
    let c = node.output("c")?;
    let (ta, tb, tc) = (dtype(graph, a), dtype(graph, b), dtype(graph, out));
    let family_ok = sm80::mma_kind(ta, tb, options.tf32, target).is_some();
    let int_acc = byte_int(ta) && byte_int(tb);
    if !family_ok || !store_type(tc, int_acc) || !store_type(dtype(graph, c), int_acc) {
        return None;
    }
    // (8-bit integers: exact i32 sums, as the CPU engine's exact ones under an i32 or f32
    // compute type.)
    let ct = graph.compute_type(node);
    if !(ct == DataType::F32 || (ct == ta && ct == tb) || (int_acc && ct == DataType::I32)) {
        return None;
    }
    let cd = graph.desc(c);
    let od = graph.desc(out);
    if od.dims != cd.dims || od.dims.len() < 2 || od.dims.len() > 8 {
        return None;
    }
    let rc = od.dims.len();
    let out_batch = &od.dims[..rc - 2];
    if out_batch.iter().any(|&d| d <= 0) {
        return None;
    }
    let batch: i64 = out_batch.iter().product();
    let (pa, pb, pc) = match gathers {
        Some(g) => (gathered(graph, a, &g.a, true, g.a_group)?, gathered(graph, b, &g.b, false, g.b_group)?, operand(graph, out, out_batch)?),
        None => (operand(graph, a, out_batch)?, operand(graph, b, out_batch)?, operand(graph, out, out_batch)?),
    };
    // Gathered indices are 32-bit in the kernel (rows over every batch too).
    if gathers.is_some() && [pa.rows as u128 * batch as u128, pa.cols as u128, pb.cols as u128].iter().any(|&e| e > i32::MAX as u128) {
        return None;
    }
    if pa.cols != pb.rows || pc.rows != pa.rows || pc.cols != pb.cols {
        return None;
    }
    // Every element of C is written once: no stride-0 output dims.
    if (pc.rows > 1 && pc.row_stride == 0) || (pc.cols > 1 && pc.col_stride == 0) || (batch > 1 && pc.batch_stride == 0) {
        return None;
    }
    if batch > u32::MAX as i64 {
        return None;
    }
    // Groups: the batch's inner factor (C's view has them as its last batch dim).
    let groups = gathers.map_or(1, |g| g.groups.max(1));
    if groups > 1 && (batch % groups as i64 != 0 || out_batch.last() != Some(&(groups as i64)) || pa.batch_stride < 0 || pb.batch_stride < 0) {
        return None;
    }
    Some(GemmProblem { batch: batch as usize, m: pa.rows, n: pb.cols, k: pa.cols, a: pa, b: pb, c: pc, groups, allow_tf32: options.tf32, fast_fp8: options.fp8_fast_accum })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_strides_flatten_or_refuse() {
        assert_eq!(linear_batch_stride(&[4, 3], &[21, 7], &[4, 3]), Some(7));
        assert_eq!(linear_batch_stride(&[3], &[7], &[4, 3]), None);
        assert_eq!(linear_batch_stride(&[], &[], &[4, 3]), Some(0));
        assert_eq!(linear_batch_stride(&[1, 3], &[0, 7], &[1, 3]), Some(7));
        assert_eq!(linear_batch_stride(&[4, 1], &[9, 9], &[4, 1]), Some(9));
        assert_eq!(linear_batch_stride(&[4, 1], &[9, 0], &[4, 3]), None);
        assert_eq!(linear_batch_stride(&[1, 1], &[5, 5], &[4, 3]), Some(0));
    }
}

#[cfg(test)]
mod case_tests {
    use crate::engine::cuda::kernel::{Options, Target};
    use crate::testing::cases;

    /// Most GEMM cases run on the tensor-core path, every `fast_gemm_` case whose types it takes.
    #[test]
    fn gemm_cases_take_the_tensor_core_path() {
        let target = Target::sm90a();
        let mut taken = 0;
        let mut all = 0;
        for c in cases::all().into_iter().filter(|c| c.name.starts_with("fast_gemm_") || c.name.contains("matmul") || c.name.starts_with("multi_")) {
            let mut g = c.graph.clone();
            g.validate().unwrap();
            let units = crate::engine::cuda::planner::units(&g, &target, &Options::default(), true).unwrap();
            let entries: Vec<String> = units.iter().flat_map(|u| u.kernels.launches.iter().map(|l| l.entry.clone())).collect();
            let gemm = entries.iter().any(|e| e.contains("gemm"));
            all += 1;
            taken += gemm as usize;
            let expect_fallback = ["no_flatten", "_f64", "i32", "i64"].iter().any(|s| c.name.contains(s));
            if c.name.starts_with("fast_gemm_") && !expect_fallback {
                assert!(gemm, "{}: no GEMM kernel", c.name);
            }
        }
        assert!(taken * 2 > all, "{taken} of {all}");
    }

    /// 8-bit integer matmuls and forward convolutions run on the integer mma (both targets),
    /// their exact sums stored as they are where nothing but identities follows into an integer
    /// output, through the f32 epilogue otherwise.
    #[test]
    fn int8_cases_take_the_integer_mma() {
        let int8 = |n: &str| n.starts_with("fast_gemm_int8") || n.starts_with("fast_conv_fprop_int8") || n.starts_with("matmul_i8") || n.starts_with("matmul_u8");
        let mut seen = 0;
        for c in cases::all().into_iter().filter(|c| int8(&c.name)) {
            let mut g = c.graph.clone();
            g.validate().unwrap();
            for target in [Target::sm90a(), Target::sm80()] {
                let units = crate::engine::cuda::planner::units(&g, &target, &Options::default(), true).unwrap();
                let sources: Vec<&str> = units.iter().flat_map(|u| u.kernels.launches.iter().filter(|l| l.entry.contains("gemm")).map(|l| l.source.as_str())).collect();
                let mma = sources.iter().any(|s| s.contains("#define GM_MMA GM_MMA_S8\n"));
                let wgmma = sources.iter().any(|s| s.contains("#define GEMM_INT 1\n") && s.contains("wgmma.mma_async"));
                assert!(mma || (wgmma && target.hopper()), "{} on {}: no integer GEMM", c.name, target.arch);
                // On Hopper, int8 convolutions whose channels come in 128-byte runs read the image
                // by im2col loads on the wgmma kernel.
                if target.hopper() && c.name.starts_with("fast_conv_fprop_int8_3x3_c") && ["c128", "c256", "c512"].iter().any(|t| c.name.contains(t)) {
                    assert!(wgmma && sources.iter().any(|s| s.contains("#define GEMM_A_IM2COL 1\n")), "{}: not on the im2col wgmma kernel", c.name);
                }
                // On Hopper, K-major operands (B stored n x k, rows 16-byte aligned) take the wgmma
                // kernel.
                if target.hopper() && c.name.starts_with("fast_gemm_int8_bt") && !c.name.contains("97x72x100") {
                    assert!(wgmma, "{}: not on the Hopper kernel", c.name);
                }
                let float_epilogue = c.name.contains("requant") || c.name.contains("to_f32") || c.name.contains("_f32") || c.name.contains("bias") || c.name.contains("bf16");
                let exact = sources.iter().any(|s| s.contains("#define GM_INT_EXACT 1\n") || s.contains("#define GEMM_INT_EXACT 1\n"));
                assert_eq!(exact, !float_epilogue, "{}: exact integer store", c.name);
                // A long k over few tiles splits on the mma.sync kernel (the i32 partials summed by
                // a second launch; the Hopper kernel runs whole tiles).
                if c.name.contains("splitk") && mma {
                    assert!(units.iter().any(|u| u.kernels.launches.iter().any(|l| l.entry.contains("reduce"))), "{}: no split", c.name);
                }
                // Every node in one unit: the identities and the requantization in the epilogue.
                if c.name.contains("identity") || c.name.contains("requant") || c.name.contains("bias") {
                    assert_eq!(units.len(), 1, "{}: {} units", c.name, units.len());
                }
            }
            seen += 1;
        }
        assert!(seen >= 20, "{seen} int8 cases");
    }

    /// A last plain relu under a 16-bit C goes into the Hopper kernel's TMA-store conversion
    /// (`cvt.rn.relu`, the chain without it as `epilogue_u`); under an f32 C the chain keeps it.
    #[test]
    fn a_last_relu_under_16_bit_c_is_the_conversions() {
        let source = |name: &str| -> String {
            let c = cases::all().into_iter().find(|c| c.name == name).unwrap_or_else(|| panic!("{name}"));
            let mut g = c.graph.clone();
            g.validate().unwrap();
            let units = crate::engine::cuda::planner::units(&g, &Target::sm90a(), &Options::default(), true).unwrap();
            units.iter().flat_map(|u| u.kernels.launches.iter().map(|l| l.source.clone())).collect()
        };
        let fused = source("fast_gemm_big_tiles_rounds_bias_relu_1100x4000x40_bf16");
        assert!(fused.contains("float epilogue_u(") && fused.contains("#define GEMM_RELU_CVT 1\n") && fused.contains("#define GEMM_C DT_bf16\n"));
        let f32_out = source("fast_gemm_bias_relu_200x136x72_f32_to_f32");
        assert!(!f32_out.contains("#define EPI_RELU_LAST 1") && !f32_out.contains("#define GEMM_RELU_CVT 1\n"));
    }

    /// The tap cases: on Hopper the reduction of C is the GEMM kernel's (a second launch folds
    /// the partials), also for fp8 with fast accumulation; elsewhere, and for fp8 without it, the
    /// reduction runs as its own unit.
    #[test]
    fn reductions_of_c_fold_into_the_hopper_gemm() {
        let entries = |g: &crate::Graph, t: &Target, o: &Options| -> Vec<Vec<String>> {
            crate::engine::cuda::planner::units(g, t, o, true).unwrap().iter().map(|u| u.kernels.launches.iter().map(|l| l.entry.clone()).collect()).collect()
        };
        let mut seen = 0;
        for c in cases::all().into_iter().filter(|c| c.name.starts_with("fast_gemm_tap_")) {
            let mut g = c.graph.clone();
            g.validate().unwrap();
            let fp8 = c.name.contains("fp8");
            let units = entries(&g, &Target::sm90a(), &Options::default().with_fp8_fast_accum(true));
            let gemm = units.iter().find(|u| u.iter().any(|e| e.contains("gemm_sm90"))).unwrap_or_else(|| panic!("{}: {units:?}", c.name));
            assert!(gemm.last().is_some_and(|e| e.ends_with("_sm90_tap")), "{}: {units:?}", c.name);
            assert!(!units.iter().flatten().any(|e| e.contains("reduce")), "{}: {units:?}", c.name);
            for t in [Target::sm80(), Target::sm90a()] {
                if t.hopper() && !fp8 {
                    continue;
                }
                let units = entries(&g, &t, &Options::default());
                assert!(!units.iter().flatten().any(|e| e.ends_with("_tap")), "{} ({}): {units:?}", c.name, t.arch);
                assert!(units.iter().flatten().any(|e| e.contains("reduce")), "{} ({}): {units:?}", c.name, t.arch);
            }
            seen += 1;
        }
        assert_eq!(seen, 8);
    }

    /// Scaled operands: the scale nodes join the GEMM's unit (no kernel of their own), the GEMM
    /// reads the unscaled sources (fp8 then runs on wgmma in the fast-accumulation plan), and
    /// the scales are the epilogue's first multiplies.
    #[test]
    fn operand_scales_move_into_the_epilogue() {
        let mut seen = 0;
        for c in cases::all().into_iter().filter(|c| c.name.starts_with("fast_gemm_prologue_")) {
            let mut g = c.graph.clone();
            g.validate().unwrap();
            let fp8 = c.name.contains("fp8");
            assert_eq!(super::has_fp8_matmul(&g), fp8, "{}", c.name);
            for t in [Target::sm80(), Target::sm90a()] {
                let units = crate::engine::cuda::planner::units(&g, &t, &Options::default().with_fp8_fast_accum(fp8 && t.hopper()), true).unwrap();
                // (No fp8 tensor-core path before sm_89: the scales and the GEMM run apart.)
                if fp8 && !t.hopper() {
                    assert!(units.len() > 1, "{}", c.name);
                    continue;
                }
                assert_eq!(units.len(), 1, "{} ({}): {} units", c.name, t.arch, units.len());
                let src: String = units[0].kernels.launches.iter().map(|l| l.source.clone()).collect();
                assert!(src.lines().any(|l| l.starts_with("#define EPI_ACC ") && l.contains("acc * ")), "{}", c.name);
                let e4m3 = src.contains("#define GEMM_A DT_fp8_e4m3\n") && src.contains("#define GEMM_B DT_fp8_e4m3\n");
                let wgmma = src.contains("wgmma.mma_async") && (!fp8 || e4m3);
                assert_eq!(wgmma, t.hopper(), "{} ({})", c.name, t.arch);
            }
            seen += 1;
        }
        assert_eq!(seen, 3);
    }

    /// With the `tf32` knob (`Options::tf32`), f32 GEMMs get other kernels (one tf32 pass)
    /// and 16-bit ones the same.
    #[test]
    fn tf32_option_changes_only_f32_gemms() {
        let sources = |g: &crate::Graph, t: &Target, tf32: bool| -> Vec<String> {
            crate::engine::cuda::planner::units(g, t, &Options::default().with_tf32(tf32), true)
                .unwrap()
                .iter()
                .flat_map(|u| u.kernels.launches.iter().map(|l| l.source.clone()))
                .collect()
        };
        let (mut f32s, mut others) = (0, 0);
        for c in cases::all().into_iter().filter(|c| c.name.starts_with("fast_gemm_")) {
            let mut g = c.graph.clone();
            g.validate().unwrap();
            // (Scaled operands' GEMMs read the unscaled sources where the target can: fp8 only
            // from sm_89 on; `operand_scales_move_into_the_epilogue`.)
            if c.name.starts_with("fast_gemm_prologue_") {
                continue;
            }
            let f32_in =
                g.nodes.iter().any(|n| matches!(n.op, crate::graph::ops::Op::Matmul(_)) && n.inputs.iter().any(|p| g.resolved_data_type(p.tensor) == Some(crate::DataType::F32)));
            for target in [Target::sm80(), Target::sm90a()] {
                let same = sources(&g, &target, false) == sources(&g, &target, true);
                if f32_in && !c.name.contains("no_flatten") {
                    assert!(!same, "{}: tf32 changes nothing on {}", c.name, target.arch);
                    f32s += 1;
                } else if !f32_in {
                    assert!(same, "{}: tf32 changes a GEMM without f32 inputs", c.name);
                    others += 1;
                }
            }
        }
        assert!(f32s > 10 && others > 10, "{f32s} {others}");
        // The tf32 cases (and f32 epilogue cases with row-major A, K % 4 == 0) take the wgmma
        // kernel on sm_90a.
        let t = Target::sm90a();
        for c in cases::all().into_iter().filter(|c| c.name.starts_with("fast_gemm_tf32_") || (c.name.contains("_f32_to_") && c.name.contains("x72_f32"))) {
            let mut g = c.graph.clone();
            g.validate().unwrap();
            let units = crate::engine::cuda::planner::units(&g, &t, &Options::default().with_tf32(true), true).unwrap();
            let tf32 = |l: &crate::engine::cuda::kernel::Launch| l.entry.contains("gemm_sm90") && l.source.contains("#define GEMM_A DT_f32\n");
            assert!(units.iter().any(|u| u.kernels.launches.iter().any(tf32)), "{}: no wgmma tf32 kernel", c.name);
        }
    }

    /// On sm_90a the wgmma kernel takes the 16-bit cases whose strides TMA can use, with the
    /// mma.sync kernel as the unaligned alternative; on sm_80 it never appears.
    #[test]
    fn hopper_cases_take_the_wgmma_kernel() {
        let mut hopper = 0;
        for c in cases::all().into_iter().filter(|c| c.name.starts_with("fast_gemm_")) {
            let mut g = c.graph.clone();
            g.validate().unwrap();
            for target in [Target::sm80(), Target::sm90a()] {
                let units = crate::engine::cuda::planner::units(&g, &target, &Options::default(), true).unwrap();
                for u in units.iter().filter(|u| u.kernels.launches.iter().any(|l| l.entry.contains("gemm_sm90"))) {
                    assert!(target.hopper(), "{}: wgmma kernel for {}", c.name, target.arch);
                    let alt = u.unaligned.as_ref().unwrap_or_else(|| panic!("{}: no unaligned alternative", c.name));
                    assert!(alt.kernels.launches.iter().all(|l| !l.entry.contains("gemm_sm90")), "{}", c.name);
                    hopper += 1;
                }
            }
        }
        assert!(hopper >= 5, "only {hopper} cases take the wgmma kernel");
    }

    /// The decode cases with enough columns run as C^T on Hopper: wgmma's N is 16 (M <= 16) or
    /// 32, and the 64-row tiles split no k.
    #[test]
    fn decode_cases_compute_c_transposed_on_hopper() {
        let mut seen = 0;
        let target = Target::sm90a();
        for c in cases::all().into_iter().filter(|c| c.name.starts_with("fast_gemm_") && c.name.contains("x74")) {
            let mut g = c.graph.clone();
            g.validate().unwrap();
            let units = crate::engine::cuda::planner::units(&g, &target, &Options::default(), true).unwrap();
            let gemm = units.iter().find(|u| u.kernels.launches.iter().any(|l| l.entry.contains("gemm_sm90"))).unwrap_or_else(|| panic!("{}: no wgmma kernel", c.name));
            assert_eq!(gemm.kernels.launches.len(), 1, "{}: a split", c.name);
            let src = &gemm.kernels.launches[0].source;
            assert!(src.contains("#define GEMM_BN 16\n") || src.contains("#define GEMM_BN 32\n"), "{}", c.name);
            seen += 1;
        }
        assert_eq!(seen, 4);
    }
}
