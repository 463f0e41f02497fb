"""The building blocks of ``attributions``: integration rules, baselines, seeded noise,
occlusion windows, and :func:`sweep`, the one loop that pushes rows through the model in
chunks of ``batch_size``.

Every method is a set of *rows*: one per (map, noise sample, integration step) or (map,
occlusion window). Rows are built chunk by chunk from the inputs and folded into per-map
accumulators as they come, so peak memory is one chunk's activations plus the
accumulators, whatever ``steps``/``samples``/the window count (captum#632, #866).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from inspect_model.errors import InputError, UsageError
from inspect_model.methods.attributions.options import RULES, parse_baseline  # noqa: F401 - re-exported



def integration_rule(rule: str, steps: int) -> tuple[list[float], list[float]]:
    """(alphas, weights) of ``steps`` points on [0, 1] for ``rule``; as captum's
    ``approximation_methods``, except the trapezoid rule: captum weights its n points
    (spaced 1/(n-1)) by 1/n, so its weights sum to (n-1)/n and every IG map comes out
    shrunk by that factor; here they are weighted by 1/(n-1) and sum to 1."""
    if steps < 1:
        raise UsageError(f"--steps {steps}: integrated gradients needs at least 1 step")
    n = steps
    if rule == "gauss-legendre":
        import numpy as np

        nodes, w = np.polynomial.legendre.leggauss(n)
        return [float(v) for v in 0.5 * (1 + nodes)], [float(v) for v in 0.5 * w]
    if rule == "riemann-trapezoid":
        if n < 2:
            raise UsageError("--steps 1: the trapezoid rule needs at least 2 steps (both ends)")
        weights = [1.0 / (n - 1)] * n
        weights[0] /= 2
        weights[-1] /= 2
        return torch.linspace(0, 1, n).tolist(), weights
    if rule == "riemann-left":
        return torch.linspace(0, 1 - 1 / n, n).tolist(), [1.0 / n] * n
    if rule == "riemann-right":
        return torch.linspace(1 / n, 1, n).tolist(), [1.0 / n] * n
    if rule == "riemann-middle":
        return torch.linspace(1 / (2 * n), 1 - 1 / (2 * n), n).tolist(), [1.0 / n] * n
    raise UsageError(f"--rule '{rule}' is not one of {', '.join(RULES)}")


# ------------------------------------------------------------------ seeded randomness
def generator(seed: int, *key: Any) -> torch.Generator:
    """A private CPU generator seeded from ``seed`` and ``key`` (image index, sample...):
    the draws of one image do not depend on batching, sharding or the caller's RNG."""
    text = ":".join(str(k) for k in (seed, *key)).encode()
    g = torch.Generator()
    g.manual_seed(int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & (2**63 - 1))
    return g


def draw_noise(seed: int, index: int, sample: int, shape: Sequence[int], sigma: float) -> torch.Tensor:
    """N(0, sigma^2) noise of ``shape`` (float32, CPU) for noise sample ``sample`` of the
    image with global index ``index``."""
    return torch.randn(tuple(shape), generator=generator(seed, "noise", index, sample)) * sigma


def noise_sigma(x: torch.Tensor, noise: float, mode: str) -> float:
    """The noise level of one sample ``x``: ``noise`` times its value range (SmoothGrad,
    Smilkov et al. 2017, sec. 3: sigma / (x_max - x_min)), or ``noise`` itself."""
    if mode == "absolute":
        return float(noise)
    return float(noise) * float(x.max() - x.min())


# ----------------------------------------------------------------------- baselines
BASELINE_MAX_BYTES = 2**30  # an image-sized tensor; a larger file is no baseline


def _check_npy_header(path: Path, size: int) -> None:
    """Refuse a .npy whose header declares more values than the file holds (numpy would
    allocate the declared array before reading)."""
    import numpy as np

    with open(path, "rb") as fh:
        try:
            version = np.lib.format.read_magic(fh)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _order, dtype = read(fh)
        except (ValueError, OSError, SyntaxError, TypeError) as exc:
            raise InputError(f"baseline file '{path}' is not a .npy array: {' '.join(str(exc).split())[:160]}") \
                from exc
    need = math.prod(int(d) for d in shape) * dtype.itemsize
    if need > size:
        raise InputError(f"baseline file '{path}' declares a {'x'.join(map(str, shape))} array of {need:,} bytes "
                         f"but holds {size:,}; it is truncated or forged")


def _load_baseline_file(path: Path) -> torch.Tensor:
    from inspect_model.loading.torch_files import check_regular, load_torch

    try:
        if path.suffix == ".npy":
            import numpy as np

            size = check_regular(path, "baseline file", error=InputError, max_bytes=BASELINE_MAX_BYTES)
            _check_npy_header(path, size)
            return torch.from_numpy(np.load(path, allow_pickle=False))
        obj = load_torch(path, "baseline file", error=InputError, max_bytes=BASELINE_MAX_BYTES)
    except InputError:
        raise
    except Exception as exc:
        msg = (str(exc).strip().splitlines() or [""])[0][:200]
        raise InputError(f"baseline file '{path}' cannot be read as a tensor (.pt with weights_only, or .npy): "
                         f"{msg}") from exc
    if not isinstance(obj, torch.Tensor):
        raise InputError(f"baseline file '{path}' holds a {type(obj).__name__}, not a tensor")
    return obj


def gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """(N, C, H, W) blurred by a separable Gaussian of ``sigma`` pixels (reflect padding,
    kernel 2*ceil(3 sigma)+1 cut to fit the image)."""
    import torch.nn.functional as F

    n, c, h, w = x.shape
    out = x
    for dim, size in ((2, h), (3, w)):
        radius = min(math.ceil(3 * sigma), size - 1)
        if radius < 1:
            continue
        t = torch.arange(-radius, radius + 1, dtype=x.dtype, device=x.device)
        k = torch.exp(-0.5 * (t / sigma) ** 2)
        k = (k / k.sum()).reshape(1, 1, -1, 1) if dim == 2 else (k / k.sum()).reshape(1, 1, 1, -1)
        pad = (0, 0, radius, radius) if dim == 2 else (radius, radius, 0, 0)
        out = F.conv2d(F.pad(out, pad, mode="reflect"), k.expand(c, 1, *k.shape[2:]), groups=c)
    return out


def make_baseline(spec: Any, x: torch.Tensor, *, seed: int, first_index: int,
                  space: str = "input") -> torch.Tensor:
    """The baseline (N, ...) for the batch ``x`` (N, ...), same dtype and device."""
    spec = parse_baseline(spec)
    if isinstance(spec, float):
        return torch.full_like(x, spec)
    if spec == "zeros":
        return torch.zeros_like(x)
    if spec == "uniform":
        rows = []
        for i in range(x.shape[0]):
            lo, hi = float(x[i].min()), float(x[i].max())
            u = torch.rand(tuple(x.shape[1:]), generator=generator(seed, "baseline", first_index + i))
            rows.append(lo + (hi - lo) * u)
        return torch.stack(rows).to(dtype=x.dtype, device=x.device)
    if isinstance(spec, str):  # blur
        if x.dim() != 4 or space != "input":
            raise UsageError(f"--baseline blur needs image inputs (N, C, H, W); this input is "
                             f"{'token embeddings ' if space != 'input' else ''}{tuple(x.shape)}")
        sigma = float(spec[5:]) if spec.startswith("blur:") else max(x.shape[-2:]) / 20.0
        return gaussian_blur(x, sigma)
    t = spec if isinstance(spec, torch.Tensor) else _load_baseline_file(spec)
    what = f"baseline file '{spec}'" if isinstance(spec, Path) else "the baseline tensor"
    sample = tuple(x.shape[1:])
    if tuple(t.shape) == sample or tuple(t.shape) == (1, *sample):
        return t.detach().reshape(1, *sample).to(dtype=x.dtype, device=x.device).expand_as(x)
    if tuple(t.shape) == tuple(x.shape):
        return t.detach().to(dtype=x.dtype, device=x.device)
    where = "embedding output" if space == "embedding" else "input"
    raise InputError(f"{what} has shape {tuple(t.shape)}; the {where} is {sample} per sample: give a tensor "
                     f"of shape {sample} (or (1, {', '.join(map(str, sample))}))")


# ------------------------------------------------------------------ occlusion windows
def window_shape(spec: Sequence[int] | None, sample: Sequence[int], *, space: str, what: str = "--window",
                 default: Sequence[int] | None = None) -> tuple[int, ...]:
    """A full window (or stride) shape for one sample of shape ``sample``: given dims as
    they are; missing dims cover the whole extent, leading ones for images (``15`` is
    (C, 15, 15)), trailing ones for token embeddings (``1`` is one token, all of D)."""
    sample = tuple(int(v) for v in sample)
    dims = tuple(int(v) for v in (spec if spec is not None else default or ()))
    if any(v < 1 for v in dims):
        raise UsageError(f"{what} {','.join(map(str, dims))}: sizes must be 1 or more")
    if len(dims) > len(sample):
        raise UsageError(f"{what} {','.join(map(str, dims))} has {len(dims)} dimensions; the input has "
                         f"{len(sample)} per sample {sample}")
    if len(dims) == 1 and len(sample) == 3 and space == "input":
        dims = (dims[0], dims[0])  # a square window on images
    missing = len(sample) - len(dims)
    if space == "embedding":
        return dims + sample[len(dims):]
    return sample[:missing] + dims


def window_slices(sample: Sequence[int], window: Sequence[int], stride: Sequence[int]) -> list[tuple[slice, ...]]:
    """Every window position (row-major), as captum's Occlusion places them:
    ``ceil((size - window) / stride) + 1`` positions per dimension, the last one cut at the
    input's edge, so that every element is covered."""
    import itertools

    for s, w in zip(sample, window):
        if w > s:
            raise UsageError(f"--window {','.join(map(str, window))} is larger than the input {tuple(sample)}; "
                             "give a window no larger than the input")
    counts = [-(-(s - w) // st) + 1 for s, w, st in zip(sample, window, stride)]
    return [tuple(slice(i * st, i * st + w) for i, st, w in zip(pos, stride, window))
            for pos in itertools.product(*(range(c) for c in counts))]


# ----------------------------------------------------------------------- the sweep
def sweep(n_rows: int, batch_size: int, build: Callable[[torch.Tensor], Any],
          consume: Callable[[torch.Tensor, Any], None], *, progress: Callable[[int, int, str], None] | None = None,
          label: str = "") -> None:
    """Run rows ``0..n_rows-1`` in chunks of ``batch_size``: ``build(rows)`` makes a chunk's
    result (it runs the model), ``consume(rows, result)`` folds it in. Nothing of a chunk
    outlives the next one, so memory is bounded by one chunk."""
    done = 0
    for start in range(0, n_rows, batch_size):
        rows = torch.arange(start, min(start + batch_size, n_rows))
        consume(rows, build(rows))
        done = int(rows[-1]) + 1
        if progress is not None:
            progress(done, n_rows, label)
