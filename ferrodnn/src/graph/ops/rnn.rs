//! Recurrent networks as cuDNN defines them (cudnnRNNForward, cudnnRNNBackwardData_v8,
//! cudnnRNNBackwardWeights_v8): ReLU and tanh RNNs, LSTM (with an optional recurrent
//! projection, LSTMP) and GRU; one or more layers; unidirectional or bidirectional.
//!
//! Three ops share one attribute struct, [`RnnDesc`]:
//! - `rnn` (forward): `x`, `weights`, optional `hx`, `cx`, `seq_lengths`, `seed`, `offset` ->
//!   `y`, optional `hy`, `cy`, and in training mode `reserve`;
//! - `rnn_backward_data`: `dy`, `weights`, `reserve`, optional `hx`, `cx`, `dhy`, `dcy`,
//!   `seq_lengths` -> `dx`, optional `dhx`, `dcx`, `dgates`;
//! - `rnn_backward_weights`: `x`, `reserve`, `dgates`, optional `hx`, `seq_lengths`, `dw_in` ->
//!   `dw`.
//!
//! # Tensors
//! With `T = max_seq_length`, `B = batch`, `D` = 2 when bidirectional else 1, `L` = num_layers,
//! `H` = hidden_size, `P` = proj_size (H when there is no projection):
//! - `x`: `[T, B, input_size]` (seq_major_unpacked), `[B, T, input_size]` (batch_major_unpacked),
//!   or `[T * B, input_size]` (seq_major_packed: the vectors of step 0 of every sample whose
//!   length is above 0, then those of step 1, ..., samples in order, which must have
//!   non-increasing lengths as cuDNN requires; rows past the sum of the lengths are unused).
//!   `y` likewise with `D * P` features; `dx`, `dy` as `x`, `y`.
//! - `hx`, `hy`, `dhx`, `dhy`: `[L * D, B, P]`; `cx`, `cy`, `dcx`, `dcy` (LSTM only):
//!   `[L * D, B, H]`. Absent initial states are zero; absent final-state gradients are zero.
//! - `seq_lengths`: `[B]` integer lengths in `[0, T]` (all `T` when absent).
//! - `weights`, `dw`, `dw_in`: the weight space, one 1-D tensor of
//!   [`RnnDesc::weight_space_elements`] elements, laid out as [`RnnDesc::weight_params`] says.
//! - `reserve` (1-D, [`RnnDesc::reserve_elements`]): what training keeps for the backward
//!   passes; `dgates` (1-D, [`RnnDesc::dgates_elements`]): the gradients of each step's gates,
//!   which `rnn_backward_data` computes and `rnn_backward_weights` reads (cuDNN keeps them in
//!   its reserve space, which its backward data call writes; graph inputs are read-only here,
//!   so they are a tensor of their own). Both are f32 unless set (f64 when the op computes in
//!   f64).
//!
//! # Semantics
//! Pseudo-layer `p = l * D + d` is direction `d` of layer `l`. Layer 0 reads `x`; layer `l > 0`
//! reads the `D * P` outputs of layer `l - 1` (after dropout, in training mode). Direction 0
//! runs each sample's steps `0 .. len`, direction 1 runs them from `len - 1` down to 0 (each
//! sample from its own last step), starting from `hx[p]`, `cx[p]`. With `W_g`, `R_g` the input
//! and recurrent matrices of gate `g`, `bW_g`, `bR_g` their biases (zero where the bias mode
//! has none), `h` the previous hidden state and `x` the step's input:
//! - relu / tanh: `h' = act(W x + bW + R h + bR)`;
//! - LSTM (gates i, f, g, o): `i = σ(W_i x + bW_i + R_i h + bR_i)`, `f`, `o` likewise, `g` with
//!   tanh; `c' = clip(f c + i g)`; `h' = o tanh(c')`, then with a projection `h' = W_r h'`
//!   (`W_r` is `[P, H]`);
//! - GRU (gates r, z, n): `r = σ(W_r x + bW_r + R_r h + bR_r)`, `z` likewise,
//!   `n = tanh(W_n x + bW_n + r (R_n h + bR_n))`, `h' = (1 - z) n + z h` (as cuDNN and PyTorch).
//!
//! `clip` is [`CellClip`] (none by default). `y[t, b]` is the last layer's `h'` at step `t`
//! (directions side by side: forward in features `0..P`, reverse in `P..2P`); steps at or past
//! a sample's length give `padding_fill` and are skipped by the recurrence. `hy[p, b]`, `cy[p,
//! b]` are each sample's state after its last valid step (the initial state for length 0).
//!
//! Dropout (training mode, `dropout` > 0, inputs `seed` and `offset`): the output of each layer
//! but the last is multiplied by `keep / (1 - p)` before the next layer reads it, `keep` = 1
//! when the Philox uniform of flat index `((l * T + t) * B + b) * D * P + k` is `>= p` (the
//! counter mapping of `graph::ops::rng`). Inference mode applies no dropout (as PyTorch's eval
//! mode).
//!
//! The backward passes give the gradients of the training forward: `dx`, `dhx`, `dcx` from
//! `dy`, `dhy`, `dcy` (the gradients of `y`, `hy`, `cy`), and `dw = dw_in + dL/dweights`
//! (cuDNN's CUDNN_WGRAD_MODE_ADD; without `dw_in`, just the gradient). `dw_in` and `dw` may be
//! bound to the same buffer for accumulation in place.
//!
//! ```
//! use ferrodnn::{DataType, Graph, TensorDesc};
//! use ferrodnn::graph::ops::rnn::{RnnDesc, RnnInputs, RnnMode};
//! let f = DataType::F32;
//! let desc = RnnDesc::new(RnnMode::Lstm, 7, 13, 9, 5);
//! let mut g = Graph::new("lstm").io_data_type(f);
//! let x = g.tensor(TensorDesc::new("x", &[9, 5, 7], f));
//! let w = g.tensor(TensorDesc::new("w", &[desc.weight_space_elements()], f));
//! let out = g.rnn(x, w, RnnInputs::default(), desc.clone());
//! g.set_output(out.y);
//! g.validate().unwrap();
//! assert_eq!(g.desc(out.y).dims, vec![9, 5, 13]);
//! ```

