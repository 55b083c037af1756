//! sdpa and sdpa_backward on the CPU engine, against a plain softmax(Q K^T * scale + mask) V
//! written here, and against central finite differences of the forward pass in f64.

use ferrodnn::engine::cpu::philox4x32;
use ferrodnn::graph::ops::sdpa::{CausalAlignment, SdpaAttrs, SdpaGrads, SdpaInputs};
use ferrodnn::graph::ops::Op;
use ferrodnn::graph::strides_for_order;
use ferrodnn::testing::{dot, numeric_gradient, random_inputs, relative_error, run_cpu, tolerance};
use ferrodnn::{DataType, Error, Graph, Nd, TensorDesc, TensorId};
use std::collections::HashMap;

/// One attention problem: sizes, attributes and the optional features.
#[derive(Clone)]
struct Case {
    b: usize,
    hq: usize,
    hkv: usize,
    /// V's heads (K has `hkv`).
    hv: usize,
    sq: usize,
    skv: usize,
    d: usize,
    dv: usize,
    attrs: SdpaAttrs,
    bias: Option<[usize; 4]>,
    lens: Option<(Vec<i64>, Vec<i64>)>,
    /// (seed, offset) for dropout.
    seed: (i64, i64),
    dtype: DataType,
    /// Stride order of q, k, v, do (and so of o, dq, dk, dv).
    order: [usize; 4],
    /// Paged K/V with this block size (skv must be a multiple).
    block: Option<usize>,
}

impl Case {
    fn new(b: usize, hq: usize, hkv: usize, sq: usize, skv: usize, d: usize, dv: usize) -> Case {
        Case { b, hq, hkv, hv: hkv, sq, skv, d, dv, attrs: SdpaAttrs::default(), bias: None, lens: None, seed: (1234, 56), dtype: DataType::F64, order: [0, 1, 2, 3], block: None }
    }
    fn pages(&self) -> usize {
        self.skv / self.block.unwrap_or(self.skv)
    }
    /// Pool blocks: every page of every batch gets its own block, in reverse order, and block 0
    /// is a spare nobody reads.
    fn num_blocks(&self) -> usize {
        self.b * self.pages() + 1
    }
    fn block_of(&self, b: usize, p: usize) -> usize {
        self.num_blocks() - 1 - (b * self.pages() + p)
    }
    fn len_kv(&self, b: usize) -> usize {
        self.lens.as_ref().map_or(self.skv, |l| l.1[b] as usize)
    }
    fn len_q(&self, b: usize) -> usize {
        self.lens.as_ref().map_or(self.sq, |l| l.0[b] as usize)
    }
}

struct Built {
    g: Graph,
    q: TensorId,
    k: TensorId,
    v: TensorId,
    inputs: SdpaInputs,
    o: TensorId,
    stats: TensorId,
    d_o: Option<TensorId>,
    grads: Option<SdpaGrads>,
}

fn dims64(d: &[usize]) -> Vec<i64> {
    d.iter().map(|&x| x as i64).collect()
}

/// The forward graph (o and stats as outputs), or forward + backward (dq, dk, dv, dbias as
/// outputs). Input tensors come first, in the same order, so their ids agree in both graphs.
fn build(c: &Case, backward: bool) -> Built {
    let inter = if c.dtype == DataType::F64 { DataType::F64 } else { DataType::F32 };
    let mut g = Graph::new("sdpa_test").intermediate_data_type(inter);
    let t = |name: &str, dims: &[usize], dt: DataType| TensorDesc::new(name, &dims64(dims), dt);
    let (kdims, vdims) = match c.block {
        Some(bs) => ([c.num_blocks(), c.hkv, bs, c.d], [c.num_blocks(), c.hv, bs, c.dv]),
        None => ([c.b, c.hkv, c.skv, c.d], [c.b, c.hv, c.skv, c.dv]),
    };
    let q = g.tensor(t("q", &[c.b, c.hq, c.sq, c.d], c.dtype).with_layout(&c.order));
    let k = g.tensor(t("k", &kdims, c.dtype).with_layout(&c.order));
    let v = g.tensor(t("v", &vdims, c.dtype).with_layout(&c.order));
    let mut inputs = SdpaInputs::default();
    if let Some(bd) = c.bias {
        inputs.bias = Some(g.tensor(t("bias", &bd, c.dtype)));
    }
    if c.lens.is_some() {
        inputs.seq_len_q = Some(g.tensor(t("seq_len_q", &[c.b, 1, 1, 1], DataType::I32)));
        inputs.seq_len_kv = Some(g.tensor(t("seq_len_kv", &[c.b, 1, 1, 1], DataType::I32)));
    }
    if c.attrs.dropout.is_some() {
        inputs.seed = Some(g.tensor(t("seed", &[1], DataType::I64)));
        inputs.offset = Some(g.tensor(t("offset", &[1], DataType::I64)));
    }
    if c.block.is_some() {
        inputs.page_table_k = Some(g.tensor(t("page_table_k", &[c.b, 1, c.pages(), 1], DataType::I32)));
        inputs.page_table_v = Some(g.tensor(t("page_table_v", &[c.b, 1, c.pages(), 1], DataType::I32)));
    }
    let attrs = SdpaAttrs { generate_stats: true, ..c.attrs.clone() };
    let (o, stats) = g.sdpa(q, k, v, inputs, attrs.clone());
    let stats = stats.unwrap();
    let (mut d_o, mut grads) = (None, None);
    if backward {
        let dot_ = g.tensor(t("do", &[c.b, c.hq, c.sq, c.dv], c.dtype).with_layout(&c.order));
        let gr = g.sdpa_backward(q, k, v, o, dot_, stats, inputs, attrs);
        for id in [gr.dq, gr.dk, gr.dv].into_iter().chain(gr.dbias) {
            g.set_output(id);
        }
        d_o = Some(dot_);
        grads = Some(gr);
    } else {
        g.set_output(o);
        g.set_output(stats);
        if c.dtype == DataType::F64 {
            g.desc_mut(stats).data_type = Some(DataType::F64);
        }
    }
    Built { g, q, k, v, inputs, o, stats, d_o, grads }
}

