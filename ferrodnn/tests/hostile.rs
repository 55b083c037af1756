//! A corpus of hostile inputs: malformed JSON graph files, graphs that cannot mean anything, and
//! graphs whose sizes no machine can hold or whose work would run for hours. Each goes through
//! what a user's input goes through (deserialize, validate, CPU plan build, random inputs,
//! execute) under `catch_unwind`, and must give an `Err` whose message names the op and the
//! tensor involved: never a panic, an abort or a hang.
//!
//! The cases that a graph file can hold are also committed as files under `tests/hostile/`, which
//! the CLI's and the Python package's tests run through `ferrodnn run` and `run_graph_json`
//! (`the_committed_graph_files_are_the_corpus` keeps them equal to the corpus).
//!
//! The limits are fixed for this process (no other test here reads them): 4 GiB of host memory
//! and the default work bound, so that every case fails the same way on any machine.

use ferrodnn::graph::ops::conv::ConvAttrs;
use ferrodnn::graph::ops::norm::NormAttrs;
use ferrodnn::graph::ops::pointwise::PointwiseMode;
use ferrodnn::graph::ops::reduction::ReductionMode;
use ferrodnn::graph::ops::resample::{ResampleAttrs, ResampleMode};
use ferrodnn::graph::ops::rng::Distribution;
use ferrodnn::graph::ops::sdpa::{SdpaAttrs, SdpaInputs};
use ferrodnn::graph::Port;
use ferrodnn::testing::run_cpu_random;
use ferrodnn::{DataType, Error, Graph, TensorDesc, TensorId};

/// Name a node's output tensor `NODE::PORT` after `Graph::named` renamed the node.
fn out(g: &mut Graph, id: TensorId, name: &str) -> TensorId {
    g.set_output(id);
    g.desc_mut(id).name = name.into();
    id
}
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::Instant;

const F: DataType = DataType::F32;

/// One hostile input and the words its error must contain.
struct Case {
    name: String,
    input: Input,
    want: Vec<String>,
}

enum Input {
    Json(String),
    Graph(Graph),
}

struct Corpus(Vec<Case>);

impl Corpus {
    fn json(&mut self, name: &str, text: impl Into<String>, want: &[&str]) {
        self.0.push(Case { name: name.into(), input: Input::Json(text.into()), want: want.iter().map(|s| s.to_string()).collect() });
    }
    fn value(&mut self, name: &str, v: Value, want: &[&str]) {
        self.json(name, serde_json::to_string(&v).unwrap(), want);
    }
    fn graph(&mut self, name: &str, g: Graph, want: &[&str]) {
        self.0.push(Case { name: name.into(), input: Input::Graph(g), want: want.iter().map(|s| s.to_string()).collect() });
    }
}

/// Everything a user's graph goes through; the first error ends it.
fn run(input: &Input) -> Result<(), Error> {
    let parsed;
    let g = match input {
        Input::Json(text) => {
            parsed = Graph::from_json(text)?;
            &parsed
        }
        Input::Graph(g) => g,
    };
    run_cpu_random(g, 7)?;
    Ok(())
}

fn t(name: &str, dims: &[i64]) -> TensorDesc {
    TensorDesc::new(name, dims, F)
}

/// x -> op -> y (output), with the node named `op`.
fn unary(x: TensorDesc, mode: PointwiseMode) -> Graph {
    let mut g = Graph::new("g").io_data_type(F);
    let x = g.tensor(x);
    let y = g.pointwise(mode, &[x]);
    g.named("op");
    out(&mut g, y, "op::y");
    g
}

fn relu_mode(lo: Option<f64>, hi: Option<f64>, slope: Option<f64>) -> PointwiseMode {
    PointwiseMode::Relu { lower_clip: lo, upper_clip: hi, negative_slope: slope }
}

fn relu(x: TensorDesc) -> Graph {
    unary(x, relu_mode(None, None, None))
}

/// a (op) b -> y.
fn binary(a: TensorDesc, b: TensorDesc, mode: PointwiseMode) -> Graph {
    let mut g = Graph::new("g").io_data_type(F);
    let a = g.tensor(a);
    let b = g.tensor(b);
    let y = g.pointwise(mode, &[a, b]);
    g.named("op");
    out(&mut g, y, "op::y");
    g
}

fn matmul(a: &[i64], b: &[i64]) -> Graph {
    let mut g = Graph::new("g").io_data_type(F);
    let a = g.tensor(t("a", a));
    let b = g.tensor(t("b", b));
    let c = g.matmul(a, b);
    g.named("mm");
    out(&mut g, c, "mm::c");
    g
}

fn conv(x: &[i64], w: &[i64], a: ConvAttrs) -> Graph {
    let mut g = Graph::new("g").io_data_type(F);
    let x = g.tensor(t("x", x));
    let w = g.tensor(t("w", w));
    let y = g.conv_fprop(x, w, a);
    g.named("conv");
    out(&mut g, y, "conv::y");
    g
}

fn pool(x: &[i64], window: i64) -> Graph {
    let mut g = Graph::new("g").io_data_type(F);
    let x = g.tensor(t("x", x));
    let y = g.resample(x, ResampleAttrs::uniform(ResampleMode::Max, 1, window, 1, 0));
    g.named("pool");
    out(&mut g, y, "pool::y");
    g
}

fn reduce(x: TensorDesc, axes: &[usize]) -> Graph {
    let mut g = Graph::new("g").io_data_type(F);
    let x = g.tensor(x);
    let y = g.reduction(x, ReductionMode::Add, axes);
    g.named("sum");
    out(&mut g, y, "sum::y");
    g
}

fn rng(dims: &[i64]) -> Graph {
    let mut g = Graph::new("g").io_data_type(F);
    let seed = g.tensor(TensorDesc::scalar("seed", 1.0, DataType::I64));
    let offset = g.tensor(TensorDesc::scalar("offset", 0.0, DataType::I64));
    let y = g.rng(seed, offset, dims, Distribution::Uniform { low: 0.0, high: 1.0 });
    g.named("noise");
    out(&mut g, y, "noise::y");
    g
}

fn sdpa(q: &[i64], kv: &[i64]) -> Graph {
    let mut g = Graph::new("g").io_data_type(F);
    let q = g.tensor(t("q", q));
    let k = g.tensor(t("k", kv));
    let v = g.tensor(t("v", kv));
    let (o, _) = g.sdpa(q, k, v, SdpaInputs::default(), SdpaAttrs::default());
    g.named("attn");
    out(&mut g, o, "attn::o");
    g
}

fn layernorm(x: &[i64]) -> Graph {
    let mut g = Graph::new("g").io_data_type(F);
    let mut sdims = vec![1; x.len()];
    sdims[x.len() - 1] = x[x.len() - 1];
    let xt = g.tensor(t("x", x));
    let s = g.tensor(t("scale", &sdims));
    let b = g.tensor(t("bias", &sdims));
    let (y, _, _) = g.layernorm(xt, s, b, NormAttrs::inference());
    g.named("ln");
    out(&mut g, y, "ln::y");
    g
}

/// The JSON of a validated graph, as a value to mutate.
fn json_of(mut g: Graph) -> Value {
    g.validate().unwrap();
    serde_json::from_str(&g.to_json().unwrap()).unwrap()
}

/// A relu graph as JSON: tensors x (0) and y (1), one node "op".
fn relu_json() -> Value {
    json_of(relu(t("x", &[2, 3])))
}

/// An add graph as JSON: tensors a (0), b (1), y (2), one node "op".
fn add_json() -> Value {
    json_of(binary(t("a", &[2, 3]), t("b", &[2, 3]), PointwiseMode::Add))
}

fn conv_json() -> Value {
    json_of(conv(&[1, 2, 5, 5], &[3, 2, 3, 3], ConvAttrs::new(2).with_padding(&[1, 1])))
}

fn with(mut v: Value, path: &[&str], new: Value) -> Value {
    let mut cur = &mut v;
    for (i, p) in path.iter().enumerate() {
        let next = match p.parse::<usize>() {
            Ok(idx) => {
                let arr = cur.as_array_mut().unwrap();
                if idx == arr.len() {
                    arr.push(Value::Null);
                }
                &mut arr[idx]
            }
            Err(_) => &mut cur[*p],
        };
        if i + 1 == path.len() {
            *next = new;
            return v;
        }
        cur = next;
    }
    v
}

fn without(mut v: Value, path: &[&str], key: &str) -> Value {
    let mut cur = &mut v;
    for p in path {
        cur = match p.parse::<usize>() {
            Ok(idx) => &mut cur[idx],
            Err(_) => &mut cur[*p],
        };
    }
    cur.as_object_mut().unwrap().remove(key);
    v
}

fn corpus() -> Corpus {
    let mut c = Corpus(Vec::new());
    resources(&mut c);
    nonsense(&mut c);
    malformed_json(&mut c);
    bad_attributes(&mut c);
    extreme_values(&mut c);
    ports(&mut c);
    fuzz_findings(&mut c);
    c
}

