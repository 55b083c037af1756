//! Fast row kernels: layernorm and rmsnorm forward (training and inference), softmax and
//! log-softmax forward (with or without the log-sum-exp `stats`), and layernorm and rmsnorm
//! backward (`dx`, `dscale`, `dbias`); softmax and log-softmax backward (`y`, `dy` -> `dx`, rows
//! of at most 16384 elements) and adalayernorm forward (over the last axis; scale and bias
//! `[B or 1, S or 1..., D]`, the row's offset into them from its outer index), both in the
//! forward kernels' lane-team / block-per-row scheme. Also: instancenorm forward and backward
//! with packed spatial axes (a row per (n, c)), adalayernorm backward (the norm backward with
//! rows grouped by scale row), and the prologue fusion of a pointwise chain (add, sub, mul of
//! full-size tensors) into layernorm / rmsnorm ([`prologue_groups`], [`prologue_unit`]).
//!
//! What they accept (anything else returns `None` and runs on the fallback):
//! - f32, f16 and bf16 tensors (any mix); nothing f64, and no node computing in f64;
//! - x (and y, dy, dx) packed row-major over the normalized axes (every axis but 0 for the
//!   norms; for softmax the axis, with every later axis of size 1), rows anywhere (the row
//!   offsets come from the outer dims and strides, baked into the source);
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

use crate::dtype::DataType;
use crate::engine::cuda::kernel::{entry_name, Arg, Grid, Launch, NodeKernels, Pdl, Target, Unit};
use crate::error::Result;
use crate::graph::ops::Op;
use crate::graph::{Graph, Node, TensorId};
use std::collections::HashMap;

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
const MAX_ROW: i64 = 32768;
/// Threads per block of the lane-team (short row) forward kernels.
const TEAM_BLOCK: u32 = 256;
/// Column slices (warps) of the dscale/dbias finalize kernel.
const FIN_SLICES: u32 = 32;

/// Device helpers shared by every kernel here.
const HELPERS: &str = r#"
__device__ __forceinline__ float fr_tof(float v) { return v; }
__device__ __forceinline__ float fr_tof(__half v) { return __half2float(v); }
__device__ __forceinline__ float fr_tof(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void fr_fromf(float v, float& o) { o = v; }
__device__ __forceinline__ void fr_fromf(float v, __half& o) { o = __float2half_rn(v); }
__device__ __forceinline__ void fr_fromf(float v, __nv_bfloat16& o) { o = __float2bfloat16_rn(v); }

// V consecutive elements from p, as floats: 16- or 8-byte loads when `al` (the caller checked
// the alignment), else one element at a time.
template <typename T, int V>
__device__ __forceinline__ void fr_ld(const T* p, float* v, bool al) {
    constexpr int B = V * (int)sizeof(T);
    if constexpr (B % 16 == 0) {
        if (al) {
            uint4 q[B / 16];
#pragma unroll
            for (int k = 0; k < B / 16; ++k) q[k] = __ldg(reinterpret_cast<const uint4*>(p) + k);
            const T* e = reinterpret_cast<const T*>(q);
#pragma unroll
            for (int i = 0; i < V; ++i) v[i] = fr_tof(e[i]);
            return;
        }
    } else if constexpr (B % 8 == 0) {
        if (al) {
            uint2 q[B / 8];
#pragma unroll
            for (int k = 0; k < B / 8; ++k) q[k] = __ldg(reinterpret_cast<const uint2*>(p) + k);
            const T* e = reinterpret_cast<const T*>(q);
#pragma unroll
            for (int i = 0; i < V; ++i) v[i] = fr_tof(e[i]);
            return;
        }
    }
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = fr_tof(p[i]);
}

// V floats to consecutive elements at p, rounded to nearest even; vector stores when `al`.
template <typename T, int V>
__device__ __forceinline__ void fr_st(T* p, const float* v, bool al) {
    constexpr int B = V * (int)sizeof(T);
    if constexpr (B % 16 == 0) {
        if (al) {
            uint4 q[B / 16];
            T* e = reinterpret_cast<T*>(q);
#pragma unroll
            for (int i = 0; i < V; ++i) fr_fromf(v[i], e[i]);
#pragma unroll
            for (int k = 0; k < B / 16; ++k) reinterpret_cast<uint4*>(p)[k] = q[k];
            return;
        }
    } else if constexpr (B % 8 == 0) {
        if (al) {
            uint2 q[B / 8];
            T* e = reinterpret_cast<T*>(q);
#pragma unroll
            for (int i = 0; i < V; ++i) fr_fromf(v[i], e[i]);
#pragma unroll
            for (int k = 0; k < B / 8; ++k) reinterpret_cast<uint2*>(p)[k] = q[k];
            return;
        }
    }
#pragma unroll
    for (int i = 0; i < V; ++i) fr_fromf(v[i], p[i]);
}

// The raw bytes of V consecutive elements of type T, as 32-bit words (kept in registers while
// a load is in flight), loaded with 16- or 8-byte accesses when `al`.
template <typename T, int V>
struct alignas((V * sizeof(T)) % 16 == 0 ? 16 : ((V * sizeof(T)) % 8 == 0 ? 8 : 4)) FrRaw {
    unsigned w[(V * sizeof(T) + 3) / 4];
};
template <typename T, int V>
__device__ __forceinline__ void fr_ldraw(const T* p, FrRaw<T, V>& r, bool al) {
    constexpr int B = V * (int)sizeof(T);
    if constexpr (B % 16 == 0) {
        if (al) {
#pragma unroll
            for (int k = 0; k < B / 16; ++k) reinterpret_cast<uint4*>(r.w)[k] = __ldg(reinterpret_cast<const uint4*>(p) + k);
            return;
        }
    } else if constexpr (B % 8 == 0) {
        if (al) {
#pragma unroll
            for (int k = 0; k < B / 8; ++k) reinterpret_cast<uint2*>(r.w)[k] = __ldg(reinterpret_cast<const uint2*>(p) + k);
            return;
        }
    }
    T* e = reinterpret_cast<T*>(r.w);
#pragma unroll
    for (int i = 0; i < V; ++i) e[i] = p[i];
}
template <typename T, int V>
__device__ __forceinline__ void fr_zero(FrRaw<T, V>& r) {
#pragma unroll
    for (int k = 0; k < (int)(sizeof(r.w) / 4); ++k) r.w[k] = 0u;
}
template <typename T, int V>
__device__ __forceinline__ void fr_cvt(const FrRaw<T, V>& r, float* v) {
    const T* e = reinterpret_cast<const T*>(r.w);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = fr_tof(e[i]);
}

// Sums of v[0..K) over a team of TS threads; every member gets the same bits. TS <= 32: a
// group of lanes of one warp (xor butterfly: a + b == b + a, so all lanes agree); TS > 32: the
// whole block (TS == blockDim.x), the warps' sums meeting in sh (32 * K floats) and added in
// warp order. Every thread of the warp (block) must call it.
template <int TS, int K>
__device__ __forceinline__ void fr_sum(float* v, float* sh) {
    constexpr int W = TS < 32 ? TS : 32;
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) {
#pragma unroll
        for (int k = 0; k < K; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], o);
    }
    if constexpr (TS > 32) {
        const int w = threadIdx.x >> 5;
        if ((threadIdx.x & 31) == 0) {
#pragma unroll
            for (int k = 0; k < K; ++k) sh[k * 32 + w] = v[k];
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < K; ++k) {
            float s = sh[k * 32];
#pragma unroll
            for (int i = 1; i < TS / 32; ++i) s += sh[k * 32 + i];
            v[k] = s;
        }
    }
}

// Maximum of v over a team, as fr_sum.
template <int TS>
__device__ __forceinline__ float fr_max(float v, float* sh) {
    constexpr int W = TS < 32 ? TS : 32;
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if constexpr (TS > 32) {
        const int w = threadIdx.x >> 5;
        if ((threadIdx.x & 31) == 0) sh[w] = v;
        __syncthreads();
        float m = sh[0];
#pragma unroll
        for (int i = 1; i < TS / 32; ++i) m = fmaxf(m, sh[i]);
        v = m;
    }
    return v;
}
"#;

/// The C type of a tensor element, for the types the kernels here take.
fn ctype(dt: DataType) -> Option<&'static str> {
    match dt {
        DataType::F32 => Some("float"),
        DataType::F16 => Some("__half"),
        DataType::Bf16 => Some("__nv_bfloat16"),
        _ => None,
    }
}

/// How a kernel reaches one tensor's rows.
struct RowT {
    id: TensorId,
    ty: &'static str,
    /// Offset (elements) of row `r`'s first element: a C expression in `r`.
    off: String,
    /// Whether every row start is aligned for `V`-element vector accesses (plan-time part).
    vec_ok: bool,
    /// The base-pointer alignment (bytes) the vector accesses need.
    align: usize,
}

impl RowT {
    /// Bytes per element.
    fn ty_size(&self) -> i64 {
        match self.ty {
            "float" => 4,
            _ => 2,
        }
    }
}

/// The kernels' parameter list and the matching launch arguments, built together.
#[derive(Default)]
struct Sig {
    params: Vec<String>,
    args: Vec<Arg>,
}

