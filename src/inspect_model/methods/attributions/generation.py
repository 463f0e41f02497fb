"""Attribution over a generation (issue 36, item 3): each generated token attributed to the
prompt and to the tokens generated before it, as one tokens x tokens matrix.

The N target tokens are the model's greedy continuation of the prompt (argmax at every
step, stopping after the end-of-sequence token, as ``model.generate(do_sample=False)``),
or a continuation given (teacher-forced: nothing generated). Generation runs under
``no_grad``; then each target token t is explained on its own prefix alone, as if it were
the last token of a plain ``attributions --text`` run (one forward and one backward per
token for the gradient methods; integrated gradients' and occlusion's rows in chunks of
``batch_size``), so that no graph outlives its row and memory holds one prefix's passes
plus the matrix, whatever N.

The score of row t is ``log p(y_t | prefix)``, or with a contrast token c
``log p(y_t | prefix) - log p(c | prefix)``: the normaliser cancels, so it is the logit
difference of Yin & Neubig 2022's contrastive explanations (inseq's contrastive step,
``contrast_prob_diff``, takes the difference of the probabilities instead). Attributions are taken at the outputs of the
embedding layers (captum's ``LayerIntegratedGradients`` on the embedding): a causal LM's
input embedding; an encoder-decoder's encoder embedding (the prompt, encoder tokens) and
decoder embedding (its start token and the tokens generated before). A cell is the sum
over the embedding dimension of the method's map at that token: saliency sum |g|,
gradient sum g, input x gradient sum x g, integrated gradients sum (x - b) * mean g on the
path (with each row's completeness gap sum(row) - (f(x) - f(b))), occlusion
f(x) - f(x with that token's embedding replaced by the baseline). Cells past the row's
own prefix are NaN (reports: null).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from inspect_model.engine.hooks import CaptureOptions, HookEngine, run_forward
from inspect_model.errors import InputError, ModelRuntimeError, UsageError
from inspect_model.loading.wrappers import unwrap_module
from inspect_model.methods.attributions import base as ab

Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class GenerationSettings:
    """How to attribute a generation; ``new_tokens`` greedy steps unless ``continuation``
    (token ids, teacher-forced) is given. ``contrast``: a token id, or None."""

    methods: tuple[str, ...] = ("saliency",)
    new_tokens: int = 8
    continuation: tuple[int, ...] | None = None
    contrast: int | None = None
    steps: int = 32
    rule: str = "gauss-legendre"
    baseline: Any = "zeros"  # zeros | a number | uniform (seeded) in the embedding space
    batch_size: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        for m in self.methods:
            if ab.get(m).generation is None:
                able = ", ".join(n for n, r in ab.methods().items() if r.generation is not None)
                raise UsageError(f"--generate attributes each token with {able}; --method {m} is not one of them")
        if self.continuation is None and self.new_tokens < 1:
            raise UsageError(f"--generate {self.new_tokens}: generate at least 1 token")
        if self.continuation is not None and not self.continuation:
            raise UsageError("--continuation has no tokens")
        if not isinstance(self.steps, int):
            raise UsageError("--generate takes a number of --steps (not auto)")


@dataclass
class GenerationAttribution:
    """One prompt's generation and its matrices (see the module docstring)."""

    prompt: list[int]  # the prompt's ids (the encoder's, for an encoder-decoder)
    generated: list[int]  # the N target tokens, in order
    columns: list[int]  # the ids of the matrix columns: prompt [+ decoder start] + generated[:-1]
    parts: list[str]  # per column: "prompt", "start" (a decoder's start token) or "generated"
    first: int  # the columns of row 0; row t has first + t
    matrices: dict[str, torch.Tensor]  # method -> (N, C) float64, NaN past each row's prefix
    scores: list[float]  # f(x) of each row
    log_probs: list[float]  # log p(y_t | prefix)
    contrast_log_probs: list[float] | None = None
    baseline_scores: list[float] | None = None  # integrated gradients: f(b) per row
    gaps: list[float] | None = None  # sum(row) - (f(x) - f(b))
    mode: str = "greedy"  # greedy | continuation
    stopped: bool = False  # greedy generation ended at the end-of-sequence token
    layers: list[str] = field(default_factory=list)  # the embedding layers attributed to


