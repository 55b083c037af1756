//! Scaled dot-product attention, forward and backward.
//!
//! Q `[b, h_q, s_q, d]`, K `[b, h_k, s_kv, d]`, V `[b, h_v, s_kv, d_v]` with any strides
//! (BSHD and BHSD are both stride orders), `h_q` a multiple of `h_k` and of `h_v` (grouped-query
//! and multi-query attention: query head `h` reads K head `h / (h_q / h_k)` and V head
//! `h / (h_q / h_v)`; K and V may have different head counts, as in cuDNN).
//!
//! Ports: forward `q`, `k`, `v` and optional `bias`, `seq_len_q`, `seq_len_kv`, `seed`,
//! `offset`, `page_table_k`, `page_table_v`, `sink_token` -> `o`, optional `stats`, `rng_dump`,
//! `score_max` and `score_sum_exp`; backward adds `o`, `do`, `stats` and gives `dq`, `dk`, `dv`,
//! optional `dbias` (present when `bias` is) and `dsink_token` (present when `sink_token` is).
//!
//! # Semantics
//! For batch `b`, query head `h`, query row `i` and key `j` the score is
//! `s_ij = scale * q_i . k_j + bias[b, h, i, j] + alibi_h * (j - i)`, with `scale` =
//! `attn_scale` or `1/sqrt(d)`. Masked keys are left out of the softmax; `o_i = sum_j p_ij
//! keep_ij v_j` with `p = softmax(s)` over the unmasked keys and `keep_ij` the dropout factor.
//!
//! - **Lengths**: `Lq = seq_len_q[b]`, `Lkv = seq_len_kv[b]` with `padding_mask`, else `s_q` and
//!   `s_kv`. Keys `j >= Lkv` are masked; query rows `i >= Lq` are padding.
//! - **Diagonal**: `diag(i) = i` (top-left) or `i + Lkv - Lq` (bottom-right). Its alignment is
//!   `causal`'s, else `diagonal_alignment`'s (the band's bounds without causal), else top-left.
//! - **Causal**: key `j` is masked when `j > diag(i)`.
//! - **Sliding window**: masked when `j < diag(i) - sliding_window_left` or
//!   `j > diag(i) + sliding_window_right` (a left bound of `w - 1` keeps `w` keys up to the
//!   diagonal).
//! - **Empty rows**: padded rows and rows whose every key is masked (or has a `-inf` score) give
//!   `o = 0` and `stats = -inf`, the log of an empty sum (as cuDNN 9.14 and later write it; the
//!   backward pass gives such rows no gradient, and no NaN).
//! - **Stats**: `[b, h_q, s_q, 1]`, the natural-log log-sum-exp of the unmasked scores, before
//!   dropout. f32 unless the graph's io type (or the user) says otherwise.
//! - **Bias**: rank 4, each dim 1 (broadcast) or equal to `[b, h_q, s_q, s_kv]`; added after
//!   scaling. `dbias` has the bias's dims (gradients summed over the broadcast dims).
//! - **ALiBi**: `alibi_h * (j - i)` with `alibi_h` the slopes of Press et al.: for `H = h_q` a
//!   power of two, `alibi_h = 2^(-8 (h + 1) / H)`; otherwise, with `n` the largest power of two
//!   below `H`, heads `h < n` get `2^(-8 (h + 1) / n)` and heads `n + m` get
//!   `2^(-4 (2m + 1) / n)` (the odd-indexed slopes of the `2n` sequence), as in the reference
//!   implementation.
//! - **Dropout** (`dropout = p`, inputs `seed`, `offset`): `keep_ij = 1/(1 - p)` when the Philox
//!   uniform of the element's flat row-major index in `[b, h_q, s_q, s_kv]` is `>= p`, else 0
//!   (the counter mapping of `graph::ops::rng`: `rng(seed, offset, [b, h_q, s_q, s_kv],
//!   Uniform{0, 1}) >= p`).
//! - **Dropout mask** (`rng_dump`, forward, with dropout): the output `rng_dump`
//!   `[b, h_q, s_q, s_kv]` gets 1 where `keep_ij` is not 0 and 0 where the element is dropped,
//!   for every element (masked and padded ones too), as cuDNN's `rng_dump` (f32 unless set).
//! - **Paged K/V** (`page_table_k`, `page_table_v`: `[b, 1, max_pages, 1]` integer block
//!   indices): `k` and `v` are block pools `[num_blocks, h_kv, block_size, d]`; logical key `t`
//!   of batch `b` is row `t % block_size` of block `page_table[b, 0, t / block_size, 0]`.
//!   The logical `s_kv` is `max_pages * block_size` (equal for K and V), further cut per batch by
//!   `seq_len_kv` with `padding_mask`; only pages holding keys below that length are read (and
//!   their entries checked to lie in `[0, num_blocks)` when the op runs). In the backward pass
//!   `dk`/`dv` have the pools' dims and each block gathers the gradient of every key that reads
//!   it.
//! - **Ragged (packed, THD) tensors** (`TensorDesc::ragged_offset`, set with
//!   [`Graph::set_ragged_offset`]): q, k, v, o, stats, score_max, score_sum_exp (and do, dq,
//!   dk, dv) may each be ragged,
//!   with the padding mask on. Batch `i` of a ragged tensor starts at element `offsets[i]` of its
//!   buffer (instead of `i * strides[0]`; `offsets` has `b + 1` integer entries) and holds only
//!   the rows of its own length (`seq_len_q[i]` for the query-side ones; `seq_len_kv[i]` for k,
//!   v, dk, dv), so that sequences of different lengths pack back to back (`[t, h, d]` with
//!   strides `[h*d, d, 1]` per token). Rows past a batch's length are neither read nor written.
//!   Paged K/V cannot be ragged.
//! - **Sink token** (`sink_token`, f32 `[1, h_q, 1, 1]`: one logit `t_h` per query head, as in
//!   the learned per-head sinks of gpt-oss): a key with score `t_h` and no value joins every
//!   row's softmax, so it takes a share of the probability mass and gives nothing to `o`:
//!   `M_i = max(max_j s_ij, t_h)`, `Z_i = sum_j exp(s_ij - M_i) + exp(t_h - M_i)`,
//!   `p_ij = exp(s_ij - M_i) / Z_i`, `stats_i = M_i + ln Z_i`. A row whose every key is masked
//!   still sees the sink (`o = 0`, `stats = t_h`); padded rows (`i >= Lq`) have no softmax at
//!   all (`o = 0`, `stats = -inf`), sink or not.
//! - **Score statistics** (`score_max`, `score_sum_exp`, forward, f32 `[b, h_q, s_q, 1]` unless
//!   the graph's io type or the user says otherwise): `M_i` and `Z_i` above (without a sink, the
//!   row max of the unmasked scores and the sum of their `exp(s_ij - M_i)`), before dropout, as
//!   the cudnn frontend's `set_score_max` / `set_score_sum_exp` give them (for QK-clip style
//!   logit monitoring); so `stats = score_max + ln score_sum_exp`. Empty rows without a sink and
//!   padded rows give `-inf` and `0`. They may be ragged, as `stats`.
//! - **Backward**: `dq`, `dk`, `dv` (`dk` summed over the query heads sharing a K head, `dv` over
//!   those sharing a V head),
//!   from `p_ij = exp(s_ij - stats_i)` and `D_i = do_i . o_i` (the `o` input), as in
//!   FlashAttention-2. The sink changes none of them beyond the stats, which carry it (its
//!   probability `exp(t_h - stats_i)` has no value row, so `dS_ij = p_ij (dP_ij - D_i)` as
//!   without it). With `sink_token` connected the backward gives `dsink_token` (`[1, h_q, 1, 1]`,
//!   the sink's dims): `dsink_h = -sum_(b, i) exp(t_h - stats_bhi) D_bhi` over the rows that
//!   exist (padded rows and rows whose stats is `-inf` add nothing).
//!
//! ```
//! use ferrodnn::{DataType, Graph, TensorDesc};
//! use ferrodnn::graph::ops::sdpa::{CausalAlignment, SdpaAttrs, SdpaInputs};
//! let mut g = Graph::new("attention").io_data_type(DataType::F32);
//! let q = g.tensor(TensorDesc::new("q", &[2, 4, 5, 8], DataType::F32));
//! let k = g.tensor(TensorDesc::new("k", &[2, 2, 7, 8], DataType::F32));
//! let v = g.tensor(TensorDesc::new("v", &[2, 2, 7, 8], DataType::F32));
//! let attrs = SdpaAttrs { causal: Some(CausalAlignment::BottomRight), generate_stats: true, ..Default::default() };
//! let (o, stats) = g.sdpa(q, k, v, SdpaInputs::default(), attrs);
//! g.set_output(o);
//! g.validate().unwrap();
//! assert_eq!(g.desc(o).dims, vec![2, 4, 5, 8]);
//! assert_eq!(g.desc(stats.unwrap()).dims, vec![2, 4, 5, 1]);
//! ```

