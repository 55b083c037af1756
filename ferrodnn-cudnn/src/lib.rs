//! # ferrodnn-cudnn
//!
//! cuDNN's legacy C API as a drop-in shared library (`libcudnn.so.9`, built by
//! `scripts/capi_build.sh`) on ferrodnn's graph engine: each call describes its work as a ferrodnn
//! graph, builds (once per descriptor set, then from the handle's plan cache) a plan for it, and
//! executes the plan on the caller's pointers: device pointers on the handle's stream when the
//! handle has a GPU, host pointers on the fast CPU engine when it does not (a ferrodnn
//! extension: see `docs/c_api.md`).
//!
//! Every exported function catches panics and returns a status code; the reason of the last
//! failure on the calling thread is kept for `cudnnGetLastErrorString`.
//!
//! Layout: [`types`] (status codes, enum values, opaque handle types), [`api`] (the error type and
//! the FFI guard), [`registry`] (live handles and descriptors, so a bad pointer is an error and
//! never a dereference), [`handle`] (create, stream, version, errors), [`desc`] (tensor,
//! filter, convolution, activation, pooling, op-tensor and reduce-tensor descriptors), [`exec`]
//! (graph -> cached plan -> execution on the caller's pointers, and the alpha/beta blend),
//! [`conv`], [`ops`] (activation, softmax, pooling, tensor arithmetic), [`batchnorm`], [`rnn`]
//! (the RNN v8 calls).

// The exported functions are the C API: their pointer arguments carry cuDNN's contract (valid
// for the sizes the descriptors give), which C callers cannot be made to state in Rust's types.
// Each dereference is in an `unsafe` block that says what it relies on.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod api;
pub mod backend;
pub mod batchnorm;
pub mod conv;
pub mod desc;
pub mod dropout;
pub mod exec;
pub mod handle;
pub mod lrn;
pub mod ops;
pub mod registry;
pub mod rnn;
pub mod stubs;
pub mod types;

pub use types::*;
