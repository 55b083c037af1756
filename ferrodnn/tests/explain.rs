//! `explain` on a graph the fast engines take (a fused GEMM group) and on one that falls back
//! (a mirrored weight gradient, and an f64 layernorm the row kernels decline): the units, their engines, the
//! declines with reasons, the kernels with their launch shapes, and the exact kernel text.

use ferrodnn::engine::cuda::{explain, Target};
use ferrodnn::graph::ops::conv::{ConvAttrs, ConvMode};
use ferrodnn::graph::ops::norm::NormAttrs;
use ferrodnn::{DataType, Graph, TensorDesc};

fn matmul_bias_relu() -> Graph {
    let bf = DataType::Bf16;
    let mut g = Graph::new("matmul_bias_relu").io_data_type(bf);
    let a = g.tensor(TensorDesc::new("a", &[256, 128], bf));
    let b = g.tensor(TensorDesc::new("b", &[128, 512], bf));
    let bias = g.tensor(TensorDesc::new("bias", &[1, 512], bf));
    let y = g.matmul(a, b);
    let y = g.bias(y, bias);
    let y = g.relu(y);
    g.set_output(y);
    g
}

#[test]
fn a_fused_gemm_group_is_one_unit_of_the_gemm_engine() {
    let g = matmul_bias_relu();
    let hopper = explain(&g, &Target::sm90a(), &[]).unwrap();
    assert_eq!(hopper.units.len(), 1);
    let u = &hopper.units[0];
    assert_eq!(u.engine, "gemm");
    assert_eq!(u.nodes.iter().map(|n| n.1.as_str()).collect::<Vec<_>>(), ["matmul", "bias", "relu"]);
    assert!(u.declined.is_empty());
    // The wgmma kernel: one CTA per SM at most, 384 threads (producer + two consumers).
    let k = &u.kernels[0];
    assert!(k.entry.ends_with("gemm_sm90"), "{}", k.entry);
    assert_eq!(k.block, 384);
    assert!(k.source.starts_with("#define FDNN_PDL ") && k.source.contains("wgmma.mma_async"));
    // Its alternative for misaligned buffers, named by tensor.
    assert!(!u.unaligned.is_empty() && u.unaligned_tensors.contains(&"bias".to_string()));
    let text = hopper.to_text(true);
    assert!(text.contains("unit 0: 0:matmul \"matmul_0\", 1:bias \"bias_1\", 2:relu \"relu_2\" -> gemm"), "{text}");
    assert!(text.contains(&format!("// ===== {} =====\n{}", k.entry, k.source)));
    // On sm_80 the same group runs on mma.sync.
    let ampere = explain(&g, &Target::sm80(), &[]).unwrap();
    assert_eq!(ampere.units.len(), 1);
    assert!(ampere.units[0].kernels[0].source.contains("mma.sync"));
    assert!(!ampere.units[0].kernels[0].dependent);
}

#[test]
fn a_graph_the_fast_engines_decline_falls_back_and_says_why() {
    let f = DataType::F32;
    let mut g = Graph::new("conv_then_norm").io_data_type(f);
    let x = g.tensor(TensorDesc::new("x", &[2, 8, 9, 9], f).with_layout(&[0, 2, 3, 1]));
    let w = g.tensor(TensorDesc::new("w", &[16, 4, 3, 3], f).with_layout(&[0, 2, 3, 1]));
    let y = g.conv_fprop(x, w, ConvAttrs::new(2).with_padding(&[1, 1]));
    g.set_output(y);
    // A grouped convolution (2 groups of 4 channels) runs on the conv engine's small-group
    // kernels.
    let e = explain(&g, &Target::sm90a(), &[]).unwrap();
    assert_eq!(e.units.len(), 1);
    assert_eq!(e.units[0].engine, "conv");
    assert!(e.units[0].kernels[0].entry.contains("sg_conv_fprop"), "{}", e.units[0].kernels[0].entry);
    // A weight gradient in convolution mode (the filter mirrored) of groups past those kernels (2
    // of 32 channels) does not run on the conv engine: it declines it and says why.
    let mut g = Graph::new("wgrad_mirrored").io_data_type(f);
    let dy = g.tensor(TensorDesc::new("dy", &[2, 16, 9, 9], f).with_layout(&[0, 2, 3, 1]));
    let x = g.tensor(TensorDesc::new("x", &[2, 64, 9, 9], f).with_layout(&[0, 2, 3, 1]));
    let dw = g.conv_wgrad(dy, x, &[16, 32, 3, 3], ConvAttrs::new(2).with_padding(&[1, 1]).with_mode(ConvMode::Convolution));
    g.set_output(dw);
    let e = explain(&g, &Target::sm90a(), &[]).unwrap();
    assert_eq!(e.units.len(), 1);
    assert_eq!(e.units[0].engine, "fallback");
    assert_eq!(e.units[0].declined.len(), 1);
    let (family, why) = &e.units[0].declined[0];
    assert_eq!(family, "conv");
    assert_eq!(why, "a weight gradient in convolution mode (mirrored filter) runs on the fallback");
    assert!(e.to_text(false).contains("-> fallback\n  declined by conv: a weight gradient in convolution mode"), "{}", e.to_text(false));
    assert!(e.to_text(false).contains("kernel n0_conv_wgrad: grid cover "), "{}", e.to_text(false));

    // A layernorm computing in f64: the row kernels take layernorm but decline f64.
    let d = DataType::F64;
    let mut g = Graph::new("ln64").io_data_type(d);
    let x = g.tensor(TensorDesc::new("x", &[4, 16], d));
    let s = g.tensor(TensorDesc::new("s", &[1, 16], d));
    let b = g.tensor(TensorDesc::new("b", &[1, 16], d));
    let (y, _, _) = g.layernorm(x, s, b, NormAttrs::default());
    g.set_output(y);
    let e = explain(&g, &Target::sm90a(), &[]).unwrap();
    let u = &e.units[0];
    assert_eq!(u.engine, "fallback");
    assert_eq!(u.declined.len(), 1);
    assert_eq!(u.declined[0].0, "rows");
    assert!(u.declined[0].1.contains("f64"), "{:?}", u.declined);
    // The knobs can ask for the per-node fallback plan.
    let plain = explain(&matmul_bias_relu(), &Target::sm90a(), &[ferrodnn::engine::Knob { name: "fused".into(), value: 0 }]).unwrap();
    assert_eq!(plain.units.len(), 3);
    assert!(plain.units.iter().all(|u| u.engine == "fallback"));
}

/// Every example graph (examples/*.json, the README's) explains on both architectures: every node
/// is covered by exactly one unit, and every unit has kernels.
#[test]
fn every_example_graph_explains() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let g = Graph::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for target in [Target::sm80(), Target::sm90a()] {
            let e = explain(&g, &target, &[]).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
            let mut covered: Vec<usize> = e.units.iter().flat_map(|u| u.nodes.iter().map(|n| n.0)).collect();
            covered.sort();
            assert_eq!(covered, (0..g.nodes.len()).collect::<Vec<_>>(), "{}", path.display());
            assert!(e.units.iter().all(|u| !u.kernels.is_empty()), "{}", path.display());
            assert!(e.to_text(false).starts_with(&format!("graph \"{}\" on {}", g.name, target.arch)));
        }
        seen += 1;
    }
    assert!(seen >= 5, "{seen} example graphs");
}
