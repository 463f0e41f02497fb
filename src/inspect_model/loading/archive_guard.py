"""Look inside a torch.export archive (``.pt2``) before torch's loader sees it (issue 13).

``torch.export.load`` unpickles some entries with ``weights_only=False``: a weights or
constants entry marked ``use_pickle`` in the archive's ``*_config.json``, ``opaque_obj_*``
constants (plain ``pickle.loads``), ``custom_obj_*`` constants, and any ``.pt`` entry (sample
inputs, legacy weights) that fails to load with ``weights_only=True`` (it falls back to full
unpickling). AOTInductor entries hold compiled native code. :func:`unsafe_entries` reads the
zip listing and the JSON configs only (nothing is unpickled, nothing imported but zipfile
and json; ``.pt`` entries are tried with ``weights_only=True``) and names every entry that
would run code; :func:`forbid_full_unpickling` is the second belt, turning any
``torch.load(weights_only=False)`` during the load into a refusal. :func:`check_sizes`
bounds what any torch file (checkpoint, model archive, inputs file) may inflate to in memory,
read from the zip's central directory before torch allocates a byte (issue 28).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from inspect_model.errors import InputError, ModelLoadError

_CODE_PREFIXES = {"data/aotinductor/": "AOTInductor compiled code", "data/executorch/": "an ExecuTorch program",
                  "data/mtia/": "an MTIA program"}
_MAX_CONFIG = 64 * 2**20  # a weights config larger than this is not one torch.export wrote


def _tail(name: str, root: str | None) -> str:
    return name[len(root) + 1:] if root and name.startswith(root + "/") else name


def _root(names: list[str]) -> str | None:
    """The folder every entry lies in (torch.export.save writes ``<stem>/...``), if any."""
    tops = {n.split("/", 1)[0] for n in names if "/" in n}
    if len(tops) == 1 and all("/" in n for n in names):
        return tops.pop()
    return None


def _loads_without_code(data: bytes, where: str) -> bool:
    """Whether a torch.save payload loads with ``weights_only=True`` (which runs no code)."""
    import pickle

    import torch

    check_sizes(data, what=where)  # a zip bomb nested in the archive is refused, not inflated
    try:
        torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, KeyError, TypeError,
            AttributeError, zipfile.BadZipFile):
        return False
    return True


def unsafe_entries(path: str) -> list[str]:
    """Every entry of the archive at ``path`` that torch would unpickle (or run), as
    ``'<entry>' (<why>)``. An empty list: the file loads without running code."""
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise ModelLoadError(f"model file '{path}' is a truncated or corrupt archive; save it again") from exc
    found: list[str] = []
    with zf:
        names = zf.namelist()
        root = _root(names)
        tails = {_tail(n, root): n for n in names}
        pickled: dict[str, str] = {}  # tail -> why, from the configs
        for tail, full in tails.items():
            kind = ("weights" if tail.startswith("data/weights/") and tail.endswith("_weights_config.json") else
                    "constants" if tail.startswith("data/constants/") and tail.endswith("_constants_config.json")
                    else None)
            if kind is None:
                continue
            if zf.getinfo(full).file_size > _MAX_CONFIG:
                found.append(f"'{tail}' (a config too large to check)")
                continue
            try:
                config = json.loads(zf.read(full)).get("config", {})
                items = list(config.items())
            except (ValueError, AttributeError, UnicodeDecodeError, RecursionError):
                found.append(f"'{tail}' (not a valid config)")
                continue
            folder = f"data/{kind}/"
            for fqn, meta in items:
                meta = meta if isinstance(meta, dict) else {}
                entry = folder + str(meta.get("path_name", ""))
                if meta.get("use_pickle"):
                    pickled[entry] = f"{kind[:-1]} '{fqn}' marked use_pickle"
                elif kind == "constants" and not str(meta.get("path_name", "")).startswith("tensor_"):
                    pickled[entry] = f"constant '{fqn}' is a pickled object"
        for tail in sorted(tails):
            full = tails[tail]
            if tail.endswith("/"):
                continue
            if tail in pickled:
                found.append(f"'{tail}' ({pickled[tail]})")
                continue
            code = next((why for p, why in _CODE_PREFIXES.items() if tail.startswith(p)), None)
            if code:
                found.append(f"'{tail}' ({code})")
            elif tail.startswith(("data/constants/custom_obj_", "data/constants/opaque_obj_")):
                found.append(f"'{tail}' (a pickled object)")
            elif tail.endswith((".pt", ".pkl")) and not _loads_without_code(
                    zf.read(full), f"exported program '{path}', entry '{tail}'"):
                found.append(f"'{tail}' (a pickle that needs full unpickling)")
    return found


def check_archive(path: str, *, trust: bool) -> None:
    """Refuse an exported program that would run code on loading, unless ``trust``."""
    if trust:
        return
    bad = unsafe_entries(path)
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise ModelLoadError(
            f"exported program '{path}' holds entries that would run code when loaded: {shown}; "
            "pass --trust-checkpoint only if you trust the file"
        )


@contextlib.contextmanager
def forbid_full_unpickling(path: str) -> Iterator[None]:
    """Within this context, ``torch.load(..., weights_only=False)`` raises instead of
    unpickling: the second belt around ``torch.export.load`` on an untrusted file."""
    import torch

    real = torch.load

    def guarded(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("weights_only") is False:
            raise ModelLoadError(
                f"exported program '{path}' holds a pickle that needs full unpickling, which could run "
                "code from the file; pass --trust-checkpoint only if you trust the file"
            )
        kwargs["weights_only"] = True
        return real(*args, **kwargs)

    torch.load = guarded  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.load = real  # type: ignore[assignment]


# ------------------------------------------------------------------ sizes (issue 28, item 4)
_SLACK = 64 * 2**20  # pickles, metadata, a little of everything: never the bulk of a file


@dataclass(frozen=True)
class SizeBudget:
    """How many bytes a file's records may inflate to: one record, and all of them together."""

    record: int
    total: int
    why: str  # what the budget is derived from, for the message

    @classmethod
    def for_model(cls, model: Any) -> SizeBudget:
        """What a checkpoint of ``model`` needs: every tensor at 8 bytes a value (a float64
        checkpoint of a float32 model), four copies in all (weights, two optimizer moments,
        an EMA), plus slack."""
        sizes = [int(t.numel()) * 8 for t in model.state_dict().values() if hasattr(t, "numel")]
        return cls(record=max(sizes, default=0) + _SLACK, total=4 * sum(sizes) + _SLACK,
                   why="what the model's tensors need")

    @classmethod
    def for_file(cls, path: str | bytes) -> SizeBudget:
        """Without a model to measure: four times the file's own size, plus slack."""
        size = len(path) if isinstance(path, bytes) else os.path.getsize(path)
        return cls(record=4 * size + _SLACK, total=4 * size + _SLACK, why="four times the file's size")


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def check_sizes(path: str | bytes, budget: SizeBudget | None = None, *, what: str = "file") -> None:
    """Refuse a zip archive (torch.save, TorchScript, .pt2) or a legacy torch pickle whose
    records would take more memory than ``budget`` allows, from the zip's central directory
    (or the pickle's storage declarations) alone, before torch allocates anything. Records
    stored uncompressed hold their bytes in the file and are only checked for consistency;
    compressed ones are bounded one by one and together (a 4 MiB file inflating to 4 GiB).
    ``path`` may be the file's bytes (an archive inside an archive)."""
    budget = budget or SizeBudget.for_file(path)
    if isinstance(path, bytes):
        head, source, where = path[:4], io.BytesIO(path), what
    else:
        with open(path, "rb") as fh:
            head = fh.read(4)
        source, where = path, f"{what} '{path}'"
    if head[:2] != b"PK":
        if head[:1] == b"\x80" and isinstance(path, str):
            _check_legacy(path, what)
        return
    try:
        with zipfile.ZipFile(source) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return  # the readers say "truncated or corrupt" in their own words
    inflated = 0
    for info in infos:
        if info.compress_type == zipfile.ZIP_STORED:
            if info.file_size != info.compress_size:
                raise InputError(f"{where}: record '{info.filename}' claims {info.file_size} bytes but "
                                 f"stores {info.compress_size}; the archive is corrupt or forged, and is not read")
            continue
        if info.file_size > budget.record:
            raise InputError(
                f"{where}: record '{info.filename}' would inflate from {_mib(info.compress_size)} to "
                f"{_mib(info.file_size)}, more than {budget.why} ({_mib(budget.record)}); refusing to read "
                "it (a zip bomb?)")
        inflated += info.file_size
    if inflated > budget.total:
        raise InputError(
            f"{where}: its compressed records would inflate to {_mib(inflated)}, more than {budget.why} "
            f"({_mib(budget.total)}); refusing to read it (a zip bomb?)")


