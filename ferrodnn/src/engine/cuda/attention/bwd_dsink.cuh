// The sm_80 backward's sink gradient (attention/bwd.rs): a CTA of 256 threads per query head h,
// dsink_h = -sum over batches and rows of exp(sink_h - lse) D, with D from the f32 scratch
// (dbuf_p, the first pass's do . o) and lse the stats. Padded rows and rows whose stats is -inf
// (nothing in their softmax) add nothing. Each thread sums its rows, then the CTA adds the 256
// parts in a fixed tree: the same result on every run.
//
// Reads common.cuh's defines (FA_HAS_SINK, LD_SINK, SINK_S1 among them), LD_STATS, ST_S0..2 (the
// stats), ST_DSINK and DSINK_S1 (dsink_token's store and head stride).

extern "C" __global__ void __launch_bounds__(256) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    FA_INIT
    __shared__ float part[256];
    const float* dbuf = reinterpret_cast<const float*>(dbuf_p);
    const i64 h = blockIdx.x;
    const float t = (float)LD_SINK(A.sink, h * SINK_S1);
    float acc = 0.0f;
    for (i64 r = threadIdx.x; r < FA_B * FA_SQ; r += 256) {
        const i64 bi = r / FA_SQ, i = r % FA_SQ;
        i64 lq, lkv;
        fa_lens(A, bi, lq, lkv);
        if (i >= lq) continue;
        const float lse = (float)LD_STATS(stats_p, fa_start(A, FA_RG_ST, bi, ST_S0) + h * ST_S1 + i * ST_S2);
        if (lse == FA_NINF) continue;
        acc += expf(t - lse) * dbuf[(bi * FA_HQ + h) * FA_SQ + i];
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int s = 128; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) ST_DSINK(dsink_p, h * DSINK_S1, -(double)part[0]);
}
