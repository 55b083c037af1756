"""The benchmark harness: runs a suite of workloads on ferrodnn and, in the same run on the same
GPU, the same workloads through PyTorch (cuDNN, cuBLAS, flash attention inside), plus the two
ceilings (a large device-to-device copy and a large bf16 GEMM). Writes <out>/<gpu>.json in the
shape BENCHMARKS.md is rendered from (bench/render.py).

Usage (on the GPU machine): python3 bench/run.py --ferrodnn PATH/TO/ferrodnn --out DIR [--suite memory-bound|small|groupnorm|gemm|gemm-sweep|attention|attention-sweep] [--rounds N]
The memory-bound suite writes <out>/<gpu>.json, other suites <out>/<gpu>-<suite>.json. Each side's time is the median over
N interleaved rounds (ferrodnn's process, then PyTorch and cuDNN; 3 by default), and each row keeps its rounds' ratios.
"""
import argparse, datetime, json, os, re, subprocess, sys, tempfile

import torch
import torch.nn.functional as F

dev = "cuda"
torch.backends.cudnn.benchmark = True


def bench(fn, iters=50, warm=10, batch=20):
    """Per-call time in ms: the median over batches of `batch` back-to-back calls timed with
    CUDA events after warm-up (the stream kept busy, as ferrodnn's side is timed)."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(max(3, iters // batch)):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(batch):
            fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) / batch)
    ts.sort()
    return ts[len(ts) // 2]


def rooflines():
    x = torch.empty(2**30, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    copy_ms = bench(lambda: y.copy_(x), 20, 5)
    del x, y
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn_like(a)
    gemm_ms = bench(lambda: a @ b, 20, 5)
    return {"copy_gbs": 2 * 2**30 / copy_ms / 1e6, "gemm_bf16_tflops": 2 * 8192**3 / gemm_ms / 1e9}


def torch_memory_bound():
    """PyTorch's time for each workload id of the memory-bound suite."""
    out = {}
    bf = torch.bfloat16
    for (t, hd) in [(16384, 4096), (65536, 1024)]:
        X = torch.randn(t, hd, device=dev, dtype=bf)
        g = torch.randn(hd, device=dev, dtype=bf)
        bb = torch.randn_like(g)
        out[f"layernorm_fwd_bf16_{t}x{hd}"] = bench(lambda: F.layer_norm(X, (hd,), g, bb))
        out[f"rmsnorm_fwd_bf16_{t}x{hd}"] = bench(lambda: F.rms_norm(X, (hd,), g))
        out[f"softmax_fwd_bf16_{t}x{hd}"] = bench(lambda: torch.softmax(X, -1))
        Xg = X.clone().requires_grad_(True)
        gg = g.clone().requires_grad_(True)
        bg = bb.clone().requires_grad_(True)
        Y = F.layer_norm(Xg, (hd,), gg, bg)
        dY = torch.randn_like(Y)
        out[f"layernorm_bwd_bf16_{t}x{hd}"] = bench(lambda: torch.autograd.grad(Y, (Xg, gg, bg), dY, retain_graph=True))
        Y2 = F.rms_norm(Xg, (hd,), gg)
        out[f"rmsnorm_bwd_bf16_{t}x{hd}"] = bench(lambda: torch.autograd.grad(Y2, (Xg, gg), dY, retain_graph=True))
        del X, Xg, Y, Y2, dY
    X = torch.randn(32, 256, 56, 56, device=dev, dtype=torch.float16).to(memory_format=torch.channels_last)
    bn = torch.nn.BatchNorm2d(256).to(dev).half().to(memory_format=torch.channels_last).train()
    out["batchnorm_train_fwd_fp16_nhwc_32x256x56x56"] = bench(lambda: bn(X))
    X = torch.randn(32, 64, 112, 112, device=dev, dtype=torch.float16).to(memory_format=torch.channels_last)
    out["maxpool3x3s2_fwd_fp16_nhwc_32x64x112x112"] = bench(lambda: F.max_pool2d(X, 3, 2, 1))
    out["avgpool3x3s2_fwd_fp16_nhwc_32x64x112x112"] = bench(lambda: F.avg_pool2d(X, 3, 2, 1))
    a = torch.randn(16384, 4096, device=dev, dtype=bf)
    b = torch.randn_like(a)
    out["pointwise_chain5_bf16_16384x4096"] = bench(lambda: torch.sigmoid((a * b + a) * 0.5) * b)
    del a, b
    # The workloads of ferrodnn-cli/src/bench_memory.rs.
    h16 = torch.float16
    for layout in ["nhwc", "nchw"]:
        fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
        X = torch.randn(32, 256, 56, 56, device=dev, dtype=h16).to(memory_format=fmt).requires_grad_(True)
        bn = torch.nn.BatchNorm2d(256).to(dev).half().to(memory_format=fmt).train()
        Y = bn(X)
        dY = torch.randn_like(Y)
        out[f"batchnorm_bwd_fp16_{layout}_32x256x56x56"] = bench(lambda: torch.autograd.grad(Y, (X, bn.weight, bn.bias), dY, retain_graph=True))
        del X, Y, dY
    X = torch.randn(32, 64, 112, 112, device=dev, dtype=h16).to(memory_format=torch.channels_last).requires_grad_(True)
    for name, fn in [("maxpool3x3s2", lambda x: F.max_pool2d(x, 3, 2, 1)), ("avgpool3x3s2", lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=True))]:
        Y = fn(X)
        dY = torch.randn_like(Y)
        out[f"{name}_bwd_fp16_nhwc_32x64x112x112"] = bench(lambda: torch.autograd.grad(Y, X, dY, retain_graph=True))
    del X, Y, dY
    for layout in ["nchw", "nhwc"]:
        fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
        X = torch.randn(32, 128, 64, 64, device=dev, dtype=bf).to(memory_format=fmt).requires_grad_(True)
        w = torch.randn(128, device=dev, dtype=bf, requires_grad=True)
        b2 = torch.randn(128, device=dev, dtype=bf, requires_grad=True)
        out[f"instancenorm_fwd_bf16_{layout}_32x128x64x64"] = bench(lambda: F.instance_norm(X, weight=w, bias=b2))
        Y = F.instance_norm(X, weight=w, bias=b2)
        dY = torch.randn_like(Y)
        out[f"instancenorm_bwd_bf16_{layout}_32x128x64x64"] = bench(lambda: torch.autograd.grad(Y, (X, w, b2), dY, retain_graph=True))
        del X, Y, dY
    out.update(torch_groupnorm())
    for (t, hd) in [(16384, 4096), (65536, 1024)]:
        a = torch.randn(t, hd, device=dev, dtype=bf)
        b = torch.randn_like(a)
        g = torch.randn(hd, device=dev, dtype=bf)
        bb = torch.randn_like(g)

        def add_ln():
            h = a + b
            return h, F.layer_norm(h, (hd,), g, bb)

        def add_rms():
            h = a + b
            return h, F.rms_norm(h, (hd,), g)

        out[f"add_layernorm_fwd_bf16_{t}x{hd}"] = bench(add_ln)
        out[f"add_rmsnorm_fwd_bf16_{t}x{hd}"] = bench(add_rms)
        del a, b
    return out


