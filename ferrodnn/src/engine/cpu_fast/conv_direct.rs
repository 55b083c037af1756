//! Convolution forward as a direct AVX-512 kernel on channels-last images (no im2col matrix):
//! 2-D, one group, any stride, padding and dilation, f32 compute.
//!
//! The filter is packed per run as `wp[g][tap][c][64]`: blocks `g` of 64 output channels (the
//! last one padded with zeros), 64 consecutive values per (tap, input channel). The image is read
//! where it lies when it is f32 with its channels one apart; otherwise (NCHW, f16, bf16) it is
//! first copied into the workspace as dense NHWC f32. Output pixels of all images are numbered
//! `q = (n * OH + oh) * OW + ow` and cut into blocks of [`BLOCK`]; a work item is one block of
//! pixels for one block of 64 output channels, and the items run in parallel.
//!
//! Within an item, the input channels go in chunks whose packed filter stays in L2; per chunk,
//! the kernel takes [`P`] pixels at a time and keeps their `P x 64` sums in 24 registers, adding
//! per tap and channel one broadcast image value times four vectors of filter values. A tap that
//! falls in the padding reads a row of zeros. The sums go straight into an f32 channels-last
//! output without an epilogue, else into an f32 tile in the workspace that the epilogue then
//! writes out (any layout and type) while it is in cache.

use super::epilogue::BoundEpilogue;
use super::tensor::{store_rows, Dst, Load, LoadBf16, LoadF16, LoadF32, Src};
use crate::dtype::DataType;
use rayon::prelude::*;

/// Pixels a kernel call takes (its sums: `P x 4` vectors of 16).
const P: usize = 6;
/// The fewest and the most output pixels of a work item (within them, as many as give each
/// thread about four items: the fewer items, the more pixels share each chunk of the filter).
const BLOCK_MIN: usize = 48;
const BLOCK_MAX: usize = 480;
/// The most taps the kernel takes (their pointers are on the stack).
pub(crate) const MAX_TAPS: usize = 64;
/// Filter values of one input-channel chunk (256 KiB of f32: a share of L2).
const CHUNK_VALUES: usize = 1 << 17;
/// The most packed filter values for which the work items go pixel block by pixel block (all
/// channel blocks of one pixel block in a row): 512 KiB of f32, half of L2.
const PIXEL_MAJOR_FILTER: usize = 1 << 17;
/// Input channels of a chunk of the NCHW one-tap kernel (48 pixels of them: 48 KiB).
const NCHW_CHUNK: usize = 256;

/// The sizes the direct kernel needs (2-D).
#[derive(Clone, Debug)]
pub(crate) struct DirectConv {
    pub n: usize,
    pub c: usize,
    pub k: usize,
    pub h: usize,
    pub w: usize,
    pub oh: usize,
    pub ow: usize,
    /// Per tap: (row, column) offset of the image value it reads from the output pixel's
    /// origin, in units of the dilation already applied.
    pub taps: Vec<(isize, isize)>,
    /// Per tap: the filter's stored (row, column).
    pub stored: Vec<(usize, usize)>,
    pub stride: (isize, isize),
    pub pre: (isize, isize),
    /// Whether the image is read where it lies (f32, channels one apart).
    pub in_place: bool,
    /// Whether the plan writes the sums straight into the output (f32 channels-last, no
    /// epilogue); else through the tile.
    pub direct_out: bool,
    /// A one-tap convolution with unit stride and no padding from an f32 NCHW image (its pixels
    /// one apart) to an f32 NCHW output with no epilogue and output channels in 8s: run as
    /// `y[n] = w x[n]` with pixels in the vector lanes ([`Self::run_nchw_1x1`]), reading and
    /// writing both in place.
    pub nchw_1x1: bool,
}

impl DirectConv {
    fn groups64(&self) -> usize {
        self.k.div_ceil(64)
    }

    fn chunk(&self) -> usize {
        (CHUNK_VALUES / (self.taps.len() * 64)).clamp(1, self.c)
    }

    /// Workspace in f32 values: the packed filter, a row of zeros, the converted image, the tile.
    pub fn workspace_f32(&self) -> usize {
        if self.nchw_1x1 {
            return self.k * self.c;
        }
        let filter = self.groups64() * 64 * self.taps.len() * self.c;
        let image = if self.in_place { 0 } else { self.n * self.h * self.w * self.c };
        let tile = if self.direct_out { 0 } else { self.n * self.oh * self.ow * self.k };
        filter + self.c + image + tile
    }

