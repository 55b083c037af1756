//! Convolutions the GEMM kernels run (`engine/cuda/conv`): one-tap filters with unit stride, no
//! padding and one group, forward (with bias, activation and residual epilogues), data and
//! weight gradients; channels-last and packed NCHW images, 2D and 3D, odd channel counts (the
//! mma.sync path), f16, bf16 and f32. Then the implicit GEMM: filters of many taps with padding
//! (symmetric and not), stride, dilation and both modes, in 1D, 2D and 3D, forward (with its
//! epilogue), data gradient (strided too) and weight gradient, channel counts that fill 16-byte
//! vectors and counts that do not, channels-last and NCHW; grouped convolutions (`grouped_`:
//! 2 to 32 groups of 3 to 64 channels) alike; depthwise convolutions on their own kernels.

use super::Case;
use crate::graph::ops::conv::{ConvAttrs, ConvMode};
use crate::graph::TensorId;
use crate::{DataType, Graph, TensorDesc};

/// Channels-last stride order of a rank-`r` tensor: [n, spatial..., c].
fn channels_last(r: usize) -> Vec<usize> {
    let mut v = vec![0];
    v.extend(2..r);
    v.push(1);
    v
}

fn image(name: &str, dims: &[i64], dt: DataType, last: bool) -> TensorDesc {
    let d = TensorDesc::new(name, dims, dt);
    if last {
        d.with_layout(&channels_last(dims.len()))
    } else {
        d
    }
}

fn out(g: &mut Graph, id: TensorId, name: &str) {
    g.set_output(id);
    g.desc_mut(id).name = name.into();
}

/// The epilogue after a forward convolution.
#[derive(Clone, Copy, PartialEq)]
enum Epi {
    None,
    BiasRelu,
    Residual,
}

/// `y = conv(x [n, c, spatial...], w [k, c, 1...])` then `epi`.
fn fprop(x: &[i64], k: i64, dt: DataType, last: bool, epi: Epi) -> Case {
    let r = x.len();
    let tag: Vec<String> = x.iter().map(|d| d.to_string()).collect();
    let name = format!(
        "fast_conv_fprop_1x1_{}_k{k}_{}_{}{}",
        tag.join("x"),
        if last { "nhwc" } else { "nchw" },
        dt,
        match epi {
            Epi::None => "",
            Epi::BiasRelu => "_bias_relu",
            Epi::Residual => "_residual",
        }
    );
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let xt = g.tensor(image("x", x, dt, last));
    let mut wd = vec![k, x[1]];
    wd.extend(std::iter::repeat_n(1, r - 2));
    let wt = g.tensor(image("w", &wd, dt, last));
    let y = g.conv_fprop(xt, wt, ConvAttrs::new(r - 2));
    let mut yd = x.to_vec();
    yd[1] = k;
    let result = match epi {
        Epi::None => y,
        Epi::BiasRelu => {
            let mut bd = vec![1, k];
            bd.extend(std::iter::repeat_n(1, r - 2));
            let b = g.tensor(TensorDesc::new("bias", &bd, dt));
            let yb = g.bias(y, b);
            g.relu(yb)
        }
        Epi::Residual => {
            let res = g.tensor(image("res", &yd, dt, last));
            g.add(y, res)
        }
    };
    out(&mut g, result, "y");
    Case::new(name, g)
}

/// `dx = dgrad(dy [n, k, spatial...], w [k, c, 1...])`.
fn dgrad(dy: &[i64], c: i64, dt: DataType, last: bool) -> Case {
    let r = dy.len();
    let tag: Vec<String> = dy.iter().map(|d| d.to_string()).collect();
    let name = format!("fast_conv_dgrad_1x1_{}_c{c}_{}_{dt}", tag.join("x"), if last { "nhwc" } else { "nchw" });
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let dyt = g.tensor(image("dy", dy, dt, last));
    let mut wd = vec![dy[1], c];
    wd.extend(std::iter::repeat_n(1, r - 2));
    let wt = g.tensor(image("w", &wd, dt, last));
    let mut xd = dy.to_vec();
    xd[1] = c;
    let dx = g.conv_dgrad(dyt, wt, &xd, ConvAttrs::new(r - 2));
    out(&mut g, dx, "dx");
    Case::new(name, g)
}

/// `dw = wgrad(dy [n, k, spatial...], x [n, c, spatial...])`.
fn wgrad(dy: &[i64], c: i64, dt: DataType, last: bool) -> Case {
    let r = dy.len();
    let tag: Vec<String> = dy.iter().map(|d| d.to_string()).collect();
    let name = format!("fast_conv_wgrad_1x1_{}_c{c}_{}_{dt}", tag.join("x"), if last { "nhwc" } else { "nchw" });
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let dyt = g.tensor(image("dy", dy, dt, last));
    let mut xd = dy.to_vec();
    xd[1] = c;
    let xt = g.tensor(image("x", &xd, dt, last));
    let mut wd = vec![dy[1], c];
    wd.extend(std::iter::repeat_n(1, r - 2));
    let dw = g.conv_wgrad(dyt, xt, &wd, ConvAttrs::new(r - 2));
    out(&mut g, dw, "dw");
    Case::new(name, g)
}

/// Which convolution an implicit-GEMM case runs.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Fprop,
    Dgrad,
    Wgrad,
}

/// A convolution of image `x` by filter `w` (`[k, c, taps...]`) with `attrs`: the forward one
/// (with a bias + relu epilogue when `bias_relu`), or its data or weight gradient.
#[allow(clippy::too_many_arguments)]
fn implicit(kind: Kind, what: &str, x: &[i64], w: &[i64], attrs: ConvAttrs, dt: DataType, last: bool, bias_relu: bool) -> Case {
    let op = match kind {
        Kind::Fprop => "fprop",
        Kind::Dgrad => "dgrad",
        Kind::Wgrad => "wgrad",
    };
    let name = format!("fast_conv_{op}_{what}_{}_{dt}{}", if last { "nhwc" } else { "nchw" }, if bias_relu { "_bias_relu" } else { "" });
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let y_dims = attrs.forward_dims(x, w, "x", "w").unwrap_or_else(|e| panic!("{name}: {e}"));
    let (result, port) = match kind {
        Kind::Fprop => {
            let xt = g.tensor(image("x", x, dt, last));
            let wt = g.tensor(image("w", w, dt, last));
            let y = g.conv_fprop(xt, wt, attrs);
            if bias_relu {
                let mut bd = vec![1, w[0]];
                bd.extend(std::iter::repeat_n(1, x.len() - 2));
                let b = g.tensor(TensorDesc::new("bias", &bd, dt));
                let yb = g.bias(y, b);
                (g.relu(yb), "y")
            } else {
                (y, "y")
            }
        }
        Kind::Dgrad => {
            let dyt = g.tensor(image("dy", &y_dims, dt, last));
            let wt = g.tensor(image("w", w, dt, last));
            (g.conv_dgrad(dyt, wt, x, attrs), "dx")
        }
        Kind::Wgrad => {
            let dyt = g.tensor(image("dy", &y_dims, dt, last));
            let xt = g.tensor(image("x", x, dt, last));
            (g.conv_wgrad(dyt, xt, w, attrs), "dw")
        }
    };
    out(&mut g, result, port);
    Case::new(name, g)
}

