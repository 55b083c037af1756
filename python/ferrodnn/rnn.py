"""Recurrent networks: the descriptor of ferrodnn's ``rnn`` ops, cuDNN's weight-space queries,
a converter from PyTorch's parameters to the packed weight space, and functions with the
semantics of PyTorch's ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` on numpy arrays (they run on the
CPU engine).

```python
import numpy as np
from ferrodnn import rnn

x = np.random.default_rng(0).standard_normal((9, 5, 7)).astype(np.float32)   # [T, B, input]
params = rnn.init_params("lstm", input_size=7, hidden_size=13, num_layers=2, seed=1)
y, (h, c) = rnn.lstm(x, None, params)                                       # y: [9, 5, 13]
```

The graph op itself is ``pygraph.rnn(x, weights, desc, hx=, cx=, seq_lengths=, seed=, offset=)``
(and ``rnn_backward_data``, ``rnn_backward_weights``) with ``desc`` from :func:`rnn_desc`;
docs/ops.md documents the semantics and the weight-space layout.
"""

import re

import numpy as np

from . import _ferrodnn

_GATES = {"relu": 1, "tanh": 1, "lstm": 4, "gru": 3}
_LAYOUTS = ("seq_major_unpacked", "seq_major_packed", "batch_major_unpacked")
_BIAS = ("no_bias", "single_inp", "double", "single_rec")


def rnn_desc(
    cell_mode,
    input_size,
    hidden_size,
    max_seq_length,
    batch,
    num_layers=1,
    bidirectional=False,
    proj_size=None,
    bias_mode="double",
    cell_clip=None,
    dropout=None,
    layout="seq_major_unpacked",
    padding_fill=0.0,
    training=False,
):
    """The descriptor of the ``rnn`` ops as a dict (the fields of the graph's JSON).

    ``cell_mode``: "relu", "tanh", "lstm" or "gru". ``bias_mode``: "no_bias", "single_inp",
    "double" (PyTorch's) or "single_rec". ``cell_clip``: ``(lower, upper)`` or ``(lower, upper,
    propagate_nan)`` for LSTM. ``dropout``: the probability between layers (training only; the
    graph needs ``seed`` and ``offset`` tensors). ``layout``: "seq_major_unpacked" (x is
    [T, B, input]), "batch_major_unpacked" ([B, T, input]) or "seq_major_packed" ([T * B,
    input], each step's valid rows packed, lengths non-increasing).
    """
    if cell_mode not in _GATES:
        raise ValueError(f"rnn_desc: cell_mode must be one of {sorted(_GATES)}, got {cell_mode!r}")
    if layout not in _LAYOUTS:
        raise ValueError(f"rnn_desc: layout must be one of {_LAYOUTS}, got {layout!r}")
    if bias_mode not in _BIAS:
        raise ValueError(f"rnn_desc: bias_mode must be one of {_BIAS}, got {bias_mode!r}")
    d = {
        "cell_mode": cell_mode,
        "direction": "bidirectional" if bidirectional else "unidirectional",
        "num_layers": int(num_layers),
        "input_size": int(input_size),
        "hidden_size": int(hidden_size),
        "bias_mode": bias_mode,
        "layout": layout,
        "max_seq_length": int(max_seq_length),
        "batch": int(batch),
        "padding_fill": float(padding_fill),
        "training": bool(training),
    }
    if proj_size is not None and int(proj_size) not in (0, int(hidden_size)):
        d["proj_size"] = int(proj_size)
    if cell_clip is not None:
        lower, upper, *rest = cell_clip
        d["cell_clip"] = {"lower": float(lower), "upper": float(upper), "propagate_nan": bool(rest[0]) if rest else False}
    if dropout is not None:
        d["dropout"] = float(dropout)
    return d


def weight_params(desc, pseudo_layer, lin_id):
    """Where matrix ``lin_id`` of pseudo-layer ``pseudo_layer`` (layer * directions + direction)
    and its bias live in the weight space, in elements: ``(matrix_offset, rows, cols,
    bias_offset, bias_len)`` (cuDNN's cudnnGetRNNWeightParams; ``bias_len`` is 0 when the bias
    mode gives the matrix none). Linear ids: relu/tanh 0 = W, 1 = R; LSTM 0-3 the input matrices
    of gates i, f, g, o, 4-7 the recurrent ones, 8 the projection; GRU 0-2 input r, z, n, 3-5
    recurrent."""
    return _ferrodnn.rnn_weight_params(desc, pseudo_layer, lin_id)


def sizes(desc):
    """Element counts: ``weight_space``, ``reserve``, ``dgates``, and ``lin_layers`` (matrices per
    pseudo-layer), ``pseudo_layers``."""
    return _ferrodnn.rnn_sizes(desc)


def _suffix(layer, direction):
    return f"_l{layer}" + ("_reverse" if direction else "")


