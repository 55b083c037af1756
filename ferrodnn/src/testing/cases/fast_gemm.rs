//! Cases for the tensor-core GEMM engine (engine/cuda/gemm): M, N, K that are multiples of
//! nothing; row- and column-major A and B (transposes as strides); padded rows that are not
//! 16-byte aligned (the scalar loaders); batches with broadcast batch dims (and one that does not
//! flatten, which falls back); f16, bf16, f32 (3xTF32) and fp8 inputs; every epilogue kind
//! (row and column bias, relu, gelu, silu, residual add, scale by a by-value scalar, casts to
//! f32/f16/bf16/fp8, 16-bit intermediates); split-K shapes (the partial-sum reduce launch) and
//! the tile shapes the heuristic picks (16x128 for M <= 16, 64x64, and 128x128, which needs
//! at least one tile per SM and so a 1536x1408 output); decode shapes wide enough for the
//! Hopper kernel to compute C^T (M <= 32, N >= 7424); stream-K shapes (a few waves of tiles, the
//! last mostly idle); 8-bit integer GEMMs (`int8_`).

use super::Case;
use crate::graph::ops::pointwise::PointwiseMode;
use crate::graph::ops::reduction::ReductionMode;
use crate::graph::TensorId;
use crate::{DataType, Graph, TensorDesc};

/// A `[..., rows, cols]` tensor stored transposed (its last two dims swapped in memory).
fn transposed(name: &str, dims: &[i64], dt: DataType) -> TensorDesc {
    let r = dims.len();
    let mut order: Vec<usize> = (0..r).collect();
    order.swap(r - 2, r - 1);
    TensorDesc::new(name, dims, dt).with_layout(&order)
}

fn out(g: &mut Graph, id: TensorId, name: &str, dt: DataType) {
    g.set_output(id);
    let d = g.desc_mut(id);
    d.name = name.into();
    d.data_type = Some(dt);
}

/// A plain matmul `a x b -> c` (c of type `ct`).
fn mm(name: &str, a: TensorDesc, b: TensorDesc, ct: DataType) -> Case {
    let name = format!("fast_gemm_{name}");
    let mut g = Graph::new(name.clone());
    let (a, b) = (g.tensor(a), g.tensor(b));
    let c = g.matmul(a, b);
    out(&mut g, c, "c", ct);
    Case::new(name, g)
}

/// The epilogues: what follows the matmul's (virtual) result `x`.
#[derive(Clone, Copy, Debug)]
enum Epi {
    /// + bias [1, n], relu
    BiasRowRelu,
    /// + bias [m, 1], gelu
    BiasColGelu,
    /// silu (swish with beta 1)
    Silu,
    /// + residual [m, n] (stored transposed)
    Residual,
    /// * by-value scalar
    Scale,
    /// bias row, gelu, * scalar, + residual: four nodes
    Chain4,
    /// + bias [m, 1] in the input type, relu
    BiasColRelu,
    /// * a [1, 1] tensor (a scalar side input, not by value), + bias [1, n] in f32
    ScaleTensorBiasF32,
    /// + bias [batch.., 1, n] (a per-batch row of bias), + residual [batch.., m, n] row-major
    BatchBiasResidual,
}

impl Epi {
    fn name(self) -> &'static str {
        match self {
            Epi::BiasRowRelu => "bias_relu",
            Epi::BiasColGelu => "biascol_gelu",
            Epi::Silu => "silu",
            Epi::Residual => "residual",
            Epi::Scale => "scale",
            Epi::Chain4 => "chain4",
            Epi::BiasColRelu => "biascol_relu",
            Epi::ScaleTensorBiasF32 => "scalet_biasf32",
            Epi::BatchBiasResidual => "bbias_residual",
        }
    }
}

