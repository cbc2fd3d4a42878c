"""The dashboard's multi-GPU job: accelerate launch as a subprocess, followed through the run
folder (two CPU processes here), and the STOP file every rank obeys."""

import time

import pytest

from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.engine.core.distributed import STOP_FILE
from lora_gui.engine.jobs.manager import JobManager
from lora_gui.engine.text.train import TrainControl, train_text
from lora_gui.ui import charts, common
from lora_gui.ui.tabs import train_handlers

SMALL = {"max_seq_len": 64, "batch_size": 4, "lr": 5e-3, "eval_fraction": 0.1, "warmup_steps": 1,
         "precision": "fp32"}


def test_launched_job_follows_every_rank(tmp_path, small_corpus):
    cfg = apply_overrides(RunConfig(), {**SMALL, "data": str(small_corpus), "max_steps": 3,
                                        "monitor_hz": 4.0})
    job = JobManager().start(cfg, tmp_path / "runs" / "two", processes=2)
    deadline = time.monotonic() + 240
    while job.running and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job.status == "completed", (job.error, job.events)
    records, _ = job.snapshot()
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(len(r["peak_bytes_by_rank"]) == 2 for r in records)
    samples, phases = job.memory_snapshot()
    assert {s["rank"] for s in samples} == {0, 1}
    assert "training" in [p for p, _ in phases] and phases[-1][0] == "done"
    fig = charts.memory_timeline(samples, phases, budget_bytes=2**30)
    assert [t.name for t in fig.data][:2] == ["rank 0 live memory (tracker)", "rank 1 live memory (tracker)"]
    peaks = charts.memory_figure(records)
    assert [t.name for t in peaks.data][1:3] == ["rank 0 (tracker)", "rank 1 (tracker)"]
    assert (tmp_path / "runs" / "two" / "adapter" / "adapter_config.json").is_file()


def test_stop_file_stops_a_run_after_its_step(tmp_path, small_corpus):
    out = tmp_path / "run"
    control = TrainControl()
    control.on_record = lambda r: (out / STOP_FILE).touch() if r["step"] == 2 else None
    cfg = apply_overrides(RunConfig(), {**SMALL, "data": str(small_corpus), "max_steps": 50,
                                        "monitor_hz": 0.0})
    summary = train_text(cfg, out, control=control, progress=False)
    assert summary["status"] == "stopped" and summary["steps"] == 2


def test_processes_field_is_checked_against_the_gpus():
    if common.gpu_count() < 2:
        with pytest.raises(ConfigError, match="processes: 2; this machine shows"):
            train_handlers.check_processes(2, "text")
    assert train_handlers.check_processes(1, "text") == 1


@pytest.mark.integration  # starts the training process
def test_a_run_that_fails_on_its_data_is_kept_as_a_failed_run(tmp_path):
    """Data the form cannot judge (a line that is not JSON) fails the run once started: the job's
    error is the CLI's line without its "error:" prefix, and the folder keeps the settings and a
    run.json saying why (the Runs tab lists it), not an empty folder."""
    import json

    data = tmp_path / "notes.jsonl"
    data.write_text('{"text": "a fine line"}\nnot JSON\n', encoding="utf-8")
    cfg = apply_overrides(RunConfig(), {**SMALL, "data": str(data), "max_steps": 1})
    job = JobManager().start(cfg, tmp_path / "runs" / "bad", processes=1)
    deadline = time.monotonic() + 240
    while job.running and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job.status == "failed" and "notes.jsonl:2" in job.error, (job.error, job.events)
    assert not job.error.lower().startswith("error"), job.error
    summary = json.loads((tmp_path / "runs" / "bad" / "run.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == job.error
    assert (tmp_path / "runs" / "bad" / "config.json").is_file()
