"""The throughput-aware plan's CPU bench (bench/speed/plan_speed.py) runs end to end and writes a
stamped table whose fastest arm never plans a higher peak than the largest arm with checkpointing
on (the one-bucket smoke here; the figures come from the full command in the docs)."""

from __future__ import annotations

import json
import sys

import pytest


@pytest.mark.slow
def test_the_checkpointing_bench_writes_both_arms_at_the_same_budget(tmp_path, monkeypatch):
    from bench.speed import plan_speed

    out = tmp_path / "plan_speed.json"
    monkeypatch.setattr(sys, "argv", ["plan_speed", "--checkpointing", "--budgets", "0.06", "--rounds", "1",
                                      "--max-seq-len", "64", "--out", str(out)])
    plan_speed.main()
    table = json.loads(out.read_text())
    assert table["meta"]["planner"] and "--checkpointing" in table["meta"]["command"]
    (largest, fastest) = table["rows"]
    assert [largest[1], fastest[1]] == ["largest", "fastest"]
    # the fastest plan's budget: the largest plan's peak, at most the budget asked for
    assert float(fastest[0].split()[0]) <= float(largest[0].split()[0]) == 0.06
    assert largest[2] == "every one"  # the plan before the choice checkpoints every layer
    assert float(fastest[4]) <= float(largest[4])  # predicted peak MiB: the same or lower
    assert fastest[7].endswith(")") and "x (per round: " in fastest[7]
