"""One prompt pair's patching grids (issue 36): the clean and corrupted runs once each, then
every cell of every site, batched (methods/lm/patching.py does the writing).

``--denoise`` (default): the corrupted prompt runs, clean activations are written in.
``--noise``: the clean prompt runs, the corrupted run's activations are written in.
Causal tracing (Meng et al. 2022, ROME's ``trace_with_patch``): the corrupted run is the
clean prompt with Gaussian noise added to the subject's token embeddings, ``samples``
draws of it (one row each); one clean state is restored at a time and the metric is
averaged over the draws (for ``prob`` this is ROME's mean probability).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inspect_model.methods.lm.metrics import Metric, compute, normalise, with_clean
from inspect_model.methods.lm.patching import Cell, Modules, PatchHooks, chunks, grid_cells

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(frozen=True)
class Noise:
    """Causal tracing's corruption: tokens ``first..end-1`` of the clean prompt get
    ``std * N(0, 1)`` added to their embeddings, ``samples`` draws seeded with ``seed``."""

    first: int
    end: int
    std: float
    samples: int = 10
    seed: int = 0

    def draws(self, dim: int, device: Any) -> torch.Tensor:
        import torch

        g = torch.Generator().manual_seed(int(self.seed))
        return (self.std * torch.randn(self.samples, self.end - self.first, dim, generator=g,
                                       dtype=torch.float64)).float().to(device)


@dataclass
class SiteGrid:
    """One site's grid: ``raw[l][i]`` the metric with cell (layer l, position/head i) patched."""

    site: str
    axis: str  # "position" or "head"
    raw: list[list[float]]
    normalised: list[list[float | None]]


@dataclass
class PairOutcome:
    clean: float
    corrupt: float
    metric: Metric
    grids: list[SiteGrid] = field(default_factory=list)
    forwards: int = 0  # patched forward passes run (batched)
    cells: int = 0


class PairRun:
    """The hooks and the two reference runs of one pair; :meth:`values` runs any cells.

    ``call(ids (B, T)) -> logits (B, T, vocab)``; ``base`` is the prompt that runs (the
    corrupted one when denoising), ``source`` the one whose activations are written in."""

    def __init__(self, model: nn.Module, mods: Modules, call: Callable[[Any], Any], metric: Metric, *,
                 clean: torch.Tensor, corrupt: torch.Tensor | None, sites: Sequence[str], position: int = -1,
                 denoise: bool = True, noise: Noise | None = None, tokenizer: Any = None) -> None:
        self.model, self.mods, self.call, self.metric = model, mods, call, metric
        self.clean_ids, self.corrupt_ids, self.sites = clean, corrupt, tuple(sites)
        self.position, self.denoise, self.noise, self.tokenizer = position, denoise, noise, tokenizer
        self.forwards = 0
        self.hooks: PatchHooks | None = None

    def __enter__(self) -> PairRun:
        import torch

        self._grad = torch.is_grad_enabled()
        noise = None
        if self.noise is not None:
            dim = int(self.mods.embed.weight.shape[1])
            noise = (self.noise.first, self.noise.end, self.noise.draws(dim, self.clean_ids.device))
        self.hooks = PatchHooks(self.model, self.mods, self.sites, noise=noise).__enter__()
        try:
            torch.set_grad_enabled(False)  # no graph: the caller's grad mode is put back on exit
            self._references()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        import torch

        try:
            if self.hooks is not None:
                self.hooks.__exit__(*exc)
                self.hooks = None
        finally:
            torch.set_grad_enabled(self._grad)

    def _logits(self, ids: torch.Tensor) -> torch.Tensor:
        return self.call(ids)[:, self.position, :]

    def _references(self) -> None:
        hooks = self.hooks
        assert hooks is not None
        got: dict[str, Any] = {}
        clean_src = hooks.capture(lambda: got.__setitem__("clean", self._logits(self.clean_ids[None])))
        self.clean_logits = got["clean"][0].float()
        self.metric = with_clean(self.metric, self.clean_logits, self.tokenizer)
        if self.noise is not None:  # the corrupted run: the noised clean prompt, one row per draw
            hooks.noise_on = True
            self.samples = self.noise.samples
            self.base, self.sources = self.clean_ids, clean_src
            corrupt = self._score(self._logits(self.clean_ids[None].expand(self.samples, -1)))
            self.m_corrupt = float(corrupt.mean())
        else:
            self.samples = 1
            assert self.corrupt_ids is not None
            corrupt_src = hooks.capture(lambda: got.__setitem__("corrupt", self._logits(self.corrupt_ids[None])))
            self.m_corrupt = float(self._score(got["corrupt"])[0])
            self.base, self.sources = (self.corrupt_ids, clean_src) if self.denoise else (self.clean_ids, corrupt_src)
        self.m_clean = float(self._score(self.clean_logits[None])[0])

    def _score(self, logits: torch.Tensor) -> torch.Tensor:
        return compute(self.metric, logits, self.clean_logits)

    def values(self, cells: Sequence[Cell], per_forward: int) -> list[float]:
        """The metric of each cell's patched run (averaged over the noise draws)."""
        import torch

        hooks = self.hooks
        assert hooks is not None
        out: list[torch.Tensor] = []
        per = max(1, per_forward // self.samples)
        for part in chunks(cells, per):
            hooks.plan(part, self.sources, self.samples)
            try:
                logits = self._logits(self.base[None].expand(len(part) * self.samples, -1))
            finally:
                hooks.clear()
            self.forwards += 1
            out.append(self._score(logits).view(len(part), self.samples).mean(dim=1))
        return torch.cat(out).tolist() if out else []

    def grid(self, site: str, per_forward: int, *, window: int = 1) -> SiteGrid:
        width = self.mods.n_heads if site == "head" else int(self.base.shape[0])
        cells = grid_cells(site, self.mods.layers, width, window=window)
        flat = self.values(cells, per_forward)
        raw = [flat[i * width:(i + 1) * width] for i in range(self.mods.layers)]
        norm = [[_norm(v, self.m_clean, self.m_corrupt) for v in row] for row in raw]
        return SiteGrid(site, "head" if site == "head" else "position", raw, norm)


def _norm(v: float, clean: float, corrupt: float) -> float | None:
    n = normalise(v, clean, corrupt)
    return None if n is None else float(n)


def run_pair(model: nn.Module, mods: Modules, call: Callable[[Any], Any], metric: Metric, *,
             clean: torch.Tensor, corrupt: torch.Tensor | None, sites: Sequence[str], per_forward: int,
             position: int = -1, denoise: bool = True, noise: Noise | None = None, window: int = 1,
             tokenizer: Any = None) -> PairOutcome:
    """Every site's grid of one pair (the module docstring)."""
    with PairRun(model, mods, call, metric, clean=clean, corrupt=corrupt, sites=sites, position=position,
                 denoise=denoise, noise=noise, tokenizer=tokenizer) as run:
        grids = [run.grid(s, per_forward, window=window) for s in sites]
        cells = sum(len(g.raw) * len(g.raw[0]) if g.raw else 0 for g in grids)
        return PairOutcome(run.m_clean, run.m_corrupt, run.metric, grids, run.forwards, cells)
