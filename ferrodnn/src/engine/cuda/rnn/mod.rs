//! The RNN ops on the GPU (`rnn`, `rnn_backward_data`, `rnn_backward_weights`), every mode the
//! graph layer allows.
//!
//! The fast kernels take f16 and bf16 sequences on sm_80 or newer without an LSTM projection or
//! dropout between layers in training, each op where its blocks fit:
//! - forward (`persist.rs`): per layer the input projection as one GEMM on the GEMM engine, then
//!   the recurrence as one persistent kernel (`persist.cuh`);
//! - backward data (`persist_bwd.rs`): per layer, from the top down, the backward recurrence as
//!   one persistent kernel (`persist_bwd.cuh`), then the input gradient as one GEMM;
//! - backward weights (`persist_wgrad.rs`): per layer the gate gradients and the GEMM's other
//!   operand converted into scratch, one GEMM on the GEMM engine for every matrix of both
//!   directions, and one pass adding it and the biases' column sums into `dw`.
//!
//! Everything else runs the standard algorithm, layer by layer (this file). Forward: the input
//! projection of every step at once (`fwd_proj.cuh`, a GEMM over the `T * B` rows into the
//! scratch `gx`), then the recurrence (`fwd_recur.cuh`: one block per sample and direction walks
//! the sample's own steps, each step the recurrent product, the gates and cell fused, the
//! projection), then `fwd_finish.cuh` (dropout into the next layer's input, or the last layer's
//! output into `y`). Backward data, from the top layer down: the backward recurrence
//! (`bwd_recur.cuh`, the gates' gradients into the scratch `dgs` and the `dgates` tensor, the
//! state gradients through the recurrent matrices' transposes), then the input gradient of every
//! step at once (`bwd_proj.cuh`). Backward weights: every matrix of a layer in one GEMM launch
//! (`wgrad.cuh`), its biases in another (`wgrad_bias.cuh`), added to `dw_in`'s copy. Products
//! accumulate in f32 (f64 when the node computes in f64, and in the generic fallback's plan,
//! which runs these kernels with double accumulators); the GEMMs are a tiled SIMT kernel
//! (`gemm_tile.cuh`) whose operands each kernel reads through its own macros (layouts, lengths,
//! dropout factors).
//!
//! Sizes, weight-space and reserve offsets are compiled in (`#define`s); the padding fill, the
//! clip bounds and the dropout probability are kernel arguments. Sequence lengths are read on
//! the device and clamped to `[0, T]` (packed: also to the length before, keeping them
//! non-increasing); the CPU engines refuse other values with an error.

mod persist;
mod persist_bwd;
mod persist_wgrad;

use super::kernel::{ctype, entry_name, Grid, Launch, NodeKernels, Signature, Source, Target, Unit};
use super::Options;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::graph::ops::rnn::{RnnDesc, RnnLayout, RnnMode};
use crate::graph::ops::Op;
use crate::graph::{Graph, Node, TensorId};

const COMMON: &str = include_str!("common.cuh");
/// The device Philox 4x32-10 the generic fallback's rng and dropout use (bit-exact with the CPU
/// engine's), for dropout between layers. Included as text: this module does not import the
/// fallback (it imports the GEMM engine, which imports the fallback).
const PHILOX: &str = include_str!("../fallback/philox.cuh");

/// The tiled GEMM the projections and weight gradients instantiate after their own operand
/// macros.
const GEMM_TILE: &str = include_str!("gemm_tile.cuh");

/// Threads per block of the recurrence kernels.
const RECUR_THREADS: u32 = 256;

/// The grid of a [`GEMM_TILE`] kernel: enough blocks for the largest of its problems' 64 x 64
/// tiles (capped: the blocks stride over the rest), one row of blocks per batch entry.
fn gemm_grid(problems: &[(i64, i64)]) -> Grid {
    let tiles = problems.iter().map(|&(m, n)| ((m + 63) / 64) * ((n + 63) / 64)).max().unwrap_or(1);
    Grid::Exact(tiles.clamp(1, 1 << 16) as u32, problems.len() as u32, 1)
}

