"""Preparing an image command's run, and running it: the model loaded, its inputs planned
(:func:`prepare`), then its session driven by the one runner (:func:`execute`).

Every image command (activations, grads, guided-backprop, cam) is a session
(:mod:`inspect_model.run.session`) run by :func:`inspect_model.run.runner.run`: one process,
``--resume`` and torchrun alike. ``summary`` and ``check`` load through :func:`prepare` but
run one pass of their own (no batches to stream); ``models`` lists, it runs nothing.

The output layout is the same for every command (README "Output layout"):
``report.json``, ``report.txt``, pictures of the whole run at the top (``overview.png``,
``contact_sheet_001.png``, ``grad_flow.png``), and one folder per input image,
``images/NNNN-<stem>/``, holding that image's files.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inspect_model.run.options import (
    InputOptions,
    ModelOptions,
    input_shape,
    load,
    resolve_device,
)
from inspect_model.registry import capability
from inspect_model.run.session import Result, Session

if TYPE_CHECKING:
    import torch

    from inspect_model.loading.inputs import InputBatch
    from inspect_model.loading.models import LoadedModel


# ----------------------------------------------------------------------------- preparing
@dataclass
class Prepared:
    """A loaded model, its input plan, and what the run resolved."""

    loaded: LoadedModel
    plan: Any  # loading.inputs.InputPlan or TensorPlan
    categories: list[str] | None
    device: str
    dtype: torch.dtype
    binding: Any = None  # loading.multi_inputs.InputBinding for a model with several inputs
    task: Any = None  # methods.families.Task: what the model does (api/tasks.py)

    def options(self, mopts: ModelOptions, **own: Any) -> dict[str, Any]:
        """The one resolved-options record of a report: what was asked, as resolved."""
        base = {
            "model": mopts.spec(),
            "weights": resolved_weights(self.loaded, mopts),
            "checkpoint": str(mopts.checkpoint) if mopts.checkpoint else None,
            "device": self.device,
            "dtype": str(self.dtype).replace("torch.", ""),
            "seed": self.plan.seed,
            "batch_size": self.plan.batch_size,
            "inputs": self.plan.describe(),
        }
        dmap = getattr(self.loaded.model, "hf_device_map", None)
        if isinstance(dmap, dict):  # where each block ran (issue 37): module -> cuda:N, cpu or disk
            base["placement"] = {k or "(model)": f"cuda:{v}" if isinstance(v, int) else str(v) for k, v in dmap.items()}
        if self.task is not None:  # issue 42: the task and, where it explains a score, the objective in words
            words = getattr(getattr(self.binding, "adapter", None), "words", None)
            base["task"] = {"name": self.task.name,
                            "objective": words if getattr(self.binding, "scoring", False) else None}
        base.update(own)
        return base


def resolved_weights(loaded: Any, mopts: ModelOptions) -> str | None:
    """The weights a report records, the same in every command: torchvision's resolved
    enum name; otherwise the name given (a user model ignores it); null for none."""
    if loaded.source == "torchvision":
        return loaded.weights
    given = mopts.weights if isinstance(mopts.model, str) else None
    return None if given is None or str(given).lower() == "none" else given


def prepare(command: str, mopts: ModelOptions, inputs: InputOptions, *, hooks: bool | None = None,
            notes: Callable[[str], None] | None = None, default_batch: int | None = None,
            output_dir: Any = None, request: Any = None) -> Prepared:
    """Load the model (its notes go to ``notes``), plan the inputs (folders and globs
    without what lies in ``output_dir``) and attach the model's task with the objective of
    ``request``'s target options (api/tasks.py). What the command's registry entry says it
    does decides the checks: ``hooks`` (None: the entry's), ``gradients``, ``objective``."""
    from inspect_model.run.tasks import attach_task

    prep, task, texts, tok = _prepare(command, mopts, inputs, hooks=hooks, notes=notes, default_batch=default_batch,
                                      output_dir=output_dir)
    return attach_task(command, prep, inputs, request, task, texts=texts, tokenizer=tok, notes=notes) \
        if task is not None else prep


def place(loaded: Any, mopts: ModelOptions, dtype: Any, notes: Any) -> str:
    """The device the inputs go to, after the loader's notes are told and our own freshly
    loaded copy (never the caller's, nor one accelerate spread) is cast to ``dtype``."""
    import torch

    from inspect_model.devices import model_device
    from inspect_model.run.world import rank_device

    placed = hasattr(loaded.model, "hf_device_map")  # spread by accelerate: inputs go to its main device
    dev = (model_device(loaded.model) or "cpu") if loaded.borrowed or placed \
        else resolve_device(rank_device(mopts.device))
    for note in loaded.notes:
        if notes is not None:
            notes(note)
    if dtype != torch.float32 and not loaded.borrowed and not placed:
        loaded.model.to(dtype)
    return dev


def _prepare(command: str, mopts: ModelOptions, inputs: InputOptions, *, hooks: bool | None, notes: Any,
             default_batch: int | None, output_dir: Any) -> tuple[Prepared, Any, Any, Any]:
    import torch

    from inspect_model.loading.inputs import plan_inputs
    from inspect_model.loading.shapes import parse_dtype
    from inspect_model.methods.objectives.targets import check_label_count, load_labels

    _precheck(mopts, inputs)  # (the options were checked once, as they were made: run/options.py)
    torch_dtype = parse_dtype(mopts.dtype)
    torch.manual_seed(inputs.seed)
    loaded = load(mopts, shape=input_shape(inputs, default_batch))
    _refuse(command, loaded, hooks)
    dev = place(loaded, mopts, torch_dtype, notes)
    categories = load_labels(inputs.labels) if inputs.labels else loaded.categories
    if inputs.labels and loaded.categories:  # the model names its classes: check at once
        check_label_count(categories, len(loaded.categories))
    from inspect_model.methods.families import find_task

    task = find_task(loaded.model, loaded, getattr(inputs, "task", None))
    has_text, texts, tok = _texts_beside_images(task, inputs, loaded, mopts)
    if has_text and texts is None:  # issue 26: texts
        return _prepare_text(command, mopts, inputs, loaded, dev, torch_dtype, categories), task, None, None
    from inspect_model.loading.multi_inputs import plan_binding

    binding = plan_binding(loaded.model, inputs.input_size, image_input=inputs.image_input,
                           inputs_file=inputs.inputs_file, dtype=torch_dtype, device=dev, seed=inputs.seed)
    image_size = (inputs.input_size or [None])[0]
    if binding is not None:
        image_size = _spec_text(binding.image_spec) if binding.image_spec is not None else None
        if notes is not None:
            others = ", ".join(str(k) for k in binding.others) or "none"
            wrt = ("; gradients are taken with respect to it, the others held fixed"
                   if capability(command, "gradients") else "")
            notes(f"several inputs: images feed input {binding.image_label} (--image-input); "
                  f"other inputs: {others}{wrt}")
    images = inputs.images
    from inspect_model.run.media import media_binding

    if isinstance(images, torch.Tensor):
        from inspect_model.loading.pair_tensors import tensor_plan

        bs = inputs.batch_size or int(images.shape[0]) or 1
        plan: Any = tensor_plan(loaded, images.to(device=dev), names=inputs.names, batch_size=bs, seed=inputs.seed)
        binding, categories = media_binding(command, loaded, plan, binding, categories, notes,
                                            objective=capability(command, "objective"))  # a flow model's pairs
    else:
        if isinstance(images, (str, Path)):
            images = [images]
        batch_size = inputs.batch_size or default_batch or (8 if images else 1)
        from inspect_model.run.options import parse_floats
        from inspect_model.loading.video import ClipOptions

        plan = plan_inputs(
            loaded, [str(i) for i in images] if images else None,
            input_size=image_size, batch_size=batch_size,
            seed=inputs.seed, preset=inputs.preset, resize=inputs.resize, crop=inputs.crop,
            mean=parse_floats(inputs.mean, "--mean"), std=parse_floats(inputs.std, "--std"),
            skip_bad=inputs.skip_bad, device=dev, dtype=torch_dtype, clip=inputs.clip,
            clip_options=ClipOptions(inputs.frames, inputs.stride, inputs.clips), exclude=output_dir, notes=notes,
        )
        binding, categories = media_binding(command, loaded, plan, binding, categories, notes,
                                            objective=capability(command, "objective"))
    return Prepared(loaded, plan, categories, dev, torch_dtype, binding), task, texts, tok


def _refuse(command: str, loaded: Any, hooks: bool | None) -> None:
    """What the command's registry entry says it does, checked against the model: hooks (None:
    the entry's), gradients (quantized kernels have none), parameter gradients (offloaded
    weights keep none)."""
    from inspect_model.loading.models import require_hookable

    if capability(command, "hooks", True) if hooks is None else hooks:
        require_hookable(loaded, command)
    if capability(command, "gradients"):
        from inspect_model.loading.quantized import refuse_gradients

        refuse_gradients(loaded, command)
    if capability(command, "parameter_gradients"):
        from inspect_model.loading.dispatch import refuse_offloaded

        refuse_offloaded(loaded, command)


def _texts_beside_images(task: Any, inputs: InputOptions, loaded: Any, mopts: ModelOptions
                         ) -> tuple[bool, Any, Any]:
    """(texts given, the texts and tokenizer of a two-tower model, held beside its images;
    None: the texts are the input). Texts with images for any other task: a usage error."""
    has_text = bool(inputs.text) or inputs.text_file is not None or inputs.tokenizer is not None
    has_images = inputs.images is not None and not (isinstance(inputs.images, (list, tuple)) and not inputs.images)
    if has_text and task.takes == "images+text":  # a two-tower model: the texts are held fixed (issue 42)
        from inspect_model.run.tasks import plan_texts

        texts, tok = plan_texts(loaded, inputs, mopts.model)
        return True, texts, tok
    if has_text and has_images:
        from inspect_model.errors import UsageError

        raise UsageError(f"--text with images: only a two-tower (image-text) model takes both; {loaded.name} is a "
                         f"{task.name} model; drop the images or --text")
    return has_text, None, None


def _precheck(mopts: ModelOptions, inputs: InputOptions) -> None:
    """What needs the config only, before any build (issue 37): the tokenizer of --text."""
    if inputs.text or inputs.text_file is not None:
        from inspect_model.loading.text import precheck_tokenizer

        precheck_tokenizer(mopts.model, inputs.tokenizer)


def _prepare_text(command: str, mopts: ModelOptions, inputs: InputOptions, loaded: Any, dev: Any,
                  torch_dtype: Any, categories: Any) -> Prepared:
    """:func:`prepare`'s plan for ``--text``: the texts tokenised and bound to the model."""
    from inspect_model.errors import UsageError
    from inspect_model.loading.text import text_run
    from inspect_model.registry import COMMANDS, with_capability

    if command in COMMANDS and not COMMANDS[command].text:
        takes = ", ".join(with_capability("text"))
        raise UsageError(f"{command} does not take text; --text works with {takes}")
    plan, categories = text_run(loaded, inputs, spec=mopts.model, device=dev, categories=categories, command=command)
    return Prepared(loaded, plan, categories, dev, torch_dtype, plan.binding)


def _spec_text(spec: Any) -> str:
    text = "x".join(str(d) for d in spec.shape)
    if spec.dtype:
        text += f":{spec.dtype}" + (f":{spec.low}-{spec.high}" if spec.high is not None else "")
    return text


# ----------------------------------------------------------------------------- running
def execute(
    session: Session,
    batches: Iterable[InputBatch],
    *,
    output_dir: str | os.PathLike[str] | None = None,
    force: bool = False,
    keep: bool | None = None,
    tensorboard: Any = None,
    on_item: Callable[[dict[str, Any]], None] | None = None,
) -> Result:
    """Run ``session`` over ``batches`` in this process's world (torchrun's, or one process)
    with the scale of :func:`inspect_model.run.world.scaled` (``--resume``, ``--workers``);
    see :func:`inspect_model.run.runner.run`. ``keep`` (default: no output_dir) keeps each
    item's data so that ``Result.save`` works."""
    from inspect_model.run.runner import run
    from inspect_model.run.world import current_scale, world

    keep = output_dir is None if keep is None else keep
    scale = current_scale()
    prep = session.prep
    plan = getattr(prep, "plan", None)
    if plan is not None:
        plan.use_workers(scale.workers)
    binding = getattr(prep, "binding", None)
    # A model of several inputs gets its other inputs for the whole run (issue 14).
    with binding.bound(prep.loaded.model) if binding is not None else contextlib.nullcontext():
        return run(session, batches, world(), output_dir=output_dir, force=force, keep=keep,
                   tensorboard=tensorboard, on_item=on_item, resume=scale.resume)


def run_images(command: str, model: Any, images: Any, make_session: Callable[[Prepared, ModelOptions, bool], Session],
               *, hooks: bool | None = None, model_options: ModelOptions | None = None, inputs: InputOptions | None = None,
               output_dir: Any = None, force: bool = False, tensorboard: Any = None, keep: bool | None = None,
               on_item: Any = None, notes: Any = None, progress: Any = None, request: Any = None) -> Result:
    """The one shape of every image command's API function: the model loaded and the inputs
    planned (:func:`prepare`), the session made by ``make_session(prep, mopts, keep)`` (``keep``
    resolved: by default, kept when no output_dir is given), its batches run (:func:`execute`).
    A session that is a context manager (activations' capture) is entered around the run."""
    mopts = model_options or ModelOptions(model)
    prep = prepare(command, mopts, inputs or InputOptions(images), hooks=hooks, notes=notes, output_dir=output_dir,
                   request=request)
    keep = output_dir is None if keep is None else keep
    with contextlib.ExitStack() as stack:
        session = make_session(prep, mopts, keep)
        if isinstance(session, contextlib.AbstractContextManager):
            session = stack.enter_context(session)
        from inspect_model.run.runner import units

        total = len(units(prep.plan))  # images, or the clips or frame pairs of a video or flow model
        return execute(session, tracked(prep.plan.batches(), total, progress, unit=prep.plan.unit), output_dir=output_dir, force=force,
                       keep=keep, tensorboard=tensorboard, on_item=on_item)


def tracked(batches: Iterator[InputBatch], total: int, progress: Callable[[int, int], None] | None,
            unit: str = "image") -> Iterator[InputBatch]:
    """``batches``, calling ``progress(0, total)`` when the first is asked for (the rate's
    clock starts there, after loading, as the report's throughput does) and
    ``progress(done, total)`` after each. ``unit``: what is counted (the plan's), told to a
    progress display that names it (``set_unit``)."""
    done = 0
    set_unit = getattr(progress, "set_unit", None)
    if set_unit is not None:
        set_unit(unit)
    if progress is not None:
        progress(0, total)
    for b in batches:
        yield b
        done += len(b.names)
        if progress is not None:
            progress(done, total)
