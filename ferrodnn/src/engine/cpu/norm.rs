//! Normalizations on the CPU.
//!
//! Every normalization is "statistics over groups of x's elements, then an affine map". A
//! group is the set of elements that share one index of the statistics' shape (x's dims with
//! the normalized axes set to 1), so one helper, [`Groups`], serves layernorm, rmsnorm,
//! instancenorm, adalayernorm and batchnorm alike; the same helper sums gradients back into
//! the shape of `scale` (the elements that share one scale value). Groupnorm's groups (an
//! image's `C / G` consecutive channels) are no such shape: [`channel_groups`] lists them.
//!
//! Sums run sequentially within a group, in row-major order, so results do not depend on how
//! rayon splits the work.

use super::NodeIo;
use crate::error::Result;
use crate::graph::ops::norm::*;
use crate::layout::{dense_strides, for_each_index, unravel, Nd};
use rayon::prelude::*;

/// The elements of x (row-major flat indices) partitioned by their index in a smaller shape
/// `target` of the same rank whose dims are each x's or 1.
struct Groups {
    /// The flat indices of x in each group, ascending; groups in row-major order of `target`.
    members: Vec<Vec<usize>>,
    /// The group of each element of x.
    owner: Vec<usize>,
}

/// `target` has x's rank and each dim equal to x's or 1.
fn check_fits(io: &NodeIo, what: &str, x_dims: &[usize], target: &[usize]) -> Result<()> {
    let fits = target.len() == x_dims.len() && target.iter().zip(x_dims).all(|(&t, &d)| t == 1 || t == d);
    if fits {
        Ok(())
    } else {
        Err(io.err(format!("{what} dims {target:?} do not broadcast to x {x_dims:?}")))
    }
}

fn groups(io: &NodeIo, what: &str, x_dims: &[usize], target: &[usize]) -> Result<Groups> {
    check_fits(io, what, x_dims, target)?;
    // Step of each axis in the target's flat index: 0 where the target broadcasts.
    let steps: Vec<usize> = target.iter().zip(dense_strides(target)).map(|(&t, s)| if t == 1 { 0 } else { s }).collect();
    let mut members = vec![Vec::new(); target.iter().product()];
    let mut owner = Vec::with_capacity(x_dims.iter().product());
    for_each_index(x_dims, |flat, idx| {
        let g: usize = idx.iter().zip(&steps).map(|(i, s)| i * s).sum();
        members[g].push(flat);
        owner.push(g);
    });
    Ok(Groups { members, owner })
}

/// Groupnorm's statistics groups of an x of dims `[N, C, ...]` (row-major): group `n * G + g`
/// holds the elements of image n in channels `g * C / G .. (g + 1) * C / G`.
fn channel_groups(io: &NodeIo, x_dims: &[usize], groups: i64) -> Result<Groups> {
    let (n, c) = match x_dims {
        [n, c, ..] => (*n, *c),
        _ => return Err(io.err(format!("x dims {x_dims:?} have no channel axis"))),
    };
    let g = usize::try_from(groups).ok().filter(|&g| g >= 1 && c % g == 0).ok_or_else(|| io.err(format!("{groups} groups do not divide the {c} channels of x {x_dims:?}")))?;
    let spatial: usize = x_dims[2..].iter().product();
    let per_group = c / g;
    let mut members = vec![Vec::with_capacity(per_group * spatial); n * g];
    let mut owner = Vec::with_capacity(n * c * spatial);
    for flat in 0..n * c * spatial {
        let ch = (flat / spatial.max(1)) % c;
        let grp = flat / (c * spatial).max(1) * g + ch / per_group;
        members[grp].push(flat);
        owner.push(grp);
    }
    Ok(Groups { members, owner })
}

/// The value of `nd` (broadcast) at every element of `dims`, row-major.
fn broadcast_full(io: &NodeIo, what: &str, nd: &Nd, dims: &[usize]) -> Result<Vec<f64>> {
    check_fits(io, what, dims, &nd.dims)?;
    let total: usize = dims.iter().product();
    Ok((0..total)
        .into_par_iter()
        .map_init(
            || vec![0usize; dims.len()],
            |idx, flat| {
                unravel(flat, dims, idx);
                nd.broadcast_at(idx)
            },
        )
        .collect())
}

/// Sum `values` (one per element of x) into the shape `target`.
fn reduce_to(io: &NodeIo, what: &str, values: &[f64], x_dims: &[usize], target: &[usize]) -> Result<Nd> {
    let g = groups(io, what, x_dims, target)?;
    let data = g.members.par_iter().map(|m| m.iter().map(|&i| values[i]).sum()).collect();
    Ok(Nd::new(target.to_vec(), data))
}

