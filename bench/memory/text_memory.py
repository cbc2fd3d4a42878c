"""Traditional vs optimized text LoRA on the bundled fine-tune corpus, side by side in one run.

    .venv/bin/python -m bench.memory.text_memory [--epochs 1] [--max-seq-len 1024] [--modes ...]

Every mode trains the same training documents for the same number of epochs (same samples per
optimizer step), so peak memory, real tokens/s and held-out eval loss compare like for like.
Memory is the tracker's per-step peak of live tensor bytes (source: tracker) on this CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import torch

from bench.common import markdown_table, write_results
from lora_gui.config import apply_overrides
from lora_gui.engine.text.train import train_text
from lora_gui.presets import load_config

MODES = {
    "traditional": {"mode": "traditional"},
    "optimized": {"mode": "optimized"},
    "optimized-packed": {"mode": "optimized", "batching": "packed"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-seq-len", type=int, default=1024)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--out", type=Path, default=Path("runs/bench-text"))
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    base = load_config("text-demo", {"max_steps": 0, "epochs": args.epochs,
                                     "max_seq_len": args.max_seq_len})
    rows = []
    for name in args.modes.split(","):
        cfg = apply_overrides(base, MODES[name])
        s = train_text(cfg, args.out / name, overwrite=True, progress=False)
        rows.append({"mode": name, "steps": s["steps"], "real_tokens": s["real_tokens"],
                     "padded_tokens": s["padded_tokens"], "padding_efficiency": s["padding_efficiency"],
                     "peak_bytes": s["peak_bytes"], "memory_source": s["memory_source"],
                     "real_tokens_per_s": s["real_tokens_per_s"], "train_seconds": s["train_seconds"],
                     "eval_loss": s["eval_loss"], "base_eval_loss": s["base_eval_loss"]})
        print(json.dumps(rows[-1]), flush=True)
    trad = rows[0]
    print(f"\nmachine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    columns = ["mode", "steps", "real tokens", "padding eff.", "peak MiB (tracker)", "peak vs trad.",
               "real tokens/s", "speed vs trad.", "eval loss", "vs trad."]
    print("\n" + markdown_table(columns, [
        [r["mode"], r["steps"], r["real_tokens"], f"{r['padding_efficiency']:.1%}",
         f"{r['peak_bytes'] / 2**20:.0f}", f"{r['peak_bytes'] / trad['peak_bytes']:.2f}x",
         f"{r['real_tokens_per_s']:.0f}", f"{r['real_tokens_per_s'] / trad['real_tokens_per_s']:.1f}x",
         f"{r['eval_loss']:.4f}", f"{(r['eval_loss'] / trad['eval_loss'] - 1):+.2%}"] for r in rows]))
    print(f"\nbase model eval loss (before LoRA): {trad['base_eval_loss']:.4f}")
    if args.json:
        write_results(args.json, {"rows": rows})  # stamped: the commit and planner that made it


if __name__ == "__main__":
    main()
