//! RNN cases: every cell mode, one and two layers, both directions, the four bias modes, the
//! three layouts, per-sample lengths (a zero among them), LSTM projection and clipping, dropout
//! between layers, f32, f16, bf16 and f64; odd sizes (input 7, hidden 13, batch 5, T 9, and
//! input 70, hidden 40, batch 7, T 20 past the GEMM kernels' tiles).
//! Training cases chain the forward (y, hy, cy and the reserve), backward data (dx, dhx, dcx,
//! the gate gradients) and backward weights (dw, some onto dw_in), so the backward passes read a
//! reserve the forward wrote; inference cases check the forward alone. The `wgrad_fast` cases
//! (f16, bf16: the tensor-core weight gradient) also run the backward weights alone on random
//! reserves and gate gradients. Weights are the random
//! inputs scaled by 1/sqrt(hidden), as PyTorch initializes them.

use super::Case;
use crate::graph::ops::pointwise::PointwiseMode;
use crate::graph::ops::rnn::{RnnBackwardInputs, RnnBiasMode, RnnDesc, RnnInputs, RnnLayout, RnnMode};
use crate::{DataType, Graph, TensorDesc, TensorId};

/// How the lengths are given.
#[derive(Clone, Copy, PartialEq)]
enum Lens {
    /// No `seq_lengths`: every sample has T steps.
    Full,
    /// `max(T - |x|, 0)` for a random integer x in [-4, 4] (some shorter, 0 when T <= 4).
    Random,
    /// `max(T - 2 i, 0)` for sample i: non-increasing, as the packed layout needs.
    Decreasing,
}

#[derive(Clone)]
struct Spec {
    name: String,
    desc: RnnDesc,
    dt: DataType,
    lens: Lens,
    /// x with a gap after each vector (non-packed strides).
    strided_x: bool,
    /// Backward weights onto a dw_in.
    accumulate: bool,
    /// Initial states given.
    states: bool,
}

fn spec(name: &str, desc: RnnDesc) -> Spec {
    Spec { name: name.into(), desc, dt: DataType::F32, lens: Lens::Random, strided_x: false, accumulate: false, states: true }
}

fn int_scalar(g: &mut Graph, name: &str, v: f64) -> TensorId {
    g.tensor(TensorDesc::scalar(name, v, DataType::I32))
}

fn lengths(g: &mut Graph, s: &Spec) -> Option<TensorId> {
    let (b, t) = (s.desc.batch, s.desc.max_seq_length);
    let i32_ = |g: &mut Graph, id: TensorId| {
        g.desc_mut(id).data_type = Some(DataType::I32);
        id
    };
    let sub = match s.lens {
        Lens::Full => return None,
        Lens::Random => {
            let x = g.tensor(TensorDesc::new("len_x", &[b], DataType::I32));
            let a = g.pointwise(PointwiseMode::Abs, &[x]);
            i32_(g, a)
        }
        Lens::Decreasing => {
            let x = g.tensor(TensorDesc::new("len_x", &[b], DataType::I32));
            let i = g.pointwise(PointwiseMode::GenIndex { axis: 0 }, &[x]);
            let i = i32_(g, i);
            let two = int_scalar(g, "len_two", 2.0);
            let m = g.mul(i, two);
            i32_(g, m)
        }
    };
    let top = int_scalar(g, "len_t", t as f64);
    let l = g.sub(top, sub);
    let l = i32_(g, l);
    let zero = int_scalar(g, "len_zero", 0.0);
    let y = g.pointwise(PointwiseMode::Max, &[l, zero]);
    Some(i32_(g, y))
}

/// The forward's inputs: x, the scaled weights, hx, cx, lengths, seed and offset.
struct Inputs {
    x: TensorId,
    w: TensorId,
    hx: Option<TensorId>,
    cx: Option<TensorId>,
    len: Option<TensorId>,
}

/// The input sequence `x` (with a gap after each vector when `strided_x`).
fn x_tensor(g: &mut Graph, s: &Spec) -> TensorId {
    let a = &s.desc;
    let xd = a.seq_dims(a.input_size);
    let mut xt = TensorDesc::new("x", &xd, s.dt);
    if s.strided_x {
        // Each vector padded to input_size + 3 elements.
        let mut strides = vec![0i64; xd.len()];
        let mut acc = 1;
        for i in (0..xd.len()).rev() {
            strides[i] = acc;
            acc *= if i + 1 == xd.len() { xd[i] + 3 } else { xd[i] };
        }
        xt = xt.with_strides(&strides);
    }
    g.tensor(xt)
}

