//! Convolution cases: fprop, dgrad and wgrad in 1D, 2D and 3D; grouped and depthwise;
//! symmetric and asymmetric padding; stride and dilation; both modes; NCHW, NHWC, NDHWC and
//! padded strides; f32, f16, bf16, f64 and fp8 inputs (fp8 writes f32 by default).

use super::Case;
use crate::graph::ops::conv::{ConvAttrs, ConvMode};
use crate::{DataType, Graph, TensorDesc};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Fprop,
    Dgrad,
    Wgrad,
}

/// Channels-last stride order of a rank-`r` tensor: [n, spatial..., c].
fn channels_last(r: usize) -> Vec<usize> {
    let mut v = vec![0];
    v.extend(2..r);
    v.push(1);
    v
}

/// How the image-like inputs are laid out.
#[derive(Clone, Copy, PartialEq)]
enum Layout {
    /// Packed NC(D)HW.
    First,
    /// Packed N(D)HWC (filters too).
    Last,
    /// NC(D)HW with the innermost row padded by 2 elements (non-contiguous).
    Padded,
}

fn desc(name: &str, dims: &[i64], dt: DataType, layout: Layout) -> TensorDesc {
    let d = TensorDesc::new(name, dims, dt);
    match layout {
        Layout::First => d,
        Layout::Last => d.with_layout(&channels_last(dims.len())),
        Layout::Padded => {
            let mut strides = vec![1i64; dims.len()];
            let mut s = dims[dims.len() - 1] + 2;
            for a in (0..dims.len() - 1).rev() {
                strides[a] = s;
                s *= dims[a];
            }
            d.with_strides(&strides)
        }
    }
}

/// One conv node: image dims `x`, filter dims `w`, inputs of type `dt` (the filter `wdt`),
/// output type `out` when given.
#[allow(clippy::too_many_arguments)]
fn case(kind: Kind, what: &str, x: &[i64], w: &[i64], attrs: ConvAttrs, dt: DataType, wdt: DataType, layout: Layout, out: Option<DataType>) -> Case {
    let op = match kind {
        Kind::Fprop => "conv_fprop",
        Kind::Dgrad => "conv_dgrad",
        Kind::Wgrad => "conv_wgrad",
    };
    let name = format!("{op}_{what}_{dt}");
    let mut g = Graph::new(name.clone());
    let y_dims = attrs.forward_dims(x, w, "x", "w").unwrap_or_else(|e| panic!("{name}: {e}"));
    let o = match kind {
        Kind::Fprop => {
            let xt = g.tensor(desc("x", x, dt, layout));
            let wt = g.tensor(desc("w", w, wdt, if layout == Layout::Last { Layout::Last } else { Layout::First }));
            g.conv_fprop(xt, wt, attrs)
        }
        Kind::Dgrad => {
            let dyt = g.tensor(desc("dy", &y_dims, dt, layout));
            let wt = g.tensor(desc("w", w, wdt, if layout == Layout::Last { Layout::Last } else { Layout::First }));
            g.conv_dgrad(dyt, wt, x, attrs)
        }
        Kind::Wgrad => {
            let dyt = g.tensor(desc("dy", &y_dims, dt, layout));
            let xt = g.tensor(desc("x", x, wdt, layout));
            g.conv_wgrad(dyt, xt, w, attrs)
        }
    };
    g.set_output(o);
    g.desc_mut(o).name = "out".into();
    if let Some(t) = out {
        g.desc_mut(o).data_type = Some(t);
    }
    Case::new(name, g)
}

