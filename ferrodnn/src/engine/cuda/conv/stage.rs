//! Staged convolutions: those the GEMM kernels run fast only after a change of layout, made by a
//! copy kernel before (or after) the GEMM in the node's scratch (`stage.cuh`).
//!
//! - Image channels that do not fill 16-byte vectors (the 3-channel stem of a vision network, a
//!   1-channel signal): the implicit GEMM would gather them one element at a time. The image is
//!   copied channels-last with its channels zero-padded to a multiple of the vector, the filter
//!   likewise, so the GEMM loads 16 bytes at a time (the zero channels add nothing). Where the
//!   last spatial dim is strided and that shortens the reduction, its pixels are folded into the
//!   channels too ([`fold`]: the 7x7/2 stem's 7 taps of 8 padded channels become 4 taps of 2
//!   pixels x 4 channels, a unit-stride convolution). Forward: x and w staged before; weight
//!   gradient: x staged before, dw computed in the staged filter's layout into scratch and
//!   written back after.
//! - Data gradients with few image channels (C < 16): the implicit GEMM's n would be C (most of
//!   a tile wasted), and a strided filter's skipped taps computed as zeros. Instead a dense GEMM
//!   makes `dcol = dy (N*P x K) * w (K x T*C)` in f32 (each output pixel's contribution to every
//!   tap and channel), and a gather kernel sums, for each dx element, the taps that reach it
//!   (col2im): no wasted taps, and the GEMM's n is T*C.
//!
//! The GEMM is planned on a view graph in which the staged tensors have their staged layout;
//! [`Stage::finish`] then points its kernels at the scratch buffers and puts the copies around
//! them.

use super::implicit::{self, slots};
use super::{linear, View};
use crate::engine::cuda::kernel::{entry_name, Arg, Launch, NodeKernels, Signature, Source, Unit};
use crate::graph::ops::conv::ConvMode;
use crate::graph::ops::matmul::MatmulAttrs;
use crate::graph::ops::Op;
use crate::graph::{Graph, Port, TensorDesc, TensorId};
use crate::DataType;

const TEMPLATE: &str = include_str!("stage.cuh");

/// Data gradients with fewer image channels than this run as dcol + col2im.
const COL2IM_BELOW: i64 = 16;

/// The most scratch a dcol may take (f32, N*P x T*C).
const COL2IM_MAX_BYTES: i64 = 1 << 30;

/// The copies around a convolution's GEMM and the scratch buffers they fill.
#[derive(Clone, Debug)]
pub struct Stage {
    /// Tensors of the view graph that live in the node's scratch (buffer `i` for entry `i`), and
    /// their sizes in bytes.
    scratch: Vec<(TensorId, usize)>,
    pre: Vec<Launch>,
    post: Vec<Launch>,
    /// A tensor of the view the GEMM writes in place of the convolution's output (dcol), and that
    /// output.
    replaces: Option<(TensorId, TensorId)>,
}

impl Stage {
    /// A GEMM whose output `out` (`bytes` of it) is written to scratch, then `post` (which reads
    /// it as `Arg::Scratch(0)`).
    pub(super) fn output_in_scratch(out: TensorId, bytes: usize, post: Vec<Launch>) -> Stage {
        Stage { scratch: vec![(out, bytes)], pre: Vec::new(), post, replaces: None }
    }

    /// Whether copies run after the GEMM (the GEMM's output is not the convolution's): the
    /// convolution's pointwise epilogue cannot be fused then.
    pub fn has_post(&self) -> bool {
        !self.post.is_empty()
    }

