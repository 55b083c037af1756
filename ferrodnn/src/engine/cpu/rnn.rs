//! The RNN ops on the CPU, in f64: forward, backward data and backward weights, one sample at a
//! time, following the semantics and the weight-space, reserve and dgates layouts documented in
//! `graph::ops::rnn` literally (the reference every other engine is checked against).

use super::rng::{philox_uniform, seed_value};
use super::NodeIo;
use crate::error::Result;
use crate::graph::ops::rnn::{RnnDesc, RnnLayout, RnnMode};
use crate::layout::Nd;

fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

/// The sizes, each sample's length, and where each (step, sample) lives in a sequence tensor.
pub(crate) struct Problem<'a> {
    pub a: &'a RnnDesc,
    pub t: usize,
    pub b: usize,
    pub d: usize,
    pub h: usize,
    pub p: usize,
    pub g: usize,
    pub lens: Vec<usize>,
    /// Packed layout: where each step's rows start.
    step_rows: Vec<usize>,
}

impl Problem<'_> {
    pub fn new<'a>(io: &NodeIo, a: &'a RnnDesc) -> Result<Problem<'a>> {
        let (t, b) = (a.max_seq_length as usize, a.batch as usize);
        let lens = match io.opt_input("seq_lengths") {
            Some(nd) => nd
                .data
                .iter()
                .enumerate()
                .map(|(i, &x)| {
                    if x.fract() != 0.0 || !(0.0..=t as f64).contains(&x) {
                        Err(io.err(format!("seq_lengths[{i}] = {x} is outside [0, max_seq_length = {t}]")))
                    } else {
                        Ok(x as usize)
                    }
                })
                .collect::<Result<Vec<_>>>()?,
            None => vec![t; b],
        };
        if a.layout == RnnLayout::SeqMajorPacked {
            if let Some(i) = (1..b).find(|&i| lens[i] > lens[i - 1]) {
                return Err(io.err(format!(
                    "the packed layout needs non-increasing lengths (as cuDNN's seq_major_packed), but seq_lengths[{i}] = {} follows seq_lengths[{}] = {}",
                    lens[i],
                    i - 1,
                    lens[i - 1]
                )));
            }
        }
        let mut step_rows = vec![0; t + 1];
        for s in 0..t {
            step_rows[s + 1] = step_rows[s] + lens.iter().filter(|&&l| l > s).count();
        }
        Ok(Problem { a, t, b, d: a.dirs() as usize, h: a.hidden_size as usize, p: a.proj() as usize, g: a.cell_mode.gates() as usize, lens, step_rows })
    }

    /// The row of (step `s`, sample `bi`) in a sequence tensor (`None` past the sample's length).
    pub fn row(&self, s: usize, bi: usize) -> Option<usize> {
        if s >= self.lens[bi] {
            return None;
        }
        Some(match self.a.layout {
            RnnLayout::SeqMajorUnpacked => s * self.b + bi,
            RnnLayout::BatchMajorUnpacked => bi * self.t + s,
            RnnLayout::SeqMajorPacked => self.step_rows[s] + bi,
        })
    }

    /// The steps direction `dir` runs for sample `bi`, in order.
    pub fn steps(&self, dir: usize, bi: usize) -> Vec<usize> {
        let n = self.lens[bi];
        if dir == 0 {
            (0..n).collect()
        } else {
            (0..n).rev().collect()
        }
    }

    /// A sequence tensor (`rows x features`) from per-(step, sample) vectors in `[T, B, f]`
    /// order, `padding_fill` elsewhere.
    pub fn to_seq(&self, dense: &[f64], f: usize) -> Vec<f64> {
        let mut out = vec![self.a.padding_fill; self.t * self.b * f];
        for s in 0..self.t {
            for bi in 0..self.b {
                if let Some(r) = self.row(s, bi) {
                    out[r * f..(r + 1) * f].copy_from_slice(&dense[(s * self.b + bi) * f..(s * self.b + bi + 1) * f]);
                }
            }
        }
        out
    }

    /// Per-(step, sample) vectors in `[T, B, f]` order from a sequence tensor (0 past the
    /// lengths).
    pub fn from_seq(&self, seq: &[f64], f: usize) -> Vec<f64> {
        let mut out = vec![0.0; self.t * self.b * f];
        for s in 0..self.t {
            for bi in 0..self.b {
                if let Some(r) = self.row(s, bi) {
                    out[(s * self.b + bi) * f..(s * self.b + bi + 1) * f].copy_from_slice(&seq[r * f..(r + 1) * f]);
                }
            }
        }
        out
    }

    fn layer_input(&self, l: usize) -> usize {
        self.a.layer_input(l as i64) as usize
    }

    /// Index of (step, sample, direction)'s record of `width` in a `[T, B, D, width]` block.
    fn rec(&self, s: usize, bi: usize, dir: usize, width: usize) -> usize {
        ((s * self.b + bi) * self.d + dir) * width
    }
}

