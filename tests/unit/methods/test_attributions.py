"""``methods/attributions``: every method equals captum on the same model, input and
settings (captum is an independent implementation); IG's completeness; chunking; errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inspect_model.errors import InputError, UsageError
from inspect_model.methods.attributions import passes as ap
from inspect_model.methods.attributions.maps import AttributionSettings, attribute

captum_attr = pytest.importorskip("captum.attr")


def small_cnn() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 8, 3, padding=1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(2),
        nn.Flatten(), nn.Linear(32, 7),
    ).eval()


_RESNET: dict[str, nn.Module] = {}


def resnet18() -> nn.Module:
    if "m" not in _RESNET:
        from torchvision.models import resnet18 as build

        torch.manual_seed(2)
        _RESNET["m"] = build(weights=None, num_classes=10).eval()
    return _RESNET["m"]


MODELS = {"cnn": (small_cnn, (2, 3, 16, 16)), "resnet18": (resnet18, (2, 3, 40, 40))}


def close(ours: torch.Tensor, ref: torch.Tensor, rel: float = 2e-4) -> None:
    scale = float(ref.abs().max())
    err = float((ours.double() - ref.double()).abs().max())
    assert err <= rel * scale + 1e-9, f"max |ours - captum| = {err:.3g}, scale {scale:.3g}"


def setup(name: str) -> tuple[nn.Module, torch.Tensor]:
    build, shape = MODELS[name]
    torch.manual_seed(3)
    return build(), torch.randn(shape)


def run(model: nn.Module, x: torch.Tensor, target: object = "top:2", **kw: object):
    return attribute(model, x, target, AttributionSettings(**kw))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", list(MODELS))
def test_gradient_family_equals_captum(name: str) -> None:
    model, x = setup(name)
    res = run(model, x, methods=("saliency", "gradient", "input-x-gradient"), batch_size=3)
    for k in range(2):
        tgt = [row[k] for row in res.targets]
        close(res.maps["saliency"][:, k], captum_attr.Saliency(model).attribute(x, target=tgt, abs=True))
        close(res.maps["gradient"][:, k], captum_attr.Saliency(model).attribute(x, target=tgt, abs=False))
        close(res.maps["input-x-gradient"][:, k], captum_attr.InputXGradient(model).attribute(x, target=tgt))


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("rule", ["riemann-left", "riemann-right", "riemann-middle", "gauss-legendre"])
def test_integrated_gradients_equal_captum(name: str, rule: str) -> None:
    model, x = setup(name)
    steps = 8 if name == "resnet18" else 12
    res = run(model, x, target="predicted", methods=("integrated-gradients",), steps=steps, rule=rule, batch_size=5)
    tgt = [row[0] for row in res.targets]
    ig = captum_attr.IntegratedGradients(model)
    ref, delta = ig.attribute(x, target=tgt, n_steps=steps, method=rule.replace("-", "_").replace("gauss_", "gauss"),
                              internal_batch_size=5, return_convergence_delta=True)
    close(res.maps["integrated-gradients"][:, 0], ref)
    # The completeness gap: captum's convergence delta (float32 sums: compare to the map's scale).
    scale = float(ref.abs().sum()) / x.shape[0]
    for n in range(x.shape[0]):
        assert abs(res.deltas[n][0] - float(delta[n])) <= 1e-4 * scale + 1e-6


def test_trapezoid_is_captums_with_weights_that_sum_to_one() -> None:
    """captum weights the n trapezoid points by 1/n (sum (n-1)/n); ours by 1/(n-1)."""
    model, x = setup("cnn")
    n = 10
    res = run(model, x, target=[1, 4], methods=("integrated-gradients",), steps=n, rule="riemann-trapezoid")
    ref = captum_attr.IntegratedGradients(model).attribute(x, target=[1, 4], n_steps=n, method="riemann_trapezoid")
    close(res.maps["integrated-gradients"][:, 0], ref * n / (n - 1))
    assert sum(ap.integration_rule("riemann-trapezoid", n)[1]) == pytest.approx(1.0)


@pytest.mark.parametrize("name", list(MODELS))
def test_occlusion_equals_captum(name: str) -> None:
    model, x = setup(name)
    window, stride = (5,) if name == "cnn" else (12,), (3,) if name == "cnn" else (10,)
    res = run(model, x, target=[2, 5], methods=("occlusion",), window=window, stride=stride, batch_size=16,
              baseline=0.25)
    c = x.shape[1]
    ref = captum_attr.Occlusion(model).attribute(x, sliding_window_shapes=(c, window[0], window[0]),
                                                 strides=(c, stride[0], stride[0]), baselines=0.25, target=[2, 5])
    close(res.maps["occlusion"][:, 0], ref)


def _feed_noise(monkeypatch: pytest.MonkeyPatch, x: torch.Tensor, seed: int, samples: int,
                sigmas: list[float]) -> None:
    """captum's NoiseTunnel draws from the global RNG; give it our seeded draws instead
    (rows sample-major per input, as captum's repeat_interleave lays them out)."""
    from captum.attr._core import noise_tunnel

    noise = torch.stack([ap.draw_noise(seed, n, s, x.shape[1:], sigmas[n])
                         for n in range(x.shape[0]) for s in range(samples)])

    def add(inp: torch.Tensor, stdev: float, parts: int) -> torch.Tensor:
        assert parts == samples
        return inp.repeat_interleave(parts, dim=0) + noise.to(inp.dtype)

    monkeypatch.setattr(noise_tunnel.NoiseTunnel, "_add_noise_to_input", staticmethod(add))


@pytest.mark.parametrize("name", list(MODELS))
def test_smoothgrad_and_vargrad_equal_captum_with_the_same_noise(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, x = setup(name)
    samples, seed = 5, 11
    res = run(model, x, target=[3, 1], methods=("smoothgrad", "vargrad"), samples=samples, noise=0.2,
              seed=seed, batch_size=4)
    sigmas = [0.2 * float(x[n].max() - x[n].min()) for n in range(x.shape[0])]
    _feed_noise(monkeypatch, x, seed, samples, sigmas)
    nt = captum_attr.NoiseTunnel(captum_attr.Saliency(model))
    for kind, key in (("smoothgrad", "smoothgrad"), ("vargrad", "vargrad")):
        ref = nt.attribute(x, nt_type=kind, nt_samples=samples, stdevs=1.0, target=[3, 1], abs=False)
        close(res.maps[key][:, 0], ref, rel=5e-4)


def test_smooth_around_ig_and_input_x_gradient_equals_noise_tunnel(monkeypatch: pytest.MonkeyPatch) -> None:
    model, x = setup("cnn")
    samples, steps = 3, 6
    res = run(model, x, target=[0, 2], methods=("input-x-gradient", "integrated-gradients", "saliency"),
              smooth=True, samples=samples, steps=steps, noise=0.1, noise_mode="absolute", batch_size=7)
    assert set(res.smoothed) == {"input-x-gradient", "integrated-gradients", "saliency"}
    _feed_noise(monkeypatch, x, 0, samples, [0.1, 0.1])
    ixg = captum_attr.NoiseTunnel(captum_attr.InputXGradient(model)).attribute(
        x, nt_samples=samples, stdevs=0.1, target=[0, 2])
    close(res.maps["input-x-gradient"][:, 0], ixg)
    sal = captum_attr.NoiseTunnel(captum_attr.Saliency(model)).attribute(x, nt_samples=samples, stdevs=0.1,
                                                                         target=[0, 2])
    close(res.maps["saliency"][:, 0], sal)
    ig = captum_attr.NoiseTunnel(captum_attr.IntegratedGradients(model)).attribute(
        x, nt_samples=samples, stdevs=0.1, target=[0, 2], n_steps=steps)
    close(res.maps["integrated-gradients"][:, 0], ig)


def test_guided_equals_captum_and_the_guided_backprop_engine() -> None:
    from inspect_model.methods.guided.backprop import guided_backprop

    model, x = setup("cnn")
    res = run(model, x, target=[1, 6], methods=("guided",))
    ref = captum_attr.GuidedBackprop(model).attribute(x, target=[1, 6])
    close(res.maps["guided"][:, 0], ref)
    close(res.maps["guided"][:, 0], guided_backprop(model, x, [1, 6]).gradients[:, 0])
    assert res.guided_sites == {"relu": 2}


def test_ig_completeness_gap_matches_independent_scores_and_shrinks_with_steps() -> None:
    model, x = setup("cnn")
    gaps = []
    for steps in (2, 8, 32, 128):
        res = run(model, x, target=[4, 4], methods=("integrated-gradients",), steps=steps,
                  rule="riemann-right", baseline="blur:2")
        base = ap.gaussian_blur(x, 2.0)
        with torch.no_grad():  # f(x) and f(baseline), computed here by hand
            fx, fb = model(x)[:, 4].double(), model(base)[:, 4].double()
        sums = res.maps["integrated-gradients"][:, 0].reshape(2, -1).double().sum(1)
        for n in range(2):
            gap = float(sums[n] - (fx[n] - fb[n]))
            assert res.deltas[n][0] == pytest.approx(gap, abs=1e-5)
        gaps.append(max(abs(d[0]) for d in res.deltas))
    assert gaps[0] > gaps[1] > gaps[2] > gaps[3]
    assert gaps[-1] < 0.02 * float((fx - fb).abs().max())


class TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 6)
        self.pos = nn.Embedding(5, 6)
        self.head = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))

    def from_embeddings(self, e: torch.Tensor) -> torch.Tensor:
        e = e + self.pos(torch.arange(e.shape[1]))[None]
        return self.head(e.mean(1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.embed(ids)
        e += self.pos(torch.arange(ids.shape[1]))[None]  # in place, as some models do
        return self.head(e.mean(1))


def test_token_ids_are_attributed_at_the_embedding_output() -> None:
    torch.manual_seed(4)
    model = TokenModel().eval()
    ids = torch.randint(0, 20, (3, 5))
    res = run(model, ids, target=[0, 2, 1], methods=("saliency", "integrated-gradients", "occlusion"), steps=16,
              window=(1,))
    assert res.space == "embedding" and res.embedding_layer == "embed"
    e = model.embed(ids).detach()
    f = model.from_embeddings  # the same network, fed embeddings: an independent forward for captum
    close(res.maps["saliency"][:, 0], captum_attr.Saliency(f).attribute(e, target=[0, 2, 1]))
    close(res.maps["integrated-gradients"][:, 0],
          captum_attr.IntegratedGradients(f).attribute(e, target=[0, 2, 1], n_steps=16))
    occ = captum_attr.Occlusion(f).attribute(e, sliding_window_shapes=(1, 6), strides=(1, 6), target=[0, 2, 1])
    close(res.maps["occlusion"][:, 0], occ)


def test_chunks_never_exceed_batch_size_and_do_not_change_results() -> None:
    model, x = setup("cnn")
    sizes: list[int] = []
    handle = model.register_forward_pre_hook(lambda m, a: sizes.append(a[0].shape[0]))
    try:
        kw = dict(methods=("integrated-gradients", "smoothgrad", "occlusion"), steps=9, samples=4, window=(6,))
        small = run(model, x, target=[1, 2], batch_size=3, **kw)
    finally:
        handle.remove()
    assert max(sizes) <= 3 and len(sizes) > 20
    big = run(model, x, target=[1, 2], batch_size=1000, **kw)
    for m in small.maps:
        close(small.maps[m], big.maps[m], rel=1e-5)
    # The noise of an image depends on its global index, not on the batch it came in.
    one = attribute(model, x[1:], [2], AttributionSettings(methods=("smoothgrad",), samples=4), first_index=1)
    close(one.maps["smoothgrad"][0], big.maps["smoothgrad"][1], rel=1e-5)


def test_model_rng_and_hooks_are_left_as_they_were() -> None:
    model, x = setup("cnn")
    model.train()
    model[0].weight.requires_grad_(False)
    rng = torch.get_rng_state()
    run(model, x, methods=("all",), steps=4, samples=2, window=(8,), baseline="uniform", smooth=True)
    assert torch.equal(rng, torch.get_rng_state())
    assert all(m.training for m in model.modules())
    assert not model[0].weight.requires_grad and model[3].weight.requires_grad
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert all(p.grad is None for p in model.parameters())


def test_bad_settings_and_inputs_are_one_line_errors(tmp_path) -> None:
    model, x = setup("cnn")
    with pytest.raises(UsageError, match=r"--steps 0"):
        AttributionSettings(methods=("integrated-gradients",), steps=0)
    with pytest.raises(UsageError, match=r"--window 20 \(3x20x20 on this input\) is larger than the input \(3, 16, 16\)"):
        run(model, x, methods=("occlusion",), window=(20,))
    bad = tmp_path / "base.pt"
    torch.save(torch.zeros(3, 8, 8), bad)
    with pytest.raises(InputError, match=r"baseline file '.*base.pt' has shape \(3, 8, 8\); the input is "
                                         r"\(3, 16, 16\) per sample"):
        run(model, x, methods=("integrated-gradients",), baseline=str(bad))
    with pytest.raises(InputError, match="cannot be differentiated.*no nn.Embedding"):
        run(nn.Sequential(nn.Flatten(), nn.Linear(4, 2)), torch.randint(0, 3, (2, 4)), methods=("saliency",))
    with pytest.raises(UsageError, match="'salience' is not an attribution method.*did you mean 'saliency'"):
        AttributionSettings(methods=("salience",))
    with pytest.raises(UsageError, match="--smooth applies to"):
        AttributionSettings(methods=("occlusion",), smooth=True)
    good = tmp_path / "good.pt"
    torch.save(torch.full((3, 16, 16), 0.5), good)
    a = run(model, x, methods=("integrated-gradients",), baseline=str(good), steps=4)
    b = run(model, x, methods=("integrated-gradients",), baseline=0.5, steps=4)
    close(a.maps["integrated-gradients"], b.maps["integrated-gradients"], rel=1e-6)


def test_hugging_face_token_ids_equal_captum_on_inputs_embeds() -> None:
    """A tiny BERT (random weights, no download): ours at the word-embedding output equals
    captum's IG on ``inputs_embeds``, the model's own entry point for embeddings."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=16, num_labels=3)
    torch.manual_seed(7)
    model = transformers.BertForSequenceClassification(cfg).eval()
    ids = torch.randint(1, 50, (2, 6))
    res = attribute(model, ids, [2, 0], AttributionSettings(methods=("integrated-gradients", "gradient"), steps=8))
    assert res.embedding_layer == "bert.embeddings.word_embeddings"
    e = model.bert.embeddings.word_embeddings(ids).detach()

    def f(emb: torch.Tensor) -> torch.Tensor:
        return model(inputs_embeds=emb).logits

    close(res.maps["integrated-gradients"][:, 0],
          captum_attr.IntegratedGradients(f).attribute(e, target=[2, 0], n_steps=8), rel=1e-3)
    close(res.maps["gradient"][:, 0], captum_attr.Saliency(f).attribute(e, target=[2, 0], abs=False), rel=1e-3)
