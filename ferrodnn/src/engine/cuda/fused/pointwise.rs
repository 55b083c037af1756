//! Fusion of pointwise chains into one kernel.
//!
//! [`groups`] finds connected sets of pointwise nodes (chains, trees, diamonds) whose inner
//! tensors never need memory: every tensor produced inside a group is virtual and read only by
//! nodes of the group, except the output of the group's last node (its exit), which the unit
//! writes. All nodes of a group produce the exit's dims; only external inputs broadcast.
//!
//! [`unit`] generates one kernel computing the whole expression per output element: each
//! external input is read once (an input used by several nodes is loaded once), by-value
//! constants and the nodes' attributes are kernel parameters, so that one kernel serves every
//! value (a constant rounded to its tensor's type, as the CPU engine reads it), inner values
//! are rounded to their tensor's type (f32 by default, so a no-op in f32) and node inputs to
//! the compute type, as the CPU engine does. Arithmetic is in f32, or in double
//! when any tensor of the group is f64, any node computes in f64, or 16-bit inner values feed
//! an f32 output. With a 16-bit output, exp and sigmoid use fast intrinsics.
//!
//! Memory access: dims of size 1 are dropped, the rest ordered as the output lies in memory
//! and merged where every tensor allows. When the output is packed, full-size inputs laid out
//! like it are read at the output's flat offset ("flat"), size-1-everywhere inputs are read
//! once per thread ("zero"), and broadcast inputs (e.g. a [1, C] bias) per element at an
//! offset computed from the flat index. Then the kernel takes 16-byte vector loads and stores
//! (VEC = 16 / smallest element size: 8 for 2-byte types, 4 for f32) in a grid-stride loop
//! over vectors when every streamed pointer is 16-byte aligned (checked at run time), and a
//! scalar loop for the tail (or for everything when a pointer is misaligned). Otherwise (a
//! transposed full-size input, a strided output) a scalar grid-stride loop computes every
//! tensor's offset from the output's multi-index.

use crate::dtype::DataType;
use crate::engine::cuda::kernel::ctype::{c_type, dtype};
use crate::engine::cuda::kernel::{entry_name, Grid, Launch, NodeKernels, Pdl, Signature, Source, Unit};
use crate::engine::cuda::pointwise::{self as ops, lit, Form};
use crate::error::Result;
use crate::graph::ops::pointwise::PointwiseMode;
use crate::graph::ops::Op;
use crate::graph::{Graph, TensorDesc, TensorId};
use std::collections::HashMap;

const BLOCK: u32 = 256;

/// Types the fused kernels load, store and round to.
fn is_float(dt: DataType) -> bool {
    matches!(dt, DataType::F32 | DataType::F16 | DataType::Bf16 | DataType::F64)
}

fn mode_of(graph: &Graph, ni: usize) -> Option<PointwiseMode> {
    match &graph.nodes.get(ni)?.op {
        Op::Pointwise(a) => Some(a.mode),
        _ => None,
    }
}

/// A by-value scalar whose value travels with the graph.
fn constant(d: &TensorDesc) -> Option<f64> {
    if d.is_pass_by_value {
        d.value
    } else {
        None
    }
}

/// Whether a pointwise node can be part of a fused group at all.
fn candidate(graph: &Graph, ni: usize) -> bool {
    let node = &graph.nodes[ni];
    let Some(mode) = mode_of(graph, ni) else { return false };
    if matches!(mode, PointwiseMode::GenIndex { .. }) {
        return false;
    }
    if node.outputs.len() != 1 || node.outputs[0].name != "y" {
        return false;
    }
    let ports = ["a", "b", "c"];
    let arity = mode.arity();
    if arity > 3 || node.inputs.len() != arity || node.inputs.iter().any(|p| !ports[..arity].contains(&p.name.as_str())) {
        return false;
    }
    if !matches!(graph.compute_type(node), DataType::F32 | DataType::F64) {
        return false;
    }
    let y = node.outputs[0].tensor;
    let Some(yd) = graph.get(y) else { return false };
    if yd.is_pass_by_value || yd.dims.is_empty() || yd.dims.len() > 8 || yd.strides.len() != yd.dims.len() || yd.element_count() <= 0 || !is_float(dtype(graph, y)) {
        return false;
    }
    node.inputs.iter().all(|p| {
        let Some(d) = graph.get(p.tensor) else { return false };
        if d.dims.len() > yd.dims.len() || d.strides.len() != d.dims.len() {
            return false;
        }
        if d.is_pass_by_value {
            return d.value.is_some();
        }
        is_float(dtype(graph, p.tensor))
    })
}