/// `epilogue(a x b)` for a `[batch.., m, k] x [k, n]` problem with A and B in the given
/// layouts, inputs of `dt`, output of `ot`.
fn with_epi(epi: Epi, dt: DataType, ot: DataType, batch: &[i64], (m, n, k): (i64, i64, i64), at: bool, bt: bool) -> Case {
    let name = format!(
        "fast_gemm_{}_{}{m}x{n}x{k}{}{}_{dt}_to_{ot}",
        epi.name(),
        batch.iter().map(|b| format!("{b}x")).collect::<String>(),
        if at { "_at" } else { "" },
        if bt { "_bt" } else { "" }
    );
    let mut g = Graph::new(name.clone());
    let adims: Vec<i64> = batch.iter().copied().chain([m, k]).collect();
    let a = g.tensor(if at { transposed("a", &adims, dt) } else { TensorDesc::new("a", &adims, dt) });
    let b = g.tensor(if bt { transposed("b", &[k, n], dt) } else { TensorDesc::new("b", &[k, n], dt) });
    let x = g.matmul(a, b);
    let full: Vec<i64> = batch.iter().copied().chain([m, n]).collect();
    let y = match epi {
        Epi::BiasRowRelu => {
            let bias = g.tensor(TensorDesc::new("bias", &[1, n], dt));
            let t = g.bias(x, bias);
            g.relu(t)
        }
        Epi::BiasColGelu => {
            let bias = g.tensor(TensorDesc::new("bias", &[m, 1], DataType::F32));
            let t = g.bias(x, bias);
            g.gelu(t)
        }
        Epi::Silu => g.pointwise(PointwiseMode::Swish { beta: 1.0 }, &[x]),
        Epi::Residual => {
            let r = g.tensor(transposed("residual", &full, dt));
            g.add(r, x)
        }
        Epi::Scale => {
            let s = g.scalar("s", 0.375);
            g.scale(x, s)
        }
        Epi::Chain4 => {
            let bias = g.tensor(TensorDesc::new("bias", &[n], dt));
            let t = g.bias(x, bias);
            let t = g.gelu(t);
            let s = g.scalar("s", -1.5);
            let t = g.scale(t, s);
            let r = g.tensor(TensorDesc::new("residual", &full, dt));
            g.add(t, r)
        }
        Epi::BiasColRelu => {
            let bias = g.tensor(TensorDesc::new("bias", &[m, 1], dt));
            let t = g.bias(x, bias);
            g.relu(t)
        }
        Epi::ScaleTensorBiasF32 => {
            let s = g.tensor(TensorDesc::new("s", &[1, 1], dt));
            let t = g.scale(x, s);
            let bias = g.tensor(TensorDesc::new("bias", &[1, n], DataType::F32));
            g.bias(t, bias)
        }
        Epi::BatchBiasResidual => {
            let bdims: Vec<i64> = batch.iter().copied().chain([1, n]).collect();
            let bias = g.tensor(TensorDesc::new("bias", &bdims, dt));
            let t = g.bias(x, bias);
            let r = g.tensor(TensorDesc::new("residual", &full, dt));
            g.add(t, r)
        }
    };
    out(&mut g, y, "y", ot);
    Case::new(name, g)
}