impl Sig {
    fn ptr(&mut self, name: &str, id: TensorId, write: bool) {
        self.params.push(format!("{}void* {name}", if write { "" } else { "const " }));
        self.args.push(Arg::Ptr(id));
    }
    fn scratch(&mut self, name: &str, i: usize, write: bool) {
        self.params.push(format!("{}float* {name}", if write { "" } else { "const " }));
        self.args.push(Arg::Scratch(i));
    }
    fn list(&self) -> String {
        self.params.join(", ")
    }
}

/// Replace each `@key@` of a template.
pub(super) fn fill(template: &str, subs: &[(&str, String)]) -> String {
    let mut s = template.to_string();
    for (k, v) in subs {
        s = s.replace(&format!("@{k}@"), v);
    }
    debug_assert!(!s.contains("@"), "unfilled template key in {s}");
    s
}

/// Elements per chunk: 8 for 2-byte x, 4 for f32 x, when that divides the row; else 1.
fn vec_width(x: DataType, h: i64) -> i64 {
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
fn forward_team(h: i64, c: i64, v: i64) -> Option<(u32, u32, i64)> {
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
fn norm_team(h: i64, c: i64, v: i64) -> Option<(u32, u32, i64)> {
    if h > 1024 && h <= MAX_ROW {
        if let Some(cpt) = [256, 512, 1024].into_iter().map(|t| (c + t - 1) / t).find(|&cpt| cpt * v <= 16) {
            let bs = ((c + cpt - 1) / cpt + 31) / 32 * 32;
            return Some((bs as u32, bs as u32, cpt));
        }
    }
    forward_team(h, c, v)
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

/// An f32 literal for a positive normal epsilon, or None.
fn f32_literal(v: f64) -> Option<String> {
    let f = v as f32;
    if f.is_normal() && f > 0.0 {
        Some(format!("{f:e}f"))
    } else {
        None
    }
}

/// The loop over a forward kernel's rows: `r` (the row), `ok` (r < N) and `lt` (the thread's
/// place in its team) are defined inside; lane teams share the warp's trip count so that the
/// shuffles see every lane.
fn row_loop(ts: u32, bs: u32, body: &str) -> String {
    if ts <= 32 {
        format!(
            r#"    const int lane = threadIdx.x & 31;
    const int lt = lane & (TS - 1);
    const i64 gw = ((i64)blockIdx.x * BS + threadIdx.x) >> 5;
    const i64 nw = ((i64)gridDim.x * BS) >> 5;
    for (i64 r0 = gw * (32 / TS); r0 < N; r0 += nw * (32 / TS)) {{
        const i64 r = r0 + lane / TS;
        const bool ok = r < N;
{body}    }}
"#
        )
    } else {
        debug_assert_eq!(ts, bs);
        format!(
            r#"    const int lt = threadIdx.x;
    for (i64 r = blockIdx.x; r < N; r += gridDim.x) {{
        const bool ok = true;
{body}    }}
"#
        )
    }
}

/// The code generator for one node.
struct Gen<'a> {
    graph: &'a Graph,
    node: &'a Node,
    ni: usize,
    /// SMs of the target (for one-wave and persistent grids).
    sms: i64,
}

impl Gen<'_> {
    fn dt(&self, id: TensorId) -> DataType {
        self.graph.resolved_data_type(id).unwrap_or(DataType::F32)
    }

    fn dims(&self, id: TensorId) -> &[i64] {
        &self.graph.desc(id).dims
    }

    /// The rows of tensor `id` whose axes `first..` are the normalized ones (rows run over the
    /// axes before). With `packed`, the normalized axes must be packed row-major (size-1 axes
    /// aside); otherwise they must all be 1 (statistics). `v`: elements per vector access.
    fn rows(&self, id: TensorId, first: usize, v: i64, packed: bool) -> Option<RowT> {
        let d = self.graph.desc(id);
        let dt = self.dt(id);
        let ty = ctype(dt)?;
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
        Some(RowT { id, ty, off, vec_ok, align: align as usize })
    }

    /// A scale-like tensor (scale, bias, dscale, dbias) of x dims `xd`: `[1, xd[1..]...]`,
    /// packed.
    fn param(&self, id: TensorId, xd: &[i64], v: i64) -> Option<RowT> {
        let d = self.dims(id);
        if d.len() != xd.len() || d[0] != 1 || d[1..] != xd[1..] {
            return None;
        }
        self.rows(id, 1, v, true)
    }

    /// The uniform alignment flag of a kernel's vector accesses: false at plan time when a
    /// row stride does not allow them, else a run-time check of the base pointers.
    fn align_flag(v: i64, tensors: &[(&str, &RowT)]) -> String {
        if v == 1 || tensors.iter().any(|(_, t)| !t.vec_ok) {
            return "false".into();
        }
        let checks: Vec<String> = tensors.iter().map(|(p, t)| format!("((unsigned long long)({p}) & {}ULL) == 0", t.align - 1)).collect();
        checks.join(" && ")
    }

    fn entry(&self, what: &str) -> String {
        entry_name(self.ni, what)
    }

    /// layernorm (`rms` false) and rmsnorm forward.
    fn norm_forward(&self, eps: f64, rms: bool) -> Option<NodeKernels> {
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
        let eps = f32_literal(eps)?;
        let xt = self.rows(x, 1, v, true)?;
        let yt = self.rows(y, 1, v, true)?;
        let st = self.param(scale, &xd, v)?;
        let bt = match bias {
            Some(b) => Some(self.param(b, &xd, v)?),
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

        let mut sig = Sig::default();
        let mut decl = String::new();
        sig.ptr("xp", x, false);
        sig.ptr("scp", scale, false);
        decl += &format!("    const {tx}* x = (const {tx}*)xp;\n    const {ts}* sc = (const {ts}*)scp;\n", tx = xt.ty, ts = st.ty);
        let mut vec_tensors = vec![("x", &xt), ("y", &yt), ("sc", &st)];
        if let Some(b) = &bt {
            sig.ptr("bip", b.id, false);
            decl += &format!("    const {t}* bi = (const {t}*)bip;\n", t = b.ty);
            vec_tensors.push(("bi", b));
        }
        sig.ptr("yp", y, true);
        decl += &format!("    {t}* y = ({t}*)yp;\n", t = yt.ty);
        let mut stats = String::new();
        if let Some(m) = &mt {
            sig.ptr("mop", m.id, true);
            decl += &format!("    {t}* mo = ({t}*)mop;\n", t = m.ty);
            stats += &format!("            fr_fromf(mean, mo[{}]);\n", m.off);
        }
        if let Some(i) = &it {
            sig.ptr("ivp", i.id, true);
            decl += &format!("    {t}* iv = ({t}*)ivp;\n", t = i.ty);
            stats += &format!("            fr_fromf(inv, iv[{}]);\n", i.off);
        }
        let al = Self::align_flag(v, &vec_tensors);
        if ts > 32 {
            // A block per row, persistent: see `norm_forward_block`.
            let entry = self.entry(if rms { "rmsnorm_rows" } else { "layernorm_rows" });
            let xs = self.dt(x).size() as i64;
            let ps = st.ty_size() + bt.as_ref().map_or(0, |b| b.ty_size());
            return Some(self.norm_forward_block(NormBlock { entry, sig, decl, al, stats, rms, eps, rows, h, c, v, cpt, bs, xs, ps, xt, yt, st, bt }));
        }
        let mean_pass = if rms {
            String::new()
        } else {
            r#"        {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < CPT; ++k)
#pragma unroll
                for (int i = 0; i < V; ++i) s += v[k][i];
            fr_sum<TS, 1>(&s, red + (rb++ & 1) * 32);
            mean = s / HF;
        }
"#
            .to_string()
        };
        let (load_bias, bias_term) = match &bt {
            Some(b) => (format!("                float b[V];\n                fr_ld<{}, V>(bi + (i64)c * V, b, al);\n", b.ty), " + b[i]"),
            None => (String::new(), ""),
        };
        let body = fill(
            r#"        const i64 xo = @offx@, yo = @offy@;
        float v[CPT][V];
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * TS;
            if (ok && c < C) {
                fr_ld<@tx@, V>(x + xo + (i64)c * V, v[k], al);
            } else {
#pragma unroll
                for (int i = 0; i < V; ++i) v[k][i] = 0.0f;
            }
        }
        float mean = 0.0f;
@mean_pass@        float q = 0.0f;
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            if (lt + k * TS < C) {
#pragma unroll
                for (int i = 0; i < V; ++i) {
                    const float d = v[k][i] - mean;
                    q += d * d;
                }
            }
        }
        fr_sum<TS, 1>(&q, red + (rb++ & 1) * 32);
        const float inv = 1.0f / sqrtf(q / HF + EPS);
        if (ok && lt == 0) {
@stats@        }
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * TS;
            if (ok && c < C) {
                float s[V], o[V];
                fr_ld<@tsc@, V>(sc + (i64)c * V, s, al);
@load_bias@#pragma unroll
                for (int i = 0; i < V; ++i) o[i] = (v[k][i] - mean) * inv * s[i]@bias_term@;
                fr_st<@ty@, V>(y + yo + (i64)c * V, o, al);
            }
        }
"#,
            &[
                ("offx", xt.off.clone()),
                ("offy", yt.off.clone()),
                ("tx", xt.ty.into()),
                ("mean_pass", mean_pass),
                ("stats", stats),
                ("tsc", st.ty.into()),
                ("load_bias", load_bias),
                ("bias_term", bias_term.into()),
                ("ty", yt.ty.into()),
            ],
        );
        let entry = self.entry(if rms { "rmsnorm_rows" } else { "layernorm_rows" });
        let source = self.kernel(
            &entry,
            &sig,
            (bs, 1),
            &[("N", rows), ("C", c), ("V", v), ("CPT", cpt), ("TS", ts as i64), ("BS", bs as i64)],
            h,
            &eps,
            &decl,
            &al,
            1,
            &row_loop(ts, bs, &body),
        );
        let threads = rows as u64 * ts as u64;
        Some(NodeKernels::one(Launch { source, entry, grid: Grid::Cover(threads), block: bs, shared_bytes: 0, args: sig.args, cluster: None, pdl: Pdl::Dependent }))
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
        let NormBlock { entry, sig, decl, al, stats, rms, eps, rows, h, c, v, cpt, bs, xs, ps, xt, yt, st, bt } = b;
        let e = cpt * v;
        // Per thread: the row (raw), the next row (raw), scale and bias (raw).
        let raw = e * xs / 4;
        let pre = 2 * raw <= BLOCK_NORM_DATA_REGS;
        let keep = raw + if pre { raw } else { 0 } + e * ps / 4 <= BLOCK_NORM_DATA_REGS;
        // Registers left for a second row in flight (rmsnorm, with no bias and one sum, has
        // them where layernorm has not): two rows' loads fly during each reduction, twice the
        // bytes in flight per SM.
        let pre2 = pre && 3 * raw + e * ps / 4 <= BLOCK_NORM_DATA_REGS;
        let per_sm = block_norm_per_sm(bs);
        let slots = self.sms * per_sm as i64;
        // At least 3 rows per block (when there are that many): the prefetch and the reuse of
        // the reduction buffers run even on small problems (and in the check cases).
        let per_block = ((rows + slots - 1) / slots).max(3);
        let grid = ((rows + per_block - 1) / per_block).max(1);
        let tsc = st.ty;
        let (param_regs, get_s, get_b, bias_term) = {
            let mut regs = String::new();
            let (gs, mut gb, mut bt_) = (if keep { "fr_cvt(psc[k], s);".to_string() } else { format!("fr_ld<{tsc}, V>(sc + (i64)c * V, s, al);") }, String::new(), "");
            if keep {
                regs += &format!("    FrRaw<{tsc}, V> psc[CPT];\n");
                if let Some(b) = &bt {
                    regs += &format!("    FrRaw<{}, V> pbi[CPT];\n", b.ty);
                }
                regs += "#pragma unroll\n    for (int k = 0; k < CPT; ++k) {\n        const int c = lt + k * BS;\n        if (c < C) {\n";
                regs += &format!("            fr_ldraw<{tsc}, V>(sc + (i64)c * V, psc[k], al);\n");
                if let Some(b) = &bt {
                    regs += &format!("            fr_ldraw<{}, V>(bi + (i64)c * V, pbi[k], al);\n", b.ty);
                }
                regs += "        } else {\n            fr_zero(psc[k]);\n";
                if bt.is_some() {
                    regs += "            fr_zero(pbi[k]);\n";
                }
                regs += "        }\n    }\n";
            }
            if let Some(b) = &bt {
                gb = if keep { "fr_cvt(pbi[k], bb);".to_string() } else { format!("fr_ld<{}, V>(bi + (i64)c * V, bb, al);", b.ty) };
                bt_ = " + bb[i]";
            }
            (regs, gs, gb, bt_)
        };
        // The step of one row once its raw elements are in `cx` (and K in `K`): the statistics,
        // then y.
        let compute = r#"        // t[0] = sum(x - K), t[1] = sum((x - K)^2) (rmsnorm: K = 0, only t[1]).
        float t[2] = {0.0f, 0.0f};
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            if (lt + k * BS < C) {
                float v[V];
                fr_cvt(cx[k], v);
#pragma unroll
                for (int i = 0; i < V; ++i) {
                    const float d = v[i] - K;
                    if (!RMS) t[0] += d;
                    t[1] += d * d;
                }
            }
        }
        fr_sum<BS, NR>(t + (2 - NR), red + (rb++ & 1) * (32 * 2));
        const float dm = RMS ? 0.0f : t[0] / HF;
        const float mean = RMS ? 0.0f : K + dm;
        const float var = RMS ? t[1] / HF : fmaxf(t[1] / HF - dm * dm, 0.0f);
        const float inv = 1.0f / sqrtf(var + EPS);
        const i64 yo = @offy@;
        if (lt == 0) {
@stats@        }
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * BS;
            if (c < C) {
                float v[V], s[V], bb[V], o[V];
                (void)bb;
                fr_cvt(cx[k], v);
                @get_s@
                @get_b@
#pragma unroll
                for (int i = 0; i < V; ++i) o[i] = (v[i] - mean) * inv * s[i]@bias_term@;
                fr_st<@ty@, V>(y + yo + (i64)c * V, o, al);
            }
        }
