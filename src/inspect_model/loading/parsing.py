"""Reading JSON and TOML that a user (or an attacker) wrote: one-line errors, bounded nesting.

Python's parsers recurse: a file of 100,000 ``[`` crashes them with ``RecursionError``, and
nesting just under the limit crashes the code that walks the result. Every JSON or TOML
document the tool reads (labels, boxes, config files, hub configs) goes through here: a
parse error, a RecursionError or nesting deeper than :data:`MAX_DEPTH` is the caller's
error class (usage error for config files, input error for data files), on one line.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any

from inspect_model.errors import InputError, InspectModelError

MAX_DEPTH = 64  # no file the tool reads nests deeper; JSON Schema's own documents stay under 20
MAX_TEXT_BYTES = 64 * 2**20  # labels, boxes, texts, configs: real ones are kilobytes
# A FIFO's open() blocks until a writer comes, /dev/zero's read never ends: refuse, in these words.
NOT_REGULAR = "is not a regular file (a pipe, socket or device); save it to a file and pass that"


def read_bounded(path: str | os.PathLike[str], what: str, *, error: type[InspectModelError] = InputError,
                 limit: int | None = None) -> bytes:
    """The bytes of the small text file at ``path`` (``what`` names it). A pipe or device
    (``/dev/zero``: the read never ends; a FIFO: the open blocks) and a file over ``limit``
    bytes (default :data:`MAX_TEXT_BYTES`) are ``error``; a missing file or a directory raise
    the usual ``OSError``."""
    limit = MAX_TEXT_BYTES if limit is None else limit
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} {NOT_REGULAR}")
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise error(f"{what} is over {limit:,} bytes; this is no labels, boxes, text or config file")
    return data


def check_depth(doc: Any, what: str, *, error: type[InspectModelError] = InputError) -> Any:
    """``doc`` unchanged, or ``error`` when lists and dicts nest deeper than :data:`MAX_DEPTH`
    (walked iteratively: no recursion)."""
    todo: list[tuple[Any, int]] = [(doc, 1)]
    while todo:
        value, depth = todo.pop()
        if not isinstance(value, (list, dict)):
            continue
        if depth > MAX_DEPTH:
            raise error(f"{what} nests lists or tables deeper than {MAX_DEPTH} levels; flatten it")
        todo.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return doc


def loads_json(text: str | bytes, what: str, *, error: type[InspectModelError] = InputError) -> Any:
    """Parse JSON ``text``; bad JSON or too deep nesting is one ``error`` line naming ``what``."""
    try:
        doc = json.loads(text)
    except RecursionError:
        raise error(f"{what} nests lists or objects too deeply to read (over {MAX_DEPTH} levels); "
                    "flatten it") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise error(f"{what} is not valid JSON: {' '.join(str(exc).split())[:160]}") from exc
    return check_depth(doc, what, error=error)


def load_json(path: str, what: str, *, error: type[InspectModelError] = InputError) -> Any:
    """:func:`loads_json` of the file at ``path`` (``what`` names it in messages)."""
    try:
        data = read_bounded(path, f"{what} '{path}'", error=error)
    except OSError as exc:
        raise error(f"{what} '{path}' cannot be read: {exc.strerror or exc}") from exc
    return loads_json(data, f"{what} '{path}'", error=error)


def loads_toml(text: str, what: str, *, error: type[InspectModelError] = InputError) -> dict[str, Any]:
    """Parse TOML ``text``, as :func:`loads_json` does JSON."""
    import tomllib

    try:
        doc = tomllib.loads(text)
    except RecursionError:
        raise error(f"{what} nests arrays or tables too deeply to read (over {MAX_DEPTH} levels); "
                    "flatten it") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{what} is not valid TOML: {exc}") from exc
    return check_depth(doc, what, error=error)
