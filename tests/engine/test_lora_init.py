"""Decomposing initialisations (lora_init pissa / olora) on a tiny Qwen2-family model: the
traced peak of the decomposition against the tracker's, the run's plan counting it when it is
the run's peak, a progress line, and a resume that loads the saved initialisation instead of
decomposing again (and continues to the same losses)."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from bench.memory.adapter_variants import tiny_qwen2
from lora_gui.config import RunConfig, apply_overrides
from lora_gui.engine.core.records import read_records
from lora_gui.engine.text import train as text_train
from lora_gui.memory.predict.init_trace import init_peak_bytes, measured_init
from lora_gui.models.adapters import INIT_FILE, AdapterSpec, attach_adapter

LOW, HIGH = 0.0, 0.03
# batch 1 of 16 tokens with checkpointing: the SVD of the widest weight is above the steps' peak
TINY = dict(max_steps=2, batch_size=1, max_seq_len=16, monitor_hz=0.0, eval_fraction=0.05,
            checkpoint_every=1, gradient_checkpointing=True, precision="fp32", warmup_steps=0, lr=1e-2,
            lora_rank=4, lora_init="pissa")


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    return tiny_qwen2(tmp_path_factory.mktemp("qwen2"))


@pytest.fixture(scope="module")
def wide_mlp_dir(tmp_path_factory):
    """MLP weights of 64 x 4096: their SVD outgrows a 16-token training step."""
    return tiny_qwen2(tmp_path_factory.mktemp("wide"), intermediate_size=4096)


@pytest.mark.parametrize("init", ["pissa", "olora"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_traced_decomposition_peak_is_the_measured_one(qwen2_dir, init, dtype):
    spec = AdapterSpec("lora", 4, 8.0, 0.0, False, init, False)
    predicted = init_peak_bytes(AutoConfig.from_pretrained(qwen2_dir), dtype=dtype,
                                target_modules="all-linear", spec=spec)
    model = AutoModelForCausalLM.from_pretrained(qwen2_dir, dtype=dtype)
    _, measured, source = measured_init(
        model, lambda: attach_adapter(model, spec, "all-linear", task_type="CAUSAL_LM"), torch.device("cpu"))
    assert source == "tracker"
    assert 0.0 <= predicted / measured - 1 <= HIGH, (predicted, measured)
    if dtype == torch.float32:
        assert predicted == measured  # the same tensors, exactly


def _run(cfg_over, out, **kw):
    cfg = apply_overrides(RunConfig(), cfg_over)
    return text_train.train_text(cfg, out, progress=False, **kw)


def test_pissa_run_counts_its_decomposition_and_resumes_without_repeating_it(wide_mlp_dir, tmp_path,
                                                                             monkeypatch, caplog):
    over = {**TINY, "model": str(wide_mlp_dir)}
    with caplog.at_level(logging.INFO, logger="lora_gui.models.adapters"):
        straight = _run(over, tmp_path / "straight")
    assert "lora_init pissa: 1 layers decomposed" in caplog.text  # the progress line
    assert straight["init_peak_bytes"] > straight["step_peak_bytes"]  # the SVD is this run's peak
    assert straight["peak_bytes"] == straight["init_peak_bytes"]
    assert straight["prediction"]["init_peak_bytes"] == straight["prediction"]["peak_bytes"]
    assert LOW <= straight["memory_report"]["predicted_vs_measured"] <= HIGH, straight["memory_report"]
    assert (tmp_path / "straight" / INIT_FILE).is_file()

    _run({**over, "max_steps": 1}, tmp_path / "resumed")
    from peft.tuners.lora.layer import LoraLayer

    real = LoraLayer.pissa_init

    def no_svd(layer, *a, **k):
        if not layer.get_base_layer().weight.is_meta:  # the plan's trace runs on the meta device
            raise AssertionError("a resume decomposed the weights again")
        return real(layer, *a, **k)

    monkeypatch.setattr(LoraLayer, "pissa_init", no_svd)
    cfg = json.loads((tmp_path / "resumed" / "config.json").read_text())
    resumed = _run({**cfg, "max_steps": 2}, tmp_path / "resumed", resume=True)
    assert resumed["status"] == "completed" and "init_peak_bytes" not in resumed
    # the resumed run's plan no longer counts a decomposition it does not run
    assert resumed["prediction"]["peak_bytes"] == straight["prediction"]["step_peak_bytes"]
    losses = [r["loss"] for r in read_records(tmp_path / "resumed" / "metrics.jsonl")]
    assert losses == pytest.approx([r["loss"] for r in read_records(tmp_path / "straight" / "metrics.jsonl")],
                                   rel=1e-5)
    saved = json.loads((tmp_path / "resumed" / "adapter" / "adapter_config.json").read_text())
    assert saved["init_lora_weights"] == "pissa"  # loading it elsewhere decomposes the original base
