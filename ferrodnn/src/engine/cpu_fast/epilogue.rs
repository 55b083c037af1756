//! The pointwise chain after a GEMM (matmul or convolution forward): bias, scale, residual add,
//! activations, casts. The plan finds the chain ([`find_chain`]): each link a pointwise node
//! that is the only reader of the previous result (a virtual tensor), keeps its dims, and whose
//! other inputs are graph inputs (read from their buffers, broadcast). It is applied to each
//! finished tile row while the row is in cache, with the reference's rounding: each value
//! rounded to its tensor's type after each op, the ops computed in f64 by the graph's own
//! formulas ([`PointwiseMode::apply`]).

use super::tensor::Src;
use crate::dtype::DataType;
use crate::graph::ops::pointwise::PointwiseMode;
use crate::graph::ops::Op;
use crate::graph::{Graph, TensorId};
use std::collections::HashMap;

/// One link of a chain, as planned.
#[derive(Clone, Debug)]
pub(crate) struct Link {
    pub node: usize,
    pub mode: PointwiseMode,
    /// Which port (0 a, 1 b, 2 c) takes the chain's running value.
    pub chain_port: usize,
    /// The other inputs: (port, tensor).
    pub others: Vec<(usize, TensorId)>,
    /// The link's output type.
    pub out_type: DataType,
    /// The type the op's inputs are rounded to (its compute type).
    pub compute: DataType,
}

/// The chain after an anchor: its links and the tensor the last one writes.
#[derive(Clone, Debug, Default)]
pub(crate) struct Chain {
    pub links: Vec<Link>,
}

pub(crate) fn fast_type(dt: DataType) -> bool {
    matches!(dt, DataType::F32 | DataType::F16 | DataType::Bf16)
}

/// The longest chain of pointwise nodes that can run in the epilogue of the node producing
/// `start`: returns the chain and the tensor it ends on.
pub(crate) fn find_chain(g: &Graph, start: TensorId, consumers: &HashMap<usize, Vec<usize>>, produced: &HashMap<usize, usize>) -> (Chain, TensorId) {
    let mut chain = Chain::default();
    let mut cur = start;
    let dims = g.desc(start).dims.clone();
    loop {
        let d = g.desc(cur);
        if !d.is_virtual {
            break;
        }
        let Some(readers) = consumers.get(&cur.0) else { break };
        if readers.len() != 1 {
            break;
        }
        let ni = readers[0];
        let node = &g.nodes[ni];
        let Op::Pointwise(attrs) = &node.op else { break };
        if matches!(attrs.mode, PointwiseMode::GenIndex { .. }) || g.compute_type(node) != DataType::F32 {
            break;
        }
        let Some(out) = node.output("y") else { break };
        if g.desc(out).dims != dims || !g.resolved_data_type(out).is_some_and(fast_type) {
            break;
        }
        let mut chain_port = None;
        let mut others = Vec::new();
        let mut ok = true;
        for p in &node.inputs {
            let port = match p.name.as_str() {
                "a" => 0,
                "b" => 1,
                "c" => 2,
                _ => {
                    ok = false;
                    break;
                }
            };
            if p.tensor == cur {
                if chain_port.is_some() {
                    ok = false; // x * x: the running value twice (kept simple: not fused)
                    break;
                }
                chain_port = Some(port);
            } else {
                let od = g.desc(p.tensor);
                let is_input = !produced.contains_key(&p.tensor.0);
                let typed = g.resolved_data_type(p.tensor).is_some_and(fast_type);
                let by_value_const = od.is_pass_by_value && od.value.is_some();
                if !is_input || !(typed || by_value_const) || od.dims.len() > dims.len() {
                    ok = false;
                    break;
                }
                others.push((port, p.tensor));
            }
        }
        let Some(chain_port) = chain_port.filter(|_| ok) else { break };
        chain.links.push(Link { node: ni, mode: attrs.mode, chain_port, others, out_type: g.resolved_data_type(out).unwrap_or(DataType::F32), compute: DataType::F32 });
        cur = out;
    }
    (chain, cur)
}

/// A chain bound to the buffers of one execution.
pub(crate) struct BoundEpilogue {
    /// The anchor's own output type (its result is rounded to it first).
    pub anchor_type: DataType,
    pub links: Vec<(Link, Vec<(usize, Src, Vec<isize>)>)>,
}

impl BoundEpilogue {
    pub fn none() -> BoundEpilogue {
        BoundEpilogue { anchor_type: DataType::F32, links: Vec::new() }
    }

    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// The offsets of row `idx`'s first element in every other input, in order.
    pub fn row_bases(&self, idx: &[usize], bases: &mut Vec<isize>) {
        bases.clear();
        for (_, others) in &self.links {
            for (_, _, strides) in others {
                bases.push(idx.iter().zip(strides).map(|(&i, &s)| i as isize * s).sum());
            }
        }
    }

    /// The chain applied to the GEMM's value `v` of column `j` of a row with `bases`.
    #[inline]
    pub fn apply(&self, v: f32, bases: &[isize], j: usize, col_dim: usize) -> f32 {
        let mut x = self.anchor_type.quantize(v as f64);
        let mut k = 0;
        for (link, others) in &self.links {
            let mut args = [0.0f64; 3];
            args[link.chain_port] = link.compute.quantize(x);
            for (port, src, strides) in others {
                // SAFETY: bases[k] + j * stride is the offset of the broadcast element of this
                // input for the output element (row, j).
                let val = unsafe { src.load(bases[k] + j as isize * strides[col_dim]) };
                args[*port] = link.compute.quantize(val as f64);
                k += 1;
            }
            x = link.out_type.quantize(link.mode.apply(args[0], args[1], args[2]));
        }
        x as f32
    }
}
