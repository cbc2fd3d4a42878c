"""A checkpointing image run under a budget weighs checkpointing off and takes the faster plan that
fits (lora_gui.memory.predict.image_checkpoint_choice), and `plan`, the run and run.json agree."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from lora_gui.config import apply_overrides
from lora_gui.memory.predict import image_checkpoint_choice as choice
from lora_gui.memory.predict.report import depth_lines
from lora_gui.presets import load_config

BUDGET = 1000


def predicted(speed: float | None, peak: int = 900, fits: bool = True, micro_batch: int = 2):
    """A stand-in for an ImagePrediction: its speed, peak and per-bucket plan."""
    plan = SimpleNamespace(fits=fits, buckets=[SimpleNamespace(micro_batch=micro_batch)])
    return SimpleNamespace(peak_bytes=peak, plan=plan, checkpoint_choice=None,
                           speed={"predicted_images_per_s": speed, "speed_source": "timed"})


def run(**over):
    settings = {"gradient_checkpointing": True, "image_batch": "adaptive", "budget_gb": 1.0}
    return apply_overrides(load_config("image-demo"), {**settings, **over})


def test_checkpointing_off_is_taken_when_it_fits_and_is_faster():
    on, off = predicted(40.0, peak=500), predicted(70.0, peak=950, micro_batch=1)
    asked = []
    chosen = choice.choose(run(), BUDGET, on, lambda cfg: asked.append(cfg) or off)
    assert [cfg.gradient_checkpointing for cfg in asked] == [False]  # planned once more, without it
    assert chosen is off and chosen.checkpoint_choice.applied(run()).gradient_checkpointing is False
    record = chosen.checkpoint_choice.to_json()
    assert record["predicted_images_per_s"] == {"on": 40.0, "off": 70.0}
    assert record["predicted_peak_bytes"] == {"on": 500, "off": 950}
    line, = depth_lines({"image_checkpointing": record})
    assert "gradient checkpointing: off" in line and "on 40.00 images/s" in line and "off 70.00" in line


@pytest.mark.parametrize("off", [
    predicted(40.0),  # as fast: the one that checkpoints holds less memory
    predicted(30.0),  # slower
    predicted(90.0, peak=BUDGET + 1),  # faster, but its run is over the budget
    predicted(90.0, fits=False),  # a bucket that fits no image
    predicted(90.0, micro_batch=0),
])
def test_checkpointing_stays_on_unless_off_fits_and_is_faster(off):
    on = predicted(40.0)
    chosen = choice.choose(run(), BUDGET, on, lambda cfg: off)
    assert chosen is on and chosen.checkpoint_choice.checkpointing is True
    if off.speed["predicted_images_per_s"] > 40 and not choice.fits(off, BUDGET):
        line, = depth_lines({"image_checkpointing": chosen.checkpoint_choice.to_json()})
        assert "off does not fit the budget" in line


def test_nothing_is_chosen_without_a_speed_to_weigh():
    on = predicted(None)
    assert choice.choose(run(), BUDGET, on, lambda cfg: pytest.fail("planned again")) is on
    assert on.checkpoint_choice is None
    timed = predicted(40.0)
    assert choice.choose(run(), BUDGET, timed, lambda cfg: predicted(None)).checkpoint_choice is None


@pytest.mark.parametrize("over, budget, chooses", [
    ({}, BUDGET, True),
    ({}, None, False),  # no budget: nothing to fit
    ({"batch_choice": "largest"}, BUDGET, False),  # the user keeps the settings as given
    ({"batch_choice": "headroom"}, BUDGET, False),
    ({"image_batch": "fixed"}, BUDGET, False),
    ({"gradient_checkpointing": False}, BUDGET, False),
])
def test_which_runs_weigh_their_checkpointing(over, budget, chooses):
    assert choice.chooses_image_checkpointing(run(**over), budget) is chooses
    video = apply_overrides(load_config("video-demo"), {"gradient_checkpointing": True, "budget_gb": 1.0})
    assert not choice.chooses_image_checkpointing(video, BUDGET)


def test_plan_of_the_image_demo_states_the_choice_and_the_faster_plan_it_took(capsys):
    from lora_gui.cli import main

    args = ["plan", "--preset", "image-demo", "--set", "gradient_checkpointing=true", "--set",
            "image_batch=adaptive", "--budget-gb", "1", "--device", "cpu"]
    assert main([*args, "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)["prediction"]
    record = figures["image_checkpointing"]
    speed = record["predicted_images_per_s"]
    assert speed["on"] > 0 and speed["off"] > 0  # both timed on this machine (each its own calibration)
    assert record["gradient_checkpointing"] is not (speed["off"] > speed["on"])
    chosen = "on" if record["gradient_checkpointing"] else "off"
    assert figures["predicted_images_per_s"] == speed[chosen]  # the plan's speed is the chosen one's
    assert figures["peak_bytes"] == record["predicted_peak_bytes"][chosen] <= 1e9
    assert main(args) == 0
    assert f"gradient checkpointing: {chosen}, the faster plan" in capsys.readouterr().out
    assert main([*args, "--set", "batch_choice=largest", "--json"]) == 0  # as set: nothing weighed
    assert "image_checkpointing" not in json.loads(capsys.readouterr().out)["prediction"]


@pytest.mark.slow
def test_the_run_trains_with_the_checkpointing_its_plan_chose(tmp_path):
    from lora_gui.engine import train

    cfg = load_config("image-demo", {"max_steps": 2, "sample_images": 0, "monitor_hz": 0.0,
                                     "gradient_checkpointing": True, "image_batch": "adaptive",
                                     "budget_gb": 1.0})
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed", summary.get("message")
    saved = json.loads((tmp_path / "run" / "run.json").read_text())
    record = saved["prediction"]["image_checkpointing"]
    assert saved["config"]["gradient_checkpointing"] is record["gradient_checkpointing"]  # as trained
    given = json.loads((tmp_path / "run" / "config.json").read_text())
    assert given["gradient_checkpointing"] is True  # the settings as given: a resume chooses again

