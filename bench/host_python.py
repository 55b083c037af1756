"""Host time of one `execute` from Python for small cached single-kernel plans: ferrodnn's Python
package, NVIDIA's cudnn frontend (when importable) and PyTorch's own op, in the same process on
the same GPU (the issue's target: <= 8 us a call from Python for ferrodnn).

Each side runs batches of 200 calls timed with a CPU clock, the stream drained between batches
(the driver's launch queue never fills, so the GPU's time is not counted); the median batch, in
microseconds a call. The graphs are built with the same pygraph code for both libraries; the
variant pack is built once, as a caller that keeps it does. Each graph's build time is reported
too: the first row's is a first build in a new process (ferrodnn's with the kernel cache the
environment gives, FERRODNN_CACHE_DIR).

Usage (on the GPU machine): python3 bench/host_python.py [--cudnn-path DIR] --out FILE.json
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

BATCH = 200


def host_us(fn, batches=11):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(batches):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(BATCH):
            fn()
        ts.append((time.perf_counter() - t) * 1e6 / BATCH)
    torch.cuda.synchronize()
    ts.sort()
    return ts[len(ts) // 2]


def cases():
    """(name, torch inputs, how the graph is made, PyTorch's own op)."""
    bf = torch.bfloat16
    out = []
    for t, hd in [(1, 4096), (64, 768)]:
        x = torch.randn(t, hd, device="cuda", dtype=bf)
        g = torch.randn(1, hd, device="cuda", dtype=bf)
        b = torch.randn(1, hd, device="cuda", dtype=bf)
        eps = torch.full((1, 1), 1e-5, dtype=torch.float32)

        def layernorm(cudnn, graph, x=x, g=g, b=b, eps=eps):
            X, S, B, E = (graph.tensor_like(a) for a in (x, g, b, eps))
            Y, _, _ = graph.layernorm(norm_forward_phase=cudnn.norm_forward_phase.INFERENCE, input=X, scale=S, bias=B, epsilon=E)
            Y.set_output(True)
            return {X: x, S: g, B: b, E: eps}, Y, torch.empty_like(x)

        out.append((f"layernorm_bf16_{t}x{hd}", layernorm, lambda x=x, g=g, b=b, hd=hd: F.layer_norm(x, (hd,), g[0], b[0])))
        y = torch.randn_like(x)

        def add(cudnn, graph, x=x, y=y):
            X, Y2 = graph.tensor_like(x), graph.tensor_like(y)
            Z = graph.add(a=X, b=Y2)
            Z.set_output(True)
            return {X: x, Y2: y}, Z, torch.empty_like(x)

        out.append((f"add_bf16_{t}x{hd}", add, lambda x=x, y=y: x + y))
    return out


def build(cudnn, handle, make):
    """The graph built (validate to build_plans) and its execute as a function of no arguments;
    the build's time in ms."""
    t = time.perf_counter()
    graph = cudnn.pygraph(handle=handle, io_data_type=cudnn.data_type.BFLOAT16, intermediate_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT)
    pack, out, buf = make(cudnn, graph)
    out.set_data_type(cudnn.data_type.BFLOAT16)
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    pack[out] = buf
    ws = torch.empty(max(1, graph.get_workspace_size()), device="cuda", dtype=torch.uint8)
    return (lambda: graph.execute(pack, ws)), (time.perf_counter() - t) * 1e3


def library(name, path):
    if path:
        sys.path.insert(0, path)
    try:
        mod = __import__(name)
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        print(f"{name}: not importable ({e})", flush=True)
        return None
    finally:
        if path:
            sys.path.pop(0)
    handle = mod.create_handle()
    mod.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    return mod, handle


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cudnn-path", default=None, help="a folder holding NVIDIA's cudnn frontend package")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    libs = {"ferrodnn": library("ferrodnn", None), "cudnn_frontend": library("cudnn", args.cudnn_path)}
    rows = []
    for name, make, theirs in cases():
        row = {"id": name, "torch_us": host_us(theirs)}
        for lib, got in libs.items():
            if got is None:
                continue
            try:
                fn, build_ms = build(got[0], got[1], make)
                row[f"{lib}_build_ms"] = build_ms
                row[f"{lib}_us"] = host_us(fn)
            except Exception as e:  # noqa: BLE001 - reported per row
                row[f"{lib}_error"] = str(e)
        print(json.dumps(row), flush=True)
        rows.append(row)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
