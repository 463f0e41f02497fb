"""Output directories a pipeline can trust (issue 3, issue 9): all files of a run or none,
no mixing into another run's directory, names that cannot escape."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from inspect_model.errors import EXIT_OUTPUT, OutputError
from inspect_model.output.files import OutputDir, safe_name


def listing(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def test_commit_writes_everything(tmp_path: Path) -> None:
    out = OutputDir(tmp_path / "run").prepare()
    out.write_text("a.txt", "A")
    out.write_bytes("sub/b.bin", b"\x00\x01")
    out.write_text("a.txt", "A2")  # the same name twice: the last write wins, listed once
    # Before commit only the hidden staging folder exists: a reader sees no half run.
    assert [p.name.startswith(OutputDir.MARKER) for p in (tmp_path / "run").iterdir()] == [True]
    files = out.commit()
    assert files == [str(tmp_path / "run" / "a.txt"), str(tmp_path / "run" / "sub" / "b.bin")]
    assert listing(tmp_path / "run") == ["a.txt", "sub", "sub/b.bin"]
    assert (tmp_path / "run" / "a.txt").read_text() == "A2"


def test_refuses_non_empty_dir_without_force(tmp_path: Path) -> None:
    d = tmp_path / "old"
    d.mkdir()
    (d / "keep.png").write_bytes(b"old")
    with pytest.raises(OutputError, match=r"'.*old' is not empty \(1 entries\); pass --force"):
        OutputDir(d).prepare()
    out = OutputDir(d, force=True).prepare()
    out.write_text("keep.png", "new")
    out.commit()
    assert (d / "keep.png").read_text() == "new" and listing(d) == ["keep.png"]


def test_output_dir_that_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(OutputError, match="is a file; choose another --output-dir"):
        OutputDir(f).prepare()
    with pytest.raises(OutputError, match="lies under a file"):
        OutputDir(f / "sub").prepare()
    assert f.read_text() == "x"


def test_no_write_permission(tmp_path: Path) -> None:
    d = tmp_path / "ro"
    d.mkdir()
    os.chmod(d, 0o500)
    try:
        if os.access(d, os.W_OK):
            pytest.skip("running as root: permissions are not enforced")
        with pytest.raises(OutputError, match="is not writable"):
            OutputDir(d).prepare()
        with pytest.raises(OutputError, match="cannot create output directory"):
            OutputDir(d / "new").prepare()
    finally:
        os.chmod(d, 0o700)


def test_abort_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "run"
    out = OutputDir(target).prepare()
    out.write_text("x.txt", "x")
    out.abort()
    assert listing(tmp_path) == []  # the folders this run created are gone, parents included
    d = tmp_path / "existing"
    d.mkdir()
    (d / "mine.txt").write_text("keep")
    with pytest.raises(RuntimeError), OutputDir(d, force=True) as out:
        out.write_text("new.txt", "n")
        raise RuntimeError("the run failed")
    assert listing(d) == ["mine.txt"] and (d / "mine.txt").read_text() == "keep"


def test_disk_full_while_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = OutputDir(tmp_path / "run").prepare()
    out.write_text("first.txt", "ok")
    real_open = open

    class FullFile:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.fh.close()

        def write(self, data):
            self.fh.write(data[: len(data) // 2])  # half of it lands, then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def full_open(path, mode="r", *a, **k):
        fh = real_open(path, mode, *a, **k)
        return FullFile(fh) if "w" in mode else fh

    monkeypatch.setattr("builtins.open", full_open)
    with pytest.raises(OutputError, match="cannot write '.*second.txt': No space left on device"):
        out.write_text("second.txt", "a" * 1000)
    monkeypatch.undo()
    out.abort()
    assert not (tmp_path / "run").exists()


def test_failed_commit_rolls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "run"
    d.mkdir()
    (d / "b.txt").write_text("previous")
    out = OutputDir(d, force=True).prepare()
    for name in ["a.txt", "b.txt", "c.txt"]:
        out.write_text(name, f"new {name}")
    real_replace = os.replace
    calls = {"n": 0}

    def flaky_replace(src, dst):
        if Path(dst).name == "c.txt":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        calls["n"] += 1
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", flaky_replace)
    with pytest.raises(OutputError, match="cannot move outputs"):
        out.commit()
    monkeypatch.undo()
    assert calls["n"] >= 2  # a.txt and b.txt had been moved before c.txt failed
    assert listing(d) == ["b.txt"] and (d / "b.txt").read_text() == "previous"


@pytest.mark.parametrize("name", ["../../etc", "../../etc/passwd", "/etc/passwd", "..", "a/../../b",
                                  "layer4.0/conv1", "con", "\\..\\..\\win", ".hidden"])
def test_names_cannot_escape(tmp_path: Path, name: str) -> None:
    root = tmp_path / "run"
    out = OutputDir(root).prepare()
    try:
        written = out.write_text(name, "x") if name != ".." else None
    except OutputError:
        written = None
    if written is not None:
        final = Path(written).resolve()
        assert root.resolve() in final.parents
    out.commit()
    for p in tmp_path.rglob("*"):
        assert p == root or root in p.parents
    assert not Path("/etc/inspect-model-test").exists()


def test_safe_name() -> None:
    # A cleaned name keeps a readable prefix and gains a hash of the original.
    assert re.fullmatch(r"etc-[0-9a-f]{8}", safe_name("../../etc"))
    assert safe_name("layer4.0.conv1") == "layer4.0.conv1"
    assert re.fullmatch(r"a_b_c_d-[0-9a-f]{8}", safe_name("a b/c:d"))
    assert safe_name("..").startswith("x-") and safe_name("").startswith("x-")
    assert safe_name("CON").startswith("_CON-")
    assert "/" not in safe_name("x/" * 200) and len(safe_name("y" * 500)) == 120
    # Letters of any script stay; file systems count bytes, so the cap is in UTF-8 bytes.
    assert safe_name("ünïcödé") == "ünïcödé" and safe_name("猫の写真") == "猫の写真"
    long = safe_name("猫" * 100)
    assert len(long.encode("utf-8")) <= 120 and long.startswith("猫" * 37) and re.search(r"-[0-9a-f]{8}$", long)
    assert re.fullmatch(r"emoji-[0-9a-f]{8}", safe_name("emoji\U0001F600"))  # symbols are not letters
    assert safe_name("cafe\u0301").startswith("café-")  # composed (NFC): one name for both spellings


def test_picture_folders_keep_unicode_names(cli, models_py: Path, tmp_path: Path) -> None:
    from PIL import Image

    src = tmp_path / "猫の写真.png"
    Image.new("RGB", (40, 30), (120, 60, 30)).save(src)
    out = tmp_path / "out"
    r = cli(["cam", f"{models_py}:TinyCNN", str(src), "--resize", "32", "--crop", "32", "-o", str(out)])
    assert r.exit_code == 0, r.stderr
    folder = out / "images" / "0000-猫の写真"
    assert folder.is_dir() and any(folder.glob("*.overlay.png"))
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "0000-猫の写真/" in html


def test_symlink_inside_cannot_lead_out(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "run"
    root.mkdir()
    (root / "maps").symlink_to(outside)
    out = OutputDir(root, force=True).prepare()
    with pytest.raises(OutputError, match="escapes the output directory"):
        out.write_text("maps/x.png", "x")
    out.abort()
    assert listing(outside) == []


def test_cli_output_dir_errors(tmp_path: Path, models_py: Path, cli) -> None:
    f = tmp_path / "taken"
    f.write_text("x")
    res = cli(["summary", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "-o", str(f)])
    assert res.exit_code == EXIT_OUTPUT and "is a file" in res.stderr and "Traceback" not in res.stderr
    d = tmp_path / "d"
    d.mkdir()
    (d / "other.txt").write_text("x")
    res = cli(["summary", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "-o", str(d)])
    assert res.exit_code == EXIT_OUTPUT and "--force" in res.stderr
    assert listing(d) == ["other.txt"]
    res = cli(["summary", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "-o", str(tmp_path / "new")])
    assert res.exit_code == 0, res.stderr
    assert listing(tmp_path / "new") == ["report.html", "report.json", "report.txt"]
    # A failing run (a model that raises) leaves no directory behind.
    res = cli(["summary", f"{models_py}:Boom", "--input-size", "4", "--device", "cpu", "-o", str(tmp_path / "fail")])
    assert res.exit_code != 0
    assert not (tmp_path / "fail").exists() or listing(tmp_path / "fail") == []


def test_names_that_clean_to_the_same_file_do_not_overwrite(tmp_path: Path) -> None:
    from inspect_model.output.files import OutputDir, safe_name

    assert safe_name("layer4.1.conv2") == "layer4.1.conv2"  # clean names stay as they are
    assert safe_name("a/b") != safe_name("a_b") == "a_b"
    out = OutputDir(tmp_path / "o").prepare()
    a = out.write_text(f"grids/{safe_name('a/b')}.png", "first")
    b = out.write_text(f"grids/{safe_name('a_b')}.png", "second")
    out.commit()
    assert a != b and Path(a).read_text() == "first" and Path(b).read_text() == "second"
