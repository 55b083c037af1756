//! Moving tensors between strided buffers and dense row-major arrays of `f64` (`Nd`).
//!
//! Engines' host-side code, the test helpers and the CLI share this: it is where a stride
//! meets a byte.

use crate::dtype::DataType;
use crate::graph::TensorDesc;

/// A dense row-major array of `f64`: the form the CPU engine computes on and the form tests
/// compare.
#[derive(Clone, Debug, PartialEq)]
pub struct Nd {
    pub dims: Vec<usize>,
    pub data: Vec<f64>,
}

impl Nd {
    pub fn new(dims: Vec<usize>, data: Vec<f64>) -> Nd {
        debug_assert_eq!(dims.iter().product::<usize>(), data.len());
        Nd { dims, data }
    }

    pub fn zeros(dims: &[usize]) -> Nd {
        Nd { dims: dims.to_vec(), data: vec![0.0; dims.iter().product()] }
    }

    pub fn filled(dims: &[usize], v: f64) -> Nd {
        Nd { dims: dims.to_vec(), data: vec![v; dims.iter().product()] }
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Row-major strides of the dense array.
    pub fn strides(&self) -> Vec<usize> {
        dense_strides(&self.dims)
    }

    /// Flat offset of a multi-index.
    pub fn offset(&self, index: &[usize]) -> usize {
        index.iter().zip(self.strides()).map(|(i, s)| i * s).sum()
    }

    pub fn at(&self, index: &[usize]) -> f64 {
        self.data[self.offset(index)]
    }

    /// The value at `index` of a shape this array broadcasts to (numpy rules: align right,
    /// size-1 axes repeat).
    pub fn broadcast_at(&self, index: &[usize]) -> f64 {
        let off = index.len() - self.dims.len();
        let mut flat = 0;
        let mut stride = 1;
        for a in (0..self.dims.len()).rev() {
            let i = if self.dims[a] == 1 { 0 } else { index[off + a] };
            flat += i * stride;
            stride *= self.dims[a];
        }
        self.data[flat]
    }
}

pub fn dense_strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// Calls `f(flat, multi_index)` for each index of `dims` in row-major order.
pub fn for_each_index(dims: &[usize], mut f: impl FnMut(usize, &[usize])) {
    let total: usize = dims.iter().product();
    if total == 0 {
        return;
    }
    let mut idx = vec![0usize; dims.len()];
    for flat in 0..total {
        f(flat, &idx);
        for a in (0..dims.len()).rev() {
            idx[a] += 1;
            if idx[a] < dims[a] {
                break;
            }
            idx[a] = 0;
        }
    }
}

/// Multi-index of a row-major flat offset.
pub fn unravel(mut flat: usize, dims: &[usize], out: &mut [usize]) {
    for a in (0..dims.len()).rev() {
        out[a] = flat % dims[a];
        flat /= dims[a];
    }
}

/// Element offset in a strided buffer of each logical element, in row-major order.
pub fn strided_offsets(desc: &TensorDesc) -> Vec<usize> {
    let dims: Vec<usize> = desc.dims.iter().map(|&d| d as usize).collect();
    let mut out = Vec::with_capacity(dims.iter().product());
    for_each_index(&dims, |_, idx| {
        out.push(idx.iter().zip(&desc.strides).map(|(&i, &s)| i * s as usize).sum());
    });
    out
}

/// Bytes a buffer must hold for `desc` (its extent times its element size).
pub fn required_bytes(desc: &TensorDesc, dtype: DataType) -> usize {
    desc.extent_elements().unwrap_or(0).max(0) as usize * dtype.size()
}

/// Read a strided buffer of `dtype` into a dense array. The caller checked the buffer is at
/// least `required_bytes` long.
pub fn gather(desc: &TensorDesc, dtype: DataType, bytes: &[u8]) -> Nd {
    let dims: Vec<usize> = desc.dims.iter().map(|&d| d as usize).collect();
    let data = strided_offsets(desc).into_iter().map(|o| dtype.read(bytes, o)).collect();
    Nd::new(dims, data)
}

/// Write a dense array into a strided buffer of `dtype`, rounding each value to the type.
pub fn scatter(desc: &TensorDesc, dtype: DataType, nd: &Nd, bytes: &mut [u8]) {
    for (o, &v) in strided_offsets(desc).into_iter().zip(&nd.data) {
        dtype.write(bytes, o, v);
    }
}
