//! Element data types and their conversion to and from `f64`.
//!
//! Every engine stores tensors in one of these types. The CPU engine reads each element into an
//! `f64`, computes, and rounds the result back to the tensor's type, so conversion lives here,
//! once, for every engine's host-side code.

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

/// The element type of a tensor, named as in cuDNN's graph API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataType {
    F64,
    F32,
    F16,
    Bf16,
    /// 8-bit float, 4 exponent bits, 3 mantissa bits, no infinities (the "fn" variant).
    Fp8E4m3,
    /// 8-bit float, 5 exponent bits, 2 mantissa bits, IEEE-like.
    Fp8E5m2,
    I8,
    U8,
    I32,
    I64,
    Bool,
}

impl DataType {
    pub const ALL: [DataType; 11] = [
        DataType::F64,
        DataType::F32,
        DataType::F16,
        DataType::Bf16,
        DataType::Fp8E4m3,
        DataType::Fp8E5m2,
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::I64,
        DataType::Bool,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::F64 | DataType::I64 => 8,
            DataType::F32 | DataType::I32 => 4,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::Fp8E4m3 | DataType::Fp8E5m2 | DataType::I8 | DataType::U8 | DataType::Bool => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DataType::F64 | DataType::F32 | DataType::F16 | DataType::Bf16 | DataType::Fp8E4m3 | DataType::Fp8E5m2)
    }

    pub fn is_integer(self) -> bool {
        matches!(self, DataType::I8 | DataType::U8 | DataType::I32 | DataType::I64)
    }

    pub fn is_fp8(self) -> bool {
        matches!(self, DataType::Fp8E4m3 | DataType::Fp8E5m2)
    }

    /// The name used in JSON and in error messages.
    pub fn name(self) -> &'static str {
        match self {
            DataType::F64 => "f64",
            DataType::F32 => "f32",
            DataType::F16 => "f16",
            DataType::Bf16 => "bf16",
            DataType::Fp8E4m3 => "fp8_e4m3",
            DataType::Fp8E5m2 => "fp8_e5m2",
            DataType::I8 => "i8",
            DataType::U8 => "u8",
            DataType::I32 => "i32",
            DataType::I64 => "i64",
            DataType::Bool => "bool",
        }
    }

    /// Round an `f64` to the nearest value this type can hold (saturating integers and fp8,
    /// truncating nothing else), returned as `f64`.
    pub fn quantize(self, v: f64) -> f64 {
        match self {
            DataType::F64 => v,
            DataType::F32 => v as f32 as f64,
            DataType::F16 => f16::from_f64(v).to_f64(),
            DataType::Bf16 => bf16::from_f64(v).to_f64(),
            DataType::Fp8E4m3 => fp8_decode(fp8_encode(v, E4M3), E4M3),
            DataType::Fp8E5m2 => fp8_decode(fp8_encode(v, E5M2), E5M2),
            DataType::I8 => int_round(v, i8::MIN as f64, i8::MAX as f64),
            DataType::U8 => int_round(v, 0.0, u8::MAX as f64),
            DataType::I32 => int_round(v, i32::MIN as f64, i32::MAX as f64),
            DataType::I64 => int_round(v, i64::MIN as f64, i64::MAX as f64),
            DataType::Bool => {
                if v != 0.0 && !v.is_nan() {
                    1.0
                } else {
                    0.0
                }
            }
        }
    }

    /// Read element `index` (in elements) of a little-endian buffer as `f64`.
    /// The caller guarantees `(index + 1) * self.size() <= bytes.len()`.
    pub fn read(self, bytes: &[u8], index: usize) -> f64 {
        let s = self.size();
        let b = &bytes[index * s..index * s + s];
        match self {
            DataType::F64 => f64::from_le_bytes(b.try_into().unwrap_or([0; 8])),
            DataType::F32 => f32::from_le_bytes(b.try_into().unwrap_or([0; 4])) as f64,
            DataType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f64(),
            DataType::Bf16 => bf16::from_le_bytes([b[0], b[1]]).to_f64(),
            DataType::Fp8E4m3 => fp8_decode(b[0], E4M3),
            DataType::Fp8E5m2 => fp8_decode(b[0], E5M2),
            DataType::I8 => b[0] as i8 as f64,
            DataType::U8 => b[0] as f64,
            DataType::I32 => i32::from_le_bytes(b.try_into().unwrap_or([0; 4])) as f64,
            DataType::I64 => i64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as f64,
            DataType::Bool => (b[0] != 0) as u8 as f64,
        }
    }

    /// Write `v`, rounded to this type, as element `index` of a little-endian buffer.
    pub fn write(self, bytes: &mut [u8], index: usize, v: f64) {
        let s = self.size();
        let b = &mut bytes[index * s..index * s + s];
        match self {
            DataType::F64 => b.copy_from_slice(&v.to_le_bytes()),
            DataType::F32 => b.copy_from_slice(&(v as f32).to_le_bytes()),
            DataType::F16 => b.copy_from_slice(&f16::from_f64(v).to_le_bytes()),
            DataType::Bf16 => b.copy_from_slice(&bf16::from_f64(v).to_le_bytes()),
            DataType::Fp8E4m3 => b[0] = fp8_encode(v, E4M3),
            DataType::Fp8E5m2 => b[0] = fp8_encode(v, E5M2),
            DataType::I8 => b[0] = self.quantize(v) as i8 as u8,
            DataType::U8 => b[0] = self.quantize(v) as u8,
            DataType::I32 => b.copy_from_slice(&(self.quantize(v) as i32).to_le_bytes()),
            DataType::I64 => b.copy_from_slice(&(self.quantize(v) as i64).to_le_bytes()),
            DataType::Bool => b[0] = self.quantize(v) as u8,
        }
    }

    /// Encode a slice of values into a new little-endian buffer of this type.
    pub fn encode(self, values: &[f64]) -> Vec<u8> {
        let mut out = vec![0u8; values.len() * self.size()];
        for (i, &v) in values.iter().enumerate() {
            self.write(&mut out, i, v);
        }
        out
    }

    /// Decode a whole little-endian buffer of this type.
    pub fn decode(self, bytes: &[u8]) -> Vec<f64> {
        (0..bytes.len() / self.size()).map(|i| self.read(bytes, i)).collect()
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DataType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        DataType::ALL
            .iter()
            .copied()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("unknown data type `{s}`; expected one of f64, f32, f16, bf16, fp8_e4m3, fp8_e5m2, i8, u8, i32, i64, bool"))
    }
}

