"""The CPU memory meter measures the first steps of each step shape with the tracker and runs later
steps of a measured shape without it; ``measure_every_step`` measures them all. The run's measured
peak is the same either way (a step's memory is fixed by its shape once the optimizer state exists)."""

from pathlib import Path

import pytest
import torch

from lora_gui.config import RunConfig, apply_overrides
from lora_gui.data.build_images import build
from lora_gui.engine.core.records import read_records
from lora_gui.engine.image.train import train_image
from lora_gui.engine.text.train import train_text
from lora_gui.memory.runtime.meter import SHAPE_STEPS, PeakMeter
from lora_gui.presets import load_config

CPU = torch.device("cpu")


def _step(meter: PeakMeter, shape, size: int = 1000) -> tuple[bool, int | None]:
    measured = meter.start_step(shape)
    x = torch.ones(size)  # 4 x size bytes, alive while the step runs
    y = x * 2
    del x, y
    return measured, meter.step_peak()


def test_the_meter_measures_the_first_steps_of_each_shape():
    meter = PeakMeter(CPU, every_step=False)
    with meter:
        got = [_step(meter, shape, size) for shape, size in
               (("a", 1000), ("a", 1000), ("a", 1000), ("b", 2000), ("a", 1000), ("b", 2000), ("b", 2000))]
    assert SHAPE_STEPS == 2
    assert [m for m, _ in got] == [True, True, False, True, False, True, False]
    assert [p for _, p in got] == [8000, 8000, None, 16000, None, 16000, None]
    assert meter.coverage() == {"measured_steps": "the first 2 of each step shape", "steps_measured": 4,
                                "steps_not_measured": 3, "step_shapes": 2}
    assert meter.tracker.live_bytes == 0  # nothing left counted, nothing double-freed


def test_every_step_and_unknown_shapes_are_always_measured():
    meter = PeakMeter(CPU, every_step=True)
    with meter:
        assert all(_step(meter, "a")[0] for _ in range(4))
    assert meter.coverage() == {"measured_steps": "every step"}
    meter = PeakMeter(CPU, every_step=False)
    with meter:
        assert all(_step(meter, None)[0] for _ in range(4))


def test_unmeasured_steps_run_without_the_tracker_and_resident_state_is_caught_up():
    meter = PeakMeter(CPU, every_step=False)
    with meter:
        _step(meter, "a"), _step(meter, "a")
        meter.start_step("a")  # unmeasured: the tracker's dispatch mode is off
        before = meter.tracker.live_bytes
        state = torch.zeros(500)  # e.g. optimizer state a later step keeps
        assert meter.tracker.live_bytes == before and meter.sampled_live_bytes() is None
        meter.start_step("b", [state])  # measuring again: the state is counted from now on
        assert meter.tracker.live_bytes == before + 2000 and meter.sampled_live_bytes() == before + 2000
        z = torch.ones(10)
        assert meter.tracker.live_bytes == before + 2040 and meter.step_peak() == before + 2040
        del z, state
    assert meter.tracker.live_bytes == before


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> Path:
    """Nine demo pictures: several aspect buckets, so several step shapes."""
    out = tmp_path_factory.mktemp("pictures")
    build(out, count=9)
    return out


def _image_run(pictures: Path, out: Path, every: bool) -> tuple[dict, list[dict]]:
    cfg = load_config("image-demo", {"data": str(pictures), "max_steps": 10, "batch_size": 2,
                                     "resolution": 64, "aspect_buckets": "on", "monitor_hz": 0,
                                     "eval_fraction": 0.0, "sample_images": 0,
                                     "measure_every_step": every})
    summary = train_image(cfg, out, overwrite=True, progress=False)
    return summary, read_records(out / "metrics.jsonl")


def _first_of_each_shape(keys: list) -> list[bool]:
    seen: dict = {}
    flags = []
    for key in keys:
        seen[key] = seen.get(key, 0) + 1
        flags.append(seen[key] <= SHAPE_STEPS)
    return flags


def test_an_image_run_measures_the_first_steps_of_each_shape_and_the_same_peak(pictures, tmp_path):
    shapes, records = _image_run(pictures, tmp_path / "shapes", every=False)
    every, every_records = _image_run(pictures, tmp_path / "every", every=True)
    keys = [(r["bucket"], r["batch_size"]) for r in records]
    assert len(set(keys)) >= 2, keys  # several shapes, and some repeated
    assert [r["peak_bytes"] is not None for r in records] == _first_of_each_shape(keys)
    assert any(r["peak_bytes"] is None for r in records)
    assert all(r["peak_bytes"] for r in every_records)
    # the measured steps' figures are those of the same steps measured with every step
    for r, e in zip(records, every_records, strict=True):
        assert r["peak_bytes"] in (None, e["peak_bytes"]), (r, e)
    most = max(r["peak_bytes"] for r in every_records)
    assert shapes["train_peak_bytes"] == every["train_peak_bytes"] == most
    assert shapes["peak_bytes"] == every["peak_bytes"]
    assert shapes["memory_report"]["predicted_vs_measured"] == every["memory_report"]["predicted_vs_measured"]
    assert shapes["measured_steps"] == "the first 2 of each step shape"
    assert every["measured_steps"] == "every step"
    assert shapes["steps_measured"] + shapes["steps_not_measured"] == 10
    assert shapes["step_shapes"] == len(set(keys))


def test_a_text_run_measures_the_first_steps_of_each_shape_and_the_same_peak(tmp_path, small_corpus,
                                                                               builtin_model_dir):
    runs = {}
    for every in (False, True):
        cfg = apply_overrides(RunConfig(), {"data": str(small_corpus), "max_seq_len": 32, "batch_size": 4,
                                            "max_steps": 6, "batching": "fixed", "eval_fraction": 0.1,
                                            "monitor_hz": 0, "measure_every_step": every})
        out = tmp_path / f"text-{every}"
        runs[every] = train_text(cfg, out, progress=False), read_records(out / "metrics.jsonl")
    (shapes, records), (every, every_records) = runs[False], runs[True]
    assert [r["peak_bytes"] is not None for r in records][:SHAPE_STEPS] == [True, True]
    assert any(r["peak_bytes"] is None for r in records) and all(r["peak_bytes"] for r in every_records)
    for r, e in zip(records, every_records, strict=True):
        assert r["peak_bytes"] in (None, e["peak_bytes"]), (r, e)
    assert shapes["peak_bytes"] == every["peak_bytes"] == max(r["peak_bytes"] for r in every_records)
    assert shapes["steps_not_measured"] >= 1