/// The RNN engine's unit for node `ni`, or None when it is not an RNN node.
pub fn unit(graph: &Graph, ni: usize, target: &Target, options: &Options) -> Result<Option<Unit>> {
    let node = &graph.nodes[ni];
    if !is_rnn(&node.op) {
        return Ok(None);
    }
    let double = graph.compute_type(node) == DataType::F64;
    let writes = node.outputs.iter().map(|p| p.tensor).collect();
    let g = Gen { graph, node, ni, double };
    let fast = match &node.op {
        Op::Rnn(a) => g.fast_forward(a, target, options)?,
        Op::RnnBackwardData(a) => g.fast_backward_data(a, target, options)?,
        Op::RnnBackwardWeights(a) => g.fast_wgrad(a, target, options)?.map(|k| (k, None)),
        _ => None,
    };
    if let Some((kernels, unaligned)) = fast {
        return Ok(Some(Unit { nodes: vec![ni], kernels, writes, unaligned }));
    }
    let kernels = kernels(graph, ni, double)?;
    Ok(Some(Unit { nodes: vec![ni], kernels, writes, unaligned: None }))
}

/// Whether `op` is one of the RNN ops.
pub fn is_rnn(op: &Op) -> bool {
    matches!(op, Op::Rnn(_) | Op::RnnBackwardData(_) | Op::RnnBackwardWeights(_))
}

/// The kernels of RNN node `ni`, accumulating in double when `double` (the generic fallback's
/// plan and f64 compute), else in float.
pub fn kernels(graph: &Graph, ni: usize, double: bool) -> Result<NodeKernels> {
    let node = &graph.nodes[ni];
    let g = Gen { graph, node, ni, double };
    let a = match &node.op {
        Op::Rnn(a) | Op::RnnBackwardData(a) | Op::RnnBackwardWeights(a) => a,
        _ => return Err(Error::op(node.op.kind(), &node.name, "internal: not an RNN node")),
    };
    // Steps, samples and rows are `int`s in the kernels.
    if a.max_seq_length.checked_mul(a.batch).is_none_or(|n| n > i32::MAX as i64) {
        return Err(g.err(format!("indexes steps and samples in 32 bits and takes max_seq_length x batch up to 2^31 - 1, got {} x {}", a.max_seq_length, a.batch)));
    }
    match &node.op {
        Op::Rnn(a) => g.forward(a),
        Op::RnnBackwardData(a) => g.backward_data(a),
        Op::RnnBackwardWeights(a) => g.backward_weights(a),
        _ => Err(Error::op(node.op.kind(), &node.name, "internal: not an RNN node")),
    }
}

struct Gen<'a> {
    graph: &'a Graph,
    node: &'a Node,
    ni: usize,
    double: bool,
}

/// Every port the kernels may read or write, as named in the `.cuh` templates.
const PORTS: [&str; 18] = ["x", "weights", "hx", "cx", "seq_lengths", "y", "hy", "cy", "reserve", "dy", "dhy", "dcy", "dx", "dhx", "dcx", "dgates", "dw_in", "dw"];

