//! What a graph costs the CPU engine, estimated at plan build so that a graph too large for this
//! machine is refused with a message instead of aborting or running for hours: the host memory
//! its dense `f64` arrays and each op's scratch take (against [`host_memory_limit`]), and the
//! work of each node (against [`max_work`]).
//!
//! The estimates follow the engine's own code: every tensor a node reads or writes is held as a
//! dense `f64` array until the execution ends, and while a node runs its op family allocates scratch of a known size (copies of its inputs rounded to
//! the compute type, index tables, per-row vectors). They are upper bounds within a small
//! factor, not exact counts.

use crate::error::{Error, Result};
use crate::graph::ops::Op;
use crate::graph::{Graph, Node};
use crate::layout::{format_bytes, host_memory_limit, MAX_HOST_BYTES_ENV};

/// The environment variable that sets [`max_work`]: a number of element operations (`1e12`,
/// `1099511627776`), or `unlimited`.
pub const MAX_WORK_ENV: &str = "FERRODNN_CPU_MAX_WORK";

/// The default bound on one node's work: 2^38 (about 2.7e11) element operations. The CPU
/// engine's loops take about 1 ns (pooling) to 4 ns (direct convolution) per operation on one
/// core, so a node at the bound runs for minutes where it cannot use several cores. Max pooling
/// of `[1, 1, 2^22]` with a 2^21 window (2^42) is refused, and so is an 8192^3 matmul (2^39); a
/// 4096^3 matmul (2^36) is not.
pub const DEFAULT_MAX_WORK: u128 = 1 << 38;

/// The most work one node may have on the CPU engine: `FERRODNN_CPU_MAX_WORK`, else
/// [`DEFAULT_MAX_WORK`]; `None` when the variable says `unlimited`. An unreadable value is an
/// error naming the variable.
pub fn max_work() -> Result<Option<u128>> {
    let Ok(v) = std::env::var(MAX_WORK_ENV) else { return Ok(Some(DEFAULT_MAX_WORK)) };
    let t = v.trim();
    if t.eq_ignore_ascii_case("unlimited") {
        return Ok(None);
    }
    if let Ok(n) = t.parse::<u128>() {
        return Ok(Some(n));
    }
    match t.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(Some(x as u128)),
        _ => Err(Error::InvalidArgument(format!("{MAX_WORK_ENV}={v:?} is not a number of operations (e.g. 1e12) or `unlimited`"))),
    }
}

/// The cost of one graph on the CPU engine.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// Peak host memory in bytes: every tensor as `f64`, plus the largest scratch of one node.
    pub peak_bytes: u128,
    /// The node (index into `graph.nodes`) whose scratch is the largest.
    pub peak_node: Option<usize>,
    /// The largest tensor (index into `graph.tensors`) and its element count.
    pub largest_tensor: Option<(usize, u128)>,
    /// Each node's work in element operations (index as `graph.nodes`).
    pub work: Vec<u128>,
}

/// Estimate the CPU engine's cost of a validated graph.
pub fn estimate(graph: &Graph) -> Estimate {
    let elems = |t: usize| -> u128 { graph.tensors.get(t).map_or(0, |d| d.dims.iter().fold(1u128, |a, &x| a.saturating_mul(x.max(0) as u128))) };
    let mut seen = vec![false; graph.tensors.len()];
    let mut persistent = 0u128;
    let mut largest: Option<(usize, u128)> = None;
    let (mut peak_transient, mut peak_node) = (0u128, None);
    let mut work = Vec::with_capacity(graph.nodes.len());
    for (ni, node) in graph.nodes.iter().enumerate() {
        for p in node.inputs.iter().chain(&node.outputs) {
            let n = elems(p.tensor.0);
            if let Some(s) = seen.get_mut(p.tensor.0) {
                if !*s {
                    *s = true;
                    persistent = persistent.saturating_add(n.saturating_mul(8));
                    if largest.is_none_or(|(_, m)| n > m) {
                        largest = Some((p.tensor.0, n));
                    }
                }
            }
        }
        let in_sum = node.inputs.iter().fold(0u128, |a, p| a.saturating_add(elems(p.tensor.0)));
        let out_sum = node.outputs.iter().fold(0u128, |a, p| a.saturating_add(elems(p.tensor.0)));
        let shape = Shape { graph, node, in_sum, out_sum };
        let transient = shape.scratch_words().saturating_mul(8);
        if peak_node.is_none() || transient > peak_transient {
            peak_transient = transient;
            peak_node = Some(ni);
        }
        work.push(shape.work());
    }
    Estimate { peak_bytes: persistent.saturating_add(peak_transient), peak_node, largest_tensor: largest, work }
}