    pub fn run(&self, x: &Src, wt: &Src, dst: &Dst, epi: &BoundEpilogue, ws: &mut [f32]) {
        if self.nchw_1x1 {
            if let (Some(xp), Some(yp)) = (x.f32_ptr(), dst.f32_ptr()) {
                self.run_nchw_1x1(xp, (x.strides[0], x.strides[1]), wt, yp, (dst.strides[0], dst.strides[1]), ws);
                return;
            }
            // A buffer that is not 4-byte aligned: the general path, on a workspace of its own.
            let general = DirectConv { nchw_1x1: false, ..self.clone() };
            let mut own = vec![0f32; general.workspace_f32()];
            return general.run(x, wt, dst, epi, &mut own);
        }
        let (taps, c, k) = (self.taps.len(), self.c, self.k);
        let g64 = self.groups64();
        let (wp, rest) = ws.split_at_mut(g64 * 64 * taps * c);
        let (zeros, rest) = rest.split_at_mut(c);
        zeros.fill(0.0);
        let (img, rest) = rest.split_at_mut(if self.in_place { 0 } else { self.n * self.h * self.w * c });
        self.pack_filter(wt, wp);
        // The image as (pointer, strides n, h, w) with channels one apart: where it lies, or
        // packed (into a buffer of its own when the plan meant to read it in place but it is
        // not 4-byte aligned).
        let mut own_img = Vec::new();
        let (xp, xs) = if let (true, Some(p)) = (self.in_place, x.f32_ptr()) {
            (p, (x.strides[0], x.strides[2], x.strides[3]))
        } else {
            let img = if self.in_place {
                own_img.resize(self.n * self.h * self.w * c, 0f32);
                own_img.as_mut_slice()
            } else {
                img
            };
            self.pack_image(x, img);
            let (h, w) = (self.h as isize, self.w as isize);
            (img.as_ptr(), (h * w * c as isize, w * c as isize, c as isize))
        };
        // Where the sums go: the output itself, or the tile (pixel-major, k values a pixel).
        // An output that turns out not to be 4-byte aligned gets a tile of its own.
        let q_total = self.n * self.oh * self.ow;
        let direct = if self.direct_out { dst.f32_ptr() } else { None };
        let mut own_tile = Vec::new();
        let (out, ldo, tile_addr) = match direct {
            Some(p) => (p, dst.strides[3] as usize, None),
            None => {
                let t = if self.direct_out {
                    own_tile.resize(q_total * k, 0f32);
                    own_tile.as_mut_slice()
                } else {
                    &mut rest[..q_total * k]
                };
                (t.as_mut_ptr(), k, Some(t.as_mut_ptr() as usize))
            }
        };
        let per_item = (q_total * g64).div_ceil(4 * rayon::current_num_threads()).clamp(BLOCK_MIN, BLOCK_MAX).div_ceil(P) * P;
        let blocks = q_total.div_ceil(per_item);
        let (xa, oa, wa, za) = (xp as usize, out as usize, wp.as_ptr() as usize, zeros.as_ptr() as usize);
        // Pixel blocks outermost where the whole packed filter stays in L2 (each block's image
        // values then serve all channel blocks from cache), else channel blocks outermost (each
        // one's filter serves all pixel blocks).
        let pixel_major = wp.len() <= PIXEL_MAJOR_FILTER;
        (0..g64 * blocks).into_par_iter().for_each(|item| {
            let (g, b) = if pixel_major { (item % g64, item / g64) } else { (item / blocks, item % blocks) };
            let (q0, q1) = (b * per_item, ((b + 1) * per_item).min(q_total));
            // SAFETY: the item writes output channels g*64.. of pixels q0..q1 only (items are
            // disjoint); the pointers cover the image, the packed filter and the zero row.
            unsafe { self.item(xa as *const f32, xs, wa as *const f32, za as *const f32, oa as *mut f32, ldo, g, q0, q1) };
            if let Some(t) = tile_addr {
                // SAFETY: the tile holds q_total * k values, written above by this item for these
                // pixels and channels and read here by it alone.
                let tile = unsafe { std::slice::from_raw_parts(t as *const f32, q_total * k) };
                self.store(tile, g, q0, q1, dst, epi);
            }
        });
    }

