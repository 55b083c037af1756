//! Reduction on the CPU engine against a straightforward grouping loop written here: every
//! mode, several axis sets, non-contiguous inputs, float, half and integer types, bad graphs.

use ferrodnn::graph::ops::reduction::ReductionMode;
use ferrodnn::graph::{stride_order, strides_for_order};
use ferrodnn::layout::for_each_index;
use ferrodnn::testing::{random_values, relative_error, run_cpu, tolerance, SplitMix64};
use ferrodnn::{DataType, Error, Graph, Nd, TensorDesc, TensorId};
use std::collections::HashMap;

const ALL_MODES: [ReductionMode; 9] = [
    ReductionMode::Add,
    ReductionMode::Mul,
    ReductionMode::Min,
    ReductionMode::Max,
    ReductionMode::Amax,
    ReductionMode::Avg,
    ReductionMode::Norm1,
    ReductionMode::Norm2,
    ReductionMode::MulNoZeros,
];

fn rand_nd(dims: &[usize], dt: DataType, seed: u64) -> Nd {
    let mut rng = SplitMix64::new(seed);
    Nd::new(dims.to_vec(), random_values(dims.iter().product(), dt, &mut rng))
}

/// One group's value, by the textbook definition of each mode.
fn fold_group(mode: ReductionMode, g: &[f64]) -> f64 {
    match mode {
        ReductionMode::Add => {
            let mut s = 0.0;
            for &v in g {
                s += v;
            }
            s
        }
        ReductionMode::Mul => {
            let mut p = 1.0;
            for &v in g {
                p *= v;
            }
            p
        }
        ReductionMode::Min => {
            let mut m = g[0];
            for &v in g {
                if v < m {
                    m = v;
                }
            }
            m
        }
        ReductionMode::Max => {
            let mut m = g[0];
            for &v in g {
                if v > m {
                    m = v;
                }
            }
            m
        }
        ReductionMode::Amax => {
            let mut m = 0.0;
            for &v in g {
                if v.abs() > m {
                    m = v.abs();
                }
            }
            m
        }
        ReductionMode::Avg => g.iter().sum::<f64>() / g.len() as f64,
        ReductionMode::Norm1 => g.iter().map(|v| v.abs()).sum(),
        ReductionMode::Norm2 => g.iter().map(|v| v * v).sum::<f64>().sqrt(),
        ReductionMode::MulNoZeros => {
            let mut p = 1.0;
            for &v in g {
                if v != 0.0 {
                    p *= v;
                }
            }
            p
        }
    }
}

/// Group every input element under the output element it reduces into, then fold each group.
fn reference(x: &Nd, mode: ReductionMode, axes: &[usize]) -> Nd {
    let mut out_dims = x.dims.clone();
    for &a in axes {
        out_dims[a] = 1;
    }
    let n_out: usize = out_dims.iter().product();
    let mut groups: Vec<Vec<f64>> = vec![Vec::new(); n_out];
    for_each_index(&x.dims, |flat, idx| {
        let mut o = 0;
        for (a, &i) in idx.iter().enumerate() {
            let i = if axes.contains(&a) { 0 } else { i };
            o = o * out_dims[a] + i;
        }
        groups[o].push(x.data[flat]);
    });
    Nd::new(out_dims, groups.iter().map(|g| fold_group(mode, g)).collect())
}

/// Build `x -> reduction -> y`, validate, run on the CPU, return (graph, y id, y values).
fn run_reduction(x_desc: TensorDesc, x: &Nd, mode: ReductionMode, axes: &[usize]) -> (Graph, TensorId, Nd) {
    let mut g = Graph::new("reduce");
    let xi = g.tensor(x_desc);
    let y = g.reduction(xi, mode, axes);
    g.set_output(y);
    g.validate().unwrap_or_else(|e| panic!("{mode:?} over {axes:?}: {e}"));
    let mut inputs = HashMap::new();
    inputs.insert(xi, x.clone());
    let out = run_cpu(&g, &inputs).unwrap_or_else(|e| panic!("{mode:?} over {axes:?}: {e}"));
    let yv = out[&y].clone();
    (g, y, yv)
}

const AXIS_SETS: [&[usize]; 8] = [&[], &[0], &[1], &[2], &[0, 2], &[2, 0], &[1, 2], &[0, 1, 2]];

