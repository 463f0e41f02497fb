"""Loading the models people really have (issue 3): user files and modules, TorchScript,
exported programs, checkpoints (safely), torchvision weights offline, devices."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from fixtures.models import TinyCNN, assert_unchanged, model_state
from inspect_model.errors import EXIT_MODEL_LOAD, InputError, ModelLoadError, UsageError
from inspect_model.loading import checkpoints
from inspect_model.loading.loaded import require_hookable
from inspect_model.loading.sources import load_model

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.jit deprecation notices


def one_line_error(res, code: int) -> str:
    assert res.exit_code == code, (res.exit_code, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.stderr
    return lines[0]


# ---------------------------------------------------------------- user files and modules
USER_FILE = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self, width=4, classes=3, act="relu"):
        super().__init__()
        self.act_name = act
        self.conv = nn.Conv2d(1, width, 3, padding=1)
        self.fc = nn.Linear(width, classes)
    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))

def build(classes=2, sizes=(1, 2)):
    m = Net(classes=classes)
    m.sizes = sizes
    return m

instance = Net(width=2)
NOT_A_MODEL = 3
def returns_int():
    return 7
class Plain:
    pass
"""


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    p = tmp_path / "zoo.py"
    p.write_text(USER_FILE)
    return p


def test_file_class_with_literal_model_args(user_file: Path) -> None:
    loaded = load_model(f"{user_file}:Net", model_args={"width": 5, "classes": 7, "act": "gelu"})
    m = loaded.model
    assert m.conv.out_channels == 5 and m.fc.out_features == 7 and m.act_name == "gelu"
    assert loaded.source == "python" and loaded.hookable and not m.training
    assert loaded.input_sizes == [(1, 224, 224)]  # guessed from the first Conv2d


def test_cli_model_args_are_python_literals(user_file: Path, cli) -> None:
    res = cli(["summary", f"{user_file}:build", "--model-arg", "classes=9", "--model-arg",
               "sizes=(3, 4)", "--input-size", "1x8x8", "--json"])
    assert res.exit_code == 0, res.stderr
    # conv 1->4 (3x3): 4*9 + 4 = 40; fc 4->9: 4*9 + 9 = 45; classes=9 reached the factory.
    assert json.loads(res.stdout)["total_params"] == 85


def test_file_factory_and_instance(user_file: Path) -> None:
    m = load_model(f"{user_file}:build", model_args={"classes": 4, "sizes": (3, 4)}).model
    assert m.fc.out_features == 4 and m.sizes == (3, 4)
    inst = load_model(f"{user_file}:instance").model
    assert inst.conv.out_channels == 2


