"""Config files: ``--config FILE.toml`` sets any option of any subcommand.

Top-level keys apply to every command; a ``[command]`` table applies to that command only
and wins over the top level. Keys are option names with dashes or underscores
(``input-size`` or ``input_size``); the positional ``model`` (and ``images``) can be set
too, as long as the command line gives no positional of its own (Click fills positionals
from the left). A top-level key that only other commands know is ignored, so one file can
serve several commands; a key no command knows, a ``[table]`` that names no command, or a
value of the wrong type is a usage error (exit 2) that names it, before any work starts.
Relative paths in values are relative to the working directory, as on the command line.

A config that names the model takes the command line's positionals as images
(``cam --config resnet50-gradcam.toml cat.jpg``), unless the first one is itself a model
(:func:`is_image_argument`). A config file may come from anywhere, so it never runs code:
it may name torchvision, timm and Hugging Face models and data files, but a model whose
loading runs code (``FILE.py:NAME``, ``package.module:NAME``, TorchScript, pickled models),
``model-arg`` for anything but a timm model, and the trust options come only from the
command line (:func:`check_no_code`).
"""

from __future__ import annotations

from typing import Any

from inspect_model.errors import UsageError, suggest

# Keys a config may carry that are not options of the command itself.
_META_KEYS = {"command", "description"}


def read_toml(path: str) -> dict[str, Any]:
    """The TOML document at ``path``; every failure (deep nesting too) one usage-error line."""
    from inspect_model.loading.parsing import loads_toml, read_bounded

    try:
        text = read_bounded(path, f"config file '{path}'", error=UsageError).decode("utf-8")
    except FileNotFoundError as exc:
        raise UsageError(f"config file '{path}' does not exist") from exc
    except IsADirectoryError as exc:
        raise UsageError(f"config file '{path}' is a directory") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"config file '{path}' is not UTF-8 text") from exc
    except OSError as exc:
        raise UsageError(f"config file '{path}' cannot be read: {exc.strerror or exc}") from exc
    return loads_toml(text, f"config file '{path}'", error=UsageError)


_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm",
                   ".pnm", ".ico", ".tga", ".jp2", ".jfif", ".dib", ".pcx", ".sgi", ".im")


def is_image_argument(text: str) -> bool:
    """Whether a positional argument names images (``-``, a glob, an image file, a folder that
    is not a Hugging Face model) rather than a model: with a config that names the model,
    such positionals are the images."""
    import os

    if text == "-" or any(c in text for c in "*?["):
        return True
    if os.path.isdir(text):
        return not os.path.isfile(os.path.join(text, "config.json"))
    return text.lower().endswith(_IMAGE_SUFFIXES)


def check_no_code(path: str, defaults: dict[str, Any], model: str | None) -> None:
    """Refuse a config that would run code: a code-running model spec, or ``model-arg``
    values for a model other than timm's (``model``: the model the run loads)."""
    from inspect_model.loading.sources import code_running

    for key in ("model", "against_model"):  # compare's side B is a model too (issue 38)
        named = defaults.get(key)
        if isinstance(named, str) and named.strip():
            source = code_running(named)
            if source is not None:
                raise UsageError(
                    f"config file '{path}' names the model '{named}', whose loading runs code ({source} source); "
                    "a config may name torchvision, timm:NAME and hf:ORG/NAME models: give code-running models "
                    "(FILE.py:NAME, package.module:NAME, TorchScript and pickled files) on the command line")
    if defaults.get("model_arg") and not str(model or "").strip().startswith("timm:"):
        raise UsageError(
            f"config file '{path}' sets 'model-arg', which is passed to the model's own code; it is honoured "
            "in a config only for timm:NAME models: give --model-arg on the command line")


# Options that run code or overwrite data: a config file (which may come from anywhere)
# must never turn them on silently (issue 13); even setting them false is refused, so that
# a file cannot appear to decide them.
COMMAND_LINE_ONLY = {
    "trust_checkpoint": "lets a checkpoint run code",
    "force": "lets a run overwrite files",
    "trust_remote_code": "lets a Hugging Face repo run its own code",
}


def _pname(key: str) -> str:
    pname = key.replace("-", "_")
    return "json_" if pname == "json" else pname


def _display(pname: str) -> str:
    return pname.replace("_", "-").rstrip("-")


