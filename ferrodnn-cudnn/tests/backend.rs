//! The backend descriptor API on the CPU handle: graphs built from tensor and operation
//! descriptors (conv + bias + relu, matmul + bias, layernorm, a pointwise chain, reductions),
//! planned through engine heuristics, engine configurations and execution plans, and executed
//! on host buffers, each against the same graph built with ferrodnn's graph API and run on its
//! f64 reference engine; then the status codes and messages of bad calls.

mod common;
use common::backend::*;
use common::*;
use ferrodnn::graph::ops::conv::ConvAttrs;
use ferrodnn::graph::ops::norm::NormAttrs;
use ferrodnn::graph::ops::pointwise::PointwiseMode;
use ferrodnn::graph::ops::reduction::ReductionMode;
use ferrodnn::layout::Nd;
use ferrodnn::{DataType, Graph, TensorDesc, TensorId};
use ferrodnn_cudnn::backend::attrs::*;
use ferrodnn_cudnn::backend::*;
use ferrodnn_cudnn::types::*;
use std::collections::HashMap;
use std::ffi::c_void;

/// Host buffers of one execution, by uid.
struct Buffers {
    data: HashMap<i64, Vec<f32>>,
    scalars: HashMap<i64, f32>,
    int_scalars: HashMap<i64, i64>,
}

impl Buffers {
    fn new() -> Buffers {
        Buffers { data: HashMap::new(), scalars: HashMap::new(), int_scalars: HashMap::new() }
    }
    /// Dense values of logical dims scattered into a strided buffer (gaps poisoned).
    fn input(&mut self, uid: i64, nd: &Nd, strides: &[i64]) {
        let extent = 1 + nd.dims.iter().zip(strides).map(|(&d, &s)| (d as i64 - 1) * s).sum::<i64>();
        let mut buf = vec![f32::NAN; extent as usize];
        for (i, &v) in nd.data.iter().enumerate() {
            buf[offset(i, &nd.dims, strides)] = v as f32;
        }
        self.data.insert(uid, buf);
    }
    fn output(&mut self, uid: i64, dims: &[i64], strides: &[i64]) {
        let extent = 1 + dims.iter().zip(strides).map(|(&d, &s)| (d - 1) * s).sum::<i64>();
        self.data.insert(uid, vec![f32::NAN; extent as usize]);
    }
    fn dense(&self, uid: i64, dims: &[i64], strides: &[i64]) -> Vec<f32> {
        let n: i64 = dims.iter().product();
        let d: Vec<usize> = dims.iter().map(|&x| x as usize).collect();
        (0..n as usize).map(|i| self.data[&uid][offset(i, &d, strides)]).collect()
    }
    /// A variant pack of every buffer, with `workspace`.
    fn pack(&mut self, workspace: &mut [u8]) -> B {
        let mut uids = Vec::new();
        let mut ptrs: Vec<*mut c_void> = Vec::new();
        for (&u, v) in self.data.iter_mut() {
            uids.push(u);
            ptrs.push(v.as_mut_ptr() as *mut c_void);
        }
        for (&u, v) in self.scalars.iter_mut() {
            uids.push(u);
            ptrs.push(v as *mut f32 as *mut c_void);
        }
        for (&u, v) in self.int_scalars.iter_mut() {
            uids.push(u);
            ptrs.push(v as *mut i64 as *mut c_void);
        }
        let pack = B::new(VARIANT_PACK).i64s(VARIANT_PACK_UNIQUE_IDS, &uids);
        ok(pack.set_raw(VARIANT_PACK_DATA_POINTERS, T_VOID_PTR, &ptrs));
        let ws = workspace.as_mut_ptr() as *mut c_void;
        ok(pack.set_raw(VARIANT_PACK_WORKSPACE, T_VOID_PTR, &[ws]));
        pack.fin()
    }
}

/// Plans the graph (heuristics in `mode`, the first configuration), checks the workspace size
/// queries agree, and executes it on `bufs`.
fn run(h: cudnnHandle_t, graph: &B, mode: i32, bufs: &mut Buffers) {
    let cfgs = heuristics(graph, mode);
    let ws_cfg = cfgs[0].get_i64(ENGINECFG_WORKSPACE_SIZE);
    let p = plan(h, &cfgs[0]);
    let ws = p.get_i64(EXECUTION_PLAN_WORKSPACE_SIZE);
    assert_eq!(ws, ws_cfg, "the plan's workspace and its engine configuration's differ");
    let mut workspace = vec![0u8; ws as usize];
    let pack = bufs.pack(&mut workspace);
    ok(cudnnBackendExecute(h, p.0, pack.0));
}

/// The reference: `g` on ferrodnn's f64 engine with `inputs`, output `uid`'s dense values.
fn reference(g: &Graph, inputs: &HashMap<TensorId, Nd>, uid: i64) -> Vec<f64> {
    let out = ferrodnn::testing::run_cpu(g, inputs).expect("the reference graph runs");
    let t = g.tensors.iter().position(|t| t.uid == Some(uid)).map(TensorId).expect("uid in the reference graph");
    out[&t].data.clone()
}

fn rand_nd(dims: &[i64], seed: u64) -> Nd {
    let d: Vec<usize> = dims.iter().map(|&x| x as usize).collect();
    let n = d.iter().product();
    Nd::new(d, rand(n, seed).into_iter().map(|v| v as f64).collect())
}

fn check(got: &[f32], want: &[f64], tol: f64, what: &str) {
    close(got, want, tol, what);
}

#[test]
fn conv_bias_relu_matches_the_reference_in_every_heuristic_mode() {
    let h = Handle::cpu();
    let (xd, wd, bd, yd) = ([2i64, 8, 9, 9], [16i64, 8, 3, 3], [1i64, 16, 1, 1], [2i64, 16, 9, 9]);
    let x = tensor(1, &xd, &nhwc(&xd), false);
    let w = tensor(2, &wd, &nhwc(&wd), false);
    let b = tensor(3, &bd, &packed(&bd), false);
    let conv_out = tensor(100, &yd, &nhwc(&yd), true);
    let biased = tensor(101, &yd, &nhwc(&yd), true);
    let y = tensor(4, &yd, &nhwc(&yd), false);
    let conv = B::new(CONVOLUTION)
        .int(CONVOLUTION_COMP_TYPE, T_DATA_TYPE, CUDNN_DATA_FLOAT)
        .int(CONVOLUTION_CONV_MODE, T_CONVOLUTION_MODE, CUDNN_CROSS_CORRELATION)
        .i64s(CONVOLUTION_SPATIAL_DIMS, &[2])
        .i64s(CONVOLUTION_PRE_PADDINGS, &[1, 1])
        .i64s(CONVOLUTION_POST_PADDINGS, &[1, 1])
        .i64s(CONVOLUTION_FILTER_STRIDES, &[1, 1])
        .i64s(CONVOLUTION_DILATIONS, &[1, 1])
        .fin();
    let fprop = B::new(OP_CONV_FORWARD)
        .descs(OP_CONV_FWD_X, &[&x])
        .descs(OP_CONV_FWD_W, &[&w])
        .descs(OP_CONV_FWD_Y, &[&conv_out])
        .descs(OP_CONV_FWD_CONV_DESC, &[&conv])
        .f64(OP_CONV_FWD_ALPHA, 1.0)
        .f64(OP_CONV_FWD_BETA, 0.0)
        .fin();
    let add = pw_op(&pw_desc(pw::ADD), &conv_out, Some(&b), &biased);
    let relu = pw_op(&pw_desc(pw::RELU_FWD), &biased, None, &y);
    let graph = op_graph(h.0, &[&fprop, &add, &relu]);
    assert!(graph.get_i64(OPERATIONGRAPH_ENGINE_GLOBAL_COUNT) >= 2, "the CPU handle has the fast engine and the reference");

    // The same graph with ferrodnn's builder.
    let mut g = Graph::new("conv_bias_relu");
    let gx = g.tensor(TensorDesc::new("x", &xd, DataType::F32).with_strides(&nhwc(&xd)).with_uid(1));
    let gw = g.tensor(TensorDesc::new("w", &wd, DataType::F32).with_strides(&nhwc(&wd)).with_uid(2));
    let gb = g.tensor(TensorDesc::new("b", &bd, DataType::F32).with_uid(3));
    let c = g.conv_fprop(gx, gw, ConvAttrs::new(2).with_padding(&[1, 1]));
    let c = g.add(c, gb);
    let gy = g.relu(c);
    g.set_output(gy);
    g.desc_mut(gy).uid = Some(4);
    g.desc_mut(gy).data_type = Some(DataType::F32);
    let inputs: HashMap<TensorId, Nd> = [(gx, rand_nd(&xd, 1)), (gw, rand_nd(&wd, 2)), (gb, rand_nd(&bd, 3))].into_iter().collect();
    let want = reference(&g, &inputs, 4);

    for mode in [HEUR_MODE_A, HEUR_MODE_INSTANT, HEUR_MODE_B, HEUR_MODE_FALLBACK] {
        let mut bufs = Buffers::new();
        bufs.input(1, &inputs[&gx], &nhwc(&xd));
        bufs.input(2, &inputs[&gw], &nhwc(&wd));
        bufs.input(3, &inputs[&gb], &packed(&bd));
        bufs.output(4, &yd, &nhwc(&yd));
        run(h.0, &graph, mode, &mut bufs);
        check(&bufs.dense(4, &yd, &nhwc(&yd)), &want, 1e-5, &format!("conv+bias+relu (heuristics mode {mode})"));
    }
    // FALLBACK gives the most general engine only.
    assert_eq!(heuristics(&graph, HEUR_MODE_FALLBACK).len(), 1);
}

#[test]
fn matmul_with_bias_and_a_transposed_operand() {
    let h = Handle::cpu();
    let (ad, bd, biasd, cd) = ([2i64, 5, 7], [2i64, 7, 3], [1i64, 1, 3], [2i64, 5, 3]);
    let b_strides = [21i64, 1, 7]; // b stored transposed per batch
    let a = tensor(1, &ad, &packed(&ad), false);
    let b = tensor(2, &bd, &b_strides, false);
    let bias = tensor(3, &biasd, &packed(&biasd), false);
    let prod = tensor(50, &cd, &packed(&cd), true);
    let c = tensor(4, &cd, &packed(&cd), false);
    let mm = B::new(MATMUL).int(MATMUL_COMP_TYPE, T_DATA_TYPE, CUDNN_DATA_FLOAT).fin();
    let op = B::new(OP_MATMUL).descs(OP_MATMUL_ADESC, &[&a]).descs(OP_MATMUL_BDESC, &[&b]).descs(OP_MATMUL_CDESC, &[&prod]).descs(OP_MATMUL_DESC, &[&mm]).fin();
    let add = pw_op(&pw_desc(pw::ADD), &prod, Some(&bias), &c);
    let graph = op_graph(h.0, &[&op, &add]);

    let mut g = Graph::new("matmul_bias");
    let ga = g.tensor(TensorDesc::new("a", &ad, DataType::F32).with_uid(1));
    let gb = g.tensor(TensorDesc::new("b", &bd, DataType::F32).with_strides(&b_strides).with_uid(2));
    let gbias = g.tensor(TensorDesc::new("bias", &biasd, DataType::F32).with_uid(3));
    let m = g.matmul(ga, gb);
    let gc = g.add(m, gbias);
    g.set_output(gc);
    g.desc_mut(gc).uid = Some(4);
    g.desc_mut(gc).data_type = Some(DataType::F32);
    let inputs: HashMap<TensorId, Nd> = [(ga, rand_nd(&ad, 4)), (gb, rand_nd(&bd, 5)), (gbias, rand_nd(&biasd, 6))].into_iter().collect();
    let want = reference(&g, &inputs, 4);

    let mut bufs = Buffers::new();
    bufs.input(1, &inputs[&ga], &packed(&ad));
    bufs.input(2, &inputs[&gb], &b_strides);
    bufs.input(3, &inputs[&gbias], &packed(&biasd));
    bufs.output(4, &cd, &packed(&cd));
    run(h.0, &graph, HEUR_MODE_A, &mut bufs);
    check(&bufs.dense(4, &cd, &packed(&cd)), &want, 1e-5, "matmul + bias");
}

