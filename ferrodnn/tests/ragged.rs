//! Ragged (packed, THD) attention tensors on the CPU engines: each batch's rows at its own
//! offsets, nothing read or written past its length, the same results as each sequence run
//! alone; and the errors for ragged tensors where they cannot be.

use ferrodnn::graph::ops::pointwise::PointwiseMode;
use ferrodnn::graph::ops::sdpa::{CausalAlignment, SdpaAttrs, SdpaInputs};
use ferrodnn::random::SplitMix64;
use ferrodnn::testing::{relative_error, run_cpu};
use ferrodnn::{DataType, Graph, Handle, Nd, PlanPolicy, TensorDesc, TensorId, VariantPack};
use std::collections::HashMap;

const B: usize = 3;
const HQ: usize = 4;
const HKV: usize = 2;
const D: usize = 8;
const SQ: usize = 7;
const SKV: usize = 9;
const LQ: [usize; B] = [5, 0, 7];
const LKV: [usize; B] = [9, 4, 6];
/// Rows of gap after each batch (never written, never read).
const GAP: usize = 2;

fn attrs() -> SdpaAttrs {
    SdpaAttrs { causal: Some(CausalAlignment::BottomRight), padding_mask: true, generate_stats: true, ..Default::default() }
}

/// Where each batch starts in a packed buffer of rows of `row` elements, and the buffer's size.
fn packing(lens: &[usize], row: usize) -> (Vec<i64>, usize) {
    let mut at = 0;
    let mut starts = Vec::new();
    for &l in lens {
        starts.push((at * row) as i64);
        at += l + GAP;
    }
    starts.push((at * row) as i64);
    (starts, at * row)
}

/// A ragged `[B, h, s, w]` tensor in the THD layout (strides `[s*h*w, w, h*w, 1]`).
fn thd(g: &mut Graph, name: &str, h: usize, s: usize, w: usize, dt: DataType) -> TensorId {
    g.tensor(TensorDesc::new(name, &[B as i64, h as i64, s as i64, w as i64], dt).with_layout(&[0, 2, 1, 3]))
}

struct Ragged {
    g: Graph,
    /// (tensor, heads, rows per batch, width) of every ragged tensor, by name.
    tensors: Vec<(&'static str, TensorId, usize, &'static [usize; B], usize)>,
    offsets: Vec<(TensorId, Vec<i64>)>,
    lq: TensorId,
    lkv: TensorId,
}

