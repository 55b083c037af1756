//! Tensor transforms on the CPU. Inputs arrive as dense row-major arrays of the *logical*
//! tensor (the engine already gathered them through their strides), so each transform is an
//! index mapping from output element to input element; the engine then rounds to the output's
//! type and scatters through the output's strides (which is all `copy` needs).

use super::NodeIo;
use crate::error::Result;
use crate::graph::ops::transform::*;
use crate::layout::{dense_strides, unravel, Nd};
use rayon::prelude::*;

/// Build an output of `dims` by mapping each output multi-index to a value.
fn map_output(dims: &[usize], f: impl Fn(&[usize]) -> f64 + Sync) -> Nd {
    let total: usize = dims.iter().product();
    let data = (0..total)
        .into_par_iter()
        .map_init(
            || vec![0usize; dims.len()],
            |idx, flat| {
                unravel(flat, dims, idx);
                f(idx)
            },
        )
        .collect();
    Nd::new(dims.to_vec(), data)
}

/// Logical row-major order is the order of the dense array, so a reshape only relabels dims.
pub(crate) fn reshape(io: &mut NodeIo, _a: &ReshapeAttrs) -> Result<()> {
    let x = io.input("x")?;
    let dims = io.output_dims("y")?;
    if dims.iter().product::<usize>() != x.len() {
        return Err(io.err(format!("internal: reshape of {} elements to dims {dims:?}", x.len())));
    }
    let y = Nd::new(dims, x.data.clone());
    io.set("y", y);
    Ok(())
}

/// y[i_0, ..., i_{r-1}] = x[j] with j[perm[k]] = i_k.
pub(crate) fn transpose(io: &mut NodeIo, a: &TransposeAttrs) -> Result<()> {
    let x = io.input("x")?;
    let dims = io.output_dims("y")?;
    let perm = &a.permutation;
    let ok = perm.len() == x.rank() && dims.len() == x.rank() && perm.iter().enumerate().all(|(i, &p)| p < x.rank() && x.dims[p] == dims[i]);
    if !ok {
        return Err(io.err(format!("internal: permutation {perm:?} does not map x dims {:?} to y dims {dims:?}", x.dims)));
    }
    // Output axis k steps through input axis perm[k]: its stride in the dense input.
    let xs = x.strides();
    let step: Vec<usize> = perm.iter().map(|&p| xs[p]).collect();
    let y = map_output(&dims, |idx| x.data[idx.iter().zip(&step).map(|(i, s)| i * s).sum::<usize>()]);
    io.set("y", y);
    Ok(())
}

/// y[i] = x[start + i * step] on every axis.
pub(crate) fn slice(io: &mut NodeIo, a: &SliceAttrs) -> Result<()> {
    let x = io.input("x")?;
    let dims = io.output_dims("y")?;
    let rank = x.rank();
    let starts: Vec<usize> = a.starts.iter().map(|&s| s.max(0) as usize).collect();
    let steps: Vec<usize> = (0..rank).map(|i| a.steps.get(i).copied().unwrap_or(1).max(1) as usize).collect();
    // The last index read on each axis must be inside x.
    let ok = starts.len() == rank && dims.len() == rank && (0..rank).all(|i| dims[i] >= 1 && starts[i] + (dims[i] - 1) * steps[i] < x.dims[i]);
    if !ok {
        return Err(io.err(format!("internal: slice {a:?} of x dims {:?} does not give y dims {dims:?}", x.dims)));
    }
    let xs = x.strides();
    let base: usize = starts.iter().zip(&xs).map(|(s, st)| s * st).sum();
    let step: Vec<usize> = steps.iter().zip(&xs).map(|(k, st)| k * st).collect();
    let y = map_output(&dims, |idx| x.data[base + idx.iter().zip(&step).map(|(i, s)| i * s).sum::<usize>()]);
    io.set("y", y);
    Ok(())
}

/// Join along `axis`: an output index on the axis falls in exactly one input's range.
pub(crate) fn concatenate(io: &mut NodeIo, a: &ConcatenateAttrs) -> Result<()> {
    let dims = io.output_dims("y")?;
    let axis = a.axis;
    let n = io.node.inputs.len();
    let mut xs: Vec<&Nd> = Vec::with_capacity(n);
    for i in 0..n {
        xs.push(io.input(&concat_port(i))?);
    }
    // offsets[i] = where input i starts on the axis.
    let mut offsets = Vec::with_capacity(n);
    let mut at = 0usize;
    for x in &xs {
        let fits = x.rank() == dims.len() && axis < dims.len() && (0..dims.len()).all(|d| d == axis || x.dims[d] == dims[d]);
        if !fits {
            return Err(io.err(format!("internal: input dims {:?} do not fit output dims {dims:?} on axis {axis}", x.dims)));
        }
        offsets.push(at);
        at += x.dims[axis];
    }
    if at != dims.get(axis).copied().unwrap_or(0) {
        return Err(io.err(format!("internal: inputs add up to {at} on axis {axis} but the output has dims {dims:?}")));
    }
    let strides: Vec<Vec<usize>> = xs.iter().map(|x| dense_strides(&x.dims)).collect();
    let y = map_output(&dims, |idx| {
        // The last input starting at or before this position owns it.
        let k = offsets.partition_point(|&o| o <= idx[axis]) - 1;
        let local = idx[axis] - offsets[k];
        let flat: usize = idx.iter().zip(&strides[k]).enumerate().map(|(d, (&i, &s))| if d == axis { local * s } else { i * s }).sum();
        xs[k].data[flat]
    });
    io.set("y", y);
    Ok(())
}

/// The values pass through unchanged: the engine rounds them to y's type (saturating where
/// the type does) and writes them through y's strides.
pub(crate) fn copy(io: &mut NodeIo, _a: &CopyAttrs) -> Result<()> {
    let x = io.input("x")?.clone();
    let dims = io.output_dims("y")?;
    if dims != x.dims {
        return Err(io.err(format!("internal: copy of dims {:?} to dims {dims:?}", x.dims)));
    }
    io.set("y", x);
    Ok(())
}
