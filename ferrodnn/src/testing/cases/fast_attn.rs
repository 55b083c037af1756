//! Cases for the flash-attention kernels (engine/cuda/attention): bf16 and f16, head dims 8 to
//! 256 in multiples of 8 (those off the kernels' tile widths padded with zero channels, q/k and v
//! apart), odd lengths (s_q 1, 7, 65, 130; s_kv 1, 33, 200: partial
//! tiles, one-row decode), BSHD and BHSD, strides with gaps (16-byte loads still possible) and
//! odd strides (element-wise loads), every mask (causal top-left and bottom-right with empty
//! rows, sliding windows, padding long enough to empty whole q and K/V tiles), bias shapes,
//! ALiBi, dropout, GQA/MQA, paged K/V, stats in the io type and in f32, the sink token and its
//! gradient (`sink` in the names), the score statistics (`score_stats`); forward, and backward
//! alone (o, do, stats as inputs) or chained after the forward.
//!
//! Lengths are computed in the graph from random integer inputs x in [-4, 4]:
//! `max(s - step * |x|, 0)`; page-table entries are `|x|` (pools of at least 5 blocks).

use super::Case;
use crate::graph::ops::pointwise::PointwiseMode;
use crate::graph::ops::sdpa::{CausalAlignment, SdpaAttrs, SdpaInputs};
use crate::graph::TensorId;
use crate::{DataType, Graph, TensorDesc};

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Layout {
    /// Packed [b, h, s, d].
    Bhsd,
    /// Packed [b, s, h, d].
    Bshd,
    /// Rows of d + 8 and 8 more elements between heads: strided, 16-byte loads still apply.
    Gaps,
    /// Rows of d + 3 (no 16-byte loads) and K with d outermost within a head.
    Odd,
}

#[derive(Clone, Copy, PartialEq)]
enum Bwd {
    No,
    /// Backward with o, do and stats (f32) as inputs.
    Alone,
    /// Forward, then backward on its o and stats.
    Chained,
}

#[derive(Clone)]
struct Spec {
    name: String,
    dt: DataType,
    b: i64,
    h_q: i64,
    h_kv: i64,
    s_q: i64,
    s_kv: i64,
    d: i64,
    d_v: i64,
    layout: Layout,
    attrs: SdpaAttrs,
    bias: Option<[i64; 4]>,
    /// Padding lengths drop by multiples of this (with `padding_mask`).
    pad_step: i64,
    seed_tensors: bool,
    /// K/V block size and pool blocks (s_kv a multiple of the block size).
    paged: Option<(i64, i64)>,
    /// The forward's stats in f32 rather than the io type (and the score statistics, and dsink
    /// of a backward alone, whose inputs both sides share).
    stats_f32: bool,
    /// A sink token (`[1, h_q, 1, 1]` f32), and with a backward its gradient.
    sink: bool,
    bwd: Bwd,
}

impl Spec {
    fn new(name: &str, dt: DataType) -> Spec {
        Spec {
            name: name.to_string(),
            dt,
            b: 2,
            h_q: 2,
            h_kv: 2,
            s_q: 65,
            s_kv: 200,
            d: 64,
            d_v: 64,
            layout: Layout::Bhsd,
            attrs: SdpaAttrs { generate_stats: true, ..Default::default() },
            bias: None,
            pad_step: 1,
            seed_tensors: false,
            paged: None,
            stats_f32: false,
            sink: false,
            bwd: Bwd::No,
        }
    }
    fn sink(mut self) -> Spec {
        self.sink = true;
        self
    }
    fn score_stats(mut self) -> Spec {
        self.attrs.score_max = true;
        self.attrs.score_sum_exp = true;
        self
    }
    fn b(mut self, b: i64) -> Spec {
        self.b = b;
        self
    }
    fn heads(mut self, h_q: i64, h_kv: i64) -> Spec {
        self.h_q = h_q;
        self.h_kv = h_kv;
        self
    }
    fn seq(mut self, s_q: i64, s_kv: i64) -> Spec {
        self.s_q = s_q;
        self.s_kv = s_kv;
        self
    }
    fn dims(mut self, d: i64, d_v: i64) -> Spec {
        self.d = d;
        self.d_v = d_v;
        self
    }
    fn layout(mut self, l: Layout) -> Spec {
        self.layout = l;
        self
    }
    fn attrs(mut self, f: impl FnOnce(&mut SdpaAttrs)) -> Spec {
        f(&mut self.attrs);
        self
    }
    fn bias(mut self, dims: [i64; 4]) -> Spec {
        self.bias = Some(dims);
        self
    }
    fn padding(mut self, step: i64) -> Spec {
        self.attrs.padding_mask = true;
        self.pad_step = step;
        self
    }
    fn seed_tensors(mut self) -> Spec {
        self.seed_tensors = true;
        self
    }
    fn paged(mut self, block: i64, blocks: i64) -> Spec {
        self.paged = Some((block, blocks));
        self
    }
    fn stats_f32(mut self) -> Spec {
        self.stats_f32 = true;
        self
    }
    fn bwd(mut self, b: Bwd) -> Spec {
        self.bwd = b;
        self
    }
}

/// A [b, h, s, d] tensor in a layout (`key` selects K's variant of the odd layout).
pub(super) fn bhsd(name: &str, dims: [i64; 4], dt: DataType, layout: Layout, key: bool) -> TensorDesc {
    let t = TensorDesc::new(name, &dims, dt);
    let [_, h, s, d] = dims;
    match layout {
        Layout::Bhsd => t,
        Layout::Bshd => t.with_layout(&[0, 2, 1, 3]),
        Layout::Gaps => {
            let row = d + 8;
            let head = s * row + 8;
            t.with_strides(&[h * head + 16, head, row, 1])
        }
        Layout::Odd if key => t.with_layout(&[0, 1, 3, 2]),
        Layout::Odd => {
            let row = d + 3;
            let head = s * row + 5;
            t.with_strides(&[h * head + 2, head, row, 1])
        }
    }
}

pub(super) fn int_scalar(g: &mut Graph, name: &str, v: f64) -> TensorId {
    g.tensor(TensorDesc::scalar(name, v, DataType::I32))
}

/// A [b, 1, 1, 1] i32 length `max(s - step * |x|, 0)` from a random input x.
pub(super) fn length(g: &mut Graph, name: &str, b: i64, s: i64, step: i64) -> TensorId {
    let x = g.tensor(TensorDesc::new(format!("{name}_x"), &[b, 1, 1, 1], DataType::I32));
    let a = g.pointwise(PointwiseMode::Abs, &[x]);
    g.desc_mut(a).data_type = Some(DataType::I32);
    let k = int_scalar(g, &format!("{name}_step"), step as f64);
    let a = g.mul(a, k);
    g.desc_mut(a).data_type = Some(DataType::I32);
    let top = int_scalar(g, &format!("{name}_s"), s as f64);
    let l = g.sub(top, a);
    g.desc_mut(l).data_type = Some(DataType::I32);
    let zero = int_scalar(g, &format!("{name}_zero"), 0.0);
    let y = g.pointwise(PointwiseMode::Max, &[l, zero]);
    g.desc_mut(y).data_type = Some(DataType::I32);
    y
}

