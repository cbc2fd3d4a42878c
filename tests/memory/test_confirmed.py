"""The savings registry: which savings a run counts that no card has confirmed, and when an
answer at the edge of a card keeps its margin."""

from __future__ import annotations

from lora_gui.config import RunConfig
from lora_gui.memory.predict.confirmed import is_confirmed, margin_needed, unconfirmed


def names(cfg: RunConfig, changes: dict | None = None) -> list[str]:
    return [s.name for s in unconfirmed(cfg, changes)]


def test_the_rebuilds_count_as_unconfirmed_only_where_the_run_makes_them():
    assert names(RunConfig(mode="optimized")) == ["lean_backward rebuilds"]
    assert margin_needed(RunConfig(mode="optimized"))
    assert names(RunConfig(mode="traditional")) == [] and not margin_needed(RunConfig(mode="traditional"))
    assert names(RunConfig(mode="optimized", lean_backward="off")) == []


def test_head_groups_are_named_from_the_settings_or_the_answers_changes():
    off = RunConfig(mode="traditional")
    assert names(off, {"attention_head_groups": 2}) == ["attention_head_groups"]
    assert names(RunConfig(mode="traditional", attention_head_groups=2)) == ["attention_head_groups"]
    # a change that turns them off wins over the setting; the margin follows the rebuilds alone
    assert names(RunConfig(mode="traditional", attention_head_groups=2), {"attention_head_groups": 0}) == []
    assert not margin_needed(off, {"attention_head_groups": 2})


def test_card_confirmed_savings_name_their_run():
    assert is_confirmed("gradient_checkpointing") and is_confirmed("quantization=nf4")
    assert not is_confirmed("lean_backward rebuilds") and not is_confirmed("attention_head_groups")
