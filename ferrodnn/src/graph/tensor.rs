//! Tensor descriptors: what the graph knows of a tensor (never its data).

use crate::dtype::DataType;
use serde::{Deserialize, Serialize};

/// Largest rank a tensor may have.
pub const MAX_RANK: usize = 8;

/// A handle to a tensor of one graph: its index in `Graph::tensors`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TensorId(pub usize);

/// A tensor of a graph. Dims and strides are in elements, outermost first (for an image,
/// `[n, c, h, w]` whatever the memory layout: channels-last is `strides = [h*w*c, 1, w*c, c]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorDesc {
    /// The key of this tensor's buffer in a variant pack. Assigned at validation when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<i64>,
    #[serde(default)]
    pub name: String,
    /// Empty until set by the user or inferred from the op that produces the tensor.
    #[serde(default)]
    pub dims: Vec<i64>,
    /// Empty means "packed, in the layout the producing op prefers" (row-major for inputs).
    #[serde(default)]
    pub strides: Vec<i64>,
    /// Unset means "the graph's io type" (or its intermediate type for a virtual tensor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_type: Option<DataType>,
    /// A virtual tensor is an intermediate with no buffer. Op outputs are virtual until
    /// `set_output` is called on them, as in the cudnn frontend.
    #[serde(default)]
    pub is_virtual: bool,
    /// A by-value scalar: its value travels with the graph (epsilon, a scale, ...), or, when
    /// `value` is `None`, with the variant pack as a host buffer of one element.
    #[serde(default)]
    pub is_pass_by_value: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    /// Ragged (packed) layout, as cuDNN's THD attention tensors: an integer tensor of `b + 1`
    /// elements whose entry `i` is where batch `i`'s elements start in this tensor's buffer (in
    /// elements), replacing `i * strides[0]`; only the rows a batch's sequence length covers
    /// exist. Taken by the attention ops' sequence tensors (see `graph::ops::sdpa`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ragged_offset: Option<TensorId>,
}

impl TensorDesc {
    /// A tensor with the given dims, packed row-major strides and data type.
    pub fn new(name: impl Into<String>, dims: &[i64], data_type: DataType) -> TensorDesc {
        TensorDesc {
            uid: None,
            name: name.into(),
            dims: dims.to_vec(),
            strides: packed_strides(dims),
            data_type: Some(data_type),
            is_virtual: false,
            is_pass_by_value: false,
            value: None,
            ragged_offset: None,
        }
    }

    /// A by-value scalar constant of shape `[1]`.
    pub fn scalar(name: impl Into<String>, value: f64, data_type: DataType) -> TensorDesc {
        TensorDesc { is_pass_by_value: true, value: Some(value), ..TensorDesc::new(name, &[1], data_type) }
    }

    /// A by-value scalar of shape `[1]` whose value comes with each execution's variant pack (a
    /// host buffer of one element), as cuDNN takes them: one plan serves every value.
    pub fn runtime_scalar(name: impl Into<String>, data_type: DataType) -> TensorDesc {
        TensorDesc { is_pass_by_value: true, ..TensorDesc::new(name, &[1], data_type) }
    }

    pub fn with_strides(mut self, strides: &[i64]) -> TensorDesc {
        self.strides = strides.to_vec();
        self
    }

    pub fn with_uid(mut self, uid: i64) -> TensorDesc {
        self.uid = Some(uid);
        self
    }

    pub fn with_data_type(mut self, data_type: DataType) -> TensorDesc {
        self.data_type = Some(data_type);
        self
    }

    /// Strides that store the dims in the order `order` (outermost first), packed.
    /// `order = [0, 2, 3, 1]` on `[n, c, h, w]` gives channels-last.
    pub fn with_layout(mut self, order: &[usize]) -> TensorDesc {
        self.strides = strides_for_order(&self.dims, order);
        self
    }

    /// The element stride of a tensor that holds a vector (one dim longer than 1, as ragged
    /// offsets): that dim's stride, 1 when every dim is 1.
    pub fn vector_stride(&self) -> i64 {
        self.strides.iter().zip(&self.dims).find(|(_, &n)| n > 1).map_or(1, |(&s, _)| s)
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Number of logical elements (1 for rank 0). Saturates instead of overflowing; validation
    /// rejects tensors whose sizes overflow.
    pub fn element_count(&self) -> i64 {
        self.dims.iter().fold(1i64, |acc, &d| acc.saturating_mul(d.max(0)))
    }

    /// Elements a buffer must hold for this tensor: one past the largest offset its strides
    /// reach. `None` when the arithmetic overflows i64.
    pub fn extent_elements(&self) -> Option<i64> {
        if self.dims.iter().any(|&d| d == 0) {
            return Some(0);
        }
        let mut max = 0i64;
        for (&d, &s) in self.dims.iter().zip(&self.strides) {
            max = max.checked_add((d - 1).checked_mul(s)?)?;
        }
        max.checked_add(1)
    }
}

/// Row-major packed strides for `dims`.
pub fn packed_strides(dims: &[i64]) -> Vec<i64> {
    let order: Vec<usize> = (0..dims.len()).collect();
    strides_for_order(dims, &order)
}

/// Packed strides with dims laid out in `order`, outermost first.
pub fn strides_for_order(dims: &[i64], order: &[usize]) -> Vec<i64> {
    let mut strides = vec![0i64; dims.len()];
    let mut acc = 1i64;
    for &axis in order.iter().rev() {
        if axis < dims.len() {
            strides[axis] = acc;
            acc = acc.saturating_mul(dims[axis].max(1));
        }
    }
    strides
}

/// The order of a tensor's dims from outermost to innermost by stride (stable for equal
/// strides, so packed row-major gives `0..rank`).
pub fn stride_order(strides: &[i64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..strides.len()).collect();
    order.sort_by(|&a, &b| strides[b].cmp(&strides[a]));
    order
}
