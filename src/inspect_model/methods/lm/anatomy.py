"""A language model's anatomy, read from the model itself (issue 36): its decoder blocks, each
block's attention (and the output projection whose input is the heads side by side) and MLP,
the final norm applied before the unembedding, the unembedding and any scaling the model
applies around it.

:func:`find_anatomy` works on any Hugging Face decoder (GPT-2, Llama, Qwen2, Mistral, Gemma,
Phi, GPT-NeoX, OPT) and on the decoder stack of an encoder-decoder (T5, BART) without a
table of architectures:

- blocks: the items of the largest list of same-class modules (the model's
  ``_no_split_modules``, as :func:`~inspect_model.loading.placement.no_split_classes` finds
  them), the decoder's list where the model has an encoder too;
- attention: the block's innermost attention module that is not cross-attention; its output
  projection is its child ``o_proj``/``c_proj``/``dense``/``out_proj``/``o``;
- MLP: the block's ``mlp``/``feed_forward``/``DenseReluDense``..., else the last linear layer
  of the feed-forward (OPT/BART ``fc2``: its output is the MLP's);
- final norm: the norm outside the blocks in the decoder stack that runs after the last block
  (found statically; where there are several, by the order they run in on a one-token probe);
  none (BART) means the blocks' output goes to the unembedding as it is;
- unembedding: ``get_output_embeddings()``; scaling: T5's ``d_model**-0.5`` on the decoder
  output (tied embeddings), BART's ``final_logits_bias``, Cohere's ``logit_scale``, Granite's
  ``logits_scaling``, Gemma 2/3's ``final_logit_softcapping``.

A user model names the norm and the unembedding (``--final-norm``/``--unembed``).
:func:`readout` applies the same path to any hidden state: at the last block it gives the
model's own logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inspect_model.errors import LayerSelectionError, UnsupportedModelError, suggest

if TYPE_CHECKING:
    import torch
    from torch import nn

OUT_PROJECTIONS = ("o_proj", "c_proj", "dense", "out_proj", "o", "wo")
MLP_NAMES = ("mlp", "feed_forward", "ffn", "DenseReluDense", "block_sparse_moe", "ff")
MLP_LAST = ("fc2", "fc_out", "dense_4h_to_h", "down_proj")
CROSS = ("encoder_attn", "encdecattention", "cross", "crossattention")
KNOWN_NORMS = ("model.norm", "transformer.ln_f", "gpt_neox.final_layer_norm", "model.decoder.final_layer_norm",
               "decoder.final_layer_norm", "model.final_layernorm", "model.decoder.layer_norm", "ln_f",
               "model.language_model.norm", "transformer.norm_f", "backbone.norm_f")
POST_NORM = ("project_out",)  # OPT-350m: the norm's output is projected to the embedding width


@dataclass(frozen=True)
class BlockParts:
    """One decoder block: its name and its attention, output projection and MLP (None: not found)."""

    name: str
    attention: str | None
    out_proj: str | None
    mlp: str | None


@dataclass(frozen=True)
class Anatomy:
    """What :func:`find_anatomy` found (module docstring). Names are qualified module names.

    ``hidden_scale`` multiplies the final norm's output before the unembedding (T5);
    ``logit_bias`` names a buffer added to the logits (BART); ``logit_scale`` multiplies the
    logits (Cohere; Granite's ``1/logits_scaling``); ``softcap``: ``cap * tanh(logits / cap)``."""

    blocks: tuple[BlockParts, ...]
    final_norm: str | None
    unembed: str
    num_heads: int | None
    head_dim: int | None
    post_norm: tuple[str, ...] = ()
    hidden_scale: float = 1.0
    logit_bias: str | None = None
    logit_scale: float = 1.0
    softcap: float | None = None
    encoder_decoder: bool = False
    how: str = ""  # how the final norm was found: "given", "the stack's only norm", "forward order", ...

    @property
    def block_names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.blocks)

    def describe(self) -> str:
        """One sentence: which modules the readout uses."""
        n = len(self.blocks)
        first = self.blocks[0].name if self.blocks else "-"
        parts = [f"{n} block(s) {first} .. {self.blocks[-1].name}" if n > 1 else f"block {first}",
                 f"final norm {self.final_norm} ({self.how})" if self.final_norm else
                 f"no final norm ({self.how})",
                 *(f"then {p}" for p in self.post_norm),
                 f"scaled by {self.hidden_scale:.6g}" if self.hidden_scale != 1.0 else "",
                 f"unembedding {self.unembed}",
                 f"plus {self.logit_bias}" if self.logit_bias else "",
                 f"logits x {self.logit_scale:.6g}" if self.logit_scale != 1.0 else "",
                 f"soft-capped at {self.softcap:g}" if self.softcap else ""]
        return "; ".join(p for p in parts if p)


