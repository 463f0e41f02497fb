"""`inspect-model cam`: every map checked against the paper's formula computed here by hand.

Activations and gradients for the hand computations come from running the tiny model's
pieces directly (no hooks, a full ``torch.autograd.grad``), so they are independent of the
hook engine and of the partial backward pass the implementation uses.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fixtures.models import TinyCNN, TwoLayer, assert_unchanged, model_state
from inspect_model.errors import LayerSelectionError, UsageError
from inspect_model.methods.cam.maps import compute_cams, gradcam, resolve_layer, resolve_layers

SCHEMA = Path(__file__).resolve().parents[2] / "src" / "inspect_model" / "schemas" / "cam.json"


def tiny() -> TinyCNN:
    torch.manual_seed(1)
    m = TinyCNN(in_ch=3, classes=5, width=4).eval()
    with torch.no_grad():  # non-trivial BN statistics
        m.features[1].running_mean.uniform_(-0.2, 0.2)
        m.features[1].running_var.uniform_(0.5, 1.5)
    return m


def pieces(model: TinyCNN, x: torch.Tensor, cls: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """A, G at ``features.3`` (the second conv) by running the model's parts by hand."""
    f = model.features
    a = f[3](torch.relu(f[1](f[0](x)))).detach().requires_grad_(True)
    scores = model.fc(torch.flatten(model.pool(torch.relu(a)), 1))
    sel = scores[torch.arange(x.shape[0]), torch.tensor(cls)].sum()
    (g,) = torch.autograd.grad(sel, a)
    return a.detach().double().numpy(), g.double().numpy()


def hand_raw(method: str, A: np.ndarray, G: np.ndarray) -> np.ndarray:
    """The papers' formulas for one sample, A and G (C, h, w), written with explicit sums."""
    C, h, w = A.shape
    out = np.zeros((h, w))
    for k in range(C):
        if method == "gradcam":  # Selvaraju 2017 Eq. 1: alpha = (1/Z) sum_ij dy/dA
            out += G[k].sum() / (h * w) * A[k]
        elif method == "hirescam":  # Draelos 2020: sum_k dy/dA_k * A_k, element-wise
            out += G[k] * A[k]
        elif method == "xgradcam":  # Fu 2020 Eq. 9
            out += (G[k] * A[k]).sum() / (A[k].sum() + 1e-7) * A[k]
        elif method == "layercam":  # Jiang 2021 Eq. 5
            out += np.maximum(G[k], 0) * A[k]
        elif method == "gradcam++":  # Chattopadhyay 2018 Eq. 19 with Y = exp(S)
            alpha = np.zeros((h, w))
            for i in range(h):
                for j in range(w):
                    g = G[k, i, j]
                    if g != 0:
                        alpha[i, j] = g ** 2 / (2 * g ** 2 + A[k].sum() * g ** 3 + 1e-7)
            out += (alpha * np.maximum(G[k], 0)).sum() * A[k]
    return out


