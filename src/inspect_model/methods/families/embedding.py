"""The head-less task (issue 42): an encoder without a head (``BertModel``,
``CLIPVisionModel``, ``ViTModel``) outputs features, not scores, so nothing is explained
by default. The objectives it takes:

- ``--target norm``: the L2 norm of the pooled output (``pooler_output``; else the mean of
  ``last_hidden_state`` over real tokens);
- ``--target cosine:REF``: the cosine similarity of the pooled output with that of a
  reference text ``REF`` (token models);
- ``--output-key NAME``: that output; a (batch, K) one is explained as K scores, a larger
  one through ``norm``/``cosine``.

Without one, a command that explains a score is a usage error naming them; activations,
summaries and raw attention need no objective and run.
"""

from __future__ import annotations

from typing import Any

from inspect_model.errors import InputError, UsageError
from inspect_model.methods.families.base import Task, TaskContext, is_hf, refuse_options, register_task
from inspect_model.methods.families.objective import TaskLabels
from inspect_model.methods.families.text import TokenAdapter

HEADS = ("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
         "ForImageClassification", "ForObjectDetection", "ForSemanticSegmentation", "ForConditionalGeneration",
         "ForQuestionAnswering", "ForMultipleChoice", "ForPreTraining", "ForVideoClassification")
NEEDS = "--target norm, --target cosine:REF or --output-key NAME"


def pooled(out: Any, key: str | None, mask: Any) -> Any:
    """The (R, D) vector a head-less objective reads (module docstring)."""
    import torch

    from inspect_model.methods.objectives.targets import select_output

    if key is not None:
        t = select_output(out, key)
    else:
        t = getattr(out, "pooler_output", None)
        if t is None:
            t = getattr(out, "last_hidden_state", None)
        if t is None:
            t = select_output(out, None)
    if not isinstance(t, torch.Tensor):
        raise InputError("the model returned no tensor to take the norm of; pick one with --output-key")
    if t.dim() == 3:  # (R, L, D): mean over real tokens
        if mask is not None and mask.shape[:2] == t.shape[:2]:
            w = mask.to(t.dtype)[..., None]
            return (t * w).sum(1) / w.sum(1).clamp(min=1)
        return t.mean(dim=1)
    return t.reshape(t.shape[0], -1)


class EmbeddingAdapter(TokenAdapter):
    task = "embedding"

    def __init__(self, ctx: TaskContext) -> None:
        super().__init__(ctx)
        ob = ctx.objective
        self.kind, self.ref, self.float_input = ob.kind, None, ctx.images
        what = f"output '{ob.output_key}'" if ob.output_key else "the pooled output"
        if ob.kind == "norm":
            self.words = f"||{what}||_2"
            self.labels = TaskLabels([self.words], {"norm": 0}, objective=True)
        elif ob.kind == "cosine":
            self.ref = self._reference(ctx, ob.reference or "")
            self.words = f"cos({what}, {what} of {ob.reference!r})"
            self.labels = TaskLabels([self.words], {ob.target.lower(): 0, "cosine": 0}, objective=True)
        else:  # --output-key alone: that output's units
            self.words = f"the units of output '{ob.output_key}'"

    def _reference(self, ctx: TaskContext, ref: str) -> Any:
        import torch

        if ctx.images or ctx.tokenizer is None:
            raise UsageError("--target cosine:REF takes a reference text; it needs --text on a token model")
        from inspect_model.loading.text import tokenize

        ids, mask, _ = tokenize(ctx.tokenizer, [ref], 10**6)
        ids, mask = ids.to(ctx.device), mask.to(ctx.device)
        args, kwargs = TokenAdapter.call(self, ids, mask, None)
        with torch.no_grad():
            return pooled(ctx.model(*args, **kwargs), ctx.objective.output_key, mask).detach()

    def call(self, x: Any, mask: Any, rows: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if self.float_input:
            return (x,), {}
        return super().call(x, mask, rows)

    def score(self, out: Any, mask: Any, rows: Any) -> Any:
        import torch

        v = pooled(out, self.output_key, mask)
        if self.kind == "norm":
            return v.norm(dim=1, keepdim=True)
        if self.kind == "cosine":
            return torch.nn.functional.cosine_similarity(v, self.ref.to(v.device, v.dtype), dim=1)[:, None]
        from inspect_model.methods.objectives.targets import select_output

        y = select_output(out, self.output_key)
        if y.dim() > 2:
            raise UsageError(f"output '{self.output_key}' is {tuple(y.shape)}, not one score per unit; "
                             "add --target norm or --target cosine:REF")
        return y.reshape(y.shape[0], -1)


@register_task
class Embedding(Task):
    name, family, priority = "embedding", "embedding / head-less encoder", 20
    takes, options = "images or text", ("norm",)
    target_help = NEEDS

    def claims(self, model: Any, loaded: Any) -> bool:
        name = type(model).__name__
        return is_hf(model) and name.endswith("Model") and not name.endswith(HEADS) and not getattr(
            getattr(model, "config", None), "is_encoder_decoder", False)

    def adapter(self, ctx: TaskContext) -> Any:
        refuse_options(self, ctx.objective)
        ob = ctx.objective
        if ctx.scoring and ob.kind == "class" and ob.output_key is None:
            raise UsageError(f"{type(ctx.model).__name__} is a head-less encoder: its output is features, not "
                             f"scores; say what to explain with {NEEDS}")
        if ctx.scoring:
            return EmbeddingAdapter(ctx)
        if ctx.images:
            return None
        adapter = TokenAdapter(ctx)
        adapter.task = self.name
        return adapter