def torch_groupnorm():
    """PyTorch's time for each workload of the groupnorm suite (groupnorm_workloads in
    ferrodnn-cli/src/bench_memory.rs, also in the memory-bound suite): group normalization (32
    groups) + SiLU forward, and the backward, on a diffusion UNet's shapes, fp16."""
    out = {}
    h16 = torch.float16
    gn_shapes = [("nhwc", n, c, hw) for n in (2, 8) for (c, hw) in ((320, 64), (640, 32), (1280, 16))] + [("nchw", 8, 320, 64)]
    for layout, n, c, hw in gn_shapes:
        fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
        tag = f"{layout}_{n}x{c}x{hw}x{hw}_g32"
        X = torch.randn(n, c, hw, hw, device=dev, dtype=h16).to(memory_format=fmt)
        w = torch.randn(c, device=dev, dtype=h16)
        b2 = torch.randn(c, device=dev, dtype=h16)
        out[f"groupnorm_silu_fwd_fp16_{tag}"] = bench(lambda: F.silu(F.group_norm(X, 32, w, b2)))
        Xg, wg, bg = X.clone().requires_grad_(True), w.clone().requires_grad_(True), b2.clone().requires_grad_(True)
        Y = F.group_norm(Xg, 32, wg, bg)
        dY = torch.randn_like(Y)
        out[f"groupnorm_bwd_fp16_{tag}"] = bench(lambda: torch.autograd.grad(Y, (Xg, wg, bg), dY, retain_graph=True))
        del X, Xg, Y, dY
    return out


GEMM_SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (16384, 4096, 1024)]


