//! Operands addressed through an index map: the implicit GEMM of a convolution.
//!
//! A strided [`Operand`](super::Operand) puts element `(row, col)` at `row * rs + col * cs`. A
//! [`Gather`] instead maps each of the operand's two GEMM indices (along m or n, and along k)
//! through an [`Index`]: a plain stride, a pixel of an image grid (image `n` and a position `o`
//! in up to three spatial dims), or a filter tap and channel. A pixel and a tap together make a
//! spatial coordinate per axis, `base + o * mul + off + t * dil`, which (divided by `div` where
//! that is exact) must fall inside the tensor's extent on that axis, else the element is zero
//! (the padding). So the activation of a convolution is read as the im2col matrix without that
//! matrix ever being written.
//!
//! The map is compiled into the kernel (`gather.cuh`, every extent and stride a literal), so the
//! divisions by extents are multiplications. The mma.sync GEMM (`sm80.cuh`, `GM_GATHER`) loads a
//! gathered tile 16 bytes at a time when the tile's contiguous dim is a plain unit stride or the
//! channels of a tap-major index (channels a multiple of the vector, so a vector never straddles
//! two taps and is wholly inside or wholly outside the image), else one element at a time. The
//! Hopper GEMM (`sm90.rs`) reads a convolution's channels-last image by im2col TMA loads where
//! the map is one (channels a multiple of 64, positive dilation), a map that is a strided matrix
//! after all ([`Gather::as_matrix`]) by tiled TMA, and otherwise gathers with its producer
//! warpgroups (`sm90_gather.cuh`).

use crate::engine::cuda::kernel::Source;

/// One GEMM index of a gathered operand.
#[derive(Clone, Debug, PartialEq)]
pub enum Index {
    /// `i * stride`.
    Plain { stride: i64 },
    /// `i = n * prod(grid) + o` (`o` row-major over `grid`, three dims, outermost first; unused
    /// dims 1): offset `n * n_stride`, coordinate `o[d] * mul[d] + off[d]` on axis `d`.
    Pixel { n_stride: i64, grid: [i64; 3], mul: [i64; 3], off: [i64; 3] },
    /// A filter tap `t` (row-major over `taps`) and a channel `ch`: `i = t * channels + ch`
    /// (`tap_major`) or `i = ch * prod(taps) + t`; offset `ch * ch_stride`, coordinate
    /// `t[d] * dil[d]` on axis `d`.
    Taps { taps: [i64; 3], channels: i64, ch_stride: i64, tap_major: bool, dil: [i64; 3] },
}

impl Index {
    fn code(&self) -> u8 {
        match self {
            Index::Plain { .. } => 0,
            Index::Pixel { .. } => 1,
            Index::Taps { .. } => 2,
        }
    }

    /// Whether `vec` consecutive values of the index starting at a multiple of `vec` are `vec`
    /// consecutive elements of memory, all inside or all outside the tensor.
    pub fn contiguous(&self, vec: i64) -> bool {
        match *self {
            Index::Plain { stride } => stride == 1,
            Index::Pixel { .. } => false,
            Index::Taps { channels, ch_stride, tap_major, .. } => tap_major && ch_stride == 1 && channels % vec == 0,
        }
    }

    /// The strides the index multiplies (extents of 1 excluded).
    fn strides(&self) -> Vec<i64> {
        match *self {
            Index::Plain { stride } => vec![stride],
            Index::Pixel { n_stride, .. } => vec![n_stride],
            Index::Taps { ch_stride, channels, .. } => {
                if channels > 1 {
                    vec![ch_stride]
                } else {
                    vec![]
                }
            }
        }
    }
}

/// A spatial axis of a gathered tensor: a coordinate `c` (the sum of the indices' contributions
/// and `base`) is the element `c / div` (when `div` divides it) if that is in `0..extent`.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    pub extent: i64,
    pub stride: i64,
    pub div: i64,
    pub base: i64,
}

impl Axis {
    /// An axis of one element that nothing moves along.
    pub fn unit() -> Axis {
        Axis { extent: 1, stride: 0, div: 1, base: 0 }
    }
}

/// How a gathered operand is addressed: its index along m (A) or n (B), its index along k, and
/// its spatial axes (three, outermost first; unused ones [`Axis::unit`]). At most one index is a
/// pixel and at most one a tap. With a [`Block`], the operand is block-diagonal.
#[derive(Clone, Debug, PartialEq)]
pub struct Gather {
    pub mn: Index,
    pub k: Index,
    pub axes: [Axis; 3],
    pub block: Option<Block>,
}

