//! Cases for the split-KV decode kernel (engine/cuda/attention/decode.rs): `group * s_q <= 16`
//! query rows per CTA (s_q 1 to 4, groups 1, 2, 4, 8), s_kv 1, 7, 300, 1000 and 4000 (one
//! split, a few, fifteen; empty splits through padding, causal top-left and windows), head
//! dims 64, 128, 256 and 64/128 (40 and 32 rows per kv head fall to other kernels), paged K/V
//! with block sizes 7, 13 and 16, padding (down to empty batches and padded query rows),
//! causal bottom-right and top-left, sliding windows, bias shapes, ALiBi, dropout, stats in
//! the io type, in f32 and absent, BHSD, BSHD and odd strides (element-wise loads), bf16 and
//! f16. K and V stay under 300k elements.
//!
//! Lengths are computed in the graph from random integer inputs x in [-4, 4]:
//! `max(s - step * |x|, 0)`; page-table entries are `|x|` (pools of 5 blocks).

use super::fast_attn::{bhsd, length, page_table, Layout};
use super::Case;
use crate::graph::ops::sdpa::{CausalAlignment, SdpaAttrs, SdpaInputs};
use crate::{DataType, Graph, TensorDesc};

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
    pad_step: i64,
    seed_tensors: bool,
    /// K/V block size (s_kv a multiple of it); pools of 5 blocks.
    paged: Option<i64>,
    stats_f32: bool,
}

