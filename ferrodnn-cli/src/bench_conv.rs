//! The convolution suite: ResNet-50 layers (fp16, channels-last, batch 32) forward (plain and
//! with bias + relu), data and weight gradients, on the GEMM kernels (1x1 layers as a GEMM over
//! views of the tensors, the others as an implicit GEMM); then depthwise layers (MobileNet-v2's
//! 3x3, ConvNeXt-T's 7x7) on the depthwise kernels, ResNeXt-50 32x4d's grouped 3x3 layers (4
//! channels a group on the small-group kernels, 32 on the implicit GEMM with the groups as its
//! batch), RegNetY's grouped 3x3 (8 and 16 channels a group) and a depthwise 3x3 with a channel
//! multiplier of 2; a 3D 3x3x3 video layer and a 1D speech front end (kernel 10, stride 5);
//! int8 forward layers (i8 in, i32 out).

use crate::bench::Workload;
use ferrodnn::graph::ops::conv::ConvAttrs;
use ferrodnn::{DataType, Graph, TensorDesc};

const NHWC: [usize; 4] = [0, 2, 3, 1];

/// One layer: image `n x c x hw x hw`, `k` filters of `r x r`, stride `s`, padding `(r - 1) / 2`;
/// depthwise (`dw`: groups = c, filter `[k, 1, r, r]`), or `groups` groups (filter
/// `[k, c / groups, r, r]`).
struct Layer {
    c: i64,
    k: i64,
    hw: i64,
    r: i64,
    s: i64,
    dw: bool,
    groups: i64,
}

impl Layer {
    fn attrs(&self) -> ConvAttrs {
        let p = (self.r - 1) / 2;
        ConvAttrs::new(2).with_padding(&[p, p]).with_stride(&[self.s, self.s])
    }
    fn out_hw(&self) -> i64 {
        let p = (self.r - 1) / 2;
        (self.hw + 2 * p - self.r) / self.s + 1
    }
    fn tag(&self, n: i64) -> String {
        format!("{n}x{}x{}x{}_k{}_{}x{}s{}", self.c, self.hw, self.hw, self.k, self.r, self.r, self.s)
    }
    /// Filter channels: 1 for depthwise, else c a group.
    fn fc(&self) -> i64 {
        if self.dw {
            1
        } else {
            self.c / self.groups
        }
    }
    /// The id's part after the op: `_depthwise` for depthwise, `_grouped<g>` for `g` groups.
    fn kind(&self) -> String {
        if self.dw {
            "_depthwise".into()
        } else if self.groups > 1 {
            format!("_grouped{}", self.groups)
        } else {
            String::new()
        }
    }
    fn flops(&self, n: i64) -> u64 {
        2 * (n * self.k * self.out_hw() * self.out_hw() * self.fc() * self.r * self.r) as u64
    }
}

fn desc(name: &str, dims: &[i64], dt: DataType) -> TensorDesc {
    TensorDesc::new(name, dims, dt).with_layout(&NHWC)
}

/// The type's part of an id: fp16, bf16, tf32 (f32 tensors, whose plans multiply as tf32) or
/// int8 (i8 tensors, i32 output).
fn dt_tag(dt: DataType) -> &'static str {
    match dt {
        DataType::Bf16 => "bf16",
        DataType::F32 => "tf32",
        DataType::I8 => "int8",
        _ => "fp16",
    }
}

fn fprop(n: i64, l: &Layer, bias_relu: bool) -> Workload {
    fprop_as(n, l, bias_relu, DataType::F16)
}

fn fprop_as(n: i64, l: &Layer, bias_relu: bool, dt: DataType) -> Workload {
    let id = format!("conv_fprop{}{}_{}_nhwc_{}", if bias_relu { "_bias_relu" } else { "" }, l.kind(), dt_tag(dt), l.tag(n));
    let mut g = Graph::new(id.clone()).io_data_type(dt);
    let x = g.tensor(desc("x", &[n, l.c, l.hw, l.hw], dt));
    let w = g.tensor(desc("w", &[l.k, l.fc(), l.r, l.r], dt));
    let mut y = g.conv_fprop(x, w, l.attrs());
    if bias_relu {
        let b = g.tensor(TensorDesc::new("bias", &[1, l.k, 1, 1], dt));
        let yb = g.bias(y, b);
        y = g.relu(yb);
    }
    g.set_output(y);
    Workload { id, graph: g, flops: Some(l.flops(n)) }
}

fn dgrad(n: i64, l: &Layer) -> Workload {
    dgrad_as(n, l, DataType::F16)
}

fn dgrad_as(n: i64, l: &Layer, dt: DataType) -> Workload {
    let id = format!("conv_dgrad{}_{}_nhwc_{}", l.kind(), dt_tag(dt), l.tag(n));
    let mut g = Graph::new(id.clone()).io_data_type(dt);
    let dy = g.tensor(desc("dy", &[n, l.k, l.out_hw(), l.out_hw()], dt));
    let w = g.tensor(desc("w", &[l.k, l.fc(), l.r, l.r], dt));
    let dx = g.conv_dgrad(dy, w, &[n, l.c, l.hw, l.hw], l.attrs());
    g.set_output(dx);
    Workload { id, graph: g, flops: Some(l.flops(n)) }
}

