// The decode kernel's split merge (attention/decode.rs): one thread per (row, pair of columns),
// the splits' partial o, max and sum (scratch at part_p) in split order; writes o and stats.
//
// Reads common.cuh's and decode.cuh's defines (FA_NSPLIT, FA_ROWS, o and stats).

FA_DEFINE_STORE(o, O_PAIR, ST_O, O_S3)

extern "C" __global__ void __launch_bounds__(256) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    FA_INIT
    const float* po = reinterpret_cast<const float*>(part_p);
    const float2* pml = reinterpret_cast<const float2*>(po + FA_NSPLIT * FA_ROWS * FA_DV);
    const i64 total = FA_ROWS * (FA_DV / 2);
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
        const i64 row = e / (FA_DV / 2);
        const int c = (int)(e - row * (FA_DV / 2)) * 2;
        const i64 i = row % FA_SQ, hq = (row / FA_SQ) % FA_HQ, bi = row / (FA_SQ * FA_HQ);
        i64 lq, lkv;
        fa_lens(A, bi, lq, lkv);
        (void)lkv;
        float mx = FA_NINF;
        for (int s = 0; s < FA_NSPLIT; ++s) mx = fmaxf(mx, pml[s * FA_ROWS + row].x);
        const float mu = mx == FA_NINF ? 0.0f : mx;
        float ls = 0.0f, o0 = 0.0f, o1 = 0.0f;
        for (int s = 0; s < FA_NSPLIT; ++s) {
            const float2 ml = pml[s * FA_ROWS + row];
            const float a = fa_exp2(ml.x - mu);
            const float2 ov = *reinterpret_cast<const float2*>(po + (s * FA_ROWS + row) * FA_DV + c);
            ls += ml.y * a;
            o0 += ov.x * a;
            o1 += ov.y * a;
        }
        // Empty rows (padded, or every key masked) give o = 0, stats = +inf.
        const bool empty = i >= lq || mx == FA_NINF || !(ls > 0.0f);
        const float inv = empty ? 0.0f : A.keep_scale / ls;
        if (c < FA_DVR) fa_store_o(o_p, bi * O_S0 + hq * O_S1 + i * O_S2 + c * O_S3, o0 * inv, o1 * inv);
#if FA_HAS_STATS
        if (c == 0) ST_STATS(stats_p, bi * ST_S0 + hq * ST_S1 + i * ST_S2, empty ? (double)FA_NINF : (double)(mx * FA_LN2 + logf(ls)));
#endif
    }
}
