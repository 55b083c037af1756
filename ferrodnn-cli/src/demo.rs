//! The demo graphs and the example graphs in `examples/`: the kinds of graph users start with.

use ferrodnn::engine::PlanPolicy;
use ferrodnn::graph::ops::conv::ConvAttrs;
use ferrodnn::graph::ops::norm::{NormAttrs, NormPhase};
use ferrodnn::graph::ops::reduction::ReductionMode;
use ferrodnn::graph::ops::resample::ResampleAttrs;
use ferrodnn::graph::ops::sdpa::{CausalAlignment, SdpaAttrs};
use ferrodnn::testing::{execute_dense, execute_plan_dense_cancellable, relative_error, try_random_inputs};
use ferrodnn::{DataType, EngineKind, Graph, Handle, TensorDesc};
use std::time::Instant;

/// conv -> bias -> relu on a channels-last f32 image.
pub fn conv_bias_relu() -> Graph {
    let mut g = Graph::new("conv_bias_relu").io_data_type(DataType::F32);
    let x = g.tensor(TensorDesc::new("x", &[2, 16, 15, 15], DataType::F32).with_layout(&[0, 2, 3, 1]));
    let w = g.tensor(TensorDesc::new("w", &[32, 16, 3, 3], DataType::F32).with_layout(&[0, 2, 3, 1]));
    let b = g.tensor(TensorDesc::new("b", &[1, 32, 1, 1], DataType::F32));
    let y = g.conv_fprop(x, w, ConvAttrs::new(2).with_padding(&[1, 1]));
    g.named("conv");
    let y = g.bias(y, b);
    let y = g.relu(y);
    g.set_output(y);
    g.desc_mut(y).name = "y".into();
    g
}

/// Layernorm training forward on bf16 rows, with its statistics.
pub fn layernorm() -> Graph {
    let mut g = Graph::new("layernorm").io_data_type(DataType::Bf16);
    let x = g.tensor(TensorDesc::new("x", &[64, 256], DataType::Bf16));
    let scale = g.tensor(TensorDesc::new("scale", &[1, 256], DataType::Bf16));
    let bias = g.tensor(TensorDesc::new("bias", &[1, 256], DataType::Bf16));
    let (y, mean, inv_var) = g.layernorm(x, scale, bias, NormAttrs { phase: NormPhase::Training, epsilon: 1e-5 });
    g.set_output(y);
    g.desc_mut(y).name = "y".into();
    for (t, name) in [(mean, "mean"), (inv_var, "inv_variance")] {
        if let Some(t) = t {
            g.set_output(t);
            g.desc_mut(t).name = name.into();
            // Statistics stay in f32, as cuDNN's users set them.
            g.desc_mut(t).data_type = Some(DataType::F32);
        }
    }
    g
}

/// Causal attention, grouped-query (8 query heads on 2 K/V heads), BSHD strides, f16.
pub fn attention() -> Graph {
    let (b, hq, hkv, s, d) = (2i64, 8i64, 2i64, 64i64, 32i64);
    let mut g = Graph::new("attention").io_data_type(DataType::F16);
    // BSHD in memory: dims stay [b, h, s, d], strides say the layout.
    let bshd = |h: i64| vec![s * h * d, d, h * d, 1];
    let q = g.tensor(TensorDesc::new("q", &[b, hq, s, d], DataType::F16).with_strides(&bshd(hq)));
    let k = g.tensor(TensorDesc::new("k", &[b, hkv, s, d], DataType::F16).with_strides(&bshd(hkv)));
    let v = g.tensor(TensorDesc::new("v", &[b, hkv, s, d], DataType::F16).with_strides(&bshd(hkv)));
    let attrs = SdpaAttrs { causal: Some(CausalAlignment::TopLeft), generate_stats: true, ..Default::default() };
    let (o, stats) = g.sdpa(q, k, v, Default::default(), attrs);
    g.set_output(o);
    g.desc_mut(o).name = "o".into();
    if let Some(stats) = stats {
        g.set_output(stats);
        g.desc_mut(stats).name = "stats".into();
        g.desc_mut(stats).data_type = Some(DataType::F32);
    }
    g
}

/// matmul -> bias -> gelu, bf16 in and out.
pub fn matmul_bias_gelu() -> Graph {
    let mut g = Graph::new("matmul_bias_gelu").io_data_type(DataType::Bf16);
    let a = g.tensor(TensorDesc::new("a", &[4, 33, 64], DataType::Bf16));
    let bt = g.tensor(TensorDesc::new("b", &[64, 48], DataType::Bf16).with_strides(&[1, 64]));
    let bias = g.tensor(TensorDesc::new("bias", &[1, 48], DataType::Bf16));
    let c = g.matmul(a, bt);
    let c = g.bias(c, bias);
    let y = g.gelu(c);
    g.set_output(y);
    g.desc_mut(y).name = "y".into();
    g
}

