"""The drop-in recurrent modules (see the package's documentation)."""

from collections import OrderedDict

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence

import ferrodnn as _fd

from .. import rnn as _rnn
from ._common import build as _build
from ._common import compute as _compute
from ._common import handle as _handle
from ._common import lru as _lru
from ._common import workspace as _workspace

__all__ = ["LSTM", "GRU", "RNN"]

_CACHE_SIZE = 32


class _Plan:
    """One built forward graph and, for training, its backward graphs (built on first use)."""

    def __init__(self, desc, device, dtype, has_hx, has_cx, has_lengths, has_dropout):
        self.desc, self.device, self.dtype = desc, device, dtype
        self.has_hx, self.has_cx, self.has_lengths, self.has_dropout = has_hx, has_cx, has_lengths, has_dropout
        self.lstm = desc["cell_mode"] == "lstm"
        self.fwd = None
        self.bwd = {}

    def _run(self, graph, pack, outs, shapes):
        """Executes `graph` on `pack` with fresh output buffers: an iterator over them, in `outs`'s
        order."""
        bufs = [torch.empty(dims, dtype=dt, device=self.device) for dims, dt in shapes]
        pack.update(zip(outs, bufs))
        graph.execute(pack, _workspace(graph, self.device))
        return iter(bufs)

    def forward(self, x, w, hx, cx, lengths, seed):
        """Runs the forward: -> (y, hy, cy or None, reserve or None)."""
        handle = _handle(self.device)
        if self.fwd is None:
            graph = _fd.pygraph(handle=handle)
            X, W = graph.tensor_like(x), graph.tensor_like(w)
            H = graph.tensor_like(hx) if hx is not None else None
            C = graph.tensor_like(cx) if cx is not None else None
            L = graph.tensor_like(lengths) if lengths is not None else None
            S = O = None
            if seed is not None:
                S, O = graph.tensor_like(seed[0:1]), graph.tensor_like(seed[1:2])
            y, hy, cy, reserve = graph.rnn(X, W, self.desc, hx=H, cx=C, seq_lengths=L, seed=S, offset=O, compute_data_type=_compute(self.dtype))
            outs = [o for o in (y, hy, cy, reserve) if o is not None]
            self.fwd = (graph, (X, W, H, C, L, S, O), outs, _build(graph, outs), (cy is not None, reserve is not None))
        graph, (X, W, H, C, L, S, O), outs, shapes, (has_cy, has_reserve) = self.fwd
        pack = {X: x, W: w}
        for t, v in ((H, hx), (C, cx), (L, lengths)):
            if t is not None:
                pack[t] = v
        if S is not None:
            pack[S], pack[O] = seed[0:1], seed[1:2]
        it = self._run(graph, pack, outs, shapes)
        y, hy = next(it), next(it)
        cy = next(it) if has_cy else None
        reserve = next(it) if has_reserve else None
        return y, hy, cy, reserve

    def backward(self, x, w, hx, cx, lengths, reserve, dy, dhy, dcy, need_dw):
        """Runs the backward: -> (dx, dhx, dcx or None, dw or None)."""
        handle = _handle(self.device)
        entry = self.bwd.get(need_dw)
        if entry is None:
            graph = _fd.pygraph(handle=handle)
            X, W, R, DY, DH = (graph.tensor_like(v) for v in (x, w, reserve, dy, dhy))
            H = graph.tensor_like(hx) if hx is not None else None
            C = graph.tensor_like(cx) if cx is not None else None
            L = graph.tensor_like(lengths) if lengths is not None else None
            DC = graph.tensor_like(dcy) if dcy is not None else None
            ct = _compute(self.dtype)
            dx, dhx, dcx, dgates = graph.rnn_backward_data(DY, W, R, self.desc, hx=H, cx=C, dhy=DH, dcy=DC, seq_lengths=L, compute_data_type=ct)
            dw = graph.rnn_backward_weights(X, R, dgates, self.desc, hx=H, seq_lengths=L, compute_data_type=ct) if need_dw else None
            outs = [o for o in (dx, dhx, dcx, dw) if o is not None]
            entry = self.bwd[need_dw] = (graph, (X, W, R, DY, DH, H, C, L, DC), outs, _build(graph, outs), dcx is not None)
        graph, ins, outs, shapes, has_dcx = entry
        vals = (x, w, reserve, dy, dhy, hx, cx, lengths, dcy)
        pack = {t: v for t, v in zip(ins, vals) if t is not None}
        it = self._run(graph, pack, outs, shapes)
        dx, dhx = next(it), next(it)
        dcx = next(it) if has_dcx else None
        dw = next(it) if need_dw else None
        return dx, dhx, dcx, dw


