//! Activation, softmax and pooling (forward and backward), and the tensor arithmetic calls:
//! cudnnAddTensor, cudnnOpTensor, cudnnReduceTensor (with its size queries),
//! cudnnTransformTensor, cudnnScaleTensor, cudnnSetTensor.

use crate::api::*;
use crate::desc::{activation, data_type, pooling, tensor, ActivationDescriptor, TensorDescriptor, OP_TENSORS, REDUCES};
use crate::exec::{execute, new_graph, plan, scalar_tensor, scaling_type, Call, Scaling};
use crate::handle::handle;
use crate::types::*;
use ferrodnn::graph::ops::pointwise::PointwiseMode;
use ferrodnn::graph::ops::reduction::ReductionMode;
use ferrodnn::{Graph, PlanPolicy, TensorDesc, TensorId};
use std::ffi::c_void;

const X: i64 = 1;
const Y: i64 = 3;
const DY: i64 = 4;
const DX: i64 = 5;
const B: i64 = 6;
const ZERO: i64 = 7;
const ALPHA1: i64 = 8;
const ALPHA2: i64 = 9;
const VALUE: i64 = 10;
const INDICES: i64 = 11;

/// The forward activation of `desc` on `x`.
pub fn activation_forward_node(g: &mut Graph, x: TensorId, a: &ActivationDescriptor) -> R<TensorId> {
    let mode = match a.mode {
        CUDNN_ACTIVATION_SIGMOID => PointwiseMode::Sigmoid,
        CUDNN_ACTIVATION_RELU => PointwiseMode::Relu { lower_clip: None, upper_clip: None, negative_slope: None },
        CUDNN_ACTIVATION_TANH => PointwiseMode::Tanh,
        CUDNN_ACTIVATION_CLIPPED_RELU => PointwiseMode::Relu { lower_clip: None, upper_clip: Some(a.coef), negative_slope: None },
        CUDNN_ACTIVATION_ELU => PointwiseMode::Elu { alpha: a.coef },
        CUDNN_ACTIVATION_IDENTITY => PointwiseMode::Identity,
        CUDNN_ACTIVATION_SWISH => PointwiseMode::Swish { beta: a.swish_beta },
        m => return Err(bad(format!("activation mode {m} is not a cudnnActivationMode_t"))),
    };
    if a.mode == CUDNN_ACTIVATION_CLIPPED_RELU && a.coef < 0.0 {
        return Err(bad(format!("a clipped relu's coef (its ceiling) must be non-negative, got {}", a.coef)));
    }
    Ok(g.pointwise(mode, &[x]))
}

/// The gradient of the activation of `desc` from `dy` and the forward input `x`.
pub fn activation_backward_node(g: &mut Graph, dy: TensorId, x: TensorId, a: &ActivationDescriptor) -> R<TensorId> {
    let mode = match a.mode {
        CUDNN_ACTIVATION_SIGMOID => PointwiseMode::SigmoidBackward,
        CUDNN_ACTIVATION_RELU => PointwiseMode::ReluBackward { lower_clip: None, upper_clip: None, negative_slope: None },
        CUDNN_ACTIVATION_TANH => PointwiseMode::TanhBackward,
        CUDNN_ACTIVATION_CLIPPED_RELU => PointwiseMode::ReluBackward { lower_clip: None, upper_clip: Some(a.coef), negative_slope: None },
        CUDNN_ACTIVATION_ELU => PointwiseMode::EluBackward { alpha: a.coef },
        CUDNN_ACTIVATION_IDENTITY => return Ok(g.identity(dy)),
        CUDNN_ACTIVATION_SWISH => PointwiseMode::SwishBackward { beta: a.swish_beta },
        m => return Err(bad(format!("activation mode {m} is not a cudnnActivationMode_t"))),
    };
    Ok(g.pointwise(mode, &[dy, x]))
}

fn same_dims(a: &TensorDescriptor, an: &str, b: &TensorDescriptor, bn: &str) -> R<()> {
    if a.dims != b.dims {
        return Err(bad(format!("`{an}` has dims {:?} but `{bn}` has {:?}; they must match", a.dims, b.dims)));
    }
    Ok(())
}