use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::{Graph, InferCtx, TensorDesc, TensorId};
use serde::{Deserialize, Serialize};

/// The cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RnnMode {
    Relu,
    Tanh,
    Lstm,
    Gru,
}

impl RnnMode {
    /// Gates per step (cuDNN's linear layers per matrix kind): 1, 1, 4 (i, f, g, o), 3 (r, z, n).
    pub fn gates(self) -> i64 {
        match self {
            RnnMode::Relu | RnnMode::Tanh => 1,
            RnnMode::Lstm => 4,
            RnnMode::Gru => 3,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            RnnMode::Relu => "relu",
            RnnMode::Tanh => "tanh",
            RnnMode::Lstm => "lstm",
            RnnMode::Gru => "gru",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RnnDirection {
    #[default]
    Unidirectional,
    Bidirectional,
}

/// Which biases the weight space holds (cuDNN's `cudnnRNNBiasMode_t`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RnnBiasMode {
    /// No biases.
    NoBias,
    /// One bias per gate, with the input matrices (`bW`).
    SingleInp,
    /// Biases with the input and the recurrent matrices (`bW` and `bR`), as PyTorch has them.
    #[default]
    Double,
    /// One bias per gate, with the recurrent matrices (`bR`).
    SingleRec,
}

/// How the sequences lie in `x` and `y` (cuDNN's `cudnnRNNDataLayout_t`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RnnLayout {
    /// `[T, B, features]`.
    #[default]
    SeqMajorUnpacked,
    /// `[T * B, features]`, each step's valid vectors packed (lengths non-increasing).
    SeqMajorPacked,
    /// `[B, T, features]`.
    BatchMajorUnpacked,
}

/// LSTM cell clipping (cuDNN's `cudnnRNNSetClip_v8`): `c' = min(max(c', lower), upper)`. With
/// `propagate_nan` a NaN cell stays NaN; without, it becomes `lower` (`fmin(fmax(c, lower),
/// upper)`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CellClip {
    pub lower: f64,
    pub upper: f64,
    #[serde(default)]
    pub propagate_nan: bool,
}

impl CellClip {
    pub fn apply(&self, c: f64) -> f64 {
        if c.is_nan() {
            return if self.propagate_nan { c } else { self.lower };
        }
        c.max(self.lower).min(self.upper)
    }
}

/// The attributes of the three RNN ops: cuDNN's RNN descriptor and RNN data descriptor in one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RnnDesc {
    pub cell_mode: RnnMode,
    #[serde(default)]
    pub direction: RnnDirection,
    pub num_layers: i64,
    pub input_size: i64,
    pub hidden_size: i64,
    /// LSTM's recurrent projection size; unset (or equal to `hidden_size`) means none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proj_size: Option<i64>,
    #[serde(default)]
    pub bias_mode: RnnBiasMode,
    /// LSTM cell clipping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cell_clip: Option<CellClip>,
    /// Dropout probability in [0, 1) between layers (training mode); needs `seed` and `offset`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropout: Option<f64>,
    #[serde(default)]
    pub layout: RnnLayout,
    pub max_seq_length: i64,
    pub batch: i64,
    /// What `y` (and `dx`) hold at steps past a sample's length.
    #[serde(default)]
    pub padding_fill: f64,
    /// Training (the forward gives `reserve`) or inference.
    #[serde(default)]
    pub training: bool,
}

/// Where one matrix of the weight space lives (cuDNN's `cudnnGetRNNWeightParams`): a row-major
/// `rows x cols` matrix at element `matrix_offset`, and its bias of `bias_len` elements (0 when
/// the bias mode gives this matrix none) at `bias_offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightParams {
    pub matrix_offset: i64,
    pub rows: i64,
    pub cols: i64,
    pub bias_offset: i64,
    pub bias_len: i64,
}

