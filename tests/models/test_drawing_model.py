"""The bundled drawing pipeline (assets/drawing-model) draws what it is asked, and the image demo
preset that teaches it a new shape is valid and trains through the engine's DiT path."""

import json
from pathlib import Path

import pytest
import torch

from lora_gui.data.drawing_detector import detect
from lora_gui.data.drawings import NEW_SHAPE
from lora_gui.models import diffusion as dm
from lora_gui.models.build_drawing import TEXT_TOKENS, all_captions, draw_pictures
from lora_gui.models.diffusion_files import load_pipeline
from lora_gui.presets import load_config


@pytest.fixture(scope="module")
def pipe():
    torch.set_num_threads(1)
    return load_pipeline(dm.resolve_pipeline_source("builtin:drawing"))


def test_bundled_drawing_model_is_a_small_sd3_pipeline():
    folder = dm.BUILTIN_DRAWING_DIR
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusion3Pipeline"
    assert dm.pipeline_kind(str(folder)) == "sd3"
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    assert size < 30 * 2**20, f"{size / 2**20:.1f} MiB"


def test_a_red_circle_on_a_white_background_gives_one(pipe):
    pictures = draw_pictures(pipe, ["a red circle on a white background"] * 8, seed=0)
    seen = [detect(p) for p in pictures]
    assert pictures[0].size == (64, 64)
    assert all((d.colour, d.background) == ("red", "white") for d in seen), seen
    circles = sum(d.shape == "circle" for d in seen)
    assert circles >= 6, seen  # 8 of these 8 seeds when the model was built


def test_a_triangle_prompt_gives_triangles_not_circles(pipe):
    seen = [detect(p) for p in draw_pictures(pipe, ["a green triangle on a white background"] * 8, seed=0)]
    assert sum(d.shape == "triangle" for d in seen) >= 6, seen  # 8 of 8 when the model was built


def test_colours_and_backgrounds_follow_the_prompt(pipe):
    prompts = ["a blue square on a black background", "a green triangle on a white background",
               "a yellow circle on a gray background"]
    seen = [detect(p) for p in draw_pictures(pipe, prompts, seed=0)]
    assert [(d.colour, d.background) for d in seen] == [("blue", "black"), ("green", "white"),
                                                        ("yellow", "gray")], seen
    assert all(d.shape != "none" for d in seen), seen


def test_image_demo_preset_teaches_a_shape_kept_out_of_pretraining():
    cfg = load_config("image-demo")
    assert cfg.task == "image" and cfg.resolution == 64 and cfg.text_max_length == TEXT_TOKENS
    assert dm.pipeline_kind(dm.resolve_pipeline_source(cfg.model)) == "sd3"
    captions = [p.read_text().strip() for p in cfg.data_path().glob("*.txt")]
    assert len(captions) >= 16 and all(NEW_SHAPE in c for c in captions)
    assert not any(NEW_SHAPE in c for c in all_captions())


def test_image_demo_trains_a_step_and_samples_through_the_engine(tmp_path):
    from lora_gui.engine.image.train import train_image

    cfg = load_config("image-demo", {"max_steps": 2, "sample_images": 1, "sample_steps": 2})
    summary = train_image(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed" and summary["steps"] == 2
    assert summary["eval_loss"] is not None and summary["base_eval_loss"] is not None
    # the run's own prediction against its tracker peak: the drawing model's VAE downsamples 4x
    # (SD3's 8x), so a step has 4x the image tokens a trace at 8x would count (it read -45%)
    report = summary["memory_report"]
    assert report["source"] == "tracker" and -0.01 <= report["predicted_vs_measured"] <= 0.03, report
    samples = sorted((tmp_path / "run" / "samples").glob("*.png"))
    assert len(samples) == 1 and "star" in samples[0].name
    from lora_gui.engine.generate import ImageTrial, open_run

    base, tuned = ImageTrial(open_run(tmp_path / "run")).pictures("a red star on a white background", steps=2)
    assert base.size == tuned.size == (64, 64)  # the Try tab: LoRA off, then on at its scale


def test_image_demo_plans_under_a_budget_at_the_sizes_the_model_covers(capsys):
    """``plan`` under a budget fits a pixel line to two traced resolutions: the drawing model's
    position embedding covers 64 px at most (8 patches of 2 latents of 4 px), so it is
    calibrated at 32 and 64 px, not at 512 and 1024, which its transformer refuses."""
    from lora_gui.cli import main
    from lora_gui.memory.predict.dit_plan import pipeline_vae_factor
    from lora_gui.memory.predict.dit_trace import calibration_sizes, largest_side

    cfg = load_config("image-demo")
    folder = Path(dm.resolve_pipeline_source(cfg.model))
    config = json.loads((folder / "transformer" / "config.json").read_text(encoding="utf-8"))
    assert pipeline_vae_factor(cfg) == 4
    assert largest_side(config, vae_factor=4) == 64 and calibration_sizes(config, vae_factor=4) == (32, 64)
    assert main(["plan", "--preset", "image-demo", "--budget-gb", "2", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["fits"] and plan["batch_by_bucket"] == {"(64, 64)": cfg.batch_size}, plan["message"]
