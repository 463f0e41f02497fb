"""``inspect-model grads MODEL [IMAGE ...]``: gradient flow, health checks for CI, and
gradients between inner layers (``--of A --wrt B``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from inspect_model.cli import common as c

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
JsonlOpt = Annotated[
    bool, typer.Option("--jsonl", help="Write one compact JSON object per image to stdout as each batch finishes.")
]


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
    weights: c.WeightsOpt = "DEFAULT",
    checkpoint: c.CheckpointOpt = None,
    model_arg: c.ModelArgOpt = None,
    non_strict: c.NonStrictOpt = False,
    trust_checkpoint: c.TrustOpt = False,
    device: c.DeviceOpt = "cpu",
    dtype: c.DtypeOpt = "float32",
    input_size: c.InputSizeOpt = None,
    batch_size: c.BatchSizeOpt = 8,
    seed: c.SeedOpt = 0,
    preset: c.PresetOpt = None,
    resize: c.ResizeOpt = None,
    crop: c.CropOpt = None,
    mean: c.MeanOpt = None,
    std: c.StdOpt = None,
    labels: c.LabelsOpt = None,
    skip_bad_inputs: c.SkipBadOpt = False,
    output_dir: c.OutputDirOpt = None,
    force: c.ForceOpt = False,
    tensorboard: c.TensorboardOpt = None,
    json_: c.JsonOpt = False,
    jsonl: JsonlOpt = False,
    quiet: c.QuietOpt = False,
    config: c.ConfigOpt = None,
    debug: c.DebugOpt = False,
) -> None:
    """Gradient flow and gradient health: per layer the gradient wrt its output and wrt its
    input, per parameter its gradient statistics, the global norm, clipping, and NaN/Inf,
    vanishing and exploding checks (--fail-on makes a failed check exit 1 for CI).
    With --of/--wrt: d(A)/d(B) between inner layers, and --jacobian-norm.
    Example: inspect-model grads resnet18 cat.jpg --weights none --fail-on nan,inf,exploding --output-dir g
    """
    from inspect_model.errors import UsageError

    if json_ and jsonl:
        raise UsageError("--json and --jsonl cannot be combined; choose one")
    if force and output_dir is None:
        raise UsageError("--force needs --output-dir DIR")
    if label is not None and labels_file is not None:
        raise UsageError("--label and --labels-file both give labels; choose one")
    jac = of is not None or wrt is not None
    if jac:
        for flag, on in (("--loss", loss), ("--label", label), ("--labels-file", labels_file),
                         ("--clip-norm", clip_norm), ("--fail-on", fail_on), ("--layers", layers),
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
    from inspect_model.render.files import OutputDir

    msgs = c.Messages(quiet)
    out = OutputDir(output_dir, force=force).prepare() if output_dir else None
    writer = None
    tb_before: set[Any] = set()
    failures: list[Any] = []
    try:
        if tensorboard is not None:
            from inspect_model.render.tensorboard import open_writer

            tb_before = set(tensorboard.rglob("*")) if tensorboard.is_dir() else set()
            writer = open_writer(tensorboard)
        opts = c.ModelOptions(model, weights, checkpoint, model_arg, non_strict, trust_checkpoint, device, dtype)
        loaded, plan, categories, dev = _prepare(opts, msgs, images, input_size=input_size, batch_size=batch_size,
                                                 seed=seed, preset=preset, resize=resize, crop=crop, mean=mean,
                                                 std=std, labels=labels, skip_bad=skip_bad_inputs)
        options: dict[str, Any] = {
            "model": model, "weights": weights, "checkpoint": str(checkpoint) if checkpoint else None,
            "layers": layers, "depth": depth, "preprocessing": plan.describe(), "device": dev, "dtype": dtype,
            "seed": seed, "target": target, "loss": loss, "label": label,
            "labels_file": str(labels_file) if labels_file else None, "output_key": output_key,
        }
        emit_line = _jsonl_writer() if jsonl else None
        if jac:
            of_, wrt_ = of or "score", wrt or "input"
            options.update({"of": of_, "wrt": wrt_, "jacobian_norm": jacobian_norm, "probes": probes})
            payload, text, rich = _run_jacobian(loaded, plan, of_, wrt_, target=target, output_key=output_key,
                                                categories=categories, norm=jacobian_norm, probes=probes,
                                                seed=seed, out=out, emit_line=emit_line)
        else:
            options.update({"clip_norm": clip_norm, "vanishing_below": vanishing_below,
                            "exploding_above": exploding_above, "fail_on": fail_on})
            rep, payload, text, rich = _run_grads(
                loaded, plan, layers=layers, depth=depth, target=target, loss=loss, label=label,
                labels_file=labels_file, output_key=output_key, categories=categories, clip_norm=clip_norm,
                vanishing_below=vanishing_below, exploding_above=exploding_above, fail_on=fail_on, out=out,
                emit_line=emit_line, histograms=out is not None or writer is not None)
            for note in rep.notes:
                msgs.info(f"note: {note}")
            failures = rep.failures()
            if writer is not None:
                _write_tensorboard(writer, rep)
        from inspect_model.render.jsonout import dumps, envelope

        files: list[str] = []
        if writer is not None:
            writer.close()
            writer = None
            assert tensorboard is not None
            files += sorted(str(p) for p in set(tensorboard.rglob("*")) - tb_before if p.is_file())
        name = "jacobian" if jac else "grads"
        if out is not None:
            files = list(out.written) + [str(out.path / f"{name}.json"), str(out.path / f"{name}.txt")] + files
            out.write_text(f"{name}.txt", text())
            out.write_text(f"{name}.json", dumps(envelope("grads", payload, options=options, files=files)) + "\n")
            out.commit()
        if not jsonl:
            c.emit(as_json=json_, json_doc=lambda: envelope("grads", payload, options=options, files=files),
                   text=text, rich=rich)
    except BaseException:
        if out is not None:
            out.abort()
        raise
    finally:
        if writer is not None:
            writer.close()
    if failures:
        from inspect_model.errors import CheckFailed

        first = failures[0]
        more = f" (also failed: {', '.join(f.name for f in failures[1:])})" if len(failures) > 1 else ""
        raise CheckFailed(f"gradient check '{first.name}' failed: {first.detail}{more}")


def _jsonl_writer() -> Any:
    from inspect_model.render.jsonout import dumps

    def write(obj: dict[str, Any]) -> None:
        sys.stdout.write(dumps(obj, indent=None) + "\n")
        sys.stdout.flush()

    return write


def _prepare(opts: c.ModelOptions, msgs: c.Messages, images: list[str] | None, *, input_size: list[str] | None,
             batch_size: int, seed: int, preset: str | None, resize: int | None, crop: int | None,
             mean: str | None, std: str | None, labels: Path | None, skip_bad: bool) -> tuple[Any, Any, Any, str]:
    import torch

    from inspect_model.errors import InputError
    from inspect_model.loading.inputs import plan_inputs
    from inspect_model.loading.shapes import parse_dtype
    from inspect_model.methods.targets import load_labels

    torch_dtype = parse_dtype(opts.dtype)
    dev = c.resolve_device(opts.device)
    if len(input_size or []) > 1:
        raise InputError("grads takes one input; give --input-size once")
    torch.manual_seed(seed)
    loaded = c.load(opts, device=dev)
    for note in loaded.notes:
        msgs.info(f"note: {note}")
    if torch_dtype != torch.float32:
        loaded.model.to(torch_dtype)  # our own freshly loaded copy
    categories = load_labels(labels) if labels else loaded.categories
    plan = plan_inputs(loaded, images, input_size=(input_size or [None])[0], batch_size=batch_size, seed=seed,
                       preset=preset, resize=resize, crop=crop, mean=c.parse_floats(mean, "--mean"),
                       std=c.parse_floats(std, "--std"), skip_bad=skip_bad, device=dev, dtype=torch_dtype)
    return loaded, plan, categories, dev


def _run_grads(loaded: Any, plan: Any, *, layers: list[str] | None, depth: int | None, target: str | None,
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
                emit_line({"command": "grads", **render.sample_payload(s)})

    rep = gradients(loaded.model, plan.batches(), layers=layers, depth=depth, target=target, loss=loss,
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


def _run_jacobian(loaded: Any, plan: Any, of: str, wrt: str, *, target: str | None, output_key: str | None,
                  categories: Any, norm: bool, probes: int, seed: int, out: Any,
                  emit_line: Any) -> tuple[dict[str, Any], Any, Any]:
    from inspect_model.methods.jacobian import jacobian
    from inspect_model.render import gradients as render
    from inspect_model.render.files import safe_name

    results = []
    for b, batch in enumerate(plan.batches()):
        res = jacobian(loaded.model, batch.tensor, of=of, wrt=wrt, target=target, output_key=output_key,
                       categories=categories, norm=norm, probes=probes, seed=seed + b, names=batch.names)
        for r in res:
            if out is not None and r.grad_map is not None:
                fig = render.jacobian_figure(r)
                out.save_figure(f"jacobian_{safe_name(r.of)}_wrt_{safe_name(r.wrt)}_batch{b}.png", fig,
                                dpi=render.FIG_DPI)
            r.grad_map = None  # drawn; do not keep maps of every batch
            if emit_line is not None:
                for i, name in enumerate(r.names):
                    emit_line({"command": "grads", "image": name, "of": r.of, "wrt": r.wrt,
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
