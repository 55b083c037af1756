//! Engines and plans of the backend API on ferrodnn's planner.
//!
//! An operation graph's engines are its handle's candidate plans, best first
//! ([`ferrodnn::Handle::candidates`]: the engine and knobs of each, with behavior notes, nothing
//! compiled): engine `i` (CUDNN_ATTR_ENGINE_GLOBAL_INDEX) is candidate `i`, and
//! CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT their number. Heuristics in modes INSTANT, A
//! and B give every candidate in the planner's order; FALLBACK gives the last, the most general
//! one (the CUDA engine's unfused plan on a GPU handle, the f64 reference on a CPU handle). The
//! engines expose no cuDNN knobs (their knobs are part of the candidate). An engine
//! configuration's workspace size, and its execution plan, are the plan built on the graph's
//! handle (compiled once: the handle's plan cache keeps it). A plan serializes to JSON as its
//! graph and candidate; a plan finalized from that JSON (and a handle) rebuilds them.

use super::attrs::*;
use super::graph::{op_graph, policy, OpGraph};
use super::{finalized, Built, Snapshot, Value};
use crate::api::*;
use crate::exec::Call;
use crate::handle::{handle, HandleState};
use crate::types::*;
use ferrodnn::engine::{BehaviorNotes, PlanDesc};
use ferrodnn::{Graph, Plan, ShapeOverrides};
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

/// One engine of an operation graph: its candidate plan, and the plan once built on the
/// graph's handle.
pub struct EngineInfo {
    pub graph: Arc<OpGraph>,
    pub index: usize,
    pub desc: PlanDesc,
    pub notes: BehaviorNotes,
    plan: OnceLock<Result<Arc<Plan>, ApiError>>,
}

impl std::fmt::Debug for EngineInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EngineInfo({}, {:?})", self.index, self.desc)
    }
}

impl EngineInfo {
    fn new(graph: Arc<OpGraph>, index: usize) -> R<EngineInfo> {
        let cands = graph.candidates.as_ref().map_err(|e| e.clone())?;
        let (desc, notes) = cands.get(index).cloned().ok_or_else(|| {
            bad(format!("engine global index {index} is out of range: this operation graph has {} engine(s) (CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT)", cands.len()))
        })?;
        Ok(EngineInfo { graph, index, desc, notes, plan: OnceLock::new() })
    }

    /// The plan on the graph's handle (built the first time it is asked for).
    pub fn plan(&self) -> R<Arc<Plan>> {
        self.plan.get_or_init(|| build_plan(&self.graph.handle, &self.graph.graph, &self.desc)).clone()
    }
}

fn build_plan(h: &HandleState, g: &Graph, desc: &PlanDesc) -> R<Arc<Plan>> {
    let p = h.fd.plan_from_desc(g, desc).map_err(ApiError::from)?;
    if crate::api::log_level() >= 2 {
        let knobs: Vec<String> = p.desc.knobs.iter().map(|k| format!("{}={}", k.name, k.value)).collect();
        crate::api::log(&format!("backend plan built on {} [{}], workspace {} bytes", p.engine().name(), knobs.join(", "), p.workspace_size()));
    }
    Ok(Arc::new(p))
}

fn engine_info(s: &Snapshot) -> Option<&Arc<EngineInfo>> {
    match &s.built {
        Built::Engine(e) => Some(e),
        _ => None,
    }
}

/// The ENGINE and ENGINECFG snapshots of engine `index` of the graph `graph_snap`.
fn engine_snapshots(graph_snap: &Arc<Snapshot>, og: &Arc<OpGraph>, index: usize) -> R<(Arc<Snapshot>, Arc<Snapshot>)> {
    let info = Arc::new(EngineInfo::new(og.clone(), index)?);
    let mut attrs = BTreeMap::new();
    attrs.insert(ENGINE_OPERATION_GRAPH, Value::descs(vec![graph_snap.clone()]));
    attrs.insert(ENGINE_GLOBAL_INDEX, Value::int64s(&[index as i64]));
    let engine = Arc::new(Snapshot { kind: ENGINE, attrs, built: Built::Engine(info.clone()) });
    let mut attrs = BTreeMap::new();
    attrs.insert(ENGINECFG_ENGINE, Value::descs(vec![engine.clone()]));
    attrs.insert(ENGINECFG_KNOB_CHOICES, Value::descs(Vec::new()));
    let cfg = Arc::new(Snapshot { kind: ENGINECFG, attrs, built: Built::Engine(info) });
    Ok((engine, cfg))
}

