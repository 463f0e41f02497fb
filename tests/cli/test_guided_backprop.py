"""guided-backprop: the rule against a hand computation, every kind of ReLU call, restoration
(also when the backward raises), batching, the sanity check, renderers and the CLI contract."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fixtures.models import ReusedReLU, TinyCNN, assert_unchanged, model_state
from inspect_model.errors import ModelRuntimeError
from inspect_model.methods.guided import backprop as gb
from inspect_model.render import saliency

ORIGINAL_RELU = (F.relu, torch.relu, torch.relu_, F.relu_, torch.Tensor.relu, torch.Tensor.relu_)
SCHEMA = Path(gb.__file__).resolve().parents[2] / "schemas" / "guided-backprop.json"


def no_dispatch_mode_left() -> bool:
    return torch._C._len_torch_dispatch_stack() == 0


def plain_gradient(model: nn.Module, x: torch.Tensor, cls: int) -> torch.Tensor:
    x = x.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(model(x)[:, cls].sum(), x)
    return g


# ----------------------------------------------------------------- the rule
def test_matches_hand_computation_with_a_relu_called_twice() -> None:
    # ReusedReLU: y = relu(fc2(relu(fc1(x)))), one nn.ReLU module called twice.
    m = ReusedReLU().double()
    x = torch.randn(5, 4, dtype=torch.float64)
    res = gb.guided_backprop(m, x, 1)
    w1, b1 = m.fc1.weight.detach().numpy(), m.fc1.bias.detach().numpy()
    w2, b2 = m.fc2.weight.detach().numpy(), m.fc2.bias.detach().numpy()
    for n in range(5):
        f1 = w1 @ x[n].numpy() + b1
        f2 = w2 @ np.maximum(f1, 0) + b2
        r = np.eye(3)[1]  # d y_1 / d y
        r = (f2 > 0) * (r > 0) * r  # outer ReLU: R_l = (f_l > 0) (R_{l+1} > 0) R_{l+1}
        r = w2.T @ r
        r = (f1 > 0) * (r > 0) * r  # inner ReLU
        expected = w1.T @ r
        np.testing.assert_allclose(res.gradients[n, 0].numpy(), expected, rtol=1e-6, atol=1e-9)
    assert res.sites == {"relu": 2}
    assert res.targets == [[1]] * 5 and not res.warnings
    # The rule really changed something: the plain gradient differs on this input.
    assert not torch.allclose(res.gradients[:, 0].double(), plain_gradient(m, x, 1))


class Functional(nn.Module):
    """The same network written with every functional spelling of ReLU."""

    def __init__(self, style: str) -> None:
        super().__init__()
        self.style = style
        self.c1, self.c2, self.c3 = nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(6, 6, 3, padding=1), nn.Conv2d(6, 8, 3)
        self.fc = nn.Linear(8, 4)
        self.relus = nn.ModuleList([nn.ReLU(), nn.ReLU(inplace=True), nn.ReLU(), nn.ReLU(inplace=True)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.style == "modules":
            a = self.relus[0](self.c1(x))
            b = self.relus[1](self.c2(a))
            c = self.relus[2](self.c3(b))
            d = self.relus[3](c.mean((2, 3)) * 3)
        else:
            a = F.relu(self.c1(x))
            b = torch.relu_(self.c2(a))
            c = self.c3(b).relu()
            d = F.relu(c.mean((2, 3)) * 3, inplace=True)  # DenseNet-style trailing F.relu
        return self.fc(d)


def test_functional_and_module_relus_give_identical_maps() -> None:
    mods, funcs = Functional("modules"), Functional("functional")
    funcs.load_state_dict(mods.state_dict())
    x = torch.randn(3, 3, 10, 10)
    a = gb.guided_backprop(mods, x, "top:2")
    b = gb.guided_backprop(funcs, x, "top:2")
    assert a.targets == b.targets
    torch.testing.assert_close(a.gradients, b.gradients, rtol=0, atol=0)
    assert a.sites == {"relu": 4} and b.sites == {"relu": 4}
    # The functional ReLUs were guided: the plain gradient is different.
    for i in range(3):
        plain = plain_gradient(funcs, x[i:i + 1], b.targets[i][0])[0]
        assert not torch.allclose(b.gradients[i, 0], plain)


def test_inplace_relus_match_out_of_place() -> None:
    inplace = TinyCNN()
    outplace = TinyCNN()
    outplace.load_state_dict(inplace.state_dict())
    for mod in outplace.modules():
        if isinstance(mod, nn.ReLU):
            mod.inplace = False
    x = torch.randn(2, 3, 12, 12)
    a = gb.guided_backprop(inplace, x, 3).gradients
    b = gb.guided_backprop(outplace, x, 3).gradients
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert all(m.inplace for m in inplace.modules() if isinstance(m, nn.ReLU))


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_torchscript_model_is_guided_too() -> None:
    m = Functional("functional")
    x = torch.randn(2, 3, 10, 10)
    scripted = torch.jit.trace(m, x)
    torch.testing.assert_close(gb.guided_backprop(scripted, x, 1).gradients, gb.guided_backprop(m, x, 1).gradients)


# ----------------------------------------------------------------- other activations
class Acts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 6), nn.Linear(6, 3)
        self.prelu = nn.PReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        h = F.gelu(F.silu(F.leaky_relu(F.relu6(h), 0.1)))
        return self.fc2(self.prelu(h) + F.relu(h))


def test_activation_sites_counted_by_kind() -> None:
    m, x = Acts(), torch.randn(2, 4)
    res = gb.guided_backprop(m, x, 0)
    assert res.sites == {"relu": 1}
    assert res.unguided == {"gelu": 1, "leaky_relu": 1, "prelu": 1, "relu6": 1, "silu": 1}
    ext = gb.guided_backprop(m, x, 0, activations=True)
    assert ext.sites == {"gelu": 1, "leaky_relu": 1, "prelu": 1, "relu": 1, "relu6": 1, "silu": 1}
    assert ext.unguided == {}


def test_gelu_rule_hand_computed_and_no_relu_warns() -> None:
    class GeluNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Linear(4, 5), nn.GELU(), nn.Linear(5, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(self.act(self.fc1(x)))

    m = GeluNet().double()
    x = torch.randn(3, 4, dtype=torch.float64)
    plain = gb.guided_backprop(m, x, 2)
    assert plain.sites == {} and plain.unguided == {"gelu": 1}
    assert len(plain.warnings) == 1 and "--activations" in plain.warnings[0]
    torch.testing.assert_close(plain.gradients[:, 0].double(), plain_gradient(m, x, 2))
    ext = gb.guided_backprop(m, x, 2, activations=True)
    assert ext.sites == {"gelu": 1} and not ext.warnings
    f = m.fc1(x).detach()
    dgelu = 0.5 * (1 + torch.erf(f / 2**0.5)) + f * torch.exp(-0.5 * f * f) / (2 * torch.pi) ** 0.5
    expected = (dgelu * m.fc2.weight[2].detach().clamp(min=0)) @ m.fc1.weight.detach()
    torch.testing.assert_close(ext.gradients[:, 0].double(), expected)


def test_model_without_any_activation_warns_and_gives_plain_gradient() -> None:
    m = nn.Sequential(nn.Linear(4, 3))
    res = gb.guided_backprop(m, torch.randn(2, 4), 0, activations=True)
    assert res.warnings and "no guidable activation" in res.warnings[0]
    torch.testing.assert_close(res.gradients[:, 0], m[0].weight.detach()[0].expand(2, 4))


# ----------------------------------------------------------------- borrowing the model
def test_no_parameter_grad_created_or_changed() -> None:
    m = TinyCNN()
    m.train()
    m.fc.weight.grad = torch.full_like(m.fc.weight, 7.0)
    m.features[0].weight.requires_grad_(False)
    before = model_state(m)
    gb.guided_backprop(m, torch.randn(2, 3, 8, 8), "top:2")
    assert_unchanged(m, before)
    assert m.features[3].weight.grad is None and torch.all(m.fc.weight.grad == 7.0)
    assert m.training and no_dispatch_mode_left()


class _Explode(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return x * 1.0

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        raise RuntimeError("backward exploded")


class ExplodingBackward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.relu, self.fc2 = nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(_Explode.apply(F.relu(self.relu(self.fc1(x)))))


def test_model_restored_when_backward_raises() -> None:
    m = ExplodingBackward()
    m.train()
    before = model_state(m)
    with pytest.raises(ModelRuntimeError, match="backward pass failed: RuntimeError: backward exploded"):
        gb.guided_backprop(m, torch.randn(2, 4), 0)
    assert_unchanged(m, before)
    assert (F.relu, torch.relu, torch.relu_, F.relu_, torch.Tensor.relu, torch.Tensor.relu_) == ORIGINAL_RELU
    assert no_dispatch_mode_left()
    # And ordinary autograd is ordinary again: a plain ReLU gradient passes negative values.
    x = torch.tensor([[1.0, 2.0]], requires_grad=True)
    (g,) = torch.autograd.grad((torch.relu(x) * torch.tensor([[-1.0, 3.0]])).sum(), x)
    assert g.tolist() == [[-1.0, 3.0]]


def test_forward_failure_is_one_line_error_and_restores() -> None:
    m = TinyCNN()
    before = model_state(m)
    with pytest.raises(ModelRuntimeError, match="forward pass failed"):
        gb.guided_backprop(m, torch.randn(2, 5, 8, 8), 0)  # wrong channel count
    assert_unchanged(m, before)


def test_batch_equals_one_at_a_time() -> None:
    m = TinyCNN()
    m.train()  # BatchNorm: guided backprop runs in eval mode, so images do not interact
    x = torch.randn(4, 3, 12, 12)
    batch = gb.guided_backprop(m, x, "top:3")
    assert batch.gradients.shape == (4, 3, 3, 12, 12)
    for i in range(4):
        one = gb.guided_backprop(m, x[i:i + 1], "top:3")
        assert one.targets == [batch.targets[i]]
        torch.testing.assert_close(one.gradients[0], batch.gradients[i], rtol=1e-5, atol=1e-7)
    assert m.training


# ----------------------------------------------------------------- sanity check
def brute_spearman(a: np.ndarray, b: np.ndarray) -> float:
    def ranks(v: np.ndarray) -> np.ndarray:  # O(n^2), average rank for ties
        return np.array([(v < t).sum() + ((v == t).sum() + 1) / 2.0 for t in v])

    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def test_rank_correlation_with_ties_against_brute_force() -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 4, 60).astype(float)  # many ties, like the zeros of a guided map
    b = a + rng.normal(0, 1.5, 60)
    got = gb.rank_correlation(torch.tensor(a), torch.tensor(b))
    assert got == pytest.approx(brute_spearman(a, b), abs=1e-12)
    assert gb.rank_correlation(torch.tensor([1.0, 2, 3]), torch.tensor([3.0, 2, 1])) == pytest.approx(-1.0)
    assert np.isnan(gb.rank_correlation(torch.ones(5), torch.arange(5.0)))


def test_sanity_cascade_leaves_user_model_untouched() -> None:
    m = TinyCNN()
    x = torch.randn(2, 3, 10, 10)
    before = model_state(m)
    ref = gb.guided_backprop(m, x, "top:2")
    san = gb.sanity_check(m, x, ref, seed=3)
    assert_unchanged(m, before)
    assert san.layers == ["fc", "features.3", "features.0"]  # top first, in execution order
    assert [s.randomized for s in san.steps] == [1, 2, 3]
    assert [s.down_to for s in san.steps] == ["fc", "features.3", "features.0"]
    assert all(len(s.spearman) == 4 and len(s.spearman_abs) == 4 for s in san.steps)
    assert all(-1 <= r <= 1 for s in san.steps for r in s.spearman)
    # Randomising every layer changes the maps (rho < 1); the same seed gives the same numbers.
    assert max(san.steps[-1].spearman) < 0.99
    again = gb.sanity_check(m, x, ref, seed=3)
    assert again.steps[-1].spearman == san.steps[-1].spearman
    assert gb.cascade_counts(21) == [1, 2, 4, 8, 16, 21] and gb.cascade_counts(1) == [1]


# ----------------------------------------------------------------- rendering
def test_display_normalisation_follows_the_recipe() -> None:
    g = torch.randn(3, 5, 6, dtype=torch.float64) * 0.01
    arr = saliency.normalise_for_display(g)
    raw = g.numpy()
    expected = np.clip((raw - raw.mean()) / (raw.std() + 1e-5) * 0.1 + 0.5, 0, 1).transpose(1, 2, 0)
    np.testing.assert_allclose(arr, expected)
    img = saliency.display_image(g)
    assert img.mode == "RGB" and img.size == (6, 5)
    mag = saliency.magnitude(g)
    s = np.abs(raw).sum(0)
    np.testing.assert_allclose(mag, np.clip(s / np.percentile(s, 99), 0, 1))
    assert saliency.magnitude_image(torch.zeros(1, 4, 4)).getextrema() == (0, 0)
    assert saliency.display_image(torch.zeros(1, 4, 4)).getextrema() == (128, 128)


def test_guided_gradcam_is_the_product_with_the_upsampled_cam() -> None:
    g = torch.randn(2, 1, 3, 4, 4)
    cams = torch.rand(2, 1, 2, 2)
    out = gb.guided_gradcam(g, cams)
    # Bilinear 2x upsampling (align_corners=False) keeps the corner values exactly.
    torch.testing.assert_close(out[..., 0, 0], g[..., 0, 0] * cams[..., None, 0, 0])
    torch.testing.assert_close(out[..., 3, 3], g[..., 3, 3] * cams[..., None, 1, 1])
    same = gb.guided_gradcam(g, torch.rand(2, 1, 4, 4))
    assert same.shape == g.shape


# ----------------------------------------------------------------- CLI
def tiny(models_py: Path) -> str:
    return f"{models_py}:TinyCNN"


def test_cli_json_report_validates_and_files_are_written(cli, models_py: Path, tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    out = tmp_path / "gb"
    r = cli(["guided-backprop", tiny(models_py), "--input-size", "3x12x12", "--batch-size", "3",
             "--target", "top:2", "-o", str(out), "--save-raw", "--sanity", "--json",
             "--tensorboard", str(tmp_path / "tb")])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()), cls=jsonschema.Draft202012Validator)
    assert doc["sites"] == {"relu": 2} and doc["notes"][0].startswith("guided backprop maps barely change")
    assert "Adebayo" in doc["notes"][0]
    assert len(doc["images"]) == 3 and all(len(i["maps"]) == 2 for i in doc["images"])
    assert [s["randomized"] for s in doc["sanity"]["steps"]] == [1, 2, 3]
    for f in doc["files"]:
        assert (out / f).is_file(), f
    raw = doc["images"][1]["maps"][0]["files"]["raw"]
    assert raw == "images/0001-random-1/guided.c" + str(doc["images"][1]["maps"][0]["target"]["class"]) + ".npy"
    arr = np.load(out / raw)
    assert arr.shape == (3, 12, 12)
    assert doc["images"][1]["maps"][0]["max_abs"] == pytest.approx(float(np.abs(arr).max()), rel=1e-6)
    assert any("events.out.tfevents" in p.name for p in (tmp_path / "tb").rglob("*"))
    from inspect_model.output.tensorboard import read_tags

    tags = read_tags(tmp_path / "tb")["images"]
    for kind in ("guided", "magnitude"):
        assert len([t for t in tags if t.startswith("guided-backprop/000") and t.endswith(f"/{kind}")]) == 6


def test_cli_pngs_are_byte_reproducible_and_text_report(cli, models_py: Path, tmp_path: Path) -> None:
    args = ["guided-backprop", tiny(models_py), "--input-size", "3x10x10", "--batch-size", "2", "--target", "1"]
    a = cli([*args, "-o", str(tmp_path / "a")])
    b = cli([*args, "-o", str(tmp_path / "b")])
    assert a.exit_code == 0 and b.exit_code == 0, a.stderr
    pngs = sorted(p.relative_to(tmp_path / "a").as_posix() for p in (tmp_path / "a").rglob("*.png"))
    assert "images/0000-random-0/guided.c1.png" in pngs and "images/0001-random-1/overview.png" in pngs
    for name in pngs:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert "Guided activation sites (one backward pass): relu x2" in a.stdout
    assert "note: guided backprop maps barely change" in a.stdout
    assert "\x1b[" not in a.stdout


def test_cli_jsonl_streams_one_object_per_image(cli, models_py: Path) -> None:
    r = cli(["guided-backprop", tiny(models_py), "--input-size", "3x8x8", "--batch-size", "2", "--jsonl"])
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2
    assert [json.loads(ln)["index"] for ln in lines] == [0, 1]


def test_cli_guided_gradcam(cli, models_py: Path, tmp_path: Path) -> None:
    r = cli(["guided-backprop", tiny(models_py), "--input-size", "3x8x8", "--batch-size", "1",
             "--guided-gradcam", "--layer", "features.3", "-o", str(tmp_path / "o"), "--save-raw", "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["guided_gradcam"] == {"layer": "features.3"}
    files = doc["images"][0]["maps"][0]["files"]
    ggc, g = np.load(tmp_path / "o" / files["guided_gradcam_raw"]), np.load(tmp_path / "o" / files["raw"])
    assert ggc.shape == g.shape == (3, 8, 8)
    # Guided Grad-CAM = guided map times a [0, 1] map shared by all channels.
    ratio = np.where(np.abs(g) > 1e-12, ggc / np.where(g == 0, 1, g), np.nan)
    assert np.nanmin(ratio) >= -1e-6 and np.nanmax(ratio) <= 1 + 1e-6
    assert np.allclose(np.nanstd(ratio, axis=0)[~np.isnan(ratio).any(0)], 0, atol=1e-5)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--save-raw"], 2, "error: --save-raw needs --output-dir DIR"),
        (["--json", "--jsonl"], 2, "error: --json and --jsonl cannot be combined; choose one"),
        (["--layer", "features.0"], 2, "error: --layer applies to --guided-gradcam"),
        (["--target", "99"], 4, "error: --target 99 is out of range: the model has 5 classes (0..4)"),
    ],
)
def test_cli_errors(cli, models_py: Path, args: list[str], code: int, message: str) -> None:
    r = cli(["guided-backprop", tiny(models_py), "--input-size", "3x8x8", *args])
    assert r.exit_code == code
    assert r.stderr.strip().splitlines()[-1].startswith(message)
    assert "Traceback" not in r.stderr


def test_cli_failure_leaves_no_output_dir(cli, models_py: Path, tmp_path: Path) -> None:
    out = tmp_path / "never"
    r = cli(["guided-backprop", tiny(models_py), "--input-size", "3x8x8", "--target", "99", "-o", str(out)])
    assert r.exit_code == 4 and not out.exists()


def test_first_guided_call_imports_neither_dynamo_nor_sympy() -> None:
    """torch wraps a dispatch mode's __torch_dispatch__ in torch._disable_dynamo, whose first
    call imports torch._dynamo, and autograd.grad with a tensor grad_outputs imports torch.fx's
    symbolic shapes and sympy: seconds on the first guided call of a process. Neither happens
    now; in a fresh process, as a user's first call."""
    import subprocess
    import sys

    code = ("import sys, torch; from torch import nn; from inspect_model.methods.guided import backprop as gb\n"
            "m = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))\n"
            "before = {'torch._dynamo', 'sympy'} & set(sys.modules)\n"
            "r = gb.guided_backprop(m, torch.randn(2, 4), 1)\n"
            "print(sum(r.sites.values()), sorted(({'torch._dynamo', 'sympy'} & set(sys.modules)) - before))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1 []", out.stdout + out.stderr
