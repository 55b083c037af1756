//! The attention engine: flash-attention kernels for sdpa and sdpa_backward (online softmax;
//! the score matrix never reaches device memory), on tensor cores with `mma.sync.m16n8k16`
//! (sm_80 and later; the Hopper wgmma path comes on top of this one).
//!
//! - Forward ([`fwd`]): FlashAttention-2. One CTA per (q tile, query head, batch); each warp
//!   owns 16 query rows, S = Q K^T and O += P V on tensor cores with f32 accumulators, the
//!   online softmax in f32 in log2 units (the scale folded into one multiplier, `ex2.approx`),
//!   P rounded to the io type in registers as the A operand of P V. K/V tiles are
//!   double-buffered with 16-byte `cp.async` (row strides multiples of 8 elements, checked at
//!   plan time; base pointers checked at run time through [`Unit::unaligned`], whose kernels
//!   take element-wise loads instead), fragments come from shared memory with `ldmatrix`
//!   (`.trans` for the operands stored k-minor). Fully masked K/V tiles (causal, windows,
//!   padding) are skipped; partially masked ones are masked element-wise.
//! - Backward ([`bwd`]): FlashAttention-2 without atomics: `D_i = do_i . o_i` (f32 scratch);
//!   a dQ kernel (CTA per q tile, looping over K/V tiles) and a dK/dV kernel (CTA per K/V tile
//!   and kv head, looping over the query heads of the group and their q tiles), both
//!   recomputing P from the stats. dbias when the bias is not broadcast over rows or keys.
//!
//! What the engine takes (anything else returns `None` and runs on the fallback): q/k/v (and
//! `do`) bf16 or f16; head dims (q/k and v apart) multiples of 8 up to 256; a node not computing
//! in f64; every mask, bias shape, ALiBi, dropout, GQA/MQA, padding, stats,
//! any strides; paged K/V in the forward pass only; the sink token (its logit starts each row's
//! running max and sum) and the score statistics (`score_max`, `score_sum_exp`: the rows' final
//! max and sum) on the general forward, which the Hopper and decode forwards leave them to, as
//! they do ragged tensors; the sink's gradient (a CTA per query head summing over the rows
//! after the `D` pass) on both backwards.

mod bwd;
mod bwd90;
mod decode;
mod fwd;
mod fwd90;
mod hopper;

use super::kernel::ctype::{c_float, ld, st};
use super::kernel::{Attr, Options, Signature, Source, Target, Unit};
use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::ops::sdpa::{alibi_slopes, CausalAlignment, SdpaAttrs, RAGGED_PORTS};
use crate::graph::ops::Op;
use crate::graph::{Graph, Node, TensorId};

/// Whether a backward with these attributes runs faster with dQ added by float atomics in the
/// dK/dV pass (the `atomics` plan knob) than with its own pass: without a sliding window
/// (measured on the H100: unmasked +6% at b4h16s4096d128 and +14% at b16h16s1024d64; under a
/// causal mask, with dQ added by bulk reductions and the mask skipped where blocks need none, a
/// tie at b4h16s4096d128 and +7% at b1h32s16384d128). Sliding windows, not measured, keep the
/// deterministic passes.
pub fn atomic_dq_pays(a: &SdpaAttrs) -> bool {
    no_window(a)
}

/// No sliding window on either side.
fn no_window(a: &SdpaAttrs) -> bool {
    a.sliding_window_left.is_none() && a.sliding_window_right.is_none()
}

/// No causal mask and no sliding window: every query row sees every key, so every tile of a
/// kernel's grid costs the same.
pub(super) fn unmasked(a: &SdpaAttrs) -> bool {
    a.causal.is_none() && no_window(a)
}

