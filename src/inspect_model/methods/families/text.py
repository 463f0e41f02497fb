"""Token models' shared adapter and the text classification tasks (issue 42).

:class:`TokenAdapter` feeds token ids with their mask under the keywords the model's
forward takes (``input_ids``, ``attention_mask``); a text classifier's scores are its
logits (R, classes), a token classifier's those of token ``--position N``.
"""

from __future__ import annotations

from typing import Any

from inspect_model.errors import InputError, UsageError
from inspect_model.methods.families.base import Task, TaskContext, is_hf, refuse_options, register_task


class TokenAdapter:
    """Token ids (R, L) and their mask in; the model's selected output as scores out."""

    task = "text"
    words = "the model's output"
    labels: Any = None

    def __init__(self, ctx: TaskContext) -> None:
        from inspect_model.loading.text import binding_for

        b = binding_for(ctx.model)
        self.ids_key, self.mask_key = b.ids_key, b.mask_key
        self.output_key = ctx.objective.output_key

    def call(self, x: Any, mask: Any, rows: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        kwargs: dict[str, Any] = {}
        if self.mask_key is not None and mask is not None:
            kwargs[self.mask_key] = mask
        if self.ids_key is None:
            return (x,), kwargs
        return (), {self.ids_key: x, **kwargs}

    def score(self, out: Any, mask: Any, rows: Any) -> Any:
        from inspect_model.methods.objectives.targets import select_output

        y = select_output(out, self.output_key)
        return y.reshape(y.shape[0], -1) if y.dim() > 1 else y[:, None]


def last_positions(mask: Any, n: int, length: int, device: Any) -> Any:
    """Each row's last real token (R,): from the mask, or the last position without one."""
    import torch

    if mask is None:
        return torch.full((n,), length - 1, dtype=torch.long, device=device)
    return (mask.sum(dim=1) - 1).clamp(min=0).to(device)


def at_position(position: int | None, mask: Any, n: int, length: int, device: Any) -> Any:
    """``--position N`` for every row (checked against each row's length), or each row's last token."""
    import torch

    last = last_positions(mask, n, length, device)
    if position is None:
        return last
    if bool((last < position).any()):
        raise InputError(f"--position {position} is past the end of a text of {int(last.min()) + 1} token(s); "
                         f"positions run 0..{int(last.min())}")
    return torch.full((n,), position, dtype=torch.long, device=device)


@register_task
class TextClassification(Task):
    name, family, priority = "text_classification", "text classification", 40
    takes = "text"

    def claims(self, model: Any, loaded: Any) -> bool:
        return is_hf(model) and type(model).__name__.endswith("ForSequenceClassification") and getattr(
            getattr(model, "config", None), "num_labels", 2) != 1 and getattr(model.config, "vocab_size", None)

    def adapter(self, ctx: TaskContext) -> Any:
        refuse_options(self, ctx.objective)
        adapter = TokenAdapter(ctx)
        adapter.task, adapter.words = self.name, "the class logits"
        return adapter


class _TokenClassAdapter(TokenAdapter):
    task = "token_classification"

    def __init__(self, ctx: TaskContext) -> None:
        super().__init__(ctx)
        self.position = ctx.objective.position
        self.words = f"the class logits of token {self.position}"

    def score(self, out: Any, mask: Any, rows: Any) -> Any:
        import torch

        from inspect_model.methods.objectives.targets import select_output

        y = select_output(out, self.output_key)  # (R, L, classes)
        pos = at_position(self.position, mask, y.shape[0], y.shape[1], y.device)
        return y[torch.arange(y.shape[0], device=y.device), pos]


@register_task
class TokenClassification(Task):
    name, family, priority = "token_classification", "token classification", 40
    takes, options = "text", ("position",)
    target_help = "--position N and --target CLASS: token N's class logit"

    def claims(self, model: Any, loaded: Any) -> bool:
        return is_hf(model) and type(model).__name__.endswith("ForTokenClassification")

    def adapter(self, ctx: TaskContext) -> Any:
        refuse_options(self, ctx.objective)
        if ctx.scoring and ctx.objective.position is None:
            raise UsageError("a token classifier scores every token: give --position N (the token to explain)")
        return _TokenClassAdapter(ctx) if ctx.scoring else TokenAdapter(ctx)