def torch_param_names(desc):
    """PyTorch's parameter names for this descriptor, in its ``_flat_weights_names`` order."""
    has_bias = desc["bias_mode"] == "double"
    dirs = 2 if desc["direction"] == "bidirectional" else 1
    names = []
    for layer in range(desc["num_layers"]):
        for d in range(dirs):
            s = _suffix(layer, d)
            names += [f"weight_ih{s}", f"weight_hh{s}"]
            if has_bias:
                names += [f"bias_ih{s}", f"bias_hh{s}"]
            if "proj_size" in desc:
                names.append(f"weight_hr{s}")
    return names


def pack_torch_params(desc, params, dtype=None):
    """The packed weight space (a 1-D numpy array) from PyTorch's parameters: a mapping from
    their names (``weight_ih_l0``, ``weight_hh_l0``, ``bias_ih_l0``, ``bias_hh_l0``,
    ``weight_hr_l0``, with ``_reverse`` for the second direction), as
    ``{k: v.detach().cpu().numpy() for k, v in module.named_parameters()}`` gives. The bias mode
    must be "double" (PyTorch's ``bias=True``) or "no_bias" (``bias=False``)."""
    if desc["bias_mode"] not in ("double", "no_bias"):
        raise ValueError(f"pack_torch_params: PyTorch has biases on both matrices or none; bias_mode {desc['bias_mode']!r} has no PyTorch form")
    s = sizes(desc)
    first = np.asarray(params[next(iter(torch_param_names(desc)))])
    out = np.zeros(s["weight_space"], dtype=dtype or first.dtype)
    g = _GATES[desc["cell_mode"]]
    dirs = 2 if desc["direction"] == "bidirectional" else 1
    for layer in range(desc["num_layers"]):
        for d in range(dirs):
            pl = layer * dirs + d
            sfx = _suffix(layer, d)
            for kind, base in (("ih", 0), ("hh", g)):
                w = np.asarray(params[f"weight_{kind}{sfx}"])
                b = np.asarray(params[f"bias_{kind}{sfx}"]) if desc["bias_mode"] == "double" else None
                for gate in range(g):
                    moff, rows, cols, boff, blen = weight_params(desc, pl, base + gate)
                    block = w[gate * rows : (gate + 1) * rows]
                    if block.shape != (rows, cols):
                        raise ValueError(f"pack_torch_params: weight_{kind}{sfx} has shape {w.shape}, expected ({g * rows}, {cols})")
                    out[moff : moff + rows * cols] = block.reshape(-1)
                    if blen:
                        out[boff : boff + blen] = b[gate * blen : (gate + 1) * blen]
            if "proj_size" in desc:
                moff, rows, cols, _, _ = weight_params(desc, pl, 2 * g)
                w = np.asarray(params[f"weight_hr{sfx}"])
                if w.shape != (rows, cols):
                    raise ValueError(f"pack_torch_params: weight_hr{sfx} has shape {w.shape}, expected ({rows}, {cols})")
                out[moff : moff + rows * cols] = w.reshape(-1)
    return out


def unpack_torch_params(desc, flat):
    """PyTorch's parameters (a dict of numpy arrays by name) from a packed weight space (or its
    gradient): the inverse of :func:`pack_torch_params`."""
    flat = np.asarray(flat)
    g = _GATES[desc["cell_mode"]]
    dirs = 2 if desc["direction"] == "bidirectional" else 1
    out = {}
    for layer in range(desc["num_layers"]):
        for d in range(dirs):
            pl = layer * dirs + d
            sfx = _suffix(layer, d)
            for kind, base in (("ih", 0), ("hh", g)):
                mats, biases = [], []
                for gate in range(g):
                    moff, rows, cols, boff, blen = weight_params(desc, pl, base + gate)
                    mats.append(flat[moff : moff + rows * cols].reshape(rows, cols))
                    biases.append(flat[boff : boff + blen] if blen else None)
                out[f"weight_{kind}{sfx}"] = np.concatenate(mats, axis=0)
                if desc["bias_mode"] == "double":
                    out[f"bias_{kind}{sfx}"] = np.concatenate(biases)
            if "proj_size" in desc:
                moff, rows, cols, _, _ = weight_params(desc, pl, 2 * g)
                out[f"weight_hr{sfx}"] = flat[moff : moff + rows * cols].reshape(rows, cols)
    return out


