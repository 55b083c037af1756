//! Builders of backend descriptors for the tests (the backend API called as C calls it).

#![allow(dead_code)]

use super::ok;
use ferrodnn_cudnn::backend::attrs::*;
use ferrodnn_cudnn::backend::*;
use ferrodnn_cudnn::types::*;
use std::ffi::c_void;

/// A backend descriptor, destroyed on drop.
pub struct B(pub cudnnBackendDescriptor_t);

impl B {
    pub fn new(kind: i32) -> B {
        let mut d = std::ptr::null_mut();
        ok(cudnnBackendCreateDescriptor(kind, &mut d));
        B(d)
    }
    pub fn set_raw<T>(&self, attr: i32, ty: i32, v: &[T]) -> Status {
        cudnnBackendSetAttribute(self.0, attr, ty, v.len() as i64, v.as_ptr() as *const c_void)
    }
    pub fn i64s(self, attr: i32, v: &[i64]) -> B {
        ok(self.set_raw(attr, T_INT64, v));
        self
    }
    pub fn int(self, attr: i32, ty: i32, v: i32) -> B {
        ok(self.set_raw(attr, ty, &[v]));
        self
    }
    pub fn f64(self, attr: i32, v: f64) -> B {
        ok(self.set_raw(attr, T_DOUBLE, &[v]));
        self
    }
    pub fn boolean(self, attr: i32, v: bool) -> B {
        ok(self.set_raw(attr, T_BOOLEAN, &[v]));
        self
    }
    pub fn handle(self, attr: i32, h: cudnnHandle_t) -> B {
        ok(self.set_raw(attr, T_HANDLE, &[h]));
        self
    }
    pub fn descs(self, attr: i32, v: &[&B]) -> B {
        let raw: Vec<cudnnBackendDescriptor_t> = v.iter().map(|d| d.0).collect();
        ok(self.set_raw(attr, T_BACKEND_DESCRIPTOR, &raw));
        self
    }
    pub fn fin(self) -> B {
        ok(cudnnBackendFinalize(self.0));
        self
    }
    pub fn get_i64(&self, attr: i32) -> i64 {
        let (mut n, mut v) = (0i64, 0i64);
        ok(cudnnBackendGetAttribute(self.0, attr, T_INT64, 1, &mut n, &mut v as *mut i64 as *mut c_void));
        assert_eq!(n, 1);
        v
    }
}

impl B {
    /// The descriptor's type, as the registry knows it.
    pub fn kind_of(d: &B) -> i32 {
        BACKEND.with(d.0, |x| Ok(x.kind)).unwrap_or(-1)
    }
}

impl Drop for B {
    fn drop(&mut self) {
        ok(cudnnBackendDestroyDescriptor(self.0));
    }
}

pub fn packed(dims: &[i64]) -> Vec<i64> {
    ferrodnn::graph::packed_strides(dims)
}

pub fn nhwc(dims: &[i64]) -> Vec<i64> {
    let order: Vec<usize> = std::iter::once(0).chain(2..dims.len()).chain(std::iter::once(1)).collect();
    ferrodnn::graph::strides_for_order(dims, &order)
}

/// A finalized f32 tensor descriptor.
pub fn tensor(uid: i64, dims: &[i64], strides: &[i64], is_virtual: bool) -> B {
    tensor_of(uid, dims, strides, CUDNN_DATA_FLOAT, is_virtual)
}

/// A finalized tensor descriptor of data type `dt` (16-byte alignment, IS_VIRTUAL always set).
pub fn tensor_of(uid: i64, dims: &[i64], strides: &[i64], dt: i32, is_virtual: bool) -> B {
    B::new(TENSOR)
        .i64s(TENSOR_UNIQUE_ID, &[uid])
        .int(TENSOR_DATA_TYPE, T_DATA_TYPE, dt)
        .i64s(TENSOR_DIMENSIONS, dims)
        .i64s(TENSOR_STRIDES, strides)
        .i64s(TENSOR_BYTE_ALIGNMENT, &[16])
        .boolean(TENSOR_IS_VIRTUAL, is_virtual)
        .fin()
}

/// The memory offset of logical element `flat` (row-major over `dims`) at `strides`.
pub fn offset(flat: usize, dims: &[usize], strides: &[i64]) -> usize {
    let mut rem = flat;
    let mut off = 0i64;
    for a in (0..dims.len()).rev() {
        off += (rem % dims[a]) as i64 * strides[a];
        rem /= dims[a];
    }
    off as usize
}

/// A by-value f32 scalar tensor.
pub fn scalar(uid: i64) -> B {
    B::new(TENSOR)
        .i64s(TENSOR_UNIQUE_ID, &[uid])
        .int(TENSOR_DATA_TYPE, T_DATA_TYPE, CUDNN_DATA_FLOAT)
        .i64s(TENSOR_DIMENSIONS, &[1, 1, 1, 1])
        .i64s(TENSOR_STRIDES, &[1, 1, 1, 1])
        .i64s(TENSOR_BYTE_ALIGNMENT, &[16])
        .boolean(TENSOR_IS_BY_VALUE, true)
        .fin()
}