pub(super) fn cases() -> Vec<Case> {
    use DataType::*;
    use Kind::*;
    use Layout::*;
    let a1 = |p: i64| ConvAttrs::new(1).with_padding(&[p]);
    let a2 = |p: [i64; 2]| ConvAttrs::new(2).with_padding(&p);
    let a3 = |p: [i64; 3]| ConvAttrs::new(3).with_padding(&p);
    let asym = || ConvAttrs::new(2).with_pre_padding(&[0, 2]).with_post_padding(&[1, 0]);
    let sd = || ConvAttrs::new(2).with_pre_padding(&[2, 1]).with_post_padding(&[1, 2]).with_stride(&[2, 3]).with_dilation(&[2, 1]);
    let conv_mode = || ConvAttrs::new(2).with_padding(&[1, 0]).with_mode(ConvMode::Convolution);
    let mut v = Vec::new();

    // fprop
    v.push(case(Fprop, "1d", &[3, 5, 13], &[7, 5, 3], a1(1), F32, F32, First, None));
    // One-channel audio (a speech front end: kernel 10, stride 5), on the implicit GEMM with the
    // image staged in 8 channels; its filter [K, 1, 10] only looks depthwise.
    let audio = || ConvAttrs::new(1).with_padding(&[0]).with_stride(&[5]);
    v.push(case(Fprop, "1d_nwc_one_channel", &[3, 1, 203], &[24, 1, 10], audio(), F16, F16, Last, None));
    v.push(case(Dgrad, "1d_nwc_one_channel", &[3, 1, 203], &[24, 1, 10], audio(), F16, F16, Last, None));
    v.push(case(Wgrad, "1d_nwc_one_channel", &[3, 1, 203], &[24, 1, 10], audio(), Bf16, Bf16, Last, None));
    v.push(case(Fprop, "1d_stride_dilation", &[2, 4, 17], &[6, 2, 3], ConvAttrs::new(1).with_padding(&[2]).with_stride(&[3]).with_dilation(&[2]), F16, F16, First, None));
    for dt in [F32, F16, Bf16, F64] {
        v.push(case(Fprop, "2d", &[2, 6, 9, 11], &[5, 6, 3, 3], a2([1, 1]), dt, dt, First, None));
    }
    v.push(case(Fprop, "2d_grouped", &[2, 6, 7, 9], &[9, 2, 3, 3], a2([1, 1]), F16, F16, First, None));
    v.push(case(Fprop, "2d_depthwise", &[2, 5, 9, 7], &[10, 1, 3, 3], a2([1, 1]), Bf16, Bf16, First, None));
    v.push(case(Fprop, "2d_asym_pad", &[2, 3, 7, 9], &[4, 3, 3, 5], asym(), F32, F32, First, None));
    v.push(case(Fprop, "2d_stride_dilation", &[2, 3, 13, 11], &[5, 3, 3, 3], sd(), F64, F64, First, None));
    v.push(case(Fprop, "2d_convolution_mode", &[2, 3, 7, 6], &[4, 3, 3, 2], conv_mode(), F32, F32, First, None));
    v.push(case(Fprop, "2d_nhwc", &[2, 6, 7, 9], &[5, 6, 3, 3], a2([1, 1]).with_stride(&[2, 1]), F16, F16, Last, None));
    v.push(case(Fprop, "2d_nhwc_grouped", &[3, 8, 5, 7], &[6, 4, 3, 3], a2([1, 0]), F32, F32, Last, None));
    v.push(case(Fprop, "2d_padded_strides", &[2, 3, 5, 7], &[4, 3, 3, 3], a2([1, 1]), F32, F32, Padded, None));
    // Rows that do not follow each other, 16 channels and more, 17 columns: the CPU's direct
    // kernel packs and stores such images a row at a time.
    v.push(case(Fprop, "2d_padded_strides_c20", &[2, 20, 5, 17], &[24, 20, 3, 3], a2([1, 1]), F32, F32, Padded, None));
    v.push(case(Fprop, "2d_mixed_f16_filter", &[2, 3, 7, 5], &[4, 3, 3, 3], a2([1, 1]), F32, F16, First, None));
    v.push(case(Fprop, "2d_out_f32", &[2, 3, 7, 5], &[4, 3, 3, 3], a2([0, 1]), Bf16, Bf16, First, Some(F32)));
    v.push(case(Fprop, "2d_fp8", &[2, 4, 7, 9], &[5, 4, 3, 3], a2([1, 1]), Fp8E4m3, Fp8E4m3, First, None));
    v.push(case(Fprop, "2d_fp8", &[2, 4, 7, 9], &[5, 4, 3, 3], a2([1, 1]), Fp8E5m2, Fp8E4m3, Last, None));
    v.push(case(Fprop, "3d", &[2, 3, 5, 6, 7], &[4, 3, 3, 2, 3], a3([1, 0, 1]), F32, F32, First, None));
    v.push(case(Fprop, "3d_ndhwc_grouped", &[2, 4, 5, 7, 6], &[6, 2, 3, 3, 3], a3([1, 1, 1]).with_stride(&[2, 1, 2]), Bf16, Bf16, Last, None));
    let conv_mode_3d = a3([1, 2, 0]).with_dilation(&[2, 1, 3]).with_mode(ConvMode::Convolution);
    v.push(case(Fprop, "3d_convolution_mode_dilation", &[1, 3, 7, 5, 6], &[2, 3, 2, 3, 2], conv_mode_3d, F64, F64, First, None));
    // Compute types other than f32: inputs rounded to bf16 (f32 tensors), or not at all (f64).
    let mut c = case(Fprop, "2d_compute_bf16", &[2, 3, 7, 5], &[4, 3, 3, 3], a2([1, 1]), F32, F32, First, None);
    c.graph.nodes[0].compute_data_type = Some(Bf16);
    v.push(c);
    let mut c = case(Dgrad, "2d_compute_f64", &[2, 3, 7, 5], &[4, 3, 3, 3], a2([1, 1]), F32, F32, First, None);
    c.graph.nodes[0].compute_data_type = Some(F64);
    v.push(c);

    // dgrad
    v.push(case(Dgrad, "1d_grouped_dilation", &[2, 6, 13], &[4, 3, 3], a1(2).with_dilation(&[2]), F16, F16, First, None));
    v.push(case(Dgrad, "2d_stride", &[2, 5, 9, 8], &[7, 5, 3, 3], a2([1, 1]).with_stride(&[2, 2]), F32, F32, First, None));
    v.push(case(Dgrad, "2d_stride_dilation", &[2, 3, 13, 11], &[5, 3, 3, 3], sd(), F64, F64, First, None));
    v.push(case(Dgrad, "2d_asym_pad_convolution_mode", &[2, 3, 7, 9], &[4, 3, 3, 5], asym().with_mode(ConvMode::Convolution), Bf16, Bf16, First, None));
    v.push(case(Dgrad, "2d_nhwc_depthwise", &[2, 6, 7, 5], &[6, 1, 3, 3], a2([1, 1]).with_stride(&[1, 2]), F16, F16, Last, None));
    v.push(case(Dgrad, "2d_fp8", &[2, 4, 7, 9], &[5, 4, 3, 3], a2([1, 1]), Fp8E4m3, Fp8E4m3, First, None));
    v.push(case(Dgrad, "3d_ndhwc", &[2, 3, 5, 6, 5], &[4, 3, 3, 3, 2], a3([1, 1, 0]).with_stride(&[2, 1, 1]), F32, F32, Last, None));

    // wgrad
    v.push(case(Wgrad, "1d_asym_pad", &[3, 4, 15], &[5, 4, 4], ConvAttrs::new(1).with_pre_padding(&[0]).with_post_padding(&[3]).with_stride(&[2]), F64, F64, First, None));
    v.push(case(Wgrad, "2d_stride", &[2, 5, 9, 8], &[7, 5, 3, 3], a2([1, 1]).with_stride(&[2, 2]), F32, F32, First, None));
    v.push(case(Wgrad, "2d_stride_dilation", &[2, 3, 13, 11], &[5, 3, 3, 3], sd(), F16, F16, Padded, None));
    v.push(case(Wgrad, "2d_convolution_mode", &[2, 3, 7, 6], &[4, 3, 3, 2], conv_mode(), Bf16, Bf16, First, None));
    v.push(case(Wgrad, "2d_nhwc_depthwise", &[3, 6, 7, 5], &[12, 1, 3, 3], a2([1, 1]), F16, F16, Last, None));
    v.push(case(Wgrad, "2d_grouped", &[2, 6, 5, 7], &[9, 2, 3, 3], a2([0, 1]), F32, F32, First, None));
    v.push(case(Wgrad, "2d_fp8", &[2, 4, 7, 9], &[5, 4, 3, 3], a2([1, 1]), Fp8E5m2, Fp8E5m2, First, None));
    v.push(case(Wgrad, "3d_ndhwc_dilation", &[2, 3, 6, 5, 7], &[4, 3, 2, 3, 3], a3([1, 1, 1]).with_dilation(&[2, 1, 2]), F32, F32, Last, None));
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn conv_cases_validate_and_run_on_cpu() {
        for c in super::cases() {
            let mut g = c.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", c.name));
            let inputs = crate::testing::random_inputs(&g, 1);
            crate::testing::run_cpu(&g, &inputs).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        }
    }
}
