//! Implicit GEMM: a convolution of any filter, stride, dilation and padding as a GEMM whose
//! activation operand is gathered through an index map ([`gemm::gather`]) instead of a
//! materialized im2col matrix. With `P` the output pixels `(n, o...)`, `T` the filter taps, `C`
//! and `K` the input and output channels (one group):
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

use super::{flatten, image_view, linear, matrix, operands, view_epilogue, View};
use crate::engine::cuda::gemm::gather::{Axis, Gather, Gathers, Index};
use crate::graph::ops::conv::ConvMode;
use crate::graph::ops::matmul::MatmulAttrs;
use crate::graph::ops::Op;
use crate::graph::{Graph, Port, TensorDesc};

/// `v` (one value per spatial dim, `rank` of them) placed in the last of three slots; `fill` in
/// the others.
fn slots(v: &[i64], fill: i64) -> [i64; 3] {
    let mut out = [fill; 3];
    let shift = 3 - v.len();
    out[shift..].copy_from_slice(v);
    out
}

/// The spatial axes of an image or filter (dims `[_, _, spatial...]`), with divisor `div` and
/// base `base` per spatial dim.
fn axes(d: &TensorDesc, div: &[i64], base: &[i64]) -> [Axis; 3] {
    let r = d.dims.len() - 2;
    let mut out = [Axis::unit(), Axis::unit(), Axis::unit()];
    for s in 0..r {
        out[3 - r + s] = Axis { extent: d.dims[2 + s], stride: d.strides[2 + s], div: div[s], base: base[s] };
    }
    out
}

/// The convolution node `ni` as a matmul over gathered operands, when its tensors allow: one
/// group, rank 3-5, non-negative strides, and for the weight gradient cross-correlation and a
/// filter whose taps and channels lie in one run.
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
    let (n, c, k) = (xd.dims[0], xd.dims[1], wd.dims[0]);
    // One group; the output's dims as the forward convolution makes them.
    if wd.dims[1] != c || yd.dims[0] != n || yd.dims[1] != k || attrs.forward_dims(&xd.dims, &wd.dims, "x", "w").ok()? != yd.dims {
        return None;
    }
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
    let (gathers, m, kk, nn) = match kind {
        0 | 1 => {
            let tap_major = act_ch_stride == 1;
            let (ga, gb, mn_ch, red_ch) = if kind == 0 {
                let ga = Gather {
                    mn: Index::Pixel { n_stride: xd.strides[0], grid: slots(&yd.dims[2..], 1), mul: slots(&attrs.stride, 0), off: slots(&neg(&attrs.pre_padding), 0) },
                    k: Index::Taps { taps: t3, channels: c, ch_stride: xd.strides[1], tap_major, dil: slots(&attrs.dilation, 0) },
                    axes: axes(xd, &ones, &zeros),
                };
                let gb = Gather {
                    mn: Index::Plain { stride: wd.strides[0] },
                    k: Index::Taps { taps: t3, channels: c, ch_stride: wd.strides[1], tap_major, dil: slots(&filter_dil, 0) },
                    axes: axes(wd, &ones, &filter_base),
                };
                (ga, gb, k, c)
            } else {
                let ga = Gather {
                    mn: Index::Pixel { n_stride: yd.strides[0], grid: slots(&xd.dims[2..], 1), mul: slots(&ones, 0), off: slots(&attrs.pre_padding, 0) },
                    k: Index::Taps { taps: t3, channels: k, ch_stride: yd.strides[1], tap_major, dil: slots(&neg(&attrs.dilation), 0) },
                    axes: axes(yd, &attrs.stride, &zeros),
                };
                let gb = Gather {
                    mn: Index::Plain { stride: wd.strides[1] },
                    k: Index::Taps { taps: t3, channels: k, ch_stride: wd.strides[0], tap_major, dil: slots(&filter_dil, 0) },
                    axes: axes(wd, &ones, &filter_base),
                };
                (ga, gb, c, k)
            };
            // The output as rows (its images' pixels) x channels, one GEMM batch per image
            // unless every tensor of the epilogue flattens images and pixels into one run.
            let od = graph.desc(out);
            view.tensors[out.0] = image_view(od, &od.dims)?;
            let viewed = view_epilogue(graph, &mut view, out, &od.dims, &[a, b]);
            let pixels: i64 = od.dims[2..].iter().product();
            let flat = flatten(&mut view, &viewed, n, pixels);
            let m = if flat { n * pixels } else { pixels };
            ((ga, gb), m, taps.iter().product::<i64>() * red_ch, mn_ch)
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
            };
            let x_side = Gather {
                mn: Index::Taps { taps: t3, channels: c, ch_stride: xd.strides[1], tap_major, dil: slots(&attrs.dilation, 0) },
                k: Index::Pixel { n_stride: xd.strides[0], grid: slots(&yd.dims[2..], 1), mul: slots(&attrs.stride, 0), off: slots(&neg(&attrs.pre_padding), 0) },
                axes: axes(xd, &ones, &zeros),
            };
            let pixels: i64 = n * yd.dims[2..].iter().product::<i64>();
            // dw^T = x^T dy, the longer side (taps and channels) along the tiles' 128 rows, where
            // K alone would not fill them or the reduction is long enough to hide dw^T's
            // column-major stores; over few pixels dw is stored row-major (measured on the H100,
            // 3x3 1280 -> 1280 over 2 x 8 x 8 pixels: 0.0180 ms instead of 0.0293; over 2 x 16 x
            // 16, dw^T stays faster: 0.0398 against 0.0495).
            if cols > k && (k < 128 || pixels >= 512) {
                view.tensors[out.0] = matrix(wd, (cols, col_stride), (k, wd.strides[0]));
                let node = &mut view.nodes[ni];
                node.op = Op::Matmul(MatmulAttrs {});
                node.inputs = vec![Port { name: "a".into(), tensor: b }, Port { name: "b".into(), tensor: a }];
                node.outputs = vec![Port { name: "c".into(), tensor: out }];
                view.tensors[b.0] = TensorDesc { dims: vec![cols, pixels], strides: vec![pixels, 1], ..graph.desc(b).clone() };
                view.tensors[a.0] = TensorDesc { dims: vec![pixels, k], strides: vec![k, 1], ..graph.desc(a).clone() };
                return Some(View { graph: view, gathers: Some(Gathers { node: ni, a: x_side, b: dy_side }), stage: None });
            }
            view.tensors[out.0] = matrix(wd, (k, wd.strides[0]), (cols, col_stride));
            ((dy_side, x_side), k, pixels, cols)
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
    Some(View { graph: view, gathers: Some(Gathers { node: ni, a: ga, b: gb }), stage: None })
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

    #[test]
    fn grouped_and_mirrored_weight_gradients_are_declined() {
        let mut g = Graph::new("grp").io_data_type(DataType::F16);
        let x = g.tensor(nhwc("x", &[2, 16, 9, 11]));
        let w = g.tensor(nhwc("w", &[16, 8, 3, 3]));
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
