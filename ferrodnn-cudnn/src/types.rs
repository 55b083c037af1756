//! The C types of the legacy API, written from cuDNN 9's documented API: status codes and enum
//! values (each equal to cuDNN's; `tests/c/abi_check.c` static-asserts them against NVIDIA's
//! header), the algorithm-performance structs, and the opaque handles. Enums cross the ABI as C
//! `int`s (`i32`); a value outside an enum's range is checked where it is used.

#![allow(non_camel_case_types, non_upper_case_globals)]

use std::ffi::c_void;

pub type Status = i32;

pub const CUDNN_STATUS_SUCCESS: Status = 0;
pub const CUDNN_STATUS_NOT_INITIALIZED: Status = 1001;
pub const CUDNN_STATUS_BAD_PARAM: Status = 2000;
pub const CUDNN_STATUS_BAD_PARAM_NULL_POINTER: Status = 2002;
pub const CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH: Status = 2008;
pub const CUDNN_STATUS_NOT_SUPPORTED: Status = 3000;
pub const CUDNN_STATUS_NOT_SUPPORTED_SHAPE: Status = 3002;
pub const CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE: Status = 3003;
pub const CUDNN_STATUS_INTERNAL_ERROR: Status = 4000;
pub const CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED: Status = 4003;
pub const CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED: Status = 4004;
pub const CUDNN_STATUS_EXECUTION_FAILED: Status = 5000;
pub const CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER: Status = 5001;

/// `cudnnDataType_t`.
pub const CUDNN_DATA_FLOAT: i32 = 0;
pub const CUDNN_DATA_DOUBLE: i32 = 1;
pub const CUDNN_DATA_HALF: i32 = 2;
pub const CUDNN_DATA_INT8: i32 = 3;
pub const CUDNN_DATA_INT32: i32 = 4;
pub const CUDNN_DATA_INT8x4: i32 = 5;
pub const CUDNN_DATA_UINT8: i32 = 6;
pub const CUDNN_DATA_UINT8x4: i32 = 7;
pub const CUDNN_DATA_INT8x32: i32 = 8;
pub const CUDNN_DATA_BFLOAT16: i32 = 9;
pub const CUDNN_DATA_INT64: i32 = 10;
pub const CUDNN_DATA_BOOLEAN: i32 = 11;
pub const CUDNN_DATA_FP8_E4M3: i32 = 12;
pub const CUDNN_DATA_FP8_E5M2: i32 = 13;

/// `cudnnTensorFormat_t`.
pub const CUDNN_TENSOR_NCHW: i32 = 0;
pub const CUDNN_TENSOR_NHWC: i32 = 1;
pub const CUDNN_TENSOR_NCHW_VECT_C: i32 = 2;

/// `cudnnNanPropagation_t`.
pub const CUDNN_NOT_PROPAGATE_NAN: i32 = 0;
pub const CUDNN_PROPAGATE_NAN: i32 = 1;

/// `cudnnMathType_t`.
pub const CUDNN_DEFAULT_MATH: i32 = 0;
pub const CUDNN_TENSOR_OP_MATH: i32 = 1;
pub const CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: i32 = 2;
pub const CUDNN_FMA_MATH: i32 = 3;

/// `cudnnConvolutionMode_t`.
pub const CUDNN_CONVOLUTION: i32 = 0;
pub const CUDNN_CROSS_CORRELATION: i32 = 1;

/// `cudnnReorderType_t`.
pub const CUDNN_DEFAULT_REORDER: i32 = 0;
pub const CUDNN_NO_REORDER: i32 = 1;

/// `cudnnDeterminism_t`.
pub const CUDNN_NON_DETERMINISTIC: i32 = 0;
pub const CUDNN_DETERMINISTIC: i32 = 1;

/// `cudnnActivationMode_t`.
pub const CUDNN_ACTIVATION_SIGMOID: i32 = 0;
pub const CUDNN_ACTIVATION_RELU: i32 = 1;
pub const CUDNN_ACTIVATION_TANH: i32 = 2;
pub const CUDNN_ACTIVATION_CLIPPED_RELU: i32 = 3;
pub const CUDNN_ACTIVATION_ELU: i32 = 4;
pub const CUDNN_ACTIVATION_IDENTITY: i32 = 5;
pub const CUDNN_ACTIVATION_SWISH: i32 = 6;

