//! Dropout and LRN on the CPU handle: dropout's masks (their rate, the scaling of what is kept,
//! determinism by seed, fresh draws per call, the backward pass through the reserve space) and
//! cross-channel LRN forward and backward against plain loops (odd and even windows, NCHW and
//! NHWC, alpha/beta blending, the backward also against a numerical gradient); the status and
//! message of bad calls.

mod common;
use common::*;
use ferrodnn_cudnn::dropout::*;
use ferrodnn_cudnn::lrn::*;
use ferrodnn_cudnn::types::*;
use std::ffi::c_void;

fn dropout_desc(h: cudnnHandle_t, p: f32, seed: u64, states: &mut [u8]) -> cudnnDropoutDescriptor_t {
    let mut d = std::ptr::null_mut();
    ok(cudnnCreateDropoutDescriptor(&mut d));
    ok(cudnnSetDropoutDescriptor(d, h, p, states.as_mut_ptr() as *mut c_void, states.len(), seed));
    d
}

#[test]
fn dropout_keeps_the_right_share_scales_it_and_is_deterministic_by_seed() {
    let h = Handle::cpu();
    let mut size = 0usize;
    ok(cudnnDropoutGetStatesSize(h.0, &mut size));
    let mut states = vec![0u8; size];
    let dims = [4, 8, 10, 10];
    let t = f32_tensor(&dims, true);
    let n = count(&dims);
    let mut rsize = 0usize;
    ok(cudnnDropoutGetReserveSpaceSize(t, &mut rsize));
    assert!(rsize >= n, "the reserve holds at least a byte per element");
    let p = 0.3f32;
    let d = dropout_desc(h.0, p, 1234, &mut states);
    let x: Vec<f32> = rand(n, 5).iter().map(|v| v + 2.0).collect(); // never 0, so kept elements show
    let forward = |reserve: &mut Vec<u8>| {
        let mut y = vec![f32::NAN; n];
        ok(cudnnDropoutForward(h.0, d, t, p_(&x), t, pm(&mut y), reserve.as_mut_ptr() as *mut c_void, reserve.len()));
        y
    };
    let mut r1 = vec![7u8; rsize];
    let y1 = forward(&mut r1);
    let kept = y1.iter().filter(|&&v| v != 0.0).count();
    let share = kept as f64 / n as f64;
    assert!((share - 0.7).abs() < 0.05, "kept {share} of the elements, expected about 0.7");
    for i in 0..n {
        let want = if y1[i] == 0.0 { 0.0 } else { x[i] as f64 / 0.7 };
        assert!((y1[i] as f64 - want).abs() < 1e-5 * want.abs().max(1.0), "y[{i}] = {} for x {}", y1[i], x[i]);
    }
    // The mask in the reserve space is what was kept (row-major over the logical dims; x is NHWC).
    let st = strides(&dims, true);
    for (i, idx) in indices(&dims).iter().enumerate() {
        let kept = y1[off(idx, &st)] != 0.0;
        assert_eq!(r1[i] != 0, kept, "mask byte {i}");
    }
    // A second call draws anew; setting the descriptor again with the seed starts over.
    let mut r2 = vec![0u8; rsize];
    let y2 = forward(&mut r2);
    assert_ne!(y1, y2, "a second forward call should draw a fresh mask");
    ok(cudnnSetDropoutDescriptor(d, h.0, p, states.as_mut_ptr() as *mut c_void, states.len(), 1234));
    let mut r3 = vec![0u8; rsize];
    assert_eq!(forward(&mut r3), y1, "the same seed gives the same mask");
    // Restoring continues the states buffer's sequence (the next draw is the second one).
    let mut d2 = std::ptr::null_mut();
    ok(cudnnCreateDropoutDescriptor(&mut d2));
    ok(cudnnRestoreDropoutDescriptor(d2, h.0, p, states.as_mut_ptr() as *mut c_void, states.len(), 1234));
    let mut y4 = vec![0f32; n];
    let mut r4 = vec![0u8; rsize];
    ok(cudnnDropoutForward(h.0, d2, t, p_(&x), t, pm(&mut y4), r4.as_mut_ptr() as *mut c_void, rsize));
    assert_eq!(y4, y2, "a restored descriptor continues the states' sequence");
    let (mut gp, mut gs, mut gseed) = (0f32, std::ptr::null_mut(), 0u64);
    ok(cudnnGetDropoutDescriptor(d2, h.0, &mut gp, &mut gs, &mut gseed));
    assert_eq!((gp, gs, gseed), (p, states.as_mut_ptr() as *mut c_void, 1234));
    // Backward: dx = dy * mask / (1 - p).
    let dy = rand(n, 6);
    let mut dx = vec![f32::NAN; n];
    ok(cudnnDropoutBackward(h.0, d, t, p_(&dy), t, pm(&mut dx), r1.as_mut_ptr() as *mut c_void, rsize));
    for i in 0..n {
        let want = if y1[i] == 0.0 { 0.0 } else { dy[i] as f64 / 0.7 };
        assert!((dx[i] as f64 - want).abs() < 1e-5, "dx[{i}] = {}, want {want}", dx[i]);
    }
    // p = 0 keeps everything.
    ok(cudnnSetDropoutDescriptor(d, h.0, 0.0, states.as_mut_ptr() as *mut c_void, states.len(), 1));
    let y0 = forward(&mut r1);
    assert_eq!(y0, x);
    ok(cudnnDestroyDropoutDescriptor(d));
    ok(cudnnDestroyDropoutDescriptor(d2));
}