/// Offsets (in elements) of one layer's parts in the reserve; see [`RnnDesc::reserve_layer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReserveLayer {
    pub states: i64,
    pub outputs: i64,
    pub mask: Option<i64>,
    pub end: i64,
}

impl RnnDesc {
    /// A unidirectional single-layer descriptor with double biases, sequence-major unpacked,
    /// inference mode.
    pub fn new(cell_mode: RnnMode, input_size: i64, hidden_size: i64, max_seq_length: i64, batch: i64) -> RnnDesc {
        RnnDesc {
            cell_mode,
            direction: RnnDirection::Unidirectional,
            num_layers: 1,
            input_size,
            hidden_size,
            proj_size: None,
            bias_mode: RnnBiasMode::Double,
            cell_clip: None,
            dropout: None,
            layout: RnnLayout::SeqMajorUnpacked,
            max_seq_length,
            batch,
            padding_fill: 0.0,
            training: false,
        }
    }
    pub fn layers(mut self, n: i64) -> RnnDesc {
        self.num_layers = n;
        self
    }
    pub fn bidirectional(mut self) -> RnnDesc {
        self.direction = RnnDirection::Bidirectional;
        self
    }
    pub fn training(mut self) -> RnnDesc {
        self.training = true;
        self
    }
    pub fn with_layout(mut self, layout: RnnLayout) -> RnnDesc {
        self.layout = layout;
        self
    }
    pub fn with_bias(mut self, bias: RnnBiasMode) -> RnnDesc {
        self.bias_mode = bias;
        self
    }
    pub fn with_proj(mut self, proj: i64) -> RnnDesc {
        self.proj_size = Some(proj);
        self
    }
    pub fn with_clip(mut self, lower: f64, upper: f64, propagate_nan: bool) -> RnnDesc {
        self.cell_clip = Some(CellClip { lower, upper, propagate_nan });
        self
    }

    /// Directions: 1 or 2.
    pub fn dirs(&self) -> i64 {
        match self.direction {
            RnnDirection::Unidirectional => 1,
            RnnDirection::Bidirectional => 2,
        }
    }
    /// The hidden state's size: `proj_size` when there is a projection, else `hidden_size`.
    pub fn proj(&self) -> i64 {
        self.proj_size.unwrap_or(self.hidden_size)
    }
    /// Whether the LSTM has a recurrent projection.
    pub fn has_proj(&self) -> bool {
        self.proj() != self.hidden_size
    }
    /// Features of `y`: `D * P`.
    pub fn out_size(&self) -> i64 {
        self.dirs() * self.proj()
    }
    /// Features of layer `l`'s input.
    pub fn layer_input(&self, l: i64) -> i64 {
        if l == 0 {
            self.input_size
        } else {
            self.out_size()
        }
    }
    /// Pseudo-layers: `L * D`.
    pub fn pseudo_layers(&self) -> i64 {
        self.num_layers * self.dirs()
    }
    /// Matrices per pseudo-layer: the input ones, the recurrent ones, and the projection.
    pub fn lin_layers(&self) -> i64 {
        2 * self.cell_mode.gates() + i64::from(self.has_proj())
    }
    /// Dropout applies (a probability above 0).
    pub fn has_dropout(&self) -> bool {
        self.dropout.is_some_and(|p| p > 0.0)
    }

    fn has_input_bias(&self) -> bool {
        matches!(self.bias_mode, RnnBiasMode::SingleInp | RnnBiasMode::Double)
    }
    fn has_rec_bias(&self) -> bool {
        matches!(self.bias_mode, RnnBiasMode::SingleRec | RnnBiasMode::Double)
    }

    /// Elements of one pseudo-layer of layer `l`: its matrices, then its biases.
    fn pseudo_layer_elements(&self, l: i64) -> i64 {
        let (g, h, p) = (self.cell_mode.gates(), self.hidden_size, self.proj());
        let mut n = g * h * self.layer_input(l) + g * h * p;
        if self.has_proj() {
            n += p * h;
        }
        n + g * h * (i64::from(self.has_input_bias()) + i64::from(self.has_rec_bias()))
    }

    /// Elements of the weight space.
    pub fn weight_space_elements(&self) -> i64 {
        (0..self.num_layers).map(|l| self.dirs() * self.pseudo_layer_elements(l)).sum()
    }

