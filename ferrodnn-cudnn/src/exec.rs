//! From a legacy call to work done: the call's graph (built once per key: the function and every
//! descriptor, type and mode it depends on) becomes a plan in the handle's cache, and the plan runs
//! on the caller's pointers.
//!
//! Pointers are host memory on a CPU handle and device memory on a GPU handle (enqueued on the
//! handle's stream). cuDNN lets outputs alias inputs (`y` read for `beta != 0`, in-place
//! activations, running statistics updated in place); such an input is first copied (into host
//! memory, or the handle's device scratch memory on its stream), so no plan ever reads a buffer
//! it writes.
//!
//! `alpha` and `beta` follow cuDNN: `y = alpha * op(...) + beta * y`, built into the graph as
//! runtime scalars ([`Scaling`]), so one plan serves every value of each kind (`alpha == 1` and
//! `beta == 0`; `beta == 0`; any).

use crate::api::*;
use crate::desc::TensorDescriptor;
use crate::handle::HandleState;
use crate::types::*;
use ferrodnn::{Buffer, DataType, Graph, Plan, PlanPolicy, TensorDesc, TensorId, VariantPack};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// Plans by call key.
#[derive(Default)]
pub struct PlanCache {
    plans: Mutex<HashMap<String, Arc<Plan>>>,
}

/// One buffer of a call: a tensor's uid, the caller's pointer and the bytes it spans.
#[derive(Clone, Copy, Debug)]
pub struct Io {
    pub uid: i64,
    pub ptr: usize,
    pub bytes: usize,
    pub output: bool,
}

/// What one execution needs besides its plan.
#[derive(Default)]
pub struct Call {
    pub ios: Vec<Io>,
    /// By-value runtime scalars (alpha, beta, epsilon...), host bytes by uid.
    pub scalars: Vec<(i64, Vec<u8>)>,
    /// Inputs that are all zero bytes (a zero broadcast to a shape), by uid and size.
    pub zeros: Vec<(i64, usize)>,
    /// Outputs the caller does not want (null result pointers cuDNN allows), by uid and size.
    pub discards: Vec<(i64, usize)>,
    /// The caller's workspace (pointer, bytes), used when it is large enough.
    pub workspace: (usize, usize),
    /// Buffers shorter than their tensor (an RNN's packed sequences hold only their valid
    /// rows): the plan works on a full-size copy in scratch memory.
    pub partials: Vec<Partial>,
}

/// A caller buffer of `bytes` bytes for a tensor of `full` bytes: an input's bytes are copied
/// into scratch memory (the rest zero) before the plan runs, an output's first `bytes` copied
/// back after it ran.
#[derive(Clone, Copy, Debug)]
pub struct Partial {
    pub uid: i64,
    pub ptr: usize,
    pub bytes: usize,
    pub full: usize,
    pub output: bool,
}

impl Call {
    /// A buffer the plan reads; `name` names the argument in errors.
    pub fn input(&mut self, uid: i64, ptr: *const c_void, bytes: usize, name: &str) -> R<()> {
        if bytes > 0 {
            non_null(ptr, name)?;
        }
        self.ios.push(Io { uid, ptr: ptr as usize, bytes, output: false });
        Ok(())
    }
    /// A buffer the plan writes.
    pub fn output(&mut self, uid: i64, ptr: *mut c_void, bytes: usize, name: &str) -> R<()> {
        if bytes > 0 {
            non_null(ptr, name)?;
        }
        self.ios.push(Io { uid, ptr: ptr as usize, bytes, output: true });
        Ok(())
    }
    /// An output the caller may have left null (it is then computed into scratch memory).
    pub fn output_or_discard(&mut self, uid: i64, ptr: *mut c_void, bytes: usize) {
        if ptr.is_null() {
            self.discards.push((uid, bytes));
        } else {
            self.ios.push(Io { uid, ptr: ptr as usize, bytes, output: true });
        }
    }
    /// A buffer of `bytes` bytes for a tensor of `full` bytes ([`Partial`]); a plain buffer when
    /// they are equal.
    pub fn partial(&mut self, uid: i64, ptr: *const c_void, bytes: usize, full: usize, output: bool, name: &str) -> R<()> {
        if bytes >= full {
            return if output { self.output(uid, ptr as *mut c_void, full, name) } else { self.input(uid, ptr, full, name) };
        }
        if bytes > 0 {
            non_null(ptr, name)?;
        }
        self.partials.push(Partial { uid, ptr: ptr as usize, bytes, full, output });
        Ok(())
    }
    /// A runtime scalar of type `dt`.
    pub fn scalar(&mut self, uid: i64, v: f64, dt: DataType) {
        self.scalars.push((uid, dt.encode(&[v])));
    }
}