def text_config(model: Any) -> Any:
    """The config of the (decoder) text model: a multimodal config's text part, else the config."""
    cfg = getattr(model, "config", None)
    get = getattr(cfg, "get_text_config", None)
    if callable(get):
        try:
            return get(decoder=True)
        except TypeError:
            return get()
    return cfg


def _is_norm(m: Any) -> bool:
    from torch import nn as tnn

    name = type(m).__name__.lower()
    return isinstance(m, tnn.LayerNorm | tnn.RMSNorm | tnn.GroupNorm) or ("norm" in name and "batch" not in name)


def _has_encoder(model: Any) -> bool:
    """An encoder-decoder (T5, BART): its config says so and it gives its encoder (transformers 5
    gives every model with an ``encoder`` attribute a ``get_encoder``, BERT too)."""
    enc = getattr(model, "get_encoder", None)
    if not callable(enc) or not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return False
    try:
        return enc() is not None and enc() is not model
    except (AttributeError, NotImplementedError, TypeError):
        return False


def find_blocks(model: nn.Module) -> tuple[str, ...]:
    """The decoder blocks' qualified names, in order (module docstring)."""
    from torch import nn as tnn

    from inspect_model.loading.placement import no_split_classes

    kinds = set(no_split_classes(model))
    lists = [(n, m) for n, m in model.named_modules()
             if isinstance(m, tnn.ModuleList | tnn.Sequential) and len(m) > 0
             and all(type(c).__name__ in kinds for c in m)]
    if _has_encoder(model):
        enc = model.get_encoder()
        enc_names = {n for n, m in model.named_modules() if m is enc}
        lists = [(n, m) for n, m in lists if not any(n == e or n.startswith(e + ".") for e in enc_names if e)]
    if not lists:
        raise UnsupportedModelError(f"{type(model).__name__} has no list of transformer blocks that inspect-model "
                                    "can find (a ModuleList of same-class blocks); lens and patch need one")
    name, blocks = max(lists, key=lambda nm: len(nm[1]))
    return tuple(f"{name}.{i}" if name else str(i) for i in range(len(blocks)))


def _inside(name: str, outer: str) -> bool:
    return name == outer or name.startswith(outer + ".")


def block_parts(model: nn.Module, block: str) -> BlockParts:
    """The attention, its output projection and the MLP of one block (None where not found)."""
    from inspect_model.engine.attention import attention_modules

    mod = model.get_submodule(block)
    attns = [a for a in attention_modules(mod) if not any(c in a.lower() for c in CROSS)]
    attention = f"{block}.{attns[0]}" if attns else None
    out_proj = None
    if attention is not None:
        amod = model.get_submodule(attention)
        out_proj = next((f"{attention}.{p}" for p in OUT_PROJECTIONS
                         if hasattr(amod, p) and hasattr(getattr(amod, p), "weight")), None)
    mlp = None
    for name, sub in mod.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if name and (leaf in MLP_NAMES or "mlp" in type(sub).__name__.lower()):
            mlp = f"{block}.{name}"
            break
    if mlp is None:
        last = [n for n, _ in mod.named_modules() if n.rsplit(".", 1)[-1] in MLP_LAST]
        mlp = f"{block}.{last[-1]}" if last else None
    return BlockParts(block, attention, out_proj, mlp)