use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::{Graph, InferCtx, Node, TensorDesc, TensorId};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CausalAlignment {
    /// Query `i` sees keys `j <= i`.
    TopLeft,
    /// Query `i` sees keys `j <= i + s_kv - s_q` (the last query sees every key).
    BottomRight,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SdpaAttrs {
    /// Multiplies Q K^T; 1/sqrt(d) when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn_scale: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub causal: Option<CausalAlignment>,
    /// Keys more than `left` before (or `right` after) the query's diagonal are masked. The
    /// diagonal follows `causal`'s alignment, else `diagonal_alignment`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window_left: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window_right: Option<i64>,
    /// The diagonal's alignment for the sliding-window bounds when `causal` is unset (top-left
    /// when this is unset too); with `causal` set it must be unset or equal to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagonal_alignment: Option<CausalAlignment>,
    /// Mask by the per-batch lengths in `seq_len_q` / `seq_len_kv` (both required).
    #[serde(default)]
    pub padding_mask: bool,
    #[serde(default)]
    pub alibi: bool,
    /// Dropout probability in [0, 1); needs `seed` and `offset` inputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropout: Option<f64>,
    /// Emit the log-sum-exp `stats` output `[b, h_q, s_q, 1]` (training).
    #[serde(default)]
    pub generate_stats: bool,
    /// Emit the dropout mask as the output `rng_dump` `[b, h_q, s_q, s_kv]` (forward, with
    /// dropout): 1 where an element is kept, 0 where it is dropped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rng_dump: bool,
    /// Emit each row's score maximum (with the sink) as the output `score_max`
    /// `[b, h_q, s_q, 1]` (forward).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub score_max: bool,
    /// Emit each row's sum of `exp(s - score_max)` (with the sink) as the output
    /// `score_sum_exp` `[b, h_q, s_q, 1]` (forward).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub score_sum_exp: bool,
}

impl SdpaAttrs {
    /// The diagonal the masks are relative to: `causal`'s alignment, else
    /// `diagonal_alignment`, else top-left.
    pub fn diagonal(&self) -> CausalAlignment {
        self.causal.or(self.diagonal_alignment).unwrap_or(CausalAlignment::TopLeft)
    }
}

/// The optional inputs of [`Graph::sdpa`] and [`Graph::sdpa_backward`]; each goes to the port
/// of the same name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SdpaInputs {
    /// Added to the scaled scores; `[1 or b, 1 or h_q, 1 or s_q, 1 or s_kv]`.
    pub bias: Option<TensorId>,
    /// `[b, 1, 1, 1]` integer lengths (with `padding_mask`).
    pub seq_len_q: Option<TensorId>,
    pub seq_len_kv: Option<TensorId>,
    /// One-element integer tensors for dropout.
    pub seed: Option<TensorId>,
    pub offset: Option<TensorId>,
    /// `[b, 1, max_pages, 1]` integer block indices into the K / V block pools.
    pub page_table_k: Option<TensorId>,
    pub page_table_v: Option<TensorId>,
    /// A by-value f32 scalar giving the scale of the scores when each execution's variant pack
    /// holds it (replacing `SdpaAttrs::attn_scale`).
    pub attn_scale: Option<TensorId>,
    /// `[1, h_q, 1, 1]` f32: one sink logit per query head, joining every row's softmax without
    /// a value (see the module docs). On the backward it gives the output `dsink_token`.
    pub sink_token: Option<TensorId>,
}

