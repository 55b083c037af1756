#!/usr/bin/env python3
"""The fast CPU engine beside numpy (its BLAS) and PyTorch CPU (oneDNN for convolutions), on the
issue's CPU targets: f32 matmul 1024^3 and 4096x4096x1024, ResNet-50's 3x3 and 1x1 convolutions
at batch 8 (NCHW f32, PyTorch's default layout, and channels-last), attention forward at
b1 h8 s1024 d64 (plain and causal, beside scaled_dot_product_attention), and softmax and layernorm
over the rows of a 4096x4096 f32 array against the machine's copy bandwidth (numpy's copy of the
same array, measured in the same run: pct_copy_bw = copy time / our time, both moving the array
in and out once).

Each side is timed in the same process on the same arrays: a warm-up call, then the median of
`--runs` calls (wall time of the call; ferrodnn's includes the Python binding's variant-pack
handling). The machine's 1-minute load average is recorded before and after each workload:
figures taken under load are only indicative. Writes JSON (default bench/results/cpu.json).

The sides' thread pools live in one process and would meet on the same cores: after a parallel
region PyTorch's OpenMP workers (libgomp, OMP_WAIT_POLICY unset) spin for a while before they
sleep, and a side timed while another's workers spin runs on the cores left over (measured:
PyTorch's worker spinning about 6 ms of CPU into the next ferrodnn calls after its 2048->512
7x7 convolution, the first one or two of them up to 2x slower). So before each side's timed
calls the process's other threads are first left to settle (until they use under 0.1 ms of CPU
in 5 ms, at most 0.5 s), each side keeping its own runtime's default spin policy. Each row
records, per side and round, the CPU time the other sides' threads took during the side's timed
calls (`*_cross_cpu_ms`, near 0 when settled), the time the side's own threads waited on a run
queue for a core (`*_wait_ms`: more than a few ms means other programs, or its own threads
sharing one core, disturbed it), and the settling waits (`settled_ms`). `--no-settle` times
back to back as before (the disturbance a user mixing the libraries sees).

    python3 bench/cpu.py [--runs 5] [--out bench/results/cpu.json] [--filter conv] [--no-settle]

Needs the ferrodnn package (pip install ./python) and numpy; PyTorch when installed.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import threading
import time

import numpy as np

import ferrodnn as cudnn

try:
    import torch
except ImportError:  # the comparison is left out, not faked
    torch = None

F32 = cudnn.data_type.FLOAT
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def thread_cpu_ns():
    """Each thread of this process (by native id): (its CPU time so far, its time so far runnable
    but waiting for a core), in ns (Linux's schedstat; empty elsewhere)."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for t in tids:
        try:
            with open(f"/proc/self/task/{t}/schedstat") as f:
                run, wait = f.read().split()[:2]
            out[int(t)] = (int(run), int(wait))
        except (OSError, ValueError):
            pass  # a thread that ended meanwhile
    return out


# The threads of each side's runtime (native ids), found in main() by starting each runtime once;
# the process's main thread belongs to no side (it calls every side).
MAIN_TID = threading.get_native_id()
SIDES = {}
# Whether each side's timed calls wait for the other threads to settle first (--no-settle: no).
SETTLE = {"on": True, "waits": []}


def settle(limit_s=0.5):
    """Wait until the process's threads other than the main one use under 0.1 ms of CPU in 5 ms
    (another runtime's workers spinning after their last parallel region); returns the ms waited."""
    t0 = time.perf_counter()
    prev = sum(v[0] for k, v in thread_cpu_ns().items() if k != MAIN_TID)
    while time.perf_counter() - t0 < limit_s:
        time.sleep(0.005)
        cur = sum(v[0] for k, v in thread_cpu_ns().items() if k != MAIN_TID)
        if cur - prev < 100_000:
            break
        prev = cur
    return (time.perf_counter() - t0) * 1e3


def timed(fn, runs, side):
    """Side `side`'s call `fn`: the median ms of `runs` calls after a warm-up (the other threads
    settled first unless --no-settle), and over those calls the CPU ms the other sides' threads
    took and the ms the side's own threads (and the main thread) waited runnable for a core
    (taken by other threads or other processes)."""
    if SETTLE["on"]:
        SETTLE["waits"].append(settle())
    fn()  # warm-up (plan caches, page faults)
    own = SIDES.get(side, set()) | {MAIN_TID}
    before = thread_cpu_ns()
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    after = thread_cpu_ns()
    delta = {k: (v[0] - before.get(k, (0, 0))[0], v[1] - before.get(k, (0, 0))[1]) for k, v in after.items()}
    cross = sum(d[0] for k, d in delta.items() if k not in own)
    wait = sum(d[1] for k, d in delta.items() if k in own)
    return statistics.median(ts), cross / 1e6, wait / 1e6


def median_ms(fn, runs, side, cross):
    """`timed`'s median; the other threads' CPU ms and the own threads' wait go to
    `cross[side]`."""
    ms, cross[side], wait = timed(fn, runs, side)
    cross[side + "_wait"] = wait
    return ms


def find_sides():
    """The threads each runtime starts (numpy's BLAS at import, PyTorch's OpenMP workers at its
    first parallel region, ferrodnn's pool with its first handle)."""
    known = set(thread_cpu_ns())
    SIDES["numpy"] = known - {MAIN_TID}
    if torch is not None:
        t = torch.ones((512, 512))
        for _ in range(3):
            t @ t
        SIDES["torch"] = set(thread_cpu_ns()) - known
        known |= SIDES["torch"]
    a = np.ones((256, 256), np.float32)
    run, _ = ours_matmul(a, a)
    run()
    SIDES["ours"] = set(thread_cpu_ns()) - known


def new_graph():
    return cudnn.pygraph(io_data_type=F32, intermediate_data_type=F32, compute_data_type=F32, handle=cudnn.create_cpu_handle())


def built(g):
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return np.empty(g.get_workspace_size(), dtype=np.uint8)


def ours_matmul(a, b):
    g = new_graph()
    A, B = g.tensor_like(a), g.tensor_like(b)
    C = g.matmul(A=A, B=B)
    C.set_output(True).set_data_type(F32)
    ws = built(g)
    c = np.empty((a.shape[0], b.shape[1]), np.float32)
    return lambda: g.execute({A: a, B: b, C: c}, ws), c


def ours_conv(x, w, pad, stride):
    g = new_graph()
    X, W = g.tensor_like(x), g.tensor_like(w)
    Y = g.conv_fprop(image=X, weight=W, padding=[pad, pad], stride=[stride, stride], dilation=[1, 1])
    Y.set_output(True).set_data_type(F32)
    g.validate()
    dims = Y.get_dim()
    y = np.empty(dims, np.float32)
    if not x.flags["C_CONTIGUOUS"]:
        # The output follows the image's layout (channels-last).
        y = np.empty([dims[0], dims[2], dims[3], dims[1]], np.float32).transpose(0, 3, 1, 2)
    ws = built(g)
    return lambda: g.execute({X: x, W: w, Y: y}, ws), y


def ours_rows(x, what):
    g = new_graph()
    X = g.tensor_like(x)
    if what == "softmax":
        Y = g.softmax(input=X, axis=-1)
        pack_extra = {}
    else:
        s = np.ones((1, x.shape[1]), np.float32)
        b = np.zeros((1, x.shape[1]), np.float32)
        S, B = g.tensor_like(s), g.tensor_like(b)
        Y, _, _ = g.layernorm(norm_forward_phase=cudnn.norm_forward_phase.INFERENCE, input=X, scale=S, bias=B, epsilon=1e-5)
        pack_extra = {S: s, B: b}
    Y.set_output(True).set_data_type(F32)
    ws = built(g)
    y = np.empty_like(x)
    return lambda: g.execute({X: x, Y: y, **pack_extra}, ws), y


def ours_attention(q, k, v, causal):
    g = new_graph()
    Q, K, V = g.tensor_like(q), g.tensor_like(k), g.tensor_like(v)
    O, _ = g.sdpa(q=Q, k=K, v=V, is_inference=True, attn_scale=1.0 / np.sqrt(q.shape[-1]), use_causal_mask=causal)
    O.set_output(True).set_data_type(F32)
    ws = built(g)
    o = np.empty(q.shape[:3] + (v.shape[3],), np.float32)
    return lambda: g.execute({Q: q, K: k, V: v, O: o}, ws), o


def extra(cross):
    """A row's record of the other threads' CPU during each side's timed calls and of the waits
    for them to settle."""
    out = {f"{side}_cross_cpu_ms" if not side.endswith("_wait") else f"{side}_ms": round(ms, 2) for side, ms in cross.items()}
    out["settled_ms"] = [round(w, 1) for w in SETTLE["waits"]]
    return out


def load():
    return round(os.getloadavg()[0], 2)


def matmul_workloads():
    return [("matmul_f32_1024x1024x1024", 1024, 1024, 1024), ("matmul_f32_4096x4096x1024", 4096, 4096, 1024)]


# ResNet-50's convolutions (image channels, size, output channels, filter, stride), batch 8.
RESNET = [
    ("3x3", 64, 56, 64, 3, 1),
    ("3x3", 128, 28, 128, 3, 1),
    ("3x3", 256, 14, 256, 3, 1),
    ("3x3", 512, 7, 512, 3, 1),
    ("1x1", 256, 56, 64, 1, 1),
    ("1x1", 64, 56, 256, 1, 1),
    ("1x1", 512, 28, 128, 1, 1),
    ("1x1", 1024, 14, 256, 1, 1),
    ("1x1", 2048, 7, 512, 1, 1),
]


def measure(args):
    """One round: every workload once (each side timed as the median of `--runs` calls)."""
    rng = np.random.default_rng(0)
    rows = []

    for wid, m, n, k in matmul_workloads():
        if args.filter not in wid:
            continue
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        before, cross = load(), {}
        SETTLE["waits"] = []
        run, c = ours_matmul(a, b)
        ours = median_ms(run, args.runs, "ours", cross)
        ref = a @ b
        err = float(np.linalg.norm(c - ref) / np.linalg.norm(ref))
        npy = median_ms(lambda: a @ b, args.runs, "numpy", cross)
        th = None
        if torch is not None:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            th = median_ms(lambda: ta @ tb, args.runs, "torch", cross)
        flops = 2.0 * m * n * k
        rows.append({"id": wid, "ours_ms": ours, "numpy_ms": npy, "torch_ms": th, "ratio_vs_numpy": npy / ours, "ratio_vs_torch": th / ours if th else None,
                     "ours_gflops": flops / ours / 1e6, "rel_error_vs_numpy": err, "load": [before, load()], **extra(cross)})
        print(json.dumps(rows[-1]), flush=True)

    for kind, c, hw, kout, r, s in RESNET:
        for layout in ("nchw", "nhwc"):
            wid = f"conv_fprop_{kind}_f32_{layout}_{args.batch}x{c}x{hw}x{hw}_k{kout}_s{s}"
            if args.filter not in wid:
                continue
            pad = r // 2
            x = rng.standard_normal((args.batch, c, hw, hw), dtype=np.float32)
            w = (rng.standard_normal((kout, c, r, r), dtype=np.float32) / np.sqrt(c * r * r)).astype(np.float32)
            if layout == "nhwc":
                x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
                w = np.ascontiguousarray(w.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
            before, cross = load(), {}
            SETTLE["waits"] = []
            run, y = ours_conv(x, w, pad, s)
            ours = median_ms(run, args.runs, "ours", cross)
            th, err = None, None
            if torch is not None:
                tx, tw = torch.from_numpy(np.asarray(x)), torch.from_numpy(np.asarray(w))
                if layout == "nhwc":
                    tx, tw = tx.contiguous(memory_format=torch.channels_last), tw.contiguous(memory_format=torch.channels_last)
                with torch.no_grad():
                    fn = lambda: torch.nn.functional.conv2d(tx, tw, padding=pad, stride=s)  # noqa: E731
                    th = median_ms(fn, args.runs, "torch", cross)
                    ref = fn().numpy()
                err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
            flops = 2.0 * args.batch * kout * c * r * r * (hw // s) ** 2
            rows.append({"id": wid, "ours_ms": ours, "torch_ms": th, "ratio_vs_torch": th / ours if th else None, "ours_gflops": flops / ours / 1e6,
                         "torch_gflops": flops / th / 1e6 if th else None, "rel_error_vs_torch": err, "load": [before, load()], **extra(cross)})
            print(json.dumps(rows[-1]), flush=True)

    # Attention forward (inference), beside PyTorch's scaled_dot_product_attention on the CPU.
    for b, h, sl, d, causal in ((1, 8, 1024, 64, False), (1, 8, 1024, 64, True)):
        wid = f"sdpa_fwd_f32_b{b}h{h}s{sl}d{d}" + ("_causal" if causal else "")
        if args.filter not in wid:
            continue
        q, k, v = (rng.standard_normal((b, h, sl, d), dtype=np.float32) for _ in range(3))
        before, cross = load(), {}
        SETTLE["waits"] = []
        run, o = ours_attention(q, k, v, causal)
        ours = median_ms(run, args.runs, "ours", cross)
        th, err = None, None
        if torch is not None:
            tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
            with torch.no_grad():
                fn = lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)  # noqa: E731
                th = median_ms(fn, args.runs, "torch", cross)
                ref = fn().numpy()
            err = float(np.linalg.norm(o - ref) / np.linalg.norm(ref))
        flops = 4.0 * b * h * sl * sl * d / (2 if causal else 1)
        rows.append({"id": wid, "ours_ms": ours, "torch_ms": th, "ratio_vs_torch": th / ours if th else None, "ours_gflops": flops / ours / 1e6,
                     "torch_gflops": flops / th / 1e6 if th else None, "rel_error_vs_torch": err, "load": [before, load()], **extra(cross)})
        print(json.dumps(rows[-1]), flush=True)

    rows_n = 4096
    x = rng.standard_normal((rows_n, rows_n), dtype=np.float32)
    copy_dst = np.empty_like(x)
    for what in ("softmax", "layernorm"):
        wid = f"{what}_f32_{rows_n}x{rows_n}"
        if args.filter not in wid:
            continue
        before, cross = load(), {}
        SETTLE["waits"] = []
        copy_ms = median_ms(lambda: np.copyto(copy_dst, x), args.runs, "numpy", cross)
        run, y = ours_rows(x, what)
        ours = median_ms(run, args.runs, "ours", cross)
        th, err = None, None
        if torch is not None:
            tx = torch.from_numpy(x)
            if what == "softmax":
                fn = lambda: torch.softmax(tx, dim=-1)  # noqa: E731
            else:
                fn = lambda: torch.nn.functional.layer_norm(tx, [rows_n], eps=1e-5)  # noqa: E731
            with torch.no_grad():
                th = median_ms(fn, args.runs, "torch", cross)
                ref = fn().numpy()
            err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
        gbs = 2 * x.nbytes / ours / 1e6
        rows.append({"id": wid, "ours_ms": ours, "torch_ms": th, "ratio_vs_torch": th / ours if th else None, "copy_ms": copy_ms, "ours_gbs": gbs,
                     "copy_gbs": 2 * x.nbytes / copy_ms / 1e6, "pct_copy_bw": 100 * copy_ms / ours, "rel_error_vs_torch": err, "load": [before, load()], **extra(cross)})
        print(json.dumps(rows[-1]), flush=True)

    return rows


def merge(rounds):
    """Each workload's times as the median over the rounds (ratios and rates from those), with
    each round's own ratio kept."""
    out = []
    for i, first in enumerate(rounds[0]):
        rs = [r[i] for r in rounds]
        row = dict(first)
        for key in ("ours_ms", "numpy_ms", "torch_ms", "copy_ms"):
            if first.get(key) is not None:
                row[key] = statistics.median(r[key] for r in rs)
        scale = first["ours_ms"] / row["ours_ms"]
        for key in ("ours_gflops", "ours_gbs"):
            if first.get(key) is not None:
                row[key] = first[key] * scale
        if row.get("numpy_ms") is not None:
            row["ratio_vs_numpy"] = row["numpy_ms"] / row["ours_ms"]
        if row.get("torch_ms") is not None:
            row["ratio_vs_torch"] = row["torch_ms"] / row["ours_ms"]
            row["ratio_vs_torch_rounds"] = [r["torch_ms"] / r["ours_ms"] for r in rs]
        if row.get("copy_ms") is not None:
            row["pct_copy_bw"] = 100 * row["copy_ms"] / row["ours_ms"]
            row["copy_gbs"] = first["copy_gbs"] * first["copy_ms"] / row["copy_ms"]
        row["load"] = [min(r["load"][0] for r in rs), max(r["load"][1] for r in rs)]
        for key in [k for k in first if k.endswith(("_cross_cpu_ms", "_wait_ms"))] + ["settled_ms"]:
            row[key] = [r.get(key) for r in rs]
        out.append(row)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5, help="calls timed per side in a round (their median)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every workload (the median over them is reported)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "cpu.json"))
    ap.add_argument("--filter", default="")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--no-settle", action="store_true", help="time each side right after the other, without waiting for the other threads to settle")
    args = ap.parse_args()
    SETTLE["on"] = not args.no_settle
    threads = os.cpu_count()
    if torch is not None:
        torch.set_num_threads(threads)
    find_sides()
    rows = merge([measure(args) for _ in range(args.rounds)])

    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
    except OSError:
        pass
    result = {
        "kind": "cpu",
        "device": f"{cpu}, {threads} cores",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "software": f"numpy {np.__version__}" + (f", PyTorch {torch.__version__}" if torch is not None else ", no PyTorch"),
        "runs": args.runs,
        "rounds": args.rounds,
        "threads": threads,
        "settle": SETTLE["on"],
        "side_threads": {k: len(v) for k, v in SIDES.items()},
        "workloads": rows,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
