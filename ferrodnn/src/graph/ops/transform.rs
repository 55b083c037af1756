//! Tensor transforms: reshape, transpose (permute), slice, concatenate, and copy (a strided
//! copy and cast; also the NCHW <-> NHWC layout conversion). Ports: `x` -> `y`; concatenate
//! takes `x0`, `x1`, ...
//!
//! All of them are defined on *logical* tensors: dims are what they mean (`[n, c, h, w]`), and
//! strides only say where each element lives in memory. So a reshape reads its input in logical
//! row-major order whatever the input's strides, and a transpose of a channels-last tensor is
//! the transpose of the image, not of its bytes.
//!
//! ```
//! use ferrodnn::{DataType, Graph, TensorDesc};
//! let mut g = Graph::new("nchw_to_nhwc");
//! let x = g.tensor(TensorDesc::new("x", &[2, 3, 4, 5], DataType::F32));
//! // Same logical image, stored channels-last and cast to f16.
//! let y = g.copy(x, Some(&[60, 1, 15, 3]), Some(DataType::F16));
//! g.set_output(y);
//! g.validate().unwrap();
//! assert_eq!(g.desc(y).dims, vec![2, 3, 4, 5]);
//! ```

use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::{Graph, InferCtx, TensorDesc, TensorId, MAX_RANK};
use serde::{Deserialize, Serialize};

/// Reshape has no attributes: the target dims are the dims of its output `y`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReshapeAttrs {}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransposeAttrs {
    /// Output axis i is input axis `permutation[i]`.
    pub permutation: Vec<usize>,
}

/// `y = x[starts[0]..ends[0]:steps[0], ...]` on every axis.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SliceAttrs {
    pub starts: Vec<i64>,
    pub ends: Vec<i64>,
    /// One step (>= 1) per axis; empty means 1 on every axis.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<i64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConcatenateAttrs {
    pub axis: usize,
}

/// Copy has no attributes: the strides and type it converts to are those of its output `y`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopyAttrs {}

/// Most inputs concatenate accepts.
pub const MAX_CONCAT_INPUTS: usize = 64;

/// The port name of concatenate's input `i`.
pub fn concat_port(i: usize) -> String {
    format!("x{i}")
}

impl Graph {
    /// `x` reshaped to `dims` (same element count), in logical row-major order: numpy's
    /// `reshape` of the logical tensor, whatever x's strides. One entry of `dims` may be -1 and
    /// is then inferred from x's element count. Port `x` -> `y` (packed row-major unless the
    /// user sets y's strides).
    pub fn reshape(&mut self, x: TensorId, dims: &[i64]) -> TensorId {
        let y = self.add_node(super::Op::Reshape(ReshapeAttrs {}), None, vec![("x", x)], &["y"])[0];
        let resolved = resolve_minus_one(dims, self.get(x).map(|d| d.dims.as_slice()).unwrap_or(&[]));
        self.set_dims_and_reinfer(y, &resolved);
        y
    }

    /// `x` with its axes permuted: `y.dims[i] = x.dims[permutation[i]]`. Port `x` -> `y`,
    /// stored packed row-major (a physical transpose) unless the user sets y's strides.
    pub fn transpose(&mut self, x: TensorId, permutation: &[usize]) -> TensorId {
        self.add_node(super::Op::Transpose(TransposeAttrs { permutation: permutation.to_vec() }), None, vec![("x", x)], &["y"])[0]
    }

    /// `x[starts..ends]` on every axis (`0 <= start < end <= dim`). Port `x` -> `y`, stored in
    /// x's stride order.
    pub fn slice(&mut self, x: TensorId, starts: &[i64], ends: &[i64]) -> TensorId {
        self.slice_with_steps(x, starts, ends, &[])
    }

    /// `x[starts..ends:steps]` on every axis; steps >= 1 (empty: all 1). The output has
    /// `ceil((end - start) / step)` elements on each axis.
    pub fn slice_with_steps(&mut self, x: TensorId, starts: &[i64], ends: &[i64], steps: &[i64]) -> TensorId {
        let attrs = SliceAttrs { starts: starts.to_vec(), ends: ends.to_vec(), steps: steps.to_vec() };
        self.add_node(super::Op::Slice(attrs), None, vec![("x", x)], &["y"])[0]
    }

    /// The inputs joined along `axis` (1 to 64 inputs, equal ranks, equal dims off the axis).
    /// Ports `x0`, `x1`, ... -> `y`, stored in x0's stride order.
    pub fn concatenate(&mut self, inputs: &[TensorId], axis: usize) -> TensorId {
        let names: Vec<String> = (0..inputs.len()).map(concat_port).collect();
        let ins = names.iter().map(String::as_str).zip(inputs.iter().copied()).collect();
        self.add_node(super::Op::Concatenate(ConcatenateAttrs { axis }), None, ins, &["y"])[0]
    }

