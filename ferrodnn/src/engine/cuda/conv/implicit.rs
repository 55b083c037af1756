//! Implicit GEMM: a convolution of any filter, stride, dilation and padding as a GEMM whose
//! activation operand is gathered through an index map ([`gemm::gather`]) instead of a
//! materialized im2col matrix. With `P` the output pixels `(n, o...)`, `T` the filter taps, `C`
//! and `K` the input and output channels (of one group; see below for several):
//!
//! - fprop: `y[(n, o), k] = sum_(t, c) x[n, o * stride - pre + t * dil, c] * w[k, c, t]`: M = N*P,
//!   N = K, reduction T*C;
//! - dgrad: `dx[(n, i), c] = sum_(t, k) dy[n, (i + pre - t * dil) / stride, k] * w[k, c, t]`,
//!   where the division is exact and in range (else the term is zero): M = N*H (the input
//!   pixels), N = C, reduction T*K;
//! - wgrad: `dw[k, (t, c)] = sum_(n, o) dy[n, o, k] * x[n, o * stride - pre + t * dil, c]`: M = K,
//!   N = T*C, reduction N*P (split across blocks, summed in a fixed order); computed as
//!   `dw^T = x^T dy` (M = T*C, N = K) when T*C > K, so the longer side fills the tiles' rows.
//!
//! In `Convolution` mode the filter is read at the mirrored tap. The reduction runs tap-major
//! (`(t, c)`, channels inner) when the activation's channels are contiguous (channels-last), so a
//! 16-byte vector of channels is one load inside or outside the image; channel-major otherwise.
//! The output is a strided matrix (rows over the images and their pixels together where the
//! layout allows, else one GEMM batch per image), so the GEMM's fused epilogue applies as it
//! does to a matmul.
//!
//! Groups: with `G` groups, `C` and `K` above are a group's channels (the filter's dims 1 and
//! 0 / G), and the convolution is `G` GEMMs of that shape, the GEMM's batch (times the images
//! where they are batches: images outer, groups inner, `GemmProblem::groups`). Each operand's
//! map addresses group 0 and moves by its group's channels or filters from one group to the
//! next (`Gathers::a_group`, `b_group`: `C * x_c` for fprop's image, `K * w_k` for its filter,
//! ...); the output and the epilogue's tensors are viewed with their channels split into
//! `[G, C]` and the groups as a batch dim ([`split_groups`]); a weight gradient's dw as a batch
//! of `G` matrices `K` filters apart. Where a group's channels are too few for 16-byte vectors of
//! the activation (ResNeXt's 4 a group), a forward or data-gradient GEMM takes several groups
//! ([`pack_of`]: 4 groups of 4 channels, say): their channels one reduction, their filters one
//! output, the filter block-diagonal ([`Block`]: zero where a filter would read another group's
//! channels), so the image loads in whole vectors at the price of multiplying those zeros.

use super::{flatten, image_view, linear, matrix, operands, view_epilogue, View};
use crate::engine::cuda::gemm::gather::{Axis, Block, Gather, Gathers, Index};
use crate::graph::ops::conv::ConvMode;
use crate::graph::ops::matmul::MatmulAttrs;
use crate::graph::ops::Op;
use crate::graph::{Graph, Port, TensorDesc, TensorId};

/// `v` (one value per spatial dim, `rank` of them) placed in the last of three slots; `fill` in
/// the others.
pub(super) fn slots(v: &[i64], fill: i64) -> [i64; 3] {
    let mut out = [fill; 3];
    let shift = 3 - v.len();
    out[shift..].copy_from_slice(v);
    out
}

/// The spatial axes of an image or filter (dims `[_, _, spatial...]`), with divisor `div` and
/// base `base` per spatial dim.
pub(super) fn axes(d: &TensorDesc, div: &[i64], base: &[i64]) -> [Axis; 3] {
    let r = d.dims.len() - 2;
    let mut out = [Axis::unit(), Axis::unit(), Axis::unit()];
    for s in 0..r {
        out[3 - r + s] = Axis { extent: d.dims[2 + s], stride: d.strides[2 + s], div: div[s], base: base[s] };
    }
    out
}

