"""``patch`` through the CLI and the API (issue 36): reports, files, JSON schema, errors
(one line, distinct exit codes), pairs files, --resume and torchrun, the model given back."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from conftest import run_cli

CLEAN, CORRUPT = "the cat sat on the mat", "the mat sat on the cat"


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from fixtures.task_models import save_task_model

    root = tmp_path_factory.mktemp("patch_models")
    return {k: save_task_model(k, root / k) for k in ("gpt2", "llama", "t5")}


def _json(r) -> dict:
    assert r.exit_code == 0, r.stderr
    from inspect_model.schemas import load_schema

    doc = json.loads(r.stdout)
    jsonschema.Draft202012Validator(load_schema("patch")).validate(doc)
    return doc


@pytest.mark.parametrize("kind", ["gpt2", pytest.param("llama", marks=pytest.mark.slow),
                                  pytest.param("t5", marks=pytest.mark.slow)])
def test_report_json_files_and_schema(folders, tmp_path, kind) -> None:
    out = tmp_path / "o"
    r = run_cli(["patch", str(folders[kind]), "--clean", CLEAN, "--corrupt", CORRUPT, "--metric", "logit-diff: mat,cat",
                 "--batch-size", "5", "-o", str(out), "--json", "-q"])
    doc = _json(r)
    pair = doc["pairs"][0]
    assert doc["mode"] == "denoise" and doc["count"] == 1
    assert [s["site"] for s in pair["sites"]] == ["resid", "attn", "mlp", "head"]
    n = len(pair["clean_tokens"])
    resid = pair["sites"][0]
    assert len(resid["raw"]) == 2 and len(resid["raw"][0]) == n and len(pair["sites"][3]["raw"][0]) == 4
    assert pair["cells"] == 3 * 2 * n + 2 * 4 and pair["forwards"] == sum(-(-2 * w // 5) for w in (n, n, n, 4))
    span = pair["clean_value"] - pair["corrupt_value"]
    for s in pair["sites"]:
        for raw_row, norm_row in zip(s["raw"], s["normalised"]):
            for v, nv in zip(raw_row, norm_row):
                assert abs((v - pair["corrupt_value"]) / span - nv) < 1e-9
    # the last layer's residual at the last position is all the logits read: the clean value
    assert abs(resid["normalised"][-1][-1] - 1.0) < 1e-5
    for site, f in pair["files"].items():
        assert (out / f).is_file() and f == f"images/0000-pair-0/patch_{site}.png"
    assert sorted(doc["files"]) == sorted([*pair["files"].values(), "report.txt", "report.json", "report.html"]) or \
        set(pair["files"].values()) <= set(doc["files"])
    assert "resid (blocks.{L}.hook_resid_post)" in (out / "report.txt").read_text()
    assert "Patching" in (out / "report.html").read_text()


def test_causal_tracing_cli(folders) -> None:
    r = run_cli(["patch", str(folders["gpt2"]), "--clean", CLEAN, "--noise-subject", "cat", "--noise-std", "3s",
                 "--samples", "3", "--window", "3", "--json", "-q"])
    doc = _json(r)
    pair = doc["pairs"][0]
    assert doc["mode"] == "trace" and pair["corrupt"] is None
    assert pair["subject"]["first"] == 1 and pair["subject"]["end"] == 2 and pair["subject"]["samples"] == 3
    assert [s["site"] for s in pair["sites"]] == ["resid", "mlp", "attn"]
    assert [s["window"] for s in pair["sites"]] == [1, 3, 3]
    assert pair["metric"]["kind"] == "prob" and len(pair["metric"]["token_ids"]) == 1
    # positions before the subject see no noise: restoring them changes nothing
    assert all(abs(row[0]) < 1e-6 for row in pair["sites"][0]["normalised"])


@pytest.mark.slow  # five runs of three pairs: over 3 s
def test_pairs_file_and_resume_and_api_equality(folders, tmp_path, monkeypatch) -> None:
    import inspect_model as im
    import importlib

    api_patch = importlib.import_module("inspect_model.api.patch")

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps(p) for p in [
        {"clean": CLEAN, "corrupt": CORRUPT},
        {"clean": "the movie was very good", "corrupt": "the film was very good", "metric": "kl"},
        {"clean": "a dog ran to the park", "corrupt": "a cat ran to the park", "metric": "logprob: park"}]) + "\n")
    common = ["patch", str(folders["gpt2"]), "--pairs", str(pairs), "--sites", "resid,head", "--json", "-q"]
    whole = _json(run_cli([*common, "-o", str(tmp_path / "one")]))
    assert [p["metric"]["kind"] for p in whole["pairs"]] == ["prob", "kl", "logprob"]
    assert whole["pairs"][1]["clean_value"] == 0.0  # kl: the clean run against itself

    calls = {"n": 0}
    real = api_patch.PatchSession.feed

    def failing(self, batch):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(self, batch)

    monkeypatch.setattr(api_patch.PatchSession, "feed", failing)
    first = run_cli([*common, "-o", str(tmp_path / "res"), "--resume"])
    assert first.exit_code != 0
    monkeypatch.setattr(api_patch.PatchSession, "feed", real)
    seen = []
    monkeypatch.setattr(api_patch.PatchSession, "feed", lambda self, b: seen.append(b.names) or real(self, b))
    resumed = _json(run_cli([*common, "-o", str(tmp_path / "res"), "--resume"]))
    assert seen == [["pair-1"], ["pair-2"]]  # pair-0 was done before the interruption
    assert _grids(resumed) == _grids(whole)

    res = im.patch(str(folders["gpt2"]), pairs=str(pairs), sites="resid,head")
    assert _grids(res.to_dict()) == _grids(whole)
    assert res.record.pairs[2].metric.kind == "logprob"


def _grids(doc: dict) -> list:
    return [[s["raw"] for s in p["sites"]] for p in doc["pairs"]]


@pytest.mark.parametrize("args, code, text", [
    (["--clean", "the cat sat", "--corrupt", "the cat sat on"], 2,
     "error: --clean is 3 tokens and --corrupt 4; patching needs prompts of the same length (clean: "
     "'the'|'cat'|'sat', corrupt: 'the'|'cat'|'sat'|'on')"),
    (["--clean", CLEAN, "--corrupt", CORRUPT, "--metric", "prob: cat sat"], 2,
     "error: --metric prob: token ' cat sat' is 2 tokens; it must be one token of the vocabulary"),
    (["--clean", CLEAN, "--corrupt", CORRUPT, "--metric", "accuracy"], 2,
     "error: --metric 'accuracy' is not one of logit-diff:A,B, prob[:TOKEN], logprob[:TOKEN], kl"),
    (["--clean", CLEAN, "--corrupt", CORRUPT, "--sites", "resid,heads"], 2,
     "error: --sites 'heads' is not one of resid, attn, mlp, head"),
    (["--clean", CLEAN], 2, "error: --corrupt PROMPT is missing; or trace with --noise-subject TEXT"),
    (["--clean", CLEAN, "--noise-subject", "cat", "--noise"], 2,
     "error: --noise-subject restores clean states into the noised run; --noise does not apply"),
    (["--clean", CLEAN, "--noise-subject", "horse"], 2,
     "error: --noise-subject 'horse' is not in the prompt 'the cat sat on the mat'"),
    (["--clean", CLEAN, "--noise-subject", "cat", "--noise-std", "lots"], 2,
     "error: --noise-std 'lots' is not a number or a multiple of σ (3σ, 3s, 3sigma)"),
    (["--clean", CLEAN, "--corrupt", CORRUPT, "--window", "3"], 2,
     "error: --window applies to causal tracing (--noise-subject TEXT)"),
    (["--clean", CLEAN, "--corrupt", CORRUPT, "--position", "6"], 2,
     "error: --position 6 is outside the prompt's 6 tokens"),
])
def test_errors_are_one_line(folders, args, code, text) -> None:
    r = run_cli(["patch", str(folders["gpt2"]), *args])
    assert r.exit_code == code and r.stderr.strip().splitlines()[-1] == text, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("content, text", [
    ('{"clean": "a"}\n[1]\n', "line 2 is a JSON list, not an object"),
    ('{"clean": "a", "corrupt": 3}\n', "line 1: \"corrupt\" must be a non-empty string"),
    ('{"clean": "a", "answer": "b"}\n', "line 1: unknown key 'answer'"),
    ("{nope\n", "line 1 is not JSON"),
    ("\n\n", "holds no pair"),
])
def test_bad_pairs_files(folders, tmp_path, content, text) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text(content)
    r = run_cli(["patch", str(folders["gpt2"]), "--pairs", str(f)])
    assert r.exit_code == 4 and text in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_module_given_back_also_on_failure(folders) -> None:
    import torch
    import transformers

    import inspect_model as im

    model = transformers.AutoModelForCausalLM.from_pretrained(str(folders["llama"])).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    res = im.patch(model, clean=CLEAN, corrupt=CORRUPT, tokenizer=str(folders["llama"]), sites="head")
    assert res.record.pairs[0].sites[0].site == "head"
    with pytest.raises(Exception):
        im.patch(model, clean=CLEAN, corrupt=CORRUPT, tokenizer=str(folders["llama"]), metric="prob: horse cat")
    assert model.training and all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.is_grad_enabled()  # the caller's grad mode is given back too
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


@pytest.mark.slow  # two torchrun processes: over 3 s
def test_torchrun_shards_the_pairs(folders, tmp_path) -> None:
    import os
    import subprocess
    import sys

    from conftest import ROOT

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"clean": c, "corrupt": k}) + "\n" for c, k in [
        (CLEAN, CORRUPT), ("a dog ran to the park", "a cat ran to the park"),
        ("the movie was very good", "the film was very good")]))
    common = ["patch", str(folders["gpt2"]), "--pairs", str(pairs), "--sites", "resid,head", "--json", "-q"]
    one = _json(run_cli([*common, "-o", str(tmp_path / "one")]))
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                          "-m", "inspect_model", *common, "-o", str(tmp_path / "two")],
                         capture_output=True, text=True, env=env, timeout=300, check=False)
    assert two.returncode == 0, two.stderr[-2000:]
    doc = json.loads(two.stdout)
    assert [p["name"] for p in doc["pairs"]] == ["pair-0", "pair-1", "pair-2"]
    for a, b in zip(_grids(one), _grids(doc)):
        for ga, gb in zip(a, b):
            assert all(abs(x - y) < 1e-5 for ra, rb in zip(ga, gb) for x, y in zip(ra, rb))
    assert sorted(one["files"]) == sorted(doc["files"])
    assert all((tmp_path / "two" / f).is_file() for p in doc["pairs"] for f in p["files"].values())


@pytest.mark.slow  # builds and saves a model: over 3 s
def test_qwen2_folder(tmp_path) -> None:
    """A Qwen2 folder; its word-level test tokenizer lies in a folder of its own (--tokenizer): in the
    model's folder transformers would read it as a Qwen2Tokenizer (from config.json's model_type)."""
    from fixtures.lm_models import build_lm, lm_tokenizer

    build_lm("qwen2").save_pretrained(tmp_path / "q")
    lm_tokenizer().save_pretrained(tmp_path / "tok")
    doc = _json(run_cli(["patch", str(tmp_path / "q"), "--tokenizer", str(tmp_path / "tok"), "--clean", CLEAN,
                         "--corrupt", CORRUPT, "--metric", "logit-diff: mat,cat", "--json", "-q"]))
    pair = doc["pairs"][0]
    assert pair["clean_tokens"] == CLEAN.split() and len(pair["sites"]) == 4
    assert abs(pair["sites"][0]["normalised"][-1][-1] - 1.0) < 1e-5 and len(pair["sites"][3]["raw"]) == 3
