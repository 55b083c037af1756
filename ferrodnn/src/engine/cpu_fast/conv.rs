//! Convolution as im2col blocks and the GEMM ([`super::gemm`]): forward, data gradient and
//! weight gradient, 1-3 spatial dims, any stride, dilation, padding and groups, both modes, any
//! layout (NCHW, channels-last, other strides).
//!
//! With image `x [n, c, i...]`, filter `w [k, c/groups, f...]` and output `y [n, k, o...]`, the
//! output pixels of all images are numbered `q = n * P + p` (`P` output pixels an image) and
//! taken in blocks of `rows`; a block's im2col matrix `col [rows, T * Cg]` holds, per pixel, the
//! image values each filter tap reads (tap-major, channel inner; zero in the padding), and the
//! filter is packed once per run as `wp [k, T * Cg]` in the same order (flipped taps in
//! convolution mode). Per group:
//! - forward: `y_block [rows, Kg] = col x wp_g^T`, then the epilogue writes the tile to `y`;
//! - data gradient: `dcol [rows, T * Cg] = dy_block x wp_g`, added back onto the image pixels
//!   each tap read (col2im, threads splitting the channels) in an f32 accumulator of `dx`;
//! - weight gradient: `dw_g [Kg, T * Cg] += dy_block^T x col`, the blocks summed in order.
//!
//! Workspace (f32): the packed filter or the weight-gradient accumulator, one block's im2col
//! matrix, one block's output tile or `dy` block, and for the data gradient the accumulator of
//! one group of `dx`. Blocks hold at most [`COL_VALUES`] values.
//!
//! On a machine with AVX-512, a 2-D forward convolution of one group and at most
//! [`conv_direct::MAX_TAPS`] taps runs on the direct kernel of [`conv_direct`] instead (no im2col
//! matrix; its own workspace).

use super::conv_direct::{self, DirectConv};
use super::epilogue::{find_chain, BoundEpilogue, Chain};
use super::gemm::{gemm_f32, Mat};
use super::tensor::{store_rows, Load, LoadBf16, LoadF16, LoadF32, Src};
use super::{check_tensor, Exec};
use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::ops::conv::{ConvAttrs, ConvMode};
use crate::graph::ops::Op;
use crate::graph::{Graph, TensorId};
use crate::layout::unravel;
use rayon::prelude::*;
use std::collections::HashMap;

/// The most values of an im2col block (8 MiB of f32).
const COL_VALUES: usize = 1 << 21;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Fprop,
    Dgrad,
    Wgrad,
}

pub(crate) struct ConvStep {
    pub node: usize,
    kind: Kind,
    /// The image-side tensor read (x for fprop and wgrad; unused for dgrad).
    x: Option<TensorId>,
    w: Option<TensorId>,
    dy: Option<TensorId>,
    /// The node's own output (y, dx or dw) and the tensor the step writes (after the chain).
    anchor: TensorId,
    out: TensorId,
    pub chain: Chain,
    geo: Geometry,
    rows: usize,
    /// The direct AVX-512 forward kernel, when it takes this convolution.
    direct: Option<DirectConv>,
    pub workspace_f32: usize,
}

/// The sizes of one convolution.
#[derive(Clone, Debug)]
struct Geometry {
    n: usize,
    k: usize,
    cg: usize,
    kg: usize,
    groups: usize,
    in_sp: Vec<usize>,
    out_sp: Vec<usize>,
    /// Pixels of one image (input and output).
    in_total: usize,
    out_total: usize,
    taps: usize,
    /// The reduction length `taps * cg`.
    r: usize,
    pre: Vec<isize>,
    stride: Vec<isize>,
    dilation: Vec<isize>,
    /// Each tap's logical multi-index, and the multi-index at which the filter stores its weight.
    tap: Vec<Vec<usize>>,
    stored: Vec<Vec<usize>>,
}

