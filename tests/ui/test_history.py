"""Chart histories kept between ticks: the incremental curve equals the one-shot downsampling and
EMA of the whole history, and a different history starts afresh."""

import numpy as np
import pytest

from lora_gui.ui.history import HistoryCache, Series, SmoothedSeries, column
from lora_gui.ui.series import downsample, ema


def test_series_grown_in_pieces_equals_downsampling_the_whole_history():
    rng = np.random.default_rng(0)
    ys = rng.normal(size=30_000)
    ys[7_777] = 40.0  # a one-sample spike must survive every bucket merge
    xs = np.arange(len(ys), dtype=float)
    series, done = Series(max_points=500), 0
    for piece in (100, 400, 1, 3_000, 4, 9_000, 17, 17_478):  # crosses several bucket doublings
        series.extend(xs[done:done + piece], ys[done:done + piece])
        done += piece
        got_x, got_y = series.points()
        want_x, want_y = downsample(xs[:done], ys[:done], max_points=500)
        assert np.array_equal(got_x, want_x) and np.array_equal(got_y, want_y)
        assert len(got_x) <= 500
    assert done == len(ys) and 40.0 in got_y


def test_stable_points_stay_as_they_are_while_their_generation_lasts():
    """What a page holds of a curve (its first ``stable`` points) is never changed by later points
    of the same generation; a new bucket size is a new generation."""
    rng = np.random.default_rng(1)
    ys = rng.normal(size=6_000)
    xs = np.arange(len(ys), dtype=float)
    series, done, held = Series(max_points=500), 0, None
    generations = set()
    for piece in (10, 300, 190, 1, 700, 33, 2_000, 5, 2_766):
        series.extend(xs[done:done + piece], ys[done:done + piece])
        done += piece
        got_x, got_y = series.points()
        gen, k = series.stable
        assert 0 <= k <= len(got_x)
        if done <= 500:
            assert k == done  # every point kept as it is
        if held is not None and held[0] == gen:
            assert np.array_equal(got_x[:held[1]], held[2]) and np.array_equal(got_y[:held[1]], held[3])
        held = (gen, k, got_x[:k].copy(), got_y[:k].copy())
        generations.add(gen)
    assert len(generations) >= 3  # all points, then bucket sizes that doubled


def test_smoothed_series_continues_the_ema():
    values = [3.0, 2.5, 2.7, 1.0, 1.2, 0.9]
    series = SmoothedSeries(0.8)
    series.extend(np.arange(3.0), np.array(values[:3]))
    series.extend(np.arange(3.0, 6.0), np.array(values[3:]))
    assert series.points()[1] == pytest.approx(ema(values, 0.8))
    with pytest.raises(ValueError, match="smoothing"):
        SmoothedSeries(1.0)


def test_cache_reads_only_new_items_and_restarts_on_another_history():
    seen = []

    def extract(new):
        seen.append(len(new))
        return column(new, "step"), column(new, "loss")

    cache = HistoryCache()
    records = [{"step": i, "loss": 1.0 / (i + 1)} for i in range(10)]
    cache.points("loss", list(records), extract)
    records.append({"step": 10, "loss": 0.05})
    xs, ys, last = cache.points("loss", list(records), extract)  # a copy, as job.snapshot() gives
    assert seen == [10, 1] and last == 10.0 and ys[-1] == 0.05
    other = [dict(r) for r in records[:5]]  # another run: same values, other objects
    xs, _, _ = cache.points("loss", other, extract)
    assert seen == [10, 1, 5] and list(xs) == [0, 1, 2, 3, 4]
    assert cache.points("loss", [], extract)[2] is None
    assert np.isnan(column([{"loss": None}], "loss")[0])  # a missing value is a gap, not an error