"#;
        let template = if pre2 {
            // Two rows in flight (rows r + G and r + 2G while row r reduces), in two register
            // buffers taken in turn: the loop is unrolled by two so each buffer keeps its
            // registers.
            format!(
                r#"    const int lt = threadIdx.x;
@param_regs@    FrRaw<@tx@, V> rxa[CPT], rxb[CPT];
    float pka = 0.0f, pkb = 0.0f;
    auto fetch = [&](FrRaw<@tx@, V> (&rx)[CPT], float& pk, i64 r) {{
        const i64 xo = @offx@;
        if (!RMS) pk = fr_tof(x[xo]);
#pragma unroll
        for (int k = 0; k < CPT; ++k) {{
            const int c = lt + k * BS;
            if (c < C) fr_ldraw<@tx@, V>(x + xo + (i64)c * V, rx[k], al);
            else fr_zero(rx[k]);
        }}
    }};
    const i64 G = gridDim.x;
    auto step = [&](FrRaw<@tx@, V> (&rx)[CPT], float& pk, i64 r) {{
        FrRaw<@tx@, V> cx[CPT];
#pragma unroll
        for (int k = 0; k < CPT; ++k) cx[k] = rx[k];
        const float K = pk;
        if (r + 2 * G < N) fetch(rx, pk, r + 2 * G);
{compute}    }};
    if ((i64)blockIdx.x < N) fetch(rxa, pka, (i64)blockIdx.x);
    if ((i64)blockIdx.x + G < N) fetch(rxb, pkb, (i64)blockIdx.x + G);
    for (i64 r = blockIdx.x; r < N; r += 2 * G) {{
        step(rxa, pka, r);
        if (r + G < N) step(rxb, pkb, r + G);
    }}
"#
            )
        } else {
            format!(
                r#"    const int lt = threadIdx.x;
@param_regs@    FrRaw<@tx@, V> rx[CPT];
    float pk = 0.0f;
    auto fetch = [&](i64 r) {{
        const i64 xo = @offx@;
        if (!RMS) pk = fr_tof(x[xo]);
#pragma unroll
        for (int k = 0; k < CPT; ++k) {{
            const int c = lt + k * BS;
            if (c < C) fr_ldraw<@tx@, V>(x + xo + (i64)c * V, rx[k], al);
            else fr_zero(rx[k]);
        }}
    }};
    if (PRE && (i64)blockIdx.x < N) fetch((i64)blockIdx.x);
    for (i64 r = blockIdx.x; r < N; r += gridDim.x) {{
        if (!PRE) fetch(r);
        // The row stays raw in registers (converted again for the output).
        FrRaw<@tx@, V> cx[CPT];
#pragma unroll
        for (int k = 0; k < CPT; ++k) cx[k] = rx[k];
        const float K = pk;
        if (PRE && r + (i64)gridDim.x < N) fetch(r + (i64)gridDim.x);
{compute}    }}
"#
            )
        };
        let body = fill(
            &template,
            &[
                ("param_regs", param_regs),
                ("tx", xt.ty.into()),
                ("offx", xt.off.clone()),
                ("offy", yt.off.clone()),
                ("stats", stats),
                ("get_s", get_s),
                ("get_b", get_b),
                ("bias_term", bias_term.into()),
                ("ty", yt.ty.into()),
            ],
        );
        let source = self.kernel(
            &entry,
            &sig,
            (bs, per_sm),
            &[("N", rows), ("C", c), ("V", v), ("CPT", cpt), ("BS", bs as i64), ("PRE", pre as i64), ("RMS", rms as i64), ("NR", if rms { 1 } else { 2 })],
            h,
            &eps,
            &decl,
            &al,
            2,
            &body,
        );
        let grid = grid as u32;
        NodeKernels::one(Launch { source, entry, grid: Grid::Exact(grid, 1, 1), block: bs, shared_bytes: 0, args: sig.args, cluster: None, pdl: Pdl::Dependent })
    }

    /// Softmax / log-softmax forward over `axis` (every later axis of size 1).
    fn softmax(&self, axis: usize, log: bool) -> Option<NodeKernels> {
        let n = self.node;
        let x = n.input("x")?;
        let y = n.output("y")?;
        let stats = n.output("stats");
        let xd = self.dims(x).to_vec();
        if axis >= xd.len() || xd[axis + 1..].iter().any(|&d| d != 1) || self.dims(y) != xd.as_slice() {
            return None;
        }
        let rows: i64 = xd[..axis].iter().product();
        let h = xd[axis];
        let v = vec_width(self.dt(x), h);
        let c = h / v;
        let (ts, bs, cpt) = forward_team(h, c, v)?;
        let xt = self.rows(x, axis, v, true)?;
        let yt = self.rows(y, axis, v, true)?;
        let lt = match stats {
            Some(s) => Some(self.rows(s, axis, 1, false)?),
            None => None,
        };
        let mut sig = Sig::default();
        sig.ptr("xp", x, false);
        sig.ptr("yp", y, true);
        let mut decl = format!("    const {tx}* x = (const {tx}*)xp;\n    {ty}* y = ({ty}*)yp;\n", tx = xt.ty, ty = yt.ty);
        let mut store_stats = String::new();
        if let Some(s) = &lt {
            sig.ptr("stp", s.id, true);
            decl += &format!("    {t}* st = ({t}*)stp;\n", t = s.ty);
            store_stats = format!("        if (ok && lt == 0) fr_fromf(lse, st[{}]);\n", s.off);
        }
        let al = Self::align_flag(v, &[("x", &xt), ("y", &yt)]);
        // f32 outputs get the accurate exponential; 2-byte outputs the fast one.
        let exp = if self.dt(y) == DataType::F32 { "expf" } else { "__expf" };
        let (keep, out) = if log { ("", "v[k][i] - lse") } else { ("                    v[k][i] = e;\n", "v[k][i] * rs") };
        let body = fill(
            r#"        const i64 xo = @offx@, yo = @offy@;
        float v[CPT][V];
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * TS;
            if (ok && c < C) {
                fr_ld<@tx@, V>(x + xo + (i64)c * V, v[k], al);
            } else {
#pragma unroll
                for (int i = 0; i < V; ++i) v[k][i] = 0.0f;
            }
        }
        float m = __int_as_float(0xff800000);
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            if (lt + k * TS < C) {
#pragma unroll
                for (int i = 0; i < V; ++i) m = fmaxf(m, v[k][i]);
            }
        }
        m = fr_max<TS>(m, red + (rb++ & 1) * 32);
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            if (lt + k * TS < C) {
#pragma unroll
                for (int i = 0; i < V; ++i) {
                    const float e = @exp@(v[k][i] - m);
@keep@                    s += e;
                }
            }
        }
        fr_sum<TS, 1>(&s, red + (rb++ & 1) * 32);
        const float lse = m + logf(s);
        const float rs = 1.0f / s;
        (void)rs;
