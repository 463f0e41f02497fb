"""Every example in README.md runs (issue 12): the Python API block is executed as it is, and
every `inspect-model` command line (the bash blocks and the GitHub Actions job) runs in a
fresh directory holding the files it names, with `--weights none` added where weights would
be downloaded (nothing can be downloaded here). A README example can never crash again."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from PIL import Image

from conftest import ROOT, run_cli

README = (ROOT / "README.md").read_text()

MY_NET = '''
import torch
from torch import nn


class Net(nn.Module):
    """Any channel count in (averaged first), 10 classes out."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        x = self.relu(self.conv(x.mean(dim=1, keepdim=True)))
        return self.fc(torch.flatten(self.pool(x), 1))


def build():
    return Net()
'''


TWO_IN = '''
import torch
from torch import nn


class Net(nn.Module):
    """forward(self, a, b): an image and a vector of 10."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.side = nn.Linear(10, 4)
        self.fc = nn.Linear(4, 3)

    def forward(self, a, b):
        return self.fc(self.relu(self.conv(a)).mean((2, 3)) + self.side(b))
'''

BERT = '''
import torch
from torch import nn


class TinyText(nn.Module):
    """forward(input_ids=..., attention_mask=...), BERT's vocabulary size."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(30522, 8)
        self.mix = nn.Linear(8, 8)
        self.fc = nn.Linear(8, 2)

    def forward(self, input_ids, attention_mask):
        h = torch.relu(self.mix(self.embed(input_ids))) * attention_mask[..., None]
        return self.fc(h.mean(1))


def build():
    return TinyText()
