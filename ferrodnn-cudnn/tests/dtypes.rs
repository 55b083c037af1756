//! Other data types through the C API (half, bfloat16 and double data, double scaling factors),
//! and a seeded fuzz of the descriptor setters and a call on random descriptors: every outcome
//! is a status code, never a panic (CUDNN_STATUS_INTERNAL_ERROR) or a crash.

mod common;
use common::*;
use ferrodnn_cudnn::conv::*;
use ferrodnn_cudnn::desc::*;
use ferrodnn_cudnn::ops::*;
use ferrodnn_cudnn::types::*;
use half::{bf16, f16};
use std::ffi::c_void;
use std::ptr::null_mut;

fn conv_desc(pad: i32) -> cudnnConvolutionDescriptor_t {
    let mut cd = null_mut();
    ok(cudnnCreateConvolutionDescriptor(&mut cd));
    ok(cudnnSetConvolution2dDescriptor(cd, pad, pad, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    cd
}

/// y = conv(x, w) (cross-correlation, padding 1, 3x3, NHWC) from f64 values.
fn conv_ref(x: &[f64], w: &[f64], xd: [i32; 4], k: i32) -> Vec<f64> {
    let (xs, ws) = (strides(&xd, true), strides(&[k, xd[1], 3, 3], true));
    let yd = [xd[0], k, xd[2], xd[3]];
    let ys = strides(&yd, true);
    let mut y = vec![0f64; count(&yd)];
    for o in indices(&yd) {
        for c in 0..xd[1] as usize {
            for r in 0..3 {
                for s in 0..3 {
                    let (ih, iw) = (o[2] as i32 - 1 + r, o[3] as i32 - 1 + s);
                    if ih >= 0 && iw >= 0 && ih < xd[2] && iw < xd[3] {
                        y[off(&o, &ys)] += x[off(&[o[0], c, ih as usize, iw as usize], &xs)] * w[off(&[o[1], c, r as usize, s as usize], &ws)];
                    }
                }
            }
        }
    }
    y
}

#[test]
fn half_convolution() {
    let h = Handle::cpu();
    let xdims = [2, 8, 5, 6];
    let k = 16;
    let xd = tdesc(CUDNN_DATA_HALF, &xdims, &strides(&xdims, true));
    let mut wd = null_mut();
    ok(cudnnCreateFilterDescriptor(&mut wd));
    ok(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_HALF, CUDNN_TENSOR_NHWC, k, 8, 3, 3));
    let ydims = [2, k, 5, 6];
    let yd = tdesc(CUDNN_DATA_HALF, &ydims, &strides(&ydims, true));
    let x: Vec<f16> = rand(count(&xdims), 1).iter().map(|&v| f16::from_f32(v)).collect();
    let w: Vec<f16> = rand(count(&[k, 8, 3, 3]), 2).iter().map(|&v| f16::from_f32(v)).collect();
    let want = conv_ref(&x.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), &w.iter().map(|v| v.to_f64()).collect::<Vec<_>>(), xdims, k);
    let mut y = vec![f16::NAN; count(&ydims)];
    // Half data takes float scaling factors.
    let (one, zero) = (1.0f32, 0.0f32);
    let cd = conv_desc(1);
    ok(cudnnConvolutionForward(
        h.0,
        sc(&one),
        xd,
        x.as_ptr() as *const c_void,
        wd,
        w.as_ptr() as *const c_void,
        cd,
        0,
        null_mut(),
        0,
        sc(&zero),
        yd,
        y.as_mut_ptr() as *mut c_void,
    ));
    let got: Vec<f32> = y.iter().map(|v| v.to_f32()).collect();
    // f16 storage rounds to 2^-11 relative.
    close(&got, &want, 1e-3, "half conv");
}

