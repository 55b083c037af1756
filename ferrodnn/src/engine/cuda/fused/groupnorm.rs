//! Fast group normalization: forward (with a pointwise chain after it, such as the SiLU of a
//! diffusion UNet, fused into its last pass) and backward, on channels-last (NHWC, N outermost)
//! and packed NCHW tensors; f32, f16 and bf16 x (and y, dy, dx), f32 statistics and sums.
//!
//! Three launches each way, all deterministic (fixed summation orders, no atomics):
//! 1. statistics, partial sums to scratch. Forward: per image, group and block of positions, the
//!    sums of `x - K` and `(x - K)^2`, K the group's first channel at the image's first position
//!    (NHWC: a block per slab of an image's positions in the channel kernels' geometry, a thread
//!    owning 16 bytes of channels, which may straddle two groups: per-channel sums over the slab,
//!    then per group in channel order; NCHW: a warp per (plane, split) of the plane's HW
//!    contiguous elements, splits enough to give every SM warps; both in `groupnorm.cuh`).
//!    Backward: per image, channel and block, the sums of `dy` and `dy * xhat`, per channel since
//!    dscale and dbias need them (NHWC: the channel kernels' pass, `channel_stats.cuh`, reading
//!    the statistics at the channel's group; NCHW: the warp per (plane, split)).
//! 2. finalize (`groupnorm.cuh`), in double: forward, a warp per (image, group) adds its partials
//!    into the group's mean and inverse deviation (written to mean and inv_variance in training);
//!    backward, a block per (image, group) adds `scale * dy` and `scale * dy * xhat` over the
//!    group's channels, and blocks of 32 channels sum dscale and dbias over the images' partials.
//!    Both write the apply pass's per (image, channel) coefficients.
//! 3. apply: `y = epilogue((x - mean) * a + b)` or `dx = A * dy + B * (x - mean) + Cs`, walking
//!    the tensor backwards so that what the statistics pass read last (likely still in L2) comes
//!    first. NHWC: the channel kernels' apply pass (`channel_apply.cuh`); NCHW: a thread per 16
//!    bytes (`groupnorm.cuh`).
//!
//! The minimum traffic is x read twice (statistics, then apply) and y written once forward, x
//! and dy read twice and dx written once backward; the finalize moves partials of a few hundred
//! KiB. Epsilon is a kernel parameter (double), so one plan serves every value.
//!
//! The epilogue ([`epilogue_groups`], [`epilogue_unit`]): up to [`EPILOGUE_MAX_NODES`] unary
//! pointwise nodes computing in f32 after the norm's y, each reading the previous one's output
//! only (virtual, read once), as one `pw_<mode>` call each (`pointwise/ops.cuh`, their
//! attributes float parameters), each inner value rounded to its tensor's type as the CPU
//! stores it. The backward of norm + SiLU stays as the graph writes it: the swish backward (a
//! pointwise kernel) then this backward.

use super::channels::{self, ceil_div, chan_of, channels_last, define_chans, row_major, same_layout, stat_of, ChanGeom, Vectors, BN_BLOCKS_PER_SM};
use crate::dtype::DataType;
use crate::engine::cuda::kernel::ctype;
use crate::engine::cuda::kernel::{entry_name, Attr, Grid, Launch, NodeKernels, Signature, Source, Target, Unit};
use crate::engine::cuda::pointwise::{self as pw, Form};
use crate::error::Result;
use crate::graph::ops::norm::GroupnormAttrs;
use crate::graph::ops::pointwise::PointwiseMode;
use crate::graph::ops::Op;
use crate::graph::{Graph, Node, TensorId};
use std::collections::HashMap;

/// The finalize passes and the NCHW passes.
const GROUPNORM_CUH: &str = include_str!("groupnorm.cuh");
/// Threads per block of the `groupnorm.cuh` kernels.
const THREADS: i64 = 256;
/// Most pointwise nodes an epilogue takes.
pub const EPILOGUE_MAX_NODES: usize = 4;
/// Items (16-byte vectors or elements) per lane below which an NCHW plane is not split further.
const MIN_ITEMS_PER_LANE: i64 = 4;

