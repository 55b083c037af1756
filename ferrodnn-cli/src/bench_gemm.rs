//! The GEMM sweep (issue 27, `--suite gemm-sweep`): bf16 matrix products of public models'
//! layers, as frameworks call them. Linear layers multiply activations `[tokens, in]` by a
//! weight stored `[out, in]` (`nt`: B transposed, PyTorch's `x @ W.t()`); weight gradients take
//! A transposed (`tn`); the square and odd problems are plain (`nn`); batched products
//! (attention scores, heads as the batch) last. Each id spells its problem
//! (`b{batch}m{m}n{n}k{k}_{nn|nt|tn}`), which PyTorch's side (bench/run.py) parses.

use crate::bench::Workload;
use ferrodnn::{DataType, Graph, TensorDesc};

/// A product `[batch,] m x k` by `k x n`, A and/or B stored transposed.
#[derive(Clone, Copy)]
struct Mm {
    batch: i64,
    m: i64,
    n: i64,
    k: i64,
    ta: bool,
    tb: bool,
}

const fn mm(m: i64, n: i64, k: i64, layout: &str) -> Mm {
    let l = layout.as_bytes();
    Mm { batch: 1, m, n, k, ta: l[0] == b't', tb: l[1] == b't' }
}

impl Mm {
    fn tag(&self) -> String {
        let Mm { batch, m, n, k, ta, tb } = *self;
        format!("b{batch}m{m}n{n}k{k}_{}{}", if ta { 't' } else { 'n' }, if tb { 't' } else { 'n' })
    }

    fn workload(&self, model: &str) -> Workload {
        let bf = DataType::Bf16;
        let id = format!("mm_{model}_{}", self.tag());
        let mut g = Graph::new(&id).io_data_type(bf);
        let operand = |g: &mut Graph, name: &str, rows: i64, cols: i64, t: bool| {
            let (dims, layout) = if self.batch > 1 { (vec![self.batch, rows, cols], vec![0, 2, 1]) } else { (vec![rows, cols], vec![1, 0]) };
            let d = TensorDesc::new(name, &dims, bf);
            g.tensor(if t { d.with_layout(&layout) } else { d })
        };
        let a = operand(&mut g, "a", self.m, self.k, self.ta);
        let b = operand(&mut g, "b", self.k, self.n, self.tb);
        let y = g.matmul(a, b);
        g.set_output(y);
        g.desc_mut(y).data_type = Some(bf);
        Workload { id, graph: g, flops: Some(2 * (self.batch * self.m * self.n * self.k) as u64) }
    }
}

