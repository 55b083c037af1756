// The decode kernel (flash-decoding; attention/decode.rs): a CTA per (kv split, kv head, batch)
// computes every query row of the query heads sharing the kv head (one 16-row mma tile), its 4
// warps splitting each K/V tile by keys with their own online softmax, merged at the end; with
// one split it writes o and stats, else its split's partial o, max and sum (decode_combine.cuh
// merges them).
//
// Reads common.cuh's defines and:
//   FA_NW, FA_NT, FA_KW, FA_BN, FA_STAGES   warps, threads, keys per warp and per K/V tile,
//                                           pipeline stages
//   FA_NSPLIT, FA_R, FA_ROWS                splits, rows of the tile (group * s_q), rows of o
//   FA_LDQ, FA_LDO, FA_QREG                 shared-memory row strides; Q fragments in registers
//   O_S0..3, O_PAIR, ST_O                   o's strides and store
//   FA_HAS_STATS, ST_STATS, ST_S0..2        the log-sum-exp stats output

FA_DEFINE_STORE(o, O_PAIR, ST_O, O_S3)

extern "C" __global__ void __launch_bounds__(FA_NT) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    extern __shared__ __align__(16) unsigned char fa_smem[];
    u16* sQ = reinterpret_cast<u16*>(fa_smem);
    u16* sK = sQ + 16 * FA_LDQ;
    u16* sV = sK + FA_STAGES * FA_BN * FA_LDK;
    FA_INIT
    const u16* Qg = reinterpret_cast<const u16*>(q_p);
    const u16* Kg = reinterpret_cast<const u16*>(k_p);
    const u16* Vg = reinterpret_cast<const u16*>(v_p);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
    const i64 split = blockIdx.x, kh = blockIdx.y, bi = blockIdx.z;
    i64 lq, lkv;
    fa_lens(A, bi, lq, lkv);
    const i64 off = fa_diag_off(lq, lkv);
    // Keys some row of the batch sees, then this split's whole tiles of them: [s_lo, s_hi).
    i64 s_lo = 0, s_hi = 0;
    if (lq > 0) {
        i64 jlo, jhi;
        fa_key_range(0, fa_min(FA_SQ, lq) - 1, lkv, off, jlo, jhi);
        if (jlo < jhi) {
            const i64 chunk = ((jhi - jlo + FA_NSPLIT - 1) / FA_NSPLIT + FA_BN - 1) / FA_BN * FA_BN;
            s_lo = jlo + split * chunk;
            s_hi = fa_min(jhi, s_lo + chunk);
            if (s_lo >= s_hi) { s_lo = 0; s_hi = 0; }
        }
    }
    const i64 nt = (s_hi - s_lo + FA_BN - 1) / FA_BN;

    // Row r of the tile is query row r % s_q of query head kh * group + r / s_q; rows past
    // FA_R (zeros) are computed but never stored.
    fa_load<16, FA_D, FA_DR, FA_LDQ, FA_NT, Q_VEC>(sQ, Qg, Q_S3, [&](int r) -> i64 {
        if (r >= FA_R) return (i64)-1;
        const i64 i = (i64)r % FA_SQ;
        return i < lq ? bi * Q_S0 + (kh * FA_GROUP + (i64)r / FA_SQ) * Q_S1 + i * Q_S2 : (i64)-1;
    });
    auto load_kv = [&](i64 t, int buf) {
        const i64 j0 = s_lo + t * FA_BN;
        fa_load<FA_BN, FA_D, FA_DR, FA_LDK, FA_NT, K_VEC>(sK + buf * FA_BN * FA_LDK, Kg, K_S3, [&](int r) -> i64 {
            const i64 j = j0 + r;
            return j < s_hi ? fa_krow(A, bi, kh, j) : (i64)-1;
        });
        fa_load<FA_BN, FA_DV, FA_DVR, FA_LDV, FA_NT, V_VEC>(sV + buf * FA_BN * FA_LDV, Vg, V_S3, [&](int r) -> i64 {
            const i64 j = j0 + r;
            return j < s_hi ? fa_vrow(A, bi, kh, j) : (i64)-1;
        });
    };
    #pragma unroll
    for (int s = 0; s < FA_STAGES - 1; ++s) {
        if (s < nt) load_kv(s, s);
        fa_commit();
    }

    // The (head, query row) of this thread's rows g and g + 8 (rows past FA_R repeat the last).
    i64 ir[2];
#if FA_HAS_BIAS || FA_ALIBI || FA_DROPOUT
    i64 hr[2];
#endif
    #pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int r = g + hh * 8 < FA_R ? g + hh * 8 : FA_R - 1;
#if FA_HAS_BIAS || FA_ALIBI || FA_DROPOUT
        hr[hh] = kh * FA_GROUP + (i64)r / FA_SQ;
