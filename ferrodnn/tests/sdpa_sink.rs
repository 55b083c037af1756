//! The sink token and the score statistics (`score_max`, `score_sum_exp`) of sdpa, and the sink's
//! gradient of sdpa_backward: the CPU engines against a softmax over the row's logits with the
//! sink appended written here, the gradients against central finite differences of the forward
//! pass (f64 q, k, v; the f32 sink stepped by 2^-10, which f32 holds exactly), validation, JSON.

use ferrodnn::engine::PlanPolicy;
use ferrodnn::graph::ops::sdpa::{CausalAlignment, SdpaAttrs, SdpaGrads, SdpaInputs};
use ferrodnn::testing::{dot, execute_dense, numeric_gradient, random_inputs, relative_error, run_cpu};
use ferrodnn::{DataType, EngineKind, Graph, Handle, Nd, TensorDesc, TensorId};
use std::collections::HashMap;

/// One problem: sizes, masks, per-batch lengths, dropout.
#[derive(Clone)]
struct Case {
    b: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    skv: usize,
    d: usize,
    dv: usize,
    attrs: SdpaAttrs,
    lens: Option<(Vec<i64>, Vec<i64>)>,
    sink: bool,
    dtype: DataType,
}

impl Case {
    fn new(b: usize, hq: usize, hkv: usize, sq: usize, skv: usize, d: usize, dv: usize) -> Case {
        Case { b, hq, hkv, sq, skv, d, dv, attrs: SdpaAttrs::default(), lens: None, sink: true, dtype: DataType::F64 }
    }
    fn len_q(&self, b: usize) -> usize {
        self.lens.as_ref().map_or(self.sq, |l| l.0[b] as usize)
    }
    fn len_kv(&self, b: usize) -> usize {
        self.lens.as_ref().map_or(self.skv, |l| l.1[b] as usize)
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
    score_max: TensorId,
    score_sum_exp: TensorId,
    d_o: Option<TensorId>,
    grads: Option<SdpaGrads>,
}

fn dims64(d: &[usize]) -> Vec<i64> {
    d.iter().map(|&x| x as i64).collect()
}

/// The forward graph (o, stats, score_max, score_sum_exp as outputs), or forward + backward
/// (dq, dk, dv, dsink_token as outputs). Inputs come first, in one order, so that their ids
/// agree in both graphs.
fn build(c: &Case, backward: bool) -> Built {
    let inter = if c.dtype == DataType::F64 { DataType::F64 } else { DataType::F32 };
    let mut g = Graph::new("sdpa_sink_test").intermediate_data_type(inter);
    let t = |name: &str, dims: &[usize], dt: DataType| TensorDesc::new(name, &dims64(dims), dt);
    let q = g.tensor(t("q", &[c.b, c.hq, c.sq, c.d], c.dtype));
    let k = g.tensor(t("k", &[c.b, c.hkv, c.skv, c.d], c.dtype));
    let v = g.tensor(t("v", &[c.b, c.hkv, c.skv, c.dv], c.dtype));
    let mut inputs = SdpaInputs::default();
    if c.sink {
        inputs.sink_token = Some(g.tensor(t("sink", &[1, c.hq, 1, 1], DataType::F32)));
    }
    if c.lens.is_some() {
        inputs.seq_len_q = Some(g.tensor(t("seq_len_q", &[c.b, 1, 1, 1], DataType::I32)));
        inputs.seq_len_kv = Some(g.tensor(t("seq_len_kv", &[c.b, 1, 1, 1], DataType::I32)));
    }
    if c.attrs.dropout.is_some() {
        inputs.seed = Some(g.tensor(TensorDesc::scalar("seed", 77.0, DataType::I64)));
        inputs.offset = Some(g.tensor(TensorDesc::scalar("offset", 5.0, DataType::I64)));
    }
    let attrs = SdpaAttrs { generate_stats: true, score_max: true, score_sum_exp: true, ..c.attrs.clone() };
    let (o, stats) = g.sdpa(q, k, v, inputs, attrs.clone());
    let stats = stats.unwrap();
    let score_max = g.sdpa_output(o, "score_max").unwrap();
    let score_sum_exp = g.sdpa_output(o, "score_sum_exp").unwrap();
    let (mut d_o, mut grads) = (None, None);
    if backward {
        let dot_ = g.tensor(t("do", &[c.b, c.hq, c.sq, c.dv], c.dtype));
        let bwd = SdpaAttrs { score_max: false, score_sum_exp: false, ..attrs };
        let gr = g.sdpa_backward(q, k, v, o, dot_, stats, inputs, bwd);
        for id in [Some(gr.dq), Some(gr.dk), Some(gr.dv), gr.dsink_token].into_iter().flatten() {
            g.set_output(id);
        }
        d_o = Some(dot_);
        grads = Some(gr);
    } else {
        for id in [o, stats, score_max, score_sum_exp] {
            g.set_output(id);
        }
        if c.dtype == DataType::F64 {
            for id in [stats, score_max, score_sum_exp] {
                g.desc_mut(id).data_type = Some(DataType::F64);
            }
        }
    }
    Built { g, q, k, v, inputs, o, stats, score_max, score_sum_exp, d_o, grads }
}

/// Random q, k, v, do; sink logits that f32 holds exactly (multiples of 2^-8 in [-2, 2]); the
/// case's lengths.
fn make_inputs(c: &Case, bt: &Built, seed: u64) -> HashMap<TensorId, Nd> {
    let mut m = random_inputs(&bt.g, seed);
    if let Some(s) = bt.inputs.sink_token {
        let vals = (0..c.hq).map(|h| ((h * 37 + seed as usize * 11) % 1025) as f64 / 256.0 - 2.0).collect();
        m.insert(s, Nd::new(vec![1, c.hq, 1, 1], vals));
    }
    if let Some((lq, lkv)) = &c.lens {
        m.insert(bt.inputs.seq_len_q.unwrap(), Nd::new(vec![c.b, 1, 1, 1], lq.iter().map(|&x| x as f64).collect()));
        m.insert(bt.inputs.seq_len_kv.unwrap(), Nd::new(vec![c.b, 1, 1, 1], lkv.iter().map(|&x| x as f64).collect()));
    }
    m
}

/// Whether query `i` of batch `b` sees key `j` (causal masks only, here).
fn allowed(c: &Case, b: usize, i: usize, j: usize) -> bool {
    let (lq, lkv) = (c.len_q(b) as i64, c.len_kv(b) as i64);
    let (i, j) = (i as i64, j as i64);
    if i >= lq || j >= lkv {
        return false;
    }
    match c.attrs.causal {
        Some(CausalAlignment::TopLeft) => j <= i,
        Some(CausalAlignment::BottomRight) => j <= i + lkv - lq,
        None => true,
    }
}

/// The expected o, stats, score_max and score_sum_exp: each existing row's logits with the sink
/// appended as one more logit, softmaxed; the sink's probability multiplies no value.
fn expected(c: &Case, inp: &HashMap<TensorId, Nd>, bt: &Built) -> [Nd; 4] {
    let (q, k, v) = (&inp[&bt.q], &inp[&bt.k], &inp[&bt.v]);
    let sink = bt.inputs.sink_token.map(|s| &inp[&s]);
    let scale = c.attrs.attn_scale.unwrap_or(1.0 / (c.d as f64).sqrt());
    let mut o = Nd::zeros(&[c.b, c.hq, c.sq, c.dv]);
    let per_row = |x: f64| Nd::new(vec![c.b, c.hq, c.sq, 1], vec![x; c.b * c.hq * c.sq]);
    let (mut stats, mut max, mut sum) = (per_row(f64::NEG_INFINITY), per_row(f64::NEG_INFINITY), per_row(0.0));
    for b in 0..c.b {
        for h in 0..c.hq {
            let kh = h * c.hkv / c.hq;
            for i in 0..c.len_q(b) {
                let row = (b * c.hq + h) * c.sq + i;
                // (key, logit), the sink as key None.
                let mut logits: Vec<(Option<usize>, f64)> =
                    (0..c.skv).filter(|&j| allowed(c, b, i, j)).map(|j| (Some(j), scale * (0..c.d).map(|e| q.at(&[b, h, i, e]) * k.at(&[b, kh, j, e])).sum::<f64>())).collect();
                if let Some(s) = sink {
                    logits.push((None, s.at(&[0, h, 0, 0])));
                }
                if logits.is_empty() {
                    continue;
                }
                let m = logits.iter().map(|l| l.1).fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = logits.iter().map(|l| (l.1 - m).exp()).sum();
                max.data[row] = m;
                sum.data[row] = z;
                stats.data[row] = logits.iter().map(|l| l.1.exp()).sum::<f64>().ln();
                for &(j, l) in &logits {
                    let Some(j) = j else { continue };
                    for e in 0..c.dv {
                        o.data[row * c.dv + e] += (l - m).exp() / z * v.at(&[b, kh, j, e]);
                    }
                }
            }
        }
    }
    [o, stats, max, sum]
}

fn check_forward(c: &Case) -> [Nd; 4] {
    let bt = build(c, false);
    let inp = make_inputs(c, &bt, 3);
    let out = run_cpu(&bt.g, &inp).unwrap();
    let want = expected(c, &inp, &bt);
    let got = [bt.o, bt.stats, bt.score_max, bt.score_sum_exp].map(|t| out[&t].clone());
    for (name, (g, w)) in ["o", "stats", "score_max", "score_sum_exp"].iter().zip(got.iter().zip(&want)) {
        let e = relative_error(&g.data, &w.data);
        assert!(e < 1e-12, "{name}: relative error {e}\n got {:?}\nwant {:?}", g.data, w.data);
    }
    // stats = score_max + ln score_sum_exp, row by row.
    for r in 0..got[1].data.len() {
        let (st, m, z) = (got[1].data[r], got[2].data[r], got[3].data[r]);
        if st.is_finite() {
            assert!((st - (m + z.ln())).abs() < 1e-12, "row {r}: stats {st}, max {m}, sum {z}");
        }
    }
    got
}

#[test]
fn forward_with_the_sink_is_a_softmax_over_the_logits_and_the_sink() {
    check_forward(&Case::new(2, 3, 3, 5, 7, 4, 3));
    // GQA, d != d_v, a given scale.
    let mut c = Case::new(1, 6, 2, 4, 9, 5, 7);
    c.attrs.attn_scale = Some(0.9);
    check_forward(&c);
    // The score statistics without a sink.
    let mut c = Case::new(2, 2, 1, 3, 6, 4, 4);
    c.sink = false;
    check_forward(&c);
    // Causal masks, and padding with an empty batch.
    for causal in [Some(CausalAlignment::TopLeft), Some(CausalAlignment::BottomRight)] {
        let mut c = Case::new(3, 2, 2, 5, 7, 3, 4);
        c.attrs.causal = causal;
        c.attrs.padding_mask = true;
        c.lens = Some((vec![5, 3, 2], vec![7, 2, 0]));
        check_forward(&c);
    }
}

/// A row whose every key is masked still holds the sink: o = 0, stats = score_max = t_h,
/// score_sum_exp = 1; a padded row has no softmax: o = 0, stats = score_max = -inf, sum 0.
#[test]
fn empty_rows_see_the_sink_and_padded_rows_see_nothing() {
    let mut c = Case::new(2, 2, 1, 6, 3, 4, 4);
    c.attrs.causal = Some(CausalAlignment::BottomRight);
    c.attrs.padding_mask = true;
    c.lens = Some((vec![6, 4], vec![3, 3]));
    let [o, st, m, z] = check_forward(&c);
    let bt = build(&c, false);
    let inp = make_inputs(&c, &bt, 3);
    let sink = &inp[&bt.inputs.sink_token.unwrap()];
    for h in 0..2 {
        let t = sink.at(&[0, h, 0, 0]);
        // Batch 0: rows 0..3 see no key (bottom-right, 6 queries over 3 keys).
        for i in 0..3 {
            assert!((0..4).all(|e| o.at(&[0, h, i, e]) == 0.0));
            assert_eq!((st.at(&[0, h, i, 0]), m.at(&[0, h, i, 0]), z.at(&[0, h, i, 0])), (t, t, 1.0));
        }
        // Batch 1: rows 4 and 5 are padding.
        for i in 4..6 {
            assert!((0..4).all(|e| o.at(&[1, h, i, e]) == 0.0));
            assert_eq!((st.at(&[1, h, i, 0]), m.at(&[1, h, i, 0]), z.at(&[1, h, i, 0])), (f64::NEG_INFINITY, f64::NEG_INFINITY, 0.0));
        }
    }
    // Without the sink, the empty rows are empty: -inf, -inf, 0.
    c.sink = false;
    let [_, st, m, z] = check_forward(&c);
    assert_eq!((st.at(&[0, 1, 0, 0]), m.at(&[0, 1, 0, 0]), z.at(&[0, 1, 0, 0])), (f64::NEG_INFINITY, f64::NEG_INFINITY, 0.0));
}

/// A sink far below every score changes nothing; a sink far above takes the whole mass.
#[test]
fn the_sink_takes_its_share_of_the_mass() {
    let c = Case::new(1, 2, 2, 3, 4, 4, 4);
    let bt = build(&c, false);
    let mut inp = make_inputs(&c, &bt, 3);
    let sink = bt.inputs.sink_token.unwrap();
    let mut plain = c.clone();
    plain.sink = false;
    let bp = build(&plain, false);
    let mut pin = HashMap::new();
    for (a, b) in [(bt.q, bp.q), (bt.k, bp.k), (bt.v, bp.v)] {
        pin.insert(b, inp[&a].clone());
    }
    let without = run_cpu(&bp.g, &pin).unwrap();
    inp.insert(sink, Nd::new(vec![1, 2, 1, 1], vec![-1000.0, -1000.0]));
    let low = run_cpu(&bt.g, &inp).unwrap();
    assert!(relative_error(&low[&bt.o].data, &without[&bp.o].data) < 1e-14);
    assert!(relative_error(&low[&bt.stats].data, &without[&bp.stats].data) < 1e-14);
    inp.insert(sink, Nd::new(vec![1, 2, 1, 1], vec![1000.0, 1000.0]));
    let high = run_cpu(&bt.g, &inp).unwrap();
    assert!(high[&bt.o].data.iter().all(|x| x.abs() < 1e-300));
    assert!(high[&bt.stats].data.iter().all(|&x| (x - 1000.0).abs() < 1e-9));
}

/// L = sum(o * do) for the case's inputs.
fn loss(bt: &Built, inp: &HashMap<TensorId, Nd>, d_o: &Nd) -> f64 {
    dot(&run_cpu(&bt.g, inp).unwrap()[&bt.o], d_o)
}

/// dq, dk, dv and dsink of the backward against central differences of L = sum(o * do).
fn check_backward(c: &Case) {
    let fwd = build(c, false);
    let bwd = build(c, true);
    let inp = make_inputs(c, &bwd, 5);
    let d_o = inp[&bwd.d_o.unwrap()].clone();
    let grads = run_cpu(&bwd.g, &inp).unwrap();
    let g = bwd.grads.unwrap();
    let mut wrt = vec![("dq", bwd.q, g.dq, 1e-6), ("dk", bwd.k, g.dk, 1e-6), ("dv", bwd.v, g.dv, 1e-6)];
    if let (Some(s), Some(ds)) = (bwd.inputs.sink_token, g.dsink_token) {
        wrt.push(("dsink", s, ds, 1.0 / 1024.0));
    }
    for (name, x, dx, step) in wrt {
        let numeric = numeric_gradient(&inp[&x], step, |probe| {
            let mut m = inp.clone();
            m.insert(x, probe.clone());
            loss(&fwd, &m, &d_o)
        });
        let e = relative_error(&grads[&dx].data, &numeric.data);
        assert!(e < 1e-5, "{name}: relative error {e}\n got {:?}\nwant {:?}", grads[&dx].data, numeric.data);
    }
}

#[test]
fn sink_gradient_and_the_others_match_finite_differences() {
    check_backward(&Case::new(2, 3, 3, 4, 5, 3, 2));
    // GQA, a causal mask with empty rows, padding with padded rows and an empty batch.
    let mut c = Case::new(3, 4, 2, 5, 4, 3, 3);
    c.attrs.causal = Some(CausalAlignment::BottomRight);
    c.attrs.padding_mask = true;
    c.lens = Some((vec![5, 3, 2], vec![4, 2, 0]));
    check_backward(&c);
    // Dropout: the sink's share is taken before it.
    let mut c = Case::new(2, 2, 1, 4, 6, 4, 3);
    c.attrs.dropout = Some(0.25);
    c.attrs.causal = Some(CausalAlignment::TopLeft);
    check_backward(&c);
}

/// dsink by hand for one row: -exp(t - stats) (do . o) (dsink is f32, as the frontend has it).
#[test]
fn dsink_of_one_row_by_hand() {
    let c = Case::new(1, 1, 1, 1, 2, 2, 2);
    let bt = build(&c, true);
    let inp = make_inputs(&c, &bt, 9);
    let out = run_cpu(&build(&c, false).g, &inp).unwrap();
    let fwd = build(&c, false);
    let (o, st) = (&out[&fwd.o], out[&fwd.stats].data[0]);
    let d_o = &inp[&bt.d_o.unwrap()];
    let t = inp[&bt.inputs.sink_token.unwrap()].data[0];
    let want = -(t - st).exp() * dot(o, d_o);
    let got = run_cpu(&bt.g, &inp).unwrap()[&bt.grads.unwrap().dsink_token.unwrap()].data[0];
    assert!(want != 0.0 && (got - want).abs() < 1e-7 * want.abs(), "{got} vs {want}");
}

/// The fast CPU engine (f32 flash-style blocks) against the reference, sink and score
/// statistics included, past one block of query rows and keys.
#[test]
fn fast_cpu_engine_matches_the_reference() {
    for (causal, sq, skv, sink) in [(None, 300, 600, true), (Some(CausalAlignment::BottomRight), 260, 130, true), (Some(CausalAlignment::TopLeft), 70, 530, false)] {
        let mut c = Case::new(1, 4, 2, sq, skv, 16, 8);
        c.dtype = DataType::F32;
        c.attrs.causal = causal;
        c.sink = sink;
        let bt = build(&c, false);
        let mut g = bt.g.clone();
        g.validate().unwrap();
        let inp = make_inputs(&c, &bt, 7);
        let fast = execute_dense(&Handle::cpu(), &g, &inp, &PlanPolicy { engine: Some(EngineKind::Cpu), ..Default::default() }).unwrap();
        let plan = Handle::cpu().build_plans(&g, &PlanPolicy { engine: Some(EngineKind::Cpu), ..Default::default() }).unwrap().remove(0);
        let text = plan.explain().unwrap_or_default();
        assert!(text.contains("-> attention"), "{text}");
        let reference = run_cpu(&g, &inp).unwrap();
        for (name, t) in [("o", bt.o), ("stats", bt.stats), ("score_max", bt.score_max), ("score_sum_exp", bt.score_sum_exp)] {
            let e = relative_error(&fast[&t].data, &reference[&t].data);
            assert!(e < 2e-5, "{name} (causal {causal:?}, sink {sink}): relative error {e}");
        }
    }
}

/// The sink and the statistics outputs through JSON and back: the same graph, still valid.
#[test]
fn json_round_trip() {
    let mut c = Case::new(2, 2, 1, 3, 4, 8, 8);
    c.attrs.causal = Some(CausalAlignment::TopLeft);
    let mut g = build(&c, true).g;
    g.validate().unwrap();
    let text = g.to_json().unwrap();
    assert!(text.contains("sink_token") && text.contains("dsink_token") && text.contains("score_sum_exp"), "{text}");
    let mut back = Graph::from_json(&text).unwrap();
    assert_eq!(back, g);
    back.validate().unwrap();
    // Without them the attributes stay out of the text (older readers see nothing new).
    let mut plain = Graph::new("plain").io_data_type(DataType::F32);
    let q = plain.tensor(TensorDesc::new("q", &[1, 1, 2, 8], DataType::F32));
    let (o, _) = plain.sdpa(q, q, q, SdpaInputs::default(), SdpaAttrs::default());
    plain.set_output(o);
    let text = plain.to_json().unwrap();
    assert!(!text.contains("score_max") && !text.contains("sink"), "{text}");
}

mod errors {
    use super::*;

