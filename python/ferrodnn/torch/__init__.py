"""ferrodnn for PyTorch: functional ops registered with ``torch.library`` (eager, autograd,
``torch.compile`` as opaque ops), module wrappers and drop-in recurrent modules.

- :mod:`ferrodnn.torch.ops` (its names also here): ``conv2d``, ``conv3d``, ``linear``,
  ``layer_norm``, ``rms_norm``, ``scaled_dot_product_attention``, ``batch_norm``,
  ``group_norm``, ``softmax``, ``max_pool2d``, ``avg_pool2d``, with fused epilogues (bias,
  activation, residual add) and backward through ferrodnn's backward graphs.
- :mod:`ferrodnn.torch.nn`: ``Conv2d``, ``Linear``, ``LayerNorm``, ``RMSNorm``, ``BatchNorm2d``,
  ``GroupNorm`` (subclasses of the ``torch.nn`` modules, ``from_torch(module)`` copies one), and
  :func:`swap_modules` (``ferrodnn.torch.swap_modules(model)``), which replaces a model's
  supported modules in place.
- :class:`LSTM`, :class:`GRU` and :class:`RNN`, drop-in recurrent modules: subclasses of
  ``torch.nn.LSTM``, ``torch.nn.GRU`` and ``torch.nn.RNN`` (same constructor arguments,
  parameter names, initialization and ``state_dict``) whose ``forward`` runs ferrodnn's ``rnn``
  graph ops, with autograd.

```python
import torch
from ferrodnn.torch import LSTM

m = LSTM(7, 13, num_layers=2, bidirectional=True)         # or LSTM.from_torch(nn_lstm)
x = torch.randn(9, 5, 7, requires_grad=True)
y, (h, c) = m(x)                                           # as nn.LSTM's forward
y.sum().backward()                                         # x.grad and every parameter's grad
```

How a call of a recurrent module runs:

- Tensors on the CPU run on a CPU handle (ferrodnn's CPU engine); tensors on ``cuda:0`` on a
  handle with the CUDA engine, on PyTorch's current stream (ferrodnn's Python handles open GPU 0
  only: other devices are refused). Every buffer (outputs, the reserve, the workspace) is a torch
  tensor on the input's device, from PyTorch's allocator.
- With grad (grad mode on and the input, ``hx`` or a parameter requiring grad) a
  ``torch.autograd.Function`` runs one graph with the ``rnn`` op in training mode, which keeps
  the reserve; its backward runs ``rnn_backward_data`` and (when a parameter needs a grad)
  ``rnn_backward_weights`` in a second graph, giving dx, dhx, dcx and the gradient of the packed
  weight space. Without grad, the inference forward runs (the training one, reserve discarded,
  when dropout between layers is active: module in training mode, ``dropout > 0`` and more than
  one layer; dropout's seed is drawn from PyTorch's default CPU generator, so ``torch.manual_seed``
  repeats it, but the masks are ferrodnn's Philox stream, not PyTorch's).
- The packed weight space is ``torch.cat`` of the parameters' flattened views in the packed
  order (each pseudo-layer's ``weight_ih``, ``weight_hh``, [``weight_hr``], [``bias_ih``,
  ``bias_hh``]): one copy of every weight per call, weight-space bytes read and written (16 MiB
  for one 1024-wide f16 LSTM layer, some microseconds on a GPU). With grad it is part of the
  autograd graph, so the gradient of the weight space comes back to each parameter through
  ``cat``'s backward (views of ``dw``, then PyTorch's accumulation into ``.grad``). Without grad
  it is cached and reused while every parameter keeps its storage and version (an in-place
  update such as an optimizer step rebuilds it).
- Graphs are built once per (layout, sequence length, batch, input features, dtype, device,
  initial states given, training, dropout, whether weight grads are needed) and kept in the module
  (the 32 most recently used); building is the expensive part of a first call.
- A ``PackedSequence`` maps to ferrodnn's packed layout (``seq_major_packed``) with per-sample
  lengths: its data, padded with zero rows to ``max_seq_length * batch`` rows (a copy), is the
  graph's input, and the output's first rows are the output ``PackedSequence``'s data (a view).
  ``hx`` is permuted by ``sorted_indices`` and the final states by ``unsorted_indices``, as
  PyTorch does.
- Unbatched input (``[T, input]`` with 2-D states) is run as a batch of one.

Not supported: TorchScript, ``torch.compile`` tracing through the call (the graph runs as an
opaque function), double backward, CUDA devices other than ``cuda:0``, and tensors of different
devices or dtypes in one call (refused with the tensor named). f16 and bf16 run on the CUDA
engine, which rounds the states (and gate gradients) to the data type as cuDNN does.
"""

from ._common import GRAPH_CACHE_SIZE, clear_graph_cache, graph_cache_info  # noqa: F401
from ._rnn import GRU, LSTM, RNN  # noqa: F401
from . import nn  # noqa: F401,E402
from .nn import swap_modules  # noqa: F401
from .ops import *  # noqa: F401,F403  (the functional ops, ops.__all__)
