//! The generic fallback: a CUDA C++ kernel (or a few) generated for every node of any valid
//! graph, so that every graph that validates runs on the GPU. Faster engines take precedence
//! where they apply; this one stays as the one that always works.
//!
//! Conventions of the generated code (see [`PRELUDE`]):
//! - Every tensor reaches a kernel as a pointer plus a `TRef` (logical dims and strides in
//!   elements, rank) passed by value; every element is read through `ld_<type>` into `double`
//!   and written through `st_<type>`, which rounds as the CPU engine's `DataType::quantize`
//!   does (round to nearest even; fp8 and integers saturate; NaN to 0 in integers).
//! - Arithmetic is in `double`: the fallback favours agreement with the CPU reference over
//!   speed (the H100 runs f64 at a quarter of its f32 rate, which a fallback can afford).
//! - Indices are 64-bit; loops are grid-stride, so any launch size covers any tensor.
//! - A family file returns [`NodeKernels`]: launches in order, each naming its arguments by
//!   port ([`Arg`]), plus scratch buffers the plan carves out of the workspace.

mod conv;
mod matmul;
mod norm;
mod pointwise;
mod reduction;
mod resample;
mod rng;
mod sdpa;
mod softmax;
mod transform;

use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::graph::ops::Op;
use crate::graph::{Graph, Node, TensorId};

/// One kernel launch of a node.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    /// The kernel's source, without the prelude (the engine prepends [`PRELUDE`]). It must
    /// define `extern "C" __global__ void <entry>(...)` with parameters in the order of `args`.
    pub source: String,
    pub entry: String,
    /// Threads wanted in all (the engine picks the grid: enough blocks of `block` threads to
    /// cover `threads`, capped, with grid-stride loops covering the rest). Use
    /// [`Launch::exact_grid`] instead when the kernel needs one block per work item.
    pub threads: u64,
    pub block: u32,
    /// Set when the kernel needs exactly this grid (e.g. one block per row).
    pub exact_grid: Option<(u32, u32, u32)>,
    pub shared_bytes: u32,
    pub args: Vec<Arg>,
    /// Thread-block cluster dims (sm_90+): the grid (then `exact_grid`) must be a multiple. A
    /// cluster kernel must be persistent (stride over its work by `gridDim`): the engine lowers
    /// `grid.x` to the clusters that fit on the device at once.
    pub cluster: Option<(u32, u32, u32)>,
}

impl Launch {
    /// A grid-stride launch over `threads` work items with 256-thread blocks.
    pub fn elementwise(source: String, entry: &str, threads: u64, args: Vec<Arg>) -> Launch {
        Launch { source, entry: entry.to_string(), threads, block: 256, exact_grid: None, shared_bytes: 0, args, cluster: None }
    }
}

/// A kernel argument, resolved to a value when the plan executes.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    /// The device pointer of a tensor (a variant-pack buffer, a workspace slice for a virtual
    /// tensor, or the plan's constant buffer for a by-value scalar).
    Ptr(TensorId),
    /// The `TRef` (dims, strides, rank) of a tensor.
    Ref(TensorId),
    /// The device pointer of scratch buffer `i` of this node (`NodeKernels::scratch[i]`).
    Scratch(usize),
    I64(i64),
    F64(f64),
    /// A TMA tensor map (`const __grid_constant__ TmaMap`, 128 bytes) over a tensor, encoded
    /// when the plan executes from the tensor's pointer (see [`crate::engine::cuda::tma`]).
    TensorMap(Box<crate::engine::cuda::tma::TmaDesc>),
    /// A TMA tensor map over scratch buffer `i` of this node (the descriptor's `tensor` is not
    /// used): for a copy that an earlier launch of the node wrote there.
    ScratchTensorMap(usize, Box<crate::engine::cuda::tma::TmaDesc>),
}

/// What a node needs: its launches, in order, and the sizes in bytes of its scratch buffers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeKernels {
    pub launches: Vec<Launch>,
    pub scratch: Vec<usize>,
}

impl NodeKernels {
    pub fn one(launch: Launch) -> NodeKernels {
        NodeKernels { launches: vec![launch], scratch: Vec::new() }
    }
}

/// The `TRef` as the kernels see it: must match the C struct in [`PRELUDE`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TRef {
    pub dims: [i64; 8],
    pub strides: [i64; 8],
    pub rank: i32,
    pub _pad: i32,
}

