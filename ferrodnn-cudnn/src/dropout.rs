//! Dropout: descriptors, the states and reserve-space sizes, forward and backward, on
//! ferrodnn's counter-based random numbers (the graph's `rng` op, Philox 4x32-10).
//!
//! The forward pass keeps each element with probability `1 - p` (an `rng` Bernoulli draw from
//! the descriptor's seed and a counter), writes `y = x * keep / (1 - p)` and stores the keep
//! mask, one byte per element of `x` in row-major order, in the reserve space; the backward pass
//! reads the mask back: `dx = dy * keep / (1 - p)`. The random state is the seed and a counter
//! that each forward call advances by one (a Philox offset, so each call draws fresh numbers),
//! kept by the library per states buffer: cudnnSetDropoutDescriptor starts it at 0,
//! cudnnRestoreDropoutDescriptor continues where the states buffer's last descriptor left it.
//! So the same seed and the same sequence of calls give the same masks on every run (though not
//! NVIDIA's masks: the generators differ). The states buffer itself is never read or written.

use crate::api::*;
use crate::desc::{tensor, TensorDescriptor};
use crate::exec::{execute, new_graph, plan, scaling_type, Call};
use crate::handle::handle;
use crate::registry::Registry;
use crate::types::*;
use ferrodnn::graph::ops::rng::Distribution;
use ferrodnn::{DataType, PlanPolicy, TensorDesc};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

/// What cudnnDropoutGetStatesSize reports: ferrodnn keeps the state itself (seed and counter)
/// and never touches the buffer, but programs allocate what this says.
pub const STATES_SIZE: usize = 64;

/// A dropout descriptor.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DropoutDescriptor {
    pub set: bool,
    pub p: f32,
    pub seed: u64,
    /// The states buffer given (a key for the random state).
    pub states: usize,
}

pub static DROPOUTS: Registry<DropoutDescriptor> = Registry::new("cudnnDropoutDescriptor_t");

/// The random state by states buffer (or by descriptor, when the buffer is null): the seed
/// and the counter of the next forward call.
static STATES: Mutex<Option<HashMap<usize, (u64, u64)>>> = Mutex::new(None);

fn state_key(desc: cudnnDropoutDescriptor_t, d: &DropoutDescriptor) -> usize {
    if d.states != 0 {
        d.states
    } else {
        desc as usize
    }
}

/// The seed and counter for a forward call on `desc`, advancing the counter.
fn next_draw(desc: cudnnDropoutDescriptor_t, d: &DropoutDescriptor) -> (u64, u64) {
    let mut m = STATES.lock().unwrap_or_else(|p| p.into_inner());
    let e = m.get_or_insert_with(HashMap::new).entry(state_key(desc, d)).or_insert((d.seed, 0));
    let draw = *e;
    e.1 += 1;
    draw
}

/// The seed and counter for a forward call that draws from the dropout descriptor `desc` (an
/// RNN's dropout between layers), advancing the counter.
pub(crate) fn draw(desc: cudnnDropoutDescriptor_t) -> R<(u64, u64)> {
    let d = dropout_desc(desc)?;
    Ok(next_draw(desc, &d))
}

#[no_mangle]
pub extern "C" fn cudnnCreateDropoutDescriptor(out: *mut cudnnDropoutDescriptor_t) -> Status {
    guard("cudnnCreateDropoutDescriptor", || {
        non_null(out, "dropoutDesc")?;
        let p = DROPOUTS.create(DropoutDescriptor::default());
        // SAFETY: checked not null; the caller gives a writable descriptor slot.
        unsafe { write_out(out, "dropoutDesc", p) }
    })
}

#[no_mangle]
pub extern "C" fn cudnnDestroyDropoutDescriptor(p: cudnnDropoutDescriptor_t) -> Status {
    guard("cudnnDestroyDropoutDescriptor", || if p.is_null() { Ok(()) } else { DROPOUTS.destroy(p) })
}

#[no_mangle]
pub extern "C" fn cudnnDropoutGetStatesSize(h: cudnnHandle_t, size: *mut usize) -> Status {
    guard("cudnnDropoutGetStatesSize", || {
        handle(h)?;
        // SAFETY: the caller gives a writable size_t (null is refused).
        unsafe { write_out(size, "sizeInBytes", STATES_SIZE) }
    })
}

/// The reserve space: the keep mask, one byte per element.
fn reserve_bytes(x: &TensorDescriptor) -> usize {
    x.elements() as usize
}

#[no_mangle]
pub extern "C" fn cudnnDropoutGetReserveSpaceSize(x_desc: cudnnTensorDescriptor_t, size: *mut usize) -> Status {
    guard("cudnnDropoutGetReserveSpaceSize", || {
        let xd = tensor(x_desc, "xdesc")?;
        // SAFETY: the caller gives a writable size_t (null is refused).
        unsafe { write_out(size, "sizeInBytes", reserve_bytes(&xd)) }
    })
}

