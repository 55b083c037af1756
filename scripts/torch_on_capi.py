#!/usr/bin/env python3
"""Stock PyTorch on ferrodnn's libcudnn.so.9 against stock PyTorch on NVIDIA's (issue 31).

Three modes of one script (scripts/torch_on_capi.sh runs them in order, each its own process):

  --ref OUT.pt      a pass on the process's cuDNN as it loads (NVIDIA's: no preload)
  --check OUT.pt    the same pass, run with ferrodnn's library preloaded (LD_PRELOAD)
  --compare REF.pt CHECK.pt --out OUT.json
                    every result of the two passes compared within its dtype's tolerance

A pass runs each check in its own try/except (a failure records its exception and the rest
go on) and rewrites OUT.pt after each check, so a crash keeps what ran before it. The checks:
the cuDNN version torch reports; nn.Conv2d (fp32 and fp16, NCHW and channels-last, groups,
dilation, stride, 1x1, benchmark mode) forward and backward; BatchNorm2d training forward and
backward and eval; LSTM and GRU (2 layers, bidirectional, batch_first) forward and backward;
scaled_dot_product_attention on the cuDNN backend (fp16 and bf16, causal and not) forward and
backward; a ResNet-18 (written here) training for a few steps in fp32 and in channels-last fp16
autocast: the losses and the median step time. Every input comes from a seeded CPU generator,
so both passes see the same numbers. fp32 checks run with tf32 off (torch.backends.cudnn.
allow_tf32 = False) so that the two libraries are compared at full precision; the ResNet runs
with torch's defaults.

--device cpu runs the same pass on the CPU (no cuDNN: sdpa on its default backend) to test
this script's logic where there is no GPU; --only NAME[,NAME...] runs the checks whose names
start with one of those prefixes; --steps and --timing-steps size the ResNet runs.
"""

import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

# Relative tolerance of a result by dtype: max |check - ref| / max(max |ref|, 1e-6).
TOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 3e-2, "float64": 1e-10}
# The ResNet's losses (relative, per step): tf32 and autocast steps diverge slowly.
LOSS_TOL = {"fp32": 2e-2, "fp16_amp_channels_last": 5e-2}