def hand_finish(raw: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    pos = torch.from_numpy(np.maximum(raw, 0)).float()[None, None]
    up = F.interpolate(pos, size=hw, mode="bilinear", align_corners=False)[0, 0].numpy()
    return (up - up.min()) / (up.max() - up.min())


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny models run fastest on one thread; on a loaded CI box, two threads spinning against
    # other processes made the training test ten times slower. Restored afterwards.
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


GRAD_METHODS = ["gradcam", "gradcam++", "xgradcam", "layercam", "hirescam"]


def by_key(res) -> dict:
    return {(m.sample, m.rank, m.method, m.layer): m for m in res.maps}


def test_gradient_methods_equal_the_papers_formulas() -> None:
    model = tiny()
    x = torch.randn(3, 3, 10, 12)
    res = compute_cams(model, x, layers=["features.3"], methods=["all"], target="top:2")
    assert res.passes == {"forward": 1, "backward": 2, "scorecam_forward": 0}
    maps = by_key(res)
    for rank in range(2):
        cls = [row[rank] for row in res.targets]
        A, G = pieces(model, x, cls)
        for n in range(3):
            for method in GRAD_METHODS:
                got = maps[(n, rank, method, "features.3")]
                want = hand_raw(method, A[n], G[n])
                np.testing.assert_allclose(got.raw.numpy(), want, rtol=1e-4, atol=1e-6, err_msg=method)
                assert got.raw_min == pytest.approx(want.min(), rel=1e-4, abs=1e-6)
                assert got.raw_max == pytest.approx(want.max(), rel=1e-4, abs=1e-6)
                np.testing.assert_allclose(got.map.numpy(), hand_finish(want, (10, 12)), atol=1e-4, err_msg=method)
                assert got.target == cls[n]
    # The methods really differ at an inner layer (else the check above proves little).
    a, b = maps[(0, 0, "gradcam", "features.3")].raw, maps[(0, 0, "hirescam", "features.3")].raw
    assert not torch.allclose(a / a.abs().max(), b / b.abs().max(), atol=1e-3)


def test_eigencam_and_scorecam_equal_their_definitions() -> None:
    model = tiny()
    x = torch.randn(2, 3, 8, 8)
    res = compute_cams(model, x, layers=["features.3"], methods=["eigencam", "scorecam"], target=[[1], [3]],
                       scorecam_batch=3)
    A, _ = pieces(model, x, [1, 3])
    maps = by_key(res)
    assert res.passes["scorecam_forward"] == 6  # 2 images x 8 channels in batches of 3, across images
    for n, cls in enumerate([1, 3]):
        # Eigen-CAM: first principal component of the (hw, C) activation matrix.
        X = A[n].reshape(A.shape[1], -1).T
        X = X - X.mean(axis=0)
        _, _, vt = np.linalg.svd(X, full_matrices=False)
        proj = (X @ vt[0]).reshape(8, 8)
        got = maps[(n, 0, "eigencam", "features.3")].raw.numpy()
        assert np.allclose(got, proj, atol=1e-4) or np.allclose(got, -proj, atol=1e-4)
        # Score-CAM: weight of channel k = softmax prob of the class on X * norm(upsample(A_k)).
        weights = []
        for k in range(A.shape[1]):
            up = F.interpolate(torch.from_numpy(A[n, k]).float()[None, None], size=(8, 8), mode="bilinear",
                               align_corners=False)[0, 0]
            mask = (up - up.min()) / (up.max() - up.min()) if up.max() > up.min() else torch.zeros_like(up)
            with torch.no_grad():
                weights.append(float(model(x[n:n + 1] * mask).softmax(1)[0, cls]))
        want = np.tensordot(np.array(weights), A[n], axes=1)
        np.testing.assert_allclose(maps[(n, 0, "scorecam", "features.3")].raw.numpy(), want, rtol=1e-4, atol=1e-6)


def test_cam_equals_gradcam_up_to_scale_on_gap_linear_net() -> None:
    model = tiny()
    x = torch.randn(2, 3, 9, 9)
    res = compute_cams(model, x, layers=["features"], methods=["cam", "gradcam"], target="top:3")
    maps = by_key(res)
    for n in range(2):
        for rank in range(3):
            c, g = maps[(n, rank, "cam", "features")], maps[(n, rank, "gradcam", "features")]
            # dS/dA_k(i,j) = w_k / (h*w) under GAP + linear, so Grad-CAM = CAM / (h*w).
            np.testing.assert_allclose(c.raw.numpy(), g.raw.numpy() * 81, rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(c.map.numpy(), g.map.numpy(), atol=1e-5)
            # And CAM is Zhou's sum_k w_k^c f_k(x, y), computed here from the pieces.
            feats = torch.relu(model.features[3](torch.relu(model.features[1](model.features[0](x)))))
            want = torch.einsum("k,khw->hw", model.fc.weight[c.target], feats[n]).detach().numpy()
            np.testing.assert_allclose(c.raw.numpy(), want, rtol=1e-4, atol=1e-6)


def test_cam_refuses_a_network_without_gap_and_one_linear() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    before = model_state(model)
    with pytest.raises(UsageError, match="global average pooling and one linear layer.*use --method gradcam"):
        compute_cams(model, torch.randn(2, 3, 8, 8), layers=["1"], methods=["cam"])
    assert_unchanged(model, before)


def test_all_is_cam_plus_five_gradient_methods_cam_only_where_it_fits() -> None:
    model = tiny()
    x = torch.randn(2, 3, 8, 8)
    res = compute_cams(model, x, layers=["features"], methods=["all"])
    assert [m.method for m in res.maps if m.sample == 0] == ["cam", *GRAD_METHODS] and not res.notes
    assert res.passes == {"forward": 1, "backward": 1, "scorecam_forward": 0}
    res = compute_cams(model, x, layers=["features.3"], methods=["all"])
    assert [m.method for m in res.maps if m.sample == 0] == GRAD_METHODS
    assert res.notes and "cam left out of --method all at layer 'features.3'" in res.notes[0]


def test_batching_gives_the_same_maps_as_one_at_a_time() -> None:
    model = tiny()
    x = torch.randn(4, 3, 10, 10)
    methods = ["all", "eigencam", "scorecam"]
    full = by_key(compute_cams(model, x, layers=["features.3"], methods=methods, target="top:2"))
    for n in range(4):
        single = compute_cams(model, x[n:n + 1], layers=["features.3"], methods=methods, target="top:2")
        for (s, rank, method, layer), m in by_key(single).items():
            other = full[(n, rank, method, layer)]
            assert other.target == m.target
            torch.testing.assert_close(other.map, m.map, atol=1e-5, rtol=1e-4)
            scale = float(m.raw.abs().max())
            torch.testing.assert_close(other.raw / scale, m.raw / scale, atol=1e-4, rtol=1e-4, msg=method)


def test_several_layers_nested_and_fused() -> None:
    model = tiny()
    x = torch.randn(2, 3, 8, 8)
    both = compute_cams(model, x, layers=["features", "features.3"], methods=["gradcam"], fuse=True)
    # 'features' contains 'features.3': the second needs its own root, hence two passes.
    assert both.passes["forward"] == 2
    maps = by_key(both)
    for name in ("features", "features.3"):
        alone = by_key(compute_cams(model, x, layers=[name], methods=["gradcam"]))
        for n in range(2):
            torch.testing.assert_close(maps[(n, 0, "gradcam", name)].map, alone[(n, 0, "gradcam", name)].map)
    fused = maps[(0, 0, "gradcam", "fused:features+features.3")]
    want = torch.maximum(maps[(0, 0, "gradcam", "features")].map, maps[(0, 0, "gradcam", "features.3")].map)
    want = (want - want.min()) / (want.max() - want.min())
    torch.testing.assert_close(fused.map, want)


def test_gradcam_api_shape_and_values() -> None:
    model = tiny()
    x = torch.randn(2, 3, 8, 8)
    out = gradcam(model, x, "features.3", [[0, 2], [4, 1]])
    assert out.shape == (2, 2, 8, 8)
    assert float(out.min()) >= 0 and float(out.max()) <= 1
    res = by_key(compute_cams(model, x, layers=["features.3"], target=[[0, 2], [4, 1]]))
    torch.testing.assert_close(out[1, 0], res[(1, 0, "gradcam", "features.3")].map)
    assert gradcam(model, x, "features.3", [3, 3]).shape == (2, 1, 8, 8)


def test_model_is_given_back_untouched_also_on_failure() -> None:
    model = tiny()
    model.train()
    model.features[0].weight.requires_grad_(False)
    model.fc.weight.grad = torch.ones_like(model.fc.weight)
    before = model_state(model)
    compute_cams(model, torch.randn(2, 3, 8, 8), layers=["features.3", "features"], fuse=True,
                 methods=["all", "scorecam", "eigencam"], target="top:2")
    compute_cams(model, torch.randn(2, 3, 8, 8), layers=["features"], methods=["cam"])
    assert_unchanged(model, before)
    with pytest.raises(Exception, match="out of range"):
        compute_cams(model, torch.randn(2, 3, 8, 8), layers=["features.3"], target="9")
    assert_unchanged(model, before)


def test_constant_map_is_reported_not_silent() -> None:
    model = tiny()
    with torch.no_grad():
        model.fc.weight.zero_()
    res = compute_cams(model, torch.randn(1, 3, 8, 8), layers=["features"], methods=["gradcam"])
    (m,) = res.maps
    assert m.warnings and "constant" in m.warnings[0]
    assert float(m.map.abs().max()) == 0.0


def test_auto_layer_cnn_vit_swin_and_no_spatial_layer() -> None:
    from torchvision.models import SwinTransformer, VisionTransformer

    assert resolve_layer(tiny(), "auto", torch.randn(1, 3, 8, 8)) == "features"
    torch.manual_seed(0)
    vit = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16,
                            mlp_dim=32, num_classes=4).eval()
    x = torch.randn(2, 3, 32, 32)
    (lay,) = resolve_layers(vit, x, ["auto"])
    assert lay.name == "encoder.layers.encoder_layer_1.ln_1"
    assert (lay.layout.kind, lay.layout.grid, lay.layout.prefix) == ("tokens", (4, 4), 1)
    res = compute_cams(vit, x, methods=["gradcam"])
    assert res.maps[0].raw.shape == (4, 4) and res.maps[0].map.shape == (32, 32)
    (over,) = resolve_layers(vit, x, ["encoder.layers.encoder_layer_1.ln_1"], reshape=(2, 8))
    assert (over.layout.grid, over.layout.prefix) == ((2, 8), 1)
    with pytest.raises(UsageError, match="--reshape 5x5 needs 25 tokens"):
        resolve_layers(vit, x, ["encoder.layers.encoder_layer_1.ln_1"], reshape=(5, 5))
    swin = SwinTransformer(patch_size=[4, 4], embed_dim=8, depths=[1, 1], num_heads=[1, 1],
                           window_size=[2, 2], num_classes=3).eval()
    (lay,) = resolve_layers(swin, x, ["auto"])
    assert (lay.name, lay.layout.kind, lay.layout.grid, lay.layout.channels) == ("features.3", "nhwc", (4, 4), 16)
    assert compute_cams(swin, x, layers=[lay]).maps[0].raw.shape == (4, 4)
    with pytest.raises(LayerSelectionError, match="no layer with a spatial"):
        resolve_layers(TwoLayer(), torch.randn(2, 3), ["auto"])
    with pytest.raises(LayerSelectionError, match="1x1 map has no spatial extent"):
        resolve_layers(tiny(), torch.randn(1, 3, 8, 8), ["pool"])


def squares(n: int, gen: torch.Generator, size: int = 20, side: int = 5) -> tuple[torch.Tensor, torch.Tensor, list]:
    """Noise images with one bright square; its colour (red or green) is the class."""
    x = torch.rand(n, 3, size, size, generator=gen) * 0.3
    y = torch.randint(0, 2, (n,), generator=gen)
    boxes = []
    for i in range(n):
        r, c = (int(v) for v in torch.randint(0, size - side + 1, (2,), generator=gen))
        x[i, int(y[i]), r:r + side, c:c + side] = 1.0
        boxes.append((r, c))
    return x, y, boxes


def test_trained_network_looks_at_the_square() -> None:
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(120):
        x, y, _ = squares(32, gen)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    x, y, boxes = squares(40, gen)
    with torch.no_grad():
        assert (model(x).argmax(1) == y).float().mean() > 0.9
    res = compute_cams(model, x, layers=["3"], methods=["gradcam"], target=y.tolist())
    hits = 0
    for m in res.maps:
        r, c = boxes[m.sample]
        pr, pc = divmod(int(m.map.argmax()), 20)
        hits += r - 1 <= pr <= r + 5 and c - 1 <= pc <= c + 5  # 1 px of bilinear slack
    assert hits >= 0.8 * len(res.maps), hits


# ----------------------------------------------------------------------------- CLI
@pytest.fixture
def images(tmp_path: Path) -> list[str]:
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for i, (h, w) in enumerate([(30, 40), (36, 28)]):
        p = tmp_path / f"img{i}.png"
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(p)
        paths.append(str(p))
    return paths


def test_cli_files_json_schema_and_tensorboard(cli, models_py: Path, images: list[str], tmp_path: Path) -> None:
    import jsonschema
    from PIL import Image

    from inspect_model.output.tensorboard import read_tags

    out, tb = tmp_path / "out", tmp_path / "tb"
    r = cli(["cam", f"{models_py}:TinyCNN", *images, "--weights", "none", "--resize", "24", "--crop", "16",
             "-m", "gradcam", "-m", "eigencam", "-o", str(out), "--save-raw", "--json", "--tensorboard", str(tb)])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()), cls=jsonschema.Draft202012Validator)
    assert doc["layers"][0]["name"] == "features" and "layer: features" in r.stderr
    assert [m["method"] for m in doc["images"][0]["maps"]] == ["gradcam", "eigencam"]
    for f in doc["files"]:
        assert (out / f).is_file(), f
    m = doc["images"][1]["maps"][0]
    assert Image.open(out / m["files"]["overlay"]).size == (28, 36)  # the original image, not the crop
    assert np.load(out / m["files"]["raw_input"]).shape == (16, 16)
    assert np.load(out / m["files"]["raw_layer"]).shape == (16, 16)
    assert doc["contact_sheets"] and (out / doc["contact_sheets"][0]).is_file()
    assert abs(sum(p["probability"] for p in doc["images"][0]["predictions"]) - 1) < 1e-5
    assert "cam/gradcam/features/rank0" in read_tags(tb)["images"]


