"""Unusual models and paths through the real CLI (found by a QA pass, issue 28's third round):

- A binary classifier's single logit, (N,) or (N, 1): every class command takes it as one
  class, and its probability is the sigmoid (a softmax over one class is always 1).
- A model saved in half precision runs in --dtype (a note says so), the caller's instance
  untouched, instead of failing in its first layer as a bad input.
- A pipe or device where a file is expected (a FIFO image or model file, ``--config
  /dev/zero``): one line, never a hang or a read without end.
- A run's output directory inside its input folder: a re-run does not read its own pictures.
"""

from __future__ import annotations

import copy
import json
import math
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch import nn

from fixtures.invariants import assert_same, register_model, snapshot
from fixtures.models import TinyCNN
from inspect_model import errors

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

IN = ["--weights", "none", "--input-size", "3x16x16", "--quiet"]


class OneLogit(nn.Module):
    """A binary classifier: conv, ReLU, pool, one output score, (N,) or (N, 1)."""

    def __init__(self, flat: bool = True) -> None:
        super().__init__()
        self.flat = flat
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(torch.relu(self.conv(x)).mean((2, 3)))
        return y[:, 0] if self.flat else y


class Squeezed(TinyCNN):
    """``.squeeze()`` on its output: (classes,) for one input, no batch of scores."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).squeeze()


def _one_error(res, code: int, *needles: str) -> str:  # type: ignore[no-untyped-def]
    assert "Traceback" not in res.stderr, res.stderr
    errs = [ln for ln in res.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errs) == 1 and res.stderr.strip().splitlines()[-1] == errs[0], res.stderr
    assert res.exit_code == code, (res.exit_code, errs[0])
    for n in needles:
        assert n.lower() in errs[0].lower(), (n, errs[0])
    return errs[0]


def _seeded_input() -> torch.Tensor:
    """The input that ``--input-size 3x16x16`` (seed 0) feeds the model."""
    from inspect_model.loading.shapes import make_example_inputs

    (x,) = make_example_inputs([(3, 16, 16)], batch_size=1, dtype=torch.float32, device="cpu", seed=0)
    return x


# ------------------------------------------------------------------ one logit
@pytest.mark.parametrize("flat", [True, False], ids=["N", "N-1"])
def test_single_logit_cam_probability_is_the_sigmoid(flat: bool, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    model = OneLogit(flat).eval()
    spec = register_model(monkeypatch, model)
    before = snapshot(model)
    res = cli(["cam", spec, *IN, "--json", "--method", "gradcam,scorecam"])
    assert res.exit_code == 0, res.stderr
    assert_same(model, before)
    pred = json.loads(res.stdout)["images"][0]["predictions"][0]
    with torch.no_grad():
        logit = model(_seeded_input()).reshape(-1)[0]
    assert pred["class"] == 0
    assert pred["score"] == pytest.approx(float(logit), rel=1e-5)
    assert pred["probability"] == pytest.approx(1 / (1 + math.exp(-float(logit))), abs=1e-6)
    assert 0.0 < pred["probability"] < 1.0  # a softmax over one class would say 1.0


@pytest.mark.parametrize("command", ["grads", "guided-backprop", "attributions", "cam"])
def test_single_logit_runs_in_every_class_command(command: str, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    model = OneLogit(flat=True)
    spec = register_model(monkeypatch, model)
    before = snapshot(model)
    res = cli([command, spec, *IN, "--json"])
    assert res.exit_code == 0, res.stderr
    assert "error:" not in res.stderr
    assert_same(model, before)


def test_single_logit_grads_objective_is_the_logit(monkeypatch: pytest.MonkeyPatch, cli) -> None:
    """grads' objective for an (N,) output is the logit itself: compared with the model's
    own output on the input the report's statistics were taken on (the same seed)."""
    model = OneLogit(flat=True).eval()
    spec = register_model(monkeypatch, model)
    out = cli(["grads", spec, *IN, "--json"])
    assert out.exit_code == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["images"][0]["targets"] == [0]
    # The input grad norm of d logit / d x, recomputed by autograd on the same input.
    x = _seeded_input().requires_grad_(True)
    y = model(x)
    (g,) = torch.autograd.grad(y.sum(), x)
    assert rep["images"][0]["objective"] == pytest.approx(float(y.detach()[0]), rel=1e-5)
    assert rep["images"][0]["input_grad_norm"] == pytest.approx(float(g.norm()), rel=1e-4)


