#!/usr/bin/env bash
# Regenerates the pictures in README.md from the real commands (run from the repo root with
# the project installed). Offline, so torchvision models run with --weights none (random
# weights): the pictures show what each command writes, not what a trained model sees.
set -euo pipefail
out=sample_images/readme
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python - "$out" <<'PY'
import subprocess, sys
from rich.console import Console
from rich.text import Text
out = sys.argv[1]
for name, args in [
    ("summary", ["inspect-model", "summary", "resnet34", "--depth", "2"]),
    ("check", ["inspect-model", "check", "resnet50", "--weights", "none", "--expect-output-shape", "1x1000",
               "--expect-params", "25557032", "--deterministic"]),
]:
    r = subprocess.run(args, capture_output=True, text=True)
    console = Console(record=True, width=100, file=open("/dev/null", "w"))
    console.print(Text("$ " + " ".join(args), style="bold"))
    console.print(Text(r.stdout.rstrip()))
    console.save_svg(f"{out}/{name}.svg", title=" ".join(args[:3]))
PY

inspect-model activations resnet34 sample_images/cat.jpg --weights none --layers conv1 --layers layer2.0.conv1 \
  --output-dir "$tmp/acts" --quiet > /dev/null
cp "$tmp"/acts/grids/0000_cat/conv1.png "$out/activations_conv1.png"
cp "$tmp/acts/overview.png" "$out/activations_overview.png"

inspect-model grads resnet18 sample_images/cat.jpg --weights none --output-dir "$tmp/grads" --quiet > /dev/null
cp "$tmp/grads/grad_flow.png" "$out/grads_flow.png"

inspect-model guided-backprop resnet50 sample_images/astronaut.jpg --weights none --guided-gradcam \
  --output-dir "$tmp/gb" --quiet > /dev/null
