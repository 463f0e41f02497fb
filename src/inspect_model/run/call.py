"""What an API call adds to its request: the model and input options, where the files go,
what is kept, and who hears of items, notes and progress (issue 35: every command function
spelled these nine keywords out twice, in its signature and in its call of the pipeline).

A command function that names a ``call`` parameter gets them as one :class:`Call`;
:func:`~inspect_model.run.request.api_command` still offers them to Python users as
keywords (the function's public signature), and the CLI passes them as before. An image
command's body is then one line: ``return call.run_images("cam", model, images, request,
lambda prep, mopts, keep: CamSession(prep, mopts, request, notes=call.notes))``.
Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: The keywords an image command takes beside its request (its ``call``), in order.
IMAGE_CALL = ("model_options", "inputs", "output_dir", "force", "tensorboard", "keep", "on_item", "notes",
              "progress")


@dataclass(frozen=True)
class Call:
    """The call arguments of one API call (:data:`IMAGE_CALL`, and ``on_stuck`` for check)."""

    model_options: Any = None  # ModelOptions; None: the model argument's defaults
    inputs: Any = None  # InputOptions; None: the images argument
    output_dir: Any = None
    force: bool = False
    tensorboard: Any = None
    keep: bool | None = None  # None: kept when no output_dir is given
    on_item: Any = None
    notes: Any = None
    progress: Any = None
    on_stuck: Any = None

    def model(self, model: Any) -> Any:
        """The model options: as given, else ``model``'s defaults."""
        from inspect_model.run.options import ModelOptions

        return self.model_options or ModelOptions(model)

    def input_options(self, images: Any) -> Any:
        """The input options: as given, else ``images`` (paths or a tensor; None: a random input)."""
        from inspect_model.run.options import InputOptions

        return self.inputs or InputOptions(images)

    def run_images(self, command: str, model: Any, images: Any, request: Any,
                   make_session: Callable[[Any, Any, bool], Any], *, hooks: bool | None = None) -> Any:
        """Run an image command (:func:`~inspect_model.run.pipeline.run_images`) with this call."""
        from inspect_model.run.pipeline import run_images

        return run_images(command, model, images, make_session, hooks=hooks, model_options=self.model_options,
                          inputs=self.inputs, output_dir=self.output_dir, force=self.force,
                          tensorboard=self.tensorboard, keep=self.keep, on_item=self.on_item, notes=self.notes,
                          progress=self.progress, request=request)

    def execute(self, session: Any, batches: Any, *, total: int, unit: str = "image",
                tensorboard: bool = True) -> Any:
        """Run ``session`` over ``batches`` (:func:`~inspect_model.run.pipeline.execute`), counted
        for the progress display; ``tensorboard=False``: a command that writes no events."""
        from inspect_model.run.pipeline import execute, tracked

        keep = self.output_dir is None if self.keep is None else self.keep
        return execute(session, tracked(batches, total, self.progress, unit=unit), output_dir=self.output_dir,
                       force=self.force, keep=keep, tensorboard=self.tensorboard if tensorboard else None,
                       on_item=self.on_item)
