// The split-k reduce of the Hopper GEMM (after sm90_common.cuh and the epilogue): for each pair
// of columns, the splits' f32 partial sums (`part`, [split][batch][M][NP]) added in split order
// (deterministic), then the epilogue and the store of C. GEMM_REDUCE_T (C stored column-major:
// its row stride one element): a 1024-thread block a tile of 32 columns x RED_TR rows, each
// element's splits shared by RED_SG threads (split q, q + RED_SG, ... each, in order; then the
// RED_SG sums added in q order: the same order whatever the grid), so that few tiles with many
// splits still keep many loads in flight; the tile is then stored through shared memory with
// consecutive threads along C's rows.

#if GEMM_REDUCE_T
#define RED_TR (32 / RED_SG)
extern "C" __global__ void __launch_bounds__(1024) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    __shared__ float sums[RED_SG][RED_TR][32];
    __shared__ float tile[RED_TR][33];
    unsigned char* const cbase = (unsigned char*)c;
    const long long rts = (M_ + RED_TR - 1) / RED_TR, cts = (N_ + 31) / 32;
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5, r = ty % RED_TR, q = ty / RED_TR;
    for (long long t = blockIdx.x; t < BATCH * rts * cts; t += gridDim.x) {
        const long long c0 = (t % cts) * 32, r0 = (t / cts % rts) * RED_TR;
        const int bt = (int)(t / cts / rts);
        {
            const long long row = r0 + r, col = c0 + tx;
            float acc = 0.f;
            if (row < M_ && col < N_) {
                const float* src = part + ((long long)bt * M_ + row) * NP + col;
                #pragma unroll 8
                for (int s = q; s < GEMM_SPLITS; s += RED_SG) {
                    acc += src[(long long)s * BATCH * M_ * NP];
                }
            }
            sums[q][r][tx] = acc;
        }
        __syncthreads();
        if (ty < RED_TR) {
            const long long row = r0 + ty, col = c0 + tx;
            float acc = 0.f;
            #pragma unroll
            for (int g = 0; g < RED_SG; ++g) acc += sums[g][ty][tx];
            tile[ty][tx] = row < M_ && col < N_ ? EPI_AT(acc, col) : 0.f;
        }
        __syncthreads();
        if (threadIdx.x < 32 * RED_TR) {
            const int i = threadIdx.x % RED_TR, j = threadIdx.x / RED_TR;
            const long long row = r0 + i, col = c0 + j;
            if (row < M_ && col < N_) {
                unsigned char* cp = cbase + (long long)bt * C_BS + row * C_RS + col * C_CS;
                C_ST1(cp, tile[i][j]);
            }
        }
        __syncthreads();
    }
}
#else
extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    unsigned char* const cbase = (unsigned char*)c;
    const long long pairs = BATCH * M_ * (NP / 2);
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < pairs; e += (long long)gridDim.x * blockDim.x) {
        const long long col = (e % (NP / 2)) * 2;
        const long long rowg = e / (NP / 2);
        const long long row = rowg % M_;
        const int bt = (int)(rowg / M_);
        float2 acc = make_float2(0.f, 0.f);
        #pragma unroll 4
        for (int s = 0; s < GEMM_SPLITS; ++s) {
            const float2 v = *(const float2*)(part + (((long long)s * BATCH + bt) * M_ + row) * NP + col);
            acc.x += v.x;
            acc.y += v.y;
        }
        unsigned char* rp = cbase + (long long)bt * C_BS + row * C_RS;
        C_STORE_EPI(acc.x, acc.y)
    }
}
#endif
