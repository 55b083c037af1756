//! Tensor transforms: one thread per output element (grid-stride), each computing where its
//! source element lives and copying it with the input's `ld_` and the output's `st_` (which
//! is the cast, rounding and saturating as the CPU engine does). Threads walk the output in
//! its memory order (outermost stride first), so consecutive threads write consecutive
//! addresses of a packed output whatever its layout.

use super::{Arg, Ctx, Launch, NodeKernels};
use crate::error::Result;
use crate::graph::ops::transform::*;
use crate::graph::stride_order;
use crate::graph::TensorId;

/// Most inputs one concatenate launch takes: 16 x (pointer + TRef) keeps the kernel's
/// parameters under the 4 KiB every driver accepts; more inputs take more launches.
const CONCAT_GROUP: usize = 16;

/// C statements that set `i64 idx[8]` to the output multi-index of the `flat`-th element in
/// `ty`'s memory order (outermost stride first).
fn unravel_in_memory_order(ctx: &Ctx, y: TensorId, flat: &str) -> String {
    let order = stride_order(&ctx.graph.desc(y).strides);
    let identity = order.iter().enumerate().all(|(i, &a)| i == a);
    if identity {
        return format!("        i64 idx[8];\n        unravel(ty, {flat}, idx);\n");
    }
    let mut s = format!("        i64 idx[8];\n        i64 rest = {flat};\n");
    for &a in order.iter().rev() {
        s += &format!("        idx[{a}] = rest % ty.dims[{a}]; rest /= ty.dims[{a}];\n");
    }
    s
}

/// A kernel `y[idx] = x[<x offset>]` over y's elements.
fn gather_kernel(ctx: &Ctx, what: &str, x: TensorId, y: TensorId, x_offset: &str) -> NodeKernels {
    let entry = ctx.entry(what);
    let source = format!(
        r#"
extern "C" __global__ void {entry}(void* y, TRef ty, const void* x, TRef tx) {{
    i64 n = numel(ty);
    GRID_STRIDE(i, n) {{
{unravel}        i64 xo = {x_offset};
        {st}(y, offset_at(ty, idx), {ld}(x, xo));
    }}
}}
"#,
        unravel = unravel_in_memory_order(ctx, y, "i"),
        st = ctx.st(y),
        ld = ctx.ld(x),
    );
    NodeKernels::one(Launch::elementwise(source, &entry, ctx.numel(y), vec![Arg::Ptr(y), Arg::Ref(y), Arg::Ptr(x), Arg::Ref(x)]))
}

/// Same element count, read in logical row-major order: the output element at multi-index
/// `idx` is x's element at the same row-major flat index.
pub(super) fn reshape(ctx: &Ctx, _a: &ReshapeAttrs) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let y = ctx.output("y")?;
    if ctx.numel(x) != ctx.numel(y) {
        return Err(ctx.err(format!("internal: reshape of {} elements to {} elements", ctx.numel(x), ctx.numel(y))));
    }
    // The row-major flat index of idx in y's dims.
    let rank = ctx.dims(y).len();
    let mut flat = String::from("0");
    for a in 0..rank {
        flat = format!("({flat}) * ty.dims[{a}] + idx[{a}]");
    }
    Ok(gather_kernel(ctx, "reshape", x, y, &format!("offset_of(tx, {flat})")))
}

/// `y[i_0, ..., i_{r-1}] = x[j]` with `j[perm[k]] = i_k`.
pub(super) fn transpose(ctx: &Ctx, a: &TransposeAttrs) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let y = ctx.output("y")?;
    let (xd, yd) = (ctx.dims(x), ctx.dims(y));
    let perm = &a.permutation;
    let ok = perm.len() == xd.len() && yd.len() == xd.len() && perm.iter().enumerate().all(|(i, &p)| p < xd.len() && xd[p] == yd[i]);
    if !ok {
        return Err(ctx.err(format!("internal: permutation {perm:?} does not map x dims {xd:?} to y dims {yd:?}")));
    }
    let terms: Vec<String> = perm.iter().enumerate().map(|(k, &p)| format!("idx[{k}] * tx.strides[{p}]")).collect();
    let off = if terms.is_empty() { "0".to_string() } else { terms.join(" + ") };
    Ok(gather_kernel(ctx, "transpose", x, y, &off))
}

/// `y[i] = x[start + step * i]` on every axis.
pub(super) fn slice(ctx: &Ctx, a: &SliceAttrs) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let y = ctx.output("y")?;
    let (xd, yd) = (ctx.dims(x), ctx.dims(y));
    let rank = xd.len();
    let starts: Vec<i64> = a.starts.iter().map(|&s| s.max(0)).collect();
    let steps: Vec<i64> = (0..rank).map(|i| a.steps.get(i).copied().unwrap_or(1).max(1)).collect();
    let ok = starts.len() == rank && yd.len() == rank && (0..rank).all(|i| yd[i] >= 1 && starts[i] + (yd[i] - 1) * steps[i] < xd[i]);
    if !ok {
        return Err(ctx.err(format!("internal: slice {a:?} of x dims {xd:?} does not give y dims {yd:?}")));
    }
    let terms: Vec<String> = (0..rank).map(|i| format!("({}LL + {}LL * idx[{i}]) * tx.strides[{i}]", starts[i], steps[i])).collect();
    let off = if terms.is_empty() { "0".to_string() } else { terms.join(" + ") };
    Ok(gather_kernel(ctx, "slice", x, y, &off))
}

