//! The RNN ops: the weight-space layout, validation of bad graphs, JSON, the reference forward
//! against properties that hold independently of its code (a padded sample equals the sample
//! alone, the reverse direction equals the forward one on the reversed sequence, the three
//! layouts agree, a hand-written one-step cell), and both backward passes against central
//! finite differences of the forward pass.

use ferrodnn::graph::ops::rnn::{RnnBackwardInputs, RnnBiasMode, RnnDesc, RnnInputs, RnnLayout, RnnMode};
use ferrodnn::testing::{dot, numeric_gradient, random_inputs, run_cpu, SplitMix64};
use ferrodnn::{DataType, Graph, Nd, TensorDesc, TensorId};
use std::collections::HashMap;

fn all_modes() -> [RnnMode; 4] {
    [RnnMode::Relu, RnnMode::Tanh, RnnMode::Lstm, RnnMode::Gru]
}

#[test]
fn weight_params_tile_the_weight_space() {
    for mode in all_modes() {
        for bias in [RnnBiasMode::NoBias, RnnBiasMode::SingleInp, RnnBiasMode::Double, RnnBiasMode::SingleRec] {
            for proj in [None, Some(5)] {
                if proj.is_some() && mode != RnnMode::Lstm {
                    continue;
                }
                let mut a = RnnDesc::new(mode, 7, 13, 9, 5).layers(2).bidirectional().with_bias(bias);
                a.proj_size = proj;
                // Every element of the weight space belongs to exactly one matrix or bias.
                let mut owner = vec![0u8; a.weight_space_elements() as usize];
                for pl in 0..a.pseudo_layers() {
                    for lin in 0..a.lin_layers() {
                        let w = a.weight_params(pl, lin).unwrap();
                        let layer_in = if pl < 2 { 7 } else { 2 * a.proj() };
                        let gates = mode.gates();
                        let (rows, cols) = if lin < gates {
                            (13, layer_in)
                        } else if lin < 2 * gates {
                            (13, a.proj())
                        } else {
                            (a.proj(), 13)
                        };
                        assert_eq!((w.rows, w.cols), (rows, cols), "{mode:?} {bias:?} pl {pl} lin {lin}");
                        for i in w.matrix_offset..w.matrix_offset + rows * cols {
                            owner[i as usize] += 1;
                        }
                        let want_bias = match bias {
                            RnnBiasMode::NoBias => false,
                            RnnBiasMode::SingleInp => lin < gates,
                            RnnBiasMode::Double => lin < 2 * gates,
                            RnnBiasMode::SingleRec => lin >= gates && lin < 2 * gates,
                        };
                        assert_eq!(w.bias_len, if want_bias { 13 } else { 0 }, "{mode:?} {bias:?} pl {pl} lin {lin}");
                        for i in w.bias_offset..w.bias_offset + w.bias_len {
                            owner[i as usize] += 1;
                        }
                    }
                }
                assert!(owner.iter().all(|&n| n == 1), "{mode:?} {bias:?} {proj:?}: not a tiling");
                assert!(a.weight_params(a.pseudo_layers(), 0).is_none());
                assert!(a.weight_params(0, a.lin_layers()).is_none());
                assert!(a.weight_params(-1, 0).is_none());
            }
        }
    }
}

#[test]
fn lstm_weight_space_has_pytorch_order() {
    // One layer, input 2, hidden 3: W_i..W_o (4 x [3, 2]), R_i..R_o (4 x [3, 3]), then bW, bR.
    let a = RnnDesc::new(RnnMode::Lstm, 2, 3, 4, 1);
    assert_eq!(a.weight_params(0, 0).unwrap().matrix_offset, 0);
    assert_eq!(a.weight_params(0, 1).unwrap().matrix_offset, 6);
    assert_eq!(a.weight_params(0, 4).unwrap().matrix_offset, 24);
    assert_eq!(a.weight_params(0, 7).unwrap().matrix_offset, 24 + 27);
    assert_eq!(a.weight_params(0, 0).unwrap().bias_offset, 60);
    assert_eq!(a.weight_params(0, 4).unwrap().bias_offset, 72);
    assert_eq!(a.weight_space_elements(), 84);
}

fn base_graph(a: &RnnDesc, dt: DataType) -> (Graph, TensorId, TensorId) {
    let mut g = Graph::new("rnn").io_data_type(dt);
    let x = g.tensor(TensorDesc::new("x", &a.seq_dims(a.input_size), dt));
    let w = g.tensor(TensorDesc::new("w", &[a.weight_space_elements()], dt));
    (g, x, w)
}

fn expect_err(mut g: Graph, needles: &[&str]) {
    let e = g.validate().expect_err("graph should be refused").to_string();
    for n in needles {
        assert!(e.contains(n), "error `{e}` should mention `{n}`");
    }
}