fn inputs(g: &mut Graph, s: &Spec) -> (Inputs, RnnInputs) {
    let a = &s.desc;
    let dt = s.dt;
    let x = x_tensor(g, s);
    let raw = g.tensor(TensorDesc::new("w_raw", &[a.weight_space_elements()], dt));
    let k = g.tensor(TensorDesc::scalar("w_scale", 1.0 / (a.hidden_size as f64).sqrt(), DataType::F32));
    let w = g.mul(raw, k);
    g.desc_mut(w).data_type = Some(dt);
    let lstm = a.cell_mode == RnnMode::Lstm;
    let hx = s.states.then(|| g.tensor(TensorDesc::new("hx", &[a.pseudo_layers(), a.batch, a.proj()], dt)));
    let cx = (s.states && lstm).then(|| g.tensor(TensorDesc::new("cx", &[a.pseudo_layers(), a.batch, a.hidden_size], dt)));
    let len = lengths(g, s);
    let (seed, offset) = if a.has_dropout() {
        (Some(g.tensor(TensorDesc::scalar("seed", 1_099_511_627_813.0, DataType::I64))), Some(g.tensor(TensorDesc::scalar("offset", 3.0, DataType::I64))))
    } else {
        (None, None)
    };
    (Inputs { x, w, hx, cx, len }, RnnInputs { hx, cx, seq_lengths: len, seed, offset })
}

/// The forward alone (inference, or training with the reserve as an output).
fn forward(s: &Spec) -> Case {
    let mut g = Graph::new(format!("rnn_{}", s.name)).io_data_type(s.dt);
    let (inp, ri) = inputs(&mut g, s);
    let o = g.rnn(inp.x, inp.w, ri, s.desc.clone());
    for t in [Some(o.y), Some(o.hy), o.cy, o.reserve].into_iter().flatten() {
        g.set_output(t);
    }
    Case::new(g.name.clone(), g)
}

/// Forward, backward data and backward weights.
fn training(s: &Spec) -> Case {
    let a = &s.desc;
    let dt = s.dt;
    let mut g = Graph::new(format!("rnn_{}", s.name)).io_data_type(dt);
    let (inp, ri) = inputs(&mut g, s);
    let o = g.rnn(inp.x, inp.w, ri, a.clone());
    let reserve = o.reserve.expect("training");
    for t in [Some(o.y), Some(o.hy), o.cy, Some(reserve)].into_iter().flatten() {
        g.set_output(t);
    }
    let lstm = a.cell_mode == RnnMode::Lstm;
    let dy = g.tensor(TensorDesc::new("dy", &a.seq_dims(a.out_size()), dt));
    let dhy = g.tensor(TensorDesc::new("dhy", &[a.pseudo_layers(), a.batch, a.proj()], dt));
    let dcy = lstm.then(|| g.tensor(TensorDesc::new("dcy", &[a.pseudo_layers(), a.batch, a.hidden_size], dt)));
    let gr = g.rnn_backward_data(dy, inp.w, reserve, RnnBackwardInputs { hx: inp.hx, cx: inp.cx, dhy: Some(dhy), dcy, seq_lengths: inp.len }, a.clone());
    for t in [Some(gr.dx), Some(gr.dhx), gr.dcx, Some(gr.dgates)].into_iter().flatten() {
        g.set_output(t);
    }
    let dw_in = s.accumulate.then(|| g.tensor(TensorDesc::new("dw_in", &[a.weight_space_elements()], dt)));
    let dw = g.rnn_backward_weights(inp.x, reserve, gr.dgates, inp.hx, inp.len, dw_in, a.clone());
    g.set_output(dw);
    Case::new(g.name.clone(), g)
}

fn base(mode: RnnMode) -> RnnDesc {
    RnnDesc::new(mode, 7, 13, 9, 5)
}

fn mode_name(m: RnnMode) -> &'static str {
    m.name()
}

