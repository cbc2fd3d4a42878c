"""The Plan tab's text: each suggestion says whether it fits the budget."""

from __future__ import annotations

from types import SimpleNamespace

from lora_gui.ui.tabs import plan_handlers

MIB = 2**20


def test_each_suggestion_says_whether_it_fits():
    result = SimpleNamespace(fits=False, message="does not fit at batch 1", buckets=[], suggestions=[
        SimpleNamespace(switch="gradient_checkpointing=True", peak_bytes=7_752 * MIB, fits=False),
        SimpleNamespace(switch="quantization=nf4", peak_bytes=3_000 * MIB, fits=True)])
    step = SimpleNamespace(peak_bytes=9_000 * MIB, breakdown={"weights": 9_000 * MIB}, cuda_overheads={})
    _, text, _, _ = plan_handlers._outputs(result, step, [], 8_000 * MIB, "cuda", "batch 1")
    assert "gradient_checkpointing=True: 7,752 MiB — does not fit the budget" in text
    assert "quantization=nf4: 3,000 MiB — fits the budget" in text
