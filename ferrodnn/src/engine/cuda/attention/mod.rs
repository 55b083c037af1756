//! The attention engine: flash-attention kernels for sdpa and sdpa_backward (online softmax;
//! the score matrix never reaches device memory), on tensor cores with `mma.sync.m16n8k16`
//! (sm_80 and later; the Hopper wgmma path comes on top of this one).
//!
//! - Forward ([`fwd`]): FlashAttention-2. One CTA per (q tile, query head, batch); each warp
//!   owns 16 query rows, S = Q K^T and O += P V on tensor cores with f32 accumulators, the
//!   online softmax in f32 in log2 units (the scale folded into one multiplier, `ex2.approx`),
//!   P rounded to the io type in registers as the A operand of P V. K/V tiles are
//!   double-buffered with 16-byte `cp.async` (row strides multiples of 8 elements, checked at
//!   plan time; base pointers checked at run time through [`Unit::unaligned`], whose kernels
//!   take element-wise loads instead), fragments come from shared memory with `ldmatrix`
//!   (`.trans` for the operands stored k-minor). Fully masked K/V tiles (causal, windows,
//!   padding) are skipped; partially masked ones are masked element-wise.
//! - Backward ([`bwd`]): FlashAttention-2 without atomics: `D_i = do_i . o_i` (f32 scratch);
//!   a dQ kernel (CTA per q tile, looping over K/V tiles) and a dK/dV kernel (CTA per K/V tile
//!   and kv head, looping over the query heads of the group and their q tiles), both
//!   recomputing P from the stats. dbias when the bias is not broadcast over rows or keys.
//!
//! What the engine takes (anything else returns `None` and runs on the fallback): q/k/v (and
//! `do`) bf16 or f16; head dims multiples of 16 up to 128, or multiples of 32 up to 256; a
//! node not computing in f64; every mask, bias shape, ALiBi, dropout, GQA/MQA, padding, stats,
//! any strides; paged K/V in the forward pass only.

mod bwd;
mod bwd90;
mod decode;
mod fwd;
mod fwd90;
mod hopper;

use super::kernel::ctype::{ld, st};
use super::kernel::{Arg, Options, Target, Unit};
use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::ops::sdpa::{alibi_slopes, CausalAlignment, SdpaAttrs};
use crate::graph::ops::Op;
use crate::graph::{Graph, Node, TensorId};

/// Whether a backward with these attributes runs faster with dQ added by float atomics in the
/// dK/dV pass (the `atomics` plan knob) than with its own pass: without a sliding window
/// (measured on the H100, bench/NOTES.md: unmasked +6% at b4h16s4096d128 and +14% at
/// b16h16s1024d64 in session 11; under a causal mask, with dQ added by bulk reductions and
/// the mask skipped where blocks need none, a tie at b4h16s4096d128 and +7% at
/// b1h32s16384d128 in session 14). Sliding windows, not measured, keep the deterministic
/// passes. `FERRODNN_ATTN_ATOMIC_MASKED=1` takes the atomic path under windows too (a tuning
/// switch).
pub fn atomic_dq_pays(a: &SdpaAttrs) -> bool {
    no_window(a) || std::env::var("FERRODNN_ATTN_ATOMIC_MASKED").is_ok_and(|v| v == "1")
}

/// No sliding window on either side.
fn no_window(a: &SdpaAttrs) -> bool {
    a.sliding_window_left.is_none() && a.sliding_window_right.is_none()
}

/// No causal mask and no sliding window: every query row sees every key, so every tile of a
/// kernel's grid costs the same.
pub(super) fn unmasked(a: &SdpaAttrs) -> bool {
    a.causal.is_none() && no_window(a)
}

/// The unit of an sdpa or sdpa_backward node, when this engine runs it.
pub fn unit(graph: &Graph, ni: usize, target: &Target, options: &Options) -> Result<Option<Unit>> {
    let node = &graph.nodes[ni];
    let (attrs, backward) = match &node.op {
        Op::Sdpa(a) => (a, false),
        Op::SdpaBackward(a) => (a, true),
        _ => return Ok(None),
    };
    if target.cc() < 80 {
        return Ok(None);
    }
    let Some(p) = Problem::new(graph, ni, attrs, backward) else { return Ok(None) };
    if backward {
        Ok(bwd90::unit(&p, target, options).or_else(|| bwd::unit(&p, target)))
    } else {
        if let Some(u) = decode::unit(&p, target) {
            return Ok(Some(u));
        }
        Ok(fwd90::unit(&p, target).or_else(|| fwd::unit(&p, target)))
    }
}

