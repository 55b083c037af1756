//! Where the fast CPU engine's kernels meet bytes: a [`Src`] reads a tensor (a user buffer of
//! f32, f16 or bf16 with any strides, or a dense f32 intermediate) as f32; a [`Dst`] writes one;
//! [`store_rows`] writes a finished f32 tile of a GEMM through the pointwise epilogue after it.

use super::epilogue::BoundEpilogue;
use crate::dtype::DataType;
use half::{bf16, f16};
use rayon::prelude::*;

/// A tensor read as f32: a base pointer, its storage type and its element strides per dim.
pub(crate) struct Src {
    ptr: *const u8,
    pub dtype: DataType,
    pub dims: Vec<usize>,
    pub strides: Vec<isize>,
    /// Keeps a converted copy alive while `ptr` points into it.
    _owned: Option<Vec<f32>>,
}

// SAFETY: a `Src` only reads through `ptr`, which points into a buffer the execution borrows
// for its whole duration (a variant-pack buffer, an intermediate it owns, or `_owned`); no
// thread writes that memory while a `Src` over it is in use (an op never reads its own output).
unsafe impl Send for Src {}
// SAFETY: as for `Send`: shared reads of memory nobody writes meanwhile.
unsafe impl Sync for Src {}

impl Src {
    /// A view of `bytes` holding a tensor of `dims` and element `strides` in `dtype` (f32, f16 or
    /// bf16). The caller checked that `bytes` holds every element the strides reach.
    pub fn bytes(bytes: &[u8], dtype: DataType, dims: &[usize], strides: &[isize]) -> Src {
        debug_assert!(matches!(dtype, DataType::F32 | DataType::F16 | DataType::Bf16));
        Src { ptr: bytes.as_ptr(), dtype, dims: dims.to_vec(), strides: strides.to_vec(), _owned: None }
    }

    /// A dense row-major f32 array (an intermediate), borrowed.
    pub fn dense(data: &[f32], dims: &[usize]) -> Src {
        Src { ptr: data.as_ptr() as *const u8, dtype: DataType::F32, dims: dims.to_vec(), strides: dense_strides(dims), _owned: None }
    }

    /// A dense row-major f32 array, owned by the view.
    pub fn owned(data: Vec<f32>, dims: &[usize]) -> Src {
        Src { ptr: data.as_ptr() as *const u8, dtype: DataType::F32, dims: dims.to_vec(), strides: dense_strides(dims), _owned: Some(data) }
    }

    /// Element `off` (in elements from the base) as f32.
    ///
    /// # Safety
    /// `off` must be the offset of an element of the tensor (a sum of index times stride).
    #[inline(always)]
    pub unsafe fn load(&self, off: isize) -> f32 {
        // SAFETY (all arms): the caller passes the offset of an element the view covers; the
        // reads are unaligned because user buffers carry no alignment promise.
        match self.dtype {
            DataType::F32 => unsafe { (self.ptr as *const f32).offset(off).read_unaligned() },
            DataType::F16 => f16::from_bits(unsafe { (self.ptr as *const u16).offset(off).read_unaligned() }).to_f32(),
            _ => bf16::from_bits(unsafe { (self.ptr as *const u16).offset(off).read_unaligned() }).to_f32(),
        }
    }

    /// The base pointer, for typed loads ([`Load`]).
    pub fn raw(&self) -> *const u8 {
        self.ptr
    }

    /// The base pointer as f32, when the storage is f32 and 4-byte aligned (what the GEMM reads
    /// directly).
    pub fn f32_ptr(&self) -> Option<*const f32> {
        (self.dtype == DataType::F32 && (self.ptr as usize) % std::mem::align_of::<f32>() == 0).then_some(self.ptr as *const f32)
    }

