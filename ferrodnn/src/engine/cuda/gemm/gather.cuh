// The index maps of gathered GEMM operands (see gather.rs): where element (mn, k) of operand A
// (X = 0) or B (X = 1) lies, and whether it is inside the tensor (else it reads as zero).
//
// Comes after common.cuh and reads, for each operand (prefix GA_ for A, GB_ for B):
//   *MN_KIND, *K_KIND    the kind of its index along m or n and along k: GT_PLAIN, GT_PIXEL, GT_TAPS
//   *MN_S, *K_S          a plain index's stride
//   *PX_N, *PX_G<d>, *PX_MUL<d>, *PX_OFF<d>   the pixel index: image stride, grid extents and the
//                        coordinate o * MUL + OFF on axis d (d = 0, 1, 2, outermost first)
//   *TP_T<d>, *TP_CH, *TP_CS, *TP_TM, *TP_DIL<d>   the tap index: taps per axis, channels, the
//                        channels' stride, 1 when taps are outer (i = t * CH + ch), the coordinate
//                        t * DIL on axis d
//   *E<d>, *S<d>, *DIV<d>, *BASE<d>   the spatial axes: extent, stride, divisor and base of the
//                        coordinate
//   *BLK, *BLK_MN, *BLK_CH, *BLK_MN_WRAP, *BLK_CH_WRAP   1: block-diagonal (gather.rs, Block):
//                        the plain m/n index's value i in block i / BLK_MN, the tap index's
//                        channel ch in block ch / BLK_CH, elements of two blocks zero; a WRAP
//                        index addresses by its place in its block
// All are literals, so every division below is by a constant.

#define GT_PLAIN 0
#define GT_PIXEL 1
#define GT_TAPS 2
// Operand X's define `name`.
#define GX(name) (X == 0 ? GA_##name : GB_##name)

// One index's share of an element's address: an offset in elements, coordinates on the axes, and
// (block-diagonal operands) its block.
struct gt_part {
    long long off;
    int c0, c1, c2;
    int blk;
};

// Index `i` of operand X along its m/n index (SIDE 0) or its k index (SIDE 1).
template <int X, int SIDE> __device__ __forceinline__ gt_part gt_index(unsigned i) {
    constexpr int KIND = SIDE == 0 ? GX(MN_KIND) : GX(K_KIND);
    gt_part p;
    p.blk = 0;
    if constexpr (KIND == GT_PLAIN) {
        unsigned j = i;
        if constexpr (GX(BLK) && SIDE == 0) {
            p.blk = (int)(i / (unsigned)GX(BLK_MN));
            if constexpr (GX(BLK_MN_WRAP)) j = i % (unsigned)GX(BLK_MN);
        }
        p.off = (long long)j * (SIDE == 0 ? GX(MN_S) : GX(K_S));
        p.c0 = p.c1 = p.c2 = 0;
    } else if constexpr (KIND == GT_PIXEL) {
        unsigned q = i;
        const int o2 = (int)(q % (unsigned)GX(PX_G2));
        q /= (unsigned)GX(PX_G2);
        const int o1 = (int)(q % (unsigned)GX(PX_G1));
        q /= (unsigned)GX(PX_G1);
        const int o0 = (int)(q % (unsigned)GX(PX_G0));
        q /= (unsigned)GX(PX_G0);
        p.off = (long long)q * GX(PX_N);
        p.c0 = o0 * GX(PX_MUL0) + GX(PX_OFF0);
        p.c1 = o1 * GX(PX_MUL1) + GX(PX_OFF1);
        p.c2 = o2 * GX(PX_MUL2) + GX(PX_OFF2);
    } else {
        constexpr unsigned TAPS = (unsigned)(GX(TP_T0) * GX(TP_T1) * GX(TP_T2));
        unsigned t, ch;
        if constexpr (GX(TP_TM)) {
            ch = i % (unsigned)GX(TP_CH);
            t = i / (unsigned)GX(TP_CH);
        } else {
            t = i % TAPS;
            ch = i / TAPS;
        }
        if constexpr (GX(BLK)) {
            p.blk = (int)(ch / (unsigned)GX(BLK_CH));
            if constexpr (GX(BLK_CH_WRAP)) ch %= (unsigned)GX(BLK_CH);
        }
        const int t2 = (int)(t % (unsigned)GX(TP_T2));
        t /= (unsigned)GX(TP_T2);
        const int t1 = (int)(t % (unsigned)GX(TP_T1));
        const int t0 = (int)(t / (unsigned)GX(TP_T1));
        p.off = (long long)ch * GX(TP_CS);
        p.c0 = t0 * GX(TP_DIL0);
        p.c1 = t1 * GX(TP_DIL1);
        p.c2 = t2 * GX(TP_DIL2);
    }
    return p;
}

// Axis D of operand X at coordinate `c` (before its base): adds the axis's share to `off`;
// false when the coordinate is not a whole multiple of the divisor or falls outside the extent.
template <int X, int D> __device__ __forceinline__ bool gt_axis(int c, long long& off) {
    constexpr int E = D == 0 ? GX(E0) : D == 1 ? GX(E1) : GX(E2);
    constexpr long long S = D == 0 ? GX(S0) : D == 1 ? GX(S1) : GX(S2);
    constexpr int DIV = D == 0 ? GX(DIV0) : D == 1 ? GX(DIV1) : GX(DIV2);
    constexpr int BASE = D == 0 ? GX(BASE0) : D == 1 ? GX(BASE1) : GX(BASE2);
    c += BASE;
    bool ok = true;
    if constexpr (DIV > 1) {
        ok = c >= 0 && c % DIV == 0;
        c /= DIV;
    }
    off += (long long)c * S;
    return ok && (unsigned)c < (unsigned)E;
}

// The element of operand X made of index parts `a` and `b`: its offset in elements, and whether
// it lies inside the tensor.
template <int X> __device__ __forceinline__ bool gt_offset(const gt_part& a, const gt_part& b, long long& off) {
    off = a.off + b.off;
    const bool ok0 = gt_axis<X, 0>(a.c0 + b.c0, off);
    const bool ok1 = gt_axis<X, 1>(a.c1 + b.c1, off);
    const bool ok2 = gt_axis<X, 2>(a.c2 + b.c2, off);
    if constexpr (GX(BLK)) {
        // (A block-diagonal operand: zero off the diagonal blocks.)
        return ok0 && ok1 && ok2 && a.blk == b.blk;
    }
    return ok0 && ok1 && ok2;
}
