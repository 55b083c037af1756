//! Batched matmul on the CPU: `c[b, i, j] = sum_k a[b', i, k] * b[b'', k, j]`, where `b'` and
//! `b''` are the output batch index broadcast onto each input's own batch dims. Inputs arrive
//! dense row-major (strides were resolved when they were read), so a transposed input needs
//! nothing special here. Parallel over output rows; sums in f64 (exact for integer inputs).

use super::NodeIo;
use crate::error::Result;
use crate::graph::ops::matmul::MatmulAttrs;
use crate::layout::{dense_strides, unravel, Nd};
use rayon::prelude::*;

/// The flat batch index into an input with batch dims `own` (right-aligned with the output's
/// batch dims, size-1 dims repeating) of output batch multi-index `idx`.
fn broadcast_batch(idx: &[usize], own: &[usize]) -> usize {
    let off = idx.len() - own.len();
    let strides = dense_strides(own);
    own.iter().enumerate().map(|(d, &size)| if size == 1 { 0 } else { idx[off + d] * strides[d] }).sum()
}

/// Whether `own` batch dims broadcast to `out` batch dims.
fn broadcasts_to(own: &[usize], out: &[usize]) -> bool {
    own.len() <= out.len() && own.iter().zip(&out[out.len() - own.len()..]).all(|(&o, &t)| o == 1 || o == t)
}

pub(crate) fn matmul(io: &mut NodeIo, _attrs: &MatmulAttrs) -> Result<()> {
    let c_dims = io.output_dims("c")?;
    let (a, b) = (io.input("a")?, io.input("b")?);
    let (ra, rb, rc) = (a.dims.len(), b.dims.len(), c_dims.len());
    if ra < 2 || rb < 2 || rc < 2 {
        return Err(io.err(format!("internal: ranks must be >= 2: a {:?}, b {:?}, c {c_dims:?}", a.dims, b.dims)));
    }
    let (m, k, n) = (a.dims[ra - 2], a.dims[ra - 1], b.dims[rb - 1]);
    let (batch_a, batch_b, batch) = (&a.dims[..ra - 2], &b.dims[..rb - 2], &c_dims[..rc - 2]);
    if b.dims[rb - 2] != k || c_dims[rc - 2] != m || c_dims[rc - 1] != n || !broadcasts_to(batch_a, batch) || !broadcasts_to(batch_b, batch) {
        return Err(io.err(format!("internal: a {:?} x b {:?} does not give c {c_dims:?}", a.dims, b.dims)));
    }
    // Inputs as the op computes on them: rounded to a float compute type, as pointwise does.
    let ct = io.compute_type();
    let prepare = |nd: &Nd| -> Vec<f64> {
        if ct.is_float() {
            nd.data.iter().map(|&v| ct.quantize(v)).collect()
        } else {
            nd.data.clone()
        }
    };
    let (av, bv) = (prepare(a), prepare(b));
    // Where each output batch's matrices start in a and b.
    let batch_total: usize = batch.iter().product();
    let mut idx = vec![0usize; batch.len()];
    let bases: Vec<(usize, usize)> = (0..batch_total)
        .map(|bi| {
            unravel(bi, batch, &mut idx);
            (broadcast_batch(&idx, batch_a) * m * k, broadcast_batch(&idx, batch_b) * k * n)
        })
        .collect();
    let mut data = vec![0.0f64; batch_total * m * n];
    if n > 0 && m > 0 {
        data.par_chunks_mut(n).enumerate().for_each(|(row, out)| {
            let (a_base, b_base) = bases[row / m];
            let a_row = &av[a_base + (row % m) * k..a_base + (row % m) * k + k];
            // out[j] = sum_kk a[i, kk] * b[kk, j], accumulated row of b by row of b.
            for (kk, &aik) in a_row.iter().enumerate() {
                let b_row = &bv[b_base + kk * n..b_base + kk * n + n];
                for (o, &bkj) in out.iter_mut().zip(b_row) {
                    *o += aik * bkj;
                }
            }
        });
    }
    io.set("c", Nd::new(c_dims, data));
    Ok(())
}
