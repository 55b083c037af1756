//! Pointwise ops on the CPU engine, checked against formulas written out in this file (never
//! `PointwiseMode::apply`): every mode of `PointwiseMode::all()`, numpy broadcasting, strided
//! inputs and outputs, odd sizes, every dtype family, comparisons to bool, binary_select,
//! gen_index, clipped relu; every backward form against central finite differences of its
//! forward mode in f64; and the errors of malformed graphs.

use ferrodnn::graph::ops::pointwise::PointwiseMode;
use ferrodnn::graph::ops::pointwise::PointwiseMode::*;
use ferrodnn::testing::{dot, numeric_gradient, relative_error, run_cpu, SplitMix64};
use ferrodnn::{DataType, Error, Graph, Nd, TensorDesc, TensorId};
use std::collections::{HashMap, HashSet};

// ---------------------------------------------------------------------------------------------
// Independent reference formulas.

/// erf(x) = 2/sqrt(pi) * integral_0^x exp(-t^2) dt by composite Simpson's rule with 20000
/// panels and compensated (Kahan) summation: truncation error below 1e-16 for |x| <= 3, an
/// independent method from the library's series and continued fraction.
fn erf_ref(x: f64) -> f64 {
    if x == 0.0 {
        return 0.0;
    }
    let n = 20000;
    let h = x / n as f64;
    let f = |t: f64| (-t * t).exp();
    let (mut sum, mut carry) = (0.0f64, 0.0f64);
    for i in 0..=n {
        let w = if i == 0 || i == n {
            1.0
        } else if i % 2 == 1 {
            4.0
        } else {
            2.0
        };
        let term = w * f(i as f64 * h) - carry;
        let next = sum + term;
        carry = (next - sum) - term;
        sum = next;
    }
    sum * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()
}

