//! Batch normalization on the CPU handle against loops: training forward with running
//! statistics updated in place, inference, backward, PER_ACTIVATION, the Ex forms with ReLU and
//! the residual add, NHWC.

mod common;
use common::*;
use ferrodnn_cudnn::batchnorm::*;
use ferrodnn_cudnn::desc::*;
use ferrodnn_cudnn::types::*;
use std::ptr::{null, null_mut};

struct Stats {
    mean: Vec<f64>,
    var: Vec<f64>,
}

/// Per-parameter mean and biased variance; `group` maps an x index to its parameter index.
fn stats(x: &[f32], dims: &[i32], st: &[i32], nparam: usize, group: &dyn Fn(&[usize]) -> usize) -> (Stats, Vec<Vec<usize>>) {
    let mut members = vec![Vec::new(); nparam];
    for i in indices(dims) {
        members[group(&i)].push(off(&i, st));
    }
    let mean: Vec<f64> = members.iter().map(|m| m.iter().map(|&o| x[o] as f64).sum::<f64>() / m.len() as f64).collect();
    let var: Vec<f64> = members.iter().zip(&mean).map(|(m, &mu)| m.iter().map(|&o| (x[o] as f64 - mu).powi(2)).sum::<f64>() / m.len() as f64).collect();
    (Stats { mean, var }, members)
}

fn derived(x: cudnnTensorDescriptor_t, mode: i32) -> cudnnTensorDescriptor_t {
    let mut d = null_mut();
    ok(cudnnCreateTensorDescriptor(&mut d));
    ok(cudnnDeriveBNTensorDescriptor(d, x, mode));
    d
}