impl SdpaInputs {
    fn ports(&self) -> Vec<(&'static str, TensorId)> {
        [
            ("bias", self.bias),
            ("seq_len_q", self.seq_len_q),
            ("seq_len_kv", self.seq_len_kv),
            ("seed", self.seed),
            ("offset", self.offset),
            ("page_table_k", self.page_table_k),
            ("page_table_v", self.page_table_v),
            ("attn_scale", self.attn_scale),
            ("sink_token", self.sink_token),
        ]
        .into_iter()
        .filter_map(|(p, t)| t.map(|t| (p, t)))
        .collect()
    }
}

/// The outputs of [`Graph::sdpa_backward`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SdpaGrads {
    pub dq: TensorId,
    pub dk: TensorId,
    pub dv: TensorId,
    /// Present when the forward pass had a bias.
    pub dbias: Option<TensorId>,
    /// The sink logits' gradient `[1, h_q, 1, 1]`: present when `sink_token` is connected.
    pub dsink_token: Option<TensorId>,
}

impl Graph {
    /// Scaled dot-product attention. Ports `q`, `k`, `v` and the optional inputs of `inputs`
    /// -> `o` `[b, h_q, s_q, d_v]` (in q's stride order) and, with `attrs.generate_stats`,
    /// `stats` `[b, h_q, s_q, 1]`. See the module docs for the semantics. With
    /// `attrs.rng_dump`, `attrs.score_max` or `attrs.score_sum_exp`, the node also has the output
    /// of that name, found by [`Graph::sdpa_output`] (or [`Graph::sdpa_rng_dump`]).
    pub fn sdpa(&mut self, q: TensorId, k: TensorId, v: TensorId, inputs: SdpaInputs, attrs: SdpaAttrs) -> (TensorId, Option<TensorId>) {
        let mut ins = vec![("q", q), ("k", k), ("v", v)];
        ins.extend(inputs.ports());
        let mut outs = vec!["o"];
        if attrs.generate_stats {
            outs.push("stats");
        }
        if attrs.rng_dump {
            outs.push("rng_dump");
        }
        if attrs.score_max {
            outs.push("score_max");
        }
        if attrs.score_sum_exp {
            outs.push("score_sum_exp");
        }
        let ids = self.add_node(super::Op::Sdpa(attrs.clone()), None, ins, &outs);
        (ids[0], attrs.generate_stats.then(|| ids[1]))
    }

