//! Row-wise memory-bound ops as one threaded pass over each row: softmax and log-softmax (over
//! any axis; with the log-sum-exp statistics), layernorm and rmsnorm forward (statistics over
//! every dim but the batch dim, training or inference). Each row is read once into a per-thread
//! f32 buffer (any strides, f32/f16/bf16), reduced (sums in f64), and written once. With
//! AVX-512, f32 rows whose values are one apart are read and written in place, and an output
//! larger than [`STREAM_BYTES`] is written with non-temporal stores (straight to memory, not
//! first read into the cache: a third less memory traffic for a pass that reads x and writes y).

use super::tensor::{Dst, Src};
use super::{check_tensor, Exec};
use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::ops::Op;
use crate::graph::{Graph, TensorId};
use crate::layout::unravel;
use rayon::prelude::*;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Softmax {
        axis: usize,
        log: bool,
    },
    /// Layernorm (`rms` false) or rmsnorm.
    Norm {
        rms: bool,
        epsilon: f64,
    },
}

pub(crate) struct RowStep {
    pub node: usize,
    kind: Kind,
    x: TensorId,
    y: TensorId,
    /// Softmax: the log-sum-exp; norms: the mean.
    stats: Option<TensorId>,
    inv_variance: Option<TensorId>,
    scale: Option<TensorId>,
    bias: Option<TensorId>,
    epsilon: Option<TensorId>,
}

/// The output size from which the row kernels write their rows with non-temporal stores: at half
/// of a large L3, x and y together no longer stay in the cache for whatever reads y next, so
/// reading y's lines in before overwriting them (as ordinary stores do) buys nothing.
const STREAM_BYTES: usize = 16 << 20;

/// Whether an f32 output of `elems` values is written with non-temporal stores.
fn streamed(elems: usize) -> bool {
    elems * 4 >= STREAM_BYTES
}

fn udims(g: &Graph, t: TensorId) -> Vec<usize> {
    g.desc(t).dims.iter().map(|&x| x as usize).collect()
}

impl RowStep {
    pub fn plan(g: &Graph, ni: usize) -> std::result::Result<RowStep, String> {
        let node = &g.nodes[ni];
        if g.compute_type(node) != DataType::F32 {
            return Err(format!("compute type {} (the fast kernels compute in f32)", g.compute_type(node)));
        }
        let x = node.input("x").ok_or("port `x` is missing")?;
        let y = node.output("y").ok_or("port `y` is missing")?;
        let (kind, stats, inv_variance, scale, bias, epsilon) = match &node.op {
            Op::Softmax(a) => (Kind::Softmax { axis: a.axis, log: a.log }, node.output("stats"), None, None, None, None),
            Op::Layernorm(a) | Op::Rmsnorm(a) => {
                let rms = matches!(node.op, Op::Rmsnorm(_));
                let eps = node.input("epsilon");
                if let Some(e) = eps {
                    if !g.resolved_data_type(e).is_some_and(super::epilogue::fast_type) {
                        return Err("the epsilon tensor is not f32, f16 or bf16".into());
                    }
                }
                (Kind::Norm { rms, epsilon: a.epsilon }, if rms { None } else { node.output("mean") }, node.output("inv_variance"), node.input("scale"), node.input("bias"), eps)
            }
            _ => return Err("not a row op".into()),
        };
        check_tensor(g, x, false)?;
        check_tensor(g, y, true)?;
        for t in [stats, inv_variance].into_iter().flatten() {
            check_tensor(g, t, true)?;
        }
        for t in [scale, bias].into_iter().flatten() {
            check_tensor(g, t, false)?;
        }
        let xd = udims(g, x);
        if udims(g, y) != xd {
            return Err("y's dims differ from x's".into());
        }
        match kind {
            Kind::Softmax { axis, .. } if axis >= xd.len() => return Err(format!("axis {axis} is out of range")),
            Kind::Norm { .. } => {
                if xd.len() < 2 {
                    return Err("x has rank below 2".into());
                }
                let want: Vec<usize> = std::iter::once(xd[0]).chain(std::iter::repeat_n(1, xd.len() - 1)).collect();
                for t in [stats, inv_variance].into_iter().flatten() {
                    if udims(g, t) != want {
                        return Err(format!("statistics dims {:?} (the fast kernels take {want:?})", udims(g, t)));
                    }
                }
                for t in [scale, bias].into_iter().flatten() {
                    let d = udims(g, t);
                    if d.len() > xd.len() || d.iter().rev().zip(xd.iter().rev()).any(|(&a, &b)| a != 1 && a != b) || (d.len() == xd.len() && d[0] != 1) {
                        return Err(format!("scale or bias dims {d:?} do not broadcast over one row of x"));
                    }
                }
            }
            _ => {}
        }
        Ok(RowStep { node: ni, kind, x, y, stats, inv_variance, scale, bias, epsilon })
    }

