"""The passes behind ``cam``: one forward with the CAM layer as graph root, partial backwards,
and Score-CAM's batched masked forwards. Each returns tensors; nothing is printed.

:func:`capture` runs one forward pass with ``layers[0]``'s output made a graph root by the
hook engine and every parameter frozen, so nothing below the layer builds an autograd graph;
then one backward per target rank runs from the summed class scores down to the layer only.
Hooks, flags and ``requires_grad`` are restored by the engine, also on failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inspect_model.errors import LayerSelectionError, UsageError, one_line
from inspect_model.methods.cam import maths as cm
from inspect_model.methods.cam.layers import single_output

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass
class Captured:
    scores: Any  # (N, classes) detached
    classes: Any  # (N, K) long
    acts: dict[str, Any]  # name -> raw-layout activations
    grads: dict[str, list[Any]]  # name -> K gradients (raw layout)
    fc_in: Any = None
    fc_out: Any = None


def resolve_classes(scores: torch.Tensor, target: Any) -> torch.Tensor:
    import torch

    from inspect_model.methods.objectives.targets import TargetSpec, parse_target, resolve_targets

    if isinstance(target, str):
        target = parse_target(target)
    if isinstance(target, TargetSpec):
        return torch.tensor(resolve_targets(target, scores), dtype=torch.long, device=scores.device)
    rows = [[int(i)] if isinstance(i, int) or not isinstance(i, (list, tuple)) else [int(v) for v in i]
            for i in target]
    if len(rows) != scores.shape[0] or len({len(r) for r in rows}) != 1 or not rows[0]:
        raise UsageError(f"class indices must give the same number (>= 1) of classes for each of the "
                         f"{scores.shape[0]} samples; got {rows}")
    idx = torch.tensor(rows, dtype=torch.long, device=scores.device)
    n_classes = scores.shape[1]
    if int(idx.min()) < 0 or int(idx.max()) >= n_classes:
        from inspect_model.errors import InputError

        raise InputError(f"class index {int(idx.max()) if int(idx.max()) >= n_classes else int(idx.min())} "
                         f"is out of range: the model has {n_classes} classes (0..{n_classes - 1})")
    return idx


def scores_of(out: Any, output_key: str | None, n: int | None = None) -> torch.Tensor:
    """The (N, classes) scores of ``out``; a single score per sample (a binary classifier's
    (N,) logit) is one class, (N, 1), as guided backprop and attributions take it. With ``n``
    the batch is checked: a squeezed (classes,) output of one input is no batch of scores."""
    from inspect_model.errors import ModelRuntimeError
    from inspect_model.methods.objectives.targets import select_output

    scores = select_output(out, output_key)
    if scores.dim() == 1 and (n is None or scores.shape[0] == n):
        scores = scores[:, None]
    if scores.dim() != 2 or (n is not None and scores.shape[0] != n):
        raise ModelRuntimeError(
            f"the model output has shape {tuple(scores.shape)}; a class activation map needs class "
            f"scores (N, classes) for the batch of {n or 'N'}; use --output-key to pick another output")
    return scores


def capture(model: nn.Module, x: torch.Tensor, layers: list[str], *, grads: bool, target: Any,
             output_key: str | None, fc: str | None, classes: Any = None) -> tuple[Captured, list[str]]:
    """One forward (and with ``grads`` one partial backward per target rank) with ``layers[0]``
    as the graph root. Returns what was captured and the layers that received no gradient
    (they do not depend on the root: the caller gives them a pass of their own)."""
    import torch

    from inspect_model.engine.hooks import CaptureOptions, HookEngine, run_forward
    from inspect_model.errors import ModelRuntimeError
    from inspect_model.methods.objectives.targets import require_float

    hooked = list(layers) + ([fc] if fc and fc not in layers else [])
    opts = CaptureOptions(
        outputs=True, inputs=fc is not None, keep=set(hooked),
        output_grads=grads, keep_grads=set(layers) if grads else False,
        graph_roots={layers[0]} if grads else (),
        freeze_params=grads, grad_enabled=grads,
    )
    missing: list[str] = []
    with HookEngine(model, hooked, opts) as eng:
        # A copy: the model may change its input in place (x /= 255), and ``x`` is used again.
        out = run_forward(eng, lambda: model(x.clone()))
        scores = scores_of(out, output_key, int(x.shape[0]))
        idx = resolve_classes(scores, target) if classes is None else classes
        recs: dict[str, Any] = {}
        for r in eng.finalize():
            recs[r.name] = r  # the last call of a reused module wins
        caps = {}
        for n in layers:
            if n not in recs:
                raise LayerSelectionError(f"layer '{n}' is not called in the forward pass; pick a layer that runs")
            caps[n] = single_output(recs[n], n)
        got: dict[str, list[Any]] = {n: [] for n in layers}
        if grads:
            require_float(scores)
            if not scores.requires_grad:
                raise LayerSelectionError(
                    f"the model output does not depend on layer '{layers[0]}'; pick a layer on the path "
                    "to the output")
            for j in range(idx.shape[1]):
                for cap in caps.values():
                    cap.grad = None
                sel = scores.gather(1, idx[:, j:j + 1]).sum()  # samples are independent: one call
                try:
                    # Only the root leaf requires grad (parameters are frozen), so this runs
                    # from the scores down to the layer and no further.
                    torch.autograd.backward(sel, retain_graph=j < idx.shape[1] - 1)
                except RuntimeError as exc:
                    raise ModelRuntimeError(f"backward pass failed: {one_line(exc)}") from exc
                for n, cap in caps.items():
                    got[n].append(cap.grad)
            missing = [n for n in layers[1:] if any(g is None for g in got[n])]
            if any(g is None for g in got[layers[0]]):
                raise LayerSelectionError(f"the class scores do not depend on layer '{layers[0]}'; "
                                          "pick a layer on the path to the output")
        fc_in = fc_out = None
        if fc is not None and fc in recs:
            r = recs[fc]
            fc_in = r.inputs[0].tensor if r.inputs else None
            fc_out = r.outputs[0].tensor if r.outputs else None
        result = Captured(
            scores=scores.detach(), classes=idx,
            acts={n: caps[n].tensor for n in layers if n not in missing},
            grads={n: got[n] for n in layers if n not in missing} if grads else {},
            fc_in=fc_in, fc_out=fc_out)
    return result, missing


def classifier(model: nn.Module) -> str | None:
    from torch import nn

    last = None
    for n, m in model.named_modules():
        if isinstance(m, nn.Linear):
            last = n
    return last


def check_cam(model: nn.Module, fc: str | None, layer: str, A: torch.Tensor, cap: Captured) -> torch.Tensor:
    """The classifier weight (classes, C) when the net ends in GAP over ``layer`` + one linear
    layer (checked numerically on this batch), else a clear refusal."""
    import torch

    hint = ("; use --method gradcam, which equals CAM up to scale on networks that fit")
    if fc is None or cap.fc_in is None:
        raise UsageError(f"--method cam needs a network that ends in global average pooling and one "
                         f"linear layer; {type(model).__name__} has no linear classifier{hint}")
    gap = A.float().mean(dim=tuple(range(2, A.dim())))  # over (h, w), or a clip's (t, h, w)
    fc_in = cap.fc_in.float().reshape(cap.fc_in.shape[0], -1)
    tol = 1e-4 * float(gap.abs().max().clamp_min(1.0))
    fits_in = fc_in.shape == gap.shape and torch.allclose(fc_in, gap, rtol=1e-3, atol=tol)
    out_tol = 1e-4 * float(cap.scores.abs().max().clamp_min(1.0))
    fits_out = cap.fc_out is not None and cap.fc_out.shape == cap.scores.shape and \
        torch.allclose(cap.fc_out.float(), cap.scores.float(), rtol=1e-3, atol=out_tol)
    if not (fits_in and fits_out):
        why = (f"the input of '{fc}' is not the global average of layer '{layer}'" if not fits_in
               else f"the output is not the output of '{fc}'")
        raise UsageError(f"--method cam needs a network that ends in global average pooling and one "
                         f"linear layer after the CAM layer: {why}{hint}")
    return dict(model.named_modules())[fc].weight.detach()


def scorecam(model: nn.Module, x: torch.Tensor, A: torch.Tensor, classes: torch.Tensor,
             output_key: str | None, batch: int | None, progress: Any = None) -> tuple[torch.Tensor, int]:
    """Score-CAM's channel weights (N, K, C), the target's softmax probability on each
    masked input, and the number of masked forward passes run.

    Only distinct masked inputs are run (:func:`distinct_masks`): channels of one image whose
    min-max normalised maps are equal give the same mask, and a constant channel gives the
    all-zero input, the same for every image. The distinct inputs are one queue, cut into
    passes of ``batch`` (default :func:`scorecam_batch_size`) across images as well as
    channels, run on an inference copy of the model (:mod:`.inference_copy`).
    ``progress(done, total, label)`` is called after each pass (a bar on the CLI: these
    passes are the long part)."""
    import torch

    from inspect_model.engine.hooks import CaptureOptions, HookEngine, run_forward
    from inspect_model.methods.inference_copy import InferenceRunner

    n, c = A.shape[0], A.shape[1]
    hw = tuple(x.shape[2:]) if x.dim() == 5 else (x.shape[-2], x.shape[-1])  # a clip: (T, H, W)
    reps, inverse = distinct_masks(A)  # reps: rows img * c + ch (-1: the zero input)
    rows = len(reps)
    batch = scorecam_batch_size(x, rows, batch)
    picked_all = torch.empty(rows, n, classes.shape[1], dtype=torch.float32, device=A.device)
    total = -(-rows // batch)
    # No hooks: the engine only puts the model in eval mode without grad, and restores it.
    with HookEngine(model, [], CaptureOptions(outputs=False, grad_enabled=False)) as eng:
        runner = InferenceRunner(model, lambda m: run_forward(eng, lambda: model(m)),
                                 lambda out: scores_of(out, output_key), rows)
        for passes, start in enumerate(range(0, rows, batch), 1):
            rep = reps[start:start + batch].to(A.device)
            img, ch = rep.clamp_min(0) // c, rep.clamp_min(0) % c
            masks = cm.scorecam_masks(A[img, ch], hw).to(x.dtype)  # (B, H, W), rows independent
            masks[rep < 0] = 0  # the constant channels' input: all zero
            masked = x[img.to(x.device)] * masks[:, None].to(x.device)  # (B, Cin, H, W)
            probs = runner.probs(masked)  # (B, classes)
            # The zero input serves every image: read each image's classes from every row.
            picked = probs[:, classes.reshape(-1).to(probs.device)].reshape(len(rep), n, -1)
            picked_all[start:start + len(rep)] = picked.to(picked_all.device)
            if progress is not None:
                progress(passes, total, "scorecam: masked forward passes")
    # weights[i, :, k] = the probabilities of image i's classes on the input of its channel k
    own = torch.arange(n, device=A.device).repeat_interleave(c)
    weights = picked_all[inverse.to(A.device), own].reshape(n, c, -1).transpose(1, 2).contiguous()
    return weights, total


def distinct_masks(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The masked inputs Score-CAM must run: ``reps`` (R,), a row ``img * C + ch`` standing
    for every channel of that image with the same min-max normalised map (the masks are equal:
    upsampling is linear and the normalisation takes out scale and offset), and -1 for the
    all-zero input of the constant channels (one for the whole batch); ``inverse`` (N * C,):
    each channel's position in ``reps``. Maps are compared on the normalised low-resolution
    activations rounded to 2^-20 (a channel times a scale plus an offset normalises to the
    same map up to float rounding); merged masks differ by at most 1e-6, far below the
    1e-4 to which the inference copy is checked."""
    import torch

    n, c = A.shape[0], A.shape[1]
    flat = A.reshape(n, c, -1).float()
    lo, hi = flat.min(dim=2, keepdim=True).values, flat.max(dim=2, keepdim=True).values
    span = hi - lo
    norm = torch.where(span > 0, (flat - lo) / span.clamp_min(1e-30), torch.zeros_like(flat))
    norm = torch.round(norm * QUANTUM) / QUANTUM
    constant = (span <= 0).reshape(-1)
    reps: list[torch.Tensor] = []
    inverse = torch.empty(n * c, dtype=torch.long)
    offset = 1 if bool(constant.any()) else 0
    if offset:
        reps.append(torch.tensor([-1]))
    for i in range(n):
        keep = ~constant[i * c:(i + 1) * c].cpu()
        uniq, inv = torch.unique(norm[i][keep.to(norm.device)].cpu(), dim=0, return_inverse=True)
        first = torch.full((len(uniq),), c, dtype=torch.long)
        chans = torch.arange(c)[keep]
        first.scatter_reduce_(0, inv, chans, reduce="amin")  # the first channel of each pattern
        inv_full = torch.zeros(c, dtype=torch.long)  # the constant channels point at row 0
        inv_full[keep] = inv + offset
        inverse[i * c:(i + 1) * c] = inv_full
        reps.append(first + i * c)
        offset += len(uniq)
    return torch.cat(reps), inverse


