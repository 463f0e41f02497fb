"""``--config FILE.toml`` (issue 3): top-level keys, [command] tables, the command line
wins, strict keys and types (exit 2), and the shipped configs in configs/ run."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from inspect_model.errors import EXIT_USAGE, UsageError

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.toml"))


def write(tmp_path: Path, text: str, name: str = "c.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def summary_options(cli, args: list[str]) -> dict:
    res = cli(["summary", *args, "--json"])
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)["options"]


def test_top_level_table_and_command_line_precedence(tmp_path: Path, models_py: Path, cli) -> None:
    cfg = write(tmp_path, """
        depth = 1
        batch-size = 3
        input_size = "3x8x8"
        [summary]
        depth = 2
    """.replace("\n        ", "\n"))
    model = f"{models_py}:TinyCNN"
    opts = summary_options(cli, [model, "--config", str(cfg)])
    assert opts["depth"] == 2  # the [summary] table wins over the top level
    assert opts["batch_size"] == 3 and opts["input_size"] == [[3, 3, 8, 8]]
    opts = summary_options(cli, [model, "--config", str(cfg), "--depth", "1", "--batch-size", "1"])
    assert opts["depth"] == 1 and opts["batch_size"] == 1  # the command line wins
    opts = summary_options(cli, [f"--config={cfg}", model])
    assert opts["depth"] == 2


def test_model_from_config(tmp_path: Path, models_py: Path, cli) -> None:
    cfg = write(tmp_path, 'model = "resnet18"\nweights = "none"\ninput-size = "3x32x32"\n')
    opts = summary_options(cli, ["--config", str(cfg)])
    assert opts["model"] == "resnet18"
    opts = summary_options(cli, [f"{models_py}:TinyCNN", "--config", str(cfg), "--input-size", "3x8x8"])
    assert opts["model"].endswith(":TinyCNN")  # a model on the command line wins


def test_keys_for_other_commands_are_ignored_at_top_level(tmp_path: Path, models_py: Path, cli) -> None:
    from inspect_model.cli.app import COMMANDS, _command_params

    others = {p for name in COMMANDS if name != "summary" for p in _command_params(name)}
    other_only = sorted(others - set(_command_params("summary")))
    if not other_only:
        pytest.skip("no option of another command that summary lacks")
    key = other_only[0].replace("_", "-")
    cfg = write(tmp_path, f'input-size = "3x8x8"\n{key} = {_sample_value(other_only[0])}\n')
    summary_options(cli, [f"{models_py}:TinyCNN", "--config", str(cfg)])
    # ...but not inside the [summary] table, where it is plainly wrong.
    cfg = write(tmp_path, f'[summary]\n{key} = {_sample_value(other_only[0])}\n', "d.toml")
    res = cli(["summary", f"{models_py}:TinyCNN", "--config", str(cfg)])
    assert res.exit_code == EXIT_USAGE and f"unknown key '{key}' for `summary`" in res.stderr


def _sample_value(pname: str) -> str:
    from inspect_model.cli.app import COMMANDS, _command_params

    for name in COMMANDS:
        params = _command_params(name)
        if pname in params:
            ann = params[pname].type_descriptor.annotation if hasattr(params[pname], "type_descriptor") else str
            return {bool: "true", int: "1", float: "0.5"}.get(ann, '"x"')
    return '"x"'


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("depht = 1", r"unknown key 'depht' for `summary`; did you mean 'depth'\?"),
        ("no_such_option_anywhere = 1", r"unknown key 'no_such_option_anywhere' for `summary`; valid keys: .*depth"),
        ('depth = "two"', r"key 'depth' has a wrong value 'two': expected an integer"),
        ("depth = 1.5", r"key 'depth' has a wrong value 1.5: expected an integer"),
        ("depth = true", r"key 'depth' has a wrong value True: expected int, not a boolean"),
        ('json = "yes"', r"key 'json' has a wrong value 'yes': expected true or false"),
        ("depth = [1, 2]", r"key 'depth' has a wrong value \[1, 2\]: expected a single value"),
        ("[sumary]\ndepth = 1", r"table \[sumary\] names no command; did you mean 'summary'\?"),
        ('command = "cam"', r"is for `cam`, not `summary`"),
        ('command = "camm"', r"command = 'camm' is not a command; did you mean 'cam'"),
        ("depth = ", r"is not valid TOML"),
        ("[summary.inner]\nx = 1", r"\[summary.inner\] is a table"),
    ],
)
def test_bad_configs_exit_2(tmp_path: Path, models_py: Path, cli, text: str, pattern: str) -> None:
    cfg = write(tmp_path, text + "\n")
    res = cli(["summary", f"{models_py}:TinyCNN", "--config", str(cfg)])
    assert res.exit_code == EXIT_USAGE, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: config file '{cfg}'"), res.stderr
    import re

    assert re.search(pattern, lines[0]), lines[0]


def test_missing_config_file(tmp_path: Path, models_py: Path, cli) -> None:
    res = cli(["summary", f"{models_py}:TinyCNN", "--config", str(tmp_path / "nope.toml")])
    assert res.exit_code == EXIT_USAGE and "does not exist" in res.stderr


def test_convert_value_lists_and_paths() -> None:
    from inspect_model.cli.app import COMMANDS, _command_params
    from inspect_model.config import convert_value

    params = _command_params("summary")
    assert convert_value("c", "input-size", "3x8x8", params["input_size"]) == ["3x8x8"]
    assert convert_value("c", "input-size", ["3x8x8", "4"], params["input_size"]) == ["3x8x8", "4"]
    assert str(convert_value("c", "checkpoint", "w.pt", params["checkpoint"])) == "w.pt"
    assert convert_value("c", "depth", 2.0, params["depth"]) == 2
    with pytest.raises(UsageError, match="expected a path"):
        convert_value("c", "checkpoint", 3, params["checkpoint"])
    if "cam" in COMMANDS and "mean" in _command_params("cam"):
        mean = _command_params("cam")["mean"]
        assert convert_value("c", "mean", [0.5, 0.25, 0.125], mean) == "0.5,0.25,0.125"


# ---------------------------------------------------------------- shipped configs
def test_configs_shipped() -> None:
    names = {p.name for p in CONFIGS}
    assert {"resnet50-gradcam.toml", "vit.toml", "ci-smoke.toml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_parses_against_its_command(path: Path) -> None:
    from inspect_model.cli.app import COMMANDS, _command_params
    from inspect_model.config import load_config

    data = tomllib.loads(path.read_text())
    command = data["command"]
    assert command in COMMANDS, f"config for unknown command {command!r}"
    params = {name: _command_params(name) for name in COMMANDS}
    opts = load_config(str(path), command, params[command], all_params=params)
    assert opts and set(opts) <= set(params[command])


TINY_MODELS = '''
import torch
from torch import nn
from torchvision.models import VisionTransformer


class TinyResNet(nn.Module):
    """The attribute names of torchvision's ResNet (layer4, fc), in miniature."""

    def __init__(self, classes: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.relu = nn.ReLU()
        self.layer4 = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU())
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.avgpool(self.layer4(self.relu(self.conv1(x)))), 1))