/// Sizes no machine holds (past the 4 GiB limit by far, most past 8 TiB) and work that would
/// run for hours: refused at plan build or before the buffers are allocated.
fn resources(c: &mut Corpus) {
    const T40: i64 = 1 << 40;
    const M20: i64 = 1 << 20;
    c.graph("tensor of 2^40", relu(t("x", &[T40])), &["relu \"op\"", "tensor \"x\"", "host memory", "FERRODNN_MAX_HOST_BYTES"]);
    c.graph("tensor of 2^40 in 2 dims", relu(t("x", &[M20, M20])), &["relu \"op\"", "tensor \"x\"", "bytes"]);
    c.graph("broadcast 2^20 x 2^20", binary(t("a", &[M20, 1]), t("b", &[1, M20]), PointwiseMode::Add), &["add \"op\"", "op::y", "host memory"]);
    c.graph("broadcast 2^20 x 2^20 mul", binary(t("a", &[1, M20]), t("b", &[M20, 1]), PointwiseMode::Mul), &["mul \"op\"", "host memory"]);
    {
        // Two 4 MB inputs added into a virtual [2^20, 2^20] reduced to [1, 1].
        let mut g = Graph::new("g").io_data_type(F);
        let a = g.tensor(t("a", &[M20, 1]));
        let b = g.tensor(t("b", &[1, M20]));
        let s = g.add(a, b);
        g.named("add");
        g.desc_mut(s).name = "add::y".into();
        let y = g.reduction(s, ReductionMode::Add, &[0, 1]);
        g.named("sum");
        out(&mut g, y, "sum::y");
        c.graph("virtual broadcast reduced to [1, 1]", g, &["tensor \"add::y\"", "host memory"]);
    }
    c.graph("conv with padding 2^20", conv(&[1, 1, 4, 4], &[1, 1, 1, 1], ConvAttrs::new(2).with_padding(&[M20, M20])), &["conv_fprop \"conv\"", "conv::y", "host memory"]);
    c.graph("conv with padding 2^40 in 1d", conv(&[1, 1, 4], &[1, 1, 1], ConvAttrs::new(1).with_padding(&[1 << 40])), &["conv_fprop \"conv\"", "host memory"]);
    c.graph("conv with a 2^21 filter", conv(&[1, 1, 1 << 22], &[1, 1, 1 << 21], ConvAttrs::new(1)), &["conv_fprop \"conv\"", "element operations", "FERRODNN_CPU_MAX_WORK"]);
    {
        let mut g = Graph::new("g").io_data_type(F);
        let dy = g.tensor(t("dy", &[1, 1, (1 << 21) + 1]));
        let w = g.tensor(t("w", &[1, 1, 1 << 21]));
        let dx = g.conv_dgrad(dy, w, &[1, 1, 1 << 22], ConvAttrs::new(1));
        g.named("dgrad");
        out(&mut g, dx, "dgrad::dx");
        c.graph("conv_dgrad with a 2^21 filter", g, &["conv_dgrad \"dgrad\"", "element operations"]);
    }
    {
        let mut g = Graph::new("g").io_data_type(F);
        let dy = g.tensor(t("dy", &[1, 1, (1 << 21) + 1]));
        let x = g.tensor(t("x", &[1, 1, 1 << 22]));
        let dw = g.conv_wgrad(dy, x, &[1, 1, 1 << 21], ConvAttrs::new(1));
        g.named("wgrad");
        out(&mut g, dw, "wgrad::dw");
        c.graph("conv_wgrad with a 2^21 filter", g, &["conv_wgrad \"wgrad\"", "element operations"]);
    }
    c.graph("strides of 2^40 on a small input", relu(t("x", &[2, 2]).with_strides(&[T40, 1])), &["tensor \"x\"", "strides", "host memory"]);
    {
        let mut g = relu(t("x", &[2, 2]));
        let y = g.find("op::y").unwrap();
        g.desc_mut(y).strides = vec![T40, 1];
        c.graph("strides of 2^40 on a small output", g, &["tensor \"op::y\"", "host memory"]);
    }
    c.graph("rng output of 2^40", rng(&[T40]), &["rng \"noise\"", "noise::y", "host memory"]);
    c.graph("rng output of 2^20 x 2^20", rng(&[M20, M20]), &["rng \"noise\"", "host memory"]);
    c.graph("stride-0 input of 2^40 reduced to one value", reduce(t("x", &[T40]).with_strides(&[0]), &[0]), &["reduction \"sum\"", "tensor \"x\"", "host memory"]);
    c.graph("stride-0 input of 2^20 x 2^20 reduced", reduce(t("x", &[M20, M20]).with_strides(&[0, 0]), &[0, 1]), &["reduction \"sum\"", "tensor \"x\""]);
    c.graph("matmul to 2^40 outputs", matmul(&[M20, 1024], &[1024, M20]), &["matmul \"mm\"", "mm::c", "host memory"]);
    c.graph("matmul of 2^14 cubes", matmul(&[1 << 14, 1 << 14], &[1 << 14, 1 << 14]), &["matmul \"mm\""]);
    c.graph("matmul batch broadcast to 2^40", matmul(&[M20, 1, 1, 8], &[1, M20, 8, 1]), &["matmul \"mm\"", "host memory"]);
    c.graph("max pooling 2^22 by a 2^21 window", pool(&[1, 1, 1 << 22], 1 << 21), &["resample \"pool\"", "element operations", "FERRODNN_CPU_MAX_WORK"]);
    {
        let mut g = Graph::new("g").io_data_type(F);
        let x = g.tensor(t("x", &[1, 1, 1 << 22]));
        let dy = g.tensor(t("dy", &[1, 1, (1 << 21) + 1]));
        let dx = g.resample_backward(dy, x, ResampleAttrs::uniform(ResampleMode::AvgExcludePadding, 1, 1 << 21, 1, 0));
        g.named("pool_bwd");
        out(&mut g, dx, "pool_bwd::dx");
        c.graph("pooling backward by a 2^21 window", g, &["resample_backward \"pool_bwd\"", "element operations"]);
    }
    c.graph("attention over 2^18 keys", sdpa(&[1, 1, 1 << 18, 64], &[1, 1, 1 << 18, 64]), &["sdpa \"attn\"", "element operations"]);
    c.graph("attention with 2^40-element k", sdpa(&[1, 1, 1, 64], &[1, 1, 1 << 34, 64]), &["sdpa \"attn\"", "tensor \"k\"", "host memory"]);
    c.graph("layernorm of 2^20 x 2^20", layernorm(&[M20, M20]), &["layernorm \"ln\"", "tensor \"x\"", "host memory"]);
    {
        let mut g = Graph::new("g").io_data_type(F);
        let x = g.tensor(t("x", &[M20, M20]));
        let (y, _) = g.softmax(x, 1, false, false);
        g.named("sm");
        out(&mut g, y, "sm::y");
        c.graph("softmax of 2^40", g, &["softmax \"sm\"", "host memory"]);
    }
    c.graph("gen_index over 2^40", unary(t("x", &[T40]), PointwiseMode::GenIndex { axis: 0 }), &["gen_index \"op\"", "host memory"]);
    {
        let mut g = Graph::new("g").io_data_type(F);
        let x = g.tensor(t("x", &[M20, M20]));
        let y = g.transpose(x, &[1, 0]);
        g.named("tr");
        out(&mut g, y, "tr::y");
        c.graph("transpose of 2^40", g, &["transpose \"tr\"", "host memory"]);
    }
    {
        let mut g = Graph::new("g").io_data_type(F);
        let x = g.tensor(t("x", &[8]).with_strides(&[0]));
        let big = g.tensor(t("big", &[T40 / 8, 1]).with_strides(&[0, 0]));
        let z = g.add(x, big);
        g.named("add_big");
        out(&mut g, z, "add_big::z");
        c.graph("broadcast input of 2^37 rows", g, &["add \"add_big\"", "host memory"]);
    }
    {
        let mut g = Graph::new("g").io_data_type(F);
        let x = g.tensor(t("x", &[1 << 24, 1 << 12]));
        let y = g.relu(x);
        g.named("relu1");
        out(&mut g, y, "relu1::y");
        c.graph("relu of 2^36 (past 4 GiB)", g, &["relu \"relu1\"", "tensor \"x\"", "FERRODNN_MAX_HOST_BYTES"]);
    }
}

