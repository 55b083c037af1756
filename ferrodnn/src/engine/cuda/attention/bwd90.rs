//! The Hopper backward kernels: the general backward's three passes ([`super::bwd`]: `D`, dQ,
//! dK/dV; deterministic, no atomics) with the two heavy ones on `wgmma`, TMA and warp
//! specialization (one producer warpgroup, two consumer warpgroups of 64 rows each).
//!
//! - dK/dV: a CTA per (128 keys, kv head, batch) keeps its K and V tiles in shared memory and
//!   loops over the query heads sharing the kv head and their q tiles of 64 rows (Q and dO by
//!   TMA, three stages; a producer warp stages each tile's lse and D in shared memory). Per step
//!   and consumer: S^T = K Q^T and dP^T = V dO^T (both operands from shared memory), P^T =
//!   exp2(S^T - lse) while dP^T is still on the tensor cores, dV += P^T dO with P^T from
//!   registers, then dS^T = P^T (dP^T - D) and dK += dS^T Q, again from registers.
//! - dQ: a CTA per (128 query rows, head, batch) keeps Q and dO and loops over the K/V tiles of
//!   64 keys (two stages): S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K.
//! - Or, with the `atomics` plan knob and no sliding window (where it pays, see
//!   [`super::atomic_dq_pays`]): no dQ pass; the dK/dV kernel also stores each step's dS^T in
//!   shared memory and the consumers compute dQ += dS K for the step's 64 query rows over the
//!   CTA's 128 keys (at d = 128 one 64-channel chunk each, issued between the two halves of
//!   the dK product so that the tensor cores run on while dQ is staged; at d = 64 the chunk
//!   goes to one consumer a step, after the dK product), staged as 64 x 64 f32 tiles in shared
//!   memory and added with bulk reductions (`cp.reduce.async.bulk .add.f32`, issued by a
//!   reducer warp of the producer warpgroup) into a zeroed, tiled f32 accumulator; a last
//!   launch writes dQ from it. The order of the additions varies from run to run (the plan's
//!   behavior notes say non-deterministic).
//! - Under a causal mask the CTAs take their tiles heaviest first (`fa90_work`), and the dK/dV
//!   kernel walks a K/V tile's q tiles from the last one down (`FA_QTILE`).
//! - 256-wide heads (`wide`: a 64 x 256 f32 accumulator is all of a warpgroup's registers): a
//!   CTA per 64 keys (dK/dV) or 64 query rows (dQ), the two consumers sharing each 64 x 64 block
//!   (`bwd90_wide.cuh`). dK/dV: consumer 0 computes S^T and P^T and adds P^T dO into dV,
//!   consumer 1 computes dP^T, takes P^T through shared memory, and adds dS^T Q into dK. dQ:
//!   consumer 0 computes S and P, consumer 1 dP and dS, which it hands back, and each adds dS K
//!   into its 128 columns of dQ. Deterministic only (the `atomics` knob changes nothing here).
//!
//! Masks, bias, ALiBi and dropout as in the general kernels (the dropout mask is regenerated
//! once per element and kept as bits between P and dS). Taken when [`super::hopper::takes`]
//! holds (head dims up to 128 on 64-channel tiles, or 256-wide tiles for q/k and v alike; no
//! paging or padding mask) and no dbias is asked for. The sink's gradient is the general backward's launch after `D` (the sink changes
//! nothing else here: the stats carry it).

use super::bwd::{self, Dbias, Ports};
use super::hopper::{self, tma_of, SM90};
use super::{Problem, COMMON};
use crate::engine::cuda::kernel::{Arg, Launch, NodeKernels, Options, Signature, Source, Target, Unaligned, Unit, HOPPER};

/// dK/dV: keys per CTA (two consumers of 64) and query rows per step.
const KV_BK: i64 = 128;
const KV_BQ: i64 = 64;
/// dQ: query rows per CTA (two consumers of 64) and keys per step.
const Q_BM: i64 = 128;
const Q_BN: i64 = 64;

