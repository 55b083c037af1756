//! Scaled dot-product attention on the CPU, forward and backward, in f64, one query row at a
//! time. The semantics (masks, ALiBi, dropout, paging, empty rows, the sink token and the score
//! statistics) are documented in `graph::ops::sdpa`; this file follows them literally.

use super::rng::{philox_uniform, seed_value};
use super::NodeIo;
use crate::error::Result;
use crate::graph::ops::sdpa::alibi_slopes;
use crate::graph::ops::sdpa::{CausalAlignment, SdpaAttrs};
use crate::layout::{for_each_index, Nd};
use rayon::prelude::*;

/// For each batch, the pool block of each page (`None` for pages never read).
type PageBlocks = Vec<Vec<Option<usize>>>;

/// Everything a query row needs: the inputs as dense arrays (K and V resolved from their pages
/// to logical `[b, h_k, s_kv, d]` and `[b, h_v, s_kv, d_v]`), the sizes, and the masking rules.
struct Attention<'a> {
    attrs: &'a SdpaAttrs,
    q: &'a Nd,
    k: Nd,
    v: Nd,
    bias: Option<&'a Nd>,
    b: usize,
    h_q: usize,
    h_k: usize,
    h_v: usize,
    s_q: usize,
    s_kv: usize,
    d: usize,
    d_v: usize,
    scale: f64,
    len_q: Vec<usize>,
    len_kv: Vec<usize>,
    slopes: Option<Vec<f64>>,
    /// (p, seed, offset) when dropout is on.
    dropout: Option<(f64, u64, u64)>,
    /// For each batch, the pool block of each page of K and of V (paged K/V only; `None`
    /// for pages past the batch's length, which are never read).
    pages: Option<(PageBlocks, PageBlocks)>,
    /// The sink logit of each query head (`sink_token`).
    sink: Option<Vec<f64>>,
}

/// One query row's forward results.
struct Row {
    o: Vec<f64>,
    /// The log-sum-exp (natural log), `-inf` for a row with nothing in its softmax.
    lse: f64,
    /// The softmax's maximum and its sum of `exp(s - max)`, the sink included.
    max: f64,
    sum_exp: f64,
}

/// Per-batch lengths from a `[b, 1, 1, 1]` input, each checked to be an integer in `0..=max`.
fn lengths(io: &NodeIo, port: &str, b: usize, max: usize) -> Result<Vec<usize>> {
    let nd = io.input(port)?;
    if nd.len() != b {
        return Err(io.err(format!("input `{port}` has {} elements, expected {b}", nd.len())));
    }
    nd.data
        .iter()
        .enumerate()
        .map(|(i, &x)| if x.fract() != 0.0 || !(0.0..=max as f64).contains(&x) { Err(io.err(format!("{port}[{i}] = {x} is outside [0, {max}]"))) } else { Ok(x as usize) })
        .collect()
}

/// For each batch, the pool block of each page whose first key lies below `len_kv[b]`,
/// checked against the pool's size.
fn page_blocks(io: &NodeIo, port: &str, table: &Nd, block_size: usize, num_blocks: usize, len_kv: &[usize]) -> Result<PageBlocks> {
    let (b, pages) = (table.dims[0], table.dims[2]);
    let mut out = vec![vec![None; pages]; b];
    for (bi, row) in out.iter_mut().enumerate() {
        for (p, slot) in row.iter_mut().enumerate() {
            if p * block_size >= len_kv[bi] {
                continue;
            }
            let x = table.data[bi * pages + p];
            if x.fract() != 0.0 || !(0.0..num_blocks as f64).contains(&x) {
                return Err(io.err(format!("{port}[{bi}, 0, {p}, 0] = {x} is not a block of the pool (0..{num_blocks})")));
            }
            *slot = Some(x as usize);
        }
    }
    Ok(out)
}