/// Disjoint groups of pointwise nodes to fuse (each at least two nodes), each in topological
/// order.
pub fn groups(graph: &Graph, order: &[usize], exclude: &std::collections::HashSet<usize>) -> Vec<Vec<usize>> {
    let nn = graph.nodes.len();
    let mut position = vec![usize::MAX; nn];
    for (i, &n) in order.iter().enumerate() {
        if n < nn {
            position[n] = i;
        }
    }
    let cons = graph.consumers();
    let cand: Vec<bool> = (0..nn).map(|ni| position[ni] != usize::MAX && !exclude.contains(&ni) && candidate(graph, ni)).collect();
    let out_of = |ni: usize| graph.nodes[ni].outputs[0].tensor;
    // A node is inner when its output may stay in registers: virtual, read only by candidates
    // that produce the same dims.
    let mut inner: Vec<bool> = (0..nn)
        .map(|ni| {
            if !cand[ni] {
                return false;
            }
            let y = out_of(ni);
            let yd = graph.desc(y);
            match cons.get(&y.0) {
                Some(cs) if yd.is_virtual && !cs.is_empty() => cs.iter().all(|&c| cand[c] && graph.desc(out_of(c)).dims == yd.dims),
                _ => false,
            }
        })
        .collect();
    loop {
        // Connected components of candidates joined through inner nodes' outputs.
        let mut parent: Vec<usize> = (0..nn).collect();
        fn find(parent: &mut [usize], mut x: usize) -> usize {
            while parent[x] != x {
                parent[x] = parent[parent[x]];
                x = parent[x];
            }
            x
        }
        for ni in 0..nn {
            if inner[ni] {
                for &c in &cons[&out_of(ni).0] {
                    let (ra, rb) = (find(&mut parent, ni), find(&mut parent, c));
                    if ra != rb {
                        parent[ra] = rb;
                    }
                }
            }
        }
        let mut comps: HashMap<usize, Vec<usize>> = HashMap::new();
        for ni in (0..nn).filter(|&ni| cand[ni]) {
            let r = find(&mut parent, ni);
            comps.entry(r).or_default().push(ni);
        }
        // A component with several exits (an inner value feeding branches that end apart) is
        // cut at its latest inner node with more than one consumer; that node becomes an exit.
        let mut changed = false;
        for comp in comps.values() {
            if comp.iter().filter(|&&n| !inner[n]).count() > 1 {
                let cut = comp.iter().copied().filter(|&n| inner[n] && cons[&out_of(n).0].len() > 1).max_by_key(|&n| position[n]);
                if let Some(n) = cut {
                    inner[n] = false;
                    changed = true;
                }
            }
        }
        if changed {
            continue;
        }
        let mut out: Vec<Vec<usize>> = comps
            .into_values()
            .filter(|c| c.len() >= 2 && c.iter().filter(|&&n| !inner[n]).count() == 1)
            .map(|mut c| {
                c.sort_by_key(|&n| position[n]);
                c
            })
            .filter(|c| plan(graph, c, &position).is_some())
            .collect();
        out.sort_by_key(|c| position[c[0]]);
        return out;
    }
}

/// How a kernel reads a tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Access {
    /// At the output's flat offset (output packed, same layout).
    Flat,
    /// Always element 0 (size 1 in every dim): loaded once per thread.
    Zero,
    /// At an offset computed from the flat index; `bcast` when some dim is broadcast.
    Strided { bcast: bool },
}

/// An external input of the group.
struct Ext {
    id: TensorId,
    dt: DataType,
    /// Strides over the plan's merged dims (0 on broadcast dims).
    strides: Vec<i64>,
    access: Access,
}

/// Where a node input comes from.
#[derive(Clone, Debug)]
enum Src {
    /// The value of group node `k` (index into `Plan::order`).
    Inner(usize),
    /// External input slot.
    Ext(usize),
    /// A by-value scalar with its value in the graph: a kernel parameter (the value rounded to
    /// the tensor's type when the plan executes, as the CPU engine reads it).
    Const(TensorId),
}

