"""``attention`` on head-less models and on token ids (issue 42): a model without a head
(BertModel, CLIPVisionModel) runs raw attention and rollout and skips the methods that explain
a score, with a note, instead of failing the run (exit 6); a refusal is a usage error (2).
Token ids given with ``--input-size input_ids=...`` are read as texts: the gradient starts at
the embeddings, and a causal LM's target is the next token (checked against the model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import run_cli
from fixtures.text_models import bert_tokenizer, save_text_model

transformers = pytest.importorskip("transformers")

ALL = "raw,rollout,grad-rollout,legrad"
IDS = "input_ids=8:int64:4-30"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("headless")
    torch.manual_seed(0)
    bert = transformers.BertModel(transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        max_position_embeddings=64)).eval()
    bert.save_pretrained(root / "bertmodel")
    bert_tokenizer(root / "bertmodel")
    bert_tokenizer(root / "bertmodel").save_pretrained(root / "bertmodel")
    vision = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, image_size=32,
        patch_size=8)).eval()
    vision.save_pretrained(root / "clipvision")
    out = {"bertmodel": root / "bertmodel", "clipvision": root / "clipvision"}
    out.update({k: save_text_model(k, root / k) for k in ("gpt2", "bert")})
    return out


def _run(args: list[str]) -> tuple[dict, str]:
    r = run_cli(args + ["--json"])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout), r.stderr


def _inputs(kind: str) -> list[str]:
    return ["--text", "the cat sat on the mat"] if kind == "bertmodel" else ["--input-size", "3x32x32"]


@pytest.mark.parametrize("kind", ["bertmodel", "clipvision"])
def test_headless_runs_raw_and_rollout_and_skips_the_rest(folders, kind):
    doc, err = _run(["attention", str(folders[kind]), "--weights", "default", "-m", ALL, *_inputs(kind)])
    name = {"bertmodel": "BertModel", "clipvision": "CLIPVisionModel"}[kind]
    assert doc["methods"] == ["raw", "rollout"]
    assert list(doc["skipped_methods"]) == ["grad-rollout", "legrad"]
    assert f"note: grad-rollout, legrad skipped: {name} has no head: grad-rollout explains a score, and none is " \
           "named (give --target norm or --target cosine:REF); legrad scores each block's tokens through the " \
           f"model's head, and {name} has none\n" in err
    plain, _ = _run(["attention", str(folders[kind]), "--weights", "default", "-m", "raw,rollout", *_inputs(kind)])
    assert doc["images"] == plain["images"]  # raw and rollout as they are alone
    methods = [m["method"] for m in doc["images"][0]["maps"]]
    assert sorted(methods) == ["raw", "rollout"]
    from inspect_model.schemas import load_schema
    import jsonschema

    jsonschema.Draft202012Validator(load_schema("attention")).validate(doc)


@pytest.mark.parametrize("kind", ["bertmodel", "clipvision"])
def test_only_score_methods_on_a_headless_model_is_a_usage_error(folders, kind):
    r = run_cli(["attention", str(folders[kind]), "--weights", "default", "-m", "legrad", *_inputs(kind), "-q"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: legrad skipped: legrad scores each block's tokens through the model's head")
    assert r.stderr.endswith("raw attention and rollout need no score: -m raw,rollout\n")


def test_a_named_target_without_scores_is_a_usage_error_not_a_failure(folders):
    """Until a head-less objective reaches attention, a target on such a model is refused (2, not 6)."""
    r = run_cli(["attention", str(folders["bertmodel"]), "--weights", "default", "-m", "grad-rollout", "--target", "3",
                 "--text", "the cat sat", "-q"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr == ("error: BertModel returned no class or token scores for grad-rollout to explain; raw attention "
                        "and rollout need none: -m raw,rollout\n")


@pytest.mark.parametrize("kind", ["gpt2", "bert", "bertmodel"])
def test_token_ids_from_input_size_are_read_as_texts(folders, kind):
    """Every token-id model: no 'only Tensors of floating point dtype can require gradients',
    no flattened (position x vocabulary) index as the target."""
    r = run_cli(["attention", str(folders[kind]), "--weights", "default", "--input-size", IDS, "-m", ALL,
                 "--batch-size", "2", "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    want = ["raw", "rollout"] if kind == "bertmodel" else ["raw", "rollout", "grad-rollout", "legrad"]
    assert doc["methods"] == want and doc["text"] is True
    for entry in doc["images"]:
        ids = [int(t) for t in entry["text"]["tokens"]]
        assert len(ids) == 8 and all(4 <= i < 30 for i in ids)
        if kind == "bertmodel":
            assert entry["target"] is None
            continue
        folder = folders[kind]
        model = (transformers.AutoModelForCausalLM if kind == "gpt2" else
                 transformers.AutoModelForSequenceClassification).from_pretrained(folder).eval()
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits
        scores = logits[0, -1] if kind == "gpt2" else logits[0]  # the next token after the last id; the class
        assert entry["target"]["class"] == int(scores.argmax())
        assert entry["target"]["probability"] == pytest.approx(float(scores.softmax(-1).max()), rel=1e-4)
        assert {m["method"] for m in entry["maps"]} == set(want)


def test_token_id_maps_are_drawn_as_token_strips(folders, tmp_path):
    out = tmp_path / "o"
    r = run_cli(["attention", str(folders["gpt2"]), "--weights", "default", "--input-size", IDS, "-m", ALL,
                 "-o", str(out), "-q"])
    assert r.exit_code == 0, r.stderr
    files = sorted(p.name for p in (out / "images").iterdir() for p in p.iterdir())
    assert "strips.png" in files and any(f.startswith("rollout.") for f in files)


def test_a_named_objective_runs_grad_rollout_on_a_headless_model(folders):
    """``--target norm``: grad-rollout of ||pooler_output||, against Chefer et al.'s formula on
    the model's own attentions and autograd (R = prod (I + mean_h [dS/dA * A]^+), the [CLS] row);
    LeGrad still skipped (it needs a head)."""
    text = "the cat sat on the mat"
    doc, err = _run(["attention", str(folders["bertmodel"]), "--weights", "default", "-m", "raw,grad-rollout,legrad",
                     "--target", "norm", "--text", text])
    assert doc["methods"] == ["raw", "grad-rollout"] and list(doc["skipped_methods"]) == ["legrad"]
    got = next(m["values"] for m in doc["images"][0]["maps"] if m["method"] == "grad-rollout")
    tok = transformers.AutoTokenizer.from_pretrained(folders["bertmodel"])
    model = transformers.BertModel.from_pretrained(folders["bertmodel"], attn_implementation="eager").eval()
    enc = tok([text], return_tensors="pt")
    out = model(**enc, output_attentions=True)
    grads = torch.autograd.grad(out.pooler_output.norm(dim=1).sum(), out.attentions)
    n = enc["input_ids"].shape[1]
    r = torch.eye(n)
    for a, g in zip(out.attentions, grads, strict=True):
        r = r + (g * a).clamp(min=0).mean(dim=1)[0] @ r
    assert got == pytest.approx(r[0].tolist(), rel=1e-4, abs=1e-9)