#[test]
fn bad_graphs_are_refused_with_clear_errors() {
    let f = DataType::F32;
    let a = RnnDesc::new(RnnMode::Lstm, 7, 13, 9, 5);
    // x with the wrong dims.
    let mut g = Graph::new("rnn").io_data_type(f);
    let x = g.tensor(TensorDesc::new("x", &[9, 5, 8], f));
    let w = g.tensor(TensorDesc::new("w", &[a.weight_space_elements()], f));
    let o = g.rnn(x, w, RnnInputs::default(), a.clone());
    g.set_output(o.y);
    expect_err(g, &["rnn", "`x`", "[9, 5, 7]", "[9, 5, 8]"]);
    // A weight space of the wrong size.
    let mut g = Graph::new("rnn").io_data_type(f);
    let x = g.tensor(TensorDesc::new("x", &[9, 5, 7], f));
    let w = g.tensor(TensorDesc::new("w", &[10], f));
    let o = g.rnn(x, w, RnnInputs::default(), a.clone());
    g.set_output(o.y);
    expect_err(g, &["`weights`", &a.weight_space_elements().to_string(), "[10]"]);
    // Batch-major x given for a sequence-major descriptor.
    let mut g = Graph::new("rnn").io_data_type(f);
    let x = g.tensor(TensorDesc::new("x", &[5, 9, 7], f));
    let w = g.tensor(TensorDesc::new("w", &[a.weight_space_elements()], f));
    let o = g.rnn(x, w, RnnInputs::default(), a.clone());
    g.set_output(o.y);
    expect_err(g, &["`x`", "SeqMajorUnpacked", "[5, 9, 7]"]);
    // hx of the wrong dims, cx on a GRU.
    let (mut g, x, w) = base_graph(&a, f);
    let hx = g.tensor(TensorDesc::new("hx", &[1, 5, 12], f));
    let o = g.rnn(x, w, RnnInputs { hx: Some(hx), ..Default::default() }, a.clone());
    g.set_output(o.y);
    expect_err(g, &["`hx`", "[1, 5, 13]", "[1, 5, 12]"]);
    let gru = RnnDesc::new(RnnMode::Gru, 7, 13, 9, 5);
    let (mut g, x, w) = base_graph(&gru, f);
    let cx = g.tensor(TensorDesc::new("cx", &[1, 5, 13], f));
    let o = g.rnn(x, w, RnnInputs { cx: Some(cx), ..Default::default() }, gru.clone());
    g.set_output(o.y);
    expect_err(g, &["`cx`", "only an LSTM", "gru"]);
    // Mixed types.
    let (mut g, x, _) = base_graph(&a, f);
    let w = g.tensor(TensorDesc::new("w16", &[a.weight_space_elements()], DataType::F16));
    let o = g.rnn(x, w, RnnInputs::default(), a.clone());
    g.set_output(o.y);
    expect_err(g, &["`weights`", "f32", "f16"]);
    // Integer data.
    let (mut g, _, w) = base_graph(&a, f);
    let x = g.tensor(TensorDesc::new("xi", &[9, 5, 7], DataType::I32));
    let o = g.rnn(x, w, RnnInputs::default(), a.clone());
    g.set_output(o.y);
    expect_err(g, &["`x`", "i32"]);
    // seq_lengths of the wrong type and dims.
    for (dims, dt, needle) in [(vec![5i64], DataType::F32, "integer"), (vec![4], DataType::I32, "[batch] = [5]")] {
        let (mut g, x, w) = base_graph(&a, f);
        let l = g.tensor(TensorDesc::new("len", &dims, dt));
        let o = g.rnn(x, w, RnnInputs { seq_lengths: Some(l), ..Default::default() }, a.clone());
        g.set_output(o.y);
        expect_err(g, &["`seq_lengths`", needle]);
    }
    // Attribute rules.
    let bad: Vec<(RnnDesc, &str)> = vec![
        (RnnDesc::new(RnnMode::Lstm, 7, 0, 9, 5), "hidden_size must be positive"),
        (RnnDesc::new(RnnMode::Lstm, 7, 13, 9, 5).layers(0), "num_layers must be positive"),
        (RnnDesc::new(RnnMode::Gru, 7, 13, 9, 5).with_proj(5), "proj_size 5 is for LSTM only"),
        (RnnDesc::new(RnnMode::Lstm, 7, 13, 9, 5).with_proj(14), "proj_size must be in [1, hidden_size = 13]"),
        (RnnDesc::new(RnnMode::Tanh, 7, 13, 9, 5).with_clip(-1.0, 1.0, false), "cell_clip is for LSTM only"),
        (RnnDesc::new(RnnMode::Lstm, 7, 13, 9, 5).with_clip(1.0, -1.0, false), "lower <= upper"),
        (RnnDesc { dropout: Some(1.0), ..RnnDesc::new(RnnMode::Lstm, 7, 13, 9, 5) }, "dropout probability must be in [0, 1)"),
        (RnnDesc { padding_fill: f64::NAN, ..RnnDesc::new(RnnMode::Lstm, 7, 13, 9, 5) }, "padding_fill"),
        (RnnDesc::new(RnnMode::Lstm, 7, 13, 1 << 30, 1 << 30), "too large"),
    ];
    for (d, needle) in bad {
        let mut g = Graph::new("rnn").io_data_type(f);
        let x = g.tensor(TensorDesc::new("x", &[1, 1, 1], f));
        let w = g.tensor(TensorDesc::new("w", &[1], f));
        let o = g.rnn(x, w, RnnInputs::default(), d);
        g.set_output(o.y);
        expect_err(g, &["rnn", needle]);
    }
    // Dropout without seed and offset.
    let drop = RnnDesc { dropout: Some(0.3), ..a.clone().layers(2).training() };
    let (mut g, x, w) = base_graph(&drop, f);
    let o = g.rnn(x, w, RnnInputs::default(), drop.clone());
    g.set_output(o.y);
    expect_err(g, &["dropout 0.3 needs both `seed` and `offset`"]);
    // An f16 compute type.
    let (mut g, x, w) = base_graph(&a, f);
    let o = g.rnn(x, w, RnnInputs::default(), a.clone());
    g.set_output(o.y);
    g.nodes[0].compute_data_type = Some(DataType::F16);
    expect_err(g, &["compute_data_type must be f32 or f64", "f16"]);
}