    /// The tensors the copies replace with a staged layout (the GEMM's operands must not be
    /// produced by nodes it absorbs: a prologue would read them unstaged).
    pub fn staged(&self) -> impl Iterator<Item = TensorId> + '_ {
        self.scratch.iter().map(|s| s.0)
    }

    /// The unit of the GEMM planned on the view, with its kernels pointed at the staged buffers
    /// and the copies around them; None when a kernel reads a staged tensor's dims from the
    /// plan (they would be the unstaged ones).
    pub fn finish(&self, mut unit: Unit) -> Option<Unit> {
        self.wrap(&mut unit.kernels)?;
        if let Some(alt) = unit.unaligned.take() {
            let mut alt = *alt;
            alt.tensors.retain(|t| self.slot(*t).is_none());
            if !alt.tensors.is_empty() {
                self.wrap(&mut alt.kernels)?;
                unit.unaligned = Some(Box::new(alt));
            }
        }
        if let Some((from, to)) = self.replaces {
            for w in &mut unit.writes {
                if *w == from {
                    *w = to;
                }
            }
        }
        Some(unit)
    }

    fn slot(&self, t: TensorId) -> Option<usize> {
        self.scratch.iter().position(|s| s.0 == t)
    }

    /// The GEMM's launches with staged tensors read from (and written to) scratch, after the
    /// staging buffers (the GEMM's own scratch moves up), between the copies.
    fn wrap(&self, k: &mut NodeKernels) -> Option<()> {
        let base = self.scratch.len();
        for l in &mut k.launches {
            for a in &mut l.args {
                let new = match a {
                    Arg::Scratch(i) | Arg::ScratchTensorMap(i, _) => {
                        *i += base;
                        None
                    }
                    Arg::Ptr(t) => self.slot(*t).map(Arg::Scratch),
                    Arg::TensorMap(d) => self.slot(d.tensor).map(|i| Arg::ScratchTensorMap(i, d.clone())),
                    Arg::Ref(t) if self.slot(*t).is_some() => return None,
                    _ => None,
                };
                if let Some(new) = new {
                    *a = new;
                }
            }
        }
        let mut scratch: Vec<usize> = self.scratch.iter().map(|s| s.1).collect();
        scratch.append(&mut k.scratch);
        k.scratch = scratch;
        let mut launches = self.pre.clone();
        launches.append(&mut k.launches);
        launches.extend(self.post.iter().cloned());
        k.launches = launches;
        Some(())
    }
}

/// The elements of a 16-byte vector of `dt`.
fn vector(dt: DataType) -> i64 {
    (16 / dt.size().max(1)) as i64
}

/// `v` rounded up to a multiple of `m` (both positive).
fn round_up(v: i64, m: i64) -> i64 {
    (v + m - 1) / m * m
}

/// The packed channels-last strides of dims `[a, c, spatial...]`.
fn channels_last(dims: &[i64]) -> Vec<i64> {
    let r = dims.len();
    let mut s = vec![0; r];
    s[1] = 1;
    let mut at = dims[1];
    for d in (2..r).rev() {
        s[d] = at;
        at *= dims[d];
    }
    s[0] = at;
    s
}

/// The convolution node `ni` staged, when it is one of the cases in the module doc and its
/// tensors allow.
pub fn view(graph: &Graph, ni: usize) -> Option<View> {
    let node = graph.nodes.get(ni)?;
    let (x, w, y) = match &node.op {
        Op::ConvFprop(_) => (node.input("x")?, node.input("w")?, node.output("y")?),
        Op::ConvDgrad(_) => (node.output("dx")?, node.input("w")?, node.input("dy")?),
        Op::ConvWgrad(_) => (node.input("x")?, node.output("dw")?, node.input("dy")?),
        _ => return None,
    };
    let (xd, wd, yd) = (graph.desc(x), graph.desc(w), graph.desc(y));
    let rank = xd.dims.len();
    let well_formed = |d: &TensorDesc| d.dims.len() == rank && d.strides.len() == rank && d.strides.iter().all(|&s| s >= 0) && d.dims.iter().all(|&e| e > 0);
    if !(3..=5).contains(&rank) || !well_formed(xd) || !well_formed(wd) || !well_formed(yd) {
        return None;
    }
    // The GEMM's inputs of one type (the output may differ).
    let inputs = match &node.op {
        Op::ConvFprop(_) => [x, w],
        Op::ConvDgrad(_) => [y, w],
        _ => [y, x],
    };
    let dt = graph.resolved_data_type(inputs[0])?;
    if graph.resolved_data_type(inputs[1]) != Some(dt) || !matches!(dt, DataType::F16 | DataType::Bf16 | DataType::F32) {
        return None;
    }
    // One group.
    let c = xd.dims[1];
    if wd.dims[1] != c {
        return None;
    }
    match &node.op {
        Op::ConvDgrad(a) if c < COL2IM_BELOW => col2im_view(graph, ni, a.mode == ConvMode::Convolution, a, (x, w, y)),
        Op::ConvFprop(_) | Op::ConvWgrad(_) if c % vector(dt) != 0 => padded_view(graph, ni, dt, (x, w, y)),
        _ => None,
    }
}