/// A specialized unit for groupnorm or groupnorm backward node `ni`, or None when no fast
/// kernel applies.
pub fn unit(graph: &Graph, ni: usize, target: &Target) -> Result<Option<Unit>> {
    let node = &graph.nodes[ni];
    let sms = target.sm_count.max(1) as i64;
    if graph.compute_type(node) == DataType::F64 {
        return Ok(None);
    }
    let kernels = match &node.op {
        Op::Groupnorm(a) => forward(graph, ni, node, a, None, sms),
        Op::GroupnormBackward(a) => backward(graph, ni, node, a, sms),
        _ => None,
    };
    Ok(kernels.map(|kernels| Unit { nodes: vec![ni], kernels, writes: node.outputs.iter().map(|p| p.tensor).collect(), unaligned: None }))
}

/// A pointwise chain after the norm, as the apply pass computes it.
struct Epilogue {
    /// The chain's last output: what the apply pass writes.
    out: TensorId,
    /// The body of `CH_EPILOGUE(v)`, `v` the normalized value (f32).
    expr: String,
    /// The nodes' attributes, float parameters `ea0`, `ea1`, ...
    params: Vec<f64>,
    /// Fast exp and division (`PW_FAST`).
    fast: bool,
}

impl Epilogue {
    /// The expression of `chain` (in order, each reading the previous output, the first the
    /// norm's `y`). With a 16-bit output, exp and sigmoid take the fast intrinsics (`PW_FAST`),
    /// as in the fused pointwise kernels: their few ulps vanish in the output's rounding.
    fn new(graph: &Graph, y: TensorId, chain: &[usize]) -> Option<Epilogue> {
        let mut params = Vec::new();
        let mut expr = round(ctype::dtype(graph, y), "v".into());
        for (k, &p) in chain.iter().enumerate() {
            let mode = epilogue_mode(graph, p)?;
            let call = pw::call(mode, [&expr, "", ""], Form::Fused, false, &mut |v| {
                params.push(v);
                format!("ea{}", params.len() - 1)
            });
            let out = graph.nodes[p].outputs[0].tensor;
            expr = if k + 1 < chain.len() { round(ctype::dtype(graph, out), call) } else { call };
        }
        let out = chain.last().map_or(y, |&p| graph.nodes[p].outputs[0].tensor);
        let fast = matches!(ctype::dtype(graph, out), DataType::F16 | DataType::Bf16);
        Some(Epilogue { out, expr, params, fast })
    }

    /// The parameters after the apply pass's own.
    fn sign(&self, sig: &mut Signature) {
        for (j, &v) in self.params.iter().enumerate() {
            sig.f32(&format!("ea{j}"), v);
        }
    }

    /// The apply pass's templates with the epilogue's headers and define (before `apply`).
    fn templates(src: Source, epi: Option<&Epilogue>, before: &[&str], apply: &str) -> String {
        let mut src = src;
        if let Some(e) = epi {
            src = src.flag("FZ_DOUBLE", false).flag("PW_FAST", e.fast).define("CH_EPILOGUE(v)", format!("({})", e.expr));
        }
        for t in before {
            src = src.template(t);
        }
        if epi.is_some() {
            src = src.template(pw::CONVERT).template(pw::OPS);
        }
        src.template(apply).build()
    }
}

/// `v` (a float expression) rounded to a 16-bit type and back, as the CPU stores a value of
/// that type; unchanged for f32.
fn round(dt: DataType, v: String) -> String {
    match dt {
        DataType::F16 | DataType::Bf16 => format!("fz_cv(fz_to_{}({v}))", dt.name()),
        _ => v,
    }
}

