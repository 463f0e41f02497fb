"""``grads``: gradient flow, gradient-health checks, and gradients between layers, as a session.

Files: ``grad_flow.png`` and ``grad_histograms_NNN.png`` (every layer, paginated) at the
top; with ``of``/``wrt``, ``jacobian_<of>_wrt_<wrt>_NNNN.png`` per batch. Failed checks of
``fail_on`` are listed in ``Result.failures`` (the CLI exits 1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from inspect_model.api.options import InputOptions, ModelOptions
from inspect_model.api.pipeline import (
    ImageItem,
    Result,
    Session,
    Sink,
    Warnings,
    execute,
    input_outcome,
    prepare,
    tracked,
)
from inspect_model.errors import UsageError
from inspect_model.render.files import safe_name


def check_grads_request(*, target: str | None, loss: str | None, label: str | None, labels_file: Any,
                        clip_norm: float | None, vanishing_below: float, exploding_above: float,
                        fail_on: str | None, layers: list[str] | None, of: str | None, wrt: str | None,
                        jacobian_norm: bool, probes: int, tensorboard: Any = None) -> None:
    if of is not None or wrt is not None:
        for flag, on in (("--loss", loss), ("--label", label), ("--labels-file", labels_file),
                         ("--clip-norm", clip_norm), ("--fail-on", fail_on), ("--layer", layers),
                         ("--tensorboard", tensorboard)):
            if on:
                raise UsageError(f"{flag} does not apply with --of/--wrt (gradients between layers); drop it")
    else:
        if jacobian_norm:
            raise UsageError("--jacobian-norm needs --of LAYER and/or --wrt LAYER")
        from inspect_model.methods.gradients import validate_request

        validate_request(target=target, loss=loss, has_labels=label is not None or labels_file is not None,
                         clip_norm=clip_norm, vanishing_below=vanishing_below, exploding_above=exploding_above,
                         fail_on=fail_on)
    if probes < 2:
        raise UsageError(f"--probes must be 2 or more, got {probes}")


class GradsSession(Session):
    """Layer and parameter gradients merged over every batch (``gradients`` streams itself)."""

    command = "grads"

    def __init__(self, prep: Any, mopts: ModelOptions, *, target: str | None = None, loss: str | None = None,
                 label: str | None = None, labels_file: Any = None, output_key: str | None = None,
                 layers: list[str] | None = None, depth: int | None = None, clip_norm: float | None = None,
                 vanishing_below: float = 1e-5, exploding_above: float = 1e4, fail_on: str | None = None,
                 histograms: bool = False, notes: Any = None, progress: Any = None,
                 score_threshold: float | None = None, max_detections: int = 10) -> None:
        from inspect_model.methods.objectives import task_objective

        if depth is not None and depth < 0:
            raise UsageError(f"--depth must be 0 or more, got {depth}")
        self.prep, self.mopts = prep, mopts
        # A detector's or segmenter's scores (issue 24); None for a classifier.
        self.objective = task_objective(prep.loaded, target, prep.categories, score_threshold=score_threshold,
                                        max_detections=max_detections,
                                        refuse={"--loss": loss, "--label": label, "--labels-file": labels_file})
        self.kw = dict(layers=layers, depth=depth, target=target, loss=loss, output_key=output_key,
                       clip_norm=clip_norm, vanishing_below=vanishing_below, exploding_above=exploding_above,
                       fail_on=fail_on, histograms=histograms)
        self.label, self.labels_file = label, labels_file
        self.labels_source = None if labels_file is None else str(labels_file)  # in --resume's options hash
        self.progress = progress
        self.notes = notes or (lambda text: None)
        self.report: Any = None
        self.grad_run: Any = None
        self.partial: Any = None  # a GradPartial to go on from (a resumed run, or the merge of every shard)
        self.count = 0
        self.warnings = Warnings()

    def run(self, batches: Iterable[Any], handle: Callable[[ImageItem], None]) -> None:
        self.grad_run = self._grad_run(handle)
        self.grad_run.run(batches)

    def _grad_run(self, handle: Callable[[ImageItem], None] | None = None) -> Any:
        from inspect_model.methods.grad_objective import read_labels_file
        from inspect_model.methods.gradients import GradRun
        from inspect_model.render.gradients import sample_payload

        cats = self.prep.categories
        lab: Any = self.label
        if self.labels_file is not None:
            lab = read_labels_file(str(self.labels_file), cats)

        def on_batch(samples: list[Any]) -> None:
            for s in samples:
                if handle is not None:
                    handle(ImageItem(sample_payload(s, self.count)))
                self.count += 1

        # Under torchrun or --resume (api/distributed.py), ``partial`` holds what this shard
        # or the killed run had summed, and ``index_base`` is the run index of its first image.
        return GradRun(self.prep.loaded.model, labels=lab, categories=cats, on_batch=on_batch,
                       partial=self.partial, label_base=self.index_base, progress=self.progress,
                       objective=self.objective, **self.kw)

    def snapshot(self) -> Any:
        """What has been summed so far (gradients on the CPU): a checkpoint or a shard's part."""
        if self.grad_run is not None:
            return self.grad_run.snapshot()
        from inspect_model.methods.gradients import GradPartial

        return self.partial if self.partial is not None else GradPartial()

    def finish(self) -> Result:
        from inspect_model.render import gradients as render
        from inspect_model.render.table import warning_text

        self.grad_run = self.grad_run or self._grad_run()
        if self.partial is not None:  # resumed, or every shard's merged on rank 0 (api/distributed.py)
            self.grad_run.partial = self.partial
        self.report = rep = self.grad_run.report()
        empty = self.objective.empty_warning() if self.objective is not None else None
        if empty is not None:
            self.warnings.add(empty)
        for note in rep.notes:
            self.notes(note)
        plan = self.prep.plan
        skipped = input_outcome(plan, self.warnings)
        kw = self.kw
        options = self.prep.options(
            self.mopts, layers=kw["layers"] or [], depth=kw["depth"], target=kw["target"], loss=kw["loss"],
            label=self.label, labels_file=str(self.labels_file) if self.labels_file else None,
            output_key=kw["output_key"], clip_norm=kw["clip_norm"], vanishing_below=kw["vanishing_below"],
            exploding_above=kw["exploding_above"], fail_on=kw["fail_on"])
        failed = rep.failures()
        failures = []
        if failed:
            more = f" (also failed: {', '.join(f.name for f in failed[1:])})" if len(failed) > 1 else ""
            failures = [f"gradient check '{failed[0].name}' failed: {failed[0].detail}{more}"]
        return Result("grads", options, {**render.to_payload(rep), "skipped": skipped}, self.warnings.to_list(), failures=failures,
                      record=rep,
                      render_text=lambda r: render.render_text(rep) + _lines(warning_text({"warnings": r.warnings})),
                      render_rich=lambda r: [*render.render_rich(rep), *warning_text({"warnings": r.warnings})])

    def draw_summary(self, sink: Sink, result: Result) -> None:
        from inspect_model.render import gradients as render

        rep = self.report
        if sink.writer is not None:
            _write_tensorboard(sink.writer, rep)
        if sink.out is None:
            return
        sink.figure("grad_flow.png", render.flow_figure(rep), dpi=render.FIG_DPI)
        for i, page in enumerate(render.histogram_pages(rep)):
            sink.image(f"grad_histograms_{i + 1:03d}.png", page)


