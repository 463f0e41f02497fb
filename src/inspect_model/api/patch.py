"""``patch``: activation patching and causal tracing of a language model (issue 36).

The clean and corrupted prompts run once each; then, for every site (the residual stream,
attention and MLP outputs per layer and position, attention heads per layer), one patched
run per cell, many cells per forward (methods/lm/grid.py). ``--noise-subject`` traces
causally instead (Meng et al. 2022): the clean prompt with noise on the subject's token
embeddings, one clean state restored at a time. Pairs from ``--pairs`` stream through the
one runner (torchrun, ``--resume``) as texts do; each pair's files are
``images/NNNN-pair-N/patch_<site>.png``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from inspect_model.errors import UsageError
from inspect_model.registry import command
from inspect_model.run.call import Call
from inspect_model.run.options import ModelOptions
from inspect_model.run import option_groups as og
from inspect_model.run.request import Request, api_command, option
from inspect_model.run.session import ImageItem, Result, Session, Warnings
from inspect_model.reports.patch import PatchReport
from inspect_model.render import patch as render

SITE_NAMES = ("resid", "attn", "mlp", "head")


@dataclass(frozen=True)
class PatchRequest(Request):
    """The options of ``patch``; validated once, here (no torch)."""

    command: ClassVar[str] = "patch"

    clean: str | None = option(None, "--clean", type=str, help="The clean prompt.")
    corrupt: str | None = option(None, "--corrupt", type=str, help="The corrupted prompt (the same number of tokens "
                                 "as --clean).")
    pairs: str | None = option(None, "--pairs", type=str, help="A JSON-lines file of prompt pairs: "
                               "{\"clean\": ..., \"corrupt\": ..., \"metric\"?: ...} per line (instead of "
                               "--clean/--corrupt).")
    metric: str = option("prob", "--metric", help="logit-diff:A,B (logit of A minus B), prob[:TOKEN], "
                         "logprob[:TOKEN] (no TOKEN: the clean run's top token) or kl (KL divergence from the clean "
                         "run); read at --position. Each token must be one token of the vocabulary.")
    denoise: bool = option(True, "--denoise/--noise", help="--denoise: write clean activations into the corrupted "
                           "run; --noise: corrupted activations into the clean run. Either way the clean run "
                           "scores 1 and the corrupted run 0.")
    sites: str | None = option(None, "--sites", type=str, help="Comma-separated: resid (block output), attn "
                               "(attention output), mlp (MLP output), each per layer x position, and head (each "
                               "attention head, per layer). Default: all four; tracing: resid,mlp,attn.")
    position: int | None = option(None, "--position", type=int, help="The token position whose prediction the "
                                  "metric reads (default: the last; negative counts from the end).")
    noise_subject: str | None = option(None, "--noise-subject", type=str, help="Causal tracing (ROME): corrupt the "
                                       "clean prompt by Gaussian noise on this text's token embeddings.")
    noise_std: str = option("3σ", "--noise-std", help="Tracing's noise: a std, or a multiple of σ, the std of the "
                            "token embedding matrix (3σ, 3s, as in ROME).")
    samples: int = option(10, "--samples", help="Tracing: noise draws averaged per cell (ROME: 10).")
    window: int = option(1, "--window", help="Tracing: restore attn/mlp at this many layers around each one (ROME: "
                         "10); 1: one layer.")
    tokenizer: str | None = option(None, "--tokenizer", type=str, help="The tokenizer's folder (default: the "
                                   "model's own).")
    encoder_text: str = option("", "--encoder-text", help="An encoder-decoder's encoder input (the prompts feed its "
                               "decoder, whose blocks are patched).")
    colormap: str = og.colormap("RdBu_r")

    def validate(self) -> None:
        from inspect_model.methods.lm.metrics import parse_metric

        parse_metric(self.metric)
        tracing = self.noise_subject is not None
        names = [s.strip() for s in (self.sites or "").split(",") if s.strip()]
        for s in names:
            if s not in SITE_NAMES:
                raise UsageError(f"--sites '{s}' is not one of {', '.join(SITE_NAMES)}")
        if self.sites is not None and not names:
            raise UsageError("--sites names no site; give some of resid,attn,mlp,head")
        default = ("resid", "mlp", "attn") if tracing else SITE_NAMES
        self._set("site_list", tuple(dict.fromkeys(names)) or default)
        if tracing and not self.denoise:
            raise UsageError("--noise-subject restores clean states into the noised run; --noise does not apply")
        if not tracing:
            for flag, given in (("--window", self.window != 1), ("--samples", self.samples != 10),
                                ("--noise-std", self.noise_std != "3σ")):
                if given:
                    raise UsageError(f"{flag} applies to causal tracing (--noise-subject TEXT)")
        if tracing:
            from inspect_model.methods.lm.prompts import parse_noise_std

            parse_noise_std(self.noise_std)

    @property
    def mode(self) -> str:
        return "trace" if self.noise_subject is not None else "denoise" if self.denoise else "noise"


class PatchSession(Session):
    command = "patch"
    streams_files = True
    report_from_records = True  # the records name each item's files: built again by save()

    def __init__(self, prep: Any, mopts: ModelOptions, request: PatchRequest, *, tokenizer: Any, per_forward: int,
                 notes: Any = None) -> None:
        from inspect_model.methods.lm.anatomy import find_anatomy
        from inspect_model.methods.lm.patching import modules_of
        from inspect_model.methods.lm.prompts import caller

        self.prep, self.mopts, self.request, self.tok = prep, mopts, request, tokenizer
        self.notes = notes or (lambda text: None)
        model = prep.loaded.model
        self.anatomy = find_anatomy(model)
        self.mods = modules_of(model, self.anatomy)
        self.sites = _usable_sites(self.mods, request.site_list, self.notes)
        self.call = caller(model, tokenizer, request.encoder_text, prep.device)
        self.per_forward = per_forward
        self.records: list[Any] = []
        self.entries: list[dict[str, Any]] = []
        self.warnings = Warnings()
        self.drawer = render.PatchDrawer(request.colormap, request.mode)

    def feed(self, batch: Any) -> list[ImageItem]:
        from inspect_model.methods.lm.run_pair import patch_one

        items = []
        for name, pair in zip(batch.names, batch.pairs):
            rec = patch_one(self, int(name.rsplit("-", 1)[1]), name, pair)
            gap, scale = abs(rec.clean_value - rec.corrupt_value), max(abs(rec.clean_value), abs(rec.corrupt_value))
            if gap <= 0.01 * scale or gap == 0.0:
                self.warnings.add(f"{name}: the clean and corrupted runs differ by {gap:.3g} in {rec.metric.text} "
                                  "(under 1%): the normalised values divide by that difference")
            entry = rec.to_dict()
            self.records.append(rec)
            self.entries.append(entry)
            items.append(ImageItem(entry, rec))
        return items

    def finish(self) -> Result:
        from inspect_model.methods.lm.patch_report import MODES, NORMALISATION

        import dataclasses

        files = {int(e["index"]): dict(e.get("files") or {}) for e in self.entries}
        recs = [dataclasses.replace(r, files=files.get(r.index, r.files)) for r in sorted(self.records,
                                                                                         key=lambda r: r.index)]
        report = PatchReport(mode=self.request.mode, direction=MODES[self.request.mode], normalisation=NORMALISATION,
                             model_parts=self.anatomy.describe(), pairs=recs, count=len(recs))
        payload = {**report.to_dict(), "skipped": []}
        return Result("patch", self.resolved_options(), payload, self.warnings.to_list(), record=report)

    def resolved_options(self) -> dict[str, Any]:
        r = self.request
        return self.prep.options(self.mopts, **r.resolved(), mode=r.mode, site_list=list(self.sites),
                                 per_forward=self.per_forward)

    # ------------------------------------------------------------------ resumable, mergeable
    def state_dict(self) -> dict[str, Any]:
        return {"records": list(self.records), "files": [[int(e["index"]), dict(e.get("files") or {})]
                                                         for e in self.entries], "warnings": self.warnings}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.records = list(state["records"])
        files = {int(i): f for i, f in state["files"]}
        self.entries = [{**r.to_dict(), "files": files.get(r.index, {})} for r in self.records]
        self.warnings = state["warnings"]

    def merge(self, states: list[dict[str, Any]]) -> None:
        mine = self.warnings
        self.records, self.entries = [], []
        for st in states:
            self.records += list(st["records"])
            files = {int(i): f for i, f in st["files"]}
            self.entries += [{**r.to_dict(), "files": files.get(r.index, {})} for r in st["records"]]
        mine.merge(st["warnings"] for st in states[1:])


def _usable_sites(mods: Any, wanted: tuple[str, ...], notes: Any) -> tuple[str, ...]:
    """The sites the model has: a site whose module is missing in some block is left out with a note."""
    from inspect_model.errors import UnsupportedModelError

    out = []
    for s in wanted:
        missing = [i for i in range(mods.layers) if mods.module(s, i) is None]
        if s == "head" and not missing and not (mods.n_heads and mods.head_dim):
            missing = list(range(mods.layers))
        if missing:
            what = {"head": "an attention output projection with a known head count", "mlp": "an MLP",
                    "attn": "an attention module", "resid": "a block"}[s]
            notes(f"site {s} left out: block(s) {', '.join(map(str, missing[:5]))} have no {what}")
        else:
            out.append(s)
    if not out:
        raise UnsupportedModelError(f"none of the sites {', '.join(wanted)} can be patched in this model")
    return tuple(out)


@command(
    "patch",
    usage="patch MODEL --clean TEXT --corrupt TEXT",
    order=86,
    summary="activation patching and causal tracing of a language model",
    help=("Activation patching: which layers, positions and heads carry what makes the clean prompt's prediction "
          "differ from the corrupted one's.\n\nRuns the clean and corrupted prompts once each, then one patched "
          "run per cell (batched, --batch-size runs per forward): clean activations written into the corrupted "
          "run (--denoise) or the reverse (--noise), for the residual stream, attention and MLP outputs per "
          "layer x position and for each attention head per layer. The metric (--metric) is normalised so that "
          "the clean run is 1 and the corrupted run 0. --noise-subject TEXT traces causally (ROME): noise on the "
          "subject's embeddings, clean states restored one at a time. Pictures: one heat map per site per pair."),
    example=("inspect-model patch gpt2 --clean 'The Eiffel Tower is in' --corrupt 'The Colosseum is in' "
             "--metric \"logit-diff: Paris, Rome\" -o patch"),
    renderer=render.patch_report,
    tables=render.patch_tables,
    schema="patch.json",
    report=PatchReport,
    resumable=True,
    images=False,
    labels=False,
    run=("output_dir", "force", "json_", "jsonl", "quiet", "resume"),
)
@api_command(PatchRequest, images=False)
def patch(model: Any, request: PatchRequest, call: Call) -> Result:
    """Activation patching (or, with ``noise_subject``, causal tracing) of ``model`` on
    ``clean``/``corrupt`` or the ``pairs`` file; the options of :class:`PatchRequest`."""
    from inspect_model.run.patch_prep import prepare_patch

    mopts = call.model(model)
    prep, tok, per_forward = prepare_patch(mopts, call.input_options(None), request, call.notes)
    session = PatchSession(prep, mopts, request, tokenizer=tok, per_forward=per_forward, notes=call.notes)
    return call.execute(session, prep.plan.batches(), total=len(prep.plan.pairs), unit=prep.plan.unit,
                        tensorboard=False)
