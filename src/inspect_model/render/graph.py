"""The model graph (:class:`inspect_model.methods.graph.ModelGraph`) as Graphviz DOT, and
DOT as SVG/PNG through Graphviz's ``dot`` when it is installed (issue 39).

Modules are boxes (name, type, output shape, parameters), operations between modules small
ellipses, inputs and outputs coloured house shapes, containers nested dashed clusters, and a
run of folded blocks a double box that says how many it stands for.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import TYPE_CHECKING, Any

from inspect_model.render.table import human_count

if TYPE_CHECKING:
    from inspect_model.methods.graph import GraphNode, ModelGraph

DOT_HINT = ("Graphviz's dot was not found, so only graph.dot was written; install Graphviz "
            "(apt-get install graphviz, brew install graphviz or conda install graphviz) and run "
            "dot -Tsvg graph.dot -o graph.svg")
_STYLE = {
    "module": 'shape=box, style="rounded,filled", fillcolor="#dbe8fb"',
    "op": 'shape=ellipse, style=filled, fillcolor="#fff2c2", fontsize=8, height=0.25, margin="0.04,0.02"',
    "input": 'shape=invhouse, style=filled, fillcolor="#c9efc9"',
    "output": 'shape=house, style=filled, fillcolor="#f7d0c9"',
    "folded": 'shape=box, peripheries=2, style="rounded,filled", fillcolor="#e6e6e6"',
}


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _shape(shapes: tuple[tuple[int, ...], ...]) -> str:
    text = ", ".join("x".join(str(d) for d in s) or "scalar" for s in shapes[:2])
    return text + (f" +{len(shapes) - 2}" if len(shapes) > 2 else "")


def node_label(n: GraphNode) -> str:
    if n.kind == "op":
        return n.name
    short = n.name.rsplit(".", 1)[-1] if n.kind == "module" and n.clusters else n.name
    if n.kind == "folded" and n.clusters:
        short = n.name.removeprefix(n.clusters[-1] + ".")
    first = f"{short}: {n.count} x {n.type}" if n.kind == "folded" else (
        f"{short}: {n.type}" if n.kind == "module" else short)
    second = " · ".join(x for x in (_shape(n.shapes), f"{human_count(n.params)} params" if n.params else "") if x)
    lines = [first] + ([second] if second else [])
    return "\n".join(lines)


def to_dot(g: ModelGraph, title: str = "model") -> str:
    """The graph as DOT text: nodes inside their nested clusters, then the edges."""
    out = ["digraph model {",
           f'  graph [rankdir=TB, fontname="Helvetica", fontsize=10, labelloc=t, label={_q(title)}, '
           'nodesep=0.15, ranksep=0.22, newrank=true];',
           '  node [fontname="Helvetica", fontsize=9, height=0.3, margin="0.06,0.03"];',
           '  edge [arrowsize=0.5, color="#555555"];']
    by_cluster: dict[str, list[GraphNode]] = {}
    for n in g.nodes:
        by_cluster.setdefault(n.clusters[-1] if n.clusters else "", []).append(n)
    children: dict[str, list[str]] = {}
    for c in g.clusters:
        parent = max((p for p in g.clusters if c.startswith(p + ".")), key=len, default="")
        children.setdefault(parent, []).append(c)

    def emit(cluster: str, indent: str) -> None:
        for n in by_cluster.get(cluster, []):
            out.append(f"{indent}{_q(n.id)} [label={_q(node_label(n))}, tooltip={_q(n.name)}, {_STYLE[n.kind]}];")
        for c in children.get(cluster, []):
            if not _has_nodes(c, by_cluster, children):
                continue
            out.append(f"{indent}subgraph {_q('cluster_' + c)} {{")
            out.append(f'{indent}  label={_q(f"{c} ({g.clusters[c]})")}; style="rounded,dashed"; '
                       'color="#8899aa"; fontsize=9;')
            emit(c, indent + "  ")
            out.append(f"{indent}}}")

    emit("", "  ")
    out += [f"  {_q(a)} -> {_q(b)};" for a, b in g.edges]
    out.append("}")
    return "\n".join(out) + "\n"


def _has_nodes(c: str, by_cluster: dict[str, list[GraphNode]], children: dict[str, list[str]]) -> bool:
    return bool(by_cluster.get(c)) or any(_has_nodes(k, by_cluster, children) for k in children.get(c, []))


def dot_program() -> str | None:
    return shutil.which("dot")


def render_dot(dot_text: str, fmt: str, *, timeout: float = 300.0) -> bytes:
    """``dot -T<fmt>`` of ``dot_text`` (svg or png); raises RuntimeError with dot's message."""
    exe = dot_program()
    if exe is None:
        raise RuntimeError(DOT_HINT)
    args = [exe, f"-T{fmt}"] + (["-Gdpi=96"] if fmt == "png" else [])
    proc = subprocess.run(args, input=dot_text.encode(), capture_output=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        msg = proc.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"Graphviz's dot failed: {msg[-1] if msg else proc.returncode}")
    return proc.stdout


class GraphFiles:
    """graph.dot, graph.svg and graph.png of a model graph, drawn once and written into an
    output folder with the reports (the ``session.drawer`` that ``Result.save`` calls)."""

    def __init__(self, graph: ModelGraph, title: str) -> None:
        self.dot = to_dot(graph, title)
        self.pictures: dict[str, bytes] = {}
        self.notes: list[str] = []
        if dot_program() is None:
            self.notes.append(DOT_HINT)
            return
        try:
            for fmt in ("svg", "png"):
                self.pictures[f"graph.{fmt}"] = render_dot(self.dot, fmt)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            self.pictures.clear()
            self.notes.append(f"the graph was not drawn ({exc}); graph.dot has it")

    @property
    def drawer(self) -> GraphFiles:
        return self

    def reset(self) -> None:
        pass

    def draw_summary(self, sink: Any, result: Any) -> None:
        sink.text("graph.dot", self.dot)
        for name, data in self.pictures.items():
            sink.data(name, data)