/// A [b, 1, pages, 1] page table `|x|` (entries 0..=4).
pub(super) fn page_table(g: &mut Graph, name: &str, b: i64, pages: i64, dt: DataType) -> TensorId {
    let x = g.tensor(TensorDesc::new(format!("{name}_x"), &[b, 1, pages, 1], dt));
    let y = g.pointwise(PointwiseMode::Abs, &[x]);
    g.desc_mut(y).data_type = Some(dt);
    y
}

fn build(s: &Spec) -> Case {
    let dt = s.dt;
    let name = format!("fast_attn_{}_{}", s.name, dt);
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let q = g.tensor(bhsd("q", [s.b, s.h_q, s.s_q, s.d], dt, s.layout, false));
    let mut inputs = SdpaInputs::default();
    let (k, v) = match s.paged {
        Some((bs, blocks)) => {
            assert!(blocks >= 5 && s.s_kv % bs == 0);
            let k = g.tensor(bhsd("k_pool", [blocks, s.h_kv, bs, s.d], dt, s.layout, true));
            let v = g.tensor(bhsd("v_pool", [blocks, s.h_kv, bs, s.d_v], dt, s.layout, false));
            inputs.page_table_k = Some(page_table(&mut g, "page_table_k", s.b, s.s_kv / bs, DataType::I32));
            inputs.page_table_v = Some(page_table(&mut g, "page_table_v", s.b, s.s_kv / bs, DataType::I64));
            (k, v)
        }
        None => {
            let k = g.tensor(bhsd("k", [s.b, s.h_kv, s.s_kv, s.d], dt, s.layout, true));
            let v = g.tensor(bhsd("v", [s.b, s.h_kv, s.s_kv, s.d_v], dt, s.layout, false));
            (k, v)
        }
    };
    if let Some(dims) = s.bias {
        inputs.bias = Some(g.tensor(TensorDesc::new("bias", &dims, dt)));
    }
    if s.attrs.padding_mask {
        inputs.seq_len_q = Some(length(&mut g, "seq_len_q", s.b, s.s_q, s.pad_step));
        inputs.seq_len_kv = Some(length(&mut g, "seq_len_kv", s.b, s.s_kv, s.pad_step));
    }
    if s.attrs.dropout.is_some() {
        let (seed, offset) = if s.seed_tensors {
            (g.tensor(TensorDesc::new("seed", &[1], DataType::I64)), g.tensor(TensorDesc::new("offset", &[1, 1], DataType::I32)))
        } else {
            // High words set, so every counter and key word matters.
            (g.tensor(TensorDesc::scalar("seed", 1_099_511_627_813.0, DataType::I64)), g.tensor(TensorDesc::scalar("offset", 77.0, DataType::I64)))
        };
        inputs.seed = Some(seed);
        inputs.offset = Some(offset);
    }
    if s.sink {
        inputs.sink_token = Some(g.tensor(TensorDesc::new("sink", &[1, s.h_q, 1, 1], DataType::F32)));
    }
    let o_dims = [s.b, s.h_q, s.s_q, s.d_v];
    // A per-row statistic or dsink as a buffer, in f32 when `f32` (else the io type).
    let stat_out = |g: &mut Graph, t: TensorId, f32: bool| {
        g.set_output(t);
        if f32 {
            g.desc_mut(t).data_type = Some(DataType::F32);
        }
    };
    match s.bwd {
        Bwd::No => {
            let (o, stats) = g.sdpa(q, k, v, inputs, s.attrs.clone());
            g.set_output(o);
            for t in [stats, g.sdpa_output(o, "score_max"), g.sdpa_output(o, "score_sum_exp")].into_iter().flatten() {
                stat_out(&mut g, t, s.stats_f32);
            }
        }
        Bwd::Alone => {
            let o = g.tensor(bhsd("o", o_dims, dt, s.layout, false));
            let d_o = g.tensor(bhsd("do", o_dims, dt, s.layout, false));
            let stats = g.tensor(TensorDesc::new("stats", &[s.b, s.h_q, s.s_q, 1], DataType::F32));
            let grads = g.sdpa_backward(q, k, v, o, d_o, stats, inputs, s.attrs.clone());
            for t in [Some(grads.dq), Some(grads.dk), Some(grads.dv), grads.dbias].into_iter().flatten() {
                g.set_output(t);
            }
            if let Some(t) = grads.dsink_token {
                stat_out(&mut g, t, s.stats_f32);
            }
        }
        Bwd::Chained => {
            let attrs = SdpaAttrs { generate_stats: true, ..s.attrs.clone() };
            let (o, stats) = g.sdpa(q, k, v, inputs, attrs.clone());
            g.set_output(o);
            let stats = stats.expect("stats");
            if s.stats_f32 {
                g.desc_mut(stats).data_type = Some(DataType::F32);
            }
            for t in [g.sdpa_output(o, "score_max"), g.sdpa_output(o, "score_sum_exp")].into_iter().flatten() {
                stat_out(&mut g, t, s.stats_f32);
            }
            let d_o = g.tensor(bhsd("do", o_dims, dt, s.layout, false));
            let attrs = SdpaAttrs { score_max: false, score_sum_exp: false, ..attrs };
            let grads = g.sdpa_backward(q, k, v, o, d_o, stats, inputs, attrs);
            for t in [Some(grads.dq), Some(grads.dk), Some(grads.dv), grads.dbias].into_iter().flatten() {
                g.set_output(t);
            }
            // dsink in the io type: it reads the forward's o, which each engine rounds its own
            // way.
            if let Some(t) = grads.dsink_token {
                stat_out(&mut g, t, false);
            }
        }
    }
    Case::new(name, g)
}

