//! Bad graphs and bad execution arguments: each must return its expected error, never panic.
//! Op-specific rules are tested beside each op family; this file holds the structural rules
//! every graph obeys, execution-time checks, and a sample of op rules from every family.

use ferrodnn::engine::{Buffer, PlanPolicy};
use ferrodnn::graph::ops::pointwise::PointwiseMode;
use ferrodnn::graph::{Port, TensorDesc};
use ferrodnn::{DataType, EngineKind, Error, Graph, Handle, TensorId, VariantPack};

fn f32t(name: &str, dims: &[i64]) -> TensorDesc {
    TensorDesc::new(name, dims, DataType::F32)
}

/// x -> relu -> y, with uids 1 and 2.
fn relu_graph(x: TensorDesc) -> (Graph, TensorId, TensorId) {
    let mut g = Graph::new("g").io_data_type(DataType::F32);
    let x = g.tensor(x.with_uid(1));
    let y = g.relu(x);
    g.set_output(y);
    g.desc_mut(y).uid = Some(2);
    (g, x, y)
}

fn expect_graph_err(mut g: Graph, want: &str) -> String {
    match g.validate() {
        Err(Error::InvalidGraph(msg)) => {
            assert!(msg.contains(want), "message `{msg}` lacks `{want}`");
            msg
        }
        other => panic!("expected InvalidGraph containing `{want}`, got {other:?}"),
    }
}

#[test]
fn empty_graph() {
    expect_graph_err(Graph::new("empty"), "graph \"empty\" has no operations");
}

#[test]
fn input_without_dims() {
    let mut t = f32t("x", &[2]);
    t.dims.clear();
    t.strides.clear();
    expect_graph_err(relu_graph(t).0, "input `a` (tensor \"x\") has no dims");
}

#[test]
fn rank_above_eight() {
    expect_graph_err(relu_graph(f32t("x", &[1; 9])).0, "tensor \"x\": rank must be 1 to 8, got 9");
}

#[test]
fn zero_dim() {
    expect_graph_err(relu_graph(f32t("x", &[2, 0, 3])).0, "tensor \"x\": dim 1 must be positive, got 0");
}

#[test]
fn negative_dim() {
    expect_graph_err(relu_graph(f32t("x", &[2, -3])).0, "dim 1 must be positive, got -3");
}

#[test]
fn stride_count_mismatch() {
    expect_graph_err(relu_graph(f32t("x", &[2, 3]).with_strides(&[1])).0, "tensor \"x\": 1 strides given for 2 dims");
}

#[test]
fn negative_stride() {
    expect_graph_err(relu_graph(f32t("x", &[2, 3]).with_strides(&[3, -1])).0, "stride 1 must be non-negative, got -1");
}

#[test]
fn overlapping_output_strides() {
    let (mut g, _, y) = relu_graph(f32t("x", &[4, 3]));
    g.desc_mut(y).strides = vec![2, 1];
    let msg = expect_graph_err(g, "output tensor \"relu_0::y\": strides [2, 1] make elements of dims [4, 3] overlap");
    assert!(msg.starts_with("relu \"relu_0\""), "{msg}");
}

/// Inputs are only read, so, as in cuDNN, their views may share memory: overlapping rows, an
/// expanded (stride 0) axis, a transposed and expanded one. The CPU engine reads each element at
/// its strides.
#[test]
fn overlapping_input_strides_are_read_at_their_offsets() {
    for (dims, strides) in [(vec![4, 3], vec![2, 1]), (vec![4, 3], vec![0, 1]), (vec![3, 4], vec![1, 0]), (vec![2, 3, 4], vec![1, 1, 1])] {
        let (mut g, x, _) = relu_graph(f32t("x", &dims).with_strides(&strides));
        g.validate().unwrap();
        let extent = g.desc(x).extent_elements().unwrap() as usize;
        let data: Vec<f64> = (0..extent).map(|i| i as f64 - 3.0).collect();
        let xs = DataType::F32.encode(&data);
        let count: usize = dims.iter().product::<i64>() as usize;
        let mut ys = vec![0u8; 4 * count];
        let plan = built(&g);
        let mut pack = VariantPack::new();
        pack.input(1, &xs).output(2, &mut ys);
        plan.execute(&mut pack, None).unwrap();
        let out = DataType::F32.decode(&ys);
        let mut idx = vec![0i64; dims.len()];
        for (flat, &got) in out.iter().enumerate() {
            let mut rem = flat as i64;
            for a in (0..dims.len()).rev() {
                idx[a] = rem % dims[a];
                rem /= dims[a];
            }
            let off: i64 = idx.iter().zip(&strides).map(|(i, s)| i * s).sum();
            assert_eq!(got, data[off as usize].max(0.0), "dims {dims:?} strides {strides:?} at {idx:?}");
        }
    }
}