/// The unsigned C type of an element of `bytes` bytes, and of a vector of `bytes`.
fn raw_type(bytes: usize) -> &'static str {
    match bytes {
        1 => "unsigned char",
        2 => "unsigned short",
        4 => "unsigned int",
        8 => "uint2",
        16 => "uint4",
        _ => "unsigned long long",
    }
}

/// `int` when every index below `extent` fits in 32 bits, else `long long`.
fn index_type(extent: i64) -> &'static str {
    if extent < i32::MAX as i64 {
        "int"
    } else {
        "long long"
    }
}

/// A copy of raw elements (`STAGE_COPY`) over logical dims `sizes` (five, row-major), zero from
/// `lim[0]` on along dim 3 and from `lim[1]` on along dim 4; the destination's elements from
/// `dst_at` elements after its pointer.
pub(super) struct Copy {
    pub sizes: [i64; 5],
    pub lim: [i64; 2],
    pub src: (Arg, [i64; 5]),
    pub dst: (Arg, [i64; 5]),
    pub dst_at: i64,
}

pub(super) fn copy_launch(ni: usize, what: &str, dt: DataType, cp: Copy) -> Launch {
    let entry = entry_name(ni, what);
    let es = dt.size();
    // Whole 16-byte vectors (or fewer elements) along a contiguous destination dim.
    let mut v = 1i64;
    while v * 2 * es as i64 <= 16 && cp.dst.1[4] == 1 && cp.sizes[4] % (v * 2) == 0 && cp.dst.1[3] % (v * 2) == 0 && cp.dst_at % (v * 2) == 0 {
        v *= 2;
    }
    let extent = [(cp.src.1, 0), (cp.dst.1, cp.dst_at)]
        .iter()
        .map(|(st, at)| at + st.iter().zip(&cp.sizes).map(|(&s, &n)| s * (n - 1)).sum::<i64>() + 1)
        .max()
        .unwrap_or(1)
        .max(cp.sizes.iter().product());
    let mut sig = Signature::new();
    sig.param("const STAGE_T* __restrict__ src", cp.src.0).param("STAGE_T* __restrict__ dst", cp.dst.0);
    let mut src = Source::new()
        .entry(&entry, &sig)
        .flag("STAGE_COPY", true)
        .define("STAGE_T", raw_type(es))
        .define("VT", raw_type(es * v as usize))
        .define("V", v)
        .define("IT", index_type(extent))
        .define("LIM3", cp.lim[0])
        .define("LIM4", cp.lim[1])
        .define("DOFF", cp.dst_at);
    for a in 0..5 {
        src = src.define(&format!("L{a}"), cp.sizes[a]).define(&format!("SS{a}"), cp.src.1[a]).define(&format!("DS{a}"), cp.dst.1[a]);
    }
    let vectors: i64 = cp.sizes.iter().product::<i64>() / v;
    Launch::elementwise(src.template(TEMPLATE).build(), &entry, vectors as u64, sig.into_args())
}

