"""The passes of ``attributions``: each turns one batch of inputs into accumulated maps by
pushing rows through the model in chunks (:func:`passes.sweep`).

A *unit* is one (image, target) pair, ``U = N * K`` of them; every accumulator holds one
(U, *sample) tensor, filled by ``index_add_`` as chunks come back.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from inspect_model.methods.attributions import passes as ap
from inspect_model.methods.guided.backprop import GuidedBackwardMode


@dataclass
class Batch:
    """One batch as the passes see it."""

    scorer: Any  # attributions._Scorer
    x: torch.Tensor  # (N, *S) the attribution-space inputs (inputs, or embedding outputs)
    unit_n: torch.Tensor  # (U,) long: the sample of each unit
    unit_c: torch.Tensor  # (U,) long: the class of each unit
    settings: Any  # AttributionSettings
    first_index: int  # global index of sample 0 (seeds the noise)
    sigmas: list[float]  # per sample: the noise level
    progress: Any = None

    @property
    def units(self) -> int:
        return int(self.unit_n.shape[0])

    @property
    def dtype(self) -> torch.dtype:
        return torch.float64 if self.x.dtype == torch.float64 else torch.float32

    def acc(self) -> torch.Tensor:
        return torch.zeros((self.units, *self.x.shape[1:]), dtype=self.dtype, device=self.x.device)

    def noisy(self, n: torch.Tensor, s: torch.Tensor | None) -> torch.Tensor:
        """x[n] plus the noise of sample s (no noise where ``s`` is None), (R, *S)."""
        xs = self.x[n.to(self.x.device)]
        if s is None:
            return xs
        shape = tuple(self.x.shape[1:])
        cache: dict[tuple[int, int], torch.Tensor] = {}
        for j, (ni, si) in enumerate(zip(n.tolist(), s.tolist())):
            key = (ni, si)
            if key not in cache:
                cache[key] = ap.draw_noise(self.settings.seed, self.first_index + ni, si, shape,
                                           self.sigmas[ni]).to(xs.device, xs.dtype)
        return xs + torch.stack([cache[(ni, si)] for ni, si in zip(n.tolist(), s.tolist())])


def gradient_pass(b: Batch, want: dict[str, str], *, noisy: bool, guided: bool = False
                  ) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """Maps from the gradient at x (or at its noisy copies, averaged), method name -> its
    rule (``AttributionMethod.gradient_rule``): ``abs`` |g| (saliency), ``grad`` g (gradient,
    smoothgrad, guided under the guided rule), ``input-x-grad`` x g, ``var`` var g (vargrad):
    one backward per row for all of them."""
    samples = b.settings.samples if noisy else 1
    acc = {name: b.acc() for name in want}
    sq = b.acc() if "var" in want.values() else None
    dtype = b.dtype
    sites: Counter[str] = Counter()

    def build(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        u = rows // samples
        n = b.unit_n[u]
        xs = b.noisy(n, rows % samples if noisy else None)
        mode = GuidedBackwardMode(b.settings.guided_kinds) if guided else None
        g = b.scorer.grad(xs, n, b.unit_c[u], mode)
        if mode is not None and not sites:
            sites.update(mode.guided)
        return u.to(xs.device), xs, g

    def consume(rows: torch.Tensor, res: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        u, xs, g = res
        g = g.to(dtype)
        for name, a in acc.items():
            if want[name] == "abs":
                a.index_add_(0, u, g.abs())
            elif want[name] == "input-x-grad":
                a.index_add_(0, u, xs.to(g.dtype) * g)
            else:  # grad; var (its mean)
                a.index_add_(0, u, g)
        if sq is not None:
            sq.index_add_(0, u, g * g)

    label = ("guided" if guided else "gradients") + (" (noise samples)" if noisy else "")
    ap.sweep(b.units * samples, b.settings.batch_size, build, consume, progress=b.progress, label=label)
    out = {name: a / samples for name, a in acc.items()}
    for name, rule in want.items():
        if rule == "var":
            assert sq is not None
            out[name] = sq / samples - out[name] ** 2  # captum NoiseTunnel: E[g^2] - E[g]^2
    return out, dict(sorted(sites.items()))


def ig_pass(b: Batch, base: torch.Tensor, *, noisy: bool, guided: bool = False) -> torch.Tensor:
    """Integrated gradients (U, *S): sum_t w_t (xs - b) grad(b + a_t (xs - b)), averaged
    over the noise samples xs when ``noisy``. Without noise (xs = x) the weighted gradients
    are summed per unit and multiplied by (x - b) once at the end, as captum does."""
    alphas, weights = ap.integration_rule(b.settings.rule, b.settings.steps)
    steps, samples = len(alphas), (b.settings.samples if noisy else 1)
    a_t = torch.tensor(alphas, dtype=torch.float64)
    w_t = torch.tensor(weights, dtype=torch.float64) / samples
    acc = b.acc()
    shape = (-1,) + (1,) * (b.x.dim() - 1)
    diff = None if noisy else b.x - base  # (N, *S)

    def build(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u, t = rows // (samples * steps), rows % steps
        n = b.unit_n[u]
        nd = n.to(base.device)
        b0 = base[nd]
        d = b.noisy(n, (rows // steps) % samples) - b0 if noisy else diff[nd]  # type: ignore[index]
        alpha = a_t[t].to(d.device, d.dtype).reshape(shape)
        z = torch.addcmul(b0, alpha, d)  # (R, *S) points on the straight path b + a (x - b)
        g = b.scorer.grad(z, n, b.unit_c[u], GuidedBackwardMode(b.settings.guided_kinds) if guided else None)
        w = w_t[t].to(acc.device, acc.dtype).reshape(shape)
        contrib = g.to(acc.dtype).mul_(w)
        if noisy:
            contrib.mul_(d.to(acc.dtype))
        return u.to(acc.device), contrib

    def consume(rows: torch.Tensor, res: tuple[torch.Tensor, torch.Tensor]) -> None:
        acc.index_add_(0, res[0], res[1])

    ap.sweep(b.units * samples * steps, b.settings.batch_size, build, consume, progress=b.progress,
             label="integrated-gradients")
    if diff is not None:
        acc.mul_(diff[b.unit_n.to(diff.device)].to(acc.dtype))
    return acc


def ig_auto(b: Batch, base: torch.Tensor, fx: torch.Tensor, fb: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Integrated gradients with ``steps="auto"`` (issue 40): every unit (image, target) runs
    at AUTO_FIRST steps of the rule, and those whose completeness gap |sum(map) - (f(x) -
    f(b))| is above ``max_gap`` of |f(x) - f(b)| run again at twice the steps, until AUTO_CAP.
    Returns the maps (U, *S) and the steps each unit used. The passes are the sum of the
    rounds a unit took (4, 4 + 8, ...); a smooth path integrand meets the gap in the first."""
    import dataclasses

    from inspect_model.methods.attributions.options import AUTO_CAP, AUTO_FIRST

    st = b.settings
    out = b.acc()
    used = [0] * b.units
    todo = torch.arange(b.units)
    steps = AUTO_FIRST
    while todo.numel():
        sub = dataclasses.replace(b, unit_n=b.unit_n[todo], unit_c=b.unit_c[todo],
                                  settings=dataclasses.replace(st, steps=steps))
        m = ig_pass(sub, base, noisy=False)
        want = (fx[todo] - fb[todo]).double()
        gap = m.reshape(len(todo), -1).double().sum(1).cpu() - want
        done = (gap.abs() <= st.max_gap * want.abs()) | (steps >= AUTO_CAP)
        where = todo[done]
        out[where.to(out.device)] = m[done.to(m.device)]
        for u in where.tolist():
            used[u] = len(ap.integration_rule(st.rule, steps)[0])
        todo = todo[~done]
        steps = min(2 * steps, AUTO_CAP)
    return out, used


