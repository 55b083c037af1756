//! Normalizations. As on the CPU, every normalization is "statistics over groups of x's
//! elements, then an affine map": a group is the set of elements of x that share one index of
//! a smaller shape of the same rank (the statistics' dims, or scale's dims for dscale/dbias),
//! i.e. the axes where that shape is 1 are reduced. A kernel gets the reduced axes as a bit
//! mask, the group count `G` and the group size `M`, and runs one 256-thread block per group
//! (grid-stride over groups) with a shared-memory tree reduction: deterministic, no atomics.
//!
//! - Forward ops (layernorm, rmsnorm, instancenorm, adalayernorm, batchnorm): one launch; each
//!   block computes its group's mean and inverse deviation (two passes, as the CPU), writes the
//!   statistics outputs when the op has them, then `y` for its members, using the statistics in
//!   double (the CPU does not round them to the stats type before applying).
//! - Backward ops: one launch per statistics group (sums of `dy * scale` and of
//!   `dy * scale * xhat`, then `dx` for its members) and one launch per element of `scale`
//!   (sums of `dy * xhat` and `dy` into `dscale` and `dbias`).
//! - genstats: one block per channel; batchnorm_inference and bn_finalize: elementwise.

use super::{c_double, Arg, Ctx, Grid, Launch, NodeKernels, Pdl};
use crate::error::Result;
use crate::graph::ops::norm::*;
use crate::graph::TensorId;

/// Threads per block of the group kernels (a power of two: the tree reduction halves it).
const NB: u32 = 256;

/// Device helpers of the group kernels.
const HELPERS: &str = r#"
#define NB 256
// Sum of `v` over the block (blockDim.x == NB), in a fixed order; every thread gets it.
__device__ __forceinline__ double block_sum(double v, double* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = NB / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}
// The multi-index of member `m` of group `g`: axes whose bit is set in `mask` are reduced
// (indexed by m, row-major), the others are the group's (indexed by g, row-major).
__device__ __forceinline__ void norm_index(const TRef& t, long long mask, i64 g, i64 m, i64* idx) {
    for (int a = t.rank - 1; a >= 0; --a) {
        i64 d = t.dims[a] > 0 ? t.dims[a] : 1;
        if ((mask >> a) & 1) { idx[a] = m % d; m /= d; }
        else { idx[a] = g % d; g /= d; }
    }
}
"#;

/// A kernel's parameter list and the matching launch arguments, built together.
#[derive(Default)]
struct Sig {
    params: Vec<String>,
    args: Vec<Arg>,
}

impl Sig {
    fn tensor(&mut self, name: &str, id: TensorId, write: bool) {
        let c = if write { "" } else { "const " };
        self.params.push(format!("{c}void* {name}"));
        self.params.push(format!("TRef t{name}"));
        self.args.push(Arg::Ptr(id));
        self.args.push(Arg::Ref(id));
    }
    fn input(&mut self, name: &str, id: TensorId) {
        self.tensor(name, id, false)
    }
    fn output(&mut self, name: &str, id: TensorId) {
        self.tensor(name, id, true)
    }
    fn int(&mut self, name: &str, v: i64) {
        self.params.push(format!("long long {name}"));
        self.args.push(Arg::I64(v));
    }
    fn list(&self) -> String {
        self.params.join(", ")
    }
}

/// Reduced-axes mask (bit a set where `target` is 1), group count and group size of x's
/// elements grouped by `target` (same rank as x, each dim x's or 1).
fn grouping(x: &[i64], target: &[i64]) -> (i64, i64, i64) {
    let mut mask = 0i64;
    let (mut groups, mut members) = (1i64, 1i64);
    for (a, &d) in x.iter().enumerate() {
        let d = d.max(0);
        if target.get(a).copied().unwrap_or(1) == 1 {
            mask |= 1 << a;
            members = members.saturating_mul(d);
        } else {
            groups = groups.saturating_mul(d);
        }
    }
    (mask, groups, members)
}

/// A launch of one `NB`-thread block per group (grid-stride over groups beyond the cap).
fn group_launch(source: String, entry: &str, groups: i64, sig: Sig) -> Launch {
    let blocks = groups.clamp(1, 65535) as u32;
    Launch { source, entry: entry.to_string(), grid: Grid::Exact(blocks, 1, 1), block: NB, shared_bytes: 0, args: sig.args, cluster: None, pdl: Pdl::Dependent }
}