/// A block-diagonal operand: the filter of several groups of a grouped convolution packed into
/// one GEMM (their image channels one reduction, their filters one output). Its m/n index is a
/// plain one and its k index a tap index: value `i` of the m/n index is in block `i / mn`, the k
/// index's channel `ch` in block `ch / ch`; an element whose two blocks differ is zero (a filter
/// reads its own group's channels only). `mn_wrap` (`ch_wrap`): that index addresses the tensor
/// by its place in its block (`i % mn`, `ch % ch`: the filter's own dim over one group), else by
/// the value itself (the dim over every group of the pack).
#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    pub mn: i64,
    pub ch: i64,
    pub mn_wrap: bool,
    pub ch_wrap: bool,
}

/// The gathers of a matmul node of a view graph (a convolution seen as a GEMM): its A and B.
///
/// A grouped convolution is `groups` GEMMs of one shape, one per group: the GEMM's batch is then
/// images x groups (groups inner, see [`super::GemmProblem::groups`]), and each operand's map
/// addresses group 0, the others `g * a_group` (`g * b_group`) elements further on (the
/// group's first channels or filters).
#[derive(Clone, Debug, PartialEq)]
pub struct Gathers {
    pub node: usize,
    pub a: Gather,
    pub b: Gather,
    pub groups: usize,
    pub a_group: i64,
    pub b_group: i64,
}

impl Gathers {
    /// The gathers of one group (a convolution of one group).
    pub fn one(node: usize, a: Gather, b: Gather) -> Gathers {
        Gathers { node, a, b, groups: 1, a_group: 0, b_group: 0 }
    }
}

impl Gather {
    /// Whether the map is one the kernels take: at most one pixel and one tap index, positive
    /// extents, divisors and grids.
    pub fn valid(&self) -> bool {
        let pixels = [&self.mn, &self.k].iter().filter(|i| matches!(i, Index::Pixel { .. })).count();
        let taps = [&self.mn, &self.k].iter().filter(|i| matches!(i, Index::Taps { .. })).count();
        let dims_ok = |d: &[i64; 3]| d.iter().all(|&e| (1..=i32::MAX as i64).contains(&e));
        let index_ok = |i: &Index| match i {
            Index::Plain { .. } => true,
            Index::Pixel { grid, .. } => dims_ok(grid),
            Index::Taps { taps, channels, .. } => dims_ok(taps) && (1..=i32::MAX as i64).contains(channels),
        };
        let block_ok = match &self.block {
            None => true,
            Some(b) => {
                matches!(self.mn, Index::Plain { .. }) && matches!(self.k, Index::Taps { .. }) && (1..=i32::MAX as i64).contains(&b.mn) && (1..=i32::MAX as i64).contains(&b.ch)
            }
        };
        pixels <= 1 && taps <= 1 && block_ok && index_ok(&self.mn) && index_ok(&self.k) && self.axes.iter().all(|a| a.extent >= 1 && a.extent <= i32::MAX as i64 && a.div >= 1)
    }

    /// Whether 16-byte loads along the index that is contiguous (`along_k`: k, else m or n) keep
    /// every vector aligned: every other stride is a multiple of `vec` elements.
    pub fn aligned(&self, along_k: bool, vec: i64) -> bool {
        let (contig, other) = if along_k { (&self.k, &self.mn) } else { (&self.mn, &self.k) };
        if !contig.contiguous(vec) {
            return false;
        }
        // A block-diagonal operand: a vector within one block (all its elements in or out).
        if let Some(b) = &self.block {
            if (if along_k { b.ch } else { b.mn }) % vec != 0 {
                return false;
            }
        }
        let mut strides = other.strides();
        if let Index::Taps { .. } = contig {
            // The channels' unit stride is the contiguous one; nothing else of the tap index
            // multiplies a stride but the axes below.
        } else {
            strides.extend(contig.strides().into_iter().filter(|&s| s != 1));
        }
        strides.extend(self.axes.iter().filter(|a| a.extent > 1).map(|a| a.stride));
        strides.iter().all(|s| s % vec == 0)
    }