/// Random q, k, v, bias, do; the case's lengths, seed/offset and page tables (pages past a
/// batch's length hold -1: they must never be read).
fn make_inputs(c: &Case, bt: &Built, seed: u64) -> HashMap<TensorId, Nd> {
    let mut m = random_inputs(&bt.g, seed);
    if let Some((lq, lkv)) = &c.lens {
        m.insert(bt.inputs.seq_len_q.unwrap(), Nd::new(vec![c.b, 1, 1, 1], lq.iter().map(|&x| x as f64).collect()));
        m.insert(bt.inputs.seq_len_kv.unwrap(), Nd::new(vec![c.b, 1, 1, 1], lkv.iter().map(|&x| x as f64).collect()));
    }
    if let (Some(s), Some(o)) = (bt.inputs.seed, bt.inputs.offset) {
        m.insert(s, Nd::new(vec![1], vec![c.seed.0 as f64]));
        m.insert(o, Nd::new(vec![1], vec![c.seed.1 as f64]));
    }
    if let Some(bs) = c.block {
        let mut table = Vec::new();
        for b in 0..c.b {
            for p in 0..c.pages() {
                table.push(if p * bs < c.len_kv(b) { c.block_of(b, p) as f64 } else { -1.0 });
            }
        }
        let nd = Nd::new(vec![c.b, 1, c.pages(), 1], table);
        m.insert(bt.inputs.page_table_k.unwrap(), nd.clone());
        m.insert(bt.inputs.page_table_v.unwrap(), nd);
    }
    m
}

/// The logical `[b, heads, s_kv, dim]` K or V of a case, read from the pool when paged.
fn logical(c: &Case, x: &Nd) -> Nd {
    let Some(bs) = c.block else { return x.clone() };
    let (heads, dim) = (x.dims[1], x.dims[3]);
    let mut out = Nd::zeros(&[c.b, heads, c.skv, dim]);
    for b in 0..c.b {
        for h in 0..heads {
            for t in 0..c.len_kv(b) {
                for e in 0..dim {
                    out.data[((b * heads + h) * c.skv + t) * dim + e] = x.at(&[c.block_of(b, t / bs), h, t % bs, e]);
                }
            }
        }
    }
    out
}

/// ALiBi slope of head `h` of `heads`: 2^(-8 (h+1) / heads) for a power of two; the table of
/// Press et al. (written out by hand) for 6 heads.
fn alibi_slope(h: usize, heads: usize) -> f64 {
    if heads.is_power_of_two() {
        2f64.powf(-8.0 * (h as f64 + 1.0) / heads as f64)
    } else {
        assert_eq!(heads, 6);
        [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125][h]
    }
}

/// Whether query `i` of batch `b` may attend to key `j`, spelled out from the spec.
fn allowed(c: &Case, b: usize, i: usize, j: usize) -> bool {
    let (lq, lkv) = (c.len_q(b) as i64, c.len_kv(b) as i64);
    let (i, j) = (i as i64, j as i64);
    if i >= lq || j >= lkv {
        return false;
    }
    // The diagonal: causal's alignment, else the band's.
    let shift = if c.attrs.causal.or(c.attrs.diagonal_alignment) == Some(CausalAlignment::BottomRight) { lkv - lq } else { 0 };
    let causal_ok = c.attrs.causal.is_none() || j <= i + shift;
    let left_ok = c.attrs.sliding_window_left.filter(|&w| i + shift - j > w).is_none();
    let right_ok = c.attrs.sliding_window_right.filter(|&w| j - (i + shift) > w).is_none();
    causal_ok && left_ok && right_ok
}

/// Dropout keep decision for score element (b, h, i, j), from philox4x32 directly.
fn dropout_keeps(c: &Case, b: usize, h: usize, i: usize, j: usize) -> bool {
    let p = c.attrs.dropout.unwrap_or(0.0);
    let n = (((b * c.hq + h) * c.sq + i) * c.skv + j) as u64;
    let (seed, offset) = (c.seed.0 as u64, c.seed.1 as u64);
    let w = philox4x32([(n / 4) as u32, ((n / 4) >> 32) as u32, offset as u32, (offset >> 32) as u32], [seed as u32, (seed >> 32) as u32]);
    (w[(n % 4) as usize] as f64 + 0.5) / 4294967296.0 >= p
}

