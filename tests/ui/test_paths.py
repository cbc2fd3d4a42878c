"""Paths typed in the page stay inside the folders the dashboard was started with."""

from __future__ import annotations

import pytest

from lora_gui.ui import common, forms, paths
from lora_gui.ui.tabs import plan_handlers, try_handlers


@pytest.fixture()
def limits(tmp_path, monkeypatch):
    """The dashboard started in tmp_path/work with its runs in tmp_path/work/runs."""
    work = tmp_path / "work"
    (work / "runs").mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.setattr(common, "RUNS_ROOT", work / "runs")
    paths.configure()
    yield work
    paths.configure()


def test_paths_inside_the_start_folders_pass_and_others_name_field_and_path(limits, tmp_path):
    (limits / "data.txt").write_text("hello\n")
    assert paths.check("data", "data.txt") == paths.Path("data.txt")
    assert paths.is_allowed(limits / "runs" / "a" / "b")
    assert paths.is_allowed(paths.PRESET_DIR / "text-demo.yaml")
    for outside in ("/etc/passwd", "../secret.txt", str(tmp_path / "elsewhere"), "~/x"):
        with pytest.raises(paths.PathNotAllowedError) as err:
            paths.check("data", outside)
        assert str(err.value).startswith(f"data: {outside} is outside") and "--allow-path" in str(err.value)


def test_a_link_out_of_the_folders_is_refused(limits, tmp_path):
    (tmp_path / "secret").mkdir()
    (limits / "link").symlink_to(tmp_path / "secret")
    assert not paths.is_allowed("link/file.txt")


def test_allow_path_and_allow_any_path(limits, tmp_path):
    extra = tmp_path / "datasets"
    extra.mkdir()
    assert not paths.is_allowed(extra / "a.txt")
    paths.configure([extra])
    assert paths.is_allowed(extra / "a.txt") and not paths.is_allowed("/etc/passwd")
    paths.configure(any_path=True)
    assert paths.is_allowed("/etc/passwd")


def test_the_train_form_marks_each_path_field_outside(limits, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("some text\n\nmore text\n")
    cfg, errors = forms.validate({"data": str(outside), "model": "/opt/models/x",
                                  "tracker_dir": "../tb"})
    assert cfg is None and set(errors) == {"data", "model", "tracker_dir"}
    assert errors["data"].startswith(f"data: {outside} is outside")
    inside = limits / "inside.txt"
    inside.write_text("some text\n\nmore text\n")
    cfg, errors = forms.validate({"data": str(inside), "model": "builtin", "tracker_dir": "tb"})
    assert errors == {} and cfg.data == str(inside)


def test_try_export_and_plan_refuse_folders_outside(limits, tmp_path):
    run = limits / "runs" / "r"
    run.mkdir()
    message = try_handlers.export(str(run), str(tmp_path / "out"), False)
    assert message.startswith("Error: export folder:") and not (tmp_path / "out").exists()
    *_, message = list(try_handlers.generate("/etc", "hi", 4, 0, 0, 1))[-1]
    assert message.startswith("Error: run: /etc is outside")
    _, text, _, _ = plan_handlers.plan("text-demo", "/opt/models/x", 64, 512, 2.0, "cpu", False)
    assert text.startswith("Error: model: /opt/models/x is outside")
    _, text, _, _ = plan_handlers.plan("video-demo", "/opt/models/wan", 0, 0, 2.0, "cpu", False,
                                       video_resolution="32x32", video_frames=9)
    assert text.startswith("Error: model: /opt/models/wan is outside"), text
