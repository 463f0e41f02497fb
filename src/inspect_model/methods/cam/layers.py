"""Where a class activation map is taken: ``--layer auto`` and the layout of a layer's output.

:func:`resolve_layers` turns ``auto`` or layer specs into :class:`CamLayer` records: the
layer's name and the :class:`~.maths.Layout` that lays its output on a spatial grid --
channels-first (CNNs, MaxViT), channels-last (torchvision's Swin), or patch tokens with the
class/register tokens dropped (ViT; the grid from the model's patch size and the token count,
or ``--reshape HxW``). ``auto`` needs the output shapes, so it probes with one no-grad forward
pass of a single sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inspect_model.errors import LayerSelectionError, UsageError
from inspect_model.methods.cam import maths as cm
from inspect_model.methods.cam.maths import Layout

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["CamLayer", "auto_layer", "infer_layout", "resolve_layer", "resolve_layers", "single_output"]

@dataclass(frozen=True)
class CamLayer:
    """A layer maps are taken at, and how its output lies on the spatial grid."""

    name: str
    layout: Layout
    output_shape: tuple[int, ...]  # per-sample shape of the layer's output (no batch)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "output_shape": list(self.output_shape), **self.layout.describe()}


# ----------------------------------------------------------------------------- layers
def _is_vit(model: nn.Module) -> bool:
    enc = getattr(model, "encoder", None)
    return hasattr(model, "patch_size") and enc is not None and hasattr(enc, "layers") \
        and hasattr(model, "class_token")


def _is_swin(model: nn.Module) -> bool:
    """torchvision's Swin (``features``) and timm's (``layers``): stages output (N, H, W, C)."""
    return type(model).__name__.startswith("SwinTransformer") and (
        hasattr(model, "features") or hasattr(model, "layers"))


def _hub_auto_layer(model: nn.Module) -> str | None:
    """``--layer auto`` from what a hub model declares, or None.

    - timm: the last module of its ``feature_info`` (a CNN's or Swin's last stage; a ViT or
      DeiT pooling its class token: the last block's first norm, see
      :func:`~inspect_model.loading.sources.timm.declared_cam_layer`).
    - Hugging Face, from its ``config.model_type``: ViT/DeiT the last block's first norm
      (``...layers.N.layernorm_before``, ``encoder.layer.N`` before transformers 5), whose
      patch tokens reach the class token through attention; Swin the final ``layernorm``
      (N, h*w, C) (its stages return tuples); ConvNeXt the last stage ``...encoder.stages.N``.
    """
    from inspect_model.loading.sources.timm import declared_cam_layer

    declared = declared_cam_layer(model)
    if declared is not None:
        return declared
    names = [n for n, _ in model.named_modules() if n]
    model_type = str(getattr(getattr(model, "config", None), "model_type", "") or "")
    if model_type in ("vit", "deit", "vit_msn", "vit_mae", "dinov2", "dinov2_with_registers"):
        last = [n for n in names if n.endswith((".layernorm_before", ".norm1")) and ".attention" not in n]
        return last[-1] if last else None
    if model_type in ("swin", "swinv2", "donut-swin"):
        top = [n for n in names if n.split(".")[-1] == "layernorm" and n.count(".") <= 1]
        return top[-1] if top else None
    if model_type in ("convnext", "convnextv2"):
        stages = [n for n in names if n.rsplit(".", 1)[0].endswith("encoder.stages")]
        return stages[-1] if stages else None
    return None


def _patch_size(model: nn.Module) -> int | None:
    """The patch size of torchvision's (``patch_size``), timm's (``patch_embed.patch_size``)
    or Hugging Face's (``config.patch_size``) vision transformers."""
    for p in (getattr(model, "patch_size", None), getattr(getattr(model, "patch_embed", None), "patch_size", None),
              getattr(getattr(model, "config", None), "patch_size", None)):
        if isinstance(p, (list, tuple)) and p:
            p = p[0]
        if isinstance(p, int) and p > 0:
            return p
    return None


def _probe(model: nn.Module, x: torch.Tensor, names: Sequence[str], probe: int = 1) -> list[Any]:
    """One no-grad forward of the first sample; records of ``names`` (shapes only)."""
    from inspect_model.engine.hooks import CaptureOptions, HookEngine, run_forward

    with HookEngine(model, list(names), CaptureOptions(outputs=True, grad_enabled=False)) as eng:
        # A copy: a model that scales its input in place (x /= 255) must not change ``x``,
        # which the real passes use next (issue 28).
        run_forward(eng, lambda: model(x[:probe].detach().clone()))
    return eng.finalize()


