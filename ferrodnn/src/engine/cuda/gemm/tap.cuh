// The tap's device functions (a reduction of the stored C folded into the Hopper GEMM, `Tap` in
// mod.rs): TAP_ID is the empty partial, `tap_fold(acc, v)` adds a stored value to a partial,
// `tap_comb(a, b)` combines two partials. max and min propagate NaN (`max.NaN`), as the CPU
// engine's reductions do; sums are f32.
//
// Reads: TAP_MODE (TAP_AMAX, TAP_MAX, TAP_MIN or TAP_ADD); names the values of TAP_AXES, which the
// kernels that use the tap read: TAP_ALL (one value), TAP_ROWS (one a row), TAP_COLS (one a column).

#define TAP_AMAX 1
#define TAP_MAX 2
#define TAP_MIN 3
#define TAP_ADD 4
#define TAP_ALL 1
#define TAP_ROWS 2
#define TAP_COLS 3

#if TAP_MODE == TAP_MAX
#define TAP_ID __int_as_float(0xff800000)
#elif TAP_MODE == TAP_MIN
#define TAP_ID __int_as_float(0x7f800000)
#else
#define TAP_ID 0.f
#endif
__device__ __forceinline__ float tap_max(float a, float b) { float r; asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
__device__ __forceinline__ float tap_min(float a, float b) { float r; asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
__device__ __forceinline__ float tap_fold(float acc, float v) {
#if TAP_MODE == TAP_AMAX
    return tap_max(acc, fabsf(v));
#elif TAP_MODE == TAP_MAX
    return tap_max(acc, v);
#elif TAP_MODE == TAP_MIN
    return tap_min(acc, v);
#else
    return acc + v;
#endif
}
__device__ __forceinline__ float tap_comb(float a, float b) {
#if TAP_MODE == TAP_AMAX || TAP_MODE == TAP_MAX
    return tap_max(a, b);
#elif TAP_MODE == TAP_MIN
    return tap_min(a, b);
#else
    return a + b;
#endif
}
