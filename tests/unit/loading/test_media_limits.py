"""Pixel and frame limits on every decoded picture and video (issue 41): the image limit is
every frame's limit, checked from the header; frames are downscaled as they are decoded so
that a clip's frames together take no more than one picture at the limit."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.videos import video_net_file
from inspect_model.errors import InputError
from inspect_model.loading.images import MAX_PIXELS
from inspect_model.loading.video import frame_budget, probe, read_frames

ROOT = Path(__file__).resolve().parents[3]


def gif(width: int, height: int, frames: int = 3, tile: int = 2) -> bytes:
    """A tiny GIF whose logical screen is ``width`` x ``height``, each frame a ``tile`` square."""
    b = bytearray(b"GIF89a" + struct.pack("<HH", width, height) + bytes([0xF0, 0, 0]) + bytes([0, 0, 0, 255, 255, 255]))
    b += b"\x21\xff\x0bNETSCAPE2.0\x03\x01\x00\x00\x00"
    for _ in range(frames):
        b += b"\x21\xf9\x04\x00\x0a\x00\x00\x00"  # 1/10 s a frame
        b += b"\x2c" + struct.pack("<HHHH", 0, 0, tile, tile) + b"\x00" + b"\x02\x02\x44\x01\x00"
    return bytes(b + b"\x3b")


def _one_error(res, code: int, *needles: str) -> str:  # type: ignore[no-untyped-def]
    lines = [ln for ln in res.stderr.strip().splitlines() if not ln.startswith("note: ")]
    assert "Traceback" not in res.stderr and len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "unexpected" not in lines[0] and res.exit_code == code, (res.exit_code, lines[0])
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def test_the_issue_example_a_200_byte_gif_declaring_12000_squared_is_refused(cli, tmp_path: Path) -> None:
    p = tmp_path / "bomb.gif"
    p.write_bytes(gif(12000, 12000))
    assert len(p.read_bytes()) < 200
    out = tmp_path / "never"
    r = cli(["activations", f"{video_net_file(tmp_path)}:build", str(p), "--frames", "2", "-o", str(out)])
    _one_error(r, 4, "12000x12000", "safety limit")
    assert not out.exists()


def test_the_limit_is_the_image_limit(tmp_path: Path) -> None:
    side = int(MAX_PIXELS ** 0.5) + 1  # just over: refused; the same number as a still image
    p = tmp_path / "over.gif"
    p.write_bytes(gif(side, side))
    with pytest.raises(InputError, match=f"{MAX_PIXELS:,}-pixel"):
        probe(p)
    q = tmp_path / "under.gif"
    q.write_bytes(gif(640, 480))
    assert (probe(q).width, probe(q).height) == (640, 480)


def test_a_folder_of_frames_over_the_limit_is_refused(tmp_path: Path) -> None:
    """A neighbour: frames as files. The first frame's header says its size."""
    folder = tmp_path / "frames"
    folder.mkdir()
    (folder / "f000.gif").write_bytes(gif(12000, 12000, frames=1))
    with pytest.raises(InputError, match="12000x12000"):
        probe(folder)


def test_frames_are_downscaled_as_decoded_to_share_one_picture_budget(tmp_path: Path) -> None:
    """40 frames of 4000x3000 (12 Mpx each, 480 Mpx in all) come back within one picture's
    budget: each at most MAX_PIXELS / 40 pixels, the aspect ratio kept."""
    p = tmp_path / "big.gif"
    p.write_bytes(gif(4000, 3000, frames=40))
    info = probe(p)
    frames = read_frames(info, list(range(40)))
    budget = frame_budget(40)
    assert len(frames) == 40 and budget < 4000 * 3000
    for f in frames:
        w, h = f.image.size
        assert w * h <= budget and abs(w / h - 4 / 3) < 0.01
    few = read_frames(info, [0, 1])  # within the budget: full size, unchanged
    assert all(f.image.size == (4000, 3000) for f in few)


def test_decoding_many_big_frames_stays_within_a_memory_limit(tmp_path: Path) -> None:
    """The frames kept never exceed the budget: decoding 60 frames of 4000x3000 (2.1 GB as
    RGB at full size) runs under a 1.5 GiB address-space limit."""
    p = tmp_path / "big.gif"
    p.write_bytes(gif(4000, 3000, frames=60))
    code = ("import resource, sys; from pathlib import Path\n"
            "from inspect_model.loading.video import probe, read_frames\n"
            "info = probe(Path(sys.argv[1]))\n"
            "resource.setrlimit(resource.RLIMIT_AS, (3 * 2**29, 3 * 2**29))\n"
            "fr = read_frames(info, list(range(60)))\n"
            "print(len(fr), sum(f.image.size[0] * f.image.size[1] for f in fr))\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, env=env, timeout=300,
                       check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    n, pixels = map(int, r.stdout.split())
    assert n == 60 and pixels <= MAX_PIXELS


@pytest.mark.parametrize("kind", ["fifo", "bomb"])
def test_frame_folders_read_headers_of_regular_files_only(kind: str, tmp_path: Path) -> None:
    """A neighbour: the first frame of a folder is sized from its header; a FIFO there would
    block in open(), a 12000x12000 header would warn (or be taken for no image)."""
    folder = tmp_path / "frames"
    folder.mkdir()
    first = folder / "f000.png"
    if kind == "fifo":
        os.mkfifo(first)
        with pytest.raises(InputError, match="not a regular file"):
            probe(folder)
    else:
        first.write_bytes(gif(12000, 12000, frames=1))
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no DecompressionBombWarning escapes
            with pytest.raises(InputError, match="12000x12000 pixels"):
                probe(folder)
