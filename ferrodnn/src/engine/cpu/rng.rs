//! The rng op on the CPU, and the Philox 4x32-10 generator it (and sdpa's dropout) draws from.
//! The counter mapping is documented in `graph::ops::rng`.

use super::NodeIo;
use crate::error::Result;
use crate::graph::ops::rng::{Distribution, RngAttrs};
use crate::layout::Nd;
use rayon::prelude::*;

/// Philox multipliers and Weyl key increments (Random123's PHILOX_M4x32_0/1, PHILOX_W32_0/1).
const PHILOX_M0: u32 = 0xD251_1F53;
const PHILOX_M1: u32 = 0xCD9E_8D57;
const PHILOX_W0: u32 = 0x9E37_79B9;
const PHILOX_W1: u32 = 0xBB67_AE85;

/// Philox 4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3",
/// SC 2011): four 32-bit outputs for a 128-bit counter and a 64-bit key, bit-exact with
/// Random123's `philox4x32(ctr, key)` (10 rounds).
pub fn philox4x32(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            // The key is bumped between rounds, not before the first.
            k[0] = k[0].wrapping_add(PHILOX_W0);
            k[1] = k[1].wrapping_add(PHILOX_W1);
        }
        let p0 = (PHILOX_M0 as u64) * (c[0] as u64);
        let p1 = (PHILOX_M1 as u64) * (c[2] as u64);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// The uniform number in (0, 1) of flat element `index` for `seed` and `offset`:
/// word `index % 4` of `philox4x32([lo(index/4), hi(index/4), lo(offset), hi(offset)],
/// [lo(seed), hi(seed)])`, mapped by `(word + 0.5) / 2^32`.
pub(crate) fn philox_uniform(seed: u64, offset: u64, index: u64) -> f64 {
    let block = index / 4;
    let counter = [block as u32, (block >> 32) as u32, offset as u32, (offset >> 32) as u32];
    let key = [seed as u32, (seed >> 32) as u32];
    let word = philox4x32(counter, key)[(index % 4) as usize];
    (word as f64 + 0.5) / 4_294_967_296.0
}

/// The value of a one-element integer input (`seed`, `offset`) as the bits of an `i64`.
pub(crate) fn seed_value(io: &NodeIo, port: &str) -> Result<u64> {
    let nd = io.input(port)?;
    let v = *nd.data.first().ok_or_else(|| io.err(format!("input `{port}` is empty")))?;
    if !v.is_finite() {
        return Err(io.err(format!("input `{port}` holds {v}, not an integer")));
    }
    Ok(v as i64 as u64)
}

pub(crate) fn rng(io: &mut NodeIo, a: &RngAttrs) -> Result<()> {
    let dims = io.output_dims("y")?;
    let seed = seed_value(io, "seed")?;
    let offset = seed_value(io, "offset")?;
    let total: usize = dims.iter().product();
    let dist = a.distribution;
    let data: Vec<f64> = (0..total as u64)
        .into_par_iter()
        .map(|i| {
            let u = philox_uniform(seed, offset, i);
            match dist {
                Distribution::Uniform { low, high } => low + (high - low) * u,
                Distribution::Bernoulli { probability } => {
                    if u < probability {
                        1.0
                    } else {
                        0.0
                    }
                }
            }
        })
        .collect();
    io.set("y", Nd::new(dims, data));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random123_known_answers() {
        assert_eq!(philox4x32([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
        assert_eq!(philox4x32([0xffff_ffff; 4], [0xffff_ffff; 2]), [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]);
        assert_eq!(philox4x32([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]), [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]);
    }
}