    /// Where matrix `lin_id` of pseudo-layer `pseudo_layer` (`layer * D + direction`) and its
    /// bias live in the weight space, as cuDNN's `cudnnGetRNNWeightParams` answers it. Linear
    /// ids: relu/tanh 0 = W, 1 = R; LSTM 0-3 = W_i, W_f, W_g, W_o, 4-7 = R_i, R_f, R_g, R_o, 8 =
    /// the projection W_r `[P, H]` (LSTMP only; no bias); GRU 0-2 = W_r, W_z, W_n, 3-5 = R_r,
    /// R_z, R_n. Input matrices are `[H, layer input]`, recurrent ones `[H, P]`, each row-major
    /// (PyTorch's `weight_ih_l{k}` is the input matrices stacked, `weight_hh_l{k}` the
    /// recurrent ones).
    ///
    /// Layout: the pseudo-layers in order; in each, every matrix in linear-id order, then the
    /// biases of the input matrices (if the bias mode has them), then those of the recurrent
    /// ones, each `H` long. `None` for ids out of range.
    pub fn weight_params(&self, pseudo_layer: i64, lin_id: i64) -> Option<WeightParams> {
        if pseudo_layer < 0 || pseudo_layer >= self.pseudo_layers() || lin_id < 0 || lin_id >= self.lin_layers() {
            return None;
        }
        let l = pseudo_layer / self.dirs();
        let (g, h, p) = (self.cell_mode.gates(), self.hidden_size, self.proj());
        let start: i64 = (0..l).map(|k| self.dirs() * self.pseudo_layer_elements(k)).sum::<i64>() + (pseudo_layer % self.dirs()) * self.pseudo_layer_elements(l);
        let inp = self.layer_input(l);
        let (rows, cols, moff) = if lin_id < g {
            (h, inp, lin_id * h * inp)
        } else if lin_id < 2 * g {
            (h, p, g * h * inp + (lin_id - g) * h * p)
        } else {
            (p, h, g * h * inp + g * h * p)
        };
        let matrices = g * h * inp + g * h * p + if self.has_proj() { p * h } else { 0 };
        let (bias_offset, bias_len) = if lin_id < g && self.has_input_bias() {
            (matrices + lin_id * h, h)
        } else if lin_id >= g && lin_id < 2 * g && self.has_rec_bias() {
            (matrices + if self.has_input_bias() { g * h } else { 0 } + (lin_id - g) * h, h)
        } else {
            (0, 0)
        };
        Some(WeightParams { matrix_offset: start + moff, rows, cols, bias_offset: if bias_len > 0 { start + bias_offset } else { 0 }, bias_len })
    }

    /// Values kept per (step, sample, direction) of a layer in the reserve: relu/tanh `H` (the
    /// activation), LSTM `5H` (i, f, g, o after their activations, and the clipped cell), GRU
    /// `4H` (r, z, n after their activations, and `R_n h + bR_n`).
    pub fn reserve_states(&self) -> i64 {
        let h = self.hidden_size;
        match self.cell_mode {
            RnnMode::Relu | RnnMode::Tanh => h,
            RnnMode::Lstm => 5 * h,
            RnnMode::Gru => 4 * h,
        }
    }

    /// Where each part of layer `l` lives in the reserve. States are `[T, B, D,
    /// reserve_states]`, outputs (the layer's `h'` before dropout) `[T, B, D * P]`, the dropout
    /// factors (0 or `1 / (1 - p)`) `[T, B, D * P]` for every layer but the last when dropout
    /// applies. Steps past a sample's length hold 0.
    pub fn reserve_layer(&self, l: i64) -> ReserveLayer {
        let (t, b) = (self.max_seq_length, self.batch);
        let mask_of = |l: i64| self.has_dropout() && l + 1 < self.num_layers;
        let per = |l: i64| {
            let s = t * b * self.dirs() * self.reserve_states();
            let o = t * b * self.out_size();
            s + o + if mask_of(l) { o } else { 0 }
        };
        let states: i64 = (0..l).map(per).sum();
        let outputs = states + t * b * self.dirs() * self.reserve_states();
        let mask = mask_of(l).then_some(outputs + t * b * self.out_size());
        ReserveLayer { states, outputs, mask, end: states + per(l) }
    }

    /// Elements of the reserve.
    pub fn reserve_elements(&self) -> i64 {
        self.reserve_layer(self.num_layers - 1).end
    }

    /// Gradients kept per (step, sample, direction) in `dgates`: relu/tanh `H` (of the
    /// pre-activation), LSTM `4H` (of i, f, g, o before their activations) plus `P` with a
    /// projection (the gradient of the projected `h'`), GRU `4H` (of r, z, n before their
    /// activations, and of `R_n h + bR_n`).
    pub fn dgates_states(&self) -> i64 {
        let h = self.hidden_size;
        match self.cell_mode {
            RnnMode::Relu | RnnMode::Tanh => h,
            RnnMode::Lstm => 4 * h + if self.has_proj() { self.proj() } else { 0 },
            RnnMode::Gru => 4 * h,
        }
    }

    /// Elements of `dgates`: `[L, T, B, D, dgates_states]`.
    pub fn dgates_elements(&self) -> i64 {
        self.num_layers * self.max_seq_length * self.batch * self.dirs() * self.dgates_states()
    }

    /// The dims of `x` (or `y` with `features = D * P`) for this layout.
    pub fn seq_dims(&self, features: i64) -> Vec<i64> {
        let (t, b) = (self.max_seq_length, self.batch);
        match self.layout {
            RnnLayout::SeqMajorUnpacked => vec![t, b, features],
            RnnLayout::BatchMajorUnpacked => vec![b, t, features],
            RnnLayout::SeqMajorPacked => vec![t * b, features],
        }
    }