    /// A copy of `x` with the same dims, stored with `strides` (None: x's stride order, packed)
    /// and cast to `data_type` (None: the graph's type rules, else x's type). This is the NCHW
    /// <-> NHWC conversion and every cast; values outside an integer or fp8 type saturate,
    /// integers round half away from zero, NaN becomes 0 in integers and false in bool.
    /// Port `x` -> `y`.
    pub fn copy(&mut self, x: TensorId, strides: Option<&[i64]>, data_type: Option<DataType>) -> TensorId {
        let y = self.add_node(super::Op::Copy(CopyAttrs {}), None, vec![("x", x)], &["y"])[0];
        let t = self.desc_mut(y);
        if let Some(s) = strides {
            t.strides = s.to_vec();
        }
        if data_type.is_some() {
            t.data_type = data_type;
        }
        // Re-infer with the user's strides and type in place (errors are kept for validate).
        if let Some(dims) = self.get(x).map(|d| d.dims.clone()) {
            self.set_dims_and_reinfer(y, &dims);
        }
        y
    }
}

/// Replace a single -1 in `dims` by what makes the element count equal x's. Anything that does
/// not resolve cleanly (several -1, x's dims unknown, not divisible) is left for `infer` to
/// report.
fn resolve_minus_one(dims: &[i64], x_dims: &[i64]) -> Vec<i64> {
    let mut out = dims.to_vec();
    let unknown: Vec<usize> = dims.iter().enumerate().filter(|(_, &d)| d == -1).map(|(i, _)| i).collect();
    if unknown.len() != 1 || x_dims.is_empty() || x_dims.iter().any(|&d| d <= 0) {
        return out;
    }
    let total = x_dims.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d));
    let known = dims.iter().filter(|&&d| d != -1).try_fold(1i64, |acc, &d| if d > 0 { acc.checked_mul(d) } else { None });
    if let (Some(total), Some(known)) = (total, known) {
        if known > 0 && total % known == 0 {
            out[unknown[0]] = total / known;
        }
    }
    out
}

/// Element count of dims already checked positive; None on overflow.
fn count(dims: &[i64]) -> Option<i64> {
    dims.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d))
}

fn check_rank(ctx: &InferCtx, what: &str, dims: &[i64]) -> Result<()> {
    if dims.is_empty() || dims.len() > MAX_RANK {
        return Err(ctx.err(format!("{what} must have rank 1 to {MAX_RANK}, got {} (dims {dims:?})", dims.len())));
    }
    Ok(())
}

pub(crate) fn infer_reshape(ctx: &mut InferCtx, _a: &ReshapeAttrs) -> Result<()> {
    let x = ctx.input("x")?;
    let y_id = ctx.node.output("y").ok_or_else(|| ctx.err("output `y` is missing"))?;
    let y_dims = ctx.graph.get(y_id).map(|t| t.dims.clone()).unwrap_or_default();
    if y_dims.is_empty() {
        return Err(ctx.err("output `y` has no dims: give reshape its target dims (Graph::reshape(x, dims))"));
    }
    check_rank(ctx, "output `y`", &y_dims)?;
    if let Some((i, &d)) = y_dims.iter().enumerate().find(|(_, &d)| d <= 0) {
        let hint = if d == -1 { " (a -1 could not be resolved: at most one -1, and x's element count must divide evenly)" } else { "" };
        return Err(ctx.err(format!("target dim {i} must be positive, got {d} (target dims {y_dims:?}){hint}")));
    }
    let (nx, ny) = (count(&x.dims), count(&y_dims));
    if nx.is_none() || ny.is_none() || nx != ny {
        let show = |n: Option<i64>| n.map_or("too many".to_string(), |n| n.to_string());
        return Err(ctx.err(format!(
            "input `x` has {} elements (dims {:?}) but the target dims {y_dims:?} have {}; a reshape keeps the element count",
            show(nx),
            x.dims,
            show(ny)
        )));
    }
    let dt = x.data_type.unwrap_or(DataType::F32);
    ctx.set_output("y", &y_dims, None, dt)
}

pub(crate) fn infer_transpose(ctx: &mut InferCtx, a: &TransposeAttrs) -> Result<()> {
    let x = ctx.input("x")?;
    let rank = x.dims.len();
    let perm = &a.permutation;
    if perm.len() != rank {
        return Err(ctx.err(format!("permutation {perm:?} has {} entries but input `x` has rank {rank} (dims {:?})", perm.len(), x.dims)));
    }
    let mut seen = vec![false; rank];
    for &p in perm {
        if p >= rank {
            return Err(ctx.err(format!("permutation {perm:?} names axis {p}, but input `x` has rank {rank}")));
        }
        if seen[p] {
            return Err(ctx.err(format!("permutation {perm:?} is not a permutation of 0..{rank}: axis {p} appears twice")));
        }
        seen[p] = true;
    }
    let dims: Vec<i64> = perm.iter().map(|&p| x.dims[p]).collect();
    let dt = x.data_type.unwrap_or(DataType::F32);
    ctx.set_output("y", &dims, None, dt)
}