QUANTUM = 1 << 20  # distinct_masks: normalised maps equal to 2^-20 are one mask
SCORECAM_MAX_BATCH = 256
# A CPU's cores are busy at a few dozen inputs per pass; larger passes only leave the caches:
# resnet50 at 64 px on this 2-core CPU ran 2048 masked inputs in 6.4-6.9 s at 32-64 per pass,
# 7.8 s at 128 or 16, and 11.5 s at 256.
CPU_MAX_BATCH = 64
# ... and large inputs want fewer: a pass's activations outgrow the caches, and blocks beyond
# glibc's largest heap block (32 MiB) are mapped afresh and page-faulted in on every pass.
# No-grad passes at 224 px on this CPU: resnet18 21 ms an input at 5-8 per pass, 31 ms at 64;
# resnet50 53 ms at 5, 119 ms at 64 (benchmarks/bench_evaluate.py's rows). At most this many
# bytes of input per pass: 6 inputs of 3x224x224, 27 of 3x112x112, 85 (so 64) of 3x64x64.
CPU_CHUNK_BYTES = 4 << 20
CPU_BUDGET = 1 << 30  # bytes of masked inputs and their activations in flight on a CPU
# Bytes per masked input, in units of one input's bytes: a no-grad forward of resnet50 at 224 px
# peaks at 17x (torch's allocator; resnet18 11x), plus the masked input and its mask; headroom.
PER_INPUT = 24


