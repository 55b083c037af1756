//! Convolutions the GEMM kernels run (`engine/cuda/conv`): one-tap filters with unit stride, no
//! padding and one group, forward (with bias, activation and residual epilogues), data and
//! weight gradients; channels-last and packed NCHW images, 2D and 3D, odd channel counts (the
//! mma.sync path), f16, bf16 and f32.

use super::Case;
use crate::graph::ops::conv::ConvAttrs;
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

pub(super) fn cases() -> Vec<Case> {
    let (f16, bf16, f32) = (DataType::F16, DataType::Bf16, DataType::F32);
    vec![
        fprop(&[3, 24, 7, 9], 40, f16, true, Epi::BiasRelu),
        fprop(&[3, 24, 7, 9], 40, bf16, true, Epi::Residual),
        fprop(&[2, 32, 15, 17], 64, bf16, true, Epi::None),
        fprop(&[2, 16, 5, 11], 24, f32, false, Epi::BiasRelu),
        fprop(&[2, 16, 5, 11], 24, f16, false, Epi::None),
        fprop(&[3, 13, 5, 7], 19, f16, true, Epi::BiasRelu),
        fprop(&[2, 16, 3, 4, 5], 8, f16, true, Epi::None),
        fprop(&[2, 8, 33], 16, bf16, true, Epi::BiasRelu),
        dgrad(&[3, 40, 7, 9], 24, f16, true),
        dgrad(&[2, 24, 5, 11], 16, f32, false),
        dgrad(&[3, 19, 5, 7], 13, bf16, true),
        wgrad(&[3, 40, 7, 9], 24, f16, true),
        wgrad(&[1, 24, 5, 11], 16, f32, false),
        wgrad(&[3, 19, 5, 7], 13, bf16, true),
    ]
}

#[cfg(test)]
mod tests {
    use crate::engine::cuda::kernel::{Options, Target};
    use crate::engine::cuda::planner::{plan, Family};
    use crate::testing::{random_inputs, run_cpu};

    /// Every case validates and runs on the CPU, and on sm_90a and sm_80 the convolution (with
    /// its epilogue) plans as one GEMM-family unit.
    #[test]
    fn one_tap_convolutions_plan_on_the_gemm_kernels() {
        for c in super::cases() {
            let mut g = c.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", c.name));
            run_cpu(&g, &random_inputs(&g, 5)).unwrap_or_else(|e| panic!("{}: {e}", c.name));
            for target in [Target::sm90a(), Target::sm80()] {
                let planned = plan(&g, &target, &Options::default(), true).unwrap();
                assert_eq!(planned.len(), 1, "{} ({}): {} units", c.name, target.arch, planned.len());
                assert_eq!(planned[0].family, Family::Conv, "{} ({})", c.name, target.arch);
                assert!(planned[0].unit.kernels.launches.iter().any(|l| l.entry.contains("gemm")), "{} ({})", c.name, target.arch);
            }
        }
    }
}