/// Graphs that validate structurally but cannot mean anything.
fn nonsense(c: &mut Corpus) {
    let x = || t("x", &[2, 3]);
    c.graph("relu lower_clip above upper_clip", unary(x(), relu_mode(Some(5.0), Some(-5.0), None)), &["relu \"op\"", "lower_clip", "upper_clip"]);
    c.graph("relu clips 1 above 0.5", unary(x(), relu_mode(Some(1.0), Some(0.5), Some(0.1))), &["relu \"op\"", "lower_clip"]);
    c.graph(
        "relu_backward lower_clip above upper_clip",
        binary(x(), x(), PointwiseMode::ReluBackward { lower_clip: Some(2.0), upper_clip: Some(1.0), negative_slope: None }),
        &["relu_backward \"op\"", "lower_clip"],
    );
    c.graph("relu NaN lower_clip", unary(x(), relu_mode(Some(f64::NAN), None, None)), &["relu \"op\"", "lower_clip", "NaN"]);
    c.graph("relu NaN upper_clip", unary(x(), relu_mode(None, Some(f64::NAN), None)), &["relu \"op\"", "upper_clip", "NaN"]);
    c.graph("relu NaN slope", unary(x(), relu_mode(None, None, Some(f64::NAN))), &["relu \"op\"", "negative_slope"]);
    c.graph("leaky_relu NaN slope", unary(x(), PointwiseMode::LeakyRelu { negative_slope: f64::NAN }), &["leaky_relu \"op\"", "negative_slope"]);
    c.graph("elu NaN alpha", unary(x(), PointwiseMode::Elu { alpha: f64::NAN }), &["elu \"op\"", "alpha"]);
    c.graph("swish NaN beta", unary(x(), PointwiseMode::Swish { beta: f64::NAN }), &["swish \"op\"", "beta"]);
    c.graph("softplus beta 0", unary(x(), PointwiseMode::Softplus { beta: 0.0 }), &["softplus \"op\"", "beta"]);
    c.graph("softplus_backward beta 0", binary(x(), x(), PointwiseMode::SoftplusBackward { beta: 0.0 }), &["softplus_backward \"op\"", "beta"]);
    // Compute types.
    let with_ct = |mut g: Graph, ct: DataType| {
        g.nodes[0].compute_data_type = Some(ct);
        g
    };
    c.graph("fp8 compute on relu", with_ct(relu(x()), DataType::Fp8E4m3), &["relu \"op\"", "compute_data_type fp8_e4m3"]);
    c.graph("fp8 e5m2 compute on add", with_ct(binary(x(), x(), PointwiseMode::Add), DataType::Fp8E5m2), &["add \"op\"", "compute_data_type"]);
    c.graph("bool compute on relu", with_ct(relu(x()), DataType::Bool), &["relu \"op\"", "bool"]);
    c.graph("bool compute on matmul", with_ct(matmul(&[2, 3], &[3, 4]), DataType::Bool), &["matmul \"mm\"", "bool"]);
    c.graph("bool compute on conv", with_ct(conv(&[1, 1, 3, 3], &[1, 1, 1, 1], ConvAttrs::new(2)), DataType::Bool), &["conv_fprop \"conv\"", "bool"]);
    c.graph("i32 compute on exp", with_ct(unary(x(), PointwiseMode::Exp), DataType::I32), &["exp \"op\"", "compute_data_type i32"]);
    c.graph("i32 compute on add of f32", with_ct(binary(x(), x(), PointwiseMode::Add), DataType::I32), &["add \"op\"", "input `a`", "tensor \"x\""]);
    c.graph("i32 compute on f32 matmul", with_ct(matmul(&[2, 3], &[3, 4]), DataType::I32), &["matmul \"mm\"", "tensor \"a\""]);
    c.graph("i8 compute on layernorm", with_ct(layernorm(&[2, 8]), DataType::I8), &["layernorm \"ln\"", "compute_data_type i8"]);
    c.graph("fp8 compute on layernorm", with_ct(layernorm(&[2, 8]), DataType::Fp8E4m3), &["layernorm \"ln\"", "fp8"]);
    c.graph("fp8 compute on reduction", with_ct(reduce(x(), &[1]), DataType::Fp8E4m3), &["reduction \"sum\"", "fp8"]);
    c.graph("i64 compute on attention", with_ct(sdpa(&[1, 1, 4, 8], &[1, 1, 4, 8]), DataType::I64), &["sdpa \"attn\"", "i64"]);
    c.graph("u8 compute on pooling", with_ct(pool(&[1, 1, 8], 2), DataType::U8), &["resample \"pool\"", "u8"]);
    {
        let mut g = Graph::new("g").io_data_type(DataType::I32).compute_data_type(DataType::I32);
        let a = g.tensor(TensorDesc::new("a", &[4], DataType::I32));
        let b = g.tensor(TensorDesc::new("b", &[4], DataType::I32));
        let y = g.div(a, b);
        g.named("q");
        out(&mut g, y, "q::y");
        c.graph("i32 compute (graph's) on div", g, &["div \"q\"", "the graph's"]);
    }
    {
        let mut g = Graph::new("g").io_data_type(F).compute_data_type(DataType::Fp8E4m3);
        let x = g.tensor(x());
        let (y, _) = g.softmax(x, 1, false, false);
        g.named("sm");
        out(&mut g, y, "sm::y");
        c.graph("fp8 compute (graph's) on softmax", g, &["softmax \"sm\"", "the graph's"]);
    }
    // Nothing to compute.
    {
        let mut g = Graph::new("virt").io_data_type(F);
        let x = g.tensor(x());
        g.relu(x);
        c.graph("only output virtual", g, &["graph \"virt\"", "virtual"]);
    }
    {
        let mut g = Graph::new("virt2").io_data_type(F);
        let x = g.tensor(x());
        let y = g.relu(x);
        g.exp(y);
        c.graph("chain with no output", g, &["graph \"virt2\"", "set_output"]);
    }
    // Nodes without outputs, or with outputs the op does not produce.
    {
        let mut g = relu(x());
        g.nodes[0].outputs.clear();
        c.graph("relu without output ports", g, &["relu \"op\"", "no output ports"]);
    }
    {
        let mut g = conv(&[1, 1, 3, 3], &[1, 1, 1, 1], ConvAttrs::new(2));
        g.nodes[0].outputs.clear();
        c.graph("conv without output ports", g, &["conv_fprop \"conv\"", "no output ports"]);
    }
    {
        let mut g = relu(x());
        g.nodes[0].outputs[0].name = "z".into();
        c.graph("relu output port z", g, &["relu \"op\"", "`z`", "`y`"]);
    }
    {
        let mut g = matmul(&[2, 3], &[3, 4]);
        let extra = g.tensor(t("extra", &[2, 4]));
        g.nodes[0].outputs.push(ferrodnn::graph::Port { name: "d".into(), tensor: extra });
        c.graph("matmul extra output port with dims", g, &["matmul \"mm\"", "`d`", "tensor \"extra\""]);
    }
    // uids.
    {
        let mut g = relu(x().with_uid(i64::MAX));
        let _ = &mut g;
        c.graph("uid i64::MAX then an automatic uid", g, &["tensor \"op::y\"", "automatic uid", "9223372036854775807"]);
    }
    {
        let mut g = relu(x());
        let y = g.find("op::y").unwrap();
        g.desc_mut(y).uid = Some(i64::MAX);
        c.graph("output uid i64::MAX, input automatic", g, &["tensor \"x\"", "automatic uid"]);
    }
    {
        let mut g = relu(x().with_uid(5));
        let y = g.find("op::y").unwrap();
        g.desc_mut(y).uid = Some(5);
        c.graph("duplicate uids", g, &["tensor", "\"x\"", "\"op::y\"", "uid 5"]);
    }
    // Execution with values that do not match the graph.
    c.0.push(Case { name: "placeholder".into(), input: Input::Json(String::new()), want: Vec::new() });
    c.0.pop();
}

