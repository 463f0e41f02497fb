"""The task of a run, attached to its prepared model and inputs (issue 42): the objective
parsed once from the target options, the task found (or ``--task``), and the task's
binding put where the run holds the model (``Prepared.binding``): its full call and, for
the commands that explain a score, its scores and their names (``Prepared.categories``).
"""

from __future__ import annotations

from typing import Any

from inspect_model.errors import UnsupportedModelError, UsageError


def objective_of(request: Any, inputs: Any) -> Any:
    """The :class:`~inspect_model.methods.families.objective.Objective` of a request."""
    from inspect_model.methods.families.objective import parse_objective

    target = getattr(request, "target", None)
    return parse_objective(target if isinstance(target, str) or target is None else None,
                           target_text=getattr(inputs, "target_text", None), position=getattr(inputs, "position", None),
                           contrast=getattr(inputs, "contrast", None), output_key=getattr(request, "output_key", None))


def plan_texts(loaded: Any, inputs: Any, spec: Any) -> tuple[list[str], Any]:
    """The texts of a two-tower run and the tokenizer they are read with."""
    from inspect_model.loading.text import load_tokenizer, read_texts, tokenizer_folder

    texts = read_texts(inputs.text, inputs.text_file)
    return texts, load_tokenizer(tokenizer_folder(loaded, inputs.tokenizer, spec))


def attach_task(command: str, prep: Any, inputs: Any, request: Any, task: Any, *, texts: list[str] | None = None,
                tokenizer: Any = None, notes: Any = None) -> Any:
    """``prep`` with the task's binding and score names (module docstring)."""
    from inspect_model.methods.families import TaskContext
    from inspect_model.registry import capability
    from inspect_model.methods.families.binding import TaskBinding

    objective = objective_of(request, inputs)
    plan = prep.plan
    text_plan = getattr(plan, "texts", None) is not None
    if text_plan:
        texts, tokenizer = plan.texts, plan.tokenizer
    scoring = capability(command, "scores") or _named_headless(command, task, objective)  # registry entry
    ctx = TaskContext(prep.loaded.model, prep.loaded, objective, command, scoring, tokenizer=tokenizer, texts=texts,
                      images=not text_plan, device=prep.device)
    if not text_plan and task.takes == "text" and not _token_input(plan):
        raise UsageError(f"{prep.loaded.name} is a {task.name} model: it reads token ids; give --text TEXT "
                         "(or --input-size input_ids=LEN:int64:0-VOCAB)")
    refuse_command(command, task, prep.loaded.name, text_plan or (task.takes == "text" and _token_input(plan)))
    check = getattr(request, "check_task", None)  # a request that needs more of the task (--generate)
    if callable(check):
        check(task, prep.loaded.name)
    adapter = task.adapter(ctx)
    prep.task = task
    if adapter is None:
        return prep
    words = getattr(request, "objective_words", None)  # a request that explains something else (--generate)
    words = words(adapter) if callable(words) else None
    if words is not None:
        adapter.words = words
    inner = None if text_plan else prep.binding
    binding = TaskBinding(adapter, scoring=scoring, inner=inner)
    if text_plan:
        plan.binding = binding
        plan.suffix = list(getattr(adapter, "suffix", []) or [])
    prep.binding = binding
    if scoring and getattr(adapter, "labels", None) is not None:
        prep.categories = adapter.labels
    if notes is not None:
        for line in ctx.notes:
            notes(line)
        if scoring:
            notes(f"task: {task.name}; explained: {adapter.words}")
    return prep


def refuse_command(command: str, task: Any, name: str, tokens: bool) -> None:
    """A command that does not apply to the task: one line naming one that does (exit 9)."""
    why = None
    if command == "attributions" and task.name in ("detection", "segmentation"):
        what = "detections" if task.name == "detection" else "mask scores"
        why = f"attributions explain class scores; {name} is a {task.name} model: use cam or guided-backprop " \
              f"(they explain its {what})"
    elif command == "cam" and tokens:
        also = "" if task.name == "seq2seq" else " or attention --text ..."
        why = f"cam maps a spatial layer; {name} is a {task.name} model over tokens: use attributions --text ... " \
              f"(one value per token){also}"
    elif command == "attention" and task.name == "contrastive":
        why = f"{name} has two towers and attention is drawn for one: load its vision tower (CLIPVisionModel), " \
              "or use attributions IMAGE --text ..."
    elif command == "attention" and task.name == "seq2seq":
        why = f"attention maps of an encoder-decoder ({name}: self- and cross-attention) are not drawn; " \
              "grads, attributions and activations take it"
    if why is not None:
        raise UnsupportedModelError(why)


def _named_headless(command: str, task: Any, objective: Any) -> bool:
    """``attention`` on a head-less model with a named objective (``--target norm``,
    ``cosine:REF``): its gradient methods explain that score (methods/attention/headless.py)."""
    return command == "attention" and task.name == "embedding" and (
        objective.kind != "class" or objective.output_key is not None)


def _token_input(plan: Any) -> bool:
    """A plan whose input is token ids: ``--input-size input_ids=8:int64:0-100``, or a
    text model's random ids (its vocabulary known)."""
    spec = getattr(plan, "spec", None)
    return "int" in str(getattr(spec, "dtype", "") or "") or bool(getattr(plan, "vocab", None))


def summary_inputs(model: Any) -> Any:
    """A context manager completing ``model(x)`` for ``summary`` where the task needs more
    than one input: a seq2seq decoder's start token, a two-tower model's placeholder text
    (4 token ids), so that the layer table covers both halves (issue 42)."""
    import contextlib

    from inspect_model.methods.families import find_task

    task = find_task(model).name
    if task not in ("seq2seq", "contrastive"):
        return contextlib.nullcontext()
    cfg = model.config

    def pre(_mod: Any, args: tuple, kwargs: dict) -> Any:
        import torch

        if task == "seq2seq" and not args and "input_ids" in kwargs and "decoder_input_ids" not in kwargs:
            args, kwargs = (kwargs["input_ids"],), {k: v for k, v in kwargs.items() if k != "input_ids"}
        elif len(args) != 1 or kwargs:
            return None
        x = args[0]
        n = int(x.shape[0])
        if task == "seq2seq":
            start = int(getattr(cfg, "decoder_start_token_id", None) or 0)
            return (), {**kwargs, "input_ids": x, "decoder_input_ids": torch.full((n, 1), start, dtype=torch.long,
                                                                                  device=x.device)}
        return (), {"pixel_values": x, "input_ids": torch.ones((1, 4), dtype=torch.long, device=x.device)}

    @contextlib.contextmanager
    def bound() -> Any:
        handle = model.register_forward_pre_hook(pre, with_kwargs=True, prepend=True)
        try:
            yield
        finally:
            handle.remove()

    return bound()
