"""The video task on the Train tab (no browser): the task choice offers it, the clip settings show
for it alone, a bundled model of another task is swapped for a video one when the task changes
(and marked if typed back), a folder of clips or a .jsonl list passes the data check, and Start
starts a video run on the bundled LTX-Video model from the form's values."""

from __future__ import annotations

import gradio as gr
import pytest

from lora_gui.ui import common, forms, input_checks
from lora_gui.ui.tabs import train_handlers as handle

VIDEO_FIELDS = ("video_size", "video_frames", "clip_frames")


@pytest.fixture()
def form():
    with gr.Blocks():
        return forms.build_form(handle.form_values("text-demo"))


def test_the_task_choice_offers_video_and_shows_its_clip_settings_alone(form):
    assert ("video", "video") in form.widgets["task"].choices
    shown = {task: forms.visibility(form, task) for task in ("text", "image", "video")}
    for name in VIDEO_FIELDS:
        assert shown["video"][form.widgets[name]]["visible"] and shown["video"][form.boxes[name]]["visible"]
        assert shown["text"][form.widgets[name]]["visible"] is False
        assert shown["image"][form.widgets[name]]["visible"] is False
    assert shown["video"][form.widgets["max_seq_len"]]["visible"] is False  # a text setting
    for name in ("resolution", "cache_latents", "text_max_length", "export_kohya", "sample_images", "lr"):
        assert shown["video"][form.widgets[name]]["visible"]
    assert "builtin:ltx" in shown["video"][form.widgets["model"]]["info"]
    assert "clips" in shown["video"][form.widgets["data"]]["info"]
    assert shown["video"][form.widgets["image_batch"]]["visible"] is False  # pictures only
    assert shown["image"][form.widgets["cache_latents"]]["visible"]


@pytest.mark.parametrize("task, model, becomes", [
    ("video", "builtin", "builtin:video"), ("video", "builtin:drawing", "builtin:video"),
    ("video", "builtin:ltx", None), ("video", "/models/wan", None), ("video", "org/some-ltx", None),
    ("image", "builtin:ltx", "builtin"), ("text", "builtin:video", "builtin"), ("text", "builtin", None)])
def test_a_bundled_model_of_another_task_becomes_the_new_task_s(task, model, becomes):
    assert input_checks.model_for_task(task, model) == becomes


def test_a_video_form_with_an_image_model_marks_the_model_field():
    values = handle.form_values("text-demo")
    values.update(task="video", model="builtin:drawing")
    cfg, errors = forms.validate(values)
    assert cfg is None and set(errors) == {"model"}
    assert "builtin:drawing is not a video model" in errors["model"]
    assert "builtin:video or builtin:ltx" in errors["model"]


def test_a_folder_of_clips_or_a_jsonl_list_is_video_data(tmp_path):
    (tmp_path / "clips").mkdir()
    (tmp_path / "clips" / "a.mp4").write_bytes(b"\0")
    (tmp_path / "list.jsonl").write_text('{"path": "a.mp4", "caption": "a"}\n', encoding="utf-8")
    (tmp_path / "notes.txt").write_text("a\n", encoding="utf-8")
    assert input_checks.data_problem(str(tmp_path / "clips"), "video") is None
    assert input_checks.data_problem(str(tmp_path / "list.jsonl"), "video") is None
    refused = input_checks.data_problem(str(tmp_path / "notes.txt"), "video")
    assert "a video run reads a folder of clips" in refused
    (tmp_path / "empty").mkdir()
    assert input_checks.data_problem(str(tmp_path / "empty"), "video").endswith("is empty")


def test_start_starts_a_video_run_from_the_form(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RUNS_ROOT", tmp_path)
    monkeypatch.setattr(common, "MANAGER", common.JobManager())
    started = []
    monkeypatch.setattr(common.MANAGER, "start", lambda cfg, out, **kw: started.append((cfg, kw)) or
                        type("J", (), {"name": out.name, "out": out})())
    values = handle.form_values("text-demo")
    values.update(task="video", model="builtin:ltx", video_size="32x32", video_frames=9, clip_frames="spaced")
    message, errors, _ = handle.start("ltx-run", 1, values)
    assert "Started" in message and not errors, (message, errors)
    cfg = started[-1][0]
    assert (cfg.task, cfg.model, cfg.video_size, cfg.video_frames, cfg.clip_frames) == (
        "video", "builtin:ltx", "32x32", 9, "spaced")
    message, _, _ = handle.start("ltx-demo", 1, handle.form_values("ltx-demo"))  # the preset in the form
    assert "Started" in message and started[-1][0].model == "builtin:ltx" and started[-1][0].task == "video"