    pub fn describe(&self) -> String {
        match self.kind {
            Kind::Softmax { axis, log } => format!("{} over axis {axis}, a pass per row", if log { "log-softmax" } else { "softmax" }),
            Kind::Norm { rms, .. } => format!("{} over every dim but the first, a pass per row", if rms { "rmsnorm" } else { "layernorm" }),
        }
    }

    pub fn run(&self, ex: &mut Exec) -> Result<()> {
        let x = ex.src(self.x)?;
        let scale = self.scale.map(|t| ex.src(t)).transpose()?;
        let bias = self.bias.map(|t| ex.src(t)).transpose()?;
        let eps = match (self.kind, self.epsilon) {
            // SAFETY: offset 0 is the by-value scalar's one element.
            (Kind::Norm { .. }, Some(t)) => unsafe { ex.src(t)?.load(0) as f64 },
            (Kind::Norm { epsilon, .. }, None) => epsilon,
            _ => 0.0,
        };
        // The statistics first (into new intermediates or their buffers), then y.
        let mut stats = Vec::new();
        for t in [self.stats, self.inv_variance].into_iter().flatten() {
            let dims = udims(ex.graph, t);
            let mut vals = vec![0f32; dims.iter().product()];
            stats.push((t, dims, std::mem::take(&mut vals)));
        }
        ex.with_dst(self.y, |y, _| {
            match self.kind {
                Kind::Softmax { axis, log } => softmax(&x, y, axis, log, stats.first_mut().map(|s| s.2.as_mut_slice())),
                Kind::Norm { rms, .. } => {
                    let (mut mean, mut inv) = (None, None);
                    for (t, _, v) in stats.iter_mut() {
                        if Some(*t) == self.inv_variance {
                            inv = Some(v.as_mut_slice());
                        } else {
                            mean = Some(v.as_mut_slice());
                        }
                    }
                    norm(&x, y, scale.as_ref(), bias.as_ref(), eps, rms, mean, inv)
                }
            }
            Ok(())
        })?;
        // Write the statistics (dense, row-major order = row order) through their tensors.
        for (t, dims, vals) in stats {
            ex.with_dst(t, |d, _| {
                let src = Src::dense(&vals, &dims);
                let mut idx = vec![0usize; dims.len()];
                for (i, _) in vals.iter().enumerate() {
                    unravel(i, &dims, &mut idx);
                    let so: isize = idx.iter().zip(&src.strides).map(|(&a, &s)| a as isize * s).sum();
                    let dofs: isize = idx.iter().zip(&d.strides).map(|(&a, &s)| a as isize * s).sum();
                    // SAFETY: both offsets are of element idx of the statistics tensor.
                    unsafe { d.store(dofs, src.load(so)) };
                }
                Ok(())
            })?;
        }
        Ok(())
    }
}

/// The offsets, relative to a row's first element, of each element of a row made of the
/// trailing dims `dims[from..]` of a tensor with `strides` (broadcast: stride 0).
fn row_offsets(dims: &[usize], strides: &[isize], from: usize) -> Vec<isize> {
    let sub = &dims[from..];
    let n: usize = sub.iter().product();
    let mut idx = vec![0usize; sub.len()];
    (0..n)
        .map(|j| {
            unravel(j, sub, &mut idx);
            idx.iter().zip(&strides[from..]).map(|(&i, &s)| i as isize * s).sum()
        })
        .collect()
}

fn softmax(x: &Src, y: &Dst, axis: usize, log: bool, stats: Option<&mut [f32]>) {
    let dims = &x.dims;
    let outer: usize = dims[..axis].iter().product();
    let inner: usize = dims[axis + 1..].iter().product();
    let len = dims[axis];
    let (xs, ys) = (x.strides[axis], y.strides[axis]);
    let stats_addr = stats.map(|s| s.as_mut_ptr() as usize);
    let direct = direct_rows(x, xs, y, ys);
    // Streamed rows keep e^(x - max) in the thread's buffer (in cache) until they are scaled
    // into y.
    let stream = direct.is_some() && streamed(outer * inner * len);
    (0..outer * inner).into_par_iter().with_min_len(16).for_each_init(
        || (vec![0usize; dims.len()], if direct.is_some() && !stream { Vec::new() } else { vec![0f32; len] }),
        |(idx, buf), r| {
            let (o, i) = (r / inner, r % inner);
            unravel(o, &dims[..axis], &mut idx[..axis]);
            unravel(i, &dims[axis + 1..], &mut idx[axis + 1..]);
            idx[axis] = 0;
            let xb: isize = idx.iter().zip(&x.strides).map(|(&a, &s)| a as isize * s).sum();
            let yb: isize = idx.iter().zip(&y.strides).map(|(&a, &s)| a as isize * s).sum();
            let lse = match direct {
                // SAFETY: the row's len values from xb and yb are elements of x and y, one
                // apart (direct_rows checked); rows are disjoint, so no other thread writes
                // these values of y; a streamed row's buffer holds len values.
                #[cfg(target_arch = "x86_64")]
                Some((xp, yp)) => unsafe {
                    let y = (yp as *mut f32).offset(yb);
                    avx512::softmax_row((xp as *const f32).offset(xb), y, if stream { buf.as_mut_ptr() } else { y }, len, log, stream)
                },
                _ => {
                    read_row(x, xb, xs, buf);
                    let lse = softmax_row(buf, log);
                    write_row(y, yb, ys, buf);
                    lse
                }
            };
            if let Some(a) = stats_addr {
                // SAFETY: r < outer * inner, the statistics' element count; one row writes it.
                unsafe { *(a as *mut f32).add(r) = lse as f32 };
            }
        },
    );
}

