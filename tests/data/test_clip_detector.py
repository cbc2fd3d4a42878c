"""The clip detector reads the drawn clips back: every colour and direction, and nothing in a
plain or a noise clip."""

from __future__ import annotations

import random

import numpy as np
import pytest

from lora_gui.data.build_clips import BACKGROUND, COLOURS, DIRECTIONS, FRAMES, SIDE, random_start, render
from lora_gui.data.clip_detector import read_clip


@pytest.mark.parametrize("colour", list(COLOURS))
def test_every_colour_and_direction_is_read_back(colour):
    rng = random.Random(3)
    for direction in DIRECTIONS:
        for _ in range(3):
            reading = read_clip(render(colour, direction, random_start(rng, direction, jitter=2)))
            assert (reading.colour, reading.direction) == (colour, direction), reading
            assert reading.shape_frames == FRAMES


def test_a_still_square_is_still_and_an_empty_or_noise_clip_shows_nothing():
    still = render("red", "right", (10, 10), speed=0)
    assert read_clip(still).direction == "still"
    empty = np.empty((FRAMES, SIDE, SIDE, 3), np.uint8)
    empty[:] = BACKGROUND
    assert read_clip(empty).shape_frames == 0 and read_clip(empty).colour == ""
    noise = np.random.default_rng(0).integers(0, 256, (FRAMES, SIDE, SIDE, 3), dtype=np.uint8)
    assert read_clip(noise).shape_frames == 0