impl Geometry {
    fn new(image: &[usize], filter: &[usize], out: &[usize], a: &ConvAttrs) -> std::result::Result<Geometry, String> {
        let to_i64 = |d: &[usize]| d.iter().map(|&v| v as i64).collect::<Vec<i64>>();
        let want = a.forward_dims(&to_i64(image), &to_i64(filter), "image", "filter")?;
        if want != to_i64(out) {
            return Err(format!("internal: image {image:?} and filter {filter:?} give {want:?}, not {out:?}"));
        }
        let sr = image.len() - 2;
        let (c, cg, k) = (image[1], filter[1], filter[0]);
        if cg == 0 || c % cg != 0 {
            return Err(format!("internal: {c} channels in groups of {cg}"));
        }
        let groups = c / cg;
        let f_sp = filter[2..].to_vec();
        let taps: usize = f_sp.iter().product();
        let mut tap = Vec::with_capacity(taps);
        let mut stored = Vec::with_capacity(taps);
        let mut f = vec![0usize; sr];
        for t in 0..taps {
            unravel(t, &f_sp, &mut f);
            tap.push(f.clone());
            stored.push((0..sr).map(|d| if a.mode == ConvMode::Convolution { f_sp[d] - 1 - f[d] } else { f[d] }).collect());
        }
        Ok(Geometry {
            n: image[0],
            k,
            cg,
            kg: k / groups,
            groups,
            in_sp: image[2..].to_vec(),
            out_sp: out[2..].to_vec(),
            in_total: image[2..].iter().product(),
            out_total: out[2..].iter().product(),
            taps,
            r: taps * cg,
            pre: a.pre_padding.iter().map(|&v| v as isize).collect(),
            stride: a.stride.iter().map(|&v| v as isize).collect(),
            dilation: a.dilation.iter().map(|&v| v as isize).collect(),
            tap,
            stored,
        })
    }
}

fn udims(g: &Graph, t: TensorId) -> Vec<usize> {
    g.desc(t).dims.iter().map(|&x| x as usize).collect()
}

impl ConvStep {
    pub fn plan(g: &Graph, ni: usize, a: &ConvAttrs, consumers: &HashMap<usize, Vec<usize>>, produced: &HashMap<usize, usize>) -> std::result::Result<ConvStep, String> {
        let node = &g.nodes[ni];
        if g.compute_type(node) != DataType::F32 {
            return Err(format!("compute type {} (the fast kernels compute in f32)", g.compute_type(node)));
        }
        let port = |p: &str| node.input(p).or_else(|| node.output(p)).ok_or_else(|| format!("port `{p}` is missing"));
        let (kind, x, w, dy, anchor) = match node.op {
            Op::ConvFprop(_) => (Kind::Fprop, Some(port("x")?), Some(port("w")?), None, port("y")?),
            Op::ConvDgrad(_) => (Kind::Dgrad, None, Some(port("w")?), Some(port("dy")?), port("dx")?),
            _ => (Kind::Wgrad, Some(port("x")?), None, Some(port("dy")?), port("dw")?),
        };
        for t in [x, w, dy].into_iter().flatten() {
            check_tensor(g, t, false)?;
        }
        check_tensor(g, anchor, true)?;
        let geo = match kind {
            Kind::Fprop => Geometry::new(&udims(g, x.unwrap_or(anchor)), &udims(g, w.unwrap_or(anchor)), &udims(g, anchor), a),
            Kind::Dgrad => Geometry::new(&udims(g, anchor), &udims(g, w.unwrap_or(anchor)), &udims(g, dy.unwrap_or(anchor)), a),
            Kind::Wgrad => Geometry::new(&udims(g, x.unwrap_or(anchor)), &udims(g, anchor), &udims(g, dy.unwrap_or(anchor)), a),
        }?;
        let (chain, out) = if kind == Kind::Fprop { find_chain(g, anchor, consumers, produced) } else { (Chain::default(), anchor) };
        check_tensor(g, out, true)?;
        let q = geo.n * geo.out_total;
        let rows = (COL_VALUES / geo.r.max(1)).clamp(16, 8192).min(q).max(1);
        let direct = if kind == Kind::Fprop { direct_plan(g, &geo, x.unwrap_or(anchor), out, chain.links.is_empty()) } else { None };
        let filter = geo.k * geo.r;
        let workspace_f32 = match kind {
            _ if direct.is_some() => direct.as_ref().map_or(0, |d| d.workspace_f32()),
            Kind::Fprop => filter + rows * geo.r + rows * geo.kg,
            Kind::Dgrad => filter + rows * geo.r + rows * geo.kg + geo.n * geo.in_total * geo.cg,
            Kind::Wgrad => filter + rows * geo.r + rows * geo.kg,
        };
        Ok(ConvStep { node: ni, kind, x, w, dy, anchor, out, chain, geo, rows, direct, workspace_f32 })
    }