/// Stages of Q and dO in the dK/dV kernel: three keep more loads in flight while the two
/// consumers hold a stage for a whole step (measured on the H100 against two: +5% on the causal
/// backward, the same elsewhere).
const KV_QS: i64 = 3;

/// The wide kernels' tiles (keys per dK/dV CTA, query rows per dQ CTA, and each one's steps
/// along the other side) and stages of Q and dO.
const WIDE_B: i64 = 64;
const WIDE_QS: i64 = 2;
/// A hand-over buffer of the wide kernels (`FA90_HAND_BYTES`) and the dQ kernel's dS fragments.
const HAND_BYTES: i64 = 33 * 128 * 4;
const DS_FRAG_BYTES: i64 = 16 * 128 * 4;

/// Whether the wide kernels compute the problem: q/k and v tiles 256 wide.
fn wide(p: &Problem) -> bool {
    p.d == 256 && p.d_v == 256
}

/// The dK/dV kernel's shared memory: KV_QS stages of Q and dO (and their lse and D rows), and
/// with `atomic` the dS^T buffers and the dQ staging tiles of the bulk reductions; for the wide
/// kernel 64 keys, WIDE_QS stages and the hand-over buffer.
fn dkdv_shared(p: &Problem, atomic: bool) -> usize {
    if wide(p) {
        return (WIDE_B * (p.d + p.d_v) * 2 + WIDE_QS * WIDE_B * (p.d + p.d_v) * 2 + HAND_BYTES + 2 * WIDE_QS * WIDE_B * 4) as usize + 1024 + 64;
    }
    let ds = if atomic { 2 * KV_BK * KV_BQ * 2 + 2 * 64 * 64 * 4 } else { 0 };
    (KV_BK * (p.d + p.d_v) * 2 + KV_QS * KV_BQ * (p.d + p.d_v) * 2 + ds + 2 * KV_QS * KV_BQ * 4) as usize + 1024 + 64
}

/// Whether the `D` launch reads O and dO 16 bytes at a time: both in the io type with rows
/// 16-byte aligned (dO's alignment is a condition of these kernels already; O's base pointer is
/// then checked at execution, see `unit`).
fn d_vec(p: &Problem, ports: &Ports) -> bool {
    [ports.o, ports.d_o].iter().all(|&t| p.vec_ok(t) && p.graph.resolved_data_type(t) == Some(p.dt)) && p.d_v % 8 == 0
}

fn dq_shared(p: &Problem) -> usize {
    if wide(p) {
        // (Nine barriers.)
        return (WIDE_B * (p.d + p.d_v) * 2 + 2 * WIDE_B * (p.d + p.d_v) * 2 + HAND_BYTES + DS_FRAG_BYTES) as usize + 1024 + 72;
    }
    (Q_BM * (p.d + p.d_v) * 2 + 2 * Q_BN * (p.d + p.d_v) * 2) as usize + 1024 + 64
}