    /// The operand as a strided matrix, `(mn stride, k stride)`, when the map is one after all:
    /// its m/n index plain, and its k index a run of one stride through the tensor (a packed
    /// filter's taps and channels, or a packed image's pixels) that never leaves it.
    pub fn as_matrix(&self) -> Option<(i64, i64)> {
        let Index::Plain { stride } = self.mn else { return None };
        if self.block.is_some() {
            return None;
        }
        // Every axis unshifted (one tap at base b reads element b, not the first: a strided data
        // gradient's phase, conv/phase.rs), and where the k index moves along it, undivided, its
        // extent the index's.
        let plain_axis = |a: &Axis, extent: i64, step: i64| a.base == 0 && (extent == 1 || (a.div == 1 && a.extent == extent && step == 1));
        let dims: Vec<(i64, i64)> = match self.k {
            Index::Plain { stride: k } => return Some((stride, k)),
            Index::Taps { taps, channels, ch_stride, tap_major, dil } => {
                if !(0..3).all(|d| plain_axis(&self.axes[d], taps[d], dil[d])) {
                    return None;
                }
                let t = (0..3).map(|d| (taps[d], self.axes[d].stride));
                if tap_major {
                    t.chain(std::iter::once((channels, ch_stride))).collect()
                } else {
                    std::iter::once((channels, ch_stride)).chain(t).collect()
                }
            }
            Index::Pixel { n_stride, grid, mul, off } => {
                if !(0..3).all(|d| off[d] == 0 && plain_axis(&self.axes[d], grid[d], mul[d])) {
                    return None;
                }
                // (Two images stand for any number: the run must go on from one to the next.)
                std::iter::once((2, n_stride)).chain((0..3).map(|d| (grid[d], self.axes[d].stride))).collect()
            }
        };
        let moving: Vec<(i64, i64)> = dims.into_iter().filter(|&(e, _)| e != 1).collect();
        for w in moving.windows(2) {
            if w[0].1 != w[1].1.checked_mul(w[1].0)? {
                return None;
            }
        }
        Some((stride, moving.last().map_or(0, |&(_, s)| s)))
    }

    /// Its defines for `gather.cuh`, named `{prefix}...` (`GA_` for A, `GB_` for B).
    pub fn defines(&self, src: Source, prefix: &str) -> Source {
        let d = |src: Source, name: &str, v: i64| src.define(&format!("{prefix}{name}"), v);
        let mut src = d(src, "MN_KIND", self.mn.code() as i64);
        src = d(src, "K_KIND", self.k.code() as i64);
        let plain = |i: &Index| if let Index::Plain { stride } = i { *stride } else { 0 };
        src = d(src, "MN_S", plain(&self.mn));
        src = d(src, "K_S", plain(&self.k));
        let pixel = [&self.mn, &self.k].into_iter().find_map(|i| if let Index::Pixel { n_stride, grid, mul, off } = i { Some((*n_stride, *grid, *mul, *off)) } else { None });
        let (n_stride, grid, mul, off) = pixel.unwrap_or((0, [1; 3], [0; 3], [0; 3]));
        src = d(src, "PX_N", n_stride);
        for a in 0..3 {
            src = d(src, &format!("PX_G{a}"), grid[a]);
            src = d(src, &format!("PX_MUL{a}"), mul[a]);
            src = d(src, &format!("PX_OFF{a}"), off[a]);
        }
        let taps = [&self.mn, &self.k].into_iter().find_map(|i| {
            if let Index::Taps { taps, channels, ch_stride, tap_major, dil } = i {
                Some((*taps, *channels, *ch_stride, *tap_major, *dil))
            } else {
                None
            }
        });
        let (t, ch, cs, tm, dil) = taps.unwrap_or(([1; 3], 1, 0, true, [0; 3]));
        src = d(src, "TP_CH", ch);
        src = d(src, "TP_CS", cs);
        src = d(src, "TP_TM", tm as i64);
        for a in 0..3 {
            src = d(src, &format!("TP_T{a}"), t[a]);
            src = d(src, &format!("TP_DIL{a}"), dil[a]);
        }
        let (blk, bmn, bch, mn_wrap, ch_wrap) = match &self.block {
            Some(b) => (1, b.mn, b.ch, b.mn_wrap as i64, b.ch_wrap as i64),
            None => (0, 1, 1, 0, 0),
        };
        src = d(src, "BLK", blk);
        src = d(src, "BLK_MN", bmn);
        src = d(src, "BLK_CH", bch);
        src = d(src, "BLK_MN_WRAP", mn_wrap);
        src = d(src, "BLK_CH_WRAP", ch_wrap);
        for (a, ax) in self.axes.iter().enumerate() {
            src = d(src, &format!("E{a}"), ax.extent);
            src = d(src, &format!("S{a}"), if ax.extent > 1 { ax.stride } else { 0 });
            src = d(src, &format!("DIV{a}"), ax.div);
            src = d(src, &format!("BASE{a}"), ax.base);
        }
        src
    }
}

