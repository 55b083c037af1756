// The sm_80 backward's first pass (attention/bwd.rs): D_i = do_i . o_i into f32 scratch (dbuf_p),
// a warp per query row (grid-stride).
//
// Reads common.cuh's defines (and FA_INIT's parameters) and OI_S0..3, LD_OI (o), DO_S0..3, LD_DO
// (do). Rows a ragged o or do does not hold give D = 0.

extern "C" __global__ void __launch_bounds__(256) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    FA_INIT
    float* dbuf = reinterpret_cast<float*>(dbuf_p);
    const int lane = threadIdx.x & 31;
    const i64 nwarps = (i64)gridDim.x * (blockDim.x >> 5);
    for (i64 r = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < FA_B * FA_HQ * FA_SQ; r += nwarps) {
        const i64 i = r % FA_SQ, h = (r / FA_SQ) % FA_HQ, bi = r / (FA_SQ * FA_HQ);
        i64 lq, lkv;
        fa_lens(A, bi, lq, lkv);
        const bool held = fa_has_row(FA_RG_O, i, lq) && fa_has_row(FA_RG_DO, i, lq);
        const i64 ob = fa_start(A, FA_RG_O, bi, OI_S0) + h * OI_S1 + i * OI_S2, db = fa_start(A, FA_RG_DO, bi, DO_S0) + h * DO_S1 + i * DO_S2;
        float acc = 0.0f;
        for (int c = lane; held && c < FA_DVR; c += 32) acc += (float)LD_OI(o_p, ob + c * OI_S3) * (float)LD_DO(do_p, db + c * DO_S3);
        acc += __shfl_xor_sync(0xffffffffu, acc, 16);
        acc += __shfl_xor_sync(0xffffffffu, acc, 8);
        acc += __shfl_xor_sync(0xffffffffu, acc, 4);
        acc += __shfl_xor_sync(0xffffffffu, acc, 2);
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        if (lane == 0) dbuf[r] = acc;
    }
}
