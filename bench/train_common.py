"""What bench/'s training scripts (train_llama.py, train_resnet.py) and profile_step.py share:
the timed loop over a step function and the peak memory."""
import time

import torch


def sync_of(dev):
    """A function that waits for `dev`'s queued work (nothing to wait for on the CPU)."""
    return torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)


def timed_steps(step, dev, steps, start=0, losses=None, times=None):
    """Runs `step(i)` (a training step returning its loss tensor) for `steps` values of i from
    `start`, the device synchronized before and after each, and appends each loss (a float) and
    step time (ms) to `losses` and `times` (new lists unless given: a caller that catches a
    failure keeps what ran). Returns (losses, times)."""
    sync = sync_of(dev)
    losses = [] if losses is None else losses
    times = [] if times is None else times
    for i in range(start, start + steps):
        sync()
        t = time.perf_counter()
        loss = step(i)
        sync()
        times.append((time.perf_counter() - t) * 1e3)
        losses.append(loss.item())
    return losses, times


def peak_mb(dev):
    """The most memory PyTorch's allocator held on `dev` since the last reset, in MiB (None on
    the CPU)."""
    return torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda" else None
