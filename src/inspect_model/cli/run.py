"""What every image subcommand shares, so that each command module only says what it computes.

``CommandRun`` is a context manager around one run: it checks the option combinations,
prepares the output directory (all-or-nothing: aborted on any failure), opens and closes
the TensorBoard writer, loads the model and plans the inputs (``prepare``), writes JSON
lines as results arrive (``line``), and at the end writes ``report.txt``/``report.json``,
commits the directory and prints the report in the format asked for (``finish``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Annotated, Any, Self

import typer

from inspect_model.cli import common as c
from inspect_model.errors import InputError, UsageError

if TYPE_CHECKING:
    import torch

    from inspect_model.loading.inputs import InputPlan
    from inspect_model.loading.models import LoadedModel


@dataclass
class InputOptions:
    """The input options shared by the image subcommands (see cli/common.py)."""

    images: list[str] | None
    input_size: list[str] | None = None
    batch_size: int | None = None  # None: 8 images per batch, or 1 random input
    seed: int = 0
    preset: str | None = None
    resize: int | None = None
    crop: int | None = None
    mean: str | None = None
    std: str | None = None
    labels: Path | None = None
    skip_bad: bool = False


@dataclass
class Prepared:
    """A loaded model, its input plan, and what the run resolved."""

    loaded: LoadedModel
    plan: InputPlan
    categories: list[str] | None
    device: str
    dtype: torch.dtype


class CommandRun:
    """One run of an image subcommand (see the module docstring)."""

    def __init__(
        self,
        command: str,
        *,
        output_dir: Path | None = None,
        force: bool = False,
        tensorboard: Path | None = None,
        json_: bool = False,
        jsonl: bool = False,
        quiet: bool = False,
        save_raw: bool = False,
    ) -> None:
        if json_ and jsonl:
            raise UsageError("--json and --jsonl cannot be combined; choose one")
        for flag, on in (("--save-raw", save_raw), ("--force", force)):
            if on and output_dir is None:
                raise UsageError(f"{flag} needs --output-dir DIR")
        self.command = command
        self.output_dir, self.force, self.tensorboard = output_dir, force, tensorboard
        self.json, self.jsonl = json_, jsonl
        self.msgs = c.Messages(quiet)
        self.out: Any = None  # OutputDir, when --output-dir is given
        self.writer: Any = None  # TensorBoard SummaryWriter, when --tensorboard is given
        self._tb_before: set[Path] = set()

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Self:
        from inspect_model.render.files import OutputDir

        if self.output_dir is not None:
            self.out = OutputDir(self.output_dir, force=self.force).prepare()
        try:
            if self.tensorboard is not None:
                from inspect_model.render.tensorboard import open_writer

                tb = self.tensorboard
                self._tb_before = set(tb.rglob("*")) if tb.is_dir() else set()
                self.writer = open_writer(tb)
        except BaseException:
            if self.out is not None:
                self.out.abort()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc is not None and self.out is not None:
                self.out.abort()
        finally:
            if self.writer is not None:
                self.writer.close()
                self.writer = None

    # ------------------------------------------------------------------ inputs
    def prepare(self, opts: c.ModelOptions, inputs: InputOptions) -> Prepared:
        """Load the model (printing its notes) and plan the inputs."""
        import torch

        from inspect_model.loading.inputs import plan_inputs
        from inspect_model.loading.shapes import parse_dtype
        from inspect_model.methods.targets import load_labels

        torch_dtype = parse_dtype(opts.dtype)
        dev = c.resolve_device(opts.device)
        if len(inputs.input_size or []) > 1:
            raise InputError(f"{self.command} takes one input; give --input-size once")
        torch.manual_seed(inputs.seed)
        loaded = c.load(opts, device=dev)
        for note in loaded.notes:
            self.msgs.info(f"note: {note}")
        if torch_dtype != torch.float32:
            loaded.model.to(torch_dtype)  # our own freshly loaded copy, never the caller's
        categories = load_labels(inputs.labels) if inputs.labels else loaded.categories
        batch_size = inputs.batch_size if inputs.batch_size is not None else (8 if inputs.images else 1)
        plan = plan_inputs(
            loaded, inputs.images, input_size=(inputs.input_size or [None])[0], batch_size=batch_size,
            seed=inputs.seed, preset=inputs.preset, resize=inputs.resize, crop=inputs.crop,
            mean=c.parse_floats(inputs.mean, "--mean"), std=c.parse_floats(inputs.std, "--std"),
            skip_bad=inputs.skip_bad, device=dev, dtype=torch_dtype,
        )
        return Prepared(loaded, plan, categories, dev, torch_dtype)

    def track(self, plan: InputPlan) -> Iterator[Any]:
        """``plan.batches()`` with a progress bar on stderr when stderr is a terminal, the
        run is not --quiet, and there is more than one batch to wait for."""
        total = len(plan.paths) if plan.paths else 0
        with _Progress(self.command, self.msgs, total, plan.batch_size) as advance:
            for batch in plan.batches():
                yield batch
                advance(len(batch.names))

    # ------------------------------------------------------------------ outputs
    def line(self, obj: dict[str, Any]) -> None:
        """With --jsonl: one compact JSON object on stdout, flushed at once."""
        if not self.jsonl:
            return
        from inspect_model.render.jsonout import dumps

        sys.stdout.write(dumps({"command": self.command, **obj}, indent=None) + "\n")
        sys.stdout.flush()

    def finish(
        self,
        payload: dict[str, Any],
        options: dict[str, Any],
        *,
        text: Callable[[list[str]], str],
        rich: Callable[[list[str]], list[Any]] | None = None,
        stem: str = "report",
    ) -> list[str]:
        """Write report.txt/report.json, commit the output directory, print the report."""
        from inspect_model.render.jsonout import dumps, envelope

        files: list[str] = []
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            assert self.tensorboard is not None
            files += sorted(str(p) for p in set(self.tensorboard.rglob("*")) - self._tb_before if p.is_file())
        if self.out is not None:
            files = [*self.out.written, str(self.out.path / f"{stem}.txt"), str(self.out.path / f"{stem}.json"),
                     *files]
            self.out.write_text(f"{stem}.txt", text(files))
            self.out.write_text(f"{stem}.json",
                                dumps(envelope(self.command, payload, options=options, files=files)) + "\n")
            self.out.commit()
        if not self.jsonl:
            c.emit(
                as_json=self.json,
                json_doc=lambda: envelope(self.command, payload, options=options, files=files),
                text=lambda: text(files),
                rich=(lambda: rich(files)) if rich is not None else None,
            )
        return files


JsonlOpt = Annotated[
    bool, typer.Option("--jsonl", help="Write one compact JSON object per image to stdout as each batch finishes.")
]


class _Progress:
    """A rich progress bar on stderr, only when stderr is a terminal and the run is large."""

    def __init__(self, label: str, msgs: c.Messages, total: int, batch_size: int) -> None:
        self.label = label
        self.enabled = not msgs.quiet and total > batch_size and _stderr_is_terminal()
        self.total = total
        self._bar: Any = None

    def __enter__(self) -> Callable[[int], None]:
        if not self.enabled:
            return lambda n: None
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(TextColumn(self.label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                             console=Console(stderr=True), transient=True)
        self._bar.start()
        task = self._bar.add_task(self.label, total=self.total)
        return lambda n: self._bar.advance(task, n)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
