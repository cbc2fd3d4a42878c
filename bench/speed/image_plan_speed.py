"""The throughput-aware image plan against the largest micro-batch that fits, side by side (CPU).

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.speed.image_plan_speed [--budgets 0.012,0.009] \
        [--rounds 5] [--steps 24]

The image demo (the built-in drawing model, an SD3-style DiT, LoRA as its preset sets it, 8
images a step at 64 px) with ``gradient_checkpointing: true`` and adaptive micro-batches, trained
for real (:func:`lora_gui.engine.train`) as two arms under each budget:

- ``largest``: ``batch_choice: largest``, the plan before the throughput-aware choice: the
  largest micro-batch that fits, checkpointing as set;
- ``fastest``: the default, whose plan also weighs checkpointing off
  (:mod:`lora_gui.memory.predict.image_checkpoint_choice`) under the same budget. Without
  checkpointing it holds more memory an image, so it trains smaller micro-batches, up to the
  budget: its predicted peak is higher than ``largest``'s when it turns checkpointing off (both
  are in the table), never above the budget.

Each round trains both arms for ``--steps`` steps, the order reversed every round; an arm's
images/s is its run's own measured figure over the steps the memory tracker left alone (run.json's
``speed_report``), the ratio the median of the per-round ratios. Predicted peaks are the runs' own
plans (source: predicted); measured peaks the runs' tracker (source: measured on this CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.common import write_results
from lora_gui.config import apply_overrides
from lora_gui.engine import train
from lora_gui.presets import load_config

COMMAND = "OMP_NUM_THREADS=1 .venv/bin/python -m bench.speed.image_plan_speed"


def arms(budget_gb: float) -> dict[str, Any]:
    """Each arm's settings, both under ``budget_gb``."""
    base = load_config("image-demo", {"gradient_checkpointing": True, "image_batch": "adaptive",
                                      "sample_images": 0, "monitor_hz": 0.0, "batch_size": 8,
                                      "budget_gb": budget_gb})
    return {c: apply_overrides(base, {"batch_choice": c}) for c in ("largest", "fastest")}


def one_run(cfg, steps: int, folder: Path) -> dict[str, Any]:
    """Trains ``cfg`` for ``steps`` steps; what run.json says of its speed, plan and peak."""
    summary = train(apply_overrides(cfg, {"max_steps": steps}), folder, progress=False)
    if summary["status"] != "completed":
        raise SystemExit(f"{folder}: {summary['status']}: {summary.get('message')}")
    saved = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    report = saved["speed_report"]
    return {"images_per_s": report["measured_images_per_s_unmetered"] or report["measured_images_per_s"],
            "predicted_images_per_s": report["predicted_images_per_s"],
            "checkpointing": saved["config"]["gradient_checkpointing"],
            "caps": saved["micro_batch_caps"], "predicted_peak": saved["prediction"]["peak_bytes"],
            "measured_peak": saved["peak_bytes"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="0.012,0.009", help="GB, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=24, help="training steps of each run")
    parser.add_argument("--out", help="also write the table as a stamped results file (bench.docs reads it)")
    args = parser.parse_args()
    command = f"{COMMAND} --budgets {args.budgets} --rounds {args.rounds} --steps {args.steps}"
    load = os.getloadavg()[0]
    print(f"command: {command}")
    table: list[list[str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for gb in (float(x) for x in args.budgets.split(",")):
            cfgs = arms(gb)
            runs: dict[str, list[dict[str, Any]]] = {"largest": [], "fastest": []}
            for c in cfgs:  # warm: calibrations cached, first-call costs paid
                one_run(cfgs[c], 2, Path(tmp) / f"warm-{gb}-{c}")
            for r in range(args.rounds):
                for c in (("largest", "fastest") if r % 2 == 0 else ("fastest", "largest")):
                    runs[c].append(one_run(cfgs[c], args.steps, Path(tmp) / f"{gb}-{r}-{c}"))
            ratios = [f["images_per_s"] / s["images_per_s"] for f, s in zip(runs["fastest"], runs["largest"])]
            ratio = statistics.median(ratios)
            for c in ("largest", "fastest"):
                last = runs[c][-1]
                speeds = [x["images_per_s"] for x in runs[c]]
                row = [f"{gb:g} GB", c, "on" if last["checkpointing"] else "off",
                       ", ".join(f"{k}: {v}" for k, v in sorted(last["caps"].items())),
                       f"{last['predicted_peak'] / 2**20:.2f}", f"{last['measured_peak'] / 2**20:.2f}",
                       f"{last['predicted_images_per_s']:.1f}", f"{statistics.median(speeds):.1f}",
                       ", ".join(f"{x:.1f}" for x in speeds),
                       "" if c == "largest" else f"{ratio:.3f}x (per round: "
                       f"{', '.join(f'{x:.2f}' for x in ratios)})"]
                table.append(row)
                print(" | ".join(row))
    columns = ["budget (both arms)", "batch_choice", "gradient checkpointing (as trained)",
               "micro-batch cap per bucket (latent pixels)", "predicted peak MiB (source: predicted)",
               "measured peak MiB (source: measured, tracker)", "predicted images/s",
               "measured images/s (median of rounds)", "per round",
               "fastest / largest (median of per-round ratios)"]
    if args.out:
        write_results(args.out, {
            "meta": {"command": command,
                     "made_by": "bench/speed/image_plan_speed.py --out on the shared 2-core CPU, load average"
                     f" {load:.1f} at the start and {os.getloadavg()[0]:.1f} at the end "
                     "(compare arms within a budget only: they alternate in every round)"},
            "title": "Throughput-aware image plan against the largest micro-batch that fits (image demo, "
                     "CPU, gradient checkpointing on)",
            "columns": columns, "rows": table})


if __name__ == "__main__":
    main()