fn forward() -> Vec<Spec> {
    use CausalAlignment::{BottomRight, TopLeft};
    use DataType::{Bf16, F16};
    let mut v = Vec::new();
    // Head dims (d = d_v), in both types, with partial q and K/V tiles.
    for (d, s_q, s_kv) in [(32, 130, 200), (64, 65, 200), (96, 7, 33), (128, 130, 33), (160, 65, 33), (192, 7, 200), (256, 65, 33)] {
        v.push(Spec::new(&format!("fwd_d{d}_sq{s_q}_skv{s_kv}"), Bf16).dims(d, d).seq(s_q, s_kv));
    }
    for d in [32, 64, 128, 256] {
        v.push(Spec::new(&format!("fwd_d{d}"), F16).dims(d, d).seq(130, 200).b(1));
    }
    // d != d_v, head dims off the tile widths (general kernels: rows of 16 up to 128, 32 above),
    // one key, one query.
    v.push(Spec::new("fwd_d64_dv128", Bf16).dims(64, 128).seq(65, 33));
    v.push(Spec::new("fwd_d256_dv64", F16).dims(256, 64).seq(7, 200));
    v.push(Spec::new("fwd_d40_sq7", Bf16).dims(40, 40).seq(7, 33));
    v.push(Spec::new("fwd_d200_dv136", F16).dims(200, 136).seq(33, 70).b(1));
    v.push(Spec::new("fwd_d40_padding", F16).b(3).dims(40, 40).seq(130, 77).padding(20));
    v.push(Spec::new("fwd_decode_d40_gqa", Bf16).heads(8, 2).dims(40, 40).seq(1, 200).attrs(|a| a.causal = Some(BottomRight)));
    v.push(Spec::new("fwd_skv1", Bf16).seq(65, 1));
    v.push(Spec::new("fwd_sq1_skv1", F16).seq(1, 1).dims(128, 128));
    // Layouts, scale, no stats, f32 stats.
    v.push(Spec::new("fwd_bshd", Bf16).layout(Layout::Bshd).seq(130, 200).attrs(|a| a.attn_scale = Some(0.3)));
    v.push(Spec::new("fwd_bshd_d128", F16).layout(Layout::Bshd).dims(128, 128).seq(65, 33));
    v.push(Spec::new("fwd_gaps", Bf16).layout(Layout::Gaps).seq(65, 200));
    v.push(Spec::new("fwd_odd_strides", Bf16).layout(Layout::Odd).dims(64, 32).seq(65, 33));
    v.push(Spec::new("fwd_odd_strides_d128", F16).layout(Layout::Odd).dims(128, 128).seq(7, 200));
    v.push(Spec::new("fwd_no_stats", Bf16).seq(130, 33).attrs(|a| a.generate_stats = false));
    v.push(Spec::new("fwd_stats_f32", Bf16).seq(130, 200).stats_f32());
    v.push(Spec::new("fwd_stats_f32", F16).seq(65, 200).dims(128, 128).stats_f32());
    // Causal masks (diagonal tiles, skipped tiles, empty rows) and sliding windows.
    v.push(Spec::new("fwd_causal_tl", Bf16).seq(130, 130).attrs(|a| a.causal = Some(TopLeft)));
    v.push(Spec::new("fwd_causal_tl_d128", F16).seq(130, 200).dims(128, 128).attrs(|a| a.causal = Some(TopLeft)));
    v.push(Spec::new("fwd_causal_br", Bf16).seq(65, 200).attrs(|a| a.causal = Some(BottomRight)));
    v.push(Spec::new("fwd_causal_br_empty_rows", F16).seq(130, 33).attrs(|a| a.causal = Some(BottomRight)));
    v.push(Spec::new("fwd_causal_tl_d256", Bf16).seq(130, 200).dims(256, 256).b(1).attrs(|a| a.causal = Some(TopLeft)));
    v.push(Spec::new("fwd_window", Bf16).seq(130, 200).attrs(|a| {
        a.sliding_window_left = Some(40);
        a.sliding_window_right = Some(9);
    }));
    v.push(Spec::new("fwd_window_causal_br", F16).seq(65, 200).attrs(|a| {
        a.causal = Some(BottomRight);
        a.sliding_window_left = Some(70);
    }));
    v.push(Spec::new("fwd_window_right0", Bf16).seq(130, 33).attrs(|a| a.sliding_window_right = Some(0)));
    // Padding: short rows and keys, whole q tiles and K/V tiles padded.
    v.push(Spec::new("fwd_padding", Bf16).b(3).seq(65, 200).padding(1));
    v.push(Spec::new("fwd_padding_long", F16).b(3).seq(130, 200).padding(40));
    v.push(Spec::new("fwd_padding_causal_br", Bf16).b(3).seq(130, 200).padding(30).attrs(|a| a.causal = Some(BottomRight)));
    // Bias shapes.
    v.push(Spec::new("fwd_bias_full", Bf16).seq(65, 200).bias([2, 2, 65, 200]));
    v.push(Spec::new("fwd_bias_1_h_1_k", F16).seq(130, 33).bias([1, 2, 1, 33]));
    v.push(Spec::new("fwd_bias_b_1_q_1", Bf16).seq(65, 33).bias([2, 1, 65, 1]));
    v.push(Spec::new("fwd_bias_1_1_1_1_causal", Bf16).seq(65, 200).bias([1, 1, 1, 1]).attrs(|a| a.causal = Some(TopLeft)));
    // ALiBi (6 heads: not a power of two), dropout.
    v.push(Spec::new("fwd_alibi_h6_causal", Bf16).heads(6, 3).seq(65, 33).attrs(|a| {
        a.alibi = true;
        a.causal = Some(TopLeft);
    }));
    v.push(Spec::new("fwd_alibi_h4", F16).heads(4, 4).seq(7, 200).attrs(|a| a.alibi = true));
    v.push(Spec::new("fwd_dropout", Bf16).seq(65, 200).attrs(|a| a.dropout = Some(0.2)));
    v.push(Spec::new("fwd_dropout_seed_tensors", F16).seq(130, 33).seed_tensors().attrs(|a| a.dropout = Some(0.5)));
    v.push(Spec::new("fwd_dropout_zero", Bf16).seq(7, 33).attrs(|a| a.dropout = Some(0.0)));
    // GQA, MQA, decode.
    v.push(Spec::new("fwd_gqa", Bf16).heads(8, 2).seq(65, 200));
    v.push(Spec::new("fwd_mqa", F16).heads(4, 1).seq(130, 33).dims(128, 128));
    v.push(Spec::new("fwd_decode_gqa", Bf16).heads(8, 2).seq(1, 200).dims(128, 128).attrs(|a| a.causal = Some(BottomRight)));
    v.push(Spec::new("fwd_decode_padding", F16).b(3).heads(4, 2).seq(1, 200).padding(30));
    // Paged K/V.
    v.push(Spec::new("fwd_paged", Bf16).heads(4, 2).seq(65, 192).paged(32, 6));
    v.push(Spec::new("fwd_paged_padding_decode", F16).b(3).heads(4, 2).seq(1, 200).paged(8, 25).padding(9).attrs(|a| a.causal = Some(BottomRight)));
    v.push(Spec::new("fwd_paged_bshd", Bf16).layout(Layout::Bshd).heads(2, 2).seq(7, 48).paged(16, 5));
    // Everything at once.
    let all = |a: &mut SdpaAttrs| {
        a.causal = Some(BottomRight);
        a.sliding_window_left = Some(50);
        a.alibi = true;
        a.dropout = Some(0.25);
        a.attn_scale = Some(0.2);
    };
    v.push(Spec::new("fwd_all", F16).heads(6, 2).seq(65, 200).padding(20).bias([1, 6, 65, 200]).attrs(all));
    v.push(Spec::new("fwd_all_bshd", Bf16).layout(Layout::Bshd).heads(4, 2).seq(130, 33).padding(3).bias([2, 1, 130, 33]).attrs(all));
    // The Hopper kernel (head dims 64/128, no padding or paging): several q tiles and many K/V
    // tiles, so both stages turn over several times; partial last tiles.
    v.push(Spec::new("fwd90_long", Bf16).b(1).dims(128, 128).seq(300, 700));
    v.push(Spec::new("fwd90_causal_tl", F16).b(1).seq(390, 390).attrs(|a| a.causal = Some(TopLeft)));
    v.push(Spec::new("fwd90_causal_br_gqa", Bf16).b(1).heads(4, 2).dims(128, 128).seq(200, 520).attrs(|a| a.causal = Some(BottomRight)));
    v.push(Spec::new("fwd90_window_dropout", Bf16).b(1).seq(257, 600).attrs(|a| {
        a.sliding_window_left = Some(100);
        a.sliding_window_right = Some(20);
        a.dropout = Some(0.1);
    }));
    v.push(Spec::new("fwd90_bias_alibi_dv64", F16).b(1).dims(128, 64).seq(200, 300).bias([1, 2, 200, 300]).attrs(|a| a.alibi = true));
    v.push(Spec::new("fwd90_bshd", Bf16).b(1).layout(Layout::Bshd).dims(128, 128).seq(260, 450).stats_f32());
    v.push(Spec::new("fwd90_gaps_d64_dv128", F16).b(1).layout(Layout::Gaps).dims(64, 128).seq(129, 257));
    // Head dim 64 without a mask (the persistent kernel): six K/V tiles, so both stages turn
    // over several times, a partial last tile, GQA.
    v.push(Spec::new("fwd90_d64_long", Bf16).b(1).heads(2, 1).seq(200, 700));
    // More work items than an H100 has SMs (144 for 132), so that persistent CTAs take two
    // items (the second's Q in the other buffer, the K/V ring running on; partial q and K/V
    // tiles).
    v.push(Spec::new("fwd90_persist_items_d64_gqa", Bf16).b(3).heads(16, 4).seq(300, 257));
    v.push(Spec::new("fwd90_persist_items_d128_stats", F16).b(2).heads(36, 36).dims(128, 128).seq(200, 300).stats_f32());
    // Without a mask and with more than 16 K/V tiles of 128 keys: the persistent kernel taking
    // items by ticket, partial q and K/V tiles, GQA.
    v.push(Spec::new("fwd90_one_item_long_kv_d128", Bf16).b(1).heads(2, 1).dims(128, 128).seq(130, 2100).stats_f32());
    // The persistent kernel over items of unequal sizes, taken by ticket, with more items than
    // an H100 has SMs: under a causal mask (Q's fragments from registers), and under a window.
    v.push(Spec::new("fwd90_persist_causal_rounds_d128", Bf16).b(2).heads(40, 8).dims(128, 128).seq(300, 300).stats_f32().attrs(|a| a.causal = Some(TopLeft)));
    v.push(Spec::new("fwd90_persist_causal_rounds_d64_br", F16).b(3).heads(16, 4).seq(300, 400).attrs(|a| a.causal = Some(BottomRight)));
    v.push(Spec::new("fwd90_persist_window_rounds_d128", F16).b(2).heads(36, 12).dims(128, 128).seq(200, 520).attrs(|a| {
        a.sliding_window_left = Some(150);
        a.sliding_window_right = Some(10);
    }));
    // The split last round of long items (more than 16 K/V tiles; an H100's 132 SMs), taken
    // by ticket: 200 items of 18 tiles, the last 68 cut into ranges of 9-10 tiles (items in two
    // or three segments, two segments in most ranges), with dropout and stats; 152 items of 17
    // tiles, the last 20 cut into ranges of 2-3.
    v.push(Spec::new("fwd90_split_tail_d64_dropout", Bf16).b(2).heads(25, 5).seq(500, 2200).stats_f32().attrs(|a| a.dropout = Some(0.1)));
    v.push(Spec::new("fwd90_split_tail_ticket_d128", F16).b(1).heads(38, 2).dims(128, 128).seq(500, 2100));
    // Whole q and K/V tiles without a mask (the softmax drops its mask check), split: 200
    // items of 17 tiles.
    v.push(Spec::new("fwd90_split_whole_tiles_d64", Bf16).b(2).heads(50, 10).seq(256, 2176).stats_f32());
    // Whole tiles without a mask or split at d = 64, more items than SMs: five K/V tiles, two,
    // one.
    v.push(Spec::new("fwd90_whole_tiles_d64_five", Bf16).b(3).heads(32, 8).seq(256, 640).stats_f32());
    v.push(Spec::new("fwd90_whole_tiles_d64_two", F16).b(2).heads(40, 40).seq(384, 256));
    // Head dims off the Hopper kernels' 64-channel chunks (zero channels past the head dim):
    // Stable Diffusion's 40 (self- and cross-attention to 77 keys), 80, 96 causal, 8, and q/k
    // and v apart; strided rows.
    v.push(Spec::new("fwd90_d40", Bf16).b(2).heads(3, 3).dims(40, 40).seq(200, 333).stats_f32());
    v.push(Spec::new("fwd90_d40_cross77", F16).b(2).heads(3, 3).dims(40, 40).seq(300, 77));
    v.push(Spec::new("fwd90_d80", F16).b(1).heads(3, 3).dims(80, 80).seq(130, 300));
    v.push(Spec::new("fwd90_d96_causal", Bf16).b(1).heads(4, 2).dims(96, 96).seq(257, 257).attrs(|a| a.causal = Some(TopLeft)));
    v.push(Spec::new("fwd90_d8", Bf16).b(1).heads(2, 2).dims(8, 8).seq(129, 150));
    v.push(Spec::new("fwd90_d72_dv40_gaps", F16).b(1).layout(Layout::Gaps).heads(2, 1).dims(72, 40).seq(150, 190));
    v.push(Spec::new("fwd90_d40_bshd_long", Bf16).b(1).layout(Layout::Bshd).heads(2, 2).dims(40, 40).seq(130, 2100));
    // Head dims above 128 (64-key K/V tiles, one Q buffer, O's products in parts of 128 and 64
    // columns): 256 with a long split tail, causal, 160 (192-channel tiles), q/k and v apart.
    v.push(Spec::new("fwd90_d256_split", Bf16).b(1).heads(3, 3).dims(256, 256).seq(300, 2100).stats_f32());
    v.push(Spec::new("fwd90_d256_causal_br", F16).b(1).heads(4, 2).dims(256, 256).seq(257, 300).attrs(|a| a.causal = Some(BottomRight)));
    v.push(Spec::new("fwd90_d160_bshd", Bf16).b(2).layout(Layout::Bshd).heads(3, 3).dims(160, 160).seq(130, 200));
    v.push(Spec::new("fwd90_d136_dv256_gaps", F16).b(1).layout(Layout::Gaps).heads(2, 1).dims(136, 256).seq(150, 190).attrs(|a| a.sliding_window_left = Some(60)));
    v.push(Spec::new("fwd90_whole_tiles_d64_one", Bf16).b(1).heads(4, 2).seq(256, 128));
    // The sink token and the score statistics (the general kernels: Hopper and decode leave
    // them), several q and K/V tiles, empty rows, padding, head dims on and off the tiles.
    v.push(Spec::new("fwd_sink", Bf16).sink());
    v.push(Spec::new("fwd_sink_score_stats_d128_causal_br_empty_rows", F16).dims(128, 128).seq(130, 33).sink().score_stats().stats_f32().attrs(|a| a.causal = Some(BottomRight)));
    v.push(Spec::new("fwd_sink_score_stats_d40_padding", Bf16).b(3).dims(40, 40).seq(130, 77).padding(20).sink().score_stats().stats_f32());
    v.push(Spec::new("fwd_sink_d256_gqa", F16).b(1).heads(4, 2).dims(256, 256).seq(65, 200).sink().score_stats());
    v.push(Spec::new("fwd_sink_decode_gqa", Bf16).heads(8, 2).dims(128, 128).seq(1, 200).sink().score_stats().stats_f32().attrs(|a| a.causal = Some(BottomRight)));
    v.push(Spec::new("fwd_score_stats_alibi_dropout", F16).heads(6, 3).seq(130, 200).score_stats().stats_f32().attrs(|a| {
        a.alibi = true;
        a.dropout = Some(0.2);
    }));
    v.push(Spec::new("fwd_sink_paged_score_stats", Bf16).heads(4, 2).seq(65, 192).paged(32, 6).sink().score_stats());
    v.push(Spec::new("fwd_sink_window_bshd", Bf16).layout(Layout::Bshd).seq(130, 200).sink().attrs(|a| {
        a.sliding_window_left = Some(40);
        a.sliding_window_right = Some(9);
    }));
    v.push(Spec::new("fwd_sink_long_d128", F16).b(1).heads(2, 1).dims(128, 128).seq(300, 700).sink().score_stats().stats_f32());
    v
}

