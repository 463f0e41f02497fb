"""The ``patch`` report's records (issue 36); its schema (schemas/patch.json) is generated from them.

Per pair: both prompts and their tokens, the metric as resolved (its token ids), its value
on the clean and corrupted runs (the two ends of the normalised scale), and one grid per
site: ``raw[l][i]`` the metric with cell (layer l, position or head i) patched and
``normalised[l][i] = (raw - corrupt) / (clean - corrupt)`` (null when the two runs agree).
"""

from __future__ import annotations

from typing import Literal

from inspect_model.reports.base import Record, Warning_, fact, record


@record
class PatchTopCell(Record):
    """The cell that moves the metric most: the highest normalised value (denoise, trace) or the lowest (noise)."""

    layer: int = fact(minimum=0)
    index: int = fact(minimum=0, doc="the position (resid, attn, mlp) or the head")
    label: str
    normalised: float | None
    raw: float


@record
class PatchSite(Record):
    site: Literal["resid", "attn", "mlp", "head"]
    hook: str = fact(doc="TransformerLens's name of what is written: blocks.{L}.hook_resid_post, hook_attn_out, "
                     "hook_mlp_out, attn.hook_z")
    modules: list[str] = fact(doc="per layer, the module whose output is written (head: the input of the attention "
                              "output projection, head h's slice)")
    axis: Literal["position", "head"]
    labels: list[str] = fact(doc="one per column: a position and its token, or H<h>")
    window: int = fact(minimum=1, doc="causal tracing: attn/mlp layers restored together around each layer (ROME)")
    raw: list[list[float]] = fact(doc="[layer][column]: the metric of the patched run")
    normalised: list[list[float | None]] = fact(doc="[layer][column]: (raw - corrupt) / (clean - corrupt)")
    top: PatchTopCell | None


@record
class PatchMetric(Record):
    kind: Literal["logit-diff", "prob", "logprob", "kl"]
    text: str = fact(doc="in words: logit[' A'] - logit[' B'], p(' A'), log p(' A'), KL(clean || run)")
    tokens: list[str] = fact(doc="as given (none: prob/logprob of the clean run's top token, or kl)")
    token_ids: list[int]
    token_names: list[str]
    position: int = fact(doc="the token position whose prediction is read (-1: the last)")


@record
class PatchSubject(Record):
    """Causal tracing's corruption: Gaussian noise on the subject's token embeddings."""

    text: str
    first: int = fact(minimum=0, doc="the subject's tokens are first .. end - 1")
    end: int = fact(minimum=1)
    noise_std: float = fact(minimum=0)
    noise: str = fact(doc="how the std was set (k x σ, σ the std of the token embedding matrix, or given)")
    samples: int = fact(minimum=1, doc="noise draws per cell; the metric is their mean")
    seed: int = fact(minimum=0)


@record
class PatchPair(Record):
    index: int = fact(minimum=0)
    name: str
    clean: str
    corrupt: str | None = fact(doc="null when tracing (the corrupted run is the noised clean prompt)")
    clean_tokens: list[str]
    corrupt_tokens: list[str] | None
    metric: PatchMetric
    clean_value: float = fact(doc="the metric of the clean run (normalised 1)")
    corrupt_value: float = fact(doc="the metric of the corrupted run (normalised 0): tracing, the mean over draws")
    subject: PatchSubject | None
    sites: list[PatchSite]
    forwards: int = fact(minimum=0, doc="batched patched forward passes")
    cells: int = fact(minimum=0, doc="patched runs")
    files: dict[str, str] = fact(default={}, doc="site -> its heat map")


@record
class PatchReport(Record):
    """The ``patch`` report's body (the envelope is output/jsonout's)."""

    TITLE = "inspect-model patch report (activation patching, causal tracing)"
    mode: Literal["denoise", "noise", "trace"]
    direction: str
    normalisation: str
    model_parts: str = fact(doc="the modules found (methods/lm/anatomy.py)")
    pairs: list[PatchPair]
    count: int = fact(minimum=0)
    warnings: list[Warning_] = fact(default=[])
