//! Softmax, log-softmax and their backward on the CPU, in f64.
//!
//! A tensor of dims `[outer..., len, inner...]` normalized over `len` is a set of
//! `outer * inner` rows; row `(o, i)` holds the elements at `o * len * inner + k * inner + i`.

use super::NodeIo;
use crate::error::Result;
use crate::graph::ops::softmax::SoftmaxAttrs;
use crate::layout::Nd;
use rayon::prelude::*;

/// The rows of a dense tensor along `axis`: (outer, len, inner).
fn rows(dims: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = dims[..axis].iter().product();
    let inner = dims[axis + 1..].iter().product();
    (outer, dims[axis], inner)
}

pub(crate) fn softmax(io: &mut NodeIo, a: &SoftmaxAttrs) -> Result<()> {
    let x = io.input("x")?;
    if a.axis >= x.rank() {
        return Err(io.err(format!("axis {} is out of range for rank {}", a.axis, x.rank())));
    }
    let (outer, len, inner) = rows(&x.dims, a.axis);
    // Per row: the outputs along the axis and the log-sum-exp. The maximum is taken out before
    // exponentiating so that large inputs do not overflow: lse = m + ln(sum(exp(x - m))).
    let per_row: Vec<(Vec<f64>, f64)> = (0..outer * inner)
        .into_par_iter()
        .map(|r| {
            let (o, i) = (r / inner, r % inner);
            let at = |k: usize| x.data[o * len * inner + k * inner + i];
            let m = (0..len).map(at).fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = (0..len).map(|k| (at(k) - m).exp()).sum();
            let lse = m + sum.ln();
            let ys = (0..len).map(|k| if a.log { at(k) - lse } else { (at(k) - lse).exp() }).collect();
            (ys, lse)
        })
        .collect();
    let mut y = Nd::zeros(&x.dims);
    let mut stats_dims = x.dims.clone();
    stats_dims[a.axis] = 1;
    let mut stats = Nd::zeros(&stats_dims);
    for (r, (ys, lse)) in per_row.into_iter().enumerate() {
        let (o, i) = (r / inner, r % inner);
        for (k, v) in ys.into_iter().enumerate() {
            y.data[o * len * inner + k * inner + i] = v;
        }
        // Row r of the stats, whose axis has size 1, is element r of it.
        stats.data[r] = lse;
    }
    io.set("y", y);
    io.set("stats", stats);
    Ok(())
}

pub(crate) fn softmax_backward(io: &mut NodeIo, a: &SoftmaxAttrs) -> Result<()> {
    let y = io.input("y")?;
    let dy = io.input("dy")?;
    if y.dims != dy.dims {
        return Err(io.err(format!("`dy` has dims {:?} but `y` has {:?}", dy.dims, y.dims)));
    }
    if a.axis >= y.rank() {
        return Err(io.err(format!("axis {} is out of range for rank {}", a.axis, y.rank())));
    }
    let (outer, len, inner) = rows(&y.dims, a.axis);
    let per_row: Vec<Vec<f64>> = (0..outer * inner)
        .into_par_iter()
        .map(|r| {
            let (o, i) = (r / inner, r % inner);
            let off = |k: usize| o * len * inner + k * inner + i;
            if a.log {
                // y = x - lse(x): dx_k = dy_k - softmax_k * sum(dy), softmax = exp(y).
                let s: f64 = (0..len).map(|k| dy.data[off(k)]).sum();
                (0..len).map(|k| dy.data[off(k)] - y.data[off(k)].exp() * s).collect()
            } else {
                // Jacobian of softmax is diag(y) - y y^T: dx = y * (dy - <dy, y>).
                let s: f64 = (0..len).map(|k| dy.data[off(k)] * y.data[off(k)]).sum();
                (0..len).map(|k| y.data[off(k)] * (dy.data[off(k)] - s)).collect()
            }
        })
        .collect();
    let mut dx = Nd::zeros(&y.dims);
    for (r, vals) in per_row.into_iter().enumerate() {
        let (o, i) = (r / inner, r % inner);
        for (k, v) in vals.into_iter().enumerate() {
            dx.data[o * len * inner + k * inner + i] = v;
        }
    }
    io.set("dx", dx);
    Ok(())
}