    /// Every attribute's own rule, as an error message.
    pub fn check(&self) -> std::result::Result<(), String> {
        for (name, v) in
            [("num_layers", self.num_layers), ("input_size", self.input_size), ("hidden_size", self.hidden_size), ("max_seq_length", self.max_seq_length), ("batch", self.batch)]
        {
            if v <= 0 {
                return Err(format!("{name} must be positive, got {v}"));
            }
        }
        const LIMIT: i64 = 1 << 24;
        for (name, v) in [("num_layers", self.num_layers), ("input_size", self.input_size), ("hidden_size", self.hidden_size)] {
            if v > LIMIT {
                return Err(format!("{name} must be at most {LIMIT}, got {v}"));
            }
        }
        if let Some(p) = self.proj_size {
            if self.cell_mode != RnnMode::Lstm && p != self.hidden_size {
                return Err(format!(
                    "proj_size {p} is for LSTM only; a {} cell has no projection (leave it unset or equal to hidden_size {})",
                    self.cell_mode.name(),
                    self.hidden_size
                ));
            }
            if p <= 0 || p > self.hidden_size {
                return Err(format!("proj_size must be in [1, hidden_size = {}], got {p}", self.hidden_size));
            }
        }
        if let Some(c) = self.cell_clip {
            if self.cell_mode != RnnMode::Lstm {
                return Err(format!("cell_clip is for LSTM only, but the cell is {}", self.cell_mode.name()));
            }
            if c.lower.is_nan() || c.upper.is_nan() || c.lower > c.upper {
                return Err(format!("cell_clip needs lower <= upper (neither NaN), got lower = {}, upper = {}", c.lower, c.upper));
            }
        }
        if let Some(p) = self.dropout {
            if !(0.0..1.0).contains(&p) {
                return Err(format!("dropout probability must be in [0, 1), got {p}"));
            }
        }
        if self.padding_fill.is_nan() {
            return Err("padding_fill must be a number, got NaN".into());
        }
        // Every size must fit comfortably: the weight space, reserve and sequence tensors.
        let big = |a: i64, b: i64| a.checked_mul(b).filter(|&v| v <= crate::graph::MAX_ELEMENTS);
        let tb = big(self.max_seq_length, self.batch).ok_or_else(|| format!("max_seq_length {} x batch {} is too large", self.max_seq_length, self.batch))?;
        let per_step = self.dirs() * (self.reserve_states() + self.out_size() * 2 + self.dgates_states()) + self.input_size;
        let all = big(tb, per_step).and_then(|v| big(v, self.num_layers));
        let w = big(self.hidden_size, 4 * (self.input_size.max(self.out_size()) + self.proj() + 4)).and_then(|v| big(v, self.pseudo_layers()));
        if all.is_none() || w.is_none() {
            return Err(format!(
                "the sizes (layers {}, input {}, hidden {}, T {}, batch {}) give tensors of more than {} elements",
                self.num_layers,
                self.input_size,
                self.hidden_size,
                self.max_seq_length,
                self.batch,
                crate::graph::MAX_ELEMENTS
            ));
        }
        Ok(())
    }
}

/// The optional inputs of [`Graph::rnn`]: initial states, lengths, and dropout's seed and
/// offset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RnnInputs {
    pub hx: Option<TensorId>,
    pub cx: Option<TensorId>,
    pub seq_lengths: Option<TensorId>,
    pub seed: Option<TensorId>,
    pub offset: Option<TensorId>,
}

/// The outputs of [`Graph::rnn`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RnnOutputs {
    pub y: TensorId,
    pub hy: TensorId,
    /// LSTM only.
    pub cy: Option<TensorId>,
    /// Training mode only.
    pub reserve: Option<TensorId>,
}

/// The optional inputs of [`Graph::rnn_backward_data`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RnnBackwardInputs {
    pub hx: Option<TensorId>,
    pub cx: Option<TensorId>,
    pub dhy: Option<TensorId>,
    pub dcy: Option<TensorId>,
    pub seq_lengths: Option<TensorId>,
}

/// The outputs of [`Graph::rnn_backward_data`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RnnDataGrads {
    pub dx: TensorId,
    pub dhx: TensorId,
    /// LSTM only.
    pub dcx: Option<TensorId>,
    /// The gate gradients [`Graph::rnn_backward_weights`] reads.
    pub dgates: TensorId,
}

fn ports<'a>(list: &[(&'a str, Option<TensorId>)]) -> Vec<(&'a str, TensorId)> {
    list.iter().filter_map(|&(p, t)| t.map(|t| (p, t))).collect()
}

