"""A checkpointing text run without a layer count: its plan chooses how many decoder layers to
checkpoint (the fastest predicted depth that fits), and `plan` and the run choose the same.

The step-time model is a fixed one here (patched in where every caller reads it), so the choice
does not depend on how busy the machine is; the calibration itself is covered in test_step_time.
"""

from __future__ import annotations

import json

import pytest

from lora_gui.config import RunConfig, apply_overrides
from lora_gui.memory.predict import run_speed
from lora_gui.memory.predict.checkpoint_choice import (
    choose_checkpoint_layers,
    chooses_checkpointing,
    with_depth,
)
from lora_gui.memory.predict.run import fewest_checkpointed_layers, predict
from lora_gui.memory.predict.step_time import StepTimeModel
from lora_gui.presets import load_config
from lora_gui.units import GB

LAYERS = 4  # the built-in text model's decoder layers


def _cfg(**over):
    return apply_overrides(load_config("text-demo"), {"gradient_checkpointing": True, "max_seq_len": 256,
                                                      "batch_size": 8, "budget_gb": 1.0, **over})


@pytest.fixture
def fixed_step_time(monkeypatch):
    """Every caller's step-time model: no overhead, so per-token work alone decides (skipping a
    layer's recompute is always faster when its activations fit)."""
    calls = []

    def fixed(cfg, config, device, step, calibrate=True):
        calls.append(cfg.checkpoint_layers if cfg.gradient_checkpointing else -1)
        return run_speed.with_recompute(StepTimeModel(0.0, 1e-5, 1e-8, device, "fixed for the test"),
                                        cfg, config)

    monkeypatch.setattr(run_speed, "step_time_model", fixed)
    return calls


def test_only_a_checkpointing_bucketed_text_run_without_a_count_under_fastest_chooses():
    assert chooses_checkpointing(_cfg())
    assert not chooses_checkpointing(_cfg(checkpoint_layers=2))  # the user's count stands
    assert not chooses_checkpointing(_cfg(gradient_checkpointing=False))
    assert not chooses_checkpointing(_cfg(batch_choice="largest"))
    assert not chooses_checkpointing(_cfg(batch_choice="headroom"))
    assert not chooses_checkpointing(_cfg(offload_checkpoints=True))
    assert not chooses_checkpointing(_cfg(batching="fixed"))


def test_a_depth_is_an_explicit_count_or_checkpointing_off():
    cfg = _cfg()
    assert (with_depth(cfg, 0, LAYERS).gradient_checkpointing, with_depth(cfg, 0, LAYERS).checkpoint_layers) \
        == (False, 0)
    assert with_depth(cfg, 3, LAYERS).checkpoint_layers == 3
    assert with_depth(cfg, LAYERS, LAYERS).checkpoint_layers == LAYERS  # every layer, said so
    for layers in range(LAYERS + 1):  # a chosen depth is not chosen again
        assert not chooses_checkpointing(with_depth(cfg, layers, LAYERS))


def test_room_in_the_budget_checkpoints_nothing(fixed_step_time):
    choice = choose_checkpoint_layers(_cfg(), None, int(1.0 * GB), "cpu")
    assert choice is not None and choice.layers == 0 and choice.of_layers == LAYERS
    by_depth = {k: s for k, s, _ in choice.depths}
    assert set(by_depth) == set(range(LAYERS + 1))  # every depth fits a 1 GB budget
    # per-token work alone: each checkpointed layer costs the same recompute
    assert [by_depth[k] for k in range(LAYERS + 1)] == sorted(by_depth.values(), reverse=True)
    assert choice.every_layer_tokens_per_s == by_depth[LAYERS] < choice.tokens_per_s
    assert choice.applied(_cfg()).gradient_checkpointing is False


def test_a_budget_only_full_checkpointing_fits_keeps_every_layer(fixed_step_time):
    cfg = _cfg()
    every = choose_checkpoint_layers(cfg, None, int(1.0 * GB), "cpu").depths
    peaks = {k: p for k, _, p in every}
    # a budget between what every layer and what one layer fewer need at the longest bucket,
    # batch 1: only the deepest plan fits every bucket
    tight = choose_checkpoint_layers(apply_overrides(cfg, {"batch_size": 1}), None, int(1.0 * GB), "cpu")
    need = {k: p for k, _, p in tight.depths}
    budget = (need[LAYERS] + min(need[k] for k in range(LAYERS))) // 2
    assert need[LAYERS] < budget < min(need[k] for k in range(LAYERS)), need
    choice = choose_checkpoint_layers(apply_overrides(cfg, {"batch_size": 1}), None, budget, "cpu")
    assert choice is not None and choice.layers == LAYERS and [k for k, _, _ in choice.depths] == [LAYERS]
    assert choice.source == "fixed for the test"  # the calibration's own, not a depth's recompute factor
    assert peaks  # the generous budget planned every depth