/// softmax(Q K^T * scale + bias + alibi, masked) (dropout) V, and the log-sum-exp, in f64.
/// Empty rows give o = 0 and stats = -inf.
fn reference(c: &Case, inp: &HashMap<TensorId, Nd>, bt: &Built) -> (Nd, Nd) {
    let q = &inp[&bt.q];
    let k = logical(c, &inp[&bt.k]);
    let v = logical(c, &inp[&bt.v]);
    let bias = bt.inputs.bias.map(|id| &inp[&id]);
    let scale = c.attrs.attn_scale.unwrap_or(1.0 / (c.d as f64).sqrt());
    let p = c.attrs.dropout.unwrap_or(0.0);
    let mut o = Nd::zeros(&[c.b, c.hq, c.sq, c.dv]);
    let mut stats = Nd::zeros(&[c.b, c.hq, c.sq, 1]);
    for b in 0..c.b {
        for h in 0..c.hq {
            let kh = h * c.hkv / c.hq;
            let vh = h * c.hv / c.hq;
            for i in 0..c.sq {
                let mut scores: Vec<(usize, f64)> = Vec::new();
                for j in 0..c.skv {
                    if !allowed(c, b, i, j) {
                        continue;
                    }
                    let mut s = 0.0;
                    for e in 0..c.d {
                        s += q.at(&[b, h, i, e]) * k.at(&[b, kh, j, e]);
                    }
                    s *= scale;
                    if let Some(bias) = bias {
                        let bd = &bias.dims;
                        let pick = |x: usize, a: usize| if bd[a] == 1 { 0 } else { x };
                        s += bias.at(&[pick(b, 0), pick(h, 1), pick(i, 2), pick(j, 3)]);
                    }
                    if c.attrs.alibi {
                        s += alibi_slope(h, c.hq) * (j as f64 - i as f64);
                    }
                    scores.push((j, s));
                }
                let row = (b * c.hq + h) * c.sq + i;
                if scores.is_empty() {
                    stats.data[row] = f64::NEG_INFINITY;
                    continue;
                }
                let total: f64 = scores.iter().map(|&(_, s)| s.exp()).sum();
                stats.data[row] = total.ln();
                for &(j, s) in &scores {
                    let keep = if dropout_keeps(c, b, h, i, j) { 1.0 / (1.0 - p) } else { 0.0 };
                    for e in 0..c.dv {
                        o.data[row * c.dv + e] += s.exp() / total * keep * v.at(&[b, vh, j, e]);
                    }
                }
            }
        }
    }
    (o, stats)
}

/// Run the forward pass and compare o and stats with the reference.
fn check_forward(c: &Case) -> (Nd, Nd) {
    let bt = build(c, false);
    let inp = make_inputs(c, &bt, 42);
    let out = run_cpu(&bt.g, &inp).unwrap();
    let (o_ref, st_ref) = reference(c, &inp, &bt);
    let (o, st) = (out[&bt.o].clone(), out[&bt.stats].clone());
    let tol = tolerance(c.dtype).max(1e-12);
    assert!(relative_error(&o.data, &o_ref.data) < tol, "o: rel error {} (tol {tol})", relative_error(&o.data, &o_ref.data));
    let st_tol = if c.dtype == DataType::F64 { 1e-12 } else { 1e-6 };
    assert!(relative_error(&st.data, &st_ref.data) < st_tol, "stats: rel error {}", relative_error(&st.data, &st_ref.data));
    (o, st)
}

#[test]
fn plain_attention_and_a_hand_worked_case() {
    let mut c = Case::new(2, 3, 3, 5, 7, 4, 3);
    c.attrs.attn_scale = Some(0.7);
    check_forward(&c);
    check_forward(&Case::new(1, 2, 2, 13, 3, 5, 6));
    // One query, two keys: o = (e^{s0} v0 + e^{s1} v1) / (e^{s0} + e^{s1}), s = q.k / sqrt(2).
    let c = Case::new(1, 1, 1, 1, 2, 2, 1);
    let bt = build(&c, false);
    let mut inp = HashMap::new();
    inp.insert(bt.q, Nd::new(vec![1, 1, 1, 2], vec![1.0, 2.0]));
    inp.insert(bt.k, Nd::new(vec![1, 1, 2, 2], vec![0.5, -1.0, 2.0, 1.0]));
    inp.insert(bt.v, Nd::new(vec![1, 1, 2, 1], vec![3.0, -5.0]));
    let out = run_cpu(&bt.g, &inp).unwrap();
    let (s0, s1) = (-1.5 / 2f64.sqrt(), 4.0 / 2f64.sqrt());
    let want = (s0.exp() * 3.0 - s1.exp() * 5.0) / (s0.exp() + s1.exp());
    assert!((out[&bt.o].data[0] - want).abs() < 1e-14);
    assert!((out[&bt.stats].data[0] - (s0.exp() + s1.exp()).ln()).abs() < 1e-14);
}