#[test]
fn bad_backward_graphs_are_refused() {
    let f = DataType::F32;
    let a = RnnDesc::new(RnnMode::Lstm, 7, 13, 9, 5).training();
    // A reserve of the wrong size.
    let mut g = Graph::new("bwd").io_data_type(f);
    let dy = g.tensor(TensorDesc::new("dy", &[9, 5, 13], f));
    let w = g.tensor(TensorDesc::new("w", &[a.weight_space_elements()], f));
    let r = g.tensor(TensorDesc::new("reserve", &[a.reserve_elements() - 1], f));
    let gr = g.rnn_backward_data(dy, w, r, RnnBackwardInputs::default(), a.clone());
    g.set_output(gr.dx);
    expect_err(g, &["rnn_backward_data", "`reserve`", &a.reserve_elements().to_string()]);
    // dy with the wrong features.
    let mut g = Graph::new("bwd").io_data_type(f);
    let dy = g.tensor(TensorDesc::new("dy", &[9, 5, 7], f));
    let w = g.tensor(TensorDesc::new("w", &[a.weight_space_elements()], f));
    let r = g.tensor(TensorDesc::new("reserve", &[a.reserve_elements()], f));
    let gr = g.rnn_backward_data(dy, w, r, RnnBackwardInputs::default(), a.clone());
    g.set_output(gr.dx);
    expect_err(g, &["`dy`", "[9, 5, 13]", "[9, 5, 7]"]);
    // dgates of the wrong size for the weights pass; dw_in of the wrong size.
    let mut g = Graph::new("bwdw").io_data_type(f);
    let x = g.tensor(TensorDesc::new("x", &[9, 5, 7], f));
    let r = g.tensor(TensorDesc::new("reserve", &[a.reserve_elements()], f));
    let dg = g.tensor(TensorDesc::new("dgates", &[3], f));
    let dw = g.rnn_backward_weights(x, r, dg, None, None, None, a.clone());
    g.set_output(dw);
    expect_err(g, &["rnn_backward_weights", "`dgates`", &a.dgates_elements().to_string()]);
    let mut g = Graph::new("bwdw").io_data_type(f);
    let x = g.tensor(TensorDesc::new("x", &[9, 5, 7], f));
    let r = g.tensor(TensorDesc::new("reserve", &[a.reserve_elements()], f));
    let dg = g.tensor(TensorDesc::new("dgates", &[a.dgates_elements()], f));
    let dwin = g.tensor(TensorDesc::new("dw_in", &[4], f));
    let dw = g.rnn_backward_weights(x, r, dg, None, None, Some(dwin), a.clone());
    g.set_output(dw);
    expect_err(g, &["`dw_in`", "[4]"]);
    // A port the op does not have (dropout's seed on the backward pass, a misspelt one).
    let mut g = Graph::new("bwd").io_data_type(f);
    let dy = g.tensor(TensorDesc::new("dy", &[9, 5, 13], f));
    let w = g.tensor(TensorDesc::new("w", &[a.weight_space_elements()], f));
    let r = g.tensor(TensorDesc::new("reserve", &[a.reserve_elements()], f));
    let seed = g.tensor(TensorDesc::scalar("seed", 1.0, DataType::I64));
    let gr = g.rnn_backward_data(dy, w, r, RnnBackwardInputs::default(), a.clone());
    g.nodes[0].inputs.push(ferrodnn::graph::Port { name: "seed".into(), tensor: seed });
    g.set_output(gr.dx);
    expect_err(g, &["rnn_backward_data", "no input port `seed`", "dy, weights, reserve"]);
    let (mut g, x, w) = base_graph(&RnnDesc::new(RnnMode::Gru, 7, 13, 9, 5), f);
    let o = g.rnn(x, w, RnnInputs::default(), RnnDesc::new(RnnMode::Gru, 7, 13, 9, 5));
    g.nodes[0].inputs.push(ferrodnn::graph::Port { name: "hx0".into(), tensor: x });
    g.set_output(o.y);
    expect_err(g, &["rnn \"", "no input port `hx0`"]);
    // A reserve output in inference mode (training off) is refused through JSON.
    let inf = RnnDesc::new(RnnMode::Gru, 7, 13, 9, 5);
    let (mut g, x, w) = base_graph(&inf, f);
    let o = g.rnn(x, w, RnnInputs::default(), inf.clone());
    g.set_output(o.y);
    g.validate().unwrap();
    let json = g.to_json().unwrap().replace("\"training\": false", "\"training\": true");
    let e = Graph::from_json(&json).unwrap_err().to_string();
    assert!(e.contains("output `reserve` is not connected but training is true"), "{e}");
}

