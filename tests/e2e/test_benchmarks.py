"""benchmarks/run.py: the whole suite runs (``--smoke``: tiny sizes, one repeat) and prints
one table with a row per benchmark; its timings are not asserted (they are measurements,
read by people). The table's columns follow the installed peers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import run  # noqa: E402


def test_smoke_run_completes_and_prints_one_table(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BENCH.parent / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(BENCH / "run.py"), "--smoke", "--device", "cpu", "--json", str(out)],
                          capture_output=True, text=True, env=env, timeout=1500)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:4] == ["work", "ours", "floor", "ratio"]
    assert "target" in lines[0] and "result" in lines[0]
    measured = [ln for ln in lines if ln.startswith("Measured ")]
    assert len(measured) == 1 and "smoke mode" in measured[0]
    # After the table, the verdict: how many targets pass and which fail (issue 40).
    verdict = lines[lines.index(measured[0]) + 1]
    assert verdict.startswith("targets: ") and " PASS, " in verdict and verdict.endswith(" FAIL")
    doc = json.loads(out.read_text())
    benches = {r["bench"] for r in doc["rows"]}
    assert benches >= {"summary", "activations", "memory", "grads", "guided-backprop", "cam", "faithfulness",
                       "attention", "attributions", "video", "dataset", "pictures"}
    assert any(r["work"].startswith("Score-CAM") for r in doc["rows"])
    assert all("ERROR" not in r["work"] for r in doc["rows"])
    assert doc["machine"]["device"] == "cpu" and doc["machine"]["mode"] == "smoke"


def rows() -> list[common.Row]:
    return [common.Row("cam", "a", 1.0, 2.0, common.Target("ratio", 1.1, "<= 1.1x")),
            common.Row("cam", "b", 2.0, 1.0, common.Target("speedup", 2.5, ">= 2.5x"), peer=6.0, peer_name="p"),
            common.Row("cam", "c", 3.0, 1.0, common.Target("speedup", 2.5, ">= 2.5x"))]


def test_targets_and_peer_columns() -> None:
    a, b, c = rows()
    assert a.result is True and a.ratio == 0.5
    assert b.result is True and b.peer_ratio == 6.0  # 3x the peer's speed
    assert c.result is None  # no peer installed: nothing to compare, not a failure
    meta = {"peers": {"p": True}, "date": "d", "device": "cpu", "cpu": "x", "cores": 2, "torch": "t",
            "threads": 2, "mode": "quick", "repeats": 2, "seconds": 1.0, "cpu_seconds": 1.0, "load_average": [1.0, 1.0]}
    text = run.render(rows(), meta, markdown=False)
    assert "peer ratio" in text.splitlines()[0] and "3.00x p" in text
    meta["peers"] = {"p": False}
    plain = run.render(rows()[:1], meta, markdown=True)
    assert "peer" not in plain.splitlines()[0] and "peers not installed (columns empty): p" in plain
    assert plain.splitlines()[1] == "|---|---|---|---|---|---|"


def test_sizes_follow_the_device() -> None:
    gpu = common.sizes_for("cuda", "full")
    assert (gpu.batch, gpu.size, gpu.models) == (64, 224, ["resnet50", "vit_b_16"])
    assert common.sizes_for("cpu", "quick").size <= 112


@pytest.mark.parametrize("device_type", ["cuda", "mps", "cpu"])
def test_context_synchronises_the_device_it_runs_on(monkeypatch: pytest.MonkeyPatch, device_type: str) -> None:
    import torch

    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("cuda"))
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append("mps"))
    ctx = common.Context(torch.device(device_type), "quick", 2, common.sizes_for(device_type, "quick"), {})
    t = ctx.time({"a": lambda: None, "b": lambda: None})
    assert set(t) == {"a", "b"}
    # warm-up (1 each) + 2 repeats x 2 functions, synchronised before and after each timed run
    assert calls == ([] if device_type == "cpu" else [device_type] * (2 + 2 * 2 * 2))
