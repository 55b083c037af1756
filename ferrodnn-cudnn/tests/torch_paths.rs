//! The backend call sequence of PyTorch's cuDNN convolutions (aten's Conv_v8.cpp, through the
//! cudnn frontend's v0.x builders) on the CPU handle: an operation graph of one convolution on
//! tensors 'x', 'w', 'y' (byte alignment, float alpha and beta, groups implied by the shapes, a
//! float compute type for half data), heuristics INSTANT and then FALLBACK, each list filtered
//! by numerical notes as PyTorch filters it, execution plans with the queries the frontend makes
//! when it builds one (the engine, its global index and knob choices for the plan's tag, the
//! notes counted with a null array, the workspace size), and a variant pack of three pointers,
//! executed twice as PyTorch's plan cache does. Each result against the same convolution on
//! ferrodnn's f64 reference engine.

mod common;
use common::backend::*;
use common::*;
use ferrodnn::graph::ops::conv::ConvAttrs;
use ferrodnn::layout::Nd;
use ferrodnn::{DataType, Graph, TensorDesc, TensorId};
use ferrodnn_cudnn::backend::attrs::*;
use ferrodnn_cudnn::backend::*;
use ferrodnn_cudnn::types::*;
use half::f16;
use std::collections::HashMap;
use std::ffi::c_void;

const X: i64 = b'x' as i64;
const W: i64 = b'w' as i64;
const Y: i64 = b'y' as i64;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Dir {
    Fprop,
    Dgrad,
    Wgrad,
}

struct Case {
    name: &'static str,
    x: [i64; 4],
    w: [i64; 4],
    pad: i64,
    stride: i64,
    dilation: i64,
    nhwc: bool,
}

impl Case {
    fn y(&self) -> [i64; 4] {
        let out = |i: i64, k: i64| (i + 2 * self.pad - self.dilation * (k - 1) - 1) / self.stride + 1;
        [self.x[0], self.w[0], out(self.x[2], self.w[2]), out(self.x[3], self.w[3])]
    }
    fn strides(&self, dims: &[i64]) -> Vec<i64> {
        if self.nhwc {
            nhwc(dims)
        } else {
            packed(dims)
        }
    }
    fn attrs(&self) -> ConvAttrs {
        ConvAttrs::new(2).with_padding(&[self.pad; 2]).with_stride(&[self.stride; 2]).with_dilation(&[self.dilation; 2])
    }
}

/// The operation of `dir` with alpha 1 and beta 0 as floats (the frontend's default scaling type).
fn torch_operation(dir: Dir, case: &Case, dt: i32) -> B {
    // As PyTorch's getTensorDescriptor gives them: 16-byte alignment, IS_VIRTUAL set (false).
    let (x, w, y) = (
        tensor_of(X, &case.x, &case.strides(&case.x), dt, false),
        tensor_of(W, &case.w, &case.strides(&case.w), dt, false),
        tensor_of(Y, &case.y(), &case.strides(&case.y()), dt, false),
    );
    // PyTorch asks for float compute for half and bfloat16 data.
    let conv = B::new(CONVOLUTION)
        .int(CONVOLUTION_COMP_TYPE, T_DATA_TYPE, CUDNN_DATA_FLOAT)
        .int(CONVOLUTION_CONV_MODE, T_CONVOLUTION_MODE, CUDNN_CROSS_CORRELATION)
        .i64s(CONVOLUTION_SPATIAL_DIMS, &[2])
        .i64s(CONVOLUTION_PRE_PADDINGS, &[case.pad; 2])
        .i64s(CONVOLUTION_POST_PADDINGS, &[case.pad; 2])
        .i64s(CONVOLUTION_FILTER_STRIDES, &[case.stride; 2])
        .i64s(CONVOLUTION_DILATIONS, &[case.dilation; 2])
        .fin();
    let (kind, [ax, aw, ay, ac, alpha, beta]) = match dir {
        Dir::Fprop => (OP_CONV_FORWARD, [OP_CONV_FWD_X, OP_CONV_FWD_W, OP_CONV_FWD_Y, OP_CONV_FWD_CONV_DESC, OP_CONV_FWD_ALPHA, OP_CONV_FWD_BETA]),
        Dir::Dgrad => (OP_CONV_BWD_DATA, [OP_CONV_BWD_DATA_DX, OP_CONV_BWD_DATA_W, OP_CONV_BWD_DATA_DY, OP_CONV_BWD_DATA_CONV_DESC, OP_CONV_BWD_DATA_ALPHA, OP_CONV_BWD_DATA_BETA]),
        Dir::Wgrad => (
            OP_CONV_BWD_FILTER,
            [OP_CONV_BWD_FILTER_X, OP_CONV_BWD_FILTER_DW, OP_CONV_BWD_FILTER_DY, OP_CONV_BWD_FILTER_CONV_DESC, OP_CONV_BWD_FILTER_ALPHA, OP_CONV_BWD_FILTER_BETA],
        ),
    };
    let op = B::new(kind).descs(ax, &[&x]).descs(aw, &[&w]).descs(ay, &[&y]).descs(ac, &[&conv]);
    ok(op.set_raw(alpha, T_FLOAT, &[1.0f32]));
    ok(op.set_raw(beta, T_FLOAT, &[0.0f32]));
    op.fin()
}

