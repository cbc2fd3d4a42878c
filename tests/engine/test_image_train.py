"""The image engine end to end on the built-in pipeline: CLI dispatch, run folder, adapter that
diffusers loads, kohya export round trip, resume, traditional vs optimized switches."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lora_gui.cli import main
from lora_gui.data.build_images import build
from lora_gui.engine.core.records import read_records
from lora_gui.engine.image.train import epoch_plan, table_batch, train_image
from lora_gui.models.diffusion import ModelError, resolve_pipeline_source
from lora_gui.models.diffusion_files import load_pipeline
from lora_gui.presets import load_config

SUMMARY_KEYS = {"status", "message", "final_loss", "eval_loss", "steps", "images", "images_per_s",
                "train_seconds", "peak_bytes", "mean_step_peak_bytes", "memory_source",
                "predicted_peak_bytes", "budget_bytes", "memory_report", "adapter", "config"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Five demo pictures (1 held out): 4 training images in 4 aspect buckets."""
    out = tmp_path_factory.mktemp("pictures")
    build(out, count=5)
    return out


def _sets(folder, **extra):
    base = {"data": str(folder), "max_steps": 2, "batch_size": 2, "monitor_hz": 0, "eval_fraction": 0.2,
            "sample_images": 0, **extra}
    return [item for k, v in base.items() for item in ("--set", f"{k}={v}")]