    /// Make `tensor` ragged (packed sequences, cuDNN's THD layout): batch `i` starts at element
    /// `offsets[i]` of its buffer. `offsets` is an integer tensor of `b + 1` elements. Only the
    /// attention ops' sequence tensors may be ragged, with the padding mask (see the module
    /// docs); validation checks.
    pub fn set_ragged_offset(&mut self, tensor: TensorId, offsets: TensorId) {
        if let Some(t) = self.tensors.get_mut(tensor.0) {
            t.ragged_offset = Some(offsets);
        }
    }

    /// The `rng_dump` output (the dropout mask) of the sdpa node that produces `o`, when it has
    /// one.
    pub fn sdpa_rng_dump(&self, o: TensorId) -> Option<TensorId> {
        self.sdpa_output(o, "rng_dump")
    }

    /// The output `port` (`stats`, `rng_dump`, `score_max`, `score_sum_exp`) of the sdpa node
    /// that produces `o`, when it has one.
    ///
    /// ```
    /// use ferrodnn::{DataType, Graph, TensorDesc};
    /// use ferrodnn::graph::ops::sdpa::{SdpaAttrs, SdpaInputs};
    /// let mut g = Graph::new("sink").io_data_type(DataType::F16);
    /// let q = g.tensor(TensorDesc::new("q", &[1, 2, 3, 8], DataType::F16));
    /// let k = g.tensor(TensorDesc::new("k", &[1, 2, 5, 8], DataType::F16));
    /// let v = g.tensor(TensorDesc::new("v", &[1, 2, 5, 8], DataType::F16));
    /// let sink = g.tensor(TensorDesc::new("sink", &[1, 2, 1, 1], DataType::F32));
    /// let inputs = SdpaInputs { sink_token: Some(sink), ..Default::default() };
    /// let (o, _) = g.sdpa(q, k, v, inputs, SdpaAttrs { score_max: true, score_sum_exp: true, ..Default::default() });
    /// g.set_output(o);
    /// for port in ["score_max", "score_sum_exp"] {
    ///     let t = g.sdpa_output(o, port).unwrap();
    ///     g.set_output(t);
    ///     g.desc_mut(t).data_type = Some(DataType::F32);
    /// }
    /// g.validate().unwrap();
    /// assert_eq!(g.desc(g.sdpa_output(o, "score_max").unwrap()).dims, vec![1, 2, 3, 1]);
    /// ```
    pub fn sdpa_output(&self, o: TensorId, port: &str) -> Option<TensorId> {
        self.nodes.iter().find(|n| matches!(n.op, super::Op::Sdpa(_)) && n.output("o") == Some(o)).and_then(|n| n.output(port))
    }

    /// The backward pass of [`Graph::sdpa`], with the same optional inputs and attributes.
    /// Ports `q`, `k`, `v`, `o`, `do`, `stats` and the optional inputs -> `dq`, `dk`, `dv` (each
    /// with its input's dims and stride order), when `inputs.bias` is set `dbias`, and when
    /// `inputs.sink_token` is set `dsink_token` (the sink does not change the others: connect
    /// it for its gradient).
    #[allow(clippy::too_many_arguments)]
    pub fn sdpa_backward(&mut self, q: TensorId, k: TensorId, v: TensorId, o: TensorId, d_o: TensorId, stats: TensorId, inputs: SdpaInputs, attrs: SdpaAttrs) -> SdpaGrads {
        let mut ins = vec![("q", q), ("k", k), ("v", v), ("o", o), ("do", d_o), ("stats", stats)];
        ins.extend(inputs.ports());
        let mut outs = vec!["dq", "dk", "dv"];
        if inputs.bias.is_some() {
            outs.push("dbias");
        }
        if inputs.sink_token.is_some() {
            outs.push("dsink_token");
        }
        let ids = self.add_node(super::Op::SdpaBackward(attrs), None, ins, &outs);
        let dbias = inputs.bias.map(|_| ids[3]);
        let dsink_token = inputs.sink_token.map(|_| ids[ids.len() - 1]);
        SdpaGrads { dq: ids[0], dk: ids[1], dv: ids[2], dbias, dsink_token }
    }
}