/// The launches: `D`, then either the dQ and dK/dV kernels (deterministic), or (`atomic`) the
/// dK/dV kernel adding each step's dS K into a zeroed f32 accumulator and a last pass that
/// writes dQ from it.
fn generate(p: &Problem, ports: &Ports, atomic: bool) -> Option<NodeKernels> {
    // The atomic path's dQ by bulk reductions of 64 x 64 tiles: the accumulator is tiled, with
    // rows padded to whole tiles.
    let nqt = (p.s_q + 63) / 64;
    let acc_rows = nqt * 64;
    // A kernel's text up to its own defines.
    let base = |entry: &str, sig: &Signature| {
        hopper::heads_group(p, bwd::base(p, ports, entry, sig, Dbias::None, true))
            .define("FA_NQT", format!("{nqt}LL"))
            .define("FA_DQA_ROWS", format!("{acc_rows}LL"))
            .flag("FA_SPLIT_DK", p.d == 128)
    };
    // The TMA maps of Q, dO, K and V, the first parameters of the dQ and dK/dV kernels.
    let maps = |sig: &mut Signature, rows_q: i64, rows_k: i64| {
        for (name, t, rows) in [("tq", p.q, rows_q), ("tdo", ports.d_o, rows_q), ("tk", p.k, rows_k), ("tv", p.v, rows_k)] {
            sig.param(format!("const __grid_constant__ TmaMap {name}"), Arg::TensorMap(Box::new(tma_of(p, t, rows))));
        }
    };
    // Their inputs, after their outputs.
    let inputs = |sig: &mut Signature| {
        sig.scratch("void", "dbuf_p", 0, false).ptr("stats_p", ports.stats, false);
        p.inputs(sig);
    };
    let rows = (p.b * p.h_q * p.s_q) as usize;
    let mut scratch = vec![rows.max(1) * 4];
    let acc_elems = (p.b * p.h_q * acc_rows * p.d) as u64;
    if atomic {
        scratch.push(acc_elems as usize * 4);
    }
    let hopper_source = |src: Source, template: &str| src.template(COMMON).template(HOPPER).template(SM90).template(include_str!("bwd90.cuh")).template(template).build();

    // D, with 16-byte loads where O allows them (dO does, see `unit`), zeroing the atomic
    // path's accumulator in the same launch; else the general D kernel and a zeroing launch.
    let mut launches = Vec::new();
    if d_vec(p, ports) {
        let entry = p.entry("attn_bwd_d_sm90");
        let mut sig = Signature::new();
        sig.scratch("void", "dbuf_p", 0, true).ptr("o_p", ports.o, false).ptr("do_p", ports.d_o, false);
        sig.param("void* dqa_p", if atomic { Arg::Scratch(1) } else { Arg::Scratch(0) });
        let src = p.strides(base(&entry, &sig), "OI", ports.o, false).flag("FA_ZERO_ACC", atomic);
        let source = src.template(COMMON).template(include_str!("bwd90_acc.cuh")).template(include_str!("bwd90_d.cuh")).build();
        let threads = (rows as u64 * (p.d_v / 8) as u64).max(if atomic { acc_elems / 4 } else { 0 });
        launches.push(Launch::elementwise(source, &entry, threads, sig.into_args()));
    } else {
        if atomic {
            let entry = p.entry("attn_bwd_dq_zero_sm90");
            let mut sig = Signature::new();
            sig.scratch("void", "dqa_p", 1, true);
            let source = base(&entry, &sig).template(COMMON).template(include_str!("bwd90_acc.cuh")).template(include_str!("bwd90_zero.cuh")).build();
            launches.push(bwd::launch(entry, source, sig, None, acc_elems / 4, 256, 0)?);
        }
        launches.push(bwd::d_launch(p, ports, true)?);
    }
    // The sink's gradient, from D and the stats (the general backward's launch).
    launches.extend(bwd::dsink_launch(p, ports, true)?);

    // dQ (deterministic).
    let wide = wide(p);
    let ([q_bm, q_bn], [kv_bk, kv_bq, kv_qs]) = if wide { ([WIDE_B; 2], [WIDE_B, WIDE_B, WIDE_QS]) } else { ([Q_BM, Q_BN], [KV_BK, KV_BQ, KV_QS]) };
    let (dq_template, dkdv_template) = if wide {
        (concat!(include_str!("bwd90_wide.cuh"), include_str!("bwd90_dq_wide.cuh")), concat!(include_str!("bwd90_wide.cuh"), include_str!("bwd90_dkdv_wide.cuh")))
    } else {
        (include_str!("bwd90_dq.cuh"), include_str!("bwd90_dkdv.cuh"))
    };
    if !atomic {
        let entry = p.entry(if wide { "attn_bwd_dq_wide_sm90" } else { "attn_bwd_dq_sm90" });
        let mut sig = Signature::new();
        maps(&mut sig, q_bm, q_bn);
        sig.ptr("dq_p", ports.dq, true);
        inputs(&mut sig);
        let src = p.output_store(base(&entry, &sig).define("FA_BM", q_bm).define("FA_BN", q_bn), "DQ", ports.dq, p.pair_ok(ports.dq));
        let source = hopper_source(src, dq_template);
        launches.push(bwd::launch(entry, source, sig, Some(((p.s_q + q_bm - 1) / q_bm, p.h_q, p.b)), 0, 384, dq_shared(p))?);
    }

    // dK, dV (and the dQ products with `atomic`).
    let entry = p.entry(match (wide, atomic) {
        (true, _) => "attn_bwd_dkdv_wide_sm90",
        (false, true) => "attn_bwd_dkdv_dq_sm90",
        (false, false) => "attn_bwd_dkdv_sm90",
    });
    let mut sig = Signature::new();
    maps(&mut sig, kv_bq, kv_bk);
    sig.ptr("dk_p", ports.dk, true).ptr("dv_p", ports.dv, true);
    if atomic {
        sig.scratch("void", "dqa_p", 1, true);
    }
    inputs(&mut sig);
    let src = base(&entry, &sig).define("FA_BK", kv_bk).define("FA_BQ", kv_bq).flag("FA_ATOMIC_DQ", atomic).define("FA_QS", kv_qs).flag("FA_QREV", p.attrs.causal.is_some());
    let src = p.output_store(src, "DK", ports.dk, p.pair_ok(ports.dk));
    let source = hopper_source(p.output_store(src, "DV", ports.dv, p.pair_ok(ports.dv)), dkdv_template);
    launches.push(bwd::launch(entry, source, sig, Some(((p.s_kv + kv_bk - 1) / kv_bk, p.h_kv, p.b)), 0, 384, dkdv_shared(p, atomic))?);

    if atomic {
        let entry = p.entry("attn_bwd_dq_acc_sm90");
        let mut sig = Signature::new();
        sig.ptr("dq_p", ports.dq, true).scratch("void", "dqa_p", 1, false).attr("fa_scale", p.scale, false);
        let source = p.output_store(base(&entry, &sig), "DQ", ports.dq, p.pair_ok(ports.dq)).template(COMMON).template(include_str!("bwd90_dq_acc.cuh")).build();
        launches.push(bwd::launch(entry, source, sig, None, rows as u64 * (p.dr / 4) as u64, 256, 0)?);
    }
    Some(NodeKernels { launches, scratch })
}

