//! Reduction cases: every mode over several axis sets (last axis, several axes, all axes, none),
//! row-major, transposed and padded strides; float types, i32 for the modes that keep integers
//! and bool for min/max/amax; groups large enough for the block path (one and several chunks).

use super::Case;
use crate::graph::ops::reduction::ReductionMode;
use crate::{DataType, Graph, TensorDesc};

const MODES: [ReductionMode; 9] = [
    ReductionMode::Add,
    ReductionMode::Mul,
    ReductionMode::Min,
    ReductionMode::Max,
    ReductionMode::Amax,
    ReductionMode::Avg,
    ReductionMode::Norm1,
    ReductionMode::Norm2,
    ReductionMode::MulNoZeros,
];

/// Input shapes and layouts.
#[derive(Clone, Copy)]
enum Shape {
    /// [5, 6, 7] row-major.
    Plain,
    /// [5, 6, 7] stored as [7, 5, 6] (dim 2 outermost).
    Transposed,
    /// [3, 5, 4, 7] with padded strides.
    Padded,
    /// [13, 37, 41], large enough for the block path.
    Big,
    /// [2, 100, 100] with dim 0 innermost, large enough for several chunks per output.
    Wide,
}

fn x_desc(shape: Shape, dt: DataType) -> TensorDesc {
    match shape {
        Shape::Plain => TensorDesc::new("x", &[5, 6, 7], dt),
        Shape::Transposed => TensorDesc::new("x", &[5, 6, 7], dt).with_layout(&[2, 0, 1]),
        Shape::Padded => TensorDesc::new("x", &[3, 5, 4, 7], dt).with_strides(&[250, 48, 9, 1]),
        Shape::Big => TensorDesc::new("x", &[13, 37, 41], dt),
        Shape::Wide => TensorDesc::new("x", &[2, 100, 100], dt).with_layout(&[1, 2, 0]),
    }
}

fn case(mode: ReductionMode, shape: Shape, axes: &[usize], dt: DataType, out_dt: Option<DataType>, what: &str) -> Case {
    let name = format!("reduction_{}_{what}_{dt}", mode.name());
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let x = g.tensor(x_desc(shape, dt));
    let y = g.reduction(x, mode, axes);
    g.set_output(y);
    g.desc_mut(y).name = "y".into();
    if let Some(o) = out_dt {
        g.desc_mut(y).data_type = Some(o);
    }
    Case::new(name, g)
}

pub(super) fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    let keeps_integers = |m: ReductionMode| !matches!(m, ReductionMode::Avg | ReductionMode::Norm2);
    for mode in MODES {
        // f32: every axis set and layout, both launch shapes.
        v.push(case(mode, Shape::Plain, &[2], DataType::F32, None, "last"));
        v.push(case(mode, Shape::Transposed, &[0, 2], DataType::F32, None, "axes02_transposed"));
        v.push(case(mode, Shape::Padded, &[1, 3], DataType::F32, None, "axes13_padded"));
        v.push(case(mode, Shape::Big, &[0, 1, 2], DataType::F32, None, "all_block"));
        v.push(case(mode, Shape::Wide, &[1, 2], DataType::F32, None, "axes12_chunks"));
        // Other float types.
        for dt in [DataType::F16, DataType::Bf16, DataType::F64] {
            v.push(case(mode, Shape::Transposed, &[0, 2], dt, None, "axes02_transposed"));
        }
        v.push(case(mode, Shape::Big, &[1, 2], DataType::F64, None, "axes12_block"));
        if keeps_integers(mode) {
            v.push(case(mode, Shape::Plain, &[1], DataType::I32, None, "axis1"));
            v.push(case(mode, Shape::Wide, &[1, 2], DataType::I32, None, "axes12_chunks"));
        }
    }
    for mode in [ReductionMode::Min, ReductionMode::Max, ReductionMode::Amax] {
        v.push(case(mode, Shape::Transposed, &[0, 2], DataType::Bool, None, "axes02_transposed"));
    }
    // No axes (an elementwise map), the first axis only, and wider output types.
    for mode in [ReductionMode::Add, ReductionMode::Avg, ReductionMode::Norm1, ReductionMode::Amax] {
        v.push(case(mode, Shape::Padded, &[], DataType::F32, None, "no_axes"));
    }
    v.push(case(ReductionMode::Add, Shape::Padded, &[0], DataType::Bf16, Some(DataType::F32), "axis0_to_f32"));
    v.push(case(ReductionMode::Norm2, Shape::Big, &[0, 2], DataType::F16, Some(DataType::F32), "axes02_to_f32"));
    v
}

#[cfg(test)]
mod tests {
    use crate::testing::{random_inputs, run_cpu};

    #[test]
    fn reduction_cases_validate_and_run_on_the_cpu() {
        for c in super::cases() {
            let mut g = c.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", c.name));
            run_cpu(&c.graph, &random_inputs(&g, 1)).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        }
    }
}
