"""Compare at first sight: the instant predicted comparison, measured rows as the one background
job, saved comparisons reloaded."""

import json
import time

import pytest

from lora_gui.engine.compare.instant import instant_rows
from lora_gui.presets import load_config
from lora_gui.ui import common
from lora_gui.ui.tabs import compare_handlers as handle


@pytest.fixture()
def root(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RUNS_ROOT", tmp_path)
    monkeypatch.setattr(common, "MANAGER", common.JobManager())
    return tmp_path


@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen2.5-7b"])
def test_instant_text_comparison_of_a_bundled_model(model):
    rows = instant_rows(load_config("text-demo"), model)
    modes = {r["mode"] for r in rows}
    assert {"traditional", "strong_baseline", "optimized", "ablation:sdpa", "ablation:loss_chunk"} <= modes
    assert {r["seq_len"] for r in rows} == {512, 1024, 2048, 4096}
    assert all(r["status"] == "ok" and r["memory_source"] == "predicted" for r in rows)
    peak = {(r["mode"], r["seq_len"]): r["peak_bytes"] for r in rows}
    for n in (512, 4096):
        assert peak["optimized", n] < peak["strong_baseline", n] < peak["traditional", n]
    assert peak["traditional", 4096] > peak["traditional", 512]
    assert peak["traditional", 512] > 15 * 2**30  # 8B / 7B bf16 weights alone are ~15 GiB


def test_instant_refuses_a_model_of_the_other_task():
    with pytest.raises(ValueError, match="sdxl-unet is an image"):
        instant_rows(load_config("text-demo"), "sdxl-unet")


def test_instant_view_is_labelled_predicted_with_bars_lines_and_table():
    message, bars, lines, table = handle.instant("text-demo", handle.PRESET_MODEL, "512,1024")
    assert message.startswith("**Predicted**") and "nothing was trained" in message
    assert [t.name for t in bars.data] == ["traditional", "strong baseline", "optimized"]
    assert "predicted" in bars.layout.title.text and len(lines.data) == 9
    assert len(table) == 18 and table[0][2] == "predicted"
    assert handle.instant("text-demo", handle.PRESET_MODEL, "5x")[0].startswith("Error: sizes")


@pytest.mark.slow
def test_instant_image_comparison_over_resolutions():
    rows = instant_rows(load_config("image-512"), None, (512, 768))
    peak = {(r["mode"], r["resolution"]): r["peak_bytes"] for r in rows if r["status"] == "ok"}
    assert peak["optimized", 768] < peak["traditional", 768]
    assert peak["traditional", 768] > peak["traditional", 512]


def test_measure_is_refused_while_a_training_job_runs(root, monkeypatch):
    job = common.JobManager()
    monkeypatch.setattr(common, "MANAGER", job)

    class Running:
        name, out, running, kind = "my-training", root / "my-training", True, "training"

    job.job = Running()
    message = handle.measure("text-demo", "512", 1, "cmp")
    assert message.startswith("Error:") and "my-training" in message


def test_measure_refuses_bad_sizes_and_names(root):
    assert handle.measure("text-demo", "8", 1, "cmp").startswith("Error: --seq-lens")
    assert handle.measure("text-demo", "", 1, "cmp").startswith("Error: sizes")
    assert "run name" in handle.measure("text-demo", "512", 1, "../x")


def test_measure_runs_as_a_job_and_rows_persist(root, monkeypatch):
    from lora_gui.engine.compare import quick

    def fake_quick(base, sizes, out, *, steps, stop, on_row, **kw):  # the rows, not the training
        from lora_gui.engine.compare.results import write_results

        rows = [{"question": "memory", "data": "corpus", "mode": "traditional", "seq_len": sizes[0],
                 "status": "ok", "peak_bytes": 5 * 2**20, "memory_source": "tracker", "batch_size": 8}]
        write_results(out, {}, rows)
        on_row(rows[0])
        return {"rows": rows}

    monkeypatch.setattr(quick, "run_quick", fake_quick)
    assert "Measuring" in handle.measure("text-demo", "512", 1, "cmp")
    deadline = time.time() + 30
    while common.MANAGER.job.running and time.time() < deadline:
        time.sleep(0.05)
    assert common.MANAGER.job.status == "completed" and common.MANAGER.job.kind == "compare"
    status, bars, lines, table, seen = handle.progress("text-demo", handle.PRESET_MODEL, "512", "cmp")
    assert "completed" in status and "1/3 rows" in status
    # the measured line comes first: the page draws a long table's first rows only
    assert table[0][:3] == ["traditional", 512, "ok"] and table[0][6] == 0.00524 and table[0][7] == "tracker"
    assert all(row[2] == "predicted" for row in table[1:])
    again = handle.progress("text-demo", handle.PRESET_MODEL, "512", "cmp", seen)  # nothing new
    assert again[-1] == seen and all(part == {"__type__": "update"} for part in again[:4])
    other_page = handle.progress("text-demo", handle.PRESET_MODEL, "512", "cmp", None)
    assert other_page[3] == table  # another (or a reloaded) page still gets the rows
    assert handle.saved_comparisons() == ["cmp"]
    message, *_ = handle.load_saved("cmp")
    assert message.startswith("1 rows") and "tracker" in message


def test_stop_ends_a_measuring_comparison_and_leaves_a_training_run_alone(root, monkeypatch):
    import threading

    from lora_gui.engine.compare import quick

    def waits_for_stop(base, sizes, out, *, steps, stop, on_row, **kw):  # one row, then stop
        from lora_gui.engine.compare.results import write_results

        rows = [{"question": "memory", "data": "corpus", "mode": "traditional", "seq_len": sizes[0],
                 "status": "ok", "peak_bytes": 5 * 2**20, "memory_source": "tracker", "batch_size": 8}]
        write_results(out, {}, rows)
        on_row(rows[0])
        assert stop.wait(30), "Stop never reached the comparison"
        return {"rows": rows}

    assert handle.stop() == ("No comparison is being measured.", None)
    monkeypatch.setattr(quick, "run_quick", waits_for_stop)
    handle.measure("text-demo", "512", 1, "cmp")
    job = common.MANAGER.job
    message, seen = handle.stop()
    assert message == "stopping cmp" and seen is None
    deadline = time.time() + 30
    while job.running and time.time() < deadline:
        time.sleep(0.05)
    assert job.status == "stopped"
    status = handle.progress("text-demo", handle.PRESET_MODEL, "512", "cmp")[0]
    assert "stopped" in status and "1/3 rows" in status

    class Training:  # a run started from the Train tab
        name, kind, running = "my-training", "training", True
        control = type("Control", (), {"stop": threading.Event()})()

    common.MANAGER.job = Training()
    assert handle.stop()[0] == "No comparison is being measured."
    assert not Training.control.stop.is_set()


def test_load_saved_names_a_broken_file(root):
    (root / "bad").mkdir()
    (root / "bad" / "compare.json").write_text("{not json")
    assert handle.load_saved("bad")[0].startswith("Error:")


def test_load_saved_draws_measured_rows(root, compare_rows):
    (root / "cmp").mkdir()
    (root / "cmp" / "compare.json").write_text(json.dumps({"settings": {}, "rows": compare_rows}))
    message, bars, lines, table = handle.load_saved("cmp")
    assert "tracker" in message and [t.name for t in bars.data][0] == "traditional" and table


def test_quick_comparison_uses_the_idle_cores_and_restores_torch_threads(monkeypatch):
    import os

    import torch

    from lora_gui.engine.compare.quick import cpu_threads_for_load

    before = torch.get_num_threads()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))  # every core busy elsewhere
    with cpu_threads_for_load() as threads:
        assert threads == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # idle: torch's own choice
    with cpu_threads_for_load() as threads:
        assert threads == before == torch.get_num_threads()


