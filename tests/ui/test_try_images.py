"""Try tab, image runs: base and adapter pictures from one prompt and seed at a chosen LoRA scale,
through the handler, on the bundled tiny diffusion pipeline and a 1-step trained adapter."""

from __future__ import annotations

import numpy as np
import pytest

from lora_gui.cli import main
from lora_gui.data.build_images import build
from lora_gui.ui import common
from lora_gui.ui.tabs import try_handlers


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    """One optimizer step at 512 px on two demo pictures; a large lr so the step moves LoRA B
    (zero at init) far enough to change a picture; 1 denoising step per Try picture."""
    root = tmp_path_factory.mktemp("try-images")
    pictures = root / "pictures"
    build(pictures, count=2)
    out = root / "runs" / "img"
    sets = {"task": "image", "data": str(pictures), "resolution": 512, "max_steps": 1, "batch_size": 2,
            "lr": 0.05, "warmup_steps": 0, "eval_fraction": 0.0, "sample_images": 0, "sample_steps": 1,
            "monitor_hz": 0}
    assert main(["train", "--quiet", "--out", str(out),
                 *[item for k, v in sets.items() for item in ("--set", f"{k}={v}")]]) == 0
    return out


def pictures(run, scale: float, seed: int = 3):
    """The handler's last update: (base text, adapter text, base picture, adapter picture, start
    text, base clip, adapter clip, message)."""
    base_text, tuned_text, base, tuned, start_text, base_clip, tuned_clip, message = list(
        try_handlers.generate(str(run), "a red circle", 16, 0.0, seed, scale))[-1]
    assert [base_text, tuned_text, start_text] == ["", "", ""] and message.startswith("Done"), message
    assert base_clip is None and tuned_clip is None  # clips are a video run's
    return np.asarray(base), np.asarray(tuned), message


@pytest.mark.slow  # ~30 s on 2 shared cores: a 1-step 512 px run, then six 1-step pictures
def test_base_and_adapter_pictures_at_a_chosen_scale(image_run, monkeypatch):
    monkeypatch.setattr(try_handlers, "_running_job", lambda: None)
    monkeypatch.setattr(common, "RUNS_ROOT", image_run.parent)
    from lora_gui.ui import paths

    paths.configure(allow=[image_run.parent.parent])  # the run's pictures, as --allow-path would
    try:
        _check_pictures(image_run)
    finally:
        paths.configure()


def _check_pictures(image_run):
    assert try_handlers.finished_runs() == [str(image_run)]
    base, tuned, message = pictures(image_run, 1.0)
    assert base.shape == tuned.shape == (512, 512, 3)  # the run's resolution, RGB
    assert "seed 3, LoRA scale 1" in message
    change = np.abs(base.astype(int) - tuned.astype(int)).mean()  # grey levels per channel
    assert change > 0  # the adapter changes the picture
    base_0, tuned_0, _ = pictures(image_run, 0.0)
    assert np.array_equal(base_0, base)  # same prompt and seed: the same base picture
    assert np.array_equal(tuned_0, base)  # scale 0: the LoRA adds nothing
    _, tuned_2, _ = pictures(image_run, 2.0)
    assert np.abs(base.astype(int) - tuned_2.astype(int)).mean() > change  # the scale weighs it