@store_stats@#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * TS;
            if (ok && c < C) {
                float o[V];
#pragma unroll
                for (int i = 0; i < V; ++i) o[i] = @out@;
                fr_st<@ty@, V>(y + yo + (i64)c * V, o, al);
            }
        }
"#,
            &[
                ("offx", xt.off.clone()),
                ("offy", yt.off.clone()),
                ("tx", xt.ty.into()),
                ("exp", exp.into()),
                ("keep", keep.into()),
                ("store_stats", store_stats),
                ("out", out.into()),
                ("ty", yt.ty.into()),
            ],
        );
        let entry = self.entry(if log { "log_softmax_rows" } else { "softmax_rows" });
        let source = self.kernel(
            &entry,
            &sig,
            (bs, 1),
            &[("N", rows), ("C", c), ("V", v), ("CPT", cpt), ("TS", ts as i64), ("BS", bs as i64)],
            h,
            "0.0f",
            &decl,
            &al,
            1,
            &row_loop(ts, bs, &body),
        );
        let threads = rows as u64 * ts as u64;
        Some(NodeKernels::one(Launch { source, entry, grid: Grid::Cover(threads), block: bs, shared_bytes: 0, args: sig.args, cluster: None, pdl: Pdl::Dependent }))
    }

    /// Softmax / log-softmax backward over `axis` (every later axis of size 1): `y`, `dy` ->
    /// `dx`; softmax: `dx = y * (dy - sum(dy * y))`, log-softmax: `dx = dy - exp(y) * sum(dy)`.
    /// Both rows stay in registers between the row sum and the write.
    fn softmax_backward(&self, axis: usize, log: bool) -> Option<NodeKernels> {
        let n = self.node;
        let y = n.input("y")?;
        let dy = n.input("dy")?;
        let dx = n.output("dx")?;
        let yd = self.dims(y).to_vec();
        if axis >= yd.len() || yd[axis + 1..].iter().any(|&d| d != 1) || self.dims(dy) != yd.as_slice() || self.dims(dx) != yd.as_slice() {
            return None;
        }
        let rows: i64 = yd[..axis].iter().product();
        let h = yd[axis];
        // Two rows per thread in registers: at most 16384 elements (16 of each per thread).
        if h > MAX_ROW / 2 {
            return None;
        }
        let v = vec_width(self.dt(y), h);
        let c = h / v;
        let (ts, bs, cpt) = norm_team(h, c, v)?;
        let yt = self.rows(y, axis, v, true)?;
        let dyt = self.rows(dy, axis, v, true)?;
        let dxt = self.rows(dx, axis, v, true)?;
        let mut sig = Sig::default();
        sig.ptr("yp", y, false);
        sig.ptr("dyp", dy, false);
        sig.ptr("dxp", dx, true);
        let decl =
            format!("    const {ty}* y = (const {ty}*)yp;\n    const {tdy}* dy = (const {tdy}*)dyp;\n    {tdx}* dx = ({tdx}*)dxp;\n", ty = yt.ty, tdy = dyt.ty, tdx = dxt.ty);
        let al = Self::align_flag(v, &[("y", &yt), ("dy", &dyt), ("dx", &dxt)]);
        let exp = if self.dt(dx) == DataType::F32 { "expf" } else { "__expf" };
        let (term, out) = if log { ("g[k][i]", format!("g[k][i] - {exp}(u[k][i]) * s")) } else { ("g[k][i] * u[k][i]", "u[k][i] * (g[k][i] - s)".to_string()) };
        let body = fill(
            r#"        const i64 yo = @offy@, dyo = @offdy@, dxo = @offdx@;
        float u[CPT][V], g[CPT][V];
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * TS;
            if (ok && c < C) {
                fr_ld<@ty@, V>(y + yo + (i64)c * V, u[k], al);
                fr_ld<@tdy@, V>(dy + dyo + (i64)c * V, g[k], al);
            } else {
#pragma unroll
                for (int i = 0; i < V; ++i) {
                    u[k][i] = 0.0f;
                    g[k][i] = 0.0f;
                }
            }
        }
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            if (lt + k * TS < C) {
#pragma unroll
                for (int i = 0; i < V; ++i) s += @term@;
            }
        }
        fr_sum<TS, 1>(&s, red + (rb++ & 1) * 32);
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * TS;
            if (ok && c < C) {
                float o[V];
#pragma unroll
                for (int i = 0; i < V; ++i) o[i] = @out@;
                fr_st<@tdx@, V>(dx + dxo + (i64)c * V, o, al);
            }
        }