def load_config(
    path: str,
    command: str,
    params: dict[str, Any],
    *,
    all_params: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Defaults for ``command`` from ``path``, keyed by Click parameter name.

    ``all_params`` maps every command to its parameters: with it, top-level keys that
    belong to other commands are skipped and ``[tables]`` are checked against command names.
    """
    data = read_toml(path)
    declared = data.get("command")
    if declared is not None and all_params is not None and declared != command:
        if declared not in all_params:
            raise UsageError(
                f"config file '{path}': command = {declared!r} is not a command"
                + (suggest(str(declared), list(all_params)) or f"; commands: {', '.join(all_params)}")
            )
        raise UsageError(f"config file '{path}' is for `{declared}`, not `{command}`")
    merged: dict[str, Any] = {}
    top_level: set[str] = set()
    for key, value in data.items():
        if isinstance(value, dict):
            if all_params is not None and key not in all_params:
                raise UsageError(
                    f"config file '{path}': table [{key}] names no command"
                    + (suggest(key, list(all_params)) or f"; commands: {', '.join(all_params)}")
                )
            continue  # a [command] table: its own command's business
        if key in _META_KEYS:
            continue
        merged[key] = value
        top_level.add(key)
    section = data.get(command)
    if isinstance(section, dict):
        for key, value in section.items():
            if isinstance(value, dict):
                raise UsageError(f"config file '{path}': [{command}.{key}] is a table; options take values")
            merged[key] = value
            top_level.discard(key)
    known_elsewhere = set()
    if all_params is not None:
        known_elsewhere = {name for ps in all_params.values() for name in ps}
    out: dict[str, Any] = {}
    for key, value in merged.items():
        pname = _pname(key)
        if pname in COMMAND_LINE_ONLY:
            raise UsageError(
                f"config file '{path}' sets '{key}', which {COMMAND_LINE_ONLY[pname]}; "
                f"it is honoured only on the command line (--{_display(pname)}): remove it from the file"
            )
        if pname not in params:
            if key in top_level and pname in known_elsewhere:
                continue  # a top-level option for other commands
            names = sorted(_display(p) for p in params)
            raise UsageError(
                f"config file '{path}': unknown key '{key}' for `{command}`"
                + (suggest(key, names) or f"; valid keys: {', '.join(names)}")
            )
        out[pname] = convert_value(path, key, value, params[pname])
    return out


def convert_value(path: str, key: str, value: Any, param: Any) -> Any:
    """Check a TOML value against the option's Python type strictly (no silent 1.5 -> 1,
    no "yes" for a flag). A list of scalars for a text option that takes comma-separated
    values (``mean = [0.5, 0.5, 0.5]``, ``fail-on = ["nan", "inf"]``) is joined with commas."""
    import enum
    import pathlib

    def bad(reason: str) -> UsageError:
        return UsageError(f"config file '{path}': key '{key}' has a wrong value {value!r}: {reason}")

    desc = getattr(param, "type_descriptor", None)
    annotation = getattr(desc, "annotation", None)
    many = bool(getattr(param, "multiple", False)) or getattr(param, "nargs", 1) == -1
    inner = annotation
    if desc is not None and getattr(desc, "is_list", False):
        from typing import get_args

        args = get_args(annotation)
        inner = args[0] if args else str
    if annotation is None and hasattr(param, "type"):
        inner = _click_type(param)
    choices = getattr(desc, "choices", None) if getattr(desc, "is_choice", False) else None

    def one(v: Any) -> Any:
        if isinstance(v, bool) and str(getattr(param, "metavar", "") or "").startswith("["):
            return "" if v else None  # an optional value (`offload = true`: --offload alone)
        if inner is bool or getattr(param, "is_flag", False):
            if not isinstance(v, bool):
                raise bad("expected true or false")
            return v
        if isinstance(v, bool):
            raise bad(f"expected {getattr(inner, '__name__', 'a value')}, not a boolean")
        if isinstance(v, (list, dict)):
            raise bad(f"expected a single value, got a {'list' if isinstance(v, list) else 'table'}")
        if inner is int:
            if isinstance(v, float) and v.is_integer():
                return int(v)
            if not isinstance(v, int):
                raise bad("expected an integer")
            return v
        if inner is float:
            if not isinstance(v, (int, float)):
                raise bad("expected a number")
            return float(v)
        if isinstance(inner, type) and issubclass(inner, pathlib.PurePath):
            if not isinstance(v, str):
                raise bad("expected a path (a string)")
            return pathlib.Path(v)
        if isinstance(inner, type) and issubclass(inner, enum.Enum):
            names = [str(m.value) for m in inner]
            if str(v) not in names:
                raise bad(f"choose one of {', '.join(names)}")
            return str(v)
        if choices is not None and str(v) not in [str(c) for c in choices]:
            raise bad(f"choose one of {', '.join(str(c) for c in choices)}")
        if isinstance(v, (str, int, float)):
            return str(v) if inner in (str, None) else v
        raise bad(f"expected a {getattr(inner, '__name__', 'value')}")

    if many:
        items = value if isinstance(value, list) else [value]
        return [one(v) for v in items]
    if isinstance(value, list) and inner is str and value and all(
        isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value
    ):
        return ",".join(str(v) for v in value)
    return one(value)


def _click_type(param: Any) -> Any:
    """The Python type behind a plain Click parameter (older Typer releases)."""
    name = getattr(getattr(param, "type", None), "name", "")
    if getattr(param, "is_flag", False) or name == "boolean":
        return bool
    # Click names its types "integer"/"float"/"text"; Typer's vendored Click "int"/"float"/...
    import pathlib

    table = {"integer": int, "int": int, "float": float, "path": pathlib.Path, "text": str}
    return table.get(str(name).lower(), str)
