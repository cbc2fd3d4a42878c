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
