//! Convolution: conv_fprop, conv_dgrad, conv_wgrad (1D, 2D, 3D).
//!
//! Logical layouts: image `[n, c, spatial...]`, filter `[k, c / groups, spatial...]`, output
//! `[n, k, spatial...]`, whatever the strides (channels-last is a stride order).
//! Ports: fprop `x`, `w` -> `y`; dgrad `dy`, `w` -> `dx`; wgrad `dy`, `x` -> `dw`.
//!
//! Groups are implicit, as in cuDNN: `groups = c_image / c_filter` (the filter's dim 1), which
//! must divide exactly, and the filter's `k` must be a multiple of `groups`. Depthwise
//! convolution is `c_filter = 1`, `groups = c`.
//!
//! Each output spatial size is
//! `(in + pre_padding + post_padding - dilation * (filter - 1) - 1) / stride + 1` (floor) and
//! must be at least 1. Mode `Convolution` flips the filter spatially; `CrossCorrelation` (the
//! default, what deep-learning frameworks call convolution) does not.
//!
//! ```
//! use ferrodnn::{DataType, Graph, TensorDesc};
//! use ferrodnn::graph::ops::conv::ConvAttrs;
//! let mut g = Graph::new("conv");
//! // NHWC image: logical dims [n, c, h, w], channels-last strides.
//! let x = g.tensor(TensorDesc::new("x", &[1, 8, 5, 5], DataType::F16).with_layout(&[0, 2, 3, 1]));
//! let w = g.tensor(TensorDesc::new("w", &[16, 8, 3, 3], DataType::F16).with_layout(&[0, 2, 3, 1]));
//! let y = g.conv_fprop(x, w, ConvAttrs::new(2).with_padding(&[1, 1]).with_stride(&[2, 2]));
//! g.set_output(y);
//! g.validate().unwrap();
//! assert_eq!(g.desc(y).dims, vec![1, 16, 3, 3]);
//! assert_eq!(g.desc(y).strides, vec![144, 1, 48, 16]); // channels-last, like x
//! ```

use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::{Graph, InferCtx, TensorDesc, TensorId};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvMode {
    #[default]
    CrossCorrelation,
    Convolution,
}

/// Attributes of a convolution; one entry per spatial dim in each list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConvAttrs {
    pub pre_padding: Vec<i64>,
    pub post_padding: Vec<i64>,
    pub stride: Vec<i64>,
    pub dilation: Vec<i64>,
    #[serde(default)]
    pub mode: ConvMode,
}

impl ConvAttrs {
    /// A convolution over `spatial_rank` dims (1, 2 or 3) with no padding, unit stride and
    /// unit dilation, in cross-correlation mode.
    pub fn new(spatial_rank: usize) -> ConvAttrs {
        ConvAttrs {
            pre_padding: vec![0; spatial_rank],
            post_padding: vec![0; spatial_rank],
            stride: vec![1; spatial_rank],
            dilation: vec![1; spatial_rank],
            mode: ConvMode::CrossCorrelation,
        }
    }

    /// The same padding before and after each spatial dim.
    pub fn with_padding(mut self, padding: &[i64]) -> ConvAttrs {
        self.pre_padding = padding.to_vec();
        self.post_padding = padding.to_vec();
        self
    }

    /// Padding before each spatial dim (top / left / front).
    pub fn with_pre_padding(mut self, padding: &[i64]) -> ConvAttrs {
        self.pre_padding = padding.to_vec();
        self
    }

    /// Padding after each spatial dim (bottom / right / back).
    pub fn with_post_padding(mut self, padding: &[i64]) -> ConvAttrs {
        self.post_padding = padding.to_vec();
        self
    }

    pub fn with_stride(mut self, stride: &[i64]) -> ConvAttrs {
        self.stride = stride.to_vec();
        self
    }

    pub fn with_dilation(mut self, dilation: &[i64]) -> ConvAttrs {
        self.dilation = dilation.to_vec();
        self
    }

    pub fn with_mode(mut self, mode: ConvMode) -> ConvAttrs {
        self.mode = mode;
        self
    }

