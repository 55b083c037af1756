//! Batched matmul: `a [..., m, k] x b [..., k, n] -> c [..., m, n]`, batch dims broadcast
//! numpy-style (aligned on the right, sizes equal or 1, ranks may differ), any strides (a
//! transpose is a stride). Ports `a`, `b` -> `c`.
//!
//! Inputs are both float (any mix of float types) or both integer (i8 x i8 -> i32 is the usual
//! integer GEMM). `c` is row-major packed unless the user sets its strides; its type, when
//! nothing else sets it, is `a`'s for f64/f32/f16/bf16, f32 for fp8 and i32 for integers (i64
//! when an input is i64).
//!
//! ```
//! use ferrodnn::{DataType, Graph, TensorDesc};
//! let mut g = Graph::new("mm");
//! let a = g.tensor(TensorDesc::new("a", &[4, 3, 5], DataType::Bf16));
//! // b is [5, 7] stored transposed (column-major): a stride, not a copy.
//! let b = g.tensor(TensorDesc::new("b", &[5, 7], DataType::Bf16).with_strides(&[1, 5]));
//! let c = g.matmul(a, b);
//! g.set_output(c);
//! g.validate().unwrap();
//! assert_eq!(g.desc(c).dims, vec![4, 3, 7]);
//! ```

use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::ops::pointwise::broadcast_shape;
use crate::graph::{Graph, InferCtx, TensorId};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatmulAttrs {}

impl Graph {
    /// `c = a x b` over the last two dims, batch dims broadcast. Ports `a`, `b` -> `c`.
    pub fn matmul(&mut self, a: TensorId, b: TensorId) -> TensorId {
        self.add_node(super::Op::Matmul(MatmulAttrs {}), None, vec![("a", a), ("b", b)], &["c"])[0]
    }
}

pub(crate) fn infer(ctx: &mut InferCtx, _attrs: &MatmulAttrs) -> Result<()> {
    let a = ctx.input("a")?;
    let b = ctx.input("b")?;
    for (port, t, shape) in [("a", &a, "[..., m, k]"), ("b", &b, "[..., k, n]")] {
        if t.dims.len() < 2 {
            return Err(ctx.err(format!("input `{port}` (tensor \"{}\") must have rank >= 2 ({shape}), got rank {} (dims {:?})", t.name, t.dims.len(), t.dims)));
        }
    }
    let ta = a.data_type.unwrap_or(DataType::F32);
    let tb = b.data_type.unwrap_or(DataType::F32);
    for (port, t, dt) in [("a", &a, ta), ("b", &b, tb)] {
        if !dt.is_float() && !dt.is_integer() {
            return Err(ctx.err(format!("input `{port}` (tensor \"{}\") has type {dt}; matmul takes float or integer types", t.name)));
        }
    }
    if ta.is_integer() != tb.is_integer() {
        return Err(ctx.err(format!("input `a` is {ta} but input `b` is {tb}: inputs must be both float or both integer")));
    }
    let (ra, rb) = (a.dims.len(), b.dims.len());
    let (m, ka) = (a.dims[ra - 2], a.dims[ra - 1]);
    let (kb, n) = (b.dims[rb - 2], b.dims[rb - 1]);
    if ka != kb {
        return Err(ctx.err(format!(
            "inner dims differ: `a` (tensor \"{}\") dims {:?} has k = {ka} (its last dim) but `b` (tensor \"{}\") dims {:?} has k = {kb} (its second-to-last dim)",
            a.name, a.dims, b.name, b.dims
        )));
    }
    let (batch_a, batch_b) = (&a.dims[..ra - 2], &b.dims[..rb - 2]);
    let mut dims = broadcast_shape(&[batch_a, batch_b]).ok_or_else(|| {
        ctx.err(format!(
            "batch dims do not broadcast: `a` has batch dims {batch_a:?} (of {:?}) and `b` has {batch_b:?} (of {:?}); each pair, aligned on the right, must be equal or 1",
            a.dims, b.dims
        ))
    })?;
    dims.extend([m, n]);
    let default_type = if ta.is_integer() {
        if ta == DataType::I64 || tb == DataType::I64 {
            DataType::I64
        } else {
            DataType::I32
        }
    } else if ta.is_fp8() {
        DataType::F32
    } else {
        ta
    };
    ctx.set_output("c", &dims, None, default_type)?;
    if let Some(id) = ctx.node.output("c") {
        if ctx.graph.resolved_data_type(id) == Some(DataType::Bool) {
            return Err(ctx.err("output `c` has type bool; matmul writes float or integer types"));
        }
    }
    Ok(())
}
