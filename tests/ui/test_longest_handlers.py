"""The "Longest that fits" buttons: the Train tab fills max_seq_len and the switches, the Plan tab
shows the same answer (the planner's longest_text)."""

from __future__ import annotations

from lora_gui.config import RunConfig
from lora_gui.ui.tabs import longest_handlers


def test_train_tab_fills_the_length_and_switches(monkeypatch):
    monkeypatch.setattr("lora_gui.memory.predict.run_device", lambda: "cpu")
    values = {**RunConfig().to_dict(), "batch_size": 1, "precision": "fp32", "budget_gb": 0.05,
              "gradient_checkpointing": False}
    filled, text = longest_handlers.fill_form(values)
    assert 64 <= filled["max_seq_len"] <= 2048 and filled["max_seq_len"] % 64 == 0
    assert filled.get("gradient_checkpointing") is True, text
    assert set(filled) <= set(longest_handlers.FILLED)
    assert f"{filled['max_seq_len']:,} tokens" in text and "source: predicted" in text


def test_no_budget_and_bad_settings_are_said():
    filled, text = longest_handlers.fill_form({**RunConfig().to_dict(), "budget_gb": 0.0})
    assert filled == {} and "Set a VRAM budget" in text
    filled, text = longest_handlers.fill_form({**RunConfig().to_dict(), "lora_rank": -3})
    assert filled == {} and text.startswith("Error:") and "lora_rank" in text


def test_plan_tab_answers_for_the_8b_and_refuses_too_small_a_budget():
    text = longest_handlers.plan_tab("text-demo", "llama-3.1-8b", 4, "cuda", False, "none", "auto")
    assert text.startswith("Error:") and "the weights alone need" in text and "the budget is 4.00 GB" in text
