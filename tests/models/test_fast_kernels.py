"""Fast kernels on CUDA: when each one runs, its one log line where it cannot, its wiring, and
the plan's rows for them."""

from __future__ import annotations

import logging
import sys
from types import ModuleType

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.memory.predict.cuda_kernels import NOT_COUNTED, describe_rows, fast_kernel_rows
from lora_gui.models import fast_kernels
from lora_gui.models.fast_kernels import apply_liger, compile_blocks, compile_choice, liger_choice


def tiny() -> LlamaForCausalLM:
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1))


@pytest.fixture()
def fake_liger(monkeypatch):
    """A stand-in for liger_kernel.transformers that records the patch it is asked for."""
    calls = []
    package, transformers_mod = ModuleType("liger_kernel"), ModuleType("liger_kernel.transformers")
    transformers_mod._apply_liger_kernel_to_instance = lambda **kw: calls.append(kw)
    monkeypatch.setitem(sys.modules, "liger_kernel", package)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", transformers_mod)
    monkeypatch.setattr(fast_kernels, "liger_installed", lambda: True)
    return calls


def test_liger_runs_only_on_cuda_with_the_package_and_a_model_it_patches(monkeypatch):
    monkeypatch.setattr(fast_kernels, "liger_installed", lambda: False)
    assert liger_choice("off", "cuda", "llama").reason == "off"
    assert "CUDA GPU" in liger_choice("auto", "cpu", "llama").reason
    assert "not installed" in liger_choice("on", "cuda", "llama").reason
    monkeypatch.setattr(fast_kernels, "liger_installed", lambda: True)
    assert liger_choice("auto", "cuda", "llama").used
    assert "'gpt2'" in liger_choice("on", "cuda", "gpt2").reason


def test_liger_is_not_importable_here_and_a_cpu_run_says_so_once(caplog):
    model = tiny()
    with caplog.at_level(logging.INFO, logger=fast_kernels.__name__):
        choice = apply_liger(model, "auto", "cpu", chunked_loss=True)
    assert not choice.used
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["liger_kernels=auto: not used, its Triton kernels need a CUDA GPU"]


def test_liger_patches_the_model_with_the_fused_loss_only_without_the_chunked_loss(fake_liger):
    model = tiny()
    assert apply_liger(model, "auto", "cuda", chunked_loss=True).used
    assert apply_liger(model, "on", "cuda", chunked_loss=False).used
    assert [c["model"] is model for c in fake_liger] == [True, True]
    assert [c["fused_linear_cross_entropy"] for c in fake_liger] == [False, True]
    assert all(c["rope"] and c["rms_norm"] and c["swiglu"] and not c["cross_entropy"] for c in fake_liger)


def test_off_never_patches(fake_liger):
    assert not apply_liger(tiny(), "off", "cuda", chunked_loss=False).used and fake_liger == []


def test_compile_wraps_every_decoder_block_on_cuda_and_none_on_a_cpu(caplog):
    model = tiny()
    with caplog.at_level(logging.INFO, logger=fast_kernels.__name__):
        assert not compile_blocks(model, "on", "cpu").used
    assert len(caplog.records) == 1 and "eagerly" in caplog.records[0].getMessage()
    assert all(getattr(b, "_compiled_call_impl", None) is None for b in model.model.layers)
    choice = compile_blocks(model, "auto", "cuda")  # wraps only: Inductor compiles on the first call
    assert choice.used and all(b._compiled_call_impl is not None for b in model.model.layers)
    assert not compile_choice("off", "cuda").used


def test_a_model_without_decoder_blocks_is_named():
    import torch

    choice = compile_blocks(torch.nn.Linear(2, 2), "on", "cuda")
    assert choice.reason == "no decoder blocks found in the model"


def test_the_plan_lists_the_fast_kernels_as_not_counted():
    rows = fast_kernel_rows(liger=True, compiled=True)
    assert [r.kernel for r in rows] == ["liger_kernels", "torch_compile"]
    assert all(r.nbytes == 0 and r.lifetime.startswith(NOT_COUNTED) for r in rows)
    assert all(NOT_COUNTED in line for line in describe_rows(rows))
    assert fast_kernel_rows(liger=False, compiled=False) == []


def test_the_kernel_settings_are_declared():
    cfg = RunConfig()
    assert (cfg.liger_kernels, cfg.compile_blocks) == ("auto", "auto")
    for name in ("liger_kernels", "compile_blocks"):
        with pytest.raises(ConfigError, match=name):
            apply_overrides(cfg, {name: "fast"})
