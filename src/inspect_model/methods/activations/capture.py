"""Activations: what flows out of each selected layer, as statistics streamed in the hook.

Each hooked call's output is measured inside the forward hook (:func:`measure`) and then
dropped, so selecting every layer of a large network costs little more memory than a plain
forward pass; tensors are kept (cloned by the engine) only for the layers to be drawn or
saved. The measurement is split per image (dim 0 of the output, when it is the batch) and
per channel, as mergeable moments (count, mean, M2; Chan et al. 1979), so a run over
several batches gives exactly the statistics of all its images taken together, and each
image's own statistics can be streamed as its batch finishes (``--jsonl``).

Channel dimension: dim 1 for 2-D (N, F), 4-D (N, C, H, W) and 5-D outputs; for 3-D outputs
dim 1 after ``*1d`` layers (Conv1d, BatchNorm1d, ...) and the last dim (N, tokens, dim)
otherwise, and an element-wise layer (ReLU, Dropout, ...) inherits the channel dim of the
layer before it with the same output shape. A channel is *dead* when every value of it is
exactly zero, for every image of the run.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from inspect_model.engine.gc_pause import paused_collection
from inspect_model.errors import InputError, ModelLoadError
from inspect_model.loading.wrappers import unwrap_module
from inspect_model.methods.activations.deferred import defer_on, resolve_records
from inspect_model.methods.activations.fused import relu_after
from inspect_model.methods.activations.measure import (
    ActivationStats,
    Channels,
    Measurement,
    Moments,
    choose_channel_dim,
    measure,
)

if TYPE_CHECKING:
    import torch
    from torch import nn


# --------------------------------------------------------------------------- records
@dataclass(frozen=True)
class LayerActivation:
    """One row of the report: one output tensor of one call of one layer, over the run."""

    key: str  # name, name#i for the i-th call of a reused module, /k for the k-th output
    name: str
    type: str
    call_index: int
    calls: int
    depth: int
    order: int  # position along the forward pass
    output_key: str
    shape: tuple[int, ...]  # the full output shape, first batch
    dtype: str
    per_sample: bool  # dim 0 is the batch
    stats: ActivationStats
    channel_dim: int | None  # None for outputs without a channel axis (scalars, (N,))
    channel_means: tuple[float, ...]
    dead_channels: int
    channels: int
    kept: bool  # the tensor was kept (drawn / saved)

    @property
    def dead_channel_fraction(self) -> float:
        return self.dead_channels / self.channels if self.channels else 0.0


@dataclass(frozen=True)
class ImageLayerStats:
    """One image's statistics for one row."""

    key: str
    stats: ActivationStats
    dead_channel_fraction: float | None


@dataclass
class ImageActivations:
    """One image of a batch: its statistics per row (rows whose dim 0 is the batch)."""

    index: int  # position in the run
    name: str
    layers: list[ImageLayerStats]


@dataclass
class KeptTensor:
    """A kept output (detached clone, on its device) for drawing or saving."""

    key: str
    name: str
    type: str
    tensor: torch.Tensor  # full batch
    channel_dim: int | None
    per_sample: bool


@dataclass
class BatchActivations:
    """What one batch gives: per-image statistics and the kept tensors."""

    images: list[ImageActivations]
    kept: list[KeptTensor]
    histograms: dict[str, tuple[float, float, list[float], int, float, float]]  # lo, hi, counts, n, s1, s2
    start: int  # run index of the first image


@dataclass
class ActivationReport:
    """The run: rows in forward order, the number of images, the layers kept."""

    model: str
    layers: list[LayerActivation]
    images: int
    batches: int
    selected: list[str]
    kept_layers: list[str]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # API: kept, concatenated
    real_tokens: bool = False  # texts: statistics over their real tokens, padding left out (tokens.py)


@dataclass
class _RowAccum:
    key: str
    name: str
    type: str
    call_index: int
    calls: int
    depth: int
    order: int
    output_key: str
    shape: tuple[int, ...]
    dtype: str
    per_sample: bool
    channel_dim: int | None
    moments: Moments
    channels: Channels | None
    kept: bool


