"""The records of a ``patch`` report (issue 36): frozen, typed, and the JSON schema's
source (schemas/generate.py reads :class:`PatchReport`'s fields).

Per pair: both prompts and their tokens, the metric as resolved (its token ids), its value
on the clean and corrupted runs (the two ends of the normalised scale), and one grid per
site: ``raw[l][i]`` the metric with cell (layer l, position or head i) patched and
``normalised[l][i] = (raw - corrupt) / (clean - corrupt)`` (null when the two runs agree).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

#: TransformerLens's names of the sites (what each grid writes).
HOOK_NAMES = {"resid": "blocks.{L}.hook_resid_post", "attn": "blocks.{L}.hook_attn_out",
              "mlp": "blocks.{L}.hook_mlp_out", "head": "blocks.{L}.attn.hook_z"}
MODES = {"denoise": "clean activations written into the corrupted run",
         "noise": "corrupted activations written into the clean run",
         "trace": "clean states restored into the run with noise on the subject's embeddings (causal tracing)"}


@dataclass(frozen=True)
class TopCell:
    """The cell that moves the metric most: the highest normalised value (denoise, trace) or
    the lowest (noise)."""

    layer: int
    index: int
    label: str
    normalised: float | None
    raw: float


@dataclass(frozen=True)
class SiteRecord:
    site: str  # resid | attn | mlp | head
    hook: str  # TransformerLens's name of what is written
    modules: tuple[str, ...]  # the module each layer's patch writes (its output; head: the projection's input)
    axis: str  # position | head
    labels: tuple[str, ...]  # one per column: "3 ' Paris'" or "H2"
    window: int  # causal tracing: layers restored together around each (1: one)
    raw: tuple[tuple[float, ...], ...]
    normalised: tuple[tuple[float | None, ...], ...]
    top: TopCell | None


@dataclass(frozen=True)
class MetricRecord:
    kind: str  # logit-diff | prob | logprob | kl
    text: str  # in words: "logit[' A'] - logit[' B']"
    tokens: tuple[str, ...]  # as given
    token_ids: tuple[int, ...]
    token_names: tuple[str, ...]
    position: int  # the position read (-1: the last token)


@dataclass(frozen=True)
class SubjectRecord:
    """Causal tracing's corruption."""

    text: str
    first: int  # its tokens: first .. end - 1
    end: int
    noise_std: float
    noise: str  # how the std was set
    samples: int
    seed: int


@dataclass(frozen=True)
class PairRecord:
    index: int
    name: str  # pair-N
    clean: str
    corrupt: str | None
    clean_tokens: tuple[str, ...]
    corrupt_tokens: tuple[str, ...] | None
    metric: MetricRecord
    clean_value: float
    corrupt_value: float
    subject: SubjectRecord | None
    sites: tuple[SiteRecord, ...]
    forwards: int  # batched patched forward passes
    cells: int  # patched runs
    files: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return _lists(asdict(self))


@dataclass(frozen=True)
class PatchReport:
    """The ``patch`` report (its schema is generated from these fields)."""

    mode: str  # denoise | noise | trace
    direction: str  # MODES[mode]
    normalisation: str
    model_parts: str  # which modules were found (methods/lm/anatomy.py)
    pairs: tuple[PairRecord, ...]
    count: int

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "direction": self.direction, "normalisation": self.normalisation,
                "model_parts": self.model_parts, "pairs": [p.to_dict() for p in self.pairs], "count": self.count}

    def with_files(self, files: dict[int, dict[str, str]]) -> PatchReport:
        return replace(self, pairs=tuple(replace(p, files=dict(files.get(p.index, p.files))) for p in self.pairs))


NORMALISATION = "(metric - corrupt) / (clean - corrupt): the clean run is 1 and the corrupted run 0 in every mode"


def top_cell(raw: list[list[float]], norm: list[list[float | None]], labels: list[str], lowest: bool
             ) -> TopCell | None:
    cells = [(v, layer, i) for layer, row in enumerate(norm) for i, v in enumerate(row) if v is not None]
    if not cells:
        return None
    v, layer, i = (min if lowest else max)(cells)
    return TopCell(layer, i, labels[i], v, raw[layer][i])


def _lists(obj: Any) -> Any:
    if isinstance(obj, (tuple, list)):
        return [_lists(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _lists(v) for k, v in obj.items()}
    return obj
