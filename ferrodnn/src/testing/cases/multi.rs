//! Multi-op cases: graphs users build, with virtual intermediates between the ops, so that
//! the plan's workspace slices, launch order and intermediate types are checked together.

use super::Case;
use crate::graph::ops::conv::ConvAttrs;
use crate::graph::ops::norm::NormAttrs;
use crate::graph::ops::resample::ResampleAttrs;
use crate::{DataType, Graph, TensorDesc};

const NHWC: [usize; 4] = [0, 2, 3, 1];

fn out(g: &mut Graph, id: crate::graph::TensorId, name: &str) {
    g.set_output(id);
    g.desc_mut(id).name = name.into();
}

/// conv_fprop -> bias -> relu on channels-last images (a padded 3x3 convolution).
fn conv_bias_relu(dt: DataType) -> Case {
    let name = format!("multi_conv_bias_relu_nhwc_{dt}");
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let x = g.tensor(TensorDesc::new("x", &[2, 5, 9, 7], dt).with_layout(&NHWC));
    let w = g.tensor(TensorDesc::new("w", &[6, 5, 3, 3], dt).with_layout(&NHWC));
    let b = g.tensor(TensorDesc::new("b", &[1, 6, 1, 1], dt));
    let c = g.conv_fprop(x, w, ConvAttrs::new(2).with_padding(&[1, 1]));
    let cb = g.bias(c, b);
    let y = g.relu(cb);
    out(&mut g, y, "y");
    Case::new(name, g)
}

/// matmul -> bias -> gelu, b stored column-major.
fn matmul_bias_gelu() -> Case {
    let dt = DataType::Bf16;
    let name = format!("multi_matmul_bias_gelu_{dt}");
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let a = g.tensor(TensorDesc::new("a", &[3, 7, 13], dt));
    let b = g.tensor(TensorDesc::new("b", &[13, 11], dt).with_strides(&[1, 13]));
    let bias = g.tensor(TensorDesc::new("bias", &[1, 11], dt));
    let c = g.matmul(a, b);
    let cb = g.bias(c, bias);
    let y = g.gelu(cb);
    out(&mut g, y, "y");
    Case::new(name, g)
}

/// Residual add -> layernorm (inference: y only).
fn residual_layernorm() -> Case {
    let dt = DataType::Bf16;
    let name = format!("multi_residual_layernorm_{dt}");
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let x = g.tensor(TensorDesc::new("x", &[5, 6, 7], dt));
    let r = g.tensor(TensorDesc::new("residual", &[5, 6, 7], dt).with_layout(&[2, 1, 0]));
    let scale = g.tensor(TensorDesc::new("scale", &[1, 6, 7], dt));
    let bias = g.tensor(TensorDesc::new("bias", &[1, 6, 7], dt));
    let s = g.add(x, r);
    let (y, _, _) = g.layernorm(s, scale, bias, NormAttrs::inference());
    out(&mut g, y, "y");
    Case::new(name, g)
}

/// scale -> bias -> relu -> sum over channels, channels-last.
fn scale_bias_relu_sum() -> Case {
    let dt = DataType::F32;
    let name = format!("multi_scale_bias_relu_sum_{dt}");
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let x = g.tensor(TensorDesc::new("x", &[3, 13, 5, 7], dt).with_layout(&NHWC));
    let s = g.tensor(TensorDesc::new("scale", &[1, 13, 1, 1], dt));
    let b = g.tensor(TensorDesc::new("bias", &[1, 13, 1, 1], dt));
    let xs = g.scale(x, s);
    let xb = g.bias(xs, b);
    let r = g.relu(xb);
    let y = g.reduce_sum(r, &[1]);
    out(&mut g, y, "y");
    Case::new(name, g)
}

/// Attention written out: softmax(q @ k^T * scale) @ v, k^T by a transpose op (`heads`
/// false: [b, s, d]) or by a transpose op over [b, h, s, d].
fn attention(dt: DataType, heads: bool) -> Case {
    let name = if heads { format!("multi_attention_heads_{dt}") } else { format!("multi_attention_{dt}") };
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let (qd, kd, perm): (Vec<i64>, Vec<i64>, Vec<usize>) =
        if heads { (vec![2, 3, 5, 8], vec![2, 3, 7, 8], vec![0, 1, 3, 2]) } else { (vec![2, 5, 8], vec![2, 7, 8], vec![0, 2, 1]) };
    let q = g.tensor(TensorDesc::new("q", &qd, dt));
    let k = g.tensor(TensorDesc::new("k", &kd, dt));
    // v stored with the sequence innermost (a transposed view).
    let v_order: Vec<usize> = if heads { vec![0, 1, 3, 2] } else { vec![0, 2, 1] };
    let v = g.tensor(TensorDesc::new("v", &kd, dt).with_layout(&v_order));
    let kt = g.transpose(k, &perm);
    let s = g.matmul(q, kt);
    let scale = g.scalar("attn_scale", 1.0 / 8f64.sqrt());
    let ss = g.scale(s, scale);
    let rank = qd.len();
    let (p, _) = g.softmax(ss, rank - 1, false, false);
    let o = g.matmul(p, v);
    out(&mut g, o, "o");
    Case::new(name, g)
}

/// A convolution followed by pooling.
fn conv_pool(dt: DataType, nhwc: bool, pool: ResampleAttrs, what: &str) -> Case {
    let name = format!("multi_conv_{what}_{}{dt}", if nhwc { "nhwc_" } else { "" });
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let (mut xd, mut wd) = (TensorDesc::new("x", &[2, 3, 11, 9], dt), TensorDesc::new("w", &[4, 3, 3, 3], dt));
    if nhwc {
        xd = xd.with_layout(&NHWC);
        wd = wd.with_layout(&NHWC);
    }
    let x = g.tensor(xd);
    let w = g.tensor(wd);
    let c = g.conv_fprop(x, w, ConvAttrs::new(2).with_padding(&[1, 1]));
    let y = g.resample(c, pool);
    out(&mut g, y, "y");
    Case::new(name, g)
}

