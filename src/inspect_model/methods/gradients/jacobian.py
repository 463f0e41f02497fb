"""Gradients between inner layers: d(A)/d(B) and an estimate of ||dA/dB||_F.

``--of`` names A: a layer (its output), ``output`` (the model output, ``--output-key``), or
``score`` (the ``--target`` class score of each input). ``--wrt`` names B: a layer (its
output) or ``input``. B's output is made a graph root by :class:`HookEngine` (detached,
requiring grad, parameters frozen), so the backward pass stops there; A's output is taken by
temporarily wrapping A's ``forward`` (restored by the engine), and the forward pass is
stopped as soon as A has run after B.

The vector-Jacobian product with a ones vector (``score``: the one-hot seed) gives
d(sum A)/dB. With probes, ||J||_F^2 = E_v ||J^T v||^2 for v ~ N(0, I) (Hutchinson's trace
estimator applied to J J^T); the mean over K probes is reported with its standard error
std/sqrt(K), and the norm's standard error by the delta method, se / (2 sqrt(mean)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inspect_model.errors import LayerSelectionError, ModelRuntimeError, UsageError, one_line
from inspect_model.methods.stats import TensorStats, tensor_stats

if TYPE_CHECKING:
    import torch
    from torch import nn

OF_SPECIAL = ("score", "output")
WRT_INPUT = "input"


@dataclass
class JacobianResult:
    """d(A)/d(B) for one batch and one call of B."""

    of: str
    wrt: str  # layer key ("name#i" for a reused module), or "input"
    names: list[str]
    of_shape: list[int]
    wrt_shape: list[int]
    vjp: TensorStats  # statistics of d(sum A)/dB (d(score)/dB for --of score)
    sample_norms: list[float]  # ||d(sum A_i)/dB_i|| per input
    targets: list[list[int]] | None = None  # classes, for --of score
    probes: int = 0
    norm_sq: float | None = None  # estimate of ||J||_F^2 over the batch
    norm_sq_se: float | None = None
    norm: float | None = None
    norm_se: float | None = None
    sample_norm_sq: list[float] = field(default_factory=list)  # per input (independent samples)
    grad_map: torch.Tensor | None = None  # (N, H, W) mean |dA/dB| over channels, when B is spatial


class _Stop(Exception):
    """Raised from A's wrapped forward once A's output is in hand: the rest is not needed."""


def _one_layer(model: nn.Module, spec: str, option: str) -> str:
    from inspect_model.engine.selection import select_layers

    names = select_layers(model, [spec], leaves_only=False)
    if len(names) != 1:
        raise LayerSelectionError(f"{option} '{spec}' selects {len(names)} layers; name exactly one "
                                  f"(e.g. {names[0]!r})")
    return names[0]


def jacobian(
    model: nn.Module,
    x: torch.Tensor,
    *,
    of: str = "score",
    wrt: str = WRT_INPUT,
    target: str | None = None,
    output_key: str | None = None,
    categories: Sequence[str] | None = None,
    norm: bool = False,
    probes: int = 16,
    seed: int = 0,
    names: Sequence[str] | None = None,
) -> list[JacobianResult]:
    """d(of)/d(wrt) on the batch ``x`` (N, ...): one result per call of ``wrt``."""
    import torch

    from inspect_model.engine.hooks import CaptureOptions, HookEngine
    from inspect_model.methods.objectives.targets import parse_target

    of_layer, wrt_layer = _resolve_layers(model, of=of, wrt=wrt, target=target, norm=norm, probes=probes)
    spec = parse_target(target, categories) if of == "score" else None
    n = x.shape[0]
    batch_names = list(names) if names else [f"input-{i}" for i in range(n)]
    opts = CaptureOptions(outputs=False, graph_roots=[wrt_layer] if wrt_layer else [],
                          freeze_params=True, grad_enabled=True, keep_grads=True)
    with HookEngine(model, [wrt_layer] if wrt_layer else [], opts) as eng:
        traced = _trace(eng, model, x, of=of, wrt=wrt, of_layer=of_layer, wrt_layer=wrt_layer, spec=spec,
                        output_key=output_key)
        base = traced.vjp(torch.ones_like(traced.a))
        sq_probes = _probe_norms(traced, len(base), n, probes, seed) if norm else [[] for _ in base]
    results = []
    for j, g in enumerate(base):
        per_sample = g.shape[0] == n if g.dim() else False
        res = JacobianResult(
            of=of if of_layer is None else of_layer, wrt=traced.wrt_keys[j], names=batch_names,
            of_shape=list(traced.a.shape), wrt_shape=list(g.shape), vjp=tensor_stats(g),
            sample_norms=(g.double().reshape(n, -1).pow(2).sum(1).sqrt().tolist() if per_sample else []),
            targets=traced.targets,
        )
        if g.dim() == 4:
            res.grad_map = g.detach().abs().float().mean(1).cpu()  # (N, H, W)
        if norm:
            _add_norm(res, sq_probes[j], probes, per_sample)
        results.append(res)
    return results


def _resolve_layers(model: nn.Module, *, of: str, wrt: str, target: str | None, norm: bool,
                    probes: int) -> tuple[str | None, str | None]:
    """Check the options and resolve ``of``/``wrt`` to one layer each (None: a special name)."""
    if norm and probes < 2:
        raise UsageError(f"--probes must be 2 or more for a standard error, got {probes}")
    of_layer = None if of in OF_SPECIAL else _one_layer(model, of, "--of")
    wrt_layer = None if wrt == WRT_INPUT else _one_layer(model, wrt, "--wrt")
    if of_layer is not None and of_layer == wrt_layer:
        raise UsageError(f"--of and --wrt both name '{of}'; d(A)/d(A) is the identity")
    if target is not None and of != "score":
        raise UsageError("--target applies to --of score; --of a layer uses a ones vector")
    return of_layer, wrt_layer


@dataclass
class _Traced:
    """The forward pass's part of d(A)/d(B): A, B's captured outputs, the classes scored."""

    a: torch.Tensor  # A: the --of layer's output, the model output, or the scores (N, K)
    caps: list[torch.Tensor]  # B's outputs, one per call (graph roots); [] for --wrt input
    xin: torch.Tensor  # the input leaf; requires grad for --wrt input
    wrt_keys: list[str]
    targets: list[list[int]] | None
    of: str
    wrt_layer: str | None

    def vjp(self, v: torch.Tensor) -> list[torch.Tensor]:
        """J^T v: the gradient of (A * v).sum() at each of B's outputs (or at the input)."""
        import torch

        for c in self.caps:
            c.grad = None
        self.xin.grad = None
        try:
            self.a.backward(v, retain_graph=True)
        except RuntimeError as exc:
            raise ModelRuntimeError(f"backward from '{self.of}' failed: {one_line(exc)}") from exc
        if self.wrt_layer is None:
            g = self.xin.grad
            return [torch.zeros_like(self.xin) if g is None else g.detach().clone()]
        return [torch.zeros(c.shape, dtype=self.a.dtype, device=self.a.device) if c.grad is None else c.grad
                for c in self.caps]