/// NaN maps to 0; integers round half away from zero and saturate at the type's bounds.
fn int_round(v: f64, lo: f64, hi: f64) -> f64 {
    if v.is_nan() {
        0.0
    } else {
        v.round().clamp(lo, hi)
    }
}

#[derive(Clone, Copy)]
struct Fp8Format {
    exp_bits: u32,
    man_bits: u32,
    bias: i32,
    /// Largest finite magnitude.
    max: f64,
    /// Whether the all-ones exponent encodes inf/NaN (e5m2) rather than normal numbers (e4m3fn).
    ieee_specials: bool,
}

const E4M3: Fp8Format = Fp8Format { exp_bits: 4, man_bits: 3, bias: 7, max: 448.0, ieee_specials: false };
const E5M2: Fp8Format = Fp8Format { exp_bits: 5, man_bits: 2, bias: 15, max: 57344.0, ieee_specials: true };

fn fp8_decode(byte: u8, f: Fp8Format) -> f64 {
    let sign = if byte & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((byte >> f.man_bits) as u32) & ((1 << f.exp_bits) - 1);
    let man = (byte as u32) & ((1 << f.man_bits) - 1);
    let exp_max = (1 << f.exp_bits) - 1;
    if f.ieee_specials && exp == exp_max {
        return if man == 0 { sign * f64::INFINITY } else { f64::NAN };
    }
    if !f.ieee_specials && exp == exp_max && man == (1 << f.man_bits) - 1 {
        return f64::NAN;
    }
    let scale = (1u32 << f.man_bits) as f64;
    if exp == 0 {
        sign * (man as f64 / scale) * 2f64.powi(1 - f.bias)
    } else {
        sign * (1.0 + man as f64 / scale) * 2f64.powi(exp as i32 - f.bias)
    }
}

