//! Local response normalization across channels (cudnnLRNCrossChannelForward / Backward) and
//! its descriptor. Divisive normalization is not implemented (its two calls are stubs returning
//! CUDNN_STATUS_NOT_SUPPORTED).
//!
//! For channel `c` of `x [n, C, spatial...]`, with the window of `lrnN` channels `c - lo ..= c +
//! hi` (`lo = (lrnN - 1) / 2`, `hi = lrnN - 1 - lo`, cut at the tensor's edges):
//! `s = k + alpha / lrnN * sum(x_j^2)` and `y = x * s^-beta`; the backward pass is
//! `dx = dy * s^-beta - 2 alpha beta / lrnN * x * sum over the channels j whose window holds c
//! of dy_j y_j / s_j`.
//!
//! Both run as graphs of pointwise ops and one average pooling: `x` is viewed as
//! `[n, 1, C, spatial product]` (the spatial axes merge into one run of memory, as in NCHW and
//! NHWC), so the window sum over channels is an average pooling of window `[lrnN, 1]` counting
//! its zero padding (`lrnN` times the mean).

use crate::api::*;
use crate::desc::{tensor, TensorDescriptor};
use crate::exec::{execute, new_graph, plan, scaling_type, Call, Scaling};
use crate::handle::handle;
use crate::registry::Registry;
use crate::types::*;
use ferrodnn::graph::ops::pointwise::PointwiseMode;
use ferrodnn::graph::ops::resample::{ResampleAttrs, ResampleMode};
use ferrodnn::{Graph, PlanPolicy, TensorDesc, TensorId};
use std::ffi::c_void;

/// `cudnnLRNMode_t`.
pub const CUDNN_LRN_CROSS_CHANNEL_DIM1: i32 = 0;
/// cuDNN's bounds on the descriptor's values.
pub const LRN_MIN_N: u32 = 1;
pub const LRN_MAX_N: u32 = 16;
pub const LRN_MIN_K: f64 = 1e-5;
pub const LRN_MIN_BETA: f64 = 0.01;

/// An LRN descriptor: window width and the formula's alpha, beta and k.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrnDescriptor {
    pub n: u32,
    pub alpha: f64,
    pub beta: f64,
    pub k: f64,
}

/// cuDNN's defaults for a new descriptor.
impl Default for LrnDescriptor {
    fn default() -> Self {
        LrnDescriptor { n: 5, alpha: 1e-4, beta: 0.75, k: 2.0 }
    }
}

pub static LRNS: Registry<LrnDescriptor> = Registry::new("cudnnLRNDescriptor_t");

#[no_mangle]
pub extern "C" fn cudnnCreateLRNDescriptor(out: *mut cudnnLRNDescriptor_t) -> Status {
    guard("cudnnCreateLRNDescriptor", || {
        non_null(out, "normDesc")?;
        let p = LRNS.create(LrnDescriptor::default());
        // SAFETY: checked not null; the caller gives a writable descriptor slot.
        unsafe { write_out(out, "normDesc", p) }
    })
}

#[no_mangle]
pub extern "C" fn cudnnDestroyLRNDescriptor(p: cudnnLRNDescriptor_t) -> Status {
    guard("cudnnDestroyLRNDescriptor", || if p.is_null() { Ok(()) } else { LRNS.destroy(p) })
}

#[no_mangle]
pub extern "C" fn cudnnSetLRNDescriptor(p: cudnnLRNDescriptor_t, n: u32, alpha: f64, beta: f64, k: f64) -> Status {
    guard("cudnnSetLRNDescriptor", || {
        if !(LRN_MIN_N..=LRN_MAX_N).contains(&n) {
            return Err(bad(format!("lrnN {n} is outside [{LRN_MIN_N}, {LRN_MAX_N}]")));
        }
        if !k.is_finite() || k < LRN_MIN_K {
            return Err(bad(format!("lrnK {k} must be at least {LRN_MIN_K}")));
        }
        if !beta.is_finite() || beta < LRN_MIN_BETA {
            return Err(bad(format!("lrnBeta {beta} must be at least {LRN_MIN_BETA}")));
        }
        if !alpha.is_finite() {
            return Err(bad(format!("lrnAlpha {alpha} must be finite")));
        }
        LRNS.with(p, |d| {
            *d = LrnDescriptor { n, alpha, beta, k };
            Ok(())
        })
    })
}