/// The mode of a pointwise node an epilogue can take: unary (port `a`), output `y` of a type the
/// kernels store, computing in f32.
fn epilogue_mode(graph: &Graph, ni: usize) -> Option<PointwiseMode> {
    let node = &graph.nodes[ni];
    let Op::Pointwise(a) = &node.op else { return None };
    if a.mode.arity() != 1 || matches!(a.mode, PointwiseMode::GenIndex { .. }) || graph.compute_type(node) != DataType::F32 {
        return None;
    }
    if node.inputs.len() != 1 || node.inputs[0].name != "a" || node.outputs.len() != 1 || node.outputs[0].name != "y" {
        return None;
    }
    let out = node.outputs[0].tensor;
    ctype::float_c_type(ctype::dtype(graph, out))?;
    (!graph.desc(out).is_pass_by_value).then_some(a.mode)
}

/// The epilogue chain of groupnorm node `ni`: the unary pointwise nodes reading its y, then each
/// other's output, through tensors that are virtual and read by the next node only.
fn epilogue_chain(graph: &Graph, ni: usize, readers: &HashMap<usize, Vec<usize>>) -> Vec<usize> {
    let Some(mut t) = graph.nodes[ni].output("y") else { return Vec::new() };
    let dims = graph.desc(t).dims.clone();
    let mut chain = Vec::new();
    while chain.len() < EPILOGUE_MAX_NODES {
        let d = graph.desc(t);
        let Some([q]) = readers.get(&t.0).map(|r| r.as_slice()) else { break };
        if !d.is_virtual || epilogue_mode(graph, *q).is_none() || graph.nodes[*q].input("a") != Some(t) {
            break;
        }
        let out = graph.nodes[*q].outputs[0].tensor;
        if graph.desc(out).dims != dims {
            break;
        }
        chain.push(*q);
        t = out;
    }
    chain
}

/// Groups of a groupnorm (forward) and the pointwise chain after it (the norm first, the chain
/// in order) that [`epilogue_unit`] generates as one unit: the norm's y and the chain's inner
/// values never go through memory.
pub fn epilogue_groups(graph: &Graph, order: &[usize], target: &Target) -> Vec<Vec<usize>> {
    let readers = graph.consumers();
    let position: HashMap<usize, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let mut out = Vec::new();
    for &ni in order {
        if !matches!(graph.nodes[ni].op, Op::Groupnorm(_)) {
            continue;
        }
        let chain = epilogue_chain(graph, ni, &readers);
        let Some(&last) = chain.last() else { continue };
        if chain.iter().any(|n| !position.contains_key(n)) {
            continue;
        }
        // The unit runs where the chain's last node would: a node reading the norm's statistics
        // must come after it.
        let late = graph.nodes[ni]
            .outputs
            .iter()
            .filter(|p| p.name != "y")
            .all(|p| readers.get(&p.tensor.0).is_none_or(|r| r.iter().all(|q| position.get(q).is_some_and(|&pq| pq > position[&last]))));
        if !late {
            continue;
        }
        let mut group = vec![ni];
        group.extend(chain);
        if matches!(epilogue_unit(graph, &group, target), Ok(Some(_))) {
            out.push(group);
        }
    }
    out
}

/// The unit of a group from [`epilogue_groups`]: the norm's kernels with the chain in the apply
/// pass. None when the group or its tensors do not fit (the nodes then run one by one).
pub fn epilogue_unit(graph: &Graph, nodes: &[usize], target: &Target) -> Result<Option<Unit>> {
    let Some((&ni, chain)) = nodes.split_first() else { return Ok(None) };
    let node = &graph.nodes[ni];
    let Op::Groupnorm(a) = &node.op else { return Ok(None) };
    if chain.is_empty() || graph.compute_type(node) == DataType::F64 {
        return Ok(None);
    }
    let Some(y) = node.output("y") else { return Ok(None) };
    // The chain as epilogue_chain finds it.
    if epilogue_chain(graph, ni, &graph.consumers()) != chain {
        return Ok(None);
    }
    let Some(epi) = Epilogue::new(graph, y, chain) else { return Ok(None) };
    let Some(kernels) = forward(graph, ni, node, a, Some(&epi), target.sm_count.max(1) as i64) else { return Ok(None) };
    let mut writes: Vec<TensorId> = node.outputs.iter().filter(|p| p.name != "y").map(|p| p.tensor).collect();
    writes.push(epi.out);
    Ok(Some(Unit { nodes: nodes.to_vec(), kernels, writes, unaligned: None }))
}

