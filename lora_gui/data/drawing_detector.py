"""What a picture of one flat shape on a plain background shows: a simple, documented detector
used to check the drawing pipeline's pictures (its tests, the image demo's benchmark).

How it reads a picture (any size, RGB):

1. Background: the median colour of the 2-px frame around the picture.
2. Foreground: pixels whose colour is more than :data:`FOREGROUND_DISTANCE` (RGB units, 0-255
   per channel) away from the background; the largest 4-connected patch of them is the shape.
3. Shape, from three statistics of that patch:

   - ``fivefold``: the 5th harmonic of the patch's radial profile (farthest pixel from the
     centroid per 6-degree sector) relative to its mean radius, minus the strongest other
     harmonic (2nd-8th): about +0.38 for a drawn five-pointed star, +0.14 to +0.35 for a large
     one after the drawing model's VAE, about 0 for a circle, -0.14 for a square, -0.25 for a
     triangle, below 0 for a ragged blob. At least :data:`STAR_FIVEFOLD` (and a solidity below
     :data:`STAR_SOLIDITY`): a star.
   - ``solidity`` = patch area / area of its convex hull: about 1 for a circle, square or
     triangle, 0.5 for a sharp star; below :data:`MIN_SOLIDITY` without the star's fivefold
     symmetry: ``unclear`` (a ragged patch that is none of the shapes).
   - ``fill`` = patch area / area of its bounding box: square 1.0, circle pi/4 = 0.79,
     triangle 0.5.

   ``none`` when the patch covers less than :data:`MIN_AREA` of the picture.
4. Colours: the patch's median colour and the background's, each named by the nearest
   (Euclidean RGB) of the palette the pictures are drawn with
   (:data:`lora_gui.data.build_images.COLOURS` and ``BACKGROUNDS``).

Thresholds were set on the procedural pictures themselves (see tests/data/test_drawing_detector.py):
every kind is told apart on the drawn 64 px test pictures.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from PIL import Image

from lora_gui.data.build_images import BACKGROUNDS, COLOURS

FOREGROUND_DISTANCE = 60.0  # RGB distance from the background that counts as the shape
MIN_AREA = 0.01  # share of the picture below which nothing is drawn
STAR_FIVEFOLD = 0.1  # fivefold() at or above (and solidity below STAR_SOLIDITY): a star
STAR_SOLIDITY = 0.85  # a star's arms leave gaps in its hull (0.5 sharp, about 0.7 blurred)
MIN_SOLIDITY = 0.75  # below, without fivefold symmetry: 'unclear' (circle / square / triangle: ~1)
SQUARE_FILL = 0.88  # fill of the bounding box at or above: a square (1.0)
CIRCLE_FILL = 0.66  # at or above (and below SQUARE_FILL): a circle (0.79); below: a triangle (0.5)


@dataclass(frozen=True)
class Drawing:
    """What the detector saw.

    Attributes:
        shape: 'circle', 'square', 'triangle', 'star', 'unclear' or 'none'.
        colour: the nearest palette colour of the shape ('' when none).
        background: the nearest background colour name.
        area: the shape's share of the picture (0-1).
        fill: shape area / bounding-box area.
        solidity: shape area / convex-hull area.
        fivefold: the star statistic (see the module docstring).
    """

    shape: str
    colour: str
    background: str
    area: float
    fill: float
    solidity: float
    fivefold: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _nearest(rgb: np.ndarray, palette: dict[str, tuple[int, int, int]]) -> str:
    return min(palette, key=lambda name: float(np.sum((rgb - np.array(palette[name])) ** 2)))


def _largest_patch(mask: np.ndarray) -> np.ndarray:
    """The largest 4-connected patch of True pixels (breadth-first labelling)."""
    h, w = mask.shape
    seen = np.zeros_like(mask, dtype=bool)
    best: list[tuple[int, int]] = []
    for y0, x0 in zip(*np.nonzero(mask), strict=True):
        if seen[y0, x0]:
            continue
        seen[y0, x0] = True
        patch, queue = [], deque([(int(y0), int(x0))])
        while queue:
            y, x = queue.popleft()
            patch.append((y, x))
            for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    queue.append((ny, nx))
        if len(patch) > len(best):
            best = patch
    out = np.zeros_like(mask, dtype=bool)
    if best:
        ys, xs = zip(*best, strict=True)
        out[list(ys), list(xs)] = True
    return out


def hull_area(points: np.ndarray) -> float:
    """Area of the convex hull of (N, 2) points (Andrew's monotone chain, shoelace formula)."""
    pts = sorted(set(map(tuple, points.tolist())))
    if len(pts) < 3:
        return 0.0

    def cross(o, a, b) -> float:
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    lower: list = []
    upper: list = []
    for p in pts:
        while len(lower) >= 2 and cross(lower[-2], lower[-1], p) <= 0:
            lower.pop()
        lower.append(p)
    for p in reversed(pts):
        while len(upper) >= 2 and cross(upper[-2], upper[-1], p) <= 0:
            upper.pop()
        upper.append(p)
    hull = np.array(lower[:-1] + upper[:-1], dtype=float)
    x, y = hull[:, 0], hull[:, 1]
    return 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


def fivefold(patch: np.ndarray, bins: int = 60) -> float:
    """Strength of a five-pointed outline: the 5th harmonic of the patch's radial profile (its
    farthest pixel from the centroid per 6-degree sector), relative to the mean radius, minus
    the strongest other harmonic (2nd-8th). A star: clearly positive; a blob: near zero or below."""
    ys, xs = np.nonzero(patch)
    dy, dx = ys - ys.mean(), xs - xs.mean()
    sector = ((np.arctan2(dy, dx) + np.pi) / (2 * np.pi) * bins).astype(int) % bins
    radius = np.zeros(bins)
    np.maximum.at(radius, sector, np.hypot(dy, dx) + 0.5)
    if radius.mean() <= 0:
        return 0.0
    amplitude = 2 * np.abs(np.fft.rfft(radius)) / bins / radius.mean()
    others = [amplitude[k] for k in range(2, 9) if k != 5]
    return float(amplitude[5] - max(others))


def detect(image: Image.Image | np.ndarray) -> Drawing:
    """Detects the shape, its colour and the background of one picture (see the module docstring)."""
    rgb = np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image, dtype=float)
    h, w, _ = rgb.shape
    frame = np.concatenate([rgb[:2].reshape(-1, 3), rgb[-2:].reshape(-1, 3),
                            rgb[:, :2].reshape(-1, 3), rgb[:, -2:].reshape(-1, 3)])
    back = np.median(frame, axis=0)
    background = _nearest(back, BACKGROUNDS)
    patch = _largest_patch(np.linalg.norm(rgb - back, axis=2) > FOREGROUND_DISTANCE)
    area = int(patch.sum())
    if area < MIN_AREA * h * w:
        return Drawing("none", "", background, area / (h * w), 0.0, 0.0)
    ys, xs = np.nonzero(patch)
    fill = area / float((ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1))
    # pixel squares' corners, so that a one-pixel-wide patch still has an area
    corners = np.concatenate([np.stack([xs + dx, ys + dy], 1) for dx in (0, 1) for dy in (0, 1)])
    solidity = area / max(hull_area(corners), 1.0)
    star = fivefold(patch)
    if star >= STAR_FIVEFOLD and solidity < STAR_SOLIDITY:
        shape = "star"
    elif solidity < MIN_SOLIDITY:
        shape = "unclear"
    elif fill >= SQUARE_FILL:
        shape = "square"
    elif fill >= CIRCLE_FILL:
        shape = "circle"
    else:
        shape = "triangle"
    colour = _nearest(np.median(rgb[patch], axis=0), COLOURS)
    return Drawing(shape, colour, background, area / (h * w), round(fill, 3), round(solidity, 3),
                   round(star, 3))
