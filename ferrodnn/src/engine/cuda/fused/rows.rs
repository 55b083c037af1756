//! Fast row kernels: layernorm and rmsnorm forward (training and inference), softmax and
//! log-softmax forward (with or without the log-sum-exp `stats`), and layernorm and rmsnorm
//! backward (`dx`, `dscale`, `dbias`); softmax and log-softmax backward (`y`, `dy` -> `dx`, rows
//! of at most 16384 elements) and adalayernorm forward (over the last axis; scale and bias
//! `[B or 1, S or 1..., D]`, the row's offset into them from its outer index), both in the
//! forward kernels' lane-team / block-per-row scheme.
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
use crate::engine::cuda::engine::{Target, Unit};
use crate::engine::cuda::fallback::{entry_name, Arg, Launch, NodeKernels};
use crate::error::Result;
use crate::graph::ops::Op;
use crate::graph::{Graph, Node, TensorId};

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
        Op::LayernormBackward(_) => g.norm_backward(false),
        Op::RmsnormBackward(_) => g.norm_backward(true),
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
fn fill(template: &str, subs: &[(&str, String)]) -> String {
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
        Some(NodeKernels::one(Launch { source, entry, threads, block: bs, exact_grid: None, shared_bytes: 0, args: sig.args, cluster: None }))
    }

    /// The block-per-row forward norms (rows longer than 1024 elements): persistent blocks
    /// (about one wave, `block_norm_per_sm` per SM, each taking every `gridDim.x`-th row, the
    /// same number of rows per block within one, at least 3); the next row's raw elements are fetched
    /// into registers before the current row's reduction, when the registers allow; scale and
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
        let body = fill(
            r#"    const int lt = threadIdx.x;
@param_regs@    FrRaw<@tx@, V> rx[CPT];
    float pk = 0.0f;
    auto fetch = [&](i64 r) {
        const i64 xo = @offx@;
        if (!RMS) pk = fr_tof(x[xo]);
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * BS;
            if (c < C) fr_ldraw<@tx@, V>(x + xo + (i64)c * V, rx[k], al);
            else fr_zero(rx[k]);
        }
    };
    if (PRE && (i64)blockIdx.x < N) fetch((i64)blockIdx.x);
    for (i64 r = blockIdx.x; r < N; r += gridDim.x) {
        if (!PRE) fetch(r);
        // The row stays raw in registers (converted again for the output).
        FrRaw<@tx@, V> cx[CPT];
#pragma unroll
        for (int k = 0; k < CPT; ++k) cx[k] = rx[k];
        const float K = pk;
        if (PRE && r + (i64)gridDim.x < N) fetch(r + (i64)gridDim.x);
        // t[0] = sum(x - K), t[1] = sum((x - K)^2) (rmsnorm: K = 0, only t[1]).
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
    }
