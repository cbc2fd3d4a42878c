"""One process vs two (DDP) vs two (FSDP) on this CPU: the same global batch, per-rank memory.

    .venv/bin/python -m bench.memory.several_processes            # ~3 min on 2 CPU cores

Each run is the text-demo preset on the built-in model for STEPS steps through
``accelerate launch`` with a presets/accelerate/ config (gloo on a CPU), one thread per process.
Prints one table: median step seconds, real tokens/s, peak per rank (source: tracker), frozen
weights per rank, the planner's per-GPU frozen bytes (source: predicted) and the final loss.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from lora_gui.config import BUILTIN_MODEL_DIR
from lora_gui.engine.core.records import read_records
from lora_gui.memory.predict.estimate import estimate_text_step
from lora_gui.memory.predict.model_configs import load_model_config
from lora_gui.memory.predict.parallel import Parallel, per_gpu

ROOT = Path(__file__).resolve().parents[2]
STEPS = 20
SETTINGS = {"max_steps": STEPS, "max_seq_len": 512, "batch_size": 8, "precision": "fp32", "monitor_hz": 0}
RUNS = (("1 process", "one-gpu.yaml", 1), ("2 processes, DDP", "multi-gpu.yaml", 2),
        ("2 processes, FSDP", "fsdp.yaml", 2))
MIB = 2**20


def run(config: str, processes: int, out: Path) -> dict:
    accel = ROOT / "presets" / "accelerate" / config
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(accel),
           "--num_processes", str(processes), "--num_cpu_threads_per_process", str(2 // processes),
           "-m", "lora_gui", "train", "--preset", "text-demo", "--out", str(out), "--quiet"]
    for key, value in SETTINGS.items():
        cmd[-3:-3] = ["--set", f"{key}={value}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(2 // processes)}
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=900)
    return json.loads((out / "run.json").read_text())


def main() -> None:
    config = load_model_config(str(BUILTIN_MODEL_DIR))
    one_gpu = estimate_text_step(config, batch_size=1, seq_len=512, lora_rank=8, dtype="float32",
                                 device="cpu")
    print("| run | median step s | real tokens/s | peak MiB by rank (tracker) | frozen MiB by rank | "
          "planned frozen MiB per GPU | loss at step 20 |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, cfg, n in RUNS:
            summary = run(cfg, n, Path(tmp) / cfg)
            records = read_records(Path(tmp) / cfg / "metrics.jsonl")
            step_s = statistics.median(r["seconds"] for r in records[2:])  # first steps warm up
            parallel = Parallel(n, fsdp=cfg == "fsdp.yaml")
            planned = per_gpu(one_gpu, config, parallel).breakdown["frozen_weights"]
            peaks = ", ".join(f"{p / MIB:.1f}" for p in summary["peak_bytes_by_rank"])
            frozen = ", ".join(f"{p / MIB:.2f}" for p in summary["frozen_bytes_by_rank"])
            print(f"| {name} | {step_s:.3f} | {summary['real_tokens_per_s']:.0f} | {peaks} | {frozen} | "
                  f"{planned / MIB:.2f} | {summary['final_loss']:.4f} |")


if __name__ == "__main__":
    main()