def test_no_depth_fits_and_no_step_time_model_choose_nothing(fixed_step_time, monkeypatch):
    assert choose_checkpoint_layers(_cfg(), None, 1000, "cpu") is None  # 1 kB: nothing fits
    assert choose_checkpoint_layers(_cfg(), None, None, "cpu") is None  # no budget: no choice
    monkeypatch.setattr(run_speed, "step_time_model", lambda *a, **k: None)
    assert choose_checkpoint_layers(_cfg(), None, int(1.0 * GB), "cpu") is None


def test_plan_reports_the_chosen_depth_and_plans_with_it(fixed_step_time):
    cfg = _cfg()
    pred = predict(cfg, int(1.0 * GB), "cpu")
    chosen = pred.figures["checkpointing"]
    assert chosen["checkpoint_layers"] == 0 and chosen["decoder_layers"] == LAYERS
    plain = predict(with_depth(cfg, 0, LAYERS), int(1.0 * GB), "cpu")  # the same run, said outright
    assert pred.peak_bytes == plain.peak_bytes and pred.bucket_batches == plain.bucket_batches
    assert "checkpointing" not in plain.figures
    assert fewest_checkpointed_layers(cfg, int(1.0 * GB), "cpu", now=pred) is None  # chosen already


@pytest.mark.slow
def test_the_run_checkpoints_the_depth_plan_chose(tmp_path, small_corpus, fixed_step_time):
    from lora_gui.engine import train

    cfg = _cfg(data=str(small_corpus), max_seq_len=128, batch_size=4, max_steps=2, monitor_hz=0.0,
               eval_fraction=0.1, budget_gb=0.2, precision="fp32")
    planned = predict(cfg, int(0.2 * GB), "cpu").figures["checkpointing"]
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed", summary.get("message")
    saved = json.loads((tmp_path / "run" / "run.json").read_text())
    assert saved["prediction"]["checkpointing"]["checkpoint_layers"] == planned["checkpoint_layers"]
    assert saved["prediction"]["checkpointing"]["depths"] == planned["depths"]
    assert saved["config"]["gradient_checkpointing"] is True  # the settings as the user gave them


def test_plan_and_the_plan_tab_name_the_chosen_depth(fixed_step_time, capsys):
    from lora_gui.cli import main
    from lora_gui.ui.tabs import plan_handlers

    capsys.readouterr()
    assert main(["plan", "--preset", "text-demo", "--set", "gradient_checkpointing=true", "--set",
                 "max_seq_len=256", "--device", "cpu", "--budget-gb", "1"]) == 0
    cli = capsys.readouterr().out
    said = "checkpointed: none of the decoder layers (gradient checkpointing off), the fastest depth"
    assert said in cli
    assert "Faster within the budget: checkpoint_layers" not in cli  # no second answer to the question
    _, text, _, _ = plan_handlers.plan("text-demo", "builtin", 256, 0, 1, "cpu", True)
    assert not text.startswith("Error"), text
    assert said[0].upper() + said[1:] in text


def test_the_train_forms_plan_names_the_chosen_depth(fixed_step_time):
    from lora_gui.ui.tabs import train_handlers, train_prediction_handlers

    values = {**train_handlers.form_values("text-demo"), "gradient_checkpointing": True,
              "max_seq_len": 256, "budget_gb": 1.0, "precision": "fp32"}
    text, _, _ = train_prediction_handlers.prediction_view(values, 1, exact=True)
    assert "Checkpointed: none of the decoder layers (gradient checkpointing off), the fastest depth" in text
    assert "Faster within the budget" not in text


HOST_RATE = 1e-11  # seconds per byte to host memory and back: 100 GB/s, fixed for the test


@pytest.fixture
def gpu_step_time(monkeypatch):
    """A GPU's step-time model with a timed host link, as every caller reads it: recompute and
    offload costs added the way the real model adds them."""
    def fixed(cfg, config, device, step, calibrate=True):
        timing = StepTimeModel(0.0, 1e-5, 1e-8, device, "fixed for the test",
                               host_round_trip_s_per_byte=HOST_RATE if device == "cuda" else None)
        return run_speed.with_offload(run_speed.with_recompute(timing, cfg, config), cfg, config,
                                      step["dtype"].itemsize)

    monkeypatch.setattr(run_speed, "step_time_model", fixed)


