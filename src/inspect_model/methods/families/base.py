"""The task registry's parts (issue 42): :class:`Task`, :class:`TaskContext`, the
:data:`TASKS` table and :func:`register_task`, imported by every task module (the package's
``__init__`` finds tasks; kept apart so that no import goes in a circle)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from inspect_model.errors import UsageError
from inspect_model.methods.families.objective import Objective

TASKS: dict[str, Task] = {}
# Which commands explain a score is their registry entry's `scores` (registry.capability).


@dataclass
class TaskContext:
    """What a task's adapter is built from."""

    model: Any
    loaded: Any
    objective: Objective
    command: str
    scoring: bool
    tokenizer: Any = None  # the run's tokenizer (--text), or None
    texts: list[str] | None = None  # the texts (--text), or None
    images: bool = False  # images (or an image-sized input) are the primary input
    device: Any = "cpu"
    notes: list[str] = field(default_factory=list)


class Task:
    """One task (see the module docstring). ``takes``: what the user gives (``images``,
    ``text``, ``images+text``); ``options``: the objective options it reads beyond
    ``--target``; ``priority``: higher is tried first by :func:`find_task`."""

    name: ClassVar[str] = ""
    family: ClassVar[str] = ""  # README's section
    takes: ClassVar[str] = "images"
    options: ClassVar[tuple[str, ...]] = ()
    priority: ClassVar[int] = 0
    target_help: ClassVar[str] = "predicted, a class index or name, or top:K"
    generates: ClassVar[bool] = False  # a language model: attributions --generate continues its texts (issue 36)

    def claims(self, model: Any, loaded: Any) -> bool:
        return False

    def adapter(self, ctx: TaskContext) -> Any:
        """The run's adapter, or None: the model's output is its class scores."""
        refuse_options(self, ctx.objective)
        return None


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: add a task to :data:`TASKS`."""
    TASKS[cls.name] = cls()
    return cls


def refuse_options(task: Task, objective: Objective) -> None:
    """An objective option the task does not read is a usage error naming the task."""
    given = {"target_text": objective.target_text, "position": objective.position, "contrast": objective.contrast,
             "norm": objective.kind if objective.kind != "class" else None}
    for name, value in given.items():
        if value is not None and name not in task.options:
            flag = f"--target {objective.target}" if name == "norm" else "--" + name.replace("_", "-")
            raise UsageError(f"{flag} does not apply to a {task.name} model ({task.target_help}); "
                             f"see README 'Tasks and targets'")


def mro_names(model: Any) -> set[str]:
    return {c.__name__ for c in type(model).__mro__}


def is_hf(model: Any) -> bool:
    return hasattr(model, "config") and type(model).__module__.startswith("transformers")


