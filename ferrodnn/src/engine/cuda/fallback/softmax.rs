//! Softmax, log-softmax (with the optional log-sum-exp `stats`) and their backward, in double.
//!
//! A tensor normalized over `axis` is a set of rows: row `r` runs the row-major order of the
//! other dims (as the CPU's `outer * inner` rows), and its elements are `len` apart by the
//! axis's stride. Short rows: one thread per row, serial passes in the CPU's order. Long rows:
//! one block per row (block-strided over rows), each pass a strided loop plus a shared-memory
//! tree (maximum, then sum).

use super::{Arg, Ctx, Grid, Launch, NodeKernels, Pdl};
use crate::error::Result;
use crate::graph::ops::softmax::SoftmaxAttrs;
use crate::graph::TensorId;

/// Rows longer than this get a block each.
const SHORT_ROW: i64 = 64;

/// `row_base(t, r)`: the offset of the first element of row `r` of `t` (the axis skipped), and
/// the block tree reduction.
fn helpers(axis: usize) -> String {
    format!(
        r#"
#define SM_AXIS {axis}
__device__ __forceinline__ i64 row_base(const TRef& t, i64 r) {{
    i64 off = 0;
    for (int a = t.rank - 1; a >= 0; --a) {{
        if (a == SM_AXIS) continue;
        off += (r % t.dims[a]) * t.strides[a];
        r /= t.dims[a];
    }}
    return off;
}}
__device__ __forceinline__ i64 row_count(const TRef& t) {{ return t.dims[SM_AXIS] > 0 ? numel(t) / t.dims[SM_AXIS] : 0; }}
// Tree reduction over the block (blockDim.x a power of two); every thread gets the result.
__device__ double block_reduce(double v, double* sh, bool is_max) {{
    int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {{
        if (t < w) sh[t] = is_max ? fmax(sh[t], sh[t + w]) : sh[t] + sh[t + w];
        __syncthreads();
    }}
    double r = sh[0];
    __syncthreads();
    return r;
}}
"#
    )
}

/// The block size for rows of `len` (a power of two).
fn block_for(len: i64) -> u32 {
    if len <= 512 {
        128
    } else {
        256
    }
}

/// A launch: thread per row (grid-stride) for short rows, else block per row.
fn launch(source: String, entry: &str, rows: u64, len: i64, args: Vec<Arg>) -> Launch {
    if len <= SHORT_ROW {
        Launch::elementwise(source, entry, rows, args)
    } else {
        let block = block_for(len);
        let grid = rows.clamp(1, 1 << 20) as u32;
        Launch { source, entry: entry.to_string(), grid: Grid::Exact(grid, 1, 1), block, shared_bytes: 0, args, cluster: None, pdl: Pdl::Dependent }
    }
}

fn axis_len(ctx: &Ctx, t: TensorId, axis: usize) -> Result<i64> {
    let d = ctx.dims(t);
    if axis >= d.len() || d.len() > 8 {
        return Err(ctx.err(format!("axis {axis} is out of range for rank {}", d.len())));
    }
    Ok(d[axis])
}