/// A runtime by-value scalar tensor for a graph.
pub fn scalar_tensor(g: &mut Graph, name: &str, uid: i64, dt: DataType) -> TensorId {
    g.tensor(TensorDesc::runtime_scalar(name, dt).with_uid(uid))
}

/// The type scaling factors and statistics travel in for data of type `dt`.
pub fn scaling_type(double: bool) -> DataType {
    if double {
        DataType::F64
    } else {
        DataType::F32
    }
}

/// A new graph for a call, computing in f64 for double data and f32 otherwise.
pub fn new_graph(name: &str, double: bool) -> Graph {
    Graph::new(name).intermediate_data_type(scaling_type(double)).compute_data_type(scaling_type(double))
}

/// cuDNN's `y = alpha * result + beta * y`.
#[derive(Clone, Copy, Debug)]
pub struct Scaling {
    pub alpha: f64,
    pub beta: f64,
    pub double: bool,
}

impl Scaling {
    /// Reads alpha and beta (host `float`s, `double`s for double data).
    ///
    /// # Safety
    /// Each pointer must be null (refused) or point at a readable scaling value.
    pub unsafe fn read(alpha: *const c_void, beta: *const c_void, double: bool) -> R<Scaling> {
        // SAFETY: forwarded from the caller.
        let (a, b) = unsafe { (read_scalar(alpha, double, "alpha")?, read_scalar(beta, double, "beta")?) };
        Ok(Scaling { alpha: a, beta: b, double })
    }

    /// Which graph the values need (part of the plan key).
    pub fn tag(&self) -> &'static str {
        if self.beta != 0.0 {
            "blend"
        } else if self.alpha != 1.0 {
            "scale"
        } else {
            "plain"
        }
    }

    /// Makes `result` the graph output `y` (uid `uid`, the dims, strides and type of `y`), scaled
    /// and blended with the old `y` as the values need: `alpha` is the runtime scalar of uid
    /// `uid + 2000`, `beta` of `uid + 3000`, the old `y` the input of uid `uid + 1000`.
    pub fn build(&self, g: &mut Graph, result: TensorId, y: &TensorDescriptor, uid: i64) -> TensorId {
        let sdt = scaling_type(self.double);
        let mut out = result;
        if self.tag() != "plain" {
            let a = scalar_tensor(g, "alpha", uid + 2000, sdt);
            out = g.mul(out, a);
        }
        if self.tag() == "blend" {
            let b = scalar_tensor(g, "beta", uid + 3000, sdt);
            let old = g.tensor(y.fd("y_old", uid + 1000));
            let scaled = g.mul(old, b);
            out = g.add(out, scaled);
        }
        g.set_output(out);
        let d = g.desc_mut(out);
        d.dims = y.dims.clone();
        d.strides = y.strides.clone();
        d.data_type = Some(y.dt());
        d.uid = Some(uid);
        out
    }

    /// Adds what [`Scaling::build`]'s graph reads and writes to the call: `y` itself (at `ptr`),
    /// the scalars, and the old `y` (the same memory).
    pub fn feed(&self, call: &mut Call, uid: i64, ptr: *mut c_void, bytes: usize, name: &str) -> R<()> {
        call.output(uid, ptr, bytes, name)?;
        let sdt = scaling_type(self.double);
        if self.tag() != "plain" {
            call.scalar(uid + 2000, self.alpha, sdt);
        }
        if self.tag() == "blend" {
            call.scalar(uid + 3000, self.beta, sdt);
            call.input(uid + 1000, ptr, bytes, name)?;
        }
        Ok(())
    }
}

