"""Every value that names a file or folder passes one gate, from every route: the Train form,
Start and Resume, the queue's Add and sweep, presets, Plan, Longest that fits, Try and export.
A refusal reads the same whether the outside path exists or not."""

from __future__ import annotations

import json

import pytest

from lora_gui.config import RunConfig
from lora_gui.engine.jobs.queue_file import Queue
from lora_gui.options import READS, WRITES, path_settings
from lora_gui.presets import PRESET_DIR
from lora_gui.ui import common, forms, paths
from lora_gui.ui.tabs import (
    longest_handlers,
    plan_handlers,
    presets_handlers,
    queue_handlers,
    runs_handlers,
    train_handlers,
    try_handlers,
)


def test_the_path_settings_are_declared_on_the_settings_and_each_is_checked(work):
    declared = path_settings(RunConfig)
    assert declared == {"model": READS, "data": READS, "init_adapter": READS, "tracker_dir": WRITES}
    for name in declared:  # the gate finds each one by its declaration: no list to forget
        assert set(paths.refusals({name: "/srv/elsewhere/x"})) == {name}


def test_every_free_text_setting_whose_help_names_a_file_or_folder_is_declared_a_path():
    """A new setting that takes a file or folder (its help says so) and forgets path=... fails here."""
    import dataclasses
    import re

    free_text = [f for f in dataclasses.fields(RunConfig)
                 if f.type in ("str", str) and not f.metadata.get("choices")]
    named = {f.name for f in free_text
             if re.search(r"\b(folder|file|directory|path)\b", f.metadata["help"], re.I)}
    assert named and named <= set(path_settings(RunConfig)), named - set(path_settings(RunConfig))


@pytest.mark.parametrize("key", ["data", "tracker_dir", "init_adapter"])
def test_a_sweep_over_a_path_setting_is_refused_and_queues_nothing(work, outside, key):
    values = f"{outside},{outside.parent / 'other.txt'}" if key == "data" else (
        f"{outside.parent},{outside.parent / 'tb'}" if key == "tracker_dir" else "/etc,/srv/x")
    message = queue_handlers.queue_sweep("text-demo", key, values, "sw")
    assert message.startswith(f"Error: {key}:") and "outside the folders" in message
    assert Queue(common.runs_root()).entries() == []


def test_add_to_queue_refuses_start_from_adapter_outside(work):
    values = {**train_handlers.form_values("text-demo"), "data": "data.txt", "init_adapter": "/etc"}
    message, errors = queue_handlers.add_from_form("q", 1, values)
    assert message.startswith("Error:") and set(errors) == {"init_adapter"}
    assert errors["init_adapter"].startswith("init_adapter: /etc is outside")
    assert Queue(common.runs_root()).entries() == []


def test_start_from_adapter_is_checked_on_the_train_form(work):
    values = {**train_handlers.form_values("text-demo"), "data": "data.txt",
              "init_adapter": "/srv/elsewhere"}
    message, errors, _ = train_handlers.start("r", 1, values)
    assert message.startswith("Error:") and set(errors) == {"init_adapter"}
    assert common.MANAGER.job is None


def test_refusals_read_the_same_for_existing_and_missing_outside_paths(work, outside):
    missing = outside.parent / "missing.txt"
    words = []
    for value in (outside, missing):
        with pytest.raises(paths.PathNotAllowedError) as err:
            paths.check("data", value)
        words.append(str(err.value).replace(str(value), "PATH"))
    assert words[0] == words[1]
    etc, nowhere = (longest_handlers.plan_tab("text-demo", m, 4.0, "cpu", False)
                    for m in ("/etc", "/nonexistent"))
    assert etc.startswith("Error: model: /etc is outside")
    assert etc.replace("/etc", "PATH") == nowhere.replace("/nonexistent", "PATH")


def test_resume_of_a_run_whose_settings_name_an_outside_file_starts_nothing(work, outside):
    run = common.runs_root() / "copied"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({**RunConfig().to_dict(), "data": str(outside)}))
    for message in (runs_handlers.resume_run("copied"),
                    train_handlers.start("copied", 1, {}, train_handlers.START_RESUME)[0]):
        assert message.startswith("Error: data:") and "outside the folders" in message
    assert common.MANAGER.job is None


def test_the_server_job_manager_gates_every_start(work, outside):
    cfg = RunConfig(data=str(outside))
    with pytest.raises(paths.PathNotAllowedError):
        common.MANAGER.start(cfg, common.runs_root() / "x")
    with pytest.raises(paths.PathNotAllowedError):
        common.MANAGER.start_work("c", common.runs_root() / "c", cfg, "compare", lambda job: {})
    assert common.MANAGER.job is None


