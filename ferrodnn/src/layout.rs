//! Moving tensors between strided buffers and dense row-major arrays of `f64` (`Nd`).
//!
//! Engines' host-side code, the test helpers and the CLI share this: it is where a stride
//! meets a byte. It also holds the host memory limit ([`host_memory_limit`],
//! `FERRODNN_MAX_HOST_BYTES`) that every allocation whose size a graph decides is checked
//! against ([`check_host_bytes`], [`try_vec`], [`try_gather`]), so that a huge tensor is an
//! error, never an abort.

use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::graph::TensorDesc;

/// A dense row-major array of `f64`: the form the CPU engine computes on and the form tests
/// compare.
#[derive(Clone, Debug, PartialEq)]
pub struct Nd {
    pub dims: Vec<usize>,
    pub data: Vec<f64>,
}

impl Nd {
    pub fn new(dims: Vec<usize>, data: Vec<f64>) -> Nd {
        debug_assert_eq!(dims.iter().product::<usize>(), data.len());
        Nd { dims, data }
    }

    pub fn zeros(dims: &[usize]) -> Nd {
        Nd { dims: dims.to_vec(), data: vec![0.0; dims.iter().product()] }
    }

    pub fn filled(dims: &[usize], v: f64) -> Nd {
        Nd { dims: dims.to_vec(), data: vec![v; dims.iter().product()] }
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Row-major strides of the dense array.
    pub fn strides(&self) -> Vec<usize> {
        dense_strides(&self.dims)
    }

    /// Flat offset of a multi-index.
    pub fn offset(&self, index: &[usize]) -> usize {
        index.iter().zip(self.strides()).map(|(i, s)| i * s).sum()
    }

    pub fn at(&self, index: &[usize]) -> f64 {
        self.data[self.offset(index)]
    }

    /// The value at `index` of a shape this array broadcasts to (numpy rules: align right,
    /// size-1 axes repeat).
    pub fn broadcast_at(&self, index: &[usize]) -> f64 {
        let off = index.len() - self.dims.len();
        let mut flat = 0;
        let mut stride = 1;
        for a in (0..self.dims.len()).rev() {
            let i = if self.dims[a] == 1 { 0 } else { index[off + a] };
            flat += i * stride;
            stride *= self.dims[a];
        }
        self.data[flat]
    }
}

pub fn dense_strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// Calls `f(flat, multi_index)` for each index of `dims` in row-major order.
pub fn for_each_index(dims: &[usize], mut f: impl FnMut(usize, &[usize])) {
    let total: usize = dims.iter().product();
    if total == 0 {
        return;
    }
    let mut idx = vec![0usize; dims.len()];
    for flat in 0..total {
        f(flat, &idx);
        for a in (0..dims.len()).rev() {
            idx[a] += 1;
            if idx[a] < dims[a] {
                break;
            }
            idx[a] = 0;
        }
    }
}

/// Multi-index of a row-major flat offset.
pub fn unravel(mut flat: usize, dims: &[usize], out: &mut [usize]) {
    for a in (0..dims.len()).rev() {
        out[a] = flat % dims[a];
        flat /= dims[a];
    }
}

/// Element offset in a strided buffer of each logical element, in row-major order.
pub fn strided_offsets(desc: &TensorDesc) -> Vec<usize> {
    let mut out = Vec::with_capacity(dense_len(desc));
    for_each_offset(desc, |o| out.push(o));
    out
}

/// The number of logical elements of `desc` as `usize` (saturating: validation caps it).
fn dense_len(desc: &TensorDesc) -> usize {
    desc.dims.iter().fold(1usize, |acc, &d| acc.saturating_mul(d.max(0) as usize))
}

/// Calls `f(offset)` with the element offset of each logical element of `desc` in a strided
/// buffer, in row-major order (no list of offsets is built).
fn for_each_offset(desc: &TensorDesc, mut f: impl FnMut(usize)) {
    let dims: Vec<usize> = desc.dims.iter().map(|&d| d.max(0) as usize).collect();
    for_each_index(&dims, |_, idx| f(idx.iter().zip(&desc.strides).map(|(&i, &s)| i * s as usize).sum()));
}

/// Bytes a buffer must hold for `desc` (its extent times its element size; saturating, so a
/// size past `usize` is refused by [`check_host_bytes`] rather than wrapping).
pub fn required_bytes(desc: &TensorDesc, dtype: DataType) -> usize {
    (desc.extent_elements().unwrap_or(0).max(0) as u64).try_into().unwrap_or(usize::MAX).saturating_mul(dtype.size())
}

/// Read a strided buffer of `dtype` into a dense array. The caller checked the buffer is at
/// least `required_bytes` long. Aborts if the dense array cannot be allocated: for sizes a user
/// chose, use [`try_gather`].
pub fn gather(desc: &TensorDesc, dtype: DataType, bytes: &[u8]) -> Nd {
    let mut data = Vec::with_capacity(dense_len(desc));
    for_each_offset(desc, |o| data.push(dtype.read(bytes, o)));
    Nd::new(desc.dims.iter().map(|&d| d as usize).collect(), data)
}

/// [`gather`] whose allocation fails with an error (naming the tensor) instead of aborting:
/// checked against [`host_memory_limit`] first, then reserved with `try_reserve_exact`.
pub fn try_gather(desc: &TensorDesc, dtype: DataType, bytes: &[u8]) -> Result<Nd> {
    let n = dense_len(desc);
    let mut data = try_vec::<f64>(n, || format!("tensor \"{}\" (dims {:?}) read as f64", desc.name, desc.dims))?;
    for_each_offset(desc, |o| data.push(dtype.read(bytes, o)));
    Ok(Nd::new(desc.dims.iter().map(|&d| d as usize).collect(), data))
}

/// A ragged (packed) rank-4 tensor's layout (`TensorDesc::ragged_offset`): batch `b` starts at
/// element `starts[b]` of the buffer (in place of `b * strides[0]`) and holds only the rows
/// (dim 2) below `lens[b]`.
pub struct Ragged {
    starts: Vec<i64>,
    lens: Vec<i64>,
}

impl Ragged {
    /// From the offsets and the lengths as read (values, row-major).
    pub fn new(starts: &[f64], lens: &[f64]) -> Ragged {
        Ragged { starts: starts.iter().map(|&x| x as i64).collect(), lens: lens.iter().map(|&x| x as i64).collect() }
    }

