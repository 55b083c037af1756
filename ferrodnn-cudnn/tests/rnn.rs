//! The RNN v8 calls on a CPU handle: forward (training and inference), backward data and
//! backward weights for every cell, bidirectional, stacked, LSTMP, clipped, with dropout, in
//! each data layout with varying lengths, each against the same problem run through ferrodnn's
//! graph API on its f64 reference engine; the weight-params pointers against a one-step LSTM
//! computed by hand; and the status codes of bad calls.

mod common;

use common::*;
use ferrodnn::graph::ops::rnn::{RnnBackwardInputs, RnnBiasMode, RnnDesc, RnnInputs, RnnLayout, RnnMode};
use ferrodnn::layout::Nd;
use ferrodnn::{DataType, Graph, TensorDesc, TensorId};
use ferrodnn_cudnn::desc::*;
use ferrodnn_cudnn::dropout::*;
use ferrodnn_cudnn::rnn::*;
use ferrodnn_cudnn::types::*;
use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr::{null, null_mut};

/// One problem: the cell and sizes, and the data's layout and lengths.
#[derive(Clone, Debug)]
struct Case {
    mode: i32,
    bidir: bool,
    layers: i32,
    input: i32,
    hidden: i32,
    proj: i32,
    bias: i32,
    layout: i32,
    t: i32,
    lens: Vec<i32>,
    fill: Option<f32>,
    clip: Option<(f64, f64)>,
    dropout: f32,
    /// Made as PyTorch's cuDNN RNN path makes it (aten/src/ATen/native/cudnn/RNN.cpp): 5-d
    /// state descriptors `[layers * dirs, batch, size, 1, 1]`, no-dropout descriptor without
    /// states, FMA math, the weight params walked as its get_parameters walks them, the temp
    /// sizes asked with a null reserve size, and an inference forward beside the training one.
    torch: bool,
}

impl Case {
    fn new(mode: i32, input: i32, hidden: i32, t: i32, batch: i32) -> Case {
        Case {
            mode,
            bidir: false,
            layers: 1,
            input,
            hidden,
            proj: 0,
            bias: CUDNN_RNN_DOUBLE_BIAS,
            layout: CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED,
            t,
            lens: vec![t; batch as usize],
            fill: None,
            clip: None,
            dropout: 0.0,
            torch: false,
        }
    }
    fn dirs(&self) -> i32 {
        if self.bidir {
            2
        } else {
            1
        }
    }
    fn p(&self) -> i32 {
        if self.proj == 0 {
            self.hidden
        } else {
            self.proj
        }
    }
    fn batch(&self) -> i32 {
        self.lens.len() as i32
    }
    fn lstm(&self) -> bool {
        self.mode == CUDNN_LSTM
    }
    /// Vectors the caller's sequence buffers hold.
    fn rows(&self) -> usize {
        if self.layout == CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED {
            self.lens.iter().map(|&l| l as usize).sum()
        } else {
            (self.t * self.batch()) as usize
        }
    }
    /// The graph op's descriptor, written independently of the library's mapping.
    fn desc(&self, training: bool) -> RnnDesc {
        let mode = [RnnMode::Relu, RnnMode::Tanh, RnnMode::Lstm, RnnMode::Gru][self.mode as usize];
        let mut d = RnnDesc::new(mode, self.input as i64, self.hidden as i64, self.t as i64, self.batch() as i64).layers(self.layers as i64);
        if self.bidir {
            d = d.bidirectional();
        }
        if self.proj != 0 && self.proj != self.hidden {
            d = d.with_proj(self.proj as i64);
        }
        d = d.with_bias([RnnBiasMode::NoBias, RnnBiasMode::SingleInp, RnnBiasMode::Double, RnnBiasMode::SingleRec][self.bias as usize]);
        d = d.with_layout([RnnLayout::SeqMajorUnpacked, RnnLayout::SeqMajorPacked, RnnLayout::BatchMajorUnpacked][self.layout as usize]);
        if let Some((l, u)) = self.clip {
            d = d.with_clip(l, u, false);
        }
        if training && self.dropout > 0.0 && self.layers > 1 {
            d.dropout = Some(self.dropout as f64);
        }
        d.padding_fill = self.fill.unwrap_or(0.0) as f64;
        d.training = training;
        d
    }
}

/// The library's descriptors for a case.
struct Descs {
    rnn: cudnnRNNDescriptor_t,
    x: cudnnRNNDataDescriptor_t,
    y: cudnnRNNDataDescriptor_t,
    h: cudnnTensorDescriptor_t,
    c: cudnnTensorDescriptor_t,
    drop: cudnnDropoutDescriptor_t,
    _states: Vec<u8>,
}

impl Drop for Descs {
    fn drop(&mut self) {
        ok(cudnnDestroyRNNDescriptor(self.rnn));
        ok(cudnnDestroyRNNDataDescriptor(self.x));
        ok(cudnnDestroyRNNDataDescriptor(self.y));
        ok(cudnnDestroyTensorDescriptor(self.h));
        ok(cudnnDestroyTensorDescriptor(self.c));
        ok(cudnnDestroyDropoutDescriptor(self.drop));
    }
}

const SEED: u64 = 1234;