/// The convolution node `ni` as a matmul over gathered operands, when its tensors allow: rank
/// 3-5, non-negative strides, more than one channel a group (depthwise convolutions have their
/// own kernels), for the weight gradient cross-correlation and a filter whose taps and channels
/// lie in one run, and for a grouped convolution an output (and epilogue) whose batch of images
/// and groups is one stride ([`split_groups`]).
pub fn view(graph: &Graph, ni: usize) -> Option<View> {
    let node = graph.nodes.get(ni)?;
    let (attrs, a, b, out) = operands(node)?;
    // The forward convolution's image, filter and output.
    let (x, w, y) = match &node.op {
        Op::ConvFprop(_) => (a, b, out),
        Op::ConvDgrad(_) => (out, b, a),
        _ => (b, out, a),
    };
    let (xd, wd, yd) = (graph.desc(x), graph.desc(w), graph.desc(y));
    let rank = xd.dims.len();
    let well_formed = |d: &TensorDesc| d.dims.len() == rank && d.strides.len() == rank && d.strides.iter().all(|&s| s >= 0) && d.dims.iter().all(|&e| e > 0);
    if !(3..=5).contains(&rank) || !well_formed(xd) || !well_formed(wd) || !well_formed(yd) || attrs.stride.len() != rank - 2 {
        return None;
    }
    let (n, k) = (xd.dims[0], wd.dims[0]);
    // Groups: c and k channels a group of the image and the output (the filter's dims 1 and 0
    // over the groups); the output's dims as the forward convolution makes them.
    let c = wd.dims[1];
    let groups = xd.dims[1] / c;
    if xd.dims[1] % c != 0 || k % groups != 0 || (groups > 1 && c == 1) || yd.dims[0] != n || yd.dims[1] != k || attrs.forward_dims(&xd.dims, &wd.dims, "x", "w").ok()? != yd.dims {
        return None;
    }
    let kg = k / groups;
    let flip = attrs.mode == ConvMode::Convolution;
    let taps: Vec<i64> = wd.dims[2..].to_vec();
    let filter_dil: Vec<i64> = taps.iter().map(|_| if flip { -1 } else { 1 }).collect();
    let filter_base: Vec<i64> = taps.iter().map(|&t| if flip { t - 1 } else { 0 }).collect();
    let ones = vec![1; rank - 2];
    let zeros = vec![0; rank - 2];
    let neg = |v: &[i64]| v.iter().map(|&e| -e).collect::<Vec<i64>>();
    let t3 = slots(&taps, 1);
    let kind = match &node.op {
        Op::ConvFprop(_) => 0,
        Op::ConvDgrad(_) => 1,
        _ => 2,
    };
    // Channels inner in the reduction when the activation's channels are contiguous.
    let act_ch_stride = if kind == 1 { yd.strides[1] } else { xd.strides[1] };
    let mut view = graph.clone();
    // Each operand's offset from one group to the next (its channels or filters a group), and
    // the groups the GEMM runs (fewer where it packs several into one).
    let (gathers, gemm_groups, groups_at, m, kk, nn) = match kind {
        0 | 1 => {
            let tap_major = act_ch_stride == 1;
            // Groups packed `pack` to a GEMM (its filter block-diagonal), where a group's
            // channels are too few for 16-byte vectors of the activation: `c` and `kg` a pack.
            let es = graph.resolved_data_type(if kind == 0 { x } else { y }).map_or(4, |t| t.size() as i64);
            let pack = if tap_major { pack_of(groups, if kind == 0 { (c, kg) } else { (kg, c) }, es) } else { 1 };
            let block = |mn: i64, ch: i64, mn_wrap: bool, ch_wrap: bool| (pack > 1).then_some(Block { mn, ch, mn_wrap, ch_wrap });
            let (cp, kp) = (pack * c, pack * kg);
            let (ga, gb, mn_ch, red_ch) = if kind == 0 {
                let ga = Gather {
                    mn: Index::Pixel { n_stride: xd.strides[0], grid: slots(&yd.dims[2..], 1), mul: slots(&attrs.stride, 0), off: slots(&neg(&attrs.pre_padding), 0) },
                    k: Index::Taps { taps: t3, channels: cp, ch_stride: xd.strides[1], tap_major, dil: slots(&attrs.dilation, 0) },
                    axes: axes(xd, &ones, &zeros),
                    block: None,
                };
                // (Packed: filter n of the pack reads channel ch of its group, ch % c of w.)
                let gb = Gather {
                    mn: Index::Plain { stride: wd.strides[0] },
                    k: Index::Taps { taps: t3, channels: cp, ch_stride: wd.strides[1], tap_major, dil: slots(&filter_dil, 0) },
                    axes: axes(wd, &ones, &filter_base),
                    block: block(kg, c, false, true),
                };
                (ga, gb, kp, cp)
            } else {
                let ga = Gather {
                    mn: Index::Pixel { n_stride: yd.strides[0], grid: slots(&xd.dims[2..], 1), mul: slots(&ones, 0), off: slots(&attrs.pre_padding, 0) },
                    k: Index::Taps { taps: t3, channels: kp, ch_stride: yd.strides[1], tap_major, dil: slots(&neg(&attrs.dilation), 0) },
                    axes: axes(yd, &attrs.stride, &zeros),
                    block: None,
                };
                // (Packed: image channel n of the pack, channel n % c of w, reads the filters of
                // its group.)
                let gb = Gather {
                    mn: Index::Plain { stride: wd.strides[1] },
                    k: Index::Taps { taps: t3, channels: kp, ch_stride: wd.strides[0], tap_major, dil: slots(&filter_dil, 0) },
                    axes: axes(wd, &ones, &filter_base),
                    block: block(c, kg, true, false),
                };
                (ga, gb, cp, kp)
            };
            // fprop: the group's (pack's) image channels and filters; dgrad: its output-gradient
            // channels and filters.
            let at = if kind == 0 { (cp * xd.strides[1], kp * wd.strides[0]) } else { (kp * yd.strides[1], kp * wd.strides[0]) };
            // The output as rows (its images' pixels) x channels, one GEMM batch per image
            // unless every tensor of the epilogue flattens images and pixels into one run.
            let od = graph.desc(out);
            view.tensors[out.0] = image_view(od, &od.dims)?;
            let viewed = view_epilogue(graph, &mut view, out, &od.dims, &[a, b]);
            let pixels: i64 = od.dims[2..].iter().product();
            let flat = flatten(&mut view, &viewed, n, pixels);
            let gemm_groups = groups / pack;
            if gemm_groups > 1 && !split_groups(&mut view, &viewed, gemm_groups) {
                return None;
            }
            let m = if flat { n * pixels } else { pixels };
            ((ga, gb), gemm_groups, at, m, taps.iter().product::<i64>() * red_ch, mn_ch)
        }
        _ => {
            if flip {
                return None;
            }
            // dw as K x (taps, channels): the taps and channels in one run, in either order.
            let spatial: Vec<(i64, i64)> = wd.dims[2..].iter().copied().zip(wd.strides[2..].iter().copied()).collect();
            let ch = (wd.dims[1], wd.strides[1]);
            let tap_first: Vec<(i64, i64)> = spatial.iter().copied().chain(std::iter::once(ch)).collect();
            let ch_first: Vec<(i64, i64)> = std::iter::once(ch).chain(spatial.iter().copied()).collect();
            let prefer = act_ch_stride == 1;
            let orders = if prefer { [(true, &tap_first), (false, &ch_first)] } else { [(false, &ch_first), (true, &tap_first)] };
            let (tap_major, (cols, col_stride)) = orders.iter().find_map(|&(tm, dims)| linear(dims).map(|l| (tm, l)))?;
            // dy's side (output channels by pixels) and x's (taps and channels by pixels).
            let dy_side = Gather {
                mn: Index::Plain { stride: yd.strides[1] },
                k: Index::Pixel { n_stride: yd.strides[0], grid: slots(&yd.dims[2..], 1), mul: slots(&ones, 0), off: [0; 3] },
                axes: axes(yd, &ones, &zeros),
                block: None,
            };
            let x_side = Gather {
                mn: Index::Taps { taps: t3, channels: c, ch_stride: xd.strides[1], tap_major, dil: slots(&attrs.dilation, 0) },
                k: Index::Pixel { n_stride: xd.strides[0], grid: slots(&yd.dims[2..], 1), mul: slots(&attrs.stride, 0), off: slots(&neg(&attrs.pre_padding), 0) },
                axes: axes(xd, &ones, &zeros),
                block: None,
            };
            let pixels: i64 = n * yd.dims[2..].iter().product::<i64>();
            // A group's output-gradient channels and image channels; its filters are dw's rows
            // kg apart (the groups' dw as a batch of matrices).
            let (dy_at, x_at, w_at) = (kg * yd.strides[1], c * xd.strides[1], kg * wd.strides[0]);
            let grouped = |d: TensorDesc| if groups > 1 { batch_of(d, groups, w_at) } else { d };
            // dw^T = x^T dy, the longer side (taps and channels) along the tiles' 128 rows, where
            // K alone would not fill them or the reduction is long enough to hide dw^T's
            // column-major stores; over few pixels dw is stored row-major (measured on the H100,
            // 3x3 1280 -> 1280 over 2 x 8 x 8 pixels: 0.0180 ms instead of 0.0293; over 2 x 16 x
            // 16, dw^T stays faster: 0.0398 against 0.0495).
            if cols > kg && (kg < 128 || pixels >= 512) {
                view.tensors[out.0] = grouped(matrix(wd, (cols, col_stride), (kg, wd.strides[0])));
                let node = &mut view.nodes[ni];
                node.op = Op::Matmul(MatmulAttrs {});
                node.inputs = vec![Port { name: "a".into(), tensor: b }, Port { name: "b".into(), tensor: a }];
                node.outputs = vec![Port { name: "c".into(), tensor: out }];
                view.tensors[b.0] = TensorDesc { dims: vec![cols, pixels], strides: vec![pixels, 1], ..graph.desc(b).clone() };
                view.tensors[a.0] = TensorDesc { dims: vec![pixels, kg], strides: vec![kg, 1], ..graph.desc(a).clone() };
                return Some(View { graph: view, gathers: Some(grouped_gathers(ni, x_side, dy_side, groups, (x_at, dy_at))), stage: None });
            }
            view.tensors[out.0] = grouped(matrix(wd, (kg, wd.strides[0]), (cols, col_stride)));
            ((dy_side, x_side), groups, (dy_at, x_at), kg, pixels, cols)
        }
    };
    // A and B get only their extents (m x reduction, reduction x n) in the view.
    view.tensors[a.0] = TensorDesc { dims: vec![m, kk], strides: vec![kk, 1], ..graph.desc(a).clone() };
    view.tensors[b.0] = TensorDesc { dims: vec![kk, nn], strides: vec![nn, 1], ..graph.desc(b).clone() };
    let node = &mut view.nodes[ni];
    node.op = Op::Matmul(MatmulAttrs {});
    node.inputs = vec![Port { name: "a".into(), tensor: a }, Port { name: "b".into(), tensor: b }];
    node.outputs = vec![Port { name: "c".into(), tensor: out }];
    let (ga, gb) = gathers;
    Some(View { graph: view, gathers: Some(grouped_gathers(ni, ga, gb, gemm_groups, groups_at)), stage: None })
}

