"""``compare``: where two models, or one model run two ways, part company, layer by layer.

Side A is the model (``MODEL``, with ``--checkpoint``); side B is another model
(``compare A B``, ``--against-model``), another checkpoint (``--against-checkpoint``), or A
run another way (``--against-dtype``, ``--against-device``, ``--against compiled|export|
torchscript|quantized``, ``--against-train``). Both run once per batch on the same inputs,
and each matched layer's pair of outputs is compared as A produces it, B running ahead within
a byte budget (methods/compare/exchange.py).
``--weights-only`` compares parameters and buffers without inputs. ``--fail-above`` makes
it a CI check (exit 1 naming the first layer past it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from inspect_model.errors import UsageError
from inspect_model.methods.compare.report import CompareReport
from inspect_model.registry import command
from inspect_model.render import compare as render
from inspect_model.run.options import InputOptions, ModelOptions
from inspect_model.run.request import LAYERS_HELP, Request, api_command, one_of, option

WAYS = ("compiled", "export", "torchscript", "quantized")
LOW_DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True)
class CompareRequest(Request):
    """The options of ``compare``; validated once, here."""

    command: ClassVar[str] = "compare"

    against_model: Any = option(None, "--against-model", type=str, help="Side B: another model spec (also the "
                                "second positional argument: compare A B IMAGE...).")
    against_checkpoint: str | None = option(None, "--against-checkpoint", type=str, help="Side B: the model (or B) "
                                            "with this checkpoint (read as --checkpoint is: weights only).")
    against_dtype: str | None = option(None, "--against-dtype", type=str, help="Side B: A cast to float16 or "
                                       "bfloat16 (overflow and underflow are counted).")
    against_device: str | None = option(None, "--against-device", type=str, help="Side B: A on cuda or cuda:N.")
    against: str | None = option(None, "--against", type=str, help="Side B: A through compiled (torch.compile), "
                                 "export (torch.export), torchscript (torch.jit.trace) or quantized (dynamic int8 "
                                 "Linear layers).")
    against_train: bool = option(False, "--against-train", help="Side B: A in train mode (dropout, batch "
                                 "statistics).")
    map: str | None = option(None, "--map", type=str, help="JSON file {\"A's layer\": \"B's layer\"} for layers "
                             "whose names and order differ.")
    layers: tuple[str, ...] = option((), "--layer", "-l", multiple=True, complete="layer", help=LAYERS_HELP)
    tolerance: float = option(1e-3, "--tolerance", type=float, help="A layer is past it when its relative error "
                              "||a-b||/||a|| is over it; an element when |a-b| > tol + tol*|a|.")
    fail_above: float | None = option(None, "--fail-above", type=float, help="Exit 1 naming the first layer whose "
                                      "relative error (or parameter change) is over this (CI).")
    weights_only: bool = option(False, "--weights-only", help="Compare parameters and buffers only: no inputs, no "
                                "forward pass.")

    def validate(self) -> None:
        if self.against_dtype is not None:
            self._set("against_dtype", self.against_dtype.strip().lower().replace("torch.", ""))
            self._set("against_dtype", {"fp16": "float16", "half": "float16", "bf16": "bfloat16"}.get(
                self.against_dtype, self.against_dtype))
            one_of(self.against_dtype, LOW_DTYPES, "--against-dtype")
        if self.against is not None:
            one_of(self.against, WAYS, "--against")
        ways = [f for f, on in (("--against-dtype", self.against_dtype), ("--against-device", self.against_device),
                                ("--against", self.against), ("--against-train", self.against_train)) if on]
        models = [f for f, on in (("a second model", self.against_model is not None),
                                  ("--against-checkpoint", self.against_checkpoint)) if on]
        if len(ways) > 1 or (ways and models):
            raise UsageError(f"compare one thing at a time: {' and '.join(ways + models)} were given")
        if not ways and not models:
            raise UsageError("compare needs side B: a second model (compare A B), --against-checkpoint, "
                             "--against-dtype, --against-device, --against or --against-train")
        if self.weights_only and (self.against or self.against_train or self.against_device):
            raise UsageError("--weights-only compares two models, two checkpoints or a cast (--against-dtype); "
                             f"{ways[0]} changes no weights")
        for flag, v in (("--tolerance", self.tolerance), ("--fail-above", self.fail_above)):
            if v is not None and not v >= 0:
                raise UsageError(f"{flag} must be 0 or more, got {v:g}")

    def resolved(self) -> dict[str, Any]:
        out = super().resolved()
        b = self.against_model
        out["against_model"] = b if b is None or isinstance(b, str) else type(b).__name__
        return out

    def way(self) -> str:
        """What B is, in the report's words."""
        if self.against_dtype:
            return f"dtype:{self.against_dtype}"
        if self.against_device:
            return f"device:{self.against_device}"
        if self.against:
            return self.against
        if self.against_train:
            return "train"
        return "checkpoint" if self.against_checkpoint and self.against_model is None else "model"


@command(
    "compare",
    usage="compare A [B] [IMAGE...]",
    order=85,
    summary=("where two models, or one model run two ways (dtype, device, compile, export, TorchScript, "
             "quantized, train), part company, layer by layer"),
    help=("Run A and B once on the same inputs and compare every matched layer's output as it is produced: "
          "relative error, max abs error, cosine, share beyond --tolerance, overflow/underflow of a reduced "
          "dtype, NaN/Inf origin; the first layer past --tolerance is named. B is a second model (compare A B), "
          "--against-checkpoint, --against-dtype, --against-device, --against or --against-train. "
          "--weights-only compares parameters and buffers. --fail-above exits 1 naming the first layer past it. "
          "Memory: B runs first and holds copies of its layer outputs until A compares them, at most 256 MiB "
          "(or a quarter of the available memory if less); a larger model's B waits for A at that budget."),
    example="inspect-model compare resnet18 --weights none --against-dtype bfloat16 --fail-above 1e-1",
    renderer=render.compare_report,
    tables=render.compare_tables,
    schema="compare.json",
    report=CompareReport,
    labels=False,
    streams=False,
    run=("output_dir", "force", "json_", "quiet"),
    text=True,
    two_models=True,
)
@api_command(CompareRequest)
def compare(model: Any, images: Any, request: CompareRequest, *, model_options: ModelOptions | None = None,
            inputs: InputOptions | None = None, output_dir: Any = None, force: bool = False,
            notes: Any = None) -> Any:
    """Compare ``model`` (A) with side B (the options of :class:`CompareRequest` as keywords:
    ``against_model=`` a spec or an ``nn.Module``, ``against_dtype="float16"``, ...). The
    result's ``first_divergent``, ``layers`` and ``outputs`` are the report's; ``passed`` is
    False past ``fail_above``."""
    from inspect_model.run import compare_run

    mopts = model_options or ModelOptions(model)
    inputs = inputs or InputOptions(images)
    if request.weights_only:
        result = compare_run.weights_only(mopts, inputs, request, notes=notes)
    else:
        result = compare_run.activations(mopts, inputs, request, notes=notes)
    result.session = _Files()
    if output_dir is not None:
        result.save(output_dir, force=force)
    return result


class _Files:
    """What ``Result.save`` draws: the error-along-depth picture."""

    drawer = render.CompareDrawer()


__all__ = ["CompareRequest", "compare"]
