//! The C API on a GPU handle (device pointers, the CUDA engine) against the same calls on a CPU
//! handle (host pointers, checked against loops by the other tests). Skipped without a GPU.
//! Covers what only the GPU path does: device scratch memory for inputs that alias outputs,
//! zero inputs, discarded outputs and missing workspaces, the default stream and a stream given
//! with cudnnSetStream.
//!
//! On the GPU machine (no cargo there): `scripts/capi_stage.sh` builds it into
//! `.gpu/capi/test_gpu`; run that there.

mod common;
use common::*;
use ferrodnn::engine::cuda::{gpu_available, CudaDevice, DeviceBuffer};
use ferrodnn_cudnn::batchnorm::*;
use ferrodnn_cudnn::conv::*;
use ferrodnn_cudnn::desc::*;
use ferrodnn_cudnn::handle::*;
use ferrodnn_cudnn::ops::*;
use ferrodnn_cudnn::types::*;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::Arc;

/// Where a call's buffers live: host vectors (CPU handle) or device buffers (GPU handle).
enum Side {
    Host(Vec<Vec<u8>>),
    Device(Vec<DeviceBuffer>),
}

impl Side {
    fn ptrs(&mut self) -> Vec<*mut c_void> {
        match self {
            Side::Host(v) => v.iter_mut().map(|b| b.as_mut_ptr() as *mut c_void).collect(),
            Side::Device(v) => v.iter().map(|b| b.device_ptr() as usize as *mut c_void).collect(),
        }
    }
    fn read(&self, i: usize) -> Vec<u8> {
        match self {
            Side::Host(v) => v[i].clone(),
            Side::Device(v) => v[i].to_host().unwrap(),
        }
    }
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect()
}
fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

/// Runs `call` (handle, buffer pointers) on a CPU handle with host buffers and on a GPU handle
/// with device copies of the same `inputs`, then compares buffers `outputs` (f32) within `tol`.
fn same_on_both(what: &str, inputs: &[Vec<u8>], outputs: &[usize], tol: f64, stream: Option<u64>, call: impl Fn(cudnnHandle_t, &[*mut c_void]) -> Status) {
    let dev = CudaDevice::open(0).unwrap();
    let mut host = Side::Host(inputs.to_vec());
    let cpu = Handle::cpu();
    ok(call(cpu.0, &host.ptrs()));
    let mut gh = null_mut();
    ok(cudnnCreate(&mut gh));
    let mut is_gpu = 0;
    ok(ferrodnnHandleIsGpu(gh, &mut is_gpu));
    assert_eq!(is_gpu, 1, "cudnnCreate gives a GPU handle on a machine with a GPU");
    let owned_stream = stream.map(|_| dev.new_stream().unwrap());
    if let Some(s) = &owned_stream {
        ok(cudnnSetStream(gh, s.raw() as cudaStream_t));
    }
    let mut device = Side::Device(inputs.iter().map(|b| dev.upload(b).unwrap()).collect());
    // A synchronous copy from pageable memory may return before its DMA lands; the call may run
    // on a stream that does not wait for it.
    dev.synchronize().unwrap();
    ok(call(gh, &device.ptrs()));
    match &owned_stream {
        Some(s) => s.synchronize().unwrap(),
        None => dev.synchronize().unwrap(),
    }
    for &o in outputs {
        let (a, b) = (f32s(&host.read(o)), f32s(&device.read(o)));
        let want: Vec<f64> = a.iter().map(|&v| v as f64).collect();
        close(&b, &want, tol, &format!("{what}: buffer {o} on the GPU vs the CPU"));
    }
    ok(cudnnDestroy(gh));
    drop(owned_stream);
    let _: Arc<CudaDevice> = dev;
}

fn skip() -> bool {
    if !gpu_available() {
        eprintln!("skipped: no GPU");
        return true;
    }
    false
}