/// Mean and biased variance of the group's elements (two passes, for accuracy). Uncentered
/// (rmsnorm): mean 0 and the mean of squares.
fn moments(x: &[f64], members: &[usize], centered: bool) -> (f64, f64) {
    if members.is_empty() {
        return (0.0, 0.0);
    }
    let n = members.len() as f64;
    let mean = if centered { members.iter().map(|&i| x[i]).sum::<f64>() / n } else { 0.0 };
    let var = members.iter().map(|&i| (x[i] - mean) * (x[i] - mean)).sum::<f64>() / n;
    (mean, var)
}

/// Forward of layernorm, rmsnorm (`rms`), instancenorm, adalayernorm.
fn norm_forward(io: &mut NodeIo, attrs: &NormAttrs, axes: NormAxes, rms: bool) -> Result<()> {
    let dims = io.input("x")?.dims.clone();
    let sdims = axes.stats_dims(&dims);
    let g = groups(io, "statistics", &dims, &sdims)?;
    grouped_forward(io, attrs.epsilon, &g, sdims, rms)
}

/// The forward norms given the statistics groups `g` of x and the statistics' dims.
fn grouped_forward(io: &mut NodeIo, epsilon: f64, g: &Groups, sdims: Vec<usize>, rms: bool) -> Result<()> {
    let x = io.input("x")?;
    let dims = x.dims.clone();
    let eps = io.attribute("epsilon", epsilon);
    // (mean, inv_variance) per group.
    let stats: Vec<(f64, f64)> = g
        .members
        .par_iter()
        .map(|m| {
            let (mean, var) = moments(&x.data, m, !rms);
            (mean, 1.0 / (var + eps).sqrt())
        })
        .collect();
    let scale = broadcast_full(io, "scale", io.input("scale")?, &dims)?;
    let bias = match io.opt_input("bias") {
        Some(b) => Some(broadcast_full(io, "bias", b, &dims)?),
        None => None,
    };
    let y: Vec<f64> = (0..x.len())
        .into_par_iter()
        .map(|i| {
            let (mean, inv) = stats[g.owner[i]];
            (x.data[i] - mean) * inv * scale[i] + bias.as_ref().map_or(0.0, |b| b[i])
        })
        .collect();
    io.set("y", Nd::new(dims, y));
    if !rms {
        io.set("mean", Nd::new(sdims.clone(), stats.iter().map(|s| s.0).collect()));
    }
    io.set("inv_variance", Nd::new(sdims, stats.iter().map(|s| s.1).collect()));
    Ok(())
}

/// Backward of layernorm, rmsnorm (`rms`: no mean), instancenorm, adalayernorm, batchnorm.
///
/// With `xhat = (x - mean) * inv` and `g = dy * scale`, for the elements of one statistics
/// group (n of them): `dx = inv * (g - mean(g) - xhat * mean(g * xhat))`; rmsnorm drops the
/// `mean(g)` term (its statistic does not depend on a shift). `dscale = sum(dy * xhat)` and
/// `dbias = sum(dy)` over the elements that share each scale value.
fn norm_backward(io: &mut NodeIo, axes: NormAxes, rms: bool) -> Result<()> {
    let dims = io.input("x")?.dims.clone();
    let sdims = axes.stats_dims(&dims);
    let g = groups(io, "statistics", &dims, &sdims)?;
    grouped_backward(io, &g, &sdims, rms)
}

