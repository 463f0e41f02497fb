"""A tuned lens (Belrose et al. 2023, "Eliciting Latent Predictions from Transformers with the
Tuned Lens"), read in the format of its reference code (AlignmentResearch/tuned-lens,
``TunedLens.save``): a folder holding ``config.json`` (``d_model``, ``num_hidden_layers``,
``bias``, ``unembed_hash`` ...) and ``params.pt``, the ``state_dict`` of a ModuleList of one
``nn.Linear(d_model, d_model)`` per layer (keys ``0.weight``, ``0.bias``, ...). Translator
``i`` maps ``hidden_states[i]`` (0: the embeddings, i: block i-1's output) as
``h + W_i h + b_i``: a translator of zeros is the identity, the logit lens. The last block's
output has none (the model's own logits). ``params.safetensors`` is read as well.

The file is read with ``weights_only=True`` (loading/torch_files.py) and checked against the
model: a wrong width or layer count is one line, exit 3.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inspect_model.errors import ModelLoadError

if TYPE_CHECKING:
    import torch

PARAMS = ("params.pt", "params.safetensors")


@dataclass(frozen=True)
class TunedLens:
    """The translators, checked against a model: ``weights[i]`` (d, d), ``biases[i]`` (d,) or None."""

    path: str
    weights: tuple[torch.Tensor, ...]
    biases: tuple[torch.Tensor | None, ...]
    config: dict[str, Any]

    def __len__(self) -> int:
        return len(self.weights)

    def translate(self, h: torch.Tensor, idx: int) -> torch.Tensor:
        """``h + W h + b`` (tuned-lens ``transform_hidden``); idx past the last: ``h``."""
        import torch

        if idx >= len(self.weights):
            return h
        w = self.weights[idx].to(device=h.device, dtype=h.dtype)
        b = self.biases[idx]
        out = torch.nn.functional.linear(h, w, None if b is None else b.to(device=h.device, dtype=h.dtype))
        return h + out


def _files(path: str) -> tuple[Path | None, Path]:
    """(config.json or None, the parameters file) of ``--lens PATH`` (a folder or a file)."""
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"--lens '{path}' does not exist; give the folder a tuned lens was saved to "
                             "(config.json and params.pt)")
    if p.is_dir():
        params = next((p / f for f in PARAMS if (p / f).is_file()), None)
        if params is None:
            raise ModelLoadError(f"--lens '{path}' holds no params.pt nor params.safetensors (TunedLens.save writes "
                                 "config.json and params.pt)")
        return (p / "config.json" if (p / "config.json").is_file() else None), params
    return (p.parent / "config.json" if (p.parent / "config.json").is_file() else None), p


def _config(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    from inspect_model.loading.parsing import load_json

    doc = load_json(str(path), what="tuned lens config", error=ModelLoadError)
    if not isinstance(doc, dict):
        raise ModelLoadError(f"tuned lens config '{path}' is not a JSON object")
    return doc


def load_tuned_lens(path: str | os.PathLike[str], *, d_model: int, layers: int) -> TunedLens:
    """The tuned lens at ``path`` for a model of width ``d_model`` and ``layers`` blocks
    (module docstring); any mismatch is a :class:`ModelLoadError` naming both sides."""
    from inspect_model.loading.checkpoints import read_checkpoint

    cfg_path, params = _files(str(path))
    cfg = _config(cfg_path)
    for key, want in (("d_model", d_model), ("num_hidden_layers", layers)):
        got = cfg.get(key)
        if got is not None and got != want:
            raise ModelLoadError(f"--lens {path}: its config says {key}={got}, the model has {want}; it was tuned "
                                 f"for another model ({cfg.get('base_model_name_or_path') or 'unnamed'})")
    state = read_checkpoint(str(params), what="tuned lens")
    if not isinstance(state, dict):
        raise ModelLoadError(f"--lens {params}: expected a state_dict of translators, got {type(state).__name__}")
    weights, biases = [], []
    for i in range(layers):
        w, b = state.get(f"{i}.weight"), state.get(f"{i}.bias")
        if w is None:
            raise ModelLoadError(f"--lens {params}: no translator {i} ('{i}.weight'); the model has {layers} "
                                 f"layer(s) and the lens {_count(state)}")
        if tuple(w.shape) != (d_model, d_model) or (b is not None and tuple(b.shape) != (d_model,)):
            shape = "x".join(map(str, w.shape))
            raise ModelLoadError(f"--lens {params}: translator {i} is {shape}, the model's width needs "
                                 f"{d_model}x{d_model}")
        weights.append(w.float())
        biases.append(None if b is None else b.float())
    extra = _count(state) - layers
    if extra > 0:
        raise ModelLoadError(f"--lens {params}: {_count(state)} translators for a model of {layers} layer(s); it was "
                             "tuned for another model")
    return TunedLens(str(path), tuple(weights), tuple(biases), cfg)


def _count(state: dict[str, Any]) -> int:
    return len({k.split(".", 1)[0] for k in state if k.split(".", 1)[0].isdigit()})


def unembed_hash(weight: torch.Tensor) -> str:
    """tuned-lens's ``Unembed.unembedding_hash``: sha256 of numpy's text of the matrix at
    one decimal (a check that the lens was tuned on this unembedding)."""
    import hashlib

    import numpy as np

    text = np.array_str(weight.detach().cpu().float().numpy(), precision=1)
    return hashlib.sha256(text.encode()).hexdigest()


def save_tuned_lens(folder: str | os.PathLike[str], weights: list[Any], biases: list[Any], *, d_model: int,
                    name: str = "") -> Path:
    """Write a lens the way ``TunedLens.save`` does (for tests and users without the package)."""
    import torch

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    state = {}
    for i, (w, b) in enumerate(zip(weights, biases)):
        state[f"{i}.weight"] = w
        if b is not None:
            state[f"{i}.bias"] = b
    torch.save(state, out / "params.pt")
    cfg = {"base_model_name_or_path": name, "d_model": d_model, "num_hidden_layers": len(weights),
           "bias": biases[0] is not None if biases else True, "base_model_revision": None, "unembed_hash": None,
           "lens_type": "linear_tuned_lens"}
    (out / "config.json").write_text(json.dumps(cfg))
    return out
