"""Input attributions: captum's gradient family, batched and bounded in memory.

Methods (one map per (image, target), the shape of one input sample):

- ``saliency``: |d score / d x| (Simonyan et al. 2014; captum ``Saliency(abs=True)``);
- ``gradient``: d score / d x, signed;
- ``input-x-gradient``: x * d score / d x (Shrikumar et al. 2016);
- ``integrated-gradients``: (x - b) * integral_0^1 grad(b + a (x - b)) da (Sundararajan et
  al. 2017), by a Riemann or Gauss-Legendre rule, with the completeness gap
  sum(map) - (f(x) - f(b)) per map;
- ``smoothgrad``: the mean gradient over ``samples`` noisy copies x + N(0, sigma^2)
  (Smilkov et al. 2017); ``vargrad``: their variance (Adebayo et al. 2018);
- ``occlusion``: f(x) - f(x with a window replaced by the baseline), averaged over the
  windows covering each element (Zeiler & Fergus 2014; captum ``Occlusion``);
- ``guided``: guided backpropagation through :class:`methods.guided.GuidedBackwardMode`.

``smooth=True`` wraps every gradient method in SmoothGrad noise (captum's ``NoiseTunnel``).
Integer inputs (token ids) are attributed at the output of the embedding layer that reads
them. Saliency, gradient and input-x-gradient share one backward pass; the noisy methods
share their noise samples. Rows (steps, samples, windows) go through the model in chunks
of ``batch_size`` (see :mod:`.passes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from inspect_model.engine.hooks import CaptureOptions, HookEngine, run_forward
from inspect_model.errors import InputError, ModelRuntimeError
from inspect_model.loading.wrappers import unwrap_module
from inspect_model.methods.attributions import passes as ap
from inspect_model.methods.attributions import base as ab
from inspect_model.methods.attributions.options import AttributionSettings
from inspect_model.methods.guided.backprop import GuidedBackwardMode, _targets_for
from inspect_model.methods.objectives.targets import class_probabilities, require_float, select_output

Progress = Callable[[int, int, str], None]


@dataclass
class AttributionResult:
    """Maps of one batch, one per (method, image, target)."""

    maps: dict[str, torch.Tensor]  # method -> (N, K, *sample) float32 on the CPU
    targets: list[list[int]]  # (N, K) class indices
    scores: list[list[float]]  # f(x) of each target, (N, K)
    probabilities: list[list[float]]  # softmax over the classes, of each target, (N, K)
    space: str  # "input", or "embedding" (token ids: maps of the embedding output)
    embedding_layer: str | None = None
    baseline_scores: list[list[float]] | None = None  # f(baseline), with integrated-gradients
    deltas: list[list[float]] | None = None  # IG's completeness gap sum(map) - (f(x) - f(b))
    ig_steps: list[list[int]] | None = None  # IG's steps per map, (N, K) (differ with steps="auto")
    smoothed: tuple[str, ...] = ()
    guided_sites: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass
class Run:
    """What a method with passes of its own gets (``AttributionMethod.compute``)."""

    b: Any  # sweeps.Batch
    baseline: torch.Tensor | None  # (N, *S), for the methods that need_baseline
    fx: torch.Tensor  # (U,) f(x) of each unit, float64
    result: AttributionResult  # where a method adds what it reports besides its maps
    smoothed: set[str]  # the methods --smooth wraps in noise
    space: str  # input | embedding
    shape: tuple[int, int]  # (N, K)


def map_statistics(m: torch.Tensor) -> dict[str, float]:
    """Positive and negative mass (sums of the positive and of the negative values), their
    sum, the absolute mass and the largest magnitude of one map."""
    v = m.detach().double().reshape(-1)
    pos = float(v.clamp(min=0).sum())
    neg = float(v.clamp(max=0).sum())
    return {"positive": pos, "negative": neg, "sum": pos + neg, "abs": pos - neg,
            "max_abs": float(v.abs().max()) if v.numel() else 0.0}


# ----------------------------------------------------------------------- the model
class _Scorer:
    """Scores of (row, class) pairs for attribution-space rows ``z``. For token ids, ``z``
    is the embedding output: a forward hook puts it in the place of the layer's output
    while the ids of the same samples run through the model."""

    def __init__(self, model: torch.nn.Module, engine: HookEngine, inputs: torch.Tensor, output_key: str | None,
                 embedding: torch.nn.Module | None) -> None:
        self.model, self.engine, self.inputs, self.output_key = model, engine, inputs, output_key
        self.embedding = embedding
        self._z: torch.Tensor | None = None
        self._handle = None if embedding is None else embedding.register_forward_hook(self._swap)

    def _swap(self, module: torch.nn.Module, args: Any, out: Any) -> Any:
        # A clone: a model may add to its embeddings in place (`x += pos`), which a leaf refuses.
        return None if self._z is None else self._z.clone()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def outputs(self, z: torch.Tensor, samples: torch.Tensor) -> torch.Tensor:
        """The (R, classes) score rows of ``z`` (R, ...), the rows of samples ``samples``."""
        if self.embedding is None:
            out = run_forward(self.engine, lambda: self.model(z.clone()))
        else:
            self._z = z
            try:
                out = run_forward(self.engine, lambda: self.model(self.inputs[samples.to(self.inputs.device)]))
            finally:
                self._z = None
        y = select_output(out, self.output_key)
        if y.dim() < 1 or y.shape[0] != z.shape[0]:
            raise ModelRuntimeError(f"the model output has shape {tuple(y.shape)}; expected a batch of "
                                    f"{z.shape[0]} score rows; use --output-key to pick another output")
        require_float(y)
        return y.reshape(y.shape[0], -1)

    def scores(self, z: torch.Tensor, samples: torch.Tensor, cls: torch.Tensor) -> torch.Tensor:
        flat = self.outputs(z, samples)
        return flat.gather(1, cls.to(flat.device)[:, None])[:, 0]

    def grad(self, z: torch.Tensor, samples: torch.Tensor, cls: torch.Tensor,
             mode: GuidedBackwardMode | None = None) -> torch.Tensor:
        """d score_r / d z_r for every row (rows are independent: one backward of the sum)."""
        leaf = z.detach().requires_grad_(True)
        with torch.enable_grad():
            s = self.scores(leaf, samples, cls)
            if not s.requires_grad:
                raise ModelRuntimeError("the model output does not depend on the input; nothing to attribute")
            try:
                if mode is None:
                    (g,) = torch.autograd.grad(s.sum(), leaf)
                else:
                    with mode:
                        (g,) = torch.autograd.grad(s.sum(), leaf)
            except RuntimeError as exc:
                msg = (str(exc).strip().splitlines() or [""])[0]
                raise ModelRuntimeError(f"backward pass failed: {type(exc).__name__}: {msg}") from exc
        return g.detach()


def find_embedding(model: torch.nn.Module, engine: HookEngine, ids: torch.Tensor) -> str:
    """The ``nn.Embedding`` that reads the token ids ``ids`` (the first one called with
    them; else the first embedding called at all). An input error when there is none."""
    names = {m: n for n, m in model.named_modules() if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag))}
    dtype = str(ids.dtype).replace("torch.", "")
    missing = InputError(f"the input is {dtype}, which cannot be differentiated, and the model has no nn.Embedding "
                         "layer reading it to attribute to; give a floating-point input")
    if not names:
        raise missing
    calls: list[tuple[str, bool]] = []

    def hook(module: torch.nn.Module, args: tuple) -> None:
        a = args[0] if args else None
        same = isinstance(a, torch.Tensor) and a.shape == ids[:1].shape and bool(torch.equal(a, ids[:1]))
        calls.append((names[module], same))

    handles = [m.register_forward_pre_hook(hook) for m in names]
    try:
        with torch.no_grad():
            run_forward(engine, lambda: model(ids[:1]))
    finally:
        for h in handles:
            h.remove()
    exact = [n for n, same in calls if same]
    if exact or calls:
        return (exact or [calls[0][0]])[0]
    raise missing


def _targets(target: Any, flat: torch.Tensor, categories: Sequence[str] | None) -> list[list[int]]:
    """Targets as every command takes them: ``predicted``, ``top:K``, an index or class name,
    a TargetSpec, or per-sample classes (a list, or a 1-D/2-D integer tensor)."""
    if isinstance(target, torch.Tensor):
        if target.is_floating_point() or target.dim() > 2:
            raise InputError(f"a target tensor must hold integer class indices (N,) or (N, K), got {target.dtype} "
                             f"{tuple(target.shape)}")
        target = target.tolist() if target.dim() else int(target)
    if isinstance(target, (list, tuple)) and len(target) != flat.shape[0]:
        raise InputError(f"{len(target)} targets for {flat.shape[0]} inputs; give one class (or list) per input")
    return _targets_for(target, flat, categories)


def attribute(model: torch.nn.Module, inputs: torch.Tensor, target: Any = "predicted",
              settings: AttributionSettings | None = None, *, output_key: str | None = None,
              categories: Sequence[str] | None = None, first_index: int = 0,
              progress: Progress | None = None) -> AttributionResult:
    """Attribution maps of ``inputs`` (N, ...) for ``target`` by every method of
    ``settings`` (see the module docstring). ``first_index`` is the global index of the
    first input (it seeds that input's noise and uniform baseline, so that results do not
    depend on batching). The model is left as it was (modes, flags, no hooks)."""
    st = settings or AttributionSettings()
    if not isinstance(inputs, torch.Tensor) or inputs.dim() < 1 or inputs.shape[0] < 1:
        raise InputError("attributions need a batched input tensor (N, ...)")
    model = unwrap_module(model)[0]  # compiled / DataParallel: the eager module (loading/wrappers.py)
    opts = CaptureOptions(outputs=False, freeze_params=True, eval_mode=True, grad_enabled=True)
    with HookEngine(model, [], opts) as engine:
        emb_name = None
        if not (inputs.is_floating_point() or inputs.is_complex()):
            emb_name = find_embedding(model, engine, inputs)
        embedding = dict(model.named_modules())[emb_name] if emb_name else None
        scorer = _Scorer(model, engine, inputs, output_key, embedding)
        try:
            return _attribute(scorer, st, target, categories, first_index, progress, emb_name)
        finally:
            scorer.close()


def _first_pass(scorer: _Scorer, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's score rows (N, classes) of the inputs, and the attribution-space inputs
    x (the inputs, or the embedding layer's outputs for token ids), in chunks."""
    inputs, flats, xs = scorer.inputs, [], []
    captured: list[torch.Tensor] = []
    handle = None
    if scorer.embedding is not None:
        handle = scorer.embedding.register_forward_hook(lambda m, a, out: captured.append(out.detach().clone()))
    try:
        with torch.no_grad():
            for start in range(0, inputs.shape[0], batch_size):
                chunk = inputs[start:start + batch_size]
                out = run_forward(scorer.engine, lambda: scorer.model(chunk.clone()))
                y = select_output(out, scorer.output_key)
                if y.dim() < 1 or y.shape[0] != chunk.shape[0]:
                    raise ModelRuntimeError(f"the model output has shape {tuple(y.shape)}; expected a batch of "
                                            f"{chunk.shape[0]} score rows; use --output-key to pick another output")
                require_float(y)
                flats.append(y.reshape(y.shape[0], -1))
                if scorer.embedding is not None:
                    xs.append(captured[-1])
    finally:
        if handle is not None:
            handle.remove()
    x = torch.cat(xs) if xs else inputs.detach()
    if not x.is_floating_point():
        raise InputError(f"the embedding layer returned {x.dtype}; nothing to differentiate")
    return torch.cat(flats), x