def occlusion_pass(b: Batch, base: torch.Tensor, fx: torch.Tensor, window: tuple[int, ...],
                   stride: tuple[int, ...]) -> torch.Tensor:
    """Occlusion (U, *S): for every window, f(x) - f(x with the window set to the
    baseline) added over the window, then divided by the number of windows covering each
    element (elements no window covers stay 0)."""
    sample = tuple(b.x.shape[1:])
    slices = ap.window_slices(sample, window, stride)
    n_win = len(slices)
    acc = b.acc()
    counts = torch.zeros(sample, dtype=acc.dtype, device=acc.device)
    for slc in slices:
        counts[slc] += 1

    def build(rows: torch.Tensor) -> tuple[list[int], list[int], torch.Tensor]:
        u, wi = (rows // n_win).tolist(), (rows % n_win).tolist()
        n = b.unit_n[rows // n_win]
        z = b.x[n.to(b.x.device)].clone()
        for j, (ni, w) in enumerate(zip(n.tolist(), wi)):
            z[(j, *slices[w])] = base[(ni, *slices[w])]
        with torch.no_grad():
            s = b.scorer.scores(z, n, b.unit_c[rows // n_win])
        return u, wi, s.detach().double().cpu()

    def consume(rows: torch.Tensor, res: tuple[list[int], list[int], torch.Tensor]) -> None:
        u, wi, s = res
        diff = (fx[u] - s).tolist()
        for uj, w, d in zip(u, wi, diff):
            acc[(uj, *slices[w])] += d

    ap.sweep(b.units * n_win, b.settings.batch_size, build, consume, progress=b.progress, label="occlusion")
    return torch.where(counts > 0, acc / counts.clamp(min=1), torch.zeros_like(acc))


def forward_scores(b: Batch, z: torch.Tensor, *, noisy: bool = False) -> torch.Tensor:
    """f at ``z`` (N, *S) for every unit, (U,) float64 on the CPU; with ``noisy`` the mean
    over the noise samples of f(z + noise) (smoothed IG's gap needs E f(x + noise))."""
    samples = b.settings.samples if noisy else 1
    out = torch.zeros(b.units, dtype=torch.float64)

    def build(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u = rows // samples
        n = b.unit_n[u]
        zs = z[n.to(z.device)]
        if noisy:
            zs = zs + (b.noisy(n, rows % samples) - b.x[n.to(b.x.device)])
        with torch.no_grad():
            return u, b.scorer.scores(zs, n, b.unit_c[u]).detach().double().cpu()

    def consume(rows: torch.Tensor, res: tuple[torch.Tensor, torch.Tensor]) -> None:
        out.index_add_(0, res[0], res[1] / samples)

    ap.sweep(b.units * samples, b.settings.batch_size, build, consume)
    return out
