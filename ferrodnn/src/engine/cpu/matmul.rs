use super::NodeIo;
use crate::error::{Error, Result};
use crate::graph::ops::matmul::MatmulAttrs;
pub(crate) fn matmul(io: &mut NodeIo, _a: &MatmulAttrs) -> Result<()> { Err(Error::NotSupported(format!("{}: CPU not implemented yet", io.node.op.kind()))) }
