//! Normalizations: batchnorm (training, inference, backward), genstats, bn_finalize,
//! layernorm, rmsnorm, instancenorm, groupnorm, adalayernorm and their backward forms.
//!
//! Every one normalizes `x` over a set of its axes (the cuDNN conventions):
//!
//! | op            | x                  | statistics over         | stats dims        | scale / bias dims            |
//! |---------------|--------------------|-------------------------|-------------------|------------------------------|
//! | layernorm     | `[N, ...]`         | every axis but 0        | `[N, 1, ..., 1]`  | `[1, ...]`, each dim full or 1 |
//! | rmsnorm       | `[N, ...]`         | every axis but 0        | `[N, 1, ..., 1]`  | as layernorm                 |
//! | instancenorm  | `[N, C, ...]`      | the spatial axes (2..)  | `[N, C, 1, ..., 1]` | `[1, C, 1, ..., 1]`        |
//! | groupnorm     | `[N, C, ...]`      | a group's C/G channels and every spatial axis | `[N, G, 1, ..., 1]` | `[1, C, 1, ..., 1]` |
//! | adalayernorm  | `[B, S..., D]`     | the last axis           | `[B, S..., 1]`    | `[B or 1, S or 1..., D]`     |
//! | batchnorm     | `[N, C, ...]`      | every axis but 1        | `[1, C, 1, ..., 1]` | `[1, C, 1, ..., 1]`        |
//!
//! `y = (x - mean) * inv_variance * scale + bias` with `inv_variance = 1 / sqrt(var + epsilon)`
//! and the biased variance (rmsnorm: `y = x * inv_rms * scale (+ bias)`, `inv_rms` reported as
//! `inv_variance`). Statistics outputs default to f32 (f64 when `x` is f64). All tensors must
//! be floating point.
//!
//! ```
//! use ferrodnn::{DataType, Graph, TensorDesc};
//! use ferrodnn::graph::ops::norm::NormAttrs;
//! let mut g = Graph::new("ln");
//! let x = g.tensor(TensorDesc::new("x", &[4, 16], DataType::F32));
//! let scale = g.tensor(TensorDesc::new("scale", &[1, 16], DataType::F32));
//! let bias = g.tensor(TensorDesc::new("bias", &[1, 16], DataType::F32));
//! let (y, mean, inv_var) = g.layernorm(x, scale, bias, NormAttrs::default());
//! g.set_output(y);
//! g.validate().unwrap();
//! assert_eq!(g.desc(mean.unwrap()).dims, vec![4, 1]);
//! assert!(inv_var.is_some());
//! ```

use super::Op;
use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::{Graph, InferCtx, Node, TensorDesc, TensorId};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormPhase {
    /// Produce the statistics (`mean`, `inv_variance`) along with `y`.
    #[default]
    Training,
    /// Produce `y` only.
    Inference,
}

/// Attributes shared by the normalizations. `phase` matters to the forward ops with optional
/// statistics outputs (layernorm, rmsnorm, instancenorm, adalayernorm); `epsilon` to the
/// forward ops that compute statistics. Backward ops and batchnorm_inference ignore both.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NormAttrs {
    #[serde(default)]
    pub phase: NormPhase,
    #[serde(default = "default_epsilon")]
    pub epsilon: f64,
}

impl Default for NormAttrs {
    fn default() -> Self {
        NormAttrs { phase: NormPhase::Training, epsilon: default_epsilon() }
    }
}

impl NormAttrs {
    pub fn inference() -> NormAttrs {
        NormAttrs { phase: NormPhase::Inference, ..NormAttrs::default() }
    }
    pub fn with_epsilon(mut self, epsilon: f64) -> NormAttrs {
        self.epsilon = epsilon;
        self
    }
}

fn default_epsilon() -> f64 {
    1e-5
}

/// Group normalization (forward and backward): the channels (axis 1) split into `groups`
/// groups of `C / groups` consecutive channels; `phase` and `epsilon` as in [`NormAttrs`] (the
/// backward ignores both).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupnormAttrs {
    #[serde(default)]
    pub phase: NormPhase,
    #[serde(default = "default_epsilon")]
    pub epsilon: f64,
    /// Channel groups: C must be a multiple.
    pub groups: i64,
}

impl GroupnormAttrs {
    /// The training phase with `groups` groups and epsilon 1e-5 (PyTorch's default).
    pub fn new(groups: i64) -> GroupnormAttrs {
        GroupnormAttrs { phase: NormPhase::Training, epsilon: default_epsilon(), groups }
    }
    /// The same in the inference phase (`y` only).
    pub fn inference(mut self) -> GroupnormAttrs {
        self.phase = NormPhase::Inference;
        self
    }
    pub fn with_epsilon(mut self, epsilon: f64) -> GroupnormAttrs {
        self.epsilon = epsilon;
        self
    }
}

/// The dims of group normalization's statistics for an x of dims `x_dims` (`[N, C, ...]`) in
/// `groups` groups: `[N, groups, 1, ..., 1]`.
pub fn groupnorm_stats_dims(x_dims: &[i64], groups: i64) -> Vec<i64> {
    x_dims
        .iter()
        .enumerate()
        .map(|(a, &d)| {
            if a == 0 {
                d
            } else if a == 1 {
                groups
            } else {
                1
            }
        })
        .collect()
}

/// Batchnorm training forward.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchnormAttrs {
    #[serde(default = "default_epsilon")]
    pub epsilon: f64,
    /// running = (1 - momentum) * running + momentum * batch statistic.
    #[serde(default = "default_momentum")]
    pub momentum: f64,
}

impl Default for BatchnormAttrs {
    fn default() -> Self {
        BatchnormAttrs { epsilon: default_epsilon(), momentum: default_momentum() }
    }
}

