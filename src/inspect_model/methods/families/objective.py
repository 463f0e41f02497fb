"""The typed objective of a run (issue 42): what score the gradient commands explain,
parsed once from the target options, before anything is loaded (no torch here).

The options, whatever the task:

- ``--target``: ``predicted`` / an index / a name / ``top:K`` (a class, a token of a
  language model's vocabulary, a text of a two-tower model); ``norm`` (the L2 norm of a
  head-less model's pooled output); ``cosine:REF`` (the cosine similarity of that output
  with the output of a reference input ``REF``: a text for a token model);
- ``--target-text TEXT``: a continuation: causal LM and seq2seq explain
  ``log p(TEXT | text)``, summed over its tokens (teacher-forced for a seq2seq decoder);
- ``--position N``: the token position whose prediction is explained (causal LM: the
  logits at token N predict token N+1; token classification: token N's classes);
- ``--contrast TEXT``: a causal LM's logit difference, target token minus this token;
- ``--output-key``: which output tensor (a head-less model: the one ``norm``/``cosine``
  read; any model: the score tensor).

A task (:mod:`inspect_model.methods.families`) says which of these it takes; one it does
not take is a usage error naming the task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inspect_model.errors import UsageError

HEADLESS_KINDS = ("norm", "cosine")


@dataclass(frozen=True)
class Objective:
    """What to explain, as the user said it (see the module docstring)."""

    target: str = "predicted"  # the --target text as given ("predicted" when none)
    kind: str = "class"  # "class" (predicted, an index, a name, top:K), "norm", "cosine"
    reference: str | None = None  # cosine:REF's REF
    target_text: str | None = None
    position: int | None = None
    contrast: str | None = None
    output_key: str | None = None
    given: bool = False  # --target was given (not the default)

    @property
    def options(self) -> dict[str, Any]:
        """The report's record of the objective options."""
        return {"target": self.target, "target_text": self.target_text, "position": self.position,
                "contrast": self.contrast, "output_key": self.output_key}

    def flags(self) -> list[str]:
        """The objective options given, as flags (for messages)."""
        out = [f for f, v in (("--target-text", self.target_text), ("--position", self.position),
                              ("--contrast", self.contrast)) if v is not None]
        return out + ([f"--target {self.target}"] if self.kind != "class" else [])


def parse_objective(target: Any = None, *, target_text: str | None = None, position: int | None = None,
                    contrast: str | None = None, output_key: str | None = None) -> Objective:
    """The :class:`Objective` of the target options; syntax errors are usage errors (2)."""
    given = target is not None and not (isinstance(target, str) and target.strip().lower() in ("", "predicted"))
    raw = target if isinstance(target, str) else ("predicted" if target is None else "")
    low = raw.strip().lower()
    kind, reference = "class", None
    if low == "norm":
        kind = "norm"
    elif low.startswith("cosine:") or low == "cosine":
        kind, reference = "cosine", raw.strip()[7:]
        if not reference.strip():
            raise UsageError("--target cosine:REF needs a reference after the colon: a text for a token model, "
                             "e.g. --target 'cosine:the cat sat'")
    if position is not None and position < 0:
        raise UsageError(f"--position {position}: positions start at 0 (the first token)")
    for flag, value in (("--target-text", target_text), ("--contrast", contrast)):
        if value is not None and not str(value).strip():
            raise UsageError(f"{flag} is empty; give the text, e.g. {flag} ' mat'")
    if kind != "class" and (target_text is not None or contrast is not None):
        raise UsageError(f"--target {low.split(':')[0]} explains a head-less output; it does not combine with "
                         "--target-text or --contrast")
    return Objective(target=raw.strip() or "predicted", kind=kind, reference=reference, target_text=target_text,
                     position=position, contrast=contrast, output_key=output_key, given=given)


class TaskLabels(list):  # type: ignore[type-arg]
    """The names of a task's scores (a vocabulary, texts, one objective) with the spellings
    ``--target`` may use for them besides the names (``norm``, ``cosine:REF``). ``objective``:
    the one score is a named objective (``log p(' mat' | text) at position 5``), not a class:
    reports show its words without the score index (:func:`~inspect_model.methods.objectives.rows.is_objective`)."""

    aliases: dict[str, int]
    objective: bool

    def __init__(self, names: list[str], aliases: dict[str, int] | None = None, *, objective: bool = False) -> None:
        super().__init__(names)
        self.aliases = {k.lower(): v for k, v in (aliases or {}).items()}
        self.objective = objective
