"""Gradient flow and gradient health: what ``inspect-model grads`` computes.

One objective is differentiated per run: the score of a target class (``predicted``, a
class, or the K best: a one-hot / K-hot vector on the output, as ``output.backward(one_hot)``
does) or a loss (``cross-entropy`` or ``mse`` against labels, or ``sum`` of the output),
always summed over the images of the run. For each selected layer call we report the
gradient with respect to its OUTPUT and with respect to its INPUT (through that layer
only), captured with tensor hooks by :class:`HookEngine`; for each parameter its gradient
statistics; the global norm and what ``clip_grad_norm_`` would do; and four checks (NaN,
Inf, vanishing, exploding) that ``--fail-on`` turns into exit status 1. The model's own
``.grad`` fields are parked by the engine and given back untouched.

Definitions used by the checks (relative, so that the loss scale does not matter):
  * relative norm of a layer = ||dObjective/d(layer output)|| / the largest such norm;
    ``vanishing`` fails when some reached layer's relative norm is below ``vanishing_below``.
  * gain of a layer = ||dObjective/d(layer output)|| / ||dObjective/d(model output)||: how
    much the gradient grew between the output and that layer; ``exploding`` fails when the
    largest gain exceeds ``exploding_above``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from inspect_model.errors import InputError, ModelRuntimeError, one_line
from inspect_model.loading.wrappers import unwrap_module
from inspect_model.methods.gradients.checks import (
    DEFAULT_EXPLODING,
    DEFAULT_VANISHING,
    clip_report,
    first_nonfinite,
    health_checks,
)
from inspect_model.methods.gradients.objective import describe_objective, output_seed, resolve_label
from inspect_model.methods.gradients.records import (  # the records, re-exported (their old home)
    LOSSES,
    GradObs,
    GradPartial,
    GradReport,
    LayerGrad,
    ParamGrad,
    SampleGrad,
    merge_partials,
    validate_request,
)
from inspect_model.methods.gradients.stats import LogHist, log_hist, max_abs, merge_stats
from inspect_model.methods.activations.tokens import over_tokens, real_tokens
from inspect_model.methods.row_stats import SeenGradients, fast_stats, l2_norm
from inspect_model.methods.stats import TensorStats, tensor_stats

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["LOSSES", "GradObs", "GradPartial", "GradReport", "GradRun", "LayerGrad", "ParamGrad", "SampleGrad",
           "gradients", "merge_partials", "validate_request"]

class GradRun:
    """:func:`gradients` in steps: :meth:`run` accumulates batches into :attr:`partial`
    (again and again, or after a restored or merged partial), :meth:`report` turns a
    partial into the report and the checks."""

    def __init__(self, model: nn.Module, *, layers: Sequence[str] | None = None, depth: int | None = None,
                 target: str | None = None, loss: str | None = None,
                 labels: int | str | Sequence[int | str] | None = None, output_key: str | None = None,
                 categories: Sequence[str] | None = None, clip_norm: float | None = None,
                 vanishing_below: float = DEFAULT_VANISHING, exploding_above: float = DEFAULT_EXPLODING,
                 fail_on: str | Sequence[str] | None = None, keep_input_grad: bool = False,
                 histograms: bool = False, on_batch: Callable[[list[SampleGrad]], None] | None = None,
                 partial: GradPartial | None = None, label_base: int = 0,
                 progress: Callable[..., None] | None = None, objective: Any = None) -> None:
        from inspect_model.engine.selection import select_layers
        from inspect_model.methods.objectives.targets import parse_target

        self.fail = validate_request(target=target, loss=loss, has_labels=labels is not None, clip_norm=clip_norm,
                                     vanishing_below=vanishing_below, exploding_above=exploding_above,
                                     fail_on=fail_on)
        self.model, self.target, self.loss, self.output_key = model, target, loss, output_key
        self.clip_norm, self.vanishing_below, self.exploding_above = clip_norm, vanishing_below, exploding_above
        self.keep_input_grad, self.histograms, self.on_batch = keep_input_grad, histograms, on_batch
        self.progress = progress  # progress(done, total, label): the per-layer and per-parameter work
        self._seen = {"done": 0, "total": 0}
        self.objective = objective  # a detector's or segmenter's scores (objectives.py), else None
        self.words: str | None = None  # a task's objective in words (issue 42), set by the grads session
        self.spec = parse_target(target, categories) if loss is None and objective is None else None
        self.categories = categories
        self.label_list: list[int] | None = None
        self.label_one: int | None = None
        if isinstance(labels, (list, tuple)):
            self.label_list = [resolve_label(v, categories) for v in labels]
        elif labels is not None:
            self.label_one = resolve_label(labels, categories)  # type: ignore[arg-type]
        self.label_base = label_base  # the run index of this part's first image (labels of a shard)
        self.names = select_layers(model, layers, depth=depth)
        self.by_name = dict(model.named_modules())
        self.params_all = [(n, p) for n, p in model.named_parameters()]
        self.trainable = [(n, p) for n, p in self.params_all if p.requires_grad]
        if layers:
            prefixes = tuple(f"{n}." for n in self.names if n)
            self.listed = [(n, p) for n, p in self.trainable if n.startswith(prefixes) or "" in self.names]
        else:
            self.listed = self.trainable
        self.partial = partial if partial is not None else GradPartial()
        self.input_grads: list[torch.Tensor] = []
        self.warnings: list[str] = []
        self._live = False
        self._measured = SeenGradients()
        self._mask: torch.Tensor | None = None  # the text batch's attention mask (B, L), if any

    def _observe(self, g: torch.Tensor, n: int, *, hist: bool = True) -> GradObs:
        import torch

        if over_tokens(g, self._mask):  # a text batch: statistics of its real tokens, padding left out
            per = torch.linalg.vector_norm(g.detach().reshape(n, -1), dim=1, dtype=torch.float64).tolist()
            g = real_tokens(g, self._mask)
            stats = tensor_stats(g)
        else:
            stats, per = self._measured.measure(g, n)  # an output gradient seen as the next input's: once
        seq = self.partial.seq
        self.partial.seq += 1
        seen = self._seen
        if self.progress is not None and seen["total"] > 1:
            seen["done"] += 1
            self.progress(min(seen["done"], seen["total"]), seen["total"], "grads: layer gradients")
        return GradObs(seq, stats, _hist(g, stats) if self.histograms and hist else None, per)

    def current_grads(self) -> dict[str, torch.Tensor]:
        """The summed parameter gradients so far (copies; live while :meth:`run` runs)."""
        if not self._live:
            return dict(self.partial.grads)
        return {n: p.grad.detach().clone() for n, p in self.trainable if p.grad is not None}

    def snapshot(self) -> GradPartial:
        """A copy of the partial, gradients on the CPU (a checkpoint, mid-run or after)."""
        import dataclasses

        grads = {n: g.detach().to("cpu", copy=True) for n, g in self.current_grads().items()}
        return dataclasses.replace(self.partial, grads=grads)  # read at once (saved or sent)

    def run(self, inputs: torch.Tensor | Iterable[Any]) -> GradPartial:
        """Differentiate the objective over ``inputs``, adding to :attr:`partial`."""
        from inspect_model.engine.hooks import CaptureOptions, HookEngine, run_forward
        from inspect_model.methods.objectives.targets import select_output

        part = self.partial
        batch_n = [0]
        opts = CaptureOptions(outputs=True, output_grads=True, input_grads=True,
                              grad_stats_fn=lambda g: self._observe(g, batch_n[0]),
                              # histograms are drawn for output gradients only: none for inputs
                              input_grad_stats_fn=lambda g: self._observe(g, batch_n[0], hist=False),
                              grad_enabled=True)
        with HookEngine(self.model, self.names, opts) as eng:
            for n, p in self.trainable:  # a resumed run goes on from the gradients it had summed
                g = part.grads.get(n)
                if g is not None:
                    p.grad = g.detach().to(device=p.device, dtype=p.dtype, copy=True)
            self._live = True
            try:
                for item in _iter_batches(inputs, start=self.label_base + part.images):
                    self._batch(item, eng, batch_n, run_forward, select_output)
            finally:
                # The run's own .grad tensors, not copies: the engine gives the parameters
                # their earlier .grad back on exit, and nothing writes to these any more.
                part.grads = {n: p.grad.detach() for n, p in self.trainable if p.grad is not None}
                self._live = False
                self._measured.clear()
        return part

    def _batch(self, item: tuple[Any, list[str]], eng: Any, batch_n: list[int], run_forward: Any,
               select_output: Any) -> None:
        part, model = self.partial, self.model
        x0, batch_names, self._mask = item
        n = x0.shape[0]
        batch_n[0] = n
        eng.reset()
        x = x0.detach().clone().requires_grad_(x0.is_floating_point())
        # A non-leaf copy: the model may change its input in place (x /= 255), which autograd
        # refuses on a leaf that requires grad; x.grad is still d(objective)/d(input).
        if self.objective is not None:  # detections or segmentation targets (issue 24)
            from inspect_model.methods.objectives.scores import objective_seed

            with self.objective.context():
                out = run_forward(eng, lambda x=x: model(x.clone()))
            y, seed, per_obj, used = objective_seed(self.objective, model, out, x0, batch_names)
        else:
            out = run_forward(eng, lambda x=x: model(x.clone()))
            y, seed, per_obj, used = self._seed(out, n, select_output)
        if seed is not None:
            part.out_sq += float(seed.double().pow(2).sum())
        # Gradients to come in this backward pass: one per captured output and input.
        self._seen["done"], self._seen["total"] = 0, sum(len(r.outputs) + len(r.inputs) for r in eng.records)
        try:
            if y is not None:
                y.backward(seed)
        except RuntimeError as exc:
            msg = one_line(exc)
            raise ModelRuntimeError(f"backward pass failed: {msg}") from exc
        finally:
            self._measured.clear()
        self._after_backward(eng, x, n, batch_names, per_obj, used)

    def _seed(self, out: Any, n: int, select_output: Any) -> tuple[Any, Any, list[float], list[list[int]]]:
        """The output to walk back from, d(objective)/d(output), each input's objective and
        the classes used: the one-hot of a class score, or a loss."""
        from inspect_model.methods.objectives.targets import (
            check_label_count,
            check_score_batch,
            for_batch,
            require_float,
            top_k_warning,
        )

        part = self.partial
        y = select_output(out, self.output_key)
        require_float(y)
        check_score_batch(y, n)
        if self.loss is not None and y.dim() == 2:
            check_label_count(self.categories, int(y.shape[1]))
        if not y.requires_grad:
            raise ModelRuntimeError("the model output does not depend on anything that requires grad "
                                    "(does the model detach or run under torch.no_grad?)")
        label_pos = self.label_base + part.images
        if self.label_list is not None:
            batch_labels: list[int] | None = self.label_list[label_pos:label_pos + n]
            if len(batch_labels) != n:  # type: ignore[arg-type]
                raise InputError(f"--labels-file has {len(self.label_list)} labels but there are more inputs; "
                                 "give one label per image")
        else:
            batch_labels = None if self.label_one is None else [self.label_one] * n
        spec = for_batch(self.spec, label_pos, n)  # a per-sample target: this batch's share
        seed, per_obj, used = output_seed(y, target=spec, loss=self.loss, labels=batch_labels)
        if part.images == 0 and self.loss is None:  # the class count is the same for every batch
            cut = top_k_warning(self.spec, int(y.reshape(n, -1).shape[1]))
            self.warnings += [cut] if cut and cut not in self.warnings else []
        return y, seed, per_obj, used

    def _after_backward(self, eng: Any, x: Any, n: int, batch_names: list[str], per_obj: list[float],
                        used: list[list[int]]) -> None:
        import torch

        part = self.partial
        _merge_batch(part.layers, eng.finalize(), self.by_name)
        layer_norms = {r.key: r for r in eng.records}
        if x.grad is not None:
            fast = fast_stats(x.grad, n)
            part.input_stats = merge_stats(part.input_stats, tensor_stats(x.grad) if fast is None else fast[0])
            in_norms = (fast[1] if fast is not None and fast[1] is not None else
                        torch.linalg.vector_norm(x.grad.detach().reshape(n, -1), dim=1, dtype=torch.float64).tolist())
            if self.keep_input_grad:
                self.input_grads.append(x.grad.detach().clone())
        else:
            in_norms = [0.0] * n
        batch_samples = []
        for i in range(n):
            per_layer: dict[str, float] = {}
            for key, rec in layer_norms.items():
                obs = [c.grad_stats for c in rec.outputs if c.grad_stats is not None]
                vals = [o.sample_norms[i] for o in obs if o.sample_norms is not None]
                if vals:
                    per_layer[key] = math.sqrt(sum(v * v for v in vals))
            batch_samples.append(SampleGrad(
                name=batch_names[i] if i < len(batch_names) else f"input-{self.label_base + part.images + i}",
                targets=used[i], objective=per_obj[i], input_grad_norm=in_norms[i],
                layer_grad_norms=per_layer))
        part.images += n
        part.samples.extend(batch_samples)
        if self.on_batch is not None:
            self.on_batch(batch_samples)

    def report(self, partial: GradPartial | None = None) -> GradReport:
        """The report and the checks of ``partial`` (default: this run's), a whole run's
        (the merge of every part: its images are all the labels')."""
        part = self.partial if partial is None else partial
        if part.images == 0:
            raise InputError("no input to differentiate (every image was skipped?)")
        if self.label_list is not None and part.images != len(self.label_list):
            raise InputError(f"--labels-file has {len(self.label_list)} labels for "
                             f"{part.images} inputs; give one label per image")
        grads = part.grads
        params = []
        for i, (pname, p) in enumerate(self.listed):
            params.append(_param_grad(pname, p, grads.get(pname), self.histograms))
            if self.progress is not None:
                self.progress(i + 1, len(self.listed), "grads: parameter gradients")
        shares = [(n, l2_norm(grads[n]) ** 2) for n, _ in self.trainable if n in grads]
        total = math.sqrt(sum(s for _, s in shares))
        clip = None
        if self.clip_norm is not None:
            clip = clip_report(self.clip_norm, total, shares)
        layer_list = sorted(part.layers.values(), key=lambda r: r.order)
        out_norm = math.sqrt(part.out_sq)
        first = first_nonfinite(layer_list, params)
        checks = health_checks(layer_list, params, out_norm, self.vanishing_below, self.exploding_above)
        for c in checks:
            c.fail_on = c.name in self.fail
        notes = []
        unreached = [r.key for r in layer_list if r.grad_output is None]
        if unreached:
            notes.append(f"{len(unreached)} layer call(s) not reached by the gradient: {', '.join(unreached[:5])}")
        unused = [p.name for p in params if not p.has_grad]
        if unused:
            notes.append(f"{len(unused)} parameter(s) got no gradient (unused by this objective): "
                         f"{', '.join(unused[:5])}")
        return GradReport(
            objective=self.objective.describe() if self.objective is not None
            else self.words or describe_objective(self.target, self.loss), images=part.images, layers=layer_list,
            params=params, frozen_params=len(self.params_all) - len(self.trainable), global_norm=total,
            output_grad_norm=out_norm, input_grad=part.input_stats, checks=checks, clip=clip,
            first_nonfinite=first, samples=part.samples, input_grads=self.input_grads, notes=notes,
            warnings=list(self.warnings),
        )


def gradients(
    model: nn.Module,
    inputs: torch.Tensor | Iterable[Any],
    *,
    layers: Sequence[str] | None = None,
    depth: int | None = None,
    target: str | None = None,
    loss: str | None = None,
    labels: int | str | Sequence[int | str] | None = None,
    output_key: str | None = None,
    categories: Sequence[str] | None = None,
    clip_norm: float | None = None,
    vanishing_below: float = DEFAULT_VANISHING,
    exploding_above: float = DEFAULT_EXPLODING,
    fail_on: str | Sequence[str] | None = None,
    keep_input_grad: bool = False,
    histograms: bool = False,
    on_batch: Callable[[list[SampleGrad]], None] | None = None,
    progress: Callable[..., None] | None = None,
) -> GradReport:
    """Differentiate the objective over ``inputs`` (a tensor, or an iterable of tensors or
    of objects with ``.tensor`` and ``.names``, such as ``InputPlan.batches()``) and report
    layer and parameter gradients and the health checks (see the module docstring).
    Nothing is printed; ``on_batch`` gets each batch's per-input records as it finishes.
    ``histograms`` adds log10|g| histograms per layer and parameter (for plots/TensorBoard).
    ``progress(done, total, label)`` follows the per-layer work of each backward pass and
    the per-parameter statistics. :class:`GradRun` does the same in steps (resumable, mergeable across processes)."""
    model = unwrap_module(model)[0]  # compiled / DataParallel: the module inside (loading/wrappers.py)
    run = GradRun(model, layers=layers, depth=depth, target=target, loss=loss, labels=labels,
                  output_key=output_key, categories=categories, clip_norm=clip_norm,
                  vanishing_below=vanishing_below, exploding_above=exploding_above, fail_on=fail_on,
                  keep_input_grad=keep_input_grad, histograms=histograms, on_batch=on_batch, progress=progress)
    run.run(inputs)
    return run.report()


def _iter_batches(inputs: Any, start: int = 0) -> Iterable[tuple[torch.Tensor, list[str], Any]]:
    """(inputs, names, the attention mask of a text batch or None) per batch."""
    import torch

    if isinstance(inputs, torch.Tensor):
        inputs = [inputs]
    k = start  # the run index of the first input (unnamed tensors are "input-K")
    for item in inputs:
        if isinstance(item, torch.Tensor):
            x, nm = item, [f"input-{k + i}" for i in range(item.shape[0])]
        elif hasattr(item, "tensor"):
            x, nm = item.tensor, list(getattr(item, "names", []))
        else:
            x, nm = item
        if not isinstance(x, torch.Tensor) or x.dim() < 1:
            raise InputError("grads needs a batched input tensor (N, ...)")
        k += x.shape[0]
        text = getattr(item, "text", None)
        yield x, list(nm), getattr(text, "mask", None)


def _merge_batch(acc: dict[str, LayerGrad], records: list[Any], by_name: dict[str, Any]) -> None:
    for r in records:
        rec = acc.get(r.key)
        if rec is None:
            shape = list(r.outputs[0].shape) if len(r.outputs) == 1 else None
            rec = acc[r.key] = LayerGrad(key=r.key, name=r.name, module_type=r.module_type,
                                         call_index=r.call_index, order=r.order, output_shape=shape,
                                         grad_output=None, grad_input=None)
        for where, caps in (("output", r.outputs), ("input", r.inputs)):
            for cap in caps:
                obs: GradObs | None = cap.grad_stats
                if obs is None:
                    continue
                if where == "output":
                    rec.grad_output = merge_stats(rec.grad_output, obs.stats)
                    if obs.hist is not None:
                        rec.hist.add(obs.hist)
                else:
                    rec.grad_input = merge_stats(rec.grad_input, obs.stats)
                if not obs.stats.finite and (rec.first_nonfinite_seq is None or obs.seq < rec.first_nonfinite_seq):
                    rec.first_nonfinite_seq, rec.first_nonfinite_where = obs.seq, where
                for kind, count in (("nan", obs.stats.nan_count), ("inf", obs.stats.inf_count)):
                    if count and (kind not in rec.first_seen or obs.seq < rec.first_seen[kind][0]):
                        rec.first_seen[kind] = (obs.seq, where)


def _hist(g: torch.Tensor, s: TensorStats) -> LogHist:
    """log10|g| histogram, reusing the zero and Inf counts ``tensor_stats`` took (two passes fewer)."""
    if g.is_complex() or not g.is_floating_point():
        return log_hist(g)
    return log_hist(g, zeros=round(s.zero_fraction * s.numel), infs=s.inf_count, nans=s.nan_count)


def _param_grad(name: str, p: torch.Tensor, g: torch.Tensor | None, histograms: bool) -> ParamGrad:
    wn = l2_norm(p)
    if g is None:
        return ParamGrad(name, list(p.shape), False, None, None, None, None, None, None, wn, None)
    s = tensor_stats(g)
    r = s.reported()  # NaN/Inf for a gradient holding them, never its finite part's 0
    return ParamGrad(
        name=name, shape=list(p.shape), has_grad=True, norm=r.norm, mean=r.mean, std=r.std,
        max_abs=max_abs(s), zero_fraction=s.zero_fraction, negative_fraction=s.negative_fraction,
        weight_norm=wn, ratio=r.norm / wn if wn > 0 else None, nan_count=s.nan_count,
        inf_count=s.inf_count, hist=_hist(g, s) if histograms else LogHist(),
    )
