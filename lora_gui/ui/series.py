"""Curve helpers for the charts: loss smoothing and downsampling of long histories.

No plotting here: plain lists in, plain lists out (unit-tested, and timed by bench/ui/chart_refresh.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MAX_POINTS = 1000  # points per curve sent to the browser (a min and a max per 2 px of a 1,000 px chart);
#                    a 10-hour run at 2 Hz has 72,000


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


def bucket_size(n: int, max_points: int = MAX_POINTS) -> int:
    """Samples per min-max bucket for ``n`` samples: the smallest power of two that makes at
    most ``max_points // 2`` buckets (a power of two, so a growing history can double it by
    merging pairs of buckets: see lora_gui.ui.history)."""
    size, most = 1, max(1, max_points // 2)
    while -(-n // size) > most:
        size *= 2
    return size


def downsample(xs: Sequence[float], ys: Sequence[float], max_points: int = MAX_POINTS,
               ) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` points that keep every bucket's lowest and highest value in time
    order (min-max decimation): a memory spike is never smoothed away, unlike plain striding.
    Returns numpy arrays (plotly validates and serialises them far faster than lists)."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    n = len(x)
    if n <= max_points:
        return x, y
    size = bucket_size(n, max_points)
    full = n // size
    grid = y[:full * size].reshape(full, size)
    base = np.arange(full) * size
    keep = [base + grid.argmin(axis=1), base + grid.argmax(axis=1)]
    if n > full * size:  # the last, unfinished bucket
        tail = y[full * size:]
        keep.append(np.array([full * size + tail.argmin(), full * size + tail.argmax()]))
    keep = np.unique(np.concatenate(keep))  # sorted: time order, a flat bucket kept once
    return x[keep], y[keep]
