"""Gradient flow and gradient health: what ``inspect-model grads`` computes.

One objective is differentiated per run: the score of a target class (``predicted``, a
class, or the K best: a one-hot / K-hot vector on the output, as ``output.backward(one_hot)``
does) or a loss (``cross-entropy`` or ``mse`` against labels, or ``sum`` of the output),
always summed over the images of the run. For each selected layer call we report the
gradient with respect to its OUTPUT and with respect to its INPUT (through that layer
only), captured with tensor hooks by :class:`HookEngine`; for each parameter its gradient
statistics; the global norm and what ``clip_grad_norm_`` would do; and four checks (NaN,
Inf, vanishing, exploding) that ``--fail-on`` turns into exit status 1. The model's own
``.grad`` fields are parked by the engine and given back untouched.

Definitions used by the checks (relative, so that the loss scale does not matter):
  * relative norm of a layer = ||dObjective/d(layer output)|| / the largest such norm;
    ``vanishing`` fails when some reached layer's relative norm is below ``vanishing_below``.
  * gain of a layer = ||dObjective/d(layer output)|| / ||dObjective/d(model output)||: how
    much the gradient grew between the output and that layer; ``exploding`` fails when the
    largest gain exceeds ``exploding_above``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inspect_model.errors import InputError, ModelRuntimeError, UsageError
from inspect_model.methods.stats import TensorStats, tensor_stats

if TYPE_CHECKING:
    import torch
    from torch import nn

LOSSES = ("cross-entropy", "mse", "sum")
CHECKS = ("nan", "inf", "vanishing", "exploding")
DEFAULT_VANISHING = 1e-5
DEFAULT_EXPLODING = 1e4
# Histograms of log10|g|: fixed edges so that batches merge exactly; values outside the
# range fall into the end bins, exact zeros are counted apart.
HIST_LO, HIST_HI, HIST_BINS = -12.0, 6.0, 72


# ----------------------------------------------------------------- records
@dataclass
class LogHist:
    """Histogram of log10|g| over the non-zero finite values, plus the zeros."""

    counts: list[int] = field(default_factory=lambda: [0] * HIST_BINS)
    zeros: int = 0
    sum: float = 0.0  # of log10|g|, for TensorBoard's raw histogram
    sum_squares: float = 0.0
    min: float = math.inf
    max: float = -math.inf

    @staticmethod
    def edges() -> list[float]:
        w = (HIST_HI - HIST_LO) / HIST_BINS
        return [HIST_LO + i * w for i in range(HIST_BINS + 1)]

    def add(self, other: LogHist) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts)]
        self.zeros += other.zeros
        self.sum += other.sum
        self.sum_squares += other.sum_squares
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)


def log_hist(g: torch.Tensor) -> LogHist:
    """Histogram of log10|g| (values beyond the range go to the end bins; zeros and
    non-finite values are left out, zeros counted apart). ``sum``/``min``/``max`` are taken
    from the bin centres and edges: one cheap pass per statistic, in the hook."""
    import torch

    a = g.detach().reshape(-1).abs()
    if a.dtype != torch.float32:
        a = a.float()
    zeros = int((a == 0).sum())
    infs = int(torch.isinf(a).sum())
    lg = torch.log10(a).clamp_(HIST_LO, HIST_HI - 1e-6)  # zeros -> first bin, inf -> last; NaN stays NaN
    counts = torch.histc(lg, HIST_BINS, HIST_LO, HIST_HI).long().tolist()  # histc ignores NaN
    counts[0] -= zeros
    counts[-1] -= infs
    h = LogHist(counts=counts, zeros=zeros)
    edges = LogHist.edges()
    used = [i for i, c in enumerate(counts) if c]
    if used:
        centres = [(edges[i] + edges[i + 1]) / 2 for i in range(HIST_BINS)]
        h.sum = sum(c * m for c, m in zip(counts, centres))
        h.sum_squares = sum(c * m * m for c, m in zip(counts, centres))
        h.min, h.max = edges[used[0]], edges[used[-1] + 1]
    return h


@dataclass
class GradObs:
    """What the tensor hook computes for one gradient, where it is (the tensor is dropped)."""

    seq: int  # position in backward order (autograd delivery order), over the whole run
    stats: TensorStats
    hist: LogHist | None  # when histograms are asked for
    sample_norms: list[float] | None  # per input, when dim 0 is the batch


@dataclass
class LayerGrad:
    """Gradient statistics of one call of one layer, over every image of the run."""

    key: str  # "layer" or "layer#i" for the i-th call of a reused module
    name: str
    module_type: str
    call_index: int
    order: int  # forward order
    output_shape: list[int] | None
    grad_output: TensorStats | None  # d(objective)/d(this call's output); None: not reached
    grad_input: TensorStats | None  # d(objective)/d(this call's input), through this layer only
    hist: LogHist = field(default_factory=LogHist)  # of the output gradient
    relative_norm: float | None = None
    gain: float | None = None
    first_nonfinite_seq: int | None = None
    first_nonfinite_where: str | None = None  # "output" or "input"


@dataclass
class ParamGrad:
    name: str
    shape: list[int]
    has_grad: bool  # False: requires grad but no gradient reached it (unused)
    norm: float | None
    mean: float | None
    std: float | None
    max_abs: float | None
    zero_fraction: float | None
    negative_fraction: float | None
    weight_norm: float
    ratio: float | None  # grad norm / weight norm
    nan_count: int = 0
    inf_count: int = 0
    hist: LogHist = field(default_factory=LogHist)


@dataclass
class Check:
    name: str
    status: str  # "pass", "fail", "skip"
    value: float | None
    threshold: float | None
    detail: str
    layers: list[str] = field(default_factory=list)
    fail_on: bool = False  # requested with --fail-on

    @property
    def failed(self) -> bool:
        return self.status == "fail"


@dataclass
class ClipReport:
    """What ``torch.nn.utils.clip_grad_norm_(params, max_norm)`` would do (2-norm)."""

    max_norm: float
    total_norm: float
    clip_coef: float  # max_norm / (total_norm + 1e-6), as torch computes it
    scale: float  # min(1, clip_coef): the factor every gradient would be multiplied by
    clipped: bool
    dominant: list[tuple[str, float]]  # (parameter, share of total squared norm), largest first


@dataclass
class SampleGrad:
    name: str
    targets: list[int]  # classes differentiated (target mode) or the label (losses)
    objective: float  # this input's term of the objective
    input_grad_norm: float  # ||d objective / d input|| (saliency norm)
    layer_grad_norms: dict[str, float]  # ||d objective / d layer output|| for this input


@dataclass
class GradReport:
    objective: str
    images: int
    layers: list[LayerGrad]
    params: list[ParamGrad]
    frozen_params: int
    global_norm: float
    output_grad_norm: float
    input_grad: TensorStats | None
    checks: list[Check]
    clip: ClipReport | None
    first_nonfinite: str | None
    samples: list[SampleGrad] = field(default_factory=list)
    input_grads: list[torch.Tensor] = field(default_factory=list)  # per batch, when kept
    notes: list[str] = field(default_factory=list)

    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.fail_on and c.failed]


# ----------------------------------------------------------------- statistics
def merge_stats(a: TensorStats | None, b: TensorStats | None) -> TensorStats | None:
    """Statistics of the concatenation of two tensors, from their statistics alone."""
    if a is None or b is None:
        return a if b is None else b
    fa, fb = a.numel - a.nan_count - a.inf_count, b.numel - b.nan_count - b.inf_count
    nf, numel = fa + fb, a.numel + b.numel
    nan_count, inf_count = a.nan_count + b.nan_count, a.inf_count + b.inf_count
    if nf == 0:
        nan = float("nan")
        return TensorStats(numel, nan, nan, nan, nan, nan, nan, 0.0, 0.0, nan_count, inf_count)

    def part(s: TensorStats, f: int, attr: str) -> float:
        return getattr(s, attr) * f if f else 0.0

    s1 = part(a, fa, "mean") + part(b, fb, "mean")
    s2 = (a.norm if fa else 0.0) ** 2 + (b.norm if fb else 0.0) ** 2
    mean = s1 / nf
    var = max(s2 / nf - mean * mean, 0.0)
    finite = [s for s, f in ((a, fa), (b, fb)) if f]
    return TensorStats(
        numel=numel, mean=mean, std=math.sqrt(var * nf / (nf - 1)) if nf > 1 else 0.0,
        min=min(s.min for s in finite), max=max(s.max for s in finite),
        abs_mean=(part(a, fa, "abs_mean") + part(b, fb, "abs_mean")) / nf, norm=math.sqrt(s2),
        zero_fraction=(a.zero_fraction * a.numel + b.zero_fraction * b.numel) / numel,
        negative_fraction=(a.negative_fraction * a.numel + b.negative_fraction * b.numel) / numel,
        nan_count=nan_count, inf_count=inf_count,
    )


def max_abs(s: TensorStats | None) -> float | None:
    if s is None or math.isnan(s.min):
        return None
    return max(abs(s.min), abs(s.max))


# ----------------------------------------------------------------- objective
def parse_fail_on(text: str | Sequence[str] | None) -> list[str]:
    items = text.split(",") if isinstance(text, str) else list(text or [])
    out = []
    for raw in items:
        name = raw.strip().lower()
        if not name:
            continue
        if name == "all":
            out.extend(CHECKS)
        elif name in CHECKS:
            out.append(name)
        else:
            raise UsageError(f"--fail-on '{raw.strip()}' is not a check; choose from {','.join(CHECKS)} or all")
    return list(dict.fromkeys(out))


def resolve_label(value: int | str, categories: Sequence[str] | None) -> int:
    from inspect_model.methods.targets import parse_target

    spec = parse_target(str(value), categories)
    if spec.kind != "class" or spec.index is None:
        raise UsageError(f"label '{value}' must be a class index or class name, not '{spec.kind}'")
    return spec.index


def read_labels_file(path: str, categories: Sequence[str] | None) -> list[int]:
    """One label per image: a class index or name per line, in the order of the images."""
    from pathlib import Path

    try:
        lines = [ln.strip() for ln in Path(path).read_text(encoding="utf-8").splitlines()]
    except OSError as exc:
        raise InputError(f"labels file '{path}' cannot be read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"labels file '{path}' is not UTF-8 text") from exc
    labels = [resolve_label(ln, categories) for ln in lines if ln and not ln.startswith("#")]
    if not labels:
        raise InputError(f"labels file '{path}' holds no label; write one class per image, one per line")
    return labels


def describe_objective(target: str | None, loss: str | None) -> str:
    if loss == "cross-entropy":
        return "sum over inputs of cross_entropy(output_i, label_i)"
    if loss == "mse":
        return "sum over inputs of mean((output_i - onehot(label_i))^2) (zeros without labels)"
    if loss == "sum":
        return "sum of every output element"
    return f"sum over inputs of the output score of target '{target or 'predicted'}' (one-hot backward)"


def output_seed(
    y: torch.Tensor, *, target: Any, loss: str | None, labels: list[int] | None
) -> tuple[torch.Tensor, list[float], list[list[int]]]:
    """d(objective)/d(y) for one batch, each input's objective term, and the classes used.

    The seed is computed on a detached copy of ``y``, so only the loss is differentiated
    here; the model's graph is then walked once by ``y.backward(seed)``.
    """
    import torch
    import torch.nn.functional as F

    from inspect_model.methods.targets import resolve_targets

    n = y.shape[0] if y.dim() else 1
    if loss is None:
        idx = resolve_targets(target, y)
        flat = torch.zeros(y.reshape(n, -1).shape, dtype=y.dtype, device=y.device)
        for i, cls in enumerate(idx):
            flat[i, cls] = 1.0
        scores = y.detach().reshape(n, -1)
        per = [float(scores[i, cls].double().sum()) for i, cls in enumerate(idx)]
        return flat.reshape(y.shape), per, idx
    yd = y.detach().requires_grad_(True)
    with torch.enable_grad():
        if loss == "sum":
            per_t = yd.reshape(n, -1).sum(1)
            used: list[list[int]] = [[] for _ in range(n)]
        else:
            if y.dim() != 2:
                raise ModelRuntimeError(
                    f"--loss {loss} needs an output of shape (N, classes), got {tuple(y.shape)}; "
                    "use --output-key or --loss sum"
                )
            n_classes = y.shape[1]
            if labels is not None:
                bad = [lab for lab in labels if not -n_classes <= lab < n_classes]
                if bad:
                    raise InputError(f"label {bad[0]} is out of range: the model has {n_classes} classes "
                                     f"(0..{n_classes - 1})")
            lab_t = None if labels is None else torch.tensor([lab % n_classes for lab in labels], device=y.device)
            used = [[] for _ in range(n)] if lab_t is None else [[int(v)] for v in lab_t]
            # Half precision losses are computed in float32; float64 stays float64.
            yw = yd if yd.dtype in (torch.float32, torch.float64) else yd.float()
            if loss == "cross-entropy":
                assert lab_t is not None
                per_t = F.cross_entropy(yw, lab_t, reduction="none")
            else:
                ref = torch.zeros_like(yw) if lab_t is None else F.one_hot(lab_t, n_classes).to(yw.dtype)
                per_t = ((yw - ref) ** 2).mean(1)
        (seed,) = torch.autograd.grad(per_t.sum(), yd)
    return seed.to(y.dtype), [float(v) for v in per_t.detach().double()], used


# ----------------------------------------------------------------- the run
def validate_request(*, target: str | None, loss: str | None, has_labels: bool, clip_norm: float | None,
                     vanishing_below: float, exploding_above: float,
                     fail_on: str | Sequence[str] | None) -> list[str]:
    """Check option combinations before any work; return the --fail-on check names."""
    if loss is not None and loss not in LOSSES:
        raise UsageError(f"--loss '{loss}' is not one of {', '.join(LOSSES)}")
    if loss is not None and target is not None:
        raise UsageError(f"--target '{target}' and --loss {loss} both say what to differentiate; give one")
    if loss is None and has_labels:
        raise UsageError("--label/--labels-file apply to --loss cross-entropy or mse; add --loss")
    if loss == "cross-entropy" and not has_labels:
        raise UsageError("--loss cross-entropy needs the true class: --label CLASS or --labels-file FILE")
    if clip_norm is not None and not clip_norm > 0:
        raise UsageError(f"--clip-norm must be > 0, got {clip_norm}")
    if not vanishing_below > 0 or not exploding_above > 0:
        raise UsageError("--vanishing-below and --exploding-above must be > 0")
    return parse_fail_on(fail_on)


def gradients(
    model: nn.Module,
    inputs: torch.Tensor | Iterable[Any],
    *,
    layers: Sequence[str] | None = None,
    depth: int | None = None,
    target: str | None = None,
    loss: str | None = None,
    labels: int | str | Sequence[int | str] | None = None,
    output_key: str | None = None,
    categories: Sequence[str] | None = None,
    clip_norm: float | None = None,
    vanishing_below: float = DEFAULT_VANISHING,
    exploding_above: float = DEFAULT_EXPLODING,
    fail_on: str | Sequence[str] | None = None,
    keep_input_grad: bool = False,
    histograms: bool = False,
    on_batch: Callable[[list[SampleGrad]], None] | None = None,
) -> GradReport:
    """Differentiate the objective over ``inputs`` (a tensor, or an iterable of tensors or
    of objects with ``.tensor`` and ``.names``, such as ``InputPlan.batches()``) and report
    layer and parameter gradients and the health checks (see the module docstring).
    Nothing is printed; ``on_batch`` gets each batch's per-input records as it finishes.
    ``histograms`` adds log10|g| histograms per layer and parameter (for plots/TensorBoard)."""
    import torch

    from inspect_model.engine.hooks import CaptureOptions, HookEngine, run_forward
    from inspect_model.engine.selection import select_layers
    from inspect_model.methods.targets import parse_target, select_output

    fail = validate_request(target=target, loss=loss, has_labels=labels is not None, clip_norm=clip_norm,
                            vanishing_below=vanishing_below, exploding_above=exploding_above, fail_on=fail_on)
    spec = parse_target(target, categories) if loss is None else None
    label_list: list[int] | None = None
    label_one: int | None = None
    if isinstance(labels, (list, tuple)):
        label_list = [resolve_label(v, categories) for v in labels]
    elif labels is not None:
        label_one = resolve_label(labels, categories)  # type: ignore[arg-type]

    names = select_layers(model, layers, depth=depth)
    by_name = dict(model.named_modules())
    params_all = [(n, p) for n, p in model.named_parameters()]
    trainable = [(n, p) for n, p in params_all if p.requires_grad]
    if layers:
        prefixes = tuple(f"{n}." for n in names if n)
        listed = [(n, p) for n, p in trainable if n.startswith(prefixes) or "" in names]
    else:
        listed = trainable

    counter = itertools.count()
    batch_n = [0]

    def observe(g: torch.Tensor) -> GradObs:
        n = batch_n[0]
        per = None
        if g.dim() >= 1 and g.shape[0] == n:
            per = torch.linalg.vector_norm(g.detach().reshape(n, -1), dim=1, dtype=torch.float64).tolist()
        return GradObs(next(counter), tensor_stats(g), log_hist(g) if histograms else None, per)

    acc: dict[str, LayerGrad] = {}
    samples: list[SampleGrad] = []
    input_stats: TensorStats | None = None
    input_grads: list[torch.Tensor] = []
    out_sq = 0.0
    images = 0
    label_pos = 0
    opts = CaptureOptions(outputs=True, output_grads=True, input_grads=True, grad_stats_fn=observe,
                          grad_enabled=True)
    with HookEngine(model, names, opts) as eng:
        for item in _iter_batches(inputs):
            x0, batch_names = item
            n = x0.shape[0]
            batch_n[0] = n
            eng.reset()
            x = x0.detach().clone().requires_grad_(x0.is_floating_point())
            out = run_forward(eng, lambda x=x: model(x))
            y = select_output(out, output_key)
            if not y.is_floating_point():
                raise ModelRuntimeError(f"the output to differentiate has dtype {y.dtype}; pick a float output with --output-key")
            if not y.requires_grad:
                raise ModelRuntimeError("the model output does not depend on anything that requires grad "
                                        "(does the model detach or run under torch.no_grad?)")
            if label_list is not None:
                batch_labels: list[int] | None = label_list[label_pos:label_pos + n]
                if len(batch_labels) != n:  # type: ignore[arg-type]
                    raise InputError(f"--labels-file has {len(label_list)} labels but there are more inputs; "
                                     "give one label per image")
            else:
                batch_labels = None if label_one is None else [label_one] * n
            label_pos += n
            seed, per_obj, used = output_seed(y, target=spec, loss=loss, labels=batch_labels)
            out_sq += float(seed.double().pow(2).sum())
            try:
                y.backward(seed)
            except RuntimeError as exc:
                msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ModelRuntimeError(f"backward pass failed: {msg}") from exc
            _merge_batch(acc, eng.finalize(), by_name)
            layer_norms = {r.key: r for r in eng.records}
            if x.grad is not None:
                input_stats = merge_stats(input_stats, tensor_stats(x.grad))
                in_norms = torch.linalg.vector_norm(x.grad.detach().reshape(n, -1), dim=1, dtype=torch.float64).tolist()
                if keep_input_grad:
                    input_grads.append(x.grad.detach().clone())
            else:
                in_norms = [0.0] * n
            batch_samples = []
            for i in range(n):
                per_layer: dict[str, float] = {}
                for key, rec in layer_norms.items():
                    obs = [c.grad_stats for c in rec.outputs if c.grad_stats is not None]
                    vals = [o.sample_norms[i] for o in obs if o.sample_norms is not None]
                    if vals:
                        per_layer[key] = math.sqrt(sum(v * v for v in vals))
                batch_samples.append(SampleGrad(
                    name=batch_names[i] if i < len(batch_names) else f"input-{images + i}",
                    targets=used[i], objective=per_obj[i], input_grad_norm=in_norms[i],
                    layer_grad_norms=per_layer))
            images += n
            samples.extend(batch_samples)
            if on_batch is not None:
                on_batch(batch_samples)
        if images == 0:
            raise InputError("no input to differentiate (every image was skipped?)")
        if label_list is not None and label_pos != len(label_list):
            raise InputError(f"--labels-file has {len(label_list)} labels for {label_pos} inputs; "
                             "give one label per image")
        params = [_param_grad(n, p, histograms) for n, p in listed]
        sq = [float(p.grad.detach().double().pow(2).sum()) for _, p in trainable if p.grad is not None]
        total = math.sqrt(sum(sq))
        shares = [(n, float(p.grad.detach().double().pow(2).sum())) for n, p in trainable if p.grad is not None]
    clip = None
    if clip_norm is not None:
        coef = clip_norm / (total + 1e-6)
        denom = total * total
        dom = sorted(((n, s / denom if denom > 0 else 0.0) for n, s in shares), key=lambda t: -t[1])[:5]
        clip = ClipReport(clip_norm, total, coef, min(1.0, coef), coef < 1.0, dom)
    layer_list = sorted(acc.values(), key=lambda r: r.order)
    out_norm = math.sqrt(out_sq)
    first = _first_nonfinite(layer_list, params)
    checks = _checks(layer_list, params, out_norm, vanishing_below, exploding_above, first)
    for c in checks:
        c.fail_on = c.name in fail
    notes = []
    unreached = [r.key for r in layer_list if r.grad_output is None]
    if unreached:
        notes.append(f"{len(unreached)} layer call(s) not reached by the gradient: {', '.join(unreached[:5])}")
    unused = [p.name for p in params if not p.has_grad]
    if unused:
        notes.append(f"{len(unused)} parameter(s) got no gradient (unused by this objective): {', '.join(unused[:5])}")
    return GradReport(
        objective=describe_objective(target, loss), images=images, layers=layer_list, params=params,
        frozen_params=len(params_all) - len(trainable), global_norm=total, output_grad_norm=out_norm,
        input_grad=input_stats, checks=checks, clip=clip, first_nonfinite=first, samples=samples,
        input_grads=input_grads, notes=notes,
    )


def _iter_batches(inputs: Any) -> Iterable[tuple[torch.Tensor, list[str]]]:
    import torch

    if isinstance(inputs, torch.Tensor):
        inputs = [inputs]
    k = 0
    for item in inputs:
        if isinstance(item, torch.Tensor):
            x, nm = item, [f"input-{k + i}" for i in range(item.shape[0])]
        elif hasattr(item, "tensor"):
            x, nm = item.tensor, list(getattr(item, "names", []))
        else:
            x, nm = item
        if not isinstance(x, torch.Tensor) or x.dim() < 1:
            raise InputError("grads needs a batched input tensor (N, ...)")
        k += x.shape[0]
        yield x, list(nm)


def _merge_batch(acc: dict[str, LayerGrad], records: list[Any], by_name: dict[str, Any]) -> None:
    for r in records:
        rec = acc.get(r.key)
        if rec is None:
            shape = list(r.outputs[0].shape) if len(r.outputs) == 1 else None
            rec = acc[r.key] = LayerGrad(key=r.key, name=r.name, module_type=r.module_type,
                                         call_index=r.call_index, order=r.order, output_shape=shape,
                                         grad_output=None, grad_input=None)
        for where, caps in (("output", r.outputs), ("input", r.inputs)):
            for cap in caps:
                obs: GradObs | None = cap.grad_stats
                if obs is None:
                    continue
                if where == "output":
                    rec.grad_output = merge_stats(rec.grad_output, obs.stats)
                    if obs.hist is not None:
                        rec.hist.add(obs.hist)
                else:
                    rec.grad_input = merge_stats(rec.grad_input, obs.stats)
                if not obs.stats.finite and (rec.first_nonfinite_seq is None or obs.seq < rec.first_nonfinite_seq):
                    rec.first_nonfinite_seq, rec.first_nonfinite_where = obs.seq, where


def _param_grad(name: str, p: torch.Tensor, histograms: bool) -> ParamGrad:
    wn = float(p.detach().double().norm())
    g = p.grad
    if g is None:
        return ParamGrad(name, list(p.shape), False, None, None, None, None, None, None, wn, None)
    s = tensor_stats(g)
    return ParamGrad(
        name=name, shape=list(p.shape), has_grad=True, norm=s.norm, mean=s.mean, std=s.std,
        max_abs=max_abs(s), zero_fraction=s.zero_fraction, negative_fraction=s.negative_fraction,
        weight_norm=wn, ratio=s.norm / wn if wn > 0 else None, nan_count=s.nan_count,
        inf_count=s.inf_count, hist=log_hist(g) if histograms else LogHist(),
    )


def _first_nonfinite(layers: list[LayerGrad], params: list[ParamGrad]) -> str | None:
    hits = [r for r in layers if r.first_nonfinite_seq is not None]
    if hits:
        r = min(hits, key=lambda r: r.first_nonfinite_seq)  # type: ignore[arg-type, return-value]
        return f"{r.key} (gradient wrt its {r.first_nonfinite_where})"
    bad = [p for p in params if p.nan_count or p.inf_count]
    # Parameters only: backward reaches later modules first, so the last one listed.
    return f"parameter {bad[-1].name}" if bad else None


def _checks(layers: list[LayerGrad], params: list[ParamGrad], out_norm: float, vanishing_below: float,
            exploding_above: float, first: str | None) -> list[Check]:
    checks = []
    for kind, attr in (("nan", "nan_count"), ("inf", "inf_count")):
        bad = [f"{r.key}:{w}" for r in layers for w, s in (("output", r.grad_output), ("input", r.grad_input))
               if s is not None and getattr(s, attr)]
        bad += [f"param:{p.name}" for p in params if getattr(p, attr)]
        label = "NaN" if kind == "nan" else "Inf"
        detail = (f"{len(bad)} gradient tensor(s) hold {label}; first in backward order: {first}" if bad
                  else f"no {label} in any gradient")
        checks.append(Check(kind, "fail" if bad else "pass", float(len(bad)), 0.0, detail, bad[:20]))
    reached = [r for r in layers if r.grad_output is not None and math.isfinite(r.grad_output.norm)]
    largest = max((r.grad_output.norm for r in reached), default=0.0)  # type: ignore[union-attr]
    for r in reached:
        assert r.grad_output is not None
        r.relative_norm = r.grad_output.norm / largest if largest > 0 else None
        r.gain = r.grad_output.norm / out_norm if out_norm > 0 else None
    if not reached or largest == 0:
        why = "no selected layer was reached by the gradient" if not reached else "every layer gradient is zero"
        checks.append(Check("vanishing", "skip", None, vanishing_below, why))
        checks.append(Check("exploding", "skip", None, exploding_above, why))
        return checks
    low = min(reached, key=lambda r: r.relative_norm or 0.0)
    vanished = [r.key for r in reached if (r.relative_norm or 0.0) < vanishing_below]
    checks.append(Check(
        "vanishing", "fail" if vanished else "pass", low.relative_norm, vanishing_below,
        f"smallest layer gradient norm / largest = {low.relative_norm:.3g} at '{low.key}'", vanished[:20]))
    if out_norm == 0:
        checks.append(Check("exploding", "skip", None, exploding_above, "the output gradient is zero"))
        return checks
    high = max(reached, key=lambda r: r.gain or 0.0)
    exploded = [r.key for r in reached if (r.gain or 0.0) > exploding_above]
    checks.append(Check(
        "exploding", "fail" if exploded else "pass", high.gain, exploding_above,
        f"largest layer gradient norm / output gradient norm = {high.gain:.3g} at '{high.key}'", exploded[:20]))
    return checks