    fn graph(sink_dims: &[i64], sink_dt: DataType) -> (Graph, TensorId, TensorId, TensorId, SdpaInputs) {
        let mut g = Graph::new("sink_errors").io_data_type(DataType::F16);
        let q = g.tensor(TensorDesc::new("q", &[2, 4, 3, 8], DataType::F16));
        let k = g.tensor(TensorDesc::new("k", &[2, 2, 5, 8], DataType::F16));
        let v = g.tensor(TensorDesc::new("v", &[2, 2, 5, 8], DataType::F16));
        let sink = g.tensor(TensorDesc::new("the_sink", sink_dims, sink_dt));
        (g, q, k, v, SdpaInputs { sink_token: Some(sink), ..Default::default() })
    }

    fn forward_error(sink_dims: &[i64], sink_dt: DataType) -> String {
        let (mut g, q, k, v, inputs) = graph(sink_dims, sink_dt);
        let (o, _) = g.sdpa(q, k, v, inputs, SdpaAttrs::default());
        g.set_output(o);
        g.validate().unwrap_err().to_string()
    }

    #[test]
    fn a_sink_of_other_dims_is_refused() {
        for dims in [vec![1, 2, 1, 1], vec![4], vec![2, 4, 1, 1], vec![1, 4, 3, 1]] {
            let e = forward_error(&dims, DataType::F32);
            assert!(e.contains("sdpa") && e.contains("sink_token") && e.contains("the_sink") && e.contains("[1, 4, 1, 1]") && e.contains(&format!("{dims:?}")), "{e}");
        }
    }

