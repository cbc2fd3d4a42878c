"""Honest on CPU: `plan --longest` at a budget gives L; a real run at L under that budget.

The built-in model (4 layers, 2,048-token context), fp32 on this CPU, budgets of 0.04-0.06 GB:
prints L, the switches, the run's tracked peak (source: tracker) against the budget, the run's own
prediction against that peak, and the run's prediction at 1.1 x L (it must not fit). The same
check is tests/memory/test_longest_run.py (one budget).

Run: ``OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python -m bench.long.longest_honesty [--budgets 0.06]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from lora_gui.config import RunConfig, apply_overrides
from lora_gui.engine.text.train import train_text
from lora_gui.memory.predict.longest_text import longest_text
from lora_gui.memory.predict.run_predict import predict_text_run


def long_corpus(folder: Path) -> Path:
    """Ten documents of 3,000 words: every sample fills max_seq_len."""
    words = "to be or not that is the question whether tis nobler in mind suffer".split()
    docs = [" ".join(words[(i + j) % len(words)] for j in range(3000)) for i in range(10)]
    path = folder / "long.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def check(budget_gb: float, folder: Path) -> str:
    budget = budget_gb * 1e9
    cfg = apply_overrides(RunConfig(), {"data": str(long_corpus(folder)), "batch_size": 1,
                                        "precision": "fp32", "max_steps": 2, "warmup_steps": 1,
                                        "checkpoint_every": 1000, "monitor_hz": 0.0, "eval_fraction": 0.1})
    result = longest_text(cfg, budget, "cpu")
    run = replace(cfg, **result.switches, max_seq_len=result.seq_len, budget_gb=budget_gb)
    report = train_text(run, folder / f"run-{budget_gb}", progress=False)["memory_report"]
    longer = int(result.seq_len * 1.1)
    over = predict_text_run(replace(run, max_seq_len=longer), "cpu", lengths=[longer] * 4).peak_bytes
    switches = ", ".join(f"{k}={v}" for k, v in result.switches.items()) or "-"
    return (f"| {budget_gb:g} | {result.seq_len:,} | {switches} | {report['peak_bytes']:,} | "
            f"{'yes' if report['peak_bytes'] <= budget else 'NO'} | {report['predicted_vs_measured']:+.3%} | "
            f"{longer:,} | {over:,} | {'yes' if over > budget else 'NO'} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="0.04,0.06", help="budgets in GB")
    args = parser.parse_args(argv)
    print("| budget GB | L | switches | run peak bytes (tracker) | within budget | "
          "run's prediction vs peak | 1.1 x L | predicted peak at 1.1 x L | does not fit |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for gb in (float(x) for x in args.budgets.split(",")):
            print(check(gb, Path(tmp)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
