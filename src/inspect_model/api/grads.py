"""``grads``: gradient flow, gradient-health checks, and gradients between layers, as a session.

Files (drawn by :mod:`inspect_model.render.draw_gradients`): ``grad_flow.png`` and
``grad_histograms_NNN.png`` at the top; with ``of``/``wrt``, one Jacobian figure per batch.
Failed checks of ``fail_on`` are listed in ``Result.failures`` (the CLI exits 1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from inspect_model.run import option_groups as og
from inspect_model.run.option_groups import Layers
from inspect_model.run.options import ModelOptions
from inspect_model.run.call import Call
from inspect_model.run.request import (
    DEPTH_HELP,
    MAX_DETECTIONS_HELP,
    SCORE_THRESHOLD_HELP,
    Request,
    api_command,
    option,
    positive,
)
from inspect_model.run.resume import count
from inspect_model.run.objective_options import one_target
from inspect_model.run.session import ImageItem, Result, Session, Warnings, input_outcome
from inspect_model.errors import InputError, UsageError
from inspect_model.registry import command
from inspect_model.reports.grads import GradsReport
from inspect_model.render import html_columns, results


@dataclass(frozen=True)
class GradsRequest(Request):
    """The options of ``grads``; validated once, here."""

    command: ClassVar[str] = "grads"
    groups: ClassVar[tuple[Any, ...]] = (Layers,)

    target: str | tuple[str, ...] | None = og.target(None, help="Differentiate a class score: predicted "
                                                         "(default), a class index or name, or top:K (the sum of "
                                                         "the K best scores), as output.backward(one_hot).")
    loss: str | None = option(None, "--loss", type=str, help="Differentiate a loss instead, summed over inputs: "
                              "cross-entropy (needs --true-label/--true-labels), mse (against the label's one-hot, "
                              "or zeros without a label), or sum (of every output element).")
    label: str | None = option(None, "--true-label", "--label", type=str, help="True class (index or name) of "
                               "every input, for --loss.")
    labels_file: Any = option(None, "--true-labels", "--labels-file", type=Path, help="File with one true class "
                              "per image (index or name per line), for --loss.")
    output_key: str | None = og.output_key()
    layers: tuple[str, ...] = og.layers()
    depth: int | None = option(None, "--depth", type=int, help=DEPTH_HELP)
    clip_norm: float | None = option(None, "--clip-norm", type=float, help="Report what "
                                     "clip_grad_norm_(max_norm=X) would do.")
    vanishing_below: float = option(1e-5, "--vanishing-below", help="Vanishing: a layer's output-gradient norm / "
                                    "the largest layer's is below this.")
    exploding_above: float = option(1e4, "--exploding-above", help="Exploding: a layer's output-gradient norm / "
                                    "the model output's gradient norm is above this.")
    fail_on: str | None = option(None, "--fail-on", type=str, help="Exit 1 if one of these checks fails: "
                                 "nan,inf,vanishing,exploding (comma-separated) or all.")
    of: str | None = option(None, "--of", type=str, help="Gradient of: a layer's output (ones vector), 'output' "
                            "(the model output) or 'score' (the --target score). Default with --wrt: score.")
    wrt: str | None = option(None, "--wrt", type=str, help="... with respect to: a layer's output or 'input'. "
                             "Default with --of: input.")
    jacobian_norm: bool = option(False, "--jacobian-norm", help="Estimate ||d(of)/d(wrt)||_F with Gaussian "
                                 "probes, with its standard error.")
    probes: int = option(16, "--probes", help="Number of random probes for --jacobian-norm.")
    score_threshold: float | None = option(None, "--score-threshold", type=float, help=SCORE_THRESHOLD_HELP)
    max_detections: int = option(10, "--max-detections", help=MAX_DETECTIONS_HELP)

    def validate(self) -> None:
        from inspect_model.methods.objectives.scores import check_dense_options

        check_dense_options(self.score_threshold, self.max_detections)
        if isinstance(self.label, int) and not isinstance(self.label, bool):
            self._set("label", str(self.label))
        positive(self.depth, "--depth", zero=True)
        if self.between:
            for flag, on in (("--loss", self.loss), ("--true-label", self.label),
                             ("--true-labels", self.labels_file), ("--clip-norm", self.clip_norm),
                             ("--fail-on", self.fail_on), ("--layer", self.layers)):
                if on:
                    raise UsageError(f"{flag} does not apply with --of/--wrt (gradients between layers); drop it")
        else:
            if self.jacobian_norm:
                raise UsageError("--jacobian-norm needs --of LAYER and/or --wrt LAYER")
            from inspect_model.methods.gradients.flow import validate_request

            validate_request(target=self.target, loss=self.loss,
                             has_labels=self.label is not None or self.labels_file is not None,
                             clip_norm=self.clip_norm, vanishing_below=self.vanishing_below,
                             exploding_above=self.exploding_above, fail_on=self.fail_on)
        if self.probes < 2:
            raise UsageError(f"--probes must be 2 or more, got {self.probes}")

    @property
    def between(self) -> bool:
        """Gradients between layers (``--of``/``--wrt``) rather than the gradient report."""
        return self.of is not None or self.wrt is not None


class GradsSession(Session):
    """Layer and parameter gradients merged over every batch (``gradients`` streams itself)."""

    command = "grads"

    def __init__(self, prep: Any, mopts: ModelOptions, request: GradsRequest, *, histograms: bool = False,
                 notes: Any = None, progress: Any = None) -> None:
        from inspect_model.methods.objectives.scores import task_objective

        r = self.request = request
        label, labels_file = r.label, r.labels_file
        self.prep, self.mopts = prep, mopts
        # A detector's or segmenter's scores (issue 24); None for a classifier.
        self.objective = task_objective(prep.loaded, one_target(prep, r.target), prep.categories,
                                        score_threshold=r.score_threshold, max_detections=r.max_detections,
                                        refuse={"--loss": r.loss, "--true-label": label, "--true-labels": labels_file})
        self.kw = dict(layers=list(r.layers) or None, depth=r.depth, target=r.target, loss=r.loss,
                       output_key=r.output_key, clip_norm=r.clip_norm, vanishing_below=r.vanishing_below,
                       exploding_above=r.exploding_above, fail_on=r.fail_on, histograms=histograms)
        self.label, self.labels_file = label, labels_file
        self.labels_source = None if labels_file is None else str(labels_file)  # in --resume's options hash
        self.progress = progress
        self.notes = notes or (lambda text: None)
        self.report: Any = None
        self.grad_run: Any = None
        self.partial: Any = None  # a GradPartial to go on from (a resumed run, or the merge of every shard)
        self.count = 0
        self.media: dict[str, dict[str, Any]] = {}  # image -> its clip / pair record
        self.warnings = Warnings()
        from inspect_model.render.draw_gradients import GradsDrawer

        self.drawer = GradsDrawer()
        from inspect_model.methods.token_positions import position_stats

        self.positions = position_stats(prep, list(r.layers) or None, gradients=True)  # --text (issue 26)

    def _positions(self) -> Any:
        import contextlib

        return self.positions if self.positions is not None else contextlib.nullcontext()

    def run(self, batches: Iterable[Any], handle: Callable[[ImageItem], None]) -> None:
        self.grad_run = self._grad_run(handle)
        with self._positions():
            self.grad_run.run(self._texts(batches))

    def _texts(self, batches: Iterable[Any]) -> Iterator[Any]:
        """``batches``, keeping each text's record (``--text``) for its report entry."""
        for b in batches:
            text = getattr(b, "text", None)
            for i, name in enumerate(b.names if text is not None else ()):
                self.media[str(name)] = {"text": {"text": text.texts[i], "tokens": list(text.tokens[i])}}
            yield b

    def _grad_run(self, handle: Callable[[ImageItem], None] | None = None) -> Any:
        from inspect_model.methods.gradients.objective import read_labels_file
        from inspect_model.methods.gradients.flow import GradRun
        from inspect_model.methods.gradients.entries import sample_entry

        cats = self.prep.categories
        lab: Any = self.label
        if self.labels_file is not None:
            lab = read_labels_file(str(self.labels_file), cats)

        def on_batch(samples: list[Any]) -> None:
            for s in samples:
                item = ImageItem(sample_entry(s, self.count).to_dict())
                if handle is not None:
                    handle(item)  # a clip's or pair's record joins the entry there (run/media.py)
                self._keep_media(item.entry)
                self.count += 1

        # Under torchrun or --resume (run/runner.py), ``partial`` holds what this shard
        # or the killed run had summed, and ``index_base`` is the run index of its first image.
        run = GradRun(self.prep.loaded.model, labels=lab, categories=cats, on_batch=on_batch,
                      partial=self.partial, label_base=self.index_base, progress=self.progress,
                      objective=self.objective, **self.kw)
        binding = getattr(self.prep, "binding", None)
        if getattr(binding, "scoring", False) and self.kw["loss"] is None:  # a task's objective (issue 42)
            run.words = f"{binding.adapter.words}; target '{self.kw['target'] or 'predicted'}'"
        return run

    def _keep_media(self, entry: dict[str, Any]) -> None:
        """A clip's or flow pair's record (``clip``/``pair``), for the report's entry too."""
        extra = {k: entry[k] for k in ("clip", "pair") if k in entry}
        if extra:
            self.media[str(entry["image"])] = {**self.media.get(str(entry["image"]), {}), **extra}

    def snapshot(self) -> Any:
        """What has been summed so far (gradients on the CPU): a checkpoint or a shard's part."""
        if self.grad_run is not None:
            return self.grad_run.snapshot()
        from inspect_model.methods.gradients.flow import GradPartial

        return self.partial if self.partial is not None else GradPartial()

    def finish(self) -> Result:
        from inspect_model.methods.gradients.entries import grads_payload

        self.grad_run = self.grad_run or self._grad_run()
        if self.partial is not None:  # resumed, or every shard's merged on rank 0 (run/runner.py)
            self.grad_run.partial = self.partial
        self.report = rep = self.grad_run.report()
        for note in rep.notes:
            self.notes(note)
        self.warnings.extend(rep.warnings)
        empty = self.objective.empty_warning() if self.objective is not None else None
        if empty is not None:
            self.warnings.add(empty)
        skipped = input_outcome(self.prep.plan, self.warnings)
        failed = rep.failures()
        failures = []
        if failed:
            more = f" (also failed: {', '.join(f.name for f in failed[1:])})" if len(failed) > 1 else ""
            failures = [f"gradient check '{failed[0].name}' failed: {failed[0].detail}{more}"]
        payload = {**grads_payload(rep), "skipped": skipped}
        for e in payload.get("images", []):
            e.update(self.media.get(str(e["image"]), {}))
        if self.positions is not None:
            payload["positions"] = self.positions.report()
        return Result("grads", self.resolved_options(), payload, self.warnings.to_list(), failures=failures, record=rep)

    def resolved_options(self) -> dict[str, Any]:
        kw = self.kw
        return self.prep.options(
            self.mopts, layers=kw["layers"] or [], depth=kw["depth"],
            target=list(kw["target"]) if isinstance(kw["target"], tuple) else kw["target"], loss=kw["loss"],
            label=self.label, labels_file=str(self.labels_file) if self.labels_file else None,
            output_key=kw["output_key"], clip_norm=kw["clip_norm"], vanishing_below=kw["vanishing_below"],
            exploding_above=kw["exploding_above"], fail_on=kw["fail_on"],
            score_threshold=self.request.score_threshold, max_detections=self.request.max_detections)

    # ------------------------------------------------------------------ resumable, mergeable
    def start(self, index: int, batch: int, rank: int) -> None:
        super().start(index, batch, rank)  # the labels of --labels-file of this shard start there
        self.count = index

    def state_dict(self) -> dict[str, Any]:
        return {"partial": self.snapshot(), "count": self.count, "warnings": self.warnings, "media": self.media,
                "positions": self.positions.state_dict() if self.positions is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from inspect_model.methods.gradients.flow import GradPartial

        if not isinstance(state["partial"], GradPartial) or not isinstance(state["warnings"], Warnings):
            raise TypeError("grads state: not a GradPartial")
        from inspect_model.run.state_check import check_tensor_shapes

        params = {n: tuple(p.shape) for n, p in self.prep.loaded.model.named_parameters() if p.requires_grad}
        check_tensor_shapes(state["partial"].grads, params, "the summed gradient of parameter")
        self.partial, self.warnings = state["partial"], state["warnings"]
        self.count = count(state["count"], "the image count")
        self.media = dict(state.get("media") or {})
        if self.positions is not None and state.get("positions") is not None:
            self.positions.merge([state["positions"]])

    def merge(self, states: list[dict[str, Any]]) -> None:
        from inspect_model.methods.gradients.flow import merge_partials

        self.partial = merge_partials([st["partial"] for st in states])
        self.media = {k: v for st in states for k, v in (st.get("media") or {}).items()}
        if self.positions is not None:
            self.positions.merge([st["positions"] for st in states if st.get("positions") is not None])
        self.warnings.merge(st["warnings"] for st in states[1:])

    def reduce(self, group: Any) -> None:
        """Every rank's summed parameter gradients, added on rank 0 (dropped elsewhere).

        A single process sums every batch's parameter gradients into ``.grad``; each rank
        sums its own batches the same way, and this adds the ranks' sums on rank 0 with
        ``torch.distributed.reduce``: the global norm, clipping and parameter statistics
        are then those of one process over every image."""
        if group.dist is None or self.grad_run is None:
            return
        import torch

        dist = group.dist
        part = self.grad_run.partial
        nccl = dist.get_backend() == "nccl"
        device = torch.device(f"cuda:{group.w.local_rank}" if nccl else "cpu")
        trainable = [(n, p) for n, p in self.prep.loaded.model.named_parameters() if p.requires_grad]
        has = torch.tensor([1 if n in part.grads else 0 for n, _ in trainable], dtype=torch.int32, device=device)
        dist.all_reduce(has, op=dist.ReduceOp.MAX)  # a rank with no image has no gradient at all
        summed: dict[str, Any] = {}
        for (n, p), flag in zip(trainable, has.tolist()):
            if not flag:
                continue
            g = part.grads.get(n)
            t = (torch.zeros_like(p, device=device) if g is None else g.detach().to(device, copy=True)).contiguous()
            dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)
            if group.rank == 0:
                summed[n] = t
        part.grads = summed