def tiny_vit():
    """torchvision's VisionTransformer (the names of vit_b_16) with two tiny blocks."""
    torch.manual_seed(0)
    vit = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                            hidden_dim=16, mlp_dim=32, num_classes=4)
    nn.init.normal_(vit.heads.head.weight)  # torchvision zero-inits the head: flat logits
    return vit


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))
'''

TINY_FOR = {
    "resnet50-gradcam.toml": ("TinyResNet", ["--input-size", "3x32x32", "--batch-size", "1"]),
    "vit.toml": ("tiny_vit", ["--batch-size", "1"]),  # input size from vit.image_size
    "ci-smoke.toml": ("TinyNet", []),
}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_runs_end_to_end_on_a_tiny_model(path: Path, tmp_path: Path, cli) -> None:
    from inspect_model.cli.app import COMMANDS

    command = tomllib.loads(path.read_text())["command"]
    assert command in COMMANDS, f"config for unknown command {command!r}"
    if path.name not in TINY_FOR:
        pytest.skip("no tiny stand-in for this config")
    models = tmp_path / "tiny_models.py"
    models.write_text(TINY_MODELS)
    name, extra = TINY_FOR[path.name]
    res = cli([command, f"{models}:{name}", "--config", str(path), "--device", "cpu", *extra,
               "--json", "--quiet"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["command"] == command


# ---------------------------------------------------------------- positionals fill what the config leaves open
def test_config_model_with_images_on_the_command_line(tmp_path: Path, cli) -> None:
    """Issue 29 (4): `cam --config c.toml cat.jpg` said "unknown model 'cat.jpg'"."""
    from conftest import SAMPLE_IMAGES

    image = str(min(SAMPLE_IMAGES.glob("*.jpg")))
    cfg = write(tmp_path, 'command = "cam"\nmodel = "resnet18"\n[cam]\nweights = "none"\nlayer = ["layer4"]\n')
    res = cli(["cam", "--config", str(cfg), image, "--json", "--quiet"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["model"] == "resnet18" and [i["image"] for i in doc["images"]] == [image]
    res = cli(["cam", "--config", str(cfg), str(tmp_path / "missing.jpg")])
    assert res.exit_code == 4 and "image" in res.stderr and "missing.jpg" in res.stderr, res.stderr


@pytest.mark.parametrize(("args", "expected"), [
    (["cam", "--config", "{cfg}", "cat.jpg"], ["cam", "--config", "{cfg}", "resnet50", "cat.jpg"]),
    (["cam", "--config", "{cfg}", "-", "--json"], ["cam", "--config", "{cfg}", "resnet50", "-", "--json"]),
    (["cam", "-t", "3", "--config", "{cfg}", "photos/*.png"],
     ["cam", "-t", "3", "--config", "{cfg}", "resnet50", "photos/*.png"]),
    (["cam", "--config", "{cfg}", "vgg16", "cat.jpg"], ["cam", "--config", "{cfg}", "vgg16", "cat.jpg"]),
    (["cam", "--config", "{cfg}"], ["cam", "--config", "{cfg}"]),
])
def test_positionals_after_a_config_that_names_the_model(args: list[str], expected: list[str]) -> None:
    from inspect_model.cli.app import _config_default_map

    cfg = str(ROOT / "configs" / "resnet50-gradcam.toml")
    line = [a.replace("{cfg}", cfg) for a in args]
    defaults = _config_default_map(line)
    assert line == [a.replace("{cfg}", cfg) for a in expected]
    assert defaults is not None and defaults["cam"]["model"] == "resnet50"


# ---------------------------------------------------------------- a config never runs code (issue 28, item 2)
def test_config_may_not_name_code_running_models(tmp_path: Path, models_py: Path, cli) -> None:
    import torch
    from torch import nn

    script = tmp_path / "net.ts"
    torch.jit.save(torch.jit.script(nn.Linear(2, 2)), str(script))
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').write('x')\nimport torch\nbuild = lambda: torch.nn.Linear(2, 2)\n")
    for model, source in ((f"{evil}:build", "file"), ("subprocess:run", "module"), (str(script), "torchscript")):
        cfg = write(tmp_path, f"model = {json.dumps(model)}\n")
        res = cli(["summary", "--config", str(cfg)])
        assert res.exit_code == EXIT_USAGE, res.stderr
        line = res.stderr.strip()
        assert "\n" not in line and f"runs code ({source} source)" in line and "command line" in line, line
    assert not marker.exists()
    # The same specs on the command line are the user's own choice.
    res = cli(["summary", f"{evil}:build", "--input-size", "2"])
    assert res.exit_code == 0 and marker.exists()


def test_config_model_args_only_for_timm(tmp_path: Path, models_py: Path, cli) -> None:
    from inspect_model.cli.app import _config_default_map

    cfg = write(tmp_path, 'model-arg = ["cmd=\'touch /tmp/x\'"]\n')
    res = cli(["summary", f"{models_py}:TinyCNN", "--config", str(cfg)])
    assert res.exit_code == EXIT_USAGE and "model-arg" in res.stderr and "timm" in res.stderr, res.stderr
    timm_cfg = write(tmp_path, 'model = "timm:resnet18"\nmodel-arg = ["num_classes=10"]\n', "t.toml")
    assert _config_default_map(["summary", "--config", str(timm_cfg)])["summary"]["model_arg"] == ["num_classes=10"]
    line = ["summary", f"{models_py}:TinyCNN", "--config", str(timm_cfg)]
    with pytest.raises(UsageError, match="model-arg"):
        _config_default_map(line)  # the config's model-args would reach the command line's code


# ---------------------------------------------------------------- deep nesting (issue 28, item 9)
@pytest.mark.parametrize("text", ["x = " + "[" * 100000 + "]" * 100000, "x = " + "[" * 80 + "]" * 80,
                                  "x = " + "{a = " * 5000 + "1" + "}" * 5000])
def test_deeply_nested_config_is_one_line(tmp_path: Path, models_py: Path, cli, text: str) -> None:
    cfg = write(tmp_path, text + "\n")
    res = cli(["summary", f"{models_py}:TinyCNN", "--config", str(cfg)])
    assert res.exit_code == EXIT_USAGE, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: config file '{cfg}'"), res.stderr