/// The index maps' device code (`gather.cuh`).
pub const GATHER: &str = include_str!("gather.cuh");

#[cfg(test)]
mod tests {
    use super::*;

    fn nhwc_image() -> Gather {
        // x [2, 16, 5, 7] NHWC (strides n 560, c 1, h 112, w 16), 3x3 taps, pad 1.
        Gather {
            mn: Index::Pixel { n_stride: 560, grid: [1, 5, 7], mul: [0, 1, 1], off: [0, -1, -1] },
            k: Index::Taps { taps: [1, 3, 3], channels: 16, ch_stride: 1, tap_major: true, dil: [0, 1, 1] },
            axes: [Axis::unit(), Axis { extent: 5, stride: 112, div: 1, base: 0 }, Axis { extent: 7, stride: 16, div: 1, base: 0 }],
            block: None,
        }
    }

    #[test]
    fn vectors_need_whole_channel_runs_and_aligned_strides() {
        let g = nhwc_image();
        assert!(g.valid());
        assert!(g.aligned(true, 8));
        assert!(!g.aligned(false, 8));
        // 12 channels: a vector of 8 would straddle two taps.
        let mut g12 = g.clone();
        g12.k = Index::Taps { taps: [1, 3, 3], channels: 12, ch_stride: 1, tap_major: true, dil: [0, 1, 1] };
        assert!(!g12.aligned(true, 8));
        // Vectors of 4 (8-byte loads) fit 12 channels.
        assert!(g12.aligned(true, 4));
        // A row stride that is not a multiple of the vector.
        let mut odd = g.clone();
        odd.axes[1].stride = 113;
        assert!(!odd.aligned(true, 8));
        // Two pixel indices: not a map the kernel takes.
        let mut two = g;
        two.k = two.mn.clone();
        assert!(!two.valid());
    }

    #[test]
    fn packed_filters_and_images_are_matrices() {
        // w [24, 16, 3, 3] KRSC (strides k 144, c 1, r 48, s 16): B of fprop, n x (taps, c).
        let axes = [Axis::unit(), Axis { extent: 3, stride: 48, div: 1, base: 0 }, Axis { extent: 3, stride: 16, div: 1, base: 0 }];
        let w = Gather {
            mn: Index::Plain { stride: 144 },
            k: Index::Taps { taps: [1, 3, 3], channels: 16, ch_stride: 1, tap_major: true, dil: [0, 1, 1] },
            axes: axes.clone(),
            block: None,
        };
        assert_eq!(w.as_matrix(), Some((144, 1)));
        // Mirrored (Convolution mode): not a run.
        let mut flipped = w.clone();
        flipped.axes[1].base = 2;
        flipped.k = Index::Taps { taps: [1, 3, 3], channels: 16, ch_stride: 1, tap_major: true, dil: [0, -1, -1] };
        assert_eq!(flipped.as_matrix(), None);
        // One tap, the filter's centre (a strided data gradient's phase): its element is at an
        // offset, so not the matrix at the tensor's start.
        let mut centre = w.clone();
        centre.axes[1].base = 1;
        centre.axes[2].base = 1;
        centre.k = Index::Taps { taps: [1, 1, 1], channels: 16, ch_stride: 1, tap_major: true, dil: [0, 2, 2] };
        assert_eq!(centre.as_matrix(), None);
        centre.axes[1].base = 0;
        centre.axes[2].base = 0;
        assert_eq!(centre.as_matrix(), Some((144, 1)));
        // KCRS read tap-major: not a run.
        let kcrs = Gather {
            mn: Index::Plain { stride: 144 },
            k: Index::Taps { taps: [1, 3, 3], channels: 16, ch_stride: 9, tap_major: true, dil: [0, 1, 1] },
            axes: [Axis::unit(), Axis { extent: 3, stride: 3, div: 1, base: 0 }, Axis { extent: 3, stride: 1, div: 1, base: 0 }],
            block: None,
        };
        assert_eq!(kcrs.as_matrix(), None);
        // dy [2, 8, 5, 7] NHWC as wgrad's B: pixels x channels.
        let dy = Gather {
            mn: Index::Plain { stride: 1 },
            k: Index::Pixel { n_stride: 280, grid: [1, 5, 7], mul: [0, 1, 1], off: [0; 3] },
            axes: [Axis::unit(), Axis { extent: 5, stride: 56, div: 1, base: 0 }, Axis { extent: 7, stride: 8, div: 1, base: 0 }],
            block: None,
        };
        assert_eq!(dy.as_matrix(), Some((1, 8)));
        // The image of fprop (a pixel index as m, padded): a gather.
        assert_eq!(nhwc_image().as_matrix(), None);
    }

