//! Seeded, dependency-free randomness: test data, and the inputs an autotuning times kernels on.

use crate::dtype::DataType;

/// SplitMix64: a small, seedable generator, good enough for test data.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed ^ 0x5851_f42d_4c95_7f2d)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }
}

/// Random values suited to a type: floats uniform in [-1, 1) (never all zero), integers
/// small, booleans 0/1; each already representable in the type.
pub fn random_values(n: usize, dtype: DataType, rng: &mut SplitMix64) -> Vec<f64> {
    (0..n).map(|_| random_value(dtype, rng)).collect()
}

/// One value of [`random_values`] (the same sequence, one at a time).
pub fn random_value(dtype: DataType, rng: &mut SplitMix64) -> f64 {
    let v = match dtype {
        DataType::Bool => (rng.next_u64() & 1) as f64,
        DataType::U8 => (rng.next_u64() % 8) as f64,
        DataType::I8 | DataType::I32 | DataType::I64 => (rng.next_u64() % 9) as f64 - 4.0,
        _ => rng.uniform(-1.0, 1.0),
    };
    dtype.quantize(v)
}
