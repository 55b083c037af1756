//! Pooling (max, average including or excluding padding) over 1 to 3 spatial dims of
//! `[n, c, spatial...]`, forward and backward, in double, as the CPU engine computes it.
//!
//! Output position `o` along a spatial dim covers input positions
//! `[o * stride - pre, o * stride - pre + window)`; those inside `[0, in)` are real. The
//! attributes are baked into the source; dims and strides arrive in the `TRef`s.
//! - Forward: one thread per output element; its window in row-major order (max: the first
//!   maximal element, a NaN counting as maximal; average: the sum over the divisor).
//! - Backward: one thread per `dx` element gathers from the output windows that contain it, in
//!   row-major output order (the CPU's order of accumulation): for max, it recomputes each
//!   window's first argmax and takes `dy` only where that is itself; for the averages it adds
//!   `dy / divisor`. No atomics.

use super::{Arg, Ctx, Launch, NodeKernels};
use crate::error::Result;
use crate::graph::ops::resample::{ResampleAttrs, ResampleMode};

/// Checks the attributes against `x`'s rank; the number of spatial dims.
fn spatial_dims(ctx: &Ctx, a: &ResampleAttrs, x_rank: usize) -> Result<usize> {
    if !(3..=5).contains(&x_rank) {
        return Err(ctx.err(format!("input `x` must have rank 3 to 5, got {x_rank}")));
    }
    let nsp = x_rank - 2;
    if [&a.window, &a.stride, &a.pre_padding, &a.post_padding].iter().any(|l| l.len() != nsp) || a.stride.iter().any(|&s| s < 1) {
        return Err(ctx.err(format!("window, stride and padding must have {nsp} entries (stride >= 1)")));
    }
    Ok(nsp)
}

fn c_list(v: &[i64]) -> String {
    v.iter().map(|x| format!("{x}LL")).collect::<Vec<_>>().join(", ")
}

/// `for` loops over `var0..` from `lo[d]` to `hi[d]` (exclusive), outermost dim first.
fn loops(nsp: usize, var: &str, lo: &str, hi: &str) -> String {
    (0..nsp).map(|d| format!("for (i64 {var}{d} = {lo}[{d}]; {var}{d} < {hi}[{d}]; ++{var}{d}) ")).collect()
}

/// `+ var0 * t.strides[2] + ...`: the offset of a spatial position.
fn spatial_offset(nsp: usize, var: &str, t: &str) -> String {
    (0..nsp).map(|d| format!(" + {var}{d} * {t}.strides[{}]", d + 2)).collect()
}

/// Helpers shared by both directions: the attributes, the window of an output position (and
/// its divisor) and the first argmax of a window.
fn helpers(a: &ResampleAttrs, nsp: usize, ldx: &str) -> String {
    let divisor = if a.mode == ResampleMode::AvgIncludePadding { "swp" } else { "rc" };
    let flat = (0..nsp).fold("0".to_string(), |acc, d| format!("({acc}) * in[{d}] + i{d}"));
    format!(
        r#"
#define NSP {nsp}
#define RS_CONSTS const i64 W[NSP] = {{ {w} }}, S[NSP] = {{ {s} }}, PRE[NSP] = {{ {pre} }}, POST[NSP] = {{ {post} }}; (void)W; (void)S; (void)PRE; (void)POST;
// Floor division by a positive b.
__device__ __forceinline__ i64 fdiv(i64 a, i64 b) {{ return a >= 0 ? a / b : -((-a + b - 1) / b); }}
// The real input range [lo, hi) of output position o per spatial dim; returns the divisor:
// the window size clipped at the padded input (including padding) or the real count.
__device__ __forceinline__ double rs_window(const i64* o, const i64* in, i64* lo, i64* hi) {{
    RS_CONSTS
    double swp = 1.0, rc = 1.0;
#pragma unroll
    for (int d = 0; d < NSP; ++d) {{
        i64 start = o[d] * S[d] - PRE[d];
        i64 end = start + W[d];
        i64 l = start > 0 ? start : 0;
        i64 h = end < in[d] ? end : in[d];
        lo[d] = l;
        hi[d] = h > l ? h : l;
        i64 pe = end < in[d] + POST[d] ? end : in[d] + POST[d];
        swp *= (double)(pe - start);
        rc *= (double)(h - l > 0 ? h - l : 0);
    }}
    (void)swp; (void)rc;
    return {divisor};
}}
// The first maximal real element of a window (a NaN counts as the maximum), as its row-major
// index within the plane, -1 for an empty window; its value in *val.
__device__ __forceinline__ i64 rs_argmax(const void* x, i64 base, const TRef& tx, const i64* in, const i64* lo, const i64* hi, double* val) {{
    i64 best = -1;
    double b = 0.0;
    {loops}{{
        double v = {ldx}(x, base{off});
        if (best < 0 || v > b || (isnan(v) && !isnan(b))) {{ best = {flat}; b = v; }}
    }}
    *val = b;
    return best;
}}
"#,
        w = c_list(&a.window),
        s = c_list(&a.stride),
        pre = c_list(&a.pre_padding),
        post = c_list(&a.post_padding),
        loops = loops(nsp, "i", "lo", "hi"),
        off = spatial_offset(nsp, "i", "tx"),
    )
}

