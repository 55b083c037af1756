//! Transform cases: reshape, transpose, slice (with and without steps), concatenate and copy,
//! reading transposed, padded (gapped) and channels-last inputs, writing packed, permuted and
//! padded outputs, and casting between every pair of types.

use super::Case;
use crate::graph::TensorId;
use crate::{DataType, Graph, TensorDesc};

const FLOATS: [DataType; 4] = [DataType::F32, DataType::F16, DataType::Bf16, DataType::F64];
/// Storage types with no arithmetic: a transform moves them as they are.
const OTHERS: [DataType; 7] = [DataType::Fp8E4m3, DataType::Fp8E5m2, DataType::I8, DataType::U8, DataType::I32, DataType::I64, DataType::Bool];

/// How an input is stored.
#[derive(Clone, Copy, Debug)]
enum Store {
    Packed,
    /// Dims stored in reverse order (a transposed view).
    Reversed,
    /// Row-major with a gap after every row and every plane.
    Padded,
    /// Channels-last for rank 4 (`[0, 2, 3, 1]`), reversed otherwise.
    ChannelsLast,
}

impl Store {
    fn name(self) -> &'static str {
        match self {
            Store::Packed => "packed",
            Store::Reversed => "transposed",
            Store::Padded => "padded",
            Store::ChannelsLast => "nhwc",
        }
    }
}

fn desc(name: &str, dims: &[i64], dt: DataType, store: Store) -> TensorDesc {
    let d = TensorDesc::new(name, dims, dt);
    match store {
        Store::Packed => d,
        Store::Reversed => {
            let order: Vec<usize> = (0..dims.len()).rev().collect();
            d.with_layout(&order)
        }
        Store::Padded => {
            // Innermost stride 1, each outer stride the inner extent plus a gap of 3.
            let mut strides = vec![0i64; dims.len()];
            let mut acc = 1i64;
            for a in (0..dims.len()).rev() {
                strides[a] = acc;
                acc = acc * dims[a] + 3;
            }
            d.with_strides(&strides)
        }
        Store::ChannelsLast if dims.len() == 4 => d.with_layout(&[0, 2, 3, 1]),
        Store::ChannelsLast => {
            let order: Vec<usize> = (0..dims.len()).rev().collect();
            d.with_layout(&order)
        }
    }
}

/// A graph with one input `x` and the output `y` made by `f` (whose type may be set).
fn one_op(name: String, dims: &[i64], dt: DataType, store: Store, out_dt: Option<DataType>, f: impl FnOnce(&mut Graph, TensorId) -> TensorId) -> Case {
    let mut g = Graph::new(name.clone());
    let x = g.tensor(desc("x", dims, dt, store));
    let y = f(&mut g, x);
    g.set_output(y);
    g.desc_mut(y).name = "y".into();
    if let Some(o) = out_dt {
        g.desc_mut(y).data_type = Some(o);
    }
    Case::new(name, g)
}

fn reshape_cases(v: &mut Vec<Case>) {
    for dt in FLOATS {
        for store in [Store::Packed, Store::Reversed, Store::Padded] {
            v.push(one_op(format!("reshape_{}_{dt}", store.name()), &[5, 6, 7], dt, store, None, |g, x| g.reshape(x, &[6, 35])));
        }
    }
    for dt in OTHERS {
        v.push(one_op(format!("reshape_transposed_{dt}"), &[3, 5, 7], dt, Store::Reversed, None, |g, x| g.reshape(x, &[7, -1, 3])));
    }
    // Channels-last image flattened to [n, c*h*w] (logical order, so c outermost).
    v.push(one_op("reshape_nhwc_flatten_f16".into(), &[2, 5, 7, 3], DataType::F16, Store::ChannelsLast, None, |g, x| g.reshape(x, &[2, -1])));
    // Rank 1 to rank 5, and a reshape that casts.
    v.push(one_op("reshape_rank1_to_rank5_f32".into(), &[210], DataType::F32, Store::Packed, None, |g, x| g.reshape(x, &[2, 3, 1, 5, 7])));
    v.push(one_op("reshape_cast_f32_to_bf16".into(), &[3, 5, 7], DataType::F32, Store::Padded, Some(DataType::Bf16), |g, x| g.reshape(x, &[15, 7])));
    // Output stored column-major.
    let mut c = one_op("reshape_strided_out_f32".into(), &[3, 5, 7], DataType::F32, Store::Reversed, None, |g, x| g.reshape(x, &[5, 21]));
    let y = c.graph.find("y").unwrap();
    c.graph.desc_mut(y).strides = vec![1, 5];
    v.push(c);
}

