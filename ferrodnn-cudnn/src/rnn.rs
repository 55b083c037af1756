//! The RNN calls of cuDNN's v8 API (cudnn_adv): RNN and RNN data descriptors, LSTM cell
//! clipping, the weight-space and temp-space sizes, cudnnGetRNNWeightParams, cudnnRNNForward,
//! cudnnRNNBackwardData_v8 and cudnnRNNBackwardWeights_v8, on ferrodnn's `rnn`,
//! `rnn_backward_data` and `rnn_backward_weights` graph ops (so a GPU handle runs the CUDA
//! engine's persistent kernels).
//!
//! The weight space is the ops' packed layout ([`RnnDesc::weight_params`]): pseudo-layer by
//! pseudo-layer, each one's matrices in linear-id order, then its input biases, then its
//! recurrent ones; cudnnGetRNNWeightParams answers from it, which is how programs (PyTorch
//! included) fill it. The reserve space is the forward's `reserve` tensor followed by the
//! backward data's `dgates` (cuDNN's backward data also writes its reserve space, which the
//! backward weights call reads), both f32 (f64 for double data).
//!
//! Packed sequences (CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED) hold only their valid rows: the
//! ops' `[T * B, features]` tensors are full-size copies in scratch memory
//! ([`crate::exec::Partial`]).

use crate::api::*;
use crate::desc::{data_type, tensor, TensorDescriptor, TENSORS};
use crate::dropout::{draw, DROPOUTS};
use crate::exec::{execute, new_graph, plan, Call};
use crate::handle::{handle, HandleState};
use crate::registry::Registry;
use crate::types::*;
use ferrodnn::graph::ops::rnn::{CellClip, RnnBackwardInputs, RnnBiasMode, RnnDesc, RnnDirection, RnnInputs, RnnLayout, RnnMode};
use ferrodnn::{DataType, Graph, Plan, PlanPolicy, TensorDesc, TensorId};
use std::ffi::c_void;
use std::sync::Arc;

/// `cudnnRNNAlgo_t` (every algorithm runs the same plans), `cudnnForwardMode_t`,
/// `cudnnRNNMode_t`, `cudnnRNNBiasMode_t`, `cudnnDirectionMode_t`, `cudnnRNNInputMode_t`,
/// `cudnnRNNClipMode_t`, `cudnnRNNDataLayout_t`, `cudnnWgradMode_t`.
pub const CUDNN_RNN_ALGO_COUNT: i32 = 4;
pub const CUDNN_FWD_MODE_INFERENCE: i32 = 0;
pub const CUDNN_FWD_MODE_TRAINING: i32 = 1;
pub const CUDNN_RNN_RELU: i32 = 0;
pub const CUDNN_RNN_TANH: i32 = 1;
pub const CUDNN_LSTM: i32 = 2;
pub const CUDNN_GRU: i32 = 3;
pub const CUDNN_RNN_NO_BIAS: i32 = 0;
pub const CUDNN_RNN_SINGLE_INP_BIAS: i32 = 1;
pub const CUDNN_RNN_DOUBLE_BIAS: i32 = 2;
pub const CUDNN_RNN_SINGLE_REC_BIAS: i32 = 3;
pub const CUDNN_UNIDIRECTIONAL: i32 = 0;
pub const CUDNN_BIDIRECTIONAL: i32 = 1;
pub const CUDNN_LINEAR_INPUT: i32 = 0;
pub const CUDNN_SKIP_INPUT: i32 = 1;
pub const CUDNN_RNN_CLIP_NONE: i32 = 0;
pub const CUDNN_RNN_CLIP_MINMAX: i32 = 1;
pub const CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED: i32 = 0;
pub const CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED: i32 = 1;
pub const CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED: i32 = 2;
pub const CUDNN_WGRAD_MODE_ADD: i32 = 0;
pub const CUDNN_WGRAD_MODE_SET: i32 = 1;
/// `auxFlags`: CUDNN_RNN_PADDED_IO_ENABLED is the one flag cuDNN defines.
pub const CUDNN_RNN_PADDED_IO_ENABLED: u32 = 1;

/// Sizes past this are refused as BAD_PARAM before any arithmetic on them.
const SIZE_LIMIT: i32 = 1 << 24;

/// An RNN descriptor: what cudnnSetRNNDescriptor_v8 and the clip setters were given.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RnnDescriptor {
    pub set: bool,
    pub algo: i32,
    pub cell_mode: i32,
    pub bias_mode: i32,
    pub dir_mode: i32,
    pub input_mode: i32,
    pub dt_raw: i32,
    pub math_prec: i32,
    pub math_type: i32,
    pub input_size: i32,
    pub hidden_size: i32,
    pub proj_size: i32,
    pub num_layers: i32,
    /// The dropout descriptor between layers (null: none).
    pub dropout: usize,
    pub aux_flags: u32,
    pub clip_mode: i32,
    pub clip_nan: i32,
    pub lclip: f64,
    pub rclip: f64,
}

pub static RNNS: Registry<RnnDescriptor> = Registry::new("cudnnRNNDescriptor_t");

/// An RNN data descriptor.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RnnDataDescriptor {
    pub set: bool,
    pub dt_raw: i32,
    pub layout: i32,
    pub max_seq: i32,
    pub batch: i32,
    pub vector: i32,
    pub lens: Vec<i32>,
    /// The padding fill (None: the caller gave none; outputs get 0 there).
    pub fill: Option<f64>,
}

impl RnnDataDescriptor {
    fn dt(&self) -> DataType {
        data_type(self.dt_raw).unwrap_or(DataType::F32)
    }
    /// Vectors the caller's buffer holds: `T * B` unpacked, the sum of the lengths packed.
    fn rows(&self) -> usize {
        if self.layout == CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED {
            self.lens.iter().map(|&l| l as usize).sum()
        } else {
            self.max_seq as usize * self.batch as usize
        }
    }
    /// Bytes of the caller's buffer, and of the ops' full-size tensor.
    fn bytes(&self) -> (usize, usize) {
        let v = self.vector as usize * self.dt().size();
        (self.rows() * v, self.max_seq as usize * self.batch as usize * v)
    }
    fn full_lengths(&self) -> bool {
        self.lens.iter().all(|&l| l == self.max_seq)
    }
}

pub static RNN_DATA: Registry<RnnDataDescriptor> = Registry::new("cudnnRNNDataDescriptor_t");

fn rnn_desc(p: cudnnRNNDescriptor_t) -> R<RnnDescriptor> {
    let d = RNNS.get(p).map_err(|e| ApiError::new(e.status, format!("`rnnDesc`: {}", e.msg)))?;
    if !d.set {
        return Err(bad("`rnnDesc` was created but never set (cudnnSetRNNDescriptor_v8)"));
    }
    Ok(d)
}

