// What the mma.sync GEMM kernel (sm80.cuh) and its split-k reduce (sm80_reduce.cuh) share: the
// problem's extents and strides, and the stores of C: `gm_st(p, o, v)` stores one element of C's
// type at element offset `o` of byte pointer `p` (rounded to nearest even; fp8 saturates to finite
// as the CPU engine does), `gm_st2` two neighbours at `o` (aligned to two elements).
//
// Integer C types (after 8-bit integer operands) round and saturate; `gm_sti`/`gm_sti2` store
// i32 accumulators into them exactly. `acc_t` is the accumulators' type.
//
// Reads: GEMM_M, GEMM_N, GEMM_K, GEMM_BATCH; GEMM_A, GEMM_B, GEMM_C (type codes, common.cuh);
// GEMM_A_RS, GEMM_A_CS, GEMM_A_BS and the same of B and C (strides in elements: rows, columns,
// batches).

#define M_ ((long long)GEMM_M)
#define N_ ((long long)GEMM_N)
#define K_ ((long long)GEMM_K)
#define BATCH GEMM_BATCH
#define A_RS ((long long)GEMM_A_RS)
#define A_CS ((long long)GEMM_A_CS)
#define A_BS ((long long)GEMM_A_BS)
#define B_RS ((long long)GEMM_B_RS)
#define B_CS ((long long)GEMM_B_CS)
#define B_BS ((long long)GEMM_B_BS)
#define C_RS ((long long)GEMM_C_RS)
#define C_CS ((long long)GEMM_C_CS)
#define C_BS ((long long)GEMM_C_BS)
#define ESA DT_SIZE(GEMM_A)
#define ESB DT_SIZE(GEMM_B)
#define ESC DT_SIZE(GEMM_C)

// The accumulators: exact i32 sums for 8-bit integer operands, else f32; `gm_accf` one as f32
// (for the epilogue; rounded to nearest even past 2^24, as the CPU engine rounds an i32 to f32).
#if DT_INT(GEMM_A)
#define GM_INT_ACC 1
typedef int acc_t;
__device__ __forceinline__ float gm_accf(int v) { return __int2float_rn(v); }
#else
#define GM_INT_ACC 0
typedef float acc_t;
__device__ __forceinline__ float gm_accf(float v) { return v; }
#endif

// Integer stores of an i32 `v` into an integer C, saturated to its range: `gm_sti` one element at
// element offset `o`, `gm_sti2` two neighbours.
#if DT_INT(GEMM_C)
#if GEMM_C == DT_i8
typedef signed char gm_ci_t;
#define GM_CI_LO -128
#define GM_CI_HI 127
#elif GEMM_C == DT_u8
typedef unsigned char gm_ci_t;
#define GM_CI_LO 0
#define GM_CI_HI 255
#endif
#if GEMM_C == DT_i32
typedef int gm_ci_t;
__device__ __forceinline__ int gm_sat(int v) { return v; }
#else
__device__ __forceinline__ gm_ci_t gm_sat(int v) { return (gm_ci_t)min(max(v, GM_CI_LO), GM_CI_HI); }
#endif
__device__ __forceinline__ void gm_sti(char* __restrict__ p, long long o, int v) { ((gm_ci_t*)p)[o] = gm_sat(v); }
__device__ __forceinline__ void gm_sti2(char* __restrict__ p, long long o, int v0, int v1) {
#if GEMM_C == DT_i32
    *(int2*)((int*)p + o) = make_int2(v0, v1);
#else
    *(unsigned short*)((gm_ci_t*)p + o) = (unsigned short)((unsigned)(unsigned char)gm_sat(v0) | ((unsigned)(unsigned char)gm_sat(v1) << 8));
#endif
}
#endif

#if GEMM_C == DT_f16
__device__ __forceinline__ void gm_st(char* __restrict__ p, long long o, float v) { ((__half*)p)[o] = __float2half_rn(v); }
__device__ __forceinline__ void gm_st2(char* __restrict__ p, long long o, float v0, float v1) { *(__half2*)((__half*)p + o) = __floats2half2_rn(v0, v1); }
#elif GEMM_C == DT_bf16
__device__ __forceinline__ void gm_st(char* __restrict__ p, long long o, float v) { ((__nv_bfloat16*)p)[o] = __float2bfloat16_rn(v); }
__device__ __forceinline__ void gm_st2(char* __restrict__ p, long long o, float v0, float v1) { *(__nv_bfloat162*)((__nv_bfloat16*)p + o) = __floats2bfloat162_rn(v0, v1); }
#elif GEMM_C == DT_fp8_e4m3 || GEMM_C == DT_fp8_e5m2
#if GEMM_C == DT_fp8_e4m3
#define GM_C_FP8 __NV_E4M3
#else
#define GM_C_FP8 __NV_E5M2
#endif
__device__ __forceinline__ void gm_st(char* __restrict__ p, long long o, float v) { ((__nv_fp8_storage_t*)p)[o] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, GM_C_FP8); }
__device__ __forceinline__ void gm_st2(char* __restrict__ p, long long o, float v0, float v1) {
    *(unsigned short*)((__nv_fp8_storage_t*)p + o) =
        (unsigned short)((unsigned)__nv_cvt_float_to_fp8(v0, __NV_SATFINITE, GM_C_FP8) | ((unsigned)__nv_cvt_float_to_fp8(v1, __NV_SATFINITE, GM_C_FP8) << 8));
}
#elif DT_INT(GEMM_C)
// An integer C: rounded half away from zero and saturated to C's range, NaN to 0, as the CPU
// engine converts (cvt to s32 saturates and takes NaN to 0; then C's narrower range).
__device__ __forceinline__ int gm_f2i(float v) { return __float2int_rz(roundf(v)); }
__device__ __forceinline__ void gm_st(char* __restrict__ p, long long o, float v) { gm_sti(p, o, gm_f2i(v)); }
__device__ __forceinline__ void gm_st2(char* __restrict__ p, long long o, float v0, float v1) { gm_sti2(p, o, gm_f2i(v0), gm_f2i(v1)); }
#else
__device__ __forceinline__ void gm_st(char* __restrict__ p, long long o, float v) { ((float*)p)[o] = v; }
__device__ __forceinline__ void gm_st2(char* __restrict__ p, long long o, float v0, float v1) { *(float2*)((float*)p + o) = make_float2(v0, v1); }
#endif