/// Gather a logical `[b, heads, s_kv, dim]` tensor from a block pool `[blocks, heads, bs, dim]`.
fn unpage(pool: &Nd, blocks: &[Vec<Option<usize>>], s_kv: usize) -> Nd {
    let (h_kv, bs, dim) = (pool.dims[1], pool.dims[2], pool.dims[3]);
    let b = blocks.len();
    let mut out = Nd::zeros(&[b, h_kv, s_kv, dim]);
    for (bi, row) in blocks.iter().enumerate() {
        for (p, blk) in row.iter().enumerate() {
            let Some(blk) = *blk else { continue };
            for h in 0..h_kv {
                for r in 0..bs {
                    let src = ((blk * h_kv + h) * bs + r) * dim;
                    let dst = ((bi * h_kv + h) * s_kv + p * bs + r) * dim;
                    out.data[dst..dst + dim].copy_from_slice(&pool.data[src..src + dim]);
                }
            }
        }
    }
    out
}

/// Add a logical `[b, heads, s_kv, dim]` gradient into a pool-shaped `[blocks, heads, bs, dim]`.
fn repage_add(logical: &Nd, blocks: &[Vec<Option<usize>>], pool_dims: &[usize]) -> Nd {
    let (h_kv, bs, dim) = (pool_dims[1], pool_dims[2], pool_dims[3]);
    let s_kv = logical.dims[2];
    let mut out = Nd::zeros(pool_dims);
    for (bi, row) in blocks.iter().enumerate() {
        for (p, blk) in row.iter().enumerate() {
            let Some(blk) = *blk else { continue };
            for h in 0..h_kv {
                for r in 0..bs {
                    let dst = ((blk * h_kv + h) * bs + r) * dim;
                    let src = ((bi * h_kv + h) * s_kv + p * bs + r) * dim;
                    for c in 0..dim {
                        out.data[dst + c] += logical.data[src + c];
                    }
                }
            }
        }
    }
    out
}

