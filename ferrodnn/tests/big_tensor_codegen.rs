//! Tensors past 2^31 elements and 2^32 bytes (issue 29, item 5), without a GPU: such graphs plan
//! on the CUDA engine (no kernel refuses them outright), each op on a kernel whose index
//! arithmetic is 64-bit where the counts need it, and a GEMM extent a Hopper or Ampere GEMM
//! kernel cannot index (one dimension past 2^31 - 1) goes to the generic matmul, whose offsets
//! are 64-bit. What the kernels compute at these sizes is checked on the GPU by
//! `ferrodnn gpu-reliability --big`.

use ferrodnn::engine::cuda::{kernel_sources, Target};
use ferrodnn::graph::ops::norm::NormAttrs;
use ferrodnn::{DataType, Graph, TensorDesc};

fn bf16_graph(name: &str) -> Graph {
    Graph::new(name).io_data_type(DataType::Bf16).intermediate_data_type(DataType::F32).compute_data_type(DataType::F32)
}

/// relu(x + b) on [rows, cols] with a broadcast row b.
fn add_relu(rows: i64, cols: i64) -> Graph {
    let mut g = bf16_graph("add_relu");
    let x = g.tensor(TensorDesc::new("x", &[rows, cols], DataType::Bf16));
    let b = g.tensor(TensorDesc::new("b", &[1, cols], DataType::Bf16));
    let y = g.add(x, b);
    let y = g.relu(y);
    g.set_output(y);
    g
}

fn sources(g: &Graph) -> Vec<(String, String)> {
    kernel_sources(g, &Target::sm90a()).unwrap_or_else(|e| panic!("graph {}: {e}", g.name))
}

/// The text of the fused pointwise kernel's offset macro of the broadcast input.
fn fused_pointwise(g: &Graph) -> String {
    sources(g).into_iter().find(|(e, _)| e.contains("fused_pointwise")).map(|(_, s)| s).expect("a fused pointwise kernel")
}

#[test]
fn pointwise_index_width_follows_the_element_count() {
    // Up to 2^32 - 1 elements the flat index is divided as a 32-bit unsigned (it fits); past
    // 2^32, as 64-bit. Either way the offsets are 64-bit (i64) and the loop runs over i64.
    let small = fused_pointwise(&add_relu((1 << 19) + 256, 4096)); // 2^31 + 2^20 elements
    assert!(small.contains("(unsigned)(f)"), "2^31 + 2^20 elements: expected 32-bit unsigned division");
    assert!(small.contains("const i64 n = FZ_N") || small.contains("i64 n ="), "the element count is not i64");
    let big = fused_pointwise(&add_relu((1 << 20) + 16, 4096)); // 2^32 + 2^16 elements
    assert!(big.contains("(unsigned long long)(f)"), "past 2^32 elements: expected 64-bit division");
    assert!(!big.contains("(unsigned)(f)"), "past 2^32 elements: a 32-bit division is left");
    assert!(big.contains(&format!("{}", ((1i64 << 20) + 16) * 4096)), "the element count is not in the kernel");
}

#[test]
fn rows_past_two_to_the_31_elements_plan_on_the_row_kernels() {
    let rows = (1i64 << 19) + 8;
    let mut g = bf16_graph("layernorm");
    let x = g.tensor(TensorDesc::new("x", &[rows, 4096], DataType::Bf16));
    let s = g.tensor(TensorDesc::new("s", &[1, 4096], DataType::Bf16));
    let b = g.tensor(TensorDesc::new("b", &[1, 4096], DataType::Bf16));
    let (y, _, _) = g.layernorm(x, s, b, NormAttrs::inference());
    g.set_output(y);
    let list = sources(&g);
    let (_, rows_kernel) = list.iter().find(|(e, _)| e.contains("layernorm_rows")).expect("the row kernel");
    assert!(rows_kernel.contains("constexpr i64 N = ROW_N"), "the row count is not i64");
    assert!(rows_kernel.contains(&format!("#define ROW_N {rows}")), "the row count is not in the kernel");

    let mut g = bf16_graph("softmax");
    let x = g.tensor(TensorDesc::new("x", &[rows, 4096], DataType::Bf16));
    let (y, _) = g.softmax(x, 1, false, false);
    g.set_output(y);
    assert!(sources(&g).iter().any(|(e, _)| e.contains("softmax_rows")));

    // A sum of every element: the group count (2^31 + 32768) is an i64 in the reduction.
    let mut g = bf16_graph("sum");
    let x = g.tensor(TensorDesc::new("x", &[rows, 4096], DataType::Bf16));
    let y = g.reduce_sum(x, &[0, 1]);
    g.set_output(y);
    let list = sources(&g);
    assert!(list.iter().all(|(_, s)| s.contains("i64 red_count(")), "a reduction kernel without the i64 group count");
}