def test_cli_jsonl_text_and_errors(cli, models_py: Path, images: list[str]) -> None:
    base = ["cam", f"{models_py}:TinyCNN", *images, "--weights", "none", "--crop", "16"]
    r = cli([*base, "--jsonl", "--target", "top:2", "-q"])
    assert r.exit_code == 0, r.stderr
    lines = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert [ln["index"] for ln in lines] == [0, 1] and len(lines[0]["maps"]) == 2 and r.stderr == ""
    r = cli(base)
    assert r.exit_code == 0 and "gradcam" in r.stdout and "predicted:" in r.stdout
    labels = Path(images[0]).parent / "labels.txt"
    labels.write_text("ant\nbee\ncat\ndog\nemu\n")
    r = cli([*base, "--labels", str(labels), "--target", "cat", "--layer", "features.0", "--layer", "features",
             "--fuse", "--json", "-q"])
    assert r.exit_code == 0, r.stderr
    maps = json.loads(r.stdout)["images"][0]["maps"]
    assert [m["layer"] for m in maps] == ["features.0", "features", "fused:features.0+features"]
    assert {m["target"]["label"] for m in maps} == {"cat"} and maps[0]["target"]["class"] == 2
    r = cli(["cam", f"{models_py}:TwoLayer", "--input-size", "3", "--weights", "none"])
    assert r.exit_code == 5 and "no layer with a spatial" in r.stderr and "Traceback" not in r.stderr
    r = cli([*base, "-m", "gradcum"])
    assert r.exit_code == 2 and "--method 'gradcum' is not a CAM method; did you mean 'gradcam'" in r.stderr
    r = cli([*base, "--layer", "featurez"])
    assert r.exit_code == 5 and "layer 'featurez' not found; did you mean 'features'" in r.stderr
    r = cli([*base, "--save-raw"])
    assert r.exit_code == 2 and "--save-raw needs --output-dir" in r.stderr