    /// Output channels `g*64..` of pixels `q0..q1` from the tile to the output: a channel at a
    /// time along the pixels for an f32 output whose pixels are one apart (NCHW) and no
    /// epilogue, else a pixel at a time through the epilogue.
    fn store(&self, tile: &[f32], g: usize, q0: usize, q1: usize, dst: &Dst, epi: &BoundEpilogue) {
        let k = self.k;
        let ncols = 64.min(k - g * 64);
        let (ohw, ow) = (self.oh * self.ow, self.ow);
        let s = &dst.strides;
        if let (Some(p), 1, true) = (dst.f32_ptr(), s[3], epi.is_empty()) {
            // Runs of pixels along an output row or image: (first pixel, its offset in the output,
            // length).
            // Runs along a whole image where its rows follow each other (pixels one apart
            // across rows too).
            let flat = s[2] == ow as isize;
            let mut q = q0;
            while q < q1 {
                let (n, oh, w) = (q / ohw, q % ohw / ow, q % ow);
                let len = if flat { ohw - q % ohw } else { ow - w }.min(q1 - q);
                let at = n as isize * s[0] + oh as isize * s[2] + w as isize;
                let mut k0 = g * 64;
                let mut i0 = 0;
                // Whole 16 x 16 blocks (16 pixels x 16 channels) as vector transposes.
                while k0 + 16 <= g * 64 + ncols && len >= 16 {
                    while i0 + 16 <= len {
                        // SAFETY: pixels q + i0.. (16) of the tile's channels k0.. (16), and the
                        // same outputs (n, k0.., oh, w + i0..), which this item alone writes.
                        unsafe { transpose16(tile.as_ptr().add((q + i0) * k + k0), k as isize, p.offset(at + k0 as isize * s[1] + i0 as isize), s[1]) };
                        i0 += 16;
                    }
                    for kk in k0..k0 + 16 {
                        for i in i0..len {
                            // SAFETY: as below.
                            unsafe { *p.offset(at + kk as isize * s[1] + i as isize) = tile[(q + i) * k + kk] };
                        }
                    }
                    (k0, i0) = (k0 + 16, 0);
                }
                for kk in k0..g * 64 + ncols {
                    let o = at + kk as isize * s[1];
                    for (i, src) in tile[q * k + kk..].iter().step_by(k).take(len).enumerate() {
                        // SAFETY: (n, kk, oh, w + i) is an element of the output, written only
                        // by the item that owns pixel q + i and channel kk.
                        unsafe { *p.offset(o + i as isize) = *src };
                    }
                }
                q += len;
            }
            return;
        }
        store_rows(
            tile,
            q1 - q0,
            ncols,
            1,
            |i, idx: &mut [usize]| {
                let q = q0 + i;
                idx[0] = q / ohw;
                idx[1] = g * 64;
                idx[2] = q % ohw / ow;
                idx[3] = q % ow;
                q * k + g * 64
            },
            dst,
            epi,
        );
    }

