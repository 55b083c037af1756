//! The backend descriptor API (`cudnnBackend*`): what the cudnn frontend's C++ graph API (and
//! PyTorch's cuDNN paths) build every fused graph with.
//!
//! A descriptor is a type and a set of attributes, each a typed array (`cudnnBackendSetAttribute`
//! checks the attribute belongs to the type, its type and element count, as cuDNN does).
//! `cudnnBackendFinalize` checks the set and freezes it into a [`Snapshot`]: descriptors given as
//! attributes of others are held by snapshot, so a program may destroy them once set (cuDNN
//! copies them too). What a finalized descriptor derives lives in [`Built`]:
//!
//! - an operation graph ([`graph`]) becomes one ferrodnn [`Graph`](ferrodnn::Graph), validated,
//!   with its handle's candidate plans (engine and knobs, best first);
//! - engine heuristics, engines, engine configurations, execution plans and variant packs
//!   ([`engine`]) are those candidates by index (an engine's global index is its candidate's), the
//!   plan built on the handle's engines at finalization, and the pointers by uid;
//! - `cudnnBackendExecute` runs the plan on the handle's stream (device pointers on a GPU
//!   handle, host pointers on the CPU handle) through the legacy calls' executor ([`crate::exec`]).
//!
//! Attribute values are kept as the bytes the program gave ([`Value`]) and given back as they
//! came; `cudnnBackendGetAttribute` also answers the derived attributes (heuristic results,
//! workspace sizes, notes, the plan's JSON).

pub mod attrs;
pub mod engine;
pub mod graph;

use crate::api::*;
use crate::registry::Registry;
use crate::types::*;
use attrs::*;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Arc;

/// Most elements one attribute takes (a guard against a corrupt count, far above any real one).
const MAX_ELEMENTS: i64 = 1 << 24;

/// One attribute's value: its type, element count and bytes as the program gave them, and for
/// a BACKEND_DESCRIPTOR attribute the descriptors, by snapshot.
#[derive(Clone, Debug)]
pub struct Value {
    pub ty: i32,
    pub count: usize,
    pub bytes: Vec<u8>,
    pub descs: Vec<Arc<Snapshot>>,
}

impl Value {
    /// A value of `ty` from the bytes of its elements.
    pub fn from_bytes(ty: i32, bytes: Vec<u8>) -> Value {
        let count = bytes.len() / element_size(ty).max(1);
        Value { ty, count, bytes, descs: Vec::new() }
    }
    pub fn int64s(v: &[i64]) -> Value {
        Value::from_bytes(T_INT64, v.iter().flat_map(|x| x.to_ne_bytes()).collect())
    }
    pub fn int32s(ty: i32, v: &[i32]) -> Value {
        Value::from_bytes(ty, v.iter().flat_map(|x| x.to_ne_bytes()).collect())
    }
    pub fn descs(v: Vec<Arc<Snapshot>>) -> Value {
        Value { ty: T_BACKEND_DESCRIPTOR, count: v.len(), bytes: Vec::new(), descs: v }
    }
    fn chunks(&self, n: usize) -> impl Iterator<Item = &[u8]> {
        self.bytes.chunks_exact(n)
    }
    /// INT64 elements.
    pub fn i64s(&self) -> Vec<i64> {
        self.chunks(8).map(|c| i64::from_ne_bytes(c.try_into().unwrap_or([0; 8]))).collect()
    }
    /// Elements of a 4-byte type (INT32 and the enums).
    pub fn i32s(&self) -> Vec<i32> {
        self.chunks(4).map(|c| i32::from_ne_bytes(c.try_into().unwrap_or([0; 4]))).collect()
    }
    /// FLOAT or DOUBLE elements, as doubles.
    pub fn f64s(&self) -> Vec<f64> {
        match self.ty {
            T_FLOAT => self.chunks(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap_or([0; 4])) as f64).collect(),
            _ => self.chunks(8).map(|c| f64::from_ne_bytes(c.try_into().unwrap_or([0; 8]))).collect(),
        }
    }
    pub fn bools(&self) -> Vec<bool> {
        self.bytes.iter().map(|&b| b != 0).collect()
    }
    /// Pointer elements (HANDLE, VOID_PTR).
    pub fn ptrs(&self) -> Vec<usize> {
        self.chunks(std::mem::size_of::<usize>()).map(|c| usize::from_ne_bytes(c.try_into().unwrap_or([0; std::mem::size_of::<usize>()]))).collect()
    }
    /// FRACTION elements as (numerator, denominator), or INT64 elements as n/1.
    pub fn fractions(&self) -> Vec<(i64, i64)> {
        match self.ty {
            T_FRACTION => {
                let v = self.i64s();
                v.chunks_exact(2).map(|p| (p[0], p[1])).collect()
            }
            _ => self.i64s().into_iter().map(|n| (n, 1)).collect(),
        }
    }
}

