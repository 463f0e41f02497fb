"""One pair of a ``patch`` run, from prompts to its record (issue 36): tokenised, checked
(same length, the metric's tokens, the position, the subject), run through every site's
grid (methods/lm/grid.py) and written as a :class:`~inspect_model.reports.patch.PatchPair`."""

from __future__ import annotations

from typing import Any

from inspect_model.errors import UsageError
from inspect_model.methods.lm.patch_report import HOOK_NAMES, top_cell
from inspect_model.reports.patch import PatchMetric, PatchPair, PatchSite, PatchSubject


def patch_one(session: Any, index: int, name: str, pair: Any) -> PatchPair:
    """The record of ``pair`` (``session``: api/patch.PatchSession, its model, tokenizer and request)."""
    import torch

    from inspect_model.methods.lm.grid import Noise, run_pair
    from inspect_model.methods.lm.metrics import parse_metric, resolve_metric
    from inspect_model.methods.lm.prompts import encode, noise_level, subject_range, token_names

    r, tok, model = session.request, session.tok, session.prep.loaded.model
    where = f" (pair {index})" if r.pairs is not None else ""
    clean = encode(tok, pair.clean, model)
    corrupt = encode(tok, pair.corrupt, model) if pair.corrupt is not None else None
    if corrupt is not None and len(corrupt) != len(clean):
        shown = ["|".join(repr(t) for t in token_names(tok, ids)[:24]) for ids in (clean, corrupt)]
        raise UsageError(f"--clean is {len(clean)} tokens and --corrupt {len(corrupt)}{where}; patching needs prompts "
                         f"of the same length (clean: {shown[0]}, corrupt: {shown[1]})")
    n = len(clean)
    pos = r.position if r.position is not None else -1
    if not -n <= pos < n:
        raise UsageError(f"--position {pos} is outside the prompt's {n} tokens{where}")
    metric = resolve_metric(parse_metric(pair.metric or r.metric), tok)
    noise, subject = None, None
    if r.noise_subject is not None:
        text = pair.subject or r.noise_subject
        first, end = subject_range(tok, pair.clean, text, model, n)
        std, how = noise_level(r.noise_std, session.mods.embed)
        noise = Noise(first, end, std, r.samples, session.prep.plan.seed)
        subject = PatchSubject(text=text, first=first, end=end, noise_std=std, noise=how, samples=r.samples,
                               seed=session.prep.plan.seed)
    dev = session.prep.device
    out = run_pair(model, session.mods, session.call, metric,
                   clean=torch.tensor(clean, device=dev), sites=session.sites, per_forward=session.per_forward,
                   corrupt=torch.tensor(corrupt, device=dev) if corrupt is not None else None, position=pos,
                   denoise=r.denoise, noise=noise, window=r.window if noise is not None else 1, tokenizer=tok)
    names = token_names(tok, clean)
    other = token_names(tok, corrupt) if corrupt is not None else names
    shown = [repr(a) if a == b else f"{a!r}/{b!r}" for a, b in zip(names, other)]  # changed: clean/corrupt
    sites = tuple(_site(session, g, shown, lowest=r.mode == "noise", window=r.window if noise else 1)
                  for g in out.grids)
    m = out.metric
    mrec = PatchMetric(kind=m.kind, text=m.words(), tokens=list(m.spec.tokens), token_ids=list(m.ids),
                       token_names=list(m.names), position=pos)
    return PatchPair(index=index, name=name, clean=pair.clean, corrupt=pair.corrupt, clean_tokens=names,
                     corrupt_tokens=other if corrupt is not None else None, metric=mrec,
                     clean_value=out.clean, corrupt_value=out.corrupt, subject=subject, sites=list(sites),
                     forwards=out.forwards, cells=out.cells)


def _site(session: Any, grid: Any, tokens: list[str], *, lowest: bool, window: int) -> PatchSite:
    anat = session.anatomy
    if grid.site == "head":
        labels = [f"H{h}" for h in range(len(grid.raw[0]))]
        modules = [f"{b.out_proj} (input)" for b in anat.blocks]
    else:
        labels = [f"{i} {t}" for i, t in enumerate(tokens)]
        attr = {"resid": "name", "attn": "attention", "mlp": "mlp"}[grid.site]
        modules = [str(getattr(b, attr)) for b in anat.blocks]
    raw = [[float(v) for v in row] for row in grid.raw]
    return PatchSite(site=grid.site, hook=HOOK_NAMES[grid.site], modules=modules, axis=grid.axis, labels=labels,
                     window=window if grid.site in ("attn", "mlp") else 1, raw=raw,
                     normalised=[list(row) for row in grid.normalised],
                     top=top_cell(raw, grid.normalised, labels, lowest))
