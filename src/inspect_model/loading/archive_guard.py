"""Look inside a torch.export archive (``.pt2``) before torch's loader sees it (issue 13).

``torch.export.load`` unpickles some entries with ``weights_only=False``: a weights or
constants entry marked ``use_pickle`` in the archive's ``*_config.json``, ``opaque_obj_*``
constants (plain ``pickle.loads``), ``custom_obj_*`` constants, and any ``.pt`` entry (sample
inputs, legacy weights) that fails to load with ``weights_only=True`` (it falls back to full
unpickling). AOTInductor entries hold compiled native code. :func:`unsafe_entries` reads the
zip listing and the JSON configs only (nothing is unpickled, nothing imported but zipfile
and json; ``.pt`` entries are tried with ``weights_only=True``) and names every entry that
would run code; :func:`forbid_full_unpickling` is the second belt, turning any
``torch.load(weights_only=False)`` during the load into a refusal.
"""

from __future__ import annotations

import contextlib
import io
import json
import zipfile
from collections.abc import Iterator
from typing import Any

from inspect_model.errors import ModelLoadError

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


def _loads_without_code(data: bytes) -> bool:
    """Whether a torch.save payload loads with ``weights_only=True`` (which runs no code)."""
    import pickle

    import torch

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
            except (ValueError, AttributeError, UnicodeDecodeError):
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
            elif tail.endswith((".pt", ".pkl")) and not _loads_without_code(zf.read(full)):
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