/// The engine of an engine configuration, read into a descriptor of our own as the frontend does.
fn engine_of(cfg: &B) -> B {
    let engine = B::new(ENGINE);
    let mut n = 0i64;
    let mut raw = engine.0;
    ok(cudnnBackendGetAttribute(cfg.0, ENGINECFG_ENGINE, T_BACKEND_DESCRIPTOR, 1, &mut n, &mut raw as *mut _ as *mut c_void));
    assert_eq!(n, 1);
    engine
}

/// A list of notes, counted first with a null array and the type's full count (as the frontend's
/// fetchNotes asks), then read.
fn notes(engine: &B, attr: i32, ty: i32, max: i32) -> Vec<i32> {
    let mut n = -1i64;
    ok(cudnnBackendGetAttribute(engine.0, attr, ty, max as i64, &mut n, std::ptr::null_mut()));
    assert!((0..=max as i64).contains(&n), "note count {n}");
    let mut v = vec![max; max as usize];
    let mut m = -1i64;
    ok(cudnnBackendGetAttribute(engine.0, attr, ty, max as i64, &mut m, v.as_mut_ptr() as *mut c_void));
    assert_eq!(m, n, "the counted and the read notes differ");
    v.truncate(n as usize);
    v
}

/// PyTorch's filterEngineConfigs: true for a configuration it keeps (deterministic off, f32 data
/// with tf32 disallowed when `no_tf32`).
fn torch_keeps(cfg: &B, no_tf32: bool) -> bool {
    let n = notes(&engine_of(cfg), ENGINE_NUMERICAL_NOTE, T_NUMERICAL_NOTE, NUMERICAL_NOTE_TYPE_COUNT);
    !(n.contains(&NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) || (no_tf32 && n.contains(&NUMERICAL_NOTE_TENSOR_CORE)))
}

/// The frontend's ExecutionPlanBuilder::build: the plan, then its tag (`eng<index>` and the knob
/// choices), its notes and its workspace size.
fn torch_plan(h: cudnnHandle_t, cfg: &B) -> (B, String, i64) {
    let p = B::new(EXECUTION_PLAN).handle(EXECUTION_PLAN_HANDLE, h).descs(EXECUTION_PLAN_ENGINE_CONFIG, &[cfg]).fin();
    let engine = engine_of(cfg);
    let mut tag = format!("eng{}", engine.get_i64(ENGINE_GLOBAL_INDEX));
    let knobs: Vec<B> = (0..KNOB_TYPE_COUNTS).map(|_| B::new(KNOB_CHOICE)).collect();
    let mut raw: Vec<cudnnBackendDescriptor_t> = knobs.iter().map(|k| k.0).collect();
    let mut count = -1i64;
    ok(cudnnBackendGetAttribute(cfg.0, ENGINECFG_KNOB_CHOICES, T_BACKEND_DESCRIPTOR, KNOB_TYPE_COUNTS as i64, &mut count, raw.as_mut_ptr() as *mut c_void));
    assert!((0..=KNOB_TYPE_COUNTS as i64).contains(&count), "knob choice count {count}");
    for k in &raw[..count as usize] {
        let (mut ty, mut choice) = (0i32, 0i64);
        ok(cudnnBackendGetAttribute(*k, KNOB_CHOICE_KNOB_TYPE, T_KNOB_TYPE, 1, std::ptr::null_mut(), &mut ty as *mut i32 as *mut c_void));
        ok(cudnnBackendGetAttribute(*k, KNOB_CHOICE_KNOB_VALUE, T_INT64, 1, std::ptr::null_mut(), &mut choice as *mut i64 as *mut c_void));
        tag += &format!("_k{ty}={choice}");
    }
    notes(&engine, ENGINE_NUMERICAL_NOTE, T_NUMERICAL_NOTE, NUMERICAL_NOTE_TYPE_COUNT);
    notes(&engine, ENGINE_BEHAVIOR_NOTE, T_BEHAVIOR_NOTE, BEHAVIOR_NOTE_TYPE_COUNT);
    let ws = p.get_i64(EXECUTION_PLAN_WORKSPACE_SIZE);
    assert!(ws >= 0);
    (p, tag, ws)
}