#[test]
fn rnn_graphs_round_trip_through_json() {
    let a = RnnDesc {
        dropout: Some(0.25),
        padding_fill: -1.5,
        ..RnnDesc::new(RnnMode::Lstm, 7, 13, 9, 5).layers(2).bidirectional().with_proj(6).with_clip(-2.0, 2.0, true).training()
    }
    .with_layout(RnnLayout::BatchMajorUnpacked)
    .with_bias(RnnBiasMode::SingleRec);
    let (mut g, _) = train_graph(&a, DataType::F32, true);
    g.validate().unwrap();
    let json = g.to_json().unwrap();
    let back = Graph::from_json(&json).unwrap();
    assert_eq!(back, g);
    assert_eq!(back.key(), g.key());
}

/// The inputs of an RNN graph: random data, lengths `lens` (when given), seed and offset.
fn inputs_for(g: &Graph, seed: u64, lens: Option<&[usize]>) -> HashMap<TensorId, Nd> {
    let mut inputs = random_inputs(g, seed);
    for (name, values) in [("len", lens.map(|l| l.iter().map(|&x| x as f64).collect::<Vec<_>>())), ("seed", Some(vec![1234.0])), ("offset", Some(vec![7.0]))] {
        if let (Some(id), Some(v)) = (g.find(name), values) {
            inputs.insert(id, Nd::new(vec![v.len()], v));
        }
    }
    inputs
}

/// A forward graph with every optional input and output.
fn forward_graph(a: &RnnDesc, dt: DataType, lens: bool) -> (Graph, ferrodnn::graph::ops::rnn::RnnOutputs) {
    let (mut g, x, w) = base_graph(a, dt);
    let lstm = a.cell_mode == RnnMode::Lstm;
    let hx = g.tensor(TensorDesc::new("hx", &[a.pseudo_layers(), a.batch, a.proj()], dt));
    let cx = lstm.then(|| g.tensor(TensorDesc::new("cx", &[a.pseudo_layers(), a.batch, a.hidden_size], dt)));
    let seq_lengths = lens.then(|| g.tensor(TensorDesc::new("len", &[a.batch], DataType::I32)));
    let (seed, offset) =
        if a.has_dropout() { (Some(g.tensor(TensorDesc::new("seed", &[1], DataType::I64))), Some(g.tensor(TensorDesc::new("offset", &[1], DataType::I64)))) } else { (None, None) };
    let o = g.rnn(x, w, RnnInputs { hx: Some(hx), cx, seq_lengths, seed, offset }, a.clone());
    g.set_output(o.y);
    g.set_output(o.hy);
    if let Some(cy) = o.cy {
        g.set_output(cy);
    }
    if let Some(r) = o.reserve {
        g.set_output(r);
    }
    (g, o)
}

/// Forward, backward data and backward weights in one graph (training).
struct Train {
    y: TensorId,
    hy: TensorId,
    cy: Option<TensorId>,
    dx: TensorId,
    dhx: TensorId,
    dcx: Option<TensorId>,
    dw: TensorId,
}

fn train_graph(a: &RnnDesc, dt: DataType, lens: bool) -> (Graph, Train) {
    let (mut g, o) = forward_graph(a, dt, lens);
    let x = g.find("x").unwrap();
    let w = g.find("w").unwrap();
    let hx = g.find("hx");
    let cx = g.find("cx");
    let sl = g.find("len");
    let lstm = a.cell_mode == RnnMode::Lstm;
    let dy = g.tensor(TensorDesc::new("dy", &a.seq_dims(a.out_size()), dt));
    let dhy = g.tensor(TensorDesc::new("dhy", &[a.pseudo_layers(), a.batch, a.proj()], dt));
    let dcy = lstm.then(|| g.tensor(TensorDesc::new("dcy", &[a.pseudo_layers(), a.batch, a.hidden_size], dt)));
    let reserve = o.reserve.unwrap();
    let gr = g.rnn_backward_data(dy, w, reserve, RnnBackwardInputs { hx, cx, dhy: Some(dhy), dcy, seq_lengths: sl }, a.clone());
    let dw = g.rnn_backward_weights(x, reserve, gr.dgates, hx, sl, None, a.clone());
    for t in [gr.dx, gr.dhx, dw] {
        g.set_output(t);
    }
    if let Some(t) = gr.dcx {
        g.set_output(t);
    }
    (g, Train { y: o.y, hy: o.hy, cy: o.cy, dx: gr.dx, dhx: gr.dhx, dcx: gr.dcx, dw })
}

