//! The backward kernels (FlashAttention-2, deterministic: every output element is written by
//! exactly one thread, no atomics).
//!
//! 1. `D_i = do_i . o_i`, a warp per query row, into f32 scratch 0.
//! 2. With dbias: zero the dS target (dbias itself when it has the scores' dims, else an f32
//!    scratch `[b, h_q, s_q, s_kv]`): masked and skipped elements stay 0.
//! 3. dQ: a CTA per (q tile of 64 rows, query head, batch, column chunk); each warp owns 16
//!    rows, loops over the K/V tiles the rows see (double-buffered cp.async), recomputes
//!    S = Q K^T and dP = dO V^T on tensor cores, P = exp2(S - lse), dS = P (dP - D), and adds
//!    dS K into its dQ accumulators; it also stores dS (chunk 0) for dbias.
//! 4. dK/dV: a CTA per (K/V tile of 64 keys, kv head, batch, column chunk); each warp owns 16
//!    keys, loops over the query heads sharing the kv head and their q tiles (Q, dO, lse and D
//!    double-buffered), recomputes S^T = K Q^T and dP^T = V dO^T, and adds P^T dO into dV and
//!    dS^T Q into dK.
//! 5. With a dbias broadcast over batch or heads: the dS scratch summed over those dims, in the
//!    CPU's order, a thread per dbias element.
//! 6. With the sink's gradient: `dsink_h = -sum exp(t_h - lse) D` over the batches and rows, a
//!    CTA per query head (its threads' partial sums added in a fixed order: deterministic). The
//!    sink changes nothing else: the stats carry it. (The Hopper backward adds the same launch
//!    after its own `D`.)
//!
//! Head dims above 128 split the dQ (dK/dV) columns into two chunks, each CTA recomputing the
//! scores for its half (the accumulators of a whole 256-wide row would not fit in registers).
//! Not taken (`None`, the fallback runs): paged K/V (a pool block may gather gradients from
//! several pages), a bias broadcast over query rows or keys when dbias is wanted.

use super::{max_shared, Problem, COMMON};
use crate::engine::cuda::kernel::ctype::{ld, st};
use crate::engine::cuda::kernel::{Arg, Grid, Launch, NodeKernels, Signature, Source, Target, Unaligned, Unit};
use crate::graph::TensorId;

/// Where dS goes for dbias.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Dbias {
    None,
    /// Straight into dbias (it has the scores' dims).
    Direct,
    /// Into f32 scratch 1, then summed over the broadcast batch / head dims.
    Scratch,
}

const NW: i64 = 4;

/// dQ tiles: (BM, BN, chunks).
fn dq_tiles(p: &Problem) -> (i64, i64, i64) {
    let dmax = p.d.max(p.d_v);
    (NW * 16, if dmax <= 128 { 64 } else { 32 }, if p.d > 128 { 2 } else { 1 })
}

/// dK/dV tiles: (BNK, BMQ, chunks).
fn dkdv_tiles(p: &Problem) -> (i64, i64, i64) {
    let dmax = p.d.max(p.d_v);
    (NW * 16, if dmax <= 64 { 64 } else { 32 }, if dmax > 128 { 2 } else { 1 })
}

fn dq_shared(p: &Problem) -> usize {
    let (bm, bn, _) = dq_tiles(p);
    (2 * (bm * (p.d + 8) + bm * (p.d_v + 8) + 2 * bn * (p.d + 8) + 2 * bn * (p.d_v + 8))) as usize
}

fn dkdv_shared(p: &Problem) -> usize {
    let (bnk, bmq, _) = dkdv_tiles(p);
    (2 * (bnk * (p.d + 8) + bnk * (p.d_v + 8) + 2 * bmq * (p.d + 8) + 2 * bmq * (p.d_v + 8)) + 16 * bmq) as usize
}

/// The tensors of a backward node.
pub(super) struct Ports {
    pub o: TensorId,
    pub d_o: TensorId,
    pub stats: TensorId,
    pub dq: TensorId,
    pub dk: TensorId,
    pub dv: TensorId,
    pub dbias: Option<TensorId>,
    /// The sink's gradient (`dsink_token`), with the sink.
    pub dsink: Option<TensorId>,
}

/// A launch of `source` with the arguments of `sig`: the exact `grid`, or with None a
/// grid-stride one over `threads` work items.
pub(super) fn launch(entry: String, source: String, sig: Signature, grid: Option<(i64, i64, i64)>, threads: u64, block: u32, shared: usize) -> Option<Launch> {
    let grid = match grid {
        Some((x, y, z)) => {
            if x > i32::MAX as i64 {
                return None;
            }
            Grid::Exact(x as u32, y as u32, z as u32)
        }
        None => Grid::Cover(threads),
    };
    Some(Launch::new(source, entry, grid, block, sig.into_args()).with_shared(shared as u32))
}

