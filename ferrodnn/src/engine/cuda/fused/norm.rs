//! Fast normalization kernels over rows (the scheme of [`super::rows`]): layernorm and rmsnorm
//! forward (a lane team per row up to 1024 elements, `norm_rows.cuh`; a persistent block per
//! row beyond, `norm_block.cuh`) and backward (`norm_bwd.cuh`, then the column sums of
//! `norm_bwd_params.cuh`), adalayernorm forward and backward, instancenorm forward and backward
//! with packed spatial axes (`instancenorm.cuh`, `instancenorm_params.cuh`), and the fusion of a
//! pointwise chain computing a layernorm's or rmsnorm's x into its kernel ([`prologue_groups`],
//! [`prologue_unit`]).

use super::rows::{aligned, norm_team, tensor, vec_width, Gen, RowT, Team, MAX_ROW, ROWS_CUH};
use crate::dtype::DataType;
use crate::engine::cuda::kernel::ctype::float_c_type;
use crate::engine::cuda::kernel::{Attr, Grid, Launch, NodeKernels, Signature, Source, Target, Unit};
use crate::error::Result;
use crate::graph::ops::Op;
use crate::graph::{Graph, TensorId};
use std::collections::HashMap;

const NORM_ROWS_CUH: &str = include_str!("norm_rows.cuh");
const NORM_BLOCK_CUH: &str = include_str!("norm_block.cuh");
const NORM_BWD_CUH: &str = include_str!("norm_bwd.cuh");
const NORM_BWD_PARAMS_CUH: &str = include_str!("norm_bwd_params.cuh");
const INSTANCENORM_CUH: &str = include_str!("instancenorm.cuh");
const INSTANCENORM_PARAMS_CUH: &str = include_str!("instancenorm_params.cuh");

/// Column slices (warps) of the dscale/dbias finalize kernel.
const FIN_SLICES: u32 = 32;

impl Gen<'_> {
    /// A forward norm's scale and optional bias (broadcast over rows of `xd`, `v`-wide vectors)
    /// and its optional mean and inverse-variance outputs (one value a row).
    #[allow(clippy::type_complexity)]
    fn affine_and_stats(
        &self,
        scale: TensorId,
        bias: Option<TensorId>,
        mean: Option<TensorId>,
        inv: Option<TensorId>,
        xd: &[i64],
        v: i64,
    ) -> Option<(RowT, Option<RowT>, Option<RowT>, Option<RowT>)> {
        let st = self.param(scale, xd, v)?;
        // An optional tensor the kernels cannot address declines (`?`), as a required one does.
        let bt = match bias {
            Some(b) => Some(self.param(b, xd, v)?),
            None => None,
        };
        let mt = match mean {
            Some(m) => Some(self.rows(m, 1, 1, false)?),
            None => None,
        };
        let it = match inv {
            Some(i) => Some(self.rows(i, 1, 1, false)?),
            None => None,
        };
        Some((st, bt, mt, it))
    }

    /// The node's epsilon (its attribute `value`, or the tensor on its `epsilon` port): the
    /// kernels' `float eps` parameter, so that one kernel serves every value. Declined when the
    /// plan knows it and it is not a positive normal f32 (the kernels take no other); a value
    /// that comes with each execution is checked then to be positive and finite.
    fn epsilon(&self, value: f64) -> Option<Attr> {
        let eps = Attr::of(self.node, "epsilon", value);
        match eps.known(self.graph) {
            Some(v) => {
                let f = v as f32;
                (f.is_normal() && f > 0.0).then_some(eps)
            }
            None => Some(eps),
        }
    }
}

/// The statistics outputs' defines (`NORM_MEAN`, `NORM_INV`, and their `T_`/`OFF_` where the
/// node has them).
fn stats(mut src: Source, mean: Option<&RowT>, inv: Option<&RowT>) -> Source {
    src = src.flag("NORM_MEAN", mean.is_some()).flag("NORM_INV", inv.is_some());
    if let Some(m) = mean {
        src = tensor(src, "MEAN", m);
    }
    if let Some(i) = inv {
        src = tensor(src, "INV", i);
    }
    src
}

/// Threads per block, chunks per thread and rows per step of the backward kernel: a block per
/// row (at most 512 threads, else 1024), as many rows per step (2 or 1) as the registers
/// allow: per thread the column accumulators (`acc` floats per element), the step's rows as
/// floats and the next step's prefetched as raw elements (`bytes` per element of x plus dy),
/// and about 24 registers besides, within 128 (64 for 1024 threads).
fn backward_team(c: i64, v: i64, acc: i64, bytes: i64) -> Option<(u32, i64, i64)> {
    for (t, budget) in [(512, 128), (1024, 64)] {
        let cpt = (c + t - 1) / t;
        let e = cpt * v;
        for rpi in [2, 1] {
            if acc * e + rpi * e * 2 + rpi * e * bytes / 4 + 24 <= budget {
                return Some(((((c + cpt - 1) / cpt + 31) / 32 * 32) as u32, cpt, rpi));
            }
        }
    }
    None
}

/// Resident blocks per SM (and launch-bound minimum) of the block-per-row forward norms: 1024
/// threads per SM, so at most 64 registers per thread.
fn block_norm_per_sm(bs: u32) -> u32 {
    (1024 / bs).max(1)
}

