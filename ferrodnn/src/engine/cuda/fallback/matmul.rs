//! Batched matmul: one thread per element of `c` (grid-stride, in `c`'s memory order so that
//! writes coalesce), `c[b, i, j] = sum_k a[b', i, k] * b[b'', k, j]` summed in double in order
//! of k, as the CPU engine (`engine/cpu/matmul.rs`) does. Batch dims broadcast numpy-style
//! (right-aligned, size-1 dims repeat; stride-0 dims just read the same memory); transposes
//! are strides. Inputs are rounded to the compute type first when it is a float type, as on
//! the CPU (integers are exact in double for the sums the CPU does too).

use super::conv::{compute_round_helper, memory_order, UNRAVEL_ORDERED};
use super::{Arg, Ctx, Launch, NodeKernels};
use crate::error::Result;
use crate::graph::ops::matmul::MatmulAttrs;

pub(super) fn matmul(ctx: &Ctx, _a: &MatmulAttrs) -> Result<NodeKernels> {
    let (a, b, c) = (ctx.input("a")?, ctx.input("b")?, ctx.output("c")?);
    let (ra, rb, rc) = (ctx.dims(a).len(), ctx.dims(b).len(), ctx.dims(c).len());
    if ra < 2 || rb < 2 || rc < ra.max(rb) || rc > 8 {
        return Err(ctx.err(format!("internal: ranks a {ra}, b {rb}, c {rc} do not fit a matmul")));
    }
    let entry = ctx.entry("matmul");
    let source = format!(
        r#"{round}{UNRAVEL_ORDERED}
__constant__ int ORD[{rc}] = {{ {ord} }};

// Offset in `t` of the matrix that output index `idx` (of rank `rc`) reads: `t`'s batch dims
// align on the right with the output's, size-1 dims repeat.
__device__ __forceinline__ i64 mm_base(const TRef& t, const i64* idx, int rc) {{
    i64 off = 0;
    const int shift = rc - t.rank;
    for (int q = 0; q < t.rank - 2; ++q) off += (t.dims[q] == 1 ? 0 : idx[q + shift]) * t.strides[q];
    return off;
}}

extern "C" __global__ void {entry}(void* c, TRef tc, const void* a, TRef ta, const void* b, TRef tb) {{
    const int rc = tc.rank;
    const i64 K = ta.dims[ta.rank - 1];
    const i64 sak = ta.strides[ta.rank - 1], sbk = tb.strides[tb.rank - 2];
    const i64 total = numel(tc);
    GRID_STRIDE(e, total) {{
        i64 idx[8];
        unravel_ord(tc, ORD, {rc}, e, idx);
        const i64 i = idx[rc - 2], j = idx[rc - 1];
        i64 ao = mm_base(ta, idx, rc) + i * ta.strides[ta.rank - 2];
        i64 bo = mm_base(tb, idx, rc) + j * tb.strides[tb.rank - 1];
        double acc = 0.0;
        for (i64 k = 0; k < K; ++k) {{
            acc = acc + __dmul_rn(cvq({lda}(a, ao)), cvq({ldb}(b, bo)));
            ao += sak;
            bo += sbk;
        }}
        {stc}(c, offset_at(tc, idx), acc);
    }}
}}
"#,
        round = compute_round_helper(ctx.graph.compute_type(ctx.node)),
        ord = memory_order(ctx, c),
        lda = ctx.ld(a),
        ldb = ctx.ld(b),
        stc = ctx.st(c),
    );
    let args = vec![Arg::Ptr(c), Arg::Ref(c), Arg::Ptr(a), Arg::Ref(a), Arg::Ptr(b), Arg::Ref(b)];
    Ok(NodeKernels::one(Launch::elementwise(source, &entry, ctx.numel(c), args)))
}
