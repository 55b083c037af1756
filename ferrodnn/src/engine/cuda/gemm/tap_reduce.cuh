// The tap's second launch (after tap.cuh): folds the partials the GEMM kernel wrote in a fixed
// order, so that the result does not depend on the schedule, and stores the reduction's output.
// TAP_AXES TAP_ALL: one block over all TAP_PARTS partials, a tree in shared memory. TAP_ROWS or
// TAP_COLS: a thread per output (a row or a column of each batch), over its TAP_COUNT partials in
// tile order (partial q of output i at part[q * TAP_OUTS + i]).
//
// Reads: TAP_AXES, TAP_Y (the output's type code: f32, f16 or bf16), and for TAP_ALL TAP_PARTS;
// else TAP_OUTS, TAP_COUNT, TAP_EXTENT (rows or columns a batch), TAP_STRIDE (the output's stride
// along them) and TAP_BATCH_OFFSET (its offset for batch `bt`: terms `+ ...` of an index
// expression, empty for one batch).

// The output's element `o` from the f32 value `a`.
#if TAP_Y == DT_bf16
#define TAP_STORE *((__nv_bfloat16*)y + o) = __float2bfloat16_rn(a);
#elif TAP_Y == DT_f16
#define TAP_STORE *((__half*)y + o) = __float2half_rn(a);
#else
#define TAP_STORE *((float*)y + o) = a;
#endif

#if TAP_AXES == TAP_ALL
#define TAP_THREADS 1024
#else
#define TAP_THREADS 256
#define OUTS ((long long)TAP_OUTS)
#define EXTENT ((long long)TAP_EXTENT)
#define STRIDE ((long long)TAP_STRIDE)
#endif

extern "C" __global__ void __launch_bounds__(TAP_THREADS) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
#if TAP_AXES == TAP_ALL
    __shared__ float s[1024];
    const int tid = threadIdx.x;
    float a = TAP_ID;
    for (long long i = tid; i < (long long)TAP_PARTS; i += 1024) a = tap_comb(a, part[i]);
    s[tid] = a;
    __syncthreads();
    #pragma unroll
    for (int w = 512; w > 0; w >>= 1) {
        if (tid < w) s[tid] = tap_comb(s[tid], s[tid + w]);
        __syncthreads();
    }
    if (tid == 0) {
        a = s[0];
        const long long o = 0;
        TAP_STORE
    }
#else
    const long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i >= OUTS) return;
    float a = TAP_ID;
    for (int q = 0; q < TAP_COUNT; ++q) a = tap_comb(a, part[(long long)q * OUTS + i]);
    const long long bt = i / EXTENT;
    long long o = (i % EXTENT) * STRIDE TAP_BATCH_OFFSET;
    TAP_STORE
#endif
}
