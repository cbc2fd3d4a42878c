"""Curve helpers for the charts: loss smoothing and downsampling of long histories.

No plotting here: plain lists in, plain lists out (unit-tested, and timed by bench/chart_refresh.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MAX_POINTS = 2000  # points per curve sent to the browser; a 10-hour run at 2 Hz has 72,000


def ema(values: Sequence[float], weight: float) -> list[float]:
    """Exponential moving average, TensorBoard style: s_t = w * s_(t-1) + (1 - w) * x_t, debiased
    so the first points are not pulled towards 0. ``weight`` 0 returns the values unchanged."""
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing: {weight} is not in [0, 1)")
    out, last, norm = [], 0.0, 0.0
    for x in values:
        last = weight * last + (1.0 - weight) * x
        norm = weight * norm + (1.0 - weight)
        out.append(last / norm)
    return out


def downsample(xs: Sequence[float], ys: Sequence[float], max_points: int = MAX_POINTS,
               ) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` points that keep every bucket's lowest and highest value in time
    order (min-max decimation): a memory spike is never smoothed away, unlike plain striding.
    Returns numpy arrays (plotly validates and serialises them far faster than lists)."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    n = len(x)
    if n <= max_points:
        return x, y
    size = -(-n // max(1, max_points // 2))  # samples per bucket
    buckets = -(-n // size)
    padded = np.full(buckets * size, np.nan)
    padded[:n] = y
    grid = padded.reshape(buckets, size)
    base = np.arange(buckets) * size
    lo, hi = base + np.nanargmin(grid, axis=1), base + np.nanargmax(grid, axis=1)
    keep = np.unique(np.concatenate([lo, hi]))  # sorted: time order, a flat bucket kept once
    return x[keep], y[keep]
