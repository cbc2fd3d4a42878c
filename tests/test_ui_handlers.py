import time

import pytest

from lora_gui.ui import handlers


@pytest.fixture()
def runs_root(tmp_path, monkeypatch):
    monkeypatch.setattr(handlers, "RUNS_ROOT", tmp_path)
    monkeypatch.setattr(handlers, "MANAGER", handlers.JobManager())
    return tmp_path


def form(**kw):
    values = dict(zip(handlers.FORM_KEYS, handlers.form_defaults("text-demo")))
    values.update(kw)
    return [values[k] for k in handlers.FORM_KEYS]


@pytest.mark.parametrize("kw, words", [
    ({"data": "/no/such/file.txt"}, ["/no/such/file.txt", "not found"]),
    ({"data": "  "}, ["data", "empty"]),
    ({"budget_gb": -1}, ["budget_gb", "-1"]),
    ({"max_seq_len": 8}, ["max_seq_len", "8"]),
])
def test_bad_form_values_give_a_message_and_start_nothing(runs_root, kw, words):
    message = handlers.start("text-demo", "r", *form(**kw))
    assert message.startswith("Error:")
    for word in words:
        assert word in message
    assert handlers.MANAGER.job is None


def test_second_start_is_refused_while_running(runs_root, small_corpus):
    values = form(data=str(small_corpus), max_seq_len=64)
    first = handlers.start("text-demo", "one", *values)
    assert "Started" in first
    second = handlers.start("text-demo", "two", *values)
    assert "already running" in second and "one" in second
    handlers.stop()
    deadline = time.time() + 120
    while handlers.MANAGER.job.running and time.time() < deadline:
        time.sleep(0.2)
    job = handlers.MANAGER.job
    assert job.status == "stopped" and (runs_root / "one" / "adapter").is_dir()
    memory, loss, throughput, status, log = handlers.poll()
    assert "stopped" in status and "stop requested" in log


def test_failed_job_is_not_left_running(runs_root, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nope": 1}\n', encoding="utf-8")
    handlers.start("text-demo", "bad", *form(data=str(bad)))
    deadline = time.time() + 60
    while handlers.MANAGER.job.running and time.time() < deadline:
        time.sleep(0.1)
    assert handlers.MANAGER.job.status == "failed" and "bad.jsonl:1" in handlers.MANAGER.job.error
