//! Group normalization cases (`fused/groupnorm.rs` and the fallback): forward in both phases
//! and backward, on NHWC (channels-last) and NCHW, 1D, 2D and 3D, f16, bf16, f32 (f64 on the
//! fallback), with odd sizes (C = 12 in 3 groups, 40 in 8, 320 in 32 at 17x9, a vector of
//! channels straddling two groups, planes that are no multiple of 16 bytes, several statistics
//! blocks and plane splits, groups of 256 channels, more channels than a block's lanes), the SiLU (and a longer chain) fused after the norm, the norm + SiLU
//! backward as a graph writes it, and layouts the fast kernels leave to the fallback (padded
//! positions, a channel count that is no multiple of 16 bytes on NHWC).

use super::fast_mem::{desc, lname, param_type, tag, L};
use super::norm::stats_type;
use super::Case;
use crate::graph::ops::norm::GroupnormAttrs;
use crate::graph::ops::pointwise::PointwiseMode;
use crate::{DataType, Graph, TensorDesc};

/// `[1, C, 1, ...]` (or `[N, G, 1, ...]` with `rows` and `cols`) for x dims.
fn small_dims(x: &[i64], rows: i64, cols: i64) -> Vec<i64> {
    let mut d = vec![1i64; x.len()];
    d[0] = rows;
    d[1] = cols;
    d
}

/// What follows the norm's y.
#[derive(Clone, Copy, PartialEq)]
enum Epi {
    None,
    /// swish with beta 1.
    Silu,
    /// swish (beta 1.5), then tanh: an inner value rounded to the io type.
    Chain,
}

/// Groupnorm forward: y (through the epilogue), and mean and inv_variance when training.
fn fwd(dt: DataType, train: bool, dims: &[i64], groups: i64, l: L, epi: Epi) -> Case {
    let e = match epi {
        Epi::None => "",
        Epi::Silu => "_silu",
        Epi::Chain => "_chain",
    };
    let name = format!("groupnorm_{}_{}_{}_g{groups}_{dt}{e}", if train { "train" } else { "infer" }, lname(l), tag(dims));
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let pt = param_type(dt);
    let x = g.tensor(desc("x", dims, dt, l));
    let s = g.tensor(TensorDesc::new("scale", &small_dims(dims, 1, dims[1]), pt));
    let b = g.tensor(TensorDesc::new("bias", &small_dims(dims, 1, dims[1]), pt));
    let attrs = if train { GroupnormAttrs::new(groups) } else { GroupnormAttrs::new(groups).inference().with_epsilon(1e-3) };
    let (y, m, v) = g.groupnorm(x, s, b, attrs);
    if epi == Epi::Chain {
        // Inner values of the io type: the fused chain rounds them as the CPU stores them.
        g.desc_mut(y).data_type = Some(dt);
    }
    let out = match epi {
        Epi::None => y,
        Epi::Silu => g.pointwise(PointwiseMode::Swish { beta: 1.0 }, &[y]),
        Epi::Chain => {
            let t = g.pointwise(PointwiseMode::Swish { beta: 1.5 }, &[y]);
            g.desc_mut(t).data_type = Some(dt);
            g.pointwise(PointwiseMode::Tanh, &[t])
        }
    };
    // The chain's output lies like x (the fast kernels write it through x's layout).
    let od = desc("out", dims, dt, l);
    g.desc_mut(out).strides = od.strides;
    for t in [Some(out), m, v].into_iter().flatten() {
        g.set_output(t);
    }
    Case::new(name, g)
}

/// Groupnorm backward (dx, dscale, dbias); with `silu`, the gradient reaching the norm's y
/// comes through a SiLU (swish backward of the SiLU's input and its gradient).
fn bwd(dt: DataType, dims: &[i64], groups: i64, l: L, silu: bool) -> Case {
    let name = format!("groupnorm_backward_{}_{}_g{groups}_{dt}{}", lname(l), tag(dims), if silu { "_silu" } else { "" });
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let pt = param_type(dt);
    let st = stats_type(dt);
    let x = g.tensor(desc("x", dims, dt, l));
    let dout = g.tensor(desc("dy", dims, dt, l));
    let s = g.tensor(TensorDesc::new("scale", &small_dims(dims, 1, dims[1]), pt));
    let sd = small_dims(dims, dims[0], groups);
    let m = g.tensor(TensorDesc::new("mean", &sd, st));
    let v = g.tensor(TensorDesc::new("inv_variance", &sd, st));
    let dy = if silu {
        // The norm's output (the SiLU's input), saved by the forward pass.
        let yn = g.tensor(desc("y_norm", dims, dt, l));
        let t = g.pointwise(PointwiseMode::SwishBackward { beta: 1.0 }, &[dout, yn]);
        // The gradient in the io type, as mixed-precision training keeps it (the fast kernels
        // read dy as x's type).
        let td = desc("dy_norm", dims, dt, l);
        g.desc_mut(t).strides = td.strides;
        g.desc_mut(t).data_type = Some(dt);
        t
    } else {
        dout
    };
    let (dx, ds, db) = g.groupnorm_backward(dy, x, s, m, v, groups);
    let dxd = desc("dx", dims, dt, l);
    g.desc_mut(dx).strides = dxd.strides;
    for t in [dx, ds, db] {
        g.set_output(t);
    }
    Case::new(name, g)
}

