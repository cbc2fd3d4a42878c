"""A dashboard run is a process of its own: it keeps training when the dashboard is killed, a
dashboard started later re-attaches to it and follows it to its end with every step's record
once, and Stop asked twice ends it."""

import json
import os
import signal
import subprocess
import sys

import pytest

from lora_gui.engine.jobs.manager import JobManager

from .conftest import ROOT, TINY, steps_of, tiny_cfg, wait_for

# A dashboard stand-in: starts a run through the job manager, prints the run's pid, then idles.
DASHBOARD = """
import json, sys, time
from pathlib import Path
from lora_gui.config import RunConfig, apply_overrides
from lora_gui.engine.jobs.manager import JobManager
job = JobManager().start(apply_overrides(RunConfig(), json.loads(sys.argv[1])), Path(sys.argv[2]))
while job.pid is None and job.running:
    time.sleep(0.05)
print(job.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.integration
@pytest.mark.slow
def test_a_run_outlives_a_killed_dashboard_and_a_new_one_follows_it_to_the_end(tmp_path, corpus):
    out = tmp_path / "runs" / "live"
    steps = 120
    settings = {**TINY, "data": str(corpus), "max_steps": steps, "checkpoint_every": 40}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    dashboard = subprocess.Popen([sys.executable, "-c", DASHBOARD, json.dumps(settings), str(out)],
                                 stdout=subprocess.PIPE, env=env, cwd=ROOT, text=True)
    try:
        pid = int(dashboard.stdout.readline())
        wait_for(lambda: len(steps_of(out)) >= 2, 180, "the run's first steps")
    finally:
        dashboard.send_signal(signal.SIGKILL)  # the server dies; its run must not
        dashboard.wait()
    seen = len(steps_of(out))
    assert _alive(pid)
    wait_for(lambda: len(steps_of(out)) > seen, 120, "a step after the dashboard died")

    manager = JobManager()  # a dashboard started again
    job = manager.attach_live(tmp_path / "runs")
    assert job is not None and job.running and job.pid == pid
    wait_for(lambda: not job.running, 300, "the re-attached run to end")
    assert job.status == "completed", job.error
    followed = [r["step"] for r in job.records]
    assert followed == list(range(1, steps + 1)) == steps_of(out)  # every step once, nothing lost
    assert manager.attach_live(tmp_path / "runs") is None  # nothing left alive to follow


@pytest.mark.integration
def test_stop_asks_a_checkpoint_then_a_second_stop_ends_the_process(tmp_path, corpus):
    manager = JobManager()
    out = tmp_path / "runs" / "stopped"
    job = manager.start(tiny_cfg(corpus, max_steps=100000, checkpoint_every=1000), out)
    wait_for(lambda: job.pid is not None and len(steps_of(out)) >= 1, 180, "the run's first step")
    os.kill(job.pid, signal.SIGSTOP)  # hold the process so the first Stop cannot finish the run
    try:
        assert manager.stop().startswith("stopping")
        wait_for(lambda: (out / "STOP").is_file(), 10, "the stop request in the run folder")
        assert manager.stop().startswith("ending")
    finally:
        try:
            os.kill(job.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    wait_for(lambda: not job.running, 60, "the ended run to be seen")
    assert job.status == "failed" and "--resume" in job.error and not _alive(job.pid)
