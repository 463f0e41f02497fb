"""``attributions --text PROMPT --generate N`` (issue 36): attribution over a generation, as
a session of the ``attributions`` command (its request, options and files).

Each text is continued by the model (greedy, N tokens, or ``--continuation`` teacher-forced)
and every generated token attributed to the prompt and the tokens before it
(:mod:`inspect_model.methods.attributions.generation`). Per text the report holds one map
record per (generated token, method), ``rank`` the token's step, ``tokens`` its row of the
matrix, integrated gradients' completeness gap, and ``generation``: the tokens, their
log-probabilities and the matrices (null past each row's prefix). Files per text
(``images/NNNN-<name>/``): ``generation.<method>.png``, the matrix with token labels.
"""

from __future__ import annotations

import math
from typing import Any

from inspect_model.errors import InputError, UnsupportedModelError, UsageError
from inspect_model.run.session import ImageItem, Result, Session, Warnings, input_outcome


def check_generation_request(request: Any) -> None:
    """Options that do not combine with ``--generate``/``--continuation`` (no torch here)."""
    from inspect_model.methods.attributions import base as ab

    if request.generate is not None and request.continuation is not None:
        raise UsageError("--generate N and --continuation TEXT both say what to attribute; give one")
    if request.continuation is not None and not request.continuation.strip():
        raise UsageError("--continuation is empty; give the text, e.g. --continuation ' sat on the mat'")
    flag = "--generate" if request.generate is not None else "--continuation"
    for given, what in ((request.evaluation.enabled, "--evaluate"), (request.sanity, "--sanity"), (request.smooth, "--smooth"),
                        (request.steps == "auto", "--steps auto"), (request.save_raw, "--save-raw"),
                        (request.target not in (None, "predicted"), "--target"),
                        (request.output_key is not None, "--output-key"),
                        (request.window != "16" or request.stride is not None, "--window")):
        if given:
            raise UsageError(f"{flag} does not combine with {what}: each generated token is the target, "
                             "explained by its log-probability (occlusion: one token at a time)")
    for m in request.methods:
        if ab.get(m).generation is None:
            able = ", ".join(n for n, r in ab.methods().items() if r.generation is not None)
            raise UsageError(f"{flag} attributes each token with {able}; --method {m} is not one of them")


def check_generation_inputs(images: Any, inputs: Any) -> None:
    """A generation continues texts: images, or no ``--text``, are a usage error."""
    has_images = images is not None and not (isinstance(images, (list, tuple)) and not images)
    has_text = inputs is not None and (bool(inputs.text) or inputs.text_file is not None)
    if has_images or not has_text:
        raise UsageError("--generate continues a text with a language model: give --text PROMPT (or --text-file), "
                         "no images")
    for flag, value in (("--target-text", inputs.target_text), ("--position", inputs.position)):
        if value is not None:
            raise UsageError(f"--generate does not combine with {flag}: each generated token is explained at its "
                             "own step (teacher-force a text with --continuation)")


def check_generation_task(task: Any, name: str) -> None:
    """A model whose task does not generate: one line, exit 9."""
    if task is None or not task.generates:
        what = f"a {task.name} model" if task is not None else "not a language model"
        raise UnsupportedModelError(f"--generate continues a text with a language model (causal LM or "
                                    f"encoder-decoder); {name} is {what}")


def objective_words(request: Any, adapter: Any) -> str:
    """What each row explains, in words."""
    what = f"the {request.generate} greedy tokens" if request.generate is not None else \
        f"the continuation {request.continuation!r}"
    contrast = getattr(adapter, "contrast_text", None)
    score = "log p(token | prefix)"
    if contrast is not None:
        score = f"log p(token | prefix) - log p({contrast!r} | prefix)"
    return f"{score} of each of {what}, attributed to the prompt and the tokens before it"


