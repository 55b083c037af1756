//! Strided data gradients by sub-pixel phases. With stride `s` (per spatial dim), an input pixel
//! `i = s * j + ph` receives from tap `t` only when `i + pre - t` is a multiple of `s`, that is
//! only from the taps `t = t0 + s * u` with `t0 = (ph + pre) mod s`. The implicit GEMM of the
//! whole data gradient ([`super::implicit`]) walks every tap for every pixel and multiplies the
//! zeros of the others (three of four for a 3x3 filter of stride 2, and all but the first for a
//! strided 1x1). Here each phase `ph` (one per combination of the dims' residues) is its own
//! GEMM over its pixels `j` and its taps `u` alone, a unit-stride correlation of dy with the
//! filter's taps of that residue:
//!
//! `dx[n, s * j + ph, c] = sum_(u, k) dy[n, j + (ph + pre - t0) / s - u, k] * w[k, c, t0 + s * u]`.
//!
//! Each phase's GEMM writes its pixels as a packed matrix (rows `(n, j)`, the image's channels
//! as columns) into the node's scratch, and a copy kernel (`stage.cuh`, `STAGE_COPY`) places
//! them at their positions in dx, any strides; a phase with no tap (a 1x1 filter's odd pixels)
//! is a copy of zeros. Only for a data gradient alone (no epilogue: its tensors would be read at
//! the phases' pixels), one group, unit dilation, and at least 16 image channels (fewer run as
//! dcol + col2im, [`super::stage`]).

use super::implicit::{axes, slots};
use super::stage::{copy_launch, Copy, Stage};
use crate::engine::cuda::gemm;
use crate::engine::cuda::gemm::gather::{Gather, Gathers, Index};
use crate::engine::cuda::kernel::{Arg, NodeKernels, Options, Target, Unaligned, Unit};
use crate::error::Result;
use crate::graph::ops::conv::ConvMode;
use crate::graph::ops::matmul::MatmulAttrs;
use crate::graph::ops::Op;
use crate::graph::{Graph, Port, TensorDesc};

/// Image channels from which a strided data gradient runs by phases.
const MIN_CHANNELS: i64 = 16;

/// One phase along one spatial dim: the pixels `s * j + ph` (`pixels` of them), their taps
/// `first + s * u` (`taps` of them), and the offset of `j`'s dy coordinate (`j + off - u`).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Dim {
    pixels: i64,
    first: i64,
    taps: i64,
    off: i64,
}

/// Phase `ph` of a dim of `extent` input pixels, `taps` filter taps, stride `s` and leading
/// padding `pre`.
fn dim(extent: i64, taps: i64, s: i64, pre: i64, ph: i64) -> Dim {
    let first = (ph + pre).rem_euclid(s);
    let pixels = if ph < extent { (extent - ph + s - 1) / s } else { 0 };
    let n = if first < taps { (taps - first + s - 1) / s } else { 0 };
    Dim { pixels, first, taps: n, off: (ph + pre - first).div_euclid(s) }
}

/// Whether convolution node `ni` is a data gradient this path takes (see the module doc).
fn applies(graph: &Graph, ni: usize) -> bool {
    let node = &graph.nodes[ni];
    let Op::ConvDgrad(a) = &node.op else { return false };
    let (Some(dy), Some(w), Some(dx)) = (node.input("dy"), node.input("w"), node.output("dx")) else { return false };
    let (yd, wd, xd) = (graph.desc(dy), graph.desc(w), graph.desc(dx));
    let rank = xd.dims.len();
    let well_formed = |d: &TensorDesc| d.dims.len() == rank && d.strides.len() == rank && d.strides.iter().all(|&s| s >= 0) && d.dims.iter().all(|&e| e > 0);
    (3..=5).contains(&rank)
        && [yd, wd, xd].into_iter().all(well_formed)
        && a.stride.len() == rank - 2
        && a.stride.iter().any(|&s| s > 1)
        && a.stride.iter().all(|&s| s >= 1)
        && a.dilation.iter().all(|&d| d == 1)
        && wd.dims[1] == xd.dims[1]
        && wd.dims[0] == yd.dims[1]
        && xd.dims[1] >= MIN_CHANNELS
        && a.forward_dims(&xd.dims, &wd.dims, "dx", "w").ok().as_deref() == Some(&yd.dims[..])
}