#[test]
fn every_mode_and_axis_set_f64() {
    let dims = [3usize, 5, 7];
    let x = rand_nd(&dims, DataType::F64, 1);
    for mode in ALL_MODES {
        for axes in AXIS_SETS {
            let (g, y, got) = run_reduction(TensorDesc::new("x", &[3, 5, 7], DataType::F64), &x, mode, axes);
            let want = reference(&x, mode, axes);
            assert_eq!(got.dims, want.dims, "{mode:?} {axes:?}");
            assert_eq!(g.resolved_data_type(y), Some(DataType::F64));
            let err = relative_error(&got.data, &want.data);
            assert!(err < 1e-13, "{mode:?} over {axes:?}: relative error {err}");
        }
    }
}

#[test]
fn empty_axes_add_is_identity() {
    let x = rand_nd(&[4, 3], DataType::F32, 2);
    let (_, _, got) = run_reduction(TensorDesc::new("x", &[4, 3], DataType::F32), &x, ReductionMode::Add, &[]);
    assert_eq!(got, x);
}

#[test]
fn hand_worked_values() {
    // x = [[1, -2, 0], [3, 0, 0]] reduced over axis 1.
    let x = Nd::new(vec![2, 3], vec![1.0, -2.0, 0.0, 3.0, 0.0, 0.0]);
    let cases: [(ReductionMode, [f64; 2]); 9] = [
        (ReductionMode::Add, [-1.0, 3.0]),
        (ReductionMode::Mul, [0.0, 0.0]),
        (ReductionMode::Min, [-2.0, 0.0]),
        (ReductionMode::Max, [1.0, 3.0]),
        (ReductionMode::Amax, [2.0, 3.0]),
        (ReductionMode::Avg, [-1.0 / 3.0, 1.0]),
        (ReductionMode::Norm1, [3.0, 3.0]),
        (ReductionMode::Norm2, [5f64.sqrt(), 3.0]),
        (ReductionMode::MulNoZeros, [-2.0, 3.0]),
    ];
    for (mode, want) in cases {
        let (_, _, got) = run_reduction(TensorDesc::new("x", &[2, 3], DataType::F64), &x, mode, &[1]);
        assert_eq!(got.dims, vec![2, 1]);
        for (g, w) in got.data.iter().zip(want) {
            assert!((g - w).abs() < 1e-15, "{mode:?}: got {:?}, want {want:?}", got.data);
        }
    }
    // mul_no_zeros of all zeros is 1.
    let zeros = Nd::new(vec![1, 4], vec![0.0; 4]);
    let (_, _, got) = run_reduction(TensorDesc::new("x", &[1, 4], DataType::F64), &zeros, ReductionMode::MulNoZeros, &[1]);
    assert_eq!(got.data, vec![1.0]);
}

#[test]
fn transposed_and_padded_strides_f32() {
    let dims = [3usize, 5, 7];
    let x = rand_nd(&dims, DataType::F32, 3);
    // Transposed: axis 2 outermost, then 0, then 1.
    let transposed = TensorDesc::new("x", &[3, 5, 7], DataType::F32).with_layout(&[2, 0, 1]);
    // Padded rows with gaps between them: strides [100, 9, 1] leave holes the engine must skip.
    let padded = TensorDesc::new("x", &[3, 5, 7], DataType::F32).with_strides(&[100, 9, 1]);
    for desc in [transposed, padded] {
        for mode in ALL_MODES {
            for axes in [&[1usize][..], &[0, 2], &[2]] {
                let (g, y, got) = run_reduction(desc.clone(), &x, mode, axes);
                let want = reference(&x, mode, axes);
                let err = relative_error(&got.data, &want.data.iter().map(|&v| v as f32 as f64).collect::<Vec<_>>());
                assert!(err < 1e-6, "{mode:?} over {axes:?} strides {:?}: relative error {err}", desc.strides);
                // The output follows x's stride order.
                let yd = g.desc(y);
                assert_eq!(yd.strides, strides_for_order(&yd.dims, &stride_order(&desc.strides)));
            }
        }
    }
}

