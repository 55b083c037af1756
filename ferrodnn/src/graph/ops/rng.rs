//! Random numbers from a counter-based generator (Philox 4x32-10, Salmon et al. 2011): uniform
//! and Bernoulli, from `seed` and `offset` tensors, so a result is reproducible from the two.
//! Ports `seed`, `offset` -> `y` (dims set by the builder).
//!
//! # Counter mapping
//! The element of `y` with flat row-major (logical) index `i` — whatever `y`'s strides — takes
//! word `i % 4` of
//! `philox4x32(counter = [lo32(i / 4), hi32(i / 4), lo32(offset), hi32(offset)],
//!             key = [lo32(seed), hi32(seed)])`
//! and turns it into `u = (word + 0.5) / 2^32`, strictly inside (0, 1). Then
//! - `Uniform { low, high }`: `y = low + (high - low) * u`;
//! - `Bernoulli { probability: p }`: `y = 1` if `u < p`, else `0`.
//!
//! `seed` and `offset` are one-element integer tensors (by-value scalars are fine); their value
//! is taken as an `i64` and its two's-complement bits split into two 32-bit words. sdpa's
//! dropout uses the same mapping over the `[b, h_q, s_q, s_kv]` score tensor.
//!
//! ```
//! use ferrodnn::{DataType, Graph, TensorDesc};
//! use ferrodnn::graph::ops::rng::Distribution;
//! let mut g = Graph::new("noise");
//! let seed = g.tensor(TensorDesc::scalar("seed", 7.0, DataType::I64));
//! let offset = g.tensor(TensorDesc::scalar("offset", 0.0, DataType::I64));
//! let y = g.rng(seed, offset, &[4, 5], Distribution::Uniform { low: -1.0, high: 1.0 });
//! g.set_output(y);
//! g.validate().unwrap();
//! assert_eq!(g.desc(y).dims, vec![4, 5]);
//! ```

use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::{Graph, InferCtx, TensorDesc, TensorId};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case", deny_unknown_fields)]
pub enum Distribution {
    /// `low + (high - low) * u`, `u` in (0, 1); needs `low < high`.
    Uniform { low: f64, high: f64 },
    /// 1 with probability `probability` (in [0, 1]), else 0.
    Bernoulli { probability: f64 },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RngAttrs {
    pub distribution: Distribution,
}

impl Graph {
    /// Random values of shape `dims` from `seed` and `offset` (one-element integer tensors, by
    /// value or not). Ports `seed`, `offset` -> `y`; `y` is f32 unless the graph or the user
    /// sets its type. See the module docs for the counter mapping.
    pub fn rng(&mut self, seed: TensorId, offset: TensorId, dims: &[i64], distribution: Distribution) -> TensorId {
        let y = self.add_node(super::Op::Rng(RngAttrs { distribution }), None, vec![("seed", seed), ("offset", offset)], &["y"])[0];
        self.set_dims_and_reinfer(y, dims);
        y
    }
}

/// Checks that a `seed` or `offset` input is a one-element integer tensor (shared with sdpa's
/// dropout inputs).
pub(crate) fn check_seed_like(ctx: &InferCtx, port: &str, t: &TensorDesc) -> Result<()> {
    if t.element_count() != 1 {
        return Err(ctx.err(format!("input `{port}` (tensor \"{}\") must have one element, got dims {:?}", t.name, t.dims)));
    }
    let dt = t.data_type.unwrap_or(DataType::F32);
    if !dt.is_integer() {
        return Err(ctx.err(format!("input `{port}` (tensor \"{}\") must be an integer tensor (i64 preferred), got {dt}", t.name)));
    }
    Ok(())
}

pub(crate) fn infer(ctx: &mut InferCtx, a: &RngAttrs) -> Result<()> {
    match a.distribution {
        Distribution::Uniform { low, high } => {
            if !low.is_finite() || !high.is_finite() {
                return Err(ctx.err(format!("uniform bounds must be finite, got low = {low}, high = {high}")));
            }
            if high <= low {
                return Err(ctx.err(format!("uniform needs low < high, got low = {low}, high = {high}")));
            }
        }
        Distribution::Bernoulli { probability } => {
            if !(0.0..=1.0).contains(&probability) {
                return Err(ctx.err(format!("bernoulli probability must be in [0, 1], got {probability}")));
            }
        }
    }
    for port in ["seed", "offset"] {
        let t = ctx.input(port)?;
        check_seed_like(ctx, port, &t)?;
    }
    let y = ctx.node.output("y").ok_or_else(|| ctx.err("output `y` is missing"))?;
    let dims = ctx.graph.get(y).map(|t| t.dims.clone()).unwrap_or_default();
    if dims.is_empty() {
        return Err(ctx.err("output `y` has no dims: give them to the builder (`Graph::rng(seed, offset, dims, ..)`)"));
    }
    if let Some((i, &d)) = dims.iter().enumerate().find(|(_, &d)| d <= 0) {
        return Err(ctx.err(format!("output `y` dim {i} must be positive, got {d} (dims {dims:?})")));
    }
    ctx.set_output("y", &dims, None, DataType::F32)?;
    if let (Distribution::Uniform { .. }, Some(dt)) = (a.distribution, ctx.graph.resolved_data_type(y)) {
        if !dt.is_float() {
            return Err(ctx.err(format!("a uniform distribution needs a floating-point output, but `y` is {dt}")));
        }
    }
    Ok(())
}