/// A backward kernel's text up to its own defines: the node's (`Problem::source`), dO's strides,
/// the dbias mode and target, the stats loader.
pub(super) fn base(p: &Problem, ports: &Ports, entry: &str, sig: &Signature, mode: Dbias, vec: bool) -> Source {
    let g = p.graph;
    let mut s = p.source(entry, sig, vec);
    s = p.strides(s, "DO", ports.d_o, false).define("DO_VEC", p.vec_mode(vec, ports.d_o)).define("FA_LDQ", p.d + 8).define("FA_NT", NW * 32);
    s = s.define(
        "FA_DBIAS",
        match mode {
            Dbias::None => 0,
            Dbias::Direct => 1,
            Dbias::Scratch => 2,
        },
    );
    if let Some(db) = ports.dbias {
        let d = &g.desc(db).dims;
        s = p.strides(s, "DB", db, false).define("ST_DB", st(g, db)).define("DB_D0", format!("{}LL", d[0])).define("DB_D1", format!("{}LL", d[1]));
    }
    let sd = g.desc(ports.stats);
    s.define("LD_STATS", ld(g, ports.stats))
        .define("ST_S0", format!("{}LL", sd.strides[0]))
        .define("ST_S1", format!("{}LL", sd.strides[1]))
        .define("ST_S2", format!("{}LL", sd.strides[2]))
}

/// The launch of `D_i = do_i . o_i` into f32 scratch 0.
pub(super) fn d_launch(p: &Problem, ports: &Ports, vec: bool) -> Option<Launch> {
    let g = p.graph;
    let rows = (p.b * p.h_q * p.s_q) as u64;
    let entry = p.entry(if vec { "attn_bwd_d" } else { "attn_bwd_d_unaligned" });
    let mut sig = Signature::new();
    sig.scratch("void", "dbuf_p", 0, true).ptr("o_p", ports.o, false).ptr("do_p", ports.d_o, false);
    p.inputs(&mut sig);
    let src = p.strides(base(p, ports, &entry, &sig, Dbias::None, vec), "OI", ports.o, false).define("LD_OI", ld(g, ports.o)).define("LD_DO", ld(g, ports.d_o));
    let source = src.template(COMMON).template(include_str!("bwd_d.cuh")).build();
    launch(entry, source, sig, None, rows * 32, 256, 0)
}

/// The launch of the sink's gradient from `D` (f32 scratch 0, `[b, h_q, s_q]`, which the general
/// and the Hopper `D` kernels both write) and the stats, when the node has one: `Some(None)`
/// without a sink, `None` when it cannot be launched.
pub(super) fn dsink_launch(p: &Problem, ports: &Ports, vec: bool) -> Option<Option<Launch>> {
    let (Some(ds), Some(_)) = (ports.dsink, p.sink) else { return Some(None) };
    let g = p.graph;
    let entry = p.entry(if vec { "attn_bwd_dsink" } else { "attn_bwd_dsink_unaligned" });
    let mut sig = Signature::new();
    sig.ptr("dsink_p", ds, true).scratch("void", "dbuf_p", 0, false).ptr("stats_p", ports.stats, false);
    p.inputs(&mut sig);
    let src = base(p, ports, &entry, &sig, Dbias::None, vec).define("ST_DSINK", st(g, ds)).define("DSINK_S1", format!("{}LL", g.desc(ds).strides[1]));
    let source = src.template(COMMON).template(include_str!("bwd_dsink.cuh")).build();
    Some(Some(launch(entry, source, sig, Some((p.h_q, 1, 1)), 0, 256, 0)?))
}

