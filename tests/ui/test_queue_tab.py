"""The queue on the dashboard: Add to queue takes the Train form through Start's checks, the
Runs tab's table, reorder, cancel, sweep and the sweep's overlay (handlers, no browser)."""

import pytest

import lora_gui.memory.predict as predict_pkg
from lora_gui.engine.jobs.queue_file import Queue
from lora_gui.memory.predict import Prediction
from lora_gui.ui import common
from lora_gui.ui.tabs import queue_handlers as handle
from lora_gui.ui.tabs.train_handlers import form_values

from .test_runs import make_run


@pytest.fixture()
def root(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RUNS_ROOT", tmp_path)
    monkeypatch.setattr(common, "MANAGER", common.JobManager())
    fake = Prediction(peak_bytes=2**20, device="cpu", how="plan")  # the plan answers at once
    monkeypatch.setattr(predict_pkg, "predict", lambda cfg, **_: fake)
    return tmp_path


def form(small_corpus, **extra) -> dict:
    return {**form_values("text-demo"), "data": str(small_corpus), "max_steps": 2, **extra}


def test_add_to_queue_uses_the_forms_checks_and_messages(root, small_corpus):
    text, errors = handle.add_from_form("a", 1, form(small_corpus, lr=-1.0))
    assert text == "Error: fix the settings marked below." and "lr" in errors
    text, errors = handle.add_from_form("../a", 1, form(small_corpus))
    assert text.startswith("Error: run name '../a'") and errors == {}
    text, errors = handle.add_from_form("a", 1, form(small_corpus))
    assert text.startswith("Queued **a** at position 1") and errors == {}
    text, _ = handle.add_from_form("a", 1, form(small_corpus))
    assert text == "Error: run name 'a' is queued already; pick another run name"
    rows, line = handle.queue_rows()
    assert [r[2:4] for r in rows] == [["a", "queued"]] and line == ""


def test_reorder_and_cancel_from_the_runs_tab(root, small_corpus):
    for name in "abc":
        handle.add_from_form(name, 1, form(small_corpus))
    ids = {r[2]: r[1] for r in handle.queue_rows()[0]}
    assert handle.move_by(None, 1) == "Error: pick a queued run first"
    assert handle.move_by(ids["c"], -1).startswith("moved c")
    assert handle.move_to(ids["a"], 3).startswith("moved a")
    assert handle.move_to(ids["a"], "x") == "Error: position 'x' is not a whole number"
    assert [r[2] for r in handle.queue_rows()[0]] == ["c", "b", "a"]
    assert handle.cancel(ids["b"]).startswith("cancelled b")
    assert [label for label, _ in handle.entry_choices()] == [f"c (queued, {ids['c']})",
                                                              f"a (queued, {ids['a']})"]


def test_a_sweep_from_the_runs_tab_and_its_overlay_once_done(root, small_corpus, monkeypatch):
    assert handle.queue_sweep("text-demo", "lr", "1e-3", "s").startswith("Error: sweep lr: give two")
    monkeypatch.setattr(handle.train_handlers, "form_values", lambda preset: form(small_corpus))
    text = handle.queue_sweep("text-demo", "lr", "1e-3, 2e-3", "s")
    assert text.startswith("Queued a sweep of **lr**") and text.endswith("s-lr-0.001, s-lr-0.002")
    (label, sweep), = handle.sweep_choices()
    assert label.startswith("s-lr (0/2 done")
    assert handle.overlay_sweep(sweep)[0] == "Error: 0 of the sweep's 2 runs finished; the overlay needs two"
    with Queue(root).edit() as entries:  # both ran (their folders hold finished runs)
        for entry in entries:
            entry.state = "done"
            (root / entry.name / "queued.json").unlink()
            (root / entry.name).rmdir()
            make_run(root, entry.name)
    message, memory, loss, speed = handle.overlay_sweep(sweep, 0.0)
    assert message == "Overlay of s-lr-0.001, s-lr-0.002"
    assert [len(f.data) for f in (memory, loss, speed)] == [2, 2, 2]
