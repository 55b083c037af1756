"""A Llama-style decoder stack trained with AdamW, once on stock PyTorch and once with its
RMSNorm, projections and attention on ferrodnn.torch (issue 33): the same initial weights and
data, bf16, loss per step for both, step time and peak memory, in one process on one GPU.

The block: RMSNorm, one fused QKV projection, RoPE, causal grouped-query attention, an output
projection, RMSNorm, a SwiGLU MLP (gate and up projections fused, SiLU(gate) * up, down), residual
adds; no biases. `--impl torch` runs every op on PyTorch (SDPA on its fastest backend);
`--impl ferrodnn` runs the norms (the residual add fused into the second), the four projections
and the attention on ferrodnn.torch's ops, the rest (RoPE, SiLU * up, embedding, loss) on PyTorch.

Usage (on the GPU machine): python3 bench/train_llama.py --out FILE.json [--layers 2 --dim 2048
--heads 16 --kv-heads 4 --seq 4096 --batch 1 --steps 50]
"""
import argparse
import json
import math

import torch
import torch.nn.functional as F

from train_common import peak_mb, timed_steps


def rope(x, cos, sin):
    """Rotary embedding of [b, h, s, d] by halves (d = 2 * half)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def make_params(args, dev, seed):
    """The stack's parameters (bf16 leaves), the same for both runs."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    d, hd = args.dim, args.dim // args.heads
    qkv_out = (args.heads + 2 * args.kv_heads) * hd
    hidden = args.ffn

    def w(*shape):
        return (torch.randn(*shape, generator=g) / math.sqrt(shape[-1])).to(dev, torch.bfloat16).requires_grad_(True)

    layers = []
    for _ in range(args.layers):
        layers.append({
            "norm1": torch.ones(d, device=dev, dtype=torch.bfloat16, requires_grad=True),
            "wqkv": w(qkv_out, d),
            "wo": w(d, args.heads * hd),
            "norm2": torch.ones(d, device=dev, dtype=torch.bfloat16, requires_grad=True),
            "w13": w(2 * hidden, d),
            "w2": w(d, hidden),
        })
    emb = (torch.randn(args.vocab, d, generator=g) * 0.02).to(dev, torch.bfloat16).requires_grad_(True)
    head = w(args.vocab, d)
    final = torch.ones(d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    return layers, emb, head, final


def forward(impl, args, layers, emb, head, final, tokens, cos, sin):
    if impl == "ferrodnn":
        import ferrodnn.torch as ft

        lin, rms = ft.linear, ft.rms_norm
        attn = lambda q, k, v: ft.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    else:
        lin, rms = F.linear, None
        attn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    b, s = tokens.shape
    hd = args.dim // args.heads
    x = emb[tokens]  # [b, s, d]
    eps = 1e-5
    for p in layers:
        h = rms(x, (args.dim,), p["norm1"], eps) if rms else F.rms_norm(x, (args.dim,), p["norm1"], eps)
        qkv = lin(h, p["wqkv"])
        q, k, v = qkv.split([args.heads * hd, args.kv_heads * hd, args.kv_heads * hd], dim=-1)
        q = rope(q.view(b, s, args.heads, hd).transpose(1, 2), cos, sin)
        k = rope(k.view(b, s, args.kv_heads, hd).transpose(1, 2), cos, sin)
        v = v.view(b, s, args.kv_heads, hd).transpose(1, 2)
        o = attn(q.contiguous(), k.contiguous(), v.contiguous())
        o = lin(o.transpose(1, 2).reshape(b, s, args.heads * hd), p["wo"])
        if rms:
            h, x = rms(o, (args.dim,), p["norm2"], eps, residual=x)
        else:
            x = x + o
            h = F.rms_norm(x, (args.dim,), p["norm2"], eps)
        gate, up = lin(h, p["w13"]).chunk(2, dim=-1)
        x = x + lin(F.silu(gate) * up, p["w2"])
    x = rms(x, (args.dim,), final, eps) if rms else F.rms_norm(x, (args.dim,), final, eps)
    logits = lin(x, head)
    return F.cross_entropy(logits.float().view(-1, args.vocab)[:-1], tokens.view(-1)[1:])


def setup(impl, args, dev):
    """One training step of `impl` ("torch" or "ferrodnn") on fresh parameters (the same for
    both): a function of the step number that runs forward, backward and the optimizer step and
    returns the loss (a tensor)."""
    layers, emb, head, final = make_params(args, dev, seed=0)
    params = [t for p in layers for t in p.values()] + [emb, head, final]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    g = torch.Generator(device="cpu").manual_seed(1)
    data = [torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(dev) for _ in range(4)]
    hd = args.dim // args.heads
    pos = torch.arange(args.seq, device=dev, dtype=torch.float32)
    inv = 1.0 / (10000 ** (torch.arange(0, hd // 2, device=dev, dtype=torch.float32) * 2 / hd))
    ang = torch.outer(pos, inv)
    cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)

    def step(i):
        loss = forward(impl, args, layers, emb, head, final, data[i % len(data)], cos, sin)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


def run(impl, args, dev):
    step = setup(impl, args, dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    losses, times = timed_steps(step, dev, args.steps)
    warm = sorted(times[3:]) if len(times) > 6 else sorted(times)
    return {"impl": impl, "losses": losses, "step_ms_median": warm[len(warm) // 2], "step_ms": times, "peak_mb": peak_mb(dev)}


def parser(out_required=True):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=out_required)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a quick check of the script on small sizes")
    return ap


def main():
    args = parser().parse_args()
    dev = torch.device(args.device)
    results = [run(impl, args, dev) for impl in ("torch", "ferrodnn")]
    a, b = results
    diff = max(abs(x - y) for x, y in zip(a["losses"], b["losses"]))
    report = {
        "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__, "config": vars(args),
        "runs": results, "max_loss_diff": diff, "step_ratio": a["step_ms_median"] / b["step_ms_median"],
    }
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}))
    for r in results:
        print(r["impl"], "step ms", round(r["step_ms_median"], 2), "peak MiB", r["peak_mb"] and round(r["peak_mb"]), "loss first/last", round(r["losses"][0], 4), round(r["losses"][-1], 4))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
