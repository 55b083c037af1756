//! Fast 2D pooling kernels (max, average including or excluding padding) for channels-last
//! (NHWC-packed) tensors, forward and backward; rows of C channels moved 16 bytes at a time
//! (see [`channels`]).
//!
//! Forward, three kernels, the first that takes the shape: strips (windows overlapping along
//! h: a block streams its input rows once through a shared-memory ring with `cp.async` and
//! slides its output rows down them, see [`strip`], `pool_strip.cuh`), tiles (a thread
//! computes a small tile of outputs, see [`tiled`], `pool_tiled.cuh`), and one thread per
//! output vector (n, p, q, 8 channels) for big windows (`pool_window.cuh`). Max with the CPU's
//! NaN rule (a NaN wins), averages summed in f32 with the CPU's divisors. Backward: see
//! [`backward`] (`pool_backward.cuh`). `pooling.cuh` holds what they share.

use super::channels::{self, ceil_div, channels_last, Vectors};
use crate::engine::cuda::kernel::ctype;
use crate::engine::cuda::kernel::{entry_name, Arg, Grid, Launch, NodeKernels, Pdl, Signature, Source, Target, Unit};
use crate::error::Result;
use crate::graph::ops::resample::{ResampleAttrs, ResampleMode};
use crate::graph::ops::Op;
use crate::graph::{Graph, Node, TensorId};

/// What the pooling kernels share.
const POOLING: &str = include_str!("pooling.cuh");
/// A thread per output vector.
const WINDOW: &str = include_str!("pool_window.cuh");
/// Strips of output rows through a shared-memory ring.
const STRIP: &str = include_str!("pool_strip.cuh");
/// A tile of outputs per thread.
const TILED: &str = include_str!("pool_tiled.cuh");
/// The backward's argmax and gather.
const BACKWARD: &str = include_str!("pool_backward.cuh");

/// Threads per pooling block.
const POOL_THREADS: u32 = 256;

/// A specialized unit for pooling or pooling backward node `ni`, or None when no fast kernel
/// applies.
pub fn unit(graph: &Graph, ni: usize, target: &Target) -> Result<Option<Unit>> {
    let node = &graph.nodes[ni];
    let sms = target.sm_count.max(1) as i64;
    let kernels = match &node.op {
        Op::Resample(a) => forward(graph, ni, node, a, sms, target.pdl && target.hopper()),
        Op::ResampleBackward(a) => backward(graph, ni, node, a, sms),
        _ => None,
    };
    Ok(kernels.map(|kernels| Unit { nodes: vec![ni], kernels, writes: node.outputs.iter().map(|p| p.tensor).collect(), unaligned: None }))
}

/// The start of a pooling kernel's text: `sig`'s entry, x's (and y's) vectors, the mode, the
/// shapes (`dims`: `[n, c, h, w, p, q]`) as numbers with suffix `sfx` (`LL` for 64-bit index
/// arithmetic). The kernel's own defines follow; [`templates`] ends it.
fn start(entry: &str, sig: &Signature, v: Vectors, a: &ResampleAttrs, dims: [i64; 6], sfx: &str) -> Source {
    let [_, c, h, w, p, q] = dims;
    let mode = match a.mode {
        ResampleMode::Max => "POOL_MAX",
        ResampleMode::AvgIncludePadding => "POOL_AVG_INCL",
        ResampleMode::AvgExcludePadding => "POOL_AVG_EXCL",
    };
    let shape = [
        ("C_", c),
        ("CV", c / v.vec()),
        ("H_", h),
        ("W_", w),
        ("P_", p),
        ("Q_", q),
        ("KH", a.window[0]),
        ("KW", a.window[1]),
        ("SH", a.stride[0]),
        ("SW", a.stride[1]),
        ("PREH", a.pre_padding[0]),
        ("PREW", a.pre_padding[1]),
        ("POSTH", a.post_padding[0]),
        ("POSTW", a.post_padding[1]),
    ];
    let src = v.define(Source::new().entry(entry, sig)).define("POOL_MODE", mode);
    shape.into_iter().fold(src, |src, (name, value)| src.define(name, format!("{value}{sfx}")))
}

