//! The fast forward of the `rnn` op (inference and training): per layer, the input projection
//! of every step as one tensor-core GEMM on the GEMM engine, then the recurrence as one
//! persistent kernel (`persist.cuh`) that keeps the recurrent weights in shared memory for the
//! whole sequence and meets at a grid barrier each step.
//!
//! Taken for f16 and bf16 sequences and weights with f32 compute, every cell mode, layout,
//! direction count and bias mode, cell clipping and per-sample lengths, on sm_80 or newer; LSTM
//! projections, dropout between layers in training and f32/f64 data stay on the standard engine
//! (`rnn/mod.rs`), as do problems whose blocks would not all be resident at once. The reserve is
//! written record for record as the standard forward writes it, so the backward reads either.
//!
//! Layer `l`'s GEMM: `gx [rows, D * G * H] (f32) = in [rows, K] x W^T`, with `in` the sequence
//! `x` (viewed as a matrix: layer 0) or the previous layer's output (a scratch sequence in the
//! data type) and `W` every direction's input matrix, copied into scratch as `[D * G * H, K']`
//! (rows padded to 8 elements). The biases are added by the recurrence.

use super::Gen;
use crate::dtype::DataType;
use crate::engine::cuda::gemm;
use crate::engine::cuda::kernel::{ctype, Arg, Grid, Launch, NodeKernels, Target, Unaligned};
use crate::engine::cuda::Options;
use crate::error::Result;
use crate::graph::ops::rnn::{RnnDesc, RnnLayout};
use crate::graph::ops::Op;
use crate::graph::{Graph, TensorId};
use crate::TensorDesc;

/// The helpers and the tensor-core product the persistent kernels share.
pub(super) const PERSIST_COMMON: &str = include_str!("persist_common.cuh");

/// Threads per block of the persistent kernel (`PR_THREADS` in persist.cuh): 16 warps.
pub(super) const THREADS: u32 = 512;
const WARPS: i64 = 16;

pub(super) fn round_up(v: i64, m: i64) -> i64 {
    (v + m - 1) / m * m
}

/// The persistent kernel's shape for a problem.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Shape {
    /// Hidden units a block owns, its gate rows (`G * pu` rounded up to 16), blocks per direction
    /// along the units.
    pub pu: i64,
    pub pn: i64,
    pub nb: i64,
    /// Blocks per direction along the batch, and each one's samples rounded up to 16.
    pub nbb: i64,
    pub bp: i64,
    /// Warps along the block's samples and along the exchanged vector.
    pub wm: i64,
    pub wk: i64,
    /// Dynamic shared memory in bytes.
    pub smem: i64,
}

/// The most dynamic shared memory a block may have on `target`.
pub(super) fn smem_limit(target: &Target) -> i64 {
    match target.cc() {
        90.. => 227 * 1024,
        80 | 87 => 163 * 1024,
        _ => 99 * 1024,
    }
}

/// The block's 16 warps along its samples' 16-row tiles (a power of 2, at most one a tile) and
/// along the exchanged vector: `(WM, WK)`.
pub(super) fn warp_split(samples: i64) -> (i64, i64) {
    let mt = round_up(samples, 16) / 16;
    let wm = (mt as u64).next_power_of_two().min(WARPS as u64) as i64;
    (wm, WARPS / wm)
}

/// The batch of `b` samples in groups of a multiple of 16 (none empty), as many as `want` and
/// the 16-row tiles allow where `blocks` blocks take each group: `(groups, samples a group)`.
pub(super) fn batch_groups(b: i64, blocks: i64, target: &Target, want: i64) -> (i64, i64) {
    let n = want.min(i64::from(target.sm_count) / blocks.max(1)).min((b + 15) / 16).max(1);
    let bp = round_up((b + n - 1) / n, 16);
    ((b + bp - 1) / bp, bp)
}