def _trace(eng: Any, model: nn.Module, x: torch.Tensor, *, of: str, wrt: str, of_layer: str | None,
           wrt_layer: str | None, spec: Any, output_key: str | None) -> _Traced:
    """Run the forward pass under ``eng`` (stopped once A has run after B) and check that
    A depends on B."""
    from inspect_model.engine.hooks import run_forward

    live: dict[str, torch.Tensor] = {}
    if of_layer is not None:
        _capture_of_layer(eng, model, of_layer, wrt_layer, live)
    xin = x.detach().clone().requires_grad_(wrt_layer is None)
    out = None
    try:
        out = run_forward(eng, lambda: model(xin.clone()))  # a non-leaf: x /= 255 is allowed
    except ModelRuntimeError as exc:
        if not isinstance(exc.__cause__, _Stop):
            raise
    caps = [c for r in eng.finalize() for c in r.outputs] if wrt_layer else []
    wrt_keys = [r.key for r in eng.records if r.outputs] if wrt_layer else [WRT_INPUT]
    a, targets = _of_tensor(out, live, of=of, wrt=wrt, of_layer=of_layer, spec=spec, output_key=output_key,
                            n=x.shape[0])
    if wrt_layer and not caps:
        raise LayerSelectionError(f"--wrt '{wrt}' did not run in the forward pass; pick a layer that runs")
    if wrt_layer and not any(c.requires_grad for c in caps):
        raise LayerSelectionError(f"--wrt '{wrt}' does not return a floating-point tensor; pick another layer")
    if not a.requires_grad:
        raise LayerSelectionError(f"'{of}' does not depend on '{wrt}'; choose layers on one path")
    return _Traced(a, caps, xin, wrt_keys, targets, of, wrt_layer)


