//! The epilogue of a GEMM group as one device function,
//! `float epilogue(float acc, long long batch, long long row, long long col, <side inputs>)`:
//! the pointwise nodes after the matmul applied to the f32 accumulator with the formulas of the
//! fused pointwise engine (`fused/pointwise.rs`), in f32.
//!
//! Side inputs (bias `[.., 1, n]`, `[.., m, 1]`, a residual `[.., m, n]`, any strides) are read
//! at offsets baked into the source from their broadcast strides over C's dims; `batch` is the
//! row-major flat index over C's batch dims. By-value constants become literals (rounded to
//! their tensor's type, as the CPU engine does). Intermediate values are rounded to their
//! tensor's type when it is 16-bit (the chain allows that only under a 16-bit or fp8 output,
//! see `epilogue_chain`); f32 intermediates need nothing.
//!
//! The same chain is also written as a pure function of the accumulator and the side inputs'
//! values, `float epilogue_v(float acc, float x0, ...)`, with each side input's layout
//! ([`Side`]): a kernel that knows which elements a thread stores can then load a bias once per
//! tile instead of once per element (`sm90.rs`), and `epilogue` is a wrapper that loads the
//! values of one element and calls `epilogue_v`.

use super::{dtype, Epilogue};
use crate::dtype::DataType;
use crate::engine::cuda::fused::pointwise::{formula, helpers, lit};
use crate::engine::cuda::kernel::Arg;
use crate::graph::ops::pointwise::PointwiseMode;
use crate::graph::ops::Op;
use crate::graph::{Graph, TensorId};
use std::collections::HashMap;
use std::fmt::Write;

fn ctype(dt: DataType) -> Option<&'static str> {
    match dt {
        DataType::F32 => Some("float"),
        DataType::F16 => Some("__half"),
        DataType::Bf16 => Some("__nv_bfloat16"),
        _ => None,
    }
}

/// Rounding of a value to a 16-bit intermediate type (nothing for f32).
fn round_to(dt: DataType, v: &str) -> Option<String> {
    match dt {
        DataType::F16 => Some(format!("{v} = fz_cv(fz_to_f16({v}));")),
        DataType::Bf16 => Some(format!("{v} = fz_cv(fz_to_bf16({v}));")),
        _ => None,
    }
}

/// The f32 formula of a pointwise mode in the epilogue: the fused engine's, except the plain
/// relu ([`plain_relu`]), whose general form (clips, slope, a NaN test) costs seven
/// instructions per element where two give the same values: 0 below zero (-inf included),
/// `a` otherwise (NaN included).
fn node_formula(mode: PointwiseMode, fast: bool) -> String {
    match mode {
        m if plain_relu(m) => "a < 0.f ? 0.f : a".into(),
        _ => formula(mode, false, fast),
    }
}

/// A relu without clips other than 0 and without a slope: `max(a, 0)` with NaN kept.
fn plain_relu(mode: PointwiseMode) -> bool {
    let zero = |v: Option<f64>| v.is_none_or(|v| v == 0.0);
    matches!(mode, PointwiseMode::Relu { lower_clip, upper_clip: None, negative_slope } if zero(lower_clip) && zero(negative_slope))
}

/// How a side input varies over C's elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SideKind {
    /// One value (per batch at most): by-value-like, e.g. a `[1, 1]` scale.
    Scalar,
    /// One value per row of C: a `[.., m, 1]` bias.
    PerRow,
    /// One value per column of C: a `[.., 1, n]` bias.
    PerCol,
    /// One value per element: a residual `[.., m, n]`.
    Full,
}

/// A side input of the epilogue (parameter `e<i>` of `epilogue`, value `x<i>` of
/// `epilogue_v`): element `(batch, row, col)` of C reads it at
/// `batch offset + row * row_stride + col * col_stride` elements.
#[derive(Clone, Debug, PartialEq)]
pub struct Side {
    pub tensor: TensorId,
    pub dtype: DataType,
    /// Element strides along C's rows and columns (0: broadcast).
    pub row_stride: i64,
    pub col_stride: i64,
    /// (extent, stride) of C's batch dims, outermost first (stride 0: broadcast).
    pub batch: Vec<(i64, i64)>,
}

