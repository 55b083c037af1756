// The device Philox 4x32-10 of the generic fallback, bit-exact with the CPU engine's
// `philox4x32` and with the same counter mapping (engine::cpu::rng): shared by rng.cuh and
// sdpa.cuh's dropout. Reads no defines.
//
// The uniform of flat index `index` is word `index % 4` of
// `philox4x32([lo(index/4), hi(index/4), lo(offset), hi(offset)], [lo(seed), hi(seed)])`,
// mapped by `(word + 0.5) / 2^32`.

typedef unsigned long long u64;
typedef unsigned int u32;

// A loaded seed or offset value as its i64 two's-complement bits, as the CPU's
// `v as i64 as u64` does.
__device__ __forceinline__ u64 fd_seed_bits(double v) {
    // Rust's `as i64` saturates and maps NaN to 0.
    if (isnan(v)) return 0ULL;
    if (v >= 9223372036854775807.0) return (u64)9223372036854775807LL;
    if (v <= -9223372036854775808.0) return (u64)(-9223372036854775807LL - 1LL);
    return (u64)(long long)v;
}

__device__ __forceinline__ double fd_philox_uniform(u64 seed, u64 offset, u64 index) {
    u64 block = index >> 2;
    u32 c0 = (u32)block, c1 = (u32)(block >> 32), c2 = (u32)offset, c3 = (u32)(offset >> 32);
    u32 k0 = (u32)seed, k1 = (u32)(seed >> 32);
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        u64 p0 = (u64)0xD2511F53u * (u64)c0;
        u64 p1 = (u64)0xCD9E8D57u * (u64)c2;
        u32 hi0 = (u32)(p0 >> 32), lo0 = (u32)p0;
        u32 hi1 = (u32)(p1 >> 32), lo1 = (u32)p1;
        u32 n0 = hi1 ^ c1 ^ k0;
        u32 n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    u32 w;
    switch ((int)(index & 3ULL)) {
        case 0: w = c0; break;
        case 1: w = c1; break;
        case 2: w = c2; break;
        default: w = c3; break;
    }
    return ((double)w + 0.5) / 4294967296.0;
}
