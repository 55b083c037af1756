// What the Hopper GEMM kernel (sm90.cuh) and its split-k reduce (sm90_reduce.cuh) share: the
// problem's extents and the stores of C.
//
// Reads: GEMM_M, GEMM_N, GEMM_BATCH (the problem the kernel computes: C^T's with GEMM_SWAP),
// GEMM_SPLITS (ways k is split, 1: none), GEMM_C (C's type
// code, f32, f16 or bf16; i32, i8 or u8 after 8-bit integers), GEMM_C_RS, GEMM_C_CS, GEMM_C_BS (C's strides in elements, as the kernel
// sees C), GEMM_C_PAIRS (1: two neighbouring columns can be stored at once: row-major C with even
// strides), GEMM_SWAP (1: the kernel computes C^T, its rows are C's columns), EPI_NAMES (the
// epilogue's side-input arguments, `, e0, ...`).

// (M_, N_ and NP are globals of the kernels' PTX, as they have always been.)
static constexpr long long M_ = GEMM_M, N_ = GEMM_N, NP = GEMM_N + GEMM_N % 2;
#define BATCH GEMM_BATCH
// C's element size and strides in bytes.
#define C_ESZ ((long long)DT_SIZE(GEMM_C))
#define C_RS ((long long)GEMM_C_RS * DT_SIZE(GEMM_C))
#define C_CS ((long long)GEMM_C_CS * DT_SIZE(GEMM_C))
#define C_BS ((long long)GEMM_C_BS * DT_SIZE(GEMM_C))

// One value `v` (C_ST1) or two neighbouring ones (C_ST2) stored at byte pointer `cp`.
#if GEMM_C == DT_bf16
#define C_ST1(cp, v) *(__nv_bfloat16*)(cp) = __float2bfloat16_rn(v)
#define C_ST2(cp, v0, v1) *(__nv_bfloat162*)(cp) = __floats2bfloat162_rn(v0, v1)
#elif GEMM_C == DT_f16
#define C_ST1(cp, v) *(__half*)(cp) = __float2half_rn(v)
#define C_ST2(cp, v0, v1) *(__half2*)(cp) = __floats2half2_rn(v0, v1)
#elif DT_INT(GEMM_C)
// An integer C (after 8-bit integer operands): with GEMM_INT_EXACT `v` holds the i32 sum's bits;
// else it is the epilogue's f32, rounded half away from zero and saturated (NaN to 0) as the CPU
// engine converts; then saturated to C's range.
#if GEMM_INT_EXACT
#define C_IV(v) __float_as_int(v)
#else
#define C_IV(v) __float2int_rz(roundf(v))
#endif
#if GEMM_C == DT_i32
#define C_ST1(cp, v) *(int*)(cp) = C_IV(v)
#define C_ST2(cp, v0, v1) *(int2*)(cp) = make_int2(C_IV(v0), C_IV(v1))
#else
#if GEMM_C == DT_i8
#define C_SAT(v) (unsigned)(unsigned char)(signed char)min(max(C_IV(v), -128), 127)
#else
#define C_SAT(v) (unsigned)(unsigned char)min(max(C_IV(v), 0), 255)
#endif
#define C_ST1(cp, v) *(unsigned char*)(cp) = (unsigned char)C_SAT(v)
#define C_ST2(cp, v0, v1) *(unsigned short*)(cp) = (unsigned short)(C_SAT(v0) | (C_SAT(v1) << 8))
#endif
#else
#define C_ST1(cp, v) *(float*)(cp) = v
#define C_ST2(cp, v0, v1) *(float2*)(cp) = make_float2(v0, v1)
#endif

// The epilogue of accumulator `v` at column `c` of the kernel's row `row` (batch `bt`): C's row
// and column trade places when the kernel computes C^T.
#if GEMM_INT_EXACT
#define EPI_AT(v, c) (v)
#elif GEMM_SWAP
#define EPI_AT(v, c) epilogue(v, bt, c, row EPI_NAMES)
#else
#define EPI_AT(v, c) epilogue(v, bt, row, c EPI_NAMES)
#endif

// Stores of accumulators `a0` (column `col`) and `a1` (column `col + 1`) of row `row` through the
// epilogue, at row pointer `rp` (batch and row applied): pairs where GEMM_C_PAIRS, else one
// element at a time; guarded by N.
#if GEMM_C_PAIRS
#define C_STORE_EPI(a0, a1)                      \
    if (col + 1 < N_) {                          \
        const float v0 = EPI_AT(a0, col);        \
        const float v1 = EPI_AT(a1, col + 1);    \
        unsigned char* cp = rp + col * C_ESZ;    \
        C_ST2(cp, v0, v1);                       \
    } else if (col < N_) {                       \
        const float v0 = EPI_AT(a0, col);        \
        unsigned char* cp = rp + col * C_ESZ;    \
        C_ST1(cp, v0);                           \
    }
#else
#define C_STORE_EPI(a0, a1)                                    \
    for (int e = 0; e < 2; ++e) {                              \
        if (col + e < N_) {                                    \
            const float v0 = EPI_AT(e == 0 ? a0 : a1, col + e); \
            unsigned char* cp = rp + (col + e) * C_CS;         \
            C_ST1(cp, v0);                                     \
        }                                                      \
    }
#endif

// Stores of computed values `v0` (column `col`) and `v1` (column `col + 1`) of a row at row
// pointer `rp`, as C_STORE_EPI (the caller guards the row).
#if GEMM_C_PAIRS
#define C_STORE_VALUES                    \
    unsigned char* cp = rp + col * C_ESZ; \
    if (col + 1 < N_) {                   \
        C_ST2(cp, v0, v1);                \
    } else if (col < N_) {                \
        C_ST1(cp, v0);                    \
    }
#else
#define C_STORE_VALUES                              \
    if (col < N_) {                                 \
        unsigned char* cp = rp + col * C_CS;        \
        C_ST1(cp, v0);                              \
    }                                               \
    if (col + 1 < N_) {                             \
        unsigned char* cp = rp + (col + 1) * C_CS;  \
        C_ST1(cp, v1);                              \
    }
#endif
