//! The convolution engine. A convolution that is a matrix product runs on the GEMM engine's
//! kernels, with the pointwise epilogue it absorbs (bias, activation, residual, cast): a filter
//! of one tap (1x1, 1x1x1) with unit stride, no padding and one group. Its tensors are viewed as
//! matrices, with no copy: an image `[N, C, spatial...]` whose spatial dims are laid out one
//! after another (channels-last, or packed NCHW) as `N` matrices of `S = prod(spatial)` rows and
//! `C` columns, the filter `[K, C, 1...]` as a `C x K` matrix. Then
//!
//! - fprop: `y[n] (S x K) = x[n] (S x C) * w (C x K)`;
//! - dgrad: `dx[n] (S x C) = dy[n] (S x K) * w^T (K x C)`;
//! - wgrad: `dw (K x C) = dy^T (K x N*S) * x (N*S x C)`, where the batch and spatial dims of
//!   both images are laid out one after another too (as `dw^T = x^T dy` when C > K, so that the
//!   longer side fills the tiles' rows).
//!
//! [`as_gemm`] makes a copy of the graph in which the convolution is a matmul over those views
//! (and the tensors of the pointwise nodes after it are viewed the same way), which the GEMM
//! engine plans as it plans a matmul; the kernels address the same buffers by the same tensor
//! ids, so they run on the original graph's variant pack. Every other convolution runs as an
//! implicit GEMM ([`implicit`]): its operands gathered through index maps, no im2col matrix
//! written; a grouped one as a batch of one GEMM per group (and image, where the images are not
//! one run of rows), each reading its group's channels and filters. One-group convolutions whose
//! image channels do not fill 16-byte vectors, and data gradients of few image channels, run
//! with a staged copy around the GEMM ([`stage`]). Depthwise convolutions (one channel a group)
//! run on their own kernels ([`depthwise`]); forward and weight-gradient convolutions of few
//! channels a group (at most 8, 144 MACs an output) on direct SIMT kernels ([`smallgroup`]),
//! the forward one with the epilogue its GEMM view groups with it ([`group_unit`]).

pub mod depthwise;
pub mod implicit;
pub mod phase;
pub mod smallgroup;
pub mod stage;

use super::gemm;
use super::gemm::gather::Gathers;
use super::kernel::{Options, Target, Unit};
use crate::error::Result;
use crate::graph::ops::conv::ConvAttrs;
use crate::graph::ops::matmul::MatmulAttrs;
use crate::graph::ops::Op;
use crate::graph::{Graph, Port, TensorDesc, TensorId};

/// Whether `op` is a convolution this engine may take.
pub fn conv_op(op: &Op) -> bool {
    matches!(op, Op::ConvFprop(_) | Op::ConvDgrad(_) | Op::ConvWgrad(_))
}

/// The unit of convolution node `ni` alone: a depthwise convolution on the depthwise kernels
/// ([`depthwise`]; with a channel multiplier of 2 or more, forward and weight gradient, on the
/// small-group kernels first), a grouped one of few channels a group on the small-group kernels
/// ([`smallgroup`]), else on the GEMM engine when it is a matrix product the GEMM kernels take.
pub fn unit(graph: &Graph, ni: usize, target: &Target, options: &Options) -> Result<Option<Unit>> {
    // An image of one channel (a speech model's raw audio): one group, a plain convolution whose
    // filter only looks depthwise; the implicit GEMM (the image staged in 8 channels) first.
    if one_channel_image(graph, ni) {
        if let Some(view) = as_gemm(graph, ni) {
            if let Some(u) = view.finish(gemm::unit_gathered(&view.graph, &[ni], target, options, view.gathers.as_ref())?) {
                return Ok(Some(u));
            }
        }
    }
    let small = smallgroup::is_small_group(graph, ni);
    // Depthwise convolutions with a channel multiplier take the small-group kernels first.
    let small_first = small && (!depthwise::is_depthwise(graph, ni) || smallgroup::multiplier(graph, ni) >= 2);
    if small_first {
        if let Some(u) = smallgroup::unit(graph, ni, target) {
            return Ok(Some(u));
        }
    }
    if depthwise::is_depthwise(graph, ni) {
        if let Some(u) = depthwise::unit(graph, ni, target) {
            return Ok(Some(u));
        }
    }
    if small && !small_first {
        if let Some(u) = smallgroup::unit(graph, ni, target) {
            return Ok(Some(u));
        }
    }
    // A strided data gradient by sub-pixel phases (no GEMM over the taps that do not reach a
    // pixel).
    if let Some(u) = phase::unit(graph, ni, target, options)? {
        return Ok(Some(u));
    }
    match as_gemm(graph, ni) {
        Some(view) => Ok(view.finish(gemm::unit_gathered(&view.graph, &[ni], target, options, view.gathers.as_ref())?)),
        None => Ok(None),
    }
}

