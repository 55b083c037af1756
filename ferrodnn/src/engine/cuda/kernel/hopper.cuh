// Hopper (sm_90a) helpers shared by the GEMM and attention kernels: the tensor-map parameter type,
// shared-memory addresses, mbarriers, TMA copies and wgmma fences.

// A TMA tensor map as a kernel takes it (`const __grid_constant__ TmaMap`): the 128-byte,
// 64-byte aligned CUtensorMap the plan encodes when it executes.
struct alignas(64) TmaMap { unsigned long long opaque[16]; };
__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred done;\nWAIT_LOOP:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_LOOP;\n}\n" :: "r"(bar), "r"(parity) : "memory");
}
// One TMA tile copy into shared memory, completing on barrier `bar`; `batched` maps have a
// third (batch) coordinate.
__device__ __forceinline__ void tma_load(unsigned dst, const TmaMap* map, unsigned bar, int c0, int c1, int c2, bool batched) {
    if (batched) {
        asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
            :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
    } else {
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
            :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar) : "memory");
    }
}
// As tma_load, multicast to the CTAs of the cluster in `mask` (same shared offsets there).
__device__ __forceinline__ void tma_load_mc(unsigned dst, const TmaMap* map, unsigned bar, int c0, int c1, int c2, bool batched, unsigned short mask) {
    if (batched) {
        asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3, %4}], [%5], %6;"
            :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(mask) : "memory");
    } else {
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;"
            :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar), "h"(mask) : "memory");
    }
}
// One TMA tile store from shared memory (bulk-group completion).
__device__ __forceinline__ void tma_store(unsigned src, const TmaMap* map, int c0, int c1, int c2, bool batched) {
    if (batched) {
        asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];"
            :: "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(src) : "memory");
    } else {
        asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
            :: "l"(map), "r"(c0), "r"(c1), "r"(src) : "memory");
    }
}
// A barrier among one consumer warpgroup's 128 threads (named barriers 1 and 2, constant ids).
__device__ __forceinline__ void consumer_sync(int cw) {
    if (cw == 0) asm volatile("bar.sync 1, 128;" ::: "memory");
    else asm volatile("bar.sync 2, 128;" ::: "memory");
}
__device__ __forceinline__ unsigned bf16x2_bits(float a, float b) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *(unsigned*)&v;
}
__device__ __forceinline__ unsigned f16x2_bits(float a, float b) {
    __half2 v = __floats2half2_rn(a, b);
    return *(unsigned*)&v;
}
// As bf16x2_bits / f16x2_bits with relu: negative values (and -inf) to +0, NaN kept. (cvt puts
// its first source in the upper half.)
__device__ __forceinline__ unsigned bf16x2_relu_bits(float a, float b) {
    unsigned r;
    asm("cvt.rn.relu.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    return r;
}
__device__ __forceinline__ unsigned f16x2_relu_bits(float a, float b) {
    unsigned r;
    asm("cvt.rn.relu.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    return r;
}
// A wgmma shared-memory descriptor with the 128-byte swizzle.
__device__ __forceinline__ unsigned long long make_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((addr & 0x3FFFFu) >> 4)
         | ((unsigned long long)((lbo & 0x3FFFFu) >> 4) << 16)
         | ((unsigned long long)((sbo & 0x3FFFFu) >> 4) << 32)
         | (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
