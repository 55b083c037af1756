//! Depthwise convolution: groups == image channels `C`, filter `[K, 1, taps...]` with
//! `K = C * M` (`M` the multiplier; output channel `k` reads image channel `k / M`), as its own
//! memory-bound kernels (`depthwise.cuh`), for fprop, dgrad and wgrad, 1D/2D/3D (spatial dims
//! padded to three), any stride, dilation, padding and mode, f32/f16/bf16 (every tensor of one
//! type, sums in f32), any non-negative strides of the tensors.
//!
//! A thread takes a vector of `VEC` channels: 16 bytes (8 f16/bf16, 4 f32) when the image's
//! channels are contiguous and every other stride keeps the vectors aligned (channels-last), else
//! one channel. Consecutive threads take consecutive channel vectors where channels are the
//! fastest dim (coalesced rows of channels), else consecutive tiles along W.
//!
//! - fprop: a thread computes `PX` consecutive outputs along W of its channels (all `M` outputs
//!   of an image channel are `M` lanes), loading each input position its outputs' taps cover
//!   once per filter row (3x3, PX 4: 6 loads for 12 taps x 4 outputs); taps unrolled; the
//!   block's filter slice staged in shared memory as floats. Where the channels are 16-byte
//!   vectors on both sides and `M` is 1 (sm_80+), a block first copies the input footprint of
//!   its rows x columns x channel vectors into shared memory with `cp.async` ([`Staged`]: each
//!   input read from memory once a block, all of a block's reads in flight together) and the
//!   threads read their positions from there; on Hopper the footprint comes as TMA tile copies
//!   (no address arithmetic in the threads). On the H200 MobileNet's 3x3 went from 38.3 to 22.1
//!   us, its stride-2 layer from 57.5 to 32.7 us, ConvNeXt's 7x7 from 91.6 to 50.4 us.
//! - dgrad: the same over the image's positions, tiles of PX (a multiple of the stride along W)
//!   starting at multiples of the stride, so that the taps landing between strides are dropped
//!   at compile time along W and skipped per row along D and H.
//! - wgrad: per-block partial sums over a slice of output rows into scratch (`[slice][tap][K]`
//!   floats; a block per filter row, lane slice and reduction slice), then a second launch adds
//!   the partials in slice order: deterministic, no atomics.
//!
//! Vector kernels need 16-byte aligned bases: each unit carries the one-channel kernels as its
//! [`Unaligned`] alternative.

use crate::dtype::DataType;
use crate::engine::cuda::kernel::{entry_name, Arg, Grid, Launch, NodeKernels, Signature, Source, Target, Unaligned, Unit, HOPPER};
use crate::engine::cuda::tma::TmaDesc;
use crate::graph::ops::conv::{ConvAttrs, ConvMode};
use crate::graph::ops::Op;
use crate::graph::{Graph, TensorDesc, TensorId};

/// The kernels' template.
const DEPTHWISE: &str = include_str!("depthwise.cuh");

/// Threads per block (rounded down to a multiple of the lanes a block takes).
const THREADS: i64 = 256;
/// Most shared memory a block's filter slice takes.
const FILTER_SMEM: i64 = 40 * 1024;
/// Most lanes (channel vectors) per block.
const MAX_LANES: i64 = 32;
/// Most taps along W (the W loops are unrolled over them).
const MAX_TAPS_W: i64 = 32;
/// Most input positions along W a thread's outputs cover (unrolled).
const MAX_SPAN_W: i64 = 128;
/// Blocks per SM the weight gradient's first launch aims for.
const WGRAD_BLOCKS_PER_SM: i64 = 8;

fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

/// Which convolution.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pass {
    Fprop,
    Dgrad,
    Wgrad,
}