/// Forward of layernorm, rmsnorm (`rms`), instancenorm, adalayernorm: statistics per group,
/// then `y`, in one launch.
fn norm_forward(ctx: &Ctx, attrs: &NormAttrs, axes: NormAxes, rms: bool) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let scale = ctx.input("scale")?;
    let bias = ctx.node.input("bias");
    let y = ctx.output("y")?;
    let mean = if rms { None } else { ctx.node.output("mean") };
    let inv = ctx.node.output("inv_variance");
    let xd = ctx.dims(x);
    let (mask, groups, members) = grouping(&xd, &axes.stats_dims(&xd));
    let entry = ctx.entry(if rms { "rmsnorm" } else { "norm_fwd" });

    let mut sig = Sig::default();
    sig.input("x", x);
    sig.input("sc", scale);
    let mut bias_term = "0.0".to_string();
    if let Some(b) = bias {
        sig.input("bi", b);
        bias_term = format!("{}(bi, bcast_offset(tbi, idx, tx.rank))", ctx.ld(b));
    }
    sig.output("y", y);
    let mut write_stats = String::new();
    if let Some(m) = mean {
        sig.output("mo", m);
        write_stats += &format!("            {}(mo, bcast_offset(tmo, idx, tx.rank), mean);\n", ctx.st(m));
    }
    if let Some(v) = inv {
        sig.output("iv", v);
        write_stats += &format!("            {}(iv, bcast_offset(tiv, idx, tx.rank), inv);\n", ctx.st(v));
    }
    sig.int("mask", mask);
    sig.int("G", groups);
    sig.int("M", members);
    let ldx = ctx.ld(x);
    let mean_pass = if rms {
        String::new()
    } else {
        format!(
            r#"        double s = 0.0;
        for (i64 m = threadIdx.x; m < M; m += blockDim.x) {{
            norm_index(tx, mask, g, m, idx);
            s += {ldx}(x, offset_at(tx, idx));
        }}
        s = block_sum(s, sh);
        mean = M > 0 ? s / (double)M : 0.0;
"#
        )
    };
    let source = format!(
        r#"{HELPERS}
extern "C" __global__ void {entry}({params}) {{
    __shared__ double sh[NB];
    for (i64 g = blockIdx.x; g < G; g += gridDim.x) {{
        i64 idx[8];
        double mean = 0.0;
{mean_pass}        double q = 0.0;
        for (i64 m = threadIdx.x; m < M; m += blockDim.x) {{
            norm_index(tx, mask, g, m, idx);
            double d = {ldx}(x, offset_at(tx, idx)) - mean;
            q += d * d;
        }}
        q = block_sum(q, sh);
        double var = M > 0 ? q / (double)M : 0.0;
        double inv = 1.0 / sqrt(var + {eps});
        if (threadIdx.x == 0) {{
            norm_index(tx, mask, g, 0, idx);
{write_stats}        }}
        for (i64 m = threadIdx.x; m < M; m += blockDim.x) {{
            norm_index(tx, mask, g, m, idx);
            double v = ({ldx}(x, offset_at(tx, idx)) - mean) * inv * {lds}(sc, bcast_offset(tsc, idx, tx.rank)) + {bias_term};
            {sty}(y, offset_at(ty, idx), v);
        }}
    }}
}}
"#,
        params = sig.list(),
        eps = c_double(attrs.epsilon),
        lds = ctx.ld(scale),
        sty = ctx.st(y),
    );
    Ok(NodeKernels::one(group_launch(source, &entry, groups, sig)))
}