/// The GEMM sweep (`ferrodnn bench --suite gemm-sweep`).
pub fn gemm_sweep_workloads() -> Vec<Workload> {
    let shapes: Vec<(&str, Mm)> = vec![
        // Llama-2-7B prefill (2048 tokens): QKV, output projection, MLP up/gate, down.
        ("llama2_qkv", mm(2048, 12288, 4096, "nt")),
        ("llama2_o", mm(2048, 4096, 4096, "nt")),
        ("llama2_up", mm(2048, 11008, 4096, "nt")),
        ("llama2_down", mm(2048, 4096, 11008, "nt")),
        // Llama-3-8B / Mistral-7B prefill (4096 tokens, GQA QKV 6144, MLP 14336) and LM head.
        ("llama3_qkv", mm(4096, 6144, 4096, "nt")),
        ("llama3_up", mm(4096, 14336, 4096, "nt")),
        ("llama3_down", mm(4096, 4096, 14336, "nt")),
        ("llama3_lm_head", mm(512, 128256, 4096, "nt")),
        // Decode: one to 32 sequences.
        ("llama2_decode_qkv", mm(1, 12288, 4096, "nt")),
        ("llama2_decode_down", mm(1, 4096, 11008, "nt")),
        ("llama3_decode8_up", mm(8, 14336, 4096, "nt")),
        ("llama3_decode32_o", mm(32, 4096, 4096, "nt")),
        ("decode_1x4096x4096", mm(1, 4096, 4096, "nn")),
        // Qwen2-7B prefill (hidden 3584, MLP 18944).
        ("qwen2_o", mm(2048, 3584, 3584, "nt")),
        ("qwen2_up", mm(2048, 18944, 3584, "nt")),
        ("qwen2_down", mm(2048, 3584, 18944, "nt")),
        // GPT-2 small (8 x 1024 tokens), with its odd vocabulary.
        ("gpt2_qkv", mm(8192, 2304, 768, "nt")),
        ("gpt2_fc", mm(8192, 3072, 768, "nt")),
        ("gpt2_proj", mm(8192, 768, 3072, "nt")),
        ("gpt2_lm_head", mm(1024, 50257, 768, "nt")),
        // BERT-base and -large (32 x 128 tokens).
        ("bert_base_attn", mm(4096, 768, 768, "nt")),
        ("bert_base_fc", mm(4096, 3072, 768, "nt")),
        ("bert_base_proj", mm(4096, 768, 3072, "nt")),
        ("bert_large_fc", mm(4096, 4096, 1024, "nt")),
        ("bert_large_proj", mm(4096, 1024, 4096, "nt")),
        // ViT-B/16 (32 images x 197 tokens): QKV, MLP, and the MLP's backward (data and weight
        // gradients).
        ("vit_qkv", mm(6304, 2304, 768, "nt")),
        ("vit_fc", mm(6304, 3072, 768, "nt")),
        ("vit_proj", mm(6304, 768, 3072, "nt")),
        ("vit_proj_dgrad", mm(6304, 3072, 768, "nn")),
        ("vit_proj_wgrad", mm(768, 3072, 6304, "tn")),
        ("vit_fc_wgrad", mm(3072, 768, 6304, "tn")),
        // CLIP's text encoder: one prompt and a batch of 32.
        ("clip_fc", mm(77, 3072, 768, "nt")),
        ("clip_b32_attn", mm(2464, 768, 768, "nt")),
        // Stable Diffusion 1.5's UNet at 64x64 (2 x 4096 tokens, 320 channels): projections,
        // GEGLU, cross-attention K/V from the text (2 x 77 tokens).
        ("sd15_proj", mm(8192, 320, 320, "nt")),
        ("sd15_geglu", mm(8192, 2560, 320, "nt")),
        ("sd15_ff_out", mm(8192, 320, 1280, "nt")),
        ("sd15_cross_kv", mm(154, 320, 768, "nt")),
        // Whisper-large encoder (1500 frames), DiT-XL/2 (32 x 256 tokens).
        ("whisper_attn", mm(1500, 1280, 1280, "nt")),
        ("whisper_fc", mm(1500, 5120, 1280, "nt")),
        ("dit_fc", mm(8192, 4608, 1152, "nt")),
        ("dit_proj", mm(8192, 1152, 4608, "nt")),
        // The plain and odd problems.
        ("square", mm(1000, 1000, 1000, "nn")),
        ("odd", mm(3000, 5000, 1000, "nn")),
        ("square", mm(4096, 4096, 4096, "nn")),
        // Batched: attention scores and their products as bmm (heads x batch as the batch).
        ("vit_scores", Mm { batch: 384, m: 197, n: 197, k: 64, ta: false, tb: true }),
        ("vit_pv", Mm { batch: 384, m: 197, n: 64, k: 197, ta: false, tb: false }),
        ("bert_scores", Mm { batch: 384, m: 128, n: 128, k: 64, ta: false, tb: true }),
    ];
    shapes.into_iter().map(|(model, s)| s.workload(model)).collect()
}

#[cfg(test)]
mod tests {
    /// The sweep has the forty-odd problems; each validates and its id spells its shape.
    #[test]
    fn every_sweep_workload_validates() {
        let all = super::gemm_sweep_workloads();
        assert!(all.len() >= 40, "{}", all.len());
        for w in all {
            let mut g = w.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", w.id));
            let a = g.desc(g.nodes[0].inputs[0].tensor).clone();
            let b = g.desc(g.nodes[0].inputs[1].tensor).clone();
            let r = a.dims.len();
            let (m, k, n) = (a.dims[r - 2], a.dims[r - 1], b.dims[r - 1]);
            assert!(w.id.contains(&format!("m{m}n{n}k{k}_")), "{}", w.id);
            // A transposed: its rows (m) innermost.
            assert_eq!(w.id.ends_with("_tn") || w.id.ends_with("_tt"), a.strides[r - 2] == 1 && m > 1, "{}", w.id);
        }
    }
}