    /// Check the attribute lists against the number of spatial dims and their values.
    pub fn check(&self, spatial_rank: usize) -> std::result::Result<(), String> {
        let lists: [(&str, &Vec<i64>, i64); 4] =
            [("pre_padding", &self.pre_padding, 0), ("post_padding", &self.post_padding, 0), ("stride", &self.stride, 1), ("dilation", &self.dilation, 1)];
        for (name, list, min) in lists {
            if list.len() != spatial_rank {
                return Err(format!("{name} has {} entries {list:?} but the tensors have {spatial_rank} spatial dims (one entry per spatial dim)", list.len()));
            }
            if let Some((i, v)) = list.iter().enumerate().find(|(_, &v)| v < min) {
                return Err(format!("{name}[{i}] must be >= {min}, got {v} ({name} {list:?})"));
            }
        }
        Ok(())
    }

    /// The output dims `[n, k, spatial...]` of a forward convolution of an image with `image`
    /// dims by a filter with `filter` dims, after checking ranks, channels, groups and the
    /// attributes. `image_name` and `filter_name` name the two tensors in errors.
    pub fn forward_dims(&self, image: &[i64], filter: &[i64], image_name: &str, filter_name: &str) -> std::result::Result<Vec<i64>, String> {
        if !(3..=5).contains(&image.len()) {
            return Err(format!("image {image_name} must have rank 3, 4 or 5 ([n, c, spatial...] for 1D, 2D, 3D), got rank {} (dims {image:?})", image.len()));
        }
        if filter.len() != image.len() {
            return Err(format!(
                "filter {filter_name} has rank {} (dims {filter:?}) but image {image_name} has rank {} (dims {image:?}); the filter must be [k, c / groups, spatial...] with the image's rank",
                filter.len(),
                image.len()
            ));
        }
        let spatial = image.len() - 2;
        self.check(spatial)?;
        let (c_image, k, c_filter) = (image[1], filter[0], filter[1]);
        if c_filter <= 0 || c_image <= 0 || k <= 0 || image[0] <= 0 {
            return Err(format!("image {image_name} dims {image:?} and filter {filter_name} dims {filter:?} must be positive"));
        }
        if c_image % c_filter != 0 {
            return Err(format!(
                "image {image_name} has {c_image} channels, which is not a multiple of the {c_filter} input channels of filter {filter_name} (its dim 1; groups = image channels / filter channels must be a whole number)"
            ));
        }
        let groups = c_image / c_filter;
        if k % groups != 0 {
            return Err(format!(
                "filter {filter_name} has {k} output channels (dim 0), which is not divisible by groups = {groups} (image channels {c_image} / filter channels {c_filter})"
            ));
        }
        let mut out = vec![image[0], k];
        for d in 0..spatial {
            let (input, f) = (image[2 + d], filter[2 + d]);
            if input <= 0 || f <= 0 {
                return Err(format!("spatial dim {d}: image {image_name} size {input} and filter {filter_name} size {f} must be positive"));
            }
            let (pre, post, stride, dil) = (self.pre_padding[d], self.post_padding[d], self.stride[d], self.dilation[d]);
            let overflow = || format!("spatial dim {d}: the sizes overflow (image {input}, padding {pre}+{post}, filter {f}, dilation {dil})");
            let extent = dil.checked_mul(f - 1).and_then(|v| v.checked_add(1)).ok_or_else(overflow)?;
            let padded = input.checked_add(pre).and_then(|v| v.checked_add(post)).ok_or_else(overflow)?;
            if padded < extent {
                return Err(format!(
                    "spatial dim {d}: the output would be empty: image {image_name} size {input} + padding {pre} + {post} = {padded} is less than the dilated filter extent {extent} (filter {filter_name} size {f}, dilation {dil})"
                ));
            }
            out.push((padded - extent) / stride + 1);
        }
        Ok(out)
    }
}

