"""Where a training step's time goes, for stock PyTorch and for ferrodnn.torch: a few steps of
bench/train_resnet.py's or bench/train_llama.py's model under torch.profiler, and the top ops and
kernels by self CUDA time and by self CPU time for each run, per step, written to JSON and printed.

Each run: `--warmup` steps (plan builds, cuDNN's benchmark search, the caching allocator's
growth), `--steps` steps timed without the profiler (median step ms), then the same number of
steps under the profiler (CPU and, on CUDA, CUDA activities). Times in the tables are per step
(the profiled total over the steps). Rows are torch.profiler's names: aten ops, CUDA kernels,
`ferrodnn::<op>` (a ferrodnn.torch custom op, its Python included), `ferrodnn::execute`
(ferrodnn's own execute call inside it: buffer checks and the launches, or the CPU engine's
work) and `train_step` (one whole step). A custom op's CPU total less its `ferrodnn::execute`
time is the dispatch and Python around the graph; copies (`aten::copy_`, `aten::contiguous`)
show layout changes such as linear's `_rows`.

Usage (on the GPU machine): python3 bench/profile_step.py resnet --out FILE.json [--steps 5
--warmup 5 --top 30] [train_resnet.py's flags: --batch 128 --image 224 ...]
                           python3 bench/profile_step.py llama --out FILE.json [train_llama.py's flags]
On the CPU (a check of the tool): --device cpu with small sizes (train_resnet's --tiny).
"""
import argparse
import importlib
import json
import os
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from train_common import sync_of, timed_steps  # noqa: E402

SCRIPTS = {"resnet": "train_resnet", "llama": "train_llama"}


def _ms(ev, name):
    """An event average's time `name` (self_cpu_time_total, ...) in ms, 0 where this torch
    version has no such field (older ones name the device times cuda_*)."""
    v = getattr(ev, name, None)
    if v is None:
        v = getattr(ev, name.replace("device", "cuda"), 0)
    return (v or 0) / 1e3


def table(events, steps, key, top):
    """The `top` rows of `events` (torch.profiler key averages) by `key`, times per step."""
    rows = []
    for ev in events:
        rows.append({
            "name": ev.key,
            "calls": ev.count / steps,
            "self_cpu_ms": _ms(ev, "self_cpu_time_total") / steps,
            "cpu_total_ms": _ms(ev, "cpu_time_total") / steps,
            "self_cuda_ms": _ms(ev, "self_device_time_total") / steps,
            "cuda_total_ms": _ms(ev, "device_time_total") / steps,
        })
    rows.sort(key=lambda r: r[key], reverse=True)
    return [r for r in rows if r[key] > 0][:top]


def profile_run(impl, mod, margs, dev, args):
    """Warm-up, timed steps and profiled steps of `impl`: its step time and tables."""
    cuda = dev.type == "cuda"
    sync = sync_of(dev)
    step = mod.setup(impl, margs, dev)
    timed_steps(step, dev, args.warmup)
    _, times = timed_steps(step, dev, args.steps, start=args.warmup)
    i = args.warmup + args.steps
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            with record_function("train_step"):
                step(i).item()
            sync()
            i += 1
    events = prof.key_averages()
    out = {"impl": impl, "step_ms_median": statistics.median(times), "step_ms": times, "by_cpu": table(events, args.steps, "self_cpu_ms", args.top)}
    if cuda:
        out["by_cuda"] = table(events, args.steps, "self_cuda_ms", args.top)
        out["cuda_ms_per_step"] = sum(_ms(ev, "self_device_time_total") for ev in events) / args.steps
    out["cpu_ms_per_step"] = sum(_ms(ev, "self_cpu_time_total") for ev in events) / args.steps
    return out


def show(run, key, what):
    print(f"\n{run['impl']}: step {run['step_ms_median']:.2f} ms (median, unprofiled); top by {what} per step")
    print(f"{'ms':>9} {'calls':>7}  name")
    for r in run[key]:
        print(f"{r[key.replace('by_', 'self_') + '_ms']:9.3f} {r['calls']:7.1f}  {r['name'][:110]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="Other flags go to the training script's parser.")
    ap.add_argument("model", choices=list(SCRIPTS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--impls", default="torch,ferrodnn", help="runs, comma-separated (torch, ferrodnn; resnet also torch.compile)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=30)
    args, rest = ap.parse_known_args()
    mod = importlib.import_module(SCRIPTS[args.model])
    margs = mod.parser(out_required=False).parse_args(rest)
    dev = torch.device(margs.device)
    torch.backends.cudnn.benchmark = True
    runs = [profile_run(impl, mod, margs, dev, args) for impl in args.impls.split(",")]
    report = {
        "kind": "profile", "model": args.model, "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
        "config": vars(margs), "profile": {k: v for k, v in vars(args).items() if k != "out"}, "runs": runs,
    }
    for run in runs:
        if "by_cuda" in run:
            show(run, "by_cuda", "self CUDA time")
        show(run, "by_cpu", "self CPU time")
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