"#,
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
        NodeKernels::one(Launch { source, entry, threads: grid as u64 * bs as u64, block: bs, exact_grid: Some((grid, 1, 1)), shared_bytes: 0, args: sig.args, cluster: None })
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
        Some(NodeKernels::one(Launch { source, entry, threads, block: bs, exact_grid: None, shared_bytes: 0, args: sig.args, cluster: None }))
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
        Some(NodeKernels::one(Launch { source, entry, threads, block: bs, exact_grid: None, shared_bytes: 0, args: sig.args, cluster: None }))
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
        Some(NodeKernels::one(Launch { source, entry, threads, block: bs, exact_grid: None, shared_bytes: 0, args: sig.args, cluster: None }))
    }

    /// A kernel: helpers, constants, pointer declarations, the alignment flag, the reduction
    /// buffers (`k` floats per warp, two of them) and the body.
    #[allow(clippy::too_many_arguments)]
    fn kernel(&self, entry: &str, sig: &Sig, (bs, min_blocks): (u32, u32), ints: &[(&str, i64)], h: i64, eps: &str, decl: &str, al: &str, k: usize, body: &str) -> String {
        let mut consts = String::new();
        for (name, value) in ints {
            let ty = if *name == "N" { "i64" } else { "int" };
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
    fn norm_backward(&self, rms: bool) -> Option<NodeKernels> {
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
        let rows: i64 = xd[0];
        let h: i64 = xd[1..].iter().product();
        let v = vec_width(self.dt(x), h);
        let c = h / v;
        let (bs, cpt, rpi) = backward_team(c, v, if dbias.is_some() { 2 } else { 1 }, (self.dt(x).size() + self.dt(dy).size()) as i64)?;
        let xt = self.rows(x, 1, v, true)?;
        let dyt = self.rows(dy, 1, v, true)?;
        let dxt = self.rows(dx, 1, v, true)?;
        let st = self.param(scale, &xd, v)?;
        let dst = self.param(dscale, &xd, 1)?;
        let dbt = match dbias {
            Some(b) => Some(self.param(b, &xd, 1)?),
            None => None,
        };
        let mt = match mean {
            Some(m) => Some(self.rows(m, 1, 1, false)?),
            None => None,
        };
        let it = self.rows(inv, 1, 1, false)?;
        let db = dbt.is_some();

        // Blocks: one wave of about 512 threads per SM of the target (the launch bounds keep
        // that many resident), at least 8 rows each.
        let per_sm = (512 / bs).max(1);
        let blocks = (self.sms * per_sm as i64).min((rows + 7) / 8).max(1);
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
    auto fetch = [&](i64 r0) {
#pragma unroll
        for (int j = 0; j < RPI; ++j) {
            const i64 r = r0 + j;
            const bool ok = r < N;
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
    const i64 step = (i64)gridDim.x * RPI;
    if ((i64)blockIdx.x * RPI < N) fetch((i64)blockIdx.x * RPI);
    for (i64 r0 = (i64)blockIdx.x * RPI; r0 < N; r0 += step) {
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
        if (r0 + step < N) fetch(r0 + step);
        // Per row j: t[2j] = sum(dy * scale), t[2j + 1] = sum(dy * scale * xhat).
        float t[2 * RPI];
#pragma unroll
        for (int j = 0; j < 2 * RPI; ++j) t[j] = 0.0f;
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * BS;
            if (c < C) {
                float s[V];
                fr_ld<@tsc@, V>(sc + (i64)c * V, s, al);
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
            if (r < N) {
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
        let entry1 = self.entry(if rms { "rmsnorm_bwd_rows" } else { "layernorm_bwd_rows" });
        let source1 = self.kernel(&entry1, &sig, (bs, per_sm), &[("N", rows), ("C", c), ("V", v), ("CPT", cpt), ("BS", bs as i64)], h, "0.0f", &decl, &al, 2 * rpi as usize, &body);
        let grid = blocks as u32;
        let launch1 =
            Launch { source: source1, entry: entry1, threads: grid as u64 * bs as u64, block: bs, exact_grid: Some((grid, 1, 1)), shared_bytes: 0, args: sig.args, cluster: None };

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
                    "            b += pb[(i64)p * H + col];\n",
                    "    __shared__ float sb[FS][33];\n    sb[s][l] = b;\n",
                    "        float tb = sb[0][l];\n",
                    "            tb += sb[i][l];\n",
                    "        fr_fromf(tb, db[col]);\n",
                )
            }
            None => ("", "", "", "", "", ""),
        };
        let entry2 = self.entry(if rms { "rmsnorm_bwd_params" } else { "layernorm_bwd_params" });
        let source2 = fill(
            r#"@helpers@
extern "C" __global__ void __launch_bounds__(@threads@) @entry@(@params@) {
    constexpr i64 H = @h@;
    constexpr int P = @p@, FS = @fs@;
@decl@    __shared__ float sa[FS][33];
    const int l = threadIdx.x & 31, s = threadIdx.x >> 5;
    const i64 col = (i64)blockIdx.x * 32 + l;
    float a = 0.0f;
@zero_b@    if (col < H) {
#pragma unroll 8
        for (int p = s; p < P; p += FS) {
            a += pa[(i64)p * H + col];
@sum_b@        }
    }
    sa[s][l] = a;
@shared_b@    __syncthreads();
    if (s == 0 && col < H) {
        float ta = sa[0][l];
@init_b@        for (int i = 1; i < FS; ++i) {
            ta += sa[i][l];
@fold_b@        }
        fr_fromf(ta, ds[col]);
@store_b@    }
}
"#,
            &[
                ("helpers", HELPERS.into()),
                ("threads", (32 * FIN_SLICES).to_string()),
                ("entry", entry2.clone()),
                ("params", sig2.list()),
                ("h", h.to_string()),
                ("p", blocks.to_string()),
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
            threads: grid2 as u64 * 32 * FIN_SLICES as u64,
            block: 32 * FIN_SLICES,
            exact_grid: Some((grid2, 1, 1)),
            shared_bytes: 0,
            args: sig2.args,
            cluster: None,
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
