"""Config files: ``--config FILE.toml`` sets any option of any subcommand.

Top-level keys apply to every command; a ``[command]`` table applies to that command only
and wins over the top level. Keys are option names with dashes or underscores
(``input-size`` or ``input_size``); the positional ``model`` (and ``images``) can be set
too. Values are checked against the option's type here, so a wrong key or type is a
usage error (exit 2) that names it, before any work starts.
"""

from __future__ import annotations

import tomllib
from typing import Any

from inspect_model.errors import UsageError, suggest

# Keys a config may carry that are not options of the command itself.
_META_KEYS = {"command", "description"}


def read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError as exc:
        raise UsageError(f"config file '{path}' does not exist") from exc
    except IsADirectoryError as exc:
        raise UsageError(f"config file '{path}' is a directory") from exc
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"config file '{path}' is not valid TOML: {exc}") from exc
    except OSError as exc:
        raise UsageError(f"config file '{path}' cannot be read: {exc.strerror or exc}") from exc


def load_config(path: str, command: str, params: dict[str, Any]) -> dict[str, Any]:
    """Defaults for ``command`` from ``path``, keyed by Click parameter name."""
    from inspect_model.cli._compat import click

    data = read_toml(path)
    merged: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            continue  # a [command] table
        merged[key] = value
    section = data.get(command)
    if isinstance(section, dict):
        merged.update(section)
    out: dict[str, Any] = {}
    for key, value in merged.items():
        if key in _META_KEYS:
            continue
        pname = key.replace("-", "_")
        if pname == "json":
            pname = "json_"
        if pname not in params:
            names = sorted(p.replace("_", "-").rstrip("-") for p in params)
            raise UsageError(
                f"config file '{path}': unknown key '{key}' for `{command}`"
                + (suggest(key, names) or f"; valid keys: {', '.join(names)}")
            )
        param = params[pname]
        try:
            if param.multiple or (isinstance(param, click.Argument) and param.nargs == -1):
                items = value if isinstance(value, list) else [value]
                out[pname] = [param.type.convert(v, param, None) for v in items]
            else:
                if isinstance(value, (list, dict)):
                    raise click.BadParameter(f"expected a single value, got {type(value).__name__}")
                out[pname] = param.type.convert(value, param, None)
        except click.BadParameter as exc:
            raise UsageError(
                f"config file '{path}': key '{key}' has a wrong value {value!r}: {exc.format_message()}"
            ) from exc
    return out