/// A view of the weight space: `W x` products and biases by (pseudo-layer, linear id).
struct Weights<'a> {
    a: &'a RnnDesc,
    w: &'a [f64],
}

impl Weights<'_> {
    /// `out[j] += sum_k M[j, k] v[k]` for matrix `lin` of pseudo-layer `pl`.
    fn gemv(&self, pl: usize, lin: usize, v: &[f64], out: &mut [f64]) {
        let m = self.a.weight_params(pl as i64, lin as i64).expect("linear id in range");
        let (rows, cols, off) = (m.rows as usize, m.cols as usize, m.matrix_offset as usize);
        for (j, o) in out.iter_mut().enumerate().take(rows) {
            let row = &self.w[off + j * cols..off + (j + 1) * cols];
            *o += row.iter().zip(v).map(|(a, b)| a * b).sum::<f64>();
        }
    }
    /// `out[k] += sum_j M[j, k] v[j]`.
    fn gemv_t(&self, pl: usize, lin: usize, v: &[f64], out: &mut [f64]) {
        let m = self.a.weight_params(pl as i64, lin as i64).expect("linear id in range");
        let (rows, cols, off) = (m.rows as usize, m.cols as usize, m.matrix_offset as usize);
        for (j, &vj) in v.iter().enumerate().take(rows) {
            let row = &self.w[off + j * cols..off + (j + 1) * cols];
            for (o, &m) in out.iter_mut().zip(row) {
                *o += m * vj;
            }
        }
    }
    /// `out[j] += bias[j]` when matrix `lin` has a bias.
    fn bias(&self, pl: usize, lin: usize, out: &mut [f64]) {
        let m = self.a.weight_params(pl as i64, lin as i64).expect("linear id in range");
        let off = m.bias_offset as usize;
        for (j, o) in out.iter_mut().enumerate().take(m.bias_len as usize) {
            *o += self.w[off + j];
        }
    }
}

/// The initial state of pseudo-layer `pl`, sample `bi` (`n` wide) from `[L * D, B, n]`, or 0.
fn state(nd: Option<&Nd>, pl: usize, bi: usize, b: usize, n: usize) -> Vec<f64> {
    nd.map_or_else(|| vec![0.0; n], |nd| nd.data[(pl * b + bi) * n..(pl * b + bi + 1) * n].to_vec())
}

/// The dropout factor of layer `l`'s output element `(s, bi, k)`.
fn keep(a: &RnnDesc, seed: u64, offset: u64, l: usize, s: usize, bi: usize, k: usize) -> f64 {
    let p = a.dropout.unwrap_or(0.0);
    let (t, b, f) = (a.max_seq_length as u64, a.batch as u64, a.out_size() as u64);
    let index = ((l as u64 * t + s as u64) * b + bi as u64) * f + k as u64;
    if philox_uniform(seed, offset, index) >= p {
        1.0 / (1.0 - p)
    } else {
        0.0
    }
}