def _attribute(scorer: _Scorer, st: AttributionSettings, target: Any, categories: Sequence[str] | None,
               first_index: int, progress: Progress | None, emb_name: str | None) -> AttributionResult:
    from inspect_model.methods.attributions import sweeps as sw

    flat, x = _first_pass(scorer, st.batch_size)
    space = "embedding" if emb_name else "input"
    targets = _targets(target, flat, categories)
    n, k = len(targets), len(targets[0])
    unit_n = torch.arange(n).repeat_interleave(k)
    unit_c = torch.tensor([c for row in targets for c in row], dtype=torch.long)
    fx = flat.detach().double().cpu()[unit_n, unit_c]
    sigmas = [ap.noise_sigma(x[i], st.noise, st.noise_mode) for i in range(n)]
    b = sw.Batch(scorer, x, unit_n, unit_c, st, first_index, sigmas, progress)
    methods, smoothed = st.methods, set(st.smoothed)
    maps: dict[str, torch.Tensor] = {}
    probs = class_probabilities(flat.detach().double()).cpu()[unit_n, unit_c]
    res = AttributionResult(maps={}, targets=targets, scores=fx.reshape(n, k).tolist(),
                            probabilities=probs.reshape(n, k).tolist(), space=space,
                            embedding_layer=emb_name, smoothed=st.smoothed)
    reg = {m: ab.get(m) for m in methods}
    shared = {m: r.gradient_rule for m, r in reg.items() if r.gradient_rule is not None}
    plain = {m: rule for m, rule in shared.items() if not reg[m].noisy and m not in smoothed}
    if plain:
        maps.update(sw.gradient_pass(b, plain, noisy=False)[0])
    noisy = {m: rule for m, rule in shared.items() if m not in plain}
    if noisy:
        maps.update(sw.gradient_pass(b, noisy, noisy=True)[0])
    baseline = None
    if any(r.needs_baseline for r in reg.values()):
        baseline = ap.make_baseline(st.baseline, x, seed=st.seed, first_index=first_index, space=space)
    run = Run(b, baseline, fx, res, smoothed, space, (n, k))
    for m, r in reg.items():
        if r.gradient_rule is None:
            maps[m] = r.compute(run)
    res.maps = {m: maps[m].float().cpu().reshape(n, k, *x.shape[1:]) for m in methods}
    return res
