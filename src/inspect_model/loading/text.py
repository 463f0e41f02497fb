"""Text inputs (``--text``, ``--text-file``, ``--tokenizer``) for Hugging Face text models (issue 26).

A text run tokenises its texts with the model folder's own tokenizer (or ``--tokenizer
DIR``), read by transformers' ``AutoTokenizer`` from local files only and never with the
folder's own code (``trust_remote_code=False``). :class:`TextPlan` streams batches whose
tensor is ``input_ids`` (B, L), padded on the right to the batch's longest text (so token
``i`` sits at position ``i`` in every text, and the last real token of text ``b`` is
``lengths[b] - 1``); :class:`TextBinding` (a forward pre-hook held for the run, like the
several-inputs binding) turns ``model(input_ids)`` into ``model(input_ids=...,
attention_mask=...)`` with the batch's mask. Each batch carries a :class:`TextBatch`: the
mask, the tokens as the tokenizer names them and the texts.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inspect_model.loading.plans import Plan
from inspect_model.errors import InputError, UsageError
from inspect_model.loading.parsing import read_bounded

if TYPE_CHECKING:
    import torch
    from torch import nn

# Files a tokenizer is read from (any one of them is a tokenizer in the folder).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt",
                   "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "special_tokens_map.json")
MAX_TEXTS = 10000


@dataclass
class TextBatch:
    """What a batch of texts is besides its ids: the mask, the tokens and the texts."""

    mask: torch.Tensor  # (B, L) 1 for a real token, 0 for padding
    tokens: list[list[str]]  # per text, its real tokens (no padding)
    texts: list[str]

    @property
    def lengths(self) -> list[int]:
        return [len(t) for t in self.tokens]


def read_texts(texts: Sequence[str] | None, text_file: str | os.PathLike[str] | None) -> list[str]:
    """``--text`` values, then the lines of ``--text-file`` (blank lines skipped)."""
    out = [texts] if isinstance(texts, str) else [str(t) for t in texts or []]
    if text_file is not None:
        path = Path(text_file)
        if not path.exists():
            raise InputError(f"text file '{path}' does not exist")
        try:
            lines = read_bounded(path, f"text file '{path}'").decode("utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"text file '{path}' cannot be read as UTF-8 text: {exc}") from exc
        out += [ln for ln in lines if ln.strip()]
        if not any(ln.strip() for ln in lines):
            raise InputError(f"text file '{path}' holds no text (one text per line)")
    if any(not t.strip() for t in out):
        raise InputError("--text is empty; give the text to tokenise, e.g. --text 'the cat sat'")
    if len(out) > MAX_TEXTS:
        raise InputError(f"{len(out)} texts; at most {MAX_TEXTS} per run")
    return out


def tokenizer_folder(loaded: Any, given: str | os.PathLike[str] | None, spec: Any) -> str:
    """The folder to read the tokenizer from: ``--tokenizer``, else the model's own folder."""
    if given is not None:
        folder = str(given)
        if not os.path.isdir(folder):
            raise InputError(f"--tokenizer '{folder}' is not a folder; give a folder written by "
                             "tokenizer.save_pretrained")
        if not _has_tokenizer(folder):
            raise InputError(f"--tokenizer '{folder}' holds no tokenizer (none of tokenizer.json, vocab.txt, "
                             "vocab.json, tokenizer.model)")
        return folder
    name = getattr(loaded, "name", None) or str(spec)
    found = _model_folder(loaded, spec)
    if found is None or not _has_tokenizer(found):
        from inspect_model.loading.hub_models import offline

        hub = isinstance(spec, str) and spec.startswith("hf:") and not os.path.isdir(spec.removeprefix("hf:"))
        why = f" ({offline()} is set: only the cache was read)" if hub and offline() else ""
        raise InputError(f"--text needs a tokenizer, and {name} has none in its folder{why}; give --tokenizer DIR "
                         "(a folder written by tokenizer.save_pretrained)")
    return found


