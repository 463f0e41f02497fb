"""The few-pass measurement of layer outputs (methods/activations/fused.py, issue 40): the same
numbers as the chunked path and as a direct float64 computation, on every sign path; a ReLU in
place after a measured tensor and an output that is the tensor just measured give the
statistics a fresh measurement gives."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from inspect_model.methods.activations import fused, kernel, native
from inspect_model.methods.activations.capture import ActivationCapture, capture_activations
from inspect_model.methods.activations.measure import measure


def _chunked(t: torch.Tensor, n: int):  # type: ignore[no-untyped-def]
    orig, orig_native = fused.measure_fused, native.measure_native
    fused.measure_fused = lambda *a, **k: None  # type: ignore[assignment]
    native.measure_native = lambda *a, **k: None  # type: ignore[assignment]
    try:
        return measure(t, n)
    finally:
        fused.measure_fused, native.measure_native = orig, orig_native  # type: ignore[assignment]


@pytest.fixture(autouse=True, params=["native", "torch"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test twice: with the native one-read kernel (native.py) and with torch's reductions."""
    if request.param == "native" and kernel.kernel() is None:
        pytest.skip("no C compiler: the native kernel is tested in test_activation_native.py")
    if request.param == "torch":
        monkeypatch.setattr(native, "measure_native", lambda *a, **k: None)
    return str(request.param)


def _direct(t: torch.Tensor) -> dict[str, float]:
    d = t.double().reshape(-1)
    return {"mean": float(d.mean()), "std": float(d.std()) if d.numel() > 1 else 0.0, "min": float(d.min()),
            "max": float(d.max()), "zero_fraction": float((d == 0).double().mean()),
            "negative_fraction": float((d < 0).double().mean())}


def _cases() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    dead = torch.randn(3, 6, 4, 4, generator=g)
    dead[0, 2] = 0
    dead[1, 2] = 0
    dead[2, 3] = 0
    dead[1, 4, 0, 0] = 0
    dead[:, 5] = 0
    dead[0, 5, 1, 1] = 1
    cancel = torch.randn(3, 4, 2, 2, generator=g)
    cancel[:, 1] = torch.tensor([[1.0, -1.0], [2.0, -2.0]])  # cell sum 0, signed values: not dead
    relu_dead = torch.relu(torch.randn(3, 6, 4, 4, generator=g))
    relu_dead[:, 1] = 0
    relu_dead[0, 2] = 0
    return {
        "signed": torch.randn(4, 16, 9, 9, generator=g),
        "relu": torch.relu(torch.randn(4, 16, 9, 9, generator=g)),
        "positive": torch.rand(3, 8, 5, 5, generator=g) + 1,
        "negative": -torch.rand(3, 8, 5, 5, generator=g) - 1,
        "tokens": torch.randn(2, 7, 12, generator=g),
        "vectors": torch.randn(5, 10, generator=g),
        "scalars": torch.randn(6, generator=g),
        "half": torch.randn(2, 4, 6, 6, generator=g).half(),
        "bfloat16": torch.randn(2, 4, 6, 6, generator=g).bfloat16(),
        "far_from_zero": torch.randn(2, 4, 30, 30, generator=g) * 0.01 + 100,
        "dead_signed": dead,
        "zero_sum_not_dead": cancel,
        "dead_relu": relu_dead,
    }


@pytest.mark.parametrize("kind", list(_cases()))
def test_fused_equals_direct_float64_and_the_chunked_path(kind: str) -> None:
    t = _cases()[kind]
    n = t.shape[0]
    m = measure(t, n)
    assert m.bounds is not None, "took the fused path"
    ref = _chunked(t, n)
    assert m.channels.keys() == ref.channels.keys()
    for i in range(n):
        got, want = m.samples[i].stats(), _direct(t[i])
        for k, v in want.items():
            assert getattr(got, k) == pytest.approx(v, rel=1e-5, abs=1e-6), (kind, i, k)
        assert got.numel == t[i].numel()
    for c, ch in m.channels.items():
        dims = [d for d in range(t.ndim) if d != c]
        means = t.double().mean(dims).tolist()
        assert ch.means() == pytest.approx(means, rel=1e-5, abs=1e-7)
        per_image = torch.stack([(t[i].movedim(c - 1, 0).reshape(t.shape[c], -1) == 0).all(1) for i in range(n)])
        assert torch.equal(ch.dead, per_image.all(0)), kind
        assert m.sample_dead[c] == pytest.approx(per_image.double().mean(1).tolist())
        assert torch.equal(ch.dead, ref.channels[c].dead)