    /// `y[n, k, p] = sum over c of w[k, c] x[n, c, p]` for NCHW f32 `x` and `y` (strides of n
    /// and c given; pixels one apart): the filter packed as `wp[k / 8][c][k % 8]`; work items of
    /// one image, 64 output channels and up to [`BLOCK_MAX`] pixels; per item and chunk of input
    /// channels, 48 pixels at a time (three vectors) through each block of 8 output channels
    /// (24 registers of sums), broadcasting 8 filter values per channel.
    fn run_nchw_1x1(&self, x: *const f32, xs: (isize, isize), wt: &Src, y: *mut f32, ys: (isize, isize), ws: &mut [f32]) {
        let (c, k, pix) = (self.c, self.k, self.h * self.w);
        let wp = &mut ws[..k * c];
        wp.par_chunks_mut(8 * c).enumerate().for_each(|(kb, part)| {
            for (ci, row) in part.chunks_mut(8).enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    // SAFETY: (kb * 8 + j, ci, 0, 0) is an element of the filter (k is a
                    // multiple of 8).
                    *v = unsafe { wt.load((kb * 8 + j) as isize * wt.strides[0] + ci as isize * wt.strides[1]) };
                }
            }
        });
        self.nchw_items(x, xs, wp.as_ptr(), y, ys, self.n, pix);
    }

    /// The work items of [`Self::run_nchw_1x1`] over `n_img` images of `pix` pixels, the packed
    /// filter at `wp`.
    #[allow(clippy::too_many_arguments)]
    fn nchw_items(&self, x: *const f32, xs: (isize, isize), wp: *const f32, y: *mut f32, ys: (isize, isize), n_img: usize, pix: usize) {
        let (c, k) = (self.c, self.k);
        let groups = k.div_ceil(64);
        let per_item = (pix * n_img * groups).div_ceil(4 * rayon::current_num_threads()).clamp(BLOCK_MIN, BLOCK_MAX).div_ceil(48) * 48;
        let blocks = pix.div_ceil(per_item);
        let cb = NCHW_CHUNK.min(c);
        let (xa, ya, wa) = (x as usize, y as usize, wp as usize);
        (0..n_img * groups * blocks).into_par_iter().for_each(|item| {
            let (n, g, b) = (item / (groups * blocks), item / blocks % groups, item % blocks);
            let (p0, p1) = (b * per_item, ((b + 1) * per_item).min(pix));
            let (xn, yn) = (xa as *const f32, ya as *mut f32);
            // Input channels in chunks: per chunk, 48 pixels at a time (their image values in L1)
            // through each block of 8 output channels (the chunk's filter rows in L2).
            let mut c0 = 0;
            while c0 < c {
                let cn = cb.min(c - c0);
                let mut p = p0;
                while p < p1 {
                    let np = 48.min(p1 - p);
                    for kb in g * 8..(g * 8 + 8).min(k / 8) {
                        // SAFETY: channels c0.. (cn) of pixels p.. (np) of image n, filter rows
                        // kb of those channels, and output channels kb * 8.. (8) of those
                        // pixels, which only this item writes.
                        #[cfg(target_arch = "x86_64")]
                        unsafe {
                            let xp = xn.offset(n as isize * xs.0 + c0 as isize * xs.1 + p as isize);
                            let yp = yn.offset(n as isize * ys.0 + (kb * 8) as isize * ys.1 + p as isize);
                            let w0 = (wa as *const f32).add((kb * c + c0) * 8);
                            match np.div_ceil(16) {
                                3 => nchw_kernel::<3>(xp, xs.1, cn, w0, yp, ys.1, np, c0 == 0),
                                2 => nchw_kernel::<2>(xp, xs.1, cn, w0, yp, ys.1, np, c0 == 0),
                                _ => nchw_kernel::<1>(xp, xs.1, cn, w0, yp, ys.1, np, c0 == 0),
                            }
                        }
                        #[cfg(not(target_arch = "x86_64"))]
                        unreachable!("the direct kernel runs only where `available` says so ({xn:?} {yn:?} {wa})");
                    }
                    p += np;
                }
                c0 += cn;
            }
        });
    }

    /// `wp[g][t][c][j] = w[g * 64 + j, c, stored(t)]`, zero past the last output channel: for an
    /// f32 filter with its input channels one apart, 16 x 16 transposes per (block, tap);
    /// otherwise per block, 16 input channels of all taps at a time along each output channel.
    fn pack_filter(&self, w: &Src, wp: &mut [f32]) {
        match w.dtype {
            DataType::F32 => self.pack_filter_typed::<LoadF32>(w, wp),
            DataType::F16 => self.pack_filter_typed::<LoadF16>(w, wp),
            _ => self.pack_filter_typed::<LoadBf16>(w, wp),
        }
    }

    fn pack_filter_typed<L: Load>(&self, w: &Src, wp: &mut [f32]) {
        let (taps, k) = (self.taps.len(), self.k);
        let ptr = w.raw() as usize;
        let c = self.c;
        if !(L::F32 && w.strides[1] == 1) {
            // A block of 64 output channels at a time, 16 input channels at a time: each output
            // channel's values of those input channels and all taps read in one run (where they
            // lie together, as in NCHW), into places that stay in cache until their lines are
            // whole (one pass through the filter, not one per tap; 128 input channels at a time
            // measured slower).
            let mut sp = [0isize; MAX_TAPS];
            for (o, &(r, s)) in sp.iter_mut().zip(&self.stored) {
                *o = r as isize * w.strides[2] + s as isize * w.strides[3];
            }
            wp.par_chunks_mut(taps * c * 64).enumerate().for_each(|(g, part)| {
                for c0 in (0..c).step_by(16) {
                    for j in 0..64 {
                        let kk = g * 64 + j;
                        for ci in c0..(c0 + 16).min(c) {
                            let at = kk as isize * w.strides[0] + ci as isize * w.strides[1];
                            for (t, &o) in sp[..taps].iter().enumerate() {
                                // SAFETY: (kk, ci, stored tap t) is an element of the filter.
                                part[(t * c + ci) * 64 + j] = if kk < k { unsafe { L::load(ptr as *const u8, at + o) } } else { 0.0 };
                            }
                        }
                    }
                }
            });
            return;
        }
        wp.par_chunks_mut(c * 64).enumerate().for_each(|(gt, part)| {
            let (g, t) = (gt / taps, gt % taps);
            let (r, s) = self.stored[t];
            let sp = r as isize * w.strides[2] + s as isize * w.strides[3];
            // An f32 filter with its input channels one apart: whole blocks of 16 output x 16
            // input channels as vector transposes; the rest (channels past the last whole block)
            // a value at a time.
            let whole = c / 16 * 16;
            for j0 in (0..64).step_by(16).filter(|&j0| whole > 0 && g * 64 + j0 + 16 <= k) {
                for c0 in (0..whole).step_by(16) {
                    // SAFETY: output channels g * 64 + j0.. (16) and input channels c0.. (16) of
                    // tap t are elements of the filter (input channels one apart); their packed
                    // places c0.. x j0.. are inside this part.
                    unsafe {
                        let src = (ptr as *const f32).offset((g * 64 + j0) as isize * w.strides[0] + sp + c0 as isize);
                        transpose16(src, w.strides[0], part.as_mut_ptr().add(c0 * 64 + j0), 64);
                    }
                }
            }
            for j in 0..64 {
                let kk = g * 64 + j;
                let at = kk as isize * w.strides[0] + sp;
                let done = if whole > 0 && g * 64 + j / 16 * 16 + 16 <= k { whole } else { 0 };
                for (ci, v) in part[j..].iter_mut().step_by(64).enumerate().skip(done) {
                    // SAFETY: (kk, ci, r, s) is an element of the filter.
                    *v = if kk < k { unsafe { L::load(ptr as *const u8, at + ci as isize * w.strides[1]) } } else { 0.0 };
                }
            }
        });
    }

    /// The image as dense NHWC f32 (`img[((n * H + h) * W + w) * C + c]`), an image row at a
    /// time.
    fn pack_image(&self, x: &Src, img: &mut [f32]) {
        match x.dtype {
            DataType::F32 => self.pack_image_typed::<LoadF32>(x, img),
            DataType::F16 => self.pack_image_typed::<LoadF16>(x, img),
            _ => self.pack_image_typed::<LoadBf16>(x, img),
        }
    }

    fn pack_image_typed<L: Load>(&self, x: &Src, img: &mut [f32]) {
        let (h, w, c) = (self.h, self.w, self.c);
        let s = &x.strides;
        let ptr = x.raw() as usize;
        if L::F32 && s[1] != 1 && s[3] == 1 && s[2] == w as isize {
            return self.pack_image_flat(ptr as *const f32, s, img);
        }
        img.par_chunks_mut(w * c).enumerate().for_each(|(nh, row)| {
            let base = (nh / h) as isize * s[0] + (nh % h) as isize * s[2];
            if s[1] == 1 {
                // Channels one apart already (f16, bf16): a pixel at a time.
                for (wi, px) in row.chunks_exact_mut(c).enumerate() {
                    let at = base + wi as isize * s[3];
                    for (ci, v) in px.iter_mut().enumerate() {
                        // SAFETY: (n, ci, h, wi) is an element of the image.
                        *v = unsafe { L::load(ptr as *const u8, at + ci as isize) };
                    }
                }
                return;
            }
            // 16 channels at a time: each pixel's 16 values are stored together (one cache
            // line), read from 16 runs along the image row (NCHW); whole 16 x 16 blocks of f32
            // as vector transposes.
            for c0 in (0..c).step_by(16) {
                let cn = 16.min(c - c0);
                let mut w0 = 0;
                if L::F32 && cn == 16 && s[3] == 1 {
                    while w0 + 16 <= w {
                        // SAFETY: channels c0..c0 + 16 of pixels w0..w0 + 16 of this image row are
                        // elements of the image (f32, pixels one apart) and of `row`.
                        unsafe { transpose16((ptr as *const f32).offset(base + c0 as isize * s[1] + w0 as isize), s[1], row.as_mut_ptr().add(w0 * c + c0), c as isize) };
                        w0 += 16;
                    }
                }
                for (wi, px) in row.chunks_exact_mut(c).enumerate().skip(w0) {
                    let at = base + wi as isize * s[3] + c0 as isize * s[1];
                    for (ci, v) in px[c0..c0 + cn].iter_mut().enumerate() {
                        // SAFETY: (n, c0 + ci, h, wi) is an element of the image.
                        *v = unsafe { L::load(ptr as *const u8, at + ci as isize * s[1]) };
                    }
                }
            }
        });
    }

    /// [`Self::pack_image`] for an f32 image whose pixels are one apart across its rows too
    /// (NCHW): 16 pixels of an image at a time (a task each, whatever the image's width), whole
    /// 16 x 16 blocks as vector transposes.
    fn pack_image_flat(&self, x: *const f32, s: &[isize], img: &mut [f32]) {
        let (hw, c) = (self.h * self.w, self.c);
        let xa = x as usize;
        img.par_chunks_mut(hw * c).enumerate().for_each(|(n, im)| {
            im.par_chunks_mut(16 * c).enumerate().for_each(|(b, px)| {
                let x = xa as *const f32;
                let np = px.len() / c;
                let base = n as isize * s[0] + (b * 16) as isize;
                let mut c0 = 0;
                while np == 16 && c0 + 16 <= c {
                    // SAFETY: channels c0.. (16) of pixels b * 16.. (16) of image n are elements
                    // of the image (pixels one apart); the block's 16 rows of `px` hold them.
                    unsafe { transpose16(x.offset(base + c0 as isize * s[1]), s[1], px.as_mut_ptr().add(c0), c as isize) };
                    c0 += 16;
                }
                for (i, row) in px.chunks_exact_mut(c).enumerate() {
                    for (ci, v) in row.iter_mut().enumerate().skip(c0) {
                        // SAFETY: (n, ci, pixel b * 16 + i) is an element of the image.
                        *v = unsafe { *x.offset(base + ci as isize * s[1] + i as isize) };
                    }
                }
            });
        });
    }

    /// One work item: output channels `g*64..` of pixels `q0..q1`.
    ///
    /// # Safety
    /// `x` with strides `xs` covers the image (channels one apart), `wp` the packed filter,
    /// `zeros` `C` zeros, and `out` (pixel `q` at `q * ldo`) the output channels of these pixels,
    /// which no other thread writes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn item(&self, x: *const f32, xs: (isize, isize, isize), wp: *const f32, zeros: *const f32, out: *mut f32, ldo: usize, g: usize, q0: usize, q1: usize) {
        let (taps, c) = (self.taps.len(), self.c);
        let kb = (self.k - g * 64).min(64).div_ceil(16);
        let last = (self.k - g * 64 - (kb - 1) * 16).min(16);
        let cb = self.chunk();
        let wg = unsafe { wp.add(g * 64 * taps * c) };
        let (ohw, ow) = (self.oh * self.ow, self.ow);
        // Each pixel's taps inside the image (a bit each), and the pixels in order of those sets,
        // so that the pixels of a kernel call mostly share them and a tap that falls in the
        // padding for all of them is skipped, not summed over zeros.
        // Each pixel's (taps outside, pixel, offset in the image at channel 0 of its first image
        // row and column before the tap's offset: meaningful where a tap lands inside), the
        // pixel's (n, oh, ow) stepped along without divisions.
        let (h, w) = (self.h as isize, self.w as isize);
        let mut tap_off = [0isize; MAX_TAPS];
        for (o, &(dr, ds)) in tap_off.iter_mut().zip(&self.taps) {
            *o = dr * xs.1 + ds * xs.2;
        }
        let mut order = [(0u64, 0u32, 0isize); BLOCK_MAX];
        let order = &mut order[..q1 - q0];
        let (mut n, mut oh, mut ow_i) = (q0 / ohw, q0 % ohw / ow, q0 % ow);
        for (i, o) in order.iter_mut().enumerate() {
            let (ih, iw) = (oh as isize * self.stride.0 - self.pre.0, ow_i as isize * self.stride.1 - self.pre.1);
            let mut mask = 0u64;
            for (t, &(dr, ds)) in self.taps.iter().enumerate() {
                let (r, c) = (ih + dr, iw + ds);
                if r < 0 || c < 0 || r >= h || c >= w {
                    mask |= 1 << t;
                }
            }
            *o = (mask, (q0 + i) as u32, n as isize * xs.0 + ih * xs.1 + iw * xs.2);
            ow_i += 1;
            if ow_i == ow {
                ow_i = 0;
                oh += 1;
                if oh == self.oh {
                    oh = 0;
                    n += 1;
                }
            }
        }
        if order.iter().any(|o| o.0 != 0) {
            order.sort_unstable();
        }
        let mut ptrs = [std::ptr::null::<f32>(); P * MAX_TAPS];
        let mut live = [0usize; MAX_TAPS];
        let mut outs = [std::ptr::null_mut::<f32>(); P];
        let mut c0 = 0;
        while c0 < c {
            let cn = cb.min(c - c0);
            for seg in order.chunks(P) {
                let np = seg.len();
                // The taps some pixel of the call reads inside the image.
                let outside_all = seg.iter().fold(u64::MAX, |m, o| m & o.0);
                let mut nt = 0;
                for t in (0..taps).filter(|&t| outside_all >> t & 1 == 0) {
                    live[nt] = t;
                    for (p, &(mask, _, base)) in seg.iter().enumerate() {
                        // SAFETY: where tap t is inside the image for the pixel, base + its
                        // offset is element (n, ih, iw, 0) of the image, c0 further a channel of it.
                        ptrs[nt * P + p] = if mask >> t & 1 == 1 { zeros } else { unsafe { x.offset(base + tap_off[t] + c0 as isize) } };
                    }
                    nt += 1;
                }
                for (o, &(_, q, _)) in outs.iter_mut().zip(seg) {
                    // SAFETY: output channels g*64.. of pixel q.
                    *o = unsafe { out.add(q as usize * ldo + g * 64) };
                }
                let w0 = unsafe { wg.add(c0 * 64) };
                // SAFETY: the pointers and extents above; the kernel reads cn channels from each
                // pointer, the filter values of these channels for the live taps, and writes np
                // pixels x kb vectors (the last masked to `last` lanes).
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    kernel_dispatch(np, kb, &ptrs, &live[..nt], cn, w0, c * 64, &outs, last, c0 == 0)
                };
                #[cfg(not(target_arch = "x86_64"))]
                unreachable!("the direct kernel runs only where `available` says so ({w0:?} {kb} {last} {nt} {np})");
            }
            c0 += cn;
        }
    }
}

