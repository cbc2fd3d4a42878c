"""Cost of one chart refresh (one timer tick) for a long run: a 10-hour run at 2 Hz.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.ui.chart_refresh [--hours 10] [--hz 2] [--step-s 2]
        [--repeats 15] [--old-rev adf962d]

Builds the four Train-tab figures (memory over time, peak per step, loss with its EMA,
throughput) from a synthetic history of that length and serialises them to JSON as gradio does
before sending them to the page, as the Train tab's timer does every 2 s: the history grows by
the samples and steps of 2 s between ticks, and each tick gets a fresh copy of the lists (as
``job.snapshot()`` gives). The figure is the median seconds of a whole tick.

Side by side in one process, ticks alternating: the charts as they are (curves kept between
ticks, only new records read, figures built without per-property validation) and the charts of
``--old-rev`` (read from git: every tick re-reads and re-downsamples the whole history). The
first tick of each arm (a page opened on a long run) is reported apart. Target: under 200 ms.

Then the same ticks as the Train tab answers them now (lora_gui.ui.live_charts): the four charts
built once per tick for every page, and one page's answer, which holds only the points after
those the page holds (a page opened on the long run gets the whole charts once): ms and bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

from lora_gui.ui import charts, live_charts

OLD_REV = "adf962d"  # the charts before curves were kept between ticks


def history(hours: float, hz: float, step_s: float) -> tuple[list[dict], list[dict], list[tuple[str, float]]]:
    """Memory samples at ``hz`` and one step record every ``step_s`` seconds over ``hours``."""
    samples = [sample(i, hz) for i in range(int(hours * 3600 * hz))]
    n_steps = int(hours * 3600 / step_s)
    records = [record(i, n_steps) for i in range(n_steps)]
    return samples, records, [("loading", 0.0), ("training", 30.0)]


_RNG = random.Random(0)


def sample(i: int, hz: float) -> dict[str, Any]:
    return {"time": i / hz, "tracker_live_bytes": int(1.5e9 + 3e8 * math.sin(i / 50) + _RNG.random() * 1e8)}


def record(i: int, n_steps: int) -> dict[str, Any]:
    return {"step": i + 1, "loss": 3.0 * math.exp(-i / n_steps * 3) + _RNG.random() * 0.3,
            "peak_bytes": int(1.8e9 + _RNG.random() * 2e8), "memory_source": "tracker",
            "tokens_per_s": 4000 + _RNG.random() * 500, "real_tokens": 900, "padded_tokens": 1024}


def tick(module: Any, samples: list[dict], records: list[dict], phases: list[tuple[str, float]]) -> int:
    """One refresh with the chart module given: the four figures, as JSON (bytes sent)."""
    samples, records = list(samples), list(records)  # the job's snapshot copies
    figs: list[Any] = [module.memory_timeline(samples, phases, int(2e9), int(1.9e9)),
                       module.memory_figure(records, int(2e9), int(1.9e9)),
                       module.loss_figure(records, smoothing=0.9), module.throughput_figure(records)]
    return sum(len(f.to_json()) for f in figs)


def live_tick(version: int, samples: list[dict], records: list[dict], phases: list[tuple[str, float]],
              pages: live_charts.PageCursors, seen: str) -> str:
    """One tick of one page as the Train tab answers it: the charts' views (built once per tick
    for every page) and this page's answer (JSON; empty when nothing is new)."""
    samples, records = list(samples), list(records)
    specs = {"memory-plot": charts.timeline_spec(samples, phases, int(2e9), int(1.9e9)),
             "step-peak-plot": charts.memory_spec(records, int(2e9), int(1.9e9)),
             "loss-plot": charts.loss_spec(records, smoothing=0.9),
             "throughput-plot": charts.throughput_spec(records)}
    views = {chart_id: live_charts.ChartView(version, *spec) for chart_id, spec in specs.items()}
    return pages.answer("page", seen, views) or ""


