//! The attention suite of issue 6: flash-attention forward and backward in bf16 on the issue's
//! shapes, and GQA decode. Q/K/V/O are packed `[b, h, s, d]` (PyTorch's layout for
//! `scaled_dot_product_attention`); the backward takes `o`, `do` and f32 `stats` as inputs.
//! FLOPs: forward `4 b h s_q s_kv d` (half when causal), backward 2.5 times that; decode is
//! measured against copy bandwidth (no FLOPs given). `bench/torch_attention.py` times the same
//! workloads with PyTorch.
//!
//! The sweep suite (issue 27, `--suite attention-sweep`): shapes of public models, forward and
//! backward, head dims 40 to 256, cross-attention and odd lengths; each id names its shape
//! (`b{b}h{h}q{s_q}k{s_kv}d{d}`, `_causal`), which PyTorch's side parses.

use crate::bench::Workload;
use ferrodnn::graph::ops::sdpa::{CausalAlignment, SdpaAttrs, SdpaInputs};
use ferrodnn::{DataType, Graph, TensorDesc};

fn out(g: &mut Graph, t: ferrodnn::TensorId, dt: DataType) {
    g.set_output(t);
    g.desc_mut(t).data_type = Some(dt);
}

/// Forward FLOPs of one shape (halved when causal).
fn fwd_flops(b: i64, h: i64, s_q: i64, s_kv: i64, d: i64, causal: bool) -> u64 {
    let f = 4 * b as u64 * h as u64 * s_q as u64 * s_kv as u64 * d as u64;
    if causal {
        f / 2
    } else {
        f
    }
}

fn attrs(causal: bool, stats: bool) -> SdpaAttrs {
    SdpaAttrs { causal: causal.then_some(CausalAlignment::TopLeft), generate_stats: stats, ..Default::default() }
}

/// An attention shape: batch, heads, query and key lengths, head dim, causal mask.
#[derive(Clone, Copy)]
struct Shape {
    b: i64,
    h: i64,
    s_q: i64,
    s_kv: i64,
    d: i64,
    causal: bool,
}

impl Shape {
    fn new(b: i64, h: i64, s_q: i64, s_kv: i64, d: i64, causal: bool) -> Shape {
        Shape { b, h, s_q, s_kv, d, causal }
    }

    /// The shape as the sweep's ids spell it.
    fn tag(&self) -> String {
        let Shape { b, h, s_q, s_kv, d, causal } = *self;
        format!("b{b}h{h}q{s_q}k{s_kv}d{d}{}", if causal { "_causal" } else { "" })
    }

    fn flops(&self) -> u64 {
        fwd_flops(self.b, self.h, self.s_q, self.s_kv, self.d, self.causal)
    }
}

fn forward(id: &str, s: Shape) -> Workload {
    let bf = DataType::Bf16;
    let mut g = Graph::new(id).io_data_type(bf);
    let q = g.tensor(TensorDesc::new("q", &[s.b, s.h, s.s_q, s.d], bf));
    let k = g.tensor(TensorDesc::new("k", &[s.b, s.h, s.s_kv, s.d], bf));
    let v = g.tensor(TensorDesc::new("v", &[s.b, s.h, s.s_kv, s.d], bf));
    let (o, _) = g.sdpa(q, k, v, SdpaInputs::default(), attrs(s.causal, false));
    out(&mut g, o, bf);
    Workload { id: id.to_string(), graph: g, flops: Some(s.flops()) }
}

fn backward(id: &str, s: Shape) -> Workload {
    let bf = DataType::Bf16;
    let mut g = Graph::new(id).io_data_type(bf);
    let (qd, kd) = ([s.b, s.h, s.s_q, s.d], [s.b, s.h, s.s_kv, s.d]);
    let q = g.tensor(TensorDesc::new("q", &qd, bf));
    let k = g.tensor(TensorDesc::new("k", &kd, bf));
    let v = g.tensor(TensorDesc::new("v", &kd, bf));
    let o = g.tensor(TensorDesc::new("o", &qd, bf));
    let d_o = g.tensor(TensorDesc::new("do", &qd, bf));
    let stats = g.tensor(TensorDesc::new("stats", &[s.b, s.h, s.s_q, 1], DataType::F32));
    let grads = g.sdpa_backward(q, k, v, o, d_o, stats, SdpaInputs::default(), attrs(s.causal, true));
    for t in [grads.dq, grads.dk, grads.dv] {
        out(&mut g, t, bf);
    }
    Workload { id: id.to_string(), graph: g, flops: Some(s.flops() * 5 / 2) }
}

/// Decode: one query row per (batch, query head) against `s_kv` keys of `h_kv` kv heads.
fn decode(id: &str, b: i64, h_q: i64, h_kv: i64, s_kv: i64, d: i64) -> Workload {
    let bf = DataType::Bf16;
    let mut g = Graph::new(id).io_data_type(bf);
    let q = g.tensor(TensorDesc::new("q", &[b, h_q, 1, d], bf));
    let k = g.tensor(TensorDesc::new("k", &[b, h_kv, s_kv, d], bf));
    let v = g.tensor(TensorDesc::new("v", &[b, h_kv, s_kv, d], bf));
    let (o, _) = g.sdpa(q, k, v, SdpaInputs::default(), attrs(false, false));
    out(&mut g, o, bf);
    Workload { id: id.to_string(), graph: g, flops: None }
}