/// A finalized descriptor: its attributes, frozen, and what finalization derived.
#[derive(Debug)]
pub struct Snapshot {
    pub kind: i32,
    pub attrs: BTreeMap<i32, Value>,
    pub built: Built,
}

/// What finalizing a descriptor derives from its attributes.
#[derive(Debug, Default)]
pub enum Built {
    #[default]
    None,
    Tensor(graph::TensorInfo),
    Graph(Arc<graph::OpGraph>),
    /// A score-modifier subgraph of an attention operation (diagonal band masks): read by the
    /// attention operation that names it, not run alone.
    Subgraph(Vec<Arc<Snapshot>>),
    Heuristics(Vec<Arc<Snapshot>>),
    Engine(Arc<engine::EngineInfo>),
    Plan(Arc<engine::PlanState>),
    Pack(engine::PackInfo),
}

impl Snapshot {
    /// The message prefix naming an attribute of this descriptor.
    fn what(&self, attr: i32) -> String {
        let name = spec(self.kind, attr).map_or_else(|| format!("attribute {attr}"), |s| s.name.to_string());
        format!("{} of {}", name, kind_name(self.kind))
    }
    pub fn value(&self, attr: i32) -> Option<&Value> {
        self.attrs.get(&attr)
    }
    /// The first descriptor of a BACKEND_DESCRIPTOR attribute, if set.
    pub fn desc(&self, attr: i32) -> Option<&Arc<Snapshot>> {
        self.attrs.get(&attr).and_then(|v| v.descs.first())
    }
    pub fn descs(&self, attr: i32) -> &[Arc<Snapshot>] {
        self.attrs.get(&attr).map_or(&[], |v| v.descs.as_slice())
    }
    pub fn need_desc(&self, attr: i32) -> R<&Arc<Snapshot>> {
        self.desc(attr).ok_or_else(|| bad(format!("{} is required but was not set", self.what(attr))))
    }
    /// An enum or INT32 attribute's value.
    pub fn int(&self, attr: i32) -> Option<i32> {
        self.attrs.get(&attr).and_then(|v| v.i32s().first().copied())
    }
    pub fn need_int(&self, attr: i32) -> R<i32> {
        self.int(attr).ok_or_else(|| bad(format!("{} is required but was not set", self.what(attr))))
    }
    pub fn i64s(&self, attr: i32) -> Option<Vec<i64>> {
        self.attrs.get(&attr).map(|v| v.i64s())
    }
    pub fn i64_(&self, attr: i32) -> Option<i64> {
        self.i64s(attr).and_then(|v| v.first().copied())
    }
    pub fn need_i64s(&self, attr: i32) -> R<Vec<i64>> {
        self.i64s(attr).ok_or_else(|| bad(format!("{} is required but was not set", self.what(attr))))
    }
    /// A FLOAT or DOUBLE attribute's (first) value.
    pub fn f64_(&self, attr: i32) -> Option<f64> {
        self.attrs.get(&attr).and_then(|v| v.f64s().first().copied())
    }
    pub fn bool_(&self, attr: i32) -> Option<bool> {
        self.attrs.get(&attr).and_then(|v| v.bools().first().copied())
    }
    pub fn tensor(&self) -> Option<&graph::TensorInfo> {
        match &self.built {
            Built::Tensor(t) => Some(t),
            _ => None,
        }
    }
}

