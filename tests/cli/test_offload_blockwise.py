"""Models of every source placed block by block (issue 37).

torchvision, timm and user models under ``--offload``/``--device-map`` are built empty and
given their weights one block at a time: from ``--checkpoint`` (a torch.save archive read with
``weights_only=True`` and memory-mapped, or safetensors), or at random. A fine-tuned checkpoint
gives the resident run's numbers; tied weights (GPT-2's head is its embedding) stay tied
under ``--weights none``; ``--offload [DIR]`` takes an optional folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
torch = pytest.importorskip("torch")

import inspect_model as im  # noqa: E402
from inspect_model.run.options import InputOptions, ModelOptions  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CAT = str(ROOT / "sample_images" / "cat.jpg")


@pytest.fixture(scope="module")
def resnet_checkpoints(tmp_path_factory) -> dict[str, str]:
    """A "fine-tuned" resnet18: seeded weights and running statistics, saved as a DDP-style
    torch checkpoint ('model' key, 'module.' prefix) and as safetensors."""
    import torchvision
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(1)
    model = torchvision.models.resnet18().eval()
    for mod in model.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.1, 0.1)
            mod.running_var.uniform_(0.5, 1.5)
    sd = model.state_dict()
    torch.save({"model": {"module." + k: v for k, v in sd.items()}, "epoch": 3}, folder / "r.pt")
    save_file({k: v.contiguous() for k, v in sd.items()}, folder / "r.safetensors")
    return {"torch": str(folder / "r.pt"), "safetensors": str(folder / "r.safetensors")}


def layers(**kw) -> dict:
    doc = im.activations(None, model_options=ModelOptions("resnet18", weights="none", **kw),
                         inputs=InputOptions([CAT])).to_dict()
    return doc


@pytest.mark.slow  # over 3 s (issue 35: the quick tier under 2 minutes); full run only
@pytest.mark.parametrize("kind", ["torch", "safetensors"])
@pytest.mark.parametrize("where", ["offload", "device_map"])
def test_a_checkpoint_gives_the_resident_numbers_placed(resnet_checkpoints, kind, where):
    ckpt = resnet_checkpoints[kind]
    resident = layers(checkpoint=resnet_checkpoints["torch"])
    placed = layers(checkpoint=ckpt, **({"offload": True} if where == "offload" else {"device_map": "auto"}))
    assert set(placed["options"]["placement"].values()) == ({"disk"} if where == "offload" else {"cpu"})
    assert json.dumps(placed["layers"], sort_keys=True) == json.dumps(resident["layers"], sort_keys=True)
    assert len(placed["layers"]) > 20


def test_the_checkpoint_note_says_it_was_read_block_by_block(resnet_checkpoints):
    from inspect_model.loading.placement import Placement
    from inspect_model.loading.sources import load_model

    loaded = load_model("resnet18", weights="none", checkpoint=resnet_checkpoints["torch"],
                        placement=Placement(offload=True))
    assert loaded.checkpoint.key == "model" and loaded.checkpoint.stripped == ["module."]
    assert loaded.checkpoint.loaded == len(torch.load(resnet_checkpoints["torch"], weights_only=True)["model"])
    assert any(n.endswith(" tensors (read block by block)") for n in loaded.notes)
    assert all(p.device.type == "meta" for p in loaded.model.parameters())  # all on the disk


def test_a_hugging_face_model_takes_a_checkpoint_placed(tmp_path):
    """A fine-tuned state dict of a Hugging Face model: its blocks read from the file (not from
    the folder's shards), the numbers those of the resident run with the same checkpoint."""
    pytest.importorskip("transformers")
    from fixtures.text_models import save_text_model
    from inspect_model.loading.sources import load_model

    folder = str(save_text_model("llama", tmp_path / "llama"))
    model = load_model(folder, weights="DEFAULT").model
    torch.manual_seed(3)
    tuned = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v for k, v in model.state_dict().items()}
    torch.save(tuned, tmp_path / "tuned.pt")

    def run(**kw):
        return im.activations(None, model_options=ModelOptions(folder, checkpoint=str(tmp_path / "tuned.pt"), **kw),
                              inputs=InputOptions(text=["the cat sat on the mat"])).to_dict()

    resident, placed, plain = run(), run(offload=True), im.activations(
        None, model_options=ModelOptions(folder, offload=True), inputs=InputOptions(text=["the cat sat on the mat"])
    ).to_dict()
    assert set(placed["options"]["placement"].values()) == {"disk"}
    assert json.dumps(placed["layers"], sort_keys=True) == json.dumps(resident["layers"], sort_keys=True)
    assert json.dumps(plain["layers"], sort_keys=True) != json.dumps(resident["layers"], sort_keys=True)


def test_checkpoint_errors_under_placement_are_the_resident_ones(resnet_checkpoints, tmp_path):
    from inspect_model.errors import ModelLoadError

    sd = torch.load(resnet_checkpoints["torch"], weights_only=True)["model"]
    del sd["module.fc.bias"]
    bad = tmp_path / "bad.pt"
    torch.save(sd, bad)
    with pytest.raises(ModelLoadError) as placed:
        layers(checkpoint=str(bad), offload=True)
    with pytest.raises(ModelLoadError) as resident:
        layers(checkpoint=str(bad))
    assert str(placed.value) == str(resident.value)
    assert "1 missing keys: fc.bias" in str(placed.value)
    doc = layers(checkpoint=str(bad), offload=True, non_strict=True)  # the missing bias made at random
    assert doc["layers"]


