"""`inspect-model activations`: selection, per-call records, statistics checked against direct
torch computations, feature-map grids, files, JSON/JSONL/TensorBoard outputs, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fixtures.models import Boom, Nested, ReusedReLU, TinyCNN, assert_unchanged, model_state
from inspect_model.errors import ModelRuntimeError, UsageError
from inspect_model.methods.activations.measure import choose_channel_dim, measure
from inspect_model.methods.activations.capture import capture_activations
from inspect_model.render.grids import (
    grid_shape,
    parse_channels,
    pick_channels,
    render_activation,
    spatial_maps,
)

USER_MODELS = '''
import torch
from torch import nn


class Tokens(nn.Module):
    """ViT-like: (N, 3, 8, 8) -> 16 patch tokens + a class token, dim 6."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, 6, 2, stride=2)
        self.cls = nn.Parameter(torch.zeros(1, 1, 6))
        self.mlp = nn.Linear(6, 6)
        self.act = nn.GELU()

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)  # (N, 16, 6)
        t = torch.cat([self.cls.expand(x.shape[0], -1, -1), t], dim=1)  # (N, 17, 6)
        return self.act(self.mlp(t))[:, 0]


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(self.relu(self.conv(x)).mean((2, 3)))
'''


@pytest.fixture
def user_py(tmp_path: Path) -> Path:
    p = tmp_path / "act_models.py"
    p.write_text(USER_MODELS)
    return p


def rows_by_key(report):
    return {r.key: r for r in report.layers}


def direct_stats(t: torch.Tensor) -> dict[str, float]:
    """The same statistics, straight from torch on the whole tensor (float64)."""
    x = t.detach().double()
    fin = x[torch.isfinite(x)]
    return {
        "mean": float(fin.mean()), "std": float(fin.std()), "min": float(fin.min()), "max": float(fin.max()),
        "zero_fraction": float((x == 0).sum()) / x.numel(),
        "negative_fraction": float((fin < 0).sum()) / x.numel(),
        "nan_count": int(torch.isnan(x).sum()), "inf_count": int(torch.isinf(x).sum()),
    }


def assert_stats_match(stats, t: torch.Tensor) -> None:
    d = direct_stats(t)
    assert stats.numel == t.numel()
    for k in ("mean", "std", "min", "max"):
        assert getattr(stats, k) == pytest.approx(d[k], rel=1e-5, abs=1e-6), k
    for k in ("zero_fraction", "negative_fraction", "nan_count", "inf_count"):
        assert getattr(stats, k) == d[k], k


# ----------------------------------------------------------------------------- selection
def test_type_conv2d_selects_36_layers_of_resnet34():
    import torchvision

    from inspect_model.engine.selection import select_layers

    with torch.device("meta"):
        model = torchvision.models.resnet34(weights=None)
    names = select_layers(model, ["type:Conv2d"])
    assert len(names) == 36
    assert names[0] == "conv1"
    assert all(isinstance(model.get_submodule(n), nn.Conv2d) for n in names)


def test_cli_resnet34_type_conv2d_gives_36_rows(cli):
    r = cli(["activations", "resnet34", "--weights", "none", "--input-size", "3x32x32",
             "--layers", "type:Conv2d", "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["layers"]) == 36
    assert {row["type"] for row in doc["layers"]} == {"Conv2d"}
    assert doc["layers"][0]["key"] == "conv1" and doc["layers"][0]["channels"] == 64
    assert doc["grids"] == []  # no --output-dir: nothing drawn


def test_first_conv_of_resnet34_is_an_8x8_grid(cli, tmp_path):
    out = tmp_path / "acts"
    r = cli(["activations", "resnet34", "--weights", "none", "--input-size", "3x32x32", "--batch-size", "1",
             "--layers", "conv1", "--output-dir", str(out), "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    (grid,) = doc["grids"]
    assert (grid["kind"], grid["rows"], grid["cols"]) == ("grid", 8, 8)
    assert grid["channels"] == list(range(64)) and grid["total_channels"] == 64
    png = out / grid["file"]
    assert grid["file"] == "images/0000-random-0/conv1.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "overview.png").is_file() and (out / "report.json").is_file()
    assert sorted(doc["files"]) == sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())


def test_nested_sequential_hooks_the_leaves():
    report = capture_activations(Nested(), torch.randn(2, 4))
    assert [r.key for r in report.layers] == ["block.0.0", "block.0.1", "block.1"]
    assert [r.type for r in report.layers] == ["Linear", "ReLU", "Linear"]


# ----------------------------------------------------------------------------- statistics
def test_reused_module_gets_one_record_per_call():
    model = ReusedReLU()
    x = torch.randn(3, 4)
    report = capture_activations(model, x)
    rows = rows_by_key(report)
    assert list(rows) == ["fc1", "relu#0", "fc2", "relu#1"]
    assert rows["relu#0"].calls == 2 and rows["relu#1"].call_index == 1
    with torch.no_grad():
        first = torch.relu(x @ model.fc1.weight.T + model.fc1.bias)
        second = torch.relu(first @ model.fc2.weight.T + model.fc2.bias)
    assert_stats_match(rows["relu#0"].stats, first)
    assert_stats_match(rows["relu#1"].stats, second)


def test_inplace_relu_after_conv_does_not_corrupt_the_captured_conv_output():
    model = TinyCNN().eval()  # features.3 (Conv2d) is followed by ReLU(inplace=True)
    x = torch.randn(2, 3, 12, 12)
    report = capture_activations(model, x, layers=["features.3", "features.4"], keep=True)
    with torch.no_grad():
        h = torch.relu(model.features[1](model.features[0](x)))
        conv_out = F.conv2d(h, model.features[3].weight, model.features[3].bias, padding=1)
    kept = report.tensors["features.3"]
    assert torch.allclose(kept, conv_out, atol=1e-6)
    assert (kept < 0).any()  # the ReLU ran in place on the module output, not on our copy
    row = rows_by_key(report)["features.3"]
    assert_stats_match(row.stats, conv_out)
    assert row.stats.negative_fraction > 0.2
    assert rows_by_key(report)["features.4"].stats.min == 0.0


def test_statistics_equal_direct_computation_over_several_batches():
    torch.manual_seed(1)
    model = TinyCNN().eval()  # the capture runs in eval mode: BatchNorm uses running stats
    x = torch.randn(5, 3, 10, 10)
    report = capture_activations(model, [x[:2], x[2:4], x[4:]], keep=True)
    with torch.no_grad():
        f = model.features
        a0 = f[0](x)
        a1 = f[1](a0)
        a2 = torch.relu(a1)
        a3 = f[3](a2)
        a4 = torch.relu(a3)
        pooled = a4.mean((2, 3), keepdim=True)
        logits = model.fc(pooled.flatten(1))
    expected = {"features.0": a0, "features.1": a1, "features.2": a2, "features.3": a3,
                "features.4": a4, "pool": pooled, "fc": logits}
    rows = rows_by_key(report)
    assert list(rows) == list(expected)
    assert report.images == 5 and report.batches == 3
    for key, t in expected.items():
        row = rows[key]
        assert row.shape == (2, *t.shape[1:])  # first batch
        assert_stats_match(row.stats, t)
        # Per channel (dim 1): mean over images and positions.
        means = t.double().mean(dim=[d for d in range(t.ndim) if d != 1])
        assert np.allclose(row.channel_means, means.numpy(), rtol=1e-5, atol=1e-7), key
        dead = (t == 0).flatten(2).all(2).all(0) if t.ndim > 2 else (t == 0).all(0)
        assert row.dead_channels == int(dead.sum())
        assert torch.allclose(report.tensors[key], t, atol=1e-6)  # batch-size rounding aside


def test_dead_channels_are_dead_for_every_image():
    conv = nn.Conv2d(1, 3, 1)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([1.0, 0.0, 1.0]).view(3, 1, 1, 1))
        conv.bias.copy_(torch.tensor([0.0, -1.0, -10.0]))
    model = nn.Sequential(conv, nn.ReLU())
    x = torch.full((2, 1, 3, 3), 0.5)
    x[1] = 20.0  # channel 2 fires for image 1 only: not dead over the run
    report = capture_activations(model, x)
    relu = rows_by_key(report)["1"]
    assert relu.channels == 3 and relu.dead_channels == 1  # channel 1: bias -1, weight 0
    assert relu.dead_channel_fraction == pytest.approx(1 / 3)
    # Per image: image 0 has channels 1 and 2 dead.
    with capture_all(model) as cap:
        res = cap.run(x, ["a", "b"])
    per_image = {img.name: {s.key: s for s in img.layers} for img in res.images}
    assert per_image["a"]["1"].dead_channel_fraction == pytest.approx(2 / 3)
    assert per_image["b"]["1"].dead_channel_fraction == pytest.approx(1 / 3)
    assert_stats_match(per_image["b"]["1"].stats, torch.relu(conv(x[1:])).detach())


def capture_all(model):
    from inspect_model.engine.selection import select_layers
    from inspect_model.methods.activations.capture import ActivationCapture

    return ActivationCapture(model, select_layers(model))


def test_nan_and_inf_are_counted_and_excluded_from_moments():
    t = torch.randn(3, 4, 5, 5)
    t[0, 1, 2, 2] = float("nan")
    t[1, 0, 0, 0] = float("inf")
    t[2, 3, 1, 1] = -float("inf")
    t[2, 3, 1, 2] = 0.0
    m = measure(t, 3)
    assert_stats_match(m.total().stats(), t)
    # Per image and the exact float64 path agree with the fast path on finite images.
    for i in range(3):
        assert_stats_match(m.samples[i].stats(), t[i])


def test_half_precision_and_integer_outputs():
    t = torch.randn(2, 3, 4, 4).half()
    assert_stats_match(measure(t, 2).total().stats(), t.float())
    ints = torch.randint(-3, 4, (2, 7))
    assert_stats_match(measure(ints, 2).total().stats(), ints.double())


def test_channel_dim_of_tokens_and_conv1d():
    assert choose_channel_dim("Linear", (2, 17, 6), True, None) == 2
    assert choose_channel_dim("Conv1d", (2, 4, 9), True, None) == 1
    assert choose_channel_dim("ReLU", (2, 4, 9), True, ((2, 4, 9), 1)) == 1
    assert choose_channel_dim("Conv2d", (2, 4, 9, 9), True, None) == 1
    assert choose_channel_dim("Flatten", (2,), True, None) is None
    model = nn.Sequential(nn.Conv1d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(28, 3))
    x = torch.randn(2, 2, 9)
    rows = rows_by_key(capture_activations(model, x))
    assert rows["0"].channel_dim == 1 and rows["1"].channel_dim == 1 and rows["1"].channels == 4
    with torch.no_grad():
        relu_out = torch.relu(model[0](x))
    assert np.allclose(rows["1"].channel_means, relu_out.double().mean((0, 2)).numpy())


def test_model_left_unchanged_also_on_failure():
    model = TinyCNN()
    model.train()
    model.fc.weight.grad = torch.ones_like(model.fc.weight)
    before = model_state(model)
    capture_activations(model, torch.randn(2, 3, 8, 8), keep=True)
    assert_unchanged(model, before)
    boom = Boom()
    before = model_state(boom)
    with pytest.raises(ModelRuntimeError, match="layer 'c'"):
        capture_activations(boom, torch.randn(2, 4))
    assert_unchanged(boom, before)


# ----------------------------------------------------------------------------- rendering
def test_grid_shapes_and_channel_choice():
    assert grid_shape(64) == (8, 8)
    assert grid_shape(10) == (3, 4)
    assert grid_shape(1) == (1, 1)
    means = [0.1, 3.0, -1.0, 3.0, 2.0]
    assert pick_channels(means, parse_channels("top:3")) == [1, 3, 4]
    assert pick_channels(means, parse_channels(None, 2)) == [0, 1]
    assert pick_channels(means, parse_channels(None, 0)) == [0, 1, 2, 3, 4]
    assert pick_channels(means, parse_channels("4,0-1")) == [4, 0, 1]
    with pytest.raises(UsageError, match="has 5 channels"):
        pick_channels(means, parse_channels("7"), layer="conv")
    for bad in ("top:0", "first", "3-1"):
        with pytest.raises(UsageError):
            parse_channels(bad)


def test_vit_tokens_form_a_square_grid_and_vectors_are_heat_map_strips():
    tokens = np.random.default_rng(0).standard_normal((17, 6)).astype(np.float32)  # class + 4x4
    kind, maps, note = spatial_maps(tokens, 1)
    assert kind == "grid" and maps.shape == (6, 4, 4) and "class token" in note
    assert np.array_equal(maps[2], tokens[1:, 2].reshape(4, 4))
    kind, maps, _ = spatial_maps(tokens[:15], 1)  # 15 tokens: no square, a heat map
    assert kind == "heatmap" and maps.shape == (6, 15)
    _, layout = render_activation(tokens, 1, title="t")
    assert (layout.kind, layout.rows, layout.cols) == ("grid", 2, 3)  # 6 channels
    _, layout = render_activation(np.arange(5.0), None, title="fc")
    assert (layout.kind, layout.rows, layout.cols) == ("strip", 1, 5) and layout.channels == (0, 1, 2, 3, 4)
    _, layout = render_activation(np.arange(300.0), None, title="fc")
    assert (layout.kind, layout.rows, layout.cols) == ("strip", 5, 64)
    _, layout = render_activation(np.ones((4, 9)), 0, title="conv1d", scale="each")
    assert (layout.kind, layout.rows) == ("heatmap", 4)


def test_pngs_are_byte_identical_across_runs(cli, user_py, tmp_path):
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        r = cli(["activations", f"{user_py}:Small", "--input-size", "3x8x8", "--batch-size", "2",
                 "--layers", "conv", "--layers", "fc", "--scale", "each", "--output-dir", str(out), "-q"])
        assert r.exit_code == 0, r.stderr
        outs.append(out)
    pngs = sorted(p.relative_to(outs[0]) for p in outs[0].rglob("*.png"))
    assert len(pngs) == 5  # 2 images x 2 layers + overview
    for rel in pngs:
        assert (outs[0] / rel).read_bytes() == (outs[1] / rel).read_bytes(), rel


# ----------------------------------------------------------------------------- CLI outputs
def test_json_report_validates_against_the_schema(cli, user_py):
    import jsonschema

    from inspect_model.schemas import load_schema

    r = cli(["activations", f"{user_py}:Tokens", "--input-size", "3x8x8", "--batch-size", "3", "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, load_schema("activations"))
    rows = {row["key"]: row for row in doc["layers"]}
    assert list(rows) == ["patch", "mlp", "act"]
    assert rows["mlp"]["channel_dim"] == 2 and rows["mlp"]["channels"] == 6
    assert rows["act"]["channel_dim"] == 2
    assert doc["image_count"] == 3 and doc["options"]["weights"] == "DEFAULT"


def test_token_layer_drawn_as_spatial_grid(cli, user_py, tmp_path):
    r = cli(["activations", f"{user_py}:Tokens", "--input-size", "3x8x8", "--batch-size", "1",
             "--layers", "mlp", "-o", str(tmp_path / "o"), "--json"])
    assert r.exit_code == 0, r.stderr
    (grid,) = json.loads(r.stdout)["grids"]
    assert (grid["kind"], grid["rows"], grid["cols"], grid["total_channels"]) == ("grid", 2, 3, 6)


def test_jsonl_streams_one_object_per_image(cli, user_py):
    r = cli(["activations", f"{user_py}:Small", "--input-size", "3x8x8", "--batch-size", "2", "--jsonl"])
    assert r.exit_code == 0, r.stderr
    lines = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert [ln["image"] for ln in lines] == ["random-0", "random-1"]
    assert [s["key"] for s in lines[0]["layers"]] == ["conv", "relu", "fc"]
    assert lines[1]["layers"][1]["min"] == 0.0


def test_text_report_when_piped(cli, user_py):
    r = cli(["activations", f"{user_py}:Small", "--input-size", "3x8x8"])
    assert r.exit_code == 0, r.stderr
    header = r.stdout.splitlines()[1]
    assert header.split() == ["Layer", "Type", "Output", "shape", "Mean", "Std", "Min", "Max", "Zero", "%",
                              "Neg", "%", "Dead", "ch", "NaN/Inf"]
    assert "\x1b[" not in r.stdout and "Images: 1 in 1 batch(es)" in r.stdout  # one random input by default


def test_save_raw_npy_and_npz(cli, user_py, tmp_path):
    out = tmp_path / "raw"
    r = cli(["activations", f"{user_py}:Small", "--input-size", "3x8x8", "--batch-size", "2",
             "--layers", "conv", "--save-raw", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    a0 = np.load(out / "images" / "0000-random-0" / "conv.npy")
    a1 = np.load(out / "images" / "0001-random-1" / "conv.npy")
    both = np.stack([a0, a1]).astype(np.float64)
    assert a0.shape == (4, 8, 8)
    conv = doc["layers"][0]
    assert conv["stats"]["mean"] == pytest.approx(both.mean(), rel=1e-5)
    assert conv["stats"]["std"] == pytest.approx(both.std(ddof=1), rel=1e-5)
    out2 = tmp_path / "raw2"
    r = cli(["activations", f"{user_py}:Small", "--input-size", "3x8x8", "--batch-size", "2",
             "--layers", "conv", "--layers", "fc", "--save-raw", "--raw-format", "npz", "-o", str(out2), "-q"])
    assert r.exit_code == 0, r.stderr
    with np.load(out2 / "images" / "0001-random-1" / "raw.npz") as z:
        assert sorted(z.files) == ["conv", "fc"]
        assert np.array_equal(z["conv"], a1)


def test_tensorboard_histograms_and_grid_images(cli, user_py, tmp_path):
    from inspect_model.output.tensorboard import read_tags

    tb = tmp_path / "tb"
    r = cli(["activations", f"{user_py}:Small", "--input-size", "3x8x8", "--batch-size", "2",
             "--layers", "conv", "--layers", "relu", "--tensorboard", str(tb), "-q"])
    assert r.exit_code == 0, r.stderr
    tags = read_tags(tb)
    assert tags["histograms"] == ["activations/conv", "activations/relu"]
    assert tags["images"] == ["grids/conv", "grids/relu"]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--scale", "global"], 2, "--scale 'global' is not one of each, layer"),
        (["--channels", "best"], 2, "--channels 'best' is not top:N"),
        (["--json", "--jsonl"], 2, "--json and --jsonl cannot be combined"),
        (["--save-raw"], 2, "--save-raw needs --output-dir DIR"),
        (["--cmap", "viridi"], 2, "--colormap 'viridi' is not a matplotlib colormap; did you mean 'viridis'"),
        (["--layers", "convv"], 5, "layer 'convv' not found; did you mean 'conv'?"),
        (["--raw-format", "csv"], 2, "--raw-format 'csv' is not npy or npz"),
    ],
)
def test_user_errors(cli, user_py, args, code, message):
    r = cli(["activations", f"{user_py}:Small", "--input-size", "3x8x8", *args])
    assert r.exit_code == code
    assert r.stderr.startswith("error: ") and message in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


@pytest.mark.parametrize("command", ["activations", "summary"])
@pytest.mark.parametrize("flag", ["-o", "--tensorboard"])
def test_a_dash_is_not_a_folder(cli, user_py, tmp_path, monkeypatch, command, flag):
    """``-o -`` reads as "to stdout" in other tools: here it is a usage error, not a folder
    named '-' in the working directory (its full path still names one)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    r = cli([command, f"{user_py}:Small", "--input-size", "3x8x8", flag, "-"])
    name = "--output-dir" if flag == "-o" else flag
    assert r.exit_code == 2 and r.stderr.startswith(f"error: {name} takes a folder, not '-'"), r.stderr
    assert r.stdout == "" and list(work.iterdir()) == []
    r = cli([command, f"{user_py}:Small", "--input-size", "3x8x8", flag, str(work / "-"), "-q"])
    assert r.exit_code == 0, r.stderr
    assert (work / "-").is_dir()


def test_channel_out_of_range_names_the_layer(cli, user_py, tmp_path):
    out = tmp_path / "o"
    r = cli(["activations", f"{user_py}:Small", "--input-size", "3x8x8", "--layers", "conv",
             "--channels", "9", "-o", str(out)])
    assert r.exit_code == 2
    assert "error: --channels 9: layer 'conv' has 4 channels (0..3)" in r.stderr
    assert not out.exists()  # all-or-nothing output directory


def test_cli_module_does_not_import_torch():
    code = "import sys, inspect_model.cli.app; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("kind", ["positive", "negative", "relu", "mixed", "split", "mixed-large"])
def test_zero_and_negative_counts_on_every_sign_path(kind: str) -> None:
    """The measurement counts zeros and negatives four ways (from min/max alone, one sign()
    sum after a ReLU, one packed sum for cells under 4096 values, two sums for larger cells);
    each agrees with counting directly, per image, per channel and overall."""
    g = torch.Generator().manual_seed(7)
    t = torch.randn(4, 6, 5, 5, generator=g) if kind != "mixed-large" else torch.randn(4, 3, 64, 65, generator=g)
    if kind.startswith("mixed"):  # zeros among positives and negatives
        t[t.abs() < 0.3] = 0.0
    t = {"positive": t.abs() + 0.1, "negative": -t.abs() - 0.1, "relu": torch.relu(t)}.get(kind, t)
    if kind == "split":  # some channels all positive, others all negative: no zero anywhere
        t = t.abs() + 0.1
        t[:, ::2] *= -1
    m = measure(t, 4)
    assert_stats_match(m.total().stats(), t)
    for i in range(4):
        assert_stats_match(m.samples[i].stats(), t[i:i + 1])
    dead = (t == 0).flatten(2).all(2).all(0)
    assert bool(m.channels[1].dead.eq(dead).all())


def test_half_precision_and_integer_outputs_are_measured_exactly() -> None:
    """float16/bfloat16 outputs are reduced without a float32 copy (float32 accumulators) and
    integer outputs through a float64 copy: both agree with a direct float64 computation."""
    g = torch.Generator().manual_seed(5)
    base = torch.randn(3, 4, 6, 6, generator=g)
    base[0, 1] = 0.0
    for t in (base.half(), base.bfloat16(), torch.relu(base).half(), (base * 4).round().to(torch.int32)):
        m = measure(t, 3)
        assert_stats_match(m.total().stats(), t.double())
        assert m.channels[1].dead.tolist() == [False, False, False, False]


def test_float32_values_whose_squares_overflow_are_measured_exactly() -> None:
    """Finite float32 values near 1e20 overflow a float32 sum of squares: such chunks are
    measured through float64 (same numbers as a direct float64 computation), mixed in one
    layer with ordinary channels, per image and per channel."""
    from inspect_model.methods.activations import measure as stats

    g = torch.Generator().manual_seed(3)
    t = torch.randn(2, 12, 5, 5, generator=g)
    t[:, 9:] *= 1e20
    old = stats.CHUNK_ELEMENTS
    stats.CHUNK_ELEMENTS = 2 * 25 * 3  # 3 channels per chunk: the last chunk overflows
    try:
        m = measure(t, 2)
    finally:
        stats.CHUNK_ELEMENTS = old
    assert_stats_match(m.total().stats(), t.double())
    for i in range(2):
        assert_stats_match(m.samples[i].stats(), t[i:i + 1].double())
    assert m.channels[1].means() == pytest.approx(t.double().mean((0, 2, 3)).tolist(), rel=1e-6)


def test_the_accelerator_order_of_the_reductions_gives_the_same_numbers() -> None:
    """On a GPU the chunks' paths are read back in one synchronisation (first passes queued,
    then second passes); on the CPU each chunk is finished at once. Same numbers either way,
    on every path (NaN/Inf, ReLU, mixed, all-positive channels), over several chunks."""
    from inspect_model.methods.activations import measure as stats

    g = torch.Generator().manual_seed(11)
    t = torch.randn(3, 40, 9, 9, generator=g)
    t[:, :10] = torch.relu(t[:, :10])
    t[:, 10:20] = t[:, 10:20].abs() + 1
    t[1, 25, 2, 2] = float("nan")
    t[2, 33, 0, 0] = float("-inf")
    old = stats.CHUNK_ELEMENTS
    stats.CHUNK_ELEMENTS = 3 * 81 * 4  # 4 channels per chunk: 10 chunks
    try:
        now = stats._reduce_nc(t, 1, deferred=False)
        later = stats._reduce_nc(t, 1, deferred=True)
    finally:
        stats.CHUNK_ELEMENTS = old
    for a, b in zip(now, later):
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
    assert now[7].sum() == 1 and now[8].sum() == 1  # one NaN, one Inf, found in their chunks