/// The kernel for `np` pixels and `kb` vectors of output channels.
#[cfg(target_arch = "x86_64")]
///
/// # Safety
/// As for [`kernel`].
#[allow(clippy::too_many_arguments)]
unsafe fn kernel_dispatch(np: usize, kb: usize, ptrs: &[*const f32], taps: &[usize], cn: usize, w: *const f32, wts: usize, outs: &[*mut f32; P], last: usize, first: bool) {
    macro_rules! go {
        ($($p:literal),*) => {
            match (np, kb) {
                $(
                    ($p, 4) => unsafe { kernel::<$p, 4>(ptrs, taps, cn, w, wts, outs, last, first) },
                    ($p, 3) => unsafe { kernel::<$p, 3>(ptrs, taps, cn, w, wts, outs, last, first) },
                    ($p, 2) => unsafe { kernel::<$p, 2>(ptrs, taps, cn, w, wts, outs, last, first) },
                    ($p, 1) => unsafe { kernel::<$p, 1>(ptrs, taps, cn, w, wts, outs, last, first) },
                )*
                _ => unreachable!("np {np} kb {kb}"),
            }
        };
    }
    go!(1, 2, 3, 4, 5, 6)
}

/// `outs[p][0..16 KB] (+)= sum over i and channels c < cn of x_p,i[c] * w[taps[i]][c][0..16 KB]`,
/// where `x_p,i = ptrs[i * P + p]` and `w[t][c]` is at `w + t * wts + c * 64`. The first chunk
/// (`first`) starts from zero; later ones add to what the outputs hold. The last vector of a
/// pixel is masked to `last` lanes.
///
/// # Safety
/// Each pointer reads `cn` values, `w` covers the taps of `cn` rows of 64 values at stride
/// `wts`, and each of the first `NP` outputs holds `(KB - 1) * 16 + last` values.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
unsafe fn kernel<const NP: usize, const KB: usize>(ptrs: &[*const f32], taps: &[usize], cn: usize, w: *const f32, wts: usize, outs: &[*mut f32; P], last: usize, first: bool) {
    use std::arch::x86_64::*;
    let lm = ((1u32 << last) - 1) as __mmask16;
    let mask = |j: usize| if j + 1 == KB { lm } else { 0xffff };
    let mut acc = [[_mm512_setzero_ps(); KB]; NP];
    if !first {
        for (p, a) in acc.iter_mut().enumerate() {
            for (j, v) in a.iter_mut().enumerate() {
                // SAFETY: pixel p's values of this channel block (masked to the valid ones).
                *v = unsafe { _mm512_maskz_loadu_ps(mask(j), outs[p].add(j * 16)) };
            }
        }
    }
    for (i, &t) in taps.iter().enumerate() {
        let wt = unsafe { w.add(t * wts) };
        let mut px = [std::ptr::null::<f32>(); NP];
        px.copy_from_slice(&ptrs[i * P..i * P + NP]);
        for ci in 0..cn {
            let mut wv = [_mm512_setzero_ps(); KB];
            for (j, v) in wv.iter_mut().enumerate() {
                // SAFETY: row ci of tap t's packed filter has 64 values.
                *v = unsafe { _mm512_loadu_ps(wt.add(ci * 64 + j * 16)) };
            }
            for p in 0..NP {
                // SAFETY: channel ci of pixel p's tap t (or of the zero row).
                let xv = _mm512_set1_ps(unsafe { *px[p].add(ci) });
                for j in 0..KB {
                    acc[p][j] = _mm512_fmadd_ps(xv, wv[j], acc[p][j]);
                }
            }
        }
    }
    for (p, a) in acc.iter().enumerate() {
        for (j, v) in a.iter().enumerate() {
            // SAFETY: as for the loads.
            unsafe { _mm512_mask_storeu_ps(outs[p].add(j * 16), mask(j), *v) };
        }
    }
}