def test_variance_far_from_zero_is_exact_where_the_chunked_path_cancels() -> None:
    t = _cases()["far_from_zero"]
    got = measure(t, 2).samples[0].stats().std
    assert got == pytest.approx(float(t[0].double().std()), rel=1e-6)
    assert not math.isclose(_chunked(t, 2).samples[0].stats().std, got, rel_tol=1e-2)  # it was 85% off


def test_non_finite_values_take_the_chunked_path() -> None:
    t = torch.randn(2, 3, 4, 4)
    t[1, 2, 0, 0] = float("nan")
    t[0, 1, 1, 1] = float("inf")
    m = measure(t, 2)
    assert m.bounds is None
    assert m.samples[1].nan == 1 and m.samples[0].inf == 1


def test_relu_in_place_after_a_measured_tensor() -> None:
    """The statistics of a ReLU in place come from the measurement before it: same numbers as
    measuring its output afresh."""
    g = torch.Generator().manual_seed(5)
    t = torch.randn(3, 8, 6, 6, generator=g)
    t[0, 3] = 0
    t[1, 2] = -1.0  # dead after the ReLU in this image only
    t[:, 5] = -torch.rand(3, 6, 6, generator=g)  # dead after the ReLU in every image
    before = measure(t, 3)
    z = torch.relu(t)
    derived, fresh = measure(z, 3, after_relu=before.bounds), measure(z, 3)
    for a, b in zip(derived.samples, fresh.samples):
        _same(a.stats(), b.stats())
    assert torch.equal(derived.channels[1].dead, fresh.channels[1].dead)
    assert derived.channels[1].dead.tolist() == [i == 5 for i in range(8)]
    assert derived.sample_dead[1] == fresh.sample_dead[1]


def _same(a, b) -> bool:  # type: ignore[no-untyped-def]
    for k in ("mean", "std", "min", "max", "zero_fraction", "negative_fraction", "numel", "nan_count"):
        assert getattr(a, k) == pytest.approx(getattr(b, k), rel=1e-6, abs=1e-7), k
    return True


class _Net(nn.Module):
    def __init__(self, inplace: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=inplace)
        self.same = nn.Identity()
        self.drop = nn.Dropout(0.5)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.drop(self.same(self.relu(self.bn(self.conv(x))))))


def test_capture_reuses_and_derives_with_the_numbers_of_a_fresh_measurement() -> None:
    """In place ReLU (derived), Identity and Dropout in eval mode (the tensor just measured,
    unchanged): rows and per-image statistics equal those of a model whose ReLU is not in
    place (every output measured afresh), over two batches merged."""
    torch.manual_seed(0)
    a, b = _Net(True).eval(), _Net(False).eval()
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        a.bn.running_mean.normal_()
    b.load_state_dict(a.state_dict())
    xs = [torch.randn(2, 3, 8, 8), torch.randn(3, 3, 8, 8)]
    ra, rb = capture_activations(a, xs), capture_activations(b, xs)
    assert [r.key for r in ra.layers] == [r.key for r in rb.layers]
    for x, y in zip(ra.layers, rb.layers):
        _same(x.stats, y.stats)
        assert x.channel_means == pytest.approx(y.channel_means, rel=1e-6, abs=1e-7), x.key
        assert (x.dead_channels, x.channels) == (y.dead_channels, y.channels)
    with ActivationCapture(a, ["relu", "same", "drop"]) as cap:
        per = cap.run(xs[0]).images
    with ActivationCapture(b, ["relu", "same", "drop"]) as cap:
        ref = cap.run(xs[0]).images
    for p, q in zip(per, ref):
        for u, v in zip(p.layers, q.layers):
            _same(u.stats, v.stats)
            assert u.dead_channel_fraction == v.dead_channel_fraction