cp "$tmp"/gb/*.overview.png "$out/guided_backprop.png"

inspect-model cam resnet50 sample_images/cat.jpg sample_images/coffee.jpg --weights none \
  --method gradcam --method gradcam++ --method layercam --output-dir "$tmp/cam" --quiet > /dev/null
cp "$tmp/cam/contact_sheet_001.png" "$out/cam_contact_sheet.png"
inspect-model attributions resnet18 sample_images/cat.jpg sample_images/coffee.jpg --weights none \
  --method saliency,input-x-gradient,integrated-gradients,smoothgrad,occlusion,guided --steps 16 --samples 8 \
  --window 56 --window-stride 28 --output-dir "$tmp/attr" --quiet > /dev/null
cp "$tmp/attr/contact_sheet_001.png" "$out/attributions_contact_sheet.png"

inspect-model attention vit_b_16 sample_images/cat.jpg --weights none --method rollout --method raw --heads all \
  --mosaic --output-dir "$tmp/attn" --quiet > /dev/null
cp "$tmp"/attn/images/0000-cat/rollout.*.png "$out/attention_rollout.png"
cp "$tmp"/attn/images/0000-cat/mosaic.png "$out/attention_mosaic.png"
# Swin: a tiny torchvision Swin (tests/fixtures/attention_models.py) trained here in a few minutes
# on grey noise with two coloured squares; asked about the colour of one of them.
python - "$tmp" <<'PY'
import sys
from pathlib import Path
import torch
from PIL import Image
sys.path.insert(0, "tests")
from fixtures.attention_models import squares, tiny_swin_squares
tmp = Path(sys.argv[1])
x, _, a = squares(1, 7)  # the target, blue, top left; green bottom right
Image.fromarray((x[0].permute(1, 2, 0).numpy() * 255).round().astype("uint8")).resize((256, 256), Image.NEAREST) \
    .save(tmp / "squares.png")
torch.save(tiny_swin_squares().state_dict(), tmp / "swin.pt")
(tmp / "swin_models.py").write_text(
    f"import sys\nimport torch\nsys.path.insert(0, {str(Path('tests').resolve())!r})\n"
    "from fixtures.attention_models import tiny_swin_squares\n"
    "def swin():\n    m = tiny_swin_squares(0)\n"
    f"    m.load_state_dict(torch.load({str(tmp / 'swin.pt')!r}, weights_only=True))\n    return m\n")
print(int(a[0]), file=open(tmp / "target.txt", "w"))
PY
(cd "$tmp" && inspect-model attention swin_models.py:swin squares.png --resize 64 --crop 64 --mean 0 --std 1 \
  -m rollout,grad-rollout,legrad,gradcam --target "$(cat target.txt)" -o swin --quiet > /dev/null)
cp "$tmp"/swin/images/0000-squares/compare.*.png "$out/attention_swin_compare.png"

# Text (issue 26): the two-layer BERT of tests/fixtures/text_models.py, trained here in seconds on
# "does the text say good?", saved with a tokenizer built from a vocab.txt.
python - "$tmp" <<'PY'
import sys
sys.path.insert(0, "tests")
from pathlib import Path
from fixtures.text_models import save_text_model
save_text_model("bert", Path(sys.argv[1]) / "tiny-bert", trained=True)
PY
inspect-model attention "$tmp/tiny-bert" --weights default --text "the movie was very good" --text "the plot was dull" \
  -m all --heads all --output-dir "$tmp/text" --quiet > /dev/null
cp "$tmp"/text/images/0000-text-0/strips.png "$out/attention_text_strips.png"
cp "$tmp"/text/images/0001-text-1/raw.bert.encoder.layer.1.attention.self.png "$out/attention_text_heads.png"

# Tasks (issue 42): a tiny GPT-2 and a tiny CLIP of tests/fixtures/task_models.py (random weights, built offline).
python - "$tmp" <<'PY'
import sys
sys.path.insert(0, ".")
from pathlib import Path
from tests.fixtures.task_models import save_task_model
for kind in ("gpt2", "clip"):
    save_task_model(kind, Path(sys.argv[1]) / f"tiny-{kind}")
PY
inspect-model attributions "$tmp/tiny-gpt2" --weights default --text "the cat sat on the" --target-text " mat" \
  -m saliency,input-x-gradient,ig --output-dir "$tmp/lm" --quiet > /dev/null
cp "$tmp"/lm/images/0000-text-0/integrated-gradients.*.heatmap.png "$out/task_causal_lm.png"
inspect-model attributions "$tmp/tiny-clip" sample_images/cat.jpg --weights default --text "a cat" --text "a dog" \
  --target top:2 -m saliency,ig --output-dir "$tmp/clip" --quiet > /dev/null
cp "$tmp/clip/contact_sheet_001.png" "$out/task_contrastive.png"

# Detection and segmentation: the tiny Faster R-CNN and FCN of tests/fixtures/dense.py, trained
# here in about a minute on synthetic shapes (red squares: class 1, blue discs: class 2), so these
# maps show what a trained model looks at.
python - "$tmp" <<'PY'
import sys
from pathlib import Path
from PIL import Image
sys.path.insert(0, "tests")
from fixtures.dense import scene
tmp = Path(sys.argv[1])
for k in range(3):
    img, _ = scene(90000 + k)
    Image.fromarray((img.permute(1, 2, 0).numpy() * 255).astype("uint8")).resize((384, 384), Image.NEAREST) \
        .save(tmp / f"scene{k}.png")
(tmp / "dense_models.py").write_text(
    "import sys\nsys.path.insert(0, 'tests')\nfrom fixtures.dense import tiny_detector, tiny_segmenter\n"
    "def detector():\n    return tiny_detector(200)\ndef segmenter():\n    return tiny_segmenter(200)\n")
PY
small=(--resize 96 --crop 96 --mean 0 --std 1)
inspect-model cam "$tmp/dense_models.py:detector" "$tmp"/scene0.png "$tmp"/scene2.png "${small[@]}" \
  --score-threshold 0.5 --max-detections 2 -m gradcam -m layercam -m eigencam -o "$tmp/det" --quiet > /dev/null
cp "$tmp/det/contact_sheet_001.png" "$out/detection_contact_sheet.png"
inspect-model cam "$tmp/dense_models.py:segmenter" "$tmp"/scene1.png "${small[@]}" -m gradcam -o "$tmp/seg" \
  --quiet > /dev/null
cp "$tmp"/seg/images/0000-scene1/legend.png "$out/segmentation_legend.png"
cp "$tmp"/seg/images/0000-scene1/gradcam.backbone.layer2.c1.overlay.png "$out/segmentation_class1.png"
python sample_images/readme/make_generation_picture.py > /dev/null  # README "Language models": generation_matrix.png
# lens (issue 36): a tiny GPT-2 of tests/fixtures/lm_models.py trained here in seconds on the fixture sentences.
python - "$tmp" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "tests")
from fixtures.lm_models import save_lm
save_lm("gpt2", Path(sys.argv[1]) / "tiny-lm", trained=True)
PY
inspect-model lens "$tmp/tiny-lm" --weights default --text "the cat sat on the mat" --text "the movie was very good" \
  --sites resid,attn,mlp -o "$tmp/lens" --quiet > /dev/null
cp "$tmp"/lens/images/0000-text-0/lens_resid.png "$out/lens_resid.png"
cp "$tmp"/lens/kl_by_depth.png "$out/lens_kl.png"
echo "pictures written to $out"