struct Plan {
    /// The group's nodes in topological order; the last is the exit.
    order: Vec<usize>,
    y: TensorId,
    ydt: DataType,
    n: i64,
    /// Dims of size > 1, ordered as the output lies in memory (outermost first), merged.
    dims: Vec<i64>,
    ystrides: Vec<i64>,
    /// The output is packed (its offset is the flat index over `dims`).
    packed: bool,
    exts: Vec<Ext>,
    srcs: HashMap<usize, Src>,
    dbl: bool,
    /// Fast intrinsics (__expf, __fdividef) for exp and sigmoid: f32 arithmetic with a 16-bit
    /// output, whose rounding dwarfs their few ulps of error.
    fast: bool,
}

impl Plan {
    /// Elements per 16-byte vector of the smallest streamed type, when the vector path applies.
    fn vec(&self) -> Option<i64> {
        if !self.packed || self.exts.iter().any(|e| e.access == Access::Strided { bcast: false }) {
            return None;
        }
        let min = self.exts.iter().filter(|e| e.access == Access::Flat).map(|e| e.dt.size()).chain([self.ydt.size()]).min().unwrap_or(4);
        Some(16 / min as i64)
    }
}

/// Strides of `d` over the output dims `out` (numpy broadcast: right-aligned, size-1 dims
/// repeat with stride 0). None when the dims do not broadcast or a stride is negative.
fn effective_strides(d: &TensorDesc, out: &[i64]) -> Option<Vec<i64>> {
    let r = out.len();
    let rt = d.dims.len();
    if rt > r || d.strides.len() != rt {
        return None;
    }
    let shift = r - rt;
    let mut e = vec![0i64; r];
    for a in shift..r {
        let (dim, s) = (d.dims[a - shift], d.strides[a - shift]);
        if dim == 1 {
            continue;
        }
        if dim != out[a] || s < 0 {
            return None;
        }
        e[a] = s;
    }
    Some(e)
}

