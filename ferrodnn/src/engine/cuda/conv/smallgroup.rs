//! Grouped convolutions of few channels a group (ResNeXt's 4, RegNet's 8 or 16, a depthwise
//! convolution's channel multiplier): direct SIMT kernels with f32 sums (`smallgroup.cuh`),
//! forward (with the pointwise epilogue a GEMM view of the convolution takes: bias, activation,
//! residual), data gradient of unit stride (the forward convolution of dy by the filter with
//! each group's channels and filters exchanged and its taps mirrored) and weight gradient;
//! 1D/2D/3D (spatial dims padded to three), any stride (the data gradient: 1), dilation, padding
//! and mode, f16/bf16/f32 inputs, any non-negative strides of the tensors (channels-last fast:
//! 16-byte vectors along channels). Strided data gradients stay on the implicit GEMM.
//!
//! Why direct: with `Cg` image channels a group, an output element takes `Cg * taps` MACs over
//! `2 + 2 * Cg / Kg` bytes (f16, stride 1): at ResNeXt's 4 a group, 36 MACs over 4 bytes. On the
//! H100 (about 29 TFMA/s of f32 FMA at 1.75 GHz, about 3 TB/s of HBM) that is 1.2 ps of FMAs
//! against 1.3 ps of memory an element: at the bandwidth limit with SIMT math, where the
//! tensor-core GEMM spends most of its work on the zeros of a block-diagonal filter and its time
//! on gathers. The kernels take a convolution when `Cg <= 16` and `Cg * taps <= 144` (16
//! channels of 3x3: [`MAX_MACS`]): there the FMAs cost at most 4.9 ps an output element, 3.5
//! times the bytes, still well under what the GEMM does with 16-column tiles; at 32 channels of
//! 3x3 (288 MACs, 9.7 ps) the GEMM's tensor cores win (measured: ResNeXt's 7x7 layer of 32
//! groups of 32 channels 0.0152 ms on the implicit GEMM, 462 M MACs, where these kernels' FMAs
//! alone would take 0.016 ms).
//!
//! Work a thread (`PX` outputs along W, `KV` output channels of one group `g`, one output row):
//!
//! - A block takes a tile of `TH` output rows x `TW = NCT * PX` columns of one output depth
//!   slice, for `GS` groups (a slice of `GS * Cg` image channels); it stages the tile's input
//!   (with its halo) in shared memory as floats, read from global memory once, in 16-byte
//!   vectors along channels where the layout allows. Threads: `NCT` along W (fastest), `NR = TH`
//!   rows, `KS` parts of the group's `Kg` output channels (`KV` each), `GS` groups; a warp's
//!   lanes share a group, so the filter (staged in shared memory too) is read as broadcasts.
//! - fprop: per filter row, the thread keeps the row's weights (`T2 * Cg * KV` floats) in
//!   registers and streams the `FW` input positions its outputs cover (each a chunk of up to four
//!   channels, read once for up to `T2` taps): `PX * T2 * Cg * KV` FMAs for `FW` chunk loads
//!   (3x3 with 4 channels a group: 336 FMAs for 9 loads). The tile's x is laid out per group and
//!   chunk of channels, the columns of each stride phase together (`slot`), rows padded so that a
//!   warp's lanes (consecutive `PX`-column runs, `PX` odd) hit distinct banks. The outputs go
//!   through shared memory (reusing the tile) to 16-byte stores, the epilogue applied there.
//! - wgrad: a thread owns one filter row (`FR = T0 * T1` of them) of `KV` output channels of its
//!   group (`T2 * Cg * KV` sums) over its pixels; blocks stride over the tiles of the whole
//!   reduction (images, output rows and columns) in `NS` slices, staging x and dy per tile (with
//!   the next tile's loads in flight in registers during the current one's FMAs where they fit).
//!   The block's threads' sums are added in a fixed order in shared memory and written as one
//!   partial per slice (`[slice][k][c][tap]` floats); a second launch adds the partials in slice
//!   order: deterministic, no atomics.
//!
//! Vector kernels need 16-byte aligned bases: each unit carries the element-wise kernels as its
//! [`Unaligned`] alternative.

use super::{image_view, view_epilogue};
use crate::dtype::DataType;
use crate::engine::cuda::gemm::{self, Epilogue};
use crate::engine::cuda::kernel::{entry_name, Arg, Grid, Launch, NodeKernels, Signature, Source, Target, Unaligned, Unit};
use crate::graph::ops::conv::{ConvAttrs, ConvMode};
use crate::graph::ops::matmul::MatmulAttrs;
use crate::graph::ops::Op;
use crate::graph::{Graph, Port, TensorDesc, TensorId};

/// The kernels' template.
const SMALLGROUP: &str = include_str!("smallgroup.cuh");

/// Most image channels a group these kernels take. (RegNetY-800MF's 16-channel groups ran 1.4-1.6x
/// faster on the implicit GEMM on the H200: forward 0.0505 -> 0.0324 ms, data gradient 0.0520 ->
/// 0.0366, weight gradient 0.0474 -> 0.0421; 8-channel groups 1.5x slower there, and still with
/// the GEMM's groups packed to fill its tiles: 13 groups of 8 forward 0.0270 -> 0.0394 ms,
/// ResNeXt's 32 groups of 4 at 56x56 0.051 -> 0.125 ms.)
pub const MAX_CG: i64 = 8;
/// Most MACs an output element (`Cg * taps`) these kernels take: beyond, the tensor-core GEMM.
pub const MAX_MACS: i64 = 144;
/// Most floats of a thread's filter row (fprop: `T2 * Cg * KV` weights) or sums (wgrad) kept in
/// registers.
const ROW_REGS: i64 = 96;
/// Most output channels a thread takes, and most outputs (`PX * KV`) of an fprop thread.
const MAX_KV: i64 = 8;
const MAX_OUT_REGS: i64 = 64;
/// Most outputs a thread takes along W, and most input positions they cover (unrolled).
const MAX_PX: i64 = 8;
const MAX_FW: i64 = 64;
/// Threads a block aims at, and at most.
const TARGET_THREADS: i64 = 256;
const MAX_THREADS: i64 = 512;
/// Most shared memory a block takes.
const MAX_SMEM: i64 = 48 * 1024;
/// The weight gradient keeps a tile's next loads in registers when a thread's share is at most
/// this many items (16-byte vectors).
const MAX_PREFETCH: i64 = 8;

fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Which convolution.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pass {
    Fprop,
    /// A data gradient of unit stride, as the forward convolution of dy (see [`geometry`]).
    Dgrad,
    Wgrad,
}

/// The sizes and layouts of a grouped convolution, spatial dims padded to three (leading
/// extents 1).
#[derive(Clone, Debug)]
struct Geo {
    pass: Pass,
    /// The type of x, w (and dy); the type of the stored output (y, the epilogue's last output,
    /// or dw).
    et: DataType,
    ot: DataType,
    n: i64,
    groups: i64,
    cg: i64,
    kg: i64,
    /// Image and output spatial dims, taps.
    id: [i64; 3],
    od: [i64; 3],
    t: [i64; 3],
    stride: [i64; 3],
    dil: [i64; 3],
    pre: [i64; 3],
    flip: bool,
    /// Strides of the image x (n, c, spatial), of the output y or dy (n, k, spatial; fprop: the
    /// stored output's), of w or dw (k, c, spatial), and w's from one group to the next.
    xs: [i64; 5],
    ys: [i64; 5],
    ws: [i64; 5],
    wsg: i64,
    /// The image x, the output y or dy (fprop: the stored output), w or dw. (For a data
    /// gradient, the forward convolution it is: dy, dx, w.)
    x: TensorId,
    y: TensorId,
    w: TensorId,
}