fn data_desc(p: cudnnRNNDataDescriptor_t, name: &str) -> R<RnnDataDescriptor> {
    let d = RNN_DATA.get(p).map_err(|e| ApiError::new(e.status, format!("`{name}`: {}", e.msg)))?;
    if !d.set {
        return Err(bad(format!("`{name}` was created but never set (cudnnSetRNNDataDescriptor)")));
    }
    Ok(d)
}

fn float_data(raw: i32, name: &str) -> R<DataType> {
    let dt = data_type(raw)?;
    if !matches!(dt, DataType::F32 | DataType::F64 | DataType::F16 | DataType::Bf16) {
        return Err(ApiError::new(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, format!("`{name}` is {dt}; the RNN calls take half, bfloat16, float or double data")));
    }
    Ok(dt)
}

// ------------------------------------------------------------------------------------------
// Descriptors
// ------------------------------------------------------------------------------------------

#[no_mangle]
pub extern "C" fn cudnnCreateRNNDescriptor(out: *mut cudnnRNNDescriptor_t) -> Status {
    guard("cudnnCreateRNNDescriptor", || {
        non_null(out, "rnnDesc")?;
        let p = RNNS.create(RnnDescriptor::default());
        // SAFETY: checked not null; the caller gives a writable descriptor slot.
        unsafe { write_out(out, "rnnDesc", p) }
    })
}

