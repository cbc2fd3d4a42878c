"""The Runs tab: run folders listed with status and peak source, charts, overlay, delete, resume."""

import json

import pytest

from lora_gui.config import RunConfig
from lora_gui.engine.core.lock import acquire_run_folder, release_run_folder
from lora_gui.ui import common
from lora_gui.ui.tabs import runs_handlers as handle


def make_run(root, name, *, task="text", loss=2.0, peak=100 * 2**20, status="completed", steps=5):
    folder = root / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(RunConfig(task=task).to_dict()))
    records = [{"step": i + 1, "loss": loss - 0.1 * i, "peak_bytes": peak + i, "memory_source": "tracker",
                "tokens_per_s": 1000.0 + i, "real_tokens": 90, "padded_tokens": 100} for i in range(steps)]
    if task == "image":  # image runs record images/s instead
        records = [{**{k: v for k, v in r.items() if "tokens" not in k}, "images_per_s": 2.0 + i}
                   for i, r in enumerate(records)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if status:
        (folder / "run.json").write_text(json.dumps({
            "status": status, "peak_bytes": peak + steps - 1, "memory_source": "tracker",
            "eval_loss": loss - 0.5, "train_seconds": 12.3, "budget_bytes": None,
            "predicted_peak_bytes": peak}))
    return folder


@pytest.fixture()
def root(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RUNS_ROOT", tmp_path)
    monkeypatch.setattr(common, "MANAGER", common.JobManager())
    return tmp_path


def test_list_runs_shows_status_task_peak_and_source(root):
    make_run(root, "a")
    make_run(root, "b", task="image", status=None)
    (root / "not-a-run").mkdir()
    rows = {r[0]: r for r in handle.list_runs()}
    assert set(rows) == {"a", "b"}
    assert rows["a"][1:6] == ["completed", "text", "optimized", 0.105, "tracker"]  # GB
    assert rows["a"][6] == 1.5 and rows["a"][7] == 12
    assert rows["b"][1] == "failed" and rows["b"][2] == "image"  # no summary, no writer: killed


def test_a_run_killed_from_outside_reads_failed_with_where_to_resume_and_a_live_writer_running(root):
    make_run(root, "killed", status=None, steps=3)
    message = handle.open_run("killed", 0)[0]
    assert "failed" in message and "after step 3" in message and "--resume" in message, message
    live = make_run(root, "live", status=None)
    acquire_run_folder(live)  # a writer that is still alive (a CLI run, say)
    try:
        assert {r[0]: r[1] for r in handle.list_runs()}["live"] == "running"
    finally:
        release_run_folder(live)


def test_open_run_draws_its_charts(root):
    make_run(root, "a", steps=7)
    message, memory, loss, speed, _ = handle.open_run("a", 0.5)
    assert "7 steps" in message and len(memory.data[0].x) == 7
    assert [t.name for t in loss.data] == ["train loss", "EMA 0.5"]
    assert handle.open_run("../etc", 0)[0].startswith("Error:")
    assert "not a run folder" in handle.open_run("nothing", 0)[0]
    assert "trackers" not in message


def test_open_run_says_where_the_tracker_data_is_and_how_to_open_it(root):
    folder = make_run(root, "tracked")
    (folder / "trackers.json").write_text(json.dumps({
        "tensorboard": {"dir": str(folder / "tensorboard")},
        "trackio": {"dir": str(folder / "trackio"), "project": "lora_gui", "name": "tracked"}}))
    message = handle.open_run("tracked", 0)[0]
    assert f"tensorboard --logdir {folder / 'tensorboard'}" in message
    assert f"TRACKIO_DIR={folder / 'trackio'} trackio show --project lora_gui" in message


def test_overlay_takes_two_to_four_runs(root):
    for name in "abcde":
        make_run(root, name, loss=2.0 + ord(name) / 100)
    assert handle.overlay(["a"])[0].startswith("Error: pick 2 to 4")
    assert handle.overlay(list("abcde"))[0].startswith("Error: pick 2 to 4")
    message, memory, loss, speed = handle.overlay(["a", "b", "c"], 0.0)
    assert [t.name for t in memory.data] == ["a", "b", "c"] and len(loss.data) == 3
    assert "tracker" in memory.layout.yaxis.title.text and speed.layout.title.text == "Throughput"


def test_overlay_keeps_every_runs_throughput_each_in_its_unit(root):
    make_run(root, "text1")
    make_run(root, "pic", task="image", steps=4)
    make_run(root, "text2", steps=3)
    message, _, _, speed = handle.overlay(["text1", "pic", "text2"], 0.0)
    lines = {t.name: t for t in speed.data}
    assert set(lines) == {"text1 (tokens/s)", "pic (images/s)", "text2 (tokens/s)"}
    assert list(lines["pic (images/s)"].y) == [2.0, 3.0, 4.0, 5.0] and lines["pic (images/s)"].yaxis == "y2"
    assert list(lines["text2 (tokens/s)"].y) == [1000.0, 1001.0, 1002.0]
    assert lines["text1 (tokens/s)"].yaxis == "y"
    assert speed.layout.yaxis.title.text.startswith("tokens/s")
    assert speed.layout.yaxis2.title.text.startswith("images/s") and speed.layout.yaxis2.side == "right"
    assert "right" in message and "different units" in message
    (root / "text2" / "metrics.jsonl").write_text("")  # a run that has not logged a step yet
    message, _, _, speed = handle.overlay(["text1", "text2"], 0.0)
    assert [t.name for t in speed.data] == ["text1 (tokens/s)"] and "text2" in message.split("\n")[-1]


def test_delete_asks_first_then_removes_the_folder(root):
    folder = make_run(root, "a")
    assert "Confirm" in handle.delete_run("a", False) and folder.is_dir()
    assert handle.delete_run("a", True).startswith("Deleted") and not folder.exists()
    assert handle.delete_run("a", True).startswith("Error:")


def test_resume_needs_a_run_with_a_checkpoint_folder(root):
    assert handle.resume_run("missing").startswith("Error:")