/// The backward passes of the reference against central differences of
/// `L = y . dy + hy . dhy + cy . dcy` with respect to x, hx, cx and the weights (f64).
fn gradient_check(a: &RnnDesc, lens: Option<&[usize]>) {
    let dt = DataType::F64;
    let (mut g, t) = train_graph(a, dt, lens.is_some());
    g.validate().unwrap();
    let inputs = inputs_for(&g, 11, lens);
    let out = run_cpu(&g, &inputs).unwrap();
    let (dy, dhy, dcy) = (inputs[&g.find("dy").unwrap()].clone(), inputs[&g.find("dhy").unwrap()].clone(), g.find("dcy").map(|i| inputs[&i].clone()));
    let (fg, fo) = forward_graph(a, dt, lens.is_some());
    let loss = |inp: &HashMap<TensorId, Nd>| -> f64 {
        let o = run_cpu(&fg, inp).unwrap();
        let mut l = dot(&o[&fo.y], &dy) + dot(&o[&fo.hy], &dhy);
        if let (Some(cy), Some(dcy)) = (fo.cy, &dcy) {
            l += dot(&o[&cy], dcy);
        }
        l
    };
    let finputs = inputs_for(&fg, 11, lens);
    // The forward graph draws the same random values for its inputs as the training graph's.
    for name in ["x", "w", "hx", "cx"] {
        if let (Some(a), Some(b)) = (g.find(name), fg.find(name)) {
            assert_eq!(inputs[&a].data, finputs[&b].data, "{name}");
        }
    }
    let checks = [("x", Some(t.dx)), ("hx", Some(t.dhx)), ("cx", t.dcx), ("w", Some(t.dw))];
    for (name, grad) in checks {
        let (Some(grad), Some(id)) = (grad, fg.find(name)) else { continue };
        let numeric = numeric_gradient(&finputs[&id], 1e-6, |v| {
            let mut inp = finputs.clone();
            inp.insert(id, v.clone());
            loss(&inp)
        });
        let analytic = &out[&grad];
        let err = ferrodnn::testing::relative_error(&analytic.data, &numeric.data);
        assert!(err < 1e-6, "{:?} {:?} {:?} layers {} d/d{name}: relative error {err:e}", a.cell_mode, a.direction, a.layout, a.num_layers);
        let scale: f64 = numeric.data.iter().map(|v| v.abs()).sum();
        assert!(scale > 0.0, "d/d{name} is all zero: the check would prove nothing");
    }
    // The forward outputs of the training graph are the forward graph's.
    let fout = run_cpu(&fg, &finputs).unwrap();
    assert_eq!(out[&t.y].data, fout[&fo.y].data);
    assert_eq!(out[&t.hy].data, fout[&fo.hy].data);
    if let (Some(a), Some(b)) = (t.cy, fo.cy) {
        assert_eq!(out[&a].data, fout[&b].data);
    }
}

#[test]
fn backward_matches_finite_differences_every_mode() {
    for mode in all_modes() {
        let a = RnnDesc::new(mode, 3, 4, 4, 2).layers(2).bidirectional().training();
        gradient_check(&a, Some(&[4, 2]));
    }
}

#[test]
fn backward_matches_finite_differences_lstm_projection_clip_bias_modes() {
    let a = RnnDesc::new(RnnMode::Lstm, 3, 4, 4, 3).with_proj(2).with_clip(-0.3, 0.25, false).with_bias(RnnBiasMode::SingleInp).training();
    gradient_check(&a, Some(&[4, 0, 3]));
    let a = RnnDesc::new(RnnMode::Gru, 2, 3, 3, 2).with_bias(RnnBiasMode::SingleRec).training().with_layout(RnnLayout::BatchMajorUnpacked);
    gradient_check(&a, Some(&[1, 3]));
    let a = RnnDesc::new(RnnMode::Tanh, 2, 3, 3, 3).layers(2).with_bias(RnnBiasMode::NoBias).training().with_layout(RnnLayout::SeqMajorPacked);
    gradient_check(&a, Some(&[3, 3, 1]));
}

#[test]
fn backward_matches_finite_differences_with_dropout() {
    let a = RnnDesc { dropout: Some(0.4), ..RnnDesc::new(RnnMode::Lstm, 2, 3, 3, 2).layers(3).bidirectional().training() };
    gradient_check(&a, None);
}

