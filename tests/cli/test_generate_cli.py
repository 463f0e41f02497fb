"""``attributions --text PROMPT --generate N`` through the CLI and the API (issue 36, item 3):
the JSON report against its schema and against transformers' own ``generate`` and
log-probabilities on the saved folder, the files and report.html strips, the Python API's
matrices, option conflicts (one line, exit 2 or 9), and GPT-2, Llama, Qwen2 and T5 folders."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import pytest
import torch

import inspect_model as im
from conftest import run_cli
from fixtures.task_models import save_task_model
from fixtures.text_models import bpe_tokenizer
from inspect_model.run.options import InputOptions, ModelOptions
from inspect_model.schemas import load_schema

PROMPT = "the cat sat on"


def save_qwen2(folder: Path) -> Path:
    """A tiny Qwen2 (GQA, RoPE, biased q/k/v) with the BPE tokenizer of the Llama fixture."""
    import transformers

    torch.manual_seed(0)
    tok = bpe_tokenizer()
    cfg = transformers.Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
                                   bos_token_id=1, eos_token_id=2, pad_token_id=3)
    transformers.Qwen2ForCausalLM(cfg).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gen")
    out = {k: save_task_model(k, root / k) for k in ("gpt2", "llama", "t5", "bert")}
    out["qwen2"] = save_qwen2(root / "qwen2")
    return out


def _run_json(args: list[str]) -> dict:
    r = run_cli(args + ["--json", "-q"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.Draft202012Validator(load_schema("attributions")).validate(doc)
    return doc


@pytest.mark.slow  # two runs and transformers' generate: over 3 s
def test_report_files_and_html_match_transformers(folders, tmp_path):
    import transformers

    folder, out = folders["gpt2"], tmp_path / "o"
    doc = _run_json(["attributions", str(folder), "--text", PROMPT, "--generate", "4", "-m", "ig", "-m", "saliency",
                     "--steps", "8", "-o", str(out)])
    entry = doc["images"][0]
    gen = entry["generation"]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=4, do_sample=False)[0, ids.shape[1]:].tolist()
    assert [t["id"] for t in gen["tokens"]] == ref == entry["targets"]
    full = torch.cat([ids[0], torch.tensor(ref)])
    with torch.no_grad():
        logp = model(full[None]).logits[0].log_softmax(-1)
    for t, rec in enumerate(gen["tokens"]):  # row t's score: log p(y_t | prefix), from the model here
        assert rec["log_prob"] == pytest.approx(float(logp[ids.shape[1] - 1 + t, ref[t]]), abs=1e-5)
    p, n = ids.shape[1], len(ref)
    assert gen["first_columns"] == p and len(gen["columns"]) == p + n - 1
    assert [c["part"] for c in gen["columns"]] == ["prompt"] * p + ["generated"] * (n - 1)
    for t, row in enumerate(gen["matrices"]["integrated-gradients"]):
        assert all(v is not None for v in row[:p + t]) and all(v is None for v in row[p + t:])
    gaps = [m["completeness_gap"] for m in entry["maps"] if m["method"] == "integrated-gradients"]
    assert len(gaps) == n and all(abs(g) < 1e-3 for g in gaps)
    files = entry["files"]
    assert sorted(files) == ["generation.integrated-gradients", "generation.saliency"]
    assert all((out / f).is_file() for f in files.values())
    page = (out / "report.html").read_text()
    assert page.count('style="outline:2px solid #000') == 2 * n  # one strip per token and method, token outlined
    assert "Generated tokens" in page
    # the API: the same matrices, as tensors
    res = im.attributions(str(folder), inputs=InputOptions(text=[PROMPT]), model_options=ModelOptions(str(folder)),
                          methods=["integrated-gradients"], steps=8, generate=4)
    mat = res.matrices[0]["integrated-gradients"]
    assert mat.shape == (n, p + n - 1)
    want = torch.tensor([[math.nan if v is None else v for v in r] for r in gen["matrices"]["integrated-gradients"]],
                        dtype=torch.float64)
    assert torch.allclose(mat, want, equal_nan=True, atol=1e-9)
    assert res.generations[0].generated == ref
    saved = res.save(tmp_path / "saved")  # the API result writes the same files
    assert "images/0000-text-0/generation.integrated-gradients.png" in saved


def test_a_generation_longer_than_the_positions_is_refused_first(folders):
    r = run_cli(["attributions", str(folders["gpt2"]), "--text", PROMPT, "--generate", "62", "-q"])
    assert r.exit_code == 4  # an input error, before any token is generated
    assert r.stderr.strip() == ("error: the prompt (4 tokens) and 62 generated make a prefix of 65 tokens; "
                                "GPT2LMHeadModel takes at most 64 positions: generate fewer tokens")


def test_text_report_says_what_was_generated_and_explained(folders):
    r = run_cli(["attributions", str(folders["gpt2"]), "--text", PROMPT, "--continuation", " the mat", "-m", "ig",
                 "--steps", "4"])
    assert r.exit_code == 0, r.stderr
    assert r.stdout.startswith("Attributions over a generation: integrated-gradients")
    assert "text-0: 'the cat sat on' -> 'the mat' (continuation, 2 token(s))" in r.stdout
    assert "Top source" in r.stdout and "Gap" in r.stdout
    assert "log p(token | prefix) of each of the continuation ' the mat'" in r.stderr


def test_contrast_scores_the_log_probability_difference(folders):
    doc = _run_json(["attributions", str(folders["gpt2"]), "--text", PROMPT, "--generate", "3", "--contrast", " dog",
                     "-m", "saliency"])
    gen = doc["images"][0]["generation"]
    assert gen["contrast"]["token"] == "dog"
    for t in gen["tokens"]:
        assert t["score"] == pytest.approx(t["log_prob"] - t["contrast_log_prob"], abs=1e-6)
    assert "log p(' dog' | prefix)" in doc["options"]["task"]["objective"]


@pytest.mark.parametrize("kind", ["llama", pytest.param("qwen2", marks=pytest.mark.slow),
                                  pytest.param("t5", marks=pytest.mark.slow)])
def test_llama_qwen2_and_t5_folders(folders, kind):
    doc = _run_json(["attributions", str(folders[kind]), "--text", PROMPT, "--generate", "3", "-m", "ig", "-m",
                     "occlusion", "-m", "input-x-gradient", "--steps", "4"])
    gen = doc["images"][0]["generation"]
    n = len(gen["tokens"])
    assert 1 <= n <= 3 and len(doc["images"][0]["maps"]) == 3 * n
    parts = [c["part"] for c in gen["columns"]]
    if kind == "t5":  # encoder tokens, the decoder's start token, then the tokens generated before
        assert parts.count("start") == 1 and parts.index("start") == gen["first_columns"] - 1
        assert doc["embedding_layer"] == "encoder.embed_tokens, decoder.embed_tokens"
    else:
        assert "start" not in parts and doc["embedding_layer"] == "model.embed_tokens"


@pytest.mark.parametrize("args, code, text", [
    (["--generate", "2", "--continuation", "x"], 2, "give one"),
    (["--generate", "2", "-m", "smoothgrad"], 2, "--method smoothgrad is not one of them"),
    (["--generate", "2", "--evaluate"], 2, "does not combine with --evaluate"),
    (["--generate", "0"], 2, "--generate must be a whole number from 1"),
    (["--generate", "2", "--target-text", " mat"], 2, "does not combine with --target-text"),
    (["--generate", "2", "--target", "3"], 2, "does not combine with --target"),
])
def test_option_conflicts(folders, args, code, text):
    r = run_cli(["attributions", str(folders["gpt2"]), "--text", PROMPT, *args])
    assert r.exit_code == code and text in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_images_and_models_that_do_not_generate(folders):
    sample = Path(__file__).resolve().parents[2] / "sample_images"
    image = next(p for p in sorted(sample.iterdir()) if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    r = run_cli(["attributions", str(folders["gpt2"]), str(image), "--generate", "2"])
    assert r.exit_code == 2 and "--generate continues a text" in r.stderr and "Traceback" not in r.stderr
    r = run_cli(["attributions", str(folders["bert"]), "--text", PROMPT, "--generate", "2"])
    assert r.exit_code == 9 and "is a text_classification model" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_argument_errors_do_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, runpy\nsys.argv = ['inspect-model', 'attributions', 'm', '--text', 'x', '--generate', '2', "
            "'--continuation', 'y']\ntry:\n    runpy.run_module('inspect_model', run_name='__main__')\n"
            "except SystemExit as e:\n    print('CODE', e.code)\nprint('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.split() == ["CODE", "2", "False"], r.stdout + r.stderr


@pytest.mark.slow  # torchrun: two processes
def test_resume_and_torchrun_shard_the_texts(folders, tmp_path):
    import os
    import subprocess
    import sys

    from conftest import ROOT

    texts = ["the cat sat on", "a dog ran", "the movie was"]
    common = ["attributions", str(folders["gpt2"]), *[a for t in texts for a in ("--text", t)], "--generate", "2",
              "-m", "ig", "--steps", "4", "--batch-size", "1", "--json", "-q"]
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
    for x in (b, c):  # the same tokens; the same numbers within float rounding (one thread per rank under torchrun)
        for got, want in zip(x["images"], a["images"], strict=True):
            g, w = got["generation"], want["generation"]
            assert {k: v for k, v in g.items() if k != "matrices"} == {k: v for k, v in w.items() if k != "matrices"}
            for method, rows in w["matrices"].items():
                for row_g, row_w in zip(g["matrices"][method], rows, strict=True):
                    assert [v is None for v in row_g] == [v is None for v in row_w]
                    assert [v for v in row_g if v is not None] == pytest.approx(
                        [v for v in row_w if v is not None], rel=1e-5, abs=1e-7)
    assert sorted(a["files"]) == sorted(c["files"])


def test_texts_batched_with_padding_equal_each_text_alone(folders):
    """Two texts of different lengths in one batch (right-padded): each row is that text's own."""
    texts = ["the cat sat on the", "a dog"]
    both = _run_json(["attributions", str(folders["gpt2"]), *[a for t in texts for a in ("--text", t)],
                      "--generate", "3", "-m", "saliency", "-m", "occlusion", "--batch-size", "2"])
    for i, text in enumerate(texts):
        alone = _run_json(["attributions", str(folders["gpt2"]), "--text", text, "--generate", "3", "-m", "saliency",
                           "-m", "occlusion"])
        a, b = both["images"][i]["generation"], alone["images"][0]["generation"]
        assert a["tokens"] == b["tokens"] and a["columns"] == b["columns"]
        for m in ("saliency", "occlusion"):
            for ra, rb in zip(a["matrices"][m], b["matrices"][m]):
                assert [x is None for x in ra] == [x is None for x in rb]
                assert all(abs(x - y) < 1e-5 for x, y in zip(ra, rb) if x is not None)
