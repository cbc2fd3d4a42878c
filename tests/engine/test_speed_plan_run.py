"""A budgeted text run plans its micro-batches by predicted speed and records the speed it
predicted beside the speed it measured (run.json's ``speed_report``)."""

from __future__ import annotations

import json

import pytest

from lora_gui.config import apply_overrides
from lora_gui.engine import train
from lora_gui.presets import load_config


@pytest.mark.slow
def test_a_budgeted_run_records_predicted_and_measured_tokens_per_s_and_mfu(tmp_path, small_corpus):
    cfg = apply_overrides(load_config("text-demo"), {
        "data": str(small_corpus), "max_seq_len": 128, "batch_size": 4, "max_steps": 2,
        "budget_gb": 0.2, "monitor_hz": 0.0, "eval_fraction": 0.1})
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed", summary.get("message")
    saved = json.loads((tmp_path / "run" / "run.json").read_text())
    report = saved["speed_report"]
    assert report["predicted_tokens_per_s"] > 0 and report["measured_tokens_per_s"] > 0
    assert report["predicted_source"].startswith(("calibrated on", "cached calibrated on"))
    # MFU: the plan's beside the run's, both useful FLOPs over the same kind of measured peak
    # the plan's MFU is left out (None) when the matmul peak was measured while the machine was
    # busier than during the timing (a share above 1: tests/memory/test_step_time.py covers it)
    assert report["predicted_mfu"] is None or 0 < report["predicted_mfu"] <= 1, report["predicted_mfu"]
    assert report["measured_mfu"] > 0
    assert report["measured_mfu"] == saved["mfu"]
    prediction = saved["prediction"]
    assert set(prediction["tokens_per_s_by_bucket"]) == {"64", "128"}
    model = prediction["step_time_model"]
    assert model["overhead_s"] > 0 and len(model["points"]) == 3
    kernels = {k["name"]: k for k in saved["fast_kernels"]}  # a CPU run: neither, each with why
    assert not kernels["liger_kernels"]["used"] and "CUDA" in kernels["liger_kernels"]["reason"]
    assert not kernels["compile_blocks"]["used"] and kernels["compile_blocks"]["reason"]


@pytest.mark.slow
def test_an_image_run_records_predicted_and_measured_images_per_s(tmp_path):
    cfg = load_config("image-demo", {"max_steps": 3, "sample_images": 0, "monitor_hz": 0.0})
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed", summary.get("message")
    saved = json.loads((tmp_path / "run" / "run.json").read_text())
    report = saved["speed_report"]
    assert report["predicted_images_per_s"] > 0 and report["measured_images_per_s"] > 0
    assert report["predicted_images_per_s"] == saved["prediction"]["predicted_images_per_s"]
    assert report["predicted_source"].startswith(("calibrated on", "cached calibrated on"))
    assert report["measured_images_per_s"] == pytest.approx(saved["images_per_s"])
    assert report["predicted_vs_measured"] == pytest.approx(
        report["predicted_images_per_s"] / report["measured_images_per_s"] - 1)
    assert report["predicted_mfu"] is None or 0 < report["predicted_mfu"] <= 1, report["predicted_mfu"]
    assert report["measured_mfu"] == saved["mfu"] and report["measured_mfu"] > 0


@pytest.mark.slow
def test_a_budgeted_run_times_its_step_once_and_before_it_loads_its_weights(tmp_path, small_corpus,
                                                                            monkeypatch):
    """On a GPU the timing builds a second model of the run's architecture: timed before the
    weights are loaded, it never sits beside them (here on the CPU, where a set precision makes
    the step's settings known before loading, as a GPU's always are)."""
    from lora_gui.memory.predict import step_time
    from lora_gui.models import text as text_models

    monkeypatch.setenv(step_time.CACHE_ENV, str(tmp_path / "cache"))  # nothing stored yet
    order = []
    calibrate, load = step_time.calibrate, text_models.load_model_for
    monkeypatch.setattr(step_time, "calibrate", lambda *a, **k: order.append("timed") or calibrate(*a, **k))
    monkeypatch.setattr(text_models, "load_model_for",
                        lambda *a, **k: order.append("loaded") or load(*a, **k))
    cfg = apply_overrides(load_config("text-demo"), {
        "data": str(small_corpus), "max_seq_len": 128, "batch_size": 4, "max_steps": 1, "precision": "fp32",
        "budget_gb": 0.2, "monitor_hz": 0.0, "eval_fraction": 0.1})
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed", summary.get("message")
    assert order[:2] == ["timed", "loaded"] and order.count("timed") == 1, order
    assert summary["speed_report"]["predicted_source"].startswith("cached calibrated on")