/// Groups a GEMM of a forward or data-gradient convolution packs (a divisor of `groups`): their
/// reduction channels (`chans.0` a group: the image's for fprop, the output gradient's for
/// dgrad, `es` bytes each) one reduction and their outputs (`chans.1` a group) one row of
/// columns, the filter block-diagonal. As many groups as fill one 64-column tile (the widest
/// the GEMM takes without splitting N for a narrow problem), their channels a whole number of
/// 16-byte vectors; 1 (no packing) when no pack of two or more does. A pack of `p` multiplies
/// zeros off the diagonal blocks (`p` times its groups' useful tensor-core work), but a group of
/// fewer outputs than the tile's columns pays that anyway in padded columns: packed, the
/// reduction is `p` times longer (its padding to whole k steps shared) and the tiles `p` times
/// fewer, and the image's channels load in whole vectors. Measured on the H200 against packing
/// only where a group's channels fall short of a vector: RegNet's 9 groups of 16 at 28x28 (3
/// to a pack) forward 0.0325 -> 0.0280 ms, data gradient 0.0368 -> 0.0285; 32 groups of 32 at
/// 7x7 (2 to a pack) 0.0149 -> 0.0139 and 0.0158 -> 0.0140.
fn pack_of(groups: i64, chans: (i64, i64), es: i64) -> i64 {
    let (red, out) = chans;
    if groups < 2 || out >= 64 {
        return 1;
    }
    (2..=groups.min(64 / out.max(1))).rev().find(|&p| groups % p == 0 && p * red * es % 16 == 0).unwrap_or(1)
}