/// A live backend descriptor: its type, the attributes set so far, and its snapshot once
/// finalized.
pub struct BackendDesc {
    pub kind: i32,
    pub attrs: BTreeMap<i32, Value>,
    pub fin: Option<Arc<Snapshot>>,
}

pub static BACKEND: Registry<BackendDesc> = Registry::new("cudnnBackendDescriptor_t");

/// The snapshot of a finalized descriptor argument named `name`.
pub fn finalized(p: cudnnBackendDescriptor_t, name: &str) -> R<Arc<Snapshot>> {
    BACKEND
        .with(p, |d| {
            d.fin.clone().ok_or_else(|| ApiError::new(CUDNN_STATUS_BAD_PARAM, format!("`{name}` ({}) is not finalized; call cudnnBackendFinalize on it first", kind_name(d.kind))))
        })
        .map_err(|e| if e.msg.starts_with('`') { e } else { ApiError::new(e.status, format!("`{name}`: {}", e.msg)) })
}

#[no_mangle]
pub extern "C" fn cudnnBackendCreateDescriptor(kind: i32, out: *mut cudnnBackendDescriptor_t) -> Status {
    guard("cudnnBackendCreateDescriptor", || {
        non_null(out, "descriptor")?;
        if !(0..DESCRIPTOR_TYPE_COUNT).contains(&kind) {
            return Err(unsupported(format!("descriptorType {kind} is not a cudnnBackendDescriptorType_t (0 to {})", DESCRIPTOR_TYPE_COUNT - 1)));
        }
        let p = BACKEND.create(BackendDesc { kind, attrs: BTreeMap::new(), fin: None });
        // SAFETY: checked not null; the caller gives a writable descriptor slot.
        unsafe { write_out(out, "descriptor", p) }
    })
}

#[no_mangle]
pub extern "C" fn cudnnBackendDestroyDescriptor(p: cudnnBackendDescriptor_t) -> Status {
    guard("cudnnBackendDestroyDescriptor", || if p.is_null() { Ok(()) } else { BACKEND.destroy(p) })
}

/// Returns the descriptor to its state after creation (no attributes, not finalized).
#[no_mangle]
pub extern "C" fn cudnnBackendInitialize(p: cudnnBackendDescriptor_t) -> Status {
    guard("cudnnBackendInitialize", || {
        BACKEND.with(p, |d| {
            d.attrs.clear();
            d.fin = None;
            Ok(())
        })
    })
}

/// Reads the elements of a SetAttribute call.
///
/// # Safety
/// `ptr` must be valid for reads of `count` elements of type `ty` (the caller's contract).
unsafe fn read_value(ty: i32, count: i64, ptr: *const c_void, sp: &Spec) -> R<Value> {
    let n = count as usize;
    let size = element_size(ty);
    if n > 0 {
        non_null(ptr, "arrayOfElements")?;
    }
    // SAFETY: not null when n > 0 (checked), and the caller promises n elements of `size` bytes.
    let bytes = if n == 0 { Vec::new() } else { unsafe { std::slice::from_raw_parts(ptr as *const u8, n * size) }.to_vec() };
    if ty != T_BACKEND_DESCRIPTOR {
        return Ok(Value::from_bytes(ty, bytes));
    }
    let mut descs = Vec::with_capacity(n);
    for (i, c) in bytes.chunks_exact(size).enumerate() {
        let addr = usize::from_ne_bytes(c.try_into().unwrap_or([0; std::mem::size_of::<usize>()]));
        let snap = BACKEND
            .with(addr as *mut c_void, |d| {
                let s =
                    d.fin.clone().ok_or_else(|| bad(format!("element {i} ({}) is not finalized; finalize a descriptor before setting it as an attribute", kind_name(d.kind))))?;
                Ok(s)
            })
            .map_err(|e| ApiError::new(e.status, format!("{}: element {i}: {}", sp.name, e.msg)))?;
        if !sp.kinds.is_empty() && !sp.kinds.contains(&snap.kind) {
            let want: Vec<String> = sp.kinds.iter().take(4).map(|&k| kind_name(k)).collect();
            return Err(bad(format!(
                "{}: element {i} is a {}, but this attribute takes {}{}",
                sp.name,
                kind_name(snap.kind),
                want.join(" or "),
                if sp.kinds.len() > 4 { " or another operation" } else { "" }
            )));
        }
        descs.push(snap);
    }
    Ok(Value { ty, count: n, bytes: Vec::new(), descs })
}

