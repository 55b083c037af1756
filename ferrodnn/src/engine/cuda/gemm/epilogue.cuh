// The epilogue of a GEMM group (gemm/epilogue.rs): the pointwise nodes after the matmul applied
// to the f32 accumulator, each a call of pointwise/ops.cuh (in float, conversions of
// pointwise/convert.cuh). Included by the GEMM kernels, it defines
//   float epilogue_v(float acc, float x0, ...)
//                              the chain over the accumulator and the side inputs' values;
//   float epilogue_u(float acc, float x0, ...)
//                              (with EPI_RELU_LAST) the chain without its last node, a plain relu
//                              that the kernel's conversion to C's type applies;
//   float epilogue(float acc, long long batch, long long row, long long col, const void* e0, ...,
//                  float ea0, ...)
//                              the side inputs' values of one element of C (`batch`: the
//                              row-major flat index over C's batch dims), then epilogue_v.
// The chain's scalars (by-value scalars and attributes) are kernel parameters `ea<j>` (the
// kernel's parameter list ends with the epilogue's, see Epilogue::params): epilogue_v and
// epilogue_u are macros that pass them on, so a kernel calls them with the side values only,
// where its parameters are in scope.
//
// The instantiation defines:
//   EPI_SIDES(X)      the side inputs, X(i, T): parameter e<i>, value x<i>, elements of C type T
//   EPI_OFF<i>(b, r, c)   side input i's offset at batch b, row r, column c
//   EPI_SCALARS(X)    the scalar parameters, X(name)
//   EPI_ACC           the accumulator after the operands' scales, rounded to C's type when a
//                     chain follows
//   EPI_NODES(X)      the chain's nodes but the last, X(k, VALUE): node k's value v<k> over acc,
//                     the side values x<i>, the scalars and earlier v<j>, rounded to its tensor's
//                     type
//   EPI_LAST          the last node's value (acc without nodes)
//   EPI_BEFORE_LAST   the value the last node applies to (with EPI_RELU_LAST)
//   EPI_RELU_LAST     1: the chain ends in a plain relu: define epilogue_u

#define EPI_NODE(k, value) const float v##k = value;
#define EPI_XPARAM(i, T) , float x##i
#define EPI_XNAME(i, T) , x##i
#define EPI_PARAM(i, T) , const void* __restrict__ e##i
#define EPI_SPARAM(name) , float name
#define EPI_SNAME(name) , name
#define EPI_LOAD(i, T)                            \
    long long o##i = EPI_OFF##i(batch, row, col); \
    const float x##i = fz_cv(((const T*)e##i)[o##i]);

// The functions, then macros of the same names that append the scalar parameters to a call (a
// macro does not expand its own name again).
#if EPI_RELU_LAST
__device__ __forceinline__ float epilogue_u(float acc EPI_SIDES(EPI_XPARAM) EPI_SCALARS(EPI_SPARAM)) {
    acc = EPI_ACC;
    EPI_NODES(EPI_NODE)
    return EPI_BEFORE_LAST;
}
#define epilogue_u(...) epilogue_u(__VA_ARGS__ EPI_SCALARS(EPI_SNAME))
#endif
__device__ __forceinline__ float epilogue_v(float acc EPI_SIDES(EPI_XPARAM) EPI_SCALARS(EPI_SPARAM)) {
    acc = EPI_ACC;
    EPI_NODES(EPI_NODE)
    return EPI_LAST;
}
#define epilogue_v(...) epilogue_v(__VA_ARGS__ EPI_SCALARS(EPI_SNAME))
__device__ __forceinline__ float epilogue(float acc, long long batch, long long row, long long col EPI_SIDES(EPI_PARAM) EPI_SCALARS(EPI_SPARAM)) {
    (void)batch;
    (void)row;
    (void)col;
    EPI_SIDES(EPI_LOAD)
    return epilogue_v(acc EPI_SIDES(EPI_XNAME));
}