def gen(seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def randn(shape, seed, device, dtype=torch.float32, scale=1.0):
    return (torch.randn(shape, generator=gen(seed)) * scale).to(device=device, dtype=dtype)


def seeded_module(make, seed, device, dtype=torch.float32, channels_last=False):
    """A module made on the CPU under a fixed seed, then moved: the same weights on every device."""
    torch.manual_seed(seed)
    m = make()
    m = m.to(device=device, dtype=dtype)
    if channels_last:
        m = m.to(memory_format=torch.channels_last)
    return m


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def cpu(t):
    return t.detach().to("cpu").clone()


# ---------------------------------------------------------------------------------------------
# The checks. Each returns a dict of named CPU tensors (compared) and may add "info" (shown).

CONV_CASES = [
    # name, cin, cout, k, stride, pad, dilation, groups, hw
    ("3x3", 16, 32, 3, 1, 1, 1, 1, 20),
    ("groups4", 16, 32, 3, 1, 1, 1, 4, 20),
    ("depthwise", 16, 16, 3, 1, 1, 1, 16, 20),
    ("dilation2", 16, 32, 3, 1, 2, 2, 1, 20),
    ("stride2", 16, 32, 3, 2, 1, 1, 1, 21),
    ("1x1", 32, 64, 1, 1, 0, 1, 1, 14),
    ("7x7s2", 3, 16, 7, 2, 3, 1, 1, 32),
]


def conv_check(device, dtype, channels_last, case, benchmark=False):
    name, cin, cout, k, stride, pad, dil, groups, hw = case

    def run():
        conv = seeded_module(lambda: nn.Conv2d(cin, cout, k, stride=stride, padding=pad, dilation=dil, groups=groups), 10, device, dtype, channels_last)
        x = randn((4, cin, hw, hw), 11, device, dtype)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        x.requires_grad_(True)
        y = conv(x)
        gy = randn(tuple(y.shape), 12, device, dtype)
        y.backward(gy)
        sync(device)
        return {"y": cpu(y), "dx": cpu(x.grad), "dw": cpu(conv.weight.grad), "db": cpu(conv.bias.grad)}

    old = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = benchmark
    try:
        return run()
    finally:
        torch.backends.cudnn.benchmark = old


def batchnorm_check(device, dtype, channels_last):
    bn = seeded_module(lambda: nn.BatchNorm2d(24), 20, device, torch.float32, channels_last)
    with torch.no_grad():
        bn.weight.copy_(randn((24,), 21, device, scale=0.5) + 1)
        bn.bias.copy_(randn((24,), 22, device, scale=0.5))
    x = randn((8, 24, 13, 13), 23, device, dtype, scale=2.0) + 0.5
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    x.requires_grad_(True)
    bn.train()
    y = bn(x)
    gy = randn(tuple(y.shape), 24, device, dtype)
    y.backward(gy)
    out = {"y": cpu(y), "dx": cpu(x.grad), "dgamma": cpu(bn.weight.grad), "dbeta": cpu(bn.bias.grad), "running_mean": cpu(bn.running_mean), "running_var": cpu(bn.running_var)}
    bn.eval()
    with torch.no_grad():
        out["y_eval"] = cpu(bn(x))
    sync(device)
    return out


def rnn_check(device, kind, dtype):
    cls = {"lstm": nn.LSTM, "gru": nn.GRU}[kind]
    m = seeded_module(lambda: cls(32, 48, num_layers=2, bidirectional=True, batch_first=True), 30, device, dtype)
    if device == "cuda":
        m.flatten_parameters()
    x = randn((5, 17, 32), 31, device, dtype).requires_grad_(True)
    h0 = randn((4, 5, 48), 32, device, dtype)
    if kind == "lstm":
        c0 = randn((4, 5, 48), 33, device, dtype)
        y, (hn, cn) = m(x, (h0, c0))
        outs = {"y": y, "hn": hn, "cn": cn}
    else:
        y, hn = m(x, h0)
        outs = {"y": y, "hn": hn}
    loss = sum((o * randn(tuple(o.shape), 34 + i, device, dtype)).sum() for i, o in enumerate(outs.values()))
    loss.backward()
    sync(device)
    res = {k: cpu(v) for k, v in outs.items()}
    res["dx"] = cpu(x.grad)
    for pname, p in m.named_parameters():
        res["d" + pname] = cpu(p.grad)
    return res


def sdpa_check(device, dtype, causal):
    q, k, v = (randn((2, 4, 128, 64), 40 + i, device, dtype).requires_grad_(True) for i in range(3))
    if device == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    else:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    o.backward(randn(tuple(o.shape), 43, device, dtype))
    sync(device)
    return {"o": cpu(o), "dq": cpu(q.grad), "dk": cpu(k.grad), "dv": cpu(v.grad)}


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    """torchvision's resnet18 layout: a 7x7 stem, max pooling, four stages of two basic blocks."""

    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet_check(device, amp, args):
    small = device == "cpu"
    batch, res = (2, 32) if small else (args.batch, 224)
    model = seeded_module(lambda: ResNet18(), 50, device, torch.float32, channels_last=amp)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = randn((batch, 3, res, res), 51, device)
    if amp:
        x = x.to(memory_format=torch.channels_last)
    target = torch.randint(0, 1000, (batch,), generator=gen(52)).to(device)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.float16 if device == "cuda" else torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), target)
        loss.backward()
        opt.step()
        return loss

    # torch's defaults (tf32 convolutions), as a training script runs.
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        losses = [float(step().detach()) for _ in range(args.steps)]
        times = []
        for _ in range(args.timing_steps):
            sync(device)
            t0 = time.perf_counter()
            step()
            sync(device)
            times.append((time.perf_counter() - t0) * 1e3)
    finally:
        torch.backends.cudnn.allow_tf32 = old
    return {"loss": torch.tensor(losses, dtype=torch.float64), "info": {"losses": losses, "median_step_ms": statistics.median(times) if times else None, "batch": batch, "resolution": res}}


def checks(args):
    dev = args.device
    half = torch.float16
    out = []
    for dtype in (torch.float32, half):
        for cl in (False, True):
            for case in CONV_CASES:
                name = f"conv2d/{str(dtype).split('.')[-1]}/{'nhwc' if cl else 'nchw'}/{case[0]}"
                out.append((name, lambda dtype=dtype, cl=cl, case=case: conv_check(dev, dtype, cl, case)))
    out.append(("conv2d/float32/nchw/3x3/benchmark", lambda: conv_check(dev, torch.float32, False, CONV_CASES[0], benchmark=True)))
    out.append(("conv2d/float16/nhwc/3x3/benchmark", lambda: conv_check(dev, half, True, CONV_CASES[0], benchmark=True)))
    for dtype in (torch.float32, half):
        for cl in (False, True):
            out.append((f"batchnorm2d/{str(dtype).split('.')[-1]}/{'nhwc' if cl else 'nchw'}", lambda dtype=dtype, cl=cl: batchnorm_check(dev, dtype, cl)))
    for kind in ("lstm", "gru"):
        for dtype in (torch.float32, half):
            out.append((f"rnn/{kind}/{str(dtype).split('.')[-1]}", lambda kind=kind, dtype=dtype: rnn_check(dev, kind, dtype)))
    for dtype in (half, torch.bfloat16):
        for causal in (False, True):
            out.append((f"sdpa/{str(dtype).split('.')[-1]}/{'causal' if causal else 'full'}", lambda dtype=dtype, causal=causal: sdpa_check(dev, dtype, causal)))
    out.append(("resnet18/fp32", lambda: resnet_check(dev, False, args)))
    out.append(("resnet18/fp16_amp_channels_last", lambda: resnet_check(dev, True, args)))
    # Every family first (one convolution case of each dtype and layout), the other convolution
    # cases after the ResNet: a pass cut short by its time limit has covered each path.
    out.sort(key=lambda c: c[0].startswith("conv2d/") and not c[0].endswith("/3x3"))
    if args.only:
        prefixes = args.only.split(",")
        out = [(n, f) for n, f in out if any(n.startswith(p) for p in prefixes)]
    return out


