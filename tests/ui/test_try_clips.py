"""Try tab, video runs: base and adapter clips (mp4) from one prompt and seed, through the
handler, on the bundled tiny Wan pipeline with an adapter whose B is not zero."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lora_gui.config import RunConfig, apply_overrides
from lora_gui.data import videos
from lora_gui.ui import common, paths
from lora_gui.ui.tabs import try_handlers


def video_run(root):
    """A run folder as a finished video run leaves it: its settings and an adapter."""
    from lora_gui.models.diffusion import image_model_for_run
    from lora_gui.models.diffusion_files import save_adapter

    out = root / "runs" / "clips"
    out.mkdir(parents=True)
    cfg = apply_overrides(RunConfig(), {"task": "video", "model": "builtin:video", "resolution": "32x32",
                                        "video_frames": 5, "text_max_length": 8, "sample_steps": 1,
                                        "lora_rank": 4})
    model = image_model_for_run(cfg, torch.float32)
    with torch.no_grad():  # B starts at zero: give the adapter an effect
        for name, p in model.unet.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p))
    save_adapter(model, out)
    (out / "config.json").write_text(json.dumps(cfg.to_dict()), encoding="utf-8")
    return out


def test_base_and_adapter_clips_play_in_the_try_tab(tmp_path, monkeypatch):
    run = video_run(tmp_path)
    monkeypatch.setattr(try_handlers, "_running_job", lambda: None)
    monkeypatch.setattr(common, "RUNS_ROOT", run.parent)
    assert try_handlers.task_panes(str(run))[2] and try_handlers.clip_panes(str(run)) == (True, True)
    assert not any(try_handlers.task_panes(str(run))[6:])  # no picture panes for a video run
    paths.configure(allow=[tmp_path])
    try:
        *texts, base, tuned, message = list(try_handlers.generate(str(run), "a red square moving left", 16,
                                                                  0.0, 2, 1.0))[-1]
    finally:
        paths.configure()
    assert message.startswith("Done: seed 2, LoRA scale 1") and "5 frames" in message, message
    assert texts == ["", "", None, None, ""]
    base, tuned = Path(base), Path(tuned)
    assert base.parent == run / "try" and videos.probe_clip(base) == videos.probe_clip(tuned) == ((32, 32), 5)
    pixels = [videos.load_clip(videos.ClipItem(p, "", (32, 32), 5), (32, 32, 5)) for p in (base, tuned)]
    assert (pixels[0] - pixels[1]).abs().mean() > 0  # the adapter changes the clip
