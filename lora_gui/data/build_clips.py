"""The clips of the video side: ``python -m lora_gui.data.build_clips`` writes the demo clips.

Every clip is a coloured square sliding over a gray background, 32 x 32 px, 9 frames (two latent
frames after the first for Wan's 4x temporal VAE), captioned with its colour and direction
("a red square moving right").

- Pretraining clips (:func:`clip_batch`, drawn in memory by :mod:`lora_gui.models.build_video`):
  the :data:`PRETRAIN_COLOURS` (red, green, blue, yellow) moving left, right, up or down, so the
  built-in video model draws a square of the named colour moving the named way.
- Demo clips (:func:`build`, ``assets/video-clips``, ``data: builtin`` for ``task: video``): a
  colour the built-in model never saw named, :data:`DEMO_COLOUR` ("pink"), in all four
  directions: what the ``video-demo`` LoRA teaches in a few minutes on a CPU. The word is in the
  tokenizer (its T5 embedding exists) but no pretraining caption has it.

Written with PyAV as H.264 mp4 with same-name .txt captions (the folder convention of the video
trainers). Seeded; the same clips on every machine up to the encoder's rounding.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np

from lora_gui.config import BUILTIN_CLIPS
from lora_gui.data.videos import write_clip

SIDE, FRAMES, SQUARE, SPEED = 32, 9, 10, 2  # px, frames, px, px a frame
BACKGROUND = (128, 128, 128)
PRETRAIN_COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (50, 70, 220),
                    "yellow": (230, 210, 40)}
DEMO_COLOUR = "pink"  # never in a pretraining caption; the demo LoRA teaches it
COLOURS = {**PRETRAIN_COLOURS, DEMO_COLOUR: (235, 90, 200)}
DIRECTIONS = {"right": (1, 0), "left": (-1, 0), "down": (0, 1), "up": (0, -1)}
CLIP_WORDS = ("a", "square", "moving", *COLOURS, *DIRECTIONS)  # every caption word (tokenizers)


def caption(colour: str, direction: str) -> str:
    return f"a {colour} square moving {direction}"


def render(colour: str, direction: str, start: tuple[int, int], speed: int = SPEED) -> np.ndarray:
    """(FRAMES, SIDE, SIDE, 3) uint8: the square at ``start`` (top-left px) moving ``speed`` px a
    frame in ``direction``, clamped to the picture."""
    frames = np.empty((FRAMES, SIDE, SIDE, 3), np.uint8)
    frames[:] = BACKGROUND
    dx, dy = DIRECTIONS[direction]
    for i in range(FRAMES):
        x = min(max(start[0] + dx * speed * i, 0), SIDE - SQUARE)
        y = min(max(start[1] + dy * speed * i, 0), SIDE - SQUARE)
        frames[i, y:y + SQUARE, x:x + SQUARE] = COLOURS[colour]
    return frames


def random_start(rng: random.Random, direction: str, jitter: int = 0) -> tuple[int, int]:
    """A top-left corner where the motion has room: 4 px from the edge it leaves (+- ``jitter``
    px), anywhere with a 4 px margin across the motion."""
    across = SIDE - SQUARE - 4
    start = [rng.randrange(4, across), rng.randrange(4, across)]
    dx, dy = DIRECTIONS[direction]
    for axis, d in ((0, dx), (1, dy)):
        if d:
            edge = 4 + rng.randint(-jitter, jitter)
            start[axis] = edge if d > 0 else SIDE - SQUARE - edge
    return start[0], start[1]


def clip_batch(count: int, seed: int, colours=tuple(PRETRAIN_COLOURS)) -> tuple[np.ndarray, list[str]]:
    """``count`` seeded pretraining clips, (count, FRAMES, SIDE, SIDE, 3) uint8, and their captions:
    every colour and direction in turn, starts drawn at random (2 px of jitter along the motion)."""
    rng = random.Random(seed)
    clips = np.empty((count, FRAMES, SIDE, SIDE, 3), np.uint8)
    captions = []
    pairs = [(c, d) for c in colours for d in DIRECTIONS]
    for i in range(count):
        colour, direction = pairs[i % len(pairs)]
        clips[i] = render(colour, direction, random_start(rng, direction, jitter=2))
        captions.append(caption(colour, direction))
    return clips, captions


def build(out: Path = BUILTIN_CLIPS, per_direction: int = 4, seed: int = 0) -> list[Path]:
    """Writes ``per_direction`` clips of the :data:`DEMO_COLOUR` square moving each way (16 by
    default) into ``out`` (its earlier clips removed first)."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("*.mp4"), *out.glob("*.txt")]:
        old.unlink()
    paths = []
    for direction in DIRECTIONS:
        for k in range(per_direction):
            frames = render(DEMO_COLOUR, direction, random_start(rng, direction))
            path = write_clip(out / f"{DEMO_COLOUR}-{direction}-{k}.mp4", frames)
            path.with_suffix(".txt").write_text(caption(DEMO_COLOUR, direction) + "\n", encoding="utf-8")
            paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=BUILTIN_CLIPS)
    parser.add_argument("--per-direction", type=int, default=4)
    args = parser.parse_args()
    paths = build(args.out, args.per_direction)
    print(f"{len(paths)} clips in {args.out}")


if __name__ == "__main__":
    main()
