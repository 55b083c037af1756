//! rng cases: uniform and Bernoulli into float, bool and integer outputs, packed and
//! transposed/padded strides, seeds by value (with high words set) and as tensors.

use super::Case;
use crate::graph::ops::rng::Distribution;
use crate::{DataType, Graph, TensorDesc};

#[derive(Clone, Copy)]
enum Strides {
    Packed,
    Transposed,
    Padded,
}

fn case(name: &str, dims: &[i64], dist: Distribution, out: DataType, strides: Strides, seeds_by_value: bool) -> Case {
    let mut g = Graph::new(format!("rng_{name}"));
    let (seed, offset) = if seeds_by_value {
        // High words set: seed 2^40 + 37, offset -5 (all ones in the high word).
        (g.tensor(TensorDesc::scalar("seed", 1_099_511_627_813.0, DataType::I64)), g.tensor(TensorDesc::scalar("offset", -5.0, DataType::I64)))
    } else {
        (g.tensor(TensorDesc::new("seed", &[1], DataType::I64)), g.tensor(TensorDesc::new("offset", &[1, 1], DataType::I32)))
    };
    let y = g.rng(seed, offset, dims, dist);
    let d = g.desc_mut(y);
    d.name = "y".into();
    d.data_type = Some(out);
    match strides {
        Strides::Packed => {}
        Strides::Transposed => {
            let order: Vec<usize> = (0..dims.len()).rev().collect();
            d.strides = TensorDesc::new("y", dims, out).with_layout(&order).strides;
        }
        Strides::Padded => {
            let mut s = vec![0i64; dims.len()];
            let mut acc = 1;
            for a in (0..dims.len()).rev() {
                s[a] = acc;
                acc *= dims[a] + 2;
            }
            d.strides = s;
        }
    }
    g.set_output(y);
    Case::new(format!("rng_{name}"), g)
}

pub(super) fn cases() -> Vec<Case> {
    use DataType::*;
    use Strides::*;
    let uniform = Distribution::Uniform { low: -1.5, high: 2.25 };
    let bern = Distribution::Bernoulli { probability: 0.3 };
    let mut v = Vec::new();
    for dt in [F32, F16, Bf16, F64] {
        v.push(case(&format!("uniform_{dt}"), &[3, 5, 7], uniform, dt, Packed, true));
    }
    v.push(case("uniform_f32_transposed", &[5, 7, 3], uniform, F32, Transposed, true));
    v.push(case("uniform_f16_padded_seed_tensors", &[7, 13], Distribution::Uniform { low: 0.0, high: 1.0 }, F16, Padded, false));
    v.push(case("uniform_f64_1d_seed_tensors", &[257], uniform, F64, Packed, false));
    v.push(case("bernoulli_f32", &[3, 5, 7], bern, F32, Packed, true));
    v.push(case("bernoulli_f16_transposed", &[4, 9, 5], bern, F16, Transposed, false));
    v.push(case("bernoulli_bool", &[11, 13], bern, Bool, Packed, true));
    v.push(case("bernoulli_bool_transposed", &[13, 3, 7], Distribution::Bernoulli { probability: 0.75 }, Bool, Transposed, false));
    v.push(case("bernoulli_i32_padded", &[5, 9], bern, I32, Padded, true));
    v.push(case("bernoulli_p0_u8", &[6, 5], Distribution::Bernoulli { probability: 0.0 }, U8, Packed, true));
    v.push(case("bernoulli_p1_f32", &[6, 5], Distribution::Bernoulli { probability: 1.0 }, F32, Transposed, true));
    v
}
