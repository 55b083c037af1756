//! Scaled dot-product attention, forward and backward.
//!
//! Q `[b, h_q, s_q, d]`, K `[b, h_kv, s_kv, d]`, V `[b, h_kv, s_kv, d_v]` with any strides
//! (BSHD and BHSD are both stride orders), `h_q` a multiple of `h_kv` (grouped-query and
//! multi-query attention). Ports: forward `q`, `k`, `v` and optional `bias`, `seq_len_q`,
//! `seq_len_kv`, `seed`, `offset`, `page_table_k`, `page_table_v` -> `o`, optional `stats`;
//! backward adds `o`, `do`, `stats` and gives `dq`, `dk`, `dv`, optional `dbias`.

use crate::error::Result;
use crate::graph::InferCtx;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CausalAlignment {
    TopLeft,
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
    /// Keys more than `left` before (or `right` after) the query's diagonal are masked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window_left: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window_right: Option<i64>,
    /// Mask by the per-batch lengths in `seq_len_q` / `seq_len_kv`.
    #[serde(default)]
    pub padding_mask: bool,
    #[serde(default)]
    pub alibi: bool,
    /// Dropout probability; needs `seed` and `offset` inputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropout: Option<f64>,
    /// Emit the log-sum-exp `stats` output `[b, h_q, s_q, 1]` (training).
    #[serde(default)]
    pub generate_stats: bool,
}

pub(crate) fn infer(ctx: &mut InferCtx, _a: &SdpaAttrs) -> Result<()> {
    Err(crate::Error::NotSupported(format!("{}: not implemented yet", ctx.kind())))
}
pub(crate) fn infer_backward(ctx: &mut InferCtx, _a: &SdpaAttrs) -> Result<()> {
    Err(crate::Error::NotSupported(format!("{}: not implemented yet", ctx.kind())))
}
