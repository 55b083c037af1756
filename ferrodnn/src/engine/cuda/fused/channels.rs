//! What the channels-last kernels share: x seen as rows of C contiguous channels (one row per
//! position), moved 16 bytes of channels at a time (8 f16/bf16 or 4 f32: a "vector",
//! `vectors.cuh`), for batchnorm, genstats, instancenorm ([`super::batchnorm`],
//! [`super::instancenorm`]) and pooling ([`super::pooling`]); C times the element size must be a
//! multiple of 16 so every row starts 16-byte aligned. The buffers' base alignment is unknown
//! at plan time: each kernel checks it and takes an element-wise path when a base is not
//! aligned.
//!
//! And the channel-statistics passes of the norms (`channels.cuh`, `channel_stats.cuh`,
//! `channel_finalize.cuh`, `channel_apply.cuh`), three launches each:
//! 1. statistics: a block covers a slab of positions (NHWC, [`StatsGeom`], [`ChanGeom`]) or a
//!    team of threads a plane (NCHW, [`PlaneGeom`]); its threads hold two running sums per
//!    channel (for the forward, of `x - K` and `(x - K)^2`, K a shift that keeps the f32 sums
//!    well conditioned), reduce them in a fixed order and write per-block partials to scratch;
//! 2. finalize: per channel (and group), the partials summed in f64 in a fixed order; the op's
//!    outputs (mean, inv_variance, running statistics, dscale, dbias) and the f32
//!    coefficients of the apply step to scratch;
//! 3. apply: the same slabs walked backwards (the rows launch 1 read last, likely still in L2,
//!    come first), `y = (x - mean) * (inv * scale) + bias` or the backward's `dx`.
//!
//! All statistics are deterministic. The backward of batchnorm and instancenorm
//! ([`backward`]) is here: the same three passes in groups.

use crate::dtype::DataType;
use crate::engine::cuda::kernel::ctype::{self, float_c_type};
use crate::engine::cuda::kernel::{entry_name, Grid, Launch, NodeKernels, Signature, Source};
use crate::graph::{Graph, Node, TensorId};

/// 16-byte vectors of channels (`vectors.cuh`).
pub(super) const VECTORS: &str = include_str!("vectors.cuh");
/// What the channel-statistics kernels share.
pub(super) const CHANNELS: &str = include_str!("channels.cuh");
/// The statistics passes.
pub(super) const STATS: &str = include_str!("channel_stats.cuh");
/// The finalize passes.
pub(super) const FINALIZE: &str = include_str!("channel_finalize.cuh");
/// The apply passes.
pub(super) const APPLY: &str = include_str!("channel_apply.cuh");

/// Blocks per SM the batchnorm launches aim for: 4 blocks of ~256 threads per SM (of the
/// target's SM count), one wave; every thread keeps several 16-byte loads in flight.
pub(super) const BN_BLOCKS_PER_SM: i64 = 4;
/// Threads per batchnorm block (rounded down to a multiple of the vectors per row).
const BN_THREADS: i64 = 256;
/// Loads in flight per thread in the batchnorm loops.
const UNROLL: i64 = 4;

/// `a / b` rounded up, for positive `a` and `b`.
pub(super) fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

/// The types of x and y of a vector kernel (f32, f16 or bf16 each).
#[derive(Clone, Copy)]
pub(super) struct Vectors {
    xt: DataType,
    yt: DataType,
}

impl Vectors {
    /// None unless both types are ones the vector kernels load and store.
    pub(super) fn new(xt: DataType, yt: DataType) -> Option<Vectors> {
        float_c_type(xt)?;
        float_c_type(yt)?;
        Some(Vectors { xt, yt })
    }

    /// Elements of x in 16 bytes.
    pub(super) fn vec(&self) -> i64 {
        16 / self.xt.size() as i64
    }

    /// The defines `vectors.cuh` reads.
    pub(super) fn define(&self, src: Source) -> Source {
        let code = |dt: DataType| format!("DT_{}", dt.name().to_uppercase());
        let yvb = self.vec() * self.yt.size() as i64;
        src.define("X_DT", code(self.xt)).define("Y_DT", code(self.yt)).define("VEC", self.vec()).define("YVB", yvb).define("YAL", yvb.min(16))
    }
}

