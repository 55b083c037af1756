#!/usr/bin/env python3
"""The conv suite's result file for bench/render.py (bench/results/<gpu>-conv.json): ferrodnn's
`ferrodnn bench --suite conv` JSON and bench/torch_conv.py's (same call, same GPU) joined per layer.

    python3 bench/conv_result.py --ours conv_ours.json --torch conv_torch_graphs.json --gpu h200 \
        --commit COMMIT --note "..." --out bench/results/h200-conv.json
"""

import argparse
import datetime
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--torch", required=True, help="bench/torch_conv.py's output (its --graphs run: kernels alone)")
    ap.add_argument("--graph-api", help="bench/torch_conv.py's output with --cudnn-graph, for the cuDNN graph API column")
    ap.add_argument("--gpu", required=True, help="short name for the file and heading, e.g. h100")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--note", default="")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.ours) as f:
        ours = json.load(f)
    with open(args.torch) as f:
        torch = json.load(f)
    by_id = {r["id"]: r for r in torch["rows"]}
    graph_api = {}
    if args.graph_api:
        with open(args.graph_api) as f:
            graph_api = {r["id"]: r for r in json.load(f)["rows"] if r.get("cudnn_graph_ms")}
    workloads = []
    for w in ours["workloads"]:
        t = by_id.get(w["id"], {})
        row = {"id": w["id"], "ours_ms": w.get("ours_ms"), "torch_ms": t.get("torch_ms"), "flops": w.get("flops")}
        if row["ours_ms"] and row["torch_ms"]:
            row["ratio"] = row["torch_ms"] / row["ours_ms"]
        if w.get("flops") and row["ours_ms"]:
            row["ours_tflops"] = w["flops"] / row["ours_ms"] / 1e9
        if w.get("flops") and row["torch_ms"]:
            row["torch_tflops"] = w["flops"] / row["torch_ms"] / 1e9
        if w["id"] in graph_api and row["ours_ms"]:
            row["cudnn_graph_ms"] = graph_api[w["id"]]["cudnn_graph_ms"]
            row["ratio_vs_cudnn_graph"] = row["cudnn_graph_ms"] / row["ours_ms"]
        row["build_ms"] = {"cold": None, "warm_disk": w.get("build_ms_first"), "in_process": w.get("build_ms_in_process")}
        workloads.append(row)
    cudnn = torch.get("cudnn")
    result = {
        "gpu": args.gpu,
        "device": ours.get("device", torch.get("device")),
        "date": datetime.date.today().isoformat(),
        "commit": args.commit,
        "software": f"PyTorch {torch.get('torch')}, cuDNN {cudnn}",
        "suite": "conv",
        "workloads": workloads,
        "note": args.note,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}: {len(workloads)} workloads")


if __name__ == "__main__":
    main()
