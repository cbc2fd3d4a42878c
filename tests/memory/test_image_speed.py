"""An image run's step-time model: its fit, its cache, the speed and MFU a plan predicts from it,
and what ``plan`` shows for the image-demo preset."""

from __future__ import annotations

import json

import pytest

from lora_gui.memory.predict import image_speed, step_time
from lora_gui.memory.predict.image_speed import (
    ImageStepTimeModel,
    NotTimed,
    fit,
    image_speed_report,
    predicted_image_speed,
    rows_within,
    timed_buckets,
)
from lora_gui.memory.predict.report import speed_lines


def model(peak: float | None = 1e11) -> ImageStepTimeModel:
    """0.1 s a micro-batch, 0.02 s an image at 64x64 and 0.08 s at 128x128; 1e8 and 4e8 useful
    FLOPs an image there; a 100 GFLOP/s matmul peak."""
    return ImageStepTimeModel(0.1, {"64x64": 0.02, "128x128": 0.08}, "cpu", "test",
                              flops_per_image={"64x64": 100_000_000, "128x128": 400_000_000},
                              peak_flops_per_s=peak)


def test_fit_recovers_the_overhead_and_each_buckets_cost_per_image():
    truth = model()
    points = [(n, w, h, truth.seconds(n, (w, h))) for w, h in ((64, 64), (128, 128)) for n in (1, 8)]
    got = fit(points, "cpu", "test")
    assert got.overhead_s == pytest.approx(0.1) and got.per_image_s == pytest.approx(truth.per_image_s)
    one_size = fit([(4, 64, 64, 0.5)], "cpu", "test")  # one micro-batch size: no overhead to tell apart
    assert one_size.overhead_s == 0 and one_size.per_image_s["64x64"] == pytest.approx(0.125)
    with pytest.raises(ValueError, match="image step time"):
        fit([(0, 64, 64, 0.1)], "cpu", "test")