fn backward() -> Vec<Spec> {
    use Bwd::{Alone, Chained};
    use CausalAlignment::{BottomRight, TopLeft};
    use DataType::{Bf16, F16};
    let mut v = Vec::new();
    // Head dims (two column chunks above 128), both types, partial tiles.
    for (d, s_q, s_kv, dt, how) in [
        (32, 7, 200, Bf16, Alone),
        (64, 65, 200, Bf16, Alone),
        (96, 130, 33, Bf16, Chained),
        (128, 130, 33, F16, Chained),
        (128, 65, 200, Bf16, Alone),
        (160, 65, 33, Bf16, Alone),
        (192, 7, 200, F16, Alone),
        (256, 65, 33, Bf16, Chained),
    ] {
        v.push(Spec::new(&format!("bwd_d{d}_sq{s_q}_skv{s_kv}"), dt).dims(d, d).seq(s_q, s_kv).bwd(how));
    }
    v.push(Spec::new("bwd_d64_dv128", Bf16).dims(64, 128).seq(65, 33).bwd(Alone));
    v.push(Spec::new("bwd_d256_dv64", F16).dims(256, 64).seq(7, 200).b(1).bwd(Alone));
    v.push(Spec::new("bwd_skv1", Bf16).seq(65, 1).bwd(Alone));
    // Head dims off the tile widths: general kernels (s_q <= 64, a padding mask, d > 128) and
    // the Hopper ones (64-channel chunks; with a window, the deterministic dQ pass).
    v.push(Spec::new("bwd_d40_sq33", Bf16).dims(40, 40).seq(33, 77).bwd(Alone));
    v.push(Spec::new("bwd_d200_dv136", F16).dims(200, 136).seq(33, 70).b(1).bwd(Alone));
    v.push(Spec::new("bwd_d40_padding", F16).b(3).dims(40, 40).seq(130, 77).padding(20).bwd(Chained));
    v.push(Spec::new("bwd90_d40", Bf16).b(2).heads(3, 3).dims(40, 40).seq(200, 333).bwd(Chained));
    v.push(Spec::new("bwd90_d40_cross77", F16).b(1).heads(2, 2).dims(40, 40).seq(300, 77).bwd(Alone));
    v.push(Spec::new("bwd90_d80", F16).b(1).heads(3, 3).dims(80, 80).seq(130, 300).bwd(Alone));
    v.push(Spec::new("bwd90_d96_causal", Bf16).b(1).heads(4, 2).dims(96, 96).seq(257, 257).attrs(|a| a.causal = Some(TopLeft)).bwd(Chained));
    v.push(Spec::new("bwd_d40_dv72_window", F16).b(1).heads(2, 1).dims(40, 72).seq(150, 190).attrs(|a| a.sliding_window_left = Some(50)).bwd(Alone));
    v.push(Spec::new("bwd_d72_dv40_window", F16).b(1).heads(2, 1).dims(72, 40).seq(150, 190).attrs(|a| a.sliding_window_left = Some(50)).bwd(Alone));
    // Layouts, stats in f32.
    v.push(Spec::new("bwd_bshd", Bf16).layout(Layout::Bshd).seq(130, 200).attrs(|a| a.attn_scale = Some(0.3)).bwd(Chained));
    v.push(Spec::new("bwd_gaps", F16).layout(Layout::Gaps).seq(65, 33).bwd(Alone));
    v.push(Spec::new("bwd_odd_strides", Bf16).layout(Layout::Odd).dims(64, 32).seq(65, 33).bwd(Chained));
    v.push(Spec::new("bwd_stats_f32", Bf16).seq(130, 200).stats_f32().bwd(Chained));
    // Masks.
    v.push(Spec::new("bwd_causal_tl", Bf16).seq(130, 130).attrs(|a| a.causal = Some(TopLeft)).bwd(Chained));
    v.push(Spec::new("bwd_causal_tl_d128", F16).seq(130, 200).dims(128, 128).attrs(|a| a.causal = Some(TopLeft)).bwd(Chained));
    v.push(Spec::new("bwd_causal_br_empty_rows", Bf16).seq(130, 33).attrs(|a| a.causal = Some(BottomRight)).bwd(Alone));
    v.push(Spec::new("bwd_causal_br", F16).seq(65, 200).attrs(|a| a.causal = Some(BottomRight)).bwd(Chained));
    v.push(
        Spec::new("bwd_window", Bf16)
            .seq(130, 200)
            .attrs(|a| {
                a.sliding_window_left = Some(40);
                a.sliding_window_right = Some(9);
            })
            .bwd(Chained),
    );
    v.push(Spec::new("bwd_padding_long", F16).b(3).seq(130, 200).padding(40).bwd(Chained));
    v.push(Spec::new("bwd_padding_causal_br", Bf16).b(3).seq(65, 200).padding(30).attrs(|a| a.causal = Some(BottomRight)).bwd(Alone));
    // Bias: dbias straight from dS, summed over batch or heads, and a row-broadcast bias (falls back).
    v.push(Spec::new("bwd_bias_full", Bf16).seq(65, 200).bias([2, 2, 65, 200]).bwd(Alone));
    v.push(Spec::new("bwd_bias_1_h_q_k", F16).seq(65, 33).bias([1, 2, 65, 33]).bwd(Chained));
    v.push(Spec::new("bwd_bias_b_1_q_k_gqa", Bf16).heads(4, 2).seq(130, 33).bias([2, 1, 130, 33]).attrs(|a| a.causal = Some(TopLeft)).bwd(Alone));
    v.push(Spec::new("bwd_bias_1_1_q_k", Bf16).seq(7, 200).bias([1, 1, 7, 200]).bwd(Alone));
    v.push(Spec::new("bwd_bias_1_1_1_1_fallback", Bf16).seq(7, 33).bias([1, 1, 1, 1]).bwd(Alone));
    // ALiBi, dropout.
    v.push(Spec::new("bwd_alibi_h6", Bf16).heads(6, 6).seq(65, 33).attrs(|a| a.alibi = true).bwd(Chained));
    v.push(Spec::new("bwd_dropout", Bf16).seq(65, 200).attrs(|a| a.dropout = Some(0.2)).bwd(Chained));
    v.push(Spec::new("bwd_dropout_seed_tensors", F16).seq(130, 33).seed_tensors().attrs(|a| a.dropout = Some(0.5)).bwd(Alone));
    // GQA, MQA, decode, paged (falls back).
    v.push(Spec::new("bwd_gqa", Bf16).heads(8, 2).seq(65, 200).bwd(Chained));
    v.push(Spec::new("bwd_mqa", F16).heads(4, 1).seq(130, 33).dims(128, 128).bwd(Alone));
    v.push(Spec::new("bwd_decode_gqa", Bf16).heads(8, 2).seq(1, 200).attrs(|a| a.causal = Some(BottomRight)).bwd(Alone));
    v.push(Spec::new("bwd_paged_fallback", Bf16).heads(4, 2).seq(65, 192).paged(32, 6).bwd(Alone));
    // The Hopper kernels at d = 128 over many steps (each CTA's three Q/dO stages turn over
    // several times; partial last tiles), GQA, and causal.
    v.push(Spec::new("bwd90_d128_long_gqa", Bf16).b(1).heads(4, 2).dims(128, 128).seq(300, 700).bwd(Alone));
    v.push(Spec::new("bwd90_d128_causal_br_long", F16).b(1).dims(128, 128).seq(520, 520).attrs(|a| a.causal = Some(BottomRight)).bwd(Alone));
    // The Hopper kernels under the frontend test suite's mask combinations that failed there
    // with ferrodnn (test_mhas.py, session 36; the CPU engine matches PyTorch on them): a causal
    // mask with a sliding window, a window with dropout, and bottom-right masks with more
    // query rows than keys (whole rows masked).
    v.push(
        Spec::new("bwd90_causal_tl_window", F16)
            .b(1)
            .dims(128, 128)
            .seq(256, 256)
            .attrs(|a| {
                a.causal = Some(TopLeft);
                a.sliding_window_left = Some(63);
            })
            .bwd(Alone),
    );
    v.push(
        Spec::new("bwd90_window_dropout", F16)
            .b(2)
            .dims(64, 64)
            .seq(300, 300)
            .attrs(|a| {
                a.sliding_window_left = Some(74);
                a.sliding_window_right = Some(75);
                a.dropout = Some(0.2);
            })
            .bwd(Alone),
    );
    v.push(
        Spec::new("bwd90_causal_br_window_sq_gt_skv", F16)
            .b(1)
            .dims(128, 128)
            .seq(300, 200)
            .attrs(|a| {
                a.causal = Some(BottomRight);
                a.sliding_window_left = Some(49);
            })
            .bwd(Chained),
    );
    v.push(
        Spec::new("bwd90_br_right_dropout_sq_gt_skv", F16)
            .b(1)
            .dims(64, 64)
            .seq(256, 128)
            .attrs(|a| {
                a.diagonal_alignment = Some(BottomRight);
                a.sliding_window_right = Some(32);
                a.dropout = Some(0.3);
            })
            .bwd(Alone),
    );
    // The wide (256-channel) Hopper kernels: many steps with GQA and partial tiles, causal, a
    // head dim short of the tile (the second half of each row stored in part) with a window and
    // dropout, ALiBi with a scale.
    v.push(Spec::new("bwd90_d256_long_gqa", Bf16).b(1).heads(4, 2).dims(256, 256).seq(300, 700).bwd(Alone));
    v.push(Spec::new("bwd90_d256_causal_br_long", F16).b(1).dims(256, 256).seq(520, 520).attrs(|a| a.causal = Some(BottomRight)).bwd(Alone));
    v.push(
        Spec::new("bwd90_d200_window_dropout", Bf16)
            .b(1)
            .heads(2, 1)
            .dims(200, 200)
            .seq(150, 190)
            .attrs(|a| {
                a.sliding_window_left = Some(50);
                a.dropout = Some(0.2);
            })
            .bwd(Alone),
    );
    v.push(
        Spec::new("bwd90_d256_alibi_scale", F16)
            .heads(3, 3)
            .dims(256, 256)
            .seq(130, 257)
            .attrs(|a| {
                a.alibi = true;
                a.attn_scale = Some(0.2);
            })
            .bwd(Chained),
    );
    // Everything at once.
    let all = |a: &mut SdpaAttrs| {
        a.causal = Some(BottomRight);
        a.sliding_window_left = Some(50);
        a.alibi = true;
        a.dropout = Some(0.25);
        a.attn_scale = Some(0.2);
    };
    v.push(Spec::new("bwd_all", F16).heads(6, 2).seq(65, 200).padding(20).bias([1, 6, 65, 200]).attrs(all).bwd(Chained));
    v.push(Spec::new("bwd_all_bshd", Bf16).layout(Layout::Bshd).heads(4, 2).seq(130, 33).padding(3).bias([2, 1, 130, 33]).attrs(all).bwd(Alone));
    // The sink's gradient (and dQ, dK, dV beside it) on the general kernels.
    v.push(Spec::new("bwd_sink", Bf16).sink().stats_f32().bwd(Alone));
    v.push(Spec::new("bwd_sink_d128_causal_tl", F16).seq(130, 200).dims(128, 128).sink().attrs(|a| a.causal = Some(TopLeft)).bwd(Chained));
    v.push(Spec::new("bwd_sink_d40_padding", F16).b(3).dims(40, 40).seq(130, 77).padding(20).sink().bwd(Chained));
    v.push(Spec::new("bwd_sink_gqa_dropout", Bf16).heads(8, 2).seq(65, 200).sink().stats_f32().attrs(|a| a.dropout = Some(0.2)).bwd(Alone));
    v.push(Spec::new("bwd_sink_d256_causal_br_empty_rows", Bf16).b(1).dims(256, 256).seq(130, 33).sink().stats_f32().attrs(|a| a.causal = Some(BottomRight)).bwd(Alone));
    v.push(Spec::new("bwd_sink_bias_full_score_stats", F16).seq(65, 200).bias([2, 2, 65, 200]).sink().score_stats().bwd(Chained));
    v.push(Spec::new("bwd_sink_paged_fallback", Bf16).heads(4, 2).seq(65, 192).paged(32, 6).sink().stats_f32().bwd(Alone));
    v.push(Spec::new("bwd_sink_long_gqa_d128", Bf16).b(1).heads(4, 2).dims(128, 128).seq(300, 700).sink().stats_f32().bwd(Alone));
    v
}