    pub fn describe(&self) -> String {
        let g = &self.geo;
        let what = match self.kind {
            Kind::Fprop => "forward",
            Kind::Dgrad => "data gradient",
            Kind::Wgrad => "weight gradient",
        };
        if self.direct.is_some() {
            return format!("{what}: direct AVX-512 kernel, {} x {} channels, {} taps", g.cg, g.k, g.taps);
        }
        format!("{what}: im2col blocks of {} pixels and the GEMM, {} groups of {} x {} channels, {} taps", self.rows, g.groups, g.cg, g.kg, g.taps)
    }

    pub fn run(&self, ex: &mut Exec) -> Result<()> {
        let x = self.x.map(|t| ex.src(t)).transpose()?;
        let w = self.w.map(|t| ex.src(t)).transpose()?;
        let dy = self.dy.map(|t| ex.src(t)).transpose()?;
        let epi = ex.bind(self.anchor, &self.chain)?;
        ex.with_dst(self.out, |dst, ws| {
            if let (Some(d), Some(x), Some(w)) = (&self.direct, &x, &w) {
                d.run(x, w, dst, &epi, ws);
                return Ok(());
            }
            let geo = &self.geo;
            let (filter, rest) = ws.split_at_mut(geo.k * geo.r);
            let (col, rest) = rest.split_at_mut(self.rows * geo.r);
            let (tile, rest) = rest.split_at_mut(self.rows * geo.kg);
            match self.kind {
                Kind::Fprop => {
                    let (x, w) = (x.as_ref().expect("fprop has x"), w.as_ref().expect("fprop has w"));
                    pack_filter(geo, w, filter);
                    self.fprop(x, filter, col, tile, dst, &epi);
                }
                Kind::Dgrad => {
                    let (dy, w) = (dy.as_ref().expect("dgrad has dy"), w.as_ref().expect("dgrad has w"));
                    pack_filter(geo, w, filter);
                    let acc = &mut rest[..geo.n * geo.in_total * geo.cg];
                    self.dgrad(dy, filter, col, tile, acc, dst);
                }
                Kind::Wgrad => {
                    let (x, dy) = (x.as_ref().expect("wgrad has x"), dy.as_ref().expect("wgrad has dy"));
                    self.wgrad(x, dy, filter, col, tile, dst);
                }
            }
            Ok(())
        })
    }