/// The plan of a group, or None when it cannot be fused.
fn plan(graph: &Graph, nodes: &[usize], position: &[usize]) -> Option<Plan> {
    if nodes.is_empty() || nodes.iter().any(|&n| n >= graph.nodes.len() || !candidate(graph, n)) {
        return None;
    }
    let mut order = nodes.to_vec();
    order.sort_by_key(|&n| position.get(n).copied().unwrap_or(usize::MAX));
    order.dedup();
    let cons = graph.consumers();
    let produced: HashMap<usize, usize> = order.iter().enumerate().map(|(k, &n)| (graph.nodes[n].outputs[0].tensor.0, k)).collect();
    // Exactly one exit, the last node; every other output virtual and read only inside.
    let last = order.len() - 1;
    for (k, &n) in order.iter().enumerate() {
        let t = graph.nodes[n].outputs[0].tensor;
        let readers = cons.get(&t.0).map(Vec::as_slice).unwrap_or(&[]);
        let stays = graph.desc(t).is_virtual && !readers.is_empty() && readers.iter().all(|r| order.contains(r));
        if stays == (k == last) {
            return None;
        }
    }
    let y = graph.nodes[order[last]].outputs[0].tensor;
    let yd = graph.desc(y);
    let ydt = dtype(graph, y);
    let full = yd.dims.clone();
    if order.iter().any(|&n| graph.desc(graph.nodes[n].outputs[0].tensor).dims != full) {
        return None;
    }
    // Sources of every node input.
    let mut srcs: HashMap<usize, Src> = HashMap::new();
    let mut ext_ids: Vec<TensorId> = Vec::new();
    for &n in &order {
        for p in &graph.nodes[n].inputs {
            if srcs.contains_key(&p.tensor.0) {
                continue;
            }
            let d = graph.desc(p.tensor);
            let src = if let Some(&k) = produced.get(&p.tensor.0) {
                Src::Inner(k)
            } else if constant(d).is_some() {
                Src::Const(p.tensor)
            } else {
                ext_ids.push(p.tensor);
                Src::Ext(ext_ids.len() - 1)
            };
            srcs.insert(p.tensor.0, src);
        }
    }
    // Double arithmetic for f64 tensors and f64 compute; and for 16-bit inner values under an
    // f32 output, which must be rounded once from the exact value (as the CPU does), not from
    // an f32 result (a rare double rounding costs a 16-bit ulp, above f32's tolerance).
    let narrow_inner = order[..last].iter().any(|&n| matches!(dtype(graph, graph.nodes[n].outputs[0].tensor), DataType::F16 | DataType::Bf16));
    let dbl = (narrow_inner && ydt == DataType::F32)
        || order.iter().any(|&n| {
            let node = &graph.nodes[n];
            graph.compute_type(node) == DataType::F64
                || node.outputs.iter().chain(&node.inputs).any(|p| constant(graph.desc(p.tensor)).is_none() && dtype(graph, p.tensor) == DataType::F64)
        });

    // Layout: strides of every tensor over the output dims, then drop size-1 dims, order by
    // the output's strides (outermost first) and merge neighbours every tensor allows.
    let ye = effective_strides(yd, &full)?;
    let mut exts_e: Vec<Vec<i64>> = Vec::new();
    for &id in &ext_ids {
        exts_e.push(effective_strides(graph.desc(id), &full)?);
    }
    let mut axes: Vec<usize> = (0..full.len()).filter(|&a| full[a] > 1).collect();
    if axes.iter().any(|&a| ye[a] <= 0) {
        return None;
    }
    axes.sort_by(|&a, &b| ye[b].cmp(&ye[a]));
    if axes.windows(2).any(|w| ye[w[0]] == ye[w[1]]) {
        return None;
    }
    let zero: Vec<bool> = exts_e.iter().map(|e| axes.iter().all(|&a| e[a] == 0)).collect();
    let mut dims: Vec<i64> = Vec::new();
    let mut ys: Vec<i64> = Vec::new();
    let mut es: Vec<Vec<i64>> = vec![Vec::new(); ext_ids.len()];
    for &a in &axes {
        // Axis `a` joins the previous (outer) one when, for every tensor, the outer stride is
        // the inner stride times the inner size.
        let mergeable =
            ys.last().is_some_and(|&yl| ye[a] * full[a] == yl) && es.iter().enumerate().all(|(i, s)| zero[i] || s.last().is_some_and(|&sl| exts_e[i][a] * full[a] == sl));
        if mergeable {
            let last = dims.len() - 1;
            dims[last] *= full[a];
            ys[last] = ye[a];
            for (i, s) in es.iter_mut().enumerate() {
                s[last] = exts_e[i][a];
            }
        } else {
            dims.push(full[a]);
            ys.push(ye[a]);
            for (i, s) in es.iter_mut().enumerate() {
                s.push(exts_e[i][a]);
            }
        }
    }
    let packed = {
        let mut want = 1i64;
        let mut ok = true;
        for k in (0..dims.len()).rev() {
            ok &= ys[k] == want;
            want = want.saturating_mul(dims[k]);
        }
        ok
    };
    let exts: Vec<Ext> = ext_ids
        .iter()
        .zip(es)
        .enumerate()
        .map(|(i, (&id, strides))| {
            let access = if zero[i] {
                Access::Zero
            } else if packed && strides == ys {
                Access::Flat
            } else {
                Access::Strided { bcast: strides.contains(&0) }
            };
            Ext { id, dt: dtype(graph, id), strides, access }
        })
        .collect();
    let n = yd.element_count();
    if n <= 0 || !is_float(ydt) {
        return None;
    }
    let fast = !dbl && matches!(ydt, DataType::F16 | DataType::Bf16);
    Some(Plan { order, y, ydt, n, dims, ystrides: ys, packed, exts, srcs, dbl, fast })
}

/// A value a kernel takes as a parameter (an input of kind `ARG`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Scalar {
    /// A by-value scalar tensor.
    Tensor(TensorId),
    /// An attribute's value.
    Attr(f64),
}

