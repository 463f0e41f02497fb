"""Statistics of text batches leave padding out (issue 42, item 4): ``activations --text``'s
per-layer statistics are those of the real tokens, checked against the model's own
``hidden_states`` averaged over real tokens only; ``grads --text``'s per-layer gradient
statistics likewise against autograd; rotary cos/sin tables are not listed as activations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import run_cli
from fixtures.text_models import save_text_model

transformers = pytest.importorskip("transformers")

# Lengths differ by several tokens, so that a batch has padding rows to leave out.
TEXTS = ["the cat sat on the mat", "i liked it", "a dog ran to the park and the cat sat"]
# hidden_states[k] <- the module whose output it is (HF: the embeddings' output, each block's
# output, the last block's output after the final norm).
SITES = {"llama": ["model.embed_tokens", "model.layers.0", "model.norm"],
         "gpt2": ["transformer.drop", "transformer.h.0", "transformer.ln_f"]}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("padding")
    return {k: save_text_model(k, root / k) for k in SITES}


def _json(args: list[str]) -> dict:
    r = run_cli(args + ["--json", "-q"])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def _hidden_states(folder: Path) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """The model's own hidden states of TEXTS in one padded batch, and its mask (B, L)."""
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    tok.padding_side = "right"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    enc = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**enc, output_hidden_states=True)
    return tuple(h.double() for h in out.hidden_states), enc["attention_mask"].bool()


@pytest.mark.parametrize("kind", list(SITES))
def test_layer_statistics_are_those_of_the_real_tokens(folders, kind):
    hidden, mask = _hidden_states(folders[kind])
    assert not bool(mask.all())  # the batch has padding
    layers = [a for s in SITES[kind] for a in ("-l", s)]
    doc = _json(["activations", str(folders[kind]), "--weights", "default", *layers,
                 *[a for t in TEXTS for a in ("--text", t)]])
    rows = {r["name"]: r for r in doc["layers"]}
    assert list(rows) == SITES[kind]
    assert doc["aggregation"] == ("merged over the real tokens of every text, padding left out (exact: per-text "
                                  "moments combined)")
    r = run_cli(["activations", str(folders[kind]), "--weights", "default", *layers, "--jsonl", "-q",
                 *[a for t in TEXTS for a in ("--text", t)]])
    assert r.exit_code == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    assert len(lines) == len(TEXTS)
    differs = False
    for name, h in zip(SITES[kind], hidden, strict=True):
        real = h[mask]  # (real tokens, D): the texts' own tokens
        st = rows[name]["stats"]
        assert st["numel"] == real.numel(), name
        assert st["mean"] == pytest.approx(float(real.mean()), rel=1e-5, abs=1e-7), name
        assert st["std"] == pytest.approx(float(real.std()), rel=1e-5), name
        assert st["min"] == pytest.approx(float(real.min()), rel=1e-5) and \
            st["max"] == pytest.approx(float(real.max()), rel=1e-5), name
        assert st["zero_fraction"] == float((real == 0).double().mean()), name
        assert st["negative_fraction"] == pytest.approx(float((real < 0).double().mean())), name
        assert rows[name]["channel_means"] == pytest.approx(real.mean(0).tolist(), rel=1e-5, abs=1e-7), name
        # The same statistic with padding in it is another number: the check can fail.
        differs |= abs(float(h.mean()) - float(real.mean())) > 1e-4 or h.numel() != real.numel()
        for i, line in enumerate(lines):  # each text's own statistics, as --jsonl streams them
            own = h[i][mask[i]]
            stats = next(x for x in line["layers"] if x["key"] == name)
            assert stats["numel"] == own.numel() and stats["mean"] == pytest.approx(float(own.mean()), rel=1e-5,
                                                                                    abs=1e-7), (name, i)
    assert differs


def test_batches_of_any_size_give_the_same_statistics(folders):
    """Padding depends on the batch; statistics of real tokens do not."""
    args = ["activations", str(folders["llama"]), "--weights", "default", *[a for t in TEXTS for a in ("--text", t)]]
    one = _json(args + ["--batch-size", "1"])["layers"]
    three = _json(args + ["--batch-size", "3"])["layers"]
    assert [r["key"] for r in one] == [r["key"] for r in three]
    for a, b in zip(one, three, strict=True):
        for k in ("mean", "std", "min", "max", "zero_fraction", "negative_fraction", "numel"):
            assert a["stats"][k] == pytest.approx(b["stats"][k], rel=1e-6, abs=1e-9), (a["key"], k)


def test_rotary_tables_are_not_activations(folders):
    r = run_cli(["activations", str(folders["llama"]), "--weights", "default", "--text", TEXTS[0], "--json"])
    assert r.exit_code == 0, r.stderr
    keys = [row["key"] for row in json.loads(r.stdout)["layers"]]
    assert not [k for k in keys if "rotary" in k] and "model.embed_tokens" in keys
    assert "note: model.rotary_emb left out: position tables (rotary cos/sin), not activations of the input; " \
           "name it with --layer to see them" in r.stderr
    named = _json(["activations", str(folders["llama"]), "--weights", "default", "--text", TEXTS[0],
                   "-l", "model.rotary_emb"])
    assert [row["key"] for row in named["layers"]] == ["model.rotary_emb/0", "model.rotary_emb/1"]


def test_gradient_statistics_are_those_of_the_real_tokens(folders):
    """grads --text: d(next-token logit of each text's last real token)/d(block 0's output),
    its statistics over the real tokens (autograd written here)."""
    folder = folders["gpt2"]
    doc = _json(["grads", str(folder), "--weights", "default", "-l", "transformer.h.0",
                 *[a for t in TEXTS for a in ("--text", t)]])
    row = next(r for r in doc["layers"] if r["name"] == "transformer.h.0")
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    tok.pad_token = tok.eos_token
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    enc = tok(TEXTS, padding=True, return_tensors="pt")
    kept = {}
    handle = model.transformer.h[0].register_forward_hook(
        lambda _m, _a, out: kept.setdefault("h", out[0] if isinstance(out, tuple) else out))
    logits = model(**enc).logits
    handle.remove()
    last = enc["attention_mask"].sum(1) - 1
    picked = logits[torch.arange(len(TEXTS)), last]
    score = picked.gather(1, picked.argmax(1, keepdim=True)).sum()
    g = torch.autograd.grad(score, kept["h"])[0].double()
    real = g[enc["attention_mask"].bool()]
    st = row["grad_wrt_output"]
    assert st["numel"] == real.numel()
    assert st["mean"] == pytest.approx(float(real.mean()), rel=1e-4, abs=1e-9)
    assert st["zero_fraction"] == pytest.approx(float((real == 0).double().mean()))
    assert float((g == 0).double().mean()) > float((real == 0).double().mean())  # padding: exact zeros


def test_check_dead_layers_count_real_tokens_only(folders):
    """Llama's pad rows embed to zeros (padding_idx): over a padded batch 11% of the embedding's
    values are 0; over real tokens none, and sin(0) = 0 in the rotary table is no dead unit."""
    args = ["check", str(folders["llama"]), "--weights", "default", *[a for t in TEXTS for a in ("--text", t)],
            "--max-dead-fraction", "0.05", "--json", "-q"]
    r = run_cli(args)
    assert r.exit_code == 0, r.stdout + r.stderr
    dead = next(c for c in json.loads(r.stdout)["checks"] if c["name"] == "dead layers")
    assert dead["passed"] and dead["value"] == 0
    hidden, mask = _hidden_states(folders["llama"])
    assert float((hidden[0] == 0).double().mean()) > 0.05  # with padding the embedding would fail the check