# ---------------------------------------------------------------------------------------------
# A pass.


def loaded_cudnn():
    """The libcudnn files mapped in this process, and ferrodnn's version string if it is loaded."""
    paths = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libcudnn" in line:
                    paths.add(line.split()[-1])
    except OSError:
        pass
    ours = None
    try:
        fn = ctypes.CDLL(None).ferrodnnGetVersionString
        fn.restype = ctypes.c_char_p
        ours = fn().decode()
    except (AttributeError, OSError):
        pass
    return sorted(paths), ours


def global_cudnn_version():
    """cudnnGetVersion as the process's global scope resolves it (a preloaded library's), or None."""
    try:
        fn = ctypes.CDLL(None).cudnnGetVersion
        fn.restype = ctypes.c_size_t
        return int(fn())
    except (AttributeError, OSError):
        return None


def run_pass(args, path):
    dev = args.device
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    meta = {"mode": "ref" if args.ref else "check", "device": dev, "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn_enabled": torch.backends.cudnn.enabled}
    result = {"meta": meta, "results": {}}

    def save():
        torch.save(result, path)

    try:
        meta["cudnn_version"] = torch.backends.cudnn.version() if dev == "cuda" else None
    except Exception as e:  # torch's own compatibility check refuses a cuDNN
        meta["cudnn_version_error"] = f"{type(e).__name__}: {e}"
    # What libtorch_cuda.so's own cudnnGetVersion binding answers (no GPU needed), and what the
    # global scope's answers: equal when torch is bound to the preloaded library.
    try:
        meta["torch_cudnn_version_int"] = torch._C._cudnn.getVersionInt()
    except Exception as e:
        meta["torch_cudnn_version_int"] = f"{type(e).__name__}: {e}"
    meta["global_cudnn_version"] = global_cudnn_version()
    if dev == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(0)
    meta["libcudnn_mapped"], meta["ferrodnn"] = loaded_cudnn()
    print(f"[{meta['mode']}] torch {meta['torch']} cudnn {meta.get('cudnn_version')} (torch's binding {meta['torch_cudnn_version_int']}, global {meta['global_cudnn_version']}) ferrodnn {meta['ferrodnn']} mapped {meta['libcudnn_mapped']}", flush=True)
    save()
    for name, fn in checks(args):
        t0 = time.perf_counter()
        entry = {"tensors": {}, "info": None, "error": None}
        try:
            res = fn()
            entry["info"] = res.pop("info", None)
            entry["tensors"] = res
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
        entry["seconds"] = time.perf_counter() - t0
        result["results"][name] = entry
        status = "ok" if entry["error"] is None else "ERROR " + entry["error"].splitlines()[0][:200]
        print(f"[{meta['mode']}] {name}: {status} ({entry['seconds']:.2f} s)", flush=True)
        save()
    # The library list again: cuDNN's sub-libraries load on first use.
    meta["libcudnn_mapped"], meta["ferrodnn"] = loaded_cudnn()
    save()


# ---------------------------------------------------------------------------------------------
# The comparison.


def compare_tensors(a, b, tol):
    if a.shape != b.shape:
        return {"ok": False, "why": f"shapes differ: ref {list(a.shape)}, check {list(b.shape)}"}
    a64, b64 = a.double(), b.double()
    finite = bool(torch.isfinite(b64).all())
    scale = max(float(a64.abs().max()) if a64.numel() else 0.0, 1e-6)
    err = float((a64 - b64).abs().max()) / scale if a64.numel() else 0.0
    ok = finite and not math.isnan(err) and err <= tol
    return {"ok": ok, "rel_err": err, "tol": tol, "max_abs_ref": scale, "finite": finite}


