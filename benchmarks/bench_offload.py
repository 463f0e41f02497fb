"""Models larger than memory (issue 37): ``activations --text ... --offload`` on a Llama-3-8B-shaped
model of random bfloat16 weights (16.1 GB of safetensors shards), on a machine with 24 GiB.

The model is written once (config, shards of at most 2 GB, the index, a small word-level
tokenizer) to ``~/.cache/inspect-model-bench/`` (``INSPECT_MODEL_BENCH_CACHE``), outside the
repository, and reused. Every run is the real CLI in a child process; its peak RSS is read by
its parent with ``getrusage(RUSAGE_CHILDREN)``. Before each offloaded run the shards are
evicted from the page cache (``posix_fadvise(DONTNEED)``), so the weights come from the disk.

Rows:
- peak RSS of the offloaded 8B run (goal <= 3 GiB);
- its wall time against the floor: the shards' bytes / the disk's read speed (measured on the
  shards, evicted first) + the forward compute (one decoder block timed alone on the same
  tokens, times the block count, + the embedding and the head's matmul) + the interpreter
  and imports (``python -c "import ..."``) (goal <= 1.5x);
- a Llama-3.2-1B-shaped model (2.5 GB), resident against offloaded: wall and peak RSS.

Quick mode runs the 1B rows only; smoke mode a 4-block model of a few MB.

    python benchmarks/bench_offload.py [--mode full|quick|smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TITLE = "offload"
TEXT = "the cat sat on the mat and the dog ran to the park"
SHAPES = {  # name -> LlamaConfig keywords
    "llama8b": dict(vocab_size=128256, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                    num_key_value_heads=8, intermediate_size=14336, tie_word_embeddings=False),
    "llama1b": dict(vocab_size=128256, hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                    num_key_value_heads=8, intermediate_size=8192, tie_word_embeddings=True),
    "tiny": dict(vocab_size=512, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=256, tie_word_embeddings=False),
}
SHARD_BYTES = 2 * 10**9
WORDS = "the cat sat on mat and dog ran to park a is was very good bad".split()


def cache_dir() -> Path:
    return Path(os.environ.get("INSPECT_MODEL_BENCH_CACHE") or Path.home() / ".cache" / "inspect-model-bench")


def write_model(name: str, log: Any = print) -> Path:
    """The bfloat16 random model ``name`` as a save_pretrained folder (written once)."""
    import torch
    import transformers
    from accelerate import init_empty_weights
    from safetensors.torch import save_file

    folder = cache_dir() / f"{name}-bf16"
    if (folder / "complete").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    cfg = transformers.LlamaConfig(**SHAPES[name], architectures=["LlamaForCausalLM"], bos_token_id=1,
                                   eos_token_id=2, pad_token_id=0, dtype="bfloat16")
    cfg.save_pretrained(folder)
    with init_empty_weights():
        empty = transformers.LlamaForCausalLM(cfg)
    if cfg.tie_word_embeddings:
        empty.tie_weights()
    names = {id(p): n for n, p in empty.named_parameters()}  # tied: the first name only
    params = [(n, p.shape) for n, p in empty.named_parameters() if names[id(p)] == n]
    gen = torch.Generator().manual_seed(0)
    weight_map: dict[str, str] = {}
    shard: dict[str, Any] = {}
    size, count, start = 0, 0, time.perf_counter()
    total = sum(torch.Size(s).numel() * 2 for _, s in params)
    files: list[tuple[str, dict[str, Any]]] = []

    def flush() -> None:
        nonlocal shard, size, count
        if shard:
            count += 1
            fn = f"model-{count:05d}.safetensors"
            save_file(shard, str(folder / fn), metadata={"format": "pt"})
            files.append((fn, dict.fromkeys(shard)))
            for key in shard:
                weight_map[key] = fn
            log(f"  wrote {fn} ({size / 1e9:.2f} GB; {time.perf_counter() - start:.0f} s)")
            shard, size = {}, 0

    for key, shape in params:
        t = torch.empty(shape, dtype=torch.bfloat16)
        if key.endswith("norm.weight"):
            t.fill_(1.0)
        else:
            t.normal_(0.0, 0.02, generator=gen)
        if size + t.numel() * 2 > SHARD_BYTES:
            flush()
        shard[key] = t
        size += t.numel() * 2
    flush()
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    _tokenizer().save_pretrained(folder)
    (folder / "complete").write_text(f"{total}\n")
    return folder


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3} | {w: i + 4 for i, w in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def evict(folder: Path) -> None:
    """Drop the shards' pages from the page cache: the next read comes from the disk."""
    for f in shards(folder):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def disk_read_speed(folder: Path, limit: int = 4 * 10**9) -> float:
    """Bytes per second reading the (evicted) shards sequentially, up to ``limit`` bytes."""
    evict(folder)
    done, start = 0, time.perf_counter()
    buf = bytearray(16 * 2**20)
    for f in shards(folder):
        with open(f, "rb", buffering=0) as fh:
            while done < limit:
                n = fh.readinto(buf)
                if not n:
                    break
                done += n
        if done >= limit:
            break
    seconds = time.perf_counter() - start
    evict(folder)
    return done / seconds


