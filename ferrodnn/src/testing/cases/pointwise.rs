//! Pointwise cases: every mode, broadcasting, transposed and padded strides, every type family.

use super::Case;
use crate::graph::ops::pointwise::PointwiseMode;
use crate::{DataType, Graph, TensorDesc};

/// One graph for one mode: inputs [5, 1, 7] (padded strides), [3, 1] and [5, 3, 7] (transposed)
/// broadcast to [5, 3, 7], output in a permuted layout.
fn mode_case(mode: PointwiseMode, dt: DataType, out_dt: Option<DataType>) -> Case {
    let mut g = Graph::new(format!("pw_{}_{dt}", mode.name())).io_data_type(dt);
    let full = TensorDesc::new("c", &[5, 3, 7], dt).with_layout(&[2, 1, 0]);
    let inputs = match mode.arity() {
        // Unary modes read the transposed full-shape input (gen_index takes its shape from it).
        1 => vec![g.tensor(full)],
        n => {
            let a = g.tensor(TensorDesc::new("a", &[5, 1, 7], dt).with_strides(&[16, 7, 2]));
            let b = g.tensor(TensorDesc::new("b", &[3, 1], dt));
            if n == 2 {
                vec![a, b]
            } else {
                vec![a, b, g.tensor(full)]
            }
        }
    };
    let y = g.pointwise(mode, &inputs);
    g.set_output(y);
    g.desc_mut(y).name = "y".into();
    if let Some(o) = out_dt {
        g.desc_mut(y).data_type = Some(o);
    }
    Case::new(format!("{}_{dt}", mode.name()), g)
}

pub(super) fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for mode in PointwiseMode::all() {
        let float_types: &[DataType] =
            if mode.is_predicate() || matches!(mode, PointwiseMode::GenIndex { .. }) { &[DataType::F32] } else { &[DataType::F32, DataType::F16, DataType::Bf16, DataType::F64] };
        for &dt in float_types {
            v.push(mode_case(mode, dt, None));
        }
    }
    // Integer, boolean and fp8 storage.
    for mode in [PointwiseMode::Add, PointwiseMode::Mul, PointwiseMode::Max, PointwiseMode::Sub] {
        v.push(mode_case(mode, DataType::I32, None));
        v.push(mode_case(mode, DataType::I8, None));
        v.push(mode_case(mode, DataType::U8, None));
        v.push(mode_case(mode, DataType::I64, None));
        v.push(mode_case(mode, DataType::Fp8E4m3, None));
        v.push(mode_case(mode, DataType::Fp8E5m2, Some(DataType::F32)));
    }
    for mode in [PointwiseMode::LogicalAnd, PointwiseMode::LogicalOr, PointwiseMode::LogicalNot] {
        v.push(mode_case(mode, DataType::Bool, None));
    }
    // Casts through identity, saturating into small types.
    for (from, to) in
        [(DataType::F32, DataType::Fp8E4m3), (DataType::F32, DataType::I8), (DataType::F16, DataType::Bool), (DataType::Bf16, DataType::F16), (DataType::F64, DataType::Bf16)]
    {
        let mut c = mode_case(PointwiseMode::Identity, from, Some(to));
        c.name = format!("identity_{from}_to_{to}");
        v.push(c);
    }
    v
}
