"""``inspect-model guided-backprop MODEL IMAGE ...``: guided backpropagation maps per image and target."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from inspect_model.cli import common as c
from inspect_model.cli.run import CommandRun, InputOptions
from inspect_model.cli.shared import RunOptions, command_run, shared_options

EXAMPLE = "inspect-model guided-backprop resnet50 cat.jpg --target top:3 --output-dir gb"

ActivationsOpt = Annotated[
    bool,
    typer.Option("--activations", help="Also guide relu6, leaky_relu, silu, gelu and prelu "
                 "(clamp the negative gradient at their outputs)."),
]
GuidedGradcamOpt = Annotated[
    bool, typer.Option("--guided-gradcam", help="Also write guided backprop times the Grad-CAM map of --layer.")
]
LayerOpt = Annotated[
    str, typer.Option("--layer", help="Grad-CAM layer for --guided-gradcam: auto or a layer spec.")
]
SanityOpt = Annotated[
    bool,
    typer.Option("--sanity", help="Cascading weight-randomisation check (Adebayo et al. 2018) on a copy "
                 "of the model; reports Spearman rank correlation with the original maps."),
]
OverviewOpt = Annotated[
    bool, typer.Option("--overview/--no-overview", help="With --output-dir: one titled overview PNG per image.")
]


@shared_options()
def guided_backprop(
    model: c.ModelArg,
    images: c.ImagesArg = None,
    target: c.TargetOpt = "predicted",
    activations: ActivationsOpt = False,
    guided_gradcam: GuidedGradcamOpt = False,
    layer: LayerOpt = "auto",
    sanity: SanityOpt = False,
    output_key: c.OutputKeyOpt = None,
    save_raw: c.SaveRawOpt = False,
    overview: OverviewOpt = True,
    *,
    opts: c.ModelOptions,
    inputs: InputOptions,
    run_opts: RunOptions,
) -> None:
    """Guided backpropagation (Springenberg et al. 2015) for any network.

    Every ReLU of the model (modules, in-place ones, reused ones, and functional F.relu /
    torch.relu calls) passes back only positive gradient where its input was positive. One
    map per image and target: a display PNG, a grayscale magnitude PNG, and with --save-raw
    the raw gradient (.npy). Example: inspect-model guided-backprop resnet50 cat.jpg --target top:3 --output-dir gb
    """
    from inspect_model.errors import UsageError

    if layer != "auto" and not guided_gradcam:
        raise UsageError("--layer applies to --guided-gradcam; add --guided-gradcam or drop --layer")
    if guided_gradcam and output_key is not None:
        raise UsageError("--guided-gradcam uses the model's first output; drop --output-key")
    with command_run("guided-backprop", run_opts, save_raw=save_raw) as run:
        gbr = _Run(run, opts, save_raw=save_raw, overview=overview)
        payload, options = gbr.execute(inputs, target=target, activations=activations,
                                       guided_gradcam=guided_gradcam, layer=layer, sanity=sanity,
                                       output_key=output_key)
        from inspect_model.render import saliency as render

        for w in payload["warnings"]:
            run.msgs.warn(w)
        run.finish(payload, options, text=lambda files: render.render_text(payload),
                   rich=lambda files: render.render_rich(payload))


class _Run:
    """One guided-backprop run: load, stream batches, write files, build the report payload."""

    def __init__(self, run: CommandRun, opts: c.ModelOptions, *, save_raw: bool, overview: bool) -> None:
        self.run, self.opts, self.msgs, self.out, self.writer = run, opts, run.msgs, run.out, run.writer
        self.jsonl, self.save_raw, self.overview = run.jsonl, save_raw, overview
        self.warnings: list[str] = []

    def warn(self, text: str) -> None:
        if text not in self.warnings:
            self.warnings.append(text)

    def execute(self, inputs: InputOptions, *, target: str, activations: bool, guided_gradcam: bool,
                layer: str, sanity: bool, output_key: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
        from inspect_model.errors import InputError
        from inspect_model.methods import guided as gb
        from inspect_model.methods.targets import parse_target

        prep = self.run.prepare(self.opts, inputs)
        loaded, plan, categories, dev, torch_dtype = prep.loaded, prep.plan, prep.categories, prep.device, prep.dtype
        seed = inputs.seed
        spec = parse_target(target, categories)
        cam_layer: str | None = None
        kinds = gb.resolve_kinds(activations)
        entries: list[dict[str, Any]] = []
        sites: dict[str, int] | None = None
        unguided: dict[str, int] = {}
        sanity_acc: dict[str, Any] | None = None
        for batch in self.run.track(plan):
            x = batch.tensor
            res = gb.guided_backprop(loaded.model, x, spec, activations=kinds, output_key=output_key,
                                     categories=categories)
            for w in res.warnings:
                self.warn(w)
            if sites is None:
                sites, unguided = res.sites, res.unguided
            ggc = None
            if guided_gradcam:
                if cam_layer is None:
                    from inspect_model.methods.cam import resolve_layer

                    cam_layer = resolve_layer(loaded.model, layer, x[:1])
                ggc = gb.guided_gradcam(res.gradients, _gradcam(loaded.model, x, cam_layer, res.targets))
            if sanity:
                san = gb.sanity_check(loaded.model, x, res, seed=seed, output_key=output_key)
                sanity_acc = _merge_sanity(sanity_acc, san)
            pre = plan.preprocess
            for i in range(x.shape[0]):
                entry = self._entry(len(entries), batch.names[i], x[i], res, i, ggc, categories, pre)
                entries.append(entry)
                self.run.line(entry)
        for path, reason in plan.skipped:
            self.warn(f"skipped {path}: {reason}")
        for w in plan.warnings:  # per-image notes (first frame of an animated GIF...)
            self.warn(w)
        if not entries:
            raise InputError("no input could be read; nothing to do")
        payload = {
            "model": loaded.name,
            "method": "guided_backprop",
            "activations": list(kinds),
            "sites": sites or {},
            "unguided_sites": unguided,
            "images": entries,
            "guided_gradcam": {"layer": cam_layer} if cam_layer else None,
            "sanity": _finish_sanity(sanity_acc),
            "notes": [gb.ADEBAYO_NOTE],
            "warnings": list(self.warnings),
            "skipped": [{"path": p, "reason": r} for p, r in plan.skipped],
        }
        options = {
            "model": self.opts.model, "weights": loaded.weights if loaded.source == "torchvision" else self.opts.weights,
            "checkpoint": str(self.opts.checkpoint) if self.opts.checkpoint else None,
            "layers": [cam_layer] if cam_layer else [], "preprocessing": plan.describe(), "device": dev,
            "dtype": str(torch_dtype).replace("torch.", ""), "seed": seed, "target": target,
            "activations": list(kinds), "guided_gradcam": guided_gradcam, "sanity": sanity,
            "output_key": output_key, "batch_size": plan.batch_size,
        }
        return payload, options

    def _entry(self, index: int, name: str, x: Any, res: Any, i: int, ggc: Any, categories: Any,
               pre: Any) -> dict[str, Any]:
        from pathlib import Path

        from inspect_model.methods.targets import label
        from inspect_model.render import saliency as render
        from inspect_model.render.files import safe_name

        base = f"{index:04d}-{safe_name(Path(name).stem)}"
        maps = []
        rows = []
        for k, cls in enumerate(res.targets[i]):
            g = res.gradients[i, k]
            a = g.abs()
            text = label(cls, categories)
            m: dict[str, Any] = {
                "rank": k, "class": cls, "label": text, "score": res.scores[i][k],
                "max_abs": float(a.max()), "mean_abs": float(a.mean()),
                "nonzero_fraction": float((g != 0).float().mean()), "files": {},
            }
            tag = safe_name(f"c{cls}-{categories[cls]}" if categories and 0 <= cls < len(categories) else f"c{cls}")
            stem = f"{base}.{tag}"
            panels = []
            if render.is_image_map(g):
                guided_img, mag_img = render.display_image(g), render.magnitude_image(g)
                panels += [("guided backprop", guided_img), ("|guided| (sum over channels)", mag_img)]
                ggc_img = render.display_image(ggc[i, k]) if ggc is not None else None
                if ggc_img is not None:
                    panels.append(("guided Grad-CAM", ggc_img))
                if self.out is not None:
                    m["files"]["guided"] = self.out.save_image(f"{stem}.guided.png", guided_img)
                    m["files"]["magnitude"] = self.out.save_image(f"{stem}.magnitude.png", mag_img)
                    if ggc_img is not None:
                        m["files"]["guided_gradcam"] = self.out.save_image(f"{stem}.guided_gradcam.png", ggc_img)
                if self.writer is not None:
                    import numpy as np

                    for key, img in (("guided", guided_img), ("magnitude", mag_img), ("guided_gradcam", ggc_img)):
                        if img is not None:
                            arr = np.asarray(img.convert("RGB"))
                            self.writer.add_image(f"guided-backprop/{base}/{tag}/{key}", arr, 0, dataformats="HWC")
            elif self.out is not None and not self.save_raw:
                self.warn("the input is not an image (C, H, W); no PNGs written (use --save-raw for .npy)")
            if self.out is not None and self.save_raw:
                m["files"]["raw"] = self.out.save_npy(f"{stem}.guided.npy", g.numpy())
                if ggc is not None:
                    m["files"]["guided_gradcam_raw"] = self.out.save_npy(f"{stem}.guided_gradcam.npy", ggc[i, k].numpy())
            maps.append(m)
            if panels:
                rows.append((f"{text} ({m['score']:.3g})", panels))
        entry: dict[str, Any] = {"index": index, "name": name, "maps": maps, "files": {}}
        if self.out is not None and self.overview and rows:
            mean = pre.mean if pre is not None else None
            std = pre.std if pre is not None else None
            fig = render.overview_figure(render.input_image(x, mean, std), rows)
            entry["files"]["overview"] = self.out.save_figure(f"{base}.overview.png", fig)
        return entry


def _gradcam(model: Any, x: Any, layer: str, targets: list[list[int]]) -> Any:
    """Grad-CAM maps (N, K, H, W) in [0, 1] of ``layer`` for the same targets."""
    from inspect_model.methods import cam

    return cam.gradcam(model, x, layer, targets).detach().float().cpu()


def _merge_sanity(acc: dict[str, Any] | None, san: Any) -> dict[str, Any]:
    if acc is None:
        acc = {"layers": san.layers, "seed": san.seed,
               "steps": [{"randomized": s.randomized, "down_to": s.down_to, "spearman": [], "spearman_abs": []}
                         for s in san.steps]}
    for dst, s in zip(acc["steps"], san.steps):
        dst["spearman"].extend(s.spearman)
        dst["spearman_abs"].extend(s.spearman_abs)
    return acc


def _finish_sanity(acc: dict[str, Any] | None) -> dict[str, Any] | None:
    import math

    if acc is None:
        return None

    def mean(v: list[float]) -> float | None:
        ok = [x for x in v if not math.isnan(x)]
        return sum(ok) / len(ok) if ok else None

    for s in acc["steps"]:
        s["spearman_mean"] = mean(s["spearman"])
        s["spearman_abs_mean"] = mean(s["spearman_abs"])
    acc["method"] = "cascading randomisation from the top (Adebayo et al. 2018)"
    return acc
