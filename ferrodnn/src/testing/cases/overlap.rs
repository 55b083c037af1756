//! Inputs whose elements share memory, as cuDNN (and so the frontend's tests) give them:
//! expanded views (stride 0), transposed and expanded ones, and views with overlapping rows or
//! pixels. Every engine must read each element at its strides: the fast paths keyed on strides
//! (16-byte vectors, TMA maps) must decline or address them right. Matmul (fp16 and bf16 on the
//! tensor-core paths, f32), convolution (fprop, dgrad, wgrad), pointwise, the norms, softmax and
//! a reduction; the sdpa ones are in `sdpa.rs` (layout `Overlap`). Every case is named
//! `overlap_*` (`sdpa_*_overlap*` for attention: `gpu-check --filter overlap` runs them all).

use super::Case;
use crate::graph::ops::conv::ConvAttrs;
use crate::graph::ops::norm::NormAttrs;
use crate::graph::ops::reduction::ReductionMode;
use crate::graph::TensorId;
use crate::{DataType, Graph, TensorDesc};

fn t(name: &str, dims: &[i64], strides: &[i64], dt: DataType) -> TensorDesc {
    TensorDesc::new(name, dims, dt).with_strides(strides)
}

fn out(g: &mut Graph, id: TensorId, dt: DataType) {
    g.set_output(id);
    g.desc_mut(id).data_type = Some(dt);
}

/// `a x b -> c` in `dt` (c in `dt` too).
fn mm(name: &str, a: TensorDesc, b: TensorDesc, dt: DataType) -> Case {
    let name = format!("overlap_matmul_{name}");
    let mut g = Graph::new(name.clone());
    let (a, b) = (g.tensor(a), g.tensor(b));
    let c = g.matmul(a, b);
    out(&mut g, c, dt);
    Case::new(name, g)
}

fn matmul() -> Vec<Case> {
    use DataType::{Bf16, F16, F32};
    vec![
        // A's rows expanded (stride 0): every row of C the same.
        mm("a_rows_expanded_f16", t("a", &[96, 64], &[0, 1], F16), TensorDesc::new("b", &[64, 80], F16), F16),
        // A's rows 8 elements apart over 64 columns (each row shares 56 elements with the next):
        // 16-byte aligned, so only the overlap can make a TMA map decline.
        mm("a_rows_overlap_f16", t("a", &[128, 64], &[8, 1], F16), TensorDesc::new("b", &[64, 128], F16), F16),
        // B transposed (n x k in memory) and expanded along n.
        mm("b_transposed_expanded_bf16", TensorDesc::new("a", &[64, 96], Bf16), t("b", &[96, 72], &[1, 0], Bf16), Bf16),
        // B's columns overlapping (a sliding window over one row of memory), batched with A's
        // batch expanded.
        mm("batched_b_window_f16", t("a", &[3, 40, 32], &[0, 32, 1], F16), t("b", &[3, 32, 48], &[64, 1, 1], F16), F16),
        mm("a_window_f32", t("a", &[33, 17], &[3, 1], F32), t("b", &[17, 9], &[0, 1], F32), F32),
    ]
}

/// Channels-last `[n, c, h, w]` strides with pixels `px` elements apart (`px < c`: pixels
/// overlap) and rows `px * w + gap` apart.
fn nhwc_overlap(dims: [i64; 4], px: i64, gap: i64) -> Vec<i64> {
    let [_, c, h, w] = dims;
    let row = px * w + gap;
    let _ = c;
    vec![row * h, 1, row, px]
}