/// Round to nearest even, saturating to the largest finite value (as CUDA's `satfinite`
/// conversions do); NaN stays NaN, and infinities saturate too.
fn fp8_encode(v: f64, f: Fp8Format) -> u8 {
    if v.is_nan() {
        return if f.ieee_specials { 0x7f } else { 0x7f };
    }
    let sign: u8 = if v.is_sign_negative() { 0x80 } else { 0 };
    let a = v.abs().min(f.max);
    if a == 0.0 {
        return sign;
    }
    // Exponent of the value, clamped to the subnormal range.
    let min_exp = 1 - f.bias;
    let mut e = a.log2().floor() as i32;
    if e < min_exp {
        e = min_exp;
    }
    let quantum = 2f64.powi(e - f.man_bits as i32);
    let mut q = a / quantum;
    // Round half to even.
    let fl = q.floor();
    let diff = q - fl;
    q = if diff > 0.5 || (diff == 0.5 && (fl as u64) % 2 == 1) { fl + 1.0 } else { fl };
    let mut mag = q * quantum;
    if mag > f.max {
        mag = f.max;
    }
    // Re-derive the fields from the rounded magnitude.
    if mag == 0.0 {
        return sign;
    }
    let mut e2 = mag.log2().floor() as i32;
    let (exp_field, man_field) = if e2 < min_exp {
        (0u32, (mag / 2f64.powi(min_exp - f.man_bits as i32)).round() as u32)
    } else {
        if e2 > f.bias + ((1 << f.exp_bits) - 1) {
            e2 = f.bias;
        }
        let man = ((mag / 2f64.powi(e2) - 1.0) * (1u32 << f.man_bits) as f64).round() as u32;
        ((e2 + f.bias) as u32, man)
    };
    sign | ((exp_field << f.man_bits) as u8) | (man_field as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_round_trips_every_code() {
        for (dt, f) in [(DataType::Fp8E4m3, E4M3), (DataType::Fp8E5m2, E5M2)] {
            for code in 0u8..=255 {
                let v = fp8_decode(code, f);
                if v.is_nan() || v.is_infinite() {
                    continue;
                }
                let back = fp8_encode(v, f);
                // +0 and -0 both decode to zero; compare values, not codes.
                assert_eq!(fp8_decode(back, f), v, "{dt} code {code:#x}");
            }
        }
    }

    #[test]
    fn fp8_known_values() {
        assert_eq!(DataType::Fp8E4m3.quantize(448.0), 448.0);
        assert_eq!(DataType::Fp8E4m3.quantize(1e6), 448.0);
        assert_eq!(DataType::Fp8E4m3.quantize(-1e6), -448.0);
        assert_eq!(DataType::Fp8E4m3.quantize(2f64.powi(-9)), 2f64.powi(-9)); // smallest subnormal
        assert_eq!(DataType::Fp8E4m3.quantize(1.0625), 1.0); // tie rounds to even
        assert_eq!(DataType::Fp8E4m3.quantize(1.1875), 1.25);
        assert_eq!(DataType::Fp8E5m2.quantize(57344.0), 57344.0);
        assert_eq!(DataType::Fp8E5m2.quantize(1.125), 1.0);
        assert_eq!(DataType::Fp8E5m2.quantize(2f64.powi(-16)), 2f64.powi(-16));
        assert!(DataType::Fp8E4m3.quantize(f64::NAN).is_nan());
    }

    #[test]
    fn every_type_round_trips_through_bytes() {
        for dt in DataType::ALL {
            let vals = [0.0, 1.0, -2.0, 3.5, 100.25, -0.75];
            let bytes = dt.encode(&vals);
            assert_eq!(bytes.len(), vals.len() * dt.size());
            let back = dt.decode(&bytes);
            for (v, b) in vals.iter().zip(&back) {
                assert_eq!(dt.quantize(*v), *b, "{dt} {v}");
            }
        }
        assert_eq!(DataType::U8.quantize(-5.0), 0.0);
        assert_eq!(DataType::I8.quantize(300.0), 127.0);
        assert_eq!(DataType::Bool.quantize(-0.5), 1.0);
        assert_eq!(DataType::I32.quantize(2.5), 3.0);
    }
}