@pytest.mark.parametrize("argv", [["cam"], ["grads"], ["grads", "--of", "score", "--wrt", "features.0"]],
                         ids=["cam", "grads", "grads-of-score"])
def test_squeezed_scores_of_one_input_are_refused(argv: list[str], monkeypatch: pytest.MonkeyPatch, cli) -> None:
    """(classes,) for a batch of one is no batch of single scores: refused, not explained as 5 inputs."""
    spec = register_model(monkeypatch, Squeezed())
    res = cli([argv[0], spec, *IN, *argv[1:]])
    _one_error(res, errors.EXIT_RUNTIME, "(5,)", "batch of 1")


# ------------------------------------------------------------------ half precision
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("command", ["summary", "activations", "grads", "guided-backprop", "cam", "attributions",
                                     "check"])
def test_half_precision_model_runs_in_dtype(command: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch,
                                            cli) -> None:
    model = TinyCNN().to(dtype)
    spec = register_model(monkeypatch, model)
    before = snapshot(model)
    res = cli([command, spec, *IN[:-1]])
    assert res.exit_code == 0, res.stderr
    name = str(dtype).replace("torch.", "")
    assert f"parameters are {name}; cast to float32" in res.stderr + res.stdout  # summary: in its report
    assert_same(model, before)  # the caller's instance: still half precision, no hooks, no copy cast in place


def test_half_precision_numbers_are_the_float32_models(monkeypatch: pytest.MonkeyPatch, cli) -> None:
    model = TinyCNN().to(torch.bfloat16).eval()
    spec = register_model(monkeypatch, model)
    res = cli(["cam", spec, *IN, "--json"])
    assert res.exit_code == 0, res.stderr
    pred = json.loads(res.stdout)["images"][0]["predictions"][0]
    with torch.no_grad():
        ref = copy.deepcopy(model).float()(_seeded_input())[0]
    assert pred["class"] == int(ref.argmax())
    assert pred["score"] == pytest.approx(float(ref.max()), rel=1e-5)


# ------------------------------------------------------------------ pipes and devices
@pytest.fixture
def deadline() -> Iterator[None]:
    """A hang (open() of a FIFO blocks until a writer comes) fails the test instead of CI."""
    def hung(signum: int, frame: object) -> None:
        raise TimeoutError("the command blocked on a pipe")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _fifo(tmp: Path, name: str) -> str:
    p = tmp / name
    os.mkfifo(p)
    return str(p)


PIPES = [  # (id, argv(tmp, spec), exit code, what the line names)
    ("image-fifo", lambda t, s: ["cam", s, "--weights", "none", _fifo(t, "pic.png")], errors.EXIT_INPUT, "pic.png"),
    ("image-dev-zero", lambda t, s: ["grads", s, "--weights", "none", "/dev/zero"], errors.EXIT_INPUT, "/dev/zero"),
    ("model-file-fifo", lambda t, s: ["cam", f"{_fifo(t, 'net.py')}:Net", *IN], errors.EXIT_MODEL_LOAD, "net.py"),
    ("model-path-fifo", lambda t, s: ["summary", _fifo(t, "net.pt"), "--input-size", "3x8x8"], errors.EXIT_MODEL_LOAD,
     "net.pt"),
    ("checkpoint-fifo", lambda t, s: ["cam", s, *IN, "--checkpoint", _fifo(t, "ck.pt")], errors.EXIT_MODEL_LOAD,
     "ck.pt"),
    ("labels-fifo", lambda t, s: ["cam", s, *IN, "--labels", _fifo(t, "labels.txt")], errors.EXIT_INPUT,
     "labels.txt"),
    ("labels-dev-zero", lambda t, s: ["guided-backprop", s, *IN, "--labels", "/dev/zero"], errors.EXIT_INPUT,
     "/dev/zero"),
    ("true-labels-fifo", lambda t, s: ["grads", s, *IN, "--loss", "cross-entropy", "--labels-file",
                                       _fifo(t, "truth.txt")], errors.EXIT_INPUT, "truth.txt"),
    ("config-dev-zero", lambda t, s: ["cam", s, *IN, "--config", "/dev/zero"], errors.EXIT_USAGE, "/dev/zero"),
    ("config-fifo", lambda t, s: ["activations", s, *IN, "--config", _fifo(t, "cfg.toml")], errors.EXIT_USAGE,
     "cfg.toml"),
    ("boxes-fifo", lambda t, s: ["cam", s, *IN, "--evaluate", "--boxes", _fifo(t, "boxes.json")], errors.EXIT_INPUT,
     "boxes.json"),
    ("inputs-file-dev-zero", lambda t, s: ["activations", s, *IN, "--inputs-file", "/dev/zero"], errors.EXIT_INPUT,
     "/dev/zero"),
]