/// The implicit-GEMM cases.
fn implicit_cases() -> Vec<Case> {
    use Kind::*;
    let (f16, bf16, f32) = (DataType::F16, DataType::Bf16, DataType::F32);
    let p2 = |p: [i64; 2]| ConvAttrs::new(2).with_padding(&p);
    let strided = |s: [i64; 2], p: [i64; 2]| ConvAttrs::new(2).with_padding(&p).with_stride(&s);
    let asym = || ConvAttrs::new(2).with_pre_padding(&[0, 2]).with_post_padding(&[1, 0]);
    let dil = || ConvAttrs::new(2).with_padding(&[2, 1]).with_dilation(&[2, 1]);
    let mirrored = || ConvAttrs::new(2).with_padding(&[1, 0]).with_mode(ConvMode::Convolution);
    let audio = || ConvAttrs::new(1).with_padding(&[3]).with_stride(&[5]);
    let video = || ConvAttrs::new(3).with_padding(&[1, 1, 1]);
    vec![
        implicit(Fprop, "3x3", &[3, 16, 9, 11], &[24, 16, 3, 3], p2([1, 1]), f16, true, true),
        implicit(Fprop, "3x3", &[2, 32, 13, 7], &[40, 32, 3, 3], p2([1, 1]), bf16, true, false),
        implicit(Fprop, "3x3_stride2", &[2, 24, 15, 14], &[16, 24, 3, 3], strided([2, 2], [1, 1]), f16, true, false),
        implicit(Fprop, "7x7_stride2_c3", &[2, 3, 23, 21], &[16, 3, 7, 7], strided([2, 2], [3, 3]), f16, true, true),
        implicit(Fprop, "3x5_asym_pad_c12", &[2, 12, 9, 10], &[20, 12, 3, 5], asym(), f16, true, false),
        implicit(Fprop, "3x3_dilation", &[2, 8, 11, 9], &[8, 8, 3, 3], dil(), bf16, true, false),
        implicit(Fprop, "3x2_convolution_mode", &[2, 16, 7, 6], &[8, 16, 3, 2], mirrored(), f16, true, false),
        implicit(Fprop, "3x3", &[2, 6, 9, 11], &[5, 6, 3, 3], p2([1, 1]), f32, false, true),
        implicit(Fprop, "3x3", &[3, 8, 7, 5], &[6, 8, 3, 3], p2([0, 1]), f16, false, false),
        implicit(Fprop, "1d_k10_stride5", &[2, 8, 163], &[16, 8, 10], audio(), f16, true, false),
        implicit(Fprop, "3d_3x3x3", &[2, 8, 5, 6, 7], &[16, 8, 3, 3, 3], video(), bf16, true, true),
        // 64-channel multiples: on Hopper the image is read by im2col TMA loads.
        implicit(Fprop, "3x3_c64", &[3, 64, 9, 11], &[40, 64, 3, 3], p2([1, 1]), f16, true, true),
        implicit(
            Fprop,
            "3x3_stride2_asym_c128",
            &[2, 128, 13, 10],
            &[72, 128, 3, 3],
            ConvAttrs::new(2).with_pre_padding(&[1, 0]).with_post_padding(&[0, 2]).with_stride(&[2, 2]),
            bf16,
            true,
            false,
        ),
        implicit(Fprop, "3x3_dilation2_c64", &[2, 64, 12, 9], &[64, 64, 3, 3], ConvAttrs::new(2).with_padding(&[2, 2]).with_dilation(&[2, 2]), f16, true, false),
        implicit(Fprop, "1x5_pad_c64", &[3, 64, 7, 9], &[24, 64, 1, 5], p2([0, 2]), bf16, true, true),
        implicit(Fprop, "1d_k5_stride2_c64", &[2, 64, 37], &[48, 64, 5], ConvAttrs::new(1).with_padding(&[2]).with_stride(&[2]), f16, true, false),
        implicit(Fprop, "3d_3x3x3_c64", &[2, 64, 4, 5, 6], &[32, 64, 3, 3, 3], video(), f16, true, true),
        // f32 as tf32 with channels in 32s: im2col loads on Hopper too.
        implicit(Fprop, "3x3_c64", &[3, 64, 9, 11], &[40, 64, 3, 3], p2([1, 1]), f32, true, true),
        implicit(Fprop, "3x3_stride2_c32", &[2, 32, 13, 10], &[24, 32, 3, 3], strided([2, 2], [1, 1]), f32, true, false),
        // The CPU's direct kernel: more input channels than one filter chunk (113 for 3x3), output
        // channels past a block of 64 that end mid-vector, written in place (channels-last f32,
        // no epilogue), through the epilogue, and to NCHW with a stride that meets the borders;
        // NCHW rows and channels of 16 and more (the vector transposes) with ragged ends.
        implicit(Fprop, "3x3_c130_k100", &[2, 130, 9, 7], &[100, 130, 3, 3], p2([1, 1]), f32, true, false),
        implicit(Fprop, "3x3_c130_k100", &[2, 130, 9, 7], &[100, 130, 3, 3], p2([1, 1]), f32, true, true),
        implicit(Fprop, "3x3_stride2_c120_k72", &[3, 120, 11, 10], &[72, 120, 3, 3], strided([2, 2], [1, 1]), f32, false, false),
        implicit(Fprop, "3x3_c35_k40_w20", &[2, 35, 17, 20], &[40, 35, 3, 3], p2([1, 1]), f32, false, false),
        implicit(Dgrad, "3x3", &[3, 16, 9, 11], &[24, 16, 3, 3], p2([1, 1]), f16, true, false),
        implicit(Dgrad, "3x3_stride2", &[2, 24, 15, 14], &[16, 24, 3, 3], strided([2, 2], [1, 1]), bf16, true, false),
        // 64-output-channel multiples: on Hopper dy is read by im2col TMA loads (taps mirrored)
        // and the filter by 3-D TMA.
        implicit(Dgrad, "3x3_k64", &[3, 40, 9, 11], &[64, 40, 3, 3], p2([1, 1]), f16, true, false),
        implicit(Dgrad, "3x5_asym_convolution_mode_k64", &[2, 24, 9, 10], &[64, 24, 3, 5], asym().with_mode(ConvMode::Convolution), bf16, true, false),
        implicit(Dgrad, "3x3_dilation2_k128", &[2, 64, 12, 9], &[128, 64, 3, 3], ConvAttrs::new(2).with_padding(&[2, 2]).with_dilation(&[2, 2]), f16, true, false),
        implicit(Dgrad, "1d_k5_k64", &[2, 32, 37], &[64, 32, 5], ConvAttrs::new(1).with_padding(&[2]), bf16, true, false),
        implicit(Dgrad, "3d_3x3x3_k64", &[2, 16, 4, 5, 6], &[64, 16, 3, 3, 3], video(), f16, true, false),
        implicit(Dgrad, "3x5_asym_pad_convolution_mode", &[2, 8, 9, 10], &[16, 8, 3, 5], asym().with_mode(ConvMode::Convolution), f16, true, false),
        implicit(
            Dgrad,
            "3x3_stride2_dilation",
            &[2, 5, 13, 11],
            &[7, 5, 3, 3],
            ConvAttrs::new(2).with_pre_padding(&[2, 1]).with_post_padding(&[1, 2]).with_stride(&[2, 3]).with_dilation(&[2, 1]),
            f32,
            false,
            false,
        ),
        implicit(Dgrad, "3d_3x3x3", &[2, 8, 5, 6, 7], &[16, 8, 3, 3, 3], video(), f16, true, false),
        // Strided data gradients by sub-pixel phases (conv/phase.rs): odd extents (phases of
        // unequal pixels), a 1x1 filter (phases no tap reaches: zeros), NCHW dx, a mirrored 5x5
        // of strides 3 and 2, asymmetric padding, 1D and 3D.
        implicit(Dgrad, "3x3_stride2_phases_c64", &[2, 64, 15, 14], &[48, 64, 3, 3], strided([2, 2], [1, 1]), f16, true, false),
        // (dy's channels in 64s: read by im2col TMA loads on Hopper, the filter's phase taps by
        // TMA where a phase has one.)
        implicit(Dgrad, "3x3_stride2_phases_k128", &[2, 64, 15, 14], &[128, 64, 3, 3], strided([2, 2], [1, 1]), f16, true, false),
        implicit(Dgrad, "1x1_stride2_phases", &[2, 32, 14, 13], &[64, 32, 1, 1], strided([2, 2], [0, 0]), bf16, true, false),
        implicit(Dgrad, "3x3_stride2_phases_nchw", &[2, 32, 11, 10], &[24, 32, 3, 3], strided([2, 2], [1, 1]), f32, false, false),
        implicit(Dgrad, "5x5_stride3x2_convolution_mode_phases", &[2, 16, 13, 11], &[32, 16, 5, 5], strided([3, 2], [2, 1]).with_mode(ConvMode::Convolution), f16, true, false),
        implicit(
            Dgrad,
            "3x3_stride2_asym_phases_c128",
            &[2, 128, 13, 10],
            &[72, 128, 3, 3],
            ConvAttrs::new(2).with_pre_padding(&[1, 0]).with_post_padding(&[0, 2]).with_stride(&[2, 2]),
            bf16,
            true,
            false,
        ),
        implicit(Dgrad, "1d_k4_stride2_phases", &[2, 32, 37], &[16, 32, 4], ConvAttrs::new(1).with_padding(&[1]).with_stride(&[2]), f16, true, false),
        implicit(Dgrad, "3d_stride2_phases", &[2, 16, 5, 6, 7], &[32, 16, 3, 3, 3], ConvAttrs::new(3).with_padding(&[1, 1, 1]).with_stride(&[2, 2, 2]), bf16, true, false),
        implicit(Wgrad, "3x3", &[3, 16, 9, 11], &[24, 16, 3, 3], p2([1, 1]), f16, true, false),
        // 64-channel multiples: on Hopper x^T is read by im2col TMA loads.
        implicit(Wgrad, "3x3_c64", &[3, 64, 9, 11], &[40, 64, 3, 3], p2([1, 1]), f16, true, false),
        implicit(
            Wgrad,
            "3x3_stride2_asym_c128",
            &[2, 128, 13, 10],
            &[72, 128, 3, 3],
            ConvAttrs::new(2).with_pre_padding(&[1, 0]).with_post_padding(&[0, 2]).with_stride(&[2, 2]),
            bf16,
            true,
            false,
        ),
        implicit(Wgrad, "3x3_dilation2_c64", &[2, 64, 12, 9], &[16, 64, 3, 3], ConvAttrs::new(2).with_padding(&[2, 2]).with_dilation(&[2, 2]), f16, true, false),
        implicit(Wgrad, "1d_k5_stride2_c64", &[2, 64, 37], &[48, 64, 5], ConvAttrs::new(1).with_padding(&[2]).with_stride(&[2]), bf16, true, false),
        implicit(Wgrad, "3d_3x3x3_c64", &[2, 64, 4, 5, 6], &[32, 64, 3, 3, 3], video(), f16, true, false),
        // Enough pixels to split the reduction: dw^T's partial sums reduced into a column-major dw.
        implicit(Wgrad, "3x3_c64_split", &[4, 64, 24, 20], &[32, 64, 3, 3], p2([1, 1]), f16, true, false),
        implicit(Wgrad, "3x3_c24_split", &[3, 24, 22, 19], &[16, 24, 3, 3], p2([1, 1]), bf16, true, false),
        // K of 128 or more over few pixels: dw stored row-major (not as dw^T).
        implicit(Wgrad, "3x3_k128_few_pixels", &[2, 64, 9, 11], &[128, 64, 3, 3], p2([1, 1]), f16, true, false),
        implicit(Wgrad, "3x3_stride2", &[2, 24, 15, 14], &[16, 24, 3, 3], strided([2, 2], [1, 1]), bf16, true, false),
        implicit(Wgrad, "7x7_stride2_c3", &[2, 3, 23, 21], &[16, 3, 7, 7], strided([2, 2], [3, 3]), f16, true, false),
        implicit(Wgrad, "3x3", &[2, 6, 9, 11], &[5, 6, 3, 3], p2([1, 1]), f32, false, false),
        implicit(Wgrad, "1d_k10_stride5", &[2, 8, 163], &[16, 8, 10], audio(), bf16, true, false),
        // Image channels short of a 16-byte vector: padded in a staged copy (forward, weight
        // gradient); data gradients of fewer than 16 channels as dcol + col2im (stage.rs).
        implicit(Dgrad, "7x7_stride2_c3", &[2, 3, 23, 21], &[16, 3, 7, 7], strided([2, 2], [3, 3]), f16, true, false),
        implicit(Fprop, "7x7_stride2_c3", &[2, 3, 23, 21], &[16, 3, 7, 7], strided([2, 2], [3, 3]), f32, true, false),
        implicit(Fprop, "5x5_c3", &[3, 3, 17, 19], &[8, 3, 5, 5], p2([2, 2]), bf16, false, false),
        implicit(Fprop, "4x4_stride4_c3", &[2, 3, 32, 28], &[24, 3, 4, 4], strided([4, 4], [0, 0]), f16, true, true),
        implicit(Wgrad, "4x4_stride4_c3", &[2, 3, 32, 28], &[24, 3, 4, 4], strided([4, 4], [0, 0]), f16, true, false),
        implicit(Wgrad, "5x5_c3", &[3, 3, 17, 19], &[8, 3, 5, 5], p2([2, 2]), bf16, false, false),
        implicit(Dgrad, "3x3_stride2_c12", &[2, 12, 15, 14], &[24, 12, 3, 3], strided([2, 2], [1, 1]), bf16, true, false),
        implicit(Dgrad, "3x3_dilation_convolution_mode_c3", &[2, 3, 11, 9], &[8, 3, 3, 3], dil().with_mode(ConvMode::Convolution), f16, true, false),
        implicit(Fprop, "5x5_stride2_convolution_mode_c3", &[2, 3, 17, 20], &[8, 3, 5, 5], strided([2, 2], [2, 1]).with_mode(ConvMode::Convolution), f16, true, true),
        implicit(Wgrad, "5x5_stride2_convolution_mode_c3", &[2, 3, 17, 20], &[8, 3, 5, 5], strided([2, 2], [2, 1]).with_mode(ConvMode::Convolution), bf16, false, false),
        implicit(Fprop, "1d_k7_stride3_c5", &[3, 5, 61], &[12, 5, 7], ConvAttrs::new(1).with_padding(&[3]).with_stride(&[3]), bf16, true, false),
        implicit(Fprop, "3d_3x3x3_c3", &[2, 3, 5, 6, 7], &[16, 3, 3, 3, 3], video(), f16, true, false),
        implicit(Dgrad, "3d_3x3x3_c3", &[2, 3, 5, 6, 7], &[16, 3, 3, 3, 3], video(), bf16, true, false),
        implicit(Wgrad, "3d_3x3x3_c3", &[2, 3, 5, 6, 7], &[16, 3, 3, 3, 3], video(), f16, true, false),
    ]
}

