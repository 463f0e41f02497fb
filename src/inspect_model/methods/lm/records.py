"""The records of ``lens`` (issue 36): frozen, typed; ``to_dict()`` is the ``--json`` body and
the report's JSON Schema is generated from these types (schemas/generate.py).

Per text (:class:`LensText`), one :class:`LensRow` per site and depth, each a list over the
text's positions; per site and depth over the whole run (:class:`LensDepth`), the means the
KL-by-depth curve and the report's table show.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


def _plain(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, tuple | list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


class _Record:
    def to_dict(self) -> dict[str, Any]:
        return _plain(self)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class LensToken(_Record):
    """A decoded token: the tokenizer's name for it, its id, its probability."""

    token: str
    id: int
    prob: float


@dataclass(frozen=True)
class LensRow(_Record):
    """One site at one depth for one text, per position: ``prob``/``rank`` of the model's own
    prediction at that position (rank 1: the top token), ``entropy`` of the decoded
    distribution and ``kl`` = KL(model || decoded) (nats), ``top``: the top-k tokens."""

    site: str  # resid, attn or mlp
    layer: str  # the module whose output is decoded ("embeddings": block 0's input)
    depth: int  # 0: the embeddings; i: block i-1
    prob: list[float]
    rank: list[int]
    entropy: list[float]
    kl: list[float]
    top: list[list[LensToken]]

    @staticmethod
    def from_dict(d: dict[str, Any]) -> LensRow:
        return LensRow(d["site"], d["layer"], int(d["depth"]), list(d["prob"]), list(d["rank"]), list(d["entropy"]),
                       list(d["kl"]), [[LensToken(t["token"], int(t["id"]), t["prob"]) for t in pos]
                                       for pos in d["top"]])


@dataclass(frozen=True)
class LensText(_Record):
    """One text: its tokens (the decoder's, for an encoder-decoder), the model's prediction at
    each position, and its rows."""

    index: int
    image: str  # the run's name for the text ("text-0"), as every command names its inputs
    text: str
    tokens: list[str]  # the tokens at the decoded positions
    predicted: list[str]  # the model's top token at each position (what position i predicts next)
    rows: list[LensRow]
    files: dict[str, str]

    @staticmethod
    def from_dict(d: dict[str, Any]) -> LensText:
        return LensText(int(d["index"]), d["image"], d["text"], list(d["tokens"]), list(d["predicted"]),
                        [LensRow.from_dict(r) for r in d["rows"]], dict(d.get("files") or {}))


@dataclass(frozen=True)
class LensDepth(_Record):
    """One site at one depth over every position of every text: mean KL(model || decoded),
    mean probability of the model's prediction, how often the decoded top token is the
    model's prediction (``top1``), mean entropy."""

    site: str
    layer: str
    depth: int
    kl: float
    prob: float
    top1: float
    entropy: float
    positions: int


@dataclass(frozen=True)
class LensAnatomy(_Record):
    """Which modules the readout used (methods/lm/anatomy.py), in words and by name."""

    description: str
    blocks: list[str]
    final_norm: str | None
    unembed: str
    hidden_scale: float
    logit_bias: str | None
    logit_scale: float
    softcap: float | None


@dataclass(frozen=True)
class LensReport(_Record):
    """The ``lens`` report body: the readout, the lens (``logit`` or ``tuned`` from
    ``lens_file``), the sites, ``readout_error`` (the largest |readout - model logits| at
    the last block over the run: ~0 when the readout is the model's), the per-depth means and
    the texts."""

    anatomy: LensAnatomy
    lens: str
    lens_file: str | None
    sites: list[str]
    top_k: int
    readout_error: float | None
    layers: list[LensDepth]
    images: list[LensText]


def depth_means(texts: list[LensText]) -> list[LensDepth]:
    """Per (site, depth) over every position of every text (:class:`LensDepth`)."""
    acc: dict[tuple[str, int], list[Any]] = {}
    for t in texts:
        for r in t.rows:
            a = acc.setdefault((r.site, r.depth), [r.layer, 0.0, 0.0, 0, 0.0, 0])
            a[1] += sum(r.kl)
            a[2] += sum(r.prob)
            a[3] += sum(1 for k in r.rank if k == 1)
            a[4] += sum(r.entropy)
            a[5] += len(r.kl)
    order = {"resid": 0, "attn": 1, "mlp": 2}
    out = []
    for (site, depth), (layer, kl, prob, top1, ent, n) in sorted(acc.items(), key=lambda kv: (order.get(kv[0][0], 9),
                                                                                             kv[0][1])):
        m = max(n, 1)
        out.append(LensDepth(site, layer, depth, kl / m, prob / m, top1 / m, ent / m, n))
    return out