fn data_desc(c: &Case, vector: i32) -> cudnnRNNDataDescriptor_t {
    let mut d = null_mut();
    ok(cudnnCreateRNNDataDescriptor(&mut d));
    let mut fill = c.fill.unwrap_or(0.0);
    let fill_ptr = if c.fill.is_some() { &mut fill as *mut f32 as *mut c_void } else { null_mut() };
    ok(cudnnSetRNNDataDescriptor(d, CUDNN_DATA_FLOAT, c.layout, c.t, c.batch(), vector, c.lens.as_ptr(), fill_ptr));
    d
}

fn descs(h: &Handle, c: &Case) -> Descs {
    let mut drop = null_mut();
    ok(cudnnCreateDropoutDescriptor(&mut drop));
    let mut states = vec![0u8; 64];
    if c.torch {
        // PyTorch's set_no_dropout: no states at all.
        ok(cudnnSetDropoutDescriptor(drop, h.0, 0.0, null_mut(), 0, 0));
    } else {
        ok(cudnnSetDropoutDescriptor(drop, h.0, c.dropout, states.as_mut_ptr() as *mut c_void, states.len(), SEED));
    }
    let mut rnn = null_mut();
    ok(cudnnCreateRNNDescriptor(&mut rnn));
    ok(cudnnSetRNNDescriptor_v8(
        rnn,
        0,
        c.mode,
        c.bias,
        if c.bidir { CUDNN_BIDIRECTIONAL } else { CUDNN_UNIDIRECTIONAL },
        CUDNN_LINEAR_INPUT,
        CUDNN_DATA_FLOAT,
        CUDNN_DATA_FLOAT,
        if c.torch { CUDNN_FMA_MATH } else { CUDNN_DEFAULT_MATH },
        c.input,
        c.hidden,
        if c.torch && c.proj == 0 { c.hidden } else { c.proj },
        c.layers,
        drop,
        CUDNN_RNN_PADDED_IO_ENABLED,
    ));
    if let Some((l, u)) = c.clip {
        ok(cudnnRNNSetClip_v8(rnn, CUDNN_RNN_CLIP_MINMAX, CUDNN_NOT_PROPAGATE_NAN, l, u));
    }
    let ld = c.layers * c.dirs();
    let state = |size: i32| {
        if c.torch {
            // TensorDescriptor::set(t, 5): the contiguous tensor's dims and strides padded with 1s.
            tdesc(CUDNN_DATA_FLOAT, &[ld, c.batch(), size, 1, 1], &[c.batch() * size, size, 1, 1, 1])
        } else {
            f32_tensor(&[ld, c.batch(), size], false)
        }
    };
    Descs { rnn, x: data_desc(c, c.input), y: data_desc(c, c.dirs() * c.p()), h: state(c.p()), c: state(c.hidden), drop, _states: states }
}

/// PyTorch's get_parameters: every pseudo-layer's matrices, then biases, each read back as a
/// tensor of at most 3 dims; within each half (input, recurrent) the gates' blocks must follow
/// one another, as it asserts.
fn torch_weight_params(h: &Handle, d: &Descs, c: &Case, w: &[f32], wbytes: usize) {
    let lin = match c.mode {
        CUDNN_LSTM => 8,
        CUDNN_GRU => 6,
        _ => 2,
    };
    for layer in 0..c.layers * c.dirs() {
        for matrix in [true, false] {
            let mut cur = 0usize;
            for id in 0..lin {
                let md = tdesc(CUDNN_DATA_FLOAT, &[1, 1, 1], &[1, 1, 1]);
                let mut addr = null_mut();
                if matrix {
                    ok(cudnnGetRNNWeightParams(h.0, d.rnn, layer, wbytes, p(w), id, md, &mut addr, null_mut(), null_mut()));
                } else {
                    ok(cudnnGetRNNWeightParams(h.0, d.rnn, layer, wbytes, p(w), id, null_mut(), null_mut(), md, &mut addr));
                }
                let (mut dt, mut nb) = (0, 0);
                let (mut dims, mut strides) = ([0i32; 3], [0i32; 5]);
                ok(cudnnGetTensorNdDescriptor(md, 3, &mut dt, &mut nb, dims.as_mut_ptr(), strides.as_mut_ptr()));
                assert!(nb <= 3, "layer {layer} id {id}: {nb} dims");
                let off = (addr as usize - w.as_ptr() as usize) / 4;
                assert_eq!((addr as usize - w.as_ptr() as usize) % 4, 0);
                if id != 0 && id != lin / 2 {
                    assert_eq!(off, cur, "layer {layer} lin id {id} (matrix {matrix}): not right after the previous gate");
                }
                cur = off + dims[..nb as usize].iter().map(|&v| v as usize).product::<usize>();
                ok(cudnnDestroyTensorDescriptor(md));
            }
        }
    }
}

/// What one training step through the library gives, and what it was given.
struct Run {
    x: Vec<f32>,
    w: Vec<f32>,
    hx: Vec<f32>,
    cx: Vec<f32>,
    dy: Vec<f32>,
    dhy: Vec<f32>,
    dcy: Vec<f32>,
    dw0: Vec<f32>,
    y: Vec<f32>,
    hy: Vec<f32>,
    cy: Vec<f32>,
    dx: Vec<f32>,
    dhx: Vec<f32>,
    dcx: Vec<f32>,
    dw: Vec<f32>,
}

