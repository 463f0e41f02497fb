"""Wrapped models in every command (issue 42, item 5): ``torch.compile``'s OptimizedModule and
``DataParallel`` are inspected through the module they wrap, unwrapped once where a model is
loaded (loading/wrappers.py), with a note. Checked against the plain model: the same numbers in
``activations`` and ``attention``, the same next-token target in ``grads --text``; nothing is
compiled (no Dynamo frame, no compiler warning) while our hooks run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import run_cli
from fixtures.text_models import save_text_model

transformers = pytest.importorskip("transformers")

TEXTS = ["the cat sat on the", "a dog ran"]
VOLATILE = ("throughput", "model", "options", "warnings", "tool_version", "torch_version", "torchvision_version",
            "python_version")


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    return save_text_model("gpt2", tmp_path_factory.mktemp("wrapped") / "gpt2")


@pytest.fixture(scope="module")
def wrapped_py(gpt2, tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("wrapped_py") / "wrapped.py"
    p.write_text(
        "import torch, transformers\n"
        f"FOLDER = {str(gpt2)!r}\n"
        "def plain():\n    return transformers.AutoModelForCausalLM.from_pretrained(FOLDER).eval()\n"
        "def compiled():\n    return torch.compile(plain())\n"
        "def parallel():\n    return torch.nn.DataParallel(plain())\n"
        "def both():\n    return torch.compile(torch.nn.DataParallel(plain()))\n"
        "def cnn():\n"
        "    torch.manual_seed(0)\n"
        "    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),\n"
        "                              torch.nn.Flatten(), torch.nn.Linear(4, 3))\n"
        "    return torch.compile(net.eval())\n")
    return p


def _doc(args: list[str]) -> tuple[dict, str]:
    r = run_cli(args + ["--json"])  # not -q: the notes are read
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    return {k: v for k, v in doc.items() if k not in VOLATILE}, r.stderr


def _text(args: list[str]) -> list[str]:
    return [a for t in TEXTS for a in ("--text", t)] + args


@pytest.mark.parametrize("builder", ["compiled", "parallel", "both"])
def test_activations_and_attention_equal_the_plain_model(gpt2, wrapped_py, builder):
    from torch._dynamo.utils import counters

    frames = dict(counters["frames"])
    for command, extra in (("activations", []), ("attention", ["-m", "raw,rollout,grad-rollout,legrad"])):
        plain, _ = _doc([command, str(gpt2), "--weights", "default", *_text(extra)])
        wrapped, err = _doc([command, f"{wrapped_py}:{builder}", "--tokenizer", str(gpt2), *_text(extra)])
        assert wrapped == plain, command  # every number, layer name and target, as the plain folder gives them
        if builder != "parallel":
            assert "GPT2LMHeadModel is torch.compile'd: inspected through its original module (_orig_mod), " \
                   "since hooks and compiled graphs do not mix" in err
        if builder != "compiled":
            assert "GPT2LMHeadModel is wrapped in DataParallel: inspected through .module" in err
    assert dict(counters["frames"]) == frames  # nothing was compiled


@pytest.mark.parametrize("builder", ["compiled", "parallel"])
def test_grads_text_keeps_the_next_token_target(gpt2, wrapped_py, builder):
    """The issue's bug: under a wrapper the causal LM was not recognised and its flattened
    (position x vocabulary) argmax was explained: target 258 = position 4, token 2."""
    plain, _ = _doc(["grads", str(gpt2), "--weights", "default", "--text", TEXTS[0]])
    wrapped, _ = _doc(["grads", f"{wrapped_py}:{builder}", "--tokenizer", str(gpt2), "--text", TEXTS[0]])
    assert [e["targets"] for e in wrapped["images"]] == [e["targets"] for e in plain["images"]]
    assert max(t for e in wrapped["images"] for t in e["targets"]) < 64  # a token of the vocabulary
    assert wrapped["layers"] == plain["layers"]


def test_a_compiled_cnn_runs_eagerly_without_compiler_warnings(wrapped_py, recwarn):
    from torch._dynamo.utils import counters

    frames = dict(counters["frames"])
    r = run_cli(["activations", f"{wrapped_py}:cnn", "--input-size", "3x16x16"])
    assert r.exit_code == 0, r.stderr
    assert dict(counters["frames"]) == frames
    assert "graph break" not in r.stderr.lower() and "dynamo" not in r.stderr.lower().replace("_orig_mod", "")
    assert not [w for w in recwarn if "dynamo" in str(w.filename) or "graph" in str(w.message).lower()]
    assert "0.weight" not in r.stdout and "_orig_mod" not in r.stdout  # layer names as the module's own: 0, 1, ...
    assert r.stdout.splitlines()[3].split()[0] == "0"


def test_python_objects_are_unwrapped_too(gpt2):
    """The API takes the wrapper object itself: the plain module's numbers, and the note."""
    import inspect_model as im

    plain = transformers.AutoModelForCausalLM.from_pretrained(gpt2).eval()
    inputs = im.InputOptions(input_size=["input_ids=5:int64:2-20"], batch_size=2)

    def run(model):
        notes: list[str] = []
        doc = im.activations(model, None, inputs=inputs, layers=["transformer.h.0", "lm_head"],
                             notes=notes.append).to_dict()
        return [(r["name"], r["stats"]) for r in doc["layers"]], notes

    want, none = run(plain)
    assert [n for n, _ in want] == ["transformer.h.0", "lm_head"] and not [n for n in none if "inspected" in n]
    for wrapper, why in ((torch.compile(plain), "torch.compile'd"), (torch.nn.DataParallel(plain), "DataParallel")):
        got, notes = run(wrapper)
        assert got == want
        assert [n for n in notes if why in n and "inspected through" in n]