#[no_mangle]
pub extern "C" fn cudnnGetLRNDescriptor(p: cudnnLRNDescriptor_t, n: *mut u32, alpha: *mut f64, beta: *mut f64, k: *mut f64) -> Status {
    guard("cudnnGetLRNDescriptor", || {
        let d = LRNS.get(p)?;
        // SAFETY: each out pointer is checked not null; the caller gives writable values.
        unsafe {
            write_out(n, "lrnN", d.n)?;
            write_out(alpha, "lrnAlpha", d.alpha)?;
            write_out(beta, "lrnBeta", d.beta)?;
            write_out(k, "lrnK", d.k)
        }
    })
}

/// `t` viewed as `[n, 1, C, spatial product]` when its spatial axes are one run of memory.
pub fn channel_view(t: &TensorDescriptor, name: &str) -> R<TensorDescriptor> {
    if t.dims.len() < 3 {
        return Err(bad(format!("`{name}` has dims {:?}; LRN takes [n, c, spatial...] (3 to 8 dims)", t.dims)));
    }
    let live: Vec<usize> = (2..t.dims.len()).filter(|&a| t.dims[a] > 1).collect();
    for w in live.windows(2) {
        if t.strides[w[0]] != t.strides[w[1]] * t.dims[w[1]] {
            return Err(unsupported(format!(
                "`{name}`: LRN needs the spatial axes in one run of memory, outermost first (as NCHW and NHWC are); strides {:?} for dims {:?}",
                t.strides, t.dims
            )));
        }
    }
    let spatial: i64 = t.dims[2..].iter().product();
    let s_stride = live.last().map_or(1, |&a| t.strides[a]);
    Ok(TensorDescriptor { set: true, dt_raw: t.dt_raw, dims: vec![t.dims[0], 1, t.dims[1], spatial], strides: vec![t.strides[0], t.strides[0], t.strides[1], s_stride] })
}

/// The window sum over channels of `v` (a `[n, 1, C, S]` view), divided by the window width:
/// an average pooling counting padding, with `pre` channels before each channel and `post`
/// after.
fn window_mean(g: &mut Graph, v: TensorId, width: i64, pre: i64, post: i64) -> TensorId {
    let attrs = ResampleAttrs { mode: ResampleMode::AvgIncludePadding, window: vec![width, 1], stride: vec![1, 1], pre_padding: vec![pre, 0], post_padding: vec![post, 0] };
    g.resample(v, attrs)
}

fn constant(g: &mut Graph, name: &str, v: f64, double: bool) -> TensorId {
    g.tensor(TensorDesc::scalar(name, v, scaling_type(double)))
}

/// `s = k + alpha * mean of x^2 over each channel's window` for the `[n, 1, C, S]` view `x`.
fn lrn_scale(g: &mut Graph, x: TensorId, d: &LrnDescriptor, double: bool) -> TensorId {
    let lo = (d.n as i64 - 1) / 2;
    let hi = d.n as i64 - 1 - lo;
    let sq = g.mul(x, x);
    let mean = window_mean(g, sq, d.n as i64, lo, hi);
    let alpha = constant(g, "alpha", d.alpha, double);
    let k = constant(g, "k", d.k, double);
    let scaled = g.mul(mean, alpha);
    g.add(scaled, k)
}

fn check_mode(mode: i32) -> R<()> {
    if mode != CUDNN_LRN_CROSS_CHANNEL_DIM1 {
        return Err(bad(format!("lrnMode {mode} is not a cudnnLRNMode_t (CUDNN_LRN_CROSS_CHANNEL_DIM1 = 0)")));
    }
    Ok(())
}

fn float_same_dims(ts: &[(&TensorDescriptor, &str)]) -> R<()> {
    let (first, fname) = ts[0];
    for (t, name) in ts {
        if t.dims != first.dims {
            return Err(bad(format!("`{name}` has dims {:?} but `{fname}` has {:?}; they must match", t.dims, first.dims)));
        }
        if !t.dt().is_float() {
            return Err(ApiError::new(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, format!("`{name}` is {}; LRN takes float types", t.dt())));
        }
    }
    Ok(())
}