/// Malformed JSON graph files.
fn malformed_json(c: &mut Corpus) {
    let good = serde_json::to_string_pretty(&relu_json()).unwrap();
    for (i, frac) in [0.0, 0.05, 0.1, 0.2, 0.33, 0.5, 0.66, 0.8, 0.9, 0.97, 0.995].iter().enumerate() {
        let mut cut = (good.len() as f64 * frac) as usize;
        while !good.is_char_boundary(cut) {
            cut -= 1;
        }
        c.json(&format!("truncated {i} at {cut} of {}", good.len()), &good[..cut], &["JSON"]);
    }
    c.json("empty file", "", &["JSON"]);
    c.json("whitespace", "   \n\t ", &["JSON"]);
    c.json("null", "null", &["JSON"]);
    c.json("array", "[]", &["no operations"]);
    c.json("number", "42", &["JSON"]);
    c.json("string", "\"graph\"", &["JSON"]);
    c.json("empty object", "{}", &["no operations"]);
    c.json("binary garbage", "\u{1}\u{2}\u{3}\u{7f}", &["JSON"]);
    c.json("trailing garbage", format!("{good} xyz"), &["JSON"]);
    c.json("two graphs", format!("{good}{good}"), &["JSON"]);
    c.json("deep nesting", format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)), &["JSON"]);
    c.json("deep nesting in a field", format!("{{\"name\": {}1{}}}", "[".repeat(5000), "]".repeat(5000)), &["JSON"]);
    c.json("NaN literal", good.replacen("false", "NaN", 1), &["JSON"]);
    c.json("number out of range", good.replacen("\"dims\": [\n        2", "\"dims\": [\n        1e400", 1), &["JSON"]);
    let v = relu_json;
    // Wrong types.
    c.value("dims as a string", with(v(), &["tensors", "0", "dims"], json!("2x3")), &["JSON"]);
    c.value("dim as a float", with(v(), &["tensors", "0", "dims", "0"], json!(2.5)), &["JSON"]);
    c.value("dim as a string", with(v(), &["tensors", "0", "dims", "0"], json!("2")), &["JSON"]);
    c.value("dim past i64", with(v(), &["tensors", "0", "dims", "0"], json!(1u64 << 63)), &["JSON"]);
    c.value("stride as null", with(v(), &["tensors", "0", "strides", "1"], json!(null)), &["JSON"]);
    c.value("uid as a string", with(v(), &["tensors", "0", "uid"], json!("1")), &["JSON"]);
    c.value("is_virtual as a string", with(v(), &["tensors", "0", "is_virtual"], json!("yes")), &["JSON"]);
    c.value("tensors as an object", with(v(), &["tensors"], json!({"x": 1})), &["JSON"]);
    c.value("nodes as a number", with(v(), &["nodes"], json!(3)), &["JSON"]);
    c.value("node as a string", with(v(), &["nodes", "0"], json!("relu")), &["JSON"]);
    c.value("op as a string", with(v(), &["nodes", "0", "op"], json!("relu")), &["JSON"]);
    c.value("port tensor negative", with(v(), &["nodes", "0", "inputs", "0", "tensor"], json!(-1)), &["JSON"]);
    c.value("port tensor as a float", with(v(), &["nodes", "0", "inputs", "0", "tensor"], json!(0.5)), &["JSON"]);
    c.value("port tensor huge", with(v(), &["nodes", "0", "inputs", "0", "tensor"], json!(1e30)), &["JSON"]);
    c.value("port as a number", with(v(), &["nodes", "0", "inputs", "0"], json!(0)), &["JSON"]);
    c.value("name as a number", with(v(), &["name"], json!(7)), &["JSON"]);
    c.value("data type as a number", with(v(), &["tensors", "0", "data_type"], json!(0)), &["JSON"]);
    c.value("unknown data type", with(v(), &["io_data_type"], json!("f128")), &["JSON", "f128"]);
    c.value("unknown compute type", with(v(), &["nodes", "0", "compute_data_type"], json!("tf32")), &["JSON", "tf32"]);
    c.value("clip as a string", with(v(), &["nodes", "0", "op", "mode", "lower_clip"], json!("0")), &["JSON"]);
    // Unknown fields.
    c.value("unknown top-level field", with(v(), &["frobnicate"], json!(1)), &["JSON", "frobnicate"]);
    c.value("unknown tensor field", with(v(), &["tensors", "0", "layout"], json!("nhwc")), &["JSON", "layout"]);
    c.value("unknown node field", with(v(), &["nodes", "0", "engine"], json!("cpu")), &["JSON", "engine"]);
    c.value("unknown op attribute", with(v(), &["nodes", "0", "op", "alpha"], json!(1)), &["JSON"]);
    c.value("unknown mode parameter", with(v(), &["nodes", "0", "op", "mode", "alpha"], json!(1)), &["JSON", "alpha"]);
    c.value("unknown port field", with(v(), &["nodes", "0", "inputs", "0", "uid"], json!(1)), &["JSON", "uid"]);
    // Unknown ops and modes.
    c.value("unknown op", with(v(), &["nodes", "0", "op", "kind"], json!("frobnicate")), &["JSON", "frobnicate"]);
    c.value("op kind missing", without(v(), &["nodes", "0", "op"], "kind"), &["JSON"]);
    c.value("unknown pointwise mode", with(v(), &["nodes", "0", "op", "mode", "name"], json!("frob")), &["JSON", "frob"]);
    c.value("mode missing", without(v(), &["nodes", "0", "op"], "mode"), &["JSON", "mode"]);
    c.value("leaky_relu slope missing", with(v(), &["nodes", "0", "op", "mode"], json!({"name": "leaky_relu"})), &["JSON", "negative_slope"]);
    // Missing or wrong ports.
    c.value("relu without inputs", with(v(), &["nodes", "0", "inputs"], json!([])), &["relu \"op\"", "`a`"]);
    c.value("relu input on port b", with(v(), &["nodes", "0", "inputs", "0", "name"], json!("b")), &["relu \"op\"", "`b`"]);
    c.value("relu input twice", with(v(), &["nodes", "0", "inputs"], json!([{"name": "a", "tensor": 0}, {"name": "a", "tensor": 0}])), &["relu \"op\"", "twice"]);
    c.value("relu without outputs", with(v(), &["nodes", "0", "outputs"], json!([])), &["relu \"op\"", "no output ports"]);
    c.value("relu output on port out", with(v(), &["nodes", "0", "outputs", "0", "name"], json!("out")), &["relu \"op\"", "`out`"]);
    c.value("port to tensor 99", with(v(), &["nodes", "0", "inputs", "0", "tensor"], json!(99)), &["relu \"op\"", "tensor #99"]);
    c.value("output to tensor 99", with(v(), &["nodes", "0", "outputs", "0", "tensor"], json!(99)), &["relu \"op\"", "#99"]);
    c.value("inputs missing", without(v(), &["nodes", "0"], "inputs"), &["JSON", "inputs"]);
    c.value("add with one input", with(add_json(), &["nodes", "0", "inputs"], json!([{"name": "a", "tensor": 0}])), &["add \"op\"", "`b` is missing"]);
    c.value("add with three inputs", with(add_json(), &["nodes", "0", "inputs", "2"], json!({"name": "c", "tensor": 0})), &["add \"op\"", "`c`"]);
    c.value("conv without w", with(conv_json(), &["nodes", "0", "inputs"], json!([{"name": "x", "tensor": 0}])), &["conv_fprop \"conv\"", "`w`"]);
    c.value("conv fed its own output", with(conv_json(), &["nodes", "0", "inputs", "1", "tensor"], json!(2)), &["conv_fprop \"conv\"", "cycle"]);
    // Cycles.
    {
        let mut v2 = json_of({
            let mut g = Graph::new("g").io_data_type(F);
            let x = g.tensor(t("x", &[2, 3]));
            let a = g.relu(x);
            g.named("first");
            let b = g.exp(a);
            g.named("second");
            out(&mut g, b, "second::b");
            g
        });
        // first reads second's output: first -> second -> first.
        v2 = with(v2, &["nodes", "0", "inputs", "0", "tensor"], json!(2));
        c.value("two-node cycle", v2, &["cycle"]);
    }
    c.value("self loop", with(v(), &["nodes", "0", "inputs", "0", "tensor"], json!(1)), &["relu \"op\"", "cycle"]);
    {
        // Two nodes writing one tensor.
        let mut v2 = v();
        let node = v2["nodes"][0].clone();
        v2["nodes"].as_array_mut().unwrap().push(node);
        c.value("two producers of one tensor", v2, &["relu \"op\"", "already produced"]);
    }
    // Dims and strides.
    c.value("dim 0", with(v(), &["tensors", "0", "dims", "0"], json!(0)), &["tensor \"x\"", "dim 0 must be positive"]);
    c.value("dim negative", with(v(), &["tensors", "0", "dims", "1"], json!(-3)), &["tensor \"x\"", "-3"]);
    c.value("dim i64::MAX in JSON", with(v(), &["tensors", "0", "dims", "0"], json!(i64::MAX)), &["tensor \"x\"", "overflows"]);
    c.value("dims of 2^31 each", with(v(), &["tensors", "0", "dims"], json!([1i64 << 31, 1i64 << 31])), &["tensor \"x\""]);
    c.value("dims of 2^49", with(with(v(), &["tensors", "0", "dims"], json!([1i64 << 49])), &["tensors", "0", "strides"], json!([1])), &["tensor \"x\"", "elements"]);
    c.value("dims empty", with(with(v(), &["tensors", "0", "dims"], json!([])), &["tensors", "0", "strides"], json!([])), &["relu \"op\"", "tensor \"x\"", "no dims"]);
    c.value("rank 9", with(with(v(), &["tensors", "0", "dims"], json!(vec![1; 9])), &["tensors", "0", "strides"], json!(vec![1; 9])), &["rank"]);
    c.value("rank 100", with(with(v(), &["tensors", "0", "dims"], json!(vec![1; 100])), &["tensors", "0", "strides"], json!(vec![1; 100])), &["rank"]);
    c.value("strides count mismatch", with(v(), &["tensors", "0", "strides"], json!([1])), &["tensor \"x\"", "1 strides given for 2 dims"]);
    c.value("stride negative", with(v(), &["tensors", "0", "strides"], json!([3, -1])), &["tensor \"x\"", "stride 1"]);
    c.value("output strides overlap", with(v(), &["tensors", "1", "strides"], json!([1, 1])), &["relu \"op\"", "tensor \"op::y\"", "overlap"]);
    c.value("stride extent overflows", with(v(), &["tensors", "0", "strides"], json!([i64::MAX, 1])), &["tensor \"x\"", "overflows"]);
    c.value("output stride 0", with(v(), &["tensors", "1", "strides"], json!([0, 1])), &["relu \"op\"", "zero stride"]);
    c.value("output dims contradict", with(v(), &["tensors", "1", "dims"], json!([3, 2])), &["relu \"op\"", "[3, 2]"]);
    c.value("output strides count", with(v(), &["tensors", "1", "strides"], json!([1])), &["relu \"op\"", "strides"]);
    // Uids and names.
    c.value("duplicate uids in JSON", with(v(), &["tensors", "1", "uid"], json!(1)), &["\"x\"", "\"op::y\"", "uid 1"]);
    c.value("uid i64::MAX and a missing uid", without(with(v(), &["tensors", "0", "uid"], json!(i64::MAX)), &["tensors", "1"], "uid"), &["tensor \"op::y\"", "automatic uid"]);
    c.value("name too long", with(v(), &["tensors", "0", "name"], json!("x".repeat(5000))), &["name", "4096"]);
    c.value("graph name too long", with(v(), &["name"], json!("g".repeat(5000))), &["graph name"]);
    {
        let mut v2 = v();
        let many: Vec<Value> = (0..70_000).map(|i| json!({"name": format!("t{i}"), "dims": [1], "strides": [1]})).collect();
        v2["tensors"] = Value::Array(many);
        c.value("70000 tensors", v2, &["70000 tensors"]);
    }
    {
        let mut v2 = v();
        let ports: Vec<Value> = (0..100).map(|i| json!({"name": format!("a{i}"), "tensor": 0})).collect();
        v2["nodes"][0]["inputs"] = Value::Array(ports);
        c.value("100 input ports", v2, &["100 inputs"]);
    }
    // By-value scalars.
    c.value("by-value with 6 elements", with(with(v(), &["tensors", "0", "is_pass_by_value"], json!(true)), &["tensors", "0", "value"], json!(1.0)), &["tensor \"x\"", "by-value"]);
    c.value("op writes a by-value tensor", with(v(), &["tensors", "1", "is_pass_by_value"], json!(true)), &["relu \"op\"", "by-value"]);
    c.value("virtual input", with(v(), &["tensors", "0", "is_virtual"], json!(true)), &["relu \"op\"", "tensor \"x\"", "virtual"]);
    c.value("input without a type", without(without(v(), &["tensors", "0"], "data_type"), &[], "io_data_type"), &["relu \"op\"", "tensor \"x\"", "data type"]);
    c.value("output virtual in JSON", with(v(), &["tensors", "1", "is_virtual"], json!(true)), &["virtual"]);
    // Nonsense in JSON form.
    c.value(
        "relu clips 5 and -5",
        with(with(v(), &["nodes", "0", "op", "mode", "lower_clip"], json!(5.0)), &["nodes", "0", "op", "mode", "upper_clip"], json!(-5.0)),
        &["relu \"op\"", "lower_clip"],
    );
    c.value("fp8 compute on relu in JSON", with(v(), &["nodes", "0", "compute_data_type"], json!("fp8_e4m3")), &["relu \"op\"", "fp8_e4m3"]);
    c.value("bool compute on the graph", with(v(), &["compute_data_type"], json!("bool")), &["relu \"op\"", "bool"]);
    {
        let mut v2 = v();
        for i in ["0", "1"] {
            v2 = with(with(v2, &["tensors", i, "dims"], json!([1i64 << 40])), &["tensors", i, "strides"], json!([1]));
        }
        c.value("huge tensors in JSON", v2, &["relu \"op\"", "tensor \"x\"", "host memory"]);
    }
    c.value(
        "huge input, small output in JSON",
        with(with(v(), &["tensors", "0", "dims"], json!([1i64 << 40])), &["tensors", "0", "strides"], json!([1])),
        &["relu \"op\"", "op::y"],
    );
}

