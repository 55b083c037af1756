use super::NodeIo;
use crate::error::{Error, Result};
use crate::graph::ops::conv::ConvAttrs;
fn todo(io: &NodeIo) -> Result<()> { Err(Error::NotSupported(format!("{}: CPU not implemented yet", io.node.op.kind()))) }
pub(crate) fn fprop(io: &mut NodeIo, _a: &ConvAttrs) -> Result<()> { todo(io) }
pub(crate) fn dgrad(io: &mut NodeIo, _a: &ConvAttrs) -> Result<()> { todo(io) }
pub(crate) fn wgrad(io: &mut NodeIo, _a: &ConvAttrs) -> Result<()> { todo(io) }
