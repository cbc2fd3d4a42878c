"""The form's instant estimate shows the micro-batch the run's plan picks (``batch_choice`` with
this machine's stored step-time calibration), or says plainly that it shows the largest."""

from __future__ import annotations

import pytest

from lora_gui.config import apply_overrides
from lora_gui.memory.predict import estimate, run_speed, step_time
from lora_gui.memory.predict.run_plan import plan_run
from lora_gui.memory.predict.step_time import StepTimeModel
from lora_gui.presets import load_config
from lora_gui.units import GB

# no fixed cost per micro-batch: every cut is as fast, so 'fastest' takes the smallest, 1 row
FLAT = StepTimeModel(0.0, 1e-5, 0.0, "cpu", "test calibration")


def _cfg(**kw):
    return apply_overrides(load_config("text-demo"), {"max_seq_len": 128, "batch_size": 4,
                                                      "budget_gb": 2.0, **kw})


def test_the_estimate_takes_the_plans_choice_from_the_stored_calibration(monkeypatch):
    asked = []

    def stored(cfg, config, device, step, calibrate=True):
        asked.append(calibrate)
        return FLAT

    monkeypatch.setattr(run_speed, "step_time_model", stored)
    cfg = _cfg()
    quick = estimate(cfg, "cpu")
    plan = plan_run(cfg, int(cfg.budget_gb * GB), "cpu", confirm=False)
    assert quick.step.info["batch_size"] == plan.batch_by_bucket[128] == 1
    assert plan.buckets[-1].largest_fitting == 4  # the largest would be 4: the choice is visible
    assert "fastest micro-batch by this machine's measured step time" in quick.step.info["batch_choice"]
    assert asked[0] is False  # the estimate times nothing: a stored calibration or none


@pytest.mark.parametrize("choice", ["fastest", "largest"])
def test_without_a_stored_calibration_the_estimate_says_it_shows_the_largest(tmp_path, monkeypatch, choice):
    monkeypatch.setenv(step_time.CACHE_ENV, str(tmp_path))  # empty: nothing calibrated here
    quick = estimate(_cfg(batch_choice=choice), "cpu")
    assert quick.step.info["batch_size"] == 4
    words = quick.step.info["batch_choice"]
    assert words.startswith("the largest micro-batch that fits")
    assert ("once this machine's step time is measured" in words) == (choice == "fastest")
    assert not (tmp_path / "step_time.json").exists()  # nothing was timed for the estimate