#[test]
fn double_convolution_with_double_scaling() {
    let h = Handle::cpu();
    let xdims = [1, 3, 4, 5];
    let k = 2;
    let xd = tdesc(CUDNN_DATA_DOUBLE, &xdims, &strides(&xdims, true));
    let mut wd = null_mut();
    ok(cudnnCreateFilterDescriptor(&mut wd));
    ok(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_DOUBLE, CUDNN_TENSOR_NHWC, k, 3, 3, 3));
    let ydims = [1, k, 4, 5];
    let yd = tdesc(CUDNN_DATA_DOUBLE, &ydims, &strides(&ydims, true));
    let x: Vec<f64> = rand(count(&xdims), 3).iter().map(|&v| v as f64).collect();
    let w: Vec<f64> = rand(count(&[k, 3, 3, 3]), 4).iter().map(|&v| v as f64).collect();
    let old: Vec<f64> = rand(count(&ydims), 5).iter().map(|&v| v as f64).collect();
    let conv = conv_ref(&x, &w, xdims, k);
    let mut y = old.clone();
    // Double data takes double scaling factors: 0.1 is not a float.
    let (alpha, beta) = (0.1f64, 0.3f64);
    let cd = conv_desc(1);
    ok(cudnnConvolutionForward(
        h.0,
        &alpha as *const f64 as *const c_void,
        xd,
        x.as_ptr() as *const c_void,
        wd,
        w.as_ptr() as *const c_void,
        cd,
        0,
        null_mut(),
        0,
        &beta as *const f64 as *const c_void,
        yd,
        y.as_mut_ptr() as *mut c_void,
    ));
    for (i, ((&g, &c), &o)) in y.iter().zip(&conv).zip(&old).enumerate() {
        let want = 0.1 * c + 0.3 * o;
        assert!((g - want).abs() <= 1e-12 * (1.0 + want.abs()), "y[{i}]: got {g}, want {want} (f64 all the way)");
    }
}

#[test]
fn bfloat16_softmax() {
    let h = Handle::cpu();
    let dims = [2, 7, 1, 1];
    let t = tdesc(CUDNN_DATA_BFLOAT16, &dims, &strides(&dims, false));
    let x: Vec<bf16> = rand(14, 6).iter().map(|&v| bf16::from_f32(3.0 * v)).collect();
    let mut y = vec![bf16::NAN; 14];
    let (one, zero) = (1.0f32, 0.0f32);
    ok(cudnnSoftmaxForward(h.0, CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_INSTANCE, sc(&one), t, x.as_ptr() as *const c_void, sc(&zero), t, y.as_mut_ptr() as *mut c_void));
    let mut want = vec![0f64; 14];
    for n in 0..2 {
        let row: Vec<f64> = x[n * 7..n * 7 + 7].iter().map(|v| v.to_f64()).collect();
        let m = row.iter().cloned().fold(f64::MIN, f64::max);
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        for c in 0..7 {
            want[n * 7 + c] = (row[c] - m).exp() / s;
        }
    }
    close(&y.iter().map(|v| v.to_f32()).collect::<Vec<_>>(), &want, 4e-3, "bf16 softmax");
}

/// A small seeded generator for the fuzz.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn range(&mut self, lo: i32, hi: i32) -> i32 {
        lo + (self.next() % (hi - lo + 1) as u64) as i32
    }
}

