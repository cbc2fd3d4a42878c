"""The step-time model: its fit, the micro-batch it picks, its cache, and the plan that uses it."""

from __future__ import annotations

import json

import pytest

from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.memory.predict import step_time
from lora_gui.memory.predict.estimate import estimate_text_step
from lora_gui.memory.predict.planner import plan_text
from lora_gui.memory.predict.step_time import StepTimeModel, choose_micro_batch, fit

from .conftest import tiny_llama

STEP = {"device": "cpu", "dtype": "float32"}


def model(overhead: float = 0.01, per_token: float = 1e-4, pair: float = 1e-7) -> StepTimeModel:
    return StepTimeModel(overhead, per_token, pair, "cpu", "test")


def test_fit_recovers_the_coefficients_of_exact_points():
    truth = model(0.02, 3e-5, 2e-8)
    points = [(r, n, truth.seconds(r, n)) for r, n in ((8, 64), (4, 128), (1, 512))]
    got = fit(points, 0.02, "cpu", "test")
    assert got.per_token_s == pytest.approx(3e-5, rel=1e-6)
    assert got.per_token_pair_s == pytest.approx(2e-8, rel=1e-6)
    assert got.seconds(3, 300) == pytest.approx(truth.seconds(3, 300), rel=1e-6)


def test_fit_sets_a_negative_slope_to_zero_and_keeps_the_mean_cost():
    points = [(4, 64, 0.01 + 256 * 2e-5), (1, 256, 0.01 + 256 * 1e-5)]  # cheaper per token when longer
    got = fit(points, 0.01, "cpu", "test")
    assert got.per_token_pair_s == 0 and got.per_token_s == pytest.approx(1.5e-5)


@pytest.mark.parametrize("points", [[(1, 64, 0.1)], [(1, 64, 0.1), (2, 64, 0.2)],
                                    [(0, 64, 0.1), (1, 128, 0.1)], [(1, 64, 0.0), (1, 128, 0.1)]])
def test_fit_refuses_points_it_cannot_fit(points):
    with pytest.raises(ValueError, match="step time"):
        fit(points, 0.01, "cpu", "test")


def test_step_seconds_counts_one_overhead_per_micro_batch_and_every_token_once():
    m = model()
    assert m.step_seconds(8, 3, 100) == pytest.approx(3 * 0.01 + 8 * 100 * (1e-4 + 1e-5))
    assert m.tokens_per_s(8, 8, 100) > m.tokens_per_s(8, 3, 100)


def test_fastest_takes_the_smallest_micro_batch_with_the_fewest_passes():
    # 8 rows a step, at most 5 fit: 5 + 3 and 4 + 4 are both two passes; 4 holds less memory
    assert choose_micro_batch(model(), 8, 256, 5, "fastest") == 4
    assert choose_micro_batch(model(), 8, 256, 5, "largest") == 5
    assert choose_micro_batch(model(), 8, 256, 8, "fastest") == 8
    assert choose_micro_batch(model(), 8, 256, 1, "fastest") == 1


def test_headroom_keeps_most_of_the_fastest_speed_with_fewer_rows():
    slow_tokens = model(overhead=0.02, per_token=1e-3, pair=0)  # a pass costs a fifth of a row
    picked = choose_micro_batch(slow_tokens, 16, 100, 16, "headroom")
    assert picked == 2  # 8 passes: 1.76 s a step against 1.62 s at 16 rows (92%); 16 passes: 90% less 1
    best = slow_tokens.tokens_per_s(16, 16, 100)
    assert slow_tokens.tokens_per_s(16, picked, 100) >= step_time.HEADROOM_SHARE * best
    assert slow_tokens.tokens_per_s(16, picked - 1, 100) < step_time.HEADROOM_SHARE * best
    costly_passes = model(overhead=10.0)  # passes dominate: only the fastest keeps 90%
    assert choose_micro_batch(costly_passes, 16, 100, 16, "headroom") == 16


def test_an_unknown_choice_is_named():
    with pytest.raises(ValueError, match="'quickest'"):
        choose_micro_batch(model(), 8, 256, 5, "quickest")


def test_calibrate_times_the_overhead_shape_and_three_lengths():
    shapes = []
    truth = model(0.02, 2e-5, 2e-8)  # tens of ms a step: a loaded machine's late wake-ups stay small

    def step(rows: int, length: int) -> None:
        shapes.append((rows, length))
        import time

        time.sleep(truth.seconds(rows, length))

    got = step_time.calibrate(step, 512, "cpu")
    assert step_time.OVERHEAD_SHAPE in shapes
    assert sorted({n for _, n in shapes}) == [16, 128, 256, 512]
    assert len(shapes) == 4 * (1 + step_time.CALIBRATION_REPEATS)  # a warm-up, then the timed rounds
    assert got.overhead_s >= 0.02 and got.source.startswith("calibrated on ")
    assert got.seconds(4, 256) == pytest.approx(truth.seconds(4, 256), rel=0.5)  # sleeps overrun a little