def torch_gemm():
    """PyTorch's (cuBLAS) time for each workload id of the gemm suite: row-major A [m, k] and
    B [k, n] as on our side; bias + relu through addmm then relu; tf32 with allow_tf32."""
    out = {}
    bf = torch.bfloat16
    for (m, n, k) in GEMM_SHAPES:
        a = torch.randn(m, k, device=dev, dtype=bf)
        b = torch.randn(k, n, device=dev, dtype=bf)
        bias = torch.randn(n, device=dev, dtype=bf)
        out[f"matmul_bf16_{m}x{n}x{k}"] = bench(lambda: a @ b)
        out[f"matmul_bias_relu_bf16_{m}x{n}x{k}"] = bench(lambda: F.relu(torch.addmm(bias, a, b)))
        del a, b, bias
    a = torch.randn(8192, 8192, device=dev, dtype=torch.float16)
    b = torch.randn_like(a)
    out["matmul_fp16_8192x8192x8192"] = bench(lambda: a @ b)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.float32)
    b = torch.randn_like(a)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    out["matmul_tf32_8192x8192x8192"] = bench(lambda: a @ b)
    torch.backends.cuda.matmul.allow_tf32 = old
    del a, b
    a = torch.randn(64, 512, 64, device=dev, dtype=bf)
    b = torch.randn(64, 64, 512, device=dev, dtype=bf)
    out["matmul_bf16_batch64_512x512x64"] = bench(lambda: torch.bmm(a, b))
    a = torch.randn(16, 8192, device=dev, dtype=bf)
    b = torch.randn(8192, 8192, device=dev, dtype=bf)
    out["matmul_bf16_16x8192x8192"] = bench(lambda: a @ b)
    del a, b
    # fp8 e4m3 through cuBLASLt (torch._scaled_mm: B column-major, the output scaled by
    # scale_a * scale_b = 0.5, bf16), as our fp8 workloads; fast accumulation (the tensor cores'
    # own adder), as our first-ranked plan (knob fp8_fast_accum).
    for (m, n, k) in [(8192, 8192, 8192), (4096, 4096, 4096)]:
        try:
            a8 = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
            b8 = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn)
            sa = torch.tensor(0.5, device=dev)
            sb = torch.tensor(1.0, device=dev)
            out[f"matmul_fp8_e4m3_{m}x{n}x{k}"] = bench(lambda: torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=bf, use_fast_accum=True))
            if m == 8192:
                # With the output's amax (f32), as the next fp8 scale is made from it.
                def mm_amax():
                    y = torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=bf, use_fast_accum=True)
                    return y, y.abs().amax().float()

                out[f"matmul_fp8_e4m3_amax_{m}x{n}x{k}"] = bench(mm_amax)
            del a8, b8
        except Exception as ex:  # noqa: BLE001 - report and go on without this shape
            print(f"torch._scaled_mm {m}x{n}x{k} failed: {ex}", flush=True)
    return out


GEMM_SWEEP_ID = re.compile(r"^mm_.*_b(\d+)m(\d+)n(\d+)k(\d+)_([nt])([nt])$")


def torch_gemm_sweep(ids):
    """PyTorch's (cuBLAS) time for each workload id of the GEMM sweep (gemm_sweep_workloads in
    ferrodnn-cli/src/bench_gemm.rs), the problem parsed from the id: bf16, A and B stored as on
    our side (a transposed operand is a transposed view of a row-major tensor)."""
    out = {}
    bf = torch.bfloat16
    for wid in ids:
        m = GEMM_SWEEP_ID.match(wid)
        if not m:
            continue
        batch, mm, n, k = (int(x) for x in m.groups()[:4])
        ta, tb = m.group(5) == "t", m.group(6) == "t"
        lead = (batch,) if batch > 1 else ()

        def operand(rows, cols, t):
            x = torch.randn(*lead, *((cols, rows) if t else (rows, cols)), device=dev, dtype=bf)
            return x.transpose(-1, -2) if t else x

        a, b = operand(mm, k, ta), operand(k, n, tb)
        out[wid] = bench(lambda: torch.matmul(a, b))
        del a, b
    torch.cuda.empty_cache()
    return out