#[test]
fn layernorm_training_with_a_by_value_epsilon() {
    let h = Handle::cpu();
    let (xd, sd, statd) = ([4i64, 16, 1, 1], [1i64, 16, 1, 1], [4i64, 1, 1, 1]);
    let x = tensor(1, &xd, &packed(&xd), false);
    let scale = tensor(2, &sd, &packed(&sd), false);
    let bias = tensor(3, &sd, &packed(&sd), false);
    let eps = scalar(4);
    let y = tensor(5, &xd, &packed(&xd), false);
    let mean = tensor(6, &statd, &packed(&statd), false);
    let inv = tensor(7, &statd, &packed(&statd), false);
    let op = B::new(OP_NORM_FORWARD)
        .int(OP_NORM_FWD_MODE, T_NORM_MODE, LAYER_NORM)
        .int(OP_NORM_FWD_PHASE, T_NORM_FWD_PHASE, NORM_FWD_TRAINING)
        .descs(OP_NORM_FWD_XDESC, &[&x])
        .descs(OP_NORM_FWD_SCALE_DESC, &[&scale])
        .descs(OP_NORM_FWD_BIAS_DESC, &[&bias])
        .descs(OP_NORM_FWD_EPSILON_DESC, &[&eps])
        .descs(OP_NORM_FWD_YDESC, &[&y])
        .descs(OP_NORM_FWD_MEAN_DESC, &[&mean])
        .descs(OP_NORM_FWD_INV_VARIANCE_DESC, &[&inv])
        .fin();
    let graph = op_graph(h.0, &[&op]);

    let eps_value = 1e-3f32;
    let mut g = Graph::new("layernorm");
    let gx = g.tensor(TensorDesc::new("x", &xd, DataType::F32).with_uid(1));
    let gs = g.tensor(TensorDesc::new("s", &sd, DataType::F32).with_uid(2));
    let gbias = g.tensor(TensorDesc::new("b", &sd, DataType::F32).with_uid(3));
    let (gy, gm, gi) = g.layernorm(gx, gs, gbias, NormAttrs::default().with_epsilon(eps_value as f64));
    for (t, uid) in [(gy, 5), (gm.unwrap(), 6), (gi.unwrap(), 7)] {
        g.set_output(t);
        g.desc_mut(t).uid = Some(uid);
        g.desc_mut(t).data_type = Some(DataType::F32);
    }
    let inputs: HashMap<TensorId, Nd> = [(gx, rand_nd(&xd, 7)), (gs, rand_nd(&sd, 8)), (gbias, rand_nd(&sd, 9))].into_iter().collect();

    let mut bufs = Buffers::new();
    bufs.input(1, &inputs[&gx], &packed(&xd));
    bufs.input(2, &inputs[&gs], &packed(&sd));
    bufs.input(3, &inputs[&gbias], &packed(&sd));
    bufs.scalars.insert(4, eps_value);
    bufs.output(5, &xd, &packed(&xd));
    bufs.output(6, &statd, &packed(&statd));
    bufs.output(7, &statd, &packed(&statd));
    run(h.0, &graph, HEUR_MODE_A, &mut bufs);
    for (uid, dims, what) in [(5, &xd, "y"), (6, &statd, "mean"), (7, &statd, "inv_variance")] {
        check(&bufs.dense(uid, dims, &packed(dims)), &reference(&g, &inputs, uid), 1e-4, &format!("layernorm {what}"));
    }
}

/// Per-channel `[1, C, 1, 1]` values: channel `c` of `v` at `dims`' strides `strides` (the
/// frontend's NHWC-like per-channel strides).
fn per_channel_input(bufs: &mut Buffers, uid: i64, v: &[f64], strides: &[i64]) {
    bufs.input(uid, &Nd::new(vec![1, v.len(), 1, 1], v.to_vec()), strides);
}

#[test]
fn bn_finalize_statistics_alone_matches_a_direct_computation() {
    let h = Handle::cpu();
    let c = 8usize;
    let cd = [1i64, c as i64, 1, 1];
    let cs = [c as i64, 1, c as i64, c as i64];
    // uids: 1 sum, 2 sq_sum, 3 scale, 4 bias, 5 prev mean, 6 prev var, 7 next mean, 8 next var,
    // 9 saved mean, 10 saved inv std, 11 eq scale, 12 eq bias, 13 count, 14 epsilon, 15 factor.
    let t: Vec<B> = (1..=12).map(|u| tensor(u, &cd, &cs, false)).collect();
    let (count, eps, factor) = (scalar_of(13, CUDNN_DATA_INT64), scalar(14), scalar(15));
    let op = B::new(OP_BN_FINALIZE)
        .int(OP_BN_FINALIZE_STATS_MODE, T_BN_FINALIZE_STATS_MODE, BN_FINALIZE_STATISTICS_TRAINING)
        .int(OP_BN_FINALIZE_MATH_PREC, T_DATA_TYPE, CUDNN_DATA_FLOAT)
        .descs(OP_BN_FINALIZE_Y_SUM_DESC, &[&t[0]])
        .descs(OP_BN_FINALIZE_Y_SQ_SUM_DESC, &[&t[1]])
        .descs(OP_BN_FINALIZE_SCALE_DESC, &[&t[2]])
        .descs(OP_BN_FINALIZE_BIAS_DESC, &[&t[3]])
        .descs(OP_BN_FINALIZE_PREV_RUNNING_MEAN_DESC, &[&t[4]])
        .descs(OP_BN_FINALIZE_PREV_RUNNING_VAR_DESC, &[&t[5]])
        .descs(OP_BN_FINALIZE_UPDATED_RUNNING_MEAN_DESC, &[&t[6]])
        .descs(OP_BN_FINALIZE_UPDATED_RUNNING_VAR_DESC, &[&t[7]])
        .descs(OP_BN_FINALIZE_SAVED_MEAN_DESC, &[&t[8]])
        .descs(OP_BN_FINALIZE_SAVED_INV_STD_DESC, &[&t[9]])
        .descs(OP_BN_FINALIZE_EQ_SCALE_DESC, &[&t[10]])
        .descs(OP_BN_FINALIZE_EQ_BIAS_DESC, &[&t[11]])
        .descs(OP_BN_FINALIZE_ACCUM_COUNT_DESC, &[&count])
        .descs(OP_BN_FINALIZE_EPSILON_DESC, &[&eps])
        .descs(OP_BN_FINALIZE_EXP_AVERAGE_FACTOR_DESC, &[&factor])
        .fin();
    let graph = op_graph(h.0, &[&op]);

    // The sums of n samples per channel (offset so that the mean is not small).
    let n = 12usize;
    let x: Vec<f64> = rand(n * c, 31).into_iter().map(|v| v as f64 + 0.5).collect();
    let sum: Vec<f64> = (0..c).map(|ch| (0..n).map(|i| x[i * c + ch]).sum()).collect();
    let sq: Vec<f64> = (0..c).map(|ch| (0..n).map(|i| x[i * c + ch] * x[i * c + ch]).sum()).collect();
    let f = |seed: u64| -> Vec<f64> { rand(c, seed).into_iter().map(|v| v as f64).collect() };
    let (scale, bias, prev_mean) = (f(32), f(33), f(34));
    let prev_var: Vec<f64> = f(35).into_iter().map(|v| v.abs() + 0.5).collect();
    let (eps_v, factor_v) = (1e-3f32, 0.25f32);
    let mut bufs = Buffers::new();
    for (uid, v) in [(1, &sum), (2, &sq), (3, &scale), (4, &bias), (5, &prev_mean), (6, &prev_var)] {
        per_channel_input(&mut bufs, uid, v, &cs);
    }
    for uid in 7..=12 {
        bufs.output(uid, &cd, &cs);
    }
    bufs.int_scalars.insert(13, n as i64);
    bufs.scalars.insert(14, eps_v);
    bufs.scalars.insert(15, factor_v);
    run(h.0, &graph, HEUR_MODE_A, &mut bufs);

    let (nf, eps_v, factor_v) = (n as f64, eps_v as f64, factor_v as f64);
    let mean: Vec<f64> = sum.iter().map(|s| s / nf).collect();
    let var: Vec<f64> = (0..c).map(|ch| (0..n).map(|i| (x[i * c + ch] - mean[ch]).powi(2)).sum::<f64>() / nf).collect();
    let inv_std: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps_v).sqrt()).collect();
    let eq_scale: Vec<f64> = (0..c).map(|ch| scale[ch] * inv_std[ch]).collect();
    let eq_bias: Vec<f64> = (0..c).map(|ch| bias[ch] - mean[ch] * eq_scale[ch]).collect();
    let next_mean: Vec<f64> = (0..c).map(|ch| (1.0 - factor_v) * prev_mean[ch] + factor_v * mean[ch]).collect();
    let next_var: Vec<f64> = (0..c).map(|ch| (1.0 - factor_v) * prev_var[ch] + factor_v * var[ch] * nf / (nf - 1.0)).collect();
    for (uid, want, what) in [
        (7, &next_mean, "next running mean"),
        (8, &next_var, "next running var"),
        (9, &mean, "saved mean"),
        (10, &inv_std, "saved inv std"),
        (11, &eq_scale, "eq scale"),
        (12, &eq_bias, "eq bias"),
    ] {
        check(&bufs.dense(uid, &cd, &cs), want, 1e-4, &format!("bn_finalize {what}"));
    }
}

