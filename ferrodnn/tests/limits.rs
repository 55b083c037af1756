//! The resource limits and cancellation: size parsing, the CPU engine's cost estimates, the
//! cancel token, and the dense helpers' checks of what they are given. (The refusals of huge
//! graphs are in `hostile.rs`, which fixes the limits for its process; this file reads no
//! environment variable it does not leave as it is.)

use ferrodnn::engine::cpu::budget::{estimate, DEFAULT_MAX_WORK};
use ferrodnn::engine::{CancelToken, Handle, PlanPolicy};
use ferrodnn::graph::ops::resample::{ResampleAttrs, ResampleMode};
use ferrodnn::layout::{format_bytes, parse_byte_size, try_vec};
use ferrodnn::testing::{execute_plan_dense, execute_plan_dense_cancellable, random_inputs, try_random_inputs};
use ferrodnn::{DataType, Error, Graph, Nd, TensorDesc};

const F: DataType = DataType::F32;

#[test]
fn byte_sizes_parse_with_binary_suffixes() {
    assert_eq!(parse_byte_size("1234"), Some(1234));
    assert_eq!(parse_byte_size("4G"), Some(4 << 30));
    assert_eq!(parse_byte_size("4GiB"), Some(4 << 30));
    assert_eq!(parse_byte_size(" 512mb "), Some(512 << 20));
    assert_eq!(parse_byte_size("1.5k"), Some(1536));
    assert_eq!(parse_byte_size("2T"), Some(2 << 40));
    for bad in ["", "G", "-1", "12Q", "1e3", "four", "99999999999999999999P"] {
        assert_eq!(parse_byte_size(bad), None, "{bad:?}");
    }
    assert_eq!(format_bytes(512), "512 bytes");
    assert_eq!(format_bytes(3 << 30), "3.0 GiB (3221225472 bytes)");
}

#[test]
fn try_vec_refuses_sizes_past_usize_and_memory() {
    // 2^61 f64 is 2^64 bytes: past any limit, refused before anything is reserved.
    match try_vec::<f64>(1 << 61, || "the test's vector".to_string()) {
        Err(Error::NotSupported(m)) => assert!(m.contains("the test's vector") && m.contains("host memory"), "{m}"),
        other => panic!("expected NotSupported, got {:?}", other.map(|v| v.len())),
    }
    assert_eq!(try_vec::<u8>(16, || "small".into()).unwrap().capacity(), 16);
}

/// x -> pool (window `w`) -> y, one plane of `n` elements.
fn pool_graph(n: i64, w: i64) -> Graph {
    let mut g = Graph::new("pool").io_data_type(F);
    let x = g.tensor(TensorDesc::new("x", &[1, 1, n], F));
    let y = g.resample(x, ResampleAttrs::uniform(ResampleMode::Max, 1, w, 1, 0));
    g.set_output(y);
    g.validate().unwrap();
    g
}

#[test]
fn estimates_follow_the_shapes() {
    // Pooling: every element read and written, plus a window per output.
    let g = pool_graph(1 << 10, 1 << 4);
    let out = (1 << 10) - (1 << 4) + 1;
    let e = estimate(&g);
    assert_eq!(e.work, vec![(1 << 10) + out + out * (1 << 4)]);
    // Each tensor as f64, no scratch for pooling.
    assert_eq!(e.peak_bytes, 8 * ((1 << 10) + out));
    assert_eq!(e.largest_tensor, Some((0, 1 << 10)));
    // Matmul: m * n * k inner steps.
    let mut g = Graph::new("mm").io_data_type(F);
    let a = g.tensor(TensorDesc::new("a", &[3, 5, 7], F));
    let b = g.tensor(TensorDesc::new("b", &[7, 11], F));
    let c = g.matmul(a, b);
    g.set_output(c);
    g.validate().unwrap();
    assert_eq!(estimate(&g).work, vec![3 * 5 * 7 + 7 * 11 + 3 * 5 * 11 + 3 * 5 * 11 * 7]);
    // The bound refuses the pooling (2^21 outputs by a 2^21 window) and not a 4096^3 matmul.
    assert!(estimate(&pool_graph(1 << 22, 1 << 21)).work[0] > DEFAULT_MAX_WORK);
    let mut g = Graph::new("mm").io_data_type(F);
    let a = g.tensor(TensorDesc::new("a", &[4096, 4096], F));
    let b = g.tensor(TensorDesc::new("b", &[4096, 4096], F));
    let c = g.matmul(a, b);
    g.set_output(c);
    g.validate().unwrap();
    assert!(estimate(&g).work[0] < DEFAULT_MAX_WORK);
}

/// Three relus in a row.
fn chain() -> Graph {
    let mut g = Graph::new("chain").io_data_type(F);
    let x = g.tensor(TensorDesc::new("x", &[4, 5], F));
    let a = g.relu(x);
    g.named("first");
    let b = g.exp(a);
    g.named("second");
    let y = g.tanh(b);
    g.named("third");
    g.set_output(y);
    g.validate().unwrap();
    g
}

#[test]
fn a_set_cancel_token_stops_execution_with_an_error() {
    let g = chain();
    let handle = Handle::cpu();
    let plan = handle.build_plans(&g, &PlanPolicy::default()).unwrap().remove(0);
    let inputs = random_inputs(&g, 3);
    let token = CancelToken::new();
    let watcher = token.clone();
    token.cancel();
    assert!(watcher.is_cancelled());
    match execute_plan_dense_cancellable(&handle, &plan, &inputs, &watcher) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("graph \"chain\"") && m.contains("relu \"first\"") && m.contains("cancelled"), "{m}"),
        other => panic!("expected a cancellation, got {:?}", other.map(|o| o.len())),
    }
    // Reset, the same plan runs and gives what an execution without a token gives.
    token.reset();
    let with_token = execute_plan_dense_cancellable(&handle, &plan, &inputs, &token).unwrap();
    let without = execute_plan_dense(&handle, &plan, &inputs).unwrap();
    assert_eq!(with_token, without);
}

#[test]
fn dense_helpers_check_what_they_are_given() {
    // Inputs of the wrong dims are refused, naming the tensor, not scattered partly.
    let g = chain();
    let handle = Handle::cpu();
    let plan = handle.build_plans(&g, &PlanPolicy::default()).unwrap().remove(0);
    let mut inputs = random_inputs(&g, 1);
    let x = g.find("x").unwrap();
    inputs.insert(x, Nd::new(vec![5, 4], vec![0.5; 20]));
    match execute_plan_dense(&handle, &plan, &inputs) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("tensor \"x\"") && m.contains("[4, 5]") && m.contains("[5, 4]"), "{m}"),
        other => panic!("expected InvalidArgument, got {:?}", other.map(|o| o.len())),
    }
    // Random inputs of a graph never validated, with a negative dim: an error, not a panic.
    let mut bad = Graph::new("bad").io_data_type(F);
    let x = bad.tensor(TensorDesc::new("x", &[2, -3], F));
    let y = bad.relu(x);
    bad.set_output(y);
    match try_random_inputs(&bad, 1) {
        Err(Error::InvalidGraph(m)) => assert!(m.contains("tensor \"x\"") && m.contains("[2, -3]"), "{m}"),
        other => panic!("expected InvalidGraph, got {:?}", other.map(|o| o.len())),
    }
}
