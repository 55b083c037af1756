//! Pointwise ops: one thread per output element (grid-stride), inputs read with numpy
//! broadcasting, the mode's formula in double.

use super::{c_double, Arg, Ctx, Launch, NodeKernels};
use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::ops::pointwise::{PointwiseAttrs, PointwiseMode};

/// Device helpers the formulas use (defined once per kernel source).
const HELPERS: &str = r#"
__device__ __forceinline__ double pw_sigmoid(double x) { return x >= 0.0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x)); }
__device__ __forceinline__ double pw_softplus(double x) { return x > 30.0 ? x : log1p(exp(x)); }
__device__ __forceinline__ double pw_max(double a, double b) { return (isnan(a) || isnan(b)) ? (0.0/0.0) : fmax(a, b); }
__device__ __forceinline__ double pw_min(double a, double b) { return (isnan(a) || isnan(b)) ? (0.0/0.0) : fmin(a, b); }
#define PW_GELU_K 0.7978845608028654
"#;

/// The C expression of a mode over doubles `a`, `b`, `c` (and `idx` for gen_index).
fn formula(mode: PointwiseMode) -> String {
    use PointwiseMode::*;
    let opt = |v: Option<f64>, default: f64| c_double(v.unwrap_or(default));
    match mode {
        Add | Bias => "a + b".into(),
        Sub => "a - b".into(),
        Mul | Scale => "a * b".into(),
        Div => "a / b".into(),
        Max => "pw_max(a, b)".into(),
        Min => "pw_min(a, b)".into(),
        Pow => "pow(a, b)".into(),
        Mod => "fmod(a, b)".into(),
        AddSquare => "a + b * b".into(),
        Abs => "fabs(a)".into(),
        Neg => "-a".into(),
        Exp => "exp(a)".into(),
        Log => "log(a)".into(),
        Sqrt => "sqrt(a)".into(),
        Rsqrt => "1.0 / sqrt(a)".into(),
        Reciprocal => "1.0 / a".into(),
        Sin => "sin(a)".into(),
        Cos => "cos(a)".into(),
        Tan => "tan(a)".into(),
        Tanh => "tanh(a)".into(),
        Sigmoid => "pw_sigmoid(a)".into(),
        Erf => "erf(a)".into(),
        Floor => "floor(a)".into(),
        Ceil => "ceil(a)".into(),
        Identity => "a".into(),
        Relu { lower_clip, upper_clip, negative_slope } => {
            let lo = opt(lower_clip, 0.0);
            let hi = upper_clip.map_or("(1.0/0.0)".to_string(), c_double);
            // Without a slope the clip itself (so -inf gives it, not 0 * -inf).
            let below = if negative_slope.is_none_or(|s| s == 0.0) { lo.clone() } else { format!("{lo} + {} * (a - {lo})", opt(negative_slope, 0.0)) };
            format!("isnan(a) ? a : fmin(a < {lo} ? {below} : a, {hi})")
        }
        LeakyRelu { negative_slope } => format!("a < 0.0 ? {} * a : a", c_double(negative_slope)),
        Elu { alpha } => format!("a > 0.0 ? a : {} * (exp(a) - 1.0)", c_double(alpha)),
        Gelu => "0.5 * a * (1.0 + erf(a * 0.7071067811865476))".into(),
        GeluApproxTanh => "0.5 * a * (1.0 + tanh(PW_GELU_K * (a + 0.044715 * a * a * a)))".into(),
        Swish { beta } => format!("a * pw_sigmoid({} * a)", c_double(beta)),
        Softplus { beta } => format!("pw_softplus({b} * a) / {b}", b = c_double(beta)),
        CmpEq => "(a == b) ? 1.0 : 0.0".into(),
        CmpNeq => "(a != b) ? 1.0 : 0.0".into(),
        CmpGt => "(a > b) ? 1.0 : 0.0".into(),
        CmpGe => "(a >= b) ? 1.0 : 0.0".into(),
        CmpLt => "(a < b) ? 1.0 : 0.0".into(),
        CmpLe => "(a <= b) ? 1.0 : 0.0".into(),
        LogicalAnd => "(a != 0.0 && b != 0.0) ? 1.0 : 0.0".into(),
        LogicalOr => "(a != 0.0 || b != 0.0) ? 1.0 : 0.0".into(),
        LogicalNot => "(a == 0.0) ? 1.0 : 0.0".into(),
        BinarySelect => "(c != 0.0) ? a : b".into(),
        GenIndex { axis } => format!("(double)idx[{axis}]"),
        // Backward forms: a = dy, b = x.
        ReluBackward { lower_clip, upper_clip, negative_slope } => {
            let lo = opt(lower_clip, 0.0);
            let slope = opt(negative_slope, 0.0);
            let above = match upper_clip {
                Some(hi) => format!("(b >= {} ? 0.0 : 1.0)", c_double(hi)),
                None => "1.0".into(),
            };
            format!("a * (b <= {lo} ? {slope} : {above})")
        }
        SigmoidBackward => "a * pw_sigmoid(b) * (1.0 - pw_sigmoid(b))".into(),
        TanhBackward => "a * (1.0 - tanh(b) * tanh(b))".into(),
        EluBackward { alpha } => format!("b > 0.0 ? a : a * {} * exp(b)", c_double(alpha)),
        GeluBackward => "a * (0.5 * (1.0 + erf(b * 0.7071067811865476)) + b * exp(-0.5 * b * b) * 0.3989422804014327)".into(),
        GeluApproxTanhBackward => {
            "a * (0.5 * (1.0 + tanh(PW_GELU_K * (b + 0.044715 * b * b * b))) + 0.5 * b * (1.0 - tanh(PW_GELU_K * (b + 0.044715 * b * b * b)) * tanh(PW_GELU_K * (b + 0.044715 * b * b * b))) * PW_GELU_K * (1.0 + 3.0 * 0.044715 * b * b))".into()
        }
        SwishBackward { beta } => {
            let bt = c_double(beta);
            format!("a * (pw_sigmoid({bt} * b) + {bt} * b * pw_sigmoid({bt} * b) * (1.0 - pw_sigmoid({bt} * b)))")
        }
        SoftplusBackward { beta } => format!("a * pw_sigmoid({} * b)", c_double(beta)),
        LeakyReluBackward { negative_slope } => format!("b <= 0.0 ? a * {} : a", c_double(negative_slope)),
    }
}