/// A filter `[K, C, R0, R1, S]` staged as `[K, F * C4, R0, R1, TF]` with its last spatial dim
/// folded by `f` (`STAGE_FILTER`, see stage.cuh), or (`unfold`) written back from that form.
struct Filter {
    k: i64,
    c: i64,
    c4: i64,
    f: i64,
    pre: i64,
    pref: i64,
    taps: [i64; 3],
    tf: i64,
    strides: [i64; 5],
    flip: bool,
}

fn filter_launch(ni: usize, what: &str, dt: DataType, fl: &Filter, unfold: bool, src: Arg, dst: Arg) -> Launch {
    let entry = entry_name(ni, what);
    let mut sig = Signature::new();
    sig.param("const STAGE_T* __restrict__ src", src).param("STAGE_T* __restrict__ dst", dst);
    let total = fl.k * fl.taps[0] * fl.taps[1] * fl.tf * fl.f * fl.c4;
    let extent = fl.strides.iter().zip([fl.k, fl.c, fl.taps[0], fl.taps[1], fl.taps[2]]).map(|(&s, n)| s * (n - 1)).sum::<i64>() + 1;
    let mut text = Source::new()
        .entry(&entry, &sig)
        .flag("STAGE_FILTER", true)
        .flag("UNFOLD", unfold)
        .flag("FLIP", fl.flip)
        .define("STAGE_T", raw_type(dt.size()))
        .define("IT", index_type(extent.max(total)));
    for (name, v) in
        [("K_", fl.k), ("C_", fl.c), ("C4", fl.c4), ("F", fl.f), ("PREF", fl.pref), ("PRE", fl.pre), ("R0", fl.taps[0]), ("R1", fl.taps[1]), ("S_", fl.taps[2]), ("TF", fl.tf)]
    {
        text = text.define(name, v);
    }
    for (name, v) in ["WSK", "WSC", "WS0", "WS1", "WSS"].iter().zip(fl.strides) {
        text = text.define(name, v);
    }
    Launch::elementwise(text.template(TEMPLATE).build(), &entry, total as u64, sig.into_args())
}

/// Logical dims `[a, spatial x 3, c]` (spatial padded to three in front) of a `[a, c, spatial...]`
/// tensor, with its strides in that order.
fn spatial_last(dims: &[i64], strides: &[i64]) -> ([i64; 5], [i64; 5]) {
    let (sd, ss) = (slots(&dims[2..], 1), slots(&strides[2..], 0));
    ([dims[0], sd[0], sd[1], sd[2], dims[1]], [strides[0], ss[0], ss[1], ss[2], strides[1]])
}

/// The staged image's geometry along its last spatial dim: `f` pixels folded into the channels
/// (each padded to `c4`), `tf` taps from `pref` before, `post` after; `f` 1 leaves the dim as it
/// is (only the channels padded).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Fold {
    f: i64,
    c4: i64,
    tf: i64,
    pref: i64,
    post: i64,
    width: i64,
}

/// How to stage an image of `c` channels (vectors of `vec`) whose last spatial dim has extent
/// `w`, `s` filter taps, padding `pre` and `post`, stride `stride`, dilation `dil`, output extent
/// `out`: folded by the stride when that shortens the reduction (the 3-channel stem: 7 taps of
/// 8 padded channels become 4 taps of 2 pixels x 4 channels), else channels padded.
fn fold(c: i64, vec: i64, (w, s, pre, post, stride, dil, out): (i64, i64, i64, i64, i64, i64, i64)) -> Fold {
    let cp = round_up(c, vec);
    let plain = Fold { f: 1, c4: cp, tf: s, pref: pre, post, width: w };
    if stride < 2 || dil != 1 {
        return plain;
    }
    let f = stride;
    let c4 = (c..).find(|&c4| (f * c4) % vec == 0).unwrap_or(cp);
    let pref = -(-pre).div_euclid(f);
    let tf = (s - 1 - pre).div_euclid(f) + pref + 1;
    let width = (w + f - 1) / f;
    let post = out - 1 - width - pref + tf;
    if post < 0 || tf * f * c4 >= s * cp {
        return plain;
    }
    Fold { f, c4, tf, pref, post, width }
}