/// The attention suite (`ferrodnn bench --suite attention`).
pub fn attention_workloads() -> Vec<Workload> {
    let shapes: [(i64, i64, i64, i64, bool, &str); 4] = [
        (4, 16, 4096, 128, false, "b4h16s4096d128"),
        (4, 16, 4096, 128, true, "b4h16s4096d128_causal"),
        (16, 16, 1024, 64, false, "b16h16s1024d64"),
        (1, 32, 16384, 128, true, "b1h32s16384d128_causal"),
    ];
    let mut v = Vec::new();
    for &(b, h, s, d, causal, tag) in &shapes {
        v.push(forward(&format!("sdpa_fwd_bf16_{tag}"), Shape::new(b, h, s, s, d, causal)));
    }
    for &(b, h, s, d, causal, tag) in &shapes {
        v.push(backward(&format!("sdpa_bwd_bf16_{tag}"), Shape::new(b, h, s, s, d, causal)));
    }
    v.push(decode("sdpa_decode_bf16_b64hq32hkv8s8192d128", 64, 32, 8, 8192, 128));
    v
}

/// The attention sweep (`ferrodnn bench --suite attention-sweep`): bf16 shapes of public models,
/// forward and backward.
pub fn attention_sweep_workloads() -> Vec<Workload> {
    let shapes = [
        // Stable Diffusion 1.5's UNet at 64x64 latents: self-attention over 4096 pixels and
        // cross-attention to 77 text tokens (head dim 40), then 32x32 (80) and 16x16 (160).
        ("sd15", Shape::new(2, 8, 4096, 4096, 40, false)),
        ("sd15_cross", Shape::new(2, 8, 4096, 77, 40, false)),
        ("sd15", Shape::new(2, 8, 1024, 1024, 80, false)),
        ("sd15", Shape::new(2, 8, 256, 256, 160, false)),
        // Whisper-style encoder (1500 frames), head dim 80.
        ("whisper", Shape::new(4, 16, 1500, 1500, 80, false)),
        // Head dim 96 (Phi-style), causal, 1000 tokens.
        ("phi", Shape::new(4, 32, 1000, 1000, 96, true)),
        // Head dim 256 (Gemma-style).
        ("gemma", Shape::new(2, 8, 2048, 2048, 256, false)),
        // Llama prefill with an odd length, and at 2048.
        ("llama", Shape::new(1, 32, 4103, 4103, 128, true)),
        ("llama", Shape::new(2, 32, 2048, 2048, 128, true)),
        // DiT-XL/2 at 256 px (256 tokens, head dim 72).
        ("dit", Shape::new(32, 16, 256, 256, 72, false)),
        // BERT-base, ViT-B/16, CLIP's text encoder.
        ("bert", Shape::new(16, 12, 512, 512, 64, false)),
        ("vit", Shape::new(32, 12, 197, 197, 64, false)),
        ("clip_text", Shape::new(32, 8, 77, 77, 64, true)),
    ];
    let mut v = Vec::new();
    for (model, s) in shapes {
        v.push(forward(&format!("sdpa_fwd_bf16_{model}_{}", s.tag()), s));
        v.push(backward(&format!("sdpa_bwd_bf16_{model}_{}", s.tag()), s));
    }
    v
}

/// Two small attention problems for the small-sizes suite (its host time per execute): a
/// decode-sized forward (one batch, 8 heads, 128 queries and keys, head dim 64) in the sweep's
/// id form, so that the PyTorch side parses it as a sweep row.
pub fn small_attention_workloads() -> Vec<Workload> {
    let s = Shape::new(1, 8, 128, 128, 64, false);
    vec![forward(&format!("sdpa_fwd_bf16_small_{}", s.tag()), s)]
}

#[cfg(test)]
mod tests {
    /// The sweep's graphs validate and run on the flash kernels, and their ids spell their
    /// shapes as PyTorch's side (bench/torch_attention.py) parses them.
    #[test]
    fn every_sweep_workload_validates_on_the_flash_kernels() {
        let all = super::attention_sweep_workloads();
        assert_eq!(all.len(), 26);
        for w in all {
            let mut g = w.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", w.id));
            let sources = ferrodnn::engine::cuda::kernel_sources(&g, &ferrodnn::engine::cuda::Target::sm90a()).unwrap();
            assert!(sources.iter().any(|(entry, _)| entry.contains("_attn_")), "{}", w.id);
            let q = g.desc(g.nodes[0].input("q").unwrap()).dims.clone();
            let k = g.desc(g.nodes[0].input("k").unwrap()).dims.clone();
            assert!(w.id.contains(&format!("_b{}h{}q{}k{}d{}", q[0], q[1], q[2], k[2], q[3])), "{}", w.id);
        }
    }

    #[test]
    fn every_attention_workload_validates() {
        let all = super::attention_workloads();
        assert_eq!(all.len(), 9);
        for w in all {
            let mut g = w.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", w.id));
            assert!(crate::bench::min_bytes(&g) > 1 << 20, "{}", w.id);
            // The attention engine takes every workload (not the fallback).
            let sources = ferrodnn::engine::cuda::kernel_sources(&g, &ferrodnn::engine::cuda::Target::sm90a()).unwrap();
            assert!(sources.iter().any(|(entry, _)| entry.contains("_attn_")), "{}", w.id);
        }
    }
}
