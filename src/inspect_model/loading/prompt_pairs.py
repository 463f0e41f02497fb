"""Prompt pairs of ``patch`` (issue 36): ``--clean``/``--corrupt`` on the command line or a
``--pairs`` file of JSON lines, each ``{"clean": ..., "corrupt": ..., "metric"?: ...,
"subject"?: ...}``, read and checked before the model is loaded.

:class:`PairPlan` hands the pairs to the one runner as it hands texts (loading/text.py): one
name per pair (``pair-0``, ``pair-1`` ...), so ``torchrun`` shards them and ``--resume``
skips the pairs done, as it does image paths.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inspect_model.loading.plans import Plan
from inspect_model.errors import InputError, UsageError

MAX_BYTES = 64 * 1024 * 1024  # a pairs file larger than this is no list of prompts
MAX_PAIRS = 100_000
MAX_CHARS = 100_000  # one prompt
KEYS = {"clean": True, "corrupt": False, "metric": False, "subject": False}


@dataclass(frozen=True)
class PromptPair:
    clean: str
    corrupt: str | None = None
    metric: str | None = None  # this pair's --metric (None: the command's)
    subject: str | None = None  # this pair's --noise-subject (None: the command's)


def read_pairs(path: str | os.PathLike[str]) -> list[PromptPair]:
    """The pairs of a JSON-lines file; one :class:`InputError` line naming the line and the fault."""
    p = Path(path)
    try:
        if not p.is_file():
            raise InputError(f"--pairs '{p}' is not a file")
        size = p.stat().st_size
        if size > MAX_BYTES:
            raise InputError(f"--pairs '{p}' is {size:,} bytes; at most {MAX_BYTES:,} are read")
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(f"--pairs '{p}' cannot be read: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"--pairs '{p}' is not UTF-8 text (byte {exc.start})") from exc
    pairs: list[PromptPair] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(pairs) >= MAX_PAIRS:
            raise InputError(f"--pairs '{p}' holds more than {MAX_PAIRS:,} pairs; split it")
        pairs.append(_pair(line, f"--pairs '{p}' line {n}"))
    if not pairs:
        raise InputError(f"--pairs '{p}' holds no pair; each line is {{\"clean\": ..., \"corrupt\": ...}}")
    return pairs


def _pair(line: str, where: str) -> PromptPair:
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"{where} is not JSON: {getattr(exc, 'msg', 'too deeply nested')}") from exc
    if not isinstance(obj, dict):
        raise InputError(f"{where} is a JSON {type(obj).__name__}, not an object with \"clean\" and \"corrupt\"")
    unknown = sorted(set(obj) - set(KEYS))
    if unknown:
        raise InputError(f"{where}: unknown key {unknown[0]!r}; keys are {', '.join(KEYS)}")
    for key, needed in KEYS.items():
        value = obj.get(key)
        if value is None and not needed:
            continue
        if not isinstance(value, str) or not value:
            raise InputError(f"{where}: \"{key}\" must be a non-empty string")
        if len(value) > MAX_CHARS:
            raise InputError(f"{where}: \"{key}\" is {len(value):,} characters; at most {MAX_CHARS:,}")
    return PromptPair(obj["clean"], obj.get("corrupt"), obj.get("metric"), obj.get("subject"))


def given_pairs(clean: str | None, corrupt: str | None, pairs_file: Any, *, tracing: bool) -> list[PromptPair]:
    """The pairs of a run: ``--clean``/``--corrupt`` or ``--pairs`` (usage errors name what is missing)."""
    if pairs_file is not None:
        if clean is not None or corrupt is not None:
            raise UsageError("--pairs and --clean/--corrupt: give one or the other")
        pairs = read_pairs(pairs_file)
    elif clean is None:
        raise UsageError("give --clean PROMPT (and --corrupt PROMPT, or --noise-subject TEXT), or --pairs FILE")
    else:
        pairs = [PromptPair(clean, corrupt)]
    for i, pr in enumerate(pairs):
        where = "" if pairs_file is None else f" (pair {i})"
        if tracing and pr.corrupt is not None:
            raise UsageError(f"--noise-subject corrupts the clean prompt itself; drop --corrupt{where}")
        if not tracing and pr.corrupt is None:
            raise UsageError(f"--corrupt PROMPT is missing{where}; or trace with --noise-subject TEXT")
    return pairs


@dataclass
class PairBatch:
    """What the runner hands the session: the names and pairs of one batch."""

    names: list[str]
    pairs: list[PromptPair]
    tensor: Any = None


@dataclass
class PairPlan(Plan):
    unit = "pair"
    """The pairs as the runner reads them (the fields of ``InputPlan`` the pipeline reads)."""

    pairs: list[PromptPair]
    seed: int = 0
    batch_size: int = 1  # pairs per runner batch (a checkpoint after each)
    paths: list[Path] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.paths = [Path(f"pair-{i}") for i in range(len(self.pairs))]

    def describe(self) -> dict[str, Any]:
        import hashlib

        digest = hashlib.sha256(json.dumps([p.__dict__ for p in self.pairs], sort_keys=True).encode()).hexdigest()
        return {"images": [], "preprocessing": None, "input_size": None, "batch_size": self.batch_size,
                "channels": None, "seed": self.seed, "fill": "text", "skip_bad_inputs": False,
                "pairs": {"count": len(self.pairs), "sha256": digest}}

    def batches(self) -> Iterator[PairBatch]:
        for start in range(0, len(self.paths), self.batch_size):
            names = [p.name for p in self.paths[start:start + self.batch_size]]
            yield PairBatch(names, [self.pairs[int(n.rsplit("-", 1)[1])] for n in names])
