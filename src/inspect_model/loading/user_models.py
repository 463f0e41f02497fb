"""The user's own models: ``FILE.py:NAME`` and ``package.module:NAME`` (saved files too).

``NAME`` may be an ``nn.Module`` instance, an ``nn.Module`` class or a function returning a
module (dotted for nested attributes: ``zoo.py:Builders.small``); ``--model-arg`` values are
passed to the class or function. Loading ``FILE.py`` runs that file, as ``python FILE.py``
would (but with ``__name__`` not ``"__main__"``), so only load files you trust.

Saved model files (TorchScript, torch.export ``.pt2``, pickled modules) are loaded by
:mod:`inspect_model.loading.saved_models`; its loaders are re-exported here.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from typing import TYPE_CHECKING, Any

from inspect_model.errors import ModelLoadError, one_line, suggest
from inspect_model.loading.saved_models import load_archive

if TYPE_CHECKING:
    from torch import nn

    from inspect_model.loading.models import LoadedModel


def parse_spec(spec: str) -> tuple[str, str, str | None]:
    """``(kind, where, attr)``: kind is ``file`` (a .py file), ``module`` (an importable
    module) or ``archive`` (a saved model file, attr None)."""
    if ":" in spec:
        left, right = spec.rsplit(":", 1)
        # `C:\models\net.pt` (a Windows drive) has no attribute part.
        if len(left) == 1 and left.isalpha() and right.startswith(("\\", "/")):
            return "archive", spec, None
        if not right:
            raise ModelLoadError(f"model spec '{spec}' names no attribute after ':'; e.g. {left}:MyNet")
        if left.endswith(".py") or os.sep in left or "/" in left or os.path.isfile(left):
            return "file", left, right
        return "module", left, right
    if spec.endswith(".py"):
        return "file", spec, None
    return "archive", spec, None


def load_user_model(
    spec: str,
    *,
    device: str = "cpu",
    model_args: dict[str, Any] | None = None,
    trust: bool = False,
) -> LoadedModel:
    """Load a user model spec (see module docstring) onto ``device``."""
    kind, where, attr = parse_spec(spec)
    model_args = dict(model_args or {})
    if kind == "archive":
        if model_args:
            raise ModelLoadError(
                f"--model-arg does not apply to the saved model '{where}'; it is for FILE.py:NAME specs"
            )
        return load_archive(where, device=device, trust=trust)
    if kind == "file":
        module = import_file(where)
        origin = where
    else:
        module = import_module(where)
        origin = where
    if attr is None:
        names = model_names(module)
        raise ModelLoadError(
            f"'{where}' needs the name of a model after ':', e.g. {where}:{names[0] if names else 'MyNet'}"
            + (f"; models in it: {', '.join(names[:8])}" if names else "")
        )
    obj = resolve_attr(module, attr, origin)
    model = build(obj, attr, origin, model_args, device)
    borrowed = model is obj  # the user's own instance, used as it is
    if borrowed and device != "meta" and _model_device(model) not in (None, device):
        # Never move the user's object to another device (issue 9): run on a copy.
        model = private_copy(model, f"{origin}:{attr}")
        borrowed = False
    loaded = _finish(model, name=attr.split(".")[-1], source="python", device=device, notes=[])
    loaded.borrowed = borrowed
    return loaded


def private_copy(model: nn.Module, label: str) -> nn.Module:
    """A deep copy of a user's model instance, to change (device, dtype, weights) freely."""
    import copy

    try:
        return copy.deepcopy(model)
    except Exception as exc:
        raise ModelLoadError(
            f"cannot copy the model instance {label} ({_brief(exc)}), so it cannot be moved, cast or "
            "given a checkpoint without changing your object; give its class or a factory function instead"
        ) from exc


