//! The Hopper GEMM kernel (engine/cuda/gemm/sm90.rs) launched directly on an sm_90 GPU, against
//! f64 references computed here: odd sizes, both major-nesses of A and B, batches with a
//! broadcast B, bf16 and f32 outputs, C poisoned first. Skips (saying so) without an sm_90 GPU.
//! With FERRODNN_SM90_TIMING=1 it also prints TFLOP/s of the large shapes (no assertion on
//! speed: that lives in the benchmark harness).

use ferrodnn::engine::cuda::gemm::sm90;
use ferrodnn::engine::cuda::gemm::{epilogue, Epilogue, GemmProblem, Operand};
use ferrodnn::engine::cuda::kernel::{kernel_text, Arg, Grid};
use ferrodnn::engine::cuda::{compile_cubin, gpu_available, CompileOptions, CudaDevice, Event, Module, Target};
use ferrodnn::graph::TensorId;
use ferrodnn::testing::SplitMix64;
use ferrodnn::{DataType, Graph, TensorDesc};
use half::bf16;
use std::ffi::c_void;

struct Case {
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    a_kmajor: bool,
    b_kmajor: bool,
    out: DataType,
    /// f32 inputs (holding bf16-representable values, so tf32 multiplies them exactly) run as
    /// tf32; otherwise bf16 inputs.
    tf32: bool,
}

fn problem(c: &Case) -> GemmProblem {
    let (m, n, k) = (c.m, c.n, c.k);
    let t = if c.tf32 { DataType::F32 } else { DataType::Bf16 };
    let op = |i, dtype, rows, cols, rs: usize, cs: usize, bs: usize| Operand {
        tensor: TensorId(i),
        dtype,
        rows,
        cols,
        row_stride: rs as i64,
        col_stride: cs as i64,
        batch_stride: bs as i64,
        gather: None,
    };
    let a = if c.a_kmajor { op(0, t, m, k, k, 1, m * k) } else { op(0, t, m, k, 1, m, m * k) };
    let b = if c.b_kmajor { op(1, t, k, n, 1, k, 0) } else { op(1, t, k, n, n, 1, 0) };
    GemmProblem { batch: c.batch, m, n, k, a, b, c: op(2, c.out, m, n, n, 1, m * n), groups: 1, allow_tf32: c.tf32, fast_fp8: false }
}

fn identity() -> Epilogue {
    Epilogue::identity()
}

/// The epilogue of `relu(a x b + bias)` with a bf16 bias `[1, n]` (tensor 3) from the GEMM
/// engine's generator (side loads hoisted per tile, `epilogue_v`), as a plan builds it.
fn bias_relu(c: &Case) -> Epilogue {
    let bf = DataType::Bf16;
    let lead: Vec<i64> = if c.batch > 1 { vec![c.batch as i64] } else { vec![] };
    let (m, n, k) = (c.m as i64, c.n as i64, c.k as i64);
    let mut g = Graph::new("probe_bias_relu").io_data_type(bf);
    let a = g.tensor(TensorDesc::new("a", &[lead.clone(), vec![m, k]].concat(), bf));
    let b = g.tensor(TensorDesc::new("b", &[k, n], bf));
    let x = g.matmul(a, b);
    let bias = g.tensor(TensorDesc::new("bias", &[1, n], bf));
    assert_eq!((a.0, b.0, x.0, bias.0), (0, 1, 2, 3), "tensor ids of the probe graph");
    let t = g.bias(x, bias);
    let y = g.relu(t);
    g.set_output(y);
    g.desc_mut(y).data_type = Some(c.out);
    g.validate().expect("probe graph");
    assert_eq!(g.nodes.len(), 3);
    let epi = epilogue::build(&g, 0, &[], &[1, 2]).expect("epilogue");
    assert_eq!(epi.args, vec![Arg::Ptr(TensorId(3))]);
    epi
}

/// relu(acc + bias[col]) with a bf16 bias of n elements (tensor 3), hand-written: a kernel
/// without the side inputs' layouts evaluates `epilogue` per element.
fn bias_relu_hand() -> Epilogue {
    Epilogue {
        code: "__device__ __forceinline__ float epilogue(float acc, long long b, long long r, long long c, const void* __restrict__ e0) { return fmaxf(acc + __bfloat162float(((const __nv_bfloat16*)e0)[c]), 0.f); }\n".into(),
        params: ", const void* __restrict__ e0".into(),
        names: ", e0".into(),
        args: vec![Arg::Ptr(TensorId(3))],
        ..Default::default()
    }
}