fn run_library(c: &Case) -> Run {
    let h = Handle::cpu();
    let d = descs(&h, c);
    let mut wbytes = 0usize;
    ok(cudnnGetRNNWeightSpaceSize(h.0, d.rnn, &mut wbytes));
    let (mut ws_bytes, mut reserve_bytes) = (0usize, 0usize);
    ok(cudnnGetRNNTempSpaceSizes(h.0, d.rnn, CUDNN_FWD_MODE_TRAINING, d.x, &mut ws_bytes, &mut reserve_bytes));
    let nw = wbytes / 4;
    let (b, ld) = (c.batch() as usize, (c.layers * c.dirs()) as usize);
    let (hn, cn) = (ld * b * c.p() as usize, ld * b * c.hidden as usize);
    let yn = c.rows() * (c.dirs() * c.p()) as usize;
    let x = rand(c.rows() * c.input as usize, 1);
    let w: Vec<f32> = rand(nw, 2).iter().map(|v| v * 0.5).collect();
    let (hx, cx) = (rand(hn, 3), rand(cn, 4));
    let (dy, dhy, dcy) = (rand(yn, 5), rand(hn, 6), rand(cn, 7));
    let dw0 = rand(nw, 8);
    let mut ws = vec![0u8; ws_bytes];
    let mut reserve = vec![0u8; reserve_bytes];
    let (mut y, mut hy, mut cy) = (vec![f32::NAN; yn], vec![f32::NAN; hn], vec![f32::NAN; cn]);
    let mut y_inference = vec![f32::NAN; yn];
    if c.torch {
        torch_weight_params(&h, &d, c, &w, wbytes);
        // The backward passes and the inference forward ask without a reserve size.
        let mut ws_inf = 0usize;
        ok(cudnnGetRNNTempSpaceSizes(h.0, d.rnn, CUDNN_FWD_MODE_INFERENCE, d.x, &mut ws_inf, null_mut()));
        let mut ws_train = 0usize;
        ok(cudnnGetRNNTempSpaceSizes(h.0, d.rnn, CUDNN_FWD_MODE_TRAINING, d.x, &mut ws_train, null_mut()));
        assert_eq!(ws_train, ws_bytes);
        let mut ws2 = vec![0u8; ws_inf];
        let (mut hy2, mut cy2) = (vec![0f32; hn], vec![0f32; cn]);
        let (cxp, cyp) = if c.lstm() { (p(&cx), pm(&mut cy2)) } else { (null(), null_mut()) };
        ok(cudnnRNNForward(
            h.0,
            d.rnn,
            CUDNN_FWD_MODE_INFERENCE,
            null(),
            d.x,
            p(&x),
            d.y,
            pm(&mut y_inference),
            d.h,
            p(&hx),
            pm(&mut hy2),
            d.c,
            cxp,
            cyp,
            wbytes,
            p(&w),
            ws_inf,
            ws2.as_mut_ptr() as *mut c_void,
            0,
            null_mut(),
        ));
    }
    let (cxp, cyp) = if c.lstm() { (p(&cx), pm(&mut cy)) } else { (null(), null_mut()) };
    ok(cudnnRNNForward(
        h.0,
        d.rnn,
        CUDNN_FWD_MODE_TRAINING,
        null(),
        d.x,
        p(&x),
        d.y,
        pm(&mut y),
        d.h,
        p(&hx),
        pm(&mut hy),
        d.c,
        cxp,
        cyp,
        wbytes,
        p(&w),
        ws_bytes,
        ws.as_mut_ptr() as *mut c_void,
        reserve_bytes,
        reserve.as_mut_ptr() as *mut c_void,
    ));
    let (mut dx, mut dhx, mut dcx) = (vec![f32::NAN; c.rows() * c.input as usize], vec![f32::NAN; hn], vec![f32::NAN; cn]);
    let (dcyp, dcxp) = if c.lstm() { (p(&dcy), pm(&mut dcx)) } else { (null(), null_mut()) };
    ok(cudnnRNNBackwardData_v8(
        h.0,
        d.rnn,
        null(),
        d.y,
        p(&y),
        p(&dy),
        d.x,
        pm(&mut dx),
        d.h,
        p(&hx),
        p(&dhy),
        pm(&mut dhx),
        d.c,
        cxp,
        dcyp,
        dcxp,
        wbytes,
        p(&w),
        ws_bytes,
        ws.as_mut_ptr() as *mut c_void,
        reserve_bytes,
        reserve.as_mut_ptr() as *mut c_void,
    ));
    let mut dw = dw0.clone();
    ok(cudnnRNNBackwardWeights_v8(
        h.0,
        d.rnn,
        CUDNN_WGRAD_MODE_ADD,
        null(),
        d.x,
        p(&x),
        d.h,
        p(&hx),
        d.y,
        p(&y),
        wbytes,
        pm(&mut dw),
        ws_bytes,
        ws.as_mut_ptr() as *mut c_void,
        reserve_bytes,
        reserve.as_mut_ptr() as *mut c_void,
    ));
    if c.torch {
        assert_eq!(y_inference, y, "{c:?}: the inference forward gives the training forward's y");
    }
    Run { x, w, hx, cx, dy, dhy, dcy, dw0, y, hy, cy, dx, dhx, dcx, dw }
}

fn nd(dims: &[i64], v: &[f32]) -> Nd {
    let n: usize = dims.iter().map(|&d| d as usize).product();
    let mut data: Vec<f64> = v.iter().map(|&x| x as f64).collect();
    data.resize(n, 0.0);
    Nd::new(dims.iter().map(|&d| d as usize).collect(), data)
}

