"""``inspect-model summary MODEL``: the layer table, computed on the meta device by default."""

from __future__ import annotations

from typing import Annotated

import typer

from inspect_model.cli import common as c

EXAMPLE = "inspect-model summary resnet34 --depth 2"


def summary(
    model: c.ModelArg,
    input_size: c.InputSizeOpt = None,
    batch_size: c.BatchSizeOpt = 1,
    dtype: c.DtypeOpt = "float32",
    depth: c.DepthOpt = None,
    weights: c.WeightsOpt = "none",
    checkpoint: c.CheckpointOpt = None,
    model_arg: c.ModelArgOpt = None,
    non_strict: c.NonStrictOpt = False,
    trust_checkpoint: c.TrustOpt = False,
    device: Annotated[
        str, typer.Option("--device", help="meta (no memory, no arithmetic), cpu, cuda, mps or auto.")
    ] = "meta",
    json_: c.JsonOpt = False,
    output_dir: c.OutputDirOpt = None,
    force: c.ForceOpt = False,
    quiet: c.QuietOpt = False,
    config: c.ConfigOpt = None,
    debug: c.DebugOpt = False,
) -> None:
    """Show the layer table: names, types, output shapes, parameters, MACs and memory.

    Runs on the meta device by default, so a model of any size is summarised without
    allocating its weights. Example: inspect-model summary resnet34 --depth 2
    """
    from inspect_model.api import summary_from_options
    from inspect_model.errors import ModelRuntimeError
    from inspect_model.render import summary as render
    from inspect_model.render.files import OutputDir
    from inspect_model.render.jsonout import dumps, envelope

    msgs = c.Messages(quiet)
    out = OutputDir(output_dir, force=force).prepare() if output_dir else None
    try:
        opts = c.ModelOptions(model, weights, checkpoint, model_arg, non_strict, trust_checkpoint,
                              device, dtype)
        res = summary_from_options(opts, input_sizes=input_size, batch_size=batch_size, depth=depth)
        for note in res.notes:
            msgs.info(f"note: {note}")
        options = {
            "model": model, "weights": weights, "input_size": res.input_shapes, "batch_size": batch_size,
            "dtype": dtype, "depth": depth, "device": res.device, "checkpoint": str(checkpoint) if checkpoint else None,
        }
        files: list[str] = []
        if out is not None:
            files = [str(out.path / "summary.txt"), str(out.path / "summary.json")]
            out.write_text("summary.txt", render.render_text(res))
            out.write_text("summary.json", dumps(envelope("summary", render.to_payload(res), options=options, files=files)) + "\n")
            out.commit()
        c.emit(
            as_json=json_,
            json_doc=lambda: envelope("summary", render.to_payload(res), options=options, files=files),
            text=lambda: render.render_text(res),
            rich=lambda: render.render_rich(res),
        )
        if res.error:
            where = f" in layer '{res.failed_layer}'" if res.failed_layer else ""
            raise ModelRuntimeError(f"forward pass failed{where}: {res.error}")
    except BaseException:
        if out is not None:
            out.abort()
        raise
