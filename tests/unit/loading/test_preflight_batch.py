"""The preflight's activation estimate is for the input the run feeds (issue 37): ``--batch-size``
inputs of ``--input-size`` (else one input of the model's default size, or the images named).
A batch whose activations cannot fit is refused in one line with the numbers before any weight is
allocated, while batch 1 of the same model runs. The free memory is set (``available_memory``)
so the numbers do not depend on the machine.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import run_cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
CAT = str(ROOT / "sample_images" / "cat.jpg")
FREE = 1_000_000_000


@pytest.fixture
def one_gb_free(monkeypatch):
    from inspect_model.loading import preflight

    monkeypatch.setattr(preflight, "available_memory", lambda: {"cpu": FREE})


def _per_image(size=(3, 224, 224)) -> int:
    from inspect_model.loading.preflight import image_activations
    from inspect_model.loading.sources import load_model

    return image_activations(load_model("resnet18", weights="none", device="meta"), size=size)


def test_a_batch_too_large_for_its_activations_is_refused_and_batch_1_runs(one_gb_free):
    per = _per_image()
    assert 10e6 < per < 100e6  # resnet18, 3x224x224: every leaf layer's output in float32
    batch = FREE // per + 2
    r = run_cli(["activations", "resnet18", "--weights", "none", "--input-size", "3x224x224",
                 "--batch-size", str(batch), "--json", "-q"])
    assert r.exit_code == 3 and r.stdout == ""
    line = r.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    m = re.search(r"resnet18 needs ([\d.,]+ [GM]B) in float32 \(weights 46.8 MB \+ activations ([\d.,]+ [GM]B) "
                  rf"for batch {batch} of 3x224x224\); 1.0 GB free in RAM; use a smaller --batch-size or --input-size", line)
    assert m, line
    from inspect_model.loading.preflight import gb

    assert m.group(2) == gb(batch * per)  # linear in the batch: the meta pass at that batch
    ok = run_cli(["activations", "resnet18", "--weights", "none", "--input-size", "3x224x224", "--json", "-q"])
    assert ok.exit_code == 0, ok.stderr


def test_the_input_size_is_the_one_asked_for(one_gb_free):
    small, large = _per_image((3, 112, 112)), _per_image((3, 448, 448))
    assert 14 < large / small < 18  # about the pixel count's ratio (16x)
    batch = FREE // large + 1  # too many at 448 px, few enough at 112 px
    assert batch * small < FREE * 0.5
    base = ["activations", "resnet18", "--weights", "none", "--batch-size", str(batch), "--json", "-q"]
    refused = run_cli(base + ["--input-size", "3x448x448"])
    assert refused.exit_code == 3 and f"for batch {batch} of 3x448x448" in refused.stderr
    assert run_cli(base + ["--input-size", "3x112x112"]).exit_code == 0


def test_the_batch_of_named_images_is_at_most_their_count(one_gb_free):
    from inspect_model.run.options import InputOptions, input_shape

    assert input_shape(InputOptions([CAT, CAT], batch_size=64)).batch == 2
    assert input_shape(InputOptions([CAT])).batch == 1
    assert input_shape(InputOptions([str(ROOT / "sample_images")], batch_size=16)).batch == 16
    assert input_shape(InputOptions(None, input_size=["3x64x64"])).batch == 1
    assert input_shape(InputOptions(None, input_size=["3x64x64"]), default_batch=4).size == (3, 64, 64)
    assert input_shape(InputOptions(torch.zeros(5, 3, 32, 32), batch_size=2)).batch == 2
    # Many images named: a batch of 64 would not fit, but there are two; the run goes ahead.
    r = run_cli(["activations", "resnet18", CAT, CAT, "--weights", "none", "--batch-size",
                 str(FREE // _per_image() + 5), "--json", "-q"])
    assert r.exit_code == 0, r.stderr
