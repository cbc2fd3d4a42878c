"""A video run with windowed space-time attention on the built-in tiny Wan pipeline: the run's own
prediction and `plan` against the tracked peak, and the window really in the step."""

from __future__ import annotations

import pytest

from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.engine import train
from lora_gui.memory.predict import predict
from tests.engine.test_video_run import HIGH, LOW, clips_folder, video_cfg  # noqa: F401 (fixture)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_windowed_video_run_predicted_within_band(clips_folder, tmp_path, checkpointing):  # noqa: F811
    cfg = video_cfg(clips_folder, video_window="1,1,1", gradient_checkpointing=checkpointing, max_steps=3)
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed" and summary["final_loss"] > 0
    report = summary["memory_report"]
    assert LOW <= report["predicted_vs_measured"] <= HIGH, report
    train_error = summary["prediction"]["train_peak_bytes"] / summary["train_peak_bytes"] - 1
    assert LOW <= train_error <= HIGH, (summary["prediction"], summary["train_peak_bytes"])
    planned = predict(cfg, None, "cpu")  # `plan`: the same function on the meta pipeline, the same bytes
    assert planned.peak_bytes == summary["prediction"]["peak_bytes"]
    assert planned.step.info["video_window"] == [1, 1, 1]


def test_the_window_changes_the_step_and_its_planned_memory(clips_folder):  # noqa: F811
    full = predict(video_cfg(clips_folder), None, "cpu")
    windowed = predict(video_cfg(clips_folder, video_window="1,1,1"), None, "cpu")
    assert full.step.info["video_window"] is None
    assert windowed.step.peak_bytes != full.step.peak_bytes  # the blocked kernel's tensors are traced


@pytest.mark.parametrize("value", ["1,2", "a,b,c", "-1,2,2", "0,0,0", "1.5,2,2"])
def test_a_bad_window_is_refused_naming_the_value(value):
    with pytest.raises(ConfigError, match="video_window") as err:
        apply_overrides(RunConfig(), {"task": "video", "video_window": value}).validate()
    assert value in str(err.value)
