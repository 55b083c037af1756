// What the channel-statistics kernels (fused/channels.rs; batchnorm, genstats, instancenorm)
// share, after vectors.cuh: the geometry they walk and the access to per-channel tensors.
// channel_stats.cuh, channel_finalize.cuh and channel_apply.cuh follow it.
//
// The instantiation defines:
//   CH_GEOM   how x is walked:
//             CH_SLABS   NHWC, one group of P_ positions in NBLK slabs of SLAB positions;
//                        a block of BLOCK threads = ROWS rows of LANES threads, a thread owns a
//                        vector of channels (CV vectors of C_ channels), UNR loads in flight
//             CH_GROUPS  the same in G_ groups of P_ positions (NBLK blocks per group)
//             CH_PLANES  NCHW: PLANES planes (n, c) of HW_ elements, ITEMS items of VW
//                        elements each, a team of TS threads per plane (see ChanGeom and
//                        PlaneGeom in fused/channels.rs); for the shared finalize also
//                        G_ = 1, NBLK = N_ and P_ = N_ * HW_
//   CH_DY     1 where the pass reads dy beside x (the backward)
//   per-channel tensors T (see STAT_AT): LD_T or ST_T (the prelude's load or store) and the
//   strides T_S0 (along the group) and T_S1 (along C); 1-D channel tensors: T_S (along C)

#define CH_SLABS 1
#define CH_GROUPS 2
#define CH_PLANES 3

// The launch bounds of the statistics and apply passes: blocks of BLOCK threads for NHWC, 4 of
// them per SM (2 for the passes in groups that read dy), or of 256 threads for NCHW.
#if CH_GEOM == CH_SLABS
#define CH_LAUNCH_BOUNDS __launch_bounds__(BLOCK, 4)
#elif CH_GEOM == CH_GROUPS && CH_DY
#define CH_LAUNCH_BOUNDS __launch_bounds__(BLOCK, 2)
#elif CH_GEOM == CH_GROUPS
#define CH_LAUNCH_BOUNDS __launch_bounds__(BLOCK, 4)
#else
#define CH_LAUNCH_BOUNDS __launch_bounds__(256)
#endif

// The offset of element (g, c) of a per-(group, channel) tensor T ([G or 1, C, 1, ...]).
#define STAT_AT(T, g, c) (g) * T##_S0 + (c) * T##_S1

#if CH_GEOM == CH_PLANES
// Item i of a plane: VW elements to floats, VW floats to y.
#if VW > 1
__device__ __forceinline__ void ldv(const XT* p, i64 i, bool al, float* f) { cvt_x(ldx_raw(p + i * VEC, al), f); }
__device__ __forceinline__ void stv(YT* p, i64 i, bool al, const float* f) { st_y(p + i * VEC, al, f); }
#else
__device__ __forceinline__ void ldv(const XT* p, i64 i, bool al, float* f) {
    (void)al;
    f[0] = x2f(p[i]);
}
__device__ __forceinline__ void stv(YT* p, i64 i, bool al, const float* f) {
    (void)al;
    p[i] = f2y(f[0]);
}
#endif
#endif