#[test]
fn causal_both_alignments() {
    for align in [CausalAlignment::TopLeft, CausalAlignment::BottomRight] {
        for (sq, skv) in [(5, 7), (7, 5)] {
            let mut c = Case::new(2, 2, 2, sq, skv, 3, 4);
            c.attrs.causal = Some(align);
            let (o, st) = check_forward(&c);
            let bt = build(&c, false);
            let inp = make_inputs(&c, &bt, 42);
            let v = &inp[&bt.v];
            match align {
                // Top-left: row 0 sees key 0 only, so o = v_0 exactly.
                CausalAlignment::TopLeft => {
                    for e in 0..c.dv {
                        assert!((o.at(&[1, 1, 0, e]) - v.at(&[1, 1, 0, e])).abs() < 1e-14);
                    }
                }
                // Bottom-right with s_q > s_kv: the first s_q - s_kv rows see nothing.
                CausalAlignment::BottomRight if sq > skv => {
                    for i in 0..sq - skv {
                        assert!((0..c.dv).all(|e| o.at(&[0, 1, i, e]) == 0.0));
                        assert_eq!(st.at(&[0, 1, i, 0]), f64::NEG_INFINITY);
                    }
                    // Row s_q - s_kv sees key 0 only.
                    assert!((o.at(&[0, 0, sq - skv, 0]) - v.at(&[0, 0, 0, 0])).abs() < 1e-14);
                }
                _ => {}
            }
        }
    }
}

#[test]
fn sliding_window() {
    for (causal, left, right) in
        [(Some(CausalAlignment::TopLeft), Some(2), None), (None, Some(1), Some(2)), (Some(CausalAlignment::BottomRight), Some(1), None), (None, None, Some(0))]
    {
        let mut c = Case::new(1, 2, 1, 6, 9, 3, 3);
        c.attrs.causal = causal;
        c.attrs.sliding_window_left = left;
        c.attrs.sliding_window_right = right;
        check_forward(&c);
    }
}

#[test]
fn padding_mask() {
    for causal in [None, Some(CausalAlignment::BottomRight), Some(CausalAlignment::TopLeft)] {
        let mut c = Case::new(3, 2, 2, 5, 7, 4, 3);
        c.attrs.padding_mask = true;
        c.attrs.causal = causal;
        c.lens = Some((vec![5, 3, 2], vec![7, 4, 0]));
        let (o, st) = check_forward(&c);
        // Padded rows (i >= seq_len_q) and batch 2 (no keys): o = 0, stats = -inf.
        for i in 3..5 {
            assert!((0..3).all(|e| o.at(&[1, 0, i, e]) == 0.0));
            assert_eq!(st.at(&[1, 1, i, 0]), f64::NEG_INFINITY);
        }
        assert!(o.data[2 * 2 * 5 * 3..].iter().all(|&x| x == 0.0));
    }
}

#[test]
fn bias_full_and_broadcast() {
    for bd in [[2, 3, 4, 5], [1, 3, 4, 5], [2, 1, 1, 5], [1, 1, 4, 1]] {
        let mut c = Case::new(2, 3, 3, 4, 5, 3, 2);
        c.bias = Some(bd);
        c.attrs.causal = Some(CausalAlignment::BottomRight);
        check_forward(&c);
    }
}

#[test]
fn alibi_power_of_two_and_six_heads() {
    for heads in [4, 6] {
        let mut c = Case::new(1, heads, 2, 5, 6, 3, 3);
        c.attrs.alibi = true;
        c.attrs.causal = Some(CausalAlignment::TopLeft);
        check_forward(&c);
    }
}

#[test]
fn grouped_and_multi_query() {
    check_forward(&Case::new(2, 6, 2, 3, 5, 4, 4));
    check_forward(&Case::new(1, 4, 1, 5, 3, 2, 5));
}

/// K and V with different head counts (query head h reads K head h / (h_q / h_k) and V head
/// h / (h_q / h_v)), also paged, and their gradients.
#[test]
fn k_and_v_with_different_head_counts() {
    for (hk, hv) in [(2, 3), (3, 1), (6, 2)] {
        let mut c = Case::new(2, 6, hk, 3, 5, 4, 5);
        c.hv = hv;
        check_forward(&c);
        c.attrs.causal = Some(CausalAlignment::BottomRight);
        c.block = Some(5);
        check_forward(&c);
    }
    let mut c = Case::new(1, 4, 2, 3, 4, 2, 3);
    c.hv = 1;
    check_backward(&c);
    c.hkv = 1;
    c.hv = 4;
    c.attrs.dropout = Some(0.3);
    check_backward(&c);
}

