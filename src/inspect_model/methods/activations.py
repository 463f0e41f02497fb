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

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from inspect_model.errors import InputError, ModelLoadError

if TYPE_CHECKING:
    import torch
    from torch import nn

# Elements per chunk when measuring: bounds the temporaries of the hook (a sign() copy, or
# on the NaN/Inf path a float64 copy and masks) to about 1-2 MiB whatever the layer size.
CHUNK_ELEMENTS = 1 << 18

# Layers whose 3-D output is (N, tokens, dim): channels are the last dimension.
_TOKEN_TYPES = ("Linear", "LayerNorm", "Embedding", "MultiheadAttention", "RMSNorm", "MLP",
                "EncoderBlock", "TransformerEncoderLayer", "TransformerDecoderLayer")
# Element-wise layers inherit the channel dim of the layer before them.
_ELEMENTWISE = ("ReLU", "ReLU6", "GELU", "SiLU", "Sigmoid", "Tanh", "LeakyReLU", "ELU", "Hardswish",
                "Hardsigmoid", "Mish", "Dropout", "Identity", "PReLU", "Softplus", "SELU", "CELU",
                "Softmax", "StochasticDepth", "AlphaDropout", "Hardtanh", "LogSoftmax")


# --------------------------------------------------------------------------- moments
@dataclass
class Moments:
    """Mergeable statistics of a set of values; moments over the finite ones."""

    numel: int = 0
    count: int = 0  # finite values
    mean: float = 0.0
    m2: float = 0.0  # sum of squared deviations from the mean (finite values)
    min: float = math.inf
    max: float = -math.inf
    zeros: int = 0
    negatives: int = 0
    nan: int = 0
    inf: int = 0

    def merge(self, o: Moments) -> None:
        """Add the values of ``o`` (Chan, Golub & LeVeque's parallel update)."""
        if o.count:
            n = self.count + o.count
            delta = o.mean - self.mean
            self.mean += delta * o.count / n
            self.m2 += o.m2 + delta * delta * self.count * o.count / n
            self.count = n
        self.numel += o.numel
        self.min = min(self.min, o.min)
        self.max = max(self.max, o.max)
        self.zeros += o.zeros
        self.negatives += o.negatives
        self.nan += o.nan
        self.inf += o.inf

    def stats(self) -> ActivationStats:
        nan = float("nan")
        has = self.count > 0
        return ActivationStats(
            numel=self.numel,
            mean=self.mean if has else nan,
            # Unbiased, as torch.std computes it.
            std=math.sqrt(max(self.m2, 0.0) / (self.count - 1)) if self.count > 1 else (0.0 if has else nan),
            min=self.min if has else nan,
            max=self.max if has else nan,
            zero_fraction=self.zeros / self.numel if self.numel else 0.0,
            negative_fraction=self.negatives / self.numel if self.numel else 0.0,
            nan_count=self.nan,
            inf_count=self.inf,
        )


@dataclass(frozen=True)
class ActivationStats:
    """Statistics of a layer's output: moments over finite values, fractions over all."""

    numel: int
    mean: float
    std: float
    min: float
    max: float
    zero_fraction: float  # exact zeros (dead ReLU units)
    negative_fraction: float
    nan_count: int
    inf_count: int


@dataclass
class Channels:
    """Per-channel sums over the images measured so far (tensors of shape (C,))."""

    dim: int  # channel dimension in the full output (with batch)
    sums: torch.Tensor  # float64 sum of finite values
    counts: torch.Tensor | float  # number of finite values: one number while all are finite
    dead: torch.Tensor  # bool: every value exactly zero, for every image so far

    def merge(self, o: Channels) -> None:
        if o.sums.shape != self.sums.shape:
            return  # a shape change between batches: keep the first
        self.sums += o.sums
        self.counts = self.counts + o.counts
        self.dead &= o.dead

    def means(self) -> list[float]:
        import torch

        counts = self.counts if isinstance(self.counts, torch.Tensor) else \
            torch.full_like(self.sums, float(self.counts))
        means = (self.sums / counts.clamp(min=1.0)).tolist()
        return [m if n > 0 else float("nan") for m, n in zip(means, counts.tolist())]


@dataclass
class Measurement:
    """What the hook keeps of one output tensor (the tensor itself is dropped)."""

    per_sample: bool  # False when dim 0 is not the batch: ``samples`` has one entry
    samples: list[Moments]
    channels: dict[int, Channels]  # by candidate channel dim
    sample_dead: dict[int, list[float]]  # dead-channel fraction of each sample, by dim
    histogram: tuple[float, float, list[float]] | None = None  # (lo, hi, counts)

    def total(self) -> Moments:
        m = Moments()
        for s in self.samples:
            m.merge(s)
        return m


