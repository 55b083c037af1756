//! matmul on the CPU engine, checked against a naive triple loop written here (with its own
//! batch broadcasting), hand-worked products, every dtype family and strided inputs.

use ferrodnn::layout::for_each_index;
use ferrodnn::testing::{random_inputs, relative_error, run_cpu, tolerance};
use ferrodnn::{DataType, Error, Graph, Nd, TensorDesc, TensorId};
use std::collections::HashMap;

/// c[batch..., i, j] = sum_k a[batch_a..., i, k] * b[batch_b..., k, j], each input's batch
/// index taken from the output's, right-aligned, with size-1 dims pinned to 0.
fn reference_matmul(a: &Nd, b: &Nd) -> Nd {
    let (ra, rb) = (a.dims.len(), b.dims.len());
    let (m, k, n) = (a.dims[ra - 2], a.dims[ra - 1], b.dims[rb - 1]);
    let batch_rank = (ra - 2).max(rb - 2);
    let mut batch = vec![1usize; batch_rank];
    for (src, r) in [(&a.dims, ra - 2), (&b.dims, rb - 2)] {
        for d in 0..r {
            let slot = &mut batch[batch_rank - r + d];
            *slot = (*slot).max(src[d]);
        }
    }
    let mut dims = batch.clone();
    dims.extend([m, n]);
    let mut c = Nd::zeros(&dims);
    let pick = |own: &[usize], idx: &[usize]| -> Vec<usize> {
        let off = idx.len() - own.len();
        own.iter().enumerate().map(|(d, &s)| if s == 1 { 0 } else { idx[off + d] }).collect()
    };
    for_each_index(&dims.clone(), |flat, ci| {
        let bi = &ci[..batch_rank];
        let (i, j) = (ci[batch_rank], ci[batch_rank + 1]);
        let mut ai = pick(&a.dims[..ra - 2], bi);
        let mut bj = pick(&b.dims[..rb - 2], bi);
        ai.extend([i, 0]);
        bj.extend([0, j]);
        let mut acc = 0.0;
        for kk in 0..k {
            ai[ra - 1] = kk;
            bj[rb - 2] = kk;
            acc += a.at(&ai) * b.at(&bj);
        }
        c.data[flat] = acc;
    });
    c
}

struct Mm {
    g: Graph,
    a: TensorId,
    b: TensorId,
    c: TensorId,
}

fn mm_graph(a: TensorDesc, b: TensorDesc) -> Mm {
    let mut g = Graph::new("mm");
    let a = g.tensor(a);
    let b = g.tensor(b);
    let c = g.matmul(a, b);
    g.set_output(c);
    Mm { g, a, b, c }
}

/// Run on random inputs, compare with the reference (rounded to c's type) within the type's
/// tolerance; returns the validated graph and c's values.
fn check(mm: &Mm, seed: u64) -> (Graph, Nd) {
    let mut g = mm.g.clone();
    g.validate().unwrap_or_else(|e| panic!("validate: {e}"));
    let inputs = random_inputs(&g, seed);
    let got = run_cpu(&g, &inputs).unwrap_or_else(|e| panic!("run: {e}"))[&mm.c].clone();
    let want = reference_matmul(&inputs[&mm.a], &inputs[&mm.b]);
    let dt = g.resolved_data_type(mm.c).unwrap();
    assert_eq!(got.dims, want.dims);
    let rounded: Vec<f64> = want.data.iter().map(|&v| dt.quantize(v)).collect();
    let err = relative_error(&got.data, &rounded);
    assert!(err <= tolerance(dt).max(1e-13), "{dt}: relative error {err} (a {:?}, b {:?})", g.desc(mm.a).dims, g.desc(mm.b).dims);
    assert!(got.data.iter().any(|&v| v != 0.0));
    (g, got)
}

fn t(name: &str, dims: &[i64], dt: DataType) -> TensorDesc {
    TensorDesc::new(name, dims, dt)
}

#[test]
fn hand_worked_product() {
    // [1 2 3; 4 5 6] x [7 8; 9 10; 11 12] = [58 64; 139 154].
    let mm = mm_graph(t("a", &[2, 3], DataType::F64), t("b", &[3, 2], DataType::F64));
    let inputs = HashMap::from([(mm.a, Nd::new(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])), (mm.b, Nd::new(vec![3, 2], vec![7.0, 8.0, 9.0, 10.0, 11.0, 12.0]))]);
    let c = &run_cpu(&mm.g, &inputs).unwrap()[&mm.c];
    assert_eq!(c.dims, vec![2, 2]);
    assert_eq!(c.data, vec![58.0, 64.0, 139.0, 154.0]);
}

