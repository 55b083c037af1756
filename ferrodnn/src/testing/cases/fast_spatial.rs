//! Cases for the fast NHWC batchnorm and pooling kernels (engine/cuda/fused/batchnorm.rs and
//! pooling.rs): the shapes they take (C a multiple of 16 bytes of channels, odd position
//! counts, several blocks of statistics, more channel vectors than a block has threads, mixed
//! x/y types) and layouts that must fall back (NCHW, C not a multiple of 8 for 16-bit types,
//! peers, 3D pooling, padded rows).

use super::Case;
use crate::graph::ops::norm::BatchnormAttrs;
use crate::graph::ops::resample::{ResampleAttrs, ResampleMode};
use crate::{DataType, Graph, TensorDesc};

const TYPES: [DataType; 3] = [DataType::F16, DataType::Bf16, DataType::F32];

#[derive(Clone, Copy, PartialEq)]
enum L {
    /// Packed, axis 1 innermost (NHWC for [N, C, H, W]).
    Last,
    /// Packed row-major (NCHW).
    First,
    /// Channels-last with each position's channels padded by 8 elements.
    PaddedLast,
}

fn desc(name: &str, dims: &[i64], dt: DataType, l: L) -> TensorDesc {
    let d = TensorDesc::new(name, dims, dt);
    let rank = dims.len();
    match l {
        L::First => d,
        L::Last => {
            let mut order = vec![0];
            order.extend(2..rank);
            order.push(1);
            d.with_layout(&order)
        }
        L::PaddedLast => {
            // Channel stride 1, positions C + 8 apart, row-major over [N, spatial...].
            let mut strides = vec![0i64; rank];
            strides[1] = 1;
            let mut acc = dims[1] + 8;
            for a in (0..rank).rev().filter(|&a| a != 1) {
                strides[a] = acc;
                acc *= dims[a];
            }
            d.with_strides(&strides)
        }
    }
}

fn dims_tag(d: &[i64]) -> String {
    d.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("x")
}

/// scale/bias type for x of type `dt` (f32 for the 16-bit types, as mixed-precision models
/// keep them).
fn param_type(dt: DataType) -> DataType {
    if dt == DataType::Bf16 {
        DataType::Bf16
    } else {
        DataType::F32
    }
}

#[allow(clippy::too_many_arguments)]
fn bn_case(what: &str, dt: DataType, y_type: Option<DataType>, x_dims: &[i64], l: L, running: bool, peers: usize, attrs: BatchnormAttrs) -> Case {
    let name = format!("fast_spatial_bn_{what}_{}_{dt}{}", dims_tag(x_dims), y_type.map(|t| format!("_y{t}")).unwrap_or_default());
    let mut g = Graph::new(name.clone());
    let mut cd = vec![1i64; x_dims.len()];
    cd[1] = x_dims[1];
    let pt = param_type(dt);
    let x = g.tensor(desc("x", x_dims, dt, l));
    let s = g.tensor(TensorDesc::new("scale", &cd, pt));
    let b = g.tensor(TensorDesc::new("bias", &cd, pt));
    let run = if running { Some((g.tensor(TensorDesc::new("running_mean", &cd, DataType::F32)), g.tensor(TensorDesc::new("running_var", &cd, DataType::F32)))) } else { None };
    let mut pd = cd.clone();
    pd[0] = 2;
    let p: Vec<_> = (0..peers).map(|i| g.tensor(TensorDesc::new(format!("peer{i}"), &pd, DataType::F32))).collect();
    let (y, m, v, r) = g.batchnorm(x, s, b, run, &p, attrs);
    if let Some(t) = y_type {
        g.desc_mut(y).data_type = Some(t);
    }
    for id in [Some(y), Some(m), Some(v), r.map(|r| r.0), r.map(|r| r.1)].into_iter().flatten() {
        g.set_output(id);
    }
    Case::new(name, g)
}

