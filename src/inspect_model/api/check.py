"""``check``: a smoke check in one line of CI (pass/fail per check), as a result.

``result.passed`` is False when a check failed; ``result.failures`` says which (the CLI
exits 1). ``save(dir)`` writes report.txt/report.json.
"""

from __future__ import annotations

from typing import Any

from inspect_model.api.options import InputOptions, ModelOptions
from inspect_model.api.pipeline import Result, prepare
from inspect_model.errors import UsageError


def check_check_request(*, max_dead_fraction: float | None, max_seconds: float | None,
                        max_memory: float | None, expect_output_shape: str | None,
                        expect_params: str | None) -> tuple[Any, Any]:
    from inspect_model.methods import checks

    if max_dead_fraction is not None and not 0.0 < max_dead_fraction <= 1.0:
        raise UsageError(f"--max-dead-fraction must be in (0, 1], got {max_dead_fraction}")
    for flag, v in (("--max-seconds", max_seconds), ("--max-memory", max_memory)):
        if v is not None and not v > 0:
            raise UsageError(f"{flag} must be > 0, got {v:g}")
    shape = checks.parse_shape(expect_output_shape) if expect_output_shape else None
    params = checks.parse_count_range(expect_params) if expect_params else None
    return shape, params


def check(model: Any, images: Any = None, *, expect_output_shape: str | None = None,
          expect_params: str | None = None, finite: bool = True, max_dead_fraction: float | None = 1.0,
          deterministic: bool = False, max_seconds: float | None = None, max_memory: float | None = None,
          output_key: str | None = None, model_options: ModelOptions | None = None,
          inputs: InputOptions | None = None, output_dir: Any = None, force: bool = False,
          notes: Any = None, on_stuck: Any = None) -> Result:
    """Build the model, run a forward and a backward pass, and check what is asked.
    ``max_seconds`` is a timeout where the platform allows (SIGALRM in the main thread):
    the passes stop at the budget and the time check fails. ``on_stuck(message)`` is called
    from a watchdog thread if they cannot be stopped (the CLI prints it and exits)."""
    from inspect_model.engine.selection import select_layers
    from inspect_model.methods import checks
    from inspect_model.methods.targets import select_output

    shape, params = check_check_request(max_dead_fraction=max_dead_fraction, max_seconds=max_seconds,
                                        max_memory=max_memory, expect_output_shape=expect_output_shape,
                                        expect_params=expect_params)
    mopts = model_options or ModelOptions(model)
    inputs = inputs or InputOptions(images)
    prep = prepare("check", mopts, inputs, notes=notes, default_batch=1)
    batch = next(iter(prep.plan.batches()))
    net = prep.loaded.model
    import contextlib

    with prep.binding.bound(net) if prep.binding is not None else contextlib.nullcontext():
        results = checks.run_checks(
            net, (batch.tensor,), layers=select_layers(net), select=lambda out: select_output(out, output_key),
            expect_output_shape=shape, expect_params=params, finite=finite, max_dead_fraction=max_dead_fraction,
            deterministic=deterministic, max_seconds=max_seconds, max_memory_mb=max_memory, on_stuck=on_stuck)
    failed = [r for r in results if not r.passed]
    payload = {
        "model": prep.loaded.name,
        "passed": not failed,
        "checks": [r.to_dict() for r in results],
    }
    options = prep.options(mopts, output_key=output_key, expect_output_shape=expect_output_shape,
                           expect_params=expect_params, finite=finite, max_dead_fraction=max_dead_fraction,
                           deterministic=deterministic, max_seconds=max_seconds, max_memory=max_memory)
    failures = ["check failed: " + "; ".join(f"{r.name} {r.value_text} (expected {r.expected})" for r in failed)
                ] if failed else []
    result = Result("check", options, payload, [], failures=failures, record=_Checks(results),
                    render_text=lambda r: _text(results))
    if output_dir is not None:
        result.save(output_dir, force=force)
    return result


class _Checks:
    def __init__(self, results: list[Any]) -> None:
        self.checks = results


def _text(results: list[Any]) -> str:
    from inspect_model.render.table import clean

    lines = []
    failed = 0
    for r in results:
        failed += not r.passed
        extra = f" ({r.detail})" if r.detail else ""
        lines.append(clean(f"{r.status.upper()}  {r.name}: {r.value_text} (expected {r.expected}){extra}"))
    lines.append(f"{len(results) - failed} passed, {failed} failed")
    return "\n".join(lines) + "\n"
