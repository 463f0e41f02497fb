"""Attention of text models (issue 26): token-to-token maps and per-token values.

The same capture and formulas as the image methods (:mod:`inspect_model.methods.attention.maps`),
over a token sequence instead of a patch grid, with the padding of a batch of texts:

- ``raw``: each chosen layer's probabilities (B, heads shown, L, L), queries by keys, exactly
  as the model used them (a decoder's masked future is 0, padding keys are 0);
- ``rollout`` (Abnar & Zuidema 2020): the (L, L) product R = Â_L ... Â_1 (the image
  methods' step); the per-token values are R's row of the query token;
- ``grad-rollout`` (Chefer et al. 2021): R = R + Ē R with Ē = E_h[(∇A ⊙ A)^+], for the
  target's score; per-token values from the query's row;
- ``legrad`` (Bousselham et al. 2024): per block l, ∂s^l/∂A^l, positive part averaged over
  heads and over the text's real queries, averaged over layers, s^l the target's score of
  block l's tokens through the model's own head (:func:`text_projection`).

The query token (``--query``): ``cls`` is the token that sums the text up, [CLS] (token 0)
for an encoder, the last real token for a decoder (whose last token sees the whole text);
``last``, or a token index (negative: from the end of the text). The score explained: a
sequence classifier's class logit, a causal language model's next-token logit at the last
real token (``--target``: predicted, a token id, or a token of the vocabulary). Ids are
integers, so gradients start at the input embeddings' output, made a leaf for the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inspect_model.errors import LayerSelectionError, ModelRuntimeError, UnsupportedModelError, UsageError
from inspect_model.methods.attention import maps as am

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass
class TextAttention:
    """What :func:`compute_text_attention` returns (one batch of texts)."""

    values: dict[str, torch.Tensor]  # method -> (B, L) per-token values (query row / LeGrad)
    matrices: dict[str, torch.Tensor]  # method -> (B, L, L): the methods whose map is token-to-token
    raw: dict[str, torch.Tensor]  # layer -> (B, heads shown, L, L)
    head_labels: dict[str, list[str]]
    layers: list[str]
    heads: int
    lengths: list[int]  # real tokens per text
    queries: list[int]  # the query token of each text
    causal: bool
    scores: torch.Tensor | None = None  # (B, classes or vocabulary) of the explained position
    targets: list[int] | None = None
    passes: dict[str, int] = field(default_factory=dict)
    mosaic: torch.Tensor | None = None  # (B, layers, heads, L): the query's row per layer and head


def is_causal(model: nn.Module, names: list[str]) -> bool:
    """Whether the attention is causal: HF attention modules say so (``is_causal``), else a
    language-model class name."""
    modules = dict(model.named_modules())
    flags = [getattr(modules[n], "is_causal", None) for n in names if n in modules]
    if any(isinstance(f, bool) for f in flags):
        return any(f is True for f in flags)
    return type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))


def query_tokens(query: str, lengths: list[int], causal: bool) -> list[int]:
    """The query token of each text (module docstring)."""
    q = am.parse_query(query)
    if q == "mean":
        raise UsageError("--query mean is for images; for text give cls, last or a token index")
    out = []
    for n in lengths:
        if q == "cls":
            out.append(n - 1 if causal else 0)
        elif q == "last":
            out.append(n - 1)
        else:
            i = int(q)
            if not -n <= i < n:
                raise UsageError(f"--query {i} is out of range: a text has {n} tokens")
            out.append(i % n)
    return out


def text_projection(model: nn.Module, last: torch.Tensor) -> Any:
    """Block tokens (B, L, D) -> scores (B, classes) through the model's own head: a BERT-style
    classifier (pooler on [CLS], then the classifier), a decoder classifier (``score`` on the
    last real token), a causal LM (final norm, LM head, last real token); None otherwise."""
    import torch

    base = getattr(model, "base_model", None)
    rows = torch.arange(last.shape[0], device=last.device)
    norm = next((getattr(base, a) for a in ("norm", "ln_f", "final_layer_norm", "final_layernorm")
                 if isinstance(getattr(base, a, None), torch.nn.Module)), None)
    if isinstance(getattr(model, "classifier", None), torch.nn.Module) and hasattr(base, "pooler"):
        pooler = getattr(base, "pooler", None)
        return lambda t: model.classifier(pooler(t) if pooler is not None else t[:, 0])
    # The final norm works token by token: the last real token is picked first (one row, not L).
    if isinstance(getattr(model, "score", None), torch.nn.Module) and norm is not None:
        return lambda t: model.score(norm(t[rows, last]))
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and norm is not None:
        return lambda t: head(norm(t[rows, last]))
    return None


def _scores(model: nn.Module, out: Any, last: torch.Tensor) -> torch.Tensor | None:
    """(B, classes) of the explained position: a language model's logits at the last real token."""
    import torch

    from inspect_model.methods.attention.models import model_scores

    try:
        s = model_scores(out)
    except ModelRuntimeError:
        return None
    if s.dim() == 3:  # (B, L, V): each text's last real token
        s = s[torch.arange(s.shape[0], device=s.device), last.to(s.device)]
    return s if s.dim() == 2 else None


