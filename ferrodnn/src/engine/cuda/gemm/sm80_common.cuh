// What the mma.sync GEMM kernel (sm80.cuh) and its split-k reduce (sm80_reduce.cuh) share: the
// problem's extents and strides, and the stores of C: `gm_st(p, o, v)` stores one element of C's
// type at element offset `o` of byte pointer `p` (rounded to nearest even; fp8 saturates to finite
// as the CPU engine does), `gm_st2` two neighbours at `o` (aligned to two elements).
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
#else
__device__ __forceinline__ void gm_st(char* __restrict__ p, long long o, float v) { ((float*)p)[o] = v; }
__device__ __forceinline__ void gm_st2(char* __restrict__ p, long long o, float v0, float v1) { *(float2*)((float*)p + o) = make_float2(v0, v1); }
#endif