def cudnn_gemm():
    """cuDNN's own graph-API matmul + bias + relu (cudnn-frontend), when its Python module
    imports: workload id -> ms. Optional: {} when cudnn is missing or a graph does not build."""
    try:
        import cudnn
    except Exception as ex:  # noqa: BLE001 - any import failure means "not available"
        print(f"cudnn frontend not available: {ex}", flush=True)
        return {}
    out = {}
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    for (m, n, k) in GEMM_SHAPES:
        try:
            A = torch.randn(1, m, k, device=dev, dtype=torch.bfloat16)
            B = torch.randn(1, k, n, device=dev, dtype=torch.bfloat16)
            bias = torch.randn(1, 1, n, device=dev, dtype=torch.bfloat16)
            Y = torch.empty(1, m, n, device=dev, dtype=torch.bfloat16)
            g = cudnn.pygraph(handle=handle, io_data_type=cudnn.data_type.BFLOAT16, intermediate_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT)
            a, bb, bi = g.tensor_like(A), g.tensor_like(B), g.tensor_like(bias)
            y = g.relu(input=g.add(a=g.matmul(A=a, B=bb), b=bi))
            y.set_output(True).set_data_type(cudnn.data_type.BFLOAT16)
            g.build([cudnn.heur_mode.A])
            ws = torch.empty(max(g.get_workspace_size(), 1), device=dev, dtype=torch.uint8)
            vp = {a: A, bb: B, bi: bias, y: Y}
            out[f"matmul_bias_relu_bf16_{m}x{n}x{k}"] = bench(lambda: g.execute(vp, ws, handle=handle))
        except Exception as ex:  # noqa: BLE001 - report and go on without this shape
            print(f"cudnn matmul+bias+relu {m}x{n}x{k} failed: {ex}", flush=True)
    return out


def ours(exe, suite, cache_dir, runs):
    env = dict(os.environ, FERRODNN_CACHE_DIR=cache_dir)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    subprocess.run([exe, "bench", "--suite", suite, "--out", path, "--runs", str(runs)], env=env, check=True)
    with open(path) as f:
        report = json.load(f)
    return {w["id"]: w for w in report["workloads"]}, report.get("handle_ms")


SMALL_ROWS = re.compile(r"^(layernorm|rmsnorm|softmax|add_gelu)_fwd_bf16_(\d+)x(\d+)$")