def resolve(target: Any, scores: torch.Tensor) -> list[int]:
    """One class (or token) per text for ``target``: predicted, an index, a TargetSpec, a list."""
    from inspect_model.methods.attention.passes import one_target_each

    return one_target_each(target, scores, "text")


@dataclass
class TextState:
    """What one text run keeps while the passes go (the text hooks' ``st``): the built-in
    methods' running values, ``scratch`` for any other method's own."""

    opts: am.AttentionOptions
    raw_layers: set[str]  # the layers of the methods that keep raw probabilities (keeps_raw)
    head_layers: set[str]  # the layers of the methods that score tokens through the head (needs_head)
    queries: list[int]
    lengths: list[int]
    methods: list[Any] = field(default_factory=list)  # the attention methods asked for
    heads: int | None = None
    rollout: Any = None
    raw: dict[str, Any] = field(default_factory=dict)
    abar: dict[int, Any] = field(default_factory=dict)
    legrad: Any = None
    legrad_count: int = 0
    phase: str = ""
    mosaic: list[Any] = field(default_factory=list)
    scratch: dict[str, Any] = field(default_factory=dict)


def _on_forward(st: TextState) -> Any:
    def fn(call: Any) -> None:
        if call.queries != call.keys:
            raise UnsupportedModelError(f"attention in '{call.name}' maps {call.queries} queries to {call.keys} "
                                        "keys: these methods need self-attention over the text's tokens; "
                                        "attributions and grads take this model")
        st.heads = st.heads or call.heads
        p = call.probs()  # (B, h, L, L)
        if st.opts.mosaic:
            st.mosaic.append(_rows(p, st.queries).float().cpu())
        for m in st.methods:
            m.text_forward(st, call, p)
    return fn


def _rows(a: torch.Tensor, queries: list[int]) -> torch.Tensor:
    """(B, ..., L, L) -> (B, ..., L): each text's query row."""
    import torch

    return torch.stack([a[b, ..., q, :] for b, q in enumerate(queries)])


def _on_backward(st: TextState) -> Any:
    def fn(call: Any, grad: torch.Tensor) -> None:
        from inspect_model.methods.attention import base

        method = base.methods().get(st.phase)
        if method is not None:
            method.text_backward(st, call, grad)
    return fn


def compute_text_attention(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor | None = None,
                           options: am.AttentionOptions | None = None, target: Any = "predicted",
                           *, forward: Any = None) -> TextAttention:
    """The maps of ``options.methods`` for token ids (B, L) with their attention mask (B, L)
    (ones when None); ``forward(ids)`` runs the model (default: ``model(input_ids=ids,
    attention_mask=mask)``). The model is given back as it was."""
    import torch

    from inspect_model.engine.attention import AttentionCapture, attention_modules
    from inspect_model.engine.hooks import CaptureOptions, HookEngine, run_forward
    from inspect_model.methods.attention.models import block_of, tokens_of

    from inspect_model.methods.attention import base

    opts = options or am.AttentionOptions()
    own = [base.get(m) for m in opts.methods if base.known(m)]
    textless = [m.name for m in own if not m.text]
    if textless:
        raise UsageError(f"--method {textless[0]} has no form for token models; those with one: "
                         + ", ".join(n for n, m in base.methods().items() if m.text))
    mask = torch.ones_like(ids) if mask is None else mask
    lengths = [int(v) for v in mask.sum(dim=1).tolist()]
    names = attention_modules(model)
    causal = is_causal(model, names)
    raw_layers = _layers([m for m in own if m.keeps_raw], opts, names)
    head_layers = _layers([m for m in own if m.needs_head], opts, names)
    st = TextState(opts, set(raw_layers), set(head_layers), query_tokens(opts.query, lengths, causal), lengths, own)
    last = torch.tensor([n - 1 for n in lengths], device=ids.device)
    run = forward or (lambda x: model(input_ids=x, attention_mask=mask))
    blocks: dict[str, Any] = {}
    leaf: list[Any] = []
    handles: list[Any] = []
    passes = {"forward": 0, "backward": 0}
    scores = classes = None
    options_ = CaptureOptions(outputs=False, eval_mode=True, freeze_params=True, grad_enabled=opts.needs_grad)
    with HookEngine(model, [], options_) as eng:
        try:
            modules = dict(model.named_modules())
            if opts.needs_grad:  # ids are integers: the gradient starts at the embeddings' output
                emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
                if emb is None:
                    raise UnsupportedModelError(f"{type(model).__name__} has no input embeddings to take gradients "
                                                "at; -m raw,rollout need none")
                handles.append(emb.register_forward_hook(_make_leaf(leaf)))
            for name in head_layers:
                block = block_of(model, name)
                handles.append(modules[block].register_forward_hook(
                    lambda _m, _a, out, block=block: blocks.__setitem__(block, tokens_of(out))))
            capture = AttentionCapture(model, forward=_on_forward(st),
                                       backward=_on_backward(st) if opts.needs_grad else None)
            with capture:
                out = run_forward(eng, lambda: run(ids))
                passes["forward"] += 1
                if not capture.calls:
                    raise LayerSelectionError(
                        f"no attention found in {type(model).__name__}: no nn.MultiheadAttention, "
                        "scaled_dot_product_attention or softmax attention ran in the forward pass")
                scores = _scores(model, out, last)
                if scores is not None:
                    classes = resolve(target, scores.detach())
                elif opts.needs_grad:  # a refusal, not a failure (issue 42): raw and rollout run on it
                    from inspect_model.methods.attention.headless import score_free

                    raise UsageError(f"{type(model).__name__} returned no class or token scores for "
                                     f"{', '.join(m for m in opts.methods if not score_free(m))} to explain; "
                                     "raw attention and rollout need none: -m raw,rollout")
                if opts.needs_grad:
                    assert scores is not None and classes is not None
                    _backward(model, st, scores, classes, leaf[0], [blocks[block_of(model, n)] for n in head_layers],
                              last, passes)
        finally:
            for h in handles:
                h.remove()
    return _finish(st, capture.calls, raw_layers, causal, scores, classes, passes)


