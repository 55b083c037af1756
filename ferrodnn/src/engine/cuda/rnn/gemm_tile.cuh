// A tiled SIMT GEMM shared by the RNN kernels: C[z](m, n) = sum_k A(z, m, k) B(z, k, n), for
// each batch entry z = blockIdx.y. 256 threads compute a 64 x 64 tile, 4 x 4 accumulators each,
// over 16-deep slices of k staged in shared memory; the blocks stride over the tiles.
// (The GEMM engine's tensor-core kernels take graph tensors as operands, not these computed
// ones: reading the operands through the macros below keeps the RNN's layouts, lengths and
// dropout factors in one place.)
//
// The kernel's own template, before this one, defines:
//   GEMM_M(z), GEMM_N(z), GEMM_K(z)   the problem of batch entry z
//   A_AT(z, m, k), B_AT(z, k, n)      an operand element as acc_t (in range: the kernel checks)
//   A_K_FAST, B_K_FAST                1: the operand is contiguous along k (load k fastest)
//   C_PUT(z, m, n, v)                 what to do with a result
//   GEMM_SETUP                        statements run once per thread first (may be empty)

#define TILE_M 64
#define TILE_N 64
#define TILE_K 16

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    __shared__ acc_t As[TILE_K][TILE_M + 1];
    __shared__ acc_t Bs[TILE_K][TILE_N + 1];
    GEMM_SETUP
    const int z = blockIdx.y;
    const i64 gm = GEMM_M(z), gn = GEMM_N(z), gk = GEMM_K(z);
    const int lx = threadIdx.x % 16, ly = threadIdx.x / 16;
    const i64 nt = (gn + TILE_N - 1) / TILE_N;
    const i64 tiles = ((gm + TILE_M - 1) / TILE_M) * nt;
    for (i64 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const i64 m0 = (tile / nt) * TILE_M, n0 = (tile % nt) * TILE_N;
        acc_t acc[4][4];
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) acc[i][j] = 0;
        for (i64 k0 = 0; k0 < gk; k0 += TILE_K) {
            for (int e = threadIdx.x; e < TILE_M * TILE_K; e += blockDim.x) {
                const int mm = A_K_FAST ? e / TILE_K : e % TILE_M;
                const int kk = A_K_FAST ? e % TILE_K : e / TILE_M;
                const i64 m = m0 + mm, k = k0 + kk;
                As[kk][mm] = (m < gm && k < gk) ? (acc_t)(A_AT(z, m, k)) : (acc_t)0;
            }
            for (int e = threadIdx.x; e < TILE_N * TILE_K; e += blockDim.x) {
                const int nn = B_K_FAST ? e / TILE_K : e % TILE_N;
                const int kk = B_K_FAST ? e % TILE_K : e / TILE_N;
                const i64 n = n0 + nn, k = k0 + kk;
                Bs[kk][nn] = (n < gn && k < gk) ? (acc_t)(B_AT(z, k, n)) : (acc_t)0;
            }
            __syncthreads();
            for (int kk = 0; kk < TILE_K; ++kk) {
                acc_t a[4], b[4];
                for (int i = 0; i < 4; ++i) a[i] = As[kk][ly + 16 * i];
                for (int j = 0; j < 4; ++j) b[j] = Bs[kk][lx + 16 * j];
                for (int i = 0; i < 4; ++i)
                    for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
            }
            __syncthreads();
        }
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) {
                const i64 m = m0 + ly + 16 * i, n = n0 + lx + 16 * j;
                if (m < gm && n < gn) C_PUT(z, m, n, acc[i][j]);
            }
    }
}
