"""The model's data-flow graph, traced in the same pass that counts MACs (issue 39).

Nodes are module calls (leaves, or containers folded at ``depth``), the tensor operations
that run between modules (a residual block's addition, a concatenation, attention's matrix
products) and the model's inputs and outputs. An edge joins the node that produced a tensor
to each node that reads it, so a residual addition is a join of two edges. Containers
become nested clusters. Operations that only re-view a tensor (view, permute, transpose,
slicing...) pass its producer on and draw nothing.

The tracer is a ``TorchDispatchMode`` plus forward hooks, entered around the summary's
forward pass: on the meta device it sees shapes only, so an 8B model traces in seconds.
Hooks are removed and the mode left whatever the pass does.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from inspect_model.engine.selection import module_depth

if TYPE_CHECKING:
    from torch import nn

# aten ops that return a view or a copy of one tensor: the producer passes through them.
_PASS_THROUGH = frozenset({
    "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "unsqueeze", "squeeze", "flatten",
    "unflatten", "contiguous", "expand", "expand_as", "view_as", "clone", "alias", "detach", "slice",
    "select", "split", "split_with_sizes", "chunk", "unbind", "_to_copy", "to", "lift_fresh", "as_strided",
    "_reshape_alias", "dropout", "native_dropout", "type_as", "_assert_tensor_metadata", "copy",
    "lift_fresh_copy", "repeat", "repeat_interleave", "narrow", "movedim", "squeeze_", "unsqueeze_",
    "transpose_", "t_", "masked_fill", "masked_fill_",
})
_OP_NAMES = {"mm": "matmul", "bmm": "matmul", "matmul": "matmul", "baddbmm": "matmul", "addmm": "linear",
             "_scaled_dot_product_flash_attention_for_cpu": "attention (sdpa)",
             "_scaled_dot_product_efficient_attention": "attention (sdpa)",
             "_scaled_dot_product_flash_attention": "attention (sdpa)",
             "scaled_dot_product_attention": "attention (sdpa)", "_softmax": "softmax", "_safe_softmax": "softmax",
             "_log_softmax": "log_softmax", "cat": "cat", "stack": "stack"}
# Operations always drawn: the joins and products a reader looks for between modules.
KEY_OPS = frozenset({"add", "cat", "stack", "matmul", "attention (sdpa)", "softmax", "einsum", "linear"})
FOLD_OPS = 5  # this many or more other operations joined together in one container: one node
FOLD_RUN = 4  # this many or more same-type sibling blocks in a row: the middle ones are drawn as one node


@dataclass(frozen=True)
class GraphNode:
    id: str
    kind: str  # "input", "output", "module", "op" or "folded"
    name: str  # qualified module name, op name, or "input 0"/"output 0"
    type: str  # module type, op, or "Tensor"
    clusters: tuple[str, ...]  # enclosing containers, outermost first ("" = the model: not listed)
    shapes: tuple[tuple[int, ...], ...] = ()
    params: int = 0
    count: int = 1  # blocks folded into this node


@dataclass(frozen=True)
class ModelGraph:
    nodes: tuple[GraphNode, ...]
    edges: tuple[tuple[str, str], ...]
    clusters: dict[str, str] = field(default_factory=dict)  # container name -> its type

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": [{"id": n.id, "kind": n.kind, "name": n.name, "type": n.type,
                           "cluster": n.clusters[-1] if n.clusters else "", "shapes": [list(s) for s in n.shapes],
                           "params": n.params, "count": n.count} for n in self.nodes],
                "edges": [list(e) for e in self.edges], "clusters": dict(self.clusters)}


def _op_name(packet: Any) -> str:
    name = str(packet).removeprefix("aten.").split(".")[0]
    name = name[:-1] if name.endswith("_") and not name.startswith("_") else name
    return _OP_NAMES.get(name, name)


def _tensors(obj: Any, depth: int = 0, records: bool = True) -> Iterator[Any]:
    """The tensors in ``obj``: nested lists, tuples, dicts (transformers' ModelOutput), and
    with ``records`` the attributes of other objects (torchvision's ImageList), a few levels
    deep. The model's outputs are read without ``records``: a KV cache is not an output."""
    import torch
    from torch import nn

    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth > 4 or isinstance(obj, (str, bytes, int, float, bool, nn.Module)) or obj is None:
        return
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o, depth + 1, records)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o, depth + 1, records)
    elif records and hasattr(obj, "__dict__") and not callable(obj):
        for o in vars(obj).values():
            yield from _tensors(o, depth + 1, records)


