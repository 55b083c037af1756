use super::NodeIo;
use crate::error::{Error, Result};
use crate::graph::ops::sdpa::SdpaAttrs;
fn todo(io: &NodeIo) -> Result<()> { Err(Error::NotSupported(format!("{}: CPU not implemented yet", io.node.op.kind()))) }
pub(crate) fn sdpa(io: &mut NodeIo, _a: &SdpaAttrs) -> Result<()> { todo(io) }
pub(crate) fn sdpa_backward(io: &mut NodeIo, _a: &SdpaAttrs) -> Result<()> { todo(io) }
