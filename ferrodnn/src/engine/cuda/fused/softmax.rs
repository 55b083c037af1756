//! Fast softmax and log-softmax, forward (with or without the log-sum-exp `stats`) and backward
//! (`y`, `dy` -> `dx`), over an axis with every later axis of size 1: the lane-team /
//! block-per-row scheme of [`super::rows`], the row held in registers (`softmax_rows.cuh`).

use super::rows::{aligned, forward_team, norm_team, tensor, vec_width, Gen, Team, MAX_ROW, ROWS_CUH};
use crate::dtype::DataType;
use crate::engine::cuda::kernel::{NodeKernels, Signature};

const SOFTMAX_ROWS_CUH: &str = include_str!("softmax_rows.cuh");

impl Gen<'_> {
    /// The exponential for an output of type `dt`: f32 outputs get the accurate one; 2-byte
    /// outputs the fast one.
    fn exp_fn(&self, dt: DataType) -> &'static str {
        if dt == DataType::F32 {
            "expf"
        } else {
            "__expf"
        }
    }

    /// Softmax / log-softmax forward over `axis` (every later axis of size 1).
    pub(super) fn softmax(&self, axis: usize, log: bool) -> Option<NodeKernels> {
        let n = self.node;
        let x = n.input("x")?;
        let y = n.output("y")?;
        let stats = n.output("stats");
        let xd = self.dims(x).to_vec();
        if axis >= xd.len() || xd[axis + 1..].iter().any(|&d| d != 1) || self.dims(y) != xd.as_slice() {
            return None;
        }
        let rows: i64 = xd[..axis].iter().product();
        let h = xd[axis];
        let v = vec_width(self.dt(x), h);
        let c = h / v;
        let (ts, bs, cpt) = forward_team(h, c, v)?;
        let xt = self.rows(x, axis, v, true)?;
        let yt = self.rows(y, axis, v, true)?;
        let lt = match stats {
            Some(s) => Some(self.rows(s, axis, 1, false)?),
            None => None,
        };
        let mut sig = Signature::new();
        sig.ptr("xp", x, false).ptr("yp", y, true);
        if let Some(s) = &lt {
            sig.ptr("stp", s.id, true);
        }
        let team = Team { n: rows, h, c, v, cpt, ts, bs };
        let entry = self.entry(if log { "log_softmax_rows" } else { "softmax_rows" });
        let mut src = team.source(&entry, &sig, aligned(v, &[("x", &xt), ("y", &yt)]));
        src = src.flag("SM_BACKWARD", false).flag("SM_LOG", log).define("SM_EXP", self.exp_fn(yt.dt)).flag("SM_STATS", lt.is_some());
        src = tensor(tensor(src, "X", &xt), "Y", &yt);
        if let Some(s) = &lt {
            src = tensor(src, "ST", s);
        }
        let source = src.template(ROWS_CUH).template(SOFTMAX_ROWS_CUH).build();
        Some(NodeKernels::one(team.launch(source, entry, sig)))
    }

    /// Softmax / log-softmax backward over `axis` (every later axis of size 1): `y`, `dy` ->
    /// `dx`; softmax: `dx = y * (dy - sum(dy * y))`, log-softmax: `dx = dy - exp(y) * sum(dy)`.
    /// Both rows stay in registers between the row sum and the write.
    pub(super) fn softmax_backward(&self, axis: usize, log: bool) -> Option<NodeKernels> {
        let n = self.node;
        let y = n.input("y")?;
        let dy = n.input("dy")?;
        let dx = n.output("dx")?;
        let yd = self.dims(y).to_vec();
        if axis >= yd.len() || yd[axis + 1..].iter().any(|&d| d != 1) || self.dims(dy) != yd.as_slice() || self.dims(dx) != yd.as_slice() {
            return None;
        }
        let rows: i64 = yd[..axis].iter().product();
        let h = yd[axis];
        // Two rows per thread in registers: at most 16384 elements (16 of each per thread).
        if h > MAX_ROW / 2 {
            return None;
        }
        let v = vec_width(self.dt(y), h);
        let c = h / v;
        let (ts, bs, cpt) = norm_team(h, c, v)?;
        let yt = self.rows(y, axis, v, true)?;
        let dyt = self.rows(dy, axis, v, true)?;
        let dxt = self.rows(dx, axis, v, true)?;
        let mut sig = Signature::new();
        sig.ptr("yp", y, false).ptr("dyp", dy, false).ptr("dxp", dx, true);
        let team = Team { n: rows, h, c, v, cpt, ts, bs };
        let entry = self.entry(if log { "log_softmax_bwd_rows" } else { "softmax_bwd_rows" });
        let mut src = team.source(&entry, &sig, aligned(v, &[("y", &yt), ("dy", &dyt), ("dx", &dxt)]));
        src = src.flag("SM_BACKWARD", true).flag("SM_LOG", log).define("SM_EXP", self.exp_fn(dxt.dt));
        src = tensor(tensor(tensor(src, "Y", &yt), "DY", &dyt), "DX", &dxt);
        let source = src.template(ROWS_CUH).template(SOFTMAX_ROWS_CUH).build();
        Some(NodeKernels::one(team.launch(source, entry, sig)))
    }
}