#[test]
fn fuzzed_setters_and_calls_give_status_codes() {
    let iters: usize = std::env::var("FERRODNN_CUDNN_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(1500);
    let mut rng = Rng(std::env::var("FERRODNN_CUDNN_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(7));
    let h = Handle::cpu();
    let (mut t1, mut t2, mut f, mut c, mut a, mut p) = (null_mut(), null_mut(), null_mut(), null_mut(), null_mut(), null_mut());
    ok(cudnnCreateTensorDescriptor(&mut t1));
    ok(cudnnCreateTensorDescriptor(&mut t2));
    ok(cudnnCreateFilterDescriptor(&mut f));
    ok(cudnnCreateConvolutionDescriptor(&mut c));
    ok(cudnnCreateActivationDescriptor(&mut a));
    ok(cudnnCreatePoolingDescriptor(&mut p));
    let (mut rnn, mut rdata) = (null_mut(), null_mut());
    ok(ferrodnn_cudnn::rnn::cudnnCreateRNNDescriptor(&mut rnn));
    ok(ferrodnn_cudnn::rnn::cudnnCreateRNNDataDescriptor(&mut rdata));
    let (mut successes, mut ran) = (0, 0);
    for _ in 0..iters {
        let nb = rng.range(0, 6);
        let dims: Vec<i32> = (0..nb.max(0)).map(|_| rng.range(-1, 5)).collect();
        let st: Vec<i32> = (0..nb.max(0)).map(|_| rng.range(-1, 40)).collect();
        let dt = rng.range(-1, 14);
        let e = rng.range(-1, 7);
        let statuses = [
            cudnnSetTensorNdDescriptor(if rng.next() & 1 == 0 { t1 } else { t2 }, dt, nb, dims.as_ptr(), st.as_ptr()),
            cudnnSetTensorNdDescriptorEx(t2, e % 3, dt, nb, dims.as_ptr()),
            cudnnSetFilterNdDescriptor(f, dt, e % 3, nb, dims.as_ptr()),
            cudnnSetConvolutionNdDescriptor(c, nb - 2, st.as_ptr(), dims.as_ptr(), dims.as_ptr(), e % 2, dt),
            cudnnSetConvolutionGroupCount(c, rng.range(-1, 4)),
            cudnnSetActivationDescriptor(a, e, e % 2, rng.range(-2, 3) as f64),
            cudnnSetPoolingNdDescriptor(p, e % 5, e % 2, nb - 2, dims.as_ptr(), st.as_ptr(), dims.as_ptr()),
            ferrodnn_cudnn::rnn::cudnnSetRNNDescriptor_v8(
                rnn,
                e % 5,
                e % 5,
                rng.range(-1, 4),
                rng.range(-1, 2),
                rng.range(-1, 1),
                dt,
                rng.range(-1, 3),
                e % 5,
                rng.range(-1, 5),
                rng.range(-1, 5),
                rng.range(-1, 5),
                rng.range(-1, 3),
                null_mut(),
                rng.range(0, 2) as u32,
            ),
            ferrodnn_cudnn::rnn::cudnnRNNSetClip_v8(rnn, e % 3, e % 3, rng.range(-2, 2) as f64, rng.range(-2, 2) as f64),
            ferrodnn_cudnn::rnn::cudnnSetRNNDataDescriptor(
                rdata,
                dt,
                e % 4,
                rng.range(-1, 4),
                nb.clamp(1, 5),
                rng.range(-1, 5),
                if nb == 0 { std::ptr::null() } else { dims.as_ptr() },
                null_mut(),
            ),
        ];
        for s in statuses {
            assert_ne!(s, CUDNN_STATUS_INTERNAL_ERROR, "{}", ferrodnn_cudnn::api::last_error());
            successes += (s == CUDNN_STATUS_SUCCESS) as usize;
        }
        // Calls on whatever the descriptors hold, with buffers of the sizes the library reports.
        let (mut b1, mut b2) = (0usize, 0usize);
        if cudnnGetTensorSizeInBytes(t1, &mut b1) != 0 || cudnnGetTensorSizeInBytes(t2, &mut b2) != 0 || b1 > 1 << 20 || b2 > 1 << 20 {
            continue;
        }
        let x = vec![0.5f64; b1 / 8 + 1];
        let mut y = vec![0f64; b2 / 8 + 1];
        let (one, zero) = (1.0f64, 0.0f64);
        let (px, py) = (x.as_ptr() as *const c_void, y.as_mut_ptr() as *mut c_void);
        let (s1, s0) = (&one as *const f64 as *const c_void, &zero as *const f64 as *const c_void);
        for s in [
            cudnnActivationForward(h.0, a, s1, t1, px, s0, t2, py),
            cudnnPoolingForward(h.0, p, s1, t1, px, s0, t2, py),
            cudnnSoftmaxForward(h.0, e % 3, e % 2, s1, t1, px, s0, t2, py),
            cudnnAddTensor(h.0, s1, t1, px, s1, t2, py),
            cudnnTransformTensor(h.0, s1, t1, px, s0, t2, py),
            cudnnConvolutionForward(h.0, s1, t1, px, f, px, c, 0, null_mut(), 0, s0, t2, py),
            {
                let (mut w, mut r) = (0usize, 0usize);
                ferrodnn_cudnn::rnn::cudnnGetRNNTempSpaceSizes(h.0, rnn, e % 3, rdata, &mut w, &mut r)
            },
        ] {
            assert_ne!(s, CUDNN_STATUS_INTERNAL_ERROR, "{}", ferrodnn_cudnn::api::last_error());
            ran += (s == CUDNN_STATUS_SUCCESS) as usize;
        }
    }
    eprintln!("{successes} setter calls and {ran} executions succeeded");
    assert!(ran > 0, "some calls on fuzzed descriptors should run");
    assert!(successes > iters / 4, "the fuzz should set valid descriptors often: {successes} of {}", iters * 10);
    ok(cudnnDestroyTensorDescriptor(t1));
    ok(cudnnDestroyTensorDescriptor(t2));
    ok(cudnnDestroyFilterDescriptor(f));
    ok(cudnnDestroyConvolutionDescriptor(c));
    ok(cudnnDestroyActivationDescriptor(a));
    ok(cudnnDestroyPoolingDescriptor(p));
    ok(ferrodnn_cudnn::rnn::cudnnDestroyRNNDescriptor(rnn));
    ok(ferrodnn_cudnn::rnn::cudnnDestroyRNNDataDescriptor(rdata));
}