class GraphTracer:
    """Records the data flow of one forward pass of ``model`` (use as a context manager).

    ``depth`` folds modules deeper than it into their ancestor at that depth, as the table does."""

    def __init__(self, model: nn.Module, depth: int | None = None) -> None:
        self.model, self.depth = model, depth
        self.names = {id(m): n for n, m in reversed(list(model.named_modules(remove_duplicate=False)))}
        self.containers: dict[str, str] = {}
        self.node_modules: set[str] = set()
        for m in model.modules():
            n = self.names[id(m)]
            leaf = next(iter(m.children()), None) is None
            d = module_depth(n)
            if depth is not None and d > depth:
                continue
            if leaf or (depth is not None and d == depth):
                self.node_modules.add(n)
            elif n:
                self.containers[n] = type(m).__name__
        self.nodes: list[GraphNode] = []
        self.edges: dict[tuple[str, str], None] = {}
        self.calls: dict[str, int] = defaultdict(int)
        self.stack: list[str] = []  # containers running now
        self.inside = 0  # node modules running now (their own ops are not drawn)
        self.params = _own_params(model)
        self._handles: list[Any] = []
        self._mode: Any = None
        self.producer: Any = None

    # -- the context -------------------------------------------------------------------
    def __enter__(self) -> GraphTracer:
        import torch.utils.weak

        self.producer = torch.utils.weak.WeakIdKeyDictionary()
        try:
            for m in self.model.modules():
                n = self.names[id(m)]
                if n in self.node_modules or n in self.containers or m is self.model:
                    self._handles.append(m.register_forward_pre_hook(self._pre(n, m), with_kwargs=True))
                    self._handles.append(m.register_forward_hook(self._post(n, m), always_call=True))
            self._mode = _make_mode(self._on_op)
            self._mode.__enter__()
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if self._mode is not None:
                mode, self._mode = self._mode, None
                mode.__exit__(*exc)
        finally:
            self._remove()

    def _remove(self) -> None:
        handles, self._handles = self._handles, []
        for h in handles:
            h.remove()

    # -- hooks ---------------------------------------------------------------------------
    def _pre(self, n: str, m: nn.Module) -> Callable[..., None]:
        def hook(mod: nn.Module, args: tuple, kwargs: dict) -> None:
            if self.inside:
                return
            if mod is self.model and not self.stack and not self.nodes:
                for i, t in enumerate(_tensors((args, kwargs))):
                    node = self._add(GraphNode(f"input{i}", "input", f"input {i}", "Tensor", (),
                                               (tuple(t.shape),)))
                    self.producer[t] = node.id
            if n in self.node_modules:
                self._pending = [self.producer.get(t) for t in _tensors((args, kwargs))]
                self.inside += 1
            elif n:
                self.stack.append(n)
        return hook

    def _post(self, n: str, m: nn.Module) -> Callable[..., None]:
        def hook(mod: nn.Module, args: tuple, out: Any) -> None:
            if n in self.node_modules and self.inside == 1:
                self.inside = 0
                k = self.calls[n]
                self.calls[n] += 1
                outs = list(_tensors(out))
                node = self._add(GraphNode(
                    n + (f"#{k}" if k else ""), "module", n + (f" (call {k + 1})" if k else ""), type(mod).__name__,
                    self._clusters(n), tuple(tuple(t.shape) for t in outs), self.params.get(n, 0)))
                for src in self._pending:
                    if src is not None:
                        self.edges[(src, node.id)] = None
                for t in outs:
                    self.producer[t] = node.id
            elif n in self.node_modules:
                self.inside = max(self.inside - 1, 0)
            elif n and not self.inside and self.stack and self.stack[-1] == n:
                self.stack.pop()
            if mod is self.model and not self.inside:
                for i, t in enumerate(_tensors(out, records=False)):
                    node = self._add(GraphNode(f"output{i}", "output", f"output {i}", "Tensor", (),
                                               (tuple(t.shape),)))
                    src = self.producer.get(t)
                    if src is not None:
                        self.edges[(src, node.id)] = None
        return hook

    def _on_op(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        if self.inside:
            return
        srcs = list(dict.fromkeys(s for t in _tensors((args, kwargs)) if (s := self.producer.get(t)) is not None))
        if not srcs:
            return  # made from parameters or constants only (masks, positions): not data flow
        name = _op_name(func._overloadpacket)
        outs = list(_tensors(out))
        if name in _PASS_THROUGH and len(srcs) == 1:
            for t in outs:
                self.producer[t] = srcs[0]
            return
        node = self._add(GraphNode(f"op{len(self.nodes)}", "op", name, name,
                                   tuple(self.stack_clusters()), tuple(tuple(t.shape) for t in outs[:1])))
        for s in srcs:
            self.edges[(s, node.id)] = None
        for t in outs:
            self.producer[t] = node.id

    # -- helpers -------------------------------------------------------------------------
    def _add(self, node: GraphNode) -> GraphNode:
        self.nodes.append(node)
        return node

    def stack_clusters(self) -> list[str]:
        return [c for c in self.stack if c in self.containers]

    def _clusters(self, name: str) -> tuple[str, ...]:
        parts = name.split(".")
        return tuple(a for i in range(1, len(parts)) if (a := ".".join(parts[:i])) in self.containers)

    def graph(self, *, fold: bool = True) -> ModelGraph:
        g = ModelGraph(tuple(self.nodes), tuple(self.edges), dict(self.containers))
        return fold_ops(fold_runs(g, self.model, self.names)) if fold else g


def _make_mode(on_op: Callable[..., None]) -> Any:
    import sys

    from torch.utils._python_dispatch import TorchDispatchMode

    class GraphMode(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return "torch._dynamo" in sys.modules  # as in methods/summary.py's MAC counter

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            on_op(func, args, kwargs, out)
            return out

    return GraphMode()


def _own_params(model: nn.Module) -> dict[str, int]:
    """Parameters per module and subtree, each tensor once: name -> subtree count."""
    seen: set[int] = set()
    own: dict[str, int] = {}
    for n, m in model.named_modules():
        total = 0
        for p in m.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
        own[n] = total
    sub: dict[str, int] = defaultdict(int)
    for n, v in own.items():
        parts = n.split(".") if n else []
        for i in range(len(parts) + 1):
            sub[".".join(parts[:i])] += v
    return dict(sub)


def fold_runs(g: ModelGraph, model: nn.Module, names: dict[int, str], run: int = FOLD_RUN) -> ModelGraph:
    """Draw the middle of each run of ``run`` or more sibling blocks of one type and size (a transformer's
    layers, a ResNet stage) as one node: the first and last block stay whole."""
    params = _own_params(model)
    members: dict[str, str] = {}  # block name -> folded node id
    folded: list[GraphNode] = []
    for parent in [""] + list(g.clusters):
        if any(parent == k or parent.startswith(k + ".") for k in members):
            continue  # inside a block already folded
        # same type and same size: repeats of one block (not a network's differing stages)
        kids = [(names[id(c)], f"{type(c).__name__}/{params.get(names[id(c)], 0)}")
                for c in _module(model, parent).children()]
        kids = [(k, t) for k, t in kids if k in g.clusters]
        i = 0
        while i < len(kids):
            j = i
            while j < len(kids) and kids[j][1] == kids[i][1]:
                j += 1
            if j - i >= run:
                mid = [k for k, _ in kids[i + 1:j - 1]]
                fid = f"fold:{mid[0]}"
                for k in mid:
                    members[k] = fid
                first_clusters = tuple(c for c in _chain(mid[0], g.clusters) if c != mid[0])
                folded.append(GraphNode(fid, "folded", f"{mid[0]} … {mid[-1].rsplit('.', 1)[-1]}", kids[i][1].split("/")[0], first_clusters,
                                        (), sum(params.get(k, 0) for k in mid), len(mid)))
            i = j
    if not members:
        return g
    rep: dict[str, str] = {}
    for n in g.nodes:
        owner = next((members[c] for c in (*n.clusters, n.name) if c in members), None)
        if owner is not None:
            rep[n.id] = owner
    by_id = {f.id: f for f in folded}
    nodes: list[GraphNode] = []
    for n in g.nodes:  # a folded node goes where its first member was, with its last block's shapes
        fid = rep.get(n.id)
        if fid is None:
            nodes.append(n)
        elif fid in by_id:
            nodes.append(by_id.pop(fid))
        if fid is not None and n.kind == "module":
            i = next(i for i, x in enumerate(nodes) if x.id == fid)
            nodes[i] = replace(nodes[i], shapes=n.shapes)
    edges: dict[tuple[str, str], None] = {}
    for a, b in g.edges:
        a2, b2 = rep.get(a, a), rep.get(b, b)
        if a2 != b2:
            edges[(a2, b2)] = None
    clusters = {c: t for c, t in g.clusters.items() if not any(c == k or c.startswith(k + ".") for k in members)}
    return ModelGraph(tuple(nodes), tuple(edges), clusters)


def _module(model: nn.Module, name: str) -> nn.Module:
    return model.get_submodule(name) if name else model


def _chain(name: str, clusters: dict[str, str]) -> tuple[str, ...]:
    parts = name.split(".")
    return tuple(a for i in range(1, len(parts) + 1) if (a := ".".join(parts[:i])) in clusters)


def fold_ops(g: ModelGraph, run: int = FOLD_OPS) -> ModelGraph:
    """Draw each connected group of ``run`` or more operations (other than :data:`KEY_OPS`)
    within one container as one node that names them: a detector's box decoding, not 40 ellipses."""
    kind = {n.id: n for n in g.nodes}
    foldable = {n.id for n in g.nodes if n.kind == "op" and n.name not in KEY_OPS}
    parent = {i: i for i in foldable}

    def root(i: str) -> str:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in g.edges:
        if a in foldable and b in foldable and kind[a].clusters == kind[b].clusters:
            parent[root(a)] = root(b)
    groups: dict[str, list[str]] = defaultdict(list)
    for i in foldable:
        groups[root(i)].append(i)
    rep = {i: f"ops:{members[0]}" for members in groups.values() if len(members) >= run for i in members}
    if not rep:
        return g
    nodes: list[GraphNode] = []
    for n in g.nodes:
        fid = rep.get(n.id)
        if fid is None:
            nodes.append(n)
        elif not any(x.id == fid for x in nodes):
            members = [kind[i] for i in groups[root(n.id)]]
            counts: dict[str, int] = defaultdict(int)
            for mm in members:
                counts[mm.name] += 1
            names = ", ".join(k for k, _ in sorted(counts.items(), key=lambda kv: -kv[1])[:4])
            nodes.append(GraphNode(fid, "op", f"{len(members)} ops: {names}" + (", …" if len(counts) > 4 else ""),
                                   "ops", n.clusters, (), 0, len(members)))
    edges: dict[tuple[str, str], None] = {}
    for a, b in g.edges:
        a2, b2 = rep.get(a, a), rep.get(b, b)
        if a2 != b2:
            edges[(a2, b2)] = None
    return ModelGraph(tuple(nodes), tuple(edges), dict(g.clusters))
