"""Adapter variants (DoRA, LoHa, LoKr, OFT, rsLoRA, PiSSA, LoRA-FA, LoRA+): tiny text runs on a
Qwen2-family model saved with save_pretrained. Each run's predicted peak must be within
-1%...+3% of the peak it measures (run.json); its saved adapter folder must say it is the variant
asked for (adapter_config.json and the tensor names in adapter_model.safetensors: a DoRA run that
trained plain LoRA fails here), and loaded back with peft onto the base model, it must give the
logits the trained model gave at the end of training."""

from __future__ import annotations

import json

import pytest
import torch

from bench.memory.adapter_variants import tiny_qwen2
from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.engine.text import train as text_train

LOW, HIGH = 0.0, 0.03  # predicted / measured - 1
TINY = dict(max_steps=2, batch_size=4, max_seq_len=64, monitor_hz=0.0, eval_fraction=0.05,
            checkpoint_every=1000, precision="fp32", warmup_steps=0, lr=1e-2, lora_rank=4)
IDS = torch.tensor([[1, 5, 9, 12, 40, 7, 300, 2]])
VARIANTS = {
    "dora": {"adapter": "dora"},
    "loha": {"adapter": "loha"},
    "lokr": {"adapter": "lokr"},
    "oft": {"adapter": "oft"},
    "rslora-pissa": {"rslora": True, "lora_init": "pissa"},
    "lora-fa": {"lora_fa": True},
    "lora-plus": {"lora_plus_ratio": 16.0},
}
# What each variant's saved adapter folder must say: adapter_config.json's fields, and a piece of
# a tensor name that only that method writes (None: a plain LoRA layout, no DoRA magnitudes).
# LoRA+ changes only the optimizer's learning rates, so its adapter is plain LoRA on disk.
PLAIN = {"peft_type": "LORA", "use_dora": False, "use_rslora": False, "init_lora_weights": True}
SAVED = {
    "dora": ({**PLAIN, "use_dora": True}, "lora_magnitude_vector"),
    "loha": ({"peft_type": "LOHA", "r": 4}, "hada_"),
    "lokr": ({"peft_type": "LOKR", "r": 4}, "lokr_"),
    "oft": ({"peft_type": "OFT", "oft_block_size": 4}, "oft_"),
    "rslora-pissa": ({**PLAIN, "use_rslora": True, "init_lora_weights": "pissa"}, None),
    "lora-fa": (PLAIN, None),
    "lora-plus": (PLAIN, None),
}


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    """A tiny Qwen2-family model saved with save_pretrained (the variants bench's own)."""
    return tiny_qwen2(tmp_path_factory.mktemp("qwen2"))


def _run(tmp_path, monkeypatch, model_dir, **overrides):
    """Trains; returns (summary, logits of IDS from the trained model just before it is saved,
    whether any lora_A matrix was trainable then)."""
    cfg = apply_overrides(RunConfig(), {**TINY, "model": str(model_dir), **overrides})
    seen = {}
    save = text_train._save_adapter

    def save_and_look(model, out):
        model.eval()
        with torch.no_grad():
            seen["logits"] = model(input_ids=IDS).logits.float()
        # LoRA-FA leaves no mark in the saved files: its A matrices are frozen in the model
        seen["a_trained"] = any(p.requires_grad for n, p in model.named_parameters() if ".lora_A." in n)
        return save(model, out)

    monkeypatch.setattr(text_train, "_save_adapter", save_and_look)
    summary = text_train.train_text(cfg, tmp_path / "run", progress=False)
    return summary, seen["logits"], seen["a_trained"]


def _check_saved_variant(adapter_dir, expected: dict, marker: str | None) -> None:
    """The adapter folder is the variant asked for: adapter_config.json's fields as ``expected``,
    and ``marker`` in some tensor name (None: no DoRA magnitude, LoHa, LoKr or OFT tensor)."""
    from safetensors import safe_open

    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert {k: config.get(k) for k in expected} == expected, config
    with safe_open(adapter_dir / "adapter_model.safetensors", "pt") as saved:
        names = list(saved.keys())
    others = [m for _, m in SAVED.values() if m]
    if marker is None:
        assert names and all(".lora_A." in n or ".lora_B." in n for n in names), names[:4]
    else:
        assert any(marker in n for n in names), names[:4]
        assert not any(m in n for n in names for m in others if m != marker), names[:4]


def _loaded_logits(model_dir, adapter_dir) -> torch.Tensor:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    with torch.no_grad():
        return model(input_ids=IDS).logits.float()


def _check_prediction(summary) -> None:
    report = summary["memory_report"]
    assert report["source"] == "tracker" and report["predicted_source"] == "predicted"
    error = report["predicted_vs_measured"]
    assert LOW <= error <= HIGH, (error, summary["prediction"])


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_is_planned_and_loads_back(variant, qwen2_dir, tmp_path, monkeypatch):
    summary, trained, a_trained = _run(tmp_path, monkeypatch, qwen2_dir, **VARIANTS[variant])
    assert summary["status"] == "completed"
    _check_saved_variant(tmp_path / "run" / "adapter", *SAVED[variant])
    if SAVED[variant][0]["peft_type"] == "LORA":
        assert a_trained == (variant != "lora-fa")
    _check_prediction(summary)
    saved = json.loads((tmp_path / "run" / "run.json").read_text())
    report = summary["memory_report"]
    assert saved["memory_report"]["predicted_vs_measured"] == report["predicted_vs_measured"]
    assert saved["config"]["adapter"] == VARIANTS[variant].get("adapter", "lora")
    loaded = _loaded_logits(qwen2_dir, tmp_path / "run" / "adapter")
    assert torch.allclose(loaded, trained, atol=1e-4, rtol=1e-4), (loaded - trained).abs().max()
    assert not torch.allclose(loaded, _base_logits(qwen2_dir), atol=1e-3)  # the adapter learned


