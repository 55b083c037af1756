//! Fused and specialized kernels for memory-bound work: chains of pointwise ops fused into one
//! kernel ([`pointwise`]), fast row kernels for normalizations ([`norm`]) and softmax
//! ([`softmax`]) with what they share ([`rows`]), fast kernels for batchnorm, instancenorm
//! and pooling on channels-last tensors ([`batchnorm`], [`instancenorm`], [`pooling`], with the
//! channel vectors and statistics passes they share in `channels`), and group normalization on
//! NHWC and NCHW with a pointwise epilogue ([`groupnorm`]). The planner
//! (`super::planner`) picks among them and the other engines.
//!
//! A specialized kernel computes in f32 (f64 for f64 tensors) with 16-byte vector accesses
//! where layout and alignment allow; its results are checked against the CPU engine within the
//! data type's tolerance, like the fallback's.

pub mod batchnorm;
mod channels;
pub mod groupnorm;
pub mod instancenorm;
pub mod norm;
pub mod pointwise;
pub mod pooling;
pub mod rows;
pub mod softmax;