/// Whether `dims`/`strides` are channels-last packed: axis 1 (C) has stride 1 and the other
/// axes, ordered by stride, are packed outside it. With `exact` they must be in the order
/// N, spatial... (NHWC); otherwise any order of the non-channel axes is fine. Axes of size 1
/// may have any stride.
pub(super) fn channels_last(dims: &[i64], strides: &[i64], exact: bool) -> bool {
    if dims.len() < 2 || dims.len() != strides.len() || dims.iter().any(|&d| d < 1) {
        return false;
    }
    let c = dims[1];
    if c > 1 && strides[1] != 1 {
        return false;
    }
    let mut others: Vec<usize> = (0..dims.len()).filter(|&a| a != 1 && dims[a] > 1).collect();
    if exact {
        // N outermost, then the spatial axes in order: innermost is the last.
        others.reverse();
    } else {
        others.sort_by_key(|&a| strides[a]);
    }
    let mut expect = c;
    for a in others {
        if strides[a] != expect {
            return false;
        }
        expect = match expect.checked_mul(dims[a]) {
            Some(e) => e,
            None => return false,
        };
    }
    true
}

/// Whether `dims`/`strides` are packed row-major (axes of size 1 may have any stride).
pub(super) fn row_major(dims: &[i64], strides: &[i64]) -> bool {
    if dims.len() != strides.len() || dims.iter().any(|&d| d < 1) {
        return false;
    }
    let mut expect = 1i64;
    for a in (0..dims.len()).rev() {
        if dims[a] > 1 && strides[a] != expect {
            return false;
        }
        expect = match expect.checked_mul(dims[a]) {
            Some(e) => e,
            None => return false,
        };
    }
    true
}

/// Whether x-like tensors `ids` (same dims as the first) put every element at the same offset.
pub(super) fn same_layout(graph: &Graph, ids: &[TensorId]) -> bool {
    let d0 = graph.desc(ids[0]);
    ids.iter().all(|&id| {
        let d = graph.desc(id);
        d.dims == d0.dims && d.strides.len() == d0.strides.len() && d.dims.iter().enumerate().all(|(i, &n)| n <= 1 || d.strides[i] == d0.strides[i])
    })
}

/// A per-channel tensor as a kernel reads or writes it, through the prelude's `ld` or `st` of
/// its type: `[G or 1, C, 1, ...]` with element (g, c) at `g * s0 + c * s1` (`s0` 0 for one
/// group) where `grouped`, else `[1, C, 1, ...]` with element c at `c * s1`.
pub(super) struct ChanT {
    grouped: bool,
    s0: i64,
    s1: i64,
    ld: String,
    st: String,
}

impl ChanT {
    /// Tensor `id`, element c at `c * stride`.
    pub(super) fn new(graph: &Graph, id: TensorId, stride: i64) -> ChanT {
        ChanT { grouped: false, s0: 0, s1: stride, ld: ctype::ld(graph, id), st: ctype::st(graph, id) }
    }

    /// The defines of the tensor that a template reads as `NAME`: `LD_NAME` (or `ST_NAME` with
    /// `write`) and its strides, `NAME_S0` and `NAME_S1` where grouped (see `STAT_AT` in
    /// `channels.cuh`), else `NAME_S` (element c at `c * NAME_S`).
    pub(super) fn define(&self, src: Source, name: &str, write: bool) -> Source {
        let src = if write { src.define(&format!("ST_{name}"), &self.st) } else { src.define(&format!("LD_{name}"), &self.ld) };
        if self.grouped {
            src.define(&format!("{name}_S0"), format!("{}LL", self.s0)).define(&format!("{name}_S1"), format!("{}LL", self.s1))
        } else {
            src.define(&format!("{name}_S"), format!("{}LL", self.s1))
        }
    }
}

/// The defines of each (tensor, the name a template reads it as, written) (see [`ChanT::define`]).
pub(super) fn define_chans(src: Source, chans: &[(&ChanT, &str, bool)]) -> Source {
    chans.iter().fold(src, |src, &(t, name, write)| t.define(src, name, write))
}

/// A per-channel tensor `[1, C, 1, ...]` of rank `rank` (of a float type but f64): element c
/// at `c * stride`; or None.
pub(super) fn chan_of(graph: &Graph, id: TensorId, rank: usize, c: i64) -> Option<ChanT> {
    let d = graph.desc(id);
    let t = ctype::dtype(graph, id);
    if d.dims.len() != rank || d.dims[1] != c || d.element_count() != c || t == DataType::F64 || !t.is_float() {
        return None;
    }
    Some(ChanT::new(graph, id, if c > 1 { d.strides[1] } else { 0 }))
}

