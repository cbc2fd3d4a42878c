"""Fault suite, the run folder: one writer at a time, stale locks, run names, resume refusals.
Each refused case exits 2 with a message and leaves the run's last checkpoint loadable."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading

import pytest

from lora_gui.engine.core.lock import (
    LOCK_FILE,
    RunFolderLockedError,
    acquire_run_folder,
    lock_is_live,
    read_lock,
    release_run_folder,
)
from lora_gui.engine.core.rundir import RunDirError, run_folder
from lora_gui.engine.core.runstate import folder_state
from lora_gui.engine.jobs.manager import Job
from lora_gui.engine.text.train import train_text
from lora_gui.ui import common
from lora_gui.ui.tabs import compare_handlers, train_handlers
from tests.faults.conftest import (
    ROOT,
    assert_checkpoint_loads,
    assert_clear_error,
    steps_of,
    tiny_cfg,
    tiny_sets,
)

HOLD = ("import sys, time; from pathlib import Path; from lora_gui.engine.core.lock import "
        "acquire_run_folder; acquire_run_folder(Path(sys.argv[1])); print('held', flush=True); "
        "time.sleep(600)")


@pytest.fixture()
def holder(good_run):
    """Another live process that holds the run folder's lock (a second writer's view)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(good_run)], cwd=ROOT, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == b"held"
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("flags", [["--overwrite"], ["--resume"], []], ids=["overwrite", "resume", "none"])
def test_second_writer_is_refused_while_the_holder_lives(flags, holder, good_run, corpus, cli):
    resume = flags == ["--resume"]
    args = ["--resume", good_run] if resume else ["--out", good_run, *flags, *tiny_sets(corpus)]
    code, err = cli("train", *args)
    assert_clear_error(code, err, "another run is writing into this folder", f"pid {holder.pid}")
    assert read_lock(good_run).pid == holder.pid and lock_is_live(good_run)
    assert_checkpoint_loads(good_run, 2)
    assert (good_run / "run.json").is_file()  # --overwrite deleted nothing


def test_stale_lock_of_a_killed_writer_is_taken_over_with_a_warning(holder, good_run, cli, caplog):
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (good_run / LOCK_FILE).is_file() and not lock_is_live(good_run)
    assert folder_state(good_run).status == "failed"
    with caplog.at_level(logging.WARNING, logger="lora_gui"):
        code, err = cli("train", "--resume", good_run, "--set", "max_steps=3", "--quiet")
    assert code == 0, err
    assert f"stale lock of a writer that ended without releasing it (pid {holder.pid}" in caplog.text
    assert steps_of(good_run) == [1, 2, 3] and not (good_run / LOCK_FILE).exists()
    assert folder_state(good_run).status == "completed"
    assert_checkpoint_loads(good_run, 3)


def test_a_second_job_in_the_same_process_is_refused(good_run, corpus):
    acquire_run_folder(good_run)  # as a dashboard thread writing here would
    try:
        with pytest.raises(RunFolderLockedError, match=f"pid {os.getpid()}"):
            train_text(tiny_cfg(corpus, max_steps=2), good_run, overwrite=True, progress=False)
        assert lock_is_live(good_run)  # the refused run did not release the holder's lock
    finally:
        release_run_folder(good_run)
    assert not lock_is_live(good_run)
    assert_checkpoint_loads(good_run, 2)


def test_two_threads_racing_for_one_folder_get_one_lock(tmp_path):
    results: list[str] = []
    tried = threading.Barrier(4)

    def take() -> None:
        try:
            acquire_run_folder(tmp_path / "race")
            results.append("held")
        except RunFolderLockedError:
            results.append("refused")
        tried.wait()  # every thread has tried before the winner lets go
        release_run_folder(tmp_path / "race")  # only the holder's call releases anything

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["held", "refused", "refused", "refused"]
    assert not lock_is_live(tmp_path / "race") and not (tmp_path / "race" / LOCK_FILE).exists()


