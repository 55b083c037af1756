//! # ferrodnn
//!
//! Deep-learning primitives in the shape of cuDNN's graph API: describe work as a [`Graph`] of
//! operations on tensors, validate it, build [`Plan`]s for it on a [`Handle`]'s engines, and
//! execute a plan on buffers you own (a [`VariantPack`] keyed by tensor uid).
//!
//! Layers, top to bottom: [`graph`] (tensors, ops, inference, validation, JSON; knows nothing of
//! engines), [`engine`] (the engine interface, plans, the CPU reference engine), and helpers
//! ([`layout`] for strided buffers, [`random`] for seeded values, [`testing`] for test data and
//! comparisons).

pub mod dtype;
pub mod engine;
pub mod error;
pub mod graph;
pub mod layout;
pub mod random;
pub mod testing;

pub use dtype::DataType;
pub use engine::{BehaviorNotes, Buffer, EngineKind, Handle, Plan, PlanDesc, PlanPolicy, VariantPack};
pub use error::{Error, Result};
pub use graph::{Graph, ShapeOverrides, TensorDesc, TensorId};
pub use layout::Nd;

/// The README's Rust example, compiled and run as a doc test so it stays true.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