def _make_leaf(leaf: list[Any]) -> Any:
    """A forward hook: the embeddings' output, detached and made a leaf that requires grad
    (same values, so the model's outputs are unchanged); kept in ``leaf``."""
    def hook(_m: Any, _a: Any, out: torch.Tensor) -> torch.Tensor:
        leaf.append(out.detach().requires_grad_(True))
        return leaf[-1]
    return hook


def _layers(chosen: list[Any], opts: am.AttentionOptions, names: list[str]) -> list[str]:
    """The attention layers of the ``chosen`` methods: ``--layers``, else the first one's default."""
    return am.select_layers(opts.layers or [chosen[0].default_layers], names) if chosen and names else []


def _backward(model: nn.Module, st: TextState, scores: torch.Tensor, classes: list[int], leaf: torch.Tensor,
              tokens: list[torch.Tensor], last: torch.Tensor, passes: dict[str, int]) -> None:
    """The target score's backward pass (the ``score_backward`` methods'), then one of its own
    per other gradient method (LeGrad's), as for images (:mod:`.passes`)."""
    import torch

    idx = torch.tensor(classes, device=scores.device).view(-1, 1)
    own = [m for m in st.methods if m.needs_gradients and not m.score_backward]
    shared = [m for m in st.methods if m.needs_gradients and m.score_backward]
    if shared:
        st.phase = shared[0].name
        torch.autograd.grad(scores.gather(1, idx).sum(), leaf, retain_graph=bool(own))
        passes["backward"] += 1
    for m in own:
        st.phase = m.name
        m.text_own_backward(model, st, idx, leaf, tokens, last)
        passes["backward"] += 1


def _finish(st: TextState, calls: list[Any], raw_layers: list[str], causal: bool, scores: Any,
            classes: list[int] | None, passes: dict[str, int]) -> TextAttention:
    import torch

    values: dict[str, torch.Tensor] = {}
    matrices: dict[str, torch.Tensor] = {}
    for m in st.methods:
        vals, matrix = m.text_result(st)
        if matrix is not None:
            matrices[m.name], vals = matrix, _rows(matrix, st.queries)
        if vals is not None:
            values[m.name] = vals
    raw, labels = {}, {}
    for name in raw_layers:
        if name not in st.raw:
            raise LayerSelectionError(f"attention layer '{name}' did not run in the forward pass")
        raw[name], labels[name] = _pick_heads(st.raw[name], st.opts.heads, name)
    return TextAttention(values=values, matrices=matrices, raw=raw, head_labels=labels,
                         layers=list(dict.fromkeys(c.name for c in calls)), heads=int(st.heads or 0),
                         lengths=st.lengths, queries=st.queries, causal=causal,
                         scores=None if scores is None else scores.detach().float().cpu(), targets=classes,
                         passes=passes, mosaic=torch.stack(st.mosaic, dim=1) if st.mosaic else None)


def _pick_heads(p: torch.Tensor, heads_opt: str, name: str) -> tuple[torch.Tensor, list[str]]:
    """(B, h, L, L) -> the heads ``--heads`` shows, and their labels."""
    heads = am.parse_heads(heads_opt)
    h = p.shape[1]
    if heads == "all":
        return p, [f"head {i}" for i in range(h)]
    if isinstance(heads, str):
        return am.fuse_heads(p, heads).unsqueeze(1), [f"{heads} of {h} heads"]
    bad = [i for i in heads if not -h <= i < h]
    if bad:
        raise UsageError(f"--heads {bad[0]} is out of range: '{name}' has {h} heads (0..{h - 1})")
    return p[:, list(heads)], [f"head {i % h}" for i in heads]