#[allow(clippy::too_many_arguments)]
fn norm(x: &Src, y: &Dst, scale: Option<&Src>, bias: Option<&Src>, eps: f64, rms: bool, mean_out: Option<&mut [f32]>, inv_out: Option<&mut [f32]>) {
    let dims = &x.dims;
    let rows = dims[0];
    let row_len: usize = dims[1..].iter().product();
    let x_off = row_offsets(dims, &x.strides, 1);
    let y_off = row_offsets(dims, &y.strides, 1);
    // Scale and bias broadcast over one row, once (every row uses the same).
    let along = |s: Option<&Src>, fill: f32| -> Vec<f32> {
        match s {
            Some(s) => row_offsets(dims, &s.broadcast_strides(dims), 1).iter().map(|&o| unsafe { s.load(o) }).collect(),
            None => vec![fill; row_len],
        }
    };
    // SAFETY (in `along`): the offsets are of broadcast elements of scale and bias.
    let (s_row, b_row) = (along(scale, 1.0), along(bias, 0.0));
    // A row of x or y as one stride, when its offsets are (packed trailing dims).
    let step = |off: &[isize]| -> Option<isize> {
        let s = if off.len() > 1 { off[1] - off[0] } else { 1 };
        off.iter().enumerate().all(|(j, &o)| o == j as isize * s).then_some(s)
    };
    let (x_step, y_step) = (step(&x_off), step(&y_off));
    let (mean_addr, inv_addr) = (mean_out.map(|s| s.as_mut_ptr() as usize), inv_out.map(|s| s.as_mut_ptr() as usize));
    let direct = match (x_step, y_step) {
        (Some(xs), Some(ys)) => direct_rows(x, xs, y, ys),
        _ => None,
    };
    let stream = streamed(rows * row_len);
    (0..rows).into_par_iter().for_each_init(
        || if direct.is_some() { Vec::new() } else { vec![0f32; row_len] },
        |buf, r| {
            let (xb, yb) = (r as isize * x.strides[0], r as isize * y.strides[0]);
            #[cfg(target_arch = "x86_64")]
            if let Some((xp, yp)) = direct {
                // SAFETY: as in softmax: row r's values of x and y, one apart; rows are
                // disjoint.
                let (mean, inv) = unsafe { avx512::norm_row((xp as *const f32).offset(xb), (yp as *mut f32).offset(yb), row_len, &s_row, &b_row, eps, rms, stream) };
                // SAFETY: r < rows, the statistics' element count; each row writes its own.
                if let Some(a) = mean_addr {
                    unsafe { *(a as *mut f32).add(r) = mean as f32 };
                }
                if let Some(a) = inv_addr {
                    unsafe { *(a as *mut f32).add(r) = inv as f32 };
                }
                return;
            }
            if let Some(xs) = x_step {
                read_row(x, xb, xs, buf);
            } else {
                for (v, &o) in buf.iter_mut().zip(&x_off) {
                    // SAFETY: element (r, j) of x.
                    *v = unsafe { x.load(xb + o) };
                }
            }
            let (mean, inv) = norm_row(buf, &s_row, &b_row, eps, rms);
            if let Some(ys) = y_step {
                write_row(y, yb, ys, buf);
            } else {
                for (&v, &o) in buf.iter().zip(&y_off) {
                    // SAFETY: row r's element j of y; rows are disjoint.
                    unsafe { y.store(yb + o, v) };
                }
            }
            // SAFETY: r < rows, the statistics' element count; each row writes its own.
            if let Some(a) = mean_addr {
                unsafe { *(a as *mut f32).add(r) = mean as f32 };
            }
            if let Some(a) = inv_addr {
                unsafe { *(a as *mut f32).add(r) = inv as f32 };
            }
        },
    );
}

/// The addresses of x and y when the AVX-512 kernels read and write rows in place: both f32
/// (4-byte aligned, no rounding on the way out), each row's values one apart.
fn direct_rows(x: &Src, xs: isize, y: &Dst, ys: isize) -> Option<(usize, usize)> {
    match (isa(), x.f32_ptr(), y.f32_ptr()) {
        (Isa::Avx512, Some(xp), Some(yp)) if xs == 1 && ys == 1 => Some((xp as usize, yp as usize)),
        _ => None,
    }
}