/// Registers a thread of the block-per-row forward norms may spend on data kept across the
/// row's reduction (64 minus room for addresses, indices, statistics and the conversions).
const BLOCK_NORM_DATA_REGS: i64 = 32;

/// Whether `dims`/`strides` are packed row-major (axes of size 1 may have any stride).
fn packed_row_major(dims: &[i64], strides: &[i64]) -> bool {
    if dims.len() != strides.len() {
        return false;
    }
    let mut expect = 1i64;
    for a in (0..dims.len()).rev() {
        if dims[a] > 1 && strides[a] != expect {
            return false;
        }
        match expect.checked_mul(dims[a]) {
            Some(e) => expect = e,
            None => return false,
        }
    }
    true
}

/// What `norm_forward_block` needs from `norm_forward`.
struct NormBlock {
    entry: String,
    sig: Signature,
    al: String,
    rms: bool,
    team: Team,
    /// Bytes per element of x, and of scale plus bias.
    xs: i64,
    ps: i64,
    xt: RowT,
    yt: RowT,
    st: RowT,
    bt: Option<RowT>,
    mt: Option<RowT>,
    it: Option<RowT>,
}

/// A per-channel tensor `[1, C, 1, ...]` read (or written) at the channel of row `r` (rows
/// over axes 0 and 1 of an x of dims `xd`: channel `r % C`).
struct ChanT {
    id: TensorId,
    ty: &'static str,
    /// Element stride between channels.
    stride: i64,
}

