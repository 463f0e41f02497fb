"""Quantized models (torchvision.models.quantization): summary, check and activations with
and without quantize=True; statistics of quantized tensors on their dequantized values,
checked against the hooked tensors dequantized by hand; gradient commands refuse in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

ARGS = ["quantized_resnet18", "--weights", "none", "--input-size", "3x32x32"]


@pytest.mark.parametrize("quantize", [False, True])
@pytest.mark.parametrize("command", ["summary", "check", "activations"])
def test_summary_check_activations(cli, command: str, quantize: bool) -> None:
    r = cli([command, *ARGS, "--model-arg", f"quantize={quantize}", "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    if command == "activations":
        dtypes = {row["dtype"] for row in doc["layers"]}
        assert ("quint8" in dtypes) == quantize
        assert ("quantized_layers" in doc) == quantize


def test_statistics_are_of_the_dequantized_values() -> None:
    from torchvision.models.quantization import resnet18

    import inspect_model as im

    torch.manual_seed(0)
    model = resnet18(weights=None, quantize=True).eval()
    x = torch.rand(2, 3, 32, 32)
    got = {row["name"]: row for row in im.activations(model, x, layers=["layer1", "layer4"]).to_dict()["layers"]}
    seen: dict[str, torch.Tensor] = {}
    hooks = [getattr(model, n).register_forward_hook(lambda m, a, o, n=n: seen.__setitem__(n, o))
             for n in ("layer1", "layer4")]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    for name in ("layer1", "layer4"):
        assert seen[name].is_quantized and got[name]["dtype"] == "quint8"
        real = seen[name].dequantize().double()
        assert got[name]["stats"]["mean"] == pytest.approx(float(real.mean()), rel=1e-5)
        assert got[name]["stats"]["max"] == pytest.approx(float(real.max()), rel=1e-6)
        assert got[name]["stats"]["std"] == pytest.approx(float(real.std()), rel=1e-4)


@pytest.mark.parametrize("command", ["grads", "cam", "guided-backprop"])
def test_gradient_commands_refuse_a_quantized_model(cli, tmp_path: Path, command: str) -> None:
    out = tmp_path / "never"
    r = cli([command, *ARGS, "--model-arg", "quantize=True", "-o", str(out)])
    assert r.exit_code == 5
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error: quantized_resnet18 is quantized") and "no autograd" in line
    assert not out.exists()


def test_model_arg_stays_refused_for_other_torchvision_models(cli) -> None:
    r = cli(["summary", "resnet18", "--weights", "none", "--model-arg", "quantize=True"])
    assert r.exit_code == 2 and "quantize=True|False to torchvision's quantized_* models" in r.stderr


@pytest.mark.parametrize("command", ["grads", "cam", "guided-backprop"])
def test_gradient_commands_run_on_the_float_model(cli, command: str) -> None:
    r = cli([command, *ARGS, "--model-arg", "quantize=False"])  # FloatFunctional is no quantized kernel
    assert r.exit_code == 0, r.stderr