#[no_mangle]
pub extern "C" fn cudnnBackendSetAttribute(p: cudnnBackendDescriptor_t, name: i32, ty: i32, count: i64, array: *const c_void) -> Status {
    guard("cudnnBackendSetAttribute", || {
        let (kind, is_final) = BACKEND.with(p, |d| Ok((d.kind, d.fin.is_some())))?;
        if is_final {
            return Err(ApiError::new(CUDNN_STATUS_NOT_INITIALIZED, format!("the {} is already finalized; its attributes can no longer be set", kind_name(kind))));
        }
        let sp = spec(kind, name).ok_or_else(|| bad(format!("attributeName {name} is not an attribute of {}", kind_name(kind))))?;
        if !sp.settable {
            return Err(bad(format!("{} of {} is read-only: cudnnBackendGetAttribute answers it", sp.name, kind_name(kind))));
        }
        if !(0..ATTRIBUTE_TYPE_COUNT).contains(&ty) || (!sp.types.is_empty() && !sp.types.contains(&ty)) {
            let want: Vec<String> = sp.types.iter().map(|&t| type_name(t)).collect();
            return Err(bad(format!("{} of {} takes {}, not {}", sp.name, kind_name(kind), want.join(" or "), type_name(ty))));
        }
        if count < sp.min || count > sp.max || count > MAX_ELEMENTS {
            let range = if sp.max == i64::MAX {
                format!("at least {}", sp.min)
            } else if sp.min == sp.max {
                format!("{}", sp.min)
            } else {
                format!("{} to {}", sp.min, sp.max)
            };
            return Err(bad(format!("{} of {} takes {range} element(s), got elementCount {count}", sp.name, kind_name(kind))));
        }
        // SAFETY: the caller gives `count` elements of type `ty` at `array` (null is refused).
        let v = unsafe { read_value(ty, count, array, &sp) }?;
        BACKEND.with(p, |d| {
            if d.fin.is_some() {
                return Err(ApiError::new(CUDNN_STATUS_NOT_INITIALIZED, format!("the {} was finalized meanwhile", kind_name(kind))));
            }
            d.attrs.insert(name, v);
            Ok(())
        })
    })
}

#[no_mangle]
pub extern "C" fn cudnnBackendFinalize(p: cudnnBackendDescriptor_t) -> Status {
    guard("cudnnBackendFinalize", || {
        let (kind, attrs, is_final) = BACKEND.with(p, |d| Ok((d.kind, d.attrs.clone(), d.fin.is_some())))?;
        if is_final {
            return Err(bad(format!("the {} is already finalized", kind_name(kind))));
        }
        let mut snap = Snapshot { kind, attrs, built: Built::None };
        // Finalizing may build a plan (compile kernels): the registry is not locked meanwhile.
        snap.built = finalize(&mut snap)?;
        let snap = Arc::new(snap);
        BACKEND.with(p, |d| {
            d.fin = Some(snap);
            Ok(())
        })
    })
}

