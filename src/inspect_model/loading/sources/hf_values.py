"""Every value read from a Hugging Face model folder, checked before it is used (issue 41).

A model folder is data the user did not write: ``preprocessor_config.json`` may hold a
string size, an unknown resample code, a scalar mean or a zero std; ``config.json`` a
non-integer ``num_channels``; a sharded index a shard path that leaves the folder
(``../outside.safetensors``). Each is a :class:`ModelLoadError` (exit 3) that names the file
and the key, never an "unexpected" error later or a read outside the folder the user named.
"""

from __future__ import annotations

import math
import os
from typing import Any

from inspect_model.errors import ModelLoadError

MAX_SIDE = 65_536  # pixels a side: a size in a processor config beyond it is no model's


class Values:
    """Typed reads of one JSON document (``where`` names its file in messages)."""

    def __init__(self, doc: Any, where: str) -> None:
        if not isinstance(doc, dict):
            raise ModelLoadError(f"{where} is not a JSON object; save the model again with save_pretrained")
        self.doc, self.where = doc, where

    def bad(self, key: str, expected: str) -> ModelLoadError:
        value = repr(self.doc.get(key))
        shown = value if len(value) <= 60 else value[:57] + "..."
        return ModelLoadError(f"{self.where}: key '{key}' is {shown}, not {expected}; fix the file or save "
                              "the model again with save_pretrained")

    def flag(self, key: str, default: bool) -> bool:
        value = self.doc.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.bad(key, "true or false")
        return value

    def side(self, key: str, value: Any) -> int:
        """A size in pixels, 1..MAX_SIDE (``key`` names where it sits, ``size.height``)."""
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIDE:
            raise ModelLoadError(f"{self.where}: key '{key}' is {str(value)[:40]!r}, not a whole number of "
                                 f"pixels from 1 to {MAX_SIDE:,}; fix the file or save the model again")
        return value

    def sizes(self, key: str) -> dict[str, int] | None:
        """``size``/``crop_size``: an int (shortest edge, or a square crop) or an object of sides."""
        value = self.doc.get(key)
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return {"shortest_edge": self.side(key, value)}
        if not isinstance(value, dict) or not value:
            raise self.bad(key, "a number of pixels or an object such as {\"height\": 224, \"width\": 224}")
        known = {"shortest_edge", "longest_edge", "height", "width"}
        out = {k: self.side(f"{key}.{k}", v) for k, v in value.items() if k in known}
        if not out or ("height" in out) != ("width" in out) and "shortest_edge" not in out:
            raise self.bad(key, "an object with shortest_edge, or height and width")
        return out

    def numbers(self, key: str, *, positive: bool = False) -> tuple[float, ...] | None:
        """A list of 1 to 4 finite numbers (``image_mean``, ``image_std``), each > 0 with ``positive``."""
        value = self.doc.get(key)
        if value is None:
            return None
        ok = isinstance(value, list) and 1 <= len(value) <= 4 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
        if ok and positive:
            ok = all(v > 0 for v in value)
        if not ok:
            need = "a list of 1 to 4 numbers" + (" above 0" if positive else "")
            raise self.bad(key, f"{need}, one per channel (such as [0.5, 0.5, 0.5])")
        return tuple(float(v) for v in value)

    def number(self, key: str, low: float, high: float) -> float | None:
        value = self.doc.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and low < value <= high):
            raise self.bad(key, f"a number above {low:g} and at most {high:g}")
        return float(value)

    def choice(self, key: str, choices: dict[int, str], default: int) -> str:
        value = self.doc.get(key, default)
        if value is None:
            value = default
        if isinstance(value, bool) or not isinstance(value, int) or value not in choices:
            names = ", ".join(f"{k} ({v})" for k, v in choices.items())
            raise self.bad(key, f"one of PIL's resampling codes {names}")
        return choices[value]


def check_model_config(folder: str) -> None:
    """The values of ``config.json`` the tool reads itself (num_channels, image_size,
    vocab_size, max_position_embeddings, num_labels): whole numbers in range, read from
    the file before transformers builds a config of them (its own checks end in a cut-off line)."""
    from inspect_model.loading.parsing import load_json

    path = os.path.join(folder, "config.json")
    where = f"config file '{path}'"
    config = load_json(path, what="config file", error=ModelLoadError)
    if not isinstance(config, dict):
        raise ModelLoadError(f"{where} is not a JSON object; save the model again with save_pretrained")
    checks = {"num_channels": (1, 64), "vocab_size": (1, 1 << 24), "max_position_embeddings": (1, 1 << 24),
              "num_labels": (1, 1 << 24)}
    for key, (low, high) in checks.items():
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ModelLoadError(f"{where}: key '{key}' is {str(value)[:40]!r}, not a whole number from {low} to "
                                 f"{high:,}; fix the file or save the model again with save_pretrained")
    image = config.get("image_size")
    values = image if isinstance(image, (list, tuple)) else [image] if image is not None else []
    if image is not None and (not values or len(values) > 3 or not all(
            isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_SIDE for v in values)):
        raise ModelLoadError(f"{where}: key 'image_size' is {str(image)[:40]!r}, not a number of pixels from 1 "
                             f"to {MAX_SIDE:,} (or a list of them); fix the file or save the model again")


def shard_names(index: Any, where: str) -> list[str]:
    """The shard files a ``model.safetensors.index.json`` names: relative paths of files in the
    model's folder, never above it (``../outside.safetensors``), never absolute."""
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelLoadError(f"{where}: key 'weight_map' is not an object of tensor names to shard files; "
                             "save the model again with save_pretrained")
    if not all(isinstance(v, str) and v for v in weight_map.values()):
        raise ModelLoadError(f"{where}: key 'weight_map' names shards that are not file names")
    names = sorted(set(weight_map.values()))
    for name in names:
        parts = name.replace("\\", "/").split("/")
        if os.path.isabs(name) or ".." in parts or name.startswith("~") or "\0" in name:
            raise ModelLoadError(f"{where}: key 'weight_map' names the shard '{name[:80]}', which lies outside "
                                 "the model's folder; it is not read")
    return names


def check_local_shards(folder: str) -> None:
    """A local folder's sharded index: every shard inside the folder (links resolved), a file."""
    from inspect_model.loading.parsing import load_json

    index_path = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.isfile(index_path):
        return
    where = f"weights index '{index_path}'"
    names = shard_names(load_json(index_path, what="weights index", error=ModelLoadError), where)
    root = os.path.realpath(folder)
    for name in names:
        real = os.path.realpath(os.path.join(folder, name))
        if os.path.commonpath([root, real]) != root:
            raise ModelLoadError(f"{where}: key 'weight_map' names the shard '{name[:80]}', which lies outside "
                                 "the model's folder (through a link); it is not read")
        if not os.path.isfile(real):
            raise ModelLoadError(f"{where}: key 'weight_map' names the shard '{name[:80]}', which is not a file "
                                 "in the model's folder")
