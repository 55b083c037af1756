//! The rng op and the Philox 4x32-10 generator, checked against Random123's published known
//! answers and against values rebuilt here from the documented counter mapping.

use ferrodnn::engine::cpu::philox4x32;
use ferrodnn::graph::ops::rng::Distribution;
use ferrodnn::testing::{max_abs_error, run_cpu};
use ferrodnn::{DataType, Error, Graph, Nd, TensorDesc, TensorId};
use std::collections::HashMap;

#[test]
fn philox_matches_random123_known_answers() {
    // kat_vectors of Random123 (philox4x32 with 10 rounds).
    assert_eq!(philox4x32([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
    assert_eq!(philox4x32([0xffffffff; 4], [0xffffffff; 2]), [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]);
    assert_eq!(philox4x32([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]), [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]);
}

/// The documented mapping, written out independently: element `i` takes word `i % 4` of
/// philox4x32([lo(i/4), hi(i/4), lo(offset), hi(offset)], [lo(seed), hi(seed)]).
fn expected_u(seed: i64, offset: i64, i: u64) -> f64 {
    let (s, o) = (seed as u64, offset as u64);
    let c = i / 4;
    let words = philox4x32([(c & 0xffff_ffff) as u32, (c >> 32) as u32, (o & 0xffff_ffff) as u32, (o >> 32) as u32], [(s & 0xffff_ffff) as u32, (s >> 32) as u32]);
    (words[(i % 4) as usize] as f64 + 0.5) / 2f64.powi(32)
}

/// A graph with `seed` and `offset` as one-element buffers of `seed_type`, and its inputs.
fn rng_graph(dims: &[i64], dist: Distribution, seed_type: DataType, seed: i64, offset: i64) -> (Graph, TensorId, HashMap<TensorId, Nd>) {
    let mut g = Graph::new("rng");
    let s = g.tensor(TensorDesc::new("seed", &[1], seed_type));
    let o = g.tensor(TensorDesc::new("offset", &[1, 1], seed_type));
    let y = g.rng(s, o, dims, dist);
    g.set_output(y);
    let mut inputs = HashMap::new();
    inputs.insert(s, Nd::new(vec![1], vec![seed as f64]));
    inputs.insert(o, Nd::new(vec![1, 1], vec![offset as f64]));
    (g, y, inputs)
}

#[test]
fn uniform_follows_the_counter_mapping() {
    // Seed and offset past 2^32 exercise the high words of key and counter.
    for (seed, offset) in [(0i64, 0i64), (12345, 7), ((1i64 << 40) + 3, (1i64 << 33) + 5), (-2, 1)] {
        let dims = [3i64, 5, 7];
        let (low, high) = (-2.0, 3.0);
        let (g, y, inputs) = rng_graph(&dims, Distribution::Uniform { low, high }, DataType::I64, seed, offset);
        let out = run_cpu(&g, &inputs).unwrap();
        let got = &out[&y];
        assert_eq!(got.dims, vec![3, 5, 7]);
        let want: Vec<f64> = (0..105u64).map(|i| (low + (high - low) * expected_u(seed, offset, i)) as f32 as f64).collect();
        assert_eq!(got.data, want, "seed {seed} offset {offset}");
        assert!(got.data.iter().all(|&x| x > low && x < high));
    }
}

#[test]
fn uniform_with_transposed_output_strides_keeps_the_logical_mapping() {
    // y is stored column-major with a gap; element (r, c) still uses flat index r * 13 + c.
    let (mut g, y, inputs) = rng_graph(&[5, 13], Distribution::Uniform { low: 0.0, high: 1.0 }, DataType::I32, 99, 4);
    g.desc_mut(y).strides = vec![1, 6];
    g.desc_mut(y).data_type = Some(DataType::F64);
    let out = run_cpu(&g, &inputs).unwrap();
    let want: Vec<f64> = (0..65u64).map(|i| expected_u(99, 4, i)).collect();
    assert!(max_abs_error(&out[&y].data, &want) < 1e-15);
}

#[test]
fn uniform_rounds_to_half_precision_outputs() {
    for dt in [DataType::F16, DataType::Bf16] {
        let (mut g, y, inputs) = rng_graph(&[4, 9], Distribution::Uniform { low: -1.0, high: 1.0 }, DataType::I64, 5, 11);
        g.desc_mut(y).data_type = Some(dt);
        let out = run_cpu(&g, &inputs).unwrap();
        let want: Vec<f64> = (0..36u64).map(|i| dt.quantize(-1.0 + 2.0 * expected_u(5, 11, i))).collect();
        assert_eq!(out[&y].data, want, "{dt}");
    }
}

#[test]
fn bernoulli_follows_u_below_p() {
    for p in [0.0, 0.3, 0.75, 1.0] {
        let (g, y, inputs) = rng_graph(&[7, 11], Distribution::Bernoulli { probability: p }, DataType::I64, 2024, 3);
        let out = run_cpu(&g, &inputs).unwrap();
        let want: Vec<f64> = (0..77u64).map(|i| if expected_u(2024, 3, i) < p { 1.0 } else { 0.0 }).collect();
        assert_eq!(out[&y].data, want, "p = {p}");
    }
    // Integer and boolean outputs hold the same 0/1 values.
    let (mut g, y, inputs) = rng_graph(&[3, 5], Distribution::Bernoulli { probability: 0.5 }, DataType::I64, 8, 0);
    g.desc_mut(y).data_type = Some(DataType::Bool);
    let out = run_cpu(&g, &inputs).unwrap();
    let want: Vec<f64> = (0..15u64).map(|i| if expected_u(8, 0, i) < 0.5 { 1.0 } else { 0.0 }).collect();
    assert_eq!(out[&y].data, want);
}

#[test]
fn statistics_are_plausible() {
    // 20000 draws: the mean of U(0,1) within 5 sigma of 1/2, and a Bernoulli(0.2) rate near 0.2.
    let n = 20_000f64;
    let (g, y, inputs) = rng_graph(&[100, 200], Distribution::Uniform { low: 0.0, high: 1.0 }, DataType::I64, 77, 0);
    let out = run_cpu(&g, &inputs).unwrap();
    let mean = out[&y].data.iter().sum::<f64>() / n;
    assert!((mean - 0.5).abs() < 5.0 * (1.0 / 12.0f64).sqrt() / n.sqrt(), "mean {mean}");
    let (g, y, inputs) = rng_graph(&[100, 200], Distribution::Bernoulli { probability: 0.2 }, DataType::I64, 78, 0);
    let out = run_cpu(&g, &inputs).unwrap();
    let rate = out[&y].data.iter().sum::<f64>() / n;
    assert!((rate - 0.2).abs() < 5.0 * (0.16f64).sqrt() / n.sqrt(), "rate {rate}");
}

#[test]
fn reproducible_and_sensitive_to_seed_and_offset() {
    let dist = Distribution::Uniform { low: 0.0, high: 1.0 };
    let run = |seed, offset| {
        let (g, y, inputs) = rng_graph(&[6, 5], dist, DataType::I64, seed, offset);
        run_cpu(&g, &inputs).unwrap()[&y].data.clone()
    };
    assert_eq!(run(1, 2), run(1, 2));
    assert_ne!(run(1, 2), run(1, 3));
    assert_ne!(run(1, 2), run(2, 2));
}

#[test]
fn by_value_seed_and_offset() {
    let mut g = Graph::new("rng_by_value");
    let s = g.tensor(TensorDesc::scalar("seed", 31.0, DataType::I64));
    let o = g.tensor(TensorDesc::scalar("offset", 9.0, DataType::I64));
    let y = g.rng(s, o, &[2, 3, 5], Distribution::Uniform { low: 1.0, high: 2.0 });
    g.set_output(y);
    let out = run_cpu(&g, &HashMap::new()).unwrap();
    let want: Vec<f64> = (0..30u64).map(|i| (1.0 + expected_u(31, 9, i)) as f32 as f64).collect();
    assert_eq!(out[&y].data, want);
    g.validate().unwrap();
    assert_eq!(g.resolved_data_type(y), Some(DataType::F32));
}

fn expect_invalid(mut g: Graph, needle: &str) {
    match g.validate() {
        Err(Error::InvalidGraph(msg)) => assert!(msg.contains(needle), "message {msg:?} lacks {needle:?}"),
        other => panic!("expected InvalidGraph containing {needle:?}, got {other:?}"),
    }
}

#[test]
fn bad_inputs_are_rejected() {
    let build = |dist: Distribution, seed: TensorDesc, offset: TensorDesc| {
        let mut g = Graph::new("bad_rng");
        let s = g.tensor(seed);
        let o = g.tensor(offset);
        let y = g.rng(s, o, &[4, 4], dist);
        g.set_output(y);
        (g, y)
    };
    let i64s = |n: &str| TensorDesc::new(n, &[1], DataType::I64);
    let uni = Distribution::Uniform { low: 0.0, high: 1.0 };
    expect_invalid(build(Distribution::Uniform { low: 1.0, high: 1.0 }, i64s("s"), i64s("o")).0, "uniform needs low < high");
    expect_invalid(build(Distribution::Uniform { low: 0.0, high: f64::INFINITY }, i64s("s"), i64s("o")).0, "must be finite");
    expect_invalid(build(Distribution::Bernoulli { probability: 1.5 }, i64s("s"), i64s("o")).0, "probability must be in [0, 1]");
    expect_invalid(build(Distribution::Bernoulli { probability: -0.1 }, i64s("s"), i64s("o")).0, "probability must be in [0, 1]");
    expect_invalid(build(uni, TensorDesc::new("s", &[2], DataType::I64), i64s("o")).0, "input `seed` (tensor \"s\") must have one element");
    expect_invalid(build(uni, i64s("s"), TensorDesc::new("o", &[1], DataType::F32)).0, "input `offset` (tensor \"o\") must be an integer tensor");
    let (mut g, y) = build(uni, i64s("s"), i64s("o"));
    g.desc_mut(y).data_type = Some(DataType::I32);
    expect_invalid(g, "needs a floating-point output");
    let (mut g, y) = build(uni, i64s("s"), i64s("o"));
    g.desc_mut(y).dims = vec![4, 0];
    expect_invalid(g, "output `y` dim 1 must be positive");
}
