// The rng op in double, for the generic fallback (fallback/rng.rs); after philox.cuh. One
// thread per element of `y` (grid-stride over the flat row-major logical index, whatever y's
// strides), drawing the uniform of its index.
//
// The instantiation defines:
//   RNG_BERNOULLI      1: 1 with probability `probability`, else 0; 0: uniform in (low, high)
//                      (`probability`, `low` and `high` are the kernel's double parameters: a
//                      user may change them between executes)
//   LD_SEED, LD_OFFSET, ST_Y

// The value of uniform `u`, as the CPU computes it (unfused).
#if RNG_BERNOULLI
#define RNG_VALUE(u) ((u < probability) ? 1.0 : 0.0)
#else
#define RNG_VALUE(u) __dadd_rn(low, __dmul_rn(high - low, u))
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