    /// One index's share of an element's address, as `gt_index` (gather.cuh) computes it: an
    /// offset and coordinates on the three axes.
    fn part(idx: &Index, i: i64) -> (i64, [i64; 3]) {
        match *idx {
            Index::Plain { stride } => (i * stride, [0; 3]),
            Index::Pixel { n_stride, grid, mul, off } => {
                let mut q = i;
                let mut o = [0; 3];
                for d in (0..3).rev() {
                    o[d] = q % grid[d];
                    q /= grid[d];
                }
                (q * n_stride, [0, 1, 2].map(|d| o[d] * mul[d] + off[d]))
            }
            Index::Taps { taps, channels, ch_stride, tap_major, dil } => {
                let total: i64 = taps.iter().product();
                let (mut t, ch) = if tap_major { (i / channels, i % channels) } else { (i % total, i / total) };
                let mut tc = [0; 3];
                for d in (0..3).rev() {
                    tc[d] = t % taps[d];
                    t /= taps[d];
                }
                (ch * ch_stride, [0, 1, 2].map(|d| tc[d] * dil[d]))
            }
        }
    }

    /// The element of `g` made of its indices `mn` and `k` (`gt_offset`): its offset, or None
    /// outside the tensor (or off a block-diagonal operand's blocks).
    fn element(g: &Gather, mn: i64, k: i64) -> Option<i64> {
        let (mut mn, mut k) = (mn, k);
        let mut inside = true;
        if let (Some(b), Index::Taps { taps, channels, tap_major, .. }) = (&g.block, &g.k) {
            // The blocks of the m/n value and of the k index's channel; each index as the
            // tensor sees it (its place in its block where it wraps).
            let total: i64 = taps.iter().product();
            let (t, ch) = if *tap_major { (k / channels, k % channels) } else { (k % total, k / total) };
            inside &= mn / b.mn == ch / b.ch;
            if b.mn_wrap {
                mn %= b.mn;
            }
            if b.ch_wrap {
                // (The channel's share of the offset only: the tap's stays.)
                let ch = ch % b.ch;
                k = if *tap_major { t * channels + ch } else { ch * total + t };
            }
        }
        let (a, b) = (part(&g.mn, mn), part(&g.k, k));
        let mut off = a.0 + b.0;
        for (d, ax) in g.axes.iter().enumerate() {
            let mut c = a.1[d] + b.1[d] + ax.base;
            if ax.div > 1 {
                inside &= c >= 0 && c % ax.div == 0;
                c /= ax.div;
            }
            off += c * if ax.extent > 1 { ax.stride } else { 0 };
            inside &= (0..ax.extent).contains(&c);
        }
        inside.then_some(off)
    }