def test_a_pickled_checkpoint_is_refused_placed_too(tmp_path):
    from inspect_model.errors import ModelLoadError

    path = tmp_path / "obj.pt"
    torch.save({"model": torch.nn.Linear(2, 2)}, path)  # a whole module: needs unpickling
    with pytest.raises(ModelLoadError, match="could run code from the file"):
        layers(checkpoint=str(path), offload=True)


def test_random_torchvision_weights_are_made_block_by_block():
    from inspect_model.loading.placement import Placement
    from inspect_model.loading.sources import load_model

    assert any("made block by block" in n for n in load_model(
        "resnet18", weights="none", placement=Placement(offload=True)).notes)
    doc = layers(offload=True)
    assert set(doc["options"]["placement"].values()) == {"disk"}
    stds = [layer["stats"]["std"] for layer in doc["layers"] if "stats" in layer]
    assert stds and all(s == s for s in stds)  # numbers, no NaN from an uninitialised block


@pytest.mark.parametrize("placement", [{"offload": True}, {"device_map": "auto"}])
def test_tied_weights_stay_tied_under_weights_none(tmp_path, placement):
    """GPT-2's head is its embedding: with --weights none each block is made in turn, and the
    head must read the embedding's values (before: an untied random head)."""
    transformers = pytest.importorskip("transformers")
    from inspect_model.loading.placement import Placement
    from inspect_model.loading.sources import load_model

    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=32,
                                  bos_token_id=0, eos_token_id=0, architectures=["GPT2LMHeadModel"])
    cfg.save_pretrained(tmp_path)
    model = load_model(str(tmp_path), weights="none", placement=Placement(**placement)).model
    ids = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        emb = model.transformer.wte(torch.arange(100)[None])[0]  # (V, D): the embedding's rows
    head = out.hidden_states[-1][0] @ emb.T  # (T, V): what a tied head computes
    assert torch.equal(out.logits[0], head)
    if "device_map" in placement:
        assert model.lm_head.weight is model.transformer.wte.weight


@pytest.mark.slow  # over 3 s (issue 35: the quick tier under 2 minutes); full run only
def test_offload_takes_an_optional_folder(tmp_path, cli):
    """`--offload` alone: a temporary folder, gone afterwards; `--offload DIR` and
    `--offload=DIR`: a fresh folder in DIR; `--offload-dir DIR`: the older spelling."""
    import subprocess
    import sys

    base = ["activations", "resnet18", CAT, "--weights", "none", "--json"]
    for extra, folder in ((["--offload"], None), (["--offload", str(tmp_path / "a")], tmp_path / "a"),
                          ([f"--offload={tmp_path / 'b'}"], tmp_path / "b"),
                          (["--offload-dir", str(tmp_path / "c")], tmp_path / "c")):
        if folder is None:  # a process of its own: the temporary folder is removed when it ends
            r = subprocess.run([sys.executable, "-m", "inspect_model", *base, *extra], capture_output=True,
                               text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
            assert r.returncode == 0, r.stderr
        else:
            r = cli(base + extra)
            assert r.exit_code == 0, r.stderr
        doc = json.loads(r.stdout)
        assert set(doc["options"]["placement"].values()) == {"disk"}
        note = next(n for n in r.stderr.splitlines() if "offloaded weights in" in n)
        used = note.rsplit("offloaded weights in ", 1)[1].strip()
        assert "inspect-model-offload-" in os.path.basename(used)
        if folder is None:
            assert not os.path.exists(used)  # removed when the run ended
        else:
            assert os.path.dirname(used) == str(folder)  # a fresh folder in DIR: never a previous run's weights
    r = cli(["activations", "resnet18", "--weights", "none", "--offload", CAT])
    assert r.exit_code == 2
    assert r.stderr.strip() == (f"error: --offload '{CAT}' is a file; give a folder (--offload takes the next word "
                                "as its folder: put MODEL and images before it, or write --offload=DIR)")
    r = cli(base + ["--offload", str(tmp_path / "a"), "--offload-dir", str(tmp_path / "z")])
    assert r.exit_code == 2
    assert r.stderr.strip() == f"error: --offload {tmp_path / 'a'} and --offload-dir {tmp_path / 'z'}: give one folder"


def test_optional_values_are_filled_before_parsing():
    from inspect_model.cli.optional_values import fill_optional_values

    assert fill_optional_values(["m", "--offload"]) == ["m", "--offload="]
    assert fill_optional_values(["m", "--offload", "--json"]) == ["m", "--offload=", "--json"]
    assert fill_optional_values(["m", "--offload", "d"]) == ["m", "--offload", "d"]
    assert fill_optional_values(["m", "--offload", "-"]) == ["m", "--offload", "-"]
    assert fill_optional_values(["m", "--", "--offload"]) == ["m", "--", "--offload"]


def test_help_shows_the_optional_folder_without_torch():
    import subprocess
    import sys

    code = ("import sys; from inspect_model.cli.launch import main; sys.argv = ['inspect-model', 'activations', "
            "'--help'];\ntry:\n    main()\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "COLUMNS": "200", "PYTHONPATH": os.pathsep.join(sys.path)})
    assert "--offload [DIR]" in r.stdout and "--offload-dir" not in r.stdout
    assert r.stdout.strip().splitlines()[-1] == "False"


def test_a_gpu_the_machine_lacks_is_one_line(cli):
    if torch.cuda.device_count() > 7:
        pytest.skip("a machine with eight GPUs has GPU 7")
    r = cli(["activations", "resnet18", CAT, "--weights", "none", "--max-memory", "7=1GB,cpu=1GB"])
    assert r.exit_code == 2
    have = torch.cuda.device_count()
    assert r.stderr.strip() == ("error: --max-memory names GPU 7, and this machine has "
                                + ("no GPU" if not have else f"{have} (0-{have - 1})")
                                + "; give cpu=SIZE only, or the GPUs it has")
