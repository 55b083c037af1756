//! Shape overrides at execution (the cudnn frontend's `override_uids`, `override_shapes`,
//! `override_strides`): a graph built once at a cache shape runs at other shapes, each giving
//! bit for bit what a graph built directly at that shape gives; bad overrides are refused with
//! errors that name the tensor.

use ferrodnn::graph::ops::norm::NormAttrs;
use ferrodnn::graph::ops::sdpa::{SdpaAttrs, SdpaInputs};
use ferrodnn::graph::MAX_ELEMENTS;
use ferrodnn::layout::required_bytes;
use ferrodnn::random::SplitMix64;
use ferrodnn::{DataType, Error, Graph, Handle, PlanPolicy, ShapeOverrides, TensorDesc, VariantPack};
use std::collections::HashMap;

const F: DataType = DataType::F32;

/// Buffers by uid: random inputs (those `fixed` gives are taken from it), NaN-filled outputs.
fn buffers(g: &Graph, fixed: &HashMap<i64, Vec<u8>>, seed: u64) -> HashMap<i64, Vec<u8>> {
    let mut rng = SplitMix64::new(seed);
    let produced: Vec<usize> = g.output_tensors().iter().map(|t| t.0).collect();
    let mut out = HashMap::new();
    for t in g.io_tensors() {
        let d = g.desc(t);
        let uid = d.uid.unwrap();
        let bytes = match fixed.get(&uid) {
            Some(b) => b.clone(),
            None => {
                let dt = g.resolved_data_type(t).unwrap();
                let n = required_bytes(d, dt) / dt.size();
                let v: Vec<f64> = if produced.contains(&t.0) { vec![f64::NAN; n] } else { (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect() };
                dt.encode(&v)
            }
        };
        out.insert(uid, bytes);
    }
    out
}

/// Runs `run` on a pack of `bufs` (inputs as inputs, the graph's outputs as outputs) and returns
/// the outputs' bytes.
fn run_pack(g: &Graph, mut bufs: HashMap<i64, Vec<u8>>, run: impl FnOnce(&mut VariantPack) -> ferrodnn::Result<()>) -> ferrodnn::Result<HashMap<i64, Vec<u8>>> {
    let outs: Vec<i64> = g.output_tensors().iter().map(|&t| g.uid(t).unwrap()).collect();
    let mut out_bufs: Vec<(i64, Vec<u8>)> = outs.iter().map(|u| (*u, bufs.remove(u).unwrap())).collect();
    {
        let mut pack = VariantPack::new();
        for (uid, b) in &bufs {
            pack.input(*uid, b);
        }
        for (uid, b) in &mut out_bufs {
            pack.output(*uid, b);
        }
        run(&mut pack)?;
    }
    Ok(out_bufs.into_iter().collect())
}

/// Overrides that give every tensor with a buffer of `cache` the dims and strides it has in
/// `direct` (the same graph built at another shape), or only the inputs with `inputs_only`.
fn overrides_to(direct: &Graph, inputs_only: bool) -> ShapeOverrides {
    let inputs: Vec<usize> = direct.input_tensors().iter().map(|t| t.0).collect();
    let mut o = ShapeOverrides::new();
    for t in direct.io_tensors() {
        if inputs_only && !inputs.contains(&t.0) {
            continue;
        }
        let d = direct.desc(t);
        o.set(d.uid.unwrap(), &d.dims, &d.strides);
    }
    o
}

/// Builds `build(cache)` once, then for each shape runs it with overrides and checks the outputs
/// are those of `build(shape)` built directly (on another handle, so no plan is shared).
fn check_shapes<S: Copy + std::fmt::Debug>(build: impl Fn(S) -> (Graph, HashMap<i64, Vec<u8>>), cache: S, shapes: &[S], inputs_only: bool) {
    let handle = Handle::cpu();
    let (mut g, _) = build(cache);
    g.validate().unwrap();
    let plan = handle.build_plans(&g, &PlanPolicy::default()).unwrap().remove(0);
    for (i, &s) in shapes.iter().enumerate() {
        let (mut direct, fixed) = build(s);
        direct.validate().unwrap();
        let o = overrides_to(&direct, inputs_only);
        let overridden = handle.plan_with_overrides(&plan, &o).unwrap();
        assert_eq!(overridden.graph().key(), direct.key(), "{s:?}: the overridden graph is not the graph built at that shape");
        let bufs = buffers(&direct, &fixed, 11 + i as u64);
        let got = run_pack(&direct, bufs.clone(), |p| plan.execute_with_overrides(&handle, &o, p, None)).unwrap();
        let other = Handle::cpu();
        let direct_plan = other.build_plans(&direct, &PlanPolicy::default()).unwrap().remove(0);
        let want = run_pack(&direct, bufs, |p| direct_plan.execute(p, None)).unwrap();
        for (uid, w) in &want {
            assert!(w.chunks(4).any(|c| !f32::from_le_bytes(c.try_into().unwrap()).is_nan()), "{s:?}: output uid {uid} was not written");
            assert_eq!(&got[uid], w, "{s:?}: output uid {uid} differs from the graph built at that shape");
        }
    }
}

/// `[b, m, k] x [b, k, n]` with B column-major, as the frontend's dynamic-shape sample.
fn matmul((b, m, n, k): (i64, i64, i64, i64)) -> (Graph, HashMap<i64, Vec<u8>>) {
    let mut g = Graph::new("mm").io_data_type(F);
    let a = g.tensor(TensorDesc::new("a", &[b, m, k], F).with_uid(1));
    let bt = g.tensor(TensorDesc::new("b", &[b, k, n], F).with_strides(&[n * k, 1, k]).with_uid(2));
    let c = g.matmul(a, bt);
    g.set_output(c);
    g.desc_mut(c).uid = Some(3);
    (g, HashMap::new())
}

#[test]
fn matmul_runs_at_larger_and_smaller_shapes() {
    check_shapes(matmul, (1, 16, 16, 16), &[(2, 16, 16, 16), (2, 32, 24, 40), (1, 5, 7, 3)], false);
}

#[test]
fn outputs_not_overridden_are_inferred_again() {
    check_shapes(matmul, (1, 16, 16, 16), &[(3, 9, 17, 16), (1, 4, 4, 4)], true);
}

/// relu(x * s + y): a pointwise chain with a broadcast operand.
fn pointwise((n, c): (i64, i64)) -> (Graph, HashMap<i64, Vec<u8>>) {
    let mut g = Graph::new("pw").io_data_type(F);
    let x = g.tensor(TensorDesc::new("x", &[n, c], F).with_uid(1));
    let s = g.tensor(TensorDesc::new("s", &[1, c], F).with_uid(2));
    let y = g.tensor(TensorDesc::new("y", &[n, c], F).with_strides(&[1, n]).with_uid(3));
    let t = g.mul(x, s);
    let t = g.add(t, y);
    let z = g.relu(t);
    g.set_output(z);
    g.desc_mut(z).uid = Some(4);
    (g, HashMap::new())
}

#[test]
fn pointwise_chain_runs_at_other_shapes() {
    check_shapes(pointwise, (8, 32), &[(3, 32), (64, 48), (1, 1)], false);
    check_shapes(pointwise, (8, 32), &[(5, 7)], true);
}

/// Layernorm (training: y, mean, inverse variance) over the last two dims.
fn layernorm((n, h, w): (i64, i64, i64)) -> (Graph, HashMap<i64, Vec<u8>>) {
    let mut g = Graph::new("ln").io_data_type(F);
    let x = g.tensor(TensorDesc::new("x", &[n, h, w], F).with_uid(1));
    let s = g.tensor(TensorDesc::new("s", &[1, h, w], F).with_uid(2));
    let b = g.tensor(TensorDesc::new("b", &[1, h, w], F).with_uid(3));
    let (y, mean, inv) = g.layernorm(x, s, b, NormAttrs::default());
    for (t, uid) in [(y, 4), (mean.unwrap(), 5), (inv.unwrap(), 6)] {
        g.set_output(t);
        g.desc_mut(t).uid = Some(uid);
    }
    (g, HashMap::new())
}

#[test]
fn layernorm_runs_at_other_shapes() {
    check_shapes(layernorm, (4, 8, 16), &[(7, 8, 16), (2, 3, 40)], false);
    check_shapes(layernorm, (4, 8, 16), &[(9, 2, 5)], true);
}

const H: i64 = 2;
const D: i64 = 8;

/// Attention as the frontend's THD test builds it: Q and O packed (ragged, THD), K and V
/// `[b, h, s_kv, d]` with BSHD strides, the padding mask with per-batch lengths. The lengths and
/// the offsets are fixed buffers, made from `(b, s_q, s_kv)`.
fn thd((b, s_q, s_kv): (i64, i64, i64)) -> (Graph, HashMap<i64, Vec<u8>>) {
    let bf = DataType::F32;
    let mut g = Graph::new("thd").io_data_type(bf);
    let bshd = [H * D, D, H * D, 1];
    let q = g.tensor(TensorDesc::new("q", &[b, H, s_q, D], bf).with_strides(&bshd).with_uid(1));
    let k = g.tensor(TensorDesc::new("k", &[b, H, s_kv, D], bf).with_strides(&[s_kv * H * D, D, H * D, 1]).with_uid(2));
    let v = g.tensor(TensorDesc::new("v", &[b, H, s_kv, D], bf).with_strides(&[s_kv * H * D, D, H * D, 1]).with_uid(3));
    let lq = g.tensor(TensorDesc::new("seq_len_q", &[b, 1, 1, 1], DataType::I32).with_uid(4));
    let lkv = g.tensor(TensorDesc::new("seq_len_kv", &[b, 1, 1, 1], DataType::I32).with_uid(5));
    let rq = g.tensor(TensorDesc::new("q_offsets", &[b + 1, 1, 1, 1], DataType::I64).with_uid(6));
    let ro = g.tensor(TensorDesc::new("o_offsets", &[b + 1, 1, 1, 1], DataType::I64).with_uid(7));
    g.set_ragged_offset(q, rq);
    let inputs = SdpaInputs { seq_len_q: Some(lq), seq_len_kv: Some(lkv), ..Default::default() };
    let (o, _) = g.sdpa(q, k, v, inputs, SdpaAttrs { padding_mask: true, generate_stats: false, attn_scale: Some(0.3), ..Default::default() });
    g.set_output(o);
    g.desc_mut(o).strides = bshd.to_vec();
    g.desc_mut(o).uid = Some(8);
    g.set_ragged_offset(o, ro);
    // Lengths: batch i has s_q - i query rows (at least 1) and s_kv - 2i keys (at least 1).
    let lens_q: Vec<i64> = (0..b).map(|i| (s_q - i).max(1)).collect();
    let lens_kv: Vec<i64> = (0..b).map(|i| (s_kv - 2 * i).max(1)).collect();
    let mut offs = vec![0i64];
    for l in &lens_q {
        offs.push(offs.last().unwrap() + l * H * D);
    }
    let i32s = |v: &[i64]| v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect::<Vec<u8>>();
    let i64s = |v: &[i64]| v.iter().flat_map(|&x| x.to_le_bytes()).collect::<Vec<u8>>();
    let total = *offs.last().unwrap() as usize;
    let mut rng = SplitMix64::new(b as u64 * 31 + s_q as u64);
    let q_data: Vec<f64> = (0..total).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let fixed = HashMap::from([(4, i32s(&lens_q)), (5, i32s(&lens_kv)), (6, i64s(&offs)), (7, i64s(&offs)), (1, bf.encode(&q_data)), (8, bf.encode(&vec![f64::NAN; total]))]);
    (g, fixed)
}

#[test]
fn ragged_thd_attention_runs_at_other_batch_and_sequence_lengths() {
    check_shapes(thd, (2, 6, 8), &[(2, 12, 8), (3, 4, 10), (1, 3, 5)], false);
}

/// A ragged THD tensor may be given its packed buffer's three strides ([tokens, h, d]), as the
/// frontend's test_sdpa_thd passes `q.stride()`: the batch and sequence dims take the token stride.
#[test]
fn a_ragged_tensor_takes_its_packed_buffers_three_strides() {
    let (mut g, _) = thd((2, 6, 8));
    g.validate().unwrap();
    let mut o = ShapeOverrides::new();
    o.set(1, &[3, H, 4, D], &[H * D, D, 1]).set(8, &[3, H, 4, D], &[H * D, D, 1]);
    o.set(2, &[3, H, 10, D], &[]).set(3, &[3, H, 10, D], &[]);
    o.set(4, &[3, 1, 1, 1], &[]).set(5, &[3, 1, 1, 1], &[]).set(6, &[4, 1, 1, 1], &[]).set(7, &[4, 1, 1, 1], &[]);
    let g2 = g.with_overrides(&o).unwrap();
    let q = g2.tensors.iter().find(|t| t.uid == Some(1)).unwrap();
    assert_eq!((q.dims.clone(), q.strides.clone()), (vec![3, H, 4, D], vec![H * D, D, H * D, 1]));
    // A tensor without ragged offsets still needs one stride a dim.
    let mut bad = ShapeOverrides::new();
    bad.set(2, &[2, H, 8, D], &[H * D, D, 1]);
    let m = g.with_overrides(&bad).unwrap_err().to_string();
    assert!(m.contains("3 strides") && m.contains("4 dims"), "{m}");
}

fn built_matmul() -> (Handle, ferrodnn::Plan) {
    let (mut g, _) = matmul((1, 16, 16, 16));
    g.validate().unwrap();
    let handle = Handle::cpu();
    let plan = handle.build_plans(&g, &PlanPolicy::default()).unwrap().remove(0);
    (handle, plan)
}

fn override_err(o: &ShapeOverrides) -> String {
    let (handle, plan) = built_matmul();
    let err = handle.plan_with_overrides(&plan, o).map(|_| ()).unwrap_err();
    err.to_string()
}

#[test]
fn an_unknown_uid_is_refused_naming_the_known_ones() {
    let m = override_err(ShapeOverrides::new().set(42, &[1, 16, 16], &[]));
    assert!(m.contains("uid 42") && m.contains("1 \"a\"") && m.contains("graph \"mm\""), "{m}");
}

#[test]
fn another_rank_is_refused_with_both_ranks() {
    let m = override_err(ShapeOverrides::new().set(1, &[16, 16], &[16, 1]));
    assert!(m.contains("tensor \"a\" (uid 1) has rank 3") && m.contains("[16, 16]"), "{m}");
    let m = override_err(ShapeOverrides::new().set(1, &[2, 16, 16], &[16, 1]));
    assert!(m.contains("2 strides") && m.contains("3 dims"), "{m}");
}

#[test]
fn lists_of_different_lengths_and_repeated_uids_are_refused() {
    let e = ShapeOverrides::from_lists(&[1, 2], &[vec![1, 2, 3]], &[vec![6, 3, 1], vec![1]]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("got 2, 1 and 2")), "{e}");
    let e = ShapeOverrides::from_lists(&[1, 1], &vec![vec![1, 16, 16]; 2], &vec![vec![256, 16, 1]; 2]).unwrap_err();
    assert!(e.to_string().contains("uid 1 is given twice"), "{e}");
}