/// Tensor `id` as a `[groups, C, 1, ...]` tensor of rank `rank` (f16, bf16 or f32).
pub(super) fn stat_of(graph: &Graph, id: TensorId, rank: usize, groups: i64, c: i64) -> Option<ChanT> {
    let d = graph.desc(id);
    let t = ctype::dtype(graph, id);
    if d.dims.len() != rank || d.strides.len() != rank || d.dims[0] != groups || d.dims[1] != c || d.dims[2..].iter().any(|&n| n != 1) || float_c_type(t).is_none() {
        return None;
    }
    let s0 = if groups > 1 { d.strides[0] } else { 0 };
    Some(ChanT { grouped: true, s0, ..ChanT::new(graph, id, if c > 1 { d.strides[1] } else { 0 }) })
}

/// How a channel pass walks x: the defines of its geometry (`CH_GEOM` and the sizes, see
/// `channels.cuh`).
pub(super) trait Geom {
    fn define(&self, src: Source) -> Source;
}

/// The slabs of positions the NHWC statistics pass of batchnorm and genstats (and the
/// batchnorm apply and inference passes) walk: block b covers SLAB positions for all channels;
/// its threads, ROWS rows of LANES, own one vector of channels each.
pub(super) struct StatsGeom {
    c: i64,
    cv: i64,
    lanes: i64,
    rows: i64,
    pub(super) block: i64,
    positions: i64,
    slab: i64,
    pub(super) blocks: i64,
}

impl StatsGeom {
    pub(super) fn new(c: i64, vec: i64, positions: i64, sms: i64) -> StatsGeom {
        let cv = c / vec;
        let lanes = cv.min(BN_THREADS);
        let rows = (BN_THREADS / lanes).max(1);
        let block = lanes * rows;
        let want = (sms * BN_BLOCKS_PER_SM).min(ceil_div(positions, rows * UNROLL)).max(1);
        let slab = ceil_div(positions, want);
        let blocks = ceil_div(positions, slab);
        StatsGeom { c, cv, lanes, rows, block, positions, slab, blocks }
    }
}

impl Geom for StatsGeom {
    fn define(&self, src: Source) -> Source {
        let StatsGeom { c, cv, lanes, rows, block, positions, slab, blocks } = self;
        src.define("CH_GEOM", "CH_SLABS")
            .define("C_", format!("{c}LL"))
            .define("CV", cv)
            .define("LANES", lanes)
            .define("ROWS", rows)
            .define("BLOCK", block)
            .define("P_", format!("{positions}LL"))
            .define("SLAB", format!("{slab}LL"))
            .define("NBLK", blocks)
            .define("UNR", UNROLL)
    }
}

/// The NHWC channel passes in groups: `groups` groups (images for instancenorm, 1 for
/// batchnorm) of `positions` positions of C channels each, packed one group after the other;
/// NBLK blocks per group, each a slab of SLAB positions; a thread owns one vector of channels.
pub(super) struct ChanGeom {
    c: i64,
    cv: i64,
    lanes: i64,
    rows: i64,
    pub(super) block: i64,
    groups: i64,
    positions: i64,
    slab: i64,
    nblk: i64,
}

impl ChanGeom {
    /// `per_sm`: the blocks per SM the kernels' launch bounds promise; the grid (groups times
    /// blocks per group) stays within one wave of them (a few blocks of a second wave would
    /// double the pass's time for a sliver of its work).
    pub(super) fn new(c: i64, vec: i64, groups: i64, positions: i64, sms: i64, per_sm: i64) -> ChanGeom {
        let cv = c / vec;
        let lanes = cv.min(BN_THREADS);
        let rows = (BN_THREADS / lanes).max(1);
        let block = lanes * rows;
        let want = (sms * per_sm / groups).min(ceil_div(positions, rows * UNROLL)).max(1);
        let slab = ceil_div(positions, want);
        let nblk = ceil_div(positions, slab);
        ChanGeom { c, cv, lanes, rows, block, groups, positions, slab, nblk }
    }

    pub(super) fn grid(&self) -> i64 {
        self.groups * self.nblk
    }

    /// Blocks (partials) per group and positions per block (the last block's may be fewer).
    pub(super) fn blocks_and_slab(&self) -> (i64, i64) {
        (self.nblk, self.slab)
    }
}

