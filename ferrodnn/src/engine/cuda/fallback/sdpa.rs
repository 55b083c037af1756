//! Scaled dot-product attention, forward and backward, in double, following
//! `engine::cpu::sdpa` literally (masks, padding, ALiBi, dropout, paging, empty rows).
//!
//! Forward: one launch, one thread per query row `(b, h, i)` (grid-stride): a pass over the keys
//! for the row max, one for the sum of `exp(s - max)`, one accumulating `o` (local array of
//! `d_v` doubles); writes `o` and `stats`, and with `rng_dump` the row's dropout mask.
//!
//! Backward (no atomics, every output element written by exactly one thread):
//! 1. one thread per query row: `D_i = do_i . o_i` into scratch 0 (doubles);
//! 2. one thread per query row: the `dq` row (loop over keys);
//! 3. one thread per `dk` row (a logical key `(b, h_k, t)`, or a pool row `(block, h_k, r)`
//!    with paging, which loops over the (batch, page) pairs that read the block): loops over
//!    the query heads of the K head's group and their queries;
//! 4. the same for `dv` (V heads, pages through `page_table_v`);
//! 5. with `dbias`: one thread per bias element, summing dS over the broadcast dims in the CPU's
//!    row-major order;
//! 6. with `dsink_token`: one thread per query head, summing `exp(t_h - stats) D` over the
//!    batches and rows in the CPU's order.
//!
//! The sink token (`sink_token`) starts each row's max and sum in the forward pass, whose
//! `score_max` / `score_sum_exp` outputs are that max and sum.
//!
//! Sizes (dims) and attributes are compiled in; strides arrive in `TRef`s; the attention scale
//! and the dropout probability (with its keep scale) are parameters, which a user may change
//! between executes. The device code is `sdpa.cuh`, after `philox.cuh` for the dropout.

use super::rng::PHILOX;
use super::{c_double, Arg, Ctx, Launch, NodeKernels};
use crate::engine::cuda::kernel::{Attr, Signature, Source};
use crate::error::Result;
use crate::graph::ops::sdpa::{alibi_slopes, CausalAlignment, SdpaAttrs, RAGGED_PORTS};
use crate::graph::TensorId;

/// The sizes of a node, from its validated tensors.
struct Sizes {
    b: i64,
    h_q: i64,
    h_k: i64,
    h_v: i64,
    s_q: i64,
    s_kv: i64,
    d: i64,
    d_v: i64,
}