fn graph_of(s: &Snapshot, attr: i32) -> R<(Arc<Snapshot>, Arc<OpGraph>)> {
    let g = s.need_desc(attr)?.clone();
    let og = match &g.built {
        Built::Subgraph(_) => return Err(bad(format!("{} is an attention operation's score-modifier subgraph, which runs only inside that operation", s.what(attr)))),
        _ => op_graph(&g).ok_or_else(|| bad(format!("{} is not an operation graph", s.what(attr))))?.clone(),
    };
    Ok((g, og))
}

/// Engine heuristics: the engine configurations of the graph's candidates for the mode.
pub fn finalize_heuristics(s: &Snapshot) -> R<Vec<Arc<Snapshot>>> {
    let (gs, og) = graph_of(s, ENGINEHEUR_OPERATION_GRAPH)?;
    let mode = s.need_int(ENGINEHEUR_MODE)?;
    if !(HEUR_MODE_INSTANT..=HEUR_MODE_A).contains(&mode) {
        return Err(bad(format!("CUDNN_ATTR_ENGINEHEUR_MODE {mode} is not a cudnnBackendHeurMode_t")));
    }
    let n = og.candidates.as_ref().map_err(|e| e.clone())?.len();
    let indices: Vec<usize> = if mode == HEUR_MODE_FALLBACK { vec![n - 1] } else { (0..n).collect() };
    indices.into_iter().map(|i| engine_snapshots(&gs, &og, i).map(|(_, cfg)| cfg)).collect()
}

pub fn finalize_engine(s: &Snapshot) -> R<Arc<EngineInfo>> {
    let (_, og) = graph_of(s, ENGINE_OPERATION_GRAPH)?;
    let index = s.i64_(ENGINE_GLOBAL_INDEX).ok_or_else(|| bad("CUDNN_ATTR_ENGINE_GLOBAL_INDEX of the ENGINE descriptor is required but was not set"))?;
    if index < 0 {
        return Err(bad(format!("CUDNN_ATTR_ENGINE_GLOBAL_INDEX must be non-negative, got {index}")));
    }
    Ok(Arc::new(EngineInfo::new(og, index as usize)?))
}

pub fn finalize_engine_config(s: &Snapshot) -> R<Arc<EngineInfo>> {
    let e = s.need_desc(ENGINECFG_ENGINE)?;
    let info = engine_info(e).ok_or_else(|| bad("CUDNN_ATTR_ENGINECFG_ENGINE is not an engine"))?.clone();
    if let Some(k) = s.descs(ENGINECFG_KNOB_CHOICES).first() {
        let ty = k.int(KNOB_CHOICE_KNOB_TYPE).unwrap_or(-1);
        return Err(unsupported(format!(
            "engine {} has no knob of type {ty}: ferrodnn's engines take no cuDNN knobs (each engine index is one plan with its own knobs, {:?})",
            info.index, info.desc.knobs
        )));
    }
    Ok(info)
}

/// A finalized execution plan: its engine and the plan on the handle it was finalized for;
/// executing on another handle builds (once) a plan there.
pub struct PlanState {
    pub engine: Arc<EngineInfo>,
    pub handle: Arc<HandleState>,
    pub plan: Arc<Plan>,
    others: Mutex<Vec<(usize, Arc<Plan>)>>,
}

impl std::fmt::Debug for PlanState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PlanState({:?})", self.engine)
    }
}

impl PlanState {
    /// The plan for handle `h`.
    pub fn plan_for(&self, h: &Arc<HandleState>) -> R<Arc<Plan>> {
        if Arc::ptr_eq(h, &self.handle) {
            return Ok(self.plan.clone());
        }
        let key = Arc::as_ptr(h) as usize;
        let mut others = self.others.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, p)) = others.iter().find(|(k, _)| *k == key) {
            return Ok(p.clone());
        }
        let p = build_plan(h, &self.engine.graph.graph, &self.engine.desc)
            .map_err(|e| ApiError::new(e.status, format!("the plan was finalized for another handle and cannot run on this one: {}", e.msg)))?;
        others.push((key, p.clone()));
        Ok(p)
    }
}

