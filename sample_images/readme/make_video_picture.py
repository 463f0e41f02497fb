"""Regenerates sample_images/readme/video_gradcam_strip.png with the real `cam` command.

Offline there are no Kinetics weights, so a tiny 3-D CNN learns here, in seconds, whether a
square moves left or right; `inspect-model cam` then explains a video of a square moving
right. Its Grad-CAM over (T, H, W) must follow the square from frame to frame.
Run from the repo root: python sample_images/readme/make_video_picture.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

NET = '''
from torch import nn


def build():
    return nn.Sequential(nn.Conv3d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv3d(8, 16, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(16, 2))
'''


def clips(n: int, g: torch.Generator, T: int = 8, S: int = 32, SQ: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.rand(n, 3, T, S, S, generator=g) * 0.15 + 0.1
    y = torch.randint(0, 2, (n,), generator=g)
    for i in range(n):
        r = int(torch.randint(0, S - SQ, (1,), generator=g))
        c0 = int(torch.randint(0, S - SQ - 2 * T + 2, (1,), generator=g))
        for t in range(T):
            c = c0 + 2 * t if y[i] == 1 else c0 + 2 * (T - 1 - t)
            x[i, :, t, r:r + SQ, c:c + SQ] = torch.tensor([0.9, 0.8, 0.15])[:, None, None]
    return x, y


def main() -> None:
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "tests"))
    from fixtures.videos import moving_square, write_video

    tmp = Path(tempfile.mkdtemp())
    (tmp / "tiny3d.py").write_text(NET)
    ns: dict[str, object] = {}
    exec(NET, ns)
    torch.manual_seed(0)
    net = ns["build"]()  # type: ignore[operator]
    opt = torch.optim.Adam(net.parameters(), 3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(150):
        x, y = clips(16, g)
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    x, y = clips(64, torch.Generator().manual_seed(1))
    print(f"trained: loss {float(loss.detach()):.3f}, accuracy {float((net(x).argmax(1) == y).float().mean().detach()):.2f}")
    torch.save(net.state_dict(), tmp / "tiny3d.pt")
    frames = [np.ascontiguousarray(f) for f in moving_square(16, size=(96, 128), side=24, step=6, start=2)]
    write_video(tmp / "square.mp4", frames, fps=8)
    out = tmp / "cams"
    subprocess.run(["inspect-model", "cam", f"{tmp}/tiny3d.py:build", "--checkpoint", str(tmp / "tiny3d.pt"),
                    str(tmp / "square.mp4"), "--frames", "8", "--resize", "32", "--crop", "32",
                    "--mean", "0,0,0", "--std", "1,1,1", "--layer", "2", "-o", str(out), "--quiet"], check=True)
    strip = next(out.rglob("gradcam.*.strip.png"))
    shutil.copy(strip, root / "sample_images" / "readme" / "video_gradcam_strip.png")
    shutil.copy(next(out.rglob("gradcam.*.overlay.gif")), root / "sample_images" / "readme" / "video_gradcam.gif")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
