"""The benchmarks' shared helpers (bench/common.py): round order, thread pinning, stamped results,
Markdown tables."""

from __future__ import annotations

import json

import torch

from bench import common
from bench.docs import meta


def test_round_order_reverses_every_other_round_so_no_arm_always_runs_first():
    arms = ("off", "on", "half")
    orders = [common.round_order(arms, r) for r in range(4)]
    assert orders == [["off", "on", "half"], ["half", "on", "off"]] * 2
    assert {order[0] for order in orders} == {"off", "half"}


def test_write_results_stamps_commit_and_planner_and_keeps_the_body(tmp_path):
    path = common.write_results(tmp_path / "deeper" / "r.json",
                                {"meta": {"command": "python -m bench.x"}, "rows": [[1, tmp_path]]})
    body = json.loads(path.read_text(encoding="utf-8"))
    assert list(body) == ["meta", "rows"]
    assert body["meta"]["planner"] == meta.working_fingerprint()
    assert body["meta"]["commit"] == (meta.head_commit() if meta.has_git() else "unknown")
    assert body["meta"]["command"] == "python -m bench.x"
    assert body["rows"] == [[1, str(tmp_path)]]  # a path is written as its text


def test_markdown_table_is_the_docs_pages_form():
    table = common.markdown_table(["a", "b"], [[1, "x|y"], ["2", 3.5]])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| 1 | x\\|y |", "| 2 | 3.5 |"]


def test_pin_threads_sets_torchs_threads():
    before = torch.get_num_threads()
    try:
        common.pin_threads(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