    /// `f(dense index, buffer offset)` for every element of the rows of `desc` that exist,
    /// after checking that they lie in a buffer of `elements` elements.
    pub fn each(&self, desc: &TensorDesc, elements: usize, mut f: impl FnMut(usize, usize)) -> std::result::Result<(), String> {
        let b = desc.dims.first().copied().unwrap_or(0).max(0) as usize;
        if desc.dims.len() != 4 || desc.strides.len() != 4 || self.starts.len() < b || self.lens.len() < b {
            return Err(format!("dims {:?} need rank 4 with b + 1 offsets and b lengths, got {} and {}", desc.dims, self.starts.len(), self.lens.len()));
        }
        let d: Vec<usize> = desc.dims.iter().map(|&x| x.max(0) as usize).collect();
        let st = &desc.strides;
        for bi in 0..b {
            let rows = self.lens[bi].clamp(0, d[2] as i64) as usize;
            if rows == 0 || d[1] == 0 || d[3] == 0 {
                continue;
            }
            let start = self.starts[bi];
            let (mut lo, mut hi) = (start, start);
            for (a, n) in [(1, d[1]), (2, rows), (3, d[3])] {
                let reach = (n as i64 - 1).saturating_mul(st[a]);
                if reach < 0 {
                    lo = lo.saturating_add(reach);
                } else {
                    hi = hi.saturating_add(reach);
                }
            }
            if lo < 0 || hi >= elements as i64 {
                return Err(format!(
                    "batch {bi}'s {rows} rows start at element {start} and reach elements {lo}..={hi}, outside its buffer of {elements} elements (check the offsets)"
                ));
            }
            for h in 0..d[1] {
                for i in 0..rows {
                    for c in 0..d[3] {
                        let dense = ((bi * d[1] + h) * d[2] + i) * d[3] + c;
                        let off = start + h as i64 * st[1] + i as i64 * st[2] + c as i64 * st[3];
                        f(dense, off as usize);
                    }
                }
            }
        }
        Ok(())
    }

    /// The tensor as a dense array: the rows that exist, zeros elsewhere.
    pub fn gather(&self, desc: &TensorDesc, dtype: DataType, bytes: &[u8]) -> std::result::Result<Nd, String> {
        let dims: Vec<usize> = desc.dims.iter().map(|&x| x.max(0) as usize).collect();
        let mut nd = Nd::zeros(&dims);
        self.each(desc, bytes.len() / dtype.size(), |i, o| nd.data[i] = dtype.read(bytes, o))?;
        Ok(nd)
    }