def _capture_of_layer(eng: Any, model: nn.Module, of_layer: str, wrt_layer: str | None,
                      live: dict[str, torch.Tensor]) -> None:
    """Wrap A's ``forward`` (the engine restores it): once B has run, A's first floating
    output goes to ``live["A"]`` and the pass stops (:class:`_Stop`)."""
    from inspect_model.engine.hooks import flatten_tensors

    mod = dict(model.named_modules())[of_layer]
    original = mod.forward

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if wrt_layer is None or any(r.name == wrt_layer and r.finished for r in eng.records):
            flat = [t for _, t in flatten_tensors(out) if t.is_floating_point()]
            if flat:
                live["A"] = flat[0]
                raise _Stop
        return out

    eng.patch(mod, "forward", wrapped)


def _of_tensor(out: Any, live: dict[str, torch.Tensor], *, of: str, wrt: str, of_layer: str | None,
               spec: Any, output_key: str | None, n: int) -> tuple[torch.Tensor, list[list[int]] | None]:
    """A, and for ``--of score`` the classes scored per input."""
    import torch

    from inspect_model.methods.objectives.targets import check_score_batch, resolve_targets, select_output

    if of_layer is None:
        y = select_output(out, output_key)
        if of != "score":
            return y, None
        check_score_batch(y, n)
        targets = resolve_targets(spec, y)
        flat_y = y.reshape(n, -1)
        return torch.stack([flat_y[i, cls] for i, cls in enumerate(targets)]), targets  # (N, K)
    if "A" not in live:
        raise LayerSelectionError(f"'{of}' does not run after '{wrt}' in the forward pass, so it cannot "
                                  "depend on it; choose an --of layer that comes later")
    return live["A"], None


def _probe_norms(traced: _Traced, count: int, n: int, probes: int, seed: int) -> list[list[torch.Tensor]]:
    """||J^T v||^2 for ``probes`` seeded Gaussian vectors v, per input where B has a batch
    dimension (else over the whole tensor): one list per B output (``count``)."""
    import torch

    a = traced.a
    sq_probes: list[list[torch.Tensor]] = [[] for _ in range(count)]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for _ in range(probes):
        v = torch.randn(a.shape, generator=gen, dtype=torch.float32).to(a.device, a.dtype)
        for j, g in enumerate(traced.vjp(v)):
            sq_probes[j].append(g.detach().double().reshape(g.shape[0], -1).pow(2).sum(1)
                                if g.dim() and g.shape[0] == n else g.double().pow(2).sum().reshape(1))
    return sq_probes


def _add_norm(res: JacobianResult, sq: list[torch.Tensor], probes: int, per_sample: bool) -> None:
    """Hutchinson's estimate of ||J||_F^2 with its standard error, and the norm's (delta method)."""
    import torch

    s = torch.stack(sq)  # (K, N) per-sample squared norms of J^T v
    tot = s.sum(1)  # (K,)
    res.probes = probes
    res.norm_sq = float(tot.mean())
    res.norm_sq_se = float(tot.std(unbiased=True)) / math.sqrt(probes)
    res.norm = math.sqrt(max(res.norm_sq, 0.0))
    res.norm_se = res.norm_sq_se / (2 * res.norm) if res.norm > 0 else 0.0
    res.sample_norm_sq = s.mean(0).tolist() if per_sample else []