fn bninf_case(what: &str, dt: DataType, x_dims: &[i64], l: L) -> Case {
    let name = format!("fast_spatial_bninf_{what}_{}_{dt}", dims_tag(x_dims));
    let mut g = Graph::new(name.clone());
    let mut cd = vec![1i64; x_dims.len()];
    cd[1] = x_dims[1];
    let pt = param_type(dt);
    let x = g.tensor(desc("x", x_dims, dt, l));
    let s = g.tensor(TensorDesc::new("scale", &cd, pt));
    let b = g.tensor(TensorDesc::new("bias", &cd, pt));
    let m = g.tensor(TensorDesc::new("mean", &cd, DataType::F32));
    let iv = g.tensor(TensorDesc::new("inv_variance", &cd, DataType::F32));
    let y = g.batchnorm_inference(x, s, b, m, iv);
    g.set_output(y);
    Case::new(name, g)
}

fn genstats_case(what: &str, dt: DataType, x_dims: &[i64], l: L) -> Case {
    let name = format!("fast_spatial_genstats_{what}_{}_{dt}", dims_tag(x_dims));
    let mut g = Graph::new(name.clone());
    let x = g.tensor(desc("x", x_dims, dt, l));
    let (s, q) = g.genstats(x);
    g.set_output(s);
    g.set_output(q);
    Case::new(name, g)
}

#[allow(clippy::too_many_arguments)]
fn pool_case(what: &str, dt: DataType, x_dims: &[i64], l: L, mode: ResampleMode, window: [i64; 2], stride: [i64; 2], pre: [i64; 2], post: [i64; 2]) -> Case {
    let name = format!("fast_spatial_pool_{}_{what}_{}_{dt}", mode.name(), dims_tag(x_dims));
    let mut g = Graph::new(name.clone());
    let x = g.tensor(desc("x", x_dims, dt, l));
    let a = ResampleAttrs { mode, window: window.to_vec(), stride: stride.to_vec(), pre_padding: pre.to_vec(), post_padding: post.to_vec() };
    let y = g.resample(x, a);
    g.set_output(y);
    Case::new(name, g)
}

