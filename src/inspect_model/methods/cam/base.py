"""The CAM family's base and registry: a CAM method is one module under :mod:`.variants`
with one class over :class:`CamMethod` (pytorch-grad-cam's one file per method over
``base_cam.py``), registered by :func:`register` beside its code.

The method's properties live on its class (captum's ``multiplies_by_inputs``): whether it
needs the layer's gradients, whether it comes from the one shared pass, whether ``all``
takes it, whether its map depends on the target class, the tasks it explains, its aliases,
title and paper. ``--method`` parsing, ``all``/``gradients``, help, completion, the schema's
enum, the dense tasks' method check and the report's ``class_independent`` read them, so a
new method is one file and its test. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from inspect_model.methods.family import Family

if TYPE_CHECKING:
    import torch

ALL_TASKS = ("classification", "detection", "segmentation")


@dataclass
class MapInputs:
    """What a method gets for one layer: ``A`` (N, C, h, w); ``grads``, one d(score)/dA
    (N, C, h, w) per target rank (K of them) when the method needs gradients; ``classes``
    (N, K); and two callbacks for the methods that need more than the pass: ``fc_weight()``
    (CAM's classifier weights, UsageError when the network does not end in global pooling +
    one linear layer) and ``masked_scores()`` (Score-CAM's channel weights (N, K, C) from its
    masked forward passes)."""

    A: torch.Tensor
    grads: list[torch.Tensor] | None
    classes: torch.Tensor
    fc_weight: Callable[[], torch.Tensor]
    masked_scores: Callable[[], torch.Tensor]

    @property
    def k(self) -> int:
        return int(self.classes.shape[1])


class CamMethod:
    """One CAM method. Subclasses set the properties and implement :meth:`maps`; those that
    explain detections and segmentation targets (``tasks``) also :meth:`row_map`."""

    name: ClassVar[str]
    title: ClassVar[str]
    paper: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()  # other spellings of --method (after lower-casing, '-'/'_' dropped)
    order: ClassVar[int] = 100  # place in method lists and reports
    needs_gradients: ClassVar[bool] = False  # captured in the one backward pass that stops at the layer
    one_pass: ClassVar[bool] = True  # from the single forward (+ backward) pass; False: passes of its own
    in_all: ClassVar[str] = "no"  # "yes", "if-fits" (skipped with a note where the network does not fit), "no"
    class_independent: ClassVar[bool] = False  # the map is the same for every target class
    needs_classifier: ClassVar[bool] = False  # global pooling + one linear layer at the end (CAM)
    tasks: ClassVar[tuple[str, ...]] = ("classification",)  # what it explains (methods/objectives/tasks.py)

    def maps(self, inp: MapInputs) -> torch.Tensor:
        """Raw maps (K, N, h, w) of one layer, before ReLU and normalisation."""
        raise NotImplementedError

    def row_map(self, A: torch.Tensor, G: torch.Tensor | None) -> torch.Tensor:
        """The raw map (1, h, w) of one detection or mask (A, G (1, C, h, w)); only for the
        methods whose ``tasks`` go beyond classification."""
        raise NotImplementedError(f"{self.name} does not explain {', '.join(ALL_TASKS[1:])}")


class GradientCam(CamMethod):
    """A method of the one gradient pass: a weighting of A by G (:meth:`weigh`)."""

    needs_gradients = True
    in_all = "yes"
    tasks = ALL_TASKS

    def weigh(self, A: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
        """Raw map (N, h, w) from A, G (N, C, h, w); for a clip's (N, C, t, h, w) the same
        formula over (t, h, w) gives (N, t, h, w) (methods/cam/video.py)."""
        raise NotImplementedError

    def maps(self, inp: MapInputs) -> torch.Tensor:
        import torch

        assert inp.grads is not None
        return torch.stack([self.weigh(inp.A, G.to(inp.A.dtype)) for G in inp.grads])

    def row_map(self, A: torch.Tensor, G: torch.Tensor | None) -> torch.Tensor:
        assert G is not None
        return self.weigh(A, G.to(A.dtype))


FAMILY: Family[CamMethod] = Family("CAM method", "inspect_model.methods.cam.variants")
REGISTRY = FAMILY.registry
register, unregister, get, names = FAMILY.register, FAMILY.unregister, FAMILY.get, FAMILY.names
methods = FAMILY.methods


def gradient_names() -> tuple[str, ...]:
    return FAMILY.having("needs_gradients")


def groups() -> dict[str, tuple[str, ...]]:
    """``--method`` names that stand for several methods."""
    return {"all": tuple(n for n, m in methods().items() if m.in_all != "no"), "gradients": gradient_names()}


def aliases() -> dict[str, str]:
    """Other spellings -> method or group name (lower-case, without '-' and '_')."""
    out = {"gradient": "gradients"}
    for n, m in methods().items():
        out.update({a: n for a in m.aliases})
    return out


def shared_pass_names() -> tuple[str, ...]:
    """The methods another command's passes can add (attention): one forward (+ backward)
    pass, no classifier of their own."""
    return tuple(n for n, m in methods().items() if m.one_pass and not m.needs_classifier)


def task_names(task: str) -> tuple[str, ...]:
    """The methods that explain ``task`` (classification, detection, segmentation)."""
    return tuple(n for n, m in methods().items() if task in m.tasks)


def method_help() -> str:
    """``--method``'s help, from the registry."""
    reg = methods()
    fits = [n for n, m in reg.items() if m.in_all == "if-fits"]
    grads = gradient_names()
    return (f"{', '.join(reg)}; all ({' + '.join(fits)} where the net fits it, and "
            f"{', '.join(n for n in groups()['all'] if n not in fits)}: one pass) or gradients "
            f"({', '.join(grads)}); repeatable. Default gradcam.")
