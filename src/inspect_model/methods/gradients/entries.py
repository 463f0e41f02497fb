"""The ``grads`` report's body (modes ``grads`` and ``jacobian``) as typed records (:mod:`inspect_model.reports.grads`),
built from a :class:`~inspect_model.methods.gradients.records.GradReport`: the layers, the
parameters, the checks, clipping and one entry per input (issue 35: built here, not in render/)."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from inspect_model.reports.grads import (
    GradClipping, Grads, GradsCheck, GradsClipShare, GradsImage, GradsLayer, GradsParam, GradStats, Jacobian,
    JacobianPair)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from inspect_model.methods.gradients.jacobian import JacobianResult
    from inspect_model.methods.gradients.records import GradReport, SampleGrad
    from inspect_model.methods.stats import TensorStats


def stats_entry(s: TensorStats | None) -> GradStats | None:
    """A gradient's reported statistics (NaN/Inf as torch computes them; null: not reached)."""
    if s is None:
        return None
    return GradStats(**asdict(s.reported()), max_abs=s.reported_abs_max)


def sample_entry(s: SampleGrad, index: int = 0) -> GradsImage:
    """One input's entry: its targets, its term of the objective and its gradient norms."""
    return GradsImage(index=index, image=s.name, targets=s.targets, objective=s.objective,
                      input_grad_norm=s.input_grad_norm, layer_grad_norms=s.layer_grad_norms)


def grads_body(rep: GradReport) -> Grads:
    """The mode-``grads`` part of the report (mode, warnings and skipped are the session's)."""
    layers = [GradsLayer(key=r.key, name=r.name, type=r.module_type, call_index=r.call_index,
                         output_shape=r.output_shape, grad_wrt_output=stats_entry(r.grad_output),
                         grad_wrt_input=stats_entry(r.grad_input), relative_norm=r.relative_norm, gain=r.gain,
                         reached=r.grad_output is not None) for r in rep.layers]
    params = [GradsParam(name=p.name, shape=p.shape, has_grad=p.has_grad, norm=p.norm, mean=p.mean, std=p.std,
                         max_abs=p.max_abs, zero_fraction=p.zero_fraction, negative_fraction=p.negative_fraction,
                         weight_norm=p.weight_norm, grad_to_weight_ratio=p.ratio, nan_count=p.nan_count,
                         inf_count=p.inf_count) for p in rep.params]
    checks = [GradsCheck(name=c.name, status=c.status, passed=c.status != "fail", value=c.value,
                         threshold=c.threshold, fail_on=c.fail_on, detail=c.detail, layers=c.layers)
              for c in rep.checks]
    clip = None
    if rep.clip is not None:
        c = rep.clip
        clip = GradClipping(max_norm=c.max_norm, total_norm=c.total_norm, clip_coef=c.clip_coef, scale=c.scale,
                              clipped=c.clipped, dominant=[GradsClipShare(parameter=n, share=v) for n, v in c.dominant])
    return Grads(objective=rep.objective, image_count=rep.images, global_grad_norm=rep.global_norm,
                 output_grad_norm=rep.output_grad_norm, input_grad=stats_entry(rep.input_grad), layers=layers,
                 params=params, frozen_params=rep.frozen_params, clip=clip, checks=checks,
                 first_nonfinite=rep.first_nonfinite, notes=rep.notes,
                 images=[sample_entry(s, i) for i, s in enumerate(rep.samples)])


def grads_payload(rep: GradReport) -> dict[str, Any]:
    """The JSON of :func:`grads_body` with its ``mode``."""
    return {"mode": "grads", **grads_body(rep).to_dict()}


def jacobian_payload(results: Sequence[JacobianResult]) -> dict[str, Any]:
    """The mode-``jacobian`` report body: one entry per (of, wrt) pair."""
    body = Jacobian(jacobians=[JacobianPair(
        of=r.of, wrt=r.wrt, images=r.names, of_shape=r.of_shape, wrt_shape=r.wrt_shape, vjp=stats_entry(r.vjp),
        sample_norms=r.sample_norms, targets=r.targets, probes=r.probes, frobenius_sq=r.norm_sq,
        frobenius_sq_se=r.norm_sq_se, frobenius=r.norm, frobenius_se=r.norm_se,
        sample_frobenius_sq=r.sample_norm_sq) for r in results])
    return {"mode": "jacobian", **body.to_dict()}
