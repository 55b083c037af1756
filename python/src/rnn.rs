//! The RNN descriptor as Python passes it (a dict of [`RnnDesc`]'s fields, as
//! `ferrodnn.rnn.rnn_desc` builds one), and the module functions that answer cuDNN's weight-space
//! queries: `rnn_weight_params` (cudnnGetRNNWeightParams) and `rnn_sizes` (the weight-space,
//! reserve and gate-gradient sizes).

use crate::InvalidArgumentError;
use ferrodnn::graph::ops::rnn::RnnDesc;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A descriptor from a dict of its fields (`cell_mode`, `input_size`, `hidden_size`, ...; the
/// names and values of the graph's JSON), checked by the descriptor's own rules.
pub fn desc_from_py(desc: &Bound<'_, PyAny>) -> PyResult<RnnDesc> {
    let py = desc.py();
    if !desc.is_instance_of::<PyDict>() {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!("the RNN descriptor must be a dict (ferrodnn.rnn.rnn_desc builds one), got {}", desc.get_type().name()?)));
    }
    let text: String = py.import("json")?.call_method1("dumps", (desc,))?.extract()?;
    let d: RnnDesc = serde_json::from_str(&text).map_err(|e| InvalidArgumentError::new_err(format!("the RNN descriptor {text} is not valid: {e}")))?;
    d.check().map_err(|m| InvalidArgumentError::new_err(format!("the RNN descriptor: {m}")))?;
    Ok(d)
}

/// Where matrix `lin_id` of pseudo-layer `pseudo_layer` and its bias live in the weight space:
/// `(matrix_offset, rows, cols, bias_offset, bias_len)` in elements (cuDNN's
/// cudnnGetRNNWeightParams).
#[pyfunction]
pub fn rnn_weight_params(desc: &Bound<'_, PyAny>, pseudo_layer: i64, lin_id: i64) -> PyResult<(i64, i64, i64, i64, i64)> {
    let d = desc_from_py(desc)?;
    let w = d.weight_params(pseudo_layer, lin_id).ok_or_else(|| {
        InvalidArgumentError::new_err(format!(
            "rnn_weight_params: pseudo_layer must be in [0, {}) and lin_id in [0, {}), got pseudo_layer {pseudo_layer}, lin_id {lin_id}",
            d.pseudo_layers(),
            d.lin_layers()
        ))
    })?;
    Ok((w.matrix_offset, w.rows, w.cols, w.bias_offset, w.bias_len))
}

/// The element counts of the weight space, the reserve and the gate gradients of a descriptor.
#[pyfunction]
pub fn rnn_sizes<'py>(desc: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    let d = desc_from_py(desc)?;
    let out = PyDict::new(desc.py());
    out.set_item("weight_space", d.weight_space_elements())?;
    out.set_item("reserve", d.reserve_elements())?;
    out.set_item("dgates", d.dgates_elements())?;
    out.set_item("lin_layers", d.lin_layers())?;
    out.set_item("pseudo_layers", d.pseudo_layers())?;
    Ok(out)
}
