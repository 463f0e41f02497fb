"""The ``lens`` report's records (issue 36); its schema (schemas/lens.json) is generated from them.

Per text (:class:`LensText`), one :class:`LensRow` per site and depth, each a list over the
text's positions; per site and depth over the whole run (:class:`LensDepth`), the means that
the KL-by-depth curve and the report's table show.
"""

from __future__ import annotations

from typing import Any, Literal

from inspect_model.reports.base import Record, Warning_, fact, record


@record
class LensToken(Record):
    """A decoded token: its text (decoded alone), its id, its probability."""

    token: str
    id: int = fact(minimum=0)
    prob: float = fact(minimum=0, maximum=1)


@record
class LensRow(Record):
    """One site at one depth of one text, per position."""

    site: Literal["resid", "attn", "mlp"]
    layer: str = fact(doc="the module whose output is decoded ('embeddings': block 0's input)")
    depth: int = fact(minimum=0, doc="0: the embeddings; i: block i-1")
    prob: list[float] = fact(doc="per position: the probability of the model's own prediction there")
    rank: list[int] = fact(doc="per position: its rank among the decoded tokens (1: the top token)")
    entropy: list[float] = fact(doc="per position: the entropy of the decoded distribution (nats)")
    kl: list[float] = fact(doc="per position: KL(model || decoded) in nats (0 at the model's own readout)")
    top: list[list[LensToken]] = fact(doc="per position: the top-k decoded tokens, most probable first")

    @staticmethod
    def from_dict(d: dict[str, Any]) -> LensRow:
        return LensRow(site=d["site"], layer=d["layer"], depth=int(d["depth"]), prob=list(d["prob"]),
                       rank=list(d["rank"]), entropy=list(d["entropy"]), kl=list(d["kl"]),
                       top=[[LensToken(token=t["token"], id=int(t["id"]), prob=t["prob"]) for t in pos]
                            for pos in d["top"]])


@record
class LensText(Record):
    """One text: the tokens at the decoded positions (an encoder-decoder's: the decoder's),
    the model's prediction at each, and its rows."""

    index: int = fact(minimum=0)
    image: str = fact(doc="the run's name for the text (text-0), as every command names its inputs")
    text: str
    tokens: list[str] = fact(doc="the token at each decoded position, decoded alone")
    predicted: list[str] = fact(doc="the model's top token at each position (what follows it)")
    rows: list[LensRow]
    files: dict[str, str] = fact(default={}, doc="lens_<site> (the layers x positions map) and kl (KL by depth)")

    @staticmethod
    def from_dict(d: dict[str, Any]) -> LensText:
        return LensText(index=int(d["index"]), image=d["image"], text=d["text"], tokens=list(d["tokens"]),
                        predicted=list(d["predicted"]), rows=[LensRow.from_dict(r) for r in d["rows"]],
                        files=dict(d.get("files") or {}))


@record
class LensDepth(Record):
    """One site at one depth over every position of every text."""

    site: Literal["resid", "attn", "mlp"]
    layer: str
    depth: int = fact(minimum=0)
    kl: float = fact(doc="mean KL(model || decoded), nats")
    prob: float = fact(doc="mean probability of the model's prediction")
    top1: float = fact(minimum=0, maximum=1, doc="share of positions whose decoded top token is the model's prediction")
    entropy: float = fact(doc="mean entropy of the decoded distribution, nats")
    positions: int = fact(minimum=0)


@record
class LensAnatomy(Record):
    """Which modules the readout used (methods/lm/anatomy.py), in words and by name."""

    description: str
    blocks: list[str]
    final_norm: str | None = fact(doc="null: the blocks' output goes to the unembedding as it is (BART)")
    unembed: str
    hidden_scale: float = fact(doc="multiplies the final norm's output (T5 with tied embeddings: d_model**-0.5)")
    logit_bias: str | None = fact(doc="a buffer added to the logits (BART's final_logits_bias)")
    logit_scale: float
    softcap: float | None = fact(doc="Gemma 2/3: logits = cap * tanh(logits / cap)")


@record
class LensReport(Record):
    """The ``lens`` report's body (the envelope is output/jsonout's)."""

    TITLE = "inspect-model lens report (logit lens, tuned lens)"
    anatomy: LensAnatomy
    lens: Literal["logit", "tuned"]
    lens_file: str | None
    sites: list[str]
    top_k: int = fact(minimum=1)
    readout_error: float | None = fact(doc="the largest |readout - model logits| at the last block over the run: "
                                       "~0 when the readout found is the model's own")
    layers: list[LensDepth]
    images: list[LensText]
    warnings: list[Warning_] = fact(default=[])
    throughput: dict[str, Any] = fact(optional=True)


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
    for (site, depth), (layer, kl, prob, top1, ent, n) in sorted(acc.items(),
                                                                 key=lambda kv: (order[kv[0][0]], kv[0][1])):
        m = max(n, 1)
        out.append(LensDepth(site=site, layer=layer, depth=depth, kl=kl / m, prob=prob / m, top1=top1 / m,
                             entropy=ent / m, positions=n))
    return out