const X: i64 = 1;
const Y: i64 = 2;
const DY: i64 = 3;
const DX: i64 = 4;

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnLRNCrossChannelForward(
    h: cudnnHandle_t,
    norm: cudnnLRNDescriptor_t,
    mode: i32,
    alpha: *const c_void,
    x_desc: cudnnTensorDescriptor_t,
    x: *const c_void,
    beta: *const c_void,
    y_desc: cudnnTensorDescriptor_t,
    y: *mut c_void,
) -> Status {
    guard("cudnnLRNCrossChannelForward", || {
        let h = handle(h)?;
        let d = LRNS.get(norm).map_err(|e| ApiError::new(e.status, format!("`normDesc`: {}", e.msg)))?;
        check_mode(mode)?;
        let (xd, yd) = (tensor(x_desc, "xDesc")?, tensor(y_desc, "yDesc")?);
        float_same_dims(&[(&xd, "xDesc"), (&yd, "yDesc")])?;
        let (xv, yv) = (channel_view(&xd, "xDesc")?, channel_view(&yd, "yDesc")?);
        // SAFETY: host scaling values (the caller's contract; null is refused).
        let s = unsafe { Scaling::read(alpha, beta, yd.double()) }?;
        let key = format!("lrn_fwd|{d:?}|{xv:?}|{yv:?}|{}", s.tag());
        let plan = plan(&h, &key, PlanPolicy::default(), move || {
            let double = yv.double();
            let mut g = new_graph("cudnn_lrn_forward", double);
            let xt = g.tensor(xv.fd("x", X));
            let sc = lrn_scale(&mut g, xt, &d, double);
            let nb = constant(&mut g, "minus_beta", -d.beta, double);
            let p = g.pointwise(PointwiseMode::Pow, &[sc, nb]);
            let r = g.mul(xt, p);
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
pub extern "C" fn cudnnLRNCrossChannelBackward(
    h: cudnnHandle_t,
    norm: cudnnLRNDescriptor_t,
    mode: i32,
    alpha: *const c_void,
    y_desc: cudnnTensorDescriptor_t,
    y: *const c_void,
    dy_desc: cudnnTensorDescriptor_t,
    dy: *const c_void,
    x_desc: cudnnTensorDescriptor_t,
    x: *const c_void,
    beta: *const c_void,
    dx_desc: cudnnTensorDescriptor_t,
    dx: *mut c_void,
) -> Status {
    guard("cudnnLRNCrossChannelBackward", || {
        let h = handle(h)?;
        let d = LRNS.get(norm).map_err(|e| ApiError::new(e.status, format!("`normDesc`: {}", e.msg)))?;
        check_mode(mode)?;
        let (yd, dyd, xd, dxd) = (tensor(y_desc, "yDesc")?, tensor(dy_desc, "dyDesc")?, tensor(x_desc, "xDesc")?, tensor(dx_desc, "dxDesc")?);
        float_same_dims(&[(&yd, "yDesc"), (&dyd, "dyDesc"), (&xd, "xDesc"), (&dxd, "dxDesc")])?;
        let views = [channel_view(&yd, "yDesc")?, channel_view(&dyd, "dyDesc")?, channel_view(&xd, "xDesc")?, channel_view(&dxd, "dxDesc")?];
        // SAFETY: host scaling values (the caller's contract; null is refused).
        let s = unsafe { Scaling::read(alpha, beta, dxd.double()) }?;
        let key = format!("lrn_bwd|{d:?}|{views:?}|{}", s.tag());
        let [yv, dyv, xv, dxv] = views;
        let plan = plan(&h, &key, PlanPolicy::default(), move || {
            let double = dxv.double();
            let mut g = new_graph("cudnn_lrn_backward", double);
            let yt = g.tensor(yv.fd("y", Y));
            let dyt = g.tensor(dyv.fd("dy", DY));
            let xt = g.tensor(xv.fd("x", X));
            let sc = lrn_scale(&mut g, xt, &d, double);
            // dy * s^-beta
            let nb = constant(&mut g, "minus_beta", -d.beta, double);
            let p = g.pointwise(PointwiseMode::Pow, &[sc, nb]);
            let direct = g.mul(dyt, p);
            // 2 alpha beta * x * (mean over the transposed window of dy y / s)
            let dyy = g.mul(dyt, yt);
            let t = g.pointwise(PointwiseMode::Div, &[dyy, sc]);
            let lo = (d.n as i64 - 1) / 2;
            let hi = d.n as i64 - 1 - lo;
            let tm = window_mean(&mut g, t, d.n as i64, hi, lo);
            let coef = constant(&mut g, "two_alpha_beta", 2.0 * d.alpha * d.beta, double);
            let xtm = g.mul(xt, tm);
            let cross = g.mul(xtm, coef);
            let r = g.pointwise(PointwiseMode::Sub, &[direct, cross]);
            s.build(&mut g, r, &dxv, DX);
            Ok(g)
        })?;
        let mut call = Call::default();
        call.input(Y, y, yd.bytes(), "y")?;
        call.input(DY, dy, dyd.bytes(), "dy")?;
        call.input(X, x, xd.bytes(), "x")?;
        s.feed(&mut call, DX, dx, dxd.bytes(), "dx")?;
        execute(&h, &plan, &call)
    })
}
