//! The fast `rnn_backward_data`: per layer, from the top down, the backward recurrence as one
//! persistent kernel (`persist_bwd.cuh`: each block keeps its units' columns of the recurrent
//! matrix in shared memory for the whole sequence and multiplies the exchanged gate gradients
//! with them on the tensor cores, meeting the other blocks at a grid barrier each step), then the
//! gradient of the layer's input for every step at once as one GEMM on the GEMM engine:
//! `din [T * B, K] (f32) = dgx [T * B, D * G * H] x W`, with `dgx` the input-side gate gradients
//! the recurrence wrote in the sequence type and `W` every direction's input matrix copied into
//! scratch (`[D * G * H, K']`, as the forward's projection copies it). Below the top layer `din`
//! is the next layer's gradient from above (the scratch `dseq`); at layer 0 a last kernel writes
//! it into dx's valid rows (`persist_dx.cuh`).
//!
//! Taken where the fast forward is (rnn/persist.rs: f16 and bf16 data and weights, f32 compute,
//! no LSTM projection, no dropout between layers, sm_80 or newer) and the blocks fit: at most one
//! block an SM, a block's 16 (or more) units' columns of R in shared memory. The gate gradients
//! are rounded to the sequence type for the products (the recurrent one and the input GEMM), as
//! the forward rounds the state; `dgates` keeps them in its own type.

use super::persist::{batch_groups, gemm_launches, mma_defines, round_up, share_scratch, smem_limit, warp_split, Home, Shape, PERSIST_COMMON, THREADS};
use super::Gen;
use crate::engine::cuda::kernel::{ctype, Grid, Launch, NodeKernels, Target, Unaligned};
use crate::engine::cuda::Options;
use crate::error::Result;
use crate::graph::ops::rnn::{RnnDesc, RnnLayout, RnnMode};

/// Floats a block keeps per (sample, unit) besides the products: the prefetched reserve values
/// and gradient from above (persist_bwd.cuh's PB_NPRE, at most 7), the step's gate gradients (4),
/// dhy, dc and GRU's z * dh.
fn per_unit_floats(mode: RnnMode) -> i64 {
    let pre = match mode {
        RnnMode::Lstm => 7,
        RnnMode::Gru => 6,
        RnnMode::Relu | RnnMode::Tanh => 2,
    };
    pre + 4 + 3
}

/// The backward kernel's block shape for `a` on `target`, or None when no shape lets every block
/// of the grid be resident at once.
///
/// Every block reads its samples' whole gate-gradient vectors each step (G x H elements a
/// sample, whatever its share of the units), and its products take at least 16 units (an mma
/// tile's rows): so the fewest blocks along the units that hold 16 units each (then 32, 48 and 64
/// where 16 would need more blocks than SMs), and the batch split over as many blocks as the SMs
/// then allow (each block's loads a fraction of the batch's; the L2 traffic stays the same).
pub(super) fn bwd_shape(a: &RnnDesc, target: &Target, elem: i64) -> Option<Shape> {
    let (b, d, h) = (a.batch, a.dirs(), a.hidden_size);
    let gk = round_up(a.cell_mode.gates() * h, 32);
    let pu = [16, 32, 48, 64].into_iter().find(|pu| d * ((h + pu - 1) / pu) <= i64::from(target.sm_count))?;
    let (pn, nb) = (pu, (h + pu - 1) / pu);
    let (nbb, bp) = batch_groups(b, d * nb, target, i64::MAX);
    let (wm, wk) = warp_split(bp);
    let smem = pn * (gk + 8) * elem + (wk * bp * pn + bp * pu * per_unit_floats(a.cell_mode) + b) * 4;
    (smem <= smem_limit(target)).then_some(Shape { pu, pn, nb, nbb, bp, wm, wk, smem })
}