/// Checks a descriptor's attribute set and derives what it stands for.
fn finalize(s: &mut Snapshot) -> R<Built> {
    match s.kind {
        TENSOR => graph::finalize_tensor(s).map(Built::Tensor),
        OPERATIONGRAPH => graph::finalize_graph(s),
        ENGINEHEUR => engine::finalize_heuristics(s).map(Built::Heuristics),
        ENGINE => engine::finalize_engine(s).map(Built::Engine),
        ENGINECFG => engine::finalize_engine_config(s).map(Built::Engine),
        EXECUTION_PLAN => engine::finalize_plan(s).map(Built::Plan),
        VARIANT_PACK => engine::finalize_pack(s).map(Built::Pack),
        KNOB_CHOICE => {
            s.need_int(KNOB_CHOICE_KNOB_TYPE)?;
            s.i64_(KNOB_CHOICE_KNOB_VALUE).ok_or_else(|| bad("CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE of the KNOB_CHOICE descriptor is required but was not set"))?;
            Ok(Built::None)
        }
        k if is_unsupported_operation(k) => Err(unsupported(format!("{}: ferrodnn has no operation of this type", kind_name(k)))),
        k if is_operation(k) => {
            graph::check_operation(s)?;
            Ok(Built::None)
        }
        POINTWISE | CONVOLUTION | MATMUL | REDUCTION | RESAMPLE | RNG => {
            graph::check_op_config(s)?;
            Ok(Built::None)
        }
        INTERMEDIATE_INFO | KNOB_INFO | LAYOUT_INFO => Err(bad(format!("a {} is filled in by cudnnBackendGetAttribute, not finalized by the program", kind_name(s.kind)))),
        // Kernel caches and device properties are accepted: ferrodnn keeps its own kernel cache
        // and builds for the handle's device.
        _ => Ok(Built::None),
    }
}

/// Writes `v` (of `n` elements) into a GetAttribute call's outputs.
///
/// # Safety
/// `count` is null or writable; `array` is null or holds `requested` elements of `ty`.
unsafe fn write_value(v: &Value, ty: i32, requested: i64, count: *mut i64, array: *mut c_void) -> R<()> {
    let n = v.count;
    if !count.is_null() {
        // SAFETY: not null; the caller gives a writable int64_t.
        unsafe { count.write_unaligned(n as i64) };
    }
    let k = (requested.max(0) as usize).min(n);
    if array.is_null() || k == 0 {
        return Ok(());
    }
    if ty == T_BACKEND_DESCRIPTOR {
        for (i, snap) in v.descs.iter().take(k).enumerate() {
            // SAFETY: the array holds `requested` >= k descriptor handles.
            let target = unsafe { (array as *const cudnnBackendDescriptor_t).add(i).read_unaligned() };
            BACKEND
                .with(target, |d| {
                    if d.kind != snap.kind {
                        return Err(bad(format!("element {i} of arrayOfElements is a {}, but the attribute holds a {}", kind_name(d.kind), kind_name(snap.kind))));
                    }
                    d.attrs = snap.attrs.clone();
                    d.fin = Some(snap.clone());
                    Ok(())
                })
                .map_err(|e| ApiError::new(e.status, format!("arrayOfElements[{i}]: {}", e.msg)))?;
        }
        return Ok(());
    }
    let size = element_size(ty);
    let bytes: Vec<u8> = if ty == v.ty {
        v.bytes[..k * size].to_vec()
    } else if ty == T_FLOAT {
        v.f64s().iter().take(k).flat_map(|&x| (x as f32).to_ne_bytes()).collect()
    } else {
        v.f64s().iter().take(k).flat_map(|&x| x.to_ne_bytes()).collect()
    };
    // SAFETY: the array holds `requested` >= k elements of `size` bytes; `bytes` is k * size.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), array as *mut u8, bytes.len()) };
    Ok(())
}

