"""The attributions family's base and registry: an attribution method is one module under
:mod:`.variants` with one class over :class:`AttributionMethod` (captum's ``attr/_core/``:
one file per method, its properties on the class), registered by :func:`register`.

Properties: signed or not (``signed``: the colormap, the report), ``smoothable`` (``--smooth``
wraps it in SmoothGrad noise), ``needs_gradients``, ``needs_baseline``, title, paper and
aliases. A method either names how it reads the one shared gradient pass (``gradient_rule``:
``abs`` |g|, ``grad`` g, ``input-x-grad`` x g, ``var`` var g over noise; ``noisy``: over the
noise samples), so that the gradient methods share their backward passes, or runs passes
of its own in :meth:`AttributionMethod.compute`. ``--method`` parsing, ``all``, help,
completion and the schema's enum read the registry. Nothing here imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from inspect_model.methods.family import Family

if TYPE_CHECKING:
    import torch


class AttributionMethod:
    """One attribution method (see the module docstring)."""

    name: ClassVar[str]
    title: ClassVar[str]
    paper: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    order: ClassVar[int] = 100  # place in method lists and reports
    signed: ClassVar[bool] = True  # False: the map is >= 0 everywhere
    smoothable: ClassVar[bool] = False  # --smooth averages it over noisy copies
    needs_gradients: ClassVar[bool] = True
    needs_baseline: ClassVar[bool] = False  # reads --baseline
    gradient_rule: ClassVar[str | None] = None  # from the shared gradient pass: abs | grad | input-x-grad | var
    noisy: ClassVar[bool] = False  # the shared pass over noise samples (SmoothGrad, VarGrad)
    # attributions --generate (issue 36): how a generated token's row is computed; None: not offered.
    # "gradient" (from one backward, by gradient_rule), "integrated" (a path), "occlusion" (one token at a time)
    generation: ClassVar[str | None] = None

    def compute(self, run: Any) -> torch.Tensor:
        """The maps (U, *S) of the batch ``run`` (methods.attributions.maps.Run: ``b`` the
        sweeps' Batch, ``baseline``, ``fx``, ``result``, ``smoothed``), for a method with
        passes of its own."""
        raise NotImplementedError


FAMILY: Family[AttributionMethod] = Family("attribution method", "inspect_model.methods.attributions.variants")
REGISTRY = FAMILY.registry
register, unregister, get, names = FAMILY.register, FAMILY.unregister, FAMILY.get, FAMILY.names
methods = FAMILY.methods


aliases = FAMILY.aliases


def method_help() -> str:
    """``--method``'s help, from the registry."""
    parts = [n + (f" ({m.aliases[0]})" if m.aliases and len(m.aliases[0]) <= 3 else "") for n, m in methods().items()]
    return f"{', '.join(parts)}, or all; repeatable or comma-separated (default: saliency)."