fn wgrad(n: i64, l: &Layer) -> Workload {
    wgrad_as(n, l, DataType::F16)
}

fn wgrad_as(n: i64, l: &Layer, dt: DataType) -> Workload {
    let id = format!("conv_wgrad{}_{}_nhwc_{}", l.kind(), dt_tag(dt), l.tag(n));
    let mut g = Graph::new(id.clone()).io_data_type(dt);
    let dy = g.tensor(desc("dy", &[n, l.k, l.out_hw(), l.out_hw()], dt));
    let x = g.tensor(desc("x", &[n, l.c, l.hw, l.hw], dt));
    let dw = g.conv_wgrad(dy, x, &[l.k, l.fc(), l.r, l.r], l.attrs());
    g.set_output(dw);
    Workload { id, graph: g, flops: Some(l.flops(n)) }
}

/// A convolution of 1 or 3 spatial dims, channels-last, fp16: image `[n, c, spatial...]`, `k`
/// filters of `taps`, one stride and padding `(s, p)` for every dim; forward, data or weight gradient.
/// Its id: `conv_<op>_fp16_<nwc|ndhwc>_<n>x<c>x<spatial>_k<k>_<taps>s<s>p<p>`.
fn conv_nd(op: &str, n: i64, c: i64, k: i64, spatial: &[i64], taps: &[i64], (s, p): (i64, i64)) -> Workload {
    let dt = DataType::F16;
    let rank = spatial.len();
    let join = |v: &[i64]| v.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x");
    let layout_name = if rank == 1 { "nwc" } else { "ndhwc" };
    let id = format!("conv_{op}_fp16_{layout_name}_{n}x{c}x{}_k{k}_{}s{s}p{p}", join(spatial), join(taps));
    let layout: Vec<usize> = std::iter::once(0).chain(2..rank + 2).chain(std::iter::once(1)).collect();
    let nd = |name: &str, dims: Vec<i64>| TensorDesc::new(name, &dims, dt).with_layout(&layout);
    let attrs = ConvAttrs::new(rank).with_padding(&vec![p; rank]).with_stride(&vec![s; rank]);
    let out: Vec<i64> = spatial.iter().zip(taps).map(|(&d, &t)| (d + 2 * p - t) / s + 1).collect();
    let cat = |a: i64, b: i64, rest: &[i64]| [a, b].iter().chain(rest).copied().collect::<Vec<i64>>();
    let (xd, wd, yd) = (cat(n, c, spatial), cat(k, c, taps), cat(n, k, &out));
    let mut g = Graph::new(id.clone()).io_data_type(dt);
    let result = match op {
        "fprop" => {
            let (x, w) = (g.tensor(nd("x", xd)), g.tensor(nd("w", wd)));
            g.conv_fprop(x, w, attrs)
        }
        "dgrad" => {
            let (dy, w) = (g.tensor(nd("dy", yd)), g.tensor(nd("w", wd)));
            g.conv_dgrad(dy, w, &xd, attrs)
        }
        _ => {
            let (dy, x) = (g.tensor(nd("dy", yd)), g.tensor(nd("x", xd)));
            g.conv_wgrad(dy, x, &wd, attrs)
        }
    };
    g.set_output(result);
    let flops = 2 * (n * k * out.iter().product::<i64>() * c * taps.iter().product::<i64>()) as u64;
    Workload { id, graph: g, flops: Some(flops) }
}

