//! Attention forward (sdpa) as blocked flash-style loops on the GEMM: per (batch, query head,
//! block of 64 query rows), the key/value blocks of 256 keys the block's rows can see, each
//! `S = Q K^T` and `O += P V` a GEMM on f32 tiles, the softmax online (running row maxima and
//! sums in f32, so the score matrix is never whole in memory). Causal masks (both alignments)
//! and sliding windows skip the blocks no row sees and mask the rest per element, as the
//! reference does. The sink token starts each row's running max and sum (its logit, and 1 for
//! its own term), and the rows' final max and sum are the `score_max` / `score_sum_exp`
//! outputs. Dropout, padding masks, bias, ALiBi, paged K/V and the dropout mask as an output run
//! on the reference's code.

use super::gemm::{gemm_f32, Mat};
use super::rows::{exp_f32, fold16};
use super::{check_tensor, Exec};
use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::ops::sdpa::{CausalAlignment, SdpaAttrs};
use crate::graph::{Graph, TensorId};
use rayon::prelude::*;

/// Query rows per block, and keys per block: whole blocks of 512 keys when every row sees every
/// key, 256 under a causal mask or a window (finer blocks skip more of the masked keys). Measured
/// on the 2-core build machine at b1 h8 s1024 d64 f32 beside PyTorch's CPU attention: 256 x 512
/// 1.08x (causal 1.02x); 128 x 512 0.80x (1.00x); 64 x 512 1.00x (0.94x); 128 x 1024 1.04x but
/// 0.51x causal (too coarse to skip masked keys).
const BQ: usize = 256;
const BK_UNMASKED: usize = 512;
const BK_MASKED: usize = 256;

pub(crate) struct AttentionStep {
    pub node: usize,
    q: TensorId,
    k: TensorId,
    v: TensorId,
    o: TensorId,
    stats: Option<TensorId>,
    score_max: Option<TensorId>,
    score_sum_exp: Option<TensorId>,
    sink: Option<TensorId>,
    /// The scale's tensor (`attn_scale` port), else its value.
    scale_port: Option<TensorId>,
    scale: f64,
    attrs: SdpaAttrs,
    b: usize,
    h_q: usize,
    h_k: usize,
    h_v: usize,
    s_q: usize,
    s_kv: usize,
    d: usize,
    d_v: usize,
}

fn udims(g: &Graph, t: TensorId) -> Vec<usize> {
    g.desc(t).dims.iter().map(|&x| x as usize).collect()
}

impl AttentionStep {
    pub fn plan(g: &Graph, ni: usize, a: &SdpaAttrs) -> std::result::Result<AttentionStep, String> {
        let node = &g.nodes[ni];
        if g.compute_type(node) != DataType::F32 {
            return Err(format!("compute type {} (the fast kernels compute in f32)", g.compute_type(node)));
        }
        if a.dropout.is_some_and(|p| p > 0.0) || a.padding_mask || a.alibi || a.rng_dump {
            return Err("dropout, padding masks, ALiBi and the dropout mask run on the reference".into());
        }
        for port in ["bias", "page_table_k", "page_table_v"] {
            if node.input(port).is_some() {
                return Err(format!("a `{port}` input runs on the reference"));
            }
        }
        let (q, k, v) = (node.input("q").ok_or("port `q` is missing")?, node.input("k").ok_or("port `k` is missing")?, node.input("v").ok_or("port `v` is missing")?);
        let o = node.output("o").ok_or("port `o` is missing")?;
        let stats = node.output("stats");
        let (score_max, score_sum_exp) = (node.output("score_max"), node.output("score_sum_exp"));
        let sink = node.input("sink_token");
        for t in [q, k, v].into_iter().chain(sink) {
            check_tensor(g, t, false)?;
        }
        for t in [Some(o), stats, score_max, score_sum_exp].into_iter().flatten() {
            check_tensor(g, t, true)?;
        }
        let (qd, kd, vd) = (udims(g, q), udims(g, k), udims(g, v));
        if qd.len() != 4 || kd.len() != 4 || vd.len() != 4 {
            return Err("q, k and v are not rank 4".into());
        }
        let (b, h_q, s_q, d) = (qd[0], qd[1], qd[2], qd[3]);
        let (h_k, s_kv, h_v, d_v) = (kd[1], kd[2], vd[1], vd[3]);
        if kd[0] != b || vd[0] != b || kd[3] != d || vd[2] != s_kv || h_k == 0 || h_v == 0 || h_q % h_k != 0 || h_q % h_v != 0 {
            return Err(format!("q {qd:?}, k {kd:?}, v {vd:?} are not a shape the fast kernels take"));
        }
        if udims(g, o) != [b, h_q, s_q, d_v] || [stats, score_max, score_sum_exp].into_iter().flatten().any(|t| udims(g, t) != [b, h_q, s_q, 1]) {
            return Err("o's or the row statistics' dims are not [b, h, s_q, d_v] and [b, h, s_q, 1]".into());
        }
        if sink.is_some_and(|t| udims(g, t) != [1, h_q, 1, 1]) {
            return Err("the sink's dims are not [1, h, 1, 1]".into());
        }
        let scale_port = node.input("attn_scale");
        if let Some(t) = scale_port {
            if !g.resolved_data_type(t).is_some_and(super::epilogue::fast_type) {
                return Err("the attn_scale tensor is not f32, f16 or bf16".into());
            }
        }
        let scale = a.attn_scale.unwrap_or(1.0 / (d as f64).sqrt());
        Ok(AttentionStep { node: ni, q, k, v, o, stats, score_max, score_sum_exp, sink, scale_port, scale, attrs: a.clone(), b, h_q, h_k, h_v, s_q, s_kv, d, d_v })
    }