def in_place(args: argparse.Namespace) -> None:
    """The ticks of one page that holds the previous answer, as the Train tab sends them now."""
    samples, records, phases = history(args.hours, args.hz, args.step_s)
    pages, seen, times, sizes = live_charts.PageCursors(), "", [], []
    per_tick = (round(2.0 * args.hz), max(1, round(2.0 / args.step_s)))
    for i in range(args.repeats + 1):
        if i:
            samples.extend(sample(len(samples) + k, args.hz) for k in range(per_tick[0]))
            records.extend(record(len(records) + k, len(records)) for k in range(per_tick[1]))
        start = time.perf_counter()
        answer = live_tick(i, samples, records, phases, pages, seen)
        seconds = time.perf_counter() - start
        if answer:
            seen = f"seen {json.loads(answer)['seq']}"
        if i:
            times.append(seconds)
            sizes.append(len(answer))
        else:
            first = (seconds, len(answer))
    print(f"{'in place (now)':>16}: median {statistics.median(times) * 1000:7.1f} ms a tick (max "
          f"{max(times) * 1000:.1f}), answer {statistics.median(sizes):,.0f} bytes (max {max(sizes):,}); "
          f"a page opened on the run: {first[0] * 1000:.1f} ms, {first[1]:,} bytes once")


def old_charts(rev: str) -> types.ModuleType:
    """lora_gui/ui/charts.py, series.py and (where it existed) history.py as they were at ``rev``
    (git show), as modules using each other, not today's."""
    root = Path(__file__).resolve().parents[2]

    def load(name: str, path: str, given: dict[str, Any]) -> types.ModuleType | None:
        shown = subprocess.run(["git", "-C", str(root), "show", f"{rev}:{path}"], capture_output=True,
                               text=True)
        if shown.returncode:
            return None
        lines = shown.stdout.splitlines()
        for i, line in enumerate(lines):  # their imports of each other: the old modules instead
            if line.startswith(("from lora_gui.ui.series import", "from lora_gui.ui.history import")):
                lines[i] = ""
        module = types.ModuleType(name)
        module.__dict__.update(given)
        exec(compile("\n".join(lines), f"{rev}:{path}", "exec"), module.__dict__)
        return module

    series = load("old_series", "lora_gui/ui/series.py", {})
    names = {k: getattr(series, k) for k in ("MAX_POINTS", "bucket_size", "downsample", "ema")
             if hasattr(series, k)}
    history = load("old_history", "lora_gui/ui/history.py", names)
    if history is not None:
        names |= {k: getattr(history, k) for k in ("HISTORY", "SmoothedSeries", "column")}
    return load("old_charts", "lora_gui/ui/charts.py", names)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hours", type=float, default=10.0)
    parser.add_argument("--hz", type=float, default=2.0)
    parser.add_argument("--step-s", type=float, default=2.0, help="seconds per training step")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--old-rev", default=OLD_REV, help="git revision of the charts to compare with")
    args = parser.parse_args()
    arms = {"now": charts, f"as of {args.old_rev}": old_charts(args.old_rev)}
    data = {name: history(args.hours, args.hz, args.step_s) for name in arms}  # each arm its own lists
    for module in arms.values():  # plotly loads its validators on first use: not a tick's cost
        tick(module, *history(0.01, args.hz, args.step_s))
    first: dict[str, float] = {}
    times: dict[str, list[float]] = {name: [] for name in arms}
    sizes: dict[str, int] = {}
    per_tick = (round(2.0 * args.hz), max(1, round(2.0 / args.step_s)))  # a tick every 2 s
    for i in range(args.repeats + 1):  # arms alternate so machine drift falls on both alike
        for name, module in arms.items():
            samples, records, phases = data[name]
            if i:  # the run goes on between ticks
                samples.extend(sample(len(samples) + k, args.hz) for k in range(per_tick[0]))
                records.extend(record(len(records) + k, len(records)) for k in range(per_tick[1]))
            start = time.perf_counter()
            sizes[name] = tick(module, samples, records, phases)
            seconds = time.perf_counter() - start
            if i:
                times[name].append(seconds)
            else:  # a page opened on the long run: nothing kept yet
                first[name] = seconds
    samples, records, _ = data["now"]
    print(f"history: {len(samples):,} memory samples, {len(records):,} steps "
          f"({args.hours:g} h at {args.hz:g} Hz, a step every {args.step_s:g} s), "
          f"{args.repeats} ticks an arm")
    for name in arms:
        print(f"{name:>16}: median {statistics.median(times[name]) * 1000:7.1f} ms a tick "
              f"(min {min(times[name]) * 1000:.1f}, max {max(times[name]) * 1000:.1f}; first tick "
              f"{first[name] * 1000:.1f}), {sizes[name] / 1e6:.2f} MB of JSON")
    old, new = (statistics.median(times[name]) for name in (f"as of {args.old_rev}", "now"))
    verdict = "met" if new < 0.2 else "MISSED"
    print(f"old / now: {old / new:.1f}x; target under 200 ms a tick: {verdict}")
    in_place(args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
