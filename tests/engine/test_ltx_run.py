"""A video run on a tiny LTX-Video pipeline the test builds (shapes no preset has): 8k+1 frame
buckets and size buckets on its VAE's grid, the run's own prediction and `plan` against the
tracked peak, the adapter read by LTXPipeline."""

from __future__ import annotations

import pytest
from diffusers import LTXPipeline

from lora_gui.config import RunConfig, apply_overrides
from lora_gui.data.videos import VideoDataError
from lora_gui.engine import train
from lora_gui.memory.predict import predict
from tests.data.test_videos import clip

LOW, HIGH = -0.01, 0.03  # the prediction's band around the tracked peak
LAYERS, HEADS = 3, 3  # the tiny transformer: 3 blocks of 3 heads of 8 (no preset has this shape)


@pytest.fixture(scope="module")
def ltx_folder(tmp_path_factory):
    from lora_gui.models.build_video import build_ltx_pipeline

    folder = tmp_path_factory.mktemp("ltx")
    build_ltx_pipeline(seed=5, num_layers=LAYERS, num_attention_heads=HEADS,
                       attention_head_dim=8).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def clips_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clips")
    # 9 and 17 frames are the 8k+1 buckets; 12 trains on 9 and 20 on 17
    shapes = [((48, 32), 9), ((48, 32), 17), ((32, 48), 9), ((32, 48), 20), ((48, 32), 12), ((32, 48), 17)]
    for i, (size, frames) in enumerate(shapes):
        direction = "left" if i % 2 else "right"
        clip(folder / f"c{i}.mp4", frames, size=size, caption=f"a red square moving {direction}")
    return folder


def ltx_cfg(model, data, **extra) -> RunConfig:
    return apply_overrides(RunConfig(), {
        "task": "video", "model": str(model), "data": str(data), "resolution": "48x32",
        "video_frames": 17, "text_max_length": 8, "batch_size": 2, "max_steps": 3, "eval_fraction": 0.0,
        "sample_images": 0, "measure_every_step": True, "lora_rank": 4, **extra})


@pytest.mark.parametrize("cache, checkpointing", [("ram", False), ("off", False), ("ram", True)])
def test_ltx_run_two_sizes_two_frame_buckets_predicted_within_band(ltx_folder, clips_folder, tmp_path, cache,
                                                                   checkpointing):
    cfg = ltx_cfg(ltx_folder, clips_folder, cache_latents=cache, gradient_checkpointing=checkpointing)
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed" and summary["task"] == "video"
    assert set(summary["buckets"]) == {"48x32x9", "48x32x17", "32x48x9", "32x48x17"}
    assert summary["final_loss"] > 0
    report = summary["memory_report"]
    assert report["predicted_source"] == "predicted"
    assert LOW <= report["predicted_vs_measured"] <= HIGH, report
    train_error = summary["prediction"]["train_peak_bytes"] / summary["train_peak_bytes"] - 1
    assert LOW <= train_error <= HIGH, (summary["prediction"], summary["train_peak_bytes"])
    if cache == "ram" and not checkpointing:  # `plan` before the run: the same function, the same bytes
        planned = predict(cfg, None, "cpu")
        assert planned.peak_bytes == summary["prediction"]["peak_bytes"]
        assert planned.step.info["model_type"] == "ltx"
        pipe = LTXPipeline.from_pretrained(str(ltx_folder))
        pipe.load_lora_weights(str(tmp_path / "run" / "adapter"))  # diffusers reads the adapter
        lora = [name for name, _ in pipe.transformer.named_parameters() if "lora" in name]
        # A and B on to_q, to_k, to_v, to_out.0 of both attentions of every block
        assert len(lora) == LAYERS * 2 * 4 * 2


def test_ltx_frames_must_be_8k_plus_1(ltx_folder, clips_folder, tmp_path):
    with pytest.raises(VideoDataError, match="video_frames: 13 is not 8k\\+1 frames.*use 9 or 17"):
        train(ltx_cfg(ltx_folder, clips_folder, video_frames=13), tmp_path / "run", progress=False)


def test_ltx_export_kohya_of_an_adapter_comfy_cannot_hold_is_refused_before_the_run(ltx_folder, clips_folder):
    from lora_gui.models.ltx_comfy import LtxExportError

    with pytest.raises(LtxExportError, match="ComfyUI's LTX-Video layout is written for plain LoRA"):
        predict(ltx_cfg(ltx_folder, clips_folder, export_kohya=True, adapter="loha"), None, "cpu")
    with pytest.raises(LtxExportError, match="proj_out has no name in ComfyUI's LTX-Video layout"):
        predict(ltx_cfg(ltx_folder, clips_folder, export_kohya=True, lora_targets="to_q,proj_out"), None,
                "cpu")
