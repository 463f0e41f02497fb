"""Deletion and insertion for texts (issue 42: ``attributions --evaluate`` on a token
model). A map's per-token relevance orders a text's real tokens, most relevant first;
deletion replaces them one after another with a replacement token (the tokenizer's mask
token, else its padding token), insertion starts from a text of replacement tokens and puts
them back in the same order. Each curve is the target's probability after each step, as the
report gives it (a softmax over the task's scores; one score: its sigmoid), and its area
(trapezoid rule over [0, 1]) is the map's score: low for deletion, high for insertion is a
faithful map (Petsiuk et al. 2018, on tokens instead of pixels). Padding is never touched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from inspect_model.methods.faithfulness import metrics as fa

if TYPE_CHECKING:
    import torch


def token_inputs(ids: torch.Tensor, order: torch.Tensor, fill: int, counts: Sequence[int],
                 insert: bool) -> torch.Tensor:
    """(len(counts), L) copies of ``ids`` (L,): the first ``c`` tokens of ``order`` replaced by
    ``fill`` (deletion), or all of ``order`` replaced but its first ``c`` (insertion)."""
    import torch

    rows = []
    for c in counts:
        row = ids.clone()
        chosen = order[c:] if insert else order[:c]
        row[chosen] = fill
        rows.append(row)
    return torch.stack(rows)


def token_curves(probability: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor, length: int,
                 relevance: torch.Tensor, target: int, fill: int, steps: int) -> dict[str, list[float]]:
    """The deletion and insertion curves of one map (module docstring). ``probability(rows)``
    gives (R, classes) probabilities of token-id rows (R, L); ``length``: real tokens of
    ``ids``; ``relevance`` (L,) per token, higher = more evidence for ``target``."""
    import torch

    order = torch.argsort(relevance[:length].float(), descending=True, stable=True)
    counts = sorted(set(fa.step_counts(length, min(steps, length))))
    out = {}
    for name, insert in (("deletion", False), ("insertion", True)):
        rows = token_inputs(ids, order.to(ids.device), fill, counts, insert)
        out[name] = [float(v) for v in probability(rows)[:, target]]
    return out