/// The same step on ferrodnn's graph API, on the f64 reference engine: every output by name.
fn run_reference(c: &Case, r: &Run) -> HashMap<&'static str, Vec<f64>> {
    let a = c.desc(true);
    let f = DataType::F32;
    let mut g = Graph::new("rnn_reference").io_data_type(f);
    let mut inputs = HashMap::new();
    let mut add = |g: &mut Graph, name: &str, dims: &[i64], dt: DataType, v: Nd| -> TensorId {
        let t = g.tensor(TensorDesc::new(name, dims, dt));
        inputs.insert(t, v);
        t
    };
    let (xd, yd) = (a.seq_dims(a.input_size), a.seq_dims(a.out_size()));
    let hd = [a.pseudo_layers(), a.batch, a.proj()];
    let cd = [a.pseudo_layers(), a.batch, a.hidden_size];
    let nw = a.weight_space_elements();
    let x = add(&mut g, "x", &xd, f, nd(&xd, &r.x));
    let w = add(&mut g, "w", &[nw], f, nd(&[nw], &r.w));
    let hx = add(&mut g, "hx", &hd, f, nd(&hd, &r.hx));
    let cx = c.lstm().then(|| add(&mut g, "cx", &cd, f, nd(&cd, &r.cx)));
    let lens = add(&mut g, "lens", &[a.batch], DataType::I32, Nd::new(vec![a.batch as usize], c.lens.iter().map(|&l| l as f64).collect()));
    let (seed, offset) = if a.has_dropout() {
        (Some(add(&mut g, "seed", &[1], DataType::I64, Nd::new(vec![1], vec![SEED as f64]))), Some(add(&mut g, "offset", &[1], DataType::I64, Nd::new(vec![1], vec![0.0]))))
    } else {
        (None, None)
    };
    let dy = add(&mut g, "dy", &yd, f, nd(&yd, &r.dy));
    let dhy = add(&mut g, "dhy", &hd, f, nd(&hd, &r.dhy));
    let dcy = c.lstm().then(|| add(&mut g, "dcy", &cd, f, nd(&cd, &r.dcy)));
    let dw0 = add(&mut g, "dw0", &[nw], f, nd(&[nw], &r.dw0));
    let out = g.rnn(x, w, RnnInputs { hx: Some(hx), cx, seq_lengths: Some(lens), seed, offset }, a.clone());
    let reserve = out.reserve.expect("training gives a reserve");
    let bd = g.rnn_backward_data(dy, w, reserve, RnnBackwardInputs { hx: Some(hx), cx, dhy: Some(dhy), dcy, seq_lengths: Some(lens) }, a.clone());
    let dw = g.rnn_backward_weights(x, reserve, bd.dgates, Some(hx), Some(lens), Some(dw0), a.clone());
    let mut named = vec![("y", out.y), ("hy", out.hy), ("dx", bd.dx), ("dhx", bd.dhx), ("dw", dw)];
    if let (Some(cy), Some(dcx)) = (out.cy, bd.dcx) {
        named.extend([("cy", cy), ("dcx", dcx)]);
    }
    for &(_, t) in &named {
        g.set_output(t);
    }
    let res = ferrodnn::testing::run_cpu(&g, &inputs).expect("the reference graph runs");
    named.into_iter().map(|(n, t)| (n, res[&t].data.clone())).collect()
}

/// The library's step against the reference: every output, the sequences' valid rows.
fn check_case(c: &Case) {
    let r = run_library(c);
    let want = run_reference(c, &r);
    let seq = |n: &str, width: usize| want[n][..c.rows() * width].to_vec();
    let out = (c.dirs() * c.p()) as usize;
    let what = |n: &str| format!("{c:?}: {n}");
    close(&r.y, &seq("y", out), 1e-4, &what("y"));
    close(&r.hy, &want["hy"], 1e-4, &what("hy"));
    close(&r.dx, &seq("dx", c.input as usize), 1e-4, &what("dx"));
    close(&r.dhx, &want["dhx"], 1e-4, &what("dhx"));
    close(&r.dw, &want["dw"], 1e-4, &what("dw"));
    if c.lstm() {
        close(&r.cy, &want["cy"], 1e-4, &what("cy"));
        close(&r.dcx, &want["dcx"], 1e-4, &what("dcx"));
    }
    // The gradient is not the zero it would be were nothing accumulated.
    assert!(r.dw.iter().zip(&r.dw0).any(|(a, b)| (a - b).abs() > 1e-3), "{c:?}: dw is dw0 unchanged");
}

#[test]
fn every_cell_matches_the_reference() {
    for mode in [CUDNN_RNN_RELU, CUDNN_RNN_TANH, CUDNN_LSTM, CUDNN_GRU] {
        check_case(&Case::new(mode, 5, 6, 4, 3));
    }
}

#[test]
fn bidirectional_stacked_with_lengths_matches_the_reference() {
    for mode in [CUDNN_LSTM, CUDNN_GRU, CUDNN_RNN_TANH] {
        let mut c = Case::new(mode, 4, 5, 5, 3);
        c.bidir = true;
        c.layers = 2;
        c.lens = vec![5, 2, 4];
        c.fill = Some(0.25);
        check_case(&c);
    }
}

