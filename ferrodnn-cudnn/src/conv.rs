//! Convolutions: forward, backward data, backward filter, backward bias, bias + activation
//! forward, and the algorithm calls (heuristic, find, max count, workspace size).
//!
//! ferrodnn picks its own kernels for a convolution, so every cuDNN algorithm number runs the
//! same plan: the algorithm calls report one algorithm per direction (forward
//! IMPLICIT_PRECOMP_GEMM, backward data and filter ALGO_1) with the plan's workspace size,
//! determinism and math type; the find calls time it (FindEx on the caller's buffers, Find on
//! buffers of its own), the heuristic ones report a time of -1 (not measured).

use crate::api::*;
use crate::desc::{activation, conv, filter, tensor, ConvDescriptor, FilterDescriptor, TensorDescriptor};
use crate::exec::{self, execute, new_graph, plan, Call, Scaling};
use crate::handle::{handle, HandleState};
use crate::ops::activation_forward_node;
use crate::types::*;
use ferrodnn::{Plan, PlanPolicy};
use std::ffi::c_void;
use std::sync::Arc;

const X: i64 = 1;
const W: i64 = 2;
const Y: i64 = 3;
const Z: i64 = 4;
const BIAS: i64 = 5;
const ALPHA2: i64 = 6;

/// Which way a convolution call goes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dir {
    Fwd,
    BwdData,
    BwdFilter,
}

impl Dir {
    fn algo_count(self) -> i32 {
        match self {
            Dir::Fwd => CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
            Dir::BwdData => CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
            Dir::BwdFilter => CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
        }
    }
    fn reported_algo(self) -> i32 {
        match self {
            Dir::Fwd => CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
            Dir::BwdData => CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
            Dir::BwdFilter => CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
        }
    }
}

/// The tensors of one convolution problem, checked against each other: `x` the image (or dx),
/// `w` the filter (or dw), `y` the output (or dy).
#[derive(Clone, Debug)]
pub struct Problem {
    pub x: TensorDescriptor,
    pub w: FilterDescriptor,
    pub c: ConvDescriptor,
    pub y: TensorDescriptor,
}

impl Problem {
    pub fn new(x: TensorDescriptor, w: FilterDescriptor, c: ConvDescriptor, y: TensorDescriptor) -> R<Problem> {
        let want = c.output_dims(&x.dims, &w)?;
        if y.dims != want {
            return Err(ApiError::new(
                CUDNN_STATUS_BAD_PARAM,
                format!("the output tensor has dims {:?} but convolving {:?} by the filter {:?} gives {want:?}", y.dims, x.dims, w.dims),
            ));
        }
        for (name, dt) in [("x", x.dt()), ("w", w.dt()), ("y", y.dt())] {
            if !dt.is_float() {
                return Err(ApiError::new(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, format!("`{name}` is {dt}; ferrodnn's legacy convolutions take float types")));
            }
        }
        if x.dt_raw != w.dt_raw {
            return Err(bad(format!("the image is {} but the filter is {}; they must be of one type", x.dt(), w.dt())));
        }
        Ok(Problem { x, w, c, y })
    }

    fn key(&self, dir: Dir, s: &Scaling) -> String {
        format!("conv{dir:?}|{:?}|{:?}|{:?}|{:?}|{}", self.x, self.w, self.c, self.y, s.tag())
    }

    fn policy(&self) -> PlanPolicy {
        PlanPolicy { no_reduced_precision: self.c.math == CUDNN_FMA_MATH, ..Default::default() }
    }

    fn double(&self) -> bool {
        self.x.double()
    }