# ------------------------------------------------------------------ the model's calls
class _Sites:
    """Forward hooks on the embedding layers: in call order, site i is the i-th embedding
    call of a forward pass (an encoder-decoder sharing one embedding calls it twice). A
    site's output is captured, or replaced by ``values[i]`` (the rows being attributed)."""

    def __init__(self, modules: list[torch.nn.Module]) -> None:
        self.modules = modules
        self.values: list[torch.Tensor | None] = [None] * len(modules)
        self.captured: list[torch.Tensor | None] = [None] * len(modules)
        self._calls: dict[int, int] = {}
        unique = list({id(m): m for m in modules}.values())
        self._handles = [m.register_forward_hook(self._hook) for m in unique]

    def _hook(self, module: torch.nn.Module, args: Any, out: Any) -> Any:
        k = self._calls.get(id(module), 0)
        self._calls[id(module)] = k + 1
        where = [i for i, m in enumerate(self.modules) if m is module]
        if k >= len(where):
            return None
        i = where[k]
        self.captured[i] = out.detach()
        v = self.values[i]
        # A clone: a model may add to its embeddings in place, which a leaf refuses.
        return None if v is None else v.clone()

    def start(self, values: list[torch.Tensor] | None) -> None:
        self._calls = {}
        self.values = list(values) if values is not None else [None] * len(self.modules)

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


