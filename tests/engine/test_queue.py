"""The run queue without training: its file (atomic, a bad one moved aside with one line), the
checks when queued and at start, order, cancel, the once-only claim, two runners on one runs
folder, a deleted run folder or data file, and the sweep. A stand-in job manager records what
would start; tests/faults/test_queue_runs.py starts real runs."""

import json
import threading

import pytest

import lora_gui.memory.predict as predict_pkg
from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.engine.jobs import queue_runner as qr
from lora_gui.engine.jobs.manager import Job
from lora_gui.engine.jobs.queue_file import MARKER, Queue, QueueError, QueueFileError, parse_queue
from lora_gui.errors import UserError
from lora_gui.memory.predict import Prediction

TINY = {"max_seq_len": 64, "max_steps": 2, "eval_fraction": 0.0, "monitor_hz": 0.0}


class Recorder:
    """A job manager that records the runs it is asked to start (each "job" ends at once)."""

    def __init__(self) -> None:
        self.job = None
        self.started: list[str] = []
        self.how: list[dict] = []  # the launch arguments of each start (processes, fsdp, offload)

    def start(self, cfg, out, *, processes=1, **kw):
        self.started.append(out.name)
        self.how.append({"processes": processes, **kw})
        self.job = Job(name=out.name, out=out, cfg=cfg, status="completed")
        return self.job


@pytest.fixture()
def quick_plan(monkeypatch):
    """The plan step of the checks answers at once (1 MiB); settings and data are still checked.
    The real plan is exercised in test_the_check_plans_against_the_budget."""
    fake = Prediction(peak_bytes=2**20, device="cpu", how="plan")
    monkeypatch.setattr(predict_pkg, "predict", lambda cfg, **_: fake)


def cfg_on(data, **extra) -> RunConfig:
    return apply_overrides(RunConfig(), {**TINY, "data": str(data), **extra})


def test_the_check_plans_against_the_budget(tmp_path, small_corpus):
    ok = qr.check_run(cfg_on(small_corpus), "ok")
    assert ok.max_steps == 2
    with pytest.raises(QueueError, match=r"run tight: predicted peak .* GB does not fit budget_gb 0.01"):
        qr.check_run(cfg_on(small_corpus, budget_gb=0.01), "tight")
    with pytest.raises(ConfigError, match=r"queued run gone: data: .*missing.txt not found"):
        qr.check_run(cfg_on(tmp_path / "missing.txt"), "gone")
    with pytest.raises(UserError, match=r"model: local directory /no/such/model not found"):
        qr.check_run(cfg_on(small_corpus, model="/no/such/model"), "nomodel")
    bad = {**cfg_on(small_corpus).to_dict(), "lr": -1.0}
    with pytest.raises(ConfigError, match=r"queued run bad: lr: -1.0 is out of range"):
        qr.check_run(bad, "bad")


def test_add_reserves_the_folder_and_refuses_a_taken_name(tmp_path, small_corpus, quick_plan):
    entry = qr.add(tmp_path, cfg_on(small_corpus), "first")
    assert json.loads((tmp_path / "first" / MARKER).read_text())["id"] == entry.id
    saved = json.loads((tmp_path / "queue.json").read_text())["entries"][0]
    assert saved["config"] == cfg_on(small_corpus).to_dict() and saved["state"] == "queued"
    with pytest.raises(QueueError, match="'first' is queued already"):
        qr.add(tmp_path, cfg_on(small_corpus), "first")
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "run.json").write_text("{}")
    with pytest.raises(QueueError, match="holds another run"):
        qr.add(tmp_path, cfg_on(small_corpus), "done")
    with pytest.raises(Exception, match="run name '../x'"):
        qr.add(tmp_path, cfg_on(small_corpus), "../x")
    assert [e.name for e in Queue(tmp_path).entries()] == ["first"]