"#,
            &[
                ("offy", yt.off.clone()),
                ("offdy", dyt.off.clone()),
                ("offdx", dxt.off.clone()),
                ("ty", yt.ty.into()),
                ("tdy", dyt.ty.into()),
                ("tdx", dxt.ty.into()),
                ("term", term.into()),
                ("out", out),
            ],
        );
        let entry = self.entry(if log { "log_softmax_bwd_rows" } else { "softmax_bwd_rows" });
        let source = self.kernel(
            &entry,
            &sig,
            (bs, 1),
            &[("N", rows), ("C", c), ("V", v), ("CPT", cpt), ("TS", ts as i64), ("BS", bs as i64)],
            h,
            "0.0f",
            &decl,
            &al,
            1,
            &row_loop(ts, bs, &body),
        );
        let threads = rows as u64 * ts as u64;
        Some(NodeKernels::one(Launch { source, entry, grid: Grid::Cover(threads), block: bs, shared_bytes: 0, args: sig.args, cluster: None, pdl: Pdl::Dependent }))
    }

    /// A scale-like tensor of adalayernorm over an x of dims `xd`: dims `[B or 1, S or 1...,
    /// D]`, the last axis packed; the offset of row `r` (rows over x's axes before the last)
    /// follows the axes where it is full (broadcast over the others).
    fn ada_param(&self, id: TensorId, xd: &[i64], v: i64) -> Option<RowT> {
        let d = self.graph.desc(id);
        let dt = self.dt(id);
        let ty = ctype(dt)?;
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
        Some(RowT { id, ty, off, vec_ok, align: align as usize })
    }

    /// adalayernorm forward: layernorm over the last axis, scale and bias per row group
    /// (`ada_param`); the statistics pass of the lane-team norms (two passes over the row
    /// in registers), a lane team or a block per row.
    fn adalayernorm(&self, eps: f64) -> Option<NodeKernels> {
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
        let eps = f32_literal(eps)?;
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
        let mut sig = Sig::default();
        sig.ptr("xp", x, false);
        sig.ptr("scp", scale, false);
        sig.ptr("bip", bias, false);
        sig.ptr("yp", y, true);
        let mut decl = format!(
            "    const {tx}* x = (const {tx}*)xp;\n    const {ts}* sc = (const {ts}*)scp;\n    const {tb}* bi = (const {tb}*)bip;\n    {ty}* y = ({ty}*)yp;\n",
            tx = xt.ty,
            ts = st.ty,
            tb = bt.ty,
            ty = yt.ty
        );
        let mut stats = String::new();
        if let Some(m) = &mt {
            sig.ptr("mop", m.id, true);
            decl += &format!("    {t}* mo = ({t}*)mop;\n", t = m.ty);
            stats += &format!("            fr_fromf(mean, mo[{}]);\n", m.off);
        }
        if let Some(i) = &it {
            sig.ptr("ivp", i.id, true);
            decl += &format!("    {t}* iv = ({t}*)ivp;\n", t = i.ty);
            stats += &format!("            fr_fromf(inv, iv[{}]);\n", i.off);
        }
        let al = Self::align_flag(v, &[("x", &xt), ("y", &yt), ("sc", &st), ("bi", &bt)]);
        let body = fill(
            r#"        const i64 xo = @offx@, yo = @offy@, so = @offs@, bo = @offb@;
        float v[CPT][V];
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * TS;
            if (ok && c < C) {
                fr_ld<@tx@, V>(x + xo + (i64)c * V, v[k], al);
            } else {
#pragma unroll
                for (int i = 0; i < V; ++i) v[k][i] = 0.0f;
            }
        }
        float mean = 0.0f;
        {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < CPT; ++k)
#pragma unroll
                for (int i = 0; i < V; ++i) s += v[k][i];
            fr_sum<TS, 1>(&s, red + (rb++ & 1) * 32);
            mean = s / HF;
        }
        float q = 0.0f;
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            if (lt + k * TS < C) {
#pragma unroll
                for (int i = 0; i < V; ++i) {
                    const float d = v[k][i] - mean;
                    q += d * d;
                }
            }
        }
        fr_sum<TS, 1>(&q, red + (rb++ & 1) * 32);
        const float inv = 1.0f / sqrtf(q / HF + EPS);
        if (ok && lt == 0) {
@stats@        }
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * TS;
            if (ok && c < C) {
                float s[V], b[V], o[V];
                fr_ld<@tsc@, V>(sc + so + (i64)c * V, s, al);
                fr_ld<@tb@, V>(bi + bo + (i64)c * V, b, al);
#pragma unroll
                for (int i = 0; i < V; ++i) o[i] = (v[k][i] - mean) * inv * s[i] + b[i];
                fr_st<@ty@, V>(y + yo + (i64)c * V, o, al);
            }
        }
"#,
            &[
                ("offx", xt.off.clone()),
                ("offy", yt.off.clone()),
                ("offs", st.off.clone()),
                ("offb", bt.off.clone()),
                ("tx", xt.ty.into()),
                ("stats", stats),
                ("tsc", st.ty.into()),
                ("tb", bt.ty.into()),
                ("ty", yt.ty.into()),
            ],
        );
        let entry = self.entry("adalayernorm_rows");
        let source = self.kernel(
            &entry,
            &sig,
            (bs, 1),
            &[("N", rows), ("C", c), ("V", v), ("CPT", cpt), ("TS", ts as i64), ("BS", bs as i64)],
            h,
            &eps,
            &decl,
            &al,
            1,
            &row_loop(ts, bs, &body),
        );
        let threads = rows as u64 * ts as u64;
        Some(NodeKernels::one(Launch { source, entry, grid: Grid::Cover(threads), block: bs, shared_bytes: 0, args: sig.args, cluster: None, pdl: Pdl::Dependent }))
    }

    /// A kernel: helpers, constants, pointer declarations, the alignment flag, the reduction
    /// buffers (`k` floats per warp, two of them) and the body.
    #[allow(clippy::too_many_arguments)]
    fn kernel(&self, entry: &str, sig: &Sig, (bs, min_blocks): (u32, u32), ints: &[(&str, i64)], h: i64, eps: &str, decl: &str, al: &str, k: usize, body: &str) -> String {
        let mut consts = String::new();
        for (name, value) in ints {
            let ty = if *name == "N" || *name == "RG" { "i64" } else { "int" };
            consts += &format!("    constexpr {ty} {name} = {value};\n");
        }
        format!(
            r#"{HELPERS}
extern "C" __global__ void __launch_bounds__({bs}, {min_blocks}) {entry}({params}) {{
{consts}    constexpr float HF = {h}.0f;
    constexpr float EPS = {eps};
    (void)EPS;
{decl}    const bool al = {al};
    __shared__ float red[2 * 32 * {k}];
    int rb = 0;
    (void)rb;
{body}}}
"#,
            params = sig.list(),
        )
    }

    /// layernorm (`rms` false) and rmsnorm backward: dx, then dscale and dbias from partials.
    ///
    /// With `ada` (adalayernorm backward): rows over x's last axis; scale, dscale and dbias
    /// `[G..., 1..., D]` packed (full leading axes, then ones), so the rows sharing a scale row
    /// are G groups of consecutive rows; each block takes rows of one group (BPG blocks per
    /// group) and the finalize sums each group's partials into its row of dscale and dbias.
    fn norm_backward(&self, rms: bool, ada: bool) -> Option<NodeKernels> {
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

        let mut sig = Sig::default();
        sig.ptr("dyp", dy, false);
        sig.ptr("xp", x, false);
        sig.ptr("scp", scale, false);
        let mut decl = format!(
            "    const {tdy}* dy = (const {tdy}*)dyp;\n    const {tx}* x = (const {tx}*)xp;\n    const {ts}* sc = (const {ts}*)scp;\n",
            tdy = dyt.ty,
            tx = xt.ty,
            ts = st.ty
        );
        let load_mean = match &mt {
            Some(m) => {
                sig.ptr("mnp", m.id, false);
                decl += &format!("    const {t}* mn = (const {t}*)mnp;\n", t = m.ty);
                format!("fr_tof(mn[{}])", m.off)
            }
            None => "0.0f".into(),
        };
        sig.ptr("ivp", it.id, false);
        decl += &format!("    const {t}* iv = (const {t}*)ivp;\n", t = it.ty);
        sig.ptr("dxp", dx, true);
        decl += &format!("    {t}* dx = ({t}*)dxp;\n", t = dxt.ty);
        sig.scratch("pa", 0, true);
        if db {
            sig.scratch("pb", 1, true);
        }
        let al = Self::align_flag(v, &[("x", &xt), ("dy", &dyt), ("dx", &dxt), ("sc", &st)]);
        let (acc_b_decl, acc_b, store_b) = if db {
            (
                "    float ab[CPT][V];\n#pragma unroll\n    for (int k = 0; k < CPT; ++k)\n#pragma unroll\n        for (int i = 0; i < V; ++i) ab[k][i] = 0.0f;\n",
                "                        ab[k][i] += d;\n",
                "            fr_st<float, V>(pb + (i64)blockIdx.x * (C * V) + (i64)c * V, ab[k], pal);\n",
            )
        } else {
            ("", "", "")
        };
        let body = fill(
            r#"    const int lt = threadIdx.x;
    constexpr int RPI = @rpi@;
    const bool pal = V > 1;
    float ax[CPT][V];
#pragma unroll
    for (int k = 0; k < CPT; ++k)
#pragma unroll
        for (int i = 0; i < V; ++i) ax[k][i] = 0.0f;
@acc_b_decl@    // The rows of a step are fetched (raw) while the previous step computes.
    FrRaw<@tx@, V> rx[RPI][CPT];
    FrRaw<@tdy@, V> rd[RPI][CPT];
    float pmu[RPI], prs[RPI];
    // This block's group of rows [gb, rend) and the group's row of scale (at so).
    const i64 gb = (i64)(blockIdx.x / BPG) * RG;
    const i64 rend = gb + RG;
    const i64 so = (i64)(blockIdx.x / BPG) * ((i64)C * V);
    const i64 rfirst = gb + (i64)(blockIdx.x % BPG) * RPI;
    (void)so;
    auto fetch = [&](i64 r0) {
#pragma unroll
        for (int j = 0; j < RPI; ++j) {
            const i64 r = r0 + j;
            const bool ok = r < rend;
            const i64 xo = @offx@, dyo = @offdy@;
            pmu[j] = ok ? @load_mean@ : 0.0f;
            prs[j] = ok ? fr_tof(iv[@offi@]) : 0.0f;
#pragma unroll
            for (int k = 0; k < CPT; ++k) {
                const int c = lt + k * BS;
                if (ok && c < C) {
                    fr_ldraw<@tx@, V>(x + xo + (i64)c * V, rx[j][k], al);
                    fr_ldraw<@tdy@, V>(dy + dyo + (i64)c * V, rd[j][k], al);
                } else {
                    fr_zero(rx[j][k]);
                    fr_zero(rd[j][k]);
                }
            }
        }
    };
    const i64 step = (i64)BPG * RPI;
    if (rfirst < rend) fetch(rfirst);
    for (i64 r0 = rfirst; r0 < rend; r0 += step) {
        float xv[RPI][CPT][V], gv[RPI][CPT][V], mu[RPI], rs[RPI];
#pragma unroll
        for (int j = 0; j < RPI; ++j) {
            mu[j] = pmu[j];
            rs[j] = prs[j];
#pragma unroll
            for (int k = 0; k < CPT; ++k) {
                fr_cvt(rx[j][k], xv[j][k]);
                fr_cvt(rd[j][k], gv[j][k]);
            }
        }
        if (r0 + step < rend) fetch(r0 + step);
        // Per row j: t[2j] = sum(dy * scale), t[2j + 1] = sum(dy * scale * xhat).
        float t[2 * RPI];
#pragma unroll
        for (int j = 0; j < 2 * RPI; ++j) t[j] = 0.0f;
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * BS;
            if (c < C) {
                float s[V];
                fr_ld<@tsc@, V>(sc + so + (i64)c * V, s, al);
#pragma unroll
                for (int j = 0; j < RPI; ++j) {
#pragma unroll
                    for (int i = 0; i < V; ++i) {
                        const float xh = (xv[j][k][i] - mu[j]) * rs[j];
                        const float d = gv[j][k][i];
                        const float g = d * s[i];
                        ax[k][i] += d * xh;
@acc_b@                        t[2 * j] += g;
                        t[2 * j + 1] += g * xh;
                        xv[j][k][i] = xh;
                        gv[j][k][i] = g;
                    }
                }
            }
        }
        fr_sum<BS, 2 * RPI>(t, red + (rb++ & 1) * (32 * 2 * RPI));
#pragma unroll
        for (int j = 0; j < RPI; ++j) {
            const i64 r = r0 + j;
            if (r < rend) {
                const i64 dxo = @offdx@;
                const float mg = @mg@;
                const float mgx = t[2 * j + 1] / HF;
                (void)mg;
#pragma unroll
                for (int k = 0; k < CPT; ++k) {
                    const int c = lt + k * BS;
                    if (c < C) {
                        float o[V];
#pragma unroll
                        for (int i = 0; i < V; ++i) o[i] = rs[j] * (gv[j][k][i]@minus_mg@ - xv[j][k][i] * mgx);
                        fr_st<@tdx@, V>(dx + dxo + (i64)c * V, o, al);
                    }
                }
            }
        }
    }
    // This block's column sums over its rows.
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
        const int c = lt + k * BS;
        if (c < C) {
            fr_st<float, V>(pa + (i64)blockIdx.x * (C * V) + (i64)c * V, ax[k], pal);
@store_b@        }
    }