#[test]
fn bn_bwd_weights_alone_matches_a_direct_computation() {
    let h = Handle::cpu();
    let (nb, c, hw) = (2usize, 4usize, 9usize);
    let xd = [nb as i64, c as i64, 3, 3];
    let xs = nhwc(&xd);
    let cd = [1i64, c as i64, 1, 1];
    let cs = [c as i64, 1, c as i64, c as i64];
    // uids: 1 x, 2 dy, 3 mean, 4 inv std, 5 scale, 6 dscale, 7 dbias, 8 eq dy scale,
    // 9 eq x scale, 10 eq bias.
    let (x, dy) = (tensor(1, &xd, &xs, false), tensor(2, &xd, &xs, false));
    let t: Vec<B> = (3..=10).map(|u| tensor(u, &cd, &cs, false)).collect();
    let op = B::new(OP_BN_BWD_WEIGHTS)
        .int(OP_BN_BWD_WEIGHTS_MATH_PREC, T_DATA_TYPE, CUDNN_DATA_FLOAT)
        .descs(OP_BN_BWD_WEIGHTS_X_DESC, &[&x])
        .descs(OP_BN_BWD_WEIGHTS_DY_DESC, &[&dy])
        .descs(OP_BN_BWD_WEIGHTS_MEAN_DESC, &[&t[0]])
        .descs(OP_BN_BWD_WEIGHTS_INVSTD_DESC, &[&t[1]])
        .descs(OP_BN_BWD_WEIGHTS_BN_SCALE_DESC, &[&t[2]])
        .descs(OP_BN_BWD_WEIGHTS_DBN_SCALE_DESC, &[&t[3]])
        .descs(OP_BN_BWD_WEIGHTS_DBN_BIAS_DESC, &[&t[4]])
        .descs(OP_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC, &[&t[5]])
        .descs(OP_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC, &[&t[6]])
        .descs(OP_BN_BWD_WEIGHTS_EQ_BIAS, &[&t[7]])
        .fin();
    let graph = op_graph(h.0, &[&op]);

    let (xv, dyv) = (rand_nd(&xd, 41), rand_nd(&xd, 42));
    // Logical NCHW index of (n, ch, i).
    let at = |nd: &Nd, n: usize, ch: usize, i: usize| nd.data[(n * c + ch) * hw + i];
    let cnt = (nb * hw) as f64;
    // The sum of f(n, i) over a channel's elements.
    let each = |f: &dyn Fn(usize, usize) -> f64| -> f64 { (0..nb).flat_map(|n| (0..hw).map(move |i| (n, i))).map(|(n, i)| f(n, i)).sum::<f64>() };
    let mean: Vec<f64> = (0..c).map(|ch| each(&|n, i| at(&xv, n, ch, i)) / cnt).collect();
    let inv_std: Vec<f64> = (0..c).map(|ch| 1.0 / (each(&|n, i| (at(&xv, n, ch, i) - mean[ch]).powi(2)) / cnt + 1e-5).sqrt()).collect();
    let scale: Vec<f64> = rand(c, 43).into_iter().map(|v| v as f64).collect();
    let mut bufs = Buffers::new();
    bufs.input(1, &xv, &xs);
    bufs.input(2, &dyv, &xs);
    for (uid, v) in [(3, &mean), (4, &inv_std), (5, &scale)] {
        per_channel_input(&mut bufs, uid, v, &cs);
    }
    for uid in 6..=10 {
        bufs.output(uid, &cd, &cs);
    }
    run(h.0, &graph, HEUR_MODE_A, &mut bufs);

    let dbias: Vec<f64> = (0..c).map(|ch| each(&|n, i| at(&dyv, n, ch, i))).collect();
    let dscale: Vec<f64> = (0..c).map(|ch| each(&|n, i| at(&dyv, n, ch, i) * (at(&xv, n, ch, i) - mean[ch]) * inv_std[ch])).collect();
    for (uid, want, what) in [(6, &dscale, "dscale"), (7, &dbias, "dbias")] {
        check(&bufs.dense(uid, &cd, &cs), want, 1e-4, &format!("bn_bwd_weights {what}"));
    }
    // The coefficients must give batchnorm's input gradient, written out here:
    // dx = scale * inv_std * (dy - dbias / n - xhat * dscale / n).
    let (eq_dy, eq_x, eq_b) = (bufs.dense(8, &cd, &cs), bufs.dense(9, &cd, &cs), bufs.dense(10, &cd, &cs));
    let mut got = Vec::new();
    let mut want = Vec::new();
    for n in 0..nb {
        for ch in 0..c {
            for i in 0..hw {
                let (xi, dyi) = (at(&xv, n, ch, i), at(&dyv, n, ch, i));
                got.push((eq_dy[ch] as f64 * dyi + eq_x[ch] as f64 * xi + eq_b[ch] as f64) as f32);
                let xhat = (xi - mean[ch]) * inv_std[ch];
                want.push(scale[ch] * inv_std[ch] * (dyi - dbias[ch] / cnt - xhat * dscale[ch] / cnt));
            }
        }
    }
    check(&got, &want, 1e-4, "bn_bwd_weights dx from its coefficients");
    let eq_dy_want: Vec<f64> = (0..c).map(|ch| scale[ch] * inv_std[ch]).collect();
    check(&eq_dy, &eq_dy_want, 1e-5, "bn_bwd_weights eq_dy_scale");
}

#[test]
fn pointwise_chain_with_scalars_alpha_and_a_backward_mode() {
    // t = tanh(2 x + s) (alpha1 = 2, s a by-value scalar); dx = relu_bwd(dy, t).
    let h = Handle::cpu();
    let d = [3i64, 4, 5];
    let x = tensor(1, &d, &packed(&d), false);
    let s = scalar(2);
    let dy = tensor(3, &d, &packed(&d), false);
    let sum = tensor(60, &d, &packed(&d), true);
    let t = tensor(4, &d, &packed(&d), false);
    let dx = tensor(5, &d, &packed(&d), false);
    let add = B::new(OP_POINTWISE)
        .descs(OP_PW_DESCRIPTOR, &[&pw_desc(pw::ADD)])
        .descs(OP_PW_XDESC, &[&x])
        .descs(OP_PW_BDESC, &[&s])
        .descs(OP_PW_YDESC, &[&sum])
        .f64(OP_PW_ALPHA1, 2.0)
        .fin();
    let tanh = pw_op(&pw_desc(pw::TANH_FWD), &sum, None, &t);
    let relu_bwd = B::new(OP_POINTWISE).descs(OP_PW_DESCRIPTOR, &[&pw_desc(pw::RELU_BWD)]).descs(OP_PW_DYDESC, &[&dy]).descs(OP_PW_XDESC, &[&t]).descs(OP_PW_DXDESC, &[&dx]).fin();
    let graph = op_graph(h.0, &[&relu_bwd, &tanh, &add]); // any order: the graph sorts them

    let sv = 0.25f32;
    let mut g = Graph::new("pointwise");
    let gx = g.tensor(TensorDesc::new("x", &d, DataType::F32).with_uid(1));
    let gdy = g.tensor(TensorDesc::new("dy", &d, DataType::F32).with_uid(3));
    let two = g.scalar("two", 2.0);
    let gs = g.scalar("s", sv as f64);
    let x2 = g.mul(gx, two);
    let sm = g.add(x2, gs);
    let gt = g.pointwise(PointwiseMode::Tanh, &[sm]);
    let gdx = g.pointwise(PointwiseMode::ReluBackward { lower_clip: None, upper_clip: None, negative_slope: None }, &[gdy, gt]);
    for (t, uid) in [(gt, 4), (gdx, 5)] {
        g.set_output(t);
        g.desc_mut(t).uid = Some(uid);
        g.desc_mut(t).data_type = Some(DataType::F32);
    }
    let inputs: HashMap<TensorId, Nd> = [(gx, rand_nd(&d, 10)), (gdy, rand_nd(&d, 11))].into_iter().collect();
    let mut bufs = Buffers::new();
    bufs.input(1, &inputs[&gx], &packed(&d));
    bufs.input(3, &inputs[&gdy], &packed(&d));
    bufs.scalars.insert(2, sv);
    bufs.output(4, &d, &packed(&d));
    bufs.output(5, &d, &packed(&d));
    run(h.0, &graph, HEUR_MODE_A, &mut bufs);
    check(&bufs.dense(4, &d, &packed(&d)), &reference(&g, &inputs, 4), 1e-5, "tanh(2x + s)");
    check(&bufs.dense(5, &d, &packed(&d)), &reference(&g, &inputs, 5), 1e-5, "relu backward");
}

#[test]
fn reductions_over_the_axes_y_keeps_at_one() {
    let h = Handle::cpu();
    let xd = [3i64, 4, 5];
    for (op, mode, yd) in [
        (CUDNN_REDUCE_TENSOR_ADD, ReductionMode::Add, [3i64, 1, 1]),
        (CUDNN_REDUCE_TENSOR_MAX, ReductionMode::Max, [1, 4, 1]),
        (CUDNN_REDUCE_TENSOR_AVG, ReductionMode::Avg, [3, 4, 1]),
    ] {
        let x = tensor(1, &xd, &packed(&xd), false);
        let y = tensor(2, &yd, &packed(&yd), false);
        let r = B::new(REDUCTION).int(REDUCTION_OPERATOR, T_REDUCTION_OPERATOR_TYPE, op).int(REDUCTION_COMP_TYPE, T_DATA_TYPE, CUDNN_DATA_FLOAT).fin();
        let rop = B::new(OP_REDUCTION).descs(OP_REDUCTION_XDESC, &[&x]).descs(OP_REDUCTION_YDESC, &[&y]).descs(OP_REDUCTION_DESC, &[&r]).fin();
        let graph = op_graph(h.0, &[&rop]);
        let axes: Vec<usize> = (0..3).filter(|&i| yd[i] == 1).collect();
        let mut g = Graph::new("reduce");
        let gx = g.tensor(TensorDesc::new("x", &xd, DataType::F32).with_uid(1));
        let gy = g.reduction(gx, mode, &axes);
        g.set_output(gy);
        g.desc_mut(gy).uid = Some(2);
        let inputs: HashMap<TensorId, Nd> = [(gx, rand_nd(&xd, 12))].into_iter().collect();
        let mut bufs = Buffers::new();
        bufs.input(1, &inputs[&gx], &packed(&xd));
        bufs.output(2, &yd, &packed(&yd));
        run(h.0, &graph, HEUR_MODE_A, &mut bufs);
        check(&bufs.dense(2, &yd, &packed(&yd)), &reference(&g, &inputs, 2), 1e-5, &format!("reduction {mode:?}"));
    }
}

/// A plan serialized to JSON and finalized again from the text runs the same.
#[test]
fn plan_json_round_trip() {
    let h = Handle::cpu();
    let d = [2i64, 3];
    let x = tensor(1, &d, &packed(&d), false);
    let y = tensor(2, &d, &packed(&d), false);
    let graph = op_graph(h.0, &[&pw_op(&pw_desc(pw::EXP), &x, None, &y)]);
    let cfgs = heuristics(&graph, HEUR_MODE_A);
    let p = plan(h.0, &cfgs[0]);
    let mut n = 0i64;
    ok(cudnnBackendGetAttribute(p.0, EXECUTION_PLAN_JSON_REPRESENTATION, T_CHAR, 0, &mut n, std::ptr::null_mut()));
    let mut json = vec![0u8; n as usize];
    ok(cudnnBackendGetAttribute(p.0, EXECUTION_PLAN_JSON_REPRESENTATION, T_CHAR, n, &mut n, json.as_mut_ptr() as *mut c_void));
    let text = String::from_utf8(json.clone()).unwrap();
    assert!(text.contains("ferrodnn-cudnn-plan") && text.contains("\"exp\""), "{text}");
    let p2 = B::new(EXECUTION_PLAN).handle(EXECUTION_PLAN_HANDLE, h.0);
    ok(p2.set_raw(EXECUTION_PLAN_JSON_REPRESENTATION, T_CHAR, &json));
    let p2 = p2.fin();
    let xv = [0.0f32, 1.0, -1.0, 0.5, 2.0, -3.0];
    let mut bufs = Buffers::new();
    bufs.input(1, &Nd::new(vec![2, 3], xv.iter().map(|&v| v as f64).collect()), &packed(&d));
    bufs.output(2, &d, &packed(&d));
    let pack = bufs.pack(&mut []);
    ok(cudnnBackendExecute(h.0, p2.0, pack.0));
    let want: Vec<f64> = xv.iter().map(|&v| (v as f64).exp()).collect();
    check(&bufs.dense(2, &d, &packed(&d)), &want, 1e-6, "exp from a deserialized plan");
    // Its engine configuration is readable too.
    let cfg = B::new(ENGINECFG);
    let mut got = 0i64;
    ok(cudnnBackendGetAttribute(p2.0, EXECUTION_PLAN_ENGINE_CONFIG, T_BACKEND_DESCRIPTOR, 1, &mut got, &cfg.0 as *const _ as *mut c_void));
    assert_eq!(got, 1);
    assert_eq!(cfg.get_i64(ENGINECFG_WORKSPACE_SIZE), 0);
}