pub(super) fn cases() -> Vec<Case> {
    forward().iter().chain(&backward()).map(build).collect()
}

#[cfg(test)]
mod tests {
    use crate::engine::cuda::{kernel_sources, Target};

    /// Head dims off the tile widths run on the flash kernels (the listing also holds the
    /// fallback plan's kernels, `sdpa_*`), not only on the fallback: the Hopper
    /// ones (64-channel tiles) where they apply, the general ones elsewhere, each told the head
    /// dims apart from the tile widths.
    #[test]
    fn head_dims_off_the_tiles_take_the_flash_kernels() {
        let hopper = |name: &str| name.starts_with("fast_attn_fwd90_d") || name.starts_with("fast_attn_bwd90_d");
        let picked = ["_d40", "_d80", "_d96_causal", "_d8_", "_d72", "_d200", "fwd90_d1", "fwd90_d2"];
        let cases: Vec<_> = super::cases().into_iter().filter(|c| picked.iter().any(|d| c.name.contains(d))).collect();
        assert!(cases.len() >= 19, "{} cases", cases.len());
        for c in &cases {
            for target in [Target::sm80(), Target::sm90a()] {
                let sources = kernel_sources(&c.graph, &target).unwrap_or_else(|e| panic!("{}: {e}", c.name));
                let attn: Vec<_> = sources.iter().filter(|(e, _)| e.contains("attn_")).collect();
                assert!(!attn.is_empty(), "{} ({}): {:?}", c.name, target.arch, sources.iter().map(|x| &x.0).collect::<Vec<_>>());
                let sm90 = attn.iter().any(|(e, _)| e.ends_with("_sm90") && !e.contains("ticket") && !e.contains("_d_sm90"));
                assert_eq!(sm90, target.hopper() && hopper(&c.name), "{} ({})", c.name, target.arch);
                for (e, src) in attn.iter().filter(|(_, src)| src.contains("#define FA_D ")) {
                    let dr = src.lines().find_map(|l| l.strip_prefix("#define FA_DR ")).unwrap_or_else(|| panic!("{e}: FA_DR"));
                    let d = src.lines().find_map(|l| l.strip_prefix("#define FA_D ")).unwrap_or_else(|| panic!("{e}: FA_D"));
                    let (dr, d): (i64, i64) = (dr.parse().unwrap(), d.parse().unwrap());
                    assert!(dr <= d && dr % 8 == 0 && d % 16 == 0, "{e}: head dim {dr}, tile {d}");
                    if e.ends_with("_sm90") {
                        assert!(d % 64 == 0 && d <= 256, "{e}: tile {d}");
                    }
                }
            }
        }
    }

