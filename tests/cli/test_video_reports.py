"""What every per-sample command's JSON says of clips and frame pairs (issue 25, item 5):
the clip and frame indices and the decoder's times per entry and per map, the two images of
each flow sample; and a flow model given a tensor through the Python API (pairs 0-1, 2-3 of
a (2N, C, H, W) batch, as the CLI pairs image files; or (N, 2, C, H, W))."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fixtures.videos import moving_square, video_net_file, write_video
from unit.run.test_media_paths import FLOW_NET

SCHEMAS = Path(__file__).resolve().parents[2] / "src" / "inspect_model" / "schemas"
COMMANDS = {"activations": [], "grads": [], "cam": [], "guided-backprop": [],
            "attributions": ["-m", "saliency"]}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    from PIL import Image

    root = tmp_path_factory.mktemp("reports")
    video = write_video(root / "a.mp4", [f[:, :64] for f in moving_square(12, size=(48, 64))])
    (root / "flow.py").write_text(FLOW_NET)
    rng = np.random.default_rng(0)
    pics = []
    for i in range(2):
        pics.append(root / f"p{i}.png")
        Image.fromarray(rng.integers(0, 255, (32, 40, 3), dtype=np.uint8)).save(pics[-1])
    return {"video": video, "pics": pics, "net": f"{video_net_file(root)}:build", "flow": f"{root / 'flow.py'}:build"}


def _validate(doc: dict, command: str) -> None:
    import jsonschema

    jsonschema.Draft202012Validator(json.loads((SCHEMAS / f"{command}.json").read_text())).validate(doc)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_clip_entry_and_map_says_its_clip_frames_and_times(cli, data: dict, command: str,
                                                               tmp_path: Path) -> None:
    r = cli([command, data["net"], str(data["video"]), "--frames", "4", "--clips", "2", "--resize", "40",
             "--crop", "32", "--json", "-q", "-o", str(tmp_path / "out"), *COMMANDS[command]])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    _validate(doc, command)
    entries = doc["images"]
    assert [e["clip"]["frames"] for e in entries] == [[0, 1, 2, 3], [8, 9, 10, 11]]
    assert entries[1]["clip"]["times"] == pytest.approx([0.8, 0.9, 1.0, 1.1])
    assert {e["clip"]["video"] for e in entries} == {str(data["video"])}
    for e in entries:
        for m in e.get("maps", []):
            assert (m["clip"], m["frames"], m["times"]) == (e["clip"]["clip"], e["clip"]["frames"],
                                                           e["clip"]["times"])


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_flow_sample_names_its_two_images(cli, data: dict, command: str, tmp_path: Path) -> None:
    pics = [str(p) for p in data["pics"]]
    r = cli([command, data["flow"], *pics, str(data["video"]), "--frames", "3", "--json", "-q",
             "-o", str(tmp_path / "o"),
             *COMMANDS[command], *(["-l", "conv"] if command == "cam" else [])])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    _validate(doc, command)
    pairs = [e["pair"] for e in doc["images"]]
    assert pairs[0] == {"images": pics}
    assert [p["frames"] for p in pairs[1:]] == [[4, 5], [5, 6]]
    assert pairs[1]["times"] == pytest.approx([0.4, 0.5])
    assert pairs[1]["images"] == [f"{data['video']}#4", f"{data['video']}#5"]


def test_grads_jsonl_lines_and_report_entries_agree(cli, data: dict) -> None:
    r = cli(["grads", data["net"], str(data["video"]), "--frames", "4", "--clips", "2", "--resize", "40",
             "--crop", "32", "--jsonl", "-q"])
    assert r.exit_code == 0, r.stderr
    lines = [json.loads(ln) for ln in r.stdout.splitlines() if ln.strip()]
    assert [ln["clip"]["frames"] for ln in lines if "clip" in ln] == [[0, 1, 2, 3], [8, 9, 10, 11]]


# ----------------------------------------------------------------------------- tensors through the API
def _flow_model() -> torch.nn.Module:
    space: dict = {}
    exec(compile(FLOW_NET, "flow_net", "exec"), space)  # noqa: S102 - the test's own model source
    return space["build"]()


def _by_hand(model: torch.nn.Module, a: torch.Tensor, b: torch.Tensor) -> float:
    with torch.no_grad():
        return float(model(a[None], b[None])[-1].pow(2).sum(1).sqrt().mean())


def test_a_flow_model_takes_a_batch_of_images_as_pairs_0_1_and_2_3() -> None:
    import inspect_model as im

    model = _flow_model()
    x = torch.randn(4, 3, 16, 24, generator=torch.Generator().manual_seed(0))
    doc = im.grads(model, x).to_dict()
    entries = doc["images"]
    assert [e["pair"]["images"] for e in entries] == [["input-0", "input-1"], ["input-2", "input-3"]]
    assert [e["image"] for e in entries] == ["input-0", "input-2"]
    for e, (a, b) in zip(entries, ((0, 1), (2, 3))):  # the explained score: mean |flow| of that pair
        assert e["objective"] == pytest.approx(_by_hand(model, x[a], x[b]), rel=1e-5)
    acts = im.activations(model, inputs=im.InputOptions(x, names=["a", "b", "c", "d"]), layers=["conv"]).to_dict()
    assert [e["pair"]["images"] for e in acts["images"]] == [["a", "b"], ["c", "d"]]
    assert acts["options"]["inputs"]["pairs"]["layout"].startswith("(2N, C, H, W)")


def test_a_flow_model_takes_n_by_2_pairs() -> None:
    import inspect_model as im

    model = _flow_model()
    v = torch.randn(4, 3, 16, 24, generator=torch.Generator().manual_seed(1))  # frames of a clip
    pairs = torch.stack([v[:-1], v[1:]], 1)  # (3, 2, C, H, W): 0-1, 1-2, 2-3 as the CLI pairs video frames
    doc = im.guided_backprop(model, pairs).to_dict()
    assert [e["pair"]["images"] for e in doc["images"]] == [[f"pair-{i}[0]", f"pair-{i}[1]"] for i in range(3)]
    for i, e in enumerate(doc["images"]):
        assert e["maps"][0]["target"]["score"] == pytest.approx(_by_hand(model, v[i], v[i + 1]), rel=1e-5)


@pytest.mark.parametrize(("shape", "text"), [
    ((3, 3, 8, 8), "a flow model takes pairs: a tensor of 3 images is an odd number; give (2N, C, H, W) "
                   "images paired 0-1, 2-3, ... or (N, 2, C, H, W) pairs"),
    ((2, 3, 3, 8, 8), "a flow model takes pairs: a 5-D tensor must be (N, 2, C, H, W), got (2, 3, 3, 8, 8)"),
    ((3, 8, 8), "a flow model takes pairs of images: a tensor of shape (3, 8, 8) is neither"),
])
def test_a_tensor_that_is_not_pairs_is_one_clear_line(shape: tuple[int, ...], text: str) -> None:
    import inspect_model as im
    from inspect_model.errors import InputError

    with pytest.raises(InputError) as info:
        im.activations(_flow_model(), torch.zeros(shape))
    assert str(info.value).startswith(text) and "\n" not in str(info.value)
    with pytest.raises(InputError, match="3 names for a tensor of 4 image"):
        im.activations(_flow_model(), inputs=im.InputOptions(torch.zeros(4, 3, 8, 8), names=["a", "b", "c"]))