def test_a_method_is_one_class_and_one_registration() -> None:
    """The registry drives parsing, `all`, help and the maps (issue 12, 35): a new method is
    one class over the base. Here a made-up method, the channel mean of the activations."""
    from inspect_model.methods.cam import base
    from inspect_model.methods.cam import maps as cam_mod

    @base.register
    class MeanCam(base.CamMethod):
        name, title, paper = "meancam", "Mean-CAM", "none"

        def maps(self, inp: base.MapInputs) -> torch.Tensor:
            return inp.A.mean(dim=1)[None].expand(inp.k, -1, -1, -1)

    try:
        assert cam_mod.parse_methods(["meancam", "gradcam"]) == ["gradcam", "meancam"]
        assert "meancam" in base.method_help() and "meancam" not in base.groups()["all"]
        model = TinyCNN().eval()
        x = torch.randn(2, 3, 8, 8)
        res = cam_mod.compute_cams(model, x, methods=["meancam"], layers=["features.3"])
        with torch.no_grad():
            acts = model.features[:4](x)  # (N, C, h, w): the layer's output, without hooks
        expected = torch.relu(acts.mean(dim=1))
        for m in res.maps:
            assert m.method == "meancam"
            torch.testing.assert_close(m.raw, acts.mean(dim=1)[m.sample])
            assert bool(expected[m.sample].max() > 0) == bool(m.map.max() > 0)
    finally:
        base.unregister("meancam")