/// The plan for `key` from the handle's cache, or built from the graph `build` gives.
pub fn plan(h: &HandleState, key: &str, policy: PlanPolicy, build: impl FnOnce() -> R<Graph>) -> R<Arc<Plan>> {
    let key = format!("{key}|{}|{}", policy.no_reduced_precision, policy.deterministic_only);
    if let Some(p) = h.plans.plans.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(p.clone());
    }
    let mut g = build()?;
    g.validate().map_err(|e| bad(e.to_string()))?;
    let policy = PlanPolicy { engine: if h.gpu { Some(ferrodnn::EngineKind::Cuda) } else { None }, ..policy };
    let plan = Arc::new(h.fd.build_plans(&g, &policy)?.remove(0));
    h.plans.plans.lock().unwrap_or_else(|p| p.into_inner()).insert(key, plan.clone());
    Ok(plan)
}

fn overlaps(a: &Io, b: (usize, usize)) -> bool {
    a.bytes > 0 && b.1 > 0 && a.ptr < b.0 + b.1 && b.0 < a.ptr + a.bytes
}

/// Runs `plan` on the call's buffers.
pub fn execute(h: &HandleState, plan: &Plan, call: &Call) -> R<()> {
    if log_level() >= 2 {
        let knobs: Vec<String> = plan.desc.knobs.iter().map(|k| format!("{}={}", k.name, k.value)).collect();
        log(&format!("{} on {} [{}], workspace {} bytes", plan.graph().name, plan.engine().name(), knobs.join(", "), plan.workspace_size()));
    }
    let partial_outputs: Vec<Io> = call.partials.iter().filter(|p| p.output).map(|p| Io { uid: p.uid, ptr: p.ptr, bytes: p.bytes, output: true }).collect();
    let outputs: Vec<&Io> = call.ios.iter().filter(|io| io.output).chain(&partial_outputs).collect();
    for (i, a) in outputs.iter().enumerate() {
        for b in &outputs[i + 1..] {
            if overlaps(a, (b.ptr, b.bytes)) {
                return Err(bad(format!("two outputs share memory ({:#x}, {} bytes and {:#x}, {} bytes); each output needs its own", a.ptr, a.bytes, b.ptr, b.bytes)));
            }
        }
    }
    // Inputs that share memory with an output are read from a copy.
    let aliased: Vec<bool> = call.ios.iter().map(|io| !io.output && outputs.iter().any(|o| overlaps(io, (o.ptr, o.bytes)))).collect();
    if h.gpu {
        execute_gpu(h, plan, call, &aliased)
    } else {
        execute_host(plan, call, &aliased)
    }
}

fn host_vec(bytes: usize) -> R<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(bytes).map_err(|_| ApiError::new(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, format!("could not allocate {bytes} bytes of host memory")))?;
    v.resize(bytes, 0);
    Ok(v)
}

