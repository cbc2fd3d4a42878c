"""Windowed attention as a run setting: validation at config time, and a real training run."""

import json

import pytest

from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.engine.text.train import train_text
from lora_gui.models.text import ModelError


def test_window_above_max_seq_len_is_refused():
    with pytest.raises(ConfigError, match="window: 512 is above max_seq_len 256"):
        apply_overrides(RunConfig(), {"attention": "windowed", "window": 512, "max_seq_len": 256})
    with pytest.raises(ConfigError, match="window"):
        apply_overrides(RunConfig(), {"attention": "windowed", "window": 0})
    with pytest.raises(ConfigError, match="global_tokens"):
        apply_overrides(RunConfig(), {"attention": "windowed", "global_tokens": -1})


def test_unsupported_model_class_is_named_before_weights_load(tmp_path, small_corpus):
    model_dir = tmp_path / "bloom"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(
        {"model_type": "bloom", "architectures": ["BloomForCausalLM"], "n_layer": 1, "n_head": 2,
         "hidden_size": 16, "vocab_size": 64}), encoding="utf-8")
    cfg = apply_overrides(RunConfig(), {"attention": "windowed", "model": str(model_dir),
                                        "data": str(small_corpus), "window": 8, "max_seq_len": 64})
    with pytest.raises(ModelError, match="Bloom"):  # no weights file exists: it never got that far
        from lora_gui.models.text import load_model_for

        load_model_for(cfg, str(model_dir))


def test_windowed_training_run_reports_full_attention_eval(tmp_path, small_corpus):
    cfg = apply_overrides(RunConfig(), {"attention": "windowed", "window": 4, "global_tokens": 1,
                                        "data": str(small_corpus), "max_seq_len": 64, "batch_size": 4,
                                        "max_steps": 2, "eval_fraction": 0.25})  # eval docs > W
    run = train_text(cfg, tmp_path / "w", progress=False)
    assert run["status"] == "completed"
    assert run["eval_loss"] is not None and run["eval_loss_full_attention"] is not None
    assert run["eval_loss"] != run["eval_loss_full_attention"]  # the window really changes attention