/// Backward of layernorm, rmsnorm (`rms`: no mean), instancenorm, adalayernorm, batchnorm.
/// With `xhat = (x - mean) * inv` and `g = dy * scale` over the n elements of a statistics
/// group: `dx = inv * (g - mean(g) - xhat * mean(g * xhat))` (rmsnorm drops `mean(g)`);
/// `dscale = sum(dy * xhat)`, `dbias = sum(dy)` over the elements sharing a scale value.
fn norm_backward(ctx: &Ctx, axes: NormAxes, rms: bool) -> Result<NodeKernels> {
    let dy = ctx.input("dy")?;
    let x = ctx.input("x")?;
    let scale = ctx.input("scale")?;
    let mean = if rms { None } else { Some(ctx.input("mean")?) };
    let inv = ctx.input("inv_variance")?;
    let dx = ctx.output("dx")?;
    let dscale = ctx.output("dscale")?;
    let dbias = ctx.node.output("dbias");
    let xd = ctx.dims(x);
    let (ldy, ldx, lds, ldi) = (ctx.ld(dy), ctx.ld(x), ctx.ld(scale), ctx.ld(inv));
    let load_mean = match mean {
        Some(m) => format!("{}(mn, bcast_offset(tmn, idx, tx.rank))", ctx.ld(m)),
        None => "0.0".into(),
    };
    let common = |sig: &mut Sig| {
        sig.input("dy", dy);
        sig.input("x", x);
        if let Some(m) = mean {
            sig.input("mn", m);
        }
        sig.input("iv", inv);
    };

    // dx: one block per statistics group.
    let (mask, groups, members) = grouping(&xd, &axes.stats_dims(&xd));
    let entry1 = ctx.entry("norm_bwd_dx");
    let mut sig1 = Sig::default();
    common(&mut sig1);
    sig1.input("sc", scale);
    sig1.output("dx", dx);
    sig1.int("mask", mask);
    sig1.int("G", groups);
    sig1.int("M", members);
    let mean_grad = if rms { "0.0" } else { "sg / n" };
    let source1 = format!(
        r#"{HELPERS}
extern "C" __global__ void {entry1}({params}) {{
    __shared__ double sh[NB];
    for (i64 g = blockIdx.x; g < G; g += gridDim.x) {{
        i64 idx[8];
        norm_index(tx, mask, g, 0, idx);
        double mean = {load_mean};
        double r = {ldi}(iv, bcast_offset(tiv, idx, tx.rank));
        double sg = 0.0, sgx = 0.0;
        for (i64 m = threadIdx.x; m < M; m += blockDim.x) {{
            norm_index(tx, mask, g, m, idx);
            double gi = {ldy}(dy, offset_at(tdy, idx)) * {lds}(sc, bcast_offset(tsc, idx, tx.rank));
            double xhat = ({ldx}(x, offset_at(tx, idx)) - mean) * r;
            sg += gi;
            sgx += gi * xhat;
        }}
        sg = block_sum(sg, sh);
        sgx = block_sum(sgx, sh);
        double n = M > 1 ? (double)M : 1.0;
        double mg = {mean_grad};
        double mgx = sgx / n;
        for (i64 m = threadIdx.x; m < M; m += blockDim.x) {{
            norm_index(tx, mask, g, m, idx);
            double gi = {ldy}(dy, offset_at(tdy, idx)) * {lds}(sc, bcast_offset(tsc, idx, tx.rank));
            double xhat = ({ldx}(x, offset_at(tx, idx)) - mean) * r;
            {stdx}(dx, offset_at(tdx, idx), r * (gi - mg - xhat * mgx));
        }}
    }}
}}
"#,
        params = sig1.list(),
        stdx = ctx.st(dx),
    );

    // dscale, dbias: one block per element of scale.
    let (pmask, pgroups, pmembers) = grouping(&xd, &ctx.dims(scale));
    let entry2 = ctx.entry("norm_bwd_dscale");
    let mut sig2 = Sig::default();
    common(&mut sig2);
    sig2.output("ds", dscale);
    let mut write = format!("            {}(ds, bcast_offset(tds, idx, tx.rank), a);\n", ctx.st(dscale));
    if let Some(b) = dbias {
        sig2.output("db", b);
        write += &format!("            {}(db, bcast_offset(tdb, idx, tx.rank), b);\n", ctx.st(b));
    }
    sig2.int("mask", pmask);
    sig2.int("G", pgroups);
    sig2.int("M", pmembers);
    let source2 = format!(
        r#"{HELPERS}
extern "C" __global__ void {entry2}({params}) {{
    __shared__ double sh[NB];
    for (i64 g = blockIdx.x; g < G; g += gridDim.x) {{
        i64 idx[8];
        double a = 0.0, b = 0.0;
        for (i64 m = threadIdx.x; m < M; m += blockDim.x) {{
            norm_index(tx, mask, g, m, idx);
            double mean = {load_mean};
            double r = {ldi}(iv, bcast_offset(tiv, idx, tx.rank));
            double d = {ldy}(dy, offset_at(tdy, idx));
            a += d * (({ldx}(x, offset_at(tx, idx)) - mean) * r);
            b += d;
        }}
        a = block_sum(a, sh);
        b = block_sum(b, sh);
        (void)b;
        if (threadIdx.x == 0) {{
            norm_index(tx, mask, g, 0, idx);
{write}        }}
    }}
}}
"#,
        params = sig2.list(),
    );
    Ok(NodeKernels { launches: vec![group_launch(source1, &entry1, groups, sig1), group_launch(source2, &entry2, pgroups, sig2)], scratch: Vec::new() })
}

