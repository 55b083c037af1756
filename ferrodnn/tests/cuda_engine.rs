//! The CUDA engine's execution checks on a GPU: bad pointers and buffers are errors, never a
//! crash; a plan runs on a stream the user sets; plan rebuilds hit the plan cache. Skips, saying
//! so, when no GPU is present.

use ferrodnn::engine::{Buffer, PlanPolicy};
use ferrodnn::testing::{execute_plan_dense, random_inputs, run_cpu};
use ferrodnn::{DataType, EngineKind, Error, Graph, Handle, TensorDesc, VariantPack};

fn gpu() -> Option<Handle> {
    if !ferrodnn::engine::cuda::gpu_available() {
        eprintln!("skipped: no GPU");
        return None;
    }
    Some(Handle::cuda(0).expect("a GPU is available, so its handle opens"))
}

/// y = relu(x + b) on [5, 7] f32, uids x=1, b=2, y=3.
fn graph() -> Graph {
    let mut g = Graph::new("g").io_data_type(DataType::F32);
    let x = g.tensor(TensorDesc::new("x", &[5, 7], DataType::F32).with_uid(1));
    let b = g.tensor(TensorDesc::new("b", &[1, 7], DataType::F32).with_uid(2));
    let s = g.add(x, b);
    let y = g.relu(s);
    g.set_output(y);
    g.desc_mut(y).uid = Some(3);
    g.validate().unwrap();
    g
}

fn cuda_policy() -> PlanPolicy {
    PlanPolicy { engine: Some(EngineKind::Cuda), ..Default::default() }
}

fn expect_arg_err(r: ferrodnn::Result<()>, want: &str) {
    match r {
        Err(Error::InvalidArgument(m)) => assert!(m.contains(want), "`{m}` lacks `{want}`"),
        other => panic!("expected InvalidArgument containing `{want}`, got {other:?}"),
    }
}

#[test]
fn bad_buffers_are_errors() {
    let Some(h) = gpu() else { return };
    let g = graph();
    let plan = h.build_plans(&g, &cuda_policy()).unwrap().remove(0);
    assert_eq!(plan.engine(), EngineKind::Cuda);
    let dev = h.cuda_device().unwrap();
    let x = dev.alloc(35 * 4).unwrap();
    let b = dev.alloc(7 * 4).unwrap();
    let y = dev.alloc(35 * 4).unwrap();
    let ws = dev.alloc(plan.workspace_size().max(1)).unwrap();
    let wsb = || Some(Buffer::Device { ptr: ws.device_ptr(), bytes: ws.len() });
    let host = vec![0u8; 35 * 4];
    let cases: Vec<(Box<dyn Fn(&mut VariantPack)>, &str)> = vec![
        (
            Box::new(|p: &mut VariantPack| {
                p.device(1, 0, 140);
            }),
            "the device pointer is null",
        ),
        (
            Box::new(|p: &mut VariantPack| {
                p.device(1, x.device_ptr() + 2, 138);
            }),
            "is not aligned to 4 bytes",
        ),
        (
            Box::new(|p: &mut VariantPack| {
                p.device(1, x.device_ptr(), 100);
            }),
            "buffer is 100 bytes but dims [5, 7]",
        ),
        (
            Box::new(|p: &mut VariantPack| {
                p.device(1, host.as_ptr() as u64, 140);
            }),
            "is not device memory",
        ),
        (
            Box::new(|p: &mut VariantPack| {
                p.device(1, x.device_ptr(), 140).device(99, y.device_ptr(), 4);
            }),
            "the variant pack has uid 99",
        ),
    ];
    for (fill, want) in cases {
        let mut pack = VariantPack::new();
        pack.device(1, x.device_ptr(), x.len()).device(2, b.device_ptr(), b.len()).device(3, y.device_ptr(), y.len());
        fill(&mut pack);
        expect_arg_err(plan.execute(&mut pack, wsb()), want);
    }
    // A host buffer where a device buffer belongs.
    let mut pack = VariantPack::new();
    pack.input(1, &host).device(2, b.device_ptr(), b.len()).device(3, y.device_ptr(), y.len());
    expect_arg_err(plan.execute(&mut pack, wsb()), "the CUDA engine needs device buffers");
    // Workspace smaller than asked for (only meaningful when the plan needs one).
    if plan.workspace_size() > 0 {
        let mut pack = VariantPack::new();
        pack.device(1, x.device_ptr(), x.len()).device(2, b.device_ptr(), b.len()).device(3, y.device_ptr(), y.len());
        expect_arg_err(plan.execute(&mut pack, Some(Buffer::Device { ptr: ws.device_ptr(), bytes: plan.workspace_size() - 1 })), "needs a workspace");
    }
}

#[test]
fn runs_on_a_user_stream_and_matches_the_cpu() {
    let Some(h) = gpu() else { return };
    let dev = h.cuda_device().unwrap().clone();
    let user = dev.new_stream().unwrap();
    // SAFETY: `user` is a live stream of this device and outlives every execution below (we
    // synchronize the handle's stream, which is `user`, before it drops).
    unsafe { h.set_stream(user.raw() as u64).unwrap() };
    assert_eq!(h.stream().unwrap().raw(), user.raw());
    let g = graph();
    let inputs = random_inputs(&g, 9);
    let plan = h.build_plans(&g, &cuda_policy()).unwrap().remove(0);
    let got = execute_plan_dense(&h, &plan, &inputs).unwrap();
    let want = run_cpu(&g, &inputs).unwrap();
    for (id, w) in want {
        assert_eq!(got[&id].data, w.data, "relu(x + b) is exact in f32");
    }
}

#[test]
fn rebuilding_a_graph_hits_the_plan_cache() {
    let Some(h) = gpu() else { return };
    let g = graph();
    let _ = h.build_plans(&g, &cuda_policy()).unwrap();
    let t = std::time::Instant::now();
    let again = h.build_plans(&g, &cuda_policy()).unwrap();
    let ms = t.elapsed().as_secs_f64() * 1e3;
    eprintln!("in-process rebuild: {ms:.3} ms");
    assert_eq!(again[0].engine(), EngineKind::Cuda);
    assert!(again[0].notes.runtime_compiled && again[0].notes.deterministic);
    let det = h.build_plans(&g, &PlanPolicy { deterministic_only: true, ..cuda_policy() }).unwrap();
    assert_eq!(det[0].engine(), EngineKind::Cuda);
}
