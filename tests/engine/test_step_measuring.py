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
from lora_gui.memory.runtime.meter import SHAPE_STEPS, PeakMeter, StepShape
from lora_gui.presets import load_config

CPU = torch.device("cpu")
COVERAGE = ("the first 2 of each step shape, and none whose micro-batches are each within a measured "
            "one")


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
    assert meter.coverage() == {"measured_steps": COVERAGE, "steps_measured": 4,
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
    first = _first_of_each_shape(keys)  # a step within a larger measured one is skipped too
    assert all(f for r, f in zip(records, first) if r["peak_bytes"] is not None)
    assert [r["peak_bytes"] is not None for r in records][:SHAPE_STEPS] == [True, True]
    assert any(r["peak_bytes"] is None for r in records)
    assert all(r["peak_bytes"] for r in every_records)
    # the measured steps' figures are those of the same steps measured with every step
    for r, e in zip(records, every_records, strict=True):
        assert r["peak_bytes"] in (None, e["peak_bytes"]), (r, e)
    most = max(r["peak_bytes"] for r in every_records)
    assert shapes["train_peak_bytes"] == every["train_peak_bytes"] == most
    assert shapes["peak_bytes"] == every["peak_bytes"]
    assert shapes["memory_report"]["predicted_vs_measured"] == every["memory_report"]["predicted_vs_measured"]
    assert shapes["measured_steps"] == COVERAGE
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


def test_a_step_is_covered_by_another_when_each_micro_batch_fits_one_of_the_same_kind():
    big = StepShape(((4, 64, "rows"), (2, 32, "rows")), other="bucket")
    assert StepShape(((4, 64, "rows"),), "bucket").covered_by([big])
    assert StepShape(((3, 56, "rows"), (2, 24, "rows")), "bucket").covered_by([big])
    assert StepShape(((2, 32, "rows"), (1, 32, "rows"), (2, 16, "rows")), "bucket").covered_by([big])
    assert not StepShape(((5, 64, "rows"),), "bucket").covered_by([big])  # more rows
    assert not StepShape(((4, 72, "rows"),), "bucket").covered_by([big])  # longer rows
    assert not StepShape(((4, 64, "padded"),), "bucket").covered_by([big])  # another code path
    assert not StepShape(((4, 64, "rows"),), "other bucket").covered_by([big])
    # a step's later micro-batches run with the adapter's gradients resident: matched by a later one
    assert not StepShape(((2, 32, "rows"), (4, 64, "rows")), "bucket").covered_by([big])
    one = StepShape(((4, 64, "rows"),), "bucket")
    assert not StepShape(((1, 8, "rows"), (1, 8, "rows")), "bucket").covered_by([one])


def test_only_steps_measured_with_the_optimizer_state_cover_smaller_ones():
    big, small = StepShape(((2, 64, "rows"),)), StepShape(((1, 32, "rows"),))
    meter = PeakMeter(CPU, every_step=False)
    with meter:
        assert meter.start_step(big, settled=False)  # the first update has not run: no cover yet
        assert meter.start_step(small, settled=False)
        assert meter.start_step(big, settled=True)
        assert not meter.start_step(small, settled=True)
        assert not meter.start_step(StepShape(((2, 48, "rows"),)), settled=True)
        assert meter.start_step(StepShape(((3, 16, "rows"),)), settled=True)
    assert meter.coverage()["steps_not_measured"] == 2


def _shapes_and_peaks(monkeypatch, cfg: RunConfig, out: Path) -> tuple[list, list[dict]]:
    """A run measured at every step, with each step's shape as the meter saw it."""
    seen: list = []
    start = PeakMeter.start_step

    def spy(self, shape=None, resident=(), settled=False):
        if shape is not None:
            seen.append((shape, settled))
        return start(self, shape, resident, settled)

    monkeypatch.setattr(PeakMeter, "start_step", spy)
    train_text(apply_overrides(cfg, {"measure_every_step": True}), out, progress=False)
    monkeypatch.undo()
    return seen, read_records(out / "metrics.jsonl")


def test_a_step_is_covered_by_micro_batches_of_several_measured_steps():
    long_rows = StepShape(((1, 64, "rows"), (1, 64, "rows")), "bucket")
    many_rows = StepShape(((8, 16, "rows"), (8, 16, "rows")), "bucket")
    mixed = StepShape(((1, 48, "rows"), (8, 8, "rows")), "bucket")
    assert not mixed.covered_by([long_rows]) and not mixed.covered_by([many_rows])
    assert mixed.covered_by([long_rows, many_rows])
    assert not StepShape(((2, 64, "rows"),), "bucket").covered_by([long_rows, many_rows])
    assert not mixed.covered_by([StepShape(((1, 64, "rows"), (8, 16, "rows")), "other")])
    # a later micro-batch needs a later one: a measured step's first does not cover it
    assert not StepShape(((1, 8, "rows"), (1, 64, "rows")), "bucket").covered_by(
        [StepShape(((1, 64, "rows"),), "bucket"), many_rows])
    assert not mixed.covered_by([])


@pytest.mark.parametrize("batching", ["bucketed", "packed"])
def test_a_step_covered_by_measured_ones_never_peaks_higher(monkeypatch, tmp_path, small_corpus,
                                                          builtin_model_dir, batching):
    """Every step measured, on mixed lengths: each step covered by the other settled steps peaks
    no higher than, for its micro-batch that needs the most, the smallest-peaked step holding a
    micro-batch that covers it (the claim that lets the meter skip it); then the run that skips
    those steps reports the same peak with fewer steps measured."""
    cfg = apply_overrides(RunConfig(), {"data": str(small_corpus), "max_seq_len": 48, "batch_size": 6,
                                        "token_budget": 96, "pad_multiple": 8, "max_steps": 12,
                                        "batching": batching, "eval_fraction": 0.1, "monitor_hz": 0})
    seen, records = _shapes_and_peaks(monkeypatch, cfg, tmp_path / "every")
    assert len(seen) == len(records) == 12
    peaks = [r["peak_bytes"] for r in records]
    checked = 0
    for i, (shape, _) in enumerate(seen):
        others = [j for j, (_, settled) in enumerate(seen) if settled and j != i]
        if not shape.covered_by([seen[j][0] for j in others]):
            continue
        bounds = []  # per micro-batch: the lowest peak among the steps with a micro-batch covering it
        for k, micro in enumerate(shape.micro):
            one = StepShape((micro,) if k == 0 else (micro, micro), shape.other)
            bounds.append(min(peaks[j] for j in others if one.covered_by([seen[j][0]])))
        assert peaks[i] <= max(bounds), (i, shape, peaks[i], bounds)
        checked += 1
    assert checked >= 5, seen  # the run has covered steps to check
    summary = train_text(cfg, tmp_path / "skipping", progress=False)
    assert summary["peak_bytes"] == max(peaks)
    shapes = [shape for shape, _ in seen]
    exact_only = sum(min(SHAPE_STEPS, shapes.count(s)) for s in set(shapes))  # before: exact shapes
    assert summary["steps_measured"] < exact_only, (summary["steps_measured"], exact_only)