impl<'a> Attention<'a> {
    fn new(io: &'a NodeIo, a: &'a SdpaAttrs) -> Result<Attention<'a>> {
        let q = io.input("q")?;
        let k_in = io.input("k")?;
        let v_in = io.input("v")?;
        let (b, h_q, s_q, d) = (q.dims[0], q.dims[1], q.dims[2], q.dims[3]);
        let (h_k, h_v, d_v) = (k_in.dims[1], v_in.dims[1], v_in.dims[3]);
        let paged = io.opt_input("page_table_k").zip(io.opt_input("page_table_v"));
        let s_kv = match paged {
            Some((tk, _)) => tk.dims[2] * k_in.dims[2],
            None => k_in.dims[2],
        };
        if h_k == 0 || h_v == 0 || h_q % h_k != 0 || h_q % h_v != 0 {
            return Err(io.err(format!("q has {h_q} heads, not a multiple of the {h_k} heads of k and the {h_v} of v")));
        }
        let (len_q, len_kv) = if a.padding_mask { (lengths(io, "seq_len_q", b, s_q)?, lengths(io, "seq_len_kv", b, s_kv)?) } else { (vec![s_q; b], vec![s_kv; b]) };
        let (k, v, pages) = match paged {
            Some((tk, tv)) => {
                let pk = page_blocks(io, "page_table_k", tk, k_in.dims[2], k_in.dims[0], &len_kv)?;
                let pv = page_blocks(io, "page_table_v", tv, v_in.dims[2], v_in.dims[0], &len_kv)?;
                (unpage(k_in, &pk, s_kv), unpage(v_in, &pv, s_kv), Some((pk, pv)))
            }
            None => (k_in.clone(), v_in.clone(), None),
        };
        let dropout = match a.dropout {
            Some(p) if p > 0.0 => Some((p, seed_value(io, "seed")?, seed_value(io, "offset")?)),
            _ => None,
        };
        Ok(Attention {
            attrs: a,
            q,
            k,
            v,
            bias: io.opt_input("bias"),
            b,
            h_q,
            h_k,
            h_v,
            s_q,
            s_kv,
            d,
            d_v,
            scale: io.attribute("attn_scale", a.attn_scale.unwrap_or(1.0 / (d as f64).sqrt())),
            len_q,
            len_kv,
            slopes: a.alibi.then(|| alibi_slopes(h_q)),
            dropout,
            pages,
            sink: io.opt_input("sink_token").map(|t| t.data.clone()),
        })
    }

    /// Whether key `j` is visible from query row `i` of batch `bi` (the row itself not padded).
    fn visible(&self, bi: usize, i: usize, j: usize) -> bool {
        let (lq, lkv) = (self.len_q[bi] as i64, self.len_kv[bi] as i64);
        let (i, j) = (i as i64, j as i64);
        if j >= lkv {
            return false;
        }
        let diag = match self.attrs.diagonal() {
            CausalAlignment::TopLeft => i,
            CausalAlignment::BottomRight => i + lkv - lq,
        };
        if self.attrs.causal.is_some() && j > diag {
            return false;
        }
        if self.attrs.sliding_window_left.is_some_and(|l| j < diag - l) {
            return false;
        }
        if self.attrs.sliding_window_right.is_some_and(|r| j > diag + r) {
            return false;
        }
        true
    }

    /// The scores of row (bi, h, i): `-inf` where masked. `None` for a padded row.
    fn scores(&self, bi: usize, h: usize, i: usize) -> Option<Vec<f64>> {
        if i >= self.len_q[bi] {
            return None;
        }
        let kh = self.k_head(h);
        let qrow = &self.q.data[((bi * self.h_q + h) * self.s_q + i) * self.d..][..self.d];
        let row = (0..self.s_kv)
            .map(|j| {
                if !self.visible(bi, i, j) {
                    return f64::NEG_INFINITY;
                }
                let krow = &self.k.data[((bi * self.h_k + kh) * self.s_kv + j) * self.d..][..self.d];
                let mut s = self.scale * qrow.iter().zip(krow).map(|(x, y)| x * y).sum::<f64>();
                if let Some(bias) = self.bias {
                    s += bias.broadcast_at(&[bi, h, i, j]);
                }
                if let Some(slopes) = &self.slopes {
                    s += slopes[h] * (j as f64 - i as f64);
                }
                s
            })
            .collect();
        Some(row)
    }

    /// The K head query head `h` reads.
    fn k_head(&self, h: usize) -> usize {
        h / (self.h_q / self.h_k)
    }

    /// The V head query head `h` reads.
    fn v_head(&self, h: usize) -> usize {
        h / (self.h_q / self.h_v)
    }

    /// Key `j`'s row of V for query head `h` of batch `bi`.
    fn v_row(&self, bi: usize, h: usize, j: usize) -> &[f64] {
        &self.v.data[((bi * self.h_v + self.v_head(h)) * self.s_kv + j) * self.d_v..][..self.d_v]
    }

    /// Dropout factors of row (bi, h, i): 0 or 1/(1-p) (all 1 without dropout).
    fn keep(&self, bi: usize, h: usize, i: usize) -> Vec<f64> {
        let Some((p, seed, offset)) = self.dropout else { return vec![1.0; self.s_kv] };
        let base = (((bi * self.h_q + h) * self.s_q + i) * self.s_kv) as u64;
        (0..self.s_kv as u64).map(|j| if philox_uniform(seed, offset, base + j) >= p { 1.0 / (1.0 - p) } else { 0.0 }).collect()
    }

    /// The sink logit of query head `h`, if there is a sink.
    fn sink(&self, h: usize) -> Option<f64> {
        self.sink.as_ref().map(|s| s[h])
    }

    /// Forward of one row: o_i, stats_i and the softmax's max and sum (the sink a key of its
    /// own with no value).
    fn forward_row(&self, bi: usize, h: usize, i: usize) -> Row {
        let empty = Row { o: vec![0.0; self.d_v], lse: f64::NEG_INFINITY, max: f64::NEG_INFINITY, sum_exp: 0.0 };
        let Some(s) = self.scores(bi, h, i) else { return empty };
        let sink = self.sink(h);
        let m = s.iter().copied().chain(sink).fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            return empty;
        }
        // Softmax with the row max subtracted, so exp never overflows.
        let e: Vec<f64> = s.iter().map(|&x| (x - m).exp()).collect();
        let sum: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |t| (t - m).exp());
        let lse = m + sum.ln();
        let keep = self.keep(bi, h, i);
        let mut o = vec![0.0; self.d_v];
        for j in 0..self.s_kv {
            let w = e[j] / sum * keep[j];
            if w == 0.0 {
                continue;
            }
            let vrow = self.v_row(bi, h, j);
            for (oc, vc) in o.iter_mut().zip(vrow) {
                *oc += w * vc;
            }
        }
        Row { o, lse, max: m, sum_exp: sum }
    }
}

