"""Language-model tasks (issue 42): causal LM and masked LM.

A causal LM's logits (R, L, vocab) predict token i+1 at position i. Its targets:

- default: the next token after the text, i.e. the logits at each text's last real token
  (R, vocab), one column per vocabulary token (``--target predicted``: the model's choice;
  ``--target mat``: that token);
- ``--position N``: the logits at token N (they predict token N+1);
- ``--target-text ' mat'``: ``log p(' mat' | text)``, the continuation appended to the
  text and its tokens' log-probabilities summed (R, 1);
- ``--contrast ' dog'``: the logit difference, target token minus the contrast token (R, 1).

A masked LM's target is the token at its mask position (the first ``[MASK]`` of each text,
or ``--position N``).
"""

from __future__ import annotations

from typing import Any

from inspect_model.errors import InputError, UsageError
from inspect_model.methods.families.base import Task, TaskContext, is_hf, refuse_options, register_task
from inspect_model.methods.families.objective import TaskLabels
from inspect_model.methods.families.text import TokenAdapter, at_position, last_positions


def vocab_names(tok: Any, size: int) -> list[str]:
    """One name per token id: the tokenizer's, else ``<id N>``."""
    if tok is None:
        return [f"<id {i}>" for i in range(size)]
    known = min(size, len(tok))
    names = [str(t) for t in tok.convert_ids_to_tokens(list(range(known)))]
    return names + [f"<id {i}>" for i in range(known, size)]


def one_token(tok: Any, text: str, flag: str) -> int:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise UsageError(f"{flag} {text!r} is {len(ids)} tokens; it must be one token of the vocabulary")
    return int(ids[0])


class CausalLMAdapter(TokenAdapter):
    task = "causal_lm"

    def __init__(self, ctx: TaskContext) -> None:
        super().__init__(ctx)
        ob, tok = ctx.objective, ctx.tokenizer
        self.position, self.suffix, self.contrast, self.target_id = ob.position, [], None, None
        self.contrast_text = ob.contrast  # as given (attributions --generate names it)
        if (ob.target_text is not None or ob.contrast is not None) and tok is None:
            raise UsageError("--target-text and --contrast are texts: they need --text (and the model's tokenizer)")
        if ob.target_text is not None and ob.position is not None:
            raise UsageError("--target-text is scored right after the text; it does not combine with --position")
        if ob.target_text is not None:
            self.suffix = [int(i) for i in tok(ob.target_text, add_special_tokens=False)["input_ids"]]
            if not self.suffix:
                raise UsageError(f"--target-text {ob.target_text!r} has no tokens")
        if ob.contrast is not None:
            self.contrast = one_token(tok, ob.contrast, "--contrast")
            if ob.target_text is not None:
                self.target_id = one_token(tok, ob.target_text, "--target-text (with --contrast)")
        vocab = int(getattr(getattr(ctx.model, "config", None), "vocab_size", 0) or (len(tok) if tok else 0))
        where = self._where(ctx)
        if ob.target_text is not None and self.contrast is None:
            self.words = f"log p({ob.target_text!r} | text) {where}"
            self.labels = TaskLabels([self.words], {"log-prob": 0, "continuation": 0}, objective=True)
        elif self.contrast is not None:
            target = repr(ob.target_text) if ob.target_text is not None else "the predicted next token"
            self.words = f"logit({target}) - logit({ob.contrast!r}) {where}"
            self.labels = TaskLabels([self.words], {"contrast": 0}, objective=True)
        else:
            self.words = f"the next-token logits {where} (one target per vocabulary token)"
            self.labels = vocab_names(tok, vocab)

    def _where(self, ctx: TaskContext) -> str:
        if self.position is not None:
            return f"at position {self.position}"
        if ctx.texts and ctx.tokenizer is not None:
            ends = {len(ctx.tokenizer(t)["input_ids"]) for t in ctx.texts}
            if len(ends) == 1:
                end = ends.pop()
                return f"at position {end}" if self.suffix else f"at position {end - 1}"
        return "at each text's last token" if ctx.texts else "at each input's last token"

    def score(self, out: Any, mask: Any, rows: Any) -> Any:
        import torch

        from inspect_model.methods.objectives.targets import select_output

        logits = select_output(out, self.output_key)  # (R, L, V)
        if logits.dim() != 3:
            raise InputError(f"a causal LM's logits are (batch, tokens, vocab); got {tuple(logits.shape)}")
        n, length = int(logits.shape[0]), int(logits.shape[1])
        r = torch.arange(n, device=logits.device)
        if self.suffix:
            start = last_positions(mask, n, length, logits.device) - len(self.suffix) + 1  # first suffix token
            if self.contrast is not None:
                z = logits[r, start - 1]
                return (z[:, self.target_id] - z[:, self.contrast])[:, None]
            logp = logits.log_softmax(dim=-1)
            total = sum(logp[r, start - 1 + j, tid] for j, tid in enumerate(self.suffix))
            return total[:, None]
        z = logits[r, at_position(self.position, mask, n, length, logits.device)]  # (R, V)
        if self.contrast is not None:
            top = z.detach().argmax(dim=1)
            return (z[r, top] - z[:, self.contrast])[:, None]
        return z


