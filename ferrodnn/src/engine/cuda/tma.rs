//! TMA (Hopper's tensor memory accelerator) descriptors: a kernel that loads tiles with
//! `cp.async.bulk.tensor` takes a 128-byte `CUtensorMap` by value (`const __grid_constant__`).
//! The map holds the tensor's global address, so it is encoded when the plan executes, from the
//! pointer in the variant pack: `cuTensorMapEncodeTiled` is a pure host function (no device
//! work, no allocation), about a microsecond.
//!
//! Kernels declare the parameter with their own type of the same size and alignment:
//! `struct alignas(64) TmaMap { unsigned long long opaque[16]; };` (in `kernel/hopper.cuh`).

use super::runtime::{check, driver};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::graph::TensorId;
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::OnceLock;

/// How to encode one tiled tensor map over a tensor of the graph.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TmaDesc {
    /// The tensor whose device pointer is the map's global address.
    pub tensor: TensorId,
    /// Element type as TMA sees it (fp8 and 1-byte integers are moved as u8).
    pub dtype: DataType,
    /// Extents, innermost (contiguous) dim first; 1 to 5 dims.
    pub dims: Vec<u64>,
    /// Byte strides of dims 1.. (the innermost dim is contiguous); each a multiple of 16.
    pub strides: Vec<u64>,
    /// The box (tile) a copy moves, innermost first; each at most 256.
    pub boxes: Vec<u32>,
    /// Shared-memory swizzle span in bytes: 0 (none), 32, 64 or 128.
    pub swizzle: u32,
    /// An im2col map instead of a tiled one ([`Im2col`]; `boxes` is then unused).
    pub im2col: Option<Im2col>,
}

/// The im2col mode of a map over a channels-last image (`dims` `[C, W, (H, (D,)) N]`): a load
/// brings `channels` channels of `pixels` consecutive pixels of a convolution's output grid,
/// walking the image from the coordinates it is given (the first output pixel's window corner)
/// with the convolution's strides through the bounding box `[lower, extent - 1 + upper]` of each
/// spatial dim, moving on to the next row and image at its edge, each pixel shifted by the
/// load's offsets (the filter tap); outside the image, zeros. (`cuTensorMapEncodeIm2col`.)
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Im2col {
    /// The bounding box's corners per spatial dim, innermost first: `-pre_padding` and
    /// `post_padding - dilation * (taps - 1)`.
    pub lower: Vec<i32>,
    pub upper: Vec<i32>,
    pub channels: u32,
    pub pixels: u32,
    /// Traversal strides of every dim, innermost first: 1 for channels and images, the
    /// convolution's strides for the spatial dims.
    pub element_strides: Vec<u32>,
}

impl TmaDesc {
    /// Checks what can be checked before a pointer is known; `Err` says why this tensor cannot
    /// be loaded with TMA (the caller then uses another kernel).
    pub fn check(&self) -> std::result::Result<(), String> {
        let rank = self.dims.len();
        if let Some(ic) = &self.im2col {
            let spatial = rank.saturating_sub(2);
            if !(3..=5).contains(&rank) || ic.lower.len() != spatial || ic.upper.len() != spatial || ic.element_strides.len() != rank {
                return Err(format!("im2col over rank {rank} with corners {:?} {:?} and strides {:?}", ic.lower, ic.upper, ic.element_strides));
            }
            let bytes = ic.channels as usize * self.dtype.size();
            if ic.channels == 0 || ic.channels > 256 || bytes % 16 != 0 || (self.swizzle != 0 && bytes > self.swizzle as usize) {
                return Err(format!("im2col loads of {} channels ({bytes} bytes a pixel)", ic.channels));
            }
            if ic.pixels == 0 || ic.pixels > 1024 || ic.element_strides.iter().any(|&e| e == 0 || e > 8) {
                return Err(format!("im2col loads of {} pixels with traversal strides {:?}", ic.pixels, ic.element_strides));
            }
            // (The corners are 16-bit-offset windows: kept within the driver's range.)
            if ic.lower.iter().chain(&ic.upper).any(|&c| !(-(1 << 15)..(1 << 15)).contains(&c)) {
                return Err(format!("im2col corners {:?} {:?} out of range", ic.lower, ic.upper));
            }
        }
        if !(1..=5).contains(&rank) || self.strides.len() + 1 != rank || self.boxes.len() != rank {
            return Err(format!("rank {rank} with {} strides and {} box dims", self.strides.len(), self.boxes.len()));
        }
        if tma_type(self.dtype).is_none() {
            return Err(format!("type {} has no TMA element type", self.dtype));
        }
        if let Some(s) = self.strides.iter().find(|&&s| s % 16 != 0 || s >= 1 << 40) {
            return Err(format!("stride {s} bytes is not a multiple of 16 below 2^40"));
        }
        if let Some(d) = self.dims.iter().find(|&&d| d == 0 || d > 1 << 32) {
            return Err(format!("extent {d} is outside [1, 2^32]"));
        }
        if let Some(b) = self.boxes.iter().find(|&&b| b == 0 || b > 256) {
            return Err(format!("box dim {b} is outside [1, 256]"));
        }
        let inner_bytes = self.boxes[0] as usize * self.dtype.size();
        if inner_bytes % 16 != 0 {
            return Err(format!("the box's inner extent is {inner_bytes} bytes, not a multiple of 16"));
        }
        if self.swizzle != 0 && inner_bytes > self.swizzle as usize {
            return Err(format!("the box's inner extent ({inner_bytes} bytes) exceeds the {}-byte swizzle span", self.swizzle));
        }
        if !matches!(self.swizzle, 0 | 32 | 64 | 128) {
            return Err(format!("swizzle {} is not 0, 32, 64 or 128", self.swizzle));
        }
        // An input may be a view whose elements share memory (stride 0, expanded, overlapping):
        // the map's dims must not overlap, so such a view goes to the kernels that address each
        // element by its strides.
        let mut axes: Vec<(u64, u64)> =
            std::iter::once((self.dtype.size() as u64, self.dims[0])).chain(self.strides.iter().copied().zip(self.dims[1..].iter().copied())).filter(|&(_, d)| d > 1).collect();
        axes.sort_unstable();
        let mut reach = 1u64;
        for (s, d) in axes {
            if s < reach {
                return Err(format!("byte strides {:?} over dims {:?} make elements overlap (a stride 0 or an overlapping view)", self.strides, self.dims));
            }
            reach = s.saturating_mul(d);
        }
        Ok(())
    }