/// The band's bounds on the bottom-right diagonal without the causal mask: a positive right
/// bound lets each query see keys past its diagonal.
#[test]
fn band_on_the_bottom_right_diagonal() {
    let mut c = Case::new(2, 2, 1, 5, 9, 3, 2);
    c.attrs.diagonal_alignment = Some(CausalAlignment::BottomRight);
    c.attrs.sliding_window_left = Some(2);
    c.attrs.sliding_window_right = Some(1);
    let (o, _) = check_forward(&c);
    // Not the top-left band.
    let mut tl = c.clone();
    tl.attrs.diagonal_alignment = None;
    let (o_tl, _) = check_forward(&tl);
    assert!(relative_error(&o.data, &o_tl.data) > 1e-3);
    c.attrs.sliding_window_left = None;
    c.attrs.padding_mask = true;
    c.lens = Some((vec![5, 2], vec![9, 4]));
    check_forward(&c);
    c.attrs.sliding_window_right = Some(2);
    c.attrs.sliding_window_left = Some(1);
    check_backward(&c);
}

/// `rng_dump` gets the dropout mask: 1 where philox keeps the element, 0 where it drops it,
/// for every element of [b, h_q, s_q, s_kv] (masked ones too); o is unchanged by asking.
#[test]
fn rng_dump_is_the_dropout_mask() {
    let mut c = Case::new(2, 2, 1, 3, 6, 3, 2);
    c.attrs.dropout = Some(0.35);
    c.attrs.causal = Some(CausalAlignment::TopLeft);
    let (o_plain, _) = check_forward(&c);
    c.attrs.rng_dump = true;
    let mut bt = build(&c, false);
    let dump = bt.g.sdpa_rng_dump(bt.o).expect("rng_dump output");
    bt.g.set_output(dump);
    bt.g.validate().unwrap();
    assert_eq!(bt.g.desc(dump).dims, vec![2, 2, 3, 6]);
    assert_eq!(bt.g.resolved_data_type(dump), Some(DataType::F32));
    let inp = make_inputs(&c, &bt, 42);
    let out = run_cpu(&bt.g, &inp).unwrap();
    assert_eq!(out[&bt.o].data, o_plain.data);
    let mask = &out[&dump];
    let mut dropped = 0;
    for b in 0..2 {
        for h in 0..2 {
            for i in 0..3 {
                for j in 0..6 {
                    let want = if dropout_keeps(&c, b, h, i, j) { 1.0 } else { 0.0 };
                    assert_eq!(mask.at(&[b, h, i, j]), want, "mask at {:?}", [b, h, i, j]);
                    dropped += (want == 0.0) as usize;
                }
            }
        }
    }
    assert!(dropped > 0 && dropped < 72, "{dropped} of 72 dropped");
}

#[test]
fn paged_kv_matches_unpaged() {
    for lens in [None, Some((vec![4, 1], vec![9, 5]))] {
        let mut c = Case::new(2, 4, 2, 4, 9, 3, 2);
        c.attrs.causal = Some(CausalAlignment::BottomRight);
        c.attrs.padding_mask = lens.is_some();
        c.lens = lens;
        c.block = Some(3);
        let (o_paged, st_paged) = check_forward(&c);
        // The same K/V, gathered from the pool, through an unpaged graph.
        let bt = build(&c, false);
        let inp = make_inputs(&c, &bt, 42);
        let mut u = c.clone();
        u.block = None;
        let ut = build(&u, false);
        let mut uin = make_inputs(&u, &ut, 42);
        uin.insert(ut.q, inp[&bt.q].clone());
        uin.insert(ut.k, logical(&c, &inp[&bt.k]));
        uin.insert(ut.v, logical(&c, &inp[&bt.v]));
        let out = run_cpu(&ut.g, &uin).unwrap();
        assert!(relative_error(&out[&ut.o].data, &o_paged.data) < 1e-14);
        assert!(relative_error(&out[&ut.stats].data, &st_paged.data) < 1e-14);
    }
}

#[test]
fn bshd_strides() {
    let mut c = Case::new(2, 3, 3, 5, 4, 3, 3);
    c.order = [0, 2, 1, 3];
    c.attrs.causal = Some(CausalAlignment::TopLeft);
    check_forward(&c);
    let mut bt = build(&c, false);
    bt.g.validate().unwrap();
    assert_eq!(bt.g.desc(bt.q).strides, vec![45, 3, 9, 1]);
    assert_eq!(bt.g.desc(bt.o).strides, strides_for_order(&[2, 3, 5, 3], &[0, 2, 1, 3]));
    // GQA with BSHD K/V of another head count.
    let mut c = Case::new(1, 4, 2, 3, 7, 5, 2);
    c.order = [0, 2, 1, 3];
    check_forward(&c);
}

#[test]
fn decode_single_query() {
    let mut c = Case::new(3, 4, 2, 1, 9, 4, 4);
    c.attrs.causal = Some(CausalAlignment::BottomRight);
    c.attrs.padding_mask = true;
    c.lens = Some((vec![1, 1, 1], vec![9, 4, 6]));
    c.block = Some(3);
    check_forward(&c);
    let mut c = Case::new(2, 2, 2, 1, 5, 3, 3);
    c.attrs.causal = Some(CausalAlignment::BottomRight);
    check_forward(&c);
}

