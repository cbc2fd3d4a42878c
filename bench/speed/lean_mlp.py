"""The gated MLP's lean backward (``lora_gui.models.lean_mlp``, part of ``lean_backward``) on and off.

    OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python -m bench.speed.lean_mlp [--rounds 3] [--docs 192]

1. Planned peaks at real models' shapes (source: predicted; the fake-tensor trace of one LoRA
   step on CUDA in bf16, SDPA, all-linear LoRA r16, the chunked loss, every other lean layer on):
   Qwen2.5-0.5B at 4k tokens, Llama-3.1-8B at 2k and 8k, without checkpointing (with it the
   layers step aside: 8k with checkpointing is the control row).
2. Measured on this CPU (source: tracker) on the TRL bench's work (the text demo's model and
   settings, one epoch of ``--docs`` documents, bucketed micro-batches, no checkpointing) in
   fp32 and bf16: each run's peak, its plan against it, and real tokens per second, on and off
   alternating, the order flipped every round (the first run of each precision is a warm-up).

The off arm is the engine with the MLPs as transformers runs them (every other lean layer on).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

import lora_gui.models.lean_backward as lean_backward
from bench.common import pin_threads, round_order
from bench.peers.trl_sft import bench_run_config, run_lora
from lora_gui.memory.predict.trace import trace_text_step

MiB = 2**20
PLANS = (("qwen2.5-0.5b", {"seq_len": 4096}), ("llama-3.1-8b", {"seq_len": 2048}),
         ("llama-3.1-8b", {"seq_len": 8192}),
         ("llama-3.1-8b", {"seq_len": 8192, "gradient_checkpointing": True}))
_LEAN = lean_backward.lean_gated_mlps  # what lean_frozen_layers calls


@contextlib.contextmanager
def mlps(on: bool) -> Iterator[None]:
    """The gated MLPs lean (the engine's default) or as transformers runs them."""
    lean_backward.lean_gated_mlps = _LEAN if on else (lambda module: 0)
    try:
        yield
    finally:
        lean_backward.lean_gated_mlps = _LEAN


def planned() -> None:
    print("| model | shape | planned peak MiB off / on | change | activations MiB off / on | change |")
    print("|---|---|---|---|---|---|")
    for name, shape in PLANS:
        traces = []
        for on in (False, True):
            with mlps(on):
                traces.append(trace_text_step(name, batch_size=1, dtype=torch.bfloat16, device="cuda",
                                              lora_rank=16, loss_chunk=1024, **shape))
        off, on_ = traces
        a_off, a_on = off.breakdown["activations"], on_.breakdown["activations"]
        px = ", ".join(f"{k} {v}" for k, v in shape.items())
        print(f"| {name} | {px} | {off.peak_bytes / MiB:,.0f} / {on_.peak_bytes / MiB:,.0f} | "
              f"{on_.peak_bytes / off.peak_bytes - 1:+.1%} | {a_off / MiB:,.0f} / {a_on / MiB:,.0f} | "
              f"{a_on / a_off - 1:+.1%} |", flush=True)


def measured(rounds: int, docs: int, precisions: list[str]) -> None:
    folder = Path(tempfile.mkdtemp(prefix="lean_mlp_"))
    print("\n| precision | MLPs | peak MiB (tracker) | plan vs peak | real tok/s per round | median |"
          " speed on / off, median of rounds |")
    print("|---|---|---|---|---|---|---|")
    for precision in precisions:
        cfg = bench_run_config(docs, precision, folder)
        run_lora("lora", cfg, folder)  # warm-up: the first run of a process builds its kernels
        rows: dict[bool, list[dict]] = {True: [], False: []}
        for r in range(rounds):
            for on in round_order((True, False), r):
                with mlps(on):
                    rows[on].append(run_lora("lora", cfg, folder))
        ratios = [a["real_tokens_per_s"] / b["real_tokens_per_s"] for a, b in zip(rows[True], rows[False])]
        for on in (False, True):
            speeds = [row["real_tokens_per_s"] for row in rows[on]]
            row = rows[on][0]
            ratio = f"{statistics.median(ratios):.3f}x" if on else ""
            print(f"| {precision} | {'lean' if on else 'as transformers'} | {row['peak_bytes'] / MiB:.1f} | "
                  f"{row['predicted_vs_measured']:+.3%} | {', '.join(f'{s:.0f}' for s in speeds)} | "
                  f"{statistics.median(speeds):.0f} | {ratio} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--docs", type=int, default=192, help="training documents (one epoch)")
    parser.add_argument("--skip-plans", action="store_true")
    parser.add_argument("--precisions", default="fp32,bf16")
    args = parser.parse_args()
    pin_threads(1)
    if not args.skip_plans:
        planned()
    measured(args.rounds, args.docs, args.precisions.split(","))


if __name__ == "__main__":
    main()