# ------------------------------------------------------------------ importing
def import_file(path: str) -> Any:
    """Run ``path`` as a fresh module (its folder importable for sibling imports)."""
    if not os.path.exists(path):
        raise ModelLoadError(f"model file '{path}' does not exist")
    if os.path.isdir(path):
        raise ModelLoadError(f"model file '{path}' is a directory; give FILE.py:NAME")
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
        raise ModelLoadError(f"model file '{path}' raised on import{_where(exc, full)}: {_brief(exc)}") from exc
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
        raise ModelLoadError(f"module '{name}' raised on import: {_brief(exc)}") from exc
    except SystemExit as exc:
        raise ModelLoadError(f"module '{name}' called sys.exit({exc.code!r}) on import") from None
    except Exception as exc:
        raise ModelLoadError(f"module '{name}' raised on import: {_brief(exc)}") from exc


def _brief(exc: BaseException) -> str:
    text = one_line(exc)
    return type(exc).__name__ if text == type(exc).__name__ else f"{type(exc).__name__}: {text}"


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
        raise ModelLoadError(f"building the model {label} failed: {_brief(exc)}") from exc


# ------------------------------------------------------------------ result
def _model_device(model: nn.Module) -> str | None:
    for t in list(model.parameters()) + list(model.buffers()):
        return str(t.device)
    return None


def _finish(model: nn.Module, *, name: str, source: str, device: str, notes: list[str]) -> LoadedModel:
    from inspect_model.loading.models import LoadedModel

    current = _model_device(model)
    if device != "meta" and current is not None and current != device:
        try:
            model.to(device)
        except Exception as exc:
            raise ModelLoadError(f"cannot move model {name} to {device}: {_brief(exc)}") from exc
    actual = _model_device(model) or ("cpu" if device == "meta" else device)
    # The input size is only a default for runs without images or --input-size; the
    # report records the size used, so a guess needs no note of its own.
    sizes = _declared_input_sizes(model) or guess_input_sizes(model)
    notes = list(notes)
    cats = getattr(model, "categories", None)
    categories = [str(c) for c in cats] if isinstance(cats, (list, tuple)) and cats else None
    return LoadedModel(model=model, name=name, source=source, family="custom", categories=categories,
                       input_sizes=sizes, device=actual, notes=notes)


def _declared_input_sizes(model: nn.Module) -> list[tuple[int, ...]] | None:
    """A model's own ``input_size`` attribute: ``(3, 32, 32)`` or a list of such tuples."""
    image_size = getattr(model, "image_size", None)  # torchvision's VisionTransformer has one
    if isinstance(image_size, int) and not isinstance(image_size, bool) and image_size > 0:
        guess = guess_input_sizes(model)
        channels = guess[0][0] if guess and len(guess[0]) == 3 else 3
        return [(channels, image_size, image_size)]
    size = getattr(model, "input_size", None)
    if isinstance(size, (tuple, list)) and size:
        if all(isinstance(d, int) for d in size):
            return [tuple(int(d) for d in size)]
        if all(isinstance(s, (tuple, list)) and all(isinstance(d, int) for d in s) for s in size):
            return [tuple(int(d) for d in s) for s in size]
    return None


def guess_input_sizes(model: nn.Module) -> list[tuple[int, ...]] | None:
    """From the first conv/linear layer: (C, 224, 224) for Conv2d, (F,) for Linear."""
    from torch import nn

    for mod in model.modules():
        kind = getattr(mod, "original_name", None)  # TorchScript keeps the class name here
        weight = getattr(mod, "weight", None)
        if kind in ("Conv1d", "Conv2d", "Conv3d", "Linear") and weight is not None and weight.dim() >= 2:
            c = int(weight.shape[1])
            return {"Conv1d": [(c, 224)], "Conv2d": [(c, 224, 224)], "Conv3d": [(c, 16, 112, 112)],
                    "Linear": [(c,)]}[kind]
        if isinstance(mod, nn.Conv2d):
            return [(int(mod.in_channels), 224, 224)]
        if isinstance(mod, nn.Conv1d):
            return [(int(mod.in_channels), 224)]
        if isinstance(mod, nn.Conv3d):
            return [(int(mod.in_channels), 16, 112, 112)]
        if isinstance(mod, nn.Linear):
            return [(int(mod.in_features),)]
        if isinstance(mod, (nn.Embedding, nn.EmbeddingBag)):
            return None
    return None