/// The problem sizes, after checking every input.
struct Dims {
    b: i64,
    h_q: i64,
    s_q: i64,
    s_kv: i64,
    d_v: i64,
    q: TensorDesc,
    k: TensorDesc,
    v: TensorDesc,
    bias: Option<TensorDesc>,
}

fn float_type(ctx: &InferCtx, port: &str, t: &TensorDesc) -> Result<DataType> {
    let dt = t.data_type.unwrap_or(DataType::F32);
    if !dt.is_float() {
        return Err(ctx.err(format!("input `{port}` (tensor \"{}\") must be floating point, got {dt}", t.name)));
    }
    Ok(dt)
}

fn int_type(ctx: &InferCtx, port: &str, t: &TensorDesc) -> Result<()> {
    let dt = t.data_type.unwrap_or(DataType::F32);
    if !dt.is_integer() {
        return Err(ctx.err(format!("input `{port}` (tensor \"{}\") must be an integer tensor (i32 or i64), got {dt}", t.name)));
    }
    Ok(())
}

fn rank4(ctx: &InferCtx, port: &str, t: &TensorDesc, what: &str) -> Result<()> {
    if t.dims.len() != 4 {
        return Err(ctx.err(format!("input `{port}` (tensor \"{}\") must have rank 4 {what}, got dims {:?}", t.name, t.dims)));
    }
    Ok(())
}