pub(super) fn softmax(ctx: &Ctx, a: &SoftmaxAttrs) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let y = ctx.output("y")?;
    let stats = ctx.node.output("stats");
    let len = axis_len(ctx, x, a.axis)?;
    let rows = if len > 0 { ctx.numel(x) / len as u64 } else { 0 };
    let entry = ctx.entry("softmax");
    let (ldx, sty) = (ctx.ld(x), ctx.st(y));
    let out = if a.log { "v - lse" } else { "exp(v - lse)" };
    let mut params = "void* y, TRef ty, const void* x, TRef tx".to_string();
    let mut args = vec![Arg::Ptr(y), Arg::Ref(y), Arg::Ptr(x), Arg::Ref(x)];
    let mut store_stats = String::new();
    if let Some(s) = stats {
        params += ", void* st, TRef tst";
        args.push(Arg::Ptr(s));
        args.push(Arg::Ref(s));
        store_stats = format!("{}(st, row_base(tst, r), lse);", ctx.st(s));
    }
    let helpers = helpers(a.axis);
    let source = if len <= SHORT_ROW {
        format!(
            r#"{helpers}
extern "C" __global__ void {entry}({params}) {{
    i64 len = tx.dims[SM_AXIS], sx = tx.strides[SM_AXIS], sy = ty.strides[SM_AXIS];
    GRID_STRIDE(r, row_count(tx)) {{
        i64 bx = row_base(tx, r), by = row_base(ty, r);
        // The maximum (NaN skipped, as Rust's f64::max does) is taken out before exponentiating.
        double m = -1.0 / 0.0;
        for (i64 k = 0; k < len; ++k) m = fmax(m, {ldx}(x, bx + k * sx));
        double s = -0.0;
        for (i64 k = 0; k < len; ++k) s += exp({ldx}(x, bx + k * sx) - m);
        double lse = m + log(s);
        for (i64 k = 0; k < len; ++k) {{ double v = {ldx}(x, bx + k * sx); {sty}(y, by + k * sy, {out}); }}
        {store_stats}
    }}
}}
"#
        )
    } else {
        format!(
            r#"{helpers}
extern "C" __global__ void {entry}({params}) {{
    __shared__ double sh[256];
    i64 len = tx.dims[SM_AXIS], sx = tx.strides[SM_AXIS], sy = ty.strides[SM_AXIS];
    i64 rows = row_count(tx);
    int t = threadIdx.x;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {{
        i64 bx = row_base(tx, r), by = row_base(ty, r);
        double m = -1.0 / 0.0;
        for (i64 k = t; k < len; k += blockDim.x) m = fmax(m, {ldx}(x, bx + k * sx));
        m = block_reduce(m, sh, true);
        double s = -0.0;
        for (i64 k = t; k < len; k += blockDim.x) s += exp({ldx}(x, bx + k * sx) - m);
        s = block_reduce(s, sh, false);
        double lse = m + log(s);
        for (i64 k = t; k < len; k += blockDim.x) {{ double v = {ldx}(x, bx + k * sx); {sty}(y, by + k * sy, {out}); }}
        if (t == 0) {{ {store_stats} }}
    }}
}}
"#
        )
    };
    Ok(NodeKernels::one(launch(source, &entry, rows, len, args)))
}

pub(super) fn softmax_backward(ctx: &Ctx, a: &SoftmaxAttrs) -> Result<NodeKernels> {
    let y = ctx.input("y")?;
    let dy = ctx.input("dy")?;
    let dx = ctx.output("dx")?;
    let len = axis_len(ctx, y, a.axis)?;
    let rows = if len > 0 { ctx.numel(y) / len as u64 } else { 0 };
    let entry = ctx.entry("softmax_bwd");
    let (ldy, lddy, stdx) = (ctx.ld(y), ctx.ld(dy), ctx.st(dx));
    // Log-softmax: dx = dy - exp(y) * sum(dy); softmax: dx = y * (dy - sum(dy * y)).
    let (term, out) = if a.log { ("g", "g - exp(v) * s") } else { ("g * v", "v * (g - s)") };
    let params = "void* dx, TRef tdx, const void* y, TRef ty, const void* dy, TRef tdy";
    let args = vec![Arg::Ptr(dx), Arg::Ref(dx), Arg::Ptr(y), Arg::Ref(y), Arg::Ptr(dy), Arg::Ref(dy)];
    let helpers = helpers(a.axis);
    let load = format!("double v = {ldy}(y, by + k * sy); double g = {lddy}(dy, bg + k * sg); (void)v;");
    let source = if len <= SHORT_ROW {
        format!(
            r#"{helpers}
extern "C" __global__ void {entry}({params}) {{
    i64 len = ty.dims[SM_AXIS], sy = ty.strides[SM_AXIS], sg = tdy.strides[SM_AXIS], sd = tdx.strides[SM_AXIS];
    GRID_STRIDE(r, row_count(ty)) {{
        i64 by = row_base(ty, r), bg = row_base(tdy, r), bd = row_base(tdx, r);
        double s = -0.0;
        for (i64 k = 0; k < len; ++k) {{ {load} s += {term}; }}
        for (i64 k = 0; k < len; ++k) {{ {load} {stdx}(dx, bd + k * sd, {out}); }}
    }}
}}
"#
        )
    } else {
        format!(
            r#"{helpers}
extern "C" __global__ void {entry}({params}) {{
    __shared__ double sh[256];
    i64 len = ty.dims[SM_AXIS], sy = ty.strides[SM_AXIS], sg = tdy.strides[SM_AXIS], sd = tdx.strides[SM_AXIS];
    i64 rows = row_count(ty);
    int t = threadIdx.x;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {{
        i64 by = row_base(ty, r), bg = row_base(tdy, r), bd = row_base(tdx, r);
        double s = -0.0;
        for (i64 k = t; k < len; k += blockDim.x) {{ {load} s += {term}; }}
        s = block_reduce(s, sh, false);
        for (i64 k = t; k < len; k += blockDim.x) {{ {load} {stdx}(dx, bd + k * sd, {out}); }}
    }}
}}
"#
        )
    };
    Ok(NodeKernels::one(launch(source, &entry, rows, len, args)))
}