/// Where the statistics and apply passes take x: the channel kernels' groups of positions
/// (NHWC) or planes (NCHW).
enum Layout {
    Nhwc(ChanGeom),
    Planes(Planes),
}

/// NCHW: `n * c` planes of `hw` elements, items of `vw` elements (16 bytes when a plane is a
/// multiple of 16 bytes), each plane in `splits` splits of `chunk` items.
struct Planes {
    hw: i64,
    vw: i64,
    items: i64,
    splits: i64,
    chunk: i64,
}

impl Planes {
    fn new(n: i64, c: i64, hw: i64, v: &Vectors, esize: i64, sms: i64) -> Planes {
        let vw = if hw * esize % 16 == 0 { v.vec() } else { 1 };
        let items = hw / vw;
        // About 32 warps per SM in all, each with a few items per lane at least.
        let want = ceil_div(sms * 32, n * c).clamp(1, (items / (32 * MIN_ITEMS_PER_LANE)).max(1));
        let chunk = ceil_div(items, want);
        Planes { hw, vw, items, splits: ceil_div(items, chunk), chunk }
    }

    /// Blocks of the statistics pass (a warp per (plane, split), 8 per block; one wave of 8
    /// blocks per SM at most: the pass strides over the rest).
    fn stats_grid(&self, planes: i64, sms: i64) -> i64 {
        ceil_div(planes * self.splits, THREADS / 32).clamp(1, sms * 8)
    }
}

/// The shape of a groupnorm: batch, channels, groups, positions per image, rank.
struct Shape {
    n: i64,
    c: i64,
    groups: i64,
    positions: i64,
    rank: usize,
}

impl Shape {
    fn of(graph: &Graph, x: TensorId, groups: i64) -> Option<Shape> {
        let d = graph.desc(x);
        let rank = d.dims.len();
        if rank < 2 || d.strides.len() != rank || d.dims.iter().any(|&n| n < 1) || groups < 1 || d.dims[1] % groups != 0 {
            return None;
        }
        let (n, c) = (d.dims[0], d.dims[1]);
        Some(Shape { n, c, groups, positions: d.element_count() / (n * c), rank })
    }

    /// NHWC (channels-last, the channels a multiple of 16 bytes) or packed NCHW, for x-like
    /// tensors `ids` laid out alike.
    fn layout(&self, graph: &Graph, ids: &[TensorId], v: &Vectors, sms: i64, per_sm: i64) -> Option<Layout> {
        let d = graph.desc(ids[0]);
        if !same_layout(graph, ids) {
            return None;
        }
        if channels_last(&d.dims, &d.strides, true) && self.c % v.vec() == 0 {
            return Some(Layout::Nhwc(ChanGeom::new(self.c, v.vec(), self.n, self.positions, sms, per_sm)));
        }
        if row_major(&d.dims, &d.strides) {
            let esize = ctype::dtype(graph, ids[0]).size() as i64;
            return Some(Layout::Planes(Planes::new(self.n, self.c, self.positions, v, esize, sms)));
        }
        None
    }

