#!/usr/bin/env python3
"""A/B of two ferrodnn builds on one GPU: each suite's workloads timed by `ferrodnn bench` with
binary A, then binary B, in interleaved rounds; each side's time is its median over the rounds,
and each row keeps its rounds' B/A ratios (the GPU's clocks move between rounds by a few
percent). For checking that a change to the kernels' source (not their code) kept every row's
speed: a ratio inside the rounds' spread is no change.

    python3 bench/ab.py --a .gpu/ferrodnn_base --b .gpu/ferrodnn --suite memory-bound --out OUT
"""

import argparse
import json
import os
import statistics
import subprocess
import sys


def run(binary, suite, runs, out, filt):
    cmd = [binary, "bench", "--suite", suite, "--runs", str(runs), "--out", out] + (["--filter", filt] if filt else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    with open(out) as f:
        return {w["id"]: w for w in json.load(f)["workloads"] if "ours_ms" in w}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="the build before the change")
    ap.add_argument("--b", required=True, help="the build after the change")
    ap.add_argument("--suite", action="append", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--out", required=True, help="a folder for the JSON")
    ap.add_argument("--filter", help="only workloads whose id contains this")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    report = {}
    for suite in args.suite:
        rounds = []
        for r in range(args.rounds):
            a = run(args.a, suite, args.runs, os.path.join(args.out, f"ab_{suite}_a{r}.json"), args.filter)
            b = run(args.b, suite, args.runs, os.path.join(args.out, f"ab_{suite}_b{r}.json"), args.filter)
            rounds.append((a, b))
        rows = []
        for wid in rounds[0][0]:
            if not all(wid in a and wid in b for a, b in rounds):
                continue
            ta = statistics.median(a[wid]["ours_ms"] for a, _ in rounds)
            tb = statistics.median(b[wid]["ours_ms"] for _, b in rounds)
            per_round = [b[wid]["ours_ms"] / a[wid]["ours_ms"] for a, b in rounds]
            rows.append({"id": wid, "a_ms": ta, "b_ms": tb, "b_over_a": tb / ta, "rounds_b_over_a": per_round})
        report[suite] = rows
        print(f"== {suite}: B/A time (median of {args.rounds} rounds; the rounds' range)")
        for row in rows:
            lo, hi = min(row["rounds_b_over_a"]), max(row["rounds_b_over_a"])
            print(f"  {row['id']:<52} {row['a_ms']:9.4f} {row['b_ms']:9.4f} ms  {row['b_over_a']:.3f} ({lo:.3f}-{hi:.3f})", flush=True)
        # Written after each suite, so a call that runs out of time keeps the suites it finished.
        with open(os.path.join(args.out, "ab.json"), "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
