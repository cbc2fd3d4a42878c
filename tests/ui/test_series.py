"""Chart series helpers: EMA smoothing and min-max downsampling of long histories."""

import pytest

from lora_gui.ui.series import downsample, ema


def test_ema_is_debiased_and_zero_weight_is_identity():
    assert ema([2.0, 2.0, 2.0], 0.9) == pytest.approx([2.0, 2.0, 2.0])  # no pull towards 0
    assert ema([1.0, 3.0], 0.0) == [1.0, 3.0]
    smooth = ema([0.0, 10.0, 0.0, 10.0], 0.5)
    assert max(smooth) < 10.0 and min(smooth[1:]) > 0.0
    with pytest.raises(ValueError, match="smoothing"):
        ema([1.0], 1.0)


def test_downsample_keeps_spikes_order_and_the_point_limit():
    n = 72_000  # 10 hours at 2 Hz
    xs = list(range(n))
    ys = [1.0] * n
    ys[12_345] = 50.0  # a one-sample spike
    ys[54_321] = -5.0
    dx, dy = downsample(xs, ys, max_points=2000)
    assert len(dx) <= 2000 and list(dx) == sorted(dx)
    assert max(dy) == 50.0 and min(dy) == -5.0 and 12_345 in dx
    short_x, short_y = downsample([1, 2, 3], [3.0, 2.0, 1.0])
    assert list(short_x) == [1, 2, 3] and list(short_y) == [3.0, 2.0, 1.0]