def test_compare_into_a_folder_with_a_live_writer_is_refused(holder, good_run, cli):
    code, err = cli("compare", "--preset", "text-demo", "--seq-lens", "64", "--steps", "1",
                    "--out", good_run, "--measure", "predicted", "--quiet")
    assert_clear_error(code, err, f"pid {holder.pid}")
    assert not (good_run / "compare.json").exists()
    assert_checkpoint_loads(good_run, 2)


BAD_NAMES = ["../../x", "..", ".", "a/b", "/tmp/abs", "a\\b", "", "  ", "name with space", "x" * 101,
             "tab\tname", "ü-umlaut"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_dashboard_run_names_outside_one_segment_are_refused(name, tmp_path):
    with pytest.raises(RunDirError, match="run name"):
        run_folder(tmp_path / "runs", name)


def test_dashboard_start_refuses_a_run_name_that_leaves_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    message, _, _ = train_handlers.start("../../x", 1, train_handlers.form_values("text-demo"))
    assert message.startswith("Error: run name '../../x'")
    assert common.MANAGER.job is None or common.MANAGER.job.name != "x"
    assert not any(tmp_path.parent.parent.glob("x")) and not (tmp_path / "runs").exists()
    assert run_folder(tmp_path / "runs", "run-1.b_c") == tmp_path / "runs" / "run-1.b_c"


def test_dashboard_measure_while_a_job_runs_names_the_job(monkeypatch, tmp_path, corpus):
    job = Job(name="busy-run", out=tmp_path / "busy-run", cfg=tiny_cfg(corpus))
    job.status = "running"
    monkeypatch.setattr(common.MANAGER, "job", job)
    monkeypatch.setattr(common, "RUNS_ROOT", tmp_path)
    message = compare_handlers.measure("text-demo", "64", 1, "cmp")
    assert message.startswith("Error:") and "busy-run" in message
    assert not (tmp_path / "cmp").exists()


def test_resume_and_overwrite_together_are_refused(good_run, cli):
    code, err = cli("train", "--resume", good_run, "--overwrite")
    assert_clear_error(code, err, "--resume and --overwrite exclude each other")
    assert_checkpoint_loads(good_run, 2)


def test_resume_of_an_empty_folder_is_refused(tmp_path, cli):
    code, err = cli("train", "--resume", tmp_path / "nothing")
    assert_clear_error(code, err, "nothing to resume")
    assert not (tmp_path / "nothing").exists()


def test_resume_that_changes_the_data_order_is_refused(good_run, cli):
    code, err = cli("train", "--resume", good_run, "--set", "seed=3")
    assert_clear_error(code, err, "cannot change seed")
    assert_checkpoint_loads(good_run, 2)


def test_resume_after_the_data_file_changed_is_refused(good_run, tmp_path, cli):
    cfg = json.loads((good_run / "config.json").read_text())
    moved = tmp_path / "changed.txt"
    moved.write_text("a different corpus\n\nwith other documents of other lengths\n", encoding="utf-8")
    cfg["data"] = str(moved)
    (good_run / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    metrics = (good_run / "metrics.jsonl").read_bytes()
    code, err = cli("train", "--resume", good_run, "--set", "max_steps=3")
    assert_clear_error(code, err, "the data file changed since the run started")
    assert (good_run / "metrics.jsonl").read_bytes() == metrics
    assert_checkpoint_loads(good_run, 2)


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe bad bytes", b"[1, 2]"],
                         ids=["malformed", "not utf-8", "not an object"])
def test_resume_with_a_damaged_config_json_names_the_file(content, good_run, cli):
    (good_run / "config.json").write_bytes(content)
    code, err = cli("train", "--resume", good_run)
    assert_clear_error(code, err, "config.json")
    assert_checkpoint_loads(good_run, 2)


def test_a_folder_holding_a_run_is_refused_without_a_flag(good_run, corpus, cli):
    code, err = cli("train", "--out", good_run, *tiny_sets(corpus))
    assert_clear_error(code, err, "holds another run")
    assert_checkpoint_loads(good_run, 2)
    assert not (good_run / LOCK_FILE).exists()