impl Geom for ChanGeom {
    fn define(&self, src: Source) -> Source {
        let ChanGeom { c, cv, lanes, rows, block, groups, positions, slab, nblk } = self;
        src.define("CH_GEOM", "CH_GROUPS")
            .define("C_", format!("{c}LL"))
            .define("CV", cv)
            .define("LANES", lanes)
            .define("ROWS", rows)
            .define("BLOCK", block)
            .define("G_", format!("{groups}LL"))
            .define("P_", format!("{positions}LL"))
            .define("SLAB", format!("{slab}LL"))
            .define("NBLK", nblk)
            .define("UNR", UNROLL)
    }
}

/// The NCHW passes: planes of HW contiguous elements (plane `pl = n * C + c`), read in
/// vectors of VEC elements when a plane is a multiple of 16 bytes (else one element at a
/// time). The statistics pass gives each plane to a team (a warp, or a block for few planes)
/// and writes `part[2][N][C]` (the layout of the NHWC pass with G = 1 and NBLK = N, so the
/// same finalize serves).
pub(super) struct PlaneGeom {
    c: i64,
    n: i64,
    hw: i64,
    pub(super) vw: i64,
    ts: i64,
}

impl PlaneGeom {
    pub(super) fn new(c: i64, n: i64, hw: i64, vec: i64, esize: i64, sms: i64) -> PlaneGeom {
        let vw = if hw * esize % 16 == 0 { vec } else { 1 };
        // A warp per plane when there are enough planes to fill the GPU with warps.
        let ts = if n * c >= sms * 32 || hw / vw <= 512 { 32 } else { 256 };
        PlaneGeom { c, n, hw, vw, ts }
    }

    /// Blocks of the statistics pass.
    pub(super) fn stats_grid(&self, sms: i64) -> i64 {
        let planes = self.n * self.c;
        if self.ts == 32 {
            ceil_div(planes, 8).min(sms * 8).max(1)
        } else {
            planes.min(sms * 8).max(1)
        }
    }
}

impl Geom for PlaneGeom {
    fn define(&self, src: Source) -> Source {
        let PlaneGeom { c, n, hw, vw, ts } = self;
        src.define("CH_GEOM", "CH_PLANES")
            .define("C_", format!("{c}LL"))
            .define("N_", format!("{n}LL"))
            .define("HW_", format!("{hw}LL"))
            .define("VW", vw)
            .define("ITEMS", format!("{}LL", hw / vw))
            .define("PLANES", format!("{}LL", n * c))
            .define("TS", ts)
            .define("UNR", UNROLL)
            // For the shared finalize: one group of N blocks (planes) per channel.
            .define("G_", "1LL")
            .define("NBLK", n)
            .define("P_", format!("{}LL", n * hw))
    }
}

/// The start of a channel kernel's text: `sig`'s entry, the vectors of `v`, `geom`'s defines
/// and `CH_DY` (whether the pass reads dy). The pass's own defines follow; [`templates`] ends
/// it.
pub(super) fn start(entry: &str, sig: &Signature, v: Vectors, geom: &impl Geom, dy: bool) -> Source {
    geom.define(v.define(Source::new().entry(entry, sig))).flag("CH_DY", dy)
}

/// The end of a channel kernel's text: the shared headers, then the pass's `template`
/// ([`STATS`], [`FINALIZE`] or [`APPLY`]).
pub(super) fn templates(src: Source, template: &str) -> String {
    src.template(VECTORS).template(CHANNELS).template(template).build()
}

/// A launch of `grid` blocks of `block` threads.
pub(super) fn exact(source: String, entry: String, grid: i64, block: i64, sig: Signature) -> Launch {
    Launch::new(source, entry, Grid::Exact(grid as u32, 1, 1), block as u32, sig.into_args())
}

/// A grid-stride launch over `threads` threads of 256.
pub(super) fn strided(source: String, entry: String, threads: i64, sig: Signature) -> Launch {
    Launch::new(source, entry, Grid::Cover(threads.max(1) as u64), 256, sig.into_args())
}