    /// The plan of one direction with scaling `s`.
    fn plan(&self, h: &HandleState, dir: Dir, s: &Scaling) -> R<Arc<Plan>> {
        let p = self.clone();
        let s = *s;
        plan(h, &self.key(dir, &s), self.policy(), move || {
            let mut g = new_graph("cudnn_convolution", p.double());
            let attrs = p.c.attrs();
            let filter = ferrodnn::TensorDesc::new("w", &p.w.dims, p.w.dt()).with_strides(&p.w.strides()).with_uid(W);
            match dir {
                Dir::Fwd => {
                    let x = g.tensor(p.x.fd("x", X));
                    let wt = g.tensor(filter);
                    let r = g.conv_fprop(x, wt, attrs);
                    s.build(&mut g, r, &p.y, Y);
                }
                Dir::BwdData => {
                    let dy = g.tensor(p.y.fd("dy", Y));
                    let wt = g.tensor(filter);
                    let r = g.conv_dgrad(dy, wt, &p.x.dims, attrs);
                    s.build(&mut g, r, &p.x, X);
                }
                Dir::BwdFilter => {
                    let x = g.tensor(p.x.fd("x", X));
                    let dy = g.tensor(p.y.fd("dy", Y));
                    let r = g.conv_wgrad(dy, x, &p.w.dims, attrs);
                    s.build(&mut g, r, &p.w.as_tensor(), W);
                }
            }
            Ok(g)
        })
    }
}

fn plain(double: bool) -> Scaling {
    Scaling { alpha: 1.0, beta: 0.0, double }
}

fn check_algo(dir: Dir, algo: i32) -> R<()> {
    if !(0..dir.algo_count()).contains(&algo) {
        // cuDNN answers an algorithm number it does not know as unsupported, not as a bad parameter.
        return Err(unsupported(format!("algo {algo} is not an algorithm of this direction (0 to {})", dir.algo_count() - 1)));
    }
    Ok(())
}

