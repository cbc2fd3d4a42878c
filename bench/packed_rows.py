"""Packed rows side by side: how long a row may be (token_budget) and what it is padded to
(pad_multiple), on the TRL bench's work: real tokens per second, peak, the run's own plan.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.packed_rows [--docs 192] [--rounds 2] [--precision bf16]

The TRL bench's documents (bench/peer_trl.py: the bundled corpus, the built-in Llama, LoRA r8
all-linear, 8 documents a step, one epoch) packed with gradient checkpointing (its
``lora-gc-packed`` run) through lora_gui's engine, once per arm in every round, the order
reversed every other round; medians over rounds. Arms: rows of at most 1,024 tokens (one
sample's length, ``token_budget`` 1024: what a packed row held before) or 2,048 (the default
budget), each unpadded (``pad_multiple`` 1) or padded to a multiple of 8 (the default).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from bench.peer_trl import bench_run_config, run_lora
from lora_gui.config import apply_overrides

MiB = 2**20
ARMS = [(1024, 1), (1024, 8), (2048, 1), (2048, 8)]  # (token_budget, pad_multiple)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=192)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--precision", default="bf16")
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = Path(tempfile.mkdtemp(prefix="packed-rows-"))
    cfg = bench_run_config(args.docs, args.precision, folder)
    speeds: dict[tuple[int, int], list[float]] = {arm: [] for arm in ARMS}
    rows: dict[tuple[int, int], dict] = {}
    for r in range(args.rounds):
        for budget, multiple in ARMS if r % 2 == 0 else ARMS[::-1]:
            run_cfg = apply_overrides(cfg, {"token_budget": budget, "pad_multiple": multiple})
            row = run_lora("lora-gc-packed", run_cfg, folder)
            summary = json.loads((folder / "lora-gc-packed" / "run.json").read_text())
            rows[budget, multiple] = {**row, "padded_tokens": summary["padded_tokens"]}
            speeds[budget, multiple].append(row["real_tokens_per_s"])
            print(json.dumps({"token_budget": budget, "pad_multiple": multiple,
                              "real_tokens_per_s": round(row["real_tokens_per_s"], 1)}), flush=True)
    first = statistics.median(speeds[ARMS[0]])
    print(f"\n{args.precision}, {args.docs} documents, {args.rounds} rounds; peaks: source "
          f"{rows[ARMS[0]]['memory_source']}")
    print("| token_budget (row tokens at most) | pad_multiple | real / padded tokens | peak MiB | "
          "plan vs peak | real tok/s per round | median | against 1024, unpadded |")
    print("|---|---|---|---|---|---|---|---|")
    for arm in ARMS:
        row, median = rows[arm], statistics.median(speeds[arm])
        print(f"| {arm[0]} | {arm[1]} | {row['real_tokens']} / {row['padded_tokens']} | "
              f"{row['peak_bytes'] / MiB:.1f} | {row['predicted_vs_measured']:+.3%} | "
              f"{', '.join(f'{s:.0f}' for s in speeds[arm])} | {median:.0f} | {median / first:.3f}x |")


if __name__ == "__main__":
    main()
