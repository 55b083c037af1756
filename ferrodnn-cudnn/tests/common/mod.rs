//! Helpers of the C API's Rust tests: a CPU handle, descriptors, seeded data, strided indexing,
//! and comparisons. The tests call the exported `extern "C"` functions exactly as C does, with
//! host pointers on a CPU handle (ferrodnnCreateCpu).

#![allow(dead_code)]

pub mod backend;

use ferrodnn_cudnn::desc::*;
use ferrodnn_cudnn::handle::*;
use ferrodnn_cudnn::types::*;
use std::ffi::c_void;

/// Panics with the library's last error message unless `s` is success.
#[track_caller]
pub fn ok(s: Status) {
    if s != CUDNN_STATUS_SUCCESS {
        panic!("status {} ({}): {}", s, status_name(s), ferrodnn_cudnn::api::last_error());
    }
}

/// Checks a call failed with `want` and that its message mentions each of `words`.
#[track_caller]
pub fn fails(s: Status, want: Status, words: &[&str]) {
    let msg = ferrodnn_cudnn::api::last_error();
    assert_eq!(s, want, "expected {} but got {} ({msg})", status_name(want), status_name(s));
    for w in words {
        assert!(msg.contains(w), "the message should mention `{w}`: {msg}");
    }
}

pub struct Handle(pub cudnnHandle_t);
impl Handle {
    pub fn cpu() -> Handle {
        let mut h = std::ptr::null_mut();
        ok(ferrodnnCreateCpu(&mut h));
        Handle(h)
    }
}
impl Drop for Handle {
    fn drop(&mut self) {
        ok(cudnnDestroy(self.0));
    }
}

/// A tensor descriptor with explicit strides.
pub fn tdesc(dt: i32, dims: &[i32], strides: &[i32]) -> cudnnTensorDescriptor_t {
    let mut t = std::ptr::null_mut();
    ok(cudnnCreateTensorDescriptor(&mut t));
    ok(cudnnSetTensorNdDescriptor(t, dt, dims.len() as i32, dims.as_ptr(), strides.as_ptr()));
    t
}

/// Packed strides of `dims` in NCHW order, or channels-last when `nhwc`.
pub fn strides(dims: &[i32], nhwc: bool) -> Vec<i32> {
    let order: Vec<usize> = if nhwc { std::iter::once(0).chain(2..dims.len()).chain(std::iter::once(1)).collect() } else { (0..dims.len()).collect() };
    let mut s = vec![0; dims.len()];
    let mut acc = 1;
    for &a in order.iter().rev() {
        s[a] = acc;
        acc *= dims[a];
    }
    s
}

pub fn f32_tensor(dims: &[i32], nhwc: bool) -> cudnnTensorDescriptor_t {
    tdesc(CUDNN_DATA_FLOAT, dims, &strides(dims, nhwc))
}

pub fn fdesc(dims: &[i32], nhwc: bool) -> cudnnFilterDescriptor_t {
    let mut f = std::ptr::null_mut();
    ok(cudnnCreateFilterDescriptor(&mut f));
    ok(cudnnSetFilterNdDescriptor(f, CUDNN_DATA_FLOAT, if nhwc { CUDNN_TENSOR_NHWC } else { CUDNN_TENSOR_NCHW }, dims.len() as i32, dims.as_ptr()));
    f
}

/// Seeded values in [-1, 1).
pub fn rand(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) & 0xFF_FFFF) as f32 / 8_388_608.0 - 1.0
        })
        .collect()
}

pub fn count(dims: &[i32]) -> usize {
    dims.iter().map(|&d| d as usize).product()
}

/// The memory offset of logical index `idx`.
pub fn off(idx: &[usize], strides: &[i32]) -> usize {
    idx.iter().zip(strides).map(|(&i, &s)| i * s as usize).sum()
}

/// Every logical index of `dims`, row-major.
pub fn indices(dims: &[i32]) -> Vec<Vec<usize>> {
    let mut out = vec![vec![]];
    for &d in dims {
        out = out.into_iter().flat_map(|p| (0..d as usize).map(move |i| [p.clone(), vec![i]].concat())).collect();
    }
    out
}

/// Max of |a - b| / (1 + |b|): relative for large values, absolute near 0.
#[track_caller]
pub fn close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let e = (g as f64 - w).abs() / (1.0 + w.abs());
        assert!(e <= tol && g.is_finite() == w.is_finite(), "{what}[{i}]: got {g}, want {w} (error {e:e} > {tol:e})");
    }
}

pub fn p(v: &[f32]) -> *const c_void {
    v.as_ptr() as *const c_void
}

pub fn pm(v: &mut [f32]) -> *mut c_void {
    v.as_mut_ptr() as *mut c_void
}

pub fn sc(v: &f32) -> *const c_void {
    v as *const f32 as *const c_void
}
