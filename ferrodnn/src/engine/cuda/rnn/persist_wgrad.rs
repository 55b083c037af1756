//! The fast `rnn_backward_weights` for 16-bit sequences: per layer, every matrix gradient of
//! both directions as one tensor-core GEMM on the GEMM engine (a batch of one per direction),
//! the biases as column sums, added into `dw`.
//!
//! Taken for f16 and bf16 `x` (and `hx`) with f32 compute on sm_80 or newer, every cell mode,
//! layout, direction count and bias mode, per-sample lengths; `reserve` and `dgates` of any
//! float type, `dw` / `dw_in` of any float type the graph allows. LSTM projections, dropout
//! between layers (the reserve's masks), f32/f64 data, and problems the GEMM engine declines
//! stay on the standard kernels (`rnn/mod.rs`: `wgrad.cuh`, `wgrad_bias.cuh`, `dw_init.cuh`).
//!
//! Per layer `l`, with `R = T * B` rows (`r = t * B + b`, the order of `dgates` and the
//! reserve), `K` its input size, `P = H` the state and `GW` the dgates record (`G * H`, GRU
//! `4H`), sizes padded to 8 elements (`GWP`, `KP`, `PPD`), as `persist_wgrad.cuh` says:
//! 1. `rnn_wg_dg_l{l}`: `dg [D, R, GWP]`, the layer's dgates in the data type, rows past a
//!    sample's length zero; and each column's sum over chunks of rows (from dgates as stored)
//!    into `part`, for the biases.
//! 2. `rnn_wg_in_l{l}`: `xin [D, R, KP + PPD]` = `[the layer's input | h_prev]` of each direction
//!    in the data type (the input: `x` at layer 0, else the layer below's output from the
//!    reserve; `h_prev`: the direction's previous step's output for each sample's own order, or
//!    `hx`, or 0), rows past a sample's length zero.
//! 3. The GEMM, a batch of one per direction: `cm[d] [GW, KP + PPD] (f32) = dg[d]^T x xin[d]`
//!    (`dg[d]` read column-major), every operand a plain batched matrix. One product gives `dW`
//!    and `dR` of every gate (GRU: its `4H` rows make `W`'s from the first three gates' entries
//!    and `R`'s with the recurrent n gate's, a third more work than two products, in one
//!    launch).
//! 4. `rnn_wg_out_l{l}`: the layer's part of `dw` = `dw_in` (0 without) + `cm`'s matrices + the
//!    biases (the chunk sums added in chunk order: deterministic, no atomics), one thread per
//!    element (so `dw_in` and `dw` may alias); every element of the weight space is written by
//!    its layer's launch, so no initializing pass.

use super::persist::{gemm_view_launches, round_up, share_scratch, Home};
use super::Gen;
use crate::engine::cuda::kernel::{ctype, Grid, Launch, NodeKernels, Target};
use crate::engine::cuda::Options;
use crate::error::Result;
use crate::graph::ops::rnn::{RnnBiasMode, RnnDesc, RnnMode};

const TEMPLATE: &str = include_str!("persist_wgrad.cuh");

/// Threads per block of the dgates conversion: 8 warps over 32 columns.
const DG_THREADS: u32 = 256;

/// Rows of a bias partial-sum chunk (a block of the dgates conversion): 32 or more, a multiple
/// of 8 (the block's warps), for at most 64 chunks, which each bias element of the output
/// kernel adds up.
fn chunk_rows(rows: i64) -> i64 {
    round_up(32.max((rows + 63) / 64), 8)
}

