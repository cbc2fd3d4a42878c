"""The throughput-aware plan's CPU benches run end to end and write stamped tables: the text one
(bench/speed/plan_speed.py), whose fastest arm never plans a higher peak than the largest arm with
checkpointing on, and the image one (bench/speed/image_plan_speed.py), whose arms both keep inside
their one budget (one-bucket smokes here; the figures come from the full commands in the docs)."""

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


@pytest.mark.slow
def test_the_image_bench_trains_both_arms_inside_one_budget(tmp_path, monkeypatch):
    from bench.speed import image_plan_speed

    out = tmp_path / "image_plan_speed.json"
    monkeypatch.setattr(sys, "argv", ["image_plan_speed", "--budgets", "0.012", "--rounds", "1",
                                      "--steps", "2", "--out", str(out)])
    image_plan_speed.main()
    table = json.loads(out.read_text())
    assert table["meta"]["planner"] and "--budgets 0.012" in table["meta"]["command"]
    (largest, fastest) = table["rows"]
    assert [largest[:2], fastest[:2]] == [["0.012 GB", "largest"], ["0.012 GB", "fastest"]]
    assert largest[2] == "on"  # the plan before the choice checkpoints as set
    budget_mib = 0.012e9 / 2**20
    for row in (largest, fastest):  # predicted and tracked peaks both inside the budget
        assert float(row[4]) <= budget_mib and float(row[5]) <= budget_mib
    assert fastest[-1].endswith(")") and "x (per round: " in fastest[-1]