pub(super) fn batchnorm(ctx: &Ctx, a: &BatchnormAttrs) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let scale = ctx.input("scale")?;
    let bias = ctx.input("bias")?;
    let y = ctx.output("y")?;
    let mean = ctx.output("mean")?;
    let inv = ctx.output("inv_variance")?;
    let running = match (ctx.node.input("in_running_mean"), ctx.node.input("in_running_var")) {
        (Some(m), Some(v)) => Some((m, v, ctx.output("out_running_mean")?, ctx.output("out_running_var")?)),
        (None, None) => None,
        _ => return Err(ctx.err("give both in_running_mean and in_running_var or neither")),
    };
    let peers = peer_ports(ctx.node).map_err(|m| ctx.err(m))?;
    let xd = ctx.dims(x);
    let (mask, groups, members) = grouping(&xd, &NormAxes::Batch.stats_dims(&xd));
    let entry = ctx.entry("batchnorm");

    let mut sig = Sig::default();
    sig.input("x", x);
    sig.input("sc", scale);
    sig.input("bi", bias);
    sig.output("y", y);
    sig.output("mo", mean);
    sig.output("iv", inv);
    // Each peer's (mean, M2) from its (sum, sum of squares) over as many elements as x's.
    let mut peer_code = String::new();
    let mut means = "0.0 + lmean".to_string();
    let mut m2s = "0.0 + (lm2 + nl * (lmean - mu) * (lmean - mu))".to_string();
    for (k, &(_, p)) in peers.iter().enumerate() {
        sig.input(&format!("p{k}"), p);
        peer_code += &format!(
            "        double ps{k} = {ld}(p{k}, g * tp{k}.strides[1]);\n        double pq{k} = {ld}(p{k}, tp{k}.strides[0] + g * tp{k}.strides[1]);\n        double pmean{k} = ps{k} / nl;\n        double pm2{k} = pq{k} - ps{k} * ps{k} / nl;\n",
            ld = ctx.ld(p)
        );
        means += &format!(" + pmean{k}");
        m2s += &format!(" + (pm2{k} + nl * (pmean{k} - mu) * (pmean{k} - mu))");
    }
    let mut running_code = String::new();
    if let Some((rm, rv, orm, orv)) = running {
        sig.input("rm", rm);
        sig.input("rv", rv);
        sig.output("orm", orm);
        sig.output("orv", orv);
        let mo = c_double(a.momentum);
        running_code = format!(
            r#"            double unbias = total / (total - 1.0);
            {storm}(orm, bcast_offset(torm, idx, tx.rank), (1.0 - {mo}) * {ldrm}(rm, bcast_offset(trm, idx, tx.rank)) + {mo} * mu);
            {storv}(orv, bcast_offset(torv, idx, tx.rank), (1.0 - {mo}) * {ldrv}(rv, bcast_offset(trv, idx, tx.rank)) + {mo} * var * unbias);
"#,
            storm = ctx.st(orm),
            storv = ctx.st(orv),
            ldrm = ctx.ld(rm),
            ldrv = ctx.ld(rv),
        );
    }
    sig.int("mask", mask);
    sig.int("G", groups);
    sig.int("M", members);
    let ldx = ctx.ld(x);
    let parts = peers.len() + 1;
    let source = format!(
        r#"{HELPERS}
extern "C" __global__ void {entry}({params}) {{
    __shared__ double sh[NB];
    for (i64 g = blockIdx.x; g < G; g += gridDim.x) {{
        i64 idx[8];
        double s = 0.0;
        for (i64 m = threadIdx.x; m < M; m += blockDim.x) {{
            norm_index(tx, mask, g, m, idx);
            s += {ldx}(x, offset_at(tx, idx));
        }}
        s = block_sum(s, sh);
        double lmean = M > 0 ? s / (double)M : 0.0;
        double q = 0.0;
        for (i64 m = threadIdx.x; m < M; m += blockDim.x) {{
            norm_index(tx, mask, g, m, idx);
            double d = {ldx}(x, offset_at(tx, idx)) - lmean;
            q += d * d;
        }}
        q = block_sum(q, sh);
        double nl = (double)M;
        double lm2 = M > 0 ? (q / nl) * nl : 0.0;
{peer_code}        double total = nl * {parts}.0;
        double mu = ({means}) / {parts}.0;
        double m2 = {m2s};
        double var = fmax(m2 / total, 0.0);
        double inv = 1.0 / sqrt(var + {eps});
        if (threadIdx.x == 0) {{
            norm_index(tx, mask, g, 0, idx);
            {stm}(mo, bcast_offset(tmo, idx, tx.rank), mu);
            {sti}(iv, bcast_offset(tiv, idx, tx.rank), inv);
{running_code}        }}
        for (i64 m = threadIdx.x; m < M; m += blockDim.x) {{
            norm_index(tx, mask, g, m, idx);
            double v = ({ldx}(x, offset_at(tx, idx)) - mu) * inv * {lds}(sc, bcast_offset(tsc, idx, tx.rank)) + {ldb}(bi, bcast_offset(tbi, idx, tx.rank));
            {sty}(y, offset_at(ty, idx), v);
        }}
    }}
}}
"#,
        params = sig.list(),
        eps = c_double(a.epsilon),
        stm = ctx.st(mean),
        sti = ctx.st(inv),
        lds = ctx.ld(scale),
        ldb = ctx.ld(bias),
        sty = ctx.st(y),
    );
    Ok(NodeKernels::one(group_launch(source, &entry, groups, sig)))
}