/// The unit of data-gradient node `ni` run by phases, when this path takes it and the GEMM
/// kernels take every phase.
pub fn unit(graph: &Graph, ni: usize, target: &Target, options: &Options) -> Result<Option<Unit>> {
    if !applies(graph, ni) {
        return Ok(None);
    }
    let node = &graph.nodes[ni];
    let Op::ConvDgrad(attrs) = &node.op else { return Ok(None) };
    let (dy, w, dx) = (node.input("dy").expect("checked"), node.input("w").expect("checked"), node.output("dx").expect("checked"));
    let (yd, wd, xd) = (graph.desc(dy), graph.desc(w), graph.desc(dx));
    let Some(dt) = graph.resolved_data_type(dx) else { return Ok(None) };
    let r = xd.dims.len() - 2;
    let (n, c, k) = (xd.dims[0], xd.dims[1], wd.dims[0]);
    let flip = attrs.mode == ConvMode::Convolution;
    let tap_major = yd.strides[1] == 1;
    // Every combination of the dims' residues, the last dim fastest.
    let phases: i64 = attrs.stride.iter().product();
    let mut kernels = NodeKernels { launches: Vec::new(), scratch: Vec::new() };
    let mut alt: Option<(Vec<crate::graph::TensorId>, NodeKernels)> = None;
    let mut copies = Vec::new();
    for p in 0..phases {
        let mut rest = p;
        let mut ph = vec![0; r];
        for d in (0..r).rev() {
            ph[d] = rest % attrs.stride[d];
            rest /= attrs.stride[d];
        }
        let dims: Vec<Dim> = (0..r).map(|d| dim(xd.dims[2 + d], wd.dims[2 + d], attrs.stride[d], attrs.pre_padding[d], ph[d])).collect();
        if dims.iter().any(|d| d.pixels == 0) {
            continue;
        }
        let grid: Vec<i64> = dims.iter().map(|d| d.pixels).collect();
        let pixels: i64 = grid.iter().product();
        // dx's elements of this phase: [n, grid..., c] at dx's strides times the stride, from
        // the phase's first pixel.
        let at: i64 = (0..r).map(|d| ph[d] * xd.strides[2 + d]).sum();
        let dst_strides: Vec<i64> = (0..r).map(|d| attrs.stride[d] * xd.strides[2 + d]).collect();
        let (sd, ss) = (slots(&grid, 1), slots(&dst_strides, 0));
        let sizes = [n, sd[0], sd[1], sd[2], c];
        let dst = [xd.strides[0], ss[0], ss[1], ss[2], xd.strides[1]];
        if dims.iter().any(|d| d.taps == 0) {
            // No tap reaches these pixels: zeros.
            let cp = Copy { sizes, lim: [sd[2], 0], src: (Arg::Ptr(dx), [0; 5]), dst: (Arg::Ptr(dx), dst), dst_at: at };
            copies.push(copy_launch(ni, &format!("phase{p}_zero"), dt, cp));
            continue;
        }
        let taps: Vec<i64> = dims.iter().map(|d| d.taps).collect();
        let ones = vec![1; r];
        let zeros = vec![0; r];
        // A: dy at (j + off - u); B: the filter's taps first + s u (mirrored in convolution
        // mode: T - 1 - first - s u).
        let ga = Gather {
            mn: Index::Pixel { n_stride: yd.strides[0], grid: slots(&grid, 1), mul: slots(&ones, 0), off: slots(&dims.iter().map(|d| d.off).collect::<Vec<_>>(), 0) },
            k: Index::Taps { taps: slots(&taps, 1), channels: k, ch_stride: yd.strides[1], tap_major, dil: slots(&vec![-1; r], 0) },
            axes: axes(yd, &ones, &zeros),
            block: None,
        };
        let (fbase, fdil): (Vec<i64>, Vec<i64>) =
            (0..r).map(|d| if flip { (wd.dims[2 + d] - 1 - dims[d].first, -attrs.stride[d]) } else { (dims[d].first, attrs.stride[d]) }).unzip();
        let gb = Gather {
            mn: Index::Plain { stride: wd.strides[1] },
            k: Index::Taps { taps: slots(&taps, 1), channels: k, ch_stride: wd.strides[0], tap_major, dil: slots(&fdil, 0) },
            axes: axes(wd, &ones, &fbase),
            block: None,
        };
        let red = taps.iter().product::<i64>() * k;
        let rows = n * pixels;
        let mut view = graph.clone();
        view.tensors[dy.0] = TensorDesc { dims: vec![rows, red], strides: vec![red, 1], ..yd.clone() };
        view.tensors[w.0] = TensorDesc { dims: vec![red, c], strides: vec![c, 1], ..wd.clone() };
        view.tensors[dx.0] = TensorDesc { dims: vec![rows, c], strides: vec![c, 1], is_virtual: false, data_type: Some(dt), ..xd.clone() };
        let vn = &mut view.nodes[ni];
        vn.op = Op::Matmul(MatmulAttrs {});
        vn.inputs = vec![Port { name: "a".into(), tensor: dy }, Port { name: "b".into(), tensor: w }];
        vn.outputs = vec![Port { name: "c".into(), tensor: dx }];
        let gathers = Gathers::one(ni, ga, gb);
        let Some(u) = gemm::unit_gathered(&view, &[ni], target, options, Some(&gathers))? else { return Ok(None) };
        // The GEMM writes the phase into scratch, then the copy places it in dx.
        let bytes = (rows * c) as usize * dt.size();
        let cp = Copy { sizes, lim: [sd[2], c], src: (Arg::Scratch(0), [pixels * c, sd[1] * sd[2] * c, sd[2] * c, c, 1]), dst: (Arg::Ptr(dx), dst), dst_at: at };
        let stage = Stage::output_in_scratch(dx, bytes, vec![copy_launch(ni, &format!("phase{p}_place"), dt, cp)]);
        let Some(mut u) = stage.finish(u) else { return Ok(None) };
        rename(&mut u.kernels, ni, p);
        // The kernels for unaligned pointers: this phase's, or its main ones.
        if let Some(a) = u.unaligned.take() {
            let mut a = *a;
            rename(&mut a.kernels, ni, p);
            let (tensors, k) = alt.get_or_insert_with(|| (Vec::new(), kernels.clone()));
            for t in a.tensors {
                if !tensors.contains(&t) {
                    tensors.push(t);
                }
            }
            append(k, a.kernels);
        } else if let Some((_, k)) = alt.as_mut() {
            append(k, u.kernels.clone());
        }
        append(&mut kernels, u.kernels);
    }
    kernels.launches.extend(copies.iter().cloned());
    let unaligned = alt.map(|(tensors, mut k)| {
        k.launches.extend(copies);
        Box::new(Unaligned { tensors, kernels: k })
    });
    Ok(Some(Unit { nodes: vec![ni], kernels, writes: vec![dx], unaligned }))
}

