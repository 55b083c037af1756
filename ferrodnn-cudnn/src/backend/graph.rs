//! Tensors, operations and operation graphs of the backend API, and how an operation graph
//! becomes one ferrodnn [`Graph`]: each backend tensor (by uid) a graph tensor with its dims,
//! strides, type, virtual and by-value flags; each operation one node (or a few: a scaling by
//! alpha is a multiplication after the op), with cuDNN's operands on ferrodnn's ports. The graph
//! is validated as any other, so shape and type errors name the op and the tensor.

use super::attrs::*;
use super::{Built, Snapshot};
use crate::api::*;
use crate::desc::data_type;
use crate::handle::{handle, HandleState};
use crate::types::*;
use ferrodnn::engine::{BehaviorNotes, PlanDesc};
use ferrodnn::graph::ops::conv::{ConvAttrs, ConvMode};
use ferrodnn::graph::ops::matmul::MatmulAttrs;
use ferrodnn::graph::ops::norm::{BatchnormAttrs, GroupnormAttrs, NormAttrs, NormPhase};
use ferrodnn::graph::ops::pointwise::{PointwiseAttrs, PointwiseMode};
use ferrodnn::graph::ops::reduction::{ReductionAttrs, ReductionMode};
use ferrodnn::graph::ops::resample::{ResampleAttrs, ResampleMode};
use ferrodnn::graph::ops::rng::{Distribution, RngAttrs};
use ferrodnn::graph::ops::sdpa::SdpaAttrs;
use ferrodnn::graph::ops::transform::{concat_port, ConcatenateAttrs, ReshapeAttrs, SliceAttrs, TransposeAttrs};
use ferrodnn::graph::ops::Op;
use ferrodnn::graph::{Node, Port};
use ferrodnn::{DataType, Graph, TensorDesc, TensorId};
use std::collections::HashMap;
use std::sync::Arc;

/// A finalized backend tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub uid: i64,
    pub dt: DataType,
    pub dims: Vec<i64>,
    pub strides: Vec<i64>,
    pub is_virtual: bool,
    pub by_value: bool,
    /// A by-value tensor's compile-time constant (CUDNN_ATTR_TENSOR_CONSTANT_VALUE).
    pub value: Option<f64>,
    /// The tensor of ragged offsets (THD attention tensors).
    pub ragged: Option<Box<TensorInfo>>,
}

/// Checks a TENSOR descriptor's attributes.
pub fn finalize_tensor(s: &Snapshot) -> R<TensorInfo> {
    let need = |what: &str| bad(format!("{what} of the TENSOR descriptor is required but was not set"));
    let uid = s.i64_(TENSOR_UNIQUE_ID).ok_or_else(|| need("CUDNN_ATTR_TENSOR_UNIQUE_ID"))?;
    let dt_raw = s.int(TENSOR_DATA_TYPE).ok_or_else(|| need("CUDNN_ATTR_TENSOR_DATA_TYPE"))?;
    let dt = data_type(dt_raw)?;
    let dims = s.i64s(TENSOR_DIMENSIONS).ok_or_else(|| need("CUDNN_ATTR_TENSOR_DIMENSIONS"))?;
    let strides = s.i64s(TENSOR_STRIDES).ok_or_else(|| need("CUDNN_ATTR_TENSOR_STRIDES"))?;
    let name = format!("tensor uid {uid}");
    if dims.len() != strides.len() {
        return Err(bad(format!("{name}: {} dimensions {dims:?} but {} strides {strides:?}; give one stride per dimension", dims.len(), strides.len())));
    }
    if let Some(d) = dims.iter().find(|&&d| d <= 0) {
        return Err(bad(format!("{name}: dimensions {dims:?}: every dimension must be positive, got {d}")));
    }
    if let Some(st) = strides.iter().find(|&&st| st < 0) {
        return Err(bad(format!("{name}: strides {strides:?}: strides must be non-negative, got {st}")));
    }
    if let Some(a) = s.i64_(TENSOR_BYTE_ALIGNMENT) {
        if a <= 0 {
            return Err(bad(format!("{name}: CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT must be positive, got {a}")));
        }
    }
    if let Some(n) = s.i64_(TENSOR_VECTOR_COUNT) {
        if n != 1 {
            return Err(unsupported(format!("{name}: vectorized tensors (CUDNN_ATTR_TENSOR_VECTOR_COUNT {n}) are not supported; use 1")));
        }
    }
    let is_virtual = s.bool_(TENSOR_IS_VIRTUAL).unwrap_or(false);
    // A reordering is a memory layout: meaningless for a virtual tensor (ferrodnn lays those out
    // itself), not supported for a buffer.
    if let Some(m) = s.int(TENSOR_REORDERING_MODE) {
        if m != TENSOR_REORDERING_NONE && !is_virtual {
            return Err(unsupported(format!("{name}: tensor reordering mode {m} is not supported; use CUDNN_TENSOR_REORDERING_NONE")));
        }
    }
    let by_value = s.bool_(TENSOR_IS_BY_VALUE).unwrap_or(false);
    if is_virtual && by_value {
        return Err(bad(format!("{name} is both virtual and by value; a by-value scalar is an input")));
    }
    let count: i128 = dims.iter().map(|&d| d as i128).product();
    if by_value && count != 1 {
        return Err(bad(format!("{name} is by value with dimensions {dims:?}; a by-value tensor holds one element")));
    }
    if count > ferrodnn::graph::MAX_ELEMENTS as i128 {
        return Err(ApiError::new(CUDNN_STATUS_NOT_SUPPORTED_SHAPE, format!("{name}: dimensions {dims:?} hold more than 2^48 elements")));
    }
    let value = match s.value(TENSOR_CONSTANT_VALUE).and_then(|v| v.ptrs().first().copied()) {
        Some(p) => {
            if !by_value {
                return Err(bad(format!("{name} has a constant value but is not by value (CUDNN_ATTR_TENSOR_IS_BY_VALUE)")));
            }
            non_null(p as *const u8, "CUDNN_ATTR_TENSOR_CONSTANT_VALUE")?;
            // SAFETY: the attribute points at one element of the tensor's type (cuDNN's
            // contract), read once here as cuDNN copies it at finalization.
            let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, dt.size()) };
            Some(dt.read(bytes, 0))
        }
        None => None,
    };
    if let Some(m) = s.i64_(TENSOR_RAGGED_OFFSET_MULTIPLIER) {
        if m != 1 {
            return Err(unsupported(format!("{name}: a ragged offset multiplier of {m} is not supported; ferrodnn's ragged offsets count elements (multiplier 1)")));
        }
    }
    let ragged = s.desc(TENSOR_RAGGED_OFFSET_DESC).and_then(|r| r.tensor().cloned()).map(Box::new);
    Ok(TensorInfo { uid, dt, dims, strides, is_virtual, by_value, value, ragged })
}

/// Checks a descriptor that configures an operation (pointwise, convolution, matmul,
/// reduction, resample, rng): its required attributes are set.
pub fn check_op_config(s: &Snapshot) -> R<()> {
    let required: &[i32] = match s.kind {
        POINTWISE => &[POINTWISE_MODE],
        CONVOLUTION => &[CONVOLUTION_SPATIAL_DIMS, CONVOLUTION_DILATIONS, CONVOLUTION_FILTER_STRIDES, CONVOLUTION_PRE_PADDINGS, CONVOLUTION_POST_PADDINGS],
        MATMUL => &[MATMUL_COMP_TYPE],
        REDUCTION => &[REDUCTION_OPERATOR],
        RESAMPLE => &[RESAMPLE_MODE, RESAMPLE_WINDOW_DIMS],
        RNG => &[RNG_DISTRIBUTION],
        _ => &[],
    };
    for &a in required {
        if s.value(a).is_none() {
            return Err(bad(format!("{} is required but was not set", s.what(a))));
        }
    }
    if s.kind == CONVOLUTION {
        conv_attrs(s)?;
    }
    Ok(())
}

/// The tensors an operation must have, by attribute.
fn required_tensors(s: &Snapshot) -> &'static [i32] {
    match s.kind {
        OP_CONV_FORWARD => &[OP_CONV_FWD_X, OP_CONV_FWD_W, OP_CONV_FWD_Y, OP_CONV_FWD_CONV_DESC],
        OP_CONV_BWD_DATA => &[OP_CONV_BWD_DATA_DY, OP_CONV_BWD_DATA_W, OP_CONV_BWD_DATA_DX, OP_CONV_BWD_DATA_CONV_DESC],
        OP_CONV_BWD_FILTER => &[OP_CONV_BWD_FILTER_DY, OP_CONV_BWD_FILTER_X, OP_CONV_BWD_FILTER_DW, OP_CONV_BWD_FILTER_CONV_DESC],
        OP_POINTWISE => &[OP_PW_DESCRIPTOR],
        OP_MATMUL => &[OP_MATMUL_ADESC, OP_MATMUL_BDESC, OP_MATMUL_CDESC, OP_MATMUL_DESC],
        OP_REDUCTION => &[OP_REDUCTION_XDESC, OP_REDUCTION_YDESC, OP_REDUCTION_DESC],
        OP_NORM_FORWARD => &[OP_NORM_FWD_MODE, OP_NORM_FWD_PHASE, OP_NORM_FWD_XDESC, OP_NORM_FWD_YDESC],
        OP_NORM_BACKWARD => &[OP_NORM_BWD_MODE, OP_NORM_BWD_XDESC, OP_NORM_BWD_DYDESC, OP_NORM_BWD_DXDESC],
        OP_RESAMPLE_FWD => &[OP_RESAMPLE_FWD_XDESC, OP_RESAMPLE_FWD_YDESC, OP_RESAMPLE_FWD_DESC],
        OP_RESAMPLE_BWD => &[OP_RESAMPLE_BWD_DXDESC, OP_RESAMPLE_BWD_DYDESC, OP_RESAMPLE_BWD_DESC],
        OP_RNG => &[OP_RNG_YDESC, OP_RNG_DESC],
        OP_RESHAPE => &[OP_RESHAPE_XDESC, OP_RESHAPE_YDESC],
        OP_TRANSPOSE => &[OP_TRANSPOSE_XDESC, OP_TRANSPOSE_YDESC, OP_TRANSPOSE_PERMUTATION],
        OP_SLICE => &[OP_SLICE_XDESC, OP_SLICE_YDESC, OP_SLICE_START_INDICES, OP_SLICE_LIMIT_INDICES],
        OP_CONCAT => &[OP_CONCAT_AXIS, OP_CONCAT_INPUT_DESCS, OP_CONCAT_OUTPUT_DESC],
        OP_GEN_STATS => &[OP_GENSTATS_XDESC, OP_GENSTATS_SUMDESC, OP_GENSTATS_SQSUMDESC],
        OP_BN_FINALIZE => &[
            OP_BN_FINALIZE_Y_SUM_DESC,
            OP_BN_FINALIZE_Y_SQ_SUM_DESC,
            OP_BN_FINALIZE_SCALE_DESC,
            OP_BN_FINALIZE_BIAS_DESC,
            OP_BN_FINALIZE_SAVED_MEAN_DESC,
            OP_BN_FINALIZE_SAVED_INV_STD_DESC,
            OP_BN_FINALIZE_EQ_SCALE_DESC,
            OP_BN_FINALIZE_EQ_BIAS_DESC,
            OP_BN_FINALIZE_ACCUM_COUNT_DESC,
            OP_BN_FINALIZE_EPSILON_DESC,
        ],
        OP_BN_BWD_WEIGHTS => &[
            OP_BN_BWD_WEIGHTS_MEAN_DESC,
            OP_BN_BWD_WEIGHTS_INVSTD_DESC,
            OP_BN_BWD_WEIGHTS_BN_SCALE_DESC,
            OP_BN_BWD_WEIGHTS_X_DESC,
            OP_BN_BWD_WEIGHTS_DY_DESC,
            OP_BN_BWD_WEIGHTS_DBN_SCALE_DESC,
            OP_BN_BWD_WEIGHTS_DBN_BIAS_DESC,
            OP_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC,
            OP_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC,
            OP_BN_BWD_WEIGHTS_EQ_BIAS,
        ],
        OP_SDPA_FWD => &[OP_SDPA_FWD_QDESC, OP_SDPA_FWD_KDESC, OP_SDPA_FWD_VDESC, OP_SDPA_FWD_ODESC],
        OP_SDPA_BWD => &[
            OP_SDPA_BWD_QDESC,
            OP_SDPA_BWD_KDESC,
            OP_SDPA_BWD_VDESC,
            OP_SDPA_BWD_ODESC,
            OP_SDPA_BWD_STATSDESC,
            OP_SDPA_BWD_DODDESC,
            OP_SDPA_BWD_DQDESC,
            OP_SDPA_BWD_DKDESC,
            OP_SDPA_BWD_DVDESC,
        ],
        OP_SOFTMAX => &[OP_SOFTMAX_XDESC, OP_SOFTMAX_YDESC],
        _ => &[],
    }
}