impl Gen<'_> {
    /// layernorm (`rms` false) and rmsnorm forward.
    pub(super) fn norm_forward(&self, eps: f64, rms: bool) -> Option<NodeKernels> {
        let n = self.node;
        let x = n.input("x")?;
        let scale = n.input("scale")?;
        let bias = n.input("bias");
        if !rms && bias.is_none() {
            return None;
        }
        let y = n.output("y")?;
        let mean = if rms { None } else { n.output("mean") };
        let inv = n.output("inv_variance");
        let xd = self.dims(x).to_vec();
        if xd.len() < 2 || self.dims(y) != xd.as_slice() {
            return None;
        }
        let rows: i64 = xd[0];
        let h: i64 = xd[1..].iter().product();
        let v = vec_width(self.dt(x), h);
        let c = h / v;
        let (ts, bs, cpt) = norm_team(h, c, v)?;
        let eps = self.epsilon(eps)?;
        let xt = self.rows(x, 1, v, true)?;
        let yt = self.rows(y, 1, v, true)?;
        let (st, bt, mt, it) = self.affine_and_stats(scale, bias, mean, inv, &xd, v)?;

        let mut sig = Signature::new();
        sig.ptr("xp", x, false).ptr("scp", scale, false);
        let mut vec_tensors = vec![("x", &xt), ("y", &yt), ("sc", &st)];
        if let Some(b) = &bt {
            sig.ptr("bip", b.id, false);
            vec_tensors.push(("bi", b));
        }
        sig.ptr("yp", y, true);
        if let Some(m) = &mt {
            sig.ptr("mop", m.id, true);
        }
        if let Some(i) = &it {
            sig.ptr("ivp", i.id, true);
        }
        sig.attr("eps", eps, false);
        let al = aligned(v, &vec_tensors);
        let entry = self.entry(if rms { "rmsnorm_rows" } else { "layernorm_rows" });
        let team = Team { n: rows, h, c, v, cpt, ts, bs };
        if ts > 32 {
            // A block per row, persistent: see `norm_forward_block`.
            let xs = self.dt(x).size() as i64;
            let ps = (st.dt.size() + bt.as_ref().map_or(0, |b| b.dt.size())) as i64;
            return Some(self.norm_forward_block(NormBlock { entry, sig, al, rms, team, xs, ps, xt, yt, st, bt, mt, it }));
        }
        let mut src = team.source(&entry, &sig, al).flag("NORM_RMS", rms).flag("NORM_PROLOGUE", false);
        src = tensor(tensor(tensor(src, "X", &xt), "Y", &yt), "SC", &st).flag("NORM_BIAS", bt.is_some());
        if let Some(b) = &bt {
            src = tensor(src, "BI", b);
        }
        let source = stats(src, mt.as_ref(), it.as_ref()).template(ROWS_CUH).template(NORM_ROWS_CUH).build();
        Some(NodeKernels::one(team.launch(source, entry, sig)))
    }

    /// The block-per-row forward norms (rows longer than 1024 elements): persistent blocks
    /// (about one wave, `block_norm_per_sm` per SM, each taking every `gridDim.x`-th row, the
    /// same number of rows per block within one, at least 3); the next row's raw elements are fetched
    /// into registers before the current row's reduction, when the registers allow (the next
    /// two rows where they allow that: rmsnorm of 16-bit rows of up to 4096); scale and
    /// bias (the same columns in every row) are loaded once per thread and kept raw in
    /// registers, when the registers allow (else from L1 in each row); one block reduction per
    /// row: the sums of `x - K` and `(x - K)^2` around the row's first element `K` (for
    /// layernorm; rmsnorm only needs the sum of squares).
    fn norm_forward_block(&self, b: NormBlock) -> NodeKernels {
        let NormBlock { entry, sig, al, rms, team, xs, ps, xt, yt, st, bt, mt, it } = b;
        let e = team.cpt * team.v;
        // Per thread: the row (raw), the next row (raw), scale and bias (raw).
        let raw = e * xs / 4;
        let pre = 2 * raw <= BLOCK_NORM_DATA_REGS;
        let keep = raw + if pre { raw } else { 0 } + e * ps / 4 <= BLOCK_NORM_DATA_REGS;
        // Registers left for a second row in flight (rmsnorm, with no bias and one sum, has
        // them where layernorm has not): two rows' loads fly during each reduction, twice the
        // bytes in flight per SM.
        let pre2 = pre && 3 * raw + e * ps / 4 <= BLOCK_NORM_DATA_REGS;
        let per_sm = block_norm_per_sm(team.bs);
        let slots = self.sms * per_sm as i64;
        // At least 3 rows per block (when there are that many): the prefetch and the reuse of
        // the reduction buffers run even on small problems (and in the check cases).
        let rows = team.n;
        let per_block = ((rows + slots - 1) / slots).max(3);
        let grid = ((rows + per_block - 1) / per_block).max(1);
        let mut src = team.source(&entry, &sig, al).define("ROW_MIN_BLOCKS", per_sm).flag("NORM_RMS", rms);
        src = src.flag("NB_PRE", pre).flag("NB_AHEAD2", pre2).flag("NB_KEEP", keep);
        src = tensor(tensor(tensor(src, "X", &xt), "Y", &yt), "SC", &st).flag("NORM_BIAS", bt.is_some());
        if let Some(b) = &bt {
            src = tensor(src, "BI", b);
        }
        let source = stats(src, mt.as_ref(), it.as_ref()).template(ROWS_CUH).template(NORM_BLOCK_CUH).build();
        NodeKernels::one(Launch::new(source, entry, Grid::Exact(grid as u32, 1, 1), team.bs, sig.into_args()))
    }

    /// A scale-like tensor of adalayernorm over an x of dims `xd`: dims `[B or 1, S or 1...,
    /// D]`, the last axis packed; the offset of row `r` (rows over x's axes before the last)
    /// follows the axes where it is full (broadcast over the others).
    fn ada_param(&self, id: TensorId, xd: &[i64], v: i64) -> Option<RowT> {
        let d = self.graph.desc(id);
        let dt = self.dt(id);
        let ty = float_c_type(dt)?;
        let (dims, strides) = (&d.dims, &d.strides);
        let last = xd.len() - 1;
        if dims.len() != xd.len() || strides.len() != xd.len() || dims[last] != xd[last] || (xd[last] != 1 && strides[last] != 1) {
            return None;
        }
        let size = dt.size() as i64;
        let align = (v * size).min(16);
        let mut vec_ok = v > 1;
        let mut terms = Vec::new();
        let mut inner = 1i64;
        for a in (0..last).rev() {
            let n = xd[a];
            if n == 1 {
                if dims[a] != 1 {
                    return None;
                }
                continue;
            }
            if dims[a] == n {
                let s = strides[a];
                if (s * size).rem_euclid(align) != 0 {
                    vec_ok = false;
                }
                let mut idx = if inner == 1 { "r".to_string() } else { format!("(r / {inner}LL)") };
                if xd[..a].iter().any(|&m| m != 1) {
                    idx = format!("({idx} % {n}LL)");
                }
                terms.push(format!("{idx} * ({s}LL)"));
            } else if dims[a] != 1 {
                return None;
            }
            inner = inner.checked_mul(n)?;
        }
        let off = if terms.is_empty() { "0LL".to_string() } else { terms.join(" + ") };
        Some(RowT { id, dt, ty, off, vec_ok, align: align as usize })
    }

    /// adalayernorm forward: layernorm over the last axis, scale and bias per row group
    /// (`ada_param`); the statistics pass of the lane-team norms (two passes over the row
    /// in registers), a lane team or a block per row.
    pub(super) fn adalayernorm(&self, eps: f64) -> Option<NodeKernels> {
        let n = self.node;
        let x = n.input("x")?;
        let scale = n.input("scale")?;
        let bias = n.input("bias")?;
        let y = n.output("y")?;
        let mean = n.output("mean");
        let inv = n.output("inv_variance");
        let xd = self.dims(x).to_vec();
        if xd.len() < 2 || self.dims(y) != xd.as_slice() {
            return None;
        }
        let last = xd.len() - 1;
        let rows: i64 = xd[..last].iter().product();
        let h = xd[last];
        let v = vec_width(self.dt(x), h);
        let c = h / v;
        let (ts, bs, cpt) = norm_team(h, c, v)?;
        let eps = self.epsilon(eps)?;
        let xt = self.rows(x, last, v, true)?;
        let yt = self.rows(y, last, v, true)?;
        let st = self.ada_param(scale, &xd, v)?;
        let bt = self.ada_param(bias, &xd, v)?;
        let mt = match mean {
            Some(m) => Some(self.rows(m, last, 1, false)?),
            None => None,
        };
        let it = match inv {
            Some(i) => Some(self.rows(i, last, 1, false)?),
            None => None,
        };
        let mut sig = Signature::new();
        sig.ptr("xp", x, false).ptr("scp", scale, false).ptr("bip", bias, false).ptr("yp", y, true);
        if let Some(m) = &mt {
            sig.ptr("mop", m.id, true);
        }
        if let Some(i) = &it {
            sig.ptr("ivp", i.id, true);
        }
        sig.attr("eps", eps, false);
        let al = aligned(v, &[("x", &xt), ("y", &yt), ("sc", &st), ("bi", &bt)]);
        let team = Team { n: rows, h, c, v, cpt, ts, bs };
        let entry = self.entry("adalayernorm_rows");
        let mut src = team.source(&entry, &sig, al).flag("NORM_RMS", false).flag("NORM_PROLOGUE", false);
        src = tensor(tensor(tensor(tensor(src, "X", &xt), "Y", &yt), "SC", &st), "BI", &bt).flag("NORM_BIAS", true);
        let source = stats(src, mt.as_ref(), it.as_ref()).template(ROWS_CUH).template(NORM_ROWS_CUH).build();
        Some(NodeKernels::one(team.launch(source, entry, sig)))
    }

    /// layernorm (`rms` false) and rmsnorm backward: dx, then dscale and dbias from partials.
    ///
    /// With `ada` (adalayernorm backward): rows over x's last axis; scale, dscale and dbias
    /// `[G..., 1..., D]` packed (full leading axes, then ones), so the rows sharing a scale row
    /// are G groups of consecutive rows; each block takes rows of one group (BPG blocks per
    /// group) and the finalize sums each group's partials into its row of dscale and dbias.
    pub(super) fn norm_backward(&self, rms: bool, ada: bool) -> Option<NodeKernels> {
        let n = self.node;
        let dy = n.input("dy")?;
        let x = n.input("x")?;
        let scale = n.input("scale")?;
        let mean = if rms { None } else { Some(n.input("mean")?) };
        let inv = n.input("inv_variance")?;
        let dx = n.output("dx")?;
        let dscale = n.output("dscale")?;
        let dbias = n.output("dbias");
        if !rms && dbias.is_none() {
            return None;
        }
        let xd = self.dims(x).to_vec();
        if xd.len() < 2 || self.dims(dy) != xd.as_slice() || self.dims(dx) != xd.as_slice() {
            return None;
        }
        // Rows over the axes before `first`; scale rows shared by groups of `rg` rows.
        let first = if ada { xd.len() - 1 } else { 1 };
        let rows: i64 = xd[..first].iter().product();
        let h: i64 = xd[first..].iter().product();
        let v = vec_width(self.dt(x), h);
        let c = h / v;
        let (bs, cpt, rpi) = backward_team(c, v, if dbias.is_some() { 2 } else { 1 }, (self.dt(x).size() + self.dt(dy).size()) as i64)?;
        let xt = self.rows(x, first, v, true)?;
        let dyt = self.rows(dy, first, v, true)?;
        let dxt = self.rows(dx, first, v, true)?;
        let (groups, st, dst, dbt) = if ada {
            let sd = self.dims(scale).to_vec();
            if sd.len() != xd.len() || sd[first] != h {
                return None;
            }
            let k = (0..first).take_while(|&a| sd[a] == xd[a]).count();
            if sd[k..first].iter().any(|&d| d != 1) {
                return None;
            }
            let groups: i64 = xd[..k].iter().product();
            let grouped = |id: TensorId, v: i64| -> Option<RowT> {
                let d = self.graph.desc(id);
                if d.dims != sd || !packed_row_major(&d.dims, &d.strides) {
                    return None;
                }
                self.rows(id, first, v, true)
            };
            let dbt = match dbias {
                Some(b) => Some(grouped(b, 1)?),
                None => None,
            };
            (groups, grouped(scale, v)?, grouped(dscale, 1)?, dbt)
        } else {
            let dbt = match dbias {
                Some(b) => Some(self.param(b, &xd, 1)?),
                None => None,
            };
            (1, self.param(scale, &xd, v)?, self.param(dscale, &xd, 1)?, dbt)
        };
        let rg = rows / groups;
        let mt = match mean {
            Some(m) => Some(self.rows(m, first, 1, false)?),
            None => None,
        };
        let it = self.rows(inv, first, 1, false)?;
        let db = dbt.is_some();

        // Blocks: one wave of about 512 threads per SM of the target (the launch bounds keep
        // that many resident), at least 8 rows each; BPG blocks per group of rows.
        let per_sm = (512 / bs).max(1);
        let bpg = ((self.sms * per_sm as i64 + groups - 1) / groups).min((rg + 7) / 8).max(1);
        let blocks = groups * bpg;
        if blocks > i32::MAX as i64 || groups > 65535 {
            return None;
        }
        let part_bytes = (blocks * h) as usize * 4;

        let mut sig = Signature::new();
        sig.ptr("dyp", dy, false).ptr("xp", x, false).ptr("scp", scale, false);
        if let Some(m) = &mt {
            sig.ptr("mnp", m.id, false);
        }
        sig.ptr("ivp", it.id, false).ptr("dxp", dx, true).scratch("float", "pa", 0, true);
        if db {
            sig.scratch("float", "pb", 1, true);
        }
        let al = aligned(v, &[("x", &xt), ("dy", &dyt), ("dx", &dxt), ("sc", &st)]);
        let entry1 = self.entry(if ada {
            "adalayernorm_bwd_rows"
        } else if rms {
            "rmsnorm_bwd_rows"
        } else {
            "layernorm_bwd_rows"
        });
        let team = Team { n: rows, h, c, v, cpt, ts: bs, bs };
        let mut src = team.source(&entry1, &sig, al).define("ROW_MIN_BLOCKS", per_sm).define("NB_BPG", bpg).define("NB_RG", rg).define("NB_RPI", rpi);
        src = src.flag("NORM_RMS", rms).flag("NORM_DBIAS", db).define("T_SC", st.ty);
        src = tensor(tensor(tensor(tensor(src, "DY", &dyt), "X", &xt), "INV", &it), "DX", &dxt);
        if let Some(m) = &mt {
            src = tensor(src, "MEAN", m);
        }
        let source1 = src.template(ROWS_CUH).template(NORM_BWD_CUH).build();
        let launch1 = Launch::new(source1, entry1, Grid::Exact(blocks as u32, 1, 1), bs, sig.into_args());

        // Finalize: column sums of the partials in block order.
        let mut sig2 = Signature::new();
        sig2.scratch("float", "pa", 0, false);
        if db {
            sig2.scratch("float", "pb", 1, false);
        }
        sig2.ptr("dsp", dscale, true);
        if let Some(b) = &dbt {
            sig2.ptr("dbp", b.id, true);
        }
        let entry2 = self.entry(if ada {
            "adalayernorm_bwd_params"
        } else if rms {
            "rmsnorm_bwd_params"
        } else {
            "layernorm_bwd_params"
        });
        let mut src2 = Source::new().entry(&entry2, &sig2).define("NB_H", h).define("NB_P", bpg).define("NB_FS", FIN_SLICES);
        src2 = src2.flag("NORM_DBIAS", db).define("T_DS", dst.ty);
        if let Some(b) = &dbt {
            src2 = src2.define("T_DB", b.ty);
        }
        let source2 = src2.template(ROWS_CUH).template(NORM_BWD_PARAMS_CUH).build();
        let grid2 = ((h + 31) / 32) as u32;
        let launch2 = Launch::new(source2, entry2, Grid::Exact(grid2, groups as u32, 1), 32 * FIN_SLICES, sig2.into_args());
        let mut scratch = vec![part_bytes];
        if db {
            scratch.push(part_bytes);
        }
        Some(NodeKernels { launches: vec![launch1, launch2], scratch })
    }

    fn chan(&self, id: TensorId, xd: &[i64]) -> Option<ChanT> {
        let d = self.graph.desc(id);
        let ty = float_c_type(self.dt(id))?;
        if d.dims.len() != xd.len() || d.strides.len() != xd.len() || d.dims[0] != 1 || d.dims[1] != xd[1] || d.dims[2..].iter().any(|&n| n != 1) {
            return None;
        }
        Some(ChanT { id, ty, stride: if xd[1] > 1 { d.strides[1] } else { 0 } })
    }

    /// Instancenorm forward with the spatial axes packed (NCHW and the like): a row per
    /// (n, c) of HW elements, scale and bias the row's channel's; the lane-team / block-per-row
    /// scheme of adalayernorm (the row read once, kept in registers).
    pub(super) fn instancenorm(&self, eps: f64) -> Option<NodeKernels> {
        let n = self.node;
        let x = n.input("x")?;
        let scale = n.input("scale")?;
        let bias = n.input("bias")?;
        let y = n.output("y")?;
        let mean = n.output("mean");
        let inv = n.output("inv_variance");
        let xd = self.dims(x).to_vec();
        if xd.len() < 3 || self.dims(y) != xd.as_slice() {
            return None;
        }
        let rows: i64 = xd[0] * xd[1];
        let h: i64 = xd[2..].iter().product();
        let v = vec_width(self.dt(x), h);
        let c = h / v;
        let (ts, bs, cpt) = norm_team(h, c, v)?;
        let eps = self.epsilon(eps)?;
        let xt = self.rows(x, 2, v, true)?;
        let yt = self.rows(y, 2, v, true)?;
        let st = self.chan(scale, &xd)?;
        let bt = self.chan(bias, &xd)?;
        let mt = match mean {
            Some(m) => Some(self.rows(m, 2, 1, false)?),
            None => None,
        };
        let it = match inv {
            Some(i) => Some(self.rows(i, 2, 1, false)?),
            None => None,
        };
        let mut sig = Signature::new();
        sig.ptr("xp", x, false).ptr("scp", st.id, false).ptr("bip", bt.id, false).ptr("yp", y, true);
        if let Some(m) = &mt {
            sig.ptr("mop", m.id, true);
        }
        if let Some(i) = &it {
            sig.ptr("ivp", i.id, true);
        }
        sig.attr("eps", eps, false);
        let team = Team { n: rows, h, c, v, cpt, ts, bs };
        let entry = self.entry("instancenorm_rows");
        let mut src = team.source(&entry, &sig, aligned(v, &[("x", &xt), ("y", &yt)])).flag("IN_BACKWARD", false);
        src = src.define("IN_NC", format!("{}LL", xd[1])).define("IN_SC_STRIDE", format!("{}LL", st.stride)).define("IN_BI_STRIDE", format!("{}LL", bt.stride));
        src = tensor(tensor(src, "X", &xt), "Y", &yt).define("T_SC", st.ty).define("T_BI", bt.ty);
        let source = stats(src, mt.as_ref(), it.as_ref()).template(ROWS_CUH).template(INSTANCENORM_CUH).build();
        Some(NodeKernels::one(team.launch(source, entry, sig)))
    }

    /// Instancenorm backward with the spatial axes packed: a row per (n, c) (x and dy kept in
    /// registers), `dx = inv * scale * (dy - sum(dy) / HW - xhat * sum(dy * xhat) / HW)`; each
    /// row's two sums go to scratch, and a second launch adds them over n, in order, into
    /// dscale and dbias.
    pub(super) fn instancenorm_backward(&self) -> Option<NodeKernels> {
        let n = self.node;
        let dy = n.input("dy")?;
        let x = n.input("x")?;
        let scale = n.input("scale")?;
        let mean = n.input("mean")?;
        let inv = n.input("inv_variance")?;
        let dx = n.output("dx")?;
        let dscale = n.output("dscale")?;
        let dbias = n.output("dbias")?;
        let xd = self.dims(x).to_vec();
        if xd.len() < 3 || self.dims(dy) != xd.as_slice() || self.dims(dx) != xd.as_slice() {
            return None;
        }
        let (nb, nc) = (xd[0], xd[1]);
        let rows = nb * nc;
        let h: i64 = xd[2..].iter().product();
        if h > MAX_ROW / 2 {
            return None;
        }
        let v = vec_width(self.dt(x), h);
        let c = h / v;
        let (ts, bs, cpt) = norm_team(h, c, v)?;
        let xt = self.rows(x, 2, v, true)?;
        let dyt = self.rows(dy, 2, v, true)?;
        let dxt = self.rows(dx, 2, v, true)?;
        let st = self.chan(scale, &xd)?;
        let dst = self.chan(dscale, &xd)?;
        let dbt = self.chan(dbias, &xd)?;
        let mt = self.rows(mean, 2, 1, false)?;
        let it = self.rows(inv, 2, 1, false)?;
        let mut sig = Signature::new();
        sig.ptr("xp", x, false).ptr("dyp", dy, false).ptr("scp", st.id, false).ptr("mnp", mt.id, false).ptr("ivp", it.id, false);
        sig.ptr("dxp", dx, true).scratch("float", "part", 0, true);
        let team = Team { n: rows, h, c, v, cpt, ts, bs };
        let entry = self.entry("instancenorm_bwd_rows");
        let mut src = team.source(&entry, &sig, aligned(v, &[("x", &xt), ("dy", &dyt), ("dx", &dxt)])).flag("IN_BACKWARD", true);
        src = src.define("IN_NC", format!("{nc}LL")).define("IN_SC_STRIDE", format!("{}LL", st.stride)).define("T_SC", st.ty);
        src = tensor(tensor(tensor(tensor(tensor(src, "X", &xt), "DY", &dyt), "DX", &dxt), "MEAN", &mt), "INV", &it);
        let source = src.template(ROWS_CUH).template(INSTANCENORM_CUH).build();
        let launch1 = team.launch(source, entry, sig);
        // dscale[c] = sum over n of part[n * C + c], dbias[c] of part[N + n * C + c].
        let entry2 = self.entry("instancenorm_bwd_params");
        let mut sig2 = Signature::new();
        sig2.scratch("float", "part", 0, false).ptr("dsp", dst.id, true).ptr("dbp", dbt.id, true);
        let src2 = Source::new().entry(&entry2, &sig2).define("IN_NB", format!("{nb}LL")).define("IN_NC", format!("{nc}LL")).define("IN_ROWS", format!("{rows}LL"));
        let src2 = src2.define("IN_DS_STRIDE", format!("{}LL", dst.stride)).define("IN_DB_STRIDE", format!("{}LL", dbt.stride)).define("T_DS", dst.ty).define("T_DB", dbt.ty);
        let source2 = src2.template(ROWS_CUH).template(INSTANCENORM_PARAMS_CUH).build();
        let launch2 = Launch::new(source2, entry2, Grid::Exact(((nc + 31) / 32) as u32, 1, 1), 1024, sig2.into_args());
        Some(NodeKernels { launches: vec![launch1, launch2], scratch: vec![(2 * rows * 4) as usize] })
    }
}