/// The sizes and layouts of a depthwise convolution, spatial dims padded to three (leading
/// extents 1).
#[derive(Clone, Debug)]
struct Geo {
    pass: Pass,
    dt: DataType,
    n: i64,
    c: i64,
    m: i64,
    /// Image and output spatial dims, taps.
    id: [i64; 3],
    od: [i64; 3],
    t: [i64; 3],
    stride: [i64; 3],
    dil: [i64; 3],
    pre: [i64; 3],
    flip: bool,
    /// Strides of the image (n, c, spatial), the output (n, k, spatial), the filter (k, spatial).
    xs: [i64; 5],
    ys: [i64; 5],
    ws: [i64; 4],
    /// The image (x or dx), output (y or dy) and filter (w or dw) tensors.
    x: TensorId,
    y: TensorId,
    w: TensorId,
}

/// `v` (one per spatial dim) placed in the last of three slots; `fill` in the others.
fn pad3(v: &[i64], fill: i64) -> [i64; 3] {
    let mut out = [fill; 3];
    out[3 - v.len()..].copy_from_slice(v);
    out
}

/// The strides of a tensor `[a, b, spatial...]`: `a`, `b`, then the spatial ones padded to three
/// (extent-1 slots stride 0).
fn strides5(d: &TensorDesc) -> [i64; 5] {
    let sp = pad3(&d.strides[2..], 0);
    [d.strides[0], d.strides[1], sp[0], sp[1], sp[2]]
}

/// Whether node `ni` is a depthwise convolution: a convolution whose filter has one channel
/// per group (its dim 1 is 1), so that groups == image channels.
pub fn is_depthwise(graph: &Graph, ni: usize) -> bool {
    let node = &graph.nodes[ni];
    let w = match &node.op {
        Op::ConvFprop(_) | Op::ConvDgrad(_) => node.input("w"),
        Op::ConvWgrad(_) => node.output("dw"),
        _ => None,
    };
    w.map(|w| graph.desc(w)).is_some_and(|d| d.dims.len() >= 3 && d.dims[1] == 1)
}

/// The geometry of depthwise convolution node `ni`, or why these kernels do not take it.
fn geometry(graph: &Graph, ni: usize) -> Result<Geo, String> {
    let node = &graph.nodes[ni];
    let missing = || "a port is missing".to_string();
    let (attrs, pass, x, w, y): (&ConvAttrs, Pass, _, _, _) = match &node.op {
        Op::ConvFprop(a) => (a, Pass::Fprop, node.input("x").ok_or_else(missing)?, node.input("w").ok_or_else(missing)?, node.output("y").ok_or_else(missing)?),
        Op::ConvDgrad(a) => (a, Pass::Dgrad, node.output("dx").ok_or_else(missing)?, node.input("w").ok_or_else(missing)?, node.input("dy").ok_or_else(missing)?),
        Op::ConvWgrad(a) => (a, Pass::Wgrad, node.input("x").ok_or_else(missing)?, node.output("dw").ok_or_else(missing)?, node.input("dy").ok_or_else(missing)?),
        _ => return Err("not a convolution".into()),
    };
    let (xd, wd, yd) = (graph.desc(x), graph.desc(w), graph.desc(y));
    let rank = xd.dims.len();
    let well_formed = |d: &TensorDesc| d.dims.len() == rank && d.strides.len() == rank && d.strides.iter().all(|&s| s >= 0) && d.dims.iter().all(|&e| e > 0);
    if !(3..=5).contains(&rank) || !well_formed(xd) || !well_formed(wd) || !well_formed(yd) || attrs.stride.len() != rank - 2 {
        return Err("tensors of rank 3 to 5 with non-negative strides".into());
    }
    if wd.dims[1] != 1 {
        return Err("not depthwise (the filter's dim 1 is not 1)".into());
    }
    if attrs.forward_dims(&xd.dims, &wd.dims, "x", "w").ok().as_deref() != Some(&yd.dims[..]) {
        return Err("the output's dims are not the convolution's".into());
    }
    let dt = graph.resolved_data_type(x).unwrap_or(DataType::F32);
    if !matches!(dt, DataType::F32 | DataType::F16 | DataType::Bf16) || [w, y].iter().any(|&t| graph.resolved_data_type(t).unwrap_or(DataType::F32) != dt) {
        return Err("tensors of one type, f32, f16 or bf16".into());
    }
    if graph.compute_type(node) != DataType::F32 {
        return Err("f32 compute".into());
    }
    let (n, c, k) = (xd.dims[0], xd.dims[1], wd.dims[0]);
    let g = Geo {
        pass,
        dt,
        n,
        c,
        m: k / c,
        id: pad3(&xd.dims[2..], 1),
        od: pad3(&yd.dims[2..], 1),
        t: pad3(&wd.dims[2..], 1),
        stride: pad3(&attrs.stride, 1),
        dil: pad3(&attrs.dilation, 1),
        pre: pad3(&attrs.pre_padding, 0),
        flip: attrs.mode == ConvMode::Convolution,
        xs: strides5(xd),
        ys: strides5(yd),
        ws: {
            let s = strides5(wd);
            [s[0], s[2], s[3], s[4]]
        },
        x,
        y,
        w,
    };
    if g.t[2] > MAX_TAPS_W || (g.t[2] - 1) * g.dil[2] + 1 > MAX_SPAN_W {
        return Err(format!("at most {MAX_TAPS_W} taps along the last spatial dim spanning at most {MAX_SPAN_W} positions"));
    }
    let dims_ok = [g.n, g.c, k].iter().chain(&g.id).chain(&g.od).all(|&d| d < 1 << 30) && g.pre.iter().chain(&g.stride).chain(&g.dil).all(|&v| v < 1 << 20);
    if !dims_ok {
        return Err("dims below 2^30, strides, dilations and padding below 2^20".into());
    }
    Ok(g)
}