    /// Per dim of an output of `out_dims`, the stride this view steps by (0 where it
    /// broadcasts).
    pub fn broadcast_strides(&self, out_dims: &[usize]) -> Vec<isize> {
        let off = out_dims.len() - self.dims.len();
        (0..out_dims.len()).map(|d| if d < off || self.dims[d - off] == 1 { 0 } else { self.strides[d - off] }).collect()
    }

    /// The whole tensor as a new dense row-major f32 array (checked against the host memory
    /// limit, reserved fallibly).
    pub fn to_dense(&self) -> crate::error::Result<Vec<f32>> {
        let n: usize = self.dims.iter().product();
        let mut out = crate::layout::try_vec(n, || format!("a dense f32 copy of a tensor of dims {:?}", self.dims))?;
        out.resize(n, 0f32);
        self.fill_dense(&mut out);
        Ok(out)
    }

    /// Write the whole tensor into `out` (at least its element count long) as a dense
    /// row-major f32 array, in parallel over rows.
    pub fn fill_dense(&self, out: &mut [f32]) {
        let total: usize = self.dims.iter().product();
        let dims = &self.dims;
        let row = *dims.last().unwrap_or(&1);
        if row == 0 || total == 0 {
            return;
        }
        let last_stride = *self.strides.last().unwrap_or(&1);
        out[..total].par_chunks_mut(row).enumerate().for_each_init(
            || vec![0usize; dims.len()],
            |idx, (r, chunk)| {
                crate::layout::unravel(r * row, dims, idx);
                let base: isize = idx.iter().zip(&self.strides).map(|(&i, &s)| i as isize * s).sum();
                for (j, o) in chunk.iter_mut().enumerate() {
                    // SAFETY: base + j * last_stride is the offset of element (idx.., j).
                    *o = unsafe { self.load(base + j as isize * last_stride) };
                }
            },
        );
    }
}

/// A load of one storage type as f32, for loops monomorphized per type (no per-element match).
pub(crate) trait Load: Sync {
    /// Whether the storage is f32 (read as it is).
    const F32: bool = false;
    /// # Safety
    /// `ptr + off` (in elements of the type) must be an element of a live buffer.
    unsafe fn load(ptr: *const u8, off: isize) -> f32;
}

pub(crate) struct LoadF32;
pub(crate) struct LoadF16;
pub(crate) struct LoadBf16;

impl Load for LoadF32 {
    const F32: bool = true;
    #[inline(always)]
    unsafe fn load(ptr: *const u8, off: isize) -> f32 {
        // SAFETY: the caller passes an element's offset; unaligned, as user buffers may be.
        unsafe { (ptr as *const f32).offset(off).read_unaligned() }
    }
}

impl Load for LoadF16 {
    #[inline(always)]
    unsafe fn load(ptr: *const u8, off: isize) -> f32 {
        // SAFETY: as for LoadF32.
        f16::from_bits(unsafe { (ptr as *const u16).offset(off).read_unaligned() }).to_f32()
    }
}

impl Load for LoadBf16 {
    #[inline(always)]
    unsafe fn load(ptr: *const u8, off: isize) -> f32 {
        // SAFETY: as for LoadF32.
        bf16::from_bits(unsafe { (ptr as *const u16).offset(off).read_unaligned() }).to_f32()
    }
}

pub fn dense_strides(dims: &[usize]) -> Vec<isize> {
    crate::layout::dense_strides(dims).into_iter().map(|s| s as isize).collect()
}

/// A tensor written from f32: a user buffer (f32, f16, bf16, any non-overlapping strides) or a
/// dense f32 intermediate whose values are rounded to the tensor's own type (`round`).
pub(crate) struct Dst {
    ptr: *mut u8,
    /// The storage type.
    pub dtype: DataType,
    /// The type values are rounded to before they are stored (the tensor's type).
    pub round: DataType,
    pub dims: Vec<usize>,
    pub strides: Vec<isize>,
}