/// The backward norms given the statistics groups `g` of x and the statistics' dims.
fn grouped_backward(io: &mut NodeIo, g: &Groups, sdims: &[usize], rms: bool) -> Result<()> {
    let x = io.input("x")?;
    let dy = io.input("dy")?;
    let dims = x.dims.clone();
    if dy.dims != dims {
        return Err(io.err(format!("dy dims {:?} differ from x dims {dims:?}", dy.dims)));
    }
    let inv = io.input("inv_variance")?;
    let mean = if rms { None } else { Some(io.input("mean")?) };
    for (what, s) in [("inv_variance", Some(inv)), ("mean", mean)] {
        if let Some(s) = s {
            if s.dims != sdims {
                return Err(io.err(format!("{what} dims {:?} differ from the statistics dims {sdims:?}", s.dims)));
            }
        }
    }
    let scale_nd = io.input("scale")?;
    let scale = broadcast_full(io, "scale", scale_nd, &dims)?;
    let stat = |i: usize| -> (f64, f64) {
        let grp = g.owner[i];
        (mean.map_or(0.0, |m| m.data[grp]), inv.data[grp])
    };
    let xhat: Vec<f64> = (0..x.len())
        .into_par_iter()
        .map(|i| {
            let (m, r) = stat(i);
            (x.data[i] - m) * r
        })
        .collect();
    // Per group: (mean(g), mean(g * xhat)).
    let coef: Vec<(f64, f64)> = g
        .members
        .par_iter()
        .map(|mem| {
            let n = mem.len().max(1) as f64;
            let mut sg = 0.0;
            let mut sgx = 0.0;
            for &i in mem {
                let gi = dy.data[i] * scale[i];
                sg += gi;
                sgx += gi * xhat[i];
            }
            (if rms { 0.0 } else { sg / n }, sgx / n)
        })
        .collect();
    let dx: Vec<f64> = (0..x.len())
        .into_par_iter()
        .map(|i| {
            let (_, r) = stat(i);
            let (mg, mgx) = coef[g.owner[i]];
            r * (dy.data[i] * scale[i] - mg - xhat[i] * mgx)
        })
        .collect();
    let dy_xhat: Vec<f64> = dy.data.par_iter().zip(&xhat).map(|(d, h)| d * h).collect();
    let scale_dims = scale_nd.dims.clone();
    let dscale = reduce_to(io, "scale", &dy_xhat, &dims, &scale_dims)?;
    let dbias = if io.has_output("dbias") { Some(reduce_to(io, "scale", &dy.data, &dims, &scale_dims)?) } else { None };
    io.set("dx", Nd::new(dims, dx));
    io.set("dscale", dscale);
    if let Some(db) = dbias {
        io.set("dbias", db);
    }
    Ok(())
}

/// Per-channel values of a `[1, C, 1, ...]` or `[2, C, 1, ...]` tensor, row `row`.
fn channel_row<'a>(io: &NodeIo, what: &str, nd: &'a Nd, row: usize, channels: usize) -> Result<&'a [f64]> {
    nd.data.get(row * channels..(row + 1) * channels).ok_or_else(|| io.err(format!("{what} dims {:?} do not hold row {row} of {channels} channels", nd.dims)))
}

pub(crate) fn batchnorm(io: &mut NodeIo, a: &BatchnormAttrs) -> Result<()> {
    let x = io.input("x")?;
    let dims = x.dims.clone();
    let axes = NormAxes::Batch;
    let sdims = axes.stats_dims(&dims);
    let channels = dims.get(1).copied().ok_or_else(|| io.err("x needs a channel axis"))?;
    let g = groups(io, "statistics", &dims, &sdims)?;
    let n_local = g.members.first().map_or(0, |m| m.len()) as f64;

    // Local (mean, M2 = sum of squared deviations) per channel.
    let local: Vec<(f64, f64)> = g
        .members
        .par_iter()
        .map(|m| {
            let (mean, var) = moments(&x.data, m, true);
            (mean, var * m.len() as f64)
        })
        .collect();
    // Each peer's (mean, M2) per channel from its (sum, sum of squares) over n_local elements.
    let peers = peer_ports(io.node).map_err(|m| io.err(m))?;
    let mut parts: Vec<Vec<(f64, f64)>> = vec![local];
    for (i, _) in &peers {
        let port = format!("{PEER_STATS_PREFIX}{i}");
        let p = io.input(&port)?;
        let sums = channel_row(io, &port, p, 0, channels)?;
        let squares = channel_row(io, &port, p, 1, channels)?;
        parts.push(sums.iter().zip(squares).map(|(&s, &q)| (s / n_local, q - s * s / n_local)).collect());
    }
    // Combine equal-count parts (Chan et al.): M2 = sum(M2_k + n * (mean_k - mean)^2).
    let total = n_local * parts.len() as f64;
    let mut mean = vec![0.0; channels];
    let mut var = vec![0.0; channels];
    for c in 0..channels {
        let m = parts.iter().map(|p| p[c].0).sum::<f64>() / parts.len() as f64;
        let m2: f64 = parts.iter().map(|p| p[c].1 + n_local * (p[c].0 - m) * (p[c].0 - m)).sum();
        mean[c] = m;
        // The peers' sum-of-squares form may round a zero variance slightly negative.
        var[c] = (m2 / total).max(0.0);
    }
    let eps = io.attribute("epsilon", a.epsilon);
    let inv: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();

    let scale = broadcast_full(io, "scale", io.input("scale")?, &dims)?;
    let bias = broadcast_full(io, "bias", io.input("bias")?, &dims)?;
    let y: Vec<f64> = (0..x.len())
        .into_par_iter()
        .map(|i| {
            let c = g.owner[i];
            (x.data[i] - mean[c]) * inv[c] * scale[i] + bias[i]
        })
        .collect();

    let running = match (io.opt_input("in_running_mean"), io.opt_input("in_running_var")) {
        (Some(rm), Some(rv)) => {
            if total < 2.0 {
                return Err(io.err(format!("updating the running variance needs at least 2 values per channel, got {total}")));
            }
            let rm = channel_row(io, "in_running_mean", rm, 0, channels)?;
            let rv = channel_row(io, "in_running_var", rv, 0, channels)?;
            let mo = io.attribute("momentum", a.momentum);
            // PyTorch's update: the running variance tracks the unbiased estimate.
            let unbias = total / (total - 1.0);
            let new_mean: Vec<f64> = (0..channels).map(|c| (1.0 - mo) * rm[c] + mo * mean[c]).collect();
            let new_var: Vec<f64> = (0..channels).map(|c| (1.0 - mo) * rv[c] + mo * var[c] * unbias).collect();
            Some((new_mean, new_var))
        }
        (None, None) => None,
        _ => return Err(io.err("give both in_running_mean and in_running_var or neither")),
    };

    io.set("y", Nd::new(dims, y));
    io.set("mean", Nd::new(sdims.clone(), mean));
    io.set("inv_variance", Nd::new(sdims.clone(), inv));
    if let Some((m, v)) = running {
        io.set("out_running_mean", Nd::new(sdims.clone(), m));
        io.set("out_running_var", Nd::new(sdims, v));
    }
    Ok(())
}