pub(super) fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    let bn = BatchnormAttrs::default;
    let bn2 = || BatchnormAttrs { epsilon: 1e-3, momentum: 0.25 };
    for dt in TYPES {
        // Fast path: C = 8, 24, 64; odd position counts; with and without running statistics.
        v.push(bn_case("c8", dt, None, &[3, 8, 5, 7], L::Last, false, 0, bn()));
        v.push(bn_case("c24_running", dt, None, &[3, 24, 5, 7], L::Last, true, 0, bn2()));
        v.push(bn_case("c64_running", dt, None, &[2, 64, 9, 11], L::Last, true, 0, bn()));
        // Many statistics blocks (4080 positions).
        v.push(bn_case("blocks_running", dt, None, &[16, 64, 15, 17], L::Last, true, 0, bn2()));
        // Rank 3 and rank 2 (channels-last is row-major for [N, C]).
        v.push(bn_case("rank3", dt, None, &[5, 16, 7], L::Last, false, 0, bn()));
        v.push(bn_case("rank2", dt, None, &[37, 32], L::First, true, 0, bn()));
        // Fallbacks: NCHW, padded positions, peers.
        v.push(bn_case("nchw_fallback", dt, None, &[3, 8, 5, 7], L::First, true, 0, bn()));
        v.push(bn_case("padded_fallback", dt, None, &[3, 8, 5, 7], L::PaddedLast, false, 0, bn()));
        v.push(bn_case("peers_fallback", dt, None, &[3, 8, 5, 7], L::Last, true, 1, bn()));
    }
    // More channel vectors than threads in a block (C = 4096: 512 vectors of 8).
    v.push(bn_case("wide", DataType::Bf16, None, &[3, 4096, 1, 5], L::Last, true, 0, bn()));
    v.push(bn_case("c512", DataType::F16, None, &[2, 512, 3, 5], L::Last, false, 0, bn2()));
    // f32 with C = 12 (multiple of 4) is fast; f16 with C = 12 falls back.
    v.push(bn_case("c12", DataType::F32, None, &[3, 12, 5, 7], L::Last, true, 0, bn()));
    v.push(bn_case("c12_fallback", DataType::F16, None, &[3, 12, 5, 7], L::Last, true, 0, bn()));
    // Mixed x/y types: f32 x with f16 y (8-byte stores), bf16 x with f32 y (two 16-byte stores).
    v.push(bn_case("mixed", DataType::F32, Some(DataType::F16), &[3, 16, 5, 7], L::Last, false, 0, bn()));
    v.push(bn_case("mixed", DataType::Bf16, Some(DataType::F32), &[3, 16, 5, 7], L::Last, true, 0, bn()));

    for dt in TYPES {
        // NHWC fast path: C = 8, 24, 64, odd position counts, several slabs.
        v.push(bninf_case("nhwc", dt, &[3, 8, 5, 7], L::Last));
        v.push(bninf_case("nhwc", dt, &[3, 24, 5, 7], L::Last));
        v.push(bninf_case("nhwc", dt, &[16, 64, 15, 17], L::Last));
        // NCHW: planes of 40 elements (vectors for every type), 35 (scalar), 8x8.
        v.push(bninf_case("nchw", dt, &[3, 8, 5, 8], L::First));
        v.push(bninf_case("nchw_odd", dt, &[3, 24, 5, 7], L::First));
        v.push(bninf_case("nchw", dt, &[4, 64, 8, 8], L::First));
        // Fallbacks: padded positions; C = 12 channels-last (f32 is fast).
        v.push(bninf_case("padded_fallback", dt, &[3, 8, 5, 7], L::PaddedLast));
        v.push(bninf_case("c12", dt, &[3, 12, 5, 7], L::Last));
        // Genstats: NHWC C = 8, 24, 64 with odd position counts; NCHW and padded fall back.
        v.push(genstats_case("nhwc", dt, &[3, 8, 5, 7], L::Last));
        v.push(genstats_case("nhwc", dt, &[3, 24, 5, 7], L::Last));
        v.push(genstats_case("nhwc", dt, &[16, 64, 15, 17], L::Last));
        v.push(genstats_case("nchw_fallback", dt, &[3, 8, 5, 7], L::First));
        v.push(genstats_case("padded_fallback", dt, &[3, 8, 5, 7], L::PaddedLast));
        v.push(genstats_case("c12", dt, &[3, 12, 5, 7], L::Last));
    }

    let modes = [ResampleMode::Max, ResampleMode::AvgIncludePadding, ResampleMode::AvgExcludePadding];
    for dt in TYPES {
        for mode in modes {
            v.push(pool_case("3x3s2p1", dt, &[2, 16, 13, 11], L::Last, mode, [3, 3], [2, 2], [1, 1], [1, 1]));
            v.push(pool_case("2x2s2p0", dt, &[3, 8, 8, 6], L::Last, mode, [2, 2], [2, 2], [0, 0], [0, 0]));
            v.push(pool_case("asym", dt, &[2, 24, 7, 9], L::Last, mode, [3, 2], [1, 2], [2, 0], [0, 1]));
            v.push(pool_case("odd", dt, &[1, 32, 9, 7], L::Last, mode, [3, 3], [2, 3], [1, 2], [2, 1]));
            v.push(pool_case("nchw_fallback", dt, &[2, 16, 13, 11], L::First, mode, [3, 3], [2, 2], [1, 1], [1, 1]));
        }
    }
    // Larger image, several blocks.
    v.push(pool_case("3x3s2p1", DataType::F16, &[4, 64, 28, 28], L::Last, ResampleMode::Max, [3, 3], [2, 2], [1, 1], [1, 1]));
    v.push(pool_case("3x3s2p1", DataType::Bf16, &[4, 64, 28, 28], L::Last, ResampleMode::AvgIncludePadding, [3, 3], [2, 2], [1, 1], [1, 1]));
    // Tiles of several outputs per thread (at least 1024 threads): 4x2 tiles with partial edge
    // tiles (f32, P = 23, Q = 19), 2x2 tiles (f16, P = 17, Q = 16), 4x1 tiles of a stride-1
    // window with a partial edge tile (P = 50), each mode.
    for mode in modes {
        v.push(pool_case("tile4x2", DataType::F32, &[1, 96, 46, 38], L::Last, mode, [3, 3], [2, 2], [1, 1], [1, 1]));
        v.push(pool_case("tile2x2", DataType::F16, &[2, 64, 33, 31], L::Last, mode, [3, 3], [2, 2], [1, 1], [1, 1]));
        v.push(pool_case("tile4x1", DataType::Bf16, &[1, 64, 50, 24], L::Last, mode, [3, 2], [1, 2], [2, 0], [0, 1]));
    }
    // Strip kernel (windows overlapping along h): several strips along p with a partial last
    // one (P = 15 in strips of 4); several blocks along q (C = 512 f16: 7-column slots, Q = 15
    // in 3 blocks of 5); two items per thread (C = 16 f32, Q = 150: 600 items on 320 threads);
    // the benchmark's 3x3 stride-2 geometry on one 56x56 image; a stride-1 3x3 window.
    for mode in modes {
        v.push(pool_case("strip_rows", DataType::F16, &[2, 64, 29, 30], L::Last, mode, [3, 3], [2, 2], [1, 1], [1, 1]));
        v.push(pool_case("strip_cols", DataType::F16, &[1, 512, 13, 29], L::Last, mode, [3, 3], [2, 2], [1, 1], [1, 1]));
        v.push(pool_case("strip_ipt2", DataType::F32, &[1, 16, 5, 300], L::Last, mode, [3, 3], [2, 2], [1, 1], [1, 1]));
        v.push(pool_case("strip_bench", DataType::Bf16, &[1, 64, 56, 56], L::Last, mode, [3, 3], [2, 2], [1, 1], [1, 1]));
        v.push(pool_case("strip_s1", DataType::F32, &[2, 8, 19, 10], L::Last, mode, [3, 3], [1, 1], [1, 1], [1, 1]));
        // Rows too wide for a strip slot (3 positions of C = 3072 f16 > 16 KB): the tiled kernel.
        v.push(pool_case("tiled_widec", DataType::F16, &[1, 3072, 7, 7], L::Last, mode, [3, 3], [2, 2], [1, 1], [1, 1]));
    }
    // Global pooling window (7x7, 49 taps, not unrolled).
    v.push(pool_case("global", DataType::F16, &[2, 64, 7, 7], L::Last, ResampleMode::AvgExcludePadding, [7, 7], [1, 1], [0, 0], [0, 0]));
    // Fallbacks: C = 12 for f16; padded positions; 3D pooling.
    v.push(pool_case("c12_fallback", DataType::F16, &[2, 12, 7, 7], L::Last, ResampleMode::Max, [3, 3], [2, 2], [1, 1], [1, 1]));
    v.push(pool_case("c12", DataType::F32, &[2, 12, 7, 7], L::Last, ResampleMode::AvgIncludePadding, [3, 3], [2, 2], [1, 1], [1, 1]));
    v.push(pool_case("padded_fallback", DataType::F16, &[2, 16, 7, 7], L::PaddedLast, ResampleMode::Max, [3, 3], [2, 2], [1, 1], [1, 1]));
    {
        let name = "fast_spatial_pool_max_3d_fallback_2x8x5x5x5_f16".to_string();
        let mut g = Graph::new(name.clone());
        let x = g.tensor(desc("x", &[2, 8, 5, 5, 5], DataType::F16, L::Last));
        let y = g.resample(x, ResampleAttrs::uniform(ResampleMode::Max, 3, 3, 2, 1));
        g.set_output(y);
        v.push(Case::new(name, g));
    }
    v
}