pub(crate) fn forward(io: &mut NodeIo, a: &RnnDesc) -> Result<()> {
    let pb = Problem::new(io, a)?;
    let (t, b, d, h, p, g) = (pb.t, pb.b, pb.d, pb.h, pb.p, pb.g);
    let w = Weights { a, w: &io.input("weights")?.data };
    let hx = io.opt_input("hx");
    let cx = io.opt_input("cx");
    let dropout = if a.training && a.has_dropout() { Some((seed_value(io, "seed")?, seed_value(io, "offset")?)) } else { None };
    let sw = a.reserve_states() as usize;
    let f = d * p;
    let mut reserve = if a.training { vec![0.0; a.reserve_elements() as usize] } else { Vec::new() };
    let mut hy = vec![0.0; a.pseudo_layers() as usize * b * p];
    let mut cy = vec![0.0; a.pseudo_layers() as usize * b * h];
    let mut input = pb.from_seq(&io.input("x")?.data, pb.layer_input(0));
    let lstm = a.cell_mode == RnnMode::Lstm;
    for l in 0..a.num_layers as usize {
        let fin = pb.layer_input(l);
        let mut out = vec![0.0; t * b * f];
        let part = a.reserve_layer(l as i64);
        for dir in 0..d {
            let pl = l * d + dir;
            for bi in 0..b {
                let mut hs = state(hx, pl, bi, b, p);
                let mut cs = state(cx, pl, bi, b, h);
                for s in pb.steps(dir, bi) {
                    let xin = &input[(s * b + bi) * fin..(s * b + bi + 1) * fin];
                    // Pre-activations: input part (with bW), recurrent part (with bR).
                    let mut wx = vec![0.0; g * h];
                    let mut rh = vec![0.0; g * h];
                    for gi in 0..g {
                        w.gemv(pl, gi, xin, &mut wx[gi * h..(gi + 1) * h]);
                        w.bias(pl, gi, &mut wx[gi * h..(gi + 1) * h]);
                        w.gemv(pl, g + gi, &hs, &mut rh[gi * h..(gi + 1) * h]);
                        w.bias(pl, g + gi, &mut rh[gi * h..(gi + 1) * h]);
                    }
                    let mut rec = vec![0.0; sw];
                    let hnew: Vec<f64> = match a.cell_mode {
                        RnnMode::Relu | RnnMode::Tanh => {
                            for j in 0..h {
                                let v = wx[j] + rh[j];
                                rec[j] = if a.cell_mode == RnnMode::Relu { v.max(0.0) } else { v.tanh() };
                            }
                            rec.clone()
                        }
                        RnnMode::Lstm => {
                            let mut hh = vec![0.0; h];
                            for j in 0..h {
                                let gate = |k: usize| wx[k * h + j] + rh[k * h + j];
                                let (i, fg, gg, o) = (sigmoid(gate(0)), sigmoid(gate(1)), gate(2).tanh(), sigmoid(gate(3)));
                                let mut c = fg * cs[j] + i * gg;
                                if let Some(clip) = a.cell_clip {
                                    c = clip.apply(c);
                                }
                                cs[j] = c;
                                hh[j] = o * c.tanh();
                                rec[j] = i;
                                rec[h + j] = fg;
                                rec[2 * h + j] = gg;
                                rec[3 * h + j] = o;
                                rec[4 * h + j] = c;
                            }
                            if a.has_proj() {
                                let mut hp = vec![0.0; p];
                                w.gemv(pl, 2 * g, &hh, &mut hp);
                                hp
                            } else {
                                hh
                            }
                        }
                        RnnMode::Gru => {
                            let mut hn = vec![0.0; h];
                            for j in 0..h {
                                let r = sigmoid(wx[j] + rh[j]);
                                let z = sigmoid(wx[h + j] + rh[h + j]);
                                let n = (wx[2 * h + j] + r * rh[2 * h + j]).tanh();
                                hn[j] = (1.0 - z) * n + z * hs[j];
                                rec[j] = r;
                                rec[h + j] = z;
                                rec[2 * h + j] = n;
                                rec[3 * h + j] = rh[2 * h + j];
                            }
                            hn
                        }
                    };
                    out[(s * b + bi) * f + dir * p..(s * b + bi) * f + (dir + 1) * p].copy_from_slice(&hnew);
                    if a.training {
                        let at = part.states as usize + pb.rec(s, bi, dir, sw);
                        reserve[at..at + sw].copy_from_slice(&rec);
                    }
                    hs = hnew;
                }
                hy[(pl * b + bi) * p..(pl * b + bi + 1) * p].copy_from_slice(&hs);
                if lstm {
                    cy[(pl * b + bi) * h..(pl * b + bi + 1) * h].copy_from_slice(&cs);
                }
            }
        }
        if a.training {
            let at = part.outputs as usize;
            reserve[at..at + out.len()].copy_from_slice(&out);
        }
        if let (Some((seed, offset)), Some(mask_at)) = (dropout, part.mask) {
            for s in 0..t {
                for bi in 0..b {
                    if s >= pb.lens[bi] {
                        continue;
                    }
                    for k in 0..f {
                        let m = keep(a, seed, offset, l, s, bi, k);
                        let i = (s * b + bi) * f + k;
                        reserve[mask_at as usize + i] = m;
                        out[i] *= m;
                    }
                }
            }
        }
        input = out;
    }
    let y = pb.to_seq(&input, f);
    // With dropout in training the last layer's output has no dropout, so `input` is `y`'s.
    let ydims = io.output_dims("y")?;
    io.set("y", Nd::new(ydims, y));
    io.set("hy", Nd::new(vec![a.pseudo_layers() as usize, b, p], hy));
    if lstm {
        io.set("cy", Nd::new(vec![a.pseudo_layers() as usize, b, h], cy));
    }
    if a.training {
        io.set("reserve", Nd::new(vec![reserve.len()], reserve));
    }
    Ok(())
}

