//! Matmul on the `gemm` crate: `c[b] = a[b'] x b[b'']` over the last two dims, batch dims
//! broadcast, any strides (transposed operands are strides, not copies), f32 accumulation.
//! f32 operands in their buffers are read where they lie; f16 and bf16 ones are converted to
//! f32 in the workspace first. The result goes straight into an f32 output; otherwise (another
//! type, or an epilogue) each block of rows lands in an f32 tile in the workspace and is
//! written through the epilogue while it is in cache.

use super::epilogue::{find_chain, Chain};
use super::tensor::store_rows;
use super::{check_tensor, Exec};
use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::{Graph, TensorId};
use crate::layout::unravel;
use gemm::Parallelism;
use rayon::prelude::*;
use std::collections::HashMap;

/// An f32 tile of at most this many values holds a block of output rows for the epilogue.
const TILE_VALUES: usize = 1 << 20;

/// One GEMM call: `dst (m x n) = lhs (m x k) x rhs (k x n)`, each with (row, column) strides.
pub(crate) struct Mat {
    pub ptr: *const f32,
    pub rs: isize,
    pub cs: isize,
}

/// `dst = lhs x rhs` (or `dst += lhs x rhs` with `accumulate`) on `threads` threads.
///
/// # Safety
/// Every pointer with its strides must cover an `m x k`, `k x n` and `m x n` matrix of valid
/// f32 memory; `dst` is written by this call alone and does not overlap its operands.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_f32(m: usize, n: usize, k: usize, dst: *mut f32, dst_rs: isize, dst_cs: isize, lhs: &Mat, rhs: &Mat, accumulate: bool, threads: usize) {
    let par = if threads > 1 && m * n * k >= 32 * 32 * 32 { Parallelism::Rayon(threads) } else { Parallelism::None };
    // SAFETY: the caller guarantees the extents; gemm reads lhs and rhs and writes dst only.
    unsafe {
        gemm::gemm(m, n, k, dst, dst_cs, dst_rs, accumulate, lhs.ptr, lhs.cs, lhs.rs, rhs.ptr, rhs.cs, rhs.rs, 1.0f32, 1.0f32, false, false, false, par);
    }
}

pub(crate) struct MatmulStep {
    pub node: usize,
    a: TensorId,
    b: TensorId,
    /// The matmul's own output (the epilogue's input).
    c: TensorId,
    pub chain: Chain,
    /// The tensor the step writes (c, or the last link's output).
    out: TensorId,
    m: usize,
    n: usize,
    k: usize,
    /// Rows of c per tile when the result goes through a tile (0: straight to the output).
    tile_rows: usize,
    /// Workspace regions in f32 values: a converted, b converted, the tile.
    a_conv: usize,
    b_conv: usize,
    pub workspace_f32: usize,
}

fn udims(g: &Graph, t: TensorId) -> Vec<usize> {
    g.desc(t).dims.iter().map(|&x| x as usize).collect()
}