def test_package_module_attr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "mypkg"
    (pkg / "nets").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "nets" / "__init__.py").write_text("")
    (pkg / "nets" / "small.py").write_text(USER_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = load_model("mypkg.nets.small:Net", model_args={"classes": 6})
    assert loaded.model.fc.out_features == 6
    with pytest.raises(ModelLoadError, match="module 'mypkg.nope' cannot be found"):
        load_model("mypkg.nope:Net")
    for name in [k for k in sys.modules if k.startswith("mypkg")]:
        monkeypatch.delitem(sys.modules, name)


@pytest.mark.parametrize(
    ("suffix", "pattern"),
    [
        (":Nett", r"'Nett' not found in .*zoo.py'; did you mean 'Net'"),
        (":NOT_A_MODEL", r"is a int, not an nn.Module"),
        (":returns_int", r"returned a int, not an nn.Module"),
        (":Plain", r"class Plain, which is not an nn.Module subclass"),
        ("", r"needs the name of a model after ':'.*models in it: Net"),
    ],
)
def test_bad_names(user_file: Path, suffix: str, pattern: str) -> None:
    with pytest.raises(ModelLoadError, match=pattern):
        load_model(f"{user_file}{suffix}")


def test_bad_model_args(user_file: Path) -> None:
    with pytest.raises(ModelLoadError, match="'widht' is not a parameter of .*did you mean 'width'"):
        load_model(f"{user_file}:Net", model_args={"widht": 3})
    with pytest.raises(ModelLoadError, match="already built Net instance"):
        load_model(f"{user_file}:instance", model_args={"width": 3})
    # torchvision builders take their own keywords (num_classes=10), and say which is not one.
    with pytest.raises(ModelLoadError, match="unexpected keyword argument 'width'"):
        load_model("resnet18", model_args={"width": 3}, weights="none")


def test_file_errors(tmp_path: Path, cli) -> None:
    boom = tmp_path / "boom.py"
    boom.write_text("import torch\n\nx = 1\nraise ValueError('no GPU here')\n")
    with pytest.raises(ModelLoadError, match=r"raised on import \(line 4\): ValueError: no GPU here"):
        load_model(f"{boom}:Net")
    exits = tmp_path / "script.py"
    exits.write_text("import sys\nsys.exit(2)\n")
    with pytest.raises(ModelLoadError, match=r"called sys.exit\(2\) on import"):
        load_model(f"{exits}:Net")
    syntax = tmp_path / "syntax.py"
    syntax.write_text("def f(:\n")
    with pytest.raises(ModelLoadError, match="raised on import.*SyntaxError"):
        load_model(f"{syntax}:f")
    line = one_line_error(cli(["summary", f"{tmp_path / 'missing.py'}:Net"]), EXIT_MODEL_LOAD)
    assert "missing.py' does not exist" in line
    line = one_line_error(cli(["summary", f"{boom}:Net"]), EXIT_MODEL_LOAD)
    assert "no GPU here" in line
    # A failed import leaves nothing half-registered behind.
    assert not [k for k in sys.modules if k.startswith("inspect_model_user.boom")]


def test_main_guard_not_run(tmp_path: Path) -> None:
    p = tmp_path / "guarded.py"
    p.write_text(USER_FILE + "\nif __name__ == '__main__':\n    raise SystemExit('ran main')\n")
    assert load_model(f"{p}:Net").model.fc.out_features == 3


# ---------------------------------------------------------------- TorchScript
@pytest.fixture
def tiny() -> TinyCNN:
    torch.manual_seed(0)
    return TinyCNN().eval()


def test_torchscript_loads_runs_but_takes_no_hooks(tmp_path: Path, tiny: TinyCNN, cli) -> None:
    path = tmp_path / "tiny.ts"
    torch.jit.save(torch.jit.script(tiny), str(path))
    loaded = load_model(str(path))
    assert loaded.source == "torchscript" and loaded.hookable is False
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(loaded.model(x), tiny(x))
    assert loaded.input_sizes == [(3, 224, 224)]  # from the first conv weight's shape
    # torch itself refuses the hooks: this is why hookable is False.
    with pytest.raises(NotImplementedError):
        loaded.model.features[0].register_forward_hook(lambda *a: None)
    with pytest.raises(ModelLoadError, match="`cam` needs them.*torch.export"):
        require_hookable(loaded, "cam")
    from inspect_model.engine.hooks import HookEngine

    with pytest.raises(ModelLoadError, match="does not allow module hooks"), \
            HookEngine(loaded.model, ["features.0"]):
        pass
    line = one_line_error(cli(["summary", str(path), "--input-size", "3x8x8"]), EXIT_MODEL_LOAD)
    assert "TorchScript" in line


# ---------------------------------------------------------------- torch.export
def _export(model: nn.Module, x: torch.Tensor, path: Path, dynamic: bool = False) -> None:
    shapes = {"x": {0: torch.export.Dim("batch", min=1, max=64)}} if dynamic else None
    torch.export.save(torch.export.export(model, (x,), dynamic_shapes=shapes), str(path))


def test_exported_program_is_hookable_with_original_names(tmp_path: Path, tiny: TinyCNN) -> None:
    from inspect_model.engine.hooks import CaptureOptions, HookEngine
    from inspect_model.engine.selection import select_layers

    path = tmp_path / "tiny.pt2"
    _export(tiny, torch.randn(2, 3, 8, 8), path)
    loaded = load_model(str(path))
    assert loaded.source == "export" and loaded.hookable
    assert loaded.input_sizes == [(3, 8, 8)] and loaded.static_batch == 2
    m = loaded.model
    assert [n for n, _ in m.named_modules()] == [n for n, _ in tiny.named_modules()]
    assert type(m.get_submodule("features.0")).__name__ == "Conv2d" and type(m.fc).__name__ == "Linear"
    assert select_layers(m, ["type:Conv2d"]) == ["features.0", "features.3"]
    x = torch.randn(2, 3, 8, 8)
    before = model_state(m)
    with HookEngine(m, ["features.3", "fc"], CaptureOptions(keep=True)) as eng:
        out = m(x)
    assert_unchanged(m, before)
    recs = eng.by_key()
    # Independent: the same layers of the original Python model, called directly.
    conv_out = tiny.features[3](tiny.features[:3](x))
    torch.testing.assert_close(recs["features.3"].outputs[0].tensor, conv_out)
    torch.testing.assert_close(out, tiny(x))
    # Input gradients flow through the exported graph as through the original.
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    m(xa)[:, 1].sum().backward()
    tiny(xb)[:, 1].sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad)


