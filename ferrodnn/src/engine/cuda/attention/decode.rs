//! The decode kernel (flash-decoding): few query rows against a long K/V sequence.
//!
//! The general forward kernel gives each query head its own CTA, so the query heads sharing a
//! kv head (GQA/MQA) each read that head's K/V, and a 64-row tile holds one valid row. Here one
//! CTA per (kv split, kv head, batch) computes every query row of the group of query heads
//! sharing the kv head (`group * s_q <= 16` rows, padded to one 16-row `mma` tile), so each
//! K/V byte is read once. Its 4 warps split each K/V tile by keys (`KW` keys each) and each
//! keeps its own online softmax (m, l, o) over its keys; K/V tiles stream through a 2-4 stage
//! 16-byte `cp.async` pipeline (about 32-64 KB in flight per CTA, two CTAs per SM on Hopper).
//! At the end the warps merge in shared memory and the CTA writes its split's unnormalized
//! `o`, max and sum (log2 units, f32) to the workspace; a second launch merges the splits in
//! split order (deterministic) and writes `o` and `stats`. With one split the kernel writes
//! `o` and `stats` itself.
//!
//! Splits: the grid is `(splits, h_kv, b)` with `splits = ceil(4 * SMs / (b * h_kv))`, at most
//! `keys / 256` (at least 256 keys a split) and at most the number of K/V tiles, `keys` being
//! `s_kv` or the width of a sliding window. Each batch's visible key range (after padding and
//! masks) is cut into `splits` chunks of whole tiles; chunks past its end do no work.
//!
//! Takes every forward feature the general kernel takes (masks, padding, bias, ALiBi, dropout,
//! GQA/MQA, paged K/V, stats, any strides, element-wise loads when 16-byte ones are not
//! possible) when `group * s_q <= 16` and the shared memory fits; returns `None` otherwise.

use super::{max_shared, Problem, COMMON};
use crate::engine::cuda::kernel::{Grid, Launch, NodeKernels, Signature, Source, Target, Unaligned, Unit};

/// Warps per CTA.
const NW: i64 = 4;
/// Query rows a CTA takes (one m16 tile).
const MAX_ROWS: i64 = 16;
/// The fewest keys a split gets.
const MIN_KEYS_PER_SPLIT: i64 = 256;
/// Shared memory per CTA the stage count aims at (two CTAs per SM on Hopper).
const SMEM_BUDGET: i64 = 112 * 1024;

/// Tiling and grid of a decode problem.
struct Shape {
    /// Keys per warp in a tile.
    kw: i64,
    /// Pipeline stages (K/V tiles in shared memory).
    stages: i64,
    splits: i64,
    shared: i64,
}

fn shape(p: &Problem, target: &Target) -> Option<Shape> {
    let dmax = p.d.max(p.d_v);
    let kw = if dmax > 64 { 16 } else { 32 };
    let bn = NW * kw;
    let q_bytes = 16 * (p.d + 8) * 2;
    let stage = bn * ((p.d + 8) + (p.d_v + 8)) * 2;
    let merge = NW * 16 * (p.d_v + 8) * 4 + 2 * NW * 16 * 4;
    let stages = ((SMEM_BUDGET - q_bytes) / stage).clamp(2, 4);
    let shared = q_bytes + (stages * stage).max(merge);
    if shared > max_shared(target) as i64 {
        return None;
    }
    // Enough CTAs for about four per SM (two waves at two CTAs per SM), each split at least
    // MIN_KEYS_PER_SPLIT keys and a whole number of tiles.
    // Keys a batch's rows can see: all, or a window's width.
    let a = p.attrs;
    let right = if a.causal.is_some() { Some(0) } else { a.sliding_window_right };
    let keys = match (a.sliding_window_left, right) {
        (Some(l), Some(r)) => p.s_kv.min(l.max(0).saturating_add(r.max(0)).saturating_add(p.s_q)),
        _ => p.s_kv,
    };
    let work = p.b * p.h_kv;
    let want = 4 * target.sm_count.max(1) as i64;
    let splits = ((want + work - 1) / work).min((keys / MIN_KEYS_PER_SPLIT).max(1)).min((keys + bn - 1) / bn).max(1);
    Some(Shape { kw, stages, splits, shared })
}