    fn fprop(&self, x: &Src, wp: &[f32], col: &mut [f32], tile: &mut [f32], dst: &super::tensor::Dst, epi: &BoundEpilogue) {
        let geo = &self.geo;
        let (r, kg) = (geo.r, geo.kg);
        let q_total = geo.n * geo.out_total;
        let threads = rayon::current_num_threads();
        // A one-tap filter with unit stride and no padding reads the image itself as the im2col
        // matrix (pixels as rows), when the image is f32 and its pixels one stride apart; an
        // output with no epilogue that is f32 with its pixels one stride apart is written by the
        // GEMM directly. A view whose images do not follow each other at that stride takes
        // blocks within one image.
        // Measured on ResNet-50's layers: the GEMM writing the output in place pays only where
        // it also reads the image in place (with im2col, a tile in cache is faster), and blocks
        // within one image pay only for images of 2048 pixels or more.
        let one_tap = geo.taps == 1 && geo.in_sp == geo.out_sp && geo.pre.iter().all(|&p| p == 0) && geo.stride.iter().all(|&s| s == 1);
        let mut x_view = if one_tap { x.f32_ptr().and_then(|p| pixel_view(&x.strides, &geo.in_sp, geo.n).map(|v| (p, v))) } else { None };
        let mut y_view = if x_view.is_some() && epi.is_empty() { dst.f32_ptr().and_then(|p| pixel_view(&dst.strides, &geo.out_sp, geo.n).map(|v| (p, v))) } else { None };
        let mut per_image = [x_view.map(|(_, v)| v), y_view.map(|(_, v)| v)].into_iter().flatten().any(|(_, uniform)| !uniform);
        if per_image && geo.out_total < 2048 {
            (x_view, y_view, per_image) = (None, None, false);
        }
        for grp in 0..geo.groups {
            let mut q0 = 0;
            while q0 < q_total {
                let (n, p0) = (q0 / geo.out_total, q0 % geo.out_total);
                let rows = if per_image { self.rows.min(geo.out_total - p0) } else { self.rows.min(q_total - q0) };
                let lhs = match x_view {
                    // SAFETY: pixel p0 of image n, channel grp * cg: an element of x.
                    Some((p, (sp, _))) => {
                        Mat { ptr: unsafe { p.offset(n as isize * x.strides[0] + (grp * geo.cg) as isize * x.strides[1] + p0 as isize * sp) }, rs: sp, cs: x.strides[1] }
                    }
                    None => {
                        im2col(geo, x, grp, q0, rows, col);
                        Mat { ptr: col.as_ptr(), rs: r as isize, cs: 1 }
                    }
                };
                let rhs = Mat { ptr: wp[grp * kg * r..].as_ptr(), rs: 1, cs: r as isize };
                if let Some((p, (sp, _))) = y_view {
                    // SAFETY: the block's rows x kg outputs (pixels p0.. of image n, channels
                    // grp * kg..) are elements of y, one stride apart as the view says; the
                    // block writes only them.
                    unsafe {
                        let out = p.offset(n as isize * dst.strides[0] + (grp * kg) as isize * dst.strides[1] + p0 as isize * sp);
                        gemm_f32(rows, kg, r, out, sp, dst.strides[1], &lhs, &rhs, false, threads);
                    }
                    q0 += rows;
                    continue;
                }
                // SAFETY: lhs is rows x r (the im2col block or the image's pixels), the group's
                // packed filter kg x r read transposed, the tile rows x kg: all in bounds.
                unsafe { gemm_f32(rows, kg, r, tile.as_mut_ptr(), kg as isize, 1, &lhs, &rhs, false, threads) };
                let out_sp = &geo.out_sp;
                store_rows(
                    tile,
                    rows,
                    kg,
                    1,
                    |i, idx: &mut [usize]| {
                        let q = q0 + i;
                        idx[0] = q / geo.out_total;
                        idx[1] = grp * kg;
                        unravel(q % geo.out_total, out_sp, &mut idx[2..]);
                        i * kg
                    },
                    dst,
                    epi,
                );
                q0 += rows;
            }
        }
    }

    fn dgrad(&self, dy: &Src, wp: &[f32], dcol: &mut [f32], dyb: &mut [f32], acc: &mut [f32], dst: &super::tensor::Dst) {
        let geo = &self.geo;
        let (r, kg, cg) = (geo.r, geo.kg, geo.cg);
        let q_total = geo.n * geo.out_total;
        let threads = rayon::current_num_threads();
        for grp in 0..geo.groups {
            acc.par_iter_mut().for_each(|v| *v = 0.0);
            let mut q0 = 0;
            while q0 < q_total {
                let rows = self.rows.min(q_total - q0);
                gather_dy(geo, dy, grp, q0, rows, dyb);
                // SAFETY: dy block rows x kg, the group's packed filter kg x r, dcol rows x r.
                unsafe {
                    let lhs = Mat { ptr: dyb.as_ptr(), rs: kg as isize, cs: 1 };
                    let rhs = Mat { ptr: wp.as_ptr().add(grp * kg * r), rs: r as isize, cs: 1 };
                    gemm_f32(rows, r, kg, dcol.as_mut_ptr(), r as isize, 1, &lhs, &rhs, false, threads);
                }
                col2im(geo, q0, rows, dcol, acc);
                q0 += rows;
            }
            let in_sp = &geo.in_sp;
            store_rows(
                acc,
                geo.n * geo.in_total,
                cg,
                1,
                |i, idx: &mut [usize]| {
                    idx[0] = i / geo.in_total;
                    idx[1] = grp * cg;
                    unravel(i % geo.in_total, in_sp, &mut idx[2..]);
                    i * cg
                },
                dst,
                &BoundEpilogue::none(),
            );
        }
    }