impl Gen<'_> {
    /// The fast backward data's kernels, or None when it does not take the problem.
    pub(super) fn fast_backward_data(&self, a: &RnnDesc, target: &Target, options: &Options) -> Result<Option<(NodeKernels, Option<Box<Unaligned>>)>> {
        let Some(io) = self.fast_io(a, target, "dy") else { return Ok(None) };
        let elem = io.size() as i64;
        let Some(sh) = bwd_shape(a, target, elem) else { return Ok(None) };
        let (t, b, d, h, g) = (a.max_seq_length, a.batch, a.dirs(), a.hidden_size, a.cell_mode.gates());
        let rows = t * b;
        let gh = g * h;
        let (xb, gk, dgp) = (sh.nbb * sh.bp, round_up(gh, 32), round_up(d * gh, 8));
        let layers = a.num_layers;
        let kp_max = (0..layers).map(|l| round_up(a.layer_input(l), 8)).max().unwrap_or(8);
        let bytes = |n: i64| usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(1);
        // meta, W's copy, dgx, dseq, the exchange buffers, the barrier counters.
        let (s_meta, s_w, s_dgx, s_dseq, s_gb, s_bar) = (0usize, 1usize, 2usize, 3usize, 4usize, 5usize);
        let mut scratch = vec![
            self.meta_bytes(a),
            bytes(d * gh * kp_max * elem),
            bytes(rows * dgp * elem),
            bytes(rows * a.out_size().max(a.input_size) * 4),
            bytes(layers * d * 2 * xb * gk * elem),
            bytes(layers * d * 4),
        ];
        let mut launches = vec![self.meta_launch(a)];
        // A packed dx's padding rows (past the lengths' sum); the last kernel fills the padding of
        // the other layouts.
        if self.port("seq_lengths").is_some() && a.layout == RnnLayout::SeqMajorPacked {
            launches.extend(self.fill_launch(a, "dx", a.padding_fill));
        }
        launches.push(self.pr_zero_launch(a, (s_gb, layers * d * 2 * xb * gk * elem / 4), s_bar));
        let entry = self.entry("rnn_bwd_load");
        let sig = self.sig(&[("meta", s_meta, false), ("dseq", s_dseq, true)], &[("dy", false)]);
        let src = self.source(a, &entry, &sig, None, &[], include_str!("bwd_load.cuh"));
        launches.push(Launch::elementwise(src, &entry, (rows * a.out_size()) as u64, sig.into_args()));
        let seq_t = ctype::c_type(io);
        for l in (0..layers).rev() {
            let entry = self.entry(&format!("rnn_pb_recur_l{l}"));
            let mut sig = self.sig(&[("meta", s_meta, false)], &[]);
            sig.scratch("float", "dseq", s_dseq, false);
            sig.scratch(seq_t, "dgx", s_dgx, true);
            // Every layer's exchange buffers and counters (the kernel offsets to its own).
            sig.scratch(seq_t, "gb_all", s_gb, true).scratch("int", "bar_all", s_bar, true);
            for (port, write) in
                [("weights", false), ("reserve", false), ("hx", false), ("cx", false), ("dhy", false), ("dcy", false), ("dhx", true), ("dcx", true), ("dgates", true)]
            {
                if let Some(id) = self.port(port) {
                    sig.tensor(port, id, write);
                }
            }
            let clip = a.cell_clip.map_or((0.0, 0.0), |c| (c.lower, c.upper));
            sig.f32("clip_lower", clip.0).f32("clip_upper", clip.1);
            let mut extra = mma_defines(&sh, gk, io);
            extra.extend([("DGP", format!("{dgp}LL")), ("LAYER_HB", format!("{}LL", l * d * 2 * xb * gk)), ("LAYER_BAR", (l * d).to_string())]);
            let src = self.source(a, &entry, &sig, Some(l), &extra, &[PERSIST_COMMON, include_str!("persist_bwd.cuh")].concat());
            launches.push(Launch::new(src, &entry, Grid::Exact(sh.nb as u32, d as u32, sh.nbb as u32), THREADS, sig.into_args()).with_shared(sh.smem as u32));

            // The layer input's gradient: dgx x W, W copied as [D * G * H][K'].
            launches.push(self.pr_wcopy_launch(a, l, io, s_w));
            let k = a.layer_input(l);
            let base = scratch.len();
            let homes = [Home::Scratch(s_dgx), Home::Scratch(s_w), Home::Scratch(s_dseq)];
            // Every operand is scratch, whose slices are 256-byte aligned in the workspace: the
            // GEMM's kernels for unaligned operands are never needed.
            let Some((gk_launches, _)) = gemm_launches(io, (rows, d * gh, dgp, 1), (k, round_up(k, 8), 1), homes, base, target, options)? else {
                return Ok(None);
            };
            share_scratch(&mut scratch, base, &gk_launches.scratch);
            launches.extend(gk_launches.launches);
        }
        let entry = self.entry("rnn_pb_dx");
        let mut sig = self.sig(&[("meta", s_meta, false)], &[("dx", true)]);
        sig.scratch("float", "dseq", s_dseq, false).f64("pad", a.padding_fill);
        let src = self.source(a, &entry, &sig, Some(0), &[], include_str!("persist_dx.cuh"));
        launches.push(Launch::elementwise(src, &entry, (rows * a.input_size) as u64, sig.into_args()));
        Ok(Some((NodeKernels { launches, scratch }, None)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DataType;
    use crate::engine::cuda::planner;
    use crate::graph::ops::rnn::RnnBackwardInputs;
    use crate::{Graph, TensorDesc};

    /// A graph of the backward data alone.
    fn graph(desc: &RnnDesc, dt: DataType) -> Graph {
        let mut g = Graph::new("rnn_bwd").io_data_type(dt);
        let dy = g.tensor(TensorDesc::new("dy", &desc.seq_dims(desc.out_size()), dt));
        let w = g.tensor(TensorDesc::new("w", &[desc.weight_space_elements()], dt));
        let r = g.tensor(TensorDesc::new("reserve", &[desc.reserve_elements()], DataType::F32));
        let o = g.rnn_backward_data(dy, w, r, RnnBackwardInputs::default(), desc.clone());
        g.set_output(o.dx);
        g.set_output(o.dgates);
        g.validate().unwrap();
        g
    }

    #[test]
    fn blocks_take_16_units_and_fill_the_sms_at_most_once() {
        let t = Target::new("sm_90a", 132);
        // LSTM 1024: 64 blocks of 16 units, R's 4096 rows of them in 128 KiB; the batch of 64 in
        // two halves, 128 blocks.
        let a = RnnDesc::new(RnnMode::Lstm, 1024, 1024, 256, 64).training();
        let s = bwd_shape(&a, &t, 2).unwrap();
        assert_eq!((s.pu, s.pn, s.nb, s.nbb, s.bp, s.wm, s.wk), (16, 16, 64, 2, 32, 2, 8));
        // Both directions: 128 blocks along the units, the batch whole.
        let s = bwd_shape(&a.clone().bidirectional(), &t, 2).unwrap();
        assert_eq!((s.nb, s.nbb, s.bp), (64, 1, 64));
        // A batch of 17 in two groups of 16 and 1; of 8, one group.
        assert_eq!(batch_groups(17, 64, &t, i64::MAX), (2, 16));
        assert_eq!(batch_groups(8, 16, &t, i64::MAX), (1, 16));
        assert_eq!(batch_groups(64, 16, &t, i64::MAX), (4, 16));
        assert_eq!(batch_groups(40, 40, &t, i64::MAX), (3, 16));
        // A hidden size of 4096 in both directions needs 2 x 256 blocks of 16 units, or 2 x 128 of
        // 32, or 2 x 86 of 48, or 2 x 64 of 64 units: each too much shared memory.
        assert!(bwd_shape(&RnnDesc::new(RnnMode::Gru, 8, 4096, 8, 8).bidirectional().training(), &t, 2).is_none());
        // sm_80's 163 KiB do not hold LSTM 1024's columns with a batch of 64.
        assert!(bwd_shape(&a, &Target::new("sm_80", 108), 2).is_none());
    }

    #[test]
    fn half_precision_backwards_run_a_persistent_recurrence_and_a_gemm_per_layer() {
        let d = RnnDesc::new(RnnMode::Gru, 24, 40, 11, 37).layers(2).bidirectional().training();
        for dt in [DataType::F16, DataType::Bf16] {
            let planned = planner::plan(&graph(&d, dt), &Target::sm90a(), &Options::default(), true).unwrap();
            let k = &planned[0].unit.kernels;
            let entries: Vec<&str> = k.launches.iter().map(|l| l.entry.as_str()).collect();
            assert_eq!(entries.iter().filter(|e| e.contains("rnn_pb_recur")).count(), 2, "{entries:?}");
            assert!(entries.iter().filter(|e| e.contains("gemm")).count() >= 2, "{entries:?}");
            assert!(!entries.iter().any(|e| e.contains("bwd_recur") || e.contains("bwd_proj")), "{entries:?}");
        }
        // f32 data, f16 with an LSTM projection, and a reserve holding dropout masks between
        // layers (whatever the backward's own training flag says) stay on the standard kernels.
        let lstmp = RnnDesc::new(RnnMode::Lstm, 24, 40, 11, 37).with_proj(5).training();
        let masks = RnnDesc { dropout: Some(0.3), ..RnnDesc::new(RnnMode::Lstm, 24, 40, 11, 37).layers(2) };
        for (d, dt) in [(d.clone(), DataType::F32), (lstmp, DataType::F16), (masks, DataType::F16)] {
            let planned = planner::plan(&graph(&d, dt), &Target::sm90a(), &Options::default(), true).unwrap();
            assert!(planned[0].unit.kernels.launches.iter().any(|l| l.entry.contains("bwd_recur")));
        }
    }
}
