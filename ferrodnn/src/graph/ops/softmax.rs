//! Softmax and log-softmax over one axis, with an optional log-sum-exp `stats` output, and the
//! backward. Ports: forward `x` -> `y`, `stats`; backward `y`, `dy` -> `dx`.
//!
//! `stats` holds `ln(sum(exp(x)))` over the axis (computed stably, with the maximum taken out
//! first); its dims are `x`'s with the axis set to 1. Whether a node produces it is decided by
//! whether its `stats` port exists (the builder's `generate_stats`).
//!
//! ```
//! use ferrodnn::{DataType, Graph, TensorDesc};
//! let mut g = Graph::new("softmax").io_data_type(DataType::F32);
//! let x = g.tensor(TensorDesc::new("x", &[2, 5], DataType::F32));
//! let (y, stats) = g.softmax(x, 1, false, true);
//! g.set_output(y);
//! g.set_output(stats.unwrap());
//! g.validate().unwrap();
//! assert_eq!(g.desc(stats.unwrap()).dims, vec![2, 1]);
//! ```

use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::{Graph, InferCtx, TensorDesc, TensorId};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SoftmaxAttrs {
    /// The axis normalized over.
    pub axis: usize,
    /// Log-softmax (`x - logsumexp(x)`) instead of softmax.
    #[serde(default)]
    pub log: bool,
}

impl Graph {
    /// Softmax (or log-softmax when `log`) of `x` over `axis`. Ports `x` -> `y` and, when
    /// `generate_stats`, `stats` (the log-sum-exp over the axis, f32 by default, f64 for f64
    /// `x`). Returns `(y, stats)`.
    pub fn softmax(&mut self, x: TensorId, axis: usize, log: bool, generate_stats: bool) -> (TensorId, Option<TensorId>) {
        let outputs: &[&str] = if generate_stats { &["y", "stats"] } else { &["y"] };
        let ids = self.add_node(super::Op::Softmax(SoftmaxAttrs { axis, log }), None, vec![("x", x)], outputs);
        (ids[0], ids.get(1).copied())
    }

    /// Log-softmax of `x` over `axis` (no stats). Returns `y`.
    pub fn log_softmax(&mut self, x: TensorId, axis: usize) -> TensorId {
        self.softmax(x, axis, true, false).0
    }

    /// The gradient of softmax (or log-softmax when `log`) over `axis`, from the forward
    /// output `y` and the incoming gradient `dy`. Ports `y`, `dy` -> `dx`.
    /// Softmax: `dx = y * (dy - sum(dy * y))`; log-softmax: `dx = dy - exp(y) * sum(dy)`.
    pub fn softmax_backward(&mut self, y: TensorId, dy: TensorId, axis: usize, log: bool) -> TensorId {
        self.add_node(super::Op::SoftmaxBackward(SoftmaxAttrs { axis, log }), None, vec![("y", y), ("dy", dy)], &["dx"])[0]
    }
}

/// A float input's resolved type, or an error naming the port.
fn float_input(ctx: &InferCtx, port: &str) -> Result<(TensorDesc, DataType)> {
    let t = ctx.input(port)?;
    let dt = t.data_type.unwrap_or(DataType::F32);
    if !dt.is_float() {
        return Err(ctx.err(format!("input `{port}` (tensor \"{}\") must be a floating-point type, got {}", t.name, dt.name())));
    }
    Ok((t, dt))
}

fn check_axis(ctx: &InferCtx, axis: usize, port: &str, t: &TensorDesc) -> Result<()> {
    if axis >= t.dims.len() {
        return Err(ctx.err(format!("axis {axis} is out of range for input `{port}` of rank {} (dims {:?})", t.dims.len(), t.dims)));
    }
    Ok(())
}

pub(crate) fn infer(ctx: &mut InferCtx, a: &SoftmaxAttrs) -> Result<()> {
    let (x, dt) = float_input(ctx, "x")?;
    check_axis(ctx, a.axis, "x", &x)?;
    let mut stats_dims = x.dims.clone();
    stats_dims[a.axis] = 1;
    let stats_type = if dt == DataType::F64 { DataType::F64 } else { DataType::F32 };
    ctx.set_output("y", &x.dims, Some(&x), dt)?;
    ctx.set_output("stats", &stats_dims, Some(&x), stats_type)
}

pub(crate) fn infer_backward(ctx: &mut InferCtx, a: &SoftmaxAttrs) -> Result<()> {
    let (y, _) = float_input(ctx, "y")?;
    let (dy, dy_type) = float_input(ctx, "dy")?;
    if y.dims != dy.dims {
        return Err(ctx.err(format!("input `dy` has dims {:?} but `y` has {:?}; they must match", dy.dims, y.dims)));
    }
    check_axis(ctx, a.axis, "y", &y)?;
    ctx.set_output("dx", &y.dims, Some(&dy), dy_type)
}
