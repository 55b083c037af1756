// The pointwise op library: one device function per pointwise mode (`pw_<mode>`), for float and
// double arithmetic, used by the fallback's pointwise kernel (double), the fused pointwise kernels
// and the GEMM epilogue (float, or double). The Rust side (pointwise/mod.rs) writes a node as a
// call, e.g. `pw_relu<false>(a, lo, hi, slope)`; attributes are arguments (kernel parameters).
//
// The float functions call the f-suffixed math functions; the double ones the plain ones. The
// formulas are those of the CPU engine (PointwiseMode::apply), except sigmoid in float (one exp)
// and elu, with expm1 in the fused kernels and the epilogue (the fallback calls pw_elu_exp, the
// CPU's alpha * (exp(a) - 1)).
//
// Reads:
//   PW_FAST   1: exp (and sigmoid's division) of the float functions use the fast intrinsics
//             (__expf, __fdividef), for float arithmetic under a 16-bit output whose rounding
//             dwarfs their few ulps of error; 0 (or undefined): the accurate functions.
#ifndef FDNN_POINTWISE_OPS
#define FDNN_POINTWISE_OPS
#ifndef PW_FAST
#define PW_FAST 0
#endif

// Math by arithmetic type.
__device__ __forceinline__ float pw_exp(float a) {
#if PW_FAST
    return __expf(a);
#else
    return expf(a);
#endif
}
__device__ __forceinline__ double pw_exp(double a) { return exp(a); }
__device__ __forceinline__ float pw_expm1(float a) { return expm1f(a); }
__device__ __forceinline__ double pw_expm1(double a) { return expm1(a); }
__device__ __forceinline__ float pw_log1p(float a) { return log1pf(a); }
__device__ __forceinline__ double pw_log1p(double a) { return log1p(a); }
__device__ __forceinline__ float pw_fmin(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ double pw_fmin(double a, double b) { return fmin(a, b); }
__device__ __forceinline__ float pw_log(float a) { return logf(a); }
__device__ __forceinline__ double pw_log(double a) { return log(a); }
__device__ __forceinline__ float pw_sqrt(float a) { return sqrtf(a); }
__device__ __forceinline__ double pw_sqrt(double a) { return sqrt(a); }
__device__ __forceinline__ float pw_abs(float a) { return fabsf(a); }
__device__ __forceinline__ double pw_abs(double a) { return fabs(a); }
__device__ __forceinline__ float pw_sin(float a) { return sinf(a); }
__device__ __forceinline__ double pw_sin(double a) { return sin(a); }
__device__ __forceinline__ float pw_cos(float a) { return cosf(a); }
__device__ __forceinline__ double pw_cos(double a) { return cos(a); }
__device__ __forceinline__ float pw_tan(float a) { return tanf(a); }
__device__ __forceinline__ double pw_tan(double a) { return tan(a); }
__device__ __forceinline__ float pw_tanh(float a) { return tanhf(a); }
__device__ __forceinline__ double pw_tanh(double a) { return tanh(a); }
__device__ __forceinline__ float pw_erf(float a) { return erff(a); }
__device__ __forceinline__ double pw_erf(double a) { return erf(a); }
__device__ __forceinline__ float pw_floor(float a) { return floorf(a); }
__device__ __forceinline__ double pw_floor(double a) { return floor(a); }
__device__ __forceinline__ float pw_ceil(float a) { return ceilf(a); }
__device__ __forceinline__ double pw_ceil(double a) { return ceil(a); }
__device__ __forceinline__ float pw_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double pw_pow(double a, double b) { return pow(a, b); }
__device__ __forceinline__ float pw_mod(float a, float b) { return fmodf(a, b); }
__device__ __forceinline__ double pw_mod(double a, double b) { return fmod(a, b); }

// max and min with NaN propagated (fmax and fmin return the other operand).
__device__ __forceinline__ float pw_max(float a, float b) { return (isnan(a) || isnan(b)) ? __int_as_float(0x7fffffff) : fmaxf(a, b); }
__device__ __forceinline__ double pw_max(double a, double b) { return (isnan(a) || isnan(b)) ? (0.0 / 0.0) : fmax(a, b); }
__device__ __forceinline__ float pw_min(float a, float b) { return (isnan(a) || isnan(b)) ? __int_as_float(0x7fffffff) : fminf(a, b); }
__device__ __forceinline__ double pw_min(double a, double b) { return (isnan(a) || isnan(b)) ? (0.0 / 0.0) : fmin(a, b); }

// sigmoid. In float with one exp: e = exp(-|x|); 1 / (1 + e) for x >= 0, e / (1 + e) below (NaN
// stays NaN); the denominator lies in [1, 2], where __fdividef is exact to 2 ulp.
__device__ __forceinline__ float pw_sigmoid(float x) {
    float e = pw_exp(-fabsf(x));
#if PW_FAST
    float r = __fdividef(1.0f, 1.0f + e);
#else
    float r = 1.0f / (1.0f + e);
#endif
    return x >= 0.0f ? r : e * r;
}
__device__ __forceinline__ double pw_sigmoid(double x) { return x >= 0.0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x)); }

