"""One run on the card per runs folder across processes: a live run folder or a start under way
refuses a second Start with one line, two processes starting at once never both get the card,
stale notes are dropped, and a queued run waits (stays queued) while the card is busy."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lora_gui.config import RunConfig
from lora_gui.engine.jobs import card_guard
from lora_gui.engine.jobs import queue_runner as qr
from lora_gui.engine.jobs.card_guard import (
    CardBusyError,
    busy_with,
    claim_card,
    note_pid,
    release_card,
    start_lock,
)
from lora_gui.engine.jobs.manager import Job, JobManager
from lora_gui.engine.jobs.queue_file import Entry, Queue

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_a_live_run_folder_of_another_process_refuses_a_start_naming_it(tmp_path):
    root = tmp_path / "runs"
    (root / "other").mkdir(parents=True)
    holder = _python("""
        import sys, time
        from pathlib import Path
        from lora_gui.engine.core.lock import acquire_run_folder
        acquire_run_folder(Path(sys.argv[1]))
        Path(sys.argv[2]).touch()
        time.sleep(60)
    """, str(root / "other"), str(tmp_path / "ready"))
    try:
        _wait_for(tmp_path / "ready")
        assert busy_with(root).startswith(f"other (pid {holder.pid}")
        with pytest.raises(CardBusyError, match=r"a run is training on this card: other \(pid \d+"):
            with start_lock(root):
                claim_card(root, root / "mine")
        with pytest.raises(CardBusyError, match="add this one to the queue"):
            JobManager().start(RunConfig(), root / "mine")
        assert not (root / "mine").exists()  # nothing started, nothing written
    finally:
        holder.kill()
        holder.wait()
    assert busy_with(root) is None  # the kernel dropped its lock


def test_two_processes_starting_at_once_never_both_get_the_card(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    code = """
        import sys, time
        from pathlib import Path
        from lora_gui.engine.jobs.card_guard import CardBusyError, claim_card, start_lock
        root, name, go = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
        while not go.exists():
            time.sleep(0.001)
        try:
            with start_lock(root):
                claim_card(root, root / name)
            print("claimed", flush=True)
        except CardBusyError as err:
            print("refused", err, flush=True)
        time.sleep(3)  # a dashboard that started a run stays up while it launches
    """
    procs = [_python(code, str(root), f"run{i}", str(tmp_path / "go")) for i in range(4)]
    time.sleep(1.0)  # every process imported and waits on the same file
    (tmp_path / "go").touch()
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert sum(o.startswith("claimed") for o in outs) == 1, outs
    assert all(o.startswith("refused a run is training on this card: run") for o in outs
               if not o.startswith("claimed")), outs


def test_notes_count_while_their_run_or_launcher_lives_and_are_dropped_after(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    with start_lock(root):
        claim_card(root, root / "a")  # noted by this (live) process, its run's pid not known yet
    assert busy_with(root) == f"a (starting, launched by pid {os.getpid()})"
    assert busy_with(root, root / "a") is None  # a folder's own start is refused by its own lock
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    note_pid(root, root / "a", gone.pid)  # its run's process has ended
    assert busy_with(root) is None
    assert not (root / ".queue" / "starting" / "a.json").exists()  # the stale note is dropped
    with start_lock(root):
        claim_card(root, root / "b")
    note = root / ".queue" / "starting" / "b.json"
    old = json.loads(note.read_text())
    note.write_text(json.dumps({**old, "time": time.time() - card_guard.LAUNCH_GRACE_S - 1}))
    assert busy_with(root) is None  # a launch that never said its process id ran out of time
    with start_lock(root):
        claim_card(root, root / "c")
    release_card(root, root / "c")
    assert busy_with(root) is None


class Recorder:
    def __init__(self) -> None:
        self.job = None
        self.started: list[str] = []

    def start(self, cfg, out, *, processes=1, **_):
        self.started.append(out.name)
        self.job = Job(name=out.name, out=out, cfg=cfg, status="completed")
        return self.job


def test_a_queued_run_waits_while_another_dashboard_starts_one(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    (root / "queued").mkdir(parents=True)
    with Queue(root).edit() as entries:
        entries.append(Entry(id="e1", name="queued", config=RunConfig().to_dict()))
    monkeypatch.setattr(qr, "check_run", lambda *args, **kwargs: RunConfig())
    other = _python("""
        import sys, time
        from pathlib import Path
        from lora_gui.engine.jobs.card_guard import claim_card, start_lock
        root = Path(sys.argv[1])
        with start_lock(root):
            claim_card(root, root / "elsewhere")
        print("ok", flush=True)
        time.sleep(60)
    """, str(root))
    try:
        assert other.stdout.readline().strip() == "ok"
        manager = Recorder()
        runner = qr.QueueRunner(manager, root)
        assert runner.tick() is None
        assert manager.started == []
        assert [e.state for e in Queue(root).entries()] == ["queued"]  # waits, not failed
    finally:
        other.kill()
        other.wait()
    assert runner.tick().name == "queued"  # the other dashboard is gone: its note is stale
    assert manager.started == ["queued"]
    runner.close()