/// The Hopper unit of a backward node without dbias, when these kernels take it; the general
/// kernels with element-wise loads are the alternative for base pointers TMA cannot take.
pub(super) fn unit(p: &Problem, target: &Target, options: &Options) -> Option<Unit> {
    let node = p.node;
    let ports = Ports {
        o: node.input("o")?,
        d_o: node.input("do")?,
        stats: node.input("stats")?,
        dq: node.output("dq")?,
        dk: node.output("dk")?,
        dv: node.output("dv")?,
        dbias: node.output("dbias"),
        dsink: node.output("dsink_token"),
    };
    // (q/k and v tiles of different widths run the general kernels: with a window, ptxas
    // serialized the dK/dV kernel's wgmmas for want of registers, C7512, at 128 against 64 and
    // at 64 against 128.)
    if !target.hopper() || ports.dbias.is_some() || (p.d.max(p.d_v) > 128 && !wide(p)) || p.d != p.d_v || !hopper::takes(p, &[p.q, p.k, p.v, ports.d_o]) {
        return None;
    }
    // dQ by float atomics in the dK/dV pass when the plan allows them (the `atomics` knob) and
    // they pay (not for the wide kernels).
    let atomic = options.atomics && super::atomic_dq_pays(p.attrs) && !wide(p);
    if dq_shared(p).max(dkdv_shared(p, atomic)) > 227 * 1024 {
        return None;
    }
    let kernels = generate(p, &ports, atomic)?;
    let alternative = bwd::generate(p, &ports, Dbias::None, false)?;
    let mut tensors = vec![p.q, p.k, p.v, ports.d_o];
    if d_vec(p, &ports) {
        tensors.push(ports.o);
    }
    tensors.extend([ports.dq, ports.dk, ports.dv].into_iter().filter(|&t| p.pair_ok(t)));
    Some(Unit { nodes: vec![p.ni], kernels, writes: node.outputs.iter().map(|x| x.tensor).collect(), unaligned: Some(Box::new(Unaligned { tensors, kernels: alternative })) })
}