def test_a_preset_naming_an_outside_file_is_refused_by_plan_and_longest(work, outside, tmp_path,
                                                                         monkeypatch):
    from lora_gui import presets

    shipped = tmp_path / "shipped"  # a preset file put there by hand; the real presets/ untouched
    shipped.mkdir()
    (shipped / "mine.yaml").write_text(f"# mine\ndata: {outside}\n")
    monkeypatch.setattr(presets, "PRESET_DIR", shipped)
    _, text, _, _ = plan_handlers.plan("mine", "builtin", 64, 512, 2.0, "cpu", False)
    assert text.startswith("Error: data:") and "outside the folders" in text
    assert longest_handlers.plan_tab("mine", "builtin", 4.0, "cpu", False).startswith("Error: data:")


def test_a_preset_is_named_never_a_path(work):
    for name in ("/etc/passwd", "../../etc/passwd", str(PRESET_DIR / "text-demo.yaml")):
        _, text, _, _ = plan_handlers.plan(name, "builtin", 64, 512, 2.0, "cpu", False)
        assert text.startswith("Error: preset") and "not found" in text
        with pytest.raises(common.USER_ERRORS):
            common.preset_file(name)


def test_folders_written_from_the_page_never_hold_the_apps_own_files(work):
    run = common.runs_root() / "r"
    run.mkdir()
    for target in (PRESET_DIR, PRESET_DIR.parent / "assets", common.runs_root() / ".queue",
                   common.runs_root() / "uploads"):
        message = try_handlers.export(str(run), str(target), False)
        assert message.startswith("Error: export folder:") and "app's own files" in message, target
    cfg, errors = forms.validate({"tracker_dir": str(PRESET_DIR)})
    assert cfg is None and set(errors) == {"tracker_dir"}


def test_bundled_presets_are_read_only_and_saves_go_to_the_users_folder(work, tmp_path, monkeypatch):
    from lora_gui import presets

    shipped = tmp_path / "shipped"  # a copy: the real presets/ is never written by a test
    shipped.mkdir()
    (shipped / "text-demo.yaml").write_text((PRESET_DIR / "text-demo.yaml").read_text())
    monkeypatch.setattr(presets, "PRESET_DIR", shipped)
    before = (shipped / "text-demo.yaml").read_text()
    message = presets_handlers.save_preset("text-demo", "# mine\nmax_steps: 3\n")
    assert message.startswith("Error: text-demo is a bundled preset")
    assert (shipped / "text-demo.yaml").read_text() == before
    assert presets_handlers.save_preset("mine", "# mine\nmax_steps: 3\n").startswith("Saved mine")
    assert (common.user_presets_dir() / "mine.yaml").is_file() and sorted(
        p.name for p in shipped.iterdir()) == ["text-demo.yaml"]
    assert presets_handlers.save_preset("out", f"# out\ndata: {tmp_path / 'elsewhere' / 'data.txt'}\n"
                                        ).startswith("Error: out.yaml: data:")


def test_what_held_paths_typed_in_the_form_outside_are_refused(work, outside):
    (work / "link").symlink_to(outside.parent)
    for value in ("/etc/passwd", "../elsewhere/data.txt", "~/x", "link/data.txt", str(outside)):
        cfg, errors = forms.validate({"data": value})
        assert cfg is None and errors["data"].startswith("data:") and "outside" in errors["data"]
    cfg, errors = forms.validate({"data": "data.txt", "tracker_dir": "tb"})
    assert errors == {}


def test_the_dashboards_queue_runner_refuses_an_entry_naming_an_outside_file(work, outside):
    """An entry whose settings name an outside file (queue.json edited, or queued from the command
    line) fails at start in the dashboard's runner with the gate's message; nothing starts."""
    from lora_gui.engine.jobs import queue_runner

    queue_runner.add(common.runs_root(), RunConfig(data="data.txt", max_steps=2), "late")
    with Queue(common.runs_root()).edit() as entries:
        entries[0].config["data"] = str(outside)
    runner = queue_runner.QueueRunner(common.MANAGER, common.runs_root())
    try:
        assert runner.tick() is None and common.MANAGER.job is None
    finally:
        runner.close()
    entry, = Queue(common.runs_root()).entries()
    assert entry.state == "failed" and entry.message.startswith("data:") and "outside" in entry.message


def test_try_and_export_refuse_a_run_whose_base_model_lies_outside(work, outside):
    run = common.runs_root() / "cli-run"  # e.g. trained from the command line on an outside model
    (run / "adapter").mkdir(parents=True)
    (run / "adapter" / "adapter_config.json").write_text("{}")
    (run / "config.json").write_text(json.dumps({**RunConfig().to_dict(), "model": str(outside.parent)}))
    *_, message = list(try_handlers.generate(str(run), "hi", 4, 0, 0, 1))[-1]
    assert message.startswith("Error: model:") and "outside the folders" in message
    message = try_handlers.export(str(run), str(common.runs_root() / "out"), True)
    assert message.startswith("Error: model:") and not (common.runs_root() / "out").exists()