    /// The defines every `groupnorm.cuh` kernel reads (see its header), for `layout`.
    fn define(&self, src: Source, kernel: &str, layout: &Layout) -> Source {
        let Shape { n, c, groups, positions, .. } = *self;
        let cpg = c / groups;
        let src = src
            .define("GN_KERNEL", kernel)
            .define("GN_THREADS", THREADS)
            .define("GN_N", format!("{n}LL"))
            .define("GN_C", format!("{c}LL"))
            .define("GN_G", format!("{groups}LL"))
            .define("GN_CPG", format!("{cpg}LL"))
            .define("GN_M", format!("{}LL", cpg * positions))
            .define("GN_NB", format!("{}LL", self.forward_partials(layout)));
        match layout {
            Layout::Nhwc(geom) => src.define("GN_NBLK", format!("{}LL", geom.blocks_and_slab().0)).define("GN_X0(n, c)", format!("((n) * {}LL + (c))", positions * c)),
            Layout::Planes(p) => src
                .define("GN_NBLK", format!("{}LL", p.splits))
                .define("GN_SPLITS", format!("{}LL", p.splits))
                .define("GN_CHUNK", format!("{}LL", p.chunk))
                .define("GN_ITEMS", format!("{}LL", p.items))
                .define("GN_VW", p.vw)
                .define("GN_HW", format!("{}LL", p.hw))
                .define("GN_X0(n, c)", format!("(((n) * {c}LL + (c)) * {}LL)", p.hw)),
        }
    }

    /// The forward's partials per (image, group): a block of positions each (NHWC), a (channel,
    /// split) each (NCHW).
    fn forward_partials(&self, layout: &Layout) -> i64 {
        match layout {
            Layout::Nhwc(geom) => geom.blocks_and_slab().0,
            Layout::Planes(p) => self.c / self.groups * p.splits,
        }
    }

    /// The backward's partials per (image, channel): a block of positions or a split each.
    fn backward_partials(&self, layout: &Layout) -> i64 {
        match layout {
            Layout::Nhwc(geom) => geom.blocks_and_slab().0,
            Layout::Planes(p) => p.splits,
        }
    }
}

/// A `groupnorm.cuh` kernel's text: the entry, the vectors, the shape's defines, the kernel's
/// own (`extra`), then the templates.
fn gn_source(entry: &str, sig: &Signature, v: &Vectors, shape: &Shape, kernel: &str, layout: &Layout, extra: impl FnOnce(Source) -> Source) -> Source {
    extra(shape.define(v.define(Source::new().entry(entry, sig)), kernel, layout))
}

