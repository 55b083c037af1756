#!/usr/bin/env python3
"""PyTorch (cuDNN) beside `ferrodnn bench --suite conv`: reads ferrodnn's JSON (--ours), times the
same layers with torch (fp16, channels-last, cudnn.benchmark; dgrad and wgrad through
torch.nn.grad, which calls cuDNN's backward kernels), timed as bench/run.py times PyTorch
(batches of back-to-back calls), and prints both with the ratio (PyTorch time / ferrodnn time).

    ferrodnn bench --suite conv --out ours.json && python3 bench/torch_conv.py --ours ours.json --out conv.json
"""

import argparse
import json
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import bench as timed  # noqa: E402  (batches of back-to-back calls, as ferrodnn is timed)

# The ids' types: fp16, bf16, and f32 tensors multiplied as tf32 (cuDNN allows tf32 for
# convolutions by default, as ferrodnn's plan for f32 convolutions does).
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32}
# The part after the op: `_depthwise` (groups = channels, filter [k, 1, r, r]) or `_grouped<g>` (g
# groups, filter [k, c / g, r, r]); none for one group.
ID = re.compile(r"conv_(fprop|dgrad|wgrad)(_bias_relu)?(_depthwise|_grouped\d+)?_(fp16|bf16|tf32)_nhwc_(\d+)x(\d+)x(\d+)x(\d+)_k(\d+)_(\d+)x\d+s(\d+)")
# int8 forward rows (i8 image and filter, i32 output): PyTorch has no int8 convolution; cuDNN's
# graph API has (`--cudnn-graph`).
ID_INT8 = re.compile(r"conv_fprop_int8_nhwc_(\d+)x(\d+)x(\d+)x(\d+)_k(\d+)_(\d+)x\d+s(\d+)")


# The 1D and 3D rows (bench_conv.rs's conv_nd): channels-last fp16, one stride and padding.
ID_ND = re.compile(r"conv_(fprop|dgrad|wgrad)_fp16_(nwc|ndhwc)_(\d+)x(\d+)x([\dx]+)_k(\d+)_([\dx]+)s(\d+)p(\d+)")


def torch_nd_ms(wid, timed):
    """PyTorch on a conv_nd row: 3D in channels_last_3d; 1D in PyTorch's own layout (N, C, W),
    which for the one-channel image is the same memory as ours (the output's layout differs)."""
    m = ID_ND.fullmatch(wid)
    if not m:
        return None
    kind, layout, n, c, spatial, k, taps, s, p = m.groups()
    n, c, k, s, p = map(int, (n, c, k, s, p))
    spatial, taps = [int(v) for v in spatial.split("x")], [int(v) for v in taps.split("x")]
    F, grad = (torch.nn.functional.conv3d, torch.nn.grad) if layout == "ndhwc" else (torch.nn.functional.conv1d, torch.nn.grad)
    fmt = torch.channels_last_3d if layout == "ndhwc" else torch.contiguous_format
    x = torch.randn(n, c, *spatial, device="cuda", dtype=torch.float16).to(memory_format=fmt)
    wt = torch.randn(k, c, *taps, device="cuda", dtype=torch.float16).to(memory_format=fmt)
    y = F(x, wt, stride=s, padding=p)
    dy = torch.randn_like(y).to(memory_format=fmt)
    gi, gw = (grad.conv3d_input, grad.conv3d_weight) if layout == "ndhwc" else (grad.conv1d_input, grad.conv1d_weight)
    if kind == "fprop":
        return timed(lambda: F(x, wt, stride=s, padding=p))
    if kind == "dgrad":
        return timed(lambda: gi(x.shape, wt, dy, stride=s, padding=p))
    return timed(lambda: gw(x, wt.shape, dy, stride=s, padding=p))


def groups_of(part, c):
    """The groups an id's `_depthwise` / `_grouped<g>` part (or None) says, for c image channels."""
    if part == "_depthwise":
        return c
    if part:
        return int(part[len("_grouped"):])
    return 1