@pytest.mark.parametrize(("argv", "code", "names"), [p[1:] for p in PIPES], ids=[p[0] for p in PIPES])
def test_a_pipe_or_device_is_one_line_and_no_hang(  # type: ignore[no-untyped-def]
        argv, code: int, names: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli, deadline) -> None:
    model = TinyCNN()
    spec = register_model(monkeypatch, model)
    before = snapshot(model)
    out = tmp_path / "out"
    res = cli([*argv(tmp_path, spec), "-o", str(out)])
    _one_error(res, code, names, "not a regular file")
    assert not out.exists()
    assert_same(model, before)


def test_small_text_files_are_read_up_to_a_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from inspect_model.loading import parsing
    from inspect_model.methods.objectives.targets import load_labels

    p = tmp_path / "labels.txt"
    p.write_text("cat\n" * 100)
    assert len(load_labels(p)) == 100
    monkeypatch.setattr(parsing, "MAX_TEXT_BYTES", 64)
    with pytest.raises(errors.InputError, match="labels.txt' is over 64 bytes"):
        load_labels(p)


# ------------------------------------------------------------------ output inside the input folder
def test_a_rerun_into_a_folder_inside_the_inputs_reads_no_earlier_results(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          cli) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(2):
        Image.new("RGB", (20, 20), (40 * i, 90, 200)).save(photos / f"p{i}.png")
    spec = register_model(monkeypatch, TinyCNN())
    out = photos / "out"
    for force in ([], ["--force"]):  # the second run finds the first run's PNGs under photos/
        res = cli(["cam", spec, "--weights", "none", str(photos), "-o", str(out), *force])
        assert res.exit_code == 0, res.stderr
        rep = json.loads((out / "report.json").read_text())
        assert [Path(e["image"]).name for e in rep["images"]] == ["p0.png", "p1.png"]
    assert "left out" in res.stderr and "under the output directory" in res.stderr
    glob = cli(["cam", spec, "--weights", "none", f"{photos}/**/*.png", "-o", str(out), "--force"])
    assert glob.exit_code == 0, glob.stderr
    assert json.loads((out / "report.json").read_text())["image_count"] == 2
    # Named on its own, an earlier result is an input like any other.
    sheet = next(out.glob("images/*/*.png"))
    one = cli(["cam", spec, "--weights", "none", str(sheet), "-o", str(tmp_path / "again")])
    assert one.exit_code == 0, one.stderr


def test_output_dir_equal_to_the_input_folder_keeps_the_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               cli) -> None:
    """-o the input folder itself: its pictures are the inputs (nothing to tell apart)."""
    photos = tmp_path / "photos"
    photos.mkdir()
    Image.new("RGB", (20, 20), (10, 90, 200)).save(photos / "p.png")
    spec = register_model(monkeypatch, TinyCNN())
    res = cli(["cam", spec, "--weights", "none", str(photos), "-o", str(photos), "--force"])
    assert res.exit_code == 0, res.stderr
    assert json.loads((photos / "report.json").read_text())["image_count"] == 1


class VitOneLogit(nn.Module):
    """A tiny torchvision ViT with one output score, (N,)."""

    def __init__(self) -> None:
        super().__init__()
        from torchvision.models import VisionTransformer

        self.vit = VisionTransformer(image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8,
                                     mlp_dim=16, num_classes=1)
        nn.init.normal_(self.vit.heads.head.weight, std=0.5)  # torchvision starts the head at zero

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.vit(x)[:, 0]


def test_single_logit_attention(monkeypatch: pytest.MonkeyPatch, cli) -> None:
    """attention (gradient methods included) on a one-logit ViT: class 0, sigmoid probability."""
    model = VitOneLogit().eval()
    spec = register_model(monkeypatch, model)
    before = snapshot(model)
    res = cli(["attention", spec, *IN, "--json", "--method", "rollout,grad-rollout"])
    assert res.exit_code == 0, res.stderr
    assert_same(model, before)
    target = json.loads(res.stdout)["images"][0]["target"]
    with torch.no_grad():
        logit = float(model(_seeded_input())[0])
    assert target["class"] == 0
    assert target["probability"] == pytest.approx(1 / (1 + math.exp(-logit)), abs=1e-6)