impl TRef {
    pub fn of(graph: &Graph, id: TensorId) -> TRef {
        let d = graph.desc(id);
        let mut t = TRef { dims: [1; 8], strides: [0; 8], rank: d.dims.len() as i32, _pad: 0 };
        for (i, (&dim, &s)) in d.dims.iter().zip(&d.strides).enumerate().take(8) {
            t.dims[i] = dim;
            t.strides[i] = s;
        }
        t
    }
}

/// A line a kernel's source may start with to be launched as an ordinary launch where the
/// target has programmatic dependent launches ([`Target::pdl`](crate::engine::cuda::Target)):
/// for kernels measured slower as dependents.
pub const INDEPENDENT_LAUNCH: &str = "// launched independently (not as a programmatic dependent)\n";

/// A line a kernel's source may start with to be launched as a programmatic dependent that
/// waits for its predecessor but never triggers its own dependent early (the next kernel then
/// launches as this one's blocks exit): for kernels measured faster so than with the trigger.
pub const WAIT_ONLY_LAUNCH: &str = "// launched as a programmatic dependent, without the early trigger\n";

/// A statement a kernel's source may hold to choose where its dependent-launch prologue goes:
/// the wait (and trigger) run there rather than as the entry's first statements, so the kernel
/// may issue L2 prefetches of its first input before waiting. That is sound: a prefetch returns
/// nothing to the thread and changes no memory, and every load after the wait sees the
/// predecessor's writes (L2 is the point of coherence; the prefetched lines are updated by
/// them). The engine defines `pdl_site()` (empty where the launch is not a dependent).
pub const PDL_SITE: &str = "pdl_site();";

/// Included at the top of every generated kernel.
pub const PRELUDE: &str = r#"
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
typedef long long i64;
struct TRef { i64 dims[8]; i64 strides[8]; int rank; int pad; };

// Loads: element `o` (in elements) of a buffer, as double.
__device__ __forceinline__ double ld_f64(const void* p, i64 o) { return ((const double*)p)[o]; }
__device__ __forceinline__ double ld_f32(const void* p, i64 o) { return (double)((const float*)p)[o]; }
__device__ __forceinline__ double ld_f16(const void* p, i64 o) { return (double)__half2float(((const __half*)p)[o]); }
__device__ __forceinline__ double ld_bf16(const void* p, i64 o) { return (double)__bfloat162float(((const __nv_bfloat16*)p)[o]); }
__device__ __forceinline__ double ld_fp8_e4m3(const void* p, i64 o) {
    __half_raw h = __nv_cvt_fp8_to_halfraw(((const __nv_fp8_storage_t*)p)[o], __NV_E4M3);
    return (double)__half2float(__half(h));
}
__device__ __forceinline__ double ld_fp8_e5m2(const void* p, i64 o) {
    __half_raw h = __nv_cvt_fp8_to_halfraw(((const __nv_fp8_storage_t*)p)[o], __NV_E5M2);
    return (double)__half2float(__half(h));
}
__device__ __forceinline__ double ld_i8(const void* p, i64 o) { return (double)((const signed char*)p)[o]; }
__device__ __forceinline__ double ld_u8(const void* p, i64 o) { return (double)((const unsigned char*)p)[o]; }
__device__ __forceinline__ double ld_i32(const void* p, i64 o) { return (double)((const int*)p)[o]; }
__device__ __forceinline__ double ld_i64(const void* p, i64 o) { return (double)((const long long*)p)[o]; }
__device__ __forceinline__ double ld_bool(const void* p, i64 o) { return ((const unsigned char*)p)[o] != 0 ? 1.0 : 0.0; }