#[test]
fn engines_answer_their_notes_and_knobs() {
    let h = Handle::cpu();
    let d = [2i64, 3];
    let x = tensor(1, &d, &packed(&d), false);
    let y = tensor(2, &d, &packed(&d), false);
    let graph = op_graph(h.0, &[&pw_op(&pw_desc(pw::NEG), &x, None, &y)]);
    let count = graph.get_i64(OPERATIONGRAPH_ENGINE_GLOBAL_COUNT);
    for i in 0..count {
        let e = B::new(ENGINE).descs(ENGINE_OPERATION_GRAPH, &[&graph]).i64s(ENGINE_GLOBAL_INDEX, &[i]).fin();
        assert_eq!(e.get_i64(ENGINE_GLOBAL_INDEX), i);
        let mut n = -1i64;
        ok(cudnnBackendGetAttribute(e.0, ENGINE_KNOB_INFO, T_BACKEND_DESCRIPTOR, 0, &mut n, std::ptr::null_mut()));
        assert_eq!(n, 0, "ferrodnn's engines take no cuDNN knobs");
        let mut notes = [0i32; 10];
        ok(cudnnBackendGetAttribute(e.0, ENGINE_NUMERICAL_NOTE, T_NUMERICAL_NOTE, 10, &mut n, notes.as_mut_ptr() as *mut c_void));
        assert!(notes[..n as usize].iter().all(|&v| v < NUMERICAL_NOTE_TYPE_COUNT));
        let cfg = B::new(ENGINECFG).descs(ENGINECFG_ENGINE, &[&e]).descs(ENGINECFG_KNOB_CHOICES, &[]).fin();
        let p = plan(h.0, &cfg);
        assert!(p.get_i64(EXECUTION_PLAN_WORKSPACE_SIZE) >= 0);
    }
    // One past the last engine is refused by name.
    let e = B::new(ENGINE).descs(ENGINE_OPERATION_GRAPH, &[&graph]).i64s(ENGINE_GLOBAL_INDEX, &[count]);
    fails(cudnnBackendFinalize(e.0), CUDNN_STATUS_BAD_PARAM, &["engine global index", "ENGINE_GLOBAL_COUNT"]);
    // A knob choice: ferrodnn's engines have none.
    let k = B::new(KNOB_CHOICE).int(KNOB_CHOICE_KNOB_TYPE, T_KNOB_TYPE, 0).i64s(KNOB_CHOICE_KNOB_VALUE, &[1]).fin();
    let e = B::new(ENGINE).descs(ENGINE_OPERATION_GRAPH, &[&graph]).i64s(ENGINE_GLOBAL_INDEX, &[0]).fin();
    let cfg = B::new(ENGINECFG).descs(ENGINECFG_ENGINE, &[&e]).descs(ENGINECFG_KNOB_CHOICES, &[&k]);
    fails(cudnnBackendFinalize(cfg.0), CUDNN_STATUS_NOT_SUPPORTED, &["no knob of type 0"]);
}

#[test]
fn bad_attributes_are_refused_with_the_status_cudnn_gives() {
    let t = B::new(TENSOR);
    // Wrong type, wrong count, not an attribute of the type, read-only.
    fails(t.set_raw(TENSOR_DIMENSIONS, T_INT32, &[2i32, 3]), CUDNN_STATUS_BAD_PARAM, &["CUDNN_ATTR_TENSOR_DIMENSIONS", "CUDNN_TYPE_INT64", "not CUDNN_TYPE_INT32"]);
    fails(t.set_raw(TENSOR_UNIQUE_ID, T_INT64, &[1i64, 2]), CUDNN_STATUS_BAD_PARAM, &["CUDNN_ATTR_TENSOR_UNIQUE_ID", "takes 1 element", "elementCount 2"]);
    fails(t.set_raw(TENSOR_DIMENSIONS, T_INT64, &[1i64; 9]), CUDNN_STATUS_BAD_PARAM, &["1 to 8", "elementCount 9"]);
    fails(t.set_raw(POINTWISE_MODE, T_POINTWISE_MODE, &[0i32]), CUDNN_STATUS_BAD_PARAM, &["attributeName 0", "CUDNN_BACKEND_TENSOR_DESCRIPTOR"]);
    fails(t.set_raw(TENSOR_DATA_TYPE, 99, &[0i32]), CUDNN_STATUS_BAD_PARAM, &["attribute type 99"]);
    let e = B::new(ENGINE);
    fails(e.set_raw(ENGINE_KNOB_INFO, T_BACKEND_DESCRIPTOR, &[t.0]), CUDNN_STATUS_BAD_PARAM, &["read-only"]);
    // Null array with elements.
    fails(cudnnBackendSetAttribute(t.0, TENSOR_UNIQUE_ID, T_INT64, 1, std::ptr::null()), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["arrayOfElements"]);
    // Reading before finalization; finalizing without required attributes.
    let mut n = 0i64;
    let mut v = 0i64;
    fails(cudnnBackendGetAttribute(t.0, TENSOR_UNIQUE_ID, T_INT64, 1, &mut n, &mut v as *mut i64 as *mut c_void), CUDNN_STATUS_NOT_INITIALIZED, &["not finalized"]);
    fails(cudnnBackendFinalize(t.0), CUDNN_STATUS_BAD_PARAM, &["CUDNN_ATTR_TENSOR_UNIQUE_ID", "required"]);
    // Dimensions and strides that disagree; a by-value tensor of many elements.
    let t = B::new(TENSOR).i64s(TENSOR_UNIQUE_ID, &[1]).int(TENSOR_DATA_TYPE, T_DATA_TYPE, CUDNN_DATA_FLOAT).i64s(TENSOR_DIMENSIONS, &[2, 3]).i64s(TENSOR_STRIDES, &[1]);
    fails(cudnnBackendFinalize(t.0), CUDNN_STATUS_BAD_PARAM, &["tensor uid 1", "2 dimensions", "1 strides"]);
    let t = B::new(TENSOR)
        .i64s(TENSOR_UNIQUE_ID, &[1])
        .int(TENSOR_DATA_TYPE, T_DATA_TYPE, CUDNN_DATA_FLOAT)
        .i64s(TENSOR_DIMENSIONS, &[2, 3])
        .i64s(TENSOR_STRIDES, &[3, 1])
        .boolean(TENSOR_IS_BY_VALUE, true);
    fails(cudnnBackendFinalize(t.0), CUDNN_STATUS_BAD_PARAM, &["by value", "one element"]);
    // Setting an attribute of a finalized descriptor.
    let t = tensor(1, &[2, 3], &[3, 1], false);
    fails(t.set_raw(TENSOR_UNIQUE_ID, T_INT64, &[5i64]), CUDNN_STATUS_NOT_INITIALIZED, &["already finalized"]);
    fails(cudnnBackendFinalize(t.0), CUDNN_STATUS_BAD_PARAM, &["already finalized"]);
    // Reading with the wrong type.
    fails(
        cudnnBackendGetAttribute(t.0, TENSOR_UNIQUE_ID, T_INT32, 1, &mut n, &mut v as *mut i64 as *mut c_void),
        CUDNN_STATUS_BAD_PARAM,
        &["CUDNN_ATTR_TENSOR_UNIQUE_ID", "not CUDNN_TYPE_INT32"],
    );
    // A descriptor that is not finalized, and one of the wrong type, as attributes.
    let raw = B::new(TENSOR);
    let op = B::new(OP_POINTWISE);
    fails(op.set_raw(OP_PW_XDESC, T_BACKEND_DESCRIPTOR, &[raw.0]), CUDNN_STATUS_BAD_PARAM, &["CUDNN_ATTR_OPERATION_POINTWISE_XDESC", "not finalized"]);
    let conv = B::new(CONVOLUTION)
        .i64s(CONVOLUTION_SPATIAL_DIMS, &[1])
        .i64s(CONVOLUTION_PRE_PADDINGS, &[0])
        .i64s(CONVOLUTION_POST_PADDINGS, &[0])
        .i64s(CONVOLUTION_FILTER_STRIDES, &[1])
        .i64s(CONVOLUTION_DILATIONS, &[1])
        .fin();
    fails(op.set_raw(OP_PW_XDESC, T_BACKEND_DESCRIPTOR, &[conv.0]), CUDNN_STATUS_BAD_PARAM, &["CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR", "takes CUDNN_BACKEND_TENSOR_DESCRIPTOR"]);
    // A stale pointer as a descriptor.
    let dead = B::new(TENSOR);
    let stale = dead.0;
    drop(dead);
    fails(op.set_raw(OP_PW_XDESC, T_BACKEND_DESCRIPTOR, &[stale]), CUDNN_STATUS_BAD_PARAM, &["not a live cudnnBackendDescriptor_t"]);
    fails(cudnnBackendFinalize(stale), CUDNN_STATUS_BAD_PARAM, &["not a live"]);
    // Convolution lists that disagree with the spatial dims.
    let conv = B::new(CONVOLUTION)
        .i64s(CONVOLUTION_SPATIAL_DIMS, &[2])
        .i64s(CONVOLUTION_PRE_PADDINGS, &[0])
        .i64s(CONVOLUTION_POST_PADDINGS, &[0, 0])
        .i64s(CONVOLUTION_FILTER_STRIDES, &[1, 1])
        .i64s(CONVOLUTION_DILATIONS, &[1, 1]);
    fails(cudnnBackendFinalize(conv.0), CUDNN_STATUS_BAD_PARAM, &["CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS", "1 elements", "SPATIAL_DIMS is 2"]);
    // Unknown descriptor types, and operations ferrodnn does not have.
    let mut d = std::ptr::null_mut();
    fails(cudnnBackendCreateDescriptor(DESCRIPTOR_TYPE_COUNT, &mut d), CUDNN_STATUS_NOT_SUPPORTED, &["not a cudnnBackendDescriptorType_t"]);
    fails(cudnnBackendCreateDescriptor(TENSOR, std::ptr::null_mut()), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["descriptor"]);
    let rope = B::new(OP_ROPE_FWD);
    fails(cudnnBackendFinalize(rope.0), CUDNN_STATUS_NOT_SUPPORTED, &["OPERATION_ROPE_FWD"]);
    // An unsupported pointwise mode.
    let x = tensor(1, &[2], &[1], false);
    let y = tensor(2, &[2], &[1], false);
    let atan2 = pw_desc(pw::ATAN2);
    let op = B::new(OP_POINTWISE).descs(OP_PW_DESCRIPTOR, &[&atan2]).descs(OP_PW_XDESC, &[&x]).descs(OP_PW_BDESC, &[&x]).descs(OP_PW_YDESC, &[&y]);
    fails(cudnnBackendFinalize(op.0), CUDNN_STATUS_NOT_SUPPORTED, &["ATAN2"]);
}