/// Forward or weight gradient with the image's channels padded to a vector (and its last
/// spatial dim folded into the channels where that helps, see [`fold`]).
fn padded_view(graph: &Graph, ni: usize, dt: DataType, (x, w, y): (TensorId, TensorId, TensorId)) -> Option<View> {
    let node = &graph.nodes[ni];
    let attrs = match &node.op {
        Op::ConvFprop(a) | Op::ConvWgrad(a) => a,
        _ => return None,
    };
    let (xd, wd, yd) = (graph.desc(x), graph.desc(w), graph.desc(y));
    let r = xd.dims.len();
    let (c, k) = (xd.dims[1], wd.dims[0]);
    let last = r - 3;
    if attrs.stride.len() != r - 2 || attrs.forward_dims(&xd.dims, &wd.dims, "x", "w").ok()? != yd.dims {
        return None;
    }
    let fd = fold(c, vector(dt), (xd.dims[r - 1], wd.dims[r - 1], attrs.pre_padding[last], attrs.post_padding[last], attrs.stride[last], attrs.dilation[last], yd.dims[r - 1]));
    if fd.post < 0 {
        return None;
    }
    let wt = graph.resolved_data_type(w)?;
    // The staged image [N, F * C4, spatial..., W'] and filter [K, F * C4, taps..., TF], both
    // channels-last and packed; the convolution over them a cross-correlation with unit stride
    // along the folded dim.
    let mut xdims = xd.dims.clone();
    xdims[1] = fd.f * fd.c4;
    xdims[r - 1] = fd.width;
    let mut wdims = wd.dims.clone();
    wdims[1] = fd.f * fd.c4;
    wdims[r - 1] = fd.tf;
    let xp = TensorDesc { strides: channels_last(&xdims), dims: xdims, ..xd.clone() };
    let wp = TensorDesc { strides: channels_last(&wdims), dims: wdims, ..wd.clone() };
    let mut staged_attrs = attrs.clone();
    staged_attrs.mode = ConvMode::CrossCorrelation;
    if fd.f > 1 {
        staged_attrs.stride[last] = 1;
    }
    staged_attrs.pre_padding[last] = fd.pref;
    staged_attrs.post_padding[last] = fd.post;
    let bytes = |d: &TensorDesc, t: DataType| d.dims.iter().product::<i64>() as usize * t.size();
    let mut staged = graph.clone();
    staged.tensors[x.0] = xp.clone();
    staged.tensors[w.0] = wp.clone();
    staged.nodes[ni].op = match &node.op {
        Op::ConvFprop(_) => Op::ConvFprop(staged_attrs),
        _ => Op::ConvWgrad(staged_attrs),
    };
    let inner = implicit::view(&staged, ni)?;
    // The image copied (scratch 0) as [N, spatial..., W' * F, C4]: pixels past W and channels
    // past C zero.
    let (sizes, src) = spatial_last(&xd.dims, &xd.strides);
    let psizes = [sizes[0], sizes[1], sizes[2], fd.width * fd.f, fd.c4];
    let dst = [psizes[1] * psizes[2] * psizes[3] * psizes[4], psizes[2] * psizes[3] * psizes[4], psizes[3] * psizes[4], psizes[4], 1];
    let x_copy = copy_launch(ni, "stage_x", dt, Copy { sizes: psizes, lim: [sizes[3], sizes[4]], src: (Arg::Ptr(x), src), dst: (Arg::Scratch(0), dst), dst_at: 0 });
    let t3 = slots(&wd.dims[2..], 1);
    let ws = slots(&wd.strides[2..], 0);
    let filter = Filter {
        k,
        c,
        c4: fd.c4,
        f: fd.f,
        pre: attrs.pre_padding[last],
        pref: fd.pref,
        taps: t3,
        tf: fd.tf,
        strides: [wd.strides[0], wd.strides[1], ws[0], ws[1], ws[2]],
        flip: attrs.mode == ConvMode::Convolution,
    };
    let scratch = vec![(x, bytes(&xp, dt)), (w, bytes(&wp, wt))];
    let stage = if matches!(node.op, Op::ConvFprop(_)) {
        // The filter staged likewise (scratch 1).
        let w_copy = filter_launch(ni, "stage_w", wt, &filter, false, Arg::Ptr(w), Arg::Scratch(1));
        Stage { scratch, pre: vec![x_copy, w_copy], post: Vec::new(), replaces: None }
    } else {
        // dw computed staged (scratch 1), then written back.
        let out = filter_launch(ni, "unstage_dw", wt, &filter, true, Arg::Scratch(1), Arg::Ptr(w));
        Stage { scratch, pre: vec![x_copy], post: vec![out], replaces: None }
    };
    Some(View { graph: inner.graph, gathers: inner.gathers, stage: Some(Box::new(stage)) })
}