    pub fn describe(&self) -> String {
        format!(
            "flash-style blocks of {BQ} query rows x {} keys, S and P V on the GEMM, online softmax in f32; b {} h {} s_q {} s_kv {} d {} d_v {}",
            self.bk(),
            self.b,
            self.h_q,
            self.s_q,
            self.s_kv,
            self.d,
            self.d_v
        )
    }

    /// Keys per block.
    fn bk(&self) -> usize {
        let masked = self.attrs.causal.is_some() || self.attrs.sliding_window_left.is_some() || self.attrs.sliding_window_right.is_some();
        if masked {
            BK_MASKED
        } else {
            BK_UNMASKED
        }
    }

    /// The keys row `i` sees: `[lo, hi)` (empty when lo >= hi), as the reference's `visible`.
    fn keys(&self, i: usize) -> (i64, i64) {
        let (i, lq, lkv) = (i as i64, self.s_q as i64, self.s_kv as i64);
        let diag = match self.attrs.diagonal() {
            CausalAlignment::TopLeft => i,
            CausalAlignment::BottomRight => i + lkv - lq,
        };
        let mut lo = 0i64;
        let mut hi = lkv;
        if self.attrs.causal.is_some() {
            hi = hi.min(diag + 1);
        }
        if let Some(l) = self.attrs.sliding_window_left {
            lo = lo.max(diag.saturating_sub(l));
        }
        if let Some(r) = self.attrs.sliding_window_right {
            hi = hi.min(diag.saturating_add(r).saturating_add(1));
        }
        (lo.max(0), hi)
    }

