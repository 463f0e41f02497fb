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


def decode(model: nn.Module, anatomy: Anatomy, states: dict[Site, torch.Tensor], logits: torch.Tensor, *,
           top_k: int, tuned: TunedLens | None = None) -> tuple[list[Decoded], torch.Tensor, float]:
    """Each site decoded against the model's own logits (B, T, V): (per site, the model's
    prediction (B, T), the largest |readout - model logits| at the last block)."""
    import torch

    from inspect_model.methods.lm.anatomy import readout

    final = logits.float()
    final_logp = final.log_softmax(dim=-1)
    final_p = final_logp.exp()
    predicted = final.argmax(dim=-1)  # (B, T)
    last = len(anatomy.blocks)
    out: list[Decoded] = []
    check = float("nan")
    with torch.no_grad():
        for site, h in states.items():
            if tuned is not None and site.site == "resid":
                h = tuned.translate(h, site.depth)
            lg = readout(model, anatomy, h).float()  # (B, T, V)
            if site.site == "resid" and site.depth == last:
                check = float((lg - final).abs().max()) if lg.shape == final.shape else float("inf")
            logp = lg.log_softmax(dim=-1)
            p = logp.exp()
            y = predicted[..., None]
            prob = p.gather(-1, y)[..., 0]
            rank = (lg > lg.gather(-1, y)).sum(dim=-1) + 1
            entropy = -(p * logp).nan_to_num(0.0).sum(dim=-1)
            kl = (final_p * (final_logp - logp)).nan_to_num(0.0).sum(dim=-1).clamp(min=0.0)
            tp, ti = p.topk(min(top_k, p.shape[-1]), dim=-1)
            out.append(Decoded(site, prob, rank, entropy, kl, ti, tp))
    return out, predicted, check
