"""One question, one answer, measured: for each text demo at 3 steps, the peak ``plan --json``
gives, the Train form shows, the run's own prediction (run.json) and the run's tracked peak
(source: tracker, live tensor bytes on this CPU), with the form's budget and with none.

    python -m bench.memory.plan_vs_run            # writes bench/results/tables/plan_vs_run.json

Every run is the CLI a user (and the dashboard's Start) runs, in a process of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.docs.meta import stamp

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "results" / "tables" / "plan_vs_run.json"
PRESETS = ("text-demo", "chat-demo", "preference-demo")
STEPS = 3
GB = 1e9  # every figure in decimal GB, the unit the form shows


def _cli(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "lora_gui", *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=1800)
    if res.returncode:
        raise RuntimeError(f"lora_gui {' '.join(args)}: {res.stderr[-2000:]}")
    return res.stdout


def row(preset: str, budget_gb: float | None, form_gb: str | None) -> list[str]:
    """[demo, budget, plan, form, run's own, tracked, plan / tracked - 1] for one demo."""
    sets = ["--set", f"max_steps={STEPS}"] + (["--set", f"budget_gb={budget_gb}"] if budget_gb else [])
    plan = json.loads(_cli("plan", "--preset", preset, "--json", *sets))
    with tempfile.TemporaryDirectory() as folder:
        _cli("train", "--preset", preset, "--quiet", "--json", "--out", f"{folder}/run", *sets)
        report = json.loads(Path(folder, "run", "run.json").read_text(encoding="utf-8"))["memory_report"]
    tracked, own = report["peak_bytes"], report["predicted_peak_bytes"]
    return [preset, f"{budget_gb:g} GB (the form's)" if budget_gb else "none (as `train` without budget_gb)",
            f"{plan['peak_bytes'] / GB:.4f}", form_gb or "-", f"{own / GB:.4f}", f"{tracked / GB:.4f}",
            f"{plan['peak_bytes'] / tracked - 1:+.2%}"]


def main() -> None:
    from lora_gui.ui.tabs import train_handlers, train_prediction_handlers

    rows = []
    for preset in PRESETS:
        values = train_handlers.form_values(preset)  # as the dashboard fills the form, its budget too
        values["max_steps"] = STEPS
        shown, *_ = train_prediction_handlers.prediction_view(values, 1, True)
        form_gb = shown.split("Predicted peak: **", 1)[1].split(" GB", 1)[0]  # as the form rounds it
        rows.append(row(preset, values["budget_gb"], form_gb))
        rows.append(row(preset, None, None))
        print(rows[-2], rows[-1], flush=True)
    OUT.write_text(json.dumps({
        "meta": {**stamp(), "command": "python -m bench.memory.plan_vs_run",
                 "made_by": "bench/memory/plan_vs_run.py on this project's 2-core CPU machine (no GPU)"},
        "title": "The plan, the Train form and the run: one answer (text demos, 3 steps, CPU)",
        "columns": ["demo", "budget", "plan --json GB", "Train form GB", "run's own plan GB",
                    "tracked peak GB", "plan / tracked"],
        "rows": rows}, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
