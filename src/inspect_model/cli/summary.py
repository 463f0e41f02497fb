"""``inspect-model summary MODEL``: the layer table, computed on the meta device by default."""

from __future__ import annotations

from typing import Annotated

import typer

from inspect_model.run.options import ModelOptions
from inspect_model.cli import completion, console
from inspect_model.registry import command_cli
from inspect_model.cli import options as c
from inspect_model.cli.groups import RunOptions
from inspect_model.cli.deliver import deliver

EXAMPLE = "inspect-model summary resnet34 --depth 2"


@command_cli("summary")
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
    trust_remote_code: c.TrustRemoteCodeOpt = False,
    device: Annotated[
        str, typer.Option("--device", help="meta (no memory, no arithmetic), cpu, cuda, mps or auto.",
                          autocompletion=completion.complete_summary_device)
    ] = "meta",
    seed: c.SeedOpt = 0,
    train: Annotated[
        bool, typer.Option("--train", help="Run the pass in training mode (dropout and batch norm as in training); "
                           "the model's flags and running statistics are put back.")
    ] = False,
    graph: Annotated[
        bool, typer.Option("--graph", help="Also draw the model's graph into the output folder (-o): graph.svg, "
                           "graph.png and graph.dot (modules, the operations between them, nested containers).")
    ] = False,
    text: c.TextOpt = None,
    text_file: c.TextFileOpt = None,
    tokenizer: c.TokenizerOpt = None,
    tensorboard: c.TensorboardOpt = None,
    json_: c.JsonOpt = False,
    output_dir: c.OutputDirOpt = None,
    force: c.ForceOpt = False,
    wait: c.WaitOpt = False,
    quiet: c.QuietOpt = False,
    config: c.ConfigOpt = None,
    debug: c.DebugOpt = False,
) -> None:
    """Show the layer table: names, types, output shapes, parameters, MACs and memory.

    Runs on the meta device by default, so a model of any size is summarised without
    allocating its weights. Example: inspect-model summary resnet34 --depth 2
    """
    from inspect_model.run.options import InputOptions
    from inspect_model.errors import ModelRuntimeError, UsageError

    run_opts = RunOptions(output_dir=output_dir, force=force, wait=wait, json_=json_, quiet=quiet,
                          tensorboard=tensorboard)
    run_opts.check()
    if graph and output_dir is None:
        raise UsageError("--graph writes graph.svg, graph.png and graph.dot into the output folder; add -o DIR")
    if depth is not None and depth < 0:
        raise UsageError(f"--depth must be 0 or more, got {depth}")
    InputOptions(None, input_size=input_size, text=text, text_file=text_file, tokenizer=tokenizer,
                 batch_size=batch_size)  # checked as it is made (the dtype: by the request and ModelOptions)
    from inspect_model import api

    msgs = console.Messages(quiet)
    opts = ModelOptions(model, weights=weights, checkpoint=checkpoint, model_args=model_arg, non_strict=non_strict,
                        trust_checkpoint=trust_checkpoint, device=device, dtype=dtype,
                        trust_remote_code=trust_remote_code)
    from inspect_model.output.files import hold_output_dir

    with hold_output_dir(output_dir, wait=wait, force=force):  # a failure inside removes what it made
        res = api.summary(None, model_options=opts, input_size=input_size, batch_size=batch_size, depth=depth,
                          seed=seed, output_dir=output_dir, force=force, notes=msgs.note, train=train,
                          tensorboard=tensorboard, graph=graph, text=text or (), text_file=text_file,
                          tokenizer=tokenizer)
        deliver(res, run_opts, msgs)
        if res.record.error:
            where = f" in layer '{res.record.failed_layer}'" if res.record.failed_layer else ""
            raise ModelRuntimeError(f"forward pass failed{where}: {res.record.error}")
