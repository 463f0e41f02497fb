"""``inspect-model check MODEL``: a smoke check in one line of CI (PASS/FAIL per check)."""

from __future__ import annotations

from typing import Annotated

import typer

from inspect_model.api.options import InputOptions, ModelOptions
from inspect_model.cli import common as c
from inspect_model.cli.shared import RunOptions, run_api, shared_options

EXAMPLE = "inspect-model check resnet50 --weights none --expect-output-shape 1x1000 --expect-params 25557032"


@shared_options(labels=False, run=("output_dir", "force", "json_", "quiet"))
def check(
    model: c.ModelArg,
    images: c.ImagesArg = None,
    expect_output_shape: Annotated[
        str | None, typer.Option("--expect-output-shape", help="Expected output shape, e.g. 1x1000.")
    ] = None,
    expect_params: Annotated[
        str | None, typer.Option("--expect-params", help="Parameter count: exact (25557032), as summary prints it (11.7M or '11.69 M': any "
                                   "count that rounds to it; K, M, G) or a range (25e6..26e6, 11M..12M).")
    ] = None,
    finite: Annotated[bool, typer.Option("--finite/--no-finite", help="Outputs and gradients must be finite.")] = True,
    max_dead_fraction: Annotated[
        float, typer.Option("--max-dead-fraction", help="Fail if a layer's output has at least this fraction of zeros.")
    ] = 1.0,
    deterministic: Annotated[
        bool, typer.Option("--deterministic", help="Fail unless two forward passes give identical outputs.")
    ] = False,
    max_seconds: Annotated[
        float | None, typer.Option("--max-seconds", help="Budget for forward + backward, in seconds: a timeout "
                                   "(a model that hangs fails the check when it is spent).")
    ] = None,
    max_memory: Annotated[
        float | None, typer.Option("--max-memory", help="Budget for peak memory growth, in MB.")
    ] = None,
    output_key: c.OutputKeyOpt = None,
    *,
    opts: ModelOptions,
    inputs: InputOptions,
    run_opts: RunOptions,
) -> None:
    """Build the model, run a forward and a backward pass, and check what you ask; exit 1 if a
    check fails.

    Example: inspect-model check resnet50 --weights none --expect-output-shape 1x1000 --expect-params 25557032
    """
    from inspect_model.api.check import check as api_check
    from inspect_model.api.check import check_check_request

    run_opts.check()
    check_check_request(max_dead_fraction=max_dead_fraction, max_seconds=max_seconds,
                                  max_memory=max_memory, expect_output_shape=expect_output_shape,
                                  expect_params=expect_params)
    run_api("check", api_check, opts, inputs, run_opts, streams=False,
            expect_output_shape=expect_output_shape, expect_params=expect_params, finite=finite,
            max_dead_fraction=max_dead_fraction, deterministic=deterministic, max_seconds=max_seconds,
            max_memory=max_memory, output_key=output_key, on_stuck=_stuck)


def _stuck(message: str) -> None:
    """--max-seconds spent and the model cannot be stopped (stuck in C code): one line, exit."""
    import os
    import sys

    from inspect_model.errors import CheckFailed

    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    os._exit(CheckFailed.exit_code)