/// Phase `p`'s kernels renamed apart from the other phases' (`n<ni>_p<p>_...`).
fn rename(k: &mut NodeKernels, ni: usize, p: i64) {
    let from = format!("n{ni}_");
    for l in &mut k.launches {
        if let Some(rest) = l.entry.strip_prefix(&from) {
            let new = format!("n{ni}_p{p}_{rest}");
            l.source = l.source.replace(&l.entry, &new);
            l.entry = new;
        }
    }
}

/// `more`'s launches after `k`'s, their scratch buffers after `k`'s.
fn append(k: &mut NodeKernels, mut more: NodeKernels) {
    let base = k.scratch.len();
    for l in &mut more.launches {
        for a in &mut l.args {
            if let Arg::Scratch(i) | Arg::ScratchTensorMap(i, _) = a {
                *i += base;
            }
        }
    }
    k.scratch.append(&mut more.scratch);
    k.launches.append(&mut more.launches);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::ops::conv::ConvAttrs;
    use crate::DataType;

    /// The phases of ResNet's 3x3 stride-2 layers (padding 1) and of a strided 1x1.
    #[test]
    fn phases_split_the_taps_by_residue() {
        // 56 pixels, 3 taps, stride 2, padding 1: even pixels take tap 1, odd ones taps 0 and 2.
        assert_eq!(dim(56, 3, 2, 1, 0), Dim { pixels: 28, first: 1, taps: 1, off: 0 });
        assert_eq!(dim(56, 3, 2, 1, 1), Dim { pixels: 28, first: 0, taps: 2, off: 1 });
        // An odd extent: one more even pixel.
        assert_eq!(dim(7, 3, 2, 1, 0).pixels, 4);
        assert_eq!(dim(7, 3, 2, 1, 1).pixels, 3);
        // 1x1 stride 2: odd pixels get nothing.
        assert_eq!(dim(14, 1, 2, 0, 0), Dim { pixels: 7, first: 0, taps: 1, off: 0 });
        assert_eq!(dim(14, 1, 2, 0, 1).taps, 0);
        // Stride 3, 5 taps, padding 2.
        assert_eq!(dim(10, 5, 3, 2, 2), Dim { pixels: 3, first: 1, taps: 2, off: 1 });
    }

    /// Every (pixel, tap) pair of the dense data gradient that contributes lands in exactly one
    /// phase, at the dy coordinate the phase's gather reads.
    #[test]
    fn phases_cover_every_contributing_tap_once() {
        for (extent, taps, s, pre) in [(9, 3, 2, 1), (10, 5, 3, 2), (8, 1, 2, 0), (7, 4, 2, 0), (11, 3, 4, 1)] {
            let out = (extent + 2 * pre - taps) / s + 1;
            for i in 0..extent {
                let ph = i % s;
                let j = i / s;
                let d = dim(extent, taps, s, pre, ph);
                let mut got: Vec<(i64, i64)> = (0..d.taps).map(|u| (d.first + s * u, j + d.off - u)).filter(|&(_, o)| (0..out).contains(&o)).collect();
                let mut want: Vec<(i64, i64)> = (0..taps).map(|t| (t, i + pre - t)).filter(|&(_, q)| q >= 0 && q % s == 0 && q / s < out).map(|(t, q)| (t, q / s)).collect();
                got.sort_unstable();
                want.sort_unstable();
                assert_eq!(got, want, "extent {extent} taps {taps} stride {s} pre {pre} pixel {i}");
            }
        }
    }

    fn nhwc(name: &str, dims: &[i64], dt: DataType) -> TensorDesc {
        TensorDesc::new(name, dims, dt).with_layout(&[0, 2, 3, 1])
    }

    /// ResNet's stride-2 3x3 data gradient plans as four GEMMs (one a phase) and four copies
    /// into dx; a 1x1 stride-2 one as one GEMM, its phase's copy and three copies of zeros.
    #[test]
    fn strided_dgrad_plans_by_phases() {
        let f = DataType::F16;
        for (taps, gemms, zeros) in [(3, 4, 0), (1, 1, 3)] {
            let mut g = Graph::new("dgrad_s2").io_data_type(f);
            let dy = g.tensor(nhwc("dy", &[2, 128, 5, 6], f));
            let w = g.tensor(nhwc("w", &[128, 32, taps, taps], f));
            let pad = if taps == 3 { 1 } else { 0 };
            let dx = g.conv_dgrad(dy, w, &[2, 32, 9, 11], ConvAttrs::new(2).with_padding(&[pad, pad]).with_stride(&[2, 2]));
            g.set_output(dx);
            g.validate().unwrap();
            let u = unit(&g, 0, &Target::sm90a(), &Options::default()).unwrap().expect("phases");
            let entries: Vec<&str> = u.kernels.launches.iter().map(|l| l.entry.as_str()).collect();
            // (A phase's GEMM may split k: its reduce launch follows it.)
            assert_eq!(entries.iter().filter(|e| e.contains("gemm") && !e.ends_with("_reduce")).count(), gemms, "{entries:?}");
            assert_eq!(entries.iter().filter(|e| e.ends_with("_zero")).count(), zeros, "{entries:?}");
            assert_eq!(entries.iter().filter(|e| e.ends_with("_place")).count(), gemms, "{entries:?}");
            // No phase reads its offset taps as a filter run from the first tap (by 3-D TMA or
            // as a plain matrix): dy's 64 channels would allow it.
            for l in u.kernels.launches.iter().filter(|l| l.entry.contains("gemm")) {
                assert!(!l.source.contains("#define GEMM_B_TAPS 1\n"), "{}", l.entry);
            }
            // Entries are unique.
            let mut sorted = entries.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), entries.len());
        }
    }
}
