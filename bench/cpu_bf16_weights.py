"""A CPU text run in bf16 with its frozen weights in float32 (as before) or in bf16 (now), side
by side on the TRL bench's work: real tokens per second and peak.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.cpu_bf16_weights [--docs 192] [--rounds 2]

The TRL bench's documents (bench/peer_trl.py) through lora_gui's engine with precision bf16, its
three runs (bucketed, with checkpointing, packed with checkpointing), both arms in every round,
the order reversed every other round; medians over rounds. The float32 arm puts back the old rule
(float32 frozen weights on a CPU, autocast casting each weight in every forward) by replacing the
engine's ``weights_dtype`` for the run: a diagnosis, not a setting. The run's own plan is of the
bf16 weights, so only the bf16 arm's plan is printed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

import lora_gui.engine.text.train as text_train
from bench.peer_trl import bench_run_config, run_lora

MiB = 2**20
RUNS = ["lora", "lora-gc", "lora-gc-packed"]


def _arm(bf16_weights: bool) -> None:
    """The engine's frozen-weights rule for the next runs."""
    from lora_gui.models import precision

    text_train.weights_dtype = precision.weights_dtype if bf16_weights else \
        (lambda mixed, device_type, text=False: torch.float32)
    text_train.cast_frozen = precision.cast_frozen if bf16_weights else (lambda model, dtype: 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=192)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = Path(tempfile.mkdtemp(prefix="bf16-weights-"))
    cfg = bench_run_config(args.docs, "bf16", folder)
    speeds: dict[tuple[str, bool], list[float]] = {}
    rows: dict[tuple[str, bool], dict] = {}
    for r in range(args.rounds):
        for name in RUNS:
            for bf16_weights in (False, True) if r % 2 == 0 else (True, False):
                _arm(bf16_weights)
                row = run_lora(name, cfg, folder)
                rows[name, bf16_weights] = row
                speeds.setdefault((name, bf16_weights), []).append(row["real_tokens_per_s"])
                print(f"{name} {'bf16' if bf16_weights else 'float32'} weights: "
                      f"{row['real_tokens_per_s']:.0f} tok/s", flush=True)
    _arm(True)
    source = rows[RUNS[0], True]["memory_source"]
    print(f"\n{args.docs} documents, {args.rounds} rounds; peaks: source {source}")
    print("| run | float32 weights: peak MiB | bf16 weights: peak MiB | bf16 weights: plan vs peak | "
          "float32 weights: tok/s per round | bf16 weights: tok/s per round | speed-up (medians) |")
    print("|---|---|---|---|---|---|---|")
    for name in RUNS:
        before, after = rows[name, False], rows[name, True]
        ratio = statistics.median(speeds[name, True]) / statistics.median(speeds[name, False])
        print(f"| {name} | {before['peak_bytes'] / MiB:.1f} | {after['peak_bytes'] / MiB:.1f} | "
              f"{after['predicted_vs_measured']:+.3%} | "
              f"{', '.join(f'{s:.0f}' for s in speeds[name, False])} | "
              f"{', '.join(f'{s:.0f}' for s in speeds[name, True])} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
