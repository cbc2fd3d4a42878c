"""The app's own files are not the users': reserved run names, uploads that never overwrite,
long inputs cut in messages, every number field's bad value named."""

from __future__ import annotations

import dataclasses
import math

import pytest

from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.engine.core.lock import RunDirError
from lora_gui.ui import common, forms
from lora_gui.ui.tabs import runs_handlers, train_handlers


@pytest.mark.parametrize("name", [".queue", ".launch", "uploads", "presets", "queue.json",
                                  "queue.json.bad", "Uploads", ".hidden", "trackio"])
def test_the_apps_own_folders_are_never_run_names(work, name):
    with pytest.raises(RunDirError):
        common.check_run_name(name)
    own = common.runs_root() / name
    own.mkdir()
    (own / "config.json").write_text("{}")  # even when it looks like a run
    assert runs_handlers.delete_run(name, True).startswith("Error: run name")
    assert own.is_dir()
    message, _, _ = train_handlers.start(name, 1, train_handlers.form_values("text-demo"))
    assert message.startswith("Error: run name") and common.MANAGER.job is None


def test_a_long_run_name_is_cut_in_the_message(work):
    name = "a" * 100_000
    message, _, _ = train_handlers.start(name, 1, train_handlers.form_values("text-demo"))
    assert message.startswith("Error: run name") and len(message) < 400 and "100,000 characters" in message
    for text in (runs_handlers.delete_run(name, True), runs_handlers.open_run(name)[0]):
        assert len(text) < 400


def test_a_long_value_is_cut_in_setting_messages():
    with pytest.raises(ConfigError) as err:
        apply_overrides(RunConfig(), {"mode": "x" * 100_000})
    assert len(str(err.value)) < 400


FLOATS = [f.name for f in dataclasses.fields(RunConfig) if forms.field_kind(f) is float]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_every_number_fields_bad_value_is_named(bad):
    assert FLOATS  # lr, budget_gb, eval_fraction, ...
    _, errors = forms.validate({name: bad for name in FLOATS})
    assert set(errors) == set(FLOATS)
    for name in FLOATS:
        assert errors[name].startswith(f"{name}:"), errors[name]
    ints = [f.name for f in dataclasses.fields(RunConfig) if forms.field_kind(f) is int]
    _, errors = forms.validate({name: bad for name in ints})
    assert set(errors) == set(ints)


def test_an_upload_never_replaces_an_earlier_one(work, tmp_path):
    first, second = tmp_path / "a" / "notes.txt", tmp_path / "b" / "notes.txt"
    for path, words in ((first, "first file words\n\nmore first words\n"),
                        (second, "second file words\n\nmore second words\n")):
        path.parent.mkdir()
        path.write_text(words)
    one, message = train_handlers.use_upload(str(first))
    assert one.endswith("uploads/notes.txt") and message.startswith("Uploaded notes.txt")
    two, message = train_handlers.use_upload(str(second))
    assert two != one and "saved as notes-2.txt" in message
    assert open(one).read() == first.read_text() and open(two).read() == second.read_text()
    again, message = train_handlers.use_upload(str(first))
    assert again == one and "uploaded before" in message


def test_long_sweep_and_queue_inputs_are_cut(work):
    from lora_gui.ui.tabs import queue_handlers

    long = "y" * 100_000
    for message in (queue_handlers.queue_sweep("text-demo", long, "1,2", "sw"),
                    queue_handlers.queue_sweep("text-demo", "lr", long, "sw"),
                    queue_handlers.queue_sweep("text-demo", "mode", f"{long},{long}", "sw"),
                    queue_handlers.move_to("id", long)):
        assert message.startswith("Error:") and len(message) < 2_000, message[:200]
