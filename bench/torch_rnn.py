"""The RNN suite: ferrodnn's rnn graph ops beside PyTorch's cuDNN-backed nn.LSTM / nn.GRU, in one
process on one GPU, same shapes and dtype. Forward (inference), and forward + backward (training:
rnn, rnn_backward_data, rnn_backward_weights as one ferrodnn graph; PyTorch's forward + backward).
Times are CUDA events over back-to-back calls (host time included on both sides), median of rounds.
Writes JSON rows {id, ours_ms, torch_ms, ratio}."""

import argparse
import json
import os
import sys
import time

import torch

import ferrodnn as cudnn
from ferrodnn import rnn

ROWS = [
    # id, mode, seq, batch, input, hidden, layers, bidirectional, dtype
    ("lstm_fp16_s256_b64_h1024", "lstm", 256, 64, 1024, 1024, 1, False, torch.float16),
    ("lstm_fp16_s512_b1_h512", "lstm", 512, 1, 512, 512, 1, False, torch.float16),
    ("lstm_fp16_s512_b8_h1024", "lstm", 512, 8, 1024, 1024, 1, False, torch.float16),
    ("gru_fp16_s256_b64_h1024", "gru", 256, 64, 1024, 1024, 1, False, torch.float16),
    ("lstm_fp16_s128_b32_h512_l2_bidir", "lstm", 128, 32, 512, 512, 2, True, torch.float16),
    # A packed batch of unequal lengths (256 down to 130, sorted, as pack_padded_sequence needs).
    ("lstm_fp16_s256_b64_h1024_packed", "lstm", 256, 64, 1024, 1024, 1, False, torch.float16),
]


def lengths_of(rid, seq, b):
    """Each sample's length: all `seq`, or for a packed row `seq - 2 i` (at least 1)."""
    if rid.endswith("_packed"):
        return [max(seq - 2 * i, 1) for i in range(b)]
    return [seq] * b


