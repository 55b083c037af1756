//! Pooling and its backward on the CPU, in f64, for 1 to 3 spatial dims.
//!
//! Each `(n, c)` plane is independent, so both directions run in parallel over planes. Within a
//! plane, output position `o` along a spatial dim covers input positions
//! `[o * stride - pre, o * stride - pre + window)`, of which those inside `[0, in)` are real
//! and the rest padding.

use super::NodeIo;
use crate::error::Result;
use crate::graph::ops::resample::{ResampleAttrs, ResampleMode};
use crate::layout::{dense_strides, for_each_index, Nd};
use rayon::prelude::*;

/// One window: the real input positions `lo[d]..hi[d]` per spatial dim, and the divisors of the
/// two averages.
struct Window {
    lo: Vec<usize>,
    hi: Vec<usize>,
    /// Window size clipped at the padded-input bounds (PyTorch's `count_include_pad`).
    size_with_padding: f64,
    /// Number of real elements.
    real_count: f64,
}

/// The shapes of one pooling problem, checked against the attributes.
struct Geometry {
    /// Spatial dims of the input and of the output.
    input: Vec<usize>,
    output: Vec<usize>,
    /// Row-major strides of the spatial dims within one input plane.
    input_strides: Vec<usize>,
    attrs: ResampleAttrs,
}

impl Geometry {
    /// Check `x`'s dims and the attributes (as `infer` did) and that `y` has `y_dims`.
    fn new(io: &NodeIo, a: &ResampleAttrs, x_dims: &[usize], y_dims: &[usize], y_port: &str) -> Result<Geometry> {
        let x64: Vec<i64> = x_dims.iter().map(|&d| d as i64).collect();
        let want = a.output_dims(&x64).map_err(|m| io.err(m))?;
        let got: Vec<i64> = y_dims.iter().map(|&d| d as i64).collect();
        if want != got {
            return Err(io.err(format!("`{y_port}` has dims {got:?} but pooling dims {x_dims:?} gives {want:?}")));
        }
        let input = x_dims[2..].to_vec();
        Ok(Geometry { input_strides: dense_strides(&input), input, output: y_dims[2..].to_vec(), attrs: a.clone() })
    }

    fn input_plane(&self) -> usize {
        self.input.iter().product()
    }

    fn output_plane(&self) -> usize {
        self.output.iter().product()
    }

    /// The window of output position `o` (spatial multi-index).
    fn window(&self, o: &[usize]) -> Window {
        let a = &self.attrs;
        let (mut lo, mut hi) = (Vec::with_capacity(o.len()), Vec::with_capacity(o.len()));
        let (mut size_with_padding, mut real_count) = (1.0, 1.0);
        for (d, &od) in o.iter().enumerate() {
            let input = self.input[d] as i64;
            let start = od as i64 * a.stride[d] - a.pre_padding[d];
            let end = start + a.window[d];
            let (l, h) = (start.max(0), end.min(input));
            lo.push(l as usize);
            hi.push(h.max(l) as usize);
            // start >= -pre always; only the end can pass the padded input.
            size_with_padding *= (end.min(input + a.post_padding[d]) - start) as f64;
            real_count *= (h - l).max(0) as f64;
        }
        Window { lo, hi, size_with_padding, real_count }
    }

    /// Calls `f(offset)` for each real element of `w` (offset within an input plane), in
    /// row-major order within the window.
    fn for_each_real(&self, w: &Window, mut f: impl FnMut(usize)) {
        let n = w.lo.len();
        if (0..n).any(|d| w.lo[d] >= w.hi[d]) {
            return;
        }
        let mut idx = w.lo.clone();
        loop {
            f(idx.iter().zip(&self.input_strides).map(|(i, s)| i * s).sum());
            // Advance the innermost dim, carrying outwards; done when the outermost wraps.
            let mut d = n;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                idx[d] += 1;
                if idx[d] < w.hi[d] {
                    break;
                }
                idx[d] = w.lo[d];
            }
        }
    }

    /// The offset of the first maximal real element of `w` in `plane` (a NaN counts as the
    /// maximum, so it propagates).
    fn argmax(&self, w: &Window, plane: &[f64]) -> Option<usize> {
        let mut best: Option<(usize, f64)> = None;
        self.for_each_real(w, |off| {
            let v = plane[off];
            let better = match best {
                None => true,
                Some((_, b)) => v > b || (v.is_nan() && !b.is_nan()),
            };
            if better {
                best = Some((off, v));
            }
        });
        best.map(|(off, _)| off)
    }

    fn divisor(&self, w: &Window) -> f64 {
        match self.attrs.mode {
            ResampleMode::AvgIncludePadding => w.size_with_padding,
            _ => w.real_count,
        }
    }
}

pub(crate) fn resample(io: &mut NodeIo, a: &ResampleAttrs) -> Result<()> {
    let x = io.input("x")?;
    let y_dims = io.output_dims("y")?;
    let geo = Geometry::new(io, a, &x.dims, &y_dims, "y")?;
    let (in_plane, out_plane) = (geo.input_plane(), geo.output_plane());
    let mut y = Nd::zeros(&y_dims);
    y.data.par_chunks_mut(out_plane).zip(x.data.par_chunks(in_plane)).for_each(|(out, plane)| {
        for_each_index(&geo.output, |flat, o| {
            let w = geo.window(o);
            out[flat] = match a.mode {
                // Validation keeps a real element in every window; NaN would show one that has none.
                ResampleMode::Max => geo.argmax(&w, plane).map_or(f64::NAN, |off| plane[off]),
                ResampleMode::AvgIncludePadding | ResampleMode::AvgExcludePadding => {
                    let mut sum = 0.0;
                    geo.for_each_real(&w, |off| sum += plane[off]);
                    sum / geo.divisor(&w)
                }
            };
        });
    });
    io.set("y", y);
    Ok(())
}

pub(crate) fn resample_backward(io: &mut NodeIo, a: &ResampleAttrs) -> Result<()> {
    let x = io.input("x")?;
    let dy = io.input("dy")?;
    let geo = Geometry::new(io, a, &x.dims, &dy.dims, "dy")?;
    let dx_dims = io.output_dims("dx")?;
    if dx_dims != x.dims {
        return Err(io.err(format!("`dx` has dims {dx_dims:?} but `x` has {:?}", x.dims)));
    }
    let (in_plane, out_plane) = (geo.input_plane(), geo.output_plane());
    let mut dx = Nd::zeros(&x.dims);
    // Each (n, c) plane of dx gathers only from the same plane of dy, so planes run in parallel.
    dx.data.par_chunks_mut(in_plane).zip(x.data.par_chunks(in_plane)).zip(dy.data.par_chunks(out_plane)).for_each(|((grad, plane), dplane)| {
        for_each_index(&geo.output, |flat, o| {
            let w = geo.window(o);
            let g = dplane[flat];
            match a.mode {
                ResampleMode::Max => {
                    if let Some(off) = geo.argmax(&w, plane) {
                        grad[off] += g;
                    }
                }
                ResampleMode::AvgIncludePadding | ResampleMode::AvgExcludePadding => {
                    let share = g / geo.divisor(&w);
                    geo.for_each_real(&w, |off| grad[off] += share);
                }
            }
        });
    });
    io.set("dx", dx);
    Ok(())
}
