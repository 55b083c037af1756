"""Host time per call of ferrodnn.torch's ops against PyTorch's own, forward and forward +
backward, on tiny tensors (so that the engines' work is negligible and what is timed is the
per-call host path: op dispatch, autograd, cache keys, allocations, the binding's execute).

Each case runs batches of `--calls` calls timed with a CPU clock; on CUDA the device is
synchronized before and after each batch (so a batch never waits on earlier work, and with tiny
kernels the GPU keeps up with the launches: the figure is host time a call). The median batch,
in microseconds a call, per op, mode and library; ratio = ferrodnn / torch (above 1: ferrodnn's
call costs more host time). Two more columns split ferrodnn's time: `ferrodnn_noexec_us`, the
same calls with every built graph's `execute` replaced by a no-op (the Python path: argument
checks, dispatch, autograd, cache keys, allocations), and `execute_us`, the `execute` calls that
one op call makes (recorded packs replayed: the binding's checks and launches, and on the CPU the
engine's work, which is not negligible even on tiny tensors: thread-pool wake-ups).

Modes: "fwd", the op under torch.no_grad(); "fwd_bwd", the op on inputs that require grad and
torch.autograd.grad of its output (with a fixed output gradient) to every input that does.

Usage: python3 bench/host_ops.py --out FILE.json [--device cpu|cuda] [--dtype fp32|bf16|fp16]
[--ops conv2d,linear] [--modes fwd,fwd_bwd] [--calls 200 --batches 15]
       python3 bench/host_ops.py --profile conv2d:fwd_bwd [--device cpu]   (cProfile of our calls)
"""
import argparse
import cProfile
import json
import os
import pstats
import time

import torch
import torch.nn.functional as F

import ferrodnn.torch as ft
from ferrodnn.torch import _common

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def cases(dev, dtype):
    """name -> (make, ours, theirs): make(grad) gives the inputs (a list; those that may need a
    gradient first, with `grad` they require it), ours(*inputs) and theirs(*inputs) the output."""
    g = torch.Generator().manual_seed(0)

    def t(*shape, cl=False, grad=False):
        x = torch.randn(*shape, generator=g).to(dev, dtype)
        if cl:
            x = x.contiguous(memory_format=torch.channels_last)
        return x.requires_grad_(grad)

    def conv_make(grad):
        return [t(2, 4, 6, 6, cl=True, grad=grad), t(4, 4, 3, 3, cl=True, grad=grad)]

    def bn_make(grad):
        # input, weight, bias, residual (grads); running mean and var (buffers)
        ins = [t(2, 4, 6, 6, cl=True, grad=grad), t(4, grad=grad), t(4, grad=grad), t(2, 4, 6, 6, cl=True, grad=grad)]
        return ins + [torch.zeros(4, device=dev, dtype=dtype), torch.ones(4, device=dev, dtype=dtype)]

    def bn_ours(x, w, b, r, rm, rv):
        return ft.batch_norm(x, rm, rv, w, b, training=True, activation="relu", residual=r)

    def bn_theirs(x, w, b, r, rm, rv):
        return F.relu(F.batch_norm(x, rm, rv, w, b, training=True) + r)

    def lin_make(grad):
        return [t(4, 8, grad=grad), t(8, 8, grad=grad), t(8, grad=grad)]

    def ln_make(grad):
        return [t(4, 16, grad=grad), t(16, grad=grad), t(16, grad=grad)]

    def sdpa_make(grad):
        return [t(1, 2, 8, 8, grad=grad) for _ in range(3)]

    def pool_make(grad):
        return [t(2, 4, 6, 6, cl=True, grad=grad)]

    return {
        "conv2d": (conv_make, lambda x, w: ft.conv2d(x, w, padding=1), lambda x, w: F.conv2d(x, w, padding=1)),
        "batch_norm_residual_relu": (bn_make, bn_ours, bn_theirs),
        "linear": (lin_make, ft.linear, F.linear),
        "layer_norm": (ln_make, lambda x, w, b: ft.layer_norm(x, (16,), w, b), lambda x, w, b: F.layer_norm(x, (16,), w, b)),
        "scaled_dot_product_attention": (sdpa_make, ft.scaled_dot_product_attention, F.scaled_dot_product_attention),
        "max_pool2d": (pool_make, lambda x: ft.max_pool2d(x, 3, 2, 1), lambda x: F.max_pool2d(x, 3, 2, 1)),
    }