/// Forward outputs of `a` on the reference for the given inputs.
fn forward(a: &RnnDesc, inputs_of: impl Fn(&Graph) -> HashMap<TensorId, Nd>, lens: bool) -> (Nd, Nd, Option<Nd>) {
    let (mut g, o) = forward_graph(a, DataType::F64, lens);
    g.validate().unwrap();
    let out = run_cpu(&g, &inputs_of(&g)).unwrap();
    (out[&o.y].clone(), out[&o.hy].clone(), o.cy.map(|c| out[&c].clone()))
}

#[test]
fn a_padded_sample_equals_the_sample_alone() {
    for mode in all_modes() {
        let (t, b, len) = (6usize, 3usize, 4usize);
        let a = RnnDesc { padding_fill: 9.5, ..RnnDesc::new(mode, 3, 4, t as i64, b as i64).layers(2).bidirectional() };
        let (g, _) = forward_graph(&a, DataType::F64, true);
        let mut full = inputs_for(&g, 5, Some(&[t, len, t]));
        let (y, hy, cy) = forward(&a, |_| full.clone(), true);
        // Sample 1 alone, with T = len.
        let one = RnnDesc { max_seq_length: len as i64, batch: 1, ..a.clone() };
        let x = &full[&g.find("x").unwrap()];
        let xs: Vec<f64> = (0..len).flat_map(|s| x.data[(s * b + 1) * 3..(s * b + 2) * 3].to_vec()).collect();
        let pick = |nd: &Nd, n: usize| -> Vec<f64> { (0..a.pseudo_layers() as usize).flat_map(|pl| nd.data[(pl * b + 1) * n..(pl * b + 2) * n].to_vec()).collect() };
        let hx1 = pick(&full[&g.find("hx").unwrap()], 4);
        let cx1 = g.find("cx").map(|c| pick(&full[&c], 4));
        let w = full.remove(&g.find("w").unwrap()).unwrap();
        let (y1, hy1, cy1) = forward(
            &one,
            |g1| {
                let mut m = HashMap::new();
                m.insert(g1.find("x").unwrap(), Nd::new(vec![len, 1, 3], xs.clone()));
                m.insert(g1.find("w").unwrap(), w.clone());
                m.insert(g1.find("hx").unwrap(), Nd::new(vec![4, 1, 4], hx1.clone()));
                if let (Some(c), Some(v)) = (g1.find("cx"), &cx1) {
                    m.insert(c, Nd::new(vec![4, 1, 4], v.clone()));
                }
                m
            },
            false,
        );
        let f = 8;
        for s in 0..t {
            let got = &y.data[(s * b + 1) * f..(s * b + 2) * f];
            if s < len {
                assert_eq!(got, &y1.data[s * f..(s + 1) * f], "{mode:?} step {s}");
            } else {
                assert!(got.iter().all(|&v| v == 9.5), "{mode:?} padded step {s} holds {got:?}");
            }
        }
        assert_eq!(pick(&hy, 4), hy1.data, "{mode:?} hy");
        if let (Some(cy), Some(cy1)) = (cy, cy1) {
            assert_eq!(pick(&cy, 4), cy1.data, "{mode:?} cy");
        }
    }
}

#[test]
fn the_reverse_direction_is_the_forward_one_on_the_reversed_sequence() {
    for mode in all_modes() {
        let (t, b) = (5usize, 2usize);
        let bi = RnnDesc::new(mode, 3, 4, t as i64, b as i64).bidirectional();
        let uni = RnnDesc::new(mode, 3, 4, t as i64, b as i64);
        let (g, _) = forward_graph(&bi, DataType::F64, false);
        let inputs = inputs_for(&g, 3, None);
        let (y, hy, _) = forward(&bi, |_| inputs.clone(), false);
        // The reverse pseudo-layer's weights, the reversed x, hx[1].
        let wlen = uni.weight_space_elements() as usize;
        let w = &inputs[&g.find("w").unwrap()].data;
        let x = &inputs[&g.find("x").unwrap()].data;
        let xr: Vec<f64> = (0..t).rev().flat_map(|s| x[s * b * 3..(s + 1) * b * 3].to_vec()).collect();
        let hx = &inputs[&g.find("hx").unwrap()].data;
        let cx = g.find("cx").map(|c| inputs[&c].data[b * 4..].to_vec());
        let (yr, hyr, _) = forward(
            &uni,
            |g1| {
                let mut m = HashMap::new();
                m.insert(g1.find("x").unwrap(), Nd::new(vec![t, b, 3], xr.clone()));
                m.insert(g1.find("w").unwrap(), Nd::new(vec![wlen], w[wlen..].to_vec()));
                m.insert(g1.find("hx").unwrap(), Nd::new(vec![1, b, 4], hx[b * 4..].to_vec()));
                if let (Some(c), Some(v)) = (g1.find("cx"), &cx) {
                    m.insert(c, Nd::new(vec![1, b, 4], v.clone()));
                }
                m
            },
            false,
        );
        for s in 0..t {
            for bb in 0..b {
                let got = &y.data[(s * b + bb) * 8 + 4..(s * b + bb) * 8 + 8];
                let want = &yr.data[((t - 1 - s) * b + bb) * 4..((t - 1 - s) * b + bb + 1) * 4];
                assert_eq!(got, want, "{mode:?} step {s} sample {bb}");
            }
        }
        assert_eq!(&hy.data[b * 4..], &hyr.data[..], "{mode:?}");
    }
}

