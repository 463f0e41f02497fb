"""``check``: a smoke check in one line of CI (pass/fail per check), as a result.

``result.passed`` is False when a check failed; ``result.failures`` says which (the CLI
exits 1). ``save(dir)`` writes report.txt/report.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from inspect_model.run.call import Call
from inspect_model.run.pipeline import prepare
from inspect_model.run import option_groups as og
from inspect_model.run.request import Request, api_command, option
from inspect_model.run.session import Result
from inspect_model.errors import UsageError
from inspect_model.registry import command
from inspect_model.reports.check import CheckReport
from inspect_model.render import html_columns, results


@dataclass(frozen=True)
class CheckRequest(Request):
    """The options of ``check``; validated once, here."""

    command: ClassVar[str] = "check"

    expect_output_shape: str | None = option(None, "--expect-output-shape", type=str,
                                             help="Expected output shape, e.g. 1x1000.")
    expect_params: str | None = option(None, "--expect-params", type=str, help="Parameter count: exact (25557032), "
                                       "as summary prints it (11.7M or '11.69 M': any count that rounds to it; K, M, "
                                       "G) or a range (25e6..26e6, 11M..12M).")
    finite: bool = option(True, "--finite/--no-finite", help="Outputs and gradients must be finite.")
    max_dead_fraction: float | None = option(1.0, "--max-dead-fraction", type=float, help="Fail if a layer's output "
                                             "has at least this fraction of zeros.")
    deterministic: bool = option(False, "--deterministic", help="Fail unless two forward passes give identical "
                                 "outputs.")
    max_seconds: float | None = option(None, "--max-seconds", type=float, help="Budget for forward + backward, in "
                                       "seconds: a timeout (a model that hangs fails the check when it is spent).")
    max_memory: float | None = option(None, "--max-memory", type=float, help="Budget for peak memory growth, in "
                                      "MB.")
    output_key: str | None = og.output_key()

    def validate(self) -> None:
        from inspect_model.methods.checks import smoke as checks

        if self.max_dead_fraction is not None and not 0.0 < self.max_dead_fraction <= 1.0:
            raise UsageError(f"--max-dead-fraction must be in (0, 1], got {self.max_dead_fraction}")
        for flag, v in (("--max-seconds", self.max_seconds), ("--max-memory", self.max_memory)):
            if v is not None and not v > 0:
                raise UsageError(f"{flag} must be > 0, got {v:g}")
        self._set("shape", checks.parse_shape(self.expect_output_shape) if self.expect_output_shape else None)
        self._set("param_range", checks.parse_count_range(self.expect_params) if self.expect_params else None)


@command(
    "check",
    usage="check MODEL",
    order=90,
    summary=("a one-line CI smoke check: output shape, parameter count, finite outputs and "
             "gradients, dead layers, determinism, time and memory budgets"),
    help=("Build the model, run a forward and a backward pass, and check what you ask; exit 1 if "
          "a check fails."),
    example=("inspect-model check resnet50 --weights none --expect-output-shape 1x1000 "
             "--expect-params 25557032"),
    renderer=results.check_report,
    tables=html_columns.check_tables,
    schema="check.json",
    report=CheckReport,
    labels=False,
    streams=False,
    run=("output_dir", "force", "json_", "quiet"),
    text=True,
)
@api_command(CheckRequest, takes=("model_options", "inputs", "output_dir", "force", "notes", "on_stuck"))
def check(model: Any, images: Any, request: CheckRequest, call: Call) -> Result:
    """Build the model, run a forward and a backward pass, and check what is asked (the
    options of :class:`CheckRequest` as keywords). ``max_seconds`` is a timeout where the
    platform allows (SIGALRM in the main thread): the passes stop at the budget and the time
    check fails. ``on_stuck(message)`` is called from a watchdog thread if they cannot be
    stopped (the CLI prints it and exits)."""
    from inspect_model.methods.checks import smoke as checks
    from inspect_model.methods.objectives.targets import select_output

    r = request
    mopts, notes = call.model(model), call.notes
    # TorchScript takes no module hooks: the checks that need none still run (issue 39).
    prep = prepare("check", mopts, call.input_options(images), notes=notes, default_batch=1, hooks=False)
    hookable = prep.loaded.hookable
    if not hookable and notes is not None:
        notes(f"{prep.loaded.name} is a TorchScript model, which takes no module hooks: the dead-layers check "
              "is skipped; the others run")
    batch = next(iter(prep.plan.batches()))
    net = prep.loaded.model
    import contextlib

    with prep.binding.bound(net) if prep.binding is not None else contextlib.nullcontext():
        results = checks.run_checks(
            net, (batch.tensor,), layers=_activation_layers(net) if hookable else [],
            select=lambda out: select_output(out, r.output_key),
            expect_output_shape=r.shape, expect_params=r.param_range, finite=r.finite,
            max_dead_fraction=r.max_dead_fraction if hookable else None, deterministic=r.deterministic, max_seconds=r.max_seconds,
            max_memory_mb=r.max_memory, on_stuck=call.on_stuck,
            mask=getattr(getattr(batch, "text", None), "mask", None))  # texts: real tokens only
    failed = [x for x in results if not x.passed]
    payload = {
        "model": prep.loaded.name,
        "passed": not failed,
        "checks": [x.to_dict() for x in results],
    }
    options = prep.options(mopts, **{k: v for k, v in r.resolved().items() if k != "output_key"},
                           output_key=r.output_key)
    failures = ["check failed: " + "; ".join(f"{x.name} {x.value_text} (expected {x.expected})" for x in failed)
                ] if failed else []
    result = Result("check", options, payload, [], failures=failures, record=_Checks(results))
    if call.output_dir is not None:
        result.save(call.output_dir, force=call.force)
    return result


class _Checks:
    def __init__(self, results: list[Any]) -> None:
        self.checks = results


def _activation_layers(net: Any) -> list[str]:
    """Every leaf but position tables (rotary cos/sin: sin(0) = 0 is no dead unit)."""
    from inspect_model.engine.selection import select_layers
    from inspect_model.methods.activations.tokens import position_tables

    layers = select_layers(net)
    tables = set(position_tables(net, layers))
    return [n for n in layers if n not in tables]