// ----------------------------------------------------------------------------------------------
// Prologue fusion: a pointwise chain computing a norm's x, in the norm's kernel
// ----------------------------------------------------------------------------------------------

/// Most pointwise nodes, and most external inputs, a prologue takes (the templates' limits).
const PROLOGUE_MAX_NODES: usize = 8;
const PROLOGUE_MAX_INPUTS: usize = 6;

/// The operator (between `a` and `b`) of a pointwise node a prologue can take: add, sub, mul
/// (bias and scale too) of two tensors, computing in f32, output `y`.
fn prologue_formula(graph: &Graph, ni: usize) -> Option<char> {
    use crate::graph::ops::pointwise::PointwiseMode;
    let node = &graph.nodes[ni];
    let Op::Pointwise(a) = &node.op else { return None };
    let f = match a.mode {
        PointwiseMode::Add | PointwiseMode::Bias => '+',
        PointwiseMode::Sub => '-',
        PointwiseMode::Mul | PointwiseMode::Scale => '*',
        _ => return None,
    };
    if graph.compute_type(node) != DataType::F32 || node.outputs.len() != 1 || node.outputs[0].name != "y" || node.inputs.len() != 2 {
        return None;
    }
    if node.inputs.iter().any(|p| !(p.name == "a" || p.name == "b") || graph.desc(p.tensor).is_pass_by_value) {
        return None;
    }
    Some(f)
}