fn default_momentum() -> f64 {
    0.1
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BnFinalizeAttrs {
    #[serde(default = "default_epsilon")]
    pub epsilon: f64,
    #[serde(default = "default_momentum")]
    pub momentum: f64,
    /// Number of elements per channel the sums were taken over.
    pub accum_count: i64,
}

impl BnFinalizeAttrs {
    pub fn new(accum_count: i64) -> BnFinalizeAttrs {
        BnFinalizeAttrs { epsilon: default_epsilon(), momentum: default_momentum(), accum_count }
    }
}

/// The prefix of batchnorm's peer-statistics input ports: `peer_stats_0`, `peer_stats_1`, ...
pub const PEER_STATS_PREFIX: &str = "peer_stats_";

/// Outputs of [`Graph::batchnorm`]: `y`, `mean`, `inv_variance`, and
/// `(out_running_mean, out_running_var)` when running statistics were given.
pub type BatchnormOutputs = (TensorId, TensorId, TensorId, Option<(TensorId, TensorId)>);

/// Outputs of [`Graph::bn_finalize`]: `eq_scale`, `eq_bias`, `saved_mean`, `saved_inv_std`, and
/// `(next_running_mean, next_running_var)` when previous running statistics were given.
pub type BnFinalizeOutputs = (TensorId, TensorId, TensorId, TensorId, Option<(TensorId, TensorId)>);

// ----------------------------------------------------------------------------------------------
// Builders
// ----------------------------------------------------------------------------------------------

impl Graph {
    /// Forward op with outputs `y` and, in the training phase, `mean` and `inv_variance`.
    fn norm_forward(&mut self, op: Op, inputs: Vec<(&str, TensorId)>, training: bool, stats: &[&str]) -> (TensorId, Vec<TensorId>) {
        let mut outs = vec!["y"];
        if training {
            outs.extend_from_slice(stats);
        }
        let ids = self.add_node(op, None, inputs, &outs);
        (ids[0], ids[1..].to_vec())
    }

    /// Layer normalization over every axis of `x` but axis 0. Ports: `x`, `scale`, `bias` in;
    /// `y`, and in the training phase `mean` and `inv_variance` (dims `[N, 1, ..., 1]`) out.
    /// `scale` and `bias` are `[1, ...]` with each later dim equal to x's or 1 (broadcast).
    pub fn layernorm(&mut self, x: TensorId, scale: TensorId, bias: TensorId, attrs: NormAttrs) -> (TensorId, Option<TensorId>, Option<TensorId>) {
        let training = attrs.phase == NormPhase::Training;
        let (y, s) = self.norm_forward(Op::Layernorm(attrs), vec![("x", x), ("scale", scale), ("bias", bias)], training, &["mean", "inv_variance"]);
        (y, s.first().copied(), s.get(1).copied())
    }

    /// Gradient of [`Graph::layernorm`]. Ports: `dy`, `x`, `scale`, `mean`, `inv_variance` in;
    /// `dx`, `dscale`, `dbias` (shaped like `scale`) out. Returns `(dx, dscale, dbias)`.
    pub fn layernorm_backward(&mut self, dy: TensorId, x: TensorId, scale: TensorId, mean: TensorId, inv_variance: TensorId) -> (TensorId, TensorId, TensorId) {
        let ids = self.add_node(
            Op::LayernormBackward(NormAttrs::default()),
            None,
            vec![("dy", dy), ("x", x), ("scale", scale), ("mean", mean), ("inv_variance", inv_variance)],
            &["dx", "dscale", "dbias"],
        );
        (ids[0], ids[1], ids[2])
    }

    /// RMS normalization over every axis of `x` but axis 0: `y = x * inv_rms * scale (+ bias)`
    /// with `inv_rms = 1 / sqrt(mean(x^2) + epsilon)`. Ports: `x`, `scale`, optional `bias` in;
    /// `y` and, in the training phase, `inv_variance` (the `inv_rms`, dims `[N, 1, ..., 1]`).
    pub fn rmsnorm(&mut self, x: TensorId, scale: TensorId, bias: Option<TensorId>, attrs: NormAttrs) -> (TensorId, Option<TensorId>) {
        let training = attrs.phase == NormPhase::Training;
        let mut inputs = vec![("x", x), ("scale", scale)];
        if let Some(b) = bias {
            inputs.push(("bias", b));
        }
        let (y, s) = self.norm_forward(Op::Rmsnorm(attrs), inputs, training, &["inv_variance"]);
        (y, s.first().copied())
    }

    /// Gradient of [`Graph::rmsnorm`]. Ports: `dy`, `x`, `scale`, `inv_variance` in; `dx`,
    /// `dscale` and (when `with_dbias`) `dbias` out.
    pub fn rmsnorm_backward(&mut self, dy: TensorId, x: TensorId, scale: TensorId, inv_variance: TensorId, with_dbias: bool) -> (TensorId, TensorId, Option<TensorId>) {
        let outs: &[&str] = if with_dbias { &["dx", "dscale", "dbias"] } else { &["dx", "dscale"] };
        let ids = self.add_node(Op::RmsnormBackward(NormAttrs::default()), None, vec![("dy", dy), ("x", x), ("scale", scale), ("inv_variance", inv_variance)], outs);
        (ids[0], ids[1], ids.get(2).copied())
    }

    /// Batch normalization, training forward: statistics per channel (axis 1) over every other
    /// axis, combined with the peers' partial statistics when `peer_stats` is not empty
    /// (synchronized batchnorm). Ports: `x`, `scale`, `bias` (`[1, C, 1, ...]`), optional
    /// `in_running_mean` and `in_running_var` (both or neither), `peer_stats_0`, `peer_stats_1`,
    /// ... in; `y`, `mean`, `inv_variance` (`[1, C, 1, ...]`) and, with running inputs,
    /// `out_running_mean`, `out_running_var` out.
    ///
    /// Each peer statistics tensor has dims `[2, C, 1, ...]` (the rank of x): row 0 holds
    /// another device's per-channel sum of x and row 1 its sum of squares, each over as many
    /// elements per channel as the local x has. The running variance is updated with the
    /// unbiased variance (times `n / (n - 1)`, `n` counting the peers' elements too), as
    /// PyTorch does; `inv_variance` uses the biased one.
    pub fn batchnorm(
        &mut self,
        x: TensorId,
        scale: TensorId,
        bias: TensorId,
        running: Option<(TensorId, TensorId)>,
        peer_stats: &[TensorId],
        attrs: BatchnormAttrs,
    ) -> BatchnormOutputs {
        let mut inputs = vec![("x", x), ("scale", scale), ("bias", bias)];
        let mut outs = vec!["y", "mean", "inv_variance"];
        if let Some((m, v)) = running {
            inputs.push(("in_running_mean", m));
            inputs.push(("in_running_var", v));
            outs.push("out_running_mean");
            outs.push("out_running_var");
        }
        let peer_names: Vec<String> = (0..peer_stats.len()).map(|i| format!("{PEER_STATS_PREFIX}{i}")).collect();
        for (name, &t) in peer_names.iter().zip(peer_stats) {
            inputs.push((name.as_str(), t));
        }
        let ids = self.add_node(Op::Batchnorm(attrs), None, inputs, &outs);
        let running_out = if running.is_some() { Some((ids[3], ids[4])) } else { None };
        (ids[0], ids[1], ids[2], running_out)
    }

    /// Batchnorm with given statistics: `y = (x - mean) * inv_variance * scale + bias`. Ports:
    /// `x`, `scale`, `bias`, `mean`, `inv_variance` (all but x `[1, C, 1, ...]`) in; `y` out.
    pub fn batchnorm_inference(&mut self, x: TensorId, scale: TensorId, bias: TensorId, mean: TensorId, inv_variance: TensorId) -> TensorId {
        self.add_node(Op::BatchnormInference(NormAttrs::default()), None, vec![("x", x), ("scale", scale), ("bias", bias), ("mean", mean), ("inv_variance", inv_variance)], &["y"])
            [0]
    }

    /// Gradient of training-mode batchnorm (through the batch statistics). Ports: `dy`, `x`,
    /// `scale`, `mean`, `inv_variance` in; `dx`, `dscale`, `dbias` out.
    pub fn batchnorm_backward(&mut self, dy: TensorId, x: TensorId, scale: TensorId, mean: TensorId, inv_variance: TensorId) -> (TensorId, TensorId, TensorId) {
        let ids = self.add_node(
            Op::BatchnormBackward(NormAttrs::default()),
            None,
            vec![("dy", dy), ("x", x), ("scale", scale), ("mean", mean), ("inv_variance", inv_variance)],
            &["dx", "dscale", "dbias"],
        );
        (ids[0], ids[1], ids[2])
    }

    /// Per-channel sum and sum of squares of `x` (over every axis but 1). Ports: `x` in;
    /// `sum`, `sq_sum` (`[1, C, 1, ...]`) out.
    pub fn genstats(&mut self, x: TensorId) -> (TensorId, TensorId) {
        let ids = self.add_node(Op::Genstats(NormAttrs::default()), None, vec![("x", x)], &["sum", "sq_sum"]);
        (ids[0], ids[1])
    }

    /// Turns per-channel sums (from genstats, over `accum_count` elements per channel) into
    /// batchnorm's equivalent affine map `y = x * eq_scale + eq_bias`, with `eq_scale = scale *
    /// inv_std` and `eq_bias = bias - mean * eq_scale`. Ports: `sum`, `sq_sum`, `scale`, `bias`,
    /// optional `prev_running_mean`, `prev_running_var` in (all `[1, C, 1, ...]`); `eq_scale`,
    /// `eq_bias`, `saved_mean`, `saved_inv_std` and, with running inputs, `next_running_mean`,
    /// `next_running_var` (unbiased variance, as batchnorm) out.
    pub fn bn_finalize(
        &mut self,
        sum: TensorId,
        sq_sum: TensorId,
        scale: TensorId,
        bias: TensorId,
        running: Option<(TensorId, TensorId)>,
        attrs: BnFinalizeAttrs,
    ) -> BnFinalizeOutputs {
        let mut inputs = vec![("sum", sum), ("sq_sum", sq_sum), ("scale", scale), ("bias", bias)];
        let mut outs = vec!["eq_scale", "eq_bias", "saved_mean", "saved_inv_std"];
        if let Some((m, v)) = running {
            inputs.push(("prev_running_mean", m));
            inputs.push(("prev_running_var", v));
            outs.push("next_running_mean");
            outs.push("next_running_var");
        }
        let ids = self.add_node(Op::BnFinalize(attrs), None, inputs, &outs);
        let running_out = if running.is_some() { Some((ids[4], ids[5])) } else { None };
        (ids[0], ids[1], ids[2], ids[3], running_out)
    }

    /// Instance normalization: statistics per (n, c) over the spatial axes of `x` `[N, C, ...]`
    /// (rank 3 or more). Ports: `x`, `scale`, `bias` (`[1, C, 1, ...]`) in; `y` and, in the
    /// training phase, `mean`, `inv_variance` (`[N, C, 1, ...]`) out.
    pub fn instancenorm(&mut self, x: TensorId, scale: TensorId, bias: TensorId, attrs: NormAttrs) -> (TensorId, Option<TensorId>, Option<TensorId>) {
        let training = attrs.phase == NormPhase::Training;
        let (y, s) = self.norm_forward(Op::Instancenorm(attrs), vec![("x", x), ("scale", scale), ("bias", bias)], training, &["mean", "inv_variance"]);
        (y, s.first().copied(), s.get(1).copied())
    }

    /// Gradient of [`Graph::instancenorm`]. Ports as [`Graph::layernorm_backward`].
    pub fn instancenorm_backward(&mut self, dy: TensorId, x: TensorId, scale: TensorId, mean: TensorId, inv_variance: TensorId) -> (TensorId, TensorId, TensorId) {
        let ids = self.add_node(
            Op::InstancenormBackward(NormAttrs::default()),
            None,
            vec![("dy", dy), ("x", x), ("scale", scale), ("mean", mean), ("inv_variance", inv_variance)],
            &["dx", "dscale", "dbias"],
        );
        (ids[0], ids[1], ids[2])
    }

    /// Group normalization (PyTorch's `group_norm`): the channels of `x` `[N, C, ...]` (rank 2 or
    /// more) split into `attrs.groups` groups of `C / groups` consecutive channels; statistics
    /// per (n, group) over the group's channels and every spatial position; `y = (x - mean) *
    /// inv_variance * scale[c] + bias[c]`. Ports: `x`, `scale`, `bias` (`[1, C, 1, ...]`) in;
    /// `y` and, in the training phase, `mean`, `inv_variance` (`[N, G, 1, ...]`) out.
    ///
    /// ```
    /// use ferrodnn::{DataType, Graph, TensorDesc};
    /// use ferrodnn::graph::ops::norm::GroupnormAttrs;
    /// let mut g = Graph::new("gn");
    /// let x = g.tensor(TensorDesc::new("x", &[2, 12, 5, 5], DataType::F32));
    /// let scale = g.tensor(TensorDesc::new("scale", &[1, 12, 1, 1], DataType::F32));
    /// let bias = g.tensor(TensorDesc::new("bias", &[1, 12, 1, 1], DataType::F32));
    /// let (y, mean, _) = g.groupnorm(x, scale, bias, GroupnormAttrs::new(3));
    /// g.set_output(y);
    /// g.validate().unwrap();
    /// assert_eq!(g.desc(mean.unwrap()).dims, vec![2, 3, 1, 1]);
    /// ```
    pub fn groupnorm(&mut self, x: TensorId, scale: TensorId, bias: TensorId, attrs: GroupnormAttrs) -> (TensorId, Option<TensorId>, Option<TensorId>) {
        let training = attrs.phase == NormPhase::Training;
        let (y, s) = self.norm_forward(Op::Groupnorm(attrs), vec![("x", x), ("scale", scale), ("bias", bias)], training, &["mean", "inv_variance"]);
        (y, s.first().copied(), s.get(1).copied())
    }

    /// Gradient of [`Graph::groupnorm`] with `groups` groups. Ports as
    /// [`Graph::layernorm_backward`] (`mean` and `inv_variance` `[N, G, 1, ...]`); `dscale` and
    /// `dbias` are shaped like `scale`.
    pub fn groupnorm_backward(&mut self, dy: TensorId, x: TensorId, scale: TensorId, mean: TensorId, inv_variance: TensorId, groups: i64) -> (TensorId, TensorId, TensorId) {
        let ids = self.add_node(
            Op::GroupnormBackward(GroupnormAttrs::new(groups)),
            None,
            vec![("dy", dy), ("x", x), ("scale", scale), ("mean", mean), ("inv_variance", inv_variance)],
            &["dx", "dscale", "dbias"],
        );
        (ids[0], ids[1], ids[2])
    }

    /// Adaptive layer normalization: statistics over the last axis of `x` `[B, S..., D]`, with a
    /// scale and bias per batch `[B, 1, ..., D]` (each dim but the last may also be 1, or the
    /// middle ones full). Ports: `x`, `scale`, `bias` in; `y` and, in the training phase,
    /// `mean`, `inv_variance` (`[B, S..., 1]`) out.
    pub fn adalayernorm(&mut self, x: TensorId, scale: TensorId, bias: TensorId, attrs: NormAttrs) -> (TensorId, Option<TensorId>, Option<TensorId>) {
        let training = attrs.phase == NormPhase::Training;
        let (y, s) = self.norm_forward(Op::Adalayernorm(attrs), vec![("x", x), ("scale", scale), ("bias", bias)], training, &["mean", "inv_variance"]);
        (y, s.first().copied(), s.get(1).copied())
    }

    /// Gradient of [`Graph::adalayernorm`]; `dscale` and `dbias` are shaped like `scale`.
    pub fn adalayernorm_backward(&mut self, dy: TensorId, x: TensorId, scale: TensorId, mean: TensorId, inv_variance: TensorId) -> (TensorId, TensorId, TensorId) {
        let ids = self.add_node(
            Op::AdalayernormBackward(NormAttrs::default()),
            None,
            vec![("dy", dy), ("x", x), ("scale", scale), ("mean", mean), ("inv_variance", inv_variance)],
            &["dx", "dscale", "dbias"],
        );
        (ids[0], ids[1], ids[2])
    }
}

// ----------------------------------------------------------------------------------------------
// Axes conventions (shared with the CPU engine)
// ----------------------------------------------------------------------------------------------

/// Which axes of x a normalization takes its statistics over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NormAxes {
    /// Every axis but 0 (layernorm, rmsnorm).
    Layer,
    /// Axes 2.. (instancenorm).
    Instance,
    /// The last axis (adalayernorm).
    AdaLayer,
    /// Every axis but 1 (batchnorm).
    Batch,
}