def test_exported_static_batch_is_checked(tmp_path: Path, tiny: TinyCNN) -> None:
    from inspect_model.loading.inputs import plan_inputs

    static, dynamic = tmp_path / "s.pt2", tmp_path / "d.pt2"
    _export(tiny, torch.randn(2, 3, 8, 8), static)
    _export(tiny, torch.randn(2, 3, 8, 8), dynamic, dynamic=True)
    loaded = load_model(str(static))
    with pytest.raises(InputError, match="static batch size of 2; pass --batch-size 2"):
        plan_inputs(loaded, None, batch_size=3)
    (x,) = [b.tensor for b in plan_inputs(loaded, None, batch_size=2).batches()]
    assert x.shape == (2, 3, 8, 8)
    dyn = load_model(str(dynamic))
    assert dyn.static_batch is None
    assert dyn.model(torch.randn(5, 3, 8, 8)).shape == (5, 5)


def test_exported_summary_cli(tmp_path: Path, tiny: TinyCNN, cli) -> None:
    path = tmp_path / "tiny.pt2"
    _export(tiny, torch.randn(1, 3, 8, 8), path)
    res = cli(["summary", str(path), "--json"])
    assert res.exit_code == 0, res.stderr
    assert '"Conv2d"' in res.stdout and '"features.3"' in res.stdout


# ---------------------------------------------------------------- checkpoints
@pytest.fixture
def trained() -> TinyCNN:
    """A TinyCNN whose weights differ from a fresh one (so loading is visible)."""
    torch.manual_seed(1)
    m = TinyCNN()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(1.0)
    return m