def precheck_tokenizer(spec: Any, given: Any) -> None:
    """Before any build: a model folder given ``--text`` without ``--tokenizer`` must hold a
    tokenizer (the same one-line error as :func:`tokenizer_folder`, seconds earlier: an 8B
    model is not built to learn this, issue 37)."""
    if given is not None or not isinstance(spec, str):
        return
    folder = spec.strip().removeprefix("hf:")
    if os.path.isdir(folder) and os.path.isfile(os.path.join(folder, "config.json")) and not _has_tokenizer(folder):
        raise InputError(f"--text needs a tokenizer, and {folder} has none in its folder; give --tokenizer DIR "
                         "(a folder written by tokenizer.save_pretrained)")


def _has_tokenizer(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, f)) for f in TOKENIZER_FILES if f != "special_tokens_map.json")


def _model_folder(loaded: Any, spec: Any) -> str | None:
    """A Hugging Face model's local folder (a hub id: its cache snapshot, tokenizer files
    brought into it from the cache or the hub; offline nothing is fetched)."""
    if getattr(loaded, "source", None) != "hf":
        return None
    ref = str(spec).removeprefix("hf:") if isinstance(spec, str) else ""
    if ref and not os.path.isdir(ref):
        from inspect_model.loading.hub_models import hub_file

        what = f"the tokenizer of {loaded.name}"
        fast = [hub_file(ref, [fn], what=what, required=False)
                for fn in ("tokenizer_config.json", "tokenizer.json", "special_tokens_map.json")]
        if fast[1] is None:  # no tokenizer.json: the vocabulary files a slow tokenizer is built from
            for fn in TOKENIZER_FILES[2:8]:
                hub_file(ref, [fn], what=what, required=False)
    folder = getattr(getattr(loaded, "config", None), "_name_or_path", None)
    return str(folder) if folder and os.path.isdir(str(folder)) else (ref if ref and os.path.isdir(ref) else None)


def load_tokenizer(folder: str) -> Any:
    """transformers' tokenizer of ``folder``: local files only, never the folder's own code."""
    from inspect_model.loading.hub_models import quiet_hub_logs, require, short_reason

    transformers = require("transformers")
    try:
        with quiet_hub_logs():
            tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except Exception as exc:
        raise InputError(f"cannot read the tokenizer in '{folder}': {short_reason(exc)}") from exc
    tok.padding_side = "right"  # token i at position i in every text (module docstring)
    if tok.pad_token is None:  # GPT-2's tokenizer has none: pad with a token the mask hides anyway
        fill = tok.eos_token or tok.unk_token
        if fill is None:
            raise InputError(f"the tokenizer in '{folder}' has no padding, end or unknown token to pad texts with; "
                             "give one text at a time")
        tok.pad_token = fill
    return tok


