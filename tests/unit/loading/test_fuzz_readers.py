"""Fuzzing every reader of the tool (issue 41): random bytes and valid-looking headers (GIF,
PNG, a mutated real picture, MP4, safetensors, zip/torch.save, TOML, JSON) go through every
reader (images, videos, checkpoints, inputs and baseline files, resume states and manifests,
config files, labels, boxes, text files, processor configs, shard indexes, TorchScript), in a
subprocess whose address space is limited with ``resource.setrlimit`` and whose every case
has a deadline. Each case ends in a value or one error line with a documented exit code;
never a hang, an allocation past the limit, or an unforeseen exception
(tests/fixtures/fuzz_readers.py says how)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DRIVER = ROOT / "tests" / "fixtures" / "fuzz_readers.py"
LIMIT = 1536 * 2**20  # address space beyond what the imports took: every reader must stay within it


def _fuzz(seed: int, cases: int, **more: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", MPLBACKEND="Agg", **more)
    r = subprocess.run([sys.executable, str(DRIVER), str(seed), str(cases), str(LIMIT)], capture_output=True,
                       text=True, env=env, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # over 3 s: kept out of the quick tier
@pytest.mark.parametrize("seed", [41, 4141])
def test_every_reader_gives_a_value_or_one_documented_error_line(seed: int) -> None:
    doc = _fuzz(seed, 10)
    assert doc["failed"] == 0, json.dumps(doc["failures"], indent=1)
    outcomes = doc["outcomes"]
    assert len(outcomes) == 15 and doc["cases"] == 10 * 9 * 15
    for reader, seen in outcomes.items():  # every reader refused something, in its own exit code
        assert any(k.startswith("exit ") for k in seen), (reader, seen)
    for reader in ("image", "video", "checkpoint", "inputs file", "config", "labels", "text file"):
        assert outcomes[reader].get("ok"), (reader, outcomes[reader])  # and read some: the fuzz reaches them
    assert doc["slowest"][0][0] < 20


@pytest.mark.slow  # over 3 s: kept out of the quick tier
def test_the_harness_catches_an_allocation_past_the_limit_and_a_hang() -> None:
    """The limit and the deadline are real: a reader that allocates 4 GiB and one that never
    answers are both reported as failures."""
    doc = _fuzz(1, 1, FUZZ_SELFTEST="1")
    problems = {(f["reader"], f["problem"].split(":")[0]) for f in doc["failures"]}
    assert ("greedy", "MemoryError") in problems and ("stuck", "no answer in 2 s") in problems, problems