impl Gen<'_> {
    fn err(&self, m: impl std::fmt::Display) -> Error {
        Error::NotSupported(format!("{} \"{}\": the CUDA RNN engine {m}", self.node.op.kind(), self.node.name))
    }

    fn port(&self, name: &str) -> Option<TensorId> {
        self.node.input(name).or_else(|| self.node.output(name))
    }

    fn acc_bytes(&self) -> usize {
        if self.double {
            8
        } else {
            4
        }
    }

    /// Bytes of `n` accumulators, checked.
    fn accs(&self, n: i64) -> Result<usize> {
        usize::try_from(n).ok().and_then(|n| n.checked_mul(self.acc_bytes())).ok_or_else(|| self.err(format!("needs a scratch buffer of {n} accumulators, too large")))
    }

    /// The text of one kernel: the problem's defines, the layer's (`layer`), `extra`, then the
    /// shared helpers and `template`.
    fn source(&self, a: &RnnDesc, entry: &str, sig: &Signature, layer: Option<i64>, extra: &[(&str, String)], template: &str) -> String {
        let mode = match a.cell_mode {
            RnnMode::Relu => 0,
            RnnMode::Tanh => 1,
            RnnMode::Lstm => 2,
            RnnMode::Gru => 3,
        };
        let layout = match a.layout {
            RnnLayout::SeqMajorUnpacked => 0,
            RnnLayout::SeqMajorPacked => 1,
            RnnLayout::BatchMajorUnpacked => 2,
        };
        let mut s = Source::new()
            .entry(entry, sig)
            .flag("ACC_DOUBLE", self.double)
            .define("RNN_T", a.max_seq_length)
            .define("RNN_B", a.batch)
            .define("RNN_D", a.dirs())
            .define("RNN_H", a.hidden_size)
            .define("RNN_P", a.proj())
            .define("RNN_G", a.cell_mode.gates())
            .define("RNN_F", a.out_size())
            .define("RNN_MODE", mode)
            .flag("RNN_PROJ", a.has_proj())
            .define("RNN_LAYOUT", layout)
            .define("RNN_SW", a.reserve_states())
            .define("RNN_GW", a.dgates_states())
            .flag("CLIP", a.cell_clip.is_some())
            .flag("CLIP_NAN", a.cell_clip.is_some_and(|c| c.propagate_nan));
        for p in PORTS {
            if let Some(id) = self.port(p) {
                let up = p.to_uppercase();
                s = s.define(&format!("LD_{up}"), ctype::ld(self.graph, id)).define(&format!("ST_{up}"), ctype::st(self.graph, id)).flag(&format!("HAS_{up}"), true);
            } else {
                s = s.flag(&format!("HAS_{}", p.to_uppercase()), false);
            }
        }
        s = s.flag("HAS_LEN", self.port("seq_lengths").is_some());
        if let Some(id) = self.port("seq_lengths") {
            s = s.define("LD_LEN", ctype::ld(self.graph, id));
        }
        s = s.flag("HAS_DG", self.port("dgates").is_some());
        if let Some(id) = self.port("dgates") {
            s = s.define("LD_DG", ctype::ld(self.graph, id));
            s = s.define("ST_DG", ctype::st(self.graph, id));
        }
        if let Some(id) = self.port("reserve") {
            s = s.define("LD_RES", ctype::ld(self.graph, id)).define("ST_RES", ctype::st(self.graph, id));
        }
        if let Some(id) = self.port("weights") {
            s = s.define("LD_W", ctype::ld(self.graph, id));
        }
        if let Some(l) = layer {
            s = self.layer_defines(a, l, s);
        }
        for (k, v) in extra {
            s = s.define(k, v);
        }
        s.template(PHILOX).template(COMMON).template(template).build()
    }

    /// Layer `l`'s sizes and its offsets in the weight space and the reserve.
    fn layer_defines(&self, a: &RnnDesc, l: i64, s: Source) -> Source {
        let g = a.cell_mode.gates();
        let params = |lin: i64| (0..a.dirs()).map(|d| a.weight_params(l * a.dirs() + d, lin)).collect::<Vec<_>>();
        // `(d) ? dir1 : dir0`, with -1 for what the weight space lacks.
        let by_dir = |v: Vec<i64>| format!("((d) ? {}LL : {}LL)", v.last().copied().unwrap_or(-1), v[0]);
        let m = |lin: i64| by_dir(params(lin).iter().map(|p| p.map_or(-1, |p| p.matrix_offset)).collect());
        let bias = |lin: i64| by_dir(params(lin).iter().map(|p| p.filter(|p| p.bias_len > 0).map_or(-1, |p| p.bias_offset)).collect());
        let part = a.reserve_layer(l);
        let prev = (l > 0).then(|| a.reserve_layer(l - 1));
        s.define("RNN_L", l)
            .define("RNN_IN", a.layer_input(l))
            .flag("LAYER0", l == 0)
            .flag("LAST", l + 1 == a.num_layers)
            .define("W_OFF(d)", m(0))
            .define("R_OFF(d)", m(g))
            .define("WR_OFF(d)", if a.has_proj() { m(2 * g) } else { "0LL".into() })
            .define("BW_OFF(d)", bias(0))
            .define("BR_OFF(d)", bias(g))
            .define("RES_STATES", format!("{}LL", part.states))
            .define("RES_OUT", format!("{}LL", part.outputs))
            .define("RES_MASK", format!("{}LL", part.mask.unwrap_or(-1)))
            .define("RES_OUT_PREV", format!("{}LL", prev.map_or(-1, |p| p.outputs)))
            .define("RES_MASK_PREV", format!("{}LL", prev.and_then(|p| p.mask).unwrap_or(-1)))
    }

    /// A signature with the scratch buffers `scratch` (name, index, written) and the ports
    /// `ports` (name, written) the node has.
    fn sig(&self, scratch: &[(&str, usize, bool)], ports: &[(&str, bool)]) -> Signature {
        let mut sig = Signature::new();
        for &(name, i, write) in scratch {
            let ct = if name == "meta" { "int" } else { "acc_t" };
            sig.scratch(ct, name, i, write);
        }
        for &(p, write) in ports {
            if let Some(id) = self.port(p) {
                sig.tensor(p, id, write);
            }
        }
        sig
    }

    fn entry(&self, what: &str) -> String {
        entry_name(self.ni, what)
    }

    fn meta_launch(&self, a: &RnnDesc) -> Launch {
        let entry = self.entry("rnn_meta");
        let sig = self.sig(&[("meta", 0, true)], &[("seq_lengths", false)]);
        let src = self.source(a, &entry, &sig, None, &[], include_str!("meta.cuh"));
        Launch::new(src, &entry, Grid::Exact(1, 1, 1), 256, sig.into_args())
    }

    fn fill_launch(&self, a: &RnnDesc, port: &str, v: f64) -> Option<Launch> {
        let id = self.port(port)?;
        let entry = self.entry(&format!("rnn_fill_{port}"));
        let mut sig = Signature::new();
        sig.tensor("out", id, true).f64("v", v);
        let src = self.source(a, &entry, &sig, None, &[("ST_OUT", ctype::st(self.graph, id))], include_str!("fill.cuh"));
        Some(Launch::elementwise(src, &entry, self.graph.desc(id).element_count().max(1) as u64, sig.into_args()))
    }

    fn recur_grid(&self, a: &RnnDesc) -> Result<Grid> {
        let b = u32::try_from(a.batch)
            .ok()
            .filter(|&b| b <= i32::MAX as u32)
            .ok_or_else(|| self.err(format!("runs a block per sample and takes at most 2^31 - 1 samples, got batch {}", a.batch)))?;
        Ok(Grid::Exact(b, a.dirs() as u32, 1))
    }

    fn meta_bytes(&self, a: &RnnDesc) -> usize {
        (a.batch as usize + a.max_seq_length as usize + 1) * 4
    }

    fn forward(&self, a: &RnnDesc) -> Result<NodeKernels> {
        let (t, b, d, h, p) = (a.max_seq_length, a.batch, a.dirs(), a.hidden_size, a.proj());
        let gh = a.cell_mode.gates() * h;
        let rows = t * b;
        let scratch = vec![self.meta_bytes(a), self.accs(d * rows * gh)?, self.accs(rows * a.out_size())?, self.accs(rows * a.out_size())?, self.accs(d * b * (p + 2 * h + gh))?];
        let mut launches = vec![self.meta_launch(a)];
        launches.extend(self.fill_launch(a, "y", a.padding_fill));
        if a.training {
            launches.extend(self.fill_launch(a, "reserve", 0.0));
        }
        for l in 0..a.num_layers {
            let entry = self.entry(&format!("rnn_fwd_proj_l{l}"));
            let mut ports = vec![("weights", false)];
            if l == 0 {
                ports.push(("x", false));
            }
            let mut scr = vec![("meta", 0, false), ("gx", 1, true)];
            if l > 0 {
                scr.push(("si", 3, false));
            }
            let sig = self.sig(&scr, &ports);
            let src = self.source(a, &entry, &sig, Some(l), &[], &[include_str!("fwd_proj.cuh"), GEMM_TILE].concat());
            launches.push(Launch::new(src, &entry, gemm_grid(&vec![(rows, gh); d as usize]), 256, sig.into_args()));

            let entry = self.entry(&format!("rnn_fwd_recur_l{l}"));
            let mut ports = vec![("weights", false), ("hx", false), ("cx", false), ("hy", true), ("cy", true)];
            if a.training {
                ports.push(("reserve", true));
            }
            let mut sig = self.sig(&[("meta", 0, false), ("gx", 1, false), ("so", 2, true), ("st", 4, true)], &ports);
            let clip = a.cell_clip.map_or((0.0, 0.0), |c| (c.lower, c.upper));
            sig.f64("clip_lower", clip.0).f64("clip_upper", clip.1);
            let extra = [("TRAINING", u8::from(a.training).to_string())];
            let src = self.source(a, &entry, &sig, Some(l), &extra, include_str!("fwd_recur.cuh"));
            launches.push(Launch::new(src, &entry, self.recur_grid(a)?, RECUR_THREADS, sig.into_args()));

            let last = l + 1 == a.num_layers;
            let dropout = a.training && a.has_dropout() && !last;
            let entry = self.entry(&format!("rnn_fwd_finish_l{l}"));
            let mut ports = vec![];
            if last {
                ports.push(("y", true));
            }
            if dropout {
                ports.push(("reserve", true));
            }
            let mut scr = vec![("meta", 0, false), ("so", 2, false)];
            if !last {
                scr.push(("si", 3, true));
            }
            let mut sig = self.sig(&scr, &ports);
            let mut extra = vec![("DROPOUT", u8::from(dropout).to_string())];
            if dropout {
                let (seed, offset) = (fallback_input(self.node, "seed")?, fallback_input(self.node, "offset")?);
                sig.ptr("seed_p", seed, false).ptr("offset_p", offset, false).f64("drop_p", a.dropout.unwrap_or(0.0));
                extra.push(("LD_SEED", ctype::ld(self.graph, seed)));
                extra.push(("LD_OFFSET", ctype::ld(self.graph, offset)));
            }
            let src = self.source(a, &entry, &sig, Some(l), &extra, include_str!("fwd_finish.cuh"));
            launches.push(Launch::elementwise(src, &entry, (rows * a.out_size()) as u64, sig.into_args()));
        }
        Ok(NodeKernels { launches, scratch })
    }

    fn backward_data(&self, a: &RnnDesc) -> Result<NodeKernels> {
        let (t, b, d, h, p) = (a.max_seq_length, a.batch, a.dirs(), a.hidden_size, a.proj());
        let rows = t * b;
        let f = a.out_size();
        let scratch = vec![self.meta_bytes(a), self.accs(d * rows * a.dgates_states())?, self.accs(rows * f.max(a.input_size))?, self.accs(d * b * (2 * p + 3 * h))?];
        let mut launches = vec![self.meta_launch(a)];
        launches.extend(self.fill_launch(a, "dx", a.padding_fill));
        launches.extend(self.fill_launch(a, "dgates", 0.0));
        let entry = self.entry("rnn_bwd_load");
        let sig = self.sig(&[("meta", 0, false), ("dseq", 2, true)], &[("dy", false)]);
        let src = self.source(a, &entry, &sig, None, &[], include_str!("bwd_load.cuh"));
        launches.push(Launch::elementwise(src, &entry, (rows * f) as u64, sig.into_args()));
        for l in (0..a.num_layers).rev() {
            let entry = self.entry(&format!("rnn_bwd_recur_l{l}"));
            let ports = [("weights", false), ("reserve", false), ("hx", false), ("cx", false), ("dhy", false), ("dcy", false), ("dhx", true), ("dcx", true), ("dgates", true)];
            let mut sig = self.sig(&[("meta", 0, false), ("dgs", 1, true), ("dseq", 2, false), ("st", 3, true)], &ports);
            let clip = a.cell_clip.map_or((0.0, 0.0), |c| (c.lower, c.upper));
            sig.f64("clip_lower", clip.0).f64("clip_upper", clip.1);
            let src = self.source(a, &entry, &sig, Some(l), &[], include_str!("bwd_recur.cuh"));
            launches.push(Launch::new(src, &entry, self.recur_grid(a)?, RECUR_THREADS, sig.into_args()));

            let entry = self.entry(&format!("rnn_bwd_proj_l{l}"));
            let mut ports = vec![("weights", false), ("reserve", false)];
            if l == 0 {
                ports.push(("dx", true));
            }
            let sig = self.sig(&[("meta", 0, false), ("dgs", 1, false), ("dseq", 2, true)], &ports);
            let src = self.source(a, &entry, &sig, Some(l), &[], &[include_str!("bwd_proj.cuh"), GEMM_TILE].concat());
            launches.push(Launch::new(src, &entry, gemm_grid(&[(rows, a.layer_input(l))]), 256, sig.into_args()));
        }
        Ok(NodeKernels { launches, scratch })
    }

    fn backward_weights(&self, a: &RnnDesc) -> Result<NodeKernels> {
        let scratch = vec![self.meta_bytes(a)];
        let mut launches = vec![self.meta_launch(a)];
        let entry = self.entry("rnn_dw_init");
        let sig = self.sig(&[], &[("dw_in", false), ("dw", true)]);
        let src = self.source(a, &entry, &sig, None, &[], include_str!("dw_init.cuh"));
        launches.push(Launch::elementwise(src, &entry, a.weight_space_elements().max(1) as u64, sig.into_args()));
        let (gh, h, p) = (a.cell_mode.gates() * a.hidden_size, a.hidden_size, a.proj());
        for l in 0..a.num_layers {
            let entry = self.entry(&format!("rnn_wgrad_l{l}"));
            let sig = self.sig(&[("meta", 0, false)], &[("x", false), ("hx", false), ("reserve", false), ("dgates", false), ("dw", true)]);
            let src = self.source(a, &entry, &sig, Some(l), &[], &[include_str!("wgrad.cuh"), GEMM_TILE].concat());
            // Per direction: W [GH, input], R [GH, P], W_r [P, H] (empty without a projection).
            let per_dir = [(gh, a.layer_input(l)), (gh, p), (if a.has_proj() { p } else { 0 }, h)];
            let problems: Vec<(i64, i64)> = (0..a.dirs()).flat_map(|_| per_dir).collect();
            launches.push(Launch::new(src, &entry, gemm_grid(&problems), 256, sig.into_args()));
            let entry = self.entry(&format!("rnn_wgrad_bias_l{l}"));
            let sig = self.sig(&[("meta", 0, false)], &[("dgates", false), ("dw", true)]);
            let src = self.source(a, &entry, &sig, Some(l), &[], include_str!("wgrad_bias.cuh"));
            launches.push(Launch::elementwise(src, &entry, (a.dirs() * 2 * gh) as u64, sig.into_args()));
        }
        Ok(NodeKernels { launches, scratch })
    }
}

