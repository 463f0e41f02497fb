"""``lens``: the logit lens and the tuned lens of a language model over texts (issue 36).

Each text runs once; every block's residual output (``--sites resid,attn,mlp``: also the
attention and MLP outputs) is decoded at every position through the model's own final norm
and unembedding (methods/lm/anatomy.py finds them; ``--final-norm``/``--unembed`` name them
for a user model), or through a tuned lens first (``--lens DIR``). A session over the texts:
resumable and sharded under torchrun like every command that streams its inputs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from inspect_model.errors import UsageError
from inspect_model.reports.base import Warning_
from inspect_model.reports.lens import LensReport
from inspect_model.registry import command
from inspect_model.render import lens as render
from inspect_model.run.options import ModelOptions
from inspect_model.run.call import Call
from inspect_model.run.request import Request, api_command, option, positive
from inspect_model.run.session import ImageItem, Result, Session, Warnings, input_outcome

SHOW = ("prob", "rank")


@dataclass(frozen=True)
class LensRequest(Request):
    """The options of ``lens``; validated once, here."""

    command: ClassVar[str] = "lens"

    sites: str = option("resid", "--sites", help="What to decode, a comma list: resid (every block's residual "
                        "output, and the embeddings), attn (each attention's output), mlp (each MLP's output).")
    top_k: int = option(5, "--top-k", help="Decoded tokens listed per layer and position, most probable first.")
    lens: str | None = option(None, "--lens", type=str, help="A tuned lens (a folder with config.json and params.pt "
                              "or params.safetensors, as tuned-lens's TunedLens.save writes it): its translators "
                              "are applied to the residual stream before the unembedding.")
    final_norm: str | None = option(None, "--final-norm", type=str, help="The module applied before the unembedding "
                                    "(default: found in the model; '' for none).", complete="layer")
    unembed: str | None = option(None, "--unembed", type=str, help="The unembedding module (default: the model's "
                                 "get_output_embeddings()).", complete="layer")
    show: str = option("prob", "--show", help="The map's colour: prob (probability of the model's prediction) or "
                       "rank (its rank, log scale).")

    def validate(self) -> None:
        from inspect_model.methods.lm.lens import parse_sites

        self._set("sites", ",".join(parse_sites(self.sites)))
        positive(self.top_k, "--top-k")
        if self.show not in SHOW:
            raise UsageError(f"--show '{self.show}' is not one of {', '.join(SHOW)}")


def _width(model: Any, anatomy: Any) -> int:
    from inspect_model.methods.lm.anatomy import text_config

    cfg = text_config(model)
    for attr in ("hidden_size", "d_model", "n_embd"):
        v = getattr(cfg, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    w = getattr(model.get_submodule(anatomy.unembed), "weight", None)
    return int(w.shape[-1]) if w is not None else 0


def _index(name: str, fallback: int) -> int:
    """A text's run index: its name's (``text-12``: the plan names texts by their place in the
    run, whichever rank or resumed run feeds it)."""
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else fallback


class LensSession(Session):
    command = "lens"
    streams_files = True
    report_from_records = True  # the records name each item's files: built again by save()

    def __init__(self, prep: Any, mopts: ModelOptions, request: LensRequest, *, notes: Any = None) -> None:
        from inspect_model.methods.lm.anatomy import find_anatomy
        from inspect_model.methods.lm.lens import LensCapture, sites_of

        self.prep, self.mopts, self.request = prep, mopts, request
        self.notes = notes or (lambda text: None)
        model = prep.loaded.model
        if getattr(prep.plan, "texts", None) is None:
            raise UsageError("lens reads texts: give --text TEXT or --text-file FILE")
        self.anatomy = find_anatomy(model, final_norm=request.final_norm, unembed=request.unembed)
        self.notes(f"lens: {self.anatomy.describe()}")
        self.tuned = None
        if request.lens is not None:
            from inspect_model.methods.lm.tuned import load_tuned_lens

            self.tuned = load_tuned_lens(request.lens, d_model=_width(model, self.anatomy),
                                         layers=len(self.anatomy.blocks))
            self.notes(f"tuned lens {request.lens}: {len(self.tuned)} translator(s), applied to the residual "
                       "stream (the last block's output is decoded as it is)")
        self.sites = sites_of(self.anatomy, tuple(request.sites.split(",")))
        self.capture = LensCapture(model, self.anatomy, self.sites)
        self.tokenizer = prep.plan.tokenizer
        self.names: dict[int, str] = {}
        self.entries: list[dict[str, Any]] = []
        self.readout_error: float | None = None
        self.warnings = Warnings()
        from inspect_model.render.draw_lens import LensDrawer

        self.drawer = LensDrawer(show=request.show, lens="tuned" if request.lens else "logit")

    def __enter__(self) -> LensSession:
        self.capture.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.capture.__exit__(*exc)

    def _name(self, ids: list[int]) -> list[str]:
        """Readable tokens (decoded one by one: ' the', not 'Ġthe'), cached by id."""
        new = sorted({i for i in ids if i not in self.names})
        known = [i for i in new if i < len(self.tokenizer)]
        for i, s in zip(known, self.tokenizer.batch_decode([[i] for i in known]) if known else []):
            self.names[i] = s if s else str(self.tokenizer.convert_ids_to_tokens(i))  # a special token decodes to ''
        for i in new:
            self.names.setdefault(i, f"<id={i}>")  # beyond the tokenizer's vocabulary
        return [self.names[i] for i in ids]

    def feed(self, batch: Any) -> list[ImageItem]:
        from inspect_model.methods.lm.lens import decode

        states, logits, kwargs = self.capture.run(batch.tensor)
        decoded, predicted, check = decode(self.prep.loaded.model, self.anatomy, states, logits,
                                           top_k=self.request.top_k, tuned=self.tuned)
        self.readout_error = check if self.readout_error is None else max(self.readout_error, check)
        dec = kwargs.get("decoder_input_ids")
        targets = getattr(getattr(self.prep.binding, "adapter", None), "targets", None)
        items = []
        for i, name in enumerate(batch.names):
            if dec is not None:  # an encoder-decoder: the decoder's positions (its start token, its targets)
                n = int((targets[i] >= 0).sum()) if targets is not None else int(dec.shape[1])
                ids = [int(v) for v in dec[i, :n].tolist()]
            else:
                n = batch.text.lengths[i]
                ids = [int(v) for v in batch.tensor[i, :n].tolist()]
            entry = self._entry(_index(name, self.index_base + len(self.entries)), name, batch.text.texts[i], ids,
                                predicted[i, :n].tolist(), decoded, i, n)
            self.entries.append(entry)
            items.append(ImageItem(entry, entry))
        return items

    def _entry(self, index: int, name: str, text: str, ids: list[int], pred: list[int], decoded: list[Any],
               i: int, n: int) -> dict[str, Any]:
        rows = []
        for d in decoded:
            top_ids, top_p = d.top_ids[i, :n].tolist(), d.top_probs[i, :n].tolist()
            top = [[{"token": t, "id": k, "prob": p} for t, k, p in zip(self._name(ks), ks, ps)]
                   for ks, ps in zip(top_ids, top_p)]
            rows.append({"site": d.site.site, "layer": d.site.layer, "depth": d.site.depth,
                         "prob": d.prob[i, :n].tolist(), "rank": [int(r) for r in d.rank[i, :n].tolist()],
                         "entropy": d.entropy[i, :n].tolist(), "kl": d.kl[i, :n].tolist(), "top": top})
        return {"index": index, "image": name, "text": text, "tokens": self._name(ids),
                "predicted": self._name([int(p) for p in pred]), "rows": rows, "files": {}}

    def record(self, warnings: list[dict[str, Any]]) -> LensReport:
        from inspect_model.reports.lens import LensAnatomy, LensText, depth_means

        a = self.anatomy
        texts = [LensText.from_dict(e) for e in self.entries]
        anatomy = LensAnatomy(description=a.describe(), blocks=list(a.block_names), final_norm=a.final_norm,
                              unembed=a.unembed, hidden_scale=a.hidden_scale, logit_bias=a.logit_bias,
                              logit_scale=a.logit_scale, softcap=a.softcap)
        return LensReport(anatomy=anatomy, lens="tuned" if self.tuned is not None else "logit",
                          lens_file=self.request.lens, sites=self.request.sites.split(","), top_k=self.request.top_k,
                          readout_error=self.readout_error, layers=depth_means(texts), images=texts,
                          warnings=[Warning_(**w) for w in warnings])

    def finish(self) -> Result:
        input_outcome(self.prep.plan, self.warnings)
        err = self.readout_error
        if err is not None and not err <= 1e-3:
            self.warnings.add(f"the readout of the last block differs from the model's logits by up to {err:.3g}: "
                              "the final norm or unembedding found may not be the model's; name them with "
                              "--final-norm/--unembed")
        report = self.record(self.warnings.to_list())
        body = {k: v for k, v in report.to_dict().items() if k != "warnings"}  # Result adds the warnings
        return Result("lens", self.resolved_options(), body, self.warnings.to_list(), record=report)

    # ------------------------------------------------------------------ resumable, mergeable
    def state_dict(self) -> dict[str, Any]:
        return {"entries": self.entries, "warnings": self.warnings, "readout_error": self.readout_error}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entries = list(state["entries"])
        self.warnings = state["warnings"]
        self.readout_error = state["readout_error"]

    def merge(self, states: list[dict[str, Any]]) -> None:
        self.entries = [e for st in states for e in st["entries"]]
        errs = [st["readout_error"] for st in states if st["readout_error"] is not None]
        self.readout_error = max(errs) if errs else None
        self.warnings.merge(st["warnings"] for st in states[1:])


@command(
    "lens",
    usage="lens MODEL --text TEXT",
    order=85,
    summary="logit lens / tuned lens of a language model over texts",
    help=("What each layer of a language model would predict: every block's residual output (with --sites "
          "also attention and MLP outputs) decoded at every position through the model's own final norm and "
          "unembedding (the logit lens), or through a tuned lens first (--lens DIR).\n\nPer layer and position: "
          "the top-k tokens, the probability and rank of the model's own prediction, the entropy and the KL "
          "divergence to the model's output. With --output-dir: a layers x positions map per text, each cell "
          "titled with its top token, and KL-by-depth curves."),
    example="inspect-model lens ./gpt2-folder --text 'the cat sat on the' --output-dir lens",
    renderer=render.lens_report,
    tables=render.lens_tables,
    schema="lens.json",
    report=LensReport,
    resumable=True,
    images=False,
    labels=False,
    text=True,
    run=("output_dir", "force", "json_", "jsonl", "quiet", "resume"),
)
@api_command(LensRequest, images=False)
def lens(model: Any, request: LensRequest, call: Call) -> Result:
    """The logit (or tuned) lens of ``model`` over the texts of ``inputs`` (``InputOptions(text=...)``);
    the options of :class:`LensRequest` as keywords."""
    inputs = call.input_options(None)
    if call.tensorboard is not None:
        raise UsageError("lens writes no TensorBoard events; drop tensorboard=")
    if not inputs.text and inputs.text_file is None:
        raise UsageError("lens reads texts: give --text TEXT or --text-file FILE (one text per line)")
    for flag, value in (("--position", inputs.position), ("--contrast", inputs.contrast)):
        if value is not None:
            raise UsageError(f"{flag} does not apply to lens: it decodes every position against the model's own "
                             "prediction")
    call = dataclasses.replace(call, inputs=inputs)
    return call.run_images("lens", model, None, request, lambda prep, mopts, keep: LensSession(
        prep, mopts, request, notes=call.notes))
