//! What the fuzzers share (issue 29, item 7): the mutation fuzzer of `tests/fuzz.rs` and the
//! coverage-guided libFuzzer targets of `fuzz/` (built by `scripts/fuzz.sh`) put each input
//! through [`graph_json`], under the small host limits of [`set_limits`], starting from the
//! check cases' graphs ([`seed_graphs`]).

use crate::engine::{Handle, PlanPolicy};
use crate::error::Result;
use crate::graph::Graph;
use crate::EngineKind;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;

/// The host memory (256 MiB) and CPU work (2^28 steps a node) allowed to one fuzz input, so that
/// none runs long or takes the machine's memory: sets `FERRODNN_MAX_HOST_BYTES` and
/// `FERRODNN_CPU_MAX_WORK` for this process. Call it before any thread is started.
pub fn set_limits() {
    std::env::set_var(crate::layout::MAX_HOST_BYTES_ENV, "256M");
    std::env::set_var(crate::engine::cpu::budget::MAX_WORK_ENV, "268435456");
}

/// What a user's graph file goes through: deserialize, validate, then plan and execute with
/// random inputs on each CPU engine (the fast one, then the reference); the first error ends
/// it. Returns how many engines ran it.
pub fn graph_json(text: &str) -> Result<usize> {
    let mut g = Graph::from_json(text)?;
    g.validate()?;
    let mut ran = 0;
    for (handle, engine) in [(Handle::cpu(), EngineKind::Cpu), (Handle::reference(), EngineKind::Reference)] {
        let plan = handle.build_plans(&g, &PlanPolicy { engine: Some(engine), ..Default::default() })?.remove(0);
        let inputs = super::try_random_inputs(plan.graph(), 7)?;
        super::execute_plan_dense(&handle, &plan, &inputs)?;
        ran += 1;
    }
    Ok(ran)
}

/// The JSON of every check case whose graph validates (by case name): the fuzzers' seeds.
pub fn seed_graphs() -> Vec<(String, String)> {
    super::cases::all()
        .into_iter()
        .filter_map(|c| {
            let mut g = c.graph;
            g.validate().ok()?;
            Some((c.name, g.to_json().ok()?))
        })
        .collect()
}

/// Writes the seeds into `dir`, one `NAME.json` a case, and `dict`: a libFuzzer dictionary of
/// their object keys and short strings (op names, attributes, data types) as JSON strings, so
/// that mutations can splice them in. Returns (seeds, dictionary words).
pub fn write_seeds(dir: &Path, dict: &Path) -> std::io::Result<(usize, usize)> {
    fn words(v: &Value, out: &mut BTreeSet<String>) {
        match v {
            Value::String(s) if s.len() <= 32 => {
                out.insert(s.clone());
            }
            Value::Array(a) => a.iter().for_each(|x| words(x, out)),
            Value::Object(m) => m.iter().for_each(|(k, x)| {
                out.insert(k.clone());
                words(x, out)
            }),
            _ => {}
        }
    }
    std::fs::create_dir_all(dir)?;
    let seeds = seed_graphs();
    let mut all = BTreeSet::new();
    for (name, text) in &seeds {
        let file: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
        std::fs::write(dir.join(format!("{file}.json")), text)?;
        if let Ok(v) = serde_json::from_str::<Value>(text) {
            words(&v, &mut all);
        }
    }
    // An entry is the word in JSON quotes, itself quoted: printable ASCII, with `"` and `\` as
    // `\xNN`.
    let entry = |w: &String| {
        let esc: String =
            w.chars().filter(|c| c.is_ascii_graphic() || *c == ' ').map(|c| if c == '"' || c == '\\' { format!("\\x{:02x}", c as u32) } else { c.to_string() }).collect();
        format!("\"\\\"{esc}\\\"\"\n")
    };
    std::fs::write(dict, all.iter().map(entry).collect::<String>())?;
    Ok((seeds.len(), all.len()))
}
