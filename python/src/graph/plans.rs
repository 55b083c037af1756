//! The frontend's list of execution plans, over ferrodnn's plans.
//!
//! In the frontend a graph keeps a list of engine configurations: `create_execution_plans`
//! appends the heuristics' choices, `create_execution_plan` one the user composes (an engine id
//! and knob values); each can be deselected by its notes, engine name or workspace; plans are
//! built from it one by one (`build_plan_at_index`) or by policy (`build_plans`); the first built
//! becomes the candidate that `execute` runs. Here each entry is a ferrodnn [`PlanDesc`] (engine,
//! knobs, graph key) with its [`BehaviorNotes`], from [`ferrodnn::Handle::candidates`], and the
//! [`Plan`] once built. Engine ids are positions in the handle's engines (the CUDA engine, then
//! the CPU engine; the CPU engine alone on a CPU handle).

use crate::frontend::{behavior_notes, numerical_notes, PyBehaviorNote, PyKnob, PyKnobType, PyNumericalNote};
use ferrodnn::engine::{BehaviorNotes, Knob, Plan, PlanDesc};
use std::collections::BTreeMap;

/// One execution plan of the graph's list.
pub(super) struct Entry {
    pub desc: PlanDesc,
    pub notes: BehaviorNotes,
    /// The compiled plan, once built.
    pub plan: Option<Plan>,
    /// Why building it failed or why it was refused after building (its workspace): it is not
    /// tried again.
    pub failed: Option<String>,
}

impl Entry {
    pub fn new(desc: PlanDesc, notes: BehaviorNotes) -> Entry {
        Entry { desc, notes, plan: None, failed: None }
    }
}

/// The frontend's name of a plan: its engine and knobs, `cuda[fused=1,tf32=1]` or `cpu[]`
/// (`deselect_engines` matches parts of it).
pub(super) fn plan_name(desc: &PlanDesc) -> String {
    let knobs: Vec<String> = desc.knobs.iter().map(|k| format!("{}={}", k.name, k.value)).collect();
    format!("{}[{}]", desc.engine.name(), knobs.join(","))
}

/// The plan filters of `select_*` / `deselect_*`. The graph keeps them (a rebuilt list is
/// filtered again); they decide which plans are built, not which already are.
#[derive(Clone, Debug, Default)]
pub(super) struct Filters {
    pub deselected_engines: Vec<String>,
    pub max_workspace: Option<i64>,
    pub select_numeric: Vec<PyNumericalNote>,
    pub deselect_numeric: Vec<PyNumericalNote>,
    pub select_behavior: Vec<PyBehaviorNote>,
    pub deselect_behavior: Vec<PyBehaviorNote>,
}

impl Filters {
    /// Why a plan is deselected before it is built, if it is. `deterministic` is an op's request
    /// for deterministic plans (sdpa_backward's `use_deterministic_algorithm`).
    pub fn bars(&self, desc: &PlanDesc, notes: &BehaviorNotes, deterministic: bool) -> Option<String> {
        let name = plan_name(desc);
        if let Some(e) = self.deselected_engines.iter().find(|e| name.contains(e.as_str())) {
            return Some(format!("deselected by deselect_engines ({e:?} is in its name)"));
        }
        let (num, beh) = (numerical_notes(notes), behavior_notes(notes));
        if let Some(n) = self.select_numeric.iter().find(|n| !num.contains(n)) {
            return Some(format!("deselected by select_numeric_notes: it lacks numerical_note.{n:?}"));
        }
        if let Some(n) = self.deselect_numeric.iter().find(|n| num.contains(n)) {
            return Some(format!("deselected by deselect_numeric_notes: it has numerical_note.{n:?}"));
        }
        if let Some(n) = self.select_behavior.iter().find(|n| !beh.contains(n)) {
            return Some(format!("deselected by select_behavior_notes: it lacks behavior_note.{n:?}"));
        }
        if let Some(n) = self.deselect_behavior.iter().find(|n| beh.contains(n)) {
            return Some(format!("deselected by deselect_behavior_notes: it has behavior_note.{n:?}"));
        }
        if deterministic && !notes.deterministic {
            return Some("not deterministic, and sdpa_backward asked for use_deterministic_algorithm".to_string());
        }
        None
    }

    /// Why a built plan is refused for its workspace, if it is.
    pub fn bars_workspace(&self, bytes: usize) -> Option<String> {
        let max = self.max_workspace?;
        (bytes as i128 > max as i128).then(|| format!("its workspace of {bytes} bytes is greater than {max} (deselect_workspace_greater_than)"))
    }
}

/// An engine's knobs for a graph: those its candidate plans set, each with the range of values
/// they give it (absent from a candidate, a knob takes no value there). In order of first use.
pub(super) fn knob_ranges(cands: &[(PlanDesc, BehaviorNotes)]) -> Vec<PyKnob> {
    let mut ranges: BTreeMap<String, (usize, i64, i64)> = BTreeMap::new();
    for k in cands.iter().flat_map(|(d, _)| d.knobs.iter()) {
        let next = ranges.len();
        let r = ranges.entry(k.name.clone()).or_insert((next, k.value, k.value));
        r.1 = r.1.min(k.value);
        r.2 = r.2.max(k.value);
    }
    let mut v: Vec<(usize, PyKnob)> = ranges
        .into_iter()
        .map(|(name, (order, min, max))| (order, PyKnob { knob_type: PyKnobType::NOT_SET, max_value: max, min_value: min, stride: 1, name: Some(name) }))
        .collect();
    v.sort_by_key(|(o, _)| *o);
    v.into_iter().map(|(_, k)| k).collect()
}

/// The knobs of `create_execution_plan`, checked against the engine's (`specs`): each by name
/// (or a `knob` with a name), known to the engine, with a value in its range.
pub(super) fn checked_knobs(engine: &str, specs: &[PyKnob], given: Vec<(KnobKey, i64)>) -> Result<Vec<Knob>, String> {
    let names: Vec<&str> = specs.iter().filter_map(|k| k.name.as_deref()).collect();
    let known = if names.is_empty() { "it has none".to_string() } else { format!("its knobs are {}", names.join(", ")) };
    let mut out: Vec<Knob> = Vec::new();
    for (key, value) in given {
        let name = match key {
            KnobKey::Name(n) => n,
            KnobKey::Type(t) => return Err(format!("engine {engine} has no knob of type knob_type.{t:?} (ferrodnn's knobs are named; {known})")),
        };
        let spec = specs.iter().find(|k| k.name.as_deref() == Some(name.as_str())).ok_or_else(|| format!("engine {engine} has no knob {name:?} ({known})"))?;
        if value < spec.min_value || value > spec.max_value || (value - spec.min_value) % spec.stride != 0 {
            return Err(format!("knob {name:?} of engine {engine} takes {}..={} (stride {}), got {value}", spec.min_value, spec.max_value, spec.stride));
        }
        if out.iter().any(|k| k.name == name) {
            return Err(format!("knob {name:?} is given twice"));
        }
        out.push(Knob { name, value });
    }
    Ok(out)
}

/// A key of `create_execution_plan`'s knob dict.
pub(super) enum KnobKey {
    Name(String),
    Type(PyKnobType),
}