/// Groupnorm forward: statistics, finalize, apply (with `epi`'s chain when given, whose last
/// output it writes instead of y).
fn forward(graph: &Graph, ni: usize, node: &Node, a: &GroupnormAttrs, epi: Option<&Epilogue>, sms: i64) -> Option<NodeKernels> {
    let x = node.input("x")?;
    let scale = node.input("scale")?;
    let bias = node.input("bias")?;
    let out = match epi {
        Some(e) => e.out,
        None => node.output("y")?,
    };
    let shape = Shape::of(graph, x, a.groups)?;
    let v = Vectors::new(ctype::dtype(graph, x), ctype::dtype(graph, out))?;
    let sc = chan_of(graph, scale, shape.rank, shape.c)?;
    let bi = chan_of(graph, bias, shape.rank, shape.c)?;
    let stats = match (node.output("mean"), node.output("inv_variance")) {
        (Some(m), Some(iv)) => Some((m, stat_of(graph, m, shape.rank, shape.n, shape.groups)?, iv, stat_of(graph, iv, shape.rank, shape.n, shape.groups)?)),
        (None, None) => None,
        _ => return None,
    };
    let layout = shape.layout(graph, &[x, out], &v, sms, BN_BLOCKS_PER_SM)?;
    let nc = shape.n * shape.c;
    let part_bytes = (2 * shape.n * shape.groups * shape.forward_partials(&layout) * 4) as usize;
    let co_bytes = (3 * nc * 4) as usize;

    let stats_entry = entry_name(ni, "gn_stats");
    let mut sig = Signature::new();
    sig.ptr("xv", x, false).scratch("float", "part", 0, true);
    let stats_launch = match &layout {
        Layout::Nhwc(geom) => {
            // Static shared memory: the block's channel sums and the groups' sums.
            if 2 * geom.block * v.vec() * 4 + 8 * shape.groups > 48 * 1024 {
                return None;
            }
            let src = shape.define(channels::start(&stats_entry, &sig, v, geom, false), "GN_NHWC_STATS", &layout);
            channels::exact(src.template(channels::VECTORS).template(channels::CHANNELS).template(GROUPNORM_CUH).build(), stats_entry, geom.grid(), geom.block, sig)
        }
        Layout::Planes(p) => {
            let src = gn_source(&stats_entry, &sig, &v, &shape, "GN_PLANE_STATS", &layout, |s| s.flag("GN_DY", false));
            channels::exact(src.template(channels::VECTORS).template(GROUPNORM_CUH).build(), stats_entry, p.stats_grid(nc, sms), THREADS, sig)
        }
    };

    let fin_entry = entry_name(ni, "gn_finalize");
    let mut sig = Signature::new();
    sig.ptr("xv", x, false).scratch("float", "part", 0, false).scratch("float", "co", 1, true).ptr("sc", scale, false).ptr("bi", bias, false);
    if let Some((m, _, iv, _)) = &stats {
        sig.ptr("mo", *m, true).ptr("vo", *iv, true);
    }
    sig.attr("eps", Attr::of(node, "epsilon", a.epsilon), true);
    let src = gn_source(&fin_entry, &sig, &v, &shape, "GN_FINALIZE", &layout, |s| {
        let s = define_chans(s.flag("GN_STATS", stats.is_some()), &[(&sc, "SC", false), (&bi, "BI", false)]);
        match &stats {
            Some((_, ms, _, vs)) => define_chans(s, &[(ms, "MO", true), (vs, "VO", true)]),
            None => s,
        }
    });
    // A warp per (image, group).
    let fin_blocks = ceil_div(shape.n * shape.groups, THREADS / 32);
    if fin_blocks > i32::MAX as i64 {
        return None;
    }
    let fin_launch = Launch::new(src.template(channels::VECTORS).template(GROUPNORM_CUH).build(), fin_entry, Grid::Exact(fin_blocks as u32, 1, 1), THREADS as u32, sig.into_args());

    let apply_entry = entry_name(ni, "gn_apply");
    let mut sig = Signature::new();
    sig.ptr("xv", x, false).scratch("float", "co", 1, false).ptr("yv", out, true);
    if let Some(e) = epi {
        e.sign(&mut sig);
    }
    let apply_launch = match &layout {
        Layout::Nhwc(geom) => {
            let src = channels::start(&apply_entry, &sig, v, geom, false);
            channels::exact(Epilogue::templates(src, epi, &[channels::VECTORS, channels::CHANNELS], channels::APPLY), apply_entry, geom.grid(), geom.block, sig)
        }
        Layout::Planes(p) => {
            let src = gn_source(&apply_entry, &sig, &v, &shape, "GN_PLANE_APPLY", &layout, |s| s.flag("GN_DY", false));
            channels::strided(Epilogue::templates(src, epi, &[channels::VECTORS], GROUPNORM_CUH), apply_entry, nc * p.items, sig)
        }
    };
    Some(NodeKernels { launches: vec![stats_launch, fin_launch, apply_launch], scratch: vec![part_bytes, co_bytes] })
}

