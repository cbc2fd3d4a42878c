"""Planner: batch per bucket under a budget, suggestions, what fits where, bad budgets."""

from __future__ import annotations

import pytest

from lora_gui.memory.predict.estimate import estimate_text_step
from lora_gui.memory.predict.planner import GB, check_budget, plan_image, plan_text, what_fits_where
from lora_gui.memory.predict.trace import trace_text_step

from .conftest import TINY_UNET, tiny_llama

STEP = {"device": "cpu", "dtype": "float32"}


def test_plan_text_picks_the_largest_batch_that_the_trace_confirms():
    cfg = tiny_llama(vocab=2000)
    budget = trace_text_step(cfg, batch_size=3, seq_len=256, **STEP).peak_bytes + 1000
    plan = plan_text(cfg, budget, [128, 256], effective_batch=8, **STEP)
    by = plan.batch_by_bucket
    assert by[256] >= 1 and by[128] >= by[256]
    for b in plan.buckets:
        assert b.confirmed_by_trace and b.peak_bytes <= budget
        assert b.micro_batch * b.grad_accum >= 8 and (b.micro_batch * (b.grad_accum - 1)) < 8
        over = estimate_text_step(cfg, batch_size=b.micro_batch + 1, seq_len=b.bucket, **STEP).peak_bytes
        assert over > budget  # one more sequence would not fit
    assert plan.fits and plan.suggestions == []


def test_budget_below_frozen_weights_says_what_is_needed():
    plan = plan_text("llama-3.1-8b", 8 * GB, [1024], confirm=False)
    assert not plan.fits and plan.batch_by_bucket == {1024: 0}
    assert "does not fit even at batch 1: needs" in plan.message
    assert plan.min_bytes_needed > 16 * GB


def test_suggestions_name_switches_with_savings():
    plan = plan_text("llama-3.1-8b", 40 * GB, [4096], confirm=False, attn_implementation="eager")
    names = {s.switch: s for s in plan.suggestions}
    assert "gradient_checkpointing=True" in names and names["gradient_checkpointing=True"].fits
    assert names["attn_implementation='sdpa'"].saving_bytes > 0
    assert names["windowed attention (window 512)"].saving_bytes > 0
    assert any(k.startswith("max length") for k in names)
    assert all(s.saving_bytes > 0 for s in plan.suggestions)


@pytest.mark.parametrize("bad", [-1, 0, 3e12, float("nan"), "8GB"])
def test_bad_budgets_are_rejected(bad):
    with pytest.raises(ValueError, match="budget_bytes"):
        check_budget(bad)
    with pytest.raises(ValueError):
        plan_text("qwen2.5-0.5b", bad, [256], confirm=False)


def test_what_fits_where_grows_with_the_card():
    rows = what_fits_where("llama-3.1-8b", chosen=2048)
    assert [r.card_gb for r in rows] == [8, 12, 16, 24, 40, 48, 80]
    assert rows[0].longest is None and rows[0].batch_at_chosen == 0  # 16 GB of weights
    longest = [r.longest or 0 for r in rows]
    assert longest == sorted(longest) and longest[-1] % 256 == 0 and longest[-1] > 2048
    # bf16 weights, no checkpointing: 2,048 tokens need ~34 GB on a card with the reserved memory
    # and the CUDA context counted (the trace says 32,049 MiB = 33.6 GB with LoRA keeping its bf16
    # inputs; 41.8 GB with a float32 copy per adapter), so the 40 GB card is the first to fit
    assert rows[-1].batch_at_chosen >= rows[4].batch_at_chosen >= 1 and rows[3].batch_at_chosen == 0


def test_plan_image_for_tiny_unet():
    kw = {"device": "cpu", "dtype": "float32", "text_seq_len": 8}
    plan = plan_image(TINY_UNET, 2 * GB, [512, 1024], effective_batch=4, **kw)
    by = plan.batch_by_bucket
    assert by[512] > by[1024] >= 1
    assert all(b.peak_bytes <= 2 * GB for b in plan.buckets)