def _probe_paths(model: nn.Module, x: torch.Tensor, names: Sequence[str],
                 output_key: str | None, probe: int = 1) -> tuple[list[Any], set[str] | None]:
    """Like :func:`_probe`, with the graph on: also the names among ``names`` whose output
    the scored output (``output_key``) depends on, or None when that cannot be told (an
    integer input and frozen weights build no graph)."""
    import torch

    from inspect_model.engine.hooks import CaptureOptions, HookEngine, run_forward
    from inspect_model.methods.objectives.targets import select_output

    x1 = x[:probe].detach()
    if x1.is_floating_point():
        x1 = x1.clone().requires_grad_(True)
    nodes: dict[str, Any] = {}
    modules = dict(model.named_modules())

    def keep(name: str) -> Any:
        def hook(mod: nn.Module, args: tuple, out: Any) -> None:
            if isinstance(out, torch.Tensor) and out.grad_fn is not None:
                nodes[name] = out  # read after the pass: in-place ops later move its grad_fn
        return hook

    handles = []
    try:
        with HookEngine(model, list(names), CaptureOptions(outputs=True, grad_enabled=True)) as eng:
            handles = [modules[n].register_forward_hook(keep(n)) for n in names if n in modules]
            out = run_forward(eng, lambda: model(x1.clone()))  # a non-leaf: x /= 255 is allowed
    finally:
        for h in handles:
            h.remove()
    records = eng.finalize()
    try:
        scored = select_output(out, output_key)
    except Exception:
        return records, None
    if scored.grad_fn is None:
        return records, None
    reach: set[Any] = set()
    todo = [scored.grad_fn]
    while todo:  # every autograd node the scored output is computed from
        node = todo.pop()
        if node is None or node in reach:
            continue
        reach.add(node)
        todo.extend(nxt for nxt, _ in node.next_functions)
    return records, {n for n, t in nodes.items() if t.grad_fn in reach}


def auto_layer(model: nn.Module, x: torch.Tensor, output_key: str | None = None, probe: int = 1) -> str:
    """The layer ``--layer auto`` picks: for torchvision's ViT the last block's first norm
    (its patch tokens feed the class token through attention), for Swin the last stage, and
    otherwise the outermost module producing the last (N, C, h, w) output with h*w > 1 that
    the scored output (``output_key``) depends on -- for a CNN, its last conv block; for a
    model with several heads, not a branch that only feeds another head."""
    if _is_vit(model):
        last = list(model.encoder.layers.named_children())[-1][0]  # type: ignore[union-attr]
        return f"encoder.layers.{last}.ln_1"
    if _is_swin(model) and hasattr(model, "features"):
        return f"features.{len(model.features) - 1}"  # type: ignore[arg-type]
    hub = _hub_auto_layer(model)
    if hub is not None:
        return hub
    from inspect_model.methods.cam.video import auto_layer3d

    video = auto_layer3d(model)
    if video is not None:
        return video
    names = [n for n, _ in model.named_modules() if n]
    records, on_path = _probe_paths(model, x, names, output_key, probe)
    last = None
    for r in records:
        if not r.finished or len(r.outputs) != 1 or r.outputs[0].key != "":
            continue
        if on_path is not None and r.name not in on_path:
            continue  # a branch the scored output does not depend on (issue 14)
        shape = r.outputs[0].shape
        if len(shape) in (4, 5) and shape[-2] * shape[-1] > 1 and r.outputs[0].dtype.startswith(("float", "bfloat")):
            last = r
    if last is None:
        kind = type(model).__name__
        raise LayerSelectionError(
            f"{kind} has no layer with a spatial (N, C, H, W) output to take a class activation map "
            "at; for a transformer pass --layer NAME (a layer in the last block) and --reshape HxW")
    shape = last.outputs[0].shape
    by_name: dict[str, Any] = {}
    for r in records:
        if r.finished and len(r.outputs) == 1:
            by_name[r.name] = r  # last call wins
    parts = last.name.split(".")
    for i in range(1, len(parts)):
        anc = by_name.get(".".join(parts[:i]))
        if anc is not None and anc.outputs[0].shape == shape and (on_path is None or anc.name in on_path):
            return anc.name
    return last.name