pub(crate) fn batchnorm_inference(io: &mut NodeIo, _a: &NormAttrs) -> Result<()> {
    let x = io.input("x")?;
    let dims = x.dims.clone();
    let full = |port: &str| -> Result<Vec<f64>> { broadcast_full(io, port, io.input(port)?, &dims) };
    let (scale, bias, mean, inv) = (full("scale")?, full("bias")?, full("mean")?, full("inv_variance")?);
    let y = (0..x.len()).into_par_iter().map(|i| (x.data[i] - mean[i]) * inv[i] * scale[i] + bias[i]).collect();
    io.set("y", Nd::new(dims, y));
    Ok(())
}

pub(crate) fn batchnorm_backward(io: &mut NodeIo, _a: &NormAttrs) -> Result<()> {
    norm_backward(io, NormAxes::Batch, false)
}

pub(crate) fn genstats(io: &mut NodeIo, _a: &NormAttrs) -> Result<()> {
    let x = io.input("x")?;
    let dims = x.dims.clone();
    let sdims = NormAxes::Batch.stats_dims(&dims);
    let g = groups(io, "statistics", &dims, &sdims)?;
    let sums: Vec<(f64, f64)> = g.members.par_iter().map(|m| m.iter().fold((0.0, 0.0), |(s, q), &i| (s + x.data[i], q + x.data[i] * x.data[i]))).collect();
    io.set("sum", Nd::new(sdims.clone(), sums.iter().map(|s| s.0).collect()));
    io.set("sq_sum", Nd::new(sdims, sums.iter().map(|s| s.1).collect()));
    Ok(())
}

/// The values of input `port`, which must have dims `dims`.
fn same_dims_values<'a>(io: &'a NodeIo, port: &str, dims: &[usize]) -> Result<&'a [f64]> {
    let nd = io.input(port)?;
    if nd.dims != dims {
        return Err(io.err(format!("{port} dims {:?} differ from sum dims {dims:?}", nd.dims)));
    }
    Ok(&nd.data)
}

