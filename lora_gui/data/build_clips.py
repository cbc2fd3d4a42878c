"""Builds the demo clips of the video demo: ``python -m lora_gui.data.build_clips``.

Each clip is a coloured square sliding over a gray background, 32 x 32 px, 9 frames (two latent
frames after the first for Wan's 4x temporal VAE), captioned with its colour and direction
("a red square moving right"): what a LoRA can learn from few clips in a few minutes on a CPU.
Written with PyAV as H.264 mp4 with same-name .txt captions (the folder convention of the video
trainers), into ``assets/video-clips`` (``data: builtin`` for ``task: video``). Seeded; the same
clips on every machine up to the encoder's rounding.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np

from lora_gui.config import BUILTIN_CLIPS
from lora_gui.data.videos import write_clip

SIDE, FRAMES, SQUARE = 32, 9, 10  # px, frames, px
COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (50, 70, 220), "yellow": (230, 210, 40)}
DIRECTIONS = {"right": (1, 0), "left": (-1, 0), "down": (0, 1), "up": (0, -1)}
CLIP_WORDS = ("a", "square", "moving", *COLOURS, *DIRECTIONS)  # every caption word (tokenizers)


def caption(colour: str, direction: str) -> str:
    return f"a {colour} square moving {direction}"


def render(colour: str, direction: str, start: tuple[int, int], speed: int = 2) -> np.ndarray:
    """(FRAMES, SIDE, SIDE, 3) uint8: the square at ``start`` (top-left px) moving ``speed`` px a
    frame in ``direction``, clamped to the picture."""
    frames = np.full((FRAMES, SIDE, SIDE, 3), 128, np.uint8)
    dx, dy = DIRECTIONS[direction]
    for i in range(FRAMES):
        x = min(max(start[0] + dx * speed * i, 0), SIDE - SQUARE)
        y = min(max(start[1] + dy * speed * i, 0), SIDE - SQUARE)
        frames[i, y:y + SQUARE, x:x + SQUARE] = COLOURS[colour]
    return frames


def build(out: Path = BUILTIN_CLIPS, per_pair: int = 2, seed: int = 0) -> list[Path]:
    """Writes ``per_pair`` clips of every colour and direction (32 by default) into ``out``."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for colour in COLOURS:
        for direction in DIRECTIONS:
            for k in range(per_pair):
                start = (rng.randrange(4, SIDE - SQUARE - 4), rng.randrange(4, SIDE - SQUARE - 4))
                dx, dy = DIRECTIONS[direction]  # start where the motion has room
                start = (4 if dx > 0 else SIDE - SQUARE - 4 if dx < 0 else start[0],
                         4 if dy > 0 else SIDE - SQUARE - 4 if dy < 0 else start[1])
                path = write_clip(out / f"{colour}-{direction}-{k}.mp4", render(colour, direction, start))
                path.with_suffix(".txt").write_text(caption(colour, direction) + "\n", encoding="utf-8")
                paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=BUILTIN_CLIPS)
    parser.add_argument("--per-pair", type=int, default=2)
    args = parser.parse_args()
    paths = build(args.out, args.per_pair)
    print(f"{len(paths)} clips in {args.out}")


if __name__ == "__main__":
    main()
