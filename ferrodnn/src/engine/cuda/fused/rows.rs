//! Fast row kernels: what the normalizations ([`super::norm`]) and softmax ([`super::softmax`])
//! share: the choice of a node's kernel ([`unit`]), the row geometry (vector width, team size)
//! and how a kernel reaches a tensor's rows, and the shared device header `rows.cuh`.
//!
//! The kernels: layernorm and rmsnorm forward (training and inference), softmax and
//! log-softmax forward (with or without the log-sum-exp `stats`), and layernorm and rmsnorm
//! backward (`dx`, `dscale`, `dbias`); softmax and log-softmax backward (`y`, `dy` -> `dx`, rows
//! of at most 16384 elements) and adalayernorm forward (over the last axis; scale and bias
//! `[B or 1, S or 1..., D]`, the row's offset into them from its outer index), both in the
//! forward kernels' lane-team / block-per-row scheme. Also: instancenorm forward and backward
//! with packed spatial axes (a row per (n, c)), adalayernorm backward (the norm backward with
//! rows grouped by scale row), and the prologue fusion of a pointwise chain (add, sub, mul of
//! full-size tensors) into layernorm / rmsnorm ([`super::norm::prologue_groups`],
//! [`super::norm::prologue_unit`]).
//!
//! What they accept (anything else returns `None` and runs on the fallback):
//! - f32, f16 and bf16 tensors (any mix); nothing f64, and no node computing in f64;
//! - x (and y, dy, dx) packed row-major over the normalized axes (every axis but 0 for the
//!   norms; for softmax the axis, with every later axis of size 1), rows anywhere (the row
//!   offsets come from the outer dims and strides, as index expressions in the source);
//! - scale, bias, dscale, dbias of dims `[1, x's dims after 0...]` (no broadcasting inside a
//!   row), packed row-major; statistics (mean, inv_variance, softmax stats) in any layout;
//! - rows of at most 32768 elements (16384 for the backward), epsilon a normal f32.
//!
//! Design: a row of `H` elements is split into chunks of `V` consecutive elements (`V = 8` for
//! 2-byte x, 4 for f32 x, when it divides `H`; else 1): one 16-byte access per chunk (8 bytes
//! for a 2-byte tensor beside f32 x, two for f32 beside 2-byte x). A team of threads holds
//! a row in registers (`CPT` chunks each, chunk `c` at thread `c % TS`): the row is read once,
//! its statistics are taken from the registers (two passes over them: mean, then the squared
//! deviations), and each output element is written once. Forward rows of up to 1024 elements
//! get a team of up to 32 lanes of one warp (shuffle reductions, several rows per warp when
//! the row is short); longer rows and every backward row get a whole block (warp shuffles,
//! then one float per warp in shared memory added in warp order). Every reduction has a fixed
//! order, so results do not depend on timing. Vector accesses need 16-byte aligned chunk
//! starts: the row strides are checked when the plan is built, the base pointers inside the
//! kernel (one uniform flag; misaligned buffers take the element-wise loads and stores).
//!
//! Backward: one launch computes `dx` a block per row (grid-stride, `RPI` rows per step to keep
//! more loads in flight) and, per thread, partial column sums of `dy * xhat` and `dy` over the
//! block's rows, written to scratch (`[blocks, H]` f32); a second launch adds the partials of
//! each column in block order into `dscale` and `dbias`. The grid of the first launch is fixed
//! at plan time (so is the scratch and the order of the sums).
//!
//! Every kernel is a `.cuh` template after `rows.cuh`, instantiated with [`Source`]: the row
//! geometry as `ROW_*` defines (`Team::source`), each tensor's element type and row offset as
//! `T_<name>` and `OFF_<name>(r)` (`tensor`), and the alignment flag as `ROW_ALIGNED`
//! (`aligned`).

use crate::dtype::DataType;
use crate::engine::cuda::kernel::ctype::float_c_type;
use crate::engine::cuda::kernel::{entry_name, Grid, Launch, Signature, Source, Target, Unit};
use crate::error::Result;
use crate::graph::ops::Op;
use crate::graph::{Graph, Node, TensorId};

/// The device header every row kernel starts with.
pub(super) const ROWS_CUH: &str = include_str!("rows.cuh");