/// Runs one direction: the output is `x` (BwdData), `w` (BwdFilter) or `y` (Fwd).
#[allow(clippy::too_many_arguments)]
fn run(h: cudnnHandle_t, p: Problem, dir: Dir, algo: i32, alpha: *const c_void, beta: *const c_void, ptrs: [*const c_void; 3], ws: (usize, usize)) -> R<()> {
    let h = handle(h)?;
    check_algo(dir, algo)?;
    // SAFETY: alpha and beta are host scaling values (the caller's contract; null is refused).
    let s = unsafe { Scaling::read(alpha, beta, p.double()) }?;
    let plan = p.plan(&h, dir, &s)?;
    let mut call = Call { workspace: ws, ..Default::default() };
    let [xp, wp, yp] = ptrs;
    match dir {
        Dir::Fwd => {
            call.input(X, xp, p.x.bytes(), "x")?;
            call.input(W, wp, p.w.bytes(), "w")?;
            s.feed(&mut call, Y, yp as *mut c_void, p.y.bytes(), "y")?;
        }
        Dir::BwdData => {
            call.input(W, wp, p.w.bytes(), "w")?;
            call.input(Y, yp, p.y.bytes(), "dy")?;
            s.feed(&mut call, X, xp as *mut c_void, p.x.bytes(), "dx")?;
        }
        Dir::BwdFilter => {
            call.input(X, xp, p.x.bytes(), "x")?;
            call.input(Y, yp, p.y.bytes(), "dy")?;
            s.feed(&mut call, W, wp as *mut c_void, p.w.bytes(), "dw")?;
        }
    }
    execute(&h, &plan, &call)
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnConvolutionForward(
    h: cudnnHandle_t,
    alpha: *const c_void,
    x_desc: cudnnTensorDescriptor_t,
    x: *const c_void,
    w_desc: cudnnFilterDescriptor_t,
    w: *const c_void,
    conv_desc: cudnnConvolutionDescriptor_t,
    algo: i32,
    workspace: *mut c_void,
    workspace_bytes: usize,
    beta: *const c_void,
    y_desc: cudnnTensorDescriptor_t,
    y: *mut c_void,
) -> Status {
    guard("cudnnConvolutionForward", || {
        let p = Problem::new(tensor(x_desc, "xDesc")?, filter(w_desc, "wDesc")?, conv(conv_desc, "convDesc")?, tensor(y_desc, "yDesc")?)?;
        run(h, p, Dir::Fwd, algo, alpha, beta, [x, w, y], (workspace as usize, workspace_bytes))
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnConvolutionBackwardData(
    h: cudnnHandle_t,
    alpha: *const c_void,
    w_desc: cudnnFilterDescriptor_t,
    w: *const c_void,
    dy_desc: cudnnTensorDescriptor_t,
    dy: *const c_void,
    conv_desc: cudnnConvolutionDescriptor_t,
    algo: i32,
    workspace: *mut c_void,
    workspace_bytes: usize,
    beta: *const c_void,
    dx_desc: cudnnTensorDescriptor_t,
    dx: *mut c_void,
) -> Status {
    guard("cudnnConvolutionBackwardData", || {
        let p = Problem::new(tensor(dx_desc, "dxDesc")?, filter(w_desc, "wDesc")?, conv(conv_desc, "convDesc")?, tensor(dy_desc, "dyDesc")?)?;
        run(h, p, Dir::BwdData, algo, alpha, beta, [dx as *const c_void, w, dy], (workspace as usize, workspace_bytes))
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnConvolutionBackwardFilter(
    h: cudnnHandle_t,
    alpha: *const c_void,
    x_desc: cudnnTensorDescriptor_t,
    x: *const c_void,
    dy_desc: cudnnTensorDescriptor_t,
    dy: *const c_void,
    conv_desc: cudnnConvolutionDescriptor_t,
    algo: i32,
    workspace: *mut c_void,
    workspace_bytes: usize,
    beta: *const c_void,
    dw_desc: cudnnFilterDescriptor_t,
    dw: *mut c_void,
) -> Status {
    guard("cudnnConvolutionBackwardFilter", || {
        let p = Problem::new(tensor(x_desc, "xDesc")?, filter(dw_desc, "dwDesc")?, conv(conv_desc, "convDesc")?, tensor(dy_desc, "dyDesc")?)?;
        run(h, p, Dir::BwdFilter, algo, alpha, beta, [x, dw as *const c_void, dy], (workspace as usize, workspace_bytes))
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnConvolutionBackwardBias(
    h: cudnnHandle_t,
    alpha: *const c_void,
    dy_desc: cudnnTensorDescriptor_t,
    dy: *const c_void,
    beta: *const c_void,
    db_desc: cudnnTensorDescriptor_t,
    db: *mut c_void,
) -> Status {
    guard("cudnnConvolutionBackwardBias", || {
        let h = handle(h)?;
        let (dyd, dbd) = (tensor(dy_desc, "dyDesc")?, tensor(db_desc, "dbDesc")?);
        let want: Vec<i64> = dyd.dims.iter().enumerate().map(|(i, &d)| if i == 1 { d } else { 1 }).collect();
        if dbd.dims != want {
            return Err(bad(format!("dbDesc has dims {:?} but the bias gradient of dy {:?} is {want:?}", dbd.dims, dyd.dims)));
        }
        // SAFETY: host scaling values (the caller's contract; null is refused).
        let s = unsafe { Scaling::read(alpha, beta, dyd.double()) }?;
        let key = format!("conv_bias_grad|{dyd:?}|{dbd:?}|{}", s.tag());
        let axes: Vec<usize> = (0..dyd.dims.len()).filter(|&a| a != 1).collect();
        let (dyc, dbc) = (dyd.clone(), dbd.clone());
        let plan = plan(&h, &key, PlanPolicy::default(), move || {
            let mut g = new_graph("cudnn_convolution_backward_bias", dyc.double());
            let t = g.tensor(dyc.fd("dy", Y));
            let r = g.reduce_sum(t, &axes);
            s.build(&mut g, r, &dbc, BIAS);
            Ok(g)
        })?;
        let mut call = Call::default();
        call.input(Y, dy, dyd.bytes(), "dy")?;
        s.feed(&mut call, BIAS, db, dbd.bytes(), "db")?;
        execute(&h, &plan, &call)
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnConvolutionBiasActivationForward(
    h: cudnnHandle_t,
    alpha1: *const c_void,
    x_desc: cudnnTensorDescriptor_t,
    x: *const c_void,
    w_desc: cudnnFilterDescriptor_t,
    w: *const c_void,
    conv_desc: cudnnConvolutionDescriptor_t,
    algo: i32,
    workspace: *mut c_void,
    workspace_bytes: usize,
    alpha2: *const c_void,
    z_desc: cudnnTensorDescriptor_t,
    z: *const c_void,
    bias_desc: cudnnTensorDescriptor_t,
    bias: *const c_void,
    act_desc: cudnnActivationDescriptor_t,
    y_desc: cudnnTensorDescriptor_t,
    y: *mut c_void,
) -> Status {
    guard("cudnnConvolutionBiasActivationForward", || {
        let h = handle(h)?;
        let p = Problem::new(tensor(x_desc, "xDesc")?, filter(w_desc, "wDesc")?, conv(conv_desc, "convDesc")?, tensor(y_desc, "yDesc")?)?;
        check_algo(Dir::Fwd, algo)?;
        let (zd, bd, act) = (tensor(z_desc, "zDesc")?, tensor(bias_desc, "biasDesc")?, activation(act_desc, "activationDesc")?);
        if zd.dims != p.y.dims {
            return Err(bad(format!("zDesc has dims {:?} but y has {:?}; they must match", zd.dims, p.y.dims)));
        }
        let want: Vec<i64> = p.y.dims.iter().enumerate().map(|(i, &d)| if i == 1 { d } else { 1 }).collect();
        if bd.dims != want {
            return Err(bad(format!("biasDesc has dims {:?} but the bias of y {:?} must be {want:?}", bd.dims, p.y.dims)));
        }
        let double = p.double();
        // SAFETY: host scaling values (the caller's contract; null is refused).
        let (a1, a2) = unsafe { (read_scalar(alpha1, double, "alpha1")?, read_scalar(alpha2, double, "alpha2")?) };
        let s1 = Scaling { alpha: a1, beta: 0.0, double };
        let with_z = a2 != 0.0;
        let key = format!("conv_bias_act|{}|{zd:?}|{bd:?}|{act:?}|{with_z}", p.key(Dir::Fwd, &s1));
        let (pc, zc, bc, ac) = (p.clone(), zd.clone(), bd.clone(), act.clone());
        let plan = plan(&h, &key, p.policy(), move || {
            let mut g = new_graph("cudnn_convolution_bias_activation", double);
            let sdt = exec::scaling_type(double);
            let xt = g.tensor(pc.x.fd("x", X));
            let wt = g.tensor(ferrodnn::TensorDesc::new("w", &pc.w.dims, pc.w.dt()).with_strides(&pc.w.strides()).with_uid(W));
            let mut t = g.conv_fprop(xt, wt, pc.c.attrs());
            if s1.tag() != "plain" {
                let a = exec::scalar_tensor(&mut g, "alpha1", Y + 2000, sdt);
                t = g.mul(t, a);
            }
            if with_z {
                let zt = g.tensor(zc.fd("z", Z));
                let a = exec::scalar_tensor(&mut g, "alpha2", ALPHA2, sdt);
                let zs = g.mul(zt, a);
                t = g.add(t, zs);
            }
            let bt = g.tensor(bc.fd("bias", BIAS));
            t = g.bias(t, bt);
            let out = activation_forward_node(&mut g, t, &ac)?;
            plain(double).build(&mut g, out, &pc.y, Y);
            Ok(g)
        })?;
        let mut call = Call { workspace: (workspace as usize, workspace_bytes), ..Default::default() };
        call.input(X, x, p.x.bytes(), "x")?;
        call.input(W, w, p.w.bytes(), "w")?;
        call.input(BIAS, bias, bd.bytes(), "bias")?;
        if s1.tag() != "plain" {
            call.scalar(Y + 2000, a1, exec::scaling_type(double));
        }
        if with_z {
            call.input(Z, z, zd.bytes(), "z")?;
            call.scalar(ALPHA2, a2, exec::scaling_type(double));
        }
        call.output(Y, y, p.y.bytes(), "y")?;
        execute(&h, &plan, &call)
    })
}

// ------------------------------------------------------------------------------------------
// Algorithm calls
// ------------------------------------------------------------------------------------------

fn perf(p: &Problem, dir: Dir, plan: &Plan, time: f32) -> AlgoPerf {
    let math = if plan.notes.reduced_precision { CUDNN_TENSOR_OP_MATH } else { p.c.math };
    AlgoPerf {
        algo: dir.reported_algo(),
        status: CUDNN_STATUS_SUCCESS,
        time,
        memory: plan.workspace_size(),
        determinism: if plan.notes.deterministic { CUDNN_DETERMINISTIC } else { CUDNN_NON_DETERMINISTIC },
        math_type: math,
        reserved: [0; 3],
    }
}

/// Answers a heuristic or find call with our one algorithm: its perf entry in `results[0]`.
///
/// # Safety
/// `returned` must be null (refused) or writable; `results` must be null (refused) or hold
/// `requested` writable entries.
unsafe fn answer(p: &Problem, dir: Dir, plan: &Plan, time: f32, requested: i32, returned: *mut i32, results: *mut AlgoPerf) -> R<()> {
    if requested < 0 {
        return Err(bad(format!("requestedAlgoCount must not be negative, got {requested}")));
    }
    if requested == 0 {
        // As cuDNN: nothing asked, nothing written, success.
        // SAFETY: forwarded from the caller (null refused by write_out).
        return unsafe { write_out(returned, "returnedAlgoCount", 0) };
    }
    non_null(results, "perfResults")?;
    // SAFETY: forwarded from the caller; results holds at least one entry (requested >= 1).
    unsafe {
        write_out(returned, "returnedAlgoCount", 1)?;
        results.write_unaligned(perf(p, dir, plan, time));
    }
    Ok(())
}

fn problem_fwd(x: cudnnTensorDescriptor_t, w: cudnnFilterDescriptor_t, c: cudnnConvolutionDescriptor_t, y: cudnnTensorDescriptor_t) -> R<Problem> {
    Problem::new(tensor(x, "xDesc")?, filter(w, "wDesc")?, conv(c, "convDesc")?, tensor(y, "yDesc")?)
}
fn problem_bwd_data(w: cudnnFilterDescriptor_t, dy: cudnnTensorDescriptor_t, c: cudnnConvolutionDescriptor_t, dx: cudnnTensorDescriptor_t) -> R<Problem> {
    Problem::new(tensor(dx, "dxDesc")?, filter(w, "wDesc")?, conv(c, "convDesc")?, tensor(dy, "dyDesc")?)
}
fn problem_bwd_filter(x: cudnnTensorDescriptor_t, dy: cudnnTensorDescriptor_t, c: cudnnConvolutionDescriptor_t, dw: cudnnFilterDescriptor_t) -> R<Problem> {
    Problem::new(tensor(x, "xDesc")?, filter(dw, "dwDesc")?, conv(c, "convDesc")?, tensor(dy, "dyDesc")?)
}

/// A heuristic answer: the plan is built, not run.
fn heuristic(h: cudnnHandle_t, p: R<Problem>, dir: Dir, requested: i32, returned: *mut i32, results: *mut AlgoPerf) -> R<()> {
    let h = handle(h)?;
    let p = p?;
    let plan = p.plan(&h, dir, &plain(p.double()))?;
    // SAFETY: the caller's out pointers (checked not null inside).
    unsafe { answer(&p, dir, &plan, -1.0, requested, returned, results) }
}

/// A (non-Ex) find answer: the plan run once and timed on buffers of the library's own (zeros,
/// in host or device memory as the handle takes), as cuDNN's Find allocates its own.
fn find(h: cudnnHandle_t, p: R<Problem>, dir: Dir, requested: i32, returned: *mut i32, results: *mut AlgoPerf) -> R<()> {
    let state = handle(h)?;
    let p = p?;
    let sizes = [p.x.bytes(), p.w.bytes(), p.y.bytes()];
    if state.gpu {
        let dev = state.fd.cuda_device().ok_or_else(|| ApiError::new(CUDNN_STATUS_INTERNAL_ERROR, "the GPU handle has no device"))?.clone();
        let mut bufs = Vec::new();
        for b in sizes {
            bufs.push(dev.alloc_zeroed(b).map_err(|e| ApiError::new(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, e.to_string()))?);
        }
        // The zeroing runs on the legacy default stream and may not have finished when this
        // returns, while the plan runs on the handle's stream, which may be a non-blocking one
        // that does not wait for it.
        dev.synchronize()?;
        let ptrs = [0, 1, 2].map(|i| bufs[i].device_ptr() as usize as *const c_void);
        find_ex(h, Ok(p), dir, ptrs, (0, 0), requested, returned, results)
    } else {
        let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&b| vec![0u8; b]).collect();
        let ptrs = [0, 1, 2].map(|i| bufs[i].as_mut_ptr() as *const c_void);
        find_ex(h, Ok(p), dir, ptrs, (0, 0), requested, returned, results)
    }
}

/// A FindEx answer: the plan run once on the caller's buffers and timed (the stream synchronized
/// around it on a GPU).
#[allow(clippy::too_many_arguments)]
fn find_ex(h: cudnnHandle_t, p: R<Problem>, dir: Dir, ptrs: [*const c_void; 3], ws: (usize, usize), requested: i32, returned: *mut i32, results: *mut AlgoPerf) -> R<()> {
    let state = handle(h)?;
    let p = p?;
    let s = plain(p.double());
    let plan = p.plan(&state, dir, &s)?;
    let one: [u8; 8] = 1f64.to_ne_bytes();
    let one32: [u8; 4] = 1f32.to_ne_bytes();
    let zero = [0u8; 8];
    let alpha = if p.double() { one.as_ptr() } else { one32.as_ptr() } as *const c_void;
    let sync = || -> R<()> {
        if let Some(st) = state.fd.stream() {
            st.synchronize()?;
        }
        Ok(())
    };
    sync()?;
    let start = std::time::Instant::now();
    run(h, p.clone(), dir, dir.reported_algo(), alpha, zero.as_ptr() as *const c_void, ptrs, ws)?;
    sync()?;
    let ms = start.elapsed().as_secs_f32() * 1000.0;
    // SAFETY: the caller's out pointers (checked not null inside).
    unsafe { answer(&p, dir, &plan, ms, requested, returned, results) }
}

fn workspace_size(h: cudnnHandle_t, p: R<Problem>, dir: Dir, algo: i32, size: *mut usize) -> R<()> {
    let h = handle(h)?;
    let p = p?;
    check_algo(dir, algo)?;
    let plan = p.plan(&h, dir, &plain(p.double()))?;
    // SAFETY: the caller's out pointer (checked not null).
    unsafe { write_out(size, "sizeInBytes", plan.workspace_size()) }
}

fn max_count(h: cudnnHandle_t, count: *mut i32) -> R<()> {
    handle(h)?;
    // SAFETY: the caller's out pointer (checked not null).
    unsafe { write_out(count, "count", 1) }
}

#[no_mangle]
pub extern "C" fn cudnnGetConvolutionForwardAlgorithmMaxCount(h: cudnnHandle_t, count: *mut i32) -> Status {
    guard("cudnnGetConvolutionForwardAlgorithmMaxCount", || max_count(h, count))
}
#[no_mangle]
pub extern "C" fn cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h: cudnnHandle_t, count: *mut i32) -> Status {
    guard("cudnnGetConvolutionBackwardDataAlgorithmMaxCount", || max_count(h, count))
}
#[no_mangle]
pub extern "C" fn cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h: cudnnHandle_t, count: *mut i32) -> Status {
    guard("cudnnGetConvolutionBackwardFilterAlgorithmMaxCount", || max_count(h, count))
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnGetConvolutionForwardAlgorithm_v7(
    h: cudnnHandle_t,
    x: cudnnTensorDescriptor_t,
    w: cudnnFilterDescriptor_t,
    c: cudnnConvolutionDescriptor_t,
    y: cudnnTensorDescriptor_t,
    requested: i32,
    returned: *mut i32,
    results: *mut AlgoPerf,
) -> Status {
    guard("cudnnGetConvolutionForwardAlgorithm_v7", || heuristic(h, problem_fwd(x, w, c, y), Dir::Fwd, requested, returned, results))
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnFindConvolutionForwardAlgorithm(
    h: cudnnHandle_t,
    x: cudnnTensorDescriptor_t,
    w: cudnnFilterDescriptor_t,
    c: cudnnConvolutionDescriptor_t,
    y: cudnnTensorDescriptor_t,
    requested: i32,
    returned: *mut i32,
    results: *mut AlgoPerf,
) -> Status {
    guard("cudnnFindConvolutionForwardAlgorithm", || find(h, problem_fwd(x, w, c, y), Dir::Fwd, requested, returned, results))
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnFindConvolutionForwardAlgorithmEx(
    h: cudnnHandle_t,
    x_desc: cudnnTensorDescriptor_t,
    x: *const c_void,
    w_desc: cudnnFilterDescriptor_t,
    w: *const c_void,
    c: cudnnConvolutionDescriptor_t,
    y_desc: cudnnTensorDescriptor_t,
    y: *mut c_void,
    requested: i32,
    returned: *mut i32,
    results: *mut AlgoPerf,
    workspace: *mut c_void,
    workspace_bytes: usize,
) -> Status {
    guard("cudnnFindConvolutionForwardAlgorithmEx", || {
        find_ex(h, problem_fwd(x_desc, w_desc, c, y_desc), Dir::Fwd, [x, w, y as *const c_void], (workspace as usize, workspace_bytes), requested, returned, results)
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnGetConvolutionForwardWorkspaceSize(
    h: cudnnHandle_t,
    x: cudnnTensorDescriptor_t,
    w: cudnnFilterDescriptor_t,
    c: cudnnConvolutionDescriptor_t,
    y: cudnnTensorDescriptor_t,
    algo: i32,
    size: *mut usize,
) -> Status {
    guard("cudnnGetConvolutionForwardWorkspaceSize", || workspace_size(h, problem_fwd(x, w, c, y), Dir::Fwd, algo, size))
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnGetConvolutionBackwardDataAlgorithm_v7(
    h: cudnnHandle_t,
    w: cudnnFilterDescriptor_t,
    dy: cudnnTensorDescriptor_t,
    c: cudnnConvolutionDescriptor_t,
    dx: cudnnTensorDescriptor_t,
    requested: i32,
    returned: *mut i32,
    results: *mut AlgoPerf,
) -> Status {
    guard("cudnnGetConvolutionBackwardDataAlgorithm_v7", || heuristic(h, problem_bwd_data(w, dy, c, dx), Dir::BwdData, requested, returned, results))
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnFindConvolutionBackwardDataAlgorithm(
    h: cudnnHandle_t,
    w: cudnnFilterDescriptor_t,
    dy: cudnnTensorDescriptor_t,
    c: cudnnConvolutionDescriptor_t,
    dx: cudnnTensorDescriptor_t,
    requested: i32,
    returned: *mut i32,
    results: *mut AlgoPerf,
) -> Status {
    guard("cudnnFindConvolutionBackwardDataAlgorithm", || find(h, problem_bwd_data(w, dy, c, dx), Dir::BwdData, requested, returned, results))
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnFindConvolutionBackwardDataAlgorithmEx(
    h: cudnnHandle_t,
    w_desc: cudnnFilterDescriptor_t,
    w: *const c_void,
    dy_desc: cudnnTensorDescriptor_t,
    dy: *const c_void,
    c: cudnnConvolutionDescriptor_t,
    dx_desc: cudnnTensorDescriptor_t,
    dx: *mut c_void,
    requested: i32,
    returned: *mut i32,
    results: *mut AlgoPerf,
    workspace: *mut c_void,
    workspace_bytes: usize,
) -> Status {
    guard("cudnnFindConvolutionBackwardDataAlgorithmEx", || {
        find_ex(h, problem_bwd_data(w_desc, dy_desc, c, dx_desc), Dir::BwdData, [dx as *const c_void, w, dy], (workspace as usize, workspace_bytes), requested, returned, results)
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnGetConvolutionBackwardDataWorkspaceSize(
    h: cudnnHandle_t,
    w: cudnnFilterDescriptor_t,
    dy: cudnnTensorDescriptor_t,
    c: cudnnConvolutionDescriptor_t,
    dx: cudnnTensorDescriptor_t,
    algo: i32,
    size: *mut usize,
) -> Status {
    guard("cudnnGetConvolutionBackwardDataWorkspaceSize", || workspace_size(h, problem_bwd_data(w, dy, c, dx), Dir::BwdData, algo, size))
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    h: cudnnHandle_t,
    x: cudnnTensorDescriptor_t,
    dy: cudnnTensorDescriptor_t,
    c: cudnnConvolutionDescriptor_t,
    dw: cudnnFilterDescriptor_t,
    requested: i32,
    returned: *mut i32,
    results: *mut AlgoPerf,
) -> Status {
    guard("cudnnGetConvolutionBackwardFilterAlgorithm_v7", || heuristic(h, problem_bwd_filter(x, dy, c, dw), Dir::BwdFilter, requested, returned, results))
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnFindConvolutionBackwardFilterAlgorithm(
    h: cudnnHandle_t,
    x: cudnnTensorDescriptor_t,
    dy: cudnnTensorDescriptor_t,
    c: cudnnConvolutionDescriptor_t,
    dw: cudnnFilterDescriptor_t,
    requested: i32,
    returned: *mut i32,
    results: *mut AlgoPerf,
) -> Status {
    guard("cudnnFindConvolutionBackwardFilterAlgorithm", || find(h, problem_bwd_filter(x, dy, c, dw), Dir::BwdFilter, requested, returned, results))
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnFindConvolutionBackwardFilterAlgorithmEx(
    h: cudnnHandle_t,
    x_desc: cudnnTensorDescriptor_t,
    x: *const c_void,
    dy_desc: cudnnTensorDescriptor_t,
    dy: *const c_void,
    c: cudnnConvolutionDescriptor_t,
    dw_desc: cudnnFilterDescriptor_t,
    dw: *mut c_void,
    requested: i32,
    returned: *mut i32,
    results: *mut AlgoPerf,
    workspace: *mut c_void,
    workspace_bytes: usize,
) -> Status {
    guard("cudnnFindConvolutionBackwardFilterAlgorithmEx", || {
        find_ex(
            h,
            problem_bwd_filter(x_desc, dy_desc, c, dw_desc),
            Dir::BwdFilter,
            [x, dw as *const c_void, dy],
            (workspace as usize, workspace_bytes),
            requested,
            returned,
            results,
        )
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnGetConvolutionBackwardFilterWorkspaceSize(
    h: cudnnHandle_t,
    x: cudnnTensorDescriptor_t,
    dy: cudnnTensorDescriptor_t,
    c: cudnnConvolutionDescriptor_t,
    dw: cudnnFilterDescriptor_t,
    algo: i32,
    size: *mut usize,
) -> Status {
    guard("cudnnGetConvolutionBackwardFilterWorkspaceSize", || workspace_size(h, problem_bwd_filter(x, dy, c, dw), Dir::BwdFilter, algo, size))
}