/// Checks an operation descriptor's attribute set (its shapes are checked with the graph).
pub fn check_operation(s: &Snapshot) -> R<()> {
    for &a in required_tensors(s) {
        if s.value(a).is_none() {
            return Err(bad(format!("{} is required but was not set", s.what(a))));
        }
    }
    // The operation must lower: try it alone, its inputs standing for themselves. (A softmax
    // is lowered with the attention operation that names it.)
    if s.kind == OP_SOFTMAX {
        return Ok(());
    }
    let mut l = Lower::new();
    l.operation(s)
}

/// A finalized operation graph: the ferrodnn graph, validated, and the candidate plans of the
/// handle it was made for (its OPERATIONGRAPH_HANDLE, else a handle of the kind cudnnCreate
/// gives).
pub struct OpGraph {
    pub graph: Graph,
    pub handle: Arc<HandleState>,
    /// Candidate plans best first (each an engine: its index is the engine's global index), or
    /// why the handle's engines cannot run the graph.
    pub candidates: Result<Vec<(PlanDesc, BehaviorNotes)>, ApiError>,
}

impl std::fmt::Debug for OpGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OpGraph({:?}, {} candidates)", self.graph.name, self.candidates.as_ref().map_or(0, |c| c.len()))
    }
}

/// The policy plans of a handle are built under: the CUDA engine alone on a GPU handle (its
/// pointers are device memory), any CPU engine on a CPU handle.
pub fn policy(h: &HandleState) -> ferrodnn::PlanPolicy {
    ferrodnn::PlanPolicy { engine: if h.gpu { Some(ferrodnn::EngineKind::Cuda) } else { None }, ..Default::default() }
}

/// Builds and validates an operation graph's ferrodnn graph and lists its candidate plans; a
/// graph of diagonal band masks is an attention operation's score-modifier subgraph, kept as
/// its operations.
pub fn finalize_graph(s: &Snapshot) -> R<Built> {
    let ops = s.descs(OPERATIONGRAPH_OPS);
    if ops.is_empty() {
        return Err(bad("CUDNN_ATTR_OPERATIONGRAPH_OPS of the OPERATIONGRAPH descriptor is required (one operation or more) but was not set"));
    }
    // A score-modifier subgraph reads the attention scores, a virtual tensor none of its
    // operations produces.
    let produced: Vec<i64> = ops.iter().flat_map(|o| output_uids(o)).collect();
    let reads_scores =
        ops.iter().any(|o| o.kind == OP_DIAGONAL_BAND_MASK && o.desc(OP_DBM_XDESC).and_then(|d| d.tensor()).is_some_and(|t| t.is_virtual && !produced.contains(&t.uid)));
    if reads_scores {
        return Ok(Built::Subgraph(ops.to_vec()));
    }
    build_graph(s, ops).map(Built::Graph)
}

fn build_graph(s: &Snapshot, ops: &[Arc<Snapshot>]) -> R<Arc<OpGraph>> {
    // Overridden shapes (CUDNN_ATTR_OPERATIONGRAPH_IS_OVERRIDE_SHAPE_ENABLED) need nothing at
    // build time: the variant pack's overrides get a plan of their own when they are executed.
    if s.bool_(OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED) == Some(true) {
        return Err(unsupported(
            "dynamic shapes are not supported: build a graph per shape (ferrodnn's plan cache keeps each), or give the shapes of each execution as the variant pack's overrides",
        ));
    }
    let handle = match s.value(OPERATIONGRAPH_HANDLE).and_then(|v| v.ptrs().first().copied()) {
        Some(p) => handle(p as cudnnHandle_t).map_err(|e| bad(format!("CUDNN_ATTR_OPERATIONGRAPH_HANDLE: {}", e.msg)))?,
        None => crate::handle::default_handle()?,
    };
    // The softmax an attention operation names is part of it.
    let inner: Vec<&Arc<Snapshot>> = ops.iter().filter_map(|o| if o.kind == OP_SDPA_FWD { o.desc(OP_SDPA_FWD_SOFTMAX_DESC) } else { None }).collect();
    let mut l = Lower::new();
    for (i, op) in ops.iter().enumerate() {
        if op.kind == OP_SOFTMAX && inner.iter().any(|s| Arc::ptr_eq(s, op) || same_tensor(s, op, OP_SOFTMAX_YDESC)) {
            continue;
        }
        l.operation(op).map_err(|e| ApiError::new(e.status, format!("operation {i} ({}): {}", kind_name(op.kind), e.msg)))?;
    }
    let mut graph = l.g;
    // Named for its ops, so that log lines and errors say which graph ran.
    let kinds: Vec<&str> = graph.nodes.iter().map(|n| n.op.kind()).collect();
    graph.name = if kinds.len() > 8 { format!("backend graph {}+... ({} ops)", kinds[..8].join("+"), kinds.len()) } else { format!("backend graph {}", kinds.join("+")) };
    graph.validate().map_err(ApiError::from)?;
    let candidates = handle.fd.candidates(&graph, &policy(&handle)).map_err(ApiError::from);
    Ok(Arc::new(OpGraph { graph, handle, candidates }))
}

/// Builds a ferrodnn graph from backend operations.
struct Lower {
    g: Graph,
    by_uid: HashMap<i64, (TensorId, TensorInfo)>,
}

fn port(name: &str, t: TensorId) -> Port {
    Port { name: name.to_string(), tensor: t }
}

/// The compute type an op's math precision attribute asks for (unset: the graph's default).
fn compute_type(s: &Snapshot, attr: i32) -> R<Option<DataType>> {
    s.int(attr).map(data_type).transpose()
}

/// The compute type of an op that computes in floating point (pointwise, reduction, resample,
/// statistics): a float math precision is kept, any other is left to the graph's default (the
/// cudnn frontend leaves some unset, which reads as an integer type).
fn float_compute(s: &Snapshot, attr: i32) -> R<Option<DataType>> {
    Ok(s.int(attr).and_then(|raw| data_type(raw).ok()).filter(|dt| dt.is_float() && !dt.is_fp8()))
}

/// A convolution descriptor's attributes and compute type.
fn conv_attrs(c: &Snapshot) -> R<(ConvAttrs, Option<DataType>)> {
    let n = c.i64_(CONVOLUTION_SPATIAL_DIMS).ok_or_else(|| bad("CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS is required but was not set"))?;
    if !(1..=3).contains(&n) {
        return Err(unsupported(format!("convolutions over {n} spatial dimensions are not supported (1 to 3)")));
    }
    let list = |attr: i32| -> R<Vec<i64>> {
        let v = c.need_i64s(attr)?;
        if v.len() != n as usize {
            return Err(bad(format!("{} has {} elements {v:?} but CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS is {n}", c.what(attr), v.len())));
        }
        Ok(v)
    };
    let mode = match c.int(CONVOLUTION_CONV_MODE).unwrap_or(CUDNN_CROSS_CORRELATION) {
        CUDNN_CONVOLUTION => ConvMode::Convolution,
        CUDNN_CROSS_CORRELATION => ConvMode::CrossCorrelation,
        m => return Err(bad(format!("CUDNN_ATTR_CONVOLUTION_CONV_MODE {m} is not a cudnnConvolutionMode_t"))),
    };
    let attrs = ConvAttrs {
        pre_padding: list(CONVOLUTION_PRE_PADDINGS)?,
        post_padding: list(CONVOLUTION_POST_PADDINGS)?,
        stride: list(CONVOLUTION_FILTER_STRIDES)?,
        dilation: list(CONVOLUTION_DILATIONS)?,
        mode,
    };
    attrs.check(n as usize).map_err(bad)?;
    Ok((attrs, compute_type(c, CONVOLUTION_COMP_TYPE)?))
}

