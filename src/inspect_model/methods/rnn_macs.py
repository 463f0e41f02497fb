"""MACs of recurrent layers (RNN, LSTM, GRU), counted from their sizes, the same on every device.

A TorchDispatchMode sees different ops for the same LSTM depending on where it runs: on meta
it decomposes into matrix products the flop counter knows, on the CPU it is one
``mkldnn_rnn_layer`` that torch's flop counter does not cover (0 MACs), on CUDA a cuDNN
kernel. So recurrent modules are counted analytically instead, and the ops they run are not
counted again.

Per time step, layer and direction (the matrix products only, like ``flop_registry``):
``gates * H * (I + H_r)`` with ``gates`` 4 (LSTM), 3 (GRU), 1 (RNN), ``I`` the layer's input
size, ``H_r`` the recurrent input size (``proj_size`` when an LSTM projects, else ``H``),
plus ``H * proj_size`` for the projection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}

# Aten ops whose names say they do matrix arithmetic: when one runs and the counter has no
# formula for it, the row says its MACs are unknown rather than a silent 0.
_COSTLY = ("conv", "mm", "matmul", "linear", "rnn", "lstm", "gru", "attention", "einsum", "bilinear",
           "addbmm", "baddbmm", "tensordot", "fft")


def is_recurrent(module: nn.Module) -> bool:
    from torch import nn

    return isinstance(module, nn.RNNBase) and module.mode in _GATES


def recurrent_macs(module: Any, args: tuple) -> int:
    """MACs of one call ``module(*args)`` of an ``nn.RNNBase`` (tensor or PackedSequence input)."""
    from torch.nn.utils.rnn import PackedSequence

    x = args[0]
    if isinstance(x, PackedSequence):
        steps = int(x.batch_sizes.sum())  # sum over time of the batch still running
    else:
        shape = tuple(int(d) for d in x.shape)
        steps = shape[0] * shape[1] if len(shape) == 3 else shape[0]  # (T, B, I), (B, T, I) or (T, I)
    gates = _GATES[module.mode]
    hidden = int(module.hidden_size)
    proj = int(getattr(module, "proj_size", 0) or 0)
    rec = proj or hidden
    dirs = 2 if module.bidirectional else 1
    total = 0
    for layer in range(int(module.num_layers)):
        in_size = int(module.input_size) if layer == 0 else rec * dirs
        per_step = gates * hidden * (in_size + rec) + (hidden * proj if proj else 0)
        total += per_step * dirs
    return total * steps


def costly_op(name: str) -> bool:
    """Whether an aten op with no MAC formula probably does matrix arithmetic."""
    low = name.lower()
    return any(k in low for k in _COSTLY)