/// The unit of an sdpa or sdpa_backward node, when this engine runs it.
pub fn unit(graph: &Graph, ni: usize, target: &Target, options: &Options) -> Result<Option<Unit>> {
    let node = &graph.nodes[ni];
    let (attrs, backward) = match &node.op {
        Op::Sdpa(a) => (a, false),
        Op::SdpaBackward(a) => (a, true),
        _ => return Ok(None),
    };
    if target.cc() < 80 {
        return Ok(None);
    }
    let Some(p) = Problem::new(graph, ni, attrs, backward) else { return Ok(None) };
    // Each kernel family computes on its own tile widths (`Problem::widths`).
    let Some(general) = p.widths(general_width) else { return Ok(None) };
    // Ragged (packed) sequences run on the general kernels: the Hopper ones load whole tiles by
    // TMA over each tensor's own dims, and decode splits keys across CTAs per batch. So does a
    // forward with the sink token or the score statistics, which only the general forward has
    // (the Hopper backward takes the sink: its gradient is one launch after D).
    if !p.ragged.is_empty() || (!backward && (p.sink.is_some() || p.score_stats)) {
        return Ok(if backward { bwd::unit(&general, target) } else { fwd::unit(&general, target) });
    }
    let hopper = p.widths(hopper_width);
    if backward {
        let fast = hopper.as_ref().and_then(|h| bwd90::unit(h, target, options));
        Ok(fast.or_else(|| bwd::unit(&general, target)))
    } else {
        if let Some(u) = decode::unit(&general, target) {
            return Ok(Some(u));
        }
        let fast = hopper.as_ref().and_then(|h| fwd90::unit(h, target));
        Ok(fast.or_else(|| fwd::unit(&general, target)))
    }
}

/// The general kernels' tile width for a head dim: a multiple of 16 (one `mma` k step) up to
/// 128, of 32 above (the backward's two column chunks of whole k steps).
fn general_width(d: i64) -> Option<i64> {
    match d {
        1..=128 => Some((d + 15) / 16 * 16),
        129..=256 => Some((d + 31) / 32 * 32),
        _ => None,
    }
}

/// The Hopper kernels' tile width: whole 64-channel chunks (the 128-byte swizzle span of their
/// TMA boxes), up to 256 (the backward's up to 128).
fn hopper_width(d: i64) -> Option<i64> {
    (1..=256).contains(&d).then_some((d + 63) / 64 * 64)
}

/// Opt-in shared memory per block a target allows.
fn max_shared(target: &Target) -> usize {
    match target.cc() {
        80 | 87 => 163 * 1024,
        86 | 89 => 99 * 1024,
        90..=99 => 227 * 1024,
        _ => 99 * 1024,
    }
}

/// The sizes, tensors and attributes of an sdpa node, checked to be what these kernels take.
#[derive(Clone)]
pub(crate) struct Problem<'a> {
    pub graph: &'a Graph,
    pub node: &'a Node,
    pub ni: usize,
    pub attrs: &'a SdpaAttrs,
    pub b: i64,
    pub h_q: i64,
    pub h_kv: i64,
    pub s_q: i64,
    pub s_kv: i64,
    /// The tile widths the kernels compute on: the head dims (`dr`, `dvr`) rounded up to the
    /// kernel family's step (`widths`). Channels past the head dim are loaded as zeros, so that
    /// they add nothing to Q K^T, and are not stored.
    pub d: i64,
    pub d_v: i64,
    /// The head dims of q/k and of v (the tensors' last dims).
    pub dr: i64,
    pub dvr: i64,
    /// bf16 or f16: q, k, v (and do).
    pub dt: DataType,
    pub q: TensorId,
    pub k: TensorId,
    pub v: TensorId,
    pub bias: Option<TensorId>,
    pub seq_len_q: Option<TensorId>,
    pub seq_len_kv: Option<TensorId>,
    pub seed: Option<TensorId>,
    pub offset: Option<TensorId>,
    pub paged: Option<(TensorId, TensorId)>,
    /// The ragged tensors' offsets by the kernels' FA_RG_* index (q, k, v, o, stats, do, dq, dk,
    /// dv): packed sequences (`common.cuh`'s `fa_start`). The general kernels take them.
    pub ragged: Vec<(usize, TensorId)>,
    /// The dropout probability when dropout is on (p > 0).
    pub dropout: Option<f64>,
    /// The sink token (`[1, h_q, 1, 1]`: one logit per query head).
    pub sink: Option<TensorId>,
    /// Whether the forward has a `score_max` or `score_sum_exp` output.
    pub score_stats: bool,
    /// The attention scale: the op's, or the tensor on its `attn_scale` port.
    pub scale: Attr,
}

/// A head dim these kernels take: a multiple of 8 (rows of whole 16-byte vectors) up to 256.
fn head_dim_ok(d: i64) -> bool {
    d > 0 && d <= 256 && d % 8 == 0
}

