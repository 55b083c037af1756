//! Handles, versions, error strings, the status codes of bad calls (null pointers, dead or
//! wrong-kind descriptors, unset descriptors, bad enums, inconsistent shapes), and our enum
//! values and structs against NVIDIA's cudnn.h where it is installed.

mod common;
use common::*;
use ferrodnn_cudnn::conv::*;
use ferrodnn_cudnn::desc::*;
use ferrodnn_cudnn::handle::*;
use ferrodnn_cudnn::ops::*;
use ferrodnn_cudnn::types::*;
use std::ffi::{c_char, c_void, CStr};
use std::ptr::{null, null_mut};

#[test]
fn versions_and_properties() {
    let v = cudnnGetVersion();
    assert!((90000..100000).contains(&v), "a cuDNN 9 version: {v}");
    let (mut major, mut minor, mut patch) = (0, 0, 0);
    ok(cudnnGetProperty(MAJOR_VERSION, &mut major));
    ok(cudnnGetProperty(MINOR_VERSION, &mut minor));
    ok(cudnnGetProperty(PATCH_LEVEL, &mut patch));
    assert_eq!((major * 10000 + minor * 100 + patch) as usize, v);
    fails(cudnnGetProperty(7, &mut major), CUDNN_STATUS_BAD_PARAM, &["cudnnGetProperty", "type 7"]);
    fails(cudnnGetProperty(MAJOR_VERSION, null_mut()), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["value"]);
    // SAFETY: a static NUL-terminated string.
    let s = unsafe { CStr::from_ptr(ferrodnnGetVersionString()) }.to_str().unwrap().to_string();
    assert!(s.starts_with("ferrodnn "), "{s}");
    assert_eq!(ferrodnnGetVersion(), 100, "ferrodnn 0.1.0");
    assert_eq!((cudnnGraphVersionCheck(), cudnnOpsVersionCheck(), cudnnCnnVersionCheck()), (0, 0, 0));
    assert!(cudnnGetMaxDeviceVersion() >= 900, "at least Hopper");
    // The driver's CUDA version where there is one (0 without).
    let cuda = cudnnGetCudartVersion();
    assert_eq!(cuda == 0, ferrodnn::engine::cuda::driver_version().is_err(), "{cuda}");
    let h = Handle::cpu();
    let mut rs = -1;
    ok(cudnnQueryRuntimeError(h.0, &mut rs, CUDNN_ERRQUERY_BLOCKING, null_mut()));
    assert_eq!(rs, CUDNN_STATUS_SUCCESS);
    fails(cudnnQueryRuntimeError(h.0, &mut rs, 3, null_mut()), CUDNN_STATUS_BAD_PARAM, &["mode 3"]);
    fails(cudnnQueryRuntimeError(h.0, null_mut(), CUDNN_ERRQUERY_RAWCODE, null_mut()), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["rstatus"]);
}

#[test]
fn error_strings() {
    // SAFETY: static NUL-terminated strings.
    let name = |s| unsafe { CStr::from_ptr(cudnnGetErrorString(s)) }.to_str().unwrap().to_string();
    assert_eq!(name(CUDNN_STATUS_SUCCESS), "CUDNN_STATUS_SUCCESS");
    assert_eq!(name(CUDNN_STATUS_BAD_PARAM), "CUDNN_STATUS_BAD_PARAM");
    assert_eq!(name(CUDNN_STATUS_NOT_SUPPORTED), "CUDNN_STATUS_NOT_SUPPORTED");
    assert_eq!(name(12345), "CUDNN_STATUS_UNKNOWN");
    // The last error names the function, and is cut to the buffer given.
    let mut t = null_mut();
    ok(cudnnCreateTensorDescriptor(&mut t));
    assert_eq!(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, -2, 3, 4), CUDNN_STATUS_BAD_PARAM);
    let mut buf = [0 as c_char; 256];
    cudnnGetLastErrorString(buf.as_mut_ptr(), buf.len());
    // SAFETY: the library NUL-terminates within the buffer.
    let msg = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap().to_string();
    assert!(msg.contains("cudnnSetTensor4dDescriptor") && msg.contains("-2"), "{msg}");
    let mut small = [1 as c_char; 8];
    cudnnGetLastErrorString(small.as_mut_ptr(), small.len());
    assert_eq!(small[7], 0, "NUL-terminated within max_size");
    cudnnGetLastErrorString(null_mut(), 10);
    ok(cudnnDestroyTensorDescriptor(t));
}