/// The prologue chain of norm node `ni`: the pointwise nodes (add, sub, mul of tensors of x's
/// dims) that compute its x, walking back from x through tensors that are virtual and read by
/// one node only (a tensor read elsewhere, or produced by another kind of node, is an input
/// the kernel loads). Empty when x does not come from such a node.
fn prologue_chain(graph: &Graph, ni: usize, producer: &HashMap<usize, usize>, readers: &HashMap<usize, Vec<usize>>) -> Vec<usize> {
    let Some(x) = graph.nodes[ni].input("x") else { return Vec::new() };
    let xdims = graph.desc(x).dims.clone();
    let mut chain = Vec::new();
    let mut stack = vec![x];
    while let Some(t) = stack.pop() {
        let Some(&p) = producer.get(&t.0) else { continue };
        if chain.contains(&p) || prologue_formula(graph, p).is_none() || graph.desc(t).dims != xdims {
            continue;
        }
        if t != x {
            let d = graph.desc(t);
            if !d.is_virtual || readers.get(&t.0).is_none_or(|r| r.len() != 1) {
                continue;
            }
        }
        chain.push(p);
        for port in &graph.nodes[p].inputs {
            stack.push(port.tensor);
        }
    }
    chain
}

/// Groups of a pointwise chain and the layernorm or rmsnorm that reads its result (the norm
/// last, the chain in topological order), for [`prologue_unit`]: each external input of the
/// chain is read once and the norm's x never goes through memory (unless it is a graph output
/// or read elsewhere: then the kernel writes it too). Only groups `prologue_unit` generates.
pub fn prologue_groups(graph: &Graph, order: &[usize], target: &Target) -> Vec<Vec<usize>> {
    let mut producer = HashMap::new();
    for (ni, node) in graph.nodes.iter().enumerate() {
        for p in &node.outputs {
            producer.insert(p.tensor.0, ni);
        }
    }
    let rd = graph.consumers();
    let position: HashMap<usize, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let mut taken = std::collections::HashSet::new();
    let mut out = Vec::new();
    for &ni in order {
        if !matches!(graph.nodes[ni].op, Op::Layernorm(_) | Op::Rmsnorm(_)) {
            continue;
        }
        let mut chain = prologue_chain(graph, ni, &producer, &rd);
        if chain.is_empty() || chain.len() > PROLOGUE_MAX_NODES || chain.iter().any(|n| taken.contains(n) || !position.contains_key(n)) {
            continue;
        }
        // The unit runs where the norm would: a node outside the group reading x (which the
        // unit then writes) must come after the norm.
        if let Some(x) = graph.nodes[ni].input("x") {
            if rd.get(&x.0).is_some_and(|r| r.iter().any(|&q| q != ni && position.get(&q).is_none_or(|&pq| pq < position[&ni]))) {
                continue;
            }
        }
        chain.sort_by_key(|n| position[n]);
        chain.push(ni);
        if matches!(prologue_unit(graph, &chain, target), Ok(Some(_))) {
            taken.extend(chain.iter().copied());
            out.push(chain);
        }
    }
    out
}