def test_predicted_values_stay_as_shown_before_measure():
    """A measured row keeps the predicted figure the page showed before Measure; the run's own
    plan (this machine, its precision) sits in a column of its own, and the header says which."""
    predicted = handle.predicted_rows("text-demo", handle.PRESET_MODEL, "512")
    before = {(r[0], r[1]): r[4] for r in handle.table(predicted, [])}
    measured = [{"question": "memory", "mode": "optimized", "seq_len": 512, "status": "ok",
                 "peak_bytes": 7 * 10**9, "predicted_peak_bytes": 6 * 10**9, "memory_source": "tracker"}]
    after = handle.table(predicted, measured)
    col = handle.TABLE_COLUMNS.index
    assert {(r[0], r[1]): r[col("predicted GB")] for r in after} == before
    assert after[0][col("run's plan GB")] == 6.0 and after[0][col("measured GB")] == 7.0
    assert all(r[col("run's plan GB")] is None for r in after[1:])
    assert "run's plan" in handle.measured_header(measured) and "bf16" in handle.measured_header(measured)


def test_header_says_measured_once_rows_are_and_eval_loss_is_rounded():
    assert handle.measured_header([]) is None
    rows = [{"mode": "optimized", "seq_len": 128, "peak_bytes": 5 * 2**20, "memory_source": "tracker",
             "eval_loss": 2.123456789012345, "status": "ok"}]
    header = handle.measured_header(rows)
    assert "measured" in header and "tracker" in header and "nothing was trained" not in header
    line = handle.table([], rows)[0]
    assert line[handle.TABLE_COLUMNS.index("eval loss")] == 2.1235