def test_the_cache_keeps_a_calibration_per_key_and_skips_a_missing_model(tmp_path, monkeypatch):
    monkeypatch.setenv(step_time.CACHE_ENV, str(tmp_path))
    calls = []

    def measure() -> StepTimeModel:
        calls.append(1)
        return model()

    first = step_time.cached("k1", measure)
    again = step_time.cached("k1", measure)
    assert len(calls) == 1 and again.overhead_s == first.overhead_s and again.source == "cached test"
    assert "k1" in json.loads((tmp_path / "step_time.json").read_text())
    assert step_time.cached("k2", lambda: None) is None
    assert "k2" not in json.loads((tmp_path / "step_time.json").read_text())


def test_an_unreadable_cache_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv(step_time.CACHE_ENV, str(tmp_path))
    (tmp_path / "step_time.json").write_text("{not json")
    assert step_time.cached("k", model).source == "test"
    assert "k" in json.loads((tmp_path / "step_time.json").read_text())


def test_the_plan_picks_the_fastest_micro_batch_and_states_its_speed():
    cfg = tiny_llama(vocab=2000)
    budget = estimate_text_step(cfg, batch_size=5, seq_len=256, **STEP).peak_bytes + 1000
    largest = plan_text(cfg, budget, [256], effective_batch=8, confirm=False, **STEP)
    fastest = plan_text(cfg, budget, [256], effective_batch=8, confirm=False, step_time=model(),
                        batch_choice="fastest", **STEP)
    assert largest.buckets[0].micro_batch == 5 and largest.buckets[0].tokens_per_s is None
    row = fastest.buckets[0]
    assert (row.micro_batch, row.grad_accum, row.largest_fitting) == (4, 2, 5)
    assert row.peak_bytes < largest.buckets[0].peak_bytes
    assert row.tokens_per_s == pytest.approx(model().tokens_per_s(8, 4, 256))
    assert "tokens/s" in fastest.message


def test_batch_choice_is_a_declared_setting():
    assert RunConfig().batch_choice == "fastest"
    assert apply_overrides(RunConfig(), {"batch_choice": "headroom"}).batch_choice == "headroom"
    with pytest.raises(ConfigError, match="batch_choice"):
        apply_overrides(RunConfig(), {"batch_choice": "quickest"})


def _run_model(cfg: RunConfig, device: str = "cpu"):
    from lora_gui.memory.predict.run_plan import step_kwargs
    from lora_gui.memory.predict.run_speed import step_time_model

    config = tiny_llama(vocab=500)
    return step_time_model(cfg, config, device, step_kwargs(cfg, device))


def test_a_run_calibrates_its_own_architecture_once_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv(step_time.CACHE_ENV, str(tmp_path))
    cfg = apply_overrides(RunConfig(), {"max_seq_len": 128})
    first = _run_model(cfg)
    assert first.source.startswith("calibrated on ") and first.overhead_s > 0
    assert first.flops[0] > 0 and first.peak_flops_per_s > 0  # what a predicted MFU needs
    assert [(r, n) for r, n, _ in first.points] == [(16, 32), (8, 64), (4, 128)]
    again = _run_model(cfg)
    assert again.source == "cached " + first.source and again.per_token_s == first.per_token_s
    other = _run_model(apply_overrides(cfg, {"lora_rank": 4}))  # another step: its own calibration
    assert not other.source.startswith("cached")


def test_no_step_time_model_where_it_cannot_be_timed(tmp_path, monkeypatch):
    monkeypatch.setenv(step_time.CACHE_ENV, str(tmp_path))
    assert _run_model(apply_overrides(RunConfig(), {"quantization": "nf4"})) is None
    monkeypatch.setitem(step_time.MAX_CALIBRATION_PARAMS, "cpu", 1000)
    assert _run_model(RunConfig()) is None
    import torch

    if not torch.cuda.is_available():
        assert _run_model(RunConfig(), "cuda") is None  # a plan for a GPU made without one
    assert not (tmp_path / "step_time.json").exists()


def test_checkpointing_adds_the_recompute_to_one_calibration(tmp_path, monkeypatch):
    monkeypatch.setenv(step_time.CACHE_ENV, str(tmp_path))
    cfg = apply_overrides(RunConfig(), {"max_seq_len": 128})
    plain = _run_model(cfg)
    every = _run_model(apply_overrides(cfg, {"gradient_checkpointing": True}))
    half = _run_model(apply_overrides(cfg, {"gradient_checkpointing": True, "checkpoint_layers": 1}))
    assert every.source.startswith("cached") and half.source.startswith("cached")  # no new calibration
    assert every.per_token_s == pytest.approx(plain.per_token_s * (1 + 1 / 3))  # tiny_llama: 2 layers
    assert half.per_token_s == pytest.approx(plain.per_token_s * (1 + 1 / 6))
    assert every.overhead_s == plain.overhead_s and "recomputing 100%" in every.source