def torch_small(ids):
    """PyTorch's time for each workload of the small-sizes suite (`small` in
    ferrodnn-cli/src/bench.rs), the shape parsed from the id; its attention row as the attention
    sweep's."""
    out = {}
    bf = torch.bfloat16
    for wid in ids:
        m = SMALL_ROWS.match(wid)
        if not m:
            continue
        op, t, hd = m.group(1), int(m.group(2)), int(m.group(3))
        x = torch.randn(t, hd, device=dev, dtype=bf)
        y = torch.randn_like(x)
        g = torch.randn(hd, device=dev, dtype=bf)
        b = torch.randn_like(g)
        fn = {
            "layernorm": lambda: F.layer_norm(x, (hd,), g, b),
            "rmsnorm": lambda: F.rms_norm(x, (hd,), g),
            "softmax": lambda: torch.softmax(x, -1),
            "add_gelu": lambda: F.gelu(x + y),
        }[op]
        out[wid] = bench(fn, iters=200)
    if "matmul_bf16_64x64x64" in ids:
        a = torch.randn(64, 64, device=dev, dtype=bf)
        out["matmul_bf16_64x64x64"] = bench(lambda: a @ a, iters=200)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_attention import torch_attention_sweep

    out.update(torch_attention_sweep(bench, [i for i in ids if i.startswith("sdpa_")]))
    return out


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ferrodnn", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--suite", default="memory-bound")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (ferrodnn's process, then PyTorch and cuDNN), each side's time the median over rounds: the GPU's clocks and power move between rounds by more than some rows' margins")
    ap.add_argument("--commit", default=os.environ.get("FERRODNN_COMMIT", "unknown"))
    ap.add_argument("--skip-cold", action="store_true", help="no separate first process with an empty kernel cache (a shorter device call): the first round's first builds, from an empty cache, are the cold ones; no warm-disk times")
    ap.add_argument("--cache", default=None, help="a kernel cache folder to use (e.g. filled ahead by `ferrodnn compile-cases --bench SUITE`); implies --skip-cold, and no build is reported as cold")
    args = ap.parse_args()
    if args.cache:
        args.skip_cold = True

    name = torch.cuda.get_device_name()
    gpu = "h100" if "H100" in name else "h200" if "H200" in name else name.lower().replace(" ", "_")
    roof = rooflines()
    print(f"rooflines: {roof}", flush=True)
    cache = args.cache or tempfile.mkdtemp(prefix="ferrodnn-kernels-")
    cold, cold_handle = ({}, None) if args.skip_cold else ours(args.ferrodnn, args.suite, cache, 3)  # first process: empty kernel cache
    rounds = []  # per round: (ours by workload id, handle ms, torch ms by id, cuDNN graph ms by id)
    if args.suite in ("attention", "attention-sweep"):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from torch_attention import torch_attention, torch_attention_sweep
    for _ in range(max(1, args.rounds)):
        mine, handle = ours(args.ferrodnn, args.suite, cache, args.runs)  # a new process: warm disk cache (but for the first with --skip-cold)
        cudnn_ms = {}
        if args.suite == "memory-bound":
            theirs = torch_memory_bound()
        elif args.suite == "groupnorm":
            theirs = torch_groupnorm()
        elif args.suite == "gemm":
            theirs = torch_gemm()
            cudnn_ms = cudnn_gemm()
        elif args.suite == "attention":
            theirs = torch_attention(bench)
        elif args.suite == "attention-sweep":
            theirs = torch_attention_sweep(bench, mine.keys())
        elif args.suite == "gemm-sweep":
            theirs = torch_gemm_sweep(mine.keys())
        elif args.suite == "small":
            theirs = torch_small(list(mine.keys()))
        else:
            theirs = {}
        rounds.append((mine, handle, theirs, cudnn_ms))
    warm, warm_handle = rounds[0][0], rounds[0][1]
    workloads = []
    for wid, w in warm.items():
        ours_ms = median(r[0].get(wid, {}).get("ours_ms") for r in rounds)
        row = {"id": wid, "ours_ms": ours_ms, "torch_ms": median(r[2].get(wid) for r in rounds), "bytes": w.get("bytes"), "flops": w.get("flops")}
        if ours_ms and w.get("flops"):
            row["ours_tflops"] = w["flops"] / ours_ms / 1e9
            if row["torch_ms"]:
                row["torch_tflops"] = w["flops"] / row["torch_ms"] / 1e9
        cudnn = median(r[3].get(wid) for r in rounds)
        if cudnn:
            row["cudnn_graph_ms"] = cudnn
            row["ratio_vs_cudnn_graph"] = cudnn / ours_ms if ours_ms else None
        row["ratio"] = row["torch_ms"] / ours_ms if ours_ms and row["torch_ms"] else None
        host_us = median(r[0].get(wid, {}).get("execute_host_us") for r in rounds)
        if host_us:
            row["execute_host_us"] = host_us
        # Each round's own ratios: their spread is the run-to-run noise of the row.
        per = [(r[2].get(wid), r[0].get(wid, {}).get("ours_ms"), r[3].get(wid)) for r in rounds]
        if len(rounds) > 1 and row["ratio"]:
            row["ratio_rounds"] = [t / o for t, o, _ in per if t and o]
            if cudnn:
                row["ratio_vs_cudnn_graph_rounds"] = [c / o for _, o, c in per if c and o]
        if ours_ms:
            if w.get("flops"):
                # fp8's tensor-core rate is twice bf16's: its ceiling is twice the measured bf16 GEMM.
                ceiling = roof["gemm_bf16_tflops"] * (2 if "_fp8_" in wid else 1)
                row["pct_roofline"] = 100 * w["flops"] / ours_ms / 1e9 / ceiling
            elif w.get("bytes"):
                row["pct_roofline"] = 100 * w["bytes"] / ours_ms / 1e6 / roof["copy_gbs"]
        if args.cache:  # a cache filled ahead: the first round's first builds are warm-disk ones
            row["build_ms"] = {"cold": None, "warm_disk": w.get("build_ms_first"), "in_process": w.get("build_ms_in_process")}
        elif args.skip_cold:  # the first round's process started with an empty cache: its first build is the cold one
            row["build_ms"] = {"cold": w.get("build_ms_first"), "warm_disk": None, "in_process": w.get("build_ms_in_process")}
        else:
            row["build_ms"] = {"cold": cold.get(wid, {}).get("build_ms_first"), "warm_disk": w.get("build_ms_first"), "in_process": w.get("build_ms_in_process")}
        if "error" in w:
            row["error"] = w["error"]
        workloads.append(row)
    result = {
        "gpu": gpu,
        "device": name,
        "date": datetime.date.today().isoformat(),
        "commit": args.commit,
        "software": f"PyTorch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}",
        "suite": args.suite,
        "rounds": len(rounds),
        "roofline": roof,
        "handle_ms": {"cold": warm_handle, "warm_disk": None} if args.skip_cold else {"cold": cold_handle, "warm_disk": warm_handle},
        "workloads": workloads,
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{gpu}.json" if args.suite == "memory-bound" else f"{gpu}-{args.suite}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
