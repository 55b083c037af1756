//! The backward kernels.

use super::Problem;
use crate::engine::cuda::engine::{Target, Unit};

pub(super) fn unit(_p: &Problem, _target: &Target) -> Option<Unit> {
    None
}
