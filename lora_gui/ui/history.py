"""Long chart histories kept between timer ticks, so a tick costs what is new, not the whole run.

A training job's records and memory samples are only ever appended. Each chart curve keeps its
columns as numpy arrays, pulls values out of the new records only, extends its min-max
downsampling bucket by bucket (buckets of a power-of-two size, so doubling the size merges pairs
of finished buckets exactly) and carries its EMA forward. The result equals
:func:`lora_gui.ui.series.downsample` of the whole history (tested), at a fraction of the cost.
No plotting here.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lora_gui.ui.series import MAX_POINTS, bucket_size

Extract = Callable[[Sequence[Any]], tuple[np.ndarray, np.ndarray]]
Stable = tuple[tuple, int]  # (generation, points that stay as they are while it lasts)
_SERIALS = itertools.count()  # each series' own number: a new series is a new generation


class Series:
    """x / y columns that grow, with their min-max downsampling kept up to date."""

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self.max_points = max_points
        self.x, self.y = np.empty(1024), np.empty(1024)
        self.n = 0
        self.size = 1  # samples per finished bucket (a power of two)
        self.lo = np.empty(0, dtype=np.int64)  # per finished bucket: index of its lowest value
        self.hi = np.empty(0, dtype=np.int64)  # ... and of its highest value
        self.covered = 0  # samples inside finished buckets
        self.serial = next(_SERIALS)
        self.stable: Stable = ((self.serial, 0), 0)  # as of the last points(): see there

    def extend(self, xs: np.ndarray, ys: np.ndarray) -> None:
        """Appends points (amortised doubling of the buffers)."""
        need = self.n + len(xs)
        if need > len(self.x):
            grow = max(need, 2 * len(self.x))
            self.x, self.y = np.resize(self.x, grow), np.resize(self.y, grow)
        self.x[self.n:need], self.y[self.n:need] = xs, ys
        self.n = need

    def _merge_pairs(self) -> None:
        """Doubles the bucket size: each pair of finished buckets becomes one (first of equals
        kept, as argmin / argmax do); an odd last bucket goes back to the unfinished tail."""
        y, pairs = self.y, len(self.lo) // 2
        lo_a, lo_b, hi_a, hi_b = self.lo[0:2 * pairs:2], self.lo[1:2 * pairs:2], \
            self.hi[0:2 * pairs:2], self.hi[1:2 * pairs:2]
        self.lo = np.where(y[lo_a] <= y[lo_b], lo_a, lo_b)
        self.hi = np.where(y[hi_a] >= y[hi_b], hi_a, hi_b)
        self.size *= 2
        self.covered = pairs * self.size

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """At most ``max_points`` points in time order keeping each bucket's lowest and highest.

        Sets ``stable``: (generation, k): the first k points returned stay the same in every later
        call of the same generation (later calls only add points after them), so a page that
        holds them is sent the points after the k-th only. Up to ``max_points`` samples every
        point is stable; past it, the points of the finished buckets are, and a doubling of the
        bucket size starts a new generation."""
        n, x, y = self.n, self.x, self.y
        if n <= self.max_points:
            self.stable = ((self.serial, 0), n)
            return x[:n].copy(), y[:n].copy()
        while self.size < bucket_size(n, self.max_points):
            self._merge_pairs()
        size, start = self.size, self.covered
        full = (n - start) // size
        if full:  # buckets finished since the last call
            grid = y[start:start + full * size].reshape(full, size)
            base = start + np.arange(full) * size
            self.lo = np.concatenate([self.lo, base + grid.argmin(axis=1)])
            self.hi = np.concatenate([self.hi, base + grid.argmax(axis=1)])
            self.covered = start + full * size
        tail = y[self.covered:n]
        extra = [self.covered + tail.argmin(), self.covered + tail.argmax()] if len(tail) else []
        keep = np.unique(np.concatenate([self.lo, self.hi, np.asarray(extra, dtype=np.int64)]))
        self.stable = ((self.serial, self.size), int(np.searchsorted(keep, self.covered)))
        return x[keep], y[keep]

    @property
    def last_x(self) -> float | None:
        return float(self.x[self.n - 1]) if self.n else None


class SmoothedSeries(Series):
    """A series of the EMA of the values given (see :func:`lora_gui.ui.series.ema`), continued
    from its last state instead of recomputed."""

    def __init__(self, weight: float, max_points: int = MAX_POINTS) -> None:
        if not 0.0 <= weight < 1.0:
            raise ValueError(f"smoothing: {weight} is not in [0, 1)")
        super().__init__(max_points)
        self.weight, self.last, self.norm = weight, 0.0, 0.0

    def extend(self, xs: np.ndarray, ys: np.ndarray) -> None:
        w, last, norm = self.weight, self.last, self.norm
        out = np.empty(len(ys))
        for i, value in enumerate(ys.tolist()):  # a loop over the new points only
            last = w * last + (1.0 - w) * value
            norm = w * norm + (1.0 - w)
            out[i] = last / norm
        self.last, self.norm = last, norm
        super().extend(xs, out)


class _Followed:
    __slots__ = ("first", "last", "count", "series")

    def __init__(self, first: Any, series: Series) -> None:
        self.first, self.last, self.count, self.series = first, None, 0, series


class HistoryCache:
    """The curves of the few histories on screen, keyed by a name and the history's first item.

    A history is a list that only grows (a job's records or samples, or a copy of it): when its
    first item is the one seen before and the item at the old length is unchanged, only the new
    items are read; anything else (another run, a shorter list) starts the curve afresh.
    """

    def __init__(self, slots: int = 16) -> None:
        self._lock = threading.Lock()
        self._curves: OrderedDict[tuple[str, int], _Followed] = OrderedDict()
        self.slots = slots

    def points(self, name: str, items: Sequence[Any], extract: Extract,
               make: Callable[[], Series] = Series) -> tuple[np.ndarray, np.ndarray, float | None]:
        """(x, y) downsampled, and the last x, of the curve ``extract`` draws from ``items``."""
        return self.curve(name, items, extract, make)[:3]

    def curve(self, name: str, items: Sequence[Any], extract: Extract, make: Callable[[], Series] = Series,
              ) -> tuple[np.ndarray, np.ndarray, float | None, Stable]:
        """:meth:`points` and the curve's ``stable`` (see :meth:`Series.points`)."""
        if not items:
            return np.empty(0), np.empty(0), None, ((-1, 0), 0)
        key = (name, id(items[0]))
        with self._lock:  # timer ticks of several pages may run at once
            curve = self._curves.get(key)
            if (curve is None or curve.first is not items[0] or len(items) < curve.count
                    or (curve.count and items[curve.count - 1] is not curve.last)):
                curve = _Followed(items[0], make())
                self._curves[key] = curve
            self._curves.move_to_end(key)
            while len(self._curves) > self.slots:
                self._curves.popitem(last=False)
            if len(items) > curve.count:
                curve.series.extend(*extract(items[curve.count:]))
                curve.count, curve.last = len(items), items[-1]
            xs, ys = curve.series.points()
            return xs, ys, curve.series.last_x, curve.series.stable


HISTORY = HistoryCache()


def column(items: Sequence[dict[str, Any]], key: str, scale: float = 1.0, default: float = 0.0,
           ) -> np.ndarray:
    """One field of every item as floats (``default`` where it is missing, NaN where it is None:
    a gap in the line), divided by ``scale``."""
    values = np.fromiter((np.nan if (v := item.get(key, default)) is None else v for item in items),
                         float, len(items))
    return values / scale if scale != 1.0 else values
