"""The bucketed batches' pad_multiple, side by side: real tokens per second, padded tokens, peak.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.pad_multiple [--docs 192] [--rounds 3] [--multiples 64,16,8]

The TRL bench's work (bench/peer_trl.py: the bundled corpus's documents, the built-in Llama, LoRA
r8 all-linear, 8 documents a step, one epoch) through lora_gui's engine, with and without
gradient checkpointing, once per multiple in every round (the order reversed every other round);
medians over rounds, and each multiple's median against the first one's.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from bench.peer_trl import bench_run_config, json_lines, run_lora
from lora_gui.config import apply_overrides

MiB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=192)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--multiples", default="64,16,8")
    parser.add_argument("--precision", default="auto")
    args = parser.parse_args()
    torch.set_num_threads(1)
    multiples = [int(m) for m in args.multiples.split(",")]
    folder = Path(tempfile.mkdtemp(prefix="pad-multiple-"))
    cfg = bench_run_config(args.docs, args.precision, folder)
    speeds: dict[tuple[str, int], list[float]] = {}
    rows: dict[tuple[str, int], dict] = {}
    for r in range(args.rounds):
        for name in ("lora", "lora-gc"):
            for pm in multiples if r % 2 == 0 else multiples[::-1]:
                row = run_lora(name, apply_overrides(cfg, {"pad_multiple": pm}), folder)
                steps = json_lines(folder / name / "metrics.jsonl")
                speeds.setdefault((name, pm), []).append(row["real_tokens_per_s"])
                rows[name, pm] = {**row, "padded": sum(s["padded_tokens"] for s in steps),
                                  "micro_batches": sum(s["micro_batches"] for s in steps)}
                print(f"round {r} {name} pad_multiple {pm}: {row['real_tokens_per_s']:.0f} tok/s", flush=True)
    print("\n| run | pad_multiple | real / padded tokens | micro-batches | peak MiB (tracker) | mean loss "
          "| real tok/s per round | median | against the first multiple |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (name, pm), row in rows.items():
        med = statistics.median(speeds[name, pm])
        first = statistics.median(speeds[name, multiples[0]])
        print(f"| {name} | {pm} | {row['real_tokens']} / {row['padded']} | {row['micro_batches']} | "
              f"{row['peak_bytes'] / MiB:.1f} | {row['train_loss']:.5f} | "
              f"{', '.join(f'{s:.0f}' for s in speeds[name, pm])} | {med:.0f} | {med / first:.3f}x |")


if __name__ == "__main__":
    main()