pub(crate) fn sdpa(io: &mut NodeIo, a: &SdpaAttrs) -> Result<()> {
    let outputs = {
        let at = Attention::new(io, a)?;
        let rows = at.b * at.h_q * at.s_q;
        let results: Vec<Row> = (0..rows)
            .into_par_iter()
            .map(|r| {
                let i = r % at.s_q;
                let h = (r / at.s_q) % at.h_q;
                at.forward_row(r / (at.s_q * at.h_q), h, i)
            })
            .collect();
        let mut o = Vec::with_capacity(rows * at.d_v);
        let mut stats = Vec::with_capacity(rows);
        let mut max = Vec::with_capacity(rows);
        let mut sum_exp = Vec::with_capacity(rows);
        for row in results {
            o.extend(row.o);
            stats.push(row.lse);
            max.push(row.max);
            sum_exp.push(row.sum_exp);
        }
        let per_row = |x: Vec<f64>| Nd::new(vec![at.b, at.h_q, at.s_q, 1], x);
        // The dropout mask: 1 where kept, 0 where dropped, every element.
        let dump = a.rng_dump.then(|| {
            let mask: Vec<f64> = (0..rows)
                .into_par_iter()
                .flat_map_iter(|r| at.keep(r / (at.s_q * at.h_q), (r / at.s_q) % at.h_q, r % at.s_q).into_iter().map(|k| if k != 0.0 { 1.0 } else { 0.0 }))
                .collect();
            Nd::new(vec![at.b, at.h_q, at.s_q, at.s_kv], mask)
        });
        (Nd::new(vec![at.b, at.h_q, at.s_q, at.d_v], o), [per_row(stats), per_row(max), per_row(sum_exp)], dump)
    };
    let (o, [stats, max, sum_exp], dump) = outputs;
    io.set("o", o);
    io.set("stats", stats);
    io.set("score_max", max);
    io.set("score_sum_exp", sum_exp);
    if let Some(d) = dump {
        io.set("rng_dump", d);
    }
    Ok(())
}

/// The sink's gradient, `[1, h_q, 1, 1]`: `dsink_h = -sum_(b, i) exp(t_h - stats_bhi) D_bhi`
/// over the rows that exist (padded rows, and rows with nothing in their softmax, whose stats is
/// `-inf`, add nothing), with `D_bhi = do_bhi . o_bhi`.
fn dsink(at: &Attention, sink: &[f64], o: &Nd, d_o: &Nd, stats: &Nd) -> Nd {
    let d_v = at.d_v;
    let grads = (0..at.h_q)
        .map(|h| {
            let mut acc = 0.0;
            for bi in 0..at.b {
                for i in 0..at.len_q[bi] {
                    let row = (bi * at.h_q + h) * at.s_q + i;
                    let lse = stats.data[row];
                    if lse == f64::NEG_INFINITY {
                        continue;
                    }
                    let big_d: f64 = d_o.data[row * d_v..][..d_v].iter().zip(&o.data[row * d_v..][..d_v]).map(|(x, y)| x * y).sum();
                    acc += (sink[h] - lse).exp() * big_d;
                }
            }
            -acc
        })
        .collect();
    Nd::new(vec![1, at.h_q, 1, 1], grads)
}

