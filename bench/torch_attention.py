"""PyTorch's side of the attention suite (ferrodnn-cli/src/bench_attention.rs): the same
workload ids, timed through F.scaled_dot_product_attention with the cuDNN and the flash-attention
backends; each id gets the faster of the two (today always cuDNN), as issue 6 asks.

Hook (bench/run.py): `from torch_attention import torch_attention` and, in main(),
`theirs = torch_attention(bench) if args.suite == "attention" else ...` (bench: run.py's timer).
"""
import re

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

dev = "cuda"
BACKENDS = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]

SHAPES = [
    (4, 16, 4096, 128, False, "b4h16s4096d128"),
    (4, 16, 4096, 128, True, "b4h16s4096d128_causal"),
    (16, 16, 1024, 64, False, "b16h16s1024d64"),
    (1, 32, 16384, 128, True, "b1h32s16384d128_causal"),
]


def _fastest(bench, make, backends=BACKENDS, label=""):
    """The best time over the backends that run `make(backend)`'s function; None if none does."""
    best = None
    for be in backends:
        try:
            with sdpa_kernel(be):
                fn = make()
                fn()
                ms = bench(fn)
        except Exception as e:  # a backend that does not take the shape
            print(f"  {label}torch backend {be} skipped: {str(e)[:120]}", flush=True)
            continue
        best = ms if best is None else min(best, ms)
    return best


def torch_attention(bench):
    """PyTorch's time (ms) for each workload id of the attention suite."""
    out = {}
    bf = torch.bfloat16
    for (b, h, s, d, causal, tag) in SHAPES:
        q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=bf) for _ in range(3))
        out[f"sdpa_fwd_bf16_{tag}"] = _fastest(bench, lambda: (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)))

        qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
        d_o = torch.randn(b, h, s, d, device=dev, dtype=bf)

        def make_bwd():
            o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
            return lambda: torch.autograd.grad(o, (qg, kg, vg), d_o, retain_graph=True)

        out[f"sdpa_bwd_bf16_{tag}"] = _fastest(bench, make_bwd)
        del q, k, v, qg, kg, vg, d_o
        torch.cuda.empty_cache()
    # Decode: one query per (batch, head), 32 query heads sharing 8 kv heads.
    q = torch.randn(64, 32, 1, 128, device=dev, dtype=bf)
    k, v = (torch.randn(64, 8, 8192, 128, device=dev, dtype=bf) for _ in range(2))
    out["sdpa_decode_bf16_b64hq32hkv8s8192d128"] = _fastest(bench, lambda: (lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)))
    return out


SWEEP_BACKENDS = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
SWEEP_ID = re.compile(r"^sdpa_(fwd|bwd)_bf16_.*_b(\d+)h(\d+)q(\d+)k(\d+)d(\d+)(_causal)?$")


def torch_attention_sweep(bench, ids):
    """PyTorch's time (ms) for each workload id of the attention sweep (attention_sweep_workloads
    in ferrodnn-cli/src/bench_attention.rs), the shape parsed from the id: the fastest of the
    cuDNN, flash-attention and memory-efficient backends that take it. With a causal mask and
    s_q != s_kv PyTorch's is_causal is top-left, as ours."""
    out = {}
    bf = torch.bfloat16
    for wid in ids:
        m = SWEEP_ID.match(wid)
        if not m:
            continue
        kind, b, h, sq, skv, d, causal = m.group(1), *(int(x) for x in m.groups()[1:6]), bool(m.group(7))
        q = torch.randn(b, h, sq, d, device=dev, dtype=bf)
        k, v = (torch.randn(b, h, skv, d, device=dev, dtype=bf) for _ in range(2))
        if kind == "fwd":
            make = lambda: (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        else:
            qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
            d_o = torch.randn(b, h, sq, d, device=dev, dtype=bf)

            def make():
                o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                return lambda: torch.autograd.grad(o, (qg, kg, vg), d_o, retain_graph=True)

        out[wid] = _fastest(bench, make, SWEEP_BACKENDS, f"{wid}: ")
        torch.cuda.empty_cache()
    return out