    fn wgrad(&self, x: &Src, dy: &Src, acc: &mut [f32], col: &mut [f32], dyb: &mut [f32], dst: &super::tensor::Dst) {
        let geo = &self.geo;
        let (r, kg, cg) = (geo.r, geo.kg, geo.cg);
        let q_total = geo.n * geo.out_total;
        let threads = rayon::current_num_threads();
        acc.par_iter_mut().for_each(|v| *v = 0.0);
        for grp in 0..geo.groups {
            let mut q0 = 0;
            while q0 < q_total {
                let rows = self.rows.min(q_total - q0);
                im2col(geo, x, grp, q0, rows, col);
                gather_dy(geo, dy, grp, q0, rows, dyb);
                // SAFETY: dy block read transposed (kg x rows), col rows x r, the group's
                // accumulator kg x r.
                unsafe {
                    let lhs = Mat { ptr: dyb.as_ptr(), rs: 1, cs: kg as isize };
                    let rhs = Mat { ptr: col.as_ptr(), rs: r as isize, cs: 1 };
                    gemm_f32(kg, r, rows, acc.as_mut_ptr().add(grp * kg * r), r as isize, 1, &lhs, &rhs, true, threads);
                }
                q0 += rows;
            }
        }
        // Rows (k, tap) of cg channels each, to dw[k, c, stored tap].
        let taps = geo.taps;
        store_rows(
            acc,
            geo.k * taps,
            cg,
            1,
            |i, idx: &mut [usize]| {
                let (k, t) = (i / taps, i % taps);
                idx[0] = k;
                idx[1] = 0;
                idx[2..].copy_from_slice(&geo.stored[t]);
                k * r + t * cg
            },
            dst,
            &BoundEpilogue::none(),
        );
    }
}

/// The direct kernel's plan for a forward convolution, when it takes it: a machine with
/// AVX-512, 2 spatial dims, one group, at most [`conv_direct::MAX_TAPS`] taps.
fn direct_plan(g: &Graph, geo: &Geometry, x: TensorId, out: TensorId, no_epilogue: bool) -> Option<DirectConv> {
    if !conv_direct::available() || geo.in_sp.len() != 2 || geo.groups != 1 || geo.taps > conv_direct::MAX_TAPS {
        return None;
    }
    let strides = |t: TensorId| g.desc(t).strides.iter().map(|&s| s as isize).collect::<Vec<_>>();
    let x_type = g.resolved_data_type(x).unwrap_or(DataType::F32);
    let in_place = !g.desc(x).is_virtual && conv_direct::channels_last_f32(x_type, &strides(x));
    let (oh, ow) = (geo.out_sp[0], geo.out_sp[1]);
    let os = strides(out);
    let out_type = g.resolved_data_type(out).unwrap_or(DataType::F32);
    // Pixel q = (n * OH + oh) * OW + ow at q * ldo, channels one apart.
    let direct_out = no_epilogue
        && !g.desc(out).is_virtual
        && out_type == DataType::F32
        && os[1] == 1
        && os[3] >= geo.k as isize
        && os[2] == os[3] * ow as isize
        && os[0] == os[2] * oh as isize;
    let d = |v: &[usize], i: usize| v[i] as isize;
    // NCHW with each image's pixels one apart (h, w flattened), images of 128 pixels or more
    // (a 7x7 image fills 49 of 64 vector lanes: packed to channels-last it runs faster, also
    // with the batch folded into the pixels).
    let pixels_packed = |s: &[isize], w: usize| s[3] == 1 && s[2] == w as isize;
    let nchw_1x1 = geo.taps == 1
        && geo.stride.iter().all(|&s| s == 1)
        && geo.pre.iter().all(|&p| p == 0)
        && geo.in_sp == geo.out_sp
        && geo.k.is_multiple_of(8)
        && x_type == DataType::F32
        && !g.desc(x).is_virtual
        && pixels_packed(&strides(x), geo.in_sp[1])
        && no_epilogue
        && out_type == DataType::F32
        && !g.desc(out).is_virtual
        && pixels_packed(&os, ow)
        && geo.out_total >= 128;
    Some(DirectConv {
        n: geo.n,
        c: geo.cg,
        k: geo.k,
        h: geo.in_sp[0],
        w: geo.in_sp[1],
        oh,
        ow,
        taps: geo.tap.iter().map(|f| (d(f, 0) * geo.dilation[0], d(f, 1) * geo.dilation[1])).collect(),
        stored: geo.stored.iter().map(|f| (f[0], f[1])).collect(),
        stride: (geo.stride[0], geo.stride[1]),
        pre: (geo.pre[0], geo.pre[1]),
        in_place,
        direct_out,
        nchw_1x1,
    })
}