impl Side {
    pub fn kind(&self) -> SideKind {
        match (self.row_stride != 0, self.col_stride != 0) {
            (false, false) => SideKind::Scalar,
            (true, false) => SideKind::PerRow,
            (false, true) => SideKind::PerCol,
            (true, true) => SideKind::Full,
        }
    }

    /// The C type of the tensor's elements.
    pub fn ctype(&self) -> &'static str {
        ctype(self.dtype).unwrap_or("float")
    }

    /// Whether any batch dim moves the side input.
    pub fn batched(&self) -> bool {
        self.batch.iter().any(|&(_, s)| s != 0)
    }

    /// Statements adding the batch offset of row-major flat batch index `bt` (a C expression)
    /// to the `long long` variable `var`.
    pub fn batch_offset(&self, bt: &str, var: &str) -> String {
        let mut s = String::new();
        if !self.batched() {
            return s;
        }
        let _ = writeln!(s, "{{\n        long long q = {bt};");
        for &(extent, stride) in self.batch.iter().rev() {
            if stride != 0 {
                let _ = writeln!(s, "        {var} += (q % {extent}LL) * {stride}LL;");
            }
            let _ = writeln!(s, "        q /= {extent}LL;");
        }
        let _ = writeln!(s, "        (void)q;\n    }}");
        s
    }

    /// Two adjacent columns `(col, col + 1)` with `col` even can be read as one 2-element vector
    /// (with a 16-byte aligned base pointer): contiguous columns, an even number of them, and even
    /// row and batch strides.
    pub fn pairs(&self, n: usize) -> bool {
        self.col_stride == 1 && n % 2 == 0 && self.row_stride % 2 == 0 && self.batch.iter().all(|&(_, s)| s % 2 == 0)
    }
}

/// The epilogue's side inputs as it builds them: each tensor's value name (`x<i>`), its loads in
/// the `epilogue` wrapper, parameters, arguments and layouts.
#[derive(Default)]
struct Sides {
    loads: String,
    params: String,
    names: String,
    args: Vec<Arg>,
    sides: Vec<Side>,
    value: HashMap<usize, String>,
}

impl Sides {
    /// The value of tensor `t` for element `(batch, row, col)` of C (dims `cdims`): a literal for a
    /// by-value constant (rounded to its type, as the CPU engine does), else a side input at its
    /// broadcast offset, loaded once however many nodes read it.
    fn value(&mut self, graph: &Graph, t: TensorId, cdims: &[i64]) -> Option<String> {
        let d = graph.desc(t);
        if d.is_pass_by_value {
            return Some(lit(dtype(graph, t).quantize(d.value?), false));
        }
        if let Some(x) = self.value.get(&t.0) {
            return Some(x.clone());
        }
        let rc = cdims.len();
        let i = self.args.len();
        let dt = dtype(graph, t);
        let ct = ctype(dt)?;
        let r = d.dims.len();
        if r > rc || d.strides.len() != r {
            return None;
        }
        let shift = rc - r;
        let eff: Vec<i64> = (0..rc).map(|a| if a < shift || d.dims[a - shift] == 1 { 0 } else { d.strides[a - shift] }).collect();
        let sd = Side { tensor: t, dtype: dt, row_stride: eff[rc - 2], col_stride: eff[rc - 1], batch: (0..rc - 2).map(|a| (cdims[a], eff[a])).collect() };
        let mut off = String::from("0LL");
        if sd.row_stride != 0 {
            let _ = write!(off, " + row * {}LL", sd.row_stride);
        }
        if sd.col_stride != 0 {
            let _ = write!(off, " + col * {}LL", sd.col_stride);
        }
        let _ = writeln!(self.loads, "    long long o{i} = {off};");
        let bo = sd.batch_offset("batch", &format!("o{i}"));
        if !bo.is_empty() {
            let _ = write!(self.loads, "    {bo}");
        }
        let _ = writeln!(self.loads, "    const float x{i} = fz_cv(((const {ct}*)e{i})[o{i}]);");
        let _ = write!(self.params, ", const void* __restrict__ e{i}");
        let _ = write!(self.names, ", e{i}");
        self.args.push(Arg::Ptr(t));
        self.sides.push(sd);
        self.value.insert(t.0, format!("x{i}"));
        Some(format!("x{i}"))
    }
}