    /// Which backward kernels the Hopper and Ampere targets generate: the atomic-dQ dK/dV
    /// kernel on Hopper without a sliding window (beside the deterministic pair), both with
    /// three Q/dO stages, dQ by bulk reductions; the heaviest-first tile order everywhere; the
    /// persistent forward without a mask.
    #[test]
    fn backward_cases_pick_their_kernels() {
        let cases = super::cases();
        let mut seen = (false, false);
        for c in cases.iter().filter(|c| c.name.starts_with("fast_attn_bwd_d128_sq130") || c.name.starts_with("fast_attn_bwd_causal_tl_d128")) {
            let causal = c.name.contains("causal");
            for target in [Target::sm80(), Target::sm90a()] {
                let sources = kernel_sources(&c.graph, &target).unwrap_or_else(|e| panic!("{}: {e}", c.name));
                let has = |entry: &str| sources.iter().any(|(e, _)| e.ends_with(entry));
                let hopper = target.hopper();
                assert_eq!(has("attn_bwd_dkdv_sm90"), hopper, "{} ({})", c.name, target.arch);
                assert_eq!(has("attn_bwd_dkdv_dq_sm90"), hopper, "{} ({})", c.name, target.arch);
                for (e, src) in sources.iter().filter(|(e, _)| e.contains("attn_bwd_dkdv") && e.ends_with("_sm90")) {
                    assert!(src.contains("#define FA_QS 3\n"), "{} {e}", c.name);
                }
                assert_eq!(has("attn_fwd_sm90"), hopper, "{} ({})", c.name, target.arch);
                // dQ (by bulk reductions) in the atomic dK/dV kernel.
                for (e, src) in sources.iter().filter(|(e, _)| e.ends_with("attn_bwd_dkdv_dq_sm90")) {
                    assert!(src.contains("#define FA_ATOMIC_DQ 1\n"), "{} {e}", c.name);
                }
                // The persistent forward, both for short uniform items (two K/V tiles here) and
                // for a causal mask's unequal ones, which the CTAs take by ticket (zeroed by a
                // launch before).
                for (e, src) in sources.iter().filter(|(e, _)| e.ends_with("attn_fwd_sm90")) {
                    assert!(src.contains("#define FA_QT "), "{} {e}", c.name);
                    assert_eq!(src.contains("#define FA_DYNAMIC 1\n"), causal, "{} {e}", c.name);
                }
                assert_eq!(has("attn_fwd_ticket_sm90"), hopper && causal, "{} ({})", c.name, target.arch);
                // No split last round: one K/V tile, or a causal mask.
                for (e, src) in sources.iter().filter(|(e, _)| e.ends_with("attn_fwd_sm90")) {
                    assert!(src.contains("#define FA_SPLIT 0\n"), "{} {e}", c.name);
                }
                // The heaviest-first tile order (it acts under causal masks only).
                for (e, src) in sources.iter().filter(|(e, _)| ["attn_fwd_sm90", "attn_bwd_dq_sm90", "attn_bwd_dkdv_sm90", "attn_bwd_dkdv_dq_sm90"].iter().any(|k| e.ends_with(k)))
                {
                    assert!(src.contains("#define FA_HEADS_GROUP "), "{} {e}", c.name);
                }
            }
            if causal {
                seen.1 = true;
            } else {
                seen.0 = true;
            }
        }
        assert_eq!(seen, (true, true), "both cases found");
    }