def compare(ref_path, check_path, out_path):
    ref = torch.load(ref_path, weights_only=False)
    chk = torch.load(check_path, weights_only=False) if os.path.exists(check_path) else {"meta": {}, "results": {}}
    report = {"ref_meta": ref["meta"], "check_meta": chk["meta"], "checks": {}}
    rv, cv = ref["meta"].get("cudnn_version"), chk["meta"].get("cudnn_version")
    print(f"torch.backends.cudnn.version(): ref {rv}, check {cv}; ferrodnn in check: {chk['meta'].get('ferrodnn')}")
    # On the GPU the check pass must run on ferrodnn's library and torch must report its version
    # (a CPU dry run has no cuDNN: nothing to check).
    # (a CPU dry run has no torch.backends.cudnn.version(): there torch's binding is checked
    # through torch._C._cudnn.getVersionInt() alone).
    on_cpu = ref["meta"].get("device") == "cpu"
    ours = bool(chk["meta"].get("ferrodnn"))
    bound = chk["meta"].get("torch_cudnn_version_int") == chk["meta"].get("global_cudnn_version")
    report["version"] = {
        "ref": rv,
        "check": cv,
        "check_is_ferrodnn": ours,
        "torch_bound_to_preloaded": bound,
        "ref_torch_cudnn_version_int": ref["meta"].get("torch_cudnn_version_int"),
        "check_torch_cudnn_version_int": chk["meta"].get("torch_cudnn_version_int"),
        "ok": ours and bound and (on_cpu or cv == chk["meta"].get("global_cudnn_version")),
    }
    passed = failed = 0
    for name, r in ref["results"].items():
        c = chk["results"].get(name)
        entry = {"ref_error": r["error"], "check_error": None if c is None else c["error"], "tensors": {}}
        if c is None:
            entry["ok"], entry["why"] = False, "not run in the check pass (it crashed or stopped before it)"
        elif r["error"] or c["error"]:
            entry["ok"], entry["why"] = False, "an exception (see ref_error / check_error)"
        else:
            for k, a in r["tensors"].items():
                b = c["tensors"].get(k)
                if b is None:
                    entry["tensors"][k] = {"ok": False, "why": "missing in the check pass"}
                    continue
                tol = LOSS_TOL.get(name.split("/")[-1], 1e-2) if name.startswith("resnet18") else TOL[str(a.dtype).split(".")[-1]]
                entry["tensors"][k] = compare_tensors(a, b, tol)
            entry["ok"] = all(t["ok"] for t in entry["tensors"].values())
            if r["info"] or c["info"]:
                entry["ref_info"], entry["check_info"] = r["info"], c["info"]
        passed += entry["ok"]
        failed += not entry["ok"]
        report["checks"][name] = entry
        worst = max((t.get("rel_err", float("inf")) for t in entry["tensors"].values()), default=None)
        extra = ""
        if entry.get("ref_info") and "median_step_ms" in (entry["ref_info"] or {}):
            extra = f"  step ms: ref {entry['ref_info']['median_step_ms']}, check {(entry['check_info'] or {}).get('median_step_ms')}"
        why = "" if entry["ok"] else "  " + (entry.get("why") or "tolerance")
        print(f"{'PASS' if entry['ok'] else 'FAIL'} {name}  worst rel err {worst}{extra}{why}")
    report["summary"] = {"passed": passed, "failed": failed, "version_ok": report["version"]["ok"]}
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"{passed} passed, {failed} failed; version reports ferrodnn: {report['version']['ok']}; JSON: {out_path}")
    return 0 if failed == 0 and report["version"]["ok"] else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--ref", metavar="OUT.pt")
    mode.add_argument("--check", metavar="OUT.pt")
    mode.add_argument("--compare", nargs=2, metavar=("REF.pt", "CHECK.pt"))
    ap.add_argument("--out", metavar="OUT.json", help="--compare's JSON report")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--only", help="comma-separated prefixes of the check names to run")
    ap.add_argument("--steps", type=int, default=5, help="ResNet training steps whose losses are compared")
    ap.add_argument("--timing-steps", type=int, default=10, help="ResNet steps timed after them (median)")
    ap.add_argument("--batch", type=int, default=32, help="ResNet batch on the GPU")
    args = ap.parse_args()
    if args.compare:
        if not args.out:
            ap.error("--compare needs --out")
        return compare(args.compare[0], args.compare[1], args.out)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("torch_on_capi: no CUDA device (use --device cpu for a dry run)", file=sys.stderr)
        return 2
    run_pass(args, args.ref or args.check)
    return 0


if __name__ == "__main__":
    sys.exit(main())
