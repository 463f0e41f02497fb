"""What the ``file`` and ``module`` sources share: running a user's code to get a model.

``FILE.py:NAME`` and ``package.module:NAME`` (:mod:`~inspect_model.loading.sources.user_code`).
``NAME`` may be an ``nn.Module`` instance, an ``nn.Module`` class or a function returning a
module (dotted for nested attributes: ``zoo.py:Builders.small``); ``--model-arg`` values are
passed to the class or function.
Loading ``FILE.py`` runs that file, as ``python FILE.py`` would (but with ``__name__`` not
``"__main__"``), so only load files you trust.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from typing import TYPE_CHECKING, Any

from inspect_model.devices import model_device
from inspect_model.errors import ModelLoadError, suggest
from inspect_model.loading.loaded import LoadedModel, brief, from_module

if TYPE_CHECKING:
    from torch import nn


def spec_kind(spec: str) -> str:
    """``file`` (a .py file), ``module`` (an importable module) or ``archive`` (a saved
    model file); never raises."""
    if ":" in spec:
        left, right = spec.rsplit(":", 1)
        # `C:\models\net.pt` (a Windows drive) has no attribute part.
        if len(left) == 1 and left.isalpha() and right.startswith(("\\", "/")):
            return "archive"
        if left.endswith(".py") or os.sep in left or "/" in left or os.path.isfile(left):
            return "file"
        return "module"
    return "file" if spec.endswith(".py") else "archive"


def parse_spec(spec: str) -> tuple[str, str, str | None]:
    """``(kind, where, attr)`` of :func:`spec_kind`; an empty attribute is an error."""
    kind = spec_kind(spec)
    if kind == "archive" or ":" not in spec:
        return kind, spec, None
    left, right = spec.rsplit(":", 1)
    if not right:
        raise ModelLoadError(f"model spec '{spec}' names no attribute after ':'; e.g. {left}:MyNet")
    return kind, left, right


def load_user_model(spec: str, *, device: str = "cpu", model_args: dict[str, Any] | None = None,
                    empty: bool = False, check: Any = None) -> LoadedModel:
    """Run the user's file or module and build the model ``spec`` names (see module docstring).
    ``empty``: built within accelerate's ``init_empty_weights`` (parameters on the meta
    device, issue 37), so left where it is."""
    kind, where, attr = parse_spec(spec)
    model_args = dict(model_args or {})
    module = import_file(where) if kind == "file" else import_module(where)
    origin = os.path.basename(where) if kind == "file" else where
    if attr is None:
        names = model_names(module)
        raise ModelLoadError(
            f"'{where}' needs the name of a model after ':', e.g. {where}:{names[0] if names else 'MyNet'}"
            + (f"; models in it: {', '.join(names[:8])}" if names else "")
        )
    obj = resolve_attr(module, attr, where)
    if check is not None and not empty and inspect.isclass(obj) and _is_module_class(obj):
        _preflight_class(obj, attr, where, model_args, origin, check)
    model = build(obj, attr, where, model_args, device)
    from inspect_model.loading.limits import check_module_depth

    check_module_depth(model, f"{where}:{attr}")  # before torch's recursive walks (issue 41)
    borrowed = model is obj  # the user's own instance, used as it is
    if borrowed and not empty and device != "meta" and model_device(model) not in (None, device):
        # Never move the user's object to another device (issue 9): run on a copy.
        model = private_copy(model, f"{where}:{attr}")
        borrowed = False
    # Titled by file (or module) and attribute, as the user named it: "my_net.py:build" (issue 29).
    loaded = from_module(model, name=f"{origin}:{attr}", source="python", device="meta" if empty else device)
    loaded.borrowed = borrowed
    return loaded


def _preflight_class(obj: Any, attr: str, where: str, model_args: dict[str, Any], origin: str, check: Any) -> None:
    """``check`` the class built on the meta device (nothing allocated): a model too large is
    refused before its real build. A class that cannot be built on meta is left to that build."""
    try:
        meta = build(obj, attr, where, model_args, "meta")
    except Exception:  # noqa: BLE001 - its real build reports what is wrong
        return
    check(meta, f"{origin}:{attr}")


def private_copy(model: nn.Module, label: str) -> nn.Module:
    """A deep copy of a user's model instance, to change (device, dtype, weights) freely."""
    import copy

    try:
        return copy.deepcopy(model)
    except Exception as exc:
        raise ModelLoadError(
            f"cannot copy the model instance {label} ({brief(exc)}), so it cannot be moved, cast or "
            "given a checkpoint without changing your object; give its class or a factory function instead"
        ) from exc


# ------------------------------------------------------------------ importing
def import_file(path: str) -> Any:
    """Run ``path`` as a fresh module (its folder importable for sibling imports)."""
    if not os.path.exists(path):
        raise ModelLoadError(f"model file '{path}' does not exist")
    if os.path.isdir(path):
        raise ModelLoadError(f"model file '{path}' is a directory; give FILE.py:NAME")
    if not os.path.isfile(path):
        from inspect_model.loading.parsing import NOT_REGULAR

        raise ModelLoadError(f"model file '{path}' {NOT_REGULAR}")
    if not path.endswith(".py"):
        raise ModelLoadError(f"model file '{path}' is not a .py file; give FILE.py:NAME")
    full = os.path.abspath(path)
    stem = os.path.splitext(os.path.basename(full))[0]
    modname = f"inspect_model_user.{stem}_{abs(hash(full)) & 0xFFFFFF:06x}"
    spec = importlib.util.spec_from_file_location(modname, full)
    if spec is None or spec.loader is None:  # pragma: no cover - .py files always have a loader
        raise ModelLoadError(f"model file '{path}' cannot be imported")
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(full)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    # Registered so that dataclasses, pickling and typing inside the file can find it.
    sys.modules[modname] = module
    try:
        spec.loader.exec_module(module)
    except SystemExit as exc:
        sys.modules.pop(modname, None)
        raise ModelLoadError(
            f"model file '{path}' called sys.exit({exc.code!r}) on import; put script code under "
            "`if __name__ == \"__main__\":`"
        ) from None
    except Exception as exc:
        sys.modules.pop(modname, None)
        raise ModelLoadError(f"model file '{path}' raised on import{_where(exc, full)}: {brief(exc)}") from exc
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)
    return module


