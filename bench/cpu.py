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

    python3 bench/cpu.py [--runs 5] [--out bench/results/cpu.json] [--filter conv]

Needs the ferrodnn package (pip install ./python) and numpy; PyTorch when installed.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import time

import numpy as np

import ferrodnn as cudnn

try:
    import torch
except ImportError:  # the comparison is left out, not faked
    torch = None

F32 = cudnn.data_type.FLOAT
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def median_ms(fn, runs):
    fn()  # warm-up (plan caches, page faults)
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


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
        before = load()
        run, c = ours_matmul(a, b)
        ours = median_ms(run, args.runs)
        ref = a @ b
        err = float(np.linalg.norm(c - ref) / np.linalg.norm(ref))
        npy = median_ms(lambda: a @ b, args.runs)
        th = None
        if torch is not None:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            th = median_ms(lambda: ta @ tb, args.runs)
        flops = 2.0 * m * n * k
        rows.append({"id": wid, "ours_ms": ours, "numpy_ms": npy, "torch_ms": th, "ratio_vs_numpy": npy / ours, "ratio_vs_torch": th / ours if th else None,
                     "ours_gflops": flops / ours / 1e6, "rel_error_vs_numpy": err, "load": [before, load()]})
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
            before = load()
            run, y = ours_conv(x, w, pad, s)
            ours = median_ms(run, args.runs)
            th, err = None, None
            if torch is not None:
                tx, tw = torch.from_numpy(np.asarray(x)), torch.from_numpy(np.asarray(w))
                if layout == "nhwc":
                    tx, tw = tx.contiguous(memory_format=torch.channels_last), tw.contiguous(memory_format=torch.channels_last)
                with torch.no_grad():
                    fn = lambda: torch.nn.functional.conv2d(tx, tw, padding=pad, stride=s)  # noqa: E731
                    th = median_ms(fn, args.runs)
                    ref = fn().numpy()
                err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
            flops = 2.0 * args.batch * kout * c * r * r * (hw // s) ** 2
            rows.append({"id": wid, "ours_ms": ours, "torch_ms": th, "ratio_vs_torch": th / ours if th else None, "ours_gflops": flops / ours / 1e6,
                         "torch_gflops": flops / th / 1e6 if th else None, "rel_error_vs_torch": err, "load": [before, load()]})
            print(json.dumps(rows[-1]), flush=True)

    # Attention forward (inference), beside PyTorch's scaled_dot_product_attention on the CPU.
    for b, h, sl, d, causal in ((1, 8, 1024, 64, False), (1, 8, 1024, 64, True)):
        wid = f"sdpa_fwd_f32_b{b}h{h}s{sl}d{d}" + ("_causal" if causal else "")
        if args.filter not in wid:
            continue
        q, k, v = (rng.standard_normal((b, h, sl, d), dtype=np.float32) for _ in range(3))
        before = load()
        run, o = ours_attention(q, k, v, causal)
        ours = median_ms(run, args.runs)
        th, err = None, None
        if torch is not None:
            tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
            with torch.no_grad():
                fn = lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)  # noqa: E731
                th = median_ms(fn, args.runs)
                ref = fn().numpy()
            err = float(np.linalg.norm(o - ref) / np.linalg.norm(ref))
        flops = 4.0 * b * h * sl * sl * d / (2 if causal else 1)
        rows.append({"id": wid, "ours_ms": ours, "torch_ms": th, "ratio_vs_torch": th / ours if th else None, "ours_gflops": flops / ours / 1e6,
                     "torch_gflops": flops / th / 1e6 if th else None, "rel_error_vs_torch": err, "load": [before, load()]})
        print(json.dumps(rows[-1]), flush=True)

    rows_n = 4096
    x = rng.standard_normal((rows_n, rows_n), dtype=np.float32)
    copy_dst = np.empty_like(x)
    for what in ("softmax", "layernorm"):
        wid = f"{what}_f32_{rows_n}x{rows_n}"
        if args.filter not in wid:
            continue
        before = load()
        copy_ms = median_ms(lambda: np.copyto(copy_dst, x), args.runs)
        run, y = ours_rows(x, what)
        ours = median_ms(run, args.runs)
        th, err = None, None
        if torch is not None:
            tx = torch.from_numpy(x)
            if what == "softmax":
                fn = lambda: torch.softmax(tx, dim=-1)  # noqa: E731
            else:
                fn = lambda: torch.nn.functional.layer_norm(tx, [rows_n], eps=1e-5)  # noqa: E731
            with torch.no_grad():
                th = median_ms(fn, args.runs)
                ref = fn().numpy()
            err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
        gbs = 2 * x.nbytes / ours / 1e6
        rows.append({"id": wid, "ours_ms": ours, "torch_ms": th, "ratio_vs_torch": th / ours if th else None, "copy_ms": copy_ms, "ours_gbs": gbs,
                     "copy_gbs": 2 * x.nbytes / copy_ms / 1e6, "pct_copy_bw": 100 * copy_ms / ours, "rel_error_vs_torch": err, "load": [before, load()]})
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
        out.append(row)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5, help="calls timed per side in a round (their median)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every workload (the median over them is reported)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "cpu.json"))
    ap.add_argument("--filter", default="")
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    threads = os.cpu_count()
    if torch is not None:
        torch.set_num_threads(threads)
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
        "workloads": rows,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