impl Gen<'_> {
    /// The fast weight gradient's kernels, or None when it does not take the problem.
    pub(super) fn fast_wgrad(&self, a: &RnnDesc, target: &Target, options: &Options) -> Result<Option<NodeKernels>> {
        let Some(io) = self.fast_io(a, target, "x") else { return Ok(None) };
        let (t, b, d, p) = (a.max_seq_length, a.batch, a.dirs(), a.proj());
        let rows = match t.checked_mul(b) {
            Some(r) if r <= i32::MAX as i64 => r,
            _ => return Ok(None),
        };
        let gw = a.dgates_states();
        let (gwp, ppd) = (round_up(gw, 8), round_up(p, 8));
        let kp_max = (0..a.num_layers).map(|l| round_up(a.layer_input(l), 8)).max().unwrap_or(8);
        let ch = chunk_rows(rows);
        let chunks = (rows + ch - 1) / ch;
        let bias = a.bias_mode != RnnBiasMode::NoBias;
        let elem = io.size() as i64;
        let bytes = |n: Option<i64>| n.and_then(|n| usize::try_from(n).ok()).map(|n| n.max(1));
        let sizes = [
            rows.checked_mul(d * gwp).and_then(|n| n.checked_mul(elem)),
            rows.checked_mul(d * (kp_max + ppd)).and_then(|n| n.checked_mul(elem)),
            (d * gw).checked_mul((kp_max + ppd) * 4),
            chunks.checked_mul(d * gwp * 4),
        ];
        let Some(sizes) = sizes.into_iter().map(bytes).collect::<Option<Vec<usize>>>() else { return Ok(None) };
        // meta, dg, xin, cm, part; then the GEMMs' own buffers.
        let (s_meta, s_dg, s_in, s_c, s_part) = (0usize, 1usize, 2usize, 3usize, 4usize);
        let mut scratch = vec![self.meta_bytes(a)];
        scratch.extend(sizes);
        let mut launches = vec![self.meta_launch(a)];
        let seq_t = ctype::c_type(io);
        for l in 0..a.num_layers {
            let k = a.layer_input(l);
            let kp = round_up(k, 8);
            let n = kp + ppd;
            let Some((layer_off, pl, has_bw)) = layer_layout(a, l) else { return Ok(None) };
            let common = [
                ("SEQ_T", seq_t.to_string()),
                ("GWP", gwp.to_string()),
                ("KP", kp.to_string()),
                ("WG_N", format!("{n}LL")),
                ("CH", format!("{ch}LL")),
                ("CHUNKS", chunks.to_string()),
                ("WG_BIAS", u8::from(bias).to_string()),
                ("WG_PL", format!("{pl}LL")),
                ("LAYER_OFF", format!("{layer_off}LL")),
                ("HAS_BW", u8::from(has_bw).to_string()),
            ];
            let with = |kernel: u8| {
                let mut v: Vec<(&str, String)> = vec![("WG_KERNEL", kernel.to_string())];
                v.extend(common.iter().cloned());
                v
            };

            let entry = self.entry(&format!("rnn_wg_dg_l{l}"));
            let mut sig = self.sig(&[("meta", s_meta, false)], &[("dgates", false)]);
            sig.scratch(seq_t, "dg", s_dg, true).scratch("float", "part", s_part, true);
            let src = self.source(a, &entry, &sig, Some(l), &with(0), TEMPLATE);
            let grid = Grid::Exact(((d * gwp + 31) / 32) as u32, chunks as u32, 1);
            launches.push(Launch::new(src, &entry, grid, DG_THREADS, sig.into_args()));

            let entry = self.entry(&format!("rnn_wg_in_l{l}"));
            let mut ports = vec![("reserve", false), ("hx", false)];
            if l == 0 {
                ports.push(("x", false));
            }
            let mut sig = self.sig(&[("meta", s_meta, false)], &ports);
            sig.scratch(seq_t, "xin", s_in, true);
            let src = self.source(a, &entry, &sig, Some(l), &with(1), TEMPLATE);
            launches.push(Launch::elementwise(src, &entry, (d * rows * n) as u64, sig.into_args()));

            let [a_view, b_view] = gemm_views(d, gw, gwp, rows, n);
            let base = scratch.len();
            let homes = [Home::Scratch(s_dg), Home::Scratch(s_in), Home::Scratch(s_c)];
            // Every operand is a scratch buffer (aligned): the GEMM's unaligned alternative is
            // never needed.
            let Some((gk, _)) = gemm_view_launches(io, (&a_view.0, &a_view.1), (&b_view.0, &b_view.1), homes, base, target, options)? else {
                return Ok(None);
            };
            share_scratch(&mut scratch, base, &gk.scratch);
            launches.extend(gk.launches);

            let entry = self.entry(&format!("rnn_wg_out_l{l}"));
            let mut sig = self.sig(&[], &[("dw_in", false), ("dw", true)]);
            sig.scratch("float", "cm", s_c, false).scratch("float", "part", s_part, false);
            let src = self.source(a, &entry, &sig, Some(l), &with(2), TEMPLATE);
            launches.push(Launch::elementwise(src, &entry, (d * pl) as u64, sig.into_args()));
        }
        Ok(Some(NodeKernels { launches, scratch }))
    }
}