pub(crate) fn bn_finalize(io: &mut NodeIo, a: &BnFinalizeAttrs) -> Result<()> {
    let sum = io.input("sum")?;
    let dims = sum.dims.clone();
    let c = sum.len();
    let vals = |port: &str| same_dims_values(io, port, &dims);
    let (s, q, scale, bias) = (vals("sum")?, vals("sq_sum")?, vals("scale")?, vals("bias")?);
    let count = a.accum_count as f64;
    if count < 1.0 {
        return Err(io.err(format!("accum_count must be at least 1, got {}", a.accum_count)));
    }
    let mean: Vec<f64> = (0..c).map(|i| s[i] / count).collect();
    // E[x^2] - E[x]^2 can round slightly below zero for a constant channel.
    let var: Vec<f64> = (0..c).map(|i| (q[i] / count - mean[i] * mean[i]).max(0.0)).collect();
    let eps = io.attribute("epsilon", a.epsilon);
    let inv: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
    let eq_scale: Vec<f64> = (0..c).map(|i| scale[i] * inv[i]).collect();
    let eq_bias: Vec<f64> = (0..c).map(|i| bias[i] - mean[i] * eq_scale[i]).collect();
    let running = match (io.opt_input("prev_running_mean"), io.opt_input("prev_running_var")) {
        (Some(_), Some(_)) => {
            if count < 2.0 {
                return Err(io.err(format!("updating the running variance needs accum_count of at least 2, got {}", a.accum_count)));
            }
            let (rm, rv) = (vals("prev_running_mean")?, vals("prev_running_var")?);
            let mo = io.attribute("momentum", a.momentum);
            let unbias = count / (count - 1.0);
            let m: Vec<f64> = (0..c).map(|i| (1.0 - mo) * rm[i] + mo * mean[i]).collect();
            let v: Vec<f64> = (0..c).map(|i| (1.0 - mo) * rv[i] + mo * var[i] * unbias).collect();
            Some((m, v))
        }
        (None, None) => None,
        _ => return Err(io.err("give both prev_running_mean and prev_running_var or neither")),
    };
    io.set("eq_scale", Nd::new(dims.clone(), eq_scale));
    io.set("eq_bias", Nd::new(dims.clone(), eq_bias));
    io.set("saved_mean", Nd::new(dims.clone(), mean));
    io.set("saved_inv_std", Nd::new(dims.clone(), inv));
    if let Some((m, v)) = running {
        io.set("next_running_mean", Nd::new(dims.clone(), m));
        io.set("next_running_var", Nd::new(dims, v));
    }
    Ok(())
}

pub(crate) fn layernorm(io: &mut NodeIo, a: &NormAttrs) -> Result<()> {
    norm_forward(io, a, NormAxes::Layer, false)
}
pub(crate) fn layernorm_backward(io: &mut NodeIo, _a: &NormAttrs) -> Result<()> {
    norm_backward(io, NormAxes::Layer, false)
}
pub(crate) fn rmsnorm(io: &mut NodeIo, a: &NormAttrs) -> Result<()> {
    norm_forward(io, a, NormAxes::Layer, true)
}
pub(crate) fn rmsnorm_backward(io: &mut NodeIo, _a: &NormAttrs) -> Result<()> {
    norm_backward(io, NormAxes::Layer, true)
}
pub(crate) fn instancenorm(io: &mut NodeIo, a: &NormAttrs) -> Result<()> {
    norm_forward(io, a, NormAxes::Instance, false)
}
pub(crate) fn instancenorm_backward(io: &mut NodeIo, _a: &NormAttrs) -> Result<()> {
    norm_backward(io, NormAxes::Instance, false)
}
/// Groupnorm's statistics dims `[N, G, 1, ...]` for x dims `dims`.
fn group_stats_dims(dims: &[usize], groups: i64) -> Vec<usize> {
    dims.iter()
        .enumerate()
        .map(|(a, &d)| {
            if a == 0 {
                d
            } else if a == 1 {
                groups.max(1) as usize
            } else {
                1
            }
        })
        .collect()
}

pub(crate) fn groupnorm(io: &mut NodeIo, a: &GroupnormAttrs) -> Result<()> {
    let dims = io.input("x")?.dims.clone();
    let g = channel_groups(io, &dims, a.groups)?;
    grouped_forward(io, a.epsilon, &g, group_stats_dims(&dims, a.groups), false)
}
pub(crate) fn groupnorm_backward(io: &mut NodeIo, a: &GroupnormAttrs) -> Result<()> {
    let dims = io.input("x")?.dims.clone();
    let g = channel_groups(io, &dims, a.groups)?;
    grouped_backward(io, &g, &group_stats_dims(&dims, a.groups), false)
}
pub(crate) fn adalayernorm(io: &mut NodeIo, a: &NormAttrs) -> Result<()> {
    norm_forward(io, a, NormAxes::AdaLayer, false)
}
pub(crate) fn adalayernorm_backward(io: &mut NodeIo, _a: &NormAttrs) -> Result<()> {
    norm_backward(io, NormAxes::AdaLayer, false)
}