fn execute_host(plan: &Plan, call: &Call, aliased: &[bool]) -> R<()> {
    let mut copies: HashMap<i64, Vec<u8>> = HashMap::new();
    for (io, &a) in call.ios.iter().zip(aliased) {
        if a {
            // SAFETY: a CPU handle's pointers are host memory of at least `bytes` bytes (the
            // descriptor's extent), the caller's contract; this only reads it.
            copies.insert(io.uid, unsafe { std::slice::from_raw_parts(io.ptr as *const u8, io.bytes) }.to_vec());
        }
    }
    let mut zeros = Vec::new();
    for &(uid, bytes) in &call.zeros {
        zeros.push((uid, host_vec(bytes)?));
    }
    let mut discards = Vec::new();
    for &(uid, bytes) in &call.discards {
        discards.push((uid, host_vec(bytes)?));
    }
    let mut partials = Vec::new();
    for p in &call.partials {
        let mut v = host_vec(p.full)?;
        if !p.output && p.bytes > 0 {
            // SAFETY: a CPU handle's pointers are host memory of at least `bytes` bytes (the
            // caller's contract, checked not null); this only reads it.
            v[..p.bytes].copy_from_slice(unsafe { std::slice::from_raw_parts(p.ptr as *const u8, p.bytes) });
        }
        partials.push(v);
    }
    let need = plan.workspace_size();
    let mut own_ws = if call.workspace.1 >= need && call.workspace.0 != 0 { Vec::new() } else { host_vec(need)? };
    let mut pack = VariantPack::new();
    for io in &call.ios {
        if io.bytes == 0 {
            pack.input(io.uid, &[]);
        } else if let Some(c) = copies.get(&io.uid) {
            pack.input(io.uid, c);
        } else if io.output {
            // SAFETY: host memory of `bytes` bytes the caller lets us write (its contract); no
            // other buffer of this pack overlaps it: outputs were checked pairwise, and inputs
            // overlapping an output are read from `copies`.
            pack.output(io.uid, unsafe { std::slice::from_raw_parts_mut(io.ptr as *mut u8, io.bytes) });
        } else {
            // SAFETY: host memory of `bytes` bytes the caller lets us read; no output overlaps it.
            pack.input(io.uid, unsafe { std::slice::from_raw_parts(io.ptr as *const u8, io.bytes) });
        }
    }
    for (uid, v) in &call.scalars {
        pack.input(*uid, v);
    }
    for (uid, v) in &zeros {
        pack.input(*uid, v);
    }
    for (uid, v) in discards.iter_mut() {
        pack.output(*uid, v);
    }
    for (p, v) in call.partials.iter().zip(partials.iter_mut()) {
        if p.output {
            pack.output(p.uid, v);
        } else {
            pack.input(p.uid, v);
        }
    }
    let ws = if own_ws.is_empty() && need > 0 {
        // SAFETY: the caller's workspace: `workspace.1 >= need` host bytes it lets us write,
        // which no tensor buffer shares (cuDNN's contract).
        Some(Buffer::HostMut(unsafe { std::slice::from_raw_parts_mut(call.workspace.0 as *mut u8, call.workspace.1) }))
    } else if need > 0 {
        Some(Buffer::HostMut(&mut own_ws))
    } else {
        None
    };
    let done = plan.execute(&mut pack, ws).map_err(ApiError::from);
    drop(pack);
    done?;
    for (p, v) in call.partials.iter().zip(&partials) {
        if p.output && p.bytes > 0 {
            // SAFETY: host memory of `bytes` bytes the caller lets us write (its contract); the
            // plan has finished with every buffer.
            unsafe { std::slice::from_raw_parts_mut(p.ptr as *mut u8, p.bytes) }.copy_from_slice(&v[..p.bytes]);
        }
    }
    Ok(())
}

fn align(n: usize) -> usize {
    n.div_ceil(256) * 256
}

fn execute_gpu(h: &HandleState, plan: &Plan, call: &Call, aliased: &[bool]) -> R<()> {
    let stream = h.fd.stream().ok_or_else(|| ApiError::new(CUDNN_STATUS_INTERNAL_ERROR, "the GPU handle has no stream"))?;
    let device = h.fd.cuda_device().ok_or_else(|| ApiError::new(CUDNN_STATUS_INTERNAL_ERROR, "the GPU handle has no device"))?.clone();
    let need = plan.workspace_size();
    let own_ws = !(call.workspace.1 >= need && call.workspace.0 != 0);
    // Scratch layout: copies of aliased inputs, zero inputs, discarded outputs, the workspace.
    let mut total = 0usize;
    let mut place = |bytes: usize| {
        let at = total;
        total += align(bytes.max(1));
        at
    };
    let copy_at: Vec<Option<usize>> = call.ios.iter().zip(aliased).map(|(io, &a)| a.then(|| place(io.bytes))).collect();
    let zero_at: Vec<usize> = call.zeros.iter().map(|&(_, b)| place(b)).collect();
    let discard_at: Vec<usize> = call.discards.iter().map(|&(_, b)| place(b)).collect();
    let partial_at: Vec<usize> = call.partials.iter().map(|p| place(p.full)).collect();
    let ws_at = if own_ws && need > 0 { Some(place(need)) } else { None };
    let mut scratch = h.scratch.lock().unwrap_or_else(|p| p.into_inner());
    if total > 0 && scratch.as_ref().is_none_or(|s| s.len() < total) {
        if scratch.is_some() {
            // Work already enqueued may still read the old scratch memory.
            stream.synchronize()?;
        }
        *scratch = None;
        let bytes = total.next_power_of_two().max(1 << 20);
        *scratch = Some(device.alloc(bytes).map_err(|e| ApiError::new(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, e.to_string()))?);
    }
    let base = scratch.as_ref().map_or(0, |s| s.device_ptr()) as usize;
    device.bind()?;
    let mut pack = VariantPack::new();
    for (io, at) in call.ios.iter().zip(&copy_at) {
        match at {
            Some(off) => {
                // SAFETY: both ranges are device memory of `bytes` bytes (the caller's buffer, and
                // scratch this handle owns), enqueued on the handle's stream before the plan.
                unsafe { gpu::copy(base + off, io.ptr, io.bytes, stream.raw()) }?;
                pack.device(io.uid, (base + off) as u64, io.bytes);
            }
            None => {
                pack.device(io.uid, io.ptr as u64, io.bytes);
            }
        }
    }
    for (&(uid, bytes), off) in call.zeros.iter().zip(&zero_at) {
        // SAFETY: scratch device memory this handle owns, `bytes` long at `base + off`.
        unsafe { gpu::zero(base + off, bytes, stream.raw()) }?;
        pack.device(uid, (base + off) as u64, bytes);
    }
    for (&(uid, bytes), off) in call.discards.iter().zip(&discard_at) {
        pack.device(uid, (base + off) as u64, bytes);
    }
    for (p, off) in call.partials.iter().zip(&partial_at) {
        if !p.output {
            // SAFETY: scratch device memory this handle owns, `full` bytes at `base + off`, and
            // the caller's device buffer of `bytes` bytes, enqueued on the handle's stream.
            unsafe {
                gpu::zero(base + off, p.full, stream.raw())?;
                gpu::copy(base + off, p.ptr, p.bytes, stream.raw())?;
            }
        }
        pack.device(p.uid, (base + off) as u64, p.full);
    }
    for (uid, v) in &call.scalars {
        pack.input(*uid, v);
    }
    let ws = match ws_at {
        Some(off) => Some(Buffer::Device { ptr: (base + off) as u64, bytes: need }),
        None if need > 0 => Some(Buffer::Device { ptr: call.workspace.0 as u64, bytes: call.workspace.1 }),
        None => None,
    };
    plan.execute(&mut pack, ws).map_err(ApiError::from)?;
    for (p, off) in call.partials.iter().zip(&partial_at) {
        if p.output {
            // SAFETY: the caller's device buffer of `bytes` bytes and this handle's scratch,
            // copied on the handle's stream after the plan that wrote it.
            unsafe { gpu::copy(p.ptr, base + off, p.bytes, stream.raw()) }?;
        }
    }
    Ok(())
}

