"""A video run on the built-in tiny Wan pipeline: clips in two sizes and two frame buckets, the
run's own prediction against the tracked peak, the adapter read by WanPipeline."""

from __future__ import annotations

from pathlib import Path

import pytest
from diffusers import WanPipeline

from lora_gui.config import RunConfig, apply_overrides
from lora_gui.data import videos
from lora_gui.engine import train
from lora_gui.memory.predict import predict
from lora_gui.models.diffusion import resolve_pipeline_source
from tests.data.test_videos import clip

LOW, HIGH = -0.01, 0.03  # the prediction's band around the tracked peak


@pytest.fixture(scope="module")
def clips_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clips")
    shapes = [((48, 32), 5), ((48, 32), 9), ((32, 48), 9), ((32, 48), 6), ((48, 32), 9), ((32, 48), 12)]
    for i, (size, frames) in enumerate(shapes):
        direction = "left" if i % 2 else "right"
        clip(folder / f"c{i}.mp4", frames, size=size, caption=f"a red square moving {direction}")
    return folder


def video_cfg(data, **extra) -> RunConfig:
    return apply_overrides(RunConfig(), {
        "task": "video", "model": "builtin:video", "data": str(data), "resolution": "48x32",
        "video_frames": 9, "text_max_length": 8, "batch_size": 2, "max_steps": 4, "eval_fraction": 0.0,
        "sample_images": 0, "measure_every_step": True, **extra})


@pytest.mark.parametrize("cache, checkpointing", [("ram", False), ("off", False), ("ram", True)])
def test_video_run_two_sizes_two_frame_buckets_predicted_within_band(clips_folder, tmp_path, cache,
                                                                     checkpointing):
    samples = {"sample_images": 1, "sample_steps": 1} if not checkpointing and cache == "ram" else {}
    cfg = video_cfg(clips_folder, cache_latents=cache, gradient_checkpointing=checkpointing, **samples)
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed" and summary["task"] == "video"
    assert set(summary["buckets"]) == {"48x32x5", "48x32x9", "32x48x9", "32x48x5"}
    assert summary["final_loss"] > 0
    report = summary["memory_report"]
    assert report["predicted_source"] == "predicted"
    assert LOW <= report["predicted_vs_measured"] <= HIGH, report
    train_error = summary["prediction"]["train_peak_bytes"] / summary["train_peak_bytes"] - 1
    assert LOW <= train_error <= HIGH, (summary["prediction"], summary["train_peak_bytes"])
    assert (tmp_path / "run" / "adapter" / "pytorch_lora_weights.safetensors").is_file()
    if samples:  # `plan` before the run: the same function on the meta pipeline, the same bytes
        planned = predict(cfg, None, "cpu")
        assert planned.peak_bytes == summary["prediction"]["peak_bytes"]
        assert planned.train_peak_bytes == summary["prediction"]["train_peak_bytes"]
        [sample] = summary["samples"]  # an mp4 of the run's size and longest frame bucket
        assert videos.probe_clip(Path(sample)) == ((48, 32), 9)
        pipe = WanPipeline.from_pretrained(resolve_pipeline_source("builtin:video"))
        pipe.load_lora_weights(str(tmp_path / "run" / "adapter"))  # diffusers reads the adapter
        assert sum("lora" in name for name, _ in pipe.transformer.named_parameters()) == 4 * 2 * 4 * 2


@pytest.mark.slow  # two fake traces of a 30-block transformer: about 20 s
def test_plan_for_a_bundled_wan_shape_answers_fits_and_checkpointing_lowers_it():
    cfg = apply_overrides(RunConfig(), {"task": "video", "model": "wan2.1-t2v-1.3b", "resolution": "320x192",
                                        "video_frames": 9, "batch_size": 1})
    plain = predict(cfg, 24 * 10**9, "cuda")
    checkpointed = predict(apply_overrides(cfg, {"gradient_checkpointing": True}), 24 * 10**9, "cuda")
    assert plain.step.info["video_tokens"] == 3 * (192 // 16) * (320 // 16)
    assert plain.step.breakdown["frozen_weights"] > 2.5e9  # 1.42B parameters in bf16
    assert checkpointed.peak_bytes < plain.peak_bytes


def test_longest_clip_that_fits_is_the_last_frame_count_under_the_budget():
    from lora_gui.memory.predict.run import longest
    from lora_gui.memory.predict.video_run import plan_video_shape, shape_config

    cfg = apply_overrides(RunConfig(), {"task": "video", "model": "builtin:video", "resolution": "32x32",
                                        "text_max_length": 8, "batch_size": 1})
    config = shape_config(cfg)
    peak = {f: plan_video_shape(apply_overrides(cfg, {"video_frames": f}), config, None, "cpu").peak_bytes
            for f in (9, 13)}
    assert peak[9] < peak[13]
    result = longest(cfg, (peak[9] + peak[13]) // 2, "cpu")
    assert result["frames"] == 9 and result["peak_bytes_at_longest"] == peak[9]
    assert longest(cfg, 1000, "cpu")["frames"] == 0  # not even one frame


def test_a_wan_pipeline_of_a_shape_no_preset_has_is_predicted_within_band(clips_folder, tmp_path):
    from lora_gui.models.build_video import build_pipeline

    pipe = build_pipeline(seed=3, clips=None, num_layers=3, num_attention_heads=3, attention_head_dim=24,
                          ffn_dim=96)
    pipe.save_pretrained(tmp_path / "wan")
    cfg = video_cfg(clips_folder, model=str(tmp_path / "wan"), max_steps=3, lora_rank=8)
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed"
    assert LOW <= summary["memory_report"]["predicted_vs_measured"] <= HIGH, summary["memory_report"]
    train_error = summary["prediction"]["train_peak_bytes"] / summary["train_peak_bytes"] - 1
    assert LOW <= train_error <= HIGH, (summary["prediction"], summary["train_peak_bytes"])