def test_registry_properties_drive_all_and_gradients() -> None:
    from inspect_model.methods.cam import base
    from inspect_model.methods.cam.maps import parse_methods

    reg = base.methods()
    assert parse_methods(["gradients"]) == [n for n, m in reg.items() if m.needs_gradients]
    assert parse_methods(["all"]) == [n for n, m in reg.items() if m.in_all != "no"]
    assert all(name in base.method_help() for name in reg)
    assert base.task_names("detection") == tuple(n for n, m in reg.items() if "detection" in m.tasks)
    assert [n for n, m in reg.items() if m.class_independent] == ["eigencam"]
    with pytest.raises(UsageError, match="gradkam.*did you mean 'gradcam'"):
        parse_methods(["gradkam"])


def test_eigencam_sign_on_activations_whose_channel_sum_is_flat() -> None:
    """LayerNorm-like activations (every position's channels sum to 0): the channel sum
    cannot fix the principal component's sign, so its largest magnitude is made positive
    (left to the SVD, each of 8 maps would have it positive with probability 1/2)."""
    from inspect_model.methods.cam.maths import eigen_map

    torch.manual_seed(5)
    A = torch.randn(8, 16, 6, 6)
    A = A - A.mean(dim=1, keepdim=True)  # channel sum 0 at every position
    got = eigen_map(A)
    for m in got:
        assert float(m.flatten()[m.abs().argmax()]) > 0
    # A ReLU-like map keeps the channel-sum rule: the bright blob is positive.
    B = torch.zeros(1, 8, 6, 6)
    B[0, :, 2:4, 2:4] = torch.rand(8, 2, 2) + 1.0
    assert float(eigen_map(B)[0, 2:4, 2:4].mean()) > 0


