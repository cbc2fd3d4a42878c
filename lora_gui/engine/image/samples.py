"""Sample images of a finished image run (the main process only): validation prompts and the
pipeline with the trained adapter."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from lora_gui.config import RunConfig
from lora_gui.engine.core.checkpoint import write_atomic
from lora_gui.memory.runtime.guard import free_memory
from lora_gui.models import diffusion as dm
from lora_gui.models.diffusion_files import load_pipeline


def sample_prompts(data, sample_images: int) -> list[str]:
    """Validation prompts: held-out captions first, then training captions (distinct, non-empty)."""
    prompts: list[str] = []
    for item in [*data.held_out, *data.train]:
        if item.caption and item.caption not in prompts:
            prompts.append(item.caption)
    return prompts[: sample_images]


def pipeline_kwargs(pipe, cfg: RunConfig) -> dict[str, int]:
    """Extra pipeline arguments a DiT needs to draw as it trained: the run's T5 sequence length
    (diffusers' pipelines default to 256 / 512 tokens, not what the run used)."""
    kind = dm.dit.DIT_PIPELINES.get(type(pipe).__name__)
    if kind is None:
        return {}
    return {"max_sequence_length": dm.dit.text_length_for(kind, cfg.text_max_length)}


def generate_samples(cfg: RunConfig, source: str, adapter: Path, prompts: list[str], out: Path,
                     device: str) -> list[str]:
    """Loads the pipeline with the adapter (the caller has freed the training model first) and
    writes one PNG per prompt into out/samples (seeded, ``sample_steps`` denoising steps)."""
    pipe = load_pipeline(source, adapter, device)
    folder = out / "samples"
    folder.mkdir(exist_ok=True)
    paths = []
    for i, prompt in enumerate(prompts):
        gen = torch.Generator(device="cpu").manual_seed(cfg.seed + i)
        image = pipe(prompt, num_inference_steps=cfg.sample_steps, height=cfg.resolution,
                     width=cfg.resolution, generator=gen, **pipeline_kwargs(pipe, cfg)).images[0]
        slug = re.sub(r"[^a-z0-9]+", "-", prompt.lower()).strip("-")[:48] or "empty"
        path = folder / f"{i:02d}-{slug}.png"
        image.save(path)
        paths.append(str(path))
    write_atomic(folder / "prompts.json", json.dumps(dict(zip(paths, prompts, strict=True)), indent=1))
    del pipe
    free_memory()
    return paths
