"""Preparing a ``patch`` run (issue 36): the pairs read and checked before anything is
loaded, then the model loaded as every command loads it (run/options.py), its tokenizer,
and the plan the one runner shards and resumes (loading/prompt_pairs.py)."""

from __future__ import annotations

from typing import Any

from inspect_model.errors import UsageError
from inspect_model.run.options import InputOptions, ModelOptions, load
from inspect_model.run.pipeline import Prepared, place

DEFAULT_PER_FORWARD = 32  # patched runs per forward when --batch-size is not given


def prepare_patch(mopts: ModelOptions, inputs: InputOptions, request: Any, notes: Any) -> tuple[Prepared, Any, int]:
    """(the prepared run, the tokenizer, patched runs per forward)."""
    import torch

    from inspect_model.loading.loaded import require_hookable
    from inspect_model.loading.prompt_pairs import PairPlan, given_pairs
    from inspect_model.loading.shapes import parse_dtype
    from inspect_model.loading.text import load_tokenizer, tokenizer_folder
    from inspect_model.methods.lm.metrics import parse_metric

    for flag, given in (("--input-size", inputs.input_size), ("--inputs-file", inputs.inputs_file),
                        ("--image-input", inputs.image_input), ("--clip", inputs.clip), ("--task", inputs.task)):
        if given:
            raise UsageError(f"patch reads its prompts from --clean/--corrupt or --pairs; drop {flag}")
    pairs = given_pairs(request.clean, request.corrupt, request.pairs, tracing=request.noise_subject is not None)
    for i, p in enumerate(pairs):
        if p.metric is not None:
            parse_metric(p.metric, f"--pairs pair {i}: \"metric\"")
    dtype = parse_dtype(mopts.dtype)
    torch.manual_seed(inputs.seed)
    loaded = load(mopts)
    require_hookable(loaded, "patch")
    dev = place(loaded, mopts, dtype, notes)
    tok = load_tokenizer(tokenizer_folder(loaded, request.tokenizer, mopts.model))
    plan = PairPlan(pairs, seed=inputs.seed)
    per_forward = inputs.batch_size or DEFAULT_PER_FORWARD
    return Prepared(loaded, plan, None, dev, dtype), tok, per_forward