/// Row `buf` read from `src` at `base`, element k at `base + k * step`.
fn read_row(src: &Src, base: isize, step: isize, buf: &mut [f32]) {
    if src.dtype == DataType::F32 && step == 1 {
        // SAFETY: the row's elements are buf.len() consecutive f32 values from `base`; a byte
        // copy needs no alignment.
        unsafe { std::ptr::copy_nonoverlapping((src.raw() as *const f32).offset(base) as *const u8, buf.as_mut_ptr() as *mut u8, buf.len() * 4) };
        return;
    }
    for (k, v) in buf.iter_mut().enumerate() {
        // SAFETY: element k of the row.
        *v = unsafe { src.load(base + k as isize * step) };
    }
}

/// Row `buf` written to `dst` at `base`, element k at `base + k * step`.
fn write_row(dst: &Dst, base: isize, step: isize, buf: &[f32]) {
    if let (Some(p), 1) = (dst.f32_ptr(), step) {
        // SAFETY: the row's elements are buf.len() consecutive f32 values from `base`, written
        // by this thread alone (rows are disjoint).
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), p.offset(base), buf.len()) };
        return;
    }
    for (k, &v) in buf.iter().enumerate() {
        // SAFETY: element k of the row; rows are disjoint.
        unsafe { dst.store(base + k as isize * step, v) };
    }
}

/// `e^x` in f32 by range reduction (`x = n ln 2 + r`) and a degree-6 polynomial for `e^r`
/// (relative error near 2e-7), written so that loops over it vectorize; 0 below -87.3 (where f32
/// would be subnormal), +inf above 88.7, NaN for NaN.
#[inline(always)]
pub(super) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let xc = x.clamp(-87.0, 88.0);
    // t's low mantissa bits hold round(xc / ln 2) as an integer: 2^n is built from them with
    // integer operations only (no float-to-int conversion, which would not vectorize as well).
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let ni = t.to_bits().wrapping_sub(ROUND.to_bits());
    let scale = f32::from_bits(ni.wrapping_add(127) << 23);
    let v = p * scale;
    if x < -87.0 {
        0.0
    } else if x > 88.0 {
        f32::INFINITY
    } else {
        v
    }
}

/// `f` folded over `buf` in 16 lanes (lane `k` takes elements `k`, `k + 16`, ...): whole
/// chunks of 16 first, so that the compiler vectorizes them, then the rest.
#[inline(always)]
pub(super) fn fold16(buf: &[f32], init: f32, mut f: impl FnMut(f32, f32) -> f32) -> [f32; 16] {
    let mut acc = [init; 16];
    let mut chunks = buf.chunks_exact(16);
    for c in &mut chunks {
        for k in 0..16 {
            acc[k] = f(acc[k], c[k]);
        }
    }
    for (k, &v) in chunks.remainder().iter().enumerate() {
        acc[k] = f(acc[k], v);
    }
    acc
}

/// Softmax (or log-softmax) of one row in place; returns its log-sum-exp.
#[inline(always)]
fn softmax_row_impl(buf: &mut [f32], log: bool) -> f64 {
    let m = fold16(buf, f32::NEG_INFINITY, f32::max).iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let acc = if log {
        fold16(buf, 0.0, |a, v| a + exp_f32(v - m))
    } else {
        // e = exp(x - m) stored in place while summed.
        let mut acc = [0f32; 16];
        let mut chunks = buf.chunks_exact_mut(16);
        for c in &mut chunks {
            for k in 0..16 {
                let e = exp_f32(c[k] - m);
                c[k] = e;
                acc[k] += e;
            }
        }
        for (k, v) in chunks.into_remainder().iter_mut().enumerate() {
            let e = exp_f32(*v - m);
            *v = e;
            acc[k] += e;
        }
        acc
    };
    let sum: f64 = acc.iter().map(|&a| a as f64).sum();
    let lse = m as f64 + sum.ln();
    if log {
        let l = lse as f32;
        buf.iter_mut().for_each(|v| *v -= l);
    } else {
        let inv = (1.0 / sum) as f32;
        buf.iter_mut().for_each(|v| *v *= inv);
    }
    lse
}

