//! sdpa cases: forward and backward over every feature (scale, causal top-left/bottom-right,
//! sliding windows and the band on the bottom-right diagonal, padding masks, bias shapes, ALiBi,
//! dropout and its mask (`rng_dump`), GQA/MQA, K and V of different head counts, paged K/V,
//! stats, the sink token and its gradient (`sink` in the names), the score statistics
//! `score_max` / `score_sum_exp` (`score_stats`)), BSHD, odd and overlapping strides,
//! s_q != s_kv, decode, every float type.
//!
//! Integer inputs the CPU checks (lengths, page tables) are computed in the graph from random
//! integer inputs (which the check fills with values in [-4, 4]) so that they are always valid:
//! a length is `max(s - |x|, 0)`, a page-table entry `|x|` (pools hold at least 5 blocks).

use super::Case;
use crate::graph::ops::pointwise::PointwiseMode;
use crate::graph::ops::sdpa::{CausalAlignment, SdpaAttrs, SdpaInputs};
use crate::graph::TensorId;
use crate::{DataType, Graph, TensorDesc};

#[derive(Clone, Copy, PartialEq)]
enum Layout {
    /// Packed [b, h, s, d].
    Bhsd,
    /// Packed [b, s, h, d].
    Bshd,
    /// Gaps between rows and heads, and K with d outermost within a head.
    Odd,
    /// Views whose elements share memory, as inputs may be: rows 8 elements apart (d > 8
    /// overlaps), Q, V, O and dO expanded over the batch (stride 0), K over the heads.
    Overlap,
}

#[derive(Clone, Copy, PartialEq)]
enum Seeds {
    ByValue,
    Tensors,
}

#[derive(Clone, Copy, PartialEq)]
enum Bwd {
    /// Forward only.
    No,
    /// Backward with o, do and stats as inputs.
    Alone,
    /// Forward then backward on its o and stats.
    Chained,
}

#[derive(Clone)]
struct Spec {
    name: String,
    dt: DataType,
    b: i64,
    h_q: i64,
    h_kv: i64,
    /// V's heads when not `h_kv`.
    h_v: Option<i64>,
    s_q: i64,
    s_kv: i64,
    d: i64,
    d_v: i64,
    layout: Layout,
    attrs: SdpaAttrs,
    bias: Option<[i64; 4]>,
    /// (seed, offset) values of by-value seeds, or random seed tensors.
    seeds: Seeds,
    /// (block_size_k, block_size_v, num_blocks); s_kv must be a multiple of both block sizes.
    paged: Option<(i64, i64, i64)>,
    /// Ragged (packed) q, k, v, o, stats and their gradients, in the BSHD layout, with the
    /// lengths as inputs.
    ragged: bool,
    /// A sink token (`[1, h_q, 1, 1]` f32), and with a backward its gradient.
    sink: bool,
    /// The score statistics outputs (`score_max`, `score_sum_exp`).
    score_stats: bool,
    /// The score statistics and dsink in f32 (as the frontend makes them) rather than the io type.
    stats_f32: bool,
    bwd: Bwd,
}