class _Model:
    """A causal LM or an encoder-decoder, called on (R rows of) one prefix; the score."""

    def __init__(self, model: torch.nn.Module, engine: HookEngine, device: Any) -> None:
        self.model, self.engine, self.device = model, engine, device
        cfg = getattr(model, "config", None)
        self.seq2seq = bool(getattr(cfg, "is_encoder_decoder", False))
        names = {m: n for n, m in model.named_modules()}
        if self.seq2seq:
            enc, dec = model.get_encoder().get_input_embeddings(), model.get_decoder().get_input_embeddings()
            mods = [enc, dec]
            start = getattr(cfg, "decoder_start_token_id", None)
            self.start = int(start if start is not None else getattr(cfg, "pad_token_id", 0) or 0)
        else:
            emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
            mods = [emb]
        if any(not isinstance(m, torch.nn.Embedding) for m in mods):
            raise InputError(f"{type(model).__name__} has no input embedding layer (get_input_embeddings) to "
                             "attribute a generation to")
        self.layers = [names.get(m, "embedding") for m in mods]
        self.sites = _Sites(mods)
        gen = getattr(model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) if gen is not None else None
        eos = getattr(cfg, "eos_token_id", None) if eos is None else eos
        self.eos = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])

    def parts(self, prompt: list[int], before: list[int]) -> list[torch.Tensor]:
        """The id rows (1, L_site) of each site for the prefix ``prompt`` + ``before``."""
        dev = self.device
        if self.seq2seq:
            return [torch.tensor([prompt], device=dev), torch.tensor([[self.start, *before]], device=dev)]
        return [torch.tensor([[*prompt, *before]], device=dev)]

    def logits(self, ids: list[torch.Tensor], rows: int, values: list[torch.Tensor] | None = None) -> torch.Tensor:
        """The next-token logits (rows, V) of the prefix ``ids``, its embeddings replaced by
        ``values`` (rows, L_site, D) when given."""
        rep = [i.expand(rows, -1) for i in ids]
        self.sites.start(values)
        try:
            if self.seq2seq:
                out = run_forward(self.engine, lambda: self.model(input_ids=rep[0], decoder_input_ids=rep[1]))
            else:
                out = run_forward(self.engine, lambda: self.model(input_ids=rep[0]))
        finally:
            self.sites.start(None)
        logits = getattr(out, "logits", out[0] if isinstance(out, (tuple, list)) else out)
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
            raise ModelRuntimeError(f"{type(self.model).__name__} returned no (batch, tokens, vocab) logits; "
                                    "--generate needs a language model")
        return logits[:, -1]

    def embeddings(self, ids: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Each site's embedding output (1, L_site, D) and the logits of the plain pass."""
        with torch.no_grad():
            logits = self.logits(ids, 1)
        xs = self.sites.captured
        if any(x is None or not x.is_floating_point() for x in xs):
            raise ModelRuntimeError("an embedding layer was not called (or not with floating outputs)")
        return [x for x in xs if x is not None], logits


def _objective(logits: torch.Tensor, target: int, contrast: int | None) -> torch.Tensor:
    """(R,) log p(target) [- log p(contrast)] from next-token logits (R, V)."""
    lp = logits.float().log_softmax(dim=-1)
    s = lp[:, target]
    return s if contrast is None else s - lp[:, contrast]


# ------------------------------------------------------------------ generation
def greedy(m: _Model, prompt: list[int], n: int) -> tuple[list[int], bool]:
    """The greedy continuation (up to ``n`` tokens, the end token included) under no_grad."""
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(m.logits(m.parts(prompt, out), 1)[0].argmax())
            out.append(nxt)
            if nxt in m.eos:
                return out, True
    return out, False


# ------------------------------------------------------------------ one row
def _baseline(spec: Any, xs: list[torch.Tensor], seed: int, row: int) -> list[torch.Tensor]:
    from inspect_model.methods.attributions import passes as ap

    return [ap.make_baseline(spec, x, seed=seed, first_index=1000 * row + i, space="embedding")
            for i, x in enumerate(xs)]


def _gradients(m: _Model, ids: list[torch.Tensor], xs: list[torch.Tensor], target: int,
               contrast: int | None) -> list[torch.Tensor]:
    """d score / d x at each site (1, L, D): one forward and one backward."""
    leaves = [x.detach().requires_grad_(True) for x in xs]
    with torch.enable_grad():
        s = _objective(m.logits(ids, 1, leaves), target, contrast).sum()
        if not s.requires_grad:
            raise ModelRuntimeError("the score does not depend on the embeddings; nothing to attribute")
        gs = torch.autograd.grad(s, leaves)
    return [g.detach() for g in gs]


def _integrated(m: _Model, ids: list[torch.Tensor], xs: list[torch.Tensor], base: list[torch.Tensor],
                target: int, contrast: int | None, st: GenerationSettings) -> tuple[torch.Tensor, float]:
    """(cells (C,), f(baseline)): (x - b) * sum_k w_k grad(b + a_k (x - b)), summed over D."""
    from inspect_model.methods.attributions.passes import integration_rule

    alphas, weights = integration_rule(st.rule, st.steps)
    acc = [torch.zeros_like(x, dtype=torch.float64) for x in xs]
    for lo in range(0, len(alphas), st.batch_size):
        a = torch.tensor(alphas[lo:lo + st.batch_size], dtype=xs[0].dtype, device=xs[0].device)
        w = torch.tensor(weights[lo:lo + st.batch_size], dtype=torch.float64, device=xs[0].device)
        rows = [(b + a[:, None, None] * (x - b)).detach().requires_grad_(True) for x, b in zip(xs, base)]
        with torch.enable_grad():
            s = _objective(m.logits(ids, len(a), rows), target, contrast)
            gs = torch.autograd.grad(s.sum(), rows)
        for i, g in enumerate(gs):
            acc[i] += (g.double() * w[:, None, None]).sum(0, keepdim=True)
    with torch.no_grad():
        fb = float(_objective(m.logits(ids, 1, base), target, contrast)[0])
    cells = torch.cat([((x - b).double() * g).sum(-1)[0] for x, b, g in zip(xs, base, acc)])
    return cells, fb


def _occlusion(m: _Model, ids: list[torch.Tensor], xs: list[torch.Tensor], base: list[torch.Tensor],
               target: int, contrast: int | None, fx: float, batch: int) -> torch.Tensor:
    """(C,): f(x) - f(x with one token's embedding replaced by the baseline), per token."""
    where = [(i, j) for i, x in enumerate(xs) for j in range(int(x.shape[1]))]
    out = []
    with torch.no_grad():
        for lo in range(0, len(where), batch):
            chunk = where[lo:lo + batch]
            rows = [x.expand(len(chunk), -1, -1).clone() for x in xs]
            for r, (i, j) in enumerate(chunk):
                rows[i][r, j] = base[i][0, j]
            out.append(fx - _objective(m.logits(ids, len(chunk), rows), target, contrast).double().cpu())
    return torch.cat(out)


def _cells(rule: str | None, xs: list[torch.Tensor], gs: list[torch.Tensor]) -> torch.Tensor:
    """A gradient method's cells (C,) from the shared gradients (``gradient_rule``)."""
    parts = []
    for x, g in zip(xs, gs):
        v = g.abs() if rule == "abs" else g * x if rule == "input-x-grad" else g
        parts.append(v.double().sum(-1)[0])
    return torch.cat(parts)


# ------------------------------------------------------------------ the whole run
def attribute_generation(model: torch.nn.Module, prompt: list[int], settings: GenerationSettings, *,
                         device: Any = None, progress: Progress | None = None) -> GenerationAttribution:
    """The generation of ``prompt`` (token ids, or the encoder's ids) and its attribution
    matrices by every method of ``settings`` (module docstring). The model is left as it
    was (modes, flags, no hooks)."""
    st = settings
    if not prompt:
        raise InputError("the prompt has no tokens; nothing to continue")
    model = unwrap_module(model)[0]
    if device is None:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
    opts = CaptureOptions(outputs=False, freeze_params=True, eval_mode=True, grad_enabled=False)
    with HookEngine(model, [], opts) as engine:
        m = _Model(model, engine, device)
        try:
            return _run(m, list(prompt), st, progress)
        finally:
            m.sites.close()


def _check_length(m: _Model, prompt: list[int], st: GenerationSettings) -> None:
    """A prefix longer than the model's positions fails in the middle of a run: refuse it first.
    (T5's relative positions have no such limit; its config's ``n_positions`` is no bound.)"""
    cfg = getattr(m.model, "config", None)
    if m.seq2seq:
        limit = getattr(cfg, "max_position_embeddings", None)
    else:
        limit = getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)
    n = len(st.continuation) if st.continuation is not None else st.new_tokens
    longest = max(len(prompt), n) if m.seq2seq else len(prompt) + n - 1  # the last row's prefix
    if isinstance(limit, int) and longest > limit:
        raise InputError(f"the prompt ({len(prompt)} tokens) and {n} generated make a prefix of {longest} tokens; "
                         f"{type(m.model).__name__} takes at most {limit} positions: generate fewer tokens")


