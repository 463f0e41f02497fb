"""The preflight skips its meta pass when a torchvision classifier fits with room to spare (issue 37).

The bound used instead of the pass: every leaf layer's output for one input of the model's
default size is at most ``ACTIVATION_FACTOR`` times the input's float32 bytes. The slow test
checks that bound on every torchvision classification model; the others check when the pass is
skipped (plenty free, default size, no ``--model-arg``) and when it still runs.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from inspect_model.loading import preflight as pf  # noqa: E402
from inspect_model.loading.dispatch import preflight  # noqa: E402
from inspect_model.loading.loaded import LoadRequest  # noqa: E402
from inspect_model.loading.preflight import InputShape  # noqa: E402


@pytest.fixture
def passes(monkeypatch) -> list[str]:
    """The meta passes run (by the model's name)."""
    ran: list[str] = []
    real = pf.image_activations

    def counting(loaded, **kw):
        ran.append(loaded.name)
        return real(loaded, **kw)

    monkeypatch.setattr(pf, "image_activations", counting)
    return ran


def _free(monkeypatch, n: int) -> None:
    monkeypatch.setattr(pf, "available_memory", lambda: {"cpu": n})


@pytest.mark.parametrize("name", ["resnet50", "vit_b_16"])
def test_the_pass_is_skipped_with_room_to_spare_and_run_otherwise(name, passes, monkeypatch):
    _free(monkeypatch, 64 * 10**9)
    preflight(name, LoadRequest(weights="none"))
    preflight(name, LoadRequest(weights="none"), shape=InputShape(batch=4))
    assert passes == []
    preflight(name, LoadRequest(weights="none"), shape=InputShape(batch=64))  # the bound would not fit
    preflight(name, LoadRequest(weights="none"), shape=InputShape(size=(3, 448, 448)))  # not the default size
    preflight(name, LoadRequest(weights="none", model_args={"num_classes": 10}))  # not the measured model
    assert passes == [name] * 3
    _free(monkeypatch, 2 * 10**9)  # weights + bound over half of it: the pass runs, and the model fits
    preflight(name, LoadRequest(weights="none"))
    assert passes == [name] * 4


def test_a_too_large_batch_is_still_refused(passes, monkeypatch):
    from inspect_model.errors import ModelLoadError

    _free(monkeypatch, 10**9)
    with pytest.raises(ModelLoadError, match=r"activations .* for batch 40 of 3x224x224"):
        preflight("resnet50", LoadRequest(weights="none"), shape=InputShape(batch=40))
    assert passes == ["resnet50"]


def test_other_sources_always_get_the_pass(passes, monkeypatch):
    pytest.importorskip("timm")
    _free(monkeypatch, 64 * 10**9)
    preflight("timm:resnet18", LoadRequest(weights="none"))
    assert passes == ["timm:resnet18"]


@pytest.mark.slow
def test_the_bound_holds_for_every_torchvision_classifier():
    import warnings

    from inspect_model.loading.sources import load_model
    from inspect_model.loading.sources.torchvision import registry

    worst = (0.0, "")
    for name, family in registry().items():
        if family != "classification":
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = load_model(name, weights="none", device="meta")
        ratio = pf.image_activations(loaded) / (math.prod(loaded.input_sizes[0]) * 4)
        worst = max(worst, (ratio, name))
        assert ratio <= pf.ACTIVATION_FACTOR, f"{name}: activations {ratio:.0f}x its input"
    print(f"largest ratio: {worst[1]} {worst[0]:.0f}x (bound {pf.ACTIVATION_FACTOR}x)")
    assert worst[0] > pf.ACTIVATION_FACTOR / 2  # the bound is not loose by more than 2x
