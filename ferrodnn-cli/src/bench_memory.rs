//! Workloads of the memory-bound suite added with the second round of fast kernels (issue 4):
//! batchnorm backward (NHWC and NCHW), max and average pooling backward (NHWC), instancenorm
//! forward and backward (NCHW rows and NHWC groups), and residual add -> layernorm / rmsnorm
//! fused into one kernel (the sum also written, as a transformer block keeps it), and group
//! normalization on a diffusion UNet's shapes (forward + SiLU, backward; [`groupnorm_workloads`]).
//!
//! Minimal bytes: `bench::min_bytes` (each non-virtual input read once, each output written
//! once) is the minimum for every workload here but the average pooling backward, whose `x`
//! input the result does not depend on, and group normalization, whose statistics (over
//! whole images) must be complete before the first output element: [`min_bytes_override`]
//! gives those (dy + dx; groupnorm's x, and backward dy, read twice).

use crate::bench::Workload;
use ferrodnn::graph::ops::norm::{GroupnormAttrs, NormAttrs};
use ferrodnn::graph::ops::pointwise::PointwiseMode;
use ferrodnn::graph::ops::resample::ResampleAttrs;
use ferrodnn::{DataType, Graph, TensorDesc, TensorId};

fn out(g: &mut Graph, t: TensorId, dt: DataType) {
    g.set_output(t);
    g.desc_mut(t).data_type = Some(dt);
}

/// `[N, C, H, W]` in NHWC (channels-last) or NCHW memory order.
fn image(name: &str, dims: &[i64], dt: DataType, nhwc: bool) -> TensorDesc {
    let d = TensorDesc::new(name, dims, dt);
    if nhwc {
        d.with_layout(&[0, 2, 3, 1])
    } else {
        d
    }
}