impl Spec {
    fn new(name: &str) -> Spec {
        Spec {
            name: name.to_string(),
            dt: DataType::F32,
            b: 2,
            h_q: 4,
            h_kv: 4,
            h_v: None,
            s_q: 5,
            s_kv: 7,
            d: 8,
            d_v: 8,
            layout: Layout::Bhsd,
            attrs: SdpaAttrs { generate_stats: true, ..Default::default() },
            bias: None,
            seeds: Seeds::ByValue,
            paged: None,
            ragged: false,
            sink: false,
            score_stats: false,
            stats_f32: false,
            bwd: Bwd::No,
        }
    }
    fn sink(mut self) -> Spec {
        self.sink = true;
        self
    }
    fn score_stats(mut self) -> Spec {
        self.score_stats = true;
        self.attrs.score_max = true;
        self.attrs.score_sum_exp = true;
        self
    }
    fn stats_f32(mut self) -> Spec {
        self.stats_f32 = true;
        self
    }
    fn dt(mut self, dt: DataType) -> Spec {
        self.dt = dt;
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
    fn v_heads(mut self, h_v: i64) -> Spec {
        self.h_v = Some(h_v);
        self
    }
    fn seq(mut self, s_q: i64, s_kv: i64) -> Spec {
        self.s_q = s_q;
        self.s_kv = s_kv;
        self
    }
    fn head_dims(mut self, d: i64, d_v: i64) -> Spec {
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
    fn seeds(mut self, s: Seeds) -> Spec {
        self.seeds = s;
        self
    }
    fn paged(mut self, bs_k: i64, bs_v: i64, blocks: i64) -> Spec {
        self.paged = Some((bs_k, bs_v, blocks));
        self
    }
    fn ragged(mut self) -> Spec {
        self.ragged = true;
        self.layout = Layout::Bshd;
        self.attrs.padding_mask = true;
        self
    }
    fn bwd(mut self, b: Bwd) -> Spec {
        self.bwd = b;
        self
    }
}

/// A [b, h, s, d] tensor in the spec's layout (`key` selects K's odd layout).
fn bhsd(name: &str, dims: [i64; 4], dt: DataType, layout: Layout, key: bool) -> TensorDesc {
    let t = TensorDesc::new(name, &dims, dt);
    match layout {
        Layout::Bhsd => t,
        Layout::Bshd => t.with_layout(&[0, 2, 1, 3]),
        Layout::Odd if key => t.with_layout(&[0, 1, 3, 2]),
        Layout::Odd => {
            let [_, h, s, d] = dims;
            let row = d + 3;
            let head = s * row + 5;
            t.with_strides(&[h * head + 2, head, row, 1])
        }
        Layout::Overlap => {
            let [_, h, s, _] = dims;
            let head = s * 8 + 8;
            if key {
                t.with_strides(&[h * head + 16, 0, 8, 1])
            } else {
                t.with_strides(&[0, head, 8, 1])
            }
        }
    }
}

/// A by-value i32 scalar.
fn int_scalar(g: &mut Graph, name: &str, v: f64) -> TensorId {
    g.tensor(TensorDesc::scalar(name, v, DataType::I32))
}

/// A [b, 1, 1, 1] i32 length `max(s - |x|, 0)` from a random input x.
fn length(g: &mut Graph, name: &str, b: i64, s: i64) -> TensorId {
    let x = g.tensor(TensorDesc::new(format!("{name}_x"), &[b, 1, 1, 1], DataType::I32));
    let a = g.pointwise(PointwiseMode::Abs, &[x]);
    g.desc_mut(a).data_type = Some(DataType::I32);
    let top = int_scalar(g, &format!("{name}_s"), s as f64);
    let l = g.sub(top, a);
    g.desc_mut(l).data_type = Some(DataType::I32);
    let zero = int_scalar(g, &format!("{name}_zero"), 0.0);
    let y = g.pointwise(PointwiseMode::Max, &[l, zero]);
    g.desc_mut(y).data_type = Some(DataType::I32);
    y
}

/// A [b, 1, pages, 1] page table `|x|` (entries 0..=4) from a random input x.
fn page_table(g: &mut Graph, name: &str, b: i64, pages: i64, dt: DataType) -> TensorId {
    let x = g.tensor(TensorDesc::new(format!("{name}_x"), &[b, 1, pages, 1], dt));
    let y = g.pointwise(PointwiseMode::Abs, &[x]);
    g.desc_mut(y).data_type = Some(dt);
    y
}

/// Make every sequence tensor (buffer) of the attention nodes ragged: each gets its own `[b + 1, 1, 1, 1]`
/// i64 offsets (stats in BSHD order, as the others).
fn ragged(g: &mut Graph, b: i64) {
    let mut seen = Vec::new();
    for ni in 0..g.nodes.len() {
        let node = g.nodes[ni].clone();
        for p in node.inputs.iter().chain(&node.outputs) {
            // (An intermediate, such as a chained pass's stats, is not a buffer: it stays dense.)
            if !node.op.ragged_ports().contains(&p.name.as_str()) || seen.contains(&p.tensor) || g.desc(p.tensor).is_virtual {
                continue;
            }
            seen.push(p.tensor);
            let name = format!("{}_offsets", g.desc(p.tensor).name.replace("::", "_"));
            let r = g.tensor(TensorDesc::new(name, &[b + 1, 1, 1, 1], DataType::I64));
            g.set_ragged_offset(p.tensor, r);
            if matches!(p.name.as_str(), "stats" | "score_max" | "score_sum_exp") {
                let d = g.desc_mut(p.tensor);
                d.strides = crate::graph::strides_for_order(&d.dims, &[0, 2, 1, 3]);
            }
        }
    }
    // The offsets as ports now, so that the graph's inputs list them before it is validated.
    g.attach_ragged_offsets().expect("the attention nodes take ragged tensors");
}

fn build(s: &Spec) -> Case {
    let dt = s.dt;
    let mut g = Graph::new(format!("sdpa_{}", s.name)).io_data_type(dt);
    let q = g.tensor(bhsd("q", [s.b, s.h_q, s.s_q, s.d], dt, s.layout, false));
    let mut inputs = SdpaInputs::default();
    let (k, v) = match s.paged {
        Some((bs_k, bs_v, blocks)) => {
            assert!(blocks >= 5 && s.s_kv % bs_k == 0 && s.s_kv % bs_v == 0);
            let k = g.tensor(bhsd("k_pool", [blocks, s.h_kv, bs_k, s.d], dt, s.layout, true));
            let v = g.tensor(bhsd("v_pool", [blocks, s.h_v.unwrap_or(s.h_kv), bs_v, s.d_v], dt, s.layout, false));
            inputs.page_table_k = Some(page_table(&mut g, "page_table_k", s.b, s.s_kv / bs_k, DataType::I32));
            inputs.page_table_v = Some(page_table(&mut g, "page_table_v", s.b, s.s_kv / bs_v, DataType::I64));
            (k, v)
        }
        None => {
            let k = g.tensor(bhsd("k", [s.b, s.h_kv, s.s_kv, s.d], dt, s.layout, true));
            let v = g.tensor(bhsd("v", [s.b, s.h_v.unwrap_or(s.h_kv), s.s_kv, s.d_v], dt, s.layout, false));
            (k, v)
        }
    };
    if let Some(dims) = s.bias {
        inputs.bias = Some(g.tensor(TensorDesc::new("bias", &dims, dt)));
    }
    if s.ragged {
        // The check draws valid lengths and offsets for ragged tensors' inputs.
        inputs.seq_len_q = Some(g.tensor(TensorDesc::new("seq_len_q", &[s.b, 1, 1, 1], DataType::I32)));
        inputs.seq_len_kv = Some(g.tensor(TensorDesc::new("seq_len_kv", &[s.b, 1, 1, 1], DataType::I32)));
    } else if s.attrs.padding_mask {
        inputs.seq_len_q = Some(length(&mut g, "seq_len_q", s.b, s.s_q));
        inputs.seq_len_kv = Some(length(&mut g, "seq_len_kv", s.b, s.s_kv));
    }
    if s.attrs.dropout.is_some() {
        let (seed, offset) = match s.seeds {
            // Seeds with high words set, so every counter and key word matters.
            Seeds::ByValue => (g.tensor(TensorDesc::scalar("seed", 1_099_511_627_813.0, DataType::I64)), g.tensor(TensorDesc::scalar("offset", -3.0, DataType::I64))),
            Seeds::Tensors => (g.tensor(TensorDesc::new("seed", &[1], DataType::I64)), g.tensor(TensorDesc::new("offset", &[1, 1], DataType::I32))),
        };
        inputs.seed = Some(seed);
        inputs.offset = Some(offset);
    }
    if s.sink {
        inputs.sink_token = Some(g.tensor(TensorDesc::new("sink", &[1, s.h_q, 1, 1], DataType::F32)));
    }
    // The statistics outputs and dsink as buffers, in f32 when asked.
    let stat_out = |g: &mut Graph, t: TensorId| {
        g.set_output(t);
        if s.stats_f32 {
            g.desc_mut(t).data_type = Some(DataType::F32);
        }
    };
    let o_dims = [s.b, s.h_q, s.s_q, s.d_v];
    match s.bwd {
        Bwd::No => {
            let (o, stats) = g.sdpa(q, k, v, inputs, s.attrs.clone());
            g.set_output(o);
            for t in [stats, g.sdpa_rng_dump(o)].into_iter().flatten() {
                g.set_output(t);
            }
            for t in [g.sdpa_output(o, "score_max"), g.sdpa_output(o, "score_sum_exp")].into_iter().flatten() {
                stat_out(&mut g, t);
            }
        }
        Bwd::Alone => {
            let o = g.tensor(bhsd("o", o_dims, dt, s.layout, false));
            let d_o = g.tensor(bhsd("do", o_dims, dt, s.layout, false));
            let stats = g.tensor(bhsd("stats", [s.b, s.h_q, s.s_q, 1], DataType::F32, s.layout, false));
            let grads = g.sdpa_backward(q, k, v, o, d_o, stats, inputs, s.attrs.clone());
            for t in [Some(grads.dq), Some(grads.dk), Some(grads.dv), grads.dbias].into_iter().flatten() {
                g.set_output(t);
            }
            if let Some(t) = grads.dsink_token {
                stat_out(&mut g, t);
            }
        }
        Bwd::Chained => {
            let attrs = SdpaAttrs { generate_stats: true, ..s.attrs.clone() };
            let (o, stats) = g.sdpa(q, k, v, inputs, attrs.clone());
            g.set_output(o);
            if let Some(m) = g.sdpa_rng_dump(o) {
                g.set_output(m);
            }
            for t in [g.sdpa_output(o, "score_max"), g.sdpa_output(o, "score_sum_exp")].into_iter().flatten() {
                stat_out(&mut g, t);
            }
            let attrs = SdpaAttrs { rng_dump: false, score_max: false, score_sum_exp: false, ..attrs };
            let d_o = g.tensor(bhsd("do", o_dims, dt, s.layout, false));
            let stats = stats.expect("stats");
            let grads = g.sdpa_backward(q, k, v, o, d_o, stats, inputs, attrs);
            for t in [Some(grads.dq), Some(grads.dk), Some(grads.dv), grads.dbias].into_iter().flatten() {
                g.set_output(t);
            }
            if let Some(t) = grads.dsink_token {
                stat_out(&mut g, t);
            }
        }
    }
    if s.ragged {
        ragged(&mut g, s.b);
    }
    if s.layout == Layout::Overlap {
        // What the op writes is packed (the inputs' stride orders put the stride-0 axes inside).
        let written: Vec<TensorId> = g.nodes.iter().flat_map(|n| n.outputs.iter().map(|p| p.tensor)).collect();
        for t in written {
            let d = g.desc_mut(t);
            if !d.dims.is_empty() {
                d.strides = crate::graph::packed_strides(&d.dims);
            }
        }
    }
    Case::new(format!("sdpa_{}", s.name), g)
}

pub(super) fn cases() -> Vec<Case> {
    use CausalAlignment::{BottomRight, TopLeft};
    use DataType::{Bf16, F16, F32, F64};
    let mut specs = Vec::new();
    // Plain attention in every type, forward and backward.
    for dt in [F32, F16, Bf16, F64] {
        specs.push(Spec::new(&format!("fwd_{dt}")).dt(dt));
        specs.push(Spec::new(&format!("bwd_{dt}")).dt(dt).bwd(Bwd::Alone));
    }
    // Layouts, d_v != d, a given scale.
    specs.push(Spec::new("fwd_bshd").layout(Layout::Bshd).seq(7, 13).head_dims(16, 12).attrs(|a| a.attn_scale = Some(0.3)));
    specs.push(Spec::new("fwd_bshd_bf16").dt(Bf16).layout(Layout::Bshd).seq(9, 5).head_dims(12, 16));
    specs.push(Spec::new("fwd_odd_strides").layout(Layout::Odd).heads(3, 3).seq(6, 11).head_dims(13, 9));
    specs.push(Spec::new("fwd_no_stats").seq(3, 17).attrs(|a| a.generate_stats = false));
    specs.push(Spec::new("bwd_bshd").layout(Layout::Bshd).seq(7, 13).head_dims(16, 12).attrs(|a| a.attn_scale = Some(0.3)).bwd(Bwd::Alone));
    specs.push(Spec::new("bwd_odd_strides_chained").layout(Layout::Odd).heads(3, 3).seq(6, 11).head_dims(13, 9).bwd(Bwd::Chained));
    // Causal masks and sliding windows.
    specs.push(Spec::new("fwd_causal_top_left").seq(7, 11).attrs(|a| a.causal = Some(TopLeft)));
    specs.push(Spec::new("fwd_causal_bottom_right").seq(5, 13).attrs(|a| a.causal = Some(BottomRight)));
    specs.push(Spec::new("fwd_causal_bottom_right_empty_rows").seq(11, 6).attrs(|a| a.causal = Some(BottomRight)));
    specs.push(Spec::new("fwd_causal_top_left_f16").dt(F16).seq(9, 4).attrs(|a| a.causal = Some(TopLeft)));
    specs.push(Spec::new("fwd_window").seq(13, 13).attrs(|a| {
        a.sliding_window_left = Some(2);
        a.sliding_window_right = Some(1);
    }));
    specs.push(Spec::new("fwd_window_causal_bottom_right").seq(7, 15).attrs(|a| {
        a.causal = Some(BottomRight);
        a.sliding_window_left = Some(3);
    }));
    specs.push(Spec::new("fwd_window_right_only").seq(9, 5).attrs(|a| a.sliding_window_right = Some(0)));
    specs.push(Spec::new("bwd_causal_top_left").seq(7, 11).attrs(|a| a.causal = Some(TopLeft)).bwd(Bwd::Alone));
    specs.push(Spec::new("bwd_causal_bottom_right_gqa_chained").heads(6, 2).seq(7, 9).attrs(|a| a.causal = Some(BottomRight)).bwd(Bwd::Chained));
    specs.push(
        Spec::new("bwd_window")
            .seq(13, 13)
            .attrs(|a| {
                a.sliding_window_left = Some(2);
                a.sliding_window_right = Some(1);
            })
            .bwd(Bwd::Chained),
    );
    // Padding masks.
    specs.push(Spec::new("fwd_padding").seq(9, 13).attrs(|a| a.padding_mask = true));
    specs.push(Spec::new("fwd_padding_short_kv_bottom_right").b(3).seq(9, 3).attrs(|a| {
        a.padding_mask = true;
        a.causal = Some(BottomRight);
    }));
    specs.push(
        Spec::new("bwd_padding_bottom_right")
            .seq(9, 7)
            .attrs(|a| {
                a.padding_mask = true;
                a.causal = Some(BottomRight);
            })
            .bwd(Bwd::Alone),
    );
    specs.push(Spec::new("bwd_padding_chained").b(3).seq(5, 4).attrs(|a| a.padding_mask = true).bwd(Bwd::Chained));
    // Bias shapes (and dbias reduced over the broadcast dims).
    for (tag, dims) in [("full", [2, 4, 5, 7]), ("1_1_q_k", [1, 1, 5, 7]), ("b_1_1_k", [2, 1, 1, 7]), ("1_h_1_1", [1, 4, 1, 1]), ("1_1_1_1", [1, 1, 1, 1])] {
        specs.push(Spec::new(&format!("fwd_bias_{tag}")).bias(dims));
        specs.push(Spec::new(&format!("bwd_bias_{tag}")).bias(dims).bwd(Bwd::Alone));
    }
    specs.push(Spec::new("bwd_bias_b_1_q_k_chained_f16").dt(F16).bias([2, 1, 5, 7]).attrs(|a| a.causal = Some(TopLeft)).bwd(Bwd::Chained));
    // ALiBi (a power of two and not).
    specs.push(Spec::new("fwd_alibi_h4").attrs(|a| a.alibi = true));
    specs.push(Spec::new("fwd_alibi_h6_causal").heads(6, 3).attrs(|a| {
        a.alibi = true;
        a.causal = Some(TopLeft);
    }));
    specs.push(Spec::new("bwd_alibi_h6").heads(6, 6).attrs(|a| a.alibi = true).bwd(Bwd::Chained));
    // Dropout.
    specs.push(Spec::new("fwd_dropout").seq(5, 9).attrs(|a| a.dropout = Some(0.3)));
    specs.push(Spec::new("fwd_dropout_seed_tensors").seq(6, 7).seeds(Seeds::Tensors).attrs(|a| a.dropout = Some(0.5)));
    specs.push(Spec::new("fwd_dropout_zero").seq(6, 7).attrs(|a| a.dropout = Some(0.0)));
    specs.push(Spec::new("bwd_dropout_chained").seq(5, 9).attrs(|a| a.dropout = Some(0.3)).bwd(Bwd::Chained));
    specs.push(Spec::new("bwd_dropout_seed_tensors").seq(6, 7).seeds(Seeds::Tensors).attrs(|a| a.dropout = Some(0.2)).bwd(Bwd::Alone));
    // Grouped- and multi-query attention, decode.
    specs.push(Spec::new("fwd_gqa").heads(6, 2).seq(5, 9));
    specs.push(Spec::new("fwd_mqa").heads(4, 1).seq(7, 5).head_dims(9, 11));
    specs.push(Spec::new("fwd_decode").heads(8, 2).seq(1, 17).head_dims(16, 16).attrs(|a| a.causal = Some(BottomRight)));
    specs.push(Spec::new("bwd_gqa").heads(6, 2).seq(5, 9).bwd(Bwd::Alone));
    specs.push(Spec::new("bwd_mqa_decode").heads(4, 1).seq(1, 13).head_dims(9, 11).bwd(Bwd::Alone));
    // Paged K/V (K blocks of 4, V blocks of 6; tables may repeat blocks).
    specs.push(Spec::new("fwd_paged").heads(4, 2).seq(5, 12).paged(4, 6, 6));
    specs.push(Spec::new("fwd_paged_padding_decode").heads(4, 2).seq(1, 12).paged(3, 4, 5).attrs(|a| {
        a.padding_mask = true;
        a.causal = Some(BottomRight);
    }));
    specs.push(Spec::new("fwd_paged_bshd_f16").dt(F16).layout(Layout::Bshd).heads(2, 2).seq(5, 12).paged(6, 4, 7));
    specs.push(Spec::new("bwd_paged").heads(4, 2).seq(5, 12).paged(4, 6, 6).bwd(Bwd::Alone));
    specs.push(Spec::new("bwd_paged_padding_chained").heads(4, 2).seq(5, 12).paged(3, 4, 5).attrs(|a| a.padding_mask = true).bwd(Bwd::Chained));
    // Everything at once.
    let all = |a: &mut SdpaAttrs| {
        a.causal = Some(BottomRight);
        a.sliding_window_left = Some(4);
        a.padding_mask = true;
        a.alibi = true;
        a.dropout = Some(0.25);
        a.attn_scale = Some(0.2);
    };
    specs.push(Spec::new("fwd_all_f16").dt(F16).heads(6, 2).seq(7, 9).bias([1, 6, 7, 9]).attrs(all));
    specs.push(Spec::new("bwd_all").heads(6, 2).seq(7, 9).bias([2, 1, 7, 1]).attrs(all).bwd(Bwd::Chained));
    specs.push(Spec::new("bwd_all_paged_bf16").dt(Bf16).heads(6, 3).seq(5, 12).paged(4, 3, 5).bias([2, 6, 5, 12]).attrs(all).bwd(Bwd::Alone));
    // K and V of different head counts (the fast kernels decline them).
    specs.push(Spec::new("fwd_kv_heads_differ").heads(6, 2).v_heads(3).seq(5, 9).head_dims(8, 12));
    specs.push(Spec::new("fwd_kv_heads_differ_f16").dt(F16).heads(4, 1).v_heads(2).seq(7, 20).head_dims(16, 16).attrs(|a| a.causal = Some(TopLeft)));
    specs.push(Spec::new("fwd_kv_heads_differ_paged").heads(6, 3).v_heads(2).seq(5, 12).paged(4, 6, 6));
    specs.push(Spec::new("bwd_kv_heads_differ_chained").heads(6, 3).v_heads(1).seq(5, 9).attrs(|a| a.causal = Some(BottomRight)).bwd(Bwd::Chained));
    specs.push(Spec::new("bwd_kv_heads_differ_bf16").dt(Bf16).heads(4, 4).v_heads(2).seq(6, 11).head_dims(16, 16).bwd(Bwd::Alone));
    // The band on the bottom-right diagonal without the causal mask (a positive right bound).
    let band = |a: &mut SdpaAttrs| {
        a.diagonal_alignment = Some(BottomRight);
        a.sliding_window_left = Some(3);
        a.sliding_window_right = Some(2);
    };
    specs.push(Spec::new("fwd_band_bottom_right").seq(7, 15).attrs(band));
    specs.push(Spec::new("fwd_band_bottom_right_f16").dt(F16).seq(9, 20).head_dims(16, 16).attrs(band));
    specs.push(Spec::new("fwd_band_bottom_right_right_only_padding").b(3).seq(9, 6).attrs(|a| {
        a.diagonal_alignment = Some(BottomRight);
        a.sliding_window_right = Some(1);
        a.padding_mask = true;
    }));
    specs.push(Spec::new("bwd_band_bottom_right_chained").seq(7, 15).attrs(band).bwd(Bwd::Chained));
    specs.push(Spec::new("bwd_band_bottom_right_f16").dt(F16).seq(9, 20).head_dims(16, 16).attrs(band).bwd(Bwd::Alone));
    // The dropout mask as an output.
    let dump = |a: &mut SdpaAttrs| {
        a.dropout = Some(0.3);
        a.rng_dump = true;
    };
    specs.push(Spec::new("fwd_rng_dump").seq(5, 9).attrs(dump));
    specs.push(Spec::new("fwd_rng_dump_f16_seed_tensors").dt(F16).seq(6, 24).head_dims(16, 16).seeds(Seeds::Tensors).attrs(dump));
    specs.push(Spec::new("fwd_rng_dump_no_stats_padding").b(3).seq(4, 7).attrs(|a| {
        dump(a);
        a.generate_stats = false;
        a.padding_mask = true;
    }));
    specs.push(Spec::new("bwd_rng_dump_chained").seq(5, 9).attrs(dump).bwd(Bwd::Chained));
    // Inputs whose elements share memory (overlapping rows, stride-0 batches and heads).
    specs.push(Spec::new("fwd_overlap").layout(Layout::Overlap).seq(5, 9).head_dims(16, 12));
    specs.push(Spec::new("fwd_overlap_f16").layout(Layout::Overlap).dt(F16).heads(4, 2).seq(17, 33).head_dims(16, 16).attrs(|a| a.causal = Some(BottomRight)));
    specs.push(Spec::new("fwd_overlap_bf16_decode").layout(Layout::Overlap).dt(Bf16).heads(8, 2).seq(1, 40).head_dims(64, 64));
    specs.push(Spec::new("bwd_overlap_f16").layout(Layout::Overlap).dt(F16).heads(4, 2).seq(17, 33).head_dims(16, 16).bwd(Bwd::Alone));
    specs.push(Spec::new("bwd_overlap_chained").layout(Layout::Overlap).seq(6, 11).head_dims(16, 16).attrs(|a| a.causal = Some(TopLeft)).bwd(Bwd::Chained));
    // Ragged (packed, THD) sequences: each batch at its own offsets, only its rows in memory.
    specs.push(Spec::new("fwd_ragged").b(3).heads(4, 2).seq(9, 13).head_dims(16, 12).ragged());
    specs.push(Spec::new("fwd_ragged_f16_causal").dt(F16).b(4).heads(4, 4).seq(17, 17).head_dims(64, 64).ragged().attrs(|a| a.causal = Some(TopLeft)));
    specs.push(Spec::new("fwd_ragged_bf16_bottom_right_no_stats").dt(Bf16).b(3).heads(2, 1).seq(6, 20).head_dims(32, 32).ragged().attrs(|a| {
        a.causal = Some(BottomRight);
        a.generate_stats = false;
    }));
    specs.push(Spec::new("bwd_ragged_chained").b(3).heads(4, 4).seq(7, 11).ragged().bwd(Bwd::Chained));
    specs.push(Spec::new("bwd_ragged_bf16_gqa_causal").dt(Bf16).b(4).heads(6, 2).seq(9, 9).head_dims(16, 16).ragged().attrs(|a| a.causal = Some(TopLeft)).bwd(Bwd::Alone));
    // Ragged on the flash kernels: several tiles per sequence, head dims up to 160.
    specs.push(Spec::new("fwd_ragged_bf16_long_bottom_right").dt(Bf16).b(3).heads(4, 2).seq(150, 200).head_dims(128, 128).ragged().attrs(|a| a.causal = Some(BottomRight)));
    specs.push(Spec::new("fwd_ragged_f16_d40_dv72").dt(F16).b(3).heads(2, 2).seq(77, 90).head_dims(40, 72).ragged());
    specs.push(Spec::new("bwd_ragged_f16_long_chained").dt(F16).b(3).heads(4, 4).seq(130, 97).head_dims(64, 64).ragged().attrs(|a| a.causal = Some(TopLeft)).bwd(Bwd::Chained));
    specs.push(Spec::new("bwd_ragged_bf16_d160_dropout").dt(Bf16).b(2).heads(2, 1).seq(70, 70).head_dims(160, 160).ragged().attrs(|a| a.dropout = Some(0.1)).bwd(Bwd::Alone));
    specs.push(
        Spec::new("bwd_ragged_dropout_window_chained")
            .b(2)
            .seq(8, 12)
            .ragged()
            .attrs(|a| {
                a.dropout = Some(0.2);
                a.sliding_window_left = Some(4);
            })
            .bwd(Bwd::Chained),
    );
    specs.push(Spec::new("bwd_all_f64").dt(F64).heads(2, 1).seq(6, 10).layout(Layout::Bshd).bias([1, 1, 6, 10]).attrs(all).bwd(Bwd::Chained));
    // The sink token (a logit per query head in every row's softmax, no value) and the score
    // statistics (each row's softmax max and sum), forward; the sink's gradient, backward.
    specs.push(Spec::new("fwd_sink").sink());
    specs.push(Spec::new("fwd_sink_f64_score_stats").dt(F64).sink().score_stats());
    specs.push(Spec::new("fwd_sink_f16_causal_bottom_right_empty_rows").dt(F16).seq(11, 6).head_dims(16, 16).sink().attrs(|a| a.causal = Some(BottomRight)));
    specs.push(
        Spec::new("fwd_sink_bf16_gqa_padding_score_stats").dt(Bf16).b(3).heads(6, 2).seq(9, 13).head_dims(16, 8).sink().score_stats().stats_f32().attrs(|a| a.padding_mask = true),
    );
    specs.push(Spec::new("fwd_sink_all_f16").dt(F16).heads(6, 2).seq(7, 9).head_dims(16, 16).bias([1, 6, 7, 9]).sink().score_stats().attrs(all));
    specs.push(Spec::new("fwd_sink_paged_odd_strides").layout(Layout::Odd).heads(4, 2).seq(5, 12).paged(4, 6, 6).sink().score_stats());
    specs.push(Spec::new("fwd_sink_decode_f16").dt(F16).heads(8, 2).seq(1, 17).head_dims(16, 16).sink().score_stats().stats_f32().attrs(|a| a.causal = Some(BottomRight)));
    specs.push(Spec::new("fwd_score_stats").seq(7, 11).score_stats().attrs(|a| a.generate_stats = false));
    specs.push(Spec::new("fwd_score_stats_f16_window_empty_rows").dt(F16).seq(13, 13).head_dims(16, 16).score_stats().stats_f32().attrs(|a| {
        a.sliding_window_left = Some(2);
        a.causal = Some(TopLeft);
        a.dropout = Some(0.3);
    }));
    specs.push(Spec::new("fwd_sink_ragged_score_stats").b(3).heads(4, 2).seq(9, 13).head_dims(16, 16).ragged().sink().score_stats());
    specs.push(
        Spec::new("fwd_sink_ragged_bf16_score_stats")
            .dt(Bf16)
            .b(3)
            .heads(4, 4)
            .seq(17, 20)
            .head_dims(32, 32)
            .ragged()
            .sink()
            .score_stats()
            .stats_f32()
            .attrs(|a| a.causal = Some(BottomRight)),
    );
    specs.push(Spec::new("bwd_sink").sink().stats_f32().bwd(Bwd::Alone));
    specs.push(Spec::new("bwd_sink_chained_f64").dt(F64).heads(4, 2).seq(6, 9).sink().score_stats().attrs(|a| a.causal = Some(BottomRight)).bwd(Bwd::Chained));
    specs.push(Spec::new("bwd_sink_f16_alone_gqa").dt(F16).heads(6, 2).seq(9, 7).head_dims(16, 16).sink().stats_f32().attrs(|a| a.causal = Some(TopLeft)).bwd(Bwd::Alone));
    specs.push(
        Spec::new("bwd_sink_bf16_padding_chained")
            .dt(Bf16)
            .b(3)
            .heads(4, 4)
            .seq(9, 6)
            .head_dims(16, 16)
            .sink()
            .attrs(|a| {
                a.padding_mask = true;
                a.causal = Some(BottomRight);
            })
            .bwd(Bwd::Chained),
    );
    specs.push(Spec::new("bwd_sink_all_chained").heads(6, 2).seq(7, 9).bias([2, 1, 7, 1]).sink().score_stats().attrs(all).bwd(Bwd::Chained));
    specs.push(Spec::new("bwd_sink_paged").heads(4, 2).seq(5, 12).paged(4, 6, 6).sink().stats_f32().bwd(Bwd::Alone));
    specs.push(Spec::new("bwd_sink_ragged_chained").b(3).heads(4, 4).seq(7, 11).ragged().sink().score_stats().bwd(Bwd::Chained));
    specs.push(Spec::new("bwd_sink_ragged_f16_alone").dt(F16).b(3).heads(4, 2).seq(9, 9).head_dims(16, 16).ragged().sink().stats_f32().bwd(Bwd::Alone));
    specs.iter().map(build).collect()
}