"#,
            &[
                ("rpi", rpi.to_string()),
                ("acc_b_decl", acc_b_decl.into()),
                ("offx", xt.off.clone()),
                ("offdy", dyt.off.clone()),
                ("load_mean", load_mean),
                ("offi", it.off.clone()),
                ("tx", xt.ty.into()),
                ("tdy", dyt.ty.into()),
                ("tsc", st.ty.into()),
                ("acc_b", acc_b.into()),
                ("offdx", dxt.off.clone()),
                ("mg", if rms { "0.0f".into() } else { "t[2 * j] / HF".into() }),
                ("minus_mg", if rms { String::new() } else { " - mg".into() }),
                ("tdx", dxt.ty.into()),
                ("store_b", store_b.into()),
            ],
        );
        let entry1 = self.entry(if ada {
            "adalayernorm_bwd_rows"
        } else if rms {
            "rmsnorm_bwd_rows"
        } else {
            "layernorm_bwd_rows"
        });
        let source1 = self.kernel(
            &entry1,
            &sig,
            (bs, per_sm),
            &[("N", rows), ("C", c), ("V", v), ("CPT", cpt), ("BS", bs as i64), ("BPG", bpg), ("RG", rg)],
            h,
            "0.0f",
            &decl,
            &al,
            2 * rpi as usize,
            &body,
        );
        let grid = blocks as u32;
        let launch1 = Launch { source: source1, entry: entry1, grid: Grid::Exact(grid, 1, 1), block: bs, shared_bytes: 0, args: sig.args, cluster: None, pdl: Pdl::Dependent };

        // Finalize: column sums of the partials in block order.
        let mut sig2 = Sig::default();
        sig2.scratch("pa", 0, false);
        if db {
            sig2.scratch("pb", 1, false);
        }
        sig2.ptr("dsp", dscale, true);
        let mut decl2 = format!("    {t}* ds = ({t}*)dsp;\n", t = dst.ty);
        let (zero_b, sum_b, shared_b, init_b, fold_b, store_b2) = match &dbt {
            Some(b) => {
                sig2.ptr("dbp", b.id, true);
                decl2 += &format!("    {t}* db = ({t}*)dbp;\n", t = b.ty);
                (
                    "    float b = 0.0f;\n",
                    "            b += pb[gofs + (i64)p * H + col];\n",
                    "    __shared__ float sb[FS][33];\n    sb[s][l] = b;\n",
                    "        float tb = sb[0][l];\n",
                    "            tb += sb[i][l];\n",
                    "        fr_fromf(tb, db[(i64)blockIdx.y * H + col]);\n",
                )
            }
            None => ("", "", "", "", "", ""),
        };
        let entry2 = self.entry(if ada {
            "adalayernorm_bwd_params"
        } else if rms {
            "rmsnorm_bwd_params"
        } else {
            "layernorm_bwd_params"
        });
        let source2 = fill(
            r#"@helpers@
extern "C" __global__ void __launch_bounds__(@threads@) @entry@(@params@) {
    constexpr i64 H = @h@;
    constexpr int P = @p@, FS = @fs@;
@decl@    __shared__ float sa[FS][33];
    const int l = threadIdx.x & 31, s = threadIdx.x >> 5;
    const i64 col = (i64)blockIdx.x * 32 + l;
    // This group's partials (blocks blockIdx.y * P ...).
    const i64 gofs = (i64)blockIdx.y * P * H;
    float a = 0.0f;
@zero_b@    if (col < H) {
#pragma unroll 8
        for (int p = s; p < P; p += FS) {
            a += pa[gofs + (i64)p * H + col];
@sum_b@        }
    }
    sa[s][l] = a;
@shared_b@    __syncthreads();
    if (s == 0 && col < H) {
        float ta = sa[0][l];
@init_b@        for (int i = 1; i < FS; ++i) {
            ta += sa[i][l];
@fold_b@        }
        fr_fromf(ta, ds[(i64)blockIdx.y * H + col]);
@store_b@    }
}
"#,
            &[
                ("helpers", HELPERS.into()),
                ("threads", (32 * FIN_SLICES).to_string()),
                ("entry", entry2.clone()),
                ("params", sig2.list()),
                ("h", h.to_string()),
                ("p", bpg.to_string()),
                ("fs", FIN_SLICES.to_string()),
                ("decl", decl2),
                ("zero_b", zero_b.into()),
                ("sum_b", sum_b.into()),
                ("shared_b", shared_b.into()),
                ("init_b", init_b.into()),
                ("fold_b", fold_b.into()),
                ("store_b", store_b2.into()),
            ],
        );
        let grid2 = ((h + 31) / 32) as u32;
        let launch2 = Launch {
            source: source2,
            entry: entry2,
            grid: Grid::Exact(grid2, groups as u32, 1),
            block: 32 * FIN_SLICES,
            shared_bytes: 0,
            args: sig2.args,
            cluster: None,
            pdl: Pdl::Dependent,
        };
        let mut scratch = vec![part_bytes];
        if db {
            scratch.push(part_bytes);
        }
        Some(NodeKernels { launches: vec![launch1, launch2], scratch })
    }
}

/// What `norm_forward_block` needs from `norm_forward`.
struct NormBlock {
    entry: String,
    sig: Sig,
    decl: String,
    al: String,
    stats: String,
    rms: bool,
    eps: String,
    rows: i64,
    h: i64,
    c: i64,
    v: i64,
    cpt: i64,
    bs: u32,
    /// Bytes per element of x, and of scale plus bias.
    xs: i64,
    ps: i64,
    xt: RowT,
    yt: RowT,
    st: RowT,
    bt: Option<RowT>,
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

/// A per-channel tensor `[1, C, 1, ...]` read (or written) at the channel of row `r` (rows
/// over axes 0 and 1 of an x of dims `xd`: channel `r % C`).
struct ChanT {
    id: TensorId,
    ty: &'static str,
    /// Element stride between channels.
    stride: i64,
}

impl Gen<'_> {
    fn chan(&self, id: TensorId, xd: &[i64]) -> Option<ChanT> {
        let d = self.graph.desc(id);
        let ty = ctype(self.dt(id))?;
        if d.dims.len() != xd.len() || d.strides.len() != xd.len() || d.dims[0] != 1 || d.dims[1] != xd[1] || d.dims[2..].iter().any(|&n| n != 1) {
            return None;
        }
        Some(ChanT { id, ty, stride: if xd[1] > 1 { d.strides[1] } else { 0 } })
    }

