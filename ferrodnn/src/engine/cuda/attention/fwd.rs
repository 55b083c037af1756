//! The forward kernel (FlashAttention-2 on `mma.sync`).
//!
//! Tiles: `BM` query rows per CTA (16 per warp: 128 rows and 8 warps, or 64 and 4 when the head
//! dim is above 128 or `s_q <= 64`), `BN` keys per K/V tile (128 for head dims up to 64, 64 up
//! to 128, 32 above). Shared memory: the Q tile, two K tiles and two V tiles, rows padded by 8
//! elements (16 bytes) so that `ldmatrix` reads are free of bank conflicts. Q fragments stay in
//! registers for head dims up to 128 (re-read from shared memory above). Grid
//! `(ceil(s_q / BM), h_q, b)`, heaviest (last) q tiles first for causal masks.

use super::{max_shared, Problem, COMMON};
use crate::engine::cuda::kernel::{Grid, Launch, NodeKernels, Signature, Target, Unaligned, Unit};

/// Tiles: (warps, BM, BN).
fn tiles(p: &Problem) -> (i64, i64, i64) {
    let dmax = p.d.max(p.d_v);
    let (nw, bn) = if dmax <= 64 {
        (8, 128)
    } else if dmax <= 128 {
        (8, 64)
    } else {
        (4, 32)
    };
    let nw = if p.s_q <= 64 { 4 } else { nw };
    (nw, nw * 16, bn)
}

pub(super) fn generate(p: &Problem, vec: bool) -> Option<NodeKernels> {
    let node = p.node;
    let o = node.output("o")?;
    let stats = node.output("stats");
    let (nw, bm, bn) = tiles(p);
    let mut sig = Signature::new();
    sig.ptr("o_p", o, true);
    if let Some(s) = stats {
        sig.ptr("stats_p", s, true);
    }
    let (smax, ssum) = (node.output("score_max"), node.output("score_sum_exp"));
    if let Some(t) = smax {
        sig.ptr("smax_p", t, true);
    }
    if let Some(t) = ssum {
        sig.ptr("ssum_p", t, true);
    }
    sig.ptr("q_p", p.q, false).ptr("k_p", p.k, false).ptr("v_p", p.v, false);
    p.inputs(&mut sig);
    let entry = p.entry(if vec { "attn_fwd" } else { "attn_fwd_unaligned" });
    let mut src = p
        .source(&entry, &sig, vec)
        .define("FA_NW", nw)
        .define("FA_NT", nw * 32)
        .define("FA_BM", bm)
        .define("FA_BN", bn)
        .define("FA_LDQ", p.d + 8)
        .flag("FA_QREG", p.d <= 128)
        .flag("FA_HAS_STATS", stats.is_some())
        .flag("FA_HAS_SMAX", smax.is_some())
        .flag("FA_HAS_SSUM", ssum.is_some());
    if let Some(s) = stats {
        src = p.stats_store(src, s);
    }
    if let Some(t) = smax {
        src = p.row_store(src, "SMAX", t);
    }
    if let Some(t) = ssum {
        src = p.row_store(src, "SSUM", t);
    }
    let source = p.output_store(src, "O", o, vec && p.pair_ok(o)).template(COMMON).template(include_str!("fwd.cuh")).build();
    let grid = ((p.s_q + bm - 1) / bm, p.h_q, p.b);
    if grid.0 > i32::MAX as i64 {
        return None;
    }
    let launch = Launch::new(source, entry, Grid::Exact(grid.0 as u32, grid.1 as u32, grid.2 as u32), (nw * 32) as u32, sig.into_args()).with_shared(shared_bytes(p) as u32);
    Some(NodeKernels::one(launch))
}

/// Shared memory of the forward kernel.
fn shared_bytes(p: &Problem) -> usize {
    let (_, bm, bn) = tiles(p);
    (2 * (bm * (p.d + 8) + 2 * bn * (p.d + 8) + 2 * bn * (p.d_v + 8))) as usize
}

pub(super) fn unit(p: &Problem, target: &Target) -> Option<Unit> {
    if shared_bytes(p) > max_shared(target) {
        return None;
    }
    let kernels = generate(p, true)?;
    let node = p.node;
    let o = node.output("o")?;
    // Tensors the fast kernel reads with 16-byte cp.async or writes in 4-byte pairs.
    let mut needs: Vec<_> = [p.q, p.k, p.v].into_iter().filter(|&t| p.vec_ok(t)).collect();
    if p.pair_ok(o) {
        needs.push(o);
    }
    let unaligned = if needs.is_empty() { None } else { Some(Box::new(Unaligned { tensors: needs, kernels: generate(p, false)? })) };
    Some(Unit { nodes: vec![p.ni], kernels, writes: node.outputs.iter().map(|x| x.tensor).collect(), unaligned })
}
