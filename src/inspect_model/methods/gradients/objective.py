"""The objective that ``inspect-model grads`` differentiates: class labels given as
indices or names (:func:`resolve_label`, :func:`read_labels_file`), a one-line description
of the objective for the report (:func:`describe_objective`), and the gradient of the
objective with respect to the model output for one batch (:func:`output_seed`: a one-hot /
K-hot vector for targets, or the derivative of the per-input loss), with which the model's
graph is walked once by ``y.backward(seed)``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from inspect_model.errors import InputError, ModelRuntimeError, UsageError

if TYPE_CHECKING:
    import torch


def resolve_label(value: int | str, categories: Sequence[str] | None, option: str = "--true-label") -> int:
    from inspect_model.methods.objectives.targets import parse_target

    spec = parse_target(str(value), categories, option=option)
    if spec.kind != "class" or spec.index is None:
        raise UsageError(f"label '{value}' must be a class index or class name, not '{spec.kind}'")
    return spec.index


def read_labels_file(path: str, categories: Sequence[str] | None) -> list[int]:
    """One label per image: a class index or name per line, in the order of the images."""
    from inspect_model.loading.parsing import read_bounded

    try:
        text = read_bounded(path, f"labels file '{path}'").decode("utf-8")
        lines = [ln.strip() for ln in text.splitlines()]
    except OSError as exc:
        raise InputError(f"labels file '{path}' cannot be read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"labels file '{path}' is not UTF-8 text") from exc
    labels = [resolve_label(ln, categories, f"--true-labels ({path})") for ln in lines if ln and not ln.startswith("#")]
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


def _binary_cross_entropy(yd: torch.Tensor, labels: list[int] | None) -> tuple[torch.Tensor, list[list[int]]]:
    """A single score per input is a binary classifier's logit: its cross-entropy is the
    binary one, -[t log s(z) + (1 - t) log(1 - s(z))] with t the label 0 or 1 (a softmax
    over one class is 1 and its cross-entropy 0 whatever the input: no gradient at all)."""
    import torch
    import torch.nn.functional as F

    assert labels is not None
    bad = [lab for lab in labels if lab not in (0, 1)]
    if bad:
        raise InputError(f"label {bad[0]} is out of range: the model gives one score (a binary classifier's "
                         "logit); labels are 0 or 1")
    z = yd.reshape(yd.shape[0], -1)[:, 0]
    z = z if z.dtype in (torch.float32, torch.float64) else z.float()
    target = torch.tensor(labels, dtype=z.dtype, device=z.device)
    return F.binary_cross_entropy_with_logits(z, target, reduction="none"), [[lab] for lab in labels]


def output_seed(
    y: torch.Tensor, *, target: Any, loss: str | None, labels: list[int] | None
) -> tuple[torch.Tensor, list[float], list[list[int]]]:
    """d(objective)/d(y) for one batch, each input's objective term, and the classes used.

    The seed is computed on a detached copy of ``y``, so only the loss is differentiated
    here; the model's graph is then walked once by ``y.backward(seed)``.
    """
    import torch
    import torch.nn.functional as F

    from inspect_model.methods.objectives.targets import resolve_targets

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
        elif loss == "cross-entropy" and y.dim() in (1, 2) and y.reshape(n, -1).shape[1] == 1:
            per_t, used = _binary_cross_entropy(yd, labels)
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
