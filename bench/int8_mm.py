"""int8 GEMMs on the GPU: ferrodnn's (through its Python package: i8 x i8 -> i32 with an i32
compute type, as cudnn-frontend's int8 matmul builds it) beside PyTorch's `torch._int_mm`
(cuBLASLt), in the same process; every output checked exactly against a float64 product first.
B is stored n x k (K-major), as int8 tensor-core GEMMs take it.

Usage (on the GPU machine, the ferrodnn wheel on PYTHONPATH):
    python3 bench/int8_mm.py --out int8_mm.json [--shapes 4096x4096x4096,...]
"""
import argparse
import json
import os
import sys

import torch

import ferrodnn as fd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import bench  # noqa: E402  (batches of back-to-back calls, CUDA events)

SHAPES = "4096x4096x4096,8192x8192x8192,1024x1024x1024,16x4096x4096,6304x768x3072"


def ours(handle, a, b, c):
    g = fd.pygraph(handle=handle, io_data_type=fd.data_type.INT8, intermediate_data_type=fd.data_type.INT32, compute_data_type=fd.data_type.INT32)
    ta, tb = g.tensor_like(a), g.tensor_like(b)
    tc = g.matmul(A=ta, B=tb)
    tc.set_output(True).set_data_type(fd.data_type.INT32)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([fd.heur_mode.A])
    g.build_plans()
    ws = torch.empty(max(1, g.get_workspace_size()), device="cuda", dtype=torch.uint8)
    pack = {ta: a, tb: b, tc: c}
    return lambda: g.execute(pack, ws, handle=handle)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=SHAPES)
    args = ap.parse_args()
    handle = fd.create_handle()
    fd.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    rows = []
    for shape in args.shapes.split(","):
        m, n, k = map(int, shape.split("x"))
        a = torch.randint(-127, 128, (m, k), device="cuda", dtype=torch.int8)
        b = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8).t()  # k x n, stored n x k
        ref = (a.double() @ b.double())
        c = torch.full((m, n), -7, device="cuda", dtype=torch.int32)
        run = ours(handle, a, b, c)
        run()
        torch.cuda.synchronize()
        exact = torch.equal(c.double(), ref)
        row = {"shape": shape, "exact": exact, "ours_ms": bench(run)}
        try:
            t = torch._int_mm(a, b)
            row["torch_exact"] = torch.equal(t.double(), ref)
            row["torch_ms"] = bench(lambda: torch._int_mm(a, b))
            row["ratio"] = row["torch_ms"] / row["ours_ms"]
        except RuntimeError as e:  # cuBLASLt's shape rules (m > 16, multiples of 8)
            row["torch_error"] = str(e).splitlines()[0]
        row["ours_tops"] = 2 * m * n * k / row["ours_ms"] / 1e9
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
