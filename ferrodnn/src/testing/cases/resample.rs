//! Resample (pooling) cases: max and both averages, 1D, 2D and 3D, symmetric and asymmetric
//! padding, stride larger than the window, channels-last layouts; forward and backward;
//! f32, f16, f64, and i32 max (whose many ties check the first-argmax rule).

use super::Case;
use crate::graph::ops::resample::{ResampleAttrs, ResampleMode};
use crate::{DataType, Graph, TensorDesc};

const MODES: [ResampleMode; 3] = [ResampleMode::Max, ResampleMode::AvgIncludePadding, ResampleMode::AvgExcludePadding];

/// One pooling problem: `x`'s dims, its storage order (None: row-major) and the attributes
/// (window, stride, pre, post per spatial dim).
#[derive(Clone, Copy)]
struct Config {
    what: &'static str,
    dims: &'static [i64],
    order: Option<&'static [usize]>,
    window: &'static [i64],
    stride: &'static [i64],
    pre: &'static [i64],
    post: &'static [i64],
}

impl Config {
    fn attrs(&self, mode: ResampleMode) -> ResampleAttrs {
        ResampleAttrs { mode, window: self.window.to_vec(), stride: self.stride.to_vec(), pre_padding: self.pre.to_vec(), post_padding: self.post.to_vec() }
    }

    fn x(&self, dt: DataType) -> TensorDesc {
        let d = TensorDesc::new("x", self.dims, dt);
        match self.order {
            Some(o) => d.with_layout(o),
            None => d,
        }
    }
}

const P2D: Config = Config { what: "2d_w3s2p1", dims: &[2, 3, 9, 11], order: None, window: &[3, 3], stride: &[2, 2], pre: &[1, 1], post: &[1, 1] };
const P2D_ASYM: Config = Config { what: "2d_asym_pad", dims: &[2, 3, 9, 11], order: None, window: &[3, 4], stride: &[2, 3], pre: &[1, 0], post: &[2, 3] };
const P2D_GAPS: Config = Config { what: "2d_stride_gt_window", dims: &[2, 3, 9, 11], order: None, window: &[2, 2], stride: &[3, 4], pre: &[1, 0], post: &[0, 1] };
const P2D_NHWC: Config = Config { what: "2d_nhwc_overlap", dims: &[2, 5, 7, 9], order: Some(&[0, 2, 3, 1]), window: &[3, 2], stride: &[1, 2], pre: &[2, 1], post: &[1, 0] };
const P1D: Config = Config { what: "1d", dims: &[2, 5, 13], order: None, window: &[4], stride: &[3], pre: &[2], post: &[1] };
const P1D_NWC: Config = Config { what: "1d_nwc", dims: &[3, 4, 17], order: Some(&[0, 2, 1]), window: &[5], stride: &[2], pre: &[4], post: &[3] };
const P3D: Config = Config { what: "3d", dims: &[1, 3, 5, 6, 7], order: None, window: &[2, 3, 2], stride: &[2, 1, 2], pre: &[1, 1, 0], post: &[1, 0, 1] };
const P3D_NDHWC: Config =
    Config { what: "3d_ndhwc", dims: &[2, 3, 4, 5, 6], order: Some(&[0, 2, 3, 4, 1]), window: &[3, 2, 3], stride: &[2, 3, 1], pre: &[1, 0, 2], post: &[2, 1, 0] };

fn forward(c: Config, mode: ResampleMode, dt: DataType) -> Case {
    let name = format!("resample_{}_{}_{dt}", mode.name(), c.what);
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let x = g.tensor(c.x(dt));
    let y = g.resample(x, c.attrs(mode));
    g.set_output(y);
    g.desc_mut(y).name = "y".into();
    Case::new(name, g)
}

/// `dy` of `dy_dt` (row-major), `x` of `x_dt` in the config's layout, `dx` of `dy_dt`.
fn backward(c: Config, mode: ResampleMode, x_dt: DataType, dy_dt: DataType) -> Case {
    let name =
        if x_dt == dy_dt { format!("resample_backward_{}_{}_{dy_dt}", mode.name(), c.what) } else { format!("resample_backward_{}_{}_{x_dt}_dy_{dy_dt}", mode.name(), c.what) };
    let attrs = c.attrs(mode);
    let y_dims = attrs.output_dims(c.dims).expect("valid pooling config");
    let mut g = Graph::new(name.clone()).io_data_type(dy_dt);
    let dy = g.tensor(TensorDesc::new("dy", &y_dims, dy_dt));
    let x = g.tensor(c.x(x_dt));
    let dx = g.resample_backward(dy, x, attrs);
    g.set_output(dx);
    g.desc_mut(dx).name = "dx".into();
    g.desc_mut(dx).data_type = Some(dy_dt);
    Case::new(name, g)
}

pub(super) fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    let all = [P2D, P2D_ASYM, P2D_GAPS, P2D_NHWC, P1D, P1D_NWC, P3D, P3D_NDHWC];
    for mode in MODES {
        for c in all {
            v.push(forward(c, mode, DataType::F32));
            v.push(backward(c, mode, DataType::F32, DataType::F32));
        }
        for dt in [DataType::F16, DataType::F64] {
            for c in [P2D_NHWC, P3D] {
                v.push(forward(c, mode, dt));
                v.push(backward(c, mode, dt, dt));
            }
        }
    }
    // Integer max pooling: small integers tie often, so the first-maximum rule matters.
    for c in [P2D, P2D_NHWC, P1D, P3D_NDHWC] {
        v.push(forward(c, ResampleMode::Max, DataType::I32));
        v.push(backward(c, ResampleMode::Max, DataType::I32, DataType::F32));
    }
    v.push(backward(P2D_ASYM, ResampleMode::Max, DataType::F16, DataType::F32));
    v
}

#[cfg(test)]
mod tests {
    use crate::testing::{random_inputs, run_cpu};

    #[test]
    fn resample_cases_validate_and_run_on_the_cpu() {
        for c in super::cases() {
            let mut g = c.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", c.name));
            run_cpu(&c.graph, &random_inputs(&g, 1)).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        }
    }
}