#[test]
fn element_count_overflows_i64() {
    expect_graph_err(relu_graph(f32t("x", &[1 << 40, 1 << 40])).0, "overflows i64");
}

#[test]
fn extent_overflows_i64() {
    expect_graph_err(relu_graph(f32t("x", &[4, 4]).with_strides(&[i64::MAX / 2, 1])).0, "extent of dims [4, 4]");
}

#[test]
fn too_many_elements() {
    expect_graph_err(relu_graph(f32t("x", &[1 << 30, 1 << 20])).0, "elements is more than the");
}

#[test]
fn input_without_type() {
    let mut g = Graph::new("g");
    let mut t = f32t("x", &[3]);
    t.data_type = None;
    let x = g.tensor(t);
    let y = g.relu(x);
    g.set_output(y);
    expect_graph_err(g, "input `a` (tensor \"x\") has no data type and the graph sets no io_data_type");
}

#[test]
fn virtual_input_without_producer() {
    let mut t = f32t("x", &[3]);
    t.is_virtual = true;
    expect_graph_err(relu_graph(t).0, "input `a` (tensor \"x\") is virtual but no op produces it");
}

#[test]
fn cycle() {
    let mut g = Graph::new("g").io_data_type(DataType::F32);
    let x = g.tensor(f32t("x", &[3]));
    let a = g.add(x, x);
    let b = g.relu(a);
    // Feed b back into the first op.
    g.nodes[0].inputs[1] = Port { name: "b".into(), tensor: b };
    expect_graph_err(g, "the graph has a cycle");
}

#[test]
fn two_producers() {
    let mut g = Graph::new("g").io_data_type(DataType::F32);
    let x = g.tensor(f32t("x", &[3]));
    let a = g.relu(x);
    let _b = g.exp(x);
    g.nodes[1].outputs[0].tensor = a;
    expect_graph_err(g, "is already produced by op \"relu_0\"");
}

#[test]
fn port_to_missing_tensor() {
    let (mut g, _, _) = relu_graph(f32t("x", &[3]));
    g.nodes[0].inputs[0].tensor = TensorId(99);
    expect_graph_err(g, "port `a` refers to tensor #99 but the graph has 2 tensors");
}

#[test]
fn duplicate_uids() {
    let (mut g, _, y) = relu_graph(f32t("x", &[3]));
    g.desc_mut(y).uid = Some(1);
    expect_graph_err(g, "share uid 1");
}

#[test]
fn output_with_zero_stride() {
    let (mut g, _, y) = relu_graph(f32t("x", &[3, 4]));
    g.desc_mut(y).strides = vec![0, 1];
    expect_graph_err(g, "has a zero stride");
}

#[test]
fn output_dims_contradict_inference() {
    let (mut g, _, y) = relu_graph(f32t("x", &[3, 4]));
    g.desc_mut(y).dims = vec![4, 3];
    expect_graph_err(g, "was given dims [4, 3] but the op produces [3, 4]");
}

#[test]
fn by_value_with_many_elements() {
    let mut g = Graph::new("g").io_data_type(DataType::F32);
    let x = g.tensor(f32t("x", &[3]));
    let mut s = TensorDesc::scalar("s", 2.0, DataType::F32);
    s.dims = vec![2];
    s.strides = vec![1];
    let s = g.tensor(s);
    let y = g.mul(x, s);
    g.set_output(y);
    expect_graph_err(g, "a by-value scalar must have one element");
}

#[test]
fn op_writes_by_value_tensor() {
    let (mut g, _, y) = relu_graph(f32t("x", &[3]));
    g.desc_mut(y).is_pass_by_value = true;
    expect_graph_err(g, "is a by-value scalar; an op cannot write one");
}

#[test]
fn pointwise_shapes_do_not_broadcast() {
    let mut g = Graph::new("g").io_data_type(DataType::F32);
    let a = g.tensor(f32t("a", &[2, 3]));
    let b = g.tensor(f32t("b", &[4, 3]));
    let y = g.add(a, b);
    g.named("sum");
    g.set_output(y);
    expect_graph_err(g, "add \"sum\": inputs do not broadcast: a [2, 3], b [4, 3]");
}

#[test]
fn pointwise_missing_input() {
    let mut g = Graph::new("g").io_data_type(DataType::F32);
    let a = g.tensor(f32t("a", &[2, 3]));
    let y = g.pointwise(PointwiseMode::Mul, &[a]);
    g.set_output(y);
    expect_graph_err(g, "mul \"mul_0\": takes 2 input(s) (ports a, b) but 1 is connected: input `b` is missing");
}