/// The few raw CUDA driver calls the C API makes itself (through cudarc, loaded at run time).
pub mod gpu {
    use crate::api::*;
    use crate::types::*;
    use cudarc::driver::sys;

    fn check(r: sys::CUresult, what: &str) -> R<()> {
        if r == sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(ApiError::new(CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER, format!("{what} failed: {r:?}")))
        }
    }

    /// The device of the calling thread's current CUDA context (what the CUDA runtime's
    /// cudaSetDevice chose), if there is one. Only called once the driver is known to load.
    pub fn current_device() -> Option<usize> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: a valid out pointer; the driver was loaded by ferrodnn's probe.
        if unsafe { sys::cuCtxGetCurrent(&mut ctx) } != sys::CUresult::CUDA_SUCCESS || ctx.is_null() {
            return None;
        }
        let mut dev: sys::CUdevice = 0;
        // SAFETY: a valid out pointer, with a current context.
        if unsafe { sys::cuCtxGetDevice(&mut dev) } != sys::CUresult::CUDA_SUCCESS {
            return None;
        }
        usize::try_from(dev).ok()
    }

    /// Enqueues a device-to-device copy on `stream`.
    ///
    /// # Safety
    /// `dst` and `src` must be device memory of `bytes` bytes of the stream's context.
    pub unsafe fn copy(dst: usize, src: usize, bytes: usize, stream: sys::CUstream) -> R<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: forwarded from the caller.
        check(unsafe { sys::cuMemcpyDtoDAsync_v2(dst as sys::CUdeviceptr, src as sys::CUdeviceptr, bytes, stream) }, "cuMemcpyDtoDAsync")
    }

    /// Enqueues zeroing `bytes` bytes at `dst` on `stream`.
    ///
    /// # Safety
    /// `dst` must be device memory of `bytes` bytes of the stream's context.
    pub unsafe fn zero(dst: usize, bytes: usize, stream: sys::CUstream) -> R<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: forwarded from the caller.
        check(unsafe { sys::cuMemsetD8Async(dst as sys::CUdeviceptr, 0, bytes, stream) }, "cuMemsetD8Async")
    }
}
