"""The options several commands share, declared once with their check (issue 35).

A shared option is one call here: ``target: ... = target()``, ``output_key: ... =
output_key()``, ``save_raw: bool = save_raw()``, ``colormap: str = colormap("jet")``,
``layers: tuple[str, ...] = layers(help=...)``. Each carries its check (``option(check=...)``),
which :class:`~inspect_model.run.request.Request` runs once for every field that has one,
before the command's own ``validate``. Option groups whose options check each other are
typed values parsed once: :class:`Evaluate` (``--evaluate`` and its ``--metric``,
``--eval-steps``, ``--eval-tolerance``, ``--eval-batch``), :class:`Picture` (``--colormap``,
``--save-raw``) and :class:`Layers` (``--layer``); a request lists the groups it takes in
``groups`` and reads the parsed value as ``request.evaluation`` / ``.picture`` / ``.layer_specs``.
Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from inspect_model.errors import UsageError
from inspect_model.run.request import (
    COLORMAP_HELP, LAYERS_HELP, OUTPUT_KEY_HELP, SAVE_RAW_HELP, TARGET_HELP, check_target_value, option)


# ----------------------------------------------------------------------------- single options
def _check_target(value: Any) -> Any:
    from inspect_model.run.options import check_target_syntax

    value = check_target_value(value)
    check_target_syntax(value)
    return value


def _check_colormap(value: str) -> str:
    from inspect_model.render.overlay import check_colormap

    return check_colormap(value)


def _check_layers(value: tuple[str, ...]) -> tuple[str, ...]:
    if any(not str(spec).strip() for spec in value):
        raise UsageError("empty layer spec; give a name, a glob, type:CLASS or auto")
    return value


def target(default: Any = "predicted", *, help: str = TARGET_HELP) -> Any:
    """``--target/-t``: what is explained (checked at once: value, then syntax)."""
    return option(default, "--target", "-t", type=str, help=help, complete="target", check=_check_target)


def output_key() -> Any:
    """``--output-key``: the output of a tuple/dict-returning model."""
    return option(None, "--output-key", type=str, help=OUTPUT_KEY_HELP)


def save_raw() -> Any:
    """``--save-raw``: raw arrays beside the pictures."""
    return option(False, "--save-raw", help=SAVE_RAW_HELP)


def colormap(default: str) -> Any:
    """``--colormap/--cmap``: the pictures' matplotlib colormap (checked at once)."""
    return option(default, "--colormap", "--cmap", help=COLORMAP_HELP, complete="colormap", check=_check_colormap)


def layers(help: str = LAYERS_HELP, *, param: str | None = None) -> Any:
    """``--layer/-l`` (repeatable): layer specs (an empty one is refused at once)."""
    return option((), "--layer", "--layers", "-l", help=help, multiple=True, param=param, complete="layer",
                  check=_check_layers)


# ----------------------------------------------------------------------------- --evaluate
EVALUATE_HELP = ("Score every map's faithfulness: deletion/insertion AUC, ROAD, average drop/increase in "
                 "confidence (with --boxes: the pointing and energy games); maps ranked per image and on average.")


def evaluate() -> Any:
    return option(False, "--evaluate", help=EVALUATE_HELP)


def metrics() -> Any:
    return option((), "--metric", help="With --evaluate: deletion, insertion, road, confidence or all (the "
                  "default); where --boxes is given also pointing and energy; repeatable.", multiple=True,
                  param="metric")


def eval_steps() -> Any:
    return option(32, "--eval-steps", type=str, help="Steps of the deletion and insertion curves, or auto: each "
                  "curve refined (8, 16, ... 128) until its AUC moves by at most --eval-tolerance.")


def eval_tolerance() -> Any:
    return option(0.005, "--eval-tolerance", help="With --eval-steps auto: the AUC change between two levels at "
                  "which a curve stops.")


def eval_batch() -> Any:
    return option(None, "--eval-batch", type=int, help="Perturbed inputs per forward pass (--evaluate); default "
                  "64, on a CPU at most 4 MiB of input (6 at 224 px).")


@dataclass(frozen=True)
class Evaluate:
    """``--evaluate`` and its options, parsed once: ``metrics`` are the metric names asked
    for ([] without ``--evaluate``), ``steps`` a number or ``"auto"``."""

    enabled: bool
    metrics: tuple[str, ...]
    steps: int | str
    tolerance: float
    batch: int | None

    attr: ClassVar[str] = "evaluation"

    @classmethod
    def parse(cls, request: Any) -> Evaluate:
        from inspect_model.run.evaluate import check_evaluate_request, parse_eval_steps

        steps = parse_eval_steps(request.eval_steps)
        parsed = check_evaluate_request(
            evaluate=request.evaluate, metrics=list(request.metrics) or None, boxes=request.evaluation_boxes(),
            steps=steps, batch=request.eval_batch, tolerance=request.eval_tolerance)
        request._set("eval_steps", steps)
        return cls(bool(request.evaluate), tuple(parsed), steps, request.eval_tolerance, request.eval_batch)

    def evaluator(self, prep: Any, *, boxes: Any = None, output_key: str | None = None, notes: Any = None,
                  progress: Any = None) -> Any:
        """The :class:`~inspect_model.run.evaluate.Evaluator` of these options (None without
        ``--evaluate``): what a session scores its maps with, from the options as parsed here."""
        if not self.enabled:
            return None
        from inspect_model.run.evaluate import Evaluator

        return Evaluator(prep, list(self.metrics), steps=self.steps, batch=self.batch, boxes=boxes,
                         output_key=output_key, notes=notes, progress=progress, tolerance=self.tolerance)


@dataclass(frozen=True)
class Picture:
    """How the pictures are drawn: colormap (checked when declared) and raw arrays."""

    colormap: str
    save_raw: bool

    attr: ClassVar[str] = "picture"

    @classmethod
    def parse(cls, request: Any) -> Picture:
        return cls(request.colormap, bool(request.save_raw))


@dataclass(frozen=True)
class Layers:
    """The ``--layer`` specs, in order (empty: the command's default)."""

    specs: tuple[str, ...]

    attr: ClassVar[str] = "layer_specs"

    @classmethod
    def parse(cls, request: Any) -> Layers:
        return cls(tuple(request.layers))


Group = Callable[[Any], Any]