def _base_logits(model_dir) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)(input_ids=IDS).logits


def test_dora_on_an_nf4_base_trains_and_is_planned(qwen2_dir, tmp_path, monkeypatch):
    """QDoRA: DoRA's magnitude and dense product on bitsandbytes 4-bit layers."""
    pytest.importorskip("bitsandbytes")
    summary, _, _ = _run(tmp_path, monkeypatch, qwen2_dir, adapter="dora", quantization="nf4")
    assert summary["status"] == "completed"
    _check_saved_variant(tmp_path / "run" / "adapter", *SAVED["dora"])
    _check_prediction(summary)
    records = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(records) == 2 and all(torch.isfinite(torch.tensor(json.loads(r)["loss"])) for r in records)


@pytest.mark.parametrize(("overrides", "words"), [
    ({"adapter": "loha", "quantization": "nf4"}, ["loha", "nf4", "adapter: lora or dora"]),
    ({"adapter": "lokr", "rslora": True}, ["rslora", "lokr", "adapter: lora"]),
    ({"lora_init": "pissa", "quantization": "int8"}, ["pissa", "int8", "lora_init: default"]),
    ({"adapter": "oft", "lora_dropout": 0.1}, ["lora_dropout", "oft"]),
    ({"lora_fa": True, "lora_plus_ratio": 4.0}, ["lora_plus_ratio", "lora_fa"]),
    ({"adapter": "oft", "task": "image"}, ["oft is for text runs",
                                           "image runs use one of lora, dora, loha, lokr"]),
    ({"adapter": "vera"}, ["adapter", "'vera'", "lora, dora, loha, lokr, oft"]),
])
def test_settings_peft_cannot_run_are_refused_with_the_alternative(overrides, words):
    with pytest.raises(ConfigError) as err:
        apply_overrides(RunConfig(), overrides)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_oft_block_that_does_not_divide_a_layer_names_it_and_the_sizes_that_would():
    from transformers import AutoModelForCausalLM, Qwen2Config

    from lora_gui.models.text import attach_lora

    config = Qwen2Config(vocab_size=100, hidden_size=64, intermediate_size=150, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2)
    cfg = apply_overrides(RunConfig(), {"adapter": "oft", "lora_rank": 4})
    with pytest.raises(ConfigError) as err:
        attach_lora(AutoModelForCausalLM.from_config(config), cfg)
    assert "down_proj" in str(err.value) and "150" in str(err.value) and "2, 3, 5" in str(err.value)


def test_trace_runs_each_variant_exactly_as_the_real_step():
    """The fake-tensor trace of each variant's real peft layers against the same step on real
    tensors; and the variants really differ (DoRA holds more than LoRA, LoRA-FA less)."""
    from lora_gui.memory.predict.trace import trace_text_step
    from lora_gui.models.adapters import AdapterSpec
    from tests.memory.conftest import TEXT_CONFIGS

    kw = {"batch_size": 1, "seq_len": 32, "lora_rank": 4, "dtype": "fp32", "device": "cpu"}
    peaks = {}
    for spec in (AdapterSpec(), AdapterSpec("dora"), AdapterSpec("lokr"), AdapterSpec(fa=True)):
        fake = trace_text_step(TEXT_CONFIGS["qwen2"], adapter=spec, **kw)
        real = trace_text_step(TEXT_CONFIGS["qwen2"], adapter=spec, fake=False, **kw)
        assert fake.peak_bytes == real.peak_bytes, spec
        peaks[(spec.kind, spec.fa)] = fake.peak_bytes
    assert peaks[("dora", False)] > peaks[("lora", False)] > peaks[("lora", True)]


def test_lora_fa_resume_keeps_the_frozen_a(tmp_path):
    """LoRA-FA's A never trains; a resumed run must continue with the A it started with."""
    from safetensors.torch import load_file

    cfg = apply_overrides(RunConfig(), {**TINY, "lora_fa": True, "checkpoint_every": 1})
    out = tmp_path / "run"
    text_train.train_text(cfg, out, progress=False)
    first = load_file(out / "adapter" / "adapter_model.safetensors")
    torch.manual_seed(123)  # a re-initialised A would differ
    resumed = text_train.train_text(apply_overrides(cfg, {"max_steps": 5}), out, resume=True, progress=False)
    assert resumed["status"] == "completed"
    after = load_file(out / "adapter" / "adapter_model.safetensors")
    a_keys = [k for k in first if "lora_A" in k]
    assert a_keys and all(torch.equal(first[k], after[k]) for k in a_keys)
    assert any(not torch.equal(first[k], after[k]) for k in first if "lora_B" in k)
