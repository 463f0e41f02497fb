"""``attributions --evaluate`` on texts (issue 42): tokens deleted and inserted in the order
of each map's per-token relevance, checked against the classifier's probabilities computed
here with transformers on the same token ids."""

from __future__ import annotations

import torch

import inspect_model as im
from fixtures.text_models import save_text_model
from inspect_model.run.options import InputOptions, ModelOptions

TEXT = "the movie was very good"


def test_token_deletion_and_insertion_curves(tmp_path):
    import transformers

    folder = str(save_text_model("bert", tmp_path / "bert", trained=True))
    res = im.attributions(folder, inputs=InputOptions(text=[TEXT]), model_options=ModelOptions(folder),
                          methods=["saliency"], evaluate=True)
    rec = res.payload["images"][0]["maps"][0]
    ev, target = rec["evaluation"], rec["target"]["class"]
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tok([TEXT], return_tensors="pt")["input_ids"][0]
    assert ev["replacement_token"] == tok.mask_token_id
    order = torch.argsort(torch.tensor(rec["tokens"]), descending=True, stable=True)

    def prob(row):
        with torch.no_grad():
            return float(model(row[None]).logits.softmax(-1)[0, target])

    n = len(ids)
    deleted, inserted = [], []
    for k in range(n + 1):
        d, i = ids.clone(), ids.clone()
        d[order[:k]] = tok.mask_token_id
        i[order[k:]] = tok.mask_token_id
        deleted.append(prob(d))
        inserted.append(prob(i))
    assert torch.allclose(torch.tensor(ev["curves"]["deletion"]), torch.tensor(deleted), atol=1e-5)
    assert torch.allclose(torch.tensor(ev["curves"]["insertion"]), torch.tensor(inserted), atol=1e-5)
    assert abs(ev["scores"]["deletion"] - (sum(deleted) - (deleted[0] + deleted[-1]) / 2) / n) < 1e-6
    assert "saliency" in str(res.payload["evaluation"])  # the run's summary ranks the method
