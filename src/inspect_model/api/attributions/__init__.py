"""``attributions``: saliency, gradient, input x gradient, integrated gradients, SmoothGrad,
VarGrad, occlusion and guided backprop maps per image and target, as a session.

Files per image (``images/NNNN-stem/``): ``<method>.<class>.heatmap.png`` (signed maps on
a diverging colormap centred on 0), ``<method>.<class>.overlay.png`` (on the original
picture), with ``save_raw`` the raw maps (``.npy``); at the top ``contact_sheet_NNN.png``
(rows: image x target, columns: input and methods), with ``evaluate`` the deletion and
insertion curves. The report holds per map its positive and negative mass, its sum and,
for integrated gradients, f(baseline) and the completeness gap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from inspect_model.run import option_groups as og
from inspect_model.methods.attributions.options import AttributionSettings
from inspect_model.run.option_groups import Evaluate
from inspect_model.run.options import ModelOptions
from inspect_model.run.call import Call
from inspect_model.run.request import Request, api_command, option
from inspect_model.run.session import ImageItem, Result, Session, Warnings, input_outcome
from inspect_model.errors import InputError, UsageError
from inspect_model.methods.attributions.base import method_help as attribution_help
from inspect_model.methods.attributions.base import names as attribution_names
from inspect_model.registry import command
from inspect_model.reports.attributions import AttributionsReport
from inspect_model.render.attributions import render_result
from inspect_model.render.html_columns import attributions_tables



@dataclass(frozen=True)
class AttributionsRequest(Request):
    """The options of ``attributions`` (README "attributions"); validated once, here, without torch."""

    command: ClassVar[str] = "attributions"
    groups: ClassVar[tuple[Any, ...]] = (Evaluate, AttributionSettings)  # request.attribution: how to attribute

    methods: tuple[str, ...] = option(("saliency",), "--method", "-m", help=attribution_help, complete="method", multiple=True,
                                      param="method")
    target: str | tuple[str, ...] | None = og.target()
    steps: int | str = option(32, "--steps", type=str, help="integrated-gradients: points on the path from the "
                              "baseline, or auto: per map the fewest (4, 8, 16, ... 256) whose completeness gap "
                              "is within --max-gap.")
    max_gap: float = option(1e-3, "--max-gap", help="With --steps auto: the largest completeness gap accepted, a "
                            "fraction of |f(x) - f(baseline)| (0.001: 0.1 %).")
    rule: str = option("gauss-legendre", "--rule", help="integrated-gradients: gauss-legendre, riemann-left, "
                       "riemann-right, riemann-middle or riemann-trapezoid.")
    baseline: Any = option("zeros", "--baseline", type=str, help="integrated-gradients and occlusion: zeros, blur, "
                           "blur:SIGMA (pixels), uniform (seeded), a number, or a .pt/.npy file of one input's "
                           "shape.")
    samples: int = option(16, "--samples", help="smoothgrad, vargrad and --smooth: noisy copies per input.")
    noise: float = option(0.15, "--noise", help="Noise standard deviation: a fraction of each input's value range "
                          "(SmoothGrad: 0.1-0.2), or absolute with --noise-mode absolute.")
    noise_mode: str = option("fraction", "--noise-mode", help="fraction (of the input's range) or absolute.")
    window: str = option("16", "--window", type=str, help="occlusion: window size, 16 (16x16 over all channels), "
                         "16,24 or 3,16,16; on token embeddings, tokens.")
    stride: str | None = option(None, "--window-stride", type=str, param="window_stride", help="occlusion: window step (default: half the "
                                "window).")
    smooth: bool = option(False, "--smooth", help="Average every gradient method over --samples noisy copies "
                          "(SmoothGrad around it, as captum's NoiseTunnel).")
    activations: bool = option(False, "--activations", help="guided: also guide relu6, leaky_relu, silu, gelu and "
                               "prelu.")
    output_key: str | None = og.output_key()
    evaluate: bool = og.evaluate()
    metrics: tuple[str, ...] = og.metrics()
    eval_steps: int | str = og.eval_steps()
    eval_tolerance: float = og.eval_tolerance()
    eval_batch: int | None = og.eval_batch()
    sanity: bool = option(False, "--sanity", help="Cascading weight randomisation (Adebayo et al. 2018) on a copy "
                          "of the model, for every method: Spearman rank correlation with the original maps.")
    save_raw: bool = og.save_raw()
    overlays: bool = option(True, "--overlays/--no-overlays", help="With --output-dir: maps blended over the "
                            "original image.")
    generate: int | None = option(None, "--generate", type=int, help="With --text on a language model: generate N "
                                  "tokens greedily and attribute each to the prompt and the tokens before it "
                                  "(one tokens x tokens matrix per method; README 'Language models').")
    continuation: str | None = option(None, "--continuation", type=str, help="Like --generate, on this "
                                      "continuation instead of the model's own (teacher-forced).")

    def validate(self) -> None:  # no torch here: target, --evaluate and the settings are checked by their groups
        s = self.attribution
        self._set("methods", s.methods)
        self._set("steps", s.steps)
        self._set("baseline", s.baseline)
        self._set("window", str(self.window))
        if self.generates:
            from inspect_model.api.attributions.generation import check_generation_request

            check_generation_request(self)

    @property
    def generates(self) -> bool:
        """Attribution over a generation (``--generate N`` or ``--continuation``, issue 36)."""
        return self.generate is not None or self.continuation is not None

    def check_task(self, task: Any, name: str) -> None:
        """A generation needs a language model (run/tasks.py asks before the task's notes)."""
        if self.generates:
            from inspect_model.api.attributions.generation import check_generation_task

            check_generation_task(task, name)

    def objective_words(self, adapter: Any) -> str | None:
        """What a generation run explains, for the task's note and the report (run/tasks.py)."""
        if not self.generates:
            return None
        from inspect_model.api.attributions.generation import objective_words

        return objective_words(self, adapter)

    def resolved(self) -> dict[str, Any]:
        out = super().resolved()
        if hasattr(self.baseline, "shape"):
            out["baseline"] = "tensor"  # a tensor given through the API
        return out


@dataclass
class Found:
    """What the run found out on its first batch: the attribution space (``input`` or
    ``embedding``), the embedding layer, the guided activation sites."""

    space: str | None = None
    embedding_layer: str | None = None
    sites: dict[str, int] | None = None


class AttributionsSession(Session):
    command = "attributions"
    streams_files = True

    def __init__(self, prep: Any, mopts: ModelOptions, request: AttributionsRequest, *, keep_maps: bool = False,
                 notes: Any = None, progress: Any = None) -> None:
        from inspect_model.methods.objectives.targets import parse_target

        self.prep, self.mopts, self.request = prep, mopts, request
        self.spec = parse_target(request.target, prep.categories)
        self.settings = request.attribution.for_run(batch_size=prep.plan.batch_size, seed=int(prep.plan.seed))
        from inspect_model.run.evaluate import _takes_label

        # Long work reports (done, total, label); a two-argument callback sees the images only.
        self.keep_maps, self.progress = keep_maps, progress if progress and _takes_label(progress) else None
        self.maps: list[dict[str, Any]] = []
        self.entries: list[dict[str, Any]] = []
        self.warnings = Warnings()
        self.found = Found()
        self.options_record = request.resolved()  # plain data: part of the --resume fingerprint
        self.sanity_acc: dict[str, Any] | None = None
        self.evaluator = request.evaluation.evaluator(prep, output_key=request.output_key, notes=notes,
                                                      progress=progress)
        from inspect_model.render.draw_attributions import AttributionsDrawer

        self.drawer = AttributionsDrawer(categories=prep.categories, preprocess=prep.plan.preprocess,
                                         methods=list(request.methods), save_raw=request.save_raw,
                                         overlays=request.overlays, curves=request.evaluation.enabled)

    # ------------------------------------------------------------------ computing
    def feed(self, batch: Any) -> list[ImageItem]:
        from inspect_model.methods.attributions.maps import attribute

        from inspect_model.methods.objectives.targets import for_batch

        model, x = self.prep.loaded.model, batch.tensor
        first = self.index_base + len(self.entries)
        spec = for_batch(self.spec, first, int(x.shape[0]))
        res = attribute(model, x, spec, self.settings, output_key=self.request.output_key,
                        categories=self.prep.categories, first_index=first, progress=self.progress)
        self.found.space, self.found.embedding_layer = res.space, res.embedding_layer
        self.found.sites = self.found.sites or res.guided_sites
        self.warnings.extend(res.warnings)
        if self.request.sanity:
            from inspect_model.methods.attributions import sanity as san

            self.sanity_acc = san.merge(self.sanity_acc, san.sanity_check(
                model, x, res, self.settings, seed=int(self.prep.plan.seed), output_key=self.request.output_key,
                first_index=first, progress=self.progress))
        if self.keep_maps:
            self.maps.append(res.maps)
        items, start = [], len(self.entries)
        for i in range(x.shape[0]):
            img = batch.images[i] if batch.images is not None else None
            entry = self._entry(first + i, batch.names[i], res, i, img, x, batch)
            self.entries.append(entry)
            maps = {m: res.maps[m][i] for m in res.maps}
            items.append(ImageItem(entry, (img, x[i].detach().float().cpu(), maps)))
        if self.evaluator is not None:
            self._evaluate(res, batch, self.entries[start:])
        return items

    def _entry(self, index: int, name: str, res: Any, i: int, img: Any, ids: Any, batch: Any = None
               ) -> dict[str, Any]:
        from inspect_model.methods.attributions import base as ab
        from inspect_model.methods.attributions.entries import image_entry, map_entry
        from inspect_model.methods.attributions.maps import map_statistics
        from inspect_model.methods.objectives.rows import class_name, objective_flag
        from inspect_model.reports.attributions import AttributionTarget, TextTokens

        records = []
        for k, cls in enumerate(res.targets[i]):
            target = AttributionTarget(class_=int(cls), label=class_name(int(cls), self.prep.categories),
                                       score=res.scores[i][k], probability=res.probabilities[i][k],
                                       **objective_flag(self.prep.categories))
            for method, maps in res.maps.items():
                ig = method == "integrated-gradients" and res.deltas is not None
                steps = res.ig_steps[i][k] if ig and res.ig_steps is not None else None  # --steps auto: its own
                records.append(map_entry(
                    method, map_statistics(maps[i, k]), signed=ab.get(method).signed,
                    smoothed=method in res.smoothed, target=target, rank=k, layer=res.embedding_layer or "input",
                    baseline_score=res.baseline_scores[i][k] if ig else None, delta=res.deltas[i][k] if ig else None,
                    steps=steps, gap_tolerance=self.settings.max_gap
                    if steps is not None and self.settings.steps == "auto" else None,
                    # (L, D): one number per token, the sum over D
                    tokens=maps[i, k].double().sum(-1).tolist() if res.space == "embedding" else None))
        size = list(img.image.size) if img is not None else None
        token_ids = text = None
        if res.space == "embedding":
            token_ids = [int(t) for t in ids[i].reshape(-1).tolist()]
            batch_text = getattr(batch, "text", None) if batch is not None else None
            if batch_text is not None:  # the text and its real tokens (issue 42: pictures name them)
                text = TextTokens(text=batch_text.texts[i], tokens=batch_text.tokens[i])
        return image_entry(index=index, name=name, size=size, targets=[int(t) for t in res.targets[i]],
                           maps=records, token_ids=token_ids, text=text).to_dict()

    def _evaluate(self, res: Any, batch: Any, entries: list[dict[str, Any]]) -> None:
        """Deletion/insertion/ROAD of every map (cam's Evaluator), on the relevance each map
        claims: its channel sum, min-max scaled (higher = more evidence for the target)."""
        from types import SimpleNamespace

        import torch

        if res.space == "embedding":  # token ids: tokens deleted and inserted (issue 42)
            self._evaluate_tokens(res, batch, entries)
            return
        if res.space != "input" or batch.tensor.dim() != 4:
            raise UsageError("--evaluate perturbs image pixels; it needs image inputs (N, C, H, W)")
        maps, probs = [], []
        for i, entry in enumerate(entries):
            probs.append({t: p for t, p in zip(res.targets[i], res.probabilities[i])})
            for rec in entry["maps"]:
                rel = res.maps[rec["method"]][i, rec["rank"]].sum(0)
                lo, hi = rel.min(), rel.max()
                rel = (rel - lo) / (hi - lo) if hi > lo else torch.zeros_like(rel)
                maps.append(SimpleNamespace(sample=i, target=rec["target"]["class"], map=rel))
        assert self.evaluator is not None
        self.evaluator.feed(SimpleNamespace(maps=maps, probabilities=probs), batch, entries)

    def _evaluate_tokens(self, res: Any, batch: Any, entries: list[dict[str, Any]]) -> None:
        """Deletion and insertion of tokens for every map (methods/faithfulness/tokens.py)."""
        from inspect_model.methods.faithfulness.metrics import auc
        from inspect_model.run.evaluate import rank_maps
        from inspect_model.methods.faithfulness.tokens import token_curves
        from inspect_model.methods.objectives.targets import class_probabilities, select_output

        import torch

        model, ids = self.prep.loaded.model, batch.tensor
        tok = getattr(self.prep.plan, "tokenizer", None)
        fill = next((int(v) for v in (getattr(tok, "mask_token_id", None), getattr(tok, "pad_token_id", None))
                     if v is not None), 0)
        lengths = batch.text.lengths if getattr(batch, "text", None) is not None else [int(ids.shape[1])] * len(ids)

        ev = self.evaluator
        assert ev is not None
        ev.metrics = [m for m in ev.metrics if m in ("deletion", "insertion")]  # the curves a text has

        def probability(rows: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                y = select_output(model(rows), self.request.output_key)
            ev.passes, ev.inputs = ev.passes + 1, ev.inputs + int(rows.shape[0])
            return class_probabilities(y.reshape(y.shape[0], -1).double()).cpu()

        steps = 32 if self.request.evaluation.steps == "auto" else int(self.request.evaluation.steps)
        for i, entry in enumerate(entries):
            for rec in entry["maps"]:
                rel = res.maps[rec["method"]][i, rec["rank"]].sum(-1)  # (L,): one value per token
                curves = token_curves(probability, ids[i], lengths[i], rel, int(rec["target"]["class"]), fill, steps)
                rec["evaluation"] = {"scores": {k: auc(v) for k, v in curves.items()}, "curves": curves,
                                     "confidence": {}, "rank": None, "replacement_token": fill}
        rank_maps(entries)

    def finish(self) -> Result:
        from inspect_model.methods.attributions import sanity as san

        skipped = input_outcome(self.prep.plan, self.warnings)
        if not self.entries:
            raise InputError("no input could be read; nothing to do")
        st = self.settings
        payload: dict[str, Any] = {
            "model": self.prep.loaded.name,
            "methods": list(st.methods),
            "smoothed": list(st.smoothed),
            "space": self.found.space,
            "embedding_layer": self.found.embedding_layer,
            "guided_sites": self.found.sites or {},
            "images": self.entries,
            "image_count": len(self.entries),
            "sanity": san.finish(self.sanity_acc),
            "skipped": skipped,
        }
        if self.evaluator is not None:
            payload["evaluation"] = self.evaluator.summary(self.entries, [(m, self.found.embedding_layer or "input")
                                                                          for m in st.methods])
        options = self.resolved_options()
        record = _MapsRecord(self.maps) if self.keep_maps else None
        return Result("attributions", options, payload, self.warnings.to_list(), record=record)

    def resolved_options(self) -> dict[str, Any]:
        return self.prep.options(self.mopts, **self.options_record)

    # --------------------------------------------------------- resume and torchrun
    def state_dict(self) -> dict[str, Any]:
        return {"entries": self.entries, "warnings": self.warnings, "sanity_acc": self.sanity_acc,
                "found": self.found,
                "drawer": self.drawer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entries, self.warnings, self.sanity_acc = list(state["entries"]), state["warnings"], state["sanity_acc"]
        self.found = state["found"]
        self.drawer.load_state_dict(state["drawer"])

    def merge(self, states: list[dict[str, Any]]) -> None:
        from inspect_model.methods.attributions import sanity as san

        self.entries = [e for s in states for e in s["entries"]]
        self.warnings.merge(s["warnings"] for s in states[1:])
        self.found = next((s["found"] for s in states if s["found"].space is not None), self.found)
        acc = None
        for s in states:
            if s.get("sanity_acc"):
                acc = san.merge(acc, s["sanity_acc"])
        self.sanity_acc = acc
        self.drawer.merge([s["drawer"] for s in states])


class _MapsRecord:
    """What the API result adds for Python users: the maps, method -> (N, K, *sample)."""

    def __init__(self, parts: list[dict[str, Any]]) -> None:
        import torch

        self.maps = {m: torch.cat([p[m] for p in parts]) for m in parts[0]} if parts else {}


@command(
    "attributions",
    usage="attributions MODEL IMAGE...",
    order=70,
    summary=("saliency, gradient, input x gradient, integrated gradients, SmoothGrad, VarGrad, "
             "occlusion, guided backprop (equal to captum's), batched and bounded in memory"),
    help=("Input attributions: saliency, gradient, input x gradient, integrated gradients, "
          "SmoothGrad, VarGrad, occlusion and guided backprop, equal to "
          "captum's.\n\nIntegrated-gradients steps, SmoothGrad samples and occlusion windows run "
          "through the model in chunks of --batch-size rows (memory does not grow with --steps "
          "or --samples); saliency, gradient and input x gradient share one backward pass. Token "
          "ids are attributed at the output of the embedding layer that reads them. With "
          "--output-dir: per map a heat map (signed maps on a diverging colormap centred on 0) "
          "and an overlay, contact sheets of images x methods, and in the report each map's "
          "positive and negative mass and, for integrated gradients, the completeness gap. "
          "--evaluate ranks the methods by faithfulness; --sanity runs the weight-randomisation "
          "test for every method. With --text on a language model, --generate N attributes each "
          "generated token to the prompt and the tokens before it (README 'Language models')."),
    example=("inspect-model attributions resnet50 cat.jpg --method saliency --method "
             "integrated-gradients --steps 64 -o attr"),
    renderer=render_result,
    tables=attributions_tables,
    methods=attribution_names,
    schema="attributions.json",
    report=AttributionsReport,
    hooks=False,
    gradients=True,
    scores=True,
    resumable=True,
    text=True,
)
@api_command(AttributionsRequest, positional=("target",))
def attributions(model: Any, images: Any, request: AttributionsRequest, call: Call) -> Result:
    """Attribution maps of ``images`` (paths, or a tensor (N, C, H, W), or token ids) under
    ``model``, with the options of :class:`AttributionsRequest` (``methods=["saliency",
    "integrated-gradients"]``, ``steps=64``, ...; ``target`` may come third). The result has
    ``maps`` (method -> (N, K, *sample)) when kept (the API default), ``to_dict()`` and
    ``save(dir)``."""
    session: Any = AttributionsSession
    if request.generates:  # attribution over a generation (issue 36): api/attributions/generation.py
        from inspect_model.api.attributions.generation import GenerationSession, check_generation_inputs

        check_generation_inputs(images, call.inputs)
        session = GenerationSession
    return call.run_images("attributions", model, images, request, lambda prep, mopts, keep: session(
        prep, mopts, request, keep_maps=keep, notes=call.notes, progress=call.progress))