#[test]
fn half_types() {
    for dt in [DataType::F16, DataType::Bf16] {
        let dims = [5usize, 3, 13];
        let x = rand_nd(&dims, dt, 4);
        let desc = TensorDesc::new("x", &[5, 3, 13], dt).with_layout(&[1, 2, 0]);
        for mode in ALL_MODES {
            for axes in [&[2usize][..], &[0, 1]] {
                let (g, y, got) = run_reduction(desc.clone(), &x, mode, axes);
                assert_eq!(g.resolved_data_type(y), Some(dt), "output takes x's type by default");
                let want = reference(&x, mode, axes);
                let err = relative_error(&got.data, &want.data);
                assert!(err < tolerance(dt), "{dt} {mode:?} over {axes:?}: relative error {err}");
                // Results are representable in the type.
                assert!(got.data.iter().all(|&v| dt.quantize(v) == v));
            }
        }
    }
}

#[test]
fn integers_exact() {
    let dims = [3usize, 5, 7];
    let x = rand_nd(&dims, DataType::I32, 5);
    assert!(x.data.contains(&0.0) && x.data.iter().any(|&v| v != 0.0));
    let int_modes = [ReductionMode::Add, ReductionMode::Mul, ReductionMode::Min, ReductionMode::Max, ReductionMode::Amax, ReductionMode::Norm1, ReductionMode::MulNoZeros];
    for mode in int_modes {
        for axes in [&[0usize][..], &[1], &[2], &[0, 2]] {
            let desc = TensorDesc::new("x", &[3, 5, 7], DataType::I32).with_strides(&[1, 21, 3]);
            let (g, y, got) = run_reduction(desc, &x, mode, axes);
            assert_eq!(g.resolved_data_type(y), Some(DataType::I32));
            assert_eq!(got, reference(&x, mode, axes), "{mode:?} over {axes:?}");
        }
    }
}

#[test]
fn bool_min_max() {
    let x = Nd::new(vec![2, 3], vec![1.0, 0.0, 1.0, 1.0, 1.0, 1.0]);
    let (_, _, min) = run_reduction(TensorDesc::new("x", &[2, 3], DataType::Bool), &x, ReductionMode::Min, &[1]);
    let (_, _, max) = run_reduction(TensorDesc::new("x", &[2, 3], DataType::Bool), &x, ReductionMode::Max, &[0]);
    assert_eq!(min.data, vec![0.0, 1.0]);
    assert_eq!(max.data, vec![1.0, 1.0, 1.0]);
}

fn expect_invalid(mut g: Graph, needle: &str) {
    match g.validate() {
        Err(Error::InvalidGraph(msg)) => {
            assert!(msg.contains(needle), "message `{msg}` lacks `{needle}`");
            assert!(msg.starts_with("reduction \""), "message `{msg}` does not name the op");
        }
        other => panic!("expected InvalidGraph containing `{needle}`, got {other:?}"),
    }
}

fn bad(dt: DataType, mode: ReductionMode, axes: &[usize]) -> Graph {
    let mut g = Graph::new("bad");
    let x = g.tensor(TensorDesc::new("x", &[2, 3, 4], dt));
    let y = g.reduction(x, mode, axes);
    g.set_output(y);
    g
}

#[test]
fn bad_graphs() {
    expect_invalid(bad(DataType::F32, ReductionMode::Add, &[3]), "axis 3 is out of range for input `x` of rank 3");
    expect_invalid(bad(DataType::F32, ReductionMode::Max, &[1, 2, 1]), "axis 1 is listed twice");
    expect_invalid(bad(DataType::I32, ReductionMode::Avg, &[0]), "mode avg needs a floating-point input, but input `x` is i32");
    expect_invalid(bad(DataType::I8, ReductionMode::Norm2, &[0]), "mode norm2 needs a floating-point input");
    expect_invalid(bad(DataType::Bool, ReductionMode::Add, &[0]), "mode add needs a numeric input, but input `x` is bool");
    // An output the user shaped differently from what the reduction produces.
    let mut g = bad(DataType::F32, ReductionMode::Add, &[1]);
    let y = TensorId(g.tensors.len() - 1);
    g.desc_mut(y).dims = vec![2, 3, 1];
    expect_invalid(g, "was given dims [2, 3, 1] but the op produces [2, 1, 4]");
}