def test_order_moves_and_cancel(tmp_path, small_corpus, quick_plan):
    for name in "abc":
        qr.add(tmp_path, cfg_on(small_corpus), name)
    c_id = Queue(tmp_path).find(Queue(tmp_path).entries(), "c").id
    assert qr.move(tmp_path, "c", 1) == f"moved c ({c_id}) to position 1"
    qr.step(tmp_path, "a", -1)
    assert [e.name for e in Queue(tmp_path).entries()] == ["a", "c", "b"]
    assert qr.step(tmp_path, "a", -1).endswith("is already first of the queued runs")
    qr.step(tmp_path, "a", 1)
    qr.step(tmp_path, "a", -1)
    assert [e.name for e in Queue(tmp_path).entries()] == ["a", "c", "b"]
    assert qr.cancel(tmp_path, "c").startswith("cancelled c")
    assert not (tmp_path / "c").exists()  # its reservation freed
    with pytest.raises(QueueError, match="is cancelled; only queued runs can move"):
        qr.move(tmp_path, "c", 1)
    with pytest.raises(QueueError, match="no entry 'zzz'"):
        qr.cancel(tmp_path, "zzz")
    runner = qr.QueueRunner(Recorder(), tmp_path)
    started = [runner.tick(), runner.tick(), runner.tick()]
    assert [e.name if e else None for e in started] == ["a", "b", None]
    assert [e.state for e in Queue(tmp_path).entries()] == ["done", "cancelled", "done"]
    before = (tmp_path / "queue.json").stat()
    runner.tick()  # nothing changed: the file is not rewritten
    after = (tmp_path / "queue.json").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    runner.close()


TYPO = '{"entries": [{"id": "x", "name": "a", "config": {}, "state": "runing"}]}'


@pytest.mark.parametrize("nonsense", ["{not json", '{"entries": {}}', "[1, 2]", TYPO])
def test_a_queue_file_edited_into_nonsense_is_moved_aside_with_one_line(tmp_path, nonsense):
    path = tmp_path / "queue.json"
    path.write_text(nonsense)
    with pytest.raises(QueueFileError) as err:
        Queue(tmp_path).entries()
    line = str(err.value)
    assert "\n" not in line and str(path) in line and "moved aside to" in line, line
    assert (tmp_path / "queue.json.bad").read_text() == nonsense  # nothing lost
    assert Queue(tmp_path).entries() == []  # the queue goes on, empty
    path.write_text(nonsense)
    with pytest.raises(QueueFileError, match="queue.json.bad.2"):  # an earlier copy is kept too
        Queue(tmp_path).entries()
    if "runing" in nonsense:
        assert "entries[0].state: 'runing' is not one of queued" in line


def test_a_runner_reports_a_bad_queue_file_and_starts_nothing(tmp_path):
    (tmp_path / "queue.json").write_text('{"entries": [{"id": 1}]}')
    manager = Recorder()
    runner = qr.QueueRunner(manager, tmp_path)
    assert runner.tick() is None and manager.started == []
    assert "entries[0].id: expected str" in runner.problem and "queue.json.bad" in runner.problem
    runner.close()


def test_parse_refuses_a_duplicate_id():
    body = {"entries": [{"id": "x", "name": "a", "config": {}}, {"id": "x", "name": "b", "config": {}}]}
    with pytest.raises(QueueFileError, match="id 'x' appears twice"):
        parse_queue(json.dumps(body), "q.json")


def test_a_deleted_run_folder_or_data_file_fails_that_entry_and_the_next_one_runs(tmp_path, small_corpus,
                                                                                 quick_plan):
    doomed = tmp_path / "doomed.txt"
    doomed.write_text(small_corpus.read_text())
    for name, data in (("gone", small_corpus), ("nodata", doomed), ("fine", small_corpus)):
        qr.add(tmp_path, cfg_on(data), name)
    (tmp_path / "gone" / MARKER).unlink()
    (tmp_path / "gone").rmdir()
    doomed.unlink()
    lines: list[str] = []
    manager = Recorder()
    runner = qr.QueueRunner(manager, tmp_path, say=lines.append)
    assert runner.tick().name == "fine" and manager.started == ["fine"]
    gone, nodata, fine = Queue(tmp_path).entries()
    assert gone.state == nodata.state == "failed" and fine.state == "started"
    deleted = "the run folder was deleted while its run was queued; skipped"
    assert gone.message == f"{tmp_path / 'gone'}: {deleted}"
    assert nodata.message == f"queued run nodata: data: {doomed} not found"
    assert all("\n" not in line for line in lines) and len(lines) == 3
    runner.close()