/// The unit of a group from [`prologue_groups`]: one kernel computing the chain per element of
/// x and normalizing it (the row kernels' lane teams or block per row). None when the group
/// or its tensors do not fit (the nodes then run one by one).
pub fn prologue_unit(graph: &Graph, nodes: &[usize], target: &Target) -> Result<Option<Unit>> {
    let Some((&ni, chain)) = nodes.split_last() else { return Ok(None) };
    let node = &graph.nodes[ni];
    if chain.is_empty() || !matches!(node.op, Op::Layernorm(_) | Op::Rmsnorm(_)) || graph.compute_type(node) == DataType::F64 {
        return Ok(None);
    }
    let Some(x) = node.input("x") else { return Ok(None) };
    let rd = graph.consumers();
    // Every chain tensor but x is read inside the group only, and virtual.
    let mut x_made = false;
    for &p in chain {
        if prologue_formula(graph, p).is_none() {
            return Ok(None);
        }
        let y = graph.nodes[p].outputs[0].tensor;
        if y == x {
            x_made = true;
            continue;
        }
        let inside = rd.get(&y.0).is_some_and(|r| r.iter().all(|n| nodes.contains(n)));
        if !graph.desc(y).is_virtual || !inside {
            return Ok(None);
        }
    }
    if !x_made {
        return Ok(None);
    }
    let write_x = !graph.desc(x).is_virtual || rd.get(&x.0).is_some_and(|r| r.iter().any(|&n| n != ni));
    let (eps, rms) = match &node.op {
        Op::Layernorm(a) => (a.epsilon, false),
        Op::Rmsnorm(a) => (a.epsilon, true),
        _ => return Ok(None),
    };
    let g = Gen { graph, node, ni, sms: target.sm_count.max(1) as i64 };
    let Some(kernels) = g.norm_prologue(chain, x, write_x, eps, rms) else { return Ok(None) };
    let mut writes: Vec<TensorId> = node.outputs.iter().map(|p| p.tensor).collect();
    if write_x {
        writes.push(x);
    }
    Ok(Some(Unit { nodes: nodes.to_vec(), kernels, writes, unaligned: None }))
}