/// The element offset one past the last element of a tensor (the largest offset + 1).
fn extent(d: &TensorDesc) -> i64 {
    d.dims.iter().zip(&d.strides).map(|(&e, &s)| (e - 1).saturating_mul(s)).fold(1i64, |a, b| a.saturating_add(b))
}

/// Whether the channels of a tensor with strides `s` (`[n, c, spatial x 3]`) and dims `dims`
/// read as aligned `vec`-element vectors: contiguous channels, a multiple of `vec` of them, and
/// every other stride (of a dim that moves) a multiple of `vec`.
fn vectorizes(s: &[i64; 5], dims: [i64; 5], vec: i64) -> bool {
    s[1] == 1 && dims[1] % vec == 0 && (0..5).filter(|&a| a != 1 && dims[a] > 1).all(|a| s[a] % vec == 0)
}

/// The depthwise unit of convolution node `ni`, or None (with [`decline`] saying why).
pub fn unit(graph: &Graph, ni: usize, target: &Target) -> Option<Unit> {
    let g = geometry(graph, ni).ok()?;
    let fast = kernels_of(graph, ni, &g, target, true)?;
    let node = &graph.nodes[ni];
    let writes = node.outputs.iter().map(|p| p.tensor).collect();
    let (kernels, needs) = fast;
    let unaligned = if needs.is_empty() {
        None
    } else {
        let (scalar, _) = kernels_of(graph, ni, &g, target, false)?;
        Some(Box::new(Unaligned { tensors: needs, kernels: scalar }))
    };
    Some(Unit { nodes: vec![ni], kernels, writes, unaligned })
}

/// Why the depthwise kernels decline node `ni` (None when they take it; what they take does
/// not depend on the target).
pub fn decline(graph: &Graph, ni: usize) -> Option<String> {
    match geometry(graph, ni) {
        Err(why) => Some(why),
        Ok(g) => kernels_of(graph, ni, &g, &Target::sm90a(), true).is_none().then(|| "a filter too large for a block's shared memory, or a grid too large".into()),
    }
}

/// The staged forward's blocking (`DW_FPROP_STAGED`): a block's output rows and columns and its
/// lanes, with the input footprint they stage in shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Staged {
    /// Lanes (channel vectors) a block.
    gb: i64,
    /// Output rows a block, and row pieces.
    rh: i64,
    rb: i64,
    /// Output columns a block (a multiple of PX), and column pieces.
    owb: i64,
    cw: i64,
    /// The footprint's rows and columns.
    sr: i64,
    swid: i64,
    /// Thread groups over the block's rows.
    rg: i64,
    /// Taps along D (the footprint holds T0 slabs).
    t0: i64,
    px: i64,
    /// Vector slots a footprint column takes: GB (TMA's dense box) or 8 (the threads' copies,
    /// rotated so that a quarter-warp's reads meet no bank conflict).
    cstride: i64,
}