PEAK = """
import json, resource, subprocess, sys, time
t = time.perf_counter()
r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(json.dumps({"rc": r.returncode, "wall": time.perf_counter() - t, "stderr": r.stderr[-2000:],
                  "peak": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))
"""


def run_cli(*args: str) -> dict[str, Any]:
    """The CLI in a child: its wall time and peak RSS (bytes)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, "-c", PEAK, sys.executable, "-m", "inspect_model", *args],
                       capture_output=True, text=True, env=env)
    doc = json.loads(r.stdout)
    if doc["rc"] != 0:
        raise RuntimeError(f"inspect-model {' '.join(args)} failed: {doc['stderr'][-600:]}")
    return doc


def startup_seconds() -> float:
    """The interpreter and the imports every run pays, in a child."""
    code = "import torch, transformers, accelerate, transformers.models.llama.modeling_llama, inspect_model.cli.app"
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - t


def compute_seconds(name: str, tokens: int, repeats: int = 2) -> float:
    """The forward's arithmetic, block by block: one decoder block of random bfloat16 weights
    timed on ``tokens`` positions, times the block count, + the embedding and the head."""
    import torch
    import transformers
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = transformers.LlamaConfig(**SHAPES[name])
    torch.manual_seed(0)
    with torch.device("cpu"):
        block = LlamaDecoderLayer(cfg, layer_idx=0).to(torch.bfloat16).eval()
        rope = LlamaRotaryEmbedding(cfg)
        head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=torch.bfloat16)
    x = torch.randn(1, tokens, cfg.hidden_size, dtype=torch.bfloat16)
    pos = torch.arange(tokens)[None]
    emb = rope(x, pos)
    best_block = best_head = float("inf")
    with torch.no_grad():
        for _ in range(repeats):
            t = time.perf_counter()
            block(x, position_embeddings=emb, position_ids=pos)
            best_block = min(best_block, time.perf_counter() - t)
            t = time.perf_counter()
            head(x)
            best_head = min(best_head, time.perf_counter() - t)
    return best_block * cfg.num_hidden_layers + best_head


def offload_rows(name: str, label: str, ctx: Any) -> list[Any]:
    from common import Row, Target

    folder = write_model(name, ctx.log)
    nbytes = sum(f.stat().st_size for f in shards(folder))
    speed = disk_read_speed(folder)
    tokens = len(TEXT.split()) + 1
    compute = compute_seconds(name, tokens)
    start = startup_seconds()
    evict(folder)
    run = run_cli("activations", str(folder), "--text", TEXT, "--dtype", "bfloat16", "--offload", "-q", "--json")
    floor = nbytes / speed + compute + start
    what = (f"{nbytes / 1e9:.1f} GB / {speed / 1e9:.2f} GB/s + compute {compute:.1f} s + start-up {start:.1f} s")
    return [
        Row(TITLE, f"activations --text --offload, {label} bf16 ({nbytes / 1e9:.1f} GB): peak RSS",
            run["peak"] / 2**20, None, Target("max", 3 * 1024, "<= 3 GiB"), unit="MiB"),
        Row(TITLE, f"activations --text --offload, {label} bf16: wall", run["wall"], floor,
            Target("ratio", 1.5, "<= 1.5x (disk + compute)"), floor_what=what),
    ]


def resident_rows(name: str, label: str, ctx: Any) -> list[Any]:
    from common import Row, Target

    folder = write_model(name, ctx.log)
    args = ("activations", str(folder), "--text", TEXT, "--dtype", "bfloat16", "-q", "--json")
    resident = run_cli(*args)
    evict(folder)
    offloaded = run_cli(*args, "--offload")
    return [
        Row(TITLE, f"activations --text, {label} bf16: offloaded vs resident (wall)", offloaded["wall"],
            resident["wall"], Target("info", text="(none set)"), floor_what="resident"),
        Row(TITLE, f"activations --text, {label} bf16: offloaded vs resident (peak RSS)", offloaded["peak"] / 2**20,
            resident["peak"] / 2**20, Target("info", text="(none set)"), unit="MiB", floor_what="resident"),
    ]


def measure(ctx: Any) -> list[Any]:
    if ctx.mode == "smoke":
        return resident_rows("tiny", "4-block Llama", ctx)
    rows = resident_rows("llama1b", "Llama-3.2-1B-shaped", ctx)
    if ctx.mode == "full":
        rows = offload_rows("llama8b", "Llama-3-8B-shaped", ctx) + rows
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("full", "quick", "smoke"), default="full")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch

    from common import Context, sizes_for

    ctx = Context(torch.device("cpu"), args.mode, 1, sizes_for("cpu", args.mode), {})
    for row in measure(ctx):
        unit = row.unit
        floor = f"{row.floor:.2f} {unit}" if row.floor is not None else "-"
        ratio = f"{row.ratio:.2f}x" if row.ratio is not None else "-"
        print(f"{row.work}: {row.ours:.2f} {unit}; floor {floor} ({row.floor_what}); {ratio}; target "
              f"{row.target.text}: {({True: 'pass', False: 'FAIL', None: '-'})[row.result]}")
    print(f"load average {os.getloadavg()[0]:.1f}; peak RSS of this process "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
