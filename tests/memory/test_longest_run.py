"""Honest on CPU: the length `plan --longest` gives is trained for real under the same budget.

The built-in model (4 layers, 2,048-token context), a 0.06 GB budget on this CPU: the plan gives
L; a real two-step run at L with the switches it picked stays within the budget (tracked peak),
its own prediction is within -1% / +3% of the tracked peak, and at 1.1 x L the run's prediction
says it does not fit."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lora_gui.config import RunConfig, apply_overrides
from lora_gui.engine.text.train import train_text
from lora_gui.memory.predict.longest_text import longest_text
from lora_gui.memory.predict.run_predict import predict_text_run

BUDGET = 0.06e9  # bytes: L lands well below the 2,048-token context
LOW, HIGH = 0.0, 0.03


@pytest.fixture
def long_docs(tmp_path):
    """Ten documents of about 3,000 words: every sample fills max_seq_len."""
    words = "to be or not that is the question whether tis nobler in mind suffer".split()
    docs = [" ".join(words[(i + j) % len(words)] for j in range(3000)) for i in range(10)]
    path = tmp_path / "long.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


@pytest.mark.slow
def test_a_run_at_the_longest_length_stays_within_the_budget(long_docs, tmp_path):
    cfg = apply_overrides(RunConfig(), {"data": str(long_docs), "batch_size": 1, "precision": "fp32",
                                        "max_steps": 2, "warmup_steps": 1, "checkpoint_every": 1000,
                                        "monitor_hz": 0.0, "eval_fraction": 0.1})
    result = longest_text(cfg, BUDGET, "cpu")
    assert 256 <= result.seq_len < 1800 and not result.capped_by_context, result.to_json()
    run = replace(cfg, **result.switches, max_seq_len=result.seq_len, budget_gb=BUDGET / 1e9)
    summary = train_text(run, tmp_path / "run", progress=False)
    report = summary["memory_report"]
    assert summary["status"] == "completed" and report["source"] == "tracker"
    assert report["peak_bytes"] <= BUDGET, report
    assert LOW <= report["predicted_vs_measured"] <= HIGH, report
    assert summary["prediction"]["seq_len"] == result.seq_len  # the run really reached L
    longer = int(result.seq_len * 1.1)
    over = predict_text_run(replace(run, max_seq_len=longer), "cpu", lengths=[longer] * 4)
    assert over.peak_bytes > BUDGET, (over.peak_bytes, result.to_json())
