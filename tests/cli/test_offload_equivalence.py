"""Offloaded runs give the resident run's numbers (issue 37, first check).

A tiny Llama (text) and a tiny ViT (images) are saved with ``save_pretrained``; every
command runs once resident and once with its weights placed by accelerate: ``--offload``
(every block streamed from disk, loaded for its call and dropped after it) and a
``--device-map`` FILE keeping every block on the CPU behind accelerate's hooks (what CPU
offload is on a machine without a GPU). Every number of the reports must agree to 1e-6
(float32). ``grads`` reads parameter gradients, which disk-offloaded weights cannot keep: it
refuses in one line, and runs with the CPU placement.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from fixtures.text_models import save_text_model  # noqa: E402

import inspect_model as im  # noqa: E402
from inspect_model.run.options import InputOptions, ModelOptions  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CAT = str(ROOT / "sample_images" / "cat.jpg")
# Keys whose values are timings, versions or paths: not numbers of the model.
SKIP = {"throughput", "seconds", "options", "notes", "files", "tool_version", "torch_version", "python_version",
        "torchvision_version", "warnings", "time", "wall"}


def numbers(doc, path=""):
    """Every numeric leaf of a report, by its path."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k not in SKIP:
                yield from numbers(v, f"{path}/{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from numbers(v, f"{path}/{i}")
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        yield path, float(doc)


def max_diff(a: dict, b: dict) -> tuple[float, int]:
    na, nb = dict(numbers(a)), dict(numbers(b))
    assert na.keys() == nb.keys(), sorted(set(na) ^ set(nb))[:5]
    return max((abs(na[k] - nb[k]) for k in na), default=0.0), len(na)


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    return str(save_text_model("llama", tmp_path_factory.mktemp("llama")))


@pytest.fixture(scope="module")
def vit(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("vit")
    cfg = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=48, num_labels=3,
                                 architectures=["ViTForImageClassification"])
    torch.manual_seed(0)
    transformers.ViTForImageClassification(cfg).eval().save_pretrained(folder)
    return str(folder)


def cpu_map(folder: str, tmp_path: Path) -> str:
    """A device-map FILE with every top block on the CPU, one entry per block."""
    from accelerate import init_empty_weights

    cfg = transformers.AutoConfig.from_pretrained(folder)
    with init_empty_weights():
        model = transformers.AutoModelForImageClassification.from_config(cfg) if "ViT" in cfg.architectures[0] \
            else transformers.AutoModelForCausalLM.from_config(cfg)
    from inspect_model.loading.placement import split_offloaded

    table = {k: "cpu" for k in split_offloaded(model, {"": "disk"}, list(model._no_split_modules))}
    path = tmp_path / "cpu_map.json"
    path.write_text(json.dumps(table))
    return str(path)


TEXT = ["the cat sat on the mat"]
TEXT_COMMANDS = {
    "activations": lambda mo: im.activations(None, model_options=mo, inputs=InputOptions(text=TEXT)),
    "attention": lambda mo: im.attention(None, methods=["raw", "rollout"], model_options=mo,
                                         inputs=InputOptions(text=TEXT)),
}
IMAGE_COMMANDS = {
    "activations": lambda mo: im.activations(None, model_options=mo, inputs=InputOptions([CAT])),
    "check": lambda mo: im.check(None, model_options=mo, inputs=InputOptions([CAT])),
    "attention": lambda mo: im.attention(None, methods=["raw", "rollout"], model_options=mo,
                                         inputs=InputOptions([CAT])),
}
GRADIENT_COMMANDS = {
    "cam": lambda mo: im.cam(None, methods=["gradcam", "layercam"], model_options=mo, inputs=InputOptions([CAT])),
    "attributions": lambda mo: im.attributions(None, methods=["saliency", "integrated-gradients"], model_options=mo,
                                               inputs=InputOptions([CAT])),
    "attention-gradients": lambda mo: im.attention(None, methods=["grad-rollout", "legrad"], model_options=mo,
                                                   inputs=InputOptions([CAT])),
    "grads": lambda mo: im.grads(None, model_options=mo, inputs=InputOptions([CAT])),
}


@pytest.mark.parametrize("command", sorted(TEXT_COMMANDS))
def test_text_forward_commands_equal_with_disk_offload(llama, command):
    run = TEXT_COMMANDS[command]
    resident = run(ModelOptions(llama)).to_dict()
    offloaded = run(ModelOptions(llama, offload=True))
    placement = offloaded.to_dict()["options"]["placement"]
    assert set(placement.values()) == {"disk"} and "model.layers.1" in placement  # one entry per block
    diff, count = max_diff(resident, offloaded.to_dict())
    assert count > 20 and diff <= 1e-6


@pytest.mark.parametrize("command", sorted(IMAGE_COMMANDS))
def test_image_forward_commands_equal_with_disk_offload(vit, command):
    run = IMAGE_COMMANDS[command]
    diff, count = max_diff(run(ModelOptions(vit)).to_dict(), run(ModelOptions(vit, offload=True)).to_dict())
    assert count > 5 and diff <= 1e-6


@pytest.mark.parametrize("command", sorted(GRADIENT_COMMANDS))
def test_gradient_commands_equal_with_cpu_offload(vit, command, tmp_path):
    run = GRADIENT_COMMANDS[command]
    resident = run(ModelOptions(vit)).to_dict()
    placed = run(ModelOptions(vit, device_map=cpu_map(vit, tmp_path)))
    assert set(placed.to_dict()["options"]["placement"].values()) == {"cpu"}
    diff, count = max_diff(resident, placed.to_dict())
    assert count > 5 and diff <= 1e-6


@pytest.mark.parametrize("command", ["cam", "attributions", "attention-gradients"])
def test_output_and_input_gradients_work_with_disk_offload(vit, command):
    run = GRADIENT_COMMANDS[command]
    diff, count = max_diff(run(ModelOptions(vit)).to_dict(), run(ModelOptions(vit, offload=True)).to_dict())
    assert count > 5 and diff <= 1e-6


@pytest.mark.slow  # over 3 s: kept out of the quick tier
def test_grads_refuses_disk_offload_in_one_line(vit):
    r = subprocess.run([sys.executable, "-m", "inspect_model", "grads", vit, CAT, "--offload"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 3
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "parameter's gradient" in lines[0] and "offloaded" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_our_hooks_leave_and_accelerates_stay(vit):
    """The engine's torch hooks come off after the run; accelerate's forward wrappers stay,
    and what the engine keeps is on the CPU."""
    from inspect_model.engine.hooks import CaptureOptions, HookEngine
    from inspect_model.loading.placement import Placement
    from inspect_model.loading.sources import load_model

    loaded = load_model(vit, placement=Placement(offload=True))
    model = loaded.model
    wrapped = {n for n, m in model.named_modules() if hasattr(m, "_hf_hook")}
    assert wrapped
    names = [n for n, _ in model.named_modules() if n.startswith("vit.layers.")][:4]
    x = torch.rand(1, 3, 32, 32)
    with HookEngine(model, names, CaptureOptions(keep=True)) as eng, torch.no_grad():
        model(pixel_values=x)
    assert eng.records and all(c.tensor.device.type == "cpu" for r in eng.records for c in r.outputs)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert {n for n, m in model.named_modules() if hasattr(m, "_hf_hook")} == wrapped
    assert all(p.device.type == "meta" for p in model.parameters())  # still offloaded after the run


@pytest.mark.parametrize("command", ["activations", "guided-backprop"])
def test_torchvision_model_equal_with_disk_offload(command, tmp_path):
    """A model of another source (torchvision, seeded weights in a checkpoint): built empty,
    its blocks read from the checkpoint one at a time and written to the offload folder."""
    import torchvision

    torch.manual_seed(0)
    ckpt = tmp_path / "resnet18.pt"
    torch.save(torchvision.models.resnet18().state_dict(), ckpt)
    run = {"activations": lambda mo: im.activations(None, model_options=mo, inputs=InputOptions([CAT])),
           "guided-backprop": lambda mo: im.guided_backprop(None, model_options=mo, inputs=InputOptions([CAT]))}[command]
    resident = run(ModelOptions("resnet18", weights="none", checkpoint=str(ckpt))).to_dict()
    offloaded = run(ModelOptions("resnet18", weights="none", checkpoint=str(ckpt), offload=True)).to_dict()
    assert set(offloaded["options"]["placement"].values()) == {"disk"}
    diff, count = max_diff(resident, offloaded)
    assert count > 5 and diff <= 1e-6