#[test]
fn convolutions_on_the_gpu() {
    if skip() {
        return;
    }
    let xdims = [2, 8, 9, 7];
    let wdims = [12, 4, 3, 3];
    let ydims = [2, 12, 5, 7];
    let xd = f32_tensor(&xdims, true);
    let wd = fdesc(&wdims, true);
    let yd = f32_tensor(&ydims, true);
    let bd = f32_tensor(&[1, 12, 1, 1], false);
    let mut cd = null_mut();
    ok(cudnnCreateConvolutionDescriptor(&mut cd));
    ok(cudnnSetConvolution2dDescriptor(cd, 2, 1, 2, 1, 2, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    ok(cudnnSetConvolutionGroupCount(cd, 2));
    ok(cudnnSetConvolutionMathType(cd, CUDNN_FMA_MATH));
    let inputs = vec![bytes(&rand(count(&xdims), 1)), bytes(&rand(count(&wdims), 2)), bytes(&rand(count(&ydims), 3)), bytes(&rand(count(&ydims), 4)), bytes(&rand(12, 5))];
    let mut act = null_mut();
    ok(cudnnCreateActivationDescriptor(&mut act));
    ok(cudnnSetActivationDescriptor(act, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
    for (alpha, beta, stream) in [(1.0f32, 0.0f32, None), (0.5, 0.75, None), (1.0, 1.0, Some(1))] {
        // Forward into buffer 3 (beta blends its old values), without a workspace.
        same_on_both("conv forward", &inputs, &[3], 1e-4, stream, |h, p| cudnnConvolutionForward(h, sc(&alpha), xd, p[0], wd, p[1], cd, 1, null_mut(), 0, sc(&beta), yd, p[3]));
        // Backward data into buffer 0, backward filter into buffer 1, bias into buffer 4.
        same_on_both("conv backward data", &inputs, &[0], 1e-4, stream, |h, p| {
            cudnnConvolutionBackwardData(h, sc(&alpha), wd, p[1], yd, p[2], cd, 1, null_mut(), 0, sc(&beta), xd, p[0])
        });
        same_on_both("conv backward filter", &inputs, &[1], 1e-4, stream, |h, p| {
            cudnnConvolutionBackwardFilter(h, sc(&alpha), xd, p[0], yd, p[2], cd, 1, null_mut(), 0, sc(&beta), wd, p[1])
        });
        same_on_both("conv backward bias", &inputs, &[4], 1e-4, stream, |h, p| cudnnConvolutionBackwardBias(h, sc(&alpha), yd, p[2], sc(&beta), bd, p[4]));
    }
    // Bias + activation with z in y's memory (a scratch copy on the GPU), with a workspace.
    let (a1, a2) = (1.0f32, 0.5f32);
    same_on_both("conv + z + bias + relu", &inputs, &[3], 1e-4, None, |h, p| {
        let mut ws = 0usize;
        let s = cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, 1, &mut ws);
        if s != 0 {
            return s;
        }
        let mut gpu = 0;
        ok(ferrodnnHandleIsGpu(h, &mut gpu));
        let dev = CudaDevice::open(0).unwrap();
        let wsb = if gpu == 1 && ws > 0 { Some(dev.alloc(ws).unwrap()) } else { None };
        let mut host_ws = vec![0u8; ws];
        let wp = match &wsb {
            Some(b) => b.device_ptr() as usize as *mut c_void,
            None => host_ws.as_mut_ptr() as *mut c_void,
        };
        cudnnConvolutionBiasActivationForward(h, sc(&a1), xd, p[0], wd, p[1], cd, 1, wp, ws, sc(&a2), yd, p[3], bd, p[4], act, yd, p[3])
    });
    // A host pointer on a GPU handle is refused, not dereferenced.
    let mut gh = null_mut();
    ok(cudnnCreate(&mut gh));
    let (x, w) = (rand(count(&xdims), 1), rand(count(&wdims), 2));
    let mut y = vec![0f32; count(&ydims)];
    let (one, zero) = (1.0f32, 0.0f32);
    fails(cudnnConvolutionForward(gh, sc(&one), xd, p(&x), wd, p(&w), cd, 1, null_mut(), 0, sc(&zero), yd, pm(&mut y)), CUDNN_STATUS_BAD_PARAM, &["host pointer"]);
    ok(cudnnDestroy(gh));
}

#[test]
fn half_convolution_on_the_gpu() {
    if skip() {
        return;
    }
    let xdims = [2, 16, 8, 8];
    let ydims = [2, 32, 8, 8];
    let xd = tdesc(CUDNN_DATA_HALF, &xdims, &strides(&xdims, true));
    let yd = tdesc(CUDNN_DATA_FLOAT, &ydims, &strides(&ydims, true));
    let mut wd = null_mut();
    ok(cudnnCreateFilterDescriptor(&mut wd));
    ok(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_HALF, CUDNN_TENSOR_NHWC, 32, 16, 3, 3));
    let mut cd = null_mut();
    ok(cudnnCreateConvolutionDescriptor(&mut cd));
    ok(cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    let half = |v: Vec<f32>| -> Vec<u8> { v.iter().flat_map(|&x| half::f16::from_f32(x).to_ne_bytes()).collect() };
    let inputs = vec![half(rand(count(&xdims), 1)), half(rand(32 * 16 * 9, 2)), vec![0u8; count(&ydims) * 4]];
    let (one, zero) = (1.0f32, 0.0f32);
    // Half inputs, f32 output: both sides sum in f32; the GPU may use tensor cores.
    same_on_both("half conv", &inputs, &[2], 2e-3, None, |h, p| cudnnConvolutionForward(h, sc(&one), xd, p[0], wd, p[1], cd, 1, null_mut(), 0, sc(&zero), yd, p[2]));
}

#[test]
fn pointwise_softmax_pooling_reductions_on_the_gpu() {
    if skip() {
        return;
    }
    let dims = [2, 6, 5, 7];
    let n = count(&dims);
    let t = f32_tensor(&dims, true);
    let inputs = vec![bytes(&rand(n, 1)), bytes(&rand(n, 2)), bytes(&rand(n, 3)), bytes(&rand(6, 4)), vec![0u8; 2 * 6 * 3 * 4 * 4], vec![0u8; 6 * 4 * 2]];
    let (one, zero, half, beta) = (1.0f32, 0.0f32, 0.5f32, 0.25f32);
    let mut act = null_mut();
    ok(cudnnCreateActivationDescriptor(&mut act));
    ok(cudnnSetActivationDescriptor(act, CUDNN_ACTIVATION_SWISH, CUDNN_NOT_PROPAGATE_NAN, 0.0));
    // In place (a scratch copy of x on the GPU).
    same_on_both("activation in place", &inputs, &[0], 1e-5, None, |h, p| cudnnActivationForward(h, act, sc(&half), t, p[0], sc(&beta), t, p[0]));
    same_on_both("activation backward", &inputs, &[2], 1e-5, Some(1), |h, p| cudnnActivationBackward(h, act, sc(&one), t, p[1], t, p[1], t, p[0], sc(&beta), t, p[2]));
    for mode in [CUDNN_SOFTMAX_MODE_INSTANCE, CUDNN_SOFTMAX_MODE_CHANNEL] {
        same_on_both("softmax", &inputs, &[1], 1e-5, None, |h, p| cudnnSoftmaxForward(h, CUDNN_SOFTMAX_ACCURATE, mode, sc(&one), t, p[0], sc(&zero), t, p[1]));
        same_on_both("log softmax backward", &inputs, &[2], 1e-5, None, |h, p| cudnnSoftmaxBackward(h, CUDNN_SOFTMAX_LOG, mode, sc(&one), t, p[0], t, p[1], sc(&beta), t, p[2]));
    }
    // A broadcast add (a zero input in scratch memory) and set tensor.
    let bias = f32_tensor(&[1, 6, 1, 1], false);
    same_on_both("add tensor", &inputs, &[1], 1e-6, None, |h, p| cudnnAddTensor(h, sc(&half), bias, p[3], sc(&zero), t, p[1]));
    let v = 2.5f32;
    same_on_both("set tensor", &inputs, &[2], 0.0, None, |h, p| cudnnSetTensor(h, t, p[2], sc(&v)));
    // Max pooling forward into buffer 4 ([2, 6, 3, 4]).
    let mut pd = null_mut();
    ok(cudnnCreatePoolingDescriptor(&mut pd));
    ok(cudnnSetPooling2dDescriptor(pd, CUDNN_POOLING_MAX, CUDNN_NOT_PROPAGATE_NAN, 3, 3, 1, 1, 2, 2));
    let pt = f32_tensor(&[2, 6, 3, 4], true);
    same_on_both("max pooling", &inputs, &[4], 0.0, None, |h, p| cudnnPoolingForward(h, pd, sc(&one), t, p[0], sc(&zero), pt, p[4]));
    // Max reduction over n and h with 32-bit indices: values into buffer 5, indices into 4.
    let cd = f32_tensor(&[1, 6, 1, 7], false);
    let mut rd = null_mut();
    ok(cudnnCreateReduceTensorDescriptor(&mut rd));
    ok(cudnnSetReduceTensorDescriptor(rd, CUDNN_REDUCE_TENSOR_MAX, CUDNN_DATA_FLOAT, 0, CUDNN_REDUCE_TENSOR_FLATTENED_INDICES, CUDNN_32BIT_INDICES));
    same_on_both("max reduction with indices", &inputs, &[4, 5], 0.0, None, |h, p| cudnnReduceTensor(h, rd, p[4], 42 * 4, null_mut(), 0, sc(&one), t, p[0], sc(&zero), cd, p[5]));
}

#[test]
fn batchnorm_on_the_gpu() {
    if skip() {
        return;
    }
    let dims = [4, 6, 5, 5];
    let n = count(&dims);
    let xd = f32_tensor(&dims, true);
    let mut bd = null_mut();
    ok(cudnnCreateTensorDescriptor(&mut bd));
    ok(cudnnDeriveBNTensorDescriptor(bd, xd, CUDNN_BATCHNORM_SPATIAL));
    let pos: Vec<f32> = rand(6, 6).iter().map(|v| v.abs() + 0.5).collect();
    // x, y, scale, bias, running mean, running var, saved mean, saved inv var, dy, dx, dscale, dbias
    let inputs = vec![
        bytes(&rand(n, 1)),
        vec![0u8; n * 4],
        bytes(&rand(6, 2)),
        bytes(&rand(6, 3)),
        bytes(&rand(6, 4)),
        bytes(&pos),
        vec![0u8; 24],
        vec![0u8; 24],
        bytes(&rand(n, 5)),
        vec![0u8; n * 4],
        vec![0u8; 24],
        vec![0u8; 24],
    ];
    let (one, zero) = (1.0f32, 0.0f32);
    // Running statistics in place (scratch copies on the GPU), saved statistics discarded.
    same_on_both("batchnorm training", &inputs, &[1, 4, 5], 1e-5, None, |h, p| {
        cudnnBatchNormalizationForwardTraining(h, CUDNN_BATCHNORM_SPATIAL, sc(&one), sc(&zero), xd, p[0], xd, p[1], bd, p[2], p[3], 0.1, p[4], p[5], 1e-5, null_mut(), null_mut())
    });
    same_on_both("batchnorm inference", &inputs, &[1], 1e-5, Some(1), |h, p| {
        cudnnBatchNormalizationForwardInference(h, CUDNN_BATCHNORM_SPATIAL, sc(&one), sc(&zero), xd, p[0], xd, p[1], bd, p[2], p[3], p[4], p[5], 1e-5)
    });
    same_on_both("batchnorm training then backward", &inputs, &[9, 10, 11], 1e-4, None, |h, p| {
        let s = cudnnBatchNormalizationForwardTraining(h, CUDNN_BATCHNORM_SPATIAL, sc(&one), sc(&zero), xd, p[0], xd, p[1], bd, p[2], p[3], 0.1, p[4], p[5], 1e-5, p[6], p[7]);
        if s != 0 {
            return s;
        }
        cudnnBatchNormalizationBackward(
            h,
            CUDNN_BATCHNORM_SPATIAL,
            sc(&one),
            sc(&zero),
            sc(&one),
            sc(&zero),
            xd,
            p[0],
            xd,
            p[8],
            xd,
            p[9],
            bd,
            p[2],
            p[10],
            p[11],
            1e-5,
            p[6],
            p[7],
        )
    });
}
