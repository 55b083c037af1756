// Batched matmul in double, for the generic fallback (fallback/matmul.rs); after compute.cuh.
// One thread per element of `c`, walking `c` in its memory order:
// `c[b, i, j] = sum_k a[b', i, k] * b[b'', k, j]` in order of k, each input rounded to the
// compute type first (cvq). Batch dims broadcast numpy-style; transposes are strides.
//
// The instantiation defines:
//   MM_RANK    c's rank
//   MM_ORDER   c's axes from the slowest to the fastest in memory
//   LD_A, LD_B, ST_C

__constant__ int ORD[MM_RANK] = { MM_ORDER };

// Offset in `t` of the matrix that output index `idx` (of rank `rc`) reads: `t`'s batch dims
// align on the right with the output's, size-1 dims repeat.
__device__ __forceinline__ i64 mm_base(const TRef& t, const i64* idx, int rc) {
    i64 off = 0;
    const int shift = rc - t.rank;
    for (int q = 0; q < t.rank - 2; ++q) off += (t.dims[q] == 1 ? 0 : idx[q + shift]) * t.strides[q];
    return off;
}

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const int rc = tc.rank;
    const i64 K = ta.dims[ta.rank - 1];
    const i64 sak = ta.strides[ta.rank - 1], sbk = tb.strides[tb.rank - 2];
    const i64 total = numel(tc);
    GRID_STRIDE(e, total) {
        i64 idx[8];
        unravel_ord(tc, ORD, MM_RANK, e, idx);
        const i64 i = idx[rc - 2], j = idx[rc - 1];
        i64 ao = mm_base(ta, idx, rc) + i * ta.strides[ta.rank - 2];
        i64 bo = mm_base(tb, idx, rc) + j * tb.strides[tb.rank - 1];
        double acc = 0.0;
        for (i64 k = 0; k < K; ++k) {
            acc = acc + __dmul_rn(cvq(LD_A(a, ao)), cvq(LD_B(b, bo)));
            ao += sak;
            bo += sbk;
        }
        ST_C(c, offset_at(tc, idx), acc);
    }
}
