"""The encoder-decoder task (issue 42): T5, BART, Marian. ``--text`` feeds the encoder;
the decoder's inputs are built, never asked of the user: the tokens of ``--target-text``
(as the tokenizer writes them, T5: with ``</s>``) shifted right behind the decoder start
token (teacher forcing), or, without it, the model's own greedy continuation of each text
(up to :data:`GREEDY_TOKENS` tokens, computed before the run, hooks off).

The score is the log-probability of those decoder tokens, summed: ``log p(B | A)`` (R, 1).
"""

from __future__ import annotations

from typing import Any

from inspect_model.errors import UsageError
from inspect_model.methods.families.base import Task, TaskContext, is_hf, refuse_options, register_task
from inspect_model.methods.families.objective import TaskLabels
from inspect_model.methods.families.text import TokenAdapter

GREEDY_TOKENS = 8


class Seq2SeqAdapter(TokenAdapter):
    task = "seq2seq"

    def __init__(self, ctx: TaskContext) -> None:
        import torch

        super().__init__(ctx)
        tok, model, ob = ctx.tokenizer, ctx.model, ctx.objective
        cfg = model.config
        self.start = int(getattr(cfg, "decoder_start_token_id", None) or getattr(cfg, "pad_token_id", 0) or 0)
        self.pad = int(getattr(cfg, "pad_token_id", 0) or 0)
        self.by_text: dict[tuple[int, ...], list[int]] = {}  # encoder ids -> decoder target ids
        self.fixed: list[int] | None = None
        if ob.target_text is not None:
            if tok is None:
                raise UsageError("--target-text is a text: it needs --text (and the model's tokenizer)")
            self.fixed = [int(i) for i in tok(ob.target_text)["input_ids"]]
            self.words = f"log p({ob.target_text!r} | text), teacher-forced"
        elif tok is not None and ctx.texts and model.get_output_embeddings() is not None:
            from inspect_model.loading.text import tokenize

            shown = []
            for text in ctx.texts:
                ids, mask, _ = tokenize(tok, [text], 10**6)
                with torch.no_grad():
                    out = self._greedy(model, ids.to(ctx.device), mask.to(ctx.device))
                self.by_text[tuple(ids[0].tolist())] = out
                shown.append(repr(tok.decode(out)))
            self.words = f"log p(greedy continuation | text): {', '.join(shown[:3])}" + (" ..." if len(shown) > 3
                                                                                            else "")
            ctx.notes.append(f"seq2seq: no --target-text; the model's greedy continuation(s) {', '.join(shown[:3])} "
                             "are explained")
        else:
            self.fixed = [int(getattr(cfg, "eos_token_id", 1) or 1)]
            self.words = "log p(</s> | input)"
        self.labels = TaskLabels([self.words], {"log-prob": 0}, objective=True)
        self.targets: Any = None

    def _greedy(self, model: Any, ids: Any, mask: Any) -> list[int]:
        import torch

        eos = getattr(model.config, "eos_token_id", None)
        dec = torch.tensor([[self.start]], device=ids.device)
        for _ in range(GREEDY_TOKENS):
            logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
            nxt = int(logits[0, -1].argmax())
            dec = torch.cat([dec, torch.tensor([[nxt]], device=ids.device)], dim=1)
            if nxt == eos:
                break
        return [int(i) for i in dec[0, 1:].tolist()]

    def call(self, x: Any, mask: Any, rows: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        import torch

        rows_ids = []
        for i in range(int(x.shape[0])):
            if self.fixed is not None:
                rows_ids.append(self.fixed)
                continue
            real = x[i][: int(mask[i].sum())] if mask is not None else x[i]
            rows_ids.append(self.by_text.get(tuple(real.tolist())) or self._nearest(real))
        width = max(len(r) for r in rows_ids)
        labels = torch.full((len(rows_ids), width), -100, dtype=torch.long)
        for i, r in enumerate(rows_ids):
            labels[i, : len(r)] = torch.tensor(r)
        dec = torch.full_like(labels, self.pad)
        dec[:, 0] = self.start
        dec[:, 1:] = labels[:, :-1].clamp(min=0).masked_fill(labels[:, :-1] < 0, self.pad)
        self.targets = labels.to(x.device)
        args, kwargs = super().call(x, mask, rows)
        kwargs["decoder_input_ids"] = dec.to(x.device)
        return args, kwargs

    def complete(self, args: tuple, kwargs: dict[str, Any], rows: Any) -> tuple[tuple, dict[str, Any]] | None:
        """A call completed by the several-inputs binding (``--input-size input_ids=...``):
        the decoder's inputs added when it has none."""
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None or "decoder_input_ids" in kwargs or "decoder_inputs_embeds" in kwargs:
            return None
        _, built = self.call(ids, kwargs.get("attention_mask"), rows)
        return args, {**kwargs, "decoder_input_ids": built["decoder_input_ids"]}

    def _nearest(self, real: Any) -> list[int]:
        """A perturbed text (a deletion, a noisy copy): the continuation of the text it shares most with."""
        best = max(self.by_text, key=lambda k: sum(a == b for a, b in zip(k, real.tolist())))
        return self.by_text[best]

    def score(self, out: Any, mask: Any, rows: Any) -> Any:
        from inspect_model.methods.objectives.targets import select_output

        logits = select_output(out, self.output_key)  # (R, T, V)
        t = self.targets
        logp = logits.log_softmax(dim=-1).gather(2, t.clamp(min=0)[..., None])[..., 0]  # (R, T)
        return (logp * (t >= 0).to(logp.dtype)).sum(dim=1, keepdim=True)


@register_task
class Seq2Seq(Task):
    name, family, priority = "seq2seq", "encoder-decoder (seq2seq)", 45
    takes, options = "text", ("target_text",)
    generates = True
    target_help = "--target-text (teacher-forced log-probability) or the model's greedy continuation"

    def claims(self, model: Any, loaded: Any) -> bool:
        return is_hf(model) and bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))

    def adapter(self, ctx: TaskContext) -> Any:
        refuse_options(self, ctx.objective)
        if not hasattr(ctx.model, "get_output_embeddings") or ctx.model.get_output_embeddings() is None:
            if ctx.scoring:
                raise UsageError(f"{type(ctx.model).__name__} is an encoder-decoder without a language-model head: "
                                 "nothing to score; load its ...ForConditionalGeneration class")
        return Seq2SeqAdapter(ctx)