/// What a plan serializes to.
fn plan_json(ps: &PlanState) -> R<String> {
    let graph = serde_json::to_value(&ps.engine.graph.graph).map_err(|e| ApiError::new(CUDNN_STATUS_INTERNAL_ERROR, format!("the plan's graph could not be serialized: {e}")))?;
    let plan = serde_json::to_value(&ps.engine.desc).map_err(|e| ApiError::new(CUDNN_STATUS_INTERNAL_ERROR, format!("the plan could not be serialized: {e}")))?;
    let v = serde_json::json!({ "format": "ferrodnn-cudnn-plan", "version": 1, "engine": ps.engine.index, "plan": plan, "graph": graph });
    Ok(v.to_string())
}

/// An execution plan from its JSON (CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION) on handle `h`.
fn plan_from_json(text: &[u8], h: Arc<HandleState>) -> R<(Arc<EngineInfo>, Arc<Snapshot>)> {
    let text = std::str::from_utf8(text).map_err(|_| bad("the plan JSON is not UTF-8"))?;
    let text = text.trim_end_matches('\0');
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(format!("the plan JSON is malformed: {e}")))?;
    if v.get("format").and_then(|f| f.as_str()) != Some("ferrodnn-cudnn-plan") {
        return Err(bad("the JSON is not a plan serialized by ferrodnn's libcudnn (format \"ferrodnn-cudnn-plan\")"));
    }
    let graph_text = v.get("graph").map(|g| g.to_string()).unwrap_or_default();
    let graph = Graph::from_json(&graph_text).map_err(|e| bad(format!("the plan JSON's graph: {e}")))?;
    let desc: PlanDesc = serde_json::from_value(v.get("plan").cloned().unwrap_or_default()).map_err(|e| bad(format!("the plan JSON's plan: {e}")))?;
    let candidates = h.fd.candidates(&graph, &policy(&h)).map_err(ApiError::from);
    let index = candidates.as_ref().ok().and_then(|c| c.iter().position(|(d, _)| *d == desc)).unwrap_or(0);
    let og = Arc::new(OpGraph { graph, handle: h, candidates: Ok(vec![]) });
    let notes = og.handle.fd.behavior(&og.graph, &desc).map_err(ApiError::from)?;
    let info = Arc::new(EngineInfo { graph: og.clone(), index, desc, notes, plan: OnceLock::new() });
    let graph_snap = Arc::new(Snapshot { kind: OPERATIONGRAPH, attrs: BTreeMap::new(), built: Built::Graph(og) });
    let mut attrs = BTreeMap::new();
    attrs.insert(ENGINE_OPERATION_GRAPH, Value::descs(vec![graph_snap]));
    attrs.insert(ENGINE_GLOBAL_INDEX, Value::int64s(&[index as i64]));
    let engine = Arc::new(Snapshot { kind: ENGINE, attrs, built: Built::Engine(info.clone()) });
    let mut attrs = BTreeMap::new();
    attrs.insert(ENGINECFG_ENGINE, Value::descs(vec![engine]));
    attrs.insert(ENGINECFG_KNOB_CHOICES, Value::descs(Vec::new()));
    let cfg = Arc::new(Snapshot { kind: ENGINECFG, attrs, built: Built::Engine(info.clone()) });
    Ok((info, cfg))
}

pub fn finalize_plan(s: &mut Snapshot) -> R<Arc<PlanState>> {
    let given = match s.value(EXECUTION_PLAN_HANDLE).and_then(|v| v.ptrs().first().copied()) {
        Some(p) => Some(handle(p as cudnnHandle_t).map_err(|e| bad(format!("CUDNN_ATTR_EXECUTION_PLAN_HANDLE: {}", e.msg)))?),
        None => None,
    };
    let engine = match s.desc(EXECUTION_PLAN_ENGINE_CONFIG) {
        Some(cfg) => engine_info(cfg).ok_or_else(|| bad("CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG is not an engine configuration"))?.clone(),
        None => match s.value(EXECUTION_PLAN_JSON_REPRESENTATION) {
            Some(json) => {
                let h = match &given {
                    Some(h) => h.clone(),
                    None => crate::handle::default_handle()?,
                };
                let (info, cfg) = plan_from_json(&json.bytes, h)?;
                s.attrs.insert(EXECUTION_PLAN_ENGINE_CONFIG, Value::descs(vec![cfg]));
                info
            }
            None => {
                return Err(bad(
                    "CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG of the EXECUTION_PLAN descriptor is required (or CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION) but was not set",
                ))
            }
        },
    };
    let h = given.unwrap_or_else(|| engine.graph.handle.clone());
    let plan = if Arc::ptr_eq(&h, &engine.graph.handle) { engine.plan()? } else { build_plan(&h, &engine.graph.graph, &engine.desc)? };
    Ok(Arc::new(PlanState { engine, handle: h, plan, others: Mutex::new(Vec::new()) }))
}

