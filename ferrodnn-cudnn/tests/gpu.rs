//! The C API on a GPU handle (device pointers, the CUDA engine) against the same calls on a CPU
//! handle (host pointers, checked against loops by the other tests). Covers what only the GPU
//! path does: device scratch memory for inputs that alias outputs, zero inputs, discarded outputs
//! and missing workspaces, the default stream and a stream given with cudnnSetStream.
//!
//! Without a GPU the same calls run on a second CPU handle instead, so that the test's own side
//! (its buffers and descriptors) is checked on every machine: each buffer, host or device, lies
//! between red zones of canary bytes that are checked after every call, so a buffer smaller than
//! its descriptor says fails here, naming the buffer, instead of corrupting memory. (One did: the
//! reduction's values buffer held 48 bytes for a [1, 6, 1, 7] f32 output of 168, and the CPU
//! handle's write past it corrupted the host heap: glibc's "corrupted size vs. prev_size".)
//!
//! On the GPU machine (no cargo there): `scripts/capi_stage.sh` builds it into
//! `.gpu/capi/test_gpu`; run that there. Each test and step is announced on standard error as
//! it starts, so a crash names where it happened.

mod common;
use common::*;
use ferrodnn::engine::cuda::{gpu_available, CudaDevice, DeviceBuffer, Stream};
use ferrodnn_cudnn::batchnorm::*;
use ferrodnn_cudnn::conv::*;
use ferrodnn_cudnn::desc::*;
use ferrodnn_cudnn::handle::*;
use ferrodnn_cudnn::ops::*;
use ferrodnn_cudnn::types::*;
use std::ffi::c_void;
use std::io::Write;
use std::ptr::null_mut;
use std::sync::Arc;

/// Canary bytes before and after every buffer (a multiple of 256, so that device pointers keep
/// cuMemAlloc's alignment).
const RED: usize = 256;
const CANARY: u8 = 0xA5;

/// Writes a line to standard error at once. libtest captures `eprintln!` and prints it only
/// for a test that fails; a process that aborts (heap corruption, a segfault) prints nothing
/// captured, so progress goes to the stream itself.
fn announce(line: &str) {
    let _ = writeln!(std::io::stderr(), "gpu.rs: {line}");
}

/// `inputs[i]` between red zones.
fn padded(b: &[u8]) -> Vec<u8> {
    let mut v = vec![CANARY; b.len() + 2 * RED];
    v[RED..RED + b.len()].copy_from_slice(b);
    v
}

/// Where a call's buffers live: host vectors (CPU handle) or device buffers (GPU handle), each
/// with a red zone on both sides; `lens` are the buffers' own sizes.
enum Side {
    Host(Vec<Vec<u8>>, Vec<usize>),
    Device(Vec<DeviceBuffer>, Vec<usize>),
}