/// The gathers of node `ni` over `groups` groups, each operand `at` elements (A's, B's) from
/// one group to the next; of one group when there is one.
fn grouped_gathers(ni: usize, a: Gather, b: Gather, groups: i64, at: (i64, i64)) -> Gathers {
    if groups > 1 {
        Gathers { node: ni, a, b, groups: groups as usize, a_group: at.0, b_group: at.1 }
    } else {
        Gathers::one(ni, a, b)
    }
}

/// Matrix `d` as the first group's of `groups`, each `at` elements after the one before: a batch
/// of matrices `[groups, rows, cols]`.
fn batch_of(d: TensorDesc, groups: i64, at: i64) -> TensorDesc {
    let mut dims = vec![groups];
    dims.extend(&d.dims);
    let mut strides = vec![at];
    strides.extend(&d.strides);
    TensorDesc { dims, strides, ..d }
}

/// The views of a grouped convolution's output and its epilogue's tensors (`viewed`: `[rows,
/// C]`, or `[N, S, C]`, one batch per image) split into `groups` of `C / groups` channels:
/// `[groups, rows, C / groups]`, or `[N, groups, S, C / groups]` (the groups the inner batch
/// dim, as the GEMM's batch of images x groups reads them). A tensor of one channel (broadcast
/// along them) stays broadcast along both. False, with nothing changed, when a tensor has another
/// channel count or the views are of other ranks.
pub(super) fn split_groups(view: &mut Graph, viewed: &[TensorId], groups: i64) -> bool {
    let Some(&out) = viewed.first() else { return false };
    let channels = view.tensors[out.0].dims.last().copied().unwrap_or(0);
    if groups < 1 || channels % groups != 0 {
        return false;
    }
    let per = channels / groups;
    let mut split = Vec::new();
    for &t in viewed {
        let d = &view.tensors[t.0];
        let r = d.dims.len();
        if !(r == 2 || r == 3) || d.strides.len() != r {
            return false;
        }
        let (e, s) = (d.dims[r - 1], d.strides[r - 1]);
        let (g, c) = if e == channels && channels > 1 {
            ((groups, per * s), (per, s))
        } else if e == 1 {
            ((1, 0), (1, 0))
        } else {
            return false;
        };
        let (mut dims, mut strides) = (d.dims[..r - 1].to_vec(), d.strides[..r - 1].to_vec());
        // The groups after the images (if any), before the rows.
        dims.insert(r - 2, g.0);
        strides.insert(r - 2, g.1);
        dims.push(c.0);
        strides.push(c.1);
        split.push((t, TensorDesc { dims, strides, ..d.clone() }));
    }
    for (t, d) in split {
        view.tensors[t.0] = d;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::ops::conv::ConvAttrs;
    use crate::DataType;

    fn nhwc(name: &str, dims: &[i64]) -> TensorDesc {
        TensorDesc::new(name, dims, DataType::F16).with_layout(&[0, 2, 3, 1])
    }

    #[test]
    fn a_padded_3x3_fprop_gathers_its_image() {
        let mut g = Graph::new("c3").io_data_type(DataType::F16);
        let x = g.tensor(nhwc("x", &[2, 16, 9, 11]));
        let w = g.tensor(nhwc("w", &[24, 16, 3, 3]));
        let y = g.conv_fprop(x, w, ConvAttrs::new(2).with_padding(&[1, 1]));
        let b = g.tensor(TensorDesc::new("b", &[1, 24, 1, 1], DataType::F16));
        let z = g.add(y, b);
        g.set_output(z);
        g.validate().unwrap();
        let v = view(&g, 0).unwrap();
        let gs = v.gathers.unwrap();
        // Rows over both images' 99 pixels; the bias one value per column.
        assert_eq!(v.graph.tensors[z.0].dims, [198, 24]);
        assert_eq!(v.graph.tensors[b.0].dims, [1, 24]);
        assert_eq!(v.graph.tensors[x.0].dims, [198, 144]);
        assert!(matches!(gs.a.mn, Index::Pixel { grid: [1, 9, 11], off: [0, -1, -1], .. }));
        assert!(gs.a.k.contiguous(8) && gs.b.k.contiguous(8));
        assert!(gs.a.aligned(true, 8));
    }

    #[test]
    fn nchw_output_runs_one_batch_per_image() {
        let mut g = Graph::new("c3n").io_data_type(DataType::F32);
        let x = g.tensor(TensorDesc::new("x", &[3, 5, 7, 6], DataType::F32));
        let w = g.tensor(TensorDesc::new("w", &[4, 5, 3, 2], DataType::F32));
        let y = g.conv_fprop(x, w, ConvAttrs::new(2).with_padding(&[1, 0]));
        g.set_output(y);
        g.validate().unwrap();
        let v = view(&g, 0).unwrap();
        assert_eq!(v.graph.tensors[y.0].dims, [3, 35, 4]);
        assert!(!v.gathers.unwrap().a.k.contiguous(4));
    }

    /// A grouped convolution: one GEMM per group (the batch), each operand's map at group 0
    /// moved by the group's channels or filters; the output's channels split into groups.
    #[test]
    fn groups_run_as_a_batch_of_gemms() {
        let mut g = Graph::new("grp").io_data_type(DataType::F16);
        let x = g.tensor(nhwc("x", &[2, 16, 9, 11]));
        let w = g.tensor(nhwc("w", &[128, 8, 3, 3]));
        let y = g.conv_fprop(x, w, ConvAttrs::new(2).with_padding(&[1, 1]));
        let b = g.tensor(TensorDesc::new("b", &[1, 128, 1, 1], DataType::F16));
        let z = g.add(y, b);
        g.set_output(z);
        g.validate().unwrap();
        let v = view(&g, 0).unwrap();
        let gs = v.gathers.unwrap();
        // Two groups of 8 image channels and 64 filters (w [128, 8, 3, 3] KRSC: 72 a filter;
        // each group fills a 64-column tile, so none is packed with the other).
        assert_eq!((gs.groups, gs.a_group, gs.b_group), (2, 8, 64 * 72));
        assert!(matches!(gs.a.k, Index::Taps { channels: 8, ch_stride: 1, .. }));
        assert_eq!(v.graph.tensors[x.0].dims, [198, 72]);
        assert_eq!(v.graph.tensors[w.0].dims, [72, 64]);
        assert_eq!((v.graph.tensors[z.0].dims.clone(), v.graph.tensors[z.0].strides.clone()), (vec![2, 198, 64], vec![64, 128, 1]));
        assert_eq!((v.graph.tensors[b.0].dims.clone(), v.graph.tensors[b.0].strides.clone()), (vec![2, 1, 64], vec![64, 0, 1]));
        // NCHW: a batch per image and group, groups inner.
        let mut g = Graph::new("grp_nchw").io_data_type(DataType::F32);
        let x = g.tensor(TensorDesc::new("x", &[3, 6, 7, 5], DataType::F32));
        let w = g.tensor(TensorDesc::new("w", &[4, 3, 3, 3], DataType::F32));
        let y = g.conv_fprop(x, w, ConvAttrs::new(2).with_padding(&[1, 1]));
        g.set_output(y);
        g.validate().unwrap();
        let v = view(&g, 0).unwrap();
        assert_eq!((v.graph.tensors[y.0].dims.clone(), v.graph.tensors[y.0].strides.clone()), (vec![3, 2, 35, 2], vec![140, 70, 1, 35]));
        let gs = v.gathers.unwrap();
        assert_eq!((gs.groups, gs.a_group, gs.b_group), (2, 3 * 35, 2 * 27));
        // The weight gradient: dw as a batch of the groups' matrices.
        let mut g = Graph::new("grp_wgrad").io_data_type(DataType::F16);
        let dy = g.tensor(nhwc("dy", &[2, 8, 9, 11]));
        let x = g.tensor(nhwc("x", &[2, 16, 9, 11]));
        let dw = g.conv_wgrad(dy, x, &[8, 4, 3, 3], ConvAttrs::new(2).with_padding(&[1, 1]));
        g.set_output(dw);
        g.validate().unwrap();
        let v = view(&g, 0).unwrap();
        let gs = v.gathers.unwrap();
        // 4 groups of 2 filters by 36 taps and channels: dw^T (36 x 2) each, 2 filters apart.
        assert_eq!((gs.groups, gs.a_group, gs.b_group), (4, 4, 2));
        assert_eq!((v.graph.tensors[dw.0].dims.clone(), v.graph.tensors[dw.0].strides.clone()), (vec![4, 36, 2], vec![72, 1, 36]));
    }

    /// Groups of 4 16-bit channels: packed 16 to a GEMM (64 outputs, one tile's columns), whose
    /// filter is block-diagonal (64 channels, 8-byte runs for each filter's own 4).
    #[test]
    fn small_groups_pack_into_block_diagonal_gemms() {
        let mut g = Graph::new("resnext").io_data_type(DataType::F16);
        let x = g.tensor(nhwc("x", &[2, 128, 9, 11]));
        let w = g.tensor(nhwc("w", &[128, 4, 3, 3]));
        let y = g.conv_fprop(x, w, ConvAttrs::new(2).with_padding(&[1, 1]));
        g.set_output(y);
        g.validate().unwrap();
        let v = view(&g, 0).unwrap();
        let gs = v.gathers.unwrap();
        assert_eq!((gs.groups, gs.a_group, gs.b_group), (2, 64, 64 * 36));
        assert!(matches!(gs.a.k, Index::Taps { channels: 64, .. }) && gs.a.block.is_none());
        assert_eq!(gs.b.block, Some(Block { mn: 4, ch: 4, mn_wrap: false, ch_wrap: true }));
        assert!(gs.a.aligned(true, 8) && !gs.b.aligned(true, 8) && gs.b.aligned(true, 4));
        assert_eq!(v.graph.tensors[y.0].dims, [2, 198, 64]);
        assert_eq!(pack_of(32, (4, 4), 2), 16);
        assert_eq!(pack_of(32, (8, 8), 2), 8);
        assert_eq!(pack_of(2, (4, 4), 2), 2);
        assert_eq!(pack_of(32, (4, 16), 2), 4);
        assert_eq!(pack_of(6, (2, 2), 4), 6);
        // RegNet's 9 groups of 16, ResNeXt-101's 32 of 32 at 7x7, 13 groups of 8 (a prime).
        assert_eq!(pack_of(9, (16, 16), 2), 3);
        assert_eq!(pack_of(32, (32, 32), 2), 2);
        assert_eq!(pack_of(13, (8, 8), 2), 1);
        // Channels that never make a whole vector: no pack.
        assert_eq!(pack_of(3, (3, 3), 2), 1);
        assert_eq!(pack_of(4, (64, 64), 2), 1);
    }

    #[test]
    fn depthwise_and_mirrored_weight_gradients_are_declined() {
        let mut g = Graph::new("dw").io_data_type(DataType::F16);
        let x = g.tensor(nhwc("x", &[2, 16, 9, 11]));
        let w = g.tensor(nhwc("w", &[16, 1, 3, 3]));
        let y = g.conv_fprop(x, w, ConvAttrs::new(2));
        g.set_output(y);
        g.validate().unwrap();
        assert!(view(&g, 0).is_none());
        let mut g = Graph::new("mirror").io_data_type(DataType::F16);
        let dy = g.tensor(nhwc("dy", &[2, 8, 7, 9]));
        let x = g.tensor(nhwc("x", &[2, 16, 9, 11]));
        let mut attrs = ConvAttrs::new(2);
        attrs.mode = ConvMode::Convolution;
        let dw = g.conv_wgrad(dy, x, &[8, 16, 3, 3], attrs);
        g.set_output(dw);
        g.validate().unwrap();
        assert!(view(&g, 0).is_none());
    }
}
