"""The files of ``grads``: ``grad_flow.png`` and ``grad_histograms_NNN.png`` (every layer,
paginated) at the top, TensorBoard scalars and histograms; with ``--of``/``--wrt``,
``jacobian_<of>_wrt_<wrt>_NNNN.png`` per batch.
"""

from __future__ import annotations

from typing import Any

from inspect_model.output.files import safe_name
from inspect_model.output.sink import Drawer, Sink


class GradsDrawer(Drawer):
    """The run's pictures of a :class:`inspect_model.methods.gradients.flow.GradReport` (``result.record``)."""

    def draw_summary(self, sink: Sink, result: Any) -> None:
        from inspect_model.render import gradients as render

        rep = result.record
        if sink.writer is not None:
            write_tensorboard(sink.writer, rep)
        if sink.out is None:
            return
        sink.figure("grad_flow.png", render.flow_figure(rep), dpi=render.FIG_DPI)
        for i, page in enumerate(render.histogram_pages(rep)):
            sink.image(f"grad_histograms_{i + 1:03d}.png", page)


class JacobianDrawer(Drawer):
    """One figure per batch of d(of)/d(wrt), drawn with the batch's first image."""

    def draw(self, item: Any, sink: Sink) -> dict[str, Any]:
        from inspect_model.render import gradients as render

        if item.data is None or sink.out is None:
            return item.entry.get("files", {})
        b, r = item.data
        name = sink.figure(f"jacobian_{safe_name(r.of)}_wrt_{safe_name(r.wrt)}_{b:04d}.png",
                           render.jacobian_figure(r), dpi=render.FIG_DPI)
        return {"jacobian": name}


def write_tensorboard(writer: Any, rep: Any) -> None:
    """Scalars (norms) and histograms of log10|grad| (raw buckets) for layers and parameters."""
    writer.add_scalar("grads/global_norm", rep.global_norm, 0)
    writer.add_scalar("grads/output_grad_norm", rep.output_grad_norm, 0)

    def hist(tag: str, h: Any) -> None:
        num = sum(h.counts)
        if num:  # the bucket edges of methods.gradients.stats.LogHist, asked of the record (render/ imports no methods/)
            writer.add_histogram_raw(tag, min=h.min, max=h.max, num=num, sum=h.sum, sum_squares=h.sum_squares,
                                     bucket_limits=type(h).edges()[1:], bucket_counts=h.counts, global_step=0)

    for r in rep.layers:
        if r.grad_output is not None:
            writer.add_scalar(f"grads/layer/{r.key}/output_grad_norm", r.grad_output.norm, 0)
            hist(f"grads/layer/{r.key}/log10_abs_output_grad", r.hist)
    for p in rep.params:
        if p.has_grad:
            writer.add_scalar(f"grads/param/{p.name}/norm", p.norm, 0)
            hist(f"grads/param/{p.name}/log10_abs_grad", p.hist)