/// Refuse a graph whose estimate exceeds the host memory limit or whose node exceeds the work
/// bound; the error names the op, the tensor and the numbers, and the variable that changes the
/// limit.
pub fn check(graph: &Graph) -> Result<()> {
    let e = estimate(graph);
    let gname = if graph.name.is_empty() { "graph".to_string() } else { format!("graph \"{}\"", graph.name) };
    let op_name = |ni: usize| graph.nodes.get(ni).map_or("?".to_string(), |n| format!("{} \"{}\"", n.op.kind(), n.name));
    let limit = host_memory_limit()?;
    if e.peak_bytes > limit as u128 {
        let tensor = e.largest_tensor.map_or(String::new(), |(t, n)| {
            let d = &graph.tensors[t];
            format!(" (the largest, tensor \"{}\" with dims {:?}, is {})", d.name, d.dims, format_bytes(n.saturating_mul(8)))
        });
        let op = e.peak_node.map_or(gname.clone(), |ni| format!("{} in {gname}", op_name(ni)));
        return Err(Error::NotSupported(format!(
            "{op}: the CPU engine would need {} of host memory, more than the limit of {} (set {MAX_HOST_BYTES_ENV} to change it): it holds every tensor of the graph as f64{tensor}, with each op's scratch, the most while this op runs",
            format_bytes(e.peak_bytes),
            format_bytes(limit as u128)
        )));
    }
    if let Some(bound) = max_work()? {
        if let Some((ni, &w)) = e.work.iter().enumerate().find(|(_, &w)| w > bound) {
            return Err(Error::NotSupported(format!(
                "{}: about {w} element operations ({:.1e}) on the CPU engine, more than the bound of {bound} ({:.1e}), which keeps an execution from running for hours; \
                 set {MAX_WORK_ENV} (a number or `unlimited`) to change it",
                op_name(ni),
                w as f64,
                bound as f64
            )));
        }
    }
    Ok(())
}

/// One node's sizes, for its scratch and work.
struct Shape<'a> {
    graph: &'a Graph,
    node: &'a Node,
    in_sum: u128,
    out_sum: u128,
}