#endif
        ir[hh] = (i64)r % FA_SQ;
    }

    // This warp's online softmax over its keys of each tile: running max (log2 units), this
    // thread's part of the running sum, and the output accumulators.
    float m[2] = {FA_NINF, FA_NINF};
    float l[2] = {0.0f, 0.0f};
    float oacc[FA_DV / 8][4];
    #pragma unroll
    for (int n = 0; n < FA_DV / 8; ++n) { oacc[n][0] = 0.0f; oacc[n][1] = 0.0f; oacc[n][2] = 0.0f; oacc[n][3] = 0.0f; }
#if FA_QREG
    u32 qf[FA_D / 16][4];
#endif
    const u16* sQw = sQ + (lane & 15) * FA_LDQ + (lane >> 4) * 8;
    const int kw0 = warp * FA_KW;

    for (i64 t = 0; t < nt; ++t) {
        fa_wait<FA_STAGES - 2>();
        __syncthreads();
        // Every warp is done with the buffer of tile t - 1: refill it with tile t + STAGES - 1.
        if (t + FA_STAGES - 1 < nt) load_kv(t + FA_STAGES - 1, (int)((t + FA_STAGES - 1) % FA_STAGES));
        fa_commit();
        const int buf = (int)(t % FA_STAGES);
#if FA_QREG
        if (t == 0) {
            #pragma unroll
            for (int kk = 0; kk < FA_D / 16; ++kk) fa_ldsm(qf[kk], sQw + kk * 16);
        }
#endif
        const u16* sKb = sK + buf * FA_BN * FA_LDK + kw0 * FA_LDK;
        const u16* sVb = sV + buf * FA_BN * FA_LDV + kw0 * FA_LDV;

        // S = Q K^T: 16 rows x KW keys.
        float sacc[FA_KW / 8][4];
        #pragma unroll
        for (int n = 0; n < FA_KW / 8; ++n) { sacc[n][0] = 0.0f; sacc[n][1] = 0.0f; sacc[n][2] = 0.0f; sacc[n][3] = 0.0f; }
        #pragma unroll
        for (int kk = 0; kk < FA_D / 16; ++kk) {
#if FA_QREG
            const u32* a = qf[kk];
#else
            u32 a[4];
            fa_ldsm(a, sQw + kk * 16);
#endif
            #pragma unroll
            for (int nn = 0; nn < FA_KW / 16; ++nn) {
                u32 b[4];
                fa_ldsm(b, sKb + (nn * 16 + (lane & 7) + ((lane >> 4) << 3)) * FA_LDK + kk * 16 + ((lane >> 3) & 1) * 8);
                fa_mma(sacc[2 * nn], a, b[0], b[1]);
                fa_mma(sacc[2 * nn + 1], a, b[2], b[3]);
            }
        }

        // Scores in log2 units, masked ones (and keys past the split) -inf.
        const i64 j0 = s_lo + t * FA_BN + kw0;
        const bool need = j0 + FA_KW > s_hi || fa_tile_needs_mask(0, FA_SQ, j0, FA_KW, lq, lkv, off);
        if (need || FA_HAS_BIAS || FA_ALIBI) {
            #pragma unroll
            for (int n = 0; n < FA_KW / 8; ++n) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const i64 i = ir[e >> 1];
                    const i64 j = j0 + n * 8 + tg * 2 + (e & 1);
                    float x = sacc[n][e] * A.scale_log2;
                    if (need && (j >= s_hi || !fa_visible(i, j, lq, lkv, off))) x = FA_NINF;
#if FA_HAS_BIAS || FA_ALIBI
                    else x = fmaf(fa_add(A, bi, hr[e >> 1], i, j), FA_LOG2E, x);
#endif
                    sacc[n][e] = x;
                }
            }
        } else {
            #pragma unroll
            for (int n = 0; n < FA_KW / 8; ++n) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) sacc[n][e] *= A.scale_log2;
            }
        }

        // Online softmax: new row max (over the quad that shares a row), rescale, exponentiate.
        float mx[2] = {m[0], m[1]};
        #pragma unroll
        for (int n = 0; n < FA_KW / 8; ++n) {
            mx[0] = fmaxf(mx[0], fmaxf(sacc[n][0], sacc[n][1]));
            mx[1] = fmaxf(mx[1], fmaxf(sacc[n][2], sacc[n][3]));
        }
        float mu[2];
        #pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 1));
            mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 2));
            // A row with every key masked so far keeps max -inf: exponentiate against 0.
            mu[hh] = mx[hh] == FA_NINF ? 0.0f : mx[hh];
            const float alpha = fa_exp2(m[hh] - mu[hh]);
            m[hh] = mx[hh];
            l[hh] *= alpha;
            #pragma unroll
            for (int n = 0; n < FA_DV / 8; ++n) { oacc[n][2 * hh] *= alpha; oacc[n][2 * hh + 1] *= alpha; }
        }
        #pragma unroll
        for (int n = 0; n < FA_KW / 8; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = fa_exp2(sacc[n][e] - mu[e >> 1]);
                l[e >> 1] += p;
                sacc[n][e] = p;
            }
        }
