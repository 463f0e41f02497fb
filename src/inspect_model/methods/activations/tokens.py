"""Statistics of text batches over their real tokens only (issue 42, item 4).

A batch of texts is padded to its longest text; the padding positions run through the model
like any token (the attention mask only keeps them from being attended to), so a layer's
statistics over the whole (B, L, ...) output mix in values no text has: Llama's embedding of
its pad id, an all-zero row, read as 11% exact zeros. :func:`measure_tokens` measures only
the positions the batch's attention mask (B, L) marks real, per text, so that the moments,
the per-channel means and the dead channels are those of the texts' own tokens; the result
is a :class:`~inspect_model.methods.activations.measure.Measurement` like any other, and
merges with the others exactly. :func:`real_tokens` does the same for a single statistic
pass (gradients). Outputs not laid out (B, L, ...) over the batch's tokens (a position
table (1, L, D), attention weights (B, heads, L, L)) are measured whole.

:func:`position_tables` names the leaf modules whose outputs are no activations of the
input: rotary embeddings' cos/sin tables, computed from positions alone (the rotary module
of Llama, Mistral, Qwen, GPT-NeoX, ...); ``activations`` leaves them out unless named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

    from inspect_model.methods.activations.measure import Measurement


def over_tokens(t: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether ``t`` is laid out (B, L, ...) over the batch's tokens, with padding to leave out."""
    return (mask is not None and t.dim() >= 2 and tuple(t.shape[:2]) == tuple(mask.shape)
            and not bool(mask.all()))


def real_tokens(t: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The values of ``t`` at real tokens, (tokens, ...), when ``t`` is over the batch's
    tokens (:func:`over_tokens`); else ``t`` itself."""
    if not over_tokens(t, mask):
        return t
    assert mask is not None
    return t[mask.to(device=t.device, dtype=bool)]


def measure_tokens(t: torch.Tensor, mask: torch.Tensor | None, *, hist_bins: int = 0) -> Measurement:
    """:func:`~inspect_model.methods.activations.measure.measure` of ``t`` (B, L, ...) over
    the real tokens of each text (module docstring); any other tensor as ``measure`` does."""
    import torch

    from inspect_model.methods.activations.measure import Measurement, Moments, measure

    n = int(mask.shape[0]) if mask is not None else None
    if not over_tokens(t, mask):
        return measure(t, n, hist_bins=hist_bins)
    assert mask is not None
    keep = mask.to(device=t.device, dtype=torch.bool)
    x = t.detach()
    parts = [measure(x[i:i + 1, keep[i]], 1) for i in range(x.shape[0])]  # text i: (1, tokens_i, ...)
    samples = [p.samples[0] if p.samples else Moments() for p in parts]
    full = [p for p in parts if p.channels]
    channels: dict[int, Any] = {}
    sample_dead: dict[int, list[float]] = {}
    for cdim in full[0].channels if full else {}:
        channels[cdim] = _merge_channels([p.channels[cdim] for p in full], int(x.shape[cdim]))
        sample_dead[cdim] = [p.sample_dead[cdim][0] if p.channels else 0.0 for p in parts]
    hist = None
    if hist_bins > 0:
        hist = _histogram(x[keep], samples, hist_bins)
    return Measurement(True, samples, channels, sample_dead, hist)


def _merge_channels(chs: list[Any], width: int) -> Any:
    """The per-text channels summed; a channel axis over the tokens (dim 1, of each text's own
    length) is padded to the batch's ``width`` with no values (count 0) where a text ends."""
    import torch
    import torch.nn.functional as F

    from inspect_model.methods.activations.measure import Channels

    def counts(c: Any) -> torch.Tensor:
        return c.counts if isinstance(c.counts, torch.Tensor) else torch.full_like(c.sums, float(c.counts))

    ragged = len({int(c.sums.numel()) for c in chs}) > 1 or int(chs[0].sums.numel()) != width
    if not ragged:
        out = Channels(chs[0].dim, chs[0].sums.clone(), chs[0].counts, chs[0].dead.clone())
        for c in chs[1:]:
            out.merge(c)
        return out
    sums = torch.zeros(width, dtype=torch.float64)
    cnt = torch.zeros(width, dtype=torch.float64)
    dead = torch.ones(width, dtype=torch.bool)
    for c in chs:
        k = int(c.sums.numel())
        sums += F.pad(c.sums.to(torch.float64), (0, width - k))
        cnt += F.pad(counts(c).to(torch.float64), (0, width - k))
        dead &= F.pad(c.dead, (0, width - k), value=True)
    return Channels(chs[0].dim, sums, cnt, dead)


def _histogram(values: torch.Tensor, samples: list[Any], bins: int) -> tuple[float, float, list[float]] | None:
    """The histogram ``measure`` draws, over the real tokens' values."""
    import torch

    from inspect_model.methods.activations.measure import Moments

    total = Moments()
    for s in samples:
        total.merge(s)
    if not total.count:
        return None
    flat = values.reshape(-1)
    if total.count != total.numel:
        flat = flat[torch.isfinite(flat)]
    lo, hi = total.min, total.max
    if hi <= lo:
        hi = lo + 1e-6 if lo == 0 else lo + abs(lo) * 1e-6
    return lo, hi, torch.histc(flat.float(), bins=bins, min=lo, max=hi).cpu().tolist()


def position_tables(model: nn.Module, names: list[str]) -> list[str]:
    """Of ``names``, the leaf modules that compute position tables, not activations of the
    input: parameter-free rotary embeddings (their cos/sin depend on positions alone)."""
    modules = dict(model.named_modules())
    out = []
    for name in names:
        m = modules.get(name)
        if m is None or "rotary" not in type(m).__name__.lower():
            continue
        if next(m.parameters(recurse=True), None) is None:
            out.append(name)
    return out