/// A specialized unit for node `ni`, or None when no fast kernel applies.
pub fn unit(graph: &Graph, ni: usize, target: &Target) -> Result<Option<Unit>> {
    let node = &graph.nodes[ni];
    if graph.compute_type(node) == DataType::F64 {
        return Ok(None);
    }
    let g = Gen { graph, node, ni, sms: target.sm_count.max(1) as i64 };
    let kernels = match &node.op {
        Op::Layernorm(a) => g.norm_forward(a.epsilon, false),
        Op::Rmsnorm(a) => g.norm_forward(a.epsilon, true),
        Op::Softmax(a) => g.softmax(a.axis, a.log),
        Op::LayernormBackward(_) => g.norm_backward(false, false),
        Op::RmsnormBackward(_) => g.norm_backward(true, false),
        Op::AdalayernormBackward(_) => g.norm_backward(false, true),
        Op::Instancenorm(a) => g.instancenorm(a.epsilon),
        Op::InstancenormBackward(_) => g.instancenorm_backward(),
        Op::SoftmaxBackward(a) => g.softmax_backward(a.axis, a.log),
        Op::Adalayernorm(a) => g.adalayernorm(a.epsilon),
        _ => None,
    };
    Ok(kernels.map(|kernels| Unit { nodes: vec![ni], kernels, writes: node.outputs.iter().map(|p| p.tensor).collect(), unaligned: None }))
}

/// Longest row the forward kernels take (elements).
pub(super) const MAX_ROW: i64 = 32768;
/// Threads per block of the lane-team (short row) forward kernels.
const TEAM_BLOCK: u32 = 256;

/// How a kernel reaches one tensor's rows.
pub(super) struct RowT {
    pub id: TensorId,
    pub dt: DataType,
    /// The C type of an element.
    pub ty: &'static str,
    /// Offset (elements) of row `r`'s first element: a C expression in `r`.
    pub off: String,
    /// Whether every row start is aligned for `V`-element vector accesses (plan-time part).
    pub vec_ok: bool,
    /// The base-pointer alignment (bytes) the vector accesses need.
    pub align: usize,
}

/// Elements per chunk: 8 for 2-byte x, 4 for f32 x, when that divides the row; else 1.
pub(super) fn vec_width(x: DataType, h: i64) -> i64 {
    let v = if x.size() == 2 { 8 } else { 4 };
    if h % v == 0 {
        v
    } else {
        1
    }
}

/// Team size, threads per block and chunks per thread of a forward kernel over rows of `c`
/// chunks of `v` elements (`h` elements in all): a lane team for rows of up to 1024 elements,
/// else a block per row (about 256 threads, more when the row would not fit 32 floats per
/// thread). None when the row is too long for registers.
pub(super) fn forward_team(h: i64, c: i64, v: i64) -> Option<(u32, u32, i64)> {
    if h > MAX_ROW {
        return None;
    }
    if h <= 1024 {
        let ts = (c as u64).next_power_of_two().min(32) as i64;
        return Some((ts as u32, TEAM_BLOCK, (c + ts - 1) / ts));
    }
    let cpt = [256, 512, 1024].into_iter().map(|t| (c + t - 1) / t).find(|&cpt| cpt * v <= 32)?;
    let bs = ((c + cpt - 1) / cpt + 31) / 32 * 32;
    Some((bs as u32, bs as u32, cpt))
}

/// `forward_team` for the norms: long rows get at most 16 elements per thread where a block of
/// up to 1024 threads allows (room in the registers for the next row and the scale and bias).
pub(super) fn norm_team(h: i64, c: i64, v: i64) -> Option<(u32, u32, i64)> {
    if h > 1024 && h <= MAX_ROW {
        if let Some(cpt) = [256, 512, 1024].into_iter().map(|t| (c + t - 1) / t).find(|&cpt| cpt * v <= 16) {
            let bs = ((c + cpt - 1) / cpt + 31) / 32 * 32;
            return Some((bs as u32, bs as u32, cpt));
        }
    }
    forward_team(h, c, v)
}

/// The row geometry of a kernel: `n` rows of `h` elements, `c` chunks of `v` elements each,
/// `cpt` chunks per thread, teams of `ts` threads (a block per row when `ts == bs`), `bs`
/// threads per block.
#[derive(Clone, Copy, Debug)]
pub(super) struct Team {
    pub n: i64,
    pub h: i64,
    pub c: i64,
    pub v: i64,
    pub cpt: i64,
    pub ts: u32,
    pub bs: u32,
}

impl Team {
    /// A kernel's source up to its own defines: the entry, the geometry (`ROW_N`, `ROW_H`,
    /// `ROW_C`, `ROW_V`, `ROW_CPT`, `ROW_TS`, `ROW_BS`, and `ROW_LANES` for a lane team) and the
    /// alignment flag `ROW_ALIGNED` (see `aligned`).
    pub fn source(&self, entry: &str, sig: &Signature, aligned: String) -> Source {
        Source::new()
            .entry(entry, sig)
            .define("ROW_N", self.n)
            .define("ROW_H", self.h)
            .define("ROW_C", self.c)
            .define("ROW_V", self.v)
            .define("ROW_CPT", self.cpt)
            .define("ROW_TS", self.ts)
            .define("ROW_BS", self.bs)
            .flag("ROW_LANES", self.ts <= 32)
            .define("ROW_ALIGNED", aligned)
    }