fn conv() -> Vec<Case> {
    use DataType::{F16, F32};
    let mut v = Vec::new();
    // fprop: overlapping pixels of an fp16 image (16 channels, pixels 8 apart) and a filter
    // expanded over its output channels (every filter the same) in channels-last.
    {
        let name = "overlap_conv_fprop_f16".to_string();
        let mut g = Graph::new(name.clone());
        let xd = [2, 16, 9, 11];
        let x = g.tensor(t("x", &xd, &nhwc_overlap(xd, 8, 8), F16));
        let w = g.tensor(t("w", &[32, 16, 3, 3], &[0, 1, 48, 16], F16));
        let y = g.conv_fprop(x, w, ConvAttrs::new(2).with_padding(&[1, 1]));
        out(&mut g, y, F16);
        g.desc_mut(y).strides = crate::graph::strides_for_order(&[2, 32, 9, 11], &[0, 2, 3, 1]);
        v.push(Case::new(name, g));
    }
    // fprop 1x1 (the GEMM over views) with an image expanded over the batch and overlapping
    // pixels.
    {
        let name = "overlap_conv_fprop_1x1_f16".to_string();
        let mut g = Graph::new(name.clone());
        let xd = [3, 32, 6, 6];
        let mut xs = nhwc_overlap(xd, 16, 0);
        xs[0] = 0;
        let x = g.tensor(t("x", &xd, &xs, F16));
        let w = g.tensor(TensorDesc::new("w", &[48, 32, 1, 1], F16).with_layout(&[0, 2, 3, 1]));
        let y = g.conv_fprop(x, w, ConvAttrs::new(2));
        out(&mut g, y, F16);
        v.push(Case::new(name, g));
    }
    // dgrad with an expanded dy (stride 0 over the image rows), wgrad with an overlapping x.
    {
        let name = "overlap_conv_dgrad_f16".to_string();
        let mut g = Graph::new(name.clone());
        let dy = g.tensor(t("dy", &[2, 16, 7, 7], &[112, 1, 0, 16], F16));
        let w = g.tensor(TensorDesc::new("w", &[16, 24, 3, 3], F16).with_layout(&[0, 2, 3, 1]));
        let dx = g.conv_dgrad(dy, w, &[2, 24, 7, 7], ConvAttrs::new(2).with_padding(&[1, 1]));
        out(&mut g, dx, F16);
        g.desc_mut(dx).strides = crate::graph::strides_for_order(&[2, 24, 7, 7], &[0, 2, 3, 1]);
        v.push(Case::new(name, g));
    }
    {
        let name = "overlap_conv_wgrad_f16".to_string();
        let mut g = Graph::new(name.clone());
        let xd = [2, 16, 8, 8];
        let x = g.tensor(t("x", &xd, &nhwc_overlap(xd, 8, 16), F16));
        let dy = g.tensor(TensorDesc::new("dy", &[2, 32, 8, 8], F16).with_layout(&[0, 2, 3, 1]));
        let dw = g.conv_wgrad(dy, x, &[32, 16, 3, 3], ConvAttrs::new(2).with_padding(&[1, 1]));
        out(&mut g, dw, F32);
        g.desc_mut(dw).strides = crate::graph::strides_for_order(&[32, 16, 3, 3], &[0, 2, 3, 1]);
        v.push(Case::new(name, g));
    }
    // NCHW f32 with rows overlapping.
    {
        let name = "overlap_conv_fprop_nchw_f32".to_string();
        let mut g = Graph::new(name.clone());
        let x = g.tensor(t("x", &[2, 3, 7, 9], &[40, 20, 4, 1], F32));
        let w = g.tensor(TensorDesc::new("w", &[5, 3, 3, 3], F32));
        let y = g.conv_fprop(x, w, ConvAttrs::new(2).with_stride(&[2, 1]));
        out(&mut g, y, F32);
        v.push(Case::new(name, g));
    }
    v
}

fn pointwise() -> Vec<Case> {
    use DataType::{F16, F32};
    let mut v = Vec::new();
    // a (transposed and expanded) + b (overlapping rows), f16 and f32.
    for dt in [F16, F32] {
        let name = format!("overlap_pointwise_add_{dt}");
        let mut g = Graph::new(name.clone());
        let a = g.tensor(t("a", &[4, 64, 48], &[0, 1, 64], dt));
        let b = g.tensor(t("b", &[4, 64, 48], &[256, 8, 1], dt));
        let s = g.add(a, b);
        let y = g.relu(s);
        out(&mut g, y, dt);
        v.push(Case::new(name, g));
    }
    // A unary op on a view where every element is the same one.
    let name = "overlap_pointwise_all_one_element".to_string();
    let mut g = Graph::new(name.clone());
    let a = g.tensor(t("a", &[5, 7, 3], &[0, 0, 0], F32));
    let y = g.pointwise(crate::graph::ops::pointwise::PointwiseMode::Exp, &[a]);
    out(&mut g, y, F32);
    v.push(Case::new(name, g));
    v
}