def test_a_bucket_not_timed_takes_its_neighbours_cost_by_pixels():
    m = model()
    between = (64 * 64 + 128 * 128) // 2  # halfway in pixels: halfway in cost
    assert m.seconds(1, (between // 64, 64)) == pytest.approx(0.1 + 0.05)
    assert m.seconds(1, (256, 128)) == pytest.approx(0.1 + 0.16)  # beyond: in proportion to the pixels
    assert m.flops((32, 64)) == pytest.approx(50_000_000)
    assert m.step_seconds(10, 4, (64, 64)) == pytest.approx(3 * 0.1 + 10 * 0.02)  # 4 + 4 + 2


def test_at_most_three_buckets_are_timed():
    buckets = [(64, 64), (64, 96), (96, 64), (96, 96), (128, 64), (128, 128)]
    assert timed_buckets(buckets) == [(64, 64), (128, 64), (128, 128)]  # by pixels: 4096, 8192, 16384
    assert timed_buckets([(64, 64)]) == [(64, 64)]


def test_the_calibration_times_as_many_images_as_its_flop_bound_allows():
    limit = image_speed.MAX_CALIBRATION_FLOPS["cpu"]
    runs = step_time.CALIBRATION_REPEATS + 1  # a warm-up and the timed rounds
    assert rows_within({"64x64": 10**8}, 8, "cpu") == 8  # the image demo: well inside
    heavy = int(limit / runs / 5)  # 1 + 4 images of it fill the bound exactly
    assert rows_within({"512x512": heavy}, 8, "cpu") == 4
    assert rows_within({"512x512": heavy, "64x64": None}, 8, "cpu") == 4  # an uncounted bucket: unbounded
    assert rows_within({"768x768": int(limit / runs)}, 8, "cpu") == 1  # one image a bucket, no more
    with pytest.raises(NotTimed, match="768x768"):
        rows_within({"768x768": 130 * 10**9, "64x64": 10**8}, 8, "cpu")


def test_the_cache_keeps_an_image_calibration_and_reads_it_back_whole(tmp_path, monkeypatch):
    monkeypatch.setenv(step_time.CACHE_ENV, str(tmp_path))
    calls = []

    def measure() -> ImageStepTimeModel:
        calls.append(1)
        return model()

    first = step_time.cached("img", measure, ImageStepTimeModel)
    again = step_time.cached("img", measure, ImageStepTimeModel)
    assert len(calls) == 1 and again.source == "cached test"
    assert again.per_image_s == first.per_image_s and again.flops_per_image == first.flops_per_image
    assert again.peak_flops_per_s == first.peak_flops_per_s
    assert "img" in json.loads((tmp_path / "step_time.json").read_text())
    assert step_time.cached("other", None, ImageStepTimeModel) is None  # nothing stored, nothing timed


def test_the_run_speed_is_its_steps_images_over_their_predicted_seconds():
    m = model()
    steps = [((64, 64), 8), ((64, 64), 3), ((128, 128), 8)]
    out = predicted_image_speed(m, "test", steps, lambda b: 4)  # at most 4 images a micro-batch
    seconds = 2 * 0.1 + 8 * 0.02 + 0.1 + 3 * 0.02 + 2 * 0.1 + 8 * 0.08
    assert out["predicted_images_per_s"] == pytest.approx(19 / seconds)
    assert out["predicted_mfu"] == pytest.approx((11 * 1e8 + 8 * 4e8) / seconds / 1e11)
    assert out["images_per_s_by_bucket"]["64x64"] == pytest.approx(8 / (2 * 0.1 + 8 * 0.02))
    assert set(out["mfu_by_bucket"]) == {"64x64", "128x128"} and out["speed_source"] == "test"
    two = predicted_image_speed(m, "test", [((64, 64), 8)], lambda b: None, world_size=2)
    assert two["predicted_images_per_s"] == pytest.approx(8 / (0.1 + 4 * 0.02))  # 4 images a process


def test_no_mfu_without_a_peak_or_above_it():
    steps = [((64, 64), 8)]
    out = predicted_image_speed(model(peak=None), "test", steps, lambda b: None)
    assert out["predicted_images_per_s"] > 0 and out["predicted_mfu"] is None
    assert out["mfu_by_bucket"] == {"64x64": None}
    busy = predicted_image_speed(model(peak=1e6), "test", steps, lambda b: None)  # peak measured slow
    assert busy["predicted_mfu"] is None
    untimed = predicted_image_speed(None, "not timed: why", steps, lambda b: None)
    assert untimed["predicted_images_per_s"] is None and untimed["predicted_mfu"] is None


def test_the_speed_report_sets_predicted_beside_measured_images_per_s():
    records = [{"images": 8, "seconds": 8.0, "peak_bytes": 100},  # measured by the tracker: slow
               *[{"images": 8, "seconds": 1.0, "peak_bytes": None}] * 2]
    report = image_speed_report({"predicted_images_per_s": 10.0, "predicted_mfu": 0.05, "speed_source": "x"},
                                records, measured_mfu=0.04)["speed_report"]
    assert report["measured_images_per_s"] == pytest.approx(24 / 10)
    assert report["predicted_vs_measured"] == pytest.approx(10 / 2.4 - 1)
    assert report["measured_images_per_s_unmetered"] == pytest.approx(8.0)
    assert report["predicted_vs_unmetered"] == pytest.approx(0.25)
    assert (report["predicted_mfu"], report["measured_mfu"]) == (0.05, 0.04)
    alone = image_speed_report(None, records[:1])["speed_report"]
    assert alone["predicted_images_per_s"] is None and alone["measured_images_per_s_unmetered"] is None


def test_plan_prints_images_per_s_or_why_it_is_not_timed():
    line, = speed_lines({"predicted_images_per_s": 12.5, "predicted_mfu": 0.031, "peak_flops_per_s": 5e10,
                         "speed_source": "calibrated on a CPU"})
    assert "12.50 images/s" in line and "MFU 3.1%" in line and "calibrated on a CPU" in line
    untimed, = speed_lines({"predicted_images_per_s": None, "speed_source": "not timed: too large"})
    assert "not timed: too large" in untimed


def test_plan_json_of_the_image_demo_states_images_per_s_and_mfu(capsys):
    from lora_gui.cli import main

    assert main(["plan", "--preset", "image-demo", "--device", "cpu", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)["prediction"]
    assert figures["predicted_images_per_s"] > 0
    assert figures["speed_source"].startswith(("calibrated on", "cached calibrated on"))
    assert set(figures["images_per_s_by_bucket"]) == {"64x64"} and figures["peak_flops_per_s"] > 0
    timing = figures["step_time_model"]
    assert [p[:3] for p in timing["points"]] == [[1, 64, 64], [8, 64, 64]]  # 1 image and the run's 8
    assert timing["flops_per_image"]["64x64"] > 1e6  # the denoiser's step, counted
    # MFU: useful FLOPs over the predicted seconds over the measured matmul peak (None when the
    # peak was measured while the machine was busier than during the timing)
    assert figures["predicted_mfu"] is None or 0 < figures["predicted_mfu"] <= 1
    assert main(["plan", "--preset", "image-demo", "--device", "cpu"]) == 0  # cached now: no timing
    text = capsys.readouterr().out
    assert "images/s" in text and "cached calibrated on" in text


def test_a_denoiser_above_the_size_a_plan_times_is_not_timed(capsys, monkeypatch):
    from lora_gui.cli import main

    monkeypatch.setitem(step_time.MAX_CALIBRATION_PARAMS, "cpu", 1000)
    assert main(["plan", "--preset", "image-demo", "--device", "cpu", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)["prediction"]
    assert figures["predicted_images_per_s"] is None and figures["predicted_mfu"] is None
    assert figures["speed_source"].startswith("not timed: the denoiser's")