pub(super) fn cases() -> Vec<Case> {
    use DataType::*;
    let t = TensorDesc::new;
    let mut v = Vec::new();
    // Sizes that are multiples of nothing, each type, row-major A and B.
    for dt in [Bf16, F16, F32] {
        for (m, n, k) in [(1, 7, 33), (7, 33, 130), (33, 130, 257), (130, 257, 7), (257, 1, 130)] {
            v.push(mm(&format!("{m}x{n}x{k}_{dt}"), t("a", &[m, k], dt), t("b", &[k, n], dt), dt));
        }
    }
    // Layouts: A and/or B column-major, aligned (cp.async of the MN-major tiles) and odd.
    for dt in [Bf16, F16, F32] {
        for (m, n, k) in [(130, 96, 72), (33, 130, 57)] {
            v.push(mm(&format!("at_{m}x{n}x{k}_{dt}"), transposed("a", &[m, k], dt), t("b", &[k, n], dt), dt));
            v.push(mm(&format!("bt_{m}x{n}x{k}_{dt}"), t("a", &[m, k], dt), transposed("b", &[k, n], dt), dt));
            v.push(mm(&format!("atbt_{m}x{n}x{k}_{dt}"), transposed("a", &[m, k], dt), transposed("b", &[k, n], dt), dt));
        }
    }
    // Padded rows: leading dims that break 16-byte alignment (scalar loads), and ones that keep it.
    v.push(mm("padded_a3_bf16", t("a", &[70, 64], Bf16).with_strides(&[67, 1]), t("b", &[64, 48], Bf16), Bf16));
    v.push(mm("padded_b5_f16", t("a", &[70, 64], F16), t("b", &[64, 48], F16).with_strides(&[53, 1]), F16));
    v.push(mm("padded_a8_b8_bf16", t("a", &[70, 64], Bf16).with_strides(&[72, 1]), t("b", &[64, 48], Bf16).with_strides(&[56, 1]), Bf16));
    v.push(mm("padded_f32", t("a", &[45, 33], F32).with_strides(&[40, 1]), transposed("b", &[33, 29], F32), F32));
    // Neither dim contiguous (a strided view): scalar loads.
    v.push(mm("strided_a_bf16", t("a", &[40, 24], Bf16).with_strides(&[2, 100]), t("b", &[24, 40], Bf16), Bf16));
    // Output layouts: column-major C, padded C.
    v.push(mm("c_col_major_bf16", t("a", &[2, 45, 40], Bf16), t("b", &[2, 40, 37], Bf16), Bf16).with_c_strides(&[45 * 37, 1, 45]));
    v.push(mm("c_padded_f16", t("a", &[45, 40], F16), t("b", &[40, 38], F16), F16).with_c_strides(&[41, 1]));
    // A weight gradient written transposed (dW^T = X^T dZ into column-major C), 117 tiles: the
    // Hopper kernel computes C^T = dZ^T X, whose rows are contiguous.
    v.push(mm("c_col_major_wgrad_1040x1552x1032_bf16", transposed("a", &[1040, 1032], Bf16), t("b", &[1032, 1552], Bf16), Bf16).with_c_strides(&[1, 1040]));
    v.push(mm("c_padded_odd_f32", t("a", &[45, 40], F32), t("b", &[40, 38], F32), F32).with_c_strides(&[39, 1]));
    // Batches: same batch, broadcast B, broadcast A through a stride-0 dim, ranks that differ,
    // and batch dims that do not flatten to one stride (falls back).
    v.push(mm("batch_bf16", t("a", &[3, 2, 33, 40], Bf16), t("b", &[3, 2, 40, 24], Bf16), Bf16));
    v.push(mm("batch_bcast_b_f16", t("a", &[4, 3, 65, 40], F16), t("b", &[40, 72], F16), F16));
    v.push(mm("batch_bcast_a_stride0_bf16", t("a", &[4, 65, 40], Bf16).with_strides(&[0, 40, 1]), transposed("b", &[4, 40, 72], Bf16), Bf16));
    v.push(mm("batch_bcast_a_rank_f32", t("a", &[65, 40], F32), t("b", &[6, 40, 24], F32), F32));
    v.push(mm("batch_no_flatten_bf16", t("a", &[2, 1, 33, 40], Bf16), t("b", &[1, 3, 40, 24], Bf16), Bf16));
    v.push(mm("batch64_32x32x16_bf16", t("a", &[64, 32, 16], Bf16), t("b", &[64, 16, 32], Bf16), Bf16));
    // fp8 inputs (converted to f16 on load; sm_89+), f32 / bf16 / fp8 outputs.
    v.push(mm("fp8_e4m3_to_f32", t("a", &[65, 96], Fp8E4m3), t("b", &[96, 40], Fp8E4m3), F32));
    v.push(mm("fp8_e5m2_e4m3_bt_to_f32", t("a", &[33, 57], Fp8E5m2), transposed("b", &[57, 70], Fp8E4m3), F32));
    v.push(mm("fp8_e4m3_at_to_bf16", transposed("a", &[64, 64], Fp8E4m3), t("b", &[64, 48], Fp8E4m3), Bf16));
    v.push(mm("fp8_e4m3_to_fp8", t("a", &[40, 64], Fp8E4m3), t("b", &[64, 48], Fp8E4m3), Fp8E4m3));
    // fp8 with both operands K-major and K a multiple of 16 (Hopper's wgmma k32 kernel): partial
    // tiles and k stages (K = 272: two stages of 128, the last partial), e4m3 x e5m2, batched
    // with B broadcast, more 128 x 256 tiles than SMs (TMA-store epilogue, bias + relu in the
    // conversion), split k (few tiles, long K).
    v.push(mm("fp8_wgmma_e4m3_bt_130x200x272_to_bf16", t("a", &[130, 272], Fp8E4m3), transposed("b", &[272, 200], Fp8E4m3), Bf16));
    v.push(mm("fp8_wgmma_e4m3_e5m2_bt_batch_3x72x136x96_to_f32", t("a", &[3, 72, 96], Fp8E4m3), transposed("b", &[96, 136], Fp8E5m2), F32));
    for (name, at, bt, (m, n, k), ot) in [
        ("big_tiles_e4m3_scale_bias_relu_1100x4000x272", Fp8E4m3, Fp8E4m3, (1100, 4000, 272), Bf16),
        ("e5m2_e4m3_scale_bias_relu_200x136x160", Fp8E5m2, Fp8E4m3, (200, 136, 160), F16),
    ] {
        // The dequantizing scale (by value) and a bf16 bias, as an fp8 GEMM's epilogue.
        let name = format!("fast_gemm_fp8_wgmma_{name}_to_{ot}");
        let mut g = Graph::new(name.clone());
        let a = g.tensor(t("a", &[m, k], at));
        let b = g.tensor(transposed("b", &[k, n], bt));
        let x = g.matmul(a, b);
        let sc = g.scalar("scale", 0.0625);
        let y = g.scale(x, sc);
        let bias = g.tensor(t("bias", &[1, n], Bf16));
        let y = g.bias(y, bias);
        let y = g.relu(y);
        out(&mut g, y, "y", ot);
        v.push(Case::new(name, g));
    }
    // Reductions of the GEMM's output over all its elements folded into the Hopper kernel's
    // epilogue (amax, max, min): the TMA-store path (bf16, the relu in the conversion, more tiles
    // than SMs), direct f32 stores, a batched f16 C reduced to bf16, and fp8 inputs whose scaled
    // f32 result (virtual: also cast to fp8 by the next node) gives its amax.
    // Along rows and columns too (per-row and per-column partials): sums and amax, batched.
    // `axis`: None for all, Some(1) along each row (y [.., m, 1]), Some(0) along each column.
    for (name, mode, axis, (batch, m, n, k), it, ct, rt) in [
        ("amax_bias_relu_big_tiles", ReductionMode::Amax, None, (1, 1100, 4000, 272), Bf16, Bf16, F32),
        ("max_bias_relu", ReductionMode::Max, None, (1, 200, 136, 72), Bf16, F32, F32),
        ("min_bias_relu_batch", ReductionMode::Min, None, (3, 72, 136, 64), F16, F16, Bf16),
        ("rowsum_bias_relu", ReductionMode::Add, Some(1), (1, 200, 136, 72), Bf16, Bf16, F32),
        ("rowamax_bias_relu_big_tiles_batch", ReductionMode::Amax, Some(1), (2, 640, 4000, 272), Bf16, Bf16, Bf16),
        ("colamax_bias_relu_big_tiles", ReductionMode::Amax, Some(0), (1, 1100, 4000, 272), Bf16, Bf16, F32),
        ("colsum_bias_relu_batch", ReductionMode::Add, Some(0), (3, 72, 136, 64), F16, F32, F32),
    ] {
        let name = format!("fast_gemm_tap_{name}_{}{m}x{n}x{k}_{it}_to_{ct}", if batch > 1 { format!("{batch}x") } else { String::new() });
        let mut g = Graph::new(name.clone());
        let lead: Vec<i64> = if batch > 1 { vec![batch] } else { vec![] };
        let a = g.tensor(t("a", &[lead.clone(), vec![m, k]].concat(), it));
        let b = g.tensor(t("b", &[k, n], it));
        let x = g.matmul(a, b);
        let bias = g.tensor(t("bias", &[1, n], it));
        let y = g.bias(x, bias);
        let y = g.relu(y);
        out(&mut g, y, "y", ct);
        let rank = lead.len() + 2;
        let axes: Vec<usize> = match axis {
            None => (0..rank).collect(),
            Some(a) => vec![rank - 2 + a],
        };
        let r = g.reduction(y, mode, &axes);
        out(&mut g, r, "r", rt);
        v.push(Case::new(name, g));
    }
    {
        let name = "fast_gemm_tap_fp8_wgmma_scaled_amax_cast_200x136x160".to_string();
        let mut g = Graph::new(name.clone());
        let a = g.tensor(t("a", &[200, 160], Fp8E4m3));
        let b = g.tensor(transposed("b", &[160, 136], Fp8E4m3));
        let x = g.matmul(a, b);
        let sc = g.scalar("descale", 0.25);
        let d = g.scale(x, sc);
        let amax = g.reduction(d, ReductionMode::Amax, &[0, 1]);
        out(&mut g, amax, "amax", F32);
        let y = g.pointwise(PointwiseMode::Identity, &[d]);
        out(&mut g, y, "y", Fp8E4m3);
        v.push(Case::new(name, g));
    }
    // Scaled operands (a' = x * s in f32, read by the matmul alone): the scales move into the
    // epilogue and the GEMM reads x: fp8 with per-tensor scales (a tensor and a by-value one; the
    // fp8 GEMM with its dequantizing scales), bf16 A with a scale per row, f16 B with a scale per
    // column, batched.
    for (name, (batch, m, n, k), xt, ct, sa, sb) in [
        ("fp8_scaled_operands_big_tiles", (1, 1100, 4000, 272), Fp8E4m3, Bf16, Some(vec![1, 1]), Some(vec![])),
        ("row_scaled_a", (1, 200, 136, 72), Bf16, F32, Some(vec![200, 1]), None),
        ("col_scaled_b_batch", (3, 72, 136, 64), F16, F16, None, Some(vec![1, 136])),
    ] {
        let name = format!("fast_gemm_prologue_{name}_{}{m}x{n}x{k}_{xt}_to_{ct}", if batch > 1 { format!("{batch}x") } else { String::new() });
        let mut g = Graph::new(name.clone());
        let lead: Vec<i64> = if batch > 1 { vec![batch] } else { vec![] };
        let a = g.tensor(t("a", &[lead.clone(), vec![m, k]].concat(), xt));
        let b = g.tensor(if xt.is_fp8() { transposed("b", &[k, n], xt) } else { t("b", &[k, n], xt) });
        let scaled = |g: &mut Graph, x, s: Option<Vec<i64>>, name: &'static str| match s {
            None => x,
            Some(dims) => {
                let s = if dims.is_empty() { g.scalar(name, 0.375) } else { g.tensor(TensorDesc::new(name, &dims, F32)) };
                let y = g.mul(x, s);
                g.desc_mut(y).data_type = Some(F32);
                y
            }
        };
        let a1 = scaled(&mut g, a, sa, "sa");
        let b1 = scaled(&mut g, b, sb, "sb");
        let x = g.matmul(a1, b1);
        let y = g.relu(x);
        out(&mut g, y, "y", ct);
        v.push(Case::new(name, g));
    }
    v.push(mm("fp8_wgmma_splitk_64x48x4096_e4m3_to_f32", t("a", &[64, 4096], Fp8E4m3), transposed("b", &[4096, 48], Fp8E4m3), F32));
    // Mixed input types, converted exactly on load: f16 x bf16 (tf32), f32 x bf16 (3xTF32),
    // fp8 x bf16 and fp8 x f16.
    v.push(mm("mixed_f16_bf16_to_f32", t("a", &[33, 72], F16), t("b", &[72, 40], Bf16), F32));
    v.push(mm("mixed_f32_bf16_to_f32", transposed("a", &[40, 57], F32), t("b", &[57, 33], Bf16), F32));
    v.push(mm("mixed_fp8_bf16_to_bf16", t("a", &[40, 64], Fp8E4m3), t("b", &[64, 48], Bf16), Bf16));
    v.push(mm("mixed_f16_fp8_e5m2_to_f16", t("a", &[40, 64], F16), transposed("b", &[64, 48], Fp8E5m2), F16));
    // Output casts from the matmul itself.
    v.push(mm("bf16_to_f32", t("a", &[70, 72], Bf16), t("b", &[72, 36], Bf16), F32));
    v.push(mm("f16_to_bf16", t("a", &[70, 72], F16), t("b", &[72, 36], F16), Bf16));
    v.push(mm("f32_to_f16", t("a", &[70, 72], F32), t("b", &[72, 36], F32), F16));
    // Epilogues.
    for epi in [Epi::BiasRowRelu, Epi::BiasColGelu, Epi::Silu, Epi::Residual, Epi::Scale, Epi::Chain4] {
        v.push(with_epi(epi, Bf16, Bf16, &[], (130, 96, 72), false, false));
        v.push(with_epi(epi, F16, F32, &[], (33, 130, 57), true, false));
        v.push(with_epi(epi, F32, F32, &[2], (33, 40, 65), false, true));
    }
    v.push(with_epi(Epi::BiasRowRelu, Bf16, F16, &[3], (40, 72, 64), false, false));
    v.push(with_epi(Epi::Chain4, Bf16, Bf16, &[2, 3], (17, 24, 40), true, true));
    v.push(with_epi(Epi::Residual, Fp8E4m3, Bf16, &[], (40, 48, 64), false, false));
    // Split-K: few tiles, long K (the reduce launch applies the epilogue).
    v.push(mm("splitk_64x64x4096_bf16", t("a", &[64, 4096], Bf16), t("b", &[4096, 64], Bf16), Bf16));
    v.push(mm("splitk_64x48x2048_f32", t("a", &[64, 2048], F32), transposed("b", &[2048, 48], F32), F32));
    v.push(mm("splitk_16x64x4096_bf16_to_f32", t("a", &[16, 4096], Bf16), t("b", &[4096, 64], Bf16), F32));
    v.push(mm("splitk_odd_33x31x1999_f16", t("a", &[33, 1999], F16), t("b", &[1999, 31], F16), F16));
    v.push(with_epi(Epi::BiasRowRelu, Bf16, Bf16, &[], (64, 64, 4096), false, false));
    v.push(with_epi(Epi::Chain4, F16, F32, &[2], (7, 40, 1500), false, true));
    // M <= 16 (the 16x128 tile), as in decoding.
    v.push(mm("decode_16x1000x256_bf16", t("a", &[16, 256], Bf16), transposed("b", &[256, 1000], Bf16), Bf16));
    v.push(mm("decode_5x300x130_f16", t("a", &[5, 130], F16), t("b", &[130, 300], F16), F16));
    // Decode with enough columns for the Hopper kernel to compute C^T (64 x 16 tiles for M <=
    // 16, 64 x 32 up to 32; N-major and K-major B; partial column tiles, k tails; epilogues
    // by row and by column of C, batched with a residual).
    v.push(mm("decode_ct_16x7424x136_bf16", t("a", &[16, 136], Bf16), t("b", &[136, 7424], Bf16), Bf16));
    v.push(with_epi(Epi::BiasRowRelu, Bf16, Bf16, &[], (20, 7441, 136), false, true));
    v.push(with_epi(Epi::BiasColGelu, F16, F16, &[], (13, 7432, 64), false, false));
    v.push(with_epi(Epi::Chain4, F16, F32, &[2], (9, 7424, 72), false, false));
    // 16-bit intermediates under a 16-bit output: the CPU rounds them, so the epilogue does.
    {
        let name = "fast_gemm_bf16_intermediates_bias_gelu_bf16".to_string();
        let mut g = Graph::new(name.clone()).intermediate_data_type(Bf16);
        let a = g.tensor(t("a", &[40, 72], Bf16));
        let b = g.tensor(t("b", &[72, 56], Bf16));
        let bias = g.tensor(t("bias", &[1, 56], Bf16));
        let x = g.matmul(a, b);
        let y = g.bias(x, bias);
        let y = g.gelu(y);
        out(&mut g, y, "y", Bf16);
        v.push(Case::new(name, g));
    }
    // Epilogue side inputs by layout on the Hopper kernel's paths (TMA store for 16-bit row-major
    // C, direct stores otherwise): per-row, scalar tensor, f32 per-column, per-batch bias rows and
    // row-major residuals (vector loads), odd N (scalar loads), partial edge tiles.
    for (dt, ot, batch, shape, bt) in [
        (Bf16, Bf16, &[][..], (200, 136, 72), false),
        (F16, F16, &[][..], (130, 97, 64), true),
        (Bf16, F32, &[][..], (72, 264, 136), false),
        (Bf16, Bf16, &[3][..], (40, 72, 64), false),
    ] {
        for epi in [Epi::BiasColRelu, Epi::ScaleTensorBiasF32, Epi::BatchBiasResidual] {
            v.push(with_epi(epi, dt, ot, batch, shape, false, bt));
        }
    }
    v.push(with_epi(Epi::Residual, Bf16, Bf16, &[], (200, 136, 72), false, false));
    v.push(with_epi(Epi::Chain4, F16, F16, &[2], (72, 130, 64), true, true));
    // BN 256 (at least one 128 x 256 tile per SM and K > 256): f32 bias columns fill the
    // epilogue's register budget (64), the residual is loaded in the loop.
    {
        let name = "fast_gemm_big_tiles_bias_f32_residual_1536x2816x264_bf16".to_string();
        let mut g = Graph::new(name.clone());
        let a = g.tensor(t("a", &[1536, 264], Bf16));
        let b = g.tensor(t("b", &[264, 2816], Bf16));
        let x = g.matmul(a, b);
        let bias = g.tensor(t("bias", &[1, 2816], F32));
        let y = g.bias(x, bias);
        let r = g.tensor(t("residual", &[1536, 2816], Bf16));
        let y = g.add(y, r);
        let y = g.relu(y);
        out(&mut g, y, "y", Bf16);
        v.push(Case::new(name, g));
    }
    // More tiles than an H100 has SMs with the TMA-store epilogue, so that CTAs go on to further
    // tiles and reuse their C block: 288 128 x 128 tiles (three rounds, the last partial) with
    // bias + relu, partial edge tiles; 160 batched 128 x 256 tiles.
    {
        let name = "fast_gemm_big_tiles_rounds_bias_relu_1100x4000x40_bf16".to_string();
        let mut g = Graph::new(name.clone());
        let a = g.tensor(t("a", &[1100, 40], Bf16));
        let b = g.tensor(t("b", &[40, 4000], Bf16));
        let x = g.matmul(a, b);
        let bias = g.tensor(t("bias", &[1, 4000], Bf16));
        let y = g.bias(x, bias);
        let y = g.relu(y);
        out(&mut g, y, "y", Bf16);
        v.push(Case::new(name, g));
    }
    v.push(mm("big_tiles_rounds_batch_2x1000x2400x296_f16", t("a", &[2, 1000, 296], F16), t("b", &[2, 296, 2400], F16), F16));
    // f32 inputs: the exact plan runs them as 3xTF32; the tf32 plan (knob `tf32`) on Hopper's
    // wgmma kernel when A is row-major with K a multiple of 4 (B N-major as C^T = B^T A^T with
    // B^T's tf32-rounded fragments loaded into registers, or, with N not a multiple of 4 or
    // few tiles, through a transposed copy in the workspace; B K-major directly), on mma.sync
    // otherwise.
    v.push(mm("tf32_200x136x72_f32", t("a", &[200, 72], F32), t("b", &[72, 136], F32), F32));
    v.push(mm("tf32_bt_130x200x136_f32", t("a", &[130, 136], F32), transposed("b", &[136, 200], F32), F32));
    v.push(mm("tf32_odd_n_72x97x64_f32_to_bf16", t("a", &[72, 64], F32), t("b", &[64, 97], F32), Bf16));
    v.push(mm("tf32_batch_bcast_b_3x72x100x64_f32", t("a", &[3, 72, 64], F32), t("b", &[64, 100], F32), F32));
    v.push(mm("tf32_batch_2x40x72x36_f32", t("a", &[2, 40, 36], F32), t("b", &[2, 36, 72], F32), F32));
    v.push(mm("tf32_splitk_64x48x4096_f32", t("a", &[64, 4096], F32), t("b", &[4096, 48], F32), F32));
    // C^T with B^T from registers: 31 k stages (the last partial), so that the two register
    // sets alternate unevenly; 255 tiles of 3 stages for 132 SMs, so that CTAs take a second
    // tile; both with partial edge tiles.
    v.push(mm("tf32_rs_big_tiles_1100x1000x980_f32", t("a", &[1100, 980], F32), t("b", &[980, 1000], F32), F32));
    v.push(mm("tf32_rs_big_tiles_1800x2100x68_f32_to_bf16", t("a", &[1800, 68], F32), t("b", &[68, 2100], F32), Bf16));
    v.push(with_epi(Epi::BiasRowRelu, F32, F32, &[], (200, 136, 72), false, false));
    v.push(with_epi(Epi::BatchBiasResidual, F32, Bf16, &[2], (72, 130, 40), false, false));
    // M <= 64 with 67 to 132 64-wide column tiles: the Hopper kernel's BN 64 (no split k), the
    // second consumer idle; TMA-store and direct-store epilogues.
    v.push(mm("bn64_16x4296x64_bf16", t("a", &[16, 64], Bf16), t("b", &[64, 4296], Bf16), Bf16));
    v.push(mm("bn64_33x4296x32_bf16_to_f32", t("a", &[33, 32], Bf16), transposed("b", &[32, 4296], Bf16), F32));
    v.push(with_epi(Epi::BiasRowRelu, Bf16, Bf16, &[], (40, 4296, 48), false, false));
    // The 128x128 tile needs at least one tile per SM (132 on an H100): 12 x 11 tiles.
    v.push(with_epi(Epi::BiasRowRelu, Bf16, Bf16, &[], (1536, 1408, 40), false, false));
    v.push(mm("big_tiles_1536x1408x24_at_f32", transposed("a", &[1536, 24], F32), t("b", &[24, 1408], F32), F32));
    // The Hopper kernel's split tail (with 132 SMs: one whole wave, and the few tiles of the
    // last split along k over the idle SMs; rows 16-byte aligned for TMA): 144 tiles of 128 x 128
    // over 33 k steps, 12 in 8 parts, bias + relu in the TMA-store epilogue; A column-major; a
    // batch of two to f32 (direct stores).
    v.push(with_epi(Epi::BiasRowRelu, Bf16, Bf16, &[], (1100, 2040, 2056), false, false));
    v.push(mm("streamk_at_1104x2048x2056_bf16", transposed("a", &[1104, 2056], Bf16), t("b", &[2056, 2048], Bf16), Bf16));
    v.push(mm("streamk_batch_2x1000x1104x2056_f16_to_f32", t("a", &[2, 1000, 2056], F16), t("b", &[2, 2056, 1104], F16), F32));
    // 8-bit integers (exact i32 sums on the integer mma): B stored n x k (K-major, cp.async),
    // B row-major (element loads into K-major tiles), odd sizes, u8 x i8, a batch, a long k
    // (split, i32 partials), stores to i32 / i8 (saturated) / f32, and cudnn-frontend's int8
    // sample: an i32 compute type, an f32 c, + an f32 bias.
    v.push(mm("int8_bt_200x136x160_i8", t("a", &[200, 160], I8), transposed("b", &[160, 136], I8), I32));
    v.push(mm("int8_33x130x257_i8", t("a", &[33, 257], I8), t("b", &[257, 130], I8), I32));
    v.push(mm("int8_bt_97x72x100_u8_i8", t("a", &[97, 100], U8), transposed("b", &[100, 72], I8), I32));
    v.push(mm("int8_bt_batch_3x40x72x64_i8", t("a", &[3, 40, 64], I8), transposed("b", &[3, 64, 72], I8), I32));
    v.push(mm("int8_bt_splitk_64x48x4096_i8", t("a", &[64, 4096], I8), transposed("b", &[4096, 48], I8), I32));
    v.push(mm("int8_bt_130x96x64_i8_to_i8", t("a", &[130, 64], I8), transposed("b", &[64, 96], I8), I8));
    v.push(mm("int8_bt_130x96x64_i8_to_f32", t("a", &[130, 64], I8), transposed("b", &[64, 96], I8), F32));
    // (On Hopper: the wgmma kernel, k steps of 128 with a zero-filled last one, edge tiles.)
    v.push(mm("int8_bt_280x520x528_u8_i8_to_bf16", t("a", &[280, 528], U8), transposed("b", &[528, 520], I8), Bf16));
    v.push(int8_bias("int8_frontend_bias_16x32x64x128", 16, (32, 64, 128)));
    v
}