impl Side {
    fn host(inputs: &[Vec<u8>]) -> Side {
        Side::Host(inputs.iter().map(|b| padded(b)).collect(), inputs.iter().map(Vec::len).collect())
    }
    fn device(dev: &Arc<CudaDevice>, inputs: &[Vec<u8>]) -> Side {
        Side::Device(inputs.iter().map(|b| dev.upload(&padded(b)).unwrap()).collect(), inputs.iter().map(Vec::len).collect())
    }
    /// Each buffer's start (past its leading red zone).
    fn ptrs(&mut self) -> Vec<*mut c_void> {
        match self {
            // SAFETY (the `add`s): each vector holds RED + len + RED bytes.
            Side::Host(v, _) => v.iter_mut().map(|b| unsafe { b.as_mut_ptr().add(RED) } as *mut c_void).collect(),
            Side::Device(v, _) => v.iter().map(|b| (b.device_ptr() + RED as u64) as usize as *mut c_void).collect(),
        }
    }
    /// Buffer `i` with its red zones.
    fn whole(&self, i: usize) -> Vec<u8> {
        match self {
            Side::Host(v, _) => v[i].clone(),
            Side::Device(v, _) => v[i].to_host().unwrap(),
        }
    }
    /// Buffer `i`'s own bytes.
    fn read(&self, i: usize) -> Vec<u8> {
        let n = match self {
            Side::Host(_, l) | Side::Device(_, l) => l[i],
        };
        self.whole(i)[RED..RED + n].to_vec()
    }
    /// Panics naming the first buffer whose red zones a call wrote into.
    fn check_red_zones(&self, what: &str, side: &str) {
        let lens = match self {
            Side::Host(_, l) | Side::Device(_, l) => l.clone(),
        };
        for (i, &n) in lens.iter().enumerate() {
            let b = self.whole(i);
            let before = b[..RED].iter().rposition(|&x| x != CANARY).map(|p| RED - p);
            let after = b[RED + n..].iter().rposition(|&x| x != CANARY).map(|p| p + 1);
            assert!(
                before.is_none() && after.is_none(),
                "{what} on the {side}: buffer {i} ({n} bytes) was written outside itself ({} bytes before it, {} bytes past its end): it is smaller than its descriptor needs",
                before.unwrap_or(0),
                after.unwrap_or(0)
            );
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
/// with device copies of the same `inputs` (without a GPU: on a second CPU handle with host
/// copies), then checks every buffer's red zones and compares buffers `outputs` (f32) within
/// `tol`. `stream` runs the GPU call on a stream of its own, given with cudnnSetStream.
fn same_on_both(what: &str, inputs: &[Vec<u8>], outputs: &[usize], tol: f64, stream: Option<u64>, call: impl Fn(cudnnHandle_t, &[*mut c_void]) -> Status) {
    announce(&format!("  {what}{}", if stream.is_some() && gpu_available() { " (on a stream of its own)" } else { "" }));
    let mut host = Side::host(inputs);
    let cpu = Handle::cpu();
    ok(call(cpu.0, &host.ptrs()));
    host.check_red_zones(what, "CPU handle");
    let (second, other) = if gpu_available() { on_the_gpu(what, inputs, stream, &call) } else { on_a_second_cpu_handle(what, inputs, &call) };
    for &o in outputs {
        let (a, b) = (f32s(&host.read(o)), f32s(&second.read(o)));
        let want: Vec<f64> = a.iter().map(|&v| v as f64).collect();
        close(&b, &want, tol, &format!("{what}: buffer {o} on the {other} vs the CPU handle"));
    }
}

/// The GPU half of [`same_on_both`]: its buffers, after the call has finished, and its name.
fn on_the_gpu(what: &str, inputs: &[Vec<u8>], stream: Option<u64>, call: &impl Fn(cudnnHandle_t, &[*mut c_void]) -> Status) -> (Side, &'static str) {
    let dev = CudaDevice::open(0).unwrap();
    let mut gh = null_mut();
    ok(cudnnCreate(&mut gh));
    let mut is_gpu = 0;
    ok(ferrodnnHandleIsGpu(gh, &mut is_gpu));
    assert_eq!(is_gpu, 1, "cudnnCreate gives a GPU handle on a machine with a GPU");
    let owned_stream: Option<Stream> = stream.map(|_| dev.new_stream().unwrap());
    if let Some(s) = &owned_stream {
        ok(cudnnSetStream(gh, s.raw() as cudaStream_t));
    }
    let mut device = Side::device(&dev, inputs);
    // A synchronous copy from pageable memory may return before its DMA lands; the call may run
    // on a stream that does not wait for it.
    dev.synchronize().unwrap();
    let status = call(gh, &device.ptrs());
    // Whatever the status, let the work finish before anything it uses is checked or freed.
    match &owned_stream {
        Some(s) => s.synchronize().unwrap(),
        None => dev.synchronize().unwrap(),
    }
    ok(status);
    device.check_red_zones(what, "GPU handle");
    // The handle goes before the stream it was given, as cuDNN asks.
    ok(cudnnDestroy(gh));
    drop(owned_stream);
    (device, "GPU handle")
}

/// [`same_on_both`]'s second half without a GPU: the same calls on another CPU handle.
fn on_a_second_cpu_handle(what: &str, inputs: &[Vec<u8>], call: &impl Fn(cudnnHandle_t, &[*mut c_void]) -> Status) -> (Side, &'static str) {
    let mut second = Side::host(inputs);
    let h = Handle::cpu();
    ok(call(h.0, &second.ptrs()));
    second.check_red_zones(what, "second CPU handle");
    (second, "second CPU handle")
}

/// Announces the test `name`, and says whether the GPU parts run.
fn start(name: &str) -> bool {
    let gpu = gpu_available();
    announce(&format!("{name}: starting ({})", if gpu { "GPU handle vs CPU handle" } else { "no GPU: a second CPU handle vs the CPU handle" }));
    gpu
}

#[test]
fn convolutions_on_the_gpu() {
    let gpu = start("convolutions_on_the_gpu");
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
        let mut on_gpu = 0;
        ok(ferrodnnHandleIsGpu(h, &mut on_gpu));
        if on_gpu == 1 && ws > 0 {
            let dev = CudaDevice::open(0).unwrap();
            let wsb = dev.alloc(ws).unwrap();
            let s = cudnnConvolutionBiasActivationForward(
                h,
                sc(&a1),
                xd,
                p[0],
                wd,
                p[1],
                cd,
                1,
                wsb.device_ptr() as usize as *mut c_void,
                ws,
                sc(&a2),
                yd,
                p[3],
                bd,
                p[4],
                act,
                yd,
                p[3],
            );
            // The workspace is freed here: let the work that uses it finish first.
            dev.synchronize().unwrap();
            return s;
        }
        let mut host_ws = vec![0u8; ws];
        cudnnConvolutionBiasActivationForward(h, sc(&a1), xd, p[0], wd, p[1], cd, 1, host_ws.as_mut_ptr() as *mut c_void, ws, sc(&a2), yd, p[3], bd, p[4], act, yd, p[3])
    });
    if !gpu {
        return;
    }
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
    let _ = start("half_convolution_on_the_gpu");
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
    let _ = start("pointwise_softmax_pooling_reductions_on_the_gpu");
    let dims = [2, 6, 5, 7];
    let n = count(&dims);
    let t = f32_tensor(&dims, true);
    let inputs = vec![bytes(&rand(n, 1)), bytes(&rand(n, 2)), bytes(&rand(n, 3)), bytes(&rand(6, 4)), vec![0u8; count(&[2, 6, 3, 4]) * 4], vec![0u8; count(&[1, 6, 1, 7]) * 4]];
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
    // Max reduction over n and h with 32-bit indices: values ([1, 6, 1, 7]) into buffer 5,
    // indices into 4.
    let cd = f32_tensor(&[1, 6, 1, 7], false);
    let mut rd = null_mut();
    ok(cudnnCreateReduceTensorDescriptor(&mut rd));
    ok(cudnnSetReduceTensorDescriptor(rd, CUDNN_REDUCE_TENSOR_MAX, CUDNN_DATA_FLOAT, 0, CUDNN_REDUCE_TENSOR_FLATTENED_INDICES, CUDNN_32BIT_INDICES));
    same_on_both("max reduction with indices", &inputs, &[4, 5], 0.0, None, |h, p| cudnnReduceTensor(h, rd, p[4], 42 * 4, null_mut(), 0, sc(&one), t, p[0], sc(&zero), cd, p[5]));
}

#[test]
fn batchnorm_on_the_gpu() {
    let _ = start("batchnorm_on_the_gpu");
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

/// A backend graph of `ops` on handle `h`: heuristics mode A, the first full-precision
/// configuration, its plan, executed on `ptrs` by `uids` (no workspace: the handle's own).
fn run_backend(h: cudnnHandle_t, ops: &[&common::backend::B], uids: &[i64], ptrs: &[*mut c_void]) -> Status {
    use common::backend::*;
    let graph = op_graph(h, ops);
    let cfgs = heuristics(&graph, ferrodnn_cudnn::backend::attrs::HEUR_MODE_A);
    let plan = plan(h, full_precision(&cfgs));
    let pack = pack(uids, ptrs, null_mut());
    ferrodnn_cudnn::backend::cudnnBackendExecute(h, plan.0, pack.0)
}

#[test]
fn backend_graphs_and_lrn_on_the_gpu() {
    use common::backend::*;
    use ferrodnn_cudnn::backend::attrs::*;
    let _ = start("backend_graphs_and_lrn_on_the_gpu");
    // Conv + bias + relu, channels-last.
    let (xd, wd, bd, yd) = ([2i64, 8, 9, 9], [16i64, 8, 3, 3], [1i64, 16, 1, 1], [2i64, 16, 9, 9]);
    let n = |d: &[i64]| d.iter().product::<i64>() as usize;
    let inputs = vec![bytes(&rand(n(&xd), 1)), bytes(&rand(n(&wd), 2)), bytes(&rand(n(&bd), 3)), bytes(&rand(n(&yd), 4))];
    same_on_both("backend conv + bias + relu", &inputs, &[3], 1e-4, None, |h, p| {
        let (x, w, b) = (tensor(1, &xd, &nhwc(&xd), false), tensor(2, &wd, &nhwc(&wd), false), tensor(3, &bd, &packed(&bd), false));
        let (c, z, y) = (tensor(100, &yd, &nhwc(&yd), true), tensor(101, &yd, &nhwc(&yd), true), tensor(4, &yd, &nhwc(&yd), false));
        let conv = B::new(CONVOLUTION)
            .int(CONVOLUTION_COMP_TYPE, T_DATA_TYPE, CUDNN_DATA_FLOAT)
            .int(CONVOLUTION_CONV_MODE, T_CONVOLUTION_MODE, CUDNN_CROSS_CORRELATION)
            .i64s(CONVOLUTION_SPATIAL_DIMS, &[2])
            .i64s(CONVOLUTION_PRE_PADDINGS, &[1, 1])
            .i64s(CONVOLUTION_POST_PADDINGS, &[1, 1])
            .i64s(CONVOLUTION_FILTER_STRIDES, &[1, 1])
            .i64s(CONVOLUTION_DILATIONS, &[1, 1])
            .fin();
        let fprop = B::new(OP_CONV_FORWARD).descs(OP_CONV_FWD_X, &[&x]).descs(OP_CONV_FWD_W, &[&w]).descs(OP_CONV_FWD_Y, &[&c]).descs(OP_CONV_FWD_CONV_DESC, &[&conv]).fin();
        let add = pw_op(&pw_desc(pw::ADD), &c, Some(&b), &z);
        let relu = pw_op(&pw_desc(pw::RELU_FWD), &z, None, &y);
        run_backend(h, &[&fprop, &add, &relu], &[1, 2, 3, 4], &p[..4])
    });
    // Layernorm training with a by-value epsilon.
    let (xd, sd, md) = ([8i64, 64, 1, 1], [1i64, 64, 1, 1], [8i64, 1, 1, 1]);
    let inputs = vec![bytes(&rand(n(&xd), 5)), bytes(&rand(n(&sd), 6)), bytes(&rand(n(&sd), 7)), bytes(&rand(n(&xd), 8)), bytes(&rand(n(&md), 9)), bytes(&rand(n(&md), 10))];
    same_on_both("backend layernorm", &inputs, &[3, 4, 5], 1e-4, None, |h, p| {
        let eps_value = 1e-3f32;
        let (x, s, b, e) = (tensor(1, &xd, &packed(&xd), false), tensor(2, &sd, &packed(&sd), false), tensor(3, &sd, &packed(&sd), false), scalar(9));
        let (y, m, v) = (tensor(4, &xd, &packed(&xd), false), tensor(5, &md, &packed(&md), false), tensor(6, &md, &packed(&md), false));
        let op = B::new(OP_NORM_FORWARD)
            .int(OP_NORM_FWD_MODE, T_NORM_MODE, LAYER_NORM)
            .int(OP_NORM_FWD_PHASE, T_NORM_FWD_PHASE, NORM_FWD_TRAINING)
            .descs(OP_NORM_FWD_XDESC, &[&x])
            .descs(OP_NORM_FWD_SCALE_DESC, &[&s])
            .descs(OP_NORM_FWD_BIAS_DESC, &[&b])
            .descs(OP_NORM_FWD_EPSILON_DESC, &[&e])
            .descs(OP_NORM_FWD_YDESC, &[&y])
            .descs(OP_NORM_FWD_MEAN_DESC, &[&m])
            .descs(OP_NORM_FWD_INV_VARIANCE_DESC, &[&v])
            .fin();
        let eps_ptr = &eps_value as *const f32 as *mut c_void;
        run_backend(h, &[&op], &[1, 2, 3, 4, 5, 6, 9], &[p[0], p[1], p[2], p[3], p[4], p[5], eps_ptr])
    });
    // Causal attention with statistics (the frontend's unified SDPA_FWD with its subgraph).
    let (qd, kd, sd) = ([2i64, 2, 16, 32], [2i64, 2, 24, 32], [2i64, 2, 16, 1]);
    let sc_d = [2i64, 2, 16, 24];
    let inputs = vec![bytes(&rand(n(&qd), 11)), bytes(&rand(n(&kd), 12)), bytes(&rand(n(&kd), 13)), bytes(&rand(n(&qd), 14)), bytes(&rand(n(&sd), 15))];
    same_on_both("backend causal attention", &inputs, &[3, 4], 2e-3, None, |h, p| {
        let (q, k, v, o, st) = (
            tensor(1, &qd, &packed(&qd), false),
            tensor(2, &kd, &packed(&kd), false),
            tensor(3, &kd, &packed(&kd), false),
            tensor(4, &qd, &packed(&qd), false),
            tensor(5, &sd, &packed(&sd), false),
        );
        let (score, fill, masked) = (tensor(900, &sc_d, &packed(&sc_d), true), scalar(901), tensor(902, &sc_d, &packed(&sc_d), true));
        let mask = B::new(OP_DIAGONAL_BAND_MASK).descs(3000, &[&score]).descs(3005, &[&fill]).descs(3006, &[&masked]).int(3007, T_POINTWISE_MODE, pw::CMP_GE).fin();
        let sub = B::new(OPERATIONGRAPH).descs(OPERATIONGRAPH_OPS, &[&mask]).fin();
        let (pt, stt) = (tensor(910, &sc_d, &packed(&sc_d), true), tensor(911, &sc_d, &packed(&sc_d), true));
        let softmax = B::new(OP_SOFTMAX).descs(3100, &[&pt]).descs(3101, &[&stt]).descs(3102, &[&st]).fin();
        let sdpa = B::new(OP_SDPA_FWD)
            .descs(2800, &[&q])
            .descs(2801, &[&k])
            .descs(2802, &[&v])
            .descs(2803, &[&o])
            .descs(2811, &[&sub])
            .i64s(2812, &[900])
            .i64s(2813, &[902])
            .descs(2814, &[&softmax])
            .fin();
        run_backend(h, &[&sdpa, &softmax], &[1, 2, 3, 4, 5], &p[..5])
    });
    // Cross-channel LRN forward and backward (legacy calls), channels-last.
    let dims = [2, 7, 5, 6];
    let t = f32_tensor(&dims, true);
    let mut d = null_mut();
    ok(ferrodnn_cudnn::lrn::cudnnCreateLRNDescriptor(&mut d));
    ok(ferrodnn_cudnn::lrn::cudnnSetLRNDescriptor(d, 5, 0.8, 0.75, 1.5));
    let total = count(&dims);
    let inputs = vec![bytes(&rand(total, 16)), bytes(&rand(total, 17)), bytes(&rand(total, 18)), bytes(&rand(total, 19))];
    let (one, zero) = (1.0f32, 0.0f32);
    same_on_both("lrn forward", &inputs, &[1], 1e-4, None, |h, p| ferrodnn_cudnn::lrn::cudnnLRNCrossChannelForward(h, d, 0, sc(&one), t, p[0], sc(&zero), t, p[1]));
    same_on_both("lrn backward", &inputs, &[3], 1e-4, None, |h, p| {
        ferrodnn_cudnn::lrn::cudnnLRNCrossChannelBackward(h, d, 0, sc(&one), t, p[1], t, p[2], t, p[0], sc(&zero), t, p[3])
    });
    ok(ferrodnn_cudnn::lrn::cudnnDestroyLRNDescriptor(d));
}