#[test]
fn bad_graphs_plans_and_packs_are_refused() {
    let h = Handle::cpu();
    // Shapes that disagree: the graph's validation names the op and the tensor.
    let x = tensor(1, &[2, 3], &[3, 1], false);
    let b = tensor(2, &[4, 3], &[3, 1], false);
    let y = tensor(3, &[2, 3], &[3, 1], false);
    let add = pw_op(&pw_desc(pw::ADD), &x, Some(&b), &y);
    let g = B::new(OPERATIONGRAPH).handle(OPERATIONGRAPH_HANDLE, h.0).descs(OPERATIONGRAPH_OPS, &[&add]);
    fails(cudnnBackendFinalize(g.0), CUDNN_STATUS_BAD_PARAM, &["add", "broadcast", "[4, 3]"]);
    // One uid for two different tensors.
    let x2 = tensor(1, &[2, 4], &[4, 1], false);
    let y2 = tensor(4, &[2, 4], &[4, 1], false);
    let neg1 = pw_op(&pw_desc(pw::NEG), &x, None, &y);
    let neg2 = pw_op(&pw_desc(pw::NEG), &x2, None, &y2);
    let g = B::new(OPERATIONGRAPH).descs(OPERATIONGRAPH_OPS, &[&neg1, &neg2]);
    fails(cudnnBackendFinalize(g.0), CUDNN_STATUS_BAD_PARAM, &["uid 1 names two different tensors"]);
    // An empty graph.
    let g = B::new(OPERATIONGRAPH);
    fails(cudnnBackendFinalize(g.0), CUDNN_STATUS_BAD_PARAM, &["CUDNN_ATTR_OPERATIONGRAPH_OPS", "required"]);
    // A plan without a configuration; executing what is not finalized; a pack without a uid the
    // plan needs; a pack whose uids and pointers disagree.
    let p = B::new(EXECUTION_PLAN);
    fails(cudnnBackendFinalize(p.0), CUDNN_STATUS_BAD_PARAM, &["CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG", "required"]);
    let graph = op_graph(h.0, &[&neg1]);
    let cfgs = heuristics(&graph, HEUR_MODE_A);
    let plan = plan(h.0, &cfgs[0]);
    let mut xs = vec![1.0f32; 6];
    let mut ys = vec![0.0f32; 6];
    let pack = B::new(VARIANT_PACK).i64s(VARIANT_PACK_UNIQUE_IDS, &[1]);
    ok(pack.set_raw(VARIANT_PACK_DATA_POINTERS, T_VOID_PTR, &[xs.as_mut_ptr() as *mut c_void]));
    fails(cudnnBackendExecute(h.0, plan.0, pack.0), CUDNN_STATUS_BAD_PARAM, &["variantPack", "not finalized"]);
    let pack = pack.fin();
    fails(cudnnBackendExecute(h.0, p.0, pack.0), CUDNN_STATUS_BAD_PARAM, &["executionPlan", "not finalized"]);
    fails(cudnnBackendExecute(h.0, plan.0, pack.0), CUDNN_STATUS_BAD_PARAM, &["no pointer for uid 3", "writes"]);
    fails(cudnnBackendExecute(h.0, plan.0, std::ptr::null_mut()), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["variantPack"]);
    fails(cudnnBackendExecute(std::ptr::null_mut(), plan.0, pack.0), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["cudnnHandle_t"]);
    let bad_pack = B::new(VARIANT_PACK).i64s(VARIANT_PACK_UNIQUE_IDS, &[1, 3]);
    ok(bad_pack.set_raw(VARIANT_PACK_DATA_POINTERS, T_VOID_PTR, &[xs.as_mut_ptr() as *mut c_void]));
    fails(cudnnBackendFinalize(bad_pack.0), CUDNN_STATUS_BAD_PARAM, &["2 unique ids but 1 data pointers"]);
    // A null pointer for a tensor the plan reads.
    let null_pack = B::new(VARIANT_PACK).i64s(VARIANT_PACK_UNIQUE_IDS, &[1, 3]);
    ok(null_pack.set_raw(VARIANT_PACK_DATA_POINTERS, T_VOID_PTR, &[std::ptr::null_mut::<c_void>(), ys.as_mut_ptr() as *mut c_void]));
    let null_pack = null_pack.fin();
    fails(cudnnBackendExecute(h.0, plan.0, null_pack.0), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["uid 1"]);
    // And the good pack runs.
    let good = B::new(VARIANT_PACK).i64s(VARIANT_PACK_UNIQUE_IDS, &[1, 3]);
    ok(good.set_raw(VARIANT_PACK_DATA_POINTERS, T_VOID_PTR, &[xs.as_mut_ptr() as *mut c_void, ys.as_mut_ptr() as *mut c_void]));
    let good = good.fin();
    ok(cudnnBackendExecute(h.0, plan.0, good.0));
    assert_eq!(ys, vec![-1.0f32; 6]);
    // CUDA graphs are not built by ferrodnn.
    fails(cudnnBackendPopulateCudaGraph(h.0, plan.0, good.0, std::ptr::null_mut()), CUDNN_STATUS_NOT_SUPPORTED, &["capture"]);
    let mut ws = 7usize;
    ok(cudnnGetExecutionPlanWorkspaceSize(h.0, plan.0, good.0, &mut ws));
    assert_eq!(ws as i64, plan.get_i64(EXECUTION_PLAN_WORKSPACE_SIZE));
}

/// A diagonal band mask (as the frontend's causal and sliding-window masks are) in a plain
/// graph: masked scores become `b`.
#[test]
fn diagonal_band_masks_keep_the_band() {
    let h = Handle::cpu();
    let d = [1i64, 2, 4, 6];
    let n = 48;
    let xv: Vec<f32> = (0..n).map(|i| i as f32 + 1.0).collect();
    // (left bound, shift of the right bound, keep(row, col))
    type Keep = fn(i64, i64) -> bool;
    let cases: [(Option<f32>, Option<i32>, Keep); 3] = [(None, None, |r, c| r >= c), (None, Some(2), |r, c| r + 2 >= c), (Some(2.0), None, |r, c| c + 2 > r)];
    for (left, shift, keep) in cases {
        let x = tensor(1, &d, &packed(&d), false);
        let fill = scalar(2);
        let y = tensor(3, &d, &packed(&d), false);
        let mut op = B::new(OP_DIAGONAL_BAND_MASK).descs(3000, &[&x]).descs(3005, &[&fill]).descs(3006, &[&y]);
        let bound = left.map(|_| scalar(4)).or(shift.map(|_| scalar_of(4, CUDNN_DATA_INT32)));
        if let Some(bd) = &bound {
            op = op.descs(if left.is_some() { 3003 } else { 3004 }, &[bd]);
        }
        let op = op.int(3007, T_POINTWISE_MODE, if left.is_some() { pw::CMP_GT } else { pw::CMP_GE }).fin();
        let graph = op_graph(h.0, &[&op]);
        let mut bufs = Buffers::new();
        bufs.input(1, &Nd::new(vec![1, 2, 4, 6], xv.iter().map(|&v| v as f64).collect()), &packed(&d));
        bufs.scalars.insert(2, -100.0);
        let mut shift_value = shift.unwrap_or(0);
        let mut ptr_extra: Vec<(i64, *mut c_void)> = Vec::new();
        let mut left_value = left.unwrap_or(0.0);
        if left.is_some() {
            ptr_extra.push((4, &mut left_value as *mut f32 as *mut c_void));
        } else if shift.is_some() {
            ptr_extra.push((4, &mut shift_value as *mut i32 as *mut c_void));
        }
        bufs.output(3, &d, &packed(&d));
        let cfgs = heuristics(&graph, HEUR_MODE_A);
        let p = plan(h.0, &cfgs[0]);
        let mut uids: Vec<i64> = Vec::new();
        let mut ptrs: Vec<*mut c_void> = Vec::new();
        for (&u, v) in bufs.data.iter_mut() {
            uids.push(u);
            ptrs.push(v.as_mut_ptr() as *mut c_void);
        }
        for (&u, v) in bufs.scalars.iter_mut() {
            uids.push(u);
            ptrs.push(v as *mut f32 as *mut c_void);
        }
        for (u, ptr) in ptr_extra {
            uids.push(u);
            ptrs.push(ptr);
        }
        let pack = B::new(VARIANT_PACK).i64s(VARIANT_PACK_UNIQUE_IDS, &uids);
        ok(pack.set_raw(VARIANT_PACK_DATA_POINTERS, T_VOID_PTR, &ptrs));
        let pack = pack.fin();
        ok(cudnnBackendExecute(h.0, p.0, pack.0));
        let got = bufs.dense(3, &d, &packed(&d));
        let want: Vec<f64> = (0..n).map(|i| if keep((i as i64 / 6) % 4, i as i64 % 6) { xv[i] as f64 } else { -100.0 }).collect();
        check(&got, &want, 0.0, &format!("band mask (left {left:?}, shift {shift:?})"));
    }
}

/// The frontend's unified attention: one SDPA_FWD operation with a causal score-modifier
/// subgraph (a diagonal band mask) and its softmax's statistics, on ferrodnn's fused attention,
/// against the graph API's sdpa on the reference engine.
#[test]
fn sdpa_forward_with_a_causal_subgraph_and_statistics() {
    use ferrodnn::graph::ops::sdpa::{CausalAlignment, SdpaAttrs, SdpaInputs};
    let h = Handle::cpu();
    let (qd, kd, sd, scored) = ([1i64, 2, 5, 8], [1i64, 2, 7, 8], [1i64, 2, 5, 1], [1i64, 2, 5, 7]);
    let (q, k, v, o) = (tensor(1, &qd, &packed(&qd), false), tensor(2, &kd, &packed(&kd), false), tensor(3, &kd, &packed(&kd), false), tensor(4, &qd, &packed(&qd), false));
    let scale = scalar(5);
    let stats = tensor(6, &sd, &packed(&sd), false);
    // The subgraph: scores (virtual, 900) -> band mask -> 902.
    let score = tensor(900, &scored, &packed(&scored), true);
    let fill = scalar(901);
    let masked = tensor(902, &scored, &packed(&scored), true);
    let mask = B::new(OP_DIAGONAL_BAND_MASK).descs(3000, &[&score]).descs(3005, &[&fill]).descs(3006, &[&masked]).int(3007, T_POINTWISE_MODE, pw::CMP_GE).fin();
    let sub = B::new(OPERATIONGRAPH).descs(OPERATIONGRAPH_OPS, &[&mask]).fin();
    // The softmax whose statistics are the attention's.
    let (p_t, s_t) = (tensor(910, &scored, &packed(&scored), true), tensor(911, &scored, &packed(&scored), true));
    let softmax = B::new(OP_SOFTMAX).descs(3100, &[&p_t]).descs(3101, &[&s_t]).descs(3102, &[&stats]).fin();
    let sdpa = B::new(OP_SDPA_FWD)
        .descs(2800, &[&q])
        .descs(2801, &[&k])
        .descs(2802, &[&v])
        .descs(2803, &[&o])
        .descs(2805, &[&scale])
        .descs(2811, &[&sub])
        .i64s(2812, &[900])
        .i64s(2813, &[902])
        .descs(2814, &[&softmax])
        .fin();
    let graph = op_graph(h.0, &[&sdpa, &softmax]);
    // The subgraph alone is not a runnable graph.
    let heur = B::new(ENGINEHEUR).descs(ENGINEHEUR_OPERATION_GRAPH, &[&sub]).int(ENGINEHEUR_MODE, T_HEUR_MODE, HEUR_MODE_A);
    fails(cudnnBackendFinalize(heur.0), CUDNN_STATUS_BAD_PARAM, &["score-modifier subgraph"]);

    let sv = 0.3f32;
    let mut g = Graph::new("sdpa");
    let gq = g.tensor(TensorDesc::new("q", &qd, DataType::F32).with_uid(1));
    let gk = g.tensor(TensorDesc::new("k", &kd, DataType::F32).with_uid(2));
    let gv = g.tensor(TensorDesc::new("v", &kd, DataType::F32).with_uid(3));
    let attrs = SdpaAttrs { causal: Some(CausalAlignment::TopLeft), generate_stats: true, attn_scale: Some(sv as f64), ..Default::default() };
    let (go, gs) = g.sdpa(gq, gk, gv, SdpaInputs::default(), attrs);
    for (t, uid) in [(go, 4), (gs.unwrap(), 6)] {
        g.set_output(t);
        g.desc_mut(t).uid = Some(uid);
        g.desc_mut(t).data_type = Some(DataType::F32);
    }
    let inputs: HashMap<TensorId, Nd> = [(gq, rand_nd(&qd, 30)), (gk, rand_nd(&kd, 31)), (gv, rand_nd(&kd, 32))].into_iter().collect();
    let mut bufs = Buffers::new();
    bufs.input(1, &inputs[&gq], &packed(&qd));
    bufs.input(2, &inputs[&gk], &packed(&kd));
    bufs.input(3, &inputs[&gv], &packed(&kd));
    bufs.scalars.insert(5, sv);
    bufs.scalars.insert(901, f32::NEG_INFINITY);
    bufs.output(4, &qd, &packed(&qd));
    bufs.output(6, &sd, &packed(&sd));
    run(h.0, &graph, HEUR_MODE_A, &mut bufs);
    check(&bufs.dense(4, &qd, &packed(&qd)), &reference(&g, &inputs, 4), 1e-5, "causal attention output");
    check(&bufs.dense(6, &sd, &packed(&sd)), &reference(&g, &inputs, 6), 1e-5, "causal attention statistics");
}