def _reduce_nc(x: torch.Tensor, cdim: int) -> tuple[torch.Tensor, ...]:
    """(N, C) float64 tensors (count, mean, m2, min, max, zeros, negatives, nan, inf) and the
    cell size, of ``x`` with channels along ``cdim``, reduced chunk by chunk over channels.

    The common case (finite float32/float64 values) reads the tensor with reductions that
    allocate nothing of its size: sum, L2 norm (for the sum of squares), amin, amax, and the
    sum of sign() and |sign()| for the zero and negative counts (comparisons would allocate
    a bool mask plus an int64 copy of it). Non-finite values take the exact float64 path.
    """
    import torch

    xm = x.movedim(cdim, 1) if cdim != 1 else x  # a view: no copy
    if xm.ndim == 2:
        xm = xm.unsqueeze(-1)
    n, c = xm.shape[0], xm.shape[1]
    cell = 1
    for d in xm.shape[2:]:
        cell *= int(d)
    dims = tuple(range(2, xm.ndim))
    step = max(1, CHUNK_ELEMENTS // max(1, n * cell))
    parts: list[tuple[torch.Tensor, ...]] = []
    for c0 in range(0, c, step):
        xc = xm.narrow(1, c0, min(step, c - c0))
        if xc.dtype not in (torch.float32, torch.float64):
            xc = xc.to(torch.float64 if not xc.is_floating_point() else torch.float32)  # chunk copy
        part = _reduce_fast(xc, dims, cell)
        if part is None:
            part = _reduce_exact(xc, dims, cell)
        parts.append(part)
    out = tuple(torch.cat([p[i] for p in parts], dim=1) for i in range(9))
    return out + (torch.tensor(float(cell), dtype=torch.float64),)


def _reduce_fast(xc: torch.Tensor, dims: tuple[int, ...], cell: int) -> tuple[torch.Tensor, ...] | None:
    """Moments of a finite chunk without size-of-tensor temporaries but one sign() copy;
    None when a value is not finite (the sums then are not)."""
    import torch

    f64 = torch.float64
    s1 = xc.sum(dims).to(f64)  # (N, c)
    norm = torch.linalg.vector_norm(xc, 2, dims).to(f64)
    if not bool(torch.isfinite(s1).all() and torch.isfinite(norm).all()):
        return None
    mn, mx = xc.amin(dims).to(f64), xc.amax(dims).to(f64)
    mean = s1 / cell
    # M2 = sum(x^2) - n mean^2; a constant cell has exactly 0 (no rounding residue).
    m2 = (norm.square() - cell * mean.square()).clamp_(min=0.0)
    m2 = torch.where(mn == mx, 0.0, m2)
    sg = torch.sign(xc)
    signed = sg.sum(dims).to(f64)  # positives - negatives
    nonzero = sg.abs_().sum(dims).to(f64)  # positives + negatives
    del sg
    cnt = torch.full_like(s1, float(cell))
    zeros = cnt - nonzero
    neg = (nonzero - signed) / 2
    none = torch.zeros_like(s1)
    return (cnt, mean, m2, mn, mx, zeros, neg, none, none)


def _reduce_exact(xc: torch.Tensor, dims: tuple[int, ...], cell: int) -> tuple[torch.Tensor, ...]:
    """Moments of a chunk holding NaN/Inf: a float64 copy, moments over finite values."""
    import torch

    xd = xc.to(torch.float64)
    bshape = (xd.shape[0], -1) + (1,) * len(dims)
    fin = torch.isfinite(xd)
    nan = torch.isnan(xd).sum(dims).to(torch.float64)
    cnt = fin.sum(dims).to(torch.float64)
    inf = float(cell) - cnt - nan
    mean = torch.where(fin, xd, 0.0).sum(dims) / cnt.clamp(min=1.0)
    m2 = torch.where(fin, xd - mean.view(bshape), 0.0).square_().sum(dims)
    mn = torch.where(fin, xd, math.inf).amin(dims)
    mx = torch.where(fin, xd, -math.inf).amax(dims)
    zeros = (xd == 0).sum(dims).to(torch.float64)
    neg = (fin & (xd < 0)).sum(dims).to(torch.float64)  # -inf counts under inf, as in tensor_stats
    return (cnt, mean, m2, mn, mx, zeros, neg, nan, inf)


def _sample_moments(r: tuple[torch.Tensor, ...]) -> list[Moments]:
    """Merge the (N, C) cells of :func:`_reduce_nc` over channels: one :class:`Moments` per
    sample (vectorised Chan update)."""
    import torch

    cnt, mean, m2, mn, mx, zeros, neg, nan, inf, cell = r
    n_s = cnt.sum(1)
    mean_s = (cnt * mean).sum(1) / n_s.clamp(min=1.0)
    m2_s = m2.sum(1) + (cnt * (mean - mean_s[:, None]).square()).sum(1)
    numel = cell * cnt.shape[1]
    rows = torch.stack([n_s, mean_s, m2_s, mn.amin(1), mx.amax(1), zeros.sum(1), neg.sum(1),
                        nan.sum(1), inf.sum(1)], dim=1).cpu().tolist()
    out = []
    for n, mu, v, lo, hi, z, ng, na, nf in rows:
        out.append(Moments(numel=int(numel), count=int(n), mean=mu if n else 0.0, m2=v if n else 0.0,
                           min=lo, max=hi, zeros=int(z), negatives=int(ng), nan=int(na), inf=int(nf)))
    return out


def _channels(r: tuple[torch.Tensor, ...], dim: int) -> tuple[Channels, list[float]]:
    cnt, mean, _m2, _mn, _mx, zeros, *_rest, cell = r
    dead_nc = zeros == cell  # (N, C): every value of the channel exactly zero in that sample
    counts = cnt.sum(0)
    # One number for the counts while every value is finite: report memory is per channel.
    uniform = bool((counts == counts[0]).all()) if counts.numel() else True
    ch = Channels(dim=dim, sums=(cnt * mean).sum(0).cpu(),
                  counts=float(counts[0]) if uniform and counts.numel() else counts.cpu(),
                  dead=dead_nc.all(0).cpu())
    return ch, dead_nc.to(mean.dtype).mean(1).cpu().tolist()


def measure(t: torch.Tensor, batch_size: int | None = None, *, hist_bins: int = 0) -> Measurement:
    """Measure one output tensor: per-sample moments and per-channel sums (module docstring).

    ``batch_size`` tells which leading dimension is the batch; when dim 0 differs, the whole
    tensor counts as one unit (``per_sample=False``).
    """
    import torch

    x = t.detach()
    if x.is_quantized:
        x = x.dequantize()
    if x.is_complex():
        x = x.abs()
    per_sample = batch_size is not None and x.ndim >= 1 and x.shape[0] == batch_size
    # Candidate channel dims, in the coordinates of ``t``; 3-D outputs get both (docstring).
    if per_sample:
        cands = [] if x.ndim <= 1 else ([1, 2] if x.ndim == 3 else [1])
        shift = 0
    else:
        cands = [0] if x.ndim >= 1 else []
        shift = 1
        x = x.unsqueeze(0)  # one unit: the whole tensor
    if x.numel() == 0:
        return Measurement(per_sample, [Moments() for _ in range(x.shape[0])], {}, {})
    channels: dict[int, Channels] = {}
    sample_dead: dict[int, list[float]] = {}
    samples: list[Moments] | None = None
    for cdim in cands or [None]:
        r = _reduce_nc(x.reshape(x.shape[0], 1, -1), 1) if cdim is None else _reduce_nc(x, cdim + shift)
        if samples is None:
            samples = _sample_moments(r)
        if cdim is not None:
            channels[cdim], sample_dead[cdim] = _channels(r, cdim)
    assert samples is not None
    hist = None
    if hist_bins > 0:
        total = Moments()
        for s in samples:
            total.merge(s)
        if total.count:
            flat = x.reshape(-1)
            if total.count != total.numel:
                flat = flat[torch.isfinite(flat)]
            lo, hi = total.min, total.max
            if hi <= lo:
                hi = lo + 1e-6 if lo == 0 else lo + abs(lo) * 1e-6
            counts = torch.histc(flat.float(), bins=hist_bins, min=lo, max=hi)
            hist = (lo, hi, counts.cpu().tolist())
    return Measurement(per_sample, samples, channels, sample_dead, hist)


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


def choose_channel_dim(type_name: str, shape: Sequence[int], per_sample: bool,
                       previous: tuple[tuple[int, ...], int | None] | None) -> int | None:
    """Channel dimension of an output of ``shape`` (see module docstring); ``previous`` is
    the shape and channel dim of the row just before it in the forward pass."""
    if not per_sample:
        return 0 if len(shape) >= 1 else None
    if len(shape) <= 1:
        return None
    if len(shape) != 3:
        return 1
    if type_name.endswith("1d"):
        return 1
    if type_name in _ELEMENTWISE and previous is not None and tuple(previous[0]) == tuple(shape):
        return previous[1]
    return 2


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
        self._batch_size: int | None = None
        self._engine: Any = None

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
        return measure(t, self._batch_size, hist_bins=self.hist_bins)

    def run(self, inputs: Any, names: Sequence[str] | None = None) -> BatchActivations:
        """One forward pass on ``inputs`` (a tensor, or a tuple of positional inputs)."""
        import torch

        from inspect_model.engine.hooks import run_forward

        if self._engine is None:
            raise RuntimeError("ActivationCapture.run() outside its `with` block")
        args = inputs if isinstance(inputs, tuple) else (inputs,)
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        n = int(first.shape[0]) if first is not None and first.ndim else 1
        self._batch_size = n
        names = list(names) if names is not None else [f"input-{self._images + i}" for i in range(n)]
        engine = self._engine
        engine.reset()
        with torch.no_grad():
            run_forward(engine, lambda: self.model(*args))
        records = engine.finalize()
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
        self._images += n
        self._batches += 1
        return BatchActivations(images, kept, hists, start)

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