def _heads(model: nn.Module, parts: BlockParts) -> tuple[int | None, int | None]:
    """(num_heads, head_dim): the attention's own attributes, else the config; checked
    against the output projection's input width (heads side by side)."""
    cfg = text_config(model)
    amod = model.get_submodule(parts.attention) if parts.attention else None
    heads = None
    for src in (amod, getattr(amod, "config", None), cfg):
        for attr in ("num_heads", "n_heads", "n_head", "num_attention_heads", "decoder_attention_heads"):
            v = getattr(src, attr, None)
            if isinstance(v, int) and v > 0:
                heads = v
                break
        if heads:
            break
    width = None
    if parts.out_proj:
        w = model.get_submodule(parts.out_proj).weight
        # nn.Linear: (out, in); HF Conv1D (GPT-2): (in, out)
        width = int(w.shape[0] if type(model.get_submodule(parts.out_proj)).__name__ == "Conv1D" else w.shape[1])
    dim = next((v for v in (getattr(amod, "head_dim", None), getattr(amod, "key_value_proj_dim", None),
                            getattr(cfg, "head_dim", None)) if isinstance(v, int) and v > 0), None)
    if heads and width and (dim is None or heads * dim != width):
        dim = width // heads if width % heads == 0 else None
    return heads, dim


def _stack(blocks: tuple[str, ...]) -> str:
    """The module that holds the blocks' list (``model`` for ``model.layers.0``; "" at the top)."""
    return blocks[0].rsplit(".", 2)[0] if blocks[0].count(".") >= 2 else ""


def _norm_candidates(model: nn.Module, blocks: tuple[str, ...]) -> list[str]:
    """Norms outside the blocks within the decoder stack (the blocks' list's parent), not
    those of the embeddings (BART's ``layernorm_embedding`` runs before the blocks)."""
    stack = _stack(blocks)
    out = []
    for name, m in model.named_modules():
        if not name or not _is_norm(m) or any(_inside(name, b) for b in blocks):
            continue
        if stack and not _inside(name, stack):
            continue
        if "embed" in name.lower():
            continue
        if any(_inside(name, o) and o != name for o in out):
            continue
        out.append(name)
    return out


def _forward_order(model: nn.Module, names: list[str]) -> list[str]:
    """The order ``names`` run in on a one-token probe (hooks removed afterwards)."""
    import torch

    order: list[str] = []
    handles = [model.get_submodule(n).register_forward_pre_hook(lambda _m, _a, n=n: order.append(n)) for n in names]
    try:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        ids = torch.zeros(1, 1, dtype=torch.long, device=device)
        kwargs = {"decoder_input_ids": ids} if _has_encoder(model) else {}
        with torch.no_grad():
            model(input_ids=ids, **kwargs)
    except Exception:  # noqa: BLE001 - a probe that cannot run: the caller falls back to known names
        return []
    finally:
        for h in handles:
            h.remove()
    return order


def _find_norm(model: nn.Module, blocks: tuple[str, ...]) -> tuple[str | None, str]:
    cands = _norm_candidates(model, blocks)
    if len(cands) == 1:
        return cands[0], "the decoder stack's norm after its blocks"
    if not cands:
        return None, "the decoder stack has none after its blocks"
    ran = [n for n in _forward_order(model, cands + [blocks[-1]]) if n in cands or n == blocks[-1]]
    if blocks[-1] in ran:
        after = [n for n in ran[len(ran) - ran[::-1].index(blocks[-1]):] if n in cands]
        if after:
            return after[-1], "the last norm to run after the last block"
    modules = dict(model.named_modules())
    known = next((k for k in KNOWN_NORMS if k in cands and k in modules), None)
    if known:
        return known, "known attribute"
    raise UnsupportedModelError(f"cannot tell which of {', '.join(cands)} is the final norm of "
                                f"{type(model).__name__}; name it with --final-norm")