pub(super) fn generate(p: &Problem, ports: &Ports, mode: Dbias, vec: bool) -> Option<NodeKernels> {
    let g = p.graph;
    let rows = (p.b * p.h_q * p.s_q) as u64;
    let scores = (p.b * p.h_q * p.s_q * p.s_kv) as u64;
    let mut launches = vec![d_launch(p, ports, vec)?];
    let suffix = if vec { "" } else { "_unaligned" };
    launches.extend(dsink_launch(p, ports, vec)?);

    // 2. Zero the dS target.
    let ds_arg = match mode {
        Dbias::Direct => ports.dbias.map(Arg::Ptr),
        Dbias::Scratch => Some(Arg::Scratch(1)),
        Dbias::None => None,
    };
    if let Some(a) = &ds_arg {
        let entry = p.entry(&format!("attn_bwd_zero{suffix}"));
        let mut sig = Signature::new();
        sig.param("void* db_p", a.clone());
        let source = base(p, ports, &entry, &sig, mode, vec).template(COMMON).template(include_str!("bwd_zero.cuh")).build();
        launches.push(launch(entry, source, sig, None, scores, 256, 0)?);
    }
    // The inputs of the dQ and dK/dV kernels, after their outputs.
    let inputs = |sig: &mut Signature| {
        sig.scratch("void", "dbuf_p", 0, false).ptr("q_p", p.q, false).ptr("k_p", p.k, false).ptr("v_p", p.v, false).ptr("do_p", ports.d_o, false).ptr(
            "stats_p",
            ports.stats,
            false,
        );
        p.inputs(sig);
    };

    // 3. dQ.
    let (bm, bn, nch) = dq_tiles(p);
    let entry = p.entry(&format!("attn_bwd_dq{suffix}"));
    let mut sig = Signature::new();
    sig.ptr("dq_p", ports.dq, true);
    if let Some(a) = &ds_arg {
        sig.param("void* db_p", a.clone());
    }
    inputs(&mut sig);
    let src = base(p, ports, &entry, &sig, mode, vec).define("FA_BM", bm).define("FA_BN", bn).define("FA_NCH", nch).define("FA_CW", p.d / nch);
    let source = p.output_store(src, "DQ", ports.dq, vec && p.pair_ok(ports.dq)).template(COMMON).template(include_str!("bwd_dq.cuh")).build();
    let nqt = (p.s_q + bm - 1) / bm;
    launches.push(launch(entry, source, sig, Some((nqt * nch, p.h_q, p.b)), 0, (NW * 32) as u32, dq_shared(p))?);

    // 4. dK, dV.
    let (bnk, bmq, nch) = dkdv_tiles(p);
    let entry = p.entry(&format!("attn_bwd_dkdv{suffix}"));
    let mut sig = Signature::new();
    sig.ptr("dk_p", ports.dk, true).ptr("dv_p", ports.dv, true);
    inputs(&mut sig);
    let src = base(p, ports, &entry, &sig, mode, vec).define("FA_BNK", bnk).define("FA_BMQ", bmq).define("FA_NCH", nch).define("FA_CW", p.d / nch).define("FA_CWV", p.d_v / nch);
    let src = p.output_store(src, "DK", ports.dk, vec && p.pair_ok(ports.dk));
    let source = p.output_store(src, "DV", ports.dv, vec && p.pair_ok(ports.dv)).template(COMMON).template(include_str!("bwd_dkdv.cuh")).build();
    let nkt = (p.s_kv + bnk - 1) / bnk;
    launches.push(launch(entry, source, sig, Some((nkt * nch, p.h_kv, p.b)), 0, (NW * 32) as u32, dkdv_shared(p))?);

    // 5. dbias from the scratch.
    if let (Dbias::Scratch, Some(db)) = (mode, ports.dbias) {
        let n = g.desc(db).element_count().max(0) as u64;
        let entry = p.entry(&format!("attn_bwd_dbias{suffix}"));
        let mut sig = Signature::new();
        sig.ptr("db_p", db, true).scratch("void", "ds_p", 1, false);
        let source = base(p, ports, &entry, &sig, mode, vec).template(COMMON).template(include_str!("bwd_dbias.cuh")).build();
        launches.push(launch(entry, source, sig, None, n, 256, 0)?);
    }
    let mut scratch = vec![(rows as usize).max(1) * 4];
    if mode == Dbias::Scratch {
        scratch.push((scores as usize).max(1) * 4);
    }
    Some(NodeKernels { launches, scratch })
}

pub(super) fn unit(p: &Problem, target: &Target) -> Option<Unit> {
    if p.paged.is_some() {
        return None;
    }
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
    let (_, _, nch) = dkdv_tiles(p);
    if nch == 2 && (p.d % 32 != 0 || p.d_v % 32 != 0) {
        return None;
    }
    if dq_shared(p).max(dkdv_shared(p)) > max_shared(target) {
        return None;
    }
    let mode = match (ports.dbias, p.bias) {
        (Some(db), Some(_)) => {
            let d = &p.graph.desc(db).dims;
            if d.len() != 4 || d[2] != p.s_q || d[3] != p.s_kv {
                return None;
            }
            if d[0] == p.b && d[1] == p.h_q {
                Dbias::Direct
            } else {
                // The f32 dS scratch: keep it under 4 GiB.
                if p.b * p.h_q * p.s_q * p.s_kv > (1 << 30) {
                    return None;
                }
                Dbias::Scratch
            }
        }
        (Some(_), None) => return None,
        _ => Dbias::None,
    };
    let kernels = generate(p, &ports, mode, true)?;
    let mut needs: Vec<TensorId> = [p.q, p.k, p.v, ports.d_o].into_iter().filter(|&t| p.vec_ok(t)).collect();
    needs.extend([ports.dq, ports.dk, ports.dv].into_iter().filter(|&t| p.pair_ok(t)));
    let unaligned = if needs.is_empty() { None } else { Some(Box::new(Unaligned { tensors: needs, kernels: generate(p, &ports, mode, false)? })) };
    Some(Unit { nodes: vec![p.ni], kernels, writes: node.outputs.iter().map(|x| x.tensor).collect(), unaligned })
}
