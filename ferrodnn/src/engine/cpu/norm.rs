use super::NodeIo;
use crate::error::{Error, Result};
use crate::graph::ops::norm::*;
fn todo(io: &NodeIo) -> Result<()> { Err(Error::NotSupported(format!("{}: CPU not implemented yet", io.node.op.kind()))) }
pub(crate) fn batchnorm(io: &mut NodeIo, _a: &BatchnormAttrs) -> Result<()> { todo(io) }
pub(crate) fn batchnorm_inference(io: &mut NodeIo, _a: &NormAttrs) -> Result<()> { todo(io) }
pub(crate) fn batchnorm_backward(io: &mut NodeIo, _a: &NormAttrs) -> Result<()> { todo(io) }
pub(crate) fn genstats(io: &mut NodeIo, _a: &NormAttrs) -> Result<()> { todo(io) }
pub(crate) fn bn_finalize(io: &mut NodeIo, _a: &BnFinalizeAttrs) -> Result<()> { todo(io) }
pub(crate) fn layernorm(io: &mut NodeIo, _a: &NormAttrs) -> Result<()> { todo(io) }
pub(crate) fn layernorm_backward(io: &mut NodeIo, _a: &NormAttrs) -> Result<()> { todo(io) }
pub(crate) fn rmsnorm(io: &mut NodeIo, _a: &NormAttrs) -> Result<()> { todo(io) }
pub(crate) fn rmsnorm_backward(io: &mut NodeIo, _a: &NormAttrs) -> Result<()> { todo(io) }
pub(crate) fn instancenorm(io: &mut NodeIo, _a: &NormAttrs) -> Result<()> { todo(io) }
pub(crate) fn instancenorm_backward(io: &mut NodeIo, _a: &NormAttrs) -> Result<()> { todo(io) }
pub(crate) fn adalayernorm(io: &mut NodeIo, _a: &NormAttrs) -> Result<()> { todo(io) }
pub(crate) fn adalayernorm_backward(io: &mut NodeIo, _a: &NormAttrs) -> Result<()> { todo(io) }
