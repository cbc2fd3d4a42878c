"""What a video run (``task: video``) changes in the image run: its data are clips, encoded by the
video VAE, bucketed by (width, height, frames), and its samples are mp4 clips. The loop, the
cache, the step and the plan's entry points are the image run's (:mod:`lora_gui.engine.image.train`);
this module gives it the clip versions of the few functions that differ.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from lora_gui.config import RunConfig
from lora_gui.data import video_batches, videos
from lora_gui.data.image_batches import ImageData, load_image_data
from lora_gui.engine.core.checkpoint import write_atomic
from lora_gui.memory.runtime.guard import free_memory
from lora_gui.models import diffusion as dm
from lora_gui.models.diffusion import Encoded, ImageModel, encode_pixels
from lora_gui.models.diffusion_files import load_pipeline

RunData = ImageData | video_batches.VideoData


def is_video(data: Any) -> bool:
    return isinstance(data, video_batches.VideoData)


def load_run_data(cfg: RunConfig) -> RunData:
    """An image run's pictures or a video run's clips, checked (a bad file refused by name)
    before the run folder is touched; for clips the model's configs say its frame and size grid."""
    if cfg.task != "video":
        return load_image_data(cfg)
    from lora_gui.models.video import check_swap_setting, source_geometry

    source = dm.resolve_pipeline_source(cfg.model)
    kind = dm.pipeline_kind(source)
    check_swap_setting(source, kind, cfg.blocks_to_swap)  # refused before the run folder is touched
    return video_batches.load_video_data(cfg, source_geometry(source, kind))


def epoch_plan(cfg: RunConfig, data: RunData, epoch: int) -> list:
    """The seeded steps of an epoch (the same plan for pictures and clips, keyed by their size)."""
    from lora_gui.data.image_batches import epoch_plan as image_plan

    if is_video(data):
        return video_batches.video_epoch_plan(cfg, data.buckets, epoch)
    return image_plan(cfg, data.buckets, epoch)


def bucket_key(data: RunData, bucket: tuple) -> int:
    """The size key a bucket's micro-batch cap is read by."""
    from lora_gui.data.image_batches import latent_tokens

    return video_batches.clip_tokens(bucket) if is_video(data) else latent_tokens(bucket)


def bucket_names(data: RunData) -> dict[int, str]:
    from lora_gui.data.image_batches import resolution_names

    return video_batches.bucket_names(data.buckets) if is_video(data) else resolution_names(data.buckets)


def bucket_name(bucket: tuple) -> str:
    """640x384 (a picture) or 32x32x9 (a clip: width x height x frames)."""
    return "x".join(str(v) for v in bucket)


@torch.no_grad()
def encode_clips(model: ImageModel, items: list[videos.ClipItem], buckets: list[tuple[int, int, int]],
                 device: torch.device, *, sample: bool, how: str = "first",
                 generator: torch.Generator | list[torch.Generator] | None = None) -> Encoded:
    """Reads, cuts and encodes clips of one bucket, and their captions: latents (B, C, T, h, w)."""
    pixels = [videos.load_clip(item, bucket, how) for item, bucket in zip(items, buckets, strict=True)]
    return encode_pixels(model, pixels, [i.caption for i in items], [], device, sample=sample,
                         generator=generator)


@torch.no_grad()
def encode_clip_eval_set(model: ImageModel, data: video_batches.VideoData, how: str,
                         device: torch.device) -> list[Encoded]:
    """Held-out clips at the run's size and their frame bucket, latent mean, kept on the CPU."""
    out = []
    for item, bucket in zip(data.held_out, data.held_buckets, strict=True):
        enc = encode_clips(model, [item], [bucket], device, sample=False, how=how)
        out.append(Encoded(*(None if t is None else t.cpu() for t in
                             (enc.latents, enc.hidden, enc.pooled, enc.time_ids, enc.text_mask))))
    return out


def generate_clips(cfg: RunConfig, source: str, adapter: Path, prompts: list[str], out: Path,
                   device: str) -> list[str]:
    """Loads the pipeline with the adapter (the training model freed first) and writes one mp4 per
    prompt into out/samples (seeded, ``sample_steps`` steps, the run's size and longest frames)."""
    from lora_gui.models.video import text_length_for

    pipe = load_pipeline(source, adapter, device)
    kind = dm.pipeline_kind(source)
    width, height = video_batches.clip_size(cfg)
    folder = out / "samples"
    folder.mkdir(exist_ok=True)
    paths = []
    for i, prompt in enumerate(prompts):
        gen = torch.Generator(device="cpu").manual_seed(cfg.seed + i)
        frames = pipe(prompt, num_inference_steps=cfg.sample_steps, height=height, width=width,
                      num_frames=cfg.video_frames, generator=gen, output_type="np",
                      max_sequence_length=text_length_for(kind, cfg.text_max_length)).frames[0]
        slug = re.sub(r"[^a-z0-9]+", "-", prompt.lower()).strip("-")[:48] or "empty"
        array = (frames.clip(0, 1) * 255).round().astype("uint8")  # (F, H, W, 3)
        paths.append(str(videos.write_clip(folder / f"{i:02d}-{slug}.mp4", array)))
    write_atomic(folder / "prompts.json", json.dumps(dict(zip(paths, prompts, strict=True)), indent=1))
    del pipe
    free_memory()
    return paths