pub(super) fn batchnorm_inference(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let y = ctx.output("y")?;
    let entry = ctx.entry("bn_infer");
    let mut sig = Sig::default();
    sig.input("x", x);
    sig.output("y", y);
    let mut loads = String::new();
    for (name, port) in [("sc", "scale"), ("bi", "bias"), ("mn", "mean"), ("iv", "inv_variance")] {
        let t = ctx.input(port)?;
        sig.input(name, t);
        loads += &format!("        double {name}_v = {}({name}, bcast_offset(t{name}, idx, tx.rank));\n", ctx.ld(t));
    }
    let source = format!(
        r#"
extern "C" __global__ void {entry}({params}) {{
    i64 n = numel(tx);
    GRID_STRIDE(i, n) {{
        i64 idx[8];
        unravel(tx, i, idx);
{loads}        double v = ({ldx}(x, offset_at(tx, idx)) - mn_v) * iv_v * sc_v + bi_v;
        {sty}(y, offset_at(ty, idx), v);
    }}
}}
"#,
        params = sig.list(),
        ldx = ctx.ld(x),
        sty = ctx.st(y),
    );
    Ok(NodeKernels::one(Launch::elementwise(source, &entry, ctx.numel(x), sig.args)))
}

pub(super) fn batchnorm_backward(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> {
    norm_backward(ctx, NormAxes::Batch, false)
}

pub(super) fn genstats(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let sum = ctx.output("sum")?;
    let sq = ctx.output("sq_sum")?;
    let xd = ctx.dims(x);
    let (mask, groups, members) = grouping(&xd, &NormAxes::Batch.stats_dims(&xd));
    let entry = ctx.entry("genstats");
    let mut sig = Sig::default();
    sig.input("x", x);
    sig.output("su", sum);
    sig.output("sq", sq);
    sig.int("mask", mask);
    sig.int("G", groups);
    sig.int("M", members);
    let source = format!(
        r#"{HELPERS}
extern "C" __global__ void {entry}({params}) {{
    __shared__ double sh[NB];
    for (i64 g = blockIdx.x; g < G; g += gridDim.x) {{
        i64 idx[8];
        double s = 0.0, q = 0.0;
        for (i64 m = threadIdx.x; m < M; m += blockDim.x) {{
            norm_index(tx, mask, g, m, idx);
            double v = {ldx}(x, offset_at(tx, idx));
            s += v;
            q += v * v;
        }}
        s = block_sum(s, sh);
        q = block_sum(q, sh);
        if (threadIdx.x == 0) {{
            norm_index(tx, mask, g, 0, idx);
            {sts}(su, bcast_offset(tsu, idx, tx.rank), s);
            {stq}(sq, bcast_offset(tsq, idx, tx.rank), q);
        }}
    }}
}}
"#,
        params = sig.list(),
        ldx = ctx.ld(x),
        sts = ctx.st(sum),
        stq = ctx.st(sq),
    );
    Ok(NodeKernels::one(group_launch(source, &entry, groups, sig)))
}

pub(super) fn bn_finalize(ctx: &Ctx, a: &BnFinalizeAttrs) -> Result<NodeKernels> {
    let sum = ctx.input("sum")?;
    let entry = ctx.entry("bn_finalize");
    let mut sig = Sig::default();
    let mut loads = String::new();
    for (name, port) in [("su", "sum"), ("sq", "sq_sum"), ("sc", "scale"), ("bi", "bias")] {
        let t = ctx.input(port)?;
        sig.input(name, t);
        loads += &format!("        double {name}_v = {}({name}, offset_at(t{name}, idx));\n", ctx.ld(t));
    }
    let mut stores = String::new();
    for (name, port, value) in [("es", "eq_scale", "eq_scale"), ("eb", "eq_bias", "mean_v_bias"), ("sm", "saved_mean", "mean"), ("si", "saved_inv_std", "inv")] {
        let t = ctx.output(port)?;
        sig.output(name, t);
        let value = if value == "mean_v_bias" { "bi_v - mean * eq_scale" } else { value };
        stores += &format!("        {}({name}, offset_at(t{name}, idx), {value});\n", ctx.st(t));
    }
    match (ctx.node.input("prev_running_mean"), ctx.node.input("prev_running_var")) {
        (Some(rm), Some(rv)) => {
            let (nrm, nrv) = (ctx.output("next_running_mean")?, ctx.output("next_running_var")?);
            sig.input("rm", rm);
            sig.input("rv", rv);
            sig.output("nrm", nrm);
            sig.output("nrv", nrv);
            let mo = c_double(a.momentum);
            stores += &format!(
                "        double unbias = count / (count - 1.0);\n        {}(nrm, offset_at(tnrm, idx), (1.0 - {mo}) * {}(rm, offset_at(trm, idx)) + {mo} * mean);\n        {}(nrv, offset_at(tnrv, idx), (1.0 - {mo}) * {}(rv, offset_at(trv, idx)) + {mo} * var * unbias);\n",
                ctx.st(nrm),
                ctx.ld(rm),
                ctx.st(nrv),
                ctx.ld(rv)
            );
        }
        (None, None) => {}
        _ => return Err(ctx.err("give both prev_running_mean and prev_running_var or neither")),
    }
    // Every tensor has sum's dims: element i is the same logical index in each.
    let source = format!(
        r#"
extern "C" __global__ void {entry}({params}) {{
    i64 n = numel(tsu);
    const double count = {count};
    GRID_STRIDE(i, n) {{
        i64 idx[8];
        unravel(tsu, i, idx);
{loads}        double mean = su_v / count;
        double var = fmax(sq_v / count - mean * mean, 0.0);
        double inv = 1.0 / sqrt(var + {eps});
        double eq_scale = sc_v * inv;
{stores}    }}
}}
"#,
        params = sig.list(),
        count = c_double(a.accum_count as f64),
        eps = c_double(a.epsilon),
    );
    Ok(NodeKernels::one(Launch::elementwise(source, &entry, ctx.numel(sum), sig.args)))
}

pub(super) fn layernorm(ctx: &Ctx, a: &NormAttrs) -> Result<NodeKernels> {
    norm_forward(ctx, a, NormAxes::Layer, false)
}
pub(super) fn layernorm_backward(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> {
    norm_backward(ctx, NormAxes::Layer, false)
}
pub(super) fn rmsnorm(ctx: &Ctx, a: &NormAttrs) -> Result<NodeKernels> {
    norm_forward(ctx, a, NormAxes::Layer, true)
}
pub(super) fn rmsnorm_backward(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> {
    norm_backward(ctx, NormAxes::Layer, true)
}
pub(super) fn instancenorm(ctx: &Ctx, a: &NormAttrs) -> Result<NodeKernels> {
    norm_forward(ctx, a, NormAxes::Instance, false)
}
pub(super) fn instancenorm_backward(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> {
    norm_backward(ctx, NormAxes::Instance, false)
}
pub(super) fn adalayernorm(ctx: &Ctx, a: &NormAttrs) -> Result<NodeKernels> {
    norm_forward(ctx, a, NormAxes::AdaLayer, false)
}
pub(super) fn adalayernorm_backward(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> {
    norm_backward(ctx, NormAxes::AdaLayer, false)
}
