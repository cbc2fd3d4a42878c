"""Small procedural pictures for the built-in drawing pipeline: one flat-coloured shape on a
plain background, near the centre, with a caption that says what is drawn ("a red circle on a
white background").

The drawing pipeline (:mod:`lora_gui.models.build_drawing`) is pretrained on the
:data:`PRETRAIN_SHAPES` only; :data:`NEW_SHAPE` (the star) is kept out of pretraining so that the
image demo has a concept to teach with a LoRA (``python -m lora_gui.data.drawings`` writes that
demo folder). Shapes are drawn by :func:`lora_gui.data.build_images.draw` at 4x the size and
box-filtered down, so edges are anti-aliased. Deterministic for a given seed.
"""

from __future__ import annotations

import argparse
import random
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

from lora_gui.config import ASSETS
from lora_gui.data.build_images import BACKGROUNDS, COLOURS, draw

PRETRAIN_SHAPES = ("circle", "square", "triangle")
NEW_SHAPE = "star"  # kept out of pretraining: the LoRA demo teaches it
SIZE_WORDS = {"small": 0.2, "large": 0.34}  # radius as a share of the picture side
PIXELS = 64  # the drawing pipeline's native resolution (px per side)
# shapes sit near the centre (share of the picture side): an early, shorter pretraining with
# shapes placed anywhere drew scattered patches instead of one coherent shape
JITTER = 0.05
STAR_DIR = ASSETS / "drawing-stars"
STAR_COUNT = 24
# combinations whose shape hardly shows against the background
LOW_CONTRAST = {("yellow", "white"), ("purple", "black")}


def combos(shapes: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """Every visible (shape, colour, background) combination of ``shapes``."""
    return [(s, c, b) for s in shapes for c in COLOURS for b in BACKGROUNDS if (c, b) not in LOW_CONTRAST]


def caption(shape: str, colour: str, background: str, size_word: str | None = None) -> str:
    """'a red circle on a white background' (with 'small ' / 'large ' before the colour if given)."""
    size = f"{size_word} " if size_word else ""
    return f"a {size}{colour} {shape} on a {background} background"


def picture(shape: str, colour: str, background: str, size_word: str, rng: random.Random,
            pixels: int = PIXELS) -> Image.Image:
    """One ``pixels`` x ``pixels`` picture, the shape near the centre (up to :data:`JITTER` of
    the side off it; drawn at 4x, box-filtered)."""
    side = pixels * 4
    centre = tuple(side / 2 + rng.uniform(-JITTER, JITTER) * side for _ in range(2))
    big = draw(shape, colour, background, (side, side), SIZE_WORDS[size_word], rng, centre)
    return big.resize((pixels, pixels), Image.Resampling.BOX)


def random_drawing(rng: random.Random, shapes: tuple[str, ...] = PRETRAIN_SHAPES,
                   pixels: int = PIXELS) -> tuple[Image.Image, str]:
    """A random picture of one of ``shapes`` and its caption; half the captions name the size."""
    shape, colour, background = rng.choice(combos(shapes))
    size_word = rng.choice(tuple(SIZE_WORDS))
    image = picture(shape, colour, background, size_word, rng, pixels)
    return image, caption(shape, colour, background, size_word if rng.random() < 0.5 else None)


def drawing_batch(count: int, seed: int, shapes: tuple[str, ...] = PRETRAIN_SHAPES,
                  pixels: int = PIXELS) -> tuple[np.ndarray, list[str]]:
    """``count`` pictures as a uint8 array (count, pixels, pixels, 3) and their captions."""
    rng = random.Random(seed)
    images, captions = [], []
    for _ in range(count):
        image, text = random_drawing(rng, shapes, pixels)
        images.append(np.asarray(image, dtype=np.uint8))
        captions.append(text)
    return np.stack(images), captions


def write_folder(out: Path = STAR_DIR, shape: str = NEW_SHAPE, count: int = STAR_COUNT,
                 seed: int = 1) -> list[Path]:
    """Writes ``count`` PNG + .txt caption pairs of ``shape`` into ``out`` (replacing it)."""
    rng = random.Random(seed)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    choices = combos((shape,))
    paths = []
    for i in range(count):
        _, colour, background = choices[i % len(choices)]
        size_word = tuple(SIZE_WORDS)[i % 2]
        path = out / f"{i:03d}-{colour}-{shape}.png"
        picture(shape, colour, background, size_word, rng).save(path, optimize=True)
        path.with_suffix(".txt").write_text(caption(shape, colour, background, size_word) + "\n",
                                            encoding="utf-8")
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description="Writes the star pictures of the image demo.")
    parser.add_argument("--out", type=Path, default=STAR_DIR)
    args = parser.parse_args()
    paths = write_folder(args.out)
    total = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"{len(paths)} pictures, {total / 1024:.0f} KiB in {args.out}")


if __name__ == "__main__":
    main()