/// The gradients of one (batch, K head) group: dq of its query heads, dk of the K head (logical
/// layout), dv of its V head when K and V have one head count (else [`dv_of_group`] computes
/// dv), and dS of its query heads when a bias needs it.
struct GroupGrads {
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
    ds: Vec<f64>,
}

/// The dv of V head `vh` of batch `bi` (logical layout), summed over the query heads that read
/// it, in head order: for K and V of different head counts.
fn dv_of_group(at: &Attention, d_o: &Nd, stats: &Nd, bi: usize, vh: usize) -> Vec<f64> {
    let (s_q, s_kv, d_v) = (at.s_q, at.s_kv, at.d_v);
    let group = at.h_q / at.h_v;
    let mut dv = vec![0.0; s_kv * d_v];
    for h in vh * group..(vh + 1) * group {
        for i in 0..s_q {
            let Some(s) = at.scores(bi, h, i) else { continue };
            let row = (bi * at.h_q + h) * s_q + i;
            let keep = at.keep(bi, h, i);
            let do_row = &d_o.data[row * d_v..][..d_v];
            for j in 0..s_kv {
                if s[j] == f64::NEG_INFINITY {
                    continue;
                }
                let pk = (s[j] - stats.data[row]).exp() * keep[j];
                for (dvc, x) in dv[j * d_v..][..d_v].iter_mut().zip(do_row) {
                    *dvc += pk * x;
                }
            }
        }
    }
    dv
}

