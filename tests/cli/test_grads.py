"""`inspect-model grads`: gradients checked against hand-derived and direct torch values."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fixtures.invariants import register_model
from fixtures.models import DictOut, ReusedReLU, TinyCNN, TwoLayer, assert_unchanged, model_state
from inspect_model.errors import InputError, ModelRuntimeError, UsageError
from inspect_model.methods.gradients.stats import merge_stats
from inspect_model.methods.gradients.flow import gradients
from inspect_model.methods.gradients.jacobian import jacobian
from inspect_model.methods.stats import tensor_stats

SCHEMA = Path(__file__).resolve().parents[2] / "src" / "inspect_model" / "schemas" / "grads.json"

USER_MODELS = '''
import torch
from torch import nn


class Chain(nn.Module):
    """Four Linear layers; `scale` multiplies the third one's weights (an exploding layer)."""

    def __init__(self, scale=1.0):
        super().__init__()
        torch.manual_seed(0)
        self.l1, self.l2, self.l3, self.l4 = (nn.Linear(8, 8) for _ in range(4))
        with torch.no_grad():
            self.l3.weight.mul_(scale)

    def forward(self, x):
        return self.l4(self.l3(torch.tanh(self.l2(torch.tanh(self.l1(x))))))


def Exploding():
    return Chain(scale=1e5)


def Healthy():
    return Chain(scale=1.0)


class SqrtClamp(nn.Module):
    """Finite forward; backward gives 0 * inf = NaN where the input is negative."""

    def forward(self, x):
        return torch.sqrt(x * (x > 0))


class NaNNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(4, 6)
        self.bad = SqrtClamp()
        self.fc2 = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc2(self.bad(self.fc1(x)))