// log(1 + exp(x)), x itself above 30.
template <typename T> __device__ __forceinline__ T pw_softplus1(T x) { return x > T(30) ? x : pw_log1p(pw_exp(x)); }

// sqrt(2 / pi), 1 / sqrt(2), 1 / sqrt(2 pi)
#define PW_GELU_K 0.7978845608028654
#define PW_FRAC_1_SQRT_2 0.7071067811865476
#define PW_FRAC_1_SQRT_2PI 0.3989422804014327

// Arithmetic.
template <typename T> __device__ __forceinline__ T pw_add(T a, T b) { return a + b; }
template <typename T> __device__ __forceinline__ T pw_sub(T a, T b) { return a - b; }
template <typename T> __device__ __forceinline__ T pw_mul(T a, T b) { return a * b; }
template <typename T> __device__ __forceinline__ T pw_div(T a, T b) { return a / b; }
template <typename T> __device__ __forceinline__ T pw_add_square(T a, T b) { return a + b * b; }
template <typename T> __device__ __forceinline__ T pw_neg(T a) { return -a; }
template <typename T> __device__ __forceinline__ T pw_rsqrt(T a) { return T(1) / pw_sqrt(a); }
template <typename T> __device__ __forceinline__ T pw_reciprocal(T a) { return T(1) / a; }
template <typename T> __device__ __forceinline__ T pw_identity(T a) { return a; }

// Activations. relu: NaN stays NaN; below the lower clip `lo` the clip itself without a slope
// (-inf included), else lo + slope * (a - lo); then capped by `hi`.
template <bool SLOPE, typename T> __device__ __forceinline__ T pw_relu(T a, T lo, T hi, T slope) {
    if (SLOPE) {
        return isnan(a) ? a : pw_fmin(a < lo ? lo + slope * (a - lo) : a, hi);
    }
    return isnan(a) ? a : pw_fmin(a < lo ? lo : a, hi);
}
// The relu without clips or slope in two instructions: 0 below zero (-inf included), `a`
// otherwise (NaN included).
template <typename T> __device__ __forceinline__ T pw_relu0(T a) { return a < T(0) ? T(0) : a; }
template <typename T> __device__ __forceinline__ T pw_leaky_relu(T a, T slope) { return a < T(0) ? slope * a : a; }
template <typename T> __device__ __forceinline__ T pw_elu(T a, T alpha) { return a > T(0) ? a : alpha * pw_expm1(a); }
// elu as the CPU engine writes it, alpha * (exp(a) - 1) (the fallback's).
template <typename T> __device__ __forceinline__ T pw_elu_exp(T a, T alpha) { return a > T(0) ? a : alpha * (pw_exp(a) - T(1)); }
template <typename T> __device__ __forceinline__ T pw_gelu(T a) { return T(0.5) * a * (T(1) + pw_erf(a * T(PW_FRAC_1_SQRT_2))); }
template <typename T> __device__ __forceinline__ T pw_gelu_approx_tanh(T a) {
    return T(0.5) * a * (T(1) + pw_tanh(T(PW_GELU_K) * (a + T(0.044715) * a * a * a)));
}
template <typename T> __device__ __forceinline__ T pw_swish(T a, T beta) { return a * pw_sigmoid(beta * a); }
template <typename T> __device__ __forceinline__ T pw_softplus(T a, T beta) { return pw_softplus1(beta * a) / beta; }