#[test]
fn odd_sizes_match_triple_loop() {
    for (m, k, n) in [(1, 1, 1), (3, 5, 7), (13, 7, 5), (5, 13, 3), (1, 13, 1)] {
        check(&mm_graph(t("a", &[m, k], DataType::F64), t("b", &[k, n], DataType::F64)), (m * 100 + k * 10 + n) as u64);
        check(&mm_graph(t("a", &[3, m, k], DataType::F32), t("b", &[3, k, n], DataType::F32)), (m * 7 + k * 3 + n) as u64);
    }
}

#[test]
fn batch_dims_broadcast() {
    // Size-1 dims on both sides.
    let (g, _) = check(&mm_graph(t("a", &[2, 1, 3, 5], DataType::F32), t("b", &[1, 4, 5, 7], DataType::F32)), 1);
    assert_eq!(g.desc(g.output_tensors()[0]).dims, vec![2, 4, 3, 7]);
    // Different ranks: a plain matrix against a batch of them, and the other way round.
    let (g, _) = check(&mm_graph(t("a", &[3, 5], DataType::F64), t("b", &[2, 3, 5, 7], DataType::F64)), 2);
    assert_eq!(g.desc(g.output_tensors()[0]).dims, vec![2, 3, 3, 7]);
    let (g, _) = check(&mm_graph(t("a", &[4, 1, 3, 3, 5], DataType::F64), t("b", &[2, 1, 5, 2], DataType::F64)), 3);
    assert_eq!(g.desc(g.output_tensors()[0]).dims, vec![4, 2, 3, 3, 2]);
    // Broadcast inputs given with stride 0 along a batch dim of size > 1.
    let mm = mm_graph(t("a", &[3, 2, 5], DataType::F64).with_strides(&[0, 5, 1]), t("b", &[3, 5, 4], DataType::F64));
    let mut g = mm.g.clone();
    g.validate().unwrap();
    let mut inputs = random_inputs(&g, 4);
    // A stride-0 dim holds one value per position: make the three batches equal.
    let a0: Vec<f64> = inputs[&mm.a].data[..10].to_vec();
    inputs.get_mut(&mm.a).unwrap().data = a0.repeat(3);
    let got = &run_cpu(&g, &inputs).unwrap()[&mm.c];
    let want = reference_matmul(&inputs[&mm.a], &inputs[&mm.b]);
    assert!(relative_error(&got.data, &want.data) < 1e-13);
}

#[test]
fn transposed_and_gapped_strides() {
    // A [2, 5, 3] stored as [2, 3, 5] (transposed), B [2, 3, 7] stored as [2, 7, 3].
    let a = t("a", &[2, 5, 3], DataType::F32).with_layout(&[0, 2, 1]);
    let b = t("b", &[2, 3, 7], DataType::F32).with_layout(&[0, 2, 1]);
    assert_eq!(a.strides, vec![15, 1, 5]);
    let (g, _) = check(&mm_graph(a, b), 10);
    // The output is row-major packed.
    assert_eq!(g.desc(g.output_tensors()[0]).strides, vec![35, 7, 1]);
    // Rows padded with gaps, batch dim outermost in memory order reversed.
    let a = t("a", &[3, 5, 7], DataType::F64).with_strides(&[1, 30, 4]);
    let b = t("b", &[3, 7, 13], DataType::F64).with_strides(&[100, 14, 1]);
    check(&mm_graph(a, b), 11);
    // A transposed output set by the user.
    let mut mm = mm_graph(t("a", &[5, 3], DataType::F64), t("b", &[3, 7], DataType::F64).with_strides(&[1, 3]));
    mm.g.desc_mut(mm.c).strides = vec![1, 6];
    check(&mm, 12);
}

#[test]
fn reduced_precision_types() {
    for dt in [DataType::F16, DataType::Bf16, DataType::Fp8E4m3, DataType::Fp8E5m2] {
        let (g, _) = check(&mm_graph(t("a", &[2, 7, 13], dt), t("b", &[13, 5], dt)), 20);
        let want = if dt.is_fp8() { DataType::F32 } else { dt };
        assert_eq!(g.resolved_data_type(g.output_tensors()[0]), Some(want));
    }
    // Mixed fp8 inputs with a bf16 output, and f16 x f32.
    let mut mm = mm_graph(t("a", &[7, 13], DataType::Fp8E4m3), t("b", &[13, 5], DataType::Fp8E5m2).with_layout(&[1, 0]));
    mm.g.desc_mut(mm.c).data_type = Some(DataType::Bf16);
    check(&mm, 21);
    check(&mm_graph(t("a", &[7, 13], DataType::F16), t("b", &[13, 5], DataType::F32)), 22);
}