/// A finalized variant pack: pointers by uid, the workspace, and the shape overrides.
#[derive(Debug, Clone)]
pub struct PackInfo {
    pub uids: Vec<i64>,
    pub ptrs: Vec<usize>,
    pub workspace: usize,
    pub overrides: ShapeOverrides,
}

/// The layout of a C++ `std::vector` (libstdc++, libc++ and MSVC alike): the first element, one
/// past the last, one past the storage.
#[repr(C)]
struct CxxVector<T> {
    begin: *const T,
    end: *const T,
    cap: *const T,
}

/// Reads the `std::vector<std::vector<int64_t>>` the frontend gives CUDNN_ATTR_VARIANT_PACK_OVERRIDE_SHAPES
/// and _STRIDES (a pointer to it, as a VOID_PTR), expecting `n` entries of at most MAX_RANK each.
fn read_cxx_lists(attr: &str, ptr: usize, n: usize) -> R<Vec<Vec<i64>>> {
    if ptr == 0 {
        return Err(bad(format!("{attr} is a null pointer but CUDNN_ATTR_VARIANT_PACK_OVERRIDE_UNIQUE_IDS has {n} uids")));
    }
    if !ptr.is_multiple_of(std::mem::align_of::<CxxVector<i64>>()) {
        return Err(bad(format!("{attr} ({ptr:#x}) is not an aligned pointer to a std::vector<std::vector<int64_t>>")));
    }
    let span = |v: &CxxVector<i64>| -> Option<usize> {
        let (b, e) = (v.begin as usize, v.end as usize);
        (e >= b && (e - b).is_multiple_of(8) && (v.cap as usize) >= e && b.is_multiple_of(8)).then_some((e - b) / 8)
    };
    // SAFETY: cuDNN's contract for this attribute: the pointer is to a live
    // std::vector<std::vector<int64_t>> (the frontend passes its own, alive until the execution
    // that finalizes this pack), whose layout is three pointers; checked aligned and non-null.
    let outer = unsafe { &*(ptr as *const CxxVector<CxxVector<i64>>) };
    let (b, e) = (outer.begin as usize, outer.end as usize);
    let size = std::mem::size_of::<CxxVector<i64>>();
    if e < b || !(e - b).is_multiple_of(size) || (b != e && !b.is_multiple_of(std::mem::align_of::<CxxVector<i64>>())) {
        return Err(bad(format!("{attr} does not point to a std::vector<std::vector<int64_t>> (its begin {b:#x} and end {e:#x} are not a span of vectors)")));
    }
    if (e - b) / size != n {
        return Err(bad(format!("{attr} has {} entries but CUDNN_ATTR_VARIANT_PACK_OVERRIDE_UNIQUE_IDS has {n} uids; give one per uid", (e - b) / size)));
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: `i < n` entries of the outer vector's live, aligned storage (checked above).
        let inner = unsafe { &*outer.begin.add(i) };
        let len = span(inner)
            .filter(|&l| l <= ferrodnn::graph::MAX_RANK)
            .ok_or_else(|| bad(format!("{attr}: entry {i} is not a std::vector<int64_t> of at most {} values", ferrodnn::graph::MAX_RANK)))?;
        // SAFETY: `len` int64 values of the inner vector's live, aligned storage (checked by `span`).
        out.push(if len == 0 { Vec::new() } else { unsafe { std::slice::from_raw_parts(inner.begin, len) }.to_vec() });
    }
    Ok(out)
}