def _offload_only_budget(cfg: RunConfig) -> int:
    """A budget between what every layer needs offloaded and on the card (the roomy plan's peaks)."""
    roomy = choose_checkpoint_layers(cfg, None, int(4.0 * GB), "cuda")
    return (roomy.offloaded[1] + next(p for k, _, p in roomy.depths if k == LAYERS)) // 2


def test_offloading_is_chosen_on_a_gpu_only_when_it_alone_fits(gpu_step_time):
    cfg = _cfg(batch_size=1)
    roomy = choose_checkpoint_layers(cfg, None, int(4.0 * GB), "cuda")
    assert roomy is not None and roomy.offload is False and roomy.layers == 0  # the copies only cost time
    offload_speed, offload_peak = roomy.offloaded  # a candidate on a GPU, and it fits 4 GB
    every_speed, every_peak = next((s, p) for k, s, p in roomy.depths if k == LAYERS)
    assert offload_peak < every_peak and offload_speed < every_speed  # less memory, slower
    budget = (offload_peak + every_peak) // 2  # every layer checkpointed fits only offloaded
    tight = choose_checkpoint_layers(cfg, None, budget, "cuda")
    assert tight is not None and tight.offload and tight.layers == LAYERS and tight.depths == ()
    assert tight.tokens_per_s == offload_speed and tight.every_layer_tokens_per_s is None
    run = tight.applied(cfg)
    assert (run.gradient_checkpointing, run.checkpoint_layers, run.offload_checkpoints) == \
        (True, LAYERS, True)
    assert tight.to_json()["offload_checkpoints"] is True
    assert choose_checkpoint_layers(cfg, None, offload_peak - 1, "cuda") is None  # nothing fits


def test_a_cpu_never_offloads(gpu_step_time):
    """Host and device are the same memory on a CPU: no offload candidate, whatever the budget."""
    choice = choose_checkpoint_layers(_cfg(batch_size=1), None, int(1.0 * GB), "cpu")
    assert choice is not None and choice.offload is False and choice.offloaded is None


def test_offloading_costs_each_checkpointed_input_a_round_trip():
    from lora_gui.memory.predict.run_plan import model_config_for

    config = model_config_for(_cfg(), None)
    assert not isinstance(config, dict)
    hidden = config.get_text_config().hidden_size
    base = StepTimeModel(0.0, 1e-5, 1e-8, "cuda", "t", host_round_trip_s_per_byte=HOST_RATE)
    on = run_speed.with_offload(base, _cfg(offload_checkpoints=True, checkpoint_layers=3), config, 2)
    assert on.per_token_s == pytest.approx(1e-5 + 3 * hidden * 2 * HOST_RATE)
    assert on.per_token_pair_s == base.per_token_pair_s and "host memory and back" in on.source
    assert run_speed.with_offload(base, _cfg(), config, 2) == base  # no offload: unchanged
    no_rate = StepTimeModel(0.0, 1e-5, 1e-8, "cpu", "t")
    assert run_speed.with_offload(no_rate, _cfg(offload_checkpoints=True), config, 2) == no_rate


def test_the_plan_says_when_it_chose_to_offload(gpu_step_time):
    from lora_gui.memory.predict.report import depth_lines

    cfg = _cfg(batch_size=1)
    roomy = choose_checkpoint_layers(cfg, None, int(4.0 * GB), "cuda")
    tight = choose_checkpoint_layers(cfg, None, _offload_only_budget(cfg), "cuda")
    (line,) = depth_lines({"checkpointing": tight.to_json()})
    assert f"every decoder layer ({LAYERS}), each layer's input kept in host memory" in line
    assert "every layer does not fit without offloading" in line
    (plain,) = depth_lines({"checkpointing": roomy.to_json()})
    assert "host memory" not in plain


def test_offloading_needs_the_host_memory_to_hold_the_inputs(gpu_step_time, monkeypatch):
    from lora_gui.memory.predict import checkpoint_choice

    cfg = _cfg(batch_size=1)
    budget = _offload_only_budget(cfg)
    monkeypatch.setattr(checkpoint_choice, "host_available_bytes", lambda: 1024)  # 1 KiB free
    assert choose_checkpoint_layers(cfg, None, budget, "cuda") is None  # offloading alone fit: not now
    assert choose_checkpoint_layers(cfg, None, int(4.0 * GB), "cuda").offloaded is None