/// `y[kk * ys + p] (+)= sum over c < cn of w[c * 8 + kk] * x[c * xs + p]` for 8 output channels
/// `kk` and pixels `p < np` (`PV` vectors, the last masked); the first chunk starts from zero.
///
/// # Safety
/// `x` covers `cn` rows of `np` values at stride `xs`, `w` `cn * 8` values, `y` 8 rows of `np`
/// values at stride `ys`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
unsafe fn nchw_kernel<const PV: usize>(x: *const f32, xs: isize, cn: usize, w: *const f32, y: *mut f32, ys: isize, np: usize, first: bool) {
    use std::arch::x86_64::*;
    let mask = |j: usize| if j + 1 == PV { ((1u32 << (np - j * 16)) - 1) as __mmask16 } else { 0xffff };
    let mut acc = [[_mm512_setzero_ps(); PV]; 8];
    if !first {
        for (kk, a) in acc.iter_mut().enumerate() {
            for (j, v) in a.iter_mut().enumerate() {
                // SAFETY: pixels 16j.. of output row kk (masked to np).
                *v = unsafe { _mm512_maskz_loadu_ps(mask(j), y.offset(kk as isize * ys + 16 * j as isize)) };
            }
        }
    }
    for ci in 0..cn {
        // SAFETY: pixels 16j.. of input row ci (masked to np).
        let xv: [__m512; PV] = std::array::from_fn(|j| unsafe { _mm512_maskz_loadu_ps(mask(j), x.offset(ci as isize * xs + 16 * j as isize)) });
        for (kk, a) in acc.iter_mut().enumerate() {
            // SAFETY: filter value (kk, ci) of the block.
            let wv = _mm512_set1_ps(unsafe { *w.add(ci * 8 + kk) });
            for j in 0..PV {
                a[j] = _mm512_fmadd_ps(wv, xv[j], a[j]);
            }
        }
    }
    for (kk, a) in acc.iter().enumerate() {
        for (j, v) in a.iter().enumerate() {
            // SAFETY: as for the loads.
            unsafe { _mm512_mask_storeu_ps(y.offset(kk as isize * ys + 16 * j as isize), mask(j), *v) };
        }
    }
}