#[test]
fn lstm_with_projection_and_clipping_matches_the_reference() {
    let mut c = Case::new(CUDNN_LSTM, 4, 7, 4, 2);
    c.proj = 3;
    c.layers = 2;
    c.bidir = true;
    check_case(&c);
    let mut c = Case::new(CUDNN_LSTM, 3, 6, 5, 2);
    c.clip = Some((-0.3, 0.4));
    check_case(&c);
}

#[test]
fn packed_and_batch_major_layouts_match_the_reference() {
    let mut c = Case::new(CUDNN_GRU, 4, 5, 5, 4);
    c.layout = CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED;
    c.lens = vec![5, 5, 3, 1];
    c.bidir = true;
    check_case(&c);
    let mut c = Case::new(CUDNN_LSTM, 3, 4, 4, 3);
    c.layout = CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED;
    c.lens = vec![4, 2, 2];
    c.layers = 2;
    check_case(&c);
    let mut c = Case::new(CUDNN_RNN_RELU, 4, 5, 4, 3);
    c.layout = CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED;
    c.lens = vec![2, 4, 3];
    c.fill = Some(-1.0);
    check_case(&c);
}

#[test]
fn every_bias_mode_matches_the_reference() {
    for bias in [CUDNN_RNN_NO_BIAS, CUDNN_RNN_SINGLE_INP_BIAS, CUDNN_RNN_SINGLE_REC_BIAS] {
        let mut c = Case::new(CUDNN_LSTM, 3, 4, 3, 2);
        c.bias = bias;
        check_case(&c);
    }
}

#[test]
fn dropout_between_layers_matches_the_reference() {
    let mut c = Case::new(CUDNN_LSTM, 4, 5, 3, 2);
    c.layers = 3;
    c.dropout = 0.4;
    check_case(&c);
}

/// PyTorch's nn.LSTM and nn.GRU(32, 48, num_layers=2, bidirectional=True, batch_first=True) on
/// a batch of 5 sequences of 17 (scripts/torch_on_capi.py): batch_first is transposed to
/// sequence-major before cuDNN sees it, every length full.
#[test]
fn torch_lstm_and_gru_sequence_matches_the_reference() {
    for mode in [CUDNN_LSTM, CUDNN_GRU] {
        let mut c = Case::new(mode, 32, 48, 17, 5);
        c.bidir = true;
        c.layers = 2;
        c.torch = true;
        check_case(&c);
    }
}

/// Fills a one-step LSTM's weight space through cudnnGetRNNWeightParams from known matrices and
/// computes the step by hand.
#[test]
fn weight_params_place_each_matrix_where_the_forward_reads_it() {
    let h = Handle::cpu();
    let c = Case::new(CUDNN_LSTM, 2, 3, 1, 1);
    let d = descs(&h, &c);
    let mut wbytes = 0usize;
    ok(cudnnGetRNNWeightSpaceSize(h.0, d.rnn, &mut wbytes));
    assert_eq!(wbytes, 4 * (4 * 3 * 2 + 4 * 3 * 3 + 2 * 4 * 3), "LSTM 2 -> 3: W 4x3x2, R 4x3x3, two biases 4x3");
    let mut w = vec![f32::NAN; wbytes / 4];
    let base = w.as_mut_ptr() as usize;
    // Matrix `lin` (0-3 W_i, W_f, W_g, W_o; 4-7 R_*) holds 0.1 * (lin + 1) + 0.01 * element, its bias -0.05 * (lin + 1).
    let (m_desc, b_desc) = (f32_tensor(&[1, 1, 1], false), f32_tensor(&[1, 1, 1], false));
    for lin in 0..8 {
        let (mut m, mut b) = (null_mut(), null_mut());
        ok(cudnnGetRNNWeightParams(h.0, d.rnn, 0, wbytes, w.as_mut_ptr() as *const c_void, lin, m_desc, &mut m, b_desc, &mut b));
        let (mut dt, mut nb, mut dims, mut st) = (0, 0, [0i32; 3], [0i32; 3]);
        ok(cudnnGetTensorNdDescriptor(m_desc, 3, &mut dt, &mut nb, dims.as_mut_ptr(), st.as_mut_ptr()));
        assert_eq!(dims, [1, 3, if lin < 4 { 2 } else { 3 }], "matrix {lin}'s dims");
        let n = (dims[1] * dims[2]) as usize;
        let mo = (m as usize - base) / 4;
        for e in 0..n {
            w[mo + e] = 0.1 * (lin + 1) as f32 + 0.01 * e as f32;
        }
        ok(cudnnGetTensorNdDescriptor(b_desc, 3, &mut dt, &mut nb, dims.as_mut_ptr(), st.as_mut_ptr()));
        assert_eq!(dims, [1, 3, 1], "bias {lin}'s dims");
        let bo = (b as usize - base) / 4;
        for e in 0..3 {
            w[bo + e] = -0.05 * (lin + 1) as f32;
        }
    }
    assert!(w.iter().all(|v| v.is_finite()), "every element of the weight space belongs to one matrix or bias");
    let (x, hx, cx) = ([0.5f32, -1.0], [0.2f32, -0.1, 0.3], [0.1f32, 0.4, -0.2]);
    // By hand: gate g = act(W_g x + bW_g + R_g h + bR_g).
    let mat = |lin: usize, j: usize, k: usize, cols: usize| 0.1 * (lin + 1) as f64 + 0.01 * (j * cols + k) as f64;
    let pre = |g: usize, j: usize| {
        let wx: f64 = (0..2).map(|k| mat(g, j, k, 2) * x[k] as f64).sum();
        let rh: f64 = (0..3).map(|k| mat(g + 4, j, k, 3) * hx[k] as f64).sum();
        wx + rh - 0.05 * (g + 1) as f64 - 0.05 * (g + 5) as f64
    };
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    let mut want_h = vec![];
    let mut want_c = vec![];
    for j in 0..3 {
        let (i, f, g, o) = (sig(pre(0, j)), sig(pre(1, j)), pre(2, j).tanh(), sig(pre(3, j)));
        let cn = f * cx[j] as f64 + i * g;
        want_c.push(cn);
        want_h.push(o * cn.tanh());
    }
    let (mut ws_bytes, mut rs) = (0usize, 0usize);
    ok(cudnnGetRNNTempSpaceSizes(h.0, d.rnn, CUDNN_FWD_MODE_INFERENCE, d.x, &mut ws_bytes, &mut rs));
    assert_eq!(rs, 0, "inference needs no reserve space");
    let mut ws = vec![0u8; ws_bytes];
    let (mut y, mut hy, mut cy) = (vec![0f32; 3], vec![0f32; 3], vec![0f32; 3]);
    ok(cudnnRNNForward(
        h.0,
        d.rnn,
        CUDNN_FWD_MODE_INFERENCE,
        null(),
        d.x,
        p(&x),
        d.y,
        pm(&mut y),
        d.h,
        p(&hx),
        pm(&mut hy),
        d.c,
        p(&cx),
        pm(&mut cy),
        wbytes,
        p(&w),
        ws_bytes,
        ws.as_mut_ptr() as *mut c_void,
        0,
        null_mut(),
    ));
    close(&y, &want_h, 1e-5, "y");
    close(&hy, &want_h, 1e-5, "hy");
    close(&cy, &want_c, 1e-5, "cy");
    ok(cudnnDestroyTensorDescriptor(m_desc));
    ok(cudnnDestroyTensorDescriptor(b_desc));
}

