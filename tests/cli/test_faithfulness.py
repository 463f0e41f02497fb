"""`cam --evaluate`: every faithfulness metric checked against an independent computation.

The references here are written from the papers with numpy: perturbed images built pixel by
pixel from a numpy argsort, the Gaussian blur as an explicit 2-D correlation, the ROAD
imputation as a dense linear system solved by ``numpy.linalg.solve``, AUC by
``numpy.trapezoid``; the model is run on them directly (no engine, no queue).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fixtures.models import TinyCNN, assert_unchanged, model_state
from inspect_model.errors import InputError, UsageError
from inspect_model.methods.faithfulness import metrics as fa
from inspect_model.methods.faithfulness.passes import MapJob, evaluate_maps

SCHEMA = Path(__file__).resolve().parents[2] / "src" / "inspect_model" / "schemas" / "cam.json"


def tiny() -> TinyCNN:
    torch.manual_seed(3)
    return TinyCNN(in_ch=3, classes=5, width=4).eval()


def probs(model: nn.Module, batch: np.ndarray, cls: int) -> list[float]:
    with torch.no_grad():
        return model(torch.from_numpy(batch).float()).softmax(1)[:, cls].tolist()


def ref_blur(img: np.ndarray, k: int = 11, sigma: float = 5.0) -> np.ndarray:
    t = np.arange(k) - k // 2
    g = np.exp(-t * t / (2 * sigma * sigma))
    g /= g.sum()
    kern = np.outer(g, g)
    r = k // 2
    pad = np.pad(img, ((0, 0), (r, r), (r, r)), mode="edge")
    h, w = img.shape[1:]
    out = np.zeros_like(img)
    for a in range(k):
        for b in range(k):
            out += kern[a, b] * pad[:, a:a + h, b:b + w]
    return out


def ref_impute(img: np.ndarray, remove: np.ndarray) -> np.ndarray:
    """Rong et al. 2022's linear system, dense: each removed pixel = weighted mean of its
    in-image neighbours (edge 1/6, corner 1/12)."""
    c, h, w = img.shape
    unknown = [(i, j) for i in range(h) for j in range(w) if remove[i, j]]
    index = {p: n for n, p in enumerate(unknown)}
    A = np.zeros((len(unknown), len(unknown)))
    b = np.zeros((len(unknown), c))
    for n, (i, j) in enumerate(unknown):
        for di in (-1, 0, 1):
            for dj in (-1, 0, 1):
                if (di, dj) == (0, 0) or not (0 <= i + di < h and 0 <= j + dj < w):
                    continue
                wgt = 1 / 6 if di == 0 or dj == 0 else 1 / 12
                A[n, n] += wgt
                q = (i + di, j + dj)
                if q in index:
                    A[n, index[q]] -= wgt
                else:
                    b[n] += wgt * img[:, q[0], q[1]]
    sol = np.linalg.solve(A, b)
    out = img.copy()
    for n, (i, j) in enumerate(unknown):
        out[:, i, j] = sol[n]
    return out


def test_deletion_insertion_confidence_match_numpy() -> None:
    model = tiny()
    torch.manual_seed(0)
    x = torch.randn(2, 3, 12, 10)
    sal = torch.rand(12, 10)  # distinct values: one order, no ties
    steps, cls = 6, 3
    before = model_state(model)
    [res], passes = evaluate_maps(model, x, [MapJob(1, cls, sal)], metrics=["deletion", "insertion", "confidence"],
                                  steps=steps, batch=5)
    assert_unchanged(model, before)
    # The curves' inner points, their ends (the image, the all-zero input, the blurred image:
    # one each, shared by the curves and the confidence) and the masked input.
    n_inputs = 2 * (steps - 1) + 3 + 1
    assert passes == math.ceil(n_inputs / 5)
    img = x[1].numpy().astype(np.float64)
    order = np.argsort(-sal.numpy().ravel(), kind="stable")
    blurred = ref_blur(img)
    dele, ins = [], []
    for k in range(steps + 1):
        n = round(k * 120 / steps)
        d = img.reshape(3, -1).copy()
        d[:, order[:n]] = 0.0
        dele.append(d.reshape(img.shape))
        i = blurred.reshape(3, -1).copy()
        i[:, order[:n]] = img.reshape(3, -1)[:, order[:n]]
        ins.append(i.reshape(img.shape))
    d_curve, i_curve = probs(model, np.stack(dele), cls), probs(model, np.stack(ins), cls)
    np.testing.assert_allclose(res.curves["deletion"], d_curve, atol=1e-6)
    np.testing.assert_allclose(res.curves["insertion"], i_curve, atol=1e-5)
    assert res.scores["deletion"] == pytest.approx(np.trapezoid(d_curve, dx=1 / steps), abs=1e-6)
    assert res.scores["insertion"] == pytest.approx(np.trapezoid(i_curve, dx=1 / steps), abs=1e-5)
    # Chattopadhyay et al. 2018, Eq. 21-22: the input times the map.
    y = probs(model, img[None], cls)[0]
    o = probs(model, (img * sal.numpy())[None], cls)[0]
    assert res.confidence["original"] == pytest.approx(y, abs=1e-6)
    assert res.scores["drop"] == pytest.approx(max(0.0, y - o) / y * 100, abs=1e-4)
    assert res.scores["increase"] == (100.0 if o > y else 0.0)


def test_imputation_solves_the_linear_system() -> None:
    rng = np.random.default_rng(0)
    img = rng.normal(size=(3, 9, 7))
    remove = rng.random((2, 9, 7)) < 0.6
    remove[1, :5, :4] = True  # a block: neighbours that are themselves unknown
    got = fa.impute(torch.from_numpy(img), torch.from_numpy(remove), tol=1e-12, max_iter=500).numpy()
    for b in range(2):
        np.testing.assert_allclose(got[b], ref_impute(img, remove[b]), atol=1e-8)
    # Noise: N(0, noise^2) on the removed pixels only.
    big = torch.zeros(1, 64, 64, dtype=torch.bool)
    big[0, 8:56, 8:56] = True
    x = torch.randn(3, 64, 64, dtype=torch.float64)
    clean = fa.impute(x, big)
    noisy = fa.impute(x, big, noise=0.5, generator=torch.Generator().manual_seed(0))
    diff = (noisy - clean)[0]
    assert float(diff[:, ~big[0]].abs().max()) == 0.0
    assert float(diff[:, big[0]].std()) == pytest.approx(0.5, rel=0.05)


def test_road_matches_dense_imputation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fa, "ROAD_NOISE", 0.0)  # deterministic: compare the curves exactly
    model = tiny()
    torch.manual_seed(1)
    x = torch.randn(1, 3, 10, 10, dtype=torch.float64)
    model = model.double()
    sal = torch.rand(10, 10)
    [res], _ = evaluate_maps(model, x, [MapJob(0, 2, sal)], metrics=["road"], batch=7)
    img = x[0].numpy()
    order = np.argsort(-sal.numpy().ravel(), kind="stable")
    for name, flip in (("road_morf", False), ("road_lerf", True)):
        batch = []
        for f in fa.ROAD_FRACTIONS:
            n = round(f * 100)
            idx = order[::-1][:n] if flip else order[:n]
            remove = np.zeros(100, dtype=bool)
            remove[idx] = True
            batch.append(ref_impute(img, remove.reshape(10, 10)))
        with torch.no_grad():
            want = model(torch.from_numpy(np.stack(batch))).softmax(1)[:, 2].tolist()
        np.testing.assert_allclose(res.curves[name], want, atol=1e-4)
    mo, le = np.mean(res.curves["road_morf"]), np.mean(res.curves["road_lerf"])
    assert res.scores["road"] == pytest.approx((le - mo) / 2)
    assert res.scores["road_morf"] == pytest.approx(mo) and res.scores["road_lerf"] == pytest.approx(le)


def test_pointing_energy_and_ranks_by_hand() -> None:
    sal = torch.zeros(8, 8)
    sal[2, 5], sal[6, 1], sal[3, 4] = 1.0, 0.5, 0.25
    inside = fa.box_mask((8, 8), [(4, 1, 7, 4)])  # x 4..7, y 1..4: pixel centres 4.5..6.5, 1.5..3.5
    assert inside.sum() == 3 * 3 and bool(inside[2, 5]) and not bool(inside[2, 3])
    assert fa.pointing_hit(sal, inside) == 1.0
    assert fa.energy_fraction(sal, inside) == pytest.approx((1.0 + 0.25) / 1.75)
    assert fa.pointing_hit(torch.ones(8, 8), inside) == 0.0  # tied maxima: their centroid (4, 4)
    assert math.isnan(fa.energy_fraction(torch.zeros(8, 8), inside))
    rows = [{"deletion": 0.1, "insertion": 0.9}, {"deletion": 0.3, "insertion": 0.9}, {"deletion": 0.2}]
    # deletion ranks 1, 3, 2; insertion: the two 0.9 share places 1 and 2.
    assert fa.mean_ranks(rows) == [1.25, 2.25, 2.0]
    assert fa.auc([0.0, 1.0]) == 0.5 and fa.step_counts(10, 4) == [0, 2, 5, 8, 10]


def test_parse_metrics() -> None:
    assert fa.parse_metrics(None, boxes=False) == ["deletion", "insertion", "road", "confidence"]
    assert fa.parse_metrics(["all"], boxes=True) == list(fa.METRICS)
    assert fa.parse_metrics(["road,deletion"], boxes=False) == ["deletion", "road"]
    with pytest.raises(UsageError, match="--metric 'delition' is not a faithfulness metric; did you mean 'deletion'"):
        fa.parse_metrics(["delition"], boxes=False)
    with pytest.raises(UsageError, match="--metric pointing needs boxes"):
        fa.parse_metrics(["pointing"], boxes=False)


# ----------------------------------------------------------------------------- a trained model
def synthetic(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int, int, int]]]:
    """24x24 noise images holding one 6x6 striped square: horizontal stripes (class 0) or
    vertical (class 1). Blur and deletion both wipe the stripes, so only the box tells."""
    g = torch.Generator().manual_seed(seed)
    x = 0.3 * torch.randn(n, 3, 24, 24, generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    stripes = torch.tensor([1.5, -1.5] * 3)
    boxes = []
    for i in range(n):
        r, c = (int(v) for v in torch.randint(0, 18, (2,), generator=g))
        x[i, :, r:r + 6, c:c + 6] += stripes[:, None] if y[i] == 0 else stripes[None, :]
        boxes.append((c, r, c + 6, r + 6))
    return x, y, boxes


@pytest.fixture(scope="module")
def trained() -> Iterator[nn.Module]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny net: threads only add overhead on a shared machine
    try:
        torch.manual_seed(0)
        model = TinyCNN(in_ch=3, classes=2, width=8)
        opt = torch.optim.Adam(model.parameters(), lr=0.02)
        x, y, _ = synthetic(256, 0)
        for step in range(100):
            idx = torch.arange(step * 32, step * 32 + 32) % 256
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        xt, yt, _ = synthetic(64, 1)
        with torch.no_grad():
            assert (model(xt).argmax(1) == yt).float().mean() > 0.95
        yield model
    finally:
        torch.set_num_threads(threads)


def test_gradcam_beats_a_constant_map_on_a_trained_model(trained: nn.Module, tmp_path: Path) -> None:
    from inspect_model.api.cam import cam

    x, _, boxes = synthetic(6, 2)
    bfile = tmp_path / "boxes.csv"
    bfile.write_text("image,x0,y0,x1,y1\n" + "".join(f"input-{i},{b[0]},{b[1]},{b[2]},{b[3]}\n"
                                                     for i, b in enumerate(boxes)))
    calls: list[tuple[int, int]] = []
    r = cam(trained, x, methods=["gradcam"], evaluate=True, boxes=str(bfile), eval_steps=16, eval_batch=40,
            progress=lambda done, total: calls.append((done, total)))
    ev = r.to_dict()["evaluation"]
    [row] = ev["average"]
    s = row["scores"]
    assert s["insertion"] > s["deletion"] + 0.2, s
    assert s["pointing"] >= 5 / 6 and s["energy"] > 0.5, s
    # A constant map: every order is a tie, broken at random (a random-order baseline).
    jobs = [MapJob(i, int(m["target"]["class"]), torch.ones(24, 24), seed=i)
            for i, m in enumerate(e["maps"][0] for e in r.to_dict()["images"])]
    const, _ = evaluate_maps(trained, x, jobs, metrics=["deletion", "insertion"], steps=16)
    c_ins = np.mean([c.scores["insertion"] for c in const])
    c_del = np.mean([c.scores["deletion"] for c in const])
    assert s["insertion"] > c_ins + 0.1 and s["deletion"] < c_del - 0.1, (s, c_ins, c_del)
    # One forward pass per --eval-batch inputs, and the count reported.
    # Per map: 15 inner points of each curve, 18 ROAD inputs, the masked input; per batch: the
    # all-zero input and each image's blurred copy (the image's own score is the map's).
    n_inputs = 6 * (2 * 15 + 18 + 1) + 1 + 6
    assert ev["inputs"] == n_inputs and ev["passes"] == math.ceil(n_inputs / 40)
    evals = [c for c in calls if c[1] == n_inputs]  # the images' own progress has total 0 (a tensor)
    assert evals[-1] == (n_inputs, n_inputs) and len(evals) == ev["passes"]


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


def test_cli_json_schema_plots_and_api_equality(cli, models_py: Path, images: list[str], tmp_path: Path) -> None:
    import jsonschema

    from inspect_model.api.cam import cam
    from inspect_model.run.options import InputOptions, ModelOptions
    from inspect_model.output.jsonout import dumps

    boxes = tmp_path / "boxes.json"
    boxes.write_text(json.dumps({"img0.png": [[5, 5, 20, 25]], images[1]: [1, 2, 27, 30]}))
    args = ["-m", "gradcam,eigencam", "--evaluate", "--boxes", str(boxes), "--eval-steps", "4", "--eval-batch", "16"]
    out = tmp_path / "out"
    r = cli(["cam", f"{models_py}:TinyCNN", *images, "--weights", "none", "--crop", "16", *args, "-o", str(out),
             "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()), cls=jsonschema.Draft202012Validator)
    ev = doc["evaluation"]
    assert ev["metrics"] == list(fa.METRICS) and [row["rank"] for row in ev["average"]] == sorted(
        row["rank"] for row in ev["average"])
    assert ev["plots"] == ["evaluation_curves.png"] and (out / "evaluation_curves.png").is_file()
    assert (out / doc["images"][0]["files"]["evaluation_curves"]).is_file()
    assert "evaluate: deletion, insertion, road, confidence, pointing, energy" in r.stderr
    m = doc["images"][0]["maps"][0]["evaluation"]
    assert len(m["curves"]["deletion"]) == 5 and {"pointing", "energy", "road"} <= set(m["scores"])
    api = cam(None, model_options=ModelOptions(f"{models_py}:TinyCNN", weights="none"),
              inputs=InputOptions(images, crop=16), methods=["gradcam,eigencam"], evaluate=True, boxes=boxes,
              eval_steps=4, eval_batch=16, output_dir=tmp_path / "api")
    api_doc = json.loads(dumps(api.to_dict()))
    for d in (api_doc, doc):  # wall-clock speed differs between any two runs
        d.pop("throughput", None)
    assert api_doc == doc
    text = api.text()
    assert "faithfulness, target" in text and "average over 2 image(s)" in text and "Energy ^" in text


@pytest.mark.parametrize(("extra", "code", "message"), [
    (["--evaluate", "--metric", "insertoin"], 2, "--metric 'insertoin' is not a faithfulness metric; did you mean"),
    (["--metric", "road"], 2, "--metric needs --evaluate"),
    (["--evaluate", "--metric", "energy"], 2, "--metric energy needs boxes; give --boxes FILE"),
    (["--evaluate", "--eval-steps", "1"], 2, "--eval-steps must be 2 or more"),
    (["--evaluate", "--boxes", "BOXES:{\"dog.png\": [1, 1, 5, 5]}"], 4, "names image 'dog.png', which is not among"),
    (["--evaluate", "--boxes", "BOXES:image,x0,y0,x1,y1\nimg1.png,0,0,29,10\n"], 4,
     "box [0, 0, 29, 10] lies outside image"),
    (["--evaluate", "--boxes", "BOXES:img1.png,0,0,5\n"], 4, "line 1: expected image,x0,y0,x1,y1, got 4 fields"),
    (["--evaluate", "--boxes", "BOXES:img1.png,5,0,2,9\n"], 4, "is empty (needs x0 < x1 and y0 < y1)"),
])
def test_cli_bad_input_one_line_and_nothing_left(cli, models_py: Path, images: list[str], tmp_path: Path,
                                                 extra: list[str], code: int, message: str) -> None:
    args = []
    for a in extra:
        if a.startswith("BOXES:"):
            p = tmp_path / "boxes.txt"
            p.write_text(a[6:])
            a = str(p)
        args.append(a)
    out = tmp_path / "out"
    r = cli(["cam", f"{models_py}:TinyCNN", *images, "--weights", "none", "--crop", "16", *args, "-o", str(out)])
    assert r.exit_code == code, r.stderr
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not out.exists()


def test_boxes_files(tmp_path: Path) -> None:
    from inspect_model.loading.boxes import load_boxes, match_boxes

    p = tmp_path / "b.json"
    p.write_text(json.dumps([{"image": "a/cat.png", "box": [1, 2, 3, 4]}, {"image": "a/cat.png", "box": [0, 0, 1, 1]}]))
    assert load_boxes(p) == {"a/cat.png": [(1, 2, 3, 4), (0, 0, 1, 1)]}
    assert match_boxes({"cat.png": [(1, 2, 3, 4)]}, ["x/cat.png", "x/dog.png"], "b") == {"x/cat.png": [(1, 2, 3, 4)]}
    with pytest.raises(InputError, match="does not exist"):
        load_boxes(tmp_path / "nope.csv")


def test_eval_batch_rule_and_report() -> None:
    """--eval-batch when given; else 64 a pass, on a CPU at most 4 MiB of input (6 inputs
    of 3x224x224: passes of 64 ran 1.5-2.3x slower per input there); the report says which."""
    import torch

    from inspect_model.methods.faithfulness.passes import pass_rows

    assert pass_rows(torch.zeros(1, 3, 224, 224), 64) == 64
    assert pass_rows(torch.zeros(1, 3, 224, 224), None) == 6
    assert pass_rows(torch.zeros(1, 3, 32, 32), None) == 64
    assert pass_rows(torch.zeros(1, 3, 224, 224, device="meta"), None) == 64  # an accelerator's branch

    import inspect_model as im
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(4, 3)).eval()
    x = torch.rand(1, 3, 600, 600)  # 4.3 MB an input: one a pass
    res = im.cam(model, x, methods=["gradcam"], layers=["0"], evaluate=True, metrics=["deletion"], eval_steps=4)
    assert res.payload["evaluation"]["batch"] == 1
    res = im.cam(model, x, methods=["gradcam"], layers=["0"], evaluate=True, metrics=["deletion"], eval_steps=4,
                 eval_batch=3)
    assert res.payload["evaluation"]["batch"] == 3