#[test]
fn gemm_extents_past_int32_go_to_the_generic_matmul() {
    // A [2, 2^31 + 64] @ B [2^31 + 64, 2]: K past 2^31 - 1, which the tiled GEMMs' 32-bit
    // extents cannot take: the plan uses the generic matmul (64-bit offsets) instead.
    let k = (1i64 << 31) + 64;
    let mut g = bf16_graph("long_k");
    let a = g.tensor(TensorDesc::new("a", &[2, k], DataType::Bf16));
    let b = g.tensor(TensorDesc::new("b", &[k, 2], DataType::Bf16));
    let c = g.matmul(a, b);
    g.set_output(c);
    let list = sources(&g);
    assert!(list.iter().all(|(e, _)| !e.contains("gemm")), "a tiled GEMM took K = {k}: {:?}", list.iter().map(|(e, _)| e).collect::<Vec<_>>());
    assert!(list.iter().any(|(e, _)| e.contains("matmul")));
    // Past 2^31 elements in total but each extent within 2^31 - 1: the Hopper GEMM takes it
    // (its row, column and batch offsets are 64-bit).
    let mut g = bf16_graph("big_c");
    let a = g.tensor(TensorDesc::new("a", &[(1 << 16) + 4096, 64], DataType::Bf16));
    let b = g.tensor(TensorDesc::new("b", &[64, 32768], DataType::Bf16));
    let c = g.matmul(a, b);
    g.set_output(c);
    assert!(sources(&g).iter().any(|(e, _)| e.contains("gemm_sm90")), "the Hopper GEMM refused a 2^31-element output");
}

/// sdpa forward, bf16: q and o [b, h, s_q, d], k and v [b, h, s_kv, d], contiguous.
fn sdpa(b: i64, h: i64, s_q: i64, s_kv: i64, d: i64, causal: bool) -> Graph {
    use ferrodnn::graph::ops::sdpa::{CausalAlignment, SdpaAttrs, SdpaInputs};
    let mut g = bf16_graph("sdpa");
    let q = g.tensor(TensorDesc::new("q", &[b, h, s_q, d], DataType::Bf16));
    let k = g.tensor(TensorDesc::new("k", &[b, h, s_kv, d], DataType::Bf16));
    let v = g.tensor(TensorDesc::new("v", &[b, h, s_kv, d], DataType::Bf16));
    let attrs = SdpaAttrs { causal: causal.then_some(CausalAlignment::TopLeft), ..Default::default() };
    let (o, _) = g.sdpa(q, k, v, SdpaInputs::default(), attrs);
    g.set_output(o);
    g
}

#[test]
fn attention_past_two_to_the_31_elements_offsets_are_64_bit() {
    // The shapes of `gpu-reliability --big`: Q, K, V and O of 2^31 + 2^21 elements (2050 x 64 x
    // 128 x 128), and a decode forward whose K and V are (16 x 8 x (2^17 + 128) x 128). Each
    // plans on the attention kernels (Hopper, general, decode), whose element offsets are sums
    // of (index x stride) with the sizes and strides `long long` literals (`FA_B 2050LL`,
    // `Q_S0 1048576LL`): every product is 64-bit, never an `int` that wraps at 2^31.
    let cases = [
        (sdpa(2050, 64, 128, 128, 128, false), Target::sm90a(), "attn_fwd_sm90", "2050LL", 1i64 << 20),
        (sdpa(2050, 64, 128, 128, 128, true), Target::sm90a(), "attn_fwd_sm90", "2050LL", 1 << 20),
        (sdpa(2050, 64, 128, 128, 128, true), Target::sm80(), "attn_fwd", "2050LL", 1 << 20),
        (sdpa(16, 8, 1, (1 << 17) + 128, 128, false), Target::sm90a(), "attn_decode", "16LL", 8 * ((1 << 17) + 128) * 128),
    ];
    for (g, target, entry, batch, kv_s0) in cases {
        let list = kernel_sources(&g, &target).unwrap_or_else(|e| panic!("{}: {e}", target.arch));
        let names: Vec<&str> = list.iter().map(|(e, _)| e.as_str()).collect();
        let (_, src) = list.iter().find(|(e, _)| e.contains(entry) && !e.contains("unaligned")).unwrap_or_else(|| panic!("{}: no {entry} kernel in {names:?}", target.arch));
        assert!(src.contains(&format!("#define FA_B {batch}")), "{entry}: the batch count is not a 64-bit literal");
        assert!(src.contains(&format!("#define K_S0 {kv_s0}LL")), "{entry}: K's batch stride is not a 64-bit literal");
        // Every stride define of every tensor (Q, K, V, O, the stats) is a `long long` literal.
        for line in src.lines().filter(|l| l.starts_with("#define ")) {
            let mut words = line.split_whitespace().skip(1);
            let (Some(name), Some(value)) = (words.next(), words.next()) else { continue };
            let stride = name.len() > 3 && name[..name.len() - 1].ends_with("_S") && name.ends_with(|c: char| c.is_ascii_digit());
            if stride && value.parse::<i64>().is_ok() {
                panic!("{entry}: the stride {name} is an int literal ({value}): its products wrap at 2^31");
            }
        }
    }
}