#[test]
fn descriptors_read_back_what_was_set() {
    let h = Handle::cpu();
    let mut c = Case::new(CUDNN_GRU, 3, 5, 4, 3);
    c.lens = vec![4, 1, 3];
    c.fill = Some(2.5);
    c.bidir = true;
    let d = descs(&h, &c);
    let (mut algo, mut mode, mut bias, mut dir, mut inp, mut dt, mut prec, mut math, mut is, mut hs, mut ps, mut nl, mut dd, mut aux) =
        (9, 9, 9, 9, 9, 9, 9, 9, 0, 0, 0, 0, null_mut(), 0u32);
    ok(cudnnGetRNNDescriptor_v8(d.rnn, &mut algo, &mut mode, &mut bias, &mut dir, &mut inp, &mut dt, &mut prec, &mut math, &mut is, &mut hs, &mut ps, &mut nl, &mut dd, &mut aux));
    assert_eq!(
        (algo, mode, bias, dir, inp, dt, prec, math),
        (0, CUDNN_GRU, CUDNN_RNN_DOUBLE_BIAS, CUDNN_BIDIRECTIONAL, CUDNN_LINEAR_INPUT, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH)
    );
    assert_eq!((is, hs, ps, nl, dd, aux), (3, 5, 5, 1, d.drop, CUDNN_RNN_PADDED_IO_ENABLED));
    let (mut layout, mut ms, mut bs, mut vs, mut fill) = (9, 0, 0, 0, 0f32);
    let mut lens = [0i32; 5];
    ok(cudnnGetRNNDataDescriptor(d.x, &mut dt, &mut layout, &mut ms, &mut bs, &mut vs, 5, lens.as_mut_ptr(), &mut fill as *mut f32 as *mut c_void));
    assert_eq!((dt, layout, ms, bs, vs, fill), (CUDNN_DATA_FLOAT, 0, 4, 3, 3, 2.5));
    assert_eq!(lens, [4, 1, 3, 0, 0]);
    ok(cudnnRNNSetClip_v9(d.rnn, CUDNN_RNN_CLIP_MINMAX, -1.0, 2.0));
    let (mut cm, mut l, mut r) = (0, 0.0, 0.0);
    ok(cudnnRNNGetClip_v9(d.rnn, &mut cm, &mut l, &mut r));
    assert_eq!((cm, l, r), (CUDNN_RNN_CLIP_MINMAX, -1.0, 2.0));
    ok(cudnnBuildRNNDynamic(h.0, d.rnn, 3));
}

