"""TensorBoard output behind the optional ``tensorboard`` extra.

``open_writer`` returns torch's SummaryWriter, or raises a one-line error naming the extra
to install. ``read_tags`` reads an event directory back (used by tests and `check`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inspect_model.errors import OutputError, UsageError, one_line

INSTALL_HINT = "pip install 'inspect-model[tensorboard]'"


def require_tensorboard() -> None:
    """Fail at once, before any model loads, when the extra is missing."""
    try:
        import tensorboard  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"--tensorboard needs the tensorboard package; {INSTALL_HINT}") from exc


def open_writer(logdir: str | Path) -> Any:
    """A ``torch.utils.tensorboard.SummaryWriter`` on ``logdir``."""
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise UsageError(f"--tensorboard needs the tensorboard package; {INSTALL_HINT}") from exc
    p = Path(logdir)
    if p.exists() and not p.is_dir():
        raise OutputError(f"--tensorboard '{p}' is a file; give a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
        return SummaryWriter(log_dir=str(p))
    except OSError as exc:
        raise OutputError(f"cannot write TensorBoard events to '{p}': {exc.strerror or exc}") from exc


def read_tags(logdir: str | Path) -> dict[str, list[str]]:
    """Tags by kind (``scalars``, ``histograms``, ``images``) found in the event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"images": 0, "histograms": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    return {k: sorted(tags.get(k, [])) for k in ("scalars", "histograms", "images")}


def write_graph(writer: Any, model: Any, example: Any) -> str | None:
    """The model's graph (``add_graph``, a TorchScript trace on ``example``); None when
    written, else a one-line note saying why tracing failed. The trace runs in eval mode
    without grad, and every module's ``training`` flag is put back."""
    import warnings

    import torch

    flags = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        with torch.no_grad(), warnings.catch_warnings():
            # add_graph is built on torch.jit.trace, whose deprecation is torch's to solve.
            warnings.filterwarnings("ignore", message=r".*torch\.jit\.trace.* is deprecated")
            writer.add_graph(model, example, use_strict_trace=False)
        return None
    except Exception as exc:
        why = f"{type(exc).__name__}: {one_line(str(exc))}"
        return f"TensorBoard: the model's graph was not written (tracing failed: {why})"
    finally:
        for m, t in flags:
            m.training = t


def graph_written(logdir: str | Path) -> bool:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return bool(acc.Tags().get("graph"))
