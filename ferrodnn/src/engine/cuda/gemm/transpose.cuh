// B (`k x n`, any strides) copied for the tf32 Hopper GEMM as `n` rows of KP floats per batch
// (k rounded up to 4: 16-byte rows for TMA), each value rounded to nearest tf32 (`cvt.rna`),
// through 32 x 32 tiles in shared memory so that both the reads (along n) and the writes (along k)
// are coalesced.
//
// Reads: TR_K, TR_N, TR_KP, TR_TK, TR_TN (tiles of 32 along k and n), TR_TILES (all of them, over
// the copy's batches), TR_BS, TR_RS, TR_CS (B's batch, row and column strides in elements; batch
// stride 0 for one copy).

#define B_BS ((long long)TR_BS)
#define B_RS ((long long)TR_RS)
#define B_CS ((long long)TR_CS)

extern "C" __global__ void __launch_bounds__(256) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    __shared__ float tile[32][33];
    const long long K = TR_K, N = TR_N, KP = TR_KP, TK = TR_TK, TN = TR_TN, TILES = TR_TILES;
    const int x = threadIdx.x % 32, y = threadIdx.x / 32;
    for (long long t = blockIdx.x; t < TILES; t += gridDim.x) {
        const long long bb = t / (TK * TN), r = t % (TK * TN);
        const long long k0 = (r / TN) * 32, n0 = (r % TN) * 32;
        #pragma unroll
        for (int i = y; i < 32; i += 8) {
            const long long k = k0 + i, n = n0 + x;
            tile[i][x] = (k < K && n < N) ? b[bb * B_BS + k * B_RS + n * B_CS] : 0.f;
        }
        __syncthreads();
        #pragma unroll
        for (int i = y; i < 32; i += 8) {
            const long long n = n0 + i, k = k0 + x;
            if (n < N && k < K) {
                unsigned r32;
                asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r32) : "f"(tile[x][i]));
                bt[(bb * N + n) * KP + k] = __uint_as_float(r32);
            }
        }
        __syncthreads();
    }
}