/// The statistics pass of batchnorm and genstats on NHWC (`CH_SLABS`): per block, the sums of
/// `x - K` and `(x - K)^2` (K: the channel's value at position 0) to scratch 0,
/// `part[2][NBLK][C]`.
pub(super) fn slab_stats(entry: String, v: Vectors, geom: &StatsGeom, x: TensorId) -> Launch {
    let mut sig = Signature::new();
    sig.ptr("xv", x, false).scratch("float", "part", 0, true);
    let source = templates(start(&entry, &sig, v, geom, false), STATS);
    exact(source, entry, geom.blocks, geom.block, sig)
}

/// The NCHW statistics pass of batchnorm and genstats: per plane the sums of `x - K` and
/// `(x - K)^2` (K: the channel's first value, in plane (0, c)) to scratch 0.
pub(super) fn plane_shift_stats(entry: String, v: Vectors, geom: &PlaneGeom, x: TensorId, sms: i64) -> Launch {
    let mut sig = Signature::new();
    sig.ptr("xv", x, false).scratch("float", "part", 0, true);
    let source = templates(start(&entry, &sig, v, geom, false), STATS);
    exact(source, entry, geom.stats_grid(sms), 256, sig)
}

/// The finalize pass (`channel_finalize.cuh`) of `op` (`FIN_BN`, `FIN_GENSTATS`, `FIN_IN` or
/// `FIN_BWD`), from `src` (its [`start`] and the op's defines), 32 channels per block: the
/// groups one after the other, or where there are several, GPP at a time (`FIN_GROUPED`),
/// with `split` each blockIdx.y its own GPP.
pub(super) fn finalize(src: Source, entry: String, sig: Signature, op: &str, groups: i64, c: i64, split: bool) -> Launch {
    let src = src.define("FIN_OP", op);
    let gx = ceil_div(c, 32) as u32;
    let (src, grid) = if groups > 1 {
        let gpp = 1i64 << (63 - groups.clamp(1, 32).leading_zeros());
        let gy = if split { ceil_div(groups, gpp) } else { 1 };
        (src.flag("FIN_GROUPED", true).define("GPP", gpp).flag("SPLIT", split), Grid::Exact(gx, gy as u32, 1))
    } else {
        (src.flag("FIN_GROUPED", false), Grid::Exact(gx, 1, 1))
    };
    Launch::new(templates(src, FINALIZE), entry, grid, 1024, sig.into_args())
}

