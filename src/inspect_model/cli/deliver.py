"""The one way a command hands its API result to the user: :func:`run_api` calls an API
function with the shared option groups (:mod:`inspect_model.cli.groups`) and delivers its
result: notes and progress on stderr, ``--jsonl`` lines, the report on stdout, warnings once
each, exit 1 for failed checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inspect_model.cli import console as c
from inspect_model.cli.groups import RunOptions
from inspect_model.run.options import InputOptions, ModelOptions


def run_api(command: str, api_fn: Callable[..., Any], opts: ModelOptions, inputs: InputOptions,
            run_opts: RunOptions, *, streams: bool = True, **kwargs: Any) -> Any:
    """Call ``api_fn`` (``inspect_model.api.cam`` ...) with the shared options and deliver
    its result (see the module docstring)."""
    from inspect_model.cli.progress import Progress
    from inspect_model.errors import CheckFailed

    msgs = c.Messages(run_opts.quiet)
    extra: dict[str, Any] = {"model_options": opts, "inputs": inputs, "output_dir": run_opts.output_dir,
                             "force": run_opts.force, "notes": msgs.note}
    if streams:
        extra.update(tensorboard=run_opts.tensorboard, keep=False,
                     on_item=_jsonl_writer(command) if run_opts.jsonl else None)
    from inspect_model.run.world import is_secondary, scaled
    from inspect_model.output.files import hold_output_dir

    # The output directory is locked for the whole run, model loading included (issue 13);
    # under torchrun rank 0 holds it for every rank.
    lock_dir = None if is_secondary() else run_opts.output_dir
    with hold_output_dir(lock_dir, wait=run_opts.wait, force=run_opts.force), \
            Progress(command, msgs) as progress, scaled(resume=run_opts.resume, workers=run_opts.workers):
        if streams:
            extra["progress"] = progress
        result = api_fn(None, **extra, **kwargs)
    if is_secondary():  # under torchrun rank 0 reports for every rank; failed checks fail every rank
        if result.failures:
            raise CheckFailed("; ".join(result.failures))
        return result
    speed = result.payload.get("throughput") if isinstance(result.payload, dict) else None
    if speed and speed.get("images_per_second") is not None:
        from inspect_model.cli.progress import format_rate

        entries = result.payload.get("images") or []
        unit = "clip" if any(isinstance(e, dict) and "clip" in e for e in entries) else "image"  # issue 39
        if not entries and isinstance(result.payload.get("pairs"), list):  # patch: prompt pairs (issue 36)
            unit = "pair"
        if entries and all(isinstance(e, dict) and "text" in e for e in entries):
            unit = "text"  # --text runs count texts
        # From the first batch on, as the progress lines count (tracked() starts them there).
        msgs.info(f"{speed['images']} {unit}(s) in {speed['seconds']:.2f} s after loading the model: "
                  f"{format_rate(speed['images'], speed['seconds'], unit)}")
    deliver(result, run_opts, msgs)
    if result.failures:
        raise CheckFailed("; ".join(result.failures))
    return result


def deliver(result: Any, run_opts: RunOptions, msgs: c.Messages) -> None:
    """The report on stdout in the one format asked for; each warning once on stderr."""
    from inspect_model.run.session import warning_lines

    for line in warning_lines(result.warnings):
        msgs.warn(line)
    if run_opts.jsonl:
        return
    c.emit(as_json=run_opts.json_, json_doc=result.to_dict, text=result.text, rich=result.rich)


def _jsonl_writer(command: str) -> Callable[[dict[str, Any]], None]:
    from inspect_model.output.jsonout import dumps

    left = False

    def write(obj: dict[str, Any]) -> None:
        nonlocal left
        if left:
            return
        try:
            c.write_stdout(dumps({"command": command, **obj}, indent=None) + "\n")
        except BrokenPipeError:
            # The reader left (`--jsonl | head -c 20`): the run goes on, its files complete,
            # and ends with exit 0; stdout points at /dev/null so that no flush fails (issue 41).
            left = True
            _quiet_stdout()

    return write


def _quiet_stdout() -> None:
    import os
    import sys

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file descriptor (a test's StringIO)
        pass