/// What the backward passes read from the reserve for layer `l`: a state record and an output.
struct Saved<'a> {
    pb: &'a Problem<'a>,
    r: &'a [f64],
}

impl Saved<'_> {
    fn states(&self, l: usize, s: usize, bi: usize, dir: usize) -> &[f64] {
        let sw = self.pb.a.reserve_states() as usize;
        let at = self.pb.a.reserve_layer(l as i64).states as usize + self.pb.rec(s, bi, dir, sw);
        &self.r[at..at + sw]
    }
    /// Layer `l`'s output of direction `dir` at (s, bi), before dropout.
    fn output(&self, l: usize, s: usize, bi: usize, dir: usize) -> &[f64] {
        let (f, p) = (self.pb.d * self.pb.p, self.pb.p);
        let at = self.pb.a.reserve_layer(l as i64).outputs as usize + (s * self.pb.b + bi) * f + dir * p;
        &self.r[at..at + p]
    }
    /// The dropout factors of layer `l`'s outputs at (s, bi) (1 without dropout).
    fn mask(&self, l: usize, s: usize, bi: usize) -> Vec<f64> {
        let f = self.pb.d * self.pb.p;
        match self.pb.a.reserve_layer(l as i64).mask {
            Some(m) => {
                let at = m as usize + (s * self.pb.b + bi) * f;
                self.r[at..at + f].to_vec()
            }
            None => vec![1.0; f],
        }
    }
    /// The hidden state direction `dir` of layer `l` read before step `s` of sample `bi`: the
    /// output of the step before in the direction's order, or the initial state.
    fn h_prev(&self, l: usize, s: usize, bi: usize, dir: usize, hx: Option<&Nd>) -> Vec<f64> {
        let prev = if dir == 0 { s.checked_sub(1) } else { Some(s + 1).filter(|&q| q < self.pb.lens[bi]) };
        match prev {
            Some(q) => self.output(l, q, bi, dir).to_vec(),
            None => state(hx, l * self.pb.d + dir, bi, self.pb.b, self.pb.p),
        }
    }
    /// The LSTM cell before step `s`.
    fn c_prev(&self, l: usize, s: usize, bi: usize, dir: usize, cx: Option<&Nd>) -> Vec<f64> {
        let h = self.pb.h;
        let prev = if dir == 0 { s.checked_sub(1) } else { Some(s + 1).filter(|&q| q < self.pb.lens[bi]) };
        match prev {
            Some(q) => self.states(l, q, bi, dir)[4 * h..5 * h].to_vec(),
            None => state(cx, l * self.pb.d + dir, bi, self.pb.b, h),
        }
    }
    /// Layer `l`'s input at (s, bi): `x` for layer 0, else the layer below's output after
    /// dropout.
    fn input(&self, l: usize, s: usize, bi: usize, x: &[f64]) -> Vec<f64> {
        if l == 0 {
            let fin = self.pb.layer_input(0);
            return x[(s * self.pb.b + bi) * fin..(s * self.pb.b + bi + 1) * fin].to_vec();
        }
        let f = self.pb.d * self.pb.p;
        let mask = self.mask(l - 1, s, bi);
        let at = self.pb.a.reserve_layer(l as i64 - 1).outputs as usize + (s * self.pb.b + bi) * f;
        self.r[at..at + f].iter().zip(&mask).map(|(v, m)| v * m).collect()
    }
}