/// The workloads (ids `<op>_<pass>_<dtype>_<layout>_<shape>`).
pub fn workloads() -> Vec<Workload> {
    let (h16, bf, f32) = (DataType::F16, DataType::Bf16, DataType::F32);
    let mut v = Vec::new();
    // Batchnorm backward (dx, dscale, dbias) of the training-forward workload's shape.
    for nhwc in [true, false] {
        let layout = if nhwc { "nhwc" } else { "nchw" };
        let id = format!("batchnorm_bwd_fp16_{layout}_32x256x56x56");
        let mut g = Graph::new(id.clone()).io_data_type(h16);
        let dims = [32, 256, 56, 56];
        let x = g.tensor(image("x", &dims, h16, nhwc));
        let dy = g.tensor(image("dy", &dims, h16, nhwc));
        let cd = [1, 256, 1, 1];
        let s = g.tensor(TensorDesc::new("scale", &cd, f32));
        let m = g.tensor(TensorDesc::new("mean", &cd, f32));
        let iv = g.tensor(TensorDesc::new("inv_variance", &cd, f32));
        let (dx, ds, db) = g.batchnorm_backward(dy, x, s, m, iv);
        out(&mut g, dx, h16);
        out(&mut g, ds, f32);
        out(&mut g, db, f32);
        v.push(Workload { id, graph: g, flops: None });
    }
    // Pooling backward, the forward workloads' shapes.
    for (name, attrs) in [("maxpool3x3s2", ResampleAttrs::max_2d(3, 2, 1)), ("avgpool3x3s2", ResampleAttrs::avg_2d(3, 2, 1, true))] {
        let id = format!("{name}_bwd_fp16_nhwc_32x64x112x112");
        let mut g = Graph::new(id.clone()).io_data_type(h16);
        let dims = [32, 64, 112, 112];
        let x = g.tensor(image("x", &dims, h16, true));
        let od = attrs.output_dims(&dims).expect("pooling dims");
        let dy = g.tensor(image("dy", &od, h16, true));
        let dx = g.resample_backward(dy, x, attrs);
        out(&mut g, dx, h16);
        v.push(Workload { id, graph: g, flops: None });
    }
    // Instancenorm forward (training: y, mean, inv_variance) and backward: NCHW (a row of 4096
    // per (n, c)) and NHWC (statistics per image over strided channels).
    for nhwc in [false, true] {
        let layout = if nhwc { "nhwc" } else { "nchw" };
        let dims = [32, 128, 64, 64];
        let cd = [1, 128, 1, 1];
        let sd = [32, 128, 1, 1];
        let id = format!("instancenorm_fwd_bf16_{layout}_32x128x64x64");
        let mut g = Graph::new(id.clone()).io_data_type(bf);
        let x = g.tensor(image("x", &dims, bf, nhwc));
        let s = g.tensor(TensorDesc::new("scale", &cd, f32));
        let b = g.tensor(TensorDesc::new("bias", &cd, f32));
        let (y, m, iv) = g.instancenorm(x, s, b, NormAttrs::default());
        out(&mut g, y, bf);
        for t in [m, iv].into_iter().flatten() {
            out(&mut g, t, f32);
        }
        v.push(Workload { id, graph: g, flops: None });

        let id = format!("instancenorm_bwd_bf16_{layout}_32x128x64x64");
        let mut g = Graph::new(id.clone()).io_data_type(bf);
        let x = g.tensor(image("x", &dims, bf, nhwc));
        let dy = g.tensor(image("dy", &dims, bf, nhwc));
        let s = g.tensor(TensorDesc::new("scale", &cd, f32));
        let m = g.tensor(TensorDesc::new("mean", &sd, f32));
        let iv = g.tensor(TensorDesc::new("inv_variance", &sd, f32));
        let (dx, ds, db) = g.instancenorm_backward(dy, x, s, m, iv);
        out(&mut g, dx, bf);
        out(&mut g, ds, f32);
        out(&mut g, db, f32);
        v.push(Workload { id, graph: g, flops: None });
    }
    // Residual add -> norm in one kernel: h = a + b (written: the residual stream), y = norm(h).
    for (t, hd) in [(16384i64, 4096i64), (65536, 1024)] {
        for rms in [false, true] {
            let op = if rms { "add_rmsnorm" } else { "add_layernorm" };
            let id = format!("{op}_fwd_bf16_{t}x{hd}");
            let mut g = Graph::new(id.clone()).io_data_type(bf);
            let a = g.tensor(TensorDesc::new("a", &[t, hd], bf));
            let b = g.tensor(TensorDesc::new("b", &[t, hd], bf));
            let s = g.tensor(TensorDesc::new("scale", &[1, hd], bf));
            let h = g.add(a, b);
            let y = if rms {
                g.rmsnorm(h, s, None, NormAttrs::inference()).0
            } else {
                let bias = g.tensor(TensorDesc::new("bias", &[1, hd], bf));
                g.layernorm(h, s, bias, NormAttrs::inference()).0
            };
            out(&mut g, h, bf);
            out(&mut g, y, bf);
            v.push(Workload { id, graph: g, flops: None });
        }
    }
    v.extend(groupnorm_workloads());
    v
}

