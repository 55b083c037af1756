//! Reductions over any set of axes; reduced axes keep size 1. Ports `x` -> `y`.
//!
//! ```
//! use ferrodnn::{DataType, Graph, TensorDesc};
//! use ferrodnn::graph::ops::reduction::ReductionMode;
//! let mut g = Graph::new("sum").io_data_type(DataType::F32);
//! let x = g.tensor(TensorDesc::new("x", &[2, 3, 4], DataType::F32));
//! let y = g.reduction(x, ReductionMode::Add, &[0, 2]);
//! g.set_output(y);
//! g.validate().unwrap();
//! assert_eq!(g.desc(y).dims, vec![1, 3, 1]);
//! ```

use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::{Graph, InferCtx, TensorId};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReductionMode {
    /// Sum.
    Add,
    /// Product.
    Mul,
    Min,
    Max,
    /// max |x|.
    Amax,
    /// Mean.
    Avg,
    /// sum |x|.
    Norm1,
    /// sqrt(sum x^2).
    Norm2,
    /// Product of the non-zero elements (1 when all are zero).
    MulNoZeros,
}

impl ReductionMode {
    pub fn name(self) -> &'static str {
        match self {
            ReductionMode::Add => "add",
            ReductionMode::Mul => "mul",
            ReductionMode::Min => "min",
            ReductionMode::Max => "max",
            ReductionMode::Amax => "amax",
            ReductionMode::Avg => "avg",
            ReductionMode::Norm1 => "norm1",
            ReductionMode::Norm2 => "norm2",
            ReductionMode::MulNoZeros => "mul_no_zeros",
        }
    }

    /// Modes whose result of integers is an integer (so integer inputs are allowed).
    fn keeps_integers(self) -> bool {
        !matches!(self, ReductionMode::Avg | ReductionMode::Norm2)
    }

    /// Modes that make sense on booleans (min = all, max = any, amax = any).
    fn accepts_bool(self) -> bool {
        matches!(self, ReductionMode::Min | ReductionMode::Max | ReductionMode::Amax)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReductionAttrs {
    pub mode: ReductionMode,
    /// The axes reduced (each kept with size 1 in the output).
    pub axes: Vec<usize>,
}

impl Graph {
    /// Reduce `x` over `axes` with `mode`; each reduced axis keeps size 1 in the output (no
    /// axes: `y` is `x` unchanged for add). Ports `x` -> `y`; `y` gets `x`'s type by default.
    pub fn reduction(&mut self, x: TensorId, mode: ReductionMode, axes: &[usize]) -> TensorId {
        let attrs = ReductionAttrs { mode, axes: axes.to_vec() };
        self.add_node(super::Op::Reduction(attrs), None, vec![("x", x)], &["y"])[0]
    }

    /// Sum of `x` over `axes` (a [`Graph::reduction`] with mode add).
    pub fn reduce_sum(&mut self, x: TensorId, axes: &[usize]) -> TensorId {
        self.reduction(x, ReductionMode::Add, axes)
    }

    /// Maximum of `x` over `axes` (a [`Graph::reduction`] with mode max).
    pub fn reduce_max(&mut self, x: TensorId, axes: &[usize]) -> TensorId {
        self.reduction(x, ReductionMode::Max, axes)
    }
}

/// The output dims of a reduction: `dims` with each axis of `axes` set to 1.
pub fn reduced_dims(dims: &[i64], axes: &[usize]) -> Vec<i64> {
    let mut out = dims.to_vec();
    for &a in axes {
        if let Some(d) = out.get_mut(a) {
            *d = 1;
        }
    }
    out
}

pub(crate) fn infer(ctx: &mut InferCtx, a: &ReductionAttrs) -> Result<()> {
    let x = ctx.input("x")?;
    let rank = x.dims.len();
    let mut seen = vec![false; rank];
    for &axis in &a.axes {
        if axis >= rank {
            return Err(ctx.err(format!("axis {axis} is out of range for input `x` of rank {rank} (dims {:?}); axes must be below {rank}", x.dims)));
        }
        if seen[axis] {
            return Err(ctx.err(format!("axis {axis} is listed twice in axes {:?}; list each axis once", a.axes)));
        }
        seen[axis] = true;
    }
    let dt = x.data_type.unwrap_or(DataType::F32);
    if dt == DataType::Bool && !a.mode.accepts_bool() {
        return Err(ctx.err(format!("mode {} needs a numeric input, but input `x` is bool (only min, max and amax take bool)", a.mode.name())));
    }
    if dt.is_integer() && !a.mode.keeps_integers() {
        return Err(ctx.err(format!("mode {} needs a floating-point input, but input `x` is {}", a.mode.name(), dt.name())));
    }
    let dims = reduced_dims(&x.dims, &a.axes);
    ctx.set_output("y", &dims, Some(&x), dt)
}