#[test]
fn half_precision_inputs() {
    for dt in [DataType::F16, DataType::Bf16, DataType::F32] {
        let mut c = Case::new(2, 4, 2, 5, 6, 8, 8);
        c.dtype = dt;
        c.attrs.causal = Some(CausalAlignment::TopLeft);
        c.bias = Some([1, 4, 5, 6]);
        check_forward(&c);
        // o takes q's type; stats stays f32.
        let mut bt = build(&c, false);
        bt.g.validate().unwrap();
        assert_eq!(bt.g.resolved_data_type(bt.o), Some(dt));
        assert_eq!(bt.g.resolved_data_type(bt.stats), Some(DataType::F32));
    }
}

#[test]
fn dropout_matches_philox_mask_and_is_reproducible() {
    let mut c = Case::new(2, 2, 1, 3, 5, 3, 4);
    c.attrs.dropout = Some(0.4);
    c.attrs.causal = Some(CausalAlignment::TopLeft);
    c.seed = ((1 << 35) + 17, 3);
    let (o1, st1) = check_forward(&c);
    let (o2, _) = check_forward(&c);
    assert_eq!(o1.data, o2.data);
    // Stats are taken before dropout: the same as without it.
    let mut nd = c.clone();
    nd.attrs.dropout = None;
    let (o_nd, st_nd) = check_forward(&nd);
    assert!(relative_error(&st1.data, &st_nd.data) < 1e-14);
    assert!(relative_error(&o1.data, &o_nd.data) > 1e-3);
    // Another offset gives another mask.
    let mut c2 = c.clone();
    c2.seed.1 = 4;
    let (o3, _) = check_forward(&c2);
    assert!(relative_error(&o3.data, &o1.data) > 1e-3);
    // Enough score elements (1536) that a mask off by even a sliver of probability shows.
    let mut big = Case::new(1, 2, 2, 12, 64, 2, 3);
    big.attrs.dropout = Some(0.25);
    big.seed = (9, (1 << 40) + 1);
    check_forward(&big);
}

/// dq, dk, dv (and dbias) of the backward op against central differences of
/// sum(o * do) through the forward op, in f64.
fn check_backward(c: &Case) {
    let fwd = build(c, false);
    let bwd = build(c, true);
    let inp = make_inputs(c, &bwd, 7);
    let out = run_cpu(&bwd.g, &inp).unwrap();
    let d_o = bwd.d_o.unwrap();
    let gr = bwd.grads.unwrap();
    let loss = |m: &HashMap<TensorId, Nd>| dot(&run_cpu(&fwd.g, m).unwrap()[&fwd.o], &m[&d_o]);
    let mut pairs = vec![("dq", bwd.q, gr.dq), ("dk", bwd.k, gr.dk), ("dv", bwd.v, gr.dv)];
    if let (Some(b), Some(db)) = (bwd.inputs.bias, gr.dbias) {
        pairs.push(("dbias", b, db));
    }
    for (name, x, dx) in pairs {
        let num = numeric_gradient(&inp[&x], 1e-6, |probe| {
            let mut m = inp.clone();
            m.insert(x, probe.clone());
            loss(&m)
        });
        let got = &out[&dx];
        assert_eq!(got.dims, num.dims);
        let err = relative_error(&got.data, &num.data);
        assert!(err < 1e-6, "{name}: rel error {err}");
        assert!(num.data.iter().any(|&g| g.abs() > 1e-3), "{name}: gradient is trivially zero");
    }
}

#[test]
fn backward_plain_and_causal_gqa() {
    check_backward(&Case::new(1, 2, 2, 3, 4, 3, 2));
    let mut c = Case::new(2, 4, 2, 3, 5, 2, 3);
    c.attrs.causal = Some(CausalAlignment::BottomRight);
    c.order = [0, 2, 1, 3];
    check_backward(&c);
}

#[test]
fn backward_with_bias_and_alibi() {
    let mut c = Case::new(2, 2, 1, 3, 4, 2, 2);
    c.bias = Some([1, 2, 3, 4]);
    c.attrs.alibi = true;
    c.attrs.attn_scale = Some(0.9);
    check_backward(&c);
    let mut c = Case::new(2, 3, 3, 2, 3, 2, 2);
    c.bias = Some([2, 1, 1, 3]);
    c.attrs.causal = Some(CausalAlignment::TopLeft);
    check_backward(&c);
}

#[test]
fn backward_with_dropout() {
    let mut c = Case::new(1, 2, 1, 3, 4, 2, 3);
    c.attrs.dropout = Some(0.3);
    c.bias = Some([1, 2, 3, 4]);
    check_backward(&c);
}

#[test]
fn backward_with_padding_window_and_pages() {
    let mut c = Case::new(2, 2, 1, 3, 4, 2, 2);
    c.attrs.padding_mask = true;
    c.attrs.sliding_window_left = Some(1);
    c.attrs.causal = Some(CausalAlignment::BottomRight);
    c.lens = Some((vec![3, 2], vec![4, 3]));
    check_backward(&c);
    // dk / dv with respect to the block pools.
    c.block = Some(2);
    check_backward(&c);
}