/// Op attributes out of range, one or more per family.
fn bad_attributes(c: &mut Corpus) {
    let cv = |x: &[i64], w: &[i64], a: ConvAttrs| conv(x, w, a);
    c.graph("conv stride 0", cv(&[1, 1, 5, 5], &[1, 1, 3, 3], ConvAttrs::new(2).with_stride(&[0, 1])), &["conv_fprop \"conv\"", "stride"]);
    c.graph("conv dilation -1", cv(&[1, 1, 5, 5], &[1, 1, 3, 3], ConvAttrs::new(2).with_dilation(&[1, -1])), &["conv_fprop \"conv\"", "dilation"]);
    c.graph("conv negative padding", cv(&[1, 1, 5, 5], &[1, 1, 3, 3], ConvAttrs::new(2).with_padding(&[-1, 0])), &["conv_fprop \"conv\"", "padding"]);
    c.graph("conv filter past the image", cv(&[1, 1, 2, 2], &[1, 1, 5, 5], ConvAttrs::new(2)), &["conv_fprop \"conv\""]);
    c.graph("conv channels mismatch", cv(&[1, 3, 5, 5], &[1, 2, 3, 3], ConvAttrs::new(2)), &["conv_fprop \"conv\"", "channels"]);
    c.graph("conv attribute rank", cv(&[1, 1, 5, 5], &[1, 1, 3, 3], ConvAttrs::new(3)), &["conv_fprop \"conv\""]);
    c.graph("conv rank 2 image", cv(&[1, 5], &[1, 5], ConvAttrs::new(0)), &["conv_fprop \"conv\""]);
    c.graph("matmul inner dims", matmul(&[2, 3], &[4, 5]), &["matmul \"mm\"", "[2, 3]", "[4, 5]"]);
    c.graph("matmul rank 1", matmul(&[3], &[3]), &["matmul \"mm\""]);
    c.graph("matmul batches", matmul(&[2, 2, 3], &[3, 3, 4]), &["matmul \"mm\""]);
    c.graph("add shapes", binary(t("a", &[2, 3]), t("b", &[3, 2]), PointwiseMode::Add), &["add \"op\"", "broadcast"]);
    c.graph("gen_index axis 5", unary(t("x", &[2, 3]), PointwiseMode::GenIndex { axis: 5 }), &["gen_index \"op\"", "axis"]);
    c.graph("reduction axis 9", reduce(t("x", &[2, 3]), &[9]), &["reduction \"sum\"", "9"]);
    c.graph("pool window 0", pool(&[1, 1, 8], 0), &["resample \"pool\"", "window"]);
    c.graph("pool window past input", pool(&[1, 1, 4], 9), &["resample \"pool\""]);
    c.graph("pool rank 2", pool(&[1, 8], 2), &["resample \"pool\""]);
    c.graph("sdpa rank 3", sdpa(&[1, 4, 8], &[1, 4, 8]), &["sdpa \"attn\""]);
    c.graph("sdpa head dims", sdpa(&[1, 1, 4, 8], &[1, 1, 4, 16]), &["sdpa \"attn\""]);
    c.graph("sdpa heads", sdpa(&[1, 3, 4, 8], &[1, 2, 4, 8]), &["sdpa \"attn\""]);
    {
        let mut g = layernorm(&[2, 8]);
        if let ferrodnn::graph::ops::Op::Layernorm(a) = &mut g.nodes[0].op {
            a.epsilon = 0.0;
        }
        c.graph("layernorm epsilon 0", g, &["layernorm \"ln\"", "epsilon"]);
    }
    {
        let mut g = layernorm(&[2, 8]);
        if let ferrodnn::graph::ops::Op::Layernorm(a) = &mut g.nodes[0].op {
            a.epsilon = f64::NAN;
        }
        c.graph("layernorm epsilon NaN", g, &["layernorm \"ln\"", "epsilon"]);
    }
    {
        let mut g = Graph::new("g").io_data_type(F);
        let x = g.tensor(t("x", &[2, 8]));
        let s = g.tensor(t("scale", &[1, 4]));
        let b = g.tensor(t("bias", &[1, 8]));
        let (y, _, _) = g.layernorm(x, s, b, NormAttrs::inference());
        g.named("ln");
        out(&mut g, y, "ln::y");
        c.graph("layernorm scale dims", g, &["layernorm \"ln\"", "scale"]);
    }
    {
        let mut g = Graph::new("g").io_data_type(F);
        let x = g.tensor(t("x", &[2, 3]));
        let (y, _) = g.softmax(x, 4, false, false);
        g.named("sm");
        out(&mut g, y, "sm::y");
        c.graph("softmax axis 4", g, &["softmax \"sm\"", "axis"]);
    }
    {
        let mut g = Graph::new("g").io_data_type(F);
        let x = g.tensor(t("x", &[2, 3]));
        let y = g.transpose(x, &[0, 0]);
        g.named("tr");
        out(&mut g, y, "tr::y");
        c.graph("transpose repeated axis", g, &["transpose \"tr\""]);
    }
    {
        let mut g = Graph::new("g").io_data_type(F);
        let x = g.tensor(t("x", &[2, 3]));
        let y = g.reshape(x, &[4, 2]);
        g.named("rs");
        out(&mut g, y, "rs::y");
        c.graph("reshape count", g, &["reshape \"rs\""]);
    }
    {
        let mut g = Graph::new("g").io_data_type(F);
        let x = g.tensor(t("x", &[2, 3]));
        let y = g.slice(x, &[0, 2], &[2, 1]);
        g.named("sl");
        out(&mut g, y, "sl::y");
        c.graph("slice empty range", g, &["slice \"sl\""]);
    }
    {
        let mut g = Graph::new("g").io_data_type(F);
        let a = g.tensor(t("a", &[2, 3]));
        let b = g.tensor(t("b", &[3, 3]));
        let y = g.concatenate(&[a, b], 1);
        g.named("cat");
        out(&mut g, y, "cat::y");
        c.graph("concatenate dims", g, &["concatenate \"cat\""]);
    }
    {
        let mut g = Graph::new("g").io_data_type(F);
        let seed = g.tensor(TensorDesc::scalar("seed", 1.0, DataType::I64));
        let offset = g.tensor(TensorDesc::scalar("offset", 0.0, DataType::I64));
        let y = g.rng(seed, offset, &[4], Distribution::Bernoulli { probability: 2.0 });
        g.named("noise");
        out(&mut g, y, "noise::y");
        c.graph("rng probability 2", g, &["rng \"noise\"", "probability"]);
    }
    {
        let mut g = Graph::new("g").io_data_type(F);
        let seed = g.tensor(TensorDesc::scalar("seed", 1.0, DataType::I64));
        let offset = g.tensor(TensorDesc::scalar("offset", 0.0, DataType::I64));
        let y = g.rng(seed, offset, &[4], Distribution::Uniform { low: 1.0, high: 0.0 });
        g.named("noise");
        out(&mut g, y, "noise::y");
        c.graph("rng low above high", g, &["rng \"noise\""]);
    }
}

