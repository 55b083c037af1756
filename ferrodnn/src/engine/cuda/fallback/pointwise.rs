//! Pointwise ops: one thread per output element (grid-stride), inputs read with numpy
//! broadcasting, the mode's formula in double (`pointwise.cuh`, the formulas of
//! `pointwise/ops.cuh`), its attributes passed as parameters.

use super::{Ctx, Launch, NodeKernels};
use crate::dtype::DataType;
use crate::engine::cuda::kernel::{Signature, Source};
use crate::engine::cuda::pointwise::{self as ops, Form};
use crate::error::Result;
use crate::graph::ops::pointwise::PointwiseAttrs;

pub(super) fn pointwise(ctx: &Ctx, attrs: &PointwiseAttrs) -> Result<NodeKernels> {
    let y = ctx.output("y")?;
    let entry = ctx.entry("pointwise");
    let ports = [("a", "PW_HAS_A", "LD_A"), ("b", "PW_HAS_B", "LD_B"), ("c", "PW_HAS_C", "LD_C")].map(|(port, has, ld)| (port, has, ld, ctx.node.input(port)));
    let mut sig = Signature::new();
    sig.tensor("y", y, true);
    for &(port, _, _, t) in &ports {
        if let Some(t) = t {
            sig.tensor(&format!("p{port}"), t, false);
        }
    }
    // Attributes are `double` parameters `s<i>`, so that one kernel serves every value.
    let mut scalars = 0;
    let formula = ops::call(attrs.mode, ["a", "b", "c"], Form::Reference, true, &mut |v| {
        let name = format!("s{scalars}");
        scalars += 1;
        sig.f64(&name, v);
        name
    });
    // The CPU engine rounds each input to the compute type before applying the formula.
    let mut src = Source::new().entry(&entry, &sig).flag("PW_ROUND_F32", ctx.graph.compute_type(ctx.node) != DataType::F64);
    for (_, has, ld, t) in ports {
        src = src.flag(has, t.is_some());
        if let Some(t) = t {
            src = src.define(ld, ctx.ld(t));
        }
    }
    let source = src.define("PW_FORMULA", formula).define("ST_Y", ctx.st(y)).template(ops::OPS).template(include_str!("pointwise.cuh")).build();
    Ok(NodeKernels::one(Launch::elementwise(source, &entry, ctx.numel(y), sig.into_args())))
}
