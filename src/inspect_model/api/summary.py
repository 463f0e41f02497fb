"""``summary``: the layer table (names, types, shapes, parameters, MACs, memory).

Runs on the meta device by default: no weights are allocated and no arithmetic runs;
a model that cannot run there falls back to a real CPU pass, with a note. The result's
``to_dict()`` is the CLI's ``--json`` and ``save(dir)`` writes report.txt/report.json.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from inspect_model.run.options import ModelOptions, check_dtype, load, resolve_device
from inspect_model.run.pipeline import resolved_weights
from inspect_model.run.request import Request, api_command, option, positive
from inspect_model.run.session import Result
from inspect_model.engine.hints import first_layer_hint, size_hint
from inspect_model.errors import InputError, UsageError, one_line
from inspect_model.loading.models import require_hookable
from inspect_model.registry import command
from inspect_model.reports.summary import SummaryReport
from inspect_model.reports.summary import body as summary_body
from inspect_model.render import html_columns, results

if TYPE_CHECKING:
    from torch import nn

    from inspect_model.methods.summary import SummaryResult


def _meta_call(model: nn.Module, inputs: Sequence[Any], dtype: Any = None,
               kwargs: dict[str, Any] | None = None) -> Any:
    """Run ``model(*inputs)`` with meta copies of its parameters and buffers (floating ones
    in ``dtype`` when given, to match --dtype inputs): shapes flow, nothing is allocated,
    and the user's weights are put back whatever happens (shared tensors stay shared)."""
    import torch

    from inspect_model.engine.swap import swapped_tensors

    def meta(v: torch.Tensor) -> torch.Tensor:
        cast = dtype if dtype is not None and v.is_floating_point() else None
        return torch.empty_like(v, device="meta", dtype=cast)

    def call() -> Any:
        with swapped_tensors(model, meta):
            return model(*inputs, **(kwargs or {}))

    return call


def _on_meta(model: nn.Module) -> bool:
    for t in list(model.parameters()) + list(model.buffers()):
        return t.device.type == "meta"
    return False


def summarize_model(
    model: Any,
    *,
    input_size: Sequence[Sequence[int] | str] | None = None,
    batch_size: int = 1,
    dtype: str = "float32",
    device: str = "meta",
    depth: int | None = None,
    seed: int = 0,
    train: bool = False,
    graph: bool = False,
) -> SummaryResult:
    """The layer table of ``model`` (see :func:`inspect_model.methods.summary.summarize`).

    ``device="meta"`` (the default) computes shapes and MACs without memory or arithmetic;
    a model that cannot run on meta falls back to a real pass on the CPU, with a note.
    """
    from inspect_model.loading.saved_models import check_static_batch
    from inspect_model.loading.shapes import parse_dtype, parse_input_spec

    loaded = model
    specs = [parse_input_spec(s) for s in input_size or [] if isinstance(s, str) and (":" in s or "=" in s)]
    if specs:  # keyword or integer inputs: [NAME=]SHAPE[:DTYPE[:LOW-HIGH]] (issue 14)
        return _summarize_specs(loaded, [parse_input_spec(s) if isinstance(s, str) else
                                         parse_input_spec("x".join(map(str, s))) for s in input_size or []],
                                batch_size=batch_size, dtype=dtype, device=device, depth=depth, seed=seed,
                                train=train, graph=graph)
    sizes = _input_sizes(loaded, input_size)
    if batch_size < 1:
        raise InputError(f"--batch-size must be 1 or more, got {batch_size}")
    check_static_batch(loaded, batch_size)
    run = functools.partial(_run_pass, loaded, sizes=sizes, batch_size=batch_size, torch_dtype=parse_dtype(dtype),
                            depth=depth, seed=seed, train=train, graph=graph)
    m = loaded.model
    notes: list[str] = []
    if device == "meta":
        res, m, notes = _meta_then_cpu(loaded, run)
    else:
        res = run(m, device)
    res.notes[:0] = [*loaded.notes, *notes]
    _add_first_layer_hint(res, m)
    return res


def _input_sizes(loaded: Any, input_size: Sequence[Sequence[int] | str] | None) -> list[tuple[int, ...]]:
    """The per-sample input shapes: given (``3x224x224`` or a sequence), else the model's own."""
    from inspect_model.loading.shapes import parse_size

    if input_size:
        return [parse_size(s) if isinstance(s, str) else tuple(int(d) for d in s) for s in input_size]
    if loaded.input_sizes:
        return list(loaded.input_sizes)
    raise InputError(
        f"cannot tell the input size of {loaded.name}; pass --input-size, e.g. --input-size 3x224x224"
    )