/// A pointwise descriptor's mode as ferrodnn's, and whether it is a backward (dy, x -> dx) mode.
fn pointwise_mode(p: &Snapshot) -> R<(PointwiseMode, bool)> {
    use PointwiseMode as M;
    let f = |attr: i32, default: f64| p.f64_(attr).unwrap_or(default);
    let relu_params = || {
        let lo = p.f64_(POINTWISE_RELU_LOWER_CLIP).filter(|&v| v != 0.0);
        let hi = p.f64_(POINTWISE_RELU_UPPER_CLIP).filter(|&v| v.is_finite() && v < f32::MAX as f64);
        let slope = p.f64_(POINTWISE_RELU_LOWER_CLIP_SLOPE).filter(|&v| v != 0.0);
        (lo, hi, slope)
    };
    let mode = p.need_int(POINTWISE_MODE)?;
    let m = match mode {
        pw::ADD => M::Add,
        pw::MUL => M::Mul,
        pw::MIN => M::Min,
        pw::MAX => M::Max,
        pw::SQRT => M::Sqrt,
        pw::ADD_SQUARE => M::AddSquare,
        pw::DIV => M::Div,
        pw::MOD => M::Mod,
        pw::POW => M::Pow,
        pw::SUB => M::Sub,
        pw::ABS => M::Abs,
        pw::CEIL => M::Ceil,
        pw::COS => M::Cos,
        pw::EXP => M::Exp,
        pw::FLOOR => M::Floor,
        pw::LOG => M::Log,
        pw::NEG => M::Neg,
        pw::RSQRT => M::Rsqrt,
        pw::SIN => M::Sin,
        pw::TAN => M::Tan,
        pw::ERF => M::Erf,
        pw::IDENTITY => M::Identity,
        pw::RECIPROCAL => M::Reciprocal,
        pw::RELU_FWD => {
            let (lower_clip, upper_clip, negative_slope) = relu_params();
            M::Relu { lower_clip, upper_clip, negative_slope }
        }
        pw::TANH_FWD => M::Tanh,
        pw::SIGMOID_FWD => M::Sigmoid,
        pw::ELU_FWD => M::Elu { alpha: f(POINTWISE_ELU_ALPHA, 1.0) },
        pw::GELU_FWD => M::Gelu,
        pw::SOFTPLUS_FWD => M::Softplus { beta: f(POINTWISE_SOFTPLUS_BETA, 1.0) },
        pw::SWISH_FWD => M::Swish { beta: f(POINTWISE_SWISH_BETA, 1.0) },
        pw::GELU_APPROX_TANH_FWD => M::GeluApproxTanh,
        pw::RELU_BWD => {
            let (lower_clip, upper_clip, negative_slope) = relu_params();
            M::ReluBackward { lower_clip, upper_clip, negative_slope }
        }
        pw::TANH_BWD => M::TanhBackward,
        pw::SIGMOID_BWD => M::SigmoidBackward,
        pw::ELU_BWD => M::EluBackward { alpha: f(POINTWISE_ELU_ALPHA, 1.0) },
        pw::GELU_BWD => M::GeluBackward,
        pw::SOFTPLUS_BWD => M::SoftplusBackward { beta: f(POINTWISE_SOFTPLUS_BETA, 1.0) },
        pw::SWISH_BWD => M::SwishBackward { beta: f(POINTWISE_SWISH_BETA, 1.0) },
        pw::GELU_APPROX_TANH_BWD => M::GeluApproxTanhBackward,
        pw::CMP_EQ => M::CmpEq,
        pw::CMP_NEQ => M::CmpNeq,
        pw::CMP_GT => M::CmpGt,
        pw::CMP_GE => M::CmpGe,
        pw::CMP_LT => M::CmpLt,
        pw::CMP_LE => M::CmpLe,
        pw::LOGICAL_AND => M::LogicalAnd,
        pw::LOGICAL_OR => M::LogicalOr,
        pw::LOGICAL_NOT => M::LogicalNot,
        pw::GEN_INDEX => {
            let axis = p.i64_(POINTWISE_AXIS).unwrap_or(-1);
            if axis < 0 {
                return Err(bad(format!("CUDNN_POINTWISE_GEN_INDEX needs CUDNN_ATTR_POINTWISE_AXIS (the axis to index), got {axis}")));
            }
            M::GenIndex { axis: axis as usize }
        }
        pw::BINARY_SELECT => M::BinarySelect,
        pw::ATAN2 => return Err(unsupported("CUDNN_POINTWISE_ATAN2 is not supported by ferrodnn")),
        m => return Err(bad(format!("CUDNN_ATTR_POINTWISE_MODE {m} is not a cudnnPointwiseMode_t"))),
    };
    if let Some(msg) = m.parameter_error() {
        return Err(bad(format!("pointwise {}: {msg}", m.name())));
    }
    Ok((m, (200..300).contains(&mode)))
}

fn reduction_mode(r: &Snapshot) -> R<ReductionMode> {
    Ok(match r.need_int(REDUCTION_OPERATOR)? {
        CUDNN_REDUCE_TENSOR_ADD => ReductionMode::Add,
        CUDNN_REDUCE_TENSOR_MUL => ReductionMode::Mul,
        CUDNN_REDUCE_TENSOR_MIN => ReductionMode::Min,
        CUDNN_REDUCE_TENSOR_MAX => ReductionMode::Max,
        CUDNN_REDUCE_TENSOR_AMAX => ReductionMode::Amax,
        CUDNN_REDUCE_TENSOR_AVG => ReductionMode::Avg,
        CUDNN_REDUCE_TENSOR_NORM1 => ReductionMode::Norm1,
        CUDNN_REDUCE_TENSOR_NORM2 => ReductionMode::Norm2,
        CUDNN_REDUCE_TENSOR_MUL_NO_ZEROS => ReductionMode::MulNoZeros,
        m => return Err(bad(format!("CUDNN_ATTR_REDUCTION_OPERATOR {m} is not a cudnnReduceTensorOp_t"))),
    })
}

/// A resample descriptor as pooling attributes.
fn resample_attrs(r: &Snapshot) -> R<ResampleAttrs> {
    let mode = match r.need_int(RESAMPLE_MODE)? {
        RESAMPLE_MAXPOOL => ResampleMode::Max,
        RESAMPLE_AVGPOOL_INCLUDE_PADDING => ResampleMode::AvgIncludePadding,
        RESAMPLE_AVGPOOL_EXCLUDE_PADDING => ResampleMode::AvgExcludePadding,
        RESAMPLE_NEAREST | RESAMPLE_BILINEAR => return Err(unsupported("nearest and bilinear resampling are not supported by ferrodnn (max and average pooling are)")),
        m => return Err(bad(format!("CUDNN_ATTR_RESAMPLE_MODE {m} is not a cudnnResampleMode_t"))),
    };
    let list = |attr: i32, default: i64, n: usize| -> R<Vec<i64>> {
        let Some(v) = r.value(attr) else { return Ok(vec![default; n]) };
        v.fractions()
            .into_iter()
            .map(|(num, den)| {
                if den == 0 || num % den != 0 {
                    Err(unsupported(format!("{}: fractional value {num}/{den} is not supported (whole numbers are)", r.what(attr))))
                } else {
                    Ok(num / den)
                }
            })
            .collect()
    };
    let window = list(RESAMPLE_WINDOW_DIMS, 1, 0)?;
    let n = window.len();
    if let Some(sd) = r.i64_(RESAMPLE_SPATIAL_DIMS) {
        if sd as usize != n {
            return Err(bad(format!("CUDNN_ATTR_RESAMPLE_SPATIAL_DIMS is {sd} but CUDNN_ATTR_RESAMPLE_WINDOW_DIMS has {n} elements")));
        }
    }
    let attrs =
        ResampleAttrs { mode, window, stride: list(RESAMPLE_STRIDES, 1, n)?, pre_padding: list(RESAMPLE_PRE_PADDINGS, 0, n)?, post_padding: list(RESAMPLE_POST_PADDINGS, 0, n)? };
    // Windows wholly in the padding (cuDNN gives them -inf or 0) are outside ferrodnn's pooling.
    for (d, (&w, (&pre, &post))) in attrs.window.iter().zip(attrs.pre_padding.iter().zip(&attrs.post_padding)).enumerate() {
        if pre >= w || post >= w {
            return Err(unsupported(format!(
                "pooling paddings {pre} and {post} along spatial dim {d} must be smaller than the window {w} in ferrodnn (no window lies wholly in the padding)"
            )));
        }
    }
    Ok(attrs)
}

impl Lower {
    fn new() -> Lower {
        Lower { g: Graph::new("cudnn_backend_graph"), by_uid: HashMap::new() }
    }

    /// The graph tensor of backend tensor `info` (one per uid; the same uid must describe the
    /// same tensor everywhere).
    fn tensor_of(&mut self, info: &TensorInfo) -> R<TensorId> {
        if let Some((id, known)) = self.by_uid.get(&info.uid) {
            if known != info {
                return Err(bad(format!(
                    "uid {} names two different tensors: dims {:?} strides {:?} {} and dims {:?} strides {:?} {}",
                    info.uid, known.dims, known.strides, known.dt, info.dims, info.strides, info.dt
                )));
            }
            return Ok(*id);
        }
        // A by-value scalar broadcasts to any shape, whatever rank cuDNN describes it with.
        // A virtual tensor has no memory: its strides only say an order, which is kept, packed
        // (the frontend gives some virtual tensors strides whose elements would overlap).
        let (dims, strides) = if info.by_value {
            (vec![1], vec![1])
        } else if info.is_virtual {
            (info.dims.clone(), ferrodnn::graph::strides_for_order(&info.dims, &ferrodnn::graph::stride_order(&info.strides)))
        } else {
            (info.dims.clone(), info.strides.clone())
        };
        let mut t = TensorDesc::new(format!("uid {}", info.uid), &dims, info.dt).with_strides(&strides).with_uid(info.uid);
        t.is_virtual = info.is_virtual;
        t.is_pass_by_value = info.by_value;
        t.value = info.value;
        if let Some(r) = &info.ragged {
            t.ragged_offset = Some(self.tensor_of(r)?);
        }
        let id = self.g.tensor(t);
        self.by_uid.insert(info.uid, (id, info.clone()));
        Ok(id)
    }

    fn opt(&mut self, s: &Snapshot, attr: i32) -> R<Option<TensorId>> {
        match s.desc(attr) {
            None => Ok(None),
            Some(d) => {
                let info = d.tensor().ok_or_else(|| bad(format!("{} is not a tensor", s.what(attr))))?.clone();
                self.tensor_of(&info).map(Some)
            }
        }
    }

    fn req(&mut self, s: &Snapshot, attr: i32) -> R<TensorId> {
        self.opt(s, attr)?.ok_or_else(|| bad(format!("{} is required but was not set", s.what(attr))))
    }

    /// A constant by-value scalar.
    fn constant(&mut self, v: f64, dt: DataType) -> TensorId {
        let n = self.g.tensors.len();
        self.g.tensor(TensorDesc::scalar(format!("constant {n}"), v, dt))
    }

    /// A virtual tensor shaped like `like` (packed in its stride order), of type `dt`.
    fn scratch(&mut self, like: TensorId, dt: DataType) -> TensorId {
        let l = self.g.desc(like).clone();
        let order = ferrodnn::graph::stride_order(&l.strides);
        let n = self.g.tensors.len();
        let mut t = TensorDesc::new(format!("intermediate {n}"), &l.dims, dt).with_layout(&order);
        t.is_virtual = true;
        self.g.tensor(t)
    }

    fn node(&mut self, op: Op, ins: Vec<(&str, TensorId)>, outs: Vec<(&str, TensorId)>, compute: Option<DataType>) {
        let name = format!("{}_{}", op.kind(), self.g.nodes.len());
        self.g.nodes.push(Node {
            name,
            op,
            inputs: ins.into_iter().map(|(n, t)| port(n, t)).collect(),
            outputs: outs.into_iter().map(|(n, t)| port(n, t)).collect(),
            compute_data_type: compute,
        });
    }

    fn pointwise(&mut self, mode: PointwiseMode, ins: Vec<(&str, TensorId)>, y: TensorId, compute: Option<DataType>) {
        self.node(Op::Pointwise(PointwiseAttrs { mode }), ins, vec![("y", y)], compute);
    }

    /// A virtual row-major tensor of `dims`, of type `dt`.
    fn scratch_dims(&mut self, dims: &[i64], dt: DataType) -> TensorId {
        let n = self.g.tensors.len();
        let mut t = TensorDesc::new(format!("intermediate {n}"), dims, dt);
        t.is_virtual = true;
        self.g.tensor(t)
    }

