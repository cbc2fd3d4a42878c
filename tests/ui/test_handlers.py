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
    ({"budget_gb": 0}, ["budget_gb", "0", "VRAM budget"]),
    ({"window": 4096, "attention": "windowed"}, ["window", "4096", "max_seq_len"]),
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
    deadline = time.time() + 120
    while not handlers.MANAGER.job.records and time.time() < deadline:
        time.sleep(0.1)
    handlers.stop()
    deadline = time.time() + 120
    while handlers.MANAGER.job.running and time.time() < deadline:
        time.sleep(0.2)
    job = handlers.MANAGER.job
    assert job.status == "stopped" and (runs_root / "one" / "adapter").is_dir()
    timeline, peaks, loss, throughput, status, log = handlers.poll()
    assert "stopped" in status and "stop requested" in log and "checkpoint saved" in log
    assert len(timeline.data[0].x) >= 1 and "tracker" in timeline.data[0].name
    assert any(t.name == "budget (simulated VRAM)" for t in timeline.data)
    assert [s.type for s in timeline.layout.shapes].count("rect") >= 2  # loading, training... shaded


def test_failed_job_is_not_left_running(runs_root, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nope": 1}\n', encoding="utf-8")
    handlers.start("text-demo", "bad", *form(data=str(bad)))
    deadline = time.time() + 60
    while handlers.MANAGER.job.running and time.time() < deadline:
        time.sleep(0.1)
    assert handlers.MANAGER.job.status == "failed" and "bad.jsonl:1" in handlers.MANAGER.job.error


def mib(text: str) -> float:
    import re

    return float(re.search(r"\*\*([\d,]+) MiB\*\*", text).group(1).replace(",", ""))


def test_switches_update_the_predicted_peak():
    optimized = handlers.predict("text-demo", *form())
    traditional = handlers.predict("text-demo", *form(mode="traditional"))
    checkpointed = handlers.predict("text-demo", *form(mode="traditional", gradient_checkpointing=True))
    assert "source: predicted" in optimized
    assert mib(traditional) > mib(checkpointed) and mib(traditional) > mib(optimized)
    assert "above the budget" in handlers.predict("text-demo", *form(mode="traditional", budget_gb=0.05))
    assert "not available" in handlers.predict("text-demo", *form(window=0, attention="windowed"))


def test_save_preset_validates_before_writing(tmp_path, monkeypatch):
    from lora_gui import presets

    monkeypatch.setattr(presets, "PRESET_DIR", tmp_path)
    assert "batch_size" in handlers.save_preset("p", "# test\nbatch_sise: 4\n")  # suggests the key
    assert "lora_rank" in handlers.save_preset("p", "# test\nlora_rank: 0\n")
    assert "comment" in handlers.save_preset("p", "lora_rank: 4\n")
    assert "name" in handlers.save_preset("../evil", "# x\nlora_rank: 4\n")
    assert not list(tmp_path.iterdir())  # nothing written for bad input
    assert handlers.save_preset("mine", "# mine\nlora_rank: 4\n") == "Saved presets/mine.yaml"
    assert presets.load_config(tmp_path / "mine.yaml").lora_rank == 4
    assert handlers.read_preset("mine").startswith("# mine")


def test_compare_tab_shows_the_measured_table():
    table = handlers.benchmark_table()
    assert table.startswith("| mode") and "traditional" in table and "optimized" in table


def test_engine_never_imports_gradio():
    import subprocess
    import sys

    code = ("import sys, lora_gui.engine.text.train, lora_gui.engine.jobs, lora_gui.memory.run_plan, "
            "lora_gui.attention.hf, lora_gui.__main__; print('gradio' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.stdout.strip() == "False", res.stderr


def test_upload_checks_the_file_and_copies_it(tmp_path, monkeypatch):
    monkeypatch.setattr(handlers, "UPLOAD_DIR", tmp_path / "uploads")
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    assert "empty" in handlers.use_upload(str(empty))[1]
    assert "no file" in handlers.use_upload(None)[1]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"x": 1}\n', encoding="utf-8")
    assert "bad.jsonl:1" in handlers.use_upload(str(bad))[1]
    good = tmp_path / "good.txt"
    good.write_text("one\n\ntwo\n", encoding="utf-8")
    path, message = handlers.use_upload(str(good))
    assert message == "Uploaded good.txt: 2 documents" and (tmp_path / "uploads" / "good.txt").is_file()
    assert path == str(tmp_path / "uploads" / "good.txt")


def test_image_task_starts_the_image_engine_and_follows_presets(runs_root, monkeypatch):
    started = []
    monkeypatch.setattr(handlers.MANAGER, "start", lambda cfg, out, **kw: started.append(cfg) or
                        type("J", (), {"name": out.name, "out": out})())
    message = handlers.start_task("image", "image-768", "img", *form(), resolution=1024)
    assert "Started" in message and started[0].task == "image" and started[0].resolution == 1024
    bad = handlers.start_task("image", "image-512", "img", *form(), resolution=700)
    assert bad.startswith("Error:") and "700" in bad
    assert handlers.preset_task("image-1024") == ("image", 1024)
    assert handlers.task_preset("image", "text-demo") == "image-512"
    assert handlers.task_preset("image", "image-768") == "image-768"


def test_plan_tab_text_and_unet_configs_offline():
    fig, text, buckets, cards = handlers.plan("text-demo", "llama-3.1-8b", 2048, 24, "cuda", False)
    assert "source: predicted" in text and buckets[-1][0] == 2048 and len(cards) == 7
    assert [t.name for t in fig.data][0] == "frozen_weights"
    fig, text, buckets, cards = handlers.plan("text-demo", "sd15-unet", 1024, 24, "cuda", False, 768)
    assert "batch 1 at this resolution" in text and [row[0] for row in buckets][:2] == [512, 768]
    _, text, _, _ = handlers.plan("text-demo", "sd15-unet", 1024, 24, "cuda", False, 700)
    assert text.startswith("Error:") and "64" in text
    _, text, _, _ = handlers.plan("text-demo", "builtin", 1024, 0, "cuda", False)
    assert text.startswith("Error:") and "budget" in text


def test_predicted_peak_of_an_image_preset_is_the_unet_step():
    values = dict(zip(handlers.FORM_KEYS, handlers.form_defaults("image-512")))
    optimized = handlers.predict("image-512", *[values[k] for k in handlers.FORM_KEYS])
    values["mode"] = "traditional"
    traditional = handlers.predict("image-512", *[values[k] for k in handlers.FORM_KEYS])

    def mib(text):
        return float(text.split("**")[1].split()[0].replace(",", ""))

    assert "source: predicted" in optimized and mib(traditional) > 2 * mib(optimized)