class ActivationCapture:
    """Borrow ``model``, hook ``layers``, and measure each batch passed to :meth:`run`.

    >>> with ActivationCapture(model, select_layers(model), keep={"conv1"}) as cap:
    ...     batch = cap.run(x)
    >>> report = cap.report()
    """

    def __init__(self, model: nn.Module, layers: Sequence[str], *, keep: Iterable[str] = (),
                 hist_bins: int = 0, model_name: str | None = None) -> None:
        self.model = model
        self.layers = list(layers)
        self.keep = set(keep)
        self.hist_bins = hist_bins
        self.model_name = model_name or type(model).__name__
        self._rows: dict[str, _RowAccum] = {}
        self._images = 0
        self._batches = 0
        self._base = 0  # run index of the first image (see start)
        self._batch_size: int | None = None
        self._mask: torch.Tensor | None = None
        self._engine: Any = None
        # (weak reference to the tensor, its version, its measurement, the batch size)
        self._last: tuple[Any, int, Measurement, int | None] | None = None
        self._defer = True  # accelerators: numbers read back once a batch (deferred.py)

    def __enter__(self) -> Self:
        from inspect_model.engine.hooks import CaptureOptions, HookEngine

        opts = CaptureOptions(stats_fn=self._measure, keep=self.keep, grad_enabled=False)
        self._engine = HookEngine(self.model, self.layers, opts)
        self._engine.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.__exit__(exc_type, exc, tb)

    def _measure(self, t: torch.Tensor) -> Measurement:
        if self._mask is not None:  # a text batch: its real tokens only (tokens.py)
            from inspect_model.methods.activations.tokens import measure_tokens

            return measure_tokens(t, self._mask, hist_bins=self.hist_bins)
        # The tensor just measured again (issue 40): unchanged (Identity, Dropout in eval
        # mode), its measurement again; after a ReLU in place, the few-pass measurement that
        # starts from it (fused.py). The same object and its version counter tell.
        last, self._last = self._last, None
        version = _version(t)
        after_relu = None
        module = self._engine.current_module if self._engine is not None else None
        if last is not None and last[0]() is t and version is not None and self._batch_size == last[3]:
            if version == last[1]:
                m = last[2]
                self._last = last
                if not isinstance(m, Measurement):
                    return m  # deferred: resolved once, its channels copied there
                return replace(m, channels={k: c.copy() for k, c in m.channels.items()}, bounds=None)
            if version == last[1] + 1 and last[2].bounds is not None and relu_after(module):
                after_relu = last[2].bounds
        defer = self._defer and defer_on(t.device)
        m = measure(t, self._batch_size, hist_bins=self.hist_bins, after_relu=after_relu, defer=defer)
        if version is not None:
            self._last = (weakref.ref(t), version, m, self._batch_size)
        if last is not None and isinstance(last[2], Measurement):
            last[2].bounds = None  # served its ReLU, if any (native.py's tables are not kept)
        return m

    def run(self, inputs: Any, names: Sequence[str] | None = None, *, mask: torch.Tensor | None = None
            ) -> BatchActivations:
        """One forward pass on ``inputs`` (a tensor, or a tuple of positional inputs); ``mask``
        (B, L), a text batch's attention mask: outputs over its tokens are measured at the
        real tokens only, padding left out (tokens.py)."""
        import torch

        if self._engine is None:
            raise RuntimeError("ActivationCapture.run() outside its `with` block")
        args = inputs if isinstance(inputs, tuple) else (inputs,)
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        n = int(first.shape[0]) if first is not None and first.ndim else 1
        self._batch_size = n
        self._mask = mask if mask is not None and mask.dim() == 2 and int(mask.shape[0]) == n else None
        names = list(names) if names is not None else [f"input-{self._images + i}" for i in range(n)]
        engine = self._engine
        engine.reset()
        self._last = None
        with paused_collection():
            self._forward(args)
            records = engine.finalize()
            return self._collect(records, names, n)

    def _collect(self, records: list[Any], names: list[str], n: int) -> BatchActivations:
        """The batch's rows and per-image statistics from the hook records."""
        engine = self._engine
        assert engine is not None
        start = self._images
        images = [ImageActivations(start + i, names[i] if i < len(names) else f"input-{start + i}", [])
                  for i in range(n)]
        kept: list[KeptTensor] = []
        hists: dict[str, tuple[float, float, list[float], int, float, float]] = {}
        prev: tuple[tuple[int, ...], int | None] | None = None
        for rec in records:
            for cap in rec.outputs:
                m = cap.stats
                key = rec.key if (cap.key == "" or len(rec.outputs) == 1) else f"{rec.key}/{cap.key}"
                if not isinstance(m, Measurement):
                    continue
                row = self._rows.get(key)
                shape = tuple(cap.shape)
                if row is None:
                    cdim = choose_channel_dim(rec.module_type, shape, m.per_sample, prev)
                    if cdim is not None and cdim not in m.channels:
                        cdim = None
                    row = _RowAccum(key, rec.name, rec.module_type, rec.call_index, rec.calls_total,
                                    rec.depth, len(self._rows), cap.key, shape, cap.dtype, m.per_sample,
                                    cdim, Moments(), None, cap.tensor is not None)
                    self._rows[key] = row
                prev = (shape, row.channel_dim)
                row.moments.merge(m.total())
                cdim = row.channel_dim
                if cdim is not None and cdim in m.channels:
                    if row.channels is None:
                        row.channels = m.channels[cdim]
                    else:
                        row.channels.merge(m.channels[cdim])
                if m.per_sample and len(m.samples) == n:
                    dead = m.sample_dead.get(cdim) if cdim is not None else None
                    for i, s in enumerate(m.samples):
                        images[i].layers.append(
                            ImageLayerStats(key, s.stats(), dead[i] if dead is not None else None))
                if m.histogram is not None:
                    t = m.total()  # TensorBoard's raw histogram wants num, sum, sum of squares
                    hists[key] = (*m.histogram, t.count, t.mean * t.count, t.m2 + t.count * t.mean ** 2)
                if cap.tensor is not None:
                    kept.append(KeptTensor(key, rec.name, rec.module_type, cap.tensor, row.channel_dim,
                                           m.per_sample))
        engine.reset()  # drop records (and their kept tensors) before the next batch
        self._last = None
        self._images += n
        self._batches += 1
        return BatchActivations(images, kept, hists, start)

    def _forward(self, args: tuple[Any, ...]) -> None:
        """One forward pass under the hooks; a batch whose deferred numbers cannot be finished
        (NaN/Inf, an overflow, a cancelling variance) runs again with numbers read in the
        hook (deferred.py)."""
        import torch

        from inspect_model.engine.hooks import run_forward

        engine = self._engine
        for attempt in (0, 1):
            # Copies: a model may change its input in place (x /= 255); the caller's tensor stays
            # as it was, as in every other command (issue 28). One copy of the input per batch.
            fed = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
            self._defer = attempt == 0
            try:
                with torch.no_grad():
                    run_forward(engine, lambda: self.model(*fed))
            finally:
                self._defer, self._last = True, None
            if resolve_records(engine.records):
                return
            engine.reset()

    # ------------------------------------------------------------------ resumable, mergeable
    def start(self, index: int) -> None:
        """The next image fed has run index ``index`` (a shard or a resumed run starts later)."""
        self._images = self._base = index

    def state_dict(self) -> dict[str, Any]:
        """The per-layer accumulators and counts (our record classes and plain data)."""
        return {"rows": self._rows, "images": self._images, "batches": self._batches,
                "base": self._base}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        images, batches, base = state["images"], state["batches"], state["base"]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (images, batches, base)) \
                or base > images or not isinstance(state["rows"], dict):
            raise ValueError("activation state: counts out of range")
        self._rows, self._images, self._batches, self._base = state["rows"], images, batches, base

    def merge(self, states: list[dict[str, Any]]) -> None:
        """Every part's accumulators, in order, merged exactly (Chan et al.'s moments)."""
        rows: dict[str, _RowAccum] = {}
        for st in states:
            for key, row in st["rows"].items():
                have = rows.get(key)
                if have is None:
                    rows[key] = row
                    continue
                have.moments.merge(row.moments)
                if row.channels is not None:
                    if have.channels is None:
                        have.channels = row.channels
                    else:
                        have.channels.merge(row.channels)
        self._rows = rows
        self._images = sum(st["images"] - st["base"] for st in states)
        self._batches = sum(st["batches"] for st in states)

    def report(self) -> ActivationReport:
        rows = []
        for r in sorted(self._rows.values(), key=lambda r: r.order):
            ch = r.channels
            if ch is not None:
                means = ch.means()
                dead, nch = int(ch.dead.sum()), int(ch.dead.numel())
            else:
                means, dead, nch = [], 0, 0
            rows.append(LayerActivation(
                key=r.key, name=r.name, type=r.type, call_index=r.call_index, calls=r.calls,
                depth=r.depth, order=r.order, output_key=r.output_key, shape=r.shape, dtype=r.dtype,
                per_sample=r.per_sample, stats=r.moments.stats(), channel_dim=r.channel_dim,
                channel_means=tuple(means), dead_channels=dead, channels=nch, kept=r.kept))
        return ActivationReport(self.model_name, rows, self._images, self._batches, list(self.layers),
                                [n for n in self.layers if n in self.keep])


