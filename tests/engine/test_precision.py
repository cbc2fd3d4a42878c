import time

import torch

from lora_gui.models.precision import choose_precision

CPU = torch.device("cpu")


def step_taking(fp32_s: float, bf16_s: float):
    def step() -> None:
        time.sleep(bf16_s if torch.is_autocast_enabled("cpu") else fp32_s)

    return step


def test_explicit_settings_win():
    assert choose_precision("fp32", CPU) == "no"
    assert choose_precision("bf16", CPU) == "bf16"


def test_cpu_auto_picks_bf16_only_when_measured_clearly_faster(monkeypatch):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert choose_precision("auto", CPU) == "no"  # nothing measured: stay exact
    assert choose_precision("auto", CPU, step_taking(0.02, 0.015)) == "no"  # 1.3x: not worth it
    assert choose_precision("auto", CPU, step_taking(0.03, 0.005)) == "bf16"  # 6x
    assert choose_precision("auto", CPU, step_taking(0.005, 0.03)) == "no"  # slower


def test_an_avx2_cpu_stays_fp32_without_timing_a_step(monkeypatch):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    timed = []
    assert choose_precision("auto", CPU, lambda: timed.append(1)) == "no"
    assert not timed  # no bf16 dot products there: the probe's seconds are saved


def test_frozen_weights_follow_the_precision_a_cpu_text_run_chose():
    from lora_gui.models.precision import cast_frozen, planned_weights_dtype, weights_dtype

    assert weights_dtype("bf16", "cpu", text=True) == torch.bfloat16
    assert weights_dtype("bf16", "cpu") == torch.float32  # images on a CPU: float32 weights
    assert weights_dtype("no", "cpu", text=True) == weights_dtype("fp16", "cpu", text=True) == torch.float32
    assert planned_weights_dtype("bf16", "cpu", text=True) == torch.bfloat16
    assert planned_weights_dtype("auto", "cpu", text=True) == torch.float32  # timed by the run first
    assert planned_weights_dtype("auto", "cuda") == torch.bfloat16
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    model[0].requires_grad_(False)
    assert cast_frozen(model, torch.bfloat16) == 2
    assert model[0].weight.dtype == model[0].bias.dtype == torch.bfloat16
    assert model[1].weight.dtype == torch.float32  # trained: stays float32
    assert cast_frozen(model, torch.bfloat16) == 0


def test_a_bf16_cpu_text_run_trains_on_bf16_frozen_weights(tmp_path, small_corpus, builtin_model_dir,
                                                             monkeypatch):
    from lora_gui.config import RunConfig, apply_overrides
    from lora_gui.engine.text import train as text_train

    seen = {}
    attach = text_train.text_models.attach_lora

    def spy(base, *args, **kwargs):
        model = attach(base, *args, **kwargs)
        seen["frozen"] = {p.dtype for p in model.parameters() if not p.requires_grad}
        seen["adapter"] = {p.dtype for p in model.parameters() if p.requires_grad}
        return model

    monkeypatch.setattr(text_train.text_models, "attach_lora", spy)
    cfg = apply_overrides(RunConfig(), {"data": str(small_corpus), "max_seq_len": 32, "batch_size": 4,
                                        "max_steps": 2, "precision": "bf16", "eval_fraction": 0.1,
                                        "monitor_hz": 0})
    summary = text_train.train_text(cfg, tmp_path / "run", progress=False)
    assert seen == {"frozen": {torch.bfloat16}, "adapter": {torch.float32}}
    assert summary["precision"] == "bf16"
    report = summary["memory_report"]["predicted_vs_measured"]
    assert 0 <= report <= 0.03, report  # planned with the same bf16 weights: never below
