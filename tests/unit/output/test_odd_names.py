"""Names may hold any bytes a file system allows (issue 28.5): a newline, a tab, an ESC, a
bidi override or bytes that are not UTF-8 in an image, class, layer or model name. Every
command with -o writes every picture and report; pictures and text show the name escaped on
one line, JSON keeps it exact (surrogateescape, README "Security")."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

NAMES = [b"new\nline.png", b"tab\tand\x1bescape.png", "bidi\u202eright.png".encode(), b"bad\xff\xfename.png"]
LABELS = ["cat\nline", "dog\x1b[31m", "bird\u202e", "fish\t", "ant"]


@pytest.fixture
def odd(tmp_path: Path) -> tuple[Path, list[str], Path]:
    from PIL import Image

    folder = tmp_path / "odd"
    folder.mkdir()
    rng = np.random.default_rng(0)
    names = []
    for raw in NAMES:
        path = os.fsencode(folder) + b"/" + raw
        try:
            Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(os.fsdecode(path), format="PNG")
        except (OSError, UnicodeError):  # a file system that refuses the name (not UTF-8 on macOS)
            continue
        names.append(os.fsdecode(path))
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps(LABELS))
    return folder, names, labels


def _escaped(name: str) -> str:
    from inspect_model.render.table import one_line

    return one_line(name)


@pytest.mark.parametrize("command", ["activations", "grads", "guided-backprop", "cam", "check"])
def test_every_command_writes_every_file_for_odd_names(cli, models_py: Path, odd: tuple[Path, list[str], Path],
                                                       tmp_path: Path, command: str) -> None:
    folder, names, labels = odd
    assert len(names) >= 3
    out = tmp_path / f"out-{command}"
    extra = {"activations": ["--layer", "features.0"], "check": [],
             "grads": ["--labels", str(labels)], "guided-backprop": ["--labels", str(labels), "--target", "top:2"],
             "cam": ["--labels", str(labels), "--target", "top:2"]}[command]
    res = cli([command, f"{models_py}:TinyCNN", str(folder), "--weights", "none", "--resize", "16", "--crop", "16",
               "-o", str(out), *extra])
    assert res.exit_code == 0, res.stderr
    doc = json.loads((out / "report.json").read_text(encoding="utf-8"))
    txt = (out / "report.txt").read_text(encoding="utf-8")  # valid UTF-8: no lone surrogate written
    page = (out / "report.html").read_text(encoding="utf-8")
    for f in doc["files"]:
        assert (out / f).is_file(), f
        if f.endswith(".png"):
            from PIL import Image

            with Image.open(out / f) as im:
                im.verify()
    if command != "check":
        assert sorted(i["image"] for i in doc["images"]) == sorted(names)  # exact, surrogate escapes kept
        shown = [n for n in names if "\n" in n]
        for n in shown:
            assert "\n" not in _escaped(n) and (_escaped(n) in page or command == "grads")
            if command in ("cam", "guided-backprop"):
                assert _escaped(n) in txt
    assert not any(line.startswith("line.png") for line in txt.splitlines())  # no name split over lines
    if command in ("cam", "guided-backprop"):
        labels_seen = {m["target"]["label"] for i in doc["images"] for m in i["maps"]}
        assert {"cat\nline", "dog\x1b[31m"} <= labels_seen  # class names exact in JSON
        assert "cat\\x0aline" in txt and "\x1b" not in txt
    if any(b"\xff" in os.fsencode(n) for n in names) and command not in ("check", "grads"):
        assert "bad\\xff\\xfename.png" in txt + page
        assert b"\\udcff" in (out / "report.json").read_bytes()


def test_json_round_trips_file_name_bytes(cli, models_py: Path, odd: tuple[Path, list[str], Path]) -> None:
    folder, names, _ = odd
    res = cli(["cam", f"{models_py}:TinyCNN", str(folder), "--weights", "none", "--resize", "16", "--json"])
    assert res.exit_code == 0, res.stderr
    got = {os.fsencode(i["image"]) for i in json.loads(res.stdout)["images"]}
    assert got == {os.fsencode(n) for n in names}


def test_one_line_escapes() -> None:
    from inspect_model.render.table import clean, one_line

    assert one_line("a\nb\tc\x1b\u202e\udcff\ud800") == "a\\x0ab\\x09c\\x1b\\u202e\\xff\\ud800"
    assert clean("a\nb\udcfe") == "a\nb\\xfe"  # multi-line text keeps its lines


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file names")
def test_odd_model_file_name_in_summary(cli, tmp_path: Path) -> None:
    src = (Path(__file__).resolve().parents[2] / "fixtures" / "models.py").read_text()
    d = tmp_path / "we\nird\x1b"
    d.mkdir()
    (d / "models.py").write_text(src)
    out = tmp_path / "s"
    res = cli(["summary", f"{d / 'models.py'}:TinyCNN", "--input-size", "3x8x8", "-o", str(out)])
    assert res.exit_code == 0, res.stderr
    txt = (out / "report.txt").read_text(encoding="utf-8")
    assert "\x1b" not in txt and "\x1b" not in (out / "report.html").read_text(encoding="utf-8")