class _RnnFunction(torch.autograd.Function):
    """The training forward (reserve kept) and its backward, on one plan of the module."""

    @staticmethod
    def forward(ctx, plan, x, w, hx, cx, lengths, seed):
        y, hy, cy, reserve = plan.forward(x, w, hx, cx, lengths, seed)
        ctx.plan = plan
        ctx.save_for_backward(x, w, hx, cx, lengths, reserve)
        return (y, hy, cy) if cy is not None else (y, hy)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        plan = ctx.plan
        x, w, hx, cx, lengths, reserve = ctx.saved_tensors
        dy, dhy = grads[0].contiguous(), grads[1].contiguous()
        dcy = grads[2].contiguous() if plan.lstm else None
        need_dw = ctx.needs_input_grad[2]
        dx, dhx, dcx, dw = plan.backward(x, w, hx, cx, lengths, reserve, dy, dhy, dcy, need_dw)
        return (
            None,
            dx if ctx.needs_input_grad[1] else None,
            dw,
            dhx if hx is not None and ctx.needs_input_grad[3] else None,
            dcx if cx is not None and ctx.needs_input_grad[4] else None,
            None,
            None,
        )


class _FerroRnnMixin:
    """What LSTM, GRU and RNN share: the descriptor, the packed weights, the plans, forward."""

    def _cell_mode(self):
        if self.mode == "LSTM":
            return "lstm"
        if self.mode == "GRU":
            return "gru"
        return "relu" if self.mode == "RNN_RELU" else "tanh"

    def _desc(self, t_len, batch, layout, training, dropout):
        return _rnn.rnn_desc(
            self._cell_mode(),
            self.input_size,
            self.hidden_size,
            t_len,
            batch,
            num_layers=self.num_layers,
            bidirectional=self.bidirectional,
            proj_size=self.proj_size or None,
            bias_mode="double" if self.bias else "no_bias",
            layout=layout,
            training=training,
            dropout=dropout,
        )

    def _pieces(self):
        """The parameters' flat ranges in packed order: [(name, start, count)], one per
        parameter (checked once: the weight space is their concatenation)."""
        pieces = self.__dict__.get("_fd_pieces")
        if pieces is not None:
            return pieces
        desc = self._desc(1, 1, "seq_major_unpacked", False, None)
        g = _rnn._GATES[desc["cell_mode"]]
        dirs = 2 if self.bidirectional else 1
        ranges = []  # (offset, count, name, start in the parameter)
        for layer in range(self.num_layers):
            for d in range(dirs):
                pl = layer * dirs + d
                sfx = _rnn._suffix(layer, d)
                for kind, base in (("ih", 0), ("hh", g)):
                    for gate in range(g):
                        moff, rows, cols, boff, blen = _rnn.weight_params(desc, pl, base + gate)
                        ranges.append((moff, rows * cols, f"weight_{kind}{sfx}", gate * rows * cols))
                        if blen:
                            ranges.append((boff, blen, f"bias_{kind}{sfx}", gate * blen))
                if self.proj_size:
                    moff, rows, cols, _, _ = _rnn.weight_params(desc, pl, 2 * g)
                    ranges.append((moff, rows * cols, f"weight_hr{sfx}", 0))
        ranges.sort()
        merged = []
        end = 0
        for off, n, name, start in ranges:
            if off != end:
                raise RuntimeError(f"ferrodnn.torch: the weight space is not a concatenation of the parameters (a gap or overlap at element {end}, next range at {off})")
            if merged and merged[-1][0] == name and merged[-1][1] + merged[-1][2] == start:
                merged[-1] = (name, merged[-1][1], merged[-1][2] + n)
            else:
                merged.append((name, start, n))
            end = off + n
        total = _rnn.sizes(desc)["weight_space"]
        if end != total:
            raise RuntimeError(f"ferrodnn.torch: the parameters cover {end} elements of a weight space of {total}")
        self.__dict__["_fd_pieces"] = merged
        return merged

    def _weights(self, grad):
        """The packed weight space: with autograd (`grad`) a fresh torch.cat, else cached by the
        parameters' storage and versions."""
        params = [(getattr(self, name), start, n) for name, start, n in self._pieces()]

        def cat():
            return torch.cat([p.reshape(-1)[start : start + n] if (start, n) != (0, p.numel()) else p.reshape(-1) for p, start, n in params])

        if grad:
            return cat()
        if any(p.is_inference() for p, _, _ in params):
            # Inference tensors (a module made under torch.inference_mode) have no versions.
            with torch.no_grad():
                return cat()
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p, _, _ in params)
        cached = self.__dict__.get("_fd_weights")
        if cached is not None and cached[0] == key:
            return cached[1]
        with torch.no_grad():
            w = cat()
        self.__dict__["_fd_weights"] = (key, w)
        return w

    def _plan(self, key, make):
        cache = self.__dict__.get("_fd_plans")
        if cache is None:
            cache = self.__dict__["_fd_plans"] = OrderedDict()
        return _lru(cache, key, make, _CACHE_SIZE)

    def __getstate__(self):
        # Graphs and handles are not picklable (copy.deepcopy, torch.save of the module): the
        # copy rebuilds them.
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__
        return {k: v for k, v in state.items() if k not in ("_fd_plans", "_fd_weights", "_fd_pieces")}

    def _check_state(self, name, t, want, x):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{type(self).__name__}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != tuple(want):
            raise ValueError(f"{type(self).__name__}: {name} must have shape {tuple(want)} (num_layers * num_directions, batch, {'hidden_size' if name == 'c0' else 'proj_size or hidden_size'}), got {tuple(t.shape)}")
        if t.dtype != x.dtype or t.device != x.device:
            raise ValueError(f"{type(self).__name__}: {name} must be {x.dtype} on {x.device} as the input, got {t.dtype} on {t.device}")

    def _run(self, input, hx):
        name = type(self).__name__
        lstm = self.mode == "LSTM"
        packed = isinstance(input, PackedSequence)
        unbatched = False
        sorted_indices = unsorted_indices = None
        if packed:
            data, batch_sizes, sorted_indices, unsorted_indices = input
            x = data
            if x.dim() != 2:
                raise ValueError(f"{name}: a PackedSequence's data must be 2-D [sum of lengths, input_size], got shape {tuple(x.shape)}")
            t_len, batch = int(batch_sizes.numel()), int(batch_sizes[0])
        else:
            x = input
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{name}: input must be a torch.Tensor or a PackedSequence, got {type(x).__name__}")
            if x.dim() == 2:
                unbatched = True
                x = x.unsqueeze(1)
            elif x.dim() != 3:
                raise ValueError(f"{name}: input must be 2-D (unbatched) or 3-D, got shape {tuple(x.shape)}")
            t_len, batch = (x.shape[1], x.shape[0]) if self.batch_first and not unbatched else (x.shape[0], x.shape[1])
        if x.shape[-1] != self.input_size:
            raise ValueError(f"{name}: input must have input_size = {self.input_size} features, got shape {tuple(x.shape)}")
        if t_len == 0 or batch == 0:
            raise ValueError(f"{name}: input must have at least one step and one sample, got shape {tuple(x.shape)}")
        if x.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            raise ValueError(f"{name}: input must be float16, bfloat16, float32 or float64, got {x.dtype}")
        params = list(self.parameters())
        if params and (params[0].dtype != x.dtype or params[0].device != x.device):
            raise ValueError(f"{name}: input is {x.dtype} on {x.device} but the parameters are {params[0].dtype} on {params[0].device} (move the module or the input)")

        dirs = 2 if self.bidirectional else 1
        out = self.proj_size or self.hidden_size
        h0 = c0 = None
        if hx is not None:
            if lstm:
                if not (isinstance(hx, (tuple, list)) and len(hx) == 2):
                    raise TypeError(f"{name}: hx must be a tuple (h0, c0) for an LSTM, got {type(hx).__name__}")
                h0, c0 = hx
            else:
                h0 = hx
            sdim = 2 if unbatched else 3
            for sname, s in (("h0", h0), ("c0", c0)):
                if s is not None and isinstance(s, torch.Tensor) and s.dim() != sdim:
                    raise ValueError(f"{name}: for {'unbatched 2-D' if unbatched else 'batched 3-D'} input, {sname} must be {sdim}-D, got shape {tuple(s.shape)}")
            if unbatched:
                h0 = h0.unsqueeze(1) if isinstance(h0, torch.Tensor) else h0
                c0 = c0.unsqueeze(1) if isinstance(c0, torch.Tensor) else c0
            self._check_state("h0", h0, (self.num_layers * dirs, batch, out), x)
            if lstm:
                self._check_state("c0", c0, (self.num_layers * dirs, batch, self.hidden_size), x)
            if sorted_indices is not None:
                h0 = h0.index_select(1, sorted_indices)
                c0 = c0.index_select(1, sorted_indices) if c0 is not None else None
            h0 = h0.contiguous()
            c0 = c0.contiguous() if c0 is not None else None

        lengths = None
        if packed:
            n = x.shape[0]
            # lengths[b] = steps with more than b samples (batch_sizes is non-increasing).
            bs = batch_sizes.to(torch.int64)
            lengths = (bs.unsqueeze(0) > torch.arange(batch).unsqueeze(1)).sum(1).to(torch.int32).to(x.device)
            if n < t_len * batch:
                x = torch.cat([x, x.new_zeros(t_len * batch - n, x.shape[1])])
            layout = "seq_major_packed"
        else:
            layout = "batch_major_unpacked" if self.batch_first and not unbatched else "seq_major_unpacked"
        x = x.contiguous()

        dropout = float(self.dropout) if self.training and self.dropout > 0 and self.num_layers > 1 else None
        grad = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params) or any(s is not None and s.requires_grad for s in (h0, c0)))
        training = grad or dropout is not None
        w = self._weights(grad)
        seed = None
        if dropout is not None:
            s = torch.randint(0, 2**62, (1,), dtype=torch.int64)
            seed = torch.cat([s, torch.zeros(1, dtype=torch.int64)]).to(x.device)
        key = (layout, t_len, batch, str(x.device), x.dtype, h0 is not None, c0 is not None, lengths is not None, training, dropout)
        plan = self._plan(key, lambda: _Plan(self._desc(t_len, batch, layout, training, dropout), x.device, x.dtype, h0 is not None, c0 is not None, lengths is not None, dropout is not None))
        if grad:
            res = _RnnFunction.apply(plan, x, w, h0, c0, lengths, seed)
            y, hy = res[0], res[1]
            cy = res[2] if lstm else None
        else:
            with torch.no_grad():
                y, hy, cy, _ = plan.forward(x, w, h0, c0, lengths, seed)

        if packed:
            y = y[: input.data.shape[0]]
            if unsorted_indices is not None:
                hy = hy.index_select(1, unsorted_indices)
                cy = cy.index_select(1, unsorted_indices) if cy is not None else None
            y = PackedSequence(y, batch_sizes, sorted_indices, unsorted_indices)
        elif unbatched:
            y, hy = y.squeeze(1), hy.squeeze(1)
            cy = cy.squeeze(1) if cy is not None else None
        return y, ((hy, cy) if lstm else hy)

    def forward(self, input, hx=None):  # noqa: A002 - nn.LSTM's argument name
        return self._run(input, hx)

    @classmethod
    def from_torch(cls, module):
        """A copy of `module` (an ``nn.LSTM``, ``nn.GRU`` or ``nn.RNN`` as this class): the same
        settings, device and dtype, and a copy of its parameters."""
        base = cls._torch_base
        if not isinstance(module, base):
            raise TypeError(f"{cls.__name__}.from_torch: expected a torch.nn.{base.__name__}, got {type(module).__name__}")
        p = next(module.parameters())
        kw = dict(
            num_layers=module.num_layers,
            bias=module.bias,
            batch_first=module.batch_first,
            dropout=module.dropout,
            bidirectional=module.bidirectional,
            device=p.device,
            dtype=p.dtype,
        )
        if base is nn.LSTM:
            kw["proj_size"] = module.proj_size
        if base is nn.RNN:
            kw["nonlinearity"] = module.nonlinearity
        m = cls(module.input_size, module.hidden_size, **kw)
        with torch.no_grad():
            m.load_state_dict(module.state_dict())
        m.train(module.training)
        return m


class LSTM(_FerroRnnMixin, nn.LSTM):
    """``torch.nn.LSTM`` (constructor, parameters, ``forward(input, (h0, c0)=None)`` ->
    ``output, (h_n, c_n)``) running on ferrodnn; see the module's documentation."""

    _torch_base = nn.LSTM


class GRU(_FerroRnnMixin, nn.GRU):
    """``torch.nn.GRU`` (``forward(input, h0=None)`` -> ``output, h_n``) running on ferrodnn."""

    _torch_base = nn.GRU


class RNN(_FerroRnnMixin, nn.RNN):
    """``torch.nn.RNN`` (``nonlinearity`` "tanh" or "relu"; ``forward(input, h0=None)`` ->
    ``output, h_n``) running on ferrodnn."""

    _torch_base = nn.RNN