// Stores: round `v` to the type as the CPU engine does.
__device__ __forceinline__ double sat_round(double v, double lo, double hi) {
    if (isnan(v)) return 0.0;
    return fmin(fmax(round(v), lo), hi);
}
__device__ __forceinline__ void st_f64(void* p, i64 o, double v) { ((double*)p)[o] = v; }
__device__ __forceinline__ void st_f32(void* p, i64 o, double v) { ((float*)p)[o] = (float)v; }
__device__ __forceinline__ void st_f16(void* p, i64 o, double v) { ((__half*)p)[o] = __double2half(v); }
__device__ __forceinline__ void st_bf16(void* p, i64 o, double v) { ((__nv_bfloat16*)p)[o] = __double2bfloat16(v); }
__device__ __forceinline__ void st_fp8_e4m3(void* p, i64 o, double v) {
    ((__nv_fp8_storage_t*)p)[o] = __nv_cvt_double_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ void st_fp8_e5m2(void* p, i64 o, double v) {
    ((__nv_fp8_storage_t*)p)[o] = __nv_cvt_double_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
}
__device__ __forceinline__ void st_i8(void* p, i64 o, double v) { ((signed char*)p)[o] = (signed char)sat_round(v, -128.0, 127.0); }
__device__ __forceinline__ void st_u8(void* p, i64 o, double v) { ((unsigned char*)p)[o] = (unsigned char)sat_round(v, 0.0, 255.0); }
__device__ __forceinline__ void st_i32(void* p, i64 o, double v) { ((int*)p)[o] = (int)sat_round(v, -2147483648.0, 2147483647.0); }
__device__ __forceinline__ void st_i64(void* p, i64 o, double v) {
    double r = sat_round(v, -9223372036854775808.0, 9223372036854775807.0);
    ((long long*)p)[o] = r >= 9223372036854775807.0 ? 9223372036854775807LL : (long long)r;
}
__device__ __forceinline__ void st_bool(void* p, i64 o, double v) { ((unsigned char*)p)[o] = (v != 0.0 && !isnan(v)) ? 1 : 0; }

// Round a double to what a type can hold (the CPU engine's DataType::quantize), for values a
// kernel keeps in registers but the reference rounds (e.g. inputs rounded to the compute type).
__device__ __forceinline__ double q_f32(double v) { return (double)(float)v; }

// The element count of a tensor.
__device__ __forceinline__ i64 numel(const TRef& t) { i64 n = 1; for (int a = 0; a < t.rank; ++a) n *= t.dims[a]; return n; }

// Strided offset of the element at row-major logical index `flat`.
__device__ __forceinline__ i64 offset_of(const TRef& t, i64 flat) {
    i64 off = 0;
    for (int a = t.rank - 1; a >= 0; --a) { i64 i = flat % t.dims[a]; flat /= t.dims[a]; off += i * t.strides[a]; }
    return off;
}

// Multi-index of row-major logical index `flat` in `t`'s dims.
__device__ __forceinline__ void unravel(const TRef& t, i64 flat, i64* idx) {
    for (int a = t.rank - 1; a >= 0; --a) { idx[a] = flat % t.dims[a]; flat /= t.dims[a]; }
}

// Strided offset of a multi-index.
__device__ __forceinline__ i64 offset_at(const TRef& t, const i64* idx) {
    i64 off = 0;
    for (int a = 0; a < t.rank; ++a) off += idx[a] * t.strides[a];
    return off;
}

// Offset in `t` of the element a numpy-broadcast read at output index `idx` (of rank
// `out_rank`) sees: dims align on the right, size-1 dims repeat.
__device__ __forceinline__ i64 bcast_offset(const TRef& t, const i64* idx, int out_rank) {
    i64 off = 0;
    int shift = out_rank - t.rank;
    for (int a = 0; a < t.rank; ++a) { i64 i = t.dims[a] == 1 ? 0 : idx[a + shift]; off += i * t.strides[a]; }
    return off;
}

#define GRID_STRIDE(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)
"#;

/// The suffix of a type's `ld_`/`st_` functions in [`PRELUDE`]: the type's own name.
pub fn type_suffix(dt: DataType) -> &'static str {
    dt.name()
}

/// `ld_<type>` for a tensor of the graph.
pub fn ld(graph: &Graph, id: TensorId) -> String {
    format!("ld_{}", type_suffix(graph.resolved_data_type(id).unwrap_or(DataType::F32)))
}

/// `st_<type>` for a tensor of the graph.
pub fn st(graph: &Graph, id: TensorId) -> String {
    format!("st_{}", type_suffix(graph.resolved_data_type(id).unwrap_or(DataType::F32)))
}

/// The tensor on an input port, or an error naming it.
pub fn input(node: &Node, port: &str) -> Result<TensorId> {
    node.input(port).ok_or_else(|| Error::op(node.op.kind(), &node.name, format!("input `{port}` is missing")))
}

/// The tensor on an output port, or an error naming it.
pub fn output(node: &Node, port: &str) -> Result<TensorId> {
    node.output(port).ok_or_else(|| Error::op(node.op.kind(), &node.name, format!("output `{port}` is missing")))
}

/// A C identifier made from a node's index and a suffix, so that kernels of different nodes
/// never share a name inside one module.
pub fn entry_name(node_index: usize, what: &str) -> String {
    format!("n{node_index}_{what}")
}

