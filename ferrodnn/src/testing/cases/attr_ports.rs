//! Cases whose attributes come from runtime scalars: copies of other families' cases with a
//! by-value scalar (no value in the graph) on every attribute port their ops take (a norm's
//! `epsilon`, batchnorm's `momentum`, attention's `attn_scale`), so that the kernels read them as
//! parameters from each execution's variant pack (random valid values: see `random_inputs`).
//! For each family and op kind, the first two cases of that kind.

use super::{fast_attn, fast_rows, fast_spatial, groupnorm, multi, norm, sdpa, Case};
use crate::dtype::DataType;
use crate::graph::{Port, TensorDesc};
use std::collections::HashMap;

/// Cases taken per family and op kind.
const PER_KIND: usize = 2;

/// `case` with a runtime scalar on each attribute port of its ops, or None when it has none.
pub fn with_attribute_ports(case: &Case) -> Option<Case> {
    let mut g = case.graph.clone();
    let mut any = false;
    for ni in 0..g.nodes.len() {
        for &port in g.nodes[ni].op.attribute_ports() {
            if g.nodes[ni].input(port).is_some() {
                continue;
            }
            let name = format!("{}_{port}", g.nodes[ni].name);
            let t = g.tensor(TensorDesc::runtime_scalar(&name, DataType::F32));
            g.nodes[ni].inputs.push(Port { name: port.to_string(), tensor: t });
            any = true;
        }
    }
    let name = format!("{}_attr_ports", case.name);
    g.name = name.clone();
    any.then(|| Case::new(name, g))
}

pub(super) fn cases() -> Vec<Case> {
    let families = [norm::cases(), sdpa::cases(), multi::cases(), fast_rows::cases(), fast_spatial::cases(), fast_attn::cases(), groupnorm::cases()];
    let mut out = Vec::new();
    for family in families {
        let mut taken: HashMap<&'static str, usize> = HashMap::new();
        for case in &family {
            let Some(kind) = case.graph.nodes.iter().find(|n| !n.op.attribute_ports().is_empty()).map(|n| n.op.kind()) else { continue };
            let n = taken.entry(kind).or_default();
            if *n < PER_KIND {
                if let Some(c) = with_attribute_ports(case) {
                    out.push(c);
                    *n += 1;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::testing::{random_inputs, run_cpu};

    /// Every case validates and runs on the CPU engine, its ports take values from the inputs,
    /// and each op kind that takes ports is covered.
    #[test]
    fn attribute_port_cases_validate_and_run_on_the_cpu() {
        let cases = super::cases();
        let mut kinds = std::collections::HashSet::new();
        for c in &cases {
            let mut g = c.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", c.name));
            let mut ports = 0;
            for n in &g.nodes {
                for (port, t) in n.attribute_inputs() {
                    assert!(g.desc(t).is_pass_by_value && g.desc(t).value.is_none(), "{}: {port}", c.name);
                    kinds.insert(n.op.kind());
                    ports += 1;
                }
            }
            assert!(ports > 0, "{}", c.name);
            let inputs = random_inputs(&g, 3);
            let out = run_cpu(&g, &inputs).unwrap_or_else(|e| panic!("{}: {e}", c.name));
            assert!(out.values().all(|nd| nd.data.iter().all(|v| !v.is_nan())), "{}: NaN", c.name);
        }
        for kind in ["layernorm", "rmsnorm", "instancenorm", "groupnorm", "adalayernorm", "batchnorm", "bn_finalize", "sdpa", "sdpa_backward"] {
            assert!(kinds.contains(kind), "no case gives {kind} an attribute port");
        }
    }
}