    /// 256-wide heads (q/k and v alike) run the Hopper backward's wide kernels on sm_90a, with
    /// the atomic-dQ plan as well (they have no atomic form), and the general kernels on sm_80;
    /// a v head dim of 64 beside 256 stays on the general kernels everywhere.
    #[test]
    fn wide_backward_cases_take_the_wide_kernels() {
        let cases: Vec<_> = super::cases().into_iter().filter(|c| c.name.contains("bwd90_d256") || c.name.contains("bwd90_d200") || c.name.contains("bwd_d256_dv64")).collect();
        assert_eq!(cases.len(), 5, "{:?}", cases.iter().map(|c| &c.name).collect::<Vec<_>>());
        for c in &cases {
            let wide = !c.name.contains("dv64");
            for target in [Target::sm80(), Target::sm90a()] {
                let sources = kernel_sources(&c.graph, &target).unwrap_or_else(|e| panic!("{}: {e}", c.name));
                let has = |entry: &str| sources.iter().any(|(e, _)| e.ends_with(entry));
                let hopper = target.hopper() && wide;
                assert_eq!(has("attn_bwd_dkdv_wide_sm90") && has("attn_bwd_dq_wide_sm90"), hopper, "{} ({})", c.name, target.arch);
                assert!(!has("attn_bwd_dkdv_sm90") && !has("attn_bwd_dkdv_dq_sm90") && !has("attn_bwd_dq_sm90"), "{} ({})", c.name, target.arch);
                for (e, src) in sources.iter().filter(|(e, _)| e.contains("_wide_sm90")) {
                    assert!(src.contains("#define FA_D 256\n") && src.contains("#define FA_DV 256\n"), "{} {e}", c.name);
                }
            }
        }
    }

