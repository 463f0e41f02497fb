"""Tasks: what a loaded model does, and so what can be explained (issue 42).

A task says which inputs the model takes and how they are built from what the user gives
(token ids and their mask, a seq2seq decoder's inputs, a two-tower model's texts beside its
images), what a *target* is (a class, the next token, a continuation's log-probability, an
image-text similarity, a norm) and how it is named in reports. Tasks live in a registry,
like the model sources: a new task is one module with one :func:`register_task` class.

:func:`find_task` reads the model's class, config and heads (``--task NAME`` overrides);
:meth:`Task.adapter` gives the run's :class:`~.binding.TaskBinding` adapter, or None where
the model already maps its input to class scores (image classifiers, detectors and
segmenters keep their own objectives: :mod:`inspect_model.methods.objectives`).
"""

from __future__ import annotations

from typing import Any

from inspect_model.errors import UsageError, suggest
from inspect_model.methods.families.base import (
    TASKS,
    Task,
    TaskContext,
    is_hf,
    mro_names,
    refuse_options,
    register_task,
)

__all__ = ["TASKS", "Task", "TaskContext", "find_task", "is_hf", "mro_names", "refuse_options",
           "register_task", "task_names"]


def find_task(model: Any, loaded: Any = None, override: str | None = None) -> Task:
    """The task of ``model`` (``override``: ``--task``, by name)."""
    _load_builtin()
    if override:
        key = override.strip().lower().replace("-", "_")
        if key not in TASKS:
            raise UsageError(f"--task '{override}' is not a task; tasks: {', '.join(TASKS)}"
                             + (suggest(key, list(TASKS)) or ""))
        return TASKS[key]
    for task in sorted(TASKS.values(), key=lambda t: -t.priority):
        if task.claims(model, loaded):
            return task
    return TASKS["image_classification"]


def task_names() -> list[str]:
    _load_builtin()
    return list(TASKS)


def _load_builtin() -> None:
    """Import the built-in task modules (each registers its tasks)."""
    from inspect_model.methods.families import (  # noqa: F401
        contrastive,
        embedding,
        images,
        language,
        seq2seq,
        text,
    )