#[test]
fn every_hostile_input_is_an_error_naming_what_is_wrong() {
    // Fixed limits for this process (see the module docs).
    std::env::set_var("FERRODNN_MAX_HOST_BYTES", "4G");
    std::env::remove_var("FERRODNN_CPU_MAX_WORK");
    let cases = corpus().0;
    assert!(cases.len() >= 150, "the corpus has {} cases", cases.len());
    let start = Instant::now();
    let mut failures = Vec::new();
    for case in &cases {
        let t0 = Instant::now();
        match catch_unwind(AssertUnwindSafe(|| run(&case.input))) {
            Err(_) => failures.push(format!("{}: panicked", case.name)),
            Ok(Ok(())) => failures.push(format!("{}: no error", case.name)),
            Ok(Err(e)) => {
                let msg = e.to_string();
                if std::env::var_os("HOSTILE_VERBOSE").is_some() {
                    eprintln!("{}: {msg}", case.name);
                }
                for w in &case.want {
                    if !msg.contains(w.as_str()) {
                        failures.push(format!("{}: message lacks `{w}`: {msg}", case.name));
                    }
                }
            }
        }
        let dt = t0.elapsed().as_secs_f64();
        if dt > 2.0 {
            eprintln!("{}: {dt:.1} s", case.name);
        }
    }
    eprintln!("{} hostile inputs in {:.1} s", cases.len(), start.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

/// The corpus as graph files, for the CLI's test (`ferrodnn-cli/tests/cli.rs`) and the Python
/// package's (`python/tests/test_hostile.py`): `NAME.json` for each case that a graph file can
/// hold, and `expected.json`, mapping each NAME to the case's name and the words its error must
/// contain. Written from the corpus (`FERRODNN_WRITE_HOSTILE=DIR`), checked against it here.
const FILES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/hostile");

/// The cases a graph file cannot hold, and why: JSON has no NaN or infinity (serde_json writes
/// `null`, which reads back as an absent attribute: another graph, a valid one).
const RUST_ONLY: &[&str] =
    &["relu NaN lower_clip", "relu NaN upper_clip", "relu NaN slope", "leaky_relu NaN slope", "elu NaN alpha", "swish NaN beta", "layernorm epsilon NaN", "sdpa scale inf"];

/// A case's file name (without `.json`): its name in lower case, each run of other characters
/// one `_`.
fn file_stem(name: &str) -> String {
    let mut stem = String::new();
    for ch in name.chars() {
        if ch.is_ascii_alphanumeric() {
            stem.push(ch.to_ascii_lowercase());
        } else if !stem.is_empty() && !stem.ends_with('_') {
            stem.push('_');
        }
    }
    stem.trim_end_matches('_').to_string()
}

/// The graph file of a case, or None where JSON cannot say what the case's graph says (it reads
/// back as another graph).
fn file_text(input: &Input) -> Option<String> {
    match input {
        Input::Json(text) => Some(text.clone()),
        Input::Graph(g) => {
            let text = g.to_json().ok()?;
            let back: Graph = serde_json::from_str(&text).ok()?;
            (format!("{back:?}") == format!("{g:?}")).then_some(text)
        }
    }
}

#[test]
fn the_committed_graph_files_are_the_corpus() {
    let mut files = Vec::new();
    let mut expected = serde_json::Map::new();
    let mut rust_only = Vec::new();
    for case in corpus().0 {
        let Some(text) = file_text(&case.input) else {
            rust_only.push(case.name);
            continue;
        };
        let stem = file_stem(&case.name);
        let entry = json!({"name": case.name, "want": case.want});
        assert!(expected.insert(stem.clone(), entry).is_none(), "two cases have the file name {stem}.json");
        files.push((format!("{stem}.json"), text));
    }
    assert_eq!(rust_only, RUST_ONLY, "the cases a graph file cannot hold");
    files.push(("expected.json".into(), serde_json::to_string_pretty(&expected).unwrap() + "\n"));
    let names: BTreeSet<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    let listed = |dir: &Path| -> BTreeSet<String> {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        entries.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|n| n.ends_with(".json")).collect()
    };
    if let Some(dir) = std::env::var_os("FERRODNN_WRITE_HOSTILE") {
        let dir = Path::new(&dir);
        std::fs::create_dir_all(dir).unwrap();
        for stale in listed(dir).iter().filter(|n| !names.contains(n.as_str())) {
            std::fs::remove_file(dir.join(stale)).unwrap();
        }
        for (name, text) in &files {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }
    let rewrite = "rewrite them: FERRODNN_WRITE_HOSTILE=ferrodnn/tests/hostile cargo test --release -p ferrodnn --test hostile";
    let dir = Path::new(FILES);
    let on_disk = listed(dir);
    let stale: Vec<&String> = on_disk.iter().filter(|n| !names.contains(n.as_str())).collect();
    assert!(stale.is_empty(), "{}: files of no case {stale:?}; {rewrite}", dir.display());
    for (name, text) in &files {
        let committed = std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}; {rewrite}"));
        assert!(committed == *text, "{}/{name} differs from its case; {rewrite}", dir.display());
    }
    eprintln!("{} graph files, {} cases only in Rust", files.len() - 1, rust_only.len());
}

/// Attributes and dims at the ends of their types (i64::MAX, usize::MAX, i64::MIN): every
/// size computed from them must be checked arithmetic (this file also runs in debug builds,
/// where an overflow panics).
fn extreme_values(c: &mut Corpus) {
    const MAX: i64 = i64::MAX;
    let conv_with = |a: ConvAttrs| conv(&[1, 1, 5, 5], &[1, 1, 3, 3], a);
    c.graph("conv padding i64::MAX", conv_with(ConvAttrs::new(2).with_padding(&[MAX, MAX])), &["conv_fprop \"conv\""]);
    c.graph("conv pre i64::MAX post 1", conv_with(ConvAttrs::new(2).with_pre_padding(&[MAX, 0]).with_post_padding(&[1, 0])), &["conv_fprop \"conv\""]);
    c.graph("conv dilation i64::MAX", conv_with(ConvAttrs::new(2).with_dilation(&[MAX, 1])), &["conv_fprop \"conv\""]);
    c.graph("conv stride i64::MAX", conv_with(ConvAttrs::new(2).with_stride(&[MAX, MAX]).with_padding(&[MAX / 2, 0])), &["conv_fprop \"conv\""]);
    c.graph("conv padding i64::MIN", conv_with(ConvAttrs::new(2).with_padding(&[i64::MIN, 0])), &["conv_fprop \"conv\"", "padding"]);
    {
        let mut g = Graph::new("g").io_data_type(F);
        let dy = g.tensor(t("dy", &[1, 1, 3, 3]));
        let w = g.tensor(t("w", &[1, 1, 3, 3]));
        let dx = g.conv_dgrad(dy, w, &[1, 1, MAX, MAX], ConvAttrs::new(2));
        g.named("dgrad");
        out(&mut g, dx, "dgrad::dx");
        c.graph("conv_dgrad dx dims i64::MAX", g, &["dgrad"]);
    }
    let pool_with = |a: ResampleAttrs| {
        let mut g = Graph::new("g").io_data_type(F);
        let x = g.tensor(t("x", &[1, 1, 8]));
        let y = g.resample(x, a);
        g.named("pool");
        out(&mut g, y, "pool::y");
        g
    };
    c.graph("pool window i64::MAX", pool_with(ResampleAttrs::uniform(ResampleMode::Max, 1, MAX, 1, 0)), &["resample \"pool\""]);
    c.graph("pool padding i64::MAX", pool_with(ResampleAttrs::uniform(ResampleMode::Max, 1, MAX, 1, MAX - 1)), &["resample \"pool\""]);
    c.graph("pool padding i64::MIN", pool_with(ResampleAttrs::uniform(ResampleMode::AvgIncludePadding, 1, 2, 1, i64::MIN)), &["resample \"pool\""]);
    c.graph("gen_index axis usize::MAX", unary(t("x", &[2, 3]), PointwiseMode::GenIndex { axis: usize::MAX }), &["gen_index \"op\""]);
    c.graph("reduction axis usize::MAX", reduce(t("x", &[2, 3]), &[usize::MAX]), &["reduction \"sum\""]);
    c.graph("reduction repeated axis", reduce(t("x", &[2, 3]), &[1, 1, 1, 1, 1, 1, 1, 1, 1, 1]), &["reduction \"sum\""]);
    {
        let mut g = Graph::new("g").io_data_type(F);
        let x = g.tensor(t("x", &[2, 3]));
        let (y, _) = g.softmax(x, usize::MAX, false, false);
        g.named("sm");
        out(&mut g, y, "sm::y");
        c.graph("softmax axis usize::MAX", g, &["softmax \"sm\""]);
    }
    {
        let mut g = Graph::new("g").io_data_type(F);
        let x = g.tensor(t("x", &[2, 3]));
        let y = g.transpose(x, &[usize::MAX, 0]);
        g.named("tr");
        out(&mut g, y, "tr::y");
        c.graph("transpose axis usize::MAX", g, &["transpose \"tr\""]);
    }
    for (name, starts, ends, steps) in [
        ("slice ends i64::MAX", vec![0, 0], vec![MAX, MAX], vec![]),
        ("slice starts i64::MIN", vec![i64::MIN, 0], vec![2, 3], vec![]),
        ("slice step 0", vec![0, 0], vec![2, 3], vec![0, 1]),
        ("slice step i64::MIN", vec![0, 0], vec![2, 3], vec![i64::MIN, 1]),
        ("slice starts past the end", vec![5, 0], vec![6, 3], vec![]),
    ] {
        let mut g = Graph::new("g").io_data_type(F);
        let x = g.tensor(t("x", &[2, 3]));
        let y = g.slice_with_steps(x, &starts, &ends, &steps);
        g.named("sl");
        out(&mut g, y, "sl::y");
        c.graph(name, g, &["slice \"sl\""]);
    }
    for (name, dims) in [("reshape to i64::MAX", vec![MAX]), ("reshape to -6", vec![-6]), ("reshape to [-1, -6]", vec![-1, -6]), ("reshape to 2^62 x 4", vec![1 << 62, 4])] {
        let mut g = Graph::new("g").io_data_type(F);
        let x = g.tensor(t("x", &[2, 3]));
        let y = g.reshape(x, &dims);
        g.named("rs");
        out(&mut g, y, "rs::y");
        c.graph(name, g, &["rs"]);
    }
    {
        // Concatenating two tensors of 2^62 along an axis: the sum passes i64.
        let mut g = Graph::new("g").io_data_type(F);
        let a = g.tensor(t("a", &[1 << 47, 2]).with_strides(&[0, 1]));
        let b = g.tensor(t("b", &[1 << 47, 2]).with_strides(&[0, 1]));
        let y = g.concatenate(&[a, b], 0);
        g.named("cat");
        out(&mut g, y, "cat::y");
        c.graph("concatenate past 2^48", g, &["cat"]);
    }
    c.graph("rng dims i64::MAX", rng(&[MAX]), &["noise"]);
    c.graph("rng dims 2^32 x 2^32", rng(&[1 << 32, 1 << 32]), &["noise"]);
    c.graph("rng no dims", rng(&[]), &["noise"]);
    {
        // Paged attention whose page table times block size passes i64.
        let mut g = Graph::new("g").io_data_type(F);
        let q = g.tensor(t("q", &[1, 1, 4, 8]));
        let k = g.tensor(t("k_pool", &[1, 1, 1 << 40, 8]).with_strides(&[0, 0, 0, 1]));
        let v = g.tensor(t("v_pool", &[1, 1, 1 << 40, 8]).with_strides(&[0, 0, 0, 1]));
        let tk = g.tensor(TensorDesc::new("page_table_k", &[1, 1, 1 << 40, 1], DataType::I32).with_strides(&[0, 0, 0, 0]));
        let tv = g.tensor(TensorDesc::new("page_table_v", &[1, 1, 1 << 40, 1], DataType::I32).with_strides(&[0, 0, 0, 0]));
        let inputs = SdpaInputs { page_table_k: Some(tk), page_table_v: Some(tv), ..Default::default() };
        let (o, _) = g.sdpa(q, k, v, inputs, SdpaAttrs::default());
        g.named("attn");
        out(&mut g, o, "attn::o");
        c.graph("paged attention of 2^80 keys", g, &["sdpa \"attn\"", "page_table_k", "pages"]);
    }
    {
        // Paged attention with small pools whose logical K and V are 2^40 elements.
        let mut g = Graph::new("g").io_data_type(F);
        let q = g.tensor(t("q", &[1 << 10, 1, 1, 64]));
        let k = g.tensor(t("k_pool", &[1, 1, 1 << 20, 64]));
        let v = g.tensor(t("v_pool", &[1, 1, 1 << 20, 64]));
        let tk = g.tensor(TensorDesc::new("page_table_k", &[1 << 10, 1, 16, 1], DataType::I32));
        let tv = g.tensor(TensorDesc::new("page_table_v", &[1 << 10, 1, 16, 1], DataType::I32));
        let inputs = SdpaInputs { page_table_k: Some(tk), page_table_v: Some(tv), ..Default::default() };
        let (o, _) = g.sdpa(q, k, v, inputs, SdpaAttrs::default());
        g.named("attn");
        out(&mut g, o, "attn::o");
        c.graph("paged attention unpaged past memory", g, &["sdpa \"attn\"", "host memory"]);
    }
    {
        let mut g = sdpa(&[1, 1, 4, 8], &[1, 1, 4, 8]);
        if let ferrodnn::graph::ops::Op::Sdpa(a) = &mut g.nodes[0].op {
            a.sliding_window_left = Some(i64::MIN);
        }
        c.graph("sdpa window i64::MIN", g, &["sdpa \"attn\""]);
    }
    {
        let mut g = sdpa(&[1, 1, 4, 8], &[1, 1, 4, 8]);
        if let ferrodnn::graph::ops::Op::Sdpa(a) = &mut g.nodes[0].op {
            a.dropout = Some(1.0);
        }
        c.graph("sdpa dropout 1", g, &["sdpa \"attn\""]);
    }
    {
        let mut g = sdpa(&[1, 1, 4, 8], &[1, 1, 4, 8]);
        if let ferrodnn::graph::ops::Op::Sdpa(a) = &mut g.nodes[0].op {
            a.attn_scale = Some(f64::INFINITY);
        }
        c.graph("sdpa scale inf", g, &["sdpa \"attn\""]);
    }
    // Tensor dims and strides at the ends of i64.
    c.graph("dim i64::MAX", relu(t("x", &[MAX]).with_strides(&[1])), &["tensor \"x\""]);
    c.graph("dim i64::MIN", relu(t("x", &[i64::MIN]).with_strides(&[1])), &["tensor \"x\""]);
    c.graph("stride i64::MAX on dim 2", relu(t("x", &[2]).with_strides(&[MAX])), &["tensor \"x\""]);
    c.graph("stride i64::MIN", relu(t("x", &[2]).with_strides(&[i64::MIN])), &["tensor \"x\""]);
    c.graph("extent just past i64", relu(t("x", &[2, 2]).with_strides(&[MAX / 2 + 1, 1])), &["tensor \"x\""]);
    c.graph("bytes past i64", relu(t("x", &[2]).with_strides(&[MAX / 4])), &["tensor \"x\""]);
}

/// The neighbours of the nonsense above that mean something still validate (validation only:
/// this test reads no environment variable).
#[test]
fn sensible_neighbours_of_the_nonsense_still_validate() {
    let x = || t("x", &[2, 3]);
    let i32t = |n: &str| TensorDesc::new(n, &[2, 3], DataType::I32);
    let with_ct = |mut g: Graph, ct: DataType| {
        g.nodes[0].compute_data_type = Some(ct);
        g
    };
    let mut ok: Vec<(&str, Graph)> = vec![
        ("relu with equal clips", unary(x(), relu_mode(Some(1.0), Some(1.0), None))),
        ("relu with a negative upper clip only", unary(x(), relu_mode(None, Some(-1.0), Some(0.1)))),
        ("softplus beta -1", unary(x(), PointwiseMode::Softplus { beta: -1.0 })),
        ("f16 compute on relu", with_ct(relu(x()), DataType::F16)),
        ("f64 compute on layernorm", with_ct(layernorm(&[2, 8]), DataType::F64)),
        ("fp8 compute on matmul", with_ct(matmul(&[2, 3], &[3, 4]), DataType::Fp8E4m3)),
        ("fp8 compute on conv", with_ct(conv(&[1, 1, 3, 3], &[1, 1, 1, 1], ConvAttrs::new(2)), DataType::Fp8E5m2)),
        ("i32 compute on i32 add", with_ct(binary(i32t("a"), i32t("b"), PointwiseMode::Add), DataType::I32)),
        ("i32 compute on i32 comparison", with_ct(binary(i32t("a"), i32t("b"), PointwiseMode::CmpLt), DataType::I32)),
        ("i64 compute on an i32 sum", with_ct(reduce(i32t("x"), &[1]), DataType::I64)),
        ("uid i64::MAX with every uid given", {
            let mut g = relu(x().with_uid(i64::MAX));
            let y = g.find("op::y").unwrap();
            g.desc_mut(y).uid = Some(1);
            g
        }),
    ];
    {
        let mut g = Graph::new("g").io_data_type(F).compute_data_type(DataType::Bool);
        let x = g.tensor(x());
        let y = g.transpose(x, &[1, 0]);
        out(&mut g, y, "tr::y");
        ok.push(("bool compute on a transpose", g));
    }
    {
        let mut g = Graph::new("g").io_data_type(DataType::I32).compute_data_type(DataType::I32);
        let a = g.tensor(TensorDesc::new("a", &[2, 3], DataType::I32));
        let b = g.tensor(TensorDesc::new("b", &[3, 4], DataType::I32));
        let c = g.matmul(a, b);
        out(&mut g, c, "mm::c");
        ok.push(("i32 compute (graph's) on an i32 matmul", g));
    }
    {
        // An attribute port of the op's own (the neighbour of `ports`' cases).
        let mut g = sdpa(&[1, 1, 4, 8], &[1, 1, 4, 8]);
        let o = g.find("attn::o").unwrap();
        let s = g.tensor(TensorDesc::runtime_scalar("scale", F));
        g.set_attribute_tensor(o, "attn_scale", s).unwrap();
        ok.push(("sdpa with a runtime attn_scale", g));
    }
    for (name, mut g) in ok {
        g.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// `g` with one more input port `port` on node 0 (the node's builder gives it no such port).
fn with_port(mut g: Graph, port: &str, tensor: TensorId) -> Graph {
    g.nodes[0].inputs.push(Port { name: port.into(), tensor });
    g
}

/// Ports an op does not read, and ports connected twice: each would be silently misread (the
/// fuzzers' crashes of session 35 were of this kind, `fuzz_findings`).
fn ports(c: &mut Corpus) {
    let k = |g: &Graph| g.find("k").unwrap();
    {
        // The first crash minimised: an attribute port of another op, on a tensor of 4 dims.
        let g = sdpa(&[1, 1, 4, 8], &[1, 1, 4, 8]);
        let kt = k(&g);
        c.graph("sdpa with a `momentum` port on k", with_port(g, "momentum", kt), &["sdpa \"attn\"", "input port `momentum` (tensor \"k\"); its input ports are `q`, `k`, `v`"]);
    }
    {
        let mut g = sdpa(&[1, 1, 4, 8], &[1, 1, 4, 8]);
        let eps = g.tensor(TensorDesc::runtime_scalar("eps", F));
        c.graph("sdpa with a by-value `epsilon` scalar", with_port(g, "epsilon", eps), &["sdpa \"attn\"", "input port `epsilon`", "tensor \"eps\""]);
    }
    {
        let mut g = layernorm(&[2, 8]);
        let s = g.tensor(TensorDesc::runtime_scalar("scale_attr", F));
        c.graph("layernorm with an `attn_scale` scalar", with_port(g, "attn_scale", s), &["layernorm \"ln\"", "`attn_scale`"]);
    }
    {
        let mut g = conv(&[1, 2, 5, 5], &[3, 2, 3, 3], ConvAttrs::new(2));
        let b = g.tensor(t("bias", &[1, 3, 1, 1]));
        c.graph("conv with a `bias` port", with_port(g, "bias", b), &["conv_fprop \"conv\"", "input port `bias` (tensor \"bias\"); its input ports are `x`, `w`"]);
    }
    {
        let mut g = matmul(&[2, 3], &[3, 4]);
        let b2 = g.tensor(t("b2", &[3, 4]));
        c.graph("matmul with `b` connected twice", with_port(g, "b", b2), &["matmul \"mm\"", "input port `b` is connected twice", "\"b\"", "\"b2\""]);
    }
    {
        let mut g = matmul(&[2, 3], &[3, 4]);
        let y2 = g.tensor(t("y2", &[2, 4]));
        g.nodes[0].outputs.push(Port { name: "c".into(), tensor: y2 });
        g.set_output(y2);
        c.graph("matmul with output `c` connected twice", g, &["matmul \"mm\"", "output port `c` is connected twice", "\"mm::c\"", "\"y2\""]);
    }
    {
        let g = reduce(t("x", &[2, 3]), &[1]);
        let x = g.find("x").unwrap();
        c.graph("reduction with a misspelt `X` port", with_port(g, "X", x), &["reduction \"sum\"", "input port `X` (tensor \"x\"); its input ports are `x`"]);
    }
    {
        let g = pool(&[1, 1, 8], 2);
        let x = g.find("x").unwrap();
        c.graph("pooling with `x` connected twice", with_port(g, "x", x), &["resample \"pool\"", "input port `x` is connected twice"]);
    }
}

/// The crashing inputs of the coverage-guided fuzzer (`scripts/fuzz.sh`, fuzz/findings/), as
/// found: mutated check-case graphs. Before validation refused them, each reached a debug
/// assertion or a slice bound: an sdpa or sdpa_backward port renamed `momentum` made the random
/// inputs give a 4-dim tensor one value; a GRU backward's `hx` renamed `dy` had two `dy` inputs,
/// inference reading one and the engine the other.
fn fuzz_findings(c: &mut Corpus) {
    macro_rules! finding {
        ($file:literal, $want:expr) => {
            c.json(concat!("fuzz finding ", $file), include_str!(concat!("../../fuzz/findings/", $file)), $want)
        };
    }
    finding!("crash-02700cc222885c9fd51760e619105afa59eab988", &["rnn_backward_data \"rnn_backward_data_5\"", "input port `dy` is connected twice", "\"dy\"", "\"hx\""]);
    finding!("crash-248c3273c60a9d78da48fd79f3fe04c391b481bb", &["sdpa \"sdpa_0\"", "input port `momentum` (tensor \"v_offsets\")"]);
    finding!("crash-2b8d18a1bd6f927db1a48b8ab00986d58c289e10", &["sdpa_backward \"sdpa_backward_1\"", "input port `momentum` (tensor \"v_offsets\")"]);
    finding!("crash-7274387acf3d980e64859ac3d55de7ebe04df130", &["sdpa_backward \"sdpa_backward_1\"", "input port `momentum` (tensor \"sdpa_0_o_offsets\")"]);
    finding!("crash-78ccd5d781b92886baad82424efe3dce4e8199cf", &["sdpa \"sdpa_0\"", "input port `momentum` (tensor \"k_offsets\")"]);
    finding!("crash-a3680a47a5f3c5ebc89f01c36a51320d38370cc7", &["sdpa_backward \"sdpa_backward_1\"", "input port `momentum` (tensor \"k_offsets\")"]);
    finding!("crash-b19ded01aab3c4087e1dbb79007398abdd395674", &["sdpa_backward \"sdpa_backward_1\"", "input port `ragge#_v` (tensor \"v_offsets\")"]);
    finding!("crash-dc1849c46db36c02a374470d06b814d9d2bff018", &["sdpa_backward \"sdpa_backward_0\"", "input port `momentum` (tensor \"k_offsets\")"]);
    finding!("crash-f8eceab194002242388aaa3fff5ec23af1af4856", &["sdpa_backward \"sdpa_backward_0\"", "input port `momentum` (tensor \"k_offsets\")"]);
    finding!("crash-ff0cdefa5557822493a43697dfc8f86c0bc68a52", &["sdpa \"sdpa_0\"", "input port `momentum` (tensor \"k_offsets\")"]);
}