/// Normalizes one row in place: `(x - mean) * inv * scale + bias` (no mean for rmsnorm); returns
/// (mean, inverse standard deviation). Sums in f32 lanes, added up in f64.
#[inline(always)]
fn norm_row_impl(buf: &mut [f32], scale: &[f32], bias: &[f32], eps: f64, rms: bool) -> (f64, f64) {
    let n = buf.len() as f64;
    let mean = if rms { 0.0 } else { fold16(buf, 0.0, |a, v| a + v).iter().map(|&a| a as f64).sum::<f64>() / n };
    let m = mean as f32;
    let var = fold16(buf, 0.0, |a, v| a + (v - m) * (v - m)).iter().map(|&a| a as f64).sum::<f64>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    let i = inv as f32;
    for ((v, &s), &b) in buf.iter_mut().zip(scale).zip(bias) {
        *v = (*v - m) * i * s + b;
    }
    (mean, inv)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_row_avx2(buf: &mut [f32], log: bool) -> f64 {
    softmax_row_impl(buf, log)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn norm_row_avx2(buf: &mut [f32], scale: &[f32], bias: &[f32], eps: f64, rms: bool) -> (f64, f64) {
    norm_row_impl(buf, scale, bias, eps, rms)
}

/// The CPU features a row kernel may use, detected once.
#[derive(Clone, Copy, PartialEq)]
enum Isa {
    Avx512,
    Avx2,
    Plain,
}

fn isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            if is_x86_feature_detected!("avx512f") {
                Isa::Avx512
            } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                Isa::Avx2
            } else {
                Isa::Plain
            }
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Isa::Plain
    }
}

fn softmax_row(buf: &mut [f32], log: bool) -> f64 {
    match isa() {
        // SAFETY: the CPU has AVX-512F (checked at run time).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512::softmax_row(buf.as_mut_ptr(), buf.as_mut_ptr(), buf.as_mut_ptr(), buf.len(), log, false) },
        // SAFETY: the CPU has AVX2 and FMA (checked at run time).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { softmax_row_avx2(buf, log) },
        _ => softmax_row_impl(buf, log),
    }
}

fn norm_row(buf: &mut [f32], scale: &[f32], bias: &[f32], eps: f64, rms: bool) -> (f64, f64) {
    match isa() {
        // SAFETY: as in softmax_row.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512::norm_row(buf.as_mut_ptr(), buf.as_mut_ptr(), buf.len(), scale, bias, eps, rms, false) },
        // SAFETY: as in softmax_row.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { norm_row_avx2(buf, scale, bias, eps, rms) },
        _ => norm_row_impl(buf, scale, bias, eps, rms),
    }
}

