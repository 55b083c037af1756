//! Convolution on the CPU: fprop, dgrad and wgrad as direct sums (no im2col, no FFT), each
//! output element computed on its own, in parallel, so no two threads ever write one element.
//!
//! With image `x [n, c, i...]`, filter `w [k, c / groups, f...]` and output `y [n, k, o...]`,
//! per spatial dim the tap `f` of output position `o` reads input position
//! `i = o * stride - pre_padding + f * dilation` (positions outside `[0, in)` are the zero
//! padding). Mode `Convolution` uses the filter flipped: the weight of tap `f` is stored at
//! `filter - 1 - f`. Output channel `k` belongs to group `k / (k_total / groups)` and reads
//! the image channels of that group only.

use super::NodeIo;
use crate::error::Result;
use crate::graph::ops::conv::{ConvAttrs, ConvMode};
use crate::layout::{unravel, Nd};
use rayon::prelude::*;

/// The sizes of one convolution, checked against each other.
struct Geometry {
    batch: usize,
    /// Image channels.
    c: usize,
    /// Output channels.
    k: usize,
    /// Image channels per group (the filter's dim 1).
    c_per_group: usize,
    /// Output channels per group.
    k_per_group: usize,
    in_sp: Vec<usize>,
    out_sp: Vec<usize>,
    in_total: usize,
    out_total: usize,
    filter_total: usize,
    pre: Vec<i64>,
    stride: Vec<i64>,
    dilation: Vec<i64>,
    /// Each tap's logical multi-index `f`, in row-major order of the filter's spatial dims.
    taps: Vec<Vec<usize>>,
    /// For each tap, the flat spatial offset of its weight in the filter (flipped in
    /// convolution mode).
    tap_weight: Vec<usize>,
}

impl Geometry {
    /// Checks that image, filter and output dims agree with the attributes (inference did,
    /// but the engine must not index out of bounds on a graph changed since).
    fn new(image: &[usize], filter: &[usize], out: &[usize], a: &ConvAttrs) -> std::result::Result<Geometry, String> {
        let to_i64 = |d: &[usize]| d.iter().map(|&v| v as i64).collect::<Vec<i64>>();
        let want = a.forward_dims(&to_i64(image), &to_i64(filter), "image", "filter")?;
        if want != to_i64(out) {
            return Err(format!("internal: image {image:?} and filter {filter:?} give output {want:?}, but the output is {out:?}"));
        }
        let sr = image.len() - 2;
        let groups = image[1] / filter[1];
        let f_sp = filter[2..].to_vec();
        let filter_total: usize = f_sp.iter().product();
        let mut taps = Vec::with_capacity(filter_total);
        let mut tap_weight = Vec::with_capacity(filter_total);
        let f_strides = crate::layout::dense_strides(&f_sp);
        let mut f = vec![0usize; sr];
        for t in 0..filter_total {
            unravel(t, &f_sp, &mut f);
            let stored: usize = (0..sr)
                .map(|d| {
                    let s = if a.mode == ConvMode::Convolution { f_sp[d] - 1 - f[d] } else { f[d] };
                    s * f_strides[d]
                })
                .sum();
            taps.push(f.clone());
            tap_weight.push(stored);
        }
        Ok(Geometry {
            batch: image[0],
            c: image[1],
            k: filter[0],
            c_per_group: filter[1],
            k_per_group: filter[0] / groups,
            in_sp: image[2..].to_vec(),
            out_sp: out[2..].to_vec(),
            in_total: image[2..].iter().product(),
            out_total: out[2..].iter().product(),
            filter_total,
            pre: a.pre_padding.clone(),
            stride: a.stride.clone(),
            dilation: a.dilation.clone(),
            taps,
            tap_weight,
        })
    }

    /// The flat input position tap `f` of output position `o` reads, or `None` in the padding.
    fn input_at(&self, o: &[usize], f: &[usize]) -> Option<usize> {
        let mut flat = 0usize;
        for d in 0..self.in_sp.len() {
            let i = o[d] as i64 * self.stride[d] - self.pre[d] + f[d] as i64 * self.dilation[d];
            if i < 0 || i >= self.in_sp[d] as i64 {
                return None;
            }
            flat = flat * self.in_sp[d] + i as usize;
        }
        Some(flat)
    }

    /// The flat output position whose tap `f` reads input position `i`, or `None` when no
    /// output does (the position falls between strides or past either end).
    fn output_at(&self, i: &[usize], f: &[usize]) -> Option<usize> {
        let mut flat = 0usize;
        for d in 0..self.in_sp.len() {
            // i = o * stride - pre + f * dilation  =>  o = (i + pre - f * dilation) / stride
            let num = i[d] as i64 + self.pre[d] - f[d] as i64 * self.dilation[d];
            if num < 0 || num % self.stride[d] != 0 {
                return None;
            }
            let o = num / self.stride[d];
            if o >= self.out_sp[d] as i64 {
                return None;
            }
            flat = flat * self.out_sp[d] + o as usize;
        }
        Some(flat)
    }
}

/// The inputs as the op computes on them: rounded to the compute type when it is a float
/// (as the pointwise ops do); sums are then taken in f64.
fn computed(io: &NodeIo, port: &str) -> Result<Vec<f64>> {
    let nd = io.input(port)?;
    let ct = io.compute_type();
    Ok(if ct.is_float() { nd.data.iter().map(|&v| ct.quantize(v)).collect() } else { nd.data.clone() })
}

fn dims_of(nd: &Nd) -> Vec<usize> {
    nd.dims.clone()
}

