"""Cost of the background memory monitor: the same run with it off and at 4 Hz, interleaved.

    .venv/bin/python -m bench.monitor_overhead [--steps 30] [--repeats 2]

Runs the text-demo preset off/on/off/on... and compares the median real tokens/s (the machine
is shared: interleaving spreads its noise over both arms). Target: under 3% slower.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from lora_gui.engine.text import train_text
from lora_gui.presets import load_config


def sample_cost_s(n: int = 2000) -> float:
    """Seconds one monitor sample takes (median of n), measured directly: the stable figure."""
    from lora_gui.memory.monitor import MemoryMonitor

    monitor = MemoryMonitor(lambda s: None, live_bytes=lambda: 0)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        monitor.sample()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-monitor"))
    args = parser.parse_args()
    speeds: dict[float, list[float]] = {0.0: [], 4.0: []}
    for rep in range(args.repeats):
        for hz in speeds:
            cfg = load_config("text-demo", {"max_steps": args.steps, "monitor_hz": hz})
            s = train_text(cfg, args.out / f"hz{hz:g}-{rep}", overwrite=True, progress=False)
            speeds[hz].append(s["real_tokens_per_s"])
            print(f"monitor {hz:g} Hz, run {rep}: {s['real_tokens_per_s']:.0f} real tokens/s", flush=True)
    off, on = statistics.median(speeds[0.0]), statistics.median(speeds[4.0])
    cost = sample_cost_s()
    print(f"\none sample costs {cost * 1e6:.0f} us of CPU: at 4 Hz that is {4 * cost:.4%} of one core")
    print("\n| monitor | median real tokens/s | runs |\n|---|---|---|")
    print(f"| off | {off:.0f} | {len(speeds[0.0])} |\n| 4 Hz | {on:.0f} | {len(speeds[4.0])} |")
    print(f"\nslowdown with the monitor: {1 - on / off:+.1%} (target < 3%)")


if __name__ == "__main__":
    main()
