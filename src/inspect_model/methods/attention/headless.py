"""Attention on a model without a head (issue 42): ``BertModel``, ``CLIPVisionModel``,
``ViTModel`` output features, not scores. Raw attention and rollout need no score and run;
the methods that explain a score (grad-rollout, LeGrad, the CAM family) have nothing to
explain unless an objective is named (``--target norm``, ``cosine:REF``, an output key), so
they are skipped with a note instead of failing the run. LeGrad scores each block's tokens
through the model's head, so a head-less model never takes it.

Whether a model is head-less is its task's answer (``prep.task``, the task registry's
``embedding``) where the run has one; else a Hugging Face base model (its own
``base_model``, no head in its class name) is taken as head-less.
"""

from __future__ import annotations

from typing import Any

from inspect_model.methods.attention import base

# Head classes in Hugging Face class names (BertForMaskedLM, GPT2LMHeadModel, ...).
_HEAD_WORDS = ("For", "LMHead", "WithHeads")


def headless(model: Any, task: Any = None) -> bool:
    """Whether ``model`` has no head whose scores a gradient method could explain."""
    name = getattr(task, "name", None)
    if name is not None:
        return name in ("embedding", "headless")
    cls = type(model)
    if not str(getattr(cls, "__module__", "")).startswith("transformers"):
        return False
    if any(w in cls.__name__ for w in _HEAD_WORDS):
        return False
    return getattr(model, "base_model", None) is model


def explicit_objective(target: Any) -> bool:
    """Whether the user named what to explain (not the default ``predicted``)."""
    if target is None:
        return False
    if isinstance(target, str):
        return target.strip().lower() not in ("", "predicted")
    return True


def score_free(method: str) -> bool:
    """An attention method that explains no score (its registry entry needs no gradients)."""
    return base.known(method) and not base.get(method).needs_gradients


def split_methods(methods: tuple[str, ...], model: Any, *, task: Any = None, target: Any = None
                  ) -> tuple[tuple[str, ...], dict[str, str]]:
    """(the methods to run, the skipped ones with why) of ``methods`` on ``model``."""
    if not headless(model, task):
        return methods, {}
    name = type(model).__name__
    named = explicit_objective(target)
    skipped: dict[str, str] = {}
    for m in methods:
        if score_free(m):  # runs on any model with attention
            continue
        if base.known(m) and base.get(m).needs_head:
            skipped[m] = f"{m} scores each block's tokens through the model's head, and {name} has none"
        elif not named:
            skipped[m] = (f"{name} has no head: {m} explains a score, and none is named (give --target norm "
                          "or --target cosine:REF)")
    return tuple(m for m in methods if m not in skipped), skipped


def skipped_note(skipped: dict[str, str]) -> str:
    """One line for the skipped methods (their reasons, said once each)."""
    reasons = list(dict.fromkeys(skipped.values()))
    return f"{', '.join(skipped)} skipped: " + "; ".join(reasons)