MAX_PICKLE_BYTES = 32 * 2**20  # a state dict of 100,000 tensors pickles to ~15 MB; more is no checkpoint


def legacy_pickle_end(path: str, limit: int) -> int | None:
    """Where the pickles of a legacy torch.save file end (magic number, protocol, sys info,
    the object, its storage keys: five), scanned with pickletools within the first ``limit``
    bytes (nothing executed); None when they run past ``limit``. A file that is no such
    pickle gives the position where reading stopped (torch's own error will say what is wrong)."""
    import pickletools

    with open(path, "rb") as raw:
        data = raw.read(limit + 1)
    fh = io.BytesIO(data[:limit])
    try:
        for _ in range(5):
            for op, _arg, _pos in pickletools.genops(fh):
                if op.name == "STOP":
                    break
            else:
                break
    except (ValueError, EOFError, UnicodeDecodeError):
        if len(data) > limit and fh.tell() >= limit - 16:
            return None  # cut at the limit, not malformed
    return fh.tell()


# Bytes per value of the legacy storage classes (torch.FloatStorage ...); unknown: 8.
_ELEMENT = {"Double": 8, "Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
            "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16}


_SCALARS = {"GLOBAL", "STACK_GLOBAL", "BININT", "BININT1", "BININT2", "LONG1", "INT", "LONG", "SHORT_BINUNICODE",
            "BINUNICODE", "UNICODE"}


def _check_legacy(path: str, what: str) -> None:
    """A pre-1.6 torch.save file declares each storage's size in its pickle, and torch
    allocates it before reading the data that follows: the sizes must fit in the file."""
    size = os.path.getsize(path)
    declared = legacy_declared_bytes(path)
    if declared > size + _SLACK:
        raise InputError(f"{what} '{path}' declares {_mib(declared)} of tensors but the file holds "
                         f"{_mib(size)}; it is forged or corrupt, and is not read")


def legacy_declared_bytes(path: str) -> int:
    """The bytes of every storage a legacy torch.save file declares (its pickles read with
    pickletools, nothing executed); 0 for a file that is no such pickle."""
    import pickletools

    declared = 0
    with open(path, "rb") as raw:
        fh = io.BytesIO(raw.read(MAX_PICKLE_BYTES + 1))  # a longer pickle is refused by legacy_pickle_end
        try:
            for _ in range(4):  # magic number, protocol, sys info, then the object with its storages
                recent: list[Any] = []
                memo: dict[Any, Any] = {}
                for op, arg, _pos in pickletools.genops(fh):
                    if op.name in _SCALARS:
                        recent = (recent + [arg])[-6:]
                    elif op.name in ("BINPUT", "LONG_BINPUT", "PUT") and recent:
                        memo[arg] = recent[-1]
                    elif op.name in ("BINGET", "LONG_BINGET", "GET"):
                        recent = (recent + [memo.get(arg)])[-6:]
                    elif op.name in ("BINPERSID", "PERSID"):
                        declared += _storage_bytes(recent)
                        recent = []
                    if op.name == "STOP":
                        break
        except (ValueError, EOFError, UnicodeDecodeError):
            pass  # not a pickle torch can read either; its own error says so
    return declared


def _storage_bytes(recent: list[Any]) -> int:
    """Bytes of a ``('storage', <torch XStorage>, key, location, numel)`` persistent id, from
    the last scalars pickled before it (0 when it is not one)."""
    numel = recent[-1] if recent and isinstance(recent[-1], int) else None
    kind = next((str(a) for a in recent if isinstance(a, str) and "Storage" in str(a)), "")
    if numel is None or numel < 0:
        return 0
    name = kind.split()[-1].split(".")[-1].removesuffix("Storage") if kind else ""
    return numel * _ELEMENT.get(name, 8)
