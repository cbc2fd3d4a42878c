"""Three queued runs (a sweep of the text demo's learning rate, two steps each) run one after the
other, each its own process: the first from a dashboard that goes away while it trains, the
second from a dashboard started again (a new job manager), the third from ``python -m lora_gui
queue run`` (in this process; the run itself is a process of its own); then the Runs tab
overlays the sweep."""

import json

import pytest

from lora_gui.cli import main
from lora_gui.engine.core.records import read_records
from lora_gui.engine.jobs.manager import JobManager
from lora_gui.engine.jobs.queue_file import Queue
from lora_gui.engine.jobs.queue_runner import QueueRunner
from lora_gui.ui import common
from lora_gui.ui.tabs import queue_handlers

from .conftest import steps_of, wait_for

SETS = {"max_steps": 2, "max_seq_len": 64, "eval_fraction": 0.1, "monitor_hz": 0.0}


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _states(runs) -> list[str]:
    return [e.state for e in Queue(runs).entries()]


@pytest.mark.integration
@pytest.mark.slow
def test_three_queued_runs_one_after_the_other_across_a_restart_then_overlaid(tmp_path, corpus, capsys,
                                                                             monkeypatch):
    runs = tmp_path / "runs"
    sets = [a for k, v in {**SETS, "data": corpus}.items() for a in ("--set", f"{k}={v}")]
    code, out, err = _cli(capsys, "queue", "sweep", "--runs", runs, "--preset", "text-demo", *sets,
                          "--sweep", "lr=1e-3,2e-3,4e-3", "--name", "demo")
    assert code == 0, err
    assert "queued a sweep of lr" in out
    code, out, _ = _cli(capsys, "queue", "list", "--runs", runs)
    assert code == 0 and out.count("queued") == 3 and "demo-lr-0.001" in out
    names = [e.name for e in Queue(runs).entries()]
    assert names == ["demo-lr-0.001", "demo-lr-0.002", "demo-lr-0.004"]

    # dashboard 1 starts the first run, then goes away while it trains
    first = QueueRunner(JobManager(), runs)
    assert first.tick().name == names[0]
    wait_for(lambda: len(steps_of(runs / names[0])) >= 1, 180, "the first run's first step")
    first.close()

    # dashboard 2: re-attaches to the first run, starts the second when the card is free
    manager = JobManager()
    manager.attach_live(runs)
    second = manager.run_queue(runs, every_s=0.2)  # the dashboard's background runner
    wait_for(lambda: _states(runs)[1] == "started", 240, "the second run to start")
    second.starting = False  # this dashboard closes after its run: the CLI runs the rest
    wait_for(lambda: _states(runs)[1] == "done", 240, "the second run to end")
    second.close()
    assert _states(runs) == ["done", "done", "queued"]

    code, out, err = _cli(capsys, "queue", "run", "--runs", runs)  # its run is a process of its own
    assert code == 0, err
    assert f"started {names[2]}" in out and f"{names[2]}: done" in out

    entries = Queue(runs).entries()
    assert [e.state for e in entries] == ["done"] * 3
    assert sorted(p.name for p in (runs / ".queue" / "claims").iterdir()) == sorted(e.id for e in entries)
    spans = []
    for name in names:
        records = read_records(runs / name / "metrics.jsonl")
        assert [r["step"] for r in records] == [1, 2]  # each run's steps once
        assert json.loads((runs / name / "run.json").read_text())["status"] == "completed"
        spans.append((records[0]["time"], records[-1]["time"]))
    assert spans[0][1] < spans[1][0] and spans[1][1] < spans[2][0]  # one after the other

    monkeypatch.setattr(common, "RUNS_ROOT", runs)
    message, memory, loss, speed = queue_handlers.overlay_sweep(entries[0].sweep, 0.0)
    assert message == f"Overlay of {', '.join(names)}"
    for fig in (memory, loss):
        assert [t.name for t in fig.data] == names
    assert [t.name for t in speed.data] == [f"{n} (tokens/s)" for n in names]  # each in its unit
    for fig in (memory, loss, speed):
        assert all(len(t.x) == 2 for t in fig.data)  # every run's curve, throughput included
