"""Attention maps of vision transformers: raw attention, rollout, gradient rollout and LeGrad
(one module each under :mod:`.variants`, over :mod:`.base`), their options and result.

All four come from one forward pass under :class:`~inspect_model.engine.attention.AttentionCapture`
and at most one backward pass per gradient method (grad-rollout and LeGrad differentiate
different scores, so asking for both takes two over the same forward graph):

- ``raw``: the probabilities of chosen layers and heads (``heads``: ``0,3`` or a fusion
  ``mean|max|min``), read from one query (``query``: ``cls``, a token index, or ``mean`` over
  queries) over the patch keys, on the patch grid;
- ``rollout`` (Abnar & Zuidema, ACL 2020, "Quantifying attention flow"): heads fused
  (mean/max/min), the lowest ``discard_ratio`` of each fused map dropped (vit-explain's
  variant; the class token's own column is kept), Â = (A + I) / 2 with rows renormalised,
  R = Â_L ... Â_1 kept as one running (tokens x tokens) product; the map is the class row;
- ``grad-rollout`` (Chefer, Gur & Wolf, ICCV 2021, "Generic attention-model explainability",
  eq. 5-6): Ā = E_h[(∇A ⊙ A)^+] with ∇ the target logit's gradient, R = R + Ā R from R = I;
  the map is the class row, folded from the output end as the backward pass brings each
  layer (u <- u + u Ā), so no (tokens x tokens) product is formed;
- ``legrad`` (Bousselham et al. 2024, as torch-cam 0.5's ``LeGrad``): for each chosen block l,
  the class score s^l of that block's tokens through the model's head, ∂s^l/∂A^l, its positive
  part averaged over heads and queries; maps averaged over layers. The per-layer gradients come
  from one backward pass: the gradient arriving at each block's output is replaced by ∂s^l/∂x^l,
  so what reaches A^l is ∂s^l/∂A^l exactly.

Maps are (B, rows, cols) on the patch grid, unnormalised; the class ("prefix") tokens are
dropped from the keys. Windowed, hierarchical models (Swin, MaxViT) are handled in
:mod:`.hierarchical` (rollout, grad-rollout on the first stage's map) and LeGrad on their
last stage; CAM-family methods asked for in the same run in :mod:`.cam`.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from inspect_model.errors import LayerSelectionError, UsageError, suggest
from inspect_model.methods.attention import base

if TYPE_CHECKING:
    import torch
    from torch import nn

FUSIONS = ("mean", "max", "min")


def parse_methods(items: Sequence[str] | str | None) -> tuple[str, ...]:
    """``--method`` values (comma lists allowed, ``all``) -> method names in canonical order:
    the attention methods, then CAM-family ones (``gradcam`` ..., ``methods.attention.cam``)."""
    from inspect_model.methods.attention.cam import cam_name, cam_names

    if isinstance(items, str):
        items = [items]
    known, aliases = base.names(), base.FAMILY.aliases()
    names: list[str] = []
    for item in items or ["rollout"]:
        for tok in str(item).split(","):
            tok = tok.strip().lower().replace("_", "-")
            if not tok:
                continue
            if tok == "all":
                names.extend(base.in_all())
            elif tok in known or tok in aliases:
                names.append(aliases.get(tok, tok))
            elif (cam := cam_name(tok)) is not None:
                names.append(cam)
            else:
                raise UsageError(f"--method '{tok}' is not an attention method; choose from "
                                 + ", ".join(known) + f" (and CAM methods: {', '.join(cam_names())})"
                                 + suggest(tok, list(known)))
    return tuple(m for m in (*known, *cam_names()) if m in names)


def _needs(name: str, what: str) -> bool:
    """An attention method's property ``what``; a CAM method's backward pass is the score's."""
    if base.known(name):
        return bool(getattr(base.get(name), what))
    from inspect_model.methods.cam import base as cam_base

    return cam_base.get(name).needs_gradients


def cam_methods(methods: Sequence[str]) -> tuple[str, ...]:
    """The CAM-family names among ``methods``."""
    return tuple(m for m in methods if not base.known(m))


def parse_heads(text: str) -> str | tuple[int, ...]:
    """``--heads``: ``mean|max|min``, ``all``, or a comma list of head indices (checked against
    the model later)."""
    low = str(text).strip().lower()
    if low in FUSIONS or low == "all":
        return low
    try:
        heads = tuple(int(t) for t in low.split(",") if t.strip())
    except ValueError as exc:
        raise UsageError(f"--heads '{text}': give head indices like 0,3, all, or one of mean, max, min") from exc
    if not heads:
        raise UsageError("--heads is empty: give head indices like 0,3, all, or one of mean, max, min")
    return heads


def parse_query(text: str) -> str | int:
    """``--query``: ``cls`` (the first token), ``mean`` (all queries), ``last``, or a token index."""
    low = str(text).strip().lower()
    if low in ("cls", "mean", "last"):
        return low
    try:
        return int(low)
    except ValueError as exc:
        raise UsageError(f"--query '{text}': give cls, mean, last or a token index") from exc