def _run_pass(loaded: Any, m: nn.Module, dev: str, *, sizes: list[tuple[int, ...]], batch_size: int,
              torch_dtype: Any, depth: int | None, seed: int, train: bool, graph: bool = False) -> SummaryResult:
    """The table of ``m`` on example inputs made on ``dev``; on meta, the weights are swapped
    for meta copies for the pass unless they are on meta already (in float32)."""
    import torch

    from inspect_model.loading.shapes import make_example_inputs

    x = make_example_inputs(sizes, batch_size=batch_size, family=loaded.family, dtype=torch_dtype,
                            device=dev, seed=seed, vocab=getattr(loaded, "token_vocab", None))
    fwd = None
    if dev == "meta" and (not _on_meta(m) or torch_dtype != torch.float32):
        fwd = _meta_call(m, x, torch_dtype)
    elif dev != "meta" and _on_meta(m):
        raise _NeedsRealModel()
    res = _traced(m, x, fwd, graph, name=loaded.name, depth=depth, train=train)
    if loaded.family == "detection":  # a list of images: batch first, as every other model's (issue 39)
        res.input_shapes = [[batch_size, *sizes[0]]]
    return res


def _traced(m: nn.Module, inputs: Sequence[Any], fwd: Callable[[], Any] | None, graph: bool, *,
            kwargs: dict[str, Any] | None = None, **opts: Any) -> SummaryResult:
    """:func:`summarize` of ``m``; with ``graph``, the same pass also records the data-flow
    graph (methods/graph.py) into the result's ``graph``."""
    from inspect_model.methods.summary import summarize

    call = fwd or (lambda: m(*inputs, **(kwargs or {})))
    if not graph:
        return summarize(m, inputs, forward=call, **opts)
    from inspect_model.methods.graph import GraphTracer

    tracer = GraphTracer(m, opts.get("depth"))

    def traced() -> Any:
        with tracer:
            return call()

    res = summarize(m, inputs, forward=traced, **opts)
    res.graph = tracer.graph()
    return res


def _meta_then_cpu(loaded: Any, run: Callable[[nn.Module, str], SummaryResult]
                   ) -> tuple[SummaryResult, nn.Module, list[str]]:
    """The pass on meta; where the meta device is the limit, again on the CPU (a model
    loaded on meta is rebuilt there when it is torchvision's). Returns the result, the
    model that made it, and a note on the fallback."""
    m = loaded.model
    res = run(m, "meta")
    if not (res.error and _meta_limitation(res.error)):
        return res, m, []
    reason = res.error
    try:
        res = run(m, "cpu")
    except _NeedsRealModel:
        from inspect_model.loading.models import load_torchvision

        if loaded.source == "hf":  # HF DETR reads values (.item()) in its forward (issue 24)
            from inspect_model.loading.sources.hf import load_hf

            real = load_hf(loaded.name, weights=None, device="cpu")
        elif loaded.source != "torchvision":
            from inspect_model.errors import UsageError

            # A refused combination, not a failed model (issue 42: never exit 6 for it).
            raise UsageError(
                f"the meta device cannot run this model ({one_line(reason)}); use --device cpu"
            ) from None
        else:
            real = load_torchvision(loaded.name, weights=None, device="cpu")
        m = real.model
        res = run(m, "cpu")
    note = f"the meta device could not run this model ({one_line(reason)}); used a real forward pass on cpu"
    return res, m, [note]


def _add_first_layer_hint(res: SummaryResult, m: nn.Module) -> None:
    """Append the first layer's input hint to an error raised at (or before) that layer:
    an input-shape problem. Out-of-memory errors stay as they are."""
    if res.error and not res.error.startswith(("out of CPU memory", "out of GPU memory")):
        sized = size_hint(m, res.error)
        if sized is not None:  # a ViT at the wrong image size: the size is the fix (issue 39)
            res.error = f"{res.error} ({sized})"
            return
        found = first_layer_hint(m)
        if found is not None:
            layer, hint = found
            status = {r.name: r.status for r in res.rows}.get(layer, "not reached")
            # Only when the pass died at (or before) the first layer: an input-shape problem.
            if status != "ok" and hint not in res.error:
                res.error = f"{res.error} ({hint})"


