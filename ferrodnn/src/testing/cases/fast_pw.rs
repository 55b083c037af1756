//! Cases for fused pointwise chains (engine/cuda/fused/pointwise.rs): the vector path (packed
//! tensors, 16-byte accesses, a scalar tail for odd counts), broadcast bias and scalars, trees,
//! chains cut at a graph output or a branch, f16/bf16/f32/f64, intermediate rounding, and the
//! strided path (transposed inputs, padded outputs).

use super::Case;
use crate::graph::ops::pointwise::PointwiseMode;
use crate::graph::TensorId;
use crate::{DataType, Graph, TensorDesc};

fn out(g: &mut Graph, id: TensorId, name: &str) {
    g.set_output(id);
    g.desc_mut(id).name = name.into();
}

/// y = sigmoid((a * b + a) * 0.5) * b (the benchmark's chain), a and b with the given strides.
fn chain5(name: &str, dt: DataType, dims: &[i64], a_layout: Option<&[usize]>, b_layout: Option<&[usize]>) -> Case {
    let name = format!("fast_pw_{name}_{dt}");
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let mut ad = TensorDesc::new("a", dims, dt);
    if let Some(o) = a_layout {
        ad = ad.with_layout(o);
    }
    let mut bd = TensorDesc::new("b", dims, dt);
    if let Some(o) = b_layout {
        bd = bd.with_layout(o);
    }
    let a = g.tensor(ad);
    let b = g.tensor(bd);
    let half = g.scalar("half", 0.5);
    let t = g.mul(a, b);
    let t = g.add(t, a);
    let t = g.scale(t, half);
    let t = g.pointwise(PointwiseMode::Sigmoid, &[t]);
    let y = g.mul(t, b);
    out(&mut g, y, "y");
    Case::new(name, g)
}

/// gelu(x * s + bias): by-value scalar s, bias [1, C] (or [C] when `rank1_bias`).
fn scale_bias_gelu(dt: DataType, dims: &[i64], rank1_bias: bool) -> Case {
    let c = *dims.last().unwrap_or(&1);
    let name = format!("fast_pw_scale_bias_gelu_{}x{c}{}_{dt}", dims[0], if rank1_bias { "_rank1" } else { "" });
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let x = g.tensor(TensorDesc::new("x", dims, dt));
    let bias_dims: Vec<i64> = if rank1_bias { vec![c] } else { std::iter::repeat_n(1, dims.len() - 1).chain([c]).collect() };
    let bias = g.tensor(TensorDesc::new("bias", &bias_dims, dt));
    let s = g.scalar("s", 1.25);
    let t = g.scale(x, s);
    let t = g.bias(t, bias);
    let y = g.gelu(t);
    out(&mut g, y, "y");
    Case::new(name, g)
}

/// A tree: t = x + bias; y = relu(t) * sigmoid(t) + x (t feeds two branches that join; x is
/// read by two nodes).
fn tree(dt: DataType) -> Case {
    let name = format!("fast_pw_tree_{dt}");
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let x = g.tensor(TensorDesc::new("x", &[33, 256], dt));
    let bias = g.tensor(TensorDesc::new("bias", &[1, 256], dt));
    let t = g.bias(x, bias);
    let u = g.relu(t);
    let w = g.sigmoid(t);
    let p = g.mul(u, w);
    let y = g.add(p, x);
    out(&mut g, y, "y");
    Case::new(name, g)
}

/// A chain whose middle value is also a graph output: fused up to it and after it, not across.
fn middle_output(dt: DataType) -> Case {
    let name = format!("fast_pw_middle_output_{dt}");
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let x = g.tensor(TensorDesc::new("x", &[24, 160], dt));
    let z = g.tensor(TensorDesc::new("z", &[24, 160], dt));
    let s = g.scalar("s", -0.75);
    let a = g.mul(x, z);
    let m = g.tanh(a);
    let c = g.add(m, x);
    let y = g.scale(c, s);
    out(&mut g, m, "mid");
    out(&mut g, y, "y");
    Case::new(name, g)
}

/// An inner value read by two branches that end apart (two exits): the group is cut there.
fn split(dt: DataType) -> Case {
    let name = format!("fast_pw_split_{dt}");
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let x = g.tensor(TensorDesc::new("x", &[16, 200], dt));
    let s = g.scalar("s", 2.0);
    let a = g.scale(x, s);
    let a2 = g.exp(a);
    let b = g.relu(a2);
    let b2 = g.add(b, x);
    let c = g.tanh(a2);
    out(&mut g, b2, "y1");
    out(&mut g, c, "y2");
    Case::new(name, g)
}

/// A chain feeding a matmul (the chain's output is virtual and goes to memory), and a matmul
/// output feeding a chain as a broadcast-free external input.
fn around_matmul(dt: DataType) -> Case {
    let name = format!("fast_pw_around_matmul_{dt}");
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let a = g.tensor(TensorDesc::new("a", &[2, 24, 40], dt));
    let bias = g.tensor(TensorDesc::new("bias", &[1, 1, 40], dt));
    let w = g.tensor(TensorDesc::new("w", &[40, 32], dt));
    let r = g.tensor(TensorDesc::new("r", &[2, 24, 32], dt));
    let t = g.bias(a, bias);
    let t = g.pointwise(PointwiseMode::Swish { beta: 1.0 }, &[t]);
    let m = g.matmul(t, w);
    let u = g.add(m, r);
    let y = g.pointwise(PointwiseMode::Relu { lower_clip: None, upper_clip: Some(6.0), negative_slope: Some(0.1) }, &[u]);
    out(&mut g, y, "y");
    Case::new(name, g)
}