/// Group normalization (32 groups) on a Stable Diffusion UNet's shapes, fp16 (statistics f32):
/// the training forward with the SiLU after it (y = silu(groupnorm(x)), mean and inv_variance
/// written) and the backward (dx, dscale, dbias), channels-last for 320 channels at 64x64, 640
/// at 32x32 and 1280 at 16x16 with batch 2 and 8, and NCHW for 320 at 64x64 (batch 8). Ids
/// `groupnorm_silu_fwd_fp16_<layout>_<NxCxHxW>_g32` and `groupnorm_bwd_fp16_...`.
pub fn groupnorm_workloads() -> Vec<Workload> {
    let (h16, f32) = (DataType::F16, DataType::F32);
    let mut shapes: Vec<(bool, [i64; 4])> = Vec::new();
    for n in [2, 8] {
        for (c, hw) in [(320, 64), (640, 32), (1280, 16)] {
            shapes.push((true, [n, c, hw, hw]));
        }
    }
    shapes.push((false, [8, 320, 64, 64]));
    let mut v = Vec::new();
    for (nhwc, dims) in shapes {
        let layout = if nhwc { "nhwc" } else { "nchw" };
        let tag = dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x");
        let cd = [1, dims[1], 1, 1];
        let sd = [dims[0], 32, 1, 1];

        let id = format!("groupnorm_silu_fwd_fp16_{layout}_{tag}_g32");
        let mut g = Graph::new(id.clone()).io_data_type(h16);
        let x = g.tensor(image("x", &dims, h16, nhwc));
        let s = g.tensor(TensorDesc::new("scale", &cd, h16));
        let b = g.tensor(TensorDesc::new("bias", &cd, h16));
        let (y, m, iv) = g.groupnorm(x, s, b, GroupnormAttrs::new(32));
        let y = g.pointwise(PointwiseMode::Swish { beta: 1.0 }, &[y]);
        out(&mut g, y, h16);
        for t in [m, iv].into_iter().flatten() {
            out(&mut g, t, f32);
        }
        v.push(Workload { id, graph: g, flops: None });

        let id = format!("groupnorm_bwd_fp16_{layout}_{tag}_g32");
        let mut g = Graph::new(id.clone()).io_data_type(h16);
        let x = g.tensor(image("x", &dims, h16, nhwc));
        let dy = g.tensor(image("dy", &dims, h16, nhwc));
        let s = g.tensor(TensorDesc::new("scale", &cd, h16));
        let m = g.tensor(TensorDesc::new("mean", &sd, f32));
        let iv = g.tensor(TensorDesc::new("inv_variance", &sd, f32));
        let (dx, ds, db) = g.groupnorm_backward(dy, x, s, m, iv, 32);
        out(&mut g, dx, h16);
        out(&mut g, ds, h16);
        out(&mut g, db, h16);
        v.push(Workload { id, graph: g, flops: None });
    }
    v
}

/// The fewest bytes a workload must move where `bench::min_bytes` (every io tensor once)
/// counts more: the average pooling backward does not read `x` (dy 32x64x56x56 and dx
/// 32x64x112x112, f16).
pub fn min_bytes_override(id: &str) -> Option<u64> {
    if id == "avgpool3x3s2_bwd_fp16_nhwc_32x64x112x112" {
        return Some((32 * 64 * 56 * 56 + 32 * 64 * 112 * 112) * 2);
    }
    // Group normalization: x (and backward dy) read twice, once for the statistics and once
    // for the output, whose first element needs the whole image's statistics.
    let w = groupnorm_workloads().into_iter().find(|w| w.id == id)?;
    let mut g = w.graph;
    g.validate().ok()?;
    let again: u64 = g.input_tensors().iter().filter(|&&t| matches!(g.desc(t).name.as_str(), "x" | "dy")).map(|&t| g.desc(t).element_count() as u64 * 2).sum();
    Some(crate::bench::min_bytes(&g) + again)
}

#[cfg(test)]
mod tests {
    #[test]
    fn memory_workloads_validate() {
        for w in super::workloads() {
            let mut g = w.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", w.id));
            assert!(crate::bench::min_bytes(&g) > 1 << 20, "{}", w.id);
        }
    }

    /// Groupnorm's bytes: the forward reads x twice and writes y (the statistics aside), the
    /// backward reads x and dy twice and writes dx (dscale and dbias aside).
    #[test]
    fn groupnorm_bytes_count_the_second_reads() {
        let x = 8 * 320 * 64 * 64 * 2;
        let fwd = super::min_bytes_override("groupnorm_silu_fwd_fp16_nhwc_8x320x64x64_g32").unwrap();
        assert_eq!(fwd, 3 * x + 2 * 320 * 2 + 2 * 8 * 32 * 4);
        let bwd = super::min_bytes_override("groupnorm_bwd_fp16_nhwc_8x320x64x64_g32").unwrap();
        assert_eq!(bwd, 5 * x + 3 * 320 * 2 + 2 * 8 * 32 * 4);
        assert_eq!(super::min_bytes_override("layernorm_fwd_bf16_16384x4096"), None);
    }
}
