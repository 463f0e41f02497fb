"""The contrastive two-tower task (issue 42): CLIP-like models embed images and texts
apart and compare them. The images are the input explained; the texts (``--text``, one
or several) are held fixed, and the scores are ``logits_per_image`` (R, texts): the
scaled cosine similarity of each image with each text, one target per text (``--target
predicted``: the best-matching text; ``--target 1`` or the text itself: that one).
"""

from __future__ import annotations

from typing import Any

from inspect_model.errors import UsageError
from inspect_model.methods.families.base import Task, TaskContext, is_hf, refuse_options, register_task
from inspect_model.methods.families.objective import TaskLabels


class ContrastiveAdapter:
    task = "contrastive"

    def __init__(self, ctx: TaskContext) -> None:
        from inspect_model.loading.text import tokenize

        assert ctx.texts is not None and ctx.tokenizer is not None
        self.ids, self.mask, _ = tokenize(ctx.tokenizer, list(ctx.texts), 77)
        self.words = "logits_per_image[image, text]: the image-text similarity, one target per text"
        self.labels = TaskLabels([str(t) for t in ctx.texts])

    def call(self, x: Any, mask: Any, rows: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (), {"pixel_values": x, "input_ids": self.ids.to(x.device), "attention_mask": self.mask.to(x.device)}

    def score(self, out: Any, mask: Any, rows: Any) -> Any:
        return out.logits_per_image  # (R images, texts)


@register_task
class Contrastive(Task):
    name, family, priority = "contrastive", "contrastive two-tower (image-text)", 45
    takes = "images+text"
    target_help = "--text T (several: one target each) with the images; --target a text or its index"

    def claims(self, model: Any, loaded: Any) -> bool:
        return is_hf(model) and hasattr(model, "get_image_features") and hasattr(model, "get_text_features")

    def adapter(self, ctx: TaskContext) -> Any:
        refuse_options(self, ctx.objective)
        if not ctx.texts or not ctx.images:
            raise UsageError(f"{type(ctx.model).__name__} compares images with texts: give IMAGE... and --text "
                             "(one or several texts; each is a target)")
        return ContrastiveAdapter(ctx)
