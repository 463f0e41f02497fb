"""``models``: the model names this tool loads by name (torchvision's registry, or timm's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from inspect_model.run.session import Result
from inspect_model.run.request import Request, api_command, option
from inspect_model.errors import UsageError
from inspect_model.registry import command
from inspect_model.reports.base import Record, record
from inspect_model.render import results


@dataclass(frozen=True)
class ModelsRequest(Request):
    """The options of ``models`` (its CLI is hand-written: PATTERN is an argument)."""

    command: ClassVar[str] = "models"

    pattern: str | None = option(None, "--pattern", type=str, help="Glob (resnet*) or substring (vit) to filter by.")
    family: str | None = option(None, "--family", type=str, help="classification, detection, segmentation, video, "
                                "optical_flow or quantization.")
    source: str = option("torchvision", "--source", help="torchvision, or timm (NAME.TAG patterns list pretrained "
                         "weights).")

    def validate(self) -> None:
        from inspect_model.loading.sources.torchvision import FAMILIES

        if self.source not in ("torchvision", "timm"):
            raise UsageError(f"--source '{self.source}' is not one of torchvision, timm")
        if self.family is not None and self.family not in FAMILIES:
            raise UsageError(f"--family '{self.family}' is not one of {', '.join(FAMILIES)}")
        if self.source == "timm" and self.family is not None:
            raise UsageError("--family applies to torchvision's models; timm's are listed by PATTERN")


@record
class ModelEntry(Record):
    """One model this tool loads by name."""

    name: str
    family: str  # torchvision's sub-registry (classification, detection, ...), or timm


@record
class ModelsReport(Record):
    """The ``models`` report: the names and their count (its schema is generated from here)."""

    TITLE = "inspect-model models listing"
    models: tuple[ModelEntry, ...]
    count: int


@command(
    "models",
    usage="models [PATTERN]",
    order=20,
    summary="list torchvision's model registry (or timm's)",
    help="List the models this tool can load by name.",
    example="inspect-model models 'resnet*'; inspect-model models --source timm 'convnext*'",
    renderer=results.models_report,
    schema="models.json",
    report=ModelsReport,
    hooks=False,
    images=False,
    streams=False,
)
@api_command(ModelsRequest, images=False)
def models(source_model: Any, request: ModelsRequest) -> Result:
    """The models this tool can load by name: ``im.models("resnet*")``, ``family=``, ``source="timm"``."""
    r = request
    if source_model is not None:  # the first positional argument is the pattern
        r = ModelsRequest(pattern=str(source_model), family=r.family, source=r.source)
    if r.source == "timm":
        from inspect_model.loading.sources.timm import list_timm

        items = list_timm(r.pattern)
    else:
        from inspect_model.loading.sources.torchvision import list_models

        items = [(n, f) for n, f in list_models(r.pattern) if r.family is None or f == r.family]
    report = ModelsReport(models=tuple(ModelEntry(name=n, family=f) for n, f in items), count=len(items))
    return Result("models", r.resolved(), report.to_dict(), [], record=report)