class JacobianSession(Session):
    """d(of)/d(wrt) between inner layers, per batch (``--of``/``--wrt``)."""

    command = "grads"
    streams_files = True

    def __init__(self, prep: Any, mopts: ModelOptions, *, of: str | None, wrt: str | None,
                 target: str | None = None, output_key: str | None = None, jacobian_norm: bool = False,
                 probes: int = 32) -> None:
        self.prep, self.mopts = prep, mopts
        self.of, self.wrt = of or "score", wrt or "input"
        self.target, self.output_key, self.norm, self.probes = target, output_key, jacobian_norm, probes
        self.results: list[Any] = []
        self.count = 0
        self.batch = 0
        self.warnings = Warnings()

    def feed(self, batch: Any) -> list[ImageItem]:
        from inspect_model.methods.jacobian import jacobian

        res = jacobian(self.prep.loaded.model, batch.tensor, of=self.of, wrt=self.wrt, target=self.target,
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

    def draw(self, item: ImageItem, sink: Sink) -> dict[str, Any]:
        from inspect_model.render import gradients as render

        if item.data is None or sink.out is None:
            return item.entry.get("files", {})
        b, r = item.data
        name = sink.figure(f"jacobian_{safe_name(r.of)}_wrt_{safe_name(r.wrt)}_{b:04d}.png",
                           render.jacobian_figure(r), dpi=render.FIG_DPI)
        return {"jacobian": name}

    def line(self, item: ImageItem) -> dict[str, Any]:
        return item.entry

    def finish(self) -> Result:
        from inspect_model.render import gradients as render

        for r in self.results:
            r.grad_map = None  # drawn; not kept
        payload = render.jacobian_payload(self.results)
        payload["images"] = []
        payload["image_count"] = self.count
        options = self.prep.options(self.mopts, layers=[], target=self.target, output_key=self.output_key, of=self.of,
                                    wrt=self.wrt, jacobian_norm=self.norm, probes=self.probes)
        results = self.results
        return Result("grads", options, payload, self.warnings.to_list(), record=None,
                      render_text=lambda r: render.render_jacobian_text(results),
                      render_rich=lambda r: render.render_jacobian_rich(results))


def _lines(lines: list[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


def _write_tensorboard(writer: Any, rep: Any) -> None:
    """Scalars (norms) and histograms of log10|grad| (raw buckets) for layers and parameters."""
    from inspect_model.methods.grad_stats import LogHist

    edges = LogHist.edges()[1:]
    writer.add_scalar("grads/global_norm", rep.global_norm, 0)
    writer.add_scalar("grads/output_grad_norm", rep.output_grad_norm, 0)

    def hist(tag: str, h: Any) -> None:
        num = sum(h.counts)
        if num:
            writer.add_histogram_raw(tag, min=h.min, max=h.max, num=num, sum=h.sum, sum_squares=h.sum_squares,
                                     bucket_limits=edges, bucket_counts=h.counts, global_step=0)

    for r in rep.layers:
        if r.grad_output is not None:
            writer.add_scalar(f"grads/layer/{r.key}/output_grad_norm", r.grad_output.norm, 0)
            hist(f"grads/layer/{r.key}/log10_abs_output_grad", r.hist)
    for p in rep.params:
        if p.has_grad:
            writer.add_scalar(f"grads/param/{p.name}/norm", p.norm, 0)
            hist(f"grads/param/{p.name}/log10_abs_grad", p.hist)


def grads(model: Any, images: Any = None, *, target: str | None = None, loss: str | None = None,
          label: str | None = None, labels_file: str | Path | None = None, output_key: str | None = None,
          layers: list[str] | None = None, depth: int | None = None, clip_norm: float | None = None,
          vanishing_below: float = 1e-5, exploding_above: float = 1e4, fail_on: str | None = None,
          of: str | None = None, wrt: str | None = None, jacobian_norm: bool = False, probes: int = 16,
          model_options: ModelOptions | None = None, inputs: InputOptions | None = None, output_dir: Any = None,
          force: bool = False, tensorboard: Any = None, keep: bool | None = None, on_item: Any = None,
          notes: Any = None, progress: Any = None, score_threshold: float | None = None,
          max_detections: int = 10) -> Result:
    """Gradient statistics per layer and parameter and the health checks (or, with ``of``/
    ``wrt``, d(of)/d(wrt) between layers). ``result.failures`` lists failed ``fail_on`` checks."""
    check_grads_request(target=target, loss=loss, label=label, labels_file=labels_file, clip_norm=clip_norm,
                        vanishing_below=vanishing_below, exploding_above=exploding_above, fail_on=fail_on,
                        layers=layers, of=of, wrt=wrt, jacobian_norm=jacobian_norm, probes=probes,
                        tensorboard=tensorboard)
    mopts = model_options or ModelOptions(model)
    inputs = inputs or InputOptions(images)
    prep = prepare("grads", mopts, inputs, notes=notes)
    keep = output_dir is None if keep is None else keep
    session: Session
    if of is not None or wrt is not None:
        session = JacobianSession(prep, mopts, of=of, wrt=wrt, target=target, output_key=output_key,
                                  jacobian_norm=jacobian_norm, probes=probes)
    else:
        session = GradsSession(prep, mopts, target=target, loss=loss, label=label, labels_file=labels_file,
                               output_key=output_key, layers=layers, depth=depth, clip_norm=clip_norm,
                               vanishing_below=vanishing_below, exploding_above=exploding_above, fail_on=fail_on,
                               histograms=output_dir is not None or tensorboard is not None or keep,
                               notes=notes, progress=progress, score_threshold=score_threshold,
                               max_detections=max_detections)
    total = len(prep.plan.paths) if prep.plan.paths else 0
    return execute(session, tracked(prep.plan.batches(), total, progress), output_dir=output_dir, force=force,
                   keep=keep, tensorboard=tensorboard, on_item=on_item)
