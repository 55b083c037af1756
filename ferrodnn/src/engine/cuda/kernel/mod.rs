//! The kernel layer: the typed pieces every kernel generator of the CUDA engine uses, and nothing
//! that knows of ops. Everything else under `engine/cuda` builds on this module; it imports
//! nothing from them (only the TMA descriptor a launch argument may carry).
//!
//! - [`Target`] (the device: architecture, SM count, programmatic dependent launch) and
//!   [`Options`] (what the plan's knobs ask for, its tuning included), both part of the plan key.
//! - [`Launch`]: one kernel launch, with its grid, block, shared memory, cluster and
//!   dependent-launch mode as fields, and its arguments ([`Arg`]) by port.
//! - [`Signature`]: a kernel's parameter list and the matching arguments, built together.
//! - [`Source`]: one kernel's text, the configuration chosen in Rust (`#define`s) followed by the
//!   `.cuh` templates that read it; [`kernel_text`] adds the prelude (`prelude.cuh`) and the
//!   launch's dependent-launch mode, and is exactly what NVRTC compiles.
//! - [`ctype`]: the C spelling of data types and literals, in one place.
//!
//! Conventions of the device code (see `prelude.cuh`):
//! - A tensor reaches a kernel as a pointer, and where the kernel needs its layout at run time a
//!   `TRef` (logical dims and strides in elements, rank) passed by value.
//! - Each kernel calls `pdl_site()` once, before its first access to memory an earlier kernel may
//!   write (see [`Pdl`]).
//! - Values a user may change between executes are kernel arguments, never literals in the source,
//!   so one compiled plan serves every value.

pub mod ctype;
mod source;
mod target;

pub use source::{kernel_text, Signature, Source, HOPPER, PRELUDE};
pub use target::{Options, Target, Tuning};

use crate::dtype::DataType;
use crate::graph::{Graph, Node, TensorId};

/// How many blocks a launch runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grid {
    /// Enough blocks to give one thread to each of this many work items, capped at a few waves of
    /// the device: the kernel strides over the rest by the grid (`GRID_STRIDE`).
    Cover(u64),
    /// Exactly this grid (one block per row, per tile, ...).
    Exact(u32, u32, u32),
}

/// How a kernel is launched where the target has programmatic dependent launch
/// ([`Target::pdl`]); elsewhere every kernel is an ordinary launch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Pdl {
    /// A programmatic dependent: it waits at `pdl_site()` for the kernels before it, then lets
    /// the next one launch, so that launches and block scheduling overlap the previous kernel's
    /// last wave.
    #[default]
    Dependent,
    /// A dependent that waits but never lets the next kernel launch early: the next one then
    /// launches as this one's blocks exit (for kernels measured faster so).
    WaitOnly,
    /// An ordinary launch (for kernels measured slower as dependents).
    Independent,
}

/// One kernel launch of a node (or a fused group of nodes).
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    /// The kernel's text without the prelude ([`kernel_text`] adds it): it defines
    /// `extern "C" __global__ void <entry>(...)` with parameters in the order of `args`.
    pub source: String,
    pub entry: String,
    pub grid: Grid,
    /// Threads per block.
    pub block: u32,
    /// Dynamic shared memory in bytes (above 48 KiB the engine raises the kernel's limit).
    pub shared_bytes: u32,
    /// Thread-block cluster dims (sm_90+): the grid must be a multiple. A cluster kernel must be
    /// persistent (stride over its work by `gridDim`): the engine lowers `grid.x` to the
    /// clusters that fit on the device at once.
    pub cluster: Option<(u32, u32, u32)>,
    pub pdl: Pdl,
    pub args: Vec<Arg>,
}