fn at(op: &Operand, b: usize, r: usize, c: usize) -> usize {
    (b as i64 * op.batch_stride + r as i64 * op.row_stride + c as i64 * op.col_stride) as usize
}

/// Runs one case; returns the relative L2 error over the checked elements and, when timing,
/// the TFLOP/s.
fn run(dev: &std::sync::Arc<CudaDevice>, c: &Case, sample: Option<usize>, timing: bool, cfg: Option<sm90::Config>) -> (f64, Option<f64>) {
    run_with(dev, c, sample, timing, cfg, Epi::Identity)
}

/// The epilogue a run uses.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Epi {
    Identity,
    /// relu(acc + bias) from the engine's generator.
    BiasRelu,
    /// The same, hand-written (per-element loads).
    BiasReluHand,
}

fn run_with(dev: &std::sync::Arc<CudaDevice>, c: &Case, sample: Option<usize>, timing: bool, cfg: Option<sm90::Config>, epi_kind: Epi) -> (f64, Option<f64>) {
    let target = Target::new(&dev.arch(), dev.sm_count());
    let p = problem(c);
    let with_bias = epi_kind != Epi::Identity;
    let epi = match epi_kind {
        Epi::Identity => identity(),
        Epi::BiasRelu => bias_relu(c),
        Epi::BiasReluHand => bias_relu_hand(),
    };
    let nk = match cfg {
        Some(cfg) => sm90::kernels_with(&p, &epi, &target, "gemm_probe", cfg),
        None => sm90::kernels(&p, &epi, &target, "gemm_probe"),
    }
    .unwrap_or_else(|| panic!("no kernel: {:?} {cfg:?}", sm90::reject(&p, &target)));
    let mut fns = Vec::new();
    for l in &nk.launches {
        // Plain launches here, not programmatic dependents.
        let plain = Target::new(&dev.arch(), dev.sm_count()).with_pdl(false);
        let cubin = compile_cubin(&kernel_text(l, &plain).0, &l.entry, &CompileOptions::new(dev.arch())).expect("compile");
        let module = Module::load(dev, &cubin).expect("load");
        let f = module.function(&l.entry).expect("function");
        if l.shared_bytes > 48 * 1024 {
            f.set_max_dynamic_shared_memory(l.shared_bytes).expect("smem");
        }
        fns.push(f);
    }
    let scratch: Vec<_> = nk.scratch.iter().map(|&b| dev.alloc(b).unwrap()).collect();
    let mut rng = SplitMix64::new(0x5eed ^ (c.m * 31 + c.n * 7 + c.k) as u64);
    let a_len = c.batch * c.m * c.k;
    let b_len = c.k * c.n;
    let a: Vec<bf16> = (0..a_len).map(|_| bf16::from_f64(rng.next_f64() * 2.0 - 1.0)).collect();
    let b: Vec<bf16> = (0..b_len).map(|_| bf16::from_f64(rng.next_f64() * 2.0 - 1.0)).collect();
    let bytes = |v: &[bf16]| v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect::<Vec<u8>>();
    let f32_bytes = |v: &[bf16]| v.iter().flat_map(|x| x.to_f32().to_le_bytes()).collect::<Vec<u8>>();
    let input_bytes = |v: &[bf16]| if c.tf32 { f32_bytes(v) } else { bytes(v) };
    let da = dev.upload(&input_bytes(&a)).unwrap();
    let db = dev.upload(&input_bytes(&b)).unwrap();
    let bias: Vec<bf16> = (0..c.n).map(|_| bf16::from_f64(rng.next_f64() * 2.0 - 1.0)).collect();
    let dbias = dev.upload(&bytes(&bias)).unwrap();
    let c_bytes = c.batch * c.m * c.n * c.out.size();
    let dc = dev.upload(&vec![0xFFu8; c_bytes]).unwrap(); // NaN everywhere first
    let stream = dev.new_stream().unwrap();

    let ptr_of = |t: TensorId| [da.device_ptr(), db.device_ptr(), dc.device_ptr(), dbias.device_ptr()][t.0];
    // Parameter values per launch: tensor maps and 8-byte words, in the order of the args.
    let mut maps: Vec<Vec<_>> = Vec::new();
    let mut words: Vec<Vec<u64>> = Vec::new();
    for l in &nk.launches {
        let (mut m, mut w) = (Vec::new(), Vec::new());
        for arg in &l.args {
            match arg {
                Arg::TensorMap(d) => m.push(d.encode(ptr_of(d.tensor)).unwrap()),
                Arg::ScratchTensorMap(i, d) => m.push(d.encode(scratch[*i].device_ptr()).unwrap()),
                Arg::Ptr(t) => w.push(ptr_of(*t)),
                Arg::Scratch(i) => w.push(scratch[*i].device_ptr()),
                Arg::I64(v) => w.push(*v as u64),
                other => panic!("unexpected arg {other:?}"),
            }
        }
        maps.push(m);
        words.push(w);
    }
    let launch = || {
        for (i, (l, f)) in nk.launches.iter().zip(&fns).enumerate() {
            let mut m = maps[i].clone();
            let mut w = words[i].clone();
            let mut params: Vec<*mut c_void> = m.iter_mut().map(|m| m as *mut _ as *mut c_void).collect();
            params.extend(w.iter_mut().map(|w| w as *mut u64 as *mut c_void));
            let grid = match l.grid {
                Grid::Exact(x, y, z) => (x, y, z),
                Grid::Cover(threads) => (threads.div_ceil(l.block as u64).clamp(1, dev.sm_count() as u64 * 32) as u32, 1, 1),
            };
            // SAFETY: the params match the kernel's parameters (maps first, then pointers and
            // words, as the generator orders them); the buffers hold the problem's whole extents
            // and outlive the launches (we synchronize before dropping them).
            unsafe { f.launch(&stream, grid, (l.block, 1, 1), l.shared_bytes, &mut params) }.expect("launch");
        }
    };
    launch();
    stream.synchronize().expect("kernel ran");
    let out = dc.to_host().unwrap();
    let read = |i: usize| -> f64 {
        match c.out {
            DataType::F32 => f32::from_le_bytes(out[4 * i..4 * i + 4].try_into().unwrap()) as f64,
            _ => bf16::from_bits(u16::from_le_bytes([out[2 * i], out[2 * i + 1]])).to_f64(),
        }
    };
    let (mut num, mut den) = (0.0f64, 0.0f64);
    let mut check = |bt: usize, i: usize, j: usize| {
        let mut acc = 0.0f64;
        for kk in 0..c.k {
            acc += a[at(&p.a, bt, i, kk)].to_f64() * b[at(&p.b, 0, kk, j)].to_f64();
        }
        if with_bias {
            acc = (acc + bias[j].to_f64()).max(0.0);
        }
        let got = read(at(&p.c, bt, i, j));
        assert!(got.is_finite(), "element ({bt}, {i}, {j}) is {got} (unwritten or wrong)");
        num += (got - acc) * (got - acc);
        den += acc * acc;
    };
    match sample {
        None => {
            for bt in 0..c.batch {
                for i in 0..c.m {
                    for j in 0..c.n {
                        check(bt, i, j);
                    }
                }
            }
        }
        Some(s) => {
            for _ in 0..s {
                let (bt, i, j) = ((rng.next_u64() as usize) % c.batch, (rng.next_u64() as usize) % c.m, (rng.next_u64() as usize) % c.n);
                check(bt, i, j);
            }
            // The corners and edges, where tiles are partial.
            for (i, j) in [(0, 0), (c.m - 1, c.n - 1), (c.m - 1, 0), (0, c.n - 1)] {
                check(c.batch - 1, i, j);
            }
        }
    }
    let err = (num / den.max(1e-300)).sqrt();
    let mut tflops = None;
    if timing {
        let (start, end) = (Event::new(dev).unwrap(), Event::new(dev).unwrap());
        for _ in 0..3 {
            launch();
        }
        let iters = 20;
        start.record(&stream).unwrap();
        for _ in 0..iters {
            launch();
        }
        end.record(&stream).unwrap();
        end.synchronize().unwrap();
        let ms = start.elapsed_ms(&end).unwrap() as f64 / iters as f64;
        tflops = Some(2.0 * (c.batch * c.m * c.n * c.k) as f64 / (ms * 1e-3) / 1e12);
    }
    stream.synchronize().unwrap();
    (err, tflops)
}