/// transpose -> copy that casts f32 to f16 and stores channels-last.
fn transpose_copy_cast() -> Case {
    let name = "multi_transpose_copy_cast_f32_to_f16".to_string();
    let mut g = Graph::new(name.clone());
    let x = g.tensor(TensorDesc::new("x", &[2, 5, 7, 3], DataType::F32).with_strides(&[200, 40, 5, 1]));
    let t = g.transpose(x, &[0, 3, 1, 2]);
    let strides = TensorDesc::new("t", &[2, 3, 5, 7], DataType::F16).with_layout(&NHWC).strides;
    let y = g.copy(t, Some(&strides), Some(DataType::F16));
    out(&mut g, y, "y");
    Case::new(name, g)
}

/// Two slices joined, reshaped and transposed: every transform in one chain.
fn slice_concat_reshape() -> Case {
    let dt = DataType::F32;
    let name = format!("multi_slice_concat_reshape_transpose_{dt}");
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let x = g.tensor(TensorDesc::new("x", &[6, 11], dt).with_layout(&[1, 0]));
    let a = g.slice(x, &[0, 0], &[6, 4]);
    let b = g.slice_with_steps(x, &[1, 3], &[6, 11], &[2, 2]);
    let c = g.concatenate(&[a, b], 0);
    let r = g.reshape(c, &[3, -1]);
    let y = g.transpose(r, &[1, 0]);
    out(&mut g, y, "y");
    Case::new(name, g)
}

/// Layernorm training forward, then its backward from the saved statistics.
fn layernorm_fwd_bwd() -> Case {
    let dt = DataType::F32;
    let name = format!("multi_layernorm_fwd_bwd_{dt}");
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let x = g.tensor(TensorDesc::new("x", &[4, 6, 5], dt));
    let scale = g.tensor(TensorDesc::new("scale", &[1, 6, 5], dt));
    let bias = g.tensor(TensorDesc::new("bias", &[1, 6, 5], dt));
    let dy = g.tensor(TensorDesc::new("dy", &[4, 6, 5], dt).with_layout(&[2, 1, 0]));
    let (y, mean, inv) = g.layernorm(x, scale, bias, NormAttrs::default());
    let (mean, inv) = (mean.expect("training layernorm has mean"), inv.expect("training layernorm has inv_variance"));
    let (dx, dscale, dbias) = g.layernorm_backward(dy, x, scale, mean, inv);
    out(&mut g, y, "y");
    out(&mut g, dx, "dx");
    out(&mut g, dscale, "dscale");
    out(&mut g, dbias, "dbias");
    Case::new(name, g)
}

/// `relu(x * s + t)` and `y2 = x * s` with by-value scalars `s` (f32) and `t` (the io type) whose
/// values come with the variant pack, not the graph: the CUDA plan writes them where its kernels
/// read them at the start of every execute.
fn runtime_scalars(dt: DataType) -> Case {
    let name = format!("multi_runtime_scalars_{dt}");
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let x = g.tensor(TensorDesc::new("x", &[3, 37, 11], dt));
    let s = g.tensor(TensorDesc::runtime_scalar("s", DataType::F32));
    let t = g.tensor(TensorDesc::runtime_scalar("t", dt));
    let xs = g.mul(x, s);
    out(&mut g, xs, "y2");
    let xst = g.add(xs, t);
    let y = g.relu(xst);
    out(&mut g, y, "y");
    Case::new(name, g)
}

pub(super) fn cases() -> Vec<Case> {
    vec![
        runtime_scalars(DataType::F32),
        runtime_scalars(DataType::Bf16),
        conv_bias_relu(DataType::F16),
        conv_bias_relu(DataType::F32),
        matmul_bias_gelu(),
        residual_layernorm(),
        scale_bias_relu_sum(),
        attention(DataType::F32, false),
        attention(DataType::Bf16, true),
        conv_pool(DataType::F32, false, ResampleAttrs::max_2d(2, 2, 0), "maxpool"),
        conv_pool(DataType::F16, true, ResampleAttrs::avg_2d(3, 2, 1, false), "avgpool"),
        transpose_copy_cast(),
        slice_concat_reshape(),
        layernorm_fwd_bwd(),
    ]
}

#[cfg(test)]
mod tests {
    use crate::testing::{random_inputs, run_cpu};

    #[test]
    fn every_multi_case_validates_and_runs_on_the_cpu() {
        let cases = super::cases();
        let mut names = std::collections::HashSet::new();
        for c in &cases {
            assert!(names.insert(c.name.clone()), "duplicate case name {}", c.name);
            assert!(c.graph.nodes.len() >= 2, "{}: a multi-op case needs several ops", c.name);
            let mut g = c.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", c.name));
            for t in &g.tensors {
                assert!(t.element_count() < 50_000, "{}: tensor {} too large", c.name, t.name);
            }
            // Some intermediate stays virtual (the point of these graphs).
            assert!(g.tensors.iter().any(|t| t.is_virtual), "{}: no virtual intermediate", c.name);
            let inputs = random_inputs(&g, 11);
            let outs = run_cpu(&g, &inputs).unwrap_or_else(|e| panic!("{}: {e}", c.name));
            assert_eq!(outs.len(), g.output_tensors().len(), "{}", c.name);
            for (id, nd) in &outs {
                assert!(nd.data.iter().all(|v| v.is_finite()), "{}: output {} has non-finite values", c.name, g.desc(*id).name);
            }
        }
    }
}
