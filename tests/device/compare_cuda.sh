#!/bin/bash
# compare --against-device cuda on a GPU machine (issue 38): resnet18 on the CPU against its
# copy on the GPU; prints the headline, the largest per-layer relative error and the memory line.
export PYTHONPATH=$PWD/src
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || exit 3
python -m inspect_model compare resnet18 --weights none --input-size 3x128x128 --against-device cuda \
  --json > "$OUT/cuda.json" 2> "$OUT/cuda.err"; echo "exit $?"
python - <<'PY'
import json, os
d = json.load(open(os.path.join(os.environ["OUT"], "cuda.json")))
print(d["other"], d["against"], d["matched"], "first divergent:", d["first_divergent"])
print("max rel err", max(r["relative_error"] for r in d["layers"]), "memory", d["memory"])
print("outputs", d["outputs"])
PY
tail -3 "$OUT/cuda.err"
