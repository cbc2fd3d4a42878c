"""`plan --longest` for a video run answers both inverse questions: the longest clip at the run's
size and the largest size (the run's aspect ratio, on the model's grid) at its frames, each the
last probe whose traced step fits the budget."""

from __future__ import annotations

import json

import pytest

from lora_gui.__main__ import main
from lora_gui.config import RunConfig, apply_overrides
from lora_gui.data.videos import VideoDataError
from lora_gui.memory.predict.longest_video import largest_video_size, size_at
from lora_gui.memory.predict.video_run import plan_video_shape, shape_config


def tiny_wan(**extra) -> RunConfig:
    return apply_overrides(RunConfig(), {"task": "video", "model": "builtin:video", "resolution": "48x32",
                                         "video_frames": 9, "text_max_length": 8, "batch_size": 1, **extra})


def test_sizes_keep_the_aspect_ratio_on_the_grid():
    assert size_at(48, 32, 32, 16) == (48, 32)
    assert size_at(32, 48, 64, 16) == (64, 96)  # portrait stays portrait
    assert size_at(832, 480, 480, 16) == (832, 480)


def test_largest_size_at_the_runs_frames_is_the_last_size_under_the_budget():
    cfg = tiny_wan()
    config = shape_config(cfg)
    peak = {size: plan_video_shape(apply_overrides(cfg, {"resolution": size}), config, None, "cpu").peak_bytes
            for size in ("48x32", "64x40")}  # shorter side 32 and 40 px (8 px grid: 4x VAE, patch 2)
    assert peak["48x32"] < peak["64x40"]
    result = largest_video_size(cfg, (peak["48x32"] + peak["64x40"]) // 2, "cpu", config)
    assert result["size"] == "48x32" and result["peak_bytes_at_largest"] == peak["48x32"]
    assert result["frames"] == 9 and result["grid_px"] == 8
    nothing = largest_video_size(cfg, 1000, "cpu", config)  # the smallest probed: 16 px a side
    assert nothing["size"] is None and "not even 24x16 fits at 9 frames" in nothing["note"]
    with pytest.raises(VideoDataError, match="video_frames: 10 is not 4k\\+1"):
        largest_video_size(apply_overrides(cfg, {"video_frames": 10}), 10**9, "cpu", config)


def test_plan_longest_json_carries_both_answers(capsys):
    code = main(["plan", "--set", "task=video", "--set", "model=builtin:video", "--set", "resolution=48x32",
                 "--set", "video_frames=9", "--set", "text_max_length=8", "--set", "batch_size=1",
                 "--longest", "--json", "--device", "cpu", "--budget-gb", "0.008"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["frames"] >= 9 and out["size"] == "48x32"  # the longest clip at the run's size
    size = out["largest_size_at_frames"]
    assert size["frames"] == 9 and size["source"] == "predicted"
    width, height = (int(v) for v in size["size"].split("x"))
    assert width * 2 == height * 3 or abs(width / height - 1.5) < 0.2  # the run's 3:2, on the grid
    assert size["peak_bytes_at_largest"] <= 0.008e9 == size["budget_bytes"]
