//! Descriptors: tensor, filter, convolution, activation, pooling, op-tensor and reduce-tensor,
//! with their create, set, get and destroy calls. A descriptor is plain data; the calls that use
//! one check it is set and consistent with the others.

#![allow(non_upper_case_globals)]

use crate::api::*;
use crate::registry::Registry;
use crate::types::*;
use ferrodnn::DataType;

/// cuDNN's largest tensor rank (`CUDNN_DIM_MAX`).
pub const DIM_MAX: i32 = 8;

/// A `cudnnDataType_t` as ferrodnn's type; the types ferrodnn has no kernels for are
/// CUDNN_STATUS_NOT_SUPPORTED, values outside the enum CUDNN_STATUS_BAD_PARAM.
pub fn data_type(raw: i32) -> R<DataType> {
    Ok(match raw {
        CUDNN_DATA_FLOAT => DataType::F32,
        CUDNN_DATA_DOUBLE => DataType::F64,
        CUDNN_DATA_HALF => DataType::F16,
        CUDNN_DATA_BFLOAT16 => DataType::Bf16,
        CUDNN_DATA_INT8 => DataType::I8,
        CUDNN_DATA_UINT8 => DataType::U8,
        CUDNN_DATA_INT32 => DataType::I32,
        CUDNN_DATA_INT64 => DataType::I64,
        CUDNN_DATA_BOOLEAN => DataType::Bool,
        CUDNN_DATA_FP8_E4M3 => DataType::Fp8E4m3,
        CUDNN_DATA_FP8_E5M2 => DataType::Fp8E5m2,
        CUDNN_DATA_INT8x4 | CUDNN_DATA_UINT8x4 | CUDNN_DATA_INT8x32 | 14..=23 => {
            return Err(ApiError::new(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, format!("data type {raw} (a vectorized, fp4 or block-scale type) is not supported by ferrodnn")))
        }
        _ => return Err(bad(format!("dataType {raw} is not a cudnnDataType_t"))),
    })
}

// ------------------------------------------------------------------------------------------
// Tensor descriptors
// ------------------------------------------------------------------------------------------

/// A tensor descriptor: dims and strides in elements, outermost first (`[n, c, h, w, ...]`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TensorDescriptor {
    pub set: bool,
    pub dt_raw: i32,
    pub dims: Vec<i64>,
    pub strides: Vec<i64>,
}

impl TensorDescriptor {
    pub fn dt(&self) -> DataType {
        data_type(self.dt_raw).unwrap_or(DataType::F32)
    }
    /// Bytes a buffer must hold: one past the largest offset the strides reach.
    pub fn bytes(&self) -> usize {
        let mut max = 0i64;
        for (&d, &s) in self.dims.iter().zip(&self.strides) {
            max += (d - 1) * s;
        }
        (max as usize + 1) * self.dt().size()
    }
    pub fn elements(&self) -> i64 {
        self.dims.iter().product()
    }
    /// As a ferrodnn tensor named `name` with uid `uid`.
    pub fn fd(&self, name: &str, uid: i64) -> ferrodnn::TensorDesc {
        ferrodnn::TensorDesc::new(name, &self.dims, self.dt()).with_strides(&self.strides).with_uid(uid)
    }
    /// Whether the scaling factors (alpha, beta) of calls on this tensor are doubles.
    pub fn double(&self) -> bool {
        self.dt_raw == CUDNN_DATA_DOUBLE
    }
}

pub static TENSORS: Registry<TensorDescriptor> = Registry::new("cudnnTensorDescriptor_t");

/// The rank check of the Nd setters: cuDNN answers CUDNN_STATUS_NOT_SUPPORTED outside its ranks
/// (3 to CUDNN_DIM_MAX here: RNNs describe their tensors with 3 dims).
fn check_nb_dims(nb: i32) -> R<()> {
    if !(3..=DIM_MAX).contains(&nb) {
        return Err(unsupported(format!("nbDims {nb}: tensors of 3 to {DIM_MAX} dims are supported")));
    }
    Ok(())
}

/// A set tensor descriptor argument named `name`.
pub fn tensor(p: cudnnTensorDescriptor_t, name: &str) -> R<TensorDescriptor> {
    let t = TENSORS.get(p).map_err(|e| ApiError::new(e.status, format!("`{name}`: {}", e.msg)))?;
    if !t.set {
        return Err(bad(format!("`{name}` was created but never set (cudnnSetTensor*Descriptor)")));
    }
    Ok(t)
}

/// Packed strides for `dims` in NCHW (row-major) or NHWC (channels innermost) order.
pub fn format_strides(dims: &[i64], format: i32) -> R<Vec<i64>> {
    let order: Vec<usize> = match format {
        CUDNN_TENSOR_NCHW => (0..dims.len()).collect(),
        CUDNN_TENSOR_NHWC => std::iter::once(0).chain(2..dims.len()).chain(std::iter::once(1)).collect(),
        CUDNN_TENSOR_NCHW_VECT_C => return Err(unsupported("format CUDNN_TENSOR_NCHW_VECT_C (vectorized int8) is not supported")),
        _ => return Err(bad(format!("format {format} is not a cudnnTensorFormat_t"))),
    };
    Ok(ferrodnn::graph::strides_for_order(dims, &order))
}

