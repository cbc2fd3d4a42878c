"""Cost of the background memory monitor on training throughput.

    .venv/bin/python -m bench.speed.monitor_overhead [--blocks 12] [--steps-per-block 10] [--hz 4]

One process, one model, one fixed optimized-mode batch from the bundled corpus: blocks of
training steps alternate monitor off / on (at ``--hz``), so process start-up, data and machine
drift fall on both arms alike; the figure is the ratio of median step times. Also prints the CPU
cost of one sample measured directly. Target (issue 3): under 3% slower.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from accelerate import Accelerator

from lora_gui.data.batching import MicroBatch, Step
from lora_gui.engine.text.train import load_text_data, run_step
from lora_gui.memory.runtime.monitor import MemoryMonitor
from lora_gui.memory.runtime.tracker import StorageTracker
from lora_gui.models import text as text_models
from lora_gui.presets import load_config


def sample_cost_s(n: int = 2000) -> float:
    """Seconds one monitor sample takes (median of n)."""
    monitor = MemoryMonitor(lambda s: None, live_bytes=lambda: 0)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        monitor.sample()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--steps-per-block", type=int, default=5)
    parser.add_argument("--hz", type=float, default=4.0)
    args = parser.parse_args()
    cfg = load_config("text-demo")
    source = text_models.resolve_model_source(cfg.model)
    data = load_text_data(cfg, text_models.load_tokenizer(source))
    model = text_models.attach_lora(text_models.load_model_for(cfg, source), cfg)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    accel = Accelerator(cpu=True)
    ids = tuple(range(8))
    step = Step((MicroBatch(ids, 256),))  # 8 samples padded to 256 tokens: a typical demo step
    times: dict[bool, list[float]] = {False: [], True: []}
    block_medians: list[float] = []
    samples: list[dict] = []
    with StorageTracker() as tracker:  # the demo measures memory with the tracker too
        tracker.track(list(model.parameters()))
        for block in range(args.blocks):
            on = block % 2 == 1
            monitor = MemoryMonitor(samples.append, 1 / args.hz, lambda: tracker.live_bytes) if on else None
            if monitor:
                monitor.__enter__()
            block_times = []
            for _ in range(args.steps_per_block):
                start = time.perf_counter()
                run_step(model, accel, data, step)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                block_times.append(time.perf_counter() - start)
            times[on] += block_times
            block_medians.append(statistics.median(block_times))
            if monitor:
                monitor.__exit__(None, None, None)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    cost = sample_cost_s()
    print("| monitor | median step time | steps |\n|---|---|---|")
    print(f"| off | {off * 1e3:.1f} ms | {len(times[False])} |")
    print(f"| {args.hz:g} Hz | {on * 1e3:.1f} ms | {len(times[True])} ({len(samples)} samples taken) |")
    # Each on-block against the mean of its off-neighbours cancels the machine's drift.
    paired = [block_medians[i] / ((block_medians[i - 1] + block_medians[i + 1]) / 2)
              for i in range(1, len(block_medians) - 1, 2)]
    q = statistics.quantiles(paired, n=4)
    print(f"\nslowdown with the monitor: {on / off - 1:+.1%} on medians; paired blocks: median "
          f"{statistics.median(paired) - 1:+.1%} (quartiles {q[0] - 1:+.1%} .. {q[2] - 1:+.1%}); "
          "target < 3%")
    print(f"one sample costs {cost * 1e6:.0f} us of CPU: at {args.hz:g} Hz that is "
          f"{args.hz * cost:.4%} of one core")


if __name__ == "__main__":
    main()