    /// Instancenorm forward with the spatial axes packed (NCHW and the like): a row per
    /// (n, c) of HW elements, scale and bias the row's channel's; the lane-team / block-per-row
    /// scheme of adalayernorm (the row read once, kept in registers).
    fn instancenorm(&self, eps: f64) -> Option<NodeKernels> {
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
        let eps = f32_literal(eps)?;
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
        let mut sig = Sig::default();
        sig.ptr("xp", x, false);
        sig.ptr("scp", st.id, false);
        sig.ptr("bip", bt.id, false);
        sig.ptr("yp", y, true);
        let mut decl = format!(
            "    const {tx}* x = (const {tx}*)xp;\n    const {ts}* sc = (const {ts}*)scp;\n    const {tb}* bi = (const {tb}*)bip;\n    {ty}* y = ({ty}*)yp;\n",
            tx = xt.ty,
            ts = st.ty,
            tb = bt.ty,
            ty = yt.ty
        );
        let mut stats = String::new();
        if let Some(m) = &mt {
            sig.ptr("mop", m.id, true);
            decl += &format!("    {t}* mo = ({t}*)mop;\n", t = m.ty);
            stats += &format!("            fr_fromf(mean, mo[{}]);\n", m.off);
        }
        if let Some(i) = &it {
            sig.ptr("ivp", i.id, true);
            decl += &format!("    {t}* iv = ({t}*)ivp;\n", t = i.ty);
            stats += &format!("            fr_fromf(inv, iv[{}]);\n", i.off);
        }
        let al = Self::align_flag(v, &[("x", &xt), ("y", &yt)]);
        let body = fill(
            r#"        const i64 xo = @offx@, yo = @offy@;
        const i64 ch = r % @nc@LL;
        float v[CPT][V];
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * TS;
            if (ok && c < C) {
                fr_ld<@tx@, V>(x + xo + (i64)c * V, v[k], al);
            } else {
#pragma unroll
                for (int i = 0; i < V; ++i) v[k][i] = 0.0f;
            }
        }
        float mean = 0.0f;
        {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < CPT; ++k)
#pragma unroll
                for (int i = 0; i < V; ++i) s += v[k][i];
            fr_sum<TS, 1>(&s, red + (rb++ & 1) * 32);
            mean = s / HF;
        }
        float q = 0.0f;
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            if (lt + k * TS < C) {
#pragma unroll
                for (int i = 0; i < V; ++i) {
                    const float d = v[k][i] - mean;
                    q += d * d;
                }
            }
        }
        fr_sum<TS, 1>(&q, red + (rb++ & 1) * 32);
        const float inv = 1.0f / sqrtf(q / HF + EPS);
        if (ok && lt == 0) {
@stats@        }
        const float a = ok ? inv * fr_tof(sc[ch * @ss@LL]) : 0.0f;
        const float b = ok ? fr_tof(bi[ch * @bs@LL]) : 0.0f;
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * TS;
            if (ok && c < C) {
                float o[V];
#pragma unroll
                for (int i = 0; i < V; ++i) o[i] = (v[k][i] - mean) * a + b;
                fr_st<@ty@, V>(y + yo + (i64)c * V, o, al);
            }
        }
"#,
            &[
                ("offx", xt.off.clone()),
                ("offy", yt.off.clone()),
                ("nc", xd[1].to_string()),
                ("tx", xt.ty.into()),
                ("stats", stats),
                ("ss", st.stride.to_string()),
                ("bs", bt.stride.to_string()),
                ("ty", yt.ty.into()),
            ],
        );
        let entry = self.entry("instancenorm_rows");
        let source = self.kernel(
            &entry,
            &sig,
            (bs, 1),
            &[("N", rows), ("C", c), ("V", v), ("CPT", cpt), ("TS", ts as i64), ("BS", bs as i64)],
            h,
            &eps,
            &decl,
            &al,
            1,
            &row_loop(ts, bs, &body),
        );
        let threads = rows as u64 * ts as u64;
        Some(NodeKernels::one(Launch { source, entry, grid: Grid::Cover(threads), block: bs, shared_bytes: 0, args: sig.args, cluster: None, pdl: Pdl::Dependent }))
    }

    /// Instancenorm backward with the spatial axes packed: a row per (n, c) (x and dy kept in
    /// registers), `dx = inv * scale * (dy - sum(dy) / HW - xhat * sum(dy * xhat) / HW)`; each
    /// row's two sums go to scratch, and a second launch adds them over n, in order, into
    /// dscale and dbias.
    fn instancenorm_backward(&self) -> Option<NodeKernels> {
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
        let mut sig = Sig::default();
        sig.ptr("xp", x, false);
        sig.ptr("dyp", dy, false);
        sig.ptr("scp", st.id, false);
        sig.ptr("mnp", mt.id, false);
        sig.ptr("ivp", it.id, false);
        sig.ptr("dxp", dx, true);
        sig.scratch("part", 0, true);
        let decl = format!(
            "    const {tx}* x = (const {tx}*)xp;\n    const {tdy}* dy = (const {tdy}*)dyp;\n    const {ts}* sc = (const {ts}*)scp;\n    const {tm}* mn = (const {tm}*)mnp;\n    const {ti}* iv = (const {ti}*)ivp;\n    {tdx}* dx = ({tdx}*)dxp;\n",
            tx = xt.ty,
            tdy = dyt.ty,
            ts = st.ty,
            tm = mt.ty,
            ti = it.ty,
            tdx = dxt.ty
        );
        let al = Self::align_flag(v, &[("x", &xt), ("dy", &dyt), ("dx", &dxt)]);
        let body = fill(
            r#"        const i64 xo = @offx@, dyo = @offdy@, dxo = @offdx@;
        const i64 ch = r % @nc@LL;
        float u[CPT][V], g[CPT][V];
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * TS;
            if (ok && c < C) {
                fr_ld<@tx@, V>(x + xo + (i64)c * V, u[k], al);
                fr_ld<@tdy@, V>(dy + dyo + (i64)c * V, g[k], al);
            } else {
#pragma unroll
                for (int i = 0; i < V; ++i) {
                    u[k][i] = 0.0f;
                    g[k][i] = 0.0f;
                }
            }
        }
        const float mu = ok ? fr_tof(mn[@offm@]) : 0.0f;
        const float rs = ok ? fr_tof(iv[@offi@]) : 0.0f;
        // t[0] = sum(dy), t[1] = sum(dy * xhat).
        float t[2] = {0.0f, 0.0f};
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            if (lt + k * TS < C) {
#pragma unroll
                for (int i = 0; i < V; ++i) {
                    u[k][i] = (u[k][i] - mu) * rs;
                    t[0] += g[k][i];
                    t[1] += g[k][i] * u[k][i];
                }
            }
        }
        fr_sum<TS, 2>(t, red + (rb++ & 1) * 64);
        const float a = ok ? rs * fr_tof(sc[ch * @ss@LL]) : 0.0f;
        const float m0 = t[0] / HF, m1 = t[1] / HF;
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * TS;
            if (ok && c < C) {
                float o[V];
#pragma unroll
                for (int i = 0; i < V; ++i) o[i] = a * (g[k][i] - m0 - u[k][i] * m1);
                fr_st<@tdx@, V>(dx + dxo + (i64)c * V, o, al);
            }
        }
        if (ok && lt == 0) {
            part[r] = t[1];
            part[N + r] = t[0];
        }
"#,
            &[
                ("offx", xt.off.clone()),
                ("offdy", dyt.off.clone()),
                ("offdx", dxt.off.clone()),
                ("nc", nc.to_string()),
                ("tx", xt.ty.into()),
                ("tdy", dyt.ty.into()),
                ("offm", mt.off.clone()),
                ("offi", it.off.clone()),
                ("ss", st.stride.to_string()),
                ("tdx", dxt.ty.into()),
            ],
        );
        let entry = self.entry("instancenorm_bwd_rows");
        let source = self.kernel(
            &entry,
            &sig,
            (bs, 1),
            &[("N", rows), ("C", c), ("V", v), ("CPT", cpt), ("TS", ts as i64), ("BS", bs as i64)],
            h,
            "0.0f",
            &decl,
            &al,
            2,
            &row_loop(ts, bs, &body),
        );
        let launch1 = Launch { source, entry, grid: Grid::Cover(rows as u64 * ts as u64), block: bs, shared_bytes: 0, args: sig.args, cluster: None, pdl: Pdl::Dependent };
        // dscale[c] = sum over n of part[n * C + c], dbias[c] of part[N + n * C + c].
        let entry2 = self.entry("instancenorm_bwd_params");
        let source2 = fill(
            r#"@helpers@
extern "C" __global__ void __launch_bounds__(1024) @entry@(const float* part, void* dsp, void* dbp) {
    @tds@* ds = (@tds@*)dsp;
    @tdb@* db = (@tdb@*)dbp;
    __shared__ double sa[32][33], sb[32][33];
    const int l = threadIdx.x & 31, s = threadIdx.x >> 5;
    const i64 col = (i64)blockIdx.x * 32 + l;
    double a = 0.0, b = 0.0;
    if (col < @nc@LL) {
        for (i64 n = s; n < @nb@LL; n += 32) {
            a += (double)part[n * @nc@LL + col];
            b += (double)part[@rows@LL + n * @nc@LL + col];
        }
    }
    sa[s][l] = a;
    sb[s][l] = b;
    __syncthreads();
    if (s == 0 && col < @nc@LL) {
        for (int i = 1; i < 32; ++i) {
            a += sa[i][l];
            b += sb[i][l];
        }
        fr_fromf((float)a, ds[col * @sds@LL]);
        fr_fromf((float)b, db[col * @sdb@LL]);
    }
}
"#,
            &[
                ("helpers", HELPERS.into()),
                ("entry", entry2.clone()),
                ("tds", dst.ty.into()),
                ("tdb", dbt.ty.into()),
                ("nc", nc.to_string()),
                ("nb", nb.to_string()),
                ("rows", rows.to_string()),
                ("sds", dst.stride.to_string()),
                ("sdb", dbt.stride.to_string()),
            ],
        );
        let grid2 = ((nc + 31) / 32) as u32;
        let launch2 = Launch {
            source: source2,
            entry: entry2,
            grid: Grid::Exact(grid2, 1, 1),
            block: 1024,
            shared_bytes: 0,
            args: vec![Arg::Scratch(0), Arg::Ptr(dscale), Arg::Ptr(dbias)],
            cluster: None,
            pdl: Pdl::Dependent,
        };
        Some(NodeKernels { launches: vec![launch1, launch2], scratch: vec![(2 * rows * 4) as usize] })
    }
}