/// Whether convolution node `ni`'s image (x, or dgrad's dx) has one channel.
fn one_channel_image(graph: &Graph, ni: usize) -> bool {
    let node = &graph.nodes[ni];
    let image = match &node.op {
        Op::ConvDgrad(_) => node.output("dx"),
        _ => node.input("x"),
    };
    image.is_some_and(|x| graph.desc(x).dims.get(1) == Some(&1))
}

/// The unit of a convolution group the planner formed over `view` (the convolution, then the
/// epilogue nodes the GEMM engine groups with it): on the small-group kernels when the
/// convolution is a forward one of few channels a group they take with that epilogue, else the
/// GEMM over the view.
pub fn group_unit(graph: &Graph, view: &View, nodes: &[usize], target: &Target, options: &Options) -> Result<Option<Unit>> {
    if nodes.first().is_some_and(|&ni| smallgroup::is_small_group(graph, ni) && !depthwise::is_depthwise(graph, ni)) {
        if let Some(u) = smallgroup::group_unit(graph, nodes, target) {
            return Ok(Some(u));
        }
    }
    Ok(view.finish(gemm::unit_gathered(&view.graph, nodes, target, options, view.gathers.as_ref())?))
}

/// A convolution seen as a GEMM: a copy of the graph in which the convolution node is a matmul
/// (and the tensors of the epilogue it may absorb are viewed as matrices), with the index maps of
/// its operands when they are gathered (an implicit GEMM, [`implicit`]) rather than strided
/// views of the tensors.
pub struct View {
    pub graph: Graph,
    pub gathers: Option<Gathers>,
    /// Copies the GEMM needs around it ([`stage`]): the view's staged tensors live in scratch.
    pub stage: Option<Box<stage::Stage>>,
}

impl View {
    /// The unit of a GEMM planned on this view, as it runs on the original graph's buffers
    /// (with the staging copies, when the view has them).
    pub fn finish(&self, unit: Option<Unit>) -> Option<Unit> {
        match &self.stage {
            Some(stage) => unit.and_then(|u| stage.finish(u)),
            None => unit,
        }
    }

    /// Whether GEMM group `nodes` of convolution `ni` may run on this view. A staged view takes
    /// no node that writes the convolution's inputs (a prologue would read them unstaged) or
    /// reads a staged tensor (an epilogue would read the staged copy as the original), and none
    /// at all when the convolution's output is copied out after the GEMM.
    pub fn takes_group(&self, graph: &Graph, ni: usize, nodes: &[usize]) -> bool {
        let Some(stage) = &self.stage else { return true };
        let inputs: Vec<TensorId> = graph.nodes[ni].inputs.iter().map(|p| p.tensor).collect();
        let staged: Vec<TensorId> = stage.staged().collect();
        nodes.iter().all(|&n| {
            let node = &graph.nodes[n];
            n == ni || (!stage.has_post() && !node.outputs.iter().any(|p| inputs.contains(&p.tensor)) && !node.inputs.iter().any(|p| staged.contains(&p.tensor)))
        })
    }
}