pub fn cases() -> Vec<Case> {
    let modes = [RnnMode::Relu, RnnMode::Tanh, RnnMode::Lstm, RnnMode::Gru];
    let mut v = Vec::new();
    // Every mode, direction and depth: training chains, random lengths.
    for m in modes {
        for bi in [false, true] {
            for layers in [1, 2] {
                let mut d = base(m).layers(layers).training();
                if bi {
                    d = d.bidirectional();
                }
                let name = format!("{}_{}_{layers}l_train", mode_name(m), if bi { "bi" } else { "uni" });
                v.push(training(&spec(&name, d)));
            }
        }
    }
    // Inference: no initial states, every sample full length, then short ones.
    for m in modes {
        let mut s = spec(&format!("{}_infer", mode_name(m)), base(m).layers(2).bidirectional());
        s.states = false;
        s.lens = Lens::Full;
        v.push(forward(&s));
        let s = spec(&format!("{}_infer_short", mode_name(m)), RnnDesc { max_seq_length: 4, ..base(m) });
        v.push(forward(&s));
    }
    // Bias modes.
    for m in [RnnMode::Lstm, RnnMode::Gru, RnnMode::Tanh] {
        for (bias, bn) in [(RnnBiasMode::NoBias, "nobias"), (RnnBiasMode::SingleInp, "inpbias"), (RnnBiasMode::SingleRec, "recbias")] {
            v.push(training(&spec(&format!("{}_{bn}_train", mode_name(m)), base(m).with_bias(bias).training())));
        }
    }
    // Layouts: packed (decreasing lengths) and batch-major, and a strided x.
    for m in [RnnMode::Lstm, RnnMode::Gru] {
        let mut s = spec(&format!("{}_packed_train", mode_name(m)), base(m).layers(2).bidirectional().with_layout(RnnLayout::SeqMajorPacked).training());
        s.lens = Lens::Decreasing;
        v.push(training(&s));
        let s = spec(&format!("{}_batch_major_train", mode_name(m)), base(m).layers(2).bidirectional().with_layout(RnnLayout::BatchMajorUnpacked).training());
        v.push(training(&s));
    }
    let mut s = spec("tanh_packed_full_infer", base(RnnMode::Tanh).with_layout(RnnLayout::SeqMajorPacked));
    s.lens = Lens::Full;
    v.push(forward(&s));
    let mut s = spec("gru_strided_x_train", base(RnnMode::Gru).layers(2).training());
    s.strided_x = true;
    v.push(training(&s));
    // LSTM projection and clipping.
    v.push(training(&spec("lstmp_uni_train", base(RnnMode::Lstm).with_proj(5).training())));
    v.push(training(&spec("lstmp_bi_2l_clip_train", base(RnnMode::Lstm).layers(2).bidirectional().with_proj(6).with_clip(-0.4, 0.3, false).training())));
    v.push(training(&spec("lstm_clip_nan_train", base(RnnMode::Lstm).with_clip(-0.5, 0.5, true).training())));
    // Dropout between layers (masks from Philox, kept in the reserve).
    v.push(training(&spec("lstm_bi_3l_dropout_train", RnnDesc { dropout: Some(0.3), ..base(RnnMode::Lstm).layers(3).bidirectional().training() })));
    v.push(training(&spec("gru_2l_dropout_train", RnnDesc { dropout: Some(0.5), ..base(RnnMode::Gru).layers(2).training() })));
    v.push(forward(&spec("lstm_2l_dropout_infer", RnnDesc { dropout: Some(0.3), ..base(RnnMode::Lstm).layers(2) })));
    // Accumulation into dw_in, and a padding fill.
    let mut s = spec("gru_bi_accumulate_train", RnnDesc { padding_fill: -2.5, ..base(RnnMode::Gru).bidirectional().training() });
    s.accumulate = true;
    v.push(training(&s));
    // Sizes past one 64 x 64 GEMM tile and one 16-deep slice (the tiled kernels' edges).
    v.push(training(&spec("lstmp_bi_2l_big_train", RnnDesc::new(RnnMode::Lstm, 70, 40, 20, 7).layers(2).bidirectional().with_proj(33).training())));
    let mut s = spec("gru_2l_big_packed_train", RnnDesc::new(RnnMode::Gru, 70, 40, 20, 7).layers(2).with_layout(RnnLayout::SeqMajorPacked).training());
    s.lens = Lens::Decreasing;
    v.push(training(&s));
    // Other types.
    for (dt, tn) in [(DataType::F16, "f16"), (DataType::Bf16, "bf16")] {
        for m in [RnnMode::Lstm, RnnMode::Gru] {
            let mut s = spec(&format!("{}_bi_2l_{tn}_train", mode_name(m)), base(m).layers(2).bidirectional().training());
            s.dt = dt;
            v.push(training(&s));
        }
        let mut s = spec(&format!("lstmp_{tn}_infer"), base(RnnMode::Lstm).with_proj(5));
        s.dt = dt;
        v.push(forward(&s));
    }
    let mut s = spec("lstm_bi_2l_f64_train", base(RnnMode::Lstm).layers(2).bidirectional().training());
    s.dt = DataType::F64;
    v.push(training(&s));
    v.extend(persistent_cases());
    v.extend(wgrad_fast_cases());
    v
}

