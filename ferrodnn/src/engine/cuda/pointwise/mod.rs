//! The pointwise op library, shared by the fallback's pointwise kernel (`fallback/pointwise.rs`),
//! the fused pointwise kernels (`fused/pointwise.rs`) and the GEMM epilogue (`gemm/epilogue.rs`):
//! one device function per mode in `ops.cuh`, for float and double arithmetic, and here the call
//! that applies a node's mode to its inputs, e.g. `pw_relu<false>(a, 0e0f, hi, 0e0f)`. A kernel
//! defines its expression (a call, or a chain of calls) and includes [`OPS`] (and [`CONVERT`]
//! for the fused kernels' arithmetic type and conversions).

use crate::engine::cuda::kernel::ctype::c_double;
use crate::graph::ops::pointwise::PointwiseMode;

/// `pw_<mode>` for every mode, float and double (`ops.cuh`).
pub const OPS: &str = include_str!("ops.cuh");

/// The fused kernels' arithmetic type `fz_t` and its conversions (`convert.cuh`).
pub const CONVERT: &str = include_str!("convert.cuh");

/// Which formulas a kernel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// The CPU engine's expressions, in double (the fallback): elu as `exp(a) - 1`.
    Reference,
    /// The fused kernels' (float or double): elu with `expm1`.
    Fused,
}

/// A literal of the arithmetic type (float, or double when `dbl`), parenthesized when negative.
pub fn lit(v: f64, dbl: bool) -> String {
    if dbl {
        let s = c_double(v);
        if v < 0.0 && !s.starts_with('(') {
            format!("({s})")
        } else {
            s
        }
    } else {
        let f = v as f32;
        if f.is_nan() {
            "__int_as_float(0x7fffffff)".into()
        } else if f.is_infinite() {
            if f > 0.0 {
                "__int_as_float(0x7f800000)".into()
            } else {
                "__int_as_float(0xff800000)".into()
            }
        } else if f < 0.0 {
            format!("({f:e}f)")
        } else {
            format!("{f:e}f")
        }
    }
}

/// The C call of `mode`'s device function on the values of ports a, b and c (`args`, C
/// expressions of the arithmetic type; unused ones are ignored), in float or double (`dbl`).
/// `attr` spells an attribute's value: the kernels declare a parameter for it and give its name,
/// so that one kernel serves every value. Attributes left unset take their default as a literal
/// (a relu's slope of 0 too: without a slope the formula differs, see `pw_relu`).
pub fn call(mode: PointwiseMode, args: [&str; 3], form: Form, dbl: bool, attr: &mut dyn FnMut(f64) -> String) -> String {
    use PointwiseMode::*;
    let [a, b, c] = args;
    let l = |v: f64| lit(v, dbl);
    let unary = |name: &str| format!("pw_{name}({a})");
    let binary = |name: &str| format!("pw_{name}({a}, {b})");
    match mode {
        Add | Bias => binary("add"),
        Mul | Scale => binary("mul"),
        Sub | Div | Max | Min | Pow | Mod | AddSquare | CmpEq | CmpNeq | CmpGt | CmpGe | CmpLt | CmpLe | LogicalAnd | LogicalOr => binary(mode.name()),
        Abs | Neg | Exp | Log | Sqrt | Rsqrt | Reciprocal | Sin | Cos | Tan | Tanh | Sigmoid | Erf | Floor | Ceil | Identity | Gelu | GeluApproxTanh | LogicalNot => {
            unary(mode.name())
        }
        BinarySelect => format!("pw_binary_select({a}, {b}, {c})"),
        GenIndex { axis } => format!("pw_gen_index(idx, {axis})"),
        Relu { lower_clip, upper_clip, negative_slope } => {
            let lo = lower_clip.map_or_else(|| l(0.0), &mut *attr);
            let hi = upper_clip.map_or_else(|| l(f64::INFINITY), &mut *attr);
            // Without a slope (unset or 0) the clip itself below it, so that -inf gives it.
            match negative_slope.filter(|&s| s != 0.0) {
                Some(s) => format!("pw_relu<true>({a}, {lo}, {hi}, {})", attr(s)),
                None => format!("pw_relu<false>({a}, {lo}, {hi}, {})", l(0.0)),
            }
        }
        LeakyRelu { negative_slope } => format!("pw_leaky_relu({a}, {})", attr(negative_slope)),
        Elu { alpha } => match form {
            Form::Reference => format!("pw_elu_exp({a}, {})", attr(alpha)),
            Form::Fused => format!("pw_elu({a}, {})", attr(alpha)),
        },
        Swish { beta } => format!("pw_swish({a}, {})", attr(beta)),
        Softplus { beta } => format!("pw_softplus({a}, {})", attr(beta)),
        ReluBackward { lower_clip, upper_clip, negative_slope } => {
            let lo = lower_clip.map_or_else(|| l(0.0), &mut *attr);
            let slope = negative_slope.map_or_else(|| l(0.0), &mut *attr);
            match upper_clip {
                Some(hi) => format!("pw_relu_backward<true>({a}, {b}, {lo}, {}, {slope})", attr(hi)),
                None => format!("pw_relu_backward<false>({a}, {b}, {lo}, {}, {slope})", l(f64::INFINITY)),
            }
        }
        SigmoidBackward | TanhBackward | GeluBackward | GeluApproxTanhBackward => binary(mode.name()),
        EluBackward { alpha: v } | SwishBackward { beta: v } | SoftplusBackward { beta: v } | LeakyReluBackward { negative_slope: v } => {
            format!("pw_{}({a}, {b}, {})", mode.name(), attr(v))
        }
    }
}
