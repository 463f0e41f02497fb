"""Targets: which output score a gradient or a map is taken of.

``--target predicted`` (the top class of each input), ``--target 281`` or ``--target tabby``
(a class by index or label name), ``--target top:K`` (the K best classes of each input).
Also: reading class names from a file, labelling indices as ``281 tabby``, and picking one
tensor out of a model's tuple/dict output (``--output-key``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inspect_model.errors import InputError, ModelRuntimeError, UsageError, suggest
from inspect_model.loading.parsing import check_depth, read_bounded

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TargetSpec:
    kind: str  # "predicted", "class", "top", "each" (one class per sample)
    index: int | None = None  # for "class"
    k: int = 1  # for "top"
    text: str = "predicted"
    indices: tuple[int, ...] = ()  # for "each": the class of every sample of the run, in order
    # Class names from a labels file, checked against the model's class count once the
    # output is seen (resolve_targets).
    names: Sequence[str] | None = field(default=None, compare=False, repr=False)


def parse_target(text: str | Sequence[str | int] | None, categories: Sequence[str] | None = None, *,
                 option: str = "--target") -> TargetSpec:
    """Parse ``predicted``, ``top:K``, an index or a label name (needs ``categories``), or a
    sequence of indices/names: one class per sample, in the order of the inputs."""
    if isinstance(text, (list, tuple)):
        each = []
        for item in text:
            one = _parse_target(str(item), categories, option)
            if one.kind != "class" or one.index is None:
                raise UsageError(f"target '{item}': a per-sample target holds class indices or names, "
                                 f"not '{one.kind}'")
            each.append(one.index)
        if not each:
            raise UsageError("a per-sample target needs one class per sample; got none")
        spec = TargetSpec("each", indices=tuple(each), text=",".join(str(t) for t in text))
        return replace(spec, names=categories) if getattr(categories, "source", None) else spec
    spec = _parse_target(text, categories, option)
    return replace(spec, names=categories) if getattr(categories, "source", None) else spec


def _parse_target(text: str | None, categories: Sequence[str] | None, option: str = "--target") -> TargetSpec:
    raw = (text or "predicted").strip()
    low = raw.lower()
    if low in ("predicted", "pred", "top", "top:1"):
        return TargetSpec("predicted", text=raw)
    if low.startswith("top:"):
        try:
            k = int(low[4:])
        except ValueError as exc:
            raise UsageError(f"{option} '{raw}': K in top:K must be an integer") from exc
        if k < 1:
            raise UsageError(f"{option} '{raw}': K must be 1 or more")
        return TargetSpec("top", k=k, text=raw)
    aliases = getattr(categories, "aliases", None)  # a task's own spellings: norm, cosine:REF (issue 42)
    if aliases and low in aliases:
        return TargetSpec("class", index=aliases[low], text=raw)
    try:
        index = int(raw)
    except ValueError:
        pass
    else:
        if index < 0:  # Python's -1 would silently mean the last class (issue 13)
            raise UsageError(f"{option} {raw}: class indices start at 0; give 0..N-1, a class name or top:K")
        return TargetSpec("class", index=index, text=raw)
    if categories:
        exact = [i for i, c in enumerate(categories) if c == raw]
        if not exact:
            exact = [i for i, c in enumerate(categories) if c.lower() == low]
        if exact:
            return TargetSpec("class", index=exact[0], text=raw)
        raise InputError(f"{option} '{raw}' is not a class name of this model" + (suggest(raw, list(categories)) or ""))
    raise InputError(
        f"{option} '{raw}' is not an index and the model has no class names; give a class index, or pass "
        "--class-names FILE (one name per line) to use names"
    )


def for_batch(spec: Any, start: int, n: int) -> Any:
    """The part of a per-sample target that belongs to the ``n`` samples from run index
    ``start``; any other target as it is."""
    if not isinstance(spec, TargetSpec) or spec.kind != "each":
        return spec
    part = spec.indices[start:start + n]
    if len(part) != n:
        raise InputError(f"the per-sample target names {len(spec.indices)} class(es) but there are more inputs "
                         f"(input {start + len(part)} has none); give one class per input")
    return replace(spec, indices=part)


def resolve_targets(spec: TargetSpec, scores: torch.Tensor) -> list[list[int]]:
    """Class indices per sample for a (N, K) score tensor; (N,) is one score per sample (a
    binary classifier's logit), class 0."""
    if scores.dim() < 1:
        raise ModelRuntimeError(
            f"the model output has shape {tuple(scores.shape)}; a class target needs (N, classes); "
            "use --output-key to pick another output"
        )
    flat = scores.reshape(scores.shape[0], -1)
    n_classes = flat.shape[1]
    check_label_count(spec.names, n_classes)
    if spec.kind == "class":
        assert spec.index is not None
        if not -n_classes <= spec.index < n_classes:
            raise InputError(
                f"--target {spec.index} is out of range: the model has {n_classes} classes (0..{n_classes - 1})"
            )
        return [[spec.index % n_classes] for _ in range(flat.shape[0])]
    if spec.kind == "each":
        if len(spec.indices) != flat.shape[0]:
            raise InputError(f"the per-sample target names {len(spec.indices)} class(es) for a batch of "
                             f"{flat.shape[0]}; give one class per input")
        bad = [i for i in spec.indices if not 0 <= i < n_classes]
        if bad:
            raise InputError(f"target {bad[0]} is out of range: the model has {n_classes} classes "
                             f"(0..{n_classes - 1})")
        return [[i] for i in spec.indices]
    k = 1 if spec.kind == "predicted" else min(spec.k, n_classes)
    return top_classes(flat, k).tolist()


def top_classes(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` best classes of each row of (N, classes) ``scores``, best first; equal
    scores in class order, lowest index first, as ``argmax`` breaks ties. The one ranking
    of every prediction list and every ``predicted``/``top:K`` target (issue 29: an
    untrained ViT's tied output was listed from class 3 by ``topk`` and explained for 0)."""
    import torch

    return torch.sort(scores.detach().float(), dim=1, descending=True, stable=True).indices[:, :k]


def top_k_warning(spec: Any, n_classes: int) -> str | None:
    """The one warning for ``--target top:K`` with K above the model's class count: the run
    explains every class, K is cut to it (issue 28: top:100000 ran 1000 backward passes
    per image without a word)."""
    if getattr(spec, "kind", None) != "top" or spec.k <= n_classes:
        return None
    return (f"--target {spec.text or f'top:{spec.k}'} asks for {spec.k} classes but the model has {n_classes}: "
            f"explaining all {n_classes} (one backward pass each per image)")


def check_score_batch(y: torch.Tensor, n: int) -> None:
    """An (N,) output is one score per input only when N is the batch: a squeezed (classes,)
    output of one input is refused, not explained as ``classes`` inputs."""
    if y.dim() == 1 and y.shape[0] != n:
        raise ModelRuntimeError(f"the model output has shape {tuple(y.shape)}; expected a batch of {n} "
                                "scores or score rows; use --output-key to pick another output")


def class_probabilities(scores: torch.Tensor) -> torch.Tensor:
    """Probabilities of (N, classes) scores: softmax over the classes, or the sigmoid of a
    single score (a binary classifier's logit; a softmax over one class is always 1)."""
    return scores.sigmoid() if scores.shape[1] == 1 else scores.softmax(dim=1)


def require_float(y: torch.Tensor) -> None:
    """Refuse an output that autograd cannot differentiate (an int64 class index, a bool
    mask), naming that cause rather than a missing dependency (issue 13)."""
    if not y.is_floating_point() and not y.is_complex():
        dtype = str(y.dtype).replace("torch.", "")
        raise ModelRuntimeError(
            f"the model output is {dtype}, not floating point, so it cannot be differentiated; "
            "pick a float output with --output-key"
        )


def check_label_count(categories: Sequence[str] | None, n_classes: int) -> None:
    """A labels file must name every class of the model, no more and no fewer (issue 13)."""
    source = getattr(categories, "source", None)
    if source is not None and categories is not None and len(categories) != n_classes:
        raise InputError(
            f"labels file '{source}' has {len(categories)} names but the model has {n_classes} classes; "
            f"give one name per class ({n_classes} lines)"
        )


class LabelNames(list):  # type: ignore[type-arg]
    """Class names read from a labels file; ``source`` names the file for messages."""

    source: str | None = None


def label(index: int, categories: Sequence[str] | None) -> str:
    """``281 tabby`` when names are known, else ``281``."""
    if categories and 0 <= index < len(categories):
        return f"{index} {categories[index]}"
    return str(index)


MAX_CLASSES = 1_000_000  # class indices in a labels file: ImageNet-21k has 21,841


def load_labels(path: str | Path) -> LabelNames:
    """Class names from a file: one per line, or a JSON list, or a JSON {index: name} map."""
    p = Path(path)
    try:
        text = read_bounded(p, f"labels file '{p}'").decode("utf-8")
    except OSError as exc:
        raise InputError(f"labels file '{p}' cannot be read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"labels file '{p}' is not UTF-8 text") from exc
    stripped = text.strip()
    if stripped.startswith(("[", "{")):
        try:
            data = check_depth(json.loads(stripped), f"labels file '{p}'")
        except RecursionError:
            raise InputError(f"labels file '{p}' nests lists or objects too deeply to read") from None
        except json.JSONDecodeError as exc:
            raise InputError(f"labels file '{p}' is not valid JSON: {exc.msg} (line {exc.lineno})") from exc
        if isinstance(data, list):
            return _named([str(x) for x in data], p)
        if isinstance(data, dict):
            try:
                items = sorted((int(k), str(v)) for k, v in data.items())
            except ValueError as exc:
                raise InputError(f"labels file '{p}': JSON keys must be class indices") from exc
            if items and not (0 <= items[0][0] and items[-1][0] < MAX_CLASSES):
                bad = items[0][0] if items[0][0] < 0 else items[-1][0]
                raise InputError(f"labels file '{p}': class index {bad} is not from 0 to {MAX_CLASSES - 1:,}; "
                                 "keys are class indices")  # a list of that size would be allocated (issue 41)
            out = [""] * (items[-1][0] + 1 if items else 0)
            for i, name in items:
                out[i] = name
            return _named(out, p)
        raise InputError(f"labels file '{p}' must hold a JSON list or object")
    names = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not names:
        raise InputError(f"labels file '{p}' is empty")
    return _named(names, p)


def _named(names: list[str], path: Path) -> LabelNames:
    out = LabelNames(names)
    out.source = str(path)
    return out


def select_output(output: Any, key: str | None) -> torch.Tensor:
    """The tensor to differentiate: the output itself, or ``--output-key NAME|INDEX`` of a
    tuple/list/dict/dataclass output. Without a key, a lone tensor or the first one."""
    import torch

    from inspect_model.engine.hooks import flatten_tensors

    if isinstance(output, torch.Tensor) and (key is None or getattr(output, "_im_task_scores", False)):
        return output  # a task's scores (methods/families/binding.py) already read --output-key
    flat = flatten_tensors(output)
    if not flat:
        raise ModelRuntimeError(f"the model returned no tensor ({type(output).__name__})")
    names = [k for k, _ in flat]
    if key is None:
        # Hugging Face's ModelOutput: `logits`, wherever it sits (a loss may come first).
        # torchvision's segmentation models return {"out": ..., "aux": ...}; InceptionOutputs
        # (logits, aux_logits); the first is the one people mean.
        return flat[names.index("logits")][1] if "logits" in names else flat[0][1]
    if key in names:
        return flat[names.index(key)][1]
    if key.lstrip("-").isdigit():
        i = int(key)
        if -len(flat) <= i < len(flat):
            return flat[i][1]
    raise UsageError(f"--output-key '{key}' is not an output of this model; outputs: {', '.join(names)}")