fn p_(v: &[f32]) -> *const c_void {
    v.as_ptr() as *const c_void
}

#[test]
fn dropout_refuses_bad_calls() {
    let h = Handle::cpu();
    let mut states = vec![0u8; 64];
    let t = f32_tensor(&[2, 3, 4, 5], false);
    let mut d = std::ptr::null_mut();
    ok(cudnnCreateDropoutDescriptor(&mut d));
    let x = vec![1f32; 120];
    let mut y = vec![0f32; 120];
    let mut reserve = vec![0u8; 120];
    fails(cudnnDropoutForward(h.0, d, t, p_(&x), t, pm(&mut y), reserve.as_mut_ptr() as *mut c_void, 120), CUDNN_STATUS_BAD_PARAM, &["dropoutDesc", "never set"]);
    fails(cudnnSetDropoutDescriptor(d, h.0, 1.5, states.as_mut_ptr() as *mut c_void, 64, 1), CUDNN_STATUS_BAD_PARAM, &["dropout 1.5", "[0, 1]"]);
    fails(cudnnSetDropoutDescriptor(d, h.0, 0.5, states.as_mut_ptr() as *mut c_void, 8, 1), CUDNN_STATUS_BAD_PARAM, &["stateSizeInBytes 8"]);
    ok(cudnnSetDropoutDescriptor(d, h.0, 0.5, states.as_mut_ptr() as *mut c_void, 64, 1));
    fails(cudnnDropoutForward(h.0, d, t, p_(&x), t, pm(&mut y), reserve.as_mut_ptr() as *mut c_void, 100), CUDNN_STATUS_BAD_PARAM, &["reserveSpaceSizeInBytes 100", "120 bytes"]);
    fails(cudnnDropoutForward(h.0, d, t, p_(&x), t, pm(&mut y), std::ptr::null_mut(), 120), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["reserveSpace"]);
    let other = f32_tensor(&[2, 3, 4, 6], false);
    fails(cudnnDropoutForward(h.0, d, t, p_(&x), other, pm(&mut y), reserve.as_mut_ptr() as *mut c_void, 120), CUDNN_STATUS_BAD_PARAM, &["ydesc", "[2, 3, 4, 6]"]);
    fails(cudnnDropoutGetStatesSize(h.0, std::ptr::null_mut()), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["sizeInBytes"]);
    ok(cudnnDestroyDropoutDescriptor(d));
}