#[test]
fn the_three_layouts_agree() {
    let (t, b, n) = (4usize, 3usize, 3usize);
    let lens = [4usize, 2, 1];
    let base = RnnDesc { padding_fill: 0.0, ..RnnDesc::new(RnnMode::Lstm, n as i64, 5, t as i64, b as i64).layers(2).bidirectional() };
    let (g, _) = forward_graph(&base, DataType::F64, true);
    let inputs = inputs_for(&g, 8, Some(&lens));
    let x = inputs[&g.find("x").unwrap()].data.clone();
    let (y, hy, cy) = forward(&base, |_| inputs.clone(), true);
    let f = 10;
    for layout in [RnnLayout::BatchMajorUnpacked, RnnLayout::SeqMajorPacked] {
        let a = base.clone().with_layout(layout);
        // x in the other layout: row of (s, bi).
        let rows = t * b;
        let row = |s: usize, bi: usize| -> Option<usize> {
            (s < lens[bi]).then(|| match layout {
                RnnLayout::BatchMajorUnpacked => bi * t + s,
                _ => (0..s).map(|q| lens.iter().filter(|&&l| l > q).count()).sum::<usize>() + bi,
            })
        };
        let mut xl = vec![0.0; rows * n];
        for s in 0..t {
            for bi in 0..b {
                if let Some(r) = row(s, bi) {
                    xl[r * n..(r + 1) * n].copy_from_slice(&x[(s * b + bi) * n..(s * b + bi + 1) * n]);
                }
            }
        }
        let (y2, hy2, cy2) = forward(
            &a,
            |g2| {
                let mut m = inputs.clone();
                m.retain(|id, _| g2.desc(*id).name != "x");
                let xd: Vec<usize> = a.seq_dims(n as i64).iter().map(|&v| v as usize).collect();
                m.insert(g2.find("x").unwrap(), Nd::new(xd, xl.clone()));
                m
            },
            true,
        );
        for s in 0..t {
            for bi in 0..b {
                let want = &y.data[(s * b + bi) * f..(s * b + bi + 1) * f];
                match row(s, bi) {
                    Some(r) => assert_eq!(&y2.data[r * f..(r + 1) * f], want, "{layout:?} step {s} sample {bi}"),
                    None => assert!(want.iter().all(|&v| v == 0.0)),
                }
            }
        }
        assert_eq!(hy2.data, hy.data, "{layout:?}");
        assert_eq!(cy2.unwrap().data, cy.as_ref().unwrap().data, "{layout:?}");
    }
}

#[test]
fn packed_lengths_must_not_increase() {
    let a = RnnDesc::new(RnnMode::Gru, 2, 3, 3, 2).with_layout(RnnLayout::SeqMajorPacked);
    let (mut g, _) = forward_graph(&a, DataType::F32, true);
    g.validate().unwrap();
    let inputs = inputs_for(&g, 1, Some(&[1, 3]));
    let e = run_cpu(&g, &inputs).unwrap_err().to_string();
    assert!(e.contains("rnn") && e.contains("non-increasing") && e.contains("seq_lengths[1] = 3"), "{e}");
    let inputs = inputs_for(&g, 1, Some(&[4, 3]));
    let e = run_cpu(&g, &inputs).unwrap_err().to_string();
    assert!(e.contains("seq_lengths[0] = 4 is outside [0, max_seq_length = 3]"), "{e}");
}