/// Softmax over the last axis with its log-sum-exp statistics.
pub fn softmax() -> Graph {
    let mut g = Graph::new("softmax").io_data_type(DataType::F16);
    let x = g.tensor(TensorDesc::new("x", &[16, 8, 100], DataType::F16));
    let (y, stats) = g.softmax(x, 2, false, true);
    g.set_output(y);
    g.desc_mut(y).name = "y".into();
    if let Some(stats) = stats {
        g.set_output(stats);
        g.desc_mut(stats).name = "stats".into();
        g.desc_mut(stats).data_type = Some(DataType::F32);
    }
    g
}

/// 3x3 stride-2 max pooling, padding 1, on a channels-last f16 image.
pub fn maxpool() -> Graph {
    let mut g = Graph::new("maxpool").io_data_type(DataType::F16);
    let x = g.tensor(TensorDesc::new("x", &[2, 16, 17, 17], DataType::F16).with_layout(&[0, 2, 3, 1]));
    let y = g.resample(x, ResampleAttrs::max_2d(3, 2, 1));
    g.set_output(y);
    g.desc_mut(y).name = "y".into();
    g
}

/// Scale, shift and relu, then a sum over channels: a memory-bound chain into a reduction.
pub fn scale_relu_sum() -> Graph {
    let mut g = Graph::new("scale_relu_sum").io_data_type(DataType::F32);
    let x = g.tensor(TensorDesc::new("x", &[4, 32, 7, 7], DataType::F32));
    let s = g.scalar("scale", 0.5);
    let b = g.tensor(TensorDesc::new("bias", &[1, 32, 1, 1], DataType::F32));
    let y = g.scale(x, s);
    let y = g.bias(y, b);
    let y = g.relu(y);
    let y = g.reduction(y, ReductionMode::Add, &[1]);
    g.set_output(y);
    g.desc_mut(y).name = "y".into();
    g
}

/// Every example graph, by file stem.
pub fn example_graphs() -> Vec<(&'static str, Graph)> {
    vec![
        ("conv_bias_relu", conv_bias_relu()),
        ("layernorm", layernorm()),
        ("attention", attention()),
        ("matmul_bias_gelu", matmul_bias_gelu()),
        ("softmax", softmax()),
        ("maxpool", maxpool()),
        ("scale_relu_sum", scale_relu_sum()),
    ]
}

/// Write every example graph as `DIR/<name>.json`.
pub fn write_examples(dir: &std::path::Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for (name, mut g) in example_graphs() {
        g.validate().map_err(|e| format!("{name}: {e}"))?;
        let path = dir.join(format!("{name}.json"));
        std::fs::write(&path, g.to_json().map_err(|e| e.to_string())? + "\n").map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        outln!("wrote {}", path.display());
    }
    Ok(())
}

pub fn demo() -> Result<(), String> {
    let handle = Handle::new();
    let engines: Vec<&str> = handle.engines().map(|e| e.name()).collect();
    outln!("ferrodnn demo: engines available here: {}", engines.join(", "));
    let cancel = crate::cancel_token();
    for mut g in [conv_bias_relu(), layernorm(), attention()] {
        g.validate().map_err(|e| e.to_string())?;
        let inputs = try_random_inputs(&g, 1).map_err(|e| e.to_string())?;
        let plan = handle.build_plans(&g, &PlanPolicy::default()).map_err(|e| e.to_string())?.remove(0);
        let engine = plan.engine();
        // The first run warms up; time a second.
        execute_plan_dense_cancellable(&handle, &plan, &inputs, cancel).map_err(|e| e.to_string())?;
        let start = Instant::now();
        let outputs = execute_plan_dense_cancellable(&handle, &plan, &inputs, cancel).map_err(|e| e.to_string())?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        outln!("\n{}: {} ops on engine {} in {ms:.2} ms", g.name, g.nodes.len(), engine.name());
        let reference =
            if engine == EngineKind::Reference { None } else { Some(execute_dense(&Handle::reference(), &g, &inputs, &PlanPolicy::default()).map_err(|e| e.to_string())?) };
        let mut ids: Vec<_> = outputs.keys().copied().collect();
        ids.sort();
        for id in ids {
            let d = g.desc(id);
            let out = &outputs[&id];
            let preview: Vec<String> = out.data.iter().take(4).map(|v| format!("{v:+.4}")).collect();
            let dtype = g.resolved_data_type(id).unwrap_or(DataType::F32);
            let check = match &reference {
                Some(r) => format!("rel. error vs CPU reference {:.2e}", relative_error(&out.data, &r[&id].data)),
                None => "(the CPU engine is the reference)".to_string(),
            };
            outln!("  {:<13} {:?} {dtype}: [{}, ...] {check}", d.name, d.dims, preview.join(", "));
        }
    }
    Ok(())
}