impl Graph {
    /// Forward convolution: `x [n, c, spatial...]` by `w [k, c / groups, spatial...]` gives
    /// `y [n, k, spatial...]`, in `x`'s stride order. Ports `x`, `w` -> `y`.
    pub fn conv_fprop(&mut self, x: TensorId, w: TensorId, attrs: ConvAttrs) -> TensorId {
        self.add_node(super::Op::ConvFprop(attrs), None, vec![("x", x), ("w", w)], &["y"])[0]
    }

    /// Data gradient: the gradient `dx` (dims `dx_dims`, the forward image's) of a forward
    /// convolution from its output gradient `dy` and the filter `w`; `dx` follows `dy`'s
    /// stride order. Ports `dy`, `w` -> `dx`.
    pub fn conv_dgrad(&mut self, dy: TensorId, w: TensorId, dx_dims: &[i64], attrs: ConvAttrs) -> TensorId {
        let dx = self.add_node(super::Op::ConvDgrad(attrs), None, vec![("dy", dy), ("w", w)], &["dx"])[0];
        self.set_dims_and_reinfer(dx, dx_dims);
        dx
    }

    /// Weight gradient: the gradient `dw` (dims `dw_dims`, the forward filter's) of a forward
    /// convolution from its output gradient `dy` and its image `x`; `dw` follows `x`'s stride
    /// order (channels-last images give channels-last filters). Ports `dy`, `x` -> `dw`.
    pub fn conv_wgrad(&mut self, dy: TensorId, x: TensorId, dw_dims: &[i64], attrs: ConvAttrs) -> TensorId {
        let dw = self.add_node(super::Op::ConvWgrad(attrs), None, vec![("dy", dy), ("x", x)], &["dw"])[0];
        self.set_dims_and_reinfer(dw, dw_dims);
        dw
    }
}

/// Convolution reads float types, or 8-bit integers in a forward convolution.
fn check_float(ctx: &InferCtx, port: &str, t: &TensorDesc) -> Result<()> {
    let dt = t.data_type.unwrap_or(DataType::F32);
    if !dt.is_float() {
        return Err(ctx.err(format!(
            "`{port}` (tensor \"{}\") has type {dt}; this convolution takes float types only (f64, f32, f16, bf16, fp8_e4m3, fp8_e5m2; i8 and u8 in a forward convolution)",
            t.name
        )));
    }
    Ok(())
}

/// A forward convolution's inputs: both float, or both 8-bit integers (i8 or u8, each its own:
/// an int8 inference convolution, summed exactly in 32-bit integers as cuDNN's int8 convolutions
/// with an int32 compute type). Whether they are integers.
fn check_forward_inputs(ctx: &InferCtx, x: &TensorDesc, w: &TensorDesc) -> Result<bool> {
    let (tx, tw) = (x.data_type.unwrap_or(DataType::F32), w.data_type.unwrap_or(DataType::F32));
    let byte_int = |dt: DataType| matches!(dt, DataType::I8 | DataType::U8);
    if byte_int(tx) || byte_int(tw) {
        if !(byte_int(tx) && byte_int(tw)) {
            return Err(
                ctx.err(format!("`x` (tensor \"{}\") is {tx} but `w` (tensor \"{}\") is {tw}: an integer convolution takes 8-bit integers (i8 or u8) for both", x.name, w.name))
            );
        }
        return Ok(true);
    }
    check_float(ctx, "x", x)?;
    check_float(ctx, "w", w)?;
    Ok(false)
}

/// The type an output gets when nothing else sets it: its input's, but f32 for fp8 inputs
/// (fp8 is an input format; results are kept wider, as cuDNN's fp8 convolutions do) and i32 for
/// 8-bit integer inputs (their exact sums).
fn default_output_type(input: DataType) -> DataType {
    if input.is_fp8() {
        DataType::F32
    } else if input.is_integer() {
        DataType::I32
    } else {
        input
    }
}