#[test]
fn handles_and_streams() {
    let h = Handle::cpu();
    let mut gpu = -1;
    ok(ferrodnnHandleIsGpu(h.0, &mut gpu));
    assert_eq!(gpu, 0);
    // A CPU handle keeps the stream it is given (and enqueues nothing on it).
    let fake = 0x1234usize as cudaStream_t;
    ok(cudnnSetStream(h.0, fake));
    let mut s = null_mut();
    ok(cudnnGetStream(h.0, &mut s));
    assert_eq!(s, fake);
    fails(cudnnCreate(null_mut()), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["cudnnCreate", "handle"]);
    fails(cudnnSetStream(null_mut(), null_mut()), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["cudnnHandle_t"]);
    fails(cudnnGetStream(h.0, null_mut()), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["streamId"]);
    // A destroyed handle, and a descriptor passed as a handle, are refused without a crash.
    let mut dead = null_mut();
    ok(ferrodnnCreateCpu(&mut dead));
    ok(cudnnDestroy(dead));
    fails(cudnnDestroy(dead), CUDNN_STATUS_BAD_PARAM, &["not a live cudnnHandle_t"]);
    let mut t = null_mut();
    ok(cudnnCreateTensorDescriptor(&mut t));
    fails(cudnnSetStream(t, null_mut()), CUDNN_STATUS_BAD_PARAM, &["not a live cudnnHandle_t"]);
    ok(cudnnDestroyTensorDescriptor(t));
}