# ----------------------------------------------------------------- targets: top:K past the classes, one tie-break (issues 28.12, 29.8)
def _images(folder: Path, n: int = 3) -> list[str]:
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        p = folder / f"im{i}.png"
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(p)
        out.append(str(p))
    return out


@pytest.mark.parametrize("command", ["cam", "grads", "guided-backprop"])
def test_top_k_above_the_class_count_warns_once(cli, models_py: Path, tmp_path: Path, command: str) -> None:
    """TinyCNN has 5 classes: top:100000 explains all 5 and says so in one warning, over
    three batches."""
    res = cli([command, f"{models_py}:TinyCNN", *_images(tmp_path), "--weights", "none", "--resize", "16",
               "--crop", "16", "--batch-size", "1", "--target", "top:100000", "--json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    cut = [w for w in doc["warnings"] if "top:100000" in w["message"]]
    assert len(cut) == 1 and cut[0]["count"] == 1, doc["warnings"]
    assert "the model has 5" in cut[0]["message"] and "all 5" in cut[0]["message"]
    assert res.stderr.count("top:100000") == 1
    quiet = cli([command, f"{models_py}:TinyCNN", "--weights", "none", "--input-size", "3,16,16",
                 "--target", "top:5", "--json"])
    assert quiet.exit_code == 0 and not any("top:" in w["message"] for w in json.loads(quiet.stdout)["warnings"])


TIED = '''
import torch
from torch import nn


class Tied(nn.Module):
    """An untrained head initialised to zero (as torchvision's ViT): every class scores 0."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(4, 1000)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x):
        return self.head(self.pool(torch.relu(self.conv(x))).flatten(1))
'''


def test_tied_output_one_tie_break_everywhere(cli, tmp_path: Path) -> None:
    """Equal scores rank lowest class first (as argmax does) in the prediction list, the
    'predicted' and top:K targets of cam, grads and guided-backprop."""
    import torch

    from inspect_model.methods.objectives.targets import top_classes

    assert int(torch.zeros(1, 1000).argmax(1)) == 0  # the rule we follow: argmax's
    assert top_classes(torch.zeros(2, 1000), 5).tolist() == [[0, 1, 2, 3, 4]] * 2
    assert top_classes(torch.tensor([[1.0, 3.0, 3.0, 2.0]]), 3).tolist() == [[1, 2, 3]]
    p = tmp_path / "tied.py"
    p.write_text(TIED)
    base = [f"{p}:Tied", "--input-size", "3x8x8", "--weights", "none", "--json"]
    cam = json.loads(cli(["cam", *base, "--layer", "conv"]).stdout)
    rec = cam["images"][0]
    assert [q["class"] for q in rec["predictions"]] == [0, 1, 2, 3, 4]
    assert [m["target"]["class"] for m in rec["maps"]] == [0]
    top = json.loads(cli(["cam", *base, "--layer", "conv", "--target", "top:3"]).stdout)["images"][0]
    assert [m["target"]["class"] for m in top["maps"]] == [0, 1, 2]
    grads = json.loads(cli(["grads", *base, "--target", "top:2"]).stdout)
    assert grads["images"][0]["targets"] == [0, 1]
    guided = json.loads(cli(["guided-backprop", *base]).stdout)
    assert guided["images"][0]["targets"] == [0]


def test_predicted_line_uses_the_terminal_width() -> None:
    """On a 160-column terminal the "predicted:" line is one line, not wrapped to the table."""
    import io

    from rich.console import Console

    from inspect_model.render.cam_report import render_rich
    from inspect_model.reports.cam import (
        CamImage, CamImageFiles, CamLayer, CamMap, CamMapFiles, CamPasses, CamReport, ClassScore)

    preds = [ClassScore(class_=i, label=f"class name number {i}", probability=0.1, score=1.0) for i in range(5)]
    cam_map = CamMap(method="gradcam", layer="conv", rank=0, target=preds[0], class_independent=False, raw_min=0.0,
                     raw_max=1.0, warnings=[], files=CamMapFiles())
    payload = CamReport(
        model="m", methods=["gradcam"], target="predicted", fuse=False, image_count=1, contact_sheets=[],
        passes=CamPasses(forward=1, backward=1, scorecam_forward=0), warnings=[], skipped=[],
        layers=[CamLayer(name="conv", output_shape=[1, 4, 8, 8], kind="nchw", grid=[8, 8], prefix_tokens=0,
                         channels=4)],
        images=[CamImage(index=0, image="cat.jpg", size=None, predictions=preds, targets=[0], maps=[cam_map],
                         files=CamImageFiles())])  # the renderer formats the report's typed records
    buf = io.StringIO()
    console = Console(file=buf, width=160, force_terminal=False, color_system=None)
    for part in render_rich(payload):  # as cli.common.emit prints them
        console.print(part, markup=False, highlight=False) if isinstance(part, str) else console.print(part)
    lines = [ln for ln in buf.getvalue().splitlines() if "predicted:" in ln]
    assert len(lines) == 1 and lines[0].rstrip().endswith("4 class name number 4 0.100"), buf.getvalue()
