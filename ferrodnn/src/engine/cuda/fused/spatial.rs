//! Fast batchnorm (training forward) and 2D pooling (forward) kernels for channels-last
//! (NHWC-packed) tensors; below them (sections "Channel statistics" and "Pooling backward"):
//! batchnorm backward (NHWC and NCHW), batchnorm training forward and genstats on NCHW
//! (planes), instancenorm forward and backward on NHWC (statistics per image and channel),
//! bn_finalize, and NHWC 2D max and average pooling backward. All statistics are deterministic
//! (per-block partials to scratch, summed in f64 in a fixed order by a finalize launch).
//!
//! Both see x as rows of C contiguous channels (one row per position) and move 16 bytes of
//! channels at a time (8 f16/bf16 or 4 f32: a "vector"); C times the element size must be a
//! multiple of 16 so every row starts 16-byte aligned. The buffers' base alignment is unknown at
//! plan time: each kernel checks it and takes an element-wise path when a base is not aligned.
//!
//! Batchnorm (no peers), three launches:
//! 1. statistics: block b covers a slab of positions for all channels; its threads hold the
//!    running sums of `x - K` and `(x - K)^2` (K: the channel's value at position 0, a shift
//!    that keeps the f32 sums well conditioned) for one vector of channels, reduce them over
//!    the block in a fixed order and write per-block partials to scratch `[2][B][C]`;
//! 2. finalize: per channel, the partials summed in f64 in a fixed order; writes mean,
//!    inv_variance, the running statistics (unbiased variance), and the f32 coefficients of
//!    the apply step to scratch;
//! 3. apply: the same slabs (walked backwards, so the rows launch 1 read last, likely still in
//!    L2, come first), `y = (x - mean) * (inv * scale) + bias`.
//!
//! Pooling, three kernels, the first that takes the shape: strips (windows overlapping along
//! h: a block streams its input rows once through a shared-memory ring with `cp.async` and
//! slides its output rows down them, see `pool_strip`), tiles (a thread computes a small
//! tile of outputs, see `pool_tiled`), and one thread per output vector (n, p, q, 8
//! channels) for big windows. Max with the CPU's NaN rule (a NaN wins), averages summed in
//! f32 with the CPU's divisors.
use crate::dtype::DataType;
use crate::engine::cuda::kernel::ctype::c_double;
use crate::engine::cuda::kernel::{entry_name, Arg, Grid, Launch, NodeKernels, Pdl, Target, Unit};
use crate::error::Result;
use crate::graph::ops::norm::{peer_ports, BatchnormAttrs, BnFinalizeAttrs};
use crate::graph::ops::resample::{ResampleAttrs, ResampleMode};
use crate::graph::ops::Op;
use crate::graph::{Graph, Node, TensorId};

/// Blocks per SM the batchnorm launches aim for: 4 blocks of ~256 threads per SM (of the
/// target's SM count), one wave; every thread keeps several 16-byte loads in flight.
const BN_BLOCKS_PER_SM: i64 = 4;
/// Threads per batchnorm block (rounded down to a multiple of the vectors per row).
const BN_THREADS: i64 = 256;
/// Loads in flight per thread in the batchnorm loops.
const UNROLL: i64 = 4;
/// Threads per pooling block.
const POOL_THREADS: u32 = 256;

/// A specialized unit for node `ni`, or None when no fast kernel applies.
pub fn unit(graph: &Graph, ni: usize, target: &Target) -> Result<Option<Unit>> {
    let node = &graph.nodes[ni];
    let sms = target.sm_count.max(1) as i64;
    let kernels = match &node.op {
        Op::Batchnorm(a) => batchnorm(graph, ni, node, a, sms).or_else(|| batchnorm_nchw(graph, ni, node, a, sms)),
        Op::Resample(a) => pooling(graph, ni, node, a, sms, target.pdl && target.hopper()),
        Op::BatchnormInference(_) => bn_inference(graph, ni, node, sms),
        Op::Genstats(_) => genstats(graph, ni, node, sms).or_else(|| genstats_nchw(graph, ni, node, sms)),
        Op::BatchnormBackward(_) => norm_backward(graph, ni, node, false, sms),
        Op::InstancenormBackward(_) => norm_backward(graph, ni, node, true, sms),
        Op::Instancenorm(a) => instancenorm_nhwc(graph, ni, node, a.epsilon, sms),
        Op::BnFinalize(a) => bn_finalize(graph, ni, node, a),
        Op::ResampleBackward(a) => pooling_backward(graph, ni, node, a, sms),
        _ => None,
    };
    Ok(kernels.map(|kernels| Unit { nodes: vec![ni], kernels, writes: node.outputs.iter().map(|p| p.tensor).collect(), unaligned: None }))
}

/// `a / b` rounded up, for positive `a` and `b`.
fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

/// The C type of a vectorizable element type.
fn c_type(dt: DataType) -> Option<&'static str> {
    match dt {
        DataType::F16 => Some("__half"),
        DataType::Bf16 => Some("__nv_bfloat16"),
        DataType::F32 => Some("float"),
        _ => None,
    }
}

/// The suffix of a type's `ld_`/`st_` functions in the prelude: the type's own name.
fn dtype_name(dt: DataType) -> &'static str {
    dt.name()
}

fn dtype(graph: &Graph, id: TensorId) -> DataType {
    graph.resolved_data_type(id).unwrap_or(DataType::F32)
}