impl Graph {
    /// The forward pass. Ports `x`, `weights` and the optional inputs -> `y`, `hy`, and for
    /// LSTM `cy`, in training mode `reserve` (see the module docs). Outputs nobody marks with
    /// `set_output` stay virtual; a caller that does not want `hy` or `cy` may leave them so.
    pub fn rnn(&mut self, x: TensorId, weights: TensorId, inputs: RnnInputs, desc: RnnDesc) -> RnnOutputs {
        let mut ins = vec![("x", x), ("weights", weights)];
        ins.extend(ports(&[("hx", inputs.hx), ("cx", inputs.cx), ("seq_lengths", inputs.seq_lengths), ("seed", inputs.seed), ("offset", inputs.offset)]));
        let lstm = desc.cell_mode == RnnMode::Lstm;
        let mut outs = vec!["y", "hy"];
        if lstm {
            outs.push("cy");
        }
        if desc.training {
            outs.push("reserve");
        }
        let training = desc.training;
        let ids = self.add_node(super::Op::Rnn(desc), None, ins, &outs);
        let cy = lstm.then(|| ids[2]);
        let reserve = training.then(|| ids[if lstm { 3 } else { 2 }]);
        RnnOutputs { y: ids[0], hy: ids[1], cy, reserve }
    }

    /// The backward data pass. Ports `dy`, `weights`, `reserve` and the optional inputs -> `dx`,
    /// `dhx`, for LSTM `dcx`, and `dgates` (the input of [`Graph::rnn_backward_weights`]).
    pub fn rnn_backward_data(&mut self, dy: TensorId, weights: TensorId, reserve: TensorId, inputs: RnnBackwardInputs, desc: RnnDesc) -> RnnDataGrads {
        let mut ins = vec![("dy", dy), ("weights", weights), ("reserve", reserve)];
        ins.extend(ports(&[("hx", inputs.hx), ("cx", inputs.cx), ("dhy", inputs.dhy), ("dcy", inputs.dcy), ("seq_lengths", inputs.seq_lengths)]));
        let lstm = desc.cell_mode == RnnMode::Lstm;
        let outs: &[&str] = if lstm { &["dx", "dhx", "dcx", "dgates"] } else { &["dx", "dhx", "dgates"] };
        let ids = self.add_node(super::Op::RnnBackwardData(desc), None, ins, outs);
        RnnDataGrads { dx: ids[0], dhx: ids[1], dcx: lstm.then(|| ids[2]), dgates: ids[if lstm { 3 } else { 2 }] }
    }

    /// The backward weights pass: ports `x`, `reserve`, `dgates` and optional `hx`,
    /// `seq_lengths`, `dw_in` -> `dw` (`dw_in` + the gradient).
    pub fn rnn_backward_weights(
        &mut self,
        x: TensorId,
        reserve: TensorId,
        dgates: TensorId,
        hx: Option<TensorId>,
        seq_lengths: Option<TensorId>,
        dw_in: Option<TensorId>,
        desc: RnnDesc,
    ) -> TensorId {
        let mut ins = vec![("x", x), ("reserve", reserve), ("dgates", dgates)];
        ins.extend(ports(&[("hx", hx), ("seq_lengths", seq_lengths), ("dw_in", dw_in)]));
        self.add_node(super::Op::RnnBackwardWeights(desc), None, ins, &["dw"])[0]
    }
}

fn float_input(ctx: &InferCtx, port: &str, t: &TensorDesc) -> Result<DataType> {
    let dt = t.data_type.unwrap_or(DataType::F32);
    if !dt.is_float() || dt.is_fp8() {
        return Err(ctx.err(format!("input `{port}` (tensor \"{}\") must be f16, bf16, f32 or f64, got {dt}", t.name)));
    }
    Ok(dt)
}

/// An optional input's dims must be `want` (named by `what`) and its type `dt`.
fn check_opt(ctx: &InferCtx, port: &str, want: &[i64], what: &str, dt: DataType) -> Result<Option<TensorDesc>> {
    let Some(t) = ctx.opt_input(port)? else { return Ok(None) };
    check_tensor(ctx, port, &t, want, what, dt)?;
    Ok(Some(t))
}

fn check_tensor(ctx: &InferCtx, port: &str, t: &TensorDesc, want: &[i64], what: &str, dt: DataType) -> Result<()> {
    if t.dims != want {
        return Err(ctx.err(format!("input `{port}` (tensor \"{}\") must be {what} = {want:?}, got dims {:?}", t.name, t.dims)));
    }
    let tdt = float_input(ctx, port, t)?;
    if tdt != dt {
        return Err(ctx.err(format!("input `{port}` (tensor \"{}\") must have the data's type {dt}, got {tdt}", t.name)));
    }
    Ok(())
}

/// Every connected input is a port of the op (a misspelt port would otherwise be ignored).
fn check_inputs(ctx: &InferCtx, known: &[&str]) -> Result<()> {
    if let Some(p) = ctx.node.inputs.iter().find(|p| !known.contains(&p.name.as_str())) {
        return Err(ctx.err(format!("has no input port `{}` (its inputs are {})", p.name, known.join(", "))));
    }
    Ok(())
}