/// The defines and the `Att` parameters common to a node's kernels.
struct Common {
    defines: Vec<(&'static str, String)>,
    /// The `Att` parameters (declaration and argument), after each kernel's own.
    params: Vec<(String, Arg)>,
    sizes: Sizes,
    paged: Option<(TensorId, TensorId)>,
}

fn common(ctx: &Ctx, a: &SdpaAttrs, backward: bool) -> Result<Common> {
    let q = ctx.input("q")?;
    let k = ctx.input("k")?;
    let v = ctx.input("v")?;
    let (qd, kd, vd) = (ctx.dims(q), ctx.dims(k), ctx.dims(v));
    if qd.len() != 4 || kd.len() != 4 || vd.len() != 4 {
        return Err(ctx.err("q, k and v must have rank 4"));
    }
    let paged = match (ctx.node.input("page_table_k"), ctx.node.input("page_table_v")) {
        (Some(tk), Some(tv)) => Some((tk, tv)),
        _ => None,
    };
    let s_kv = match paged {
        Some((tk, _)) => ctx.dims(tk).get(2).copied().unwrap_or(0) * kd[2],
        None => kd[2],
    };
    let sizes = Sizes { b: qd[0], h_q: qd[1], h_k: kd[1], h_v: vd[1], s_q: qd[2], s_kv, d: qd[3], d_v: vd[3] };
    if sizes.h_k <= 0 || sizes.h_v <= 0 || sizes.h_q % sizes.h_k != 0 || sizes.h_q % sizes.h_v != 0 {
        return Err(ctx.err(format!("q has {} heads, not a multiple of the {} heads of k and the {} of v", sizes.h_q, sizes.h_k, sizes.h_v)));
    }
    let bias = ctx.node.input("bias");
    let padding = a.padding_mask;
    let dropout = a.dropout.filter(|&p| p > 0.0);
    let scale = Attr::of(ctx.node, "attn_scale", a.attn_scale.unwrap_or(1.0 / (sizes.d as f64).sqrt()));
    let flag = |b: bool| (b as u8).to_string();
    // Windows past 2^62 mask nothing either way; capping keeps `diag -/+ w` from overflowing.
    let cap = |w: i64| w.min(1 << 62);

    let mut defines = vec![
        ("SD_B", format!("{}LL", sizes.b)),
        ("SD_HQ", format!("{}LL", sizes.h_q)),
        ("SD_HK", format!("{}LL", sizes.h_k)),
        ("SD_HV", format!("{}LL", sizes.h_v)),
        ("SD_SQ", format!("{}LL", sizes.s_q)),
        ("SD_SKV", format!("{}LL", sizes.s_kv)),
        ("SD_D", format!("{}", sizes.d)),
        ("SD_DV", format!("{}", sizes.d_v)),
        ("SD_GROUP_K", format!("{}LL", sizes.h_q / sizes.h_k)),
        ("SD_GROUP_V", format!("{}LL", sizes.h_q / sizes.h_v)),
        ("SD_CAUSAL", flag(a.causal.is_some())),
        ("SD_BOTTOM_RIGHT", flag(a.diagonal() == CausalAlignment::BottomRight)),
        ("SD_HAS_SWL", flag(a.sliding_window_left.is_some())),
        ("SD_SWL", format!("{}LL", cap(a.sliding_window_left.unwrap_or(0)))),
        ("SD_HAS_SWR", flag(a.sliding_window_right.is_some())),
        ("SD_SWR", format!("{}LL", cap(a.sliding_window_right.unwrap_or(0)))),
        ("SD_HAS_BIAS", flag(bias.is_some())),
        ("SD_PADDING", flag(padding)),
        ("SD_ALIBI", flag(a.alibi)),
        ("SD_DROPOUT", flag(dropout.is_some())),
        ("SD_PAGED", flag(paged.is_some())),
        ("SD_BACKWARD", flag(backward)),
        ("SD_HAS_SINK", flag(ctx.node.input("sink_token").is_some())),
    ];

    // Tensor `id` as the parameters `<field>_p` and `<tref>_r` (sdpa.cuh's SD_INIT copies them
    // into `Att`), loaded with `load`.
    let mut params = Vec::new();
    let mut tensor = |defines: &mut Vec<(&'static str, String)>, field: &str, tref: &str, load: &'static str, id: TensorId| {
        params.extend([(format!("const void* {field}_p"), Arg::Ptr(id)), (format!("TRef {tref}_r"), Arg::Ref(id))]);
        defines.push((load, ctx.ld(id)));
    };
    tensor(&mut defines, "q", "tq", "LD_Q", q);
    tensor(&mut defines, "k", "tk", "LD_K", k);
    tensor(&mut defines, "v", "tv", "LD_V", v);
    if let Some(b) = bias {
        tensor(&mut defines, "bias", "tb", "LD_BIAS", b);
    }
    if padding {
        tensor(&mut defines, "slq", "tslq", "LD_SLQ", ctx.input("seq_len_q")?);
        tensor(&mut defines, "slkv", "tslkv", "LD_SLKV", ctx.input("seq_len_kv")?);
    }
    if let Some((tk, tv)) = paged {
        tensor(&mut defines, "ptk", "tptk", "LD_PTK", tk);
        tensor(&mut defines, "ptv", "tptv", "LD_PTV", tv);
    }
    if let Some(t) = ctx.node.input("sink_token") {
        tensor(&mut defines, "sink", "tsink", "LD_SINK", t);
    }
    if backward {
        tensor(&mut defines, "o", "to", "LD_O", ctx.input("o")?);
        tensor(&mut defines, "dout", "tdo", "LD_DO", ctx.input("do")?);
        tensor(&mut defines, "st", "tst", "LD_STATS", ctx.input("stats")?);
    }
    params.push(("double sd_scale".to_string(), scale.arg(true)));
    if let Some(p) = dropout {
        let (seed, offset) = (ctx.input("seed")?, ctx.input("offset")?);
        params.extend([("const void* seed_p".to_string(), Arg::Ptr(seed)), ("const void* offset_p".to_string(), Arg::Ptr(offset))]);
        params.extend([("double sd_dropout_p".to_string(), Arg::F64(p)), ("double sd_dropout_keep".to_string(), Arg::F64(1.0 / (1.0 - p)))]);
        defines.extend([("LD_SEED", ctx.ld(seed)), ("LD_OFFSET", ctx.ld(offset))]);
    }
    // Ragged tensors: their offsets as `rg<i>_p` / `rg<i>_s` (the SD_RG_* index of sdpa.cuh),
    // listed in SD_RAGGED(X) as X(index, load).
    let mut ragged = String::new();
    for (i, port) in RAGGED_PORTS.into_iter().enumerate() {
        if let Some(r) = ctx.node.input(&format!("{}{port}", crate::graph::RAGGED_PORT_PREFIX)) {
            params.extend([(format!("const void* rg{i}_p"), Arg::Ptr(r)), (format!("i64 rg{i}_s"), Arg::I64(ctx.graph.desc(r).vector_stride()))]);
            ragged.push_str(&format!(" X({i}, {})", ctx.ld(r)));
        }
    }
    defines.push(("SD_RAGGED(X)", ragged));
    if a.alibi {
        let slopes = alibi_slopes(sizes.h_q.max(0) as usize);
        defines.push(("SD_SLOPES(X)", slopes.iter().enumerate().map(|(h, s)| format!(" X({h}, {})", c_double(*s))).collect()));
    }
    Ok(Common { defines, params, sizes, paged })
}

/// One launch of kernel `kernel` of sdpa.cuh (SD_FORWARD, ...) over `threads` threads: the
/// kernel's own parameters (`own`) first, then the common ones; `extra` are the kernel's own
/// defines.
fn launch(ctx: &Ctx, c: &Common, kernel: &str, what: &str, own: Signature, extra: Vec<(&str, String)>, threads: u64) -> Launch {
    let entry = ctx.entry(what);
    let mut sig = own;
    for (decl, arg) in &c.params {
        sig.param(decl.as_str(), arg.clone());
    }
    let mut source = Source::new().entry(&entry, &sig).define("SD_KERNEL", kernel);
    for (name, value) in c.defines.iter().cloned().chain(extra) {
        source = source.define(name, value);
    }
    let source = source.template(PHILOX).template(include_str!("sdpa.cuh")).build();
    Launch::elementwise(source, &entry, threads, sig.into_args())
}

fn rows(s: &Sizes) -> u64 {
    (s.b * s.h_q * s.s_q).max(0) as u64
}

pub(super) fn sdpa(ctx: &Ctx, a: &SdpaAttrs) -> Result<NodeKernels> {
    let c = common(ctx, a, false)?;
    let o = ctx.output("o")?;
    let stats = ctx.node.output("stats");
    let mut own = Signature::new();
    own.tensor("o_", o, true);
    let dump = ctx.node.output("rng_dump");
    let mut extra = vec![("ST_O", ctx.st(o)), ("SD_HAS_STATS", (stats.is_some() as u8).to_string()), ("SD_HAS_DUMP", (dump.is_some() as u8).to_string())];
    if let Some(st) = stats {
        own.tensor("stats_", st, true);
        extra.push(("ST_STATS", ctx.st(st)));
    }
    // The score statistics: each a row value, as stats.
    for (port, field, has, store) in [("score_max", "smax_", "SD_HAS_SMAX", "ST_SMAX"), ("score_sum_exp", "ssum_", "SD_HAS_SSUM", "ST_SSUM")] {
        let t = ctx.node.output(port);
        extra.push((has, (t.is_some() as u8).to_string()));
        if let Some(t) = t {
            own.tensor(field, t, true);
            extra.push((store, ctx.st(t)));
        }
    }
    if let Some(m) = dump {
        own.tensor("dump_", m, true);
        extra.push(("ST_DUMP", ctx.st(m)));
    }
    Ok(NodeKernels::one(launch(ctx, &c, "SD_FORWARD", "sdpa_fwd", own, extra, rows(&c.sizes))))
}

pub(super) fn sdpa_backward(ctx: &Ctx, a: &SdpaAttrs) -> Result<NodeKernels> {
    let c = common(ctx, a, true)?;
    let s = &c.sizes;
    let mut launches = Vec::new();
    // 1. D per row.
    let mut own = Signature::new();
    own.scratch("void", "dbuf_", 0, true);
    launches.push(launch(ctx, &c, "SD_ROW_D", "sdpa_bwd_d", own, Vec::new(), rows(s)));
    // 2. dq.
    let dq = ctx.output("dq")?;
    let mut own = Signature::new();
    own.tensor("dq_", dq, true).scratch("void", "dbuf_", 0, false);
    launches.push(launch(ctx, &c, "SD_DQ", "sdpa_bwd_dq", own, vec![("ST_DQ", ctx.st(dq))], rows(s)));
    // 3, 4. dk and dv (pool-shaped when paged).
    for (port, grad_k) in [("dk", true), ("dv", false)] {
        let g = ctx.output(port)?;
        let gd = ctx.dims(g);
        let width = if grad_k { s.d } else { s.d_v };
        let group = if grad_k { "SD_GROUP_K" } else { "SD_GROUP_V" };
        let mut extra = vec![("ST_GRAD", ctx.st(g)), ("SD_GRAD_K", (grad_k as u8).to_string()), ("SD_G", width.to_string()), ("SD_GROUP_G", group.to_string())];
        if let Some((tk, tv)) = c.paged {
            let table = if grad_k { tk } else { tv };
            extra.push(("PT_PAGES", format!("{}LL", ctx.dims(table).get(2).copied().unwrap_or(0))));
        }
        let threads = gd.iter().take(3).product::<i64>().max(0) as u64;
        let mut own = Signature::new();
        own.tensor("grad_", g, true).scratch("void", "dbuf_", 0, false);
        launches.push(launch(ctx, &c, "SD_KEY_GRAD", &format!("sdpa_bwd_{port}"), own, extra, threads));
    }
    // 5. dbias.
    if let Some(db) = ctx.node.output("dbias") {
        let mut own = Signature::new();
        own.tensor("db_", db, true).scratch("void", "dbuf_", 0, false);
        launches.push(launch(ctx, &c, "SD_DBIAS", "sdpa_bwd_dbias", own, vec![("ST_DB", ctx.st(db))], ctx.numel(db)));
    }
    // 6. dsink.
    if let Some(ds) = ctx.node.output("dsink_token") {
        let mut own = Signature::new();
        own.tensor("dsink_", ds, true).scratch("void", "dbuf_", 0, false);
        launches.push(launch(ctx, &c, "SD_DSINK", "sdpa_bwd_dsink", own, vec![("ST_DSINK", ctx.st(ds))], s.h_q.max(0) as u64));
    }
    Ok(NodeKernels { launches, scratch: vec![(rows(s) as usize).max(1) * 8] })
}