/// The stride between consecutive pixels of an image in a tensor with `strides` (dims
/// `[n, c, spatial...]`), when its spatial dims flatten to one stride; and whether the images
/// follow each other at that stride too (pixel `q = n * P + p` at `q * stride`).
fn pixel_view(strides: &[isize], sp: &[usize], batch: usize) -> Option<(isize, bool)> {
    // Dims of size 1 take no part (their strides are arbitrary).
    let dims: Vec<(usize, isize)> = sp.iter().zip(&strides[2..]).filter(|(&n, _)| n > 1).map(|(&n, &s)| (n, s)).collect();
    let Some(&(_, last)) = dims.last() else {
        // One pixel an image: consecutive pixels are consecutive images.
        return Some((strides[0], true));
    };
    if dims.windows(2).any(|w| w[0].1 != w[1].1 * w[1].0 as isize) {
        return None;
    }
    let pixels: usize = sp.iter().product();
    Some((last, batch == 1 || strides[0] == last * pixels as isize))
}

/// `wp[k, t * cg + c] = w[k, c, stored(t)]`.
fn pack_filter(geo: &Geometry, w: &Src, wp: &mut [f32]) {
    let (r, cg) = (geo.r, geo.cg);
    wp[..geo.k * r].par_chunks_mut(r).enumerate().for_each(|(k, row)| {
        for t in 0..geo.taps {
            let sp: isize = geo.stored[t].iter().zip(&w.strides[2..]).map(|(&i, &s)| i as isize * s).sum();
            for c in 0..cg {
                // SAFETY: (k, c, stored tap) is an element of the filter.
                row[t * cg + c] = unsafe { w.load(k as isize * w.strides[0] + c as isize * w.strides[1] + sp) };
            }
        }
    });
}

/// The im2col rows of output pixels `q0..q0 + rows` for group `grp`: `col[i, t * cg + c]`.
fn im2col(geo: &Geometry, x: &Src, grp: usize, q0: usize, rows: usize, col: &mut [f32]) {
    match x.dtype {
        DataType::F32 => im2col_typed::<LoadF32>(geo, x, grp, q0, rows, col),
        DataType::F16 => im2col_typed::<LoadF16>(geo, x, grp, q0, rows, col),
        _ => im2col_typed::<LoadBf16>(geo, x, grp, q0, rows, col),
    }
}

