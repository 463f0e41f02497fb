"""What every benchmark of ``benchmarks/run.py`` shares: the context it is given (device,
sizes, peers, timing), and the row it returns.

One argument convention: a benchmark module has ``measure(ctx: Context) -> list[Row]`` (and
a ``TITLE``). Timings are the best of ``ctx.repeats`` interleaved runs (floor, ours, peer,
floor, ...) after one warm-up run each, with the device synchronised before and after each
run, so load from other processes and the device's lazy start hit every contestant alike.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

PEERS = {"torchinfo": "torchinfo", "pytorch-grad-cam": "pytorch_grad_cam", "captum": "captum"}


@dataclass
class Target:
    """What a row must meet. ``kind``: "ratio" (ours / floor <= limit), "speedup" (peer /
    ours >= limit), "max" (ours <= limit, in the row's unit), "info" (no target)."""

    kind: str
    limit: float = 0.0
    text: str = ""

    def check(self, row: Row) -> bool | None:
        if self.kind == "ratio" and row.floor:
            return row.ours / row.floor <= self.limit
        if self.kind == "speedup":
            return None if row.peer is None else row.peer / row.ours >= self.limit
        if self.kind == "max":
            return row.ours <= self.limit
        return None


@dataclass
class Row:
    """One line of the table: ``ours``, ``floor`` and ``peer`` in ``unit`` (seconds unless
    said); the floor is what the work cannot avoid (a plain forward, + backward), measured
    in the same process on the same device."""

    bench: str
    work: str
    ours: float
    floor: float | None
    target: Target
    peer: float | None = None
    peer_name: str = ""
    unit: str = "s"
    floor_what: str = ""
    note: str = ""
    result: bool | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.result = self.target.check(self)

    @property
    def ratio(self) -> float | None:
        return self.ours / self.floor if self.floor else None

    @property
    def peer_ratio(self) -> float | None:
        return self.peer / self.floor if self.peer is not None and self.floor else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["target"] = self.target.text
        d.update(ratio=self.ratio, peer_ratio=self.peer_ratio,
                 speedup_over_peer=self.peer / self.ours if self.peer is not None and self.ours else None)
        return d


@dataclass
class Sizes:
    batch: int
    size: int
    cnn: str  # the model of most rows
    models: list[str]  # models of the per-command rows
    scorecam: tuple[str, int, int]  # model, batch, size
    images: int  # dataset throughput: images per run


@dataclass
class Context:
    device: Any  # torch.device
    mode: str  # "full", "quick" or "smoke"
    repeats: int
    sizes: Sizes
    peers: dict[str, bool]
    log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True)
    clock: str = "wall"  # "cpu": this process's CPU time (a loaded machine; run.py --clock cpu --threads 1)

    def sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()

    def time(self, fns: dict[str, Callable[[], object]], repeats: int | None = None,
             warm: bool = True) -> dict[str, float]:
        """Best-of-``repeats`` seconds per function, interleaved, after one warm-up run each
        (``warm=False``: none, for runs of minutes where lazy start-up is noise; smoke mode
        only checks that everything runs: no warm-up)."""
        for fn in fns.values() if warm and self.mode != "smoke" else ():
            fn()
            self.sync()
        runs: dict[str, list[float]] = {k: [] for k in fns}
        # CPU time of the process: what a run costs when other jobs take turns on the cores
        # (with one torch thread it has no spin-waits in it); wall time otherwise.
        clock = time.process_time if self.clock == "cpu" and self.device.type == "cpu" else time.perf_counter
        for _ in range(repeats or self.repeats):
            for name, fn in fns.items():
                self.sync()
                t0 = clock()
                fn()
                self.sync()
                runs[name].append(clock() - t0)
        return {k: min(v) for k, v in runs.items()}

    def model(self, name: str) -> Any:
        import torch
        from torchvision import models

        torch.manual_seed(0)
        return models.get_model(name, weights=None).eval().to(self.device)

    def images(self, n: int, size: int | None = None, seed: int = 0) -> Any:
        import torch

        s = size or self.sizes.size
        g = torch.Generator().manual_seed(seed)
        return torch.randn(n, 3, s, s, generator=g).to(self.device)


def have(peer: str) -> bool:
    return importlib.util.find_spec(PEERS[peer]) is not None


def sizes_for(device_type: str, mode: str) -> Sizes:
    """CPU: what this 2-core machine can run (full by hand, quick in under 3 minutes, smoke
    in CI); an accelerator: batch 64 at 224 px, resnet50 and vit_b_16 (issue 30)."""
    if device_type != "cpu":
        if mode == "smoke":
            return Sizes(4, 64, "resnet18", ["resnet18"], ("resnet18", 2, 64), 16)
        if mode == "quick":
            return Sizes(16, 224, "resnet50", ["resnet50"], ("resnet50", 8, 224), 256)
        return Sizes(64, 224, "resnet50", ["resnet50", "vit_b_16"], ("resnet50", 8, 224), 1024)
    if mode == "smoke":
        return Sizes(1, 64, "resnet18", ["resnet18"], ("resnet18", 1, 48), 4)  # Score-CAM: layer4 2x2
    if mode == "quick":
        return Sizes(2, 112, "resnet18", ["resnet18"], ("resnet18", 2, 64), 32)
    return Sizes(8, 224, "resnet18", ["resnet18", "resnet50"], ("resnet50", 8, 64), 256)