def import_module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            hint = "; for a file give path/to/file.py:NAME" if "." not in name else ""
            raise ModelLoadError(
                f"module '{name}' cannot be found (is it installed or on PYTHONPATH?){hint}"
            ) from exc
        raise ModelLoadError(f"module '{name}' raised on import: {brief(exc)}") from exc
    except SystemExit as exc:
        raise ModelLoadError(f"module '{name}' called sys.exit({exc.code!r}) on import") from None
    except Exception as exc:
        raise ModelLoadError(f"module '{name}' raised on import: {brief(exc)}") from exc


def _where(exc: BaseException, filename: str) -> str:
    """`` (line N)``: the deepest traceback line inside the user's file."""
    line = None
    for fr in traceback.extract_tb(exc.__traceback__):
        if os.path.abspath(fr.filename) == filename:
            line = fr.lineno
    if line is None and isinstance(exc, SyntaxError) and exc.lineno:
        line = exc.lineno
    return f" (line {line})" if line else ""


# ------------------------------------------------------------------ attributes
def _is_module_class(obj: Any) -> bool:
    from torch import nn

    return inspect.isclass(obj) and issubclass(obj, nn.Module)


def model_names(module: Any) -> list[str]:
    """Names in ``module`` that can give a model: instances, subclasses, and functions
    defined in the module itself (imported helpers are left out)."""
    from torch import nn

    out = []
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        if isinstance(value, nn.Module) or _is_module_class(value) and value.__module__ == module.__name__ or inspect.isfunction(value) and value.__module__ == module.__name__:
            out.append(name)
    return out


def resolve_attr(module: Any, attr: str, origin: str) -> Any:
    obj = module
    walked: list[str] = []
    for part in attr.split("."):
        if not hasattr(obj, part):
            where = f"'{origin}'" if not walked else f"'{origin}:{'.'.join(walked)}'"
            candidates = model_names(obj) if not walked else [n for n in dir(obj) if not n.startswith("_")]
            hint = suggest(part, candidates) or (
                f"; models in it: {', '.join(candidates[:8])}" if candidates else ""
            )
            raise ModelLoadError(f"'{part}' not found in {where}{hint}")
        obj = getattr(obj, part)
        walked.append(part)
    return obj


def build(obj: Any, attr: str, origin: str, model_args: dict[str, Any], device: str) -> nn.Module:
    """Turn the attribute into a module: use an instance, call a class or a factory."""
    from torch import nn

    label = f"{origin}:{attr}"
    if isinstance(obj, nn.Module):
        if model_args:
            raise ModelLoadError(
                f"'{label}' is an already built {type(obj).__name__} instance; --model-arg needs a "
                "class or a function that builds the model"
            )
        return obj
    if not callable(obj):
        raise ModelLoadError(
            f"'{label}' is a {type(obj).__name__}, not an nn.Module, a module class or a function "
            "returning one"
        )
    if inspect.isclass(obj) and not _is_module_class(obj):
        raise ModelLoadError(f"'{label}' is the class {obj.__name__}, which is not an nn.Module subclass")
    _check_args(obj, label, model_args)
    model = _call(obj, label, model_args, device)
    if not isinstance(model, nn.Module):
        raise ModelLoadError(
            f"'{label}' returned a {type(model).__name__}, not an nn.Module; make it return the model"
        )
    model.eval()
    return model


def _check_args(fn: Any, label: str, model_args: dict[str, Any]) -> None:
    """Name an unknown --model-arg before calling (the TypeError would be less clear)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    params = sig.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items()
                if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    for key in model_args:
        if key not in accepted:
            raise ModelLoadError(
                f"--model-arg '{key}' is not a parameter of {label}"
                + (suggest(key, accepted) or f"; it takes: {', '.join(accepted) or 'no arguments'}")
            )
    missing = [n for n, p in params.items()
               if p.default is inspect.Parameter.empty and n not in model_args
               and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    if missing:
        raise ModelLoadError(
            f"{label} needs {', '.join(missing)}; pass them with --model-arg {missing[0]}=VALUE"
        )


def _call(fn: Any, label: str, model_args: dict[str, Any], device: str) -> Any:
    import torch

    def call() -> Any:
        return fn(**model_args)

    try:
        if device == "meta":
            try:
                # No memory for the weights; fine for a summary of shapes.
                with torch.device("meta"):
                    return call()
            except Exception:  # noqa: BLE001 - any failure on meta: build for real below
                return call()  # a builder that computes with its tensors: build for real
        with torch.device(device):
            return call()
    except Exception as exc:
        raise ModelLoadError(f"building the model {label} failed: {brief(exc)}") from exc