    /// Encodes the map for the tensor at device address `ptr` (16-byte aligned).
    pub fn encode(&self, ptr: u64) -> Result<sys::CUtensorMap> {
        self.check().map_err(|why| Error::Device(format!("internal: TMA descriptor for tensor {}: {why}", self.tensor.0)))?;
        if ptr % 16 != 0 {
            return Err(Error::InvalidArgument(format!("TMA load of tensor {}: address {ptr:#x} is not 16-byte aligned", self.tensor.0)));
        }
        let dtype = tma_type(self.dtype).ok_or_else(|| Error::Device(format!("internal: no TMA type for {}", self.dtype)))?;
        if let Some(ic) = &self.im2col {
            return self.encode_im2col(ic, ptr, dtype);
        }
        let encode = encode_fn()?;
        let ones = [1u32; 5];
        let swizzle = self.swizzle_mode();
        // SAFETY: all-zero bytes are a valid CUtensorMap (opaque words), overwritten by the call.
        let mut map: sys::CUtensorMap = unsafe { std::mem::zeroed() };
        // SAFETY: `encode` is cuTensorMapEncodeTiled, found in the driver by the probe; the
        // arrays hold `rank` entries (rank - 1 for strides), checked above; the call only
        // writes `map` and reads the arrays, and does not dereference the global address.
        let code = unsafe {
            encode(
                &mut map,
                dtype,
                self.dims.len() as u32,
                ptr as *mut c_void,
                self.dims.as_ptr(),
                self.strides.as_ptr(),
                self.boxes.as_ptr(),
                ones.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        check(code, &format!("cuTensorMapEncodeTiled(dims {:?}, strides {:?}, box {:?}, swizzle {})", self.dims, self.strides, self.boxes, self.swizzle))?;
        Ok(map)
    }
}

impl TmaDesc {
    /// The swizzle as the driver names it.
    fn swizzle_mode(&self) -> sys::CUtensorMapSwizzle {
        match self.swizzle {
            32 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
            64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
            128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            _ => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
        }
    }

    /// [`TmaDesc::encode`] of an im2col map (checked: rank 3-5, corners and strides per dim).
    fn encode_im2col(&self, ic: &Im2col, ptr: u64, dtype: sys::CUtensorMapDataType) -> Result<sys::CUtensorMap> {
        let encode = encode_im2col_fn()?;
        let swizzle = self.swizzle_mode();
        // SAFETY: all-zero bytes are a valid CUtensorMap (opaque words), overwritten by the call.
        let mut map: sys::CUtensorMap = unsafe { std::mem::zeroed() };
        // SAFETY: `encode` is cuTensorMapEncodeIm2col, found in the driver by the probe; `dims` and
        // `element_strides` hold `rank` entries, `strides` rank - 1, the corners rank - 2 (checked
        // by `check`); the call only writes `map` and reads the arrays, and does not dereference
        // the global address.
        let code = unsafe {
            encode(
                &mut map,
                dtype,
                self.dims.len() as u32,
                ptr as *mut c_void,
                self.dims.as_ptr(),
                self.strides.as_ptr(),
                ic.lower.as_ptr(),
                ic.upper.as_ptr(),
                ic.channels,
                ic.pixels,
                ic.element_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        check(
            code,
            &format!(
                "cuTensorMapEncodeIm2col(dims {:?}, strides {:?}, corners {:?} {:?}, {} channels x {} pixels, traversal {:?})",
                self.dims, self.strides, ic.lower, ic.upper, ic.channels, ic.pixels, ic.element_strides
            ),
        )?;
        Ok(map)
    }
}

type EncodeIm2colFn = unsafe extern "C" fn(
    *mut sys::CUtensorMap,
    sys::CUtensorMapDataType,
    u32,
    *mut c_void,
    *const u64,
    *const u64,
    *const i32,
    *const i32,
    u32,
    u32,
    *const u32,
    sys::CUtensorMapInterleave,
    sys::CUtensorMapSwizzle,
    sys::CUtensorMapL2promotion,
    sys::CUtensorMapFloatOOBfill,
) -> sys::CUresult;

/// `cuTensorMapEncodeIm2col` from the driver (CUDA 12.0+), looked up once.
fn encode_im2col_fn() -> Result<EncodeIm2colFn> {
    driver()?;
    static ENCODE: OnceLock<Option<EncodeIm2colFn>> = OnceLock::new();
    // SAFETY: the symbol has exactly EncodeIm2colFn's C signature (cuda.h, CUDA 12.0+).
    let f = ENCODE.get_or_init(|| unsafe { driver_symbol::<EncodeIm2colFn>(b"cuTensorMapEncodeIm2col") });
    f.ok_or_else(|| Error::Device("the CUDA driver lacks cuTensorMapEncodeIm2col (CUDA 12.0+); update the NVIDIA driver".into()))
}

fn tma_type(dt: DataType) -> Option<sys::CUtensorMapDataType> {
    use sys::CUtensorMapDataType as T;
    Some(match dt {
        DataType::F16 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DataType::Bf16 => T::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DataType::F32 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        DataType::F64 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
        DataType::I32 => T::CU_TENSOR_MAP_DATA_TYPE_INT32,
        DataType::I64 => T::CU_TENSOR_MAP_DATA_TYPE_INT64,
        DataType::Fp8E4m3 | DataType::Fp8E5m2 | DataType::I8 | DataType::U8 | DataType::Bool => T::CU_TENSOR_MAP_DATA_TYPE_UINT8,
    })
}

type EncodeFn = unsafe extern "C" fn(
    *mut sys::CUtensorMap,
    sys::CUtensorMapDataType,
    u32,
    *mut c_void,
    *const u64,
    *const u64,
    *const u32,
    *const u32,
    sys::CUtensorMapInterleave,
    sys::CUtensorMapSwizzle,
    sys::CUtensorMapL2promotion,
    sys::CUtensorMapFloatOOBfill,
) -> sys::CUresult;

/// `cuTensorMapEncodeTiled` from the driver (CUDA 12.0+), looked up once.
fn encode_fn() -> Result<EncodeFn> {
    driver()?;
    static ENCODE: OnceLock<Option<EncodeFn>> = OnceLock::new();
    // SAFETY: the symbol has exactly EncodeFn's C signature (cuda.h, CUDA 12.0+).
    let f = ENCODE.get_or_init(|| unsafe { driver_symbol::<EncodeFn>(b"cuTensorMapEncodeTiled") });
    f.ok_or_else(|| Error::Device("the CUDA driver lacks cuTensorMapEncodeTiled (CUDA 12.0+), which Hopper's TMA kernels need; update the NVIDIA driver".into()))
}

/// A function of the loaded driver by its symbol name (after `driver()` succeeded).
///
/// # Safety
/// `F` must be the symbol's exact C function-pointer type.
unsafe fn driver_symbol<F: Copy>(name: &[u8]) -> Option<F> {
    // SAFETY: driver() succeeded (the callers check it first), so culib() returns the loaded
    // driver library, which lives in a static and is never closed.
    let lib = unsafe { sys::culib() };
    // SAFETY: the caller vouches for F; the library stays loaded, so the copied function pointer
    // stays valid.
    unsafe { lib.get::<F>(name) }.ok().map(|f| *f)
}

/// Whether the driver can encode tensor maps (so TMA kernels may be planned).
pub fn tma_available() -> bool {
    encode_fn().is_ok()
}