// Comparisons and logic: 1 or 0.
template <typename T> __device__ __forceinline__ T pw_cmp_eq(T a, T b) { return (a == b) ? T(1) : T(0); }
template <typename T> __device__ __forceinline__ T pw_cmp_neq(T a, T b) { return (a != b) ? T(1) : T(0); }
template <typename T> __device__ __forceinline__ T pw_cmp_gt(T a, T b) { return (a > b) ? T(1) : T(0); }
template <typename T> __device__ __forceinline__ T pw_cmp_ge(T a, T b) { return (a >= b) ? T(1) : T(0); }
template <typename T> __device__ __forceinline__ T pw_cmp_lt(T a, T b) { return (a < b) ? T(1) : T(0); }
template <typename T> __device__ __forceinline__ T pw_cmp_le(T a, T b) { return (a <= b) ? T(1) : T(0); }
template <typename T> __device__ __forceinline__ T pw_logical_and(T a, T b) { return (a != T(0) && b != T(0)) ? T(1) : T(0); }
template <typename T> __device__ __forceinline__ T pw_logical_or(T a, T b) { return (a != T(0) || b != T(0)) ? T(1) : T(0); }
template <typename T> __device__ __forceinline__ T pw_logical_not(T a) { return (a == T(0)) ? T(1) : T(0); }
template <typename T> __device__ __forceinline__ T pw_binary_select(T a, T b, T c) { return (c != T(0)) ? a : b; }
// The index along `axis` of the element at multi-index `idx`.
__device__ __forceinline__ double pw_gen_index(const i64* idx, int axis) { return (double)idx[axis]; }

// Backward forms: a = dy, b = x. relu: the slope below the lower clip, 0 at or above the upper
// one (UPPER), else 1.
template <bool UPPER, typename T> __device__ __forceinline__ T pw_relu_backward(T a, T b, T lo, T hi, T slope) {
    if (UPPER) {
        return a * (b <= lo ? slope : (b >= hi ? T(0) : T(1)));
    }
    return a * (b <= lo ? slope : T(1));
}
template <typename T> __device__ __forceinline__ T pw_sigmoid_backward(T a, T b) { return a * pw_sigmoid(b) * (T(1) - pw_sigmoid(b)); }
template <typename T> __device__ __forceinline__ T pw_tanh_backward(T a, T b) { return a * (T(1) - pw_tanh(b) * pw_tanh(b)); }
template <typename T> __device__ __forceinline__ T pw_elu_backward(T a, T b, T alpha) { return b > T(0) ? a : a * alpha * pw_exp(b); }
template <typename T> __device__ __forceinline__ T pw_gelu_backward(T a, T b) {
    return a * (T(0.5) * (T(1) + pw_erf(b * T(PW_FRAC_1_SQRT_2))) + b * pw_exp(T(-0.5) * b * b) * T(PW_FRAC_1_SQRT_2PI));
}
template <typename T> __device__ __forceinline__ T pw_gelu_approx_tanh_backward(T a, T b) {
    return a * (T(0.5) * (T(1) + pw_tanh(T(PW_GELU_K) * (b + T(0.044715) * b * b * b))) +
                T(0.5) * b * (T(1) - pw_tanh(T(PW_GELU_K) * (b + T(0.044715) * b * b * b)) * pw_tanh(T(PW_GELU_K) * (b + T(0.044715) * b * b * b))) * T(PW_GELU_K) *
                    (T(1) + T(3.0 * 0.044715) * b * b));
}
template <typename T> __device__ __forceinline__ T pw_swish_backward(T a, T b, T beta) {
    return a * (pw_sigmoid(beta * b) + beta * b * pw_sigmoid(beta * b) * (T(1) - pw_sigmoid(beta * b)));
}
template <typename T> __device__ __forceinline__ T pw_softplus_backward(T a, T b, T beta) { return a * pw_sigmoid(beta * b); }
template <typename T> __device__ __forceinline__ T pw_leaky_relu_backward(T a, T b, T slope) { return b <= T(0) ? a * slope : a; }

#endif