#[test]
fn pointwise_extra_input() {
    let mut g = Graph::new("g").io_data_type(DataType::F32);
    let a = g.tensor(f32t("a", &[2, 3]));
    let y = g.pointwise(PointwiseMode::Exp, &[a, a]);
    g.set_output(y);
    expect_graph_err(g, "takes 1 input(s) (ports a) but 2 are connected, including `b`");
}

#[test]
fn gen_index_axis_out_of_range() {
    let mut g = Graph::new("g").io_data_type(DataType::F32);
    let a = g.tensor(f32t("a", &[2, 3]));
    let y = g.pointwise(PointwiseMode::GenIndex { axis: 2 }, &[a]);
    g.set_output(y);
    expect_graph_err(g, "gen_index axis must be below the rank 2, got 2");
}

// ---- execution-time checks ----

fn built(g: &Graph) -> ferrodnn::Plan {
    Handle::cpu().build_plans(g, &PlanPolicy::default()).unwrap().remove(0)
}

fn expect_arg_err(r: ferrodnn::Result<()>, want: &str) {
    match r {
        Err(Error::InvalidArgument(msg)) => assert!(msg.contains(want), "message `{msg}` lacks `{want}`"),
        other => panic!("expected InvalidArgument containing `{want}`, got {other:?}"),
    }
}

#[test]
fn pack_with_unknown_uid() {
    let (g, _, _) = relu_graph(f32t("x", &[3]));
    let plan = built(&g);
    let x = vec![0u8; 12];
    let mut y = vec![0u8; 12];
    let extra = vec![0u8; 4];
    let mut pack = VariantPack::new();
    pack.input(1, &x).output(2, &mut y).input(77, &extra);
    expect_arg_err(plan.execute(&mut pack, None), "the variant pack has uid 77, which no non-virtual tensor of the graph has");
}

#[test]
fn buffer_too_small() {
    let (g, _, _) = relu_graph(f32t("x", &[3, 5]).with_strides(&[8, 1]));
    let plan = built(&g);
    let x = vec![0u8; 4 * 15]; // the strides reach element 2*8+4 = 20, so 21 elements are needed
    let mut y = vec![0u8; 60];
    let mut pack = VariantPack::new();
    pack.input(1, &x).output(2, &mut y);
    expect_arg_err(plan.execute(&mut pack, None), "tensor \"x\" (uid 1): buffer is 60 bytes but dims [3, 5] with strides [8, 1] of f32 need 84");
}

#[test]
fn missing_buffer() {
    let (g, _, _) = relu_graph(f32t("x", &[3]));
    let plan = built(&g);
    let x = vec![0u8; 12];
    let mut pack = VariantPack::new();
    pack.input(1, &x);
    expect_arg_err(plan.execute(&mut pack, None), "has no buffer in the variant pack");
}

#[test]
fn device_pointer_to_cpu_engine() {
    let (g, _, _) = relu_graph(f32t("x", &[3]));
    let plan = built(&g);
    let mut y = vec![0u8; 12];
    let mut pack = VariantPack::new();
    pack.device(1, 0x7000_0000, 12).output(2, &mut y);
    expect_arg_err(plan.execute(&mut pack, None), "the CPU engine needs host buffers, but a device pointer was given");
}

#[test]
fn output_given_read_only() {
    let (g, _, _) = relu_graph(f32t("x", &[3]));
    let plan = built(&g);
    let x = vec![0u8; 12];
    let y = vec![0u8; 12];
    let mut pack = VariantPack::new();
    pack.input(1, &x).input(2, &y);
    expect_arg_err(plan.execute(&mut pack, None), "is an output: pass it as a writable host buffer");
}

#[test]
fn plan_for_another_graph() {
    let (g, _, _) = relu_graph(f32t("x", &[3]));
    let plan = built(&g);
    let (other, _, _) = relu_graph(f32t("x", &[4]));
    match Handle::cpu().plan_from_desc(&other, &plan.desc) {
        Err(Error::InvalidArgument(msg)) => assert!(msg.contains("the plan was built for graph key"), "{msg}"),
        other => panic!("expected an error, got {:?}", other.map(|p| p.desc)),
    }
}

#[test]
fn engine_not_available() {
    let (g, _, _) = relu_graph(f32t("x", &[3]));
    let policy = PlanPolicy { engine: Some(EngineKind::Cuda), ..Default::default() };
    match Handle::cpu().build_plans(&g, &policy) {
        Err(Error::NotSupported(msg)) => assert!(msg.contains("no plan on engine cuda"), "{msg}"),
        other => panic!("expected NotSupported, got {:?}", other.map(|p| p.len())),
    }
}

#[test]
fn workspace_buffer_kinds_report_their_size() {
    let mut ws = vec![0u8; 10];
    assert_eq!(Buffer::HostMut(&mut ws).len(), 10);
    assert_eq!(Buffer::Device { ptr: 1, bytes: 7 }.len(), 7);
}
