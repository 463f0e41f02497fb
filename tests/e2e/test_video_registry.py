"""Every video, optical-flow and quantized model of torchvision's registry through every
command at a small input size, weights none: exit 0, or a documented one-line refusal.

Slow (minutes on a laptop: it builds 25 architectures), so it runs only when asked:
``INSPECT_MODEL_REGISTRY=1 python -m pytest tests/e2e/test_video_registry.py``.
"""

from __future__ import annotations

import os

import pytest

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.environ.get("INSPECT_MODEL_REGISTRY"),
                                 reason="set INSPECT_MODEL_REGISTRY=1: builds every video/flow/quantized model")]

COMMANDS = ("summary", "activations", "check", "grads", "guided-backprop", "cam")
# The smallest input each model runs: MViT's position embeddings fix 16x224x224; S3D needs
# 224 pixels (its last pooling is 7x7 over a 32x smaller map); RAFT needs 128 pixels.
SIZES = {"mvit_v1_b": "3x16x224x224", "mvit_v2_s": "3x16x224x224", "s3d": "3x16x224x224",
         "raft_small": "3x128x128", "raft_large": "3x128x128",
         # Swin3D: 64 pixels leave its last stage a 2x2 map for `cam`
         "swin3d_t": "3x4x64x64", "swin3d_s": "3x4x64x64", "swin3d_b": "3x4x64x64"}
# The documented refusals: (model, command) -> (exit code, text in the one line).
REFUSALS: dict[tuple[str, str], tuple[int, str]] = {}


def _models() -> list[str]:
    from torchvision import models

    return (models.list_models(module=models.video) + models.list_models(module=models.optical_flow)
            + models.list_models(module=models.quantization))


@pytest.mark.parametrize("name", _models())
@pytest.mark.parametrize("command", COMMANDS)
def test_every_model_runs_every_command(cli, name: str, command: str) -> None:
    size = SIZES.get(name, "3x4x32x32" if name[:1] in "rmcs" and "quantized" not in name else "3x64x64")
    if name.startswith("quantized_") and name in ("quantized_inception_v3", "quantized_googlenet"):
        size = "3x96x96"
    args = [command, name, "--weights", "none", "--input-size", size]
    if name.startswith("raft"):
        args += ["--input-size", size] if command == "summary" else []
    r = cli(args)
    want = REFUSALS.get((name, command))
    if want is None:
        assert r.exit_code == 0, r.stderr[-2000:]
    else:
        assert r.exit_code == want[0] and want[1] in r.stderr.strip().splitlines()[-1]