pub(crate) fn sdpa_backward(io: &mut NodeIo, a: &SdpaAttrs) -> Result<()> {
    let outputs = {
        let at = Attention::new(io, a)?;
        let o = io.input("o")?;
        let d_o = io.input("do")?;
        let stats = io.input("stats")?;
        let want_ds = io.has_output("dbias");
        let group = at.h_q / at.h_k;
        // K and V of one head count: the K groups give dv too.
        let dv_with_dk = at.h_k == at.h_v;
        let (s_q, s_kv, d, d_v) = (at.s_q, at.s_kv, at.d, at.d_v);

        // One task per (batch, K head): its query heads' rows all add into the same dk.
        let groups: Vec<GroupGrads> = (0..at.b * at.h_k)
            .into_par_iter()
            .map(|gi| {
                let (bi, kh) = (gi / at.h_k, gi % at.h_k);
                let mut g = GroupGrads {
                    dq: vec![0.0; group * s_q * d],
                    dk: vec![0.0; s_kv * d],
                    dv: if dv_with_dk { vec![0.0; s_kv * d_v] } else { Vec::new() },
                    ds: if want_ds { vec![0.0; group * s_q * s_kv] } else { Vec::new() },
                };
                for hg in 0..group {
                    let h = kh * group + hg;
                    for i in 0..s_q {
                        let Some(s) = at.scores(bi, h, i) else { continue };
                        let row = (bi * at.h_q + h) * s_q + i;
                        let lse = stats.data[row];
                        let keep = at.keep(bi, h, i);
                        let do_row = &d_o.data[row * d_v..][..d_v];
                        let o_row = &o.data[row * d_v..][..d_v];
                        let q_row = &at.q.data[row * d..][..d];
                        // D_i = do_i . o_i equals sum_j p_ij dP_ij (dropout included).
                        let big_d: f64 = do_row.iter().zip(o_row).map(|(x, y)| x * y).sum();
                        for j in 0..s_kv {
                            if s[j] == f64::NEG_INFINITY {
                                continue;
                            }
                            let p = (s[j] - lse).exp();
                            if p == 0.0 {
                                continue;
                            }
                            let kv = ((bi * at.h_k + kh) * s_kv + j) * d;
                            let k_row = &at.k.data[kv..][..d];
                            let v_row = at.v_row(bi, h, j);
                            // dv_j += p_ij keep_ij do_i
                            if dv_with_dk {
                                let pk = p * keep[j];
                                for (dvc, x) in g.dv[j * d_v..][..d_v].iter_mut().zip(do_row) {
                                    *dvc += pk * x;
                                }
                            }
                            // dP_ij = keep_ij (do_i . v_j); dS_ij = p_ij (dP_ij - D_i)
                            let dp = keep[j] * do_row.iter().zip(v_row).map(|(x, y)| x * y).sum::<f64>();
                            let ds = p * (dp - big_d);
                            if want_ds {
                                g.ds[(hg * s_q + i) * s_kv + j] = ds;
                            }
                            let dsc = ds * at.scale;
                            for (dqc, x) in g.dq[(hg * s_q + i) * d..][..d].iter_mut().zip(k_row) {
                                *dqc += dsc * x;
                            }
                            for (dkc, x) in g.dk[j * d..][..d].iter_mut().zip(q_row) {
                                *dkc += dsc * x;
                            }
                        }
                    }
                }
                g
            })
            .collect();
        let dv_groups: Vec<Vec<f64>> =
            if dv_with_dk { Vec::new() } else { (0..at.b * at.h_v).into_par_iter().map(|gi| dv_of_group(&at, d_o, stats, gi / at.h_v, gi % at.h_v)).collect() };

        // Assemble [b, h, s, ...] arrays from the per-group pieces.
        let mut dq = Nd::zeros(&[at.b, at.h_q, s_q, d]);
        let mut dk = Nd::zeros(&[at.b, at.h_k, s_kv, d]);
        let mut dv = Nd::zeros(&[at.b, at.h_v, s_kv, d_v]);
        let mut ds = if want_ds { Nd::zeros(&[at.b, at.h_q, s_q, s_kv]) } else { Nd::zeros(&[0]) };
        for (gi, g) in groups.into_iter().enumerate() {
            let bi = gi / at.h_k;
            let kh = gi % at.h_k;
            let q0 = (bi * at.h_q + kh * group) * s_q;
            dq.data[q0 * d..][..g.dq.len()].copy_from_slice(&g.dq);
            dk.data[gi * s_kv * d..][..g.dk.len()].copy_from_slice(&g.dk);
            // (With K and V of different head counts, dv comes from its own pass below.)
            if dv_with_dk {
                dv.data[gi * s_kv * d_v..][..g.dv.len()].copy_from_slice(&g.dv);
            }
            if want_ds {
                ds.data[q0 * s_kv..][..g.ds.len()].copy_from_slice(&g.ds);
            }
        }
        for (gi, g) in dv_groups.into_iter().enumerate() {
            dv.data[gi * s_kv * d_v..][..g.len()].copy_from_slice(&g);
        }
        let (dk, dv) = match &at.pages {
            Some((pk, pv)) => {
                let (k_pool, v_pool) = (io.input("k")?, io.input("v")?);
                (repage_add(&dk, pk, &k_pool.dims), repage_add(&dv, pv, &v_pool.dims))
            }
            None => (dk, dv),
        };
        // dbias: dS summed over the bias's broadcast (size-1) dims.
        let dbias = match (want_ds, at.bias) {
            (true, Some(bias)) => {
                let mut db = Nd::zeros(&bias.dims);
                let bdims = bias.dims.clone();
                let bstrides = db.strides();
                for_each_index(&ds.dims.clone(), |flat, idx| {
                    let off: usize = idx.iter().zip(&bdims).zip(&bstrides).map(|((&x, &n), &st)| if n == 1 { 0 } else { x * st }).sum();
                    db.data[off] += ds.data[flat];
                });
                Some(db)
            }
            _ => None,
        };
        let dsink = match &at.sink {
            Some(sink) if io.has_output("dsink_token") => Some(dsink(&at, sink, o, d_o, stats)),
            _ => None,
        };
        (dq, dk, dv, dbias, dsink)
    };
    let (dq, dk, dv, dbias, dsink) = outputs;
    io.set("dq", dq);
    io.set("dk", dk);
    io.set("dv", dv);
    if let Some(db) = dbias {
        io.set("dbias", db);
    }
    if let Some(ds) = dsink {
        io.set("dsink_token", ds);
    }
    Ok(())
}