fn transpose_cases(v: &mut Vec<Case>) {
    for dt in FLOATS {
        for store in [Store::Packed, Store::Reversed, Store::Padded, Store::ChannelsLast] {
            // NCHW -> NHWC logical permutation of a 4-D image.
            v.push(one_op(format!("transpose_0231_{}_{dt}", store.name()), &[2, 3, 5, 7], dt, store, None, |g, x| g.transpose(x, &[0, 2, 3, 1])));
        }
        v.push(one_op(format!("transpose_201_padded_{dt}"), &[5, 6, 7], dt, Store::Padded, None, |g, x| g.transpose(x, &[2, 0, 1])));
    }
    for dt in OTHERS {
        v.push(one_op(format!("transpose_10_transposed_{dt}"), &[13, 7], dt, Store::Reversed, None, |g, x| g.transpose(x, &[1, 0])));
    }
    v.push(one_op("transpose_rank5_f32".into(), &[2, 3, 5, 1, 7], DataType::F32, Store::Padded, None, |g, x| g.transpose(x, &[4, 2, 0, 3, 1])));
    v.push(one_op("transpose_rank1_f32".into(), &[13], DataType::F32, Store::Padded, None, |g, x| g.transpose(x, &[0])));
    v.push(one_op("transpose_cast_f16_to_f32".into(), &[5, 7, 3], DataType::F16, Store::Reversed, Some(DataType::F32), |g, x| g.transpose(x, &[1, 2, 0])));
    // Output stored channels-last: the logical transpose, then y's own strides.
    let mut c = one_op("transpose_nhwc_out_bf16".into(), &[3, 2, 5, 7], DataType::Bf16, Store::Packed, None, |g, x| g.transpose(x, &[1, 0, 2, 3]));
    let y = c.graph.find("y").unwrap();
    c.graph.desc_mut(y).strides = TensorDesc::new("t", &[2, 3, 5, 7], DataType::Bf16).with_layout(&[0, 2, 3, 1]).strides;
    v.push(c);
}

fn slice_cases(v: &mut Vec<Case>) {
    for dt in FLOATS {
        for store in [Store::Packed, Store::Reversed, Store::Padded] {
            v.push(one_op(format!("slice_steps_{}_{dt}", store.name()), &[7, 9, 11], dt, store, None, |g, x| g.slice_with_steps(x, &[1, 0, 2], &[7, 9, 11], &[2, 3, 4])));
        }
        v.push(one_op(format!("slice_nosteps_nhwc_{dt}"), &[3, 5, 7, 6], dt, Store::ChannelsLast, None, |g, x| g.slice(x, &[1, 2, 0, 3], &[3, 5, 6, 5])));
    }
    for dt in OTHERS {
        v.push(one_op(format!("slice_steps_transposed_{dt}"), &[9, 13], dt, Store::Reversed, None, |g, x| g.slice_with_steps(x, &[2, 1], &[9, 12], &[3, 2])));
    }
    // A single element; a step longer than the axis; a cast.
    v.push(one_op("slice_one_element_f32".into(), &[5, 7], DataType::F32, Store::Padded, None, |g, x| g.slice(x, &[4, 6], &[5, 7])));
    v.push(one_op("slice_big_step_f32".into(), &[5, 7, 3], DataType::F32, Store::Reversed, None, |g, x| g.slice_with_steps(x, &[0, 3, 0], &[5, 7, 3], &[9, 2, 1])));
    v.push(one_op("slice_cast_bf16_to_f16".into(), &[6, 5, 7], DataType::Bf16, Store::Padded, Some(DataType::F16), |g, x| {
        g.slice_with_steps(x, &[1, 1, 1], &[6, 4, 7], &[1, 1, 3])
    }));
}

/// Concatenate `dims_list` (stored as `stores`) along `axis`.
fn concat_case(name: &str, dims_list: &[Vec<i64>], dt: DataType, stores: &[Store], axis: usize, out_dt: Option<DataType>) -> Case {
    let name = format!("concatenate_{name}");
    let mut g = Graph::new(name.clone());
    let xs: Vec<TensorId> = dims_list.iter().enumerate().map(|(i, d)| g.tensor(desc(&format!("x{i}"), d, dt, stores[i % stores.len()]))).collect();
    let y = g.concatenate(&xs, axis);
    g.set_output(y);
    g.desc_mut(y).name = "y".into();
    if let Some(o) = out_dt {
        g.desc_mut(y).data_type = Some(o);
    }
    Case::new(name, g)
}

fn concatenate_cases(v: &mut Vec<Case>) {
    let mixed = [Store::Packed, Store::Reversed, Store::Padded];
    for dt in FLOATS {
        v.push(concat_case(&format!("axis1_mixed_{dt}"), &[vec![3, 2, 7], vec![3, 5, 7], vec![3, 1, 7]], dt, &mixed, 1, None));
        v.push(concat_case(&format!("axis0_mixed_{dt}"), &[vec![5, 7], vec![3, 7]], dt, &[Store::Reversed, Store::Padded], 0, None));
        v.push(concat_case(&format!("axis2_nhwc_{dt}"), &[vec![2, 3, 5, 7], vec![2, 3, 2, 7], vec![2, 3, 3, 7]], dt, &[Store::ChannelsLast, Store::Packed], 2, None));
    }
    for dt in OTHERS {
        v.push(concat_case(&format!("axis_last_{dt}"), &[vec![5, 3], vec![5, 7], vec![5, 1]], dt, &mixed, 1, None));
    }
    // Channels: NHWC inputs joined on c (y follows x0: channels-last).
    v.push(concat_case("channels_nhwc_f16", &[vec![2, 3, 5, 7], vec![2, 5, 5, 7]], DataType::F16, &[Store::ChannelsLast], 1, None));
    v.push(concat_case("single_f32", &[vec![5, 7, 3]], DataType::F32, &[Store::Padded], 1, None));
    // More inputs than one launch takes: 37 of them, sizes 1 to 3 on the axis.
    let many: Vec<Vec<i64>> = (0..37).map(|i| vec![3, 1 + i % 3, 5]).collect();
    v.push(concat_case("many_inputs_f32", &many, DataType::F32, &mixed, 1, None));
    v.push(concat_case("cast_f32_to_f16", &[vec![5, 7], vec![5, 6]], DataType::F32, &mixed, 1, Some(DataType::F16)));
}

