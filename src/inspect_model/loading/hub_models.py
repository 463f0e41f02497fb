"""What timm and Hugging Face models share: optional imports, the hub cache, offline rules,
and reading weight files without unpickling anything.

``timm:NAME`` is built by :mod:`inspect_model.loading.sources.timm`, ``hf:ORG/NAME`` and
``save_pretrained`` directories by :mod:`inspect_model.loading.sources.hf`; both find their
weights here. A file already in the cache is used without touching the network
(``try_to_load_from_cache``); a missing one is downloaded only when no offline switch
(``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE``, ``INSPECT_MODEL_OFFLINE``) is set, and
otherwise is a one-line error naming the cache and the alternatives (exit 3).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterator
from typing import Any

from inspect_model.errors import ModelLoadError, one_line

INSTALL_HINTS = {
    "timm": 'timm is not installed; `pip install "inspect-model[timm]"` (or `pip install timm`) to load timm:NAME models',
    "transformers": (
        'transformers is not installed; `pip install "inspect-model[hf]"` (or `pip install transformers`) '
        "to load hf:ORG/NAME models and save_pretrained directories"
    ),
    "huggingface_hub": (
        'huggingface_hub is not installed; `pip install "inspect-model[timm]"` (or `pip install huggingface_hub`) '
        "to download timm and Hugging Face weights"
    ),
    "safetensors": 'safetensors is not installed; `pip install "inspect-model[timm]"` (or `pip install safetensors`)',
}

_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "INSPECT_MODEL_OFFLINE")


def require(package: str) -> Any:
    """Import an optional dependency, or raise a one-line install hint (exit 3)."""
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError as exc:
        raise ModelLoadError(INSTALL_HINTS.get(package, f"{package} is not installed; pip install {package}")) from exc


def offline() -> str | None:
    """The name of the offline switch that is set, or None."""
    from inspect_model.settings import env_flag

    for var in _OFFLINE_VARS:  # ours strictly; Hugging Face's own as huggingface_hub reads them
        if env_flag(var, strict=var.startswith("INSPECT_MODEL_")):
            return var
    return None


def hub_cache_dir() -> str:
    """The Hugging Face hub cache, read from the environment at call time (HF_HUB_CACHE,
    else HF_HOME/hub, else ~/.cache/huggingface/hub), as huggingface_hub resolves it."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return os.path.expanduser(explicit)
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"
    )
    return os.path.join(os.path.expanduser(home), "hub")


def split_revision(repo: str) -> tuple[str, str | None]:
    """``'timm/x@v1'`` -> ``('timm/x', 'v1')``."""
    if "@" in repo:
        name, rev = repo.split("@", 1)
        return name, rev or None
    return repo, None


def cached_file(repo: str, filename: str) -> str | None:
    """The path of ``filename`` of hub repo ``repo`` if the cache holds it (no network)."""
    hub = require("huggingface_hub")
    name, rev = split_revision(repo)
    found = hub.try_to_load_from_cache(name, filename, cache_dir=hub_cache_dir(), revision=rev)
    return found if isinstance(found, str) else None


def missing_message(what: str, where: str, reason: str, *, alternatives: str | None = None) -> str:
    return (
        f"{what}: not in the cache {where}, and the download failed ({reason}); "
        + (alternatives or "run with --weights none (random weights), fetch it once with network access "
           "(HF_HOME/HF_HUB_CACHE and TORCH_HOME choose the caches; unset HF_HUB_OFFLINE), or pass --checkpoint FILE")
    )


def hub_file(repo: str, filenames: list[str], *, what: str, required: bool = True,
             alternatives: str | None = None) -> str | None:
    """The first of ``filenames`` that repo ``repo`` has, from the cache or else downloaded.

    The cache is tried first for every name, so cached weights never touch the network."""
    for fn in filenames:
        path = cached_file(repo, fn)
        if path:
            return path
    cache = hub_cache_dir()
    switch = offline()
    if switch:
        if not required:
            return None
        raise ModelLoadError(missing_message(what, cache, f"{switch} is set", alternatives=alternatives))
    hub = require("huggingface_hub")
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    unreachable = _unreachable()
    if unreachable:
        if not required:
            return None
        raise ModelLoadError(missing_message(what, cache, unreachable, alternatives=alternatives))
    name, rev = split_revision(repo)
    last: BaseException | None = None
    for fn in filenames:
        try:
            return str(hub.hf_hub_download(name, fn, revision=rev, cache_dir=cache, etag_timeout=10))
        except LocalEntryNotFoundError as exc:  # the network went away
            if not required:
                return None
            raise ModelLoadError(missing_message(what, cache, short_reason(exc), alternatives=alternatives)) from exc
        except EntryNotFoundError as exc:
            last = exc
            continue
        except Exception as exc:  # no network, unknown repo, gated repo, ...
            if not required:
                return None
            raise ModelLoadError(missing_message(what, cache, short_reason(exc), alternatives=alternatives)) from exc
    if not required:
        return None
    raise ModelLoadError(f"{what}: repo {repo} has none of {', '.join(filenames)}"
                         + (f" ({short_reason(last)})" if last else ""))


