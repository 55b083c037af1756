//! The one error type of the library. Every message says what to change: it names the op (kind
//! and the user's name for it), the tensor, and the expected and actual values.

/// Errors returned by every fallible call in ferrodnn.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The graph is malformed: a shape, type, attribute or connection is wrong.
    #[error("{0}")]
    InvalidGraph(String),
    /// Buffers given at execution do not match the graph (missing, too small, unknown uid).
    #[error("{0}")]
    InvalidArgument(String),
    /// The graph is valid, but the engine asked for cannot run it.
    #[error("{0}")]
    NotSupported(String),
    /// JSON that is not a well-formed graph or plan.
    #[error("{0}")]
    Serialization(String),
    /// The device, driver or runtime compiler failed or is missing.
    #[error("{0}")]
    Device(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A graph error about one op: `conv_fprop "conv1": <message>`.
    pub fn op(kind: &str, name: &str, message: impl std::fmt::Display) -> Error {
        Error::InvalidGraph(format!("{kind} \"{name}\": {message}"))
    }
}
