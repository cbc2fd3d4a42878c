"""The Train form's checks of the data and model a run would read (no browser): each bad input
gets one short message naming what is wrong, Start refuses it at once and writes nothing, a
run that fails after starting is listed as failed with its reason, and the status line keeps
its ETA while no step ends and shows the training time the Runs tab shows."""

from __future__ import annotations

import json
import threading

import pytest

from lora_gui.ui import common, forms, input_checks, run_status
from lora_gui.ui.tabs import runs_handlers
from lora_gui.ui.tabs import train_handlers as handle
from lora_gui.ui.tabs import train_prediction_handlers as predicted


@pytest.fixture()
def runs_root(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RUNS_ROOT", tmp_path / "runs")
    monkeypatch.setattr(common, "MANAGER", common.JobManager())
    monkeypatch.chdir(tmp_path)  # typed paths must lie inside the working directory
    return tmp_path / "runs"


def _form(**kw):
    values = handle.form_values("text-demo")
    values.update(kw)
    return values


@pytest.mark.parametrize("content, words", [
    (None, "does not exist"),
    (b"", "is empty"),
    (b"\n  \n", "is empty"),
    (b'{"text": "fine"}\n{"text": "also fine"}\n\x00\xff\xfe binary\n', "is not UTF-8 (line 3)"),
])
def test_bad_data_gets_one_message_beside_the_data_field(runs_root, content, words):
    path = runs_root.parent / "data.jsonl"
    if content is not None:
        path.write_bytes(content)
    cfg, errors = forms.validate(_form(data=str(path)))
    assert cfg is None and list(errors) == ["data"]
    assert words in errors["data"] and str(path) in errors["data"], errors
    assert "\n" not in errors["data"]


def test_a_folder_for_text_and_a_file_for_images_say_what_is_wanted(runs_root):
    folder = runs_root.parent / "pictures"
    folder.mkdir()
    assert "a folder" in input_checks.data_problem(str(folder), "text")
    assert input_checks.data_problem(str(folder), "image") == f"data: {folder} is empty"
    (folder / "a.png").write_bytes(b"x")
    assert input_checks.data_problem(str(folder), "image") is None
    assert "a file" in input_checks.data_problem(str(folder / "a.png"), "image")


def test_a_missing_model_path_is_marked_and_hub_ids_are_not_looked_up(runs_root):
    missing = runs_root.parent / "no-model"
    _, errors = forms.validate(_form(model=str(missing)))
    assert errors == {"model": f"model: {missing} does not exist"}
    assert input_checks.model_problem("org/some-model") is None  # a Hub id: no network here
    assert input_checks.model_problem("builtin") is None


def test_a_utf8_error_past_the_first_chunk_names_its_line(tmp_path, monkeypatch):
    monkeypatch.setattr(input_checks, "CHUNK", 7)  # characters split across reads stay whole
    path = tmp_path / "d.txt"
    path.write_bytes("é line\n".encode() * 5 + b"bad \xc3\n")
    assert input_checks._first_bad_line(path) == 6
    path.write_bytes("é line\n".encode() * 5)
    assert input_checks._first_bad_line(path) is None


def test_start_refuses_bad_data_at_once_and_writes_nothing(runs_root, monkeypatch):
    started = []
    monkeypatch.setattr(common.MANAGER, "start", lambda *a, **kw: started.append(a))
    bad = runs_root.parent / "bad.jsonl"
    bad.write_bytes(b"\x00\xff\xfe")
    text, errors, ask = handle.start("bad-run", 1, _form(data=str(bad)))
    assert not started and not ask and "not UTF-8 (line 1)" in errors["data"]
    assert "Error: error" not in text and not (runs_root / "bad-run").exists()


def test_a_run_that_fails_after_starting_is_listed_failed_with_its_reason(runs_root):
    from lora_gui.engine.jobs.launch import record_early_failure
    from lora_gui.presets import load_config

    folder = runs_root / "early"
    folder.mkdir(parents=True)  # what prepare_run_dir leaves before the run reads its data
    record_early_failure(folder, load_config("text-demo"), "data.jsonl:4: expected a 'text' field")
    row = {r[0]: r for r in runs_handlers.list_runs()}["early"]
    assert row[1] == "failed" and row[-1] == "data.jsonl:4: expected a 'text' field"
    summary = json.loads((folder / "run.json").read_text())
    record_early_failure(folder, load_config("text-demo"), "another")  # a run's own files stay
    assert json.loads((folder / "run.json").read_text()) == summary


class _Job:
    def __init__(self, status: str, phases: list, summary: dict | None = None) -> None:
        self.name, self.status, self.phase, self.total_steps = "r", status, "training", 10
        self.started, self.phases, self.summary = 0.0, phases, summary
        self.control = type("C", (), {"stop": threading.Event()})()

    @property
    def running(self) -> bool:
        return self.status in ("starting", "running")


def test_the_eta_stands_still_while_no_step_ends():
    job = _Job("running", [("training", 100.0)])
    records = [{"step": i, "seconds": 2.0, "time": 100.0 + 2 * i} for i in range(1, 6)]
    early = run_status.status_line(job, 5, now=111.0, records=records)
    late = run_status.status_line(job, 5, now=190.0, records=records)  # a long wait: no new step
    assert "ETA 10 s" in early and early == late


def test_an_ended_run_shows_the_training_time_the_runs_tab_shows():
    job = _Job("completed", [("training", 100.0), ("done", 517.0)], summary={"train_seconds": 359.4})
    line = run_status.status_line(job, 10, now=600.0, records=[{"step": 10, "seconds": 1.0}])
    assert "trained 359 s" in line and "ETA" not in line


def test_a_start_or_stop_message_is_cleared_once_the_run_ended(monkeypatch):
    monkeypatch.setattr(common, "MANAGER", common.JobManager())
    common.MANAGER.job = _Job("completed", [])
    assert run_status.stale_message("Resuming **r** → `runs/r`") == ""
    assert run_status.stale_message("stopping r") == ""
    assert run_status.stale_message("`runs/r` holds another run.") is None
    common.MANAGER.job = _Job("running", [])
    assert run_status.stale_message("Started **r** (text) → `runs/r`") is None


def test_the_launched_run_error_loses_the_cli_prefix():
    assert input_checks.one_line("error: error: data: x is empty\nTraceback") == "data: x is empty"


def test_one_task_at_a_time_in_the_form_and_the_image_estimate_is_no_verdict(runs_root):
    image = handle.form_values("image-768")
    text, _, _ = predicted.prediction_view(image, 1, exact=False)
    assert "fits" not in text.replace("whether a run fits", "") and " GB" not in text
    field = {f.name: f for f in forms.settings_fields()}
    assert "q_proj" not in forms.help_for(field["lora_targets"], "image")
    assert "documents" not in forms.help_for(field["eval_fraction"], "image")
    assert "max_seq_len" not in forms.help_for(field["mode"], "image")


def test_the_try_tab_shows_only_the_runs_task(tmp_path):
    from lora_gui.ui.tabs import try_handlers

    text_run, image_run = tmp_path / "t", tmp_path / "i"
    for folder, cfg in ((text_run, {"task": "text"}), (image_run, {"task": "image"})):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg))
    tokens, _, scale, base, start, tuned, base_pic, tuned_pic = try_handlers.task_panes(str(text_run))
    assert tokens and base and tuned and not (scale or start or base_pic or tuned_pic)
    tokens, _, scale, base, start, tuned, base_pic, tuned_pic = try_handlers.task_panes(str(image_run))
    assert scale and base_pic and tuned_pic and not (tokens or base or start or tuned)