# ------------------------------------------------------------------ a 1-channel model fed colour pictures
class Gray(nn.Module):
    """MNIST-like: one input channel; keeps what it was fed."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.fc = nn.Linear(2, 3)
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.detach().clone())
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


def test_gray_model_fed_rgb_sees_luma_normalised_as_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              cli) -> None:
    """The picture becomes Pillow's ITU-R 601 luma, resized and cropped as torchvision does,
    normalised by the mean of the preset's three values, and the report says those values."""
    import torchvision.transforms.functional as TF

    pic = tmp_path / "colour.png"
    gen = torch.Generator().manual_seed(1)
    Image.fromarray((torch.rand(40, 50, 3, generator=gen) * 255).byte().numpy()).save(pic)
    model = Gray()
    spec = register_model(monkeypatch, model)
    res = cli(["activations", spec, "--weights", "none", str(pic), "--json", "--resize", "32", "--crop", "28"])
    assert res.exit_code == 0, res.stderr
    pre = json.loads(res.stdout)["options"]["inputs"]["preprocessing"]
    mean, std = sum((0.485, 0.456, 0.406)) / 3, sum((0.229, 0.224, 0.225)) / 3
    assert pre["mean"] == pytest.approx([mean]) and pre["std"] == pytest.approx([std])
    img = TF.center_crop(TF.resize(Image.open(pic).convert("L"), 32), [28, 28])
    want = (TF.pil_to_tensor(img).float() / 255 - mean) / std
    assert torch.allclose(model.seen[-1][0], want, atol=1e-5)


# ------------------------------------------------------------------ a module under two names
class Aliased(TinyCNN):
    """``self.stem = self.features[0]``: PyTorch lists the module once, as 'features.0'."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = self.features[0]


@pytest.mark.parametrize("argv", [["activations", "--layers", "stem"], ["grads", "--layers", "stem"],
                                  ["cam", "--layer", "stem"]], ids=["activations", "grads", "cam"])
def test_a_layer_named_by_its_alias_is_found(argv: list[str], monkeypatch: pytest.MonkeyPatch, cli) -> None:
    model = Aliased()
    spec = register_model(monkeypatch, model)
    before = snapshot(model)
    res = cli([argv[0], spec, *IN[:-1], "--json", *argv[1:]])
    assert res.exit_code == 0, res.stderr
    assert "features.0" in res.stdout
    assert_same(model, before)


def test_alias_lookup_is_by_identity() -> None:
    from inspect_model.engine.selection import select_layers

    m = Aliased()
    assert select_layers(m, ["stem"]) == ["features.0"]
    assert select_layers(m, ["stem", "features.0"]) == ["features.0"]
    with pytest.raises(errors.LayerSelectionError, match="'stm' not found"):
        select_layers(m, ["stm"])
    with pytest.raises(errors.LayerSelectionError):
        select_layers(m, ["flatten"])  # an attribute that is no module


# ------------------------------------------------------------------ stdout that cannot be written
_NET = """
from torch import nn
def net():
    return nn.Sequential(nn.Conv2d(3, 2, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))