@dataclass
class TextBinding:
    """``model(input_ids)`` -> ``model(input_ids=..., attention_mask=...)`` with the mask of
    the batch being run (module docstring); keyword names follow the model's forward."""

    ids_key: str | None = "input_ids"  # None: ids go in positionally
    mask_key: str | None = "attention_mask"  # None: the model takes no mask
    mask: Any = None  # the current batch's (B, L) mask
    last_only: bool = False  # a causal LM under grads: its logits (B, L, V) -> those at each text's last token

    def set_batch(self, mask: torch.Tensor, ids: torch.Tensor | None = None) -> None:
        self.mask = mask

    def describe(self) -> dict[str, Any]:
        return {"image_input": self.ids_key or 0, "other_inputs": {self.mask_key: "the tokenizer's"} if self.mask_key
                else {}}

    def call(self, x: torch.Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
        kwargs: dict[str, Any] = {}
        if self.mask_key is not None and self.mask is not None:
            if tuple(x.shape[:2]) != tuple(self.mask.shape):
                raise InputError(f"token ids of shape {tuple(x.shape)} do not match the attention mask "
                                 f"{tuple(self.mask.shape)} of the batch")
            kwargs[self.mask_key] = self.mask.to(x.device)
        if self.ids_key is None:
            return (x,), kwargs
        return (), {self.ids_key: x, **kwargs}

    @contextmanager
    def bound(self, model: nn.Module) -> Iterator[None]:
        """While inside, ``model(ids)`` gets the mask too; the hook is always removed."""
        def hook(_mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
            if len(args) == 1 and not kwargs:
                return self.call(args[0])
            return None

        handles = [model.register_forward_pre_hook(hook, with_kwargs=True, prepend=True)]
        if self.last_only:
            handles.append(model.register_forward_hook(self._last_token))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def _last_token(self, _mod: Any, _args: Any, out: Any) -> Any:
        """The next-token logits at each text's last real token, (B, V): the score explained."""
        import torch

        logits = getattr(out, "logits", out)
        if self.mask is None or not isinstance(logits, torch.Tensor) or logits.dim() != 3:
            return None
        last = (self.mask.sum(dim=1) - 1).to(logits.device)
        picked = logits[torch.arange(logits.shape[0], device=logits.device), last]
        if hasattr(out, "logits"):
            out["logits"] = picked
            return out
        return picked


def binding_for(model: nn.Module) -> TextBinding:
    """Where the model's forward takes the ids and the mask (HF: ``input_ids``, ``attention_mask``)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return TextBinding()
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    ids_key = "input_ids" if "input_ids" in params or var_kw else None
    mask_key = "attention_mask" if "attention_mask" in params or (var_kw and ids_key) else None
    return TextBinding(ids_key, mask_key)


@dataclass
class TextPlan(Plan):
    unit = "text"
    """Texts tokenised in batches (same fields as ``InputPlan`` where the pipeline reads them)."""

    texts: list[str]
    tokenizer: Any
    binding: TextBinding
    batch_size: int
    max_length: int
    tokenizer_dir: str
    device: Any = "cpu"
    seed: int = 0
    paths: list[Path] = field(default_factory=list)
    preprocess: Any = None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    processed: int = 0
    truncated: int = 0
    suffix: list[int] = field(default_factory=list)  # token ids appended to every text (a causal LM's --target-text)

    def __post_init__(self) -> None:
        # One name per text, in order: the runner shards and resumes a run by these (torchrun,
        # --resume), as it does image paths; batches() reads the texts of the names it is given.
        self.paths = [Path(n) for n in self.names(0, len(self.texts))]

    def describe(self) -> dict[str, Any]:
        import hashlib

        digest = hashlib.sha256("\n".join(self.texts).encode("utf-8", "surrogateescape")).hexdigest()
        return {"images": [], "preprocessing": None, "input_size": None, "batch_size": self.batch_size,
                "channels": None, "seed": self.seed, "fill": "text", "skip_bad_inputs": False,
                "text": {"texts": len(self.texts), "sha256": digest, "tokenizer": self.tokenizer_dir,
                         "tokenizer_class": type(self.tokenizer).__name__, "max_length": self.max_length,
                         "padding": "right"}}

    def names(self, start: int, count: int) -> list[str]:
        return [f"text-{i}" for i in range(start, start + count)]

    def batches(self) -> Iterator[Any]:
        from inspect_model.loading.batch import InputBatch

        self.processed = 0
        for start in range(0, len(self.paths), self.batch_size):
            names = [p.name for p in self.paths[start:start + self.batch_size]]
            chunk = [self.texts[int(n.rsplit("-", 1)[1])] for n in names]
            ids, mask, tokens = tokenize(self.tokenizer, chunk, self.max_length, self.suffix)
            full = [len(self.tokenizer(t, add_special_tokens=True)["input_ids"]) for t in chunk]
            self.truncated += sum(int(f > self.max_length) for f in full)
            ids, mask = ids.to(self.device), mask.to(self.device)
            self.binding.set_batch(mask, ids)
            self.processed += len(chunk)
            yield InputBatch(ids, names, None, text=TextBatch(mask, tokens, list(chunk)))
        if self.truncated:
            self.warnings.append(f"{self.truncated} text(s) longer than {self.max_length} tokens were cut to "
                                 f"{self.max_length}")


def tokenize(tok: Any, texts: list[str], max_length: int, suffix: list[int] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, list[list[str]]]:
    """(input_ids (B, L), attention_mask (B, L), the real tokens of each text); ``suffix``:
    token ids appended to every text before padding (within ``max_length``)."""
    if suffix:
        import torch

        rows = [tok(t, truncation=True, max_length=max(1, max_length - len(suffix)))["input_ids"] + list(suffix)
                for t in texts]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), int(tok.pad_token_id or 0), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
        tokens = [tok.convert_ids_to_tokens(r) for r in rows]
        return ids, mask, [[str(t) for t in row] for row in tokens]
    enc = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    ids, mask = enc["input_ids"], enc.get("attention_mask")
    if mask is None:
        import torch

        mask = torch.ones_like(ids)
    tokens = [tok.convert_ids_to_tokens(ids[i][: int(mask[i].sum())].tolist()) for i in range(ids.shape[0])]
    return ids, mask.long(), [[str(t) for t in row] for row in tokens]


def plan_text(loaded: Any, texts: list[str], *, tokenizer: Any, spec: Any, batch_size: int, device: Any,
              seed: int) -> TextPlan:
    """The plan of a text run (module docstring)."""
    if getattr(loaded, "task", None) in ("detection", "segmentation", "video", "optical_flow"):
        raise UsageError(f"--text needs a text model; {loaded.name} is a {loaded.task} model")
    folder = tokenizer_folder(loaded, tokenizer, spec)
    tok = load_tokenizer(folder)
    config = getattr(loaded, "config", None)
    limit = int(getattr(config, "max_position_embeddings", 0) or getattr(config, "n_positions", 0) or 0)
    own = int(getattr(tok, "model_max_length", 0) or 0)
    known = [v for v in (limit, own if 0 < own < 10**6 else 0) if v > 0]
    max_length = min(known) if known else 512  # nothing says: BERT's length
    return TextPlan(texts, tok, binding_for(loaded.model), batch_size, max_length, folder, device=device, seed=seed)


def is_causal_lm(model: Any) -> bool:
    """A language model predicting the next token (GPT-2, Llama, ...): its logits are (B, L, vocab)."""
    name = type(model).__name__
    return name.endswith(("ForCausalLM", "LMHeadModel"))


def check_text_request(inputs: Any) -> list[str] | None:
    """The text options checked before anything is loaded (no torch): the texts, or None
    for a run without ``--text``."""
    if not inputs.text and inputs.text_file is None:
        if inputs.tokenizer is not None:
            raise UsageError("--tokenizer needs --text or --text-file")
        return None
    # Images with texts: a two-tower model takes both (checked once the model's task is known).
    clash = [flag for flag, given in (("--input-size", inputs.input_size),
        ("--inputs-file", inputs.inputs_file), ("--image-input", inputs.image_input)) if given]
    if clash:
        raise UsageError(f"--text feeds the model its token ids; drop {clash[0]}")
    if inputs.tokenizer is not None and not os.path.isdir(str(inputs.tokenizer)):
        raise InputError(f"--tokenizer '{inputs.tokenizer}' is not a folder; give a folder written by "
                         "tokenizer.save_pretrained")
    return read_texts(inputs.text, inputs.text_file)


def text_run(loaded: Any, inputs: Any, *, spec: Any, device: Any, categories: Any,
             command: str = "") -> tuple[TextPlan, Any]:
    """The plan of ``--text``/``--text-file`` and the class names: a language model's are its
    tokens (so ``--target`` may name one). Under ``grads`` a language model's score is its
    next-token logits at each text's last token."""
    texts = check_text_request(inputs)
    assert texts is not None
    plan = plan_text(loaded, texts, tokenizer=inputs.tokenizer, spec=spec, batch_size=inputs.batch_size or 8,
                     device=device, seed=inputs.seed)
    if categories is None and is_causal_lm(loaded.model):
        vocab = int(getattr(getattr(loaded, "config", None), "vocab_size", 0) or len(plan.tokenizer))
        names = plan.tokenizer.convert_ids_to_tokens(list(range(min(vocab, len(plan.tokenizer)))))
        categories = [str(t) for t in names] + [f"<id {i}>" for i in range(len(names), vocab)]
    return plan, categories