fn set_dropout(p: cudnnDropoutDescriptor_t, h: cudnnHandle_t, dropout: f32, states: *mut c_void, state_size: usize, seed: u64, restore: bool) -> R<()> {
    handle(h)?;
    if !(0.0..=1.0).contains(&dropout) {
        return Err(bad(format!("dropout {dropout} is outside [0, 1]")));
    }
    if !states.is_null() && state_size < STATES_SIZE && !restore {
        return Err(bad(format!("stateSizeInBytes {state_size} is less than the {STATES_SIZE} bytes cudnnDropoutGetStatesSize asks for")));
    }
    let d = DropoutDescriptor { set: true, p: dropout, seed, states: states as usize };
    DROPOUTS
        .with(p, |slot| {
            *slot = d;
            Ok(())
        })
        .map_err(|e| ApiError::new(e.status, format!("`dropoutDesc`: {}", e.msg)))?;
    let mut m = STATES.lock().unwrap_or_else(|p| p.into_inner());
    let m = m.get_or_insert_with(HashMap::new);
    let key = state_key(p, &d);
    if restore {
        m.entry(key).or_insert((seed, 0));
    } else {
        m.insert(key, (seed, 0));
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn cudnnSetDropoutDescriptor(p: cudnnDropoutDescriptor_t, h: cudnnHandle_t, dropout: f32, states: *mut c_void, state_size: usize, seed: u64) -> Status {
    guard("cudnnSetDropoutDescriptor", || set_dropout(p, h, dropout, states, state_size, seed, false))
}

#[no_mangle]
pub extern "C" fn cudnnRestoreDropoutDescriptor(p: cudnnDropoutDescriptor_t, h: cudnnHandle_t, dropout: f32, states: *mut c_void, state_size: usize, seed: u64) -> Status {
    guard("cudnnRestoreDropoutDescriptor", || set_dropout(p, h, dropout, states, state_size, seed, true))
}

#[no_mangle]
pub extern "C" fn cudnnGetDropoutDescriptor(p: cudnnDropoutDescriptor_t, h: cudnnHandle_t, dropout: *mut f32, states: *mut *mut c_void, seed: *mut u64) -> Status {
    guard("cudnnGetDropoutDescriptor", || {
        handle(h)?;
        let d = DROPOUTS.get(p)?;
        // SAFETY: each out pointer is checked not null; the caller gives writable values.
        unsafe {
            write_out(dropout, "dropout", d.p)?;
            write_out(states, "states", d.states as *mut c_void)?;
            write_out(seed, "seed", d.seed)
        }
    })
}

fn dropout_desc(p: cudnnDropoutDescriptor_t) -> R<DropoutDescriptor> {
    let d = DROPOUTS.get(p).map_err(|e| ApiError::new(e.status, format!("`dropoutDesc`: {}", e.msg)))?;
    if !d.set {
        return Err(bad("`dropoutDesc` was created but never set (cudnnSetDropoutDescriptor)"));
    }
    Ok(d)
}

/// The factor kept elements are multiplied by: `1 / (1 - p)` (0 when every element drops).
fn keep_scale(p: f32) -> f64 {
    if p >= 1.0 {
        0.0
    } else {
        1.0 / (1.0 - p as f64)
    }
}

fn check_pair(a: &TensorDescriptor, an: &str, b: &TensorDescriptor, bn: &str) -> R<()> {
    if a.dims != b.dims {
        return Err(bad(format!("`{an}` has dims {:?} but `{bn}` has {:?}; they must match", a.dims, b.dims)));
    }
    if !a.dt().is_float() || a.dt_raw != b.dt_raw {
        return Err(ApiError::new(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, format!("`{an}` is {} and `{bn}` {}; dropout takes one float type", a.dt(), b.dt())));
    }
    Ok(())
}

fn check_reserve(reserve: *mut c_void, size: usize, x: &TensorDescriptor) -> R<()> {
    let need = reserve_bytes(x);
    if size < need {
        return Err(bad(format!("reserveSpaceSizeInBytes {size} is less than the {need} bytes cudnnDropoutGetReserveSpaceSize gives for these dims")));
    }
    if need > 0 {
        non_null(reserve, "reserveSpace")?;
    }
    Ok(())
}

const X: i64 = 1;
const Y: i64 = 2;
const MASK: i64 = 3;
const SEED: i64 = 4;
const OFFSET: i64 = 5;

/// The mask's tensor: one byte per element of `dims`, row-major.
fn mask_desc(dims: &[i64]) -> TensorDesc {
    TensorDesc::new("keep", dims, DataType::U8).with_uid(MASK)
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnDropoutForward(
    h: cudnnHandle_t,
    desc: cudnnDropoutDescriptor_t,
    x_desc: cudnnTensorDescriptor_t,
    x: *const c_void,
    y_desc: cudnnTensorDescriptor_t,
    y: *mut c_void,
    reserve: *mut c_void,
    reserve_size: usize,
) -> Status {
    guard("cudnnDropoutForward", || {
        let h = handle(h)?;
        let d = dropout_desc(desc)?;
        let (xd, yd) = (tensor(x_desc, "xdesc")?, tensor(y_desc, "ydesc")?);
        check_pair(&xd, "xdesc", &yd, "ydesc")?;
        check_reserve(reserve, reserve_size, &xd)?;
        let (seed, offset) = next_draw(desc, &d);
        let keep = 1.0 - d.p as f64;
        let key = format!("dropout_fwd|{:?}|{xd:?}|{yd:?}", d.p);
        let (xc, yc) = (xd.clone(), yd.clone());
        let plan = plan(&h, &key, PlanPolicy::default(), move || {
            let double = yc.double();
            let mut g = new_graph("cudnn_dropout_forward", double);
            let xt = g.tensor(xc.fd("x", X));
            let st = g.tensor(TensorDesc::runtime_scalar("seed", DataType::I64).with_uid(SEED));
            let ot = g.tensor(TensorDesc::runtime_scalar("offset", DataType::I64).with_uid(OFFSET));
            let m = g.rng(st, ot, &xc.dims, Distribution::Bernoulli { probability: keep.clamp(0.0, 1.0) });
            g.set_output(m);
            *g.desc_mut(m) = TensorDesc { name: g.desc(m).name.clone(), ..mask_desc(&xc.dims) };
            let scale = g.tensor(TensorDesc::scalar("scale", keep_scale(d.p), scaling_type(double)));
            let kept = g.mul(xt, m);
            let r = g.mul(kept, scale);
            g.set_output(r);
            let t = g.desc_mut(r);
            t.dims = yc.dims.clone();
            t.strides = yc.strides.clone();
            t.data_type = Some(yc.dt());
            t.uid = Some(Y);
            Ok(g)
        })?;
        let mut call = Call::default();
        call.input(X, x, xd.bytes(), "x")?;
        call.output(Y, y, yd.bytes(), "y")?;
        call.output(MASK, reserve, reserve_bytes(&xd), "reserveSpace")?;
        call.scalars.push((SEED, (seed as i64).to_ne_bytes().to_vec()));
        call.scalars.push((OFFSET, (offset as i64).to_ne_bytes().to_vec()));
        execute(&h, &plan, &call)
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cudnnDropoutBackward(
    h: cudnnHandle_t,
    desc: cudnnDropoutDescriptor_t,
    dy_desc: cudnnTensorDescriptor_t,
    dy: *const c_void,
    dx_desc: cudnnTensorDescriptor_t,
    dx: *mut c_void,
    reserve: *mut c_void,
    reserve_size: usize,
) -> Status {
    guard("cudnnDropoutBackward", || {
        let h = handle(h)?;
        let d = dropout_desc(desc)?;
        let (dyd, dxd) = (tensor(dy_desc, "dydesc")?, tensor(dx_desc, "dxdesc")?);
        check_pair(&dyd, "dydesc", &dxd, "dxdesc")?;
        check_reserve(reserve, reserve_size, &dyd)?;
        let key = format!("dropout_bwd|{:?}|{dyd:?}|{dxd:?}", d.p);
        let (dyc, dxc) = (dyd.clone(), dxd.clone());
        let plan = plan(&h, &key, PlanPolicy::default(), move || {
            let double = dxc.double();
            let mut g = new_graph("cudnn_dropout_backward", double);
            let dyt = g.tensor(dyc.fd("dy", X));
            let m = g.tensor(mask_desc(&dyc.dims));
            let scale = g.tensor(TensorDesc::scalar("scale", keep_scale(d.p), scaling_type(double)));
            let kept = g.mul(dyt, m);
            let r = g.mul(kept, scale);
            g.set_output(r);
            let t = g.desc_mut(r);
            t.dims = dxc.dims.clone();
            t.strides = dxc.strides.clone();
            t.data_type = Some(dxc.dt());
            t.uid = Some(Y);
            Ok(g)
        })?;
        let mut call = Call::default();
        call.input(X, dy, dyd.bytes(), "dy")?;
        call.input(MASK, reserve, reserve_bytes(&dyd), "reserveSpace")?;
        call.output(Y, dx, dxd.bytes(), "dx")?;
        execute(&h, &plan, &call)
    })
}
