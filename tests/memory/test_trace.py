"""The fake-tensor trace against real CPU runs, across architectures and switches."""

from __future__ import annotations

import json

import pytest

from lora_gui.memory.predict.model_configs import (
    bundled_models,
    is_dit_config,
    is_unet_config,
    is_video_config,
    load_model_config,
)
from lora_gui.memory.predict.trace import CATEGORIES, CUDA_ALLOC_ROUNDING, trace_text_step, trace_unet_step

from .conftest import TEXT_CONFIGS, TINY_UNET, TINY_UNET_XL

CPU = {"device": "cpu", "dtype": "float32"}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_tiny_llama_trace_matches_real_cpu_run(llama_cfg, attn):
    kw = dict(batch_size=2, seq_len=128, attn_implementation=attn, **CPU)
    fake = trace_text_step(llama_cfg, **kw)
    real = trace_text_step(llama_cfg, fake=False, warm_steps=1, **kw)  # real tensors, 2nd step measured
    assert real.info["source"] == "tracker"
    assert abs(fake.traced_peak_bytes / real.traced_peak_bytes - 1) < 0.03
    assert fake.breakdown == real.breakdown


@pytest.mark.parametrize("name", sorted(TEXT_CONFIGS))
def test_every_architecture_traces_and_breakdown_sums(name):
    res = trace_text_step(TEXT_CONFIGS[name], batch_size=1, seq_len=64, **CPU)
    assert set(res.breakdown) == set(CATEGORIES)
    assert sum(res.breakdown.values()) == res.traced_peak_bytes == res.peak_bytes  # cpu: no overheads
    assert res.breakdown["frozen_weights"] > 0 and res.breakdown["lora_params"] > 0
    assert res.breakdown["activations"] > 0


def test_steady_state_shortcut_equals_a_real_second_step(llama_cfg):
    kw = dict(batch_size=1, seq_len=64, **CPU)
    shortcut = trace_text_step(llama_cfg, **kw)  # AdamW state materialized
    assert shortcut.breakdown == trace_text_step(llama_cfg, warm_steps=1, **kw).breakdown


def test_optimizer_state_is_two_moments_plus_step_scalars(llama_cfg):
    res = trace_text_step(llama_cfg, batch_size=1, seq_len=64, **CPU)
    n_lora_tensors = 2 * 7 * llama_cfg.num_hidden_layers  # lora_A + lora_B on 7 linears per layer
    assert res.breakdown["optimizer_state"] == 2 * res.breakdown["lora_params"] + 4 * n_lora_tensors


def test_switches_move_the_peak_the_right_way(llama_cfg):
    def act(**kw):
        return trace_text_step(llama_cfg, batch_size=2, seq_len=256, **{**CPU, **kw}).breakdown["activations"]

    assert act(attn_implementation="eager") > act(attn_implementation="sdpa")  # S x S scores
    assert act(gradient_checkpointing=True) < 0.5 * act()
    bf16 = trace_text_step(llama_cfg, batch_size=1, seq_len=64, device="cpu", dtype="bfloat16")
    fp32 = trace_text_step(llama_cfg, batch_size=1, seq_len=64, **CPU)
    assert bf16.breakdown["frozen_weights"] * 2 == pytest.approx(fp32.breakdown["frozen_weights"], rel=0.01)
    assert bf16.breakdown["lora_params"] == fp32.breakdown["lora_params"]  # peft keeps LoRA in float32


def test_cuda_overheads_reported_separately(llama_cfg):
    res = trace_text_step(llama_cfg, batch_size=1, seq_len=64)
    o = res.cuda_overheads
    assert res.peak_bytes == res.traced_peak_bytes + sum(o.values())
    assert o["cuda_context"] > 0 and o["cublas_workspace"] > 0
    assert 0 < o["allocator_rounding"] < CUDA_ALLOC_ROUNDING * res.info["allocations"]
    assert res.reserved_peak_bytes == res.peak_bytes - o["cuda_context"]
    assert res.allocator_peak_bytes == res.reserved_peak_bytes - o["allocator_cache"]
    replay = res.info["allocator_replay"]  # a tiny model: 2 MiB pages hold far more than it needs
    assert replay["expandable_segments"]  # what runs use (PYTORCH_CUDA_ALLOC_CONF unset here)
    # a capped run needs the pages that hold live blocks; uncapped, freed pages stay mapped
    assert o["allocator_cache"] == replay["peak_pages"] - replay["peak_allocated"] > 0
    assert replay["peak_pages"] <= replay["peak_reserved"]
    assert replay["peak_reserved"] % (2 * 2**20) == 0  # pages are 2 MiB (small pool) or 20 MiB


@pytest.mark.parametrize("cfg", [TINY_UNET, TINY_UNET_XL], ids=["sd-like", "sdxl-like"])
def test_tiny_unet_trace_matches_real_cpu_run(cfg):
    kw = dict(batch_size=1, resolution=64, text_seq_len=8, **CPU)
    fake = trace_unet_step(cfg, **kw)
    real = trace_unet_step(cfg, fake=False, warm_steps=1, **kw)
    assert abs(fake.traced_peak_bytes / real.traced_peak_bytes - 1) < 0.03
    bigger = trace_unet_step(cfg, batch_size=1, resolution=128, text_seq_len=8, **CPU)
    assert bigger.breakdown["activations"] > 2 * fake.breakdown["activations"]


def test_sd15_unet_frozen_weights_are_its_860m_params():
    res = trace_unet_step("sd15-unet", batch_size=1, resolution=512)
    assert res.breakdown["frozen_weights"] / 2 == pytest.approx(859.5e6, rel=0.01)  # bf16 weights


def test_bundled_configs_load_and_unknown_names_say_what_is_supported(tmp_path):
    wanted = {"llama-3.1-8b", "qwen2.5-0.5b", "qwen2.5-7b", "mistral-7b", "gemma-2-2b", "llama-2-7b",
              "sd15-unet", "sdxl-unet"}
    assert wanted <= set(bundled_models())
    for name in bundled_models():
        cfg = load_model_config(name)
        assert is_unet_config(cfg) or is_dit_config(cfg) or is_video_config(cfg) or cfg.num_hidden_layers > 0
    assert load_model_config("mistral-7b").sliding_window == 4096
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 64}))
    assert load_model_config(tmp_path).hidden_size == 64
    with pytest.raises(ValueError, match="supported"):
        load_model_config("no-such-model")
    with pytest.raises(ValueError, match="supported"):
        load_model_config({"model_type": "bert-like-thing"})


def test_bad_arguments_are_rejected(llama_cfg):
    with pytest.raises(ValueError, match="batch_size"):
        trace_text_step(llama_cfg, batch_size=0, seq_len=8)
    with pytest.raises(ValueError, match="attn_implementation"):
        trace_text_step(llama_cfg, batch_size=1, seq_len=8, attn_implementation="flash")
    with pytest.raises(ValueError, match="multiple of 8"):
        trace_unet_step(TINY_UNET, batch_size=1, resolution=100)
