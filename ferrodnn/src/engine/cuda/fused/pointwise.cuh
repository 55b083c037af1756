// The kernel of a fused group of pointwise nodes (fused/pointwise.rs): the group's expression
// per output element, in the arithmetic type fz_t (pointwise/convert.cuh), each node a call of
// pointwise/ops.cuh. A vector loop (16-byte loads and stores) when every streamed pointer is
// aligned, then a scalar loop for the tail (or for everything).
//
// The instantiation defines:
//   FZ_DOUBLE, PW_FAST   the arithmetic type (convert.cuh) and the fast intrinsics (ops.cuh)
//   FZ_BLOCK             threads per block
//   FZ_N                 the element count
//   FZ_INPUTS(X, S)      the external inputs, parameters p<k>, as X(k, KIND, T, INNER) separated
//                        by S, with T the C type and KIND how the kernel reads input k:
//                          FLAT   at the output's flat index (same layout, output packed);
//                          ZERO   element 0 (size 1 in every dim), once per thread;
//                          ROWS   at offset FZ_OFF<k>(flat); in the vector loop, at the vector's
//                                 offset plus j * INNER (a vector lies within one innermost row);
//                          ELEM   at offset FZ_OFF<k>(flat), element by element;
//                          ARG    the parameter itself, of type fz_t (a by-value scalar, an
//                                 attribute)
//   FZ_OFF<k>(f)         the offset of input k (ROWS, ELEM) at flat index f
//   FZ_NODES(X)          the group's nodes in order, X(k, VALUE): node k's value v<k>, a call over
//                        the inputs' values x<i> and earlier values v<j>
//   FZ_RESULT            the exit's value
//   FZ_Y, FZ_TO_Y        the output's C type and its conversion from fz_t
//   FZ_PACKED            1: the output is packed (its offset is the flat index); 0: its offset is
//                        FZ_OFFY(flat)
//   FZ_VEC               elements per 16-byte vector, or 0: no vector loop
//   FZ_STRIDED           1: some input is ROWS or ELEM

#define FZ_COMMA ,
#define FZ_NODE(k, value) const fz_t v##k = value;
#define FZ_XPARAM(k, kind, T, inner) fz_t x##k

// The group's value from its inputs' values.
__device__ __forceinline__ fz_t fz_expr(FZ_INPUTS(FZ_XPARAM, FZ_COMMA)) {
    FZ_NODES(FZ_NODE)
    return FZ_RESULT;
}

// The offset functions of the ROWS and ELEM inputs, i64 fz_off<k>(i64 flat), and of the output
// when it is not packed, i64 fz_offy(i64 flat) (functions: the same expressions written at the
// call change how the compiler unrolls the vector loop).
#define FZ_OFF_FN(k, kind, T, inner) FZ_OFF_FN_##kind(k)
#define FZ_OFF_FN_FLAT(k)
#define FZ_OFF_FN_ZERO(k)
#define FZ_OFF_FN_ROWS(k) \
    __device__ __forceinline__ i64 fz_off##k(i64 i) { return FZ_OFF##k(i); }
#define FZ_OFF_FN_ELEM(k) \
    __device__ __forceinline__ i64 fz_off##k(i64 i) { return FZ_OFF##k(i); }
#define FZ_OFF_FN_ARG(k)
FZ_INPUTS(FZ_OFF_FN, )
#if !FZ_PACKED
__device__ __forceinline__ i64 fz_offy(i64 i) { return FZ_OFFY(i); }
#endif