def time_fn(fn, iters, rounds=3):
    fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        torch.cuda.synchronize()
        best.append(a.elapsed_time(b) / iters)
    best.sort()
    return best[len(best) // 2]


def kernel_times(fn):
    """CUDA milliseconds per kernel name over one call of `fn` (warm), largest first."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    totals = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            totals[e.name] = totals.get(e.name, 0.0) + e.device_time_total / 1000.0
    return dict(sorted(((k[:80], round(v, 4)) for k, v in totals.items()), key=lambda kv: -kv[1])[:16])


def torch_module(mode, n_in, hsz, layers, bidir, dtype):
    cls = torch.nn.LSTM if mode == "lstm" else torch.nn.GRU
    return cls(n_in, hsz, num_layers=layers, bidirectional=bidir).to("cuda", dtype)


def ours(handle, m, mode, seq, b, n_in, hsz, layers, bidir, dtype, train, lens_list):
    dirs = 2 if bidir else 1
    packed = min(lens_list) < seq
    layout = "seq_major_packed" if packed else "seq_major_unpacked"
    desc = rnn.rnn_desc(mode, n_in, hsz, seq, b, num_layers=layers, bidirectional=bidir, training=train, layout=layout)
    params = {k: v.detach().float().cpu().numpy() for k, v in m.named_parameters()}
    w = torch.from_numpy(rnn.pack_torch_params(desc, params)).to("cuda", dtype)
    seq_shape = lambda f: (seq * b, f) if packed else (seq, b, f)  # noqa: E731 - the layout's dims
    x = torch.randn(*seq_shape(n_in), device="cuda", dtype=dtype)
    h0 = torch.randn(layers * dirs, b, hsz, device="cuda", dtype=dtype)
    c0 = torch.randn(layers * dirs, b, hsz, device="cuda", dtype=dtype)
    lens = torch.tensor(lens_list, dtype=torch.int32, device="cuda")
    graph = cudnn.pygraph(handle=handle)
    X, W, H0, L = (graph.tensor_like(v) for v in (x, w, h0, lens))
    C0 = graph.tensor_like(c0) if mode == "lstm" else None
    y, hy, cy, reserve = graph.rnn(X, W, desc, hx=H0, cx=C0, seq_lengths=L)
    outs = [y, hy] + ([cy] if cy is not None else [])
    pack = {X: x, W: w, H0: h0, L: lens}
    if C0 is not None:
        pack[C0] = c0
    if train:
        dy = torch.randn(*seq_shape(hsz * dirs), device="cuda", dtype=dtype)
        DY = graph.tensor_like(dy)
        pack[DY] = dy
        dx, dhx, dcx, dgates = graph.rnn_backward_data(DY, W, reserve, desc, hx=H0, cx=C0, seq_lengths=L)
        dw = graph.rnn_backward_weights(X, reserve, dgates, desc, hx=H0, seq_lengths=L)
        outs += [o for o in (dx, dhx, dcx, dw) if o is not None]
    for o in outs:
        o.set_output(True)
    graph.validate()
    graph.build([cudnn.heur_mode.A])
    for o in outs:
        pack[o] = torch.empty(o.get_dim(), device="cuda", dtype=dtype)
    ws = torch.empty(graph.get_workspace_size(), device="cuda", dtype=torch.uint8)
    return lambda: graph.execute(pack, ws), graph


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--filter", default="")
    ap.add_argument("--fwd-only", action="store_true", help="forward rows only")
    ap.add_argument("--profile", action="store_true", help="also each row's kernels: CUDA time per kernel name over one call (torch.profiler), in the row as `kernels`")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    rows = []
    for rid, mode, seq, b, n_in, hsz, layers, bidir, dtype in ROWS:
        if args.filter not in rid:
            continue
        m = torch_module(mode, n_in, hsz, layers, bidir, dtype)
        for train in (False,) if args.fwd_only else (False, True):
            name = rid + ("_fwdbwd" if train else "_fwd")
            try:
                t0 = time.time()
                lens_list = lengths_of(rid, seq, b)
                fn, graph = ours(handle, m, mode, seq, b, n_in, hsz, layers, bidir, dtype, train, lens_list)
                build_s = time.time() - t0
                iters = 3 if train else 5
                ours_ms = time_fn(fn, iters)
                x = torch.randn(seq, b, n_in, device="cuda", dtype=dtype, requires_grad=train)
                pack = torch.nn.utils.rnn.pack_padded_sequence

                def run_torch():
                    if min(lens_list) < seq:
                        out, _ = m(pack(x, torch.tensor(lens_list), enforce_sorted=True))
                        return out.data
                    return m(x)[0]

                if train:
                    def tfn():
                        out = run_torch()
                        out.backward(torch.ones_like(out))
                else:
                    def tfn():
                        with torch.no_grad():
                            run_torch()
                torch_ms = time_fn(tfn, iters)
                row = dict(id=name, ours_ms=ours_ms, torch_ms=torch_ms, ratio=torch_ms / ours_ms, build_s=build_s)
                if args.profile:
                    try:
                        row["kernels"] = kernel_times(fn)
                    except Exception as e:  # noqa: BLE001 - the timing stands without the profile
                        row["kernels"] = {"error": f"{type(e).__name__}: {e}"[:200]}
            except Exception as e:  # noqa: BLE001 - a row's failure is reported, the suite goes on
                row = dict(id=name, error=f"{type(e).__name__}: {e}"[:400])
            rows.append(row)
            print(json.dumps(row), flush=True)
    name = torch.cuda.get_device_name()
    result = dict(
        gpu="h200" if "H200" in name else "h100",
        device=name,
        date=time.strftime("%Y-%m-%d"),
        commit=os.environ.get("FERRODNN_COMMIT", "unknown"),
        software=f"PyTorch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}",
        suite="rnn",
        note=("bench/torch_rnn.py: ferrodnn's rnn graph ops (forward alone: inference; forward + backward: the rnn, "
              "rnn_backward_data and rnn_backward_weights ops in one graph) beside PyTorch's nn.LSTM / nn.GRU on cuDNN "
              "(forward under no_grad; forward + backward of the output's sum), same shapes, fp16, in one process; "
              "CUDA events over back-to-back calls, host time included on both sides, median of 3 rounds."),
        workloads=rows,
    )
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