#[no_mangle]
pub extern "C" fn cudnnDestroyRNNDescriptor(p: cudnnRNNDescriptor_t) -> Status {
    guard("cudnnDestroyRNNDescriptor", || if p.is_null() { Ok(()) } else { RNNS.destroy(p) })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnSetRNNDescriptor_v8(
    p: cudnnRNNDescriptor_t,
    algo: i32,
    cell_mode: i32,
    bias_mode: i32,
    dir_mode: i32,
    input_mode: i32,
    dt: i32,
    math_prec: i32,
    math_type: i32,
    input_size: i32,
    hidden_size: i32,
    proj_size: i32,
    num_layers: i32,
    dropout: cudnnDropoutDescriptor_t,
    aux_flags: u32,
) -> Status {
    guard("cudnnSetRNNDescriptor_v8", || {
        let checks: [(&str, i32, i32); 5] = [
            ("algo", algo, CUDNN_RNN_ALGO_COUNT - 1),
            ("cellMode", cell_mode, CUDNN_GRU),
            ("biasMode", bias_mode, CUDNN_RNN_SINGLE_REC_BIAS),
            ("dirMode", dir_mode, CUDNN_BIDIRECTIONAL),
            ("inputMode", input_mode, CUDNN_SKIP_INPUT),
        ];
        for (name, v, max) in checks {
            if !(0..=max).contains(&v) {
                return Err(bad(format!("{name} {v} is outside its enum (0 to {max})")));
            }
        }
        if !(0..=CUDNN_FMA_MATH).contains(&math_type) {
            return Err(bad(format!("mathType {math_type} is not a cudnnMathType_t")));
        }
        let data = float_data(dt, "dataType")?;
        let prec = float_data(math_prec, "mathPrec")?;
        let prec_ok = match data {
            DataType::F64 => prec == DataType::F64,
            DataType::F32 => prec == DataType::F32,
            _ => prec == DataType::F32 || prec == data,
        };
        if !prec_ok {
            return Err(bad(format!("mathPrec {prec} does not go with dataType {data} (float data computes in float, double in double, half in half or float)")));
        }
        for (name, v) in [("inputSize", input_size), ("hiddenSize", hidden_size), ("numLayers", num_layers)] {
            if !(1..=SIZE_LIMIT).contains(&v) {
                return Err(bad(format!("{name} {v} must be in [1, {SIZE_LIMIT}]")));
            }
        }
        if proj_size < 0 || proj_size > hidden_size {
            return Err(bad(format!("projSize {proj_size} must be in [0, hiddenSize = {hidden_size}] (0 or hiddenSize: no projection)")));
        }
        if proj_size != 0 && proj_size != hidden_size && cell_mode != CUDNN_LSTM {
            return Err(bad(format!("projSize {proj_size} differs from hiddenSize {hidden_size}, but only LSTM cells have a recurrent projection")));
        }
        if input_mode == CUDNN_SKIP_INPUT {
            return Err(unsupported("inputMode CUDNN_SKIP_INPUT is not supported by ferrodnn (CUDNN_LINEAR_INPUT is)"));
        }
        if aux_flags & !CUDNN_RNN_PADDED_IO_ENABLED != 0 {
            return Err(bad(format!("auxFlags {aux_flags:#x} has bits other than CUDNN_RNN_PADDED_IO_ENABLED")));
        }
        if !dropout.is_null() && !DROPOUTS.contains(dropout) {
            return Err(bad(format!("`dropoutDesc` {dropout:?} is not a live cudnnDropoutDescriptor_t")));
        }
        RNNS.with(p, |d| {
            *d = RnnDescriptor {
                set: true,
                algo,
                cell_mode,
                bias_mode,
                dir_mode,
                input_mode,
                dt_raw: dt,
                math_prec,
                math_type,
                input_size,
                hidden_size,
                proj_size: if proj_size == 0 { hidden_size } else { proj_size },
                num_layers,
                dropout: dropout as usize,
                aux_flags,
                clip_mode: d.clip_mode,
                clip_nan: d.clip_nan,
                lclip: d.lclip,
                rclip: d.rclip,
            };
            Ok(())
        })
        .map_err(|e| ApiError::new(e.status, format!("`rnnDesc`: {}", e.msg)))
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnGetRNNDescriptor_v8(
    p: cudnnRNNDescriptor_t,
    algo: *mut i32,
    cell_mode: *mut i32,
    bias_mode: *mut i32,
    dir_mode: *mut i32,
    input_mode: *mut i32,
    dt: *mut i32,
    math_prec: *mut i32,
    math_type: *mut i32,
    input_size: *mut i32,
    hidden_size: *mut i32,
    proj_size: *mut i32,
    num_layers: *mut i32,
    dropout: *mut cudnnDropoutDescriptor_t,
    aux_flags: *mut u32,
) -> Status {
    guard("cudnnGetRNNDescriptor_v8", || {
        let d = rnn_desc(p)?;
        // SAFETY: each out pointer is checked not null; the caller gives writable values.
        unsafe {
            write_out(algo, "algo", d.algo)?;
            write_out(cell_mode, "cellMode", d.cell_mode)?;
            write_out(bias_mode, "biasMode", d.bias_mode)?;
            write_out(dir_mode, "dirMode", d.dir_mode)?;
            write_out(input_mode, "inputMode", d.input_mode)?;
            write_out(dt, "dataType", d.dt_raw)?;
            write_out(math_prec, "mathPrec", d.math_prec)?;
            write_out(math_type, "mathType", d.math_type)?;
            write_out(input_size, "inputSize", d.input_size)?;
            write_out(hidden_size, "hiddenSize", d.hidden_size)?;
            write_out(proj_size, "projSize", d.proj_size)?;
            write_out(num_layers, "numLayers", d.num_layers)?;
            write_out(dropout, "dropoutDesc", d.dropout as cudnnDropoutDescriptor_t)?;
            write_out(aux_flags, "auxFlags", d.aux_flags)
        }
    })
}

fn set_clip(p: cudnnRNNDescriptor_t, mode: i32, nan: Option<i32>, l: f64, r: f64) -> R<()> {
    if !(CUDNN_RNN_CLIP_NONE..=CUDNN_RNN_CLIP_MINMAX).contains(&mode) {
        return Err(bad(format!("clipMode {mode} is not a cudnnRNNClipMode_t")));
    }
    if let Some(n) = nan {
        if !(CUDNN_NOT_PROPAGATE_NAN..=CUDNN_PROPAGATE_NAN).contains(&n) {
            return Err(bad(format!("clipNanOpt {n} is not a cudnnNanPropagation_t")));
        }
    }
    if mode == CUDNN_RNN_CLIP_MINMAX && (l.is_nan() || r.is_nan() || l > r) {
        return Err(bad(format!("lclip {l} and rclip {r}: clipping needs lclip <= rclip (neither NaN)")));
    }
    RNNS.with(p, |d| {
        if !d.set {
            return Err(bad("`rnnDesc` was created but never set (cudnnSetRNNDescriptor_v8)"));
        }
        d.clip_mode = mode;
        if let Some(n) = nan {
            d.clip_nan = n;
        }
        d.lclip = l;
        d.rclip = r;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cudnnRNNSetClip_v8(p: cudnnRNNDescriptor_t, mode: i32, nan: i32, l: f64, r: f64) -> Status {
    guard("cudnnRNNSetClip_v8", || set_clip(p, mode, Some(nan), l, r))
}

#[no_mangle]
pub extern "C" fn cudnnRNNSetClip_v9(p: cudnnRNNDescriptor_t, mode: i32, l: f64, r: f64) -> Status {
    guard("cudnnRNNSetClip_v9", || set_clip(p, mode, None, l, r))
}

#[no_mangle]
pub extern "C" fn cudnnRNNGetClip_v8(p: cudnnRNNDescriptor_t, mode: *mut i32, nan: *mut i32, l: *mut f64, r: *mut f64) -> Status {
    guard("cudnnRNNGetClip_v8", || {
        let d = rnn_desc(p)?;
        // SAFETY: each out pointer is checked not null; the caller gives writable values.
        unsafe {
            write_out(mode, "clipMode", d.clip_mode)?;
            write_out(nan, "clipNanOpt", d.clip_nan)?;
            write_out(l, "lclip", d.lclip)?;
            write_out(r, "rclip", d.rclip)
        }
    })
}

#[no_mangle]
pub extern "C" fn cudnnRNNGetClip_v9(p: cudnnRNNDescriptor_t, mode: *mut i32, l: *mut f64, r: *mut f64) -> Status {
    guard("cudnnRNNGetClip_v9", || {
        let d = rnn_desc(p)?;
        // SAFETY: each out pointer is checked not null; the caller gives writable values.
        unsafe {
            write_out(mode, "clipMode", d.clip_mode)?;
            write_out(l, "lclip", d.lclip)?;
            write_out(r, "rclip", d.rclip)
        }
    })
}

#[no_mangle]
pub extern "C" fn cudnnBuildRNNDynamic(h: cudnnHandle_t, p: cudnnRNNDescriptor_t, mini_batch: i32) -> Status {
    guard("cudnnBuildRNNDynamic", || {
        handle(h)?;
        rnn_desc(p)?;
        if mini_batch <= 0 {
            return Err(bad(format!("miniBatch {mini_batch} must be positive")));
        }
        // ferrodnn compiles a plan's kernels when the plan is built, at the first call.
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cudnnCreateRNNDataDescriptor(out: *mut cudnnRNNDataDescriptor_t) -> Status {
    guard("cudnnCreateRNNDataDescriptor", || {
        non_null(out, "rnnDataDesc")?;
        let p = RNN_DATA.create(RnnDataDescriptor::default());
        // SAFETY: checked not null; the caller gives a writable descriptor slot.
        unsafe { write_out(out, "rnnDataDesc", p) }
    })
}

#[no_mangle]
pub extern "C" fn cudnnDestroyRNNDataDescriptor(p: cudnnRNNDataDescriptor_t) -> Status {
    guard("cudnnDestroyRNNDataDescriptor", || if p.is_null() { Ok(()) } else { RNN_DATA.destroy(p) })
}

/// Reads a host value of data type `dt` (the padding fill).
///
/// # Safety
/// `p` must point at a readable value of `dt`.
unsafe fn read_value(p: *const c_void, dt: DataType) -> f64 {
    let mut bytes = vec![0u8; dt.size()];
    // SAFETY: forwarded from the caller: `size` readable bytes.
    unsafe { std::ptr::copy_nonoverlapping(p as *const u8, bytes.as_mut_ptr(), bytes.len()) };
    dt.decode(&bytes)[0]
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnSetRNNDataDescriptor(
    p: cudnnRNNDataDescriptor_t,
    dt: i32,
    layout: i32,
    max_seq: i32,
    batch: i32,
    vector: i32,
    lens: *const i32,
    fill: *mut c_void,
) -> Status {
    guard("cudnnSetRNNDataDescriptor", || {
        let data = float_data(dt, "dataType")?;
        if !(0..=CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED).contains(&layout) {
            return Err(bad(format!("layout {layout} is not a cudnnRNNDataLayout_t")));
        }
        for (name, v) in [("maxSeqLength", max_seq), ("batchSize", batch), ("vectorSize", vector)] {
            if !(1..=SIZE_LIMIT).contains(&v) {
                return Err(bad(format!("{name} {v} must be in [1, {SIZE_LIMIT}]")));
            }
        }
        if max_seq as i64 * batch as i64 * vector as i64 > ferrodnn::graph::MAX_ELEMENTS {
            return Err(ApiError::new(CUDNN_STATUS_NOT_SUPPORTED_SHAPE, format!("maxSeqLength {max_seq} x batchSize {batch} x vectorSize {vector} is too many elements")));
        }
        non_null(lens, "seqLengthArray")?;
        // SAFETY: not null (checked); the caller gives batchSize readable ints.
        let lens: Vec<i32> = (0..batch as usize).map(|i| unsafe { lens.add(i).read_unaligned() }).collect();
        if let Some((i, l)) = lens.iter().enumerate().find(|(_, &l)| !(0..=max_seq).contains(&l)) {
            return Err(bad(format!("seqLengthArray[{i}] = {l} is outside [0, maxSeqLength = {max_seq}]")));
        }
        if layout == CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED {
            if let Some(i) = (1..lens.len()).find(|&i| lens[i] > lens[i - 1]) {
                return Err(bad(format!(
                    "the packed layout needs non-increasing lengths, but seqLengthArray[{i}] = {} follows seqLengthArray[{}] = {}",
                    lens[i],
                    i - 1,
                    lens[i - 1]
                )));
            }
        }
        // SAFETY: not null (checked); the caller gives a value of the data type.
        let fill = (!fill.is_null()).then(|| unsafe { read_value(fill, data) });
        if fill.is_some_and(f64::is_nan) {
            return Err(unsupported("a NaN paddingFill is not supported"));
        }
        RNN_DATA
            .with(p, |d| {
                *d = RnnDataDescriptor { set: true, dt_raw: dt, layout, max_seq, batch, vector, lens, fill };
                Ok(())
            })
            .map_err(|e| ApiError::new(e.status, format!("`rnnDataDesc`: {}", e.msg)))
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnGetRNNDataDescriptor(
    p: cudnnRNNDataDescriptor_t,
    dt: *mut i32,
    layout: *mut i32,
    max_seq: *mut i32,
    batch: *mut i32,
    vector: *mut i32,
    requested: i32,
    lens: *mut i32,
    fill: *mut c_void,
) -> Status {
    guard("cudnnGetRNNDataDescriptor", || {
        let d = data_desc(p, "rnnDataDesc")?;
        if requested < 0 {
            return Err(bad(format!("arrayLengthRequested {requested} is negative")));
        }
        if requested > 0 {
            non_null(lens, "seqLengthArray")?;
        }
        // SAFETY: each out pointer is checked not null; the caller gives writable values and
        // `arrayLengthRequested` writable ints in seqLengthArray.
        unsafe {
            write_out(dt, "dataType", d.dt_raw)?;
            write_out(layout, "layout", d.layout)?;
            write_out(max_seq, "maxSeqLength", d.max_seq)?;
            write_out(batch, "batchSize", d.batch)?;
            write_out(vector, "vectorSize", d.vector)?;
            for (i, &l) in d.lens.iter().take(requested as usize).enumerate() {
                lens.add(i).write_unaligned(l);
            }
            if !fill.is_null() {
                let bytes = d.dt().encode(&[d.fill.unwrap_or(0.0)]);
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), fill as *mut u8, bytes.len());
            }
        }
        Ok(())
    })
}

// ------------------------------------------------------------------------------------------
// The problem: descriptors -> the ops' RnnDesc
// ------------------------------------------------------------------------------------------

/// One call's descriptors, checked against each other.
struct Problem {
    rd: RnnDescriptor,
    x: RnnDataDescriptor,
    desc: RnnDesc,
    dt: DataType,
}

impl Problem {
    /// The ops' descriptor for `rd` on `x`, training or not; `fill` is the output's padding.
    fn new(rd: RnnDescriptor, x: RnnDataDescriptor, training: bool, fill: f64) -> R<Problem> {
        let dt = data_type(rd.dt_raw)?;
        if x.dt_raw != rd.dt_raw {
            return Err(bad(format!("`xDesc` is {} but `rnnDesc` has dataType {dt}; they must match", x.dt())));
        }
        if x.vector != rd.input_size {
            return Err(bad(format!("`xDesc` has vectorSize {} but `rnnDesc` has inputSize {}; they must match", x.vector, rd.input_size)));
        }
        let lstm = rd.cell_mode == CUDNN_LSTM;
        let dropout = if training && rd.dropout != 0 {
            let d = DROPOUTS.get(rd.dropout as cudnnDropoutDescriptor_t).map_err(|e| bad(format!("the RNN descriptor's dropout descriptor: {}", e.msg)))?;
            (d.set && d.p > 0.0 && rd.num_layers > 1).then_some(d.p as f64)
        } else {
            None
        };
        let desc = RnnDesc {
            cell_mode: match rd.cell_mode {
                CUDNN_RNN_RELU => RnnMode::Relu,
                CUDNN_RNN_TANH => RnnMode::Tanh,
                CUDNN_LSTM => RnnMode::Lstm,
                _ => RnnMode::Gru,
            },
            direction: if rd.dir_mode == CUDNN_BIDIRECTIONAL { RnnDirection::Bidirectional } else { RnnDirection::Unidirectional },
            num_layers: rd.num_layers as i64,
            input_size: rd.input_size as i64,
            hidden_size: rd.hidden_size as i64,
            proj_size: (rd.proj_size != rd.hidden_size).then_some(rd.proj_size as i64),
            bias_mode: match rd.bias_mode {
                CUDNN_RNN_NO_BIAS => RnnBiasMode::NoBias,
                CUDNN_RNN_SINGLE_INP_BIAS => RnnBiasMode::SingleInp,
                CUDNN_RNN_SINGLE_REC_BIAS => RnnBiasMode::SingleRec,
                _ => RnnBiasMode::Double,
            },
            cell_clip: (lstm && rd.clip_mode == CUDNN_RNN_CLIP_MINMAX).then_some(CellClip { lower: rd.lclip, upper: rd.rclip, propagate_nan: rd.clip_nan == CUDNN_PROPAGATE_NAN }),
            dropout,
            layout: match x.layout {
                CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED => RnnLayout::SeqMajorPacked,
                CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED => RnnLayout::BatchMajorUnpacked,
                _ => RnnLayout::SeqMajorUnpacked,
            },
            max_seq_length: x.max_seq as i64,
            batch: x.batch as i64,
            padding_fill: fill,
            training,
        };
        desc.check().map_err(|m| bad(format!("the RNN: {m}")))?;
        Ok(Problem { rd, x, desc, dt })
    }

    fn double(&self) -> bool {
        self.dt == DataType::F64
    }
    /// The reserve's and dgates' element type.
    fn scratch(&self) -> DataType {
        if self.double() {
            DataType::F64
        } else {
            DataType::F32
        }
    }
    fn weight_bytes(&self) -> usize {
        self.desc.weight_space_elements() as usize * self.dt.size()
    }
    fn reserve_bytes(&self) -> usize {
        self.desc.reserve_elements() as usize * self.scratch().size()
    }
    fn reserve_total(&self) -> usize {
        self.reserve_bytes() + self.desc.dgates_elements() as usize * self.scratch().size()
    }
    /// The graph needs the lengths (some sample is shorter than maxSeqLength).
    fn lengths(&self) -> bool {
        !self.x.full_lengths()
    }
    fn policy(&self) -> PlanPolicy {
        PlanPolicy { no_reduced_precision: self.rd.math_type == CUDNN_FMA_MATH, ..Default::default() }
    }

    /// `yDesc` must describe the output of this RNN on `xDesc`.
    fn check_y(&self, y: &RnnDataDescriptor) -> R<()> {
        let x = &self.x;
        if y.dt_raw != x.dt_raw || y.layout != x.layout || y.max_seq != x.max_seq || y.batch != x.batch || y.lens != x.lens {
            return Err(bad(format!(
                "`yDesc` (type {}, layout {}, maxSeqLength {}, batchSize {}) must match `xDesc` (type {}, layout {}, maxSeqLength {}, batchSize {}) in everything but vectorSize, lengths included",
                y.dt(),
                y.layout,
                y.max_seq,
                y.batch,
                x.dt(),
                x.layout,
                x.max_seq,
                x.batch
            )));
        }
        let want = self.desc.out_size();
        if y.vector as i64 != want {
            return Err(bad(format!("`yDesc` has vectorSize {} but this RNN's output has {want} features (directions x projSize)", y.vector)));
        }
        Ok(())
    }

    /// A state descriptor (hDesc, or cDesc with `cell`): `[layers * dirs, batch, size]`, packed,
    /// of the data type. As cuDNN, it accepts trailing dims of 1 beyond the third (PyTorch sets
    /// its states as 5-d `[layers * dirs, batch, size, 1, 1]`), and checks strides only where a
    /// dim is above 1 (a stride there addresses nothing).
    fn check_state(&self, p: cudnnTensorDescriptor_t, name: &str, cell: bool) -> R<TensorDescriptor> {
        let t = tensor(p, name)?;
        let a = &self.desc;
        let want = vec![a.pseudo_layers(), a.batch, if cell { a.hidden_size } else { a.proj() }];
        let n = want.len();
        if t.dims.len() < n || t.dims[..n] != want[..] || t.dims[n..].iter().any(|&d| d != 1) {
            return Err(bad(format!(
                "`{name}` has dims {:?} but this RNN's {} state is {want:?} ([numLayers * directions, batch, {}], trailing dims of 1 allowed)",
                t.dims,
                if cell { "cell" } else { "hidden" },
                if cell { "hiddenSize" } else { "projSize" }
            )));
        }
        let packed = ferrodnn::graph::packed_strides(&want);
        if want.iter().zip(&t.strides).zip(&packed).any(|((&d, &s), &p)| d > 1 && s != p) {
            return Err(bad(format!("`{name}` has strides {:?}; RNN states must be packed ({packed:?})", t.strides)));
        }
        if t.dt_raw != self.rd.dt_raw {
            return Err(bad(format!("`{name}` is {} but the RNN's data is {}", t.dt(), self.dt)));
        }
        Ok(t)
    }

    fn lstm(&self) -> bool {
        self.desc.cell_mode == RnnMode::Lstm
    }

    fn state_bytes(&self, cell: bool) -> usize {
        let a = &self.desc;
        (a.pseudo_layers() * a.batch * if cell { a.hidden_size } else { a.proj() }) as usize * self.dt.size()
    }
}

/// What a call connects, beyond what every call has (part of the plan key). In the backward
/// data pass `hy` and `cy` stand for its outputs `dhx` and `dcx`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Ports {
    hx: bool,
    cx: bool,
    hy: bool,
    cy: bool,
    dhy: bool,
    dcy: bool,
    dw_in: bool,
}

const X: i64 = 1;
const Y: i64 = 2;
const HX: i64 = 3;
const HY: i64 = 4;
const CX: i64 = 5;
const CY: i64 = 6;
const W: i64 = 7;
const RESERVE: i64 = 8;
const DGATES: i64 = 9;
const LENS: i64 = 10;
const SEED: i64 = 11;
const OFFSET: i64 = 12;
const DW_IN: i64 = 13;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    Fwd,
    BwdData,
    BwdWeights,
}

fn input(g: &mut Graph, name: &str, dims: &[i64], dt: DataType, uid: i64) -> TensorId {
    g.tensor(TensorDesc::new(name, dims, dt).with_uid(uid))
}

fn output(g: &mut Graph, t: TensorId, uid: i64) {
    g.set_output(t);
    g.desc_mut(t).uid = Some(uid);
}

/// The plan of one pass.
fn pass_plan(h: &HandleState, pr: &Problem, pass: Pass, ports: Ports) -> R<Arc<Plan>> {
    let lengths = pr.lengths();
    let key = format!("rnn|{pass:?}|{:?}|{}|{ports:?}|{lengths}", pr.desc, pr.dt);
    let (a, dt, st, double) = (pr.desc.clone(), pr.dt, pr.scratch(), pr.double());
    plan(h, &key, pr.policy(), move || {
        let mut g = new_graph("cudnn_rnn", double).io_data_type(dt);
        let states = |cell: bool| vec![a.pseudo_layers(), a.batch, if cell { a.hidden_size } else { a.proj() }];
        let lens = lengths.then(|| input(&mut g, "seq_lengths", &[a.batch], DataType::I32, LENS));
        let hx = ports.hx.then(|| input(&mut g, "hx", &states(false), dt, HX));
        match pass {
            Pass::Fwd => {
                let x = input(&mut g, "x", &a.seq_dims(a.input_size), dt, X);
                let w = input(&mut g, "weights", &[a.weight_space_elements()], dt, W);
                let cx = ports.cx.then(|| input(&mut g, "cx", &states(true), dt, CX));
                let (seed, offset) = if a.has_dropout() {
                    (
                        Some(g.tensor(TensorDesc::runtime_scalar("seed", DataType::I64).with_uid(SEED))),
                        Some(g.tensor(TensorDesc::runtime_scalar("offset", DataType::I64).with_uid(OFFSET))),
                    )
                } else {
                    (None, None)
                };
                let out = g.rnn(x, w, RnnInputs { hx, cx, seq_lengths: lens, seed, offset }, a.clone());
                output(&mut g, out.y, Y);
                if ports.hy {
                    output(&mut g, out.hy, HY);
                }
                if let (true, Some(cy)) = (ports.cy, out.cy) {
                    output(&mut g, cy, CY);
                }
                if let Some(r) = out.reserve {
                    output(&mut g, r, RESERVE);
                    g.desc_mut(r).data_type = Some(st);
                }
            }
            Pass::BwdData => {
                let dy = input(&mut g, "dy", &a.seq_dims(a.out_size()), dt, Y);
                let w = input(&mut g, "weights", &[a.weight_space_elements()], dt, W);
                let reserve = input(&mut g, "reserve", &[a.reserve_elements()], st, RESERVE);
                let cx = ports.cx.then(|| input(&mut g, "cx", &states(true), dt, CX));
                let dhy = ports.dhy.then(|| input(&mut g, "dhy", &states(false), dt, HY + 100));
                let dcy = ports.dcy.then(|| input(&mut g, "dcy", &states(true), dt, CY + 100));
                let out = g.rnn_backward_data(dy, w, reserve, RnnBackwardInputs { hx, cx, dhy, dcy, seq_lengths: lens }, a.clone());
                output(&mut g, out.dx, X);
                if ports.hy {
                    output(&mut g, out.dhx, HX + 100);
                }
                if let (true, Some(dcx)) = (ports.cy, out.dcx) {
                    output(&mut g, dcx, CX + 100);
                }
                output(&mut g, out.dgates, DGATES);
                g.desc_mut(out.dgates).data_type = Some(st);
            }
            Pass::BwdWeights => {
                let x = input(&mut g, "x", &a.seq_dims(a.input_size), dt, X);
                let reserve = input(&mut g, "reserve", &[a.reserve_elements()], st, RESERVE);
                let dgates = input(&mut g, "dgates", &[a.dgates_elements()], st, DGATES);
                let dw_in = ports.dw_in.then(|| input(&mut g, "dw_in", &[a.weight_space_elements()], dt, DW_IN));
                let dw = g.rnn_backward_weights(x, reserve, dgates, hx, lens, dw_in, a.clone());
                output(&mut g, dw, W);
                g.desc_mut(dw).data_type = Some(dt);
            }
        }
        Ok(g)
    })
}

/// The lengths as the graph's `seq_lengths` input: `devSeqLengths` on a GPU handle (device
/// memory, as cuDNN takes it), the data descriptor's own array on a CPU handle. Returns the
/// host copy the call must keep alive.
fn feed_lengths(h: &HandleState, pr: &Problem, dev: *const i32, call: &mut Call) -> R<Vec<i32>> {
    let host = pr.x.lens.clone();
    if !pr.lengths() {
        return Ok(host);
    }
    let bytes = host.len() * 4;
    if h.gpu {
        if dev.is_null() {
            return Err(ApiError::new(
                CUDNN_STATUS_BAD_PARAM_NULL_POINTER,
                "`devSeqLengths` is a null pointer, but the samples have different lengths and a GPU handle reads them from device memory",
            ));
        }
        call.input(LENS, dev as *const c_void, bytes, "devSeqLengths")?;
    } else {
        call.input(LENS, host.as_ptr() as *const c_void, bytes, "seqLengthArray")?;
    }
    Ok(host)
}

fn check_space(size: usize, ptr: *const c_void, need: usize, name: &str, size_name: &str, query: &str) -> R<()> {
    if size < need {
        return Err(bad(format!("{size_name} {size} is less than the {need} bytes {query} gives for this RNN")));
    }
    if need > 0 {
        non_null(ptr, name)?;
    }
    Ok(())
}

/// A sequence buffer of the call: the caller's rows, the ops' full-size tensor.
fn feed_seq(call: &mut Call, d: &RnnDataDescriptor, uid: i64, ptr: *const c_void, output: bool, name: &str) -> R<()> {
    let (bytes, full) = d.bytes();
    call.partial(uid, ptr, bytes, full, output, name)
}

/// The workspace every pass of this problem may use: the largest of their plans'.
fn temp_sizes(h: &HandleState, pr: &Problem) -> R<(usize, usize)> {
    let all = Ports { hx: true, cx: pr.lstm(), hy: true, cy: pr.lstm(), dhy: true, dcy: pr.lstm(), dw_in: true };
    let mut ws = pass_plan(h, pr, Pass::Fwd, all)?.workspace_size();
    if pr.desc.training {
        ws = ws.max(pass_plan(h, pr, Pass::BwdData, all)?.workspace_size());
        ws = ws.max(pass_plan(h, pr, Pass::BwdWeights, all)?.workspace_size());
        Ok((ws, pr.reserve_total()))
    } else {
        Ok((ws, 0))
    }
}

fn fwd_mode(mode: i32) -> R<bool> {
    match mode {
        CUDNN_FWD_MODE_INFERENCE => Ok(false),
        CUDNN_FWD_MODE_TRAINING => Ok(true),
        _ => Err(bad(format!("fwdMode {mode} is not a cudnnForwardMode_t"))),
    }
}

#[no_mangle]
pub extern "C" fn cudnnGetRNNWeightSpaceSize(h: cudnnHandle_t, p: cudnnRNNDescriptor_t, size: *mut usize) -> Status {
    guard("cudnnGetRNNWeightSpaceSize", || {
        handle(h)?;
        let rd = rnn_desc(p)?;
        // The weight space does not depend on the data: any one-step problem gives it.
        let x = RnnDataDescriptor { set: true, dt_raw: rd.dt_raw, layout: 0, max_seq: 1, batch: 1, vector: rd.input_size, lens: vec![1], fill: None };
        let pr = Problem::new(rd, x, false, 0.0)?;
        // SAFETY: the caller gives a writable size_t (null is refused).
        unsafe { write_out(size, "weightSpaceSize", pr.weight_bytes()) }
    })
}

#[no_mangle]
pub extern "C" fn cudnnGetRNNTempSpaceSizes(h: cudnnHandle_t, p: cudnnRNNDescriptor_t, mode: i32, x_desc: cudnnRNNDataDescriptor_t, ws: *mut usize, reserve: *mut usize) -> Status {
    guard("cudnnGetRNNTempSpaceSizes", || {
        let hs = handle(h)?;
        let training = fwd_mode(mode)?;
        let pr = Problem::new(rnn_desc(p)?, data_desc(x_desc, "xDesc")?, training, 0.0)?;
        let (w, r) = temp_sizes(&hs, &pr)?;
        // SAFETY: each out pointer is checked not null (cuDNN lets either be null: then it is
        // not written); the caller gives writable size_ts.
        unsafe {
            if !ws.is_null() {
                write_out(ws, "workSpaceSize", w)?;
            }
            if !reserve.is_null() {
                write_out(reserve, "reserveSpaceSize", r)?;
            }
        }
        Ok(())
    })
}

/// Sets a weight-params output descriptor to `[1, rows, cols]` (packed).
fn set_param_desc(p: cudnnTensorDescriptor_t, dt_raw: i32, rows: i64, cols: i64, name: &str) -> R<()> {
    if p.is_null() {
        return Ok(());
    }
    TENSORS
        .with(p, |t| {
            *t = TensorDescriptor { set: true, dt_raw, dims: vec![1, rows, cols], strides: vec![rows * cols, cols, 1] };
            Ok(())
        })
        .map_err(|e| ApiError::new(e.status, format!("`{name}`: {}", e.msg)))
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnGetRNNWeightParams(
    h: cudnnHandle_t,
    p: cudnnRNNDescriptor_t,
    pseudo_layer: i32,
    ws_size: usize,
    ws: *const c_void,
    lin_id: i32,
    m_desc: cudnnTensorDescriptor_t,
    m_addr: *mut *mut c_void,
    b_desc: cudnnTensorDescriptor_t,
    b_addr: *mut *mut c_void,
) -> Status {
    guard("cudnnGetRNNWeightParams", || {
        handle(h)?;
        let rd = rnn_desc(p)?;
        let x = RnnDataDescriptor { set: true, dt_raw: rd.dt_raw, layout: 0, max_seq: 1, batch: 1, vector: rd.input_size, lens: vec![1], fill: None };
        let pr = Problem::new(rd, x, false, 0.0)?;
        let a = &pr.desc;
        if ws_size < pr.weight_bytes() {
            return Err(bad(format!("weightSpaceSize {ws_size} is less than the {} bytes cudnnGetRNNWeightSpaceSize gives", pr.weight_bytes())));
        }
        let wp = a
            .weight_params(pseudo_layer as i64, lin_id as i64)
            .ok_or_else(|| bad(format!("pseudoLayer {pseudo_layer} must be in [0, {}) and linLayerID {lin_id} in [0, {}) for this RNN", a.pseudo_layers(), a.lin_layers())))?;
        let size = pr.dt.size();
        let base = ws as usize;
        set_param_desc(m_desc, pr.rd.dt_raw, wp.rows, wp.cols, "mDesc")?;
        // SAFETY: each out pointer is written only when not null; the caller gives writable
        // pointer slots.
        unsafe {
            if !m_addr.is_null() {
                write_out(m_addr, "mAddr", (base + wp.matrix_offset as usize * size) as *mut c_void)?;
            }
        }
        if wp.bias_len > 0 {
            set_param_desc(b_desc, pr.rd.dt_raw, wp.bias_len, 1, "bDesc")?;
        } else if !b_desc.is_null() {
            // No bias for this matrix (bias mode, or the projection): cuDNN gives a null address
            // and a descriptor of no elements.
            TENSORS
                .with(b_desc, |t| {
                    *t = TensorDescriptor { set: false, dt_raw: pr.rd.dt_raw, dims: vec![], strides: vec![] };
                    Ok(())
                })
                .map_err(|e| ApiError::new(e.status, format!("`bDesc`: {}", e.msg)))?;
        }
        // SAFETY: as above.
        unsafe {
            if !b_addr.is_null() {
                let addr = if wp.bias_len > 0 { (base + wp.bias_offset as usize * size) as *mut c_void } else { std::ptr::null_mut() };
                write_out(b_addr, "bAddr", addr)?;
            }
        }
        Ok(())
    })
}

/// The common checks of the three passes: handle, descriptors, the weight space, the workspace
/// (at least the plan's) and, in training, the reserve space.
struct Setup {
    h: Arc<HandleState>,
    pr: Problem,
}

/// The padding of `y` is yDesc's paddingFill, that of `dx` (`fill_dx`) xDesc's.
fn setup(h: cudnnHandle_t, p: cudnnRNNDescriptor_t, x_desc: cudnnRNNDataDescriptor_t, y_desc: cudnnRNNDataDescriptor_t, training: bool, fill_dx: bool) -> R<Setup> {
    let h = handle(h)?;
    let y = data_desc(y_desc, "yDesc")?;
    let x = data_desc(x_desc, "xDesc")?;
    let fill = if fill_dx { x.fill } else { y.fill };
    let pr = Problem::new(rnn_desc(p)?, x, training, fill.unwrap_or(0.0))?;
    pr.check_y(&y)?;
    Ok(Setup { h, pr })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnRNNForward(
    h: cudnnHandle_t,
    p: cudnnRNNDescriptor_t,
    mode: i32,
    dev_lens: *const i32,
    x_desc: cudnnRNNDataDescriptor_t,
    x: *const c_void,
    y_desc: cudnnRNNDataDescriptor_t,
    y: *mut c_void,
    h_desc: cudnnTensorDescriptor_t,
    hx: *const c_void,
    hy: *mut c_void,
    c_desc: cudnnTensorDescriptor_t,
    cx: *const c_void,
    cy: *mut c_void,
    w_size: usize,
    w: *const c_void,
    ws_size: usize,
    ws: *mut c_void,
    reserve_size: usize,
    reserve: *mut c_void,
) -> Status {
    guard("cudnnRNNForward", || {
        let training = fwd_mode(mode)?;
        let Setup { h, pr } = setup(h, p, x_desc, y_desc, training, false)?;
        pr.check_state(h_desc, "hDesc", false)?;
        let lstm = pr.lstm();
        if lstm {
            pr.check_state(c_desc, "cDesc", true)?;
        }
        non_null(x, "x")?;
        non_null(y, "y")?;
        check_space(w_size, w, pr.weight_bytes(), "weightSpace", "weightSpaceSize", "cudnnGetRNNWeightSpaceSize")?;
        if training {
            check_space(reserve_size, reserve, pr.reserve_total(), "reserveSpace", "reserveSpaceSize", "cudnnGetRNNTempSpaceSizes")?;
        }
        let ports = Ports { hx: !hx.is_null(), cx: lstm && !cx.is_null(), hy: !hy.is_null(), cy: lstm && !cy.is_null(), ..Default::default() };
        let plan = pass_plan(&h, &pr, Pass::Fwd, ports)?;
        check_space(ws_size, ws, plan.workspace_size(), "workSpace", "workSpaceSize", "cudnnGetRNNTempSpaceSizes")?;
        let mut call = Call { workspace: (ws as usize, ws_size), ..Default::default() };
        let _lens = feed_lengths(&h, &pr, dev_lens, &mut call)?;
        feed_seq(&mut call, &pr.x, X, x, false, "x")?;
        let yd = data_desc(y_desc, "yDesc")?;
        feed_seq(&mut call, &yd, Y, y, true, "y")?;
        call.input(W, w, pr.weight_bytes(), "weightSpace")?;
        for (on, uid, ptr, cell, name) in [(ports.hx, HX, hx, false, "hx"), (ports.cx, CX, cx, true, "cx")] {
            if on {
                call.input(uid, ptr, pr.state_bytes(cell), name)?;
            }
        }
        for (on, uid, ptr, cell, name) in [(ports.hy, HY, hy, false, "hy"), (ports.cy, CY, cy, true, "cy")] {
            if on {
                call.output(uid, ptr, pr.state_bytes(cell), name)?;
            }
        }
        if training {
            call.output(RESERVE, reserve, pr.reserve_bytes(), "reserveSpace")?;
        }
        if pr.desc.has_dropout() {
            let (seed, offset) = draw(pr.rd.dropout as cudnnDropoutDescriptor_t)?;
            call.scalars.push((SEED, (seed as i64).to_ne_bytes().to_vec()));
            call.scalars.push((OFFSET, (offset as i64).to_ne_bytes().to_vec()));
        }
        execute(&h, &plan, &call)
    })
}

/// The dgates half of the reserve space.
fn dgates_ptr(pr: &Problem, reserve: *mut c_void) -> *mut c_void {
    (reserve as usize + pr.reserve_bytes()) as *mut c_void
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnRNNBackwardData_v8(
    h: cudnnHandle_t,
    p: cudnnRNNDescriptor_t,
    dev_lens: *const i32,
    y_desc: cudnnRNNDataDescriptor_t,
    y: *const c_void,
    dy: *const c_void,
    x_desc: cudnnRNNDataDescriptor_t,
    dx: *mut c_void,
    h_desc: cudnnTensorDescriptor_t,
    hx: *const c_void,
    dhy: *const c_void,
    dhx: *mut c_void,
    c_desc: cudnnTensorDescriptor_t,
    cx: *const c_void,
    dcy: *const c_void,
    dcx: *mut c_void,
    w_size: usize,
    w: *const c_void,
    ws_size: usize,
    ws: *mut c_void,
    reserve_size: usize,
    reserve: *mut c_void,
) -> Status {
    guard("cudnnRNNBackwardData_v8", || {
        let Setup { h, pr } = setup(h, p, x_desc, y_desc, true, true)?;
        pr.check_state(h_desc, "hDesc", false)?;
        let lstm = pr.lstm();
        if lstm {
            pr.check_state(c_desc, "cDesc", true)?;
        }
        non_null(y, "y")?;
        non_null(dy, "dy")?;
        non_null(dx, "dx")?;
        check_space(w_size, w, pr.weight_bytes(), "weightSpace", "weightSpaceSize", "cudnnGetRNNWeightSpaceSize")?;
        check_space(reserve_size, reserve, pr.reserve_total(), "reserveSpace", "reserveSpaceSize", "cudnnGetRNNTempSpaceSizes")?;
        let ports =
            Ports { hx: !hx.is_null(), cx: lstm && !cx.is_null(), hy: !dhx.is_null(), cy: lstm && !dcx.is_null(), dhy: !dhy.is_null(), dcy: lstm && !dcy.is_null(), dw_in: false };
        let plan = pass_plan(&h, &pr, Pass::BwdData, ports)?;
        check_space(ws_size, ws, plan.workspace_size(), "workSpace", "workSpaceSize", "cudnnGetRNNTempSpaceSizes")?;
        let mut call = Call { workspace: (ws as usize, ws_size), ..Default::default() };
        let _lens = feed_lengths(&h, &pr, dev_lens, &mut call)?;
        let yd = data_desc(y_desc, "yDesc")?;
        feed_seq(&mut call, &yd, Y, dy, false, "dy")?;
        feed_seq(&mut call, &pr.x, X, dx, true, "dx")?;
        call.input(W, w, pr.weight_bytes(), "weightSpace")?;
        call.input(RESERVE, reserve, pr.reserve_bytes(), "reserveSpace")?;
        call.output(DGATES, dgates_ptr(&pr, reserve), pr.reserve_total() - pr.reserve_bytes(), "reserveSpace")?;
        for (on, uid, ptr, cell, name) in
            [(ports.hx, HX, hx, false, "hx"), (ports.cx, CX, cx, true, "cx"), (ports.dhy, HY + 100, dhy, false, "dhy"), (ports.dcy, CY + 100, dcy, true, "dcy")]
        {
            if on {
                call.input(uid, ptr, pr.state_bytes(cell), name)?;
            }
        }
        for (on, uid, ptr, cell, name) in [(ports.hy, HX + 100, dhx, false, "dhx"), (ports.cy, CX + 100, dcx, true, "dcx")] {
            if on {
                call.output(uid, ptr, pr.state_bytes(cell), name)?;
            }
        }
        execute(&h, &plan, &call)
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnRNNBackwardWeights_v8(
    h: cudnnHandle_t,
    p: cudnnRNNDescriptor_t,
    add_grad: i32,
    dev_lens: *const i32,
    x_desc: cudnnRNNDataDescriptor_t,
    x: *const c_void,
    h_desc: cudnnTensorDescriptor_t,
    hx: *const c_void,
    y_desc: cudnnRNNDataDescriptor_t,
    y: *const c_void,
    dw_size: usize,
    dw: *mut c_void,
    ws_size: usize,
    ws: *mut c_void,
    reserve_size: usize,
    reserve: *mut c_void,
) -> Status {
    guard("cudnnRNNBackwardWeights_v8", || {
        let add = match add_grad {
            CUDNN_WGRAD_MODE_ADD => true,
            CUDNN_WGRAD_MODE_SET => false,
            _ => return Err(bad(format!("addGrad {add_grad} is not a cudnnWgradMode_t"))),
        };
        let Setup { h, pr } = setup(h, p, x_desc, y_desc, true, false)?;
        pr.check_state(h_desc, "hDesc", false)?;
        non_null(x, "x")?;
        non_null(y, "y")?;
        check_space(dw_size, dw, pr.weight_bytes(), "dweightSpace", "weightSpaceSize", "cudnnGetRNNWeightSpaceSize")?;
        check_space(reserve_size, reserve, pr.reserve_total(), "reserveSpace", "reserveSpaceSize", "cudnnGetRNNTempSpaceSizes")?;
        let ports = Ports { hx: !hx.is_null(), dw_in: add, ..Default::default() };
        let plan = pass_plan(&h, &pr, Pass::BwdWeights, ports)?;
        check_space(ws_size, ws, plan.workspace_size(), "workSpace", "workSpaceSize", "cudnnGetRNNTempSpaceSizes")?;
        let mut call = Call { workspace: (ws as usize, ws_size), ..Default::default() };
        let _lens = feed_lengths(&h, &pr, dev_lens, &mut call)?;
        feed_seq(&mut call, &pr.x, X, x, false, "x")?;
        call.input(RESERVE, reserve, pr.reserve_bytes(), "reserveSpace")?;
        call.input(DGATES, dgates_ptr(&pr, reserve), pr.reserve_total() - pr.reserve_bytes(), "reserveSpace")?;
        if ports.hx {
            call.input(HX, hx, pr.state_bytes(false), "hx")?;
        }
        if add {
            // Read from a copy: it is the memory the plan writes.
            call.input(DW_IN, dw, pr.weight_bytes(), "dweightSpace")?;
        }
        call.output(W, dw, pr.weight_bytes(), "dweightSpace")?;
        execute(&h, &plan, &call)
    })
}