def test_two_runners_on_one_runs_folder_never_start_a_run_twice(tmp_path, small_corpus, quick_plan):
    for name in "ab":
        qr.add(tmp_path, cfg_on(small_corpus), name)
    first, second = Recorder(), Recorder()
    one, two = qr.QueueRunner(first, tmp_path), qr.QueueRunner(second, tmp_path)
    barrier = threading.Barrier(2)

    def tick(runner):
        barrier.wait()
        runner.tick()

    threads = [threading.Thread(target=tick, args=(r,)) for r in (one, two)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(first.started) + len(second.started) == 1  # one runner holds the queue
    idle = two if first.started else one
    assert idle.problem.startswith(f"the queue in {tmp_path} is run by another dashboard")
    assert "this one shows it and starts none of its runs" in idle.problem
    (one if first.started else two).close()  # the first dashboard goes away: the other takes over
    idle.tick()
    assert sorted(first.started + second.started) == ["a", "b"] and idle.problem == ""
    idle.close()


def test_a_claimed_entry_is_never_started_again(tmp_path, small_corpus, quick_plan):
    entry = qr.add(tmp_path, cfg_on(small_corpus), "once")
    assert Queue(tmp_path).claim(entry) and not Queue(tmp_path).claim(entry)
    manager = Recorder()
    runner = qr.QueueRunner(manager, tmp_path)
    runner.tick()  # the state says queued (a lost write, a hand edit): the claim still stops it
    assert manager.started == []
    assert Queue(tmp_path).entries()[0].state == "failed"
    assert "was started once already" in Queue(tmp_path).entries()[0].message
    runner.close()


def test_a_sweep_queues_one_run_per_value_and_refuses_all_on_one_bad_value(tmp_path, small_corpus,
                                                                          quick_plan):
    entries = qr.sweep(tmp_path, cfg_on(small_corpus), "lr", "1e-4, 2e-4,4e-4", "s")
    assert [e.name for e in entries] == ["s-lr-0.0001", "s-lr-0.0002", "s-lr-0.0004"]
    assert [e.config["lr"] for e in entries] == [1e-4, 2e-4, 4e-4]
    assert len({e.sweep for e in entries}) == 1
    with pytest.raises(ConfigError, match="sweep lora_rank=-1: lora_rank: -1 is out of range"):
        qr.sweep(tmp_path, cfg_on(small_corpus), "lora_rank", "8,-1", "t")
    with pytest.raises(ConfigError, match="unknown key 'learning_rate'"):
        qr.sweep(tmp_path, cfg_on(small_corpus), "learning_rate", "1e-4,2e-4", "t")
    with pytest.raises(ConfigError, match="two or more"):
        qr.sweep(tmp_path, cfg_on(small_corpus), "lr", "1e-4", "t")
    assert len(Queue(tmp_path).entries()) == 3  # nothing of the refused sweeps was queued


# -- the CLI: python -m lora_gui queue ... --------------------------------------------------------
def _cli(capsys, *args) -> tuple[int, str, str]:
    from lora_gui.cli import main

    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _one_error_line(code: int, err: str, *needles: str) -> None:
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, (code, err)
    assert "Traceback" not in err and all(n in err for n in needles), err


def test_cli_add_list_move_cancel(tmp_path, small_corpus, capsys, quick_plan):
    sets = [a for k, v in {**TINY, "data": small_corpus}.items() for a in ("--set", f"{k}={v}")]
    assert _cli(capsys, "queue", "list", "--runs", tmp_path)[1] == "the queue is empty\n"
    for name in ("one", "two"):
        code, out, err = _cli(capsys, "queue", "add", "--runs", tmp_path, *sets, "--name", name)
        assert code == 0 and out.startswith(f"queued {name} (") and str(tmp_path / "queue.json") in out, err
    assert _cli(capsys, "queue", "move", "--runs", tmp_path, "two", "1")[1].startswith("moved two")
    code, out, _ = _cli(capsys, "queue", "list", "--runs", tmp_path)
    assert [line.split()[3] for line in out.splitlines()[1:]] == ["two", "one"]
    assert _cli(capsys, "queue", "cancel", "--runs", tmp_path, "one")[1].startswith("cancelled one")
    listed = json.loads(_cli(capsys, "queue", "list", "--runs", tmp_path, "--json")[1])
    assert [(e["name"], e["state"]) for e in listed] == [("two", "queued"), ("one", "cancelled")]


def test_cli_bad_input_gets_one_line(tmp_path, small_corpus, capsys, quick_plan):
    runs = tmp_path / "runs"
    code, _, err = _cli(capsys, "queue", "add", "--runs", runs, "--set", "lr=-1", "--name", "x")
    _one_error_line(code, err, "lr: -1")
    code, _, err = _cli(capsys, "queue", "add", "--runs", runs, "--set", f"data={tmp_path / 'no.txt'}",
                        "--name", "x")
    _one_error_line(code, err, "data:", "no.txt not found")
    code, _, err = _cli(capsys, "queue", "sweep", "--runs", runs, "--sweep", "lr", "--name", "x")
    _one_error_line(code, err, "--sweep 'lr': expected KEY=V1,V2")
    runs.mkdir()
    (runs / "queue.json").write_text("entries: [oops")
    code, _, err = _cli(capsys, "queue", "list", "--runs", runs)
    _one_error_line(code, err, str(runs / "queue.json"), "not valid JSON", "queue.json.bad")
    holder = qr.QueueRunner(Recorder(), runs)
    assert holder.lock.acquire()  # a dashboard runs this queue
    code, _, err = _cli(capsys, "queue", "run", "--runs", runs)
    _one_error_line(code, err, f"the queue in {runs} is run by another dashboard or `queue run` (pid")
    holder.close()


def test_an_entry_edited_by_hand_into_bad_settings_or_a_path_fails_at_start_with_one_line(
        tmp_path, small_corpus, quick_plan):
    for name in ("typo", "escape", "fine"):
        qr.add(tmp_path, cfg_on(small_corpus), name)
    with Queue(tmp_path).edit() as entries:
        entries[0].config["lr"] = "fast"
        entries[1].name = "../outside"
    manager = Recorder()
    runner = qr.QueueRunner(manager, tmp_path)
    assert runner.tick().name == "fine" and manager.started == ["fine"]
    typo, escape, _ = Queue(tmp_path).entries()
    assert typo.state == "failed" and typo.message == "queued run typo: lr: expected float, got 'fast'"
    assert escape.state == "failed" and "run name '../outside'" in escape.message
    assert not (tmp_path.parent / "outside").exists()
    runner.close()


HOLDER = """
import sys, time
from lora_gui.engine.jobs.queue_file import RunnerLock
assert RunnerLock(sys.argv[1]).acquire()
print("holding", flush=True)
time.sleep(60)
"""


@pytest.mark.integration
def test_a_second_dashboard_process_gets_one_line_and_takes_over_when_the_first_ends(
        tmp_path, small_corpus, quick_plan):
    import os
    import subprocess
    import sys
    from pathlib import Path

    qr.add(tmp_path, cfg_on(small_corpus), "a")
    root = Path(__file__).resolve().parents[2]
    other = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(root)}, cwd=root)
    try:
        assert other.stdout.readline().strip() == "holding"
        manager = Recorder()
        runner = qr.QueueRunner(manager, tmp_path)
        assert runner.tick() is None and manager.started == []
        assert runner.problem.startswith(f"the queue in {tmp_path} is run by another dashboard or "
                                         f"`queue run` (pid {other.pid} on ")
    finally:
        other.kill()
        other.wait()
    assert runner.tick().name == "a" and runner.problem == ""  # the kernel dropped its lock
    runner.close()