/// The value of node `k` of the plan (`v<k>`): its mode's call (`pointwise/ops.cuh`) on its
/// inputs, rounded to its tensor's type when it is an inner value of another type than the
/// arithmetic type. `scalar` names the parameter of a by-value scalar or an attribute.
fn node_value(graph: &Graph, p: &Plan, k: usize, scalar: &mut dyn FnMut(Scalar) -> String) -> String {
    let n = p.order[k];
    let node = &graph.nodes[n];
    // Never None (see `candidate`).
    let mode = mode_of(graph, n).unwrap_or(PointwiseMode::Identity);
    // Node inputs are rounded to the compute type (f32 rounding is a no-op in f32 code).
    let round_in = p.dbl && graph.compute_type(node) == DataType::F32;
    let mut port = |name: &str| {
        let v = match node.input(name).and_then(|t| p.srcs.get(&t.0)) {
            Some(Src::Inner(j)) => format!("v{j}"),
            Some(Src::Ext(i)) => format!("x{i}"),
            Some(&Src::Const(t)) => scalar(Scalar::Tensor(t)),
            None => lit(0.0, p.dbl),
        };
        if round_in {
            format!("(double)(float)({v})")
        } else {
            v
        }
    };
    let (a, b, c) = (port("a"), port("b"), port("c"));
    let value = ops::call(mode, [&a, &b, &c], Form::Fused, p.dbl, &mut |v| scalar(Scalar::Attr(v)));
    // Inner values are rounded to their tensor's type, as the CPU engine stores them.
    let dt = dtype(graph, node.outputs[0].tensor);
    let native = if p.dbl { DataType::F64 } else { DataType::F32 };
    if k + 1 == p.order.len() || dt == native {
        value
    } else {
        format!("fz_cv(fz_to_{}({value}))", dt.name())
    }
}

/// The offset at flat index `f` (a macro parameter) of a tensor with `strides` over the plan's
/// merged dims, as a C expression.
fn offset_expr(p: &Plan, strides: &[i64]) -> String {
    let small = p.n <= u32::MAX as i64;
    let (ut, us) = if small { ("unsigned", "u") } else { ("unsigned long long", "ull") };
    // The flat index divided by the dims inside the current one.
    let mut q = format!("({ut})(f)");
    let mut terms = Vec::new();
    // Only up to the outermost dim this tensor moves along.
    if let Some(outer) = strides.iter().position(|&x| x != 0) {
        for a in (outer..p.dims.len()).rev() {
            let (d, e) = (p.dims[a], strides[a]);
            if a == outer && a == 0 {
                terms.push(format!("(i64)({q}) * {e}LL"));
            } else if a == outer || e != 0 {
                terms.push(format!("(i64)({q} % {d}{us}) * {e}LL"));
            }
            q = format!("{q} / {d}{us}");
        }
    }
    if terms.is_empty() {
        "0LL".into()
    } else {
        format!("({})", terms.join(" + "))
    }
}