impl Staged {
    fn threads(&self) -> i64 {
        self.gb * (self.owb / self.px) * self.rg
    }
    /// Bytes of shared memory: the filter slice as floats, then (from the next 128-byte
    /// boundary) the footprint's vectors.
    fn shared(&self, taps: i64, vec: i64) -> i64 {
        taps * self.gb * vec * 4 + 112 + self.t0 * self.sr * self.swid * self.cstride * 16
    }
}

/// Shared memory a staged forward block may take (a few blocks fit an SM).
const STAGED_SMEM: i64 = 48 * 1024;
/// Threads a staged forward block aims at.
const STAGED_THREADS: i64 = 256;

/// The staged forward's blocking for `g` (`lanes` channel vectors of `vec`, `px` outputs a
/// thread along W): lane slices of at most 8 vectors split evenly, then the output rows (1 to 8)
/// and column pieces whose footprint fits [`STAGED_SMEM`] with the fewest staged vectors per
/// output. None when no blocking fits (the plain forward takes it).
fn staged_fprop(g: &Geo, lanes: i64, vec: i64, px: i64, tma: bool) -> Option<Staged> {
    let gb = ceil_div(lanes, ceil_div(lanes, 8));
    let cstride = if tma { gb } else { 8 };
    let taps = g.t.iter().product::<i64>();
    let ow = g.od[2];
    let mut best: Option<(f64, Staged)> = None;
    for cw in 1..=ceil_div(ow, px) {
        let owb = ceil_div(ceil_div(ow, cw), px) * px;
        if ceil_div(ow, owb) != cw || (cw > 1 && owb < 8) {
            continue;
        }
        let swid = (owb - 1) * g.stride[2] + (g.t[2] - 1) * g.dil[2] + 1;
        for rh in [1, 2, 4, 8].into_iter().filter(|&rh| rh == 1 || rh <= g.od[1]) {
            let sr = (rh - 1) * g.stride[1] + (g.t[1] - 1) * g.dil[1] + 1;
            let base = gb * (owb / px);
            let rg = (1..=rh).rev().find(|&d| rh % d == 0 && base * d <= STAGED_THREADS).unwrap_or(1);
            let st = Staged { gb, rh, rb: ceil_div(g.od[1], rh), owb, cw, sr, swid, rg, t0: g.t[0], px, cstride };
            if st.shared(taps, vec) > STAGED_SMEM || st.threads() > 1024 {
                continue;
            }
            // Staged vectors per output vector (the footprint's overlap with its neighbours').
            let cost = (sr * swid) as f64 / (rh.min(g.od[1]) * owb.min(ow)) as f64;
            if best.as_ref().is_none_or(|(c, _)| cost < *c - 1e-9) {
                best = Some((cost, st));
            }
        }
    }
    best.map(|(_, st)| st)
}

/// The TMA map of the staged forward's footprint over the image: dims `[C, W, (H, (D,)) N]`
/// (the image's own spatial rank), box `[GB * VEC channels, SWID, SR, 1...]`.
fn footprint_map(graph: &Graph, g: &Geo, st: &Staged, vec: i64) -> TmaDesc {
    let size = g.dt.size() as u64;
    let spatial = graph.desc(g.x).dims.len() - 2;
    // Innermost first: channels, then the spatial dims from the last (W), then the images.
    let mut dims = vec![g.c as u64];
    let mut strides = Vec::new();
    let mut boxes = vec![(st.gb * vec) as u32, st.swid as u32];
    for a in (3 - spatial..3).rev() {
        dims.push(g.id[a] as u64);
        strides.push(g.xs[2 + a] as u64 * size);
    }
    if spatial >= 2 {
        boxes.push(st.sr as u32);
    }
    if spatial == 3 {
        boxes.push(1);
    }
    dims.push(g.n as u64);
    strides.push(g.xs[0] as u64 * size);
    boxes.push(1);
    TmaDesc { tensor: g.x, dtype: g.dt, dims, strides, boxes, swizzle: 0, im2col: None }
}