/// The kernels of one node of a validated graph.
pub fn generate(graph: &Graph, node_index: usize) -> Result<NodeKernels> {
    let node = &graph.nodes[node_index];
    let ctx = Ctx { graph, node, index: node_index };
    match &node.op {
        Op::ConvFprop(a) => conv::fprop(&ctx, a),
        Op::ConvDgrad(a) => conv::dgrad(&ctx, a),
        Op::ConvWgrad(a) => conv::wgrad(&ctx, a),
        Op::Matmul(a) => matmul::matmul(&ctx, a),
        Op::Pointwise(a) => pointwise::pointwise(&ctx, a),
        Op::Reduction(a) => reduction::reduction(&ctx, a),
        Op::Batchnorm(a) => norm::batchnorm(&ctx, a),
        Op::BatchnormInference(a) => norm::batchnorm_inference(&ctx, a),
        Op::BatchnormBackward(a) => norm::batchnorm_backward(&ctx, a),
        Op::Genstats(a) => norm::genstats(&ctx, a),
        Op::BnFinalize(a) => norm::bn_finalize(&ctx, a),
        Op::Layernorm(a) => norm::layernorm(&ctx, a),
        Op::LayernormBackward(a) => norm::layernorm_backward(&ctx, a),
        Op::Rmsnorm(a) => norm::rmsnorm(&ctx, a),
        Op::RmsnormBackward(a) => norm::rmsnorm_backward(&ctx, a),
        Op::Instancenorm(a) => norm::instancenorm(&ctx, a),
        Op::InstancenormBackward(a) => norm::instancenorm_backward(&ctx, a),
        Op::Adalayernorm(a) => norm::adalayernorm(&ctx, a),
        Op::AdalayernormBackward(a) => norm::adalayernorm_backward(&ctx, a),
        Op::Softmax(a) => softmax::softmax(&ctx, a),
        Op::SoftmaxBackward(a) => softmax::softmax_backward(&ctx, a),
        Op::Resample(a) => resample::resample(&ctx, a),
        Op::ResampleBackward(a) => resample::resample_backward(&ctx, a),
        Op::Sdpa(a) => sdpa::sdpa(&ctx, a),
        Op::SdpaBackward(a) => sdpa::sdpa_backward(&ctx, a),
        Op::Reshape(a) => transform::reshape(&ctx, a),
        Op::Transpose(a) => transform::transpose(&ctx, a),
        Op::Slice(a) => transform::slice(&ctx, a),
        Op::Concatenate(a) => transform::concatenate(&ctx, a),
        Op::Copy(a) => transform::copy(&ctx, a),
        Op::Rng(a) => rng::rng(&ctx, a),
    }
}

/// What a family's generator sees.
pub struct Ctx<'a> {
    pub graph: &'a Graph,
    pub node: &'a Node,
    /// The node's index in the graph (for unique kernel names).
    pub index: usize,
}

impl Ctx<'_> {
    pub fn input(&self, port: &str) -> Result<TensorId> {
        input(self.node, port)
    }
    pub fn output(&self, port: &str) -> Result<TensorId> {
        output(self.node, port)
    }
    pub fn ld(&self, id: TensorId) -> String {
        ld(self.graph, id)
    }
    pub fn st(&self, id: TensorId) -> String {
        st(self.graph, id)
    }
    pub fn entry(&self, what: &str) -> String {
        entry_name(self.index, what)
    }
    pub fn dims(&self, id: TensorId) -> Vec<i64> {
        self.graph.desc(id).dims.clone()
    }
    pub fn numel(&self, id: TensorId) -> u64 {
        self.graph.desc(id).element_count().max(0) as u64
    }
    pub fn data_type(&self, id: TensorId) -> DataType {
        self.graph.resolved_data_type(id).unwrap_or(DataType::F32)
    }
    pub fn err(&self, message: impl std::fmt::Display) -> Error {
        Error::op(self.node.op.kind(), &self.node.name, message)
    }
    /// A NotSupported error for a case the fallback does not generate.
    pub fn unsupported(&self, message: impl std::fmt::Display) -> Error {
        Error::NotSupported(format!("{} \"{}\": the CUDA fallback {message}", self.node.op.kind(), self.node.name))
    }
}

/// A `double` literal that C parses back to the same value (NaN and infinities spelled out).
pub fn c_double(v: f64) -> String {
    if v.is_nan() {
        "(0.0/0.0)".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "(1.0/0.0)".into()
        } else {
            "(-1.0/0.0)".into()
        }
    } else {
        format!("{v:e}")
    }
}