// ---- bad graphs --------------------------------------------------------------------------

fn expect_invalid(c: &Case, edit: impl FnOnce(&mut Built), needle: &str) {
    let mut bt = build(c, true);
    edit(&mut bt);
    match bt.g.validate() {
        Err(Error::InvalidGraph(msg)) => assert!(msg.contains(needle), "message {msg:?} lacks {needle:?}"),
        other => panic!("expected InvalidGraph containing {needle:?}, got {other:?}"),
    }
}

#[test]
fn bad_graphs_are_rejected() {
    let c = Case::new(2, 4, 2, 3, 5, 4, 3);
    build(&c, true).g.validate().unwrap();
    expect_invalid(&c, |bt| *bt.g.desc_mut(bt.q) = TensorDesc::new("q", &[2, 4, 12], DataType::F64), "input `q` (tensor \"q\") must have rank 4");
    expect_invalid(&c, |bt| *bt.g.desc_mut(bt.k) = TensorDesc::new("k", &[2, 2, 5, 6], DataType::F64), "q has head dim 4 but k has 6");
    expect_invalid(&c, |bt| *bt.g.desc_mut(bt.k) = TensorDesc::new("k", &[2, 3, 5, 4], DataType::F64), "q has 4 heads, which is not a multiple of the 3 heads of k");
    let mut c3 = c.clone();
    c3.hkv = 3;
    c3.hv = 3;
    expect_invalid(&c3, |_| {}, "q has 4 heads, which is not a multiple of the 3 heads of k");
    c3.hkv = 2;
    expect_invalid(&c3, |_| {}, "q has 4 heads, which is not a multiple of the 3 heads of v (v [2, 3, 5, 3])");
    let mut ca = c.clone();
    ca.attrs.causal = Some(CausalAlignment::TopLeft);
    ca.attrs.diagonal_alignment = Some(CausalAlignment::BottomRight);
    expect_invalid(&ca, |_| {}, "the causal mask's alignment TopLeft and diagonal_alignment BottomRight differ");
    // rng_dump: forward only, with dropout, floating point.
    let fwd_dump = |c: &Case| {
        let mut bt = build(c, false);
        let Op::Sdpa(a) = &mut bt.g.nodes[0].op else { unreachable!() };
        a.rng_dump = true;
        bt
    };
    let mut bt = fwd_dump(&c);
    let node = bt.g.nodes[0].clone();
    let dump = bt.g.tensor(TensorDesc::new("mask", &[2, 4, 3, 5], DataType::F32));
    bt.g.nodes[0].outputs.push(ferrodnn::graph::Port { name: "rng_dump".into(), tensor: dump });
    match bt.g.validate() {
        Err(Error::InvalidGraph(msg)) => assert!(msg.contains("sdpa \"") && msg.contains("rng_dump (the dropout mask) needs dropout"), "{msg}"),
        other => panic!("expected rng_dump without dropout to be refused, got {other:?}"),
    }
    bt.g.nodes[0] = node;
    match bt.g.validate() {
        Err(Error::InvalidGraph(msg)) => assert!(msg.contains("output `rng_dump` is not connected but rng_dump is true"), "{msg}"),
        other => panic!("expected a missing rng_dump port to be refused, got {other:?}"),
    }
    let mut cd = c.clone();
    cd.attrs.dropout = Some(0.2);
    cd.attrs.rng_dump = true;
    let mut bt = build(&cd, false);
    let dump = bt.g.sdpa_rng_dump(bt.o).unwrap();
    bt.g.set_output(dump);
    bt.g.desc_mut(dump).data_type = Some(DataType::I32);
    match bt.g.validate() {
        Err(Error::InvalidGraph(msg)) => assert!(msg.contains("output `rng_dump` must be floating point"), "{msg}"),
        other => panic!("expected an integer rng_dump to be refused, got {other:?}"),
    }
    cd.attrs.rng_dump = false;
    let mut bt = build(&cd, true);
    let Op::SdpaBackward(a) = &mut bt.g.nodes[1].op else { unreachable!() };
    a.rng_dump = true;
    match bt.g.validate() {
        Err(Error::InvalidGraph(msg)) => assert!(msg.contains("sdpa_backward") && msg.contains("is an output of the forward pass"), "{msg}"),
        other => panic!("expected rng_dump on the backward pass to be refused, got {other:?}"),
    }
    expect_invalid(&c, |bt| *bt.g.desc_mut(bt.v) = TensorDesc::new("v", &[3, 2, 5, 3], DataType::F64), "q has batch 2 but v has batch 3");
    expect_invalid(&c, |bt| *bt.g.desc_mut(bt.v) = TensorDesc::new("v", &[2, 2, 6, 3], DataType::F64), "v has 6 keys (s_kv) but k has 5");
    expect_invalid(&c, |bt| bt.g.desc_mut(bt.q).data_type = Some(DataType::I32), "must be floating point");
    expect_invalid(&c, |bt| bt.g.desc_mut(bt.v).data_type = Some(DataType::F32), "q, k and v must share one type");
    let mut cb = c.clone();
    cb.bias = Some([2, 4, 3, 5]);
    expect_invalid(&cb, |bt| *bt.g.desc_mut(bt.inputs.bias.unwrap()) = TensorDesc::new("bias", &[2, 4, 3, 4], DataType::F64), "bias dims [2, 4, 3, 4] do not broadcast");
    let mut cd = c.clone();
    cd.attrs.dropout = Some(0.2);
    expect_invalid(&cd, |bt| bt.g.nodes[0].inputs.retain(|p| p.name != "seed"), "dropout 0.2 needs both `seed` and `offset` inputs");
    cd.attrs.dropout = Some(1.0);
    expect_invalid(&cd, |_| {}, "dropout probability must be in [0, 1), got 1");
    cd.attrs.dropout = Some(0.1);
    expect_invalid(&cd, |bt| bt.g.desc_mut(bt.inputs.seed.unwrap()).data_type = Some(DataType::F32), "input `seed` (tensor \"seed\") must be an integer tensor");
    let mut cp = c.clone();
    cp.attrs.padding_mask = true;
    cp.lens = Some((vec![3, 3], vec![5, 5]));
    expect_invalid(&cp, |bt| bt.g.nodes[0].inputs.retain(|p| p.name != "seq_len_kv"), "padding_mask needs the per-batch lengths, but input `seq_len_kv` is not connected");
    expect_invalid(&cp, |bt| *bt.g.desc_mut(bt.inputs.seq_len_q.unwrap()) = TensorDesc::new("seq_len_q", &[2, 1, 1, 2], DataType::I32), "input `seq_len_q` must be [b, 1, 1, 1]");
    let mut cw = c.clone();
    cw.attrs.sliding_window_left = Some(-1);
    expect_invalid(&cw, |_| {}, "sliding_window_left must be non-negative, got -1");
    let mut cg = c.clone();
    cg.block = Some(5);
    expect_invalid(&cg, |bt| bt.g.nodes[0].inputs.retain(|p| p.name != "page_table_v"), "paged tables inconsistent: page_table_k and page_table_v must be given together");
    expect_invalid(
        &cg,
        |bt| *bt.g.desc_mut(bt.inputs.page_table_v.unwrap()) = TensorDesc::new("page_table_v", &[2, 1, 2, 1], DataType::I32),
        "paged tables inconsistent: K covers 5 keys",
    );
    expect_invalid(&c, |bt| *bt.g.desc_mut(bt.d_o.unwrap()) = TensorDesc::new("do", &[2, 4, 3, 4], DataType::F64), "input `do` must have the output's dims");
    let mut cs = c.clone();
    cs.attrs.attn_scale = Some(f64::NAN);
    expect_invalid(&cs, |_| {}, "attn_scale must be finite");
}