/// Groupnorm backward: the sums of dy and dy * xhat per (image, channel, block), the finalize
/// (the coefficients of dx per (image, channel), dscale and dbias), the apply pass for dx.
fn backward(graph: &Graph, ni: usize, node: &Node, a: &GroupnormAttrs, sms: i64) -> Option<NodeKernels> {
    let dy = node.input("dy")?;
    let x = node.input("x")?;
    let scale = node.input("scale")?;
    let mean = node.input("mean")?;
    let inv = node.input("inv_variance")?;
    let dx = node.output("dx")?;
    let dscale = node.output("dscale")?;
    let dbias = node.output("dbias")?;
    let shape = Shape::of(graph, x, a.groups)?;
    let xt = ctype::dtype(graph, x);
    if ctype::dtype(graph, dy) != xt {
        return None;
    }
    let v = Vectors::new(xt, ctype::dtype(graph, dx))?;
    let sc = chan_of(graph, scale, shape.rank, shape.c)?;
    let ds = chan_of(graph, dscale, shape.rank, shape.c)?;
    let db = chan_of(graph, dbias, shape.rank, shape.c)?;
    let mn = stat_of(graph, mean, shape.rank, shape.n, shape.groups)?;
    let iv = stat_of(graph, inv, shape.rank, shape.n, shape.groups)?;
    // The passes that read dy are bounded to 2 blocks per SM (channel kernels in groups).
    let layout = shape.layout(graph, &[x, dy, dx], &v, sms, 2)?;
    let nc = shape.n * shape.c;
    let part_bytes = (2 * nc * shape.backward_partials(&layout) * 4) as usize;
    let co_bytes = (4 * nc * 4) as usize;
    let cpg = shape.c / shape.groups;

    let stats_entry = entry_name(ni, "gn_bwd_stats");
    let mut sig = Signature::new();
    sig.ptr("xv", x, false).ptr("dyv", dy, false).ptr("mn", mean, false).ptr("iv", inv, false).scratch("float", "part", 0, true);
    let stats_launch = match &layout {
        Layout::Nhwc(geom) => {
            let src = define_chans(channels::start(&stats_entry, &sig, v, geom, true), &[(&mn, "MN", false), (&iv, "IV", false)]).define("CH_STAT_CPG", format!("{cpg}LL"));
            channels::exact(channels::templates(src, channels::STATS), stats_entry, geom.grid(), geom.block, sig)
        }
        Layout::Planes(p) => {
            let src = gn_source(&stats_entry, &sig, &v, &shape, "GN_PLANE_STATS", &layout, |s| define_chans(s.flag("GN_DY", true), &[(&mn, "MN", false), (&iv, "IV", false)]));
            channels::exact(src.template(channels::VECTORS).template(GROUPNORM_CUH).build(), stats_entry, p.stats_grid(nc, sms), THREADS, sig)
        }
    };

    let fin_entry = entry_name(ni, "gn_bwd_finalize");
    let mut sig = Signature::new();
    sig.scratch("float", "part", 0, false).scratch("float", "co", 1, true).ptr("sc", scale, false).ptr("mn", mean, false).ptr("iv", inv, false);
    sig.ptr("ds", dscale, true).ptr("db", dbias, true);
    let src = gn_source(&fin_entry, &sig, &v, &shape, "GN_BWD_FINALIZE", &layout, |s| {
        define_chans(s, &[(&sc, "SC", false), (&mn, "MN", false), (&iv, "IV", false), (&ds, "DS", true), (&db, "DB", true)])
    });
    let blocks = shape.n * shape.groups + ceil_div(shape.c, 32);
    if blocks > i32::MAX as i64 {
        return None;
    }
    let fin_launch = Launch::new(src.template(channels::VECTORS).template(GROUPNORM_CUH).build(), fin_entry, Grid::Exact(blocks as u32, 1, 1), THREADS as u32, sig.into_args());

    let apply_entry = entry_name(ni, "gn_bwd_apply");
    let mut sig = Signature::new();
    sig.ptr("xv", x, false).ptr("dyv", dy, false).scratch("float", "co", 1, false).ptr("yv", dx, true);
    let apply_launch = match &layout {
        Layout::Nhwc(geom) => channels::exact(channels::templates(channels::start(&apply_entry, &sig, v, geom, true), channels::APPLY), apply_entry, geom.grid(), geom.block, sig),
        Layout::Planes(p) => {
            let src = gn_source(&apply_entry, &sig, &v, &shape, "GN_PLANE_APPLY", &layout, |s| s.flag("GN_DY", true));
            channels::strided(src.template(channels::VECTORS).template(GROUPNORM_CUH).build(), apply_entry, nc * p.items, sig)
        }
    };
    Some(NodeKernels { launches: vec![stats_launch, fin_launch, apply_launch], scratch: vec![part_bytes, co_bytes] })
}