fn norms() -> Vec<Case> {
    use DataType::{Bf16, F16, F32};
    let mut v = Vec::new();
    // Layernorm over rows that overlap (each row 512 wide, 256 apart), scale and bias expanded.
    for dt in [F16, F32] {
        let name = format!("overlap_layernorm_{dt}");
        let mut g = Graph::new(name.clone()).intermediate_data_type(F32).compute_data_type(F32);
        let x = g.tensor(t("x", &[24, 512], &[256, 1], dt));
        let s = g.tensor(TensorDesc::new("scale", &[1, 512], dt));
        let b = g.tensor(t("bias", &[1, 512], &[512, 0], dt));
        let (y, mean, inv) = g.layernorm(x, s, b, NormAttrs::default());
        out(&mut g, y, dt);
        for st in [mean, inv].into_iter().flatten() {
            out(&mut g, st, F32);
        }
        v.push(Case::new(name, g));
    }
    // RMSnorm on rows expanded over a batch dim (stride 0).
    {
        let name = "overlap_rmsnorm_bf16".to_string();
        let mut g = Graph::new(name.clone()).intermediate_data_type(F32).compute_data_type(F32);
        let x = g.tensor(t("x", &[3, 8, 256], &[0, 256, 1], Bf16));
        let s = g.tensor(TensorDesc::new("scale", &[1, 1, 256], Bf16));
        let (y, inv) = g.rmsnorm(x, s, None, NormAttrs::default());
        out(&mut g, y, Bf16);
        if let Some(inv) = inv {
            out(&mut g, inv, F32);
        }
        v.push(Case::new(name, g));
    }
    // Batchnorm (training) on a channels-last image whose pixels overlap.
    {
        let name = "overlap_batchnorm_f16".to_string();
        let mut g = Graph::new(name.clone()).intermediate_data_type(F32).compute_data_type(F32);
        let xd = [4, 32, 5, 5];
        let x = g.tensor(t("x", &xd, &nhwc_overlap(xd, 16, 16), F16));
        let s = g.tensor(TensorDesc::new("scale", &[1, 32, 1, 1], F32));
        let b = g.tensor(TensorDesc::new("bias", &[1, 32, 1, 1], F32));
        let (y, mean, inv, _) = g.batchnorm(x, s, b, None, &[], Default::default());
        out(&mut g, y, F16);
        g.desc_mut(y).strides = crate::graph::strides_for_order(&xd, &[0, 2, 3, 1]);
        out(&mut g, mean, F32);
        out(&mut g, inv, F32);
        v.push(Case::new(name, g));
    }
    // Softmax over overlapping rows, and a sum over an expanded axis.
    {
        let name = "overlap_softmax_f16".to_string();
        let mut g = Graph::new(name.clone());
        let x = g.tensor(t("x", &[2, 16, 96], &[0, 40, 1], F16));
        let (y, _) = g.softmax(x, 2, false, false);
        out(&mut g, y, F16);
        v.push(Case::new(name, g));
    }
    {
        let name = "overlap_reduction_sum_f32".to_string();
        let mut g = Graph::new(name.clone());
        let x = g.tensor(t("x", &[6, 10, 12], &[0, 5, 1], F32));
        let y = g.reduction(x, ReductionMode::Add, &[0]);
        out(&mut g, y, F32);
        v.push(Case::new(name, g));
    }
    v
}

pub(super) fn cases() -> Vec<Case> {
    let mut v = matmul();
    v.extend(conv());
    v.extend(pointwise());
    v.extend(norms());
    v
}

#[cfg(test)]
mod tests {
    use crate::graph::check_no_overlap;
    use crate::testing::{random_inputs, run_cpu};

    /// Every case validates, has an input whose elements share memory, and runs on the CPU
    /// engine.
    #[test]
    fn overlap_cases_have_overlapping_inputs_and_run_on_the_cpu() {
        let cases: Vec<_> = super::super::all().into_iter().filter(|c| c.name.starts_with("overlap_") || (c.name.starts_with("sdpa_") && c.name.contains("overlap"))).collect();
        assert!(cases.len() >= 20, "{} cases", cases.len());
        for c in cases {
            let mut g = c.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", c.name));
            assert!(g.input_tensors().iter().any(|&t| check_no_overlap(g.desc(t)).is_err()), "{}: no input shares memory", c.name);
            let out = run_cpu(&g, &random_inputs(&g, 3)).unwrap_or_else(|e| panic!("{}: {e}", c.name));
            assert!(!out.is_empty(), "{}", c.name);
        }
    }
}
