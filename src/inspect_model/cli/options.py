"""The option types the subcommands share (``Annotated`` Typer options), declared once.

Nothing here imports torch at module level, so ``--help`` stays fast. The console (stdout,
stderr) is :mod:`inspect_model.cli.console`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from inspect_model.cli import completion

# ---------------------------------------------------------------- option types
ModelArg = Annotated[
    str,
    typer.Argument(
        help="A torchvision model name (resnet34, torchvision:vit_b_16), a user model "
        "FILE.py:FACTORY or package.module:ATTR (this runs that code), or a TorchScript file.",
        show_default=False,
        metavar="MODEL",
        autocompletion=completion.complete_model,
    ),
]
WeightsOpt = Annotated[
    str | None,
    typer.Option("--weights", help="none, DEFAULT, or a weights enum member (IMAGENET1K_V2)."),
]
CheckpointOpt = Annotated[
    Path | None,
    typer.Option("--checkpoint", help="Load this state_dict (or a dict holding one) into the model."),
]
ModelArgOpt = Annotated[
    list[str] | None,
    typer.Option("--model-arg", help="key=value passed to a user model's constructor or a torchvision builder, e.g. "
                 "num_classes=10 (repeatable)."),
]
NonStrictOpt = Annotated[
    bool, typer.Option("--non-strict", help="Allow missing/unexpected checkpoint keys.")
]
TrustOpt = Annotated[
    bool,
    typer.Option(
        "--trust-checkpoint",
        help="Allow full unpickling of checkpoints (runs code from the file: only for files you trust).",
    ),
]
TrustRemoteCodeOpt = Annotated[
    bool,
    typer.Option(
        "--trust-remote-code",
        help="Let a Hugging Face model run its own code (the repo's modeling_*.py): only for repos you trust. "
        "Command line only.",
    ),
]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu, cuda, cuda:N, mps or auto.",
                                        autocompletion=completion.complete_device)]

DtypeOpt = Annotated[str, typer.Option("--dtype", help="float32, float16, bfloat16 or float64.")]
DeviceMapOpt = Annotated[str | None, typer.Option(
    "--device-map", help="Spread the model over GPUs, CPU and disk with accelerate: auto, balanced, sequential, "
    "or a JSON file {module: device}.")]
MaxMemoryOpt = Annotated[str | None, typer.Option(
    "--max-memory", help="Memory per device for --device-map, e.g. 0=20GiB,1=20GiB,cpu=30GiB.")]
OffloadOpt = Annotated[str | None, typer.Option(
    "--offload", metavar="[DIR]", help="Stream the weights the GPUs do not hold from disk, one block at a time "
    "(with --max-memory cpu=N: keep N of them in RAM), written to a fresh folder removed afterwards: in the "
    "system's temporary folder, or in DIR (`--offload DIR` or --offload=DIR, after MODEL and the images).")]
OffloadDirOpt = Annotated[str | None, typer.Option(
    "--offload-dir", hidden=True, help="Same as --offload DIR (the older spelling).")]
# Options whose value may be left out (Click's optional values, which the Click Typer vendors
# lacks): the value they get then. `--offload` alone gets "" (a temporary folder).
OPTIONAL_VALUES = {"--offload": ""}
InputSizeOpt = Annotated[
    list[str] | None,
    typer.Option("--input-size", help="Per-sample input shape such as 3x224x224 (repeat for several inputs); "
                 "[NAME=]SHAPE[:DTYPE[:LOW-HIGH]] for keyword or integer inputs, e.g. ids=16:int64:0-1000."),
]
ImageInputOpt = Annotated[
    str | None,
    typer.Option("--image-input", help="For a model with several inputs: the input the images feed (a name "
                 "or position; default: the first)."),
]
InputsFileOpt = Annotated[
    Path | None,
    typer.Option("--inputs-file", help="The model's other inputs as real tensors: a file holding a tensor, "
                 "tuple or dict (torch.save; loaded with weights_only=True)."),
]
BatchSizeOpt = Annotated[int, typer.Option("--batch-size", help="Batch size.")]
ImageBatchSizeOpt = Annotated[
    int | None,
    typer.Option("--batch-size", help="Images per forward pass (default 8); without images, how many "
                 "seeded random inputs to make (default 1)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Write the report to stdout as one JSON document.")]
OutputDirOpt = Annotated[
    Path | None, typer.Option("--output-dir", "-o", help="Write the report's files into this directory.")
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Write into a non-empty --output-dir.")]
WaitOpt = Annotated[
    bool, typer.Option("--wait", help="If another run is using --output-dir, wait for it instead of failing.")
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing on stderr but errors.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show a traceback on errors.")]
ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", help="TOML file setting any option of this command (the command line wins)."),
]
DepthOpt = Annotated[int | None, typer.Option("--depth", help="Only modules down to this nesting depth.")]
LayersOpt = Annotated[
    list[str] | None,
    typer.Option("--layer", "--layers", "-l", help="Layer spec: name, glob (layer4.*), type:Conv2d, with [i] "
                 "(repeatable).", autocompletion=completion.complete_layer),
]
ColormapOpt = Annotated[str, typer.Option("--colormap", "--cmap", help="Matplotlib colormap of the pictures.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for random inputs and sampling.")]


# ---------------------------------------------------------------- inputs
ImagesArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="Images: files, directories (recursive), globs, or - to read paths from stdin. "
        "Without images a seeded random input of --input-size is used.",
        show_default=False,
    ),
]
PresetOpt = Annotated[str | None, typer.Option("--preset", help="Preprocessing preset: imagenet, inception, clip, unit.")]
ResizeOpt = Annotated[int | None, typer.Option("--resize", help="Resize the shorter side to this many pixels.")]
CropOpt = Annotated[int | None, typer.Option("--crop", help="Centre-crop to this square size.")]
MeanOpt = Annotated[str | None, typer.Option("--mean", help="Normalisation mean, e.g. 0.485,0.456,0.406.")]
StdOpt = Annotated[str | None, typer.Option("--std", help="Normalisation std, e.g. 0.229,0.224,0.225.")]
ClipOpt = Annotated[bool, typer.Option("--clip", help="A folder given is one video: its images are the frames, "
                                     "in name order (video and optical-flow models).")]
FramesOpt = Annotated[int | None, typer.Option("--frames", help="Frames per clip (video models; default: the "
                                               "model's, 16 for torchvision's); a flow model pairs consecutive ones.")]
StrideOpt = Annotated[int, typer.Option("--stride", help="Take every S-th frame of a video.")]
ClipsOpt = Annotated[int, typer.Option("--clips", help="Clips per video, spread evenly over it.")]
TextOpt = Annotated[list[str] | None, typer.Option("--text", help="A text to tokenise and feed (Hugging Face text "
                                                   "models); repeat for a batch, padded.")]
TextFileOpt = Annotated[Path | None, typer.Option("--text-file", help="A file of texts to feed, one per line.")]
TokenizerOpt = Annotated[Path | None, typer.Option("--tokenizer", help="The tokenizer's folder for --text (default: "
                                                   "the model's own folder).")]
TaskOpt = Annotated[str | None, typer.Option("--task", help="The model's task, when the one found is not meant: "
                                            "image_classification, detection, segmentation, video, optical_flow, "
                                            "text_classification, token_classification, causal_lm, masked_lm, "
                                            "seq2seq, embedding, contrastive, single_score.")]
TargetTextOpt = Annotated[str | None, typer.Option("--target-text", help="Explain the log-probability of this "
                                                   "continuation (causal LM, seq2seq: teacher-forced).")]
PositionOpt = Annotated[int | None, typer.Option("--position", help="The token position whose prediction is "
                                                 "explained (causal LM, masked LM, token classification).")]
ContrastOpt = Annotated[str | None, typer.Option("--contrast", help="Causal LM: explain the logit difference of "
                                                 "the target token and this token.")]
LabelsOpt = Annotated[
    Path | None,
    typer.Option("--class-names", "--labels", help="File of the model's class names: one per line, or JSON "
                 "(--labels is the old name)."),
]
SkipBadOpt = Annotated[
    bool, typer.Option("--skip-bad-inputs", help="Skip unreadable images with a warning instead of failing.")
]
TargetOpt = Annotated[
    str, typer.Option("--target", "-t", help="predicted, a class index or name, or top:K.",
                      autocompletion=completion.complete_target)
]
OutputKeyOpt = Annotated[
    str | None, typer.Option("--output-key", help="Which output of a tuple/dict-returning model to use (name or index).")
]
SaveRawOpt = Annotated[bool, typer.Option("--save-raw", help="Also save raw arrays as .npy files.")]
TensorboardOpt = Annotated[
    Path | None, typer.Option("--tensorboard", help="Also write TensorBoard events here (needs the tensorboard extra).")
]