#[test]
fn bad_runtime_values_are_errors_not_panics() {
    let mut c = Case::new(2, 2, 2, 3, 4, 2, 2);
    c.attrs.padding_mask = true;
    c.lens = Some((vec![3, 3], vec![4, 4]));
    c.block = Some(2);
    let bt = build(&c, false);
    let mut inp = make_inputs(&c, &bt, 1);
    inp.insert(bt.inputs.page_table_k.unwrap(), Nd::new(vec![2, 1, 2, 1], vec![0.0, 1.0, 2.0, 9.0]));
    match run_cpu(&bt.g, &inp) {
        Err(Error::InvalidGraph(msg)) => assert!(msg.contains("page_table_k[1, 0, 1, 0] = 9 is not a block of the pool"), "{msg}"),
        other => panic!("expected an error, got {other:?}"),
    }
    let mut inp = make_inputs(&c, &bt, 1);
    inp.insert(bt.inputs.seq_len_kv.unwrap(), Nd::new(vec![2, 1, 1, 1], vec![4.0, 5.0]));
    match run_cpu(&bt.g, &inp) {
        Err(Error::InvalidGraph(msg)) => assert!(msg.contains("seq_len_kv[1] = 5 is outside [0, 4]"), "{msg}"),
        other => panic!("expected an error, got {other:?}"),
    }
}

/// Every sdpa check case (the GPU check's, which compares the CUDA engine with this reference)
/// runs on the CPU reference: K and V of different head counts (either more), bands, the
/// dropout mask, shared-memory inputs; no output holds a NaN.
#[test]
fn every_sdpa_check_case_runs_on_the_cpu_reference() {
    let cases: Vec<_> = ferrodnn::testing::cases::all().into_iter().filter(|c| c.name.starts_with("sdpa_")).collect();
    assert!(cases.len() >= 40, "{} cases", cases.len());
    for c in &cases {
        let inputs = random_inputs(&c.graph, 7);
        let out = run_cpu(&c.graph, &inputs).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert!(!out.is_empty(), "{}", c.name);
        for (t, x) in &out {
            assert!(x.data.iter().all(|v| !v.is_nan()), "{}: output {} holds a NaN", c.name, c.graph.desc(*t).name);
        }
    }
}