@dataclass(frozen=True)
class AttentionOptions:
    """What to compute; validated once here. The ``attention`` command's option group: its
    request parses it once (:meth:`parse`, as ``request.attention``) and the session reads it."""

    attr: ClassVar[str] = "attention"

    methods: tuple[str, ...] = ("rollout",)
    layers: tuple[str, ...] = ()  # raw/legrad: indices (-1 = last) or module names; () = raw last, legrad all
    heads: str = "mean"
    query: str = "cls"
    head_fusion: str = "mean"
    discard_ratio: float = 0.0
    mosaic: bool = False  # keep every layer's and head's query row (the layer-by-head mosaic)
    cam_layer: str = "auto"  # the layer of the CAM-family methods (methods.attention.cam)

    def __post_init__(self) -> None:
        object.__setattr__(self, "methods", parse_methods(self.methods))
        object.__setattr__(self, "layers", tuple(str(s).strip() for s in self.layers if str(s).strip()))
        parse_heads(self.heads)
        parse_query(self.query)
        if self.head_fusion not in FUSIONS:
            raise UsageError(f"--head-fusion '{self.head_fusion}': choose from {', '.join(FUSIONS)}")
        if not 0.0 <= self.discard_ratio < 1.0:
            raise UsageError(f"--discard-ratio {self.discard_ratio} must be in [0, 1)")

    @classmethod
    def parse(cls, request: Any) -> AttentionOptions:
        """The options of an ``attention`` request (fields of the same names)."""
        given = {f.name: getattr(request, f.name) for f in dataclasses.fields(cls)}
        return cls(**{**given, "methods": given["methods"] or ("rollout",)})

    @property
    def needs_grad(self) -> bool:
        return any(_needs(m, "needs_gradients") for m in self.methods)

    @property
    def score_backward(self) -> bool:
        """A backward pass of the target's score: grad-rollout's, shared by gradient CAMs."""
        return any(_needs(m, "score_backward") for m in self.methods)


@dataclass
class AttentionResult:
    """Maps on the patch grid and what they were computed from."""

    maps: dict[str, torch.Tensor]  # method -> (B, rows, cols), for rollout/grad-rollout/legrad and CAMs
    raw: dict[str, torch.Tensor]  # layer -> (B, heads shown, rows, cols)
    head_labels: dict[str, list[str]]  # layer -> labels of its raw maps' second axis ("head 0", "mean of 12 heads")
    layers: list[str]  # attention layers, in call order
    heads: int
    tokens: int
    prefix: int
    grid: tuple[int, int]
    input_hw: tuple[int, int]
    scores: torch.Tensor | None = None  # (B, classes) when a target was explained
    targets: list[int] | None = None
    passes: dict[str, int] = field(default_factory=dict)
    calls: list[Any] = field(default_factory=list)
    mosaic: torch.Tensor | None = None  # (B, layers, heads, rows, cols) with options.mosaic
    windowed: list[str] = field(default_factory=list)  # raw layers of windowed attention (Swin, MaxViT)
    cam_layer: str | None = None  # the layer of the CAM-family maps
    hierarchical: bool = False  # windowed attention (Swin, MaxViT): rollout on the first stage's map


def select_layers(specs: Sequence[str], names: Sequence[str]) -> list[str]:
    """Attention layers by index (``-1``, ``0``), name, or ``all``."""
    out: list[str] = []
    for spec in specs:
        for tok in spec.split(","):
            tok = tok.strip()
            if tok.lower() == "all":
                out.extend(names)
            elif tok.lstrip("-").isdigit():
                i = int(tok)
                if not -len(names) <= i < len(names):
                    raise LayerSelectionError(f"--layers {i} is out of range: the model has {len(names)} attention "
                                              f"layers (0..{len(names) - 1})")
                out.append(names[i])
            elif tok in names:
                out.append(tok)
            elif tok:
                raise LayerSelectionError(f"--layers '{tok}' is not an attention layer" + (
                    suggest(tok, list(names)) or f"; the attention layers are {names[0]} .. {names[-1]}"))
    return list(dict.fromkeys(out))


def fuse_heads(a: torch.Tensor, how: str) -> torch.Tensor:
    """(B, h, ...) -> (B, ...) by mean, max or min over heads."""
    if how == "mean":
        return a.mean(dim=1)
    return a.amax(dim=1) if how == "max" else a.amin(dim=1)


def query_rows(a: torch.Tensor, query: str | int, prefix: int) -> torch.Tensor:
    """(B, h, Nq, Nk) -> (B, h, Nk): the chosen query's row (``cls`` = token 0)."""
    if query == "mean":
        return a.mean(dim=2)
    i = 0 if query == "cls" else -1 if query == "last" else int(query)
    if not -a.shape[2] <= i < a.shape[2]:
        raise UsageError(f"--query {i} is out of range: the attention has {a.shape[2]} query tokens")
    return a[:, :, i]
