use super::NodeIo;
use crate::error::{Error, Result};
use crate::graph::ops::transform::*;
fn todo(io: &NodeIo) -> Result<()> { Err(Error::NotSupported(format!("{}: CPU not implemented yet", io.node.op.kind()))) }
pub(crate) fn reshape(io: &mut NodeIo, _a: &ReshapeAttrs) -> Result<()> { todo(io) }
pub(crate) fn transpose(io: &mut NodeIo, _a: &TransposeAttrs) -> Result<()> { todo(io) }
pub(crate) fn slice(io: &mut NodeIo, _a: &SliceAttrs) -> Result<()> { todo(io) }
pub(crate) fn concatenate(io: &mut NodeIo, _a: &ConcatenateAttrs) -> Result<()> { todo(io) }
pub(crate) fn copy(io: &mut NodeIo, _a: &CopyAttrs) -> Result<()> { todo(io) }