class JacobianSession(Session):
    """d(of)/d(wrt) between inner layers, per batch (``--of``/``--wrt``)."""

    command = "grads"
    streams_files = True

    def __init__(self, prep: Any, mopts: ModelOptions, request: GradsRequest) -> None:
        r = self.request = request
        self.prep, self.mopts = prep, mopts
        self.of, self.wrt = r.of or "score", r.wrt or "input"
        self.target, self.output_key, self.norm, self.probes = r.target, r.output_key, r.jacobian_norm, r.probes
        self.results: list[Any] = []
        self.count = 0
        self.batch = 0
        self.warnings = Warnings()
        from inspect_model.render.draw_gradients import JacobianDrawer

        self.drawer = JacobianDrawer()

    def check_scalable(self, what: str) -> None:
        raise UsageError(f"grads --of/--wrt does not support {what}: its per-batch Jacobian estimates "
                         "(random probes, one figure per batch) are not merged across processes or runs; "
                         "run it in one process, or drop --of/--wrt")

    def feed(self, batch: Any) -> list[ImageItem]:
        from inspect_model.methods.gradients.jacobian import jacobian

        target = self.target
        if isinstance(target, tuple):  # one class per sample: this batch's share
            n = int(batch.tensor.shape[0])
            target = target[self.count:self.count + n]
            if len(target) != n:
                raise InputError(f"the per-sample target names {len(self.target)} class(es) but there are more "
                                 "inputs; give one class per input")
        res = jacobian(self.prep.loaded.model, batch.tensor, of=self.of, wrt=self.wrt, target=target,
                       output_key=self.output_key, categories=self.prep.categories, norm=self.norm,
                       probes=self.probes, seed=self.prep.plan.seed + self.batch, names=batch.names)
        items = []
        for r in res:
            for i, name in enumerate(r.names):
                entry = {"index": self.count, "image": name, "of": r.of, "wrt": r.wrt,
                         "vjp_norm": r.sample_norms[i] if i < len(r.sample_norms) else None,
                         "frobenius_sq": r.sample_norm_sq[i] if i < len(r.sample_norm_sq) else None, "files": {}}
                self.count += 1
                # The batch's map figure is drawn with its first image, then dropped.
                items.append(ImageItem(entry, (self.batch, r) if i == 0 and r.grad_map is not None else None))
        self.results.extend(res)
        self.batch += 1
        return items

    def line(self, item: ImageItem) -> dict[str, Any]:
        return item.entry

    def finish(self) -> Result:
        from inspect_model.methods.gradients.entries import jacobian_payload

        for r in self.results:
            r.grad_map = None  # drawn; not kept
        payload = jacobian_payload(self.results)
        payload["images"] = []
        payload["image_count"] = self.count
        return Result("grads", self.resolved_options(), payload, self.warnings.to_list(),
                      record=JacobianRecord(self.results), view="grads-jacobian")

    def resolved_options(self) -> dict[str, Any]:
        target = list(self.target) if isinstance(self.target, tuple) else self.target
        return self.prep.options(self.mopts, layers=[], target=target, output_key=self.output_key, of=self.of,
                                 wrt=self.wrt, jacobian_norm=self.norm, probes=self.probes)


