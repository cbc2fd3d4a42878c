"""The built-in LTX-Video pipeline (model: builtin:ltx, assets/ltx-model) and the ltx-demo preset:
the bundled folder is an LTXPipeline under 1 MB with LTX-Video's 8k+1 frames, the builder makes it
again, and the preset's run (cut to a few steps) is planned within -1%...+3% of its tracked peak."""

from __future__ import annotations

from pathlib import Path

import pytest

from lora_gui.engine import train
from lora_gui.models.diffusion import BUILTIN_LTX_DIR, pipeline_kind, resolve_pipeline_source
from lora_gui.presets import load_config

LOW, HIGH = -0.01, 0.03  # the prediction's band around the tracked peak


def test_builtin_ltx_is_a_small_ltx_pipeline_of_8k_plus_1_frames():
    from lora_gui.models.video import source_geometry

    source = resolve_pipeline_source("builtin:ltx")
    assert Path(source) == BUILTIN_LTX_DIR and pipeline_kind(source) == "ltx"
    size = sum(p.stat().st_size for p in BUILTIN_LTX_DIR.rglob("*") if p.is_file())
    assert size < 1_000_000, size  # bytes
    geometry = source_geometry(source, "ltx")
    assert geometry.temporal == 8 and 32 % (geometry.spatial * geometry.patch) == 0


def test_the_builder_writes_a_pipeline_ltx_reads(tmp_path):
    from diffusers import LTXPipeline

    from lora_gui.models.build_ltx import build

    folder = build(tmp_path / "ltx", seed=3, clips=None)  # no clips: latent mean 0, std 1
    pipe = LTXPipeline.from_pretrained(str(folder))
    assert pipe.vae.latents_std.tolist() == [1.0] * 4
    assert pipe.tokenizer("a red square moving right").input_ids[:6] != [2] * 6  # words, not <unk>
    assert (folder / "BUILD.md").is_file() and (folder / "build.json").is_file()


@pytest.mark.parametrize("checkpointing", [False, True])
def test_ltx_demo_preset_is_planned_within_band(tmp_path, checkpointing):
    cfg = load_config("ltx-demo", {"max_steps": 3, "sample_images": 0, "measure_every_step": True,
                                   "gradient_checkpointing": checkpointing})
    assert cfg.model == "builtin:ltx" and cfg.video_frames == 9 and cfg.video_size == "32x32"
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed" and summary["task"] == "video"
    assert set(summary["buckets"]) == {"32x32x9"}
    report = summary["memory_report"]
    assert report["predicted_source"] == "predicted"
    assert LOW <= report["predicted_vs_measured"] <= HIGH, report


@pytest.mark.parametrize("task, model, words", [
    ("video", "builtin", "builtin is a StableDiffusionPipeline; a video run trains a WanPipeline"),
    ("image", "builtin:ltx", "builtin:ltx is a LTXPipeline; set task to video")])
def test_a_pipeline_of_another_task_is_refused_by_name_before_weights_are_read(task, model, words):
    import torch

    from lora_gui.config import RunConfig, apply_overrides
    from lora_gui.models.diffusion import image_model_for_run
    from lora_gui.models.text import ModelError

    cfg = apply_overrides(RunConfig(), {"task": task, "model": model})
    with pytest.raises(ModelError, match=words):
        image_model_for_run(cfg, torch.float32, weights=False)
