"""The records of ``inspect-model grads`` (:mod:`inspect_model.methods.gradients.flow`): per-layer,
per-parameter and per-image gradient statistics, the report, and the mergeable partial a run
accumulates (saved by ``--resume``, gathered under torchrun), with the option checks that
need no model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inspect_model.errors import UsageError
from inspect_model.methods.gradients.checks import Check, ClipReport, parse_fail_on
from inspect_model.methods.gradients.stats import LogHist, merge_stats
from inspect_model.methods.stats import TensorStats

if TYPE_CHECKING:
    import torch

LOSSES = ("cross-entropy", "mse", "sum")


# ----------------------------------------------------------------- records
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
    # per kind ("nan", "inf"): (backward-order position, "output" or "input") of its first one
    first_seen: dict[str, tuple[int, str]] = field(default_factory=dict)


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
    warnings: list[str] = field(default_factory=list)

    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.fail_on and c.failed]


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


@dataclass
class GradPartial:
    """What a run has accumulated over some batches: mergeable across processes
    (:func:`merge_partials`) and saved by ``--resume`` (records, floats and tensors only)."""

    layers: dict[str, LayerGrad] = field(default_factory=dict)
    samples: list[SampleGrad] = field(default_factory=list)
    input_stats: TensorStats | None = None
    out_sq: float = 0.0  # squared norm of the output seeds
    images: int = 0
    seq: int = 0  # gradient observations so far (backward order)
    grads: dict[str, torch.Tensor] = field(default_factory=dict)  # summed parameter gradients (.grad)


def merge_partials(parts: Sequence[GradPartial]) -> GradPartial:
    """The partial of the concatenated runs, in order: what one process running every batch
    of ``parts`` one after the other would hold (parameter gradients summed, statistics
    merged exactly, backward-order positions of later parts shifted past earlier ones)."""
    import dataclasses

    out = GradPartial()
    for part in parts:
        offset = out.seq
        for key, r in part.layers.items():
            have = out.layers.get(key)
            seq = None if r.first_nonfinite_seq is None else r.first_nonfinite_seq + offset
            seen = {k: (q + offset, w) for k, (q, w) in getattr(r, "first_seen", {}).items()}
            if have is None:
                out.layers[key] = dataclasses.replace(r, hist=dataclasses.replace(r.hist, counts=list(r.hist.counts)),
                                                      first_nonfinite_seq=seq, first_seen=seen)
                continue
            for kind, (q, w) in seen.items():
                if kind not in have.first_seen or q < have.first_seen[kind][0]:
                    have.first_seen[kind] = (q, w)
            have.grad_output = merge_stats(have.grad_output, r.grad_output)
            have.grad_input = merge_stats(have.grad_input, r.grad_input)
            have.hist.add(r.hist)
            if seq is not None and (have.first_nonfinite_seq is None or seq < have.first_nonfinite_seq):
                have.first_nonfinite_seq, have.first_nonfinite_where = seq, r.first_nonfinite_where
        out.samples.extend(part.samples)
        out.input_stats = merge_stats(out.input_stats, part.input_stats)
        out.out_sq += part.out_sq
        out.images += part.images
        out.seq += part.seq
        for name, g in part.grads.items():
            have_g = out.grads.get(name)
            out.grads[name] = g.clone() if have_g is None else have_g + g.to(have_g.device)
    return out


