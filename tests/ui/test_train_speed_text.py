"""The Train form names the micro-batch its quick estimate is for and the plan's predicted speed."""

from __future__ import annotations

from types import SimpleNamespace

from lora_gui.ui.tabs.train_prediction_handlers import _batch_and_speed


def test_the_quick_estimate_says_which_micro_batch_it_shows():
    step = SimpleNamespace(info={"batch_size": 4, "seq_len": 128,
                                 "batch_choice": "the largest micro-batch that fits: the run's plan picks"})
    text = _batch_and_speed(SimpleNamespace(how="estimate", step=step, figures={}))
    assert "Micro-batch 4 at 128 tokens: the largest micro-batch that fits" in text


def test_the_runs_plan_shows_its_predicted_tokens_per_s_and_mfu():
    figures = {"predicted_tokens_per_s": 1520.4, "predicted_mfu": 0.123}
    text = _batch_and_speed(SimpleNamespace(how="plan", step=SimpleNamespace(info={}), figures=figures))
    assert "1,520 tokens/s" in text and "MFU 12.3%" in text
    assert _batch_and_speed(SimpleNamespace(how="plan", step=None, figures={})) == ""
