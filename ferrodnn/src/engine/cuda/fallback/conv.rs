//! Convolution (fprop, dgrad, wgrad; 1D, 2D, 3D; groups; any strides): one thread per output
//! element (grid-stride, in the output's memory order so that writes coalesce), the inner sum
//! in double over the same terms in the same order as the CPU engine (`engine/cpu/conv.rs`),
//! inputs rounded to the compute type first as the CPU does.
//!
//! Per spatial dim, tap `f` of output position `o` reads input position
//! `i = o * stride - pre_padding + f * dilation`; convolution mode reads the weight of tap `f`
//! at `filter - 1 - f`. Output channel `k` is in group `k / (k / groups)` and reads that
//! group's image channels. Attributes are baked into the source; dims and strides come at run
//! time through the `TRef`s.

use super::{Arg, Ctx, Launch, NodeKernels};
use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::ops::conv::{ConvAttrs, ConvMode};
use crate::graph::TensorId;

/// `cvq(v)`: a value rounded to the node's compute type, as the CPU engine's
/// `compute.quantize` does for float compute types (integer compute types round nothing).
pub(super) fn compute_round_helper(ct: DataType) -> String {
    let body = match ct {
        DataType::F32 => "return q_f32(v);".to_string(),
        DataType::F16 => "return (double)__half2float(__double2half(v));".to_string(),
        DataType::Bf16 => "return (double)__bfloat162float(__double2bfloat16(v));".to_string(),
        DataType::Fp8E4m3 | DataType::Fp8E5m2 => {
            let f = if ct == DataType::Fp8E4m3 { "__NV_E4M3" } else { "__NV_E5M2" };
            format!("__half_raw h = __nv_cvt_fp8_to_halfraw(__nv_cvt_double_to_fp8(v, __NV_SATFINITE, {f}), {f}); return (double)__half2float(__half(h));")
        }
        _ => "return v;".to_string(),
    };
    format!("__device__ __forceinline__ double cvq(double v) {{ {body} }}\n")
}

/// The axes of a tensor from the slowest to the fastest in memory (stride descending, ties
/// in logical order), as a C initializer: a thread index unravelled in this order walks the
/// tensor's memory in order.
pub(super) fn memory_order(ctx: &Ctx, id: TensorId) -> String {
    let d = ctx.graph.desc(id);
    let mut axes: Vec<usize> = (0..d.dims.len()).collect();
    axes.sort_by(|&a, &b| d.strides[b].cmp(&d.strides[a]).then(a.cmp(&b)));
    axes.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", ")
}

/// Device code unravelling `flat` into logical `idx` of `t`, walking axes in `ORD` (rank `R`).
pub(super) const UNRAVEL_ORDERED: &str = r#"
__device__ __forceinline__ void unravel_ord(const TRef& t, const int* ord, int r, i64 flat, i64* idx) {
    for (int q = r - 1; q >= 0; --q) { int a = ord[q]; idx[a] = flat % t.dims[a]; flat /= t.dims[a]; }
}
"#;

fn c_list(v: &[i64]) -> String {
    v.iter().map(|x| format!("{x}LL")).collect::<Vec<_>>().join(", ")
}

/// The shared head of the three kernels: attribute constants and helpers.
fn head(ctx: &Ctx, a: &ConvAttrs, sr: usize, out: TensorId) -> Result<String> {
    if !(1..=3).contains(&sr) || a.pre_padding.len() != sr || a.stride.len() != sr || a.dilation.len() != sr {
        return Err(ctx.err(format!("internal: {sr} spatial dims but attributes {a:?}")));
    }
    Ok(format!(
        "{round}{UNRAVEL_ORDERED}\n#define SR {sr}\n#define FLIP {flip}\n__constant__ i64 PRE[SR] = {{ {pre} }};\n__constant__ i64 STR[SR] = {{ {stride} }};\n__constant__ i64 DIL[SR] = {{ {dil} }};\n__constant__ int ORD[SR + 2] = {{ {ord} }};\n",
        round = compute_round_helper(ctx.graph.compute_type(ctx.node)),
        flip = if a.mode == ConvMode::Convolution { 1 } else { 0 },
        pre = c_list(&a.pre_padding),
        stride = c_list(&a.stride),
        dil = c_list(&a.dilation),
        ord = memory_order(ctx, out),
    ))
}

fn spatial_rank(ctx: &Ctx, image: TensorId) -> usize {
    ctx.dims(image).len().saturating_sub(2)
}

