//! The Hopper forward kernel: FlashAttention-3's recipe on `wgmma`, TMA and warp specialization.
//!
//! One CTA (384 threads) per SM over the work list of (q tile of 128 rows, query head, batch)
//! items, heaviest first (with a causal mask, those of four heads at a time: `fa90_work_at`),
//! taking every `gridDim.x`-th item or, with items of unequal sizes or long ones, the next one by
//! ticket ([`dynamic`]); persistent, so that each item's O stores and first loads overlap its
//! neighbours' work (measured on the H100 against one CTA per item: b16h16s1024d64 +10-12%,
//! b4h16s4096d128 +1.5% and the causal rows +1-4%). Without a mask, long items (more than 16 K/V
//! tiles) past the last whole round are split along the keys into one contiguous range of tiles
//! per CTA, each segment's partial O, row maxima and sums stored in scratch and the item combined
//! by the CTA that completes it ([`split`], FA_SPLIT):
//! - warpgroup 0, the producer, gives its registers back (`setmaxnreg.dec`); one thread loads
//!   the Q tile once and then the K and V tiles of 128 keys with TMA into three stages each
//!   (two where shared memory holds no more; 128-byte swizzle), K and V on separate "full" /
//!   "empty" mbarriers so that the next K tile streams in as soon as its stage's scores are
//!   computed;
//! - warpgroups 1 and 2, the consumers, each own 64 query rows. S = Q K^T is one chain of
//!   `wgmma.m64n128k16` with both operands in shared memory (K-major), or, under a causal
//!   mask, Q's fragments loaded into registers once (`ldmatrix`); O += P V takes P from
//!   registers (the f32 score accumulators rounded to the io type already sit in wgmma's A
//!   fragment layout) and V from shared memory (N-major, the transpose flag). Inside a
//!   warpgroup the two products are pipelined: tile t's scores are issued together with tile
//!   t-1's P V, and the online softmax of tile t runs while that P V is on the tensor cores;
//!   O is rescaled once the P V is done. The two consumers take turns on the tensor cores
//!   (ping-pong), except at d = 64, which runs faster without. The softmax sits on each
//!   consumer's critical path, so its row maxima and sums are trees, not chains (measured on the
//!   H100: +2-5% on every forward row).
//!
//! The softmax, masks, bias, ALiBi and dropout are those of the general kernel ([`super::fwd`])
//! on the wgmma accumulator layout (thread `l` of warp `w` holds rows `16w + l/4` and `+8`,
//! columns `8n + 2(l%4)` and `+1`). Taken for head dims up to 256 (q/k and v apart), computed on
//! tiles of whole 64-channel chunks whose channels past the head dim TMA fills with zeros (Q K^T
//! takes the head dim's k steps alone; O's extra columns are not stored); above 128, K/V tiles
//! of 64 keys and one Q buffer (`bn`, `stages`). q, k and v with TMA-compatible strides (contiguous head dim, other strides multiples of 16 bytes), no page
//! table and no padding mask (TMA would read K/V rows past a sequence's length; the general
//! kernel zero-fills them), `s_q > 64`. Base pointers that are not 16-byte aligned run the
//! general kernel (the unit's `unaligned` alternative).

use super::hopper::{self, tma_of, SM90};
use super::{Problem, COMMON};
use crate::engine::cuda::kernel::{Arg, Grid, Launch, NodeKernels, Signature, Source, Target, Unaligned, Unit, HOPPER};

/// Query rows per CTA (two consumer warpgroups of 64).
const BM: i64 = 128;

/// Keys per K/V tile: 128, or 64 for head dims above 128 (the consumers' O accumulators take
/// 128 registers a thread at d = 256, and shared memory holds Q and two stages of 64-key K/V
/// tiles).
fn bn(p: &Problem) -> i64 {
    if p.d.max(p.d_v) > 128 {
        64
    } else {
        128
    }
}

/// Dynamic shared memory: `qbufs` Q buffers, `kvs` stages of K and of V, 1 KiB of alignment
/// slack, barriers, the two Q buffers' unit numbers and the split tail's flag.
fn shared_bytes(p: &Problem, kvs: i64, qbufs: i64) -> usize {
    (qbufs * BM * p.d * 2 + kvs * bn(p) * p.d * 2 + kvs * bn(p) * p.d_v * 2 + (4 * kvs + 4 + 3) * 8) as usize + 1024
}

