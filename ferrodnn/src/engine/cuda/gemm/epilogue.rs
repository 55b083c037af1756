//! The epilogue of a GEMM group as one device function,
//! `float epilogue(float acc, long long batch, long long row, long long col, <side inputs>)`:
//! the pointwise nodes after the matmul applied to the f32 accumulator, each a call of the
//! pointwise op library (`pointwise/ops.cuh`) as in the fused pointwise kernels, in f32. The
//! device code is `epilogue.cuh`; this file chooses its defines (the chain as calls, the side
//! inputs' offsets) and [`Epilogue::code`] is the instantiated text a GEMM kernel includes.
//!
//! Side inputs (bias `[.., 1, n]`, `[.., m, 1]`, a residual `[.., m, n]`, any strides) are read
//! at offsets baked into the source from their broadcast strides over C's dims; `batch` is the
//! row-major flat index over C's batch dims. By-value constants and the nodes' attributes are
//! float parameters `ea<j>` after the side inputs' (a constant rounded to its tensor's type when
//! the plan executes, as the CPU engine reads it), so that one kernel serves every value; the
//! GEMM kernel's parameter list ends with them ([`Epilogue::params`]). Intermediate values are rounded to their
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
use crate::engine::cuda::kernel::ctype::float_c_type;
use crate::engine::cuda::kernel::{Arg, Signature, Source};
use crate::engine::cuda::pointwise::{self as ops, Form};
use crate::graph::ops::pointwise::PointwiseMode;
use crate::graph::ops::Op;
use crate::graph::{Graph, TensorId};
use std::collections::HashMap;
use std::fmt::Write;

/// Rounding of a value to a 16-bit intermediate type (None for f32).
fn round_to(dt: DataType, v: &str) -> Option<String> {
    matches!(dt, DataType::F16 | DataType::Bf16).then(|| format!("fz_cv(fz_to_{}({v}))", dt.name()))
}