    /// cuDNN's reshape in its default VIEW_ONLY mode: `y` is x's memory seen through y's dims
    /// and strides, so a reshape whose output strides are swapped is a transpose (the frontend's
    /// attention backward builds P^T, dS^T and K from K^T this way). ferrodnn's reshape is
    /// logical (row-major), so the view becomes: x transposed into its memory order, a logical
    /// reshape to y's dims in y's memory order, and the transpose back to y's dims. Both
    /// tensors must be dense in their stride order (virtual ones always are) unless both are
    /// row-major, where the view is the logical reshape.
    fn view_reshape(&mut self, x: TensorId, y: TensorId) -> R<()> {
        let (xd, yd) = (self.g.desc(x).clone(), self.g.desc(y).clone());
        let (ox, oy) = (ferrodnn::graph::stride_order(&xd.strides), ferrodnn::graph::stride_order(&yd.strides));
        // In memory order when the dims above 1 come in their logical order (dims of 1 address
        // nothing).
        let identity = |o: &[usize], dims: &[i64]| o.iter().filter(|&&a| dims[a] > 1).is_sorted();
        if identity(&ox, &xd.dims) && identity(&oy, &yd.dims) {
            self.node(Op::Reshape(ReshapeAttrs {}), vec![("x", x)], vec![("y", y)], None);
            return Ok(());
        }
        for (t, o, name) in [(&xd, &ox, "x"), (&yd, &oy, "y")] {
            let dense = ferrodnn::graph::strides_for_order(&t.dims, o);
            if t.dims.iter().zip(&t.strides).zip(&dense).any(|((&d, &a), &b)| d > 1 && a != b) {
                return Err(unsupported(format!(
                    "a VIEW_ONLY reshape whose {name} (dims {:?}, strides {:?}) is not dense in its stride order, with a transposing view",
                    t.dims, t.strides
                )));
            }
        }
        let dt = xd.data_type.unwrap_or(DataType::F32);
        let mut cur = x;
        if !identity(&ox, &xd.dims) {
            let dims: Vec<i64> = ox.iter().map(|&a| xd.dims[a]).collect();
            let t = self.scratch_dims(&dims, dt);
            self.node(Op::Transpose(TransposeAttrs { permutation: ox.clone() }), vec![("x", cur)], vec![("y", t)], None);
            cur = t;
        }
        if identity(&oy, &yd.dims) {
            self.node(Op::Reshape(ReshapeAttrs {}), vec![("x", cur)], vec![("y", y)], None);
            return Ok(());
        }
        let dims: Vec<i64> = oy.iter().map(|&a| yd.dims[a]).collect();
        let r = self.scratch_dims(&dims, dt);
        self.node(Op::Reshape(ReshapeAttrs {}), vec![("x", cur)], vec![("y", r)], None);
        // Output axis a is axis i of r where oy[i] == a.
        let mut back = vec![0usize; oy.len()];
        for (i, &a) in oy.iter().enumerate() {
            back[a] = i;
        }
        self.node(Op::Transpose(TransposeAttrs { permutation: back }), vec![("x", r)], vec![("y", y)], None);
        Ok(())
    }

    /// `x * alpha` as a new virtual tensor (or `x` when alpha is 1).
    fn scaled(&mut self, x: TensorId, alpha: Option<f64>) -> TensorId {
        match alpha {
            Some(a) if a != 1.0 => {
                let c = self.constant(a, DataType::F32);
                let y = self.scratch(x, DataType::F32);
                self.pointwise(PointwiseMode::Mul, vec![("a", x), ("b", c)], y, None);
                y
            }
            _ => x,
        }
    }

    /// `x` with the elements whose index along `axis` is at least `limit` (a tensor that
    /// broadcasts to x, such as per-batch lengths `[b, 1, 1, 1]`) set to 0.
    fn mask_past(&mut self, x: TensorId, axis: usize, limit: TensorId) -> TensorId {
        let dt = self.g.desc(x).data_type.unwrap_or(DataType::F32);
        let idx = self.scratch(x, DataType::I32);
        self.pointwise(PointwiseMode::GenIndex { axis }, vec![("a", x)], idx, None);
        let keep = self.scratch(x, DataType::Bool);
        self.pointwise(PointwiseMode::CmpLt, vec![("a", idx), ("b", limit)], keep, None);
        let zero = self.constant(0.0, DataType::F32);
        let y = self.scratch(x, dt);
        self.pointwise(PointwiseMode::BinarySelect, vec![("a", x), ("b", zero), ("c", keep)], y, None);
        y
    }

    /// Where an op with cuDNN's `y = alpha * op(...) + beta * y` writes: `y` itself when alpha
    /// is 1, else a virtual tensor that [`Lower::finish_alpha`] scales into `y`. A beta other
    /// than 0 (blending with `y`'s old value) is not supported.
    fn alpha_target(&mut self, s: &Snapshot, y: TensorId, alpha_attr: i32, beta_attr: i32) -> R<(TensorId, f64)> {
        let alpha = s.f64_(alpha_attr).unwrap_or(1.0);
        let beta = s.f64_(beta_attr).unwrap_or(0.0);
        if beta != 0.0 {
            return Err(unsupported(format!(
                "{} is {beta}: blending with the output's old value is not supported in the backend API (add it with a pointwise operation)",
                s.what(beta_attr)
            )));
        }
        if alpha == 1.0 {
            Ok((y, 1.0))
        } else {
            Ok((self.scratch(y, DataType::F32), alpha))
        }
    }

    fn finish_alpha(&mut self, target: TensorId, alpha: f64, y: TensorId) {
        if target != y {
            let c = self.constant(alpha, DataType::F32);
            self.pointwise(PointwiseMode::Mul, vec![("a", target), ("b", c)], y, None);
        }
    }

    /// Adds one backend operation's nodes.
    fn operation(&mut self, s: &Snapshot) -> R<()> {
        match s.kind {
            OP_CONV_FORWARD | OP_CONV_BWD_DATA | OP_CONV_BWD_FILTER => self.convolution(s),
            OP_POINTWISE => self.pointwise_op(s),
            OP_MATMUL => {
                let (a, b, c) = (self.req(s, OP_MATMUL_ADESC)?, self.req(s, OP_MATMUL_BDESC)?, self.req(s, OP_MATMUL_CDESC)?);
                // Ragged GEMM sizes (the frontend's attention backward with padding): the rows of
                // a beyond M, the columns of b beyond N and the products along k beyond K are
                // zeroed first, so that what lies past the lengths (padding, maybe NaN) never
                // reaches the sums; c's rows and columns past the lengths come out 0.
                let (ra, rb) = (self.g.desc(a).dims.len(), self.g.desc(b).dims.len());
                let mut a = a;
                let mut b = b;
                if let Some(m) = self.opt(s, OP_MATMUL_GEMM_M_OVERRIDE_DESC)? {
                    a = self.mask_past(a, ra - 2, m);
                }
                if let Some(k) = self.opt(s, OP_MATMUL_GEMM_K_OVERRIDE_DESC)? {
                    a = self.mask_past(a, ra - 1, k);
                    b = self.mask_past(b, rb - 2, k);
                }
                if let Some(n) = self.opt(s, OP_MATMUL_GEMM_N_OVERRIDE_DESC)? {
                    b = self.mask_past(b, rb - 1, n);
                }
                if s.i64_(OP_MATMUL_IRREGULARLY_STRIDED_BATCH_COUNT).is_some_and(|n| n != 0) {
                    return Err(unsupported("irregularly strided batches are not supported"));
                }
                let compute = compute_type(s.need_desc(OP_MATMUL_DESC)?, MATMUL_COMP_TYPE)?;
                self.node(Op::Matmul(MatmulAttrs {}), vec![("a", a), ("b", b)], vec![("c", c)], compute);
                Ok(())
            }
            OP_REDUCTION => {
                let (x, y) = (self.req(s, OP_REDUCTION_XDESC)?, self.req(s, OP_REDUCTION_YDESC)?);
                let r = s.need_desc(OP_REDUCTION_DESC)?;
                let mode = reduction_mode(r)?;
                let (xd, yd) = (self.g.desc(x).dims.clone(), self.g.desc(y).dims.clone());
                if xd.len() != yd.len() {
                    return Err(bad(format!("the reduction's x has dims {xd:?} and y {yd:?}: they must have the same rank (reduced dims 1 in y)")));
                }
                let axes: Vec<usize> = (0..xd.len()).filter(|&i| yd[i] == 1 && xd[i] != 1).collect();
                self.node(Op::Reduction(ReductionAttrs { mode, axes }), vec![("x", x)], vec![("y", y)], float_compute(r, REDUCTION_COMP_TYPE)?);
                Ok(())
            }
            OP_NORM_FORWARD => self.norm_forward(s),
            OP_NORM_BACKWARD => self.norm_backward(s),
            OP_RESAMPLE_FWD | OP_RESAMPLE_BWD => self.resample(s),
            OP_RNG => self.rng(s),
            OP_RESHAPE => {
                let (x, y) = (self.req(s, OP_RESHAPE_XDESC)?, self.req(s, OP_RESHAPE_YDESC)?);
                let mode = s.int(OP_RESHAPE_MODE).unwrap_or(RESHAPE_VIEW_ONLY);
                if mode == RESHAPE_LOGICAL {
                    self.node(Op::Reshape(ReshapeAttrs {}), vec![("x", x)], vec![("y", y)], None);
                    Ok(())
                } else if mode == RESHAPE_VIEW_ONLY {
                    self.view_reshape(x, y)
                } else {
                    Err(bad(format!("CUDNN_ATTR_OPERATION_RESHAPE_MODE {mode} is not a cudnnBackendReshapeMode_t")))
                }
            }
            OP_TRANSPOSE => {
                let (x, y) = (self.req(s, OP_TRANSPOSE_XDESC)?, self.req(s, OP_TRANSPOSE_YDESC)?);
                let perm = s.need_i64s(OP_TRANSPOSE_PERMUTATION)?;
                if perm.iter().any(|&p| p < 0) {
                    return Err(bad(format!("CUDNN_ATTR_OPERATION_TRANSPOSE_PERMUTATION {perm:?} has a negative axis")));
                }
                self.node(Op::Transpose(TransposeAttrs { permutation: perm.iter().map(|&p| p as usize).collect() }), vec![("x", x)], vec![("y", y)], None);
                Ok(())
            }
            OP_SLICE => {
                let (x, y) = (self.req(s, OP_SLICE_XDESC)?, self.req(s, OP_SLICE_YDESC)?);
                let attrs =
                    SliceAttrs { starts: s.need_i64s(OP_SLICE_START_INDICES)?, ends: s.need_i64s(OP_SLICE_LIMIT_INDICES)?, steps: s.i64s(OP_SLICE_STRIDES).unwrap_or_default() };
                self.node(Op::Slice(attrs), vec![("x", x)], vec![("y", y)], None);
                Ok(())
            }
            OP_CONCAT => {
                let axis = s.i64_(OP_CONCAT_AXIS).unwrap_or(-1);
                if axis < 0 {
                    return Err(bad(format!("CUDNN_ATTR_OPERATION_CONCAT_AXIS must be a non-negative axis, got {axis}")));
                }
                let mut ins = Vec::new();
                for d in s.descs(OP_CONCAT_INPUT_DESCS).to_vec() {
                    let info = d.tensor().ok_or_else(|| bad("an element of CUDNN_ATTR_OPERATION_CONCAT_INPUT_DESCS is not a tensor"))?.clone();
                    ins.push(self.tensor_of(&info)?);
                }
                let y = self.req(s, OP_CONCAT_OUTPUT_DESC)?;
                let names: Vec<String> = (0..ins.len()).map(concat_port).collect();
                let ports = names.iter().map(String::as_str).zip(ins).collect();
                self.node(Op::Concatenate(ConcatenateAttrs { axis: axis as usize }), ports, vec![("y", y)], None);
                Ok(())
            }
            OP_BN_FINALIZE => self.bn_finalize(s),
            OP_BN_BWD_WEIGHTS => self.bn_bwd_weights(s),
            OP_GEN_STATS => {
                let x = self.req(s, OP_GENSTATS_XDESC)?;
                let (sum, sq) = (self.req(s, OP_GENSTATS_SUMDESC)?, self.req(s, OP_GENSTATS_SQSUMDESC)?);
                self.node(Op::Genstats(NormAttrs::default()), vec![("x", x)], vec![("sum", sum), ("sq_sum", sq)], float_compute(s, OP_GENSTATS_MATH_PREC)?);
                Ok(())
            }
            OP_SDPA_FWD => self.sdpa(s),
            OP_SDPA_BWD => self.sdpa_backward(s),
            OP_DIAGONAL_BAND_MASK => self.band_mask(s),
            OP_SOFTMAX => {
                Err(unsupported("a standalone OPERATION_SOFTMAX is not supported: ferrodnn runs it as CUDNN_ATTR_OPERATION_SDPA_FWD_SOFTMAX_DESC of an attention operation"))
            }
            k => Err(unsupported(format!("{}: ferrodnn has no operation of this type", kind_name(k)))),
        }
    }