'''


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, flags=re.S | re.M)


def _command_lines() -> list[str]:
    lines = []
    for block in _blocks("bash"):
        # Lines that start with the tool (or feed it from `find`); install lines (pip, pipx,
        # uvx) need the network, and torchrun lines are run by tests/e2e/test_distributed.py.
        lines += [ln for ln in block.splitlines() if ln.startswith(("inspect-model ", "find "))]
    for block in _blocks("yaml"):
        lines += [ln.split("run:", 1)[1] for ln in block.splitlines() if "run: inspect-model" in ln]
    return [ln.split("  #")[0].strip() for ln in lines]


def _workdir(tmp: Path) -> None:
    """The files the examples name, in a fresh directory."""
    shutil.copytree(ROOT / "sample_images", tmp / "sample_images", ignore=shutil.ignore_patterns("readme"))
    shutil.copytree(ROOT / "configs", tmp / "configs")
    shutil.copy(ROOT / "sample_images" / "cat.jpg", tmp / "cat.jpg")
    (tmp / "photos").mkdir()
    (tmp / "data" / "a").mkdir(parents=True)
    for i, name in enumerate(["astronaut.jpg", "coffee.jpg"]):
        img = Image.open(ROOT / "sample_images" / name).convert("RGB")
        img.thumbnail((96, 96))
        img.save(tmp / "photos" / f"p{i}.jpg")
    shutil.copy(tmp / "photos" / "p0.jpg", tmp / "data" / "a" / "x.jpg")
    for where in (tmp, tmp / "models"):
        where.mkdir(exist_ok=True)
        (where / ("my_net.py" if where == tmp else "net.py")).write_text(MY_NET)
    ns: dict[str, object] = {}
    exec(compile(MY_NET, "my_net.py", "exec"), ns)
    state = ns["build"]().state_dict()  # type: ignore[operator]
    torch.save(state, tmp / "best.pt")
    from torchvision.models import ResNet18_Weights

    (tmp / "imagenet.txt").write_text("\n".join(ResNet18_Weights.DEFAULT.meta["categories"]) + "\n")
    (tmp / "boxes.csv").write_text("image,x0,y0,x1,y1\np0.jpg,10,10,60,60\np1.jpg,5,5,40,50\n")
    (tmp / "two_in.py").write_text(TWO_IN)
    (tmp / "bert.py").write_text(BERT)
    shutil.copy(tmp / "photos" / "p0.jpg", tmp / "photo.jpg")
    torch.save((torch.zeros(1, 3, 224, 224), torch.ones(1, 10)), tmp / "side.pt")
    (tmp / "data" / "val").mkdir()
    for p in (tmp / "photos").iterdir():
        shutil.copy(p, tmp / "data" / "val" / p.name)
    (tmp / "weights").mkdir()
    torch.save(state, tmp / "weights" / "best.pt")


def _argv(line: str) -> tuple[list[str], str | None, str | None]:
    """argv after `inspect-model`, stdin text (from `find ... |`), and what stdout is piped to."""
    stdin = None
    if line.startswith("find "):
        stdin = "data/a/x.jpg\n"
        line = line.split("|", 1)[1].strip()
    pipe = None
    for sep in ("|", ">"):
        if sep in line:
            line, pipe = line.split(sep, 1)[0].strip(), sep + line.split(sep, 1)[1]
    argv = [a.replace("/data/val", "data/val") for a in shlex.split(line)]
    if "--evaluate" in argv or "scorecam" in argv:
        # Faithfulness scores and Score-CAM run hundreds of forward passes per map: at 64 px
        # here, to keep CI short (the maths is tested in tests/cli/test_faithfulness.py).
        argv += ["--resize", "64", "--crop", "64"]
    assert argv[0] == "inspect-model", line
    argv = argv[1:]
    if argv[0] not in ("summary", "models") and "--weights" not in argv:
        argv += ["--weights", "none"]  # offline: random weights instead of a download
        label = next((f for f in ("--true-label", "--label") if f in argv), None)
        if label and not argv[argv.index(label) + 1].isdigit():
            argv += ["--class-names", "imagenet.txt"]  # random weights carry no class names: give them
    return argv, stdin, pipe


LINES = _command_lines()


def test_readme_has_examples() -> None:
    commands = {_argv(ln)[0][0] if _argv(ln)[0][0] != "cam" or "--config" not in ln else "cam" for ln in LINES}
    assert {"summary", "activations", "grads", "guided-backprop", "cam", "check"} <= commands
    assert len(_blocks("python")) >= 1


def _build_text_model(name: str, folder: Path) -> None:
    """README's text models (issue 26): ``tiny-bert`` (trained), ``tiny-gpt2``, issue 42's task
    models (``tiny-llama``, ``tiny-t5``, ...), the trained tiny GPT-2 of "Language models"
    (``tiny-lm``) and a tuned lens for it (``tuned-lens``)."""
    from fixtures.lm_models import save_example_lens, save_lm
    from fixtures.task_models import save_task_model
    from fixtures.text_models import save_text_model

    if name in ("tiny-bert", "tiny-gpt2"):
        save_text_model(name[5:], folder, trained=name == "tiny-bert")
    elif name == "tiny-lm":
        save_lm("gpt2", folder, trained=True)
    elif name == "tuned-lens":
        save_example_lens(folder)
    else:
        save_task_model(name[5:], folder)


@pytest.fixture(scope="module")
def text_models(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``get(name)``: the folder of one of README's text models, built (and trained) once for
    the module: every "tiny-" line copies the ones it had built for it before (issue 35)."""
    root = tmp_path_factory.mktemp("text-models")

    def get(name: str) -> Path:
        if not (root / name).is_dir():
            _build_text_model(name, root / name)
        return root / name

    return get


@pytest.mark.slow
@pytest.mark.parametrize("line", LINES)
def test_readme_command_line_runs(line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  text_models: Callable[[str], Path]) -> None:
    _workdir(tmp_path)
    if "tiny-" in line:  # the text models of README's "Text models" (issue 26), built once (text_models)
        names = ["tiny-bert", "tiny-gpt2"]
        names += sorted({f"tiny-{k}" for k in re.findall(r"tiny-(llama|t5|clip|bertmodel|clipvision)\b", line)})
        (tmp_path / "texts.txt").write_text("the cat sat on the mat\na dog ran to the park\n")
        if "tiny-lm" in line:  # README "Language models": a tiny GPT-2 trained in seconds, and a tuned lens for it
            names += ["tiny-lm", "tuned-lens"]
        for name in names:
            shutil.copytree(text_models(name), tmp_path / name)
    monkeypatch.chdir(tmp_path)
    argv, stdin, pipe = _argv(line)
    r = run_cli(argv, stdin=stdin)
    assert r.exit_code == 0, (line, r.stderr[-800:])
    assert "Traceback" not in r.stderr
    if "--jsonl" in argv:
        for obj in map(json.loads, r.stdout.splitlines()):
            assert obj["command"] == argv[0]
    elif "--json" in argv:
        assert json.loads(r.stdout)["command"] == argv[0]
    out = next((argv[i + 1] for i, a in enumerate(argv) if a in ("-o", "--output-dir")), None)
    if out is not None:
        assert (tmp_path / out / "report.json").is_file() and (tmp_path / out / "report.txt").is_file()


@pytest.mark.slow
def test_readme_python_api_block_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    for block in _blocks("python"):
        exec(compile(block, "README.md", "exec"), {"__name__": "__readme__"})
    printed = capsys.readouterr().out
    assert "11689512" in printed  # resnet18's parameter count, from im.summary
    assert (tmp_path / "cams" / "report.json").is_file()
