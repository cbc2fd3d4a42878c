"""How long the text demo takes, read as CPU time so a busy machine can still answer it.

Runs ``train --preset presets/text-demo.yaml`` in this process (one thread: run it with
OMP_NUM_THREADS=1), sampling the process's CPU seconds every 0.5 s, then prints the set-up CPU
time (imports, data, the memory plan: everything before the plan event), each step's CPU time
against its padded tokens, and the whole epoch's CPU time: measured when the run finished,
else extrapolated from the steps measured by padded tokens (the epoch's padded tokens come from
the run's own epoch plan, scaled by the measured padded / planned ratio).

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.speed.demo_time --out /tmp/demo-time   # ~4 CPU-minutes
    OMP_NUM_THREADS=1 .venv/bin/python -m bench.speed.demo_time --out /tmp/demo-time --report-only
"""

from __future__ import annotations

import argparse
import bisect
import json
import threading
import time
from pathlib import Path

import numpy as np

PRESET = "presets/text-demo.yaml"


def run(out: Path) -> None:
    from lora_gui.cli import main

    out.mkdir(parents=True, exist_ok=True)
    log = (out / "cpu.jsonl").open("w")

    def sample() -> None:
        while True:
            log.write(json.dumps([time.time(), time.process_time()]) + "\n")
            log.flush()
            time.sleep(0.5)

    threading.Thread(target=sample, daemon=True).start()
    main(["train", "--preset", PRESET, "--quiet", "--overwrite", "--out", str(out / "run")])
    log.write(json.dumps([time.time(), time.process_time()]) + "\n")
    log.flush()


def planned_padded() -> list[int]:
    """Padded tokens of every step of the demo's epoch, from the run's own epoch plan."""
    from lora_gui.engine.text import train as text_train
    from lora_gui.models import text as text_models
    from lora_gui.presets import load_config

    cfg = load_config(PRESET)
    data = text_train.load_text_data(cfg, text_models.load_tokenizer(
        text_models.resolve_model_source(cfg.model)))
    plan = text_train.epoch_plan(cfg, data, 0, True)
    return [sum(len(mb.indices) * mb.seq_len for mb in s.micro_batches) for s in plan]


def report(out: Path) -> dict:
    samples = [json.loads(line) for line in (out / "cpu.jsonl").read_text().splitlines() if line]
    times = [s[0] for s in samples]

    def cpu_at(t: float) -> float:
        return samples[min(bisect.bisect_left(times, t), len(samples) - 1)][1]

    events = [json.loads(line) for line in (out / "run" / "events.jsonl").read_text().splitlines()]
    records = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    setup = cpu_at(next(e["time"] for e in events if e.get("event") == "plan"))
    step_cpu, prev = [], setup
    for r in records:
        step_cpu.append(cpu_at(r["time"]) - prev)
        prev = step_cpu[-1] + prev
    padded = np.array([r["padded_tokens"] for r in records])
    plan = np.array(planned_padded())
    done = (out / "run" / "run.json").is_file()
    scale = padded.sum() / plan[: len(records)].sum()  # the run pads each micro-batch to its own longest
    per_token = sum(step_cpu) / padded.sum()
    train = sum(step_cpu) if done else per_token * plan.sum() * scale
    result = {"steps_measured": len(records), "steps": len(plan), "finished": done,
              "setup_cpu_s": setup, "cpu_s_per_padded_token": per_token, "train_cpu_s": train,
              "total_cpu_s": samples[-1][1] if done else setup + train,
              "wall_s_measured": times[-1] - times[0]}
    print(json.dumps(result, indent=1))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--report-only", action="store_true", help="read a run already (being) made")
    args = parser.parse_args()
    if not args.report_only:
        run(args.out)
    report(args.out)


if __name__ == "__main__":
    main()