#[test]
fn bad_calls_give_cudnn_status_codes() {
    let h = Handle::cpu();
    let c = Case::new(CUDNN_LSTM, 3, 4, 3, 2);
    let d = descs(&h, &c);
    let mut rd = null_mut();
    ok(cudnnCreateRNNDescriptor(&mut rd));
    let set =
        |rd, mode, input_mode, dt, prec, hidden, proj| cudnnSetRNNDescriptor_v8(rd, 0, mode, CUDNN_RNN_DOUBLE_BIAS, 0, input_mode, dt, prec, 0, 3, hidden, proj, 1, null_mut(), 0);
    fails(set(rd, 7, 0, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, 4, 0), CUDNN_STATUS_BAD_PARAM, &["cellMode"]);
    fails(set(rd, CUDNN_LSTM, 0, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, 0, 0), CUDNN_STATUS_BAD_PARAM, &["hiddenSize"]);
    fails(set(rd, CUDNN_LSTM, 0, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, 4, 5), CUDNN_STATUS_BAD_PARAM, &["projSize"]);
    fails(set(rd, CUDNN_GRU, 0, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, 4, 2), CUDNN_STATUS_BAD_PARAM, &["projection"]);
    fails(set(rd, CUDNN_LSTM, 0, CUDNN_DATA_FLOAT, CUDNN_DATA_DOUBLE, 4, 0), CUDNN_STATUS_BAD_PARAM, &["mathPrec"]);
    fails(set(rd, CUDNN_LSTM, CUDNN_SKIP_INPUT, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, 4, 0), CUDNN_STATUS_NOT_SUPPORTED, &["SKIP_INPUT"]);
    fails(set(rd, CUDNN_LSTM, 0, CUDNN_DATA_INT8, CUDNN_DATA_FLOAT, 4, 0), CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, &["dataType"]);
    let mut sz = 0usize;
    fails(cudnnGetRNNWeightSpaceSize(h.0, rd, &mut sz), CUDNN_STATUS_BAD_PARAM, &["never set"]);
    fails(cudnnGetRNNWeightSpaceSize(h.0, d.rnn, null_mut()), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["weightSpaceSize"]);
    fails(cudnnRNNSetClip_v8(d.rnn, CUDNN_RNN_CLIP_MINMAX, 0, 1.0, -1.0), CUDNN_STATUS_BAD_PARAM, &["lclip"]);
    ok(cudnnDestroyRNNDescriptor(rd));
    // Data descriptors.
    let mut dd = null_mut();
    ok(cudnnCreateRNNDataDescriptor(&mut dd));
    let lens = [3, 4];
    fails(cudnnSetRNNDataDescriptor(dd, CUDNN_DATA_FLOAT, 0, 3, 2, 3, lens.as_ptr(), null_mut()), CUDNN_STATUS_BAD_PARAM, &["seqLengthArray[1]"]);
    let lens = [2, 3];
    fails(cudnnSetRNNDataDescriptor(dd, CUDNN_DATA_FLOAT, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, 3, 2, 3, lens.as_ptr(), null_mut()), CUDNN_STATUS_BAD_PARAM, &["non-increasing"]);
    fails(cudnnSetRNNDataDescriptor(dd, CUDNN_DATA_FLOAT, 0, 3, 2, 3, null(), null_mut()), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["seqLengthArray"]);
    fails(cudnnSetRNNDataDescriptor(dd, CUDNN_DATA_FLOAT, 5, 3, 2, 3, lens.as_ptr(), null_mut()), CUDNN_STATUS_BAD_PARAM, &["layout"]);
    // A data descriptor of another input size.
    ok(cudnnSetRNNDataDescriptor(dd, CUDNN_DATA_FLOAT, 0, 3, 2, 5, [3, 3].as_ptr(), null_mut()));
    let (mut ws, mut rs) = (0usize, 0usize);
    fails(cudnnGetRNNTempSpaceSizes(h.0, d.rnn, CUDNN_FWD_MODE_TRAINING, dd, &mut ws, &mut rs), CUDNN_STATUS_BAD_PARAM, &["vectorSize", "inputSize"]);
    fails(cudnnGetRNNTempSpaceSizes(h.0, d.rnn, 2, d.x, &mut ws, &mut rs), CUDNN_STATUS_BAD_PARAM, &["fwdMode"]);
    ok(cudnnGetRNNTempSpaceSizes(h.0, d.rnn, CUDNN_FWD_MODE_TRAINING, d.x, &mut ws, &mut rs));
    // Weight params out of range.
    let mut wbytes = 0usize;
    ok(cudnnGetRNNWeightSpaceSize(h.0, d.rnn, &mut wbytes));
    let mut m = null_mut();
    fails(cudnnGetRNNWeightParams(h.0, d.rnn, 1, wbytes, null(), 0, null_mut(), &mut m, null_mut(), null_mut()), CUDNN_STATUS_BAD_PARAM, &["pseudoLayer"]);
    fails(cudnnGetRNNWeightParams(h.0, d.rnn, 0, wbytes, null(), 8, null_mut(), &mut m, null_mut(), null_mut()), CUDNN_STATUS_BAD_PARAM, &["linLayerID"]);
    fails(cudnnGetRNNWeightParams(h.0, d.rnn, 0, wbytes - 4, null(), 0, null_mut(), &mut m, null_mut(), null_mut()), CUDNN_STATUS_BAD_PARAM, &["weightSpaceSize"]);
    // Forward with sizes too small, a null input, and a state descriptor of the wrong shape.
    let x = vec![0.5f32; 3 * 2 * 3];
    let mut y = vec![0f32; 3 * 2 * 4];
    let w = vec![0.1f32; wbytes / 4];
    let mut wsb = vec![0u8; ws.max(1)];
    let mut rsb = vec![0u8; rs];
    let fwd = |x: *const c_void, h_desc, wsize, wss, rss, rsp: *mut c_void, y: *mut c_void, wsp: *mut c_void| {
        cudnnRNNForward(h.0, d.rnn, CUDNN_FWD_MODE_TRAINING, null(), d.x, x, d.y, y, h_desc, null(), null_mut(), d.c, null(), null_mut(), wsize, p(&w), wss, wsp, rss, rsp)
    };
    let (yp, wsp, rsp) = (pm(&mut y), wsb.as_mut_ptr() as *mut c_void, rsb.as_mut_ptr() as *mut c_void);
    ok(fwd(p(&x), d.h, wbytes, ws, rs, rsp, yp, wsp));
    fails(fwd(p(&x), d.h, wbytes, ws, rs - 1, rsp, yp, wsp), CUDNN_STATUS_BAD_PARAM, &["reserveSpaceSize"]);
    fails(fwd(p(&x), d.h, wbytes - 1, ws, rs, rsp, yp, wsp), CUDNN_STATUS_BAD_PARAM, &["weightSpaceSize"]);
    fails(fwd(null(), d.h, wbytes, ws, rs, rsp, yp, wsp), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["`x`"]);
    fails(fwd(p(&x), d.h, wbytes, ws, rs, null_mut(), yp, wsp), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["reserveSpace"]);
    if ws > 0 {
        fails(fwd(p(&x), d.h, wbytes, ws - 1, rs, rsp, yp, wsp), CUDNN_STATUS_BAD_PARAM, &["workSpaceSize"]);
    }
    let wrong = f32_tensor(&[1, 2, 5], false);
    fails(fwd(p(&x), wrong, wbytes, ws, rs, rsp, yp, wsp), CUDNN_STATUS_BAD_PARAM, &["hDesc"]);
    fails(fwd(p(&x), null_mut(), wbytes, ws, rs, rsp, yp, wsp), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["hDesc"]);
    // The backward passes check the reserve space too; the weights pass its mode.
    let mut dw = vec![0f32; wbytes / 4];
    fails(cudnnRNNBackwardWeights_v8(h.0, d.rnn, 5, null(), d.x, p(&x), d.h, null(), d.y, p(&y), wbytes, pm(&mut dw), ws, wsp, rs, rsp), CUDNN_STATUS_BAD_PARAM, &["addGrad"]);
    fails(
        cudnnRNNBackwardWeights_v8(h.0, d.rnn, CUDNN_WGRAD_MODE_ADD, null(), d.x, p(&x), d.h, null(), d.y, p(&y), wbytes, pm(&mut dw), ws, wsp, rs / 2, rsp),
        CUDNN_STATUS_BAD_PARAM,
        &["reserveSpaceSize"],
    );
    // y described with the input's width.
    fails(
        cudnnRNNBackwardWeights_v8(h.0, d.rnn, CUDNN_WGRAD_MODE_ADD, null(), d.x, p(&x), d.h, null(), d.x, p(&y), wbytes, pm(&mut dw), ws, wsp, rs, rsp),
        CUDNN_STATUS_BAD_PARAM,
        &["yDesc"],
    );
    ok(cudnnDestroyTensorDescriptor(wrong));
    ok(cudnnDestroyRNNDataDescriptor(dd));
}