/// `dst[j * ds + i] = src[i * ss + j]` for i, j < 16: a 16 x 16 block of f32 transposed, in
/// three rounds of shuffles (pairs of rows, then 4-value groups, then 128-bit lanes).
///
/// # Safety
/// Both blocks must be valid f32 memory (rows 16 values long at the given strides), and the
/// CPU must have AVX-512F (`available`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose16(src: *const f32, ss: isize, dst: *mut f32, ds: isize) {
    use std::arch::x86_64::*;
    // SAFETY: row i of the source block.
    let r: [__m512; 16] = std::array::from_fn(|i| unsafe { _mm512_loadu_ps(src.offset(i as isize * ss)) });
    // t[2i] / t[2i + 1]: rows 2i and 2i + 1 interleaved (low / high pairs of each 128-bit lane).
    let t: [__m512; 16] = std::array::from_fn(|i| if i % 2 == 0 { _mm512_unpacklo_ps(r[i], r[i + 1]) } else { _mm512_unpackhi_ps(r[i - 1], r[i]) });
    // u[4b + j]: column 4l + j of rows 4b..4b + 4, in 128-bit lane l.
    let u: [__m512; 16] = std::array::from_fn(|i| {
        let (b, j) = (i / 4, i % 4);
        let (a, c) = (t[4 * b + j / 2], t[4 * b + 2 + j / 2]);
        if j % 2 == 0 {
            _mm512_shuffle_ps::<0x44>(a, c)
        } else {
            _mm512_shuffle_ps::<0xEE>(a, c)
        }
    });
    // v[j] (j < 4): columns j and 8 + j of rows 0..8; v[4 + j]: columns 4 + j and 12 + j; v[8..]
    // the same for rows 8..16.
    let v: [__m512; 16] = std::array::from_fn(|i| {
        let (half, hi, j) = (i / 8, (i / 4) % 2, i % 4);
        let (a, c) = (u[8 * half + j], u[8 * half + 4 + j]);
        if hi == 0 {
            _mm512_shuffle_f32x4::<0x88>(a, c)
        } else {
            _mm512_shuffle_f32x4::<0xDD>(a, c)
        }
    });
    for j in 0..8 {
        // SAFETY: rows j and 8 + j of the destination block.
        unsafe {
            _mm512_storeu_ps(dst.offset(j as isize * ds), _mm512_shuffle_f32x4::<0x88>(v[j], v[8 + j]));
            _mm512_storeu_ps(dst.offset((8 + j) as isize * ds), _mm512_shuffle_f32x4::<0xDD>(v[j], v[8 + j]));
        }
    }
}

/// Whether this machine runs the direct kernel.
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| is_x86_feature_detected!("avx512f"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether a tensor of `dtype` with `strides` (dims `[n, c, h, w]`) is read in place: f32 with
/// its channels one apart.
pub(crate) fn channels_last_f32(dtype: DataType, strides: &[isize]) -> bool {
    dtype == DataType::F32 && strides.len() == 4 && strides[1] == 1
}
