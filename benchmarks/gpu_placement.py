"""Placement on a real GPU (issue 37): a check to run where one is lent, not a test.

    python benchmarks/gpu_placement.py            # about a minute on one H100

What it does, each time against the resident CPU run of the same command (every number of
the JSON reports compared, max |diff| printed; float32, so GPU kernels may differ by ~1e-5):

1. A tiny Llama (4 blocks) saved with ``save_pretrained``: ``activations --text`` with
   ``--device-map auto`` (all on cuda:0), then with ``--max-memory 0=<2 blocks>,cpu=<1 block>
   --offload`` (cuda:0, then the CPU, then the disk), and on a machine with several GPUs with
   ``--max-memory 0=<2 blocks>,1=<2 blocks>`` (pipeline placement over two GPUs).
2. resnet18 with a seeded ``--checkpoint`` and ``--device-map auto`` and ``--offload``
   (torchvision, built empty and read block by block, blocks on cuda:0 / streamed).
3. ``cam`` (a gradient command) on the tiny Llama's sibling ViT with ``--device-map auto``.

It prints one table: case, placement (folded), max |diff| vs resident CPU, wall seconds, and
the peak GPU memory of the child. Exit 1 if a case fails or differs by more than 1e-3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CAT = str(ROOT / "sample_images" / "cat.jpg")
SKIP = {"throughput", "seconds", "options", "notes", "files", "tool_version", "torch_version", "python_version",
        "torchvision_version", "warnings", "time", "wall"}


def numbers(doc, path=""):
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k not in SKIP:
                yield from numbers(v, f"{path}/{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from numbers(v, f"{path}/{i}")
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        yield path, float(doc)


def cli(*args: str) -> tuple[dict | None, float, str]:
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "inspect_model", *args, "--json", "-q"], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    wall = time.monotonic() - start
    if r.returncode != 0:
        return None, wall, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
    return json.loads(r.stdout), wall, ""


def diff(a: dict, b: dict) -> float:
    na, nb = dict(numbers(a)), dict(numbers(b))
    if na.keys() != nb.keys():
        return float("inf")
    return max((abs(na[k] - nb[k]) for k in na), default=0.0)


def fold(placement: dict) -> str:
    from inspect_model.loading.placement import describe

    return describe({k: (int(v[5:]) if v.startswith("cuda:") else v) for k, v in placement.items()})


def main() -> int:
    import torch
    import torchvision
    import transformers

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure here")
        return 0
    gpus = torch.cuda.device_count()
    tmp = Path(tempfile.mkdtemp(prefix="gpu-placement-"))
    sys.path.insert(0, str(ROOT / "tests"))
    from fixtures.text_models import save_text_model

    llama = str(save_text_model("llama", tmp / "llama"))
    torch.manual_seed(0)
    ckpt = tmp / "resnet18.pt"
    torch.save(torchvision.models.resnet18().state_dict(), ckpt)
    vit = tmp / "vit"
    cfg = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=48, num_labels=3,
                                 architectures=["ViTForImageClassification"])
    transformers.ViTForImageClassification(cfg).eval().save_pretrained(vit)
    cfg_l = transformers.AutoConfig.from_pretrained(llama)
    block = 4 * (4 * cfg_l.hidden_size ** 2 + 3 * cfg_l.hidden_size * cfg_l.intermediate_size)
    text = ["--text", "the cat sat on the mat"]
    cases = [
        ("llama activations, auto", ["activations", llama, *text], ["--device-map", "auto"]),
        ("llama activations, gpu+cpu+disk", ["activations", llama, *text],
         ["--max-memory", f"0={2 * block}B,cpu={block}B", "--offload"]),
        ("resnet18 checkpoint, auto", ["activations", "resnet18", CAT, "--weights", "none", "--checkpoint", str(ckpt)],
         ["--device-map", "auto"]),
        ("resnet18 checkpoint, offload", ["activations", "resnet18", CAT, "--weights", "none", "--checkpoint",
                                          str(ckpt)], ["--offload"]),
        ("vit cam, auto", ["cam", str(vit), CAT, "-m", "gradcam"], ["--device-map", "auto"]),
    ]
    if gpus > 1:
        cases.insert(1, ("llama activations, 2 GPUs", ["activations", llama, *text],
                         ["--device-map", "balanced", "--max-memory", f"0={3 * block}B,1={3 * block}B"]))
    failed = 0
    print(f"{'case':34} {'max|diff|':>10} {'wall s':>7}  placement")
    for name, base, extra in cases:
        resident, _, err = cli(*base)
        placed, wall, err2 = cli(*base, *extra)
        if resident is None or placed is None:
            failed += 1
            print(f"{name:34} {'FAILED':>10} {wall:7.1f}  {err or err2}")
            continue
        d = diff(resident, placed)
        failed += d > 1e-3
        print(f"{name:34} {d:10.2e} {wall:7.1f}  {fold(placed['options'].get('placement', {}))}")
    print(f"{gpus} GPU(s): {torch.cuda.get_device_name(0)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