impl Gen<'_> {
    /// layernorm / rmsnorm forward of an x computed per element by `chain` (pointwise nodes in
    /// topological order, the last producing x): the lane-team / block-per-row scheme with the
    /// row in registers; each chain value rounded to its tensor's type as the CPU stores it.
    fn norm_prologue(&self, chain: &[usize], x: TensorId, write_x: bool, eps: f64, rms: bool) -> Option<NodeKernels> {
        let n = self.node;
        let scale = n.input("scale")?;
        let bias = n.input("bias");
        if !rms && bias.is_none() {
            return None;
        }
        let y = n.output("y")?;
        let mean = if rms { None } else { n.output("mean") };
        let inv = n.output("inv_variance");
        let xd = self.dims(x).to_vec();
        if xd.len() < 2 || self.dims(y) != xd.as_slice() {
            return None;
        }
        // External inputs, in order of first use.
        let made: Vec<TensorId> = chain.iter().map(|&p| self.graph.nodes[p].outputs[0].tensor).collect();
        let mut ext: Vec<TensorId> = Vec::new();
        for &p in chain {
            for port in &self.graph.nodes[p].inputs {
                if !made.contains(&port.tensor) && !ext.contains(&port.tensor) {
                    ext.push(port.tensor);
                }
            }
        }
        if chain.len() > PROLOGUE_MAX_NODES || ext.len() > PROLOGUE_MAX_INPUTS || ext.iter().chain(&made).any(|&t| self.dims(t) != xd.as_slice()) {
            return None;
        }
        let rows: i64 = xd[0];
        let h: i64 = xd[1..].iter().product();
        // Vector width from the narrowest loaded type.
        let narrow = ext.iter().map(|&t| self.dt(t)).min_by_key(|d| d.size()).unwrap_or(DataType::F32);
        let v = vec_width(narrow, h);
        let c = h / v;
        let (ts, bs, cpt) = norm_team(h, c, v)?;
        let eps = self.epsilon(eps)?;
        let ets: Vec<RowT> = ext.iter().map(|&t| self.rows(t, 1, v, true)).collect::<Option<_>>()?;
        let yt = self.rows(y, 1, v, true)?;
        let xt = if write_x { Some(self.rows(x, 1, v, true)?) } else { None };
        let (st, bt, mt, it) = self.affine_and_stats(scale, bias, mean, inv, &xd, v)?;
        let mut sig = Signature::new();
        let names: Vec<String> = (0..ets.len()).map(|j| format!("e{j}")).collect();
        let mut vec_tensors: Vec<(&str, &RowT)> = Vec::new();
        for (j, e) in ets.iter().enumerate() {
            sig.ptr(&format!("e{j}p"), e.id, false);
            vec_tensors.push((&names[j], e));
        }
        sig.ptr("scp", scale, false);
        vec_tensors.push(("sc", &st));
        if let Some(b) = &bt {
            sig.ptr("bip", b.id, false);
            vec_tensors.push(("bi", b));
        }
        sig.ptr("yp", y, true);
        vec_tensors.push(("y", &yt));
        if let Some(t) = &xt {
            sig.ptr("hp", x, true);
            vec_tensors.push(("hx", t));
        }
        if let Some(m) = &mt {
            sig.ptr("mop", m.id, true);
        }
        if let Some(i) = &it {
            sig.ptr("ivp", i.id, true);
        }
        sig.attr("eps", eps, false);
        let team = Team { n: rows, h, c, v, cpt, ts, bs };
        let entry = self.entry(if rms { "prologue_rmsnorm_rows" } else { "prologue_layernorm_rows" });
        let mut src = team.source(&entry, &sig, aligned(v, &vec_tensors)).flag("NORM_RMS", rms).flag("NORM_PROLOGUE", true);
        src = src.define("PRO_INPUTS", ets.len()).flag("NORM_WRITE_X", write_x);
        for (j, e) in ets.iter().enumerate() {
            src = tensor(src, &format!("E{j}"), e);
        }
        // The chain per element i: node k's value t<k> as a float, rounded to its tensor's type;
        // an operand is an input's element f<j>[i] or an earlier node's t<k>.
        let name_of = |t: TensorId| -> String {
            match ext.iter().position(|&e| e == t) {
                Some(j) => format!("f{j}[i]"),
                None => format!("t{}", made.iter().position(|&m| m == t).unwrap_or(0)),
            }
        };
        src = src.define("PRO_NODES", chain.len());
        for (k, &p) in chain.iter().enumerate() {
            let node = &self.graph.nodes[p];
            let op = prologue_formula(self.graph, p)?;
            let ty = float_c_type(self.dt(node.outputs[0].tensor))?;
            let (a, b) = (name_of(node.input("a")?), name_of(node.input("b")?));
            src = src.define(&format!("PRO_T{k}"), format!("fr_q<{ty}>({a} {op} {b})"));
        }
        src = src.define("PRO_X", format!("t{}", made.iter().position(|&m| m == x)?));
        if let Some(t) = &xt {
            src = tensor(src, "X", t);
        }
        src = tensor(tensor(src, "Y", &yt), "SC", &st).flag("NORM_BIAS", bt.is_some());
        if let Some(b) = &bt {
            src = tensor(src, "BI", b);
        }
        let source = stats(src, mt.as_ref(), it.as_ref()).template(ROWS_CUH).template(NORM_ROWS_CUH).build();
        Some(NodeKernels::one(team.launch(source, entry, sig)))
    }
}