impl MatmulStep {
    pub fn plan(g: &Graph, ni: usize, consumers: &HashMap<usize, Vec<usize>>, produced: &HashMap<usize, usize>) -> std::result::Result<MatmulStep, String> {
        let node = &g.nodes[ni];
        let (Some(a), Some(b), Some(c)) = (node.input("a"), node.input("b"), node.output("c")) else {
            return Err("a port is missing".into());
        };
        if g.compute_type(node) != DataType::F32 {
            return Err(format!("compute type {} (the fast kernels compute in f32)", g.compute_type(node)));
        }
        check_tensor(g, a, false)?;
        check_tensor(g, b, false)?;
        check_tensor(g, c, true)?;
        let (ad, bd, cd) = (udims(g, a), udims(g, b), udims(g, c));
        let (ra, rb, rc) = (ad.len(), bd.len(), cd.len());
        if ra < 2 || rb < 2 || rc < 2 || ra > rc || rb > rc {
            return Err(format!("ranks a {ra}, b {rb}, c {rc}"));
        }
        let (m, k, n) = (ad[ra - 2], ad[ra - 1], bd[rb - 1]);
        if bd[rb - 2] != k || cd[rc - 2] != m || cd[rc - 1] != n {
            return Err(format!("internal: a {ad:?} x b {bd:?} does not give c {cd:?}"));
        }
        let (chain, out) = find_chain(g, c, consumers, produced);
        check_tensor(g, out, true)?;
        let out_type = g.resolved_data_type(out).unwrap_or(DataType::F32);
        let direct = chain.links.is_empty() && out_type == DataType::F32;
        let tile_rows = if direct { 0 } else { (TILE_VALUES / n.max(1)).clamp(16, 4096).min(m) };
        // Operands converted to f32 when their storage is not f32 (intermediates are f32
        // already).
        let conv_len = |t: TensorId| {
            let d = g.desc(t);
            if !d.is_virtual && g.resolved_data_type(t) != Some(DataType::F32) {
                d.dims.iter().map(|&x| x as usize).product()
            } else {
                0
            }
        };
        let (a_conv, b_conv) = (conv_len(a), conv_len(b));
        Ok(MatmulStep { node: ni, a, b, c, chain, out, m, n, k, tile_rows, a_conv, b_conv, workspace_f32: a_conv + b_conv + tile_rows * n })
    }

    pub fn describe(&self) -> String {
        format!("m {} n {} k {}{}", self.m, self.n, self.k, if self.tile_rows == 0 { ", into the output".to_string() } else { format!(", tiles of {} rows", self.tile_rows) })
    }