impl<'a> Problem<'a> {
    fn new(graph: &'a Graph, ni: usize, attrs: &'a SdpaAttrs, backward: bool) -> Option<Problem<'a>> {
        let node = &graph.nodes[ni];
        if graph.compute_type(node) == DataType::F64 {
            return None;
        }
        let (q, k, v) = (node.input("q")?, node.input("k")?, node.input("v")?);
        let dt = graph.resolved_data_type(q)?;
        if !matches!(dt, DataType::Bf16 | DataType::F16) || graph.resolved_data_type(k)? != dt || graph.resolved_data_type(v)? != dt {
            return None;
        }
        let (qd, kd, vd) = (&graph.desc(q).dims, &graph.desc(k).dims, &graph.desc(v).dims);
        if qd.len() != 4 || kd.len() != 4 || vd.len() != 4 {
            return None;
        }
        let paged = match (node.input("page_table_k"), node.input("page_table_v")) {
            (Some(a), Some(b)) => Some((a, b)),
            (None, None) => None,
            _ => return None,
        };
        let s_kv = match paged {
            Some((tk, tv)) => {
                let (a, b) = (&graph.desc(tk).dims, &graph.desc(tv).dims);
                if a.len() != 4 || b.len() != 4 || a[2] * kd[2] != b[2] * vd[2] {
                    return None;
                }
                a[2] * kd[2]
            }
            None => kd[2],
        };
        let (b, h_q, s_q, d) = (qd[0], qd[1], qd[2], qd[3]);
        let (h_kv, d_v) = (kd[1], vd[3]);
        if b <= 0 || h_q <= 0 || s_q <= 0 || s_kv <= 0 || h_kv <= 0 || h_q % h_kv != 0 || kd[3] != d {
            return None;
        }
        // The fallback runs K and V of different head counts, a band on the bottom-right
        // diagonal without the causal mask, and the dropout mask as an output.
        if vd[1] != h_kv || (attrs.causal.is_none() && attrs.diagonal_alignment == Some(CausalAlignment::BottomRight)) || attrs.rng_dump {
            return None;
        }
        if !head_dim_ok(d) || !head_dim_ok(d_v) {
            return None;
        }
        let ragged: Vec<(usize, TensorId)> =
            RAGGED_PORTS.iter().enumerate().filter_map(|(i, port)| node.input(&format!("{}{port}", crate::graph::RAGGED_PORT_PREFIX)).map(|t| (i, t))).collect();
        // Grid limits (y and z are 16-bit); sizes past 2^40 are not worth a separate check.
        if h_q > 65535 || h_kv > 65535 || b > 65535 || s_q > (1 << 40) || s_kv > (1 << 40) {
            return None;
        }
        let scale = Attr::of(node, "attn_scale", attrs.attn_scale.unwrap_or(1.0 / (d as f64).sqrt()));
        if scale.known(graph).is_some_and(|s| !s.is_finite() || s.abs() > 1e30) {
            return None;
        }
        let dropout = attrs.dropout.filter(|&p| p > 0.0);
        let (seed, offset) = (node.input("seed"), node.input("offset"));
        if dropout.is_some() && (seed.is_none() || offset.is_none()) {
            return None;
        }
        let (seq_len_q, seq_len_kv) = if attrs.padding_mask { (Some(node.input("seq_len_q")?), Some(node.input("seq_len_kv")?)) } else { (None, None) };
        let bias = node.input("bias");
        if let Some(t) = bias {
            if graph.desc(t).dims.len() != 4 {
                return None;
            }
        }
        let sink = node.input("sink_token");
        if sink.is_some_and(|t| graph.desc(t).dims != [1, h_q, 1, 1]) {
            return None;
        }
        let score_stats = node.output("score_max").is_some() || node.output("score_sum_exp").is_some();
        if backward {
            let d_o = node.input("do")?;
            if graph.resolved_data_type(d_o)? != dt || graph.desc(d_o).dims != [b, h_q, s_q, d_v] {
                return None;
            }
        }
        Some(Problem {
            graph,
            node,
            ni,
            attrs,
            b,
            h_q,
            h_kv,
            s_q,
            s_kv,
            d,
            d_v,
            dr: d,
            dvr: d_v,
            dt,
            q,
            k,
            v,
            bias,
            seq_len_q,
            seq_len_kv,
            seed,
            offset,
            paged,
            ragged,
            dropout,
            sink,
            score_stats,
            scale,
        })
    }

    /// The problem on a kernel family's tile widths (`width` of each head dim), if it has them.
    fn widths(&self, width: fn(i64) -> Option<i64>) -> Option<Problem<'a>> {
        Some(Problem { d: width(self.dr)?, d_v: width(self.dvr)?, ..self.clone() })
    }

    /// Whether rows of a rank-4 tensor in the io type can be read with 16-byte `cp.async`:
    /// contiguous innermost dim and every other stride a multiple of 8 elements (size-1 dims
    /// aside). The base pointer is checked when the plan runs.
    pub fn vec_ok(&self, t: TensorId) -> bool {
        let d = self.graph.desc(t);
        d.strides.len() == 4 && d.strides[3] == 1 && (0..3).all(|a| d.dims[a] == 1 || d.strides[a] % 8 == 0)
    }

    /// `fa_load`'s VEC for an input: 0 element-wise (no `vec`, or strides that do not allow
    /// 16-byte rows), 1 16-byte `cp.async`, 2 the same with each vector's alignment checked (a
    /// ragged tensor, whose batches start where its offsets say: an offset that is not a
    /// multiple of 8 elements takes element-wise loads rather than faulting).
    pub fn vec_mode(&self, vec: bool, t: TensorId) -> u8 {
        match (vec && self.vec_ok(t), self.graph.desc(t).ragged_offset.is_some()) {
            (false, _) => 0,
            (true, false) => 1,
            (true, true) => 2,
        }
    }

    /// Whether an output can be stored two elements (4 bytes) at a time: the io type, a
    /// contiguous innermost dim and even strides, and not ragged (an odd offset would misalign
    /// the pairs).
    pub fn pair_ok(&self, t: TensorId) -> bool {
        let d = self.graph.desc(t);
        self.graph.resolved_data_type(t) == Some(self.dt)
            && d.ragged_offset.is_none()
            && d.strides.len() == 4
            && d.strides[3] == 1
            && (0..3).all(|a| d.dims[a] == 1 || d.strides[a] % 2 == 0)
    }

    pub fn entry(&self, what: &str) -> String {
        super::kernel::entry_name(self.ni, what)
    }

    /// A kernel's text up to its templates: the entry (`sig`), then the `#define`s every kernel
    /// of the node shares (sizes, masks, features, strides, loaders: what `common.cuh` reads);
    /// the caller adds its kernel's defines and the templates (`common.cuh` first). With `vec`,
    /// tensors whose strides allow it are read with `cp.async` (else element-wise).
    pub fn source(&self, entry: &str, sig: &Signature, vec: bool) -> Source {
        let a = self.attrs;
        let g = self.graph;
        let cap = |w: i64| w.min(1 << 62);
        let mut s = Source::new()
            .entry(entry, sig)
            .flag("FA_BF16", self.dt == DataType::Bf16)
            .define("FA_MMA_T", if self.dt == DataType::Bf16 { "\"bf16\"" } else { "\"f16\"" })
            .define("FA_B", format!("{}LL", self.b))
            .define("FA_HQ", format!("{}LL", self.h_q))
            .define("FA_HKV", format!("{}LL", self.h_kv))
            .define("FA_SQ", format!("{}LL", self.s_q))
            .define("FA_SKV", format!("{}LL", self.s_kv))
            .define("FA_GROUP", format!("{}LL", self.h_q / self.h_kv))
            .define("FA_D", self.d)
            .define("FA_DV", self.d_v)
            .define("FA_DR", self.dr)
            .define("FA_DVR", self.dvr)
            .define("FA_DK", (self.dr + 15) / 16 * 16)
            .define("FA_DVK", (self.dvr + 15) / 16 * 16)
            .define("FA_LDK", self.d + 8)
            .define("FA_LDV", self.d_v + 8)
            .flag("FA_CAUSAL", a.causal.is_some())
            .flag("FA_BOTTOM_RIGHT", a.causal == Some(CausalAlignment::BottomRight))
            .flag("FA_HAS_SWL", a.sliding_window_left.is_some())
            .define("FA_SWL", format!("{}LL", cap(a.sliding_window_left.unwrap_or(0))))
            .flag("FA_HAS_SWR", a.sliding_window_right.is_some())
            .define("FA_SWR", format!("{}LL", cap(a.sliding_window_right.unwrap_or(0))))
            .flag("FA_PADDING", self.seq_len_q.is_some())
            .flag("FA_HAS_BIAS", self.bias.is_some())
            .flag("FA_ALIBI", a.alibi)
            .flag("FA_SCALE_POS", self.scale.known(g).is_some_and(|s| s > 0.0))
            .define("FA_SOFTMAX_SCALE", self.scale.known(g).map_or("A.scale_log2".to_string(), |s| c_float(s * std::f64::consts::LOG2_E)))
            .flag("FA_DROPOUT", self.dropout.is_some())
            .flag("FA_PAGED", self.paged.is_some())
            .flag("FA_HAS_SINK", self.sink.is_some());
        s = self.strides(s, "Q", self.q, false);
        s = self.strides(s, "K", self.k, false);
        s = self.strides(s, "V", self.v, false);
        s = s.define("Q_VEC", self.vec_mode(vec, self.q)).define("K_VEC", self.vec_mode(vec, self.k)).define("V_VEC", self.vec_mode(vec, self.v));
        if let Some(t) = self.bias {
            s = self.strides(s.define("LD_BIAS", ld(g, t)), "BI", t, true);
        }
        if let (Some(lq), Some(lkv)) = (self.seq_len_q, self.seq_len_kv) {
            s = s.define("LD_SLQ", ld(g, lq)).define("LD_SLKV", ld(g, lkv));
            s = s.define("SLQ_S0", format!("{}LL", g.desc(lq).strides[0])).define("SLKV_S0", format!("{}LL", g.desc(lkv).strides[0]));
        }
        if let Some((tk, tv)) = self.paged {
            let (dk, dv) = (g.desc(tk), g.desc(tv));
            let (kd, vd) = (&g.desc(self.k).dims, &g.desc(self.v).dims);
            s = s
                .define("LD_PTK", ld(g, tk))
                .define("LD_PTV", ld(g, tv))
                .define("PTK_S0", format!("{}LL", dk.strides[0]))
                .define("PTK_S2", format!("{}LL", dk.strides[2]))
                .define("PTV_S0", format!("{}LL", dv.strides[0]))
                .define("PTV_S2", format!("{}LL", dv.strides[2]))
                .define("FA_KNB", format!("{}LL", kd[0]))
                .define("FA_KBS", format!("{}LL", kd[2]))
                .define("FA_VNB", format!("{}LL", vd[0]))
                .define("FA_VBS", format!("{}LL", vd[2]));
        }
        if let (Some(_), Some(seed), Some(offset)) = (self.dropout, self.seed, self.offset) {
            s = s.define("LD_SEED", ld(g, seed)).define("LD_OFFSET", ld(g, offset));
        }
        if let Some(t) = self.sink {
            s = s.define("LD_SINK", ld(g, t)).define("SINK_S1", format!("{}LL", g.desc(t).strides[1]));
        }
        if a.alibi {
            let slopes: Vec<String> = alibi_slopes(self.h_q as usize).iter().map(|&x| c_float(x)).collect();
            s = s.define("FA_NSLOPES", slopes.len()).define("FA_SLOPES", slopes.join(", "));
        }
        // X(index, load, stride) of each ragged tensor's offsets (a vector: the stride of its
        // one dim longer than 1).
        let ragged: String = self.ragged.iter().map(|&(i, t)| format!(" X({i}, {}, {}LL)", ld(g, t), g.desc(t).vector_stride())).collect();
        s.define("FA_RAGGED(X)", ragged)
    }

    /// The parameters of the optional inputs (bias, padding lengths, page tables, the sink, ragged offsets) and of the
    /// runtime scalars (the attention scale, and times log2(e), in f32 as the kernels compute),
    /// then with dropout the seed and offset, the keep scale 1 / (1 - p) and the drop threshold:
    /// what `FA_INIT` (`common.cuh`) reads into `FaIn A`. Values, not literals, so that one
    /// kernel serves every scale and dropout probability.
    pub fn inputs(&self, sig: &mut Signature) {
        if let Some(t) = self.bias {
            sig.ptr("bias_p", t, false);
        }
        if let (Some(lq), Some(lkv)) = (self.seq_len_q, self.seq_len_kv) {
            sig.ptr("slq_p", lq, false).ptr("slkv_p", lkv, false);
        }
        if let Some((tk, tv)) = self.paged {
            sig.ptr("ptk_p", tk, false).ptr("ptv_p", tv, false);
        }
        if let Some(t) = self.sink {
            sig.ptr("sink_p", t, false);
        }
        sig.attr("fa_scale", self.scale, false).attr("fa_scale_log2", self.scale.times(std::f64::consts::LOG2_E), false);
        if let (Some(p), Some(seed), Some(offset)) = (self.dropout, self.seed, self.offset) {
            sig.ptr("seed_p", seed, false).ptr("offset_p", offset, false);
            sig.f32("fa_keep_scale", 1.0 / (1.0 - p)).i64("fa_drop_t", drop_threshold(p) as i64);
        }
        for &(i, t) in &self.ragged {
            sig.ptr(&format!("rg{i}_p"), t, false);
        }
    }

    /// `{prefix}_S0..3`: the strides of `t` (0 for size-1 dims with `zero_broadcast`).
    pub fn strides(&self, s: Source, prefix: &str, t: TensorId, zero_broadcast: bool) -> Source {
        let d = self.graph.desc(t);
        d.strides
            .iter()
            .zip(&d.dims)
            .enumerate()
            .fold(s, |s, (i, (&st, &dim))| s.define(&format!("{prefix}_S{i}"), format!("{}LL", if zero_broadcast && dim == 1 { 0 } else { st })))
    }

    /// The defines of an output stored through `fa_store_<name>` (`FA_DEFINE_STORE` in
    /// `common.cuh`: two elements `off` and `off + stride[3]`): its strides `{prefix}_S0..3`,
    /// `{prefix}_PAIR` (pairs of 4 bytes) and `ST_{prefix}` (else `st_<type>` each).
    pub fn output_store(&self, s: Source, prefix: &str, t: TensorId, pair: bool) -> Source {
        self.strides(s, prefix, t, false).flag(&format!("{prefix}_PAIR"), pair).define(&format!("ST_{prefix}"), st(self.graph, t))
    }

    /// The defines of the forward's `stats` output: `ST_STATS` (its store) and `ST_S0..2`.
    pub fn stats_store(&self, s: Source, t: TensorId) -> Source {
        let d = self.graph.desc(t);
        s.define("ST_STATS", st(self.graph, t))
            .define("ST_S0", format!("{}LL", d.strides[0]))
            .define("ST_S1", format!("{}LL", d.strides[1]))
            .define("ST_S2", format!("{}LL", d.strides[2]))
    }

    /// The defines of another per-row output `[b, h_q, s_q, 1]` (`score_max`, `score_sum_exp`):
    /// `ST_{prefix}` (its store) and `{prefix}_S0..2`.
    pub fn row_store(&self, s: Source, prefix: &str, t: TensorId) -> Source {
        let d = self.graph.desc(t);
        (0..3).fold(s.define(&format!("ST_{prefix}"), st(self.graph, t)), |s, a| s.define(&format!("{prefix}_S{a}"), format!("{}LL", d.strides[a])))
    }
}

