"""What a clip of one flat square sliding over a plain background shows: a simple, documented
detector used to check the built-in video model's clips (its tests, the video demo's benchmark).

How it reads a clip ((frames, H, W, 3) uint8 RGB):

1. Background, per frame: the median colour of the 2-px frame around the picture.
2. Foreground: pixels whose colour is more than :data:`FOREGROUND_DISTANCE` (RGB units, 0-255
   per channel) away from the background. A frame shows a shape when they cover at least
   :data:`MIN_AREA` and at most :data:`MAX_AREA` of it (the demo's square is 10 x 10 px of
   32 x 32: 10%); its colour is the foreground's median colour named by the nearest (Euclidean
   RGB) of :data:`lora_gui.data.build_clips.COLOURS`, its position the foreground's centroid.
3. The clip: ``shape_frames`` (frames that show a shape), ``colour`` (the colour most of those
   frames name), and ``direction``: the centroid's path from the first to the last frame that
   shows a shape, named by its larger axis (right / left / down / up), or ``still`` when it moved
   less than :data:`MIN_MOTION` px (the demo's square moves 16 px in 9 frames).

Thresholds were set on the procedural clips themselves (tests/data/test_clip_detector.py): every
colour and direction of the drawn clips is read back.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from lora_gui.data.build_clips import COLOURS

FOREGROUND_DISTANCE = 60.0  # RGB distance from the background that counts as the shape
MIN_AREA = 0.02  # share of a frame below which it shows nothing (the square: 0.1)
MAX_AREA = 0.4  # above: not one shape (a frame of colour noise)
MIN_MOTION = 4.0  # px the centroid must travel to name a direction


@dataclass(frozen=True)
class ClipReading:
    """What the detector saw in a clip.

    Attributes:
        shape_frames: frames that show a shape (0 to the clip's length).
        frames: the clip's length.
        colour: the colour most shape frames name ('' when none shows one).
        direction: 'right', 'left', 'down', 'up', 'still' or '' (fewer than two shape frames).
        dx, dy: the centroid's path, px (x right, y down).
    """

    shape_frames: int
    frames: int
    colour: str
    direction: str
    dx: float
    dy: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _nearest(rgb: np.ndarray) -> str:
    names = list(COLOURS)
    palette = np.array([COLOURS[n] for n in names], dtype=np.float64)
    return names[int(np.argmin(((palette - rgb) ** 2).sum(1)))]


def read_frame(frame: np.ndarray) -> tuple[str, float, float] | None:
    """(colour, x, y) of the shape in one (H, W, 3) uint8 frame, or None when it shows none."""
    rgb = frame.astype(np.float64)
    border = np.concatenate([rgb[:2].reshape(-1, 3), rgb[-2:].reshape(-1, 3),
                             rgb[:, :2].reshape(-1, 3), rgb[:, -2:].reshape(-1, 3)])
    background = np.median(border, axis=0)
    mask = np.sqrt(((rgb - background) ** 2).sum(-1)) > FOREGROUND_DISTANCE
    share = mask.mean()
    if share < MIN_AREA or share > MAX_AREA:
        return None
    ys, xs = np.nonzero(mask)
    return _nearest(np.median(rgb[mask], axis=0)), float(xs.mean()), float(ys.mean())


def read_clip(clip: np.ndarray) -> ClipReading:
    """Reads a (frames, H, W, 3) uint8 clip (see the module docstring)."""
    seen = [r for r in (read_frame(f) for f in clip) if r is not None]
    if not seen:
        return ClipReading(0, len(clip), "", "", 0.0, 0.0)
    colour = Counter(r[0] for r in seen).most_common(1)[0][0]
    if len(seen) < 2:
        return ClipReading(1, len(clip), colour, "", 0.0, 0.0)
    dx, dy = seen[-1][1] - seen[0][1], seen[-1][2] - seen[0][2]
    if max(abs(dx), abs(dy)) < MIN_MOTION:
        direction = "still"
    elif abs(dx) >= abs(dy):
        direction = "right" if dx > 0 else "left"
    else:
        direction = "down" if dy > 0 else "up"
    return ClipReading(len(seen), len(clip), colour, direction, round(dx, 2), round(dy, 2))