/// A data gradient with few image channels as dcol = dy * w (a dense GEMM into f32 scratch) and
/// col2im.
fn col2im_view(graph: &Graph, ni: usize, flip: bool, attrs: &crate::graph::ops::conv::ConvAttrs, (x, w, y): (TensorId, TensorId, TensorId)) -> Option<View> {
    let (xd, wd, yd) = (graph.desc(x), graph.desc(w), graph.desc(y));
    let dt = graph.resolved_data_type(w)?;
    let rank = xd.dims.len();
    let (n, c, k) = (xd.dims[0], xd.dims[1], wd.dims[0]);
    if attrs.stride.len() != rank - 2 || attrs.forward_dims(&xd.dims, &wd.dims, "x", "w").ok()? != yd.dims || yd.dims[1] != k {
        return None;
    }
    // The filter's taps and channels as one run (either order): w as K x T*C.
    let taps: i64 = wd.dims[2..].iter().product();
    let spatial: Vec<(i64, i64)> = wd.dims[2..].iter().copied().zip(wd.strides[2..].iter().copied()).collect();
    let ch = (c, wd.strides[1]);
    let tap_first: Vec<(i64, i64)> = spatial.iter().copied().chain(std::iter::once(ch)).collect();
    let ch_first: Vec<(i64, i64)> = std::iter::once(ch).chain(spatial.iter().copied()).collect();
    let (tap_major, (tc, run)) = [(true, &tap_first), (false, &ch_first)].iter().find_map(|&(tm, dims)| linear(dims).map(|l| (tm, l)))?;
    // Rows of w (its type) and of dcol (f32) in whole 16-byte vectors.
    let tcp = round_up(tc, vector(dt).max(vector(DataType::F32)));
    // dy as (N * P) x K: images and pixels in one run.
    let dims: Vec<(i64, i64)> = std::iter::once((yd.dims[0], yd.strides[0])).chain(yd.dims[2..].iter().copied().zip(yd.strides[2..].iter().copied())).collect();
    let (rows, row_stride) = linear(&dims)?;
    if rows.checked_mul(tcp)?.checked_mul(4)? > COL2IM_MAX_BYTES || rows > i32::MAX as i64 {
        return None;
    }
    let mut view = graph.clone();
    view.tensors[y.0] = TensorDesc { dims: vec![rows, k], strides: vec![row_stride, yd.strides[1]], ..yd.clone() };
    view.tensors[w.0] = TensorDesc { dims: vec![k, tcp], strides: vec![tcp, 1], ..wd.clone() };
    let mut dcol = TensorDesc::new("dcol", &[rows, tcp], DataType::F32);
    dcol.is_virtual = true;
    let dcol = view.tensor(dcol);
    let node = &mut view.nodes[ni];
    node.op = Op::Matmul(MatmulAttrs {});
    node.inputs = vec![Port { name: "a".into(), tensor: y }, Port { name: "b".into(), tensor: w }];
    node.outputs = vec![Port { name: "c".into(), tensor: dcol }];
    // The filter as K x TCP (scratch 0), dcol (scratch 1).
    let w_copy = copy_launch(
        ni,
        "stage_w",
        dt,
        Copy { sizes: [1, 1, 1, k, tcp], lim: [k, tc], src: (Arg::Ptr(w), [0, 0, 0, wd.strides[0], run]), dst: (Arg::Scratch(0), [0, 0, 0, tcp, 1]), dst_at: 0 },
    );
    let entry = entry_name(ni, "col2im");
    let mut sig = Signature::new();
    sig.param("const float* __restrict__ dcol", Arg::Scratch(1)).param("void* __restrict__ dx", Arg::Ptr(x));
    let (id, od, t) = (slots(&xd.dims[2..], 1), slots(&yd.dims[2..], 1), slots(&wd.dims[2..], 1));
    let (s, d, pre, xs) = (slots(&attrs.stride, 1), slots(&attrs.dilation, 1), slots(&attrs.pre_padding, 0), slots(&xd.strides[2..], 0));
    let (col_t, col_c) = if tap_major { (c, 1) } else { (1, taps) };
    let total: i64 = xd.dims.iter().product();
    let mut src = Source::new()
        .entry(&entry, &sig)
        .flag("STAGE_COL2IM", true)
        .flag("FLIP", flip)
        .define("ST", crate::engine::cuda::kernel::ctype::st(graph, x))
        .define("IT", index_type(total.max(tcp * taps.max(c))));
    for (name, v) in [("N_", n), ("C_", c), ("COL_T", col_t), ("COL_C", col_c), ("TCP", tcp), ("XSN", xd.strides[0]), ("XSC", xd.strides[1])] {
        src = src.define(name, v);
    }
    for a in 0..3 {
        for (name, v) in [("ID", id[a]), ("OD", od[a]), ("T", t[a]), ("S", s[a]), ("D", d[a]), ("PRE", pre[a]), ("XS", xs[a])] {
            src = src.define(&format!("{name}{a}"), v);
        }
    }
    let col2im = Launch::elementwise(src.template(TEMPLATE).build(), &entry, total as u64, sig.into_args());
    let stage = Stage { scratch: vec![(w, (k * tcp) as usize * dt.size()), (dcol, (rows * tcp * 4) as usize)], pre: vec![w_copy], post: vec![col2im], replaces: Some((dcol, x)) };
    Some(View { graph: view, gathers: None, stage: Some(Box::new(stage)) })
}

