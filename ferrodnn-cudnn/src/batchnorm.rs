//! Batch normalization: forward training and inference, backward, their Ex forms (with the
//! activation, and the residual add, cuDNN fuses after it), the Ex size queries and
//! cudnnDeriveBNTensorDescriptor.
//!
//! SPATIAL (and SPATIAL_PERSISTENT) normalizes each channel over every other axis: ferrodnn's
//! batchnorm. PER_ACTIVATION normalizes each (c, h, w) over the batch: the same op on a view of
//! x as `[n, c*h*w, 1, ...]`, which needs c, h, w in one run of memory, in the same order as the
//! parameters'. The running statistics are updated in place as cuDNN does:
//! `running = (1 - factor) * running + factor * batch`, the variance's with the unbiased batch
//! variance; the saved statistics are the mean and `1 / sqrt(var + epsilon)`.

use crate::api::*;
use crate::desc::{activation, tensor, ActivationDescriptor, TensorDescriptor, TENSORS};
use crate::exec::{execute, new_graph, plan, scalar_tensor, scaling_type, Call, Scaling};
use crate::handle::handle;
use crate::ops::{activation_backward_node, activation_forward_node};
use crate::types::*;
use ferrodnn::graph::ops::norm::BatchnormAttrs;
use ferrodnn::graph::ops::pointwise::PointwiseMode;
use ferrodnn::{Graph, PlanPolicy, TensorId};
use std::ffi::c_void;

const X: i64 = 1;
const Y: i64 = 3;
const DY: i64 = 4;
const DX: i64 = 5;
const S: i64 = 10;
const BB: i64 = 11;
const RM_IN: i64 = 12;
const RV_IN: i64 = 13;
const RM: i64 = 14;
const RV: i64 = 15;
const SM: i64 = 16;
const SV: i64 = 17;
const EPS: i64 = 18;
const MOM: i64 = 19;
const Z: i64 = 20;
const DS: i64 = 21;
const DB: i64 = 22;
const M: i64 = 23;
const V: i64 = 24;
const DZ: i64 = 25;
const YF: i64 = 26;

/// The parameter dims of `mode` for x dims `x`: `[1, c, 1, ...]` (spatial) or `[1, c, h, ...]`.
fn param_dims(x: &[i64], mode: i32) -> R<Vec<i64>> {
    match mode {
        CUDNN_BATCHNORM_SPATIAL | CUDNN_BATCHNORM_SPATIAL_PERSISTENT => Ok(x.iter().enumerate().map(|(i, &d)| if i == 1 { d } else { 1 }).collect()),
        CUDNN_BATCHNORM_PER_ACTIVATION => Ok(std::iter::once(1).chain(x[1..].iter().copied()).collect()),
        m => Err(bad(format!("mode {m} is not a cudnnBatchNormMode_t"))),
    }
}

/// The statistics type for data of type `dt`: f32 for half-precision data, else its own.
fn param_type(dt_raw: i32) -> i32 {
    match dt_raw {
        CUDNN_DATA_HALF | CUDNN_DATA_BFLOAT16 => CUDNN_DATA_FLOAT,
        d => d,
    }
}

#[no_mangle]
pub extern "C" fn cudnnDeriveBNTensorDescriptor(derived: cudnnTensorDescriptor_t, x_desc: cudnnTensorDescriptor_t, mode: i32) -> Status {
    guard("cudnnDeriveBNTensorDescriptor", || {
        let xd = tensor(x_desc, "xDesc")?;
        if !(4..=5).contains(&xd.dims.len()) {
            return Err(bad(format!("xDesc must have 4 or 5 dims, got {:?}", xd.dims)));
        }
        let dims = param_dims(&xd.dims, mode)?;
        let strides = ferrodnn::graph::packed_strides(&dims);
        TENSORS.with(derived, |t| {
            *t = TensorDescriptor { set: true, dt_raw: param_type(xd.dt_raw), dims, strides };
            Ok(())
        })
    })
}

