"""Every detection and segmentation model of torchvision's registry through every command.

Issue 24: ``summary``, ``check``, ``activations``, ``grads``, ``cam`` (Grad-CAM and Eigen-CAM)
and ``guided-backprop`` on each of ``torchvision.models.list_models(module=detection)`` and
``(module=segmentation)``, with random weights (no download) at a small input size: a
detector is built with ``min_size``/``max_size`` small (SSD and SSDlite keep their fixed
300/320 sides), a segmenter gets a small image. ``--score-threshold 0`` so that a randomly
initialised detector has detections to explain.

Each (model, command) ends in ``ok``, a ``refused`` one-line error of the tool (an
``InspectModelError``: legitimate and documented), or ``FAILED`` (anything else: a bug).
Exit status 1 if anything FAILED. ``tests/e2e/test_detection_registry.py`` runs it (slow-marked
for the whole registry, two models in CI).

Run: python benchmarks/dense_registry.py [--only NAME ...] [--size 128]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

COMMANDS = ("summary", "check", "activations", "grads", "cam", "guided-backprop")


def registry() -> list[tuple[str, str]]:
    import torchvision

    out = [(n, "detection") for n in torchvision.models.list_models(module=torchvision.models.detection)]
    return out + [(n, "segmentation") for n in torchvision.models.list_models(module=torchvision.models.segmentation)]


def build(name: str, task: str, size: int) -> Any:
    import torchvision

    kw: dict[str, Any] = {"weights": None, "weights_backbone": None}
    if task == "detection" and not name.startswith("ssd"):
        kw.update(min_size=size, max_size=size)
    return torchvision.models.get_model(name, **kw).eval()


def run_command(command: str, model: Any, x: Any, task: str) -> None:
    import inspect_model as im

    det = {"score_threshold": 0.0, "max_detections": 2} if task == "detection" else {}
    if command == "summary":
        im.summary(model, input_size=[tuple(x.shape[1:])])
    elif command == "check":
        im.check(model, x)
    elif command == "activations":
        im.activations(model, x, layers=["*"], keep=False)
    elif command == "grads":
        im.grads(model, x, **det)
    elif command == "cam":
        im.cam(model, x, methods=["gradcam", "eigencam"], **det)
    elif command == "guided-backprop":
        im.guided_backprop(model, x, keep=False, **det)


def sweep(names: list[tuple[str, str]], size: int, log: Any = print) -> dict[tuple[str, str], str]:
    import torch

    from inspect_model.errors import InspectModelError

    results: dict[tuple[str, str], str] = {}
    for name, task in names:
        torch.manual_seed(0)
        model = build(name, task, size)
        side = size if task == "detection" else max(64, size // 2)
        x = torch.rand(2 if task == "segmentation" else 1, 3, side, side)
        for command in COMMANDS:
            t0 = time.perf_counter()
            try:
                run_command(command, model, x, task)
                status = "ok"
            except InspectModelError as exc:
                status = f"refused: {exc}"
            except Exception as exc:  # noqa: BLE001 - a bug of the tool: report it, go on
                status = f"FAILED: {type(exc).__name__}: {exc}"
            results[(name, command)] = status
            log(f"{name:42s} {command:16s} {time.perf_counter() - t0:6.1f}s  {status[:150]}")
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="model names (default: the whole registry)")
    ap.add_argument("--size", type=int, default=128, help="detector input side (segmenters: half)")
    args = ap.parse_args(argv)
    names = [(n, t) for n, t in registry() if not args.only or n in args.only]
    results = sweep(names, args.size)
    failed = [k for k, v in results.items() if v.startswith("FAILED")]
    refused = [k for k, v in results.items() if v.startswith("refused")]
    print(f"\n{len(results)} runs: {len(results) - len(failed) - len(refused)} ok, {len(refused)} refused, "
          f"{len(failed)} FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