pub(super) fn pointwise(ctx: &Ctx, attrs: &PointwiseAttrs) -> Result<NodeKernels> {
    let y = ctx.output("y")?;
    let entry = ctx.entry("pointwise");
    let names = ["a", "b", "c"];
    let mut params = vec!["void* y".to_string(), "TRef ty".to_string()];
    let mut args = vec![Arg::Ptr(y), Arg::Ref(y)];
    let mut loads = String::new();
    // The CPU engine rounds each input to the compute type before applying the formula.
    let round = if ctx.graph.compute_type(ctx.node) == DataType::F64 { "" } else { "q_f32" };
    for name in names {
        match ctx.node.input(name) {
            Some(t) => {
                params.push(format!("const void* {name}_p"));
                params.push(format!("TRef t{name}"));
                args.push(Arg::Ptr(t));
                args.push(Arg::Ref(t));
                loads += &format!("        double {name} = {round}({ld}({name}_p, bcast_offset(t{name}, idx, ty.rank)));\n", ld = ctx.ld(t));
            }
            None => loads += &format!("        double {name} = 0.0;\n"),
        }
    }
    let source = format!(
        r#"{HELPERS}
extern "C" __global__ void {entry}({params}) {{
    i64 n = numel(ty);
    GRID_STRIDE(i, n) {{
        i64 idx[8];
        unravel(ty, i, idx);
{loads}        (void)a; (void)b; (void)c;
        double r = {formula};
        {st}(y, offset_at(ty, idx), r);
    }}
}}
"#,
        params = params.join(", "),
        formula = formula(attrs.mode),
        st = ctx.st(y),
    );
    Ok(NodeKernels::one(Launch::elementwise(source, &entry, ctx.numel(y), args)))
}
