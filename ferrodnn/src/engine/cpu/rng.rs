use super::NodeIo;
use crate::error::{Error, Result};
use crate::graph::ops::rng::RngAttrs;
pub(crate) fn rng(io: &mut NodeIo, _a: &RngAttrs) -> Result<()> { Err(Error::NotSupported(format!("{}: CPU not implemented yet", io.node.op.kind()))) }
/// Philox 4x32-10: four 32-bit outputs for a 128-bit counter and a 64-bit key.
pub fn philox4x32(_counter: [u32; 4], _key: [u32; 2]) -> [u32; 4] { [0; 4] }
