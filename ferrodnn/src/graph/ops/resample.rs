//! Resample (pooling): max, average including or excluding padding; 1D, 2D, 3D over the
//! spatial dims of `[n, c, spatial...]`. Ports: forward `x` -> `y`; backward `dy`, `x` -> `dx`.
//!
//! Each spatial output size is `floor((in + pre + post - window) / stride) + 1`. Windows never
//! reach past the padding, so:
//! - `Max` takes the largest real element of the window (padding is ignored);
//! - `AvgIncludePadding` divides the sum by the window size (padding counts as zeros);
//! - `AvgExcludePadding` divides it by the number of real elements in the window.
//!
//! The backward routes each `dy` element to the first maximal element of its window (in
//! row-major order within the window) for `Max`, and spreads `dy / divisor` over the window's
//! real elements for the averages.
//!
//! ```
//! use ferrodnn::{DataType, Graph, TensorDesc};
//! use ferrodnn::graph::ops::resample::ResampleAttrs;
//! let mut g = Graph::new("pool").io_data_type(DataType::F32);
//! let x = g.tensor(TensorDesc::new("x", &[1, 3, 8, 8], DataType::F32));
//! let y = g.resample(x, ResampleAttrs::max_2d(2, 2, 0));
//! g.set_output(y);
//! g.validate().unwrap();
//! assert_eq!(g.desc(y).dims, vec![1, 3, 4, 4]);
//! ```

use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::{Graph, InferCtx, TensorDesc, TensorId};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResampleMode {
    Max,
    AvgIncludePadding,
    AvgExcludePadding,
}

impl ResampleMode {
    pub fn name(self) -> &'static str {
        match self {
            ResampleMode::Max => "max",
            ResampleMode::AvgIncludePadding => "avg_include_padding",
            ResampleMode::AvgExcludePadding => "avg_exclude_padding",
        }
    }
}

/// Pooling attributes; each list has one entry per spatial dim (1 to 3).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResampleAttrs {
    pub mode: ResampleMode,
    /// Window size per spatial dim (>= 1).
    pub window: Vec<i64>,
    /// Step between windows per spatial dim (>= 1).
    pub stride: Vec<i64>,
    /// Padding before each spatial dim (>= 0 and below the window).
    pub pre_padding: Vec<i64>,
    /// Padding after each spatial dim (>= 0 and below the window).
    pub post_padding: Vec<i64>,
}

impl ResampleAttrs {
    /// Pooling with the same window, stride and (symmetric) padding along each of `spatial_dims`
    /// spatial dims.
    pub fn uniform(mode: ResampleMode, spatial_dims: usize, window: i64, stride: i64, padding: i64) -> ResampleAttrs {
        ResampleAttrs {
            mode,
            window: vec![window; spatial_dims],
            stride: vec![stride; spatial_dims],
            pre_padding: vec![padding; spatial_dims],
            post_padding: vec![padding; spatial_dims],
        }
    }

    /// 2D max pooling with a square window, stride and symmetric padding.
    pub fn max_2d(window: i64, stride: i64, padding: i64) -> ResampleAttrs {
        ResampleAttrs::uniform(ResampleMode::Max, 2, window, stride, padding)
    }

    /// 2D average pooling with a square window, stride and symmetric padding; padding counts
    /// in the divisor when `include_padding`.
    pub fn avg_2d(window: i64, stride: i64, padding: i64, include_padding: bool) -> ResampleAttrs {
        let mode = if include_padding { ResampleMode::AvgIncludePadding } else { ResampleMode::AvgExcludePadding };
        ResampleAttrs::uniform(mode, 2, window, stride, padding)
    }