/// Attention backward as one SDPA_BWD operation (q, k, v, o, dO, statistics -> dQ, dK, dV) with
/// a scale and the causal score-modifier subgraph, against the graph API's sdpa_backward on the
/// reference engine (o and the statistics from the reference's forward).
#[test]
fn sdpa_backward_with_a_causal_subgraph() {
    use ferrodnn::graph::ops::sdpa::{CausalAlignment, SdpaAttrs, SdpaInputs};
    let h = Handle::cpu();
    let (qd, kd, sd, scored) = ([1i64, 2, 5, 8], [1i64, 2, 7, 8], [1i64, 2, 5, 1], [1i64, 2, 5, 7]);
    let t = |uid: i64, d: &[i64]| tensor(uid, d, &packed(d), false);
    let (q, k, v, o, stats, d_o) = (t(1, &qd), t(2, &kd), t(3, &kd), t(4, &qd), t(6, &sd), t(7, &qd));
    let (dq, dk, dv) = (t(8, &qd), t(9, &kd), t(10, &kd));
    let scale = scalar(5);
    let score = tensor(900, &scored, &packed(&scored), true);
    let fill = scalar(901);
    let masked = tensor(902, &scored, &packed(&scored), true);
    let mask = B::new(OP_DIAGONAL_BAND_MASK).descs(3000, &[&score]).descs(3005, &[&fill]).descs(3006, &[&masked]).int(3007, T_POINTWISE_MODE, pw::CMP_GE).fin();
    let sub = B::new(OPERATIONGRAPH).descs(OPERATIONGRAPH_OPS, &[&mask]).fin();
    let bwd = B::new(OP_SDPA_BWD)
        .descs(2851, &[&q])
        .descs(2852, &[&k])
        .descs(2853, &[&v])
        .descs(2854, &[&o])
        .descs(2855, &[&stats])
        .descs(2856, &[&scale])
        .descs(2859, &[&dq])
        .descs(2860, &[&dk])
        .descs(2861, &[&dv])
        .descs(2862, &[&d_o])
        .descs(2867, &[&sub])
        .i64s(2868, &[900])
        .i64s(2869, &[902])
        .fin();
    let graph = op_graph(h.0, &[&bwd]);

    let sv = 0.3f32;
    let mut g = Graph::new("sdpa_backward");
    let gq = g.tensor(TensorDesc::new("q", &qd, DataType::F32).with_uid(1));
    let gk = g.tensor(TensorDesc::new("k", &kd, DataType::F32).with_uid(2));
    let gv = g.tensor(TensorDesc::new("v", &kd, DataType::F32).with_uid(3));
    let gdo = g.tensor(TensorDesc::new("do", &qd, DataType::F32).with_uid(7));
    let attrs = SdpaAttrs { causal: Some(CausalAlignment::TopLeft), generate_stats: true, attn_scale: Some(sv as f64), ..Default::default() };
    let (go, gs) = g.sdpa(gq, gk, gv, SdpaInputs::default(), attrs.clone());
    let gs = gs.expect("statistics");
    let grads = g.sdpa_backward(gq, gk, gv, go, gdo, gs, SdpaInputs::default(), attrs);
    for (t, uid) in [(go, 4), (gs, 6), (grads.dq, 8), (grads.dk, 9), (grads.dv, 10)] {
        g.set_output(t);
        g.desc_mut(t).uid = Some(uid);
        g.desc_mut(t).data_type = Some(DataType::F32);
    }
    let inputs: HashMap<TensorId, Nd> = [(gq, rand_nd(&qd, 50)), (gk, rand_nd(&kd, 51)), (gv, rand_nd(&kd, 52)), (gdo, rand_nd(&qd, 53))].into_iter().collect();
    let dense = |uid: i64, d: &[i64]| Nd::new(d.iter().map(|&x| x as usize).collect(), reference(&g, &inputs, uid));
    let mut bufs = Buffers::new();
    bufs.input(1, &inputs[&gq], &packed(&qd));
    bufs.input(2, &inputs[&gk], &packed(&kd));
    bufs.input(3, &inputs[&gv], &packed(&kd));
    bufs.input(4, &dense(4, &qd), &packed(&qd));
    bufs.input(6, &dense(6, &sd), &packed(&sd));
    bufs.input(7, &inputs[&gdo], &packed(&qd));
    bufs.scalars.insert(5, sv);
    bufs.scalars.insert(901, f32::NEG_INFINITY);
    for (uid, d) in [(8, &qd), (9, &kd), (10, &kd)] {
        bufs.output(uid, d, &packed(d));
    }
    run(h.0, &graph, HEUR_MODE_A, &mut bufs);
    for (uid, d, what) in [(8, &qd, "dQ"), (9, &kd, "dK"), (10, &kd, "dV")] {
        check(&bufs.dense(uid, d, &packed(d)), &reference(&g, &inputs, uid), 1e-4, what);
    }
}

/// Ragged GEMM sizes (the M, N, K override tensors the frontend's attention backward gives):
/// what lies past the lengths never reaches the sums, even when it is NaN.
#[test]
fn matmul_size_overrides_mask_past_the_lengths() {
    let h = Handle::cpu();
    let (ad, bd, cd, md) = ([2i64, 4, 3], [2i64, 3, 5], [2i64, 4, 5], [2i64, 1, 1]);
    let a = tensor(1, &ad, &packed(&ad), false);
    let b = tensor(2, &bd, &packed(&bd), false);
    let c = tensor(3, &cd, &packed(&cd), false);
    let m = B::new(TENSOR).i64s(TENSOR_UNIQUE_ID, &[4]).int(TENSOR_DATA_TYPE, T_DATA_TYPE, CUDNN_DATA_INT32).i64s(TENSOR_DIMENSIONS, &md).i64s(TENSOR_STRIDES, &packed(&md)).fin();
    let mm = B::new(MATMUL).int(MATMUL_COMP_TYPE, T_DATA_TYPE, CUDNN_DATA_FLOAT).fin();
    let op = B::new(OP_MATMUL)
        .descs(OP_MATMUL_ADESC, &[&a])
        .descs(OP_MATMUL_BDESC, &[&b])
        .descs(OP_MATMUL_CDESC, &[&c])
        .descs(OP_MATMUL_DESC, &[&mm])
        .descs(OP_MATMUL_GEMM_M_OVERRIDE_DESC, &[&m])
        .fin();
    let graph = op_graph(h.0, &[&op]);
    let an = rand_nd(&ad, 40);
    let bn = rand_nd(&bd, 41);
    let mut bufs = Buffers::new();
    bufs.input(1, &an, &packed(&ad));
    bufs.input(2, &bn, &packed(&bd));
    // Batch 0 has 2 rows, batch 1 all 4; the rows past the length hold NaN.
    for r in 2..4 {
        for kk in 0..3 {
            bufs.data.get_mut(&1).unwrap()[r * 3 + kk] = f32::NAN;
        }
    }
    let lens: Vec<f32> = vec![f32::from_bits(2), f32::from_bits(4)]; // i32 bits in f32 slots
    bufs.data.insert(4, lens);
    bufs.output(3, &cd, &packed(&cd));
    run(h.0, &graph, HEUR_MODE_A, &mut bufs);
    let got = bufs.dense(3, &cd, &packed(&cd));
    let mut want = vec![0.0f64; 40];
    for bt in 0..2 {
        let rows = if bt == 0 { 2 } else { 4 };
        for r in 0..rows {
            for j in 0..5 {
                want[bt * 20 + r * 5 + j] = (0..3).map(|kk| an.data[bt * 12 + r * 3 + kk] * bn.data[bt * 15 + kk * 5 + j]).sum();
            }
        }
    }
    check(&got, &want, 1e-5, "matmul with an M override");
}

/// A `std::vector<T>` as the frontend lays it out: first element, one past the last, one past
/// the storage.
#[repr(C)]
struct CxxVector<T> {
    begin: *const T,
    end: *const T,
    cap: *const T,
}

fn cxx_vector<T>(v: &[T]) -> CxxVector<T> {
    let r = v.as_ptr_range();
    CxxVector { begin: r.start, end: r.end, cap: r.end }
}

/// Shape overrides in the variant pack (CUDNN_ATTR_VARIANT_PACK_OVERRIDE_UNIQUE_IDS, _SHAPES and
/// _STRIDES, the last two pointers to `std::vector<std::vector<int64_t>>` as the frontend passes
/// them): a matmul graph built at one shape runs at a larger one and at a smaller one; lists that
/// do not pair up are refused when the pack is finalized.
#[test]
fn variant_pack_shape_overrides_run_the_plan_at_other_shapes() {
    let h = Handle::cpu();
    let (ad, bd, cd) = ([1i64, 4, 3], [1i64, 3, 5], [1i64, 4, 5]);
    let a = tensor(1, &ad, &packed(&ad), false);
    let b = tensor(2, &bd, &packed(&bd), false);
    let c = tensor(3, &cd, &packed(&cd), false);
    let mm = B::new(MATMUL).int(MATMUL_COMP_TYPE, T_DATA_TYPE, CUDNN_DATA_FLOAT).fin();
    let op = B::new(OP_MATMUL).descs(OP_MATMUL_ADESC, &[&a]).descs(OP_MATMUL_BDESC, &[&b]).descs(OP_MATMUL_CDESC, &[&c]).descs(OP_MATMUL_DESC, &[&mm]).fin();
    let graph = B::new(OPERATIONGRAPH).handle(OPERATIONGRAPH_HANDLE, h.0).descs(OPERATIONGRAPH_OPS, &[&op]).boolean(OPERATIONGRAPH_IS_OVERRIDE_SHAPE_ENABLED, true).fin();
    let cfgs = heuristics(&graph, HEUR_MODE_A);
    let p = plan(h.0, &cfgs[0]);
    let mut workspace = vec![0u8; p.get_i64(EXECUTION_PLAN_WORKSPACE_SIZE) as usize];
    for (bt, m, n, k) in [(2i64, 6i64, 7i64, 3i64), (1, 2, 2, 9)] {
        let (ad, bd, cd) = ([bt, m, k], [bt, k, n], [bt, m, n]);
        let (an, bn) = (rand_nd(&ad, 50 + m as u64), rand_nd(&bd, 60 + n as u64));
        let mut bufs = Buffers::new();
        bufs.input(1, &an, &packed(&ad));
        bufs.input(2, &bn, &packed(&bd));
        bufs.output(3, &cd, &packed(&cd));
        let shapes = [ad.to_vec(), bd.to_vec(), cd.to_vec()];
        let strides = [packed(&ad), packed(&bd), packed(&cd)];
        let shape_vecs: Vec<CxxVector<i64>> = shapes.iter().map(|v| cxx_vector(v)).collect();
        let stride_vecs: Vec<CxxVector<i64>> = strides.iter().map(|v| cxx_vector(v)).collect();
        let (outer_shapes, outer_strides) = (cxx_vector(&shape_vecs), cxx_vector(&stride_vecs));
        let pk = {
            let mut uids = Vec::new();
            let mut ptrs: Vec<*mut c_void> = Vec::new();
            for (&u, v) in bufs.data.iter_mut() {
                uids.push(u);
                ptrs.push(v.as_mut_ptr() as *mut c_void);
            }
            let pk = B::new(VARIANT_PACK).i64s(VARIANT_PACK_UNIQUE_IDS, &uids).i64s(VARIANT_PACK_OVERRIDE_UNIQUE_IDS, &[1, 2, 3]);
            ok(pk.set_raw(VARIANT_PACK_DATA_POINTERS, T_VOID_PTR, &ptrs));
            ok(pk.set_raw(VARIANT_PACK_WORKSPACE, T_VOID_PTR, &[workspace.as_mut_ptr() as *mut c_void]));
            ok(pk.set_raw(VARIANT_PACK_OVERRIDE_SHAPES, T_VOID_PTR, &[&outer_shapes as *const CxxVector<CxxVector<i64>> as *mut c_void]));
            ok(pk.set_raw(VARIANT_PACK_OVERRIDE_STRIDES, T_VOID_PTR, &[&outer_strides as *const CxxVector<CxxVector<i64>> as *mut c_void]));
            pk.fin()
        };
        ok(cudnnBackendExecute(h.0, p.0, pk.0));
        let mut g = Graph::new("mm").io_data_type(DataType::F32);
        let ga = g.tensor(TensorDesc::new("a", &ad, DataType::F32).with_uid(1));
        let gb = g.tensor(TensorDesc::new("b", &bd, DataType::F32).with_uid(2));
        let gc = g.matmul(ga, gb);
        g.set_output(gc);
        g.desc_mut(gc).uid = Some(3);
        let inputs = HashMap::from([(ga, an), (gb, bn)]);
        check(&bufs.dense(3, &cd, &packed(&cd)), &reference(&g, &inputs, 3), 1e-5, &format!("matmul overridden to {cd:?}"));
    }
    // Two uids, three shapes.
    let shapes = vec![vec![1i64, 4, 3]; 3];
    let shape_vecs: Vec<CxxVector<i64>> = shapes.iter().map(|v| cxx_vector(v)).collect();
    let outer = cxx_vector(&shape_vecs);
    let pk = B::new(VARIANT_PACK).i64s(VARIANT_PACK_UNIQUE_IDS, &[1]).i64s(VARIANT_PACK_OVERRIDE_UNIQUE_IDS, &[1, 2]);
    ok(pk.set_raw(VARIANT_PACK_DATA_POINTERS, T_VOID_PTR, &[workspace.as_mut_ptr() as *mut c_void]));
    let outer_ptr = &outer as *const CxxVector<CxxVector<i64>> as *mut c_void;
    ok(pk.set_raw(VARIANT_PACK_OVERRIDE_SHAPES, T_VOID_PTR, &[outer_ptr]));
    ok(pk.set_raw(VARIANT_PACK_OVERRIDE_STRIDES, T_VOID_PTR, &[outer_ptr]));
    fails(cudnnBackendFinalize(pk.0), CUDNN_STATUS_BAD_PARAM, &["OVERRIDE_SHAPES", "3 entries", "2 uids"]);
}