def _version(t: torch.Tensor) -> int | None:
    """``t``'s version counter (bumped by every in-place op); None where it has none
    (inference-mode tensors)."""
    try:
        return int(t._version)
    except RuntimeError:
        return None


# --------------------------------------------------------------------------- API
def capture_activations(
    model: nn.Module,
    inputs: Any,
    *,
    layers: Sequence[str] | None = None,
    depth: int | None = None,
    keep: bool | Sequence[str] = False,
) -> ActivationReport:
    """Statistics of the outputs of ``model``'s layers (every leaf by default) over
    ``inputs``: a tensor (one batch), or a list of tensors (several batches; statistics are
    merged exactly). ``keep`` (True, or layer specs) returns those layers' outputs in
    ``report.tensors``, concatenated over batches. Nothing is printed; the model is given
    back unchanged.
    """
    import torch
    from torch import nn

    from inspect_model.engine.selection import select_layers

    if not isinstance(model, nn.Module):
        raise ModelLoadError(f"capture_activations needs an nn.Module, got {type(model).__name__}")
    model = unwrap_module(model)[0]  # compiled / DataParallel: the module inside (loading/wrappers.py)
    selected = select_layers(model, list(layers) if layers else None, depth=depth)
    if keep is True:
        kept = list(selected)
    elif keep:
        kept = select_layers(model, list(keep), depth=depth)
        selected = sorted(set(selected) | set(kept), key=[n for n, _ in model.named_modules()].index)
    else:
        kept = []
    if isinstance(inputs, (torch.Tensor, tuple)):
        batches: list[Any] = [inputs]
    elif isinstance(inputs, Iterable):
        batches = list(inputs)
    else:
        raise InputError(f"inputs must be a tensor or a list of tensors, got {type(inputs).__name__}")
    if not batches:
        raise InputError("no inputs given; pass a tensor of shape (N, ...)")
    collected: dict[str, list[torch.Tensor]] = {}
    per_sample: dict[str, bool] = {}
    with ActivationCapture(model, selected, keep=kept) as cap:
        for b in batches:
            res = cap.run(b)
            for k in res.kept:
                collected.setdefault(k.key, []).append(k.tensor)
                per_sample[k.key] = per_sample.get(k.key, True) and k.per_sample
        report = cap.report()
    # Outputs batched along dim 0 are concatenated over batches; others stacked, one per batch.
    report.tensors = {
        k: (v[0] if len(v) == 1 else torch.cat(v) if per_sample[k] else torch.stack(v))
        for k, v in collected.items()
    }
    return report
