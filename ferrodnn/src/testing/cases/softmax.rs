//! Softmax cases: softmax and log-softmax over the last, a middle and the first axis, with and
//! without the stats output, short rows (thread per row) and long rows (block per row),
//! transposed and padded strides; the backward of both forms. f32, f16, bf16, f64.

use super::Case;
use crate::{DataType, Graph, TensorDesc};

/// A shape and layout with the axis normalized over.
#[derive(Clone, Copy)]
struct Config {
    what: &'static str,
    dims: &'static [i64],
    /// Storage order (outermost first), or padded strides, or row-major.
    layout: Layout,
    axis: usize,
}

#[derive(Clone, Copy)]
enum Layout {
    RowMajor,
    Order(&'static [usize]),
    Strides(&'static [i64]),
}

impl Config {
    fn desc(&self, name: &str, dt: DataType) -> TensorDesc {
        let d = TensorDesc::new(name, self.dims, dt);
        match self.layout {
            Layout::RowMajor => d,
            Layout::Order(o) => d.with_layout(o),
            Layout::Strides(s) => d.with_strides(s),
        }
    }
}

const LAST: Config = Config { what: "last", dims: &[7, 13], layout: Layout::RowMajor, axis: 1 };
const MIDDLE_TRANSPOSED: Config = Config { what: "middle_transposed", dims: &[5, 9, 7], layout: Layout::Order(&[2, 0, 1]), axis: 1 };
const FIRST_CHANNELS_LAST: Config = Config { what: "first_nhwc", dims: &[13, 3, 5, 2], layout: Layout::Order(&[0, 2, 3, 1]), axis: 0 };
const LONG_MIDDLE: Config = Config { what: "long_middle", dims: &[4, 200, 3], layout: Layout::RowMajor, axis: 1 };
const LONG_PADDED: Config = Config { what: "long_padded", dims: &[3, 517], layout: Layout::Strides(&[530, 1]), axis: 1 };

fn forward(c: Config, dt: DataType, log: bool, stats: bool, stats_dt: Option<DataType>) -> Case {
    let op = if log { "log_softmax" } else { "softmax" };
    let name = format!("softmax_{op}_{}{}_{dt}", c.what, if stats { "_stats" } else { "" });
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let x = g.tensor(c.desc("x", dt));
    let (y, s) = g.softmax(x, c.axis, log, stats);
    g.set_output(y);
    g.desc_mut(y).name = "y".into();
    if let Some(s) = s {
        g.set_output(s);
        g.desc_mut(s).name = "stats".into();
        if let Some(sd) = stats_dt {
            g.desc_mut(s).data_type = Some(sd);
        }
    }
    Case::new(name, g)
}

/// `y` in the config's layout, `dy` row-major, `dx` following `dy`.
fn backward(c: Config, dt: DataType, log: bool) -> Case {
    let op = if log { "log_softmax" } else { "softmax" };
    let name = format!("softmax_backward_{op}_{}_{dt}", c.what);
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let y = g.tensor(c.desc("y", dt));
    let dy = g.tensor(TensorDesc::new("dy", c.dims, dt));
    let dx = g.softmax_backward(y, dy, c.axis, log);
    g.set_output(dx);
    g.desc_mut(dx).name = "dx".into();
    Case::new(name, g)
}

pub(super) fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    let all = [LAST, MIDDLE_TRANSPOSED, FIRST_CHANNELS_LAST, LONG_MIDDLE, LONG_PADDED];
    for log in [false, true] {
        for (i, c) in all.into_iter().enumerate() {
            let stats = i % 2 == 0;
            v.push(forward(c, DataType::F32, log, stats, None));
            v.push(backward(c, DataType::F32, log));
        }
        for dt in [DataType::F16, DataType::Bf16, DataType::F64] {
            let stats_dt = if dt == DataType::F64 { DataType::F64 } else { DataType::F32 };
            v.push(forward(LAST, dt, log, true, Some(stats_dt)));
            v.push(forward(LONG_MIDDLE, dt, log, true, Some(stats_dt)));
            v.push(forward(MIDDLE_TRANSPOSED, dt, log, false, None));
            v.push(backward(MIDDLE_TRANSPOSED, dt, log));
            v.push(backward(LONG_PADDED, dt, log));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use crate::testing::{random_inputs, run_cpu};

    #[test]
    fn softmax_cases_validate_and_run_on_the_cpu() {
        for c in super::cases() {
            let mut g = c.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", c.name));
            run_cpu(&c.graph, &random_inputs(&g, 1)).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        }
    }
}
