use super::NodeIo;
use crate::error::{Error, Result};
use crate::graph::ops::resample::ResampleAttrs;
fn todo(io: &NodeIo) -> Result<()> { Err(Error::NotSupported(format!("{}: CPU not implemented yet", io.node.op.kind()))) }
pub(crate) fn resample(io: &mut NodeIo, _a: &ResampleAttrs) -> Result<()> { todo(io) }
pub(crate) fn resample_backward(io: &mut NodeIo, _a: &ResampleAttrs) -> Result<()> { todo(io) }
