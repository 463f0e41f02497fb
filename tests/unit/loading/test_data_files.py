"""Data files read on trust no more (issue 41): a boxes CSV whose row the csv module refuses
(an over-long field, a NUL) and a labels map whose class index would allocate a list that
long are one input error naming the file (exit 4), never an uncaught ``csv.Error`` or a
MemoryError."""

from __future__ import annotations

from pathlib import Path

import pytest

from inspect_model.errors import InputError
from inspect_model.loading.boxes import load_boxes
from inspect_model.methods.objectives.targets import MAX_CLASSES, load_labels


@pytest.mark.parametrize("row", ["a.jpg," + "x" * 200_000 + ",1,2,3", 'a.jpg,"1,2,3,4', "a.jpg,1,2\0,3,4"],
                         ids=["over-long field", "open quote", "NUL"])
def test_the_issue_example_a_boxes_csv_row_the_csv_module_refuses(row: str, tmp_path: Path) -> None:
    p = tmp_path / "boxes.csv"
    p.write_text("image,x0,y0,x1,y1\nb.jpg,1,2,3,4\n" + row + "\n")
    try:
        boxes = load_boxes(p)
    except InputError as exc:
        assert "boxes file" in str(exc) and "line 3" in str(exc), exc
        assert "\n" not in str(exc)
    else:  # the csv module may read an open quote to the end: then the row's fields are checked
        assert "b.jpg" in boxes


def test_a_good_boxes_csv_still_reads(tmp_path: Path) -> None:
    p = tmp_path / "boxes.csv"
    p.write_text("image,x0,y0,x1,y1\nb.jpg,1,2,3,4\nc.jpg,0,0,5,5,cat\n")
    assert set(load_boxes(p)) == {"b.jpg", "c.jpg"}


@pytest.mark.parametrize("key", [str(2**32 - 1), str(10**18), "-1", str(MAX_CLASSES)])
def test_a_labels_map_with_a_huge_class_index_is_refused(key: str, tmp_path: Path) -> None:
    p = tmp_path / "labels.json"
    p.write_text('{"0": "cat", "%s": "dog"}' % key)
    with pytest.raises(InputError, match="class index"):
        load_labels(p)


def test_a_sparse_labels_map_within_the_limit_reads(tmp_path: Path) -> None:
    p = tmp_path / "labels.json"
    p.write_text('{"0": "cat", "21840": "dog"}')
    names = load_labels(p)
    assert len(names) == 21841 and names[0] == "cat" and names[21840] == "dog"