def _summarize_specs(loaded: Any, specs: list[Any], *, batch_size: int, dtype: str, device: str,
                     depth: int | None, seed: int, train: bool = False, graph: bool = False) -> SummaryResult:
    """The table for inputs given as specs (keyword inputs, integer token ids), on the CPU
    pass when the model is real, else on meta."""
    import torch

    from inspect_model.loading.shapes import make_input, parse_dtype

    m = loaded.model
    dev = "meta" if device == "meta" and _on_meta(m) else ("cpu" if device == "meta" else device)
    torch_dtype = parse_dtype(dtype)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for i, spec in enumerate(specs):
        t = make_input(spec, batch_size, dtype=torch_dtype, device=dev, seed=seed + i)
        if spec.name:
            kwargs[spec.name] = t
        else:
            args.append(t)
    flat = [*args, *kwargs.values()]
    fwd = _meta_call(m, args, torch_dtype, kwargs) if dev == "meta" and not _on_meta(m) else (
        lambda: m(*args, **kwargs))
    res = _traced(m, flat, fwd, graph, name=loaded.name, depth=depth, train=train)
    res.notes[:0] = list(loaded.notes)
    if device == "meta" and dev != "meta":
        res.notes.append("integer or keyword inputs: computed with a real forward pass on cpu")
    del torch
    return res


def _write_graph(logdir: Any, loaded: Any, res: SummaryResult, *, dtype: str, seed: int) -> str | None:
    """The model's graph in TensorBoard, traced on example inputs of the summarised shapes;
    a note when it cannot be (a failed trace, a model on meta, integer or keyword inputs)."""
    from pathlib import Path

    from inspect_model.loading.shapes import make_example_inputs, parse_dtype
    from inspect_model.output.tensorboard import open_writer, write_graph

    m = loaded.model
    if _on_meta(m):
        return "TensorBoard: the model's graph was not written (the model is on the meta device; use --device cpu)"
    if any(len(s) < 1 for s in res.input_shapes):
        return "TensorBoard: the model's graph was not written (an input has no batch dimension)"
    dev = next((str(t.device) for t in m.parameters()), "cpu")
    sizes = [tuple(s[1:]) for s in res.input_shapes]
    writer = open_writer(Path(logdir))
    try:
        x = make_example_inputs(sizes, batch_size=res.input_shapes[0][0], family=loaded.family,
                                dtype=parse_dtype(dtype), device=dev, seed=seed,
                                vocab=getattr(loaded, "token_vocab", None))
        return write_graph(writer, m, tuple(x) if len(x) > 1 else x[0])
    finally:
        writer.close()


def _meta_limitation(error: str) -> bool:
    """Whether a meta-pass error is the meta device's limit (an op with no meta kernel, a
    value read from a tensor) rather than a real model error that a CPU pass would repeat."""
    low = error.lower()
    return error.startswith("NotImplementedError") or "meta" in low or "data-dependent" in low


class _NeedsRealModel(Exception):
    pass


@dataclass(frozen=True)
class SummaryRequest(Request):
    """The options of ``summary`` beside the model's (the CLI's are in cli/summary.py: its
    device and weights defaults differ from the image commands')."""

    command: ClassVar[str] = "summary"

    input_size: Any = option(None, "--input-size", type=str, multiple=True, help="Per-sample input shape")
    batch_size: int = option(1, "--batch-size", help="Batch size.")
    dtype: str = option("float32", "--dtype", help="float32, float16, bfloat16 or float64.")
    device: str = option("meta", "--device", help="meta, cpu, cuda, mps or auto.")
    depth: int | None = option(None, "--depth", type=int, help="Only modules down to this nesting depth.")
    seed: int = option(0, "--seed", help="Seed for random inputs.")
    train: bool = option(False, "--train", help="Run the pass in training mode.")
    graph: bool = option(False, "--graph", help="Also draw the model's graph (graph.svg, graph.png, graph.dot).")
    text: tuple[str, ...] = option((), "--text", multiple=True, help="Size the inputs from these texts (a text "
                                   "model): their count and longest tokenised length.")
    text_file: Any = option(None, "--text-file", type=str, help="Texts to size the inputs from, one per line.")
    tokenizer: Any = option(None, "--tokenizer", type=str, help="The tokenizer's folder for --text.")

    def validate(self) -> None:
        positive(self.batch_size, "--batch-size")
        positive(self.depth, "--depth", zero=True)
        check_dtype(self.dtype)


