"""``grads``: gradient flow, gradient-health checks, and gradients between layers, as a session.

Files (drawn by :mod:`inspect_model.render.draw_gradients`): ``grad_flow.png`` and
``grad_histograms_NNN.png`` at the top; with ``of``/``wrt``, one Jacobian figure per batch.
Failed checks of ``fail_on`` are listed in ``Result.failures`` (the CLI exits 1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from inspect_model.api.options import InputOptions, ModelOptions
from inspect_model.api.pipeline import execute, prepare, tracked
from inspect_model.api.resume import count
from inspect_model.api.session import ImageItem, Result, Session, Warnings, input_outcome
from inspect_model.errors import UsageError


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
                 histograms: bool = False, notes: Any = None, progress: Any = None) -> None:
        if depth is not None and depth < 0:
            raise UsageError(f"--depth must be 0 or more, got {depth}")
        self.prep, self.mopts = prep, mopts
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
        from inspect_model.render.draw_gradients import GradsDrawer

        self.drawer = GradsDrawer()

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

        # Under torchrun or --resume (api/runner.py), ``partial`` holds what this shard
        # or the killed run had summed, and ``index_base`` is the run index of its first image.
        return GradRun(self.prep.loaded.model, labels=lab, categories=cats, on_batch=on_batch,
                       partial=self.partial, label_base=self.index_base, progress=self.progress, **self.kw)

    def snapshot(self) -> Any:
        """What has been summed so far (gradients on the CPU): a checkpoint or a shard's part."""
        if self.grad_run is not None:
            return self.grad_run.snapshot()
        from inspect_model.methods.gradients import GradPartial

        return self.partial if self.partial is not None else GradPartial()

    def finish(self) -> Result:
        from inspect_model.render import gradients as render

        self.grad_run = self.grad_run or self._grad_run()
        if self.partial is not None:  # resumed, or every shard's merged on rank 0 (api/runner.py)
            self.grad_run.partial = self.partial
        self.report = rep = self.grad_run.report()
        for note in rep.notes:
            self.notes(note)
        skipped = input_outcome(self.prep.plan, self.warnings)
        failed = rep.failures()
        failures = []
        if failed:
            more = f" (also failed: {', '.join(f.name for f in failed[1:])})" if len(failed) > 1 else ""
            failures = [f"gradient check '{failed[0].name}' failed: {failed[0].detail}{more}"]
        return Result("grads", self.resolved_options(), {**render.to_payload(rep), "skipped": skipped},
                      self.warnings.to_list(), failures=failures, record=rep)

    def resolved_options(self) -> dict[str, Any]:
        kw = self.kw
        return self.prep.options(
            self.mopts, layers=kw["layers"] or [], depth=kw["depth"], target=kw["target"], loss=kw["loss"],
            label=self.label, labels_file=str(self.labels_file) if self.labels_file else None,
            output_key=kw["output_key"], clip_norm=kw["clip_norm"], vanishing_below=kw["vanishing_below"],
            exploding_above=kw["exploding_above"], fail_on=kw["fail_on"])

    # ------------------------------------------------------------------ resumable, mergeable
    def start(self, index: int, batch: int, rank: int) -> None:
        super().start(index, batch, rank)  # the labels of --labels-file of this shard start there
        self.count = index

    def state_dict(self) -> dict[str, Any]:
        return {"partial": self.snapshot(), "count": self.count, "warnings": self.warnings}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from inspect_model.methods.gradients import GradPartial

        if not isinstance(state["partial"], GradPartial) or not isinstance(state["warnings"], Warnings):
            raise TypeError("grads state: not a GradPartial")
        self.partial, self.warnings = state["partial"], state["warnings"]
        self.count = count(state["count"], "the image count")

    def merge(self, states: list[dict[str, Any]]) -> None:
        from inspect_model.methods.gradients import merge_partials

        self.partial = merge_partials([st["partial"] for st in states])
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
        from inspect_model.render.draw_gradients import JacobianDrawer

        self.drawer = JacobianDrawer()

    def check_scalable(self, what: str) -> None:
        raise UsageError(f"grads --of/--wrt does not support {what}: its per-batch Jacobian estimates "
                         "(random probes, one figure per batch) are not merged across processes or runs; "
                         "run it in one process, or drop --of/--wrt")

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

    def line(self, item: ImageItem) -> dict[str, Any]:
        return item.entry

    def finish(self) -> Result:
        from inspect_model.render import gradients as render

        for r in self.results:
            r.grad_map = None  # drawn; not kept
        payload = render.jacobian_payload(self.results)
        payload["images"] = []
        payload["image_count"] = self.count
        return Result("grads", self.resolved_options(), payload, self.warnings.to_list(),
                      record=JacobianRecord(self.results), view="grads-jacobian")

    def resolved_options(self) -> dict[str, Any]:
        return self.prep.options(self.mopts, layers=[], target=self.target, output_key=self.output_key, of=self.of,
                                 wrt=self.wrt, jacobian_norm=self.norm, probes=self.probes)


class JacobianRecord:
    """What a ``grads --of/--wrt`` result holds: one Jacobian record per batch."""

    def __init__(self, results: list[Any]) -> None:
        self.results = results


def grads(model: Any, images: Any = None, *, target: str | None = None, loss: str | None = None,
          label: str | None = None, labels_file: str | Path | None = None, output_key: str | None = None,
          layers: list[str] | None = None, depth: int | None = None, clip_norm: float | None = None,
          vanishing_below: float = 1e-5, exploding_above: float = 1e4, fail_on: str | None = None,
          of: str | None = None, wrt: str | None = None, jacobian_norm: bool = False, probes: int = 16,
          model_options: ModelOptions | None = None, inputs: InputOptions | None = None, output_dir: Any = None,
          force: bool = False, tensorboard: Any = None, keep: bool | None = None, on_item: Any = None,
          notes: Any = None, progress: Any = None) -> Result:
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
                               notes=notes, progress=progress)
    total = len(prep.plan.paths) if prep.plan.paths else 0
    return execute(session, tracked(prep.plan.batches(), total, progress), output_dir=output_dir, force=force,
                   keep=keep, tensorboard=tensorboard, on_item=on_item)