#[test]
fn shapes_the_ops_cannot_take_are_refused_by_the_op() {
    // K of A no longer matches K of B.
    let m = override_err(ShapeOverrides::new().set(1, &[1, 16, 8], &[]));
    assert!(m.contains("with shape overrides") && m.contains("matmul"), "{m}");
    // An output given dims the op does not produce.
    let m = override_err(ShapeOverrides::new().set(1, &[2, 16, 16], &[]).set(2, &[2, 16, 16], &[]).set(3, &[2, 16, 8], &[]));
    assert!(m.contains("[2, 16, 8]") && m.contains("[2, 16, 16]"), "{m}");
    // Non-positive sizes, negative strides.
    let m = override_err(ShapeOverrides::new().set(1, &[1, 0, 16], &[]));
    assert!(m.contains("tensor \"a\"") && m.contains("positive"), "{m}");
    let m = override_err(ShapeOverrides::new().set(1, &[1, 16, 16], &[256, -16, 1]));
    assert!(m.contains("tensor \"a\"") && m.contains("non-negative"), "{m}");
}

#[test]
fn shapes_past_the_size_limit_are_refused() {
    let big = MAX_ELEMENTS / 4;
    let m = override_err(ShapeOverrides::new().set(1, &[8, 1, big], &[]).set(2, &[8, big, 1], &[]));
    assert!(m.contains("tensor \"a\"") && m.contains("elements is more than"), "{m}");
}