    /// Write the rows that exist, rounding each value to the type (nothing else of the buffer).
    pub fn scatter(&self, desc: &TensorDesc, dtype: DataType, nd: &Nd, bytes: &mut [u8]) -> std::result::Result<(), String> {
        let n = bytes.len() / dtype.size();
        self.each(desc, n, |i, o| dtype.write(bytes, o, nd.data[i]))
    }
}

/// Write a dense array into a strided buffer of `dtype`, rounding each value to the type.
pub fn scatter(desc: &TensorDesc, dtype: DataType, nd: &Nd, bytes: &mut [u8]) {
    let mut values = nd.data.iter();
    for_each_offset(desc, |o| {
        if let Some(&v) = values.next() {
            dtype.write(bytes, o, v);
        }
    });
}

/// The environment variable that sets [`host_memory_limit`]: a number of bytes, optionally with a
/// binary suffix (`K`, `M`, `G`, `T`, with or without `iB`/`B`), e.g. `FERRODNN_MAX_HOST_BYTES=64G`.
pub const MAX_HOST_BYTES_ENV: &str = "FERRODNN_MAX_HOST_BYTES";

/// The limit assumed when the machine's memory cannot be read (not Linux): 16 GiB.
pub const FALLBACK_HOST_BYTES: u64 = 16 << 30;

/// The most host memory ferrodnn's host-side code may allocate for data whose size a graph
/// decides: the CPU engine's dense arrays (its plan build refuses a graph whose estimate is
/// larger), and the dense inputs and buffers of [`crate::testing`]'s helpers and the CLI. Set by
/// `FERRODNN_MAX_HOST_BYTES`; by default the machine's physical memory (`MemTotal` of
/// `/proc/meminfo`, or the cgroup's memory limit when that is lower), else 16 GiB. An
/// unreadable value of the variable is an error naming it.
pub fn host_memory_limit() -> Result<u64> {
    if let Ok(v) = std::env::var(MAX_HOST_BYTES_ENV) {
        return parse_byte_size(&v).ok_or_else(|| Error::InvalidArgument(format!("{MAX_HOST_BYTES_ENV}={v:?} is not a size in bytes (e.g. 17179869184, 16G or 512MiB)")));
    }
    Ok(machine_memory().unwrap_or(FALLBACK_HOST_BYTES))
}

/// Physical memory of this machine (or of its cgroup, when lower), read once.
fn machine_memory() -> Option<u64> {
    static MEMORY: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *MEMORY.get_or_init(|| {
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let kb: u64 = meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
        let total = kb.checked_mul(1024)?;
        // cgroup v2, then v1 (whose "no limit" is a number near 2^63).
        let cgroup = ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
            .iter()
            .find_map(|p| std::fs::read_to_string(p).ok().and_then(|s| s.trim().parse::<u64>().ok()));
        Some(cgroup.map_or(total, |c| c.min(total)))
    })
}

/// A size in bytes: digits (or a decimal number) and an optional binary suffix (`K`, `M`, `G`,
/// `T`, `P`, each optionally followed by `B` or `iB`, any case). `None` when unreadable.
pub fn parse_byte_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit.trim_end_matches('b').trim_end_matches('i');
    let shift = match unit {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        "p" => 50,
        _ => return None,
    };
    if num.is_empty() {
        return None;
    }
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(1u64 << shift);
    }
    let x: f64 = num.parse().ok()?;
    let bytes = x * (1u64 << shift) as f64;
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

/// A byte count for messages: `8.0 TiB (8796093022208 bytes)`.
pub fn format_bytes(bytes: u128) -> String {
    let units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{v:.1} {} ({bytes} bytes)", units[u])
    }
}

/// Refuse `bytes` of host memory for `what` when it exceeds [`host_memory_limit`]: the error
/// (`Error::NotSupported`) names what needed it, how many bytes, and the limit with the way to
/// change it.
pub fn check_host_bytes(bytes: u128, what: impl FnOnce() -> String) -> Result<()> {
    let limit = host_memory_limit()?;
    if bytes > limit as u128 {
        return Err(Error::NotSupported(format!(
            "{} needs {} of host memory, more than the limit of {} (set {MAX_HOST_BYTES_ENV} to change it)",
            what(),
            format_bytes(bytes),
            format_bytes(limit as u128)
        )));
    }
    Ok(())
}

/// An empty vector with room for `n` elements, for `what`: checked against
/// [`host_memory_limit`], then reserved with `try_reserve_exact`, so that no size leads to an
/// abort.
pub fn try_vec<T>(n: usize, what: impl Fn() -> String) -> Result<Vec<T>> {
    let bytes = (n as u128) * (std::mem::size_of::<T>() as u128);
    check_host_bytes(bytes, &what)?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|e| Error::NotSupported(format!("{} needs {} of host memory, which could not be allocated: {e}", what(), format_bytes(bytes))))?;
    Ok(v)
}

/// `n` copies of `value`, allocated as [`try_vec`] does.
pub fn try_vec_filled<T: Clone>(n: usize, value: T, what: impl Fn() -> String) -> Result<Vec<T>> {
    let mut v = try_vec(n, what)?;
    v.resize(n, value);
    Ok(v)
}