@register_task
class CausalLM(Task):
    name, family, priority = "causal_lm", "causal language model", 40
    takes, options = "text", ("target_text", "position", "contrast")
    generates = True
    target_help = "the next token (default), --target TOKEN, --target-text, --position or --contrast"

    def claims(self, model: Any, loaded: Any) -> bool:
        return is_hf(model) and type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))

    def adapter(self, ctx: TaskContext) -> Any:
        refuse_options(self, ctx.objective)
        return CausalLMAdapter(ctx)


class MaskedLMAdapter(TokenAdapter):
    task = "masked_lm"

    def __init__(self, ctx: TaskContext) -> None:
        super().__init__(ctx)
        tok, cfg = ctx.tokenizer, getattr(ctx.model, "config", None)
        self.position = ctx.objective.position
        self.mask_id = getattr(tok, "mask_token_id", None) if tok is not None else None
        self.mask_name = getattr(tok, "mask_token", None) or "[MASK]"
        self.ids: Any = None
        vocab = int(getattr(cfg, "vocab_size", 0) or (len(tok) if tok else 0))
        where = f"at position {self.position}" if self.position is not None else f"at the first {self.mask_name}"
        self.words = f"the token logits {where} (one target per vocabulary token)"
        self.labels = vocab_names(tok, vocab)

    def call(self, x: Any, mask: Any, rows: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        self.ids = x
        return super().call(x, mask, rows)

    def score(self, out: Any, mask: Any, rows: Any) -> Any:
        import torch

        from inspect_model.methods.objectives.targets import select_output

        logits = select_output(out, self.output_key)  # (R, L, V)
        n, length = int(logits.shape[0]), int(logits.shape[1])
        if self.position is not None:
            pos = at_position(self.position, mask, n, length, logits.device)
        else:
            if self.mask_id is None or self.ids is None or not bool((self.ids == self.mask_id).any(dim=1).all()):
                raise InputError(f"a masked LM explains its mask position: put {self.mask_name} in every --text, "
                                 "or give --position N")
            pos = (self.ids == self.mask_id).int().argmax(dim=1).to(logits.device)
        return logits[torch.arange(n, device=logits.device), pos]


@register_task
class MaskedLM(Task):
    name, family, priority = "masked_lm", "masked language model", 40
    takes, options = "text", ("position",)
    target_help = "the token at the first [MASK] (or --position N); --target TOKEN"

    def claims(self, model: Any, loaded: Any) -> bool:
        return is_hf(model) and type(model).__name__.endswith("ForMaskedLM")

    def adapter(self, ctx: TaskContext) -> Any:
        refuse_options(self, ctx.objective)
        return MaskedLMAdapter(ctx)