/// Checks and stores a tensor description.
fn set_tensor(p: cudnnTensorDescriptor_t, dt_raw: i32, dims: Vec<i64>, strides: Vec<i64>) -> R<()> {
    data_type(dt_raw)?;
    if let Some(d) = dims.iter().find(|&&d| d <= 0) {
        return Err(bad(format!("dims {dims:?}: every dim must be positive, got {d}")));
    }
    if let Some(s) = strides.iter().find(|&&s| s < 0) {
        return Err(bad(format!("strides {strides:?}: strides must be non-negative, got {s}")));
    }
    let mut extent: i128 = 1;
    let mut count: i128 = 1;
    for (&d, &s) in dims.iter().zip(&strides) {
        extent += (d as i128 - 1) * s as i128;
        count *= d as i128;
    }
    if count > ferrodnn::graph::MAX_ELEMENTS as i128 || extent > ferrodnn::graph::MAX_ELEMENTS as i128 {
        return Err(ApiError::new(CUDNN_STATUS_NOT_SUPPORTED_SHAPE, format!("dims {dims:?} with strides {strides:?} span more than 2^48 elements")));
    }
    TENSORS.with(p, |t| {
        *t = TensorDescriptor { set: true, dt_raw, dims, strides };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cudnnCreateTensorDescriptor(out: *mut cudnnTensorDescriptor_t) -> Status {
    guard("cudnnCreateTensorDescriptor", || {
        non_null(out, "tensorDesc")?;
        let p = TENSORS.create(TensorDescriptor::default());
        // SAFETY: checked not null; the caller gives a writable descriptor slot.
        unsafe { write_out(out, "tensorDesc", p) }
    })
}

#[no_mangle]
pub extern "C" fn cudnnDestroyTensorDescriptor(p: cudnnTensorDescriptor_t) -> Status {
    guard("cudnnDestroyTensorDescriptor", || if p.is_null() { Ok(()) } else { TENSORS.destroy(p) })
}

#[no_mangle]
pub extern "C" fn cudnnSetTensor4dDescriptor(p: cudnnTensorDescriptor_t, format: i32, dt: i32, n: i32, c: i32, h: i32, w: i32) -> Status {
    guard("cudnnSetTensor4dDescriptor", || {
        let dims = vec![n as i64, c as i64, h as i64, w as i64];
        if dims.iter().any(|&d| d <= 0) {
            return Err(bad(format!("n, c, h, w = {n}, {c}, {h}, {w}: each must be positive")));
        }
        let strides = format_strides(&dims, format)?;
        set_tensor(p, dt, dims, strides)
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnSetTensor4dDescriptorEx(p: cudnnTensorDescriptor_t, dt: i32, n: i32, c: i32, h: i32, w: i32, ns: i32, cs: i32, hs: i32, ws: i32) -> Status {
    guard("cudnnSetTensor4dDescriptorEx", || set_tensor(p, dt, vec![n as i64, c as i64, h as i64, w as i64], vec![ns as i64, cs as i64, hs as i64, ws as i64]))
}

#[no_mangle]
pub extern "C" fn cudnnSetTensorNdDescriptor(p: cudnnTensorDescriptor_t, dt: i32, nb: i32, dim_a: *const i32, stride_a: *const i32) -> Status {
    guard("cudnnSetTensorNdDescriptor", || {
        check_nb_dims(nb)?;
        // SAFETY: the caller gives nbDims readable ints in each array (null is refused).
        let dims = unsafe { read_ints(dim_a, nb, "dimA") }?;
        // SAFETY: as above.
        let strides = unsafe { read_ints(stride_a, nb, "strideA") }?;
        set_tensor(p, dt, dims, strides)
    })
}

#[no_mangle]
pub extern "C" fn cudnnSetTensorNdDescriptorEx(p: cudnnTensorDescriptor_t, format: i32, dt: i32, nb: i32, dim_a: *const i32) -> Status {
    guard("cudnnSetTensorNdDescriptorEx", || {
        check_nb_dims(nb)?;
        // SAFETY: the caller gives nbDims readable ints (null is refused).
        let dims = unsafe { read_ints(dim_a, nb, "dimA") }?;
        if let Some(d) = dims.iter().find(|&&d| d <= 0) {
            return Err(bad(format!("dimA {dims:?}: every dim must be positive, got {d}")));
        }
        let strides = format_strides(&dims, format)?;
        set_tensor(p, dt, dims, strides)
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnGetTensor4dDescriptor(
    p: cudnnTensorDescriptor_t,
    dt: *mut i32,
    n: *mut i32,
    c: *mut i32,
    h: *mut i32,
    w: *mut i32,
    ns: *mut i32,
    cs: *mut i32,
    hs: *mut i32,
    ws: *mut i32,
) -> Status {
    guard("cudnnGetTensor4dDescriptor", || {
        let t = tensor(p, "tensorDesc")?;
        if t.dims.len() != 4 {
            return Err(bad(format!("the descriptor has {} dims, not 4 (dims {:?})", t.dims.len(), t.dims)));
        }
        // SAFETY: each out pointer is checked not null; the caller gives writable ints.
        unsafe {
            write_out(dt, "dataType", t.dt_raw)?;
            for (ptr, name, v) in [(n, "n", t.dims[0]), (c, "c", t.dims[1]), (h, "h", t.dims[2]), (w, "w", t.dims[3])] {
                write_out(ptr, name, v as i32)?;
            }
            for (ptr, name, v) in [(ns, "nStride", t.strides[0]), (cs, "cStride", t.strides[1]), (hs, "hStride", t.strides[2]), (ws, "wStride", t.strides[3])] {
                write_out(ptr, name, v as i32)?;
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cudnnGetTensorNdDescriptor(p: cudnnTensorDescriptor_t, requested: i32, dt: *mut i32, nb: *mut i32, dim_a: *mut i32, stride_a: *mut i32) -> Status {
    guard("cudnnGetTensorNdDescriptor", || {
        let t = tensor(p, "tensorDesc")?;
        if requested < 0 {
            return Err(bad(format!("nbDimsRequested {requested} is negative")));
        }
        // SAFETY: out pointers are checked not null; the arrays hold nbDimsRequested ints.
        unsafe {
            write_out(dt, "dataType", t.dt_raw)?;
            write_out(nb, "nbDims", t.dims.len() as i32)?;
            let k = (requested as usize).min(t.dims.len());
            if k > 0 {
                non_null(dim_a, "dimA")?;
                non_null(stride_a, "strideA")?;
                for i in 0..k {
                    *dim_a.add(i) = t.dims[i] as i32;
                    *stride_a.add(i) = t.strides[i] as i32;
                }
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cudnnGetTensorSizeInBytes(p: cudnnTensorDescriptor_t, size: *mut usize) -> Status {
    guard("cudnnGetTensorSizeInBytes", || {
        let t = tensor(p, "tensorDesc")?;
        // SAFETY: checked not null by write_out; the caller gives a writable size_t.
        unsafe { write_out(size, "size", t.bytes()) }
    })
}

// ------------------------------------------------------------------------------------------
// Filter descriptors
// ------------------------------------------------------------------------------------------

/// A filter: `[k, c / groups, spatial...]` in NCHW (KCRS) or NHWC (KRSC) format.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FilterDescriptor {
    pub set: bool,
    pub dt_raw: i32,
    pub format: i32,
    pub dims: Vec<i64>,
}

impl FilterDescriptor {
    pub fn dt(&self) -> DataType {
        data_type(self.dt_raw).unwrap_or(DataType::F32)
    }
    pub fn strides(&self) -> Vec<i64> {
        format_strides(&self.dims, self.format).unwrap_or_else(|_| ferrodnn::graph::packed_strides(&self.dims))
    }
    pub fn bytes(&self) -> usize {
        self.dims.iter().product::<i64>() as usize * self.dt().size()
    }
    /// As a tensor descriptor (for blending and the Rust tests).
    pub fn as_tensor(&self) -> TensorDescriptor {
        TensorDescriptor { set: true, dt_raw: self.dt_raw, dims: self.dims.clone(), strides: self.strides() }
    }
}

pub static FILTERS: Registry<FilterDescriptor> = Registry::new("cudnnFilterDescriptor_t");

pub fn filter(p: cudnnFilterDescriptor_t, name: &str) -> R<FilterDescriptor> {
    let f = FILTERS.get(p).map_err(|e| ApiError::new(e.status, format!("`{name}`: {}", e.msg)))?;
    if !f.set {
        return Err(bad(format!("`{name}` was created but never set (cudnnSetFilter*Descriptor)")));
    }
    Ok(f)
}

fn set_filter(p: cudnnFilterDescriptor_t, dt_raw: i32, format: i32, dims: Vec<i64>) -> R<()> {
    data_type(dt_raw)?;
    if let Some(d) = dims.iter().find(|&&d| d <= 0) {
        return Err(bad(format!("filter dims {dims:?}: every dim must be positive, got {d}")));
    }
    format_strides(&dims, format)?;
    if dims.iter().fold(1i128, |a, &d| a * d as i128) > ferrodnn::graph::MAX_ELEMENTS as i128 {
        return Err(ApiError::new(CUDNN_STATUS_NOT_SUPPORTED_SHAPE, format!("filter dims {dims:?} hold more than 2^48 elements")));
    }
    FILTERS.with(p, |f| {
        *f = FilterDescriptor { set: true, dt_raw, format, dims };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cudnnCreateFilterDescriptor(out: *mut cudnnFilterDescriptor_t) -> Status {
    guard("cudnnCreateFilterDescriptor", || {
        non_null(out, "filterDesc")?;
        let p = FILTERS.create(FilterDescriptor::default());
        // SAFETY: checked not null; the caller gives a writable descriptor slot.
        unsafe { write_out(out, "filterDesc", p) }
    })
}

#[no_mangle]
pub extern "C" fn cudnnDestroyFilterDescriptor(p: cudnnFilterDescriptor_t) -> Status {
    guard("cudnnDestroyFilterDescriptor", || if p.is_null() { Ok(()) } else { FILTERS.destroy(p) })
}

#[no_mangle]
pub extern "C" fn cudnnSetFilter4dDescriptor(p: cudnnFilterDescriptor_t, dt: i32, format: i32, k: i32, c: i32, h: i32, w: i32) -> Status {
    guard("cudnnSetFilter4dDescriptor", || set_filter(p, dt, format, vec![k as i64, c as i64, h as i64, w as i64]))
}

#[no_mangle]
pub extern "C" fn cudnnSetFilterNdDescriptor(p: cudnnFilterDescriptor_t, dt: i32, format: i32, nb: i32, dims: *const i32) -> Status {
    guard("cudnnSetFilterNdDescriptor", || {
        check_nb_dims(nb)?;
        // SAFETY: the caller gives nbDims readable ints (null is refused).
        let d = unsafe { read_ints(dims, nb, "filterDimA") }?;
        set_filter(p, dt, format, d)
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnGetFilter4dDescriptor(p: cudnnFilterDescriptor_t, dt: *mut i32, format: *mut i32, k: *mut i32, c: *mut i32, h: *mut i32, w: *mut i32) -> Status {
    guard("cudnnGetFilter4dDescriptor", || {
        let f = filter(p, "filterDesc")?;
        if f.dims.len() != 4 {
            return Err(bad(format!("the filter has {} dims, not 4 (dims {:?})", f.dims.len(), f.dims)));
        }
        // SAFETY: each out pointer is checked not null; the caller gives writable ints.
        unsafe {
            write_out(dt, "dataType", f.dt_raw)?;
            write_out(format, "format", f.format)?;
            for (ptr, name, v) in [(k, "k", f.dims[0]), (c, "c", f.dims[1]), (h, "h", f.dims[2]), (w, "w", f.dims[3])] {
                write_out(ptr, name, v as i32)?;
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cudnnGetFilterNdDescriptor(p: cudnnFilterDescriptor_t, requested: i32, dt: *mut i32, format: *mut i32, nb: *mut i32, dims: *mut i32) -> Status {
    guard("cudnnGetFilterNdDescriptor", || {
        let f = filter(p, "filterDesc")?;
        if requested < 0 {
            return Err(bad(format!("nbDimsRequested {requested} is negative")));
        }
        // SAFETY: out pointers are checked not null; the array holds nbDimsRequested ints.
        unsafe {
            write_out(dt, "dataType", f.dt_raw)?;
            write_out(format, "format", f.format)?;
            write_out(nb, "nbDims", f.dims.len() as i32)?;
            let k = (requested as usize).min(f.dims.len());
            if k > 0 {
                non_null(dims, "filterDimA")?;
                for i in 0..k {
                    *dims.add(i) = f.dims[i] as i32;
                }
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cudnnGetFilterSizeInBytes(p: cudnnFilterDescriptor_t, size: *mut usize) -> Status {
    guard("cudnnGetFilterSizeInBytes", || {
        let f = filter(p, "filterDesc")?;
        // SAFETY: checked not null by write_out.
        unsafe { write_out(size, "size", f.bytes()) }
    })
}

// ------------------------------------------------------------------------------------------
// Convolution descriptors
// ------------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
pub struct ConvDescriptor {
    pub set: bool,
    pub pads: Vec<i64>,
    pub strides: Vec<i64>,
    pub dilations: Vec<i64>,
    pub mode: i32,
    pub compute_raw: i32,
    pub groups: i64,
    pub math: i32,
    pub reorder: i32,
}

impl Default for ConvDescriptor {
    fn default() -> Self {
        ConvDescriptor {
            set: false,
            pads: vec![],
            strides: vec![],
            dilations: vec![],
            mode: CUDNN_CONVOLUTION,
            compute_raw: CUDNN_DATA_FLOAT,
            groups: 1,
            math: CUDNN_DEFAULT_MATH,
            reorder: CUDNN_DEFAULT_REORDER,
        }
    }
}

impl ConvDescriptor {
    /// ferrodnn's attributes for this convolution.
    pub fn attrs(&self) -> ferrodnn::graph::ops::conv::ConvAttrs {
        use ferrodnn::graph::ops::conv::{ConvAttrs, ConvMode};
        ConvAttrs::new(self.pads.len()).with_padding(&self.pads).with_stride(&self.strides).with_dilation(&self.dilations).with_mode(if self.mode == CUDNN_CONVOLUTION {
            ConvMode::Convolution
        } else {
            ConvMode::CrossCorrelation
        })
    }

    /// The output dims of a forward convolution of `x` by `w`, after checking the three agree
    /// (ranks, channels and groups, sizes): CUDNN_STATUS_BAD_PARAM when they do not.
    pub fn output_dims(&self, x: &[i64], w: &FilterDescriptor) -> R<Vec<i64>> {
        if x.len() != w.dims.len() {
            return Err(bad(format!("the tensor has {} dims {x:?} but the filter {} {:?}", x.len(), w.dims.len(), w.dims)));
        }
        if x.len() != self.pads.len() + 2 {
            return Err(bad(format!("the convolution has {} spatial dims but the tensor {x:?} has {}", self.pads.len(), x.len().saturating_sub(2))));
        }
        if x[1] != w.dims[1] * self.groups {
            return Err(bad(format!(
                "the tensor has {} channels but the filter {:?} takes {} per group and the group count is {} ({} x {} = {})",
                x[1],
                w.dims,
                w.dims[1],
                self.groups,
                w.dims[1],
                self.groups,
                w.dims[1] * self.groups
            )));
        }
        if w.dims[0] % self.groups != 0 {
            return Err(bad(format!("the filter's {} output channels are not a multiple of the group count {}", w.dims[0], self.groups)));
        }
        self.attrs().forward_dims(x, &w.dims, "x", "w").map_err(bad)
    }

    /// The ferrodnn type the convolution computes in.
    pub fn compute(&self) -> DataType {
        data_type(self.compute_raw).unwrap_or(DataType::F32)
    }
}

pub static CONVS: Registry<ConvDescriptor> = Registry::new("cudnnConvolutionDescriptor_t");

pub fn conv(p: cudnnConvolutionDescriptor_t, name: &str) -> R<ConvDescriptor> {
    let c = CONVS.get(p).map_err(|e| ApiError::new(e.status, format!("`{name}`: {}", e.msg)))?;
    if !c.set {
        return Err(bad(format!("`{name}` was created but never set (cudnnSetConvolution*Descriptor)")));
    }
    Ok(c)
}

fn set_conv(p: cudnnConvolutionDescriptor_t, pads: Vec<i64>, strides: Vec<i64>, dilations: Vec<i64>, mode: i32, compute: i32) -> R<()> {
    if !(1..=3).contains(&pads.len()) {
        return Err(ApiError::new(CUDNN_STATUS_NOT_SUPPORTED, format!("{} spatial dims: ferrodnn convolves over 1 to 3", pads.len())));
    }
    if let Some(v) = pads.iter().find(|&&v| v < 0) {
        return Err(bad(format!("padding {pads:?}: must be non-negative, got {v}")));
    }
    if let Some(v) = strides.iter().find(|&&v| v <= 0) {
        return Err(bad(format!("filter strides {strides:?}: must be positive, got {v}")));
    }
    if let Some(v) = dilations.iter().find(|&&v| v <= 0) {
        return Err(bad(format!("dilations {dilations:?}: must be positive, got {v}")));
    }
    if mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION {
        return Err(bad(format!("mode {mode} is not a cudnnConvolutionMode_t")));
    }
    let ct = data_type(compute)?;
    if !ct.is_float() {
        return Err(ApiError::new(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, format!("computeType {compute}: ferrodnn's legacy convolutions compute in float types")));
    }
    CONVS.with(p, |c| {
        c.set = true;
        c.pads = pads;
        c.strides = strides;
        c.dilations = dilations;
        c.mode = mode;
        c.compute_raw = compute;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cudnnCreateConvolutionDescriptor(out: *mut cudnnConvolutionDescriptor_t) -> Status {
    guard("cudnnCreateConvolutionDescriptor", || {
        non_null(out, "convDesc")?;
        let p = CONVS.create(ConvDescriptor::default());
        // SAFETY: checked not null; the caller gives a writable descriptor slot.
        unsafe { write_out(out, "convDesc", p) }
    })
}

#[no_mangle]
pub extern "C" fn cudnnDestroyConvolutionDescriptor(p: cudnnConvolutionDescriptor_t) -> Status {
    guard("cudnnDestroyConvolutionDescriptor", || if p.is_null() { Ok(()) } else { CONVS.destroy(p) })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnSetConvolution2dDescriptor(p: cudnnConvolutionDescriptor_t, pad_h: i32, pad_w: i32, u: i32, v: i32, dh: i32, dw: i32, mode: i32, compute: i32) -> Status {
    guard("cudnnSetConvolution2dDescriptor", || set_conv(p, vec![pad_h as i64, pad_w as i64], vec![u as i64, v as i64], vec![dh as i64, dw as i64], mode, compute))
}

#[no_mangle]
pub extern "C" fn cudnnSetConvolutionNdDescriptor(
    p: cudnnConvolutionDescriptor_t,
    len: i32,
    pad: *const i32,
    stride: *const i32,
    dil: *const i32,
    mode: i32,
    compute: i32,
) -> Status {
    guard("cudnnSetConvolutionNdDescriptor", || {
        if len < 0 {
            return Err(bad(format!("arrayLength {len} is negative")));
        }
        if !(1..=DIM_MAX - 2).contains(&len) {
            return Err(unsupported(format!("arrayLength {len}: 1 to {} spatial dims are supported", DIM_MAX - 2)));
        }
        // SAFETY: the caller gives arrayLength readable ints in each array (null is refused).
        let (pads, strides, dils) = unsafe { (read_ints(pad, len, "padA")?, read_ints(stride, len, "filterStrideA")?, read_ints(dil, len, "dilationA")?) };
        set_conv(p, pads, strides, dils, mode, compute)
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnGetConvolution2dDescriptor(
    p: cudnnConvolutionDescriptor_t,
    pad_h: *mut i32,
    pad_w: *mut i32,
    u: *mut i32,
    v: *mut i32,
    dh: *mut i32,
    dw: *mut i32,
    mode: *mut i32,
    compute: *mut i32,
) -> Status {
    guard("cudnnGetConvolution2dDescriptor", || {
        let c = conv(p, "convDesc")?;
        if c.pads.len() != 2 {
            return Err(bad(format!("the convolution has {} spatial dims, not 2", c.pads.len())));
        }
        // SAFETY: each out pointer is checked not null; the caller gives writable ints.
        unsafe {
            for (ptr, name, val) in [
                (pad_h, "pad_h", c.pads[0]),
                (pad_w, "pad_w", c.pads[1]),
                (u, "u", c.strides[0]),
                (v, "v", c.strides[1]),
                (dh, "dilation_h", c.dilations[0]),
                (dw, "dilation_w", c.dilations[1]),
            ] {
                write_out(ptr, name, val as i32)?;
            }
            write_out(mode, "mode", c.mode)?;
            write_out(compute, "computeType", c.compute_raw)
        }
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnGetConvolutionNdDescriptor(
    p: cudnnConvolutionDescriptor_t,
    requested: i32,
    len: *mut i32,
    pad: *mut i32,
    stride: *mut i32,
    dil: *mut i32,
    mode: *mut i32,
    compute: *mut i32,
) -> Status {
    guard("cudnnGetConvolutionNdDescriptor", || {
        let c = conv(p, "convDesc")?;
        if requested < 0 {
            return Err(bad(format!("arrayLengthRequested {requested} is negative")));
        }
        // SAFETY: out pointers are checked not null; the arrays hold arrayLengthRequested ints.
        unsafe {
            write_out(len, "arrayLength", c.pads.len() as i32)?;
            let k = (requested as usize).min(c.pads.len());
            if k > 0 {
                non_null(pad, "padA")?;
                non_null(stride, "strideA")?;
                non_null(dil, "dilationA")?;
                for i in 0..k {
                    *pad.add(i) = c.pads[i] as i32;
                    *stride.add(i) = c.strides[i] as i32;
                    *dil.add(i) = c.dilations[i] as i32;
                }
            }
            write_out(mode, "mode", c.mode)?;
            write_out(compute, "computeType", c.compute_raw)
        }
    })
}

#[no_mangle]
pub extern "C" fn cudnnSetConvolutionGroupCount(p: cudnnConvolutionDescriptor_t, groups: i32) -> Status {
    guard("cudnnSetConvolutionGroupCount", || {
        if groups < 1 {
            return Err(bad(format!("groupCount must be at least 1, got {groups}")));
        }
        CONVS.with(p, |c| {
            c.groups = groups as i64;
            Ok(())
        })
    })
}

#[no_mangle]
pub extern "C" fn cudnnGetConvolutionGroupCount(p: cudnnConvolutionDescriptor_t, groups: *mut i32) -> Status {
    guard("cudnnGetConvolutionGroupCount", || {
        let g = CONVS.with(p, |c| Ok(c.groups))?;
        // SAFETY: checked not null by write_out.
        unsafe { write_out(groups, "groupCount", g as i32) }
    })
}

#[no_mangle]
pub extern "C" fn cudnnSetConvolutionMathType(p: cudnnConvolutionDescriptor_t, math: i32) -> Status {
    guard("cudnnSetConvolutionMathType", || {
        if !(CUDNN_DEFAULT_MATH..=CUDNN_FMA_MATH).contains(&math) {
            return Err(bad(format!("mathType {math} is not a cudnnMathType_t")));
        }
        CONVS.with(p, |c| {
            c.math = math;
            Ok(())
        })
    })
}

#[no_mangle]
pub extern "C" fn cudnnGetConvolutionMathType(p: cudnnConvolutionDescriptor_t, math: *mut i32) -> Status {
    guard("cudnnGetConvolutionMathType", || {
        let m = CONVS.with(p, |c| Ok(c.math))?;
        // SAFETY: checked not null by write_out.
        unsafe { write_out(math, "mathType", m) }
    })
}

#[no_mangle]
pub extern "C" fn cudnnSetConvolutionReorderType(p: cudnnConvolutionDescriptor_t, reorder: i32) -> Status {
    guard("cudnnSetConvolutionReorderType", || {
        if reorder != CUDNN_DEFAULT_REORDER && reorder != CUDNN_NO_REORDER {
            return Err(bad(format!("reorderType {reorder} is not a cudnnReorderType_t")));
        }
        CONVS.with(p, |c| {
            c.reorder = reorder;
            Ok(())
        })
    })
}

#[no_mangle]
pub extern "C" fn cudnnGetConvolutionReorderType(p: cudnnConvolutionDescriptor_t, reorder: *mut i32) -> Status {
    guard("cudnnGetConvolutionReorderType", || {
        let r = CONVS.with(p, |c| Ok(c.reorder))?;
        // SAFETY: checked not null by write_out.
        unsafe { write_out(reorder, "reorderType", r) }
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnGetConvolution2dForwardOutputDim(
    p: cudnnConvolutionDescriptor_t,
    x: cudnnTensorDescriptor_t,
    w: cudnnFilterDescriptor_t,
    n: *mut i32,
    c: *mut i32,
    h: *mut i32,
    wo: *mut i32,
) -> Status {
    guard("cudnnGetConvolution2dForwardOutputDim", || {
        let (cd, xd, wd) = (conv(p, "convDesc")?, tensor(x, "inputTensorDesc")?, filter(w, "filterDesc")?);
        if xd.dims.len() != 4 {
            return Err(bad(format!("inputTensorDesc has {} dims, not 4", xd.dims.len())));
        }
        let out = cd.output_dims(&xd.dims, &wd)?;
        // SAFETY: each out pointer is checked not null by write_out.
        unsafe {
            for (ptr, name, v) in [(n, "n", out[0]), (c, "c", out[1]), (h, "h", out[2]), (wo, "w", out[3])] {
                write_out(ptr, name, v as i32)?;
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cudnnGetConvolutionNdForwardOutputDim(p: cudnnConvolutionDescriptor_t, x: cudnnTensorDescriptor_t, w: cudnnFilterDescriptor_t, nb: i32, out: *mut i32) -> Status {
    guard("cudnnGetConvolutionNdForwardOutputDim", || {
        let (cd, xd, wd) = (conv(p, "convDesc")?, tensor(x, "inputTensorDesc")?, filter(w, "filterDesc")?);
        let dims = cd.output_dims(&xd.dims, &wd)?;
        if nb as usize != dims.len() {
            return Err(bad(format!("nbDims {nb} but the output has {} dims", dims.len())));
        }
        non_null(out, "tensorOuputDimA")?;
        for (i, &d) in dims.iter().enumerate() {
            // SAFETY: not null (checked); the caller gives nbDims writable ints.
            unsafe { *out.add(i) = d as i32 };
        }
        Ok(())
    })
}

// ------------------------------------------------------------------------------------------
// Activation descriptors
// ------------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
pub struct ActivationDescriptor {
    pub set: bool,
    pub mode: i32,
    pub nan: i32,
    pub coef: f64,
    pub swish_beta: f64,
}

impl Default for ActivationDescriptor {
    fn default() -> Self {
        ActivationDescriptor { set: false, mode: CUDNN_ACTIVATION_RELU, nan: CUDNN_NOT_PROPAGATE_NAN, coef: 0.0, swish_beta: 1.0 }
    }
}

pub static ACTIVATIONS: Registry<ActivationDescriptor> = Registry::new("cudnnActivationDescriptor_t");

pub fn activation(p: cudnnActivationDescriptor_t, name: &str) -> R<ActivationDescriptor> {
    let a = ACTIVATIONS.get(p).map_err(|e| ApiError::new(e.status, format!("`{name}`: {}", e.msg)))?;
    if !a.set {
        return Err(bad(format!("`{name}` was created but never set (cudnnSetActivationDescriptor)")));
    }
    Ok(a)
}

#[no_mangle]
pub extern "C" fn cudnnCreateActivationDescriptor(out: *mut cudnnActivationDescriptor_t) -> Status {
    guard("cudnnCreateActivationDescriptor", || {
        non_null(out, "activationDesc")?;
        let p = ACTIVATIONS.create(ActivationDescriptor::default());
        // SAFETY: checked not null; the caller gives a writable descriptor slot.
        unsafe { write_out(out, "activationDesc", p) }
    })
}

#[no_mangle]
pub extern "C" fn cudnnDestroyActivationDescriptor(p: cudnnActivationDescriptor_t) -> Status {
    guard("cudnnDestroyActivationDescriptor", || if p.is_null() { Ok(()) } else { ACTIVATIONS.destroy(p) })
}

#[no_mangle]
pub extern "C" fn cudnnSetActivationDescriptor(p: cudnnActivationDescriptor_t, mode: i32, nan: i32, coef: f64) -> Status {
    guard("cudnnSetActivationDescriptor", || {
        if !(CUDNN_ACTIVATION_SIGMOID..=CUDNN_ACTIVATION_SWISH).contains(&mode) {
            return Err(bad(format!("mode {mode} is not a cudnnActivationMode_t")));
        }
        if nan != CUDNN_NOT_PROPAGATE_NAN && nan != CUDNN_PROPAGATE_NAN {
            return Err(bad(format!("reluNanOpt {nan} is not a cudnnNanPropagation_t")));
        }
        if !coef.is_finite() {
            return Err(bad(format!("coef must be finite, got {coef}")));
        }
        ACTIVATIONS.with(p, |a| {
            a.set = true;
            a.mode = mode;
            a.nan = nan;
            a.coef = coef;
            Ok(())
        })
    })
}

#[no_mangle]
pub extern "C" fn cudnnGetActivationDescriptor(p: cudnnActivationDescriptor_t, mode: *mut i32, nan: *mut i32, coef: *mut f64) -> Status {
    guard("cudnnGetActivationDescriptor", || {
        let a = activation(p, "activationDesc")?;
        // SAFETY: each out pointer is checked not null by write_out.
        unsafe {
            write_out(mode, "mode", a.mode)?;
            write_out(nan, "reluNanOpt", a.nan)?;
            write_out(coef, "coef", a.coef)
        }
    })
}

#[no_mangle]
pub extern "C" fn cudnnSetActivationDescriptorSwishBeta(p: cudnnActivationDescriptor_t, beta: f64) -> Status {
    guard("cudnnSetActivationDescriptorSwishBeta", || {
        if !beta.is_finite() {
            return Err(bad(format!("swish_beta must be finite, got {beta}")));
        }
        ACTIVATIONS.with(p, |a| {
            a.swish_beta = beta;
            Ok(())
        })
    })
}

#[no_mangle]
pub extern "C" fn cudnnGetActivationDescriptorSwishBeta(p: cudnnActivationDescriptor_t, beta: *mut f64) -> Status {
    guard("cudnnGetActivationDescriptorSwishBeta", || {
        let b = ACTIVATIONS.with(p, |a| Ok(a.swish_beta))?;
        // SAFETY: checked not null by write_out.
        unsafe { write_out(beta, "swish_beta", b) }
    })
}

// ------------------------------------------------------------------------------------------
// Pooling descriptors
// ------------------------------------------------------------------------------------------

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolingDescriptor {
    pub set: bool,
    pub mode: i32,
    pub nan: i32,
    pub window: Vec<i64>,
    pub pads: Vec<i64>,
    pub strides: Vec<i64>,
}

impl PoolingDescriptor {
    pub fn attrs(&self) -> ferrodnn::graph::ops::resample::ResampleAttrs {
        use ferrodnn::graph::ops::resample::{ResampleAttrs, ResampleMode};
        let mode = match self.mode {
            CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING => ResampleMode::AvgIncludePadding,
            CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING => ResampleMode::AvgExcludePadding,
            _ => ResampleMode::Max,
        };
        ResampleAttrs { mode, window: self.window.clone(), stride: self.strides.clone(), pre_padding: self.pads.clone(), post_padding: self.pads.clone() }
    }
    /// The output dims for input dims `x`, or CUDNN_STATUS_BAD_PARAM saying why there are none.
    pub fn output_dims(&self, x: &[i64]) -> R<Vec<i64>> {
        if x.len() != self.window.len() + 2 {
            return Err(bad(format!("the pooling has {} spatial dims but the tensor {x:?} has {}", self.window.len(), x.len().saturating_sub(2))));
        }
        self.attrs().output_dims(x).map_err(bad)
    }
}

pub static POOLINGS: Registry<PoolingDescriptor> = Registry::new("cudnnPoolingDescriptor_t");

pub fn pooling(p: cudnnPoolingDescriptor_t, name: &str) -> R<PoolingDescriptor> {
    let d = POOLINGS.get(p).map_err(|e| ApiError::new(e.status, format!("`{name}`: {}", e.msg)))?;
    if !d.set {
        return Err(bad(format!("`{name}` was created but never set (cudnnSetPooling*Descriptor)")));
    }
    Ok(d)
}

fn set_pooling(p: cudnnPoolingDescriptor_t, mode: i32, nan: i32, window: Vec<i64>, pads: Vec<i64>, strides: Vec<i64>) -> R<()> {
    if !(CUDNN_POOLING_MAX..=CUDNN_POOLING_MAX_DETERMINISTIC).contains(&mode) {
        return Err(bad(format!("mode {mode} is not a cudnnPoolingMode_t")));
    }
    if nan != CUDNN_NOT_PROPAGATE_NAN && nan != CUDNN_PROPAGATE_NAN {
        return Err(bad(format!("maxpoolingNanOpt {nan} is not a cudnnNanPropagation_t")));
    }
    if !(1..=3).contains(&window.len()) {
        return Err(ApiError::new(CUDNN_STATUS_NOT_SUPPORTED, format!("{} spatial dims: ferrodnn pools over 1 to 3", window.len())));
    }
    if let Some(v) = window.iter().find(|&&v| v <= 0) {
        return Err(bad(format!("window {window:?}: must be positive, got {v}")));
    }
    if let Some(v) = strides.iter().find(|&&v| v <= 0) {
        return Err(bad(format!("strides {strides:?}: must be positive, got {v}")));
    }
    if let Some(v) = pads.iter().find(|&&v| v < 0) {
        return Err(bad(format!("padding {pads:?}: must be non-negative, got {v}")));
    }
    POOLINGS.with(p, |d| {
        *d = PoolingDescriptor { set: true, mode, nan, window, pads, strides };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cudnnCreatePoolingDescriptor(out: *mut cudnnPoolingDescriptor_t) -> Status {
    guard("cudnnCreatePoolingDescriptor", || {
        non_null(out, "poolingDesc")?;
        let p = POOLINGS.create(PoolingDescriptor::default());
        // SAFETY: checked not null; the caller gives a writable descriptor slot.
        unsafe { write_out(out, "poolingDesc", p) }
    })
}

#[no_mangle]
pub extern "C" fn cudnnDestroyPoolingDescriptor(p: cudnnPoolingDescriptor_t) -> Status {
    guard("cudnnDestroyPoolingDescriptor", || if p.is_null() { Ok(()) } else { POOLINGS.destroy(p) })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnSetPooling2dDescriptor(p: cudnnPoolingDescriptor_t, mode: i32, nan: i32, wh: i32, ww: i32, ph: i32, pw: i32, sh: i32, sw: i32) -> Status {
    guard("cudnnSetPooling2dDescriptor", || set_pooling(p, mode, nan, vec![wh as i64, ww as i64], vec![ph as i64, pw as i64], vec![sh as i64, sw as i64]))
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnSetPoolingNdDescriptor(p: cudnnPoolingDescriptor_t, mode: i32, nan: i32, nb: i32, window: *const i32, pad: *const i32, stride: *const i32) -> Status {
    guard("cudnnSetPoolingNdDescriptor", || {
        if nb < 0 {
            return Err(bad(format!("nbDims {nb} is negative")));
        }
        if !(1..=DIM_MAX - 2).contains(&nb) {
            return Err(unsupported(format!("nbDims {nb}: 1 to {} spatial dims are supported", DIM_MAX - 2)));
        }
        // SAFETY: the caller gives nbDims readable ints in each array (null is refused).
        let (w, p2, s) = unsafe { (read_ints(window, nb, "windowDimA")?, read_ints(pad, nb, "paddingA")?, read_ints(stride, nb, "strideA")?) };
        set_pooling(p, mode, nan, w, p2, s)
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnGetPooling2dDescriptor(
    p: cudnnPoolingDescriptor_t,
    mode: *mut i32,
    nan: *mut i32,
    wh: *mut i32,
    ww: *mut i32,
    ph: *mut i32,
    pw: *mut i32,
    sh: *mut i32,
    sw: *mut i32,
) -> Status {
    guard("cudnnGetPooling2dDescriptor", || {
        let d = pooling(p, "poolingDesc")?;
        if d.window.len() != 2 {
            return Err(bad(format!("the pooling has {} spatial dims, not 2", d.window.len())));
        }
        // SAFETY: each out pointer is checked not null by write_out.
        unsafe {
            write_out(mode, "mode", d.mode)?;
            write_out(nan, "maxpoolingNanOpt", d.nan)?;
            for (ptr, name, v) in [
                (wh, "windowHeight", d.window[0]),
                (ww, "windowWidth", d.window[1]),
                (ph, "verticalPadding", d.pads[0]),
                (pw, "horizontalPadding", d.pads[1]),
                (sh, "verticalStride", d.strides[0]),
                (sw, "horizontalStride", d.strides[1]),
            ] {
                write_out(ptr, name, v as i32)?;
            }
        }
        Ok(())
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnGetPoolingNdDescriptor(
    p: cudnnPoolingDescriptor_t,
    requested: i32,
    mode: *mut i32,
    nan: *mut i32,
    nb: *mut i32,
    window: *mut i32,
    pad: *mut i32,
    stride: *mut i32,
) -> Status {
    guard("cudnnGetPoolingNdDescriptor", || {
        let d = pooling(p, "poolingDesc")?;
        if requested < 0 {
            return Err(bad(format!("nbDimsRequested {requested} is negative")));
        }
        // SAFETY: out pointers are checked not null; the arrays hold nbDimsRequested ints.
        unsafe {
            write_out(mode, "mode", d.mode)?;
            write_out(nan, "maxpoolingNanOpt", d.nan)?;
            write_out(nb, "nbDims", d.window.len() as i32)?;
            let k = (requested as usize).min(d.window.len());
            if k > 0 {
                non_null(window, "windowDimA")?;
                non_null(pad, "paddingA")?;
                non_null(stride, "strideA")?;
                for i in 0..k {
                    *window.add(i) = d.window[i] as i32;
                    *pad.add(i) = d.pads[i] as i32;
                    *stride.add(i) = d.strides[i] as i32;
                }
            }
        }
        Ok(())
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnGetPooling2dForwardOutputDim(p: cudnnPoolingDescriptor_t, x: cudnnTensorDescriptor_t, n: *mut i32, c: *mut i32, h: *mut i32, w: *mut i32) -> Status {
    guard("cudnnGetPooling2dForwardOutputDim", || {
        let (d, xd) = (pooling(p, "poolingDesc")?, tensor(x, "inputTensorDesc")?);
        let out = d.output_dims(&xd.dims)?;
        if out.len() != 4 {
            return Err(bad(format!("the input has {} dims, not 4", xd.dims.len())));
        }
        // SAFETY: each out pointer is checked not null by write_out.
        unsafe {
            for (ptr, name, v) in [(n, "n", out[0]), (c, "c", out[1]), (h, "h", out[2]), (w, "w", out[3])] {
                write_out(ptr, name, v as i32)?;
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cudnnGetPoolingNdForwardOutputDim(p: cudnnPoolingDescriptor_t, x: cudnnTensorDescriptor_t, nb: i32, out: *mut i32) -> Status {
    guard("cudnnGetPoolingNdForwardOutputDim", || {
        let (d, xd) = (pooling(p, "poolingDesc")?, tensor(x, "inputTensorDesc")?);
        let dims = d.output_dims(&xd.dims)?;
        if nb as usize != dims.len() {
            return Err(bad(format!("nbDims {nb} but the output has {} dims", dims.len())));
        }
        non_null(out, "outputTensorDimA")?;
        for (i, &v) in dims.iter().enumerate() {
            // SAFETY: not null (checked); the caller gives nbDims writable ints.
            unsafe { *out.add(i) = v as i32 };
        }
        Ok(())
    })
}

// ------------------------------------------------------------------------------------------
// Op-tensor and reduce-tensor descriptors
// ------------------------------------------------------------------------------------------

#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpTensorDescriptor {
    pub set: bool,
    pub op: i32,
    pub compute_raw: i32,
    pub nan: i32,
}

pub static OP_TENSORS: Registry<OpTensorDescriptor> = Registry::new("cudnnOpTensorDescriptor_t");

#[no_mangle]
pub extern "C" fn cudnnCreateOpTensorDescriptor(out: *mut cudnnOpTensorDescriptor_t) -> Status {
    guard("cudnnCreateOpTensorDescriptor", || {
        non_null(out, "opTensorDesc")?;
        let p = OP_TENSORS.create(OpTensorDescriptor::default());
        // SAFETY: checked not null; the caller gives a writable descriptor slot.
        unsafe { write_out(out, "opTensorDesc", p) }
    })
}

#[no_mangle]
pub extern "C" fn cudnnDestroyOpTensorDescriptor(p: cudnnOpTensorDescriptor_t) -> Status {
    guard("cudnnDestroyOpTensorDescriptor", || if p.is_null() { Ok(()) } else { OP_TENSORS.destroy(p) })
}

#[no_mangle]
pub extern "C" fn cudnnSetOpTensorDescriptor(p: cudnnOpTensorDescriptor_t, op: i32, compute: i32, nan: i32) -> Status {
    guard("cudnnSetOpTensorDescriptor", || {
        if !(CUDNN_OP_TENSOR_ADD..=CUDNN_OP_TENSOR_NOT).contains(&op) {
            return Err(bad(format!("opTensorOp {op} is not a cudnnOpTensorOp_t")));
        }
        if !data_type(compute)?.is_float() {
            return Err(bad(format!("opTensorCompType {compute} must be a float type")));
        }
        if nan != CUDNN_NOT_PROPAGATE_NAN && nan != CUDNN_PROPAGATE_NAN {
            return Err(bad(format!("opTensorNanOpt {nan} is not a cudnnNanPropagation_t")));
        }
        OP_TENSORS.with(p, |d| {
            *d = OpTensorDescriptor { set: true, op, compute_raw: compute, nan };
            Ok(())
        })
    })
}

#[no_mangle]
pub extern "C" fn cudnnGetOpTensorDescriptor(p: cudnnOpTensorDescriptor_t, op: *mut i32, compute: *mut i32, nan: *mut i32) -> Status {
    guard("cudnnGetOpTensorDescriptor", || {
        let d = OP_TENSORS.get(p)?;
        if !d.set {
            return Err(bad("`opTensorDesc` was created but never set (cudnnSetOpTensorDescriptor)"));
        }
        // SAFETY: each out pointer is checked not null by write_out.
        unsafe {
            write_out(op, "opTensorOp", d.op)?;
            write_out(compute, "opTensorCompType", d.compute_raw)?;
            write_out(nan, "opTensorNanOpt", d.nan)
        }
    })
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReduceDescriptor {
    pub set: bool,
    pub op: i32,
    pub compute_raw: i32,
    pub nan: i32,
    pub indices: i32,
    pub indices_type: i32,
}

pub static REDUCES: Registry<ReduceDescriptor> = Registry::new("cudnnReduceTensorDescriptor_t");

#[no_mangle]
pub extern "C" fn cudnnCreateReduceTensorDescriptor(out: *mut cudnnReduceTensorDescriptor_t) -> Status {
    guard("cudnnCreateReduceTensorDescriptor", || {
        non_null(out, "reduceTensorDesc")?;
        let p = REDUCES.create(ReduceDescriptor::default());
        // SAFETY: checked not null; the caller gives a writable descriptor slot.
        unsafe { write_out(out, "reduceTensorDesc", p) }
    })
}

#[no_mangle]
pub extern "C" fn cudnnDestroyReduceTensorDescriptor(p: cudnnReduceTensorDescriptor_t) -> Status {
    guard("cudnnDestroyReduceTensorDescriptor", || if p.is_null() { Ok(()) } else { REDUCES.destroy(p) })
}

#[no_mangle]
pub extern "C" fn cudnnSetReduceTensorDescriptor(p: cudnnReduceTensorDescriptor_t, op: i32, compute: i32, nan: i32, indices: i32, indices_type: i32) -> Status {
    guard("cudnnSetReduceTensorDescriptor", || {
        if !(CUDNN_REDUCE_TENSOR_ADD..=CUDNN_REDUCE_TENSOR_MUL_NO_ZEROS).contains(&op) {
            return Err(bad(format!("reduceTensorOp {op} is not a cudnnReduceTensorOp_t")));
        }
        if !data_type(compute)?.is_float() {
            return Err(bad(format!("reduceTensorCompType {compute} must be a float type")));
        }
        if nan != CUDNN_NOT_PROPAGATE_NAN && nan != CUDNN_PROPAGATE_NAN {
            return Err(bad(format!("reduceTensorNanOpt {nan} is not a cudnnNanPropagation_t")));
        }
        if indices != CUDNN_REDUCE_TENSOR_NO_INDICES && indices != CUDNN_REDUCE_TENSOR_FLATTENED_INDICES {
            return Err(bad(format!("reduceTensorIndices {indices} is not a cudnnReduceTensorIndices_t")));
        }
        if !(CUDNN_32BIT_INDICES..=CUDNN_8BIT_INDICES).contains(&indices_type) {
            return Err(bad(format!("reduceTensorIndicesType {indices_type} is not a cudnnIndicesType_t")));
        }
        REDUCES.with(p, |d| {
            *d = ReduceDescriptor { set: true, op, compute_raw: compute, nan, indices, indices_type };
            Ok(())
        })
    })
}

#[no_mangle]
pub extern "C" fn cudnnGetReduceTensorDescriptor(
    p: cudnnReduceTensorDescriptor_t,
    op: *mut i32,
    compute: *mut i32,
    nan: *mut i32,
    indices: *mut i32,
    indices_type: *mut i32,
) -> Status {
    guard("cudnnGetReduceTensorDescriptor", || {
        let d = REDUCES.get(p)?;
        if !d.set {
            return Err(bad("`reduceTensorDesc` was created but never set (cudnnSetReduceTensorDescriptor)"));
        }
        // SAFETY: each out pointer is checked not null by write_out.
        unsafe {
            write_out(op, "reduceTensorOp", d.op)?;
            write_out(compute, "reduceTensorCompType", d.compute_raw)?;
            write_out(nan, "reduceTensorNanOpt", d.nan)?;
            write_out(indices, "reduceTensorIndices", d.indices)?;
            write_out(indices_type, "reduceTensorIndicesType", d.indices_type)
        }
    })
}