#if FA_DROPOUT
        // Dropped elements leave the sum (taken before dropout) but not the output.
        #pragma unroll
        for (int n = 0; n < FA_KW / 8; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (sacc[n][e] != 0.0f) {
                    const i64 j = j0 + n * 8 + tg * 2 + (e & 1);
                    if (!fa_keep(A, bi, hr[e >> 1], ir[e >> 1], j)) sacc[n][e] = 0.0f;
                }
            }
        }
#endif

        // O += P V: P from the S accumulators (A fragments), V through ldmatrix.trans.
        #pragma unroll
        for (int kt = 0; kt < FA_KW / 16; ++kt) {
            u32 a[4];
            a[0] = fa_pack(sacc[2 * kt][0], sacc[2 * kt][1]);
            a[1] = fa_pack(sacc[2 * kt][2], sacc[2 * kt][3]);
            a[2] = fa_pack(sacc[2 * kt + 1][0], sacc[2 * kt + 1][1]);
            a[3] = fa_pack(sacc[2 * kt + 1][2], sacc[2 * kt + 1][3]);
            #pragma unroll
            for (int nd = 0; nd < FA_DV / 16; ++nd) {
                u32 b[4];
                fa_ldsm_t(b, sVb + (kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * FA_LDV + nd * 16 + (lane >> 4) * 8);
                fa_mma(oacc[2 * nd], a, b[0], b[1]);
                fa_mma(oacc[2 * nd + 1], a, b[2], b[3]);
            }
        }
    }
    fa_wait<0>();
    __syncthreads();

    // Merge the warps (the stage buffers are free now): per warp and row its max, sum and o.
    float* sO = reinterpret_cast<float*>(sK);
    float* sM = sO + FA_NW * 16 * FA_LDO;
    float* sL = sM + FA_NW * 16;
    #pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        float lsum = l[hh];
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
        const int r = warp * 16 + g + hh * 8;
        if (tg == 0) { sM[r] = m[hh]; sL[r] = lsum; }
        #pragma unroll
        for (int n = 0; n < FA_DV / 8; ++n) {
            *reinterpret_cast<float2*>(sO + r * FA_LDO + n * 8 + tg * 2) = make_float2(oacc[n][2 * hh], oacc[n][2 * hh + 1]);
        }
    }
    __syncthreads();
    for (int e = tid; e < FA_R * (FA_DV / 2); e += FA_NT) {
        const int r = e / (FA_DV / 2), c = (e - r * (FA_DV / 2)) * 2;
        float mxr = FA_NINF;
        #pragma unroll
        for (int w = 0; w < FA_NW; ++w) mxr = fmaxf(mxr, sM[w * 16 + r]);
        const float mur = mxr == FA_NINF ? 0.0f : mxr;
        float ls = 0.0f, o0 = 0.0f, o1 = 0.0f;
        #pragma unroll
        for (int w = 0; w < FA_NW; ++w) {
            const float a = fa_exp2(sM[w * 16 + r] - mur);
            const float2 ov = *reinterpret_cast<const float2*>(sO + (w * 16 + r) * FA_LDO + c);
            ls += sL[w * 16 + r] * a;
            o0 += ov.x * a;
            o1 += ov.y * a;
        }
        const i64 hq = kh * FA_GROUP + (i64)r / FA_SQ, i = (i64)r % FA_SQ;
#if FA_NSPLIT == 1
        // Empty rows (padded, or every key masked) give o = 0, stats = +inf.
        const bool empty = i >= lq || mxr == FA_NINF || !(ls > 0.0f);
        const float inv = empty ? 0.0f : A.keep_scale / ls;
        if (c < FA_DVR) fa_store_o(o_p, bi * O_S0 + hq * O_S1 + i * O_S2 + c * O_S3, o0 * inv, o1 * inv);
#if FA_HAS_STATS
        if (c == 0) ST_STATS(stats_p, bi * ST_S0 + hq * ST_S1 + i * ST_S2, empty ? (double)FA_NINF : (double)(mxr * FA_LN2 + logf(ls)));
#endif
#else
        const i64 row = (bi * FA_HQ + hq) * FA_SQ + i;
        float* po = reinterpret_cast<float*>(part_p);
        *reinterpret_cast<float2*>(po + (split * FA_ROWS + row) * FA_DV + c) = make_float2(o0, o1);
        if (c == 0) *reinterpret_cast<float2*>(po + FA_NSPLIT * FA_ROWS * FA_DV + (split * FA_ROWS + row) * 2) = make_float2(mxr, ls);
#endif
    }
}