/// The launches of `g` (with 16-byte vectors of channels where the layouts allow, when
/// `vector`), and the tensors whose bases the vectors need aligned.
fn kernels_of(graph: &Graph, ni: usize, g: &Geo, target: &Target, vector: bool) -> Option<(NodeKernels, Vec<TensorId>)> {
    let k = g.c * g.m;
    let xdims = [g.n, g.c, g.id[0], g.id[1], g.id[2]];
    let ydims = [g.n, k, g.od[0], g.od[1], g.od[2]];
    let full = if g.dt == DataType::F32 { 4 } else { 8 };
    let mut vec = if vector && vectorizes(&g.xs, xdims, full) { full } else { 1 };
    let y_vec = vec > 1 && g.m == 1 && vectorizes(&g.ys, ydims, full);
    // Along W: fprop and wgrad take PX outputs; dgrad PX image positions, a multiple of the
    // stride (tiles start at multiples of it).
    let (s2, d2, t2) = (g.stride[2], g.dil[2], g.t[2]);
    let px = match g.pass {
        Pass::Dgrad => {
            if s2 * vec > 64 {
                vec = 1;
            }
            if s2 > 64 {
                return None;
            }
            s2 * (4 / s2).max(1)
        }
        _ => {
            let mut px = 4;
            while px > 1 && (px - 1) * s2 + (t2 - 1) * d2 + 1 > MAX_SPAN_W {
                px /= 2;
            }
            px
        }
    };
    let y_vec = y_vec && vec > 1;
    let taps = g.t.iter().product::<i64>();
    // Lanes: channel vectors (times M in fprop and wgrad, one lane per multiplier).
    let cv = g.c / vec;
    let lanes = if g.pass == Pass::Dgrad { cv } else { cv * g.m };
    let per_lane = if g.pass == Pass::Dgrad { taps * g.m * vec * 4 } else { taps * vec * 4 };
    let mut gb = lanes.min(MAX_LANES);
    if g.pass != Pass::Wgrad {
        gb = gb.min(FILTER_SMEM / per_lane);
        if gb < 1 {
            return None;
        }
    }
    let tb = (THREADS / gb).max(1);
    let mut nt = gb * tb;
    let mut ls = ceil_div(lanes, gb);
    // The staged forward takes the plain kernel's PX (8 outputs a thread for 3x3 filters
    // measured 21% slower on the H200 with TMA: 126 registers a thread, half the blocks an SM).
    // On Hopper the footprint comes by TMA where the image's layout allows a tensor map.
    let mut staged = None;
    let mut xmap = None;
    if g.pass == Pass::Fprop && y_vec && target.cc() >= 80 {
        if target.hopper() {
            if let Some(st) = staged_fprop(g, lanes, vec, px, true) {
                let map = footprint_map(graph, g, &st, vec);
                if map.check().is_ok() {
                    (staged, xmap) = (Some(st), Some(map));
                }
            }
        }
        if staged.is_none() {
            staged = staged_fprop(g, lanes, vec, px, false);
        }
    }
    if let Some(st) = &staged {
        (gb, ls, nt) = (st.gb, ceil_div(lanes, st.gb), st.threads());
    }
    // 32-bit indices when every offset (and the scratch's) fits.
    let big = [g.x, g.y, g.w].iter().any(|&t| extent(graph.desc(t)) >= 1 << 31) || g.n * g.od.iter().product::<i64>() * k >= 1 << 31;
    let (it, sfx) = if big { ("long long", "LL") } else { ("int", "") };
    let ch_fast = match g.pass {
        Pass::Dgrad => g.xs[1] <= g.xs[4],
        _ => g.ys[1] <= g.ys[4],
    };
    let rows = g.t[0] * g.t[1];
    let name = match g.pass {
        Pass::Fprop => "dw_conv_fprop",
        Pass::Dgrad => "dw_conv_dgrad",
        Pass::Wgrad => "dw_conv_wgrad",
    };
    let entry = entry_name(ni, &format!("{name}{}", if vector { "" } else { "_u" }));
    let mut sig = Signature::new();
    match g.pass {
        Pass::Fprop => {
            sig.param("const ET* __restrict__ x", Arg::Ptr(g.x)).param("const ET* __restrict__ w", Arg::Ptr(g.w)).param("ET* __restrict__ y", Arg::Ptr(g.y));
        }
        Pass::Dgrad => {
            sig.param("const ET* __restrict__ dy", Arg::Ptr(g.y)).param("const ET* __restrict__ w", Arg::Ptr(g.w)).param("ET* __restrict__ dx", Arg::Ptr(g.x));
        }
        Pass::Wgrad => {
            sig.param("const ET* __restrict__ dy", Arg::Ptr(g.y)).param("const ET* __restrict__ x", Arg::Ptr(g.x)).param("float* __restrict__ part", Arg::Scratch(0));
        }
    }
    let dt = match g.dt {
        DataType::F16 => "DW_F16",
        DataType::Bf16 => "DW_BF16",
        _ => "DW_F32",
    };
    let num = |v: i64| format!("{v}{sfx}");
    // The defines every launch of the node shares, after its entry.
    let config = |src: Source| -> Source {
        let mut src = src.define("DW_DT", dt).define("VEC", vec).define("IT", it);
        for (name, v) in [("N_", g.n), ("C_", g.c), ("M_", g.m), ("K_", k)] {
            src = src.define(name, num(v));
        }
        for a in 0..3 {
            src = src
                .define(&format!("ID{a}"), g.id[a])
                .define(&format!("OD{a}"), g.od[a])
                .define(&format!("T{a}"), g.t[a])
                .define(&format!("S{a}"), g.stride[a])
                .define(&format!("D{a}"), g.dil[a])
                .define(&format!("PRE{a}"), g.pre[a]);
        }
        src = src.define("T_", taps).flag("FLIP", g.flip);
        for (i, s) in ["XSN", "XSC", "XS0", "XS1", "XS2"].iter().enumerate() {
            src = src.define(s, num(g.xs[i]));
        }
        for (i, s) in ["YSN", "YSK", "YS0", "YS1", "YS2"].iter().enumerate() {
            src = src.define(s, num(g.ys[i]));
        }
        for (i, s) in ["WSK", "WS0", "WS1", "WS2"].iter().enumerate() {
            src = src.define(s, num(g.ws[i]));
        }
        src.define("NT", nt).define("G_", lanes).define("GB", gb).define("TB", tb).define("LS", ls).define("PX", px).flag("CH_FAST", ch_fast).flag("UNROLL_ROWS", rows <= 16)
    };
    if let Some(map) = &xmap {
        sig.param("const __grid_constant__ TmaMap xmap", Arg::TensorMap(Box::new(map.clone())));
    }
    let mut src = config(Source::new().entry(&entry, &sig));
    let mut needs = Vec::new();
    let pass_flags = |src: Source, which: &str| ["DW_FPROP", "DW_FPROP_STAGED", "DW_DGRAD", "DW_WGRAD", "DW_WGRAD_SUM"].iter().fold(src, |s, f| s.flag(f, *f == which));
    if let Some(st) = &staged {
        let blocks = ls * st.rb * st.cw * g.n * g.od[0];
        if blocks >= 1 << 31 {
            return None;
        }
        src = src.define("RH", st.rh).define("RB", st.rb).define("OWB", st.owb).define("CW", st.cw).define("SR", st.sr).define("SWID", st.swid);
        src = src.define("TWB", st.owb / px).define("RG", st.rg).define("FW", (px - 1) * s2 + (t2 - 1) * d2 + 1);
        src = src.flag("DW_TMA", xmap.is_some()).define("DW_TMA_RANK", xmap.as_ref().map_or(0, |m| m.dims.len()));
        if xmap.is_some() {
            src = src.template(HOPPER);
        }
        let source = pass_flags(src, "DW_FPROP_STAGED").template(DEPTHWISE).build();
        let smem = st.shared(taps, vec);
        let launch = Launch::new(source, entry, Grid::Exact(blocks as u32, 1, 1), nt as u32, sig.into_args()).with_shared(smem as u32);
        return Some((NodeKernels::one(launch), vec![g.x, g.y]));
    }
    let launch = match g.pass {
        Pass::Fprop | Pass::Dgrad => {
            let out_w = if g.pass == Pass::Fprop { g.od[2] } else { g.id[2] };
            let tw = ceil_div(out_w, px);
            let tiles = if g.pass == Pass::Fprop { g.n * g.od[0] * g.od[1] * tw } else { g.n * g.id[0] * g.id[1] * tw };
            let blocks = ls * ceil_div(tiles, tb);
            if blocks >= 1 << 31 {
                return None;
            }
            src = src.define("TW", tw).define("NTILES", num(tiles)).define("FW", (px - 1) * s2 + (t2 - 1) * d2 + 1);
            // dgrad: the dy positions along W (relative to the tile's start / S2) its PX
            // positions reach: e = px + pre - t2 * dil over px in [0, PX), t2 in [0, T2), those
            // divisible by the stride.
            let (qlo, qhi) = ((g.pre[2] - (t2 - 1) * d2).div_euclid(s2) + i64::from((g.pre[2] - (t2 - 1) * d2).rem_euclid(s2) != 0), (px - 1 + g.pre[2]).div_euclid(s2));
            src = src.define("QLO", qlo).define("NQ", (qhi - qlo + 1).max(0));
            src = src.flag("Y_VEC", y_vec).flag("DY_VEC", y_vec);
            let src = pass_flags(src, if g.pass == Pass::Fprop { "DW_FPROP" } else { "DW_DGRAD" });
            if vec > 1 {
                needs.push(g.x);
                if y_vec {
                    needs.push(g.y);
                }
            }
            let shared = if g.pass == Pass::Fprop { taps * gb * vec * 4 } else { taps * g.m * gb * vec * 4 };
            let source = src.template(DEPTHWISE).build();
            NodeKernels::one(Launch::new(source, entry, Grid::Exact(blocks as u32, 1, 1), nt as u32, sig.into_args()).with_shared(shared as u32))
        }
        Pass::Wgrad => {
            let sms = target.sm_count.max(1) as i64;
            let out_rows = g.n * g.od[0] * g.od[1];
            let ns = ceil_div(WGRAD_BLOCKS_PER_SM * sms, rows * ls).clamp(1, ceil_div(out_rows, tb).max(1));
            let blocks = rows * ls * ns;
            if blocks >= 1 << 31 {
                return None;
            }
            let scratch = ns * taps * k;
            if scratch >= 1 << 31 {
                return None;
            }
            src = src.define("FW", (px - 1) * s2 + (t2 - 1) * d2 + 1).define("NS", ns).define("QLO", 0).define("NQ", 0).define("TW", 1).define("NTILES", 1);
            src = src.flag("Y_VEC", false).flag("DY_VEC", y_vec);
            let source = pass_flags(src, "DW_WGRAD").template(DEPTHWISE).build();
            if vec > 1 {
                needs.push(g.x);
                if y_vec {
                    needs.push(g.y);
                }
            }
            let first = Launch::new(source, entry, Grid::Exact(blocks as u32, 1, 1), nt as u32, sig.into_args());
            // The sum: a thread per (k, tap).
            let sum_entry = entry_name(ni, &format!("dw_conv_wgrad_sum{}", if vector { "" } else { "_u" }));
            let mut sig2 = Signature::new();
            sig2.param("const float* __restrict__ part", Arg::Scratch(0)).param("ET* __restrict__ dw", Arg::Ptr(g.w));
            let sum_src = config(Source::new().entry(&sum_entry, &sig2));
            let sum_src = sum_src.define("FW", 1).define("NS", ns).define("QLO", 0).define("NQ", 0).define("TW", 1).define("NTILES", 1).flag("Y_VEC", false).flag("DY_VEC", false);
            let source = pass_flags(sum_src, "DW_WGRAD_SUM").template(DEPTHWISE).build();
            let second = Launch::new(source, sum_entry, Grid::Cover((taps * k) as u64), nt as u32, sig2.into_args());
            return Some((NodeKernels { launches: vec![first, second], scratch: vec![(scratch * 4) as usize] }, needs));
        }
    };
    Some((launch, needs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depthwise(c: i64, hw: i64, r: i64, s: i64, dt: DataType, channels_last: bool) -> Graph {
        let desc = |name: &str, dims: &[i64]| {
            let d = TensorDesc::new(name, dims, dt);
            if channels_last {
                d.with_layout(&[0, 2, 3, 1])
            } else {
                d
            }
        };
        let mut g = Graph::new("dw").io_data_type(dt);
        let x = g.tensor(desc("x", &[32, c, hw, hw]));
        let w = g.tensor(desc("w", &[c, 1, r, r]));
        let y = g.conv_fprop(x, w, ConvAttrs::new(2).with_padding(&[(r - 1) / 2, (r - 1) / 2]).with_stride(&[s, s]));
        g.set_output(y);
        g.validate().unwrap();
        g
    }

    fn source(g: &Graph, target: &Target) -> String {
        let u = unit(g, 0, target).expect("the depthwise kernels take it");
        u.kernels.launches[0].source.clone()
    }

    /// Channels-last 16-bit forwards take the staged kernel on sm_80+; NCHW (one channel a
    /// thread) and the multiplier's layouts keep the plain one.
    #[test]
    fn staged_forward_where_vectors_allow() {
        let nhwc = depthwise(144, 56, 3, 1, DataType::F16, true);
        for t in [Target::sm90a(), Target::sm80()] {
            let src = source(&nhwc, &t);
            assert!(src.contains("#define DW_FPROP_STAGED 1"), "{}", t.arch);
            // The footprint by TMA on Hopper, by the threads' cp.async elsewhere.
            assert_eq!(src.contains("#define DW_TMA 1"), t.hopper(), "{}", t.arch);
        }
        let nchw = depthwise(144, 56, 3, 1, DataType::F16, false);
        assert!(source(&nchw, &Target::sm90a()).contains("#define DW_FPROP 1"));
    }

    /// The blocking covers the output, fits its shared memory and threads, and stages fewer
    /// vectors per output than one footprint row a filter row (MobileNet's 3x3, its stride-2
    /// layer, ConvNeXt's 7x7, an f32 5x5 and a 1024-channel 7x7 map).
    #[test]
    fn staged_blocking_fits_and_covers() {
        for (c, hw, r, s, dt) in
            [(144, 56, 3, 1, DataType::F16), (96, 112, 3, 2, DataType::F16), (96, 56, 7, 1, DataType::Bf16), (64, 33, 5, 1, DataType::F32), (1024, 7, 3, 1, DataType::F16)]
        {
            let g = depthwise(c, hw, r, s, dt, true);
            let geo = geometry(&g, 0).unwrap();
            let vec = if dt == DataType::F32 { 4 } else { 8 };
            for tma in [false, true] {
                let st = staged_fprop(&geo, c / vec, vec, 4, tma).expect("a blocking");
                assert_eq!(st.cstride, if tma { st.gb } else { 8 });
                let (oh, ow) = (geo.od[1], geo.od[2]);
                assert!(st.owb % st.px == 0 && st.cw * st.owb >= ow && (st.cw - 1) * st.owb < ow, "{st:?}");
                assert!(st.rb * st.rh >= oh && (st.rb - 1) * st.rh < oh, "{st:?}");
                assert!(st.shared(r * r, vec) <= STAGED_SMEM && st.threads() <= 1024 && st.gb <= 8, "{st:?}");
                assert_eq!(st.sr, (st.rh - 1) * s + r, "{st:?}");
                assert_eq!(st.swid, (st.owb - 1) * s + r, "{st:?}");
                // Each output row reads r footprint rows of (owb - 1) * s + r positions; a
                // block's rows share theirs.
                assert!(((st.sr * st.swid) as f64) < (r * st.rh.min(oh) * st.swid) as f64, "{st:?}");
            }
        }
    }
}
