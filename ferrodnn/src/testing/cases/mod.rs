//! Check cases: small graphs, one or more per op, with odd sizes, non-contiguous and
//! channels-last strides and every data type the op allows. The GPU check (`ferrodnn
//! gpu-check`) runs each on the GPU against the CPU engine; CI compiles the kernels of each
//! for sm_80 and sm_90a.

mod attr_ports;
mod conv;
mod fast_attn;
mod fast_attn_decode;
mod fast_conv;
mod fast_gemm;
mod fast_mem;
mod fast_pw;
mod fast_rows;
mod fast_spatial;
mod groupnorm;
mod matmul;
mod multi;
mod norm;
mod overlap;
mod pointwise;
mod reduction;
mod resample;
mod rng;
mod rnn;
mod sdpa;
mod softmax;
mod transform;

use crate::graph::Graph;

/// A named graph to check.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub graph: Graph,
}

impl Case {
    /// A case from a graph; every non-virtual output of the graph is compared.
    pub fn new(name: impl Into<String>, graph: Graph) -> Case {
        Case { name: name.into(), graph }
    }
}

/// Every check case of every op family, then the multi-op graphs.
pub fn all() -> Vec<Case> {
    let mut v = Vec::new();
    v.extend(pointwise::cases());
    v.extend(conv::cases());
    v.extend(matmul::cases());
    v.extend(reduction::cases());
    v.extend(softmax::cases());
    v.extend(resample::cases());
    v.extend(norm::cases());
    v.extend(sdpa::cases());
    v.extend(rng::cases());
    v.extend(rnn::cases());
    v.extend(transform::cases());
    v.extend(multi::cases());
    v.extend(fast_pw::cases());
    v.extend(fast_rows::cases());
    v.extend(fast_spatial::cases());
    v.extend(fast_gemm::cases());
    v.extend(fast_attn::cases());
    v.extend(fast_attn_decode::cases());
    v.extend(fast_mem::cases());
    v.extend(fast_conv::cases());
    v.extend(groupnorm::cases());
    v.extend(attr_ports::cases());
    v.extend(overlap::cases());
    v
}