/// One LSTM step with projection and clipping, written out by hand on a 1-sample, 1-step
/// problem: hidden 2, projection 1, input 1.
#[test]
fn one_lstmp_step_by_hand() {
    let a = RnnDesc::new(RnnMode::Lstm, 1, 2, 1, 1).with_proj(1).with_clip(-0.5, 0.5, false);
    let (mut g, o) = forward_graph(&a, DataType::F64, false);
    g.validate().unwrap();
    let mut rng = SplitMix64::new(4);
    let n = a.weight_space_elements() as usize;
    let w: Vec<f64> = (0..n).map(|_| rng.uniform(-1.5, 1.5)).collect();
    let (x, h0, c0) = (0.7, -0.4, vec![0.9, -0.2]);
    let mut inputs = HashMap::new();
    inputs.insert(g.find("x").unwrap(), Nd::new(vec![1, 1, 1], vec![x]));
    inputs.insert(g.find("w").unwrap(), Nd::new(vec![n], w.clone()));
    inputs.insert(g.find("hx").unwrap(), Nd::new(vec![1, 1, 1], vec![h0]));
    inputs.insert(g.find("cx").unwrap(), Nd::new(vec![1, 1, 2], c0.clone()));
    let out = run_cpu(&g, &inputs).unwrap();
    // Layout: W (4 gates x [2, 1]) = 8, R (4 x [2, 1]) = 8, W_r [1, 2] = 2, bW 8, bR 8.
    assert_eq!(n, 34);
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    let pre = |gate: usize, j: usize| w[gate * 2 + j] * x + w[8 + gate * 2 + j] * h0 + w[18 + gate * 2 + j] + w[26 + gate * 2 + j];
    let mut hh = [0.0; 2];
    let mut c = [0.0; 2];
    for j in 0..2 {
        let cc = sig(pre(1, j)) * c0[j] + sig(pre(0, j)) * pre(2, j).tanh();
        c[j] = cc.clamp(-0.5, 0.5);
        hh[j] = sig(pre(3, j)) * c[j].tanh();
    }
    let h = w[16] * hh[0] + w[17] * hh[1];
    assert!((out[&o.y].data[0] - h).abs() < 1e-14);
    assert!((out[&o.hy].data[0] - h).abs() < 1e-14);
    let cy = &out[&o.cy.unwrap()].data;
    assert!((cy[0] - c[0]).abs() < 1e-14 && (cy[1] - c[1]).abs() < 1e-14);
}

#[test]
fn cell_clip_nan_handling() {
    use ferrodnn::graph::ops::rnn::CellClip;
    let keep = CellClip { lower: -1.0, upper: 2.0, propagate_nan: true };
    let drop = CellClip { propagate_nan: false, ..keep };
    assert!(keep.apply(f64::NAN).is_nan());
    assert_eq!(drop.apply(f64::NAN), -1.0);
    assert_eq!(keep.apply(5.0), 2.0);
    assert_eq!(keep.apply(-5.0), -1.0);
    assert_eq!(keep.apply(0.5), 0.5);
}

#[test]
fn backward_weights_accumulates_into_dw_in() {
    let a = RnnDesc::new(RnnMode::Gru, 2, 3, 3, 2).training();
    let dt = DataType::F64;
    let build = |acc: bool| {
        let (mut g, o) = forward_graph(&a, dt, false);
        let x = g.find("x").unwrap();
        let hx = g.find("hx");
        let w = g.find("w").unwrap();
        let dy = g.tensor(TensorDesc::new("dy", &a.seq_dims(a.out_size()), dt));
        let gr = g.rnn_backward_data(dy, w, o.reserve.unwrap(), RnnBackwardInputs { hx, ..Default::default() }, a.clone());
        let dw_in = acc.then(|| g.tensor(TensorDesc::new("dw_in", &[a.weight_space_elements()], dt)));
        let dw = g.rnn_backward_weights(x, o.reserve.unwrap(), gr.dgates, hx, None, dw_in, a.clone());
        g.set_output(dw);
        g.validate().unwrap();
        (g, dw)
    };
    let (g0, dw0) = build(false);
    let (g1, dw1) = build(true);
    let in0 = inputs_for(&g0, 2, None);
    let mut in1 = inputs_for(&g1, 2, None);
    for (id, nd) in &in0 {
        let name = &g0.desc(*id).name;
        in1.insert(g1.find(name).unwrap(), nd.clone());
    }
    let base = in1[&g1.find("dw_in").unwrap()].clone();
    let r0 = run_cpu(&g0, &in0).unwrap();
    let r1 = run_cpu(&g1, &in1).unwrap();
    for i in 0..base.len() {
        assert!((r1[&dw1].data[i] - (r0[&dw0].data[i] + base.data[i])).abs() < 1e-12);
    }
}

/// The RNN check cases (which the GPU check runs against the reference) validate and run on
/// both CPU engines, with every output finite.
#[test]
fn the_check_cases_run_on_the_cpu_engines() {
    use ferrodnn::engine::PlanPolicy;
    use ferrodnn::testing::check::check_against_reference;
    use ferrodnn::{EngineKind, Handle};
    let cases: Vec<_> = ferrodnn::testing::cases::all().into_iter().filter(|c| c.name.starts_with("rnn_")).collect();
    assert!(cases.len() >= 40, "{} rnn cases", cases.len());
    let handle = Handle::cpu();
    for case in cases {
        let mut g = case.graph.clone();
        g.validate().unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let outs = check_against_reference(&handle, &g, &PlanPolicy { engine: Some(EngineKind::Cpu), ..Default::default() }, 1).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let inputs = random_inputs(&g, 1);
        let got = run_cpu(&g, &inputs).unwrap();
        for (id, nd) in &got {
            assert!(nd.data.iter().all(|v| v.is_finite()), "{}: {} has a non-finite value", case.name, g.desc(*id).name);
        }
        assert!(!outs.is_empty());
    }
}