/// K/V stages and Q buffers: three stages where shared memory allows (measured on the H100: +3%
/// at b16h16s1024d64, +1% on the causal rows against two; four gained nothing), else two; two
/// Q buffers (the next item's Q loaded under the current one), else one.
fn stages(p: &Problem) -> Option<(i64, i64)> {
    [(3, 2), (2, 2), (2, 1)].into_iter().find(|&(kvs, qbufs)| shared_bytes(p, kvs, qbufs) <= 227 * 1024)
}

/// Whether the kernel's CTAs take their items by ticket (an atomic counter in scratch, zeroed by
/// a launch before), in list order, instead of every `gridDim.x`-th item: where items differ in
/// size (a causal mask, a window), or are long (more than 16 K/V tiles: b4h16s4096d128 674-675
/// TFLOP/s by ticket against 664-675 with the fixed assignment and 657-667 with one CTA per
/// item; short uniform items keep the fixed assignment, which needs no launch before). With the
/// fixed assignment and unequal items, CTAs that started on heavy items fall behind the others,
/// the items in flight spread over many heads, and their K/V tiles miss L2 (ncu on the H100:
/// b4h16s4096d128 causal read 1.12 GB from DRAM instead of 0.20, L2 hits 52% instead of 86%, SMs
/// active 411 K to 1136 K cycles); by ticket the items in flight are the next `gridDim.x` of the
/// list, as with one CTA per item.
fn dynamic(p: &Problem) -> bool {
    !super::unmasked(p.attrs) || (p.s_kv + bn(p) - 1) / bn(p) > 16
}

/// The kernel's split tail (FA_SPLIT): `nfull` items in whole rounds of `g`
/// CTAs, then the `tail` items left, of `t` K/V tiles each, cut into `g` contiguous ranges of
/// tiles (a CTA's range holds at most two segments of items), each segment's partial O, row
/// maxima and sums stored in scratch and the item combined by the CTA that completes its
/// count.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Split {
    nfull: i64,
    tail: i64,
    t: i64,
    g: i64,
}

/// Whether, and how, the kernel splits its last round: without a mask or window (items of equal
/// size), for long items (more than 16 K/V tiles), where that round leaves CTAs idle, when the
/// longest range plus a tile of overhead is at most 4/5 of an item. b4h16s4096d128 has 2048 items
/// of 32 tiles for 132 SMs, 15.5 rounds: the last 68 items as ranges of at most 17 tiles
/// (measured on the H100: 681 TFLOP/s against 656-671 unsplit). Short items lose: b16h16s1024d64
/// (8 tiles, ranges of at most 5) ran 385-390 split against 431-437.
fn split(p: &Problem, nt: i64, sms: i64) -> Option<Split> {
    let t = (p.s_kv + bn(p) - 1) / bn(p);
    let (g, tail) = (sms.max(1), nt % sms.max(1));
    if !super::unmasked(p.attrs) || t < 2 || tail == 0 {
        return None;
    }
    let longest = (tail * t + g - 1) / g;
    (t > 16 && 5 * (longest + 1) <= 4 * t).then_some(Split { nfull: nt - tail, tail, t, g })
}

/// Whether the consumers take turns (FA_PINGPONG): yes at d = 128 (measured on the H100:
/// without, b4h16s4096d128 1-3% slower), not at d = 64 (b16h16s1024d64 +5% without,
/// 421.6-422.6 against 394.2-401.9 TFLOP/s).
fn pingpong(p: &Problem) -> bool {
    p.d != 64
}

/// Whether the scores take Q from registers (`fa90_q_frags`) instead of shared memory, which
/// spares the K/V tiles' shared-memory reads a fifth of their traffic: under a causal mask
/// (measured on the H100: +2-3% on both causal rows, -1% on b4h16s4096d128), for head dims up
/// to 128 (above, O's accumulators leave no room for them).
fn qreg(p: &Problem) -> bool {
    p.attrs.causal.is_some() && p.d <= 128
}