#[test]
fn empty_strides_keep_the_tensors_layout() {
    let (handle, plan) = built_matmul();
    let mut o = ShapeOverrides::new();
    o.set(1, &[2, 4, 8], &[]).set(2, &[2, 8, 6], &[]);
    let p = handle.plan_with_overrides(&plan, &o).unwrap();
    let g = p.graph();
    let t = |name: &str| g.desc(g.find(name).unwrap()).strides.clone();
    assert_eq!(t("a"), vec![32, 8, 1]);
    assert_eq!(t("b"), vec![48, 1, 8], "B stays column-major");
    assert_eq!(g.desc(g.output_tensors()[0]).dims, vec![2, 4, 6]);
}

#[test]
fn no_overrides_run_the_plan_itself_and_a_buffer_too_small_for_the_new_shape_is_refused() {
    let (handle, plan) = built_matmul();
    let o = ShapeOverrides::new();
    let p = handle.plan_with_overrides(&plan, &o).unwrap();
    assert_eq!(p.graph().key(), plan.graph().key());
    // Buffers of the built shape, overrides twice as large.
    let (g, _) = matmul((1, 16, 16, 16));
    let mut g = g;
    g.validate().unwrap();
    let bufs = buffers(&g, &HashMap::new(), 3);
    let mut o = ShapeOverrides::new();
    o.set(1, &[2, 16, 16], &[]).set(2, &[2, 16, 16], &[]);
    let err = run_pack(&g, bufs, |p| plan.execute_with_overrides(&handle, &o, p, None)).unwrap_err();
    assert!(err.to_string().contains("\"a\"") || err.to_string().contains("uid 1"), "{err}");
}