/// Checks everything the forward and backward passes share and returns the sizes.
fn check_common(ctx: &InferCtx, a: &SdpaAttrs) -> Result<Dims> {
    let q = ctx.input("q")?;
    let k = ctx.input("k")?;
    let v = ctx.input("v")?;
    let pt_k = ctx.opt_input("page_table_k")?;
    let pt_v = ctx.opt_input("page_table_v")?;
    let paged = pt_k.is_some() || pt_v.is_some();
    let (k_what, v_what) = if paged {
        ("[num_blocks, h_k, block_size, d] (a paged block pool)", "[num_blocks, h_v, block_size, d_v] (a paged block pool)")
    } else {
        ("[b, h_k, s_kv, d]", "[b, h_v, s_kv, d_v]")
    };
    rank4(ctx, "q", &q, "[b, h_q, s_q, d]")?;
    rank4(ctx, "k", &k, k_what)?;
    rank4(ctx, "v", &v, v_what)?;
    let tq = float_type(ctx, "q", &q)?;
    let tk = float_type(ctx, "k", &k)?;
    let tv = float_type(ctx, "v", &v)?;
    if tk != tq || tv != tq {
        return Err(ctx.err(format!("q, k and v must share one type, got q {tq}, k {tk}, v {tv}")));
    }
    let (b, h_q, s_q, d) = (q.dims[0], q.dims[1], q.dims[2], q.dims[3]);
    if k.dims[3] != d {
        return Err(ctx.err(format!("q has head dim {d} but k has {} (q {:?}, k {:?})", k.dims[3], q.dims, k.dims)));
    }
    for (port, t) in [("k", &k), ("v", &v)] {
        if h_q % t.dims[1] != 0 {
            return Err(ctx.err(format!("q has {h_q} heads, which is not a multiple of the {} heads of {port} ({port} {:?})", t.dims[1], t.dims)));
        }
    }
    let s_kv = match (&pt_k, &pt_v) {
        (None, None) => {
            for (port, t) in [("k", &k), ("v", &v)] {
                if t.dims[0] != b {
                    return Err(ctx.err(format!("q has batch {b} but {port} has batch {} ({port} {:?})", t.dims[0], t.dims)));
                }
            }
            if v.dims[2] != k.dims[2] {
                return Err(ctx.err(format!("v has {} keys (s_kv) but k has {} (k {:?}, v {:?})", v.dims[2], k.dims[2], k.dims, v.dims)));
            }
            k.dims[2]
        }
        (Some(tk), Some(tv)) => {
            let mut logical = Vec::new();
            for (port, t, pool) in [("page_table_k", tk, &k), ("page_table_v", tv, &v)] {
                int_type(ctx, port, t)?;
                if t.dims.len() != 4 || t.dims[0] != b || t.dims[1] != 1 || t.dims[3] != 1 {
                    return Err(ctx.err(format!("paged tables inconsistent: input `{port}` must be [b = {b}, 1, max_pages, 1], got dims {:?}", t.dims)));
                }
                let keys = t.dims[2].checked_mul(pool.dims[2]).filter(|&n| n <= crate::graph::MAX_ELEMENTS).ok_or_else(|| {
                    ctx.err(format!(
                        "paged tables inconsistent: input `{port}` has {} pages of {} keys, more than the {} keys a sequence may have",
                        t.dims[2],
                        pool.dims[2],
                        crate::graph::MAX_ELEMENTS
                    ))
                })?;
                logical.push(keys);
            }
            if logical[0] != logical[1] {
                return Err(ctx.err(format!(
                    "paged tables inconsistent: K covers {} keys ({} pages of {}) but V covers {} ({} pages of {})",
                    logical[0], tk.dims[2], k.dims[2], logical[1], tv.dims[2], v.dims[2]
                )));
            }
            logical[0]
        }
        _ => return Err(ctx.err("paged tables inconsistent: page_table_k and page_table_v must be given together")),
    };
    let d_v = v.dims[3];

    let bias = ctx.opt_input("bias")?;
    if let Some(t) = &bias {
        float_type(ctx, "bias", t)?;
        let scores = [b, h_q, s_q, s_kv];
        if t.dims.len() != 4 || t.dims.iter().zip(&scores).any(|(&x, &s)| x != 1 && x != s) {
            return Err(ctx.err(format!("bias dims {:?} do not broadcast to the scores [b, h_q, s_q, s_kv] = {scores:?} (each dim must be 1 or equal)", t.dims)));
        }
    }

    let lq = ctx.opt_input("seq_len_q")?;
    let lkv = ctx.opt_input("seq_len_kv")?;
    if a.padding_mask {
        for (port, t) in [("seq_len_q", &lq), ("seq_len_kv", &lkv)] {
            let t = t.as_ref().ok_or_else(|| ctx.err(format!("padding_mask needs the per-batch lengths, but input `{port}` is not connected")))?;
            int_type(ctx, port, t)?;
            if t.dims.len() != 4 || t.dims != [b, 1, 1, 1] {
                return Err(ctx.err(format!("input `{port}` must be [b, 1, 1, 1] = [{b}, 1, 1, 1], got dims {:?}", t.dims)));
            }
        }
    } else if lq.is_some() || lkv.is_some() {
        return Err(ctx.err("seq_len_q / seq_len_kv are connected but padding_mask is false; set padding_mask to use them"));
    }

    let seed = ctx.opt_input("seed")?;
    let offset = ctx.opt_input("offset")?;
    match a.dropout {
        Some(p) => {
            if !(0.0..1.0).contains(&p) {
                return Err(ctx.err(format!("dropout probability must be in [0, 1), got {p}")));
            }
            if p > 0.0 && (seed.is_none() || offset.is_none()) {
                return Err(ctx.err(format!("dropout {p} needs both `seed` and `offset` inputs")));
            }
        }
        None => {
            if seed.is_some() || offset.is_some() {
                return Err(ctx.err("`seed` / `offset` are connected but dropout is unset"));
            }
        }
    }
    if seed.is_some() != offset.is_some() {
        return Err(ctx.err("`seed` and `offset` must be given together"));
    }
    for (port, t) in [("seed", &seed), ("offset", &offset)] {
        if let Some(t) = t {
            super::rng::check_seed_like(ctx, port, t)?;
        }
    }

    if let (Some(c), Some(d)) = (a.causal, a.diagonal_alignment) {
        if c != d {
            return Err(ctx.err(format!("the causal mask's alignment {c:?} and diagonal_alignment {d:?} differ; they name one diagonal")));
        }
    }
    for (name, w) in [("sliding_window_left", a.sliding_window_left), ("sliding_window_right", a.sliding_window_right)] {
        if let Some(w) = w {
            if w < 0 {
                return Err(ctx.err(format!("{name} must be non-negative, got {w}")));
            }
        }
    }
    if let Some(t) = ctx.opt_input("sink_token")? {
        let dt = t.data_type.unwrap_or(DataType::F32);
        if dt != DataType::F32 {
            return Err(ctx.err(format!("input `sink_token` (tensor \"{}\") must be f32 (one sink logit per query head), got {dt}", t.name)));
        }
        if t.dims != [1, h_q, 1, 1] {
            return Err(
                ctx.err(format!("input `sink_token` (tensor \"{}\") must be [1, h_q, 1, 1] = [1, {h_q}, 1, 1] (one sink logit per query head), got dims {:?}", t.name, t.dims))
            );
        }
    }
    check_ragged(ctx, a, b, paged)?;
    let check_scale = |s: f64| Node::attribute_rule("attn_scale", s).map_or(Ok(()), |m| Err(ctx.err(m)));
    if let Some(s) = a.attn_scale {
        check_scale(s)?;
    }
    ctx.scalar_attribute("attn_scale", check_scale)?;
    Ok(Dims { b, h_q, s_q, s_kv, d_v, q, k, v, bias })
}