    fn convolution(&mut self, s: &Snapshot) -> R<()> {
        let (ins, out, conv, alpha, beta, make): (_, _, _, _, _, fn(ConvAttrs) -> Op) = match s.kind {
            OP_CONV_FORWARD => (vec![("x", OP_CONV_FWD_X), ("w", OP_CONV_FWD_W)], ("y", OP_CONV_FWD_Y), OP_CONV_FWD_CONV_DESC, OP_CONV_FWD_ALPHA, OP_CONV_FWD_BETA, Op::ConvFprop),
            OP_CONV_BWD_DATA => (
                vec![("dy", OP_CONV_BWD_DATA_DY), ("w", OP_CONV_BWD_DATA_W)],
                ("dx", OP_CONV_BWD_DATA_DX),
                OP_CONV_BWD_DATA_CONV_DESC,
                OP_CONV_BWD_DATA_ALPHA,
                OP_CONV_BWD_DATA_BETA,
                Op::ConvDgrad,
            ),
            _ => (
                vec![("dy", OP_CONV_BWD_FILTER_DY), ("x", OP_CONV_BWD_FILTER_X)],
                ("dw", OP_CONV_BWD_FILTER_DW),
                OP_CONV_BWD_FILTER_CONV_DESC,
                OP_CONV_BWD_FILTER_ALPHA,
                OP_CONV_BWD_FILTER_BETA,
                Op::ConvWgrad,
            ),
        };
        let (attrs, compute) = conv_attrs(s.need_desc(conv)?)?;
        let mut inputs = Vec::new();
        for (p, a) in ins {
            inputs.push((p, self.req(s, a)?));
        }
        let y = self.req(s, out.1)?;
        let (target, alpha) = self.alpha_target(s, y, alpha, beta)?;
        self.node(make(attrs), inputs, vec![(out.0, target)], compute);
        self.finish_alpha(target, alpha, y);
        Ok(())
    }

    fn pointwise_op(&mut self, s: &Snapshot) -> R<()> {
        let p = s.need_desc(OP_PW_DESCRIPTOR)?;
        let (mode, backward) = pointwise_mode(p)?;
        let compute = float_compute(p, POINTWISE_MATH_PREC)?;
        if backward {
            let dy = self.req(s, OP_PW_DYDESC)?;
            let x = self.req(s, OP_PW_XDESC)?;
            let dx = self.req(s, OP_PW_DXDESC)?;
            self.pointwise(mode, vec![("a", dy), ("b", x)], dx, compute);
            return Ok(());
        }
        let x = self.req(s, OP_PW_XDESC)?;
        let x = self.scaled(x, s.f64_(OP_PW_ALPHA1));
        let mut ins = vec![("a", x)];
        if mode.arity() >= 2 {
            let b = self.req(s, OP_PW_BDESC)?;
            ins.push(("b", self.scaled(b, s.f64_(OP_PW_ALPHA2))));
        }
        if mode.arity() == 3 {
            ins.push(("c", self.req(s, OP_PW_TDESC)?));
        }
        let y = self.req(s, OP_PW_YDESC)?;
        self.pointwise(mode, ins, y, compute);
        Ok(())
    }

    fn norm_forward(&mut self, s: &Snapshot) -> R<()> {
        let mode = s.need_int(OP_NORM_FWD_MODE)?;
        let phase = match s.need_int(OP_NORM_FWD_PHASE)? {
            NORM_FWD_TRAINING => NormPhase::Training,
            NORM_FWD_INFERENCE => NormPhase::Inference,
            p => return Err(bad(format!("CUDNN_ATTR_OPERATION_NORM_FWD_PHASE {p} is not a cudnnBackendNormFwdPhase_t"))),
        };
        let x = self.req(s, OP_NORM_FWD_XDESC)?;
        let y = self.req(s, OP_NORM_FWD_YDESC)?;
        let scale = self.opt(s, OP_NORM_FWD_SCALE_DESC)?;
        let bias = self.opt(s, OP_NORM_FWD_BIAS_DESC)?;
        let eps = self.opt(s, OP_NORM_FWD_EPSILON_DESC)?;
        let mean = self.opt(s, OP_NORM_FWD_MEAN_DESC)?;
        let inv_var = self.opt(s, OP_NORM_FWD_INV_VARIANCE_DESC)?;
        let need = |t: Option<TensorId>, what: &str| t.ok_or_else(|| bad(format!("this normalization needs {what}")));
        let training = phase == NormPhase::Training;
        let mut ins = vec![("x", x)];
        let mut outs = vec![("y", y)];
        if !s.descs(OP_NORM_FWD_PEER_STAT_DESCS).is_empty() && mode != BATCH_NORM {
            return Err(bad("peer statistics are for batch normalization"));
        }
        let op = match mode {
            BATCH_NORM if !training => {
                ins.extend([
                    ("scale", need(scale, "CUDNN_ATTR_OPERATION_NORM_FWD_SCALE_DESC")?),
                    ("bias", need(bias, "CUDNN_ATTR_OPERATION_NORM_FWD_BIAS_DESC")?),
                    ("mean", need(mean, "CUDNN_ATTR_OPERATION_NORM_FWD_MEAN_DESC (the statistics, an input in inference)")?),
                    ("inv_variance", need(inv_var, "CUDNN_ATTR_OPERATION_NORM_FWD_INV_VARIANCE_DESC (an input in inference)")?),
                ]);
                self.node(Op::BatchnormInference(NormAttrs::default()), ins, outs, None);
                return Ok(());
            }
            BATCH_NORM => {
                ins.push(("scale", need(scale, "CUDNN_ATTR_OPERATION_NORM_FWD_SCALE_DESC")?));
                ins.push(("bias", need(bias, "CUDNN_ATTR_OPERATION_NORM_FWD_BIAS_DESC")?));
                outs.push(("mean", need(mean, "CUDNN_ATTR_OPERATION_NORM_FWD_MEAN_DESC")?));
                outs.push(("inv_variance", need(inv_var, "CUDNN_ATTR_OPERATION_NORM_FWD_INV_VARIANCE_DESC")?));
                let running = [
                    self.opt(s, OP_NORM_FWD_INPUT_RUNNING_MEAN_DESC)?,
                    self.opt(s, OP_NORM_FWD_INPUT_RUNNING_VAR_DESC)?,
                    self.opt(s, OP_NORM_FWD_OUTPUT_RUNNING_MEAN_DESC)?,
                    self.opt(s, OP_NORM_FWD_OUTPUT_RUNNING_VAR_DESC)?,
                ];
                match running {
                    [Some(im), Some(iv), Some(om), Some(ov)] => {
                        ins.extend([("in_running_mean", im), ("in_running_var", iv)]);
                        outs.extend([("out_running_mean", om), ("out_running_var", ov)]);
                    }
                    [None, None, None, None] => {}
                    _ => return Err(bad("batch normalization's running statistics come as a set: input mean and variance and output mean and variance, all four or none")),
                }
                if let Some(m) = self.opt(s, OP_NORM_FWD_EXP_AVG_FACTOR_DESC)? {
                    ins.push(("momentum", m));
                }
                let mut peers = Vec::new();
                let channels = self.g.desc(x).dims.get(1).copied().unwrap_or(0);
                for d in s.descs(OP_NORM_FWD_PEER_STAT_DESCS).to_vec() {
                    let t = d.tensor().cloned().ok_or_else(|| bad("a peer statistics descriptor is not a tensor"))?;
                    // ferrodnn's peer statistics are [2, C, 1, ...] (sums and sums of squares);
                    // cuDNN's own exchange layout is another.
                    if t.dims.first() != Some(&2) || t.dims.get(1) != Some(&channels) {
                        return Err(unsupported(format!(
                            "peer statistics tensor uid {} has dims {:?}: ferrodnn takes [2, C, 1, ...] per peer (row 0 the sums, row 1 the sums of squares, C = {channels}), not cuDNN's exchange layout",
                            t.uid, t.dims
                        )));
                    }
                    peers.push(self.tensor_of(&t)?);
                }
                let names: Vec<String> = (0..peers.len()).map(|i| format!("{}{i}", ferrodnn::graph::ops::norm::PEER_STATS_PREFIX)).collect();
                for (n, &t) in names.iter().zip(&peers) {
                    ins.push((n.as_str(), t));
                }
                if let Some(e) = eps {
                    ins.push(("epsilon", e));
                }
                let ins: Vec<(&str, TensorId)> = ins.into_iter().collect();
                self.node(Op::Batchnorm(BatchnormAttrs::default()), ins, outs, None);
                return Ok(());
            }
            LAYER_NORM | INSTANCE_NORM | ADA_LAYER_NORM | GROUP_NORM => {
                ins.push(("scale", need(scale, "CUDNN_ATTR_OPERATION_NORM_FWD_SCALE_DESC")?));
                ins.push(("bias", need(bias, "CUDNN_ATTR_OPERATION_NORM_FWD_BIAS_DESC")?));
                if training {
                    outs.push(("mean", need(mean, "CUDNN_ATTR_OPERATION_NORM_FWD_MEAN_DESC (training)")?));
                    outs.push(("inv_variance", need(inv_var, "CUDNN_ATTR_OPERATION_NORM_FWD_INV_VARIANCE_DESC (training)")?));
                }
                let attrs = NormAttrs { phase, ..NormAttrs::default() };
                match mode {
                    LAYER_NORM => Op::Layernorm(attrs),
                    INSTANCE_NORM => Op::Instancenorm(attrs),
                    ADA_LAYER_NORM => Op::Adalayernorm(attrs),
                    _ => {
                        let stats = mean.or(inv_var).ok_or_else(|| {
                            unsupported("group normalization needs its statistics tensors (their dim 1 is the group count); inference without them is not supported")
                        })?;
                        let groups = self.g.desc(stats).dims.get(1).copied().unwrap_or(1);
                        Op::Groupnorm(GroupnormAttrs { phase, epsilon: attrs.epsilon, groups })
                    }
                }
            }
            RMS_NORM => {
                ins.push(("scale", need(scale, "CUDNN_ATTR_OPERATION_NORM_FWD_SCALE_DESC")?));
                if let Some(b) = bias {
                    ins.push(("bias", b));
                }
                if training {
                    outs.push(("inv_variance", need(inv_var, "CUDNN_ATTR_OPERATION_NORM_FWD_INV_VARIANCE_DESC (training)")?));
                }
                Op::Rmsnorm(NormAttrs { phase, ..NormAttrs::default() })
            }
            m => return Err(bad(format!("CUDNN_ATTR_OPERATION_NORM_FWD_MODE {m} is not a cudnnBackendNormMode_t"))),
        };
        if let Some(e) = eps {
            ins.push(("epsilon", e));
        }
        self.node(op, ins, outs, None);
        Ok(())
    }