impl Shape<'_> {
    fn dims_in(&self, port: &str) -> Vec<u128> {
        self.node.input(port).or_else(|| self.node.output(port)).and_then(|t| self.graph.get(t)).map_or_else(Vec::new, |d| d.dims.iter().map(|&x| x.max(0) as u128).collect())
    }
    fn count(&self, port: &str) -> u128 {
        prod(&self.dims_in(port))
    }
    fn max_input(&self) -> u128 {
        self.node.inputs.iter().filter_map(|p| self.graph.get(p.tensor)).map(|d| prod(&d.dims.iter().map(|&x| x.max(0) as u128).collect::<Vec<_>>())).max().unwrap_or(0)
    }
    fn dim(&self, port: &str, axis: usize) -> u128 {
        self.dims_in(port).get(axis).copied().unwrap_or(1)
    }
    /// Attention's rows (b * h_q * s_q) and keys per row (s_kv, through the page table when
    /// paged).
    fn attention(&self) -> (u128, u128, u128, u128) {
        let q = self.dims_in("q");
        let rows = prod(q.get(..3).unwrap_or(&[]));
        let pages = if self.node.input("page_table_k").is_some() { self.dim("page_table_k", 2) } else { 1 };
        let s_kv = self.dim("k", 2).saturating_mul(pages);
        (rows, s_kv, self.dim("q", 3), self.dim("v", 3))
    }

    /// Words of attention's K and V in their logical `[b, h_kv, s_kv, d]` form when paged (the
    /// page table can make them far larger than the block pools); 0 unpaged.
    fn unpaged(&self) -> u128 {
        if self.node.input("page_table_k").is_none() {
            return 0;
        }
        let (_, s_kv, d, d_v) = self.attention();
        self.dim("q", 0).saturating_mul(self.dim("k", 1)).saturating_mul(s_kv).saturating_mul(d.saturating_add(d_v))
    }

    /// Words of scratch the op's CPU code allocates beyond its inputs and outputs.
    fn scratch_words(&self) -> u128 {
        let threads = rayon::current_num_threads() as u128;
        let (i, o) = (self.in_sum, self.out_sum);
        let x = self.max_input();
        match &self.node.op {
            // Each layer's input and output sequences, the states and gradients it keeps.
            Op::Rnn(a) | Op::RnnBackwardData(a) | Op::RnnBackwardWeights(a) => {
                let keep = (a.reserve_elements().max(0) as u128).saturating_add(a.dgates_elements().max(0) as u128);
                i.saturating_add(o.saturating_mul(2)).saturating_add(keep.saturating_mul(2))
            }
            Op::Pointwise(_) | Op::Resample(_) | Op::ResampleBackward(_) | Op::Rng(_) | Op::Reshape(_) | Op::Transpose(_) | Op::Slice(_) | Op::Concatenate(_) => 0,
            Op::Copy(_) | Op::Reduction(_) => i,
            // Inputs rounded to the compute type, and where each batch starts.
            Op::Matmul(_) => {
                let c = self.dims_in("c");
                i.saturating_add(prod(c.get(..c.len().saturating_sub(2)).unwrap_or(&[])).saturating_mul(2))
            }
            // Inputs rounded to the compute type, and a table of the filter's taps.
            Op::ConvFprop(_) | Op::ConvDgrad(_) | Op::ConvWgrad(_) => {
                let w = if matches!(self.node.op, Op::ConvWgrad(_)) { self.dims_in("dw") } else { self.dims_in("w") };
                i.saturating_add(prod(w.get(2..).unwrap_or(&[])).saturating_mul(12))
            }
            // Group tables (members and owner), broadcast scale and bias, statistics.
            Op::Layernorm(_)
            | Op::Rmsnorm(_)
            | Op::Instancenorm(_)
            | Op::Groupnorm(_)
            | Op::Adalayernorm(_)
            | Op::Batchnorm(_)
            | Op::BatchnormInference(_)
            | Op::Genstats(_)
            | Op::BnFinalize(_) => x.saturating_mul(10),
            // Also x-hat, the gradient products and the tables of the scale's reduction.
            Op::LayernormBackward(_) | Op::RmsnormBackward(_) | Op::InstancenormBackward(_) | Op::GroupnormBackward(_) | Op::AdalayernormBackward(_) | Op::BatchnormBackward(_) => {
                x.saturating_mul(14)
            }
            // A vector per row (three words of header each) before the rows are placed.
            Op::Softmax(_) | Op::SoftmaxBackward(_) => x.saturating_mul(5),
            // K and V copied (or unpaged), the rows' results before assembly, a row of scores,
            // weights and dropout factors per thread.
            Op::Sdpa(_) => {
                let (rows, s_kv, _, _) = self.attention();
                i.saturating_add(self.unpaged())
                    .saturating_add(o.saturating_mul(2))
                    .saturating_add(rows.saturating_mul(4))
                    .saturating_add(threads.saturating_mul(s_kv).saturating_mul(4))
            }
            // Also the per-group gradients and their assembly (dK and dV unpaged), and dS when
            // dbias is wanted.
            Op::SdpaBackward(_) => {
                let (rows, s_kv, _, _) = self.attention();
                let ds = if self.node.output("dbias").is_some() { rows.saturating_mul(s_kv).saturating_mul(2) } else { 0 };
                i.saturating_add(self.unpaged().saturating_mul(3))
                    .saturating_add(o.saturating_mul(2))
                    .saturating_add(ds)
                    .saturating_add(threads.saturating_mul(s_kv).saturating_mul(4))
            }
        }
    }

    /// Element operations: every element read and written, plus each op's inner loops.
    fn work(&self) -> u128 {
        let base = self.in_sum.saturating_add(self.out_sum);
        let inner = match &self.node.op {
            Op::Matmul(_) => {
                let a = self.dims_in("a");
                self.count("c").saturating_mul(a.last().copied().unwrap_or(1))
            }
            // Each output element sums over its group's channels and every tap.
            Op::ConvFprop(_) => self.count("y").saturating_mul(self.count("w") / self.dim("w", 0).max(1)),
            Op::ConvDgrad(_) => self.count("dx").saturating_mul(self.count("w") / self.dim("dx", 1).max(1)),
            Op::ConvWgrad(_) => self.count("dw").saturating_mul(self.count("dy") / self.dim("dy", 1).max(1)),
            // Each output element visits its window.
            Op::Resample(a) => self.count("y").saturating_mul(window(&a.window)),
            Op::ResampleBackward(a) => self.count("dy").saturating_mul(window(&a.window)),
            Op::Sdpa(_) => {
                let (rows, s_kv, d, d_v) = self.attention();
                rows.saturating_mul(s_kv).saturating_mul(d.saturating_add(d_v).saturating_add(4))
            }
            Op::SdpaBackward(_) => {
                let (rows, s_kv, d, d_v) = self.attention();
                rows.saturating_mul(s_kv).saturating_mul(d.saturating_add(d_v).saturating_add(4).saturating_mul(2))
            }
            // Every weight meets every (step, sample) once per pass; the backward data pass
            // makes two (the gates' and the states' gradients).
            Op::Rnn(a) | Op::RnnBackwardData(a) | Op::RnnBackwardWeights(a) => {
                let passes = if matches!(self.node.op, Op::RnnBackwardData(_)) { 2 } else { 1 };
                (a.weight_space_elements().max(0) as u128).saturating_mul((a.max_seq_length.max(0) as u128).saturating_mul(a.batch.max(0) as u128)).saturating_mul(passes)
            }
            Op::Layernorm(_)
            | Op::Rmsnorm(_)
            | Op::Instancenorm(_)
            | Op::Groupnorm(_)
            | Op::Adalayernorm(_)
            | Op::Batchnorm(_)
            | Op::BatchnormInference(_)
            | Op::Genstats(_)
            | Op::BnFinalize(_)
            | Op::LayernormBackward(_)
            | Op::RmsnormBackward(_)
            | Op::InstancenormBackward(_)
            | Op::GroupnormBackward(_)
            | Op::AdalayernormBackward(_)
            | Op::BatchnormBackward(_)
            | Op::Softmax(_)
            | Op::SoftmaxBackward(_) => self.max_input().saturating_mul(4),
            _ => 0,
        };
        base.saturating_add(inner)
    }
}

fn prod(dims: &[u128]) -> u128 {
    dims.iter().fold(1u128, |a, &x| a.saturating_mul(x))
}

fn window(w: &[i64]) -> u128 {
    w.iter().fold(1u128, |a, &x| a.saturating_mul(x.max(1) as u128))
}