def counted_model(overhead: float = 0.01) -> StepTimeModel:
    """A model with a FLOP count (1,000 per token through projections, 100 through adapters, 10
    per causal pair) and a 1 GFLOP/s matmul peak."""
    return StepTimeModel(overhead, 1e-4, 1e-7, "cpu", "test", (), (1000, 100, 10), 1e9)


def test_mfu_is_useful_flops_over_predicted_seconds_over_the_peak():
    m = counted_model()
    flops = 8 * (1100 * 256 + 10 * 256 * 257 // 2)  # 8 full rows of 256 tokens
    assert m.useful_flops([256] * 8) == flops
    assert m.mfu(8, 4, 256) == pytest.approx(flops / m.step_seconds(8, 4, 256) / 1e9)
    assert m.mfu(8, 8, 256) > m.mfu(8, 1, 256)  # fewer overheads: more of the peak
    assert model().mfu(8, 4, 256) is None  # no count, no MFU
    again = StepTimeModel.from_json(json.loads(json.dumps(m.to_json())))
    assert again == m


def test_the_plan_states_each_buckets_mfu_and_the_runs_from_real_lengths():
    from lora_gui.memory.predict.run_speed import predicted_speed

    cfg = tiny_llama(vocab=2000)
    m = counted_model()
    budget = estimate_text_step(cfg, batch_size=8, seq_len=256, **STEP).peak_bytes + 1000
    plan = plan_text(cfg, budget, [128, 256], effective_batch=8, confirm=False, step_time=m,
                     batch_choice="fastest", **STEP)
    assert [b.mfu for b in plan.buckets] == [pytest.approx(m.mfu(8, b.micro_batch, b.bucket))
                                             for b in plan.buckets]
    assert "MFU" in plan.message
    lengths = [100] * 8 + [200] * 8  # one step in each bucket: padded to 128 and 256
    out = predicted_speed(m, plan, 8, lengths, 8)
    seconds = sum(m.step_seconds(8, b.micro_batch, b.bucket) for b in plan.buckets)
    assert out["predicted_tokens_per_s"] == pytest.approx(8 * (128 + 256) / seconds)
    assert out["predicted_mfu"] == pytest.approx(m.useful_flops(lengths) / seconds / 1e9)
    assert out["peak_flops_per_s"] == 1e9 and set(out["mfu_by_bucket"]) == {"128", "256"}


def test_the_speed_report_puts_predicted_and_measured_mfu_side_by_side():
    from lora_gui.memory.predict.run_speed import speed_report

    records = [{"padded_tokens": 1000, "seconds": 2.0}]
    report = speed_report({"predicted_tokens_per_s": 600.0, "predicted_mfu": 0.05, "speed_source": "x"},
                          records, measured_mfu=0.04)["speed_report"]
    assert report["measured_tokens_per_s"] == 500.0
    assert report["predicted_vs_measured"] == pytest.approx(0.2)
    assert (report["predicted_mfu"], report["measured_mfu"]) == (0.05, 0.04)


def test_plan_prints_the_predicted_speed_and_mfu_beside_the_peak():
    from lora_gui.memory.predict.report import speed_lines

    line, = speed_lines({"predicted_tokens_per_s": 1234.0, "predicted_mfu": 0.0321,
                         "peak_flops_per_s": 5e10, "speed_source": "calibrated on a CPU"})
    assert "1,234 tokens/s" in line and "MFU 3.2%" in line and "50.0 GFLOP/s" in line
    assert speed_lines({"predicted_tokens_per_s": None}) == []


def test_a_stored_calibration_is_read_without_timing_anything(tmp_path, monkeypatch):
    monkeypatch.setenv(step_time.CACHE_ENV, str(tmp_path))
    assert step_time.cached("k", None) is None  # nothing stored, nothing measured
    step_time.cached("k", counted_model)
    assert step_time.cached("k", None).flops == (1000, 100, 10)


def test_no_mfu_above_the_measured_peak():
    busy = StepTimeModel(0.0, 1e-9, 0.0, "cpu", "test", (), (1000, 100, 10), 1e6)  # peak measured slow
    assert busy.mfu(8, 8, 256) is None


def test_the_host_link_rate_is_kept_with_the_calibration_and_not_timed_on_a_cpu():
    with_rate = StepTimeModel(0.0, 1e-4, 1e-7, "cuda", "test", (), None, None, 4e-11)
    assert StepTimeModel.from_json(json.loads(json.dumps(with_rate.to_json()))) == with_rate
    older = {k: v for k, v in with_rate.to_json().items() if k != "host_round_trip_s_per_byte"}
    assert StepTimeModel.from_json(older).host_round_trip_s_per_byte is None  # a calibration without it
    assert step_time.host_round_trip_seconds_per_byte("cpu") is None  # the same memory: nothing to time
