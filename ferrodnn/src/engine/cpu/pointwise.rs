//! Pointwise ops on the CPU: broadcast the inputs to the output's shape and apply the mode's
//! per-element function.

use super::NodeIo;
use crate::error::Result;
use crate::graph::ops::pointwise::{PointwiseAttrs, PointwiseMode};
use crate::layout::{unravel, Nd};
use rayon::prelude::*;

pub(crate) fn pointwise(io: &mut NodeIo, attrs: &PointwiseAttrs) -> Result<()> {
    let dims = io.output_dims("y")?;
    let compute = io.compute_type();
    let ins: Vec<Option<&Nd>> = ["a", "b", "c"].iter().map(|p| io.opt_input(p)).collect();
    let mode = attrs.mode;
    // infer checked these; a malformed plan must still fail cleanly, not index out of bounds.
    if let PointwiseMode::GenIndex { axis } = mode {
        if axis >= dims.len() {
            return Err(io.err(format!("gen_index axis {axis} is not below the output rank {}", dims.len())));
        }
    }
    if let Some(nd) = ins.iter().flatten().find(|nd| !broadcasts_to(&nd.dims, &dims)) {
        return Err(io.err(format!("internal: input dims {:?} do not broadcast to the output dims {dims:?}", nd.dims)));
    }
    let total: usize = dims.iter().product();
    let data: Vec<f64> = (0..total)
        .into_par_iter()
        .map_init(
            || vec![0usize; dims.len()],
            |idx, flat| {
                unravel(flat, &dims, idx);
                if let PointwiseMode::GenIndex { axis } = mode {
                    return idx[axis] as f64;
                }
                let get = |i: usize| ins[i].map_or(0.0, |nd| compute.quantize(nd.broadcast_at(idx)));
                mode.apply(get(0), get(1), get(2))
            },
        )
        .collect();
    io.set("y", Nd::new(dims, data));
    Ok(())
}

/// Whether `from` broadcasts to `to` numpy-style (align right; sizes equal or 1).
fn broadcasts_to(from: &[usize], to: &[usize]) -> bool {
    from.len() <= to.len() && from.iter().rev().zip(to.iter().rev()).all(|(&f, &t)| f == t || f == 1)
}