/// The engine configurations of heuristics in `mode`, as the frontend's EngineHeuristics gives
/// them (count, then that many configurations), filtered as PyTorch filters them.
fn torch_configs(graph: &B, mode: i32, no_tf32: bool) -> Vec<B> {
    heuristics(graph, mode).into_iter().filter(|c| torch_keeps(c, no_tf32)).collect()
}

/// A host buffer of f32 or f16 elements holding `nd` at `strides` (gaps NaN).
fn buffer(nd: &Nd, strides: &[i64], half: bool) -> Vec<u8> {
    let extent = 1 + nd.dims.iter().zip(strides).map(|(&d, &s)| (d as i64 - 1) * s).sum::<i64>() as usize;
    let mut vals = vec![f32::NAN; extent];
    for (i, &v) in nd.data.iter().enumerate() {
        vals[offset(i, &nd.dims, strides)] = v as f32;
    }
    if half {
        vals.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect()
    } else {
        vals.iter().flat_map(|v| v.to_le_bytes()).collect()
    }
}

/// The dense values of `dims` at `strides` in `buf`.
fn dense(buf: &[u8], dims: &[i64], strides: &[i64], half: bool) -> Vec<f32> {
    let d: Vec<usize> = dims.iter().map(|&v| v as usize).collect();
    let n: usize = d.iter().product();
    (0..n)
        .map(|i| {
            let o = offset(i, &d, strides);
            if half {
                f16::from_le_bytes([buf[2 * o], buf[2 * o + 1]]).to_f32()
            } else {
                f32::from_le_bytes(buf[4 * o..4 * o + 4].try_into().expect("four bytes"))
            }
        })
        .collect()
}

/// Random values of `dims`, rounded to half when `half`.
fn values(dims: &[i64], seed: u64, half: bool) -> Nd {
    let d: Vec<usize> = dims.iter().map(|&v| v as usize).collect();
    let v = rand(d.iter().product(), seed).into_iter().map(|v| if half { f16::from_f32(v).to_f32() } else { v } as f64).collect();
    Nd::new(d, v)
}

/// The output of `dir` on ferrodnn's f64 reference engine, and the two inputs it reads by uid.
fn reference(dir: Dir, case: &Case, half: bool) -> (HashMap<i64, Nd>, i64, Vec<f64>) {
    let y = case.y();
    let (a_uid, a_dims, b_uid, b_dims, out_uid) = match dir {
        Dir::Fprop => (X, case.x, W, case.w, Y),
        Dir::Dgrad => (Y, y, W, case.w, X),
        Dir::Wgrad => (Y, y, X, case.x, W),
    };
    let mut g = Graph::new("torch_conv");
    let a = g.tensor(TensorDesc::new("a", &a_dims, DataType::F32).with_uid(a_uid));
    let b = g.tensor(TensorDesc::new("b", &b_dims, DataType::F32).with_uid(b_uid));
    let out = match dir {
        Dir::Fprop => g.conv_fprop(a, b, case.attrs()),
        Dir::Dgrad => g.conv_dgrad(a, b, &case.x, case.attrs()),
        Dir::Wgrad => g.conv_wgrad(a, b, &case.w, case.attrs()),
    };
    g.set_output(out);
    let inputs: HashMap<i64, Nd> = [(a_uid, values(&a_dims, 1, half)), (b_uid, values(&b_dims, 2, half))].into_iter().collect();
    let by_id: HashMap<TensorId, Nd> = [(a, inputs[&a_uid].clone()), (b, inputs[&b_uid].clone())].into_iter().collect();
    let got = ferrodnn::testing::run_cpu(&g, &by_id).expect("the reference graph runs");
    (inputs, out_uid, got[&out].data.clone())
}