/// The ports whose tensors may be ragged, the forward's seven first (`Op::ragged_ports`; the
/// backward has no `score_max` or `score_sum_exp` port); the engines number ragged tensors by
/// their place here.
pub const RAGGED_PORTS: [&str; 11] = ["q", "k", "v", "o", "stats", "score_max", "score_sum_exp", "do", "dq", "dk", "dv"];

/// How many of [`RAGGED_PORTS`] belong to the forward pass.
pub const FORWARD_RAGGED_PORTS: usize = 7;

/// The lengths that say which rows of a ragged tensor on `port` exist: `seq_len_q` for the
/// query-side tensors, `seq_len_kv` for the key-side ones.
pub fn ragged_lengths_port(port: &str) -> &'static str {
    match port {
        "k" | "v" | "dk" | "dv" => "seq_len_kv",
        _ => "seq_len_q",
    }
}

/// The ragged tensors of the node (attached by `Graph::attach_ragged_offsets` as the ports
/// `ragged_<port>`): each needs the padding mask, `b + 1` integer offsets, and a buffer.
fn check_ragged(ctx: &InferCtx, a: &SdpaAttrs, b: i64, paged: bool) -> Result<()> {
    for &port in ctx.node.op.ragged_ports() {
        let rport = format!("{}{port}", crate::graph::RAGGED_PORT_PREFIX);
        let Some(r) = ctx.opt_input(&rport)? else { continue };
        let Some(id) = ctx.node.input(port).or_else(|| ctx.node.output(port)) else {
            return Err(ctx.err(format!("input `{rport}` gives ragged offsets for port `{port}`, which is not connected")));
        };
        let t = ctx.graph.desc(id);
        if !a.padding_mask {
            return Err(ctx.err(format!(
                "`{port}` (tensor \"{}\") is ragged, which needs the padding mask (padding_mask with seq_len_q and seq_len_kv): each batch's length says which of its rows exist",
                t.name
            )));
        }
        if paged && matches!(port, "k" | "v" | "dk" | "dv") {
            return Err(ctx.err(format!("`{port}` (tensor \"{}\") is a paged block pool, which cannot also be ragged", t.name)));
        }
        if t.is_virtual {
            return Err(ctx.err(format!("`{port}` (tensor \"{}\") is ragged but virtual: a ragged tensor is a buffer of the variant pack (set_output)", t.name)));
        }
        int_type(ctx, &rport, &r)?;
        if r.is_pass_by_value || r.element_count() != b + 1 || r.dims.iter().filter(|&&n| n > 1).count() > 1 {
            return Err(ctx.err(format!(
                "the ragged offsets of `{port}` (tensor \"{}\") must be a buffer of b + 1 = {} integers (one dim of b + 1, the others 1: where each batch starts, and the end), got dims {:?}{}",
                r.name,
                b + 1,
                r.dims,
                if r.is_pass_by_value { " passed by value" } else { "" }
            )));
        }
    }
    Ok(())
}

pub(crate) fn infer(ctx: &mut InferCtx, a: &SdpaAttrs) -> Result<()> {
    let dims = check_common(ctx, a)?;
    if ctx.has_output("stats") != a.generate_stats {
        return Err(ctx.err(format!("output `stats` is {} but generate_stats is {}", if ctx.has_output("stats") { "connected" } else { "not connected" }, a.generate_stats)));
    }
    if ctx.has_output("rng_dump") != a.rng_dump {
        return Err(ctx.err(format!("output `rng_dump` is {} but rng_dump is {}", if ctx.has_output("rng_dump") { "connected" } else { "not connected" }, a.rng_dump)));
    }
    if a.rng_dump && a.dropout.is_none() {
        return Err(ctx.err("rng_dump (the dropout mask) needs dropout: set a dropout probability with `seed` and `offset`"));
    }
    for (port, wanted) in [("score_max", a.score_max), ("score_sum_exp", a.score_sum_exp)] {
        if ctx.has_output(port) != wanted {
            return Err(ctx.err(format!("output `{port}` is {} but {port} is {wanted}", if ctx.has_output(port) { "connected" } else { "not connected" })));
        }
    }
    let Dims { b, h_q, s_q, s_kv, d_v, q, .. } = dims;
    let qt = q.data_type.unwrap_or(DataType::F32);
    ctx.set_output("o", &[b, h_q, s_q, d_v], Some(&q), qt)?;
    ctx.set_output("stats", &[b, h_q, s_q, 1], None, DataType::F32)?;
    for port in ["score_max", "score_sum_exp"] {
        ctx.set_output(port, &[b, h_q, s_q, 1], None, DataType::F32)?;
        float_output(ctx, port)?;
    }
    if a.rng_dump {
        ctx.set_output("rng_dump", &[b, h_q, s_q, s_kv], None, DataType::F32)?;
        if let Some(id) = ctx.node.output("rng_dump") {
            let dt = ctx.graph.resolved_data_type(id).unwrap_or(DataType::F32);
            if !dt.is_float() {
                return Err(ctx.err(format!("output `rng_dump` must be floating point (it holds 0 and 1), got {dt}")));
            }
        }
    }
    Ok(())
}