#[test]
fn bad_descriptors_are_refused() {
    let mut t = null_mut();
    ok(cudnnCreateTensorDescriptor(&mut t));
    fails(cudnnSetTensor4dDescriptor(t, 9, CUDNN_DATA_FLOAT, 1, 2, 3, 4), CUDNN_STATUS_BAD_PARAM, &["format 9"]);
    fails(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW_VECT_C, CUDNN_DATA_INT8, 1, 4, 3, 4), CUDNN_STATUS_NOT_SUPPORTED, &["NCHW_VECT_C"]);
    fails(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, 99, 1, 2, 3, 4), CUDNN_STATUS_BAD_PARAM, &["dataType 99"]);
    fails(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_INT8x4, 1, 4, 3, 4), CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, &["data type 5"]);
    fails(cudnnSetTensor4dDescriptorEx(t, CUDNN_DATA_FLOAT, 1, 2, 3, 4, 24, -12, 4, 1), CUDNN_STATUS_BAD_PARAM, &["non-negative", "-12"]);
    fails(cudnnSetTensorNdDescriptor(t, CUDNN_DATA_FLOAT, 9, [1; 9].as_ptr(), [1; 9].as_ptr()), CUDNN_STATUS_NOT_SUPPORTED, &["nbDims 9"]);
    fails(cudnnSetTensorNdDescriptor(t, CUDNN_DATA_FLOAT, 2, [1; 2].as_ptr(), [1; 2].as_ptr()), CUDNN_STATUS_NOT_SUPPORTED, &["nbDims 2"]);
    fails(cudnnSetTensorNdDescriptor(t, CUDNN_DATA_FLOAT, 3, null(), [1; 3].as_ptr()), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["dimA"]);
    fails(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1 << 20, 1 << 20, 1 << 20, 2), CUDNN_STATUS_NOT_SUPPORTED_SHAPE, &["2^48"]);
    // Unset, destroyed, and of another kind.
    let mut size = 0usize;
    fails(cudnnGetTensorSizeInBytes(t, &mut size), CUDNN_STATUS_BAD_PARAM, &["never set"]);
    let mut f = null_mut();
    ok(cudnnCreateFilterDescriptor(&mut f));
    fails(cudnnGetTensorSizeInBytes(f, &mut size), CUDNN_STATUS_BAD_PARAM, &["not a live cudnnTensorDescriptor_t"]);
    fails(cudnnSetFilter4dDescriptor(f, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 0, 3, 3, 3), CUDNN_STATUS_BAD_PARAM, &["positive"]);
    ok(cudnnDestroyTensorDescriptor(t));
    fails(cudnnGetTensorSizeInBytes(t, &mut size), CUDNN_STATUS_BAD_PARAM, &["not a live"]);
    // Destroying null is a no-op, as in cuDNN.
    ok(cudnnDestroyTensorDescriptor(null_mut()));
    let mut c = null_mut();
    ok(cudnnCreateConvolutionDescriptor(&mut c));
    fails(cudnnSetConvolution2dDescriptor(c, -1, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT), CUDNN_STATUS_BAD_PARAM, &["padding"]);
    fails(cudnnSetConvolution2dDescriptor(c, 0, 0, 0, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT), CUDNN_STATUS_BAD_PARAM, &["strides"]);
    fails(cudnnSetConvolution2dDescriptor(c, 0, 0, 1, 1, 1, 1, 5, CUDNN_DATA_FLOAT), CUDNN_STATUS_BAD_PARAM, &["mode 5"]);
    fails(cudnnSetConvolutionGroupCount(c, 0), CUDNN_STATUS_BAD_PARAM, &["groupCount"]);
    fails(cudnnSetConvolutionMathType(c, 9), CUDNN_STATUS_BAD_PARAM, &["mathType 9"]);
    let mut a = null_mut();
    ok(cudnnCreateActivationDescriptor(&mut a));
    fails(cudnnSetActivationDescriptor(a, 42, CUDNN_NOT_PROPAGATE_NAN, 0.0), CUDNN_STATUS_BAD_PARAM, &["mode 42"]);
    fails(cudnnSetActivationDescriptor(a, CUDNN_ACTIVATION_ELU, CUDNN_NOT_PROPAGATE_NAN, f64::NAN), CUDNN_STATUS_BAD_PARAM, &["coef"]);
    let mut pd = null_mut();
    ok(cudnnCreatePoolingDescriptor(&mut pd));
    fails(cudnnSetPooling2dDescriptor(pd, CUDNN_POOLING_MAX, CUDNN_NOT_PROPAGATE_NAN, 0, 2, 0, 0, 1, 1), CUDNN_STATUS_BAD_PARAM, &["window"]);
    fails(cudnnSetPooling2dDescriptor(pd, 11, CUDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 1, 1), CUDNN_STATUS_BAD_PARAM, &["mode 11"]);
    let mut rd = null_mut();
    ok(cudnnCreateReduceTensorDescriptor(&mut rd));
    fails(cudnnSetReduceTensorDescriptor(rd, 12, CUDNN_DATA_FLOAT, 0, 0, 0), CUDNN_STATUS_BAD_PARAM, &["reduceTensorOp 12"]);
    ok(cudnnDestroyFilterDescriptor(f));
    ok(cudnnDestroyConvolutionDescriptor(c));
    ok(cudnnDestroyActivationDescriptor(a));
    ok(cudnnDestroyPoolingDescriptor(pd));
    ok(cudnnDestroyReduceTensorDescriptor(rd));
}