/// The backward weights alone, on random `reserve` and `dgates` (of type `scratch`; random past
/// each sample's length too, which it must skip) and optional `hx`, lengths and `dw_in`, with
/// `dw` of type `dw` (None: `dw_in`'s, else the data's).
fn wgrad_alone(s: &Spec, scratch: DataType, dw: Option<DataType>) -> Case {
    let a = &s.desc;
    let mut g = Graph::new(format!("rnn_{}", s.name)).io_data_type(s.dt);
    let x = x_tensor(&mut g, s);
    let reserve = g.tensor(TensorDesc::new("reserve", &[a.reserve_elements()], scratch));
    let dgates = g.tensor(TensorDesc::new("dgates", &[a.dgates_elements()], scratch));
    let hx = s.states.then(|| g.tensor(TensorDesc::new("hx", &[a.pseudo_layers(), a.batch, a.proj()], s.dt)));
    let len = lengths(&mut g, s);
    let dw_in = s.accumulate.then(|| g.tensor(TensorDesc::new("dw_in", &[a.weight_space_elements()], dw.unwrap_or(s.dt))));
    let out = g.rnn_backward_weights(x, reserve, dgates, hx, len, dw_in, a.clone());
    if let Some(dt) = dw {
        g.desc_mut(out).data_type = Some(dt);
    }
    g.set_output(out);
    Case::new(g.name.clone(), g)
}

/// f16 and bf16 weight gradients, which the tensor-core path takes (rnn/persist_wgrad.rs): LSTM,
/// GRU, tanh and relu; one and two layers, both directions; every layout with variable lengths;
/// hx given and absent; dw_in given; reserve and dgates in f32 and in 16 bits, dw of another type
/// than the data; every bias mode; odd sizes (input 13, hidden 40, batch 5, T 7) and a larger
/// problem (hidden 256, batch 32, T 33). Mostly the backward weights alone on random inputs,
/// then two training chains (the forward's reserve and the backward data's dgates).
fn wgrad_fast_cases() -> Vec<Case> {
    let mut v = Vec::new();
    let odd = |m: RnnMode| RnnDesc::new(m, 13, 40, 7, 5).training();
    let with = |name: &str, desc: RnnDesc, dt: DataType, lens: Lens, states: bool, accumulate: bool| {
        let mut s = spec(name, desc);
        s.dt = dt;
        s.lens = lens;
        s.states = states;
        s.accumulate = accumulate;
        s
    };
    let (f16, bf16, f32) = (DataType::F16, DataType::Bf16, DataType::F32);
    let s = with("wgrad_fast_lstm_bi_2l_f16", odd(RnnMode::Lstm).layers(2).bidirectional(), f16, Lens::Random, true, false);
    v.push(wgrad_alone(&s, f32, None));
    let s = with("wgrad_fast_gru_bi_2l_packed_nohx_bf16", odd(RnnMode::Gru).layers(2).bidirectional().with_layout(RnnLayout::SeqMajorPacked), bf16, Lens::Decreasing, false, false);
    v.push(wgrad_alone(&s, f32, None));
    let s = with("wgrad_fast_tanh_2l_batch_major_accumulate_f16", odd(RnnMode::Tanh).layers(2).with_layout(RnnLayout::BatchMajorUnpacked), f16, Lens::Random, true, true);
    v.push(wgrad_alone(&s, f32, None));
    let s = with("wgrad_fast_lstm_f16_scratch_f32_dw_accumulate", odd(RnnMode::Lstm), f16, Lens::Full, true, true);
    v.push(wgrad_alone(&s, f16, Some(f32)));
    let s = with("wgrad_fast_gru_recbias_bi_bf16_scratch", odd(RnnMode::Gru).with_bias(RnnBiasMode::SingleRec).bidirectional(), bf16, Lens::Random, true, false);
    v.push(wgrad_alone(&s, bf16, Some(f32)));
    let mut s = with("wgrad_fast_lstm_inpbias_strided_x_bf16", odd(RnnMode::Lstm).with_bias(RnnBiasMode::SingleInp).layers(2), bf16, Lens::Random, false, true);
    s.strided_x = true;
    v.push(wgrad_alone(&s, f32, None));
    let s = with(
        "wgrad_fast_relu_nobias_bi_batch_major_f16",
        odd(RnnMode::Relu).with_bias(RnnBiasMode::NoBias).bidirectional().with_layout(RnnLayout::BatchMajorUnpacked),
        f16,
        Lens::Random,
        false,
        false,
    );
    v.push(wgrad_alone(&s, f32, None));
    let s = with("wgrad_fast_lstm_bi_2l_h256_f16", RnnDesc::new(RnnMode::Lstm, 64, 256, 33, 32).layers(2).bidirectional().training(), f16, Lens::Random, true, true);
    v.push(wgrad_alone(&s, f32, None));
    // Training chains: forward, backward data, backward weights (onto dw_in for the LSTM).
    v.push(training(&with("wgrad_fast_lstm_bi_2l_train_f16", odd(RnnMode::Lstm).layers(2).bidirectional(), f16, Lens::Random, true, true)));
    v.push(training(&with("wgrad_fast_gru_bi_packed_train_bf16", odd(RnnMode::Gru).bidirectional().with_layout(RnnLayout::SeqMajorPacked), bf16, Lens::Decreasing, false, false)));
    v
}