/// The block shape for `a` on `target`, or None when no block shape lets every block of the grid
/// be resident at once (at most one block an SM, its rows of R in shared memory).
///
/// Each step every block multiplies the whole previous state (read from L2) with its rows of R.
/// Blocks of 32 gate rows are taken first (measured on the H100, hidden 1024, 256 steps of
/// batch 64: LSTM 2.46 ms against 2.84 with 48 rows, GRU 2.55 against 2.74; batches 1 and 8
/// within 3% either way; 64 rows were 1.9x slower before the state's loads were 16 bytes wide),
/// then 48, 64 and 16, the first whose grid fits the SMs and whose shared memory fits. The batch
/// stays in one group: 64-row blocks with the batch of 64 in two groups (128 blocks, each loading
/// half the state) measured 3-4% faster on the H200 for LSTM and GRU hidden 1024 but 7-22% slower
/// at batches 1 and 8 and bidirectional (there the batch cannot split and 64 rows cost more).
pub(super) fn shape(a: &RnnDesc, target: &Target, elem: i64) -> Option<Shape> {
    let (b, d, h, p, g) = (a.batch, a.dirs(), a.hidden_size, a.proj(), a.cell_mode.gates());
    let pp = round_up(p, 32);
    for pn in [32, 48, 64, 16] {
        let pu = (pn / g).min(h);
        let nb = (h + pu.max(1) - 1) / pu.max(1);
        if pu < 1 || d * nb > i64::from(target.sm_count) {
            continue;
        }
        let (nbb, bp) = batch_groups(b, d * nb, target, 1);
        let (wm, wk) = warp_split(bp);
        let stash = if a.training { bp * pu * (g + 1) } else { 0 };
        let smem = pn * (pp + 8) * elem + (wk * bp * pn + bp * pn + 2 * bp * pu + 2 * pn + b + stash) * 4;
        if smem <= smem_limit(target) {
            return Some(Shape { pu, pn, nb, nbb, bp, wm, wk, smem });
        }
    }
    None
}

/// `x` as a `[rows, input]` matrix whose row `r` is the standard engine's `rnn_row` of each
/// (step, sample): the strides of a seq-major or batch-major tensor whose two outer dims
/// collapse, or a packed one's.
fn x_matrix(a: &RnnDesc, xd: &TensorDesc) -> Option<(i64, i64, i64)> {
    let s = &xd.strides;
    match a.layout {
        RnnLayout::SeqMajorPacked => Some((xd.dims[0], s[0], s[1])),
        RnnLayout::SeqMajorUnpacked => (a.max_seq_length == 1 || s[0] == a.batch * s[1]).then_some((a.max_seq_length * a.batch, s[1], s[2])),
        RnnLayout::BatchMajorUnpacked => (a.batch == 1 || s[0] == a.max_seq_length * s[1]).then_some((a.max_seq_length * a.batch, s[1], s[2])),
    }
}

/// A GEMM's own scratch buffers `ks` placed at `base` in the node's list `scratch`, each slot as
/// large as any GEMM planned there needs (the layers' GEMMs run one after the other and share
/// them).
pub(super) fn share_scratch(scratch: &mut Vec<usize>, base: usize, ks: &[usize]) {
    for (i, &bytes) in ks.iter().enumerate() {
        match scratch.get_mut(base + i) {
            Some(s) => *s = (*s).max(bytes),
            None => scratch.push(bytes),
        }
    }
}

/// Where a tensor of a layer's GEMM view lives in the node's plan.
#[derive(Clone, Copy)]
pub(super) enum Home {
    Tensor(TensorId),
    Scratch(usize),
}

/// The GEMM `c [m, n] (f32, dense) = a [m, k] x b [k, n]` of one layer (the forward's `gx = in x
/// W^T`, the backward's input gradient) planned on a graph of the matmul alone, `a` and `b` in the
/// sequence type with the strides given, its launches pointed at the node's buffers: the view's
/// tensors 0 (a), 1 (b) and 2 (c) at `homes`, its own scratch after the node's first `base`
/// buffers. None when the GEMM engine declines or a launch reads a view tensor's dims from the
/// plan.
pub(super) fn gemm_launches(
    io: DataType,
    (m, k, a_rs, a_cs): (i64, i64, i64, i64),
    (n, b_rs, b_cs): (i64, i64, i64),
    homes: [Home; 3],
    base: usize,
    target: &Target,
    options: &Options,
) -> Result<Option<(NodeKernels, Option<NodeKernels>)>> {
    gemm_view_launches(io, (&[m, k], &[a_rs, a_cs]), (&[k, n], &[b_rs, b_cs]), homes, base, target, options)
}