/// How a dim of scale/bias relates to the same dim of x.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ParamDim {
    One,
    Full,
    OneOrFull,
}

impl NormAxes {
    /// For each axis of an x of rank `rank`: whether the statistics are taken over it.
    pub(crate) fn reduced(self, rank: usize) -> Vec<bool> {
        (0..rank)
            .map(|a| match self {
                NormAxes::Layer => a >= 1,
                NormAxes::Instance => a >= 2,
                NormAxes::AdaLayer => a + 1 == rank,
                NormAxes::Batch => a != 1,
            })
            .collect()
    }

    /// The dims of the statistics of an x of dims `x_dims`: x's dims with the reduced axes 1.
    pub(crate) fn stats_dims<T: Copy + From<u8>>(self, x_dims: &[T]) -> Vec<T> {
        x_dims.iter().zip(self.reduced(x_dims.len())).map(|(&d, r)| if r { T::from(1u8) } else { d }).collect()
    }

    fn min_rank(self) -> usize {
        match self {
            NormAxes::Instance => 3,
            _ => 2,
        }
    }

    fn rank_reason(self) -> &'static str {
        match self {
            NormAxes::Instance => "[N, C, spatial...]",
            NormAxes::AdaLayer => "[B, ..., D]",
            NormAxes::Batch => "[N, C, ...]",
            NormAxes::Layer => "[N, ...]",
        }
    }

    /// What each dim of scale/bias may be.
    fn param_dim(self, rank: usize, axis: usize) -> ParamDim {
        match self {
            NormAxes::Layer => {
                if axis == 0 {
                    ParamDim::One
                } else {
                    ParamDim::OneOrFull
                }
            }
            NormAxes::Instance | NormAxes::Batch => {
                if axis == 1 {
                    ParamDim::Full
                } else {
                    ParamDim::One
                }
            }
            NormAxes::AdaLayer => {
                if axis + 1 == rank {
                    ParamDim::Full
                } else {
                    ParamDim::OneOrFull
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------------------------
// Checks
// ----------------------------------------------------------------------------------------------

/// Every connected port is one the op knows (a misspelt port would otherwise be ignored).
fn check_ports(ctx: &InferCtx, inputs: &[&str], outputs: &[&str], peers: bool) -> Result<()> {
    for p in &ctx.node.inputs {
        let known = inputs.contains(&p.name.as_str()) || (peers && p.name.starts_with(PEER_STATS_PREFIX));
        if !known {
            return Err(ctx.err(format!("has no input port `{}` (its inputs are {})", p.name, list(inputs))));
        }
    }
    for p in &ctx.node.outputs {
        if !outputs.contains(&p.name.as_str()) {
            return Err(ctx.err(format!("has no output port `{}` (its outputs are {})", p.name, list(outputs))));
        }
    }
    Ok(())
}

fn list(ports: &[&str]) -> String {
    ports.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", ")
}

fn require_output(ctx: &InferCtx, port: &str) -> Result<()> {
    if ctx.has_output(port) {
        Ok(())
    } else {
        Err(ctx.err(format!("output `{port}` is missing")))
    }
}

/// A float input (normalizations take no integers).
fn float_input(ctx: &InferCtx, port: &str) -> Result<TensorDesc> {
    let d = ctx.input(port)?;
    check_float(ctx, port, &d)?;
    Ok(d)
}

fn opt_float_input(ctx: &InferCtx, port: &str) -> Result<Option<TensorDesc>> {
    match ctx.opt_input(port)? {
        Some(d) => {
            check_float(ctx, port, &d)?;
            Ok(Some(d))
        }
        None => Ok(None),
    }
}

fn check_float(ctx: &InferCtx, port: &str, d: &TensorDesc) -> Result<()> {
    let t = d.data_type.unwrap_or(DataType::F32);
    if t.is_float() {
        Ok(())
    } else {
        Err(ctx.err(format!("input `{port}` (tensor \"{}\") is {t}, but normalizations take floating-point tensors only", d.name)))
    }
}

fn dtype(d: &TensorDesc) -> DataType {
    d.data_type.unwrap_or(DataType::F32)
}

/// The default type of statistics computed from a tensor of type `t`: f32, or f64 for f64.
fn stats_type(t: DataType) -> DataType {
    if t == DataType::F64 {
        DataType::F64
    } else {
        DataType::F32
    }
}

fn check_epsilon(ctx: &InferCtx, epsilon: f64) -> Result<()> {
    Node::attribute_rule("epsilon", epsilon).map_or(Ok(()), |m| Err(ctx.err(m)))
}

fn check_momentum(ctx: &InferCtx, momentum: f64) -> Result<()> {
    Node::attribute_rule("momentum", momentum).map_or(Ok(()), |m| Err(ctx.err(m)))
}

/// x of a normalization: float, rank at least the op's minimum.
fn norm_x(ctx: &InferCtx, port: &str, axes: NormAxes) -> Result<TensorDesc> {
    let x = float_input(ctx, port)?;
    if x.dims.len() < axes.min_rank() {
        return Err(ctx.err(format!("input `{port}` must have rank {} or more ({}), got dims {:?}", axes.min_rank(), axes.rank_reason(), x.dims)));
    }
    Ok(x)
}

/// scale or bias: same rank as x, each dim as the op's convention allows.
fn check_param(ctx: &InferCtx, port: &str, p: &TensorDesc, x: &TensorDesc, axes: NormAxes) -> Result<()> {
    let rank = x.dims.len();
    let rules: Vec<ParamDim> = (0..rank).map(|a| axes.param_dim(rank, a)).collect();
    let pattern = {
        let parts: Vec<String> = rules
            .iter()
            .zip(&x.dims)
            .map(|(r, &d)| match r {
                ParamDim::One => "1".to_string(),
                ParamDim::Full => d.to_string(),
                ParamDim::OneOrFull if d == 1 => "1".to_string(),
                ParamDim::OneOrFull => format!("{d} or 1"),
            })
            .collect();
        format!("[{}]", parts.join(", "))
    };
    if p.dims.len() != rank {
        return Err(ctx.err(format!("input `{port}` has rank {} (dims {:?}) but x {:?} has rank {rank}: it must be {pattern}", p.dims.len(), p.dims, x.dims)));
    }
    for (a, ((&pd, &xd), r)) in p.dims.iter().zip(&x.dims).zip(&rules).enumerate() {
        let ok = match r {
            ParamDim::One => pd == 1,
            ParamDim::Full => pd == xd,
            ParamDim::OneOrFull => pd == 1 || pd == xd,
        };
        if !ok {
            if a == 1 && matches!(axes, NormAxes::Batch | NormAxes::Instance) {
                return Err(ctx.err(format!("input `{port}` has {pd} channels but x has {xd}: it must be {pattern}, got {:?}", p.dims)));
            }
            return Err(ctx.err(format!("input `{port}` has dims {:?}, but for x {:?} it must be {pattern}", p.dims, x.dims)));
        }
    }
    Ok(())
}

/// A statistics input (mean, inv_variance, running stats): float, exactly the stats dims.
fn check_stats_input(ctx: &InferCtx, port: &str, s: &TensorDesc, want: &[i64], x: &TensorDesc) -> Result<()> {
    check_float(ctx, port, s)?;
    if s.dims != want {
        return Err(ctx.err(format!("input `{port}` has dims {:?}, but the statistics of x {:?} have dims {want:?}", s.dims, x.dims)));
    }
    Ok(())
}

fn check_same_dims(ctx: &InferCtx, port: &str, d: &TensorDesc, x: &TensorDesc) -> Result<()> {
    if d.dims != x.dims {
        return Err(ctx.err(format!("input `{port}` has dims {:?} but x has {:?}; they must match", d.dims, x.dims)));
    }
    Ok(())
}

/// Training phase: the statistics outputs are all there; inference: none is.
fn check_phase_outputs(ctx: &InferCtx, phase: NormPhase, stats: &[&str]) -> Result<()> {
    for s in stats {
        match (phase, ctx.has_output(s)) {
            (NormPhase::Training, false) => return Err(ctx.err(format!("the training phase produces output `{s}`, but it is not connected"))),
            (NormPhase::Inference, true) => return Err(ctx.err(format!("the inference phase produces only `y`, but output `{s}` is connected (use the training phase)"))),
            _ => {}
        }
    }
    Ok(())
}

// ----------------------------------------------------------------------------------------------
// Inference
// ----------------------------------------------------------------------------------------------

/// layernorm, rmsnorm, instancenorm, adalayernorm.
fn infer_norm_forward(ctx: &mut InferCtx, a: &NormAttrs, axes: NormAxes, rms: bool) -> Result<()> {
    let stats: &[&str] = if rms { &["inv_variance"] } else { &["mean", "inv_variance"] };
    let mut outputs = vec!["y"];
    outputs.extend_from_slice(stats);
    check_ports(ctx, &["x", "scale", "bias", "epsilon"], &outputs, false)?;
    check_epsilon(ctx, a.epsilon)?;
    ctx.scalar_attribute("epsilon", |v| check_epsilon(ctx, v))?;
    let x = norm_x(ctx, "x", axes)?;
    let scale = float_input(ctx, "scale")?;
    check_param(ctx, "scale", &scale, &x, axes)?;
    let bias = if rms { opt_float_input(ctx, "bias")? } else { Some(float_input(ctx, "bias")?) };
    if let Some(b) = &bias {
        check_param(ctx, "bias", b, &x, axes)?;
    }
    require_output(ctx, "y")?;
    check_phase_outputs(ctx, a.phase, stats)?;
    let sdims = axes.stats_dims(&x.dims);
    let st = stats_type(dtype(&x));
    ctx.set_output("y", &x.dims, Some(&x), dtype(&x))?;
    for s in stats {
        ctx.set_output(s, &sdims, None, st)?;
    }
    Ok(())
}

/// The backward forms of layernorm, rmsnorm, instancenorm, adalayernorm and batchnorm.
fn infer_norm_backward(ctx: &mut InferCtx, axes: NormAxes, rms: bool) -> Result<()> {
    let inputs: &[&str] = if rms { &["dy", "x", "scale", "inv_variance"] } else { &["dy", "x", "scale", "mean", "inv_variance"] };
    check_ports(ctx, inputs, &["dx", "dscale", "dbias"], false)?;
    let x = norm_x(ctx, "x", axes)?;
    let dy = float_input(ctx, "dy")?;
    check_same_dims(ctx, "dy", &dy, &x)?;
    let scale = float_input(ctx, "scale")?;
    check_param(ctx, "scale", &scale, &x, axes)?;
    let sdims = axes.stats_dims(&x.dims);
    if !rms {
        let mean = float_input(ctx, "mean")?;
        check_stats_input(ctx, "mean", &mean, &sdims, &x)?;
    }
    let inv = float_input(ctx, "inv_variance")?;
    check_stats_input(ctx, "inv_variance", &inv, &sdims, &x)?;
    require_output(ctx, "dx")?;
    require_output(ctx, "dscale")?;
    if !rms {
        require_output(ctx, "dbias")?;
    }
    ctx.set_output("dx", &x.dims, Some(&x), dtype(&x))?;
    ctx.set_output("dscale", &scale.dims, Some(&scale), dtype(&scale))?;
    ctx.set_output("dbias", &scale.dims, Some(&scale), dtype(&scale))
}

/// Batchnorm's peer statistics ports, in index order; they must be `peer_stats_0..k`.
pub(crate) fn peer_ports(node: &crate::graph::Node) -> std::result::Result<Vec<(usize, TensorId)>, String> {
    let mut peers = Vec::new();
    for p in &node.inputs {
        if let Some(rest) = p.name.strip_prefix(PEER_STATS_PREFIX) {
            let i: usize = rest.parse().map_err(|_| format!("input port `{}` is not `{PEER_STATS_PREFIX}<index>`", p.name))?;
            peers.push((i, p.tensor));
        }
    }
    peers.sort_by_key(|&(i, _)| i);
    for (k, &(i, _)) in peers.iter().enumerate() {
        if i != k {
            return Err(format!(
                "peer statistics ports must be numbered {PEER_STATS_PREFIX}0 to {PEER_STATS_PREFIX}{} without gaps or repeats, but `{PEER_STATS_PREFIX}{k}` is missing or repeated",
                peers.len() - 1
            ));
        }
    }
    Ok(peers)
}

/// Both ports of a pair or neither.
fn running_pair(ctx: &InferCtx, mean_port: &str, var_port: &str) -> Result<Option<(TensorDesc, TensorDesc)>> {
    let m = opt_float_input(ctx, mean_port)?;
    let v = opt_float_input(ctx, var_port)?;
    match (m, v) {
        (Some(m), Some(v)) => Ok(Some((m, v))),
        (None, None) => Ok(None),
        (Some(_), None) => Err(ctx.err(format!("input `{mean_port}` is given without `{var_port}`; give both running statistics or neither"))),
        (None, Some(_)) => Err(ctx.err(format!("input `{var_port}` is given without `{mean_port}`; give both running statistics or neither"))),
    }
}

/// Output ports that exist exactly when `present`.
fn check_optional_outputs(ctx: &InferCtx, ports: &[&str], present: bool, because: &str) -> Result<()> {
    for p in ports {
        match (present, ctx.has_output(p)) {
            (true, false) => return Err(ctx.err(format!("output `{p}` is missing: it is produced when {because} given"))),
            (false, true) => return Err(ctx.err(format!("output `{p}` is connected, but it is only produced when {because} given"))),
            _ => {}
        }
    }
    Ok(())
}

pub(crate) fn infer_batchnorm(ctx: &mut InferCtx, a: &BatchnormAttrs) -> Result<()> {
    check_ports(
        ctx,
        &["x", "scale", "bias", "in_running_mean", "in_running_var", "epsilon", "momentum"],
        &["y", "mean", "inv_variance", "out_running_mean", "out_running_var"],
        true,
    )?;
    check_epsilon(ctx, a.epsilon)?;
    check_momentum(ctx, a.momentum)?;
    ctx.scalar_attribute("epsilon", |v| check_epsilon(ctx, v))?;
    ctx.scalar_attribute("momentum", |v| check_momentum(ctx, v))?;
    let axes = NormAxes::Batch;
    let x = norm_x(ctx, "x", axes)?;
    let scale = float_input(ctx, "scale")?;
    check_param(ctx, "scale", &scale, &x, axes)?;
    let bias = float_input(ctx, "bias")?;
    check_param(ctx, "bias", &bias, &x, axes)?;
    let sdims = axes.stats_dims(&x.dims);
    let running = running_pair(ctx, "in_running_mean", "in_running_var")?;
    if let Some((m, v)) = &running {
        check_stats_input(ctx, "in_running_mean", m, &sdims, &x)?;
        check_stats_input(ctx, "in_running_var", v, &sdims, &x)?;
    }
    let peers = peer_ports(ctx.node).map_err(|m| ctx.err(m))?;
    let mut peer_dims = sdims.clone();
    peer_dims[0] = 2;
    for (i, _) in &peers {
        let port = format!("{PEER_STATS_PREFIX}{i}");
        let p = float_input(ctx, &port)?;
        if p.dims != peer_dims {
            return Err(
                ctx.err(format!("input `{port}` has dims {:?}, but peer statistics for x {:?} must be {peer_dims:?} (row 0 the sum, row 1 the sum of squares)", p.dims, x.dims))
            );
        }
    }
    for p in ["y", "mean", "inv_variance"] {
        require_output(ctx, p)?;
    }
    check_optional_outputs(ctx, &["out_running_mean", "out_running_var"], running.is_some(), "`in_running_mean` and `in_running_var` are")?;
    if running.is_some() {
        // The unbiased variance divides by n - 1.
        let per_channel = x.element_count() / x.dims[1].max(1);
        let n = per_channel.saturating_mul(1 + peers.len() as i64);
        if n < 2 {
            return Err(ctx.err(format!("updating the running variance needs at least 2 values per channel, but x {:?} has {n}", x.dims)));
        }
    }
    let st = stats_type(dtype(&x));
    ctx.set_output("y", &x.dims, Some(&x), dtype(&x))?;
    ctx.set_output("mean", &sdims, None, st)?;
    ctx.set_output("inv_variance", &sdims, None, st)?;
    if let Some((m, v)) = &running {
        ctx.set_output("out_running_mean", &sdims, Some(m), dtype(m))?;
        ctx.set_output("out_running_var", &sdims, Some(v), dtype(v))?;
    }
    Ok(())
}

pub(crate) fn infer_batchnorm_inference(ctx: &mut InferCtx, _a: &NormAttrs) -> Result<()> {
    check_ports(ctx, &["x", "scale", "bias", "mean", "inv_variance"], &["y"], false)?;
    let axes = NormAxes::Batch;
    let x = norm_x(ctx, "x", axes)?;
    let sdims = axes.stats_dims(&x.dims);
    for p in ["scale", "bias"] {
        let d = float_input(ctx, p)?;
        check_param(ctx, p, &d, &x, axes)?;
    }
    for p in ["mean", "inv_variance"] {
        let d = float_input(ctx, p)?;
        check_stats_input(ctx, p, &d, &sdims, &x)?;
    }
    require_output(ctx, "y")?;
    ctx.set_output("y", &x.dims, Some(&x), dtype(&x))
}

pub(crate) fn infer_batchnorm_backward(ctx: &mut InferCtx, _a: &NormAttrs) -> Result<()> {
    infer_norm_backward(ctx, NormAxes::Batch, false)
}

pub(crate) fn infer_genstats(ctx: &mut InferCtx, _a: &NormAttrs) -> Result<()> {
    check_ports(ctx, &["x"], &["sum", "sq_sum"], false)?;
    let x = norm_x(ctx, "x", NormAxes::Batch)?;
    require_output(ctx, "sum")?;
    require_output(ctx, "sq_sum")?;
    let sdims = NormAxes::Batch.stats_dims(&x.dims);
    let st = stats_type(dtype(&x));
    ctx.set_output("sum", &sdims, None, st)?;
    ctx.set_output("sq_sum", &sdims, None, st)
}

pub(crate) fn infer_bn_finalize(ctx: &mut InferCtx, a: &BnFinalizeAttrs) -> Result<()> {
    check_ports(
        ctx,
        &["sum", "sq_sum", "scale", "bias", "prev_running_mean", "prev_running_var", "epsilon", "momentum"],
        &["eq_scale", "eq_bias", "saved_mean", "saved_inv_std", "next_running_mean", "next_running_var"],
        false,
    )?;
    check_epsilon(ctx, a.epsilon)?;
    check_momentum(ctx, a.momentum)?;
    ctx.scalar_attribute("epsilon", |v| check_epsilon(ctx, v))?;
    ctx.scalar_attribute("momentum", |v| check_momentum(ctx, v))?;
    if a.accum_count < 1 {
        return Err(ctx.err(format!("accum_count (elements per channel behind the sums) must be at least 1, got {}", a.accum_count)));
    }
    let sum = float_input(ctx, "sum")?;
    let ok_shape = sum.dims.len() >= 2 && sum.dims.iter().enumerate().all(|(i, &d)| i == 1 || d == 1);
    if !ok_shape {
        return Err(ctx.err(format!("input `sum` must have per-channel dims [1, C, 1, ...], got {:?}", sum.dims)));
    }
    for p in ["sq_sum", "scale", "bias"] {
        let d = float_input(ctx, p)?;
        if d.dims != sum.dims {
            return Err(ctx.err(format!("input `{p}` has dims {:?} but `sum` has {:?}; they must match", d.dims, sum.dims)));
        }
    }
    let running = running_pair(ctx, "prev_running_mean", "prev_running_var")?;
    if let Some((m, v)) = &running {
        for (p, d) in [("prev_running_mean", m), ("prev_running_var", v)] {
            if d.dims != sum.dims {
                return Err(ctx.err(format!("input `{p}` has dims {:?} but `sum` has {:?}; they must match", d.dims, sum.dims)));
            }
        }
        if a.accum_count < 2 {
            return Err(ctx.err(format!("updating the running variance needs accum_count of at least 2, got {}", a.accum_count)));
        }
    }
    for p in ["eq_scale", "eq_bias", "saved_mean", "saved_inv_std"] {
        require_output(ctx, p)?;
    }
    check_optional_outputs(ctx, &["next_running_mean", "next_running_var"], running.is_some(), "`prev_running_mean` and `prev_running_var` are")?;
    let st = stats_type(dtype(&sum));
    for p in ["eq_scale", "eq_bias", "saved_mean", "saved_inv_std", "next_running_mean", "next_running_var"] {
        ctx.set_output(p, &sum.dims, Some(&sum), st)?;
    }
    Ok(())
}

pub(crate) fn infer_layernorm(ctx: &mut InferCtx, a: &NormAttrs) -> Result<()> {
    infer_norm_forward(ctx, a, NormAxes::Layer, false)
}
pub(crate) fn infer_layernorm_backward(ctx: &mut InferCtx, _a: &NormAttrs) -> Result<()> {
    infer_norm_backward(ctx, NormAxes::Layer, false)
}
pub(crate) fn infer_rmsnorm(ctx: &mut InferCtx, a: &NormAttrs) -> Result<()> {
    infer_norm_forward(ctx, a, NormAxes::Layer, true)
}
pub(crate) fn infer_rmsnorm_backward(ctx: &mut InferCtx, _a: &NormAttrs) -> Result<()> {
    infer_norm_backward(ctx, NormAxes::Layer, true)
}
pub(crate) fn infer_instancenorm(ctx: &mut InferCtx, a: &NormAttrs) -> Result<()> {
    infer_norm_forward(ctx, a, NormAxes::Instance, false)
}
pub(crate) fn infer_instancenorm_backward(ctx: &mut InferCtx, _a: &NormAttrs) -> Result<()> {
    infer_norm_backward(ctx, NormAxes::Instance, false)
}
/// Groupnorm's x (float, `[N, C, ...]`) after checking that `groups` divides its channels.
fn groupnorm_x(ctx: &InferCtx, groups: i64) -> Result<TensorDesc> {
    let x = norm_x(ctx, "x", NormAxes::Batch)?;
    if groups < 1 {
        return Err(ctx.err(format!("groups must be at least 1, got {groups}")));
    }
    let c = x.dims[1];
    if c % groups != 0 {
        return Err(ctx.err(format!(
            "input `x` (tensor \"{}\", dims {:?}) has {c} channels, which {groups} groups do not divide: the channels (dim 1) must be a multiple of groups",
            x.name, x.dims
        )));
    }
    Ok(x)
}

pub(crate) fn infer_groupnorm(ctx: &mut InferCtx, a: &GroupnormAttrs) -> Result<()> {
    let stats = ["mean", "inv_variance"];
    check_ports(ctx, &["x", "scale", "bias", "epsilon"], &["y", "mean", "inv_variance"], false)?;
    check_epsilon(ctx, a.epsilon)?;
    ctx.scalar_attribute("epsilon", |v| check_epsilon(ctx, v))?;
    let x = groupnorm_x(ctx, a.groups)?;
    for p in ["scale", "bias"] {
        let d = float_input(ctx, p)?;
        check_param(ctx, p, &d, &x, NormAxes::Instance)?;
    }
    require_output(ctx, "y")?;
    check_phase_outputs(ctx, a.phase, &stats)?;
    let sdims = groupnorm_stats_dims(&x.dims, a.groups);
    let st = stats_type(dtype(&x));
    ctx.set_output("y", &x.dims, Some(&x), dtype(&x))?;
    for s in stats {
        ctx.set_output(s, &sdims, None, st)?;
    }
    Ok(())
}

pub(crate) fn infer_groupnorm_backward(ctx: &mut InferCtx, a: &GroupnormAttrs) -> Result<()> {
    check_ports(ctx, &["dy", "x", "scale", "mean", "inv_variance"], &["dx", "dscale", "dbias"], false)?;
    let x = groupnorm_x(ctx, a.groups)?;
    let dy = float_input(ctx, "dy")?;
    check_same_dims(ctx, "dy", &dy, &x)?;
    let scale = float_input(ctx, "scale")?;
    check_param(ctx, "scale", &scale, &x, NormAxes::Instance)?;
    let sdims = groupnorm_stats_dims(&x.dims, a.groups);
    for p in ["mean", "inv_variance"] {
        let d = float_input(ctx, p)?;
        check_stats_input(ctx, p, &d, &sdims, &x)?;
    }
    for p in ["dx", "dscale", "dbias"] {
        require_output(ctx, p)?;
    }
    ctx.set_output("dx", &x.dims, Some(&x), dtype(&x))?;
    ctx.set_output("dscale", &scale.dims, Some(&scale), dtype(&scale))?;
    ctx.set_output("dbias", &scale.dims, Some(&scale), dtype(&scale))
}

pub(crate) fn infer_adalayernorm(ctx: &mut InferCtx, a: &NormAttrs) -> Result<()> {
    infer_norm_forward(ctx, a, NormAxes::AdaLayer, false)
}
pub(crate) fn infer_adalayernorm_backward(ctx: &mut InferCtx, _a: &NormAttrs) -> Result<()> {
    infer_norm_backward(ctx, NormAxes::AdaLayer, false)
}