pub(crate) fn backward_data(io: &mut NodeIo, a: &RnnDesc) -> Result<()> {
    let pb = Problem::new(io, a)?;
    let (t, b, d, h, p, g) = (pb.t, pb.b, pb.d, pb.h, pb.p, pb.g);
    let w = Weights { a, w: &io.input("weights")?.data };
    let saved = Saved { pb: &pb, r: &io.input("reserve")?.data };
    let (hx, cx, dhy, dcy) = (io.opt_input("hx"), io.opt_input("cx"), io.opt_input("dhy"), io.opt_input("dcy"));
    let f = d * p;
    let gw = a.dgates_states() as usize;
    let mut dgates = vec![0.0; a.dgates_elements() as usize];
    let mut dhx = vec![0.0; a.pseudo_layers() as usize * b * p];
    let mut dcx = vec![0.0; a.pseudo_layers() as usize * b * h];
    let lstm = a.cell_mode == RnnMode::Lstm;
    // The gradient of the current layer's output, in [T, B, f] order.
    let mut dout = pb.from_seq(&io.input("dy")?.data, f);
    for l in (0..a.num_layers as usize).rev() {
        let fin = pb.layer_input(l);
        let mut din = vec![0.0; t * b * fin];
        for dir in 0..d {
            let pl = l * d + dir;
            for bi in 0..b {
                let mut dh = state(dhy, pl, bi, b, p);
                let mut dc = state(dcy, pl, bi, b, h);
                for s in pb.steps(dir, bi).into_iter().rev() {
                    let rec = saved.states(l, s, bi, dir);
                    let mut dht: Vec<f64> = dh.iter().zip(&dout[(s * b + bi) * f + dir * p..(s * b + bi) * f + (dir + 1) * p]).map(|(x, y)| x + y).collect();
                    let at = ((l * t + s) * b + bi) * d * gw + dir * gw;
                    let dg = &mut dgates[at..at + gw];
                    let mut dh_prev = vec![0.0; p];
                    match a.cell_mode {
                        RnnMode::Relu | RnnMode::Tanh => {
                            for j in 0..h {
                                let y = rec[j];
                                let der = if a.cell_mode == RnnMode::Relu { f64::from(u8::from(y > 0.0)) } else { 1.0 - y * y };
                                dg[j] = dht[j] * der;
                            }
                        }
                        RnnMode::Lstm => {
                            if a.has_proj() {
                                dg[4 * h..4 * h + p].copy_from_slice(&dht);
                                let mut dhh = vec![0.0; h];
                                w.gemv_t(pl, 2 * g, &dht, &mut dhh);
                                dht = dhh;
                            }
                            let c_prev = saved.c_prev(l, s, bi, dir, cx);
                            for j in 0..h {
                                let (i, fg, gg, o, c) = (rec[j], rec[h + j], rec[2 * h + j], rec[3 * h + j], rec[4 * h + j]);
                                let tc = c.tanh();
                                let mut dct = dc[j] + dht[j] * o * (1.0 - tc * tc);
                                if let Some(clip) = a.cell_clip {
                                    let pre = fg * c_prev[j] + i * gg;
                                    if !(pre >= clip.lower && pre <= clip.upper) {
                                        dct = 0.0;
                                    }
                                }
                                dg[j] = dct * gg * i * (1.0 - i);
                                dg[h + j] = dct * c_prev[j] * fg * (1.0 - fg);
                                dg[2 * h + j] = dct * i * (1.0 - gg * gg);
                                dg[3 * h + j] = dht[j] * tc * o * (1.0 - o);
                                dc[j] = dct * fg;
                            }
                        }
                        RnnMode::Gru => {
                            let hp = saved.h_prev(l, s, bi, dir, hx);
                            for j in 0..h {
                                let (r, z, n, hn) = (rec[j], rec[h + j], rec[2 * h + j], rec[3 * h + j]);
                                let dn = dht[j] * (1.0 - z) * (1.0 - n * n);
                                dg[j] = dn * hn * r * (1.0 - r);
                                dg[h + j] = dht[j] * (hp[j] - n) * z * (1.0 - z);
                                dg[2 * h + j] = dn;
                                dg[3 * h + j] = dn * r;
                                dh_prev[j] = dht[j] * z;
                            }
                        }
                    }
                    // Through the matrices: the recurrent ones to the previous state, the input
                    // ones to the layer's input.
                    let dx = &mut din[(s * b + bi) * fin..(s * b + bi + 1) * fin];
                    for gi in 0..g {
                        let gate = &dg[gi * h..(gi + 1) * h];
                        w.gemv_t(pl, gi, gate, dx);
                        let rec_gate = if a.cell_mode == RnnMode::Gru && gi == 2 { &dg[3 * h..4 * h] } else { gate };
                        w.gemv_t(pl, g + gi, rec_gate, &mut dh_prev);
                    }
                    dh = dh_prev;
                }
                dhx[(pl * b + bi) * p..(pl * b + bi + 1) * p].copy_from_slice(&dh);
                if lstm {
                    dcx[(pl * b + bi) * h..(pl * b + bi + 1) * h].copy_from_slice(&dc);
                }
            }
        }
        if l > 0 {
            // Back through the dropout between the layers.
            for s in 0..t {
                for bi in 0..b {
                    if s < pb.lens[bi] {
                        let mask = saved.mask(l - 1, s, bi);
                        for (k, m) in mask.iter().enumerate() {
                            din[(s * b + bi) * fin + k] *= m;
                        }
                    }
                }
            }
        }
        dout = din;
    }
    let dxdims = io.output_dims("dx")?;
    io.set("dx", Nd::new(dxdims, pb.to_seq(&dout, pb.layer_input(0))));
    io.set("dhx", Nd::new(vec![a.pseudo_layers() as usize, b, p], dhx));
    if lstm {
        io.set("dcx", Nd::new(vec![a.pseudo_layers() as usize, b, h], dcx));
    }
    io.set("dgates", Nd::new(vec![dgates.len()], dgates));
    Ok(())
}

