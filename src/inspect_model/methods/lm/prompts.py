"""Prompts of activation patching and causal tracing (issue 36): token ids, the subject's
tokens, the noise level, and how the model is called.

A decoder-only model reads each prompt as its tokenizer writes it (special tokens included:
Llama's ``<s>``). An encoder-decoder's *decoder* is patched: the prompt follows the
decoder's start token, and the encoder reads ``encoder_text`` (the same for every run).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from inspect_model.errors import InputError, UsageError

if TYPE_CHECKING:
    import torch
    from torch import nn


def is_encoder_decoder(model: Any) -> bool:
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


def encode(tok: Any, text: str, model: Any) -> list[int]:
    """The token ids the model reads for ``text`` (module docstring)."""
    if is_encoder_decoder(model):
        start = getattr(model.config, "decoder_start_token_id", None)
        return [int(start if start is not None else 0)] + list(tok(text, add_special_tokens=False)["input_ids"])
    return list(tok(text)["input_ids"])


def token_names(tok: Any, ids: list[int]) -> list[str]:
    return [str(tok.decode([i])) for i in ids]


def subject_range(tok: Any, text: str, subject: str, model: Any, n_ids: int) -> tuple[int, int]:
    """Token positions ``first..end-1`` that spell ``subject`` (its first occurrence in
    ``text``): the tokens whose characters overlap it (ROME's ``find_token_range``)."""
    at = text.find(subject)
    if not subject or at < 0:
        raise UsageError(f"--noise-subject {subject!r} is not in the prompt {text!r}")
    shift = 1 if is_encoder_decoder(model) else 0
    try:
        enc = tok(text, return_offsets_mapping=True, add_special_tokens=not shift)
        spans = enc["offset_mapping"]
    except (NotImplementedError, TypeError, KeyError, ValueError) as exc:
        raise UsageError("--noise-subject needs a fast tokenizer (character offsets of its tokens)") from exc
    hits = [i for i, (a, b) in enumerate(spans) if b > a and a < at + len(subject) and b > at]
    if not hits:
        raise UsageError(f"--noise-subject {subject!r}: no token of the prompt spells it")
    first, end = hits[0] + shift, hits[-1] + 1 + shift
    if end > n_ids:
        raise InputError(f"--noise-subject {subject!r}: its tokens lie outside the prompt's {n_ids} tokens")
    return first, end


def parse_noise_std(text: str) -> tuple[float, bool]:
    """(k, relative): ``3σ``/``3s``/``3sigma`` -> (3, True), ``0.1`` -> (0.1, False)."""
    raw = str(text).strip()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(σ|s|sigma)?", raw)
    if m is None or not float(m.group(1)) < 1e6:
        raise UsageError(f"--noise-std '{text}' is not a number or a multiple of σ (3σ, 3s, 3sigma)")
    return float(m.group(1)), m.group(2) is not None


def noise_level(text: str, embed: Any) -> tuple[float, str]:
    """(std, how): ``3σ``, ``3s`` or ``3sigma`` is 3 x the std of the token embedding
    matrix (ROME's ``noise_level = 3 * embedding std``); a plain number is the std itself."""
    k, relative = parse_noise_std(text)
    if not relative:
        return k, f"{k:g} (given)"
    if embed is None or not hasattr(embed, "weight"):
        raise UsageError(f"--noise-std {text}: the model has no token embedding matrix to take σ of; give a number")
    sigma = float(embed.weight.detach().float().std())
    return k * sigma, f"{k:g} x σ, σ = {sigma:.6g} (std of the token embedding matrix)"


def caller(model: nn.Module, tok: Any, encoder_text: str, device: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """``call(ids (B, T)) -> logits (B, T, vocab)`` (module docstring)."""
    import torch

    if is_encoder_decoder(model):
        enc = torch.tensor([list(tok(encoder_text)["input_ids"]) or [0]], device=device)

        def call_ed(ids: torch.Tensor) -> torch.Tensor:
            return model(input_ids=enc.expand(ids.shape[0], -1), decoder_input_ids=ids, use_cache=False).logits

        return call_ed

    def call(ids: torch.Tensor) -> torch.Tensor:
        out = model(input_ids=ids, use_cache=False)
        return out.logits if hasattr(out, "logits") else (out[0] if isinstance(out, (tuple, list)) else out)

    return call