/// The row kernels in AVX-512 (16 lanes): the passes of the portable ones, reading `x` and
/// writing `y` directly (which may be one buffer), with `e^x` as a polynomial on the reduced
/// argument and `vscalefps` for the power of two, and the ragged end of a row as masked vectors.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// Lanes `0..n` (n <= 16) of a mask.
    #[inline(always)]
    fn tail(n: usize) -> __mmask16 {
        ((1u32 << n) - 1) as __mmask16
    }

    /// `e^x` per lane for `x <= 0` (what softmax takes after subtracting the maximum): a
    /// degree-5 minimax polynomial on `x - n ln 2`, relative error near 2e-7; NaN stays NaN,
    /// -inf gives 0.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn exp_nonpos(x: __m512) -> __m512 {
        // max returns its second operand when one is NaN: a NaN x stays NaN.
        let x = _mm512_max_ps(_mm512_set1_ps(-104.0), x);
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)));
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_145_75), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428_606_8e-6), r);
        let mut p = _mm512_set1_ps(8.297_655e-3);
        for c in [4.191_538_3e-2, 0.166_675_75, 0.499_988_94, 0.999_999_7, 1.000_000_1] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        _mm512_scalef_ps(p, n)
    }

    /// The sum of a vector's lanes, added up in f64.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn lanes_f64(v: __m512) -> f64 {
        let mut a = [0f32; 16];
        // SAFETY: `a` holds 16 f32 values.
        unsafe { _mm512_storeu_ps(a.as_mut_ptr(), v) };
        a.iter().map(|&x| x as f64).sum()
    }

    /// `f` over the `n` values at `src`, two 16-value vectors at a time (two, so that sums go
    /// to two accumulators that do not wait on each other), its results stored at `dst` unless
    /// it is null. The ragged end is a pair of masked vectors whose lanes past the end read
    /// `fill` and are not stored.
    ///
    /// # Safety
    /// `src` must be readable and `dst` (unless null) writable for `n` values; they may be the
    /// same memory.
    #[inline(always)]
    unsafe fn pairs(src: *const f32, dst: *mut f32, n: usize, fill: f32, mut f: impl FnMut(usize, __m512, __m512) -> (__m512, __m512)) {
        let mut i = 0;
        // SAFETY (all blocks): i + 32 <= n in the loop, and the masked accesses touch only
        // lanes below n - i, so every access is among the caller's n values.
        while i + 32 <= n {
            let (a, b) = unsafe { f(i, _mm512_loadu_ps(src.add(i)), _mm512_loadu_ps(src.add(i + 16))) };
            if !dst.is_null() {
                unsafe {
                    _mm512_storeu_ps(dst.add(i), a);
                    _mm512_storeu_ps(dst.add(i + 16), b);
                }
            }
            i += 32;
        }
        if i < n {
            let (m0, m1) = (tail((n - i).min(16)), tail((n - i).saturating_sub(16)));
            let fv = _mm512_set1_ps(fill);
            let (a, b) = unsafe { f(i, _mm512_mask_loadu_ps(fv, m0, src.add(i)), _mm512_mask_loadu_ps(fv, m1, src.add(i + 16))) };
            if !dst.is_null() {
                unsafe {
                    _mm512_mask_storeu_ps(dst.add(i), m0, a);
                    _mm512_mask_storeu_ps(dst.add(i + 16), m1, b);
                }
            }
        }
    }

    /// `f` over the `n` values at `src` a vector at a time, its results stored at `dst` with
    /// non-temporal stores where a whole 64-byte line of `dst` lies among the n values (written
    /// to memory without first being read into the cache), ordinary masked stores in the partial
    /// lines at either end; then a store fence, so that the values are in memory in program
    /// order when it returns (as ordinary stores would be to another thread after a join). `f`
    /// gets the offset, the vector (lanes past the n values read 0) and its lanes' mask.
    ///
    /// # Safety
    /// `src` must be readable and `dst` writable for `n` values, `dst` 4-byte aligned; they may
    /// be the same memory.
    #[inline(always)]
    unsafe fn streamed(src: *const f32, dst: *mut f32, n: usize, mut f: impl FnMut(usize, __m512, __mmask16) -> __m512) {
        // Values before dst's first 64-byte boundary.
        let head = ((64 - dst as usize % 64) % 64 / 4).min(n);
        // SAFETY (all blocks): every access is among the caller's n values (masked to them at
        // either end); from `head` on, dst + i is 64-byte aligned, as the non-temporal store
        // needs.
        if head > 0 {
            let m = tail(head);
            unsafe { _mm512_mask_storeu_ps(dst, m, f(0, _mm512_maskz_loadu_ps(m, src), m)) };
        }
        let mut i = head;
        while i + 16 <= n {
            unsafe { _mm512_stream_ps(dst.add(i), f(i, _mm512_loadu_ps(src.add(i)), 0xffff)) };
            i += 16;
        }
        if i < n {
            let m = tail(n - i);
            unsafe { _mm512_mask_storeu_ps(dst.add(i), m, f(i, _mm512_maskz_loadu_ps(m, src.add(i)), m)) };
        }
        _mm_sfence();
    }

    /// Softmax (or log-softmax) of the `n` values at `x` into `y`; returns their log-sum-exp.
    /// Three passes: the maximum, `e^(x - max)` into `tmp` (or only summed, for log-softmax),
    /// and `y` = `tmp` scaled (or `y = x - lse`), the row staying in cache after the first.
    /// With `stream`, the last pass writes `y` with non-temporal stores (`tmp` is then a buffer
    /// of the thread's that stays in cache; else it is `y`).
    ///
    /// # Safety
    /// `x` readable and `y` and `tmp` writable for `n` values (`x`, `y` and `tmp` may be the
    /// same memory; `y` 4-byte aligned).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn softmax_row(x: *const f32, y: *mut f32, tmp: *mut f32, n: usize, log: bool, stream: bool) -> f64 {
        let (mut m0, mut m1) = (_mm512_set1_ps(f32::NEG_INFINITY), _mm512_set1_ps(f32::NEG_INFINITY));
        // SAFETY (the `pairs` calls): the caller's extents.
        unsafe {
            pairs(x, std::ptr::null_mut(), n, f32::NEG_INFINITY, |_, a, b| {
                (m0, m1) = (_mm512_max_ps(m0, a), _mm512_max_ps(m1, b));
                (a, b)
            })
        };
        let m = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
        let mv = _mm512_set1_ps(m);
        // Lanes past the end read -inf, whose exp is 0.
        let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        unsafe {
            pairs(x, if log { std::ptr::null_mut() } else { tmp }, n, f32::NEG_INFINITY, |_, a, b| {
                let (ea, eb) = (exp_nonpos(_mm512_sub_ps(a, mv)), exp_nonpos(_mm512_sub_ps(b, mv)));
                (s0, s1) = (_mm512_add_ps(s0, ea), _mm512_add_ps(s1, eb));
                (ea, eb)
            })
        };
        let sum = lanes_f64(s0) + lanes_f64(s1);
        let lse = m as f64 + sum.ln();
        let (src, by) = if log { (x, _mm512_set1_ps(lse as f32)) } else { (tmp as *const f32, _mm512_set1_ps((1.0 / sum) as f32)) };
        let last = |a| if log { _mm512_sub_ps(a, by) } else { _mm512_mul_ps(a, by) };
        if stream {
            unsafe { streamed(src, y, n, |_, a, _| last(a)) };
        } else {
            unsafe { pairs(src, y, n, 0.0, |_, a, b| (last(a), last(b))) };
        }
        lse
    }

    /// Layernorm (or rmsnorm) of the `n` values at `x` into `y` as [`super::norm_row_impl`]
    /// computes it; `scale` and `bias` hold `n` values each. With `stream`, `y` is written with
    /// non-temporal stores.
    ///
    /// # Safety
    /// `x` readable and `y` writable for `n` values (they may be the same memory; `y` 4-byte
    /// aligned).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn norm_row(x: *const f32, y: *mut f32, n: usize, scale: &[f32], bias: &[f32], eps: f64, rms: bool, stream: bool) -> (f64, f64) {
        let none = std::ptr::null_mut();
        let mean = if rms {
            0.0
        } else {
            let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            // SAFETY (the `pairs` calls): the caller's extents.
            unsafe {
                pairs(x, none, n, 0.0, |_, a, b| {
                    (s0, s1) = (_mm512_add_ps(s0, a), _mm512_add_ps(s1, b));
                    (a, b)
                })
            };
            (lanes_f64(s0) + lanes_f64(s1)) / n as f64
        };
        let m = _mm512_set1_ps(mean as f32);
        let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        // Lanes past the end read the mean: they add nothing.
        unsafe {
            pairs(x, none, n, mean as f32, |_, a, b| {
                let (da, db) = (_mm512_sub_ps(a, m), _mm512_sub_ps(b, m));
                (s0, s1) = (_mm512_fmadd_ps(da, da, s0), _mm512_fmadd_ps(db, db, s1));
                (a, b)
            })
        };
        let var = (lanes_f64(s0) + lanes_f64(s1)) / n as f64;
        let inv = 1.0 / (var + eps).sqrt();
        let iv = _mm512_set1_ps(inv as f32);
        let (sp, bp) = (scale.as_ptr(), bias.as_ptr());
        if stream {
            // SAFETY: as below, one vector at a time (masked as the row's at either end).
            unsafe {
                streamed(x, y, n, |i, a, k| {
                    let (s, b) = (_mm512_maskz_loadu_ps(k, sp.add(i)), _mm512_maskz_loadu_ps(k, bp.add(i)));
                    _mm512_fmadd_ps(_mm512_mul_ps(_mm512_sub_ps(a, m), iv), s, b)
                })
            };
            return (mean, inv);
        }
        unsafe {
            pairs(x, y, n, 0.0, |i, a, b| {
                // SAFETY: scale and bias hold n values; the vectors at the ragged end are
                // masked to it as the row's are.
                let (k0, k1) = (tail((n - i).min(16)), tail((n - i).saturating_sub(16).min(16)));
                let (sa, sb) = (_mm512_maskz_loadu_ps(k0, sp.add(i)), _mm512_maskz_loadu_ps(k1, sp.add(i + 16)));
                let (ba, bb) = (_mm512_maskz_loadu_ps(k0, bp.add(i)), _mm512_maskz_loadu_ps(k1, bp.add(i + 16)));
                (_mm512_fmadd_ps(_mm512_mul_ps(_mm512_sub_ps(a, m), iv), sa, ba), _mm512_fmadd_ps(_mm512_mul_ps(_mm512_sub_ps(b, m), iv), sb, bb))
            })
        };
        (mean, inv)
    }
}

