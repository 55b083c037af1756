//! The C spelling of data types and literals, for every generator: one mapping, written once.

use crate::dtype::DataType;
use crate::graph::{Graph, TensorId};

/// The C type that holds one element of `dt` in device memory.
pub fn c_type(dt: DataType) -> &'static str {
    match dt {
        DataType::F64 => "double",
        DataType::F32 => "float",
        DataType::F16 => "__half",
        DataType::Bf16 => "__nv_bfloat16",
        DataType::Fp8E4m3 | DataType::Fp8E5m2 => "__nv_fp8_storage_t",
        DataType::I8 => "signed char",
        DataType::U8 | DataType::Bool => "unsigned char",
        DataType::I32 => "int",
        DataType::I64 => "long long",
    }
}

/// The C type of `dt` when it is one of the three float types the fast kernels load and store
/// with vector accesses (f32, f16, bf16), else None.
pub fn float_c_type(dt: DataType) -> Option<&'static str> {
    matches!(dt, DataType::F32 | DataType::F16 | DataType::Bf16).then(|| c_type(dt))
}

/// A tensor's data type as the kernels see it (f32 where the graph leaves it unresolved).
pub fn dtype(graph: &Graph, id: TensorId) -> DataType {
    graph.resolved_data_type(id).unwrap_or(DataType::F32)
}

/// `ld_<type>`: the prelude's load of one element of a tensor as double.
pub fn ld(graph: &Graph, id: TensorId) -> String {
    format!("ld_{}", dtype(graph, id).name())
}

/// `st_<type>`: the prelude's store of a double to one element of a tensor, rounded as the CPU
/// engine rounds.
pub fn st(graph: &Graph, id: TensorId) -> String {
    format!("st_{}", dtype(graph, id).name())
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

/// A `float` literal that C parses back to the f32 nearest `v` (infinities as bit patterns).
pub fn c_float(v: f64) -> String {
    let f = v as f32;
    if f.is_infinite() {
        return if f > 0.0 { "__int_as_float(0x7f800000)".into() } else { "__int_as_float(0xff800000)".into() };
    }
    format!("{f:e}f")
}