/// The epilogue of matmul `mm` followed by `chain` (nodes already checked by
/// `epilogue_chain`), or None when a node cannot be expressed. `scales`: tensors (by-value
/// scalars, or per-row / per-column / per-tensor side inputs) the accumulator is multiplied by
/// first, the scales of the operands' prologues (`super::Prologue`).
pub fn build(graph: &Graph, mm: usize, scales: &[TensorId], chain: &[usize]) -> Option<Epilogue> {
    let c = graph.nodes.get(mm)?.output("c")?;
    let cdims = graph.desc(c).dims.clone();
    let rc = cdims.len();
    if rc < 2 {
        return None;
    }
    let out = match chain.last() {
        Some(&n) => graph.nodes[n].outputs.first()?.tensor,
        None => c,
    };
    // Fast exp/sigmoid intrinsics when the output's rounding dwarfs their error.
    let fast = matches!(dtype(graph, out), DataType::F16 | DataType::Bf16 | DataType::Fp8E4m3 | DataType::Fp8E5m2);
    // `body`: the formulas over `acc` and the side values `x<i>` (epilogue_v); `loads`: the
    // wrapper's loads of one element's side values.
    let mut body = String::new();
    let mut sv = Sides::default();
    let mut prev: (TensorId, String) = (c, "acc".to_string());
    // The chain up to its last node (its body and value), for `epilogue_u`.
    let mut before_last = (String::new(), String::new());
    for &t in scales {
        let x = sv.value(graph, t, &cdims)?;
        let _ = writeln!(body, "    acc *= {x};");
    }
    if !chain.is_empty() {
        if let Some(r) = round_to(dtype(graph, c), "acc") {
            let _ = writeln!(body, "    {r}");
        }
    }
    for (k, &n) in chain.iter().enumerate() {
        let node = graph.nodes.get(n)?;
        let Op::Pointwise(attrs) = &node.op else { return None };
        // Port values of this node (a side input read by several nodes is loaded once).
        let mut inner = String::new();
        for port in &node.inputs {
            let v = if port.tensor == prev.0 { prev.1.clone() } else { sv.value(graph, port.tensor, &cdims)? };
            let _ = writeln!(inner, "        const float {} = {v};", port.name);
        }
        if k + 1 == chain.len() {
            before_last = (body.clone(), prev.1.clone());
        }
        let _ = writeln!(body, "    float v{k};\n    {{\n{inner}        v{k} = {};\n    }}", node_formula(attrs.mode, fast));
        let y = node.outputs.first()?.tensor;
        if k + 1 < chain.len() {
            if let Some(r) = round_to(dtype(graph, y), &format!("v{k}")) {
                let _ = writeln!(body, "    {r}");
            }
        }
        prev = (y, format!("v{k}"));
    }
    let Sides { loads, params, names, args, sides, .. } = sv;
    let xparams: String = (0..sides.len()).map(|i| format!(", float x{i}")).collect();
    // A last plain relu under a 16-bit C can be the conversion's (`cvt.rn.relu`): the same
    // values (negative and -inf to +0, NaN kept).
    let relu_last =
        matches!(dtype(graph, out), DataType::F16 | DataType::Bf16) && chain.last().is_some_and(|&n| matches!(&graph.nodes[n].op, Op::Pointwise(a) if plain_relu(a.mode)));
    let unrelu =
        if relu_last { format!("__device__ __forceinline__ float epilogue_u(float acc{xparams}) {{\n{}    return {};\n}}\n", before_last.0, before_last.1) } else { String::new() };
    let xnames: String = (0..sides.len()).map(|i| format!(", x{i}")).collect();
    let code = format!(
        "{helpers}\n{unrelu}__device__ __forceinline__ float epilogue_v(float acc{xparams}) {{\n{body}    return {ret};\n}}\n__device__ __forceinline__ float epilogue(float acc, long long batch, long long row, long long col{params}) {{\n    (void)batch; (void)row; (void)col;\n{loads}    return epilogue_v(acc{xnames});\n}}\n",
        helpers = helpers(false, fast),
        ret = prev.1
    );
    Some(Epilogue { nodes: chain.to_vec(), code, params, names, args, sides: Some(sides), relu_last, tap: None })
}
