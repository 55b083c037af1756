//! The rng op: one thread per element of `y` (grid-stride over the flat row-major logical
//! index, whatever `y`'s strides), drawing from a device Philox 4x32-10 that is bit-exact with
//! the CPU engine's `philox4x32` and uses the same counter mapping (`graph::ops::rng`). The
//! same generator serves sdpa's dropout ([`PHILOX`]).

use super::{c_double, Arg, Ctx, Launch, NodeKernels};
use crate::error::Result;
use crate::graph::ops::rng::{Distribution, RngAttrs};

/// Device Philox 4x32-10 and the uniform of a flat index, as in `engine::cpu::rng`:
/// word `index % 4` of `philox4x32([lo(index/4), hi(index/4), lo(offset), hi(offset)],
/// [lo(seed), hi(seed)])`, mapped by `(word + 0.5) / 2^32`. `fd_seed_bits` turns a loaded
/// seed/offset value into its i64 two's-complement bits as the CPU's `v as i64 as u64` does.
pub(super) const PHILOX: &str = r#"
typedef unsigned long long u64;
typedef unsigned int u32;
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
        if (round > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        u64 p0 = (u64)0xD2511F53u * (u64)c0;
        u64 p1 = (u64)0xCD9E8D57u * (u64)c2;
        u32 hi0 = (u32)(p0 >> 32), lo0 = (u32)p0;
        u32 hi1 = (u32)(p1 >> 32), lo1 = (u32)p1;
        u32 n0 = hi1 ^ c1 ^ k0;
        u32 n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
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
"#;

pub(super) fn rng(ctx: &Ctx, a: &RngAttrs) -> Result<NodeKernels> {
    let y = ctx.output("y")?;
    let seed = ctx.input("seed")?;
    let offset = ctx.input("offset")?;
    let entry = ctx.entry("rng");
    let value = match a.distribution {
        Distribution::Uniform { low, high } => {
            let (lo, hi) = (c_double(low), c_double(high));
            // Unfused, as the CPU computes it.
            format!("__dadd_rn({lo}, __dmul_rn({hi} - {lo}, u))")
        }
        Distribution::Bernoulli { probability } => format!("(u < {}) ? 1.0 : 0.0", c_double(probability)),
    };
    let source = format!(
        r#"{PHILOX}
extern "C" __global__ void {entry}(void* y, TRef ty, const void* seed_p, const void* offset_p) {{
    // The CPU takes the first element of each (offset 0 of the buffer).
    u64 seed = fd_seed_bits({ld_seed}(seed_p, 0));
    u64 offset = fd_seed_bits({ld_offset}(offset_p, 0));
    i64 n = numel(ty);
    GRID_STRIDE(i, n) {{
        double u = fd_philox_uniform(seed, offset, (u64)i);
        double v = {value};
        {st}(y, offset_of(ty, i), v);
    }}
}}
"#,
        ld_seed = ctx.ld(seed),
        ld_offset = ctx.ld(offset),
        st = ctx.st(y),
    );
    let args = vec![Arg::Ptr(y), Arg::Ref(y), Arg::Ptr(seed), Arg::Ptr(offset)];
    Ok(NodeKernels::one(Launch::elementwise(source, &entry, ctx.numel(y), args)))
}
