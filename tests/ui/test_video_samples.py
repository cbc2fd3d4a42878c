"""The Train tab's samples: a video run's mp4 clips are listed beside pictures and reach the
page as videos the gallery plays."""

from __future__ import annotations

import types

import gradio as gr
import numpy as np
from PIL import Image

from lora_gui.data import videos
from lora_gui.ui import common
from lora_gui.ui.tabs import train_handlers


def test_video_samples_are_listed_and_sent_as_videos(tmp_path, monkeypatch):
    folder = tmp_path / "run" / "samples"
    folder.mkdir(parents=True)
    clip = videos.write_clip(folder / "00-a-red-square.mp4", np.full((9, 32, 48, 3), 200, np.uint8))
    Image.new("RGB", (8, 8)).save(folder / "01-still.png")
    (folder / "prompts.json").write_text("{}", encoding="utf-8")  # not a sample
    job = types.SimpleNamespace(kind="training", out=tmp_path / "run")
    monkeypatch.setattr(common.MANAGER, "job", job, raising=False)
    listed = train_handlers.sample_gallery()
    assert listed == [str(clip), str(folder / "01-still.png")]
    sent = gr.Gallery().postprocess(listed).root
    assert [type(item).__name__ for item in sent] == ["GalleryVideo", "GalleryImage"]