def _scalings(model: nn.Module, unembed: str) -> dict[str, Any]:
    cfg = text_config(model)
    out: dict[str, Any] = {}
    scale_out = getattr(cfg, "scale_decoder_outputs", None)
    if scale_out is None and type(model).__name__.lower().startswith(("t5", "mt5", "umt5")):
        scale_out = bool(getattr(cfg, "tie_word_embeddings", False))  # transformers 4.x T5
    if scale_out and getattr(cfg, "d_model", None):
        out["hidden_scale"] = float(cfg.d_model) ** -0.5
    import torch

    if isinstance(getattr(model, "final_logits_bias", None), torch.Tensor):
        out["logit_bias"] = "final_logits_bias"
    scale = getattr(model, "logit_scale", None)
    if isinstance(scale, float | int) and not isinstance(scale, bool):
        out["logit_scale"] = float(scale)
    div = getattr(cfg, "logits_scaling", None)
    if isinstance(div, float | int) and div and "granite" in type(model).__name__.lower():
        out["logit_scale"] = 1.0 / float(div)
    cap = getattr(cfg, "final_logit_softcapping", None)
    if isinstance(cap, float | int) and cap:
        out["softcap"] = float(cap)
    return out


def _module_name(model: nn.Module, target: Any) -> str | None:
    return next((n for n, m in model.named_modules() if m is target), None)


def _given(model: nn.Module, name: str, flag: str) -> str:
    modules = dict(model.named_modules())
    if name not in modules:
        raise LayerSelectionError(f"{flag} '{name}': the model has no such module"
                                  f"{suggest(name, [n for n in modules if n])}")
    return name


def find_anatomy(model: nn.Module, *, final_norm: str | None = None, unembed: str | None = None) -> Anatomy:
    """The anatomy of ``model`` (module docstring). ``final_norm``/``unembed``: module names
    given by the user (``--final-norm``/``--unembed``; ``final_norm=""``: none)."""
    if unembed is not None:
        unembed = _given(model, unembed, "--unembed")
    else:
        get = getattr(model, "get_output_embeddings", None)
        emb = get() if callable(get) else None
        unembed = _module_name(model, emb) if emb is not None else None
        if unembed is None:
            raise UnsupportedModelError(f"{type(model).__name__} has no output embedding (get_output_embeddings() "
                                        "is None: no language-model head); name the unembedding with --unembed")
    blocks = find_blocks(model)
    if final_norm is not None:
        norm, how = (_given(model, final_norm, "--final-norm") if final_norm else None), "given"
    else:
        norm, how = _find_norm(model, blocks)
    modules = dict(model.named_modules())
    stack = _stack(blocks)
    post = tuple(n for n in (f"{stack}.{p}" if stack else p for p in POST_NORM) if n in modules)
    parts = tuple(block_parts(model, b) for b in blocks)
    heads, dim = _heads(model, parts[0])
    return Anatomy(blocks=parts, final_norm=norm, unembed=unembed, num_heads=heads, head_dim=dim,
                   post_norm=post, encoder_decoder=_has_encoder(model), how=how, **_scalings(model, unembed))


def readout(model: nn.Module, anatomy: Anatomy, hidden: torch.Tensor) -> torch.Tensor:
    """Logits of hidden states (..., d): the model's own path from its last block's output to
    its logits (final norm, post-norm projection, scaling, unembedding, bias, logit scaling,
    soft-capping), applied to any hidden state: the logit lens (nostalgebraist 2020)."""
    import torch

    h = hidden
    if anatomy.final_norm:
        h = model.get_submodule(anatomy.final_norm)(h)
    for p in anatomy.post_norm:
        h = model.get_submodule(p)(h)
    if anatomy.hidden_scale != 1.0:
        h = h * anatomy.hidden_scale
    logits = model.get_submodule(anatomy.unembed)(h)
    if anatomy.logit_bias:
        logits = logits + getattr(model, anatomy.logit_bias).to(logits.dtype)
    if anatomy.logit_scale != 1.0:
        logits = logits * anatomy.logit_scale
    if anatomy.softcap:
        logits = torch.tanh(logits / anatomy.softcap) * anatomy.softcap
    return logits