fn copy_cases(v: &mut Vec<Case>) {
    let nhwc = TensorDesc::new("t", &[2, 5, 7, 3], DataType::F32).with_layout(&[0, 2, 3, 1]).strides;
    let nchw = TensorDesc::new("t", &[2, 5, 7, 3], DataType::F32).strides;
    for dt in FLOATS {
        v.push(one_op(format!("copy_nchw_to_nhwc_{dt}"), &[2, 5, 7, 3], dt, Store::Packed, None, |g, x| g.copy(x, Some(&nhwc), None)));
        v.push(one_op(format!("copy_nhwc_to_nchw_{dt}"), &[2, 5, 7, 3], dt, Store::ChannelsLast, None, |g, x| g.copy(x, Some(&nchw), None)));
        // Gapped in, packed out in x's order; and transposed in, gapped out.
        v.push(one_op(format!("copy_padded_{dt}"), &[5, 6, 7], dt, Store::Padded, None, |g, x| g.copy(x, None, None)));
        v.push(one_op(format!("copy_to_padded_{dt}"), &[5, 6, 7], dt, Store::Reversed, None, |g, x| g.copy(x, Some(&[64, 9, 1]), None)));
    }
    // Every cast: from each type to each type, transposed in, packed out.
    for from in DataType::ALL {
        for to in DataType::ALL {
            v.push(one_op(format!("copy_cast_{from}_to_{to}"), &[7, 13], from, Store::Reversed, None, |g, x| g.copy(x, None, Some(to))));
        }
    }
    // Saturation and rounding: values scaled far outside the target type, then cast.
    for (what, to, scale) in [
        ("saturate", DataType::I8, 300.0),
        ("saturate", DataType::U8, 600.0),
        ("saturate", DataType::I32, 1e10),
        ("saturate", DataType::I64, 1e19),
        ("saturate", DataType::Fp8E4m3, 1000.0),
        ("saturate", DataType::Fp8E5m2, 1e5),
        ("small_to", DataType::Bool, 1e-3),
        ("round_half_to", DataType::I8, 2.5),
    ] {
        let name = format!("copy_{what}_{to}");
        let mut g = Graph::new(name.clone());
        let x = g.tensor(desc("x", &[5, 7, 3], DataType::F32, Store::Padded));
        let s = g.scalar("s", scale);
        let big = g.scale(x, s);
        let y = g.copy(big, None, Some(to));
        g.set_output(y);
        g.desc_mut(y).name = "y".into();
        v.push(Case::new(name, g));
    }
    // NaN (log of negative values) to integers and bool.
    for to in [DataType::I32, DataType::U8, DataType::Bool] {
        let mut g = Graph::new(format!("copy_nan_to_{to}"));
        let x = g.tensor(desc("x", &[5, 7], DataType::F32, Store::Reversed));
        let l = g.pointwise(crate::graph::ops::pointwise::PointwiseMode::Log, &[x]);
        let y = g.copy(l, None, Some(to));
        g.set_output(y);
        g.desc_mut(y).name = "y".into();
        v.push(Case::new(format!("copy_nan_to_{to}"), g));
    }
}

pub(super) fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    reshape_cases(&mut v);
    transpose_cases(&mut v);
    slice_cases(&mut v);
    concatenate_cases(&mut v);
    copy_cases(&mut v);
    v
}

#[cfg(test)]
mod tests {
    use crate::testing::{random_inputs, run_cpu};

    #[test]
    fn every_transform_case_validates_and_runs_on_the_cpu() {
        let cases = super::cases();
        let mut names = std::collections::HashSet::new();
        for c in &cases {
            assert!(names.insert(c.name.clone()), "duplicate case name {}", c.name);
            let mut g = c.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", c.name));
            for t in &g.tensors {
                assert!(t.element_count() < 50_000, "{}: tensor {} too large", c.name, t.name);
            }
            let inputs = random_inputs(&g, 7);
            let outs = run_cpu(&g, &inputs).unwrap_or_else(|e| panic!("{}: {e}", c.name));
            assert!(!outs.is_empty(), "{}: no outputs", c.name);
        }
    }
}