/// Opt-in shared memory per block a target allows.
fn max_shared(target: &Target) -> usize {
    match target.cc() {
        80 | 87 => 163 * 1024,
        86 | 89 => 99 * 1024,
        90..=99 => 227 * 1024,
        _ => 99 * 1024,
    }
}

/// The sizes, tensors and attributes of an sdpa node, checked to be what these kernels take.
pub(crate) struct Problem<'a> {
    pub graph: &'a Graph,
    pub node: &'a Node,
    pub ni: usize,
    pub attrs: &'a SdpaAttrs,
    pub b: i64,
    pub h_q: i64,
    pub h_kv: i64,
    pub s_q: i64,
    pub s_kv: i64,
    pub d: i64,
    pub d_v: i64,
    /// bf16 or f16: q, k, v (and do).
    pub dt: DataType,
    pub q: TensorId,
    pub k: TensorId,
    pub v: TensorId,
    pub bias: Option<TensorId>,
    pub seq_len_q: Option<TensorId>,
    pub seq_len_kv: Option<TensorId>,
    pub seed: Option<TensorId>,
    pub offset: Option<TensorId>,
    pub paged: Option<(TensorId, TensorId)>,
    /// The dropout probability when dropout is on (p > 0).
    pub dropout: Option<f64>,
    pub scale: f64,
}

/// A head dim these kernels take: a multiple of 16 up to 128, or of 32 up to 256.
fn head_dim_ok(d: i64) -> bool {
    (d > 0 && d <= 128 && d % 16 == 0) || (d > 128 && d <= 256 && d % 32 == 0)
}