    #[test]
    fn a_sink_not_in_f32_is_refused() {
        for dt in [DataType::F16, DataType::Bf16, DataType::I32] {
            let e = forward_error(&[1, 4, 1, 1], dt);
            assert!(e.contains("sdpa") && e.contains("the_sink") && e.contains("f32") && e.contains(&dt.to_string()), "{e}");
        }
    }

    #[test]
    fn statistics_outputs_must_be_floating_point() {
        let (mut g, q, k, v, inputs) = graph(&[1, 4, 1, 1], DataType::F32);
        let (o, _) = g.sdpa(q, k, v, inputs, SdpaAttrs { score_max: true, ..Default::default() });
        g.set_output(o);
        let m = g.sdpa_output(o, "score_max").unwrap();
        g.set_output(m);
        g.desc_mut(m).data_type = Some(DataType::I32);
        let e = g.validate().unwrap_err().to_string();
        assert!(e.contains("sdpa") && e.contains("score_max") && e.contains("floating point") && e.contains("i32"), "{e}");
    }

    #[test]
    fn the_backward_refuses_statistics_outputs_and_a_dsink_without_a_sink() {
        let (mut g, q, k, v, inputs) = graph(&[1, 4, 1, 1], DataType::F32);
        let (o, stats) = g.sdpa(q, k, v, inputs, SdpaAttrs { generate_stats: true, ..Default::default() });
        let d_o = g.tensor(TensorDesc::new("do", &[2, 4, 3, 8], DataType::F16));
        let mut g2 = g.clone();
        g2.sdpa_backward(q, k, v, o, d_o, stats.unwrap(), inputs, SdpaAttrs { score_sum_exp: true, ..Default::default() });
        let e = g2.validate().unwrap_err().to_string();
        assert!(e.contains("sdpa_backward") && e.contains("score_sum_exp") && e.contains("forward"), "{e}");
        // A dsink_token output with no sink input (as a JSON graph may say).
        let grads = g.sdpa_backward(q, k, v, o, d_o, stats.unwrap(), inputs, SdpaAttrs::default());
        let ds = grads.dsink_token.unwrap();
        g.set_output(ds);
        let last = g.nodes.len() - 1;
        g.nodes[last].inputs.retain(|p| p.name != "sink_token");
        let e = g.validate().unwrap_err().to_string();
        assert!(e.contains("sdpa_backward") && e.contains("dsink_token") && e.contains("sink_token"), "{e}");
    }