pub(crate) fn infer_slice(ctx: &mut InferCtx, a: &SliceAttrs) -> Result<()> {
    let x = ctx.input("x")?;
    let rank = x.dims.len();
    if a.starts.len() != rank || a.ends.len() != rank {
        return Err(ctx.err(format!(
            "needs one start and one end per axis of input `x` (rank {rank}, dims {:?}), got {} starts and {} ends",
            x.dims,
            a.starts.len(),
            a.ends.len()
        )));
    }
    if !a.steps.is_empty() && a.steps.len() != rank {
        return Err(ctx.err(format!("needs one step per axis of input `x` (rank {rank}) or none, got {} steps", a.steps.len())));
    }
    let mut dims = Vec::with_capacity(rank);
    for axis in 0..rank {
        let (s, e, d) = (a.starts[axis], a.ends[axis], x.dims[axis]);
        let step = a.steps.get(axis).copied().unwrap_or(1);
        if step < 1 {
            return Err(ctx.err(format!("axis {axis}: step must be at least 1, got {step}")));
        }
        if s < 0 || s >= d {
            return Err(ctx.err(format!("axis {axis}: start must be in 0..{d} (the dim of input `x`), got {s}")));
        }
        if e <= s || e > d {
            return Err(ctx.err(format!("axis {axis}: end must be in {}..={d} (after start {s}, at most the dim), got {e}", s + 1)));
        }
        // ceil((e - s) / step), written so that no step overflows it.
        dims.push((e - s - 1) / step + 1);
    }
    let dt = x.data_type.unwrap_or(DataType::F32);
    ctx.set_output("y", &dims, Some(&x), dt)
}

pub(crate) fn infer_concatenate(ctx: &mut InferCtx, a: &ConcatenateAttrs) -> Result<()> {
    let n = ctx.node.inputs.len();
    if n == 0 {
        return Err(ctx.err("needs at least one input (ports `x0`, `x1`, ...), got none"));
    }
    if n > MAX_CONCAT_INPUTS {
        return Err(ctx.err(format!("takes at most {MAX_CONCAT_INPUTS} inputs, got {n}")));
    }
    // Ports must be exactly x0..x{n-1}.
    for p in &ctx.node.inputs {
        let ok = p.name.strip_prefix('x').and_then(|i| i.parse::<usize>().ok()).is_some_and(|i| i < n && concat_port(i) == p.name);
        if !ok {
            return Err(ctx.err(format!("has {n} inputs, so its ports must be `x0` to `x{}`, but one is named `{}`", n - 1, p.name)));
        }
    }
    let mut descs: Vec<TensorDesc> = Vec::with_capacity(n);
    for i in 0..n {
        descs.push(ctx.input(&concat_port(i))?);
    }
    let first = &descs[0];
    let rank = first.dims.len();
    if a.axis >= rank {
        return Err(ctx.err(format!("axis must be below the rank {rank} of the inputs, got {}", a.axis)));
    }
    let mut dims = first.dims.clone();
    for (i, d) in descs.iter().enumerate().skip(1) {
        if d.dims.len() != rank {
            return Err(ctx.err(format!(
                "input `x{i}` has rank {} (dims {:?}) but `x0` has rank {rank} (dims {:?}); all inputs need the same rank",
                d.dims.len(),
                d.dims,
                first.dims
            )));
        }
        for ax in 0..rank {
            if ax != a.axis && d.dims[ax] != first.dims[ax] {
                return Err(ctx.err(format!(
                    "input `x{i}` has dims {:?} but `x0` has {:?}: they must match on every axis but the concatenation axis {} (they differ on axis {ax})",
                    d.dims, first.dims, a.axis
                )));
            }
        }
        dims[a.axis] = dims[a.axis].checked_add(d.dims[a.axis]).ok_or_else(|| ctx.err("the concatenated dim overflows i64"))?;
    }
    let like = first.clone();
    let dt = like.data_type.unwrap_or(DataType::F32);
    ctx.set_output("y", &dims, Some(&like), dt)
}

pub(crate) fn infer_copy(ctx: &mut InferCtx, _a: &CopyAttrs) -> Result<()> {
    let x = ctx.input("x")?;
    let dt = x.data_type.unwrap_or(DataType::F32);
    ctx.set_output("y", &x.dims.clone(), Some(&x), dt)
}