    /// The launch of a team kernel: a thread per row and team member, grid-strided.
    pub fn launch(&self, source: String, entry: String, sig: Signature) -> Launch {
        Launch::new(source, entry, Grid::Cover(self.n as u64 * self.ts as u64), self.bs, sig.into_args())
    }
}

/// `T_<name>` (the C type of an element) and `OFF_<name>(r)` (the offset of row `r`) of a
/// tensor.
pub(super) fn tensor(src: Source, name: &str, t: &RowT) -> Source {
    src.define(&format!("T_{name}"), t.ty).define(&format!("OFF_{name}(r)"), format!("({})", t.off))
}

/// The alignment flag of a kernel's vector accesses over `tensors` (the pointer's name in the
/// kernel, and how it reaches its rows): `false` when the chunks are single elements or a row
/// stride does not allow them (known at plan time), else a run-time check of the base pointers
/// (`FR_AL` of rows.cuh).
pub(super) fn aligned(v: i64, tensors: &[(&str, &RowT)]) -> String {
    if v == 1 || tensors.iter().any(|(_, t)| !t.vec_ok) {
        return "false".into();
    }
    let checks: Vec<String> = tensors.iter().map(|(p, t)| format!("FR_AL({p}, {})", t.align)).collect();
    checks.join(" && ")
}

/// The code generator for one node.
pub(super) struct Gen<'a> {
    pub graph: &'a Graph,
    pub node: &'a Node,
    pub ni: usize,
    /// SMs of the target (for one-wave and persistent grids).
    pub sms: i64,
}

impl Gen<'_> {
    pub fn dt(&self, id: TensorId) -> DataType {
        self.graph.resolved_data_type(id).unwrap_or(DataType::F32)
    }

    pub fn dims(&self, id: TensorId) -> &[i64] {
        &self.graph.desc(id).dims
    }

    /// The rows of tensor `id` whose axes `first..` are the normalized ones (rows run over the
    /// axes before). With `packed`, the normalized axes must be packed row-major (size-1 axes
    /// aside); otherwise they must all be 1 (statistics). `v`: elements per vector access.
    pub fn rows(&self, id: TensorId, first: usize, v: i64, packed: bool) -> Option<RowT> {
        let d = self.graph.desc(id);
        let dt = self.dt(id);
        let ty = float_c_type(dt)?;
        let (dims, strides) = (&d.dims, &d.strides);
        if dims.len() != strides.len() || dims.len() < first || dims.iter().any(|&n| n <= 0) {
            return None;
        }
        let mut expect = 1i64;
        for a in (first..dims.len()).rev() {
            if dims[a] == 1 {
                continue;
            }
            if !packed || strides[a] != expect {
                return None;
            }
            expect = expect.checked_mul(dims[a])?;
        }
        let size = dt.size() as i64;
        let align = (v * size).min(16);
        let mut vec_ok = v > 1;
        let mut terms = Vec::new();
        let mut inner = 1i64;
        for a in (0..first).rev() {
            let n = dims[a];
            if n == 1 {
                continue;
            }
            let s = strides[a];
            if (s * size).rem_euclid(align) != 0 {
                vec_ok = false;
            }
            let mut idx = if inner == 1 { "r".to_string() } else { format!("(r / {inner}LL)") };
            if dims[..a].iter().any(|&m| m != 1) {
                idx = format!("({idx} % {n}LL)");
            }
            terms.push(format!("{idx} * ({s}LL)"));
            inner = inner.checked_mul(n)?;
        }
        let off = if terms.is_empty() { "0LL".to_string() } else { terms.join(" + ") };
        Some(RowT { id, dt, ty, off, vec_ok, align: align as usize })
    }

    /// A scale-like tensor (scale, bias, dscale, dbias) of x dims `xd`: `[1, xd[1..]...]`,
    /// packed.
    pub fn param(&self, id: TensorId, xd: &[i64], v: i64) -> Option<RowT> {
        let d = self.dims(id);
        if d.len() != xd.len() || d[0] != 1 || d[1..] != xd[1..] {
            return None;
        }
        self.rows(id, 1, v, true)
    }

    pub fn entry(&self, what: &str) -> String {
        entry_name(self.ni, what)
    }
}
