//! Pieces the Hopper attention kernels share ([`super::fwd90`], [`super::bwd90`]): TMA maps of
//! the rank-4 attention tensors, the device helpers of `sm90.cuh` (`wgmma` products, the 4-d TMA
//! load, the work order), and the rule for which problems they take.
//!
//! Shared-memory tiles are rows of 64 channels (128 bytes, TMA's 128-byte swizzle), 8-row atoms
//! 1024 bytes apart, 64-channel chunks one after the other. Read as a K-major operand (k = the
//! channels, e.g. Q and K in S = Q K^T) a tile's descriptor is `make_desc(addr + 32 * kstep, 16,
//! 1024)` within a chunk; read as an N-major operand (k = the rows, e.g. V in O = P V) it is
//! `make_desc(addr + 2048 * kstep, chunk_bytes, 1024)`.

use super::Problem;
use crate::engine::cuda::kernel::Source;
use crate::engine::cuda::tma::TmaDesc;
use crate::graph::TensorId;

/// Whether the Hopper kernels take the problem (the target is checked by the caller): tile
/// widths of whole 64-channel chunks up to 256 (each kernel may ask for less), no page table
/// and no padding mask (TMA would read K/V rows past a sequence's length, which the general
/// kernels zero-fill), TMA-compatible strides.
pub(super) fn takes(p: &Problem, tensors: &[TensorId]) -> bool {
    [p.d, p.d_v].iter().all(|&w| w % 64 == 0 && (64..=256).contains(&w))
        && p.paged.is_none()
        && p.seq_len_q.is_none()
        && p.s_q > 64
        && p.s_q < 1 << 31
        && p.s_kv < 1 << 31
        && tensors.iter().all(|&t| p.vec_ok(t) && tma_of(p, t, 64).check().is_ok())
}

/// The TMA map of a rank-4 io-type tensor [b, h, s, width]: dims (channel, row, head, batch),
/// boxes of 64 channels (128 bytes, the swizzle span) by `rows`. Size-1 dims get a stride TMA
/// accepts (their coordinate is always 0).
pub(super) fn tma_of(p: &Problem, t: TensorId, rows: i64) -> TmaDesc {
    let d = p.graph.desc(t);
    let es = 2u64;
    let dims: Vec<u64> = vec![d.dims[3] as u64, d.dims[2] as u64, d.dims[1] as u64, d.dims[0] as u64];
    let mut strides = Vec::new();
    let mut prev = d.dims[3] as u64 * es;
    for axis in [2usize, 1, 0] {
        let s = if d.dims[axis] == 1 { prev } else { d.strides[axis] as u64 * es };
        strides.push(s);
        prev = s.saturating_mul(d.dims[axis].max(1) as u64);
    }
    TmaDesc { tensor: t, dtype: p.dt, dims, strides, boxes: vec![64, rows as u32, 1, 1], swizzle: 128, im2col: None }
}

/// The define of the heads `fa90_work_at` (`sm90.cuh`) takes at a time in its heaviest-first
/// order for causal masks: as many as keep their Q, dO, K and V within 16 MiB, from one to four
/// (measured on the H100: b1h32s16384d128 causal: one, backward +0.4-0.6% against four;
/// b4h16s4096d128: four, its forward 4.5% slower with one).
pub(super) fn heads_group(p: &Problem, s: Source) -> Source {
    let per_head = (p.s_q + p.s_kv) * (p.d + p.d_v) * 2;
    s.define("FA_HEADS_GROUP", ((16i64 << 20) / per_head.max(1)).clamp(1, 4))
}

/// The Hopper device helpers of the attention kernels (after `common.cuh` and the kernel
/// layer's `hopper.cuh`): the wgmma products, the 4-d TMA load, the work order, the packing of
/// f32 accumulators into A fragments.
pub(super) const SM90: &str = include_str!("sm90.cuh");