/// Executes `plan` twice on buffers of the case (PyTorch's cached plan runs again), and checks
/// the output against the reference.
fn execute_and_check(h: cudnnHandle_t, plan: &B, ws: i64, dir: Dir, case: &Case, half: bool, what: &str) {
    let (inputs, out_uid, want) = reference(dir, case, half);
    let dims: HashMap<i64, Vec<i64>> = [(X, case.x.to_vec()), (W, case.w.to_vec()), (Y, case.y().to_vec())].into_iter().collect();
    let mut bufs: HashMap<i64, Vec<u8>> = HashMap::new();
    for (&uid, nd) in &inputs {
        bufs.insert(uid, buffer(nd, &case.strides(&dims[&uid]), half));
    }
    let out_nd = Nd::new(dims[&out_uid].iter().map(|&v| v as usize).collect(), vec![f64::NAN; want.len()]);
    bufs.insert(out_uid, buffer(&out_nd, &case.strides(&dims[&out_uid]), half));
    let mut workspace = vec![0u8; ws as usize];
    for run in 0..2 {
        let ptrs: Vec<*mut c_void> = [X, Y, W].iter().map(|u| bufs.get_mut(u).expect("buffer").as_mut_ptr() as *mut c_void).collect();
        let ws_ptr = if ws > 0 { workspace.as_mut_ptr() as *mut c_void } else { std::ptr::null_mut() };
        let p = pack(&[X, Y, W], &ptrs, ws_ptr);
        ok(cudnnBackendExecute(h, plan.0, p.0));
        let got = dense(&bufs[&out_uid], &dims[&out_uid], &case.strides(&dims[&out_uid]), half);
        // f16 storage of the output rounds to 2^-11 relative.
        close(&got, &want, if half { 2e-3 } else { 1e-4 }, &format!("{what} (execution {run})"));
    }
}

#[test]
fn conv_v8_sequence_runs_every_direction_layout_and_group_count() {
    let h = Handle::cpu();
    let cases = [
        Case { name: "nchw 3x3 pad 1", x: [2, 8, 9, 9], w: [16, 8, 3, 3], pad: 1, stride: 1, dilation: 1, nhwc: false },
        Case { name: "nhwc groups 2 stride 2", x: [2, 8, 9, 9], w: [12, 4, 3, 3], pad: 1, stride: 2, dilation: 1, nhwc: true },
        Case { name: "nchw groups 4 dilation 2", x: [2, 8, 10, 10], w: [8, 2, 3, 3], pad: 2, stride: 1, dilation: 2, nhwc: false },
        Case { name: "nhwc depthwise", x: [2, 8, 7, 7], w: [8, 1, 3, 3], pad: 1, stride: 1, dilation: 1, nhwc: true },
        Case { name: "nhwc 1x1", x: [2, 8, 5, 5], w: [16, 8, 1, 1], pad: 0, stride: 1, dilation: 1, nhwc: true },
    ];
    for case in &cases {
        for half in [false, true] {
            let dt = if half { CUDNN_DATA_HALF } else { CUDNN_DATA_FLOAT };
            for dir in [Dir::Fprop, Dir::Dgrad, Dir::Wgrad] {
                let what = format!("{:?} {} {}", dir, case.name, if half { "f16" } else { "f32" });
                let op = torch_operation(dir, case, dt);
                let graph = op_graph(h.0, &[&op]);
                // PyTorch tries the heuristics' configurations first, then the fallback list's,
                // both filtered (tf32 disallowed: the strictest filter it applies).
                for mode in [HEUR_MODE_INSTANT, HEUR_MODE_FALLBACK] {
                    let cfgs = torch_configs(&graph, mode, !half);
                    assert!(!cfgs.is_empty(), "{what}: PyTorch's filter leaves no configuration of heuristics mode {mode}");
                    let (plan, tag, ws) = torch_plan(h.0, &cfgs[0]);
                    assert!(tag.starts_with("eng"), "{what}: plan tag {tag}");
                    execute_and_check(h.0, &plan, ws, dir, case, half, &format!("{what}, heuristics mode {mode}"));
                }
            }
        }
    }
}