/// y[n, k, o] = sum over the group's channels c and taps f of x[n, c, o*s - p + f*d] * w[k, c, f].
pub(crate) fn fprop(io: &mut NodeIo, a: &ConvAttrs) -> Result<()> {
    let y_dims = io.output_dims("y")?;
    let g = Geometry::new(&dims_of(io.input("x")?), &dims_of(io.input("w")?), &y_dims, a).map_err(|m| io.err(m))?;
    let x = computed(io, "x")?;
    let w = computed(io, "w")?;
    let total = g.batch * g.k * g.out_total;
    let data: Vec<f64> = (0..total)
        .into_par_iter()
        .map_init(
            || (vec![0usize; g.out_sp.len()], Vec::<(usize, usize)>::new()),
            |(o, taps), flat| {
                let o_flat = flat % g.out_total;
                let k = (flat / g.out_total) % g.k;
                let n = flat / (g.out_total * g.k);
                unravel(o_flat, &g.out_sp, o);
                // The taps that land inside the image: (input offset, weight offset).
                taps.clear();
                for (f, &wo) in g.taps.iter().zip(&g.tap_weight) {
                    if let Some(xo) = g.input_at(o, f) {
                        taps.push((xo, wo));
                    }
                }
                let group = k / g.k_per_group;
                let mut acc = 0.0;
                for cl in 0..g.c_per_group {
                    let x_base = (n * g.c + group * g.c_per_group + cl) * g.in_total;
                    let w_base = (k * g.c_per_group + cl) * g.filter_total;
                    for &(xo, wo) in taps.iter() {
                        acc += x[x_base + xo] * w[w_base + wo];
                    }
                }
                acc
            },
        )
        .collect();
    io.set("y", Nd::new(y_dims, data));
    Ok(())
}

/// dx[n, c, i] = sum over the group's output channels k and taps f, for the output position o
/// with o*s - p + f*d = i (if any), of dy[n, k, o] * w[k, c, f]: the transpose of fprop.
pub(crate) fn dgrad(io: &mut NodeIo, a: &ConvAttrs) -> Result<()> {
    let dx_dims = io.output_dims("dx")?;
    let g = Geometry::new(&dx_dims, &dims_of(io.input("w")?), &dims_of(io.input("dy")?), a).map_err(|m| io.err(m))?;
    let dy = computed(io, "dy")?;
    let w = computed(io, "w")?;
    let total = g.batch * g.c * g.in_total;
    let data: Vec<f64> = (0..total)
        .into_par_iter()
        .map_init(
            || (vec![0usize; g.in_sp.len()], Vec::<(usize, usize)>::new()),
            |(i, taps), flat| {
                let i_flat = flat % g.in_total;
                let c = (flat / g.in_total) % g.c;
                let n = flat / (g.in_total * g.c);
                unravel(i_flat, &g.in_sp, i);
                // The taps through which this input position reaches an output: (dy offset,
                // weight offset).
                taps.clear();
                for (f, &wo) in g.taps.iter().zip(&g.tap_weight) {
                    if let Some(oo) = g.output_at(i, f) {
                        taps.push((oo, wo));
                    }
                }
                let group = c / g.c_per_group;
                let cl = c % g.c_per_group;
                let mut acc = 0.0;
                for kl in 0..g.k_per_group {
                    let k = group * g.k_per_group + kl;
                    let dy_base = (n * g.k + k) * g.out_total;
                    let w_base = (k * g.c_per_group + cl) * g.filter_total;
                    for &(oo, wo) in taps.iter() {
                        acc += dy[dy_base + oo] * w[w_base + wo];
                    }
                }
                acc
            },
        )
        .collect();
    io.set("dx", Nd::new(dx_dims, data));
    Ok(())
}

/// dw[k, c, f] = sum over n and output positions o of dy[n, k, o] * x[n, c', o*s - p + f*d],
/// with c' the image channel of group(k) that filter channel c reads (and f read through the
/// flip in convolution mode).
pub(crate) fn wgrad(io: &mut NodeIo, a: &ConvAttrs) -> Result<()> {
    let dw_dims = io.output_dims("dw")?;
    let g = Geometry::new(&dims_of(io.input("x")?), &dw_dims, &dims_of(io.input("dy")?), a).map_err(|m| io.err(m))?;
    let dy = computed(io, "dy")?;
    let x = computed(io, "x")?;
    // The stored weight offset of each tap is a permutation of 0..filter_total; invert it so
    // each dw element knows which logical tap it is.
    let mut tap_of_weight = vec![0usize; g.filter_total];
    for (t, &wo) in g.tap_weight.iter().enumerate() {
        tap_of_weight[wo] = t;
    }
    let total = g.k * g.c_per_group * g.filter_total;
    let data: Vec<f64> = (0..total)
        .into_par_iter()
        .map_init(
            || (vec![0usize; g.out_sp.len()], Vec::<(usize, usize)>::new()),
            |(o, pairs), flat| {
                let wo = flat % g.filter_total;
                let cl = (flat / g.filter_total) % g.c_per_group;
                let k = flat / (g.filter_total * g.c_per_group);
                let f = &g.taps[tap_of_weight[wo]];
                // Every output position whose tap f lands inside the image: (dy offset, x offset).
                pairs.clear();
                for oo in 0..g.out_total {
                    unravel(oo, &g.out_sp, o);
                    if let Some(xo) = g.input_at(o, f) {
                        pairs.push((oo, xo));
                    }
                }
                let ci = (k / g.k_per_group) * g.c_per_group + cl;
                let mut acc = 0.0;
                for n in 0..g.batch {
                    let dy_base = (n * g.k + k) * g.out_total;
                    let x_base = (n * g.c + ci) * g.in_total;
                    for &(oo, xo) in pairs.iter() {
                        acc += dy[dy_base + oo] * x[x_base + xo];
                    }
                }
                acc
            },
        )
        .collect();
    io.set("dw", Nd::new(dw_dims, data));
    Ok(())
}