/// The kernel of a plan (`pointwise.cuh`) and its signature.
fn source(graph: &Graph, p: &Plan, entry: &str) -> (String, Signature) {
    let mut sig = Signature::new();
    sig.ptr("y_p", p.y, true);
    for (i, e) in p.exts.iter().enumerate() {
        sig.ptr(&format!("p{i}"), e.id, false);
    }
    let vec = p.vec();
    // The vector loop's inputs lie within one innermost row when the row length is a multiple
    // of the vector: broadcast inputs then take one offset per vector plus j times the inner
    // stride.
    let inner_rows = vec.is_some_and(|v| p.dims.last().is_some_and(|&d| d % v == 0));
    let inputs: Vec<String> = p
        .exts
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let kind = match e.access {
                Access::Flat => "FLAT",
                Access::Zero => "ZERO",
                Access::Strided { .. } if inner_rows => "ROWS",
                Access::Strided { .. } => "ELEM",
            };
            format!("X({i}, {kind}, {}, {}LL)", c_type(e.dt), e.strides.last().unwrap_or(&0))
        })
        .collect();
    // By-value scalars (one parameter per tensor) and attributes are inputs of kind ARG after
    // the pointers, parameters of the arithmetic type.
    let mut scalars: Vec<Scalar> = Vec::new();
    let first = p.exts.len();
    let nodes: Vec<String> = (0..p.order.len())
        .map(|k| {
            let value = node_value(graph, p, k, &mut |s| {
                let i = match s {
                    Scalar::Tensor(_) => scalars.iter().position(|&x| x == s),
                    Scalar::Attr(_) => None,
                };
                let i = i.unwrap_or_else(|| {
                    scalars.push(s);
                    scalars.len() - 1
                });
                format!("x{}", first + i)
            });
            format!("X({k}, {value})")
        })
        .collect();
    let mut inputs = inputs;
    for (i, &s) in scalars.iter().enumerate() {
        let name = format!("p{}", first + i);
        match s {
            Scalar::Tensor(t) => sig.scalar(&name, t, p.dbl),
            Scalar::Attr(v) if p.dbl => sig.f64(&name, v),
            Scalar::Attr(v) => sig.f32(&name, v),
        };
        inputs.push(format!("X({}, ARG, fz_t, 0LL)", first + i));
    }
    let mut src = Source::new()
        .entry(entry, &sig)
        .flag("FZ_DOUBLE", p.dbl)
        .flag("PW_FAST", p.fast)
        .define("FZ_BLOCK", BLOCK)
        .define("FZ_N", format!("{}LL", p.n))
        .define("FZ_INPUTS(X, S)", inputs.join(" S "))
        .define("FZ_NODES(X)", nodes.join(" "))
        .define("FZ_RESULT", format!("v{}", p.order.len() - 1))
        .define("FZ_Y", c_type(p.ydt))
        .define("FZ_TO_Y", format!("fz_to_{}", p.ydt.name()))
        .flag("FZ_PACKED", p.packed)
        .define("FZ_VEC", vec.unwrap_or(0))
        .flag("FZ_STRIDED", p.exts.iter().any(|e| matches!(e.access, Access::Strided { .. })));
    for (i, e) in p.exts.iter().enumerate() {
        if let Access::Strided { .. } = e.access {
            src = src.define(&format!("FZ_OFF{i}(f)"), offset_expr(p, &e.strides));
        }
    }
    if !p.packed {
        src = src.define("FZ_OFFY(f)", offset_expr(p, &p.ystrides));
    }
    let text = src.template(ops::CONVERT).template(ops::OPS).template(include_str!("pointwise.cuh")).build();
    (text, sig)
}

/// The unit of pointwise node `ni` alone on the fused kernels, when they take it.
pub fn single_unit(graph: &Graph, ni: usize) -> Result<Option<Unit>> {
    if !candidate(graph, ni) {
        return Ok(None);
    }
    unit(graph, &[ni])
}