/// An output of statistics (`score_max`, `score_sum_exp`, `dsink_token`), when connected, must
/// be floating point.
fn float_output(ctx: &InferCtx, port: &str) -> Result<()> {
    if let Some(id) = ctx.node.output(port) {
        let dt = ctx.graph.resolved_data_type(id).unwrap_or(DataType::F32);
        if !dt.is_float() {
            return Err(ctx.err(format!("output `{port}` (tensor \"{}\") must be floating point (f32 as the frontend makes it), got {dt}", ctx.graph.desc(id).name)));
        }
    }
    Ok(())
}

pub(crate) fn infer_backward(ctx: &mut InferCtx, a: &SdpaAttrs) -> Result<()> {
    if a.rng_dump {
        return Err(ctx.err("rng_dump (the dropout mask) is an output of the forward pass (sdpa); the backward pass recomputes the same mask"));
    }
    if a.score_max || a.score_sum_exp {
        return Err(ctx.err("score_max and score_sum_exp are outputs of the forward pass (sdpa); the backward pass takes them from nowhere"));
    }
    let dims = check_common(ctx, a)?;
    let Dims { b, h_q, s_q, d_v, q, k, v, bias, .. } = dims;
    let o_dims = [b, h_q, s_q, d_v];
    for port in ["o", "do"] {
        let t = ctx.input(port)?;
        float_type(ctx, port, &t)?;
        if t.dims != o_dims {
            return Err(ctx.err(format!("input `{port}` must have the output's dims [b, h_q, s_q, d_v] = {o_dims:?}, got {:?}", t.dims)));
        }
    }
    let stats = ctx.input("stats")?;
    float_type(ctx, "stats", &stats)?;
    if stats.dims != [b, h_q, s_q, 1] {
        return Err(ctx.err(format!("input `stats` must be [b, h_q, s_q, 1] = [{b}, {h_q}, {s_q}, 1], got {:?}", stats.dims)));
    }
    if ctx.has_output("dbias") && bias.is_none() {
        return Err(ctx.err("output `dbias` is connected but there is no `bias` input"));
    }
    let sink = ctx.opt_input("sink_token")?;
    if ctx.has_output("dsink_token") && sink.is_none() {
        return Err(ctx.err("output `dsink_token` is connected but there is no `sink_token` input (the sink's gradient needs the sink)"));
    }
    let qt = q.data_type.unwrap_or(DataType::F32);
    ctx.set_output("dq", &q.dims, Some(&q), qt)?;
    ctx.set_output("dk", &k.dims, Some(&k), qt)?;
    ctx.set_output("dv", &v.dims, Some(&v), qt)?;
    if let Some(bias) = bias {
        let bt = bias.data_type.unwrap_or(DataType::F32);
        ctx.set_output("dbias", &bias.dims, Some(&bias), bt)?;
    }
    if let Some(sink) = sink {
        ctx.set_output("dsink_token", &sink.dims, Some(&sink), DataType::F32)?;
        float_output(ctx, "dsink_token")?;
    }
    Ok(())
}

/// ALiBi slopes for `heads` heads (Press et al.): `2^(-8 (h + 1) / n)` for the first `n` heads,
/// `n` the largest power of two not above `heads`, then the odd-indexed slopes of the `2n`
/// sequence, `2^(-4 (2m + 1) / n)`, for the rest.
pub fn alibi_slopes(heads: usize) -> Vec<f64> {
    let mut n = 1usize;
    while n * 2 <= heads {
        n *= 2;
    }
    (0..heads)
        .map(|h| {
            if h < n {
                2f64.powf(-8.0 * (h as f64 + 1.0) / n as f64)
            } else {
                let m = (h - n) as f64;
                2f64.powf(-4.0 * (2.0 * m + 1.0) / n as f64)
            }
        })
        .collect()
}