def test_a_checkpoint_loads_into_the_wrapped_module(gpt2, wrapped_py, tmp_path):
    """A state dict saved from the wrapper (keys 'module.' / '_orig_mod.') fits the module inside."""
    plain = transformers.AutoModelForCausalLM.from_pretrained(gpt2).eval()
    torch.manual_seed(1)
    sd = {f"module.{k}": v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v
          for k, v in plain.state_dict().items()}
    ckpt = tmp_path / "dp.pt"
    torch.save(sd, ckpt)
    doc, err = _doc(["activations", f"{wrapped_py}:compiled", "--tokenizer", str(gpt2), "--checkpoint", str(ckpt),
                     "--text", TEXTS[0], "-l", "transformer.wte"])
    plain.load_state_dict({k[len("module."):]: v for k, v in sd.items()})
    want = plain.transformer.wte(torch.tensor([[2, 3, 4, 5, 2]])).detach()
    row = doc["layers"][0]
    assert row["name"] == "transformer.wte"
    assert row["stats"]["mean"] == pytest.approx(float(want.double().mean()), rel=1e-6)


def test_a_pickled_dataparallel_model_is_unwrapped(wrapped_py, tmp_path):
    """A whole model saved wrapped (torch.save(DataParallel(net)), --trust-checkpoint)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                              torch.nn.Flatten(), torch.nn.Linear(4, 3)).eval()
    torch.save(torch.nn.DataParallel(net), tmp_path / "dp.pt")
    torch.save(net, tmp_path / "plain.pt")
    wrapped, err = _doc(["activations", str(tmp_path / "dp.pt"), "--trust-checkpoint", "--input-size", "3x16x16"])
    plain, _ = _doc(["activations", str(tmp_path / "plain.pt"), "--trust-checkpoint", "--input-size", "3x16x16"])
    assert wrapped["layers"] == plain["layers"] and [r["name"] for r in plain["layers"]][:2] == ["0", "1"]
    assert "note: Sequential is wrapped in DataParallel: inspected through .module" in err


@pytest.mark.slow
@pytest.mark.parametrize("command", ["summary", "activations", "grads", "guided-backprop", "cam", "attributions",
                                     "attention", "check"])
def test_every_command_treats_a_wrapped_model_as_the_plain_one(gpt2, wrapped_py, command):
    """Same exit code, same error line, same report numbers as the plain folder, in every command."""
    args = [command, "--input-size", "input_ids=8:int64:4-30", "-q"]
    plain = run_cli([args[0], str(gpt2), "--weights", "default", *args[1:]])
    for builder in ("compiled", "parallel"):
        r = run_cli([args[0], f"{wrapped_py}:{builder}", *args[1:]])
        assert r.exit_code == plain.exit_code, (builder, r.stderr, plain.stderr)
        assert r.exit_code != 6 and "unexpected" not in r.stderr
        # the lines may name the model as it was given (a folder, or FILE.py:BUILDER): the rest agrees
        spec = f"{wrapped_py}:{builder}"
        errors = [line.replace(spec, "MODEL").replace(f"{Path(spec).name}", "MODEL")
                  for line in r.stderr.splitlines() if line.startswith("error:")]
        assert errors == [line.replace(str(gpt2), "MODEL") for line in plain.stderr.splitlines()
                          if line.startswith("error:")]


def test_the_bare_methods_unwrap_too():
    """The methods under the commands (Python API) take a wrapper as the module it wraps."""
    import inspect_model as im

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                              torch.nn.Flatten(), torch.nn.Linear(4, 3)).eval()
    x = torch.randn(2, 3, 8, 8)
    want = im.capture_activations(net, x).layers
    grads = im.compute_gradients(net, x).layers
    cams = torch.stack([m.map for m in im.compute_cams(net, x, layers=["0"]).maps])
    for wrapper in (torch.compile(net), torch.nn.DataParallel(net)):
        assert [(r.name, r.stats) for r in im.capture_activations(wrapper, x).layers] == \
            [(r.name, r.stats) for r in want]
        assert [r.name for r in im.compute_gradients(wrapper, x).layers] == [r.name for r in grads]
        assert torch.equal(torch.stack([m.map for m in im.compute_cams(wrapper, x, layers=["0"]).maps]), cams)