/// [`gemm_launches`] for any strided operands: `C = A x B` with A and B in `io`, each given as
/// `(dims, strides)` in elements (batch dims first, as a matmul takes them), and C in f32,
/// contiguous, of the matmul's dims (the weight gradient, `persist_wgrad.rs`, multiplies a
/// column-major A by a row-major B, a batch of one per direction).
pub(super) fn gemm_view_launches(
    io: DataType,
    (a_dims, a_strides): (&[i64], &[i64]),
    (b_dims, b_strides): (&[i64], &[i64]),
    homes: [Home; 3],
    base: usize,
    target: &Target,
    options: &Options,
) -> Result<Option<(NodeKernels, Option<NodeKernels>)>> {
    let r = a_dims.len();
    if r < 2 || b_dims.len() != r {
        return Ok(None);
    }
    let mut c_dims = a_dims[..r - 1].to_vec();
    c_dims.push(b_dims[r - 1]);
    let mut v = Graph::new("rnn_projection").io_data_type(io).compute_data_type(DataType::F32);
    let a = v.tensor(TensorDesc::new("in", a_dims, io).with_strides(a_strides));
    let w = v.tensor(TensorDesc::new("w", b_dims, io).with_strides(b_strides));
    let c = v.matmul(a, w);
    *v.desc_mut(c) = TensorDesc::new("gx", &c_dims, DataType::F32);
    v.set_output(c);
    if v.validate().is_err() {
        return Ok(None);
    }
    let Some(unit) = gemm::unit(&v, &[0], target, options)? else { return Ok(None) };
    let point = |mut k: NodeKernels| -> Option<NodeKernels> {
        for l in &mut k.launches {
            for arg in &mut l.args {
                let home = |t: TensorId| homes.get(t.0).copied();
                let new = match arg {
                    Arg::Scratch(i) | Arg::ScratchTensorMap(i, _) => {
                        *i += base;
                        None
                    }
                    Arg::Ptr(t) => Some(match home(*t)? {
                        Home::Tensor(real) => Arg::Ptr(real),
                        Home::Scratch(i) => Arg::Scratch(i),
                    }),
                    Arg::TensorMap(desc) => Some(match home(desc.tensor)? {
                        Home::Tensor(real) => {
                            let mut desc = desc.clone();
                            desc.tensor = real;
                            Arg::TensorMap(desc)
                        }
                        Home::Scratch(i) => Arg::ScratchTensorMap(i, desc.clone()),
                    }),
                    Arg::Ref(_) | Arg::Scalar { .. } | Arg::ScalarWord(_) => return None,
                    _ => None,
                };
                if let Some(new) = new {
                    *arg = new;
                }
            }
        }
        Some(k)
    };
    let Some(primary) = point(unit.kernels) else { return Ok(None) };
    let alt = match unit.unaligned {
        Some(alt) => match point(alt.kernels) {
            Some(k) => Some(k),
            None => return Ok(None),
        },
        None => None,
    };
    Ok(Some((primary, alt)))
}

/// The defines of persist_common.cuh for block shape `sh` and the exchanged vector's padded
/// length `pp`, and of the sequence type `io`.
pub(super) fn mma_defines(sh: &Shape, pp: i64, io: DataType) -> Vec<(&'static str, String)> {
    let pairs = pp / 32;
    vec![
        ("PU", sh.pu.to_string()),
        ("PN", sh.pn.to_string()),
        ("NB", sh.nb.to_string()),
        ("NBB", sh.nbb.to_string()),
        ("PP", pp.to_string()),
        ("BP", sh.bp.to_string()),
        ("XB", (sh.nbb * sh.bp).to_string()),
        ("WM", sh.wm.to_string()),
        ("WK", sh.wk.to_string()),
        ("KPW", ((pairs + sh.wk - 1) / sh.wk).to_string()),
        ("SEQ_T", ctype::c_type(io).to_string()),
        ("SEQ_BF16", u8::from(io == DataType::Bf16).to_string()),
        ("MMA_T", if io == DataType::Bf16 { "\"bf16\"" } else { "\"f16\"" }.to_string()),
    ]
}