    /// The sink token and the score statistics: the forward on the general kernel on both
    /// targets (the Hopper and decode forwards leave them to it), told of the sink; the backward
    /// on the Hopper kernels where they apply, the sink's gradient one launch after D.
    #[test]
    fn sink_cases_pick_their_kernels() {
        let cases = super::cases();
        for (name, hopper_bwd) in [
            ("fast_attn_fwd_sink_long_d128", false),
            ("fast_attn_fwd_sink_decode_gqa", false),
            ("fast_attn_fwd_score_stats_alibi_dropout", false),
            ("fast_attn_bwd_sink_long_gqa_d128", true),
            ("fast_attn_bwd_sink_d40_padding", false),
        ] {
            let c = cases.iter().find(|c| c.name.starts_with(name)).unwrap_or_else(|| panic!("{name} found"));
            for target in [Target::sm80(), Target::sm90a()] {
                let sources = kernel_sources(&c.graph, &target).unwrap_or_else(|e| panic!("{}: {e}", c.name));
                let has = |entry: &str| sources.iter().any(|(e, _)| e.ends_with(entry));
                let entries: Vec<_> = sources.iter().map(|x| &x.0).collect();
                if name.contains("_fwd_") {
                    assert!(has("attn_fwd"), "{name} ({}): {entries:?}", target.arch);
                    assert!(!sources.iter().any(|(e, _)| e.contains("attn_fwd_sm90") || e.contains("attn_decode")), "{name} ({}): {entries:?}", target.arch);
                    let (_, src) = sources.iter().find(|(e, _)| e.ends_with("attn_fwd")).unwrap();
                    assert_eq!(src.contains("#define FA_HAS_SINK 1\n"), name.contains("sink"), "{name}");
                    assert_eq!(src.contains("#define FA_HAS_SMAX 1\n"), name.contains("score_stats") || name.contains("decode") || name.contains("long"), "{name}");
                } else {
                    assert!(has("attn_bwd_dsink"), "{name} ({}): {entries:?}", target.arch);
                    assert_eq!(has("attn_bwd_dkdv_sm90") || has("attn_bwd_dkdv_dq_sm90"), target.hopper() && hopper_bwd, "{name} ({}): {entries:?}", target.arch);
                }
            }
        }
    }

    /// The causal order's heads at a time: four for the check cases and b4h16s4096d128, one for
    /// b1h32s16384d128, whose Q, dO, K and V per head exceed the 16 MiB budget.
    #[test]
    fn causal_order_takes_heads_by_l2_budget() {
        use super::{build, Bwd, Spec};
        use crate::graph::ops::sdpa::CausalAlignment::TopLeft;
        use crate::DataType::Bf16;
        let target = Target::sm90a();
        for (name, b, h, s, heads) in [("long", 1, 32, 16384, 1), ("mid", 4, 16, 4096, 4)] {
            let c = build(&Spec::new(name, Bf16).b(b).heads(h, h).dims(128, 128).seq(s, s).attrs(|a| a.causal = Some(TopLeft)).bwd(Bwd::Chained));
            let sources = kernel_sources(&c.graph, &target).unwrap_or_else(|e| panic!("{name}: {e}"));
            let ordered = ["attn_fwd_sm90", "attn_bwd_dq_sm90", "attn_bwd_dkdv_sm90", "attn_bwd_dkdv_dq_sm90"];
            let kernels: Vec<_> = sources.iter().filter(|(e, _)| ordered.iter().any(|k| e.ends_with(k))).collect();
            for k in ordered {
                assert!(kernels.iter().any(|(e, _)| e.ends_with(k)), "{name}: {k}");
            }
            for (e, src) in kernels {
                assert!(src.contains(&format!("#define FA_HEADS_GROUP {heads}\n")), "{name} {e}");
            }
        }
    }

    /// The split last round: the split cases' forward on Hopper splits (with a zeroing launch
    /// before it and a grid of one CTA per SM), the window case's does not.
    #[test]
    fn split_tail_cases_split() {
        let cases = super::cases();
        let target = Target::sm90a();
        for name in [
            "fast_attn_fwd90_split_tail_d64_dropout",
            "fast_attn_fwd90_split_tail_ticket_d128",
            "fast_attn_fwd90_split_whole_tiles_d64",
            "fast_attn_fwd90_persist_window_rounds_d128",
        ] {
            let c = cases.iter().find(|c| c.name.starts_with(name)).unwrap_or_else(|| panic!("{name} found"));
            let split = !name.contains("window");
            let sources = kernel_sources(&c.graph, &target).unwrap_or_else(|e| panic!("{}: {e}", c.name));
            let (_, src) = sources.iter().find(|(e, _)| e.ends_with("attn_fwd_sm90")).unwrap_or_else(|| panic!("{name}: the Hopper forward"));
            assert_eq!(src.contains("#define FA_SPLIT 1\n"), split, "{name}");
            assert_eq!(src.contains(&format!("#define FA_G {}LL\n", target.sm_count)), split, "{name}");
            assert!(sources.iter().any(|(e, _)| e.ends_with("attn_fwd_ticket_sm90")), "{name}: the zeroing launch");
            assert_eq!(src.contains("#define FA_WHOLE_TILES 1\n"), name.contains("whole"), "{name}");
        }
    }
}