/// The end of a pooling kernel's text: the shared headers, then the kernel's `template`.
fn templates(src: Source, template: &str) -> String {
    src.template(channels::VECTORS).template(POOLING).template(template).build()
}

/// The index arithmetic: 32-bit (`POOL_SMALL`, no suffix on the shapes) or 64-bit (`LL`).
fn index_sfx(small: bool) -> &'static str {
    if small {
        ""
    } else {
        "LL"
    }
}

fn forward(graph: &Graph, ni: usize, node: &Node, a: &ResampleAttrs, sms: i64, pdl: bool) -> Option<NodeKernels> {
    let x = node.input("x")?;
    let y = node.output("y")?;
    let (xd, yd) = (graph.desc(x), graph.desc(y));
    let (xt, yt) = (ctype::dtype(graph, x), ctype::dtype(graph, y));
    if xt != yt || xd.dims.len() != 4 || yd.dims.len() != 4 || [&a.window, &a.stride, &a.pre_padding, &a.post_padding].iter().any(|l| l.len() != 2) {
        return None;
    }
    let v = Vectors::new(xt, yt)?;
    if !channels_last(&xd.dims, &xd.strides, true) || !channels_last(&yd.dims, &yd.strides, true) {
        return None;
    }
    let want = a.output_dims(&xd.dims).ok()?;
    if want != yd.dims {
        return None;
    }
    let vec = v.vec();
    let (n, c, h, w) = (xd.dims[0], xd.dims[1], xd.dims[2], xd.dims[3]);
    let (p, q) = (yd.dims[2], yd.dims[3]);
    if c % vec != 0 {
        return None;
    }
    let cv = c / vec;
    let total = n * p * q * cv;
    let (kh, kw) = (a.window[0], a.window[1]);
    let window = kh * kw;
    // 32-bit index arithmetic when every index and offset fits.
    let small = xd.element_count() < (1 << 30) && yd.element_count() < (1 << 30) && h + kh + a.stride[0] < (1 << 20) && w + kw + a.stride[1] < (1 << 20);
    let dims = [n, c, h, w, p, q];
    if let Some(launch) = strip(ni, a, v, dims, sms, StripUse::Forward { pdl }, x, Arg::Ptr(y)) {
        return Some(NodeKernels::one(launch));
    }
    if let Some(launch) = tiled(ni, a, v, dims, small, [x, y]) {
        return Some(NodeKernels::one(launch));
    }
    let entry = entry_name(ni, &format!("pool_nhwc_{}", a.mode.name()));
    let mut sig = Signature::new();
    sig.ptr("xv", x, false).ptr("yv", y, true);
    let src = start(&entry, &sig, v, a, dims, index_sfx(small));
    let src = src.flag("POOL_SMALL", small).flag("POOL_UNROLL", window <= 32).define("NT", POOL_THREADS).define("TOTAL", format!("{total}LL"));
    let source = templates(src, WINDOW);
    Some(NodeKernels::one(Launch::new(source, entry, Grid::Cover(total as u64), POOL_THREADS, sig.into_args())))
}

/// Shared memory of an sm_90 SM (227 KiB a block at most, 1 KiB a block reserved).
const HOPPER_SMEM_PER_SM: i64 = 228 * 1024;

/// What a strip pooling kernel computes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum StripUse {
    /// The pooled output; `pdl`: launched as a programmatic dependent (sm_90).
    Forward { pdl: bool },
    /// Max pooling backward's window taps of each output's maximum.
    Argmax,
}

/// Most bytes of one ring slot of the strip pooling kernel (one footprint row: the block's
/// input columns, all channels).
const STRIP_SLOT_BYTES: i64 = 16 * 1024;
/// Most shared memory the ring of a strip block takes.
const STRIP_RING_BYTES: i64 = 72 * 1024;
/// Bytes of input rows a strip block aims to keep in flight.
const STRIP_IN_FLIGHT: i64 = 32 * 1024;
/// Most threads in a strip block (more items per row give each thread several).
const STRIP_MAX_THREADS: i64 = 512;
/// Most footprint rows one strip block walks (the row loop is unrolled).
const STRIP_MAX_ROWS: i64 = 40;