/// `cudnnSoftmaxAlgorithm_t` and `cudnnSoftmaxMode_t`.
pub const CUDNN_SOFTMAX_FAST: i32 = 0;
pub const CUDNN_SOFTMAX_ACCURATE: i32 = 1;
pub const CUDNN_SOFTMAX_LOG: i32 = 2;
pub const CUDNN_SOFTMAX_MODE_INSTANCE: i32 = 0;
pub const CUDNN_SOFTMAX_MODE_CHANNEL: i32 = 1;

/// `cudnnPoolingMode_t`.
pub const CUDNN_POOLING_MAX: i32 = 0;
pub const CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING: i32 = 1;
pub const CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING: i32 = 2;
pub const CUDNN_POOLING_MAX_DETERMINISTIC: i32 = 3;

/// `cudnnOpTensorOp_t`.
pub const CUDNN_OP_TENSOR_ADD: i32 = 0;
pub const CUDNN_OP_TENSOR_MUL: i32 = 1;
pub const CUDNN_OP_TENSOR_MIN: i32 = 2;
pub const CUDNN_OP_TENSOR_MAX: i32 = 3;
pub const CUDNN_OP_TENSOR_SQRT: i32 = 4;
pub const CUDNN_OP_TENSOR_NOT: i32 = 5;

/// `cudnnReduceTensorOp_t`, `cudnnReduceTensorIndices_t`, `cudnnIndicesType_t`.
pub const CUDNN_REDUCE_TENSOR_ADD: i32 = 0;
pub const CUDNN_REDUCE_TENSOR_MUL: i32 = 1;
pub const CUDNN_REDUCE_TENSOR_MIN: i32 = 2;
pub const CUDNN_REDUCE_TENSOR_MAX: i32 = 3;
pub const CUDNN_REDUCE_TENSOR_AMAX: i32 = 4;
pub const CUDNN_REDUCE_TENSOR_AVG: i32 = 5;
pub const CUDNN_REDUCE_TENSOR_NORM1: i32 = 6;
pub const CUDNN_REDUCE_TENSOR_NORM2: i32 = 7;
pub const CUDNN_REDUCE_TENSOR_MUL_NO_ZEROS: i32 = 8;
pub const CUDNN_REDUCE_TENSOR_NO_INDICES: i32 = 0;
pub const CUDNN_REDUCE_TENSOR_FLATTENED_INDICES: i32 = 1;
pub const CUDNN_32BIT_INDICES: i32 = 0;
pub const CUDNN_64BIT_INDICES: i32 = 1;
pub const CUDNN_16BIT_INDICES: i32 = 2;
pub const CUDNN_8BIT_INDICES: i32 = 3;

/// `cudnnBatchNormMode_t` and `cudnnBatchNormOps_t`.
pub const CUDNN_BATCHNORM_PER_ACTIVATION: i32 = 0;
pub const CUDNN_BATCHNORM_SPATIAL: i32 = 1;
pub const CUDNN_BATCHNORM_SPATIAL_PERSISTENT: i32 = 2;
pub const CUDNN_BATCHNORM_OPS_BN: i32 = 0;
pub const CUDNN_BATCHNORM_OPS_BN_ACTIVATION: i32 = 1;
pub const CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION: i32 = 2;

/// The convolution algorithms' counts (`CUDNN_CONVOLUTION_*_ALGO_COUNT`) and the ones our plans
/// are reported as.
pub const CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM: i32 = 1;
pub const CUDNN_CONVOLUTION_FWD_ALGO_COUNT: i32 = 8;
pub const CUDNN_CONVOLUTION_BWD_DATA_ALGO_1: i32 = 1;
pub const CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT: i32 = 6;
pub const CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1: i32 = 1;
pub const CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT: i32 = 7;

/// `cudnnErrQueryMode_t`.
pub const CUDNN_ERRQUERY_RAWCODE: i32 = 0;
pub const CUDNN_ERRQUERY_NONBLOCKING: i32 = 1;
pub const CUDNN_ERRQUERY_BLOCKING: i32 = 2;

/// `libraryPropertyType` (from CUDA's library_types.h).
pub const MAJOR_VERSION: i32 = 0;
pub const MINOR_VERSION: i32 = 1;
pub const PATCH_LEVEL: i32 = 2;

