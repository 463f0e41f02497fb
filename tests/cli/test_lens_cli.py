"""``inspect-model lens`` end to end (issue 36): the report's numbers against a readout
written here from transformers' hidden states (texts padded in one batch), tuned lenses in
tuned-lens's format (.pt and safetensors), encoder-decoders' decoder positions, files and
report.html, the JSON schema, and one-line errors with their exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch

from fixtures.lm_models import save_lm
from inspect_model.methods.lm.tuned import save_tuned_lens
from inspect_model.schemas import load_schema

TEXTS = ["the cat sat on the mat", "a dog ran"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    from fixtures.task_models import save_task_model

    root = tmp_path_factory.mktemp("lens")
    out = {k: save_lm(k, root / k) for k in ("gpt2", "t5", "llama", "qwen2")}
    out["bertmodel"] = save_task_model("bertmodel", root / "bertmodel")
    return out


def _json(cli, args: list[str]) -> dict:
    r = cli(["lens", *args, "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.Draft202012Validator(load_schema("lens")).validate(doc)
    return doc


def _numbers(doc: dict) -> list:
    return [[(r["site"], r["depth"], r["prob"], r["rank"], r["kl"], r["entropy"], r["top"]) for r in t["rows"]]
            for t in doc["images"]]


def test_report_numbers_are_the_readout_of_each_text_alone(cli, folders):
    import transformers

    folder = folders["gpt2"]
    doc = _json(cli, [str(folder), "--text", TEXTS[0], "--text", TEXTS[1], "--top-k", "3"])
    assert doc["readout_error"] <= 1e-5 and doc["lens"] == "logit" and doc["anatomy"]["final_norm"] == "transformer.ln_f"
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    for text, entry in zip(TEXTS, doc["images"]):
        ids = tok(text, return_tensors="pt")["input_ids"]  # alone, unpadded
        with torch.no_grad():
            out = model(input_ids=ids, output_hidden_states=True)
            final = out.logits[0].log_softmax(-1)
            pred = final.argmax(-1)
            assert entry["predicted"] == [tok.decode([int(i)]) for i in pred]
            assert len(entry["tokens"]) == ids.shape[1] and len(entry["rows"]) == 4
            for row in entry["rows"][:3]:  # depth d: hidden_states[d]
                logp = model.lm_head(model.transformer.ln_f(out.hidden_states[row["depth"]]))[0].log_softmax(-1)
                want_p = logp.exp()[torch.arange(len(pred)), pred]
                want_kl = (final.exp() * (final - logp)).sum(-1)
                assert torch.allclose(torch.tensor(row["prob"]), want_p, atol=1e-5)
                assert torch.allclose(torch.tensor(row["kl"]), want_kl, atol=1e-5)
                assert [[t["id"] for t in pos] for pos in row["top"]] == logp.topk(3, -1).indices.tolist()
            last = entry["rows"][3]
            assert max(last["kl"]) <= 1e-6 and set(last["rank"]) == {1}
    means = {(r["site"], r["depth"]): r for r in doc["layers"]}
    all_kl = [k for t in doc["images"] for k in t["rows"][1]["kl"]]
    assert means[("resid", 1)]["kl"] == pytest.approx(sum(all_kl) / len(all_kl))
    assert means[("resid", 1)]["positions"] == 9


def test_tuned_lens_files(cli, folders, tmp_path):
    folder = str(folders["gpt2"])
    plain = _json(cli, [folder, "--text", TEXTS[0]])
    zeros = save_tuned_lens(tmp_path / "zeros", [torch.zeros(32, 32)] * 3, [torch.zeros(32)] * 3, d_model=32)
    tuned = _json(cli, [folder, "--text", TEXTS[0], "--lens", str(zeros)])
    assert tuned["lens"] == "tuned" and _numbers(tuned) == _numbers(plain)  # identity: the logit lens exactly
    g = torch.Generator().manual_seed(0)
    ws, bs = [0.3 * torch.randn(32, 32, generator=g) for _ in range(3)], [torch.randn(32, generator=g)
                                                                       for _ in range(3)]
    pt = save_tuned_lens(tmp_path / "rand", ws, bs, d_model=32)
    from safetensors.torch import save_file

    st = tmp_path / "rand_st"
    st.mkdir()
    save_file({k: v.contiguous() for k, v in torch.load(pt / "params.pt").items()}, st / "params.safetensors")
    (st / "config.json").write_text((pt / "config.json").read_text())
    a, b = _json(cli, [folder, "--text", TEXTS[0], "--lens", str(pt)]), _json(cli, [folder, "--text", TEXTS[0],
                                                                                   "--lens", str(st)])
    assert _numbers(a) == _numbers(b) and _numbers(a) != _numbers(plain)
    assert _numbers(a)[0][-1] == _numbers(plain)[0][-1]  # the last block: no translator


@pytest.mark.parametrize("kind,norm", [("llama", "model.norm"), ("qwen2", "model.norm")])
def test_llama_and_qwen_read_out_their_own_logits(cli, folders, kind, norm):
    doc = _json(cli, [str(folders[kind]), "--text", TEXTS[0], "--text", TEXTS[1], "--sites", "resid,attn,mlp"])
    assert doc["readout_error"] <= 1e-5 and doc["anatomy"]["final_norm"] == norm
    assert [len(t["rows"]) for t in doc["images"]] == [10, 10] and not doc["warnings"]
    assert all(max(r["kl"]) <= 1e-6 for t in doc["images"] for r in t["rows"] if r["depth"] == 3 and r["site"] == "resid")


def test_encoder_decoder_decodes_the_decoder(cli, folders):
    doc = _json(cli, [str(folders["t5"]), "--text", "the cat sat", "--target-text", "a dog ran", "--sites",
                      "resid,attn,mlp"])
    t = doc["images"][0]
    assert doc["readout_error"] <= 1e-5 and doc["anatomy"]["hidden_scale"] == pytest.approx(32 ** -0.5)
    assert t["tokens"] == ["<pad>", "a", "dog"]  # the start token, then the target shifted right (predicts a dog ran)
    assert len(t["predicted"]) == 3 and [r["site"] for r in t["rows"]].count("mlp") == 3
    assert doc["anatomy"]["blocks"][0] == "decoder.block.0"


def test_files_report_html_and_text(cli, folders, tmp_path):
    out = tmp_path / "out"
    r = cli(["lens", str(folders["gpt2"]), "--text", TEXTS[0], "--sites", "resid,mlp", "--show", "rank", "-o",
             str(out)])
    assert r.exit_code == 0, r.stderr
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert names == ["images/0000-text-0/kl.png", "images/0000-text-0/lens_mlp.png",
                     "images/0000-text-0/lens_resid.png", "kl_by_depth.png", "report.html", "report.json",
                     "report.txt"]
    page = (out / "report.html").read_text()
    assert "<h3>text-0 (resid)" in page and "<h3>text-0 (mlp)" in page and "model predicts" in page
    assert "lens: 3 block(s) transformer.h.0 .. transformer.h.2; final norm transformer.ln_f" in r.stderr
    txt = (out / "report.txt").read_text()
    assert "check: the last block's readout vs the model's logits, max |diff| = 0" in txt
    assert "resid \\ input" in txt and "mlp \\ input" in txt


def test_api_and_model_given_back(folders):
    import transformers

    import inspect_model as im
    from fixtures.invariants import assert_same, snapshot
    from inspect_model.run.options import InputOptions

    model = transformers.AutoModelForCausalLM.from_pretrained(folders["gpt2"]).eval()
    with torch.no_grad():
        model(input_ids=torch.tensor([[1, 2]]), output_hidden_states=True)  # transformers' own hooks, installed once
    before = snapshot(model)
    res = im.lens(model, inputs=InputOptions(text=[TEXTS[1]], tokenizer=str(folders["gpt2"])), top_k=2)
    assert_same(model, before)
    assert res.record.images[0].rows[0].layer == "embeddings" and len(res.record.images[0].rows[0].top[0]) == 2
    assert res.to_dict()["command"] == "lens"


@pytest.mark.parametrize("args,code,message", [
    (["{gpt2}"], 2, "lens reads texts: give --text TEXT or --text-file FILE"),
    (["{gpt2}", "--text", "hi", "--sites", "resid,heads"], 2, "--sites 'resid,heads' names heads"),
    (["{gpt2}", "--text", "hi", "--show", "logit"], 2, "--show 'logit' is not one of prob, rank"),
    (["{gpt2}", "--text", "hi", "--top-k", "0"], 2, "--top-k"),
    (["{gpt2}", "--text", "hi", "--position", "1"], 2, "--position does not apply to lens"),
    (["{gpt2}", "--text", "hi", "--final-norm", "transformer.ln"], 5,
     "--final-norm 'transformer.ln': the model has no such module"),
    (["{gpt2}", "--text", "hi", "--lens", "{tmp}/nothing"], 3, "--lens '{tmp}/nothing' does not exist"),
    (["{gpt2}", "--text", "hi", "--lens", "{tmp}/wide"], 3, "its config says d_model=64, the model has 32"),
    (["{gpt2}", "--text", "hi", "--lens", "{tmp}/short"], 3, "no translator 2 ('2.weight'); the model has 3 layer(s)"),
    (["{gpt2}", "--text", "hi", "--lens", "{tmp}/code"], 3, "holds Python objects"),
    (["{bertmodel}", "--text", "hi"], 9, "BertModel has no output embedding"),
])
def test_errors_are_one_line(cli, folders, tmp_path, args, code, message):
    save_tuned_lens(tmp_path / "wide", [torch.zeros(64, 64)] * 3, [torch.zeros(64)] * 3, d_model=64)
    save_tuned_lens(tmp_path / "short", [torch.zeros(32, 32)] * 2, [torch.zeros(32)] * 2, d_model=32)
    (tmp_path / "short" / "config.json").unlink()
    (tmp_path / "code").mkdir()
    torch.save({"0.weight": torch.zeros(32, 32), "x": Path("/")}, tmp_path / "code" / "params.pt")
    subs = {k: str(v) for k, v in folders.items()} | {"tmp": str(tmp_path)}
    r = cli(["lens", *(a.format(**subs) for a in args)])
    assert r.exit_code == code, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and message.format(**subs) in lines[-1], r.stderr
    assert "Traceback" not in r.stderr


def test_text_file_resume_after_an_interruption(cli, folders, tmp_path, monkeypatch):
    import importlib

    api_lens = importlib.import_module("inspect_model.api.lens")
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat on the mat\na dog ran to the park\nthe movie was very good\n")
    common = ["lens", str(folders["gpt2"]), "--text-file", str(texts), "--batch-size", "1", "--top-k", "2", "-q"]
    whole = _json(cli, [*common[1:], "-o", str(tmp_path / "one")])
    real = api_lens.LensSession.feed
    calls = {"n": 0}

    def failing(self, batch):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(self, batch)

    monkeypatch.setattr(api_lens.LensSession, "feed", failing)
    assert cli([*common, "-o", str(tmp_path / "res"), "--resume"]).exit_code != 0
    seen: list = []
    monkeypatch.setattr(api_lens.LensSession, "feed", lambda self, b: seen.append(b.names) or real(self, b))
    resumed = _json(cli, [*common[1:], "-o", str(tmp_path / "res"), "--resume"])
    assert seen == [["text-1"], ["text-2"]]  # text-0 was done before the interruption
    assert _numbers(resumed) == _numbers(whole) and resumed["layers"] == whole["layers"]
    assert [t["index"] for t in resumed["images"]] == [0, 1, 2]
    assert sorted(p.name for p in (tmp_path / "res" / "images").iterdir()) == ["0000-text-0", "0001-text-1",
                                                                              "0002-text-2"]


def test_a_wrong_readout_is_said(cli, folders):
    """--final-norm '' skips GPT-2's ln_f: the last block no longer reads out the model's logits, and the
    report says so (the self-check), while the numbers are still those of the readout asked for."""
    doc = _json(cli, [str(folders["gpt2"]), "--text", TEXTS[1], "--final-norm", ""])
    assert doc["anatomy"]["final_norm"] is None and doc["readout_error"] > 1e-3
    assert "differs from the model's logits" in doc["warnings"][0]["message"]
