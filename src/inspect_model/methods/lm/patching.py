"""Activation patching (issue 36): many patched forward passes of one prompt, batched.

A *cell* is what one patched run changes: a tuple of :class:`Patch` (a site, a layer and a
position or head). Sites, named as TransformerLens names them:

- ``resid``: the block's output at one position (``blocks.L.hook_resid_post``);
- ``attn`` / ``mlp``: the attention / MLP module's output at one position
  (``hook_attn_out`` / ``hook_mlp_out``);
- ``head``: head H's slice of the *input* of the attention output projection, at every
  position (``blocks.L.attn.hook_z``). Taken downstream of the attention kernel, it is the
  same for eager, SDPA and flash attention and for grouped-query attention (the projection
  always sees ``n_heads * head_dim`` features).

:class:`PatchHooks` registers one hook per touched module for a whole grid and removes them
all on exit (also when a forward fails). Each forward runs ``rows`` copies of the base
prompt; row r gets its cell's patches (``out[r, pos] = source[pos]``) and, for causal
tracing, the noise of its sample added to the subject's token embeddings. Rows without a
patch at a module pass through unchanged, so one batched forward equals the separate
patched runs (checked against a hand-written hook in tests/unit/methods/test_patching.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

SITES = ("resid", "attn", "mlp", "head")


@dataclass(frozen=True)
class Patch:
    site: str  # resid | attn | mlp | head
    layer: int
    index: int  # the position (resid, attn, mlp) or the head (head)


Cell = tuple[Patch, ...]


@dataclass(frozen=True)
class Modules:
    """The modules a grid patches, per layer (from methods/lm/anatomy.py)."""

    blocks: tuple[Any, ...]
    attn: tuple[Any, ...]
    mlp: tuple[Any, ...]  # None for a block without an MLP (attention-only models)
    out_proj: tuple[Any, ...]  # the attention output projection (its input holds the heads)
    n_heads: int
    head_dim: int
    embed: Any  # the token embedding (its weight's std is causal tracing's sigma)

    @property
    def layers(self) -> int:
        return len(self.blocks)

    def module(self, site: str, layer: int) -> Any:
        return {"resid": self.blocks, "attn": self.attn, "mlp": self.mlp, "head": self.out_proj}[site][layer]


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


def _replace_first(out: Any, new: torch.Tensor) -> Any:
    if isinstance(out, tuple):
        return (new, *out[1:])
    if isinstance(out, list):
        return [new, *out[1:]]
    return new


class PatchHooks:
    """Hooks on every module a grid touches (a context manager; see the module docstring).

    ``capture()`` records the sources (one forward: every site's activation of one prompt),
    ``plan(cells, sources, samples)`` sets what the next forward writes."""

    def __init__(self, model: nn.Module, mods: Modules, sites: Sequence[str], *, noise: Any = None) -> None:
        self.model, self.mods, self.sites = model, mods, tuple(sites)
        self.noise = noise  # (first, end, (S, end-first, D)): added to the token embeddings of every row
        self.noise_on = False
        self.capturing: dict[tuple[str, int], torch.Tensor] | None = None
        self.active: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.handles: list[Any] = []
        self.samples = 1

    def __enter__(self) -> PatchHooks:
        import torch

        self._training = self.model.training
        self._grad = torch.is_grad_enabled()
        try:
            self.model.eval()
            for site in self.sites:
                for layer in range(self.mods.layers):
                    mod = self.mods.module(site, layer)
                    if mod is None:
                        continue
                    if site == "head":
                        self.handles.append(mod.register_forward_pre_hook(self._pre(site, layer)))
                    else:
                        self.handles.append(mod.register_forward_hook(self._post(site, layer)))
            if self.noise is not None:  # the first block's input: token (+ position) embeddings
                self.handles.append(self.mods.blocks[0].register_forward_pre_hook(self._noise, with_kwargs=True))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        import torch

        handles, self.handles = self.handles, []
        for h in handles:
            h.remove()
        self.model.train(self._training)
        torch.set_grad_enabled(self._grad)

    # ------------------------------------------------------------------ hooks
    def _post(self, site: str, layer: int) -> Callable[..., Any]:
        key = (site, layer)

        def hook(_mod: Any, _args: Any, out: Any) -> Any:
            h = _first(out)
            if self.capturing is not None:
                self.capturing[key] = h[0].detach().clone()
                return None
            plan = self.active.get(key)
            if plan is None:
                return None
            rows, idx, src = plan
            h = h.clone()
            h[rows, idx] = src.to(h.dtype)
            return _replace_first(out, h)

        return hook

    def _pre(self, site: str, layer: int) -> Callable[..., Any]:
        key = (site, layer)
        heads, dh = self.mods.n_heads, self.mods.head_dim

        def hook(_mod: Any, args: Any) -> Any:
            x = args[0]
            if self.capturing is not None:
                self.capturing[key] = x[0].detach().clone()
                return None
            plan = self.active.get(key)
            if plan is None:
                return None
            rows, idx, src = plan  # src: (n, T, head_dim), one head's values per patched row
            b, t = x.shape[0], x.shape[1]
            x = x.clone()
            view = x.view(b, t, heads, dh)
            view[rows, :, idx, :] = src.to(x.dtype)
            return (x, *args[1:])

        return hook

    def _noise(self, _mod: Any, args: Any, kwargs: Any) -> Any:
        # Added to the first block's input, i.e. to the token embeddings (ROME adds it at the
        # embedding's output; position embeddings are added alike, so the sum is the same).
        if not self.noise_on:
            return None
        first, end, noise = self.noise  # noise (S, end-first, D); row r gets draw r % S
        positional = bool(args)
        h = (args[0] if positional else kwargs["hidden_states"]).clone()
        reps = -(-h.shape[0] // noise.shape[0])
        h[:, first:end] = h[:, first:end] + noise.repeat(reps, 1, 1)[: h.shape[0]].to(h.dtype)
        if positional:
            return (h, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": h}

    # ------------------------------------------------------------------ plans
    def capture(self, run: Callable[[], Any]) -> dict[tuple[str, int], torch.Tensor]:
        """Every hooked site's activation of the one-row forward ``run()``: (site, layer) -> (T, D)."""
        self.capturing, self.active = {}, {}
        try:
            run()
            return self.capturing
        finally:
            self.capturing = None

    def plan(self, cells: Sequence[Cell], sources: dict[tuple[str, int], torch.Tensor], samples: int = 1) -> None:
        """What the next forward (``len(cells) * samples`` rows; cell c owns rows
        ``c*samples .. c*samples+samples-1``) writes at each module."""
        import torch

        by_key: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
        for c, cell in enumerate(cells):
            for p in cell:
                rows, idx = by_key.setdefault((p.site, p.layer), ([], []))
                for s in range(samples):
                    rows.append(c * samples + s)
                    idx.append(p.index)
        self.active = {}
        dh = self.mods.head_dim
        for key, (rows, idx) in by_key.items():
            src = sources[key]
            r, i = torch.tensor(rows, device=src.device), torch.tensor(idx, device=src.device)
            if key[0] == "head":  # (T, heads*dh) -> one head's (T, dh) per row: (n, T, dh)
                t = src.shape[0]
                vals = src.view(t, -1, dh)[:, i, :].permute(1, 0, 2)
            else:
                vals = src[i]  # (n, D)
            self.active[key] = (r, i, vals)

    def clear(self) -> None:
        self.active = {}


def grid_cells(site: str, layers: int, width: int, *, window: int = 1) -> list[Cell]:
    """The cells of one site's grid, row-major: (layer, position) or (layer, head);
    ``window`` > 1 (causal tracing, attn/mlp as in ROME's ``trace_important_window``):
    cell (l, p) restores layers ``max(0, l - window//2) .. min(L, l + ceil(window/2)) - 1``."""
    cells: list[Cell] = []
    for layer in range(layers):
        if window > 1 and site in ("attn", "mlp"):
            span = range(max(0, layer - window // 2), min(layers, layer - (-window // 2)))
        else:
            span = range(layer, layer + 1)
        cells += [tuple(Patch(site, ll, i) for ll in span) for i in range(width)]
    return cells


def chunks(cells: Sequence[Cell], per_forward: int) -> Iterator[Sequence[Cell]]:
    for start in range(0, len(cells), max(1, per_forward)):
        yield cells[start:start + per_forward]


def modules_of(model: nn.Module, anatomy: Any) -> Modules:
    """The modules of :class:`Modules` from methods/lm/anatomy.py's ``Anatomy``."""
    get = model.get_submodule

    def opt(name: str | None) -> Any:
        return get(name) if name else None

    parts = anatomy.blocks
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return Modules(blocks=tuple(get(b.name) for b in parts), attn=tuple(opt(b.attention) for b in parts),
                   mlp=tuple(opt(b.mlp) for b in parts), out_proj=tuple(opt(b.out_proj) for b in parts),
                   n_heads=int(anatomy.num_heads or 0), head_dim=int(anatomy.head_dim or 0), embed=embed)
