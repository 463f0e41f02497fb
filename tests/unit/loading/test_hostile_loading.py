"""Hostile files at the loading edge (issue 28, items 4 and 9): zip bombs and forged sizes in
every torch file the tool reads, deeply nested JSON and TOML. Each is one line and a
distinct exit code, decided before torch allocates anything."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

from inspect_model.errors import InputError
from inspect_model.loading.archive_guard import SizeBudget, check_sizes, legacy_declared_bytes

BOMB = 96 * 2**20  # inflates to 96 MiB: far over what a tiny model's checkpoint needs


def bomb_like(src: Path, dst: Path, inflate: int = BOMB) -> Path:
    """A copy of the torch zip archive ``src`` with one extra deflated record of ``inflate``
    bytes (the file stays small)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info, zin.read(info.filename))
        root = zin.namelist()[0].split("/")[0]
        info = zipfile.ZipInfo(f"{root}/data/99")
        info.compress_type = zipfile.ZIP_DEFLATED
        with zout.open(info, "w", force_zip64=True) as fh:  # written deflated by zipfile itself
            chunk = bytes(2**20)
            for _ in range(inflate // len(chunk)):
                fh.write(chunk)
    return dst


@pytest.fixture
def no_torch_load(monkeypatch):
    """torch.load must not run: the guard decides from the central directory alone."""
    def refuse(*a, **k):
        raise AssertionError("torch.load was called on a hostile file")

    monkeypatch.setattr(torch, "load", refuse)


def test_zip_bomb_checkpoint_is_refused_before_torch_reads_it(tmp_path: Path, models_py: Path, cli,
                                                              monkeypatch) -> None:
    from fixtures.models import TinyCNN

    good = tmp_path / "good.pt"
    torch.save(TinyCNN().state_dict(), good)
    bomb = bomb_like(good, tmp_path / "bomb.pt")
    assert bomb.stat().st_size < 2 * 2**20
    real_load = torch.load
    calls: list[str] = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append(str(a[0])) or real_load(*a, **k))
    r = cli(["summary", f"{models_py}:TinyCNN", "--checkpoint", str(bomb), "--input-size", "3x8x8"])
    assert r.exit_code == 4, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "bomb.pt" in line and "would inflate" in line and "zip bomb" in line, line
    assert "what the model's tensors need" in line and calls == []
    # The honest checkpoint still loads.
    r = cli(["summary", f"{models_py}:TinyCNN", "--checkpoint", str(good), "--input-size", "3x8x8"])
    assert r.exit_code == 0, r.stderr


def test_many_small_compressed_records_are_bounded_together(tmp_path: Path) -> None:
    model = nn.Linear(4, 4)
    good = tmp_path / "good.pt"
    torch.save(model.state_dict(), good)
    dst = tmp_path / "many.pt"
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info, zin.read(info.filename))
        for i in range(8):  # each under the per-record bound, together over the total
            info = zipfile.ZipInfo(f"good/data/x{i}")
            info.compress_type = zipfile.ZIP_DEFLATED
            zout.writestr(info, bytes(20 * 2**20))
    budget = SizeBudget.for_model(model)
    with pytest.raises(InputError, match="compressed records would inflate to 160.0 MiB"):
        check_sizes(str(dst), budget)


def test_forged_stored_record_size_is_refused(tmp_path: Path, no_torch_load) -> None:
    from inspect_model.loading import checkpoints

    good = tmp_path / "good.pt"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("good/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("good/data/0", bytes(16))
    data = bytearray(buf.getvalue())
    # The central directory's uncompressed size of data/0: claim 4 GiB for 16 stored bytes.
    cd = data.rfind(b"PK\x01\x02")
    name_at = data.find(b"good/data/0", cd)
    entry = data.rfind(b"PK\x01\x02", 0, name_at)
    data[entry + 24:entry + 28] = (2**32 - 2).to_bytes(4, "little")
    good.write_bytes(bytes(data))
    with pytest.raises(InputError, match="claims 4294967294 bytes but stores 16"):
        checkpoints.read_checkpoint(str(good))


def test_forged_legacy_checkpoint_is_refused(tmp_path: Path, models_py: Path, cli, no_torch_load) -> None:
    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.zeros(1000, dtype=torch.float64)}, legacy, _use_new_zipfile_serialization=False)
    assert legacy_declared_bytes(str(legacy)) == 8000  # read from the pickle, nothing run
    raw = legacy.read_bytes()
    numel = b"M\xe8\x03"  # BININT2 1000 in the pickle's storage declaration
    assert raw.count(numel) == 2  # the storage's size, then the tensor's shape
    legacy.write_bytes(raw.replace(numel, b"J" + (2**31 - 1).to_bytes(4, "little"), 1))
    r = cli(["summary", f"{models_py}:TinyCNN", "--checkpoint", str(legacy), "--input-size", "3x8x8"])
    assert r.exit_code == 4 and "declares 16,384.0 MiB of tensors" in r.stderr, r.stderr