    fn norm_backward(&mut self, s: &Snapshot) -> R<()> {
        if !s.descs(OP_NORM_BWD_PEER_STAT_DESCS).is_empty() {
            return Err(unsupported("peer statistics in the normalization backward pass are not supported"));
        }
        let mode = s.need_int(OP_NORM_BWD_MODE)?;
        let (x, dy, dx) = (self.req(s, OP_NORM_BWD_XDESC)?, self.req(s, OP_NORM_BWD_DYDESC)?, self.req(s, OP_NORM_BWD_DXDESC)?);
        let scale = self.req(s, OP_NORM_BWD_SCALE_DESC)?;
        let inv_var = self.req(s, OP_NORM_BWD_INV_VARIANCE_DESC)?;
        let dscale = self.req(s, OP_NORM_BWD_DSCALE_DESC)?;
        let dbias = self.opt(s, OP_NORM_BWD_DBIAS_DESC)?;
        let mut ins = vec![("dy", dy), ("x", x), ("scale", scale)];
        let mut outs = vec![("dx", dx), ("dscale", dscale)];
        if mode == RMS_NORM {
            ins.push(("inv_variance", inv_var));
            if let Some(b) = dbias {
                outs.push(("dbias", b));
            }
            self.node(Op::RmsnormBackward(NormAttrs::default()), ins, outs, None);
            return Ok(());
        }
        let mean = self.req(s, OP_NORM_BWD_MEAN_DESC)?;
        ins.extend([("mean", mean), ("inv_variance", inv_var)]);
        outs.push(("dbias", dbias.ok_or_else(|| bad("CUDNN_ATTR_OPERATION_NORM_BWD_DBIAS_DESC is required for this normalization"))?));
        let op = match mode {
            LAYER_NORM => Op::LayernormBackward(NormAttrs::default()),
            INSTANCE_NORM => Op::InstancenormBackward(NormAttrs::default()),
            BATCH_NORM => Op::BatchnormBackward(NormAttrs::default()),
            ADA_LAYER_NORM => Op::AdalayernormBackward(NormAttrs::default()),
            GROUP_NORM => {
                let groups = self.g.desc(mean).dims.get(1).copied().unwrap_or(1);
                Op::GroupnormBackward(GroupnormAttrs::new(groups))
            }
            m => return Err(bad(format!("CUDNN_ATTR_OPERATION_NORM_BWD_MODE {m} is not a cudnnBackendNormMode_t"))),
        };
        self.node(op, ins, outs, None);
        Ok(())
    }

    /// Checks that the per-channel tensors of a batchnorm operation (`(attribute, tensor)`) all
    /// have the dims `[1, C, 1, ...]` of `channels` channels.
    fn per_channel(&self, s: &Snapshot, channels: i64, rank: usize, tensors: &[(i32, TensorId)]) -> R<()> {
        for &(attr, t) in tensors {
            let dims = &self.g.desc(t).dims;
            let ok = dims.len() == rank && dims.iter().enumerate().all(|(i, &d)| d == if i == 1 { channels } else { 1 });
            if !ok {
                return Err(bad(format!("{} has dims {dims:?}; it must be per channel, [1, {channels}, 1, ...] of rank {rank}", s.what(attr))));
            }
        }
        Ok(())
    }

    /// OPERATION_BN_FINALIZE_STATISTICS: per-channel sums and sums of squares (from GEN_STATS,
    /// over ACCUM_COUNT elements per channel) to the saved mean and inverse standard deviation,
    /// batchnorm's equivalent scale and bias (`y = x * eq_scale + eq_bias`) and, given the
    /// previous running statistics, the updated ones (unbiased variance). The count, epsilon and
    /// averaging factor are by-value scalars whose values may come with each execution, so this
    /// is pointwise ops on the `[1, C, 1, ...]` tensors (ferrodnn's bn_finalize takes its count
    /// when the graph is built).
    fn bn_finalize(&mut self, s: &Snapshot) -> R<()> {
        let mode = s.int(OP_BN_FINALIZE_STATS_MODE).unwrap_or(BN_FINALIZE_STATISTICS_TRAINING);
        if mode != BN_FINALIZE_STATISTICS_TRAINING {
            return Err(unsupported(format!("{} {mode}: only CUDNN_BN_FINALIZE_STATISTICS_TRAINING is supported", s.what(OP_BN_FINALIZE_STATS_MODE))));
        }
        let compute = float_compute(s, OP_BN_FINALIZE_MATH_PREC)?;
        let sum = self.req(s, OP_BN_FINALIZE_Y_SUM_DESC)?;
        let sq_sum = self.req(s, OP_BN_FINALIZE_Y_SQ_SUM_DESC)?;
        let scale = self.req(s, OP_BN_FINALIZE_SCALE_DESC)?;
        let bias = self.req(s, OP_BN_FINALIZE_BIAS_DESC)?;
        let count = self.req(s, OP_BN_FINALIZE_ACCUM_COUNT_DESC)?;
        let eps = self.req(s, OP_BN_FINALIZE_EPSILON_DESC)?;
        let mean = self.req(s, OP_BN_FINALIZE_SAVED_MEAN_DESC)?;
        let inv_std = self.req(s, OP_BN_FINALIZE_SAVED_INV_STD_DESC)?;
        let eq_scale = self.req(s, OP_BN_FINALIZE_EQ_SCALE_DESC)?;
        let eq_bias = self.req(s, OP_BN_FINALIZE_EQ_BIAS_DESC)?;
        let dims = self.g.desc(sum).dims.clone();
        let channels = if dims.len() >= 2 { dims[1] } else { 0 };
        let mut per_channel = vec![
            (OP_BN_FINALIZE_Y_SUM_DESC, sum),
            (OP_BN_FINALIZE_Y_SQ_SUM_DESC, sq_sum),
            (OP_BN_FINALIZE_SCALE_DESC, scale),
            (OP_BN_FINALIZE_BIAS_DESC, bias),
            (OP_BN_FINALIZE_SAVED_MEAN_DESC, mean),
            (OP_BN_FINALIZE_SAVED_INV_STD_DESC, inv_std),
            (OP_BN_FINALIZE_EQ_SCALE_DESC, eq_scale),
            (OP_BN_FINALIZE_EQ_BIAS_DESC, eq_bias),
        ];
        let running =
            [OP_BN_FINALIZE_PREV_RUNNING_MEAN_DESC, OP_BN_FINALIZE_PREV_RUNNING_VAR_DESC, OP_BN_FINALIZE_UPDATED_RUNNING_MEAN_DESC, OP_BN_FINALIZE_UPDATED_RUNNING_VAR_DESC];
        let mut run = Vec::new();
        for a in running {
            if let Some(t) = self.opt(s, a)? {
                run.push(t);
                per_channel.push((a, t));
            }
        }
        if !matches!(run.len(), 0 | 4) {
            return Err(bad(
                "the running statistics of OPERATION_BN_FINALIZE_STATISTICS come as a set: previous mean and variance and updated mean and variance, all four or none",
            ));
        }
        self.per_channel(s, channels, dims.len().max(2), &per_channel)?;
        for (attr, t) in [(OP_BN_FINALIZE_ACCUM_COUNT_DESC, count), (OP_BN_FINALIZE_EPSILON_DESC, eps)] {
            if self.g.desc(t).element_count() != 1 {
                return Err(bad(format!("{} has dims {:?}; it must be one element", s.what(attr), self.g.desc(t).dims)));
            }
        }
        let f = DataType::F32;
        let tmp = |l: &mut Lower| l.scratch(sum, f);
        // mean = sum / n; var = sq_sum / n - mean^2; inv_std = 1 / sqrt(var + eps).
        self.pointwise(PointwiseMode::Div, vec![("a", sum), ("b", count)], mean, compute);
        let (ex2, m2, var, ve) = (tmp(self), tmp(self), tmp(self), tmp(self));
        self.pointwise(PointwiseMode::Div, vec![("a", sq_sum), ("b", count)], ex2, compute);
        self.pointwise(PointwiseMode::Mul, vec![("a", mean), ("b", mean)], m2, compute);
        self.pointwise(PointwiseMode::Sub, vec![("a", ex2), ("b", m2)], var, compute);
        self.pointwise(PointwiseMode::Add, vec![("a", var), ("b", eps)], ve, compute);
        self.pointwise(PointwiseMode::Rsqrt, vec![("a", ve)], inv_std, compute);
        // eq_scale = scale * inv_std; eq_bias = bias - mean * eq_scale.
        self.pointwise(PointwiseMode::Mul, vec![("a", scale), ("b", inv_std)], eq_scale, compute);
        let shift = tmp(self);
        self.pointwise(PointwiseMode::Mul, vec![("a", mean), ("b", eq_scale)], shift, compute);
        self.pointwise(PointwiseMode::Sub, vec![("a", bias), ("b", shift)], eq_bias, compute);
        if let [prev_mean, prev_var, next_mean, next_var] = run[..] {
            let factor = self
                .opt(s, OP_BN_FINALIZE_EXP_AVERAGE_FACTOR_DESC)?
                .ok_or_else(|| bad("CUDNN_ATTR_OPERATION_BN_FINALIZE_EXP_AVERAGE_FACTOR_DESC is required with the running statistics of OPERATION_BN_FINALIZE_STATISTICS"))?;
            // next = prev + factor * (batch - prev), the batch variance unbiased (n / (n - 1)).
            let (n_var, n_minus_1, unbiased) = (tmp(self), self.scratch_dims(&[1], f), tmp(self));
            let one = self.constant(1.0, f);
            self.pointwise(PointwiseMode::Mul, vec![("a", var), ("b", count)], n_var, compute);
            self.pointwise(PointwiseMode::Sub, vec![("a", count), ("b", one)], n_minus_1, compute);
            self.pointwise(PointwiseMode::Div, vec![("a", n_var), ("b", n_minus_1)], unbiased, compute);
            for (batch, prev, next) in [(mean, prev_mean, next_mean), (unbiased, prev_var, next_var)] {
                let (diff, step) = (tmp(self), tmp(self));
                self.pointwise(PointwiseMode::Sub, vec![("a", batch), ("b", prev)], diff, compute);
                self.pointwise(PointwiseMode::Mul, vec![("a", diff), ("b", factor)], step, compute);
                self.pointwise(PointwiseMode::Add, vec![("a", prev), ("b", step)], next, compute);
            }
        }
        Ok(())
    }

