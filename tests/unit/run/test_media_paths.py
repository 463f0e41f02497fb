"""Clips and frame pairs on the runner's three paths (issue 25): one process, ``--resume``
after a kill, and torchrun with 2 CPU ranks (gloo) give the same reports and files. Shards
and checkpoints count samples (a clip, a pair), not files: a video's clips and pairs may end
up on different ranks (loading/samples.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fixtures.videos import moving_square, video_net_file, write_video
from unit.run.test_runner_paths import _files, _report, _same, kill_each, run_torchrun

FLOW_NET = '''
import torch
from torch import nn


class TinyFlow(nn.Module):
    """forward(image1, image2) -> [(N, 2, H, W)], as RAFT's list of predictions."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(6, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 2, 3, padding=1)

    def forward(self, image1, image2):
        return [self.head(torch.relu(self.conv(torch.cat([image1, image2], 1))))]


def build():
    return TinyFlow().eval()
'''
COMMON = ["--batch-size", "2", "--json", "-q"]
CLIP_COMMANDS = {"activations": ["-l", "features.0"], "grads": [], "cam": ["--method", "gradcam,layercam"],
                 "guided-backprop": []}
PAIR_COMMANDS = {"activations": ["-l", "conv"], "grads": [], "cam": ["-l", "conv"]}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    from PIL import Image

    root = tmp_path_factory.mktemp("media")
    small = [f[:, :64] for f in moving_square(40, size=(48, 64))]
    videos = [write_video(root / "a.mp4", small), write_video(root / "b.mp4", small[:12])]
    (root / "flow.py").write_text(FLOW_NET)
    rng = np.random.default_rng(0)
    pics = []
    for i in range(4):
        pics.append(root / f"p{i}.png")
        Image.fromarray(rng.integers(0, 255, (32, 40, 3), dtype=np.uint8)).save(pics[-1])
    clip_args = [f"{video_net_file(root)}:build", *map(str, videos), "--frames", "4", "--clips", "3",
                 "--resize", "40", "--crop", "32"]  # a.mp4: 3 clips, b.mp4: 3 of 12 frames: 6 clips, 3 batches
    pair_args = [f"{root / 'flow.py'}:build", *map(str, pics), str(videos[1]), "--frames", "3", "--clips", "2"]
    return {"root": root, "clip": clip_args, "pair": pair_args}  # pairs: 2 of images + 4 of frames


def _runs(data: dict, where: str) -> dict[str, list[str]]:
    root: Path = data["root"]  # type: ignore[assignment]
    out = {}
    for kind, commands in (("clip", CLIP_COMMANDS), ("pair", PAIR_COMMANDS)):
        for command, extra in commands.items():
            name = f"{kind}-{command}"
            out[name] = [command, *data[kind], *COMMON, *extra, "-o", str(root / where / name)]
    return out


@pytest.fixture(scope="module")
def one_process(data: dict) -> Path:
    from conftest import run_cli

    for name, args in _runs(data, "one").items():
        r = run_cli(args)
        assert r.exit_code == 0, (name, r.stderr)
    return data["root"] / "one"


@pytest.fixture(scope="module")
def resumed(data: dict) -> Path:
    """Each run killed (SIGKILL) once a checkpoint counts 2 samples, then resumed."""
    from conftest import run_cli

    runs = {name: [*args, "--resume"] for name, args in _runs(data, "resumed").items()}
    kill_each("kill:2", runs)
    for name, args in runs.items():
        again = run_cli(args)
        assert again.exit_code == 0, (name, again.stderr)
        assert json.loads(again.stdout)["throughput"]["images"] == 4  # 6 samples, 2 done before the kill
    return data["root"] / "resumed"


@pytest.fixture(scope="module")
def torchrun(data: dict) -> Path:
    root: Path = data["root"]
    run_torchrun(root, _runs(data, "torchrun"))
    return root / "torchrun"


NAMES = [f"clip-{c}" for c in CLIP_COMMANDS] + [f"pair-{c}" for c in PAIR_COMMANDS]


@pytest.mark.slow  # over 3 s: kept out of the quick tier
def test_samples_are_clips_and_pairs(one_process: Path) -> None:
    clips = _report(one_process, "clip-cam")["images"]
    assert [(Path(e["clip"]["video"]).name, e["clip"]["clip"]) for e in clips] == \
        [("a.mp4", 0), ("a.mp4", 1), ("a.mp4", 2), ("b.mp4", 0), ("b.mp4", 1), ("b.mp4", 2)]
    pairs = _report(one_process, "pair-activations")["images"]
    assert [[Path(p).name for p in e["pair"]["images"]] for e in pairs[:2]] == [["p0.png", "p1.png"],
                                                                               ["p2.png", "p3.png"]]
    assert [e["pair"]["frames"] for e in pairs[2:]] == [[0, 1], [1, 2], [9, 10], [10, 11]]


@pytest.mark.slow  # over 3 s: kept out of the quick tier
@pytest.mark.parametrize("name", NAMES)
def test_resume_after_a_kill_equals_one_process(name: str, one_process: Path, resumed: Path) -> None:
    _same(_report(one_process, name), _report(resumed, name))
    assert _files(one_process, name) == _files(resumed, name)


@pytest.mark.slow  # over 3 s: kept out of the quick tier
@pytest.mark.parametrize("name", NAMES)
def test_torchrun_equals_one_process(name: str, one_process: Path, torchrun: Path) -> None:
    _same(_report(one_process, name, sheets=False), _report(torchrun, name, sheets=False))
    assert _files(one_process, name, sheets=False) == _files(torchrun, name, sheets=False)


def test_a_bad_video_is_one_skipped_sample_of_one_shard(tmp_path: Path) -> None:
    """--skip-bad-inputs: a video that cannot be probed is a unit of its own; the shard that
    holds it records it as skipped (once), and a shard of only such samples is no error."""
    from inspect_model.errors import InputError
    from inspect_model.loading.clips import ClipPlan, VideoPreprocess
    from inspect_model.loading.video import ClipOptions

    good = write_video(tmp_path / "good.mp4", [f[:, :64] for f in moving_square(12, size=(48, 64))])
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video" * 50)
    plan = ClipPlan([bad, good], VideoPreprocess((32,), (32, 32)), ClipOptions(4, 1, 2), 4, 2, skip_bad=True)
    assert plan.units() == [str(bad), f"{good}#clip0", f"{good}#clip1"]
    plan.select([str(bad)])
    assert list(plan.batches()) == [] and [p for p, _ in plan.skipped] == [str(bad)]
    plan.skipped.clear()
    plan.select([f"{good}#clip1"])
    (batch,) = plan.batches()
    assert batch.names == [f"{good}#clip1"] and batch.tensor.shape == (1, 3, 4, 32, 32) and not plan.skipped
    only_bad = ClipPlan([bad], VideoPreprocess((32,), (32, 32)), ClipOptions(4), 4, 2, skip_bad=True)
    with pytest.raises(InputError, match="none of the 1 videos could be read"):
        list(only_bad.batches())