class GenerationSession(Session):
    """The ``attributions`` session of ``--generate``/``--continuation`` (module docstring)."""

    command = "attributions"
    streams_files = True

    def __init__(self, prep: Any, mopts: Any, request: Any, *, keep_maps: bool = False, notes: Any = None,
                 progress: Any = None) -> None:
        from inspect_model.methods.attributions.generation import GenerationSettings
        from inspect_model.render.draw_generation import GenerationDrawer

        task = prep.task
        check_generation_task(task, prep.loaded.name)
        self.prep, self.mopts, self.request, self.keep_maps = prep, mopts, request, keep_maps
        from inspect_model.run.evaluate import _takes_label

        self.progress = progress if progress and _takes_label(progress) else None
        self.tok = prep.plan.tokenizer
        self.seq2seq = task.name == "seq2seq"
        adapter = getattr(prep.binding, "adapter", None)
        self.contrast = getattr(adapter, "contrast", None)
        continuation = None
        if request.continuation is not None:
            ids = self.tok(request.continuation, add_special_tokens=self.seq2seq)["input_ids"]
            continuation = tuple(int(i) for i in ids)
            if not continuation:
                raise InputError(f"--continuation {request.continuation!r} has no tokens")
        steps = request.steps if isinstance(request.steps, int) else 32
        self.settings = GenerationSettings(methods=tuple(request.methods), new_tokens=request.generate or 1,
                                           continuation=continuation, contrast=self.contrast, steps=steps,
                                           rule=request.rule, baseline=request.baseline,
                                           batch_size=int(prep.plan.batch_size), seed=int(prep.plan.seed))
        self.entries: list[dict[str, Any]] = []
        self.results: list[Any] = []
        self.warnings = Warnings()
        self.layers: list[str] = []
        self.options_record = request.resolved()
        self.drawer = GenerationDrawer(methods=list(request.methods))

    # ------------------------------------------------------------------ computing
    def feed(self, batch: Any) -> list[ImageItem]:
        import contextlib

        from inspect_model.methods.attributions.generation import attribute_generation

        model, binding = self.prep.loaded.model, self.prep.binding
        first = self.index_base + len(self.entries)
        items = []
        for i in range(int(batch.tensor.shape[0])):
            real = batch.text.mask[i].bool()
            prompt = [int(v) for v in batch.tensor[i][real.to(batch.tensor.device)].tolist()]
            paused = binding.paused() if hasattr(binding, "paused") else contextlib.nullcontext()
            with paused:  # the run's task binding lets these calls through (they build their own)
                res = attribute_generation(model, prompt, self.settings, device=self.prep.device,
                                           progress=self.progress)
            self.layers = res.layers
            if res.stopped and self.request.generate is not None and len(res.generated) < self.request.generate:
                self.warnings.add(f"'{batch.names[i]}': generation ended at the end-of-sequence token after "
                                  f"{len(res.generated)} of {self.request.generate} token(s)")
            entry = self._entry(first + i, batch.names[i], batch.text.texts[i], res)
            self.entries.append(entry)
            if self.keep_maps:
                self.results.append(res)
            items.append(ImageItem(entry, res))
        return items

    def _names(self, ids: list[int]) -> list[str]:
        """The tokenizer's name of each id; ``<id N>`` for ids it does not know (a model's
        vocabulary may be larger than its tokenizer's)."""
        names = self.tok.convert_ids_to_tokens(list(ids))
        return [f"<id {i}>" if n is None else str(n) for i, n in zip(ids, names)]

    def _entry(self, index: int, name: str, text: str, res: Any) -> dict[str, Any]:
        from inspect_model.methods.attributions import base as ab
        from inspect_model.methods.attributions.entries import map_entry
        from inspect_model.methods.attributions.maps import map_statistics
        from inspect_model.reports.attributions import AttributionTarget

        labels = self._names(res.generated)
        layer = ", ".join(res.layers)
        records = []
        for t, tid in enumerate(res.generated):
            for method, mat in res.matrices.items():
                row = mat[t, :res.first + t]
                ig = ab.get(method).generation == "integrated"
                target = AttributionTarget(class_=int(tid), label=labels[t], score=res.scores[t],
                                           probability=math.exp(res.log_probs[t]))
                records.append(map_entry(
                    method, map_statistics(row), signed=ab.get(method).signed, smoothed=False, target=target,
                    rank=t, layer=layer, baseline_score=res.baseline_scores[t] if ig else None,
                    delta=res.gaps[t] if ig else None, steps=self.settings.steps if ig else None,
                    tokens=row.tolist()).to_dict())
        gen: dict[str, Any] = {
            "mode": res.mode, "stopped": res.stopped, "first_columns": res.first,
            "text": self.tok.decode(res.generated),
            "tokens": [{"id": int(tid), "token": labels[t], "log_prob": res.log_probs[t], "score": res.scores[t],
                        "contrast_log_prob": res.contrast_log_probs[t] if res.contrast_log_probs else None}
                       for t, tid in enumerate(res.generated)],
            "columns": [{"id": int(c), "token": n, "part": p}
                        for c, n, p in zip(res.columns, self._names(res.columns), res.parts)],
            "matrices": {m: [[None if not math.isfinite(v) else v for v in row] for row in mat.tolist()]
                         for m, mat in res.matrices.items()},
        }
        if self.contrast is not None:
            gen["contrast"] = {"id": int(self.contrast), "token": self._names([self.contrast])[0]}
        return {"index": index, "image": name, "size": None, "targets": [int(t) for t in res.generated],
                "maps": records, "files": {}, "token_ids": list(res.prompt),
                "text": {"text": text, "tokens": self._names(res.prompt)}, "generation": gen}

    def finish(self) -> Result:
        skipped = input_outcome(self.prep.plan, self.warnings)
        if not self.entries:
            raise InputError("no input could be read; nothing to do")
        payload: dict[str, Any] = {
            "model": self.prep.loaded.name, "methods": list(self.settings.methods), "smoothed": [],
            "space": "embedding", "embedding_layer": ", ".join(self.layers) or None, "guided_sites": {},
            "images": self.entries, "image_count": len(self.entries), "sanity": None, "skipped": skipped,
        }
        record = _GenerationRecord(self.results) if self.keep_maps else None
        return Result("attributions", self.resolved_options(), payload, self.warnings.to_list(), record=record)

    def resolved_options(self) -> dict[str, Any]:
        return self.prep.options(self.mopts, **self.options_record)

    # --------------------------------------------------------- resume and torchrun
    def state_dict(self) -> dict[str, Any]:
        return {"entries": self.entries, "warnings": self.warnings, "layers": self.layers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entries, self.warnings, self.layers = list(state["entries"]), state["warnings"], list(state["layers"])

    def merge(self, states: list[dict[str, Any]]) -> None:
        self.entries = [e for s in states for e in s["entries"]]
        self.warnings.merge(s["warnings"] for s in states[1:])
        self.layers = next((list(s["layers"]) for s in states if s["layers"]), self.layers)


class _GenerationRecord:
    """What the API result adds for Python users: per text its
    :class:`~inspect_model.methods.attributions.generation.GenerationAttribution`
    (``generations``) and its matrices, method -> (N, C) with NaN past each row
    (``matrices``)."""

    def __init__(self, results: list[Any]) -> None:
        self.generations = list(results)
        self.matrices = [r.matrices for r in results]
