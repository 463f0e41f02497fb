"""The run behind :func:`compute_attention`: one forward pass
under the attention capture, then the target score's backward pass (shared by the methods
whose ``score_backward`` is set and the gradient CAMs) and one of its own per other gradient
method. Each attention method (one module under :mod:`.variants`) folds in what each layer
gives as it comes (a running product for rollout, one query row per raw layer, a running sum
for LeGrad), so no layer is kept that was not asked for, and makes its map at the end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inspect_model.errors import LayerSelectionError, ModelRuntimeError, UnsupportedModelError, UsageError
from inspect_model.loading.wrappers import unwrap_module
from inspect_model.methods.attention import base
from inspect_model.methods.attention import maps as am
from inspect_model.methods.attention.models import block_of, model_scores, patch_grid, tokens_of

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass
class RunState:
    """What one run keeps while the passes go: shared facts (tokens, heads, windows) and the
    built-in methods' running values; ``scratch`` holds any other method's own."""

    batch: int
    opts: am.AttentionOptions
    raw_layers: set[str]
    head_layers: set[str]  # the layers of the methods that score tokens through the head (needs_head)
    query: str | int
    methods: list[base.AttentionMethod] = field(default_factory=list)  # the attention methods asked for    prefix: int | None = None
    tokens: int | None = None
    heads: int | None = None
    rollout: Any = None  # (B, N, N) running product
    raw: dict[str, Any] = field(default_factory=dict)  # layer -> (B, h, Nk)
    abar: dict[int, Any] = field(default_factory=dict)  # call index -> (B, N, N)
    legrad: Any = None  # (B, Nk) running sum
    legrad_count: int = 0
    legrad_hw: Any = None  # the feature map of windowed LeGrad layers
    gr_row: Any = None  # (B, N): grad-rollout's class row, folded from the output end
    gr_last: int = 0  # the call index folded last
    phase: str = ""
    mosaic: list[Any] = field(default_factory=list)  # per call: (B, h, Nk)
    owners: dict[str, Any] = field(default_factory=dict)  # windowed layer -> its WindowOwner
    windowed: set[str] = field(default_factory=set)
    wlayers: list[Any] = field(default_factory=list)  # WindowLayer per windowed call (rollout, grad-rollout)
    wblocks: dict[int, Any] = field(default_factory=dict)  # call index -> (B, G, N, N) rollout blocks
    scratch: dict[str, Any] = field(default_factory=dict)  # a method's own running values, by its name
    _rows: tuple[int, Any] | None = None

    def query_rows(self, call: Any) -> torch.Tensor:
        """The chosen query's row of ``call``'s probabilities (B, h, Nk), float; made once a call."""
        if self._rows is None or self._rows[0] != call.index:
            self._rows = (call.index, am.query_rows(call.probs(), self.query, self.prefix or 0).float())
        return self._rows[1]

    @property
    def folds_all(self) -> bool:
        """A method asked for folds every attention layer (rollout, grad-rollout)."""
        return any(m.all_layers for m in self.methods)


def _check_call(st: RunState, call: Any, model: nn.Module) -> None:
    from inspect_model.engine.attention import prefix_tokens

    if call.batch != st.batch or call.name in st.owners:  # a Swin stage of one window is windowed too
        what = f"'{call.name}' attends within {call.batch} windows of {call.queries} tokens for {st.batch} image(s)"
        if call.name not in st.owners:
            raise UnsupportedModelError(f"attention in {what}, in a layout this tool cannot map back to the image "
                                        "(windowed or grid attention of neither Swin nor MaxViT); cam and "
                                        "attributions take this model")
        if st.tokens is not None and st.opts.methods != ("raw",):
            raise UnsupportedModelError(f"attention in {what} after global attention over {st.tokens} tokens: "
                                        "rollout through a mix of windowed and global attention is not supported; "
                                        "-m raw works")
        st.windowed.add(call.name)
        return
    if st.windowed and st.opts.methods != ("raw",):
        raise UnsupportedModelError(f"attention in '{call.name}' is global after windowed attention: rollout "
                                    "through a mix of windowed and global attention is not supported; -m raw works")
    if call.queries != call.keys:
        raise UnsupportedModelError(
            f"attention in '{call.name}' maps {call.queries} queries to {call.keys} keys: these methods need "
            "self-attention over one token sequence (found cross- or reduced-key attention); cam and attributions "
            "take this model")
    if st.tokens is None:
        st.tokens, st.heads = call.keys, call.heads
        st.prefix = prefix_tokens(model, call.keys)
    elif call.keys != st.tokens and st.folds_all:
        raise UnsupportedModelError(
            f"attention in '{call.name}' has {call.keys} tokens where an earlier layer had {st.tokens}: rollout "
            "needs the same tokens in every layer (found a hierarchical transformer); -m raw works")


def _on_forward(st: RunState, model: nn.Module) -> Any:
    def fn(call: Any) -> None:
        _check_call(st, call, model)
        if call.name in st.windowed:
            if st.folds_all:
                from inspect_model.methods.attention import hierarchical as ah

                st.wlayers.append(ah.window_layer(call, st.owners[call.name], st.batch))
            for m in st.methods:
                m.forward_windowed(st, call)
            return
        if st.opts.mosaic:
            st.mosaic.append(st.query_rows(call))
        for m in st.methods:
            m.forward(st, call)
    return fn


def _on_backward(st: RunState) -> Any:
    def fn(call: Any, grad: torch.Tensor) -> None:
        method = base.methods().get(st.phase)  # "score": the gradient CAMs' pass, nothing to fold
        if method is not None:
            method.backward(st, call, grad)
    return fn


def one_target_each(target: Any, scores: torch.Tensor, what: str = "image") -> list[int]:
    """One class (or token) per ``what`` (image, text) for ``target``: predicted (also for
    None), an index, a TargetSpec or a list of one per row."""
    from inspect_model.methods.objectives.targets import TargetSpec, parse_target, resolve_targets

    if isinstance(target, int) and not isinstance(target, bool):
        target = TargetSpec("class", index=target, text=str(target))
    elif isinstance(target, str) or target is None:
        target = parse_target(target or "predicted")
    elif not isinstance(target, TargetSpec):
        rows = [int(t) for t in list(target)]
        if len(rows) != scores.shape[0]:
            raise UsageError(f"{len(rows)} targets for {scores.shape[0]} {what}s")
        return rows
    if target.kind == "top" and target.k > 1:
        raise UsageError(f"attention explains one class per {what}: use --target predicted or a class")
    return [r[0] for r in resolve_targets(target, scores)]


def _scores_and_targets(out: Any, target: Any, *, required: bool) -> tuple[Any, list[int] | None]:
    """The class scores and one target per image; without a gradient method a model whose
    output is no (N, classes) tensor just has none."""
    from inspect_model.errors import InspectModelError

    try:
        scores = model_scores(out)
    except InspectModelError as exc:
        if required:  # a refusal, not a failure (issue 42): raw and rollout run on such a model
            raise UsageError(f"{exc}; raw attention and rollout need none: -m raw,rollout") from exc
        return None, None
    try:
        return scores, one_target_each(target, scores.detach())
    except InspectModelError:
        if required:
            raise
        return None, None


def run(model: nn.Module, x: torch.Tensor, opts: am.AttentionOptions, target: Any,
        cam_layer: Any = None) -> am.AttentionResult:
    from inspect_model.engine.attention import AttentionCapture, attention_modules
    from inspect_model.engine.hooks import CaptureOptions, HookEngine, run_forward
    from inspect_model.methods.attention import cam as attention_cam

    names = attention_modules(model)
    methods = opts.methods
    own = [base.get(m) for m in methods if base.known(m)]
    hw = (int(x.shape[-2]), int(x.shape[-1]))
    keep_raw, heads = [m for m in own if m.keeps_raw], [m for m in own if m.needs_head]
    raw_layers = am.select_layers(opts.layers or [keep_raw[0].default_layers], names) if keep_raw and names else []
    head_layers = am.select_layers(opts.layers or [heads[0].default_layers], names) if heads and names else []
    st = RunState(int(x.shape[0]), opts, set(raw_layers), set(head_layers), am.parse_query(opts.query), own)
    wanted = None if not names or opts.mosaic or st.folds_all else st.raw_layers | st.head_layers
    blocks: dict[str, Any] = {}
    handles: list[Any] = []
    passes = {"forward": 0, "backward": 0}
    cams = am.cam_methods(methods)
    tap = attention_cam.CamTap(model, attention_cam.resolve(model, x, cam_layer or opts.cam_layer), cams) \
        if cams else None
    options = CaptureOptions(outputs=False, eval_mode=True, freeze_params=True, grad_enabled=opts.needs_grad)
    with HookEngine(model, [], options) as eng:
        try:
            modules = dict(model.named_modules())
            _hook_windows(model, names, st, handles)
            if tap is not None:
                tap.attach(handles)
            block_names = _legrad_blocks(model, st, head_layers)
            for block in dict.fromkeys(block_names.values()):
                handles.append(modules[block].register_forward_hook(
                    lambda _m, _a, out, block=block: blocks.__setitem__(block, tokens_of(out))))
            xin = x.detach().clone().requires_grad_(opts.needs_grad)
            capture = AttentionCapture(model, wanted=None if wanted is None else wanted.__contains__,
                                       forward=_on_forward(st, model),
                                       backward=_on_backward(st) if any(m.needs_gradients for m in own)
                                       else None)
            with capture:
                out = run_forward(eng, lambda: model(xin))
                passes["forward"] += 1
                if not capture.calls:
                    raise LayerSelectionError(
                        f"no attention found in {type(model).__name__}: no nn.MultiheadAttention, "
                        "scaled_dot_product_attention or softmax attention ran in the forward pass")
                scores, classes = _scores_and_targets(out, target, required=opts.needs_grad)
                if opts.needs_grad:
                    _backward_passes(model, st, scores, classes, xin, passes,
                                     [blocks[block_names[n]] for n in _legrad_stage(st, head_layers, block_names,
                                                                                     blocks)])
        finally:
            for h in handles:
                h.remove()
    if st.tokens is None and not st.windowed:  # no attention layer asked for (CAM methods only)
        _check_call(st, capture.calls[0], model)
    res = _finish(st, capture.calls, hw, raw_layers, scores, classes, passes)
    if tap is not None:
        res.maps.update(tap.maps(classes))
        res.cam_layer = tap.layer.name
    return res


def _backward_passes(model: nn.Module, st: RunState, scores: Any, classes: Any, xin: torch.Tensor,
                     passes: dict[str, int], head_tokens: list[Any]) -> None:
    """The target score's backward pass (the ``score_backward`` methods', shared by the
    gradient CAMs), then one of its own per other gradient method (LeGrad's)."""
    import torch

    assert scores is not None and classes is not None
    idx = torch.tensor(classes, device=scores.device).view(-1, 1)
    own = [m for m in st.methods if m.needs_gradients and not m.score_backward]
    if st.opts.score_backward:
        st.phase = next((m.name for m in st.methods if m.score_backward), "score")
        torch.autograd.grad(scores.gather(1, idx).sum(), xin, retain_graph=bool(own))
        passes["backward"] += 1
    for m in own:
        st.phase = m.name
        m.own_backward(model, st, idx, xin, head_tokens)
        passes["backward"] += 1


def _legrad_blocks(model: nn.Module, st: RunState, layers: list[str]) -> dict[str, str]:
    """Attention layer -> the block whose output LeGrad scores: the window owner when it is
    not the attention module itself (timm Swin's block, MaxViT's partition layer), else the
    transformer block around it."""
    out = {}
    for n in layers:
        owner = st.owners.get(n)
        out[n] = owner.name if owner is not None and owner.name != n else block_of(model, n)
    return out


def _legrad_stage(st: RunState, layers: list[str], block_names: dict[str, str], blocks: dict[str, Any]) -> list[str]:
    """The LeGrad layers whose blocks give the head's tokens: all of them for a ViT; for a
    hierarchical model those of the last stage (earlier stages have other widths)."""
    if not layers or not st.windowed:
        return layers
    last = tuple(blocks[block_names[layers[-1]]].shape)
    keep = [n for n in layers if tuple(blocks[block_names[n]].shape) == last]
    if st.opts.layers and len(keep) < len(layers):
        bad = next(n for n in layers if n not in keep)
        raise UsageError(f"legrad at '{bad}': the model's head reads only the last stage's tokens "
                         f"{last[1:]}; choose layers of the last stage ({keep[0]} ..)")
    st.head_layers = set(keep)
    return keep


def _hook_windows(model: nn.Module, names: list[str], st: RunState, handles: list[Any]) -> None:
    """A pre-hook on each Swin window owner that notes its feature map's (H, W)."""
    from inspect_model.methods.attention.windows import window_owner

    for name in names:
        owner = window_owner(model, name)
        if owner is None:
            continue
        st.owners[name] = owner

        def note(_m: Any, args: Any, owner: Any = owner) -> None:
            if not owner.maxvit and args and hasattr(args[0], "shape") and args[0].dim() == 4:
                owner.hw = (int(args[0].shape[1]), int(args[0].shape[2]))  # (B, H, W, C)
        handles.append(owner.module.register_forward_pre_hook(note))


def _finish(st: RunState, calls: list[Any], hw: tuple[int, int], raw_layers: list[str],
            scores: Any, classes: list[int] | None, passes: dict[str, int]) -> am.AttentionResult:
    import torch

    if st.tokens is None:  # windowed attention only: maps are already on their feature maps
        first = (st.wlayers[0].hw if st.wlayers else tuple(st.raw[raw_layers[0]].shape[-2:]) if raw_layers
                 else st.owners[calls[0].name].hw)
        st.tokens, st.prefix, st.heads = int(first[0] * first[1]), 0, int(calls[0].heads)
        grid = (int(first[0]), int(first[1]))
    else:
        grid = patch_grid(st.tokens - (st.prefix or 0), hw)
    assert st.heads is not None and st.prefix is not None
    p, n = st.prefix, st.tokens

    def to_grid(row: torch.Tensor) -> torch.Tensor:  # (..., N) -> (..., rows, cols)
        return row[..., p:].reshape(*row.shape[:-1], *grid).float().cpu()

    maps: dict[str, torch.Tensor] = {}
    for m in st.methods:  # windowed (Swin, MaxViT): on the first attention layer's feature map
        out = m.result(st, to_grid)
        if out is not None:
            maps[m.name] = out
    raw, labels = _raw_maps(st, raw_layers, to_grid)
    layer_names = list(dict.fromkeys(c.name for c in calls))
    return am.AttentionResult(maps=maps, raw=raw, head_labels=labels, layers=layer_names, heads=st.heads,
                              tokens=n, prefix=p, grid=grid, input_hw=hw,
                              scores=None if scores is None else scores.detach().float().cpu(),
                              targets=classes, passes=passes, calls=calls,
                              mosaic=to_grid(torch.stack(st.mosaic, dim=1)) if st.mosaic else None,
                              windowed=[n for n in raw_layers if n in st.windowed], hierarchical=bool(st.windowed))


def _raw_maps(st: RunState, layers: list[str], to_grid: Any) -> tuple[dict[str, Any], dict[str, list[str]]]:
    heads = am.parse_heads(st.opts.heads)
    raw: dict[str, Any] = {}
    labels: dict[str, list[str]] = {}
    for name in layers:
        if name not in st.raw:
            raise LayerSelectionError(f"attention layer '{name}' did not run in the forward pass")
        rows = st.raw[name]  # (B, h, Nk)
        if name in st.windowed:
            grid_of = rows.shape[-2:]
            rows = rows.flatten(2)  # (B, heads, H*W): heads picked below as for any layer
            to_layer = lambda r, g=grid_of: r.reshape(*r.shape[:-1], *g).float().cpu()
        else:
            to_layer = to_grid
        if heads == "all":
            raw[name] = to_layer(rows)
            labels[name] = [f"head {h}" for h in range(rows.shape[1])]
        elif isinstance(heads, str):
            raw[name] = to_layer(am.fuse_heads(rows, heads).unsqueeze(1))
            labels[name] = [f"{heads} of {rows.shape[1]} heads"]
        else:
            bad = [h for h in heads if not -rows.shape[1] <= h < rows.shape[1]]
            if bad:
                raise UsageError(f"--heads {bad[0]} is out of range: '{name}' has {rows.shape[1]} heads "
                                 f"(0..{rows.shape[1] - 1})")
            raw[name] = to_layer(rows[:, list(heads)])
            labels[name] = [f"head {h % rows.shape[1]}" for h in heads]
    return raw, labels


def compute_attention(model: nn.Module, x: torch.Tensor, options: am.AttentionOptions | None = None,
                      target: Any = "predicted", cam_layer: Any = None) -> am.AttentionResult:
    """The maps of ``options.methods`` for the batch ``x`` (B, C, H, W); the model is given
    back as it was. ``target``: ``predicted``, a class index, a :class:`TargetSpec` or one
    class index per image (gradient methods). ``cam_layer``: a ``CamLayer`` already resolved
    for the CAM-family methods (else ``options.cam_layer`` is resolved with a probe pass)."""
    model = unwrap_module(model)[0]  # compiled / DataParallel: the module inside (loading/wrappers.py)
    return run(model, x, options or am.AttentionOptions(), target, cam_layer)
