//! Matmul cases: odd m, n, k; batched; batch broadcast across ranks, over size-1 dims and
//! through stride-0 batch dims; transposed and padded A/B; column-major C; f32, f16, bf16, f64,
//! fp8 (writing f32) and integer (i8 x i8 -> i32, i32 x i64 -> i64) inputs.

use super::Case;
use crate::{DataType, Graph, TensorDesc};

/// `a` and `b` given as descriptors (named "a", "b"); `c_type` and `c_strides` override C.
fn case(what: &str, a: TensorDesc, b: TensorDesc, c_type: Option<DataType>, c_strides: Option<&[i64]>) -> Case {
    let name = format!("matmul_{what}");
    let mut g = Graph::new(name.clone());
    let (at, bt) = (g.tensor(a), g.tensor(b));
    let c = g.matmul(at, bt);
    g.set_output(c);
    g.desc_mut(c).name = "c".into();
    if let Some(t) = c_type {
        g.desc_mut(c).data_type = Some(t);
    }
    if let Some(s) = c_strides {
        g.desc_mut(c).strides = s.to_vec();
    }
    Case::new(name, g)
}

/// A `[..., rows, cols]` tensor stored transposed (its last two dims swapped in memory).
fn transposed(name: &str, dims: &[i64], dt: DataType) -> TensorDesc {
    let r = dims.len();
    let mut order: Vec<usize> = (0..r).collect();
    order.swap(r - 2, r - 1);
    TensorDesc::new(name, dims, dt).with_layout(&order)
}

pub(super) fn cases() -> Vec<Case> {
    use DataType::*;
    let t = TensorDesc::new;
    let mut v = Vec::new();
    for dt in [F32, F16, Bf16, F64] {
        v.push(case(&format!("odd_{dt}"), t("a", &[5, 7], dt), t("b", &[7, 3], dt), None, None));
        v.push(case(&format!("batched_{dt}"), t("a", &[3, 5, 13], dt), t("b", &[3, 13, 7], dt), None, None));
        v.push(case(&format!("transposed_ab_{dt}"), transposed("a", &[3, 5, 7], dt), transposed("b", &[3, 7, 6], dt), None, None));
    }
    // Broadcast: different ranks, size-1 dims on either side, stride-0 batch dims.
    v.push(case("bcast_rank_bf16", t("a", &[2, 3, 5, 7], Bf16), t("b", &[7, 9], Bf16), None, None));
    v.push(case("bcast_rank_b_f32", t("a", &[13, 3], F32), transposed("b", &[2, 3, 3, 5], F32), None, None));
    v.push(case("bcast_ones_f32", t("a", &[2, 1, 5, 7], F32), t("b", &[1, 3, 7, 6], F32), None, None));
    v.push(case("bcast_stride0_f16", t("a", &[4, 5, 7], F16).with_strides(&[0, 7, 1]), t("b", &[4, 7, 3], F16), None, None));
    v.push(case("bcast_stride0_both_f64", t("a", &[3, 2, 5, 7], F64).with_strides(&[0, 35, 7, 1]), t("b", &[3, 1, 7, 5], F64).with_strides(&[35, 0, 5, 1]), None, None));
    // Padded (non-contiguous) inputs and a column-major output.
    v.push(case("padded_f32", t("a", &[3, 5, 7], F32).with_strides(&[50, 10, 1]), t("b", &[7, 11], F32).with_strides(&[13, 1]), None, None));
    v.push(case("c_col_major_f32", t("a", &[2, 5, 7], F32), t("b", &[2, 7, 9], F32), None, Some(&[45, 1, 5])));
    v.push(case("bf16_to_f32", transposed("a", &[5, 13], Bf16), t("b", &[13, 6], Bf16), Some(F32), None));
    v.push(case("mixed_f16_bf16", t("a", &[2, 5, 7], F16), t("b", &[7, 3], Bf16), None, None));
    // fp8 in, f32 out (and fp8 out).
    v.push(case("fp8_e4m3", t("a", &[3, 5, 17], Fp8E4m3), t("b", &[17, 7], Fp8E4m3), None, None));
    v.push(case("fp8_e5m2_e4m3", t("a", &[5, 9], Fp8E5m2), transposed("b", &[9, 7], Fp8E4m3), None, None));
    v.push(case("fp8_out_bf16", t("a", &[5, 9], Fp8E4m3), t("b", &[9, 7], Fp8E4m3), Some(Bf16), None));
    // Integers.
    v.push(case("i8", t("a", &[3, 5, 17], I8), t("b", &[17, 7], I8), None, None));
    v.push(case("i8_transposed_b", t("a", &[2, 7, 33], I8), transposed("b", &[2, 33, 5], I8), None, None));
    v.push(case("u8_i8", t("a", &[5, 11], U8), t("b", &[11, 3], I8), None, None));
    v.push(case("i32_i64", t("a", &[5, 11], I32), t("b", &[11, 3], I64), None, None));
    // Compute types other than the default: inputs rounded to f16 or fp8, or not rounded (i32
    // compute on i32 inputs).
    for (what, a, b, ct) in [
        ("compute_f16_f32", t("a", &[5, 13], F32), t("b", &[13, 6], F32), F16),
        ("compute_fp8_e4m3_f32", t("a", &[5, 13], F32), t("b", &[13, 6], F32), Fp8E4m3),
        ("compute_i32_i32", t("a", &[5, 13], I32), t("b", &[13, 6], I32), I32),
    ] {
        let mut c = case(what, a, b, None, None);
        c.graph.nodes[0].compute_data_type = Some(ct);
        v.push(c);
    }
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn matmul_cases_validate_and_run_on_cpu() {
        for c in super::cases() {
            let mut g = c.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", c.name));
            let inputs = crate::testing::random_inputs(&g, 1);
            crate::testing::run_cpu(&g, &inputs).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        }
    }
}