/// The smallest 32-bit Philox word `w` that keeps an element under dropout `p`: the CPU keeps
/// it when `(w + 0.5) / 2^32 >= p` (in f64, exact), i.e. when `w >= T`. At most 2^32.
pub(crate) fn drop_threshold(p: f64) -> u64 {
    let x = p * 4294967296.0;
    let mut t = (x - 0.5).ceil().clamp(0.0, 4294967296.0) as u64;
    while t > 0 && (t - 1) as f64 + 0.5 >= x {
        t -= 1;
    }
    while t < 4294967296 && (t as f64 + 0.5) < x {
        t += 1;
    }
    t
}

/// Device helpers every attention kernel shares (after the node's `#define`s).
pub(crate) const COMMON: &str = include_str!("common.cuh");

#[cfg(test)]
mod tests {
    use super::drop_threshold;

    #[test]
    fn dropout_threshold_matches_the_cpu_comparison() {
        for p in [0.0, 1e-12, 0.1, 0.2, 0.25, 0.3, 0.5, 0.7, 0.999_999_999, 1.0 - 1e-16] {
            let t = drop_threshold(p);
            let keep = |w: u64| (w as f64 + 0.5) / 4294967296.0 >= p;
            if t > 0 {
                assert!(!keep(t - 1), "p {p}: {t}");
            }
            if t < 4294967296 {
                assert!(keep(t), "p {p}: {t}");
            }
        }
    }
}
