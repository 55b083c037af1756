// The wgmma instructions of the Hopper GEMM kernel (sm90.cuh) for its tile width N (GEMM_BN):
// `wgmma_tile(d, da, db, scale_d)`, one `wgmma.mma_async.m64nNk*` with both operands in shared
// memory (descriptors da, db), or, for tf32 with A's fragment in registers (GEMM_RS),
// `wgmma_tile_rs(d, a, db, scale_d)` (four values a thread: rows g and g + 8 of the warp's 16, k t
// and t + 4; g = lane / 4, t = lane % 4). d: the N / 2 accumulators of the thread; scale_d 0 starts
// them from zero.
//
// 8-bit integers (GEMM_INT) accumulate exact i32 sums in the same registers (the bits of d; the
// kernel converts them to f32 once the tile's k loop is done).
//
// Reads: GEMM_BN (16, 32, 64, 128 or 256), GEMM_A / GEMM_B (the operands' type codes, common.cuh),
// GEMM_A_MN / GEMM_B_MN (1: the operand is M- or N-major in shared memory, wgmma's transpose
// operands, which only 16-bit types have), GEMM_RS, GEMM_INT.

#define WG_STR_(x) #x
#define WG_STR(x) WG_STR_(x)

// The accumulators' operands: "%0, ..., %(n - 1)" and the "+f" constraints on d[b .. b + n - 1].
#define WG_REGS_8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define WG_REGS_16 WG_REGS_8 \
    ", %8, %9, %10, %11, %12, %13, %14, %15"
#define WG_REGS_32 WG_REGS_16 \
    ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_REGS_64 WG_REGS_32 \
    ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47" \
    ", %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_REGS_128 WG_REGS_64 \
    ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79" \
    ", %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95" \
    ", %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111" \
    ", %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
// (i32 sums: the registers of d as integers; no operand scales, which integer wgmma lacks.)
#if GEMM_INT
#define WG_O(i) "+r"(*reinterpret_cast<int*>(&d[i]))
#define WG_DT "s32"
#define WG_SCALES ""
#else
#define WG_O(i) "+f"(d[i])
#define WG_DT "f32"
#define WG_SCALES ", 1, 1"
#endif
#define WG_OUTS_8(b) WG_O(b), WG_O(b + 1), WG_O(b + 2), WG_O(b + 3), WG_O(b + 4), WG_O(b + 5), WG_O(b + 6), WG_O(b + 7)
#define WG_OUTS_16(b) WG_OUTS_8(b), WG_OUTS_8(b + 8)
#define WG_OUTS_32(b) WG_OUTS_16(b), WG_OUTS_16(b + 16)
#define WG_OUTS_64(b) WG_OUTS_32(b), WG_OUTS_32(b + 32)
#define WG_OUTS_128(b) WG_OUTS_64(b), WG_OUTS_64(b + 64)

// By the tile width: the accumulators' operands, and the numbers of the six operands after them.
#if GEMM_BN == 16
#define WG_REGS WG_REGS_8
#define WG_OUTS WG_OUTS_8(0)
#define WG_OP0 "%8"
#define WG_OP1 "%9"
#define WG_OP2 "%10"
#define WG_OP3 "%11"
#define WG_OP4 "%12"
#define WG_OP5 "%13"
#elif GEMM_BN == 32
#define WG_REGS WG_REGS_16
#define WG_OUTS WG_OUTS_16(0)
#define WG_OP0 "%16"
#define WG_OP1 "%17"
#define WG_OP2 "%18"
#define WG_OP3 "%19"
#define WG_OP4 "%20"
#define WG_OP5 "%21"
#elif GEMM_BN == 64
#define WG_REGS WG_REGS_32
#define WG_OUTS WG_OUTS_32(0)
#define WG_OP0 "%32"
#define WG_OP1 "%33"
#define WG_OP2 "%34"
#define WG_OP3 "%35"
#define WG_OP4 "%36"
#define WG_OP5 "%37"
#elif GEMM_BN == 128
#define WG_REGS WG_REGS_64
#define WG_OUTS WG_OUTS_64(0)
#define WG_OP0 "%64"
#define WG_OP1 "%65"
#define WG_OP2 "%66"
#define WG_OP3 "%67"
#define WG_OP4 "%68"
#define WG_OP5 "%69"
#elif GEMM_BN == 256
#define WG_REGS WG_REGS_128
#define WG_OUTS WG_OUTS_128(0)
#define WG_OP0 "%128"
#define WG_OP1 "%129"
#define WG_OP2 "%130"
#define WG_OP3 "%131"
#define WG_OP4 "%132"
#define WG_OP5 "%133"
#endif

// The operand types in the shape suffix.
#if GEMM_A == DT_bf16
#define WG_TA "bf16"
#elif GEMM_A == DT_f32
#define WG_TA "tf32"
#elif GEMM_A == DT_fp8_e4m3
#define WG_TA "e4m3"
#elif GEMM_A == DT_fp8_e5m2
#define WG_TA "e5m2"
#elif GEMM_A == DT_i8
#define WG_TA "s8"
#elif GEMM_A == DT_u8
#define WG_TA "u8"
#else
#define WG_TA "f16"
#endif
#if GEMM_B == DT_bf16
#define WG_TB "bf16"
#elif GEMM_B == DT_f32
#define WG_TB "tf32"
#elif GEMM_B == DT_fp8_e4m3
#define WG_TB "e4m3"
#elif GEMM_B == DT_fp8_e5m2
#define WG_TB "e5m2"
#elif GEMM_B == DT_i8
#define WG_TB "s8"
#elif GEMM_B == DT_u8
#define WG_TB "u8"
#else
#define WG_TB "f16"
#endif
// k per instruction: 32 bytes of a K-major row (16 of a 16-bit type, 8 of tf32, 32 of fp8 and
// 8-bit integers); the transpose operands of 16-bit types (32- and 8-bit types are K-major only).
#if GEMM_A == DT_f32
#define WG_K "8"
#define WG_TRANS ""
#elif GEMM_A == DT_fp8_e4m3 || GEMM_A == DT_fp8_e5m2 || GEMM_A == DT_i8 || GEMM_A == DT_u8
#define WG_K "32"
#define WG_TRANS ""
#else
#define WG_K "16"
#define WG_TRANS ", " WG_STR(GEMM_A_MN) ", " WG_STR(GEMM_B_MN)
#endif

#if GEMM_RS
__device__ __forceinline__ void wgmma_tile_rs(float (&d)[GEMM_BN / 2], const unsigned* a, unsigned long long db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, " WG_OP5 ", 0;\n"
        "wgmma.mma_async.sync.aligned.m64n" WG_STR(GEMM_BN) "k8.f32.tf32.tf32 {" WG_REGS "}, {" WG_OP0 ", " WG_OP1 ", " WG_OP2 ", " WG_OP3 "}, " WG_OP4 ", p, 1, 1;\n}\n"
        : WG_OUTS
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}
#else
__device__ __forceinline__ void wgmma_tile(float (&d)[GEMM_BN / 2], unsigned long long da, unsigned long long db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, " WG_OP2 ", 0;\n"
        "wgmma.mma_async.sync.aligned.m64n" WG_STR(GEMM_BN) "k" WG_K "." WG_DT "." WG_TA "." WG_TB " {" WG_REGS "}, " WG_OP0 ", " WG_OP1 ", p" WG_SCALES WG_TRANS ";\n}\n"
        : WG_OUTS
        : "l"(da), "l"(db), "r"(scale_d));
}
#endif