pub(super) fn resample(ctx: &Ctx, a: &ResampleAttrs) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let y = ctx.output("y")?;
    let nsp = spatial_dims(ctx, a, ctx.dims(x).len())?;
    let entry = ctx.entry("pool");
    let (ldx, sty) = (ctx.ld(x), ctx.st(y));
    let body = match a.mode {
        ResampleMode::Max => "double v;\n        double r = rs_argmax(x, base, tx, in, lo, hi, &v) >= 0 ? v : (0.0 / 0.0);\n        (void)div;".to_string(),
        ResampleMode::AvgIncludePadding | ResampleMode::AvgExcludePadding => format!(
            "double sum = 0.0;\n        {loops}sum += {ldx}(x, base{off});\n        double r = sum / div;",
            loops = loops(nsp, "i", "lo", "hi"),
            off = spatial_offset(nsp, "i", "tx"),
        ),
    };
    let source = format!(
        r#"{helpers}
extern "C" __global__ void {entry}(void* y, TRef ty, const void* x, TRef tx) {{
    i64 n = numel(ty);
    GRID_STRIDE(i, n) {{
        i64 idx[8];
        unravel(ty, i, idx);
        i64 base = idx[0] * tx.strides[0] + idx[1] * tx.strides[1];
        i64 in[NSP], o[NSP], lo[NSP], hi[NSP];
#pragma unroll
        for (int d = 0; d < NSP; ++d) {{ in[d] = tx.dims[d + 2]; o[d] = idx[d + 2]; }}
        double div = rs_window(o, in, lo, hi);
        {body}
        {sty}(y, offset_at(ty, idx), r);
    }}
}}
"#,
        helpers = helpers(a, nsp, &ldx),
    );
    Ok(NodeKernels::one(Launch::elementwise(source, &entry, ctx.numel(y), vec![Arg::Ptr(y), Arg::Ref(y), Arg::Ptr(x), Arg::Ref(x)])))
}

pub(super) fn resample_backward(ctx: &Ctx, a: &ResampleAttrs) -> Result<NodeKernels> {
    let dy = ctx.input("dy")?;
    let x = ctx.input("x")?;
    let dx = ctx.output("dx")?;
    let nsp = spatial_dims(ctx, a, ctx.dims(x).len())?;
    if ctx.dims(dy).len() != nsp + 2 || ctx.dims(dx) != ctx.dims(x) {
        return Err(ctx.err("`dy` must have the rank of `x`, and `dx` the dims of `x`"));
    }
    let entry = ctx.entry("pool_bwd");
    let (ldx, lddy, stdx) = (ctx.ld(x), ctx.ld(dy), ctx.st(dx));
    let take = match a.mode {
        ResampleMode::Max => "double v;\n            if (rs_argmax(x, base, tx, in, lo, hi, &v) == p) g += gv;\n            (void)div;",
        ResampleMode::AvgIncludePadding | ResampleMode::AvgExcludePadding => "g += gv / div;",
    };
    let o_list = (0..nsp).map(|d| format!("o{d}")).collect::<Vec<_>>().join(", ");
    let source = format!(
        r#"{helpers}
extern "C" __global__ void {entry}(void* dx, TRef tdx, const void* dy, TRef tdy, const void* x, TRef tx) {{
    RS_CONSTS
    i64 n = numel(tdx);
    GRID_STRIDE(i, n) {{
        i64 idx[8];
        unravel(tdx, i, idx);
        i64 base = idx[0] * tx.strides[0] + idx[1] * tx.strides[1];
        i64 gbase = idx[0] * tdy.strides[0] + idx[1] * tdy.strides[1];
        // The output positions whose windows hold this element: start <= p < start + window.
        i64 in[NSP], olo[NSP], ohi[NSP];
        i64 p = 0;
#pragma unroll
        for (int d = 0; d < NSP; ++d) {{
            in[d] = tx.dims[d + 2];
            i64 pd = idx[d + 2];
            p = p * in[d] + pd;
            i64 first = fdiv(pd + PRE[d] - W[d], S[d]) + 1;
            i64 last = (pd + PRE[d]) / S[d] + 1;
            i64 od = tdy.dims[d + 2];
            olo[d] = first > 0 ? first : 0;
            ohi[d] = last < od ? last : od;
        }}
        double g = 0.0;
        {oloops}{{
            i64 o[NSP] = {{ {o_list} }};
            i64 lo[NSP], hi[NSP];
            double div = rs_window(o, in, lo, hi);
            double gv = {lddy}(dy, gbase{goff});
            {take}
        }}
        {stdx}(dx, offset_at(tdx, idx), g);
    }}
}}
"#,
        helpers = helpers(a, nsp, &ldx),
        oloops = loops(nsp, "o", "olo", "ohi"),
        goff = spatial_offset(nsp, "o", "tdy"),
    );
    Ok(NodeKernels::one(Launch::elementwise(source, &entry, ctx.numel(dx), vec![Arg::Ptr(dx), Arg::Ref(dx), Arg::Ptr(dy), Arg::Ref(dy), Arg::Ptr(x), Arg::Ref(x)])))
}