    /// OPERATION_BN_BWD_WEIGHTS: from x, dy and the forward's saved mean and inverse standard
    /// deviation, batchnorm's dscale and dbias and the coefficients of its input gradient
    /// `dx = eq_dy_scale * dy + eq_x_scale * x + eq_bias` (per channel, over the n elements of a
    /// channel): eq_dy_scale = scale * inv_std, eq_x_scale = -eq_dy_scale * inv_std * dscale / n,
    /// eq_bias = eq_dy_scale * (mean * inv_std * dscale - dbias) / n. The sums come from
    /// ferrodnn's batchnorm backward (its dx unused), the coefficients from pointwise ops.
    fn bn_bwd_weights(&mut self, s: &Snapshot) -> R<()> {
        let compute = float_compute(s, OP_BN_BWD_WEIGHTS_MATH_PREC)?;
        let x = self.req(s, OP_BN_BWD_WEIGHTS_X_DESC)?;
        let dy = self.req(s, OP_BN_BWD_WEIGHTS_DY_DESC)?;
        let mean = self.req(s, OP_BN_BWD_WEIGHTS_MEAN_DESC)?;
        let inv_std = self.req(s, OP_BN_BWD_WEIGHTS_INVSTD_DESC)?;
        let scale = self.req(s, OP_BN_BWD_WEIGHTS_BN_SCALE_DESC)?;
        let dscale = self.req(s, OP_BN_BWD_WEIGHTS_DBN_SCALE_DESC)?;
        let dbias = self.req(s, OP_BN_BWD_WEIGHTS_DBN_BIAS_DESC)?;
        let eq_dy = self.req(s, OP_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC)?;
        let eq_x = self.req(s, OP_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC)?;
        let eq_bias = self.req(s, OP_BN_BWD_WEIGHTS_EQ_BIAS)?;
        let xd = self.g.desc(x).clone();
        if xd.dims.len() < 3 {
            return Err(bad(format!("{} has dims {:?}; batch normalization needs [N, C, spatial...] (rank 3 or more)", s.what(OP_BN_BWD_WEIGHTS_X_DESC), xd.dims)));
        }
        let channels = xd.dims[1];
        self.per_channel(
            s,
            channels,
            xd.dims.len(),
            &[
                (OP_BN_BWD_WEIGHTS_MEAN_DESC, mean),
                (OP_BN_BWD_WEIGHTS_INVSTD_DESC, inv_std),
                (OP_BN_BWD_WEIGHTS_BN_SCALE_DESC, scale),
                (OP_BN_BWD_WEIGHTS_DBN_SCALE_DESC, dscale),
                (OP_BN_BWD_WEIGHTS_DBN_BIAS_DESC, dbias),
                (OP_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC, eq_dy),
                (OP_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC, eq_x),
                (OP_BN_BWD_WEIGHTS_EQ_BIAS, eq_bias),
            ],
        )?;
        let n = xd.dims.iter().product::<i64>() / channels;
        let dx = self.scratch(x, xd.data_type.unwrap_or(DataType::F32));
        self.node(
            Op::BatchnormBackward(NormAttrs::default()),
            vec![("dy", dy), ("x", x), ("scale", scale), ("mean", mean), ("inv_variance", inv_std)],
            vec![("dx", dx), ("dscale", dscale), ("dbias", dbias)],
            compute,
        );
        let f = DataType::F32;
        let tmp = |l: &mut Lower| l.scratch(mean, f);
        self.pointwise(PointwiseMode::Mul, vec![("a", scale), ("b", inv_std)], eq_dy, compute);
        // k = eq_dy_scale * inv_std * dscale / n
        let (a, b, k) = (tmp(self), tmp(self), tmp(self));
        let inv_n = self.constant(1.0 / n as f64, f);
        self.pointwise(PointwiseMode::Mul, vec![("a", dscale), ("b", inv_std)], a, compute);
        self.pointwise(PointwiseMode::Mul, vec![("a", a), ("b", eq_dy)], b, compute);
        self.pointwise(PointwiseMode::Mul, vec![("a", b), ("b", inv_n)], k, compute);
        self.pointwise(PointwiseMode::Neg, vec![("a", k)], eq_x, compute);
        // eq_bias = k * mean - eq_dy_scale * dbias / n
        let (km, g, gn) = (tmp(self), tmp(self), tmp(self));
        self.pointwise(PointwiseMode::Mul, vec![("a", k), ("b", mean)], km, compute);
        self.pointwise(PointwiseMode::Mul, vec![("a", eq_dy), ("b", dbias)], g, compute);
        self.pointwise(PointwiseMode::Mul, vec![("a", g), ("b", inv_n)], gn, compute);
        self.pointwise(PointwiseMode::Sub, vec![("a", km), ("b", gn)], eq_bias, compute);
        Ok(())
    }

    fn resample(&mut self, s: &Snapshot) -> R<()> {
        let fwd = s.kind == OP_RESAMPLE_FWD;
        let (desc, idx, alpha, beta) = if fwd {
            (OP_RESAMPLE_FWD_DESC, OP_RESAMPLE_FWD_IDXDESC, OP_RESAMPLE_FWD_ALPHA, OP_RESAMPLE_FWD_BETA)
        } else {
            (OP_RESAMPLE_BWD_DESC, OP_RESAMPLE_BWD_IDXDESC, OP_RESAMPLE_BWD_ALPHA, OP_RESAMPLE_BWD_BETA)
        };
        let r = s.need_desc(desc)?;
        let attrs = resample_attrs(r)?;
        if s.value(idx).is_some() {
            return Err(unsupported(format!("{} (the max pooling index tensor) is not supported: ferrodnn's pooling backward recomputes the maxima from x", s.what(idx))));
        }
        let compute = float_compute(r, RESAMPLE_COMP_TYPE)?;
        if fwd {
            let (x, y) = (self.req(s, OP_RESAMPLE_FWD_XDESC)?, self.req(s, OP_RESAMPLE_FWD_YDESC)?);
            let (target, alpha) = self.alpha_target(s, y, alpha, beta)?;
            self.node(Op::Resample(attrs), vec![("x", x)], vec![("y", target)], compute);
            self.finish_alpha(target, alpha, y);
        } else {
            let (dx, dy) = (self.req(s, OP_RESAMPLE_BWD_DXDESC)?, self.req(s, OP_RESAMPLE_BWD_DYDESC)?);
            let x =
                self.opt(s, OP_RESAMPLE_BWD_XDESC)?.ok_or_else(|| unsupported("the pooling backward pass needs CUDNN_ATTR_OPERATION_RESAMPLE_BWD_XDESC (the forward input)"))?;
            let (target, alpha) = self.alpha_target(s, dx, alpha, beta)?;
            self.node(Op::ResampleBackward(attrs), vec![("dy", dy), ("x", x)], vec![("dx", target)], compute);
            self.finish_alpha(target, alpha, dx);
        }
        Ok(())
    }

    fn rng(&mut self, s: &Snapshot) -> R<()> {
        let r = s.need_desc(OP_RNG_DESC)?;
        let distribution = match r.need_int(RNG_DISTRIBUTION)? {
            RNG_DISTRIBUTION_BERNOULLI => Distribution::Bernoulli { probability: r.f64_(RNG_BERNOULLI_DIST_PROBABILITY).unwrap_or(0.5) },
            RNG_DISTRIBUTION_UNIFORM => Distribution::Uniform { low: r.f64_(RNG_UNIFORM_DIST_MINIMUM).unwrap_or(0.0), high: r.f64_(RNG_UNIFORM_DIST_MAXIMUM).unwrap_or(1.0) },
            RNG_DISTRIBUTION_NORMAL => return Err(unsupported("the normal distribution is not supported by ferrodnn's rng (uniform and Bernoulli are)")),
            d => return Err(bad(format!("CUDNN_ATTR_RNG_DISTRIBUTION {d} is not a cudnnRngDistribution_t"))),
        };
        let y = self.req(s, OP_RNG_YDESC)?;
        let seed = match s.value(OP_RNG_SEED) {
            Some(v) if v.ty == super::attrs::T_INT64 => {
                let seed = v.i64s().first().copied().unwrap_or(0);
                self.constant(seed as f64, DataType::I64)
            }
            Some(_) => self.req(s, OP_RNG_SEED)?,
            None => return Err(bad("CUDNN_ATTR_OPERATION_RNG_SEED is required but was not set")),
        };
        let offset = match self.opt(s, OP_RNG_OFFSET_DESC)? {
            Some(o) => o,
            None => self.constant(0.0, DataType::I64),
        };
        self.node(Op::Rng(RngAttrs { distribution }), vec![("seed", seed), ("offset", offset)], vec![("y", y)], None);
        Ok(())
    }

    /// A diagonal band mask, as the frontend composes one from pointwise ops: with a left bound,
    /// keep where `col + left (- s_kv + s_q) > row` (the comparison's mode), else keep where
    /// `row (+ s_kv - s_q) (+ shift) >= col`; masked elements become `b`.
    fn band_mask(&mut self, s: &Snapshot) -> R<()> {
        if s.value(OP_DBM_CU_SEQ_LEN_QDESC).is_some() || s.value(OP_DBM_CU_SEQ_LEN_KVDESC).is_some() {
            return Err(unsupported("a diagonal band mask with cumulative sequence lengths is not supported"));
        }
        let (x, b, y) = (self.req(s, OP_DBM_XDESC)?, self.req(s, OP_DBM_BDESC)?, self.req(s, OP_DBM_YDESC)?);
        let cmp = match s.int(OP_DBM_COMPARISON_MODE).unwrap_or(pw::CMP_GE) {
            pw::CMP_GE => PointwiseMode::CmpGe,
            pw::CMP_GT => PointwiseMode::CmpGt,
            pw::CMP_LE => PointwiseMode::CmpLe,
            pw::CMP_LT => PointwiseMode::CmpLt,
            pw::CMP_EQ => PointwiseMode::CmpEq,
            pw::CMP_NEQ => PointwiseMode::CmpNeq,
            m => return Err(bad(format!("CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_COMPARISON_MODE {m} is not a comparison mode"))),
        };
        let rank = self.g.desc(x).dims.len();
        if rank < 2 {
            return Err(bad(format!("a diagonal band mask needs rows and columns (rank 2 or more), got dims {:?}", self.g.desc(x).dims)));
        }
        let f = DataType::F32;
        let index = |l: &mut Lower, axis: usize| {
            let t = l.scratch(x, f);
            l.pointwise(PointwiseMode::GenIndex { axis }, vec![("a", x)], t, None);
            t
        };
        let row = index(self, rank - 2);
        let col = index(self, rank - 1);
        let arith = |l: &mut Lower, mode: PointwiseMode, a: TensorId, t: TensorId| {
            let out = l.scratch(x, f);
            l.pointwise(mode, vec![("a", a), ("b", t)], out, None);
            out
        };
        let (skv, sq) = (self.opt(s, OP_DBM_SEQ_LEN_KVDESC)?, self.opt(s, OP_DBM_SEQ_LEN_QDESC)?);
        let (lhs, rhs) = match self.opt(s, OP_DBM_LEFT_BOUND_DESC)? {
            Some(left) => {
                let mut c = arith(self, PointwiseMode::Add, col, left);
                if let Some(t) = skv {
                    c = arith(self, PointwiseMode::Sub, c, t);
                }
                if let Some(t) = sq {
                    c = arith(self, PointwiseMode::Add, c, t);
                }
                (c, row)
            }
            None => {
                let mut r = row;
                if let Some(t) = skv {
                    r = arith(self, PointwiseMode::Add, r, t);
                }
                if let Some(t) = sq {
                    r = arith(self, PointwiseMode::Sub, r, t);
                }
                if let Some(t) = self.opt(s, OP_DBM_SHIFT_RIGHT_BOUND_DESC)? {
                    r = arith(self, PointwiseMode::Add, r, t);
                }
                (r, col)
            }
        };
        let keep = self.scratch(x, DataType::Bool);
        self.pointwise(cmp, vec![("a", lhs), ("b", rhs)], keep, None);
        self.pointwise(PointwiseMode::BinarySelect, vec![("a", x), ("b", b), ("c", keep)], y, None);
        Ok(())
    }