fn run(mode: i32, nhwc: bool) {
    let h = Handle::cpu();
    let dims = [4, 3, 5, 6];
    let st = strides(&dims, nhwc);
    let xd = tdesc(CUDNN_DATA_FLOAT, &dims, &st);
    let bd = derived(xd, mode);
    let per_act = mode == CUDNN_BATCHNORM_PER_ACTIVATION;
    let pdims: Vec<i32> = if per_act { vec![1, 3, 5, 6] } else { vec![1, 3, 1, 1] };
    let (mut dt, mut nb, mut got, mut gs) = (0, 0, [0i32; 4], [0i32; 4]);
    ok(cudnnGetTensorNdDescriptor(bd, 4, &mut dt, &mut nb, got.as_mut_ptr(), gs.as_mut_ptr()));
    assert_eq!((dt, got.to_vec()), (CUDNN_DATA_FLOAT, pdims.clone()));
    let np = count(&pdims);
    let pst = strides(&pdims, false);
    // Parameter index of an x index.
    let group = move |i: &[usize]| if per_act { off(&[0, i[1], i[2], i[3]], &pst) } else { i[1] };
    let n = count(&dims);
    let x: Vec<f32> = rand(n, 31).iter().map(|v| 2.0 * v + 0.5).collect();
    let scale = rand(np, 32);
    let bias = rand(np, 33);
    let (s, members) = stats(&x, &dims, &st, np, &group);
    let eps = 1e-4;
    let inv: Vec<f64> = s.var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
    let normalized = |i: &[usize]| {
        let (o, g) = (off(i, &st), group(i));
        (x[o] as f64 - s.mean[g]) * inv[g] * scale[g] as f64 + bias[g] as f64
    };
    let mut want_y = vec![0f64; n];
    for i in indices(&dims) {
        want_y[off(&i, &st)] = normalized(&i);
    }

    // Training, running statistics in place with factor 0.25.
    let rm0 = rand(np, 34);
    let rv0: Vec<f32> = rand(np, 35).iter().map(|v| v.abs() + 0.5).collect();
    let (mut rm, mut rv) = (rm0.clone(), rv0.clone());
    let (mut sm, mut sv) = (vec![f32::NAN; np], vec![f32::NAN; np]);
    let mut y = vec![f32::NAN; n];
    let (one, zero) = (1.0f32, 0.0f32);
    ok(cudnnBatchNormalizationForwardTraining(
        h.0,
        mode,
        sc(&one),
        sc(&zero),
        xd,
        p(&x),
        xd,
        pm(&mut y),
        bd,
        p(&scale),
        p(&bias),
        0.25,
        pm(&mut rm),
        pm(&mut rv),
        eps,
        pm(&mut sm),
        pm(&mut sv),
    ));
    close(&y, &want_y, 1e-5, "training y");
    close(&sm, &s.mean, 1e-6, "saved mean");
    close(&sv, &inv, 1e-5, "saved inverse std");
    let want_rm: Vec<f64> = rm0.iter().zip(&s.mean).map(|(&r, &m)| 0.75 * r as f64 + 0.25 * m).collect();
    let want_rv: Vec<f64> = rv0.iter().zip(&s.var).zip(&members).map(|((&r, &v), m)| 0.75 * r as f64 + 0.25 * v * m.len() as f64 / (m.len() - 1) as f64).collect();
    close(&rm, &want_rm, 1e-6, "running mean");
    close(&rv, &want_rv, 1e-6, "running variance (unbiased)");
    // Without running or saved statistics.
    let mut y2 = vec![f32::NAN; n];
    ok(cudnnBatchNormalizationForwardTraining(
        h.0,
        mode,
        sc(&one),
        sc(&zero),
        xd,
        p(&x),
        xd,
        pm(&mut y2),
        bd,
        p(&scale),
        p(&bias),
        0.0,
        null_mut(),
        null_mut(),
        eps,
        null_mut(),
        null_mut(),
    ));
    close(&y2, &want_y, 1e-5, "training y without statistics");

    // Inference with the running statistics, alpha 2, beta 0.5.
    let old = rand(n, 36);
    let mut yi = old.clone();
    let (two, half) = (2.0f32, 0.5f32);
    ok(cudnnBatchNormalizationForwardInference(h.0, mode, sc(&two), sc(&half), xd, p(&x), xd, pm(&mut yi), bd, p(&scale), p(&bias), p(&rm0), p(&rv0), eps));
    let mut want_i = vec![0f64; n];
    for i in indices(&dims) {
        let (o, g) = (off(&i, &st), group(&i));
        let v = (x[o] as f64 - rm0[g] as f64) / (rv0[g] as f64 + eps).sqrt() * scale[g] as f64 + bias[g] as f64;
        want_i[o] = 2.0 * v + 0.5 * old[o] as f64;
    }
    close(&yi, &want_i, 1e-5, "inference");

    // Backward from the saved statistics.
    let dy = rand(n, 37);
    let mut dsum = vec![0f64; np];
    let mut dxhat_sum = vec![0f64; np];
    for i in indices(&dims) {
        let (o, g) = (off(&i, &st), group(&i));
        let xhat = (x[o] as f64 - s.mean[g]) * inv[g];
        dsum[g] += dy[o] as f64;
        dxhat_sum[g] += dy[o] as f64 * xhat;
    }
    let mut want_dx = vec![0f64; n];
    for i in indices(&dims) {
        let (o, g) = (off(&i, &st), group(&i));
        let m = members[g].len() as f64;
        let xhat = (x[o] as f64 - s.mean[g]) * inv[g];
        want_dx[o] = scale[g] as f64 * inv[g] * (dy[o] as f64 - dsum[g] / m - xhat * dxhat_sum[g] / m);
    }
    let (mut dx, mut ds, mut db) = (vec![f32::NAN; n], rand(np, 38), rand(np, 39));
    let ds_old = ds.clone();
    ok(cudnnBatchNormalizationBackward(
        h.0,
        mode,
        sc(&one),
        sc(&zero),
        sc(&one),
        sc(&one),
        xd,
        p(&x),
        xd,
        p(&dy),
        xd,
        pm(&mut dx),
        bd,
        p(&scale),
        pm(&mut ds),
        pm(&mut db),
        eps,
        p(&sm),
        p(&sv),
    ));
    close(&dx, &want_dx, 1e-4, "dx");
    // beta for the parameter gradients is 1: they accumulate.
    close(&ds, &dxhat_sum.iter().zip(&ds_old).map(|(&d, &o)| d + o as f64).collect::<Vec<_>>(), 1e-4, "dscale");
    let db_old = rand(np, 39);
    close(&db, &dsum.iter().zip(&db_old).map(|(&d, &o)| d + o as f64).collect::<Vec<_>>(), 1e-4, "dbias");
    // Without saved statistics the backward recomputes them from x.
    let (mut dx2, mut ds2, mut db2) = (vec![f32::NAN; n], vec![f32::NAN; np], vec![f32::NAN; np]);
    ok(cudnnBatchNormalizationBackward(
        h.0,
        mode,
        sc(&one),
        sc(&zero),
        sc(&one),
        sc(&zero),
        xd,
        p(&x),
        xd,
        p(&dy),
        xd,
        pm(&mut dx2),
        bd,
        p(&scale),
        pm(&mut ds2),
        pm(&mut db2),
        eps,
        null(),
        null(),
    ));
    close(&dx2, &want_dx, 1e-4, "dx from recomputed statistics");
    close(&ds2, &dxhat_sum, 1e-4, "dscale from recomputed statistics");
    close(&db2, &dsum, 1e-4, "dbias from recomputed statistics");
}