// What each part of the kernel does with input k, by its KIND (empty: nothing).
// Before the loops: a ZERO input's value.
#define FZ_TOP(k, kind, T, inner) FZ_TOP_##kind(k, T)
#define FZ_TOP_FLAT(k, T)
#define FZ_TOP_ZERO(k, T) const fz_t z##k = fz_cv(((const T*)p##k)[0]);
#define FZ_TOP_ROWS(k, T)
#define FZ_TOP_ELEM(k, T)
#define FZ_TOP_ARG(k, T)
// The alignment test of the vector loop: the FLAT pointers.
#define FZ_PTR(k, kind, T, inner) FZ_PTR_##kind(k)
#define FZ_PTR_FLAT(k) | (unsigned long long)p##k
#define FZ_PTR_ZERO(k)
#define FZ_PTR_ROWS(k)
#define FZ_PTR_ELEM(k)
#define FZ_PTR_ARG(k)
// Per vector: a FLAT input's vector, a ROWS input's offset.
#define FZ_PRE(k, kind, T, inner) FZ_PRE_##kind(k, T)
#define FZ_PRE_FLAT(k, T) const fz_vec<T> r##k = ((const fz_vec<T>*)p##k)[v];
#define FZ_PRE_ZERO(k, T)
#define FZ_PRE_ROWS(k, T) const i64 o##k = fz_off##k(i0);
#define FZ_PRE_ELEM(k, T)
#define FZ_PRE_ARG(k, T)
// Per element j of a vector: a ROWS or ELEM input's value.
#define FZ_ELEM(k, kind, T, inner) FZ_ELEM_##kind(k, T, inner)
#define FZ_ELEM_FLAT(k, T, inner)
#define FZ_ELEM_ZERO(k, T, inner)
#define FZ_ELEM_ROWS(k, T, inner) const fz_t x##k = fz_cv(((const T*)p##k)[o##k + (i64)j * inner]);
#define FZ_ELEM_ELEM(k, T, inner) const fz_t x##k = fz_cv(((const T*)p##k)[fz_off##k(i0 + j)]);
#define FZ_ELEM_ARG(k, T, inner)
// The value of element j of a vector.
#define FZ_VALUE_V(k, kind, T, inner) FZ_VALUE_V_##kind(k)
#define FZ_VALUE_V_FLAT(k) fz_cv(r##k.v[j])
#define FZ_VALUE_V_ZERO(k) z##k
#define FZ_VALUE_V_ROWS(k) x##k
#define FZ_VALUE_V_ELEM(k) x##k
#define FZ_VALUE_V_ARG(k) p##k
// The value of element i in the scalar loop.
#define FZ_VALUE(k, kind, T, inner) FZ_VALUE_##kind(k, T)
#define FZ_VALUE_FLAT(k, T) fz_cv(((const T*)p##k)[i])
#define FZ_VALUE_ZERO(k, T) z##k
#define FZ_VALUE_ROWS(k, T) fz_cv(((const T*)p##k)[fz_off##k(i)])
#define FZ_VALUE_ELEM(k, T) fz_cv(((const T*)p##k)[fz_off##k(i)])
#define FZ_VALUE_ARG(k, T) p##k

#if FZ_VEC
template <typename T> struct __align__(16) fz_vec {
    T v[FZ_VEC];
};
#endif

extern "C" __global__ void __launch_bounds__(FZ_BLOCK) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const i64 n = FZ_N;
    const i64 tid = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const i64 nth = (i64)gridDim.x * blockDim.x;
    FZ_INPUTS(FZ_TOP, )
    i64 start = 0;
#if FZ_VEC
    if ((((unsigned long long)y_p FZ_INPUTS(FZ_PTR, )) & 15ull) == 0) {
        const i64 nv = n / FZ_VEC;
        for (i64 v = tid; v < nv; v += nth) {
#if FZ_STRIDED
            const i64 i0 = v * FZ_VEC;
#endif
            FZ_INPUTS(FZ_PRE, )
            fz_vec<FZ_Y> ro;
#pragma unroll
            for (int j = 0; j < FZ_VEC; ++j) {
                FZ_INPUTS(FZ_ELEM, )
                ro.v[j] = FZ_TO_Y(fz_expr(FZ_INPUTS(FZ_VALUE_V, FZ_COMMA)));
            }
            ((fz_vec<FZ_Y>*)y_p)[v] = ro;
        }
        start = nv * FZ_VEC;
    }
#endif
    for (i64 i = start + tid; i < n; i += nth) {
#if FZ_PACKED
        ((FZ_Y*)y_p)[i] = FZ_TO_Y(fz_expr(FZ_INPUTS(FZ_VALUE, FZ_COMMA)));
#else
        ((FZ_Y*)y_p)[fz_offy(i)] = FZ_TO_Y(fz_expr(FZ_INPUTS(FZ_VALUE, FZ_COMMA)));
#endif
    }
    (void)start;
}
