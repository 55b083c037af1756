// What every GEMM template reads first: the data type codes of the defines that name an operand's
// or a tensor's type (`#define GEMM_C DT_bf16`: DT_ and `DataType::name()`), for `#if GEMM_C ==
// DT_bf16`, and their sizes. Reads no define.
//
// (The GEMM templates name their constants with macros: a namespace-scope variable, even a
// `static constexpr` one, would be a global of the kernel's PTX.)

#define DT_f32 1
#define DT_f16 2
#define DT_bf16 3
#define DT_fp8_e4m3 4
#define DT_fp8_e5m2 5
#define DT_i8 6
#define DT_u8 7
#define DT_i32 8

// Bytes of one element of a type.
#define DT_SIZE(t) (((t) == DT_f32 || (t) == DT_i32) ? 4 : ((t) == DT_fp8_e4m3 || (t) == DT_fp8_e5m2 || (t) == DT_i8 || (t) == DT_u8) ? 1 : 2)
// Whether a type is an integer one.
#define DT_INT(t) ((t) == DT_i8 || (t) == DT_u8 || (t) == DT_i32)
