"""One question, one answer: the number the Train form shows, ``plan --json`` and the run that
Start launches (its own prediction in run.json) are the same bytes, for every task's demo; and
``plan`` without a budget answers for the run without one, as ``train`` runs it."""

import json
import re
import time

import pytest

from lora_gui.cli import main
from lora_gui.units import gb

STEPS = 2  # optimizer steps of each run: the prediction covers exactly the steps a run executes


def _launch_from_form(values, name, tmp_path, monkeypatch):
    """Start as the Train tab's button does (a process of its own), then wait for it to end."""
    from lora_gui.ui import common
    from lora_gui.ui.tabs import train_handlers

    monkeypatch.setattr(common, "runs_root", lambda: tmp_path / "runs")
    message, errors, _ = train_handlers.start(name, 1, values)
    assert message.startswith("Started"), (message, errors)
    job = common.MANAGER.job
    try:
        deadline = time.monotonic() + 600
        while job.running and time.monotonic() < deadline:
            time.sleep(0.5)
        assert job.status == "completed", (job.status, job.error)
    finally:
        if job.running:
            common.MANAGER.stop()
    return json.loads((tmp_path / "runs" / name / "run.json").read_text())


def _shown_gb(text: str) -> str:
    found = re.search(r"Predicted peak: \*\*([\d.,]+ GB)\*\*", text)
    assert found, text
    return found.group(1)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("preset", ["text-demo", "chat-demo", "preference-demo", "image-demo"])
def test_the_form_plan_and_the_run_it_starts_give_the_same_bytes(preset, tmp_path, monkeypatch, capsys):
    from lora_gui.memory.predict import predict
    from lora_gui.ui.tabs import train_handlers, train_prediction_handlers

    values = train_handlers.form_values(preset)  # as the dashboard fills the form (its budget too)
    changes = {"max_steps": STEPS, "monitor_hz": 0.0, "eval_fraction": 0.1}
    if preset.startswith("image"):
        changes["sample_images"] = 0
    values.update(changes)
    cfg, errors = train_handlers.config_from_form(values)
    assert cfg is not None, errors
    shown, *_ = train_prediction_handlers.prediction_view(values, 1, True)
    form = predict(cfg)

    sets = [f"{k}={v}" for k, v in {**changes, "budget_gb": cfg.budget_gb}.items()]
    assert main(["plan", "--preset", preset, "--json", *[x for s in sets for x in ("--set", s)]]) == 0
    cli = json.loads(capsys.readouterr().out)

    run = _launch_from_form(values, "same-bytes", tmp_path, monkeypatch)
    report = run["memory_report"]
    assert report["predicted_peak_bytes"] == cli["peak_bytes"] == form.peak_bytes
    assert _shown_gb(shown) == gb(report["predicted_peak_bytes"])
    assert cli["settings"]["budget_gb"] == cfg.budget_gb and cli["device"] == "cpu"
    # the bound of every mode: the run's own plan within -0%...+3% of its tracked peak
    assert 0.0 <= report["predicted_peak_bytes"] / report["peak_bytes"] - 1 <= 0.03


@pytest.mark.slow
def test_plan_without_a_budget_is_the_run_without_one(tmp_path, capsys):
    """No GPU and no budget_gb: ``plan`` answers for the run ``train`` starts (no budget, the
    token budget's micro-batches), on the CPU where it will run, and says so."""
    sets = ["--set", f"max_steps={STEPS + 1}", "--set", "monitor_hz=0"]
    assert main(["plan", "--preset", "text-demo", "--json", *sets]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert main(["plan", "--preset", "text-demo", *sets]) == 0
    words = capsys.readouterr().out
    assert main(["train", "--preset", "text-demo", "--quiet", "--json", "--out", str(tmp_path / "r"),
                 *sets]) == 0
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    assert run["memory_report"]["predicted_peak_bytes"] == cli["peak_bytes"]
    assert cli["settings"] == {"budget_gb": 0.0, "device": "cpu"} and cli["fits"] is None
    assert "no budget, as the run" in words and "this CPU" in words
