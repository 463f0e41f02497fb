"""Benchmark for video input (issue 25): decoding a clip costs less than the model's forward pass.

Writes a 1080p H.264 clip (96 frames, a key frame every 32, moving shapes) with PyAV's own
encoder, then times, in this process and on the same clip:

1. decoding 64 frames (:func:`inspect_model.loading.video.read_frames`, from a seek in the
   middle of the video: the tool's path);
2. the same plus the weights' video preprocessing (resize 128x171, crop 112, normalise);
3. r3d_18's forward pass (weights none) on those 64 preprocessed frames, (1, 3, 64, 112, 112).

Target: (1) < (3), i.e. the ratio decode / forward < 1. Medians of ``--repeat`` runs; the
thread count is torch's default unless ``--threads`` is given.

Run: python benchmarks/bench_video.py [--repeat N] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def write_clip(path: Path, frames: int = 96, size: tuple[int, int] = (1080, 1920)) -> Path:
    import av
    import numpy as np

    h, w = size
    yy, xx = np.mgrid[0:h, 0:w]
    base = ((xx * 255) // w).astype(np.uint8)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.options = {"g": "32", "preset": "veryfast", "crf": "23"}
        for i in range(frames):
            f = np.stack([base, np.roll(base, 8 * i, axis=1), ((yy * 255) // h).astype(np.uint8)], axis=-1)
            x0 = 40 + 12 * i
            f[400:700, x0:x0 + 300] = (250, 220, 30)
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def median_time(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    import torch
    from torchvision.models.video import r3d_18

    from inspect_model.loading.clips import video_preprocess
    from inspect_model.loading.models import load_torchvision
    from inspect_model.loading.video import clip_indices, probe, read_frames

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        path = write_clip(Path(tmp) / "clip1080p.mp4")
        print(f"wrote a 1080p clip of 96 frames in {time.perf_counter() - t0:.1f} s "
              f"({path.stat().st_size / 2**20:.1f} MiB)")
        info = probe(path)
        (idx,) = clip_indices(info.frames, 64, 1, 1)
        decode, frames = median_time(lambda: read_frames(info, idx), args.repeat)
        pre = video_preprocess(load_torchvision("r3d_18", weights=None, device="meta"))
        pics = [f.image for f in frames]  # type: ignore[union-attr]
        prep, x = median_time(lambda: pre(pics), args.repeat)
        model = r3d_18(weights=None).eval()
        batch = x[None]  # type: ignore[index]
        with torch.no_grad():
            model(batch[:, :, :8])  # warm-up
            forward, _ = median_time(lambda: model(batch), args.repeat)
    print(f"frames {idx[0]}..{idx[-1]} of {info.frames} ({info.width}x{info.height}), torch threads "
          f"{torch.get_num_threads()}, median of {args.repeat}")
    print(f"decode 64 frames (seek + decode):           {decode:7.3f} s")
    print(f"preprocess 64 frames (resize, crop, norm):  {prep:7.3f} s")
    print(f"r3d_18 forward on (1, 3, 64, 112, 112):     {forward:7.3f} s")
    print(f"ratio decode / forward:                     {decode / forward:7.2f}  (target < 1)")
    print(f"ratio (decode + preprocess) / forward:      {(decode + prep) / forward:7.2f}")


TITLE = "video"


def measure(ctx):  # type: ignore[no-untyped-def]
    """Decoding 64 frames of a 1080p H.264 clip from a seek against r3d_18's forward pass on
    them (issue 25: < 1x). Quick mode: 16 frames of 540p; smoke: 4 frames of 144p."""
    import tempfile

    import torch

    from common import Row, Target
    from inspect_model.loading.clips import video_preprocess
    from inspect_model.loading.models import load_torchvision
    from inspect_model.loading.video import clip_indices, probe, read_frames

    n, size = {"full": (64, (1080, 1920)), "quick": (16, (540, 960)), "smoke": (4, (144, 256))}[ctx.mode]
    with tempfile.TemporaryDirectory() as tmp:
        path = write_clip(Path(tmp) / "clip.mp4", frames=max(n + 32, 48), size=size)
        info = probe(path)
        (idx,) = clip_indices(info.frames, n, 1, 1)
        frames: list[Any] = []
        pre = video_preprocess(load_torchvision("r3d_18", weights=None, device="meta"))
        model = ctx.model("r3d_18")
        batch: list[Any] = []

        def decode() -> None:
            frames[:] = read_frames(info, idx)

        def forward() -> None:
            if not batch:
                batch.append(pre([f.image for f in frames])[None].to(ctx.device))
            with torch.no_grad():
                model(batch[0])

        decode()
        t = ctx.time({"ours": decode, "floor": forward})
    return [Row("video", f"decode {n} frames of {size[0]}p (seek + decode)", t["ours"], t["floor"],
                Target("ratio", 1.0, "< 1x the forward"), floor_what="r3d_18 forward on them")]


if __name__ == "__main__":
    main()