#[no_mangle]
pub extern "C" fn cudnnBackendGetAttribute(p: cudnnBackendDescriptor_t, name: i32, ty: i32, requested: i64, count: *mut i64, array: *mut c_void) -> Status {
    guard("cudnnBackendGetAttribute", || {
        let (kind, snap) = BACKEND.with(p as cudnnBackendDescriptor_t, |d| Ok((d.kind, d.fin.clone())))?;
        let sp = spec(kind, name).ok_or_else(|| bad(format!("attributeName {name} is not an attribute of {}", kind_name(kind))))?;
        let snap = snap.ok_or_else(|| ApiError::new(CUDNN_STATUS_NOT_INITIALIZED, format!("the {} is not finalized; finalize it before reading {}", kind_name(kind), sp.name)))?;
        if !(0..ATTRIBUTE_TYPE_COUNT).contains(&ty) || (!sp.types.is_empty() && !sp.types.contains(&ty)) {
            let want: Vec<String> = sp.types.iter().map(|&t| type_name(t)).collect();
            return Err(bad(format!("{} of {} is {}, not {}", sp.name, kind_name(kind), want.join(" or "), type_name(ty))));
        }
        if requested < 0 {
            return Err(bad(format!("requestedElementCount {requested} is negative")));
        }
        if count.is_null() && array.is_null() {
            return Err(ApiError::new(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "elementCount and arrayOfElements are both null pointers"));
        }
        let v = match engine::computed(&snap, name)? {
            Some(v) => v,
            None => snap.attrs.get(&name).cloned().unwrap_or(Value { ty, count: 0, bytes: Vec::new(), descs: Vec::new() }),
        };
        if v.count > 0 && v.ty != ty && !(matches!(v.ty, T_FLOAT | T_DOUBLE) && matches!(ty, T_FLOAT | T_DOUBLE)) {
            return Err(bad(format!("{} of {} was set as {}, not {}", sp.name, kind_name(kind), type_name(v.ty), type_name(ty))));
        }
        // SAFETY: the caller's contract: `count` null or writable, `array` null or `requested`
        // elements of `ty`.
        unsafe { write_value(&v, ty, requested, count, array) }
    })
}

/// Runs an execution plan on a variant pack's buffers, on the handle's stream.
#[no_mangle]
pub extern "C" fn cudnnBackendExecute(h: cudnnHandle_t, plan: cudnnBackendDescriptor_t, pack: cudnnBackendDescriptor_t) -> Status {
    guard("cudnnBackendExecute", || engine::execute(h, plan, pack))
}

/// The workspace an execution plan needs (the variant pack cannot change it in ferrodnn).
#[no_mangle]
pub extern "C" fn cudnnGetExecutionPlanWorkspaceSize(h: cudnnHandle_t, plan: cudnnBackendDescriptor_t, pack: cudnnBackendDescriptor_t, size: *mut usize) -> Status {
    guard("cudnnGetExecutionPlanWorkspaceSize", || {
        let ws = engine::plan_workspace(h, plan, pack)?;
        // SAFETY: the caller gives a writable size_t (null is refused).
        unsafe { write_out(size, "workspaceSizeInBytes", ws) }
    })
}

/// CUDA graph capture by the library is not available: ferrodnn's plans can be captured by the
/// caller's stream capture instead (execution allocates and synchronizes nothing).
#[no_mangle]
pub extern "C" fn cudnnBackendPopulateCudaGraph(h: cudnnHandle_t, plan: cudnnBackendDescriptor_t, pack: cudnnBackendDescriptor_t, _graph: *mut c_void) -> Status {
    guard("cudnnBackendPopulateCudaGraph", || {
        crate::handle::handle(h)?;
        finalized(plan, "executionPlan")?;
        finalized(pack, "variantPack")?;
        Err(unsupported("ferrodnn does not build CUDA graphs itself; capture cudnnBackendExecute on a capturing stream instead"))
    })
}

/// See [`cudnnBackendPopulateCudaGraph`].
#[no_mangle]
pub extern "C" fn cudnnBackendUpdateCudaGraph(h: cudnnHandle_t, plan: cudnnBackendDescriptor_t, pack: cudnnBackendDescriptor_t, _graph: *mut c_void) -> Status {
    guard("cudnnBackendUpdateCudaGraph", || {
        crate::handle::handle(h)?;
        finalized(plan, "executionPlan")?;
        finalized(pack, "variantPack")?;
        Err(unsupported("ferrodnn does not build CUDA graphs itself; capture cudnnBackendExecute on a capturing stream instead"))
    })
}