def _run(m: _Model, prompt: list[int], st: GenerationSettings, progress: Progress | None) -> GenerationAttribution:
    _check_length(m, prompt, st)
    if st.continuation is not None:
        generated, stopped, mode = list(st.continuation), False, "continuation"
    else:
        generated, stopped = greedy(m, prompt, st.new_tokens)
        mode = "greedy"
    n = len(generated)
    first = len(prompt) + (1 if m.seq2seq else 0)
    width = first + n - 1
    reg = {name: ab.get(name) for name in st.methods}
    mats = {name: torch.full((n, width), float("nan"), dtype=torch.float64) for name in st.methods}
    scores, logps, contrast_lps, fbs, gaps = [], [], [], [], []
    for t, target in enumerate(generated):
        ids = m.parts(prompt, generated[:t])
        xs, logits = m.embeddings(ids)
        lp = logits.float().log_softmax(-1)[0]
        fx = float(_objective(logits, target, st.contrast)[0])
        scores.append(fx)
        logps.append(float(lp[target]))
        if st.contrast is not None:
            contrast_lps.append(float(lp[st.contrast]))
        cols = first + t
        gs = None
        base = _baseline(st.baseline, xs, st.seed, t) if any(r.needs_baseline for r in reg.values()) else []
        for name, r in reg.items():
            if r.generation == "gradient":
                gs = gs if gs is not None else _gradients(m, ids, xs, target, st.contrast)
                row = _cells(r.gradient_rule, xs, gs)
            elif r.generation == "integrated":
                row, fb = _integrated(m, ids, xs, base, target, st.contrast, st)
                fbs.append(fb)
                gaps.append(float(row.sum()) - (fx - fb))
            else:
                row = _occlusion(m, ids, xs, base, target, st.contrast, fx, st.batch_size)
            mats[name][t, :cols] = row.cpu()
        if progress is not None:
            progress(t + 1, n, "generated tokens")
    parts = ["prompt"] * len(prompt) + (["start"] if m.seq2seq else []) + ["generated"] * max(n - 1, 0)
    columns = [*prompt, *([m.start] if m.seq2seq else []), *generated[:-1]]
    return GenerationAttribution(prompt=prompt, generated=generated, columns=columns, parts=parts, first=first,
                                 matrices=mats, scores=scores, log_probs=logps,
                                 contrast_log_probs=contrast_lps if st.contrast is not None else None,
                                 baseline_scores=fbs or None, gaps=gaps or None, mode=mode, stopped=stopped,
                                 layers=m.layers)