/// Why this engine declines convolution node `ni`: the first condition it fails, else the
/// conditions in general (types the GEMM kernels do not take).
pub fn decline_reason(graph: &Graph, ni: usize) -> String {
    let node = &graph.nodes[ni];
    let (Op::ConvFprop(a) | Op::ConvDgrad(a) | Op::ConvWgrad(a)) = &node.op else { return CONDITIONS.into() };
    // A grouped convolution of few channels a group that the small-group kernels declined: why,
    // before the other engines' reasons.
    let small = match smallgroup::is_small_group(graph, ni).then(|| smallgroup::decline(graph, ni)).flatten() {
        Some(why) => format!("a grouped convolution of few channels a group that the small-group kernels do not take (they take {why}); "),
        None => String::new(),
    };
    if depthwise::is_depthwise(graph, ni) {
        if let Some(why) = depthwise::decline(graph, ni) {
            return format!("{small}a depthwise convolution the depthwise kernels do not take: they take {why}; it runs on the fallback");
        }
    }
    let (image, filter) = match &node.op {
        Op::ConvFprop(_) => (node.input("x"), node.input("w")),
        Op::ConvDgrad(_) => (node.output("dx"), node.input("w")),
        _ => (node.input("x"), node.output("dw")),
    };
    let channels = |t: Option<TensorId>| t.and_then(|t| graph.desc(t).dims.get(1).copied()).unwrap_or(1);
    let (c, cf) = (channels(image), channels(filter));
    if matches!(node.op, Op::ConvWgrad(_)) && a.mode == crate::graph::ops::conv::ConvMode::Convolution {
        return format!("{small}a weight gradient in convolution mode (mirrored filter) runs on the fallback");
    }
    if cf > 0 && c != cf {
        let groups = c / cf;
        if cf == 1 {
            return format!("{small}groups = {groups} with one channel a group: a depthwise convolution, which the depthwise kernels take (not the implicit GEMM)");
        }
        if as_gemm(graph, ni).is_none() {
            return format!(
                "{small}groups = {groups} (image channels {c} / filter channels {cf}): a grouped convolution runs on the implicit GEMM as a batch of images x groups, which needs its output (and the tensors of its epilogue) one batch stride apart from group to group and image to image (channels-last images flattened with their pixels, or packed NCHW); this one's are not"
            );
        }
    }
    format!("{small}it takes {CONDITIONS}")
}

/// What this engine takes.
pub const CONDITIONS: &str = "any number of groups of more than one channel (depthwise convolutions run on their own kernels; forward and weight-gradient convolutions of at most 8 channels a group and 144 MACs an output on direct small-group kernels); inputs of f16, bf16, f32 (tf32 or 3xTF32) or fp8 with f32 compute, or 8-bit integers (i8, u8) in a forward convolution with an i32 or f32 compute type (exact i32 sums); any filter size, stride, dilation and padding in 1-3 spatial dims; extents within 2^31 (other convolutions run on the fallback). f16/bf16 convolutions whose channels come in 16-byte runs run on the Hopper wgmma kernel, the rest (8-bit integers too, but for int8 one-tap layers and int8 forward convolutions whose channels come in 128-byte runs, which take the Hopper kernel) on the mma.sync kernel";

/// A copy of `graph` in which convolution node `ni` is a matmul over matrix views of its
/// tensors, and the tensors of the pointwise nodes after it are viewed alike; None when the
/// convolution is not a matrix product or a tensor cannot be viewed.
pub fn as_gemm(graph: &Graph, ni: usize) -> Option<View> {
    if let Some(view) = one_tap_view(graph, ni) {
        return Some(View { graph: view, gathers: None, stage: None });
    }
    stage::view(graph, ni).or_else(|| implicit::view(graph, ni))
}

