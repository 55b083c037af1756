use super::NodeIo;
use crate::error::{Error, Result};
use crate::graph::ops::softmax::SoftmaxAttrs;
fn todo(io: &NodeIo) -> Result<()> { Err(Error::NotSupported(format!("{}: CPU not implemented yet", io.node.op.kind()))) }
pub(crate) fn softmax(io: &mut NodeIo, _a: &SoftmaxAttrs) -> Result<()> { todo(io) }
pub(crate) fn softmax_backward(io: &mut NodeIo, _a: &SoftmaxAttrs) -> Result<()> { todo(io) }