def infer_layout(model: nn.Module, name: str, shape: tuple[int, ...], input_hw: tuple[int, int],
                 reshape: tuple[int, int] | None = None) -> Layout:
    """How the (batched) output ``shape`` of layer ``name`` lies on a grid (see :class:`Layout`)."""
    from torch import nn

    if len(input_hw) == 3:  # a clip's (T, H, W): the video layouts
        from inspect_model.methods.cam.video import infer_layout3d

        return infer_layout3d(model, name, shape, input_hw, reshape)
    module = dict(model.named_modules()).get(name)
    if len(shape) == 4:
        if reshape is not None:
            raise UsageError(f"--reshape applies to token layers (N, tokens, D); layer '{name}' "
                             f"outputs {tuple(shape)}")
        if _is_swin(model) and not isinstance(module, nn.Conv2d):
            layout = Layout("nhwc", (shape[1], shape[2]), channels=shape[3])
        else:
            layout = Layout("nchw", (shape[2], shape[3]), channels=shape[1])
        if layout.grid[0] * layout.grid[1] <= 1:
            raise LayerSelectionError(
                f"layer '{name}' outputs {tuple(shape)}: a 1x1 map has no spatial extent; "
                "pick an earlier layer (for a CNN the last conv block), or use --layer auto")
        return layout
    if len(shape) == 3:
        tokens, dim = shape[1], shape[2]
        if reshape is not None:
            prefix = tokens - reshape[0] * reshape[1]
            if prefix < 0:
                raise UsageError(f"--reshape {reshape[0]}x{reshape[1]} needs {reshape[0] * reshape[1]} "
                                 f"tokens but layer '{name}' outputs {tokens}")
            return Layout("tokens", reshape, prefix=prefix, channels=dim)
        patch = _patch_size(model)
        if patch is not None:
            gh, gw = input_hw[0] // patch, input_hw[1] // patch
            if 0 <= tokens - gh * gw <= 16:
                return Layout("tokens", (gh, gw), prefix=tokens - gh * gw, channels=dim)
        found = cm.token_grid(tokens, input_hw)
        if found is None:
            raise UsageError(f"cannot lay the {tokens} tokens of layer '{name}' on a patch grid; "
                             "pass --reshape HxW (the patch grid, e.g. 14x14)")
        prefix, grid = found
        return Layout("tokens", grid, prefix=prefix, channels=dim)
    raise LayerSelectionError(
        f"layer '{name}' outputs {tuple(shape)}: no spatial extent; a class activation map needs "
        "(N, C, H, W) feature maps or (N, tokens, D) patch tokens; try --layer auto")


def resolve_layers(model: nn.Module, x: torch.Tensor, specs: Sequence[str] | None = None,
                   reshape: tuple[int, int] | None = None, output_key: str | None = None,
                   probe: int = 1, declared: str | None = None) -> list[CamLayer]:
    """``auto`` (or no spec) or layer specs -> :class:`CamLayer` records, probing the output
    shapes with one no-grad forward pass of ``x[:probe]`` (``probe``: the batch size a
    torch.export program was fixed to, else 1). ``declared``: the layer the model's source
    names for ``auto`` (``LoadedModel.cam_layer``), used instead of the search."""
    from inspect_model.engine.selection import select_layers

    specs = [s for s in (specs or []) if s.strip()]
    names: list[str] = []
    for spec in specs or ["auto"]:
        if spec.strip().lower() == "auto":
            names.append(declared or auto_layer(model, x, output_key, probe))
        else:
            plain = not any(ch in spec for ch in "*?[") and not spec.startswith("type:")
            names.extend(select_layers(model, [spec], leaves_only=not plain))
    names = list(dict.fromkeys(names))
    records = {r.name: r for r in _probe(model, x, names, probe)}
    hw = input_dims(x)
    out = []
    for n in names:
        rec = records.get(n)
        if rec is None:
            raise LayerSelectionError(f"layer '{n}' is not called in the forward pass; pick a layer "
                                      "that runs (see `inspect-model summary MODEL`)")
        cap = single_output(rec, n)
        out.append(CamLayer(n, infer_layout(model, n, cap.shape, hw, reshape), tuple(cap.shape[1:])))
    return out


def input_dims(x: torch.Tensor) -> tuple[int, ...]:
    """(H, W) of an image batch, (T, H, W) of a clip batch (N, C, T, H, W)."""
    return tuple(int(d) for d in x.shape[2:]) if x.dim() == 5 else (int(x.shape[-2]), int(x.shape[-1]))


def single_output(rec: Any, name: str) -> Any:
    if len(rec.outputs) != 1 or rec.outputs[0].key != "":
        raise LayerSelectionError(f"layer '{name}' returns {len(rec.outputs)} tensors (a tuple or dict); "
                                  "pick a layer that returns one tensor, e.g. a sub-layer of it")
    return rec.outputs[0]


def resolve_layer(model: nn.Module, spec: str = "auto", x: torch.Tensor | None = None,
                  output_key: str | None = None) -> str:
    """One layer name for ``spec`` (``auto`` or a spec selecting exactly one layer). ``x``
    (a batch the model accepts) is used for the probe pass of ``auto``; without it a zero
    (1, C, 224, 224) input is used."""
    import torch

    if x is None:
        from inspect_model.loading.inputs import model_channels

        p = next(iter(model.parameters()), None)
        x = torch.zeros(1, model_channels(model), 224, 224,
                        dtype=p.dtype if p is not None else torch.float32,
                        device=p.device if p is not None else "cpu")
    names = [layer.name for layer in resolve_layers(model, x, [spec], output_key=output_key)]
    if len(names) != 1:
        raise LayerSelectionError(f"--layer '{spec}' selects {len(names)} layers; give exactly one")
    return names[0]
