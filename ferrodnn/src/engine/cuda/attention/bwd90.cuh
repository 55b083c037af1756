// Device helpers of the Hopper backward's dK/dV and dQ kernels (attention/bwd90.rs): the scores of
// a 64 x 64 block to P (masks, bias, ALiBi, dropout keep bits), P as A fragments, dS from P and
// dP, and 64 x 64 products from shared memory.
//
// Reads common.cuh's defines.

template <typename FQ, typename FK, typename FL>
__device__ __forceinline__ unsigned fa90_probs(const FaIn& A, float (&sc)[32], bool need, i64 lq, i64 lkv, i64 off, i64 bi, i64 h, FQ qi, FK kj, FL lse) {
#if !(FA_HAS_BIAS || FA_ALIBI || FA_DROPOUT)
    // Nothing to add or drop: straight-line code (an `if` per element compiles to branches
    // under a causal mask, which cost the backward kernels about one branch stall per issued
    // instruction), one loop for blocks that need no mask (the same for every thread of the
    // warpgroup, so one uniform branch) and one with the mask as a select. The mask's 64-bit
    // index arithmetic, evaluated for every element of every block, was most of these
    // kernels' instructions.
    if (!need) {
        #pragma unroll
        for (int n = 0; n < 8; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) sc[4 * n + e] = fa_exp2(sc[4 * n + e] * FA_SOFTMAX_SCALE - lse(n, e));
        }
    } else {
        #pragma unroll
        for (int n = 0; n < 8; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const bool vis = fa_visible(qi(n, e), kj(n, e), lq, lkv, off);
                const float pv = fa_exp2(sc[4 * n + e] * FA_SOFTMAX_SCALE - lse(n, e));
                sc[4 * n + e] = vis ? pv : 0.0f;
            }
        }
    }
    (void)A; (void)bi; (void)h;
    return 0u;
#else
    unsigned keep = 0u;
    #pragma unroll
    for (int n = 0; n < 8; ++n) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
            const i64 i = qi(n, e), j = kj(n, e);
            float pv = 0.0f;
            if (!need || fa_visible(i, j, lq, lkv, off)) {
                float s2 = sc[4 * n + e] * FA_SOFTMAX_SCALE;
#if FA_HAS_BIAS || FA_ALIBI
                s2 = fmaf(fa_add(A, bi, h, i, j), FA_LOG2E, s2);
#endif
                pv = fa_exp2(s2 - lse(n, e));
#if FA_DROPOUT
                if (fa_keep(A, bi, h, i, j)) keep |= 1u << (4 * n + e);
#endif
            }
            sc[4 * n + e] = pv;
        }
    }
    (void)A; (void)bi; (void)h;
    return keep;
#endif
}

// P as the A operand of dV += P^T dO (with the dropout factor).
__device__ __forceinline__ void fa90_p_frags(const FaIn& A, u32 (&a)[4][4], const float (&sc)[32], unsigned keep) {
    float t[32];
    #pragma unroll
    for (int x = 0; x < 32; ++x) {
#if FA_DROPOUT
        t[x] = ((keep >> x) & 1u) ? sc[x] * A.keep_scale : 0.0f;
#else
        t[x] = sc[x];
#endif
    }
    (void)A; (void)keep;
    fa90_pack<64>(a, t);
}

// dS = P (dP' - D) into dp (dP' = dP with the dropout factor, 0 where dropped), without the
// attention scale: dK and dQ take it once, when they are stored, instead of every element of
// every block here.
template <typename FL>
__device__ __forceinline__ void fa90_ds(const FaIn& A, float (&dp)[32], const float (&sc)[32], unsigned keep, FL dd) {
    #pragma unroll
    for (int n = 0; n < 8; ++n) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
            float d = dp[4 * n + e];
#if FA_DROPOUT
            d = ((keep >> (4 * n + e)) & 1u) ? d * A.keep_scale : 0.0f;
#endif
            dp[4 * n + e] = sc[4 * n + e] * (d - dd(n, e));
        }
    }
    (void)A; (void)keep;
}

// 64 x 64 products from shared memory, k = W channels: rows of A at sa and of B at sb, each a
// K-major tile whose 64-channel chunks are ca / cb bytes apart.
template <int W>
__device__ __forceinline__ void fa90_block(float (&acc)[32], unsigned sa, unsigned ca, unsigned sb, unsigned cb) {
    #pragma unroll
    for (int kk = 0; kk < W / 16; ++kk) {
        fa90_wgmma_ss<64, false>(acc, make_desc(sa + (kk >> 2) * ca + (kk & 3) * 32u, 16u, 1024u), make_desc(sb + (kk >> 2) * cb + (kk & 3) * 32u, 16u, 1024u), kk > 0 ? 1 : 0);
    }
}