/// The views batchnorm runs on: x-shaped tensors and parameter tensors, merged for
/// PER_ACTIVATION into `[n, c*h*w, 1, ...]` and `[1, c*h*w, 1, ...]`.
struct Views {
    per_activation: bool,
    order: Vec<usize>,
}

impl Views {
    fn new(mode: i32, x: &TensorDescriptor) -> R<Views> {
        param_dims(&x.dims, mode)?;
        let per_activation = mode == CUDNN_BATCHNORM_PER_ACTIVATION;
        let mut order: Vec<usize> = (1..x.dims.len()).collect();
        order.sort_by(|&a, &b| x.strides[b].cmp(&x.strides[a]).then(a.cmp(&b)));
        Ok(Views { per_activation, order })
    }

    fn view(&self, t: &TensorDescriptor, name: &str) -> R<TensorDescriptor> {
        if !self.per_activation {
            return Ok(t.clone());
        }
        let live: Vec<usize> = self.order.iter().copied().filter(|&a| t.dims[a] > 1).collect();
        for w in live.windows(2) {
            if t.strides[w[0]] != t.strides[w[1]] * t.dims[w[1]] {
                return Err(unsupported(format!("PER_ACTIVATION batchnorm needs `{name}`'s c, h, w in one run of memory in x's order; its strides are {:?}", t.strides)));
            }
        }
        let count: i64 = self.order.iter().map(|&a| t.dims[a]).product();
        let stride = live.last().map_or(1, |&a| t.strides[a]);
        let rank = t.dims.len();
        let mut dims = vec![t.dims[0], count];
        let mut strides = vec![t.strides[0], stride];
        dims.resize(rank, 1);
        strides.resize(rank, 1);
        Ok(TensorDescriptor { set: true, dt_raw: t.dt_raw, dims, strides })
    }
}

/// The descriptors of a batchnorm call, checked: x, y (or dy/dx) shaped alike, the parameters
/// of the mode's dims.
fn check_param(p: &TensorDescriptor, x: &TensorDescriptor, mode: i32, name: &str) -> R<()> {
    let want = param_dims(&x.dims, mode)?;
    if p.dims != want {
        return Err(bad(format!(
            "`{name}` has dims {:?} but the {} parameters of x {:?} are {want:?}",
            p.dims,
            if mode == CUDNN_BATCHNORM_PER_ACTIVATION { "per-activation" } else { "spatial" },
            x.dims
        )));
    }
    if !p.dt().is_float() {
        return Err(ApiError::new(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, format!("`{name}` is {}; batchnorm parameters are float", p.dt())));
    }
    Ok(())
}

fn check_epsilon(eps: f64, double: bool) -> R<f64> {
    if eps.is_nan() || eps < 0.0 || !eps.is_finite() {
        return Err(bad(format!("epsilon must be finite and >= 0 (CUDNN_BN_MIN_EPSILON), got {eps}")));
    }
    // ferrodnn's batchnorm takes a positive epsilon; the smallest normal value stands for 0.
    Ok(if eps > 0.0 {
        eps
    } else if double {
        f64::MIN_POSITIVE
    } else {
        f32::MIN_POSITIVE as f64
    })
}

/// What the activation of an Ex call is: none (BN), or the descriptor's (after an add of z
/// for BN_ADD_ACTIVATION).
fn ex_activation(ops: i32, act: cudnnActivationDescriptor_t) -> R<Option<ActivationDescriptor>> {
    match ops {
        CUDNN_BATCHNORM_OPS_BN => Ok(None),
        CUDNN_BATCHNORM_OPS_BN_ACTIVATION | CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION => {
            let a = activation(act, "activationDesc")?;
            if a.mode != CUDNN_ACTIVATION_RELU {
                return Err(unsupported(format!("the activation after batchnorm must be CUDNN_ACTIVATION_RELU (as in cuDNN), got mode {}", a.mode)));
            }
            Ok(Some(a))
        }
        o => Err(bad(format!("bnOps {o} is not a cudnnBatchNormOps_t"))),
    }
}