def test_an_fsdp_entry_is_planned_per_gpu_kept_and_launched_as_start_launches_it(tmp_path, small_corpus,
                                                                                 monkeypatch):
    """How several GPUs share a queued run (FSDP, offload) is planned, kept in the queue file and
    passed to the job manager as Start passes it."""
    asked: list[dict] = []
    fake = Prediction(peak_bytes=2**20, device="cuda", how="plan")
    monkeypatch.setattr(predict_pkg, "predict", lambda cfg, **kw: asked.append(kw) or fake)
    qr.add(tmp_path, cfg_on(small_corpus), "sharded", 2, fsdp=True, offload=True)
    qr.add(tmp_path, cfg_on(small_corpus), "alone", 1, fsdp=True)  # one process: nothing to shard
    assert asked == [{"processes": 2, "fsdp": True, "offload": True},
                     {"processes": 1, "fsdp": False, "offload": False}]
    entries = json.loads(Queue(tmp_path).path.read_text())["entries"]
    assert [(e["fsdp"], e["offload"]) for e in entries] == [(True, True), (False, False)]
    manager = Recorder()
    runner = qr.QueueRunner(manager, tmp_path)
    runner.tick()
    assert manager.how == [{"processes": 2, "fsdp": True, "offload": True}]
    assert asked[-1] == {"processes": 2, "fsdp": True, "offload": True}  # checked again at start
    runner.close()
    with pytest.raises(ConfigError, match="ask for FSDP too"):
        qr.add(tmp_path, cfg_on(small_corpus), "offload-only", 2, offload=True)
    bad = [{"id": "a", "name": "a", "config": {}, "fsdp": "yes"}]
    with pytest.raises(QueueFileError, match=r"entries\[0\]\.fsdp: expected true or false"):
        parse_queue(json.dumps({"entries": bad}), "queue.json")
