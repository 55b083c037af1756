//! Reductions on the CPU: for each output element, fold the input elements that map onto it
//! (all combinations of the reduced axes), in f64.

use super::NodeIo;
use crate::error::Result;
use crate::graph::ops::reduction::{ReductionAttrs, ReductionMode};
use crate::layout::{dense_strides, for_each_index, unravel, Nd};
use rayon::prelude::*;

pub(crate) fn reduction(io: &mut NodeIo, a: &ReductionAttrs) -> Result<()> {
    let x = io.input("x")?;
    let rank = x.rank();
    let mut expect = x.dims.clone();
    for &axis in &a.axes {
        if axis >= rank {
            return Err(io.err(format!("axis {axis} is out of range for rank {rank}")));
        }
        expect[axis] = 1;
    }
    let out_dims = io.output_dims("y")?;
    if out_dims != expect {
        return Err(io.err(format!("output `y` has dims {out_dims:?} but reducing {:?} over axes {:?} gives {expect:?}", x.dims, a.axes)));
    }

    // Offsets (in the dense input) of every element of one reduction group relative to the
    // group's first element: all combinations of the reduced axes, in row-major order.
    let xs = dense_strides(&x.dims);
    let mut group_dims = vec![1usize; rank];
    for &axis in &a.axes {
        group_dims[axis] = x.dims[axis];
    }
    let mut group = Vec::with_capacity(group_dims.iter().product());
    for_each_index(&group_dims, |_, idx| group.push(idx.iter().zip(&xs).map(|(i, s)| i * s).sum::<usize>()));

    let mode = a.mode;
    let total: usize = out_dims.iter().product();
    let data: Vec<f64> = (0..total)
        .into_par_iter()
        .map_init(
            || vec![0usize; rank],
            |idx, flat| {
                // An output index is also the index of its group's first input element.
                unravel(flat, &out_dims, idx);
                let base: usize = idx.iter().zip(&xs).map(|(i, s)| i * s).sum();
                fold(mode, group.iter().map(|&o| x.data[base + o]))
            },
        )
        .collect();
    io.set("y", Nd::new(out_dims, data));
    Ok(())
}

/// Fold one group of values. NaN propagates through min, max and amax (as it does through the
/// arithmetic modes), so a NaN in the input is never hidden.
fn fold(mode: ReductionMode, values: impl Iterator<Item = f64>) -> f64 {
    let nan_max = |m: f64, v: f64| if m.is_nan() || v.is_nan() { f64::NAN } else { m.max(v) };
    let nan_min = |m: f64, v: f64| if m.is_nan() || v.is_nan() { f64::NAN } else { m.min(v) };
    match mode {
        ReductionMode::Add => values.sum(),
        ReductionMode::Mul => values.product(),
        ReductionMode::Min => values.fold(f64::INFINITY, nan_min),
        ReductionMode::Max => values.fold(f64::NEG_INFINITY, nan_max),
        ReductionMode::Amax => values.fold(0.0, |m, v| nan_max(m, v.abs())),
        ReductionMode::Avg => {
            let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
            sum / n as f64
        }
        ReductionMode::Norm1 => values.map(f64::abs).sum(),
        ReductionMode::Norm2 => values.map(|v| v * v).sum::<f64>().sqrt(),
        ReductionMode::MulNoZeros => values.filter(|&v| v != 0.0).product(),
    }
}
