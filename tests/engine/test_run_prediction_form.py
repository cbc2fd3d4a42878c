"""The form's prediction is the run's own plan: same function, same inputs, same bytes."""

import pytest
import torch

from lora_gui.memory.predict import estimate, predict
from lora_gui.memory.runtime.meter import GB
from lora_gui.presets import load_config


@pytest.mark.slow
def test_image_form_prediction_equals_the_engines_plan():
    from lora_gui.engine.image import train as image_train
    from lora_gui.memory.predict.image_run import image_run_prediction

    cfg = load_config("image-768", {"budget_gb": 2.0})
    device = torch.device("cpu")
    model, _, dtype = image_train._load_model(cfg, device)
    data = image_train.load_image_data(cfg)
    run = image_run_prediction(cfg, model, data, int(cfg.budget_gb * GB), device, dtype, 1)
    form = predict(cfg, device="cpu")
    assert form.peak_bytes == run.peak_bytes and form.caps == run.caps.caps
    assert form.train_peak_bytes == run.train_peak_bytes
    assert form.peak_bytes > estimate(cfg, "cpu").peak_bytes  # the plan's batch, not the table's
    # the speed: one 768 px image of the built-in UNet is 130 GFLOP (its attention over 96 x 96
    # latents), too much to time for a plan on a CPU: the run and the form both say so, no guess
    assert run.speed["predicted_images_per_s"] is None and form.figures["predicted_images_per_s"] is None
    assert form.figures["speed_source"] == run.speed["speed_source"]
    assert run.speed["speed_source"].startswith("not timed: timing the step at")


@pytest.mark.slow
def test_text_form_prediction_equals_the_engines_plan():
    from lora_gui.engine.text import train as text_train
    from lora_gui.models.text import resolve_model_source

    cfg = load_config("text-demo", {"budget_gb": 2.0, "max_seq_len": 256})
    caps, predicted, _ = text_train._memory_plan(cfg, resolve_model_source(cfg.model),
                                              int(cfg.budget_gb * GB), torch.device("cpu"))
    form = predict(cfg, device="cpu")
    assert form.peak_bytes == predicted and form.caps == caps.caps and form.caps
    no_budget = load_config("text-demo", {"max_seq_len": 256})
    caps, predicted, _ = text_train._memory_plan(no_budget, resolve_model_source(no_budget.model), None,
                                              torch.device("cpu"))
    assert predict(no_budget, device="cpu").peak_bytes == predicted and not caps.caps
