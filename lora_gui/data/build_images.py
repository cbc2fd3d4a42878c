"""Builds the bundled demo image set: ``python -m lora_gui.data.build_images``.

40 procedural pictures (a coloured shape on a plain background) in five aspect ratios of about
one megapixel each (1024x1024, 1216x832, 832x1216, 1344x768, 768x1344), each with a same-name
.txt caption that says what is drawn ("a red circle on a white background"). Flat colours keep
the PNGs a few kB each. Deterministic: the same files on every machine.
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
from pathlib import Path

from PIL import Image, ImageDraw

from lora_gui.config import ASSETS

DEMO_DIR = ASSETS / "images"
SIZES = ((1024, 1024), (1216, 832), (832, 1216), (1344, 768), (768, 1344))  # (width, height)
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 70), "blue": (40, 80, 220),
           "yellow": (240, 210, 40), "purple": (140, 60, 180), "orange": (245, 140, 30)}
BACKGROUNDS = {"white": (245, 245, 245), "black": (15, 15, 15), "gray": (128, 128, 128)}
SHAPES = ("circle", "square", "triangle", "ring", "star")
COUNT = 40
CAPTION_WORDS = ("a", "an", "on", "background", "small", "large", "picture", "of", "wide", "tall",
                 *COLOURS, *BACKGROUNDS, *SHAPES)


def _star(cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    return [(cx + (r if i % 2 == 0 else r / 2.5) * math.sin(i * math.pi / 5),
             cy - (r if i % 2 == 0 else r / 2.5) * math.cos(i * math.pi / 5)) for i in range(10)]


def draw(shape: str, colour: str, background: str, size: tuple[int, int], scale: float,
         rng: random.Random, centre: tuple[float, float] | None = None) -> Image.Image:
    """One picture: ``shape`` in ``colour`` on ``background``, radius ``scale`` x the short side,
    at ``centre`` (px) or at a random place where it fits."""
    w, h = size
    img = Image.new("RGB", size, BACKGROUNDS[background])
    pen = ImageDraw.Draw(img)
    r = scale * min(w, h)
    cx, cy = centre or (rng.uniform(r, w - r), rng.uniform(r, h - r))
    fill = COLOURS[colour]
    box = (cx - r, cy - r, cx + r, cy + r)
    if shape == "circle":
        pen.ellipse(box, fill=fill)
    elif shape == "square":
        pen.rectangle(box, fill=fill)
    elif shape == "triangle":
        pen.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=fill)
    elif shape == "ring":
        pen.ellipse(box, outline=fill, width=max(4, int(r / 3)))
    else:
        pen.polygon(_star(cx, cy, r), fill=fill)
    return img


def build(out: Path = DEMO_DIR, count: int = COUNT, seed: int = 0) -> list[Path]:
    """Writes ``count`` PNG + .txt pairs into ``out`` (replacing it); returns the PNG paths."""
    rng = random.Random(seed)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    paths = []
    for i in range(count):
        shape, colour = SHAPES[i % len(SHAPES)], list(COLOURS)[(i // len(SHAPES)) % len(COLOURS)]
        background = list(BACKGROUNDS)[i % len(BACKGROUNDS)]
        if colour == "yellow" and background == "white" or colour == "purple" and background == "black":
            background = "gray"  # keep the shape visible
        size = SIZES[i % len(SIZES)]
        large = i % 2 == 0
        img = draw(shape, colour, background, size, 0.35 if large else 0.18, rng)
        form = "wide " if size[0] > size[1] else "tall " if size[1] > size[0] else ""
        caption = (f"a {form}picture of a {'large' if large else 'small'} {colour} {shape} "
                   f"on a {background} background")
        path = out / f"{i:03d}-{colour}-{shape}.png"
        img.save(path, optimize=True)
        path.with_suffix(".txt").write_text(caption + "\n", encoding="utf-8")
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEMO_DIR)
    args = parser.parse_args()
    paths = build(args.out)
    total = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"{len(paths)} images, {total / 1024:.0f} KiB in {args.out}")


if __name__ == "__main__":
    main()