impl<'a> Problem<'a> {
    fn new(graph: &'a Graph, ni: usize, attrs: &'a SdpaAttrs, backward: bool) -> Option<Problem<'a>> {
        let node = &graph.nodes[ni];
        if graph.compute_type(node) == DataType::F64 {
            return None;
        }
        let (q, k, v) = (node.input("q")?, node.input("k")?, node.input("v")?);
        let dt = graph.resolved_data_type(q)?;
        if !matches!(dt, DataType::Bf16 | DataType::F16) || graph.resolved_data_type(k)? != dt || graph.resolved_data_type(v)? != dt {
            return None;
        }
        let (qd, kd, vd) = (&graph.desc(q).dims, &graph.desc(k).dims, &graph.desc(v).dims);
        if qd.len() != 4 || kd.len() != 4 || vd.len() != 4 {
            return None;
        }
        let paged = match (node.input("page_table_k"), node.input("page_table_v")) {
            (Some(a), Some(b)) => Some((a, b)),
            (None, None) => None,
            _ => return None,
        };
        let s_kv = match paged {
            Some((tk, tv)) => {
                let (a, b) = (&graph.desc(tk).dims, &graph.desc(tv).dims);
                if a.len() != 4 || b.len() != 4 || a[2] * kd[2] != b[2] * vd[2] {
                    return None;
                }
                a[2] * kd[2]
            }
            None => kd[2],
        };
        let (b, h_q, s_q, d) = (qd[0], qd[1], qd[2], qd[3]);
        let (h_kv, d_v) = (kd[1], vd[3]);
        if b <= 0 || h_q <= 0 || s_q <= 0 || s_kv <= 0 || h_kv <= 0 || h_q % h_kv != 0 || kd[3] != d {
            return None;
        }
        if !head_dim_ok(d) || !head_dim_ok(d_v) {
            return None;
        }
        // Grid limits (y and z are 16-bit); sizes past 2^40 are not worth a separate check.
        if h_q > 65535 || h_kv > 65535 || b > 65535 || s_q > (1 << 40) || s_kv > (1 << 40) {
            return None;
        }
        let scale = attrs.attn_scale.unwrap_or(1.0 / (d as f64).sqrt());
        if !scale.is_finite() || scale.abs() > 1e30 {
            return None;
        }
        let dropout = attrs.dropout.filter(|&p| p > 0.0);
        let (seed, offset) = (node.input("seed"), node.input("offset"));
        if dropout.is_some() && (seed.is_none() || offset.is_none()) {
            return None;
        }
        let (seq_len_q, seq_len_kv) = if attrs.padding_mask { (Some(node.input("seq_len_q")?), Some(node.input("seq_len_kv")?)) } else { (None, None) };
        let bias = node.input("bias");
        if let Some(t) = bias {
            if graph.desc(t).dims.len() != 4 {
                return None;
            }
        }
        if backward {
            let d_o = node.input("do")?;
            if graph.resolved_data_type(d_o)? != dt || graph.desc(d_o).dims != [b, h_q, s_q, d_v] {
                return None;
            }
        }
        Some(Problem { graph, node, ni, attrs, b, h_q, h_kv, s_q, s_kv, d, d_v, dt, q, k, v, bias, seq_len_q, seq_len_kv, seed, offset, paged, dropout, scale })
    }

    /// Whether rows of a rank-4 tensor in the io type can be read with 16-byte `cp.async`:
    /// contiguous innermost dim and every other stride a multiple of 8 elements (size-1 dims
    /// aside). The base pointer is checked when the plan runs.
    pub fn vec_ok(&self, t: TensorId) -> bool {
        let d = self.graph.desc(t);
        d.strides.len() == 4 && d.strides[3] == 1 && (0..3).all(|a| d.dims[a] == 1 || d.strides[a] % 8 == 0)
    }

    /// Whether an output can be stored two elements (4 bytes) at a time: the io type, a
    /// contiguous innermost dim and even strides.
    pub fn pair_ok(&self, t: TensorId) -> bool {
        let d = self.graph.desc(t);
        self.graph.resolved_data_type(t) == Some(self.dt) && d.strides.len() == 4 && d.strides[3] == 1 && (0..3).all(|a| d.dims[a] == 1 || d.strides[a] % 2 == 0)
    }

    pub fn entry(&self, what: &str) -> String {
        super::kernel::entry_name(self.ni, what)
    }

    /// `#define`s every kernel of the node shares (sizes, masks, features, strides, loaders),
    /// the device functions that depend on them, and the kernel parameters / arguments / `FaIn`
    /// initialisation of the optional inputs. With `vec`, tensors whose strides allow it are
    /// read with `cp.async` (else element-wise).
    pub fn common(&self, vec: bool) -> Common {
        let a = self.attrs;
        let g = self.graph;
        let flag = |b: bool| if b { "1" } else { "0" };
        let cap = |w: i64| w.min(1 << 62);
        let mut s = String::new();
        let mut def = |name: &str, value: String| s += &format!("#define {name} {value}\n");
        def("FA_BF16", flag(self.dt == DataType::Bf16).into());
        def("FA_MMA_T", if self.dt == DataType::Bf16 { "\"bf16\"".into() } else { "\"f16\"".into() });
        def("FA_B", format!("{}LL", self.b));
        def("FA_HQ", format!("{}LL", self.h_q));
        def("FA_HKV", format!("{}LL", self.h_kv));
        def("FA_SQ", format!("{}LL", self.s_q));
        def("FA_SKV", format!("{}LL", self.s_kv));
        def("FA_GROUP", format!("{}LL", self.h_q / self.h_kv));
        def("FA_D", self.d.to_string());
        def("FA_DV", self.d_v.to_string());
        def("FA_LDK", (self.d + 8).to_string());
        def("FA_LDV", (self.d_v + 8).to_string());
        def("FA_SCALE", c_float(self.scale));
        def("FA_SCALE_LOG2", c_float(self.scale * std::f64::consts::LOG2_E));
        def("FA_CAUSAL", flag(a.causal.is_some()).into());
        def("FA_BOTTOM_RIGHT", flag(a.causal == Some(CausalAlignment::BottomRight)).into());
        def("FA_HAS_SWL", flag(a.sliding_window_left.is_some()).into());
        def("FA_SWL", format!("{}LL", cap(a.sliding_window_left.unwrap_or(0))));
        def("FA_HAS_SWR", flag(a.sliding_window_right.is_some()).into());
        def("FA_SWR", format!("{}LL", cap(a.sliding_window_right.unwrap_or(0))));
        def("FA_PADDING", flag(self.seq_len_q.is_some()).into());
        def("FA_HAS_BIAS", flag(self.bias.is_some()).into());
        def("FA_ALIBI", flag(a.alibi).into());
        def("FA_DROPOUT", flag(self.dropout.is_some()).into());
        def("FA_DROP_T", format!("{}ULL", self.dropout.map_or(0, drop_threshold)));
        def("FA_KEEP_SCALE", c_float(self.dropout.map_or(1.0, |p| 1.0 / (1.0 - p))));
        def("FA_PAGED", flag(self.paged.is_some()).into());
        let strides = |def: &mut dyn FnMut(&str, String), prefix: &str, t: TensorId, zero_broadcast: bool| {
            let d = g.desc(t);
            for (i, (&st, &dim)) in d.strides.iter().zip(&d.dims).enumerate() {
                let st = if zero_broadcast && dim == 1 { 0 } else { st };
                def(&format!("{prefix}_S{i}"), format!("{st}LL"));
            }
        };
        strides(&mut def, "Q", self.q, false);
        strides(&mut def, "K", self.k, false);
        strides(&mut def, "V", self.v, false);
        def("Q_VEC", flag(vec && self.vec_ok(self.q)).into());
        def("K_VEC", flag(vec && self.vec_ok(self.k)).into());
        def("V_VEC", flag(vec && self.vec_ok(self.v)).into());
        let mut params = Vec::new();
        let mut args = Vec::new();
        let mut init = String::new();
        let mut optional = |def: &mut dyn FnMut(&str, String), field: &str, ld_macro: &str, t: TensorId| {
            params.push(format!("const void* {field}_p"));
            args.push(Arg::Ptr(t));
            init += &format!("    A.{field} = {field}_p;\n");
            def(ld_macro, ld(g, t));
        };
        if let Some(t) = self.bias {
            optional(&mut def, "bias", "LD_BIAS", t);
            strides(&mut def, "BI", t, true);
        }
        if let (Some(lq), Some(lkv)) = (self.seq_len_q, self.seq_len_kv) {
            optional(&mut def, "slq", "LD_SLQ", lq);
            optional(&mut def, "slkv", "LD_SLKV", lkv);
            def("SLQ_S0", format!("{}LL", g.desc(lq).strides[0]));
            def("SLKV_S0", format!("{}LL", g.desc(lkv).strides[0]));
        }
        if let Some((tk, tv)) = self.paged {
            optional(&mut def, "ptk", "LD_PTK", tk);
            optional(&mut def, "ptv", "LD_PTV", tv);
            let (dk, dv) = (g.desc(tk), g.desc(tv));
            def("PTK_S0", format!("{}LL", dk.strides[0]));
            def("PTK_S2", format!("{}LL", dk.strides[2]));
            def("PTV_S0", format!("{}LL", dv.strides[0]));
            def("PTV_S2", format!("{}LL", dv.strides[2]));
            let (kd, vd) = (&g.desc(self.k).dims, &g.desc(self.v).dims);
            def("FA_KNB", format!("{}LL", kd[0]));
            def("FA_KBS", format!("{}LL", kd[2]));
            def("FA_VNB", format!("{}LL", vd[0]));
            def("FA_VBS", format!("{}LL", vd[2]));
        }
        if self.dropout.is_some() {
            if let (Some(seed), Some(offset)) = (self.seed, self.offset) {
                params.push("const void* seed_p".into());
                params.push("const void* offset_p".into());
                args.push(Arg::Ptr(seed));
                args.push(Arg::Ptr(offset));
                // By-value seeds live in the plan's constant buffer: read through the pointer too.
                init += &format!("    A.seed = fa_seed_bits({}(seed_p, 0));\n", ld(g, seed));
                init += &format!("    A.offset = fa_seed_bits({}(offset_p, 0));\n", ld(g, offset));
            }
        }
        if a.alibi {
            let slopes = alibi_slopes(self.h_q as usize);
            // A table in constant memory, not a switch: ptxas compiled the switch to an indirect
            // branch, across which it serialized a Hopper kernel's wgmmas (C7511).
            let list: Vec<String> = slopes.iter().map(|x| c_float(*x)).collect();
            let n = list.len();
            s += &format!(
                "__constant__ float fa_slopes[{n}] = {{{}}};\n__device__ __forceinline__ float fa_slope(i64 h) {{\n    return h >= 0 && h < {n} ? fa_slopes[h] : 0.0f;\n}}\n",
                list.join(", ")
            );
        }
        Common { defines: s, params, args, init }
    }

    /// `#define`s for an output stored through `fa_store_<name>(p, off, a, b)` (two elements
    /// `off` and `off + stride[3]`): pairs of 4 bytes when `pair`, else `st_<type>` each.
    pub fn output_store(&self, name: &str, prefix: &str, t: TensorId, pair: bool) -> String {
        let d = self.graph.desc(t);
        let mut s = String::new();
        for (i, &st) in d.strides.iter().enumerate() {
            s += &format!("#define {prefix}_S{i} {st}LL\n");
        }
        let body = if pair {
            "    *reinterpret_cast<u32*>(reinterpret_cast<u16*>(p) + off) = fa_pack(a, b);\n".to_string()
        } else {
            let f = st(self.graph, t);
            format!("    {f}(p, off, (double)a);\n    {f}(p, off + {prefix}_S3, (double)b);\n")
        };
        s += &format!("__device__ __forceinline__ void fa_store_{name}(void* p, i64 off, float a, float b) {{\n{body}}}\n");
        s
    }
}