fn im2col_typed<L: Load>(geo: &Geometry, x: &Src, grp: usize, q0: usize, rows: usize, col: &mut [f32]) {
    let (r, cg, sr) = (geo.r, geo.cg, geo.in_sp.len());
    let (xs_n, xs_c) = (x.strides[0], x.strides[1]);
    let xs_sp = &x.strides[2..];
    let ptr = x.raw() as usize;
    col[..rows * r].par_chunks_mut(r).enumerate().for_each_init(
        || vec![0usize; sr],
        |o, (i, row)| {
            let ptr = ptr as *const u8;
            let q = q0 + i;
            let (n, p) = (q / geo.out_total, q % geo.out_total);
            unravel(p, &geo.out_sp, o);
            let base = n as isize * xs_n + (grp * cg) as isize * xs_c;
            for t in 0..geo.taps {
                let f = &geo.tap[t];
                let mut off = base;
                let mut inside = true;
                for d in 0..sr {
                    let pos = o[d] as isize * geo.stride[d] - geo.pre[d] + f[d] as isize * geo.dilation[d];
                    if pos < 0 || pos >= geo.in_sp[d] as isize {
                        inside = false;
                        break;
                    }
                    off += pos * xs_sp[d];
                }
                let out = &mut row[t * cg..t * cg + cg];
                if !inside {
                    out.fill(0.0);
                } else if xs_c == 1 {
                    for (c, v) in out.iter_mut().enumerate() {
                        // SAFETY: (n, grp * cg + c, pos) is an element of the image.
                        *v = unsafe { L::load(ptr, off + c as isize) };
                    }
                } else {
                    for (c, v) in out.iter_mut().enumerate() {
                        // SAFETY: as above.
                        *v = unsafe { L::load(ptr, off + c as isize * xs_c) };
                    }
                }
            }
        },
    );
}

/// `dyb[i, kk] = dy[n, grp * kg + kk, p]` for output pixels `q0 + i`.
fn gather_dy(geo: &Geometry, dy: &Src, grp: usize, q0: usize, rows: usize, dyb: &mut [f32]) {
    let kg = geo.kg;
    let sr = geo.out_sp.len();
    dyb[..rows * kg].par_chunks_mut(kg).enumerate().for_each_init(
        || vec![0usize; sr],
        |o, (i, row)| {
            let q = q0 + i;
            let (n, p) = (q / geo.out_total, q % geo.out_total);
            unravel(p, &geo.out_sp, o);
            let base = n as isize * dy.strides[0] + (grp * kg) as isize * dy.strides[1] + o.iter().zip(&dy.strides[2..]).map(|(&i, &s)| i as isize * s).sum::<isize>();
            for (kk, v) in row.iter_mut().enumerate() {
                // SAFETY: (n, grp * kg + kk, o) is an element of dy.
                *v = unsafe { dy.load(base + kk as isize * dy.strides[1]) };
            }
        },
    );
}

/// Adds each `dcol[i, t * cg + c]` of output pixels `q0 + i` onto the image pixel tap `t` read,
/// `acc[(n * in_total + pixel) * cg + c]`; threads split the channels, so none write the same
/// value.
fn col2im(geo: &Geometry, q0: usize, rows: usize, dcol: &[f32], acc: &mut [f32]) {
    let (r, cg, sr) = (geo.r, geo.cg, geo.in_sp.len());
    let threads = rayon::current_num_threads();
    let parts = if cg >= 32 { threads.min(cg / 16).max(1) } else { 1 };
    let per = cg.div_ceil(parts);
    let acc_addr = acc.as_mut_ptr() as usize;
    (0..parts).into_par_iter().for_each(|part| {
        let (c0, c1) = (part * per, ((part + 1) * per).min(cg));
        let mut o = vec![0usize; sr];
        for i in 0..rows {
            let q = q0 + i;
            let (n, p) = (q / geo.out_total, q % geo.out_total);
            unravel(p, &geo.out_sp, &mut o);
            for t in 0..geo.taps {
                let f = &geo.tap[t];
                let mut pix = 0usize;
                let mut inside = true;
                for d in 0..sr {
                    let pos = o[d] as isize * geo.stride[d] - geo.pre[d] + f[d] as isize * geo.dilation[d];
                    if pos < 0 || pos >= geo.in_sp[d] as isize {
                        inside = false;
                        break;
                    }
                    pix = pix * geo.in_sp[d] + pos as usize;
                }
                if !inside {
                    continue;
                }
                let src = &dcol[i * r + t * cg..i * r + t * cg + cg];
                let at = (n * geo.in_total + pix) * cg;
                for c in c0..c1 {
                    // SAFETY: `at + c` is inside acc (n < N, pix < in_total, c < cg); each part
                    // writes only its own channels c0..c1, so no two threads write one value.
                    unsafe { *(acc_addr as *mut f32).add(at + c) += src[c] };
                }
            }
        }
    });
}