pub fn pw_desc(mode: i32) -> B {
    B::new(POINTWISE).int(POINTWISE_MODE, T_POINTWISE_MODE, mode).int(POINTWISE_MATH_PREC, T_DATA_TYPE, CUDNN_DATA_FLOAT).fin()
}

/// A pointwise operation: `y = mode(x[, b])`.
pub fn pw_op(desc: &B, x: &B, b: Option<&B>, y: &B) -> B {
    let mut op = B::new(OP_POINTWISE).descs(OP_PW_DESCRIPTOR, &[desc]).descs(OP_PW_XDESC, &[x]).descs(OP_PW_YDESC, &[y]);
    if let Some(b) = b {
        op = op.descs(OP_PW_BDESC, &[b]);
    }
    op.fin()
}

pub fn op_graph(h: cudnnHandle_t, ops: &[&B]) -> B {
    B::new(OPERATIONGRAPH).handle(OPERATIONGRAPH_HANDLE, h).descs(OPERATIONGRAPH_OPS, ops).fin()
}

/// Heuristics in `mode`: their engine configurations, each finalized.
pub fn heuristics(graph: &B, mode: i32) -> Vec<B> {
    let heur = B::new(ENGINEHEUR).descs(ENGINEHEUR_OPERATION_GRAPH, &[graph]).int(ENGINEHEUR_MODE, T_HEUR_MODE, mode).fin();
    let mut n = 0i64;
    ok(cudnnBackendGetAttribute(heur.0, ENGINEHEUR_RESULTS, T_BACKEND_DESCRIPTOR, 0, &mut n, std::ptr::null_mut()));
    assert!(n >= 1, "heuristics gave no engine configuration");
    let cfgs: Vec<B> = (0..n).map(|_| B::new(ENGINECFG)).collect();
    let mut raw: Vec<cudnnBackendDescriptor_t> = cfgs.iter().map(|c| c.0).collect();
    let mut got = 0i64;
    ok(cudnnBackendGetAttribute(heur.0, ENGINEHEUR_RESULTS, T_BACKEND_DESCRIPTOR, n, &mut got, raw.as_mut_ptr() as *mut c_void));
    assert_eq!(got, n);
    cfgs
}

pub fn plan(h: cudnnHandle_t, cfg: &B) -> B {
    B::new(EXECUTION_PLAN).handle(EXECUTION_PLAN_HANDLE, h).descs(EXECUTION_PLAN_ENGINE_CONFIG, &[cfg]).fin()
}

/// A by-value scalar of type `dt` (an int or float `cudnnDataType_t`).
pub fn scalar_of(uid: i64, dt: i32) -> B {
    B::new(TENSOR)
        .i64s(TENSOR_UNIQUE_ID, &[uid])
        .int(TENSOR_DATA_TYPE, T_DATA_TYPE, dt)
        .i64s(TENSOR_DIMENSIONS, &[1, 1, 1, 1])
        .i64s(TENSOR_STRIDES, &[1, 1, 1, 1])
        .boolean(TENSOR_IS_BY_VALUE, true)
        .fin()
}

/// The first configuration whose engine reports no reduced precision (so that two libraries or
/// two handles compute alike), else the first.
pub fn full_precision(cfgs: &[B]) -> &B {
    for c in cfgs {
        let engine = B::new(ENGINE);
        let mut n = 0i64;
        ok(cudnnBackendGetAttribute(c.0, ENGINECFG_ENGINE, T_BACKEND_DESCRIPTOR, 1, &mut n, &engine.0 as *const _ as *mut c_void));
        let mut notes = [0i32; 10];
        ok(cudnnBackendGetAttribute(engine.0, ENGINE_NUMERICAL_NOTE, T_NUMERICAL_NOTE, 10, &mut n, notes.as_mut_ptr() as *mut c_void));
        if !notes[..n as usize].iter().any(|&v| v == NUMERICAL_NOTE_TENSOR_CORE || v == NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) {
            return c;
        }
    }
    &cfgs[0]
}

/// A finalized variant pack of `uids` at `ptrs`, with `workspace`.
pub fn pack(uids: &[i64], ptrs: &[*mut c_void], workspace: *mut c_void) -> B {
    let p = B::new(VARIANT_PACK).i64s(VARIANT_PACK_UNIQUE_IDS, uids);
    ok(p.set_raw(VARIANT_PACK_DATA_POINTERS, T_VOID_PTR, ptrs));
    ok(p.set_raw(VARIANT_PACK_WORKSPACE, T_VOID_PTR, &[workspace]));
    p.fin()
}