/// What [`Problem::common`] produces.
pub(crate) struct Common {
    pub defines: String,
    pub params: Vec<String>,
    pub args: Vec<Arg>,
    pub init: String,
}

/// A float literal (C) that parses back to the f32 nearest `v`.
pub(crate) fn c_float(v: f64) -> String {
    let f = v as f32;
    if f.is_infinite() {
        return if f > 0.0 { "__int_as_float(0x7f800000)".into() } else { "__int_as_float(0xff800000)".into() };
    }
    format!("{f:e}f")
}

/// The smallest 32-bit Philox word `w` that keeps an element under dropout `p`: the CPU keeps
/// it when `(w + 0.5) / 2^32 >= p` (in f64, exact), i.e. when `w >= T`. At most 2^32.
pub(crate) fn drop_threshold(p: f64) -> u64 {
    let x = p * 4294967296.0;
    let mut t = (x - 0.5).ceil().clamp(0.0, 4294967296.0) as u64;
    while t > 0 && (t - 1) as f64 + 0.5 >= x {
        t -= 1;
    }
    while t < 4294967296 && (t as f64 + 0.5) < x {
        t += 1;
    }
    t
}

/// Device helpers of every attention kernel (after the `#define`s of [`Problem::common`]).
pub(crate) const HELPERS: &str = r#"
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
#define FA_INF __int_as_float(0x7f800000)
#define FA_NINF __int_as_float(0xff800000)
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