    #[test]
    fn a_statistics_output_the_attributes_do_not_ask_for_is_refused() {
        let (mut g, q, k, v, inputs) = graph(&[1, 4, 1, 1], DataType::F32);
        let (o, _) = g.sdpa(q, k, v, inputs, SdpaAttrs { score_max: true, ..Default::default() });
        g.set_output(o);
        let ni = g.nodes.len() - 1;
        if let ferrodnn::graph::ops::Op::Sdpa(a) = &mut g.nodes[ni].op {
            a.score_max = false;
        }
        let e = g.validate().unwrap_err().to_string();
        assert!(e.contains("sdpa") && e.contains("score_max") && e.contains("connected"), "{e}");
    }

    /// Ragged statistics need the padding mask, as stats does.
    #[test]
    fn ragged_statistics_need_the_padding_mask() {
        let (mut g, q, k, v, inputs) = graph(&[1, 4, 1, 1], DataType::F32);
        let (o, _) = g.sdpa(q, k, v, inputs, SdpaAttrs { score_sum_exp: true, ..Default::default() });
        g.set_output(o);
        let z = g.sdpa_output(o, "score_sum_exp").unwrap();
        g.set_output(z);
        let offsets = g.tensor(TensorDesc::new("z_offsets", &[3, 1, 1, 1], DataType::I64));
        g.set_ragged_offset(z, offsets);
        let e = g.validate().unwrap_err().to_string();
        assert!(e.contains("sdpa") && e.contains("score_sum_exp") && e.contains("padding mask"), "{e}");
    }
}