class JacobianRecord:
    """What a ``grads --of/--wrt`` result holds: one Jacobian record per batch."""

    def __init__(self, results: list[Any]) -> None:
        self.results = results


@command(
    "grads",
    usage="grads MODEL [IMAGE...]",
    order=40,
    summary=("per-layer and per-parameter gradients, gradient flow, NaN/vanishing/exploding "
             "checks for CI, gradients between layers"),
    help=("Gradient flow and gradient health: per layer the gradient wrt its output and wrt its "
          "input, per parameter its gradient statistics, the global norm, and checks for NaN, "
          "Inf, vanishing and exploding gradients (--fail-on exits 1 for CI).\n\nWith --of A "
          "--wrt B: the gradient of one layer's output with respect to another's, and with "
          "--jacobian-norm an estimate of the Jacobian's Frobenius norm."),
    example=("inspect-model grads resnet18 cat.jpg --weights none --fail-on nan,inf,exploding "
             "--output-dir g"),
    renderer=results.grads_report,
    tables=html_columns.grads_tables,
    schema="grads.json",
    report=GradsReport,
    gradients=True,
    parameter_gradients=True,
    scores=True,
    objective=True,
    resumable=True,
    text=True,
)
@api_command(GradsRequest)
def grads(model: Any, images: Any, request: GradsRequest, call: Call) -> Result:
    """Gradient statistics per layer and parameter and the health checks (or, with ``of``/
    ``wrt``, d(of)/d(wrt) between layers), with the options of :class:`GradsRequest` as
    keywords. ``result.failures`` lists failed ``fail_on`` checks."""
    if request.between and call.tensorboard is not None:
        raise UsageError("--tensorboard does not apply with --of/--wrt (gradients between layers); drop it")

    def session(prep: Any, mopts: ModelOptions, keep: bool) -> Session:
        if request.between:
            return JacobianSession(prep, mopts, request)
        return GradsSession(prep, mopts, request, notes=call.notes, progress=call.progress,
                            histograms=call.output_dir is not None or call.tensorboard is not None or keep)

    return call.run_images("grads", model, images, request, session)

