//! A chain of pointwise ops not after a GEMM, as one threaded pass: the first op reads its
//! inputs (broadcast, any strides, f32/f16/bf16), the ops after it are the same chain a GEMM's
//! epilogue runs ([`super::epilogue`]), and only the last result is written. Each op is computed
//! in f64 by the graph's own formula and rounded to its tensor's type, as the reference does.

use super::epilogue::{fast_type, find_chain, Chain};
use super::tensor::Src;
use super::{check_tensor, Exec};
use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::ops::pointwise::PointwiseMode;
use crate::graph::ops::Op;
use crate::graph::{Graph, TensorId};
use crate::layout::unravel;
use rayon::prelude::*;
use std::collections::HashMap;

/// Elements of one row one task takes at most.
const PIECE: usize = 16 * 1024;

pub(crate) struct PointwiseStep {
    pub node: usize,
    mode: PointwiseMode,
    /// The first op's inputs: (port 0 a, 1 b, 2 c; tensor).
    inputs: Vec<(usize, TensorId)>,
    /// The first op's output, and the tensor the chain ends on.
    y: TensorId,
    out: TensorId,
    pub chain: Chain,
}

impl PointwiseStep {
    pub fn plan(g: &Graph, ni: usize, consumers: &HashMap<usize, Vec<usize>>, produced: &HashMap<usize, usize>) -> std::result::Result<PointwiseStep, String> {
        let node = &g.nodes[ni];
        let Op::Pointwise(a) = &node.op else { return Err("not a pointwise op".into()) };
        if matches!(a.mode, PointwiseMode::GenIndex { .. }) {
            return Err("gen_index has no inputs to stream".into());
        }
        if g.compute_type(node) != DataType::F32 {
            return Err(format!("compute type {} (the fast kernels compute in f32)", g.compute_type(node)));
        }
        let y = node.output("y").ok_or("port `y` is missing")?;
        check_tensor(g, y, true)?;
        let rank = g.desc(y).dims.len();
        let mut inputs = Vec::new();
        for p in &node.inputs {
            let port = match p.name.as_str() {
                "a" => 0,
                "b" => 1,
                "c" => 2,
                other => return Err(format!("port `{other}`")),
            };
            let d = g.desc(p.tensor);
            let const_scalar = d.is_pass_by_value && d.value.is_some();
            if !const_scalar && !g.resolved_data_type(p.tensor).is_some_and(fast_type) {
                return Err(format!("tensor \"{}\" is not f32, f16 or bf16", d.name));
            }
            if d.dims.len() > rank {
                return Err(format!("tensor \"{}\" has a higher rank than the output", d.name));
            }
            inputs.push((port, p.tensor));
        }
        let (chain, out) = find_chain(g, y, consumers, produced);
        check_tensor(g, out, true)?;
        Ok(PointwiseStep { node: ni, mode: a.mode, inputs, y, out, chain })
    }

    pub fn describe(&self) -> String {
        format!("{} op(s) in one pass", 1 + self.chain.links.len())
    }

    pub fn run(&self, ex: &mut Exec) -> Result<()> {
        let g = ex.graph;
        let dims: Vec<usize> = g.desc(self.y).dims.iter().map(|&x| x as usize).collect();
        let mut ins: Vec<(usize, Src, Vec<isize>)> = Vec::new();
        for &(port, t) in &self.inputs {
            let src = ex.src(t)?;
            let strides = src.broadcast_strides(&dims);
            ins.push((port, src, strides));
        }
        let epi = ex.bind(self.y, &self.chain)?;
        let mode = self.mode;
        let compute = DataType::F32;
        let rank = dims.len();
        let ncols = dims[rank - 1];
        let rows: usize = dims[..rank - 1].iter().product();
        let pieces = ncols.div_ceil(PIECE).max(1);
        ex.with_dst(self.out, |dst, _| {
            let col = rank - 1;
            (0..rows * pieces).into_par_iter().for_each_init(
                || (vec![0usize; rank], Vec::new()),
                |(idx, bases), item| {
                    let (r, piece) = (item / pieces, item % pieces);
                    let (j0, j1) = (piece * PIECE, ((piece + 1) * PIECE).min(ncols));
                    unravel(r, &dims[..rank - 1], &mut idx[..rank - 1]);
                    idx[col] = 0;
                    let in_base: Vec<isize> = ins.iter().map(|(_, _, s)| idx.iter().zip(s).map(|(&i, &s)| i as isize * s).sum()).collect();
                    let out_base: isize = idx.iter().zip(&dst.strides).map(|(&i, &s)| i as isize * s).sum();
                    epi.row_bases(idx, bases);
                    for j in j0..j1 {
                        let mut args = [0.0f64; 3];
                        for ((port, src, s), &b) in ins.iter().zip(&in_base) {
                            // SAFETY: the broadcast element of this input for output (row, j).
                            args[*port] = compute.quantize(unsafe { src.load(b + j as isize * s[col]) } as f64);
                        }
                        let v = mode.apply(args[0], args[1], args[2]) as f32;
                        let v = epi.apply(v, bases, j, col);
                        // SAFETY: output element (row, j), written by this task alone.
                        unsafe { dst.store(out_base + j as isize * dst.strides[col], v) };
                    }
                },
            );
            Ok(())
        })
    }
}
