"""The trace and the estimate with a quantized base (nf4 / int8) and 8-bit optimizer states,
checked against the engine's own bitsandbytes model on real CPU tensors (source: tracker)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("bitsandbytes")

from bench.memory.quant_measure import engine_step_peak, save_random_model  # noqa: E402
from lora_gui.memory.predict import planner  # noqa: E402
from lora_gui.memory.predict.estimate import estimate_text_step  # noqa: E402
from lora_gui.memory.predict.quant import optimizer_state_bytes, quantized_linear_bytes  # noqa: E402
from lora_gui.memory.predict.trace import trace_text_step  # noqa: E402
from tests.memory.conftest import TEXT_CONFIGS  # noqa: E402

CPU = dict(batch_size=2, seq_len=128, dtype="float32", device="cpu", lora_rank=8)


@pytest.mark.parametrize("name,quantization,checkpointing", [
    ("llama", "nf4", True), ("qwen2", "int8", False), ("mistral", "nf4", False), ("llama", "int8", True)])
def test_trace_matches_the_engines_quantized_step(name, quantization, checkpointing):
    cfg = TEXT_CONFIGS[name]
    fake = trace_text_step(cfg, quantization=quantization, gradient_checkpointing=checkpointing, **CPU)
    real = engine_step_peak(cfg, quantization=quantization, batch_size=2, seq_len=128,
                            gradient_checkpointing=checkpointing, lora_rank=8)
    assert -0.01 <= fake.traced_peak_bytes / real - 1 <= 0.03, (fake.traced_peak_bytes, real)
    plain = trace_text_step(cfg, gradient_checkpointing=checkpointing, **CPU)
    assert fake.breakdown["frozen_weights"] < plain.breakdown["frozen_weights"]


@pytest.mark.parametrize("quantization,double_quant", [("nf4", True), ("nf4", False), ("int8", True)])
def test_quantized_storage_is_the_loaders(tmp_path, quantization, double_quant):
    """Weights + quantization state of transformers' loaded model = the trace's frozen bytes."""
    from lora_gui.config import RunConfig, apply_overrides
    from lora_gui.models import text as text_models
    from lora_gui.models.quant import quant_state_tensors

    cfg = TEXT_CONFIGS["llama"]
    save_random_model(cfg, str(tmp_path))
    run = apply_overrides(RunConfig(), {"quantization": quantization, "double_quant": double_quant})
    model = text_models.load_model_for(run, str(tmp_path), torch.float32)
    tensors = list(model.parameters()) + list(model.buffers()) + quant_state_tensors(model)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    trace = trace_text_step(cfg, quantization=quantization, double_quant=double_quant, **CPU)
    assert trace.breakdown["frozen_weights"] == sum(storages.values())
    est = estimate_text_step(cfg, quantization=quantization, double_quant=double_quant, **CPU)
    assert est.breakdown["frozen_weights"] == pytest.approx(trace.breakdown["frozen_weights"], rel=0.002)


def test_nf4_is_about_half_a_byte_per_weight_and_double_quant_saves():
    n_in, n_out = 4096, 14336  # a Llama-3 MLP projection
    nf4 = quantized_linear_bytes(n_in, n_out, "nf4", double_quant=True)
    assert 0.5 < nf4 / (n_in * n_out) < 0.52
    assert quantized_linear_bytes(n_in, n_out, "nf4", double_quant=False) / (n_in * n_out) > 0.56
    assert quantized_linear_bytes(n_in, n_out, "int8") == n_in * n_out + 4 * n_out


def test_8bit_optimizer_state_in_trace_and_estimate():
    cfg = TEXT_CONFIGS["llama"]
    kw = dict(CPU, lora_rank=32)  # 32 x 128 = 4,096 values a matrix: 8-bit states
    adamw = trace_text_step(cfg, **kw)
    eight = trace_text_step(cfg, optimizer="adamw8bit", **kw)
    assert eight.breakdown["optimizer_state"] < adamw.breakdown["optimizer_state"] / 2
    est = estimate_text_step(cfg, optimizer="adamw8bit", **kw)
    assert est.breakdown["optimizer_state"] == eight.breakdown["optimizer_state"]
    big = 16 * 4096  # a LoRA matrix of a 4096-wide model: 8-bit states, 2 bytes + absmax
    assert optimizer_state_bytes([big], "adamw8bit") == 2 * 256 * 4 + 2 * big + 2 * 4 * big // 256
    assert optimizer_state_bytes([100], "adamw8bit") == 2 * 256 * 4 + 800  # small: float32


def test_plan_suggests_nf4_when_bf16_does_not_fit():
    plan = planner.plan_text("llama-3.1-8b", 16e9, [2048], effective_batch=1, max_batch=1, confirm=False,
                             gradient_checkpointing=True, lora_rank=8, dtype="bfloat16")
    assert not plan.fits
    nf4 = next(s for s in plan.suggestions if s.switch == "quantization=nf4")
    assert nf4.fits and nf4.saving_bytes > 8e9  # the 4-bit base saves most of the 15 GB of weights
    rows = planner.what_fits_where("llama-3.1-8b", chosen=2048, cards_gb=(16, 24), gpu_counts=(),
                                   gradient_checkpointing=True, lora_rank=8, dtype="bfloat16")
    assert rows[0].by_quantization["none"][0] is None and rows[0].by_quantization["nf4"][0] >= 2048
    assert rows[1].by_quantization["nf4"][0] > rows[1].by_quantization["int8"][0] > 0