#[test]
fn integer_inputs_accumulate_exactly() {
    // i8 x i8 -> i32: sums leave the i8 range (|a|, |b| <= 4, k = 13 allows 208) and must be exact.
    let mm = mm_graph(t("a", &[2, 5, 13], DataType::I8), t("b", &[2, 13, 7], DataType::I8).with_layout(&[0, 2, 1]));
    let mut g = mm.g.clone();
    g.validate().unwrap();
    assert_eq!(g.resolved_data_type(mm.c), Some(DataType::I32));
    let mut inputs = random_inputs(&g, 30);
    // Push a row and column to the extremes so at least one sum is past 127.
    for v in inputs.get_mut(&mm.a).unwrap().data[..13].iter_mut() {
        *v = 4.0;
    }
    for kk in 0..13 {
        inputs.get_mut(&mm.b).unwrap().data[kk * 7] = 4.0;
    }
    let got = &run_cpu(&g, &inputs).unwrap()[&mm.c];
    let want = reference_matmul(&inputs[&mm.a], &inputs[&mm.b]);
    assert_eq!(got.data, want.data);
    assert_eq!(got.data[0], 208.0);
    // i32 inputs give i32; an f32 output of i8 inputs is allowed too.
    let (g, _) = check(&mm_graph(t("a", &[3, 5], DataType::I32), t("b", &[5, 3], DataType::I32)), 31);
    assert_eq!(g.resolved_data_type(g.output_tensors()[0]), Some(DataType::I32));
    let mut mm = mm_graph(t("a", &[3, 5], DataType::I8), t("b", &[5, 3], DataType::U8));
    mm.g.desc_mut(mm.c).data_type = Some(DataType::F32);
    check(&mm, 32);
}

fn expect_invalid(mut g: Graph, want: &str) {
    match g.validate() {
        Err(Error::InvalidGraph(msg)) => assert!(msg.contains(want), "error {msg:?} does not contain {want:?}"),
        other => panic!("expected InvalidGraph containing {want:?}, got {other:?}"),
    }
}

#[test]
fn bad_graphs_are_rejected() {
    let f = DataType::F32;
    expect_invalid(
        mm_graph(t("a", &[4, 3, 5], f), t("b", &[4, 6, 7], f)).g,
        "matmul \"matmul_0\": inner dims differ: `a` (tensor \"a\") dims [4, 3, 5] has k = 5 (its last dim) but `b` (tensor \"b\") dims [4, 6, 7] has k = 6",
    );
    expect_invalid(mm_graph(t("a", &[2, 3, 3, 5], f), t("b", &[4, 5, 7], f)).g, "batch dims do not broadcast: `a` has batch dims [2, 3] (of [2, 3, 3, 5]) and `b` has [4]");
    expect_invalid(mm_graph(t("a", &[5], f), t("b", &[5, 7], f)).g, "input `a` (tensor \"a\") must have rank >= 2 ([..., m, k]), got rank 1");
    expect_invalid(mm_graph(t("a", &[3, 5], f), t("b", &[5], f)).g, "input `b` (tensor \"b\") must have rank >= 2 ([..., k, n]), got rank 1");
    expect_invalid(mm_graph(t("a", &[3, 5], DataType::Bool), t("b", &[5, 2], f)).g, "input `a` (tensor \"a\") has type bool; matmul takes float or integer types");
    expect_invalid(mm_graph(t("a", &[3, 5], DataType::I8), t("b", &[5, 2], DataType::F16)).g, "input `a` is i8 but input `b` is f16: inputs must be both float or both integer");
    let mut mm = mm_graph(t("a", &[3, 5], f), t("b", &[5, 2], f));
    mm.g.desc_mut(mm.c).data_type = Some(DataType::Bool);
    expect_invalid(mm.g, "output `c` has type bool");
    let mut mm = mm_graph(t("a", &[3, 5], f), t("b", &[5, 2], f));
    mm.g.desc_mut(mm.c).dims = vec![2, 3];
    expect_invalid(mm.g, "was given dims [2, 3] but the op produces [3, 2]");
}