"""


@pytest.mark.parametrize("where", ["full", "closed"])
def test_a_report_stdout_cannot_take_is_an_output_error(where: str, tmp_path: Path) -> None:
    """``>/dev/full`` or ``>&-``: exit 7 and one line, not an 'unexpected' exit 6."""
    import subprocess
    import sys

    if where == "full" and not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    (tmp_path / "nets.py").write_text(_NET)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "inspect_model", "summary", f"{tmp_path / 'nets.py'}:net", "--input-size",
            "3x8x8", "--device", "cpu", "--json"]
    with open("/dev/full" if where == "full" else os.devnull, "w") as sink:
        proc = subprocess.run(argv, stdout=sink, stderr=subprocess.PIPE, text=True, env=env, timeout=120,
                              preexec_fn=(lambda: os.close(1)) if where == "closed" else None)
    assert "Traceback" not in proc.stderr and "unexpected" not in proc.stderr, proc.stderr
    assert proc.returncode == errors.EXIT_OUTPUT, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: cannot write the report")


def test_output_dir_that_is_a_dangling_link_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    link = tmp_path / "results"
    link.symlink_to(tmp_path / "nowhere")
    spec = register_model(monkeypatch, TinyCNN())
    res = cli(["cam", spec, *IN, "-o", str(link)])
    _one_error(res, errors.EXIT_OUTPUT, "symbolic link", "nowhere", "does not exist")
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()


# ------------------------------------------------------------------ a torchvision model fine-tuned to 10 classes
def test_torchvision_checkpoint_with_another_class_count(tmp_path: Path, cli) -> None:
    """The common fine-tune: the error names the fix (--model-arg num_classes=10), and with it
    the run explains the checkpoint's model (scores checked against torchvision's own)."""
    from torchvision.models import shufflenet_v2_x0_5

    torch.manual_seed(3)
    ref = shufflenet_v2_x0_5(num_classes=10).eval()
    ck = tmp_path / "finetuned.pt"
    torch.save({"state_dict": {f"module.{k}": v for k, v in ref.state_dict().items()}, "epoch": 7}, ck)
    base = ["cam", "shufflenet_v2_x0_5", "--weights", "none", "--checkpoint", str(ck), "--input-size", "3x16x16",
            "--quiet", "--json"]
    _one_error(cli(base), errors.EXIT_MODEL_LOAD, "10 outputs", "--model-arg num_classes=10")
    res = cli([*base, "--model-arg", "num_classes=10"])
    assert res.exit_code == 0, res.stderr
    pred = json.loads(res.stdout)["images"][0]["predictions"][0]
    with torch.no_grad():
        want = ref(_seeded_input())[0]
    assert pred["class"] == int(want.argmax())
    assert pred["score"] == pytest.approx(float(want.max()), rel=1e-4)


@pytest.mark.parametrize("flat", [True, False], ids=["N", "N-1"])
def test_single_logit_cross_entropy_is_the_binary_one(flat: bool, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    """--loss cross-entropy of a one-score model: softmax over one class made it 0 with no
    gradient at all; it is BCE-with-logits against the label 0 or 1 (torch's own, below)."""
    model = OneLogit(flat).eval()
    spec = register_model(monkeypatch, model)
    with torch.no_grad():
        z = model(_seeded_input()).reshape(-1)
    for label in (0, 1):
        res = cli(["grads", spec, *IN, "--json", "--loss", "cross-entropy", "--label", str(label)])
        assert res.exit_code == 0, res.stderr
        rep = json.loads(res.stdout)
        want = nn.functional.binary_cross_entropy_with_logits(z, torch.tensor([float(label)]))
        assert rep["images"][0]["objective"] == pytest.approx(float(want), rel=1e-5)
        assert rep["global_grad_norm"] > 0
    _one_error(cli(["grads", spec, *IN, "--loss", "cross-entropy", "--label", "2"]), errors.EXIT_INPUT,
               "label 2", "0 or 1")


def test_checkpoint_without_cached_default_weights_says_how(cli, tmp_path, monkeypatch) -> None:
    """--checkpoint on a torchvision name builds it with its default weights first; offline
    and uncached, the one line names the checkpoint and --weights none, and that works."""
    import torch
    import torchvision

    CAT = str(Path(__file__).resolve().parents[2] / "sample_images" / "cat.jpg")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("INSPECT_MODEL_OFFLINE", "1")
    ckpt = tmp_path / "r18.pt"
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), ckpt)
    r = cli(["cam", "resnet18", CAT, "--checkpoint", str(ckpt), "--json"])
    assert r.exit_code != 0 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert f"--checkpoint {ckpt}" in r.stderr and "--weights none" in r.stderr and "or pass --checkpoint" not in r.stderr
    r = cli(["cam", "resnet18", CAT, "--checkpoint", str(ckpt), "--weights", "none", "--json"])
    assert r.exit_code == 0, r.stderr
    r = cli(["cam", "resnet18", CAT, "--json"])  # no checkpoint: the plain message, which offers one
    assert r.exit_code != 0 and "or pass --checkpoint FILE" in r.stderr


def test_an_empty_cam_layer_is_a_usage_error(cli, models_py) -> None:
    """`cam --layer ''` used to fall back to the automatic choice without a word."""
    cat = str(Path(__file__).resolve().parents[2] / "sample_images" / "cat.jpg")
    r = cli(["cam", f"{models_py}:TinyCNN", cat, "--layer", "", "--json"])
    assert r.exit_code == 2 and "empty layer spec" in r.stderr and r.stderr.count("\n") == 1