/// After the output is set: its resolved type must be a float too (or, for `integer` inputs,
/// a float or an integer type: i32, i64, i8 or u8, rounded and saturated as every conversion).
fn check_output_type(ctx: &InferCtx, port: &str, integer: bool) -> Result<()> {
    if let Some(id) = ctx.node.output(port) {
        if let Some(dt) = ctx.graph.resolved_data_type(id) {
            if !dt.is_float() && !(integer && dt.is_integer()) {
                let name = ctx.graph.get(id).map(|t| t.name.clone()).unwrap_or_default();
                let what = if integer { "float or integer types" } else { "float types only" };
                return Err(ctx.err(format!("output `{port}` (tensor \"{name}\") has type {dt}; this convolution writes {what}")));
            }
        }
    }
    Ok(())
}

/// The dims the user gave an output whose size the op cannot infer (dgrad's dx, wgrad's dw).
fn given_output_dims(ctx: &InferCtx, port: &str, what: &str) -> Result<Vec<i64>> {
    let id = ctx.node.output(port).ok_or_else(|| ctx.err(format!("output `{port}` is missing")))?;
    let t = ctx.graph.get(id).ok_or_else(|| ctx.err(format!("output `{port}` refers to a tensor not in the graph")))?;
    if t.dims.is_empty() {
        return Err(ctx.err(format!("output `{port}` (tensor \"{}\") has no dims: the op cannot infer {what}; give them (the builder's {port}_dims)", t.name)));
    }
    Ok(t.dims.clone())
}

pub(crate) fn infer_fprop(ctx: &mut InferCtx, a: &ConvAttrs) -> Result<()> {
    let x = ctx.input("x")?;
    let w = ctx.input("w")?;
    let integer = check_forward_inputs(ctx, &x, &w)?;
    let y_dims = a.forward_dims(&x.dims, &w.dims, &format!("`x` (tensor \"{}\")", x.name), &format!("`w` (tensor \"{}\")", w.name)).map_err(|m| ctx.err(m))?;
    ctx.set_output("y", &y_dims, Some(&x), default_output_type(x.data_type.unwrap_or(DataType::F32)))?;
    check_output_type(ctx, "y", integer)
}

pub(crate) fn infer_dgrad(ctx: &mut InferCtx, a: &ConvAttrs) -> Result<()> {
    let dy = ctx.input("dy")?;
    let w = ctx.input("w")?;
    check_float(ctx, "dy", &dy)?;
    check_float(ctx, "w", &w)?;
    let dx_dims = given_output_dims(ctx, "dx", "the image size from dy and w")?;
    let y_dims = a.forward_dims(&dx_dims, &w.dims, "`dx`", &format!("`w` (tensor \"{}\")", w.name)).map_err(|m| ctx.err(m))?;
    if dy.dims != y_dims {
        return Err(ctx.err(format!(
            "`dy` (tensor \"{}\") has dims {:?} but a forward convolution of `dx` {dx_dims:?} by `w` {:?} with these attributes gives {y_dims:?}",
            dy.name, dy.dims, w.dims
        )));
    }
    ctx.set_output("dx", &dx_dims, Some(&dy), default_output_type(dy.data_type.unwrap_or(DataType::F32)))?;
    check_output_type(ctx, "dx", false)
}

pub(crate) fn infer_wgrad(ctx: &mut InferCtx, a: &ConvAttrs) -> Result<()> {
    let dy = ctx.input("dy")?;
    let x = ctx.input("x")?;
    check_float(ctx, "dy", &dy)?;
    check_float(ctx, "x", &x)?;
    let dw_dims = given_output_dims(ctx, "dw", "the filter size from dy and x")?;
    let y_dims = a.forward_dims(&x.dims, &dw_dims, &format!("`x` (tensor \"{}\")", x.name), "`dw`").map_err(|m| ctx.err(m))?;
    if dy.dims != y_dims {
        return Err(ctx.err(format!(
            "`dy` (tensor \"{}\") has dims {:?} but a forward convolution of `x` {:?} by `dw` {dw_dims:?} with these attributes gives {y_dims:?}",
            dy.name, dy.dims, x.dims
        )));
    }
    ctx.set_output("dw", &dw_dims, Some(&x), default_output_type(dy.data_type.unwrap_or(DataType::F32)))?;
    check_output_type(ctx, "dw", false)
}
