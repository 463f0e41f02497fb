"""Metrics of activation patching (issue 36): what one number per run measures, and its
normalisation.

A metric spec is parsed without torch (:func:`parse_metric`); its tokens are resolved to
vocabulary ids with the model's tokenizer (:func:`resolve_metric`, one token each: a
multi-token answer is a usage error naming its token count, never silently its first token);
:func:`compute` reads one value per row of logits (R, vocab) at the metric's position:

- ``logit-diff:A,B``: ``logit[A] - logit[B]``;
- ``prob:T`` / ``logprob:T``: ``softmax(logits)[T]`` / ``log_softmax(logits)[T]``; without
  ``:T``, ``T`` is the clean run's top token;
- ``kl``: ``KL(p_clean || p_run)`` (natural log), 0 for the clean run itself.

Normalised: ``(m - m_corrupt) / (m_clean - m_corrupt)``, so that the clean run is 1 and the
corrupted run 0 in both directions (``--denoise``: a patched corrupted run that recovers the
clean behaviour nears 1; ``--noise``: an unpatched clean run is 1 and a patch that breaks it
falls towards 0). With ``m_clean == m_corrupt`` the normalised values are undefined (null).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inspect_model.errors import UsageError

if TYPE_CHECKING:
    import torch

KINDS = ("logit-diff", "prob", "logprob", "kl")


@dataclass(frozen=True)
class MetricSpec:
    """A metric as typed: its kind and the token texts it names (resolved later)."""

    kind: str
    tokens: tuple[str, ...] = ()

    def describe(self) -> str:
        return self.kind + (":" + ",".join(repr(t) for t in self.tokens) if self.tokens else "")


def parse_metric(text: str, flag: str = "--metric") -> MetricSpec:
    """``logit-diff:A,B``, ``prob[:T]``, ``logprob[:T]`` or ``kl`` (the module docstring)."""
    kind, sep, rest = str(text).partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise UsageError(f"{flag} '{text}' is not one of logit-diff:A,B, prob[:TOKEN], logprob[:TOKEN], kl")
    if kind == "kl":
        if sep:
            raise UsageError(f"{flag} kl takes no tokens (it compares with the clean run's distribution)")
        return MetricSpec("kl")
    if kind == "logit-diff":
        parts = rest.split(",") if sep else []
        if len(parts) != 2 or not all(p.strip() for p in parts):
            raise UsageError(f"{flag} logit-diff needs two tokens: logit-diff:' A',' B' (got '{text}')")
        return MetricSpec(kind, (parts[0], parts[1]))
    if sep and not rest.strip():
        raise UsageError(f"{flag} {kind}: names no token; give {kind}:TOKEN, or {kind} for the clean run's top token")
    return MetricSpec(kind, (rest,) if sep else ())


@dataclass(frozen=True)
class Metric:
    """A metric with its token ids resolved (``ids``) and, for ``prob``/``logprob`` without a
    token, the clean run's top token filled in later (:meth:`with_clean`)."""

    spec: MetricSpec
    ids: tuple[int, ...]
    names: tuple[str, ...]

    @property
    def kind(self) -> str:
        return self.spec.kind

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "tokens": list(self.spec.tokens), "token_ids": list(self.ids),
                "token_names": list(self.names), "text": self.words()}

    def words(self) -> str:
        n = [repr(x) for x in self.names]
        return {"logit-diff": lambda: f"logit[{n[0]}] - logit[{n[1]}]",
                "prob": lambda: f"p({n[0]})", "logprob": lambda: f"log p({n[0]})",
                "kl": lambda: "KL(clean || run)"}[self.kind]()


def resolve_metric(spec: MetricSpec, tokenizer: Any, flag: str = "--metric") -> Metric:
    """The spec's token texts as one vocabulary id each (a usage error names a text that is
    several tokens or none)."""
    from inspect_model.methods.families.language import one_token

    ids = tuple(one_token(tokenizer, t, f"{flag} {spec.kind}: token") for t in spec.tokens)
    return Metric(spec, ids, tuple(_token_name(tokenizer, i) for i in ids))


def with_clean(metric: Metric, clean_logits: torch.Tensor, tokenizer: Any) -> Metric:
    """``prob``/``logprob`` without a token: the clean run's top token (``clean_logits`` (vocab,))."""
    if metric.kind in ("prob", "logprob") and not metric.ids:
        top = int(clean_logits.argmax())
        return Metric(metric.spec, (top,), (_token_name(tokenizer, top),))
    return metric


def _token_name(tokenizer: Any, i: int) -> str:
    if tokenizer is None:
        return f"<id {i}>"
    try:
        return str(tokenizer.decode([i]))
    except Exception:  # a tokenizer that cannot decode one id: its vocabulary name
        return str(tokenizer.convert_ids_to_tokens(i))


def compute(metric: Metric, logits: torch.Tensor, clean_logits: torch.Tensor | None = None) -> torch.Tensor:
    """One value per row of ``logits`` (R, vocab), in float64; ``clean_logits`` (vocab,) for kl."""
    import torch

    x = logits.double()
    if metric.kind == "logit-diff":
        return x[:, metric.ids[0]] - x[:, metric.ids[1]]
    if metric.kind == "prob":
        return torch.softmax(x, dim=-1)[:, metric.ids[0]]
    if metric.kind == "logprob":
        return torch.log_softmax(x, dim=-1)[:, metric.ids[0]]
    assert clean_logits is not None
    p = torch.log_softmax(clean_logits.double(), dim=-1)
    q = torch.log_softmax(x, dim=-1)
    return (p.exp() * (p - q)).sum(dim=-1).clamp_min(0.0)


def normalise(values: Any, clean: float, corrupt: float) -> Any:
    """``(m - m_corrupt) / (m_clean - m_corrupt)``; None where the two runs agree (no effect to recover)."""
    span = clean - corrupt
    if abs(span) <= 1e-12 * max(1.0, abs(clean), abs(corrupt)):
        return None
    return (values - corrupt) / span