fn generate(p: &Problem, s: &Shape, vec: bool) -> Option<NodeKernels> {
    let node = p.node;
    let o = node.output("o")?;
    let stats = node.output("stats");
    let rows = p.b * p.h_q * p.s_q;
    let split = s.splits > 1;
    let outputs = |sig: &mut Signature| {
        sig.ptr("o_p", o, true);
        if let Some(t) = stats {
            sig.ptr("stats_p", t, true);
        }
    };
    // The kernel's defines (after the node's), and its templates.
    let text = |src: Source, template: &str| {
        let mut src = src
            .define("FA_NW", NW)
            .define("FA_NT", NW * 32)
            .define("FA_KW", s.kw)
            .define("FA_BN", NW * s.kw)
            .define("FA_STAGES", s.stages)
            .define("FA_NSPLIT", s.splits)
            .define("FA_R", p.h_q / p.h_kv * p.s_q)
            .define("FA_ROWS", format!("{rows}LL"))
            .define("FA_LDQ", p.d + 8)
            .define("FA_LDO", p.d_v + 8)
            .flag("FA_QREG", p.d <= 128)
            .flag("FA_HAS_STATS", stats.is_some());
        if let Some(t) = stats {
            src = p.stats_store(src, t);
        }
        p.output_store(src, "O", o, vec && p.pair_ok(o)).template(COMMON).template(template).build()
    };
    // The main kernel writes o (and stats) with one split, else the partials.
    let mut sig = Signature::new();
    if split {
        sig.scratch("void", "part_p", 0, true);
    } else {
        outputs(&mut sig);
    }
    sig.ptr("q_p", p.q, false).ptr("k_p", p.k, false).ptr("v_p", p.v, false);
    p.inputs(&mut sig);
    let suffix = if vec { "" } else { "_unaligned" };
    let entry = p.entry(&format!("attn_decode{suffix}"));
    let nt = NW * 32;
    let source = text(p.source(&entry, &sig, vec), include_str!("decode.cuh"));
    let main = Launch::new(source, entry, Grid::Exact(s.splits as u32, p.h_kv as u32, p.b as u32), nt as u32, sig.into_args()).with_shared(s.shared as u32);
    if !split {
        return Some(NodeKernels::one(main));
    }
    let mut sig = Signature::new();
    outputs(&mut sig);
    sig.scratch("void", "part_p", 0, false);
    p.inputs(&mut sig);
    let entry = p.entry(&format!("attn_decode_combine{suffix}"));
    let source = text(p.source(&entry, &sig, vec), include_str!("decode_combine.cuh"));
    let combine = Launch::elementwise(source, &entry, (rows * (p.d_v / 2)) as u64, sig.into_args());
    let scratch = (s.splits * rows * (p.d_v + 2) * 4) as usize;
    Some(NodeKernels { launches: vec![main, combine], scratch: vec![scratch] })
}

/// The decode unit of a forward sdpa node, when `group * s_q` query rows fit one CTA.
pub(super) fn unit(p: &Problem, target: &Target) -> Option<Unit> {
    if p.h_q / p.h_kv * p.s_q > MAX_ROWS {
        return None;
    }
    let s = shape(p, target)?;
    let kernels = generate(p, &s, true)?;
    let node = p.node;
    let o = node.output("o")?;
    // Tensors the fast kernel reads with 16-byte cp.async or writes in 4-byte pairs.
    let mut needs: Vec<_> = [p.q, p.k, p.v].into_iter().filter(|&t| p.vec_ok(t)).collect();
    if p.pair_ok(o) {
        needs.push(o);
    }
    let unaligned = if needs.is_empty() { None } else { Some(Box::new(Unaligned { tensors: needs, kernels: generate(p, &s, false)? })) };
    Some(Unit { nodes: vec![p.ni], kernels, writes: node.outputs.iter().map(|x| x.tensor).collect(), unaligned })
}