    /// The implicit GEMM of every convolution case without an epilogue computed on the CPU
    /// through its index maps as the kernels read them (a batch `b` of images x groups reading
    /// group `b % groups` of each operand, the rows of image `b / groups`), into the output's
    /// view: the result is the CPU engine's convolution, element for element.
    #[test]
    fn the_maps_of_every_convolution_compute_it() {
        use crate::engine::cuda::conv;
        use crate::engine::cuda::kernel::{Options, Target};
        use crate::graph::ops::Op;
        use crate::testing::{random_inputs, run_cpu};
        let mut seen = (0, 0);
        for c in crate::testing::cases::all().into_iter().filter(|c| c.name.contains("conv") && c.graph.nodes.len() == 1) {
            let mut g = c.graph.clone();
            g.validate().unwrap();
            let Some(view) = conv::as_gemm(&g, 0) else { continue };
            // (A staged view's operands are copies the staging kernels make, not the inputs.)
            if view.stage.is_some() {
                continue;
            }
            let Some(gathers) = view.gathers.as_ref() else { continue };
            let node = &view.graph.nodes[0];
            assert!(matches!(node.op, Op::Matmul(_)));
            let (a, b, out) = (node.input("a").unwrap(), node.input("b").unwrap(), node.output("c").unwrap());
            // (Types the kernels do not take, f64 say: no problem.)
            let Some(p) = super::super::problem_of(&view.graph, 0, a, b, out, &Target::sm90a(), &Options::default().with_tf32(true), Some(gathers)) else { continue };
            let inputs = random_inputs(&g, 11);
            let want = run_cpu(&g, &inputs).unwrap();
            // The tensors' buffers at their strides.
            let strided = |t: crate::graph::TensorId, dense: &[f64]| -> Vec<f64> {
                let d = g.desc(t);
                let mut buf = vec![0.0; d.extent_elements().unwrap() as usize];
                let mut idx = vec![0i64; d.dims.len()];
                for &v in dense {
                    let o: i64 = idx.iter().zip(&d.strides).map(|(i, s)| i * s).sum();
                    buf[o as usize] = v;
                    for a in (0..idx.len()).rev() {
                        idx[a] += 1;
                        if idx[a] < d.dims[a] {
                            break;
                        }
                        idx[a] = 0;
                    }
                }
                buf
            };
            let (pa, pb) = (&p.a, &p.b);
            let (ga, gb) = (pa.gather.as_ref().unwrap(), pb.gather.as_ref().unwrap());
            let (abuf, bbuf) = (strided(pa.tensor, &inputs[&pa.tensor].data), strided(pb.tensor, &inputs[&pb.tensor].data));
            let mut cbuf = vec![f64::NAN; g.desc(out).extent_elements().unwrap() as usize];
            let groups = p.groups as i64;
            for bt in 0..p.batch as i64 {
                let (img, grp) = (bt / groups, bt % groups);
                for m in 0..p.m as i64 {
                    for n in 0..p.n as i64 {
                        let mut sum = 0.0;
                        for k in 0..p.k as i64 {
                            let x = element(ga, img * p.m as i64 + m, k).map_or(0.0, |o| abuf[(grp * pa.batch_stride + o) as usize]);
                            let y = element(gb, n, k).map_or(0.0, |o| bbuf[(grp * pb.batch_stride + o) as usize]);
                            sum += x * y;
                        }
                        let o = bt * p.c.batch_stride + m * p.c.row_stride + n * p.c.col_stride;
                        assert!(cbuf[o as usize].is_nan(), "{}: element {o} written twice", c.name);
                        cbuf[o as usize] = sum;
                    }
                }
            }
            // Each element as the output's type rounds it (the CPU engine's sums differ from
            // these in order: a few units in the last place of f32 sums).
            let reference = strided(out, &want[&out].data);
            let dt = p.c.dtype;
            let eps = match dt {
                crate::DataType::F16 => 2f64.powi(-10),
                crate::DataType::Bf16 => 2f64.powi(-7),
                _ => 1e-5,
            };
            let scale = reference.iter().fold(0f64, |m, v| m.max(v.abs()));
            for (o, (&got, &want)) in cbuf.iter().zip(&reference).enumerate() {
                let mut bytes = [0u8; 8];
                dt.write(&mut bytes, 0, got);
                let got = dt.read(&bytes, 0);
                assert!((got - want).abs() <= eps * want.abs() + 1e-6 * scale, "{}: element {o}: {got} (the CPU engine's {want})", c.name);
            }
            seen.0 += 1;
            seen.1 += (groups > 1) as usize;
        }
        assert!(seen.0 > 60 && seen.1 > 30, "{seen:?}");
    }

    #[test]
    fn defines_name_every_constant() {
        let text = nhwc_image().defines(Source::new(), "GA_").build();
        for name in ["GA_MN_KIND 1", "GA_K_KIND 2", "GA_PX_N 560", "GA_PX_OFF1 -1", "GA_TP_CH 16", "GA_TP_TM 1", "GA_E2 7", "GA_S0 0", "GA_DIV1 1"] {
            assert!(text.contains(&format!("#define {name}\n")), "{name} in {text}");
        }
    }
}
