"""Text-encoder LoRA on the built-in SD pipeline: trained with its own learning rate, saved in
diffusers' format and loaded back by load_lora_weights, checkpointed and resumed, counted by the
memory plan; refused where it cannot run."""

import json

import pytest
import torch
from safetensors.torch import load_file

from lora_gui.cli import main
from lora_gui.config import ConfigError
from lora_gui.data.build_images import build
from lora_gui.engine.core.records import read_records
from lora_gui.models import text_encoder_lora
from lora_gui.models.diffusion import resolve_pipeline_source
from lora_gui.models.diffusion_files import load_pipeline
from lora_gui.presets import load_config


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("pictures")
    build(out, count=5)
    return out


def _sets(folder, **extra):
    base = {"data": str(folder), "max_steps": 2, "batch_size": 2, "monitor_hz": 0, "eval_fraction": 0.2,
            "sample_images": 0, "train_text_encoder": "true", "cache_latents": "off",
            "text_encoder_lr": 0.002, "checkpoint_every": 1, "warmup_steps": 0, **extra}
    return [item for k, v in base.items() for item in ("--set", f"{k}={v}")]


@pytest.fixture(scope="module")
def run(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("te") / "run"
    assert main(["train", "--preset", "image-512", "--quiet", "--out", str(out), *_sets(folder)]) == 0
    return out, json.loads((out / "run.json").read_text())


@pytest.mark.slow
def test_text_encoder_lora_is_saved_in_diffusers_format_and_loads(run):
    out, summary = run
    assert summary["status"] == "completed"
    saved = load_file(out / "adapter" / "pytorch_lora_weights.safetensors")
    text = {k: v for k, v in saved.items() if k.startswith("text_encoder.")}
    assert text and any(k.startswith("unet.") for k in saved)
    up = {k: v for k, v in text.items() if k.endswith("lora_linear_layer.up.weight")}  # diffusers' lora_B
    assert up and any(v.abs().sum() > 0 for v in up.values())  # B starts at zero: it trained
    pipe = load_pipeline(resolve_pipeline_source("builtin"), out / "adapter")
    loaded = {n: p for n, p in pipe.text_encoder.named_parameters() if "lora_B" in n}
    assert len(loaded) == len(up)
    state = torch.load(out / "checkpoints" / "step-00000002" / "state.pt", weights_only=True)
    lr = summary["config"]["lr"]  # the UNet's group at lr, the encoders' at text_encoder_lr
    assert lr != 0.002
    assert [g["initial_lr"] for g in state["optimizer"]["param_groups"]] == [pytest.approx(lr),
                                                                              pytest.approx(0.002)]


@pytest.mark.slow
def test_resume_restores_the_text_encoder_lora(run, folder, tmp_path):
    straight_out, _ = run
    out = tmp_path / "resumed"
    assert main(["train", "--preset", "image-512", "--quiet", "--out", str(out),
                 *_sets(folder, max_steps=1)]) == 0
    assert main(["train", "--quiet", "--resume", str(out), "--set", "max_steps=2"]) == 0
    # no warmup: step 1 updates the encoders' LoRA in both runs, so step 2's loss depends on the
    # text-encoder LoRA the resumed run read back from its step-1 checkpoint
    saved = load_file(out / "checkpoints" / "step-00000001" / text_encoder_lora.CHECKPOINT_FILE)
    assert any(v.abs().sum() > 0 for k, v in saved.items() if "lora_B" in k)
    straight = [r["loss"] for r in read_records(straight_out / "metrics.jsonl")]
    assert [r["loss"] for r in read_records(out / "metrics.jsonl")] == pytest.approx(straight, rel=1e-5)


@pytest.mark.slow
def test_the_memory_plan_counts_the_text_encoder_training(run):
    _, summary = run
    # the prediction includes the encoders' LoRA step and stays close to the tracker's peak
    assert abs(summary["predicted_peak_bytes"] / summary["train_peak_bytes"] - 1) < 0.1


def test_refused_with_cached_embeddings_and_for_dit_models():
    cfg = load_config("image-512", {"train_text_encoder": True})  # optimized: cache_latents ram
    with pytest.raises(ConfigError, match="cache_latents=off"):
        text_encoder_lora.check(cfg, "sd")
    cfg = load_config("image-512", {"train_text_encoder": True, "cache_latents": "off"})
    text_encoder_lora.check(cfg, "sdxl")
    with pytest.raises(ConfigError, match="SD 1.x / SDXL"):
        text_encoder_lora.check(cfg, "flux")



@pytest.mark.slow
def test_plan_counts_the_text_encoder_lora_and_the_resident_encoders():
    """`plan` for an image run: the encoders' LoRA step (as the run's own prediction adds it)
    and, without a latent cache, the VAE and text encoders that stay on the device."""
    from lora_gui.memory.predict.estimate import estimate_unet_step
    from lora_gui.memory.predict.image_run_plan import plan_image_run, unet_config_for
    from lora_gui.memory.predict.pipeline_shapes import pipeline_sizes

    cfg = load_config("image-512", {"cache_latents": "off", "batch_size": 2, "precision": "fp32",
                                    "train_text_encoder": True})
    plan, step, _ = plan_image_run(cfg, 8 * 10**9, "cpu")
    lora, resident = step.info["text_encoder_lora_bytes"], step.info["resident_encoder_bytes"]
    assert resident == pipeline_sizes(resolve_pipeline_source("builtin"), torch.float32)[1] > 0
    assert lora > 0
    assert step.peak_bytes == step.traced_peak_bytes + resident + lora  # cpu: no CUDA overheads
    kw = {"lora_rank": cfg.lora_rank, "gradient_checkpointing": False, "dtype": torch.float32,
          "device": "cpu"}
    for b in plan.buckets:  # every bucket's peak carries both
        unet_only = estimate_unet_step(unet_config_for(cfg), batch_size=b.micro_batch, resolution=b.bucket,
                                       **kw)
        assert b.peak_bytes == unet_only.peak_bytes + resident + lora
    with pytest.raises(ConfigError, match="cache_latents=off"):
        plan_image_run(load_config("image-512", {"train_text_encoder": True}), 8 * 10**9, "cpu")
