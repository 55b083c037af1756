//! Staged convolutions: those the GEMM kernels run fast only after a change of layout, made by a
//! copy kernel before (or after) the GEMM in the node's scratch (`stage.cuh`).
//!
//! - Image channels that do not fill 16-byte vectors (the 3-channel stem of a vision network, a
//!   1-channel signal): the implicit GEMM would gather them one element at a time. The image is
//!   copied channels-last with its channels zero-padded to a multiple of the vector, the filter
//!   likewise, so the GEMM loads 16 bytes at a time (the zero channels add nothing). Forward: x
//!   and w padded before; weight gradient: x padded before, dw computed with padded channels into
//!   scratch and copied out after.
//! - Data gradients with few image channels (C < 16): the implicit GEMM's n would be C (most of
//!   a tile wasted), and a strided filter's skipped taps computed as zeros. Instead a dense GEMM
//!   makes `dcol = dy (N*P x K) * w (K x T*C)` in f32 (each output pixel's contribution to every
//!   tap and channel), and a gather kernel sums, for each dx element, the taps that reach it
//!   (col2im): no wasted taps, and the GEMM's n is T*C.
//!
//! The GEMM is planned on a view graph in which the staged tensors have their staged layout;
//! [`Stage::finish`] then points its kernels at the scratch buffers and puts the copies around
//! them.

use super::implicit;
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