def cpu_rows(x: torch.Tensor, cap: int) -> int:
    """Inputs like one sample of ``x`` per no-grad pass on a CPU: at most ``cap``, and at most
    CPU_CHUNK_BYTES of input (at least 1)."""
    return max(1, min(cap, CPU_CHUNK_BYTES // max(x[0].numel() * x.element_size(), 1)))


def scorecam_batch_size(x: torch.Tensor, rows: int, requested: int | None) -> int:
    """Masked inputs per pass: ``requested`` (--scorecam-batch), else the largest batch that
    fits the memory budget: half the free memory of an accelerator (``mem_get_info``) or
    1 GiB on a CPU, over an estimated PER_INPUT x the bytes of one input per masked input;
    between 1 and SCORECAM_MAX_BATCH (on a CPU, :func:`cpu_rows` of CPU_MAX_BATCH), and no
    more than there are masked inputs."""
    if requested is not None:
        return requested
    per = PER_INPUT * x[0].numel() * x.element_size()
    cap = SCORECAM_MAX_BATCH if x.device.type != "cpu" else cpu_rows(x, CPU_MAX_BATCH)
    return max(1, min(cap, rows, memory_budget(x.device) // max(per, 1)))


def memory_budget(device: torch.device) -> int:
    """Bytes a batch of masked passes may take: half the free memory of a CUDA device, else
    CPU_BUDGET (a CPU gains nothing from larger batches, and its free memory is shared)."""
    import torch

    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free) // 2
    return CPU_BUDGET
