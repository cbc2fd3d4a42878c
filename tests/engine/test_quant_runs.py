"""Quantized (nf4 / int8) text runs on CPU with real bitsandbytes layers: train, resume, export."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("bitsandbytes")

from lora_gui.config import ConfigError, RunConfig, apply_overrides  # noqa: E402
from lora_gui.engine.text.train import train_text  # noqa: E402

TINY = dict(max_steps=2, batch_size=4, max_seq_len=64, monitor_hz=0.0, eval_fraction=0.02,
            checkpoint_every=1, precision="fp32", warmup_steps=0, lr=1e-2)


def _cfg(**kw) -> RunConfig:
    return apply_overrides(RunConfig(), {**TINY, **kw})


def _folder_digest(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file()}


def test_nf4_run_with_8bit_optimizer_trains_and_adapter_loads_on_full_base(tmp_path, monkeypatch):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from lora_gui.config import BUILTIN_MODEL_DIR
    from lora_gui.engine.core.distributed import INJECT_OOM_ENV

    monkeypatch.setenv(INJECT_OOM_ENV, "0:2")  # step 2 runs out of memory once: the guard splits it
    cfg = _cfg(quantization="nf4", optimizer="adamw8bit", token_budget=128)
    summary = train_text(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed"
    assert [e["event"] for e in summary["oom_events"]] == ["oom"]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["micro_batches"] >= 2 for r in records)  # token budget 128
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records)

    adapter = tmp_path / "run" / "adapter"
    saved = load_file(adapter / "adapter_model.safetensors")
    assert saved and any("lora_B" in k and v.abs().sum() > 0 for k, v in saved.items())  # it learned
    base = AutoModelForCausalLM.from_pretrained(BUILTIN_MODEL_DIR, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter)  # the unquantized base
    loaded = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    key = next(k for k in saved if "lora_B" in k)
    match = [k for k in loaded if k.replace(".default", "") == key]
    assert match and torch.equal(loaded[match[0]], saved[key])
    ids = torch.tensor([[1, 5, 9, 12]])
    assert torch.isfinite(model(input_ids=ids).logits).all()


def test_int8_run_resumes_and_refuses_another_quantization(tmp_path):
    out = tmp_path / "run"
    cfg = _cfg(quantization="int8", gradient_checkpointing=True)
    assert train_text(cfg, out, progress=False)["status"] == "completed"
    resumed = train_text(apply_overrides(cfg, {"max_steps": 3}), out, resume=True, progress=False)
    assert resumed["status"] == "completed" and resumed["steps"] == 3
    before = _folder_digest(out)
    with pytest.raises(ConfigError, match="quantization 'int8' then, 'nf4' now.*nothing was changed"):
        train_text(apply_overrides(cfg, {"max_steps": 4, "quantization": "nf4"}), out, resume=True,
                   progress=False)
    with pytest.raises(ConfigError, match="optimizer 'adamw' then, 'adamw8bit' now"):
        train_text(apply_overrides(cfg, {"max_steps": 4, "optimizer": "adamw8bit"}), out, resume=True,
                   progress=False)
    assert _folder_digest(out) == before


def _lora_grads(model, ids) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_eval_then_train_then_eval_keeps_gradients(tmp_path):
    """bitsandbytes repacks 4-bit weights for inference on some CPUs (no backward): switched off."""
    import bitsandbytes as bnb

    from lora_gui.data.text import TokenizedSample
    from lora_gui.engine.text.train import evaluate
    from lora_gui.models import text as text_models

    cfg = _cfg(quantization="nf4")
    source = text_models.resolve_model_source("builtin")
    model = text_models.attach_lora(text_models.load_model_for(cfg, source, torch.float32), cfg)
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert layers and not any(m.support_avx512bf16_for_cpu for m in layers)
    torch.manual_seed(0)
    ids = torch.randint(4, 4000, (2, 32))
    with torch.no_grad():  # peft starts lora_B at 0 (then lora_A gets no gradient)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    model.train()
    before = _lora_grads(model, ids)
    samples = [TokenizedSample(ids[0].tolist(), ids[0].tolist())]
    first = evaluate(model, samples, 0, torch.device("cpu"))
    after = _lora_grads(model, ids)
    assert first is not None and evaluate(model, samples, 0, torch.device("cpu")) == pytest.approx(first)
    assert before.keys() == after.keys()
    for name in before:
        assert torch.allclose(before[name], after[name], atol=1e-6), name
    first_layer = [n for n in before if "layers.0." in n and "lora_A" in n]
    assert first_layer and all(before[n].abs().sum() > 0 for n in first_layer)  # grad reaches layer 0


# -- bad input ---------------------------------------------------------------------------------
def test_missing_bitsandbytes_says_what_to_install(monkeypatch):
    import importlib.util

    from lora_gui.models.quant import check_bitsandbytes
    from lora_gui.models.text import ModelError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n == "bitsandbytes" else real(n, *a))
    with pytest.raises(ModelError, match="pip install bitsandbytes==0.50.2"):
        check_bitsandbytes("nf4", torch.device("cpu"))


def test_cpu_without_avx2_and_int8_fp16_on_cpu_are_refused(monkeypatch):
    from lora_gui.models.quant import check_bitsandbytes
    from lora_gui.models.text import ModelError

    with pytest.raises(ModelError, match="int8 with precision fp16 does not run on a CPU"):
        check_bitsandbytes("int8", torch.device("cpu"), "fp16")
    check_bitsandbytes("nf4", torch.device("cpu"), "fp16")  # nf4 dequantizes to fp16: allowed
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    with pytest.raises(ModelError, match="needs AVX2.*DEFAULT.*quantization: none"):
        check_bitsandbytes("nf4", torch.device("cpu"))


def test_layer_that_cannot_be_quantized_is_named():
    from transformers import GPT2Config, GPT2LMHeadModel

    from lora_gui.models.quant import check_quantized
    from lora_gui.models.text import ModelError

    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50, n_positions=16))
    with pytest.raises(ModelError, match=r"'transformer.h.0.attn.c_attn' \(Conv1D\) cannot be quantized"):
        check_quantized(model, "nf4")


def test_fsdp_takes_nf4_and_refuses_int8_offload_on_cpu_and_images(monkeypatch):
    from lora_gui.models.quant import check_fsdp
    from lora_gui.models.text import ModelError

    cpu = torch.device("cpu")
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    assert check_fsdp("nf4", cpu) is False
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.delenv("FSDP_OFFLOAD_PARAMS", raising=False)
    assert check_fsdp("nf4", cpu) is True
    with pytest.raises(ModelError, match="int8 is not supported with FSDP"):
        check_fsdp("int8", cpu)
    monkeypatch.setenv("FSDP_OFFLOAD_PARAMS", "true")
    with pytest.raises(ModelError, match="fsdp_offload_params: true does nothing on a CPU"):
        check_fsdp("nf4", cpu)
    with pytest.raises(ConfigError, match="quantization: nf4 is not built for image runs"):
        apply_overrides(RunConfig(), {"task": "image", "quantization": "nf4"})
