"""ResNet-50 (v1.5: the stride on the bottleneck's 3x3) trained with SGD and momentum, once on
stock PyTorch and once with its convolutions, batchnorms, max pool, global average pool and
final linear on ferrodnn.torch (issue 33): the same initial weights and data, channels-last,
bf16 (or fp16, or fp32), batchnorm in training mode, loss per step for both, step time and peak
memory, in one process on one GPU. `--compile` adds a run of `torch.compile` of the stock model.

Stock PyTorch (`torch`) runs the model as torchvision writes it (conv, batchnorm, in-place ReLU;
the shortcut added in place before the last ReLU of a block) with cuDNN in benchmark mode. On
ferrodnn every batchnorm is one call with what follows it fused: `relu(bn(x))` after the first
two convolutions of a block and the stem's, `relu(bn(x) + shortcut)` after the third, `bn(x)`
on the downsampling shortcut; the convolutions have no bias and feed a batchnorm, so they run
unfused. The loss (cross-entropy in f32) and SGD stay on PyTorch on both sides. The parameters
and the batchnorms' running statistics are in the training dtype (no f32 master copy), as in
train_llama.py.

Usage (on the GPU machine): python3 bench/train_resnet.py --out FILE.json [--batch 128 --image 224
--dtype bf16 --steps 50 --compile]; a quick check on the CPU: --device cpu --tiny --dtype fp32.
"""
import argparse
import copy
import json

import torch
import torch.nn.functional as F
from torch import nn

from train_common import peak_mb, timed_steps

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}


def norm(bn, x, relu=False, residual=None):
    """`relu(bn(x) + residual)` (the ReLU and the residual optional): one fused call on a
    ferrodnn.torch BatchNorm2d, torchvision's in-place sequence on a stock one."""
    if type(bn) is not nn.BatchNorm2d:  # ferrodnn.torch.nn.BatchNorm2d, after swap_modules
        return bn(x, activation="relu" if relu else None, residual=residual)
    y = bn(x)
    if residual is not None:
        y += residual
    return F.relu(y, inplace=True) if relu else y


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        cout = 4 * width
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)) if stride != 1 or cin != cout else None

    def forward(self, x):
        out = norm(self.bn1, self.conv1(x), relu=True)
        out = norm(self.bn2, self.conv2(out), relu=True)
        shortcut = x if self.downsample is None else norm(self.downsample[1], self.downsample[0](x))
        return norm(self.bn3, self.conv3(out), relu=True, residual=shortcut)


class ResNet(nn.Module):
    """The bottleneck ResNet: a 7x7 stride-2 stem, a 3x3 stride-2 max pool, four stages of
    `blocks` bottlenecks (widths `width` * 1, 2, 4, 8; the first block of stages 2-4 strides
    by 2), a global average pool and a linear classifier. blocks (3, 4, 6, 3) and width 64 are
    ResNet-50."""

    def __init__(self, blocks=(3, 4, 6, 3), width=64, classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, cin = [], width
        for i, n in enumerate(blocks):
            w = width * 2**i
            stages.append(nn.Sequential(*[Bottleneck(cin if j == 0 else 4 * w, w, 2 if i > 0 and j == 0 else 1) for j in range(n)]))
            cin = 4 * w
        self.layers = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)
        # torchvision's initialization.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.maxpool(norm(self.bn1, self.conv1(x), relu=True))
        x = self.avgpool(self.layers(x))
        return self.fc(torch.flatten(x, 1))


class MaxPool2d(nn.MaxPool2d):
    """The stem's max pool on ferrodnn.torch.max_pool2d."""

    def forward(self, x):
        import ferrodnn.torch as ft

        return ft.max_pool2d(x, self.kernel_size, self.stride, self.padding)


class GlobalAvgPool2d(nn.AdaptiveAvgPool2d):
    """The global average pool (output size 1) on ferrodnn.torch.avg_pool2d, one window over
    the whole image."""

    def forward(self, x):
        import ferrodnn.torch as ft

        return ft.avg_pool2d(x, tuple(x.shape[-2:]))


def to_ferrodnn(model):
    """`model` (a ResNet) with its convolutions, batchnorms and classifier swapped for
    ferrodnn.torch's modules and its two pools for the ones above, in place."""
    import ferrodnn.torch as ft

    skipped = []
    ft.swap_modules(model, skipped)
    if skipped:
        raise RuntimeError(f"train_resnet: modules left on PyTorch: {skipped}")
    model.maxpool.__class__ = MaxPool2d
    model.avgpool.__class__ = GlobalAvgPool2d
    return model