/// [`as_gemm`] for a convolution that is a matrix product over strided views of its tensors.
fn one_tap_view(graph: &Graph, ni: usize) -> Option<Graph> {
    let node = graph.nodes.get(ni)?;
    let (attrs, a, b, out) = operands(node)?;
    let w = match &node.op {
        Op::ConvWgrad(_) => out,
        _ => b,
    };
    let wd = graph.desc(w);
    if !one_tap(attrs, wd) {
        return None;
    }
    let mut view = graph.clone();
    // (The weight gradient may run with its operands swapped, as dw^T.)
    let mut swap = false;
    match &node.op {
        Op::ConvFprop(_) | Op::ConvDgrad(_) => {
            let (ad, od) = (graph.desc(a), graph.desc(out));
            // One group: the filter's channels are the image's; the spatial dims are kept.
            let (in_ch, out_ch) = if matches!(node.op, Op::ConvFprop(_)) { (wd.dims[1], wd.dims[0]) } else { (wd.dims[0], wd.dims[1]) };
            if ad.dims.len() != od.dims.len() || ad.dims[1] != in_ch || od.dims[1] != out_ch || ad.dims[0] != od.dims[0] || ad.dims[2..] != od.dims[2..] {
                return None;
            }
            view.tensors[a.0] = image_view(ad, &ad.dims)?;
            // fprop reads w as C x K ([1] then [0]), dgrad as K x C.
            let (r, c) = if matches!(node.op, Op::ConvFprop(_)) { (1, 0) } else { (0, 1) };
            view.tensors[w.0] = matrix(wd, (wd.dims[r], wd.strides[r]), (wd.dims[c], wd.strides[c]));
            let out_dims = od.dims.clone();
            view.tensors[out.0] = image_view(od, &out_dims)?;
            let viewed = view_epilogue(graph, &mut view, out, &out_dims, &[a, w]);
            // Images and pixels as one run of rows where every tensor allows (the input too:
            // its rows are the output's).
            let pixels: i64 = out_dims[2..].iter().product();
            let mut all = viewed.clone();
            if !all.contains(&a) {
                all.push(a);
            }
            let _ = flatten(&mut view, &all, out_dims[0], pixels);
        }
        _ => {
            // dw (K x C) = dy^T x: both images as (N * S) x channels.
            let (dyd, xd) = (graph.desc(a), graph.desc(b));
            if dyd.dims.len() != xd.dims.len() || dyd.dims[1] != wd.dims[0] || xd.dims[1] != wd.dims[1] || dyd.dims[0] != xd.dims[0] || dyd.dims[2..] != xd.dims[2..] {
                return None;
            }
            let (ns, s_dy) = rows_of(dyd)?;
            let (ns_x, s_x) = rows_of(xd)?;
            if ns != ns_x {
                return None;
            }
            let (k, c) = (wd.dims[0], wd.dims[1]);
            if c > k {
                // dw^T (C x K) = x^T dy: the longer side along the tiles' rows.
                view.tensors[b.0] = matrix(xd, (c, xd.strides[1]), (ns, s_x));
                view.tensors[a.0] = matrix(dyd, (ns, s_dy), (k, dyd.strides[1]));
                view.tensors[w.0] = matrix(wd, (c, wd.strides[1]), (k, wd.strides[0]));
                swap = true;
            } else {
                view.tensors[a.0] = matrix(dyd, (k, dyd.strides[1]), (ns, s_dy));
                view.tensors[b.0] = matrix(xd, (ns, s_x), (c, xd.strides[1]));
                view.tensors[w.0] = matrix(wd, (k, wd.strides[0]), (c, wd.strides[1]));
            }
        }
    }
    let (a, b) = if swap { (b, a) } else { (a, b) };
    let n = &mut view.nodes[ni];
    n.op = Op::Matmul(MatmulAttrs {});
    n.inputs = vec![Port { name: "a".into(), tensor: a }, Port { name: "b".into(), tensor: b }];
    n.outputs = vec![Port { name: "c".into(), tensor: out }];
    Some(view)
}

/// Views `[b, s, c]` of the output and the epilogue's tensors (`viewed`) made `[b * s, c]`
/// (`[1, c]` for those broadcast over both), when every one allows: images and pixels in one
/// run, or broadcast over both. Returns whether they were.
pub(super) fn flatten(view: &mut Graph, viewed: &[TensorId], n: i64, pixels: i64) -> bool {
    let mut flat: Vec<(TensorId, TensorDesc)> = Vec::new();
    for &t in viewed {
        let d = &view.tensors[t.0];
        if d.dims.len() != 3 {
            return false;
        }
        let (b, s) = ((d.dims[0], d.strides[0]), (d.dims[1], d.strides[1]));
        let rows = if b.0 == 1 && s.0 == 1 {
            (1, 0)
        } else if b.0 == n && s.0 == pixels {
            match linear(&[b, s]) {
                Some(l) => l,
                None => return false,
            }
        } else {
            return false;
        };
        flat.push((t, matrix(d, rows, (d.dims[2], d.strides[2]))));
    }
    for (t, d) in flat {
        view.tensors[t.0] = d;
    }
    true
}