/// y[n, k, o] = sum over the group's channels cl, then taps f (row-major) inside the image, of
/// x[n, c, o*s - p + f*d] * w[k, cl, f'] (f' flipped in convolution mode).
pub(super) fn fprop(ctx: &Ctx, a: &ConvAttrs) -> Result<NodeKernels> {
    let (x, w, y) = (ctx.input("x")?, ctx.input("w")?, ctx.output("y")?);
    let entry = ctx.entry("conv_fprop");
    let source = format!(
        r#"{head}
extern "C" __global__ void {entry}(void* y, TRef ty, const void* x, TRef tx, const void* w, TRef tw) {{
    const i64 C = tx.dims[1], K = tw.dims[0], CPG = tw.dims[1];
    const i64 KPG = K / (C / CPG);
    i64 ftot = 1;
    for (int d = 0; d < SR; ++d) ftot *= tw.dims[2 + d];
    const i64 total = numel(ty);
    GRID_STRIDE(e, total) {{
        i64 idx[8];
        unravel_ord(ty, ORD, SR + 2, e, idx);
        const i64 n = idx[0], k = idx[1];
        const i64 g = k / KPG;
        double acc = 0.0;
        for (i64 cl = 0; cl < CPG; ++cl) {{
            const i64 xb = n * tx.strides[0] + (g * CPG + cl) * tx.strides[1];
            const i64 wb = k * tw.strides[0] + cl * tw.strides[1];
            for (i64 t = 0; t < ftot; ++t) {{
                i64 rem = t, xo = xb, wo = wb;
                bool inside = true;
                for (int d = SR - 1; d >= 0; --d) {{
                    const i64 fd = tw.dims[2 + d];
                    const i64 f = rem % fd;
                    rem /= fd;
                    const i64 i = idx[2 + d] * STR[d] - PRE[d] + f * DIL[d];
                    if (i < 0 || i >= tx.dims[2 + d]) {{ inside = false; break; }}
                    xo += i * tx.strides[2 + d];
                    wo += (FLIP ? fd - 1 - f : f) * tw.strides[2 + d];
                }}
                if (inside) acc = acc + __dmul_rn(cvq({ldx}(x, xo)), cvq({ldw}(w, wo)));
            }}
        }}
        {sty}(y, offset_at(ty, idx), acc);
    }}
}}
"#,
        head = head(ctx, a, spatial_rank(ctx, x), y)?,
        ldx = ctx.ld(x),
        ldw = ctx.ld(w),
        sty = ctx.st(y),
    );
    let args = vec![Arg::Ptr(y), Arg::Ref(y), Arg::Ptr(x), Arg::Ref(x), Arg::Ptr(w), Arg::Ref(w)];
    Ok(NodeKernels::one(Launch::elementwise(source, &entry, ctx.numel(y), args)))
}

/// dx[n, c, i] = sum over the group's output channels kl, then taps f (row-major), for the
/// output position o with o*s - p + f*d = i (when there is one), of dy[n, k, o] * w[k, cl, f'].
pub(super) fn dgrad(ctx: &Ctx, a: &ConvAttrs) -> Result<NodeKernels> {
    let (dy, w, dx) = (ctx.input("dy")?, ctx.input("w")?, ctx.output("dx")?);
    let entry = ctx.entry("conv_dgrad");
    let source = format!(
        r#"{head}
extern "C" __global__ void {entry}(void* dx, TRef tdx, const void* dy, TRef tdy, const void* w, TRef tw) {{
    const i64 C = tdx.dims[1], K = tw.dims[0], CPG = tw.dims[1];
    const i64 KPG = K / (C / CPG);
    i64 ftot = 1;
    for (int d = 0; d < SR; ++d) ftot *= tw.dims[2 + d];
    const i64 total = numel(tdx);
    GRID_STRIDE(e, total) {{
        i64 idx[8];
        unravel_ord(tdx, ORD, SR + 2, e, idx);
        const i64 n = idx[0], c = idx[1];
        const i64 g = c / CPG, cl = c % CPG;
        double acc = 0.0;
        for (i64 kl = 0; kl < KPG; ++kl) {{
            const i64 k = g * KPG + kl;
            const i64 yb = n * tdy.strides[0] + k * tdy.strides[1];
            const i64 wb = k * tw.strides[0] + cl * tw.strides[1];
            for (i64 t = 0; t < ftot; ++t) {{
                i64 rem = t, yo = yb, wo = wb;
                bool hit = true;
                for (int d = SR - 1; d >= 0; --d) {{
                    const i64 fd = tw.dims[2 + d];
                    const i64 f = rem % fd;
                    rem /= fd;
                    const i64 num = idx[2 + d] + PRE[d] - f * DIL[d];
                    if (num < 0 || num % STR[d] != 0) {{ hit = false; break; }}
                    const i64 o = num / STR[d];
                    if (o >= tdy.dims[2 + d]) {{ hit = false; break; }}
                    yo += o * tdy.strides[2 + d];
                    wo += (FLIP ? fd - 1 - f : f) * tw.strides[2 + d];
                }}
                if (hit) acc = acc + __dmul_rn(cvq({lddy}(dy, yo)), cvq({ldw}(w, wo)));
            }}
        }}
        {stdx}(dx, offset_at(tdx, idx), acc);
    }}
}}
"#,
        head = head(ctx, a, spatial_rank(ctx, dx), dx)?,
        lddy = ctx.ld(dy),
        ldw = ctx.ld(w),
        stdx = ctx.st(dx),
    );
    let args = vec![Arg::Ptr(dx), Arg::Ref(dx), Arg::Ptr(dy), Arg::Ref(dy), Arg::Ptr(w), Arg::Ref(w)];
    Ok(NodeKernels::one(Launch::elementwise(source, &entry, ctx.numel(dx), args)))
}