/// Strip pooling, for windows that overlap along h (`SH < KH`: an input row feeds several
/// output rows). Block b owns RP output rows x QB output columns x all channels of one image
/// (for the 3x3 stride-2 112x112 C=64 f16 workload: 7 rows x all 56 columns, 448 threads,
/// 256 blocks, two per SM). It streams its input footprint row by row into a ring of ND
/// shared-memory slots with 16-byte `cp.async` (each row segment, QB*SW+KW-SW positions of
/// all channels, is contiguous in NHWC memory: the loads are whole 128-byte lines, ND-1 rows
/// in flight per block, no registers held by them); thread (column j, channel vector v)
/// reduces each row over its window's columns from shared memory and folds it into the
/// accumulators of the (at most ceil(KH/SH)) output rows whose windows cover that row,
/// storing an output as soon as its last row is in. Every input byte comes from DRAM once and
/// from L2 once (blocks re-read only the rows where two strips meet: (RP-1)*SH+KH rows per
/// RP*SH). Unaligned bases take element-wise copies into the ring and element-wise stores.
/// Positions outside the image never reach the ring: the taps and rows that would read them
/// are skipped (max's neutral -inf, sums' 0). None (the tiled kernel then) for windows
/// that do not overlap along h, more than 8 taps along an axis, or rows too wide for a slot.
///
/// Launched as a programmatic dependent on sm_90 in one wave, the forward triggers the next
/// launch at its start and prefetches its first rows into L2 before it waits for the kernel
/// before it (at `pdl_site()`); a shared-memory floor keeps it at two blocks per SM.
///
/// With `argmax` (max pooling backward), each output vector's window taps of the CPU's
/// maximum (the first maximal real element in row-major window order, a NaN beating any
/// number; 255 for an empty window) go to an index buffer (`out`) as VEC bytes instead.
#[allow(clippy::too_many_arguments)]
fn strip(ni: usize, a: &ResampleAttrs, v: Vectors, dims: [i64; 6], sms: i64, usage: StripUse, x: TensorId, out: Arg) -> Option<Launch> {
    let [n, c, h, w, p, q] = dims;
    let argmax = usage == StripUse::Argmax;
    let vec = v.vec();
    let es = 16 / vec;
    let cv = c / vec;
    let (kh, kw, sh, sw) = (a.window[0], a.window[1], a.stride[0], a.stride[1]);
    if sh >= kh || kh > 8 || kw > 8 || kh * kw > POOL_MAX_TAPS || cv < 1 {
        return None;
    }
    if [n, c, h, w, p, q].iter().any(|&d| d >= 1 << 24) || n * p * q >= 1 << 31 {
        return None;
    }
    // Output columns per block: as many as a slot holds (and at most 1024 items per row),
    // then evened out over the blocks along q.
    let positions = STRIP_SLOT_BYTES / (c * es);
    if positions < kw {
        return None;
    }
    let qb_max = ((positions - kw) / sw + 1).min(2 * STRIP_MAX_THREADS / cv).min(q);
    if qb_max < 1 {
        return None;
    }
    let nsq = ceil_div(q, qb_max);
    let qb = ceil_div(q, nsq);
    let items = qb * cv;
    let ipt = ceil_div(items, STRIP_MAX_THREADS);
    let threads = ceil_div(ceil_div(items, ipt), 32) * 32;
    let fwb = (qb - 1) * sw + kw;
    let slot = fwb * cv;
    let slot_bytes = slot * 16;
    // Output rows per block: at least 4 (a strip re-reads the rows it shares with the next
    // one), more while that leaves more than two blocks per SM.
    let rp_max = ((STRIP_MAX_ROWS - kh) / sh + 1).clamp(1, 16);
    let mut rp = 4.min(p).min(rp_max);
    while rp < rp_max && rp < p && n * nsq * ceil_div(p, rp) > 2 * sms {
        rp += 1;
    }
    let nsp = ceil_div(p, rp);
    let fh = (rp - 1) * sh + kh;
    let blocks = n * nsp * nsq;
    if blocks >= 1 << 31 {
        return None;
    }
    // The forward in one wave of at most two blocks per SM, where the target has programmatic
    // dependent launches, triggers the next launch early (see the launch below): the
    // footprint rows of its first STRIP_IN_FLIGHT bytes go to L2 before the wait, and a block
    // takes at least a third of the SM's shared memory, so that an SM holds at most two; with
    // that memory, its ring keeps twice the bytes in flight.
    let early = usage == (StripUse::Forward { pdl: true }) && blocks <= 2 * sms;
    let (in_flight, ring_max) = if early { (2 * STRIP_IN_FLIGHT, HOPPER_SMEM_PER_SM / 2 - 1024) } else { (STRIP_IN_FLIGHT, STRIP_RING_BYTES) };
    let mut nd = (ceil_div(in_flight, slot_bytes) + 1).clamp(3, 8);
    while nd > 2 && nd * slot_bytes > ring_max {
        nd -= 1;
    }
    let pf = if early { ceil_div(STRIP_IN_FLIGHT, slot_bytes).min(nd - 1) } else { 0 };
    let smem_floor = if early { HOPPER_SMEM_PER_SM / 3 } else { 0 };
    let entry = if argmax { entry_name(ni, "pool_bwd_argmax_strip") } else { entry_name(ni, &format!("pool_nhwc_strip_{}", a.mode.name())) };
    let mut sig = Signature::new();
    sig.param("const void* __restrict__ xv", Arg::Ptr(x)).param("void* __restrict__ yv", out);
    let src = start(&entry, &sig, v, a, dims, "").flag("POOL_ARGMAX", argmax);
    let geometry =
        [("RP", rp), ("QB", qb), ("FH", fh), ("FWB", fwb), ("NSP", nsp), ("NSQ", nsq), ("ND", nd), ("PF", pf), ("SLOT", slot), ("NT", threads), ("ITEMS", items), ("IPT", ipt)];
    let source = templates(geometry.into_iter().fold(src, |src, (name, value)| src.define(name, value)), STRIP);
    // The forward strip kernel is sized for one wave of two blocks per SM. As a programmatic
    // dependent that triggers the next launch at its start, the next grid's blocks wait on the
    // SMs' free slots: where a third block fits (max pooling's registers allow it) they pile
    // up unevenly, 5-15% slower; with two blocks per SM at most, each exiting block's slot
    // goes to a block of the next grid that prefetches its first rows into L2 while this grid
    // ends: with the deeper ring, measured 4-5% faster on the H100 than waiting without the
    // trigger. Other forward grids wait without the trigger (3-6% faster than an independent
    // launch).
    let pdl = if early || argmax { Pdl::Dependent } else { Pdl::WaitOnly };
    Some(Launch::new(source, entry, Grid::Exact(blocks as u32, 1, 1), threads as u32, sig.into_args()).with_shared((nd * slot_bytes).max(smem_floor) as u32).with_pdl(pdl))
}

