"""``--text``, ``--text-file`` and ``--tokenizer`` on the command line and in the API (issue 26):
attention's token maps and report.html strips, activations' and grads' statistics per token
position (against the model's own hidden states), and every bad input's one-line error."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch

from conftest import run_cli
from cli.test_attention_cli import _close
from fixtures.text_models import save_text_model

transformers = pytest.importorskip("transformers")

TEXTS = ["the movie was very good", "the plot was dull"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("text")
    out = {k: save_text_model(k, root / k, trained=k == "bert") for k in ("bert", "gpt2")}
    out["bare"] = save_text_model("gpt2", root / "bare", with_tokenizer=False)
    return out


def _json(args: list[str]) -> dict:
    r = run_cli(args + ["--json", "-q"])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def _validate(doc: dict) -> None:
    from inspect_model.schemas import load_schema

    jsonschema.Draft202012Validator(load_schema(doc["command"])).validate(doc)


def test_attention_text_files_json_and_html(folders, tmp_path):
    out = tmp_path / "o"
    args = ["attention", str(folders["bert"]), "--weights", "default", "--text", TEXTS[0], "--text", TEXTS[1],
            "-m", "all", "--heads", "all", "--mosaic", "-o", str(out)]
    r = run_cli(args)
    assert r.exit_code == 0, r.stderr
    doc = json.loads((out / "report.json").read_text())
    _validate(doc)
    assert doc["text"] is True and doc["causal"] is False and doc["prefix_tokens"] == 0
    first = doc["images"][0]
    assert first["text"]["tokens"] == ["[CLS]", "the", "movie", "was", "very", "good", "[SEP]"]
    assert first["text"]["query"] == 0 and first["target"]["label"] == "positive"
    by = {m["method"]: m for m in first["maps"]}
    assert set(by) == {"raw", "rollout", "grad-rollout", "legrad"}
    assert len(by["rollout"]["values"]) == 7 and len(by["raw"]["values"]) == 4  # 4 heads x 7 tokens
    assert abs(sum(by["rollout"]["values"]) - 1) < 1e-5  # a row of the row-stochastic product
    assert len(doc["images"][1]["text"]["tokens"]) == 6  # padding left out
    folder = out / "images" / "0000-text-0"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["grad-rollout.c1-positive.png", "mosaic.png", "raw.bert.encoder.layer.1.attention.self.png",
                     "rollout.c1-positive.png", "strips.png"]
    page = (out / "report.html").read_text()
    assert page.count('<div class="strip">') == 2 and "background:rgb(" in page and ">movie</span>" in page
    txt = (out / "report.txt").read_text()
    assert "text of up to 7 tokens" in txt and "peak at token" in txt


def test_attention_decoder_query_is_the_last_token_and_target_a_token(folders):
    doc = _json(["attention", str(folders["gpt2"]), "--weights", "default", "--text", "the cat sat on the mat",
                 "--text", "a dog ran", "-m", "raw,grad-rollout", "--target", "park"])
    _validate(doc)
    assert doc["causal"] is True
    assert [i["text"]["query"] for i in doc["images"]] == [5, 2]
    assert {i["target"]["label"] for i in doc["images"]} == {"park"}  # a token of the vocabulary
    raw = next(m for m in doc["images"][1]["maps"] if m["method"] == "raw")
    assert len(raw["values"][0]) == 3 and raw["query"] == "token 2"


def test_tokenizer_option_and_text_file(folders, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat\n\na dog ran to the park\n")
    doc = _json(["attention", str(folders["bare"]), "--weights", "default", "--tokenizer", str(folders["gpt2"]),
                 "--text-file", str(texts), "--query", "0"])
    assert [i["text"]["text"] for i in doc["images"]] == ["the cat sat", "a dog ran to the park"]
    assert doc["options"]["inputs"]["text"]["tokenizer"] == str(folders["gpt2"])
    assert [i["text"]["query"] for i in doc["images"]] == [0, 0]


@pytest.mark.parametrize("args, code, message", [
    (["--text", "hi"], 4, "--text needs a tokenizer, and {bare} has none in its folder; give --tokenizer DIR"),
    (["--text", "hi", "--tokenizer", "{nowhere}"], 4, "--tokenizer '{nowhere}' is not a folder"),
    (["--tokenizer", "{gpt2}"], 2, "--tokenizer needs --text or --text-file"),
    (["--text-file", "{nowhere}"], 4, "text file '{nowhere}' does not exist"),
    (["--text-file", "{blank}"], 4, "text file '{blank}' holds no text (one text per line)"),
    (["--text", "hi", "--tokenizer", "{empty}"], 4, "--tokenizer '{empty}' holds no tokenizer"),
    (["--text", " "], 4, "--text is empty"),
    (["--text", "hi", "--tokenizer", "{gpt2}", "--input-size", "8"], 2,
     "--text feeds the model its token ids; drop --input-size"),
    (["--text", "hi", "--tokenizer", "{gpt2}", "--evaluate"], 2, "--evaluate scores maps over images"),
    (["--text", "hi", "--tokenizer", "{gpt2}", "--query", "mean"], 2, "--query mean is for images"),
])
def test_bad_text_inputs_one_line(folders, tmp_path, args, code, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "blank.txt").write_text("\n  \n")
    fill = {"bare": str(folders["bare"]), "gpt2": str(folders["gpt2"]), "nowhere": str(tmp_path / "nowhere"),
            "empty": str(tmp_path / "empty"), "blank": str(tmp_path / "blank.txt")}
    args = [a.format(**fill) for a in args]
    r = run_cli(["attention", str(folders["bare"]), "--weights", "default", "-q", *args])
    assert r.exit_code == code, r.stderr
    assert r.stderr.startswith("error: " + message.format(**fill)), r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_text_for_a_vision_model_is_refused(folders):
    r = run_cli(["activations", "resnet18", "--weights", "none", "--text", "hi", "-q"])
    assert r.exit_code == 4 and r.stderr == ("error: --text needs a tokenizer, and resnet18 has none in its folder; "
                                             "give --tokenizer DIR (a folder written by tokenizer.save_pretrained)\n")


def test_text_options_only_where_they_apply(folders):
    r = run_cli(["models", "--text", "hi"])
    assert r.exit_code == 2 and "--text" in r.stderr
    r = run_cli(["summary", "resnet18", "--text", "hi"])  # summary takes texts (issue 42), an image model not
    assert r.exit_code == 4 and r.stderr.startswith("error: --text needs a tokenizer, and resnet18 has none")
    import inspect_model as im
    from inspect_model.run.options import InputOptions
    from inspect_model.errors import UnsupportedModelError

    # issue 42: cam takes --text, and on a token model refuses in one line naming a command that works
    with pytest.raises(UnsupportedModelError, match="^cam maps a spatial layer; .* use attributions --text"):
        im.cam(str(folders["gpt2"]), inputs=InputOptions(text=["hi"]))


def _positions(tok, model, texts, layer_of):
    """Per-position mean and mean token norm of each block's output, from the model's own
    hidden states over the real tokens (independent of the hooks)."""
    enc = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hs = model(**enc, output_hidden_states=True).hidden_states
    mask = enc["attention_mask"].bool()
    want = {}
    for i, name in enumerate(layer_of):
        h = hs[i + 1].double()
        want[name] = ([float(h[:, p][mask[:, p]].mean()) for p in range(h.shape[1])],
                      [float(h[:, p][mask[:, p]].norm(dim=-1).mean()) for p in range(h.shape[1])])
    return want


def test_activations_per_position_statistics(folders):
    doc = _json(["activations", str(folders["bert"]), "--weights", "default", "--text", TEXTS[0], "--text", TEXTS[1]])
    _validate(doc)
    rows = {r["name"]: r for r in doc["positions"]["layers"]}
    assert list(rows) == ["bert.encoder.layer.0", "bert.encoder.layer.1"]
    assert rows["bert.encoder.layer.0"]["tokens"] == [2, 2, 2, 2, 2, 2, 1]  # position 6: only the longer text
    assert doc["images"][1]["text"]["tokens"][-1] == "[SEP]"
    tok = transformers.AutoTokenizer.from_pretrained(folders["bert"])
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folders["bert"]).eval()
    # BERT's last hidden state is the last block's output; hidden_states[l + 1] is block l's.
    for name, (mean, norm) in _positions(tok, model, TEXTS, list(rows)).items():
        assert rows[name]["mean"] == pytest.approx(mean, abs=1e-6)
        assert rows[name]["norm"] == pytest.approx(norm, rel=1e-5)


def test_grads_per_position_gradient_of_the_next_token(folders):
    doc = _json(["grads", str(folders["gpt2"]), "--weights", "default", "--text", "the cat sat", "--text", "a dog",
                 "--layers", "transformer.h.0"])
    _validate(doc)
    tokens = [e["text"]["tokens"] for e in doc["images"]]  # every entry names its text's tokens
    assert [e["text"]["text"] for e in doc["images"]] == ["the cat sat", "a dog"] and len(tokens[0]) == 3, tokens
    rows = {(r["name"], r["kind"]): r for r in doc["positions"]["layers"]}
    grad = rows[("transformer.h.0", "gradient")]
    assert grad["tokens"] == [2, 2, 1]
    # By hand: d(next-token logit of each text's last token, the predicted one)/d(block 1's output).
    tok = transformers.AutoTokenizer.from_pretrained(folders["gpt2"])
    tok.pad_token = tok.eos_token
    model = transformers.AutoModelForCausalLM.from_pretrained(folders["gpt2"]).eval()
    enc = tok(["the cat sat", "a dog"], padding=True, return_tensors="pt")
    kept = {}
    handle = model.transformer.h[0].register_forward_hook(lambda _m, _a, out: kept.setdefault("h", out[0] if
                                                                                            isinstance(out, tuple)
                                                                                            else out))
    logits = model(**enc).logits
    handle.remove()
    last = enc["attention_mask"].sum(1) - 1
    picked = logits[torch.arange(2), last]
    score = picked.gather(1, picked.argmax(1, keepdim=True)).sum()
    g = torch.autograd.grad(score, kept["h"])[0].double()
    mask = enc["attention_mask"].bool()
    norms = [float(g[:, p][mask[:, p]].norm(dim=-1).mean()) for p in range(g.shape[1])]
    assert grad["norm"] == pytest.approx(norms, rel=1e-4, abs=1e-9)
    assert min(norms) > 0  # block 0's output reaches the last token's logit through block 1's attention


def test_api_attention_text(folders):
    import inspect_model as im
    from inspect_model.run.options import InputOptions

    res = im.attention(str(folders["gpt2"]), methods=["rollout", "legrad"], inputs=InputOptions(text=["the cat sat",
                                                                                                    "a dog"]),
                       model_options=im.ModelOptions(str(folders["gpt2"]), weights="default"))
    texts = res.record.texts
    assert [t["values"]["rollout"].shape[0] for t in texts] == [3, 2]
    assert texts[0]["matrices"]["rollout"].shape == (3, 3) and texts[0]["query"] == 2
    doc = res.to_dict()
    assert doc["images"][1]["text"]["tokens"] == ["a", "dog"]


def _cache_repo(home: Path, repo: str, src: Path) -> None:
    import shutil

    sha = "1" * 40
    root = home / "hub" / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(sha)
    shutil.copytree(src, root / "snapshots" / sha)


def test_hub_id_tokenizer_from_the_cache_offline(folders, tmp_path, monkeypatch):
    home = tmp_path / "hfhome"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _cache_repo(home, "acme/tiny-gpt2", folders["gpt2"])
    _cache_repo(home, "acme/bare", folders["bare"])
    doc = _json(["attention", "hf:acme/tiny-gpt2", "--weights", "default", "--text", "the cat sat", "-m", "raw"])
    assert doc["images"][0]["text"]["tokens"] == ["the", "cat", "sat"]
    r = run_cli(["attention", "hf:acme/bare", "--weights", "default", "--text", "hi", "-q"])
    assert r.exit_code == 4 and r.stderr == (
        "error: --text needs a tokenizer, and hf:acme/bare has none in its folder (HF_HUB_OFFLINE is set: only the "
        "cache was read); give --tokenizer DIR (a folder written by tokenizer.save_pretrained)\n")


def test_a_tokenizer_never_runs_the_folders_code(folders, tmp_path, monkeypatch):
    """A tokenizer_config.json naming its own class (auto_map): its code is never run."""
    import shutil

    evil = tmp_path / "evil"
    shutil.copytree(folders["gpt2"], evil)
    cfg = json.loads((evil / "tokenizer_config.json").read_text())
    cfg.update(tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]})
    (evil / "tokenizer_config.json").write_text(json.dumps(cfg))
    marker = tmp_path / "ran"
    (evil / "tokenization_evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "from transformers import PreTrainedTokenizerFast\nclass EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    r = run_cli(["attention", str(folders["gpt2"]), "--weights", "default", "--tokenizer", str(evil), "--text", "hi",
                 "-q"], stdin="y\n")
    assert not marker.exists()  # transformers reads the files (tokenizer.json) or refuses; never the code
    assert r.exit_code in (0, 4), r.stderr
    if r.exit_code == 4:
        assert r.stderr.startswith(f"error: cannot read the tokenizer in '{evil}': ") and r.stderr.count("\n") == 1


def test_a_failing_forward_gives_the_model_back():
    from fixtures.text_models import build_model
    from inspect_model.methods.attention.maps import AttentionOptions
    from inspect_model.methods.attention.text import compute_text_attention

    model = build_model("gpt2")
    flags = [p.requires_grad for p in model.parameters()]

    def boom(ids):
        model(input_ids=ids)
        raise RuntimeError("boom")

    with pytest.raises(Exception, match="boom"):
        compute_text_attention(model, torch.tensor([[3, 4, 5]]), options=AttentionOptions(methods=("grad-rollout",)),
                               forward=boom)
    assert [p.requires_grad for p in model.parameters()] == flags and not model.training
    assert not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in model.modules())


def _chromium() -> str | None:
    import shutil

    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="no chromium executable (apt-get install -y chromium)")
def test_token_strips_in_a_real_browser(folders, tmp_path):
    """report.html's strips: every token a coloured box, the query outlined; a screenshot
    (INSPECT_MODEL_SCREENSHOT_DIR keeps it)."""
    import os

    sync_api = pytest.importorskip("playwright.sync_api")
    out = tmp_path / "o"
    r = run_cli(["attention", str(folders["bert"]), "--weights", "default", "--text", TEXTS[0], "--text", TEXTS[1],
                 "-m", "rollout,grad-rollout", "-o", str(out), "-q"])
    assert r.exit_code == 0, r.stderr
    shots = Path(os.environ.get("INSPECT_MODEL_SCREENSHOT_DIR", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto((out / "report.html").as_uri())
            page.wait_for_load_state("load")
            boxes = page.evaluate("Array.from(document.querySelectorAll('div.strip span')).map(s => "
                                  "[s.textContent, getComputedStyle(s).backgroundColor, s.getBoundingClientRect().width,"
                                  " getComputedStyle(s).outlineStyle])")
            page.screenshot(path=str(shots / "report_html_attention_text.png"), full_page=True)
        finally:
            browser.close()
    assert len(boxes) == 2 * (7 + 6)  # two methods per text, every real token
    assert all(w > 5 and bg.startswith("rgb(") for _, bg, w, _ in boxes)
    assert [t for t, *_ in boxes[:7]] == ["[CLS]", "the", "movie", "was", "very", "good", "[SEP]"]
    assert boxes[0][3] == "solid" and boxes[1][3] == "none"  # the query token, [CLS], outlined


def test_activations_grids_and_raw_arrays_hold_the_real_tokens(folders, tmp_path):
    import numpy as np

    out = tmp_path / "o"
    r = run_cli(["activations", str(folders["bert"]), "--weights", "default", "--text", TEXTS[0], "--text", TEXTS[1],
                 "--layers", "bert.encoder.layer.1", "--save-raw", "-o", str(out), "-q"])
    assert r.exit_code == 0, r.stderr
    shapes = [np.load(out / "images" / d / "bert.encoder.layer.1.npy").shape for d in ("0000-text-0", "0001-text-1")]
    assert shapes == [(7, 32), (6, 32)]  # the second text's padding left out
    assert (out / "images" / "0001-text-1" / "bert.encoder.layer.1.png").is_file()
    assert "mean token norm per position" in (out / "report.txt").read_text()


THREE = ["the cat sat on the mat", "a dog ran", "the movie was very good"]


@pytest.mark.slow  # over 3 s: kept out of the quick tier
@pytest.mark.parametrize("command", ["attention", "activations"])
def test_resume_and_torchrun_shard_the_texts(folders, tmp_path, command):
    """Texts are sharded and resumed like image paths: --resume and two torchrun ranks give the
    one-process report (attention's maps, activations' per-position sums)."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    common = [command, str(folders["gpt2"]), "--weights", "default", *[a for t in THREE for a in ("--text", t)],
              "--batch-size", "1", "--json", "-q"] + (["-m", "all"] if command == "attention" else [])
    one = run_cli([*common, "-o", str(tmp_path / "one")])
    resumed = run_cli([*common, "-o", str(tmp_path / "resumed"), "--resume"])
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                          "-m", "inspect_model", *common, "-o", str(tmp_path / "two")],
                         capture_output=True, text=True, env=env, timeout=300, check=False)
    assert one.exit_code == 0 and resumed.exit_code == 0 and two.returncode == 0, two.stderr[-2000:]
    a, b, c = json.loads(one.stdout), json.loads(resumed.stdout), json.loads(two.stdout)
    assert [i["image"] for i in c["images"]] == ["text-0", "text-1", "text-2"]
    key = "images" if command == "attention" else "positions"
    assert _close(a[key], b[key]) and _close(a[key], c[key])
    assert sorted(a["files"]) == sorted(c["files"])
