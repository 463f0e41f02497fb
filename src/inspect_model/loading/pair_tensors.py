"""Frame pairs given as a tensor by the Python API (a flow model: RAFT).

Two layouts are taken, both as the model input already (no preprocessing):

- ``(2N, C, H, W)``: a batch of images, paired as the CLI pairs image files: images 0-1,
  2-3, ... (an odd count is an error). Names, when given, are one per image; a pair is named
  after its first image.
- ``(N, 2, C, H, W)``: N pairs, ``x[:, 0]`` the first images. Names are one per pair; its
  images are ``NAME[0]`` and ``NAME[1]``. For the overlapping pairs of a frame sequence
  ``v`` (T, C, H, W), as the CLI takes a video's frames (0-1, 1-2, ...), pass
  ``torch.stack([v[:-1], v[1:]], 1)``.

The first images stream as the batches; the second ones go to the plan's
:class:`~inspect_model.loading.pairs.PairBinding`, as for pairs read from files.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inspect_model.errors import InputError
from inspect_model.loading.inputs import TensorPlan

if TYPE_CHECKING:
    import torch

LAYOUTS = "(2N, C, H, W) images paired 0-1, 2-3, ... or (N, 2, C, H, W) pairs"


def split_pairs(x: torch.Tensor, names: list[str] | None) -> tuple[Any, Any, list[str], list[list[str]]]:
    """(first images, second images, pair names, the two image names of each pair)."""
    shape = tuple(int(d) for d in x.shape)
    if x.dim() == 5:
        if shape[1] != 2:
            raise InputError(f"a flow model takes pairs: a 5-D tensor must be (N, 2, C, H, W), got {shape}; "
                             f"give {LAYOUTS}")
        n = shape[0]
        names = _named(names, n, "pair", "pair(s)")
        return x[:, 0], x[:, 1], names, [[f"{m}[0]", f"{m}[1]"] for m in names]
    if x.dim() == 4:
        if shape[0] % 2:
            raise InputError(f"a flow model takes pairs: a tensor of {shape[0]} images is an odd number; "
                             f"give {LAYOUTS}")
        names = _named(names, shape[0], "input", "image(s)")
        return x[0::2], x[1::2], names[0::2], [[a, b] for a, b in zip(names[0::2], names[1::2])]
    raise InputError(f"a flow model takes pairs of images: a tensor of shape {shape} is neither; give {LAYOUTS}")


def _named(names: list[str] | None, n: int, stem: str, what: str) -> list[str]:
    if names is None:
        return [f"{stem}-{i}" for i in range(n)]
    if len(names) != n:
        one = "image" if stem == "input" else stem
        raise InputError(f"{len(names)} names for a tensor of {n} {what}: give one name per {one}")
    return [str(m) for m in names]


@dataclass
class TensorPairPlan(TensorPlan):
    """Pairs of a tensor (see the module docstring); ``tensor`` holds the first images."""

    second: Any = None
    binding: Any = None  # pairs.PairBinding
    pairs: list[list[str]] = field(default_factory=list)
    layout: str = ""

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "pairs": {"layout": self.layout, "count": int(self.tensor.shape[0])}}

    def extra_record(self, name: str) -> dict[str, Any]:
        assert self.names is not None
        i = self.names.index(name) if name in self.names else None
        return {"pair": {"images": list(self.pairs[i])}} if i is not None else {}

    def batches(self) -> Iterator[Any]:
        from inspect_model.loading.batch import InputBatch

        assert self.names is not None
        x, y = self.tensor.detach(), self.second.detach()
        for start in range(0, int(x.shape[0]), self.batch_size):
            end = start + self.batch_size
            self.binding.set_batch(x[start:end], y[start:end], self.names[start:end])
            yield InputBatch(x[start:end], self.names[start:end], None)


def tensor_plan(loaded: Any, x: torch.Tensor, *, names: list[str] | None, batch_size: int, seed: int) -> TensorPlan:
    """A flow model's tensor as pairs (:class:`TensorPairPlan`), any other model's as is."""
    from inspect_model.loading.media import media_task

    if media_task(loaded) != "optical_flow":
        return TensorPlan(x, names=names, batch_size=batch_size, seed=seed)
    from inspect_model.loading.pairs import PairBinding

    first, second, pair_names, pairs = split_pairs(x, names)
    layout = "(N, 2, C, H, W)" if x.dim() == 5 else "(2N, C, H, W): images 0-1, 2-3, ..."
    return TensorPairPlan(first, pair_names, min(batch_size, int(first.shape[0])) or 1, seed, second=second,
                          binding=PairBinding(), pairs=pairs, layout=layout)