/// Standard normal CDF and density.
fn phi_cdf(x: f64) -> f64 {
    0.5 * (1.0 + erf_ref(x / 2f64.sqrt()))
}
fn phi_pdf(x: f64) -> f64 {
    (-x * x / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

fn logistic(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// tanh from exponentials.
fn tanh_ref(x: f64) -> f64 {
    let e = (2.0 * x).exp();
    (e - 1.0) / (e + 1.0)
}

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;

fn gelu_tanh_inner(x: f64) -> f64 {
    SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
}

fn truth(v: bool) -> f64 {
    if v {
        1.0
    } else {
        0.0
    }
}

/// The value of `mode` for one element, from each mode's textbook definition. Exhaustive on
/// purpose: a new mode does not compile here until it has a reference.
fn reference(mode: PointwiseMode, a: f64, b: f64, c: f64) -> f64 {
    match mode {
        Add | Bias => a + b,
        Sub => a - b,
        Mul | Scale => a * b,
        Div => a / b,
        Max => {
            if a >= b {
                a
            } else {
                b
            }
        }
        Min => {
            if a <= b {
                a
            } else {
                b
            }
        }
        Pow => (b * a.ln()).exp(),
        // C fmod: a - b * trunc(a / b), sign of a.
        Mod => a - b * (a / b).trunc(),
        AddSquare => a + b * b,
        Abs => {
            if a < 0.0 {
                -a
            } else {
                a
            }
        }
        Neg => -a,
        Exp => a.exp(),
        Log => a.ln(),
        Sqrt => a.sqrt(),
        Rsqrt => 1.0 / a.sqrt(),
        Reciprocal => 1.0 / a,
        Sin => a.sin(),
        Cos => a.cos(),
        Tan => a.sin() / a.cos(),
        Tanh => tanh_ref(a),
        Sigmoid => logistic(a),
        Erf => erf_ref(a),
        Floor => a.floor(),
        Ceil => a.ceil(),
        Identity => a,
        Relu { lower_clip, upper_clip, negative_slope } => {
            let lo = lower_clip.unwrap_or(0.0);
            let hi = upper_clip.unwrap_or(f64::INFINITY);
            let s = negative_slope.unwrap_or(0.0);
            let y = if a >= lo {
                a
            } else if s == 0.0 {
                lo
            } else {
                lo + s * (a - lo)
            };
            if y > hi {
                hi
            } else {
                y
            }
        }
        LeakyRelu { negative_slope } => {
            if a >= 0.0 {
                a
            } else {
                negative_slope * a
            }
        }
        Elu { alpha } => {
            if a > 0.0 {
                a
            } else {
                alpha * (a.exp() - 1.0)
            }
        }
        Gelu => a * phi_cdf(a),
        GeluApproxTanh => 0.5 * a * (1.0 + tanh_ref(gelu_tanh_inner(a))),
        Swish { beta } => a / (1.0 + (-beta * a).exp()),
        Softplus { beta } => (1.0 + (beta * a).exp()).ln() / beta,
        CmpEq => truth(a == b),
        CmpNeq => truth(a != b),
        CmpGt => truth(a > b),
        CmpGe => truth(a >= b),
        CmpLt => truth(a < b),
        CmpLe => truth(a <= b),
        LogicalAnd => truth(a != 0.0 && b != 0.0),
        LogicalOr => truth(a != 0.0 || b != 0.0),
        LogicalNot => truth(a == 0.0),
        BinarySelect => {
            if c != 0.0 {
                a
            } else {
                b
            }
        }
        GenIndex { .. } => f64::NAN, // depends on the position; checked on its own
        // Backward forms: a = dy, b = x; dx = dy * f'(x), derivatives worked by hand.
        ReluBackward { lower_clip, upper_clip, negative_slope } => {
            let lo = lower_clip.unwrap_or(0.0);
            let d = if b <= lo {
                negative_slope.unwrap_or(0.0)
            } else if upper_clip.is_some_and(|hi| b >= hi) {
                0.0
            } else {
                1.0
            };
            a * d
        }
        SigmoidBackward => a * logistic(b) * logistic(-b),
        TanhBackward => {
            let ch = b.cosh();
            a / (ch * ch)
        }
        EluBackward { alpha } => {
            if b > 0.0 {
                a
            } else {
                a * alpha * b.exp()
            }
        }
        GeluBackward => a * (phi_cdf(b) + b * phi_pdf(b)),
        GeluApproxTanhBackward => {
            let t = tanh_ref(gelu_tanh_inner(b));
            let sech2 = 1.0 - t * t;
            a * (0.5 * (1.0 + t) + 0.5 * b * sech2 * SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * b * b))
        }
        SwishBackward { beta } => {
            let s = logistic(beta * b);
            a * (s + beta * b * s * (1.0 - s))
        }
        SoftplusBackward { beta } => a * logistic(beta * b),
        LeakyReluBackward { negative_slope } => {
            if b > 0.0 {
                a
            } else {
                a * negative_slope
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Running graphs.

/// One input: dims, strides (None: packed row-major), type.
struct Input {
    dims: Vec<i64>,
    strides: Option<Vec<i64>>,
    dtype: DataType,
}

fn input(dims: &[i64], strides: Option<&[i64]>, dtype: DataType) -> Input {
    Input { dims: dims.to_vec(), strides: strides.map(|s| s.to_vec()), dtype }
}

/// Random values representable in `dtype` with the domain `mode` needs on input `port`.
fn values_for(mode: PointwiseMode, port: usize, n: usize, dtype: DataType, rng: &mut SplitMix64) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let mut v = match dtype {
                DataType::Bool => (rng.next_u64() & 1) as f64,
                DataType::U8 => (rng.next_u64() % 8) as f64,
                DataType::I8 | DataType::I32 | DataType::I64 => (rng.next_u64() % 9) as f64 - 4.0,
                _ => dtype.quantize(rng.uniform(-1.0, 1.0)),
            };
            // |v| and +-0.5 are representable in every float type, so domain fixes stay exact.
            let positive = matches!((mode, port), (Log | Sqrt | Rsqrt, 0) | (Pow, 0));
            let nonzero = matches!((mode, port), (Div | Mod, 1) | (Reciprocal, 0));
            if positive {
                v = v.abs();
            }
            if (positive || nonzero) && v.abs() < 0.125 {
                let fix = if dtype.is_float() { 0.5 } else { 1.0 };
                v = if v < 0.0 { -fix } else { fix };
            }
            v
        })
        .collect()
}

/// Build `mode` on the given inputs, run it on the CPU engine with `values`, return y and its
/// resolved type.
fn run_mode(mode: PointwiseMode, ins: &[Input], values: &[Vec<f64>], out_strides: Option<&[i64]>, out_type: Option<DataType>) -> (Nd, DataType) {
    let mut g = Graph::new("pw");
    let mut ids = Vec::new();
    for (i, inp) in ins.iter().enumerate() {
        let mut d = TensorDesc::new(format!("in{i}"), &inp.dims, inp.dtype);
        if let Some(s) = &inp.strides {
            d = d.with_strides(s);
        }
        ids.push(g.tensor(d));
    }
    let y = g.pointwise(mode, &ids);
    g.set_output(y);
    if let Some(s) = out_strides {
        g.desc_mut(y).strides = s.to_vec();
    }
    if let Some(t) = out_type {
        g.desc_mut(y).data_type = Some(t);
    }
    let mut check = g.clone();
    check.validate().unwrap_or_else(|e| panic!("{}: {e}", mode.name()));
    let dt = check.resolved_data_type(y).unwrap();
    let inputs: HashMap<TensorId, Nd> =
        ids.iter().zip(ins.iter().zip(values)).map(|(&id, (inp, v))| (id, Nd::new(inp.dims.iter().map(|&d| d as usize).collect(), v.clone()))).collect();
    let outs = run_cpu(&g, &inputs).unwrap_or_else(|e| panic!("{}: {e}", mode.name()));
    (outs[&y].clone(), dt)
}

/// The flat row-major position in an input of `in_dims` of output index `idx` under numpy
/// broadcasting (align right, size-1 axes repeat).
fn broadcast_flat(idx: &[usize], in_dims: &[i64]) -> usize {
    let off = idx.len() - in_dims.len();
    let mut flat = 0;
    for (a, &d) in in_dims.iter().enumerate() {
        let i = if d == 1 { 0 } else { idx[off + a] };
        flat = flat * d as usize + i;
    }
    flat
}

/// All multi-indices of `dims` in row-major order.
fn indices(dims: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![vec![]];
    for &d in dims {
        out = out.into_iter().flat_map(|p| (0..d).map(move |i| [p.clone(), vec![i]].concat())).collect();
    }
    out
}

/// How far a result stored in `dt` may be from the exact value rounded to `dt`: one unit in
/// the last place (a rounding boundary can fall between two f64 formulations), relative, plus
/// the type's smallest step near zero.
fn allowed(dt: DataType, want: f64) -> f64 {
    let (rel, abs) = match dt {
        DataType::F64 => (1e-12, 1e-14),
        DataType::F32 => (2f64.powi(-23), 1e-40),
        DataType::F16 => (2f64.powi(-10), 2f64.powi(-24)),
        DataType::Bf16 => (2f64.powi(-7), 1e-38),
        DataType::Fp8E4m3 => (2f64.powi(-3), 2f64.powi(-9)),
        DataType::Fp8E5m2 => (2f64.powi(-2), 2f64.powi(-16)),
        _ => (0.0, 0.0),
    };
    rel * want.abs() + abs
}

/// Run `mode` with random inputs and compare every element with `reference`.
fn check_mode(mode: PointwiseMode, ins: &[Input], out_strides: Option<&[i64]>, seed: u64) {
    let mut rng = SplitMix64::new(seed);
    let values: Vec<Vec<f64>> = ins.iter().enumerate().map(|(p, inp)| values_for(mode, p, inp.dims.iter().product::<i64>() as usize, inp.dtype, &mut rng)).collect();
    let (out, dt) = run_mode(mode, ins, &values, out_strides, None);
    assert!(values.iter().flatten().any(|&v| v != 0.0), "inputs are all zero");
    for idx in indices(&out.dims) {
        let args: Vec<f64> = ins.iter().zip(&values).map(|(inp, v)| v[broadcast_flat(&idx, &inp.dims)]).collect();
        let get = |i: usize| args.get(i).copied().unwrap_or(0.0);
        let exact = reference(mode, get(0), get(1), get(2));
        let want = dt.quantize(exact);
        let flat = idx.iter().zip(&out.dims).fold(0, |f, (&i, &d)| f * d + i);
        let got = out.data[flat];
        let ok = if want.is_infinite() || want.is_nan() { got == want || (got.is_nan() && want.is_nan()) } else { (got - want).abs() <= allowed(dt, want) };
        assert!(ok, "{} ({dt}) at {idx:?}, inputs {args:?}: got {got}, want {want} (exact {exact})", mode.name());
    }
}

fn is_float_mode(mode: PointwiseMode) -> bool {
    !mode.is_predicate() && !matches!(mode, BinarySelect | GenIndex { .. })
}

// ---------------------------------------------------------------------------------------------
// Tests.

#[test]
fn mode_names_are_unique_and_complete() {
    let names = PointwiseMode::all_names();
    let set: HashSet<&str> = names.iter().copied().collect();
    assert_eq!(set.len(), names.len(), "duplicate names in {names:?}");
    let expected = [
        "add",
        "sub",
        "mul",
        "div",
        "max",
        "min",
        "pow",
        "mod",
        "add_square",
        "scale",
        "bias",
        "abs",
        "neg",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "sin",
        "cos",
        "tan",
        "tanh",
        "sigmoid",
        "erf",
        "floor",
        "ceil",
        "identity",
        "relu",
        "leaky_relu",
        "elu",
        "gelu",
        "gelu_approx_tanh",
        "swish",
        "softplus",
        "cmp_eq",
        "cmp_neq",
        "cmp_gt",
        "cmp_ge",
        "cmp_lt",
        "cmp_le",
        "logical_and",
        "logical_or",
        "logical_not",
        "binary_select",
        "gen_index",
        "relu_backward",
        "sigmoid_backward",
        "tanh_backward",
        "elu_backward",
        "gelu_backward",
        "gelu_approx_tanh_backward",
        "swish_backward",
        "softplus_backward",
        "leaky_relu_backward",
    ];
    assert_eq!(set, expected.iter().copied().collect::<HashSet<_>>());
    // Every mode name is an op name the library lists, and arities are as documented.
    let ops = ferrodnn::graph::ops::all_op_names();
    for m in PointwiseMode::all() {
        assert!(ops.contains(&m.name()), "{} not in all_op_names", m.name());
        let want = match m.name() {
            "binary_select" => 3,
            n if n.ends_with("_backward") => 2,
            "abs" | "neg" | "exp" | "log" | "sqrt" | "rsqrt" | "reciprocal" | "sin" | "cos" | "tan" | "tanh" | "sigmoid" | "erf" | "floor" | "ceil" | "identity" | "relu"
            | "leaky_relu" | "elu" | "gelu" | "gelu_approx_tanh" | "swish" | "softplus" | "logical_not" | "gen_index" => 1,
            _ => 2,
        };
        assert_eq!(m.arity(), want, "{}", m.name());
    }
}

#[test]
fn erf_reference_matches_tables_and_the_engine() {
    // Tabulated values of erf.
    for (x, want) in
        [(0.5, 0.520_499_877_813_046_5), (1.0, 0.842_700_792_949_714_9), (2.0, 0.995_322_265_018_952_7), (3.0, 0.999_977_909_503_001_4), (-1.0, -0.842_700_792_949_714_9)]
    {
        assert!((erf_ref(x) - want).abs() < 1e-14, "erf_ref({x}) = {}", erf_ref(x));
    }
    // The engine's erf across its series / continued-fraction switch and into the tail.
    let xs = vec![0.1, -0.7, 1.3, 2.3, 2.45, 2.5, 2.55, -2.7, 3.0, 3.9, 4.5, 5.9, 6.5];
    let n = xs.len() as i64;
    let (out, _) = run_mode(Erf, &[input(&[n], None, DataType::F64)], std::slice::from_ref(&xs), None, None);
    for (x, got) in xs.iter().zip(&out.data) {
        let want = if x.abs() > 6.0 { x.signum() } else { erf_ref(*x) };
        assert!((got - want).abs() < 2e-15, "erf({x}) = {got}, want {want}");
    }
}

const FLOAT_TYPES: [DataType; 6] = [DataType::F64, DataType::F32, DataType::F16, DataType::Bf16, DataType::Fp8E4m3, DataType::Fp8E5m2];

#[test]
fn every_numeric_mode_in_every_float_type_with_broadcast_and_strides() {
    let mut seed = 100;
    for mode in PointwiseMode::all().into_iter().filter(|&m| is_float_mode(m)) {
        for dt in FLOAT_TYPES {
            seed += 1;
            if mode.arity() == 1 {
                // [3, 4, 5] stored with gaps: strides [40, 10, 2] (every other element).
                check_mode(mode, &[input(&[3, 4, 5], Some(&[40, 10, 2]), dt)], None, seed);
            } else {
                // [3, 1, 5] (padded rows) with [4, 1] (gaps) -> [3, 4, 5].
                let a = input(&[3, 1, 5], Some(&[7, 7, 1]), dt);
                let b = input(&[4, 1], Some(&[3, 1]), dt);
                check_mode(mode, &[a, b], None, seed);
            }
        }
    }
}

#[test]
fn binary_modes_broadcast_the_first_input_too_and_write_strided_outputs() {
    // a [5] against b [3, 4, 1] (-> [3, 4, 5]), a transposed-layout output, odd sizes.
    for mode in [Add, Sub, Mul, Div, Pow, Max, Min, Mod, AddSquare, Scale, Bias, SwishBackward { beta: 1.0 }] {
        for dt in [DataType::F32, DataType::Bf16] {
            let a = input(&[5], Some(&[3]), dt);
            let b = input(&[3, 4, 1], Some(&[1, 3, 1]), dt);
            check_mode(mode, &[a, b], Some(&[1, 3, 12]), 7);
        }
    }
    // Rank 1 against rank 4 with a size-13 axis.
    check_mode(Add, &[input(&[13], None, DataType::F64), input(&[2, 1, 3, 1], None, DataType::F64)], None, 8);
}

#[test]
fn arithmetic_on_integers_rounds_and_saturates() {
    for dt in [DataType::I32, DataType::I8] {
        for mode in [Add, Sub, Mul, Div, Max, Min, Mod, AddSquare, Scale, Bias, Abs, Neg, Identity] {
            if mode.arity() == 1 {
                check_mode(mode, &[input(&[3, 5], Some(&[1, 3]), dt)], None, 200);
            } else {
                check_mode(mode, &[input(&[3, 1, 5], None, dt), input(&[4, 1], Some(&[2, 1]), dt)], None, 201);
            }
        }
    }
    // Values picked by hand: i8 saturates at 127 / -128, division rounds half away from zero.
    let ins = [input(&[4], None, DataType::I8), input(&[4], None, DataType::I8)];
    let (y, dt) = run_mode(Mul, &ins, &[vec![100.0, -100.0, 7.0, -3.0], vec![2.0, 2.0, -1.0, 5.0]], None, None);
    assert_eq!(dt, DataType::I8);
    assert_eq!(y.data, vec![127.0, -128.0, -7.0, -15.0]);
    let (y, _) = run_mode(Div, &ins, &[vec![3.0, -3.0, 7.0, 1.0], vec![2.0, 2.0, -2.0, 3.0]], None, None);
    assert_eq!(y.data, vec![2.0, -2.0, -4.0, 0.0]);
    let (y, _) = run_mode(Mod, &ins, &[vec![7.0, -7.0, 7.0, -7.0], vec![3.0, 3.0, -3.0, -3.0]], None, None);
    assert_eq!(y.data, vec![1.0, -1.0, 1.0, -1.0]);
}

#[test]
fn relu_without_a_slope_clips_infinities_and_keeps_nan() {
    // As PyTorch's relu: -inf gives the lower clip (not 0 * -inf = NaN); a slope keeps -inf.
    let x = [f64::NEG_INFINITY, -2.5, -0.0, 0.0, 1.5, f64::INFINITY, f64::NAN];
    let ins = [input(&[7], None, DataType::F32)];
    let relu = |lower_clip, negative_slope| Relu { lower_clip, upper_clip: None, negative_slope };
    for (mode, want) in [
        (relu(None, None), [0.0, 0.0, 0.0, 0.0, 1.5, f64::INFINITY, f64::NAN]),
        (relu(Some(1.0), Some(0.0)), [1.0, 1.0, 1.0, 1.0, 1.5, f64::INFINITY, f64::NAN]),
        (relu(None, Some(0.5)), [f64::NEG_INFINITY, -1.25, 0.0, 0.0, 1.5, f64::INFINITY, f64::NAN]),
    ] {
        let (y, _) = run_mode(mode, &ins, &[x.to_vec()], None, None);
        for ((&got, &w), &a) in y.data.iter().zip(&want).zip(&x) {
            assert!(got == w || (got.is_nan() && w.is_nan()), "{mode:?} of {a}: {got}, want {w}");
        }
    }
}

#[test]
fn comparisons_produce_bool() {
    for dt in [DataType::F32, DataType::F16, DataType::I32, DataType::Fp8E4m3] {
        for mode in [CmpEq, CmpNeq, CmpGt, CmpGe, CmpLt, CmpLe] {
            // Values on a grid of quarters, so that equal pairs occur.
            let mut rng = SplitMix64::new(300);
            let grid = |n: usize, rng: &mut SplitMix64| {
                (0..n).map(|_| (rng.next_u64() % 9) as f64 * 0.25 - 1.0).map(|v| if dt == DataType::I32 { (v * 4.0).round() } else { v }).collect::<Vec<f64>>()
            };
            let a = grid(15, &mut rng);
            let b = grid(4, &mut rng);
            let ins = [input(&[3, 1, 5], Some(&[5, 5, 1]), dt), input(&[4, 1], None, dt)];
            let (y, out_dt) = run_mode(mode, &ins, &[a.clone(), b.clone()], None, None);
            assert_eq!(out_dt, DataType::Bool, "{}", mode.name());
            assert_eq!(y.dims, vec![3, 4, 5]);
            let mut seen = HashSet::new();
            for i in 0..3 {
                for (j, &z) in b.iter().enumerate() {
                    for k in 0..5 {
                        let x = a[i * 5 + k];
                        let want = match mode {
                            CmpEq => x == z,
                            CmpNeq => x != z,
                            CmpGt => x > z,
                            CmpGe => x >= z,
                            CmpLt => x < z,
                            _ => x <= z,
                        };
                        let got = y.data[(i * 4 + j) * 5 + k];
                        assert_eq!(got, truth(want), "{} {dt} {x} vs {z}", mode.name());
                        seen.insert(got as i64);
                    }
                }
            }
            assert_eq!(seen.len(), 2, "{} {dt}: both outcomes should occur", mode.name());
        }
    }
}

#[test]
fn logic_on_bool_and_on_numbers() {
    for mode in [LogicalAnd, LogicalOr] {
        check_mode(mode, &[input(&[3, 1, 5], None, DataType::Bool), input(&[4, 1], Some(&[2, 1]), DataType::Bool)], None, 400);
    }
    check_mode(LogicalNot, &[input(&[3, 5], Some(&[1, 3]), DataType::Bool)], None, 401);
    // Numbers are true when nonzero.
    let ins = [input(&[5], None, DataType::F32), input(&[5], None, DataType::F32)];
    let (y, dt) = run_mode(LogicalAnd, &ins, &[vec![0.0, 0.5, -2.0, 0.0, 1.0], vec![1.0, 0.0, -3.0, 0.0, 0.25]], None, None);
    assert_eq!(dt, DataType::Bool);
    assert_eq!(y.data, vec![0.0, 0.0, 1.0, 0.0, 1.0]);
    let (y, _) = run_mode(LogicalNot, &ins[..1], &[vec![0.0, 0.5, -2.0, 0.0, 1.0]], None, None);
    assert_eq!(y.data, vec![1.0, 0.0, 0.0, 1.0, 0.0]);
}

#[test]
fn binary_select_picks_by_a_bool_mask() {
    for dt in [DataType::F32, DataType::F16, DataType::I32] {
        // a [3, 4, 5] channels-last-like, b [5], c [3, 4, 1] bool.
        let ins = [input(&[3, 4, 5], Some(&[20, 1, 4]), dt), input(&[5], None, dt), input(&[3, 4, 1], None, DataType::Bool)];
        check_mode(BinarySelect, &ins, None, 500);
    }
    let ins = [input(&[4], None, DataType::F32), input(&[4], None, DataType::F32), input(&[4], None, DataType::Bool)];
    let (y, dt) = run_mode(BinarySelect, &ins, &[vec![1.0, 2.0, 3.0, 4.0], vec![-1.0, -2.0, -3.0, -4.0], vec![1.0, 0.0, 0.0, 1.0]], None, None);
    assert_eq!(dt, DataType::F32);
    assert_eq!(y.data, vec![1.0, -2.0, -3.0, 4.0]);
}

#[test]
fn gen_index_on_each_axis() {
    let dims = [3usize, 13, 4];
    for axis in 0..3 {
        let x = input(&[3, 13, 4], Some(&[1, 12, 3]), DataType::F16);
        let vals = vec![vec![0.5; 3 * 13 * 4]];
        let (y, dt) = run_mode(GenIndex { axis }, &[x], &vals, None, None);
        assert_eq!(dt, DataType::I32);
        for idx in indices(&dims) {
            let flat = (idx[0] * 13 + idx[1]) * 4 + idx[2];
            assert_eq!(y.data[flat], idx[axis] as f64, "axis {axis} at {idx:?}");
        }
    }
    // Into an f32 output, on the last axis of a rank-4 tensor.
    let (y, dt) = run_mode(GenIndex { axis: 3 }, &[input(&[2, 1, 3, 7], None, DataType::F32)], &[vec![1.0; 42]], None, Some(DataType::F32));
    assert_eq!(dt, DataType::F32);
    for (i, v) in y.data.iter().enumerate() {
        assert_eq!(*v, (i % 7) as f64);
    }
}

#[test]
fn relu_with_clips_and_slope() {
    let variants = [
        Relu { lower_clip: None, upper_clip: Some(0.5), negative_slope: None },
        Relu { lower_clip: Some(-0.25), upper_clip: None, negative_slope: None },
        Relu { lower_clip: None, upper_clip: None, negative_slope: Some(0.1) },
        Relu { lower_clip: Some(-0.25), upper_clip: Some(0.5), negative_slope: Some(0.1) },
        Relu { lower_clip: Some(0.2), upper_clip: Some(0.6), negative_slope: Some(0.3) },
    ];
    for (i, mode) in variants.into_iter().enumerate() {
        for dt in [DataType::F64, DataType::F32, DataType::F16] {
            check_mode(mode, &[input(&[7, 5], Some(&[1, 7]), dt)], None, 600 + i as u64);
        }
    }
    // Hand-worked: lower -0.25, upper 0.5, slope 0.1.
    let mode = variants[3];
    let xs = vec![-1.25, -0.25, 0.0, 0.25, 0.5, 2.0];
    let (y, _) = run_mode(mode, &[input(&[6], None, DataType::F64)], &[xs], None, None);
    assert_eq!(y.data, vec![-0.25 - 0.1, -0.25, 0.0, 0.25, 0.5, 0.5]);
    // Plain relu, relu6-style clip, and leaky relu by hand.
    let xs = vec![-2.0, -0.5, 0.0, 0.5, 7.0];
    let (y, _) = run_mode(Relu { lower_clip: None, upper_clip: None, negative_slope: None }, &[input(&[5], None, DataType::F32)], std::slice::from_ref(&xs), None, None);
    assert_eq!(y.data, vec![0.0, 0.0, 0.0, 0.5, 7.0]);
    let (y, _) = run_mode(Relu { lower_clip: None, upper_clip: Some(6.0), negative_slope: None }, &[input(&[5], None, DataType::F32)], std::slice::from_ref(&xs), None, None);
    assert_eq!(y.data, vec![0.0, 0.0, 0.0, 0.5, 6.0]);
    let (y, _) = run_mode(LeakyRelu { negative_slope: 0.25 }, &[input(&[5], None, DataType::F32)], &[xs], None, None);
    assert_eq!(y.data, vec![-0.5, -0.125, 0.0, 0.5, 7.0]);
}

#[test]
fn activations_with_other_parameters() {
    for mode in [
        Elu { alpha: 0.7 },
        Swish { beta: 1.7 },
        Softplus { beta: 2.5 },
        LeakyRelu { negative_slope: 0.3 },
        EluBackward { alpha: 0.7 },
        SwishBackward { beta: 1.7 },
        SoftplusBackward { beta: 2.5 },
        LeakyReluBackward { negative_slope: 0.3 },
    ] {
        for dt in [DataType::F64, DataType::F32] {
            let ins: Vec<Input> = (0..mode.arity()).map(|i| input(&[5, 3], if i == 0 { Some(&[1, 5]) } else { None }, dt)).collect();
            check_mode(mode, &ins, None, 700);
        }
    }
    // Known values: sigmoid(0) = 1/2, tanh(atanh(0.5)) = 0.5, softplus(0) = ln 2,
    // gelu(1) = Phi(1) = 0.8413447460685429, elu(-1) = e^-1 - 1.
    let f64in = [input(&[1], None, DataType::F64)];
    let one = |mode, x: f64| run_mode(mode, &f64in, &[vec![x]], None, None).0.data[0];
    assert_eq!(one(Sigmoid, 0.0), 0.5);
    assert!((one(Tanh, 0.5f64.atanh()) - 0.5).abs() < 1e-15);
    assert!((one(Softplus { beta: 1.0 }, 0.0) - 2f64.ln()).abs() < 1e-15);
    assert!((one(Gelu, 1.0) - 0.841_344_746_068_542_9).abs() < 1e-15);
    assert!((one(Elu { alpha: 1.0 }, -1.0) - ((-1f64).exp() - 1.0)).abs() < 1e-15);
    assert!((one(Erf, 0.5) - 0.520_499_877_813_046_5).abs() < 1e-15);
    // Large arguments stay finite where the function is.
    assert_eq!(one(Softplus { beta: 1.0 }, 800.0), 800.0);
    assert_eq!(one(Sigmoid, -800.0), 0.0);
}

/// The forward mode whose derivative a backward mode gives.
fn forward_of(mode: PointwiseMode) -> PointwiseMode {
    match mode {
        ReluBackward { lower_clip, upper_clip, negative_slope } => Relu { lower_clip, upper_clip, negative_slope },
        SigmoidBackward => Sigmoid,
        TanhBackward => Tanh,
        EluBackward { alpha } => Elu { alpha },
        GeluBackward => Gelu,
        GeluApproxTanhBackward => GeluApproxTanh,
        SwishBackward { beta } => Swish { beta },
        SoftplusBackward { beta } => Softplus { beta },
        LeakyReluBackward { negative_slope } => LeakyRelu { negative_slope },
        other => panic!("{} is not a backward mode", other.name()),
    }
}

#[test]
fn every_backward_mode_matches_finite_differences_of_its_forward() {
    let mut modes: Vec<PointwiseMode> = PointwiseMode::all().into_iter().filter(|m| m.name().ends_with("_backward")).collect();
    assert_eq!(modes.len(), 9);
    modes.extend([
        ReluBackward { lower_clip: Some(-0.25), upper_clip: Some(0.5), negative_slope: Some(0.1) },
        EluBackward { alpha: 0.6 },
        SwishBackward { beta: 1.8 },
        SoftplusBackward { beta: 3.0 },
        LeakyReluBackward { negative_slope: 0.2 },
    ]);
    let dims = [3usize, 5];
    let kinks = [0.0, -0.25, 0.5];
    for (i, &bwd) in modes.iter().enumerate() {
        let mut rng = SplitMix64::new(800 + i as u64);
        // x in [-2, 2), kept 1e-2 away from every kink of the relu family.
        let x: Vec<f64> = (0..15)
            .map(|_| {
                let mut v = rng.uniform(-2.0, 2.0);
                while kinks.iter().any(|k| (v - k).abs() < 1e-2) {
                    v += 0.03;
                }
                v
            })
            .collect();
        let dy: Vec<f64> = (0..15).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let x = Nd::new(dims.to_vec(), x);
        let dy = Nd::new(dims.to_vec(), dy);

        // Forward graph y = f(x) in f64; the loss is sum(y * dy).
        let mut fg = Graph::new("fwd");
        let xf = fg.tensor(TensorDesc::new("x", &[3, 5], DataType::F64));
        let yf = fg.pointwise(forward_of(bwd), &[xf]);
        fg.set_output(yf);
        let loss = |probe: &Nd| {
            let outs = run_cpu(&fg, &HashMap::from([(xf, probe.clone())])).unwrap();
            dot(&outs[&yf], &dy)
        };
        let numeric = numeric_gradient(&x, 1e-6, loss);

        // Backward graph dx = bwd(dy, x), with x stored transposed.
        let mut bg = Graph::new("bwd");
        let dyt = bg.tensor(TensorDesc::new("dy", &[3, 5], DataType::F64));
        let xt = bg.tensor(TensorDesc::new("x", &[3, 5], DataType::F64).with_strides(&[1, 3]));
        let dx = bg.pointwise(bwd, &[dyt, xt]);
        bg.set_output(dx);
        let outs = run_cpu(&bg, &HashMap::from([(dyt, dy.clone()), (xt, x.clone())])).unwrap();
        let err = relative_error(&outs[&dx].data, &numeric.data);
        assert!(err < 1e-7, "{}: relative error {err} against finite differences", bwd.name());
        assert!(outs[&dx].data.iter().any(|&v| v != 0.0), "{}: gradient is all zero", bwd.name());
    }
}

// ---- Bad graphs ----

fn invalid(mut g: Graph) -> String {
    match g.validate() {
        Err(Error::InvalidGraph(msg)) => msg,
        other => panic!("expected InvalidGraph, got {other:?}"),
    }
}

fn bad_graph(mode: PointwiseMode, dims: &[&[i64]], want: &[&str]) {
    let mut g = Graph::new("bad");
    let ids: Vec<TensorId> = dims.iter().enumerate().map(|(i, d)| g.tensor(TensorDesc::new(format!("t{i}"), d, DataType::F32))).collect();
    let y = g.pointwise(mode, &ids);
    g.set_output(y);
    let msg = invalid(g);
    for w in want {
        assert!(msg.contains(w), "{}: message {msg:?} lacks {w:?}", mode.name());
    }
}

#[test]
fn bad_graphs_are_rejected_with_clear_messages() {
    bad_graph(Add, &[&[3, 4], &[5]], &["add", "inputs do not broadcast", "a [3, 4]", "b [5]"]);
    bad_graph(BinarySelect, &[&[2, 3], &[3], &[2, 2]], &["binary_select", "do not broadcast", "c [2, 2]"]);
    bad_graph(Add, &[&[3]], &["add", "takes 2 input(s)", "but 1 is connected", "input `b` is missing"]);
    bad_graph(Exp, &[&[3], &[3]], &["exp", "takes 1 input(s)", "2 are connected", "`b`"]);
    bad_graph(Mul, &[&[3], &[3], &[3], &[3]], &["mul", "takes 2 input(s)", "4 are connected"]);
    bad_graph(BinarySelect, &[&[3], &[3]], &["binary_select", "takes 3 input(s)", "input `c` is missing"]);
    bad_graph(GenIndex { axis: 2 }, &[&[3, 4]], &["gen_index", "axis must be below the rank 2, got 2"]);
    bad_graph(Sigmoid, &[], &["sigmoid", "input `a` is missing"]);
    // An output given dims that do not match the broadcast shape.
    let mut g = Graph::new("bad");
    let a = g.tensor(TensorDesc::new("a", &[3, 1], DataType::F32));
    let b = g.tensor(TensorDesc::new("b", &[4], DataType::F32));
    let y = g.add(a, b);
    g.set_output(y);
    g.desc_mut(y).dims = vec![3, 5];
    let msg = invalid(g);
    assert!(msg.contains("was given dims [3, 5] but the op produces [3, 4]"), "{msg}");
}
