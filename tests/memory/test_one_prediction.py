"""One prediction for every entry point: on SD 1.x-, SD3- and Flux-shaped pipelines saved with
save_pretrained, ``plan`` on the CLI, the Plan tab, the Train form and the run's own prediction
give the same bytes, and both the whole run and its training steps alone are within the bound
of the run's tracked peaks (run.json ``peak_bytes`` and ``train_peak_bytes``)."""

import json
from pathlib import Path

import pytest

from lora_gui.cli import main
from lora_gui.config import parse_set_args
from lora_gui.data.build_images import build as build_pictures
from lora_gui.memory.predict import predict
from lora_gui.presets import load_config

PRESETS = Path(__file__).resolve().parents[2] / "presets"
LOW, HIGH = 0.0, 0.03  # predicted / measured - 1, the bound of every mode


def _build(kind: str, out):
    if kind == "sd":
        from lora_gui.models.build_diffusion import build

        return build(out)
    from lora_gui.models.build_dit import build

    return build(out, kind)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sd", "sd3", "flux"])
def test_cli_plan_tab_form_and_run_give_the_same_bytes_within_the_bound(kind, tmp_path, capsys):
    from lora_gui.ui import paths

    paths.configure(allow=[tmp_path])  # the page may reach the test's model folder (--allow-path)
    try:
        _same_bytes(kind, tmp_path, capsys)
    finally:
        paths.configure()


def _same_bytes(kind, tmp_path, capsys):
    from lora_gui.ui.tabs.plan_handlers import plan as plan_tab

    pictures = tmp_path / "pictures"
    build_pictures(pictures, count=5)
    pipeline = _build(kind, tmp_path / kind)
    sets = {"model": pipeline, "data": pictures, "max_steps": 2, "batch_size": 2, "monitor_hz": 0,
            "eval_fraction": 0.2, "sample_images": 0, "text_max_length": 16, "resolution": 512,
            "budget_gb": 2.0}
    pairs = [f"{k}={v}" for k, v in sets.items()]
    args = [x for pair in pairs for x in ("--set", pair)]
    out = tmp_path / "run"
    assert main(["train", "--preset", "image-512", "--quiet", "--out", str(out), *args]) == 0
    capsys.readouterr()
    run = json.loads((out / "run.json").read_text())

    assert main(["plan", "--preset", "image-512", "--device", "cpu", "--json", *args]) == 0
    cli = json.loads(capsys.readouterr().out)
    cfg = load_config("image-512", parse_set_args(pairs))
    form = predict(cfg, device="cpu")  # what the Train form calls
    from lora_gui.ui import common

    common_root = common.runs_root
    common.runs_root = lambda: tmp_path / "runs"  # the page's user presets: runs/presets/
    preset = tmp_path / "runs" / "presets" / "mine.yaml"  # the Plan tab reads every other setting from it
    preset.parent.mkdir(parents=True)
    preset.write_text(PRESETS.joinpath("image-512.yaml").read_text()
                      + "".join(f"{k}: {v}\n" for k, v in sets.items()
                                if k not in ("model", "resolution", "budget_gb")))
    try:
        _, text, _, _ = plan_tab("mine", str(pipeline), 0, 512, 2.0, "cpu", False)  # a preset by name
    finally:
        common.runs_root = common_root

    assert run["predicted_peak_bytes"] == cli["peak_bytes"] == form.peak_bytes
    from lora_gui.memory.predict.report import gb

    assert f"**{gb(form.peak_bytes)}**" in text  # the Plan tab speaks GB, as its budget field
    assert run["prediction"]["train_peak_bytes"] == cli["train_peak_bytes"] == form.train_peak_bytes
    whole = form.peak_bytes / run["peak_bytes"] - 1
    steps = form.train_peak_bytes / run["train_peak_bytes"] - 1
    assert LOW <= whole <= HIGH, (whole, form.peak_bytes, run["peak_bytes"])
    assert LOW <= steps <= HIGH, (steps, form.train_peak_bytes, run["train_peak_bytes"])