/// The fused unit of a group, or None when it cannot be fused after all.
pub fn unit(graph: &Graph, nodes: &[usize]) -> Result<Option<Unit>> {
    let order = graph.topological_order()?;
    let mut position = vec![usize::MAX; graph.nodes.len()];
    for (i, &n) in order.iter().enumerate() {
        if n < position.len() {
            position[n] = i;
        }
    }
    let Some(p) = plan(graph, nodes, &position) else { return Ok(None) };
    let exit = p.order[p.order.len() - 1];
    let entry = entry_name(exit, "fused_pointwise");
    let (src, sig) = source(graph, &p, &entry);
    let threads = match p.vec() {
        Some(v) => (p.n as u64).div_ceil(v as u64),
        None => p.n as u64,
    };
    let launch = Launch { source: src, entry, grid: Grid::Cover(threads.max(1)), block: BLOCK, shared_bytes: 0, args: sig.into_args(), cluster: None, pdl: Pdl::Dependent };
    Ok(Some(Unit { nodes: p.order.clone(), kernels: NodeKernels::one(launch), writes: vec![p.y], unaligned: None }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::cases;

    fn case(name: &str) -> Graph {
        let mut g = cases::all().into_iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no case {name}")).graph;
        g.validate().unwrap();
        g
    }

    fn names(g: &Graph) -> Vec<Vec<String>> {
        let order = g.topological_order().unwrap();
        groups(g, &order, &Default::default()).iter().map(|grp| grp.iter().map(|&n| mode_of(g, n).map_or("?", |m| m.name()).to_string()).collect()).collect()
    }

    fn the_plan(g: &Graph, grp: &[usize]) -> Plan {
        let order = g.topological_order().unwrap();
        let mut position = vec![usize::MAX; g.nodes.len()];
        for (i, &n) in order.iter().enumerate() {
            position[n] = i;
        }
        plan(g, grp, &position).unwrap()
    }

    /// A lone pointwise node (a ReLU backward over a channels-last bf16 activation) runs on the
    /// fused kernel in 16-byte vectors, not on the fallback's elementwise kernel; one it cannot
    /// take (integers) still runs there.
    #[test]
    fn a_lone_node_runs_on_the_fused_kernel() {
        use crate::graph::ops::pointwise::PointwiseMode;
        use crate::graph::TensorDesc;
        let bf = DataType::Bf16;
        let mut g = Graph::new("relu_bwd").io_data_type(bf).compute_data_type(DataType::F32);
        let dy = g.tensor(TensorDesc::new("dy", &[2, 64, 9, 11], bf).with_layout(&[0, 2, 3, 1]));
        let y = g.tensor(TensorDesc::new("y", &[2, 64, 9, 11], bf).with_layout(&[0, 2, 3, 1]));
        let dx = g.pointwise(PointwiseMode::ReluBackward { lower_clip: None, upper_clip: None, negative_slope: None }, &[dy, y]);
        g.set_output(dx);
        g.validate().unwrap();
        let u = single_unit(&g, 0).unwrap().expect("fused");
        assert_eq!(u.kernels.launches.len(), 1);
        assert!(u.kernels.launches[0].entry.ends_with("fused_pointwise"));
        assert_eq!(the_plan(&g, &[0]).vec(), Some(8));
        let mut gi = Graph::new("int_add").io_data_type(DataType::I32).compute_data_type(DataType::I32);
        let a = gi.tensor(TensorDesc::new("a", &[3, 5], DataType::I32));
        let b = gi.tensor(TensorDesc::new("b", &[3, 5], DataType::I32));
        let c = gi.add(a, b);
        gi.set_output(c);
        gi.validate().unwrap();
        assert!(single_unit(&gi, 0).unwrap().is_none());
    }

    #[test]
    fn chain5_is_one_vector_group() {
        let g = case("fast_pw_chain5_48x1024_bf16");
        let order = g.topological_order().unwrap();
        let gs = groups(&g, &order, &Default::default());
        assert_eq!(gs.len(), 1);
        assert_eq!(gs[0].len(), 5);
        let p = the_plan(&g, &gs[0]);
        assert_eq!(p.vec(), Some(8));
        assert_eq!(p.exts.len(), 2);
        assert!(p.exts.iter().all(|e| e.access == Access::Flat));
        assert_eq!(p.dims, vec![48 * 1024]);
        let u = unit(&g, &gs[0]).unwrap().unwrap();
        assert_eq!(u.kernels.launches[0].grid, Grid::Cover(48 * 1024 / 8));
    }

    /// By-value constants and attributes are kernel arguments: groups that differ only in their
    /// values share one kernel.
    #[test]
    fn values_are_kernel_arguments() {
        let launch = |g: &Graph| {
            let order = g.topological_order().unwrap();
            let gs = groups(g, &order, &Default::default());
            unit(g, &gs[0]).unwrap().unwrap().kernels.launches.remove(0)
        };
        let g = case("fast_pw_around_matmul_bf16");
        let mut h = g.clone();
        for node in &mut h.nodes {
            if let Op::Pointwise(a) = &mut node.op {
                if let PointwiseMode::Swish { beta } = &mut a.mode {
                    *beta = 1.5;
                }
            }
        }
        let (a, b) = (launch(&g), launch(&h));
        assert_eq!(a.source, b.source);
        assert_ne!(a.args, b.args);
        let g = case("fast_pw_chain5_48x1024_bf16");
        let mut h = g.clone();
        let half = h.tensors.iter().position(|t| t.name == "half").unwrap();
        h.tensors[half].value = Some(0.25);
        let (a, b) = (launch(&g), launch(&h));
        assert_eq!(a.source, b.source);
        assert_eq!(a.args, b.args);
    }

    #[test]
    fn cut_at_graph_outputs_and_branches() {
        let g = case("fast_pw_middle_output_bf16");
        assert_eq!(names(&g), vec![vec!["mul", "tanh"], vec!["add", "scale"]]);
        let g = case("fast_pw_split_f32");
        assert_eq!(names(&g), vec![vec!["scale", "exp"], vec!["relu", "add"]]);
        let g = case("fast_pw_tree_f32");
        assert_eq!(names(&g).len(), 1);
        assert_eq!(names(&g)[0].len(), 5);
        let g = case("fast_pw_around_matmul_bf16");
        assert_eq!(names(&g), vec![vec!["bias", "swish"], vec!["add", "relu"]]);
    }

    #[test]
    fn layouts_pick_the_path() {
        let path = |name: &str| {
            let g = case(name);
            let order = g.topological_order().unwrap();
            let gs = groups(&g, &order, &Default::default());
            let p = the_plan(&g, &gs[0]);
            (p.vec(), p.packed, p.dims.clone())
        };
        assert_eq!(path("fast_pw_chain5_transposed_b_bf16"), (None, true, vec![64, 96]));
        assert_eq!(path("fast_pw_chain5_transposed_a_f32"), (None, true, vec![24, 40]));
        assert_eq!(path("fast_pw_chain5_transposed_both_f16"), (Some(8), true, vec![40 * 24]));
        assert_eq!(path("fast_pw_nhwc_bf16"), (Some(8), true, vec![70, 16]));
        assert_eq!(path("fast_pw_scale_bias_gelu_37x512_f16"), (Some(8), true, vec![37, 512]));
        assert_eq!(path("fast_pw_scale_bias_gelu_16x12_rank1_bf16"), (Some(8), true, vec![16, 12]));
        assert_eq!(path("fast_pw_bf16_in_f32_out"), (Some(8), true, vec![40 * 64]));
        assert_eq!(path("fast_pw_chain5_3d_f64"), (Some(2), true, vec![5 * 9 * 31]));
        assert_eq!(path("fast_pw_padded_out_bf16"), (None, false, vec![9, 30]));
        assert_eq!(path("fast_pw_select_f32").0, Some(4));
        assert_eq!(path("fast_pw_select_f64").0, Some(2));
        assert_eq!(path("fast_pw_bf16_intermediates_f32").0, Some(4));
        let g = case("fast_pw_bf16_intermediates_f32");
        let order = g.topological_order().unwrap();
        assert!(the_plan(&g, &groups(&g, &order, &Default::default())[0]).dbl);
    }

    /// For every fused case, the plan's offsets (merged dims, flat, zero and strided access)
    /// address the same logical element in the output and in every external input.
    #[test]
    fn plan_offsets_match_logical_indexing() {
        let flat_off = |dims: &[i64], strides: &[i64], mut i: i64| {
            let mut off = 0;
            for a in (0..dims.len()).rev() {
                off += (i % dims[a]) * strides[a];
                i /= dims[a];
            }
            off
        };
        let mut checked = 0;
        for c in cases::all().into_iter().filter(|c| c.name.starts_with("fast_pw_") || c.name.starts_with("multi_")) {
            let mut g = c.graph;
            g.validate().unwrap();
            let order = g.topological_order().unwrap();
            for grp in groups(&g, &order, &Default::default()) {
                let p = the_plan(&g, &grp);
                let yd = g.desc(p.y).clone();
                // Output offset -> logical multi-index.
                let mut at: HashMap<i64, Vec<i64>> = HashMap::new();
                for f in 0..p.n {
                    let mut idx = vec![0i64; yd.dims.len()];
                    let mut q = f;
                    for a in (0..yd.dims.len()).rev() {
                        idx[a] = q % yd.dims[a];
                        q /= yd.dims[a];
                    }
                    let off: i64 = idx.iter().zip(&yd.strides).map(|(i, s)| i * s).sum();
                    assert!(at.insert(off, idx).is_none());
                }
                let mut seen = std::collections::HashSet::new();
                for i in 0..p.n {
                    let yo = if p.packed { i } else { flat_off(&p.dims, &p.ystrides, i) };
                    assert!(seen.insert(yo), "{}: output offset {yo} twice", c.name);
                    let idx = &at[&yo];
                    for e in &p.exts {
                        let d = g.desc(e.id);
                        let shift = idx.len() - d.dims.len();
                        let want: i64 = (0..d.dims.len()).map(|a| if d.dims[a] == 1 { 0 } else { idx[a + shift] * d.strides[a] }).sum();
                        let got = match e.access {
                            Access::Flat => i,
                            Access::Zero => 0,
                            Access::Strided { .. } => flat_off(&p.dims, &e.strides, i),
                        };
                        assert_eq!(got, want, "{}: input {} at flat {i}", c.name, d.name);
                    }
                }
                checked += 1;
            }
        }
        assert!(checked >= 25, "only {checked} groups checked");
    }
}
