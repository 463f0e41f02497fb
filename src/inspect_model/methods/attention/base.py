"""The attention family's base and registry: an attention method is one module under
:mod:`.variants` with one class over :class:`AttentionMethod` (pytorch-grad-cam's one file
per method over ``base_cam.py``), registered by :func:`register` beside its code, in the
shared :class:`~inspect_model.methods.family.Family` registry that CAM and attribution
methods use.

The method's properties live on its class: whether it needs gradients (and whether its
backward pass is the target score's, shared with gradient CAMs, or one of its own), whether
it reads ``--layers`` or folds every attention layer, whether it scores tokens through the
model's head, whether its map is the same for every target, ``all``, aliases, title and
paper. ``--method`` parsing, ``all``, help, completion, the schema's enum, the head-less
check and the report read them. What differs between methods is what they do with each
attention layer the one forward pass brings (:meth:`AttentionMethod.forward`), with each
gradient their backward phase brings (:meth:`~AttentionMethod.backward`), and how they make
their map at the end (:meth:`~AttentionMethod.result`); the passes themselves
(:mod:`.passes`) are shared. CAM-family methods an attention run adds come from
:mod:`inspect_model.methods.cam.base`. Nothing here imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from inspect_model.methods.family import Family

if TYPE_CHECKING:
    import torch
    from torch import nn


class AttentionMethod:
    """One attention method. ``st`` in the hooks is the run's state (:class:`.passes.RunState`:
    ``batch``, ``opts``, ``prefix``, ``tokens``, ``query``, ``windowed``, ``owners``, ``wlayers``,
    ``scratch`` for a method's own running values); ``call`` an ``AttentionCall``
    (``call.probs()`` (B, heads, N, N), ``call.name``, ``call.index``)."""

    name: ClassVar[str]
    title: ClassVar[str]
    paper: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()  # other spellings of --method (lower case)
    order: ClassVar[int] = 100  # place in method lists and reports
    needs_gradients: ClassVar[bool] = False  # a backward pass of the target's score (or per layer)
    score_backward: ClassVar[bool] = False  # its backward pass is the target score's, shared with gradient CAMs
    per_layer: ClassVar[bool] = False  # reads --layers
    all_layers: ClassVar[bool] = False  # folds every attention layer (the capture keeps them all)
    needs_head: ClassVar[bool] = False  # scores each block's tokens through the model's head
    class_independent: ClassVar[bool] = False  # the same map for every target
    in_all: ClassVar[bool] = True  # --method all takes it
    text: ClassVar[bool] = False  # has a form for token models (the text_* hooks; methods/attention/text.py runs them)
    keeps_raw: ClassVar[bool] = False  # its maps are per layer and head, kept as the probabilities (the result's raw)
    default_layers: ClassVar[str] = "all"  # the layers of a per_layer method without --layers

    def forward(self, st: Any, call: Any) -> None:
        """One global attention layer of the forward pass, as it comes."""

    def forward_windowed(self, st: Any, call: Any) -> None:
        """One windowed attention layer (Swin, MaxViT: :mod:`.hierarchical`), as it comes."""

    def backward(self, st: Any, call: Any, grad: torch.Tensor) -> None:
        """d(score)/d(probs) (B, heads, N, N) of one layer, in this method's backward phase."""

    def own_backward(self, model: nn.Module, st: Any, idx: torch.Tensor, xin: torch.Tensor,
                     tokens: list[torch.Tensor]) -> None:
        """The backward pass of a gradient method whose score is not the target's (``score_backward``
        false): ``idx`` (B, 1) the targets, ``tokens`` the chosen blocks' outputs (``needs_head``)."""
        raise NotImplementedError(f"{self.name} has no backward pass of its own")

    def text_forward(self, st: Any, call: Any, probs: torch.Tensor) -> None:
        """One attention layer of a text model's forward pass, ``probs`` (B, heads, L, L); ``st``
        the text run's state (:class:`.text.TextState`)."""

    def text_backward(self, st: Any, call: Any, grad: torch.Tensor) -> None:
        """d(score)/d(probs) (B, heads, L, L) of one layer of a text model, in this method's backward phase."""

    def text_own_backward(self, model: nn.Module, st: Any, idx: torch.Tensor, leaf: torch.Tensor,
                          tokens: list[torch.Tensor], last: torch.Tensor) -> None:
        """A text model's backward pass of a gradient method whose score is not the target's:
        ``leaf`` the input embeddings' output, ``last`` (B,) each text's last real token."""
        raise NotImplementedError(f"{self.name} has no backward pass of its own for text")

    def text_result(self, st: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """A text's map: (per-token values (B, L), or a token-to-token matrix (B, L, L) whose
        query rows become the values); (None, None) for none."""
        return None, None

    def result(self, st: Any, to_grid: Any) -> torch.Tensor | None:
        """The map (B, rows, cols), unnormalised; ``to_grid`` takes (..., N) token rows to
        (..., rows, cols) on the patch grid, the class tokens dropped. None: no map (raw's are
        per layer and head, in the result's ``raw``)."""
        return None


FAMILY: Family[AttentionMethod] = Family("attention method", "inspect_model.methods.attention.variants")
register, unregister, get, methods = FAMILY.register, FAMILY.unregister, FAMILY.get, FAMILY.methods


def names() -> tuple[str, ...]:
    return FAMILY.names()


def known(name: str) -> bool:
    """Whether ``name`` is an attention method (not a CAM method an attention run adds)."""
    return name in methods()


def gradient_names() -> tuple[str, ...]:
    return FAMILY.having("needs_gradients")


def in_all() -> tuple[str, ...]:
    return FAMILY.having("in_all")


def method_help() -> str:
    """``--method``'s help, from the attention and CAM registries."""
    from inspect_model.methods.cam.base import shared_pass_names

    return (f"{', '.join(names())} or all; also CAM methods ({', '.join(shared_pass_names())}) from the same passes, at "
            "--cam-layer; repeat or comma-separate.")


def all_names() -> tuple[str, ...]:
    """Every ``--method`` an attention run takes: its own methods, then the CAM methods it adds."""
    from inspect_model.methods.cam.base import shared_pass_names

    return (*names(), *shared_pass_names())


def map_layer(method: str, layers: tuple[str, ...] | list[str], cam_layer: str | None) -> str | None:
    """The ``layer`` a map's record names: a CAM method's layer; the chosen ``--layers`` joined
    for a method that reads them (LeGrad); else ``all``."""
    if not known(method):
        return cam_layer
    return "+".join(layers) if get(method).per_layer and layers else "all"
