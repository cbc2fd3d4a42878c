"""Cost of one chart refresh (one timer tick) for a long run: a 10-hour run at 2 Hz.

    .venv/bin/python -m bench.chart_refresh [--hours 10] [--hz 2] [--step-s 2] [--repeats 15]

Builds the four Train-tab figures (memory over time, peak per step, loss with its EMA,
throughput) from a synthetic history of that length and serialises them to JSON as gradio does
before sending them to the page; the figure is the median seconds of a whole tick. Side by side
in one process: the charts as shipped (downsampled to at most 2,000 points a curve, min-max so
peaks stay) and the same charts with the full history. Target: under 200 ms a tick.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from typing import Any

from lora_gui.ui import charts


def history(hours: float, hz: float, step_s: float) -> tuple[list[dict], list[dict], list[tuple[str, float]]]:
    """Memory samples at ``hz`` and one step record every ``step_s`` seconds over ``hours``."""
    rng = random.Random(0)
    n_samples, n_steps = int(hours * 3600 * hz), int(hours * 3600 / step_s)
    samples = [{"time": i / hz,
                "tracker_live_bytes": int(1.5e9 + 3e8 * math.sin(i / 50) + rng.random() * 1e8)}
               for i in range(n_samples)]
    records = [{"step": i + 1, "loss": 3.0 * math.exp(-i / n_steps * 3) + rng.random() * 0.3,
                "peak_bytes": int(1.8e9 + rng.random() * 2e8), "memory_source": "tracker",
                "tokens_per_s": 4000 + rng.random() * 500, "real_tokens": 900, "padded_tokens": 1024}
               for i in range(n_steps)]
    return samples, records, [("loading", 0.0), ("training", 30.0)]


def tick(samples: list[dict], records: list[dict], phases: list[tuple[str, float]]) -> int:
    """One refresh: the four figures, as JSON (bytes sent)."""
    figs: list[Any] = [charts.memory_timeline(samples, phases, int(2e9), int(1.9e9)),
                       charts.memory_figure(records, int(2e9), int(1.9e9)),
                       charts.loss_figure(records, smoothing=0.9), charts.throughput_figure(records)]
    return sum(len(f.to_json()) for f in figs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hours", type=float, default=10.0)
    parser.add_argument("--hz", type=float, default=2.0)
    parser.add_argument("--step-s", type=float, default=2.0, help="seconds per training step")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    samples, records, phases = history(args.hours, args.hz, args.step_s)
    shipped = charts.downsample
    arms = {"downsampled": shipped, "full history": lambda xs, ys: (list(xs), list(ys))}
    times: dict[str, list[float]] = {name: [] for name in arms}
    sizes: dict[str, int] = {}
    for _ in range(args.repeats):  # arms alternate so machine drift falls on both alike
        for name, fn in arms.items():
            charts.downsample = fn
            start = time.perf_counter()
            sizes[name] = tick(samples, records, phases)
            times[name].append(time.perf_counter() - start)
    charts.downsample = shipped
    print(f"history: {len(samples):,} memory samples, {len(records):,} steps "
          f"({args.hours:g} h at {args.hz:g} Hz, a step every {args.step_s:g} s)")
    for name in arms:
        print(f"{name:>13}: median {statistics.median(times[name]) * 1000:7.1f} ms a tick "
              f"(min {min(times[name]) * 1000:.1f}, max {max(times[name]) * 1000:.1f}), "
              f"{sizes[name] / 1e6:.2f} MB of JSON")
    ratio = statistics.median(times["full history"]) / statistics.median(times["downsampled"])
    verdict = "met" if statistics.median(times["downsampled"]) < 0.2 else "MISSED"
    print(f"full / downsampled: {ratio:.1f}x; target under 200 ms a tick: {verdict}")


if __name__ == "__main__":
    main()