/// The cuDNN version this library reports (`cudnnGetVersion`, `cudnnGetProperty`): 9.26.0, the
/// newest the API was written against, so that frameworks built against any cuDNN 9 accept it.
/// `FERRODNN_CUDNN_VERSION` (such as `91900`) reports another.
pub const REPORTED_VERSION: usize = 92600;

/// `cudnnConvolutionFwdAlgoPerf_t`, `cudnnConvolutionBwdDataAlgoPerf_t` and
/// `cudnnConvolutionBwdFilterAlgoPerf_t`: one layout, the algorithm enum first.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AlgoPerf {
    pub algo: i32,
    pub status: Status,
    /// Milliseconds; -1 when the algorithm was not timed.
    pub time: f32,
    pub memory: usize,
    pub determinism: i32,
    pub math_type: i32,
    pub reserved: [i32; 3],
}

/// Opaque handle types as C sees them: pointers to structs it never looks into.
pub type cudnnHandle_t = *mut c_void;
pub type cudnnTensorDescriptor_t = *mut c_void;
pub type cudnnFilterDescriptor_t = *mut c_void;
pub type cudnnConvolutionDescriptor_t = *mut c_void;
pub type cudnnActivationDescriptor_t = *mut c_void;
pub type cudnnPoolingDescriptor_t = *mut c_void;
pub type cudnnOpTensorDescriptor_t = *mut c_void;
pub type cudnnReduceTensorDescriptor_t = *mut c_void;
pub type cudaStream_t = *mut c_void;
pub type cudnnBackendDescriptor_t = *mut c_void;
pub type cudnnDropoutDescriptor_t = *mut c_void;
pub type cudnnLRNDescriptor_t = *mut c_void;
pub type cudnnRNNDescriptor_t = *mut c_void;
pub type cudnnRNNDataDescriptor_t = *mut c_void;

/// The name of a status code, as `cudnnGetErrorString` gives it.
pub fn status_name(s: Status) -> &'static str {
    match s {
        0 => "CUDNN_STATUS_SUCCESS",
        1001 => "CUDNN_STATUS_NOT_INITIALIZED",
        1002 => "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH",
        1003 => "CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH",
        1004 => "CUDNN_STATUS_DEPRECATED",
        1005 => "CUDNN_STATUS_LICENSE_ERROR",
        1006 => "CUDNN_STATUS_RUNTIME_IN_PROGRESS",
        1007 => "CUDNN_STATUS_RUNTIME_FP_OVERFLOW",
        1008 => "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED",
        2000 => "CUDNN_STATUS_BAD_PARAM",
        2002 => "CUDNN_STATUS_BAD_PARAM_NULL_POINTER",
        2003 => "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER",
        2004 => "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED",
        2005 => "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND",
        2006 => "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT",
        2007 => "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH",
        2008 => "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH",
        2009 => "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES",
        2010 => "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE",
        2011 => "CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH",
        2012 => "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE",
        3000 => "CUDNN_STATUS_NOT_SUPPORTED",
        3001 => "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN",
        3002 => "CUDNN_STATUS_NOT_SUPPORTED_SHAPE",
        3003 => "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE",
        3004 => "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT",
        3005 => "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER",
        3006 => "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART",
        3007 => "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH",
        3008 => "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING",
        3009 => "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE",
        3010 => "CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT",
        3011 => "CUDNN_STATUS_NOT_SUPPORTED_PADDING",
        3012 => "CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM",
        3013 => "CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API",
        3014 => "CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE",
        4000 => "CUDNN_STATUS_INTERNAL_ERROR",
        4001 => "CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED",
        4002 => "CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE",
        4003 => "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
        4004 => "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
        4005 => "CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM",
        4006 => "CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED",
        5000 => "CUDNN_STATUS_EXECUTION_FAILED",
        5001 => "CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER",
        5002 => "CUDNN_STATUS_EXECUTION_FAILED_CUBLAS",
        5003 => "CUDNN_STATUS_EXECUTION_FAILED_CUDART",
        5004 => "CUDNN_STATUS_EXECUTION_FAILED_CURAND",
        _ => "CUDNN_STATUS_UNKNOWN",
    }
}
