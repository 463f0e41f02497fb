"""Guided backpropagation (Springenberg et al., ICLR 2015, "Striving for Simplicity").

In the backward pass through every ReLU only the gradient that is positive where the
forward value was positive is kept: R_l = (f_l > 0) * (R_{l+1} > 0) * R_{l+1}.

Mechanism: a ``TorchDispatchMode`` that is active *only around the backward pass* and
rewrites the aten backward kernels of the activations: ``threshold_backward(g, out, 0)``
(the derivative of ``relu`` and ``relu_``) becomes ``threshold_backward(relu(g), out, 0)``.
It works below the module and Python layers, so ``nn.ReLU`` modules (in place or not,
called once or many times), ``F.relu`` / ``torch.relu`` / ``Tensor.relu_`` calls inside a
``forward`` (DenseNet's final ``F.relu``) and even TorchScript models are all guided the
same way, with nothing replaced or patched: leaving the ``with`` block is the whole undo,
also when the backward raises. The forward pass runs untouched, at full speed.
``activations=True`` extends the rule to relu6, leaky_relu, silu, gelu and prelu by
clamping the negative gradient arriving at their outputs.

The model is borrowed through :class:`HookEngine` (eval mode, parameters frozen so that no
``.grad`` is created or changed and no weight gradient is computed; all restored on exit).
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from inspect_model.engine.hooks import CaptureOptions, HookEngine, run_forward
from inspect_model.errors import InputError, ModelRuntimeError, UsageError
from inspect_model.loading.wrappers import unwrap_module
from inspect_model.methods.objectives.targets import (
    TargetSpec,
    parse_target,
    require_float,
    resolve_targets,
    select_output,
)

KINDS = ("relu", "relu6", "leaky_relu", "silu", "gelu", "prelu")

ADEBAYO_NOTE = (
    "guided backprop maps barely change when the model's weights are randomised, so they show "
    "image structure more than what the model learned (Adebayo et al., \"Sanity Checks for "
    "Saliency Maps\", NeurIPS 2018); --sanity measures this for your model"
)

_aten = torch.ops.aten


def _site_kind(func: Any, args: tuple) -> str | None:
    """The activation whose derivative this aten backward call computes, or None."""
    packet = func.overloadpacket
    if packet is _aten.threshold_backward:
        # relu/relu_ save their result and call threshold_backward(grad, result, 0).
        return "relu" if float(args[2]) == 0.0 else None
    if packet is _aten.hardtanh_backward:
        # relu6 is hardtanh(x, 0, 6); other hardtanh ranges are not guided.
        return "relu6" if (float(args[2]), float(args[3])) == (0.0, 6.0) else None
    if packet is _aten.leaky_relu_backward:
        return "leaky_relu"
    if packet is _aten.silu_backward:
        return "silu"
    if packet is _aten.gelu_backward:
        return "gelu"
    if packet is _aten._prelu_kernel_backward:
        return "prelu"
    return None


class GuidedBackwardMode(TorchDispatchMode):
    """Rewrites activation backward kernels while active: the incoming gradient (argument 0,
    the gradient at the activation's output) is clamped at zero for the ``kinds`` chosen.
    ``guided`` / ``seen`` count the sites met, by kind."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in torch._disable_dynamo unless this says
        # False; the wrapper imports torch._dynamo on the first op it sees (seconds, tens of
        # seconds on a loaded machine, on the first guided call of a process). This mode is
        # only active around the backward pass of an eager module (a compiled model's
        # eager _orig_mod, see guided_backprop), never where Dynamo traces.
        return False

    def __init__(self, kinds: Collection[str] = ("relu",)) -> None:
        super().__init__()
        self.kinds = frozenset(kinds)
        self.guided: Counter[str] = Counter()
        self.seen: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kind = _site_kind(func, args)
        if kind is not None:
            self.seen[kind] += 1
            if kind in self.kinds:
                self.guided[kind] += 1
                # (The mode is off inside this method: these run as plain ops.)
                if kind in ("relu", "relu6"):
                    # The derivative is 0 or 1, so clamping after is the same as before, and
                    # done in place on the fresh result it costs no extra allocation.
                    return func(*args, **(kwargs or {})).clamp_(min=0)
                args = (args[0].clamp(min=0),) + tuple(args[1:])
        return func(*args, **(kwargs or {}))


def resolve_kinds(activations: bool | Collection[str]) -> tuple[str, ...]:
    """``False``: relu only; ``True``: every kind in :data:`KINDS`; or a list of kinds."""
    if activations is True:
        return KINDS
    if activations is False:
        return ("relu",)
    bad = [k for k in activations if k not in KINDS]
    if bad:
        raise UsageError(f"activation kind '{bad[0]}' is not one of {', '.join(KINDS)}")
    return tuple(k for k in KINDS if k in set(activations) | {"relu"})


@dataclass
class GuidedResult:
    """Guided gradients of one batch, one map per (image, target)."""

    gradients: torch.Tensor  # (N, K, *input.shape[1:]) float32 on the CPU
    targets: list[list[int]]  # (N, K) class indices
    scores: list[list[float]]  # the target scores, (N, K)
    sites: dict[str, int]  # guided activation sites met in one backward pass, by kind
    unguided: dict[str, int]  # activation sites met but not guided, by kind
    kinds: tuple[str, ...]  # the kinds that were to be guided
    warnings: list[str] = field(default_factory=list)
    classes: int = 0  # scores per input (the class count)
    rows: list[Any] | None = None  # detection / segmentation: what each map explains (objectives.Row)
    probabilities: list[list[float]] | None = None  # softmax of the scores, (N, K), as cam reports


def _targets_for(spec: Any, flat: torch.Tensor, categories: Sequence[str] | None) -> list[list[int]]:
    n = flat.shape[0]
    if isinstance(spec, (list, tuple)) and len(spec) == n and all(isinstance(t, int) for t in spec):
        spec = [[t] for t in spec]  # one class per input
    if isinstance(spec, (list, tuple)) and len(spec) == n and all(isinstance(t, (list, tuple)) for t in spec):
        rows = [[int(i) for i in row] for row in spec]
        if not rows or any(len(r) != len(rows[0]) or not r for r in rows):
            raise InputError("explicit targets need the same number (1 or more) of classes per input")
        for row in rows:
            for i in row:
                if not 0 <= i < flat.shape[1]:
                    raise InputError(f"target {i} is out of range: the model has {flat.shape[1]} classes")
        return rows
    if isinstance(spec, int):
        spec = TargetSpec("class", index=spec, text=str(spec))
    if spec is None or isinstance(spec, str):
        spec = parse_target(spec, categories)
    if not isinstance(spec, TargetSpec):
        raise UsageError(f"target {spec!r} is not 'predicted', 'top:K', a class index or name")
    return resolve_targets(spec, flat)


def _no_guided_warning(kinds: tuple[str, ...], unguided: dict[str, int]) -> str:
    if unguided:
        found = ", ".join(f"{k} ({v})" for k, v in sorted(unguided.items()))
        return (f"the model has no ReLU on the path to the output, only {found}; the map is the plain "
                "input gradient; pass --activations to guide these")
    what = "ReLU" if kinds == ("relu",) else "guidable activation (" + ", ".join(kinds) + ")"
    return f"the model has no {what} on the path to the output; the map is the plain input gradient"


def guided_backprop(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    target: Any = "predicted",
    *,
    activations: bool | Collection[str] = False,
    output_key: str | None = None,
    categories: Sequence[str] | None = None,
) -> GuidedResult:
    """Guided-backprop maps of ``inputs`` (N, ...) for ``target``.

    ``target``: ``"predicted"``, ``"top:K"``, a class index or name, a :class:`TargetSpec`, or
    explicit classes per input, ``[281, 3]`` or ``[[281, 5], [3, 9]]`` (same count per input). Each input gets its own map (one-hot gradient
    per row), equal to running the inputs one at a time. The model is left as it was.
    """
    if not isinstance(inputs, torch.Tensor) or inputs.dim() < 1 or inputs.shape[0] < 1:
        raise InputError("guided backprop needs a batched input tensor (N, ...)")
    kinds = resolve_kinds(activations)
    # torch.compile'd models run a compiled backward the mode cannot see: use the eager module.
    model = unwrap_module(model)[0]  # compiled / DataParallel: the eager module (loading/wrappers.py)
    opts = CaptureOptions(outputs=False, freeze_params=True, eval_mode=True, grad_enabled=True)
    with HookEngine(model, [], opts) as engine:
        if inputs.is_floating_point():
            leaf = inputs.detach().requires_grad_(True)
            # Feed a copy: a model may modify its input in place, which a leaf cannot allow.
            out = run_forward(engine, lambda: model(leaf.clone()))
        else:  # token ids: differentiate at the output of the embedding that reads them (issue 42)
            leaf, out = _at_embedding(model, engine, inputs)
        scores = select_output(out, output_key)
        if scores.dim() < 1 or scores.shape[0] != leaf.shape[0]:
            raise ModelRuntimeError(
                f"the model output has shape {tuple(scores.shape)}; expected a batch of {leaf.shape[0]} "
                "score rows; use --output-key to pick another output"
            )
        require_float(scores)
        if not scores.requires_grad:
            raise ModelRuntimeError("the model output does not depend on the input; nothing to backpropagate")
        flat = scores.reshape(scores.shape[0], -1)  # (N, classes); (N,) becomes (N, 1)
        targets = _targets_for(target, flat, categories)
        k_total = len(targets[0])
        grads: list[torch.Tensor] = []
        picked: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        sites: Counter[str] = Counter()
        unguided: Counter[str] = Counter()
        for k in range(k_total):
            idx = torch.tensor([row[k] for row in targets], device=flat.device)
            onehot = torch.zeros_like(flat).scatter_(1, idx[:, None], 1.0)
            # The scalar sum of the picked scores, not grad_outputs=onehot: the same gradient
            # (exactly: d/dflat is onehot), but a tensor grad_outputs makes autograd import
            # torch.fx's symbolic shapes and sympy (about a second) on a process's first call.
            picked_sum = (flat * onehot).sum()
            mode = GuidedBackwardMode(kinds)
            try:
                with mode:
                    (g,) = torch.autograd.grad(picked_sum, leaf, retain_graph=k < k_total - 1)
            except RuntimeError as exc:
                msg = (str(exc).strip().splitlines() or [""])[0]
                raise ModelRuntimeError(f"backward pass failed: {type(exc).__name__}: {msg}") from exc
            if k == 0:
                sites = mode.guided
                unguided = Counter({kd: n for kd, n in mode.seen.items() if kd not in mode.kinds})
            grads.append(g.detach().float().cpu())
            picked.append(flat.detach().gather(1, idx[:, None])[:, 0].float().cpu())
            if flat.shape[1] > 1:  # the same number cam shows (issue 39): a probability, not a logit
                probs.append(torch.softmax(flat.detach().float(), 1).gather(1, idx[:, None])[:, 0].cpu())
    result = GuidedResult(
        gradients=torch.stack(grads, 1),
        targets=targets,
        scores=torch.stack(picked, 1).tolist(),
        probabilities=torch.stack(probs, 1).tolist() if probs else None,
        sites=dict(sorted(sites.items())),
        unguided=dict(sorted(unguided.items())),
        kinds=kinds,
        classes=int(flat.shape[1]),
    )
    if not result.sites:
        result.warnings.append(_no_guided_warning(kinds, result.unguided))
    return result


def _at_embedding(model: torch.nn.Module, engine: Any, ids: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """One forward pass with the output of the embedding reading ``ids`` made a leaf that
    requires grad (its first call with these ids; a shared embedding's later calls, a
    decoder's, are left alone). Returns (the leaf (N, L, D), the model's output)."""
    from inspect_model.methods.attributions.maps import find_embedding

    module = dict(model.named_modules())[find_embedding(model, engine, ids)]
    held: dict[str, torch.Tensor] = {}

    def swap(_m: torch.nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
        if "leaf" in held or not args or not isinstance(args[0], torch.Tensor) or args[0].shape != ids.shape:
            return None
        held["leaf"] = out.detach().requires_grad_(True)
        return held["leaf"].clone()  # a clone: a model may add to its embeddings in place

    handle = module.register_forward_hook(swap)
    try:
        out = run_forward(engine, lambda: model(ids))
    finally:
        handle.remove()
    if "leaf" not in held or not held["leaf"].is_floating_point():
        raise InputError(f"guided backprop needs a floating-point input, got {ids.dtype}, and no embedding "
                         "layer read it")
    return held["leaf"], out


def guided_gradcam(gradients: torch.Tensor, cams: torch.Tensor) -> torch.Tensor:
    """Guided Grad-CAM (Selvaraju et al. 2017): guided gradients (N, K, C, H, W) times the
    Grad-CAM maps (N, K, h, w) upsampled bilinearly to (H, W)."""
    import torch.nn.functional as F

    n, k, _, h, w = gradients.shape
    cams = cams.detach().float().cpu().reshape(n * k, 1, *cams.shape[-2:])
    up = F.interpolate(cams, size=(h, w), mode="bilinear", align_corners=False)
    return gradients * up.reshape(n, k, 1, h, w)


# ------------------------------------------------------------------- sanity check
def rank_correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rho of two equally sized arrays, with average ranks for ties (guided maps
    hold many exact zeros). NaN when either is constant."""
    import numpy as np

    def ranks(v: np.ndarray) -> np.ndarray:
        order = np.argsort(v, kind="mergesort")
        sv = v[order]
        bounds = np.flatnonzero(np.r_[True, sv[1:] != sv[:-1], True])  # starts of tie runs, end
        avg = (bounds[:-1] + bounds[1:] - 1) / 2.0 + 1.0  # mean 1-based rank of each run
        out = np.empty(len(v))
        out[order] = np.repeat(avg, np.diff(bounds))
        return out

    x = a.detach().double().cpu().reshape(-1).numpy()
    y = b.detach().double().cpu().reshape(-1).numpy()
    if x.shape != y.shape:
        raise ValueError("rank_correlation needs arrays of the same size")
    rx, ry = ranks(x) - (len(x) + 1) / 2.0, ranks(y) - (len(y) + 1) / 2.0
    den = float(np.sqrt((rx * rx).sum() * (ry * ry).sum()))
    return float("nan") if den == 0.0 else float((rx * ry).sum() / den)


@dataclass
class SanityStep:
    """Maps after randomising the top ``randomized`` layers (cascading from the output)."""

    randomized: int
    down_to: str  # the lowest layer randomised at this step
    spearman: list[float]  # per map (image-major, then target): signed gradients
    spearman_abs: list[float]  # per map: magnitudes (sum over channels of |g|)


@dataclass
class SanityResult:
    layers: list[str]  # randomisable layers, top (output side) first
    steps: list[SanityStep]
    seed: int


def randomisable_layers(model: torch.nn.Module, inputs: torch.Tensor) -> list[str]:
    """Modules owning a weight of 2 or more dimensions (conv, linear...), in the order they
    run, reversed: the top layer first. Normalisation layers are not randomised."""
    names = [n for n, m in model.named_modules()
             if isinstance(getattr(m, "weight", None), torch.nn.Parameter) and m.weight.dim() >= 2]
    if not names:
        return []
    with HookEngine(model, names, CaptureOptions(outputs=False, grad_enabled=False)) as eng:
        run_forward(eng, lambda: model(inputs[:1].clone()))  # a copy: x /= 255 must not reach `inputs`
        order = list(dict.fromkeys(r.name for r in eng.records))
    return list(reversed(order))


def _randomise(module: torch.nn.Module, seed: int) -> None:
    devices = sorted({p.device.index or 0 for p in module.parameters() if p.device.type == "cuda"})
    with torch.no_grad(), torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        if callable(getattr(module, "reset_parameters", None)):
            module.reset_parameters()  # the layer's own random init (kaiming-uniform for conv)
        else:
            for p in module.parameters(recurse=False):
                p.normal_(0.0, float(p.std()) if p.numel() > 1 and float(p.std()) > 0 else 0.01)


def cascade_counts(n: int) -> list[int]:
    """1, 2, 4, ... layers from the top, and finally all ``n``."""
    out, c = [], 1
    while c < n:
        out.append(c)
        c *= 2
    return out + [n] if n else []


def sanity_check(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    reference: GuidedResult,
    *,
    seed: int = 0,
    output_key: str | None = None,
    progress: Any = None,
) -> SanityResult:
    """Cascading model-parameter randomisation (Adebayo et al. 2018) on a deep copy of
    ``model``: randomise the top 1, 2, 4, ... layers and compare each guided map with the
    ``reference`` one (same targets) by Spearman rank correlation. The user's model is
    never modified."""
    twin = copy.deepcopy(model)
    layers = randomisable_layers(twin, inputs)
    if not layers:
        raise ModelRuntimeError("--sanity: the model has no layer with a weight matrix to randomise")
    modules = dict(twin.named_modules())
    steps: list[SanityStep] = []
    done = 0
    ref = reference.gradients  # (N, K, C, ...)
    counts = cascade_counts(len(layers))
    for step, count in enumerate(counts):
        for i in range(done, count):
            _randomise(modules[layers[i]], seed + i)
        done = count
        res = guided_backprop(twin, inputs, reference.targets, activations=reference.kinds,
                              output_key=output_key)
        rho, rho_abs = [], []
        for n in range(ref.shape[0]):
            for k in range(ref.shape[1]):
                a, b = ref[n, k], res.gradients[n, k]
                rho.append(rank_correlation(a, b))
                mag = (lambda t: t.abs().sum(0)) if a.dim() >= 2 else torch.abs
                rho_abs.append(rank_correlation(mag(a), mag(b)))
        steps.append(SanityStep(count, layers[count - 1], rho, rho_abs))
        if progress is not None:
            progress(step + 1, len(counts), "sanity: randomised models")
    return SanityResult(layers=layers, steps=steps, seed=seed)
