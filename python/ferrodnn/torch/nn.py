"""Module wrappers: subclasses of ``torch.nn`` modules (the same constructor, parameters and
``state_dict``) whose ``forward`` calls ferrodnn's ops, and :func:`swap_modules`, which turns a
model's supported modules into them in place.

```python
model = ferrodnn.torch.swap_modules(model)     # nn.Conv2d -> ferrodnn.torch.nn.Conv2d, ...
conv = ferrodnn.torch.nn.Conv2d.from_torch(nn_conv)   # a copy
```
"""

import copy

from torch import nn

from . import _rnn, ops

__all__ = ["Conv2d", "Linear", "LayerNorm", "RMSNorm", "BatchNorm2d", "GroupNorm", "swap_modules"]


class _Wrapper:
    """What the wrappers share: ``from_torch`` (a copy as this class) and the check that decides
    whether a module of the base class is one ferrodnn runs."""

    @classmethod
    def supports(cls, module):
        """None when ``module`` (of the torch base class) runs on ferrodnn, else the reason."""
        return None

    @classmethod
    def from_torch(cls, module):
        """A copy of ``module`` (a ``torch.nn`` module of this class's base class): the same
        settings, device, dtype, parameters and buffers, and training mode."""
        base = cls._torch_base
        if not isinstance(module, base):
            raise TypeError(f"{cls.__name__}.from_torch: expected a torch.nn.{base.__name__}, got {type(module).__name__}")
        reason = cls.supports(module)
        if reason is not None:
            raise ValueError(f"{cls.__name__}.from_torch: {reason}")
        m = copy.deepcopy(module)
        m.__class__ = cls
        return m


def _padding(module):
    """A Conv2d's padding as ints (its "same" padding when symmetric), or the reason it is not
    supported."""
    if module.padding_mode != "zeros":
        return None, f"padding_mode={module.padding_mode!r} is not supported (only 'zeros')"
    if module.padding == "valid":
        return (0, 0), None
    if module.padding == "same":
        total = [d * (k - 1) for d, k in zip(module.dilation, module.kernel_size)]
        if any(t % 2 for t in total):
            return None, "padding='same' with an even (dilated) kernel pads unevenly, which is not supported"
        return tuple(t // 2 for t in total), None
    return tuple(module.padding), None


class Conv2d(_Wrapper, nn.Conv2d):
    """``torch.nn.Conv2d`` running ``ferrodnn.torch.conv2d`` (either memory format; the output
    keeps the input's). ``padding_mode`` other than "zeros" is refused."""

    _torch_base = nn.Conv2d

    @classmethod
    def supports(cls, module):
        return _padding(module)[1]

    def forward(self, input, activation=None, residual=None):
        padding, reason = _padding(self)
        if reason is not None:
            raise ValueError(f"Conv2d: {reason}")
        return ops.conv2d(input, self.weight, self.bias, self.stride, padding, self.dilation, self.groups, activation=activation, residual=residual)


class Linear(_Wrapper, nn.Linear):
    """``torch.nn.Linear`` running ``ferrodnn.torch.linear``."""

    _torch_base = nn.Linear

    def forward(self, input, activation=None):
        return ops.linear(input, self.weight, self.bias, activation=activation)


class LayerNorm(_Wrapper, nn.LayerNorm):
    """``torch.nn.LayerNorm`` running ``ferrodnn.torch.layer_norm`` (``forward(x,
    residual=)`` returns ``(y, x + residual)``)."""

    _torch_base = nn.LayerNorm

    def forward(self, input, residual=None):
        return ops.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps, residual=residual)


class RMSNorm(_Wrapper, nn.RMSNorm):
    """``torch.nn.RMSNorm`` running ``ferrodnn.torch.rms_norm`` (``forward(x, residual=)``
    returns ``(y, x + residual)``)."""

    _torch_base = nn.RMSNorm

    def forward(self, input, residual=None):
        return ops.rms_norm(input, self.normalized_shape, self.weight, self.eps, residual=residual)


class BatchNorm2d(_Wrapper, nn.BatchNorm2d):
    """``torch.nn.BatchNorm2d`` running ``ferrodnn.torch.batch_norm``: the same running
    statistics updates (``momentum=None`` the cumulative average) and ``num_batches_tracked``;
    ``forward(x, activation=, residual=)`` fuses ``activation(bn(x) + residual)`` ("relu",
    "silu")."""

    _torch_base = nn.BatchNorm2d

    def forward(self, input, activation=None, residual=None):
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        training = self.training or (self.running_mean is None and self.running_var is None)
        keep = not self.training or self.track_running_stats
        return ops.batch_norm(
            input,
            self.running_mean if keep else None,
            self.running_var if keep else None,
            self.weight,
            self.bias,
            training,
            factor,
            self.eps,
            activation=activation,
            residual=residual,
        )


class GroupNorm(_Wrapper, nn.GroupNorm):
    """``torch.nn.GroupNorm`` running ``ferrodnn.torch.group_norm`` (``forward(x,
    activation=)`` fuses "relu" or "silu")."""

    _torch_base = nn.GroupNorm

    def forward(self, input, activation=None):
        return ops.group_norm(input, self.num_groups, self.weight, self.bias, self.eps, activation=activation)


_SWAPS = {
    nn.Conv2d: Conv2d,
    nn.Linear: Linear,
    nn.LayerNorm: LayerNorm,
    nn.RMSNorm: RMSNorm,
    nn.BatchNorm2d: BatchNorm2d,
    nn.GroupNorm: GroupNorm,
    nn.LSTM: _rnn.LSTM,
    nn.GRU: _rnn.GRU,
    nn.RNN: _rnn.RNN,
}


def swap_modules(model, skipped=None):
    """Turns every supported module of ``model`` (itself included, recursively) into its
    ferrodnn class in place and returns ``model``. Modules keep their identity, parameters,
    buffers, hooks and ``state_dict`` (an optimizer made before the call still holds the
    parameters); only their ``forward`` changes. Supported: modules whose type is exactly
    ``nn.Conv2d`` (padding_mode "zeros", padding not an uneven "same"), ``nn.Linear``,
    ``nn.LayerNorm``, ``nn.RMSNorm``, ``nn.BatchNorm2d``, ``nn.GroupNorm``, ``nn.LSTM``,
    ``nn.GRU``, ``nn.RNN``; subclasses (which may have a forward of their own) and unsupported
    settings are left as they are. ``skipped``, a list, receives ``(name, reason)`` for each
    module of a supported type that was left."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"swap_modules: expected a torch.nn.Module, got {type(model).__name__}")
    for name, module in model.named_modules():
        cls = _SWAPS.get(type(module))
        if cls is None:
            continue
        reason = cls.supports(module) if isinstance(cls, type) and issubclass(cls, _Wrapper) else None
        if reason is not None:
            if skipped is not None:
                skipped.append((name, reason))
            continue
        module.__class__ = cls
    return model