/// A seeded fuzz of the backend API: random descriptor types, attributes, attribute types,
/// element counts and values (pointer-typed values are null or live descriptors, so nothing
/// points at garbage), finalizations, reads into arrays of live descriptors, and executions of
/// whatever finalized. Every call must give a status code, never an internal error or a crash.
/// `FERRODNN_CUDNN_FUZZ_ITERS` and `FERRODNN_CUDNN_FUZZ_SEED` as for the legacy fuzz.
#[test]
fn fuzzed_backend_calls_give_status_codes() {
    let iters: usize = std::env::var("FERRODNN_CUDNN_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    let mut s: u64 = std::env::var("FERRODNN_CUDNN_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(11);
    let mut next = move || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        s >> 33
    };
    let h = Handle::cpu();
    // Descriptors to draw from: a few of each kind the tests use, some finalized.
    let mut pool: Vec<B> = Vec::new();
    for kind in 0..DESCRIPTOR_TYPE_COUNT {
        pool.push(B::new(kind));
    }
    pool.push(tensor(1, &[2, 3], &[3, 1], false));
    pool.push(tensor(2, &[2, 3], &[3, 1], true));
    pool.push(scalar(3));
    pool.push(pw_desc(pw::ADD));
    let attrs: Vec<i32> = (0..60)
        .map(|i| {
            [
                0, 100, 200, 300, 400, 500, 600, 700, 750, 770, 800, 900, 1000, 1100, 1200, 1300, 1500, 1520, 1600, 1610, 1700, 1710, 1720, 1800, 2000, 2100, 2200, 2300, 2310,
                2800, 3000, 3100, 3200, 3300,
            ][i % 34]
                + (i as i32 / 34) * 3
        })
        .collect();
    let (mut successes, mut finalized) = (0usize, 0usize);
    for _ in 0..iters {
        let d = &pool[next() as usize % pool.len()];
        // Half the time an attribute the descriptor's type has, mostly with its own type.
        let kind = (0..DESCRIPTOR_TYPE_COUNT).find(|&k| B::kind_of(d) == k).unwrap_or(0);
        let valid: Vec<i32> = (0..3400).filter(|&a| spec(kind, a).is_some_and(|sp| !sp.types.is_empty())).collect();
        let (attr, ty) = if next() % 2 == 0 && !valid.is_empty() {
            let a = valid[next() as usize % valid.len()];
            let types = spec(kind, a).unwrap().types;
            let ty = if next() % 4 != 0 { types[next() as usize % types.len()] } else { (next() % ATTRIBUTE_TYPE_COUNT as u64) as i32 };
            (a, ty)
        } else {
            (attrs[next() as usize % attrs.len()] + (next() % 12) as i32, (next() % (ATTRIBUTE_TYPE_COUNT as u64 + 1)) as i32)
        };
        let count = (next() % 4) as i64 - (next() % 8 == 0) as i64;
        let size = 16 * 8;
        let mut buf = vec![0u8; size];
        match ty {
            T_BACKEND_DESCRIPTOR => {
                for i in 0..4 {
                    let p = if next() % 4 == 0 { std::ptr::null_mut() } else { pool[next() as usize % pool.len()].0 };
                    buf[i * 8..i * 8 + 8].copy_from_slice(&(p as usize).to_ne_bytes());
                }
            }
            T_HANDLE | T_VOID_PTR => {}
            _ => {
                for b in buf.iter_mut().take(64) {
                    *b = [0u8, 1, 2, 3, 0xff][next() as usize % 5];
                }
            }
        }
        let st = cudnnBackendSetAttribute(d.0, attr, ty, count, buf.as_ptr() as *const c_void);
        assert_ne!(st, CUDNN_STATUS_INTERNAL_ERROR, "{}", ferrodnn_cudnn::api::last_error());
        successes += (st == CUDNN_STATUS_SUCCESS) as usize;
        if next() % 5 == 0 {
            let st = cudnnBackendFinalize(d.0);
            assert_ne!(st, CUDNN_STATUS_INTERNAL_ERROR, "{}", ferrodnn_cudnn::api::last_error());
            finalized += (st == CUDNN_STATUS_SUCCESS) as usize;
        }
        if next() % 3 == 0 {
            // Read into an array of live descriptors (for BACKEND_DESCRIPTOR) or plain bytes.
            let mut out = vec![0u8; size];
            let gty = if next() % 2 == 0 { ty } else { (next() % ATTRIBUTE_TYPE_COUNT as u64) as i32 };
            if gty == T_BACKEND_DESCRIPTOR {
                for i in 0..4 {
                    let p = pool[next() as usize % pool.len()].0;
                    out[i * 8..i * 8 + 8].copy_from_slice(&(p as usize).to_ne_bytes());
                }
            }
            let mut n = 0i64;
            let st = cudnnBackendGetAttribute(d.0, attr, gty, 4.min(size as i64 / 16), &mut n, out.as_mut_ptr() as *mut c_void);
            assert_ne!(st, CUDNN_STATUS_INTERNAL_ERROR, "{}", ferrodnn_cudnn::api::last_error());
        }
        if next() % 50 == 0 {
            let (p, v) = (&pool[next() as usize % pool.len()], &pool[next() as usize % pool.len()]);
            let st = cudnnBackendExecute(h.0, p.0, v.0);
            assert_ne!(st, CUDNN_STATUS_INTERNAL_ERROR, "{}", ferrodnn_cudnn::api::last_error());
        }
        if next() % 40 == 0 {
            ok(cudnnBackendInitialize(d.0));
        }
    }
    eprintln!("backend fuzz: {successes} attributes set, {finalized} descriptors finalized in {iters} rounds");
    assert!(successes > 0, "the fuzz never set an attribute: it tests nothing");
}