def _equal_state(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("key", [None, "model", "state_dict", "model_state_dict", "ema"])
@pytest.mark.parametrize("ddp", [False, True])
def test_checkpoint_layouts(tmp_path: Path, models_py: Path, trained: TinyCNN, key, ddp) -> None:
    sd = trained.state_dict()
    if ddp:
        sd = {f"module.{k}": v for k, v in sd.items()}
    obj = sd if key is None else {key: sd, "epoch": 3, "optimizer": {"lr": 0.1}}
    path = tmp_path / "ck.pth"
    torch.save(obj, path)
    loaded = load_model(f"{models_py}:TinyCNN", checkpoint=str(path))
    assert _equal_state(loaded.model, trained)
    rep = loaded.checkpoint
    assert rep.key == key and rep.stripped == (["module."] if ddp else [])
    assert rep.loaded == len(trained.state_dict())
    assert any(str(path) in n for n in loaded.notes)
    assert {p.device.type for p in loaded.model.parameters()} == {"cpu"}


def test_checkpoint_legacy_format_and_map_location(tmp_path: Path, trained: TinyCNN) -> None:
    path = tmp_path / "legacy.pt"
    torch.save(trained.state_dict(), path, _use_new_zipfile_serialization=False)
    fresh = TinyCNN()
    rep = checkpoints.load_checkpoint(fresh, str(path), device="cpu")
    assert _equal_state(fresh, trained) and rep.key is None


def test_checkpoint_missing_unexpected_keys(tmp_path: Path, models_py: Path, trained: TinyCNN, cli) -> None:
    sd = dict(trained.state_dict())
    del sd["fc.weight"], sd["fc.bias"]
    for i in range(7):
        sd[f"head.extra{i}"] = torch.zeros(1)
    path = tmp_path / "partial.pt"
    torch.save(sd, path)
    with pytest.raises(ModelLoadError) as exc:
        load_model(f"{models_py}:TinyCNN", checkpoint=str(path))
    msg = str(exc.value)
    assert "2 missing keys: fc.weight, fc.bias" in msg
    assert "7 unexpected keys: head.extra0" in msg and "(and 2 more)" in msg
    assert "--non-strict" in msg
    loaded = load_model(f"{models_py}:TinyCNN", checkpoint=str(path), strict=False)
    assert torch.equal(loaded.model.features[0].weight, trained.features[0].weight)
    assert not torch.equal(loaded.model.fc.weight, trained.fc.weight)
    assert loaded.checkpoint.missing == ["fc.weight", "fc.bias"] and len(loaded.checkpoint.unexpected) == 7
    line = one_line_error(cli(["summary", f"{models_py}:TinyCNN", "--checkpoint", str(path)]), EXIT_MODEL_LOAD)
    assert "missing keys" in line
    res = cli(["summary", f"{models_py}:TinyCNN", "--checkpoint", str(path), "--non-strict",
               "--input-size", "3x8x8"])
    assert res.exit_code == 0, res.stderr
    assert any("ignored 2 missing and 7 unexpected keys" in n for n in loaded.notes)


def test_checkpoint_shape_mismatch(tmp_path: Path, models_py: Path) -> None:
    path = tmp_path / "wide.pt"
    torch.save(TinyCNN(classes=9).state_dict(), path)
    with pytest.raises(ModelLoadError, match=r"shape mismatch .*fc.weight \(9, 16\) vs \(5, 16\)"):
        load_model(f"{models_py}:TinyCNN", checkpoint=str(path), strict=False)
    assert load_model(f"{models_py}:TinyCNN", checkpoint=str(path),
                      model_args={"classes": 9}).model.fc.out_features == 9


class Payload:
    """Unpickling this runs code: it creates a marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_malicious_pickle_does_not_run_without_trust(tmp_path: Path, models_py: Path, cli) -> None:
    marker = tmp_path / "PWNED"
    path = tmp_path / "evil.pth"
    torch.save({"state_dict": TinyCNN().state_dict(), "extra": Payload(str(marker))}, path)
    with pytest.raises(ModelLoadError, match="--trust-checkpoint") as exc:
        load_model(f"{models_py}:TinyCNN", checkpoint=str(path))
    assert "(io.open)" in str(exc.value)  # the global the payload needs, named
    assert not marker.exists()
    line = one_line_error(cli(["summary", f"{models_py}:TinyCNN", "--checkpoint", str(path)]), EXIT_MODEL_LOAD)
    assert "--trust-checkpoint" in line and not marker.exists()
    # The flag is the one way in: then the payload does run (which is why it must be asked for).
    load_model(f"{models_py}:TinyCNN", checkpoint=str(path), trust_checkpoint=True)
    assert marker.exists()


def test_whole_pickled_model(tmp_path: Path, models_py: Path, trained: TinyCNN) -> None:
    path = tmp_path / "whole.pt"
    torch.save(trained, path)
    with pytest.raises(ModelLoadError, match="whole pickled model.*--trust-checkpoint"):
        load_model(f"{models_py}:TinyCNN", checkpoint=str(path))
    with pytest.raises(ModelLoadError, match="--trust-checkpoint"):
        load_model(str(path))
    loaded = load_model(f"{models_py}:TinyCNN", checkpoint=str(path), trust_checkpoint=True)
    assert _equal_state(loaded.model, trained)
    whole = load_model(str(path), trust_checkpoint=True)
    assert whole.source == "pickle" and _equal_state(whole.model, trained)


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        (b"", "is an empty file"),
        (b"hello, I am text\n", "not a PyTorch file"),
        ("truncated", "truncated or corrupt"),
        ("truncated-legacy", "truncated or corrupt"),
        ("torchscript", "is a TorchScript model, not a checkpoint"),
        ("dir", "is a directory"),
        ("missing", "does not exist"),
        ("list", "holds a list, not a state_dict"),
        ("no-sd", "holds no state_dict: a dict with keys 'epoch', 'lr'"),
        ("other-model", "shares no key with the model"),
    ],
)
def test_bad_checkpoints(tmp_path: Path, models_py: Path, trained: TinyCNN, content, pattern, cli) -> None:
    path = tmp_path / "bad.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content == "truncated":
        torch.save(trained.state_dict(), path)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif content == "truncated-legacy":
        torch.save(trained.state_dict(), path, _use_new_zipfile_serialization=False)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif content == "torchscript":
        torch.jit.save(torch.jit.script(trained), str(path))
    elif content == "dir":
        path.mkdir()
    elif content == "list":
        torch.save([torch.zeros(1)], path)
    elif content == "no-sd":
        torch.save({"epoch": 1, "lr": 0.1}, path)
    elif content == "other-model":
        torch.save(nn.Linear(2, 2).state_dict(), path)
    with pytest.raises(ModelLoadError, match=pattern):
        load_model(f"{models_py}:TinyCNN", checkpoint=str(path))
    if content in ("truncated", b""):
        line = one_line_error(cli(["summary", f"{models_py}:TinyCNN", "--checkpoint", str(path)]),
                              EXIT_MODEL_LOAD)
        assert str(path) in line


def test_saved_model_spec_errors(tmp_path: Path, trained: TinyCNN) -> None:
    sd = tmp_path / "weights.pth"
    torch.save(trained.state_dict(), sd)
    with pytest.raises(ModelLoadError, match="holds weights .* pass --checkpoint"):
        load_model(str(sd))
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "nothing.pt"))
    junk = tmp_path / "junk.pt2"
    junk.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ModelLoadError, match="truncated or corrupt"):
        load_model(str(junk))


# ---------------------------------------------------------------- torchvision weights offline
@pytest.fixture
def cached_squeezenet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """squeezenet1_1's DEFAULT weights file, written where torch's hub cache expects it."""
    from torchvision.models import SqueezeNet1_1_Weights, squeezenet1_1

    from inspect_model.loading.sources.torchvision import weights_cache_path

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    torch.manual_seed(3)
    src = squeezenet1_1(weights=None)
    path = Path(weights_cache_path(SqueezeNet1_1_Weights.DEFAULT))
    assert path.is_relative_to(tmp_path / "torch_home")
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(src.state_dict(), path)
    # The stand-in cannot have the real file's hash: let the check expect this file's own
    # (the hash check itself is tested in tests/cli/test_hostile.py).
    from inspect_model.loading import hub_weights

    real = hub_weights.sha256_file(str(path))
    monkeypatch.setattr(hub_weights, "expected_prefix", lambda p: real[:8] if Path(p) == path else None)
    return src, path


@pytest.mark.parametrize("weights", ["DEFAULT", "IMAGENET1K_V1", "SqueezeNet1_1_Weights.IMAGENET1K_V1"])
def test_pretrained_from_cache(cached_squeezenet, weights: str) -> None:
    from inspect_model.loading.inputs import preprocess_from_weights

    src, _ = cached_squeezenet
    loaded = load_model("squeezenet1_1", weights=weights)
    assert loaded.weights == "IMAGENET1K_V1"
    assert _equal_state(loaded.model, src)
    assert len(loaded.categories) == 1000 and loaded.categories[281] == "tabby"
    pre = preprocess_from_weights(loaded.transforms)
    assert (pre.resize, pre.crop) == (256, 224) and pre.mean == pytest.approx((0.485, 0.456, 0.406))


def test_missing_weights_offline_names_cache_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    import urllib.error

    from torchvision.models import SqueezeNet1_1_Weights

    from inspect_model.loading.sources.torchvision import weights_cache_path

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty_home"))

    def no_network(url, dst, *a, **k):
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    expected = weights_cache_path(SqueezeNet1_1_Weights.DEFAULT)
    with pytest.raises(ModelLoadError) as exc:
        load_model("squeezenet1_1", weights="DEFAULT")
    msg = str(exc.value)
    assert expected in msg and "--weights none" in msg and "--checkpoint" in msg
    assert "Name or service not known" in msg
    line = one_line_error(cli(["summary", "squeezenet1_1", "--weights", "DEFAULT"]), EXIT_MODEL_LOAD)
    assert expected in line
    with pytest.raises(UsageError, match="weights 'IMAGENET9K' are not available.*IMAGENET1K_V1"):
        load_model("squeezenet1_1", weights="IMAGENET9K")
    assert load_model("squeezenet1_1", weights="none").weights is None


# ---------------------------------------------------------------- devices and dtypes
def test_resolve_device() -> None:
    from inspect_model.run.options import resolve_device

    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") in ("cuda", "mps", "cpu")
    if not torch.cuda.is_available():
        assert resolve_device("auto") != "cuda"
        with pytest.raises(UsageError, match="CUDA is not available"):
            resolve_device("cuda")
    with pytest.raises(UsageError, match="not one of cpu"):
        resolve_device("tpu")


def test_cuda_unavailable_cli(models_py: Path, cli) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    res = cli(["summary", f"{models_py}:TinyCNN", "--device", "cuda"])
    assert res.exit_code == 2 and "CUDA is not available" in res.stderr


class MovesViaMeta(TinyCNN):
    """Without a GPU, 'another device' is meta, where values are lost; this model records
    its moves and brings its values back when it returns from meta (a test double for
    a second device that keeps the real Module.to code path)."""

    def __init__(self) -> None:
        super().__init__()
        self.moves: list[str] = []

    def to(self, device):  # type: ignore[override]
        self.moves.append(str(device))
        if str(device) == "meta":
            self._snapshot = {k: v.clone() for k, v in self.state_dict().items()}
            return super().to("meta")
        if next(self.parameters()).device.type == "meta":
            self.to_empty(device=device)
            self.load_state_dict(self._snapshot)
            return self
        return super().to(device)


@pytest.mark.parametrize("fail", [False, True])
def test_engine_moves_model_back(fail: bool) -> None:
    """HookEngine(device=...) runs the model on another device and always moves it back,
    also when the run fails."""
    from inspect_model.engine.hooks import HookEngine

    other = "cuda" if torch.cuda.is_available() else "meta"
    m = MovesViaMeta()
    before = model_state(m)
    try:
        with HookEngine(m, ["fc"], device=other):
            assert next(m.parameters()).device.type == other
            if fail:
                raise RuntimeError("boom")
    except RuntimeError:
        assert fail
    assert m.moves == [other, "cpu"]
    assert {t.device.type for t in list(m.parameters()) + list(m.buffers())} == {"cpu"}
    assert_unchanged(m, before)


def test_user_model_on_meta_for_summary(user_file: Path) -> None:
    loaded = load_model(f"{user_file}:Net", device="meta")
    assert loaded.model.conv.weight.device.type == "meta"
    inst = load_model(f"{user_file}:instance", device="meta")
    # An already built instance is not moved to meta (that would destroy its weights).
    assert inst.model.conv.weight.device.type == "cpu" and inst.device == "cpu"


def test_dtype_of_input_batches(models_py: Path) -> None:
    from inspect_model.loading.inputs import plan_inputs
    from inspect_model.loading.shapes import parse_dtype

    loaded = load_model(f"{models_py}:TinyCNN")
    plan = plan_inputs(loaded, None, input_size="3x8x8", batch_size=2, dtype=parse_dtype("float64"))
    (batch,) = list(plan.batches())
    assert batch.tensor.dtype == torch.float64 and batch.tensor.shape == (2, 3, 8, 8)
    with pytest.raises(UsageError, match="dtype 'int8' is not supported"):
        parse_dtype("int8")


def test_weights_ignored_for_user_models_is_noted(models_py: Path) -> None:
    assert not any("--weights" in n for n in load_model(f"{models_py}:TinyCNN", weights="DEFAULT").notes)
    notes = load_model(f"{models_py}:TinyCNN", weights="IMAGENET1K_V2").notes
    assert any("--weights IMAGENET1K_V2 ignored" in n for n in notes)


def test_sniff_kinds(tmp_path: Path) -> None:
    lin = nn.Linear(2, 2)
    torch.save(lin.state_dict(), tmp_path / "a.pt")
    torch.save(lin.state_dict(), tmp_path / "b.pt", _use_new_zipfile_serialization=False)
    torch.jit.save(torch.jit.script(lin), str(tmp_path / "c.pt"))
    torch.export.save(torch.export.export(lin, (torch.randn(1, 2),)), str(tmp_path / "d.pt"))
    (tmp_path / "e.pt").write_bytes(b"")
    kinds = [checkpoints.sniff(str(tmp_path / f"{c}.pt")) for c in "abcde"]
    assert kinds == ["torch", "legacy", "torchscript", "export", "empty"]
    assert os.path.exists(tmp_path / "a.pt")