    /// The output dims for input dims `x` (`[n, c, spatial...]`), or a message saying what is
    /// wrong with the attributes for that input.
    pub fn output_dims(&self, x: &[i64]) -> std::result::Result<Vec<i64>, String> {
        let rank = x.len();
        if !(3..=5).contains(&rank) {
            return Err(format!("input `x` must have rank 3 to 5 ([n, c, spatial...] with 1 to 3 spatial dims), got rank {rank} (dims {x:?})"));
        }
        let nsp = rank - 2;
        for (list, values) in [("window", &self.window), ("stride", &self.stride), ("pre_padding", &self.pre_padding), ("post_padding", &self.post_padding)] {
            if values.len() != nsp {
                return Err(format!("{list} has {} entries but input `x` (dims {x:?}) has {nsp} spatial dims; give one per spatial dim", values.len()));
            }
        }
        let mut out = x[..2].to_vec();
        for d in 0..nsp {
            let (w, s, pre, post) = (self.window[d], self.stride[d], self.pre_padding[d], self.post_padding[d]);
            if w < 1 {
                return Err(format!("window must be at least 1 along spatial dim {d}, got {w}"));
            }
            if s < 1 {
                return Err(format!("stride must be at least 1 along spatial dim {d}, got {s}"));
            }
            for (name, p) in [("pre_padding", pre), ("post_padding", post)] {
                if p < 0 {
                    return Err(format!("{name} must be non-negative along spatial dim {d}, got {p}"));
                }
                if p >= w {
                    return Err(format!("{name} {p} along spatial dim {d} must be smaller than the window {w}"));
                }
            }
            // i128: no overflow whatever the attributes.
            let padded = x[2 + d] as i128 + pre as i128 + post as i128;
            if padded < w as i128 {
                return Err(format!("window {w} along spatial dim {d} is larger than the padded input ({} + {pre} + {post} = {padded})", x[2 + d]));
            }
            let size = (padded - w as i128) / s as i128 + 1;
            let size = i64::try_from(size).map_err(|_| format!("output size {size} along spatial dim {d} does not fit in i64"))?;
            out.push(size);
        }
        Ok(out)
    }
}

impl Graph {
    /// Pooling of `x` (`[n, c, spatial...]`, 1 to 3 spatial dims). Ports `x` -> `y`; `y`
    /// follows `x`'s memory layout (channels-last in, channels-last out).
    pub fn resample(&mut self, x: TensorId, attrs: ResampleAttrs) -> TensorId {
        self.add_node(super::Op::Resample(attrs), None, vec![("x", x)], &["y"])[0]
    }

    /// The gradient of [`Graph::resample`] with respect to `x`, from `dy` and the forward input
    /// `x`. Ports `dy`, `x` -> `dx`.
    pub fn resample_backward(&mut self, dy: TensorId, x: TensorId, attrs: ResampleAttrs) -> TensorId {
        self.add_node(super::Op::ResampleBackward(attrs), None, vec![("dy", dy), ("x", x)], &["dx"])[0]
    }
}

/// `x`'s descriptor and type, checked against the mode: bool never pools, and averages need
/// floats (max of integers is fine).
fn pooled_input(ctx: &InferCtx, a: &ResampleAttrs) -> Result<(TensorDesc, DataType)> {
    let x = ctx.input("x")?;
    let dt = x.data_type.unwrap_or(DataType::F32);
    if dt == DataType::Bool || (dt.is_integer() && a.mode != ResampleMode::Max) {
        return Err(ctx.err(format!("input `x` (tensor \"{}\") is {}, which {} pooling does not take; use a floating-point type", x.name, dt.name(), a.mode.name())));
    }
    Ok((x, dt))
}

pub(crate) fn infer(ctx: &mut InferCtx, a: &ResampleAttrs) -> Result<()> {
    let (x, dt) = pooled_input(ctx, a)?;
    let dims = a.output_dims(&x.dims).map_err(|m| ctx.err(m))?;
    ctx.set_output("y", &dims, Some(&x), dt)
}

pub(crate) fn infer_backward(ctx: &mut InferCtx, a: &ResampleAttrs) -> Result<()> {
    let (x, _) = pooled_input(ctx, a)?;
    let dy = ctx.input("dy")?;
    let dy_type = dy.data_type.unwrap_or(DataType::F32);
    if !dy_type.is_float() {
        return Err(ctx.err(format!("input `dy` (tensor \"{}\") must be a floating-point type, got {}", dy.name, dy_type.name())));
    }
    let want = a.output_dims(&x.dims).map_err(|m| ctx.err(m))?;
    if dy.dims != want {
        return Err(ctx.err(format!("input `dy` has dims {:?} but pooling `x` of dims {:?} gives {want:?}", dy.dims, x.dims)));
    }
    ctx.set_output("dx", &x.dims, Some(&x), dy_type)
}