/// Our backend constants against NVIDIA's header, where it is installed: every descriptor type,
/// attribute type and attribute name the spec table names, and the enum values the lowering
/// reads, as C static assertions compiled against cudnn.h.
#[test]
fn backend_values_match_nvidia_header() {
    let include =
        std::env::var("FERRODNN_CUDNN_INCLUDE").map(std::path::PathBuf::from).unwrap_or_else(|_| "/work/benchenv/venv/lib/python3.11/site-packages/nvidia/cudnn/include".into());
    if !include.join("cudnn.h").exists() {
        eprintln!("skipped: NVIDIA's cudnn.h not found (set FERRODNN_CUDNN_INCLUDE to its folder)");
        return;
    }
    let mut consts: Vec<(String, i32)> = Vec::new();
    for k in 0..DESCRIPTOR_TYPE_COUNT {
        consts.push((kind_name(k), k));
    }
    for t in 0..ATTRIBUTE_TYPE_COUNT {
        consts.push((type_name(t), t));
    }
    let mut seen = std::collections::HashSet::new();
    for k in 0..DESCRIPTOR_TYPE_COUNT {
        for a in 0..3500 {
            if let Some(sp) = spec(k, a) {
                if sp.name.starts_with("CUDNN_ATTR_") && !sp.name.contains('*') && seen.insert(sp.name) {
                    consts.push((sp.name.to_string(), a));
                }
            }
        }
    }
    let enums: &[(&str, i32)] = &[
        ("CUDNN_POINTWISE_ADD", pw::ADD),
        ("CUDNN_POINTWISE_SUB", pw::SUB),
        ("CUDNN_POINTWISE_RECIPROCAL", pw::RECIPROCAL),
        ("CUDNN_POINTWISE_ATAN2", pw::ATAN2),
        ("CUDNN_POINTWISE_RELU_FWD", pw::RELU_FWD),
        ("CUDNN_POINTWISE_GELU_APPROX_TANH_FWD", pw::GELU_APPROX_TANH_FWD),
        ("CUDNN_POINTWISE_RELU_BWD", pw::RELU_BWD),
        ("CUDNN_POINTWISE_GELU_APPROX_TANH_BWD", pw::GELU_APPROX_TANH_BWD),
        ("CUDNN_POINTWISE_CMP_LE", pw::CMP_LE),
        ("CUDNN_POINTWISE_LOGICAL_NOT", pw::LOGICAL_NOT),
        ("CUDNN_POINTWISE_GEN_INDEX", pw::GEN_INDEX),
        ("CUDNN_POINTWISE_BINARY_SELECT", pw::BINARY_SELECT),
        ("CUDNN_RESAMPLE_MAXPOOL", RESAMPLE_MAXPOOL),
        ("CUDNN_RESAMPLE_AVGPOOL_INCLUDE_PADDING", RESAMPLE_AVGPOOL_INCLUDE_PADDING),
        ("CUDNN_RESAMPLE_AVGPOOL_EXCLUDE_PADDING", RESAMPLE_AVGPOOL_EXCLUDE_PADDING),
        ("CUDNN_LAYER_NORM", LAYER_NORM),
        ("CUDNN_INSTANCE_NORM", INSTANCE_NORM),
        ("CUDNN_BATCH_NORM", BATCH_NORM),
        ("CUDNN_GROUP_NORM", GROUP_NORM),
        ("CUDNN_RMS_NORM", RMS_NORM),
        ("CUDNN_ADA_LAYER_NORM", ADA_LAYER_NORM),
        ("CUDNN_NORM_FWD_INFERENCE", NORM_FWD_INFERENCE),
        ("CUDNN_NORM_FWD_TRAINING", NORM_FWD_TRAINING),
        ("CUDNN_RNG_DISTRIBUTION_BERNOULLI", RNG_DISTRIBUTION_BERNOULLI),
        ("CUDNN_RNG_DISTRIBUTION_UNIFORM", RNG_DISTRIBUTION_UNIFORM),
        ("CUDNN_RNG_DISTRIBUTION_NORMAL", RNG_DISTRIBUTION_NORMAL),
        ("CUDNN_HEUR_MODE_INSTANT", HEUR_MODE_INSTANT),
        ("CUDNN_HEUR_MODE_B", HEUR_MODE_B),
        ("CUDNN_HEUR_MODE_FALLBACK", HEUR_MODE_FALLBACK),
        ("CUDNN_HEUR_MODE_A", HEUR_MODE_A),
        ("CUDNN_NUMERICAL_NOTE_TENSOR_CORE", NUMERICAL_NOTE_TENSOR_CORE),
        ("CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS", NUMERICAL_NOTE_DOWN_CONVERT_INPUTS),
        ("CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC", NUMERICAL_NOTE_NONDETERMINISTIC),
        ("CUDNN_NUMERICAL_NOTE_TYPE_COUNT", NUMERICAL_NOTE_TYPE_COUNT),
        ("CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION", BEHAVIOR_NOTE_RUNTIME_COMPILATION),
        ("CUDNN_BEHAVIOR_NOTE_TYPE_COUNT", BEHAVIOR_NOTE_TYPE_COUNT),
        ("CUDNN_KNOB_TYPE_COUNTS", KNOB_TYPE_COUNTS),
        ("CUDNN_TENSOR_REORDERING_NONE", TENSOR_REORDERING_NONE),
        ("CUDNN_GENSTATS_SUM_SQSUM", GENSTATS_SUM_SQSUM),
        ("CUDNN_LRN_CROSS_CHANNEL_DIM1", ferrodnn_cudnn::lrn::CUDNN_LRN_CROSS_CHANNEL_DIM1),
        ("CUDNN_LRN_MAX_N", ferrodnn_cudnn::lrn::LRN_MAX_N as i32),
    ];
    consts.extend(enums.iter().map(|&(n, v)| (n.to_string(), v)));
    let mut src = String::from("#include <stddef.h>\n#include <cudnn.h>\n");
    for (name, v) in &consts {
        src.push_str(&format!("_Static_assert((int){name} == {v}, \"{name} is {v} in ferrodnn-cudnn\");\n"));
    }
    src.push_str(&format!("_Static_assert(sizeof(cudnnFraction_t) == {}, \"cudnnFraction_t size\");\n", element_size(T_FRACTION)));
    src.push_str(&format!("_Static_assert(sizeof(bool) == {}, \"CUDNN_TYPE_BOOLEAN size\");\n", element_size(T_BOOLEAN)));
    let dir = std::env::temp_dir().join(format!("ferrodnn_cudnn_backend_abi_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("backend_abi.c");
    std::fs::write(&file, src).unwrap();
    let stub = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/cuda_stub");
    let out = std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-fsyntax-only", "-std=c11", "-Wno-deprecated-declarations", "-include", "stdbool.h"])
        .arg(format!("-I{}", include.display()))
        .arg(format!("-I{}", stub.display()))
        .arg(&file)
        .output()
        .expect("a C compiler (cc) to check the header");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "our backend values differ from NVIDIA's header:\n{}", String::from_utf8_lossy(&out.stderr));
    eprintln!("{} backend constants match NVIDIA's header", consts.len());
}

/// Attention backward as the cudnn frontend v1.18 composes it for PyTorch's
/// `sdpa_kernel(SDPBackend.CUDNN_ATTENTION)` (CompositeSDPABackwardNode: v1.18 has no unified
/// backward node): dO * O summed over d into the float `softmax_sum` (a workspace tensor), the
/// scores recomputed as exp(Q K^T * scale - stats), dV = P^T dO, dS = P (dO V^T - softmax_sum) *
/// scale, dK = dS^T Q, dQ = dS K through a float accumulator. P^T, dS^T and K (from the K^T the
/// graph gets) are VIEW_ONLY reshapes whose output strides are swapped, that is transposes. The
/// scale is a by-value scalar (PyTorch gives a float); O and dO are stored b, s, h, d as
/// PyTorch allocates them; dO * O has the frontend's overlapping virtual strides. Causal and
/// not, against the graph API's sdpa_backward on the reference engine.
#[test]
fn sdpa_backward_composed_as_the_frontend_builds_it_for_torch() {
    use ferrodnn::graph::ops::sdpa::{CausalAlignment, SdpaAttrs, SdpaInputs};
    let h = Handle::cpu();
    let (b, hh, s, d) = (2i64, 3, 6, 4);
    let (qd, sd, pd) = ([b, hh, s, d], [b, hh, s, 1], [b, hh, s, s]);
    let bshd = [s * hh * d, d, hh * d, 1];
    let kt = |u: i64| tensor(u, &[b, hh, d, s], &[hh * s * d, s * d, 1, d], false);
    let (q, k_t, v_t) = (tensor(1, &qd, &packed(&qd), false), kt(2), kt(3));
    let (o, d_o) = (tensor(4, &qd, &bshd, false), tensor(7, &qd, &bshd, false));
    let stats = tensor(6, &sd, &packed(&sd), false);
    let (dq, dk, dv) = (tensor(8, &qd, &packed(&qd), false), tensor(9, &qd, &packed(&qd), false), tensor(10, &qd, &packed(&qd), false));
    let (scale, one) = (scalar(5), scalar(11));
    let softmax_sum = tensor(12, &sd, &packed(&sd), false);
    let dq_accum = tensor(13, &qd, &packed(&qd), false);
    let v = |u: i64, dims: &[i64], strides: &[i64]| tensor(u, dims, strides, true);
    let vp = |u: i64| v(u, &pd, &packed(&pd));
    let transposed = [hh * s * s, s * s, 1, s];
    let mm = B::new(MATMUL).int(MATMUL_COMP_TYPE, T_DATA_TYPE, CUDNN_DATA_FLOAT).fin();
    let matmul =
        |a: &B, bb: &B, c: &B| B::new(OP_MATMUL).descs(OP_MATMUL_ADESC, &[a]).descs(OP_MATMUL_BDESC, &[bb]).descs(OP_MATMUL_CDESC, &[c]).descs(OP_MATMUL_DESC, &[&mm]).fin();
    let reshape = |x: &B, y: &B| B::new(OP_RESHAPE).descs(OP_RESHAPE_XDESC, &[x]).descs(OP_RESHAPE_YDESC, &[y]).fin();
    let red = B::new(REDUCTION).int(REDUCTION_OPERATOR, T_REDUCTION_OPERATOR_TYPE, CUDNN_REDUCE_TENSOR_ADD).int(REDUCTION_COMP_TYPE, T_DATA_TYPE, CUDNN_DATA_FLOAT).fin();
    let (mul, sub, exp, ident) = (pw_desc(pw::MUL), pw_desc(pw::SUB), pw_desc(pw::EXP), pw_desc(pw::IDENTITY));
    for causal in [false, true] {
        let mut ops = Vec::new();
        // dO * O, virtual with the frontend's strides (h and s strides overlap), summed over d.
        let do_o = v(100, &qd, &[hh * s * d, s * d, hh * d, 1]);
        ops.push(pw_op(&mul, &d_o, Some(&o), &do_o));
        let row = v(101, &sd, &[hh * s, s, 1, 1]);
        ops.push(B::new(OP_REDUCTION).descs(OP_REDUCTION_XDESC, &[&do_o]).descs(OP_REDUCTION_YDESC, &[&row]).descs(OP_REDUCTION_DESC, &[&red]).fin());
        ops.push(pw_op(&mul, &row, Some(&one), &softmax_sum));
        // P = exp(Q K^T * scale [masked] - stats).
        let (qk, scaled) = (vp(102), vp(103));
        ops.push(matmul(&q, &k_t, &qk));
        ops.push(pw_op(&mul, &qk, Some(&scale), &scaled));
        let (masked, fill) = (vp(120), scalar(121));
        if causal {
            ops.push(B::new(OP_DIAGONAL_BAND_MASK).descs(3000, &[&scaled]).descs(3005, &[&fill]).descs(3006, &[&masked]).int(3007, T_POINTWISE_MODE, pw::CMP_GE).fin());
        }
        let (centered, p) = (vp(104), vp(105));
        ops.push(pw_op(&sub, if causal { &masked } else { &scaled }, Some(&stats), &centered));
        ops.push(pw_op(&exp, &centered, None, &p));
        // dV = P^T dO.
        let p_t = v(106, &pd, &transposed);
        ops.push(reshape(&p, &p_t));
        ops.push(matmul(&p_t, &d_o, &dv));
        // dS = P (dO V^T - softmax_sum) * scale; dK = dS^T Q.
        let (dp, dp_c, ds0, ds) = (vp(107), vp(108), vp(109), vp(110));
        ops.push(matmul(&d_o, &v_t, &dp));
        ops.push(pw_op(&sub, &dp, Some(&softmax_sum), &dp_c));
        ops.push(pw_op(&mul, &dp_c, Some(&p), &ds0));
        ops.push(pw_op(&mul, &ds0, Some(&scale), &ds));
        let ds_t = v(111, &pd, &transposed);
        ops.push(reshape(&ds, &ds_t));
        ops.push(matmul(&ds_t, &q, &dk));
        // dQ = dS K, K from K^T by a view, through the float accumulator.
        let k = v(112, &qd, &packed(&qd));
        ops.push(reshape(&k_t, &k));
        ops.push(matmul(&ds, &k, &dq_accum));
        ops.push(pw_op(&ident, &dq_accum, None, &dq));
        let refs: Vec<&B> = ops.iter().collect();
        let graph = op_graph(h.0, &refs);

        let sv = 0.4f32;
        let mut g = Graph::new("sdpa_backward");
        let gq = g.tensor(TensorDesc::new("q", &qd, DataType::F32).with_uid(1));
        let gk = g.tensor(TensorDesc::new("k", &qd, DataType::F32).with_uid(2));
        let gv = g.tensor(TensorDesc::new("v", &qd, DataType::F32).with_uid(3));
        let gdo = g.tensor(TensorDesc::new("do", &qd, DataType::F32).with_uid(7));
        let attrs = SdpaAttrs { causal: causal.then_some(CausalAlignment::TopLeft), generate_stats: true, attn_scale: Some(sv as f64), ..Default::default() };
        let (go, gs) = g.sdpa(gq, gk, gv, SdpaInputs::default(), attrs.clone());
        let gs = gs.expect("statistics");
        let grads = g.sdpa_backward(gq, gk, gv, go, gdo, gs, SdpaInputs::default(), attrs);
        for (t, uid) in [(go, 4), (gs, 6), (grads.dq, 8), (grads.dk, 9), (grads.dv, 10)] {
            g.set_output(t);
            g.desc_mut(t).uid = Some(uid);
            g.desc_mut(t).data_type = Some(DataType::F32);
        }
        let inputs: HashMap<TensorId, Nd> = [(gq, rand_nd(&qd, 60)), (gk, rand_nd(&qd, 61)), (gv, rand_nd(&qd, 62)), (gdo, rand_nd(&qd, 63))].into_iter().collect();
        let dense = |uid: i64, dims: &[i64]| Nd::new(dims.iter().map(|&x| x as usize).collect(), reference(&g, &inputs, uid));
        let mut bufs = Buffers::new();
        bufs.input(1, &inputs[&gq], &packed(&qd));
        // K and V as the graph describes them: K^T [b, h, d, s] over K's own memory.
        bufs.input(2, &inputs[&gk], &packed(&qd));
        bufs.input(3, &inputs[&gv], &packed(&qd));
        bufs.input(4, &dense(4, &qd), &bshd);
        bufs.input(6, &dense(6, &sd), &packed(&sd));
        bufs.input(7, &inputs[&gdo], &bshd);
        bufs.scalars.insert(5, sv);
        bufs.scalars.insert(11, 1.0);
        if causal {
            bufs.scalars.insert(121, f32::NEG_INFINITY);
        }
        bufs.output(12, &sd, &packed(&sd));
        for uid in [8, 9, 10, 13] {
            bufs.output(uid, &qd, &packed(&qd));
        }
        run(h.0, &graph, HEUR_MODE_A, &mut bufs);
        for (uid, what) in [(8, "dQ"), (9, "dK"), (10, "dV")] {
            check(&bufs.dense(uid, &qd, &packed(&qd)), &reference(&g, &inputs, uid), 1e-4, &format!("{what} (causal {causal})"));
        }
    }
}