/// Backward of batchnorm (per channel over every axis but 1; `instance` false, one group) and
/// instancenorm (per (n, c) over the spatial axes; N groups): dx, dscale, dbias. NHWC: the
/// statistics pass sums dy and dy * xhat per (group, channel) from x and dy, the finalize
/// writes dscale and dbias (summed over the groups in order) and the coefficients of dx, the
/// apply pass computes `dx = inv * scale * (dy - sum(dy) / n - xhat * sum(dy * xhat) / n)` as
/// `A * dy + B * (x - mean) + Cs` (A, B, Cs per (group, channel), in f64). NCHW (batchnorm
/// only; instancenorm NCHW is a row kernel): the same three passes over planes.
pub(super) fn backward(graph: &Graph, ni: usize, node: &Node, instance: bool, sms: i64) -> Option<NodeKernels> {
    let dy = node.input("dy")?;
    let x = node.input("x")?;
    let scale = node.input("scale")?;
    let mean = node.input("mean")?;
    let inv = node.input("inv_variance")?;
    let dx = node.output("dx")?;
    let dscale = node.output("dscale")?;
    let dbias = node.output("dbias")?;
    let xd = graph.desc(x).clone();
    let (xt, dxt) = (ctype::dtype(graph, x), ctype::dtype(graph, dx));
    if ctype::dtype(graph, dy) != xt || xd.dims.len() < if instance { 3 } else { 2 } || !same_layout(graph, &[x, dy, dx]) {
        return None;
    }
    let v = Vectors::new(xt, dxt)?;
    let rank = xd.dims.len();
    let c = xd.dims[1];
    let n0 = xd.dims[0];
    let groups = if instance { n0 } else { 1 };
    let sc = stat_of(graph, scale, rank, 1, c)?;
    let mn = stat_of(graph, mean, rank, groups, c)?;
    let iv = stat_of(graph, inv, rank, groups, c)?;
    let ds = stat_of(graph, dscale, rank, 1, c)?;
    let db = stat_of(graph, dbias, rank, 1, c)?;
    let vec = v.vec();
    let total = xd.element_count();
    let what = if instance { "in" } else { "bn" };
    let stats_entry = entry_name(ni, &format!("{what}_bwd_stats"));
    let fin_entry = entry_name(ni, &format!("{what}_bwd_finalize"));
    let apply_entry = entry_name(ni, &format!("{what}_bwd_apply"));
    // The statistics pass reads mean and inv_variance per (group, channel).
    let mut stats_sig = Signature::new();
    stats_sig.ptr("xv", x, false).ptr("dyv", dy, false).ptr("mn", mean, false).ptr("iv", inv, false).scratch("float", "part", 0, true);
    let stats_chans = [(&mn, "MN", false), (&iv, "IV", false)];
    let mut fin_sig = Signature::new();
    fin_sig.scratch("float", "part", 0, false).scratch("float", "co", 1, true).ptr("mn", mean, false).ptr("iv", inv, false).ptr("sc", scale, false);
    fin_sig.ptr("ds", dscale, true).ptr("db", dbias, true);
    let fin_chans = [(&mn, "MN", false), (&iv, "IV", false), (&sc, "SC", false), (&ds, "DS", true), (&db, "DB", true)];
    let mut apply_sig = Signature::new();
    apply_sig.ptr("xv", x, false).ptr("dyv", dy, false).scratch("float", "co", 1, false).ptr("yv", dx, true);
    if channels_last(&xd.dims, &xd.strides, instance) && c % vec == 0 {
        let positions = total / c / groups;
        // The dy kernels are bounded to 2 blocks per SM (batchnorm keeps its grid of 4 per SM).
        let geom = ChanGeom::new(c, vec, groups, positions, sms, if groups > 1 { 2 } else { BN_BLOCKS_PER_SM });
        let stats = templates(define_chans(start(&stats_entry, &stats_sig, v, &geom, true), &stats_chans), STATS);
        let fin = define_chans(start(&fin_entry, &fin_sig, v, &geom, false), &fin_chans);
        let apply = templates(start(&apply_entry, &apply_sig, v, &geom, true), APPLY);
        return Some(NodeKernels {
            launches: vec![
                exact(stats, stats_entry, geom.grid(), geom.block, stats_sig),
                finalize(fin, fin_entry, fin_sig, "FIN_BWD", groups, c, false),
                exact(apply, apply_entry, geom.grid(), geom.block, apply_sig),
            ],
            scratch: vec![(2 * geom.grid() * c * 4) as usize, (4 * groups * c * 4) as usize],
        });
    }
    if instance || !row_major(&xd.dims, &xd.strides) {
        return None;
    }
    let hw: i64 = xd.dims[2..].iter().product();
    let geom = PlaneGeom::new(c, n0, hw, vec, xt.size() as i64, sms);
    let stats = templates(define_chans(start(&stats_entry, &stats_sig, v, &geom, true), &stats_chans), STATS);
    let fin = define_chans(start(&fin_entry, &fin_sig, v, &geom, false), &fin_chans);
    let apply = templates(start(&apply_entry, &apply_sig, v, &geom, true), APPLY);
    Some(NodeKernels {
        launches: vec![
            exact(stats, stats_entry, geom.stats_grid(sms), 256, stats_sig),
            finalize(fin, fin_entry, fin_sig, "FIN_BWD", 1, c, false),
            strided(apply, apply_entry, n0 * c * hw / geom.vw, apply_sig),
        ],
        scratch: vec![(2 * n0 * c * 4) as usize, (4 * c * 4) as usize],
    })
}

#[cfg(test)]
mod tests {
    use super::channels_last;

    #[test]
    fn channels_last_layouts() {
        // NHWC of [2, 8, 3, 5]: strides [120, 1, 40, 8].
        assert!(channels_last(&[2, 8, 3, 5], &[120, 1, 40, 8], true));
        assert!(channels_last(&[2, 8, 3, 5], &[120, 1, 40, 8], false));
        // NWHC: fine for batchnorm, not for pooling.
        assert!(channels_last(&[2, 8, 3, 5], &[120, 1, 8, 24], false));
        assert!(!channels_last(&[2, 8, 3, 5], &[120, 1, 8, 24], true));
        // NCHW.
        assert!(!channels_last(&[2, 8, 3, 5], &[120, 15, 5, 1], false));
        // Padded rows.
        assert!(!channels_last(&[2, 8, 3, 5], &[135, 1, 45, 9], false));
        // Size-1 axes with any stride.
        assert!(channels_last(&[1, 8, 1, 5], &[7, 1, 3, 8], true));
    }
}