#[cfg(test)]
mod tests {
    use crate::engine::cuda::kernel::{Arg, Options, Target};
    use crate::engine::cuda::planner::{plan, Family};
    use crate::graph::ops::conv::ConvAttrs;
    use crate::{DataType, Graph, TensorDesc};

    fn nhwc(name: &str, dims: &[i64]) -> TensorDesc {
        TensorDesc::new(name, dims, DataType::F16).with_layout(&[0, 2, 3, 1])
    }

    fn stem() -> ConvAttrs {
        ConvAttrs::new(2).with_padding(&[3, 3]).with_stride(&[2, 2])
    }

    /// The launches of the one conv-family unit `g` plans as, on both targets.
    fn entries(g: &Graph) -> Vec<Vec<(String, Vec<Arg>)>> {
        [Target::sm90a(), Target::sm80()]
            .iter()
            .map(|t| {
                let p = plan(g, t, &Options::default(), true).unwrap();
                assert_eq!(p.len(), 1);
                assert_eq!(p[0].family, Family::Conv, "{:?}", p[0].declined);
                p[0].unit.kernels.launches.iter().map(|l| (l.entry.clone(), l.args.clone())).collect()
            })
            .collect()
    }

    #[test]
    fn strided_few_channel_images_fold_pixels_into_channels() {
        use super::{fold, Fold};
        // The ResNet stem: 7 taps of 8 padded channels become 4 taps of 2 pixels x 4 channels.
        assert_eq!(fold(3, 8, (224, 7, 3, 3, 2, 1, 112)), Fold { f: 2, c4: 4, tf: 4, pref: 2, post: 1, width: 112 });
        // A ViT patch embedding (16x16, stride 16): one tap of 16 pixels x 3 channels.
        assert_eq!(fold(3, 8, (224, 16, 0, 0, 16, 1, 14)), Fold { f: 16, c4: 3, tf: 1, pref: 0, post: 0, width: 14 });
        // Unit stride, dilation, or no shorter reduction: channels padded only.
        assert_eq!(fold(3, 8, (56, 3, 1, 1, 1, 1, 56)).f, 1);
        assert_eq!(fold(3, 8, (56, 3, 2, 2, 2, 2, 28)).f, 1);
        assert_eq!(fold(3, 4, (224, 7, 3, 3, 2, 1, 112)), Fold { f: 1, c4: 4, tf: 7, pref: 3, post: 3, width: 224 });
    }