/// The rules all three ops share: the descriptor, the compute type, `seq_lengths`, and a
/// connected `cx` / `cy` / `dcx` / `dcy` only for LSTM.
fn check_common(ctx: &InferCtx, a: &RnnDesc) -> Result<()> {
    a.check().map_err(|m| ctx.err(m))?;
    let ct = ctx.graph.compute_type(ctx.node);
    if !matches!(ct, DataType::F32 | DataType::F64) {
        return Err(ctx.err(format!("compute_data_type must be f32 or f64 for the RNN ops, got {ct}")));
    }
    if let Some(t) = ctx.opt_input("seq_lengths")? {
        let dt = t.data_type.unwrap_or(DataType::F32);
        if !dt.is_integer() {
            return Err(ctx.err(format!("input `seq_lengths` (tensor \"{}\") must be an integer tensor (i32 as cuDNN's), got {dt}", t.name)));
        }
        if t.dims != [a.batch] {
            return Err(ctx.err(format!("input `seq_lengths` (tensor \"{}\") must be [batch] = [{}], got dims {:?}", t.name, a.batch, t.dims)));
        }
    }
    if a.cell_mode != RnnMode::Lstm {
        for port in ["cx", "dcy"] {
            if ctx.node.input(port).is_some() {
                return Err(ctx.err(format!("input `{port}` is connected, but only an LSTM has a cell state (the cell is {})", a.cell_mode.name())));
            }
        }
        for port in ["cy", "dcx"] {
            if ctx.has_output(port) {
                return Err(ctx.err(format!("output `{port}` is connected, but only an LSTM has a cell state (the cell is {})", a.cell_mode.name())));
            }
        }
    }
    Ok(())
}

fn state_dims(a: &RnnDesc, cell: bool) -> Vec<i64> {
    vec![a.pseudo_layers(), a.batch, if cell { a.hidden_size } else { a.proj() }]
}

/// The type of the reserve and dgates tensors by default: f64 when the op computes in f64.
fn scratch_type(ctx: &InferCtx) -> DataType {
    if ctx.graph.compute_type(ctx.node) == DataType::F64 {
        DataType::F64
    } else {
        DataType::F32
    }
}

/// An output that must be floating point (reserve, dgates). Unless the user set its type, it
/// gets the scratch type whether virtual or not: the backward passes need its precision, which
/// the graph's intermediate type (f32 by default) would cut for an f64 problem.
fn float_output(ctx: &mut InferCtx, port: &str, default: DataType) -> Result<()> {
    if let Some(id) = ctx.node.output(port) {
        if let Some(t) = ctx.graph.tensors.get_mut(id.0) {
            if t.data_type.is_none() {
                t.data_type = Some(default);
            }
        }
        if let Some(dt) = ctx.graph.resolved_data_type(id) {
            if !dt.is_float() || dt.is_fp8() {
                return Err(ctx.err(format!("output `{port}` must be f16, bf16, f32 or f64, got {dt}")));
            }
        }
    }
    Ok(())
}

fn check_scratch_input(ctx: &InferCtx, port: &str, elements: i64, what: &str) -> Result<()> {
    let t = ctx.input(port)?;
    if t.dims != [elements] {
        return Err(ctx.err(format!("input `{port}` (tensor \"{}\") must be 1-D with {elements} elements ({what} of this descriptor), got dims {:?}", t.name, t.dims)));
    }
    float_input(ctx, port, &t)?;
    Ok(())
}

pub(crate) fn infer(ctx: &mut InferCtx, a: &RnnDesc) -> Result<()> {
    check_inputs(ctx, &["x", "weights", "hx", "cx", "seq_lengths", "seed", "offset"])?;
    check_common(ctx, a)?;
    let x = ctx.input("x")?;
    let dt = float_input(ctx, "x", &x)?;
    let xd = a.seq_dims(a.input_size);
    if x.dims != xd {
        return Err(ctx.err(format!(
            "input `x` (tensor \"{}\") must be {} = {xd:?} for layout {:?}, got dims {:?}",
            x.name,
            layout_words(a.layout, "input_size"),
            a.layout,
            x.dims
        )));
    }
    let w = ctx.input("weights")?;
    check_tensor(ctx, "weights", &w, &[a.weight_space_elements()], "[weight_space_elements]", dt)?;
    check_opt(ctx, "hx", &state_dims(a, false), "[num_layers * dirs, batch, proj_size]", dt)?;
    check_opt(ctx, "cx", &state_dims(a, true), "[num_layers * dirs, batch, hidden_size]", dt)?;
    let seed = ctx.opt_input("seed")?;
    let offset = ctx.opt_input("offset")?;
    if seed.is_some() != offset.is_some() {
        return Err(ctx.err("`seed` and `offset` must be given together"));
    }
    match a.dropout {
        Some(p) if p > 0.0 && seed.is_none() => return Err(ctx.err(format!("dropout {p} needs both `seed` and `offset` inputs"))),
        None if seed.is_some() => return Err(ctx.err("`seed` / `offset` are connected but dropout is unset")),
        _ => {}
    }
    for (port, t) in [("seed", &seed), ("offset", &offset)] {
        if let Some(t) = t {
            super::rng::check_seed_like(ctx, port, t)?;
        }
    }
    if ctx.has_output("reserve") != a.training {
        return Err(ctx.err(format!(
            "output `reserve` is {} but training is {}: the reserve is the training forward's output",
            if ctx.has_output("reserve") { "connected" } else { "not connected" },
            a.training
        )));
    }
    let yd = a.seq_dims(a.out_size());
    ctx.set_output("y", &yd, None, dt)?;
    ctx.set_output("hy", &state_dims(a, false), None, dt)?;
    if a.cell_mode == RnnMode::Lstm {
        ctx.set_output("cy", &state_dims(a, true), None, dt)?;
    }
    if a.training {
        let st = scratch_type(ctx);
        ctx.set_output("reserve", &[a.reserve_elements()], None, st)?;
        float_output(ctx, "reserve", st)?;
    }
    Ok(())
}

