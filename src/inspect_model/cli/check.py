"""``inspect-model check MODEL``: a smoke check in one line of CI (PASS/FAIL per check)."""

from __future__ import annotations

from typing import Annotated

import typer

from inspect_model.cli import common as c


def check(
    model: c.ModelArg,
    images: c.ImagesArg = None,
    expect_output_shape: Annotated[
        str | None, typer.Option("--expect-output-shape", help="Expected output shape, e.g. 1x1000.")
    ] = None,
    expect_params: Annotated[
        str | None, typer.Option("--expect-params", help="Parameter count, exact (25557032) or a range (25e6..26e6).")
    ] = None,
    finite: Annotated[bool, typer.Option("--finite/--no-finite", help="Outputs and gradients must be finite.")] = True,
    max_dead_fraction: Annotated[
        float, typer.Option("--max-dead-fraction", help="Fail if a layer's output has at least this fraction of zeros.")
    ] = 1.0,
    deterministic: Annotated[
        bool, typer.Option("--deterministic", help="Fail unless two forward passes give identical outputs.")
    ] = False,
    max_seconds: Annotated[
        float | None, typer.Option("--max-seconds", help="Budget for forward + backward, in seconds.")
    ] = None,
    max_memory: Annotated[
        float | None, typer.Option("--max-memory", help="Budget for peak memory growth, in MB.")
    ] = None,
    input_size: Annotated[
        str | None, typer.Option("--input-size", help="Per-sample input shape such as 3x224x224 (without images).")
    ] = None,
    batch_size: c.BatchSizeOpt = 1,
    seed: c.SeedOpt = 0,
    output_key: c.OutputKeyOpt = None,
    weights: c.WeightsOpt = "DEFAULT",
    checkpoint: c.CheckpointOpt = None,
    model_arg: c.ModelArgOpt = None,
    non_strict: c.NonStrictOpt = False,
    trust_checkpoint: c.TrustOpt = False,
    device: c.DeviceOpt = "cpu",
    dtype: c.DtypeOpt = "float32",
    json_: c.JsonOpt = False,
    quiet: c.QuietOpt = False,
    config: c.ConfigOpt = None,
    debug: c.DebugOpt = False,
) -> None:
    """Build the model, run a forward and a backward pass, and check what you ask; exit 1 if a
    check fails.

    Example: inspect-model check resnet50 --weights none --expect-output-shape 1x1000 --expect-params 25557032
    """
    from inspect_model.engine.selection import select_layers
    from inspect_model.errors import CheckFailed, UsageError
    from inspect_model.loading.inputs import plan_inputs
    from inspect_model.loading.shapes import parse_dtype
    from inspect_model.methods import checks
    from inspect_model.methods.targets import select_output
    from inspect_model.render.jsonout import envelope

    if max_dead_fraction is not None and not 0.0 < max_dead_fraction <= 1.0:
        raise UsageError(f"--max-dead-fraction must be in (0, 1], got {max_dead_fraction}")
    shape = checks.parse_shape(expect_output_shape) if expect_output_shape else None
    params = checks.parse_count_range(expect_params) if expect_params else None
    opts = c.ModelOptions(model, weights, checkpoint, model_arg, non_strict, trust_checkpoint, device, dtype)
    dev = c.resolve_device(device)
    torch_dtype = parse_dtype(dtype)
    loaded = c.load(opts, device=dev)
    if str(torch_dtype) != "torch.float32":
        loaded.model.to(torch_dtype)  # our own loaded model (c.load copies a user's instance)
    plan = plan_inputs(loaded, images, input_size=input_size, batch_size=batch_size, seed=seed,
                       device=dev, dtype=torch_dtype)
    batch = next(iter(plan.batches()))
    results = checks.run_checks(
        loaded.model,
        (batch.tensor,),
        layers=select_layers(loaded.model),
        select=lambda out: select_output(out, output_key),
        expect_output_shape=shape,
        expect_params=params,
        finite=finite,
        max_dead_fraction=max_dead_fraction,
        deterministic=deterministic,
        max_seconds=max_seconds,
        max_memory_mb=max_memory,
    )
    failed = [r for r in results if not r.passed]
    options = {"model": model, "weights": weights, "device": dev, "seed": seed,
               "inputs": plan.describe(), "output_key": output_key}

    def text() -> str:
        lines = []
        for r in results:
            extra = f" ({r.detail})" if r.detail else ""
            lines.append(f"{r.status}  {r.name}: {r.value} (expected {r.expected}){extra}")
        lines.append(f"{len(results) - len(failed)} passed, {len(failed)} failed")
        return "\n".join(lines) + "\n"

    c.emit(
        as_json=json_,
        json_doc=lambda: envelope("check", {
            "model": loaded.name,
            "passed": not failed,
            "checks": [{"name": r.name, "status": r.status, "passed": r.passed, "value": r.value,
                        "expected": r.expected, "detail": r.detail} for r in results],
        }, options=options),
        text=text,
    )
    if failed:
        raise CheckFailed("check failed: " + "; ".join(f"{r.name} {r.value} (expected {r.expected})" for r in failed))