#[test]
fn spatial_nchw() {
    run(CUDNN_BATCHNORM_SPATIAL, false);
}

#[test]
fn spatial_nhwc() {
    run(CUDNN_BATCHNORM_SPATIAL, true);
}

#[test]
fn spatial_persistent_is_spatial() {
    run(CUDNN_BATCHNORM_SPATIAL_PERSISTENT, true);
}

#[test]
fn per_activation() {
    run(CUDNN_BATCHNORM_PER_ACTIVATION, false);
}

#[test]
fn ex_forms_add_and_relu() {
    let h = Handle::cpu();
    let dims = [3, 4, 3, 5];
    let xd = f32_tensor(&dims, true);
    let bd = derived(xd, CUDNN_BATCHNORM_SPATIAL);
    let n = count(&dims);
    let x = rand(n, 41);
    let z = rand(n, 42);
    let scale = rand(4, 43);
    let bias = rand(4, 44);
    let mut act = null_mut();
    ok(cudnnCreateActivationDescriptor(&mut act));
    ok(cudnnSetActivationDescriptor(act, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
    let mut sizes = [7usize; 3];
    ok(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(h.0, CUDNN_BATCHNORM_SPATIAL, CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION, xd, xd, xd, bd, act, &mut sizes[0]));
    ok(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h.0, CUDNN_BATCHNORM_SPATIAL, CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION, act, xd, &mut sizes[1]));
    ok(cudnnGetBatchNormalizationBackwardExWorkspaceSize(h.0, CUDNN_BATCHNORM_SPATIAL, CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION, xd, xd, xd, xd, xd, bd, act, &mut sizes[2]));
    assert_eq!(sizes, [0, 0, 0]);
    // Reference: plain batchnorm, then + z and relu.
    let (one, zero) = (1.0f32, 0.0f32);
    let mut plain = vec![0f32; n];
    let (mut sm, mut sv) = (vec![0f32; 4], vec![0f32; 4]);
    ok(cudnnBatchNormalizationForwardTraining(
        h.0,
        CUDNN_BATCHNORM_SPATIAL,
        sc(&one),
        sc(&zero),
        xd,
        p(&x),
        xd,
        pm(&mut plain),
        bd,
        p(&scale),
        p(&bias),
        0.0,
        null_mut(),
        null_mut(),
        1e-5,
        pm(&mut sm),
        pm(&mut sv),
    ));
    let want: Vec<f64> = plain.iter().zip(&z).map(|(&b, &zz)| (b as f64 + zz as f64).max(0.0)).collect();
    let mut y = vec![f32::NAN; n];
    ok(cudnnBatchNormalizationForwardTrainingEx(
        h.0,
        CUDNN_BATCHNORM_SPATIAL,
        CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION,
        sc(&one),
        sc(&zero),
        xd,
        p(&x),
        xd,
        p(&z),
        xd,
        pm(&mut y),
        bd,
        p(&scale),
        p(&bias),
        0.0,
        null_mut(),
        null_mut(),
        1e-5,
        null_mut(),
        null_mut(),
        act,
        null_mut(),
        0,
        null_mut(),
        0,
    ));
    close(&y, &want, 1e-5, "bn + z + relu");
    // Backward Ex: dz is dy through the relu; dx, dscale, dbias are the plain backward's of dz.
    let dy = rand(n, 45);
    let dz_want: Vec<f64> = dy.iter().zip(&y).map(|(&d, &yy)| if yy > 0.0 { d as f64 } else { 0.0 }).collect();
    let dzf: Vec<f32> = dz_want.iter().map(|&v| v as f32).collect();
    let (mut dx0, mut ds0, mut db0) = (vec![0f32; n], vec![0f32; 4], vec![0f32; 4]);
    ok(cudnnBatchNormalizationBackward(
        h.0,
        CUDNN_BATCHNORM_SPATIAL,
        sc(&one),
        sc(&zero),
        sc(&one),
        sc(&zero),
        xd,
        p(&x),
        xd,
        p(&dzf),
        xd,
        pm(&mut dx0),
        bd,
        p(&scale),
        pm(&mut ds0),
        pm(&mut db0),
        1e-5,
        p(&sm),
        p(&sv),
    ));
    let (mut dx, mut dz, mut ds, mut db) = (vec![f32::NAN; n], vec![f32::NAN; n], vec![f32::NAN; 4], vec![f32::NAN; 4]);
    ok(cudnnBatchNormalizationBackwardEx(
        h.0,
        CUDNN_BATCHNORM_SPATIAL,
        CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION,
        sc(&one),
        sc(&zero),
        sc(&one),
        sc(&zero),
        xd,
        p(&x),
        xd,
        p(&y),
        xd,
        p(&dy),
        xd,
        pm(&mut dz),
        xd,
        pm(&mut dx),
        bd,
        p(&scale),
        p(&bias),
        pm(&mut ds),
        pm(&mut db),
        1e-5,
        p(&sm),
        p(&sv),
        act,
        null_mut(),
        0,
        null_mut(),
        0,
    ));
    close(&dz, &dz_want, 0.0, "dz");
    close(&dx, &dx0.iter().map(|&v| v as f64).collect::<Vec<_>>(), 1e-5, "dx");
    close(&ds, &ds0.iter().map(|&v| v as f64).collect::<Vec<_>>(), 1e-5, "dscale");
    close(&db, &db0.iter().map(|&v| v as f64).collect::<Vec<_>>(), 1e-5, "dbias");
    let _ = null::<f32>();
}

#[test]
fn bad_batchnorm_calls() {
    let h = Handle::cpu();
    let xd = f32_tensor(&[2, 3, 4, 4], false);
    let bd = derived(xd, CUDNN_BATCHNORM_SPATIAL);
    let wrong = f32_tensor(&[1, 4, 1, 1], false);
    let x = rand(96, 1);
    let mut y = vec![0f32; 96];
    let prm = vec![1f32; 3];
    let (one, zero) = (1.0f32, 0.0f32);
    let call = |bnd, mode, eps: f64, y: &mut Vec<f32>, rm: *mut std::ffi::c_void| {
        cudnnBatchNormalizationForwardTraining(h.0, mode, sc(&one), sc(&zero), xd, p(&x), xd, pm(y), bnd, p(&prm), p(&prm), 0.1, rm, null_mut(), eps, null_mut(), null_mut())
    };
    fails(call(wrong, CUDNN_BATCHNORM_SPATIAL, 1e-5, &mut y, null_mut()), CUDNN_STATUS_BAD_PARAM, &["cudnnBatchNormalizationForwardTraining", "[1, 4, 1, 1]", "[1, 3, 1, 1]"]);
    fails(call(bd, 7, 1e-5, &mut y, null_mut()), CUDNN_STATUS_BAD_PARAM, &["mode 7"]);
    fails(call(bd, CUDNN_BATCHNORM_SPATIAL, -1.0, &mut y, null_mut()), CUDNN_STATUS_BAD_PARAM, &["epsilon"]);
    let mut rm = vec![0f32; 3];
    fails(call(bd, CUDNN_BATCHNORM_SPATIAL, 1e-5, &mut y, pm(&mut rm)), CUDNN_STATUS_BAD_PARAM, &["resultRunningVariance"]);
    // One saved statistic without the other is refused.
    let mut dx = vec![0f32; 96];
    let mut d = vec![0f32; 3];
    let mut d2 = vec![0f32; 3];
    let s = cudnnBatchNormalizationBackward(
        h.0,
        CUDNN_BATCHNORM_SPATIAL,
        sc(&one),
        sc(&zero),
        sc(&one),
        sc(&zero),
        xd,
        p(&x),
        xd,
        p(&x),
        xd,
        pm(&mut dx),
        bd,
        p(&prm),
        pm(&mut d),
        pm(&mut d2),
        1e-5,
        p(&prm),
        null(),
    );
    fails(s, CUDNN_STATUS_BAD_PARAM, &["savedMean and savedInvVariance"]);
}