pub(crate) fn backward_weights(io: &mut NodeIo, a: &RnnDesc) -> Result<()> {
    let pb = Problem::new(io, a)?;
    let (t, b, d, h, p, g) = (pb.t, pb.b, pb.d, pb.h, pb.p, pb.g);
    let saved = Saved { pb: &pb, r: &io.input("reserve")?.data };
    let dgates = &io.input("dgates")?.data;
    let hx = io.opt_input("hx");
    let x = pb.from_seq(&io.input("x")?.data, pb.layer_input(0));
    let gw = a.dgates_states() as usize;
    let mut dw = match io.opt_input("dw_in") {
        Some(nd) => nd.data.clone(),
        None => vec![0.0; a.weight_space_elements() as usize],
    };
    // `dw[matrix lin] += v (x) u`, and its bias `+= v`.
    let outer = |dw: &mut [f64], pl: usize, lin: usize, v: &[f64], u: &[f64]| {
        let m = a.weight_params(pl as i64, lin as i64).expect("linear id in range");
        let (cols, off) = (m.cols as usize, m.matrix_offset as usize);
        for (j, &vj) in v.iter().enumerate().take(m.rows as usize) {
            for (k, &uk) in u.iter().enumerate().take(cols) {
                dw[off + j * cols + k] += vj * uk;
            }
        }
        for (j, &vj) in v.iter().enumerate().take(m.bias_len as usize) {
            dw[m.bias_offset as usize + j] += vj;
        }
    };
    for l in 0..a.num_layers as usize {
        for dir in 0..d {
            let pl = l * d + dir;
            for bi in 0..b {
                for s in pb.steps(dir, bi) {
                    let at = ((l * t + s) * b + bi) * d * gw + dir * gw;
                    let dg = &dgates[at..at + gw];
                    let xin = saved.input(l, s, bi, &x);
                    let hp = saved.h_prev(l, s, bi, dir, hx);
                    for gi in 0..g {
                        outer(&mut dw, pl, gi, &dg[gi * h..(gi + 1) * h], &xin);
                        let rec_gate = if a.cell_mode == RnnMode::Gru && gi == 2 { &dg[3 * h..4 * h] } else { &dg[gi * h..(gi + 1) * h] };
                        outer(&mut dw, pl, g + gi, rec_gate, &hp);
                    }
                    if a.cell_mode == RnnMode::Lstm && a.has_proj() {
                        let rec = saved.states(l, s, bi, dir);
                        let hh: Vec<f64> = (0..h).map(|j| rec[3 * h + j] * rec[4 * h + j].tanh()).collect();
                        outer(&mut dw, pl, 2 * g, &dg[4 * h..4 * h + p], &hh);
                    }
                }
            }
        }
    }
    io.set("dw", Nd::new(vec![dw.len()], dw));
    Ok(())
}