def _unreachable() -> str | None:
    """Why the hub's endpoint cannot be reached, or None. huggingface_hub retries a failed
    connection five times with back-off (about 25 s per file); one quick probe instead
    makes a machine without network fail at once."""
    import socket
    from urllib.parse import urlparse

    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    url = urlparse(endpoint)
    try:
        socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=5).close()
    except OSError as exc:
        return f"cannot reach {url.hostname}: {short_reason(exc)}"
    return None


def read_state_dict(path: str) -> dict[str, Any]:
    """A state dict from ``path`` without unpickling code: safetensors, or ``torch.load``
    with ``weights_only=True`` (a file that needs more is refused, never run)."""
    import pickle

    import torch

    from inspect_model.loading.torch_files import check_regular

    check_regular(path, "weights file")  # a pipe or device in the cache never reaches a loader (issue 41)
    if path.endswith(".safetensors"):
        st = require("safetensors.torch")
        try:
            return dict(st.load_file(path, device="cpu"))
        except Exception as exc:
            raise ModelLoadError(f"weights file {path} is unreadable ({short_reason(exc)}); delete it to "
                                 "download again, or run with --weights none") from exc
    if path.endswith(".npz"):
        raise ModelLoadError(f"weights file {path} is a NumPy archive that only timm's own loader reads; "
                             "choose a tag with safetensors weights, or run with --weights none")
    from inspect_model.errors import InspectModelError
    from inspect_model.loading.torch_files import load_torch

    try:
        sd = load_torch(path, "weights file")
    except InspectModelError:
        raise
    except pickle.UnpicklingError as exc:
        raise ModelLoadError(f"weights file {path} holds more than tensors and is not unpickled "
                             "(weights_only=True); convert it to safetensors, or run with --weights none") from exc
    except Exception as exc:
        raise ModelLoadError(f"weights file {path} is unreadable ({short_reason(exc)}); delete it to "
                             "download again, or run with --weights none") from exc
    for key in ("state_dict_ema", "model_ema", "state_dict", "model"):
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
            break
    if not isinstance(sd, dict):
        raise ModelLoadError(f"weights file {path} does not hold a state dict ({type(sd).__name__})")
    return sd


def short_reason(exc: BaseException) -> str:
    return one_line(exc)


# --quiet for the hub libraries: set by the CLI for a run (hub_quiet), read while loading.
_QUIET: contextvars.ContextVar[bool] = contextvars.ContextVar("inspect_model_hub_quiet", default=False)


@contextlib.contextmanager
def hub_quiet(on: bool = True) -> Iterator[None]:
    """Within this context, :func:`quiet_hub_logs` silences the hub libraries (``--quiet``)."""
    token = _QUIET.set(on)
    try:
        yield
    finally:
        _QUIET.reset(token)


@contextlib.contextmanager
def quiet_hub_logs() -> Iterator[None]:
    """No progress bars ("Loading weights", downloads) under ``--quiet`` (:func:`hub_quiet`) or
    when stderr is not a terminal (README: progress only on a terminal; issue 39), and under
    ``--quiet`` no info or warnings from transformers, huggingface_hub and timm while
    loading; their settings are put back afterwards. Only libraries already imported are touched."""
    import sys

    quiet = _QUIET.get()
    try:
        bars = not quiet and sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream: no bars
        bars = False
    if not quiet and bars:
        yield
        return
    import logging

    undo: list[Callable[[], None]] = []
    hub_utils = sys.modules.get("huggingface_hub.utils")
    if hub_utils is not None and hasattr(hub_utils, "disable_progress_bars") \
            and not hub_utils.are_progress_bars_disabled():
        hub_utils.disable_progress_bars()
        undo.append(hub_utils.enable_progress_bars)
    if "transformers" in sys.modules:
        from transformers.utils import logging as tf_logging

        if tf_logging.is_progress_bar_enabled():
            tf_logging.disable_progress_bar()
            undo.append(tf_logging.enable_progress_bar)
        if quiet:
            level = tf_logging.get_verbosity()
            tf_logging.set_verbosity_error()
            undo.append(lambda: tf_logging.set_verbosity(level))
    for name in ("timm", "huggingface_hub") if quiet else ():
        logger = logging.getLogger(name)
        old = logger.level
        logger.setLevel(logging.ERROR)
        undo.append(lambda lg=logger, lv=old: lg.setLevel(lv))  # type: ignore[misc]
    try:
        yield
    finally:
        for fn in reversed(undo):
            fn()