/// f16 and bf16 problems, which the fast forward takes (the projection GEMMs and the persistent
/// recurrence, rnn/persist.rs), chained to the backward where they train: batches of
/// several 16-row tiles and more than 8 of them (a second pass of the warps), states split over
/// several k steps a warp, a block's units past the hidden size, three layers (both sequence
/// buffers), every layout, bias mode and clipping. Their training chains take the persistent
/// backward data too (rnn/persist_bwd.rs).
fn persistent_cases() -> Vec<Case> {
    let mut v = Vec::new();
    let with = |name: &str, desc: RnnDesc, dt: DataType| {
        let mut s = spec(name, desc);
        s.dt = dt;
        s
    };
    for m in [RnnMode::Relu, RnnMode::Tanh, RnnMode::Lstm, RnnMode::Gru] {
        v.push(training(&with(&format!("{}_persist_bi_2l_f16_train", mode_name(m)), RnnDesc::new(m, 24, 40, 11, 37).layers(2).bidirectional().training(), DataType::F16)));
    }
    let mut s = with("lstm_persist_3l_batch_major_bf16_infer", RnnDesc::new(RnnMode::Lstm, 33, 72, 7, 20).layers(3).with_layout(RnnLayout::BatchMajorUnpacked), DataType::Bf16);
    s.states = false;
    v.push(forward(&s));
    let mut s = with("gru_persist_packed_bf16_train", RnnDesc::new(RnnMode::Gru, 16, 24, 9, 9).with_layout(RnnLayout::SeqMajorPacked).training(), DataType::Bf16);
    s.lens = Lens::Decreasing;
    v.push(training(&s));
    let mut s = with("relu_persist_b130_f16_infer", RnnDesc::new(RnnMode::Relu, 8, 24, 5, 130), DataType::F16);
    s.lens = Lens::Full;
    v.push(forward(&s));
    v.push(forward(&with("tanh_persist_h200_f16_infer", RnnDesc::new(RnnMode::Tanh, 40, 200, 6, 3), DataType::F16)));
    v.push(training(&with("lstm_persist_clip_f16_train", RnnDesc::new(RnnMode::Lstm, 12, 30, 8, 6).with_clip(-0.4, 0.3, false).training(), DataType::F16)));
    v.push(training(&with("lstm_persist_recbias_bf16_train", base(RnnMode::Lstm).with_bias(RnnBiasMode::SingleRec).training(), DataType::Bf16)));
    v.push(training(&with("gru_persist_nobias_bi_f16_train", base(RnnMode::Gru).with_bias(RnnBiasMode::NoBias).bidirectional().training(), DataType::F16)));
    let mut s = with("gru_persist_strided_x_f16_train", base(RnnMode::Gru).layers(2).training(), DataType::F16);
    s.strided_x = true;
    v.push(training(&s));
    // The persistent backward data (rnn/persist_bwd.rs): a batch of 9 16-row tiles (every warp
    // along the batch), gate gradients over several k steps a warp (GRU 200: 600 of them),
    // three layers batch-major without initial states, samples of length 0 (T 3), full lengths.
    let mut s = with("lstm_persist_b130_f16_train", RnnDesc::new(RnnMode::Lstm, 8, 24, 5, 130).training(), DataType::F16);
    s.lens = Lens::Full;
    v.push(training(&s));
    v.push(training(&with("gru_persist_h200_bf16_train", RnnDesc::new(RnnMode::Gru, 40, 200, 6, 3).training(), DataType::Bf16)));
    let mut s =
        with("tanh_persist_3l_batch_major_f16_train", RnnDesc::new(RnnMode::Tanh, 33, 72, 7, 20).layers(3).with_layout(RnnLayout::BatchMajorUnpacked).training(), DataType::F16);
    s.states = false;
    v.push(training(&s));
    v.push(training(&with("lstm_persist_short_bi_bf16_train", RnnDesc::new(RnnMode::Lstm, 9, 40, 3, 11).bidirectional().training(), DataType::Bf16)));
    v
}