    fn sdpa(&mut self, s: &Snapshot) -> R<()> {
        for (attr, what) in [
            (OP_SDPA_FWD_BLOCK_MASK_DESC, "block masks"),
            (OP_SDPA_FWD_CU_SEQ_LEN_QDESC, "cumulative sequence lengths"),
            (OP_SDPA_FWD_CU_SEQ_LEN_QDESC + 1, "cumulative sequence lengths"),
        ] {
            if s.value(attr).is_some() {
                return Err(unsupported(format!("attention with {what} ({}) is not supported by ferrodnn's backend API", s.what(attr))));
            }
        }
        for a in (OP_SDPA_FWD_CU_SEQ_LEN_QDESC + 2)..=OP_SDPA_FWD_AMAX_ODESC {
            if s.value(a).is_some() {
                return Err(unsupported(format!("fp8 attention scaling ({}) is not supported by ferrodnn's backend API", s.what(a))));
            }
        }
        let (q, k, v, o) = (self.req(s, OP_SDPA_FWD_QDESC)?, self.req(s, OP_SDPA_FWD_KDESC)?, self.req(s, OP_SDPA_FWD_VDESC)?, self.req(s, OP_SDPA_FWD_ODESC)?);
        let mut ins = vec![("q", q), ("k", k), ("v", v)];
        let mut outs = vec![("o", o)];
        let mut attrs = SdpaAttrs::default();
        if let Some(sub) = s.desc(OP_SDPA_FWD_SUBGRAPH) {
            attrs.causal = Some(causal_subgraph(s, sub, OP_SDPA_FWD_SUBGRAPH_INPUT_UID, OP_SDPA_FWD_SUBGRAPH_OUTPUT_UID)?);
        }
        if let Some(scale) = self.opt(s, OP_SDPA_FWD_SCALEDESC)? {
            ins.push(("attn_scale", scale));
        }
        let mut stats = self.opt(s, OP_SDPA_FWD_STATSDESC)?;
        if let Some(sm) = s.desc(OP_SDPA_FWD_SOFTMAX_DESC) {
            for a in [OP_SOFTMAX_MAX_DESC, OP_SOFTMAX_SUM_EXP_DESC, OP_SOFTMAX_SINK_DESC] {
                if sm.value(a).is_some() {
                    return Err(unsupported(format!("attention's softmax with {} is not supported (its statistics output is)", sm.what(a))));
                }
            }
            if let Some(st) = self.opt(sm, OP_SOFTMAX_STATS_DESC)? {
                stats = Some(st);
            }
        }
        if let Some(st) = stats {
            attrs.generate_stats = true;
            outs.push(("stats", st));
        }
        let (lq, lkv) = (self.opt(s, OP_SDPA_FWD_SEQ_LEN_QDESC)?, self.opt(s, OP_SDPA_FWD_SEQ_LEN_KVDESC)?);
        if lq.is_some() || lkv.is_some() {
            attrs.padding_mask = true;
            ins.push(("seq_len_q", lq.ok_or_else(|| bad("attention with sequence lengths needs both CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_QDESC and _KVDESC"))?));
            ins.push(("seq_len_kv", lkv.ok_or_else(|| bad("attention with sequence lengths needs both CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_QDESC and _KVDESC"))?));
        }
        for (attr, p) in [(OP_SDPA_FWD_PAGE_TABLE_KDESC, "page_table_k"), (OP_SDPA_FWD_PAGE_TABLE_VDESC, "page_table_v")] {
            if let Some(t) = self.opt(s, attr)? {
                ins.push((p, t));
            }
        }
        if let Some(p) = s.f64_(OP_SDPA_FWD_DROPOUT_PROBABILITY).filter(|&p| p != 0.0) {
            attrs.dropout = Some(p);
            ins.push(("seed", self.req(s, OP_SDPA_FWD_DROPOUT_SEED_DESC)?));
            ins.push(("offset", self.req(s, OP_SDPA_FWD_DROPOUT_OFFSET_DESC)?));
            if let Some(d) = self.opt(s, OP_SDPA_FWD_DROPOUT_RNG_DUMP_DESC)? {
                attrs.rng_dump = true;
                outs.push(("rng_dump", d));
            }
        }
        self.node(Op::Sdpa(attrs), ins, outs, None);
        Ok(())
    }

    /// The frontend's attention backward as one node: ferrodnn's fused `sdpa_backward` with the
    /// forward's scale, causal mask (the same score-modifier subgraph as SDPA_FWD), padding by
    /// sequence lengths and attention sink.
    fn sdpa_backward(&mut self, s: &Snapshot) -> R<()> {
        let mut ins = Vec::new();
        for (attr, port) in
            [(OP_SDPA_BWD_QDESC, "q"), (OP_SDPA_BWD_KDESC, "k"), (OP_SDPA_BWD_VDESC, "v"), (OP_SDPA_BWD_ODESC, "o"), (OP_SDPA_BWD_DODDESC, "do"), (OP_SDPA_BWD_STATSDESC, "stats")]
        {
            ins.push((port, self.req(s, attr)?));
        }
        let mut outs = vec![("dq", self.req(s, OP_SDPA_BWD_DQDESC)?), ("dk", self.req(s, OP_SDPA_BWD_DKDESC)?), ("dv", self.req(s, OP_SDPA_BWD_DVDESC)?)];
        let mut attrs = SdpaAttrs { generate_stats: true, ..SdpaAttrs::default() };
        if let Some(sub) = s.desc(OP_SDPA_BWD_SUBGRAPH) {
            attrs.causal = Some(causal_subgraph(s, sub, OP_SDPA_BWD_SUBGRAPH_INPUT_UID, OP_SDPA_BWD_SUBGRAPH_OUTPUT_UID)?);
        }
        if let Some(scale) = self.opt(s, OP_SDPA_BWD_SCALEDESC)? {
            ins.push(("attn_scale", scale));
        }
        let (lq, lkv) = (self.opt(s, OP_SDPA_BWD_SEQ_LEN_QDESC)?, self.opt(s, OP_SDPA_BWD_SEQ_LEN_KVDESC)?);
        if lq.is_some() || lkv.is_some() {
            attrs.padding_mask = true;
            let both = || bad("attention backward with sequence lengths needs both CUDNN_ATTR_OPERATION_SDPA_BWD_SEQ_LEN_QDESC and _KVDESC");
            ins.push(("seq_len_q", lq.ok_or_else(both)?));
            ins.push(("seq_len_kv", lkv.ok_or_else(both)?));
        }
        match (self.opt(s, OP_SDPA_BWD_SINK_DESC)?, self.opt(s, OP_SDPA_BWD_DSINK_DESC)?) {
            (Some(sink), Some(dsink)) => {
                ins.push(("sink_token", sink));
                outs.push(("dsink_token", dsink));
            }
            (None, None) => {}
            _ => return Err(bad("attention backward with a sink needs both CUDNN_ATTR_OPERATION_SDPA_BWD_SINK_DESC and _DSINK_DESC")),
        }
        self.node(Op::SdpaBackward(attrs), ins, outs, None);
        Ok(())
    }
}

/// The causal mask an attention operation's score-modifier subgraph stands for: the cudnn
/// frontend's causal mask is one diagonal band mask keeping the scores on and below the diagonal
/// (comparison CMP_GE, no left bound, no shift of the right bound), aligned top-left, or
/// bottom-right when it is given the sequence lengths. Other score modifiers (sliding windows,
/// whose bounds are tensors known only when the graph runs, biases, ALiBi, soft-capping) are not
/// supported.
fn causal_subgraph(s: &Snapshot, sub: &Snapshot, input_uid: i32, output_uid: i32) -> R<ferrodnn::graph::ops::sdpa::CausalAlignment> {
    use ferrodnn::graph::ops::sdpa::CausalAlignment;
    let no = |why: &str| unsupported(format!("attention's score-modifier subgraph: {why}; ferrodnn takes the frontend's causal masks (top-left or bottom-right) only"));
    let ops = match &sub.built {
        Built::Subgraph(ops) => ops,
        _ => return Err(no("it holds operations other than a diagonal band mask (a bias, ALiBi, soft-capping or another modifier)")),
    };
    let [op] = ops.as_slice() else { return Err(no(&format!("it has {} operations (a bias, ALiBi or another modifier besides the mask)", ops.len()))) };
    let uid = |o: &Snapshot, a: i32| o.desc(a).and_then(|d| d.tensor()).map(|t| t.uid);
    let (input, output) = (s.i64_(input_uid), s.i64_(output_uid));
    if input.is_some() && input != uid(op, OP_DBM_XDESC) || output.is_some() && output != uid(op, OP_DBM_YDESC) {
        return Err(no("its mask does not read the scores and write the subgraph's output"));
    }
    if op.int(OP_DBM_COMPARISON_MODE) != Some(pw::CMP_GE) {
        return Err(no("its diagonal band mask is not a right bound (CMP_GE)"));
    }
    if op.value(OP_DBM_LEFT_BOUND_DESC).is_some() || op.value(OP_DBM_SHIFT_RIGHT_BOUND_DESC).is_some() {
        return Err(no("it has a left bound or a shifted right bound (a sliding window)"));
    }
    if op.value(OP_DBM_CU_SEQ_LEN_QDESC).is_some() || op.value(OP_DBM_CU_SEQ_LEN_KVDESC).is_some() {
        return Err(no("it has cumulative sequence lengths"));
    }
    Ok(if op.value(OP_DBM_SEQ_LEN_QDESC).is_some() || op.value(OP_DBM_SEQ_LEN_KVDESC).is_some() { CausalAlignment::BottomRight } else { CausalAlignment::TopLeft })
}

/// The uids of the tensors an operation writes.
fn output_uids(o: &Snapshot) -> Vec<i64> {
    let attrs: &[i32] = match o.kind {
        OP_CONV_FORWARD => &[OP_CONV_FWD_Y],
        OP_CONV_BWD_DATA => &[OP_CONV_BWD_DATA_DX],
        OP_CONV_BWD_FILTER => &[OP_CONV_BWD_FILTER_DW],
        OP_POINTWISE => &[OP_PW_YDESC, OP_PW_DXDESC],
        OP_MATMUL => &[OP_MATMUL_CDESC],
        OP_REDUCTION => &[OP_REDUCTION_YDESC],
        OP_DIAGONAL_BAND_MASK => &[OP_DBM_YDESC],
        OP_RESHAPE => &[OP_RESHAPE_YDESC],
        OP_TRANSPOSE => &[OP_TRANSPOSE_YDESC],
        OP_SLICE => &[OP_SLICE_YDESC],
        OP_RNG => &[OP_RNG_YDESC],
        OP_CONCAT => &[OP_CONCAT_OUTPUT_DESC],
        OP_SDPA_BWD => &[OP_SDPA_BWD_DQDESC, OP_SDPA_BWD_DKDESC, OP_SDPA_BWD_DVDESC, OP_SDPA_BWD_DSINK_DESC],
        _ => &[],
    };
    attrs.iter().filter_map(|&a| o.desc(a).and_then(|d| d.tensor()).map(|t| t.uid)).collect()
}

/// Whether attribute `attr` of `a` and `b` is the same tensor (by uid).
fn same_tensor(a: &Snapshot, b: &Snapshot, attr: i32) -> bool {
    match (a.desc(attr).and_then(|d| d.tensor()), b.desc(attr).and_then(|d| d.tensor())) {
        (Some(x), Some(y)) => x.uid == y.uid,
        _ => false,
    }
}

/// The built value of a snapshot that must be an operation graph.
pub fn op_graph(s: &Snapshot) -> Option<&Arc<OpGraph>> {
    match &s.built {
        Built::Graph(g) => Some(g),
        _ => None,
    }
}