pub fn finalize_pack(s: &Snapshot) -> R<PackInfo> {
    let uids = s.i64s(VARIANT_PACK_UNIQUE_IDS).unwrap_or_default();
    let ptrs = s.value(VARIANT_PACK_DATA_POINTERS).map(|v| v.ptrs()).unwrap_or_default();
    if uids.len() != ptrs.len() {
        return Err(bad(format!("the variant pack has {} unique ids but {} data pointers; give one pointer per uid", uids.len(), ptrs.len())));
    }
    let mut seen = HashSet::new();
    if let Some(u) = uids.iter().find(|u| !seen.insert(**u)) {
        return Err(bad(format!("uid {u} appears twice in the variant pack")));
    }
    let override_uids = s.i64s(VARIANT_PACK_OVERRIDE_UNIQUE_IDS).unwrap_or_default();
    let overrides = if override_uids.is_empty() {
        ShapeOverrides::new()
    } else {
        let n = override_uids.len();
        let list = |attr: i32, name: &str| read_cxx_lists(name, s.value(attr).and_then(|v| v.ptrs().first().copied()).unwrap_or(0), n);
        let shapes = list(VARIANT_PACK_OVERRIDE_SHAPES, "CUDNN_ATTR_VARIANT_PACK_OVERRIDE_SHAPES")?;
        let strides = list(VARIANT_PACK_OVERRIDE_STRIDES, "CUDNN_ATTR_VARIANT_PACK_OVERRIDE_STRIDES")?;
        ShapeOverrides::from_lists(&override_uids, &shapes, &strides).map_err(ApiError::from)?
    };
    let workspace = s.value(VARIANT_PACK_WORKSPACE).and_then(|v| v.ptrs().first().copied()).unwrap_or(0);
    Ok(PackInfo { uids, ptrs, workspace, overrides })
}

fn plan_state(s: &Snapshot) -> R<&Arc<PlanState>> {
    match &s.built {
        Built::Plan(p) => Ok(p),
        _ => Err(bad(format!("`executionPlan` is a {}, not an EXECUTION_PLAN descriptor", kind_name(s.kind)))),
    }
}

/// The attributes cudnnBackendGetAttribute derives rather than gives back (`None`: the stored
/// value).
pub fn computed(s: &Snapshot, attr: i32) -> R<Option<Value>> {
    let v = match (s.kind, attr) {
        (ENGINEHEUR, ENGINEHEUR_RESULTS) => match &s.built {
            Built::Heuristics(r) => Value::descs(r.clone()),
            _ => return Ok(None),
        },
        (OPERATIONGRAPH, OPERATIONGRAPH_ENGINE_GLOBAL_COUNT) => {
            let n = op_graph(s).and_then(|g| g.candidates.as_ref().ok()).map_or(0, |c| c.len());
            Value::int64s(&[n as i64])
        }
        (ENGINE, ENGINE_KNOB_INFO | ENGINE_LAYOUT_INFO) | (ENGINECFG, ENGINECFG_INTERMEDIATE_INFO) => Value::descs(Vec::new()),
        (ENGINE, ENGINE_NUMERICAL_NOTE) => {
            let Some(e) = engine_info(s) else { return Ok(None) };
            // Reduced precision (tf32 math on f32 data, fp8's fast accumulation) is TENSOR_CORE,
            // as NVIDIA marks its tf32 engines: DOWN_CONVERT_INPUTS would make PyTorch, which
            // drops every engine carrying it (Conv_v8's filter), never pick them.
            let mut notes = Vec::new();
            if e.notes.reduced_precision {
                notes.push(NUMERICAL_NOTE_TENSOR_CORE);
            }
            if !e.notes.deterministic {
                notes.push(NUMERICAL_NOTE_NONDETERMINISTIC);
            }
            Value::int32s(T_NUMERICAL_NOTE, &notes)
        }
        (ENGINE, ENGINE_BEHAVIOR_NOTE) => {
            let Some(e) = engine_info(s) else { return Ok(None) };
            let notes: Vec<i32> = if e.notes.runtime_compiled { vec![BEHAVIOR_NOTE_RUNTIME_COMPILATION] } else { Vec::new() };
            Value::int32s(T_BEHAVIOR_NOTE, &notes)
        }
        (ENGINECFG, ENGINECFG_WORKSPACE_SIZE) => {
            let Some(e) = engine_info(s) else { return Ok(None) };
            Value::int64s(&[e.plan()?.workspace_size() as i64])
        }
        (ENGINECFG, ENGINECFG_SHARED_MEMORY_USED) => Value::int32s(T_INT32, &[0]),
        (EXECUTION_PLAN, EXECUTION_PLAN_WORKSPACE_SIZE) => Value::int64s(&[plan_state(s)?.plan.workspace_size() as i64]),
        (EXECUTION_PLAN, EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS) => Value::int64s(&[]),
        (EXECUTION_PLAN, EXECUTION_PLAN_JSON_REPRESENTATION) => Value::from_bytes(T_CHAR, plan_json(plan_state(s)?)?.into_bytes()),
        _ => return Ok(None),
    };
    Ok(Some(v))
}

