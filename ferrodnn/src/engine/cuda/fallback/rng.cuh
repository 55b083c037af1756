// The rng op in double, for the generic fallback (fallback/rng.rs); after philox.cuh. One
// thread per element of `y` (grid-stride over the flat row-major logical index, whatever y's
// strides), drawing the uniform of its index.
//
// The instantiation defines:
//   RNG_BERNOULLI      1: 1 with probability RNG_PROBABILITY, else 0; 0: uniform in
//                      (RNG_LOW, RNG_HIGH)
//   LD_SEED, LD_OFFSET, ST_Y

// The value of uniform `u`, as the CPU computes it (unfused).
#if RNG_BERNOULLI
#define RNG_VALUE(u) ((u < RNG_PROBABILITY) ? 1.0 : 0.0)
#else
#define RNG_VALUE(u) __dadd_rn(RNG_LOW, __dmul_rn(RNG_HIGH - RNG_LOW, u))
#endif

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    // The CPU takes the first element of each (offset 0 of the buffer).
    u64 seed = fd_seed_bits(LD_SEED(seed_p, 0));
    u64 offset = fd_seed_bits(LD_OFFSET(offset_p, 0));
    i64 n = numel(ty);
    GRID_STRIDE(i, n) {
        double u = fd_philox_uniform(seed, offset, (u64)i);
        double v = RNG_VALUE(u);
        ST_Y(y, offset_of(ty, i), v);
    }
}