/// The call of a pointwise node in the epilogue: the fused engine's, in f32, except the plain
/// relu ([`plain_relu`]), whose general form (clips, slope, a NaN test) costs seven
/// instructions per element where two give the same values: 0 below zero (-inf included),
/// `a` otherwise (NaN included).
fn node_call(mode: PointwiseMode, args: [&str; 3], sv: &mut Sides) -> String {
    if plain_relu(mode) {
        return format!("pw_relu0({})", args[0]);
    }
    ops::call(mode, args, Form::Fused, false, &mut |v| {
        sv.scalar(|sig, name| {
            sig.f32(name, v);
        })
    })
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
        float_c_type(self.dtype).unwrap_or("float")
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

/// The epilogue's inputs as it builds them: the side inputs (each tensor's value name `x<i>`,
/// its parameter `e<i>`, layout and offset) and the scalar parameters `ea<j>` (by-value scalars
/// and attributes, floats).
#[derive(Default)]
struct Sides {
    /// The parameters `, const void* __restrict__ e<i>` and their arguments.
    params: String,
    args: Vec<Arg>,
    sides: Vec<Side>,
    /// `X(i, T)` of `EPI_SIDES`, and each one's `EPI_OFF<i>`.
    list: Vec<String>,
    offsets: Vec<String>,
    value: HashMap<usize, String>,
    /// The scalar parameters, their names and arguments.
    scalars: Signature,
    scalar_names: Vec<String>,
}

impl Sides {
    /// The value of tensor `t` for element `(batch, row, col)` of C (dims `cdims`): a parameter
    /// for a by-value constant (rounded to its type when the plan executes, as the CPU engine
    /// reads it), else a side input at its broadcast offset; either once however many nodes
    /// read it.
    fn value(&mut self, graph: &Graph, t: TensorId, cdims: &[i64]) -> Option<String> {
        let d = graph.desc(t);
        if let Some(x) = self.value.get(&t.0) {
            return Some(x.clone());
        }
        if d.is_pass_by_value {
            d.value?;
            let name = self.scalar(|sig, name| {
                sig.scalar(name, t, false);
            });
            self.value.insert(t.0, name.clone());
            return Some(name);
        }
        let rc = cdims.len();
        let i = self.sides.len();
        let dt = dtype(graph, t);
        let ct = float_c_type(dt)?;
        let r = d.dims.len();
        if r > rc || d.strides.len() != r {
            return None;
        }
        let shift = rc - r;
        let eff: Vec<i64> = (0..rc).map(|a| if a < shift || d.dims[a - shift] == 1 { 0 } else { d.strides[a - shift] }).collect();
        let sd = Side { tensor: t, dtype: dt, row_stride: eff[rc - 2], col_stride: eff[rc - 1], batch: (0..rc - 2).map(|a| (cdims[a], eff[a])).collect() };
        // The offset at batch `b`, row `r`, column `c`: the batch dims innermost first.
        let mut off = String::from("0LL");
        if sd.row_stride != 0 {
            let _ = write!(off, " + r * {}LL", sd.row_stride);
        }
        if sd.col_stride != 0 {
            let _ = write!(off, " + c * {}LL", sd.col_stride);
        }
        if sd.batched() {
            let mut q = "b".to_string();
            for &(extent, stride) in sd.batch.iter().rev() {
                if stride != 0 {
                    let _ = write!(off, " + ({q} % {extent}LL) * {stride}LL");
                }
                q = format!("{q} / {extent}LL");
            }
        }
        let _ = write!(self.params, ", const void* __restrict__ e{i}");
        self.args.push(Arg::Ptr(t));
        self.list.push(format!("X({i}, {ct})"));
        self.offsets.push(format!("({off})"));
        self.sides.push(sd);
        self.value.insert(t.0, format!("x{i}"));
        Some(format!("x{i}"))
    }

    /// A new scalar parameter `ea<j>`, declared by `declare`.
    fn scalar(&mut self, declare: impl FnOnce(&mut Signature, &str)) -> String {
        let name = format!("ea{}", self.scalar_names.len());
        declare(&mut self.scalars, &name);
        self.scalar_names.push(name.clone());
        name
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
    let mut sv = Sides::default();
    // The accumulator times the scales, rounded to C's type when a chain follows.
    let mut acc = "acc".to_string();
    for &t in scales {
        let x = sv.value(graph, t, &cdims)?;
        acc = format!("{acc} * {x}");
    }
    if !chain.is_empty() {
        if let Some(r) = round_to(dtype(graph, c), &acc) {
            acc = r;
        }
    }
    // Each node's value `v<k>` (the last one's apart), over the previous node's.
    let mut nodes = Vec::new();
    let mut prev: (TensorId, String) = (c, "acc".to_string());
    let mut last = (String::from("acc"), String::from("acc"));
    for (k, &n) in chain.iter().enumerate() {
        let node = graph.nodes.get(n)?;
        let Op::Pointwise(attrs) = &node.op else { return None };
        // Port values of this node (a side input read by several nodes is loaded once).
        let mut args = [String::new(), String::new(), String::new()];
        for port in &node.inputs {
            let v = if port.tensor == prev.0 { prev.1.clone() } else { sv.value(graph, port.tensor, &cdims)? };
            match port.name.as_str() {
                "a" => args[0] = v,
                "b" => args[1] = v,
                "c" => args[2] = v,
                _ => return None,
            }
        }
        let value = node_call(attrs.mode, [&args[0], &args[1], &args[2]], &mut sv);
        let y = node.outputs.first()?.tensor;
        if k + 1 == chain.len() {
            last = (value, prev.1.clone());
        } else {
            let value = round_to(dtype(graph, y), &value).unwrap_or(value);
            nodes.push(format!("X({k}, {value})"));
        }
        prev = (y, format!("v{k}"));
    }
    // A last plain relu under a 16-bit C can be the conversion's (`cvt.rn.relu`): the same
    // values (negative and -inf to +0, NaN kept).
    let relu_last =
        matches!(dtype(graph, out), DataType::F16 | DataType::Bf16) && chain.last().is_some_and(|&n| matches!(&graph.nodes[n].op, Op::Pointwise(a) if plain_relu(a.mode)));
    let Sides { mut params, mut args, sides, list, offsets, scalars, scalar_names, .. } = sv;
    let chain_code = Chain { sides: &list, offsets: &offsets, scalars: &scalar_names, acc: &acc, nodes: &nodes, last: &last.0, before_last: &last.1 };
    let code = chain_code.code(fast, relu_last);
    let names: String = (0..sides.len()).map(|i| format!(", e{i}")).chain(scalar_names.iter().map(|n| format!(", {n}"))).collect();
    if !scalars.is_empty() {
        let _ = write!(params, ", {}", scalars.list());
        args.extend(scalars.into_args());
    }
    Some(Epilogue { nodes: chain.to_vec(), code, params, names, args, sides: Some(sides), relu_last, tap: None, int_exact: false })
}

/// The empty epilogue (C = the accumulator).
pub fn identity() -> Epilogue {
    let code = Chain { sides: &[], offsets: &[], scalars: &[], acc: "acc", nodes: &[], last: "acc", before_last: "acc" }.code(false, false);
    Epilogue { code, sides: Some(Vec::new()), ..Default::default() }
}

/// The defines of `epilogue.cuh` (see there).
struct Chain<'a> {
    /// `X(i, T)` of each side input, and its offset.
    sides: &'a [String],
    offsets: &'a [String],
    /// The scalar parameters' names.
    scalars: &'a [String],
    acc: &'a str,
    /// `X(k, VALUE)` of each node but the last.
    nodes: &'a [String],
    last: &'a str,
    before_last: &'a str,
}

impl Chain<'_> {
    /// The epilogue's device code: `epilogue.cuh` instantiated, after the pointwise library.
    fn code(&self, fast: bool, relu_last: bool) -> String {
        let mut src = Source::new()
            .flag("FZ_DOUBLE", false)
            .flag("PW_FAST", fast)
            .define("EPI_SIDES(X)", self.sides.join(" "))
            .define("EPI_SCALARS(X)", self.scalars.iter().map(|n| format!("X({n})")).collect::<Vec<_>>().join(" "))
            .define("EPI_ACC", self.acc)
            .define("EPI_NODES(X)", self.nodes.join(" "))
            .define("EPI_LAST", self.last)
            .define("EPI_BEFORE_LAST", self.before_last)
            .flag("EPI_RELU_LAST", relu_last);
        for (i, off) in self.offsets.iter().enumerate() {
            src = src.define(&format!("EPI_OFF{i}(b, r, c)"), off);
        }
        src.template(ops::CONVERT).template(ops::OPS).template(include_str!("epilogue.cuh")).build()
    }
}