fn layout_words(layout: RnnLayout, features: &str) -> String {
    match layout {
        RnnLayout::SeqMajorUnpacked => format!("[max_seq_length, batch, {features}]"),
        RnnLayout::BatchMajorUnpacked => format!("[batch, max_seq_length, {features}]"),
        RnnLayout::SeqMajorPacked => format!("[max_seq_length * batch, {features}]"),
    }
}

pub(crate) fn infer_backward_data(ctx: &mut InferCtx, a: &RnnDesc) -> Result<()> {
    check_inputs(ctx, &["dy", "weights", "reserve", "hx", "cx", "dhy", "dcy", "seq_lengths"])?;
    check_common(ctx, a)?;
    let dy = ctx.input("dy")?;
    let dt = float_input(ctx, "dy", &dy)?;
    let yd = a.seq_dims(a.out_size());
    if dy.dims != yd {
        return Err(ctx.err(format!(
            "input `dy` (tensor \"{}\") must be {} = {yd:?} for layout {:?}, got dims {:?}",
            dy.name,
            layout_words(a.layout, "dirs * proj_size"),
            a.layout,
            dy.dims
        )));
    }
    let w = ctx.input("weights")?;
    check_tensor(ctx, "weights", &w, &[a.weight_space_elements()], "[weight_space_elements]", dt)?;
    check_scratch_input(ctx, "reserve", a.reserve_elements(), "reserve_elements")?;
    for (port, cell) in [("hx", false), ("dhy", false), ("cx", true), ("dcy", true)] {
        let what = if cell { "[num_layers * dirs, batch, hidden_size]" } else { "[num_layers * dirs, batch, proj_size]" };
        check_opt(ctx, port, &state_dims(a, cell), what, dt)?;
    }
    ctx.set_output("dx", &a.seq_dims(a.input_size), None, dt)?;
    ctx.set_output("dhx", &state_dims(a, false), None, dt)?;
    if a.cell_mode == RnnMode::Lstm {
        ctx.set_output("dcx", &state_dims(a, true), None, dt)?;
    }
    let st = scratch_type(ctx);
    ctx.set_output("dgates", &[a.dgates_elements()], None, st)?;
    float_output(ctx, "dgates", st)?;
    Ok(())
}

pub(crate) fn infer_backward_weights(ctx: &mut InferCtx, a: &RnnDesc) -> Result<()> {
    check_inputs(ctx, &["x", "reserve", "dgates", "hx", "seq_lengths", "dw_in"])?;
    check_common(ctx, a)?;
    let x = ctx.input("x")?;
    let dt = float_input(ctx, "x", &x)?;
    let xd = a.seq_dims(a.input_size);
    if x.dims != xd {
        return Err(ctx.err(format!(
            "input `x` (tensor \"{}\") must be {} = {xd:?} for layout {:?}, got dims {:?}",
            x.name,
            layout_words(a.layout, "input_size"),
            a.layout,
            x.dims
        )));
    }
    check_scratch_input(ctx, "reserve", a.reserve_elements(), "reserve_elements")?;
    check_scratch_input(ctx, "dgates", a.dgates_elements(), "dgates_elements")?;
    check_opt(ctx, "hx", &state_dims(a, false), "[num_layers * dirs, batch, proj_size]", dt)?;
    let wdt = match ctx.opt_input("dw_in")? {
        Some(t) => {
            if t.dims != [a.weight_space_elements()] {
                return Err(ctx.err(format!("input `dw_in` (tensor \"{}\") must be [weight_space_elements] = [{}], got dims {:?}", t.name, a.weight_space_elements(), t.dims)));
            }
            float_input(ctx, "dw_in", &t)?
        }
        None => dt,
    };
    ctx.set_output("dw", &[a.weight_space_elements()], None, wdt)?;
    if let Some(id) = ctx.node.output("dw") {
        if let Some(odt) = ctx.graph.resolved_data_type(id) {
            if !odt.is_float() || odt.is_fp8() {
                return Err(ctx.err(format!("output `dw` must be f16, bf16, f32 or f64, got {odt}")));
            }
        }
    }
    Ok(())
}