impl Gen<'_> {
    /// The sequence type when the fast kernels take the node (its data port `data`, and the
    /// weights where the op has them, in f16 or bf16; f32 compute; no LSTM projection; no dropout
    /// masks between layers, which a training forward writes into the reserve and the backward
    /// ops read; sm_80 or newer), else None.
    pub(super) fn fast_io(&self, a: &RnnDesc, target: &Target, data: &str) -> Option<DataType> {
        let masks = a.has_dropout() && a.num_layers > 1 && (a.training || !matches!(self.node.op, Op::Rnn(_)));
        if self.double || a.has_proj() || masks || target.cc() < 80 {
            return None;
        }
        let io = self.graph.resolved_data_type(self.port(data)?)?;
        let weights = self.port("weights").is_none_or(|w| self.graph.resolved_data_type(w) == Some(io));
        (matches!(io, DataType::F16 | DataType::Bf16) && weights).then_some(io)
    }

    /// The kernel that zeroes the exchange buffers (scratch `hb`, `words` 32-bit words) and resets
    /// every layer's and direction's barrier counter (scratch `bar`).
    pub(super) fn pr_zero_launch(&self, a: &RnnDesc, (hb, words): (usize, i64), bar: usize) -> Launch {
        let counters = a.num_layers * a.dirs();
        let entry = self.entry("rnn_pr_zero");
        let mut sig = self.sig(&[], &[]);
        sig.scratch("unsigned", "hb", hb, true).scratch("int", "bar", bar, true);
        let src = self.source(a, &entry, &sig, None, &[("HB_WORDS", format!("{words}LL")), ("BAR_COUNT", format!("{counters}LL"))], include_str!("persist_zero.cuh"));
        Launch::elementwise(src, &entry, words.max(counters) as u64, sig.into_args())
    }

    /// The kernel that copies every direction's input matrix W of layer `l` into scratch `wc` as
    /// `[D * G * H][round_up(input, 8)]` (rows padded with zeros) in the sequence type `io`.
    pub(super) fn pr_wcopy_launch(&self, a: &RnnDesc, l: i64, io: DataType, wc: usize) -> Launch {
        let kp = round_up(a.layer_input(l), 8);
        let seq_t = ctype::c_type(io);
        let entry = self.entry(&format!("rnn_pr_wcopy_l{l}"));
        let mut sig = self.sig(&[], &[("weights", false)]);
        sig.scratch(seq_t, "wc", wc, true);
        let extra = [("SEQ_T", seq_t.to_string()), ("KP", kp.to_string())];
        let src = self.source(a, &entry, &sig, Some(l), &extra, include_str!("persist_wcopy.cuh"));
        Launch::elementwise(src, &entry, (a.dirs() * a.cell_mode.gates() * a.hidden_size * kp) as u64, sig.into_args())
    }

    /// The fast forward's kernels (and, when layer 0's GEMM needs 16-byte aligned rows of `x`,
    /// the kernels for an `x` that is not), or None when it does not take the problem.
    pub(super) fn fast_forward(&self, a: &RnnDesc, target: &Target, options: &Options) -> Result<Option<(NodeKernels, Option<Box<Unaligned>>)>> {
        let Some(io) = self.fast_io(a, target, "x") else { return Ok(None) };
        let Some(x) = self.port("x") else { return Ok(None) };
        let elem = io.size() as i64;
        let Some(sh) = shape(a, target, elem) else { return Ok(None) };
        let Some((rows0, x_rs, x_cs)) = x_matrix(a, self.graph.desc(x)) else { return Ok(None) };
        let (t, b, d, h, p, g) = (a.max_seq_length, a.batch, a.dirs(), a.hidden_size, a.proj(), a.cell_mode.gates());
        let (xb, pp) = (sh.nbb * sh.bp, round_up(p, 32));
        let n_all = d * g * h;
        let fp = round_up(d * p, 8);
        let layers = a.num_layers;
        let kp_max = (0..layers).map(|l| round_up(a.layer_input(l), 8)).max().unwrap_or(8);
        let bytes = |n: i64| usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(1);
        // meta, W's copy, gx, two sequence buffers, the exchange buffers, the barrier counters.
        let (s_meta, s_w, s_gx, s_seq, s_hb, s_bar) = (0usize, 1usize, 2usize, [3usize, 4usize], 5usize, 6usize);
        let mut scratch = vec![
            self.meta_bytes(a),
            bytes(n_all * kp_max * elem),
            bytes(rows0.max(t * b) * n_all * 4),
            bytes(if layers > 1 { t * b * fp * elem } else { 0 }),
            bytes(if layers > 2 { t * b * fp * elem } else { 0 }),
            bytes(layers * d * 2 * xb * pp * elem),
            bytes(layers * d * 4),
        ];
        let mut launches = vec![self.meta_launch(a)];
        if self.port("seq_lengths").is_some() {
            launches.extend(self.fill_launch(a, "y", a.padding_fill));
        }
        // (The recurrence zeroes the reserve's records past each sample's length.)
        launches.push(self.pr_zero_launch(a, (s_hb, layers * d * 2 * xb * pp * elem / 4), s_bar));
        let seq_t = ctype::c_type(io);
        // The kernels for an `x` whose rows break 16-byte alignment, when layer 0's GEMM has
        // other ones for it: the same list with those in its place.
        let mut alt: Option<Vec<Launch>> = None;
        let push = |launches: &mut Vec<Launch>, alt: &mut Option<Vec<Launch>>, l: Launch| {
            if let Some(al) = alt.as_mut() {
                al.push(l.clone());
            }
            launches.push(l);
        };
        for l in 0..layers {
            let k = a.layer_input(l);
            let kp = round_up(k, 8);
            push(&mut launches, &mut alt, self.pr_wcopy_launch(a, l, io, s_w));

            let (src_in, geom) = if l == 0 { (Home::Tensor(x), (rows0, k, x_rs, x_cs)) } else { (Home::Scratch(s_seq[((l - 1) % 2) as usize]), (t * b, k, fp, 1)) };
            let base = scratch.len();
            let Some((gk, gk_alt)) = gemm_launches(io, geom, (n_all, 1, kp), [src_in, Home::Scratch(s_w), Home::Scratch(s_gx)], base, target, options)? else {
                return Ok(None);
            };
            // Both GEMMs' own buffers start at `base`.
            for ks in [Some(&gk.scratch), gk_alt.as_ref().map(|k| &k.scratch)].into_iter().flatten() {
                share_scratch(&mut scratch, base, ks);
            }
            match (gk_alt, alt.as_mut()) {
                (Some(ka), None) => {
                    let mut al = launches.clone();
                    al.extend(ka.launches);
                    alt = Some(al);
                }
                (Some(ka), Some(al)) => al.extend(ka.launches),
                (None, Some(al)) => al.extend(gk.launches.iter().cloned()),
                (None, None) => {}
            }
            launches.extend(gk.launches);

            let last = l + 1 == layers;
            let entry = self.entry(&format!("rnn_pr_recur_l{l}"));
            let mut ports = vec![("weights", false), ("hx", false), ("cx", false), ("hy", true), ("cy", true)];
            if last {
                ports.push(("y", true));
            }
            if a.training {
                ports.push(("reserve", true));
            }
            let mut sig = self.sig(&[("meta", s_meta, false)], &[]);
            sig.scratch("float", "gx", s_gx, false);
            // Every layer's exchange buffers and counters (the kernel offsets to its own).
            sig.scratch(seq_t, "hb_all", s_hb, true).scratch("int", "bar_all", s_bar, true);
            if !last {
                sig.scratch(seq_t, "so", s_seq[(l % 2) as usize], true);
            }
            for &(port, write) in &ports {
                if let Some(id) = self.port(port) {
                    sig.tensor(port, id, write);
                }
            }
            let clip = a.cell_clip.map_or((0.0, 0.0), |c| (c.lower, c.upper));
            sig.f32("clip_lower", clip.0).f32("clip_upper", clip.1);
            let mut extra = mma_defines(&sh, pp, io);
            extra.extend([
                ("TRAINING", u8::from(a.training).to_string()),
                ("GX_LD", format!("{n_all}LL")),
                ("FP", format!("{fp}LL")),
                ("LAYER_HB", format!("{}LL", l * d * 2 * xb * pp)),
                ("LAYER_BAR", (l * d).to_string()),
            ]);
            let src = self.source(a, &entry, &sig, Some(l), &extra, &[PERSIST_COMMON, include_str!("persist.cuh")].concat());
            let launch = Launch::new(src, &entry, Grid::Exact(sh.nb as u32, d as u32, sh.nbb as u32), THREADS, sig.into_args()).with_shared(sh.smem as u32);
            push(&mut launches, &mut alt, launch);
        }
        let unaligned = alt.map(|launches| Box::new(Unaligned { tensors: vec![x], kernels: NodeKernels { launches, scratch: scratch.clone() } }));
        Ok(Some((NodeKernels { launches, scratch }, unaligned)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::graph;
    use super::*;
    use crate::graph::ops::rnn::RnnMode;

    #[test]
    fn blocks_fill_the_sms_at_most_once_and_hold_every_gate_of_their_units() {
        let t = Target::new("sm_90a", 132);
        let a = RnnDesc::new(RnnMode::Lstm, 1024, 1024, 256, 64);
        // 32 gate rows (8 LSTM units) a block; 4 warps along the batch's 16-row tiles, 4 along P.
        let s = shape(&a, &t, 2).unwrap();
        assert_eq!((s.pu, s.pn, s.nb), (8, 32, 128));
        assert_eq!((s.wm, s.wk), (4, 4));
        // Both directions: 256 blocks of 32 rows or 172 of 48 would not fit the SMs; 128 of 64.
        let s = shape(&a.clone().bidirectional(), &t, 2).unwrap();
        assert_eq!((s.pu, s.pn, s.nb), (16, 64, 64));
        // GRU's 3 gates: 10 units in 30 of the 32 rows; one batch tile, all 16 warps along P.
        let s = shape(&RnnDesc::new(RnnMode::Gru, 512, 1024, 8, 1), &t, 2).unwrap();
        assert_eq!((s.pu, s.pn, s.nb), (10, 32, 103));
        assert_eq!((s.wm, s.wk), (1, 16));
        // A state of 2048 in blocks of 32 rows: 64 blocks, R's rows in 131 KiB.
        let s = shape(&RnnDesc::new(RnnMode::Tanh, 8, 2048, 8, 8), &t, 2).unwrap();
        assert_eq!((s.pu, s.pn, s.nb), (32, 32, 64));
        // More blocks than SMs: declined.
        assert!(shape(&RnnDesc::new(RnnMode::Lstm, 8, 4096, 8, 8).bidirectional(), &t, 2).is_none());
    }

    #[test]
    fn half_precision_forwards_run_a_gemm_and_a_persistent_recurrence_per_layer() {
        use crate::engine::cuda::planner;
        let d = RnnDesc::new(RnnMode::Lstm, 24, 40, 11, 37).layers(2).bidirectional();
        for dt in [DataType::F16, DataType::Bf16] {
            let planned = planner::plan(&graph(&d, dt), &Target::sm90a(), &Options::default(), true).unwrap();
            let k = &planned[0].unit.kernels;
            let recur: Vec<_> = k.launches.iter().filter(|l| l.entry.contains("rnn_pr_recur")).collect();
            assert_eq!(recur.len(), 2);
            let s = shape(&d, &Target::sm90a(), 2).unwrap();
            assert!(recur.iter().all(|l| l.grid == Grid::Exact(s.nb as u32, 2, 1) && l.shared_bytes == s.smem as u32));
            assert!(k.launches.iter().any(|l| l.entry.contains("gemm")), "{:?}", k.launches.iter().map(|l| &l.entry).collect::<Vec<_>>());
            assert!(!k.launches.iter().any(|l| l.entry.contains("fwd_recur")));
        }
        // f32 data, and an LSTM projection, stay on the standard recurrence.
        for (d, dt) in [(d.clone(), DataType::F32), (d.clone().with_proj(5), DataType::F16)] {
            let planned = planner::plan(&graph(&d, dt), &Target::sm90a(), &Options::default(), true).unwrap();
            assert!(planned[0].unit.kernels.launches.iter().any(|l| l.entry.contains("fwd_recur")));
        }
    }
}
