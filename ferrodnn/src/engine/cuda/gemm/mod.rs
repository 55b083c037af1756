//! The GEMM engine: matmul on tensor cores with a fused prologue and epilogue.
//!
//! [`groups`] finds each matmul and the pointwise epilogue it absorbs; [`unit`] generates the
//! kernels of a group for the target (wgmma + TMA on sm_90a, mma.sync elsewhere), or returns
//! `None` so the group's nodes run on the other engines.
//!
//! The pieces are separate so that convolution can reuse them: a [`GemmProblem`] says what to
//! multiply (operands as strided matrices), an [`Epilogue`] what to do with each accumulator
//! before it is stored, and the kernel generators (`sm90`, `sm80`) how.

use super::engine::{Target, Unit};
use super::fallback::Arg;
use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::{Graph, TensorId};

/// One matrix operand: element `(batch, row, col)` lies at
/// `batch * batch_stride + row * row_stride + col * col_stride` elements from the tensor's
/// pointer. A (`m x k`), B (`k x n`), and the stored result C (`m x n`).
#[derive(Clone, Debug, PartialEq)]
pub struct Operand {
    pub tensor: TensorId,
    pub dtype: DataType,
    pub rows: usize,
    pub cols: usize,
    pub row_stride: i64,
    pub col_stride: i64,
    /// 0 when the operand is broadcast over the batch.
    pub batch_stride: i64,
}

/// `C[b] = epilogue(A[b] x B[b])` for `b < batch`, accumulated in f32 (f64 for f64 inputs).
#[derive(Clone, Debug, PartialEq)]
pub struct GemmProblem {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: Operand,
    pub b: Operand,
    pub c: Operand,
    /// f32 inputs may run as tf32 (the graph allows reduced precision).
    pub allow_tf32: bool,
}

/// What happens to each accumulator before it is stored: the group's pointwise nodes after the
/// matmul, as one device function
/// `__device__ __forceinline__ float epilogue(float acc, long long batch, long long row, long long col EPI_PARAMS)`
/// (the `code`), whose extra parameters are declared by `params` (e.g.
/// `, const void* __restrict__ e0, TRef e0r`) and passed by `names` (`, e0, e0r`); a kernel
/// appends `params` to its own parameter list and `args` to its own args. An empty epilogue
/// returns `acc`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Epilogue {
    /// The pointwise nodes absorbed, in topological order.
    pub nodes: Vec<usize>,
    pub code: String,
    pub params: String,
    pub names: String,
    pub args: Vec<Arg>,
}

/// Groups of nodes to run as one GEMM: the matmul first, then the epilogue nodes it absorbs,
/// in topological order.
pub fn groups(_graph: &Graph, _order: &[usize], _target: &Target) -> Vec<Vec<usize>> {
    Vec::new()
}

/// The unit of a GEMM group (or of a single matmul node), when this engine runs it.
pub fn unit(_graph: &Graph, _nodes: &[usize], _target: &Target) -> Result<Option<Unit>> {
    Ok(None)
}
pub mod sm90;