/// A parameter-shaped tensor of the graph.
fn param_tensor(g: &mut Graph, v: &Views, p: &TensorDescriptor, name: &str, uid: i64) -> R<TensorId> {
    Ok(g.tensor(v.view(p, name)?.fd(name, uid)))
}

/// Marks a parameter-shaped output with the caller's description.
fn param_output(g: &mut Graph, t: TensorId, v: &Views, p: &TensorDescriptor, name: &str, uid: i64) -> R<()> {
    let pv = v.view(p, name)?;
    g.set_output(t);
    let d = g.desc_mut(t);
    d.data_type = Some(pv.dt());
    d.dims = pv.dims;
    d.strides = pv.strides;
    d.uid = Some(uid);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn forward_training(
    h: cudnnHandle_t,
    mode: i32,
    ops: i32,
    act: cudnnActivationDescriptor_t,
    alpha: *const c_void,
    beta: *const c_void,
    xd: TensorDescriptor,
    x: *const c_void,
    zd: Option<TensorDescriptor>,
    z: *const c_void,
    yd: TensorDescriptor,
    y: *mut c_void,
    bnd: TensorDescriptor,
    scale: *const c_void,
    bias: *const c_void,
    factor: f64,
    running: (*mut c_void, *mut c_void),
    eps: f64,
    saved: (*mut c_void, *mut c_void),
) -> R<()> {
    let h = handle(h)?;
    if xd.dims != yd.dims {
        return Err(bad(format!("yDesc has dims {:?} but xDesc {:?}; they must match", yd.dims, xd.dims)));
    }
    if !xd.dt().is_float() {
        return Err(ApiError::new(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, format!("x is {}; batchnorm takes float types", xd.dt())));
    }
    check_param(&bnd, &xd, mode, "bnScaleBiasMeanVarDesc")?;
    let act = ex_activation(ops, act)?;
    let add_z = ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION;
    if add_z {
        let zd = zd.as_ref().ok_or_else(|| bad("zDesc is needed for CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION"))?;
        if zd.dims != xd.dims {
            return Err(bad(format!("zDesc has dims {:?} but xDesc {:?}; they must match", zd.dims, xd.dims)));
        }
    }
    let with_running = match running {
        (m, v) if m.is_null() && v.is_null() => false,
        (m, v) if !m.is_null() && !v.is_null() => true,
        _ => return Err(bad("resultRunningMean and resultRunningVariance must be both given or both null")),
    };
    if with_running && !(0.0..=1.0).contains(&factor) {
        return Err(bad(format!("exponentialAverageFactor must be in [0, 1], got {factor}")));
    }
    let eps = check_epsilon(eps, bnd.double())?;
    let v = Views::new(mode, &xd)?;
    // SAFETY: host scaling values (the caller's contract; null is refused).
    let s = unsafe { Scaling::read(alpha, beta, yd.double()) }?;
    let sdt = scaling_type(bnd.double());
    let key = format!("bn_fwd_train|{mode}|{ops}|{xd:?}|{zd:?}|{yd:?}|{bnd:?}|{with_running}|{}", s.tag());
    let (xc, zc, yc, bc) = (xd.clone(), zd.clone(), yd.clone(), bnd.clone());
    let plan = plan(&h, &key, PlanPolicy::default(), move || {
        let mut g = new_graph("cudnn_batchnorm_forward_training", yc.double());
        let xt = g.tensor(v.view(&xc, "x")?.fd("x", X));
        let st = param_tensor(&mut g, &v, &bc, "scale", S)?;
        let bt = param_tensor(&mut g, &v, &bc, "bias", BB)?;
        let run_in = if with_running { Some((param_tensor(&mut g, &v, &bc, "running_mean", RM_IN)?, param_tensor(&mut g, &v, &bc, "running_var", RV_IN)?)) } else { None };
        let (yt, mean, inv, run_out) = g.batchnorm(xt, st, bt, run_in, &[], BatchnormAttrs::default());
        let et = scalar_tensor(&mut g, "epsilon", EPS, sdt);
        g.set_attribute_tensor(yt, "epsilon", et)?;
        let mt = scalar_tensor(&mut g, "momentum", MOM, sdt);
        g.set_attribute_tensor(yt, "momentum", mt)?;
        param_output(&mut g, mean, &v, &bc, "save_mean", SM)?;
        param_output(&mut g, inv, &v, &bc, "save_inv_variance", SV)?;
        if let Some((orm, orv)) = run_out {
            param_output(&mut g, orm, &v, &bc, "running_mean", RM)?;
            param_output(&mut g, orv, &v, &bc, "running_var", RV)?;
        }
        let yv = v.view(&yc, "y")?;
        let mut out = yt;
        if add_z {
            let zv = v.view(zc.as_ref().expect("checked above"), "z")?;
            let zt = g.tensor(zv.fd("z", Z));
            out = g.add(out, zt);
        }
        if let Some(a) = &act {
            out = activation_forward_node(&mut g, out, a)?;
        }
        s.build(&mut g, out, &yv, Y);
        Ok(g)
    })?;
    let mut call = Call::default();
    call.input(X, x, xd.bytes(), "x")?;
    call.input(S, scale, bnd.bytes(), "bnScale")?;
    call.input(BB, bias, bnd.bytes(), "bnBias")?;
    if add_z {
        call.input(Z, z, zd.as_ref().map_or(0, |z| z.bytes()), "z")?;
    }
    call.scalar(EPS, eps, sdt);
    call.scalar(MOM, if with_running { factor } else { 0.1 }, sdt);
    if with_running {
        call.input(RM_IN, running.0, bnd.bytes(), "resultRunningMean")?;
        call.input(RV_IN, running.1, bnd.bytes(), "resultRunningVariance")?;
        call.output(RM, running.0, bnd.bytes(), "resultRunningMean")?;
        call.output(RV, running.1, bnd.bytes(), "resultRunningVariance")?;
    }
    call.output_or_discard(SM, saved.0, bnd.bytes());
    call.output_or_discard(SV, saved.1, bnd.bytes());
    s.feed(&mut call, Y, y, yd.bytes(), "y")?;
    execute(&h, &plan, &call)
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnBatchNormalizationForwardTraining(
    h: cudnnHandle_t,
    mode: i32,
    alpha: *const c_void,
    beta: *const c_void,
    x_desc: cudnnTensorDescriptor_t,
    x: *const c_void,
    y_desc: cudnnTensorDescriptor_t,
    y: *mut c_void,
    bn_desc: cudnnTensorDescriptor_t,
    scale: *const c_void,
    bias: *const c_void,
    factor: f64,
    running_mean: *mut c_void,
    running_var: *mut c_void,
    eps: f64,
    save_mean: *mut c_void,
    save_inv_var: *mut c_void,
) -> Status {
    guard("cudnnBatchNormalizationForwardTraining", || {
        let (xd, yd, bnd) = (tensor(x_desc, "xDesc")?, tensor(y_desc, "yDesc")?, tensor(bn_desc, "bnScaleBiasMeanVarDesc")?);
        forward_training(
            h,
            mode,
            CUDNN_BATCHNORM_OPS_BN,
            std::ptr::null_mut(),
            alpha,
            beta,
            xd,
            x,
            None,
            std::ptr::null(),
            yd,
            y,
            bnd,
            scale,
            bias,
            factor,
            (running_mean, running_var),
            eps,
            (save_mean, save_inv_var),
        )
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnBatchNormalizationForwardTrainingEx(
    h: cudnnHandle_t,
    mode: i32,
    ops: i32,
    alpha: *const c_void,
    beta: *const c_void,
    x_desc: cudnnTensorDescriptor_t,
    x: *const c_void,
    z_desc: cudnnTensorDescriptor_t,
    z: *const c_void,
    y_desc: cudnnTensorDescriptor_t,
    y: *mut c_void,
    bn_desc: cudnnTensorDescriptor_t,
    scale: *const c_void,
    bias: *const c_void,
    factor: f64,
    running_mean: *mut c_void,
    running_var: *mut c_void,
    eps: f64,
    save_mean: *mut c_void,
    save_inv_var: *mut c_void,
    act: cudnnActivationDescriptor_t,
    _workspace: *mut c_void,
    _workspace_bytes: usize,
    _reserve: *mut c_void,
    _reserve_bytes: usize,
) -> Status {
    guard("cudnnBatchNormalizationForwardTrainingEx", || {
        let (xd, yd, bnd) = (tensor(x_desc, "xDesc")?, tensor(y_desc, "yDesc")?, tensor(bn_desc, "bnScaleBiasMeanVarDesc")?);
        let zd = if ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION { Some(tensor(z_desc, "zDesc")?) } else { None };
        forward_training(h, mode, ops, act, alpha, beta, xd, x, zd, z, yd, y, bnd, scale, bias, factor, (running_mean, running_var), eps, (save_mean, save_inv_var))
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnBatchNormalizationForwardInference(
    h: cudnnHandle_t,
    mode: i32,
    alpha: *const c_void,
    beta: *const c_void,
    x_desc: cudnnTensorDescriptor_t,
    x: *const c_void,
    y_desc: cudnnTensorDescriptor_t,
    y: *mut c_void,
    bn_desc: cudnnTensorDescriptor_t,
    scale: *const c_void,
    bias: *const c_void,
    est_mean: *const c_void,
    est_var: *const c_void,
    eps: f64,
) -> Status {
    guard("cudnnBatchNormalizationForwardInference", || {
        let h = handle(h)?;
        let (xd, yd, bnd) = (tensor(x_desc, "xDesc")?, tensor(y_desc, "yDesc")?, tensor(bn_desc, "bnScaleBiasMeanVarDesc")?);
        if xd.dims != yd.dims {
            return Err(bad(format!("yDesc has dims {:?} but xDesc {:?}; they must match", yd.dims, xd.dims)));
        }
        check_param(&bnd, &xd, mode, "bnScaleBiasMeanVarDesc")?;
        let eps = check_epsilon(eps, bnd.double())?;
        let v = Views::new(mode, &xd)?;
        // SAFETY: host scaling values (the caller's contract; null is refused).
        let s = unsafe { Scaling::read(alpha, beta, yd.double()) }?;
        let sdt = scaling_type(bnd.double());
        let key = format!("bn_fwd_infer|{mode}|{xd:?}|{yd:?}|{bnd:?}|{}", s.tag());
        let (xc, yc, bc) = (xd.clone(), yd.clone(), bnd.clone());
        let plan = plan(&h, &key, PlanPolicy::default(), move || {
            let mut g = new_graph("cudnn_batchnorm_forward_inference", yc.double());
            let xt = g.tensor(v.view(&xc, "x")?.fd("x", X));
            let st = param_tensor(&mut g, &v, &bc, "scale", S)?;
            let bt = param_tensor(&mut g, &v, &bc, "bias", BB)?;
            let mt = param_tensor(&mut g, &v, &bc, "mean", M)?;
            let vt = param_tensor(&mut g, &v, &bc, "variance", V)?;
            let et = scalar_tensor(&mut g, "epsilon", EPS, sdt);
            let ve = g.add(vt, et);
            let inv = g.pointwise(PointwiseMode::Rsqrt, &[ve]);
            let yt = g.batchnorm_inference(xt, st, bt, mt, inv);
            s.build(&mut g, yt, &v.view(&yc, "y")?, Y);
            Ok(g)
        })?;
        let mut call = Call::default();
        call.input(X, x, xd.bytes(), "x")?;
        call.input(S, scale, bnd.bytes(), "bnScale")?;
        call.input(BB, bias, bnd.bytes(), "bnBias")?;
        call.input(M, est_mean, bnd.bytes(), "estimatedMean")?;
        call.input(V, est_var, bnd.bytes(), "estimatedVariance")?;
        call.scalar(EPS, eps, sdt);
        s.feed(&mut call, Y, y, yd.bytes(), "y")?;
        execute(&h, &plan, &call)
    })
}

#[allow(clippy::too_many_arguments)]
fn backward(
    h: cudnnHandle_t,
    mode: i32,
    ops: i32,
    act: cudnnActivationDescriptor_t,
    scalings: [*const c_void; 4],
    xd: TensorDescriptor,
    x: *const c_void,
    y_in: Option<(TensorDescriptor, *const c_void)>,
    dyd: TensorDescriptor,
    dy: *const c_void,
    dz_out: Option<(TensorDescriptor, *mut c_void)>,
    dxd: TensorDescriptor,
    dx: *mut c_void,
    dbnd: TensorDescriptor,
    scale: *const c_void,
    dscale: *mut c_void,
    dbias: *mut c_void,
    eps: f64,
    saved: (*const c_void, *const c_void),
) -> R<()> {
    let h = handle(h)?;
    for (d, n) in [(&dyd, "dyDesc"), (&dxd, "dxDesc")] {
        if d.dims != xd.dims {
            return Err(bad(format!("{n} has dims {:?} but xDesc {:?}; they must match", d.dims, xd.dims)));
        }
    }
    check_param(&dbnd, &xd, mode, "dBnScaleBiasDesc")?;
    let with_saved = match saved {
        (m, v) if !m.is_null() && !v.is_null() => true,
        (m, v) if m.is_null() && v.is_null() => false,
        _ => return Err(bad("savedMean and savedInvVariance must be both given or both null")),
    };
    let eps = check_epsilon(eps, dbnd.double())?;
    let act = ex_activation(ops, act)?;
    let add_z = ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION;
    if act.is_some() && y_in.is_none() {
        return Err(bad("yDesc and yData are needed to take the activation's gradient"));
    }
    if add_z && dz_out.is_none() {
        return Err(bad("dzDesc and dzData are needed for CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION"));
    }
    let v = Views::new(mode, &xd)?;
    let double = dxd.double();
    // SAFETY: host scaling values (the caller's contract; null is refused).
    let (sd, sp) = unsafe {
        (
            Scaling::read(scalings[0], scalings[1], double)?,
            Scaling { alpha: read_scalar(scalings[2], double, "alphaParamDiff")?, beta: read_scalar(scalings[3], double, "betaParamDiff")?, double },
        )
    };
    let key =
        format!("bn_bwd|{mode}|{ops}|{xd:?}|{:?}|{dyd:?}|{:?}|{dxd:?}|{dbnd:?}|{with_saved}|{}|{}", y_in.as_ref().map(|y| &y.0), dz_out.as_ref().map(|z| &z.0), sd.tag(), sp.tag());
    let sdt = scaling_type(dbnd.double());
    let (xc, yc, dyc, dzc, dxc, bc) = (xd.clone(), y_in.as_ref().map(|y| y.0.clone()), dyd.clone(), dz_out.as_ref().map(|z| z.0.clone()), dxd.clone(), dbnd.clone());
    let with_act = act.is_some();
    let plan = plan(&h, &key, PlanPolicy::default(), move || {
        let mut g = new_graph("cudnn_batchnorm_backward", double);
        let xt = g.tensor(v.view(&xc, "x")?.fd("x", X));
        let mut dyt = g.tensor(v.view(&dyc, "dy")?.fd("dy", DY));
        if let (Some(a), Some(yc)) = (&act, &yc) {
            let yt = g.tensor(v.view(yc, "y")?.fd("y", YF));
            dyt = activation_backward_node(&mut g, dyt, yt, a)?;
            if let Some(dzc) = &dzc {
                let dz = g.identity(dyt);
                let zv = v.view(dzc, "dz")?;
                g.set_output(dz);
                let d = g.desc_mut(dz);
                d.dims = zv.dims.clone();
                d.strides = zv.strides.clone();
                d.data_type = Some(zv.dt());
                d.uid = Some(DZ);
            }
        }
        let st = param_tensor(&mut g, &v, &bc, "scale", S)?;
        let (mt, it) = if with_saved {
            (param_tensor(&mut g, &v, &bc, "saved_mean", SM)?, param_tensor(&mut g, &v, &bc, "saved_inv_variance", SV)?)
        } else {
            // cuDNN recomputes the batch statistics when none are saved: a forward batchnorm
            // whose y nothing reads (its bias any parameter-shaped tensor: scale).
            let (_, mean, inv, _) = g.batchnorm(xt, st, st, None, &[], BatchnormAttrs::default());
            let et = scalar_tensor(&mut g, "epsilon", EPS, sdt);
            g.set_attribute_tensor(mean, "epsilon", et)?;
            (mean, inv)
        };
        let (dxt, dst, dbt) = g.batchnorm_backward(dyt, xt, st, mt, it);
        sd.build(&mut g, dxt, &v.view(&dxc, "dx")?, DX);
        let bv = v.view(&bc, "dscale")?;
        sp.build(&mut g, dst, &bv, DS);
        sp.build(&mut g, dbt, &bv, DB);
        Ok(g)
    })?;
    let mut call = Call::default();
    call.input(X, x, xd.bytes(), "x")?;
    call.input(DY, dy, dyd.bytes(), "dy")?;
    if with_act {
        if let Some((yd, yp)) = &y_in {
            call.input(YF, *yp, yd.bytes(), "yData")?;
        }
        if let Some((dzd, dzp)) = &dz_out {
            call.output(DZ, *dzp, dzd.bytes(), "dzData")?;
        }
    }
    call.input(S, scale, dbnd.bytes(), "bnScale")?;
    if with_saved {
        call.input(SM, saved.0, dbnd.bytes(), "savedMean")?;
        call.input(SV, saved.1, dbnd.bytes(), "savedInvVariance")?;
    } else {
        call.scalar(EPS, eps, sdt);
    }
    sd.feed(&mut call, DX, dx, dxd.bytes(), "dx")?;
    sp.feed(&mut call, DS, dscale, dbnd.bytes(), "dBnScaleResult")?;
    sp.feed(&mut call, DB, dbias, dbnd.bytes(), "dBnBiasResult")?;
    execute(&h, &plan, &call)
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnBatchNormalizationBackward(
    h: cudnnHandle_t,
    mode: i32,
    alpha_data: *const c_void,
    beta_data: *const c_void,
    alpha_param: *const c_void,
    beta_param: *const c_void,
    x_desc: cudnnTensorDescriptor_t,
    x: *const c_void,
    dy_desc: cudnnTensorDescriptor_t,
    dy: *const c_void,
    dx_desc: cudnnTensorDescriptor_t,
    dx: *mut c_void,
    dbn_desc: cudnnTensorDescriptor_t,
    scale: *const c_void,
    dscale: *mut c_void,
    dbias: *mut c_void,
    eps: f64,
    saved_mean: *const c_void,
    saved_inv_var: *const c_void,
) -> Status {
    guard("cudnnBatchNormalizationBackward", || {
        let (xd, dyd, dxd, dbnd) = (tensor(x_desc, "xDesc")?, tensor(dy_desc, "dyDesc")?, tensor(dx_desc, "dxDesc")?, tensor(dbn_desc, "dBnScaleBiasDesc")?);
        backward(
            h,
            mode,
            CUDNN_BATCHNORM_OPS_BN,
            std::ptr::null_mut(),
            [alpha_data, beta_data, alpha_param, beta_param],
            xd,
            x,
            None,
            dyd,
            dy,
            None,
            dxd,
            dx,
            dbnd,
            scale,
            dscale,
            dbias,
            eps,
            (saved_mean, saved_inv_var),
        )
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnBatchNormalizationBackwardEx(
    h: cudnnHandle_t,
    mode: i32,
    ops: i32,
    alpha_data: *const c_void,
    beta_data: *const c_void,
    alpha_param: *const c_void,
    beta_param: *const c_void,
    x_desc: cudnnTensorDescriptor_t,
    x: *const c_void,
    y_desc: cudnnTensorDescriptor_t,
    y: *const c_void,
    dy_desc: cudnnTensorDescriptor_t,
    dy: *const c_void,
    dz_desc: cudnnTensorDescriptor_t,
    dz: *mut c_void,
    dx_desc: cudnnTensorDescriptor_t,
    dx: *mut c_void,
    dbn_desc: cudnnTensorDescriptor_t,
    scale: *const c_void,
    _bias: *const c_void,
    dscale: *mut c_void,
    dbias: *mut c_void,
    eps: f64,
    saved_mean: *const c_void,
    saved_inv_var: *const c_void,
    act: cudnnActivationDescriptor_t,
    _workspace: *mut c_void,
    _workspace_bytes: usize,
    _reserve: *mut c_void,
    _reserve_bytes: usize,
) -> Status {
    guard("cudnnBatchNormalizationBackwardEx", || {
        let (xd, dyd, dxd, dbnd) = (tensor(x_desc, "xDesc")?, tensor(dy_desc, "dyDesc")?, tensor(dx_desc, "dxDesc")?, tensor(dbn_desc, "dBnScaleBiasDesc")?);
        let y_in = if ops != CUDNN_BATCHNORM_OPS_BN { Some((tensor(y_desc, "yDesc")?, y)) } else { None };
        let dz_out = if ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION { Some((tensor(dz_desc, "dzDesc")?, dz)) } else { None };
        backward(
            h,
            mode,
            ops,
            act,
            [alpha_data, beta_data, alpha_param, beta_param],
            xd,
            x,
            y_in,
            dyd,
            dy,
            dz_out,
            dxd,
            dx,
            dbnd,
            scale,
            dscale,
            dbias,
            eps,
            (saved_mean, saved_inv_var),
        )
    })
}

/// The Ex calls' workspace and reserve sizes: ferrodnn needs neither (a plan's workspace comes
/// from the handle's own memory when the caller gives none), so these are 0 once the
/// descriptors check out.
fn ex_size(h: cudnnHandle_t, mode: i32, ops: i32, x: cudnnTensorDescriptor_t, act: cudnnActivationDescriptor_t, size: *mut usize) -> R<()> {
    handle(h)?;
    let xd = tensor(x, "xDesc")?;
    param_dims(&xd.dims, mode)?;
    ex_activation(ops, act)?;
    // SAFETY: the caller's out pointer (checked not null).
    unsafe { write_out(size, "sizeInBytes", 0) }
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
    h: cudnnHandle_t,
    mode: i32,
    ops: i32,
    x: cudnnTensorDescriptor_t,
    _z: cudnnTensorDescriptor_t,
    _y: cudnnTensorDescriptor_t,
    _bn: cudnnTensorDescriptor_t,
    act: cudnnActivationDescriptor_t,
    size: *mut usize,
) -> Status {
    guard("cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize", || ex_size(h, mode, ops, x, act, size))
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnGetBatchNormalizationBackwardExWorkspaceSize(
    h: cudnnHandle_t,
    mode: i32,
    ops: i32,
    x: cudnnTensorDescriptor_t,
    _y: cudnnTensorDescriptor_t,
    _dy: cudnnTensorDescriptor_t,
    _dz: cudnnTensorDescriptor_t,
    _dx: cudnnTensorDescriptor_t,
    _dbn: cudnnTensorDescriptor_t,
    act: cudnnActivationDescriptor_t,
    size: *mut usize,
) -> Status {
    guard("cudnnGetBatchNormalizationBackwardExWorkspaceSize", || ex_size(h, mode, ops, x, act, size))
}

#[no_mangle]
pub extern "C" fn cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
    h: cudnnHandle_t,
    mode: i32,
    ops: i32,
    act: cudnnActivationDescriptor_t,
    x: cudnnTensorDescriptor_t,
    size: *mut usize,
) -> Status {
    guard("cudnnGetBatchNormalizationTrainingExReserveSpaceSize", || ex_size(h, mode, ops, x, act, size))
}