def init_params(mode, input_size, hidden_size, num_layers=1, bidirectional=False, bias=True, proj_size=0, seed=0, dtype=np.float32):
    """Random parameters by PyTorch's names, uniform in +-1/sqrt(hidden_size) as PyTorch
    initializes them."""
    rng = np.random.default_rng(seed)
    g = _GATES[mode]
    p = proj_size or hidden_size
    k = 1.0 / np.sqrt(hidden_size)
    out = {}
    for layer in range(num_layers):
        for d in range(2 if bidirectional else 1):
            s = _suffix(layer, d)
            inp = input_size if layer == 0 else p * (2 if bidirectional else 1)
            shapes = {f"weight_ih{s}": (g * hidden_size, inp), f"weight_hh{s}": (g * hidden_size, p)}
            if bias:
                shapes.update({f"bias_ih{s}": (g * hidden_size,), f"bias_hh{s}": (g * hidden_size,)})
            if proj_size:
                shapes[f"weight_hr{s}"] = (proj_size, hidden_size)
            for name, shape in shapes.items():
                out[name] = rng.uniform(-k, k, shape).astype(dtype)
    return out


def _describe(mode, params):
    """num_layers, bidirectional, hidden size, projection and bias from PyTorch's names."""
    names = list(params)
    layers = 1 + max(int(m.group(1)) for m in (re.match(r"weight_ih_l(\d+)", n) for n in names) if m)
    bidirectional = any(n.endswith("_reverse") for n in names)
    g = _GATES[mode]
    hidden = np.asarray(params["weight_ih_l0"]).shape[0] // g
    proj = np.asarray(params["weight_hr_l0"]).shape[0] if "weight_hr_l0" in params else 0
    return layers, bidirectional, hidden, proj, "bias_ih_l0" in params


def _run(mode, x, hx, cx, params, batch_first, lengths):
    from . import create_cpu_handle, heur_mode, pygraph  # the package imports this module

    x = np.ascontiguousarray(x)
    if x.ndim != 3:
        raise ValueError(f"{mode}: x must be 3-D ([T, B, input], or [B, T, input] with batch_first), got shape {x.shape}")
    layers, bidirectional, hidden, proj, bias = _describe(mode, params)
    t, b = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    desc = rnn_desc(
        mode,
        x.shape[2],
        hidden,
        t,
        b,
        num_layers=layers,
        bidirectional=bidirectional,
        proj_size=proj or None,
        bias_mode="double" if bias else "no_bias",
        layout="batch_major_unpacked" if batch_first else "seq_major_unpacked",
    )
    w = pack_torch_params(desc, params, dtype=x.dtype)
    graph = pygraph(handle=create_cpu_handle())
    X, W = graph.tensor_like(x), graph.tensor_like(w)
    feeds = {X: x, W: w}
    H = C = L = None
    if hx is not None:
        hx = np.ascontiguousarray(hx, dtype=x.dtype)
        H = graph.tensor_like(hx)
        feeds[H] = hx
    if cx is not None:
        cx = np.ascontiguousarray(cx, dtype=x.dtype)
        C = graph.tensor_like(cx)
        feeds[C] = cx
    if lengths is not None:
        lens = np.ascontiguousarray(lengths, dtype=np.int32)
        L = graph.tensor_like(lens)
        feeds[L] = lens
    y, hy, cy, _ = graph.rnn(X, W, desc, hx=H, cx=C, seq_lengths=L)
    outs = [y, hy] + ([cy] if cy is not None else [])
    for o in outs:
        o.set_output(True)
    graph.validate()
    arrays = [np.empty(o.get_dim(), x.dtype) for o in outs]
    for o, a in zip(outs, arrays):
        feeds[o] = a
    graph.build([heur_mode.A])
    graph.execute(feeds, np.empty(graph.get_workspace_size(), np.uint8))
    return arrays


def lstm(x, hx, params, batch_first=False, lengths=None):
    """``nn.LSTM``'s forward on numpy arrays: ``x`` [T, B, input] (or [B, T, input] with
    ``batch_first``), ``hx`` None or ``(h0, c0)`` ([layers * dirs, B, proj or hidden], [layers *
    dirs, B, hidden]), ``params`` PyTorch's parameters by name (layers, directions, hidden size,
    projection and bias follow from them). ``lengths``: each sample's length (as a packed
    sequence's; outputs past it are 0, states are those after each sample's last step).
    Returns ``(y, (h_n, c_n))``."""
    h0, c0 = hx if hx is not None else (None, None)
    y, h, c = _run("lstm", x, h0, c0, params, batch_first, lengths)
    return y, (h, c)


def gru(x, hx, params, batch_first=False, lengths=None):
    """``nn.GRU``'s forward on numpy arrays; see :func:`lstm`. Returns ``(y, h_n)``."""
    y, h = _run("gru", x, hx, None, params, batch_first, lengths)
    return y, h


def rnn(x, hx, params, nonlinearity="tanh", batch_first=False, lengths=None):
    """``nn.RNN``'s forward on numpy arrays (``nonlinearity`` "tanh" or "relu"); see
    :func:`lstm`. Returns ``(y, h_n)``."""
    if nonlinearity not in ("tanh", "relu"):
        raise ValueError(f"rnn: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
    y, h = _run(nonlinearity, x, hx, None, params, batch_first, lengths)
    return y, h