'''


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    p = tmp_path / "grad_models.py"
    p.write_text(USER_MODELS)
    return p


def _load(user_file: Path, name: str) -> nn.Module:
    import importlib.util

    spec = importlib.util.spec_from_file_location("grad_models_t", user_file)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    obj = getattr(mod, name)
    return obj()


def two_layer() -> tuple[TwoLayer, torch.Tensor]:
    m = TwoLayer(d_in=3, d_hidden=5, d_out=4).double()
    x = torch.randn(6, 3, dtype=torch.float64)
    return m, x


# ----------------------------------------------------------------- closed form
def test_two_layer_closed_form_target() -> None:
    m, x = two_layer()
    before = model_state(m)
    c = 2
    rep = gradients(m, x, target=str(c), keep_input_grad=True)
    assert_unchanged(m, before)
    w1, b1, w2 = m.fc1.weight.detach(), m.fc1.bias.detach(), m.fc2.weight.detach()
    z = x @ w1.T + b1  # (N, H)
    h = z.clamp(min=0)
    mask = (z > 0).double()
    n = x.shape[0]
    # d y_c / d h = w2[c]; d/dz = w2[c] * 1[z > 0]; d/dx = w1^T (w2[c] * mask)
    dh = w2[c].expand(n, -1)
    dz = dh * mask
    hand = {
        "fc2.weight": torch.zeros_like(w2).index_put_((torch.tensor([c]),), h.sum(0, keepdim=True)),
        "fc2.bias": F.one_hot(torch.tensor(c), 4).double() * n,
        "fc1.weight": dz.T @ x,
        "fc1.bias": dz.sum(0),
    }
    params = {p.name: p for p in rep.params}
    for name, g in hand.items():
        p = params[name]
        assert p.norm == pytest.approx(float(g.norm()), rel=1e-9)
        assert p.mean == pytest.approx(float(g.mean()), rel=1e-9, abs=1e-12)
        assert p.max_abs == pytest.approx(float(g.abs().max()), rel=1e-9)
        assert p.zero_fraction == pytest.approx(float((g == 0).double().mean()))
        assert p.negative_fraction == pytest.approx(float((g < 0).double().mean()))
        wn = float(dict(m.named_parameters())[name].detach().norm())
        assert p.ratio == pytest.approx(float(g.norm()) / wn, rel=1e-9)
    layers = {r.key: r for r in rep.layers}
    # gradient wrt fc2's output is the one-hot seed; wrt its input (= relu output) is w2[c].
    assert layers["fc2"].grad_output.norm == pytest.approx(math.sqrt(n))
    assert layers["fc2"].grad_input.norm == pytest.approx(float(dh.norm()), rel=1e-9)
    assert layers["relu"].grad_output.norm == pytest.approx(float(dh.norm()), rel=1e-9)
    assert layers["relu"].grad_input.norm == pytest.approx(float(dz.norm()), rel=1e-9)
    assert layers["fc1"].grad_output.norm == pytest.approx(float(dz.norm()), rel=1e-9)
    assert layers["fc1"].grad_input.norm == pytest.approx(float((dz @ w1).norm()), rel=1e-9)
    assert torch.allclose(rep.input_grads[0], dz @ w1)
    total = math.sqrt(sum(float(g.pow(2).sum()) for g in hand.values()))
    assert rep.global_norm == pytest.approx(total, rel=1e-9)
    assert [s.targets for s in rep.samples] == [[c]] * n


def test_two_layer_losses_closed_form() -> None:
    m, x = two_layer()
    y = m(x).detach()
    labels = [0, 1, 2, 3, 0, 1]
    onehot = F.one_hot(torch.tensor(labels), 4).double()
    rep = gradients(m, x, loss="cross-entropy", labels=labels)
    # d CE / d y = softmax(y) - onehot; the bias gradient is its sum over the inputs.
    expect = (torch.softmax(y, 1) - onehot).sum(0)
    b = next(p for p in rep.params if p.name == "fc2.bias")
    assert b.norm == pytest.approx(float(expect.norm()), rel=1e-9)
    assert b.mean == pytest.approx(float(expect.mean()), abs=1e-12)
    ce = F.cross_entropy(y, torch.tensor(labels), reduction="none")
    assert [s.objective for s in rep.samples] == pytest.approx(ce.tolist())
    # mse against the one-hot of one label for all: d/dy = 2 (y - t) / C
    rep = gradients(m, x, loss="mse", labels=2)
    t = F.one_hot(torch.tensor([2] * 6), 4).double()
    expect = (2 * (y - t) / 4).sum(0)
    b = next(p for p in rep.params if p.name == "fc2.bias")
    assert b.norm == pytest.approx(float(expect.norm()), rel=1e-9)
    # sum: every output element, seed of ones
    rep = gradients(m, x, loss="sum")
    b = next(p for p in rep.params if p.name == "fc2.bias")
    assert b.norm == pytest.approx(math.sqrt(4) * 6)


def test_clip_norm_matches_torch() -> None:
    m, x = two_layer()
    rep = gradients(m, x, target="1", clip_norm=0.5)
    ref = copy.deepcopy(m)
    ref(x)[:, 1].sum().backward()
    before = {n: p.grad.clone() for n, p in ref.named_parameters()}
    total = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5))
    assert rep.clip is not None
    assert rep.clip.total_norm == pytest.approx(total, rel=1e-9)
    for n, p in ref.named_parameters():
        assert torch.allclose(p.grad, before[n] * rep.clip.scale)
    shares = {n: float(g.pow(2).sum()) / total**2 for n, g in before.items()}
    top = max(shares, key=shares.__getitem__)
    assert rep.clip.dominant[0][0] == top
    assert rep.clip.dominant[0][1] == pytest.approx(shares[top])


def test_saliency_equals_autograd_and_inplace_relu() -> None:
    m = TinyCNN().eval()
    with torch.no_grad():
        m.features[1].running_mean.uniform_(-0.2, 0.2)
    x = torch.randn(3, 3, 12, 12)
    before = model_state(m)
    rep = gradients(m, x, target="top:2", keep_input_grad=True)
    assert_unchanged(m, before)
    assert m.features[2].inplace is True and m.features[4].inplace is True
    ref = copy.deepcopy(m)
    for mod in ref.modules():
        if isinstance(mod, nn.ReLU):
            mod.inplace = False
    xr = x.clone().requires_grad_(True)
    y = ref(xr)
    top = y.detach().topk(2, dim=1).indices
    (gx,) = torch.autograd.grad(y.gather(1, top).sum(), xr)
    assert torch.allclose(rep.input_grads[0], gx, atol=1e-7)
    # The in-place ReLU's gradients, independently: retain_grad on an out-of-place forward.
    f = ref.features
    a0 = f[1](f[0](x))
    a0.retain_grad()
    r0 = f[2](a0)
    r0.retain_grad()
    out = ref.fc(torch.flatten(ref.pool(f[4](f[3](r0))), 1))
    out.gather(1, top).sum().backward()
    layers = {r.key: r for r in rep.layers}
    assert layers["features.2"].grad_output.norm == pytest.approx(float(r0.grad.norm()), rel=1e-5)
    assert layers["features.2"].grad_input.norm == pytest.approx(float(a0.grad.norm()), rel=1e-5)
    assert layers["features.1"].grad_output.norm == pytest.approx(float(a0.grad.norm()), rel=1e-5)


def test_grad_fields_untouched_and_none_stays_none() -> None:
    m, x = two_layer()
    m.fc1.weight.grad = torch.full_like(m.fc1.weight, 7.0)
    assert m.fc2.weight.grad is None
    before = model_state(m)
    gradients(m, x)
    assert_unchanged(m, before)
    assert m.fc2.weight.grad is None and bool((m.fc1.weight.grad == 7.0).all())


def test_reused_module_one_record_per_call() -> None:
    m = ReusedReLU().double()
    x = torch.randn(4, 4, dtype=torch.float64)
    rep = gradients(m, x, target="0")
    keys = [r.key for r in rep.layers]
    assert keys == ["fc1", "relu#0", "fc2", "relu#1"]
    layers = {r.key: r for r in rep.layers}
    with torch.no_grad():
        z1 = m.fc1(x)
        z2 = m.fc2(torch.relu(z1))
    d_relu1_out = F.one_hot(torch.tensor([0] * 4), 3).double()
    d_fc2_out = d_relu1_out * (z2 > 0)
    d_relu0_out = d_fc2_out @ m.fc2.weight.detach()
    assert layers["relu#1"].grad_output.norm == pytest.approx(2.0)
    assert layers["relu#1"].grad_input.norm == pytest.approx(float(d_fc2_out.norm()))
    assert layers["relu#0"].grad_output.norm == pytest.approx(float(d_relu0_out.norm()), rel=1e-9)
    assert layers["relu#0"].grad_input.norm == pytest.approx(float((d_relu0_out * (z1 > 0)).norm()), rel=1e-9)


def test_output_key_and_merge_over_batches() -> None:
    m = DictOut().double()
    x = torch.randn(5, 4, dtype=torch.float64)
    a = gradients(m, x, target="1", output_key="logits")
    b = gradients(m, x, target="1", output_key="extra/0")  # y * 2
    assert b.global_norm == pytest.approx(2 * a.global_norm)
    whole = gradients(m, x, target="1", output_key="logits")
    split = gradients(m, [x[:2], x[2:]], target="1", output_key="logits")
    assert split.global_norm == pytest.approx(whole.global_norm)
    for r1, r2 in zip(whole.layers, split.layers):
        for s1, s2 in ((r1.grad_output, r2.grad_output), (r1.grad_input, r2.grad_input)):
            for f in ("mean", "std", "min", "max", "norm", "abs_mean", "zero_fraction"):
                assert getattr(s2, f) == pytest.approx(getattr(s1, f), rel=1e-9, abs=1e-12)
    t = torch.randn(1000, dtype=torch.float64)
    t[::7] = 0
    merged = merge_stats(tensor_stats(t[:300]), tensor_stats(t[300:]))
    direct = tensor_stats(t)
    for f in ("mean", "std", "min", "max", "norm", "abs_mean", "zero_fraction", "negative_fraction"):
        assert getattr(merged, f) == pytest.approx(getattr(direct, f), rel=1e-9)


def test_api_errors_and_failure_restores(user_file: Path) -> None:
    m, x = two_layer()
    with pytest.raises(UsageError, match="cross-entropy needs"):
        gradients(m, x, loss="cross-entropy")
    with pytest.raises(UsageError, match="both say"):
        gradients(m, x, target="1", loss="sum")
    with pytest.raises(InputError, match="out of range"):
        gradients(m, x, loss="cross-entropy", labels=9)
    with pytest.raises(InputError, match="labels"):
        gradients(m, x, loss="cross-entropy", labels=[0, 1])
    from fixtures.models import Boom

    boom = Boom()
    before = model_state(boom)
    with pytest.raises(ModelRuntimeError, match="layer 'c'"):
        gradients(boom, torch.randn(2, 4))
    assert_unchanged(boom, before)


# ----------------------------------------------------------------- checks
def test_nan_first_layer_in_backward_order(user_file: Path) -> None:
    m = _load(user_file, "NaNNet")
    before = model_state(m)
    rep = gradients(m, torch.randn(4, 4), target="0", fail_on="nan")
    assert_unchanged(m, before)
    assert rep.first_nonfinite == "bad (gradient wrt its input)"
    nan = next(c for c in rep.checks if c.name == "nan")
    assert nan.status == "fail" and nan.fail_on and "bad" in nan.detail
    assert "fc2:output" not in nan.layers and "bad:output" not in nan.layers
    assert [c.name for c in rep.failures()] == ["nan"]


def test_exploding_layer_fails_healthy_passes(cli, user_file: Path) -> None:
    spec = f"{user_file}:Exploding"
    res = cli(["grads", spec, "--input-size", "8", "--batch-size", "3", "--fail-on", "exploding,nan", "--json"])
    assert res.exit_code == 1, res.stderr
    err = res.stderr.strip().splitlines()
    assert err[-1].startswith("error: gradient check 'exploding' failed: largest layer gradient norm")
    doc = json.loads(res.stdout)  # the report is written before the failure
    check = next(c for c in doc["checks"] if c["name"] == "exploding")
    assert check["status"] == "fail" and check["value"] > check["threshold"] == 1e4
    assert "l2" in check["layers"] and "l4" not in check["layers"]
    ok = cli(["grads", f"{user_file}:Healthy", "--input-size", "8", "--batch-size", "3",
              "--fail-on", "all", "--json"])
    assert ok.exit_code == 0, ok.stderr
    assert all(c["status"] == "pass" for c in json.loads(ok.stdout)["checks"])
    nan = cli(["grads", f"{user_file}:NaNNet", "--input-size", "4", "--fail-on", "nan", "-q"])
    assert nan.exit_code == 1
    assert "first in backward order: bad (gradient wrt its input)" in nan.stderr
    assert "First non-finite gradient in backward order: bad" in nan.stdout


# ----------------------------------------------------------------- jacobian
def _jac_net() -> tuple[nn.Module, torch.Tensor]:
    m = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 6), nn.ReLU(inplace=True), nn.Linear(6, 4))
    return m, torch.randn(3, 5)


def test_jacobian_norm_estimate_vs_exact() -> None:
    m, x = _jac_net()
    before = model_state(m)
    h = m[0](x).detach()
    exact_j = torch.autograd.functional.jacobian(lambda b: m[3](m[2](m[1](b))).clone(), h)
    exact = float(exact_j.pow(2).sum())
    # The default 16 probes, and 256 probes over several seeds: within 3 standard errors.
    default = jacobian(m, x, of="3", wrt="0", norm=True, seed=0)[0]
    assert default.probes == 16
    assert abs(default.norm_sq - exact) <= 3 * default.norm_sq_se
    assert default.norm == pytest.approx(math.sqrt(default.norm_sq))
    errs = {}
    for k in (4, 256):
        runs = [jacobian(m, x, of="3", wrt="0", norm=True, probes=k, seed=s)[0] for s in range(8)]
        if k == 256:
            for r in runs:
                assert abs(r.norm_sq - exact) <= 3 * r.norm_sq_se
        errs[k] = (sum(abs(r.norm_sq - exact) for r in runs) / len(runs),
                   sum(r.norm_sq_se for r in runs) / len(runs))
    # The error (and the standard error) shrink as probes grow: ~1/sqrt(K), 8x here.
    assert errs[256][0] < errs[4][0] / 2 and errs[256][1] < errs[4][1] / 4
    assert_unchanged(m, before)
    assert m[3].inplace is True
    # the ones-vector VJP: d(sum of layer 3's output)/d(layer 0's output)
    r = jacobian(m, x, of="3", wrt="0")[0]
    ones = torch.einsum("iajb->jb", exact_j)
    assert r.vjp.norm == pytest.approx(float(ones.norm()), rel=1e-5)
    assert r.sample_norms == pytest.approx(ones.norm(dim=1).tolist(), rel=1e-5)


def test_jacobian_score_wrt_input_and_errors() -> None:
    m, x = _jac_net()
    r = jacobian(m, x, of="score", wrt="input", target="2")[0]
    xr = x.clone().requires_grad_(True)
    ref = copy.deepcopy(m)
    ref[3].inplace = False
    (g,) = torch.autograd.grad(ref(xr)[:, 2].sum(), xr)
    assert r.vjp.norm == pytest.approx(float(g.norm()), rel=1e-6)
    assert r.targets == [[2]] * 3
    from inspect_model.errors import LayerSelectionError

    with pytest.raises(LayerSelectionError, match="does not run after"):
        jacobian(m, x, of="0", wrt="2")
    with pytest.raises(LayerSelectionError, match="not found"):
        jacobian(m, x, of="9", wrt="0")
    with pytest.raises(UsageError, match="identity"):
        jacobian(m, x, of="2", wrt="2")


# ----------------------------------------------------------------- CLI contract
def test_cli_outputs_schema_tensorboard(cli, models_py: Path, tmp_path: Path) -> None:
    import jsonschema

    from inspect_model.output.tensorboard import read_tags

    schema = json.loads(SCHEMA.read_text())
    out, tb = tmp_path / "o", tmp_path / "tb"
    base = ["grads", f"{models_py}:TinyCNN", "--input-size", "3x12x12", "--batch-size", "2"]
    res = cli(base + ["--clip-norm", "1", "-o", str(out), "--tensorboard", str(tb), "--json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    assert {Path(f).name for f in doc["files"]} >= {"report.json", "report.txt", "grad_flow.png",
                                                    "grad_histograms_001.png"}
    assert all((out / f).exists() for f in doc["files"])
    assert doc["options"]["inputs"]["input_size"] == [3, 12, 12]
    tags = read_tags(tb)
    assert "grads/global_norm" in tags["scalars"]
    assert "grads/layer/fc/log10_abs_output_grad" in tags["histograms"]
    # byte-reproducible PNGs and the same report
    res2 = cli(base + ["--clip-norm", "1", "-o", str(out), "--force", "--json"])
    png = (out / "grad_flow.png").read_bytes()
    doc2 = json.loads(res2.stdout)
    assert doc2["global_grad_norm"] == doc["global_grad_norm"]
    res3 = cli(base + ["--clip-norm", "1", "-o", str(tmp_path / "o3"), "-q"])
    assert (tmp_path / "o3" / "grad_flow.png").read_bytes() == png
    assert "Gradients of:" in res3.stdout and res3.stderr == ""
    # jsonl: one object per image
    lines = cli(base + ["--jsonl"]).stdout.strip().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["image"] == "random-0"
    # jacobian mode, schema-valid, with a PNG for a spatial --wrt
    jo = tmp_path / "j"
    res = cli(base + ["--of", "fc", "--wrt", "features.3", "--jacobian-norm", "--probes", "4",
                      "-o", str(jo), "--json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    assert doc["mode"] == "jacobian" and doc["jacobians"][0]["probes"] == 4
    assert any(Path(f).name.startswith("jacobian_fc_wrt_features.3") for f in doc["files"])


@pytest.mark.parametrize(("args", "message"), [
    (["--loss", "cross-entropy"], "--loss cross-entropy needs the true class"),
    (["--fail-on", "nan,bogus"], "--fail-on 'bogus' is not a check"),
    (["--target", "1", "--loss", "sum"], "both say what to differentiate"),
    (["--of", "fc", "--loss", "sum"], "--loss does not apply with --of/--wrt"),
    (["--jacobian-norm"], "--jacobian-norm needs --of"),
    (["--layers", "nope"], "layer 'nope' not found"),
    (["--json", "--jsonl"], "--json and --jsonl cannot be combined"),
])
def test_cli_errors(cli, models_py: Path, args: list[str], message: str) -> None:
    res = cli(["grads", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "-q", *args])
    assert res.exit_code in (2, 5), res.stderr
    assert res.stderr.startswith("error: ") and message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_cli_labels_file(cli, models_py: Path, tmp_path: Path) -> None:
    lab = tmp_path / "labels.txt"
    lab.write_text("1\n3\n")
    base = ["grads", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "--batch-size", "2", "--json",
            "--loss", "cross-entropy"]
    res = cli(base + ["--labels-file", str(lab)])
    assert res.exit_code == 0, res.stderr
    assert [s["targets"] for s in json.loads(res.stdout)["images"]] == [[1], [3]]
    lab.write_text("1\n")
    res = cli(base + ["--labels-file", str(lab)])
    assert res.exit_code == 4 and "one label per image" in res.stderr


def test_histogram_of_a_large_gradient_is_a_faithful_sample() -> None:
    """Over HIST_SAMPLE values the bins come from a strided sample scaled to the exact count
    of non-zero finite values; zeros, Inf and NaN stay exact (independent check: numpy's
    histogram of every value)."""
    import numpy as np

    from inspect_model.methods.gradients.stats import HIST_BINS, HIST_HI, HIST_LO, HIST_SAMPLE, log_hist

    g = torch.exp(torch.randn(HIST_SAMPLE * 8) * 2.0) * 1e-4  # log-normal magnitudes
    g[::7] = 0.0
    g[5] = float("inf")
    g[11] = float("nan")
    h = log_hist(g)
    v = g.numpy()
    finite = v[np.isfinite(v) & (v != 0)]
    exact, _ = np.histogram(np.clip(np.log10(np.abs(finite)), HIST_LO, HIST_HI - 1e-6), HIST_BINS,
                            (HIST_LO, HIST_HI))
    assert h.zeros == int((v == 0).sum())
    assert sum(h.counts) == finite.size == int(exact.sum())
    big = exact > 0.01 * exact.sum()
    np.testing.assert_allclose(np.array(h.counts)[big], exact[big], rtol=0.05)
    small = log_hist(g[:1000])  # under the limit: exact
    e_small, _ = np.histogram(np.clip(np.log10(np.abs(v[:1000][np.isfinite(v[:1000]) & (v[:1000] != 0)])),
                                      HIST_LO, HIST_HI - 1e-6), HIST_BINS, (HIST_LO, HIST_HI))
    assert small.counts == e_small.tolist()


# ----------------------------------------------------------------- every layer in the histograms (issue 14)
def test_grads_histograms_show_every_layer_on_pages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      cli) -> None:
    from inspect_model.render.gradients import HIST_PER_PAGE

    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(60)])  # 60 layers: every one on a page
    spec = register_model(monkeypatch, model)
    res = cli(["grads", spec, "--input-size", "4", "--weights", "none", "-o", str(tmp_path / "g"), "--quiet"])
    assert res.exit_code == 0, res.stderr
    pages = sorted(p.name for p in (tmp_path / "g").glob("grad_histograms_*.png"))
    n_pages = -(-60 // HIST_PER_PAGE)
    assert pages == [f"grad_histograms_{i:03d}.png" for i in range(1, n_pages + 1)]

    import inspect_model as im
    from inspect_model.render.gradients import histogram_pages

    result = im.grads(model, inputs=im.InputOptions(input_size=["4"]), model_options=im.ModelOptions(model, weights=None))
    assert len(histogram_pages(result.record)) == n_pages  # tests/unit/render/test_pictures.py checks each layer's panel
