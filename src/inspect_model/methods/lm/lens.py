"""The logit lens (nostalgebraist 2020) and the tuned lens (Belrose et al. 2023) over a batch
of texts: every decoder block's residual output (and, on request, its attention and MLP
outputs) decoded through the model's own readout (:func:`.anatomy.readout`: final norm,
scaling, unembedding) at every position.

Sites: ``resid`` is the residual stream, depth 0 the embeddings (block 0's input), depth
``i`` block ``i-1``'s output, so the last depth is what the model itself decodes; ``attn``
and ``mlp`` are the attention's and the MLP's outputs of block ``i-1`` (what each adds to
the stream), decoded through the same readout. A tuned lens translates the residual stream
first (``h + W h + b``, translator ``depth``; none at the last depth).

Per site, depth and position: the top-k tokens and their probabilities; the probability and
rank (1 = the top token) of the model's own prediction there (the argmax of its logits);
the entropy of the decoded distribution; and KL(model || decoded), both in nats. The states
are taken by the hook engine (hooks always removed, no gradients) in one forward pass; each
depth is then decoded for the whole batch at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inspect_model.errors import UnsupportedModelError, UsageError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from inspect_model.methods.lm.anatomy import Anatomy
    from inspect_model.methods.lm.tuned import TunedLens

SITES = ("resid", "attn", "mlp")
EMBEDDINGS = "embeddings"


@dataclass(frozen=True)
class Site:
    """One decoded place: ``site`` kind, the module whose output it is (``layer``; the
    embeddings: block 0's input) and its depth (0: the embeddings, i: block i-1)."""

    site: str
    layer: str
    depth: int


def parse_sites(text: str | tuple[str, ...]) -> tuple[str, ...]:
    """``resid,attn,mlp`` -> ("resid", "attn", "mlp"), checked, in that order."""
    parts = [p.strip() for p in (text.split(",") if isinstance(text, str) else text) if p.strip()]
    bad = [p for p in parts if p not in SITES]
    if bad or not parts:
        raise UsageError(f"--sites '{','.join(parts)}' names {bad[0] if bad else 'nothing'}; give a comma list of "
                         f"{', '.join(SITES)}")
    return tuple(s for s in SITES if s in parts)


def sites_of(anatomy: Anatomy, kinds: tuple[str, ...]) -> list[Site]:
    """The decoded places, per kind in :data:`SITES` order, by depth."""
    out: list[Site] = []
    for kind in kinds:
        if kind == "resid":
            out.append(Site("resid", EMBEDDINGS, 0))
        for i, b in enumerate(anatomy.blocks):
            name = b.name if kind == "resid" else b.attention if kind == "attn" else b.mlp
            if name is None:
                what = "attention" if kind == "attn" else "MLP"
                raise UnsupportedModelError(f"block {b.name} has no {what} module inspect-model can find; "
                                            f"--sites {kind} needs one (resid works)")
            out.append(Site(kind, name, i + 1))
    return out


def _first(records: list[Any]) -> torch.Tensor | None:
    return records[0].outputs[0].tensor if records and records[0].outputs else None


def _hidden_input(rec: Any, width: int) -> torch.Tensor | None:
    """Block 0's input hidden states (B, T, d): its ``hidden_states`` keyword, else its
    first floating (B, T, d) argument."""
    caps = [c for c in rec.inputs if c.tensor is not None and c.tensor.is_floating_point()
            and c.tensor.dim() == 3 and c.tensor.shape[-1] == width]
    named = [c for c in caps if c.key.endswith("hidden_states")]
    return (named or caps or [None])[0].tensor if (named or caps) else None


class LensCapture:
    """Context manager: while inside, :meth:`run` gives the states of ``sites`` for a batch
    (module docstring). Two engines borrow the model: one keeps the outputs of the blocks,
    attentions and MLPs, the other block 0's inputs and the model's own inputs (the decoder
    ids of an encoder-decoder)."""

    def __init__(self, model: nn.Module, anatomy: Anatomy, sites: list[Site]) -> None:
        from inspect_model.engine.hooks import CaptureOptions, HookEngine

        self.model, self.anatomy, self.sites = model, anatomy, sites
        outs = sorted({s.layer for s in sites if s.depth > 0})
        self.outputs = HookEngine(model, outs, CaptureOptions(keep=True, grad_enabled=False))
        self.inputs = HookEngine(model, [anatomy.blocks[0].name, ""],
                                 CaptureOptions(outputs=False, inputs=True, keep=True, grad_enabled=False))

    def __enter__(self) -> LensCapture:
        self.outputs.__enter__()
        try:
            self.inputs.__enter__()
        except BaseException:
            self.outputs.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.inputs.__exit__(*exc)
        finally:
            self.outputs.__exit__(*exc)

    def run(self, x: torch.Tensor) -> tuple[dict[Site, torch.Tensor], torch.Tensor, dict[str, Any]]:
        """(states by site, the model's logits (B, T, V), the model's keyword inputs)."""
        from inspect_model.engine.hooks import run_forward
        from inspect_model.methods.attention.models import model_scores

        self.outputs.reset()
        self.inputs.reset()
        out = run_forward(self.outputs, lambda: self.model(x))
        logits = model_scores(out)
        by_name: dict[str, list[Any]] = {}
        for rec in self.outputs.finalize():
            by_name.setdefault(rec.name, []).append(rec)
        ins = {r.name: r for r in self.inputs.finalize()}
        width = self._width(by_name)
        shape = tuple(_first(by_name[self.anatomy.blocks[-1].name]).shape)  # type: ignore[union-attr]
        states: dict[Site, torch.Tensor] = {}
        for s in self.sites:
            t = _hidden_input(ins[self.anatomy.blocks[0].name], width) if s.depth == 0 \
                and self.anatomy.blocks[0].name in ins else _first(by_name.get(s.layer, []))
            if t is not None and t.dim() == 2 and t.shape[0] == shape[0] * shape[1]:
                t = t.view(shape[0], shape[1], -1)  # OPT runs its MLP on (B*T, d)
            if t is None or t.dim() != 3:
                raise UnsupportedModelError(f"{s.layer} gave no (batch, tokens, features) tensor to decode")
            states[s] = t
        root = ins.get("")
        kwargs = {c.key.rsplit("/", 1)[-1]: c.tensor for c in (root.inputs if root else []) if c.tensor is not None}
        return states, logits, kwargs

    def _width(self, by_name: dict[str, list[Any]]) -> int:
        last = _first(by_name.get(self.anatomy.blocks[-1].name, []))
        if last is None:
            raise UnsupportedModelError(f"the last block {self.anatomy.blocks[-1].name} never ran; lens needs every "
                                        "block of the decoder to run")
        return int(last.shape[-1])


@dataclass
class Decoded:
    """One site's numbers for a batch: each (B, T) but ``top_ids``/``top_probs`` (B, T, k)."""

    site: Site
    prob: torch.Tensor
    rank: torch.Tensor
    entropy: torch.Tensor
    kl: torch.Tensor
    top_ids: torch.Tensor
    top_probs: torch.Tensor


CHUNK_BYTES = 1 << 21  # rows decoded together: their (rows, V) logits stay in cache for the passes over them


def decode(model: nn.Module, anatomy: Anatomy, states: dict[Site, torch.Tensor], logits: torch.Tensor, *,
           top_k: int, tuned: TunedLens | None = None) -> tuple[list[Decoded], torch.Tensor, float]:
    """Each site decoded against the model's own logits (B, T, V): (per site, the model's
    prediction (B, T), the largest |readout - model logits| at the last block).

    The rows (positions) are decoded in chunks small enough that each chunk's logits stay in
    the cache while they are reduced, and nothing of size V is kept but the model's own
    distribution: with ``lse`` the log-partition of a row's logits ``z``, ``p = exp(z - lse)``,
    the entropy is ``lse - sum(p z)`` and ``KL(q || p) = sum(q log q) - sum(q z) + lse``."""
    import torch

    from inspect_model.methods.lm.anatomy import readout

    b, t, v = logits.shape
    n_rows = b * t
    rows = max(1, CHUNK_BYTES // (4 * v))
    final = logits.float().reshape(n_rows, v)
    dev = final.device  # everything is computed where the logits are; the results come to the CPU per site
    q = torch.empty(n_rows, v, device=dev)  # the model's distribution
    q_neg_h = torch.empty(n_rows, device=dev)
    predicted = final.argmax(dim=-1)  # (N,)
    for lo in range(0, n_rows, rows):  # chunked like the sites below: each chunk's passes in cache
        f = final[lo:lo + rows]
        q[lo:lo + rows] = f.softmax(dim=-1)
        q_neg_h[lo:lo + rows] = torch.linalg.vecdot(q[lo:lo + rows], f) - _lse(f, q[lo:lo + rows])  # -H(q)
    last = len(anatomy.blocks)
    out: list[Decoded] = []
    check = float("nan")
    with torch.no_grad():
        for site, h in states.items():
            if tuned is not None and site.site == "resid":
                h = tuned.translate(h, site.depth)
            flat = h.reshape(n_rows, -1)
            k = min(top_k, v)
            prob, rank, ent, kl = (torch.empty(n_rows, device=dev), torch.empty(n_rows, dtype=torch.long, device=dev),
                                   torch.empty(n_rows, device=dev), torch.empty(n_rows, device=dev))
            top_ids = torch.empty(n_rows, k, dtype=torch.long, device=dev)
            top_p = torch.empty(n_rows, k, device=dev)
            zall = readout(model, anatomy, flat).float().to(dev)  # (N, V): one matmul (the weight read once)
            own = site.site == "resid" and site.depth == last  # the model's own readout: checked
            if own and zall.shape != final.shape:
                check = float("inf")
            buf = torch.empty(min(rows, n_rows), v, device=dev)
            for lo in range(0, n_rows, rows):
                hi = min(lo + rows, n_rows)
                z, y = zall[lo:hi], predicted[lo:hi, None]
                if own and zall.shape == final.shape:
                    d = torch.sub(z, final[lo:hi], out=buf[: hi - lo]).masked_fill_(z == final[lo:hi], 0.0)
                    err = float(d.abs_().amax())  # equal infinities (a masked token) differ by 0
                    check = err if check != check else max(check, err)
                p = z.softmax(dim=-1)
                lse = _lse(z, p)
                prob[lo:hi] = p.gather(-1, y)[:, 0]
                ent[lo:hi] = lse - torch.linalg.vecdot(p, z)
                kl[lo:hi] = q_neg_h[lo:hi] - torch.linalg.vecdot(q[lo:hi], z) + lse
                ti = z.topk(k, dim=-1).indices
                top_ids[lo:hi], top_p[lo:hi] = ti, p.gather(-1, ti)
                rank[lo:hi] = _rank(z, z.gather(-1, y), ti, y, buf)
            if not (torch.isfinite(ent).all() and torch.isfinite(kl).all()):  # -inf logits: 0 * -inf terms
                ent, kl = _exact(model, anatomy, flat, final, predicted, ent, kl)
            out.append(Decoded(site, *(x.view(b, t, *x.shape[1:]).cpu() for x in (
                prob, rank, ent, kl.clamp(min=0.0), top_ids, top_p))))
    return out, predicted.view(b, t).cpu(), check


def _lse(z: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """log sum exp z per row, from its softmax ``p``: ``max z - log max p`` (max p >= 1/V: no
    underflow), so that one fused softmax pass serves both."""
    return z.amax(dim=-1) - p.amax(dim=-1).log()


def _rank(z: torch.Tensor, zy: torch.Tensor, top: torch.Tensor, y: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    """1 + how many logits exceed the prediction's (``zy`` (n, 1)): read from the top-k where
    it is among them, counted over the row elsewhere (a float compare: the fastest count)."""
    import torch

    hit = top == y  # (n, k)
    rank = hit.to(torch.long).argmax(dim=-1) + 1
    miss = (~hit.any(dim=-1)).nonzero()[:, 0]
    if miss.numel() == z.shape[0]:
        rank = torch.gt(z, zy, out=buf[: z.shape[0]]).sum(dim=-1).long() + 1
    elif miss.numel():
        rank[miss] = torch.gt(z[miss], zy[miss], out=buf[: miss.numel()]).sum(dim=-1).long() + 1
    return rank


def _exact(model: nn.Module, anatomy: Anatomy, flat: torch.Tensor, final: torch.Tensor, predicted: torch.Tensor,
           ent: torch.Tensor, kl: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Entropy and KL of the rows where a logit is -inf (a masked vocabulary), with 0 log 0 = 0."""
    from inspect_model.methods.lm.anatomy import readout

    bad = ~(ent.isfinite() & kl.isfinite())
    idx = bad.nonzero()[:, 0]
    logp = readout(model, anatomy, flat[idx]).float().log_softmax(dim=-1)
    fl = final[idx].log_softmax(dim=-1)
    ent, kl = ent.clone(), kl.clone()
    ent[idx] = -(logp.exp() * logp).nan_to_num(0.0).sum(dim=-1).to(ent.device)
    kl[idx] = (fl.exp() * (fl - logp)).nan_to_num(0.0).sum(dim=-1).to(kl.device)
    return ent, kl
