"""The built-in video model (assets/video-model, pretrained by lora_gui.models.build_video) draws:
prompted with a pretraining caption, its clips show a square the detector reads, not noise."""

from __future__ import annotations

import pytest
from diffusers import WanPipeline

from lora_gui.data.clip_detector import read_clip
from lora_gui.models.build_video import draw_clips
from lora_gui.models.diffusion import resolve_pipeline_source

PROMPTS = ["a red square moving right", "a blue square moving down", "a yellow square moving left",
           "a green square moving up"]


@pytest.fixture(scope="module")
def base_clips():
    pipe = WanPipeline.from_pretrained(resolve_pipeline_source("builtin:video"))
    return draw_clips(pipe, PROMPTS, steps=10)


def test_base_clips_show_a_square_in_most_frames(base_clips):
    readings = [read_clip(c) for c in base_clips]
    assert sum(r.shape_frames >= 7 for r in readings) >= 3, readings


def test_base_clips_mostly_have_the_prompted_colour(base_clips):
    readings = [read_clip(c) for c in base_clips]
    assert sum(r.colour == p.split()[1] for r, p in zip(readings, PROMPTS, strict=True)) >= 3, readings
