// The second launch of a split mma.sync GEMM (after sm80_common.cuh and the epilogue): sums the
// partials of every element of C (`gm_ws`, [split][batch][M][N]; f32, or i32 for 8-bit integer
// operands) in split order, applies the epilogue, stores C.
//
// Reads: GM_SPLITS, GM_INT_EXACT (1: the i32 sums stored as they are into an integer C),
// EPI_NAMES (the epilogue's side-input arguments, `, e0, ...`).

#define TOTAL ((long long)BATCH * M_ * N_)

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    GRID_STRIDE(e, TOTAL) {
        const long long col = e % N_;
        const long long q = e / N_;
        const long long row = q % M_;
        const long long bz = q / M_;
        acc_t sum = 0;
        #pragma unroll 4
        for (int sp = 0; sp < GM_SPLITS; ++sp) sum += gm_ws[(long long)sp * TOTAL + e];
#if GM_INT_EXACT
        gm_sti((char*)gm_c, bz * C_BS + row * C_RS + col * C_CS, sum);
#else
        gm_st((char*)gm_c, bz * C_BS + row * C_RS + col * C_CS, epilogue(gm_accf(sum), bz, row, col EPI_NAMES));
#endif
    }
}