/// A convolution node's attributes and tensors in GEMM order: its first operand (x of fprop, dy
/// of dgrad and wgrad), its second (w, or x of wgrad) and its output.
fn operands(node: &crate::graph::Node) -> Option<(&ConvAttrs, TensorId, TensorId, TensorId)> {
    match &node.op {
        Op::ConvFprop(at) => Some((at, node.input("x")?, node.input("w")?, node.output("y")?)),
        Op::ConvDgrad(at) => Some((at, node.input("dy")?, node.input("w")?, node.output("dx")?)),
        Op::ConvWgrad(at) => Some((at, node.input("dy")?, node.input("x")?, node.output("dw")?)),
        _ => None,
    }
}

/// A one-tap filter (all spatial dims 1) with unit stride and no padding (dilation does not
/// matter for one tap).
fn one_tap(a: &ConvAttrs, w: &TensorDesc) -> bool {
    w.dims.len() >= 3
        && w.dims.len() == w.strides.len()
        && w.dims.iter().all(|&d| d > 0)
        && w.dims[2..].iter().all(|&d| d == 1)
        && a.stride.iter().all(|&s| s == 1)
        && a.pre_padding.iter().chain(&a.post_padding).all(|&p| p == 0)
}

/// `d` re-described as a rank-2 (or, with a batch, rank-3) strided matrix: same buffer, dtype and
/// flags.
fn matrix(d: &TensorDesc, rows: (i64, i64), cols: (i64, i64)) -> TensorDesc {
    TensorDesc { dims: vec![rows.0, cols.0], strides: vec![rows.1, cols.1], ..d.clone() }
}

/// The rows of an image `[N, C, spatial...]` taken over its batch and spatial dims together, as
/// (count, stride): when those dims are laid out one after another.
fn rows_of(d: &TensorDesc) -> Option<(i64, i64)> {
    let dims: Vec<(i64, i64)> = std::iter::once((d.dims[0], d.strides[0])).chain(d.dims[2..].iter().copied().zip(d.strides[2..].iter().copied())).collect();
    linear(&dims)
}

/// (extent, stride) pairs, outermost first, as one (extent product, stride) when they are laid
/// out one after another (extents of 1 skipped); None otherwise.
pub(super) fn linear(dims: &[(i64, i64)]) -> Option<(i64, i64)> {
    let moving: Vec<(i64, i64)> = dims.iter().copied().filter(|&(e, _)| e != 1).collect();
    let count: i64 = dims.iter().map(|&(e, _)| e).product();
    let Some(&(_, inner)) = moving.last() else { return Some((count, 0)) };
    for w in moving.windows(2) {
        if w[0].1 != w[1].1.checked_mul(w[1].0)? {
            return None;
        }
    }
    (inner >= 0).then_some((count, inner))
}

/// A tensor `d` broadcast to image dims `out` (`[N, C, spatial...]`, dims of `d` right-aligned,
/// each equal or 1) as `[N, S, C]`: batch, the spatial dims as one (all equal to `out`'s and laid
/// out one after another, or all 1), channels. None when it cannot be so viewed.
fn image_view(d: &TensorDesc, out: &[i64]) -> Option<TensorDesc> {
    let r = out.len();
    if r < 3 || d.dims.len() > r || d.strides.len() != d.dims.len() || d.strides.iter().any(|&s| s < 0) {
        return None;
    }
    let shift = r - d.dims.len();
    let at = |a: usize| if a < shift { (1, 0) } else { (d.dims[a - shift], d.strides[a - shift]) };
    if (0..r).any(|a| at(a).0 != 1 && at(a).0 != out[a]) {
        return None;
    }
    let spatial: Vec<(i64, i64)> = (2..r).map(at).collect();
    let s = if spatial.iter().all(|&(e, _)| e == 1) {
        (1, 0)
    } else if spatial.iter().zip(&out[2..]).all(|(&(e, _), &o)| e == o) {
        linear(&spatial)?
    } else {
        return None;
    };
    let (n, c) = (at(0), at(1));
    Some(TensorDesc { dims: vec![n.0, s.0, c.0], strides: vec![n.1, s.1, c.1], ..d.clone() })
}

