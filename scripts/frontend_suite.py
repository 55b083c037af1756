#!/usr/bin/env python3
"""The cudnn frontend's own Python tests, run once with real cuDNN and once with ferrodnn standing
in for it (`import cudnn` resolving to `ferrodnn`), compared test by test.

Two steps:

  stage (on the development machine, which reaches the network): copies the frontend's
      test/python at the pinned commit out of a mirror of NVIDIA/cudnn-frontend into
      .gpu/frontend_tests (ignored by git; the lead carries .gpu), and downloads the one test
      dependency the device machine lacks (looseversion) into .gpu/wheels/deps.

        python3 scripts/frontend_suite.py stage [--mirror DIR] [--commit SHA]

  run (on the GPU machine, no network): each test file under pytest in its own process, once
      per mode, several at a time; a plugin records every test's outcome as it finishes, so a
      file that crashes the interpreter (the frontend's conftest exits the process on a CUDA
      error) or runs out of time still counts what ran, and a crashed file is resumed past the
      test that crashed. Writes JSON: per file and mode the counts, and every test whose
      outcome differs between the modes (with ferrodnn's message).

        python3 scripts/frontend_suite.py run --tests .gpu/frontend_tests \\
            --cudnn-path /tmp/cudnnfe --ferrodnn-path /tmp/fdnn --out $OUT/frontend.json

The modes differ only in what `import cudnn` finds: `--cudnn-path` (the nvidia-cudnn-frontend
wheel, installed with --target), or a shim package `cudnn` whose import returns the `ferrodnn`
module from `--ferrodnn-path`. Nothing of the frontend's tests is kept in this repository.
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# The commit the package's frontend surface was compared with (docs/python.md).
PINNED_COMMIT = "3929da2ef4c1dba1bb8acb68727b9134f26f40c0"
DEFAULT_MIRROR = "/work/.mirror/NVIDIA+cudnn-frontend/repo"

# Issue 28's selection: conv, matmul, the norms, slice, rope, silu-and-mul, attention.
DEFAULT_FILES = [
    "test_conv_bias.py",
    "test_conv_genstats.py",
    "test_conv_reduction.py",
    "test_wgrads.py",
    "test_conv_fprop.py",
    "test_conv_fuzzer.py",
    "test_matmul_bias_relu.py",
    "test_low_precision_matmul.py",
    "test_matmul_fuzzer.py",
    "test_layernorm.py",
    "test_rmsnorm.py",
    "test_batchnorm.py",
    "test_instancenorm.py",
    "test_slice.py",
    "test_apply_rope.py",
    "test_silu_and_mul.py",
    "test_mhas.py",
    "test_mhas_v2.py",
    "test_flexible_sdpa.py",
    "test_flexible_sdpa_bprop.py",
    "test_sdpa_thd.py",
]

# The pytest plugin that records outcomes (one JSON line per event, flushed at once) and skips
# the tests an earlier attempt at the file already recorded.
PLUGIN = r'''
import json, os

_LOG = os.environ["FRONTEND_SUITE_LOG"]
_DONE = set()
if os.path.exists(_LOG):
    with open(_LOG) as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            _DONE.add(e["test"])
_outcome = {}


def _write(entry):
    with open(_LOG, "a") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()


def pytest_collection_modifyitems(session, config, items):
    keep = [i for i in items if i.nodeid not in _DONE]
    dropped = [i for i in items if i.nodeid in _DONE]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    _write({"test": "::collected", "event": "collected", "count": len(items) + len(dropped)})


def pytest_runtest_logstart(nodeid, location):
    _write({"test": nodeid, "event": "start"})


def _message(report):
    text = str(report.longrepr) if report.longrepr is not None else ""
    lines = [l for l in text.splitlines() if l.strip()]
    errs = [l for l in lines if l.startswith("E ")]
    msg = (errs[0] if errs else (lines[-1] if lines else ""))[:400]
    # The frontend's tests print which tensor mismatched ("%%%% Total N mismatches ... when
    # validating 'dQ' results") before failing with a bare "disallowed mismatches": keep those.
    out = getattr(report, "capstdout", "") or ""
    why = [l.strip() for l in out.splitlines() if "mismatches" in l and "%%%%" in l][:4]
    return (msg + (" | " + " | ".join(why) if why else ""))[:1000]


_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


def pytest_runtest_logreport(report):
    if report.failed:
        out = "failed" if report.when == "call" else "error"
    elif report.skipped:
        out = "skipped"
    elif report.when == "call":
        out = "passed"
    else:
        out = None
    prev = _outcome.get(report.nodeid)
    if out is not None and (prev is None or _RANK[out] > _RANK[prev[0]]):
        _outcome[report.nodeid] = (out, _message(report) if out != "passed" else "")
    if report.when == "teardown":
        out, msg = _outcome.get(report.nodeid, ("error", "no outcome reported"))
        _write({"test": report.nodeid, "event": "outcome", "outcome": out, "message": msg})


def pytest_collectreport(report):
    if report.failed:
        _write({"test": report.nodeid or "::collect", "event": "outcome", "outcome": "collect_error", "message": _message(report)})
'''

# `import cudnn` in ferrodnn mode: the package's import returns the ferrodnn module itself.
SHIM = '''import sys
import ferrodnn

sys.modules[__name__] = ferrodnn
'''


def stage(args):
    repo = Path(__file__).resolve().parent.parent
    dest = Path(args.dest) if args.dest else repo / ".gpu" / "frontend_tests"
    mirror = Path(args.mirror)
    if not mirror.exists():
        sys.exit(f"stage: no mirror of NVIDIA/cudnn-frontend at {mirror} (fetch github:NVIDIA/cudnn-frontend first, or pass --mirror)")
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "--git-dir", str(mirror), "archive", args.commit, "test/python"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "--strip-components=2", "-C", str(dest)], input=archive, check=True)
    (dest / "COMMIT").write_text(subprocess.run(["git", "--git-dir", str(mirror), "rev-parse", args.commit], check=True, capture_output=True, text=True).stdout)
    files = sorted(p.name for p in dest.glob("test_*.py"))
    missing = [f for f in DEFAULT_FILES if f not in files]
    print(f"staged {len(files)} test files of {args.commit} into {dest}" + (f"; missing from the selection: {missing}" if missing else ""))
    if not args.no_deps:
        deps = repo / ".gpu" / "wheels" / "deps"
        deps.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", str(deps), "looseversion"], check=True)
        print(f"wheels in {deps}: {sorted(p.name for p in deps.glob('*.whl'))}")


def run_file(mode, test_file, tests_dir, env, log, budget, pytest_args, restarts):
    """Run one file in `mode`, resuming past crashes; returns the process facts."""
    started = time.time()
    attempts = []
    while True:
        left = budget - (time.time() - started)
        if left <= 5:
            attempts.append({"rc": None, "why": "no time left"})
            break
        cmd = [sys.executable, "-m", "pytest", test_file, "-q", "-p", "frontend_suite_plugin", "-p", "no:cacheprovider", "--no-header", "-rN"] + pytest_args
        try:
            p = subprocess.run(cmd, cwd=tests_dir, env=env, capture_output=True, text=True, timeout=left)
            rc, tail = p.returncode, (p.stdout + p.stderr)[-3000:]
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"") + (e.stderr or b"")
            rc, tail = "timeout", (out.decode(errors="replace") if isinstance(out, bytes) else out)[-3000:]
        attempts.append({"rc": rc, "tail": tail})
        events = read_log(log)
        running = unfinished(events)
        if rc == "timeout":
            if running:
                append(log, {"test": running, "event": "outcome", "outcome": "timeout", "message": f"still running when the file's {budget:.0f} s ran out"})
            break
        # A test that started and has no outcome: the process died in it (a signal, or os._exit
        # from the frontend's conftest on a CUDA error). Record it and resume past it.
        if not running:
            break
        resume = len(attempts) <= restarts
        append(log, {"test": running, "event": "outcome", "outcome": "crashed", "message": f"the process ended with {rc} during this test" + (" (resumed after it)" if resume else "")})
        if not resume:
            break
    return {"mode": mode, "file": test_file, "seconds": round(time.time() - started, 1), "attempts": attempts}


def read_log(log):
    events = []
    if os.path.exists(log):
        with open(log) as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    pass
    return events


def append(log, entry):
    with open(log, "a") as f:
        f.write(json.dumps(entry) + "\n")


def unfinished(events):
    """The test that started last and has no outcome (the one running when the process died)."""
    done = {e["test"] for e in events if e.get("event") == "outcome"}
    started = [e["test"] for e in events if e.get("event") == "start"]
    for t in reversed(started):
        if t not in done:
            return t
    return None


def outcomes(events):
    out = {}
    for e in events:
        if e.get("event") == "outcome":
            out[e["test"]] = (e["outcome"], e.get("message", ""))
    return out


def run(args):
    tests_dir = Path(args.tests).resolve()
    if not tests_dir.is_dir():
        sys.exit(f"run: no test folder at {tests_dir} (stage it with `frontend_suite.py stage` and carry .gpu)")
    files = args.files or [f for f in DEFAULT_FILES if (tests_dir / f).exists()]
    absent = [f for f in (args.files or []) if not (tests_dir / f).exists()]
    if absent:
        sys.exit(f"run: not in {tests_dir}: {absent}")
    work = Path(tempfile.mkdtemp(prefix="frontend_suite_"))
    (work / "plugin").mkdir()
    (work / "plugin" / "frontend_suite_plugin.py").write_text(PLUGIN)
    (work / "shim" / "cudnn").mkdir(parents=True)
    (work / "shim" / "cudnn" / "__init__.py").write_text(SHIM)
    extra = [p for p in args.extra_path if p]
    modes = {
        "cudnn": [str(work / "plugin"), args.cudnn_path] + extra,
        "ferrodnn": [str(work / "plugin"), str(work / "shim"), args.ferrodnn_path] + extra,
    }
    modes = {m: v for m, v in modes.items() if m in args.modes}
    # Each mode's import must work before anything runs.
    for mode, path in modes.items():
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path + [os.environ.get("PYTHONPATH", "")]))
        probe = subprocess.run([sys.executable, "-c", "import cudnn; print(cudnn.__name__, cudnn.backend_version_string())"], env=env, capture_output=True, text=True)
        said = probe.stdout.strip() or (probe.stderr.strip().splitlines() or ["?"])[-1]
        print(f"[{mode}] import cudnn: {said}", flush=True)
    deadline = time.time() + args.deadline
    jobs = []
    for f in files:
        for mode in modes:
            jobs.append((mode, f))
    results = []
    lock = threading.Lock()

    def job(mode, f):
        log = str(work / f"{mode}__{f}.jsonl")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(modes[mode] + [os.environ.get("PYTHONPATH", "")]), FRONTEND_SUITE_LOG=log)
        budget = min(args.timeout, deadline - time.time())
        if budget <= 5:
            facts = {"mode": mode, "file": f, "seconds": 0, "attempts": [{"rc": None, "why": "the run's deadline had passed"}]}
        else:
            facts = run_file(mode, f, str(tests_dir), env, log, budget, args.pytest_args, args.restarts)
        facts["outcomes"] = outcomes(read_log(log))
        facts["collected"] = max([e.get("count", 0) for e in read_log(log) if e.get("event") == "collected"] or [0])
        with lock:
            counts = tally(facts["outcomes"])
            print(f"[{mode}] {f}: {counts} in {facts['seconds']} s (rc {[a.get('rc') for a in facts['attempts']]})", flush=True)
        return facts

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        for r in pool.map(lambda j: job(*j), jobs):
            results.append(r)
    report = summarize(results, files, list(modes), tests_dir, args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    t = report["totals"]
    print(json.dumps({k: t[k] for k in t if k != "per_mode"} | {"per_mode": t["per_mode"]}, indent=1))
    print(f"wrote {args.out}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


def tally(outs):
    c = {}
    for o, _ in outs.values():
        c[o] = c.get(o, 0) + 1
    return c


def summarize(results, files, modes, tests_dir, args):
    by = {(r["mode"], r["file"]): r for r in results}
    per_file = {}
    differences = []
    totals = {m: {} for m in modes}
    both_passed = their_passed = ours_only = 0
    for f in files:
        entry = {}
        for m in modes:
            r = by.get((m, f))
            if r is None:
                continue
            counts = tally(r["outcomes"])
            entry[m] = {"counts": counts, "collected": r["collected"], "seconds": r["seconds"], "exit": [a.get("rc") for a in r["attempts"]]}
            if any(a.get("rc") not in (0, 1, 5) for a in r["attempts"]):
                entry[m]["tail"] = r["attempts"][-1].get("tail", r["attempts"][-1].get("why", ""))[-1500:]
            for k, v in counts.items():
                totals[m][k] = totals[m].get(k, 0) + v
        per_file[f] = entry
        if "cudnn" in modes and "ferrodnn" in modes:
            theirs = by[("cudnn", f)]["outcomes"]
            ours = by[("ferrodnn", f)]["outcomes"]
            for test in sorted(set(theirs) | set(ours)):
                a = theirs.get(test, ("not run", ""))
                b = ours.get(test, ("not run", ""))
                if a[0] == "passed":
                    their_passed += 1
                    both_passed += b[0] == "passed"
                elif b[0] == "passed":
                    ours_only += 1
                if a[0] != b[0]:
                    differences.append({"file": f, "test": test, "cudnn": a[0], "ferrodnn": b[0], "ferrodnn_message": b[1], "cudnn_message": a[1]})
    out = {
        "commit_of_tests": (tests_dir / "COMMIT").read_text().strip() if (tests_dir / "COMMIT").exists() else None,
        "pytest_args": args.pytest_args,
        "files": per_file,
        "totals": {"per_mode": totals},
        "differences": differences,
    }
    if "cudnn" in modes and "ferrodnn" in modes:
        out["totals"].update(
            {
                "passed_on_cudnn": their_passed,
                "of_those_passed_on_ferrodnn": both_passed,
                "ratio": round(both_passed / their_passed, 4) if their_passed else None,
                "passed_on_ferrodnn_only": ours_only,
            }
        )
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stage", help="copy the frontend's test/python at the pinned commit into .gpu/frontend_tests")
    s.add_argument("--mirror", default=DEFAULT_MIRROR, help="a (bare) git mirror of NVIDIA/cudnn-frontend")
    s.add_argument("--commit", default=PINNED_COMMIT)
    s.add_argument("--dest", default=None, help="default: .gpu/frontend_tests")
    s.add_argument("--no-deps", action="store_true", help="do not download the looseversion wheel into .gpu/wheels/deps")
    r = sub.add_parser("run", help="run the tests in both modes and compare")
    r.add_argument("--tests", default=".gpu/frontend_tests")
    r.add_argument("--files", nargs="*", default=None, help="test files (default: the issue's selection present in --tests)")
    r.add_argument("--cudnn-path", default="/tmp/cudnnfe", help="where the nvidia-cudnn-frontend wheel is installed")
    r.add_argument("--ferrodnn-path", default="/tmp/fdnn", help="where the ferrodnn wheel is installed")
    r.add_argument("--extra-path", action="append", default=[], help="more PYTHONPATH entries for both modes (pytest, looseversion)")
    r.add_argument("--modes", nargs="+", default=["cudnn", "ferrodnn"], choices=["cudnn", "ferrodnn"])
    r.add_argument("--parallel", type=int, default=4, help="test processes at once (both modes share the GPU)")
    r.add_argument("--timeout", type=float, default=240, help="seconds for one file in one mode, resumptions included")
    r.add_argument("--deadline", type=float, default=540, help="seconds for the whole run; files not started by then are not run")
    r.add_argument("--restarts", type=int, default=3, help="times a crashed file is resumed past the test that crashed")
    r.add_argument("--out", default="frontend_suite.json")
    r.add_argument("--keep", action="store_true", help="keep the per-file logs (their folder is printed)")
    r.add_argument("pytest_args", nargs="*", help="after --: extra pytest arguments (such as -m 'L0 or L1')")
    args = ap.parse_args()
    if args.cmd == "stage":
        stage(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