fn float_tensor(t: &TensorDescriptor, name: &str) -> R<()> {
    if !t.dt().is_float() {
        return Err(ApiError::new(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, format!("`{name}` is {}; this call takes float types", t.dt())));
    }
    Ok(())
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnActivationForward(
    h: cudnnHandle_t,
    act: cudnnActivationDescriptor_t,
    alpha: *const c_void,
    x_desc: cudnnTensorDescriptor_t,
    x: *const c_void,
    beta: *const c_void,
    y_desc: cudnnTensorDescriptor_t,
    y: *mut c_void,
) -> Status {
    guard("cudnnActivationForward", || {
        let h = handle(h)?;
        let (a, xd, yd) = (activation(act, "activationDesc")?, tensor(x_desc, "xDesc")?, tensor(y_desc, "yDesc")?);
        same_dims(&xd, "xDesc", &yd, "yDesc")?;
        float_tensor(&xd, "xDesc")?;
        // SAFETY: host scaling values (the caller's contract; null is refused).
        let s = unsafe { Scaling::read(alpha, beta, yd.double()) }?;
        let key = format!("act_fwd|{a:?}|{xd:?}|{yd:?}|{}", s.tag());
        let (xc, yc) = (xd.clone(), yd.clone());
        let plan = plan(&h, &key, PlanPolicy::default(), move || {
            let mut g = new_graph("cudnn_activation_forward", yc.double());
            let xt = g.tensor(xc.fd("x", X));
            let r = activation_forward_node(&mut g, xt, &a)?;
            s.build(&mut g, r, &yc, Y);
            Ok(g)
        })?;
        let mut call = Call::default();
        call.input(X, x, xd.bytes(), "x")?;
        s.feed(&mut call, Y, y, yd.bytes(), "y")?;
        execute(&h, &plan, &call)
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnActivationBackward(
    h: cudnnHandle_t,
    act: cudnnActivationDescriptor_t,
    alpha: *const c_void,
    y_desc: cudnnTensorDescriptor_t,
    _y: *const c_void,
    dy_desc: cudnnTensorDescriptor_t,
    dy: *const c_void,
    x_desc: cudnnTensorDescriptor_t,
    x: *const c_void,
    beta: *const c_void,
    dx_desc: cudnnTensorDescriptor_t,
    dx: *mut c_void,
) -> Status {
    guard("cudnnActivationBackward", || {
        let h = handle(h)?;
        let a = activation(act, "activationDesc")?;
        let (yd, dyd, xd, dxd) = (tensor(y_desc, "yDesc")?, tensor(dy_desc, "dyDesc")?, tensor(x_desc, "xDesc")?, tensor(dx_desc, "dxDesc")?);
        same_dims(&dyd, "dyDesc", &yd, "yDesc")?;
        same_dims(&xd, "xDesc", &yd, "yDesc")?;
        same_dims(&dxd, "dxDesc", &yd, "yDesc")?;
        float_tensor(&dyd, "dyDesc")?;
        // SAFETY: host scaling values (the caller's contract; null is refused).
        let s = unsafe { Scaling::read(alpha, beta, dxd.double()) }?;
        let key = format!("act_bwd|{a:?}|{dyd:?}|{xd:?}|{dxd:?}|{}", s.tag());
        let (dyc, xc, dxc) = (dyd.clone(), xd.clone(), dxd.clone());
        let plan = plan(&h, &key, PlanPolicy::default(), move || {
            let mut g = new_graph("cudnn_activation_backward", dxc.double());
            let dyt = g.tensor(dyc.fd("dy", DY));
            let xt = g.tensor(xc.fd("x", X));
            let r = activation_backward_node(&mut g, dyt, xt, &a)?;
            s.build(&mut g, r, &dxc, DX);
            Ok(g)
        })?;
        let mut call = Call::default();
        call.input(DY, dy, dyd.bytes(), "dy")?;
        call.input(X, x, xd.bytes(), "x")?;
        s.feed(&mut call, DX, dx, dxd.bytes(), "dx")?;
        execute(&h, &plan, &call)
    })
}

// ------------------------------------------------------------------------------------------
// Softmax
// ------------------------------------------------------------------------------------------

/// The memory order (outermost first) of axes `from..` of `t`, by stride.
fn tail_order(t: &TensorDescriptor, from: usize) -> Vec<usize> {
    let mut axes: Vec<usize> = (from..t.dims.len()).collect();
    axes.sort_by(|&a, &b| t.strides[b].cmp(&t.strides[a]).then(a.cmp(&b)));
    axes
}

/// `t` with axes `from..` merged into one (in `order`), when their strides make them one run
/// of memory; `None` otherwise.
fn merge_tail(t: &TensorDescriptor, from: usize, order: &[usize]) -> Option<TensorDescriptor> {
    let live: Vec<usize> = order.iter().copied().filter(|&a| t.dims[a] > 1).collect();
    for w in live.windows(2) {
        if t.strides[w[0]] != t.strides[w[1]] * t.dims[w[1]] {
            return None;
        }
    }
    let count: i64 = order.iter().map(|&a| t.dims[a]).product();
    let stride = live.last().map_or(1, |&a| t.strides[a]);
    let mut dims = t.dims[..from].to_vec();
    let mut strides = t.strides[..from].to_vec();
    dims.push(count);
    strides.push(stride);
    Some(TensorDescriptor { set: true, dt_raw: t.dt_raw, dims, strides })
}

/// The views softmax works on, and its axis: INSTANCE mode merges every axis after the first
/// (in the memory order of the first tensor), CHANNEL mode normalizes axis 1 as it is.
fn softmax_views(mode: i32, ts: &[&TensorDescriptor]) -> R<(Vec<TensorDescriptor>, usize)> {
    if ts[0].dims.len() < 2 {
        return Err(bad(format!("softmax needs at least 2 dims ([n, c, ...]), got {:?}", ts[0].dims)));
    }
    match mode {
        CUDNN_SOFTMAX_MODE_CHANNEL => Ok((ts.iter().map(|t| (*t).clone()).collect(), 1)),
        CUDNN_SOFTMAX_MODE_INSTANCE => {
            let order = tail_order(ts[0], 1);
            let views: Option<Vec<TensorDescriptor>> = ts.iter().map(|t| merge_tail(t, 1, &order)).collect();
            let views = views.ok_or_else(|| {
                unsupported(format!(
                    "softmax over an instance needs its c, h, w, ... axes in one run of memory with one order in every tensor; strides {:?}",
                    ts.iter().map(|t| t.strides.clone()).collect::<Vec<_>>()
                ))
            })?;
            Ok((views, 1))
        }
        m => Err(bad(format!("mode {m} is not a cudnnSoftmaxMode_t"))),
    }
}

fn check_softmax_algo(algo: i32) -> R<bool> {
    match algo {
        CUDNN_SOFTMAX_FAST | CUDNN_SOFTMAX_ACCURATE => Ok(false),
        CUDNN_SOFTMAX_LOG => Ok(true),
        a => Err(bad(format!("algorithm {a} is not a cudnnSoftmaxAlgorithm_t"))),
    }
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnSoftmaxForward(
    h: cudnnHandle_t,
    algo: i32,
    mode: i32,
    alpha: *const c_void,
    x_desc: cudnnTensorDescriptor_t,
    x: *const c_void,
    beta: *const c_void,
    y_desc: cudnnTensorDescriptor_t,
    y: *mut c_void,
) -> Status {
    guard("cudnnSoftmaxForward", || {
        let h = handle(h)?;
        let log = check_softmax_algo(algo)?;
        let (xd, yd) = (tensor(x_desc, "xDesc")?, tensor(y_desc, "yDesc")?);
        same_dims(&xd, "xDesc", &yd, "yDesc")?;
        float_tensor(&xd, "xDesc")?;
        let (views, axis) = softmax_views(mode, &[&xd, &yd])?;
        // SAFETY: host scaling values (the caller's contract; null is refused).
        let s = unsafe { Scaling::read(alpha, beta, yd.double()) }?;
        let key = format!("softmax_fwd|{log}|{views:?}|{}", s.tag());
        let (xv, yv) = (views[0].clone(), views[1].clone());
        let plan = plan(&h, &key, PlanPolicy::default(), move || {
            let mut g = new_graph("cudnn_softmax_forward", yv.double());
            let xt = g.tensor(xv.fd("x", X));
            let (r, _) = g.softmax(xt, axis, log, false);
            s.build(&mut g, r, &yv, Y);
            Ok(g)
        })?;
        let mut call = Call::default();
        call.input(X, x, xd.bytes(), "x")?;
        s.feed(&mut call, Y, y, yd.bytes(), "y")?;
        execute(&h, &plan, &call)
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnSoftmaxBackward(
    h: cudnnHandle_t,
    algo: i32,
    mode: i32,
    alpha: *const c_void,
    y_desc: cudnnTensorDescriptor_t,
    y: *const c_void,
    dy_desc: cudnnTensorDescriptor_t,
    dy: *const c_void,
    beta: *const c_void,
    dx_desc: cudnnTensorDescriptor_t,
    dx: *mut c_void,
) -> Status {
    guard("cudnnSoftmaxBackward", || {
        let h = handle(h)?;
        let log = check_softmax_algo(algo)?;
        let (yd, dyd, dxd) = (tensor(y_desc, "yDesc")?, tensor(dy_desc, "dyDesc")?, tensor(dx_desc, "dxDesc")?);
        same_dims(&dyd, "dyDesc", &yd, "yDesc")?;
        same_dims(&dxd, "dxDesc", &yd, "yDesc")?;
        float_tensor(&yd, "yDesc")?;
        let (views, axis) = softmax_views(mode, &[&yd, &dyd, &dxd])?;
        // SAFETY: host scaling values (the caller's contract; null is refused).
        let s = unsafe { Scaling::read(alpha, beta, dxd.double()) }?;
        let key = format!("softmax_bwd|{log}|{views:?}|{}", s.tag());
        let (yv, dyv, dxv) = (views[0].clone(), views[1].clone(), views[2].clone());
        let plan = plan(&h, &key, PlanPolicy::default(), move || {
            let mut g = new_graph("cudnn_softmax_backward", dxv.double());
            let yt = g.tensor(yv.fd("y", Y));
            let dyt = g.tensor(dyv.fd("dy", DY));
            let r = g.softmax_backward(yt, dyt, axis, log);
            s.build(&mut g, r, &dxv, DX);
            Ok(g)
        })?;
        let mut call = Call::default();
        call.input(Y, y, yd.bytes(), "y")?;
        call.input(DY, dy, dyd.bytes(), "dy")?;
        s.feed(&mut call, DX, dx, dxd.bytes(), "dx")?;
        execute(&h, &plan, &call)
    })
}

// ------------------------------------------------------------------------------------------
// Pooling
// ------------------------------------------------------------------------------------------

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnPoolingForward(
    h: cudnnHandle_t,
    pool: cudnnPoolingDescriptor_t,
    alpha: *const c_void,
    x_desc: cudnnTensorDescriptor_t,
    x: *const c_void,
    beta: *const c_void,
    y_desc: cudnnTensorDescriptor_t,
    y: *mut c_void,
) -> Status {
    guard("cudnnPoolingForward", || {
        let h = handle(h)?;
        let (p, xd, yd) = (pooling(pool, "poolingDesc")?, tensor(x_desc, "xDesc")?, tensor(y_desc, "yDesc")?);
        let want = p.output_dims(&xd.dims)?;
        if yd.dims != want {
            return Err(bad(format!("yDesc has dims {:?} but pooling x {:?} gives {want:?}", yd.dims, xd.dims)));
        }
        // SAFETY: host scaling values (the caller's contract; null is refused).
        let s = unsafe { Scaling::read(alpha, beta, yd.double()) }?;
        let key = format!("pool_fwd|{p:?}|{xd:?}|{yd:?}|{}", s.tag());
        let (xc, yc) = (xd.clone(), yd.clone());
        let plan = plan(&h, &key, PlanPolicy::default(), move || {
            let mut g = new_graph("cudnn_pooling_forward", yc.double());
            let xt = g.tensor(xc.fd("x", X));
            let r = g.resample(xt, p.attrs());
            s.build(&mut g, r, &yc, Y);
            Ok(g)
        })?;
        let mut call = Call::default();
        call.input(X, x, xd.bytes(), "x")?;
        s.feed(&mut call, Y, y, yd.bytes(), "y")?;
        execute(&h, &plan, &call)
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnPoolingBackward(
    h: cudnnHandle_t,
    pool: cudnnPoolingDescriptor_t,
    alpha: *const c_void,
    y_desc: cudnnTensorDescriptor_t,
    _y: *const c_void,
    dy_desc: cudnnTensorDescriptor_t,
    dy: *const c_void,
    x_desc: cudnnTensorDescriptor_t,
    x: *const c_void,
    beta: *const c_void,
    dx_desc: cudnnTensorDescriptor_t,
    dx: *mut c_void,
) -> Status {
    guard("cudnnPoolingBackward", || {
        let h = handle(h)?;
        let p = pooling(pool, "poolingDesc")?;
        let (yd, dyd, xd, dxd) = (tensor(y_desc, "yDesc")?, tensor(dy_desc, "dyDesc")?, tensor(x_desc, "xDesc")?, tensor(dx_desc, "dxDesc")?);
        let want = p.output_dims(&xd.dims)?;
        if yd.dims != want || dyd.dims != want {
            return Err(bad(format!("yDesc {:?} and dyDesc {:?} must both be the pooled dims of x {:?}, {want:?}", yd.dims, dyd.dims, xd.dims)));
        }
        same_dims(&dxd, "dxDesc", &xd, "xDesc")?;
        // SAFETY: host scaling values (the caller's contract; null is refused).
        let s = unsafe { Scaling::read(alpha, beta, dxd.double()) }?;
        let key = format!("pool_bwd|{p:?}|{dyd:?}|{xd:?}|{dxd:?}|{}", s.tag());
        let (dyc, xc, dxc) = (dyd.clone(), xd.clone(), dxd.clone());
        let plan = plan(&h, &key, PlanPolicy::default(), move || {
            let mut g = new_graph("cudnn_pooling_backward", dxc.double());
            let dyt = g.tensor(dyc.fd("dy", DY));
            let xt = g.tensor(xc.fd("x", X));
            let r = g.resample_backward(dyt, xt, p.attrs());
            s.build(&mut g, r, &dxc, DX);
            Ok(g)
        })?;
        let mut call = Call::default();
        call.input(DY, dy, dyd.bytes(), "dy")?;
        call.input(X, x, xd.bytes(), "x")?;
        s.feed(&mut call, DX, dx, dxd.bytes(), "dx")?;
        execute(&h, &plan, &call)
    })
}

// ------------------------------------------------------------------------------------------
// Tensor arithmetic
// ------------------------------------------------------------------------------------------

/// Checks `a` broadcasts to `c`: the same rank, each dim equal or 1.
fn check_broadcast(a: &TensorDescriptor, an: &str, c: &TensorDescriptor, cn: &str) -> R<()> {
    if a.dims.len() != c.dims.len() || a.dims.iter().zip(&c.dims).any(|(&x, &y)| x != y && x != 1) {
        return Err(bad(format!("`{an}` has dims {:?}, which do not broadcast to `{cn}`'s {:?} (each dim must be equal or 1)", a.dims, c.dims)));
    }
    Ok(())
}

/// A node computing `t` over the dims of `to` (broadcast by adding a stride-0 zero of uid
/// [`ZERO`]), or `t` through an identity when it has them already. Returns it and whether the
/// zero is read.
fn spread(g: &mut Graph, t: TensorId, to: &TensorDescriptor) -> (TensorId, bool) {
    if g.desc(t).dims == to.dims {
        return (g.identity(t), false);
    }
    let zero = g.tensor(TensorDesc::new("zero", &to.dims, to.dt()).with_strides(&vec![0; to.dims.len()]).with_uid(ZERO));
    (g.add(t, zero), true)
}

#[no_mangle]
pub extern "C" fn cudnnAddTensor(
    h: cudnnHandle_t,
    alpha: *const c_void,
    a_desc: cudnnTensorDescriptor_t,
    a: *const c_void,
    beta: *const c_void,
    c_desc: cudnnTensorDescriptor_t,
    c: *mut c_void,
) -> Status {
    guard("cudnnAddTensor", || {
        let h = handle(h)?;
        let (ad, cd) = (tensor(a_desc, "aDesc")?, tensor(c_desc, "cDesc")?);
        check_broadcast(&ad, "aDesc", &cd, "cDesc")?;
        // SAFETY: host scaling values (the caller's contract; null is refused).
        let s = unsafe { Scaling::read(alpha, beta, cd.double()) }?;
        let key = format!("add_tensor|{ad:?}|{cd:?}|{}", s.tag());
        let (ac, cc) = (ad.clone(), cd.clone());
        let zero_read = ad.dims != cd.dims;
        let plan = plan(&h, &key, PlanPolicy::default(), move || {
            let mut g = new_graph("cudnn_add_tensor", cc.double());
            let at = g.tensor(ac.fd("a", X));
            let (r, _) = spread(&mut g, at, &cc);
            s.build(&mut g, r, &cc, Y);
            Ok(g)
        })?;
        let mut call = Call::default();
        call.input(X, a, ad.bytes(), "A")?;
        if zero_read {
            call.zeros.push((ZERO, cd.dt().size()));
        }
        s.feed(&mut call, Y, c, cd.bytes(), "C")?;
        execute(&h, &plan, &call)
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnOpTensor(
    h: cudnnHandle_t,
    op_desc: cudnnOpTensorDescriptor_t,
    alpha1: *const c_void,
    a_desc: cudnnTensorDescriptor_t,
    a: *const c_void,
    alpha2: *const c_void,
    b_desc: cudnnTensorDescriptor_t,
    b: *const c_void,
    beta: *const c_void,
    c_desc: cudnnTensorDescriptor_t,
    c: *mut c_void,
) -> Status {
    guard("cudnnOpTensor", || {
        let h = handle(h)?;
        let op = OP_TENSORS.get(op_desc).map_err(|e| ApiError::new(e.status, format!("`opTensorDesc`: {}", e.msg)))?;
        if !op.set {
            return Err(bad("`opTensorDesc` was created but never set (cudnnSetOpTensorDescriptor)"));
        }
        let unary = matches!(op.op, CUDNN_OP_TENSOR_SQRT | CUDNN_OP_TENSOR_NOT);
        let (ad, cd) = (tensor(a_desc, "aDesc")?, tensor(c_desc, "cDesc")?);
        same_dims(&ad, "aDesc", &cd, "cDesc")?;
        let bd = if unary { None } else { Some(tensor(b_desc, "bDesc")?) };
        if let Some(bd) = &bd {
            check_broadcast(bd, "bDesc", &cd, "cDesc")?;
        }
        float_tensor(&cd, "cDesc")?;
        let double = cd.double();
        // SAFETY: host scaling values (the caller's contract; null is refused).
        let (a1, a2) = unsafe { (read_scalar(alpha1, double, "alpha1")?, if unary { 0.0 } else { read_scalar(alpha2, double, "alpha2")? }) };
        // SAFETY: as above; alpha is 1 here, beta as given.
        let s = Scaling { alpha: 1.0, beta: unsafe { read_scalar(beta, double, "beta") }?, double };
        let compute = data_type(op.compute_raw)?;
        let key = format!("op_tensor|{op:?}|{ad:?}|{bd:?}|{cd:?}|{}", s.tag());
        let (ac, bc, cc) = (ad.clone(), bd.clone(), cd.clone());
        let plan = plan(&h, &key, PlanPolicy::default(), move || {
            let mut g = new_graph("cudnn_op_tensor", double).compute_data_type(compute);
            let sdt = scaling_type(double);
            let at = g.tensor(ac.fd("a", X));
            let s1 = scalar_tensor(&mut g, "alpha1", ALPHA1, sdt);
            let a_scaled = g.mul(at, s1);
            let r = match (op.op, &bc) {
                (CUDNN_OP_TENSOR_SQRT, _) => g.pointwise(PointwiseMode::Sqrt, &[a_scaled]),
                (CUDNN_OP_TENSOR_NOT, _) => {
                    let one = g.scalar("one", 1.0);
                    g.sub(one, a_scaled)
                }
                (o, Some(bc)) => {
                    let bt = g.tensor(bc.fd("b", B));
                    let s2 = scalar_tensor(&mut g, "alpha2", ALPHA2, sdt);
                    let b_scaled = g.mul(bt, s2);
                    let mode = match o {
                        CUDNN_OP_TENSOR_ADD => PointwiseMode::Add,
                        CUDNN_OP_TENSOR_MUL => PointwiseMode::Mul,
                        CUDNN_OP_TENSOR_MIN => PointwiseMode::Min,
                        _ => PointwiseMode::Max,
                    };
                    g.pointwise(mode, &[a_scaled, b_scaled])
                }
                _ => return Err(bad("bDesc is needed for a binary op")),
            };
            s.build(&mut g, r, &cc, Y);
            Ok(g)
        })?;
        let sdt = scaling_type(double);
        let mut call = Call::default();
        call.input(X, a, ad.bytes(), "A")?;
        call.scalar(ALPHA1, a1, sdt);
        if let Some(bd) = &bd {
            call.input(B, b, bd.bytes(), "B")?;
            call.scalar(ALPHA2, a2, sdt);
        }
        s.feed(&mut call, Y, c, cd.bytes(), "C")?;
        execute(&h, &plan, &call)
    })
}

/// The reduced axes of a reduction of `a` to `c`, after checking each dim of `c` is `a`'s or 1.
fn reduced_axes(a: &TensorDescriptor, c: &TensorDescriptor) -> R<Vec<usize>> {
    if a.dims.len() != c.dims.len() || a.dims.iter().zip(&c.dims).any(|(&x, &y)| y != x && y != 1) {
        return Err(bad(format!("cDesc has dims {:?}: each must be aDesc's ({:?}) or 1", c.dims, a.dims)));
    }
    Ok((0..a.dims.len()).filter(|&i| c.dims[i] == 1 && a.dims[i] != 1).collect())
}

fn index_size(t: i32) -> usize {
    match t {
        CUDNN_64BIT_INDICES => 8,
        CUDNN_16BIT_INDICES => 2,
        CUDNN_8BIT_INDICES => 1,
        _ => 4,
    }
}

#[no_mangle]
pub extern "C" fn cudnnGetReductionIndicesSize(
    h: cudnnHandle_t,
    r: cudnnReduceTensorDescriptor_t,
    a: cudnnTensorDescriptor_t,
    c: cudnnTensorDescriptor_t,
    size: *mut usize,
) -> Status {
    guard("cudnnGetReductionIndicesSize", || {
        handle(h)?;
        let d = REDUCES.get(r)?;
        let (ad, cd) = (tensor(a, "aDesc")?, tensor(c, "cDesc")?);
        reduced_axes(&ad, &cd)?;
        let n = if d.indices == CUDNN_REDUCE_TENSOR_FLATTENED_INDICES { cd.elements() as usize * index_size(d.indices_type) } else { 0 };
        // SAFETY: the caller's out pointer (checked not null).
        unsafe { write_out(size, "sizeInBytes", n) }
    })
}

#[no_mangle]
pub extern "C" fn cudnnGetReductionWorkspaceSize(
    h: cudnnHandle_t,
    r: cudnnReduceTensorDescriptor_t,
    a: cudnnTensorDescriptor_t,
    c: cudnnTensorDescriptor_t,
    size: *mut usize,
) -> Status {
    guard("cudnnGetReductionWorkspaceSize", || {
        let state = handle(h)?;
        let d = REDUCES.get(r)?;
        if !d.set {
            return Err(bad("`reduceTensorDesc` was created but never set (cudnnSetReduceTensorDescriptor)"));
        }
        let (ad, cd) = (tensor(a, "aDesc")?, tensor(c, "cDesc")?);
        let plan = reduce_plan(&state, &d, &ad, &cd, &Scaling { alpha: 1.0, beta: 0.0, double: cd.double() }, wanted_indices(&d)?)?;
        // SAFETY: the caller's out pointer (checked not null).
        unsafe { write_out(size, "sizeInBytes", plan.workspace_size()) }
    })
}

/// The ferrodnn type of `cudnnIndicesType_t` `t`.
fn index_type(t: i32) -> R<ferrodnn::DataType> {
    match t {
        CUDNN_32BIT_INDICES => Ok(ferrodnn::DataType::I32),
        CUDNN_64BIT_INDICES => Ok(ferrodnn::DataType::I64),
        CUDNN_8BIT_INDICES => Ok(ferrodnn::DataType::U8),
        _ => Err(ApiError::new(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, "16-bit reduction indices are not supported (ferrodnn has no 16-bit integer type); use 32-bit ones")),
    }
}

/// The graph of a reduction and, for min, max and amax with `indices` (their type), the
/// flattened index (over the reduced axes, row-major) of the first element that gives each
/// result: the elements equal to the result select their index, the others the region's size,
/// and the smallest wins.
fn reduce_plan(
    h: &crate::handle::HandleState,
    d: &crate::desc::ReduceDescriptor,
    ad: &TensorDescriptor,
    cd: &TensorDescriptor,
    s: &Scaling,
    indices: Option<ferrodnn::DataType>,
) -> R<std::sync::Arc<ferrodnn::Plan>> {
    let axes = reduced_axes(ad, cd)?;
    let region: i64 = axes.iter().map(|&a| ad.dims[a]).product();
    if indices.is_some() && region > 1 << 24 {
        return Err(unsupported(format!("reduction indices over {region} elements: at most 2^24 are supported")));
    }
    float_tensor(ad, "aDesc")?;
    let mode = match d.op {
        CUDNN_REDUCE_TENSOR_ADD => ReductionMode::Add,
        CUDNN_REDUCE_TENSOR_MUL => ReductionMode::Mul,
        CUDNN_REDUCE_TENSOR_MIN => ReductionMode::Min,
        CUDNN_REDUCE_TENSOR_MAX => ReductionMode::Max,
        CUDNN_REDUCE_TENSOR_AMAX => ReductionMode::Amax,
        CUDNN_REDUCE_TENSOR_AVG => ReductionMode::Avg,
        CUDNN_REDUCE_TENSOR_NORM1 => ReductionMode::Norm1,
        CUDNN_REDUCE_TENSOR_NORM2 => ReductionMode::Norm2,
        _ => ReductionMode::MulNoZeros,
    };
    let compute = data_type(d.compute_raw)?;
    let s = *s;
    let key = format!("reduce|{mode:?}|{compute:?}|{ad:?}|{cd:?}|{indices:?}|{}", s.tag());
    let (ac, cc) = (ad.clone(), cd.clone());
    plan(h, &key, PlanPolicy::default(), move || {
        let mut g = new_graph("cudnn_reduce_tensor", cc.double()).compute_data_type(compute);
        let at = g.tensor(ac.fd("a", X));
        let r = g.reduction(at, mode, &axes);
        if let Some(it) = indices {
            let compared = if mode == ReductionMode::Amax { g.pointwise(PointwiseMode::Abs, &[at]) } else { at };
            let hit = g.pointwise(PointwiseMode::CmpEq, &[compared, r]);
            let mut flat = None;
            for &a in &axes {
                let i = g.pointwise(PointwiseMode::GenIndex { axis: a }, &[at]);
                flat = Some(match flat {
                    None => i,
                    Some(f) => {
                        let dim = g.scalar("dim", ac.dims[a] as f64);
                        let scaled = g.mul(f, dim);
                        g.add(scaled, i)
                    }
                });
            }
            let flat = flat.ok_or_else(|| unsupported("reduction indices need at least one reduced axis"))?;
            let none = g.scalar("region", region as f64);
            let picked = g.pointwise(PointwiseMode::BinarySelect, &[flat, none, hit]);
            let idx = g.reduction(picked, ReductionMode::Min, &axes);
            g.set_output(idx);
            let t = g.desc_mut(idx);
            t.strides = ferrodnn::graph::packed_strides(&cc.dims);
            t.data_type = Some(it);
            t.uid = Some(INDICES);
        }
        s.build(&mut g, r, &cc, Y);
        Ok(g)
    })
}

/// The type of the indices a reduction computes: only min, max and amax with flattened indices
/// have them (the others ignore the setting, as in cuDNN).
fn wanted_indices(d: &crate::desc::ReduceDescriptor) -> R<Option<ferrodnn::DataType>> {
    if d.indices == CUDNN_REDUCE_TENSOR_FLATTENED_INDICES && matches!(d.op, CUDNN_REDUCE_TENSOR_MIN | CUDNN_REDUCE_TENSOR_MAX | CUDNN_REDUCE_TENSOR_AMAX) {
        Ok(Some(index_type(d.indices_type)?))
    } else {
        Ok(None)
    }
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnReduceTensor(
    h: cudnnHandle_t,
    r: cudnnReduceTensorDescriptor_t,
    indices: *mut c_void,
    indices_bytes: usize,
    workspace: *mut c_void,
    workspace_bytes: usize,
    alpha: *const c_void,
    a_desc: cudnnTensorDescriptor_t,
    a: *const c_void,
    beta: *const c_void,
    c_desc: cudnnTensorDescriptor_t,
    c: *mut c_void,
) -> Status {
    guard("cudnnReduceTensor", || {
        let state = handle(h)?;
        let d = REDUCES.get(r).map_err(|e| ApiError::new(e.status, format!("`reduceTensorDesc`: {}", e.msg)))?;
        if !d.set {
            return Err(bad("`reduceTensorDesc` was created but never set (cudnnSetReduceTensorDescriptor)"));
        }
        let (ad, cd) = (tensor(a_desc, "aDesc")?, tensor(c_desc, "cDesc")?);
        let it = wanted_indices(&d)?;
        // SAFETY: host scaling values (the caller's contract; null is refused).
        let s = unsafe { Scaling::read(alpha, beta, cd.double()) }?;
        let plan = reduce_plan(&state, &d, &ad, &cd, &s, it)?;
        let mut call = Call { workspace: (workspace as usize, workspace_bytes), ..Default::default() };
        if let Some(it) = it {
            let need = cd.elements() as usize * it.size();
            if indices_bytes < need {
                return Err(bad(format!("indicesSizeInBytes is {indices_bytes} but the indices of cDesc {:?} need {need} (cudnnGetReductionIndicesSize)", cd.dims)));
            }
            call.output(INDICES, indices, need, "indices")?;
        }
        call.input(X, a, ad.bytes(), "A")?;
        s.feed(&mut call, Y, c, cd.bytes(), "C")?;
        execute(&state, &plan, &call)
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnTransformTensor(
    h: cudnnHandle_t,
    alpha: *const c_void,
    x_desc: cudnnTensorDescriptor_t,
    x: *const c_void,
    beta: *const c_void,
    y_desc: cudnnTensorDescriptor_t,
    y: *mut c_void,
) -> Status {
    guard("cudnnTransformTensor", || {
        let h = handle(h)?;
        let (xd, yd) = (tensor(x_desc, "xDesc")?, tensor(y_desc, "yDesc")?);
        same_dims(&xd, "xDesc", &yd, "yDesc")?;
        // SAFETY: host scaling values (the caller's contract; null is refused).
        let s = unsafe { Scaling::read(alpha, beta, yd.double()) }?;
        let key = format!("transform|{xd:?}|{yd:?}|{}", s.tag());
        let (xc, yc) = (xd.clone(), yd.clone());
        let plan = plan(&h, &key, PlanPolicy::default(), move || {
            let mut g = new_graph("cudnn_transform_tensor", yc.double());
            let xt = g.tensor(xc.fd("x", X));
            let r = g.identity(xt);
            s.build(&mut g, r, &yc, Y);
            Ok(g)
        })?;
        let mut call = Call::default();
        call.input(X, x, xd.bytes(), "x")?;
        s.feed(&mut call, Y, y, yd.bytes(), "y")?;
        execute(&h, &plan, &call)
    })
}

#[no_mangle]
pub extern "C" fn cudnnScaleTensor(h: cudnnHandle_t, y_desc: cudnnTensorDescriptor_t, y: *mut c_void, alpha: *const c_void) -> Status {
    guard("cudnnScaleTensor", || {
        let h = handle(h)?;
        let yd = tensor(y_desc, "yDesc")?;
        float_tensor(&yd, "yDesc")?;
        // SAFETY: a host scaling value (the caller's contract; null is refused).
        let a = unsafe { read_scalar(alpha, yd.double(), "alpha") }?;
        let key = format!("scale_tensor|{yd:?}");
        let yc = yd.clone();
        let plan = plan(&h, &key, PlanPolicy::default(), move || {
            let mut g = new_graph("cudnn_scale_tensor", yc.double());
            let yin = g.tensor(yc.fd("y_in", X));
            let at = scalar_tensor(&mut g, "alpha", ALPHA1, scaling_type(yc.double()));
            let r = g.mul(yin, at);
            Scaling { alpha: 1.0, beta: 0.0, double: yc.double() }.build(&mut g, r, &yc, Y);
            Ok(g)
        })?;
        let mut call = Call::default();
        call.input(X, y, yd.bytes(), "y")?;
        call.scalar(ALPHA1, a, scaling_type(yd.double()));
        call.output(Y, y, yd.bytes(), "y")?;
        execute(&h, &plan, &call)
    })
}

#[no_mangle]
pub extern "C" fn cudnnSetTensor(h: cudnnHandle_t, y_desc: cudnnTensorDescriptor_t, y: *mut c_void, value: *const c_void) -> Status {
    guard("cudnnSetTensor", || {
        let h = handle(h)?;
        let yd = tensor(y_desc, "yDesc")?;
        non_null(value, "valuePtr")?;
        let dt = yd.dt();
        // SAFETY: valuePtr points at one host element of y's type (cuDNN's contract; not null).
        let bytes = unsafe { std::slice::from_raw_parts(value as *const u8, dt.size()) }.to_vec();
        let key = format!("set_tensor|{yd:?}");
        let yc = yd.clone();
        let plan = plan(&h, &key, PlanPolicy::default(), move || {
            let mut g = Graph::new("cudnn_set_tensor");
            let v = g.tensor(TensorDesc::runtime_scalar("value", yc.dt()).with_uid(VALUE));
            let (r, _) = spread(&mut g, v, &yc);
            Scaling { alpha: 1.0, beta: 0.0, double: yc.double() }.build(&mut g, r, &yc, Y);
            Ok(g)
        })?;
        let mut call = Call::default();
        call.scalars.push((VALUE, bytes));
        if yd.dims != [1] {
            // spread's broadcast reads a zero of y's type.
            call.zeros.push((ZERO, dt.size()));
        }
        call.output(Y, y, yd.bytes(), "y")?;
        execute(&h, &plan, &call)
    })
}