    #[test]
    fn a_three_channel_forward_pads_its_image_and_filter_before_the_gemm() {
        let mut g = Graph::new("stem").io_data_type(DataType::F16);
        let x = g.tensor(nhwc("x", &[2, 3, 23, 21]));
        let w = g.tensor(nhwc("w", &[16, 3, 7, 7]));
        let y = g.conv_fprop(x, w, stem());
        let b = g.tensor(TensorDesc::new("b", &[1, 16, 1, 1], DataType::F16));
        let z = g.bias(y, b);
        let r = g.relu(z);
        g.set_output(r);
        g.validate().unwrap();
        for launches in entries(&g) {
            let names: Vec<&str> = launches.iter().map(|l| l.0.as_str()).collect();
            assert!(names[0].ends_with("stage_x") && names[1].ends_with("stage_w") && names[2].contains("gemm"), "{names:?}");
            // The GEMM reads x and w from the staged copies, never the originals.
            for (_, args) in &launches[2..] {
                assert!(!args.iter().any(|a| matches!(a, Arg::Ptr(t) if *t == x || *t == w)));
            }
        }
    }

    #[test]
    fn a_three_channel_weight_gradient_copies_its_padded_result_out() {
        let mut g = Graph::new("stem_wgrad").io_data_type(DataType::F16);
        let dy = g.tensor(nhwc("dy", &[2, 16, 12, 11]));
        let x = g.tensor(nhwc("x", &[2, 3, 23, 21]));
        let dw = g.conv_wgrad(dy, x, &[16, 3, 7, 7], stem());
        g.set_output(dw);
        g.validate().unwrap();
        for launches in entries(&g) {
            let names: Vec<&str> = launches.iter().map(|l| l.0.as_str()).collect();
            assert!(names[0].ends_with("stage_x") && names.last().unwrap().ends_with("unstage_dw"), "{names:?}");
            assert!(launches.last().unwrap().1.contains(&Arg::Ptr(dw)));
        }
    }

    #[test]
    fn a_few_channel_data_gradient_runs_as_dcol_and_col2im() {
        let mut g = Graph::new("stem_dgrad").io_data_type(DataType::F16);
        let dy = g.tensor(nhwc("dy", &[2, 16, 12, 11]));
        let w = g.tensor(nhwc("w", &[16, 3, 7, 7]));
        let dx = g.conv_dgrad(dy, w, &[2, 3, 23, 21], stem());
        g.set_output(dx);
        g.validate().unwrap();
        for launches in entries(&g) {
            let names: Vec<&str> = launches.iter().map(|l| l.0.as_str()).collect();
            assert!(names[0].ends_with("stage_w") && names.last().unwrap().ends_with("col2im"), "{names:?}");
            assert!(launches.last().unwrap().1.contains(&Arg::Ptr(dx)));
            assert!(launches.iter().any(|l| l.0.contains("gemm")));
        }
        let p = plan(&g, &Target::sm90a(), &Options::default(), true).unwrap();
        assert_eq!(p[0].unit.writes, vec![dx]);
    }
}
