"""The drawing detector reads the procedural pictures it was documented against."""

import random

import numpy as np
import pytest
from PIL import Image

from lora_gui.data.drawing_detector import detect, hull_area
from lora_gui.data.drawings import PRETRAIN_SHAPES, SIZE_WORDS, caption, combos, drawing_batch, picture


@pytest.mark.parametrize("shape", [*PRETRAIN_SHAPES, "star"])
def test_every_drawn_shape_colour_and_background_is_read(shape):
    rng = random.Random(7)
    for i, (_, colour, background) in enumerate(combos((shape,))):
        size = tuple(SIZE_WORDS)[i % 2]
        seen = detect(picture(shape, colour, background, size, rng))
        assert (seen.shape, seen.colour, seen.background) == (shape, colour, background), seen


def test_a_plain_picture_or_a_speck_shows_nothing():
    plain = Image.new("RGB", (64, 64), (245, 245, 245))
    assert detect(plain).shape == "none" and detect(plain).background == "white"
    speck = np.full((64, 64, 3), 15, dtype=np.uint8)
    speck[30:33, 30:33] = (220, 40, 40)  # 9 px: under 1% of the picture
    assert detect(speck).shape == "none" and detect(speck).background == "black"


def test_hull_area_of_a_square_and_a_triangle():
    assert hull_area(np.array([[0, 0], [4, 0], [4, 4], [0, 4], [2, 2]])) == 16.0
    assert hull_area(np.array([[0, 0], [4, 0], [0, 4]])) == 8.0


def test_pretraining_pictures_never_show_the_new_shape():
    images, captions = drawing_batch(40, seed=3)
    assert images.shape == (40, 64, 64, 3)
    assert not any("star" in c for c in captions)
    assert caption("circle", "red", "white") == "a red circle on a white background"


def test_a_ragged_patch_is_unclear_not_a_star():
    cross = np.full((64, 64, 3), 245, dtype=np.uint8)
    cross[26:38, 10:54] = cross[10:54, 26:38] = (220, 40, 40)  # a plus sign: concave, four arms
    seen = detect(cross)
    assert seen.shape == "unclear" and seen.solidity < 0.75 and seen.fivefold < 0, seen