impl Launch {
    /// A launch of `grid` blocks of `block` threads, no shared memory, no cluster, launched as a
    /// dependent.
    pub fn new(source: String, entry: impl Into<String>, grid: Grid, block: u32, args: Vec<Arg>) -> Launch {
        Launch { source, entry: entry.into(), grid, block, shared_bytes: 0, cluster: None, pdl: Pdl::Dependent, args }
    }
    /// A grid-stride launch over `threads` work items with 256-thread blocks.
    pub fn elementwise(source: String, entry: &str, threads: u64, args: Vec<Arg>) -> Launch {
        Launch::new(source, entry, Grid::Cover(threads), 256, args)
    }
    /// This launch with `bytes` of dynamic shared memory.
    pub fn with_shared(mut self, bytes: u32) -> Launch {
        self.shared_bytes = bytes;
        self
    }
    /// This launch with another dependent-launch mode.
    pub fn with_pdl(mut self, pdl: Pdl) -> Launch {
        self.pdl = pdl;
        self
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
    /// A `float` parameter: a value a user may change between plans (an epsilon, a scale, a
    /// probability, a clip bound), passed rather than compiled in so that one kernel serves
    /// every value.
    F32(f32),
    /// The value of by-value scalar tensor `tensor` (the graph's, or the variant pack's when the
    /// graph gives none), rounded to the tensor's type (as the CPU engine reads it), then times
    /// `times` (in f64), as a `double` parameter when `double`, else a `float`.
    Scalar {
        tensor: TensorId,
        double: bool,
        times: f64,
    },
    /// The value of by-value scalar tensor `tensor` encoded in its own type, zero-extended to an
    /// `unsigned long long` parameter.
    ScalarWord(TensorId),
    /// A TMA tensor map (`const __grid_constant__ TmaMap`, 128 bytes) over a tensor, encoded
    /// when the plan executes from the tensor's pointer (see [`crate::engine::cuda::tma`]).
    TensorMap(Box<crate::engine::cuda::tma::TmaDesc>),
    /// A TMA tensor map over scratch buffer `i` of this node (the descriptor's `tensor` is not
    /// used): for a copy that an earlier launch of the node wrote there.
    ScratchTensorMap(usize, Box<crate::engine::cuda::tma::TmaDesc>),
}

/// A node attribute that a kernel takes as a parameter: the op's own value, or the by-value
/// scalar on the node's attribute port (`epsilon`, `momentum`, `attn_scale`: see
/// `Graph::set_attribute_tensor`), whose value comes from the graph or from each execution's
/// variant pack. Either way the kernel's code is the same, so one compilation serves every value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Attr {
    Value(f64),
    Tensor { tensor: TensorId, times: f64 },
}

impl Attr {
    /// Attribute `port` of `node`: its tensor when the port is connected, else `value` (the op's).
    pub fn of(node: &Node, port: &str, value: f64) -> Attr {
        match node.input(port) {
            Some(tensor) => Attr::Tensor { tensor, times: 1.0 },
            None => Attr::Value(value),
        }
    }
    /// The value when the plan knows it: the op's, or the one the graph gives the port's tensor
    /// (rounded to its type); None when it comes with each execution.
    pub fn known(self, graph: &Graph) -> Option<f64> {
        match self {
            Attr::Value(v) => Some(v),
            Attr::Tensor { tensor, times } => {
                let dt = graph.resolved_data_type(tensor).unwrap_or(DataType::F32);
                graph.desc(tensor).value.map(|v| dt.quantize(v) * times)
            }
        }
    }
    /// The attribute times `k` (for a kernel that takes a scaled copy too).
    pub fn times(self, k: f64) -> Attr {
        match self {
            Attr::Value(v) => Attr::Value(v * k),
            Attr::Tensor { tensor, times } => Attr::Tensor { tensor, times: times * k },
        }
    }
    /// As a kernel argument: a `double` parameter when `double`, else a `float`.
    pub fn arg(self, double: bool) -> Arg {
        match (self, double) {
            (Attr::Value(v), true) => Arg::F64(v),
            (Attr::Value(v), false) => Arg::F32(v as f32),
            (Attr::Tensor { tensor, times }, _) => Arg::Scalar { tensor, double, times },
        }
    }
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

/// The kernels of a group of nodes (one node, or a fused chain) and the tensors they write.
#[derive(Clone, Debug)]
pub struct Unit {
    /// Node indices covered, in topological order.
    pub nodes: Vec<usize>,
    pub kernels: NodeKernels,
    /// Tensors the unit writes to memory (outputs consumed outside the unit, or graph outputs);
    /// tensors internal to the unit never reach memory.
    pub writes: Vec<TensorId>,
    /// Kernels to run instead when a listed tensor's pointer is not 16-byte aligned at execute
    /// time (fast kernels with TMA or vector accesses that need it; the pointer is only known
    /// then). The alternative must compute the same outputs.
    pub unaligned: Option<Box<Unaligned>>,
}

/// See [`Unit::unaligned`].
#[derive(Clone, Debug)]
pub struct Unaligned {
    pub tensors: Vec<TensorId>,
    pub kernels: NodeKernels,
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

/// A C identifier made from a node's index and a suffix, so that kernels of different nodes
/// never share a name inside one module.
pub fn entry_name(node_index: usize, what: &str) -> String {
    format!("n{node_index}_{what}")
}
