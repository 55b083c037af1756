//! The rng op: one thread per element of `y` (grid-stride over the flat row-major logical
//! index, whatever `y`'s strides), drawing from a device Philox 4x32-10 that is bit-exact with
//! the CPU engine's `philox4x32` and uses the same counter mapping (`graph::ops::rng`). The
//! device code is `rng.cuh`, after the generator `philox.cuh` ([`PHILOX`]), which sdpa's
//! dropout shares.

use super::{Ctx, Launch, NodeKernels};
use crate::engine::cuda::kernel::{Signature, Source};
use crate::error::Result;
use crate::graph::ops::rng::{Distribution, RngAttrs};

/// The device Philox 4x32-10 (`fd_philox_uniform`, `fd_seed_bits`).
pub(super) const PHILOX: &str = include_str!("philox.cuh");

pub(super) fn rng(ctx: &Ctx, a: &RngAttrs) -> Result<NodeKernels> {
    let y = ctx.output("y")?;
    let seed = ctx.input("seed")?;
    let offset = ctx.input("offset")?;
    let entry = ctx.entry("rng");
    let mut sig = Signature::new();
    sig.tensor("y", y, true).ptr("seed_p", seed, false).ptr("offset_p", offset, false);
    // The distribution's parameters are the kernel's, a user may change them between executes.
    let bernoulli = match a.distribution {
        Distribution::Uniform { low, high } => {
            sig.f64("low", low).f64("high", high);
            false
        }
        Distribution::Bernoulli { probability } => {
            sig.f64("probability", probability);
            true
        }
    };
    let source = Source::new()
        .entry(&entry, &sig)
        .flag("RNG_BERNOULLI", bernoulli)
        .define("LD_SEED", ctx.ld(seed))
        .define("LD_OFFSET", ctx.ld(offset))
        .define("ST_Y", ctx.st(y))
        .template(PHILOX)
        .template(include_str!("rng.cuh"))
        .build();
    Ok(NodeKernels::one(Launch::elementwise(source, &entry, ctx.numel(y), sig.into_args())))
}
