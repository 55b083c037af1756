//! The attention suite of issue 6: flash-attention forward and backward in bf16 on the issue's
//! shapes, and GQA decode. Q/K/V/O are packed `[b, h, s, d]` (PyTorch's layout for
//! `scaled_dot_product_attention`); the backward takes `o`, `do` and f32 `stats` as inputs.
//! FLOPs: forward `4 b h s_q s_kv d` (half when causal), backward 2.5 times that; decode is
//! measured against copy bandwidth (no FLOPs given). `bench/torch_attention.py` times the same
//! workloads with PyTorch.

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

fn forward(id: &str, b: i64, h: i64, s: i64, d: i64, causal: bool) -> Workload {
    let bf = DataType::Bf16;
    let mut g = Graph::new(id).io_data_type(bf);
    let q = g.tensor(TensorDesc::new("q", &[b, h, s, d], bf));
    let k = g.tensor(TensorDesc::new("k", &[b, h, s, d], bf));
    let v = g.tensor(TensorDesc::new("v", &[b, h, s, d], bf));
    let (o, _) = g.sdpa(q, k, v, SdpaInputs::default(), attrs(causal, false));
    out(&mut g, o, bf);
    Workload { id: id.to_string(), graph: g, flops: Some(fwd_flops(b, h, s, s, d, causal)) }
}

fn backward(id: &str, b: i64, h: i64, s: i64, d: i64, causal: bool) -> Workload {
    let bf = DataType::Bf16;
    let mut g = Graph::new(id).io_data_type(bf);
    let dims = [b, h, s, d];
    let q = g.tensor(TensorDesc::new("q", &dims, bf));
    let k = g.tensor(TensorDesc::new("k", &dims, bf));
    let v = g.tensor(TensorDesc::new("v", &dims, bf));
    let o = g.tensor(TensorDesc::new("o", &dims, bf));
    let d_o = g.tensor(TensorDesc::new("do", &dims, bf));
    let stats = g.tensor(TensorDesc::new("stats", &[b, h, s, 1], DataType::F32));
    let grads = g.sdpa_backward(q, k, v, o, d_o, stats, SdpaInputs::default(), attrs(causal, true));
    for t in [grads.dq, grads.dk, grads.dv] {
        out(&mut g, t, bf);
    }
    Workload { id: id.to_string(), graph: g, flops: Some(fwd_flops(b, h, s, s, d, causal) * 5 / 2) }
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
        v.push(forward(&format!("sdpa_fwd_bf16_{tag}"), b, h, s, d, causal));
    }
    for &(b, h, s, d, causal, tag) in &shapes {
        v.push(backward(&format!("sdpa_bwd_bf16_{tag}"), b, h, s, d, causal));
    }
    v.push(decode("sdpa_decode_bf16_b64hq32hkv8s8192d128", 64, 32, 8, 8192, 128));
    v
}

#[cfg(test)]
mod tests {
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
