//! Graphs to and from JSON.
//!
//! Deserializing treats the text as untrusted: it never panics, refuses absurd sizes before
//! anything is allocated from them, and validates the whole graph before returning it.

use super::{Graph, MAX_RANK};
use crate::error::{Error, Result};

/// Most tensors and nodes a deserialized graph may have.
pub const MAX_TENSORS: usize = 1 << 16;
pub const MAX_NODES: usize = 1 << 15;
/// Longest JSON text accepted (64 MiB).
pub const MAX_JSON_BYTES: usize = 64 << 20;
/// Longest name accepted.
pub const MAX_NAME_LEN: usize = 4096;

impl Graph {
    /// The graph as pretty-printed JSON.
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string_pretty(self).map_err(|e| Error::Serialization(format!("graph \"{}\" could not be serialized: {e}", self.name)))
    }

    /// Parse and validate a graph. Every malformed input is an `Err`.
    pub fn from_json(text: &str) -> Result<Graph> {
        if text.len() > MAX_JSON_BYTES {
            return Err(Error::Serialization(format!("graph JSON is {} bytes; at most {MAX_JSON_BYTES} are accepted", text.len())));
        }
        let mut graph: Graph = serde_json::from_str(text).map_err(|e| Error::Serialization(format!("graph JSON is malformed: {e}")))?;
        graph.check_limits()?;
        graph.validate()?;
        Ok(graph)
    }

    /// Size limits checked before validation (so validation never walks absurd structures).
    fn check_limits(&self) -> Result<()> {
        if self.tensors.len() > MAX_TENSORS {
            return Err(Error::Serialization(format!("graph has {} tensors; at most {MAX_TENSORS} are accepted", self.tensors.len())));
        }
        if self.nodes.len() > MAX_NODES {
            return Err(Error::Serialization(format!("graph has {} nodes; at most {MAX_NODES} are accepted", self.nodes.len())));
        }
        if self.name.len() > MAX_NAME_LEN {
            return Err(Error::Serialization(format!("graph name is {} bytes; at most {MAX_NAME_LEN} are accepted", self.name.len())));
        }
        for t in &self.tensors {
            if t.name.len() > MAX_NAME_LEN {
                return Err(Error::Serialization(format!("a tensor name is {} bytes; at most {MAX_NAME_LEN} are accepted", t.name.len())));
            }
            if t.dims.len() > MAX_RANK || t.strides.len() > MAX_RANK {
                return Err(Error::Serialization(format!("tensor \"{}\" has rank {}; at most {MAX_RANK} is accepted", t.name, t.dims.len().max(t.strides.len()))));
            }
        }
        for n in &self.nodes {
            if n.name.len() > MAX_NAME_LEN {
                return Err(Error::Serialization(format!("a node name is {} bytes; at most {MAX_NAME_LEN} are accepted", n.name.len())));
            }
            if n.inputs.len() > 64 || n.outputs.len() > 64 {
                return Err(Error::Serialization(format!("node \"{}\" has {} inputs and {} outputs; at most 64 of each are accepted", n.name, n.inputs.len(), n.outputs.len())));
            }
        }
        Ok(())
    }
}