def blocks(args):
    return (1, 1, 1, 1) if args.tiny else tuple(int(b) for b in args.blocks.split(","))


def make_model(args):
    """The model with its initial weights (the same for every run), on the CPU in f32."""
    torch.manual_seed(0)
    return ResNet(blocks(args), 8 if args.tiny else args.width, args.classes)


def make_data(args, dev, dtype):
    """`--batches` distinct synthetic batches (images channels-last in `dtype`, labels), the
    same for every run."""
    g = torch.Generator(device="cpu").manual_seed(1)
    data = []
    for _ in range(args.batches):
        x = torch.randn(args.batch, 3, args.image, args.image, generator=g).to(dev, dtype).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, args.classes, (args.batch,), generator=g).to(dev)
        data.append((x, y))
    return data


def setup(impl, args, dev, base=None):
    """One training step of `impl` ("torch", "torch.compile" or "ferrodnn") on fresh copies of
    the initial weights: a function of the step number that runs forward, backward and the
    optimizer step and returns the loss (a tensor)."""
    dtype = DTYPES[args.dtype]
    model = copy.deepcopy(base if base is not None else make_model(args)).to(dev, dtype, memory_format=torch.channels_last).train()
    if impl == "ferrodnn":
        to_ferrodnn(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    data = make_data(args, dev, dtype)
    fwd = torch.compile(model) if impl == "torch.compile" else model

    def step(i):
        x, y = data[i % len(data)]
        logits = fwd(x)
        loss = F.cross_entropy(logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


def run(impl, args, dev, base):
    """`args.steps` timed steps of `impl`: losses, step times, median after the warm-up and peak
    memory (CUDA). A failure (torch.compile's, say) gives the run's error instead of raising."""
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    try:
        timed_steps(setup(impl, args, dev, base), dev, args.steps, losses=losses, times=times)
    except Exception as e:  # reported in the JSON, the other runs go on
        return {"impl": impl, "error": f"{type(e).__name__}: {e}"[:2000], "losses": losses, "step_ms": times}
    timed = sorted(times[args.warmup :] if len(times) > args.warmup else times)
    return {"impl": impl, "losses": losses, "step_ms_median": timed[len(timed) // 2], "step_ms": times, "peak_mb": peak_mb(dev)}


def parser(out_required=True):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=out_required)
    ap.add_argument("--impl", choices=["both", "torch", "ferrodnn"], default="both", help="which runs (both: PyTorch, then ferrodnn)")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile of the stock model (a failure to compile is reported in the JSON)")
    ap.add_argument("--blocks", default="3,4,6,3", help="bottlenecks per stage (3,4,6,3: ResNet-50)")
    ap.add_argument("--width", type=int, default=64, help="the stem's width (stage i's bottleneck width is width * 2^i)")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--tiny", action="store_true", help="one block per stage, width 8: a quick check of the script (with --batch 2 --image 64)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the median step time")
    ap.add_argument("--batches", type=int, default=4, help="distinct synthetic batches, used in turn")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a quick check of the script on small sizes")
    return ap


def main():
    args = parser().parse_args()
    dev = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    base = make_model(args)
    impls = ["torch", "ferrodnn"] if args.impl == "both" else [args.impl]
    if args.compile:
        impls.insert(1 if "torch" in impls else 0, "torch.compile")
    results = [run(impl, args, dev, base) for impl in impls]
    by = {r["impl"]: r for r in results if "error" not in r}
    a, b, c = by.get("torch"), by.get("ferrodnn"), by.get("torch.compile")
    report = {
        "model": "resnet", "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__, "config": vars(args),
        "runs": results,
        "max_loss_diff": max(abs(x - y) for x, y in zip(a["losses"], b["losses"])) if a and b else None,
        "step_ratio": a["step_ms_median"] / b["step_ms_median"] if a and b else None,
        "step_ratio_compile": c["step_ms_median"] / b["step_ms_median"] if c and b else None,
    }
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}))
    for r in results:
        if "error" in r:
            print(r["impl"], "failed:", r["error"][:300])
            continue
        print(r["impl"], "step ms", round(r["step_ms_median"], 2), "peak MiB", r["peak_mb"] and round(r["peak_mb"]), "loss first/last", round(r["losses"][0], 4), round(r["losses"][-1], 4))
    if a and b:
        print(f"step  {'torch':>14}  {'ferrodnn':>14}  {'difference':>10}")
        for i, (x, y) in enumerate(zip(a["losses"], b["losses"])):
            print(f"{i:4d}  {x:14.8f}  {y:14.8f}  {y - x:10.2e}")
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
