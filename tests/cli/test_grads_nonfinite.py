"""NaN and Inf gradients are reported as NaN/Inf, never as 0 (issue 29.3).

``tests/fixtures/nan_net.py`` makes NaN in conv2's and conv1's output gradients (conv1's
finite values are all exact zeros) and Inf in fc.weight's gradient only. Statistics are
checked against torch on the same tensors; the checks against their own ``layers`` lists.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from inspect_model.methods.gradients.stats import merge_stats
from inspect_model.methods.gradients.flow import gradients
from inspect_model.methods.stats import tensor_stats

NAN_NET = Path(__file__).resolve().parents[1] / "fixtures" / "nan_net.py"


def _same(a: float | None, b: float) -> bool:
    if a is None:
        return not math.isfinite(b)
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-5)


@pytest.mark.parametrize("values", [
    [1.0, float("nan"), 0.0],
    [1.0, float("inf"), -2.0],
    [1.0, float("-inf"), -2.0],
    [float("inf"), float("-inf"), 3.0],
    [float("inf"), float("inf")],
    [0.0, 0.0, float("nan")],
])
def test_reported_statistics_are_torchs(values: list[float]) -> None:
    t = torch.tensor(values, dtype=torch.float32)
    for s in (tensor_stats(t), merge_stats(tensor_stats(t[:1]), tensor_stats(t[1:]))):
        assert s is not None
        r = s.reported()
        assert _same(r.norm, float(torch.linalg.vector_norm(t.double())))
        assert _same(r.mean, float(t.double().mean()))
        assert _same(r.abs_mean, float(t.double().abs().mean()))
        assert _same(r.min, float(t.min())) and _same(r.max, float(t.max()))
        assert math.isnan(r.std) == math.isnan(float(t.double().std()))


def test_nan_net_statistics_and_checks(cli, tmp_path: Path) -> None:
    out = tmp_path / "g"
    res = cli(["grads", f"{NAN_NET}:build", "--input-size", "3,32,32", "--fail-on", "nan,inf,exploding",
               "--json", "-o", str(out)])
    assert res.exit_code == 1, res.stderr
    doc = json.loads(res.stdout)
    layers = {r["key"]: r for r in doc["layers"]}
    conv1 = layers["conv1"]["grad_wrt_output"]
    assert conv1["nan_count"] > 0  # its finite values are all 0: the norm must not say 0
    for k in ("norm", "mean", "abs_mean", "max_abs", "min", "max", "std"):
        assert conv1[k] is None, k
    assert layers["conv1"]["relative_norm"] is None and layers["conv1"]["gain"] is None
    params = {p["name"]: p for p in doc["params"]}
    assert params["fc.weight"]["inf_count"] > 0 and params["fc.weight"]["norm"] is None
    assert params["fc.bias"]["norm"] == pytest.approx(1e30, rel=1e-5)
    checks = {c["name"]: c for c in doc["checks"]}
    # no false "vanishing" from a NaN layer: it is the NaN check's business
    assert checks["vanishing"]["status"] == "pass" and "conv1" not in checks["vanishing"]["layers"]
    assert "left out" in checks["vanishing"]["detail"]
    # each check's "first ..." leads its own list
    assert checks["inf"]["layers"] == ["param:fc.weight"]
    assert checks["inf"]["detail"].endswith("first in backward order: parameter fc.weight")
    assert checks["nan"]["layers"][0] == "conv2:output"
    assert checks["nan"]["detail"].endswith("first in backward order: conv2 (gradient wrt its output)")
    assert "error: gradient check 'nan' failed" in res.stderr
    text = (out / "report.txt").read_text()
    conv1_row = next(line for line in text.splitlines() if line.startswith("conv1 "))
    assert conv1_row.split()[3:5] == ["nan", "nan"]  # |grad wrt output|, mean |g|


def test_nan_net_flow_figure_marks_nonfinite_layers() -> None:
    import importlib.util

    from inspect_model.render.gradients import flow_figure

    spec = importlib.util.spec_from_file_location("nan_net", NAN_NET)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rep = gradients(mod.build(), torch.randn(1, 3, 32, 32))
    fig = flow_figure(rep)
    top, bottom = fig.axes[0], fig.axes[1]
    assert [t.get_text() for t in top.texts] == ["NaN", "NaN", "NaN"]  # conv1, relu1, conv2
    assert [t.get_text() for t in bottom.texts] == ["NaN", "NaN", "Inf"]  # conv1/conv2/fc weights
    assert "NaN/Inf gradient" in [t.get_text() for t in top.get_legend().get_texts()]