impl Spec {
    /// `b` batches, `h_q` query heads in groups of `group`, one query row, 300 keys, d 128.
    fn new(name: &str, dt: DataType, b: i64, h_q: i64, group: i64) -> Spec {
        Spec {
            name: name.to_string(),
            dt,
            b,
            h_q,
            h_kv: h_q / group,
            s_q: 1,
            s_kv: 300,
            d: 128,
            d_v: 128,
            layout: Layout::Bhsd,
            attrs: SdpaAttrs { generate_stats: true, ..Default::default() },
            bias: None,
            pad_step: 1,
            seed_tensors: false,
            paged: None,
            stats_f32: false,
        }
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
    fn paged(mut self, block: i64) -> Spec {
        self.paged = Some(block);
        self
    }
    fn stats_f32(mut self) -> Spec {
        self.stats_f32 = true;
        self
    }
}

fn build(s: &Spec) -> Case {
    let dt = s.dt;
    let name = format!("fast_attn_decode_{}_{}", s.name, dt);
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let q = g.tensor(bhsd("q", [s.b, s.h_q, s.s_q, s.d], dt, s.layout, false));
    let mut inputs = SdpaInputs::default();
    let (k, v) = match s.paged {
        Some(bs) => {
            assert!(s.s_kv % bs == 0);
            let k = g.tensor(bhsd("k_pool", [5, s.h_kv, bs, s.d], dt, s.layout, true));
            let v = g.tensor(bhsd("v_pool", [5, s.h_kv, bs, s.d_v], dt, s.layout, false));
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
        // One query row stays (mostly padded rows otherwise); longer ones lose up to 4 rows.
        inputs.seq_len_q = Some(length(&mut g, "seq_len_q", s.b, s.s_q, if s.s_q > 1 { 1 } else { 0 }));
        inputs.seq_len_kv = Some(length(&mut g, "seq_len_kv", s.b, s.s_kv, s.pad_step));
    }
    if s.attrs.dropout.is_some() {
        let (seed, offset) = if s.seed_tensors {
            (g.tensor(TensorDesc::new("seed", &[1], DataType::I64)), g.tensor(TensorDesc::new("offset", &[1, 1], DataType::I32)))
        } else {
            (g.tensor(TensorDesc::scalar("seed", 1_099_511_627_813.0, DataType::I64)), g.tensor(TensorDesc::scalar("offset", 77.0, DataType::I64)))
        };
        inputs.seed = Some(seed);
        inputs.offset = Some(offset);
    }
    let (o, stats) = g.sdpa(q, k, v, inputs, s.attrs.clone());
    g.set_output(o);
    if let Some(st) = stats {
        g.set_output(st);
        if s.stats_f32 {
            g.desc_mut(st).data_type = Some(DataType::F32);
        }
    }
    Case::new(name, g)
}

fn specs() -> Vec<Spec> {
    use CausalAlignment::{BottomRight, TopLeft};
    use DataType::{Bf16, F16};
    let br = |a: &mut SdpaAttrs| a.causal = Some(BottomRight);
    let mut v = vec![
        // Groups of 1, 4 and 8 query heads, s_q 1 to 4 (up to 16 rows per kv head).
        Spec::new("sq1_g4_skv300", Bf16, 2, 8, 4).attrs(br),
        Spec::new("sq1_g4_skv1000", Bf16, 1, 8, 4).seq(1, 1000).attrs(br),
        Spec::new("sq1_g4_skv1000", F16, 2, 8, 4).seq(1, 1000).dims(64, 64),
        Spec::new("sq1_g1_skv7", F16, 2, 2, 1).seq(1, 7).dims(64, 64),
        Spec::new("sq1_g1_skv1000", Bf16, 1, 2, 1).seq(1, 1000),
        Spec::new("sq1_g8_skv1_mqa", Bf16, 2, 8, 8).seq(1, 1).dims(64, 64),
        Spec::new("sq1_skv1_d128", F16, 1, 4, 4).seq(1, 1),
        Spec::new("sq2_g8_skv1000", F16, 2, 8, 8).seq(2, 1000).dims(64, 64).attrs(br),
        Spec::new("sq3_g4_skv300_causal_tl", Bf16, 2, 8, 4).seq(3, 300).dims(64, 64).attrs(|a| a.causal = Some(TopLeft)),
        Spec::new("sq2_g4_skv1000_causal_tl_empty_splits", Bf16, 2, 8, 4).seq(2, 1000).dims(64, 64).attrs(|a| a.causal = Some(TopLeft)),
        Spec::new("sq4_g4_skv1000_causal_br", F16, 2, 8, 4).seq(4, 1000).dims(64, 64).attrs(br),
        Spec::new("sq4_g1_skv7", Bf16, 2, 4, 1).seq(4, 7),
        Spec::new("sq4_g2_skv300", F16, 2, 4, 2).seq(4, 300),
        // 32 rows per kv head: other kernels.
        Spec::new("sq4_g8_rows32_general", Bf16, 1, 8, 8).seq(4, 300).dims(64, 64),
        // Head dims (40: zero channels up to the tile width of 48), many splits.
        Spec::new("d40", Bf16, 2, 8, 4).seq(1, 300).dims(40, 40),
        Spec::new("d256", Bf16, 1, 8, 4).seq(1, 300).dims(256, 256).attrs(br),
        Spec::new("d64_dv128", F16, 2, 8, 4).seq(2, 300).dims(64, 128),
        Spec::new("d128_dv64", Bf16, 1, 8, 4).seq(1, 1000).dims(128, 64),
        Spec::new("long_splits", Bf16, 1, 4, 4).seq(1, 4000).dims(64, 64).attrs(br),
        // Layouts, scale, stats.
        Spec::new("bshd", Bf16, 2, 8, 4).seq(1, 1000).dims(64, 64).layout(Layout::Bshd).attrs(|a| a.attn_scale = Some(0.3)),
        Spec::new("bshd_sq3", F16, 2, 8, 4).seq(3, 300).layout(Layout::Bshd).attrs(br),
        Spec::new("odd_strides", F16, 2, 8, 4).seq(2, 300).dims(64, 64).layout(Layout::Odd),
        Spec::new("odd_strides_splits", Bf16, 1, 8, 4).seq(1, 1000).layout(Layout::Odd),
        Spec::new("stats_f32", Bf16, 2, 8, 4).seq(1, 1000).dims(64, 64).stats_f32(),
        Spec::new("stats_f32_one_split", F16, 2, 8, 4).stats_f32(),
        Spec::new("no_stats", Bf16, 2, 8, 4).seq(1, 1000).dims(64, 64).attrs(|a| a.generate_stats = false),
        // Padding: shorter keys (down to none), padded query rows, empty splits.
        Spec::new("padding", Bf16, 3, 4, 4).seq(1, 1000).dims(64, 64).padding(150).attrs(br),
        Spec::new("padding_empty", F16, 3, 8, 8).seq(1, 1000).dims(64, 64).padding(250),
        Spec::new("padding_sq3", Bf16, 3, 8, 4).seq(3, 300).dims(64, 64).padding(40).attrs(br),
        Spec::new("padding_one_split", F16, 3, 4, 4).seq(2, 300).padding(70),
        // Windows (splits of which most are empty).
        Spec::new("window_br", Bf16, 2, 8, 4).seq(1, 1000).dims(64, 64).attrs(|a| {
            a.causal = Some(BottomRight);
            a.sliding_window_left = Some(100);
        }),
        Spec::new("window_tl_sq4", F16, 2, 8, 4).seq(4, 1000).dims(64, 64).attrs(|a| {
            a.sliding_window_left = Some(5);
            a.sliding_window_right = Some(400);
        }),
        // Paged K/V with odd block sizes.
        Spec::new("paged_bs7", Bf16, 3, 8, 4).seq(1, 301).paged(7).padding(30).attrs(br),
        Spec::new("paged_bs13_splits", F16, 3, 8, 4).seq(1, 1001).dims(64, 64).paged(13).padding(200).attrs(br),
        Spec::new("paged_bs16_bshd", Bf16, 2, 8, 8).seq(2, 1008).dims(64, 64).paged(16).layout(Layout::Bshd),
        Spec::new("paged_odd_strides", F16, 2, 4, 2).seq(1, 300).dims(64, 64).paged(15).layout(Layout::Odd),
        // Bias shapes, ALiBi, dropout.
        Spec::new("bias_full", Bf16, 2, 8, 4).seq(2, 1000).dims(64, 64).bias([2, 8, 2, 1000]),
        Spec::new("bias_1_h_1_k", F16, 2, 8, 4).seq(1, 300).bias([1, 8, 1, 300]).attrs(br),
        Spec::new("bias_b_1_1_1", Bf16, 2, 8, 4).seq(1, 300).dims(64, 64).bias([2, 1, 1, 1]),
        Spec::new("alibi_h6_g2", Bf16, 2, 6, 2).seq(2, 300).dims(64, 64).attrs(|a| {
            a.alibi = true;
            a.causal = Some(BottomRight);
        }),
        Spec::new("alibi_h8_splits", F16, 1, 8, 4).seq(1, 1000).attrs(|a| a.alibi = true),
        Spec::new("dropout", Bf16, 2, 8, 4).seq(1, 1000).dims(64, 64).attrs(|a| a.dropout = Some(0.2)),
        Spec::new("dropout_seed_tensors", F16, 2, 8, 4).seq(3, 300).dims(64, 64).seed_tensors().attrs(|a| a.dropout = Some(0.5)),
    ];
    // Everything at once.
    let all = |a: &mut SdpaAttrs| {
        a.causal = Some(BottomRight);
        a.sliding_window_left = Some(600);
        a.alibi = true;
        a.dropout = Some(0.25);
        a.attn_scale = Some(0.2);
    };
    v.push(Spec::new("all_paged", F16, 3, 8, 4).seq(2, 1001).dims(64, 64).paged(7).padding(60).bias([1, 8, 2, 1001]).attrs(all));
    v.push(Spec::new("all_bshd", Bf16, 2, 8, 4).seq(1, 1000).dims(64, 64).layout(Layout::Bshd).padding(90).bias([2, 1, 1, 1000]).attrs(all));
    v
}

pub(super) fn cases() -> Vec<Case> {
    specs().iter().map(build).collect()
}

#[cfg(test)]
mod tests {
    use crate::engine::cuda::{kernel_sources, Target};
    use crate::testing::{random_inputs, run_cpu};

    #[test]
    fn decode_cases_run_on_the_cpu_and_pick_their_path() {
        let cases = super::cases();
        let mut names = std::collections::HashSet::new();
        for c in &cases {
            assert!(names.insert(c.name.clone()), "duplicate case name {}", c.name);
            let mut g = c.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", c.name));
            for t in &g.tensors {
                assert!(t.element_count() <= 300_000, "{}: tensor {} too large", c.name, t.name);
            }
            let outs = run_cpu(&g, &random_inputs(&g, 7)).unwrap_or_else(|e| panic!("{}: {e}", c.name));
            assert!(!outs.is_empty(), "{}: no outputs", c.name);
            for target in [Target::sm80(), Target::sm90a()] {
                let entries: Vec<String> = kernel_sources(&g, &target).unwrap_or_else(|e| panic!("{}: {e}", c.name)).into_iter().map(|(e, _)| e).collect();
                let decode = entries.iter().any(|e| e.contains("attn_decode"));
                let other = c.name.contains("_general") || c.name.contains("_fallback");
                assert_eq!(decode, !other, "{} ({}): {entries:?}", c.name, target.arch);
                if c.name.contains("splits") {
                    assert!(entries.iter().any(|e| e.contains("attn_decode_combine")), "{} ({}): one split", c.name, target.arch);
                }
            }
        }
    }
}
