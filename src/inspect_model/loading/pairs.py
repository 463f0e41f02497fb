"""Frame pairs for models whose forward takes two images (optical flow: RAFT).

A pair model gets consecutive pairs of the given images (1-2, 3-4, ...; an odd count is an
error) or consecutive frames of each video's clips (``--frames N`` frames give N-1 pairs).
Every command feeds the model one tensor ``x``: here the *first* images (N, C, H, W), so
gradients, saliency and CAM maps are taken with respect to the first frame, drawn on it.
:class:`PairBinding` (a forward pre-hook held for the run, like the several-inputs binding)
turns ``model(x)`` into ``model(x, second)``, the second images of the batch being streamed;
for the gradient commands it also turns RAFT's list of flow predictions into the score
explained: the mean flow magnitude of the final prediction, (N, 1), optionally inside a box.

Preprocessing is torchvision's ``OpticalFlow`` transform (scale to [-1, 1]) after an
optional ``--resize``/``--crop``, then a centre crop to sides divisible by 8 (RAFT's
requirement), recorded for the report.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inspect_model.loading.plans import Plan
from inspect_model.errors import InputError, ModelRuntimeError

if TYPE_CHECKING:
    import torch
    from torch import nn

FLOW_TARGET = "mean_flow_magnitude"


def is_pair_model(loaded: Any) -> bool:
    """torchvision's optical-flow family, or a model whose forward takes exactly two
    required tensors named like two images (``image1, image2``)."""
    task = getattr(loaded, "task", None) or getattr(loaded, "family", None)
    if task == "optical_flow":
        return True
    import inspect

    try:
        params = [p for p in inspect.signature(loaded.model.forward).parameters.values()
                  if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return False
    return len(params) == 2 and all(p.name.rstrip("12") in ("image", "img", "frame") for p in params)


@dataclass
class FlowPreprocess:
    """Optional resize (shorter side) and square crop, then a centre crop to multiples of 8,
    then [0, 1] -> [-1, 1] (torchvision's OpticalFlow transform)."""

    resize: int | None = None
    crop: int | None = None
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    multiple: int = 8
    source: str = "OpticalFlow transform (weights)"
    interpolation: str = "bilinear"

    def describe(self) -> dict[str, Any]:
        return {"resize": self.resize, "crop": self.crop, "mean": list(self.mean), "std": list(self.std),
                "interpolation": self.interpolation, "source": self.source, "multiple_of": self.multiple}

    def _sizes(self, width: int, height: int) -> tuple[float, float, float, float]:
        """(resized w, h, crop w, h)."""
        s = self.resize / min(width, height) if self.resize else 1.0
        rw, rh = round(width * s), round(height * s)
        cw, ch = (min(self.crop, rw), min(self.crop, rh)) if self.crop else (rw, rh)
        return rw, rh, cw - cw % self.multiple, ch - ch % self.multiple

    def uncrop_box(self, width: int, height: int) -> tuple[float, float, float, float]:
        rw, rh, cw, ch = self._sizes(width, height)
        sx, sy = rw / width, rh / height
        left, top = (rw - cw) // 2, (rh - ch) // 2
        return (left / sx, top / sy, (left + cw) / sx, (top + ch) / sy)

    def __call__(self, img: Any) -> torch.Tensor:
        import torch
        from torchvision.transforms import functional as F

        w, h = img.size
        rw, rh, cw, ch = self._sizes(w, h)
        if cw < self.multiple or ch < self.multiple:
            raise InputError(f"an image of {w}x{h} is too small for a flow model (sides of at least "
                             f"{self.multiple} after --resize/--crop)")
        if self.resize:
            img = F.resize(img, [int(rh), int(rw)])
        t = F.pil_to_tensor(img)
        left, top = (int(rw) - int(cw)) // 2, (int(rh) - int(ch)) // 2
        t = t[:, top:top + int(ch), left:left + int(cw)]
        t = F.convert_image_dtype(t, torch.float)
        return F.normalize(t, list(self.mean), list(self.std))


@dataclass
class LoadedPair:
    """A pair: the first image (what maps are drawn on), the second, and where both came from."""

    path: Path
    image: Any  # PIL, the first image
    second: Any  # PIL
    names: tuple[str, str]
    frames: tuple[int, int] | None = None  # frame indices, for a pair out of a video
    times: tuple[float | None, float | None] | None = None
    warnings: list[str] = field(default_factory=list)
    original_mode: str = "RGB"

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"images": list(self.names)}
        if self.frames is not None:
            d["frames"] = list(self.frames)
            d["times"] = [None if t is None else round(t, 6) for t in self.times or (None, None)]
        return d