/// `v` (one value per spatial dim) in the last of three slots; `fill` in the others.
fn slots(v: &[i64], fill: i64) -> [i64; 3] {
    let mut out = [fill; 3];
    out[3 - v.len()..].copy_from_slice(v);
    out
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

/// A raw-element copy (`STAGE_COPY`) over logical dims `sizes` (five, row-major), zero past `lim`
/// along the last.
struct Copy {
    sizes: [i64; 5],
    lim: i64,
    src: (Arg, [i64; 5]),
    dst: (Arg, [i64; 5]),
}

fn copy_launch(ni: usize, what: &str, dt: DataType, cp: Copy) -> Launch {
    let entry = entry_name(ni, what);
    let elem = match dt.size() {
        1 => "unsigned char",
        2 => "unsigned short",
        4 => "unsigned int",
        _ => "unsigned long long",
    };
    let mut sig = Signature::new();
    sig.param("const STAGE_T* __restrict__ src", cp.src.0).param("STAGE_T* __restrict__ dst", cp.dst.0);
    let mut src = Source::new().entry(&entry, &sig).flag("STAGE_COPY", true).define("STAGE_T", elem).define("LIM", format!("{}LL", cp.lim));
    for a in 0..5 {
        src = src
            .define(&format!("L{a}"), format!("{}LL", cp.sizes[a]))
            .define(&format!("SS{a}"), format!("{}LL", cp.src.1[a]))
            .define(&format!("DS{a}"), format!("{}LL", cp.dst.1[a]));
    }
    let total: i64 = cp.sizes.iter().product();
    Launch::elementwise(src.template(TEMPLATE).build(), &entry, total as u64, sig.into_args())
}

/// Logical dims `[a, spatial x 3, c]` (spatial padded to three in front) of a `[a, c, spatial...]`
/// tensor, with its strides in that order.
fn spatial_last(dims: &[i64], strides: &[i64]) -> ([i64; 5], [i64; 5]) {
    let (sd, ss) = (slots(&dims[2..], 1), slots(&strides[2..], 0));
    ([dims[0], sd[0], sd[1], sd[2], dims[1]], [strides[0], ss[0], ss[1], ss[2], strides[1]])
}

/// Forward or weight gradient with the image's channels padded to a vector.
fn padded_view(graph: &Graph, ni: usize, dt: DataType, (x, w, _): (TensorId, TensorId, TensorId)) -> Option<View> {
    let node = &graph.nodes[ni];
    let (xd, wd) = (graph.desc(x), graph.desc(w));
    let c = xd.dims[1];
    let cp = round_up(c, vector(dt));
    let pad = |d: &TensorDesc| {
        let mut dims = d.dims.clone();
        dims[1] = cp;
        let strides = channels_last(&dims);
        TensorDesc { dims, strides, ..d.clone() }
    };
    let (xp, wp) = (pad(xd), pad(wd));
    let wt = graph.resolved_data_type(w)?;
    let bytes = |d: &TensorDesc, t: DataType| d.dims.iter().product::<i64>() as usize * t.size();
    let mut staged = graph.clone();
    staged.tensors[x.0] = xp.clone();
    staged.tensors[w.0] = wp.clone();
    let inner = implicit::view(&staged, ni)?;
    // The image copied with its channels padded (scratch 0).
    let (sizes, src) = spatial_last(&xd.dims, &xd.strides);
    let (mut psizes, dst) = spatial_last(&xp.dims, &xp.strides);
    psizes[4] = cp;
    let x_copy = copy_launch(ni, "stage_x", dt, Copy { sizes: psizes, lim: sizes[4], src: (Arg::Ptr(x), src), dst: (Arg::Scratch(0), dst) });
    let (wsizes, wsrc) = spatial_last(&wd.dims, &wd.strides);
    let (mut wpsizes, wdst) = spatial_last(&wp.dims, &wp.strides);
    wpsizes[4] = cp;
    let stage = if matches!(node.op, Op::ConvFprop(_)) {
        // The filter padded likewise (scratch 1).
        let w_copy = copy_launch(ni, "stage_w", wt, Copy { sizes: wpsizes, lim: c, src: (Arg::Ptr(w), wsrc), dst: (Arg::Scratch(1), wdst) });
        Stage { scratch: vec![(x, bytes(&xp, dt)), (w, bytes(&wp, wt))], pre: vec![x_copy, w_copy], post: Vec::new(), replaces: None }
    } else {
        // dw computed padded (scratch 1), its channels copied out.
        let out = copy_launch(ni, "unstage_dw", wt, Copy { sizes: wsizes, lim: c, src: (Arg::Scratch(1), wdst), dst: (Arg::Ptr(w), wsrc) });
        Stage { scratch: vec![(x, bytes(&xp, dt)), (w, bytes(&wp, wt))], pre: vec![x_copy], post: vec![out], replaces: None }
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
    let tcp = round_up(tc, vector(DataType::F32));
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
    let w_copy =
        copy_launch(ni, "stage_w", dt, Copy { sizes: [1, 1, 1, k, tcp], lim: tc, src: (Arg::Ptr(w), [0, 0, 0, wd.strides[0], run]), dst: (Arg::Scratch(0), [0, 0, 0, tcp, 1]) });
    let entry = entry_name(ni, "col2im");
    let mut sig = Signature::new();
    sig.param("const float* __restrict__ dcol", Arg::Scratch(1)).param("void* __restrict__ dx", Arg::Ptr(x));
    let (id, od, t) = (slots(&xd.dims[2..], 1), slots(&yd.dims[2..], 1), slots(&wd.dims[2..], 1));
    let (s, d, pre, xs) = (slots(&attrs.stride, 1), slots(&attrs.dilation, 1), slots(&attrs.pre_padding, 0), slots(&xd.strides[2..], 0));
    let (col_t, col_c) = if tap_major { (c, 1) } else { (1, taps) };
    let mut src = Source::new().entry(&entry, &sig).flag("STAGE_COL2IM", true).flag("FLIP", flip).define("ST", crate::engine::cuda::kernel::ctype::st(graph, x));
    for (name, v) in [("N_", n), ("C_", c), ("COL_T", col_t), ("COL_C", col_c), ("TCP", tcp), ("XSN", xd.strides[0]), ("XSC", xd.strides[1])] {
        src = src.define(name, format!("{v}LL"));
    }
    for a in 0..3 {
        for (name, v) in [("ID", id[a]), ("OD", od[a]), ("T", t[a]), ("S", s[a]), ("D", d[a]), ("PRE", pre[a]), ("XS", xs[a])] {
            src = src.define(&format!("{name}{a}"), format!("{v}LL"));
        }
    }
    let col2im = Launch::elementwise(src.template(TEMPLATE).build(), &entry, xd.dims.iter().product::<i64>() as u64, sig.into_args());
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