/// Threads a tiled pooling launch should have at least; smaller output tiles are taken until it
/// has (a small image split into few big tiles would leave most SMs idle).
const POOL_MIN_THREADS: i64 = 1024;
/// Most window taps the tiled pooling kernel unrolls (larger windows take the loop kernel).
const POOL_MAX_TAPS: i64 = 32;
/// Most input positions (16-byte loads) one thread's tile reads.
const POOL_MAX_FOOTPRINT: i64 = 64;

/// Tiled pooling: each thread computes a PT x QT tile of outputs for one vector of channels.
/// It walks the tile's input footprint ((PT-1)*SH+KH rows of (QT-1)*SW+KW positions) row by
/// row with one 16-byte load per position (out-of-range positions read as the reduction's
/// neutral value, so no branches), so input rows and columns shared by the tile's windows
/// are loaded once instead of once per window (3x3 stride 2 with a 4x2 tile: 45 loads for 8
/// outputs instead of 72); a finished output row is stored at once (only ceil(KH/SH) rows
/// of accumulators are live). Consecutive threads take consecutive channel vectors, so
/// each warp load covers whole 128-byte position rows of C. Max reduces the packed 16-bit
/// pairs with `__hmax2_nan` (a NaN wins, as the CPU's rule) without converting; averages sum
/// in f32. None when no tile fits the limits.
fn tiled(ni: usize, a: &ResampleAttrs, v: Vectors, dims: [i64; 6], small: bool, xy: [TensorId; 2]) -> Option<Launch> {
    let [n, c, _, _, p, q] = dims;
    let vec = v.vec();
    let cv = c / vec;
    let (kh, kw, sh, sw) = (a.window[0], a.window[1], a.stride[0], a.stride[1]);
    if kh * kw > POOL_MAX_TAPS {
        return None;
    }
    let pt_max = if sh < kh { 4.min(p) } else { 1 };
    let qt_max = if sw < kw { 2.min(q) } else { 1 };
    let mut options = vec![(pt_max, qt_max), (pt_max.min(2), qt_max), (1, qt_max), (1, 1)];
    options.dedup();
    let fits = |&(pt, qt): &(i64, i64)| {
        let (fh, fw) = ((pt - 1) * sh + kh, (qt - 1) * sw + kw);
        // Accumulator registers live at once: rows of outputs whose windows overlap a row.
        let live = pt.min(ceil_div(kh, sh)) * qt;
        let acc_regs = if a.mode == ResampleMode::Max { live * 4 } else { live * vec };
        fh * fw <= POOL_MAX_FOOTPRINT && acc_regs <= 32
    };
    let threads = |&(pt, qt): &(i64, i64)| n * ceil_div(p, pt) * ceil_div(q, qt) * cv;
    let (pt, qt) = options.iter().copied().filter(fits).find(|o| threads(o) >= POOL_MIN_THREADS).or_else(|| options.iter().copied().filter(fits).last())?;
    let (fh, fw) = ((pt - 1) * sh + kh, (qt - 1) * sw + kw);
    let (ntp, ntq) = (ceil_div(p, pt), ceil_div(q, qt));
    let total = n * ntp * ntq * cv;
    let sfx = index_sfx(small);
    let entry = entry_name(ni, &format!("pool_nhwc_tiled_{}", a.mode.name()));
    let mut sig = Signature::new();
    sig.param("const void* __restrict__ xv", Arg::Ptr(xy[0])).param("void* __restrict__ yv", Arg::Ptr(xy[1]));
    let src = start(&entry, &sig, v, a, dims, sfx)
        .flag("POOL_SMALL", small)
        .define("NT", POOL_THREADS)
        .define("PT", pt)
        .define("QT", qt)
        .define("FH", fh)
        .define("FW", fw)
        .define("NTP", format!("{ntp}{sfx}"))
        .define("NTQ", format!("{ntq}{sfx}"))
        .define("TOTAL", format!("{total}{sfx}"));
    let source = templates(src, TILED);
    Some(Launch::new(source, entry, Grid::Cover(total as u64), POOL_THREADS, sig.into_args()))
}