    pub fn run(&self, ex: &mut Exec) -> Result<()> {
        let g = ex.graph;
        let a_src = ex.src(self.a)?;
        let b_src = ex.src(self.b)?;
        let epi = ex.bind(self.c, &self.chain)?;
        let (m, n, k) = (self.m, self.n, self.k);
        let (a_conv, b_conv) = (self.a_conv, self.b_conv);
        let tile_rows = self.tile_rows;
        let c_dims = udims(g, self.c);
        let rc = c_dims.len();
        let batch_dims = c_dims[..rc - 2].to_vec();
        let batches: usize = batch_dims.iter().product();
        ex.with_dst(self.out, |dst, ws| {
            let (ws_a, rest) = ws.split_at_mut(a_conv);
            let (ws_b, rest) = rest.split_at_mut(b_conv);
            // f32 views of a and b: where they lie, or converted (into the workspace, or, for
            // an f32 buffer that is not 4-byte aligned, into a copy).
            let mut keep = Vec::new();
            let mut view = |src: &super::tensor::Src, ws: &mut [f32]| -> Result<(*const f32, Vec<isize>)> {
                if let Some(p) = src.f32_ptr() {
                    return Ok((p, src.strides.clone()));
                }
                let strides = super::tensor::dense_strides(&src.dims);
                if ws.len() >= src.dims.iter().product::<usize>() {
                    src.fill_dense(ws);
                    Ok((ws.as_ptr(), strides))
                } else {
                    let v = src.to_dense()?;
                    let p = v.as_ptr();
                    keep.push(v);
                    Ok((p, strides))
                }
            };
            let (a_ptr, a_str) = view(&a_src, ws_a)?;
            let (b_ptr, b_str) = view(&b_src, ws_b)?;
            let (ra, rb) = (a_src.dims.len(), b_src.dims.len());
            let batch_off = |idx: &[usize], dims: &[usize], strides: &[isize]| -> isize {
                let own = &dims[..dims.len() - 2];
                let off = idx.len() - own.len();
                own.iter().enumerate().map(|(d, &size)| if size == 1 { 0 } else { idx[off + d] as isize * strides[d] }).sum()
            };
            let threads = rayon::current_num_threads();
            let direct = if tile_rows == 0 { dst.f32_ptr() } else { None };
            let offsets = |bi: usize, idx: &mut [usize]| {
                unravel(bi, &batch_dims, idx);
                let ao = batch_off(idx, &a_src.dims, &a_str);
                let bo = batch_off(idx, &b_src.dims, &b_str);
                let co: isize = idx.iter().zip(&dst.strides).map(|(&i, &s)| i as isize * s).sum();
                (ao, bo, co)
            };
            let (a_rs, a_cs, b_rs, b_cs) = (a_str[ra - 2], a_str[ra - 1], b_str[rb - 2], b_str[rb - 1]);
            if let Some(c_ptr) = direct {
                let (c_rs, c_cs) = (dst.strides[rc - 2], dst.strides[rc - 1]);
                let (a_addr, b_addr, c_addr) = (a_ptr as usize, b_ptr as usize, c_ptr as usize);
                let one = |bi: usize, threads: usize| {
                    let mut idx = vec![0usize; batch_dims.len()];
                    let (ao, bo, co) = offsets(bi, &mut idx);
                    // SAFETY: the offsets are those of batch bi's matrices in a, b and c (whose
                    // extents the pack check verified); batches write disjoint parts of c.
                    unsafe {
                        let lhs = Mat { ptr: (a_addr as *const f32).offset(ao), rs: a_rs, cs: a_cs };
                        let rhs = Mat { ptr: (b_addr as *const f32).offset(bo), rs: b_rs, cs: b_cs };
                        gemm_f32(m, n, k, (c_addr as *mut f32).offset(co), c_rs, c_cs, &lhs, &rhs, false, threads);
                    }
                };
                if batches >= 2 * threads && m * n * k <= 1 << 21 {
                    (0..batches).into_par_iter().for_each(|bi| one(bi, 1));
                } else {
                    (0..batches).for_each(|bi| one(bi, threads));
                }
                return Ok(());
            }
            // Through a tile: blocks of rows of each batch, then the epilogue. A plan that meant
            // to write straight into an f32 output that turns out not to be 4-byte aligned
            // makes a tile of its own.
            let mut own_tile: Vec<f32>;
            let (tile, tile_rows) = if tile_rows == 0 {
                let rows = (TILE_VALUES / n.max(1)).clamp(1, m);
                own_tile = crate::layout::try_vec(rows * n, || format!("a tile of {rows} x {n} f32 values (the output is not 4-byte aligned)"))?;
                own_tile.resize(rows * n, 0f32);
                (own_tile.as_mut_slice(), rows)
            } else {
                (&mut rest[..tile_rows * n], tile_rows)
            };
            let mut idx = vec![0usize; batch_dims.len()];
            for bi in 0..batches {
                let (ao, bo, _) = offsets(bi, &mut idx);
                let bidx = idx.clone();
                let mut i0 = 0;
                while i0 < m {
                    let rows = tile_rows.min(m - i0);
                    // SAFETY: rows i0.. of batch bi's a, all of its b, into the tile (rows x n).
                    unsafe {
                        let lhs = Mat { ptr: a_ptr.offset(ao + i0 as isize * a_rs), rs: a_rs, cs: a_cs };
                        let rhs = Mat { ptr: b_ptr.offset(bo), rs: b_rs, cs: b_cs };
                        gemm_f32(rows, n, k, tile.as_mut_ptr(), n as isize, 1, &lhs, &rhs, false, threads);
                    }
                    store_rows(
                        tile,
                        rows,
                        n,
                        rc - 1,
                        |r, out_idx: &mut [usize]| {
                            out_idx[..rc - 2].copy_from_slice(&bidx);
                            out_idx[rc - 2] = i0 + r;
                            out_idx[rc - 1] = 0;
                            r * n
                        },
                        dst,
                        &epi,
                    );
                    i0 += rows;
                }
            }
            Ok(())
        })
    }
}