@pytest.fixture(scope="module")
def run(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "img"
    code = main(["train", "--preset", "image-512", "--quiet", "--out", str(out),
                 *_sets(folder, export_kohya="true", sample_images=1, sample_steps=1)])
    assert code == 0
    return out, json.loads((out / "run.json").read_text())


def test_cli_trains_an_image_run_with_the_run_folder_contract(run):
    out, summary = run
    assert SUMMARY_KEYS <= set(summary)
    assert summary["status"] == "completed" and summary["steps"] == 2 and summary["task"] == "image"
    assert summary["memory_source"] == "tracker" and summary["images"] >= 2
    assert summary["eval_loss"] is not None and summary["switches"]["cache_latents"] == "ram"
    for name in ("metrics.jsonl", "events.jsonl", "config.json", "checkpoints/latest",
                 "adapter/pytorch_lora_weights.safetensors"):
        assert (out / name).exists(), name
    records = read_records(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2] and all(r["images_per_s"] > 0 for r in records)
    assert len(summary["samples"]) == 1 and (out / "samples" / "prompts.json").is_file()
    # the trace predicts the CPU tracker's peak of the same step closely (both count storages)
    assert abs(summary["predicted_peak_bytes"] / summary["train_peak_bytes"] - 1) < 0.1


def test_the_plan_event_speaks_of_resolution_buckets(run):
    """An image run's caps are keyed by latent size; its plan event names each as W x H px, and
    the dashboard's events line says resolution buckets, never token lengths."""
    from lora_gui.engine.jobs.manager import Job, plan_caps_text

    out, summary = run
    plan = next(e for e in read_records(out / "events.jsonl") if e.get("event") == "plan")
    assert plan["caps"] and set(plan["bucket_names"]) == set(plan["caps"])
    assert all("x" in name for name in plan["bucket_names"].values())
    job = Job(name="img", out=out, cfg=load_config("image-512"))
    job.on_engine_event(plan)
    line = job.snapshot()[1][-1]["event"]
    assert "resolution bucket (W x H px)" in line and "length" not in line
    for name in plan["bucket_names"].values():
        assert f"'{name}'" in line
    assert "length bucket (tokens): {64: 8}" in plan_caps_text({64: 8})


def test_adapter_loads_into_the_diffusers_pipeline_and_generates(run):
    out, _ = run
    pipe = load_pipeline(resolve_pipeline_source("builtin"), out / "adapter")
    saved = load_file(out / "adapter" / "pytorch_lora_weights.safetensors")
    assert pipe.unet.peft_config["default_0"].lora_alpha == 16.0
    key = next(k for k in saved if k.endswith("attn1.to_q.lora.up.weight"))
    module = pipe.unet.get_submodule(key.removeprefix("unet.").removesuffix(".lora.up.weight"))
    assert torch.equal(module.lora_B["default_0"].weight, saved[key])
    assert saved[key].abs().sum() > 0  # trained: LoRA B starts at zero
    image = pipe("a red circle", num_inference_steps=1, height=128, width=128,
                 generator=torch.Generator().manual_seed(0)).images[0]
    assert image.size == (128, 128)


def test_kohya_export_converts_back_to_the_same_tensors(run):
    from diffusers import StableDiffusionPipeline

    out, _ = run
    ours = load_file(out / "adapter" / "pytorch_lora_weights.safetensors")
    back, alphas = StableDiffusionPipeline.lora_state_dict(out / "adapter",
                                                           weight_name="kohya_lora.safetensors")
    assert len(back) == len(ours)
    for key, tensor in back.items():
        mine = key.replace(".processor.", ".").replace("_lora.", ".lora.")
        mine = mine.replace("to_out.lora", "to_out.0.lora")
        assert torch.equal(tensor, ours[mine]), key
    assert set(alphas.values()) == {16.0}


def test_resume_continues_to_the_same_losses(folder, tmp_path, run):
    _, straight = run
    out = tmp_path / "resumed"
    assert main(["train", "--preset", "image-512", "--quiet", "--out", str(out),
                 *_sets(folder, max_steps=1)]) == 0
    assert main(["train", "--quiet", "--resume", str(out), "--set", "max_steps=2"]) == 0
    records = read_records(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    straight_losses = [r["loss"] for r in read_records(Path(straight["adapter"]).parent / "metrics.jsonl")]
    assert [r["loss"] for r in records] == pytest.approx(straight_losses, rel=1e-5)


def test_traditional_mode_keeps_encoders_resident_and_uses_more_memory(folder, tmp_path, run):
    _, optimized = run
    cfg = load_config("image-512", {"mode": "traditional", "data": str(folder), "max_steps": 1,
                                    "batch_size": 1, "monitor_hz": 0, "eval_fraction": 0.0,
                                    "sample_images": 0})
    summary = train_image(cfg, tmp_path / "trad", progress=False)
    assert summary["switches"] == {"cache_latents": "off", "aspect_buckets": False, "attn_backend": "eager",
                                   "image_batch": "fixed", "gradient_checkpointing": False,
                                   "lean_backward": False}
    assert summary["cache_seconds"] == 0 and list(summary["buckets"]) == ["512x512"]
    # eager attention at 4,096 latent tokens: one image alone peaks above two optimized ones
    assert summary["train_peak_bytes"] > optimized["train_peak_bytes"]
    assert abs(summary["predicted_peak_bytes"] / summary["train_peak_bytes"] - 1) < 0.1


def test_batch_table_and_epoch_plan():
    cfg = load_config("image-768", {"batch_size": 8})
    assert table_batch(cfg, (768, 768)) == 4 and table_batch(cfg, (640, 384)) == 8
    assert table_batch(cfg, (1536, 1536)) == 1 and table_batch(cfg, (2048, 2048)) == 1
    buckets = [(512, 512)] * 5 + [(640, 384)] * 3
    plan = epoch_plan(cfg.__class__(**{**cfg.to_dict(), "batch_size": 2}), buckets, epoch=0)
    seen = sorted(i for step in plan for i in step.indices)
    assert seen == list(range(8))  # every image once per epoch
    for step in plan:
        assert len({buckets[i] for i in step.indices}) == 1  # one bucket a step


def test_unsupported_pipeline_architecture_is_named(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "KandinskyPipeline"}))
    cfg = load_config("image-512", {"model": str(tmp_path)})
    with pytest.raises(ModelError, match="KandinskyPipeline"):
        train_image(cfg, tmp_path / "run", progress=False)
    # a supported pipeline whose folder lacks its parts: named, no traceback
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline"}))
    with pytest.raises(ModelError, match="cannot be loaded"):
        train_image(cfg, tmp_path / "run2", progress=False)
    with pytest.raises(ModelError, match="no model_index.json"):
        resolve_pipeline_source(str(tmp_path / "run"))


def test_plan_command_for_an_image_run(capsys):
    assert main(["plan", "--preset", "image-768", "--budget-gb", "0.6", "--device", "cpu", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["source"] == "predicted" and len(result["buckets"]) > 3  # aspect buckets
    batches = [b["micro_batch"] for b in result["buckets"]]
    assert 0 < min(batches) and max(batches) < 8  # 0.6 GB holds fewer than 8 images at 768 px
    assert result["peak_bytes"] <= 0.6e9
