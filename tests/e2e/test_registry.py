"""The command registry: a new command is one entry (issue 23), and the API takes what Python
users pass (targets of every kind, typed errors, the caller's random state untouched)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

import inspect_model as im
from fixtures.models import TinyCNN

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- a toy command
@pytest.fixture
def toy_command() -> Any:
    """The toy command of tests/fixtures/toys/toy_command.py: one module, registered by its
    ``@command`` decorator when imported."""
    import importlib
    import sys

    from inspect_model import registry
    from inspect_model.cli import app

    sys.modules.pop("fixtures.toys.toy_command", None)
    importlib.import_module("fixtures.toys.toy_command")
    app.sync_commands()
    yield registry.get("toy-norms")
    registry.unregister("toy-norms")
    app.sync_commands()
    im.__dict__.pop("toy_norms", None)


def test_a_toy_command_appears_everywhere_with_one_entry(toy_command: Any, cli: Any, models_py: Path,
                                                         tmp_path: Path) -> None:
    from inspect_model.cli import completion

    # --help lists it, with its summary; its own --help shows its option
    top = cli(["--help"])
    assert "toy-norms" in top.stdout and "the norm of each input" in top.stdout
    own = cli(["toy-norms", "--help"])
    assert own.exit_code == 0 and "--power" in own.stdout and "--input-size" in own.stdout
    assert "toy-norms" in completion.command_names()
    # the API: a function of the package, its options as keywords, the request validated once
    x = torch.ones(2, 3, 8, 8)
    res = im.toy_norms(TinyCNN(), x, power=1)
    assert [e["norm"] for e in res.payload["images"]] == [3 * 8 * 8, 3 * 8 * 8]
    with pytest.raises(TypeError, match="unexpected keyword argument 'powr'"):
        im.toy_norms(TinyCNN(), x, powr=1)
    # --json: the same numbers as the API, the request's options in the report
    model = f"{models_py}:TinyCNN"
    js = cli(["toy-norms", model, "--input-size", "3x8x8", "--power", "1", "--json"])
    assert js.exit_code == 0, js.stderr
    doc = json.loads(js.stdout)
    assert doc["command"] == "toy-norms" and doc["options"]["power"] == 1
    ref = im.toy_norms(model, power=1, inputs=im.InputOptions(None, input_size=["3x8x8"]))
    assert doc["images"][0]["norm"] == pytest.approx(ref.payload["images"][0]["norm"])
    # -o: the report files, like every command
    out = tmp_path / "toy"
    r = cli(["toy-norms", model, "--input-size", "3x8x8", "-o", str(out), "-q"])
    assert r.exit_code == 0, r.stderr
    assert {p.name for p in out.iterdir()} >= {"report.json", "report.txt", "report.html"}
    assert "random-0: " in (out / "report.txt").read_text()
    txt = cli(["toy-norms", model, "--input-size", "3x8x8", "-q"])
    assert txt.exit_code == 0 and txt.stdout.startswith("random-0: "), txt.stdout
    # a bad value: one line, exit 2, from the request's own validation
    bad = cli(["toy-norms", model, "--input-size", "3x8x8", "--power", "0"])
    assert bad.exit_code == 2 and bad.stderr.strip() == "error: --power must be 1 or more, got 0"


def test_registry_drives_cli_api_and_completion() -> None:
    from inspect_model import registry
    from inspect_model.cli import app, completion

    assert tuple(app.COMMANDS) == registry.names() == completion.command_names()
    for spec in registry.COMMANDS.values():
        assert getattr(im, spec.api_name) is spec.api_function()
        assert spec.api_name in im.__all__
    assert registry.hook_commands() == {n for n, s in registry.COMMANDS.items() if s.hooks}


def test_readme_command_table_is_the_registry() -> None:
    from inspect_model import registry

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = re.search(r"^\| command \| what it does \|\n(?:\|.*\n)+", readme, re.M)
    assert table is not None
    assert table.group(0).strip() == registry.command_table()


def test_every_schema_names_its_command_and_methods_from_the_registries() -> None:
    from inspect_model import registry
    from inspect_model.methods.cam.base import names

    schemas = ROOT / "src" / "inspect_model" / "schemas"
    for spec in registry.COMMANDS.values():
        if spec.schema is None:
            continue
        doc = json.loads((schemas / spec.schema).read_text())
        assert doc["properties"]["command"]["const"] == spec.name
    cam = json.loads((schemas / "cam.json").read_text())
    enum = cam["$defs"]["method"]["enum"]
    assert tuple(enum) == names()


# ----------------------------------------------------------------------------- targets in the API
@pytest.fixture
def net() -> TinyCNN:
    torch.manual_seed(0)
    return TinyCNN().eval()


@pytest.mark.parametrize("target, expected", [
    (3, [[3], [3]]), ("3", [[3], [3]]), ([1, 4], [[1], [4]]), ((2, 0), [[2], [0]]),
    (torch.tensor([4, 1]), [[4], [1]]), (np.array([0, 2]), [[0], [2]]),
])
def test_every_command_takes_int_list_and_tensor_targets(net: TinyCNN, target: Any, expected: list[list[int]]
                                                         ) -> None:
    x = torch.randn(2, 3, 8, 8)
    gb = im.guided_backprop(net, x, target)  # positional, as README shows
    assert [e["targets"] for e in gb.payload["images"]] == expected
    cam = im.cam(net, x, target=target, layers=["features.3"])
    assert [[m["target"]["class"] for m in e["maps"]] for e in cam.payload["images"]] == expected
    g = im.grads(net, x, target=target)
    assert [s["targets"] for s in g.to_dict()["images"]] == expected


def test_a_per_sample_target_follows_the_images_across_batches(net: TinyCNN) -> None:
    x = torch.randn(5, 3, 8, 8)
    targets = [0, 1, 2, 3, 4]
    gb = im.guided_backprop(net, x, targets, inputs=im.InputOptions(x, batch_size=2))
    assert [e["targets"] for e in gb.payload["images"]] == [[t] for t in targets]
    # each map equals the one of that image alone with its own target
    for i in (0, 3, 4):
        alone = im.guided_backprop(net, x[i:i + 1], targets[i])
        torch.testing.assert_close(alone.gradients[0], gb.gradients[i], rtol=1e-4, atol=1e-7)


def test_a_per_sample_target_of_the_wrong_length_is_one_clear_error(net: TinyCNN) -> None:
    from inspect_model.errors import InputError

    with pytest.raises(InputError, match="names 2 class"):
        im.cam(net, torch.randn(3, 3, 8, 8), target=[1, 2])


@pytest.mark.parametrize("bad", [1.5, True, object(), torch.randn(2), torch.zeros(2, 2, dtype=torch.long), [1.0]])
def test_a_target_of_the_wrong_type_is_a_type_error_naming_it(net: TinyCNN, bad: Any) -> None:
    for fn in (im.cam, im.guided_backprop, im.grads):
        with pytest.raises(TypeError, match="target="):
            fn(net, torch.randn(2, 3, 8, 8), target=bad)


# ----------------------------------------------------------------------------- the caller's RNG
def test_api_calls_leave_the_callers_random_state_alone(net: TinyCNN, models_py: Path) -> None:
    import random

    x = torch.randn(2, 3, 8, 8)
    calls = [
        lambda: im.cam(net, x, methods=["gradcam", "scorecam"]),
        lambda: im.grads(net, x),
        lambda: im.activations(net, x),
        lambda: im.guided_backprop(net, x, sanity=True),
        lambda: im.check(net, inputs=im.InputOptions(None, input_size=["3x8x8"])),
        lambda: im.summary(net, input_size=["3x8x8"], device="cpu"),
        lambda: im.grads(f"{models_py}:TinyCNN", inputs=im.InputOptions(None, input_size=["3x8x8"], seed=7)),
    ]
    for call in calls:
        torch.manual_seed(1234)
        np.random.seed(99)
        random.seed(5)
        expected = (torch.rand(3), np.random.rand(3), random.random())
        torch.manual_seed(1234)
        np.random.seed(99)
        random.seed(5)
        call()
        got = (torch.rand(3), np.random.rand(3), random.random())
        assert torch.equal(got[0], expected[0])
        assert np.array_equal(got[1], expected[1])
        assert got[2] == expected[2]


def test_api_results_do_not_depend_on_the_callers_random_state(models_py: Path) -> None:
    inputs = im.InputOptions(None, input_size=["3x8x8"], seed=3)
    torch.manual_seed(1)
    a = im.grads(f"{models_py}:TinyCNN", inputs=inputs).to_dict()
    torch.manual_seed(2)
    b = im.grads(f"{models_py}:TinyCNN", inputs=inputs).to_dict()
    assert a["global_grad_norm"] == b["global_grad_norm"]
    assert a["images"] == b["images"]


def test_published_schemas_are_what_the_code_declares() -> None:
    """Options, command names and the method enum of every schema come from the requests and
    registries (python -m inspect_model.schemas.generate --write regenerates them)."""
    from inspect_model.schemas.generate import stale

    assert stale() == []


def test_schema_options_follow_a_new_request_field(monkeypatch: pytest.MonkeyPatch) -> None:
    """A field added to a request appears in its schema's options with its JSON type."""
    import dataclasses

    from inspect_model.api.cam import CamRequest
    from inspect_model.run.request import option
    from inspect_model.schemas.generate import options_schema

    @dataclasses.dataclass(frozen=True)
    class Wider(CamRequest):
        smoothing: float | None = option(None, "--smoothing", type=float, help="x")

    from inspect_model import registry

    spec = registry.get("cam")
    monkeypatch.setitem(registry.COMMANDS, "cam", dataclasses.replace(spec, request=Wider))
    props = options_schema("cam")["properties"]
    assert props["smoothing"] == {"type": ["number", "null"]}
    assert props["target"] == {"type": ["string", "array", "null"], "items": {"type": "string"}}