/// SET mode overwrites the weight gradient; ADD accumulates into it.
#[test]
fn wgrad_set_mode_overwrites() {
    let c = Case::new(CUDNN_GRU, 3, 4, 3, 2);
    let r = run_library(&c);
    let h = Handle::cpu();
    let d = descs(&h, &c);
    let mut wbytes = 0usize;
    ok(cudnnGetRNNWeightSpaceSize(h.0, d.rnn, &mut wbytes));
    let (mut ws, mut rs) = (0usize, 0usize);
    ok(cudnnGetRNNTempSpaceSizes(h.0, d.rnn, CUDNN_FWD_MODE_TRAINING, d.x, &mut ws, &mut rs));
    let (mut wsb, mut rsb) = (vec![0u8; ws], vec![0u8; rs]);
    let (wsp, rsp) = (wsb.as_mut_ptr() as *mut c_void, rsb.as_mut_ptr() as *mut c_void);
    let mut y = vec![0f32; r.y.len()];
    let mut hy = vec![0f32; r.hy.len()];
    ok(cudnnRNNForward(
        h.0,
        d.rnn,
        CUDNN_FWD_MODE_TRAINING,
        null(),
        d.x,
        p(&r.x),
        d.y,
        pm(&mut y),
        d.h,
        p(&r.hx),
        pm(&mut hy),
        d.c,
        null(),
        null_mut(),
        wbytes,
        p(&r.w),
        ws,
        wsp,
        rs,
        rsp,
    ));
    let mut dx = vec![0f32; r.dx.len()];
    let mut dhx = vec![0f32; r.dhx.len()];
    ok(cudnnRNNBackwardData_v8(
        h.0,
        d.rnn,
        null(),
        d.y,
        p(&y),
        p(&r.dy),
        d.x,
        pm(&mut dx),
        d.h,
        p(&r.hx),
        p(&r.dhy),
        pm(&mut dhx),
        d.c,
        null(),
        null(),
        null_mut(),
        wbytes,
        p(&r.w),
        ws,
        wsp,
        rs,
        rsp,
    ));
    let mut dw = vec![f32::NAN; wbytes / 4];
    ok(cudnnRNNBackwardWeights_v8(h.0, d.rnn, CUDNN_WGRAD_MODE_SET, null(), d.x, p(&r.x), d.h, p(&r.hx), d.y, p(&y), wbytes, pm(&mut dw), ws, wsp, rs, rsp));
    let want: Vec<f64> = r.dw.iter().zip(&r.dw0).map(|(a, b)| (a - b) as f64).collect();
    close(&dw, &want, 1e-4, "dw (SET) = dw (ADD) - dw0");
}
