"""Render BENCHMARKS.md and bench/results/<gpu>-ratios.png from bench/results/<gpu>.json.

Usage: python3 bench/render.py [bench/results/h100.json ...]   (needs matplotlib for the chart)
"""
import glob, json, os, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def spread(ratio, rounds):
    """A ratio, with the range of its rounds' own ratios when the run had several."""
    if ratio is None or not rounds or len(rounds) < 2:
        return fmt(ratio, ".3f")
    return f"{ratio:.3f} ({min(rounds):.3f}-{max(rounds):.3f})"


def chart(result, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no chart", file=sys.stderr)
        return False
    rows = [w for w in result["workloads"] if w.get("ratio")]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(10, 0.4 * len(rows) + 1.5))
    names = [w["id"] for w in rows]
    ratios = [w["ratio"] for w in rows]
    ax.barh(names, ratios, color=["tab:green" if r >= 1 else "tab:red" for r in ratios])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("speed vs PyTorch (torch_ms / ours_ms; > 1 is faster)")
    ax.set_title(f"ferrodnn on {result['device']} ({result['date']}, {result['commit'][:10]})")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    return True


def render_cpu(r):
    """The CPU section of BENCHMARKS.md from bench/cpu.py's JSON (kind "cpu")."""
    out = [f"## CPU: {r['device']} (the 2-core build machine)", "",
           f"{r['date']}, commit `{r['commit'][:12]}`, {r.get('software', '')}; `bench/cpu.py`, median over {r.get('rounds')} rounds of each side's median of {r.get('runs')} calls after a warm-up, "
           "ferrodnn through its Python package (the fast CPU engine) beside numpy and PyTorch CPU in the same process. "
           "ratio = their ms / ours (above 1: ferrodnn is faster). load = the machine's 1-minute load average before / after "
           "the row: this machine is shared with builds, so rows taken above a load of about 1.5 are indicative only; "
           "final figures need a quiet machine. pct copy bw: a numpy copy of the same array (in and out once) timed in the "
           "same run, against ours.", "",
           "| workload | ours ms | numpy ms | torch ms | ratio vs numpy | ratio vs torch | ours GFLOP/s or GB/s | pct copy bw | load |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for w in r["workloads"]:
        rate = w.get("ours_gflops") or w.get("ours_gbs")
        load = " / ".join(f"{v:.1f}" for v in (w.get("load") or []))
        out.append(f"| {w['id']} | {fmt(w.get('ours_ms'), '.2f')} | {fmt(w.get('numpy_ms'), '.2f')} | {fmt(w.get('torch_ms'), '.2f')} | "
                   f"{fmt(w.get('ratio_vs_numpy'), '.2f')} | {fmt(w.get('ratio_vs_torch'), '.2f')} | {fmt(rate, '.1f')} | {fmt(w.get('pct_copy_bw'), '.0f')} | {load} |")
    if r.get("note"):
        out += ["", r["note"]]
    out.append("")
    return out


def render_train(r):
    """A training comparison (bench/train_llama.py, bench/train_resnet.py: "model" "resnet"):
    step time, peak memory and losses per run."""
    c = r["config"]
    if r.get("model") == "resnet":
        blocks = "1,1,1,1" if c.get("tiny") else c["blocks"]
        width = 8 if c.get("tiny") else c["width"]
        name = "ResNet-50" if (blocks, width) == ("3,4,6,3", 64) else f"ResNet (bottleneck blocks {blocks}, width {width})"
        out = [f"## {r['device']} ({r['gpu']}): training, {name}", "",
               f"{r['date']}, commit `{r['commit'][:12]}`, PyTorch {r['torch']}; batch {c['batch']} at {c['image']}x{c['image']}, "
               f"{c['classes']} classes, {c['dtype']}, channels-last, batchnorm in training mode, SGD with momentum (lr {c['lr']}), "
               f"{c['steps']} steps from the same weights and data; median step time after {c['warmup']} warm-up steps.", ""]
    else:
        out = [f"## {r['device']} ({r['gpu']}): training, Llama-style stack", "",
               f"{r['date']}, commit `{r['commit'][:12]}`, PyTorch {r['torch']}; {c['layers']} layers, dim {c['dim']}, "
               f"{c['heads']} query / {c['kv_heads']} key-value heads, FFN {c['ffn']}, vocabulary {c['vocab']}, sequence {c['seq']}, "
               f"batch {c['batch']}, bf16, AdamW, {c['steps']} steps from the same weights and data.", ""]
    if r.get("note"):
        out += [r["note"], ""]
    out += ["| run | step ms (median) | peak MiB | loss, first step | loss, last step |", "|---|---:|---:|---:|---:|"]
    for run in r["runs"]:
        if run.get("error"):
            out.append(f"| {run['impl']} | not run: {' '.join(run['error'][:300].split()).replace('|', '/')} | - | - | - |")
            continue
        out.append(f"| {run['impl']} | {run['step_ms_median']:.2f} | {fmt(run['peak_mb'], '.0f')} | {run['losses'][0]:.4f} | {run['losses'][-1]:.4f} |")
    ratios = []
    if r.get("max_loss_diff") is not None:
        ratios.append(f"Largest difference between the two runs' losses over the steps: {r['max_loss_diff']:.4f}; step-time ratio (PyTorch / ferrodnn): {r['step_ratio']:.2f}")
    if r.get("step_ratio_compile") is not None:
        ratios.append(f"step-time ratio (torch.compile / ferrodnn): {r['step_ratio_compile']:.2f}")
    if ratios:
        out += ["", "; ".join(ratios) + ".", ""]
    else:
        out.append("")
    return out


def render(paths):
    out = ["# Benchmarks", "",
           "Measured by `bench/run.py` (ferrodnn and PyTorch in the same run on the same GPU; CUDA-event medians after warm-up).",
           "ratio = torch_ms / ours_ms (above 1: ferrodnn is faster); where a run had several interleaved rounds (ferrodnn, then",
           "PyTorch), each side's time is its median over the rounds and the range in brackets is the rounds' own ratios, the",
           "row's run-to-run noise. pct_roofline = our achieved rate against the binding ceiling",
           "measured in the same run (device-to-device copy bandwidth for memory-bound work, bf16 GEMM rate for compute-bound work).",
           "Build times: cold = first plan build in a new process with an empty kernel cache; warm disk = first build in a new process",
           "with the kernel cache on disk; in process = a rebuild of a graph seen before in the process (the plan cache).", ""]
    cpu = []  # CPU sections, after every GPU section
    for path in paths:
        with open(path) as f:
            r = json.load(f)
        if r.get("kind") == "cpu":
            cpu += render_cpu(r)
            continue
        if r.get("kind") == "train":
            out += render_train(r)
            continue
        png = os.path.splitext(path)[0] + "-ratios.png"
        has_chart = chart(r, png)
        roof = r.get("roofline")
        ceilings = f"Ceilings measured in this run: copy {roof['copy_gbs']:.0f} GB/s, bf16 GEMM {roof['gemm_bf16_tflops']:.0f} TFLOP/s." if roof else ""
        out += [f"## {r['device']} ({r['gpu']}): {r.get('suite', '')}", "",
                f"{r['date']}, commit `{r['commit'][:12]}`, {r.get('software', '')}; suite `{r.get('suite', '')}`.",
                (ceilings
                + (f" Handle creation (device, NVRTC, kernel cache): {r['handle_ms']['warm_disk']:.0f} ms." if (r.get('handle_ms') or {}).get('warm_disk') else "")
                + (f" {r['note']}" if r.get("note") else "")).strip(), "",
                ]
        notes = []  # per-workload notes, as numbered footnotes under the table
        # Compute-bound suites also show TFLOP/s, and the gemm suite cuDNN's own graph API.
        flops = any(w.get("ours_tflops") is not None for w in r["workloads"])
        cudnn = any(w.get("cudnn_graph_ms") is not None for w in r["workloads"])
        head = ["workload", "ours ms", "torch ms", "ratio"]
        head += ["ours TFLOP/s", "torch TFLOP/s"] if flops else []
        head += ["cuDNN graph ms", "ratio vs cuDNN graph"] if cudnn else []
        # (The host's time of one execute alone, where the run measured it: see ferrodnn-cli's bench.)
        host = any(w.get("execute_host_us") is not None for w in r["workloads"])
        head += ["execute host us"] if host else []
        head += ["% of roofline", "build cold / warm disk / in process (ms)"]
        out += ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 2) + "|---|"]
        for w in r["workloads"]:
            b = w.get("build_ms") or {}
            build = " / ".join(fmt(b.get(k), ".3g") for k in ("cold", "warm_disk", "in_process"))
            if w.get("error"):
                out.append(f"| {w['id']} | not run: {w['error']} | {fmt(w.get('torch_ms'), '.4f')} |" + " - |" * (len(head) - 3))
                continue
            wid = w["id"]
            if w.get("note"):
                notes.append(w["note"])
                wid += f" [{len(notes)}]"
            cells = [wid, fmt(w.get("ours_ms"), ".4f"), fmt(w.get("torch_ms"), ".4f"), spread(w.get("ratio"), w.get("ratio_rounds"))]
            cells += [fmt(w.get("ours_tflops"), ".0f"), fmt(w.get("torch_tflops"), ".0f")] if flops else []
            cells += [fmt(w.get("cudnn_graph_ms"), ".4f"), spread(w.get("ratio_vs_cudnn_graph"), w.get("ratio_vs_cudnn_graph_rounds"))] if cudnn else []
            cells += [fmt(w.get("execute_host_us"), ".2f")] if host else []
            cells += [fmt(w.get("pct_roofline"), ".1f"), build]
            out.append("| " + " | ".join(cells) + " |")
        if notes:
            out += [""] + [f"[{i + 1}] {n}" + ("" if i + 1 == len(notes) else "  ") for i, n in enumerate(notes)]
        if has_chart:
            out += ["", f"![ratios]({os.path.relpath(png, ROOT)})"]
        out.append("")
    out += cpu
    with open(os.path.join(ROOT, "BENCHMARKS.md"), "w") as f:
        f.write("\n".join(out))
    print("wrote BENCHMARKS.md")


if __name__ == "__main__":
    paths = sys.argv[1:] or sorted(p for p in glob.glob(os.path.join(ROOT, "bench", "results", "*.json")))
    render(paths)