#[cfg(test)]
mod tests {
    use super::{exp_f32, norm_row_impl, softmax_row_impl};

    /// The AVX-512 row kernels against the portable ones on every ragged length up to three
    /// vector pairs, in place and from one buffer into another, with -inf and large values; and
    /// the streamed forms (non-temporal stores) bit for bit as the plain ones, at every alignment
    /// of the output within a 64-byte line, writing nothing outside the row.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_row_kernels_match_the_portable_ones_at_every_ragged_length() {
        if super::isa() != super::Isa::Avx512 {
            return;
        }
        let close = |a: f32, b: f32, what: &str| assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{what}: {a} vs {b}");
        // The row at `shift` values into a buffer with NaN on either side: its values, and
        // whether everything around them is still NaN.
        let around = |buf: &[f32], shift: usize, n: usize| (buf[shift..shift + n].to_vec(), buf[..shift].iter().chain(&buf[shift + n..]).all(|v| v.is_nan()));
        for n in 1..100usize {
            let x: Vec<f32> =
                (0..n).map(|i| ((i * 37 % 23) as f32 - 11.0) * if i % 7 == 3 { 9.0 } else { 0.7 }).map(|v| if n > 5 && v == -11.0 * 0.7 { f32::NEG_INFINITY } else { v }).collect();
            let scale: Vec<f32> = (0..n).map(|i| 0.5 + i as f32 * 0.01).collect();
            let bias: Vec<f32> = (0..n).map(|i| i as f32 * -0.02).collect();
            for log in [false, true] {
                let mut want = x.clone();
                let lse_want = softmax_row_impl(&mut want, log);
                let mut got = vec![f32::NAN; n];
                // SAFETY: x and got hold n values each.
                let lse = unsafe { super::avx512::softmax_row(x.as_ptr(), got.as_mut_ptr(), got.as_mut_ptr(), n, log, false) };
                close(lse as f32, lse_want as f32, "lse");
                let mut inplace = x.clone();
                // SAFETY: as above, one buffer.
                unsafe { super::avx512::softmax_row(inplace.as_mut_ptr(), inplace.as_mut_ptr(), inplace.as_mut_ptr(), n, log, false) };
                for i in 0..n {
                    if want[i].is_finite() {
                        close(got[i], want[i], &format!("softmax n {n} log {log} [{i}]"));
                    } else {
                        assert_eq!(got[i], want[i], "n {n} [{i}]");
                    }
                    assert_eq!(got[i].to_bits(), inplace[i].to_bits());
                }
                for shift in 0..16 {
                    let (mut out, mut tmp) = (vec![f32::NAN; n + 32], vec![0f32; n]);
                    // SAFETY: out holds shift + n values, tmp n.
                    let l = unsafe { super::avx512::softmax_row(x.as_ptr(), out.as_mut_ptr().add(shift), tmp.as_mut_ptr(), n, log, true) };
                    let (row, clean) = around(&out, shift, n);
                    assert!(clean && l.to_bits() == lse.to_bits(), "streamed softmax n {n} log {log} shift {shift}: wrote outside the row or lse {l} vs {lse}");
                    assert_eq!(
                        row.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "streamed softmax n {n} log {log} shift {shift}"
                    );
                }
            }
            let xf: Vec<f32> = x.iter().map(|&v| if v.is_finite() { v } else { 3.0 }).collect();
            for rms in [false, true] {
                let mut want = xf.clone();
                let (mw, iw) = norm_row_impl(&mut want, &scale, &bias, 1e-5, rms);
                let mut got = vec![f32::NAN; n];
                // SAFETY: xf and got hold n values each.
                let (m, i) = unsafe { super::avx512::norm_row(xf.as_ptr(), got.as_mut_ptr(), n, &scale, &bias, 1e-5, rms, false) };
                close(m as f32, mw as f32, "mean");
                close(i as f32, iw as f32, "inv");
                for k in 0..n {
                    close(got[k], want[k], &format!("norm n {n} rms {rms} [{k}]"));
                }
                for shift in 0..16 {
                    let mut out = vec![f32::NAN; n + 32];
                    // SAFETY: out holds shift + n values.
                    let (ms, is) = unsafe { super::avx512::norm_row(xf.as_ptr(), out.as_mut_ptr().add(shift), n, &scale, &bias, 1e-5, rms, true) };
                    let (row, clean) = around(&out, shift, n);
                    assert!(clean && (ms, is) == (m, i), "streamed norm n {n} rms {rms} shift {shift}: wrote outside the row or statistics differ");
                    assert_eq!(
                        row.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "streamed norm n {n} rms {rms} shift {shift}"
                    );
                }
            }
        }
    }

    /// Softmax and layernorm over an output past [`super::STREAM_BYTES`] (written with
    /// non-temporal stores where the machine has AVX-512), rows of 4100 values (their starts at
    /// every alignment of 16 bytes), against the portable row kernels row by row.
    #[test]
    fn streamed_outputs_match_the_row_kernels() {
        use super::super::tensor::{Dst, Src};
        let (rows, len) = (1030, 4100);
        assert!(super::streamed(rows * len));
        let x: Vec<f32> = (0..rows * len).map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.01).collect();
        let (scale, bias) = (vec![1.5f32; len], vec![-0.25f32; len]);
        let close = |a: f32, b: f32, what: &str| assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{what}: {a} vs {b}");
        let mut y = vec![f32::NAN; rows * len];
        let (xs, sc, bi) = (Src::dense(&x, &[rows, len]), Src::dense(&scale, &[1, len]), Src::dense(&bias, &[1, len]));
        super::norm(&xs, &Dst::dense(&mut y, &[rows, len], crate::DataType::F32), Some(&sc), Some(&bi), 1e-5, false, None, None);
        let mut z = vec![f32::NAN; rows * len];
        super::softmax(&xs, &Dst::dense(&mut z, &[rows, len], crate::DataType::F32), 1, false, None);
        for r in (0..rows).step_by(17).chain([rows - 1]) {
            let mut want = x[r * len..(r + 1) * len].to_vec();
            norm_row_impl(&mut want, &scale, &bias, 1e-5, false);
            for k in 0..len {
                close(y[r * len + k], want[k], &format!("layernorm row {r} [{k}]"));
            }
            let mut want = x[r * len..(r + 1) * len].to_vec();
            softmax_row_impl(&mut want, false);
            for k in 0..len {
                close(z[r * len + k], want[k], &format!("softmax row {r} [{k}]"));
            }
        }
        assert!(y.iter().chain(&z).all(|v| v.is_finite()), "a value left unwritten");
    }

    #[test]
    fn exp_f32_is_within_a_few_ulp_over_its_range_and_exact_at_the_edges() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let want = (x as f64).exp();
            let got = exp_f32(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 1e-6, "worst relative error {worst:e}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-100.0), 0.0);
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
    }
}