/// View the tensors of the pointwise nodes after `out` (those that read it or a value viewed so
/// far) as `out` is viewed, so that the GEMM engine's epilogue can take them; a node with a
/// tensor that cannot be viewed (or one of the convolution's `operands` whose view differs)
/// ends the walk there.
fn view_epilogue(graph: &Graph, view: &mut Graph, out: TensorId, out_dims: &[i64], operands: &[TensorId]) -> Vec<TensorId> {
    let cons = graph.consumers();
    let mut viewed = vec![out];
    let mut at = 0;
    while at < viewed.len() {
        let t = viewed[at];
        at += 1;
        for &ni in cons.get(&t.0).map(Vec::as_slice).unwrap_or(&[]) {
            let node = &graph.nodes[ni];
            if !matches!(node.op, Op::Pointwise(_)) {
                continue;
            }
            let mut new = Vec::new();
            for p in node.inputs.iter().chain(&node.outputs) {
                if viewed.contains(&p.tensor) || new.iter().any(|(id, _)| *id == p.tensor) {
                    continue;
                }
                let d = graph.desc(p.tensor);
                let v = if d.is_pass_by_value { Some(TensorDesc { dims: vec![1, 1, 1], strides: vec![0, 0, 0], ..d.clone() }) } else { image_view(d, out_dims) };
                // An operand of the convolution read again here keeps its view only where the
                // two agree (x as a residual); the filter, viewed otherwise, ends the walk.
                let v = v.filter(|v| !operands.contains(&p.tensor) || view.tensors[p.tensor.0] == *v);
                match v {
                    Some(v) => new.push((p.tensor, v)),
                    None => {
                        new.clear();
                        break;
                    }
                }
            }
            let outputs_viewed = node.outputs.iter().all(|p| viewed.contains(&p.tensor) || new.iter().any(|(id, _)| *id == p.tensor));
            if !outputs_viewed {
                continue;
            }
            for (id, v) in new {
                view.tensors[id.0] = v;
                viewed.push(id);
            }
        }
    }
    viewed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Hopper implicit GEMM's tile width for a fp16 channels-last 3x3 layer (padding 1): the
    /// first launch's GEMM_BN.
    fn tile_width(op: &str, n: i64, c: i64, hw: i64, s: i64) -> usize {
        use crate::graph::ops::conv::ConvAttrs;
        let f = crate::DataType::F16;
        let nhwc = |name: &str, dims: &[i64]| TensorDesc::new(name, dims, f).with_layout(&[0, 2, 3, 1]);
        let attrs = ConvAttrs::new(2).with_padding(&[1, 1]).with_stride(&[s, s]);
        let o = (hw + 2 - 3) / s + 1;
        let mut g = Graph::new("c").io_data_type(f);
        let out = match op {
            "fprop" => {
                let (x, w) = (g.tensor(nhwc("x", &[n, c, hw, hw])), g.tensor(nhwc("w", &[c, c, 3, 3])));
                g.conv_fprop(x, w, attrs)
            }
            _ => {
                let (dy, x) = (g.tensor(nhwc("dy", &[n, c, o, o])), g.tensor(nhwc("x", &[n, c, hw, hw])));
                g.conv_wgrad(dy, x, &[c, c, 3, 3], attrs)
            }
        };
        g.set_output(out);
        g.validate().unwrap();
        let u = unit(&g, 0, &Target::sm90a(), &Options::default()).unwrap().expect("a GEMM unit");
        let src = &u.kernels.launches[0].source;
        let at = src.find("#define GEMM_BN ").expect("GEMM_BN") + "#define GEMM_BN ".len();
        src[at..].split_whitespace().next().unwrap().parse().unwrap()
    }

    /// 64-wide tiles where they fill more SMs (UNet's 320 channels at 64x64, forward and weight
    /// gradient; ResNet's stride-2 3x3), 128-wide where the wider tiles' splits of k keep more
    /// CTAs busy (1280 channels at 16x16, ResNet's 256 at 14x14 weight gradient) or fill the
    /// SMs already (256 at 14x14 forward).
    #[test]
    fn implicit_gemm_tile_width_follows_the_ctas_it_keeps_busy() {
        assert_eq!(tile_width("fprop", 2, 320, 64, 1), 64);
        assert_eq!(tile_width("wgrad", 2, 320, 64, 1), 64);
        assert_eq!(tile_width("fprop", 32, 128, 56, 2), 64);
        assert_eq!(tile_width("fprop", 2, 1280, 16, 1), 128);
        assert_eq!(tile_width("wgrad", 32, 256, 14, 1), 128);
        assert_eq!(tile_width("fprop", 32, 256, 14, 1), 128);
    }

    #[test]
    fn spatial_dims_flatten_when_laid_out_one_after_another() {
        // NHWC [2, 8, 5, 7]: strides [280, 1, 56, 8].
        assert_eq!(linear(&[(5, 56), (7, 8)]), Some((35, 8)));
        // NCHW [2, 8, 5, 7]: strides [280, 35, 7, 1].
        assert_eq!(linear(&[(5, 7), (7, 1)]), Some((35, 1)));
        // A padded row: not one run.
        assert_eq!(linear(&[(5, 9), (7, 1)]), None);
        // Extents of 1 do not count.
        assert_eq!(linear(&[(1, 1000), (7, 3)]), Some((7, 3)));
        assert_eq!(linear(&[(1, 5), (1, 1)]), Some((1, 0)));
    }

    /// The filter read again by the epilogue (broadcast as an image) keeps its matrix view: the
    /// walk stops at that node.
    #[test]
    fn the_filter_keeps_its_view_when_the_epilogue_reads_it() {
        let f = crate::DataType::F16;
        let mut g = Graph::new("w_again").io_data_type(f);
        let x = g.tensor(TensorDesc::new("x", &[4, 4, 3, 5], f).with_layout(&[0, 2, 3, 1]));
        let w = g.tensor(TensorDesc::new("w", &[4, 4, 1, 1], f));
        let y = g.conv_fprop(x, w, ConvAttrs::new(2));
        let z = g.add(y, w);
        g.set_output(z);
        g.validate().unwrap();
        let view = as_gemm(&g, 0).unwrap().graph;
        assert_eq!(view.tensors[w.0].dims, [4, 4]);
        assert_eq!(view.tensors[w.0].strides, [1, 4]);
        // x read again as a residual keeps the view it has (both images' 15 pixels as one run
        // of rows: channels-last).
        let mut g = Graph::new("x_again").io_data_type(f);
        let x = g.tensor(TensorDesc::new("x", &[2, 8, 3, 5], f).with_layout(&[0, 2, 3, 1]));
        let w = g.tensor(TensorDesc::new("w", &[8, 8, 1, 1], f).with_layout(&[0, 2, 3, 1]));
        let y = g.conv_fprop(x, w, ConvAttrs::new(2));
        let z = g.add(y, x);
        g.set_output(z);
        g.validate().unwrap();
        let view = as_gemm(&g, 0).unwrap().graph;
        assert_eq!(view.tensors[z.0].dims, [30, 8]);
        assert_eq!(view.tensors[x.0].dims, [30, 8]);
    }

    #[test]
    fn a_bias_views_as_one_value_per_column() {
        let f = crate::DataType::F16;
        let bias = TensorDesc::new("b", &[1, 8, 1, 1], f);
        let v = image_view(&bias, &[2, 8, 5, 7]).unwrap();
        assert_eq!((v.dims.clone(), v.strides[1], v.strides[2]), (vec![1, 1, 8], 0, 1));
        let y = TensorDesc::new("y", &[2, 8, 5, 7], f).with_layout(&[0, 2, 3, 1]);
        let v = image_view(&y, &[2, 8, 5, 7]).unwrap();
        assert_eq!((v.dims, v.strides), (vec![2, 35, 8], vec![280, 8, 1]));
        // Broadcast along some spatial dims only: no view.
        assert!(image_view(&TensorDesc::new("h", &[1, 8, 5, 1], f), &[2, 8, 5, 7]).is_none());
    }
}