pub(super) fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for dt in [DataType::F16, DataType::Bf16, DataType::F32] {
        // C = 12 in 3 groups (NHWC fast in f32 only: 12 f16 channels are 24 bytes).
        for l in [L::Last, L::First] {
            v.push(fwd(dt, true, &[2, 12, 5, 7], 3, l, Epi::None));
            v.push(fwd(dt, false, &[2, 12, 5, 7], 3, l, Epi::Silu));
            v.push(bwd(dt, &[2, 12, 5, 7], 3, l, false));
        }
        // The UNet's 320 channels in 32 groups at an odd 17x9 (vectors of 8 channels straddle
        // groups of 10; NCHW planes of 153 elements).
        for l in [L::Last, L::First] {
            v.push(fwd(dt, true, &[2, 320, 17, 9], 32, l, Epi::Silu));
            v.push(fwd(dt, true, &[2, 320, 17, 9], 32, l, Epi::None));
            v.push(bwd(dt, &[2, 320, 17, 9], 32, l, false));
        }
        // C = 40 in 8: 1D and 3D, both layouts.
        for l in [L::Last, L::First] {
            v.push(fwd(dt, false, &[3, 40, 13], 8, l, Epi::Silu));
            v.push(fwd(dt, true, &[2, 40, 3, 5, 4], 8, l, Epi::Chain));
            v.push(bwd(dt, &[3, 40, 13], 8, l, false));
            v.push(bwd(dt, &[2, 40, 3, 5, 4], 8, l, true));
        }
        // Planes of 16-byte vectors split across warps, several statistics blocks per image.
        v.push(fwd(dt, true, &[2, 64, 32, 32], 32, L::First, Epi::Silu));
        v.push(fwd(dt, true, &[1, 64, 32, 40], 4, L::Last, Epi::Silu));
        v.push(bwd(dt, &[2, 64, 32, 32], 32, L::First, false));
        v.push(bwd(dt, &[1, 64, 32, 40], 4, L::Last, true));
        // One group (layernorm-like) and one per channel (instancenorm-like); rank 2.
        v.push(fwd(dt, true, &[3, 16, 6, 5], 1, L::Last, Epi::None));
        v.push(fwd(dt, true, &[3, 16, 6, 5], 16, L::First, Epi::None));
        v.push(fwd(dt, true, &[5, 24], 6, L::First, Epi::Silu));
        // Groups of 256 channels (the NHWC statistics pass sums them a warp per group).
        v.push(fwd(dt, true, &[2, 512, 3, 2], 2, L::Last, Epi::Silu));
        v.push(bwd(dt, &[5, 24], 6, L::First, false));
        // The fallback: padded positions.
        v.push(fwd(dt, true, &[2, 16, 3, 5], 4, L::PaddedLast, Epi::Silu));
        v.push(bwd(dt, &[2, 16, 3, 5], 4, L::PaddedLast, false));
    }
    // 2048 f32 channels: more channel vectors than a block's lanes (two chunks per block, groups
    // added across them).
    v.push(fwd(DataType::F32, true, &[2, 2048, 3, 2], 4, L::Last, Epi::None));
    // f64: the fallback.
    v.push(fwd(DataType::F64, true, &[2, 12, 5, 7], 3, L::Last, Epi::Silu));
    v.push(bwd(DataType::F64, &[2, 12, 5, 7], 3, L::First, true));
    v
}

#[cfg(test)]
mod tests {
    use crate::engine::cuda::kernel::{Options, Target};
    use crate::engine::cuda::planner::{plan, Family};
    use crate::graph::ops::Op;
    use crate::testing::{random_inputs, run_cpu};

    /// Every case validates and runs on the CPU reference, with finite outputs.
    #[test]
    fn groupnorm_cases_validate_and_run_on_cpu() {
        let cases = super::cases();
        let mut names = std::collections::HashSet::new();
        for c in &cases {
            assert!(c.name.starts_with("groupnorm_"), "{}", c.name);
            assert!(names.insert(c.name.clone()), "duplicate case {}", c.name);
            let mut g = c.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", c.name));
            let inputs = random_inputs(&g, 5);
            let out = run_cpu(&g, &inputs).unwrap_or_else(|e| panic!("{}: {e}", c.name));
            assert!(!out.is_empty(), "{}", c.name);
            for nd in out.values() {
                assert!(nd.data.iter().all(|v| v.is_finite()), "{}: non-finite output", c.name);
            }
        }
    }

    /// The planner gives each case the engine meant for it on sm_90a: the fused epilogue for
    /// norm + chain where the fast kernels take the layout, the spatial kernels for a lone norm
    /// or backward, the fallback for f64, padded tensors, and f16/bf16 NHWC with 12 channels.
    #[test]
    fn groupnorm_cases_plan_on_the_kernels_meant_for_them() {
        let target = Target::sm90a();
        let options = Options::default();
        for c in super::cases() {
            let mut g = c.graph.clone();
            g.validate().unwrap();
            let planned = plan(&g, &target, &options, true).unwrap();
            let norm = g.nodes.iter().position(|n| matches!(n.op, Op::Groupnorm(_) | Op::GroupnormBackward(_))).unwrap();
            let unit = planned.iter().find(|p| p.unit.nodes.contains(&norm)).unwrap();
            let fallback = c.name.contains("f64") || c.name.contains("padded") || (c.name.contains("nhwc_2x12x") && !c.name.contains("f32"));
            let chain = g.nodes.len() > 1 && !c.name.contains("backward");
            let want = if fallback {
                Family::Fallback
            } else if chain {
                Family::NormEpilogue
            } else {
                Family::Spatial
            };
            assert_eq!(unit.family, want, "{}: {:?}", c.name, unit.declined);
            if want == Family::NormEpilogue {
                assert_eq!(unit.unit.nodes.len(), g.nodes.len(), "{}", c.name);
                assert_eq!(unit.unit.kernels.launches.len(), 3, "{}", c.name);
            }
        }
    }
}