/// The plan and variant pack of an Execute call, checked.
fn plan_and_pack(h: cudnnHandle_t, plan: *mut std::ffi::c_void, pack: *mut std::ffi::c_void) -> R<(Arc<HandleState>, Arc<Plan>, Option<PackInfo>)> {
    let h = handle(h)?;
    let ps = finalized(plan, "executionPlan")?;
    let p = plan_state(&ps)?.plan_for(&h)?;
    let pk = if pack.is_null() {
        None
    } else {
        let s = finalized(pack, "variantPack")?;
        match &s.built {
            Built::Pack(p) => Some(p.clone()),
            _ => return Err(bad(format!("`variantPack` is a {}, not a VARIANT_PACK descriptor", kind_name(s.kind)))),
        }
    };
    Ok((h, p, pk))
}

pub fn plan_workspace(h: cudnnHandle_t, plan: *mut std::ffi::c_void, pack: *mut std::ffi::c_void) -> R<usize> {
    Ok(plan_and_pack(h, plan, pack)?.1.workspace_size())
}

/// cudnnBackendExecute: the plan on the variant pack's pointers, on the handle's stream.
pub fn execute(h: cudnnHandle_t, plan: *mut std::ffi::c_void, pack: *mut std::ffi::c_void) -> R<()> {
    non_null(pack as *const u8, "variantPack")?;
    let (h, plan, pk) = plan_and_pack(h, plan, pack)?;
    let pk = pk.ok_or_else(|| ApiError::new(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "`variantPack` is a null pointer"))?;
    // The caller's workspace is as large as the finalized plan asked; a plan for overridden
    // shapes that needs more runs on the handle's own.
    let workspace_given = plan.workspace_size();
    let plan = if pk.overrides.is_empty() { plan } else { Arc::new(h.fd.plan_with_overrides(&plan, &pk.overrides).map_err(ApiError::from)?) };
    let g = plan.graph();
    let produced: HashSet<usize> = g.output_tensors().into_iter().map(|t| t.0).collect();
    let mut call = Call::default();
    for t in g.io_tensors() {
        let d = g.desc(t);
        let uid = d.uid.unwrap_or(-1);
        let what = if produced.contains(&t.0) { "writes" } else { "reads" };
        let i = pk
            .uids
            .iter()
            .position(|&u| u == uid)
            .ok_or_else(|| bad(format!("the variant pack has no pointer for uid {uid} (tensor dims {:?}), which the plan {what}", d.dims)))?;
        let ptr = pk.ptrs[i];
        let dt = g.resolved_data_type(t).unwrap_or(ferrodnn::DataType::F32);
        let name = format!("the pointer of uid {uid}");
        if d.is_pass_by_value {
            non_null(ptr as *const u8, &name)?;
            // SAFETY: a by-value tensor's pointer is host memory holding one element of its type
            // (cuDNN's contract), read before the call returns.
            let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, dt.size()) }.to_vec();
            call.scalars.push((uid, bytes));
        } else {
            let bytes = d.extent_elements().unwrap_or(0) as usize * dt.size();
            if produced.contains(&t.0) {
                call.output(uid, ptr as *mut std::ffi::c_void, bytes, &name)?;
            } else {
                call.input(uid, ptr as *const std::ffi::c_void, bytes, &name)?;
            }
        }
    }
    call.workspace = (pk.workspace, workspace_given);
    crate::exec::execute(&h, &plan, &call)
}