def test_zip_bomb_model_file_and_inputs_file(tmp_path: Path, models_py: Path, cli, no_torch_load) -> None:
    src = tmp_path / "whole.pt"
    with zipfile.ZipFile(src, "w") as z:  # any torch-like archive
        z.writestr("whole/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("whole/byteorder", b"little")
    bomb = bomb_like(src, tmp_path / "bomb_model.pt")
    r = cli(["summary", str(bomb), "--trust-checkpoint"])
    assert r.exit_code == 4 and "would inflate" in r.stderr and "four times the file's size" in r.stderr, r.stderr
    inputs = bomb_like(src, tmp_path / "inputs.pt")
    r = cli(["activations", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "--inputs-file", str(inputs)])
    assert r.exit_code == 4 and "inputs file" in r.stderr and "would inflate" in r.stderr, r.stderr


def test_ordinary_torch_files_pass_the_size_guard(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Linear(8, 4))
    for name, obj, kw in (("sd.pt", model.state_dict(), {}),
                          ("opt.pt", {"model": model.state_dict(),
                                      "optimizer": torch.optim.Adam(model.parameters()).state_dict()}, {}),
                          ("legacy.pt", model.state_dict(), {"_use_new_zipfile_serialization": False}),
                          ("double.pt", {k: v.double() for k, v in model.state_dict().items()}, {})):
        torch.save(obj, tmp_path / name, **kw)
        check_sizes(str(tmp_path / name), SizeBudget.for_model(model))
        check_sizes(str(tmp_path / name))


# ---------------------------------------------------------------- deep nesting (item 9)
DEEP = ["[" * 100000 + "]" * 100000, "[" * 900 + "]" * 900, '{"a": ' * 50000 + "1" + "}" * 50000]


@pytest.mark.parametrize("text", DEEP, ids=["deep-list", "under-the-limit", "deep-object"])
def test_deep_labels_file(tmp_path: Path, models_py: Path, cli, text: str) -> None:
    labels = tmp_path / "labels.json"
    labels.write_text(text)
    r = cli(["cam", f"{models_py}:TinyCNN", "--input-size", "3x16x16", "--labels", str(labels)])
    assert r.exit_code == 4, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "labels file" in lines[0] and "deep" in lines[0], r.stderr


@pytest.mark.parametrize("text", DEEP, ids=["deep-list", "under-the-limit", "deep-object"])
def test_deep_boxes_file(tmp_path: Path, text: str) -> None:
    from inspect_model.loading.boxes import load_boxes

    boxes = tmp_path / "boxes.json"
    boxes.write_text(text)
    with pytest.raises(InputError, match="boxes file .* deep"):
        load_boxes(boxes)


def test_deep_hub_configs_are_one_line(tmp_path: Path, cli) -> None:
    pytest.importorskip("transformers")
    folder = tmp_path / "deep"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "vit", "x": ' + "[" * 5000 + "]" * 5000 + "}")
    r = cli(["summary", str(folder)])
    assert r.exit_code in (3, 4), r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "deep" in lines[0], r.stderr


def test_deep_json_helpers() -> None:
    from inspect_model.errors import UsageError
    from inspect_model.loading.parsing import MAX_DEPTH, check_depth, loads_json, loads_toml

    assert check_depth(json.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH), "x") is not None
    with pytest.raises(InputError, match="deeper than 64"):
        loads_json("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "x")
    with pytest.raises(UsageError, match="too deeply"):
        loads_toml("a = " + "[" * 100000 + "]" * 100000, "config", error=UsageError)


def test_zip_bomb_inside_an_exported_program(tmp_path: Path) -> None:
    """An archive stored inside a .pt2 (sample inputs) is sized before it is tried."""
    from inspect_model.loading.sources import load_model

    model = nn.Sequential(nn.Linear(4, 3)).eval()
    good = tmp_path / "net.pt2"
    torch.export.save(torch.export.export(model, (torch.rand(2, 4),)), str(good))
    inner_src = tmp_path / "inner.pt"
    torch.save(torch.zeros(2), inner_src)
    inner = bomb_like(inner_src, tmp_path / "inner_bomb.pt").read_bytes()
    evil = tmp_path / "evil.pt2"
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(evil, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info, zin.read(info.filename))
        root = zin.namelist()[0].split("/")[0]
        zout.writestr(f"{root}/data/sample_inputs/extra.pt", inner)
    assert load_model(str(good)).source == "export"
    with pytest.raises(InputError, match=r"entry 'data/sample_inputs/extra.pt': record .* would inflate"):
        load_model(str(evil))
