"""CAM-family maps in an ``attention`` run, from its own forward and backward pass.

``--method rollout,grad-rollout,gradcam`` asks for Grad-CAM (or Grad-CAM++, XGrad-CAM,
Layer-CAM, HiResCAM, Eigen-CAM) beside the attention maps, so that one run draws and ranks
them all. The layer is the one ``cam`` picks (``--cam-layer auto``: for torchvision's ViT the
last block's first norm, its tokens laid on the patch grid with the class token dropped; for
Swin the last stage; a model source's declared layer), resolved once per run with the
same :func:`~inspect_model.methods.cam.layers.resolve_layers`. Its output is kept from the
attention run's forward pass and its gradient read by a tensor hook during the backward pass
of the target's score that grad-rollout runs (one is run for the CAM methods alone when
grad-rollout is not asked for). The maps are ``methods.cam.maths``' formulas, after the
ReLU ``cam`` applies (``finish_maps``), at the layer's resolution.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inspect_model.errors import LayerSelectionError, UsageError

if TYPE_CHECKING:
    import torch
    from torch import nn

def cam_names() -> tuple[str, ...]:
    """The CAM methods an attention run can add: those of one forward (+ backward) pass that
    need no classifier of their own (CAM needs global pooling + one linear layer; Score-CAM
    passes of its own: both stay with ``cam``)."""
    from inspect_model.methods.cam import base

    return base.shared_pass_names()


def cam_name(token: str) -> str | None:
    """``gradcam``, ``Grad-CAM++`` ... -> the registry's name; ``None`` when not a CAM method.
    ``cam``/``scorecam`` are refused with what to run instead."""
    from inspect_model.methods.cam import base

    key = token.lower().replace("_", "").replace("-", "")
    key = base.aliases().get(key, key)
    if key in base.names() and key not in cam_names():
        raise UsageError(f"--method '{token}' takes a classifier check or passes of its own: run "
                         f"`inspect-model cam MODEL IMAGES --method {key}` (attention adds "
                         f"{', '.join(cam_names())})")
    return key if key in base.names() else None


class CamTap:
    """Keeps one layer's output from the forward pass and its gradient from the backward pass."""

    def __init__(self, model: nn.Module, layer: Any, methods: tuple[str, ...]) -> None:
        self.model, self.layer, self.methods = model, layer, methods
        self.act: torch.Tensor | None = None
        self.grad: torch.Tensor | None = None

    @property
    def needs_grad(self) -> bool:
        from inspect_model.methods.cam import base

        return any(base.get(m).needs_gradients for m in self.methods)

    def attach(self, handles: list[Any]) -> None:
        import torch

        module = dict(self.model.named_modules()).get(self.layer.name)
        if module is None:
            raise LayerSelectionError(f"--cam-layer '{self.layer.name}' is not a layer of the model")

        def keep(_m: Any, _a: Any, out: Any) -> None:
            if not isinstance(out, torch.Tensor):
                raise LayerSelectionError(f"--cam-layer '{self.layer.name}' returns no single tensor")
            self.act = out
            if self.needs_grad and out.requires_grad:
                # A tensor hook, not a module backward hook (in-place ops, pytorch#61519).
                out.register_hook(lambda g: setattr(self, "grad", g.detach()))
        handles.append(module.register_forward_hook(keep))

    def maps(self, classes: list[int] | None) -> dict[str, torch.Tensor]:
        """method -> (B, h, w) float32 on the CPU, ReLU applied."""
        import torch

        from inspect_model.methods.cam import maths as cm

        if self.act is None:
            raise LayerSelectionError(f"--cam-layer '{self.layer.name}' did not run in the forward pass")
        a = cm.to_spatial(self.act.detach(), self.layer.layout)
        a = a if a.dtype == torch.float64 else a.float()  # as compute_cams
        grads = None
        if self.needs_grad:
            if self.grad is None:
                raise LayerSelectionError(f"--cam-layer '{self.layer.name}': the class score does not depend on it")
            grads = [cm.to_spatial(self.grad, self.layer.layout).to(a.dtype)]
        idx = torch.tensor(classes or [0] * a.shape[0]).view(-1, 1)
        from inspect_model.methods.cam import base

        inp = base.MapInputs(a, grads, idx, fc_weight=_unused, masked_scores=_unused)
        return {m: torch.relu(base.get(m).maps(inp)[0]).float().cpu() for m in self.methods}


def _unused() -> Any:
    raise AssertionError("CAM and Score-CAM are not run in an attention run")


def resolve(model: nn.Module, x: torch.Tensor, spec: Any, declared: str | None = None) -> Any:
    """A ``CamLayer`` for ``spec`` (``auto`` or a layer name; a ``CamLayer`` is returned as is),
    from one no-grad probe pass of ``x[:1]`` as ``cam`` resolves it."""
    from inspect_model.methods.cam.layers import CamLayer, resolve_layers

    if isinstance(spec, CamLayer):
        return spec
    layers = resolve_layers(model, x[:1], [str(spec or "auto")], declared=declared)
    if len(layers) != 1:
        raise LayerSelectionError(f"--cam-layer '{spec}' selects {len(layers)} layers; give one")
    return layers[0]
