"""The task's hold on the model for a run (issue 42): a forward pre-hook that turns the
commands' ``model(x)`` into the task's full call (the attention mask, a seq2seq decoder's
inputs, a two-tower model's texts), and, for the commands that explain a score, a forward
hook that turns the model's output into the task's scores (R, K), one column per target
name (a vocabulary, the texts of a two-tower model, one objective such as
``log p(' mat' | text)``). Every command then sees "input -> named scores", as for an
image classifier, and no command guesses from output shapes.

Methods call the model on more rows than the batch (integrated gradients' steps, noisy
copies, occlusion, ``--evaluate``'s deletions): each row is matched to the batch row whose
token ids it shares most (:func:`match_rows`), and takes that row's mask and per-row facts
(its last real token, its continuation).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inspect_model.errors import InputError

if TYPE_CHECKING:
    import torch
    from torch import nn


def match_rows(x: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
    """The batch row of each row of ``x`` (R, L): the row of ``ids`` (B, L) with the most
    equal tokens (a perturbed copy keeps most of its own)."""
    import torch

    n = int(x.shape[0])
    if ids is None or x.is_floating_point():
        return torch.arange(n, device=x.device) if ids is None or n == ids.shape[0] else torch.zeros(
            n, dtype=torch.long, device=x.device)
    if x.shape[1:] != ids.shape[1:]:
        raise InputError(f"token ids of shape {tuple(x.shape)} do not match the batch {tuple(ids.shape)}")
    if n == ids.shape[0] and torch.equal(x, ids.to(x.device)):
        return torch.arange(n, device=x.device)
    same = (x[:, None, :] == ids.to(x.device)[None]).sum(-1)  # (R, B)
    return same.argmax(dim=1)


@dataclass
class TaskBinding:
    """``model(x)`` -> the task's call and, when ``scoring``, its output -> (R, K) scores.

    ``adapter`` (a task's): ``call(x, mask, rows) -> (args, kwargs)`` and
    ``score(out, mask, rows) -> (R, K)``. ``inner``: a several-inputs binding entered
    under this one (its other inputs, from ``--input-size``/``--inputs-file``)."""

    adapter: Any
    scoring: bool = False
    inner: Any = None
    ids: Any = None  # the current batch's primary input (token ids), set by the text plan
    mask: Any = None  # the current batch's (B, L) mask
    rows: Any = field(default=None, repr=False)  # batch row of each row of the current call
    call_mask: Any = field(default=None, repr=False)  # (R, L) mask of the current call
    _paused: bool = field(default=False, repr=False)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """While inside, calls pass through untouched: a method that builds the model's calls
        itself and reads its logits (attributions --generate, issue 36)."""
        was, self._paused = self._paused, True
        try:
            yield
        finally:
            self._paused = was

    def set_batch(self, mask: torch.Tensor, ids: torch.Tensor | None = None) -> None:
        self.mask, self.ids = mask, ids

    def describe(self) -> dict[str, Any]:
        base = self.inner.describe() if self.inner is not None and hasattr(self.inner, "describe") else {}
        return {**base, "task": self.adapter.task, "objective": self.adapter.words if self.scoring else None}

    def call(self, x: torch.Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
        self.rows = match_rows(x, self.ids)
        self.call_mask = None if self.mask is None else self.mask.to(x.device)[self.rows]
        return self.adapter.call(x, self.call_mask, self.rows)

    @contextmanager
    def bound(self, model: nn.Module) -> Iterator[None]:
        """While inside, ``model(x)`` is the task's call (and score); hooks always removed."""
        def pre(_mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
            if self._paused:
                return None
            if len(args) == 1 and not kwargs:
                return self.call(args[0])
            import torch

            # A call the several-inputs binding completed (it runs first): rows as they come.
            first = next((v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor) and v.dim()), None)
            self.rows = None if first is None else torch.arange(int(first.shape[0]), device=first.device)
            self.call_mask = None
            complete = getattr(self.adapter, "complete", None)  # inputs the task builds (a decoder's)
            return None if complete is None else complete(args, kwargs, self.rows)

        def post(_mod: nn.Module, _args: Any, out: Any) -> Any:
            if self.rows is None or self._paused:
                return None
            scores = self.adapter.score(out, self.call_mask, self.rows)
            scores._im_task_scores = True  # select_output: these are the scores, whatever --output-key said
            return scores

        with ExitStack() as stack:
            handles = [model.register_forward_pre_hook(pre, with_kwargs=True, prepend=True)]
            if self.scoring:
                handles.append(model.register_forward_hook(post))
            try:
                if self.inner is not None:  # prepended after ours: it runs first
                    stack.enter_context(self.inner.bound(model))
                yield
            finally:
                for h in handles:
                    h.remove()
                self.rows = self.call_mask = None
