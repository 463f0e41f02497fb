"""``summary --graph`` (issue 39): the traced data-flow graph matches the model's modules and
the data flow by hand; containers nest, runs of identical blocks fold; the files are
written with the reports, and without Graphviz the .dot file and a one-line hint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from inspect_model.methods.graph import GraphTracer
from tests.fixtures.models import assert_unchanged, model_state


class Block(nn.Module):
    """fc1 -> act -> fc2, plus the block's input: a residual join."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x))) + x


class Net(nn.Module):
    def __init__(self, blocks: int = 1) -> None:
        super().__init__()
        self.stem = nn.Linear(3, 4)
        self.blocks = nn.Sequential(*[Block() for _ in range(blocks)])
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = self.blocks(h)
        return self.head(torch.cat([h, h.view(h.shape[0], 4)], dim=1))


def _trace(model: nn.Module, x: torch.Tensor, depth: int | None = None, fold: bool = True):
    with GraphTracer(model, depth) as tr:
        model(x)
    return tr.graph(fold=fold)


def _named(g) -> tuple[dict[str, str], set[tuple[str, str]]]:
    """Node id -> a readable name (module name, op name, input/output), and the edges by those names."""
    name = {n.id: n.name for n in g.nodes}
    return name, {(name[a], name[b]) for a, b in g.edges}


def test_nodes_and_edges_match_the_modules_and_the_data_flow() -> None:
    model = Net().eval()
    g = _trace(model, torch.randn(2, 3))
    names, edges = _named(g)
    modules = {n.name for n in g.nodes if n.kind == "module"}
    leaves = {n for n, m in model.named_modules() if not list(m.children())}
    assert modules == leaves  # every leaf module called once is one node
    assert sorted(n.name for n in g.nodes if n.kind == "op") == ["add", "cat"]  # view() draws nothing
    assert edges == {
        ("input 0", "stem"), ("stem", "blocks.0.fc1"), ("blocks.0.fc1", "blocks.0.act"),
        ("blocks.0.act", "blocks.0.fc2"),
        ("blocks.0.fc2", "add"), ("stem", "add"),  # the residual join: two edges into one add
        ("add", "cat"),  # h and h.view(...) are one producer: one edge
        ("cat", "head"), ("head", "output 0"),
    }
    add = next(n for n in g.nodes if n.name == "add")
    assert add.clusters == ("blocks", "blocks.0")  # drawn inside the block that ran it
    assert add.shapes == ((2, 4),)
    stem = next(n for n in g.nodes if n.name == "stem")
    assert stem.shapes == ((2, 4),) and stem.params == 3 * 4 + 4
    assert g.clusters == {"blocks": "Sequential", "blocks.0": "Block"}


def test_depth_folds_containers_into_one_node() -> None:
    g = _trace(Net().eval(), torch.randn(1, 3), depth=1)
    names, edges = _named(g)
    assert {n.name for n in g.nodes if n.kind == "module"} == {"stem", "blocks", "head"}
    assert ("stem", "blocks") in edges and ("blocks", "cat") in edges
    assert not g.clusters  # nothing is open below depth 1
    blocks = next(n for n in g.nodes if n.name == "blocks")
    assert blocks.params == 2 * (4 * 4 + 4)


def test_a_run_of_identical_blocks_folds_its_middle() -> None:
    model = Net(blocks=6).eval()
    full = _trace(model, torch.randn(1, 3), fold=False)
    g = _trace(model, torch.randn(1, 3))
    folded = [n for n in g.nodes if n.kind == "folded"]
    assert len(folded) == 1 and folded[0].count == 4 and folded[0].type == "Block"
    assert folded[0].params == 4 * 2 * (4 * 4 + 4)
    names, edges = _named(g)
    mid = folded[0].name
    # the first and last blocks stay whole, joined through the folded node
    assert ("blocks.0.fc1", "blocks.0.act") in edges and ("blocks.5.fc1", "blocks.5.act") in edges
    assert any(b == mid for a, b in edges) and any(a == mid for a, b in edges)
    assert "blocks.2" not in g.clusters and "blocks.0" in g.clusters
    assert len(g.nodes) < len(full.nodes)


def test_hooks_are_removed_also_when_the_pass_fails() -> None:
    model = Net().eval()
    before = model_state(model)
    with pytest.raises(RuntimeError):
        with GraphTracer(model) as _:
            model(torch.randn(1, 5))  # wrong width: the stem raises
    assert_unchanged(model, before)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_meta_trace_of_a_text_model() -> None:
    from tests.fixtures.text_models import build_model

    model = build_model("llama")
    ids = torch.zeros(1, 6, dtype=torch.long)
    g = _trace(model, ids)
    ops = {n.name for n in g.nodes if n.kind == "op"}
    assert {"matmul", "softmax"} <= ops or "attention (sdpa)" in ops  # attention's products are drawn
    assert any(n.kind == "input" for n in g.nodes)
    outputs = [n for n in g.nodes if n.kind == "output"]
    assert len(outputs) == 1 and outputs[0].shapes == ((1, 6, 64),)  # the logits; the KV cache is no output


def test_cli_writes_the_graph_with_the_reports(cli, models_py: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = cli(["summary", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "--graph", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["graph"]["nodes"] > 3 and doc["options"]["graph"] is True
    dot = (out / "graph.dot").read_text()
    assert dot.startswith("digraph model {") and '"input0" ->' in dot
    from inspect_model.render.graph import dot_program

    if dot_program() is not None:
        assert (out / "graph.svg").read_text().lstrip().startswith("<?xml")
        assert (out / "graph.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert 'src="graph.svg"' in (out / "report.html").read_text()
        assert {"graph.dot", "graph.png", "graph.svg"} <= set(doc["files"])


def test_cli_graph_needs_an_output_folder(cli, models_py: Path) -> None:
    r = cli(["summary", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "--graph"])
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "error: --graph writes graph.svg, graph.png and graph.dot into the output folder; add -o DIR")


def test_without_graphviz_the_dot_file_and_one_line(cli, models_py: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import inspect_model.render.graph as rg

    monkeypatch.setattr(rg, "dot_program", lambda: None)
    out = tmp_path / "out"
    r = cli(["summary", f"{models_py}:TinyCNN", "--input-size", "3x8x8", "--graph", "-o", str(out)])
    assert r.exit_code == 0, r.stderr
    assert (out / "graph.dot").exists() and not (out / "graph.svg").exists()
    hint = [line for line in r.stderr.splitlines() if "graph.dot" in line]
    assert len(hint) == 1 and "apt-get install graphviz" in hint[0] and "dot -Tsvg graph.dot" in hint[0]