#[test]
fn bad_calls_are_refused() {
    let h = Handle::cpu();
    let x = f32_tensor(&[2, 4, 5, 5], false);
    let w = fdesc(&[6, 2, 3, 3], false);
    let y = f32_tensor(&[2, 6, 3, 3], false);
    let mut c = null_mut();
    ok(cudnnCreateConvolutionDescriptor(&mut c));
    ok(cudnnSetConvolution2dDescriptor(c, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    let xs = rand(200, 1);
    let ws = rand(108, 2);
    let mut ys = vec![0f32; 108];
    let (one, zero) = (1.0f32, 0.0f32);
    let fwd =
        |c, y, yp: *mut c_void, alpha: *const c_void, xp: *const c_void, algo| cudnnConvolutionForward(h.0, alpha, x, xp, w, p(&ws), c, algo, null_mut(), 0, sc(&zero), y, yp);
    // The filter takes 2 channels of 4: that is 2 groups, but the descriptor says 1.
    fails(fwd(c, y, pm(&mut ys), sc(&one), p(&xs), 0), CUDNN_STATUS_BAD_PARAM, &["cudnnConvolutionForward", "group count"]);
    ok(cudnnSetConvolutionGroupCount(c, 2));
    ok(fwd(c, y, pm(&mut ys), sc(&one), p(&xs), 0));
    let wrong_y = f32_tensor(&[2, 6, 4, 4], false);
    fails(fwd(c, wrong_y, pm(&mut ys), sc(&one), p(&xs), 0), CUDNN_STATUS_BAD_PARAM, &["[2, 6, 4, 4]", "[2, 6, 3, 3]"]);
    fails(fwd(c, y, pm(&mut ys), null(), p(&xs), 0), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["alpha"]);
    fails(fwd(c, y, pm(&mut ys), sc(&one), null(), 0), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["`x`"]);
    fails(fwd(c, y, null_mut(), sc(&one), p(&xs), 0), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["`y`"]);
    fails(fwd(c, y, pm(&mut ys), sc(&one), p(&xs), 99), CUDNN_STATUS_NOT_SUPPORTED, &["algo 99"]);
    let mut unset = null_mut();
    ok(cudnnCreateConvolutionDescriptor(&mut unset));
    fails(fwd(unset, y, pm(&mut ys), sc(&one), p(&xs), 0), CUDNN_STATUS_BAD_PARAM, &["convDesc", "never set"]);
    fails(fwd(null_mut(), y, pm(&mut ys), sc(&one), p(&xs), 0), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["convDesc"]);
    // Shapes that do not match.
    let mut a = null_mut();
    ok(cudnnCreateActivationDescriptor(&mut a));
    ok(cudnnSetActivationDescriptor(a, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
    fails(cudnnActivationForward(h.0, a, sc(&one), x, p(&xs), sc(&zero), y, pm(&mut ys)), CUDNN_STATUS_BAD_PARAM, &["cudnnActivationForward", "xDesc", "yDesc"]);
    fails(cudnnSoftmaxForward(h.0, 9, CUDNN_SOFTMAX_MODE_CHANNEL, sc(&one), y, p(&ys), sc(&zero), y, pm(&mut ys)), CUDNN_STATUS_BAD_PARAM, &["algorithm 9"]);
    fails(cudnnSoftmaxForward(h.0, CUDNN_SOFTMAX_FAST, 4, sc(&one), y, p(&ys), sc(&zero), y, pm(&mut ys)), CUDNN_STATUS_BAD_PARAM, &["mode 4"]);
    let bias = f32_tensor(&[1, 5, 1, 1], false);
    fails(cudnnAddTensor(h.0, sc(&one), bias, p(&xs), sc(&one), y, pm(&mut ys)), CUDNN_STATUS_BAD_PARAM, &["do not broadcast"]);
    // Reductions with indices: 16-bit ones are not supported, too small an index buffer is refused.
    let mut rd = null_mut();
    ok(cudnnCreateReduceTensorDescriptor(&mut rd));
    ok(cudnnSetReduceTensorDescriptor(rd, CUDNN_REDUCE_TENSOR_MAX, CUDNN_DATA_FLOAT, 0, CUDNN_REDUCE_TENSOR_FLATTENED_INDICES, CUDNN_16BIT_INDICES));
    let small = f32_tensor(&[1, 6, 1, 1], false);
    let mut out = vec![0f32; 6];
    let mut idx = vec![0u32; 6];
    let reduce = |out: &mut Vec<f32>, idx: &mut Vec<u32>, bytes| {
        cudnnReduceTensor(h.0, rd, idx.as_mut_ptr() as *mut c_void, bytes, null_mut(), 0, sc(&one), y, p(&ys), sc(&zero), small, pm(out))
    };
    fails(reduce(&mut out, &mut idx, 24), CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, &["16-bit"]);
    ok(cudnnSetReduceTensorDescriptor(rd, CUDNN_REDUCE_TENSOR_MAX, CUDNN_DATA_FLOAT, 0, CUDNN_REDUCE_TENSOR_FLATTENED_INDICES, CUDNN_32BIT_INDICES));
    fails(reduce(&mut out, &mut idx, 20), CUDNN_STATUS_BAD_PARAM, &["indicesSizeInBytes is 20", "need 24"]);
    ok(reduce(&mut out, &mut idx, 24));
    let mut is = 0usize;
    ok(cudnnGetReductionIndicesSize(h.0, rd, y, small, &mut is));
    assert_eq!(is, 24);
    fails(cudnnGetReductionIndicesSize(h.0, rd, y, bias, &mut is), CUDNN_STATUS_BAD_PARAM, &["cDesc"]);
    let mut od = null_mut();
    ok(cudnnCreateOpTensorDescriptor(&mut od));
    fails(cudnnOpTensor(h.0, od, sc(&one), y, p(&ys), sc(&one), y, p(&ys), sc(&zero), y, pm(&mut ys)), CUDNN_STATUS_BAD_PARAM, &["never set"]);
    for t in [x, y, wrong_y, bias, small] {
        ok(cudnnDestroyTensorDescriptor(t));
    }
    ok(cudnnDestroyFilterDescriptor(w));
    ok(cudnnDestroyConvolutionDescriptor(c));
    ok(cudnnDestroyConvolutionDescriptor(unset));
    ok(cudnnDestroyActivationDescriptor(a));
    ok(cudnnDestroyReduceTensorDescriptor(rd));
    ok(cudnnDestroyOpTensorDescriptor(od));
}

/// NVIDIA's cudnn.h, where this machine has it: `FERRODNN_CUDNN_INCLUDE`, else the pip wheel's
/// folder in the benchmark environment.
fn nvidia_include() -> Option<std::path::PathBuf> {
    let candidates = [std::env::var("FERRODNN_CUDNN_INCLUDE").ok(), Some("/work/benchenv/venv/lib/python3.11/site-packages/nvidia/cudnn/include".into())];
    candidates.into_iter().flatten().map(std::path::PathBuf::from).find(|p| p.join("cudnn.h").exists())
}

/// Our enum values, status codes and the perf struct's layout, static-asserted by a C compiler
/// against NVIDIA's header. Skipped (with a note) where the header is not installed, as in CI.
#[test]
fn values_match_nvidia_header() {
    let Some(include) = nvidia_include() else {
        eprintln!("skipped: NVIDIA's cudnn.h not found (set FERRODNN_CUDNN_INCLUDE to its folder)");
        return;
    };
    let consts: &[(&str, i32)] = &[
        ("CUDNN_STATUS_SUCCESS", CUDNN_STATUS_SUCCESS),
        ("CUDNN_STATUS_NOT_INITIALIZED", CUDNN_STATUS_NOT_INITIALIZED),
        ("CUDNN_STATUS_BAD_PARAM", CUDNN_STATUS_BAD_PARAM),
        ("CUDNN_STATUS_BAD_PARAM_NULL_POINTER", CUDNN_STATUS_BAD_PARAM_NULL_POINTER),
        ("CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH", CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH),
        ("CUDNN_STATUS_NOT_SUPPORTED", CUDNN_STATUS_NOT_SUPPORTED),
        ("CUDNN_STATUS_NOT_SUPPORTED_SHAPE", CUDNN_STATUS_NOT_SUPPORTED_SHAPE),
        ("CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE", CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE),
        ("CUDNN_STATUS_INTERNAL_ERROR", CUDNN_STATUS_INTERNAL_ERROR),
        ("CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED", CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED),
        ("CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED", CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED),
        ("CUDNN_STATUS_EXECUTION_FAILED", CUDNN_STATUS_EXECUTION_FAILED),
        ("CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER", CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER),
        ("CUDNN_DATA_FLOAT", CUDNN_DATA_FLOAT),
        ("CUDNN_FWD_MODE_INFERENCE", ferrodnn_cudnn::rnn::CUDNN_FWD_MODE_INFERENCE),
        ("CUDNN_FWD_MODE_TRAINING", ferrodnn_cudnn::rnn::CUDNN_FWD_MODE_TRAINING),
        ("CUDNN_RNN_RELU", ferrodnn_cudnn::rnn::CUDNN_RNN_RELU),
        ("CUDNN_RNN_TANH", ferrodnn_cudnn::rnn::CUDNN_RNN_TANH),
        ("CUDNN_LSTM", ferrodnn_cudnn::rnn::CUDNN_LSTM),
        ("CUDNN_GRU", ferrodnn_cudnn::rnn::CUDNN_GRU),
        ("CUDNN_RNN_NO_BIAS", ferrodnn_cudnn::rnn::CUDNN_RNN_NO_BIAS),
        ("CUDNN_RNN_SINGLE_INP_BIAS", ferrodnn_cudnn::rnn::CUDNN_RNN_SINGLE_INP_BIAS),
        ("CUDNN_RNN_DOUBLE_BIAS", ferrodnn_cudnn::rnn::CUDNN_RNN_DOUBLE_BIAS),
        ("CUDNN_RNN_SINGLE_REC_BIAS", ferrodnn_cudnn::rnn::CUDNN_RNN_SINGLE_REC_BIAS),
        ("CUDNN_UNIDIRECTIONAL", ferrodnn_cudnn::rnn::CUDNN_UNIDIRECTIONAL),
        ("CUDNN_BIDIRECTIONAL", ferrodnn_cudnn::rnn::CUDNN_BIDIRECTIONAL),
        ("CUDNN_LINEAR_INPUT", ferrodnn_cudnn::rnn::CUDNN_LINEAR_INPUT),
        ("CUDNN_SKIP_INPUT", ferrodnn_cudnn::rnn::CUDNN_SKIP_INPUT),
        ("CUDNN_RNN_CLIP_NONE", ferrodnn_cudnn::rnn::CUDNN_RNN_CLIP_NONE),
        ("CUDNN_RNN_CLIP_MINMAX", ferrodnn_cudnn::rnn::CUDNN_RNN_CLIP_MINMAX),
        ("CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED", ferrodnn_cudnn::rnn::CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED),
        ("CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED", ferrodnn_cudnn::rnn::CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED),
        ("CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED", ferrodnn_cudnn::rnn::CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED),
        ("CUDNN_WGRAD_MODE_ADD", ferrodnn_cudnn::rnn::CUDNN_WGRAD_MODE_ADD),
        ("CUDNN_WGRAD_MODE_SET", ferrodnn_cudnn::rnn::CUDNN_WGRAD_MODE_SET),
        ("CUDNN_RNN_ALGO_COUNT", ferrodnn_cudnn::rnn::CUDNN_RNN_ALGO_COUNT),
        ("CUDNN_RNN_PADDED_IO_ENABLED", ferrodnn_cudnn::rnn::CUDNN_RNN_PADDED_IO_ENABLED as i32),
        ("CUDNN_DATA_DOUBLE", CUDNN_DATA_DOUBLE),
        ("CUDNN_DATA_HALF", CUDNN_DATA_HALF),
        ("CUDNN_DATA_INT8", CUDNN_DATA_INT8),
        ("CUDNN_DATA_INT32", CUDNN_DATA_INT32),
        ("CUDNN_DATA_INT8x4", CUDNN_DATA_INT8x4),
        ("CUDNN_DATA_UINT8", CUDNN_DATA_UINT8),
        ("CUDNN_DATA_UINT8x4", CUDNN_DATA_UINT8x4),
        ("CUDNN_DATA_INT8x32", CUDNN_DATA_INT8x32),
        ("CUDNN_DATA_BFLOAT16", CUDNN_DATA_BFLOAT16),
        ("CUDNN_DATA_INT64", CUDNN_DATA_INT64),
        ("CUDNN_DATA_BOOLEAN", CUDNN_DATA_BOOLEAN),
        ("CUDNN_DATA_FP8_E4M3", CUDNN_DATA_FP8_E4M3),
        ("CUDNN_DATA_FP8_E5M2", CUDNN_DATA_FP8_E5M2),
        ("CUDNN_TENSOR_NCHW", CUDNN_TENSOR_NCHW),
        ("CUDNN_TENSOR_NHWC", CUDNN_TENSOR_NHWC),
        ("CUDNN_TENSOR_NCHW_VECT_C", CUDNN_TENSOR_NCHW_VECT_C),
        ("CUDNN_NOT_PROPAGATE_NAN", CUDNN_NOT_PROPAGATE_NAN),
        ("CUDNN_PROPAGATE_NAN", CUDNN_PROPAGATE_NAN),
        ("CUDNN_DEFAULT_MATH", CUDNN_DEFAULT_MATH),
        ("CUDNN_TENSOR_OP_MATH", CUDNN_TENSOR_OP_MATH),
        ("CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION", CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION),
        ("CUDNN_FMA_MATH", CUDNN_FMA_MATH),
        ("CUDNN_CONVOLUTION", CUDNN_CONVOLUTION),
        ("CUDNN_CROSS_CORRELATION", CUDNN_CROSS_CORRELATION),
        ("CUDNN_DEFAULT_REORDER", CUDNN_DEFAULT_REORDER),
        ("CUDNN_NO_REORDER", CUDNN_NO_REORDER),
        ("CUDNN_NON_DETERMINISTIC", CUDNN_NON_DETERMINISTIC),
        ("CUDNN_DETERMINISTIC", CUDNN_DETERMINISTIC),
        ("CUDNN_ACTIVATION_SIGMOID", CUDNN_ACTIVATION_SIGMOID),
        ("CUDNN_ACTIVATION_RELU", CUDNN_ACTIVATION_RELU),
        ("CUDNN_ACTIVATION_TANH", CUDNN_ACTIVATION_TANH),
        ("CUDNN_ACTIVATION_CLIPPED_RELU", CUDNN_ACTIVATION_CLIPPED_RELU),
        ("CUDNN_ACTIVATION_ELU", CUDNN_ACTIVATION_ELU),
        ("CUDNN_ACTIVATION_IDENTITY", CUDNN_ACTIVATION_IDENTITY),
        ("CUDNN_ACTIVATION_SWISH", CUDNN_ACTIVATION_SWISH),
        ("CUDNN_SOFTMAX_FAST", CUDNN_SOFTMAX_FAST),
        ("CUDNN_SOFTMAX_ACCURATE", CUDNN_SOFTMAX_ACCURATE),
        ("CUDNN_SOFTMAX_LOG", CUDNN_SOFTMAX_LOG),
        ("CUDNN_SOFTMAX_MODE_INSTANCE", CUDNN_SOFTMAX_MODE_INSTANCE),
        ("CUDNN_SOFTMAX_MODE_CHANNEL", CUDNN_SOFTMAX_MODE_CHANNEL),
        ("CUDNN_POOLING_MAX", CUDNN_POOLING_MAX),
        ("CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING", CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING),
        ("CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING", CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING),
        ("CUDNN_POOLING_MAX_DETERMINISTIC", CUDNN_POOLING_MAX_DETERMINISTIC),
        ("CUDNN_OP_TENSOR_ADD", CUDNN_OP_TENSOR_ADD),
        ("CUDNN_OP_TENSOR_MUL", CUDNN_OP_TENSOR_MUL),
        ("CUDNN_OP_TENSOR_MIN", CUDNN_OP_TENSOR_MIN),
        ("CUDNN_OP_TENSOR_MAX", CUDNN_OP_TENSOR_MAX),
        ("CUDNN_OP_TENSOR_SQRT", CUDNN_OP_TENSOR_SQRT),
        ("CUDNN_OP_TENSOR_NOT", CUDNN_OP_TENSOR_NOT),
        ("CUDNN_REDUCE_TENSOR_ADD", CUDNN_REDUCE_TENSOR_ADD),
        ("CUDNN_REDUCE_TENSOR_MUL", CUDNN_REDUCE_TENSOR_MUL),
        ("CUDNN_REDUCE_TENSOR_MIN", CUDNN_REDUCE_TENSOR_MIN),
        ("CUDNN_REDUCE_TENSOR_MAX", CUDNN_REDUCE_TENSOR_MAX),
        ("CUDNN_REDUCE_TENSOR_AMAX", CUDNN_REDUCE_TENSOR_AMAX),
        ("CUDNN_REDUCE_TENSOR_AVG", CUDNN_REDUCE_TENSOR_AVG),
        ("CUDNN_REDUCE_TENSOR_NORM1", CUDNN_REDUCE_TENSOR_NORM1),
        ("CUDNN_REDUCE_TENSOR_NORM2", CUDNN_REDUCE_TENSOR_NORM2),
        ("CUDNN_REDUCE_TENSOR_MUL_NO_ZEROS", CUDNN_REDUCE_TENSOR_MUL_NO_ZEROS),
        ("CUDNN_REDUCE_TENSOR_NO_INDICES", CUDNN_REDUCE_TENSOR_NO_INDICES),
        ("CUDNN_REDUCE_TENSOR_FLATTENED_INDICES", CUDNN_REDUCE_TENSOR_FLATTENED_INDICES),
        ("CUDNN_32BIT_INDICES", CUDNN_32BIT_INDICES),
        ("CUDNN_64BIT_INDICES", CUDNN_64BIT_INDICES),
        ("CUDNN_16BIT_INDICES", CUDNN_16BIT_INDICES),
        ("CUDNN_8BIT_INDICES", CUDNN_8BIT_INDICES),
        ("CUDNN_BATCHNORM_PER_ACTIVATION", CUDNN_BATCHNORM_PER_ACTIVATION),
        ("CUDNN_BATCHNORM_SPATIAL", CUDNN_BATCHNORM_SPATIAL),
        ("CUDNN_BATCHNORM_SPATIAL_PERSISTENT", CUDNN_BATCHNORM_SPATIAL_PERSISTENT),
        ("CUDNN_BATCHNORM_OPS_BN", CUDNN_BATCHNORM_OPS_BN),
        ("CUDNN_BATCHNORM_OPS_BN_ACTIVATION", CUDNN_BATCHNORM_OPS_BN_ACTIVATION),
        ("CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION", CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION),
        ("CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM", CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM),
        ("CUDNN_CONVOLUTION_FWD_ALGO_COUNT", CUDNN_CONVOLUTION_FWD_ALGO_COUNT),
        ("CUDNN_CONVOLUTION_BWD_DATA_ALGO_1", CUDNN_CONVOLUTION_BWD_DATA_ALGO_1),
        ("CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT", CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT),
        ("CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1", CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1),
        ("CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT", CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT),
        ("CUDNN_DIM_MAX", DIM_MAX),
        ("CUDNN_ERRQUERY_RAWCODE", CUDNN_ERRQUERY_RAWCODE),
        ("CUDNN_ERRQUERY_NONBLOCKING", CUDNN_ERRQUERY_NONBLOCKING),
        ("CUDNN_ERRQUERY_BLOCKING", CUDNN_ERRQUERY_BLOCKING),
    ];
    let mut src = String::from("#include <stddef.h>\n#include <cudnn.h>\n");
    for (name, v) in consts {
        src.push_str(&format!("_Static_assert((int){name} == {v}, \"{name} is {v} in ferrodnn-cudnn\");\n"));
    }
    for ty in ["cudnnConvolutionFwdAlgoPerf_t", "cudnnConvolutionBwdDataAlgoPerf_t", "cudnnConvolutionBwdFilterAlgoPerf_t"] {
        src.push_str(&format!("_Static_assert(sizeof({ty}) == {}, \"{ty} size\");\n", std::mem::size_of::<AlgoPerf>()));
        for (field, at) in
            [("time", std::mem::offset_of!(AlgoPerf, time)), ("memory", std::mem::offset_of!(AlgoPerf, memory)), ("mathType", std::mem::offset_of!(AlgoPerf, math_type))]
        {
            src.push_str(&format!("_Static_assert(offsetof({ty}, {field}) == {at}, \"{ty}.{field} offset\");\n"));
        }
    }
    src.push_str(&format!(
        "_Static_assert(CUDNN_MAJOR * 10000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL <= {REPORTED_VERSION}, \"the reported version is at least the header's\");\n"
    ));
    let dir = std::env::temp_dir().join(format!("ferrodnn_cudnn_abi_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("abi_check.c");
    std::fs::write(&file, src).unwrap();
    let stub = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/cuda_stub");
    let out = std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-fsyntax-only", "-std=c11", "-Wno-deprecated-declarations"])
        .arg(format!("-I{}", include.display()))
        .arg(format!("-I{}", stub.display()))
        .arg(&file)
        .output()
        .expect("a C compiler (cc) to check the header");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "our values differ from NVIDIA's header:\n{}", String::from_utf8_lossy(&out.stderr));
}