impl Geo {
    fn taps(&self) -> i64 {
        self.t.iter().product()
    }
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

/// Whether node `ni` is a grouped convolution of few channels a group: more than one group, at
/// most [`MAX_CG`] channels a group summed for each output (the image's; for a data gradient,
/// the output gradient's), depthwise convolutions included.
pub fn is_small_group(graph: &Graph, ni: usize) -> bool {
    let node = &graph.nodes[ni];
    let (x, w) = match &node.op {
        Op::ConvFprop(_) => (node.input("x"), node.input("w")),
        Op::ConvDgrad(_) => (node.output("dx"), node.input("w")),
        Op::ConvWgrad(_) => (node.input("x"), node.output("dw")),
        _ => return false,
    };
    let dims = |t: Option<TensorId>| t.map(|t| graph.desc(t).dims.clone()).unwrap_or_default();
    let (xd, wd) = (dims(x), dims(w));
    if xd.len() < 3 || wd.len() < 3 || wd[1] <= 0 || xd[1] <= wd[1] || xd[1] % wd[1] != 0 {
        return false;
    }
    let red = if matches!(node.op, Op::ConvDgrad(_)) { wd[0] / (xd[1] / wd[1]) } else { wd[1] };
    red <= MAX_CG
}

/// Output channels a group of node `ni` when it is a depthwise convolution (its channel
/// multiplier), else 0. The small-group kernels take a multiplier of 2 or more before the
/// depthwise kernels, which store each output channel of a multiplier apart (2-byte stores
/// `M` elements apart where these kernels store 16-byte vectors).
pub fn multiplier(graph: &Graph, ni: usize) -> i64 {
    let node = &graph.nodes[ni];
    let (x, w) = match &node.op {
        Op::ConvFprop(_) => (node.input("x"), node.input("w")),
        Op::ConvDgrad(_) => (node.output("dx"), node.input("w")),
        Op::ConvWgrad(_) => (node.input("x"), node.output("dw")),
        _ => return 0,
    };
    match (x.map(|t| &graph.desc(t).dims), w.map(|t| &graph.desc(t).dims)) {
        (Some(xd), Some(wd)) if xd.len() >= 3 && wd.len() >= 3 && wd[1] == 1 && xd[1] > 0 => wd[0] / xd[1],
        _ => 0,
    }
}

/// The geometry of convolution node `ni` (stored to `out` in the forward pass), or why these
/// kernels do not take it. A data gradient of unit stride is the forward convolution of dy (its
/// `Kg` channels a group the image's) by the filter with each group's channels and filters
/// exchanged and its taps mirrored, padded `(T - 1) * dil - pre` before:
/// `dx[i] = sum_t dy[i + pre - t * dil] w[t] = sum_t' dy[i - pre' + t' * dil] w[T - 1 - t']`.
fn geometry(graph: &Graph, ni: usize, out: Option<TensorId>) -> Result<Geo, String> {
    let node = &graph.nodes[ni];
    let missing = || "a port is missing".to_string();
    // The forward convolution's image, filter and output (dgrad: dx, w, dy).
    let (attrs, pass, x, w, y): (&ConvAttrs, Pass, _, _, _) = match &node.op {
        Op::ConvFprop(a) => (a, Pass::Fprop, node.input("x").ok_or_else(missing)?, node.input("w").ok_or_else(missing)?, node.output("y").ok_or_else(missing)?),
        Op::ConvDgrad(a) => (a, Pass::Dgrad, node.output("dx").ok_or_else(missing)?, node.input("w").ok_or_else(missing)?, node.input("dy").ok_or_else(missing)?),
        Op::ConvWgrad(a) => (a, Pass::Wgrad, node.input("x").ok_or_else(missing)?, node.output("dw").ok_or_else(missing)?, node.input("dy").ok_or_else(missing)?),
        _ => return Err("convolutions".into()),
    };
    let (xd, wd, yd) = (graph.desc(x), graph.desc(w), graph.desc(y));
    let rank = xd.dims.len();
    let well_formed = |d: &TensorDesc| d.dims.len() == rank && d.strides.len() == rank && d.strides.iter().all(|&s| s >= 0) && d.dims.iter().all(|&e| e > 0);
    if !(3..=5).contains(&rank) || !well_formed(xd) || !well_formed(wd) || !well_formed(yd) || attrs.stride.len() != rank - 2 {
        return Err("tensors of rank 3 to 5 with non-negative strides".into());
    }
    let (n, c, k, cg) = (xd.dims[0], xd.dims[1], wd.dims[0], wd.dims[1]);
    if c % cg != 0 || c == cg {
        return Err("more than one group".into());
    }
    let groups = c / cg;
    if k % groups != 0 || attrs.forward_dims(&xd.dims, &wd.dims, "x", "w").ok().as_deref() != Some(&yd.dims[..]) {
        return Err("the output's dims as the convolution makes them".into());
    }
    let kg = k / groups;
    let taps: i64 = wd.dims[2..].iter().product();
    // The channels a group each output sums over: the image's, or dy's for the data gradient.
    let red = if pass == Pass::Dgrad { kg } else { cg };
    if red > MAX_CG || red * taps > MAX_MACS {
        let what = if pass == Pass::Dgrad { "output-gradient" } else { "image" };
        return Err(format!("at most {MAX_CG} {what} channels a group and {MAX_MACS} MACs an output ({what} channels a group x taps); this one has {red} x {taps}"));
    }
    if pass == Pass::Dgrad && attrs.stride.iter().any(|&s| s != 1) {
        return Err("data gradients of unit stride (strided ones run on the implicit GEMM)".into());
    }
    let dt = |t: TensorId| graph.resolved_data_type(t).unwrap_or(DataType::F32);
    // What the kernels read as the image, and what they store.
    let (image, stored) = match pass {
        Pass::Fprop => (x, out.unwrap_or(y)),
        Pass::Dgrad => (y, x),
        Pass::Wgrad => (x, w),
    };
    let et = dt(image);
    let ot = dt(stored);
    let floats = |t: DataType| matches!(t, DataType::F32 | DataType::F16 | DataType::Bf16);
    let other = if pass == Pass::Wgrad { y } else { w };
    if !floats(et) || dt(other) != et || !floats(ot) {
        return Err("inputs of one type, f32, f16 or bf16, and an output of one of them".into());
    }
    if graph.compute_type(node) != DataType::F32 {
        return Err("f32 compute".into());
    }
    let sd = graph.desc(stored);
    if pass == Pass::Fprop && (sd.dims != yd.dims || sd.strides.len() != rank || sd.strides.iter().any(|&s| s < 0)) {
        return Err("an output of the convolution's dims".into());
    }
    let ws = strides5(wd);
    let flip = attrs.mode == ConvMode::Convolution;
    let t3 = pad3(&wd.dims[2..], 1);
    let dil = pad3(&attrs.dilation, 1);
    let pre = pad3(&attrs.pre_padding, 0);
    let g = match pass {
        Pass::Dgrad => Geo {
            pass,
            et,
            ot,
            n,
            groups,
            cg: kg,
            kg: cg,
            id: pad3(&yd.dims[2..], 1),
            od: pad3(&xd.dims[2..], 1),
            t: t3,
            stride: [1; 3],
            dil,
            pre: [0, 1, 2].map(|a| (t3[a] - 1) * dil[a] - pre[a]),
            flip: !flip,
            xs: strides5(yd),
            ys: strides5(xd),
            // Filter kk of the group (an image channel) reads input channel c (an output
            // channel of the forward convolution) at w[g * kg + c, kk].
            ws: [ws[1], ws[0], ws[2], ws[3], ws[4]],
            wsg: kg * ws[0],
            x: y,
            y: x,
            w,
        },
        _ => Geo {
            pass,
            et,
            ot,
            n,
            groups,
            cg,
            kg,
            id: pad3(&xd.dims[2..], 1),
            od: pad3(&yd.dims[2..], 1),
            t: t3,
            stride: pad3(&attrs.stride, 1),
            dil,
            pre,
            flip,
            xs: strides5(xd),
            ys: strides5(if pass == Pass::Fprop { sd } else { yd }),
            ws,
            wsg: kg * ws[0],
            x,
            y: if pass == Pass::Fprop { stored } else { y },
            w,
        },
    };
    let dims_ok = [g.n, c, k].iter().chain(&g.id).chain(&g.od).all(|&d| d < 1 << 30) && g.pre.iter().chain(&g.stride).chain(&g.dil).all(|&v| v.abs() < 1 << 16);
    if !dims_ok {
        return Err("dims below 2^30, strides, dilations and padding below 2^16".into());
    }
    Ok(g)
}

/// The small-group unit of convolution node `ni` alone, or None (with [`decline`] saying why).
pub fn unit(graph: &Graph, ni: usize, target: &Target) -> Option<Unit> {
    let g = geometry(graph, ni, None).ok()?;
    let writes = graph.nodes[ni].outputs.iter().map(|p| p.tensor).collect();
    unit_of(graph, ni, &g, None, target, vec![ni], writes)
}

/// The unit of a forward convolution and the epilogue chain after it (`nodes`: the convolution,
/// then the chain, as the GEMM view of the convolution groups them), or None when these kernels
/// do not take it (the GEMM then does).
pub fn group_unit(graph: &Graph, nodes: &[usize], target: &Target) -> Option<Unit> {
    let (&ni, chain) = nodes.split_first()?;
    if chain.is_empty() || !matches!(graph.nodes.get(ni)?.op, Op::ConvFprop(_)) {
        return None;
    }
    let (epi, out) = epilogue_of(graph, ni, chain)?;
    let g = geometry(graph, ni, Some(out)).ok()?;
    unit_of(graph, ni, &g, Some(&epi), target, nodes.to_vec(), vec![out])
}

/// The unit with the vector kernels where the layouts allow (and the element-wise ones as their
/// alternative for unaligned bases), else the element-wise kernels alone.
fn unit_of(graph: &Graph, ni: usize, g: &Geo, epi: Option<&Epilogue>, target: &Target, nodes: Vec<usize>, writes: Vec<TensorId>) -> Option<Unit> {
    let scalar = || kernels_of(ni, g, epi, target, false, graph);
    let (kernels, unaligned) = match kernels_of(ni, g, epi, target, true, graph) {
        Some((k, needs)) if !needs.is_empty() => (k, Some(Box::new(Unaligned { tensors: needs, kernels: scalar()?.0 }))),
        Some((k, _)) => (k, None),
        None => (scalar()?.0, None),
    };
    Some(Unit { nodes, kernels, writes, unaligned })
}

/// Why the small-group kernels decline node `ni` (None when they take it alone; what they take
/// does not depend on the target).
pub fn decline(graph: &Graph, ni: usize) -> Option<String> {
    match geometry(graph, ni, None) {
        Err(why) => Some(why),
        Ok(g) => {
            kernels_of(ni, &g, None, &Target::sm90a(), false, graph).is_none().then(|| "a tile and filter row that fit a block's shared memory and a thread's registers".into())
        }
    }
}

/// The epilogue of forward convolution `ni` followed by `chain`, over a view of its output as
/// `[N, pixels, K]` (the GEMM epilogue's `(batch, row, col)` = (image, flat output position,
/// output channel)), and the chain's last output; None when a tensor cannot be so viewed or a
/// node is not an epilogue the GEMM engine would take.
fn epilogue_of(graph: &Graph, ni: usize, chain: &[usize]) -> Option<(Epilogue, TensorId)> {
    let node = &graph.nodes[ni];
    let (x, w, y) = (node.input("x")?, node.input("w")?, node.output("y")?);
    let yd = graph.desc(y);
    let mut view = graph.clone();
    view.tensors[y.0] = image_view(yd, &yd.dims)?;
    view_epilogue(graph, &mut view, y, &yd.dims, &[x, w]);
    let vn = &mut view.nodes[ni];
    vn.op = Op::Matmul(MatmulAttrs {});
    vn.inputs = vec![Port { name: "a".into(), tensor: x }, Port { name: "b".into(), tensor: w }];
    vn.outputs = vec![Port { name: "c".into(), tensor: y }];
    let full = gemm::epilogue_chain(&view, ni, &view.consumers());
    if full.len() < chain.len() || full[..chain.len()] != *chain {
        return None;
    }
    let epi = gemm::epilogue::build(&view, ni, &[], chain)?;
    let out = graph.nodes[*chain.last()?].outputs.first()?.tensor;
    Some((epi, out))
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

/// A block's tiling and shared-memory layout (see `smallgroup.cuh` for each define).
#[derive(Clone, Debug, PartialEq)]
struct Cfg {
    px: i64,
    nct: i64,
    nr: i64,
    fr: i64,
    gs: i64,
    ks: i64,
    kv: i64,
    tw: i64,
    tiles_h: i64,
    tiles_w: i64,
    ht: i64,
    wt: i64,
    wp: i64,
    rp: i64,
    chx: i64,
    cq: i64,
    plane: i64,
    gpitch: i64,
    fw: i64,
    /// Elements of x a staged item; of the stored output (fprop) or of dy (wgrad).
    xv: i64,
    yv: i64,
    /// fprop: the output tile's pitch (floats a pixel).
    op: i64,
    /// wgrad: dy's chunks, row pitch, and floats a (group, part).
    chy: i64,
    kq: i64,
    rpy: i64,
    dpitch: i64,
    /// Floats of the x tile (and the output tile it becomes), the weights, dy.
    sx: i64,
    sw: i64,
    sd: i64,
    smem: i64,
}

impl Cfg {
    fn threads(&self) -> i64 {
        self.gs * self.ks * self.fr * self.nr * self.nct
    }
    fn ngs(&self, g: &Geo) -> i64 {
        ceil_div(g.groups, self.gs)
    }
    fn x_items(&self, g: &Geo) -> i64 {
        g.t[0] * self.ht * self.wt * self.gs * g.cg / self.xv
    }
    fn dy_items(&self, g: &Geo) -> i64 {
        self.nr * self.tw * self.gs * g.kg / self.yv
    }
}

/// The smallest `v >= lo` with `v % m == want % m`.
fn congruent(lo: i64, want: i64, m: i64) -> i64 {
    lo + (want - lo).rem_euclid(m)
}

/// A chunk of channels a shared-memory slot holds (1, 2 or 4 floats) for `c` channels.
fn chunk(c: i64) -> i64 {
    if c >= 3 {
        4
    } else {
        c
    }
}

/// The tiling of `g` with x read in items of `xv` elements and the output (fprop) or dy (wgrad)
/// in items of `yv`, or None when no tile fits.
fn choose(g: &Geo, xv: i64, yv: i64) -> Option<Cfg> {
    let (s2, d2, t2) = (g.stride[2], g.dil[2], g.t[2]);
    let fprop = g.pass != Pass::Wgrad;
    // Output channels a thread: the most dividing Kg whose row of weights (fprop) or sums
    // (wgrad) fits the registers.
    // (The weight gradient's thread also holds its dy values and the next tile's loads: at most
    // 128 registers, two blocks of 256 threads an SM.)
    let kv = (1..=g.kg.min(MAX_KV)).rev().find(|&v| g.kg % v == 0 && t2 * g.cg * v <= ROW_REGS && (fprop || regs_of(g, 7, v) <= 128))?;
    let ks = g.kg / kv;
    let chx = chunk(g.cg);
    let cq = ceil_div(g.cg, chx);
    // Outputs along W a thread: the fewest (FMA, load) cycles over the row, with a load's
    // wavefronts (four for 16-byte chunks, two where PX is even: bank conflicts) against the
    // FMA pipe's four warp instructions a cycle.
    let fw_of = |px: i64| (px - 1) * s2 + (t2 - 1) * d2 + 1;
    let max_out = if fprop { MAX_OUT_REGS } else { MAX_OUT_REGS / 2 };
    let mut best: Option<(i64, i64)> = None;
    for px in 1..=MAX_PX {
        if px * kv > max_out || fw_of(px) > MAX_FW {
            continue;
        }
        let tiles = ceil_div(g.od[2], px);
        let fma = px * t2 * g.cg * kv;
        let loads = fw_of(px) * cq * chx * if px % 2 == 0 { 2 } else { 1 };
        let cost = tiles * (fma.max(4 * loads) + loads);
        if best.is_none_or(|(c, _)| cost < c) {
            best = Some((cost, px));
        }
    }
    let (_, px) = best?;
    let fw = fw_of(px);
    let nct = ceil_div(g.od[2], px).min(32);
    let fr = if fprop { 1 } else { g.t[0] * g.t[1] };
    // Rows: two warps' worth of threads along W and H a group part in the forward pass (the x
    // tile's halo rows, read again by the next tile from L2, then 1.25 times the rows at 3x3:
    // 10 for 8), one in the weight gradient (whose threads are FR times as many a row).
    let lanes = if fprop { 64 } else { 32 };
    let mut nr = ceil_div(g.od[1], ceil_div(g.od[1], (lanes / nct).max(1)));
    // Groups a block: whole items of x and of the output (or dy).
    let (ux, uy) = (xv / gcd(g.cg, xv), yv / gcd(g.kg, yv));
    let unit = ux * uy / gcd(ux, uy);
    let regs = regs_of(g, px, kv);
    loop {
        let per_group = ks * fr * nr * nct;
        // The most threads an SM holds doing useful work (groups past the last are wasted),
        // then the smaller block; at most the target threads a block (the smallest block may
        // take more).
        let mut found: Option<((i64, i64), Cfg)> = None;
        let mut gs = unit;
        while gs * per_group <= MAX_THREADS && (gs == unit || gs * per_group <= TARGET_THREADS) {
            let cfg = layout(g, px, nct, nr, fr, gs, ks, kv, xv, yv, fw);
            let nt = cfg.threads();
            let blocks = (65536 / (warps(nt) * regs)).min(227 * 1024 / cfg.smem.max(1)).min(2048 / nt).min(32);
            let score = (blocks * nt * g.groups * 1024 / (ceil_div(g.groups, gs) * gs), -nt);
            if cfg.smem <= MAX_SMEM && blocks > 0 && found.as_ref().is_none_or(|(s, _)| score > *s) {
                found = Some((score, cfg));
            }
            if gs >= g.groups {
                break;
            }
            gs += unit;
        }
        if let Some((_, cfg)) = found {
            return Some(cfg);
        }
        if nr == 1 {
            return None;
        }
        nr = ceil_div(nr, 2);
    }
}

/// A thread's registers, roughly: its filter row or sums, its outputs or dy values, a chunk of x,
/// addressing, and in the weight gradient the next tile's loads.
fn regs_of(g: &Geo, px: i64, kv: i64) -> i64 {
    let prefetch = if g.pass == Pass::Wgrad { 16 } else { 0 };
    ceil_div(32 + g.t[2] * g.cg * kv + px * kv + g.cg + prefetch, 8) * 8
}

/// Threads a block takes registers for: whole warps.
fn warps(nt: i64) -> i64 {
    ceil_div(nt, 32) * 32
}

/// The shared-memory layout of a tiling (see `choose`).
#[allow(clippy::too_many_arguments)]
fn layout(g: &Geo, px: i64, nct: i64, nr: i64, fr: i64, gs: i64, ks: i64, kv: i64, xv: i64, yv: i64, fw: i64) -> Cfg {
    let (s1, d1, t1) = (g.stride[1], g.dil[1], g.t[1]);
    let (s2, d2, t2) = (g.stride[2], g.dil[2], g.t[2]);
    let tw = nct * px;
    let ht = (nr - 1) * s1 + (t1 - 1) * d1 + 1;
    let wt = (tw - 1) * s2 + (t2 - 1) * d2 + 1;
    let wp = ceil_div(wt, s2);
    let chx = chunk(g.cg);
    let cq = ceil_div(g.cg, chx);
    // Rows and groups padded so that a thread's slot is its linear lane index times PX, modulo
    // the slots of one shared-memory wavefront.
    let m = 32 / chx;
    let rp = congruent(s2 * wp, nct * px, m);
    let plane = ht * rp * chx;
    let gpitch = congruent(cq * g.t[0] * ht * rp, ks * fr * nr * nct * px, m) * chx;
    let round4 = |v: i64| ceil_div(v, 4) * 4;
    let mut cfg = Cfg {
        px,
        nct,
        nr,
        fr,
        gs,
        ks,
        kv,
        tw,
        tiles_h: ceil_div(g.od[1], nr),
        tiles_w: ceil_div(g.od[2], tw),
        ht,
        wt,
        wp,
        rp,
        chx,
        cq,
        plane,
        gpitch,
        fw,
        xv,
        yv,
        op: 0,
        chy: 0,
        kq: 0,
        rpy: 0,
        dpitch: 0,
        sx: 0,
        sw: 0,
        sd: 0,
        smem: 0,
    };
    let xs = gs * gpitch;
    match g.pass {
        Pass::Fprop | Pass::Dgrad => {
            // The output tile [pixel][GS * KG] floats, pitch 4 (mod 8) for KV-float stores of
            // lanes PX pixels apart; odd for single floats.
            let oc = gs * g.kg;
            cfg.op = if kv % 4 == 0 && g.kg % 4 == 0 { congruent(oc, 4, 8) } else { oc | 1 };
            cfg.sx = round4(xs.max(nr * tw * cfg.op));
            cfg.sw = gs * g.taps() * g.cg * g.kg;
            cfg.smem = (cfg.sx + cfg.sw) * 4;
        }
        Pass::Wgrad => {
            cfg.chy = chunk(kv);
            cfg.kq = ceil_div(kv, cfg.chy);
            cfg.rpy = congruent(tw, nct * px, 32 / cfg.chy);
            cfg.dpitch = cfg.kq * nr * cfg.rpy * cfg.chy;
            cfg.sx = round4(xs);
            cfg.sd = gs * ks * cfg.dpitch;
            // The sums' reduction reuses the tiles: [T2 chunk][thread] floats.
            let red = cfg.threads() * g.cg * kv;
            cfg.smem = (cfg.sx + cfg.sd).max(red) * 4;
        }
    }
    cfg
}

/// The launches of `g` (with 16-byte vectors of channels where the layouts allow, when
/// `vector`), and the tensors whose bases the vectors need aligned; None when no tiling fits or
/// `vector` finds nothing to vectorize.
fn kernels_of(ni: usize, g: &Geo, epi: Option<&Epilogue>, target: &Target, vector: bool, graph: &Graph) -> Option<(NodeKernels, Vec<TensorId>)> {
    let (c, k) = (g.groups * g.cg, g.groups * g.kg);
    let xdims = [g.n, c, g.id[0], g.id[1], g.id[2]];
    let ydims = [g.n, k, g.od[0], g.od[1], g.od[2]];
    let full = |dt: DataType| 16 / dt.size() as i64;
    let xv = if vector && vectorizes(&g.xs, xdims, full(g.et)) { full(g.et) } else { 1 };
    // fprop: the stored output's items; wgrad: dy's.
    let yt = if g.pass == Pass::Wgrad { g.et } else { g.ot };
    let yv = if vector && vectorizes(&g.ys, ydims, full(yt)) { full(yt) } else { 1 };
    if vector && xv == 1 && yv == 1 {
        return None;
    }
    let cfg = choose(g, xv, yv)?;
    let mut needs = Vec::new();
    if xv > 1 {
        needs.push(g.x);
    }
    if yv > 1 {
        needs.push(g.y);
    }
    let ngs = cfg.ngs(g);
    let tiles = g.n * g.od[0] * cfg.tiles_h * cfg.tiles_w;
    let taps = g.taps();
    // 32-bit indices when every offset (and the scratch's) fits.
    let big = [g.x, g.y, g.w].iter().any(|&t| extent(graph.desc(t)) >= 1 << 31) || ngs * tiles >= 1 << 31;
    let (it, sfx) = if big { ("long long", "LL") } else { ("int", "") };
    let num = |v: i64| format!("{v}{sfx}");
    let code = |dt: DataType| match dt {
        DataType::F16 => "SG_F16",
        DataType::Bf16 => "SG_BF16",
        _ => "SG_F32",
    };
    let nt = cfg.threads();
    // The defines every launch of the node shares, after its entry.
    let config = |src: Source| -> Source {
        let mut src = src.define("SG_ET", code(g.et)).define("SG_OT", code(g.ot)).define("IT", it);
        for (name, v) in [("N_", g.n), ("G_", g.groups), ("CG", g.cg), ("KG", g.kg), ("C_", c), ("K_", k)] {
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
        for (names, s) in [(["XSN", "XSC", "XS0", "XS1", "XS2"], g.xs), (["YSN", "YSK", "YS0", "YS1", "YS2"], g.ys), (["WSK", "WSC", "WS0", "WS1", "WS2"], g.ws)] {
            for (name, v) in names.iter().zip(s) {
                src = src.define(name, num(v));
            }
        }
        src = src.define("WSG", num(g.wsg));
        for (name, v) in [
            ("NT", nt),
            ("GS", cfg.gs),
            ("NGS", ngs),
            ("KS", cfg.ks),
            ("KV", cfg.kv),
            ("NR", cfg.nr),
            ("NCT", cfg.nct),
            ("PX", cfg.px),
            ("FR", cfg.fr),
            ("TH", cfg.nr),
            ("TW", cfg.tw),
            ("TILES_H", cfg.tiles_h),
            ("TILES_W", cfg.tiles_w),
            ("HT", cfg.ht),
            ("WT", cfg.wt),
            ("WP", cfg.wp),
            ("RP", cfg.rp),
            ("CHX", cfg.chx),
            ("CQ", cfg.cq),
            ("PLANE", cfg.plane),
            ("GPITCH", cfg.gpitch),
            ("FW", cfg.fw),
            ("XV", xv),
            ("YV", yv),
            ("SX_FLOATS", cfg.sx),
        ] {
            src = src.define(name, v);
        }
        src.define("NTILES", num(tiles))
            .flag("X_CH_FAST", xv > 1 || g.xs[1] <= g.xs[4])
            .flag("Y_CH_FAST", yv > 1 || g.ys[1] <= g.ys[4])
            .flag("X_PUT4", cfg.chx == 4 && g.cg % 4 == 0 && xv % 4 == 0)
            .flag("UNROLL_ROWS", g.t[0] * g.t[1] <= 16)
    };
    let passes = |src: Source, which: &str| ["SG_FPROP", "SG_WGRAD", "SG_WGRAD_SUM"].iter().fold(src, |s, f| s.flag(f, *f == which));
    let tag = if vector { "" } else { "_u" };
    match g.pass {
        Pass::Fprop | Pass::Dgrad => {
            let blocks = ngs * tiles;
            if blocks >= 1 << 31 {
                return None;
            }
            let entry = entry_name(ni, &format!("sg_conv_{}{tag}", if g.pass == Pass::Dgrad { "dgrad" } else { "fprop" }));
            let mut sig = Signature::new();
            sig.param("const ET* __restrict__ x", Arg::Ptr(g.x)).param("const ET* __restrict__ w", Arg::Ptr(g.w)).param("OT* __restrict__ y", Arg::Ptr(g.y));
            if let Some(e) = epi {
                let decls: Vec<&str> = e.params.split(',').map(str::trim).filter(|d| !d.is_empty()).collect();
                if decls.len() != e.args.len() {
                    return None;
                }
                for (decl, arg) in decls.into_iter().zip(&e.args) {
                    sig.param(decl, arg.clone());
                }
            }
            let mut src = config(Source::new().entry(&entry, &sig))
                .define("OP", cfg.op)
                .flag("W_VEC4", cfg.kv % 4 == 0 && g.kg % 4 == 0)
                .flag("O_VEC4", cfg.kv % 4 == 0 && g.kg % 4 == 0 && cfg.op % 4 == 0)
                .flag("SG_EPI", epi.is_some())
                .define("EPI_NAMES", epi.map_or("", |e| e.names.as_str()));
            src = passes(src, "SG_FPROP");
            if let Some(e) = epi {
                src = src.template(&e.code);
            }
            let source = src.template(SMALLGROUP).build();
            let launch = Launch::new(source, entry, Grid::Exact(blocks as u32, 1, 1), nt as u32, sig.into_args()).with_shared(cfg.smem as u32);
            Some((NodeKernels::one(launch), needs))
        }
        Pass::Wgrad => {
            // Reduction slices: one wave of blocks (those that fit an SM at once, the kernel's
            // registers capped for that many, with a margin over the estimate), so that no block
            // waits for a second.
            let sms = target.sm_count.max(1) as i64;
            let per_sm = (65536 / (warps(nt) * (regs_of(g, cfg.px, cfg.kv) + 16))).min(227 * 1024 / cfg.smem.max(1)).min(2048 / nt).clamp(1, 8);
            let ns = (sms * per_sm / ngs).clamp(1, tiles);
            let blocks = ngs * ns;
            let scratch = ns * k * g.cg * taps;
            if blocks >= 1 << 31 || scratch >= 1 << 31 {
                return None;
            }
            let (xi, yi) = (ceil_div(cfg.x_items(g), nt), ceil_div(cfg.dy_items(g), nt));
            let prefetch = xv > 1 && yv > 1 && xi + yi <= MAX_PREFETCH;
            let entry = entry_name(ni, &format!("sg_conv_wgrad{tag}"));
            let mut sig = Signature::new();
            sig.param("const ET* __restrict__ dy", Arg::Ptr(g.y)).param("const ET* __restrict__ x", Arg::Ptr(g.x)).param("float* __restrict__ part", Arg::Scratch(0));
            let src = config(Source::new().entry(&entry, &sig))
                .define("CHY", cfg.chy)
                .define("KQ", cfg.kq)
                .define("RPY", cfg.rpy)
                .define("DPITCH", cfg.dpitch)
                .define("NS", ns)
                .define("MIN_BLOCKS", per_sm)
                .define("XI", xi)
                .define("YI", yi)
                .flag("PREFETCH", prefetch)
                .flag("Y_PUT4", cfg.chy == 4 && cfg.kv % 4 == 0 && yv % 4 == 0);
            let source = passes(src, "SG_WGRAD").template(SMALLGROUP).build();
            let first = Launch::new(source, entry, Grid::Exact(blocks as u32, 1, 1), nt as u32, sig.into_args()).with_shared(cfg.smem as u32);
            // The sum: a thread per (k, c, tap).
            let sum_entry = entry_name(ni, &format!("sg_conv_wgrad_sum{tag}"));
            let mut sig2 = Signature::new();
            sig2.param("const float* __restrict__ part", Arg::Scratch(0)).param("OT* __restrict__ dw", Arg::Ptr(g.w));
            let src = config(Source::new().entry(&sum_entry, &sig2)).define("NS", ns);
            let source = passes(src, "SG_WGRAD_SUM").template(SMALLGROUP).build();
            let second = Launch::elementwise(source, &sum_entry, (k * g.cg * taps) as u64, sig2.into_args());
            Some((NodeKernels { launches: vec![first, second], scratch: vec![(scratch * 4) as usize] }, needs))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::ops::conv::ConvAttrs;

    fn nhwc(name: &str, dims: &[i64], dt: DataType) -> TensorDesc {
        TensorDesc::new(name, dims, dt).with_layout(&[0, 2, 3, 1])
    }

    fn resnext(dt: DataType) -> Graph {
        let mut g = Graph::new("resnext").io_data_type(dt);
        let x = g.tensor(nhwc("x", &[32, 128, 56, 56], dt));
        let w = g.tensor(nhwc("w", &[128, 4, 3, 3], dt));
        let y = g.conv_fprop(x, w, ConvAttrs::new(2).with_padding(&[1, 1]));
        g.set_output(y);
        g.validate().unwrap();
        g
    }

    /// ResNeXt's 56x56 layer: rows of 56 outputs as 8 threads of 7, 8 rows a block, groups in
    /// pairs at least (8 image channels: a 16-byte vector a pixel), the 9-column halo of each
    /// 7-column run read for 3 taps; the x tile's rows padded to 64 slots (56 mod 8 = 0 as a
    /// row's lanes need).
    #[test]
    fn resnext_tiles_rows_of_seven() {
        let g = resnext(DataType::F16);
        let geo = geometry(&g, 0, None).unwrap();
        let cfg = choose(&geo, 8, 8).unwrap();
        assert_eq!((cfg.px, cfg.nct, cfg.nr, cfg.kv, cfg.ks, cfg.fw), (7, 8, 8, 4, 1, 9));
        assert_eq!((cfg.ht, cfg.wt, cfg.rp, cfg.chx, cfg.cq), (10, 58, 64, 4, 1));
        assert!(cfg.gs % 2 == 0 && 32 % cfg.gs == 0, "{cfg:?}");
        assert!(cfg.smem <= MAX_SMEM && cfg.threads() <= TARGET_THREADS, "{cfg:?}");
        // The weight gradient: a thread per filter row (3), the same runs.
        let mut w = Graph::new("resnext_wgrad").io_data_type(DataType::F16);
        let dy = w.tensor(nhwc("dy", &[32, 128, 56, 56], DataType::F16));
        let x = w.tensor(nhwc("x", &[32, 128, 56, 56], DataType::F16));
        let dw = w.conv_wgrad(dy, x, &[128, 4, 3, 3], ConvAttrs::new(2).with_padding(&[1, 1]));
        w.set_output(dw);
        w.validate().unwrap();
        let geo = geometry(&w, 0, None).unwrap();
        let cfg = choose(&geo, 8, 8).unwrap();
        assert_eq!((cfg.px, cfg.nct, cfg.fr, cfg.kv), (7, 8, 3, 4));
        assert!(cfg.smem <= MAX_SMEM, "{cfg:?}");
    }

    #[test]
    fn large_groups_and_strided_data_gradients_are_declined() {
        let f = DataType::F16;
        let mut g = Graph::new("g32").io_data_type(f);
        let x = g.tensor(nhwc("x", &[2, 1024, 7, 7], f));
        let w = g.tensor(nhwc("w", &[1024, 32, 3, 3], f));
        let y = g.conv_fprop(x, w, ConvAttrs::new(2).with_padding(&[1, 1]));
        g.set_output(y);
        g.validate().unwrap();
        assert!(decline(&g, 0).unwrap().contains(&format!("{MAX_CG} image channels")));
        // A data gradient of unit stride: the forward convolution of dy by the filter with its
        // groups' channels and filters exchanged and mirrored, padded (3 - 1) * 1 - 1 = 1.
        let dgrad = |stride: i64| {
            let mut g = Graph::new("dgrad").io_data_type(f);
            let dy = g.tensor(nhwc("dy", &[2, 128, 9, 9], f));
            let w = g.tensor(nhwc("w", &[128, 4, 3, 3], f));
            let dx = g.conv_dgrad(dy, w, &[2, 128, 9 * stride - stride + 1, 9 * stride - stride + 1], ConvAttrs::new(2).with_padding(&[1, 1]).with_stride(&[stride, stride]));
            g.set_output(dx);
            g.validate().unwrap();
            g
        };
        let g = dgrad(1);
        assert!(is_small_group(&g, 0));
        let geo = geometry(&g, 0, None).unwrap();
        assert_eq!((geo.cg, geo.kg, geo.pre, geo.flip), (4, 4, [0, 1, 1], true));
        assert_eq!((geo.ws[0], geo.ws[1], geo.wsg), (1, 36, 4 * 36));
        assert!(unit(&g, 0, &Target::sm90a()).unwrap().kernels.launches[0].entry.contains("sg_conv_dgrad"));
        assert!(decline(&dgrad(2), 0).unwrap().contains("unit stride"));
    }

    /// The forward convolution with bias + relu plans as one unit on these kernels, the
    /// epilogue's bias one value per output channel (col of the `[N, pixels, K]` view).
    #[test]
    fn bias_relu_fuses() {
        let f = DataType::F16;
        let mut g = Graph::new("sg_bias_relu").io_data_type(f);
        let x = g.tensor(nhwc("x", &[2, 64, 9, 11], f));
        let w = g.tensor(nhwc("w", &[64, 8, 3, 3], f));
        let y = g.conv_fprop(x, w, ConvAttrs::new(2).with_padding(&[1, 1]));
        let b = g.tensor(TensorDesc::new("b", &[1, 64, 1, 1], f));
        let yb = g.bias(y, b);
        let z = g.relu(yb);
        g.set_output(z);
        g.validate().unwrap();
        let u = group_unit(&g, &[0, 1, 2], &Target::sm90a()).unwrap();
        assert_eq!(u.writes, vec![z]);
        let l = &u.kernels.launches[0];
        assert!(l.entry.contains("sg_conv_fprop") && l.source.contains("#define SG_EPI 1"));
        assert!(l.args.contains(&Arg::Ptr(b)));
    }
}
