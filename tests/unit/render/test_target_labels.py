"""Issue 35: a named objective's target is shown by its words, without its score index (always
0): ``log p(' mat' | text) at position 5``, not ``0 log p(...)``; a class keeps ``281 tabby``.
One helper (render/labels.py) names targets in the tables, titles and report.html."""

from __future__ import annotations

from pathlib import Path

import pytest

from inspect_model.render.labels import target_label

TEXT = "the cat sat on the"


def test_a_class_keeps_its_index_and_an_objective_shows_its_words() -> None:
    assert target_label({"class": 281, "label": "tabby"}) == "281 tabby"
    assert target_label({"class": 7, "label": None}) == "7"
    assert target_label({"class": 281, "label": "tabby"}, prefix="class ") == "class 281 tabby"
    words = "log p(' mat' | text) at position 5"
    assert target_label({"class": 0, "label": words, "objective": True}) == words
    assert target_label({"class": 0, "label": words, "objective": True}, prefix="class ") == words


def test_objective_flag_comes_from_the_task_labels() -> None:
    from inspect_model.methods.families.objective import TaskLabels
    from inspect_model.methods.objectives.rows import target_fields

    assert target_fields(3, ["a", "b", "c", "d"]) == {"class": 3, "label": "d"}
    labels = TaskLabels(["||the pooled output||_2"], {"norm": 0}, objective=True)
    assert target_fields(0, labels) == {"class": 0, "label": "||the pooled output||_2", "objective": True}
    assert "objective" not in target_fields(0, TaskLabels(["a photo of a cat"]))  # CLIP's texts are classes


@pytest.mark.slow
def test_a_continuation_is_named_by_its_words_in_table_json_and_html(tmp_path: Path) -> None:
    import inspect_model as im
    from inspect_model.render import attributions as ra
    from inspect_model.run.options import InputOptions
    from tests.fixtures.task_models import save_task_model

    folder = str(save_task_model("gpt2", tmp_path / "gpt2"))
    out = tmp_path / "out"
    res = im.attributions(folder, inputs=InputOptions(text=[TEXT], target_text=" mat"), methods=["gradient"],
                          output_dir=out)
    target = res.payload["images"][0]["maps"][0]["target"]
    assert target["objective"] is True and target["class"] == 0
    words = target["label"]
    assert words.startswith("log p(' mat' | text) at position ")
    rows = ra.map_rows(res.to_dict())  # formatted from the typed records
    assert rows[0][1] == words  # not "0 log p(...)"
    html = (out / "report.html").read_text(encoding="utf-8")
    assert words.replace("'", "&#x27;") in html or words in html
    assert f"0 {words}" not in html and f"0 {words}".replace("'", "&#x27;") not in html
    # a class target keeps its index: the next-token logits name the predicted token
    res = im.attributions(folder, inputs=InputOptions(text=[TEXT]), methods=["gradient"])
    t = res.payload["images"][0]["maps"][0]["target"]
    assert "objective" not in t and ra.map_rows(res.to_dict())[0][1] == f"{t['class']} {t['label']}"