/// cuDNN's LRN of `x` (dims `[n, c, spatial...]`, strides `st`) by plain loops: `(y, s)` dense
/// in logical order.
fn lrn_loops(x: &[f32], dims: &[i32], st: &[i32], n: u32, alpha: f64, beta: f64, k: f64) -> (Vec<f64>, Vec<f64>) {
    let lo = (n as i64 - 1) / 2;
    let hi = n as i64 - 1 - lo;
    let c = dims[1] as i64;
    let mut y = Vec::new();
    let mut s = Vec::new();
    for idx in indices(dims) {
        let ch = idx[1] as i64;
        let mut sum = 0.0;
        for j in (ch - lo).max(0)..=(ch + hi).min(c - 1) {
            let mut jdx = idx.clone();
            jdx[1] = j as usize;
            let v = x[off(&jdx, st)] as f64;
            sum += v * v;
        }
        let sc = k + alpha / n as f64 * sum;
        s.push(sc);
        y.push(x[off(&idx, st)] as f64 * sc.powf(-beta));
    }
    (y, s)
}

fn lrn_desc(n: u32, alpha: f64, beta: f64, k: f64) -> cudnnLRNDescriptor_t {
    let mut d = std::ptr::null_mut();
    ok(cudnnCreateLRNDescriptor(&mut d));
    ok(cudnnSetLRNDescriptor(d, n, alpha, beta, k));
    d
}

#[test]
fn lrn_forward_and_backward_match_loops() {
    let h = Handle::cpu();
    let dims = [2, 7, 3, 4];
    let total = count(&dims);
    for (win, nhwc) in [(5u32, false), (4, true), (1, false)] {
        let (alpha, beta, k) = (0.8, 0.75, 1.5);
        let d = lrn_desc(win, alpha, beta, k);
        let st = strides(&dims, nhwc);
        let t = f32_tensor(&dims, nhwc);
        let x: Vec<f32> = rand(total, 21).iter().map(|v| v * 2.0).collect();
        let (want, s) = lrn_loops(&x, &dims, &st, win, alpha, beta, k);
        let (one, zero) = (1.0f32, 0.0f32);
        let mut y = vec![f32::NAN; total];
        ok(cudnnLRNCrossChannelForward(h.0, d, CUDNN_LRN_CROSS_CHANNEL_DIM1, sc(&one), t, p_(&x), sc(&zero), t, pm(&mut y)));
        let got: Vec<f32> = indices(&dims).iter().map(|i| y[off(i, &st)]).collect();
        close(&got, &want, 1e-5, &format!("lrn forward (n {win}, nhwc {nhwc})"));
        // Blending: y = 0.5 lrn(x) + 2 y.
        let (a2, b2) = (0.5f32, 2.0f32);
        let mut yb = y.clone();
        ok(cudnnLRNCrossChannelForward(h.0, d, CUDNN_LRN_CROSS_CHANNEL_DIM1, sc(&a2), t, p_(&x), sc(&b2), t, pm(&mut yb)));
        let gotb: Vec<f32> = indices(&dims).iter().map(|i| yb[off(i, &st)]).collect();
        let wantb: Vec<f64> = want.iter().map(|v| 2.5 * v).collect();
        close(&gotb, &wantb, 1e-5, "lrn forward blended");
        // Backward against the loops' formula.
        let dy = rand(total, 22);
        let mut dx = vec![f32::NAN; total];
        ok(cudnnLRNCrossChannelBackward(h.0, d, CUDNN_LRN_CROSS_CHANNEL_DIM1, sc(&one), t, p_(&y), t, p_(&dy), t, p_(&x), sc(&zero), t, pm(&mut dx)));
        let lo = (win as i64 - 1) / 2;
        let hi = win as i64 - 1 - lo;
        let ids = indices(&dims);
        let flat = |idx: &[usize]| -> usize { ids.iter().position(|i| i.as_slice() == idx).unwrap() };
        let mut want_dx = Vec::new();
        for idx in &ids {
            let ch = idx[1] as i64;
            let i = flat(idx);
            let mut acc = 0.0;
            // Channels j whose window holds ch: j - lo <= ch <= j + hi.
            for j in (ch - hi).max(0)..=(ch + lo).min(dims[1] as i64 - 1) {
                let mut jdx = idx.clone();
                jdx[1] = j as usize;
                let fj = flat(&jdx);
                acc += dy[off(&jdx, &st)] as f64 * want[fj] / s[fj];
            }
            let xi = x[off(idx, &st)] as f64;
            want_dx.push(dy[off(idx, &st)] as f64 * s[i].powf(-beta) - 2.0 * alpha * beta / win as f64 * xi * acc);
        }
        let got_dx: Vec<f32> = ids.iter().map(|i| dx[off(i, &st)]).collect();
        close(&got_dx, &want_dx, 1e-4, &format!("lrn backward (n {win}, nhwc {nhwc})"));
        // And against a numerical gradient of sum(dy * y(x)) for a few elements.
        for &e in &[0usize, 17, 60, total - 1] {
            let f = |delta: f32| -> f64 {
                let mut xp = x.clone();
                xp[off(&ids[e], &st)] += delta;
                let (yp, _) = lrn_loops(&xp, &dims, &st, win, alpha, beta, k);
                ids.iter().enumerate().map(|(i, idx)| yp[i] * dy[off(idx, &st)] as f64).sum()
            };
            let numeric = (f(1e-2) - f(-1e-2)) / 2e-2;
            assert!((numeric - got_dx[e] as f64).abs() < 1e-3 * (1.0 + numeric.abs()), "dx[{e}] = {} but the numerical gradient is {numeric}", got_dx[e]);
        }
        ok(cudnnDestroyLRNDescriptor(d));
    }
}