/// Channels-last tensors sharing one packed layout, with a per-channel bias.
fn nhwc(dt: DataType) -> Case {
    let name = format!("fast_pw_nhwc_{dt}");
    let nhwc = [0, 2, 3, 1];
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let x = g.tensor(TensorDesc::new("x", &[2, 16, 5, 7], dt).with_layout(&nhwc));
    let r = g.tensor(TensorDesc::new("r", &[2, 16, 5, 7], dt).with_layout(&nhwc));
    let bias = g.tensor(TensorDesc::new("bias", &[1, 16, 1, 1], dt));
    let t = g.add(x, r);
    let t = g.bias(t, bias);
    let y = g.relu(t);
    out(&mut g, y, "y");
    Case::new(name, g)
}

/// Comparison and select inside a chain; a bias from memory of shape [1] (read once).
fn select(dt: DataType) -> Case {
    let name = format!("fast_pw_select_{dt}");
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let x = g.tensor(TensorDesc::new("x", &[20, 96], dt));
    let z = g.tensor(TensorDesc::new("z", &[20, 96], dt));
    let k = g.tensor(TensorDesc::new("k", &[1], dt));
    let m = g.pointwise(PointwiseMode::CmpGt, &[x, z]);
    let xs = g.add(x, k);
    let zs = g.pointwise(PointwiseMode::Max, &[z, k]);
    let y = g.pointwise(PointwiseMode::BinarySelect, &[xs, zs, m]);
    out(&mut g, y, "y");
    Case::new(name, g)
}

/// bf16 inputs, f32 output (mixed element sizes on the vector path).
fn mixed_out() -> Case {
    let dt = DataType::Bf16;
    let name = "fast_pw_bf16_in_f32_out".to_string();
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let x = g.tensor(TensorDesc::new("x", &[40, 64], dt));
    let z = g.tensor(TensorDesc::new("z", &[40, 64], dt));
    let t = g.sub(x, z);
    let t = g.pointwise(PointwiseMode::AddSquare, &[t, x]);
    let y = g.pointwise(PointwiseMode::SigmoidBackward, &[t, z]);
    out(&mut g, y, "y");
    g.desc_mut(y).data_type = Some(DataType::F32);
    Case::new(name, g)
}

/// f32 tensors with bf16 intermediates: inner values are rounded to bf16 as on the CPU.
fn bf16_intermediates() -> Case {
    let dt = DataType::F32;
    let name = "fast_pw_bf16_intermediates_f32".to_string();
    let mut g = Graph::new(name.clone()).io_data_type(dt).intermediate_data_type(DataType::Bf16);
    let x = g.tensor(TensorDesc::new("x", &[12, 100], dt));
    let z = g.tensor(TensorDesc::new("z", &[12, 100], dt));
    let t = g.mul(x, z);
    let t = g.pointwise(PointwiseMode::Elu { alpha: 0.5 }, &[t]);
    let y = g.add(t, x);
    out(&mut g, y, "y");
    Case::new(name, g)
}

/// A padded output (strided path for the output too).
fn padded_out(dt: DataType) -> Case {
    let name = format!("fast_pw_padded_out_{dt}");
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let x = g.tensor(TensorDesc::new("x", &[9, 30], dt));
    let z = g.tensor(TensorDesc::new("z", &[9, 1], dt));
    let t = g.sub(x, z);
    let y = g.pointwise(PointwiseMode::GeluApproxTanh, &[t]);
    out(&mut g, y, "y");
    g.desc_mut(y).strides = vec![32, 1];
    Case::new(name, g)
}

pub(super) fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for dt in [DataType::Bf16, DataType::F16, DataType::F32] {
        v.push(chain5("chain5_48x1024", dt, &[48, 1024], None, None));
        // Odd counts: vectors then a scalar tail; fewer elements than one vector.
        v.push(chain5("chain5_7x33", dt, &[7, 33], None, None));
        v.push(chain5("chain5_1x5", dt, &[1, 5], None, None));
        v.push(scale_bias_gelu(dt, &[37, 512], false));
        v.push(tree(dt));
    }
    v.push(chain5("chain5_64x4096", DataType::Bf16, &[64, 4096], None, None));
    v.push(chain5("chain5_3d", DataType::F64, &[5, 9, 31], None, None));
    // Transposed inputs: the strided path (a transposed first input sets the output's layout).
    v.push(chain5("chain5_transposed_b", DataType::Bf16, &[64, 96], None, Some(&[1, 0])));
    v.push(chain5("chain5_transposed_a", DataType::F32, &[40, 24], Some(&[1, 0]), None));
    v.push(chain5("chain5_transposed_both", DataType::F16, &[40, 24], Some(&[1, 0]), Some(&[1, 0])));
    // Bias rows not a multiple of the vector: per-element broadcast offsets.
    v.push(scale_bias_gelu(DataType::Bf16, &[16, 12], true));
    v.push(scale_bias_gelu(DataType::F32, &[6, 5, 12], false));
    v.push(middle_output(DataType::Bf16));
    v.push(split(DataType::F32));
    v.push(around_matmul(DataType::Bf16));
    v.push(nhwc(DataType::Bf16));
    v.push(nhwc(DataType::F16));
    v.push(select(DataType::F32));
    v.push(select(DataType::F64));
    v.push(mixed_out());
    v.push(bf16_intermediates());
    v.push(padded_out(DataType::Bf16));
    v
}