/// Whether `dims`/`strides` are channels-last packed: axis 1 (C) has stride 1 and the other
/// axes, ordered by stride, are packed outside it. With `exact` they must be in the order
/// N, spatial... (NHWC); otherwise any order of the non-channel axes is fine. Axes of size 1
/// may have any stride.
fn channels_last(dims: &[i64], strides: &[i64], exact: bool) -> bool {
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

/// Device helpers for x of type `xt` (16-byte vectors of `VEC` elements) and y of type `yt`.
/// Defines XT, YT, VEC, x2f, f2y, ldx_raw (16 bytes of x, aligned or element-wise), cvt_x
/// (16 bytes to VEC floats) and st_y (VEC floats to y, vector store when aligned).
fn vec_helpers(xt: DataType, yt: DataType) -> Option<String> {
    let (xc, yc) = (c_type(xt)?, c_type(yt)?);
    let vec = 16 / xt.size();
    let cvt = match xt {
        DataType::F16 => "    const __half2* h = (const __half2*)&u;\n#pragma unroll\n    for (int k = 0; k < 4; ++k) { float2 t = __half22float2(h[k]); f[2 * k] = t.x; f[2 * k + 1] = t.y; }\n",
        DataType::Bf16 => "    const __nv_bfloat162* h = (const __nv_bfloat162*)&u;\n#pragma unroll\n    for (int k = 0; k < 4; ++k) { float2 t = __bfloat1622float2(h[k]); f[2 * k] = t.x; f[2 * k + 1] = t.y; }\n",
        _ => "    f[0] = __uint_as_float(u.x); f[1] = __uint_as_float(u.y); f[2] = __uint_as_float(u.z); f[3] = __uint_as_float(u.w);\n",
    };
    let x2f = match xt {
        DataType::F16 => "__half2float(v)",
        DataType::Bf16 => "__bfloat162float(v)",
        _ => "v",
    };
    let f2y = match yt {
        DataType::F16 => "__float2half_rn(v)",
        DataType::Bf16 => "__float2bfloat16_rn(v)",
        _ => "v",
    };
    // 32-bit words of VEC elements of y.
    let words = vec * yt.size() / 4;
    let pack = match yt {
        DataType::F16 => "    for (int k = 0; k < VEC / 2; ++k) { __half2 h = __floats2half2_rn(f[2 * k], f[2 * k + 1]); w[k] = *(const unsigned int*)&h; }\n",
        DataType::Bf16 => "    for (int k = 0; k < VEC / 2; ++k) { __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]); w[k] = *(const unsigned int*)&h; }\n",
        _ => "    for (int k = 0; k < VEC; ++k) w[k] = __float_as_uint(f[k]);\n",
    };
    let store = match words {
        2 => "        *(uint2*)p = make_uint2(w[0], w[1]);\n",
        4 => "        *(uint4*)p = make_uint4(w[0], w[1], w[2], w[3]);\n",
        _ => "        ((uint4*)p)[0] = make_uint4(w[0], w[1], w[2], w[3]);\n        ((uint4*)p)[1] = make_uint4(w[4], w[5], w[6], w[7]);\n",
    };
    Some(format!(
        r#"
typedef {xc} XT;
typedef {yc} YT;
#define VEC {vec}
// Bytes of VEC elements of y (the alignment its vector stores need).
#define YVB {yvb}
// The alignment a y base needs for those stores (16-byte stores at most).
#define YAL {yal}
__device__ __forceinline__ float x2f(XT v) {{ return {x2f}; }}
__device__ __forceinline__ YT f2y(float v) {{ return {f2y}; }}
__device__ __forceinline__ uint4 ldx_raw(const XT* p, bool al) {{
    if (al) return *(const uint4*)p;
    uint4 u;
    XT* e = (XT*)&u;
#pragma unroll
    for (int k = 0; k < VEC; ++k) e[k] = p[k];
    return u;
}}
__device__ __forceinline__ void cvt_x(uint4 u, float* f) {{
{cvt}}}
__device__ __forceinline__ void st_y(YT* p, bool al, const float* f) {{
    if (al) {{
        unsigned int w[{words}];
#pragma unroll
{pack}{store}    }} else {{
#pragma unroll
        for (int k = 0; k < VEC; ++k) p[k] = f2y(f[k]);
    }}
}}
"#,
        yvb = vec * yt.size(),
        yal = (vec * yt.size()).min(16),
    ))
}

/// The slabs of positions the NHWC statistics pass (and the batchnorm apply pass) walk.
struct StatsGeom {
    c: i64,
    cv: i64,
    lanes: i64,
    rows: i64,
    block: i64,
    positions: i64,
    slab: i64,
    blocks: i64,
}

impl StatsGeom {
    fn new(c: i64, vec: i64, positions: i64, sms: i64) -> StatsGeom {
        let cv = c / vec;
        let lanes = cv.min(BN_THREADS);
        let rows = (BN_THREADS / lanes).max(1);
        let block = lanes * rows;
        let want = (sms * BN_BLOCKS_PER_SM).min(ceil_div(positions, rows * UNROLL)).max(1);
        let slab = ceil_div(positions, want);
        let blocks = ceil_div(positions, slab);
        StatsGeom { c, cv, lanes, rows, block, positions, slab, blocks }
    }

    fn defs(&self, helpers: &str) -> String {
        let StatsGeom { c, cv, lanes, rows, block, positions, slab, blocks } = self;
        format!(
            r#"{helpers}
#define C_ {c}LL
#define CV {cv}
#define LANES {lanes}
#define ROWS {rows}
#define BLOCK {block}
#define P_ {positions}LL
#define SLAB {slab}LL
#define NBLK {blocks}
#define UNR {UNROLL}
"#
        )
    }
}

/// The statistics pass: per-block partial sums of `x - K` and `(x - K)^2` (K: the channel's
/// value at position 0) to scratch `part[2][NBLK][C]`.
fn stats_source(defs: &str, stats_entry: &str) -> String {
    format!(
        r#"{defs}
extern "C" __global__ void __launch_bounds__(BLOCK, 4) {stats_entry}(const void* xv, float* part) {{
    const XT* x = (const XT*)xv;
    const bool al = ((unsigned long long)x & 15) == 0;
    const int lane = threadIdx.x % LANES, r = threadIdx.x / LANES;
    const i64 p0 = (i64)blockIdx.x * SLAB;
    const i64 p1 = min(p0 + SLAB, P_);
    __shared__ float sh[2][ROWS][LANES][VEC];
    for (int v0 = 0; v0 < CV; v0 += LANES) {{
        const int v = v0 + lane;
        float s[VEC], q[VEC], K[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {{ s[k] = 0.f; q[k] = 0.f; K[k] = 0.f; }}
        if (v < CV) {{
            cvt_x(ldx_raw(x + (i64)v * VEC, al), K);
            for (i64 p = p0 + r; p < p1; p += (i64)ROWS * UNR) {{
                uint4 u[UNR];
#pragma unroll
                for (int j = 0; j < UNR; ++j) {{
                    const i64 pj = p + (i64)j * ROWS;
                    if (pj < p1) u[j] = ldx_raw(x + pj * C_ + (i64)v * VEC, al);
                }}
#pragma unroll
                for (int j = 0; j < UNR; ++j) {{
                    if (p + (i64)j * ROWS < p1) {{
                        float f[VEC];
                        cvt_x(u[j], f);
#pragma unroll
                        for (int k = 0; k < VEC; ++k) {{ const float d = f[k] - K[k]; s[k] += d; q[k] = fmaf(d, d, q[k]); }}
                    }}
                }}
            }}
        }}
#pragma unroll
        for (int k = 0; k < VEC; ++k) {{ sh[0][r][lane][k] = s[k]; sh[1][r][lane][k] = q[k]; }}
        __syncthreads();
        // Sum over the block's rows, in row order; write the block's partials.
        for (int t = threadIdx.x; t < 2 * LANES * VEC; t += BLOCK) {{
            const int which = t / (LANES * VEC), lv = t % (LANES * VEC);
            const int ln = lv / VEC, k = lv % VEC;
            if (v0 + ln < CV) {{
                float acc = 0.f;
                for (int rr = 0; rr < ROWS; ++rr) acc += sh[which][rr][ln][k];
                part[((i64)which * NBLK + blockIdx.x) * C_ + (i64)(v0 + ln) * VEC + k] = acc;
            }}
        }}
        __syncthreads();
    }}
}}
"#
    )
}

// ----------------------------------------------------------------------------------------------
// Batchnorm
// ----------------------------------------------------------------------------------------------

fn batchnorm(graph: &Graph, ni: usize, node: &Node, a: &BatchnormAttrs, sms: i64) -> Option<NodeKernels> {
    if !peer_ports(node).ok()?.is_empty() {
        return None;
    }
    let x = node.input("x")?;
    let scale = node.input("scale")?;
    let bias = node.input("bias")?;
    let y = node.output("y")?;
    let mean = node.output("mean")?;
    let inv = node.output("inv_variance")?;
    let running = match (node.input("in_running_mean"), node.input("in_running_var"), node.output("out_running_mean"), node.output("out_running_var")) {
        (Some(rm), Some(rv), Some(orm), Some(orv)) => Some((rm, rv, orm, orv)),
        (None, None, None, None) => None,
        _ => return None,
    };
    let (xd, yd) = (graph.desc(x), graph.desc(y));
    let (xt, yt) = (dtype(graph, x), dtype(graph, y));
    let helpers = vec_helpers(xt, yt)?;
    if xd.dims != yd.dims || !channels_last(&xd.dims, &xd.strides, false) || !channels_last(&yd.dims, &yd.strides, false) {
        return None;
    }
    // Position p must be at the same offset in x and y.
    if xd.dims.iter().enumerate().any(|(i, &d)| d > 1 && xd.strides[i] != yd.strides[i]) {
        return None;
    }
    let vec = (16 / xt.size()) as i64;
    let c = xd.dims[1];
    if c % vec != 0 {
        return None;
    }
    let positions = xd.element_count() / c;
    // Per-channel tensors: [1, C, 1, ...]; element c at c * stride[1].
    let chan = |id: TensorId| -> Option<(i64, DataType)> {
        let d = graph.desc(id);
        let t = dtype(graph, id);
        if d.dims.len() != xd.dims.len() || d.dims[1] != c || d.element_count() != c || t == DataType::F64 || !t.is_float() {
            return None;
        }
        Some((if c > 1 { d.strides[1] } else { 0 }, t))
    };
    let mut chans = vec![chan(scale)?, chan(bias)?, chan(mean)?, chan(inv)?];
    if let Some((rm, rv, orm, orv)) = running {
        for t in [rm, rv, orm, orv] {
            chans.push(chan(t)?);
        }
    }
    let g = StatsGeom::new(c, vec, positions, sms);
    let (block, blocks) = (g.block, g.blocks);
    let defs = g.defs(&helpers);
    let stats_entry = entry_name(ni, "bn_nhwc_stats");
    let stats = stats_source(&defs, &stats_entry);

    // Finalize: 32 channels per block, 32 segments of partials per channel.
    let fin_entry = entry_name(ni, "bn_nhwc_finalize");
    let st_of = |i: usize| format!("st_{}", dtype_name(chans[i].1));
    let ld_of = |i: usize| format!("ld_{}", dtype_name(chans[i].1));
    let mut fin_params = "const void* xv, const float* part, float* co, const void* sc, const void* bi, void* mo, void* iv".to_string();
    let mut fin_args = vec![Arg::Ptr(x), Arg::Scratch(0), Arg::Scratch(1), Arg::Ptr(scale), Arg::Ptr(bias), Arg::Ptr(mean), Arg::Ptr(inv)];
    let mut running_code = String::new();
    if let Some((rm, rv, orm, orv)) = running {
        fin_params += ", const void* rm, const void* rv, void* orm, void* orv";
        fin_args.extend([Arg::Ptr(rm), Arg::Ptr(rv), Arg::Ptr(orm), Arg::Ptr(orv)]);
        let mo = c_double(a.momentum);
        let n = positions as f64;
        running_code = format!(
            "        const double unbias = {unbias};\n        {st6}(orm, c * {s6}LL, (1.0 - {mo}) * {ld4}(rm, c * {s4}LL) + {mo} * mu);\n        {st7}(orv, c * {s7}LL, (1.0 - {mo}) * {ld5}(rv, c * {s5}LL) + {mo} * var * unbias);\n",
            unbias = c_double(n / (n - 1.0)),
            st6 = st_of(6),
            st7 = st_of(7),
            ld4 = ld_of(4),
            ld5 = ld_of(5),
            s4 = chans[4].0,
            s5 = chans[5].0,
            s6 = chans[6].0,
            s7 = chans[7].0,
        );
    }
    let finalize = format!(
        r#"{defs}
extern "C" __global__ void __launch_bounds__(1024) {fin_entry}({fin_params}) {{
    __shared__ double ss[32][33], sq[32][33];
    const int ln = threadIdx.x & 31, seg = threadIdx.x >> 5;
    const i64 c = (i64)blockIdx.x * 32 + ln;
    double s = 0.0, q = 0.0;
    if (c < C_) {{
#pragma unroll 4
        for (int b = seg; b < NBLK; b += 32) {{ s += (double)part[(i64)b * C_ + c]; q += (double)part[((i64)NBLK + b) * C_ + c]; }}
    }}
    ss[seg][ln] = s;
    sq[seg][ln] = q;
    __syncthreads();
    if (seg == 0 && c < C_) {{
        s = 0.0;
        q = 0.0;
        for (int k = 0; k < 32; ++k) {{ s += ss[k][ln]; q += sq[k][ln]; }}
        const double n = (double)P_;
        const double dm = s / n;
        const double mu = (double)x2f(((const XT*)xv)[c]) + dm;
        const double var = fmax(q / n - dm * dm, 0.0);
        const double inv = 1.0 / sqrt(var + {eps});
        {st2}(mo, c * {s2}LL, mu);
        {st3}(iv, c * {s3}LL, inv);
{running_code}        co[c] = (float)mu;
        co[C_ + c] = (float)(inv * {ld0}(sc, c * {s0}LL));
        co[2 * C_ + c] = (float){ld1}(bi, c * {s1}LL);
    }}
}}
"#,
        eps = c_double(a.epsilon),
        st2 = st_of(2),
        st3 = st_of(3),
        ld0 = ld_of(0),
        ld1 = ld_of(1),
        s0 = chans[0].0,
        s1 = chans[1].0,
        s2 = chans[2].0,
        s3 = chans[3].0,
    );

    let apply_entry = entry_name(ni, "bn_nhwc_apply");
    let apply = format!(
        r#"{defs}
extern "C" __global__ void __launch_bounds__(BLOCK, 4) {apply_entry}(const void* xv, const float* co, void* yv) {{
    const XT* x = (const XT*)xv;
    YT* y = (YT*)yv;
    const bool al = ((unsigned long long)x & 15) == 0 && ((unsigned long long)y & (YAL - 1)) == 0;
    const int lane = threadIdx.x % LANES, r = threadIdx.x / LANES;
    const i64 p0 = (i64)blockIdx.x * SLAB;
    const i64 p1 = min(p0 + SLAB, P_);
    for (int v = lane; v < CV; v += LANES) {{
        float mu[VEC], a[VEC], b[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {{ const i64 ch = (i64)v * VEC + k; mu[k] = co[ch]; a[k] = co[C_ + ch]; b[k] = co[2 * C_ + ch]; }}
        // Backwards through the slab: the statistics pass read its end last.
        for (i64 p = p1 - 1 - r; p >= p0; p -= (i64)ROWS * UNR) {{
            uint4 u[UNR];
#pragma unroll
            for (int j = 0; j < UNR; ++j) {{
                const i64 pj = p - (i64)j * ROWS;
                if (pj >= p0) u[j] = ldx_raw(x + pj * C_ + (i64)v * VEC, al);
            }}
#pragma unroll
            for (int j = 0; j < UNR; ++j) {{
                const i64 pj = p - (i64)j * ROWS;
                if (pj >= p0) {{
                    float f[VEC];
                    cvt_x(u[j], f);
#pragma unroll
                    for (int k = 0; k < VEC; ++k) f[k] = fmaf(f[k] - mu[k], a[k], b[k]);
                    st_y(y + pj * C_ + (i64)v * VEC, al, f);
                }}
            }}
        }}
    }}
}}
"#
    );

    let scratch = vec![(2 * blocks * c * 4) as usize, (3 * c * 4) as usize];
    let launch = |source: String, entry: String, grid: i64, block: i64, args: Vec<Arg>| Launch {
        source,
        entry,
        grid: Grid::Exact(grid as u32, 1, 1),
        block: block as u32,
        shared_bytes: 0,
        args,
        cluster: None,
        pdl: Pdl::Dependent,
    };
    Some(NodeKernels {
        launches: vec![
            launch(stats, stats_entry, blocks, block, vec![Arg::Ptr(x), Arg::Scratch(0)]),
            launch(finalize, fin_entry, ceil_div(c, 32), 1024, fin_args),
            launch(apply, apply_entry, blocks, block, vec![Arg::Ptr(x), Arg::Scratch(1), Arg::Ptr(y)]),
        ],
        scratch,
    })
}

// ----------------------------------------------------------------------------------------------
// Batchnorm inference and genstats
// ----------------------------------------------------------------------------------------------

/// A per-channel tensor `[1, C, 1, ...]` of rank `rank`: element c at `c * stride`; its
/// stride and type, or None.
fn chan_of(graph: &Graph, id: TensorId, rank: usize, c: i64) -> Option<(i64, DataType)> {
    let d = graph.desc(id);
    let t = dtype(graph, id);
    if d.dims.len() != rank || d.dims[1] != c || d.element_count() != c || t == DataType::F64 || !t.is_float() {
        return None;
    }
    Some((if c > 1 { d.strides[1] } else { 0 }, t))
}

/// Whether `dims`/`strides` are packed row-major (axes of size 1 may have any stride).
fn row_major(dims: &[i64], strides: &[i64]) -> bool {
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

/// y = (x - mean) * inv_variance * scale + bias for NHWC-packed (16-byte vectors of channels)
/// or NCHW-packed (each (n, c) plane contiguous) x and y.
fn bn_inference(graph: &Graph, ni: usize, node: &Node, sms: i64) -> Option<NodeKernels> {
    let x = node.input("x")?;
    let y = node.output("y")?;
    let ports = [node.input("scale")?, node.input("bias")?, node.input("mean")?, node.input("inv_variance")?];
    let (xd, yd) = (graph.desc(x), graph.desc(y));
    let (xt, yt) = (dtype(graph, x), dtype(graph, y));
    let helpers = vec_helpers(xt, yt)?;
    if xd.dims != yd.dims || xd.dims.len() < 2 {
        return None;
    }
    if xd.dims.iter().enumerate().any(|(i, &d)| d > 1 && xd.strides[i] != yd.strides[i]) {
        return None;
    }
    let c = xd.dims[1];
    let rank = xd.dims.len();
    let mut chans = Vec::new();
    for id in ports {
        chans.push(chan_of(graph, id, rank, c)?);
    }
    let vec = (16 / xt.size()) as i64;
    let total = xd.element_count();
    // Coefficients of channel ch: mu, a = inv * scale, b = bias.
    let coef = format!(
        "    const double sc_ = {l0}(sc, ch * {s0}LL), bi_ = {l1}(bi, ch * {s1}LL), mn_ = {l2}(mn, ch * {s2}LL), iv_ = {l3}(iv, ch * {s3}LL);\n",
        l0 = format_args!("ld_{}", dtype_name(chans[0].1)),
        l1 = format_args!("ld_{}", dtype_name(chans[1].1)),
        l2 = format_args!("ld_{}", dtype_name(chans[2].1)),
        l3 = format_args!("ld_{}", dtype_name(chans[3].1)),
        s0 = chans[0].0,
        s1 = chans[1].0,
        s2 = chans[2].0,
        s3 = chans[3].0,
    );
    let params = "const void* xv, const void* sc, const void* bi, const void* mn, const void* iv, void* yv";
    let args = vec![Arg::Ptr(x), Arg::Ptr(ports[0]), Arg::Ptr(ports[1]), Arg::Ptr(ports[2]), Arg::Ptr(ports[3]), Arg::Ptr(y)];
    if channels_last(&xd.dims, &xd.strides, false) && channels_last(&yd.dims, &yd.strides, false) && c % vec == 0 {
        // NHWC: threads own one vector of channels (coefficients in registers) and walk
        // the positions of a slab.
        let positions = total / c;
        let g = StatsGeom::new(c, vec, positions, sms);
        let defs = g.defs(&helpers);
        let entry = entry_name(ni, "bn_infer_nhwc");
        let source = format!(
            r#"{defs}
extern "C" __global__ void __launch_bounds__(BLOCK, 4) {entry}({params}) {{
    const XT* x = (const XT*)xv;
    YT* y = (YT*)yv;
    const bool al = ((unsigned long long)x & 15) == 0 && ((unsigned long long)y & (YAL - 1)) == 0;
    const int lane = threadIdx.x % LANES, r = threadIdx.x / LANES;
    const i64 p0 = (i64)blockIdx.x * SLAB;
    const i64 p1 = min(p0 + SLAB, P_);
    for (int v = lane; v < CV; v += LANES) {{
        float mu[VEC], a[VEC], b[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {{
            const i64 ch = (i64)v * VEC + k;
{coef}            mu[k] = (float)mn_; a[k] = (float)(iv_ * sc_); b[k] = (float)bi_;
        }}
        for (i64 p = p0 + r; p < p1; p += (i64)ROWS * UNR) {{
            uint4 u[UNR];
#pragma unroll
            for (int j = 0; j < UNR; ++j) {{
                const i64 pj = p + (i64)j * ROWS;
                if (pj < p1) u[j] = ldx_raw(x + pj * C_ + (i64)v * VEC, al);
            }}
#pragma unroll
            for (int j = 0; j < UNR; ++j) {{
                const i64 pj = p + (i64)j * ROWS;
                if (pj < p1) {{
                    float f[VEC];
                    cvt_x(u[j], f);
#pragma unroll
                    for (int k = 0; k < VEC; ++k) f[k] = fmaf(f[k] - mu[k], a[k], b[k]);
                    st_y(y + pj * C_ + (i64)v * VEC, al, f);
                }}
            }}
        }}
    }}
}}
"#
        );
        let launch = Launch { source, entry, grid: Grid::Exact(g.blocks as u32, 1, 1), block: g.block as u32, shared_bytes: 0, args, cluster: None, pdl: Pdl::Dependent };
        return Some(NodeKernels::one(launch));
    }
    if !row_major(&xd.dims, &xd.strides) || !row_major(&yd.dims, &yd.strides) {
        return None;
    }
    // NCHW: planes of HW contiguous elements, plane pl has channel pl % C. Vectors along the
    // plane when every plane starts 16-byte aligned.
    let hw: i64 = xd.dims[2..].iter().product();
    let vecs = hw * xt.size() as i64 % 16 == 0;
    let (pv, step) = if vecs { (hw / vec, vec) } else { (hw, 1) };
    let items = total / step;
    let entry = entry_name(ni, "bn_infer_nchw");
    let body = if vecs {
        "            float f[VEC];\n            cvt_x(ldx_raw(x + i * VEC, al), f);\n#pragma unroll\n            for (int k = 0; k < VEC; ++k) f[k] = fmaf(f[k] - mu, a, b);\n            st_y(y + i * VEC, al, f);\n"
    } else {
        "            y[i] = f2y(fmaf(x2f(x[i]) - mu, a, b));\n"
    };
    let source = format!(
        r#"{helpers}
#define C_ {c}LL
// Items (vectors or elements) per plane, items in all.
#define PV {pv}LL
#define ITEMS {items}LL
extern "C" __global__ void __launch_bounds__(256) {entry}({params}) {{
    const XT* x = (const XT*)xv;
    YT* y = (YT*)yv;
    const bool al = ((unsigned long long)x & 15) == 0 && ((unsigned long long)y & (YAL - 1)) == 0;
    (void)al;
    // The coefficients are reloaded (from L1/L2) only when a thread's plane changes.
    i64 cur = -1;
    float mu = 0.f, a = 0.f, b = 0.f;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < ITEMS; i += (i64)gridDim.x * blockDim.x) {{
        const i64 pl = i / PV;
        if (pl != cur) {{
            cur = pl;
            const i64 ch = pl % C_;
{coef}            mu = (float)mn_; a = (float)(iv_ * sc_); b = (float)bi_;
        }}
        {{
{body}        }}
    }}
}}
"#
    );
    let launch = Launch { source, entry, grid: Grid::Cover(items as u64), block: 256, shared_bytes: 0, args, cluster: None, pdl: Pdl::Dependent };
    Some(NodeKernels::one(launch))
}

/// Per-channel sum and sum of squares of NHWC-packed x: the batchnorm statistics pass, then
/// a deterministic finalize (f64, fixed order) that undoes the shift.
fn genstats(graph: &Graph, ni: usize, node: &Node, sms: i64) -> Option<NodeKernels> {
    let x = node.input("x")?;
    let sum = node.output("sum")?;
    let sq = node.output("sq_sum")?;
    let xd = graph.desc(x);
    let xt = dtype(graph, x);
    let helpers = vec_helpers(xt, xt)?;
    if !channels_last(&xd.dims, &xd.strides, false) {
        return None;
    }
    let vec = (16 / xt.size()) as i64;
    let c = xd.dims[1];
    if c % vec != 0 {
        return None;
    }
    let rank = xd.dims.len();
    let (ss, st) = chan_of(graph, sum, rank, c)?;
    let (qs, qt) = chan_of(graph, sq, rank, c)?;
    let positions = xd.element_count() / c;
    let g = StatsGeom::new(c, vec, positions, sms);
    let defs = g.defs(&helpers);
    let stats_entry = entry_name(ni, "genstats_nhwc_stats");
    let stats = stats_source(&defs, &stats_entry);
    let fin_entry = entry_name(ni, "genstats_nhwc_finalize");
    let finalize = format!(
        r#"{defs}
extern "C" __global__ void __launch_bounds__(1024) {fin_entry}(const void* xv, const float* part, void* su, void* sq) {{
    __shared__ double ss[32][33], sq2[32][33];
    const int ln = threadIdx.x & 31, seg = threadIdx.x >> 5;
    const i64 c = (i64)blockIdx.x * 32 + ln;
    double s = 0.0, q = 0.0;
    if (c < C_) {{
#pragma unroll 4
        for (int b = seg; b < NBLK; b += 32) {{ s += (double)part[(i64)b * C_ + c]; q += (double)part[((i64)NBLK + b) * C_ + c]; }}
    }}
    ss[seg][ln] = s;
    sq2[seg][ln] = q;
    __syncthreads();
    if (seg == 0 && c < C_) {{
        s = 0.0;
        q = 0.0;
        for (int k = 0; k < 32; ++k) {{ s += ss[k][ln]; q += sq2[k][ln]; }}
        // s, q: sums of d = x - K and d^2; sum x = s + n K, sum x^2 = q + 2 K s + n K^2.
        const double n = (double)P_;
        const double K = (double)x2f(((const XT*)xv)[c]);
        {sts}(su, c * {ss}LL, s + n * K);
        {stq}(sq, c * {qs}LL, q + 2.0 * K * s + n * K * K);
    }}
}}
"#,
        sts = format_args!("st_{}", dtype_name(st)),
        stq = format_args!("st_{}", dtype_name(qt)),
    );
    let launch = |source: String, entry: String, grid: i64, block: i64, args: Vec<Arg>| Launch {
        source,
        entry,
        grid: Grid::Exact(grid as u32, 1, 1),
        block: block as u32,
        shared_bytes: 0,
        args,
        cluster: None,
        pdl: Pdl::Dependent,
    };
    Some(NodeKernels {
        launches: vec![
            launch(stats, stats_entry, g.blocks, g.block, vec![Arg::Ptr(x), Arg::Scratch(0)]),
            launch(finalize, fin_entry, ceil_div(c, 32), 1024, vec![Arg::Ptr(x), Arg::Scratch(0), Arg::Ptr(sum), Arg::Ptr(sq)]),
        ],
        scratch: vec![(2 * g.blocks * c * 4) as usize],
    })
}

// ----------------------------------------------------------------------------------------------
// Pooling
// ----------------------------------------------------------------------------------------------

fn pooling(graph: &Graph, ni: usize, node: &Node, a: &ResampleAttrs, sms: i64, pdl: bool) -> Option<NodeKernels> {
    let x = node.input("x")?;
    let y = node.output("y")?;
    let (xd, yd) = (graph.desc(x), graph.desc(y));
    let (xt, yt) = (dtype(graph, x), dtype(graph, y));
    if xt != yt || xd.dims.len() != 4 || yd.dims.len() != 4 || [&a.window, &a.stride, &a.pre_padding, &a.post_padding].iter().any(|l| l.len() != 2) {
        return None;
    }
    let helpers = vec_helpers(xt, yt)?;
    if !channels_last(&xd.dims, &xd.strides, true) || !channels_last(&yd.dims, &yd.strides, true) {
        return None;
    }
    let want = a.output_dims(&xd.dims).ok()?;
    if want != yd.dims {
        return None;
    }
    let vec = (16 / xt.size()) as i64;
    let (n, c, h, w) = (xd.dims[0], xd.dims[1], xd.dims[2], xd.dims[3]);
    let (p, q) = (yd.dims[2], yd.dims[3]);
    if c % vec != 0 {
        return None;
    }
    let cv = c / vec;
    let total = n * p * q * cv;
    let (kh, kw) = (a.window[0], a.window[1]);
    let window = kh * kw;
    let unroll = if window <= 32 { "#pragma unroll" } else { "#pragma unroll 1" };
    let inner = match a.mode {
        ResampleMode::Max => "                for (int k = 0; k < VEC; ++k) { const float e = f[k]; if (e > m[k] || e != e) m[k] = e; }",
        _ => "                for (int k = 0; k < VEC; ++k) m[k] += f[k];",
    };
    let (init, finish) = match a.mode {
        ResampleMode::Max => {
            ("__uint_as_float(0xff800000u)", "    if (cnt == 0) {\n        for (int k = 0; k < VEC; ++k) m[k] = __uint_as_float(0x7fc00000u);\n    }\n".to_string())
        }
        ResampleMode::AvgIncludePadding => (
            "0.f",
            // Window clipped at the padded input's end (the start never passes the padding).
            "    const float div = (float)((min(h0 + KH, H_ + POSTH) - h0) * (min(w0 + KW, W_ + POSTW) - w0));\n    for (int k = 0; k < VEC; ++k) m[k] = m[k] / div;\n".to_string(),
        ),
        ResampleMode::AvgExcludePadding => ("0.f", "    const float div = (float)cnt;\n    for (int k = 0; k < VEC; ++k) m[k] = m[k] / div;\n".to_string()),
    };
    // 32-bit index arithmetic when every index and offset fits.
    let small = xd.element_count() < (1 << 30) && yd.element_count() < (1 << 30) && h + kh + a.stride[0] < (1 << 20) && w + kw + a.stride[1] < (1 << 20);
    let (iu, is, sfx) = if small { ("unsigned int", "int", "") } else { ("unsigned long long", "long long", "LL") };
    if let Some(launch) = pool_strip(ni, a, xt, &helpers, [n, c, h, w, p, q], sms, StripUse::Forward { pdl }, vec![Arg::Ptr(x), Arg::Ptr(y)]) {
        return Some(NodeKernels::one(launch));
    }
    if let Some(launch) = pool_tiled(ni, a, xt, &helpers, [n, c, h, w, p, q], small, [x, y]) {
        return Some(NodeKernels::one(launch));
    }
    let entry = entry_name(ni, &format!("pool_nhwc_{}", a.mode.name()));
    let source = format!(
        r#"{helpers}
typedef {iu} IU;
typedef {is} IS;
#define C_ {c}{sfx}
#define CV {cv}{sfx}
#define H_ {h}{sfx}
#define W_ {w}{sfx}
#define P_ {p}{sfx}
#define Q_ {q}{sfx}
#define KH {kh}{sfx}
#define KW {kw}{sfx}
#define SH {sh}{sfx}
#define SW {sw}{sfx}
#define PREH {preh}{sfx}
#define PREW {prew}{sfx}
#define POSTH {posth}{sfx}
#define POSTW {postw}{sfx}
#define TOTAL {total}LL
extern "C" __global__ void __launch_bounds__({POOL_THREADS}) {entry}(const void* xv, void* yv) {{
    const XT* x = (const XT*)xv;
    YT* y = (YT*)yv;
    const bool al = ((unsigned long long)x & 15) == 0 && ((unsigned long long)y & (YAL - 1)) == 0;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < TOTAL; i += (i64)gridDim.x * blockDim.x) {{
        // Output vector i = ((n * P + p) * Q + q) * CV + v.
        const IU ii = (IU)i;
        const IU v = ii % (IU)CV;
        IU t = ii / (IU)CV;
        const IU oq = t % (IU)Q_;
        t /= (IU)Q_;
        const IU op = t % (IU)P_;
        const IU on = t / (IU)P_;
        const IS h0 = (IS)op * SH - PREH, w0 = (IS)oq * SW - PREW;
        const XT* base = x + ((IS)on * (H_ * W_ * C_) + (IS)v * VEC);
        float m[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) m[k] = {init};
        int cnt = 0;
{unroll}
        for (IS dh = 0; dh < KH; ++dh) {{
            const IS hh = h0 + dh;
            if (hh < 0 || hh >= H_) continue;
{unroll}
            for (IS dw = 0; dw < KW; ++dw) {{
                const IS ww = w0 + dw;
                if (ww < 0 || ww >= W_) continue;
                float f[VEC];
                cvt_x(ldx_raw(base + (hh * W_ + ww) * C_, al), f);
                ++cnt;
#pragma unroll
{inner}
            }}
        }}
    {finish}
        st_y(y + i * VEC, al, m);
    }}
}}
"#,
        sh = a.stride[0],
        sw = a.stride[1],
        preh = a.pre_padding[0],
        prew = a.pre_padding[1],
        posth = a.post_padding[0],
        postw = a.post_padding[1],
    );
    let launch =
        Launch { source, entry, grid: Grid::Cover(total as u64), block: POOL_THREADS, shared_bytes: 0, args: vec![Arg::Ptr(x), Arg::Ptr(y)], cluster: None, pdl: Pdl::Dependent };
    Some(NodeKernels::one(launch))
}

/// Shared memory of an sm_90 SM (227 KiB a block at most, 1 KiB a block reserved).
const HOPPER_SMEM_PER_SM: i64 = 228 * 1024;

/// What a strip pooling kernel computes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum StripUse {
    /// The pooled output; `pdl`: launched as a programmatic dependent (sm_90).
    Forward { pdl: bool },
    /// Max pooling backward's window taps of each output's maximum.
    Argmax,
}

/// Most bytes of one ring slot of the strip pooling kernel (one footprint row: the block's
/// input columns, all channels).
const STRIP_SLOT_BYTES: i64 = 16 * 1024;
/// Most shared memory the ring of a strip block takes.
const STRIP_RING_BYTES: i64 = 72 * 1024;
/// Bytes of input rows a strip block aims to keep in flight.
const STRIP_IN_FLIGHT: i64 = 32 * 1024;
/// Most threads in a strip block (more items per row give each thread several).
const STRIP_MAX_THREADS: i64 = 512;
/// Most footprint rows one strip block walks (the row loop is unrolled).
const STRIP_MAX_ROWS: i64 = 40;

/// Strip pooling, for windows that overlap along h (`SH < KH`: an input row feeds several
/// output rows). Block b owns RP output rows x QB output columns x all channels of one image
/// (for the 3x3 stride-2 112x112 C=64 f16 workload: 7 rows x all 56 columns, 448 threads,
/// 256 blocks, two per SM). It streams its input footprint row by row into a ring of ND
/// shared-memory slots with 16-byte `cp.async` (each row segment, QB*SW+KW-SW positions of
/// all channels, is contiguous in NHWC memory: the loads are whole 128-byte lines, ND-1 rows
/// in flight per block, no registers held by them); thread (column j, channel vector v)
/// reduces each row over its window's columns from shared memory and folds it into the
/// accumulators of the (at most ceil(KH/SH)) output rows whose windows cover that row,
/// storing an output as soon as its last row is in. Every input byte comes from DRAM once and
/// from L2 once (blocks re-read only the rows where two strips meet: (RP-1)*SH+KH rows per
/// RP*SH). Unaligned bases take element-wise copies into the ring and element-wise stores.
/// Positions outside the image never reach the ring: the taps and rows that would read them
/// are skipped (max's neutral -inf, sums' 0). None (the tiled kernel then) for windows
/// that do not overlap along h, more than 8 taps along an axis, or rows too wide for a slot.
///
/// Launched as a programmatic dependent on sm_90 in one wave, the forward triggers the next
/// launch at its start and prefetches its first rows into L2 before it waits for the kernel
/// before it (see `PDL_SITE`); a shared-memory floor keeps it at two blocks per SM.
///
/// With `argmax` (max pooling backward), each output vector's window taps of the CPU's
/// maximum (the first maximal real element in row-major window order, a NaN beating any
/// number; 255 for an empty window) go to an index buffer (`args[1]`) as VEC bytes instead.
///
/// `FERRODNN_POOL_STRIP=RP,ND` (tuning only) overrides the rows per block and the ring depth.
#[allow(clippy::too_many_arguments)]
fn pool_strip(ni: usize, a: &ResampleAttrs, xt: DataType, helpers: &str, dims: [i64; 6], sms: i64, usage: StripUse, args: Vec<Arg>) -> Option<Launch> {
    let [n, c, h, w, p, q] = dims;
    let argmax = usage == StripUse::Argmax;
    let es = xt.size() as i64;
    let vec = 16 / es;
    let cv = c / vec;
    let (kh, kw, sh, sw) = (a.window[0], a.window[1], a.stride[0], a.stride[1]);
    if sh >= kh || kh > 8 || kw > 8 || kh * kw > POOL_MAX_TAPS || cv < 1 {
        return None;
    }
    if [n, c, h, w, p, q].iter().any(|&d| d >= 1 << 24) || n * p * q >= 1 << 31 {
        return None;
    }
    // Output columns per block: as many as a slot holds (and at most 1024 items per row),
    // then evened out over the blocks along q.
    let positions = STRIP_SLOT_BYTES / (c * es);
    if positions < kw {
        return None;
    }
    let qb_max = ((positions - kw) / sw + 1).min(2 * STRIP_MAX_THREADS / cv).min(q);
    if qb_max < 1 {
        return None;
    }
    let nsq = ceil_div(q, qb_max);
    let qb = ceil_div(q, nsq);
    let items = qb * cv;
    let ipt = ceil_div(items, STRIP_MAX_THREADS);
    let threads = ceil_div(ceil_div(items, ipt), 32) * 32;
    let fwb = (qb - 1) * sw + kw;
    let slot = fwb * cv;
    let slot_bytes = slot * 16;
    // Output rows per block: at least 4 (a strip re-reads the rows it shares with the next
    // one), more while that leaves more than two blocks per SM.
    let rp_max = ((STRIP_MAX_ROWS - kh) / sh + 1).clamp(1, 16);
    let mut rp = 4.min(p).min(rp_max);
    while rp < rp_max && rp < p && n * nsq * ceil_div(p, rp) > 2 * sms {
        rp += 1;
    }
    let tuned: Option<(i64, i64)> = std::env::var("FERRODNN_POOL_STRIP").ok().and_then(|v| {
        let parts: Vec<i64> = v.split(',').filter_map(|t| t.trim().parse().ok()).collect();
        if let [r, d] = parts[..] {
            Some((r.clamp(1, rp_max), d.clamp(2, 8)))
        } else {
            None
        }
    });
    if let Some((r, _)) = tuned {
        rp = r;
    }
    let nsp = ceil_div(p, rp);
    let fh = (rp - 1) * sh + kh;
    let blocks = n * nsp * nsq;
    if blocks >= 1 << 31 {
        return None;
    }
    // The forward in one wave of at most two blocks per SM, where the target has programmatic
    // dependent launches, triggers the next launch early (see the launch below): the
    // footprint rows of its first STRIP_IN_FLIGHT bytes go to L2 before the wait, and a block
    // takes at least a third of the SM's shared memory, so that an SM holds at most two; with
    // that memory, its ring keeps twice the bytes in flight.
    let early = usage == (StripUse::Forward { pdl: true }) && blocks <= 2 * sms;
    let (in_flight, ring_max) = if early { (2 * STRIP_IN_FLIGHT, HOPPER_SMEM_PER_SM / 2 - 1024) } else { (STRIP_IN_FLIGHT, STRIP_RING_BYTES) };
    let mut nd = (ceil_div(in_flight, slot_bytes) + 1).clamp(3, 8);
    while nd > 2 && nd * slot_bytes > ring_max {
        nd -= 1;
    }
    if let Some((_, d)) = tuned {
        nd = d;
    }
    let pf = if early { ceil_div(STRIP_IN_FLIGHT, slot_bytes).min(nd - 1) } else { 0 };
    let smem_floor = if early { HOPPER_SMEM_PER_SM / 3 } else { 0 };
    let (neg_inf, nan, max2) = max_words(xt);
    let max = a.mode == ResampleMode::Max;
    let (acc_decl, rowred, combine, finish) = if argmax {
        (
            "float best[IPT][RP][VEC];\n    unsigned int tap[IPT][RP][VEC];\n#pragma unroll\n    for (int i = 0; i < IPT; ++i)\n#pragma unroll\n        for (int o = 0; o < RP; ++o)\n#pragma unroll\n            for (int k = 0; k < VEC; ++k) { best[i][o][k] = 0.f; tap[i][o][k] = 255u; }",
            // The row's first maximal real element per channel (a NaN beats any number), and
            // its column in the window (-1: none).
            "float rb[VEC];\n                int rd[VEC];\n#pragma unroll\n                for (int k = 0; k < VEC; ++k) { rb[k] = 0.f; rd[k] = -1; }\n#pragma unroll\n                for (int dw = 0; dw < KW; ++dw) {\n                    const int ww = w0 + j * SW + dw;\n                    if (rok && ww >= 0 && ww < W_) {\n                        float f[VEC];\n                        cvt_x(row[(j * SW + dw) * CV + v], f);\n#pragma unroll\n                        for (int k = 0; k < VEC; ++k) {\n                            const float e = f[k], b = rb[k];\n                            if (rd[k] < 0 || e > b || (e != e && b == b)) { rb[k] = e; rd[k] = dw; }\n                        }\n                    }\n                }",
            // Rows come in window order, so the CPU's row-major first maximum.
            "{\n#pragma unroll\n                        for (int k = 0; k < VEC; ++k) {\n                            const float e = rb[k], b = best[i][o][k];\n                            if (rd[k] >= 0 && (tap[i][o][k] == 255u || e > b || (e != e && b == b))) { best[i][o][k] = e; tap[i][o][k] = (unsigned int)((r - o * SH) * KW + rd[k]); }\n                        }\n                    }",
            "IdxV u;\n#pragma unroll\n                            for (int k = 0; k < VEC; ++k) u.b[k] = (unsigned char)tap[i][o][k];\n                            ((IDXW*)yv)[yo / VEC] = u.u;\n                            (void)nr;\n                            (void)nc;\n                            (void)aly;".to_string(),
        )
    } else if max {
        (
            "uint4 acc[IPT][RP];\n#pragma unroll\n    for (int i = 0; i < IPT; ++i)\n#pragma unroll\n        for (int o = 0; o < RP; ++o) acc[i][o] = make_uint4(NEG, NEG, NEG, NEG);",
            "uint4 rs = make_uint4(NEG, NEG, NEG, NEG);\n#pragma unroll\n            for (int dw = 0; dw < KW; ++dw) {\n                const int ww = w0 + j * SW + dw;\n                if (rok && ww >= 0 && ww < W_) rs = vmax(rs, row[(j * SW + dw) * CV + v]);\n            }",
            "acc[i][o] = vmax(acc[i][o], rs);",
            // An empty window (all padding) is NaN, as on the CPU.
            "st_raw(y + yo, aly, (nr > 0 && nc > 0) ? acc[i][o] : make_uint4(QNAN, QNAN, QNAN, QNAN));".to_string(),
        )
    } else {
        let div = if a.mode == ResampleMode::AvgIncludePadding {
            // Window clipped at the padded input's end (the start never passes the padding).
            "(float)((min(oh + KH, H_ + POSTH) - oh) * (min(ow + KW, W_ + POSTW) - ow))"
        } else {
            // Real positions (0 for an empty window: 0 * inf = NaN, as the CPU's 0 / 0).
            "(float)((nr > 0 && nc > 0) ? nr * nc : 0)"
        };
        (
            "float acc[IPT][RP][VEC];\n#pragma unroll\n    for (int i = 0; i < IPT; ++i)\n#pragma unroll\n        for (int o = 0; o < RP; ++o)\n#pragma unroll\n            for (int k = 0; k < VEC; ++k) acc[i][o][k] = 0.f;",
            "float rs[VEC];\n#pragma unroll\n            for (int k = 0; k < VEC; ++k) rs[k] = 0.f;\n#pragma unroll\n            for (int dw = 0; dw < KW; ++dw) {\n                const int ww = w0 + j * SW + dw;\n                if (rok && ww >= 0 && ww < W_) {\n                    float f[VEC];\n                    cvt_x(row[(j * SW + dw) * CV + v], f);\n#pragma unroll\n                    for (int k = 0; k < VEC; ++k) rs[k] += f[k];\n                }\n            }",
            "{\n#pragma unroll\n                        for (int k = 0; k < VEC; ++k) acc[i][o][k] += rs[k];\n                    }",
            format!(
                "const float inv = 1.f / {div};\n                            float f[VEC];\n#pragma unroll\n                            for (int k = 0; k < VEC; ++k) f[k] = acc[i][o][k] * inv;\n                            st_y(y + yo, aly, f);"
            ),
        )
    };
    let entry = if argmax { entry_name(ni, "pool_bwd_argmax_strip") } else { entry_name(ni, &format!("pool_nhwc_strip_{}", a.mode.name())) };
    // The argmax bytes (window taps) of one output vector.
    let idx_defs = if argmax {
        format!("typedef {} IDXW;\nunion IdxV {{ IDXW u; unsigned char b[VEC]; }};\n", if vec == 8 { "unsigned long long" } else { "unsigned int" })
    } else {
        String::new()
    };
    let source = format!(
        r#"{helpers}
{idx_defs}#define C_ {c}
#define CV {cv}
#define H_ {h}
#define W_ {w}
#define P_ {p}
#define Q_ {q}
#define KH {kh}
#define KW {kw}
#define SH {sh}
#define SW {sw}
#define PREH {preh}
#define PREW {prew}
#define POSTH {posth}
#define POSTW {postw}
// Output rows and columns per block, its footprint (rows, columns), blocks along p and q.
#define RP {rp}
#define QB {qb}
#define FH {fh}
#define FWB {fwb}
#define NSP {nsp}
#define NSQ {nsq}
// Ring slots (rows), 16-byte vectors per slot, threads, items (column, channel vector) per
// output row and per thread.
#define ND {nd}
#define PF {pf}
#define SLOT {slot}
#define NT {threads}
#define ITEMS {items}
#define IPT {ipt}
#define NEG {neg_inf}
#define QNAN {nan}
__device__ __forceinline__ unsigned int max2(unsigned int a, unsigned int b) {{ {max2} }}
__device__ __forceinline__ uint4 vmax(uint4 a, uint4 b) {{ return make_uint4(max2(a.x, b.x), max2(a.y, b.y), max2(a.z, b.z), max2(a.w, b.w)); }}
__device__ __forceinline__ void st_raw(YT* p, bool al, uint4 u) {{
    if (al) {{
        *(uint4*)p = u;
    }} else {{
        const YT* e = (const YT*)&u;
#pragma unroll
        for (int k = 0; k < VEC; ++k) p[k] = e[k];
    }}
}}
__device__ __forceinline__ void cp_async16(void* s, const void* g) {{
    const unsigned int a = (unsigned int)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(a), "l"(g) : "memory");
}}
__device__ __forceinline__ void cp_async_commit() {{ asm volatile("cp.async.commit_group;\n" ::: "memory"); }}
template <int N> __device__ __forceinline__ void cp_async_wait() {{ asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }}
// Footprint row r (when inside the image) into ring slot r % ND: its columns wlo..whi-1 of
// all channels, contiguous in x. Always commits a group (empty past the footprint), so the
// wait below counts rows.
__device__ __forceinline__ void load_row(uint4* ring, const XT* xn, int r, int h0, int w0, int wlo, int nvec, bool alx) {{
    const int hh = h0 + r;
    if (r < FH && hh >= 0 && hh < H_) {{
        uint4* dst = ring + (r % ND) * SLOT + (wlo - w0) * CV;
        const XT* src = xn + ((i64)hh * W_ + wlo) * C_;
        for (int k = threadIdx.x; k < nvec; k += NT) {{
            if (alx) cp_async16(dst + k, src + (i64)k * VEC);
            else dst[k] = ldx_raw(src + (i64)k * VEC, false);
        }}
    }}
    cp_async_commit();
}}
extern "C" __global__ void __launch_bounds__(NT) {entry}(const void* __restrict__ xv, void* __restrict__ yv) {{
    extern __shared__ uint4 ring[];
    const XT* __restrict__ x = (const XT*)xv;
    YT* __restrict__ y = (YT*)yv;
    const bool alx = ((unsigned long long)x & 15) == 0;
    const bool aly = ((unsigned long long)y & (YAL - 1)) == 0;
    // Block = (n * NSP + strip along p) * NSQ + strip along q.
    const int sq = blockIdx.x % NSQ;
    const int bt = blockIdx.x / NSQ;
    const int sp = bt % NSP;
    const int n = bt / NSP;
    const int p0 = sp * RP, q0 = sq * QB;
    const int h0 = p0 * SH - PREH, w0 = q0 * SW - PREW;
    const int wlo = max(w0, 0), whi = min(w0 + FWB, W_);
    const int nvec = max(whi - wlo, 0) * CV;
    const XT* xn = x + (i64)n * H_ * W_ * C_;
    // The first PF footprint rows into L2 while the kernel before this one may still run (see
    // PDL_SITE: prefetches before the dependent-launch wait are sound).
#pragma unroll 1
    for (int r = 0; r < PF && r < FH; ++r) {{
        const int hh = h0 + r;
        if (hh >= 0 && hh < H_) {{
            const char* lo = (const char*)(xn + ((i64)hh * W_ + wlo) * C_);
            const char* hi = lo + (i64)(whi - wlo) * C_ * (i64)sizeof(XT);
            const char* a0 = (const char*)((unsigned long long)lo & ~127ull);
            for (const char* l = a0 + threadIdx.x * 128; l < hi; l += NT * 128) asm volatile("prefetch.global.L2 [%0];" :: "l"(l < lo ? lo : l));
        }}
    }}
    pdl_site();
    {acc_decl}
#pragma unroll
    for (int r = 0; r < ND - 1; ++r) load_row(ring, xn, r, h0, w0, wlo, nvec, alx);
#pragma unroll
    for (int r = 0; r < FH; ++r) {{
        // Row r landed (ND-2 younger groups may still fly); every thread is done with row
        // r-1, whose slot the load of row r+ND-1 takes.
        cp_async_wait<ND - 2>();
        __syncthreads();
        load_row(ring, xn, r + ND - 1, h0, w0, wlo, nvec, alx);
        const bool rok = h0 + r >= 0 && h0 + r < H_;
        const uint4* row = ring + (r % ND) * SLOT;
#pragma unroll
        for (int i = 0; i < IPT; ++i) {{
            const int it = threadIdx.x + i * NT;
            if (it < ITEMS) {{
                const int j = it / CV, v = it % CV;
                // The row reduced over output column j's window.
                {rowred}
#pragma unroll
                for (int o = 0; o < RP; ++o) {{
                    // Output row o's window covers footprint rows o*SH .. o*SH+KH-1.
                    if (r >= o * SH && r < o * SH + KH) {combine}
                    if (r == o * SH + KH - 1) {{
                        const int op = p0 + o, oq = q0 + j;
                        if (op < P_ && oq < Q_) {{
                            const int oh = op * SH - PREH, ow = oq * SW - PREW;
                            const int nr = min(oh + KH, H_) - max(oh, 0), nc = min(ow + KW, W_) - max(ow, 0);
                            const i64 yo = (((i64)n * P_ + op) * Q_ + oq) * C_ + v * VEC;
                            {finish}
                        }}
                    }}
                }}
            }}
        }}
    }}
}}
"#,
        preh = a.pre_padding[0],
        prew = a.pre_padding[1],
        posth = a.post_padding[0],
        postw = a.post_padding[1],
    );
    // The forward strip kernel is sized for one wave of two blocks per SM. As a programmatic
    // dependent that triggers the next launch at its start, the next grid's blocks wait on the
    // SMs' free slots: where a third block fits (max pooling's registers allow it) they pile
    // up unevenly, 5-15% slower; with two blocks per SM at most, each exiting block's slot
    // goes to a block of the next grid that prefetches its first rows into L2 while this grid
    // ends: with the deeper ring, 4-5% faster than waiting without the trigger (bench/NOTES.md,
    // session 14). Other forward grids wait without the trigger (3-6% faster than an
    // independent launch).
    let pdl = if early || argmax { Pdl::Dependent } else { Pdl::WaitOnly };
    Some(Launch { source, entry, grid: Grid::Exact(blocks as u32, 1, 1), block: threads as u32, shared_bytes: (nd * slot_bytes).max(smem_floor) as u32, args, cluster: None, pdl })
}

/// Threads a tiled pooling launch should have at least; smaller output tiles are taken until it
/// has (a small image split into few big tiles would leave most SMs idle).
const POOL_MIN_THREADS: i64 = 1024;
/// Most window taps the tiled pooling kernel unrolls (larger windows take the loop kernel).
const POOL_MAX_TAPS: i64 = 32;
/// Most input positions (16-byte loads) one thread's tile reads.
const POOL_MAX_FOOTPRINT: i64 = 64;

/// For max pooling on raw 32-bit words of `xt`: the bit patterns of two elements' neutral
/// value (-inf) and of a quiet NaN, and the body of `max2(a, b)` (a NaN wins, as the CPU's
/// rule).
fn max_words(xt: DataType) -> (&'static str, &'static str, &'static str) {
    match xt {
        DataType::F16 => ("0xfc00fc00u", "0x7e007e00u", "__half2 r = __hmax2_nan(*(const __half2*)&a, *(const __half2*)&b); return *(const unsigned int*)&r;"),
        DataType::Bf16 => {
            ("0xff80ff80u", "0x7fc07fc0u", "__nv_bfloat162 r = __hmax2_nan(*(const __nv_bfloat162*)&a, *(const __nv_bfloat162*)&b); return *(const unsigned int*)&r;")
        }
        _ => ("0xff800000u", "0x7fc00000u", "const float x = __uint_as_float(a), y = __uint_as_float(b); return (y > x || y != y) ? b : a;"),
    }
}

/// Tiled pooling: each thread computes a PT x QT tile of outputs for one vector of channels.
/// It walks the tile's input footprint ((PT-1)*SH+KH rows of (QT-1)*SW+KW positions) row by
/// row with one 16-byte load per position (out-of-range positions read as the reduction's
/// neutral value, so no branches), so input rows and columns shared by the tile's windows
/// are loaded once instead of once per window (3x3 stride 2 with a 4x2 tile: 45 loads for 8
/// outputs instead of 72); a finished output row is stored at once (only ceil(KH/SH) rows
/// of accumulators are live). Consecutive threads take consecutive channel vectors, so
/// each warp load covers whole 128-byte position rows of C. Max reduces the packed 16-bit
/// pairs with `__hmax2_nan` (a NaN wins, as the CPU's rule) without converting; averages sum
/// in f32. None when no tile fits the limits.
fn pool_tiled(ni: usize, a: &ResampleAttrs, xt: DataType, helpers: &str, dims: [i64; 6], small: bool, xy: [TensorId; 2]) -> Option<Launch> {
    let [n, c, h, w, p, q] = dims;
    let vec = (16 / xt.size()) as i64;
    let cv = c / vec;
    let (kh, kw, sh, sw) = (a.window[0], a.window[1], a.stride[0], a.stride[1]);
    if kh * kw > POOL_MAX_TAPS {
        return None;
    }
    let pt_max = if sh < kh { 4.min(p) } else { 1 };
    let qt_max = if sw < kw { 2.min(q) } else { 1 };
    let mut options = vec![(pt_max, qt_max), (pt_max.min(2), qt_max), (1, qt_max), (1, 1)];
    options.dedup();
    let fits = |&(pt, qt): &(i64, i64)| {
        let (fh, fw) = ((pt - 1) * sh + kh, (qt - 1) * sw + kw);
        // Accumulator registers live at once: rows of outputs whose windows overlap a row.
        let live = pt.min(ceil_div(kh, sh)) * qt;
        let acc_regs = if a.mode == ResampleMode::Max { live * 4 } else { live * vec };
        fh * fw <= POOL_MAX_FOOTPRINT && acc_regs <= 32
    };
    let threads = |&(pt, qt): &(i64, i64)| n * ceil_div(p, pt) * ceil_div(q, qt) * cv;
    let (pt, qt) = options.iter().copied().filter(fits).find(|o| threads(o) >= POOL_MIN_THREADS).or_else(|| options.iter().copied().filter(fits).last())?;
    let (fh, fw) = ((pt - 1) * sh + kh, (qt - 1) * sw + kw);
    let (ntp, ntq) = (ceil_div(p, pt), ceil_div(q, qt));
    let total = n * ntp * ntq * cv;
    let (iu, is, sfx) = if small { ("unsigned int", "int", "") } else { ("unsigned long long", "long long", "LL") };
    let (neg_inf, nan, max2) = max_words(xt);
    let max = a.mode == ResampleMode::Max;
    let (acc_decl, neutral, rowred, combine, finish) = if max {
        (
            "uint4 m[PT][QT];\n#pragma unroll\n        for (int o = 0; o < PT; ++o)\n#pragma unroll\n            for (int j = 0; j < QT; ++j) m[o][j] = make_uint4(NEG, NEG, NEG, NEG);",
            "make_uint4(NEG, NEG, NEG, NEG)",
            "uint4 rs[QT];\n#pragma unroll\n            for (int j = 0; j < QT; ++j) {\n                rs[j] = u[j * SW];\n#pragma unroll\n                for (int dw = 1; dw < KW; ++dw) rs[j] = vmax(rs[j], u[j * SW + dw]);\n            }",
            "m[o][j] = vmax(m[o][j], rs[j]);",
            // An empty window (all padding) is NaN, as on the CPU.
            "st_raw(yb + (o * Q_ + j) * C_, al, (nr > 0 && nc > 0) ? m[o][j] : make_uint4(QNAN, QNAN, QNAN, QNAN));".to_string(),
        )
    } else {
        let div = if a.mode == ResampleMode::AvgIncludePadding {
            // Window clipped at the padded input's end (the start never passes the padding).
            "(float)((min(oh + KH, H_ + POSTH) - oh) * (min(ow + KW, W_ + POSTW) - ow))"
        } else {
            // Real positions (0 for an empty window: 0 * inf = NaN, as the CPU's 0 / 0).
            "(float)((nr > 0 && nc > 0) ? nr * nc : 0)"
        };
        (
            "float m[PT][QT][VEC];\n#pragma unroll\n        for (int o = 0; o < PT; ++o)\n#pragma unroll\n            for (int j = 0; j < QT; ++j)\n#pragma unroll\n                for (int k = 0; k < VEC; ++k) m[o][j][k] = 0.f;",
            "make_uint4(0u, 0u, 0u, 0u)",
            // Each position converted once; the row's sums per output column.
            "float rs[QT][VEC];\n#pragma unroll\n            for (int j = 0; j < QT; ++j)\n#pragma unroll\n                for (int k = 0; k < VEC; ++k) rs[j][k] = 0.f;\n#pragma unroll\n            for (int cc = 0; cc < FW; ++cc) {\n                float f[VEC];\n                cvt_x(u[cc], f);\n#pragma unroll\n                for (int j = 0; j < QT; ++j)\n                    if (cc >= j * SW && cc < j * SW + KW) {\n#pragma unroll\n                        for (int k = 0; k < VEC; ++k) rs[j][k] += f[k];\n                    }\n            }",
            "{\n#pragma unroll\n                        for (int k = 0; k < VEC; ++k) m[o][j][k] += rs[j][k];\n                    }",
            format!(
                "const float inv = 1.f / {div};\n                            float f[VEC];\n#pragma unroll\n                            for (int k = 0; k < VEC; ++k) f[k] = m[o][j][k] * inv;\n                            st_y(yb + (o * Q_ + j) * C_, al, f);"
            ),
        )
    };
    let entry = entry_name(ni, &format!("pool_nhwc_tiled_{}", a.mode.name()));
    let source = format!(
        r#"{helpers}
typedef {iu} IU;
typedef {is} IS;
#define C_ {c}{sfx}
#define CV {cv}{sfx}
#define H_ {h}{sfx}
#define W_ {w}{sfx}
#define P_ {p}{sfx}
#define Q_ {q}{sfx}
#define KH {kh}{sfx}
#define KW {kw}{sfx}
#define SH {sh}{sfx}
#define SW {sw}{sfx}
#define PREH {preh}{sfx}
#define PREW {prew}{sfx}
#define POSTH {posth}{sfx}
#define POSTW {postw}{sfx}
// Output tile per thread, its input footprint, tiles along p and q.
#define PT {pt}
#define QT {qt}
#define FH {fh}
#define FW {fw}
#define NTP {ntp}{sfx}
#define NTQ {ntq}{sfx}
#define TOTAL {total}{sfx}
#define NEG {neg_inf}
#define QNAN {nan}
__device__ __forceinline__ unsigned int max2(unsigned int a, unsigned int b) {{ {max2} }}
__device__ __forceinline__ uint4 vmax(uint4 a, uint4 b) {{ return make_uint4(max2(a.x, b.x), max2(a.y, b.y), max2(a.z, b.z), max2(a.w, b.w)); }}
__device__ __forceinline__ void st_raw(YT* p, bool al, uint4 u) {{
    if (al) {{
        *(uint4*)p = u;
    }} else {{
        const YT* e = (const YT*)&u;
#pragma unroll
        for (int k = 0; k < VEC; ++k) p[k] = e[k];
    }}
}}
extern "C" __global__ void __launch_bounds__({POOL_THREADS}, 3) {entry}(const void* __restrict__ xv, void* __restrict__ yv) {{
    const XT* __restrict__ x = (const XT*)xv;
    YT* __restrict__ y = (YT*)yv;
    const bool al = ((unsigned long long)x & 15) == 0 && ((unsigned long long)y & (YAL - 1)) == 0;
    for (IU i = (IU)blockIdx.x * blockDim.x + threadIdx.x; i < (IU)TOTAL; i += (IU)gridDim.x * blockDim.x) {{
        // Thread i = ((n * NTP + tile p) * NTQ + tile q) * CV + channel vector.
        const IU v = i % (IU)CV;
        IU t = i / (IU)CV;
        const IU tq = t % (IU)NTQ;
        t /= (IU)NTQ;
        const IU tp = t % (IU)NTP;
        const IU on = t / (IU)NTP;
        const IS p0 = (IS)tp * PT, q0 = (IS)tq * QT;
        const IS h0 = p0 * SH - PREH, w0 = q0 * SW - PREW;
        const XT* xb = x + ((IS)on * (H_ * W_ * C_) + (IS)v * VEC);
        YT* yb = y + ((((IS)on * P_ + p0) * Q_ + q0) * C_ + (IS)v * VEC);
        {acc_decl}
#pragma unroll
        for (int r = 0; r < FH; ++r) {{
            const IS hh = h0 + r;
            const bool rok = hh >= 0 && hh < H_;
            // The footprint's row r: every load issued before any is used.
            uint4 u[FW];
#pragma unroll
            for (int cc = 0; cc < FW; ++cc) {{
                const IS ww = w0 + cc;
                u[cc] = (rok && ww >= 0 && ww < W_) ? ldx_raw(xb + (hh * W_ + ww) * C_, al) : {neutral};
            }}
            // The row reduced over each output column's window.
            {rowred}
#pragma unroll
            for (int o = 0; o < PT; ++o) {{
                // Output row o's window covers footprint rows o*SH .. o*SH+KH-1.
                if (r >= o * SH && r < o * SH + KH) {{
#pragma unroll
                    for (int j = 0; j < QT; ++j) {combine}
                }}
                if (r == o * SH + KH - 1) {{
#pragma unroll
                    for (int j = 0; j < QT; ++j) {{
                        const IS op = p0 + o, oq = q0 + j;
                        if (op < P_ && oq < Q_) {{
                            const IS oh = op * SH - PREH, ow = oq * SW - PREW;
                            const IS nr = min(oh + KH, H_) - max(oh, (IS)0), nc = min(ow + KW, W_) - max(ow, (IS)0);
                            {finish}
                        }}
                    }}
                }}
            }}
        }}
    }}
}}
"#,
        preh = a.pre_padding[0],
        prew = a.pre_padding[1],
        posth = a.post_padding[0],
        postw = a.post_padding[1],
    );
    Some(Launch {
        source,
        entry,
        grid: Grid::Cover(total as u64),
        block: POOL_THREADS,
        shared_bytes: 0,
        args: vec![Arg::Ptr(xy[0]), Arg::Ptr(xy[1])],
        cluster: None,
        pdl: Pdl::Dependent,
    })
}

// ----------------------------------------------------------------------------------------------
// Channel statistics in groups (NHWC) and planes (NCHW): batchnorm backward, instancenorm
// (NHWC), batchnorm training forward and genstats (NCHW)
// ----------------------------------------------------------------------------------------------

/// A per-(group, channel) tensor `[G or 1, C, 1, ...]` (statistics, scale, dscale, ...):
/// element (g, c) at `g * s0 + c * s1`.
struct StatT {
    s0: i64,
    s1: i64,
    dt: DataType,
}

impl StatT {
    /// A C expression loading element (g, c) of pointer `p` as double.
    fn ld(&self, p: &str, g: &str, c: &str) -> String {
        format!("ld_{}({p}, ({g}) * {}LL + ({c}) * {}LL)", dtype_name(self.dt), self.s0, self.s1)
    }
    /// A C statement storing double `v` to element (g, c) of `p`.
    fn st(&self, p: &str, g: &str, c: &str, v: &str) -> String {
        format!("st_{}({p}, ({g}) * {}LL + ({c}) * {}LL, {v});", dtype_name(self.dt), self.s0, self.s1)
    }
}

/// Tensor `id` as a `[groups, C, 1, ...]` tensor of rank `rank` (f16, bf16 or f32).
fn stat_of(graph: &Graph, id: TensorId, rank: usize, groups: i64, c: i64) -> Option<StatT> {
    let d = graph.desc(id);
    let t = dtype(graph, id);
    if d.dims.len() != rank || d.strides.len() != rank || d.dims[0] != groups || d.dims[1] != c || d.dims[2..].iter().any(|&n| n != 1) || c_type(t).is_none() {
        return None;
    }
    Some(StatT { s0: if groups > 1 { d.strides[0] } else { 0 }, s1: if c > 1 { d.strides[1] } else { 0 }, dt: t })
}

/// Whether x-like tensors `ids` (same dims as the first) put every element at the same offset.
fn same_layout(graph: &Graph, ids: &[TensorId]) -> bool {
    let d0 = graph.desc(ids[0]);
    ids.iter().all(|&id| {
        let d = graph.desc(id);
        d.dims == d0.dims && d.strides.len() == d0.strides.len() && d.dims.iter().enumerate().all(|(i, &n)| n <= 1 || d.strides[i] == d0.strides[i])
    })
}

/// The NHWC channel passes: `groups` groups (images for instancenorm, 1 for batchnorm) of
/// `positions` positions of C channels each, packed one group after the other; NBLK blocks
/// per group, each a slab of SLAB positions; a thread owns one vector of channels.
struct ChanGeom {
    c: i64,
    cv: i64,
    lanes: i64,
    rows: i64,
    block: i64,
    groups: i64,
    positions: i64,
    slab: i64,
    nblk: i64,
}

impl ChanGeom {
    /// `per_sm`: the blocks per SM the kernels' launch bounds promise; the grid (groups times
    /// blocks per group) stays within one wave of them (a few blocks of a second wave would
    /// double the pass's time for a sliver of its work).
    fn new(c: i64, vec: i64, groups: i64, positions: i64, sms: i64, per_sm: i64) -> ChanGeom {
        let cv = c / vec;
        let lanes = cv.min(BN_THREADS);
        let rows = (BN_THREADS / lanes).max(1);
        let block = lanes * rows;
        let want = (sms * per_sm / groups).min(ceil_div(positions, rows * UNROLL)).max(1);
        let slab = ceil_div(positions, want);
        let nblk = ceil_div(positions, slab);
        ChanGeom { c, cv, lanes, rows, block, groups, positions, slab, nblk }
    }

    fn grid(&self) -> i64 {
        self.groups * self.nblk
    }

    fn defs(&self, helpers: &str) -> String {
        let ChanGeom { c, cv, lanes, rows, block, groups, positions, slab, nblk } = self;
        format!(
            "{helpers}\n#define C_ {c}LL\n#define CV {cv}\n#define LANES {lanes}\n#define ROWS {rows}\n#define BLOCK {block}\n#define G_ {groups}LL\n#define P_ {positions}LL\n#define SLAB {slab}LL\n#define NBLK {nblk}\n#define UNR {UNROLL}\n"
        )
    }
}

/// Pieces of the channel kernels that read dy beside x.
struct DyParts {
    param: &'static str,
    decl: &'static str,
    align: &'static str,
    regs: &'static str,
    load: &'static str,
    cvt: &'static str,
}

fn dy_parts(dy: bool) -> DyParts {
    if dy {
        DyParts {
            param: ", const void* dyv",
            decl: "    const XT* dy = (const XT*)dyv;\n",
            align: " && ((unsigned long long)dy & 15) == 0",
            regs: "            uint4 w[UNR];\n",
            load: "                    w[j] = ldx_raw(dy + pj * C_ + (i64)v * VEC, al);\n",
            cvt: "                    float d[VEC];\n                    cvt_x(w[j], d);\n",
        }
    } else {
        DyParts { param: "", decl: "", align: "", regs: "", load: "", cvt: "" }
    }
}

/// The NHWC statistics pass: per block (group g, slab), per channel, the sums `s` and `q`
/// that `accum` adds up from x's `f[k]` (and dy's `d[k]`) over the slab, reduced over the
/// block in a fixed order, to `part[2][G * NBLK][C]`. `setup` runs once per channel vector.
fn chan_stats(defs: &str, entry: &str, extra: &str, dy: bool, setup: &str, accum: &str) -> String {
    let d = dy_parts(dy);
    super::rows::fill(
        r#"@defs@
extern "C" __global__ void __launch_bounds__(BLOCK, @minb@) @entry@(const void* xv@dyp@@extra@, float* part) {
    const XT* x = (const XT*)xv;
@dyd@    const bool al = ((unsigned long long)x & 15) == 0@dyal@;
    const int lane = threadIdx.x % LANES, r = threadIdx.x / LANES;
    const i64 g = blockIdx.x / NBLK;
    const i64 q0 = g * P_;
    const i64 p0 = q0 + (i64)(blockIdx.x % NBLK) * SLAB;
    const i64 p1 = min(p0 + SLAB, q0 + P_);
    (void)g;
    __shared__ float sh[2][ROWS][LANES][VEC];
    for (int v0 = 0; v0 < CV; v0 += LANES) {
        const int v = v0 + lane;
        float s[VEC], q[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) { s[k] = 0.f; q[k] = 0.f; }
        if (v < CV) {
@setup@
            for (i64 p = p0 + r; p < p1; p += (i64)ROWS * UNR) {
            uint4 u[UNR];
@dyr@#pragma unroll
            for (int j = 0; j < UNR; ++j) {
                const i64 pj = p + (i64)j * ROWS;
                if (pj < p1) {
                    u[j] = ldx_raw(x + pj * C_ + (i64)v * VEC, al);
@dyl@                }
            }
#pragma unroll
            for (int j = 0; j < UNR; ++j) {
                if (p + (i64)j * ROWS < p1) {
                    float f[VEC];
                    cvt_x(u[j], f);
@dyc@#pragma unroll
                    for (int k = 0; k < VEC; ++k) {
@accum@
                    }
                }
            }
            }
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) { sh[0][r][lane][k] = s[k]; sh[1][r][lane][k] = q[k]; }
        __syncthreads();
        // Sum over the block's rows, in row order; write the block's partials.
        for (int t = threadIdx.x; t < 2 * LANES * VEC; t += BLOCK) {
            const int which = t / (LANES * VEC), lv = t % (LANES * VEC);
            const int ln = lv / VEC, k = lv % VEC;
            if (v0 + ln < CV) {
                float acc = 0.f;
                for (int rr = 0; rr < ROWS; ++rr) acc += sh[which][rr][ln][k];
                part[((i64)which * (G_ * NBLK) + blockIdx.x) * C_ + (i64)(v0 + ln) * VEC + k] = acc;
            }
        }
        __syncthreads();
    }
}
"#,
        &[
            ("defs", defs.into()),
            ("entry", entry.into()),
            ("minb", if dy { "2" } else { "4" }.into()),
            ("dyp", d.param.into()),
            ("extra", extra.into()),
            ("dyd", d.decl.into()),
            ("dyal", d.align.into()),
            ("setup", setup.into()),
            ("dyr", d.regs.into()),
            ("dyl", d.load.into()),
            ("dyc", d.cvt.into()),
            ("accum", accum.into()),
        ],
    )
}

/// The finalize pass (32 channels per block, 32 segments of partials per channel): for each
/// group g in order, the partials of (g, c) summed in f64 in a fixed order into `s` and `q`,
/// then `per_group` (with `n`, the positions per group); then `per_channel`. `a0`, `a1` are
/// free f64 accumulators across groups.
fn chan_finalize(defs: &str, entry: &str, params: &str, per_group: &str, per_channel: &str) -> String {
    super::rows::fill(
        r#"@defs@
extern "C" __global__ void __launch_bounds__(1024) @entry@(@params@) {
    __shared__ double fin_s[32][33], fin_q[32][33];
    const int ln = threadIdx.x & 31, seg = threadIdx.x >> 5;
    const i64 c = (i64)blockIdx.x * 32 + ln;
    double a0 = 0.0, a1 = 0.0;
    (void)a0;
    (void)a1;
    for (i64 g = 0; g < G_; ++g) {
        double s = 0.0, q = 0.0;
        if (c < C_) {
            for (int b = seg; b < NBLK; b += 32) {
                const i64 bi = g * NBLK + b;
                s += (double)part[bi * C_ + c];
                q += (double)part[((i64)G_ * NBLK + bi) * C_ + c];
            }
        }
        fin_s[seg][ln] = s;
        fin_q[seg][ln] = q;
        __syncthreads();
        if (seg == 0 && c < C_) {
            s = 0.0;
            q = 0.0;
            for (int k = 0; k < 32; ++k) { s += fin_s[k][ln]; q += fin_q[k][ln]; }
            const double n = (double)P_;
            (void)n;
@per_group@
        }
        __syncthreads();
    }
    if (seg == 0 && c < C_) {
@per_channel@
    }
}
"#,
        &[("defs", defs.into()), ("entry", entry.into()), ("params", params.into()), ("per_group", per_group.into()), ("per_channel", per_channel.into())],
    )
}

/// The finalize pass for statistics per group and channel when there are several groups
/// (instancenorm on NHWC: one group per image). `chan_finalize` walks the groups one after
/// another, each a round of dependent global loads and block barriers (32 images: most of the
/// NHWC instancenorm's time); here 32 channels per block and the block's 32 warps take GPP
/// groups at once (SEGS = 32 / GPP warps per group, each summing every SEGS-th partial of the
/// group in order; the group's first warp adds the SEGS sums in order and runs `per_group`).
/// With `split` (no `per_channel`), blockIdx.y takes its own GPP groups; else the block walks
/// all the groups GPP at a time, and `per_channel` sees `a0`, `a1` summed over the groups in a
/// fixed order (per group lane over its groups, then over the lanes). Returns the source and
/// the grid.
#[allow(clippy::too_many_arguments)]
fn chan_finalize_groups(defs: &str, entry: &str, params: &str, per_group: &str, per_channel: &str, groups: i64, c: i64, split: bool) -> (String, (u32, u32, u32)) {
    let gpp = 1i64 << (63 - groups.clamp(1, 32).leading_zeros());
    let gy = if split { ceil_div(groups, gpp) } else { 1 };
    let source = super::rows::fill(
        r#"@defs@
#define GPP @gpp@
#define SEGS (32 / GPP)
#define SPLIT @split@
extern "C" __global__ void __launch_bounds__(1024) @entry@(@params@) {
    __shared__ double fin_s[32][33], fin_q[32][33];
    const int ln = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int seg = w % SEGS, gl = w / SEGS;
    const i64 c = (i64)blockIdx.x * 32 + ln;
    double a0 = 0.0, a1 = 0.0;
    (void)a0;
    (void)a1;
    const i64 gbeg = SPLIT ? (i64)blockIdx.y * GPP : 0;
    const i64 gend = SPLIT ? min(gbeg + GPP, G_) : G_;
    for (i64 g0 = gbeg; g0 < gend; g0 += GPP) {
        const i64 g = g0 + gl;
        double s = 0.0, q = 0.0;
        if (c < C_ && g < gend) {
#pragma unroll 8
            for (int b = seg; b < NBLK; b += SEGS) {
                const i64 bi = g * NBLK + b;
                s += (double)part[bi * C_ + c];
                q += (double)part[((i64)G_ * NBLK + bi) * C_ + c];
            }
        }
        fin_s[w][ln] = s;
        fin_q[w][ln] = q;
        __syncthreads();
        if (seg == 0 && c < C_ && g < gend) {
            s = 0.0;
            q = 0.0;
            for (int k = 0; k < SEGS; ++k) { s += fin_s[gl * SEGS + k][ln]; q += fin_q[gl * SEGS + k][ln]; }
            const double n = (double)P_;
            (void)n;
@per_group@
        }
        __syncthreads();
    }
    if (!SPLIT) {
        if (seg == 0) { fin_s[gl][ln] = a0; fin_q[gl][ln] = a1; }
        __syncthreads();
        if (w == 0 && c < C_) {
            a0 = 0.0;
            a1 = 0.0;
            for (int k = 0; k < GPP; ++k) { a0 += fin_s[k][ln]; a1 += fin_q[k][ln]; }
@per_channel@
        }
    }
}
"#,
        &[
            ("defs", defs.into()),
            ("gpp", gpp.to_string()),
            ("split", (split as i32).to_string()),
            ("entry", entry.into()),
            ("params", params.into()),
            ("per_group", per_group.into()),
            ("per_channel", per_channel.into()),
        ],
    );
    (source, (ceil_div(c, 32) as u32, gy as u32, 1))
}

/// The NHWC apply pass: the statistics pass's slabs walked backwards (its last rows are the
/// likeliest still in L2); per channel vector, NCO coefficients `cf[m][k]` from
/// `co[m][G][C]`; each output element `formula` of x's `f[k]` (and dy's `d[k]`).
fn chan_apply(defs: &str, entry: &str, dy: bool, nco: usize, formula: &str) -> String {
    let d = dy_parts(dy);
    super::rows::fill(
        r#"@defs@
#define NCO @nco@
extern "C" __global__ void __launch_bounds__(BLOCK, @minb@) @entry@(const void* xv@dyp@, const float* co, void* yv) {
    const XT* x = (const XT*)xv;
@dyd@    YT* y = (YT*)yv;
    const bool al = ((unsigned long long)x & 15) == 0@dyal@ && ((unsigned long long)y & (YAL - 1)) == 0;
    const int lane = threadIdx.x % LANES, r = threadIdx.x / LANES;
    const i64 g = blockIdx.x / NBLK;
    const i64 q0 = g * P_;
    const i64 p0 = q0 + (i64)(blockIdx.x % NBLK) * SLAB;
    const i64 p1 = min(p0 + SLAB, q0 + P_);
    for (int v = lane; v < CV; v += LANES) {
        float cf[NCO][VEC];
#pragma unroll
        for (int m = 0; m < NCO; ++m)
#pragma unroll
            for (int k = 0; k < VEC; ++k) cf[m][k] = co[((i64)m * G_ + g) * C_ + (i64)v * VEC + k];
        for (i64 p = p1 - 1 - r; p >= p0; p -= (i64)ROWS * UNR) {
            uint4 u[UNR];
@dyr@#pragma unroll
            for (int j = 0; j < UNR; ++j) {
                const i64 pj = p - (i64)j * ROWS;
                if (pj >= p0) {
                    u[j] = ldx_raw(x + pj * C_ + (i64)v * VEC, al);
@dyl@                }
            }
#pragma unroll
            for (int j = 0; j < UNR; ++j) {
                const i64 pj = p - (i64)j * ROWS;
                if (pj >= p0) {
                    float f[VEC];
                    cvt_x(u[j], f);
@dyc@#pragma unroll
                    for (int k = 0; k < VEC; ++k) f[k] = @formula@;
                    st_y(y + pj * C_ + (i64)v * VEC, al, f);
                }
            }
        }
    }
}
"#,
        &[
            ("defs", defs.into()),
            ("nco", nco.to_string()),
            ("entry", entry.into()),
            ("minb", if dy { "2" } else { "4" }.into()),
            ("dyp", d.param.into()),
            ("dyd", d.decl.into()),
            ("dyal", d.align.into()),
            ("dyr", d.regs.into()),
            ("dyl", d.load.into()),
            ("dyc", d.cvt.into()),
            ("formula", formula.into()),
        ],
    )
}

/// The NCHW passes: planes of HW contiguous elements (plane `pl = n * C + c`), read in
/// vectors of VEC elements when a plane is a multiple of 16 bytes (else one element at a
/// time). The statistics pass gives each plane to a team (a warp, or a block for few planes)
/// and writes `part[2][N][C]` (the layout of the NHWC pass with G = 1 and NBLK = N, so the
/// same finalize serves).
struct PlaneGeom {
    c: i64,
    n: i64,
    hw: i64,
    vw: i64,
    ts: i64,
}

impl PlaneGeom {
    fn new(c: i64, n: i64, hw: i64, vec: i64, esize: i64, sms: i64) -> PlaneGeom {
        let vw = if hw * esize % 16 == 0 { vec } else { 1 };
        // A warp per plane when there are enough planes to fill the GPU with warps.
        let ts = if n * c >= sms * 32 || hw / vw <= 512 { 32 } else { 256 };
        PlaneGeom { c, n, hw, vw, ts }
    }

    fn defs(&self, helpers: &str) -> String {
        let PlaneGeom { c, n, hw, vw, ts } = self;
        let ldv = if *vw > 1 {
            "__device__ __forceinline__ void ldv(const XT* p, i64 i, bool al, float* f) { cvt_x(ldx_raw(p + i * VEC, al), f); }\n__device__ __forceinline__ void stv(YT* p, i64 i, bool al, const float* f) { st_y(p + i * VEC, al, f); }\n"
        } else {
            "__device__ __forceinline__ void ldv(const XT* p, i64 i, bool al, float* f) { (void)al; f[0] = x2f(p[i]); }\n__device__ __forceinline__ void stv(YT* p, i64 i, bool al, const float* f) { (void)al; p[i] = f2y(f[0]); }\n"
        };
        format!(
            "{helpers}\n{ldv}#define C_ {c}LL\n#define N_ {n}LL\n#define HW_ {hw}LL\n#define VW {vw}\n#define ITEMS {items}LL\n#define PLANES {planes}LL\n#define TS {ts}\n#define UNR {UNROLL}\n// For the shared finalize: one group of N blocks (planes) per channel.\n#define G_ 1LL\n#define NBLK {n}\n#define P_ {count}LL\n",
            items = hw / vw,
            planes = n * c,
            count = n * hw,
        )
    }

    /// Blocks of the statistics pass.
    fn stats_grid(&self, sms: i64) -> i64 {
        let planes = self.n * self.c;
        if self.ts == 32 {
            ceil_div(planes, 8).min(sms * 8).max(1)
        } else {
            planes.min(sms * 8).max(1)
        }
    }

    fn vec_align(&self, dy: bool, y: bool) -> String {
        if self.vw == 1 {
            return "false".into();
        }
        let mut a = "((unsigned long long)x & 15) == 0".to_string();
        if dy {
            a += " && ((unsigned long long)dy & 15) == 0";
        }
        if y {
            a += " && ((unsigned long long)y & (YAL - 1)) == 0";
        }
        a
    }
}

/// The NCHW statistics pass: per plane, the sums `s` and `q` that `accum` adds up from x's `f`
/// (and dy's `d`), reduced over the plane's team in a fixed order, to `part[2][PLANES]`.
/// `setup` runs once per plane (with `ch`, the plane's channel).
fn plane_stats(defs: &str, geom: &PlaneGeom, entry: &str, extra: &str, dy: bool, setup: &str, accum: &str) -> String {
    let (dyp, dyd, dyr, dyl, dyg) = if dy {
        (
            ", const void* dyv",
            "    const XT* dy = (const XT*)dyv;\n",
            "            float fd[UNR][VW];\n",
            "                    ldv(dyp, i, al, fd[j]);\n",
            "                        const float d = fd[j][k];\n",
        )
    } else {
        ("", "", "", "", "")
    };
    super::rows::fill(
        r#"@defs@
extern "C" __global__ void __launch_bounds__(256) @entry@(const void* xv@dyp@@extra@, float* part) {
    const XT* x = (const XT*)xv;
@dyd@    const bool al = @al@;
    (void)al;
    const int t = TS == 32 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
    const i64 team = TS == 32 ? (((i64)blockIdx.x * 256 + threadIdx.x) >> 5) : (i64)blockIdx.x;
    const i64 nteams = TS == 32 ? (i64)gridDim.x * 8 : (i64)gridDim.x;
    __shared__ float red[2][2][8];
    int rb = 0;
    (void)red;
    (void)rb;
    for (i64 pl = team; pl < PLANES; pl += nteams) {
        const i64 ch = pl % C_;
        (void)ch;
@setup@
        float s = 0.f, q = 0.f;
        const XT* xp = x + pl * HW_;
@dypl@        for (i64 i0 = t; i0 < ITEMS; i0 += (i64)TS * UNR) {
            float fx[UNR][VW];
@dyr@#pragma unroll
            for (int j = 0; j < UNR; ++j) {
                const i64 i = i0 + (i64)j * TS;
                if (i < ITEMS) {
                    ldv(xp, i, al, fx[j]);
@dyl@                }
            }
#pragma unroll
            for (int j = 0; j < UNR; ++j) {
                if (i0 + (i64)j * TS < ITEMS) {
#pragma unroll
                    for (int k = 0; k < VW; ++k) {
                        const float f = fx[j][k];
@dyg@@accum@
                    }
                }
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            s += __shfl_xor_sync(0xffffffffu, s, o);
            q += __shfl_xor_sync(0xffffffffu, q, o);
        }
        if (TS > 32) {
            if ((threadIdx.x & 31) == 0) {
                red[rb][0][threadIdx.x >> 5] = s;
                red[rb][1][threadIdx.x >> 5] = q;
            }
            __syncthreads();
            s = 0.f;
            q = 0.f;
#pragma unroll
            for (int w = 0; w < 8; ++w) {
                s += red[rb][0][w];
                q += red[rb][1][w];
            }
            rb ^= 1;
        }
        if (t == 0) {
            part[pl] = s;
            part[PLANES + pl] = q;
        }
    }
}
"#,
        &[
            ("defs", defs.into()),
            ("entry", entry.into()),
            ("dyp", dyp.into()),
            ("extra", extra.into()),
            ("dyd", dyd.into()),
            ("al", geom.vec_align(dy, false)),
            ("setup", setup.into()),
            ("dypl", if dy { "        const XT* dyp = dy + pl * HW_;\n".into() } else { String::new() }),
            ("dyr", dyr.into()),
            ("dyl", dyl.into()),
            ("dyg", dyg.into()),
            ("accum", accum.into()),
        ],
    )
}

/// The NCHW apply pass: a thread per item (vector or element), walking backwards (the
/// statistics pass read the last planes last); NCO coefficients `cf[m]` from `co[m][C]`,
/// reloaded when the plane changes; each output element `formula` of x's `f` (and dy's `d`).
fn plane_apply(defs: &str, geom: &PlaneGeom, entry: &str, dy: bool, nco: usize, formula: &str) -> String {
    let (dyp, dyd, dyl, dyg) = if dy {
        (", const void* dyv", "    const XT* dy = (const XT*)dyv;\n", "        float fd[VW];\n        ldv(dy, it, al, fd);\n", "            const float d = fd[k];\n")
    } else {
        ("", "", "", "")
    };
    super::rows::fill(
        r#"@defs@
#define NCO @nco@
extern "C" __global__ void __launch_bounds__(256) @entry@(const void* xv@dyp@, const float* co, void* yv) {
    const XT* x = (const XT*)xv;
@dyd@    YT* y = (YT*)yv;
    const bool al = @al@;
    (void)al;
    i64 cur = -1;
    float cf[NCO];
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 it = PLANES * ITEMS - 1 - ((i64)blockIdx.x * blockDim.x + threadIdx.x); it >= 0; it -= stride) {
        const i64 pl = it / ITEMS;
        if (pl != cur) {
            cur = pl;
            const i64 ch = pl % C_;
#pragma unroll
            for (int m = 0; m < NCO; ++m) cf[m] = co[(i64)m * C_ + ch];
        }
        float fx[VW], o[VW];
        ldv(x, it, al, fx);
@dyl@#pragma unroll
        for (int k = 0; k < VW; ++k) {
            const float f = fx[k];
@dyg@            o[k] = @formula@;
        }
        stv(y, it, al, o);
    }
}
"#,
        &[
            ("defs", defs.into()),
            ("nco", nco.to_string()),
            ("entry", entry.into()),
            ("dyp", dyp.into()),
            ("dyd", dyd.into()),
            ("al", geom.vec_align(dy, true)),
            ("dyl", dyl.into()),
            ("dyg", dyg.into()),
            ("formula", formula.into()),
        ],
    )
}

/// A launch with an exact grid.
fn exact(source: String, entry: String, grid: i64, block: i64, args: Vec<Arg>) -> Launch {
    Launch { source, entry, grid: Grid::Exact(grid as u32, 1, 1), block: block as u32, shared_bytes: 0, args, cluster: None, pdl: Pdl::Dependent }
}

/// A grid-stride launch over `threads` threads of 256.
fn strided(source: String, entry: String, threads: i64, args: Vec<Arg>) -> Launch {
    Launch { source, entry, grid: Grid::Cover(threads.max(1) as u64), block: 256, shared_bytes: 0, args, cluster: None, pdl: Pdl::Dependent }
}

/// Backward of batchnorm (per channel over every axis but 1; `groups` 1) and instancenorm
/// (per (n, c) over the spatial axes; `groups` N): dx, dscale, dbias. NHWC: the statistics
/// pass sums dy and dy * xhat per (group, channel) from x and dy, the finalize writes dscale
/// and dbias (summed over the groups in order) and the coefficients of dx, the apply pass
/// computes `dx = inv * scale * (dy - sum(dy) / n - xhat * sum(dy * xhat) / n)` as
/// `A * dy + B * (x - mean) + Cs` (A, B, Cs per (group, channel), in f64). NCHW
/// (batchnorm only; instancenorm NCHW is a row kernel): the same three passes over planes.
fn norm_backward(graph: &Graph, ni: usize, node: &Node, instance: bool, sms: i64) -> Option<NodeKernels> {
    let dy = node.input("dy")?;
    let x = node.input("x")?;
    let scale = node.input("scale")?;
    let mean = node.input("mean")?;
    let inv = node.input("inv_variance")?;
    let dx = node.output("dx")?;
    let dscale = node.output("dscale")?;
    let dbias = node.output("dbias")?;
    let xd = graph.desc(x).clone();
    let (xt, dxt) = (dtype(graph, x), dtype(graph, dx));
    if dtype(graph, dy) != xt || xd.dims.len() < if instance { 3 } else { 2 } || !same_layout(graph, &[x, dy, dx]) {
        return None;
    }
    let helpers = vec_helpers(xt, dxt)?;
    let rank = xd.dims.len();
    let c = xd.dims[1];
    let n0 = xd.dims[0];
    let groups = if instance { n0 } else { 1 };
    let sc = stat_of(graph, scale, rank, 1, c)?;
    let mn = stat_of(graph, mean, rank, groups, c)?;
    let iv = stat_of(graph, inv, rank, groups, c)?;
    let ds = stat_of(graph, dscale, rank, 1, c)?;
    let db = stat_of(graph, dbias, rank, 1, c)?;
    let vec = (16 / xt.size()) as i64;
    let total = xd.element_count();
    let what = if instance { "in" } else { "bn" };
    let per_group = format!(
        "            const double mnv = {lm}, ivv = {li}, scv = {ls};\n            const double ca = ivv * scv;\n            co[((i64)0 * G_ + g) * C_ + c] = (float)mnv;\n            co[((i64)1 * G_ + g) * C_ + c] = (float)ca;\n            co[((i64)2 * G_ + g) * C_ + c] = (float)(-ca * ivv * (q / n));\n            co[((i64)3 * G_ + g) * C_ + c] = (float)(-ca * (s / n));\n            a0 += q;\n            a1 += s;",
        lm = mn.ld("mn", "g", "c"),
        li = iv.ld("iv", "g", "c"),
        ls = sc.ld("sc", "0", "c"),
    );
    let per_channel = format!("        {}\n        {}", ds.st("ds", "0", "c", "a0"), db.st("db", "0", "c", "a1"));
    let fin_params = "const float* part, float* co, const void* mn, const void* iv, const void* sc, void* ds, void* db";
    let fin_args = vec![Arg::Scratch(0), Arg::Scratch(1), Arg::Ptr(mean), Arg::Ptr(inv), Arg::Ptr(scale), Arg::Ptr(dscale), Arg::Ptr(dbias)];
    let stats_entry = entry_name(ni, &format!("{what}_bwd_stats"));
    let fin_entry = entry_name(ni, &format!("{what}_bwd_finalize"));
    let apply_entry = entry_name(ni, &format!("{what}_bwd_apply"));
    if channels_last(&xd.dims, &xd.strides, instance) && c % vec == 0 {
        let positions = total / c / groups;
        // The dy kernels are bounded to 2 blocks per SM (batchnorm keeps its grid of 4 per SM).
        let geom = ChanGeom::new(c, vec, groups, positions, sms, if groups > 1 { 2 } else { BN_BLOCKS_PER_SM });
        let defs = geom.defs(&helpers);
        let setup = format!(
            "            float M[VEC], R[VEC];\n#pragma unroll\n            for (int k = 0; k < VEC; ++k) {{\n                const i64 ch = (i64)v * VEC + k;\n                M[k] = (float){};\n                R[k] = (float){};\n            }}",
            mn.ld("mn", "g", "ch"),
            iv.ld("iv", "g", "ch")
        );
        let accum = "                        const float xh = (f[k] - M[k]) * R[k];\n                        s[k] += d[k];\n                        q[k] = fmaf(d[k], xh, q[k]);";
        let stats = chan_stats(&defs, &stats_entry, ", const void* mn, const void* iv", true, &setup, accum);
        let (fin, fin_grid) = if groups > 1 {
            chan_finalize_groups(&defs, &fin_entry, fin_params, &per_group, &per_channel, groups, c, false)
        } else {
            (chan_finalize(&defs, &fin_entry, fin_params, &per_group, &per_channel), (ceil_div(c, 32) as u32, 1, 1))
        };
        let apply = chan_apply(&defs, &apply_entry, true, 4, "fmaf(cf[1][k], d[k], fmaf(cf[2][k], f[k] - cf[0][k], cf[3][k]))");
        let scratch = vec![(2 * geom.grid() * c * 4) as usize, (4 * groups * c * 4) as usize];
        return Some(NodeKernels {
            launches: vec![
                exact(stats, stats_entry, geom.grid(), geom.block, vec![Arg::Ptr(x), Arg::Ptr(dy), Arg::Ptr(mean), Arg::Ptr(inv), Arg::Scratch(0)]),
                Launch { grid: Grid::Exact(fin_grid.0, fin_grid.1, fin_grid.2), ..exact(fin, fin_entry, 1, 1024, fin_args) },
                exact(apply, apply_entry, geom.grid(), geom.block, vec![Arg::Ptr(x), Arg::Ptr(dy), Arg::Scratch(1), Arg::Ptr(dx)]),
            ],
            scratch,
        });
    }
    if instance || !row_major(&xd.dims, &xd.strides) {
        return None;
    }
    let hw: i64 = xd.dims[2..].iter().product();
    let geom = PlaneGeom::new(c, n0, hw, vec, xt.size() as i64, sms);
    let defs = geom.defs(&helpers);
    let setup = format!("        const float M = (float){}, R = (float){};", mn.ld("mn", "0", "ch"), iv.ld("iv", "0", "ch"));
    let accum = "                        const float xh = (f - M) * R;\n                        s += d;\n                        q = fmaf(d, xh, q);";
    let stats = plane_stats(&defs, &geom, &stats_entry, ", const void* mn, const void* iv", true, &setup, accum);
    let fin = chan_finalize(&defs, &fin_entry, fin_params, &per_group, &per_channel);
    let apply = plane_apply(&defs, &geom, &apply_entry, true, 4, "fmaf(cf[1], d, fmaf(cf[2], f - cf[0], cf[3]))");
    let scratch = vec![(2 * n0 * c * 4) as usize, (4 * c * 4) as usize];
    Some(NodeKernels {
        launches: vec![
            exact(stats, stats_entry, geom.stats_grid(sms), 256, vec![Arg::Ptr(x), Arg::Ptr(dy), Arg::Ptr(mean), Arg::Ptr(inv), Arg::Scratch(0)]),
            exact(fin, fin_entry, ceil_div(c, 32), 1024, fin_args),
            strided(apply, apply_entry, n0 * c * hw / geom.vw, vec![Arg::Ptr(x), Arg::Ptr(dy), Arg::Scratch(1), Arg::Ptr(dx)]),
        ],
        scratch,
    })
}

/// Instancenorm forward on NHWC-packed x (N outermost): per (n, c) the shifted sums over the
/// image's positions (shift: the image's first value of the channel), a finalize writing mean
/// and inv_variance (training) and the coefficients, and the apply pass.
fn instancenorm_nhwc(graph: &Graph, ni: usize, node: &Node, eps: f64, sms: i64) -> Option<NodeKernels> {
    let x = node.input("x")?;
    let scale = node.input("scale")?;
    let bias = node.input("bias")?;
    let y = node.output("y")?;
    let xd = graph.desc(x).clone();
    let (xt, yt) = (dtype(graph, x), dtype(graph, y));
    if xd.dims.len() < 3 || !same_layout(graph, &[x, y]) || !channels_last(&xd.dims, &xd.strides, true) {
        return None;
    }
    let helpers = vec_helpers(xt, yt)?;
    let rank = xd.dims.len();
    let (n0, c) = (xd.dims[0], xd.dims[1]);
    let vec = (16 / xt.size()) as i64;
    if c % vec != 0 {
        return None;
    }
    let sc = stat_of(graph, scale, rank, 1, c)?;
    let bi = stat_of(graph, bias, rank, 1, c)?;
    let stats = match (node.output("mean"), node.output("inv_variance")) {
        (Some(m), Some(v)) => Some((m, stat_of(graph, m, rank, n0, c)?, v, stat_of(graph, v, rank, n0, c)?)),
        (None, None) => None,
        _ => return None,
    };
    let positions = xd.element_count() / c / n0;
    let geom = ChanGeom::new(c, vec, n0, positions, sms, BN_BLOCKS_PER_SM);
    let defs = geom.defs(&helpers);
    let stats_entry = entry_name(ni, "in_nhwc_stats");
    let fin_entry = entry_name(ni, "in_nhwc_finalize");
    let apply_entry = entry_name(ni, "in_nhwc_apply");
    let setup = "            float K[VEC];\n            cvt_x(ldx_raw(x + q0 * C_ + (i64)v * VEC, al), K);";
    let accum = "                        const float e = f[k] - K[k];\n                        s[k] += e;\n                        q[k] = fmaf(e, e, q[k]);";
    let stats_src = chan_stats(&defs, &stats_entry, "", false, setup, accum);
    let mut fin_params = "const void* xv, const float* part, float* co, const void* sc, const void* bi".to_string();
    let mut fin_args = vec![Arg::Ptr(x), Arg::Scratch(0), Arg::Scratch(1), Arg::Ptr(scale), Arg::Ptr(bias)];
    let mut store = String::new();
    if let Some((m, ms, v, vs)) = &stats {
        fin_params += ", void* mo, void* vo";
        fin_args.extend([Arg::Ptr(*m), Arg::Ptr(*v)]);
        store = format!("            {}\n            {}\n", ms.st("mo", "g", "c", "mu"), vs.st("vo", "g", "c", "inv"));
    }
    let per_group = format!(
        "            const double K = (double)x2f(((const XT*)xv)[g * P_ * C_ + c]);\n            const double dm = s / n;\n            const double mu = K + dm;\n            const double var = fmax(q / n - dm * dm, 0.0);\n            const double inv = 1.0 / sqrt(var + {eps});\n{store}            co[((i64)0 * G_ + g) * C_ + c] = (float)mu;\n            co[((i64)1 * G_ + g) * C_ + c] = (float)(inv * {ls});\n            co[((i64)2 * G_ + g) * C_ + c] = (float){lb};",
        eps = c_double(eps),
        ls = sc.ld("sc", "0", "c"),
        lb = bi.ld("bi", "0", "c"),
    );
    let (fin, fin_grid) = if n0 > 1 {
        chan_finalize_groups(&defs, &fin_entry, &fin_params, &per_group, "", n0, c, true)
    } else {
        (chan_finalize(&defs, &fin_entry, &fin_params, &per_group, ""), (ceil_div(c, 32) as u32, 1, 1))
    };
    let apply = chan_apply(&defs, &apply_entry, false, 3, "fmaf(f[k] - cf[0][k], cf[1][k], cf[2][k])");
    Some(NodeKernels {
        launches: vec![
            exact(stats_src, stats_entry, geom.grid(), geom.block, vec![Arg::Ptr(x), Arg::Scratch(0)]),
            Launch { grid: Grid::Exact(fin_grid.0, fin_grid.1, fin_grid.2), ..exact(fin, fin_entry, 1, 1024, fin_args) },
            exact(apply, apply_entry, geom.grid(), geom.block, vec![Arg::Ptr(x), Arg::Scratch(1), Arg::Ptr(y)]),
        ],
        scratch: vec![(2 * geom.grid() * c * 4) as usize, (3 * n0 * c * 4) as usize],
    })
}

/// The NCHW statistics pass of batchnorm and genstats: per plane the sums of `x - K` and
/// `(x - K)^2` (K: the channel's first value, in plane (0, c)).
fn plane_shift_stats(defs: &str, geom: &PlaneGeom, entry: &str) -> String {
    plane_stats(
        defs,
        geom,
        entry,
        "",
        false,
        "        const float K = x2f(x[ch * HW_]);",
        "                        const float e = f - K;\n                        s += e;\n                        q = fmaf(e, e, q);",
    )
}

/// Batchnorm training forward (no peers) on NCHW-packed x: plane statistics, a finalize with
/// the running statistics, the apply pass.
fn batchnorm_nchw(graph: &Graph, ni: usize, node: &Node, a: &BatchnormAttrs, sms: i64) -> Option<NodeKernels> {
    if !peer_ports(node).ok()?.is_empty() {
        return None;
    }
    let x = node.input("x")?;
    let scale = node.input("scale")?;
    let bias = node.input("bias")?;
    let y = node.output("y")?;
    let mean = node.output("mean")?;
    let inv = node.output("inv_variance")?;
    let xd = graph.desc(x).clone();
    let (xt, yt) = (dtype(graph, x), dtype(graph, y));
    if !same_layout(graph, &[x, y]) || !row_major(&xd.dims, &xd.strides) {
        return None;
    }
    let helpers = vec_helpers(xt, yt)?;
    let rank = xd.dims.len();
    let (n0, c) = (xd.dims[0], xd.dims[1]);
    let hw: i64 = xd.dims[2..].iter().product();
    let sc = stat_of(graph, scale, rank, 1, c)?;
    let bi = stat_of(graph, bias, rank, 1, c)?;
    let ms = stat_of(graph, mean, rank, 1, c)?;
    let vs = stat_of(graph, inv, rank, 1, c)?;
    let mut fin_params = "const void* xv, const float* part, float* co, const void* sc, const void* bi, void* mo, void* vo".to_string();
    let mut fin_args = vec![Arg::Ptr(x), Arg::Scratch(0), Arg::Scratch(1), Arg::Ptr(scale), Arg::Ptr(bias), Arg::Ptr(mean), Arg::Ptr(inv)];
    let mut running = String::new();
    match (node.input("in_running_mean"), node.input("in_running_var"), node.output("out_running_mean"), node.output("out_running_var")) {
        (Some(rm), Some(rv), Some(orm), Some(orv)) => {
            let [rms, rvs, orms, orvs] = [rm, rv, orm, orv].map(|t| stat_of(graph, t, rank, 1, c));
            let (rms, rvs, orms, orvs) = (rms?, rvs?, orms?, orvs?);
            fin_params += ", const void* rm, const void* rv, void* orm, void* orv";
            fin_args.extend([Arg::Ptr(rm), Arg::Ptr(rv), Arg::Ptr(orm), Arg::Ptr(orv)]);
            let mo = c_double(a.momentum);
            let cnt = (n0 * hw) as f64;
            running = format!(
                "            const double unbias = {unbias};\n            {}\n            {}\n",
                orms.st("orm", "0", "c", &format!("(1.0 - {mo}) * {} + {mo} * mu", rms.ld("rm", "0", "c"))),
                orvs.st("orv", "0", "c", &format!("(1.0 - {mo}) * {} + {mo} * var * unbias", rvs.ld("rv", "0", "c"))),
                unbias = c_double(cnt / (cnt - 1.0)),
            );
        }
        (None, None, None, None) => {}
        _ => return None,
    }
    let vec = (16 / xt.size()) as i64;
    let geom = PlaneGeom::new(c, n0, hw, vec, xt.size() as i64, sms);
    let defs = geom.defs(&helpers);
    let stats_entry = entry_name(ni, "bn_nchw_stats");
    let fin_entry = entry_name(ni, "bn_nchw_finalize");
    let apply_entry = entry_name(ni, "bn_nchw_apply");
    let stats = plane_shift_stats(&defs, &geom, &stats_entry);
    let per_group = format!(
        "            const double K = (double)x2f(((const XT*)xv)[c * HW_]);\n            const double dm = s / n;\n            const double mu = K + dm;\n            const double var = fmax(q / n - dm * dm, 0.0);\n            const double inv = 1.0 / sqrt(var + {eps});\n            {stm}\n            {stv}\n{running}            co[c] = (float)mu;\n            co[C_ + c] = (float)(inv * {ls});\n            co[2 * C_ + c] = (float){lb};",
        eps = c_double(a.epsilon),
        stm = ms.st("mo", "0", "c", "mu"),
        stv = vs.st("vo", "0", "c", "inv"),
        ls = sc.ld("sc", "0", "c"),
        lb = bi.ld("bi", "0", "c"),
    );
    let fin = chan_finalize(&defs, &fin_entry, &fin_params, &per_group, "");
    let apply = plane_apply(&defs, &geom, &apply_entry, false, 3, "fmaf(f - cf[0], cf[1], cf[2])");
    Some(NodeKernels {
        launches: vec![
            exact(stats, stats_entry, geom.stats_grid(sms), 256, vec![Arg::Ptr(x), Arg::Scratch(0)]),
            exact(fin, fin_entry, ceil_div(c, 32), 1024, fin_args),
            strided(apply, apply_entry, n0 * c * hw / geom.vw, vec![Arg::Ptr(x), Arg::Scratch(1), Arg::Ptr(y)]),
        ],
        scratch: vec![(2 * n0 * c * 4) as usize, (3 * c * 4) as usize],
    })
}

/// Genstats on NCHW-packed x: plane statistics and a finalize that undoes the shift.
fn genstats_nchw(graph: &Graph, ni: usize, node: &Node, sms: i64) -> Option<NodeKernels> {
    let x = node.input("x")?;
    let sum = node.output("sum")?;
    let sq = node.output("sq_sum")?;
    let xd = graph.desc(x).clone();
    let xt = dtype(graph, x);
    if !row_major(&xd.dims, &xd.strides) {
        return None;
    }
    let helpers = vec_helpers(xt, xt)?;
    let rank = xd.dims.len();
    let (n0, c) = (xd.dims[0], xd.dims[1]);
    let hw: i64 = xd.dims[2..].iter().product();
    let ss = stat_of(graph, sum, rank, 1, c)?;
    let qs = stat_of(graph, sq, rank, 1, c)?;
    let geom = PlaneGeom::new(c, n0, hw, (16 / xt.size()) as i64, xt.size() as i64, sms);
    let defs = geom.defs(&helpers);
    let stats_entry = entry_name(ni, "genstats_nchw_stats");
    let fin_entry = entry_name(ni, "genstats_nchw_finalize");
    let stats = plane_shift_stats(&defs, &geom, &stats_entry);
    let per_group = format!(
        "            const double K = (double)x2f(((const XT*)xv)[c * HW_]);\n            {}\n            {}",
        ss.st("su", "0", "c", "s + n * K"),
        qs.st("sq", "0", "c", "q + 2.0 * K * s + n * K * K")
    );
    let fin = chan_finalize(&defs, &fin_entry, "const void* xv, const float* part, void* su, void* sq", &per_group, "");
    Some(NodeKernels {
        launches: vec![
            exact(stats, stats_entry, geom.stats_grid(sms), 256, vec![Arg::Ptr(x), Arg::Scratch(0)]),
            exact(fin, fin_entry, ceil_div(c, 32), 1024, vec![Arg::Ptr(x), Arg::Scratch(0), Arg::Ptr(sum), Arg::Ptr(sq)]),
        ],
        scratch: vec![(2 * n0 * c * 4) as usize],
    })
}

/// bn_finalize: one thread per channel, in f64 (C values; a single small launch with the
/// offsets baked in).
fn bn_finalize(graph: &Graph, ni: usize, node: &Node, a: &BnFinalizeAttrs) -> Option<NodeKernels> {
    let sum = node.input("sum")?;
    let d = graph.desc(sum);
    let rank = d.dims.len();
    let c = *d.dims.get(1)?;
    let mut ins = vec![("su", sum), ("sq", node.input("sq_sum")?), ("sc", node.input("scale")?), ("bi", node.input("bias")?)];
    let mut outs = vec![("es", node.output("eq_scale")?), ("eb", node.output("eq_bias")?), ("sm", node.output("saved_mean")?), ("si", node.output("saved_inv_std")?)];
    let running = match (node.input("prev_running_mean"), node.input("prev_running_var"), node.output("next_running_mean"), node.output("next_running_var")) {
        (Some(rm), Some(rv), Some(nrm), Some(nrv)) => {
            ins.extend([("rm", rm), ("rv", rv)]);
            outs.extend([("nm", nrm), ("nv", nrv)]);
            true
        }
        (None, None, None, None) => false,
        _ => return None,
    };
    let mut params = Vec::new();
    let mut args = Vec::new();
    let mut offs = std::collections::HashMap::new();
    for &(name, id) in ins.iter().chain(&outs) {
        let t = graph.desc(id);
        let dt = dtype(graph, id);
        if t.dims.len() != rank || t.dims[1] != c || t.dims.iter().enumerate().any(|(i, &n)| i != 1 && n != 1) || !dt.is_float() {
            return None;
        }
        let write = outs.iter().any(|o| o.0 == name);
        params.push(format!("{}void* {name}", if write { "" } else { "const " }));
        args.push(Arg::Ptr(id));
        offs.insert(name, (if c > 1 { t.strides[1] } else { 0 }, dtype_name(dt)));
    }
    let ld = |n: &str| format!("ld_{}({n}, c * {}LL)", offs[n].1, offs[n].0);
    let st = |n: &str, v: &str| format!("st_{}({n}, c * {}LL, {v});", offs[n].1, offs[n].0);
    let count = a.accum_count as f64;
    let mo = c_double(a.momentum);
    let mut body = format!(
        "        const double mean = {su} / {cnt};\n        const double var = fmax({sq} / {cnt} - mean * mean, 0.0);\n        const double inv = 1.0 / sqrt(var + {eps});\n        const double eqs = {sc} * inv;\n        {w1}\n        {w2}\n        {w3}\n        {w4}\n",
        su = ld("su"),
        sq = ld("sq"),
        sc = ld("sc"),
        cnt = c_double(count),
        eps = c_double(a.epsilon),
        w1 = st("es", "eqs"),
        w2 = st("eb", &format!("{} - mean * eqs", ld("bi"))),
        w3 = st("sm", "mean"),
        w4 = st("si", "inv"),
    );
    if running {
        body += &format!(
            "        {}\n        {}\n",
            st("nm", &format!("(1.0 - {mo}) * {} + {mo} * mean", ld("rm"))),
            st("nv", &format!("(1.0 - {mo}) * {} + {mo} * var * {}", ld("rv"), c_double(count / (count - 1.0)))),
        );
    }
    let entry = entry_name(ni, "bn_finalize_fast");
    let source = format!(
        "extern \"C\" __global__ void __launch_bounds__(256) {entry}({}) {{\n    for (i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x; c < {c}LL; c += (i64)gridDim.x * blockDim.x) {{\n{body}    }}\n}}\n",
        params.join(", ")
    );
    Some(NodeKernels::one(strided(source, entry, c, args)))
}

// ----------------------------------------------------------------------------------------------
// Pooling backward
// ----------------------------------------------------------------------------------------------

/// 2D max and average pooling backward on NHWC-packed x, dy and dx of one type (f16, bf16,
/// f32), C a multiple of 16 bytes. Averages: one gather launch, a thread per input vector
/// (8 f16/bf16 or 4 f32 channels of one position) summing `dy / divisor` over the outputs
/// whose windows cover it (ascending p, then q, as the CPU adds them). Max: the first launch
/// finds each output's argmax (the CPU's rule: the first maximal real element of the window
/// in row-major order, a NaN beating any number) and stores its window tap as a byte to
/// scratch (`[N, P, Q, C]`); the gather launch adds dy of each covering output whose argmax
/// is this position. Each x, dy and dx element moves once; the argmax bytes once each way.
/// The argmax comes from the strip kernel (`pool_strip`) where the window overlaps along h.
/// The gather walks at most ceil(KH/SH) x ceil(KW/SW) covering outputs in fixed-count
/// unrolled loops (all their dy loads in flight at once), 32-bit indices where they fit.
fn pooling_backward(graph: &Graph, ni: usize, node: &Node, a: &ResampleAttrs, sms: i64) -> Option<NodeKernels> {
    let dy = node.input("dy")?;
    let x = node.input("x")?;
    let dx = node.output("dx")?;
    let (xd, dyd, dxd) = (graph.desc(x), graph.desc(dy), graph.desc(dx));
    let xt = dtype(graph, x);
    if dtype(graph, dy) != xt || dtype(graph, dx) != xt || xd.dims.len() != 4 || [&a.window, &a.stride, &a.pre_padding, &a.post_padding].iter().any(|l| l.len() != 2) {
        return None;
    }
    let helpers = vec_helpers(xt, xt)?;
    if !channels_last(&xd.dims, &xd.strides, true) || !channels_last(&dyd.dims, &dyd.strides, true) || !channels_last(&dxd.dims, &dxd.strides, true) || dxd.dims != xd.dims {
        return None;
    }
    if a.output_dims(&xd.dims).ok()? != dyd.dims {
        return None;
    }
    let vec = (16 / xt.size()) as i64;
    let (n, c, h, w) = (xd.dims[0], xd.dims[1], xd.dims[2], xd.dims[3]);
    let (p, q) = (dyd.dims[2], dyd.dims[3]);
    let (kh, kw, sh, sw) = (a.window[0], a.window[1], a.stride[0], a.stride[1]);
    let max = a.mode == ResampleMode::Max;
    if c % vec != 0 || (max && kh * kw > 254) {
        return None;
    }
    let cv = c / vec;
    // 32-bit index arithmetic when every index and offset fits (as the forward kernels).
    let small = xd.element_count() < (1 << 30) && dyd.element_count() < (1 << 30) && h + kh + sh < (1 << 20) && w + kw + sw < (1 << 20);
    let (iu, is, sfx) = if small { ("unsigned int", "int", "") } else { ("unsigned long long", "long long", "LL") };
    // Most outputs along h (w) whose windows cover one input position.
    let (nph, nqw) = (ceil_div(kh, sh), ceil_div(kw, sw));
    let defs = format!(
        "{helpers}\ntypedef {iu} IU;\ntypedef {is} IS;\n#define C_ {c}{sfx}\n#define CV {cv}{sfx}\n#define H_ {h}{sfx}\n#define W_ {w}{sfx}\n#define P_ {p}{sfx}\n#define Q_ {q}{sfx}\n#define KH {kh}{sfx}\n#define KW {kw}{sfx}\n#define SH {sh}{sfx}\n#define SW {sw}{sfx}\n#define PREH {preh}{sfx}\n#define PREW {prew}{sfx}\n#define POSTH {posth}{sfx}\n#define POSTW {postw}{sfx}\n#define NPH {nph}\n#define NQW {nqw}\n// VEC argmax bytes of one output vector.\ntypedef {ity} IDXW;\nunion IdxV {{ IDXW u; unsigned char b[VEC]; }};\n",
        preh = a.pre_padding[0],
        prew = a.pre_padding[1],
        posth = a.post_padding[0],
        postw = a.post_padding[1],
        ity = if vec == 8 { "unsigned long long" } else { "unsigned int" },
    );
    let mut launches = Vec::new();
    let mut scratch = Vec::new();
    let outs = n * p * q * cv;
    // The strip kernel's argmax mode where it takes the shape (windows overlapping along h).
    let strip = if max { pool_strip(ni, a, xt, &helpers, [n, c, h, w, p, q], sms, StripUse::Argmax, vec![Arg::Ptr(x), Arg::Scratch(0)]) } else { None };
    if let Some(launch) = strip {
        launches.push(launch);
        scratch.push((outs * vec) as usize);
    } else if max {
        let entry = entry_name(ni, "pool_bwd_argmax");
        let source = super::rows::fill(
            r#"@defs@
extern "C" __global__ void __launch_bounds__(256) @entry@(const void* xv, IDXW* idx) {
    const XT* x = (const XT*)xv;
    const bool al = ((unsigned long long)x & 15) == 0;
    for (IU i = (IU)blockIdx.x * blockDim.x + threadIdx.x; i < (IU)@outs@LL; i += (IU)gridDim.x * blockDim.x) {
        // Output vector i = ((n * P + p) * Q + q) * CV + v.
        const IS v = (IS)(i % (IU)CV);
        IU t = i / (IU)CV;
        const IS oq = (IS)(t % (IU)Q_);
        t /= (IU)Q_;
        const IS op = (IS)(t % (IU)P_);
        const IS on = (IS)(t / (IU)P_);
        const IS h0 = op * SH - PREH, w0 = oq * SW - PREW;
        const XT* base = x + on * (H_ * W_ * C_) + v * VEC;
        float best[VEC];
        IdxV r;
#pragma unroll
        for (int k = 0; k < VEC; ++k) { best[k] = 0.f; r.b[k] = 255; }
@unroll@
        for (IS dh = 0; dh < KH; ++dh) {
            const IS hh = h0 + dh;
            if (hh < 0 || hh >= H_) continue;
@unroll@
            for (IS dw = 0; dw < KW; ++dw) {
                const IS ww = w0 + dw;
                if (ww < 0 || ww >= W_) continue;
                float f[VEC];
                cvt_x(ldx_raw(base + (hh * W_ + ww) * C_, al), f);
                const unsigned char tap = (unsigned char)(dh * KW + dw);
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    const float e = f[k], b = best[k];
                    if (r.b[k] == 255 || e > b || (e != e && b == b)) { best[k] = e; r.b[k] = tap; }
                }
            }
        }
        idx[i] = r.u;
    }
}
"#,
            &[("defs", defs.clone()), ("entry", entry.clone()), ("outs", outs.to_string()), ("unroll", if kh * kw <= 32 { "#pragma unroll" } else { "#pragma unroll 1" }.into())],
        );
        launches.push(strided(source, entry, outs, vec![Arg::Ptr(x), Arg::Scratch(0)]));
        scratch.push((outs * vec) as usize);
    }
    let (idx_param, idx_arg, take): (&str, Option<Arg>, String) = if max {
        (
            ", const IDXW* idx",
            Some(Arg::Scratch(0)),
            "                        IdxV r;\n                        r.u = idx[o / VEC];\n                        const unsigned char tap = (unsigned char)((h - oh) * KW + (w - ow));\n#pragma unroll\n                        for (int k = 0; k < VEC; ++k) if (r.b[k] == tap) acc[k] += g[k];\n".to_string(),
        )
    } else {
        let div = if a.mode == ResampleMode::AvgIncludePadding {
            "(float)((min(oh + KH, H_ + POSTH) - oh) * (min(ow + KW, W_ + POSTW) - ow))"
        } else {
            "(float)((min(oh + KH, H_) - max(oh, (IS)0)) * (min(ow + KW, W_) - max(ow, (IS)0)))"
        };
        // One division per covering output (not per element).
        (
            "",
            None,
            format!(
                "                        const float inv = 1.f / {div};\n#pragma unroll\n                        for (int k = 0; k < VEC; ++k) acc[k] = fmaf(g[k], inv, acc[k]);\n"
            ),
        )
    };
    let entry = entry_name(ni, &format!("pool_bwd_{}", a.mode.name()));
    let total = n * h * w * cv;
    let source = super::rows::fill(
        r#"@defs@
extern "C" __global__ void __launch_bounds__(256) @entry@(const void* dyv@idxp@, void* dxv) {
    const XT* dy = (const XT*)dyv;
    YT* dx = (YT*)dxv;
    const bool al = ((unsigned long long)dy & 15) == 0 && ((unsigned long long)dx & 15) == 0;
    for (IU i = (IU)blockIdx.x * blockDim.x + threadIdx.x; i < (IU)@total@LL; i += (IU)gridDim.x * blockDim.x) {
        // Input vector i = ((n * H + h) * W + w) * CV + v.
        const IS v = (IS)(i % (IU)CV);
        IU t = i / (IU)CV;
        const IS w = (IS)(t % (IU)W_);
        t /= (IU)W_;
        const IS h = (IS)(t % (IU)H_);
        const IS n = (IS)(t / (IU)H_);
        // Outputs whose windows cover (h, w): p * SH - PREH <= h < p * SH - PREH + KH (at most
        // NPH of them along h, NQW along w: fixed trip counts, so every dy load of the
        // position can be in flight at once).
        const IS ah = h + PREH - KH + 1, aw = w + PREW - KW + 1;
        const IS plo = ah <= 0 ? 0 : (ah + SH - 1) / SH, phi = min(P_ - 1, (h + PREH) / SH);
        const IS qlo = aw <= 0 ? 0 : (aw + SW - 1) / SW, qhi = min(Q_ - 1, (w + PREW) / SW);
        float acc[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[k] = 0.f;
@unroll@
        for (int a = 0; a < NPH; ++a) {
            const IS p = plo + a;
            if (p <= phi) {
                const IS oh = p * SH - PREH;
@unroll@
                for (int b = 0; b < NQW; ++b) {
                    const IS q = qlo + b;
                    if (q <= qhi) {
                        const IS ow = q * SW - PREW;
                        const IS o = ((n * P_ + p) * Q_ + q) * C_ + v * VEC;
                        float g[VEC];
                        cvt_x(ldx_raw(dy + o, al), g);
@take@                    }
                }
            }
        }
        st_y(dx + (IS)i * VEC, al, acc);
    }
}
"#,
        &[
            ("defs", defs),
            ("entry", entry.clone()),
            ("idxp", idx_param.into()),
            ("total", total.to_string()),
            ("take", take),
            ("unroll", if nph * nqw <= 64 { "#pragma unroll" } else { "#pragma unroll 1" }.into()),
        ],
    );
    let mut args = vec![Arg::Ptr(dy)];
    args.extend(idx_arg);
    args.push(Arg::Ptr(dx));
    launches.push(strided(source, entry, total, args));
    Some(NodeKernels { launches, scratch })
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