class PairBinding:
    """``model(x)`` -> ``model(x, second)`` for the current batch (see the module docstring)."""

    def __init__(self, objective: bool = False) -> None:
        self.objective = objective
        self.boxes: dict[str, list[Any]] = {}  # first image's path -> boxes (x0, y0, x1, y1), its pixels
        self.masks: list[Any] = []  # per row of the batch: the boxes' region in model-input pixels, or None
        self.first: Any = None
        self.second: Any = None
        self.flows: dict[str, Any] = {}  # name -> final flow (2, H, W) of the current batch
        self.names: list[str] = []

    def describe(self) -> dict[str, Any]:
        return {"pairs": "consecutive", "second_input": "image2", "objective": FLOW_TARGET if self.objective else None}

    def set_batch(self, first: torch.Tensor, second: torch.Tensor, names: list[str],
                  pairs: list[Any] | None = None, preprocess: Any = None) -> None:
        self.first, self.second, self.names, self.flows = first, second, list(names), {}
        self.masks = [self._mask(p, preprocess, first.shape[-2:]) for p in pairs] if pairs and self.boxes else []

    def _mask(self, pair: Any, pre: Any, hw: Any) -> Any:
        """The union of the pair's boxes (first image's pixels) in model-input pixels, or None."""
        import torch

        boxes = self.boxes.get(str(getattr(pair, "path", "")))
        if not boxes or pair is None:
            return None
        w, h = pair.image.size
        x0c, y0c, x1c, y1c = pre.uncrop_box(w, h)  # the crop in the first image's pixels
        sx, sy = hw[1] / (x1c - x0c), hw[0] / (y1c - y0c)
        mask = torch.zeros(*hw, dtype=torch.bool)
        for x0, y0, x1, y1 in boxes:
            c0, c1 = max(0, int((x0 - x0c) * sx)), min(hw[1], int(round((x1 - x0c) * sx)))
            r0, r1 = max(0, int((y0 - y0c) * sy)), min(hw[0], int(round((y1 - y0c) * sy)))
            mask[r0:max(r1, r0 + 1), c0:max(c1, c0 + 1)] = True
        return mask

    def second_for(self, x: torch.Tensor) -> torch.Tensor:
        import torch

        if self.second is None:
            raise ModelRuntimeError("a flow model was called before its frame pairs were read")
        n, k = int(self.second.shape[0]), int(x.shape[0])
        if k == n:
            return self.second.to(device=x.device, dtype=x.dtype)
        if k < n and torch.equal(x.detach(), self.first[:k].to(x.device, x.dtype)):
            return self.second[:k].to(device=x.device, dtype=x.dtype)  # a probe of the first sample(s)
        raise ModelRuntimeError(f"a flow model got a batch of {k} first frames that are not the {n} read; "
                                "methods that perturb the input (Score-CAM, --evaluate) do not apply to pairs")

    def score(self, flow: torch.Tensor) -> torch.Tensor:
        """(N, 2, H, W) flow -> (N, 1): mean of |flow| over the image, or over the pair's
        boxes (``cam --boxes``)."""
        import torch

        mag = flow.float().pow(2).sum(dim=1).add(1e-12).sqrt()  # (N, H, W); eps: a zero flow still has a gradient
        rows = []
        for i in range(mag.shape[0]):
            m = self.masks[i] if i < len(self.masks) else None
            rows.append(mag[i].mean() if m is None else mag[i][m.to(mag.device)].mean())
        return torch.stack(rows)[:, None].to(flow.dtype)

    @contextmanager
    def bound(self, model: nn.Module) -> Iterator[None]:
        def pre(mod: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
            if len(args) == 1 and not kwargs:
                return (args[0], self.second_for(args[0])), {}
            return None

        def post(mod: nn.Module, args: tuple, out: Any) -> Any:
            final = final_flow(out)
            if final is not None and final.shape[0] == len(self.names):
                self.flows = {n: final[i].detach().float().cpu() for i, n in enumerate(self.names)}
            if self.objective and final is not None:
                return self.score(final)
            return None

        handles = [model.register_forward_pre_hook(pre, with_kwargs=True, prepend=True),
                   model.register_forward_hook(post)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def flow_picture(self, name: str) -> Any:
        """The flow of pair ``name`` as torchvision's flow_to_image colours (PIL), or None."""
        flow = self.flows.pop(name, None)
        if flow is None:
            return None
        from PIL import Image
        from torchvision.utils import flow_to_image

        return Image.fromarray(flow_to_image(flow).permute(1, 2, 0).numpy())


def final_flow(out: Any) -> torch.Tensor | None:
    """RAFT returns a list of predictions, the last the final one; a tensor is itself."""
    import torch

    if isinstance(out, torch.Tensor):
        return out if out.dim() == 4 and out.shape[1] == 2 else None
    if isinstance(out, (list, tuple)) and out and isinstance(out[-1], torch.Tensor):
        return final_flow(out[-1])
    return None


def pair_images(paths: list[Path]) -> list[Path]:
    """The still images among ``paths``, checked to pair up (videos give their own pairs)."""
    from inspect_model.loading.video import is_video

    images = [p for p in paths if not is_video(p) and not p.is_dir()]
    if len(images) % 2:
        raise InputError(f"a flow model takes pairs of images: {len(images)} image(s) given, an odd number; "
                         "give an even number (1-2, 3-4, ...) or a video")
    return images


@dataclass
class PairPlan(Plan):
    """Pairs of the given images or video frames, streamed in batches of first images, the
    second ones handed to :class:`PairBinding` (same fields as ``InputPlan``)."""

    paths: list[Path]
    preprocess: FlowPreprocess
    binding: PairBinding
    batch_size: int
    options: Any = None  # video.ClipOptions: frames per clip give frames-1 pairs
    seed: int = 0
    skip_bad: bool = False
    device: Any = "cpu"
    dtype: Any = None
    input_size: tuple[int, ...] | None = None  # random pairs when no paths
    channels: int = 3
    fill: str = "random"
    skipped: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    processed: int = 0
    records: dict[str, dict[str, Any]] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        opts = self.options
        return {"images": [str(p) for p in self.paths],
                "preprocessing": self.preprocess.describe() if self.paths else None,
                "input_size": list(self.input_size) if self.input_size and not self.paths else None,
                "batch_size": self.batch_size, "channels": self.channels, "seed": self.seed,
                "fill": None if self.paths else self.fill, "skip_bad_inputs": self.skip_bad,
                "pairs": {"frames": opts.frames if opts else None, "stride": opts.stride if opts else 1,
                          "clips": opts.clips if opts else 1}}

    def extra_record(self, name: str) -> dict[str, Any]:
        rec = self.records.get(name)
        return {"pair": rec} if rec is not None else {}

    def __post_init__(self) -> None:
        from inspect_model.loading.samples import Samples

        self.samples = Samples(self._samples)

    def units(self) -> list[str]:
        """The pairs, by name: what shards and checkpoints count (loading/samples.py)."""
        return self.samples.units() if self.paths else []

    def select(self, names: list[str] | None) -> None:
        self.samples.select(names)

    def _samples(self) -> list[Any]:
        from inspect_model.loading.samples import Sample, probed
        from inspect_model.loading.video import ClipOptions, clip_indices

        images = pair_images(self.paths)
        still = set(images)
        out: list[Sample] = []
        opts = self.options or ClipOptions()
        frames = opts.frames or 2
        seen = 0
        for p in self.paths:
            if p in still:
                if seen % 2 == 0:
                    out.append(Sample(str(p), p, second=images[seen + 1]))
                seen += 1
                continue
            if frames < 2:
                raise InputError("a flow model needs --frames 2 or more (N frames give N-1 pairs)")
            info, error = probed(p, self.skip_bad)
            if info is None:
                out.append(Sample(str(p), p, error=error))
                continue
            plans = clip_indices(info.frames, frames, opts.stride, opts.clips, name=f"video '{p}'")
            for k, idx in enumerate(plans):
                tag = f"#clip{k}" if len(plans) > 1 else ""  # overlapping clips share pairs
                out += [Sample(f"{p}{tag}#{a:06d}-{b:06d}", p, k, (a, b), info=info) for a, b in zip(idx, idx[1:])]
        return out

    def _pairs(self) -> Iterator[tuple[str, Any, Any, LoadedPair | None]]:
        from inspect_model.loading.images import load_image
        from inspect_model.loading.samples import by_clip

        for group in by_clip(self.samples.chosen()):
            s = group[0]
            if s.second is not None:
                a, b = load_image(s.path), load_image(s.second)
                yield (s.name, self.preprocess(a.image), self.preprocess(b.image),
                       LoadedPair(a.path, a.image, b.image, (str(a.path), str(b.path))))
            elif s.info is None:
                self.skipped.append((str(s.path), str(s.error)))
            else:
                yield from self._video_pairs(group)

    def _video_pairs(self, group: list[Any]) -> Iterator[tuple[str, Any, Any, LoadedPair]]:
        """The pairs of one clip, its frames decoded once."""
        from inspect_model.loading.video import display_copy, read_frames

        path = group[0].path
        decoded = {f.index: f for f in read_frames(group[0].info, sorted({i for s in group for i in s.indices}))}
        tensors = {i: self.preprocess(f.image) for i, f in decoded.items()}
        for s in group:
            a, b = decoded[s.indices[0]], decoded[s.indices[1]]
            yield (s.name, tensors[a.index], tensors[b.index],
                   LoadedPair(path, display_copy(a.image), display_copy(b.image),
                              (f"{path}#{a.index}", f"{path}#{b.index}"), (a.index, b.index), (a.time, b.time)))

    def batches(self) -> Iterator[Any]:
        import torch

        from inspect_model.loading.batch import InputBatch

        dtype = self.dtype or torch.float32
        self.processed = 0
        if not self.paths:
            from inspect_model.loading.shapes import make_example_inputs

            assert self.input_size is not None
            x, y = make_example_inputs([self.input_size, self.input_size], batch_size=self.batch_size, dtype=dtype,
                                       device=self.device, seed=self.seed, fill=self.fill)
            names = [f"{self.fill}-{i}" for i in range(self.batch_size)]
            self.binding.set_batch(x, y, names)
            self.processed = self.batch_size
            yield InputBatch(x, names, None)
            return
        group: list[tuple[str, Any, Any, LoadedPair | None]] = []

        def flush() -> InputBatch:
            names = [g[0] for g in group]
            x = torch.stack([g[1] for g in group]).to(device=self.device, dtype=dtype)
            y = torch.stack([g[2] for g in group]).to(device=self.device, dtype=dtype)
            self.records = {g[0]: g[3].describe() for g in group if g[3] is not None}
            self.binding.set_batch(x, y, names, [g[3] for g in group], self.preprocess)
            self.processed += len(names)
            return InputBatch(x, names, [g[3] for g in group])

        for item in self._pairs():
            if item[1].shape != item[2].shape:
                raise InputError(f"the two images of pair '{item[0]}' differ in size after preprocessing "
                                 f"({tuple(item[1].shape[1:])} and {tuple(item[2].shape[1:])}); give same-size "
                                 "images, or --resize and --crop")
            if group and item[1].shape != group[0][1].shape:
                yield flush()
                group = []
            group.append(item)
            if len(group) == self.batch_size:
                yield flush()
                group = []
        if group:
            yield flush()