/// dw[k, cl, s] = sum over n, then output positions o (row-major) whose tap f (s flipped in
/// convolution mode) lands inside the image, of dy[n, k, o] * x[n, c, o*s - p + f*d], with c
/// the image channel of k's group that filter channel cl reads.
pub(super) fn wgrad(ctx: &Ctx, a: &ConvAttrs) -> Result<NodeKernels> {
    let (dy, x, dw) = (ctx.input("dy")?, ctx.input("x")?, ctx.output("dw")?);
    let entry = ctx.entry("conv_wgrad");
    let source = format!(
        r#"{head}
extern "C" __global__ void {entry}(void* dw, TRef tdw, const void* dy, TRef tdy, const void* x, TRef tx) {{
    const i64 N = tx.dims[0], C = tx.dims[1], K = tdw.dims[0], CPG = tdw.dims[1];
    const i64 KPG = K / (C / CPG);
    i64 otot = 1;
    for (int d = 0; d < SR; ++d) otot *= tdy.dims[2 + d];
    const i64 total = numel(tdw);
    GRID_STRIDE(e, total) {{
        i64 idx[8];
        unravel_ord(tdw, ORD, SR + 2, e, idx);
        const i64 k = idx[0], cl = idx[1];
        const i64 c = (k / KPG) * CPG + cl;
        i64 f[SR];
        for (int d = 0; d < SR; ++d) f[d] = FLIP ? tdw.dims[2 + d] - 1 - idx[2 + d] : idx[2 + d];
        double acc = 0.0;
        for (i64 n = 0; n < N; ++n) {{
            const i64 yb = n * tdy.strides[0] + k * tdy.strides[1];
            const i64 xb = n * tx.strides[0] + c * tx.strides[1];
            for (i64 t = 0; t < otot; ++t) {{
                i64 rem = t, yo = yb, xo = xb;
                bool inside = true;
                for (int d = SR - 1; d >= 0; --d) {{
                    const i64 od = tdy.dims[2 + d];
                    const i64 o = rem % od;
                    rem /= od;
                    const i64 i = o * STR[d] - PRE[d] + f[d] * DIL[d];
                    if (i < 0 || i >= tx.dims[2 + d]) {{ inside = false; break; }}
                    yo += o * tdy.strides[2 + d];
                    xo += i * tx.strides[2 + d];
                }}
                if (inside) acc = acc + __dmul_rn(cvq({lddy}(dy, yo)), cvq({ldx}(x, xo)));
            }}
        }}
        {stdw}(dw, offset_at(tdw, idx), acc);
    }}
}}
"#,
        head = head(ctx, a, spatial_rank(ctx, x), dw)?,
        lddy = ctx.ld(dy),
        ldx = ctx.ld(x),
        stdw = ctx.st(dw),
    );
    let args = vec![Arg::Ptr(dw), Arg::Ref(dw), Arg::Ptr(dy), Arg::Ref(dy), Arg::Ptr(x), Arg::Ref(x)];
    Ok(NodeKernels::one(Launch::elementwise(source, &entry, ctx.numel(dw), args)))
}