/// Forward and backward over ragged q, k, v, o, stats, do, dq, dk, dv.
fn ragged_graph() -> Ragged {
    let f = DataType::F32;
    let mut g = Graph::new("ragged").io_data_type(f);
    let q = thd(&mut g, "q", HQ, SQ, D, f);
    let k = thd(&mut g, "k", HKV, SKV, D, f);
    let v = thd(&mut g, "v", HKV, SKV, D, f);
    let lq = g.tensor(TensorDesc::new("seq_len_q", &[B as i64, 1, 1, 1], DataType::I32));
    let lkv = g.tensor(TensorDesc::new("seq_len_kv", &[B as i64, 1, 1, 1], DataType::I32));
    let inputs = SdpaInputs { seq_len_q: Some(lq), seq_len_kv: Some(lkv), ..Default::default() };
    let (o, stats) = g.sdpa(q, k, v, inputs, attrs());
    let stats = stats.unwrap();
    g.desc_mut(stats).strides = ferrodnn::graph::strides_for_order(&[B as i64, HQ as i64, SQ as i64, 1], &[0, 2, 1, 3]);
    let d_o = thd(&mut g, "do", HQ, SQ, D, f);
    let grads = g.sdpa_backward(q, k, v, o, d_o, stats, inputs, attrs());
    let tensors: Vec<(&'static str, TensorId, usize, &'static [usize; B], usize)> = vec![
        ("q", q, HQ, &LQ, D),
        ("k", k, HKV, &LKV, D),
        ("v", v, HKV, &LKV, D),
        ("o", o, HQ, &LQ, D),
        ("stats", stats, HQ, &LQ, 1),
        ("do", d_o, HQ, &LQ, D),
        ("dq", grads.dq, HQ, &LQ, D),
        ("dk", grads.dk, HKV, &LKV, D),
        ("dv", grads.dv, HKV, &LKV, D),
    ];
    let mut offsets = Vec::new();
    for &(name, t, h, lens, w) in &tensors {
        g.set_output(t);
        let r = g.tensor(TensorDesc::new(format!("{name}_offsets"), &[B as i64 + 1, 1, 1, 1], DataType::I64));
        g.set_ragged_offset(t, r);
        offsets.push((r, packing(lens, h * w).0));
    }
    g.validate().unwrap();
    Ragged { g, tensors, offsets, lq, lkv }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// The rows of batch `b` of a packed buffer as a dense `[1, h, len, w]` array.
fn batch_rows(data: &[f32], lens: &[usize; B], b: usize, h: usize, w: usize) -> Nd {
    let (starts, _) = packing(lens, h * w);
    let len = lens[b];
    let mut out = Vec::new();
    for hh in 0..h {
        for i in 0..len {
            for c in 0..w {
                out.push(data[starts[b] as usize + i * h * w + hh * w + c] as f64);
            }
        }
    }
    Nd::new(vec![1, h, len, w], out)
}

/// Runs the ragged graph on `handle` over packed buffers (outputs filled with NaN) and checks,
/// batch by batch, that it matches the same attention on that sequence alone.
fn check_on(handle: &Handle) {
    let r = ragged_graph();
    let mut rng = SplitMix64::new(7);
    let mut buffers: HashMap<&str, Vec<f32>> = HashMap::new();
    for &(name, _, h, lens, w) in &r.tensors {
        let size = packing(lens, h * w).1;
        let v = if ["q", "k", "v", "do"].contains(&name) { (0..size).map(|_| rng.uniform(-1.0, 1.0) as f32).collect() } else { vec![f32::NAN; size] };
        buffers.insert(name, v);
    }
    let plan = handle.build_plans(&r.g, &PlanPolicy::default()).unwrap().remove(0);
    let lens_bytes = |l: &[usize; B]| l.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect::<Vec<u8>>();
    let (lq, lkv) = (lens_bytes(&LQ), lens_bytes(&LKV));
    let offs: Vec<(i64, Vec<u8>)> = r.offsets.iter().map(|(t, o)| (r.g.uid(*t).unwrap(), o.iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
    let mut bytes: Vec<(&str, i64, Vec<u8>)> = r.tensors.iter().map(|&(name, t, ..)| (name, r.g.uid(t).unwrap(), f32_bytes(&buffers[name]))).collect();
    {
        let mut pack = VariantPack::new();
        pack.input(r.g.uid(r.lq).unwrap(), &lq).input(r.g.uid(r.lkv).unwrap(), &lkv);
        for (uid, b) in &offs {
            pack.input(*uid, b);
        }
        for (name, uid, b) in &mut bytes {
            if ["q", "k", "v", "do"].contains(name) {
                pack.input(*uid, b);
            } else {
                pack.output(*uid, b);
            }
        }
        let mut ws = vec![0u8; plan.workspace_size()];
        plan.execute(&mut pack, (!ws.is_empty()).then(|| ferrodnn::engine::Buffer::HostMut(&mut ws))).unwrap();
    }
    for (name, _, b) in &bytes {
        buffers.insert(name, from_bytes(b));
    }
    // Every row a batch has is written; the gaps after each batch are not.
    for &(name, _, h, lens, w) in &r.tensors {
        let (starts, _) = packing(lens, h * w);
        let data = &buffers[name];
        for b in 0..B {
            let (s, end) = (starts[b] as usize, starts[b] as usize + lens[b] * h * w);
            // (A row that sees no key has stats -inf: NaN, the poison, is what was not written.)
            assert!(data[s..end].iter().all(|x| !x.is_nan()), "{name}: batch {b} has elements not written");
            assert!(data[end..starts[b + 1] as usize].iter().all(|x| x.is_nan() || ["q", "k", "v", "do"].contains(&name)), "{name}: the gap after batch {b} was written");
        }
    }
    // Each sequence alone: a dense one-batch graph without padding.
    for b in 0..B {
        if LQ[b] == 0 {
            continue;
        }
        let f = DataType::F32;
        let mut g = Graph::new("alone").io_data_type(f);
        let dims = |h: usize, s: usize, w: usize| [1, h as i64, s as i64, w as i64];
        let q = g.tensor(TensorDesc::new("q", &dims(HQ, LQ[b], D), f));
        let k = g.tensor(TensorDesc::new("k", &dims(HKV, LKV[b], D), f));
        let v = g.tensor(TensorDesc::new("v", &dims(HKV, LKV[b], D), f));
        let d_o = g.tensor(TensorDesc::new("do", &dims(HQ, LQ[b], D), f));
        let a = SdpaAttrs { padding_mask: false, ..attrs() };
        let (o, stats) = g.sdpa(q, k, v, SdpaInputs::default(), a.clone());
        let stats = stats.unwrap();
        let grads = g.sdpa_backward(q, k, v, o, d_o, stats, SdpaInputs::default(), a);
        let outs = [("o", o), ("stats", stats), ("dq", grads.dq), ("dk", grads.dk), ("dv", grads.dv)];
        for (_, t) in outs {
            g.set_output(t);
        }
        let mut inputs = HashMap::new();
        for (name, t, h, lens) in [("q", q, HQ, &LQ), ("k", k, HKV, &LKV), ("v", v, HKV, &LKV), ("do", d_o, HQ, &LQ)] {
            inputs.insert(t, batch_rows(&buffers[name], lens, b, h, D));
        }
        let want = run_cpu(&g, &inputs).unwrap();
        for (name, t) in outs {
            let &(_, _, h, lens, w) = r.tensors.iter().find(|x| x.0 == name).unwrap();
            let got = batch_rows(&buffers[name], lens, b, h, w);
            let err = relative_error(&got.data, &want[&t].data);
            assert!(err < 1e-6, "{name}, batch {b}: relative error {err} against the sequence alone");
        }
    }
}

#[test]
fn ragged_attention_matches_each_sequence_alone_on_the_reference() {
    check_on(&Handle::reference());
}

#[test]
fn ragged_attention_matches_each_sequence_alone_on_the_fast_cpu_engine() {
    check_on(&Handle::cpu());
}

#[test]
fn ragged_graphs_survive_json() {
    let r = ragged_graph();
    let text = r.g.to_json().unwrap();
    let mut back = Graph::from_json(&text).unwrap();
    back.validate().unwrap();
    assert_eq!(back.key(), r.g.key());
    assert!(back.tensors.iter().filter(|t| t.ragged_offset.is_some()).count() == 9);
}

fn expect_err(g: &mut Graph, needles: &[&str]) {
    let e = g.validate().expect_err("validation should fail").to_string();
    for n in needles {
        assert!(e.contains(n), "error {e:?} does not mention {n:?}");
    }
}

#[test]
fn ragged_tensors_where_they_cannot_be_are_refused() {
    let f = DataType::F32;
    // On an op that takes none.
    let mut g = Graph::new("relu").io_data_type(f);
    let x = g.tensor(TensorDesc::new("x", &[3, 4], f));
    let off = g.tensor(TensorDesc::new("x_offsets", &[4], DataType::I64));
    g.set_ragged_offset(x, off);
    let y = g.pointwise(PointwiseMode::Relu { lower_clip: None, upper_clip: None, negative_slope: None }, &[x]);
    g.set_output(y);
    expect_err(&mut g, &["relu", "\"x\"", "x_offsets", "only the attention ops"]);

    // Without the padding mask, with offsets of the wrong size, and virtual.
    let build = |padding: bool, offsets: i64, virtual_o: bool| {
        let mut g = Graph::new("sdpa").io_data_type(f);
        let q = thd(&mut g, "q", 2, 5, 8, f);
        let k = thd(&mut g, "k", 2, 5, 8, f);
        let v = thd(&mut g, "v", 2, 5, 8, f);
        let mut inputs = SdpaInputs::default();
        if padding {
            inputs.seq_len_q = Some(g.tensor(TensorDesc::new("lq", &[B as i64, 1, 1, 1], DataType::I32)));
            inputs.seq_len_kv = Some(g.tensor(TensorDesc::new("lkv", &[B as i64, 1, 1, 1], DataType::I32)));
        }
        let (o, _) = g.sdpa(q, k, v, inputs, SdpaAttrs { padding_mask: padding, ..Default::default() });
        if !virtual_o {
            g.set_output(o);
        } else {
            let y = g.pointwise(PointwiseMode::Relu { lower_clip: None, upper_clip: None, negative_slope: None }, &[o]);
            g.set_output(y);
        }
        let r = g.tensor(TensorDesc::new("q_offsets", &[offsets, 1, 1, 1], DataType::I64));
        g.set_ragged_offset(q, r);
        let ro = g.tensor(TensorDesc::new("o_offsets", &[B as i64 + 1], DataType::I64));
        g.set_ragged_offset(o, ro);
        g
    };
    expect_err(&mut build(false, B as i64 + 1, false), &["`q`", "\"q\"", "padding mask"]);
    expect_err(&mut build(true, B as i64, false), &["q_offsets", "b + 1 = 4", "[3, 1, 1, 1]"]);
    let mut g = build(true, B as i64 + 1, true);
    let e = g.validate().expect_err("a ragged o read by relu").to_string();
    assert!(e.contains("`o`") || e.contains("only the attention ops"), "{e}");
    build(true, B as i64 + 1, false).validate().unwrap();
}

#[test]
fn offsets_past_the_buffer_are_an_error_not_a_crash() {
    let r = ragged_graph();
    let handle = Handle::reference();
    let plan = handle.build_plans(&r.g, &PlanPolicy::default()).unwrap().remove(0);
    let lens: Vec<u8> = LQ.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect();
    let lens_kv: Vec<u8> = LKV.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect();
    let mut bufs: Vec<(i64, Vec<u8>, bool)> = Vec::new();
    for (i, (t, o)) in r.offsets.iter().enumerate() {
        // q's offsets point far past its buffer.
        let o: Vec<i64> = if i == 0 { o.iter().map(|x| x + 1_000_000).collect() } else { o.clone() };
        bufs.push((r.g.uid(*t).unwrap(), o.iter().flat_map(|x| x.to_le_bytes()).collect(), false));
    }
    for &(name, t, h, lens, w) in &r.tensors {
        bufs.push((r.g.uid(t).unwrap(), vec![0u8; packing(lens, h * w).1 * 4], !["q", "k", "v", "do"].contains(&name)));
    }
    let mut pack = VariantPack::new();
    pack.input(r.g.uid(r.lq).unwrap(), &lens).input(r.g.uid(r.lkv).unwrap(), &lens_kv);
    for (uid, b, out) in &mut bufs {
        if *out {
            pack.output(*uid, b);
        } else {
            pack.input(*uid, b);
        }
    }
    let e = plan.execute(&mut pack, None).expect_err("offsets past the buffer").to_string();
    assert!(e.contains("`q`") && e.contains("\"q\"") && e.contains("outside its buffer"), "{e}");
}

#[test]
fn the_ragged_check_cases_run_through_the_check_helpers() {
    use ferrodnn::engine::EngineKind;
    use ferrodnn::testing::{cases, check::check_against_reference};
    let policy = PlanPolicy { engine: Some(EngineKind::Cpu), ..Default::default() };
    let mut n = 0;
    for case in cases::all().into_iter().filter(|c| c.name.contains("ragged")) {
        let mut g = case.graph.clone();
        g.validate().unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert!(g.tensors.iter().any(|t| t.ragged_offset.is_some()), "{}: no ragged tensor", case.name);
        let outs = check_against_reference(&Handle::cpu(), &g, &policy, 3).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert!(!outs.is_empty(), "{}: nothing compared", case.name);
        n += 1;
    }
    assert!(n >= 6, "only {n} ragged check cases");
}

/// THD tensors as the frontend's samples describe them, with the batch stride equal to the row
/// stride (`[h*d, d, h*d, 1]`: the offsets say where batches start): valid, and the same results
/// as with a whole batch stride.
#[test]
fn thd_strides_with_the_row_stride_for_the_batch_are_valid() {
    let f = DataType::F32;
    let run = |batch_stride_is_row: bool| {
        let mut g = Graph::new("thd").io_data_type(f);
        let mk = |g: &mut Graph, name: &str, h: usize, s: usize| {
            let row = (h * D) as i64;
            let b0 = if batch_stride_is_row { row } else { s as i64 * row };
            g.tensor(TensorDesc::new(name, &[B as i64, h as i64, s as i64, D as i64], f).with_strides(&[b0, D as i64, row, 1]))
        };
        let (q, k, v) = (mk(&mut g, "q", HQ, SQ), mk(&mut g, "k", HKV, SKV), mk(&mut g, "v", HKV, SKV));
        let lq = g.tensor(TensorDesc::new("lq", &[B as i64, 1, 1, 1], DataType::I32));
        let lkv = g.tensor(TensorDesc::new("lkv", &[B as i64, 1, 1, 1], DataType::I32));
        let inputs = SdpaInputs { seq_len_q: Some(lq), seq_len_kv: Some(lkv), ..Default::default() };
        let (o, _) = g.sdpa(q, k, v, inputs, SdpaAttrs { generate_stats: false, ..attrs() });
        g.set_output(o);
        let row = (HQ * D) as i64;
        g.desc_mut(o).strides = vec![if batch_stride_is_row { row } else { SQ as i64 * row }, D as i64, row, 1];
        let mut offs = Vec::new();
        for (t, lens, h) in [(q, &LQ, HQ), (k, &LKV, HKV), (v, &LKV, HKV), (o, &LQ, HQ)] {
            let r = g.tensor(TensorDesc::new("offsets", &[B as i64 + 1], DataType::I64));
            g.set_ragged_offset(t, r);
            offs.push((r, packing(lens, h * D).0));
        }
        g.validate().unwrap_or_else(|e| panic!("{e}"));
        let plan = Handle::reference().build_plans(&g, &PlanPolicy::default()).unwrap().remove(0);
        let mut rng = SplitMix64::new(11);
        let data = |n: usize, rng: &mut SplitMix64| f32_bytes(&(0..n).map(|_| rng.uniform(-1.0, 1.0) as f32).collect::<Vec<_>>());
        let (qb, kb, vb) = (data(packing(&LQ, HQ * D).1, &mut rng), data(packing(&LKV, HKV * D).1, &mut rng), data(packing(&LKV, HKV * D).1, &mut rng));
        let mut ob = f32_bytes(&vec![f32::NAN; packing(&LQ, HQ * D).1]);
        let lens = |l: &[usize; B]| l.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect::<Vec<u8>>();
        let (lqb, lkvb) = (lens(&LQ), lens(&LKV));
        let ob_offs: Vec<(i64, Vec<u8>)> = offs.iter().map(|(t, o)| (g.uid(*t).unwrap(), o.iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
        let mut pack = VariantPack::new();
        pack.input(g.uid(q).unwrap(), &qb).input(g.uid(k).unwrap(), &kb).input(g.uid(v).unwrap(), &vb);
        pack.input(g.uid(lq).unwrap(), &lqb).input(g.uid(lkv).unwrap(), &lkvb);
        for (uid, b) in &ob_offs {
            pack.input(*uid, b);
        }
        pack.output(g.uid(o).unwrap(), &mut ob);
        plan.execute(&mut pack, None).unwrap();
        from_bytes(&ob)
    };
    let (a, b) = (run(true), run(false));
    assert!(a.iter().zip(&b).all(|(x, y)| x == y || (x.is_nan() && y.is_nan())));
    assert!(a.iter().any(|x| x.is_finite()));
}