#[test]
fn sm90_gemm_matches_f64_reference() {
    if !gpu_available() {
        eprintln!("skipped: no GPU");
        return;
    }
    let dev = CudaDevice::open(0).unwrap();
    if !dev.arch().starts_with("sm_90") {
        eprintln!("skipped: {} is not sm_90", dev.arch());
        return;
    }
    let timing = std::env::var_os("FERRODNN_SM90_TIMING").is_some();
    let small = [
        Case { batch: 1, m: 256, n: 512, k: 128, a_kmajor: true, b_kmajor: false, out: DataType::Bf16, tf32: false },
        Case { batch: 1, m: 200, n: 136, k: 72, a_kmajor: true, b_kmajor: true, out: DataType::F32, tf32: false },
        Case { batch: 3, m: 264, n: 200, k: 136, a_kmajor: false, b_kmajor: true, out: DataType::F32, tf32: false },
        Case { batch: 2, m: 72, n: 328, k: 200, a_kmajor: false, b_kmajor: false, out: DataType::F32, tf32: false },
        Case { batch: 1, m: 1000, n: 1000, k: 1000, a_kmajor: true, b_kmajor: false, out: DataType::F32, tf32: false },
        Case { batch: 1, m: 16, n: 520, k: 64, a_kmajor: true, b_kmajor: false, out: DataType::Bf16, tf32: false },
        Case { batch: 3, m: 200, n: 328, k: 136, a_kmajor: true, b_kmajor: false, out: DataType::Bf16, tf32: false },
        Case { batch: 2, m: 136, n: 264, k: 1000, a_kmajor: false, b_kmajor: true, out: DataType::Bf16, tf32: false },
        // Few tiles, long k: split k (and its reduce launch).
        Case { batch: 1, m: 16, n: 200, k: 2048, a_kmajor: true, b_kmajor: false, out: DataType::Bf16, tf32: false },
        Case { batch: 2, m: 40, n: 136, k: 1032, a_kmajor: true, b_kmajor: true, out: DataType::F32, tf32: false },
    ];
    for c in &small {
        let (err, _) = run(&dev, c, None, false, None);
        let tol = if c.out == DataType::F32 { 1e-5 } else { 8e-3 };
        eprintln!("{}x{}x{}x{} a_kmajor {} b_kmajor {} {}: rel err {err:.2e}", c.batch, c.m, c.n, c.k, c.a_kmajor, c.b_kmajor, c.out);
        assert!(err < tol, "rel err {err} >= {tol}");
    }
    // tf32 (f32 inputs, wgmma .tf32): B N-major through the transposed copy, B K-major,
    // batches with a broadcast B, split k; bf16-representable inputs, so f32 accuracy.
    let tf32_small = [
        Case { batch: 1, m: 200, n: 136, k: 72, a_kmajor: true, b_kmajor: false, out: DataType::F32, tf32: true },
        Case { batch: 3, m: 264, n: 200, k: 136, a_kmajor: true, b_kmajor: true, out: DataType::F32, tf32: true },
        Case { batch: 2, m: 72, n: 328, k: 200, a_kmajor: true, b_kmajor: false, out: DataType::Bf16, tf32: true },
        Case { batch: 1, m: 16, n: 200, k: 2048, a_kmajor: true, b_kmajor: false, out: DataType::F32, tf32: true },
    ];
    for c in &tf32_small {
        let (err, _) = run(&dev, c, None, false, None);
        let tol = if c.out == DataType::F32 { 1e-5 } else { 8e-3 };
        eprintln!("tf32 {}x{}x{}x{} b_kmajor {} {}: rel err {err:.2e}", c.batch, c.m, c.n, c.k, c.b_kmajor, c.out);
        assert!(err < tol, "rel err {err} >= {tol}");
    }
    // A fused bias + relu epilogue, through both store paths.
    for c in small.iter().filter(|c| c.out == DataType::Bf16) {
        for kind in [Epi::BiasRelu, Epi::BiasReluHand] {
            let (err, _) = run_with(&dev, c, None, false, None, kind);
            eprintln!("{}x{}x{}x{} {kind:?}: rel err {err:.2e}", c.batch, c.m, c.n, c.k);
            assert!(err < 8e-3, "rel err {err}");
        }
    }
    let big = [
        Case { batch: 1, m: 8192, n: 8192, k: 8192, a_kmajor: true, b_kmajor: false, out: DataType::Bf16, tf32: false },
        Case { batch: 1, m: 4096, n: 4096, k: 4096, a_kmajor: true, b_kmajor: false, out: DataType::Bf16, tf32: false },
        Case { batch: 1, m: 16384, n: 4096, k: 1024, a_kmajor: true, b_kmajor: false, out: DataType::Bf16, tf32: false },
        Case { batch: 1, m: 8192, n: 8192, k: 8192, a_kmajor: true, b_kmajor: true, out: DataType::Bf16, tf32: false },
        Case { batch: 64, m: 512, n: 512, k: 64, a_kmajor: true, b_kmajor: false, out: DataType::Bf16, tf32: false },
        Case { batch: 1, m: 16, n: 8192, k: 8192, a_kmajor: true, b_kmajor: false, out: DataType::Bf16, tf32: false },
        // tf32 (matmul_tf32_8192x8192x8192: f32 in and out; B N-major includes its transpose launch).
        Case { batch: 1, m: 8192, n: 8192, k: 8192, a_kmajor: true, b_kmajor: false, out: DataType::F32, tf32: true },
        Case { batch: 1, m: 8192, n: 8192, k: 8192, a_kmajor: true, b_kmajor: true, out: DataType::F32, tf32: true },
    ];
    // Under compute-sanitizer, the small cases are enough (FERRODNN_SM90_SMALL_ONLY=1).
    let big: &[Case] = if std::env::var_os("FERRODNN_SM90_SMALL_ONLY").is_some() { &[] } else { &big };
    for c in big {
        let chosen = sm90::choose(&problem(c), &Target::new(&dev.arch(), dev.sm_count()), &Default::default());
        eprintln!("chosen: {chosen:?}");
        let (err, tflops) = run(&dev, c, Some(256), timing, None);
        eprintln!(
            "{}{}x{}x{}x{} a_kmajor {} b_kmajor {}: rel err {err:.2e}, TFLOP/s {:?}",
            if c.tf32 { "tf32 " } else { "" },
            c.batch,
            c.m,
            c.n,
            c.k,
            c.a_kmajor,
            c.b_kmajor,
            tflops.map(|t| (t * 10.0).round() / 10.0)
        );
        assert!(err < 8e-3, "rel err {err}");
        if timing {
            for kind in [Epi::BiasRelu, Epi::BiasReluHand] {
                let (err, tflops) = run_with(&dev, c, Some(64), true, None, kind);
                let what = if kind == Epi::BiasRelu { "generated (hoisted loads)" } else { "hand-written (per element)" };
                eprintln!("    with bias + relu epilogue, {what}: rel err {err:.2e}, TFLOP/s {:.1}", tflops.unwrap_or(0.0));
                assert!(err < 8e-3, "rel err {err}");
            }
            // Other configurations, for tuning the heuristic.
            let target = Target::new(&dev.arch(), dev.sm_count());
            let base = sm90::choose(&problem(c), &target, &Default::default());
            for (bn, stages, tma_store, splits) in [(256, 4, false, 1), (128, 6, true, 1), (128, 7, false, 4), (128, 6, false, 2), (64, 8, true, 1)] {
                let cfg = sm90::Config { bn, stages, tma_store, splits, bm: 128, swap: false, ..base };
                if cfg == base || sm90::kernels_with(&problem(c), &identity(), &target, "gemm_probe", cfg).is_none() {
                    continue;
                }
                let (err, tflops) = run(&dev, c, Some(64), true, Some(cfg));
                eprintln!("    bn {bn} stages {stages} tma_store {tma_store} splits {splits}: rel err {err:.2e}, TFLOP/s {:.1}", tflops.unwrap_or(0.0));
                assert!(err < 8e-3, "rel err {err}");
            }
        }
    }
}