/// The grouped cases: the implicit GEMM with the groups as its batch (`engine/cuda/conv/
/// implicit.rs`; those of at most 16 channels a group and 144 MACs an output, strided data
/// gradients apart, on the small-group kernels), ResNeXt-like groups of 4 to 32 channels (32
/// groups), a few large groups (2 or 4: on Hopper groups of 64 channels read by im2col TMA
/// loads), 3-channel groups; 3x3 with stride 1 and 2, 1x1, dilation, asymmetric padding, both
/// modes; 1D, 2D, 3D; channels-last and NCHW; f16, bf16, f32. Each name says
/// `grouped_g{groups}_c{image channels a group}_k{output channels a group}`.
fn grouped_cases() -> Vec<Case> {
    use Kind::*;
    let (f16, bf16, f32) = (DataType::F16, DataType::Bf16, DataType::F32);
    let p2 = |p: [i64; 2]| ConvAttrs::new(2).with_padding(&p);
    let strided = |s: [i64; 2], p: [i64; 2]| ConvAttrs::new(2).with_padding(&p).with_stride(&s);
    let asym = || ConvAttrs::new(2).with_pre_padding(&[0, 2]).with_post_padding(&[1, 0]);
    let dil2 = || ConvAttrs::new(2).with_padding(&[2, 2]).with_dilation(&[2, 2]);
    let video = || ConvAttrs::new(3).with_padding(&[1, 1, 1]);
    // (kind, shape tag, x dims, groups, filters, filter taps, attrs, type, channels-last, bias + relu)
    type Shape = (Kind, &'static str, Vec<i64>, i64, i64, Vec<i64>, ConvAttrs, DataType, bool, bool);
    let shapes: Vec<Shape> = vec![
        // Forward.
        (Fprop, "3x3", vec![2, 128, 9, 11], 32, 128, vec![3, 3], p2([1, 1]), f16, true, true),
        (Fprop, "3x3_stride2", vec![2, 256, 13, 10], 32, 256, vec![3, 3], strided([2, 2], [1, 1]), bf16, true, false),
        (Fprop, "3x3", vec![2, 512, 5, 6], 32, 512, vec![3, 3], p2([1, 1]), f16, true, true),
        (Fprop, "3x3", vec![2, 256, 7, 7], 8, 256, vec![3, 3], p2([1, 1]), f16, true, true),
        (Fprop, "3x3_dilation2", vec![2, 64, 12, 9], 4, 96, vec![3, 3], dil2(), f16, true, false),
        // (Enough tiles for the mma.sync kernel's narrow ones: 16 and 32 columns.)
        (Fprop, "3x3_28x28", vec![4, 128, 28, 28], 32, 128, vec![3, 3], p2([1, 1]), f16, true, true),
        (Fprop, "3x3", vec![2, 128, 9, 11], 2, 128, vec![3, 3], p2([1, 1]), f16, true, true),
        (Fprop, "3x3_stride2_asym", vec![2, 128, 13, 10], 2, 80, vec![3, 3], asym().with_stride(&[2, 2]), bf16, true, false),
        (Fprop, "3x2_convolution_mode", vec![2, 16, 7, 6], 2, 16, vec![3, 2], p2([1, 0]).with_mode(ConvMode::Convolution), f16, true, false),
        (Fprop, "1x1", vec![2, 16, 7, 9], 2, 32, vec![1, 1], ConvAttrs::new(2), f16, true, true),
        // (Runs of 2 or 4 16-bit channels, 2 f32: the mma.sync kernel's 4- and 8-byte vectors.)
        (Fprop, "3x3", vec![2, 8, 9, 11], 4, 8, vec![3, 3], p2([1, 1]), bf16, true, false),
        (Fprop, "3x3", vec![2, 12, 7, 9], 4, 20, vec![3, 3], p2([1, 1]), f32, false, true),
        (Fprop, "3x3", vec![2, 64, 7, 6], 4, 64, vec![3, 3], p2([1, 0]), f16, false, false),
        (Fprop, "3x3", vec![2, 128, 6, 7], 32, 128, vec![3, 3], p2([1, 1]), f32, true, false),
        (Fprop, "1d_k5_stride2", vec![2, 32, 37], 4, 32, vec![5], ConvAttrs::new(1).with_padding(&[2]).with_stride(&[2]), f16, true, false),
        (Fprop, "3d_3x3x3", vec![2, 16, 4, 5, 6], 2, 32, vec![3, 3, 3], video(), bf16, true, true),
        // (Groups of few channels past the small-group kernels' 144 MACs an output: the GEMM
        // packing 4 groups of 4 channels.)
        (Fprop, "7x7", vec![2, 32, 11, 9], 8, 32, vec![7, 7], p2([3, 3]), f16, true, true),
        // (RegNet-like: 9 groups of 16, packed 3 to a GEMM of 48 columns.)
        (Fprop, "3x3", vec![2, 144, 9, 11], 9, 144, vec![3, 3], p2([1, 1]), f16, true, true),
        // Data gradient.
        (Dgrad, "3x3", vec![2, 144, 9, 11], 9, 144, vec![3, 3], p2([1, 1]), bf16, true, false),
        (Dgrad, "3x3", vec![2, 128, 9, 11], 32, 128, vec![3, 3], p2([1, 1]), f16, true, false),
        (Dgrad, "3x3", vec![2, 256, 7, 8], 32, 256, vec![3, 3], p2([1, 1]), bf16, true, false),
        (Dgrad, "3x3", vec![2, 64, 9, 11], 4, 256, vec![3, 3], p2([1, 1]), f16, true, false),
        (Dgrad, "3x3_28x28", vec![4, 128, 28, 28], 32, 128, vec![3, 3], p2([1, 1]), f16, true, false),
        (Dgrad, "3x3_28x28", vec![3, 192, 28, 28], 8, 128, vec![3, 3], p2([1, 1]), bf16, false, false),
        (Dgrad, "3x3_stride2", vec![2, 128, 13, 10], 2, 128, vec![3, 3], strided([2, 2], [1, 1]), bf16, true, false),
        // (Strided: on the GEMM, 4 groups of 4 filters packed.)
        (Dgrad, "3x3_stride2", vec![2, 128, 13, 10], 32, 128, vec![3, 3], strided([2, 2], [1, 1]), f16, true, false),
        (Dgrad, "3x5_asym_convolution_mode", vec![2, 32, 9, 10], 4, 32, vec![3, 5], asym().with_mode(ConvMode::Convolution), f16, true, false),
        (Dgrad, "3x3_dilation2", vec![2, 6, 9, 10], 2, 8, vec![3, 3], dil2(), f32, false, false),
        (Dgrad, "3x3", vec![2, 12, 7, 9], 6, 12, vec![3, 3], p2([1, 1]), f32, true, false),
        (Dgrad, "1d_k3_dilation2", vec![2, 32, 29], 4, 32, vec![3], ConvAttrs::new(1).with_padding(&[2]).with_dilation(&[2]), bf16, true, false),
        (Dgrad, "3d_3x3x3", vec![2, 16, 4, 5, 6], 2, 32, vec![3, 3, 3], video(), f16, true, false),
        // Weight gradient.
        (Wgrad, "3x3", vec![2, 128, 9, 11], 32, 128, vec![3, 3], p2([1, 1]), f16, true, false),
        (Wgrad, "3x3", vec![2, 256, 7, 7], 8, 256, vec![3, 3], p2([1, 1]), f16, true, false),
        (Wgrad, "3x3", vec![2, 128, 9, 11], 2, 80, vec![3, 3], p2([1, 1]), f16, true, false),
        (Wgrad, "3x3_stride2", vec![2, 64, 13, 10], 4, 256, vec![3, 3], strided([2, 2], [1, 1]), bf16, true, false),
        (Wgrad, "1x1", vec![2, 16, 7, 9], 2, 128, vec![1, 1], ConvAttrs::new(2), f16, true, false),
        (Wgrad, "3x3", vec![2, 12, 7, 9], 4, 20, vec![3, 3], p2([1, 1]), f32, false, false),
        (Wgrad, "3x3", vec![2, 12, 9, 11], 2, 8, vec![3, 3], p2([1, 1]), f16, true, false),
        (Wgrad, "3x3_asym", vec![2, 32, 9, 10], 4, 32, vec![3, 3], asym(), bf16, false, false),
        (Wgrad, "1d_k5_stride2", vec![2, 32, 37], 4, 32, vec![5], ConvAttrs::new(1).with_padding(&[2]).with_stride(&[2]), bf16, true, false),
        (Wgrad, "3d_3x3x3", vec![2, 16, 4, 5, 6], 2, 32, vec![3, 3, 3], video(), f16, true, false),
    ];
    shapes
        .into_iter()
        .map(|(kind, tag, x, groups, k, taps, attrs, dt, last, bias_relu)| {
            let mut w = vec![k, x[1] / groups];
            w.extend(&taps);
            let what = format!("grouped_g{groups}_c{}_k{}_{tag}", x[1] / groups, k / groups);
            implicit(kind, &what, &x, &w, attrs, dt, last, bias_relu)
        })
        .collect()
}

/// The small-group cases: grouped convolutions of 1 to 16 channels a group, up to 8 on the direct
/// kernels (`engine/cuda/conv/smallgroup.rs`, more on the implicit GEMM), forward (with bias + relu fused), data gradient
/// of unit stride and weight gradient: odd output channels a group, odd sizes, stride 2, dilation, asymmetric padding,
/// convolution mode, 1D/2D/3D, channels-last (16-byte vectors where the channels allow, else
/// element-wise) and NCHW, f16, bf16, f32; rows wider than one tile (250 columns), and enough
/// tiles that the weight gradient's blocks take several each. Each name says
/// `smallgroup_g{groups}_c{image channels a group}_k{output channels a group}`.
fn smallgroup_cases() -> Vec<Case> {
    use Kind::*;
    let (f16, bf16, f32) = (DataType::F16, DataType::Bf16, DataType::F32);
    let p2 = |p: [i64; 2]| ConvAttrs::new(2).with_padding(&p);
    let strided = |s: [i64; 2], p: [i64; 2]| ConvAttrs::new(2).with_padding(&p).with_stride(&s);
    let asym_dil = || ConvAttrs::new(2).with_pre_padding(&[2, 1]).with_post_padding(&[1, 3]).with_dilation(&[2, 2]);
    let mirrored = || ConvAttrs::new(2).with_padding(&[2, 1]).with_mode(ConvMode::Convolution);
    let video = || ConvAttrs::new(3).with_padding(&[1, 1, 1]);
    let video_strided = || ConvAttrs::new(3).with_padding(&[1, 0, 1]).with_stride(&[1, 2, 1]);
    let audio = || ConvAttrs::new(1).with_padding(&[2]).with_stride(&[2]);
    // (kinds, shape tag, x dims, groups, filters, filter taps, attrs, type, channels-last, bias + relu)
    type Shape = (&'static [Kind], &'static str, Vec<i64>, i64, i64, Vec<i64>, ConvAttrs, DataType, bool, bool);
    let both: &'static [Kind] = &[Fprop, Wgrad];
    let all: &'static [Kind] = &[Fprop, Dgrad, Wgrad];
    let shapes: Vec<Shape> = vec![
        // One channel a group (a depthwise convolution with multiplier 3).
        (all, "3x3", vec![2, 8, 9, 11], 8, 24, vec![3, 3], p2([1, 1]), f16, true, false),
        (both, "3x3_stride2", vec![2, 10, 13, 12], 5, 15, vec![3, 3], strided([2, 2], [1, 1]), f16, true, false),
        (all, "3x3_dilation2_asym_pad", vec![2, 12, 11, 13], 4, 20, vec![3, 3], asym_dil(), bf16, true, false),
        (&[Fprop], "3x3", vec![2, 32, 9, 11], 8, 32, vec![3, 3], p2([1, 1]), f16, true, true),
        (&[Wgrad], "3x3", vec![2, 32, 9, 11], 8, 32, vec![3, 3], p2([1, 1]), f16, true, false),
        (all, "3x3", vec![2, 30, 7, 9], 6, 42, vec![3, 3], p2([1, 1]), f32, false, false),
        (all, "5x3_convolution_mode", vec![2, 24, 9, 8], 4, 12, vec![5, 3], mirrored(), f16, true, false),
        (all, "3x3", vec![2, 21, 7, 10], 3, 15, vec![3, 3], p2([1, 0]), bf16, true, false),
        (&[Fprop], "3x3", vec![2, 104, 14, 14], 13, 104, vec![3, 3], p2([1, 1]), f16, true, true),
        (&[Wgrad], "3x3", vec![2, 104, 14, 14], 13, 104, vec![3, 3], p2([1, 1]), bf16, true, false),
        (both, "3x3_stride2x1", vec![2, 18, 11, 10], 2, 22, vec![3, 3], strided([2, 1], [1, 1]), f32, true, false),
        (both, "1d_k5_stride2", vec![2, 40, 37], 4, 20, vec![5], audio(), bf16, true, false),
        (&[Fprop], "3x3", vec![2, 144, 7, 9], 9, 144, vec![3, 3], p2([1, 1]), f16, true, true),
        (&[Wgrad], "3x3", vec![2, 144, 7, 9], 9, 144, vec![3, 3], p2([1, 1]), f16, true, false),
        (all, "3x3", vec![1, 30, 5, 7], 2, 6, vec![3, 3], p2([1, 1]), f16, false, false),
        (&[Fprop], "3d_3x3x3", vec![2, 16, 4, 5, 6], 4, 12, vec![3, 3, 3], video(), f16, true, true),
        (&[Wgrad], "3d_3x3x3", vec![2, 16, 4, 5, 6], 4, 12, vec![3, 3, 3], video(), f32, true, false),
        (&[Dgrad], "3d_3x3x3", vec![2, 16, 4, 5, 6], 4, 12, vec![3, 3, 3], video(), bf16, true, false),
        (&[Dgrad], "3x3", vec![2, 104, 14, 14], 13, 104, vec![3, 3], p2([1, 1]), f16, true, false),
        (&[Dgrad], "1d_k5_dilation2", vec![2, 40, 37], 4, 20, vec![5], ConvAttrs::new(1).with_padding(&[3]).with_dilation(&[2]), f32, true, false),
        (both, "3d_3x3x3_stride2", vec![2, 16, 5, 6, 7], 8, 40, vec![3, 3, 3], video_strided(), bf16, true, false),
        (all, "3x3_250_wide", vec![1, 64, 3, 250], 16, 64, vec![3, 3], p2([1, 1]), f16, true, false),
        (all, "3x3_24x20", vec![4, 64, 24, 20], 16, 64, vec![3, 3], p2([1, 1]), f16, true, false),
        (both, "3x3_stride2", vec![2, 96, 15, 14], 8, 88, vec![3, 3], strided([2, 2], [1, 1]), bf16, true, false),
    ];
    let mut v = Vec::new();
    for (kinds, tag, x, groups, k, taps, attrs, dt, last, bias_relu) in shapes {
        let mut w = vec![k, x[1] / groups];
        w.extend(&taps);
        let what = format!("smallgroup_g{groups}_c{}_k{}_{tag}", x[1] / groups, k / groups);
        for &kind in kinds {
            v.push(implicit(kind, &what, &x, &w, attrs.clone(), dt, last, bias_relu && kind == Fprop));
        }
    }
    // A residual epilogue (y = conv(x) + res), bf16, and an f32 output of f16 inputs.
    let name = "fast_conv_fprop_smallgroup_g8_c4_k4_3x3_nhwc_bf16_residual";
    let mut g = Graph::new(name).io_data_type(bf16);
    let xt = g.tensor(image("x", &[2, 32, 9, 11], bf16, true));
    let wt = g.tensor(image("w", &[32, 4, 3, 3], bf16, true));
    let res = g.tensor(image("res", &[2, 32, 9, 11], bf16, true));
    let y = g.conv_fprop(xt, wt, p2([1, 1]));
    let z = g.add(y, res);
    out(&mut g, z, "y");
    v.push(Case::new(name, g));
    let name = "fast_conv_fprop_smallgroup_g4_c4_k4_3x3_nhwc_f16_out_f32";
    let mut g = Graph::new(name).io_data_type(f16);
    let xt = g.tensor(image("x", &[2, 16, 7, 9], f16, true));
    let wt = g.tensor(image("w", &[16, 4, 3, 3], f16, true));
    let y = g.conv_fprop(xt, wt, p2([1, 1]));
    out(&mut g, y, "y");
    g.desc_mut(y).data_type = Some(f32);
    v.push(Case::new(name, g));
    v
}

/// The depthwise cases (`engine/cuda/conv/depthwise.rs`): filter `[C * M, 1, taps...]`, each
/// convolution forward, data gradient and weight gradient.
fn depthwise_cases() -> Vec<Case> {
    use Kind::*;
    let (f16, bf16, f32) = (DataType::F16, DataType::Bf16, DataType::F32);
    let a2 = || ConvAttrs::new(2);
    // (what, x dims, multiplier, attrs, type, channels-last)
    let shapes: Vec<(&str, Vec<i64>, Vec<i64>, i64, ConvAttrs, DataType, bool)> = vec![
        ("3x3_c32", vec![2, 32, 9, 11], vec![3, 3], 1, a2().with_padding(&[1, 1]), f16, true),
        ("3x3_stride2_c24", vec![2, 24, 15, 14], vec![3, 3], 1, a2().with_padding(&[1, 1]).with_stride(&[2, 2]), bf16, true),
        ("5x5_dilation2_asym_pad_c13", vec![2, 13, 13, 12], vec![5, 5], 1, a2().with_pre_padding(&[3, 4]).with_post_padding(&[2, 1]).with_dilation(&[2, 2]), f32, true),
        ("3x3_m2_convolution_mode_c5", vec![2, 5, 8, 9], vec![3, 3], 2, a2().with_padding(&[1, 1]).with_mode(ConvMode::Convolution), f16, false),
        ("7x7_m2_c24", vec![2, 24, 11, 10], vec![7, 7], 2, a2().with_padding(&[3, 3]), f16, true),
        ("3x3_stride2_asym_pad_c13", vec![3, 13, 11, 9], vec![3, 3], 1, a2().with_pre_padding(&[1, 0]).with_post_padding(&[0, 1]).with_stride(&[2, 2]), f32, false),
        (
            "3x3_stride2x3_dilation_convolution_mode_c32",
            vec![2, 32, 14, 17],
            vec![3, 3],
            1,
            a2().with_padding(&[2, 1]).with_stride(&[2, 3]).with_dilation(&[1, 2]).with_mode(ConvMode::Convolution),
            bf16,
            true,
        ),
        ("3x3_c24", vec![2, 24, 7, 9], vec![3, 3], 1, a2().with_padding(&[1, 1]), bf16, false),
        ("1d_k5_stride2_c32", vec![2, 32, 37], vec![5], 1, ConvAttrs::new(1).with_padding(&[2]).with_stride(&[2]), f32, true),
        ("3d_3x3x3_c16", vec![2, 16, 5, 6, 7], vec![3, 3, 3], 1, ConvAttrs::new(3).with_padding(&[1, 1, 1]), bf16, true),
        ("3d_3x3x3_m2_c5", vec![2, 5, 4, 5, 6], vec![3, 3, 3], 2, ConvAttrs::new(3).with_padding(&[1, 0, 1]).with_stride(&[1, 2, 1]), f16, true),
    ];
    let mut v = Vec::new();
    for (what, x, taps, m, attrs, dt, last) in shapes {
        let mut w = vec![x[1] * m, 1];
        w.extend(&taps);
        let what = format!("depthwise_{what}");
        for kind in [Fprop, Dgrad, Wgrad] {
            v.push(implicit(kind, &what, &x, &w, attrs.clone(), dt, last, false));
        }
    }
    v
}

/// What follows an 8-bit integer forward convolution.
#[derive(Clone, Copy, PartialEq)]
enum IntEpi {
    /// The exact i32 sums (or the type given).
    None,
    /// An identity node computing in i32 (cudnn-frontend's int8 sample).
    Identity,
    /// Quantized inference: per-channel f32 scale, f32 bias, relu, stored as i8 (rounded, saturated).
    Requant,
}

/// `y = conv(x, w)` on 8-bit integers (`xt`, `wt`: i8 or u8), then `epi`, stored as `out`.
#[allow(clippy::too_many_arguments)]
fn int8(what: &str, x: &[i64], w: &[i64], attrs: ConvAttrs, xt: DataType, wt: DataType, last: bool, epi: IntEpi, out_type: DataType) -> Case {
    let tag = match epi {
        IntEpi::None => "",
        IntEpi::Identity => "_identity",
        IntEpi::Requant => "_requant",
    };
    let name = format!("fast_conv_fprop_int8_{what}_{}_{xt}x{wt}_{out_type}{tag}", if last { "nhwc" } else { "nchw" });
    let mut g = Graph::new(name.clone()).io_data_type(xt);
    let xi = g.tensor(image("x", x, xt, last));
    let wi = g.tensor(image("w", w, wt, last));
    let y = g.conv_fprop(xi, wi, attrs);
    let result = match epi {
        IntEpi::None => y,
        IntEpi::Identity => {
            g.desc_mut(y).data_type = Some(DataType::I32);
            let id = g.identity(y);
            let n = g.nodes.len() - 1;
            g.nodes[n].compute_data_type = Some(DataType::I32);
            id
        }
        IntEpi::Requant => {
            g.desc_mut(y).data_type = Some(DataType::I32);
            let mut cd = vec![1, w[0]];
            cd.extend(std::iter::repeat_n(1, x.len() - 2));
            let scale = g.tensor(TensorDesc::new("scale", &cd, DataType::F32));
            let bias = g.tensor(TensorDesc::new("bias", &cd, DataType::F32));
            let s = g.mul(y, scale);
            let b = g.bias(s, bias);
            g.relu(b)
        }
    };
    out(&mut g, result, "y");
    g.desc_mut(result).data_type = Some(out_type);
    Case::new(name, g)
}

/// 8-bit integer forward convolutions (i8 x i8, u8 x i8: the tensor cores' integer mma, exact
/// i32 sums): 128-, 16-, 8- and 4-byte channel runs and single channels, NCHW (element loads), a 1x1
/// layer with a long reduction (split), grouped, 3D, and the stores: i32, i8 (saturated), f32,
/// an i32 identity, and the requantizing epilogue.
fn int8_cases() -> Vec<Case> {
    use DataType::{Bf16, F32, I32, I8, U8};
    use IntEpi::*;
    let p = |n: usize, v: i64| ConvAttrs::new(n).with_padding(&vec![v; n]);
    let strided = |s: i64, pad: i64| ConvAttrs::new(2).with_padding(&[pad, pad]).with_stride(&[s, s]);
    vec![
        int8("3x3_c64_k40", &[2, 64, 13, 11], &[40, 64, 3, 3], p(2, 1), I8, I8, true, None, I32),
        int8("3x3_c24_k20_s2", &[3, 24, 15, 13], &[20, 24, 3, 3], strided(2, 1), U8, I8, true, None, I32),
        int8("3x3_c12_k16", &[2, 12, 9, 10], &[16, 12, 3, 3], p(2, 1), I8, U8, true, None, I32),
        int8("7x7_c3_k16_s2", &[2, 3, 23, 21], &[16, 3, 7, 7], strided(2, 3), U8, I8, true, None, I32),
        int8("3x3_c16_k24", &[2, 16, 9, 11], &[24, 16, 3, 3], p(2, 1), I8, I8, false, None, I32),
        int8("1x1_c96_k72", &[2, 96, 9, 7], &[72, 96, 1, 1], p(2, 0), I8, I8, true, None, I32),
        int8("1x1_c2048_k48", &[2, 2048, 3, 3], &[48, 2048, 1, 1], p(2, 0), I8, I8, true, None, I32),
        int8("3x3_c512_k64", &[1, 512, 5, 5], &[64, 512, 3, 3], p(2, 1), I8, I8, true, None, I32),
        // (128-byte channel runs: on Hopper the image by im2col TMA loads, the wgmma kernel.)
        int8("3x3_c128_k72_s2", &[2, 128, 13, 11], &[72, 128, 3, 3], strided(2, 1), I8, I8, true, None, I32),
        int8("3x3_c256_k40", &[2, 256, 7, 9], &[40, 256, 3, 3], p(2, 1), U8, I8, true, Requant, I8),
        int8("grouped_g4_c16_k16", &[2, 64, 9, 9], &[64, 16, 3, 3], p(2, 1), I8, I8, true, None, I32),
        int8("3d_c16_k24", &[2, 16, 4, 5, 6], &[24, 16, 3, 3, 3], p(3, 1), I8, I8, true, None, I32),
        int8("3x3_c32_k24", &[2, 32, 9, 7], &[24, 32, 3, 3], p(2, 1), I8, I8, true, None, I8),
        int8("3x3_c32_k24", &[2, 32, 9, 7], &[24, 32, 3, 3], p(2, 1), I8, I8, true, None, F32),
        int8("3x3_c32_k24", &[2, 32, 9, 7], &[24, 32, 3, 3], p(2, 1), I8, I8, true, Identity, I32),
        int8("3x3_c48_k40", &[2, 48, 9, 7], &[40, 48, 3, 3], p(2, 1), I8, I8, true, Requant, I8),
        int8("3x3_c48_k40", &[2, 48, 9, 7], &[40, 48, 3, 3], p(2, 1), U8, I8, true, Requant, Bf16),
    ]
}

pub(super) fn cases() -> Vec<Case> {
    let (f16, bf16, f32) = (DataType::F16, DataType::Bf16, DataType::F32);
    let mut v = vec![
        fprop(&[3, 24, 7, 9], 40, f16, true, Epi::BiasRelu),
        fprop(&[3, 24, 7, 9], 40, bf16, true, Epi::Residual),
        fprop(&[2, 32, 15, 17], 64, bf16, true, Epi::None),
        fprop(&[2, 16, 5, 11], 24, f32, false, Epi::BiasRelu),
        fprop(&[2, 16, 5, 11], 24, f16, false, Epi::None),
        // NCHW f32 with output channels in 8s and images of 128 pixels or more (the CPU's kernel
        // with pixels in the vector lanes): ragged pixel vectors, a second block of 64 output
        // channels, input channels in two chunks; and a 7x7 image (packed to channels-last).
        fprop(&[2, 37, 9, 15], 24, f32, false, Epi::None),
        fprop(&[3, 20, 12, 11], 72, f32, false, Epi::None),
        fprop(&[1, 300, 8, 16], 8, f32, false, Epi::None),
        fprop(&[3, 20, 7, 7], 72, f32, false, Epi::None),
        // Images under 128 pixels packed to channels-last 16 pixels at a time across the rows
        // (45 pixels: a ragged last block; 37 channels: 16-channel transposes and the rest),
        // the filter's input channels one apart (its 16 x 16 transposes, 72 output channels:
        // a ragged second block of 64), and the output stored along whole images; a 1x1
        // channels-last layer of a small filter over 3 blocks of 64 output channels (the work
        // items pixel block by pixel block).
        fprop(&[3, 37, 5, 9], 72, f32, false, Epi::None),
        fprop(&[2, 48, 7, 7], 136, f32, false, Epi::None),
        fprop(&[2, 24, 20, 21], 136, f32, true, Epi::None),
        fprop(&[3, 13, 5, 7], 19, f16, true, Epi::BiasRelu),
        fprop(&[2, 16, 3, 4, 5], 8, f16, true, Epi::None),
        fprop(&[2, 8, 33], 16, bf16, true, Epi::BiasRelu),
        dgrad(&[3, 40, 7, 9], 24, f16, true),
        dgrad(&[2, 24, 5, 11], 16, f32, false),
        dgrad(&[3, 19, 5, 7], 13, bf16, true),
        wgrad(&[3, 40, 7, 9], 24, f16, true),
        wgrad(&[1, 24, 5, 11], 16, f32, false),
        wgrad(&[3, 19, 5, 7], 13, bf16, true),
    ];
    v.extend(implicit_cases());
    v.extend(int8_cases());
    v.extend(grouped_cases());
    v.extend(smallgroup_cases());
    v.extend(depthwise_cases());
    v
}

#[cfg(test)]
mod tests {
    use crate::engine::cuda::kernel::{Options, Target};
    use crate::engine::cuda::planner::{plan, Family};
    use crate::graph::ops::Op;
    use crate::testing::{random_inputs, run_cpu};

    /// Every case validates and runs on the CPU, and on sm_90a and sm_80 the convolution (with
    /// its epilogue) plans as one conv-family unit: on the GEMM kernels; for the depthwise cases
    /// on the depthwise kernels; and for grouped convolutions of few channels a group and
    /// 144 MACs an output (depthwise ones with a channel multiplier among them), forward and
    /// weight gradients and data gradients of unit stride, on the small-group kernels (at most
    /// `MAX_CG` channels a group).
    #[test]
    fn convolutions_plan_on_the_gemm_kernels() {
        for c in super::cases() {
            let mut g = c.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", c.name));
            run_cpu(&g, &random_inputs(&g, 5)).unwrap_or_else(|e| panic!("{}: {e}", c.name));
            let conv = g.nodes.iter().position(|n| crate::engine::cuda::conv::conv_op(&n.op)).unwrap();
            let node = &g.nodes[conv];
            let w = node.input("w").or(node.output("dw")).unwrap();
            let wd = &g.desc(w).dims;
            let groups = g.desc(node.input("x").or(node.output("dx")).unwrap()).dims[1] / wd[1];
            let (Op::ConvFprop(a) | Op::ConvDgrad(a) | Op::ConvWgrad(a)) = &node.op else { unreachable!() };
            let dgrad = matches!(node.op, Op::ConvDgrad(_));
            // The channels a group each output sums over (dy's for the data gradient), and taps.
            let (red, taps) = (if dgrad { wd[0] / groups } else { wd[1] }, wd[2..].iter().product::<i64>());
            let grouped = c.name.contains("grouped") || c.name.contains("smallgroup") || (c.name.contains("depthwise") && wd[0] / groups >= 2);
            let max_cg = crate::engine::cuda::conv::smallgroup::MAX_CG;
            let small = grouped && red <= max_cg && red * taps <= 144 && (!dgrad || a.stride.iter().all(|&s| s == 1));
            if c.name.contains("smallgroup") && red <= max_cg {
                assert!(small, "{}: not a small-group convolution", c.name);
            }
            for target in [Target::sm90a(), Target::sm80()] {
                let planned = plan(&g, &target, &Options::default(), true).unwrap();
                assert_eq!(planned.len(), 1, "{} ({}): {} units", c.name, target.arch, planned.len());
                assert_eq!(planned[0].family, Family::Conv, "{} ({})", c.name, target.arch);
                let kernel = if small {
                    "sg_conv"
                } else if c.name.contains("depthwise") {
                    "dw_conv"
                } else {
                    "gemm"
                };
                assert!(planned[0].unit.kernels.launches.iter().any(|l| l.entry.contains(kernel)), "{} ({}): {:?}", c.name, target.arch, planned[0].declined);
            }
        }
    }
}