__device__ __forceinline__ i64 fa_min(i64 a, i64 b) { return a < b ? a : b; }
__device__ __forceinline__ i64 fa_max(i64 a, i64 b) { return a > b ? a : b; }

// 2^x (ex2.approx: 2^-22 relative; 2^-inf = 0).
__device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// D (16x8, f32) += A (16x16, row) * B (16x8, col); fragments as in the PTX ISA
// ("Matrix fragments for mma.m16n8k16"): lane = 4 * group + t;
// a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..];
// b0 = B[2t..2t+1][g], b1 = B[2t+8..][g]; c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..].
__device__ __forceinline__ void fa_mma(float* c, const u32* a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32." FA_MMA_T "." FA_MMA_T ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 b16 matrices from shared memory; lanes 8m..8m+7 give the row addresses of matrix m,
// lane l receives row l/4, columns 2(l%4), 2(l%4)+1 of each (of the transpose with .trans).
__device__ __forceinline__ void fa_ldsm(u32* r, const u16* p) {
    u32 a = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void fa_ldsm_t(u32* r, const u16* p) {
    u32 a = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void fa_cp16(u16* s, const u16* g) {
    u32 a = (u32)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(a), "l"(g) : "memory");
}
__device__ __forceinline__ void fa_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void fa_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }

// Two floats as a packed pair of the io type (lo in the low half), rounded to nearest even.
__device__ __forceinline__ u32 fa_pack(float lo, float hi) {
#if FA_BF16
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
#else
    __half2 v = __floats2half2_rn(lo, hi);
#endif
    return *reinterpret_cast<u32*>(&v);
}

// A tile of ROWS rows of W elements (W a multiple of 8) into shared memory (row stride LD);
// rowoff(r) is the element offset of row r in g, or -1 for a row of zeros. VEC: 16-byte
// cp.async per 8 elements (the caller commits and waits); else element-wise loads (strided by
// cs) and plain stores.
template <int ROWS, int W, int LD, int NT, int VEC, typename F>
__device__ __forceinline__ void fa_load(u16* s, const u16* g, i64 cs, F rowoff) {
    if constexpr (VEC != 0) {
        (void)cs;
        constexpr int CPR = W / 8;
        for (int c = threadIdx.x; c < ROWS * CPR; c += NT) {
            const int r = c / CPR, k = (c - r * CPR) * 8;
            const i64 o = rowoff(r);
            u16* d = s + r * LD + k;
            if (o >= 0) fa_cp16(d, g + o + k);
            else *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
        }
    } else {
        for (int e = threadIdx.x; e < ROWS * W; e += NT) {
            const int r = e / W, k = e - r * W;
            const i64 o = rowoff(r);
            s[r * LD + k] = o >= 0 ? g[o + (i64)k * cs] : (u16)0;
        }
    }
}

// Philox 4x32-10 as engine::cpu::rng: word index % 4 of the block index / 4.
__device__ __forceinline__ u64 fa_seed_bits(double v) {
    if (isnan(v)) return 0ULL;
    if (v >= 9223372036854775807.0) return (u64)9223372036854775807LL;
    if (v <= -9223372036854775808.0) return (u64)(-9223372036854775807LL - 1LL);
    return (u64)(long long)v;
}
__device__ __forceinline__ u32 fa_philox(u64 seed, u64 offset, u64 index) {
    u64 block = index >> 2;
    u32 c0 = (u32)block, c1 = (u32)(block >> 32), c2 = (u32)offset, c3 = (u32)(offset >> 32);
    u32 k0 = (u32)seed, k1 = (u32)(seed >> 32);
    #pragma unroll
    for (int round = 0; round < 10; ++round) {
        if (round > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        u32 hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        u32 hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        u32 n0 = hi1 ^ c1 ^ k0;
        u32 n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    }
    switch ((int)(index & 3ULL)) {
        case 0: return c0;
        case 1: return c1;
        case 2: return c2;
        default: return c3;
    }
}

// The optional inputs (null when absent).
struct FaIn {
    const void* bias; const void* slq; const void* slkv; const void* ptk; const void* ptv;
    u64 seed; u64 offset;
};

// Per-batch lengths, clamped to [0, s] (the CPU rejects others; a kernel must not index past).
__device__ __forceinline__ void fa_lens(const FaIn& A, i64 bi, i64& lq, i64& lkv) {
#if FA_PADDING
    double x = LD_SLQ(A.slq, bi * SLQ_S0);
    double y = LD_SLKV(A.slkv, bi * SLKV_S0);
    lq = (i64)fmin(fmax(x, 0.0), (double)FA_SQ);
    lkv = (i64)fmin(fmax(y, 0.0), (double)FA_SKV);
#else
    (void)A; (void)bi;
    lq = FA_SQ;
    lkv = FA_SKV;
#endif
}

// The diagonal offset: diag(i) = i + off.
__device__ __forceinline__ i64 fa_diag_off(i64 lq, i64 lkv) {
#if FA_BOTTOM_RIGHT
    return lkv - lq;
#else
    (void)lq; (void)lkv;
    return 0;
#endif
}

// Whether key j is visible from query row i (padded rows see nothing).
__device__ __forceinline__ bool fa_visible(i64 i, i64 j, i64 lq, i64 lkv, i64 off) {
    if (i >= lq || j >= lkv) return false;
    const i64 diag = i + off;
#if FA_CAUSAL
    if (j > diag) return false;
#endif
#if FA_HAS_SWL
    if (j < diag - FA_SWL) return false;
#endif
#if FA_HAS_SWR
    if (j > diag + FA_SWR) return false;
#endif
    (void)diag;
    return true;
}

// Keys [*jlo, *jhi) some row of [q0, imax] sees (imax < lq); empty when *jlo >= *jhi.
__device__ __forceinline__ void fa_key_range(i64 q0, i64 imax, i64 lkv, i64 off, i64& jlo, i64& jhi) {
    jlo = 0;
    jhi = lkv;
#if FA_CAUSAL
    jhi = fa_min(jhi, imax + off + 1);
#endif
#if FA_HAS_SWR
    jhi = fa_min(jhi, imax + off + FA_SWR + 1);
#endif
#if FA_HAS_SWL
    jlo = fa_max(jlo, q0 + off - FA_SWL);
#endif
    (void)q0; (void)imax; (void)off;
}

// Whether a tile of rows [i0, i0 + RM) and keys [j0, j0 + RN) needs element-wise masking.
__device__ __forceinline__ bool fa_tile_needs_mask(i64 i0, i64 rm, i64 j0, i64 rn, i64 lq, i64 lkv, i64 off) {
    bool need = i0 + rm > lq || j0 + rn > lkv;
#if FA_CAUSAL
    need = need || j0 + rn - 1 > i0 + off;
#endif
#if FA_HAS_SWR
    need = need || j0 + rn - 1 > i0 + off + FA_SWR;
#endif
#if FA_HAS_SWL
    need = need || j0 < i0 + rm - 1 + off - FA_SWL;
#endif
    (void)off;
    return need;
}

// bias + ALiBi of score (bi, h, i, j), natural units.
__device__ __forceinline__ float fa_add(const FaIn& A, i64 bi, i64 h, i64 i, i64 j) {
    float a = 0.0f;
#if FA_HAS_BIAS
    a += (float)LD_BIAS(A.bias, bi * BI_S0 + h * BI_S1 + i * BI_S2 + j * BI_S3);
#endif
#if FA_ALIBI
    a += fa_slope(h) * (float)(j - i);
#endif
    (void)A; (void)bi; (void)h; (void)i; (void)j;
    return a;
}

// Whether dropout keeps score (bi, h, i, j).
__device__ __forceinline__ bool fa_keep(const FaIn& A, i64 bi, i64 h, i64 i, i64 j) {
#if FA_DROPOUT
    const u64 idx = (u64)(((bi * FA_HQ + h) * FA_SQ + i) * FA_SKV + j);
    return (u64)fa_philox(A.seed, A.offset, idx) >= FA_DROP_T;
#else
    (void)A; (void)bi; (void)h; (void)i; (void)j;
    return true;
#endif
}

// Offset of row j (channel 0) of kv head kh of batch bi in K / V (through the page tables
// when paged); -1 for a page entry outside the pool (the CPU rejects those).
__device__ __forceinline__ i64 fa_krow(const FaIn& A, i64 bi, i64 kh, i64 j) {
#if FA_PAGED
    double e = LD_PTK(A.ptk, bi * PTK_S0 + (j / FA_KBS) * PTK_S2);
    if (!(e >= 0.0 && e < (double)FA_KNB)) return -1;
    return (i64)e * K_S0 + kh * K_S1 + (j % FA_KBS) * K_S2;
#else
    (void)A;
    return bi * K_S0 + kh * K_S1 + j * K_S2;
#endif
}
__device__ __forceinline__ i64 fa_vrow(const FaIn& A, i64 bi, i64 kh, i64 j) {
#if FA_PAGED
    double e = LD_PTV(A.ptv, bi * PTV_S0 + (j / FA_VBS) * PTV_S2);
    if (!(e >= 0.0 && e < (double)FA_VNB)) return -1;
    return (i64)e * V_S0 + kh * V_S1 + (j % FA_VBS) * V_S2;
#else
    (void)A;
    return bi * V_S0 + kh * V_S1 + j * V_S2;
#endif
}
"#;

/// Whether the tuning switch `name` is set to 0 in the environment (to compare a kernel variant
/// against the one without it in the benchmark).
pub(super) fn switched_off(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "0")
}

/// The `FaIn A` initialisation (all null) followed by the node's own fields.
pub(crate) fn fa_init(c: &Common) -> String {
    format!("    FaIn A;\n    A.bias = nullptr; A.slq = nullptr; A.slkv = nullptr; A.ptk = nullptr; A.ptv = nullptr; A.seed = 0; A.offset = 0;\n{}", c.init)
}

#[cfg(test)]
mod tests {
    use super::drop_threshold;

    #[test]
    fn dropout_threshold_matches_the_cpu_comparison() {
        for p in [0.0, 1e-12, 0.1, 0.2, 0.25, 0.3, 0.5, 0.7, 0.999_999_999, 1.0 - 1e-16] {
            let t = drop_threshold(p);
            let keep = |w: u64| (w as f64 + 0.5) / 4294967296.0 >= p;
            if t > 0 {
                assert!(!keep(t - 1), "p {p}: {t}");
            }
            if t < 4294967296 {
                assert!(keep(t), "p {p}: {t}");
            }
        }
    }
}