def test_an_in_place_change_other_than_the_relu_is_measured_afresh() -> None:
    class Scale(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mul_(-2.0)

    net = nn.Sequential(nn.Conv2d(3, 4, 3), Scale(), nn.ReLU(inplace=True)).eval()
    x = torch.randn(2, 3, 6, 6)
    rep = capture_activations(net, x)
    with torch.no_grad():
        z = torch.relu(net[0](x) * -2.0)
    for k, v in _direct(z).items():
        assert getattr(rep.layers[-1].stats, k) == pytest.approx(v, rel=1e-5, abs=1e-6), k


def _deferred_everywhere(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Measure as on an accelerator (deferred.py) on the CPU; count the batches run again."""
    from inspect_model.methods.activations import capture, deferred

    monkeypatch.setattr(capture, "defer_on", lambda device: True)
    reruns: list[int] = []
    orig = deferred.resolve

    def counting(pending):  # type: ignore[no-untyped-def]
        out = orig(pending)
        if out is None:
            reruns.append(len(pending))
        return out

    monkeypatch.setattr(deferred, "resolve", counting)
    return reruns


def _rows_equal(ra, rb) -> None:  # type: ignore[no-untyped-def]
    assert [r.key for r in ra.layers] == [r.key for r in rb.layers]
    for x, y in zip(ra.layers, rb.layers):
        _same(x.stats, y.stats)
        assert x.stats.nan_count == y.stats.nan_count and x.stats.inf_count == y.stats.inf_count
        assert x.channel_means == pytest.approx(y.channel_means, rel=1e-6, abs=1e-7), x.key
        assert (x.dead_channels, x.channels) == (y.dead_channels, y.channels), x.key


def test_deferred_measurement_equals_the_one_read_in_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """The accelerator's order (every layer's reductions queued, numbers read once a batch)
    gives the numbers of the measurement read in each hook: moments, counts, channel means,
    dead channels (a ReLU that kills channel 0 in every image), tokens and vectors, over two
    batches, per image too; no batch measured twice."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(inplace=True), nn.Identity(),
                        nn.Flatten(2), nn.Linear(64, 5), nn.GELU(), nn.Flatten(), nn.Linear(30, 4)).eval()
    with torch.no_grad():
        net[1].bias[0] = -100.0
    xs = [torch.randn(2, 3, 8, 8), torch.randn(3, 3, 8, 8)]
    want = capture_activations(net, xs)
    reruns = _deferred_everywhere(monkeypatch)
    got = capture_activations(net, xs)
    assert not reruns
    _rows_equal(got, want)
    assert got.layers[2].dead_channels == 1
    layers = [r.name for r in want.layers]
    with ActivationCapture(net, layers) as cap:
        per = cap.run(xs[1]).images
    monkeypatch.undo()
    with ActivationCapture(net, layers) as cap:
        ref = cap.run(xs[1]).images
    for p, q in zip(per, ref):
        for u, v in zip(p.layers, q.layers):
            _same(u.stats, v.stats)
            assert u.dead_channel_fraction == v.dead_channel_fraction


@pytest.mark.parametrize("case", ["nan", "far_from_zero"])
def test_a_batch_the_deferred_numbers_cannot_finish_is_measured_again(monkeypatch: pytest.MonkeyPatch,
                                                                      case: str) -> None:
    class Poke(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if case == "nan":
                x = x.clone()
                x[0, 1, 0, 0] = float("nan")
                return x
            return x * 0.001 + 100.0

    net = nn.Sequential(nn.Conv2d(3, 4, 3), Poke(), nn.Conv2d(4, 2, 1)).eval()
    x = torch.randn(2, 3, 7, 7)
    want = capture_activations(net, x)
    reruns = _deferred_everywhere(monkeypatch)
    got = capture_activations(net, x)
    assert reruns == [3]
    _rows_equal(got, want)
    if case == "nan":
        assert got.layers[1].stats.nan_count == 1


def test_the_total_of_many_images_equals_a_direct_computation() -> None:
    """Eight images and more are merged at once (Chan's update in numpy)."""
    t = torch.randn(12, 4, 5, 5) * torch.linspace(0.1, 3, 12).view(12, 1, 1, 1) + torch.arange(12.0).view(12, 1, 1, 1)
    t[3, 1] = 0
    t[5, 0, 0, 0] = float("nan")
    for m in (measure(t, 12), measure(t[:7], 7)):
        n = len(m.samples)
        tot = m.total().stats()
        d = t[:n].double().reshape(-1)
        fin = d[torch.isfinite(d)]
        assert tot.numel == d.numel() and tot.nan_count == int(torch.isnan(d).sum())
        assert tot.mean == pytest.approx(float(fin.mean()), rel=1e-6)
        assert tot.std == pytest.approx(float(fin.std()), rel=1e-6)
        assert (tot.min, tot.max) == (float(fin.min()), float(fin.max()))
        assert tot.zero_fraction == pytest.approx(float((d == 0).double().mean()))
        assert tot.negative_fraction == pytest.approx(float((d < 0).double().mean()))
