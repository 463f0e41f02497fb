"""``inspect-model grads MODEL [IMAGE ...]``: gradient flow, health checks for CI, and
gradients between inner layers (``--of A --wrt B``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from inspect_model.cli import common as c
from inspect_model.cli.run import InputOptions
from inspect_model.cli.shared import RunOptions, command_run, shared_options

EXAMPLE = "inspect-model grads resnet18 cat.jpg --weights none --fail-on nan,inf,exploding --output-dir g"

GradTargetOpt = Annotated[
    str | None,
    typer.Option("--target", "-t", help="Differentiate a class score: predicted (default), a class index or "
                 "name, or top:K (the sum of the K best scores), as output.backward(one_hot)."),
]
LossOpt = Annotated[
    str | None,
    typer.Option("--loss", help="Differentiate a loss instead, summed over inputs: cross-entropy (needs "
                 "--label/--labels-file), mse (against the label's one-hot, or zeros without a label), "
                 "or sum (of every output element)."),
]
LabelOpt = Annotated[str | None, typer.Option("--label", help="True class (index or name) of every input, for --loss.")]
LabelsFileOpt = Annotated[
    Path | None, typer.Option("--labels-file", help="One true class per image (index or name per line), for --loss.")
]
ClipNormOpt = Annotated[
    float | None, typer.Option("--clip-norm", help="Report what clip_grad_norm_(max_norm=X) would do.")
]
VanishingOpt = Annotated[
    float, typer.Option("--vanishing-below", help="Vanishing: a layer's output-gradient norm / the largest layer's "
                        "is below this.")
]
ExplodingOpt = Annotated[
    float, typer.Option("--exploding-above", help="Exploding: a layer's output-gradient norm / the model "
                        "output's gradient norm is above this.")
]
FailOnOpt = Annotated[
    str | None, typer.Option("--fail-on", help="Exit 1 if one of these checks fails: nan,inf,vanishing,exploding "
                                "(comma-separated) or all.")
]
OfOpt = Annotated[
    str | None, typer.Option("--of", help="Gradient of: a layer's output (ones vector), 'output' (the model "
                                "output) or 'score' (the --target score). Default with --wrt: score.")
]
WrtOpt = Annotated[
    str | None, typer.Option("--wrt", help="... with respect to: a layer's output or 'input'. Default with --of: input.")
]
JacNormOpt = Annotated[
    bool, typer.Option("--jacobian-norm", help="Estimate ||d(of)/d(wrt)||_F with Gaussian probes, with its standard error.")
]
ProbesOpt = Annotated[int, typer.Option("--probes", help="Number of random probes for --jacobian-norm.")]



@shared_options()
def grads(
    model: c.ModelArg,
    images: c.ImagesArg = None,
    target: GradTargetOpt = None,
    loss: LossOpt = None,
    label: LabelOpt = None,
    labels_file: LabelsFileOpt = None,
    output_key: c.OutputKeyOpt = None,
    layers: c.LayersOpt = None,
    depth: c.DepthOpt = None,
    clip_norm: ClipNormOpt = None,
    vanishing_below: VanishingOpt = 1e-5,
    exploding_above: ExplodingOpt = 1e4,
    fail_on: FailOnOpt = None,
    of: OfOpt = None,
    wrt: WrtOpt = None,
    jacobian_norm: JacNormOpt = False,
    probes: ProbesOpt = 16,
    *,
    opts: c.ModelOptions,
    inputs: InputOptions,
    run_opts: RunOptions,
) -> None:
    """Gradient flow and gradient health: per layer the gradient wrt its output and wrt its
    input, per parameter its gradient statistics, the global norm, clipping, and NaN/Inf,
    vanishing and exploding checks (--fail-on makes a failed check exit 1 for CI).
    With --of/--wrt: d(A)/d(B) between inner layers, and --jacobian-norm.
    Example: inspect-model grads resnet18 cat.jpg --weights none --fail-on nan,inf,exploding --output-dir g
    """
    from inspect_model.errors import UsageError

    if label is not None and labels_file is not None:
        raise UsageError("--label and --labels-file both give labels; choose one")
    jac = of is not None or wrt is not None
    if jac:
        for flag, on in (("--loss", loss), ("--label", label), ("--labels-file", labels_file),
                         ("--clip-norm", clip_norm), ("--fail-on", fail_on), ("--layers", layers),
                         ("--tensorboard", run_opts.tensorboard)):
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
    failures: list[Any] = []
    with command_run("grads", run_opts) as run:
        prep = run.prepare(opts, inputs)
        loaded, plan, categories, dev = prep.loaded, prep.plan, prep.categories, prep.device
        options: dict[str, Any] = {
            "model": model, "weights": opts.weights, "checkpoint": str(opts.checkpoint) if opts.checkpoint else None,
            "layers": layers, "depth": depth, "preprocessing": plan.describe(), "device": dev, "dtype": opts.dtype,
            "seed": inputs.seed, "target": target, "loss": loss, "label": label,
            "labels_file": str(labels_file) if labels_file else None, "output_key": output_key,
        }
        if jac:
            of_, wrt_ = of or "score", wrt or "input"
            options.update({"of": of_, "wrt": wrt_, "jacobian_norm": jacobian_norm, "probes": probes})
            payload, text, rich = _run_jacobian(loaded, run.track(plan), of_, wrt_, target=target, output_key=output_key,
                                                categories=categories, norm=jacobian_norm, probes=probes,
                                                seed=inputs.seed, out=run.out,
                                                emit_line=run.line if run.jsonl else None)
        else:
            options.update({"clip_norm": clip_norm, "vanishing_below": vanishing_below,
                            "exploding_above": exploding_above, "fail_on": fail_on})
            rep, payload, text, rich = _run_grads(
                loaded, run.track(plan), layers=layers, depth=depth, target=target, loss=loss, label=label,
                labels_file=labels_file, output_key=output_key, categories=categories, clip_norm=clip_norm,
                vanishing_below=vanishing_below, exploding_above=exploding_above, fail_on=fail_on, out=run.out,
                emit_line=run.line if run.jsonl else None, histograms=run.out is not None or run.writer is not None)
            for note in rep.notes:
                run.msgs.info(f"note: {note}")
            failures = rep.failures()
            if run.writer is not None:
                _write_tensorboard(run.writer, rep)
        for w in plan.drain_warnings():  # skipped files (--skip-bad-inputs), first GIF frames...
            run.msgs.warn(w)
        run.finish(payload, options, text=lambda files: text(), rich=lambda files: rich())
    if failures:
        from inspect_model.errors import CheckFailed

        first = failures[0]
        more = f" (also failed: {', '.join(f.name for f in failures[1:])})" if len(failures) > 1 else ""
        raise CheckFailed(f"gradient check '{first.name}' failed: {first.detail}{more}")


def _run_grads(loaded: Any, batches: Any, *, layers: list[str] | None, depth: int | None, target: str | None,
               loss: str | None, label: str | None, labels_file: Path | None, output_key: str | None,
               categories: Any, clip_norm: float | None, vanishing_below: float, exploding_above: float,
               fail_on: str | None, out: Any, emit_line: Any, histograms: bool) -> tuple[Any, dict[str, Any], Any, Any]:
    from inspect_model.methods.gradients import gradients, read_labels_file
    from inspect_model.render import gradients as render

    lab: Any = label
    if labels_file is not None:
        lab = read_labels_file(str(labels_file), categories)
    on_batch = None
    if emit_line is not None:
        def on_batch(samples: list[Any]) -> None:
            for s in samples:
                emit_line(render.sample_payload(s))

    rep = gradients(loaded.model, batches, layers=layers, depth=depth, target=target, loss=loss,
                    labels=lab, output_key=output_key, categories=categories, clip_norm=clip_norm,
                    vanishing_below=vanishing_below, exploding_above=exploding_above, fail_on=fail_on,
                    histograms=histograms, on_batch=on_batch)
    if out is not None:
        fig = render.flow_figure(rep)
        out.save_figure("grad_flow.png", fig, dpi=render.FIG_DPI)
        fig = render.histogram_figure(rep)
        out.save_figure("grad_histograms.png", fig, dpi=render.FIG_DPI)
    payload = render.to_payload(rep)
    return rep, payload, lambda: render.render_text(rep), lambda: render.render_rich(rep)


def _run_jacobian(loaded: Any, batches: Any, of: str, wrt: str, *, target: str | None, output_key: str | None,
                  categories: Any, norm: bool, probes: int, seed: int, out: Any,
                  emit_line: Any) -> tuple[dict[str, Any], Any, Any]:
    from inspect_model.methods.jacobian import jacobian
    from inspect_model.render import gradients as render
    from inspect_model.render.files import safe_name

    results = []
    for b, batch in enumerate(batches):
        res = jacobian(loaded.model, batch.tensor, of=of, wrt=wrt, target=target, output_key=output_key,
                       categories=categories, norm=norm, probes=probes, seed=seed + b, names=batch.names)
        for r in res:
            if out is not None and r.grad_map is not None:
                fig = render.jacobian_figure(r)
                out.save_figure(f"jacobian_{safe_name(r.of)}_wrt_{safe_name(r.wrt)}_batch{b}.png", fig,
                                dpi=render.FIG_DPI)
            r.grad_map = None  # drawn; do not keep maps of every batch
            for i, name in enumerate(r.names if emit_line is not None else []):
                emit_line({"image": name, "of": r.of, "wrt": r.wrt,
                           "vjp_norm": r.sample_norms[i] if i < len(r.sample_norms) else None,
                           "frobenius_sq": r.sample_norm_sq[i] if i < len(r.sample_norm_sq) else None})
        results.extend(res)
    payload = render.jacobian_payload(results)
    return payload, lambda: render.render_jacobian_text(results), lambda: render.render_jacobian_rich(results)


def _write_tensorboard(writer: Any, rep: Any) -> None:
    """Scalars (norms) and histograms of log10|grad| (raw buckets) for layers and parameters."""
    from inspect_model.methods.gradients import LogHist

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