fn generate(p: &Problem, target: &Target) -> Option<NodeKernels> {
    let node = p.node;
    let (kvs, qbufs) = stages(p)?;
    let bn = bn(p);
    let o = node.output("o")?;
    let stats = node.output("stats");
    let qt = (p.s_q + BM - 1) / BM;
    let nt = qt * p.h_q * p.b;
    let dynamic = dynamic(p);
    let split = split(p, nt, target.sm_count as i64);
    let mut sig = Signature::new();
    for (name, t, rows) in [("tq", p.q, BM), ("tk", p.k, bn), ("tv", p.v, bn)] {
        sig.param(format!("const __grid_constant__ TmaMap {name}"), Arg::TensorMap(Box::new(tma_of(p, t, rows))));
    }
    sig.ptr("o_p", o, true);
    if let Some(s) = stats {
        sig.ptr("stats_p", s, true);
    }
    p.inputs(&mut sig);
    if dynamic || split.is_some() {
        sig.scratch("unsigned", "fa_ticket", 0, true);
    }
    if split.is_some() {
        sig.scratch("float", "fa_part", 1, true);
    }
    let entry = p.entry("attn_fwd_sm90");
    let whole_tiles = super::unmasked(p.attrs) && p.s_q % BM == 0 && p.s_kv % bn == 0;
    let mut src = hopper::heads_group(p, p.source(&entry, &sig, true))
        .flag("FA_WHOLE_TILES", whole_tiles)
        .define("FA_BM", BM)
        .define("FA_BN", bn)
        .flag("FA_HAS_STATS", stats.is_some())
        .flag("FA_PINGPONG", pingpong(p));
    if let Some(s) = stats {
        src = p.stats_store(src, s);
    }
    src = p.output_store(src, "O", o, p.pair_ok(o));
    let (nfull, nu) = split.map_or((nt, nt), |s| (s.nfull, s.nfull + 2 * s.g));
    src = src.define("FA_QT", format!("{qt}LL")).flag("FA_DYNAMIC", dynamic).define("FA_NFULL", format!("{nfull}LL")).define("FA_NU", format!("{nu}LL"));
    src = match split {
        Some(s) => src.flag("FA_SPLIT", true).define("FA_T", format!("{}LL", s.t)).define("FA_TAILW", format!("{}LL", s.tail * s.t)).define("FA_G", format!("{}LL", s.g)),
        None => src.flag("FA_SPLIT", false),
    };
    let source =
        src.flag("FA_QREG", qreg(p)).define("FA_KVS", kvs).define("FA_QBUFS", qbufs).template(COMMON).template(HOPPER).template(SM90).template(include_str!("fwd90.cuh")).build();
    // One CTA per SM (or per item, where there are fewer).
    let grid = match split {
        Some(s) => s.g,
        None => nt.min(target.sm_count.max(1) as i64),
    };
    if grid > i32::MAX as i64 {
        return None;
    }
    let main = Launch::new(source, entry, Grid::Exact(grid as u32, 1, 1), 384, sig.into_args()).with_shared(shared_bytes(p, kvs, qbufs) as u32);
    if !dynamic && split.is_none() {
        return Some(NodeKernels::one(main));
    }
    // The ticket counter and the split items' counts, zeroed before the kernel.
    let words = 1 + split.map_or(0, |s| s.tail);
    let entry = p.entry("attn_fwd_ticket_sm90");
    let mut sig = Signature::new();
    sig.scratch("unsigned", "fa_ticket", 0, true);
    let source = Source::new().entry(&entry, &sig).define("FA_TICKET_WORDS", words).template(include_str!("fwd90_ticket.cuh")).build();
    let zero = Launch::new(source, entry, Grid::Exact(1, 1, 1), 256, sig.into_args());
    // A split tail's partials: two slots per CTA of 256 consumer threads' O, maxima and sums.
    let mut scratch = vec![4 * words as usize];
    if let Some(s) = split {
        scratch.push((2 * s.g * 256 * (p.d_v / 2 + 4) * 4) as usize);
    }
    Some(NodeKernels { launches: vec![zero, main], scratch })
}

/// The Hopper unit of a forward node, when this kernel takes it; the general kernel with
/// element-wise loads is the alternative for base pointers TMA cannot take.
pub(super) fn unit(p: &Problem, target: &Target) -> Option<Unit> {
    if !target.hopper() || !hopper::takes(p, &[p.q, p.k, p.v]) {
        return None;
    }
    // Above head dims of 128, keys that fit one 64-key tile go to the general kernel: for them
    // ptxas serialized this kernel's wgmmas (C7520, a warpgroup arrive it inserted on a
    // divergent path), as it did not for longer keys.
    if p.d.max(p.d_v) > 128 && p.s_kv <= 64 {
        return None;
    }
    let kernels = generate(p, target)?;
    let alternative = super::fwd::generate(p, false)?;
    let node = p.node;
    // TMA needs 16-byte aligned bases; o is stored in 4-byte pairs when its strides allow.
    let mut tensors = vec![p.q, p.k, p.v];
    if p.pair_ok(node.output("o")?) {
        tensors.push(node.output("o")?);
    }
    Some(Unit { nodes: vec![p.ni], kernels, writes: node.outputs.iter().map(|x| x.tensor).collect(), unaligned: Some(Box::new(Unaligned { tensors, kernels: alternative })) })
}