/// Join along `axis`. Each launch covers the output elements of up to [`CONCAT_GROUP`]
/// consecutive inputs (one launch for most graphs): a thread unravels its element in the
/// group's slab of y, then an if-chain on the axis coordinate picks the input that owns it.
pub(super) fn concatenate(ctx: &Ctx, a: &ConcatenateAttrs) -> Result<NodeKernels> {
    let y = ctx.output("y")?;
    let yd = ctx.dims(y);
    let axis = a.axis;
    let n = ctx.node.inputs.len();
    let mut xs = Vec::with_capacity(n);
    for i in 0..n {
        xs.push(ctx.input(&concat_port(i))?);
    }
    // Check the shapes as the CPU does, and find where each input starts on the axis.
    let mut at = 0i64;
    let mut starts = Vec::with_capacity(n);
    for &x in &xs {
        let xd = ctx.dims(x);
        let fits = xd.len() == yd.len() && axis < yd.len() && (0..yd.len()).all(|d| d == axis || xd[d] == yd[d]);
        if !fits {
            return Err(ctx.err(format!("internal: input dims {xd:?} do not fit output dims {yd:?} on axis {axis}")));
        }
        starts.push(at);
        at += xd[axis];
    }
    if n == 0 || at != yd[axis] {
        return Err(ctx.err(format!("internal: inputs add up to {at} on axis {axis} but the output has dims {yd:?}")));
    }
    let st = ctx.st(y);
    let mut launches = Vec::new();
    for (g, group) in xs.chunks(CONCAT_GROUP).enumerate() {
        let first = g * CONCAT_GROUP;
        let entry = ctx.entry(&format!("concat{g}"));
        let mut params = vec!["void* y".to_string(), "TRef ty".to_string(), "long long base".to_string()];
        let mut args = vec![Arg::Ptr(y), Arg::Ref(y), Arg::I64(starts[first])];
        // The group's extent on the axis, summed from the inputs' TRefs at run time.
        let mut extent = Vec::new();
        let mut chain = String::new();
        for (j, &x) in group.iter().enumerate() {
            params.push(format!("const void* x{j}"));
            params.push(format!("TRef t{j}"));
            args.push(Arg::Ptr(x));
            args.push(Arg::Ref(x));
            extent.push(format!("t{j}.dims[{axis}]"));
            let read = format!("{{ i64 o = 0; for (int a = 0; a < t{j}.rank; ++a) o += (a == {axis} ? c : idx[a]) * t{j}.strides[a]; v = {ld}(x{j}, o); }}", ld = ctx.ld(x));
            if j + 1 == group.len() {
                chain += &format!("        {read}\n");
            } else {
                chain += &format!("        if (c < t{j}.dims[{axis}]) {read}\n        else {{ c -= t{j}.dims[{axis}];\n");
            }
        }
        chain += &format!("        {}\n", "}".repeat(group.len() - 1));
        let threads: u64 = yd.iter().enumerate().map(|(d, &v)| if d == axis { group.iter().map(|&x| ctx.dims(x)[axis]).sum::<i64>() } else { v }).product::<i64>().max(0) as u64;
        let source = format!(
            r#"
extern "C" __global__ void {entry}({params}) {{
    // The group's slab of y: y's dims with the axis cut to the group's inputs.
    TRef ts = ty;
    ts.dims[{axis}] = {extent};
    i64 n = numel(ts);
    GRID_STRIDE(i, n) {{
        i64 idx[8];
        unravel(ts, i, idx);
        i64 c = idx[{axis}];
        double v = 0.0;
{chain}        idx[{axis}] += base;
        {st}(y, offset_at(ty, idx), v);
    }}
}}
"#,
            params = params.join(", "),
            extent = extent.join(" + "),
        );
        launches.push(Launch::elementwise(source, &entry, threads, args));
    }
    Ok(NodeKernels { launches, scratch: Vec::new() })
}

/// Same dims: the values pass through, cast to y's type and stored with y's strides.
pub(super) fn copy(ctx: &Ctx, _a: &CopyAttrs) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let y = ctx.output("y")?;
    if ctx.dims(x) != ctx.dims(y) {
        return Err(ctx.err(format!("internal: copy of dims {:?} to dims {:?}", ctx.dims(x), ctx.dims(y))));
    }
    Ok(gather_kernel(ctx, "copy", x, y, "offset_at(tx, idx)"))
}