/// 2D max and average pooling backward on NHWC-packed x, dy and dx of one type (f16, bf16,
/// f32), C a multiple of 16 bytes. Averages: one gather launch, a thread per input vector
/// (8 f16/bf16 or 4 f32 channels of one position) summing `dy / divisor` over the outputs
/// whose windows cover it (ascending p, then q, as the CPU adds them). Max: the first launch
/// finds each output's argmax (the CPU's rule: the first maximal real element of the window
/// in row-major order, a NaN beating any number) and stores its window tap as a byte to
/// scratch (`[N, P, Q, C]`); the gather launch adds dy of each covering output whose argmax
/// is this position. Each x, dy and dx element moves once; the argmax bytes once each way.
/// The argmax comes from the strip kernel ([`strip`]) where the window overlaps along h.
/// The gather walks at most ceil(KH/SH) x ceil(KW/SW) covering outputs in fixed-count
/// unrolled loops (all their dy loads in flight at once), 32-bit indices where they fit.
fn backward(graph: &Graph, ni: usize, node: &Node, a: &ResampleAttrs, sms: i64) -> Option<NodeKernels> {
    let dy = node.input("dy")?;
    let x = node.input("x")?;
    let dx = node.output("dx")?;
    let (xd, dyd, dxd) = (graph.desc(x), graph.desc(dy), graph.desc(dx));
    let xt = ctype::dtype(graph, x);
    if ctype::dtype(graph, dy) != xt || ctype::dtype(graph, dx) != xt || xd.dims.len() != 4 || [&a.window, &a.stride, &a.pre_padding, &a.post_padding].iter().any(|l| l.len() != 2)
    {
        return None;
    }
    let v = Vectors::new(xt, xt)?;
    if !channels_last(&xd.dims, &xd.strides, true) || !channels_last(&dyd.dims, &dyd.strides, true) || !channels_last(&dxd.dims, &dxd.strides, true) || dxd.dims != xd.dims {
        return None;
    }
    if a.output_dims(&xd.dims).ok()? != dyd.dims {
        return None;
    }
    let vec = v.vec();
    let (n, c, h, w) = (xd.dims[0], xd.dims[1], xd.dims[2], xd.dims[3]);
    let (p, q) = (dyd.dims[2], dyd.dims[3]);
    let (kh, kw, sh, sw) = (a.window[0], a.window[1], a.stride[0], a.stride[1]);
    let max = a.mode == ResampleMode::Max;
    if c % vec != 0 || (max && kh * kw > 254) {
        return None;
    }
    let cv = c / vec;
    // 32-bit index arithmetic when every index and offset fits (as the forward kernels).
    let small = xd.element_count() < (1 << 30) && dyd.element_count() < (1 << 30) && h + kh + sh < (1 << 20) && w + kw + sw < (1 << 20);
    let sfx = index_sfx(small);
    let dims = [n, c, h, w, p, q];
    // Most outputs along h (w) whose windows cover one input position.
    let (nph, nqw) = (ceil_div(kh, sh), ceil_div(kw, sw));
    let mut launches = Vec::new();
    let mut scratch = Vec::new();
    let outs = n * p * q * cv;
    // The strip kernel's argmax mode where it takes the shape (windows overlapping along h).
    let strip = if max { strip(ni, a, v, dims, sms, StripUse::Argmax, x, Arg::Scratch(0)) } else { None };
    if let Some(launch) = strip {
        launches.push(launch);
        scratch.push((outs * vec) as usize);
    } else if max {
        let entry = entry_name(ni, "pool_bwd_argmax");
        let mut sig = Signature::new();
        sig.ptr("xv", x, false).param("IDXW* idx", Arg::Scratch(0));
        let src = start(&entry, &sig, v, a, dims, sfx).flag("POOL_SMALL", small).flag("POOL_BWD_ARGMAX", true).flag("POOL_UNROLL", kh * kw <= 32);
        let src = src.define("NPH", nph).define("NQW", nqw).define("OUTS", format!("{outs}LL"));
        let source = templates(src, BACKWARD);
        launches.push(channels::strided(source, entry, outs, sig));
        scratch.push((outs * vec) as usize);
    }
    let entry = entry_name(ni, &format!("pool_bwd_{}", a.mode.name()));
    let total = n * h * w * cv;
    let mut sig = Signature::new();
    sig.ptr("dyv", dy, false);
    if max {
        sig.param("const IDXW* idx", Arg::Scratch(0));
    }
    sig.ptr("dxv", dx, true);
    let src = start(&entry, &sig, v, a, dims, sfx).flag("POOL_SMALL", small).flag("POOL_BWD_ARGMAX", false).flag("POOL_UNROLL", nph * nqw <= 64);
    let src = src.define("NPH", nph).define("NQW", nqw).define("TOTAL", format!("{total}LL"));
    let source = templates(src, BACKWARD);
    launches.push(channels::strided(source, entry, total, sig));
    Some(NodeKernels { launches, scratch })
}