/// cudnn-frontend's int8 matmul: `c = a [b, m, k] (i8) x b [b, k, n] (i8, stored n x k)` with an
/// i32 compute type and an f32 c, then `+ bias [b, m, n]` (f32).
fn int8_bias(name: &str, batch: i64, (m, n, k): (i64, i64, i64)) -> Case {
    let name = format!("fast_gemm_{name}");
    let mut g = Graph::new(name.clone());
    let a = g.tensor(TensorDesc::new("a", &[batch, m, k], DataType::I8));
    let b = g.tensor(transposed("b", &[batch, k, n], DataType::I8));
    let bias = g.tensor(TensorDesc::new("bias", &[batch, m, n], DataType::F32));
    let c = g.matmul(a, b);
    let mm = g.nodes.len() - 1;
    g.nodes[mm].compute_data_type = Some(DataType::I32);
    g.desc_mut(c).data_type = Some(DataType::F32);
    let y = g.add(c, bias);
    out(&mut g, y, "y", DataType::F32);
    Case::new(name, g)
}

trait WithC {
    fn with_c_strides(self, strides: &[i64]) -> Case;
}

impl WithC for Case {
    /// The case with C (the graph's only output) stored with these strides.
    fn with_c_strides(mut self, strides: &[i64]) -> Case {
        if let Some(id) = self.graph.output_tensors().first().copied() {
            self.graph.desc_mut(id).strides = strides.to_vec();
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::{random_inputs, run_cpu};

    #[test]
    fn gemm_cases_validate_and_run_on_the_cpu() {
        for c in super::cases() {
            let mut g = c.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", c.name));
            for id in g.io_tensors() {
                let n = g.desc(id).element_count();
                // (The decode cases with 7424 or more columns up to 1.1 million.)
                let limit = if c.name.contains("x74") { 1_100_000 } else { 300_000 };
                // (Shapes that must fill the 132 SMs of a Hopper GPU with tiles: the wide tiles, the
                // split tail's one whole wave plus a few tiles, a transposed-C weight gradient.)
                let big = ["big_tiles", "1536x1408", "streamk", "1100x2040x2056", "wgrad_1040"].iter().any(|s| c.name.contains(s));
                assert!(n <= limit || big, "{}: {} has {n} elements", c.name, g.desc(id).name);
            }
            run_cpu(&c.graph, &random_inputs(&g, 1)).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        }
    }
}