def call(fn, make, mode):
    """A function of no arguments that runs one call of `fn` in `mode`."""
    if mode == "fwd":
        ins = make(False)

        def run():
            with torch.no_grad():
                return fn(*ins)

        return run
    ins = make(True)
    need = [x for x in ins if x.requires_grad]
    grad = torch.ones_like(fn(*ins))

    def run():
        y = fn(*ins)
        return torch.autograd.grad(y, need, grad)

    return run


def host_us(run, sync, calls, batches):
    for _ in range(max(20, calls // 10)):
        run()
    sync()
    per = []
    for _ in range(batches):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            run()
        sync()
        per.append((time.perf_counter() - t0) * 1e6 / calls)
    per.sort()
    return per[len(per) // 2], per[0]


class _Graphs:
    """Swaps the `execute` of every built graph of ferrodnn.torch's cache for `fn(graph, pack,
    ws, keyword arguments)` while in a `with` block."""

    def __init__(self, fn):
        self.fn, self.saved = fn, []

    def __enter__(self):
        for b in list(_common._GRAPHS.values()):
            g = b.graph
            fake = lambda pack, ws, g=g, **kw: self.fn(g, pack, ws, kw)  # noqa: E731
            if hasattr(b, "_execute"):
                self.saved.append((b, "_execute", b._execute))
                b._execute = fake
            else:  # (before session 35 the graph's method was called directly)
                self.saved.append((b, "graph", g))
                b.graph = type("G", (), {"execute": staticmethod(fake), "get_workspace_size": g.get_workspace_size})()
        return self

    def __exit__(self, *exc):
        for b, attr, v in self.saved:
            setattr(b, attr, v)


def split(run, sync, calls, batches):
    """(median us a call with execute a no-op, median us of the execute calls of one call)."""
    with _Graphs(lambda g, pack, ws, kw: None):
        noexec = host_us(run, sync, calls, batches)[0]
    recorded = []
    with _Graphs(lambda g, pack, ws, kw: recorded.append((g, dict(pack), ws, kw))):
        run()
    sync()

    def replay():
        for g, pack, ws, kw in recorded:
            g.execute(pack, ws, **kw)

    return noexec, host_us(replay, sync, calls, batches)[0]


def profile(dev, dtype, what, calls):
    name, _, mode = what.partition(":")
    make, ours, _ = cases(dev, dtype)[name]
    run = call(ours, make, mode or "fwd")
    for _ in range(50):
        run()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        run()
    prof.disable()
    st = pstats.Stats(prof)
    st.sort_stats("tottime").print_stats(30)
    st.sort_stats("cumulative").print_stats(40)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=list(DTYPES), default=None, help="default: fp32 on the CPU, bf16 on CUDA")
    ap.add_argument("--ops", default=None, help="comma-separated case names (default: all)")
    ap.add_argument("--modes", default="fwd,fwd_bwd")
    ap.add_argument("--calls", type=int, default=200, help="calls a timed batch")
    ap.add_argument("--batches", type=int, default=15)
    ap.add_argument("--profile", default=None, help="OP[:MODE]: cProfile ferrodnn's calls of one case instead of timing")
    args = ap.parse_args()
    dev = torch.device(args.device)
    dtype = DTYPES[args.dtype or ("bf16" if dev.type == "cuda" else "fp32")]
    if args.profile:
        profile(dev, dtype, args.profile, args.calls * args.batches)
        return
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    all_cases = cases(dev, dtype)
    names = args.ops.split(",") if args.ops else list(all_cases)
    rows = []
    for name in names:
        make, ours, theirs = all_cases[name]
        for mode in args.modes.split(","):
            row = {"op": name, "mode": mode}
            for lib, fn in (("torch", theirs), ("ferrodnn", ours)):
                med, best = host_us(call(fn, make, mode), sync, args.calls, args.batches)
                row[f"{lib}_us"], row[f"{lib}_best_us"] = round(med, 2), round(best, 2)
            noexec, execute = split(call(ours, make, mode), sync, args.calls, args.batches)
            row["ferrodnn_noexec_us"], row["execute_us"] = round(noexec, 2), round(execute, 2)
            row["ratio"] = round(row["ferrodnn_us"] / row["torch_us"], 2)
            print(json.dumps(row), flush=True)
            rows.append(row)
    load = os.getloadavg()
    report = {
        "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "dtype": str(dtype),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "loadavg": [round(x, 2) for x in load],
        "calls": args.calls,
        "batches": args.batches,
        "rows": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
