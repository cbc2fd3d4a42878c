"""Fault suite, crashes: kill -9 mid-run and mid-checkpoint, Ctrl-C twice, a full disk, a
read-only folder, a dashboard job killed from outside; and a resume after each that trains
every step once. The last good checkpoint always loads."""

from __future__ import annotations

import builtins
import errno
import io
import os
import signal
import time
from pathlib import Path

import pytest

from lora_gui.engine.core import checkpoint as ckpt
from lora_gui.engine.core.lock import LOCK_FILE, lock_is_live, read_lock
from lora_gui.engine.core.records import RecordLog
from lora_gui.engine.core.runstate import folder_state
from lora_gui.engine.jobs.manager import JobManager
from tests.faults.conftest import (
    assert_checkpoint_loads,
    assert_clear_error,
    checkpoint_step,
    spawn,
    steps_of,
    tiny_cfg,
    tiny_sets,
    wait_for,
)

DEAD_WITHIN_S = 5.0  # "within a few seconds": a killed run must read as failed by then


def _resume_to(cli, out: Path, steps: int) -> None:
    code, err = cli("train", "--resume", out, "--set", f"max_steps={steps}", "--quiet")
    assert code == 0, err
    assert steps_of(out) == list(range(1, steps + 1))  # every step once, none lost or repeated
    assert folder_state(out).status == "completed" and not (out / LOCK_FILE).exists()
    assert_checkpoint_loads(out, steps)


def _failed_within_seconds(out: Path) -> float:
    start = time.monotonic()
    wait_for(lambda: folder_state(out).status == "failed", DEAD_WITHIN_S, "the run to read as failed")
    return time.monotonic() - start


def test_kill_9_mid_run_reads_failed_refuses_no_one_and_resumes(tmp_path, corpus, cli):
    out = tmp_path / "run"
    proc = spawn(["train", "--out", out, "--quiet", *tiny_sets(corpus, max_steps=400)],
                 FAULT_STEP_DELAY_S="0.2")
    try:
        wait_for(lambda: checkpoint_step(out) >= 2 and len(steps_of(out)) >= 3, 120, "step 3")
        state = folder_state(out)
        assert state.status == "running" and read_lock(out).pid == proc.pid
        code, err = cli("train", "--out", out, "--overwrite", *tiny_sets(corpus))  # a second writer
        assert_clear_error(code, err, f"pid {proc.pid}")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    _failed_within_seconds(out)
    state = folder_state(out)
    assert state.last_step is not None and state.last_step >= 3
    assert f"after step {state.last_step}" in state.message and f"--resume {out}" in state.message
    good = assert_checkpoint_loads(out)
    _resume_to(cli, out, good + 2)


def test_kill_9_while_a_checkpoint_is_written_keeps_the_last_good_one(tmp_path, corpus, cli):
    out = tmp_path / "run"
    proc = spawn(["train", "--out", out, "--quiet", *tiny_sets(corpus, max_steps=6)],
                 FAULT_KILL_IN_CHECKPOINT="4")
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == -signal.SIGKILL, stderr.decode()[-2000:]
    assert list((out / "checkpoints").glob(".tmp-step-00000004-*")), "the kill did not hit the write"
    assert_checkpoint_loads(out, 2)
    assert folder_state(out).status == "failed"
    _resume_to(cli, out, 6)
    assert not list((out / "checkpoints").glob(".tmp-step-*"))  # the half-written one is gone


def test_ctrl_c_twice_exits_without_traceback_and_resumes(tmp_path, corpus, cli):
    out = tmp_path / "run"
    proc = spawn(["train", "--out", out, "--quiet", *tiny_sets(corpus, max_steps=400)],
                 FAULT_STEP_DELAY_S="0.2")
    wait_for(lambda: checkpoint_step(out) >= 2, 120, "the first checkpoint")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)  # the first one is handled (stop requested) before the second arrives
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    text = stderr.decode()
    assert proc.returncode != 0 and "Traceback" not in text, text[-2000:]
    assert "press Ctrl-C again to abort at once" in text
    assert not lock_is_live(out)
    good = assert_checkpoint_loads(out)
    _resume_to(cli, out, good + 2)