    pub fn run(&self, ex: &mut Exec) -> Result<()> {
        let scale = match self.scale_port {
            // SAFETY: offset 0 is the by-value scalar's one element.
            Some(t) => unsafe { ex.src(t)?.load(0) as f64 },
            None => self.scale,
        } as f32;
        let (q, k, v) = (ex.src(self.q)?.to_dense()?, ex.src(self.k)?.to_dense()?, ex.src(self.v)?.to_dense()?);
        let sink = match self.sink {
            Some(t) => Some(ex.src(t)?.to_dense()?),
            None => None,
        };
        let (d, d_v, s_q, s_kv) = (self.d, self.d_v, self.s_q, self.s_kv);
        let qblocks = s_q.div_ceil(BQ);
        let bk = self.bk();
        let rows = self.b * self.h_q * s_q;
        let mut o = vec![0f32; rows * d_v];
        let mut lse = vec![0f32; rows];
        let mut maxes = vec![0f32; rows];
        let mut sums = vec![0f32; rows];
        // One task per (batch, query head, query block): its rows of o and lse.
        let tasks: Vec<(usize, usize, usize)> = (0..self.b).flat_map(|bi| (0..self.h_q).flat_map(move |h| (0..qblocks).map(move |qb| (bi, h, qb)))).collect();
        let results: Vec<[Vec<f32>; 4]> = tasks
            .par_iter()
            .map(|&(bi, h, qb)| {
                let (kh, vh) = (h / (self.h_q / self.h_k), h / (self.h_q / self.h_v));
                let i0 = qb * BQ;
                let n = BQ.min(s_q - i0);
                let qp = q[((bi * self.h_q + h) * s_q + i0) * d..].as_ptr();
                let kp = k[((bi * self.h_k + kh) * s_kv) * d..].as_ptr();
                let vp = v[((bi * self.h_v + vh) * s_kv) * d_v..].as_ptr();
                // The sink (a key with no value) starts each row's max and sum.
                let (mut m, mut l) = match &sink {
                    Some(t) => (vec![t[h]; n], vec![1f32; n]),
                    None => (vec![f32::NEG_INFINITY; n], vec![0f32; n]),
                };
                let mut acc = vec![0f32; n * d_v];
                let mut s = vec![0f32; n * bk];
                let ranges: Vec<(i64, i64)> = (i0..i0 + n).map(|i| self.keys(i)).collect();
                let lo = ranges.iter().map(|r| r.0).min().unwrap_or(0).max(0) as usize;
                let hi = ranges.iter().map(|r| r.1).max().unwrap_or(0).max(0) as usize;
                let mut j0 = lo / bk * bk;
                while j0 < hi {
                    let nk = bk.min(s_kv - j0);
                    // SAFETY: q's rows i0..i0+n (d each), k's rows j0..j0+nk and v's rows
                    // j0..j0+nk lie inside the dense arrays; s and acc are this task's own.
                    unsafe {
                        gemm_f32(n, nk, d, s.as_mut_ptr(), nk as isize, 1, &Mat { ptr: qp, rs: d as isize, cs: 1 }, &Mat { ptr: kp.add(j0 * d), rs: 1, cs: d as isize }, false, 1);
                    }
                    for r in 0..n {
                        let row = &mut s[r * nk..][..nk];
                        // The row's visible keys in this block, [va, vb): the loops over them have
                        // no per-element branch, so that they vectorize; the rest give 0.
                        let (a, b) = ranges[r];
                        let va = (a - j0 as i64).clamp(0, nk as i64) as usize;
                        let vb = (b - j0 as i64).clamp(va as i64, nk as i64) as usize;
                        let vis = &mut row[va..vb];
                        for x in vis.iter_mut() {
                            *x *= scale;
                        }
                        let mx = fold16(vis, f32::NEG_INFINITY, f32::max).into_iter().fold(m[r], f32::max);
                        // A row with nothing visible so far keeps max -inf: exponentiate against 0.
                        let mu = if mx == f32::NEG_INFINITY { 0.0 } else { mx };
                        let alpha = exp_f32(m[r] - mu);
                        for x in vis.iter_mut() {
                            *x = exp_f32(*x - mu);
                        }
                        let sum: f32 = fold16(vis, 0.0, |acc, x| acc + x).iter().sum();
                        row[..va].fill(0.0);
                        row[vb..].fill(0.0);
                        l[r] = l[r] * alpha + sum;
                        m[r] = mx;
                        for c in &mut acc[r * d_v..][..d_v] {
                            *c *= alpha;
                        }
                    }
                    // SAFETY: as above; acc (n x d_v) is this task's own.
                    unsafe {
                        gemm_f32(
                            n,
                            d_v,
                            nk,
                            acc.as_mut_ptr(),
                            d_v as isize,
                            1,
                            &Mat { ptr: s.as_ptr(), rs: nk as isize, cs: 1 },
                            &Mat { ptr: vp.add(j0 * d_v), rs: d_v as isize, cs: 1 },
                            true,
                            1,
                        );
                    }
                    j0 += bk;
                }
                // Normalize; rows that see no key (and no sink) give o = 0 and stats = -inf (the
                // log of an empty sum).
                let mut stats = vec![f32::NEG_INFINITY; n];
                for r in 0..n {
                    let empty = m[r] == f32::NEG_INFINITY || !(l[r] > 0.0);
                    let inv = if empty { 0.0 } else { 1.0 / l[r] };
                    for c in &mut acc[r * d_v..][..d_v] {
                        *c *= inv;
                    }
                    if !empty {
                        stats[r] = m[r] + l[r].ln();
                    }
                }
                [acc, stats, m, l]
            })
            .collect();
        for (&(bi, h, qb), [acc, stats, m, l]) in tasks.iter().zip(results) {
            let r0 = (bi * self.h_q + h) * s_q + qb * BQ;
            o[r0 * d_v..][..acc.len()].copy_from_slice(&acc);
            lse[r0..][..stats.len()].copy_from_slice(&stats);
            maxes[r0..][..m.len()].copy_from_slice(&m);
            sums[r0..][..l.len()].copy_from_slice(&l);
        }
        let hq = self.h_q;
        ex.with_dst(self.o, |dst, _| {
            o.par_chunks(d_v).enumerate().for_each(|(r, row)| {
                let (bi, h, i) = (r / (hq * s_q), (r / s_q) % hq, r % s_q);
                let base = bi as isize * dst.strides[0] + h as isize * dst.strides[1] + i as isize * dst.strides[2];
                for (c, &x) in row.iter().enumerate() {
                    // SAFETY: element (bi, h, i, c) of o, written once, by this row's task only.
                    unsafe { dst.store(base + c as isize * dst.strides[3], x) };
                }
            });
            Ok(())
        })?;
        for (t, values) in [(self.stats, &lse), (self.score_max, &maxes), (self.score_sum_exp, &sums)] {
            let Some(t) = t else { continue };
            ex.with_dst(t, |dst, _| {
                for (r, &x) in values.iter().enumerate() {
                    let (bi, h, i) = (r / (hq * s_q), (r / s_q) % hq, r % s_q);
                    // SAFETY: element (bi, h, i, 0) of a [b, h, s_q, 1] row statistic, written once.
                    unsafe { dst.store(bi as isize * dst.strides[0] + h as isize * dst.strides[1] + i as isize * dst.strides[2], x) };
                }
                Ok(())
            })?;
        }
        Ok(())
    }
}
