"""summary: totals against hand-computed values, invariants, failures, golden reports, CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from fixtures.models import Boom, ReusedReLU, TiedLinear, TinyCNN, assert_unchanged, model_state
from inspect_model.api import summary

GOLDEN = Path(__file__).parents[1] / "golden"


def test_tiny_cnn_totals_match_hand_computation() -> None:
    res = summary(TinyCNN(), input_size=["3x8x8"])
    # conv 3->8 k3 on 8x8: 8*8*8 outputs x 3*3*3 MACs; conv 8->16: 16*8*8 x 8*3*3; fc 16->5.
    assert res.total_macs == 8 * 8 * 8 * 27 + 16 * 8 * 8 * 72 + 16 * 5
    assert res.total_params == (8 * 27 + 8) + 16 + (16 * 72 + 16) + (16 * 5 + 5)
    rows = {r.name: r for r in res.rows}
    assert rows["features.0"].macs == 13824 and rows["features.0"].params == 224
    assert rows["fc"].output_shapes == ((1, 5),)
    assert rows["features.3"].output_shapes == ((1, 16, 8, 8),)
    assert res.device == "meta"
    # Invariants: rows add up to the totals.
    assert sum(r.params for r in res.rows) == res.total_params
    assert sum(r.macs for r in res.rows) == res.total_macs


def test_batch_size_scales_macs_not_params() -> None:
    one = summary(TinyCNN(), input_size=["3x8x8"])
    four = summary(TinyCNN(), input_size=["3x8x8"], batch_size=4)
    assert four.total_macs == 4 * one.total_macs
    assert four.total_params == one.total_params
    assert four.activation_bytes == 4 * one.activation_bytes


def test_linear_and_matmul_macs_count_functional_ops() -> None:
    class Functional(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(7, 5))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.nn.functional.linear(x, self.w)  # (N, 3, 7): 3*5*7 MACs per sample
            return torch.matmul(y, y.transpose(1, 2))  # (N, 3, 3): 3*3*7 per sample

    res = summary(Functional(), input_size=["3x5"], batch_size=2)
    assert res.total_macs == 2 * (3 * 5 * 7 + 3 * 3 * 7)


def test_tied_weights_counted_once() -> None:
    res = summary(TiedLinear(), input_size=["6"])
    assert res.total_params == 36
    rows = {r.name: r for r in res.rows}
    assert rows["enc"].params == 36
    assert rows["dec"].params == 0 and rows["dec"].tied_to == "enc"
    assert sum(r.params for r in res.rows) == 36


def test_reused_module_has_one_row_with_call_count() -> None:
    res = summary(ReusedReLU(), input_size=["4"])
    rows = {r.name: r for r in res.rows}
    assert rows["relu"].calls == 2
    assert rows["fc1"].calls == 1


def test_forward_failure_keeps_rows_up_to_failing_layer_and_restores_model() -> None:
    m = Boom()
    before = model_state(m)
    res = summary(m, input_size=["4"], device="cpu")
    assert res.failed_layer == "c"
    assert "boom" in (res.error or "")
    names = [r.name for r in res.rows]
    assert names == ["", "a", "b", "c"]
    assert {r.name: r.status for r in res.rows}["c"] == "failed"
    assert_unchanged(m, before)


def test_meta_summary_leaves_user_weights_untouched() -> None:
    m = TinyCNN()
    before = model_state(m)
    summary(m, input_size=["3x8x8"])
    assert_unchanged(m, before)
    assert next(m.parameters()).device.type == "cpu"


def test_depth_folds_subtrees() -> None:
    full = summary(TinyCNN(), input_size=["3x8x8"])
    folded = summary(TinyCNN(), input_size=["3x8x8"], depth=1)
    rows = {r.name: r for r in folded.rows}
    assert set(rows) == {"", "features", "pool", "fc"}
    assert rows["features"].folded
    assert rows["features"].macs == 13824 + 73728
    assert sum(r.params for r in folded.rows) == full.total_params
    assert sum(r.macs for r in folded.rows) == full.total_macs


def test_vit_b_16_counts_attention_macs() -> None:
    import torchvision

    with torch.device("meta"):
        m = torchvision.models.vit_b_16()
    res = summary(m, input_size=["3x224x224"])
    # torchinfo reports ~0.17 G because it misses functional attention; the real cost is ~17.6 G.
    assert 17.4e9 < res.total_macs < 17.7e9
    assert res.total_params == 86_567_656


def test_resnet50_known_values() -> None:
    res = summary("resnet50")
    assert res.total_params == 25_557_032
    assert abs(res.total_macs - 4.09e9) < 0.01e9  # torchvision's published 4.09 GFLOPS (MACs)
    assert res.device == "meta"


def _normalise(text: str) -> str:
    return text


@pytest.mark.parametrize("fmt", ["txt", "json"])
def test_golden_reports(cli, models_py: Path, update_golden: bool, fmt: str) -> None:
    args = ["summary", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "--batch-size", "2"]
    if fmt == "json":
        args.append("--json")
    r = cli(args)
    assert r.exit_code == 0, r.stderr
    out = r.stdout.replace(str(models_py), "MODELS.py")
    if fmt == "json":
        doc = json.loads(out)
        for key in ("tool_version", "torch_version", "torchvision_version", "python_version"):
            doc.pop(key, None)
        out = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    path = GOLDEN / f"summary_tinycnn.{fmt}"
    if update_golden or not path.exists():
        path.write_text(out)
    assert out == path.read_text()


def test_cli_json_has_required_fields(cli) -> None:
    r = cli(["summary", "resnet18", "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    for key in ("schema_version", "command", "model", "input_shapes", "total_params", "trainable_params",
                "total_macs", "layers", "tool_version", "torch_version", "options", "files"):
        assert key in doc
    assert doc["input_shapes"] == [[1, 3, 224, 224]]
    layer = doc["layers"][1]
    for key in ("name", "type", "depth", "output_shapes", "params", "macs"):
        assert key in layer
    assert sum(l["params"] for l in doc["layers"]) == doc["total_params"] == 11_689_512


def test_cli_plain_text_when_piped_has_no_escape_codes(cli) -> None:
    r = cli(["summary", "resnet18"])
    assert r.exit_code == 0
    assert "\x1b[" not in r.stdout
    assert not re.search("[\u2500-\u257f]", r.stdout)  # no box-drawing characters
    assert "layer4.1.conv2" in r.stdout
    assert "Total params: 11,689,512" in r.stdout


def test_cli_output_dir_writes_both_files(cli, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = cli(["summary", "resnet18", "--output-dir", str(out)])
    assert r.exit_code == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json", "report.txt"]
    doc = json.loads((out / "report.json").read_text())
    assert doc["files"] == ["report.html", "report.json", "report.txt"]


def test_cli_forward_failure_prints_rows_then_error(cli, models_py: Path) -> None:
    r = cli(["summary", f"{models_py}:Boom", "--input-size", "4", "--device", "cpu"])
    assert r.exit_code == 6
    assert r.stderr.strip().splitlines() == ["error: forward pass failed in layer 'c': RuntimeError: boom"]
    assert "FAILED" in r.stdout and " d " not in r.stdout


def test_cli_unknown_model_suggests(cli) -> None:
    r = cli(["summary", "resnet343"])
    assert r.exit_code == 3
    assert r.stderr.startswith("error: unknown model 'resnet343'; did you mean 'resnet34'")
    assert len(r.stderr.strip().splitlines()) == 1


def test_cli_wrong_channel_count_names_what_first_layer_expects(cli) -> None:
    r = cli(["summary", "resnet18", "--input-size", "1x64x64"])
    assert r.exit_code == 6
    assert "expects 3 input channels" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_cli_usage_errors_are_one_line_exit_2(cli) -> None:
    r = cli(["summary"])
    assert r.exit_code == 2
    assert r.stderr.startswith("error: Missing argument") and len(r.stderr.strip().splitlines()) == 1
    r = cli(["summary", "resnet18", "--no-such-option"])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    r = cli(["summary", "resnet18", "--input-size", "3xAx4"])
    assert r.exit_code == 2 and "3xAx4" in r.stderr
    r = cli(["summary", "resnet18", "--batch-size", "0"])
    assert r.exit_code == 2 and "batch" in r.stderr  # a bad option value is a usage error


def test_cli_bad_weights_name(cli) -> None:
    r = cli(["summary", "resnet50", "--weights", "IMAGENET1K_V9"])
    assert r.exit_code == 2
    assert "IMAGENET1K_V2" in r.stderr


def test_cli_offline_weights_error_names_cache_path(cli, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "th"))

    def no_network(*a, **k):
        raise OSError("network is unreachable")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    r = cli(["summary", "resnet18", "--weights", "DEFAULT"])
    assert r.exit_code == 3
    msg = r.stderr.strip()
    assert len(msg.splitlines()) == 1
    assert str(tmp_path / "th" / "hub" / "checkpoints" / "resnet18-f37072fd.pth") in msg
    assert "--weights none" in msg and "--checkpoint" in msg


def test_models_command_lists_and_filters(cli) -> None:
    r = cli(["models", "resnet*", "--json"])
    assert r.exit_code == 0
    names = [m["name"] for m in json.loads(r.stdout)["models"]]
    assert "resnet34" in names and all(n.startswith("resnet") for n in names)
    r = cli(["models", "--family", "video"])
    assert "r3d_18" in r.stdout and "resnet34" not in r.stdout
    r = cli(["models", "--family", "nope"])
    assert r.exit_code == 2


def _classification_models() -> list[str]:
    from inspect_model.loading.sources.torchvision import registry

    return [n for n, fam in registry().items() if fam == "classification"]


@pytest.mark.slow  # over 3 s: kept out of the quick tier
def test_summary_runs_on_every_classification_model() -> None:
    """Every classification model of torchvision's registry, on meta: rows add up, the
    output is (1, 1000), parameters equal a direct count on the same architecture, and the
    MACs equal torchvision's own published figure (``weights.meta["_ops"]``, GFLOPS that
    count one multiply-add as one, rounded to 3 decimals) wherever the input sizes match."""
    import warnings

    from torchvision import models

    from inspect_model.loading.sources.torchvision import load_torchvision

    names = _classification_models()
    assert len(names) >= 80
    failures = []
    compared = 0
    for name in names:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = load_torchvision(name, device="meta")
        res = summary(loaded)
        root = res.rows[0]
        ok = (
            res.error is None
            and res.device == "meta"
            and sum(r.params for r in res.rows) == res.total_params
            == sum(p.numel() for p in loaded.model.parameters())
            and sum(r.macs for r in res.rows) == res.total_macs > 0
            and root.output_shapes[0] == (1, 1000)
        )
        if not ok:
            failures.append(f"{name}: {res.error or res.device or root.output_shapes}")
        weights = models.get_model_weights(name).DEFAULT
        crop = weights.transforms().crop_size[0]
        if res.input_shapes == [[1, 3, crop, crop]]:
            compared += 1
            published = weights.meta["_ops"] * 1e9
            if abs(res.total_macs - published) > max(0.005 * published, 0.0005e9 + 1):
                failures.append(f"{name}: {res.total_macs / 1e9:.3f} GMACs, torchvision says {published / 1e9:.3f}")
    assert not failures, failures
    assert compared >= 75


# ------------------------------------------------------------------ train mode (issue 14)
class _BNDrop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.drop(self.bn(self.conv(x)).mean((2, 3))))


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_train_mode_summary_runs_in_training_and_changes_nothing(device: str) -> None:
    import inspect_model as im
    from fixtures.invariants import assert_same, snapshot

    model = _BNDrop().eval()
    model.bn.running_mean.fill_(0.25)  # not the defaults: a reset would show
    seen: list[tuple[bool, bool]] = []
    hook = model.drop.register_forward_hook(lambda m, a, o: seen.append((m.training, model.bn.training)))
    try:
        before = snapshot(model)
        res = im.summary(model, input_size=["3x8x8"], batch_size=2, train=True, device=device)
        assert seen == [(True, True)]  # dropout and batch norm ran as in training
        assert res.to_dict()["options"]["mode"] == "train"
        assert_same(model, before)  # running stats, batch count and flags bit-identical
        assert int(model.bn.num_batches_tracked) == 0 and not model.training
        seen.clear()
        assert im.summary(model, input_size=["3x8x8"], device=device).to_dict()["options"]["mode"] == "eval"
        assert seen == [(False, False)]
    finally:
        hook.remove()


def test_train_flag_on_the_cli(monkeypatch: pytest.MonkeyPatch, cli) -> None:
    from fixtures.invariants import register_model

    spec = register_model(monkeypatch, _BNDrop())
    res = cli(["summary", spec, "--input-size", "3x8x8", "--batch-size", "2", "--train", "--json", "--device", "cpu"])
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["options"]["mode"] == "train"
    assert "train mode" in res.stderr


def test_memory_error_in_summary_is_a_clear_exit_6(monkeypatch: pytest.MonkeyPatch, cli) -> None:
    from fixtures.invariants import register_model

    class OutOfMemory(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise MemoryError()

    res = cli(["summary", register_model(monkeypatch, OutOfMemory()), "--input-size", "4", "--device", "cpu", "-q"])
    assert res.exit_code == 6
    assert res.stderr.strip().splitlines() == [
        ("error: forward pass failed: out of CPU memory; use a smaller --batch-size or --input-size, "
         "or fewer/smaller images")]