def graphed(fn, batch=20, rounds=5):
    """Per-call GPU time in ms with no host overhead: `batch` calls captured in one CUDA graph,
    the median over `rounds` replays."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(batch):
            fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / batch)
    ts.sort()
    return ts[len(ts) // 2]


def torch_ms(wid, timed=timed):
    m = ID.fullmatch(wid)
    if not m:
        return torch_nd_ms(wid, timed)
    kind, bias_relu, grouping, dtn, n, c, h, w, k, r, s = m.groups()
    n, c, h, w, k, r, s = map(int, (n, c, h, w, k, r, s))
    groups = groups_of(grouping, c)
    p = (r - 1) // 2
    cl = torch.channels_last
    dev, dt = "cuda", DTYPES[dtn]
    x = torch.randn(n, c, h, w, device=dev, dtype=dt).to(memory_format=cl)
    wt = torch.randn(k, c // groups, r, r, device=dev, dtype=dt).to(memory_format=cl)
    bias = torch.randn(k, device=dev, dtype=dt)
    y = torch.nn.functional.conv2d(x, wt, stride=s, padding=p, groups=groups)
    dy = torch.randn_like(y).to(memory_format=cl)
    if kind == "fprop":
        if bias_relu:
            return timed(lambda: torch.relu(torch.nn.functional.conv2d(x, wt, bias, stride=s, padding=p, groups=groups)))
        return timed(lambda: torch.nn.functional.conv2d(x, wt, stride=s, padding=p, groups=groups))
    if kind == "dgrad":
        return timed(lambda: torch.nn.grad.conv2d_input(x.shape, wt, dy, stride=s, padding=p, groups=groups))
    return timed(lambda: torch.nn.grad.conv2d_weight(x, wt.shape, dy, stride=s, padding=p, groups=groups))


_CUDNN = {}


def _built(cudnn, g):
    """Validates and builds cuDNN graph `g` (heuristics A, then the fallback; every plan built):
    its workspace."""
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans(cudnn.build_plan_policy.ALL)
    return torch.empty(g.get_workspace_size(), device="cuda", dtype=torch.uint8)


def cudnn_graph_ms(wid, timed=timed):
    """conv + bias + relu through cuDNN's own graph API (the nvidia-cudnn-frontend package), for the
    suite's `_bias_relu_` forward rows: one fused graph, executed as ferrodnn's is (back-to-back
    executes). None for other rows or without the package."""
    m = ID.fullmatch(wid)
    int8 = ID_INT8.fullmatch(wid)
    if not int8 and (not m or m.group(1) != "fprop" or not m.group(2) or m.group(3)):
        return None
    try:
        import cudnn
    except ImportError:
        return None
    if "handle" not in _CUDNN:
        _CUDNN["handle"] = cudnn.create_handle()
        cudnn.set_stream(handle=_CUDNN["handle"], stream=torch.cuda.current_stream().cuda_stream)
    handle = _CUDNN["handle"]
    if int8:
        return cudnn_int8_ms(cudnn, handle, *map(int, int8.groups()), timed=timed)
    _, _, _, dtn, n, c, h, w, k, r, s = m.groups()
    n, c, h, w, k, r, s = map(int, (n, c, h, w, k, r, s))
    p = (r - 1) // 2
    cl = torch.channels_last
    x = torch.randn(n, c, h, w, device="cuda", dtype=torch.float16).to(memory_format=cl)
    wt = torch.randn(k, c, r, r, device="cuda", dtype=torch.float16).to(memory_format=cl)
    bias = torch.randn(1, k, 1, 1, device="cuda", dtype=torch.float16).to(memory_format=cl)
    ref = torch.relu(torch.nn.functional.conv2d(x, wt, bias.reshape(-1), stride=s, padding=p))
    y = torch.empty_like(ref)
    g = cudnn.pygraph(handle=handle, io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT)
    tx, tw, tb = g.tensor_like(x), g.tensor_like(wt), g.tensor_like(bias)
    conv = g.conv_fprop(image=tx, weight=tw, padding=[p, p], stride=[s, s], dilation=[1, 1])
    ty = g.relu(input=g.bias(input=conv, bias=tb))
    ty.set_output(True).set_data_type(cudnn.data_type.HALF)
    ws = _built(cudnn, g)
    pack = {tx: x, tw: wt, tb: bias, ty: y}
    g.execute(pack, ws, handle=handle)
    torch.cuda.synchronize()
    torch.testing.assert_close(y.float(), ref.float(), atol=5e-2, rtol=2e-2)
    return timed(lambda: g.execute(pack, ws, handle=handle))


def cudnn_int8_ms(cudnn, handle, n, c, h, w, k, r, s, timed=timed):
    """An int8 forward convolution through cuDNN's graph API, as cudnn-frontend's own int8 test
    builds it (io int8, intermediate and compute int32, an identity into an int32 output),
    checked exactly against a float64 convolution on the GPU."""
    p = (r - 1) // 2
    cl = torch.channels_last
    x = torch.randint(-127, 128, (n, c, h, w), device="cuda", dtype=torch.int8).to(memory_format=cl)
    wt = torch.randint(-127, 128, (k, c, r, r), device="cuda", dtype=torch.int8).to(memory_format=cl)
    ref = torch.nn.functional.conv2d(x.double(), wt.double(), stride=s, padding=p)
    y = torch.empty(ref.shape, device="cuda", dtype=torch.int32).to(memory_format=cl)
    g = cudnn.pygraph(handle=handle, io_data_type=cudnn.data_type.INT8, intermediate_data_type=cudnn.data_type.INT32, compute_data_type=cudnn.data_type.INT32)
    tx, tw = g.tensor_like(x), g.tensor_like(wt)
    conv = g.conv_fprop(image=tx, weight=tw, padding=[p, p], stride=[s, s], dilation=[1, 1])
    ty = g.identity(input=conv)
    ty.set_output(True).set_data_type(cudnn.data_type.INT32)
    ws = _built(cudnn, g)
    pack = {tx: x, tw: wt, ty: y}
    g.execute(pack, ws, handle=handle)
    torch.cuda.synchronize()
    if not torch.equal(y.double(), ref):
        raise RuntimeError(f"cuDNN's int8 convolution differs from the float64 one (max |diff| {(y.double() - ref).abs().max().item()})")
    return timed(lambda: g.execute(pack, ws, handle=handle))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cudnn-graph", action="store_true", help="also time conv + bias + relu rows through cuDNN's graph API (nvidia-cudnn-frontend)")
    ap.add_argument("--graphs", action="store_true", help="time PyTorch's calls replayed from a CUDA graph (its kernels alone, no host overhead)")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True
    with open(args.ours) as f:
        ours = json.load(f)["workloads"]
    rows = []
    for wl in ours:
        if "ours_ms" not in wl:
            continue
        t = torch_ms(wl["id"], graphed if args.graphs else timed)
        row = {"id": wl["id"], "ours_ms": wl["ours_ms"], "torch_ms": t}
        if args.cudnn_graph:
            try:
                g = cudnn_graph_ms(wl["id"])
            except Exception as e:  # an unsupported graph is a row without the column
                print(f"cudnn graph {wl['id']}: {e}", flush=True)
                g = None
            if g:
                row["cudnn_graph_ms"] = g
                row["ratio_vs_cudnn_graph"] = g / wl["ours_ms"]
                print(f"{'':<56} cuDNN graph {g:9.4f} ms  ratio {g / wl['ours_ms']:.3f}", flush=True)
        if t:
            row["ratio"] = t / wl["ours_ms"]
            if wl.get("flops"):
                row["ours_tflops"] = wl["flops"] / wl["ours_ms"] / 1e9
                row["torch_tflops"] = wl["flops"] / t / 1e9
        rows.append(row)
        print(f"{wl['id']:<56} {wl['ours_ms']:9.4f} {t or float('nan'):9.4f} ms  ratio {row.get('ratio', float('nan')):.3f}", flush=True)
    with open(args.out, "w") as f:
        json.dump({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
