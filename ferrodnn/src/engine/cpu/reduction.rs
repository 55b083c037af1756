use super::NodeIo;
use crate::error::{Error, Result};
use crate::graph::ops::reduction::ReductionAttrs;
pub(crate) fn reduction(io: &mut NodeIo, _a: &ReductionAttrs) -> Result<()> { Err(Error::NotSupported(format!("{}: CPU not implemented yet", io.node.op.kind()))) }
