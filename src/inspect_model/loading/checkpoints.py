"""Checkpoints: load weights into a model safely (``--checkpoint``, ``--trust-checkpoint``).

Files are read with ``torch.load(weights_only=True)``, which cannot run code; a file that
needs full unpickling (a whole pickled model, or one with arbitrary objects inside) is
refused with a message naming ``--trust-checkpoint``, the only way to allow it. The
state_dict is found whether it is bare or held under ``state_dict``, ``model_state_dict``,
``model`` or ``ema``; the ``module.`` prefix DataParallel/DDP leave (and ``_orig_mod.``
from ``torch.compile``) is stripped; missing, unexpected and mis-shaped keys are an error
that lists them, unless ``--non-strict`` (mis-shaped keys are always an error).
:func:`sniff` tells the kinds of files apart (torch.save archive, legacy pickle,
TorchScript, exported program, safetensors) without unpickling anything.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inspect_model.errors import ModelLoadError, one_line

if TYPE_CHECKING:
    from torch import nn

# Where training scripts keep the weights inside a checkpoint dict, in the order tried.
STATE_KEYS = ("state_dict", "model_state_dict", "model", "ema", "state_dict_ema", "model_ema", "module")
# Prefixes wrappers add to every key: DataParallel/DDP, torch.compile.
PREFIXES = ("module.", "_orig_mod.")

_SHOW = 5  # keys listed in an error before "(and N more)"


@dataclass
class CheckpointReport:
    """What :func:`load_checkpoint` did, for notes and reports."""

    path: str
    key: str | None = None  # where the state_dict was found ("model", "ema/module"), None if bare
    stripped: list[str] = field(default_factory=list)  # prefixes removed from the keys
    loaded: int = 0  # tensors copied into the model
    missing: list[str] = field(default_factory=list)  # ignored with --non-strict
    unexpected: list[str] = field(default_factory=list)  # ignored with --non-strict
    trusted: bool = False  # loaded with full unpickling (--trust-checkpoint)
    cast: list[str] = field(default_factory=list)  # "key (int64 -> float32)": copied with a dtype change

    def note(self) -> str:
        parts = [f"weights from checkpoint {self.path}"]
        if self.key:
            parts.append(f"under '{self.key}'")
        if self.stripped:
            parts.append("(" + ", ".join(f"'{p}'" for p in self.stripped) + " prefix stripped)")
        text = " ".join(parts) + f": {self.loaded} tensors"
        if self.missing or self.unexpected:
            text += (f"; --non-strict ignored {len(self.missing)} missing and "
                     f"{len(self.unexpected)} unexpected keys")
        if self.cast:
            text += f"; {len(self.cast)} tensors cast to the model's dtype: {_listing(self.cast)}"
        return text


# ------------------------------------------------------------------ file kinds
def sniff(path: str) -> str:
    """The kind of file at ``path``, read from its bytes only (nothing is unpickled):
    ``torch`` (torch.save archive), ``legacy`` (pre-1.6 torch.save pickle), ``torchscript``,
    ``export`` (torch.export .pt2), ``safetensors``, ``empty``, ``corrupt-zip`` or ``unknown``."""
    with open(path, "rb") as fh:
        head = fh.read(16)
    if not head:
        return "empty"
    if head.startswith(b"PK"):
        try:
            with zipfile.ZipFile(path) as zf:
                names = zf.namelist()
        except (zipfile.BadZipFile, OSError, ValueError):
            return "corrupt-zip"
        tails = {n.split("/", 1)[1] if "/" in n else n for n in names}
        if "constants.pkl" in tails and any(t.startswith("code/") for t in tails):
            return "torchscript"
        if "archive_format" in tails or any(t.startswith("models/") and t.endswith(".json") for t in tails):
            return "export"
        if "data.pkl" in tails:
            return "torch"
        return "unknown"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "legacy"
    if len(head) >= 9 and head[8:9] == b"{":
        # safetensors: an 8-byte little-endian header length, then a JSON header.
        size = int.from_bytes(head[:8], "little")
        if 0 < size < os.path.getsize(path):
            return "safetensors"
    return "unknown"


def _check_file(path: str, what: str = "checkpoint") -> None:
    if not os.path.exists(path):
        raise ModelLoadError(f"{what} '{path}' does not exist")
    if os.path.isdir(path):
        raise ModelLoadError(f"{what} '{path}' is a directory, not a file")
    if not os.path.isfile(path):
        from inspect_model.loading.parsing import NOT_REGULAR

        raise ModelLoadError(f"{what} '{path}' {NOT_REGULAR}")
    if not os.access(path, os.R_OK):
        raise ModelLoadError(f"{what} '{path}' is not readable (permission denied)")


def read_checkpoint(path: str, *, device: str = "cpu", trust: bool = False, what: str = "checkpoint",
                    budget: Any = None) -> Any:
    """``torch.load`` the file with ``weights_only=True`` (or fully, with ``trust``), turning
    every failure into a one-line :class:`ModelLoadError`. First the file's records are held
    to ``budget`` (an :class:`~inspect_model.loading.archive_guard.SizeBudget`; default: from
    the file's size), so that a zip bomb is refused before torch inflates it (exit 4)."""
    import pickle

    import torch

    _check_file(path)
    kind = sniff(path)
    if kind == "empty":
        raise ModelLoadError(f"checkpoint '{path}' is an empty file")
    if kind == "corrupt-zip":
        raise ModelLoadError(
            f"checkpoint '{path}' is a truncated or corrupt archive; download or save it again"
        )
    if kind == "torchscript":
        raise ModelLoadError(
            f"'{path}' is a TorchScript model, not a checkpoint; give it as the MODEL argument instead"
        )
    if kind == "export":
        raise ModelLoadError(
            f"'{path}' is a torch.export program, not a checkpoint; give it as the MODEL argument instead"
        )
    if kind == "safetensors":
        return _read_safetensors(path, device)
    if kind == "unknown":
        raise ModelLoadError(
            f"checkpoint '{path}' is not a PyTorch file (not a torch.save archive, a legacy "
            "pickle or safetensors); pass the file written by torch.save(model.state_dict(), ...)"
        )
    from inspect_model.loading.torch_files import load_torch

    map_location = "cpu" if device == "meta" else device
    try:
        # A zip archive is memory-mapped: its tensors are paged in as they are copied into
        # the model (already in --dtype), never held whole beside it (issue 37).
        return load_torch(path, what, budget=budget, map_location=map_location, trust=trust, mmap=kind == "torch")
    except pickle.UnpicklingError as exc:
        if "weights only load failed" in str(exc).lower():
            fix = ("save model.state_dict() instead, or " if what == "checkpoint" else "")
            raise ModelLoadError(
                f"{what} '{path}' holds Python objects{_unsupported_global(str(exc))}, not just "
                "tensors (a whole pickled model?), and unpickling it could run code from the file; "
                f"{fix}pass --trust-checkpoint if you trust the file"
            ) from exc
        raise ModelLoadError(f"{what} '{path}' cannot be read: {_reason(exc)}") from exc
    except (EOFError, RuntimeError, KeyError, ValueError, OSError, zipfile.BadZipFile) as exc:
        raise ModelLoadError(f"{what} '{path}' cannot be read: {_reason(exc)}") from exc
    except (AttributeError, ModuleNotFoundError, ImportError) as exc:
        # Only with --trust-checkpoint: the pickled class is not importable here.
        raise ModelLoadError(
            f"checkpoint '{path}' refers to Python code that cannot be imported here "
            f"({_first_line(exc)}); make that module importable (PYTHONPATH), or save a state_dict"
        ) from exc


def _read_safetensors(path: str, device: str) -> Any:
    try:
        from safetensors.torch import load_file
    except ImportError as exc:
        raise ModelLoadError(
            f"checkpoint '{path}' is a safetensors file; install the `safetensors` package to read it"
        ) from exc
    try:
        return load_file(path, device="cpu" if device == "meta" else device)
    except Exception as exc:
        raise ModelLoadError(f"safetensors checkpoint '{path}' cannot be read: {_first_line(exc)}") from exc


def _reason(exc: BaseException) -> str:
    text = _first_line(exc)
    low = text.lower()
    if isinstance(exc, EOFError) or any(
        w in low for w in ("truncated", "unexpected eof", "corrupt", "central directory", "zip archive")
    ):
        return "the file is truncated or corrupt; download or save it again"
    return text or type(exc).__name__


def _unsupported_global(text: str) -> str:
    import re

    m = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    return f" ({m.group(1)})" if m else ""


def _first_line(exc: BaseException) -> str:
    return one_line(str(exc))


# ------------------------------------------------------------------ state dicts
def _is_state_dict(obj: Any) -> bool:
    import torch

    return (
        isinstance(obj, Mapping)
        and len(obj) > 0
        and all(isinstance(k, str) for k in obj)
        and all(isinstance(v, torch.Tensor) for v in obj.values())
    )


def extract_state_dict(obj: Any, path: str = "checkpoint") -> tuple[dict[str, Any], str | None]:
    """The state_dict inside a loaded checkpoint and the key path it was found under."""
    from torch import nn

    if isinstance(obj, nn.Module):
        return dict(obj.state_dict()), "(whole model)"
    if _is_state_dict(obj):
        return dict(obj), None
    if isinstance(obj, Mapping):
        for key in STATE_KEYS:
            if key not in obj:
                continue
            inner = obj[key]
            if isinstance(inner, nn.Module):
                return dict(inner.state_dict()), key
            if _is_state_dict(inner):
                return dict(inner), key
            if isinstance(inner, Mapping):
                try:
                    sd, sub = extract_state_dict(inner, path)
                except ModelLoadError:
                    continue
                return sd, f"{key}/{sub}" if sub else key
        if not obj:
            raise ModelLoadError(f"checkpoint '{path}' is an empty dict: it holds no weights")
        keys = ", ".join(repr(k) for k in list(obj)[:8])
        raise ModelLoadError(
            f"checkpoint '{path}' holds no state_dict: a dict with keys {keys}, none of which is "
            f"a tensor mapping (looked for {', '.join(STATE_KEYS[:4])})"
        )
    raise ModelLoadError(
        f"checkpoint '{path}' holds a {type(obj).__name__}, not a state_dict; "
        "save it with torch.save(model.state_dict(), PATH)"
    )


def strip_prefixes(sd: dict[str, Any], model_keys: set[str]) -> tuple[dict[str, Any], list[str]]:
    """Remove wrapper prefixes that every key has but the model's keys lack."""
    stripped: list[str] = []
    changed = True
    while changed:
        changed = False
        for prefix in PREFIXES:
            if sd and all(k.startswith(prefix) for k in sd) and not any(k.startswith(prefix) for k in model_keys):
                sd = {k[len(prefix):]: v for k, v in sd.items()}
                stripped.append(prefix)
                changed = True
    return sd, stripped


def _head_hint(own: dict[str, Any], sd: dict[str, Any]) -> str:
    """The fix for a mismatch: a classifier fine-tuned to another class count (only the last
    layer's rows differ) needs ``--model-arg num_classes=N``; else the model's arguments."""
    last = [k for k in own if own[k].dim() >= 1 and k in sd]
    diff = [k for k in last if tuple(sd[k].shape) != tuple(own[k].shape)]
    head = last[-2:] if len(last) >= 2 else last
    if diff and set(diff) <= set(head) and all(sd[k].shape[1:] == own[k].shape[1:] for k in diff):
        n = int(sd[diff[0]].shape[0])
        return (f"the checkpoint's classifier has {n} outputs: pass --model-arg num_classes={n} "
                "(with --weights none for a torchvision name)")
    return "check the model's --model-arg values"


def _listing(keys: list[str]) -> str:
    shown = ", ".join(keys[:_SHOW])
    more = len(keys) - _SHOW
    return shown + (f" (and {more} more)" if more > 0 else "")


def load_checkpoint(
    model: nn.Module,
    path: str,
    *,
    device: str = "cpu",
    strict: bool = True,
    trust: bool = False,
) -> CheckpointReport:
    """Load the weights in ``path`` into ``model`` (in place) and say what was done."""
    from inspect_model.loading.archive_guard import SizeBudget

    path = str(path)
    obj = read_checkpoint(path, device=device, trust=trust, budget=SizeBudget.for_model(model))
    sd, key = extract_state_dict(obj, path)
    sd, report = match_state_dict(model.state_dict(), sd, path, key=key, strict=strict, trust=trust)
    try:
        model.load_state_dict(sd, strict=False)
    except Exception as exc:  # dtype that cannot be copied, a TorchScript quirk...
        raise ModelLoadError(f"checkpoint '{path}' could not be loaded into the model: {_first_line(exc)}") from exc
    return report


def match_state_dict(own: Mapping[str, Any], sd: dict[str, Any], path: str, *, key: str | None, strict: bool,
                     trust: bool) -> tuple[dict[str, Any], CheckpointReport]:
    """``sd`` with wrapper prefixes stripped, checked against the model's ``own`` state dict
    (its tensors may be on the meta device: only names, shapes and dtypes are read)."""
    model_keys = set(own)
    sd, stripped = strip_prefixes(sd, model_keys)
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in model_keys]
    if not model_keys & set(sd):
        raise ModelLoadError(
            f"checkpoint '{path}' shares no key with the model (checkpoint has {_listing(sorted(sd))}; "
            f"the model has {_listing(list(own))}); is it for another model?"
        )
    mismatched = [
        f"{k} {tuple(sd[k].shape)} vs {tuple(own[k].shape)}"
        for k in own
        if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)
    ]
    if mismatched:
        raise ModelLoadError(
            f"checkpoint '{path}' does not fit the model: shape mismatch (checkpoint vs model) for "
            f"{_listing(mismatched)}; {_head_hint(own, sd)}"
        )
    if strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing keys: {_listing(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected keys: {_listing(unexpected)}")
        raise ModelLoadError(
            f"checkpoint '{path}' does not match the model: {'; '.join(parts)}; "
            "pass --non-strict to load the keys that match"
        )
    cast = [
        f"{k} ({str(sd[k].dtype).replace('torch.', '')} -> {str(own[k].dtype).replace('torch.', '')})"
        for k in own
        if k in sd and sd[k].dtype != own[k].dtype and (sd[k].dtype.is_floating_point != own[k].dtype.is_floating_point)
    ]
    report = CheckpointReport(path=path, key=key, stripped=stripped, loaded=len([k for k in sd if k in model_keys]),
                              missing=missing, unexpected=unexpected, trusted=trust, cast=cast)
    return sd, report