// ----------------------------------------------------------------------------------------------
// Prologue fusion: a pointwise chain computing a norm's x, in the norm's kernel
// ----------------------------------------------------------------------------------------------

/// Most pointwise nodes, and most external inputs, a prologue takes.
const PROLOGUE_MAX_NODES: usize = 8;
const PROLOGUE_MAX_INPUTS: usize = 6;

/// The formula (in `a`, `b`) of a pointwise node a prologue can take: add, sub, mul (bias and
/// scale too) of two tensors, computing in f32, output `y`.
fn prologue_formula(graph: &Graph, ni: usize) -> Option<&'static str> {
    use crate::graph::ops::pointwise::PointwiseMode;
    let node = &graph.nodes[ni];
    let Op::Pointwise(a) = &node.op else { return None };
    let f = match a.mode {
        PointwiseMode::Add | PointwiseMode::Bias => "a + b",
        PointwiseMode::Sub => "a - b",
        PointwiseMode::Mul | PointwiseMode::Scale => "a * b",
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
        if ext.len() > PROLOGUE_MAX_INPUTS || ext.iter().chain(&made).any(|&t| self.dims(t) != xd.as_slice()) {
            return None;
        }
        let rows: i64 = xd[0];
        let h: i64 = xd[1..].iter().product();
        // Vector width from the narrowest loaded type.
        let narrow = ext.iter().map(|&t| self.dt(t)).min_by_key(|d| d.size()).unwrap_or(DataType::F32);
        let v = vec_width(narrow, h);
        let c = h / v;
        let (ts, bs, cpt) = norm_team(h, c, v)?;
        let eps = f32_literal(eps)?;
        let ets: Vec<RowT> = ext.iter().map(|&t| self.rows(t, 1, v, true)).collect::<Option<_>>()?;
        let yt = self.rows(y, 1, v, true)?;
        let xt = if write_x { Some(self.rows(x, 1, v, true)?) } else { None };
        let st = self.param(scale, &xd, v)?;
        let bt = match bias {
            Some(b) => Some(self.param(b, &xd, v)?),
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
        let mut sig = Sig::default();
        let mut decl = String::new();
        let mut vec_tensors: Vec<(String, &RowT)> = Vec::new();
        let mut offs = String::new();
        let mut loads = String::new();
        for (j, e) in ets.iter().enumerate() {
            sig.ptr(&format!("e{j}p"), e.id, false);
            decl += &format!("    const {t}* e{j} = (const {t}*)e{j}p;\n", t = e.ty);
            vec_tensors.push((format!("e{j}"), e));
            offs += &format!("        const i64 o{j} = {};\n", e.off);
            loads += &format!("                float f{j}[V];\n                fr_ld<{t}, V>(e{j} + o{j} + (i64)c * V, f{j}, al);\n", t = e.ty);
        }
        sig.ptr("scp", scale, false);
        decl += &format!("    const {t}* sc = (const {t}*)scp;\n", t = st.ty);
        vec_tensors.push(("sc".into(), &st));
        if let Some(b) = &bt {
            sig.ptr("bip", b.id, false);
            decl += &format!("    const {t}* bi = (const {t}*)bip;\n", t = b.ty);
            vec_tensors.push(("bi".into(), b));
        }
        sig.ptr("yp", y, true);
        decl += &format!("    {t}* y = ({t}*)yp;\n", t = yt.ty);
        vec_tensors.push(("y".into(), &yt));
        let mut store_x = String::new();
        if let Some(t) = &xt {
            sig.ptr("hp", x, true);
            decl += &format!("    {ty}* hx = ({ty}*)hp;\n", ty = t.ty);
            vec_tensors.push(("hx".into(), t));
            offs += &format!("        const i64 oh = {};\n", t.off);
            store_x = format!("                fr_st<{}, V>(hx + oh + (i64)c * V, v[k], al);\n", t.ty);
        }
        let mut stats = String::new();
        if let Some(m) = &mt {
            sig.ptr("mop", m.id, true);
            decl += &format!("    {t}* mo = ({t}*)mop;\n", t = m.ty);
            stats += &format!("            fr_fromf(mean, mo[{}]);\n", m.off);
        }
        if let Some(i) = &it {
            sig.ptr("ivp", i.id, true);
            decl += &format!("    {t}* iv = ({t}*)ivp;\n", t = i.ty);
            stats += &format!("            fr_fromf(inv, iv[{}]);\n", i.off);
        }
        // The chain per element i: node outputs as floats, rounded to their tensors' types.
        let mut exprs = String::new();
        let name_of = |t: TensorId| -> String {
            match ext.iter().position(|&e| e == t) {
                Some(j) => format!("f{j}[i]"),
                None => format!("t{}", t.0),
            }
        };
        for &p in chain {
            let node = &self.graph.nodes[p];
            let f = prologue_formula(self.graph, p)?;
            let out = node.outputs[0].tensor;
            let ty = ctype(self.dt(out))?;
            let (a, b) = (name_of(node.input("a")?), name_of(node.input("b")?));
            let e = f.replace('a', "A_").replace('b', "B_").replace("A_", &a).replace("B_", &b);
            exprs += &format!("                    const float t{} = fr_q<{ty}>({e});\n", out.0);
        }
        let refs: Vec<(&str, &RowT)> = vec_tensors.iter().map(|(n, t)| (n.as_str(), *t)).collect();
        let al = Self::align_flag(v, &refs);
        let mean_pass = if rms {
            String::new()
        } else {
            r#"        {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < CPT; ++k)
#pragma unroll
                for (int i = 0; i < V; ++i) s += v[k][i];
            fr_sum<TS, 1>(&s, red + (rb++ & 1) * 32);
            mean = s / HF;
        }
"#
            .to_string()
        };
        let (load_bias, bias_term) = match &bt {
            Some(b) => (format!("                float b[V];\n                fr_ld<{}, V>(bi + (i64)c * V, b, al);\n", b.ty), " + b[i]"),
            None => (String::new(), ""),
        };
        let body = fill(
            r#"        const i64 yo = @offy@;
@offs@        float v[CPT][V];
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * TS;
            if (ok && c < C) {
@loads@#pragma unroll
                for (int i = 0; i < V; ++i) {
@exprs@                    v[k][i] = t@xid@;
                }
@store_x@            } else {
#pragma unroll
                for (int i = 0; i < V; ++i) v[k][i] = 0.0f;
            }
        }
        float mean = 0.0f;
@mean_pass@        float q = 0.0f;
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            if (lt + k * TS < C) {
#pragma unroll
                for (int i = 0; i < V; ++i) {
                    const float d = v[k][i] - mean;
                    q += d * d;
                }
            }
        }
        fr_sum<TS, 1>(&q, red + (rb++ & 1) * 32);
        const float inv = 1.0f / sqrtf(q / HF + EPS);
        if (ok && lt == 0) {
@stats@        }
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * TS;
            if (ok && c < C) {
                float s[V], o[V];
                fr_ld<@tsc@, V>(sc + (i64)c * V, s, al);
@load_bias@#pragma unroll
                for (int i = 0; i < V; ++i) o[i] = (v[k][i] - mean) * inv * s[i]@bias_term@;
                fr_st<@ty@, V>(y + yo + (i64)c * V, o, al);
            }
        }
"#,
            &[
                ("offy", yt.off.clone()),
                ("offs", offs),
                ("loads", loads),
                ("exprs", exprs),
                ("xid", x.0.to_string()),
                ("store_x", store_x),
                ("mean_pass", mean_pass),
                ("stats", stats),
                ("tsc", st.ty.into()),
                ("load_bias", load_bias),
                ("bias_term", bias_term.into()),
                ("ty", yt.ty.into()),
            ],
        );
        let entry = self.entry(if rms { "prologue_rmsnorm_rows" } else { "prologue_layernorm_rows" });
        let source = self.kernel(
            &entry,
            &sig,
            (bs, 1),
            &[("N", rows), ("C", c), ("V", v), ("CPT", cpt), ("TS", ts as i64), ("BS", bs as i64)],
            h,
            &eps,
            &decl,
            &al,
            1,
            &row_loop(ts, bs, &body),
        );
        let frq = "// A value rounded to type T and back (the CPU stores each node's result in its tensor's type).\ntemplate <typename T>\n__device__ __forceinline__ float fr_q(float v) {\n    T t;\n    fr_fromf(v, t);\n    return fr_tof(t);\n}\n";
        let source = source.replacen("extern \"C\"", &format!("{frq}extern \"C\""), 1);
        let threads = rows as u64 * ts as u64;
        Some(NodeKernels::one(Launch { source, entry, grid: Grid::Cover(threads), block: bs, shared_bytes: 0, args: sig.args, cluster: None, pdl: Pdl::Dependent }))
    }
}