@command(
    "summary",
    usage="summary MODEL",
    order=10,
    summary="layer table: qualified names, types, output shapes, parameters, MACs, memory",
    help=("Show the layer table: names, types, output shapes, parameters, MACs and "
          "memory.\n\nRuns on the meta device by default, so a model of any size is summarised "
          "without allocating its weights."),
    example="inspect-model summary resnet34 --depth 2",
    renderer=results.summary_report,
    tables=html_columns.summary_tables,
    schema="summary.json",
    report=SummaryReport,
    images=False,
    streams=False,
)
@api_command(SummaryRequest, images=False)
def summary(model: Any, request: SummaryRequest, *, model_options: ModelOptions | None = None,
            output_dir: Any = None, force: bool = False, notes: Any = None, tensorboard: Any = None) -> Result:
    """The layer table of ``model`` (a spec, an ``nn.Module`` or a ``LoadedModel``).

    The result has the table's attributes (``rows``, ``total_params``, ``total_macs``...),
    ``to_dict()`` (the ``--json`` document) and ``save(dir)``. A forward pass that fails
    keeps the rows up to the failing layer; ``result.error`` says why. ``train=True`` runs the
    pass in training mode (dropout and batch norm as in training; every flag and running
    statistic put back); ``tensorboard=DIR`` writes the model's graph there (issue 14)."""

    r = request
    input_size, batch_size, depth, seed, train = r.input_size or None, r.batch_size, r.depth, r.seed, r.train
    mopts = model_options or ModelOptions(model, weights=None, device=r.device, dtype=r.dtype)
    dev = mopts.device.strip().lower() if mopts.device else "meta"
    if dev != "meta":
        dev = resolve_device(dev)
    # The graph is a trace of real tensors: with --tensorboard the weights are allocated.
    real = mopts.checkpoint or tensorboard is not None
    load_device = "meta" if dev == "meta" and not real else ("cpu" if dev == "meta" else dev)
    loaded = load(mopts, device=load_device)
    if r.text or r.text_file is not None:  # issue 42: the inputs sized from the texts
        input_size, batch_size = _text_sizes(loaded, r, mopts, notes)
    require_hookable(loaded, "summary")
    for note in loaded.notes if notes is not None else []:
        notes(note)
    from inspect_model.run.tasks import summary_inputs

    with summary_inputs(loaded.model):  # a seq2seq decoder's or a two-tower model's other input (issue 42)
        res = summarize_model(loaded, input_size=input_size, batch_size=batch_size, dtype=mopts.dtype, device=dev,
                              depth=depth, seed=seed, train=train, graph=r.graph)
    drawn = None
    if res.graph is not None:
        from inspect_model.render.graph import GraphFiles

        drawn = GraphFiles(res.graph, loaded.name)
        res.notes.extend(drawn.notes)
    if train:
        res.notes.append("train mode: dropout and batch norm ran as in training (batch statistics); "
                         "running statistics and training flags were put back")
    if tensorboard is not None:
        note = _write_graph(tensorboard, loaded, res, dtype=mopts.dtype, seed=seed)
        if note is not None:
            res.notes.append(note)
    if notes is not None:
        for note in res.notes[len(loaded.notes):]:
            notes(note)
    options = {
        "model": mopts.spec(), "weights": resolved_weights(loaded, mopts),
        "checkpoint": str(mopts.checkpoint) if mopts.checkpoint else None, "input_size": res.input_shapes,
        "batch_size": batch_size, "dtype": mopts.dtype, "depth": depth, "device": res.device,
        "seed": seed, "mode": "train" if train else "eval",
    }
    if r.graph:
        options["graph"] = True
    payload = summary_body(res)
    if res.graph is not None:
        payload["graph"] = {"nodes": len(res.graph.nodes), "edges": len(res.graph.edges)}
    result = Result("summary", options, payload, [], record=res, session=drawn)
    if output_dir is not None and not res.error:  # a failed pass leaves no files (the CLI exits 6)
        result.save(output_dir, force=force)
    return result


def _text_sizes(loaded: Any, r: SummaryRequest, mopts: ModelOptions, notes: Any) -> tuple[list[str], int]:
    """``--text``: one input per text, as long as the longest tokenised text (token ids)."""
    from inspect_model.errors import UsageError
    from inspect_model.loading.text import load_tokenizer, read_texts, tokenizer_folder

    if r.input_size:
        raise UsageError("--text sizes the input from the texts; drop --input-size")
    texts = read_texts(list(r.text), r.text_file)
    tok = load_tokenizer(tokenizer_folder(loaded, r.tokenizer, mopts.model))
    longest = max(len(tok(t)["input_ids"]) for t in texts)
    if notes is not None:
        notes(f"inputs sized from --text: {len(texts)} text(s) of up to {longest} token(s)")
    return [str(longest)], len(texts)