/// The layer's GEMM operands `(dims, strides)` in elements, for `cm [D, GW, N] = dg^T x xin` a
/// batch of one per direction (no batch dim when unidirectional): A = `dg[d]^T [GW, R]`,
/// column-major (`dg [D, R, GWP]`); B = `xin[d] [R, N]`, row-major (`xin [D, R, N]`).
fn gemm_views(d: i64, gw: i64, gwp: i64, rows: i64, n: i64) -> [(Vec<i64>, Vec<i64>); 2] {
    if d == 1 {
        [(vec![gw, rows], vec![1, gwp]), (vec![rows, n], vec![n, 1])]
    } else {
        [(vec![d, gw, rows], vec![rows * gwp, 1, gwp]), (vec![d, rows, n], vec![rows * n, n, 1])]
    }
}

/// Layer `l`'s place in the weight space as the output kernel assumes it: its first element,
/// the elements of one pseudo-layer, and whether the input biases are there; None where
/// [`RnnDesc::weight_params`] says otherwise (each pseudo-layer `W [G * H, K]`, `R [G * H, P]`,
/// the input biases, the recurrent ones, the directions one after the other).
fn layer_layout(a: &RnnDesc, l: i64) -> Option<(i64, i64, bool)> {
    let (g, h, p, k) = (a.cell_mode.gates(), a.hidden_size, a.proj(), a.layer_input(l));
    let gh = g * h;
    let first = a.weight_params(l * a.dirs(), 0)?;
    let has_bw = first.bias_len > 0;
    let has_br = a.weight_params(l * a.dirs(), g)?.bias_len > 0;
    let pl = gh * (k + p) + gh * (i64::from(has_bw) + i64::from(has_br));
    for dir in 0..a.dirs() {
        let start = first.matrix_offset + dir * pl;
        for gate in 0..g {
            let w = a.weight_params(l * a.dirs() + dir, gate)?;
            let r = a.weight_params(l * a.dirs() + dir, g + gate)?;
            let ok = w.matrix_offset == start + gate * h * k
                && r.matrix_offset == start + gh * k + gate * h * p
                && (!has_bw || w.bias_offset == start + gh * (k + p) + gate * h)
                && (!has_br || r.bias_offset == start + gh * (k + p) + if has_bw { gh } else { 0 } + gate * h);
            if !ok {
                return None;
            }
        }
    }
    if a.cell_mode == RnnMode::Gru && a.dgates_states() != 4 * h {
        return None;
    }
    Some((first.matrix_offset, pl, has_bw))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DataType;
    use crate::engine::cuda::planner;
    use crate::graph::ops::rnn::RnnLayout;
    use crate::{Graph, TensorDesc};

    /// A graph of the backward weights alone: x, the reserve and dgates (f32) as inputs, with
    /// hx, lengths and dw_in.
    fn wgrad_graph(desc: &RnnDesc, dt: DataType) -> Graph {
        let mut g = Graph::new("rnn_wgrad").io_data_type(dt);
        let x = g.tensor(TensorDesc::new("x", &desc.seq_dims(desc.input_size), dt));
        let reserve = g.tensor(TensorDesc::new("reserve", &[desc.reserve_elements()], DataType::F32));
        let dgates = g.tensor(TensorDesc::new("dgates", &[desc.dgates_elements()], DataType::F32));
        let hx = g.tensor(TensorDesc::new("hx", &[desc.pseudo_layers(), desc.batch, desc.proj()], dt));
        let len = g.tensor(TensorDesc::new("len", &[desc.batch], DataType::I32));
        let dw_in = g.tensor(TensorDesc::new("dw_in", &[desc.weight_space_elements()], DataType::F32));
        let dw = g.rnn_backward_weights(x, reserve, dgates, Some(hx), Some(len), Some(dw_in), desc.clone());
        g.set_output(dw);
        g.validate().unwrap();
        g
    }

    fn entries(g: &Graph, target: &Target) -> Vec<String> {
        let planned = planner::plan(g, target, &Options::default(), true).unwrap();
        assert_eq!(planned.len(), 1);
        planned[0].unit.kernels.launches.iter().map(|l| l.entry.clone()).collect()
    }

    #[test]
    fn half_precision_weight_gradients_run_a_gemm_per_layer_and_others_the_standard_kernels() {
        let d = RnnDesc::new(RnnMode::Gru, 13, 40, 7, 5).layers(2).bidirectional().with_layout(RnnLayout::BatchMajorUnpacked).training();
        for target in [Target::sm80(), Target::sm90a()] {
            for dt in [DataType::F16, DataType::Bf16] {
                let e = entries(&wgrad_graph(&d, dt), &target);
                for l in 0..2 {
                    for k in ["rnn_wg_dg", "rnn_wg_in", "rnn_wg_out"] {
                        assert_eq!(e.iter().filter(|n| n.ends_with(&format!("{k}_l{l}"))).count(), 1, "{k}_l{l} in {e:?}");
                    }
                }
                // A GEMM per layer (its launches between the layer's conversions and its output).
                let gemm_at = |l: usize| e.iter().position(|n| n.ends_with(&format!("rnn_wg_in_l{l}"))).unwrap() + 1;
                for l in 0..2 {
                    assert!(e[gemm_at(l)].contains("gemm"), "{e:?}");
                }
                assert!(!e.iter().any(|n| n.contains("rnn_wgrad_l") || n.contains("dw_init")), "{e:?}");
            }
        }
        // f32 data, an LSTM projection and dropout between layers run the standard kernels.
        let lstm = RnnDesc::new(RnnMode::Lstm, 13, 40, 7, 5).layers(2).training();
        let dropout = RnnDesc { dropout: Some(0.25), ..lstm.clone() };
        for (desc, dt, target) in
            [(d.clone(), DataType::F32, Target::sm90a()), (lstm.clone().with_proj(24), DataType::F16, Target::sm90a()), (dropout, DataType::F16, Target::sm80())]
        {
            let e = entries(&wgrad_graph(&desc, dt), &target);
            assert!(e.iter().any(|n| n.ends_with("rnn_wgrad_l1")) && !e.iter().any(|n| n.contains("rnn_wg_")), "{e:?}");
        }
    }

    #[test]
    fn the_output_kernel_knows_the_weight_space_of_every_bias_mode() {
        for mode in [RnnMode::Relu, RnnMode::Lstm, RnnMode::Gru] {
            for bias in [RnnBiasMode::NoBias, RnnBiasMode::SingleInp, RnnBiasMode::Double, RnnBiasMode::SingleRec] {
                let a = RnnDesc::new(mode, 13, 40, 7, 5).layers(2).bidirectional().with_bias(bias);
                let mut next = 0;
                for l in 0..2 {
                    let (off, pl, has_bw) = layer_layout(&a, l).unwrap();
                    assert_eq!(off, next);
                    assert_eq!(has_bw, matches!(bias, RnnBiasMode::SingleInp | RnnBiasMode::Double));
                    next = off + 2 * pl;
                }
                assert_eq!(next, a.weight_space_elements());
            }
        }
    }

    #[test]
    fn bias_chunks_are_few_and_whole_warps() {
        assert_eq!(chunk_rows(35), 32);
        assert_eq!(chunk_rows(256 * 64), 256);
        for rows in [1, 7, 2049, 1 << 20, i32::MAX as i64] {
            let ch = chunk_rows(rows);
            assert!(ch % 8 == 0 && (rows + ch - 1) / ch <= 64, "{rows}: {ch}");
        }
    }
}