// SAFETY: a `Dst` writes through `ptr` into a buffer the execution holds mutably for its whole
// duration; the threads of one store write disjoint elements (the output's strides do not
// overlap: validation refuses overlapping strides, and the plan declines zero strides), and no
// `Src` reads that buffer meanwhile.
unsafe impl Send for Dst {}
// SAFETY: as for `Send`.
unsafe impl Sync for Dst {}

impl Dst {
    pub fn bytes(bytes: &mut [u8], dtype: DataType, dims: &[usize], strides: &[isize]) -> Dst {
        Dst { ptr: bytes.as_mut_ptr(), dtype, round: dtype, dims: dims.to_vec(), strides: strides.to_vec() }
    }

    pub fn dense(data: &mut [f32], dims: &[usize], round: DataType) -> Dst {
        Dst { ptr: data.as_mut_ptr() as *mut u8, dtype: DataType::F32, round, dims: dims.to_vec(), strides: dense_strides(dims) }
    }

    /// The base pointer as f32 when values can be written there as they are (f32 storage and
    /// rounding, 4-byte aligned).
    pub fn f32_ptr(&self) -> Option<*mut f32> {
        (self.dtype == DataType::F32 && self.round == DataType::F32 && (self.ptr as usize) % std::mem::align_of::<f32>() == 0).then_some(self.ptr as *mut f32)
    }

    /// Write `v` as element `off`.
    ///
    /// # Safety
    /// `off` must be the offset of an element of the tensor, written by no other thread now.
    #[inline(always)]
    pub unsafe fn store(&self, off: isize, v: f32) {
        let v = match self.round {
            DataType::F16 => f16::from_f32(v).to_f32(),
            DataType::Bf16 => bf16::from_f32(v).to_f32(),
            _ => v,
        };
        // SAFETY (all arms): the caller passes an element's offset that no other thread writes.
        match self.dtype {
            DataType::F32 => unsafe { (self.ptr as *mut f32).offset(off).write_unaligned(v) },
            DataType::F16 => unsafe { (self.ptr as *mut u16).offset(off).write_unaligned(f16::from_f32(v).to_bits()) },
            _ => unsafe { (self.ptr as *mut u16).offset(off).write_unaligned(bf16::from_f32(v).to_bits()) },
        }
    }
}

/// Write a finished f32 tile of `rows` rows of `ncols` values each into `dst` through the
/// epilogue `epi`. Row `r` lies at `tile[row(r, idx)..][..ncols]`, where `row` also sets `idx` to
/// the output multi-index of the row's first value; value `j` of the row is that index with
/// `col_dim` advanced by `j`. Rows are written in parallel.
pub(crate) fn store_rows(tile: &[f32], rows: usize, ncols: usize, col_dim: usize, row: impl Fn(usize, &mut [usize]) -> usize + Sync, dst: &Dst, epi: &BoundEpilogue) {
    let rank = dst.dims.len();
    let dst_col = dst.strides[col_dim];
    let chunk = (rows / (rayon::current_num_threads() * 8)).max(1);
    (0..rows).into_par_iter().with_min_len(chunk).for_each_init(
        || (vec![0usize; rank], Vec::new()),
        |(idx, bases), r| {
            let t0 = row(r, idx);
            let values = &tile[t0..t0 + ncols];
            let base: isize = idx.iter().zip(&dst.strides).map(|(&i, &s)| i as isize * s).sum();
            if epi.is_empty() {
                for (j, &v) in values.iter().enumerate() {
                    // SAFETY: (idx with col_dim + j) is an element of the output; rows are
                    // distinct output elements, each written by one thread.
                    unsafe { dst.store(base + j as isize * dst_col, v) };
                }
            } else {
                epi.row_bases(idx, bases);
                for (j, &v) in values.iter().enumerate() {
                    let v = epi.apply(v, bases, j, col_dim);
                    // SAFETY: as above.
                    unsafe { dst.store(base + j as isize * dst_col, v) };
                }
            }
        },
    );
}
