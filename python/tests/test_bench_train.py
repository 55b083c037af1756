"""The reference training scripts of bench/ (train_resnet.py, train_llama.py) and the step
profiler (profile_step.py) on the CPU with tiny settings: ferrodnn.torch's runs follow stock
PyTorch's losses step by step, and the profile names ferrodnn's ops."""

import os
import sys
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
if not os.path.isdir(BENCH):
    pytest.skip("bench/ is not beside the tests (an installed package)", allow_module_level=True)
sys.path.insert(0, BENCH)

import profile_step  # noqa: E402
import train_llama  # noqa: E402
import train_resnet  # noqa: E402

CPU = torch.device("cpu")
RESNET = "--device cpu --tiny --batch 2 --image 32 --classes 10 --steps 3 --warmup 1".split()


def test_resnet_losses_follow_pytorch_in_float64():
    """In float64 the two runs agree to rounding over the steps (the batchnorms' running
    statistics, the fused epilogues and SGD's updates included); the loss moves."""
    args = train_resnet.parser(out_required=False).parse_args(RESNET + ["--dtype", "fp64"])
    base = train_resnet.make_model(args)
    a, b = (train_resnet.run(impl, args, CPU, base) for impl in ("torch", "ferrodnn"))
    assert "error" not in a and "error" not in b, (a.get("error"), b.get("error"))
    assert len(a["losses"]) == len(b["losses"]) == 3
    assert max(abs(x - y) for x, y in zip(a["losses"], b["losses"])) < 1e-9, (a["losses"], b["losses"])
    assert a["losses"][0] != a["losses"][-1]


def test_resnet_ferrodnn_model_runs_every_layer_on_ferrodnn():
    args = train_resnet.parser(out_required=False).parse_args(RESNET)
    model = train_resnet.to_ferrodnn(train_resnet.make_model(args))
    kinds = {type(m).__module__ for m in model.modules() if not list(m.children())}
    assert kinds == {"ferrodnn.torch.nn", "train_resnet"}, kinds


def test_resnet_compile_failure_is_reported_not_raised(monkeypatch):
    def fail(model):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", fail)
    args = train_resnet.parser(out_required=False).parse_args(RESNET + ["--dtype", "fp32"])
    r = train_resnet.run("torch.compile", args, CPU, train_resnet.make_model(args))
    assert r["impl"] == "torch.compile" and r["error"] == "RuntimeError: no compiler here" and r["losses"] == []


def test_llama_setup_matches_between_runs():
    args = train_llama.parser(out_required=False).parse_args("--device cpu --layers 1 --dim 32 --heads 2 --kv-heads 1 --ffn 64 --vocab 50 --seq 8 --steps 2".split())
    a, b = (train_llama.run(impl, args, CPU) for impl in ("torch", "ferrodnn"))
    # bf16 on both sides: equal within bf16 rounding.
    assert max(abs(x - y) for x, y in zip(a["losses"], b["losses"])) < 0.05, (a["losses"], b["losses"])


def test_profile_step_tables_name_ferrodnn_ops():
    margs = train_resnet.parser(out_required=False).parse_args(RESNET + ["--dtype", "fp32"])
    opts = SimpleNamespace(warmup=1, steps=1, top=1000)
    run = profile_step.profile_run("ferrodnn", train_resnet, margs, CPU, opts)
    names = {r["name"] for r in run["by_cpu"]}
    assert {"ferrodnn::execute", "ferrodnn::conv", "ferrodnn::batch_norm", "train_step"} <= names, sorted(names)
    assert run["step_ms_median"] > 0 and "by_cuda" not in run
    execute = next(r for r in run["by_cpu"] if r["name"] == "ferrodnn::execute")
    assert execute["calls"] > 0 and execute["cpu_total_ms"] >= execute["self_cpu_ms"]