#[test]
fn lrn_refuses_bad_descriptors_and_calls() {
    let h = Handle::cpu();
    let mut d = std::ptr::null_mut();
    ok(cudnnCreateLRNDescriptor(&mut d));
    let (mut n, mut a, mut b, mut k) = (0u32, 0f64, 0f64, 0f64);
    ok(cudnnGetLRNDescriptor(d, &mut n, &mut a, &mut b, &mut k));
    assert_eq!((n, a, b, k), (5, 1e-4, 0.75, 2.0), "cuDNN's defaults");
    fails(cudnnSetLRNDescriptor(d, 17, 1e-4, 0.75, 2.0), CUDNN_STATUS_BAD_PARAM, &["lrnN 17"]);
    fails(cudnnSetLRNDescriptor(d, 5, 1e-4, 0.001, 2.0), CUDNN_STATUS_BAD_PARAM, &["lrnBeta"]);
    fails(cudnnSetLRNDescriptor(d, 5, 1e-4, 0.75, 0.0), CUDNN_STATUS_BAD_PARAM, &["lrnK"]);
    let t = f32_tensor(&[1, 3, 2, 2], false);
    let x = vec![1f32; 12];
    let mut y = vec![0f32; 12];
    let (one, zero) = (1.0f32, 0.0f32);
    fails(cudnnLRNCrossChannelForward(h.0, d, 1, sc(&one), t, p_(&x), sc(&zero), t, pm(&mut y)), CUDNN_STATUS_BAD_PARAM, &["lrnMode 1"]);
    let odd = tdesc(CUDNN_DATA_FLOAT, &[1, 3, 2, 2], &[12, 4, 1, 2]);
    fails(cudnnLRNCrossChannelForward(h.0, d, 0, sc(&one), odd, p_(&x), sc(&zero), odd, pm(&mut y)), CUDNN_STATUS_NOT_SUPPORTED, &["xDesc", "spatial axes"]);
    fails(cudnnLRNCrossChannelForward(h.0, d, 0, std::ptr::null(), t, p_(&x), sc(&zero), t, pm(&mut y)), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["alpha"]);
    ok(cudnnDestroyLRNDescriptor(d));
    fails(cudnnLRNCrossChannelForward(h.0, d, 0, sc(&one), t, p_(&x), sc(&zero), t, pm(&mut y)), CUDNN_STATUS_BAD_PARAM, &["normDesc", "not a live"]);
}