pub fn conv_workloads() -> Vec<Workload> {
    let n = 32;
    // The layers of issue 26's table: the 7x7/2 stem, a 3x3 and a 1x1 of stage 1, a 3x3 of
    // stage 3, a 1x1 of stage 4; each forward, data and weight gradient, and forward with its
    // bias and relu. Then two more 1x1 layers with the epilogue.
    let layers = [
        Layer { c: 3, k: 64, hw: 224, r: 7, s: 2, dw: false, groups: 1 },
        Layer { c: 64, k: 64, hw: 56, r: 3, s: 1, dw: false, groups: 1 },
        Layer { c: 256, k: 64, hw: 56, r: 1, s: 1, dw: false, groups: 1 },
        Layer { c: 256, k: 256, hw: 14, r: 3, s: 1, dw: false, groups: 1 },
        Layer { c: 512, k: 2048, hw: 7, r: 1, s: 1, dw: false, groups: 1 },
    ];
    let mut v = Vec::new();
    for l in &layers {
        v.extend([fprop(n, l, false), fprop(n, l, true), dgrad(n, l), wgrad(n, l)]);
    }
    v.push(fprop(n, &Layer { c: 64, k: 256, hw: 56, r: 1, s: 1, dw: false, groups: 1 }, true));
    v.push(fprop(n, &Layer { c: 1024, k: 256, hw: 14, r: 1, s: 1, dw: false, groups: 1 }, true));
    // Beyond the table: ResNet-50's strided 3x3 (stage 2's first block), batch-1 inference, and
    // a diffusion UNet's 3x3 layers (batch 2, 320-1280 channels at 64x64 to 8x8).
    let strided = Layer { c: 128, k: 128, hw: 56, r: 3, s: 2, dw: false, groups: 1 };
    v.extend([fprop(n, &strided, false), dgrad(n, &strided), wgrad(n, &strided)]);
    for l in [Layer { c: 64, k: 64, hw: 56, r: 3, s: 1, dw: false, groups: 1 }, Layer { c: 256, k: 256, hw: 14, r: 3, s: 1, dw: false, groups: 1 }] {
        v.push(fprop(1, &l, true));
    }
    for (c, hw) in [(320, 64), (640, 32), (1280, 16), (1280, 8)] {
        let l = Layer { c, k: c, hw, r: 3, s: 1, dw: false, groups: 1 };
        v.extend([fprop(2, &l, false), dgrad(2, &l), wgrad(2, &l)]);
    }
    // The two 3x3 layers of the table in bf16 (all three) and in f32 as tf32 (forward).
    for l in [Layer { c: 64, k: 64, hw: 56, r: 3, s: 1, dw: false, groups: 1 }, Layer { c: 256, k: 256, hw: 14, r: 3, s: 1, dw: false, groups: 1 }] {
        v.extend([fprop_as(n, &l, false, DataType::Bf16), dgrad_as(n, &l, DataType::Bf16), wgrad_as(n, &l, DataType::Bf16), fprop_as(n, &l, false, DataType::F32)]);
    }
    // int8 inference (i8 image and filter, exact i32 sums): ResNet-50's layers of the table,
    // forward, beside cuDNN's int8 graph (PyTorch has no int8 convolution).
    for (c, k, hw, r) in [(64, 64, 56, 3), (256, 64, 56, 1), (256, 256, 14, 3), (512, 2048, 7, 1)] {
        v.push(fprop_as(n, &Layer { c, k, hw, r, s: 1, dw: false, groups: 1 }, false, DataType::I8));
    }
    // Depthwise: MobileNet-v2's 3x3 (144 channels at 56x56, stride 1; 96 at 112x112, stride 2)
    // and ConvNeXt-T's 7x7 (96 at 56x56, padding 3); forward, data and weight gradients.
    let depthwise = [
        Layer { c: 144, k: 144, hw: 56, r: 3, s: 1, dw: true, groups: 1 },
        Layer { c: 96, k: 96, hw: 112, r: 3, s: 2, dw: true, groups: 1 },
        Layer { c: 96, k: 96, hw: 56, r: 7, s: 1, dw: true, groups: 1 },
    ];
    for l in &depthwise {
        v.extend([fprop(n, l, false), dgrad(n, l), wgrad(n, l)]);
    }
    // Grouped: ResNeXt-50 32x4d's 3x3 layers of its first stage (32 groups of 4 channels at
    // 56x56) and its last (32 groups of 32 channels at 7x7); forward, data and weight gradients.
    let grouped = [Layer { c: 128, k: 128, hw: 56, r: 3, s: 1, dw: false, groups: 32 }, Layer { c: 1024, k: 1024, hw: 7, r: 3, s: 1, dw: false, groups: 32 }];
    for l in &grouped {
        v.extend([fprop(n, l, false), dgrad(n, l), wgrad(n, l)]);
    }
    // RegNet's grouped 3x3 layers (stride 1, inside a stage): RegNetY-400MF's second stage (104
    // channels at 28x28, 13 groups of 8) and RegNetY-800MF's (144 at 28x28, 9 groups of 16); and
    // a depthwise 3x3 with a channel multiplier of 2 (72 -> 144 channels at 56x56). All three on
    // the small-group kernels.
    let small = [
        Layer { c: 104, k: 104, hw: 28, r: 3, s: 1, dw: false, groups: 13 },
        Layer { c: 144, k: 144, hw: 28, r: 3, s: 1, dw: false, groups: 9 },
        Layer { c: 72, k: 144, hw: 56, r: 3, s: 1, dw: true, groups: 1 },
    ];
    for l in &small {
        v.extend([fprop(n, l, false), dgrad(n, l), wgrad(n, l)]);
    }
    // A video network's 3x3x3 layer (64 channels, 8 frames of 56x56, batch 2) and a speech
    // model's 1D front end (wav2vec 2.0's first layer: one channel of 10 s of 16 kHz audio to
    // 512 channels, kernel 10, stride 5, no padding; batch 4); forward and both gradients.
    for op in ["fprop", "dgrad", "wgrad"] {
        v.push(conv_nd(op, 2, 64, 64, &[8, 56, 56], &[3, 3, 3], (1, 1)));
    }
    for op in ["fprop", "dgrad", "wgrad"] {
        v.push(conv_nd(op, 4, 1, 512, &[160000], &[10], (5, 0)));
    }
    v
}
