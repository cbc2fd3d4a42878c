"""Every text adapter variant merges into the base (peft's merge_and_unload) with the logits of
the unmerged adapter, exports merged through the app's export path, and generates in Try."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from bench.memory.adapter_variants import tiny_qwen2
from lora_gui.config import RunConfig, apply_overrides
from lora_gui.engine.export.run_export import export_run
from lora_gui.engine.generate import TextTrial, open_run
from lora_gui.engine.text.train import train_text
from lora_gui.models.adapters import AdapterSpec, attach_adapter

IDS = torch.tensor([[1, 5, 9, 12, 40, 7, 300, 2]])
VARIANTS = {"lora": {}, "dora": {}, "loha": {}, "lokr": {}, "oft": {}, "pissa": {"init": "pissa"}}


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    return tiny_qwen2(tmp_path_factory.mktemp("qwen2"))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_merged_variant_gives_the_unmerged_logits(qwen2_dir, name):
    kind = name if name != "pissa" else "lora"
    spec = AdapterSpec(kind, 4, 8.0, 0.0, False, VARIANTS[name].get("init", "default"), False)
    model = attach_adapter(AutoModelForCausalLM.from_pretrained(qwen2_dir, dtype=torch.float32), spec,
                           "all-linear", task_type="CAUSAL_LM").eval()
    torch.manual_seed(1)
    with torch.no_grad():  # as after training: every adapter tensor away from its initial value
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
        unmerged = model(input_ids=IDS).logits
        with model.disable_adapter():
            plain = model(input_ids=IDS).logits
        merged = model.merge_and_unload()(input_ids=IDS).logits
    assert not torch.allclose(unmerged, plain, atol=1e-4)  # the adapter changes the output
    torch.testing.assert_close(merged, unmerged, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("adapter", ["loha", "oft"])
def test_a_trained_variant_exports_merged_and_generates_in_try(qwen2_dir, tmp_path, adapter):
    cfg = apply_overrides(RunConfig(), {"model": str(qwen2_dir), "adapter": adapter, "max_steps": 1,
                                        "batch_size": 2, "max_seq_len": 32, "monitor_hz": 0.0,
                                        "precision": "fp32", "lora_rank": 4, "lr": 1e-2})
    train_text(cfg, tmp_path / "run", progress=False)
    trial = TextTrial(open_run(tmp_path / "run"), device="cpu")
    with torch.no_grad():
        adapted = trial.model(input_ids=IDS).logits
    out = export_run(tmp_path / "run", tmp_path / "merged", merged=True)
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=IDS).logits, adapted, atol=2e-5, rtol=1e-4)
    tuned = list(trial.stream("To be", adapter=True, max_new_tokens=4, temperature=0.0))
    plain = list(trial.stream("To be", adapter=False, max_new_tokens=4, temperature=0.0))
    assert tuned and plain  # the Try tab's stream: the adapter's answer and the base's