fn fallback_input(node: &Node, port: &str) -> Result<TensorId> {
    node.input(port).ok_or_else(|| Error::op(node.op.kind(), &node.name, format!("input `{port}` is missing")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cuda::planner::{self, Family};
    use crate::engine::cuda::Options;
    use crate::graph::ops::rnn::RnnInputs;
    use crate::TensorDesc;

    /// A graph of the forward alone: y (and the reserve when training) as outputs.
    pub(super) fn graph(desc: &RnnDesc, dt: DataType) -> Graph {
        let mut g = Graph::new("rnn").io_data_type(dt);
        let x = g.tensor(TensorDesc::new("x", &desc.seq_dims(desc.input_size), dt));
        let w = g.tensor(TensorDesc::new("w", &[desc.weight_space_elements()], dt));
        let o = g.rnn(x, w, RnnInputs::default(), desc.clone());
        g.set_output(o.y);
        if let Some(r) = o.reserve {
            g.set_output(r);
        }
        g.validate().unwrap();
        g
    }

    #[test]
    fn the_planner_gives_rnn_nodes_to_the_rnn_engine_with_float_accumulators() {
        // (f32 data: f16 and bf16 forwards take the persistent kernel, persist.rs.)
        let d = RnnDesc::new(RnnMode::Lstm, 7, 13, 9, 5).layers(2).bidirectional().training();
        let g = graph(&d, DataType::F32);
        let planned = planner::plan(&g, &Target::sm90a(), &Options::default(), true).unwrap();
        assert_eq!(planned.len(), 1);
        assert_eq!(planned[0].family, Family::Rnn);
        let k = &planned[0].unit.kernels;
        // meta, fill y, fill reserve, then proj, recurrence and finish per layer.
        assert_eq!(k.launches.len(), 3 + 3 * 2);
        assert!(k.launches.iter().all(|l| l.source.contains("#define ACC_DOUBLE 0")));
        // The recurrence runs a block per (sample, direction).
        let recur: Vec<_> = k.launches.iter().filter(|l| l.entry.contains("fwd_recur")).collect();
        assert_eq!(recur.len(), 2);
        assert!(recur.iter().all(|l| l.grid == Grid::Exact(5, 2, 1)));
        // Scratch: meta (lengths and packed row starts), gx, the two sequence buffers, the
        // blocks' vectors; in floats.
        let (t, b, h, p, gh) = (9usize, 5usize, 13usize, 13usize, 52usize);
        assert_eq!(k.scratch, vec![(b + t + 1) * 4, 2 * t * b * gh * 4, t * b * 2 * p * 4, t * b * 2 * p * 4, 2 * b * (p + 2 * h + gh) * 4]);
    }

    #[test]
    fn the_fallback_plan_and_f64_compute_accumulate_in_double() {
        let d = RnnDesc::new(RnnMode::Gru, 3, 4, 5, 2).training();
        let g = graph(&d, DataType::F32);
        let fallback = planner::plan(&g, &Target::sm80(), &Options::default(), false).unwrap();
        assert_eq!(fallback[0].family, Family::Fallback);
        assert!(fallback[0].unit.kernels.launches.iter().all(|l| l.source.contains("#define ACC_DOUBLE 1")));
        assert_eq!(fallback[0].unit.kernels.scratch[1], 5 * 2 * 12 * 8);
        let g = graph(&d, DataType::F64);
        let fast = planner::plan(&g, &Target::sm80(), &Options::default(), true).unwrap();
        assert!(fast[0].unit.kernels.launches.iter().all(|l| l.source.contains("#define ACC_DOUBLE 1")));
    }

    #[test]
    fn weight_and_reserve_offsets_are_compiled_in() {
        let d = RnnDesc::new(RnnMode::Lstm, 7, 13, 9, 5).layers(2).bidirectional().with_proj(6).with_bias(crate::graph::ops::rnn::RnnBiasMode::SingleRec).training();
        let g = graph(&d, DataType::F32);
        let k = kernels(&g, 0, false).unwrap();
        let recur1 = k.launches.iter().find(|l| l.entry.ends_with("fwd_recur_l1")).unwrap();
        let (r0, r1) = (d.weight_params(2, 4).unwrap(), d.weight_params(3, 4).unwrap());
        assert!(recur1.source.contains(&format!("#define R_OFF(d) ((d) ? {}LL : {}LL)", r1.matrix_offset, r0.matrix_offset)));
        assert!(recur1.source.contains(&format!("#define BR_OFF(d) ((d) ? {}LL : {}LL)", r1.bias_offset, r0.bias_offset)));
        assert!(recur1.source.contains("#define BW_OFF(d) ((d) ? -1LL : -1LL)"));
        assert!(recur1.source.contains(&format!("#define RES_STATES {}LL", d.reserve_layer(1).states)));
    }

    #[test]
    fn a_batch_past_the_grid_limit_is_refused_not_truncated() {
        let d = RnnDesc::new(RnnMode::Tanh, 1, 1, 1, 1i64 << 32);
        let mut g = Graph::new("rnn").io_data_type(DataType::F32);
        let x = g.tensor(TensorDesc::new("x", &d.seq_dims(1), DataType::F32));
        let w = g.tensor(TensorDesc::new("w", &[d.weight_space_elements()], DataType::F32));
        let o = g.rnn(x, w, RnnInputs::default(), d.clone());
        g.set_output(o.y);
        g.validate().unwrap();
        let e = kernels(&g, 0, false).unwrap_err().to_string();
        assert!(e.contains("rnn") && e.contains("1 x 4294967296"), "{e}");
    }
}