def _no_space(path) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def test_full_disk_while_writing_a_checkpoint(good_run, cli, monkeypatch):
    real_save = ckpt.torch.save

    def save_half_then_fail(obj, path, *args, **kwargs):
        Path(path).write_bytes(b"partial")  # what a full disk leaves: a short file
        raise _no_space(path)

    monkeypatch.setattr(ckpt.torch, "save", save_half_then_fail)
    code, err = cli("train", "--resume", good_run, "--set", "max_steps=4", "--quiet")
    assert_clear_error(code, err, "no space left on the disk", "state.pt", "last good checkpoint is step 2")
    assert not (good_run / LOCK_FILE).exists() and folder_state(good_run).status == "failed"
    assert_checkpoint_loads(good_run, 2)
    monkeypatch.setattr(ckpt.torch, "save", real_save)  # space freed
    _resume_to(cli, good_run, 4)


def test_full_disk_while_appending_metrics(good_run, cli, monkeypatch):
    real_append = RecordLog.append

    def append(self, record):
        if self.path.name == "metrics.jsonl" and record.get("step") == 3:
            raise _no_space(self.path)
        real_append(self, record)

    monkeypatch.setattr(RecordLog, "append", append)
    code, err = cli("train", "--resume", good_run, "--set", "max_steps=4", "--quiet")
    assert_clear_error(code, err, "no space left on the disk", "metrics.jsonl")
    assert_checkpoint_loads(good_run, 2)
    monkeypatch.setattr(RecordLog, "append", real_append)
    _resume_to(cli, good_run, 4)


def _read_only(folder: Path, monkeypatch) -> None:
    """Makes ``folder`` read-only: chmod where the kernel enforces it; as root (which ignores
    modes, as on this machine) writes under it fail with EROFS, as on a read-only mount."""
    if os.geteuid() != 0:
        for path in [folder, *folder.rglob("*")]:
            path.chmod(path.stat().st_mode & ~0o222)
        return
    root = str(folder.resolve())

    def blocked(path) -> bool:
        return str(Path(os.fsdecode(path)).resolve()).startswith(root)

    def erofs(path) -> OSError:
        return OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))

    real_os_open, real_mkdir, real_open = os.open, os.mkdir, io.open

    def os_open(path, flags, *args, **kwargs):
        if blocked(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise erofs(path)
        return real_os_open(path, flags, *args, **kwargs)

    def mkdir(path, *args, **kwargs):
        if blocked(path) and not os.path.exists(path):
            raise erofs(path)
        return real_mkdir(path, *args, **kwargs)

    def open_(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)) and blocked(file) and set(mode) & set("wax+"):
            raise erofs(file)
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(io, "open", open_)
    monkeypatch.setattr(builtins, "open", open_)


def _writable(folder: Path, monkeypatch) -> None:
    monkeypatch.undo()
    for path in [folder, *folder.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)


def test_new_run_into_a_read_only_folder_says_so(tmp_path, corpus, cli, monkeypatch):
    parent = tmp_path / "readonly"
    parent.mkdir()
    _read_only(parent, monkeypatch)
    code, err = cli("train", "--out", parent / "run", *tiny_sets(corpus, max_steps=2))
    _writable(parent, monkeypatch)
    assert_clear_error(code, err, "could not write", "nothing was written")
    assert "read-only" in err or "permission" in err
    assert not (parent / "run").exists()


def test_resume_in_a_read_only_folder_changes_nothing_then_resumes(good_run, cli, monkeypatch):
    before = {p: p.read_bytes() for p in good_run.rglob("*") if p.is_file()}
    _read_only(good_run, monkeypatch)
    code, err = cli("train", "--resume", good_run, "--set", "max_steps=4", "--quiet")
    _writable(good_run, monkeypatch)
    assert_clear_error(code, err, "could not write", "last good checkpoint is step 2")
    assert {p: p.read_bytes() for p in good_run.rglob("*") if p.is_file()} == before
    assert_checkpoint_loads(good_run, 2)
    _resume_to(cli, good_run, 4)


@pytest.mark.slow
def test_dashboard_job_killed_from_outside_reads_failed_within_seconds(tmp_path, corpus, cli):
    out = tmp_path / "runs" / "killed"
    job = JobManager().start(tiny_cfg(corpus, max_steps=400), out, processes=2)  # accelerate launch
    try:
        wait_for(lambda: checkpoint_step(out) >= 2 and job.status == "running", 240, "step 2")
        main_pid = read_lock(out).pid
        os.kill(main_pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: not job.running, DEAD_WITHIN_S + 10, "the job to end")
    finally:
        job.control.stop.set()
    took = time.monotonic() - killed
    assert job.status == "failed", job.events
    assert "after step" in job.error and "--resume" in job.error, job.error
    assert took <= DEAD_WITHIN_S, f"{took:.1f} s to notice"
    assert folder_state(out).status == "failed"
    good = assert_checkpoint_loads(out)
    _resume_to(cli, out, good + 1)
