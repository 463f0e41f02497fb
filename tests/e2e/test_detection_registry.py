"""Every torchvision detection and segmentation model through every command (issue 24), with
random weights at a small input size (benchmarks/dense_registry.py). CI runs two small
models (a detector, a segmenter); the whole registry (about half an hour on a CPU) runs with
INSPECT_MODEL_REGISTRY=1, or as ``python benchmarks/dense_registry.py``."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "dense_registry.py"


def _sweep():
    spec = importlib.util.spec_from_file_location("dense_registry", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["dense_registry"] = mod
    spec.loader.exec_module(mod)
    return mod


def _check(names: list[str]) -> None:
    mod = _sweep()
    wanted = [(n, t) for n, t in mod.registry() if n in names]
    assert len(wanted) == len(names)
    results = mod.sweep(wanted, 128, log=lambda line: None)
    bad = {k: v for k, v in results.items() if v != "ok"}
    assert not bad, bad


def test_two_small_models_through_every_command():
    _check(["fasterrcnn_mobilenet_v3_large_320_fpn", "lraspp_mobilenet_v3_large"])


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("INSPECT_MODEL_REGISTRY"), reason="set INSPECT_MODEL_REGISTRY=1 (minutes)")
def test_the_whole_registry_through_every_command():
    mod = _sweep()
    _check([n for n, _ in mod.registry()])
