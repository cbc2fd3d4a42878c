"""One unit for memory everywhere a user reads it: decimal GB, the unit of the budget field, the
card picker and ``--budget-gb``. The Train page (verdict, gauge, status, live charts), Compare,
Runs and the CLI (``plan``, ``plan --budget-gib``, the progress bar) print no MiB or GiB."""

from __future__ import annotations

import re

import pytest

from lora_gui.cli import main
from lora_gui.engine.core.loop import progress_text
from lora_gui.ui import charts, common
from lora_gui.ui.tabs import compare_handlers, runs_handlers, train_handlers, train_prediction_handlers
from lora_gui.units import gb, gb_value

MIB = 2**20


@pytest.fixture()
def runs_root(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RUNS_ROOT", tmp_path)
    monkeypatch.setattr(common, "MANAGER", common.JobManager())
    return tmp_path


def units(text: str) -> set[str]:
    """The memory units written after a number in ``text``."""
    return set(re.findall(r"\d\s*(MiB|GiB|KiB|GB|MB|kB)\b", text))


@pytest.mark.parametrize(("nbytes", "shown"), [
    (117.5 * MIB, "0.123 GB"), (40 * MIB + 5, "0.0419 GB"), (11.1e9, "11.10 GB"),
    (25.35e9, "25.35 GB"), (524_288, "0.000524 GB"), (0, "0.00 GB"), (None, "—")])
def test_a_figure_in_gb_keeps_three_significant_digits_below_one_gb(nbytes, shown):
    assert gb(nbytes) == shown
    if nbytes:
        assert gb_value(nbytes) == float(shown.split()[0])


def test_the_train_pages_verdict_and_gauge_speak_gb(runs_root):
    values = {**train_handlers.form_values("text-demo"), "budget_gb": 2.0, "max_steps": 3}
    text, figure, _ = train_prediction_handlers.prediction_view(values, 1, exact=True)
    assert units(text) == {"GB"}, text
    assert "% of the budget" in text and "/ 2.00 GB, predicted)" in text
    assert figure.layout.yaxis.title.text == "GB"


def test_the_live_charts_and_the_status_speak_gb():
    records = [{"step": 1, "peak_bytes": 117 * MIB, "memory_source": "tracker", "loss": 3.0}]
    _, layout = charts.memory_spec(records, budget_bytes=24 * 10**9, predicted_bytes=118 * MIB)
    assert layout["yaxis"]["title"]["text"] == "GB (tracker)"
    assert units(" ".join(a["text"] for a in layout["annotations"])) == {"GB"}  # the far budget
    samples = [{"time": 1.0, "tracker_live_bytes": 100 * MIB}, {"time": 2.0, "tracker_live_bytes": 110 * MIB}]
    _, layout = charts.timeline_spec(samples, [("training", 1.0)], 2 * 10**9, 118 * MIB)
    assert layout["yaxis"]["title"]["text"] == "GB (tracker)"
    assert progress_text({"loss": 3.0, "peak_bytes": 117 * MIB}) == "loss 3.000, peak 0.123 GB"


def test_compare_and_runs_tables_name_gb():
    assert {c for c in compare_handlers.TABLE_COLUMNS if "GB" in c} == {
        "predicted GB", "run's plan GB", "measured GB"}
    assert "peak GB" in runs_handlers.RUN_COLUMNS
    assert not any("MiB" in c for c in (*compare_handlers.TABLE_COLUMNS, *runs_handlers.RUN_COLUMNS))


@pytest.mark.slow
@pytest.mark.parametrize("budget", [["--budget-gb", "2"], ["--budget-gib", "2"]])
def test_plan_prints_every_figure_in_gb(budget, capsys):
    assert main(["plan", "--preset", "text-demo", "--device", "cpu", "--set", "max_steps=3", *budget]) == 0
    printed = capsys.readouterr().out
    assert units(printed) == {"GB"}, printed
    assert ("2.00 GB" if budget[0] == "--budget-gb" else "2.15 GB") in printed
