// Shared by the persistent recurrences (rnn/persist.rs: the forward, persist.cuh; the backward
// data, persist_bwd.cuh): the grid barrier, the exchange buffer's loads, and the product of every
// sample's exchanged vector (the forward's h, the backward's gate gradients) with the block's rows
// of a matrix held in shared memory, on the tensor cores (mma.sync m16n8k16, f32 accumulators).
//
// The instantiation defines:
//   PN            the block's matrix rows in shared memory (a multiple of 16)
//   PP, BP        the exchanged vector's length rounded up to 32 and the batch B to 16 (the
//                 exchange buffer's shape, [BP][PP])
//   WM, WK        warps along the batch (a power of 2) and along PP (WM * WK = 16)
//   KPW           pairs of k steps (32 columns) per warp along PP
//   SEQ_T, SEQ_BF16, MMA_T   the exchanged element type (__half or __nv_bfloat16), 1 for bf16,
//                 its mma type name ("f16" or "bf16")

#define PR_THREADS 512
// Pairs of k steps whose A fragments a warp loads before it multiplies (8 registers each).
#define PR_KC 8
#define RS (PP + 8)  // a row of R in shared memory, in elements (16 bytes of padding)

__device__ __forceinline__ void pr_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32." MMA_T "." MMA_T ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void pr_ldsm(unsigned* r, const SEQ_T* p) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ int pr_ld_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// The block's writes of this step made visible, then counted.
__device__ __forceinline__ void pr_arrive(int* counter) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(counter, 1);
    }
}

// Until every block of the direction has arrived `n` times.
__device__ __forceinline__ void pr_wait(const int* counter, int n) {
    if (threadIdx.x == 0) {
        while (pr_ld_acquire(counter) < n) {
        }
    }
    __syncthreads();
}

// The column of R (and of the state) that shared-memory column q of R's rows holds: within each
// 32 columns, k step s's fragment column lc (0..15) is column 8c + 4s + 2 [lc >= 8] + e for
// c = (lc % 8) / 2, e = lc % 2 (the order in which a lane's 16-byte loads of the state deliver
// them).
__device__ __forceinline__ int rw_col(int q) {
    const int base = q & ~31, s = (q >> 4) & 1, lc = q & 15;
    return base + 8 * ((lc & 7) >> 1) + 4 * s + 2 * (lc >> 3) + (lc & 1);
}

__device__ __forceinline__ SEQ_T pr_seq(float v) {
#if SEQ_BF16
    return __float2bfloat16(v);
#else
    return __float2half(v);
#endif
}

// red[wk][b][n] = sum over warp column wk's k of x[b][k] * rw[n][k], for the first `rows` rows b
// of the exchange buffer `xp` ([BP][PP], read from L2) and every row n of `rw` ([PN][RS] in shared
// memory, its columns in rw_col's order): the partial products the caller sums over wk.
// Warp (wm, wk) takes m-tiles wm, wm + WM, ... over its k steps.
__device__ __forceinline__ void pr_products(const SEQ_T* xp, int rows, const SEQ_T* rw, float* red) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wm = warp % WM, wk = warp / WM;
    const int g8 = lane >> 2, c4 = lane & 3;
    // ldmatrix rows: lanes 0-7 / 8-15 give n-tile 2jj's rows at k and k + 8, 16-31 tile 2jj + 1's.
    const int lrow = (lane & 7) + ((lane >> 4) << 3), lcol = ((lane >> 3) & 1) << 3;
    for (int mt = wm; mt < (rows + 15) / 16; mt += WM) {
        float acc[PN / 8][4];
#pragma unroll
        for (int q = 0; q < PN / 8; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.0f;
        // Lane (g, c) loads 16 bytes of rows g and g + 8 for each pair of k steps: columns
        // 8c .. 8c + 7 of the pair's 32, taken as k step 0's fragment columns {2c, 2c + 1} and
        // {2c + 8, 2c + 9} (8c + {0, 1} and 8c + {2, 3}) and k step 1's (8c + {4, 5} and
        // 8c + {6, 7}). R's rows sit in shared memory with their columns in that order
        // (rw_col), so the products pair the same k.
        // The exchange buffer is read through L2 (__ldcg): other blocks wrote it this launch, so
        // L1 may hold a stale copy.
        const SEQ_T* arow = xp + (size_t)(mt * 16 + g8) * PP + 8 * c4;
        // Rows past the block's samples (zeros in the buffer) are not loaded.
        const bool lo_ok = mt * 16 + g8 < rows, hi_ok = mt * 16 + g8 + 8 < rows;
        // Every A fragment of a round of PR_KC pairs is loaded before the products, so the
        // round's L2 latency is paid once.
        for (int s0 = 0; s0 < KPW; s0 += PR_KC) {
            uint4 lo[PR_KC], hi[PR_KC];
#pragma unroll
            for (int s = 0; s < PR_KC; ++s) {
                const int k0 = (wk * KPW + s0 + s) * 32;
                if (s0 + s < KPW && k0 < PP) {
                    lo[s] = lo_ok ? __ldcg((const uint4*)(arow + k0)) : make_uint4(0u, 0u, 0u, 0u);
                    hi[s] = hi_ok ? __ldcg((const uint4*)(arow + 8 * PP + k0)) : make_uint4(0u, 0u, 0u, 0u);
                }
            }
#pragma unroll
            for (int s = 0; s < PR_KC; ++s) {
                const int k0 = (wk * KPW + s0 + s) * 32;
                if (s0 + s < KPW && k0 < PP) {
                    const unsigned a0[4] = {lo[s].x, hi[s].x, lo[s].y, hi[s].y};
                    const unsigned a1[4] = {lo[s].z, hi[s].z, lo[s].w, hi[s].w};
#pragma unroll
                    for (int jj = 0; jj < PN / 16; ++jj) {
                        unsigned bm[4];
                        pr_ldsm(bm, rw + (size_t)(jj * 16 + lrow) * RS + k0 + lcol);
                        pr_mma(acc[2 * jj], a0, bm[0], bm[1]);
                        pr_mma(acc[2 * jj + 1], a0, bm[2], bm[3]);
                        pr_ldsm(bm, rw + (size_t)(jj * 16 + lrow) * RS + k0 + 16 + lcol);
                        pr_mma(acc[2 * jj], a1, bm[0], bm[1]);
                        pr_mma(acc[2 * jj + 1], a1, bm[2], bm[3]);
                    }
                }
            }
        }
        float* rr = red + ((size_t)wk * BP + mt * 16 + g8) * PN + 2 * c4;
#pragma unroll
        for (int q = 0; q < PN / 8; ++q) {
            rr[q * 8] = acc[q][0];
            rr[q * 8 + 1] = acc[q][1];
            rr[8 * PN + q * 8] = acc[q][2];
            rr[8 * PN + q * 8 + 1] = acc[q][3];
        }
    }
}
