"""What the UNet sees in an image run: latents, text embeddings and SDXL time ids per image.

Two ways to get them, one switch (``cache_latents``):

- ``off`` (traditional): every step reads the image files, resizes and crops them, runs the VAE
  encoder and the text encoder(s). Costs: VAE + text-encoder weights resident on the device all
  run long, and their compute every step. Saves: nothing (no RAM or disk for a cache).
- ``ram`` / ``disk`` (optimized): one pass encodes every image once (latent distribution
  sampled once with a seeded generator, as diffusers' and kohya's caches do) and every caption;
  in RAM each distinct caption's embeddings are held once. Afterwards the VAE and text encoders
  are freed. Saves: their weights and compute for the whole run. Costs: the one-time pass, host
  RAM (4 x (H/8) x (W/8) floats per image: 64 KiB at 512 px, plus the embeddings of each
  distinct caption) or disk, and no per-step augmentation of the pixels.

The held-out set is always encoded once, square at the run's resolution, with the latent mean,
so that eval_loss is the same computation in every mode.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from lora_gui.config import RunConfig
from lora_gui.data.images import ImageItem, load_pixels
from lora_gui.engine.core.distributed import Dist
from lora_gui.memory.runtime.guard import free_memory
from lora_gui.memory.runtime.meter import PeakMeter
from lora_gui.models.denoise import unet_loss
from lora_gui.models.diffusion import (
    Encoded,
    ImageModel,
    encode_pixels,
    encode_prompts,
    encode_prompts_with_grad,
    sdxl_time_ids,
)

CACHE_SEED = 1234  # the latent sample drawn once per image when caching
EVAL_SEED = 4321  # fixed noise of the held-out loss
EVAL_TIMESTEPS = (100, 500, 900)  # fixed timesteps of the held-out loss, per image (low, mid, high noise)


@torch.no_grad()
def encode_images(model: ImageModel, items: list[ImageItem], buckets: list[tuple[int, int]],
                  device: torch.device, *, sample: bool,
                  generator: torch.Generator | list[torch.Generator] | None = None) -> Encoded:
    """Reads, crops and encodes images of one bucket, and their captions. ``generator``: one for
    the batch, or one per image (the image's latent sample then does not depend on its batch)."""
    pixels, time_ids = [], []
    for item, bucket in zip(items, buckets, strict=True):
        px, corner = load_pixels(item, bucket)
        pixels.append(px)
        time_ids.append(sdxl_time_ids(item.size[::-1], corner, bucket[::-1]))
    return encode_pixels(model, pixels, [i.caption for i in items], time_ids, device, sample=sample,
                         generator=generator)


class InputSource:
    """Gives the UNet inputs of any set of training images (same bucket), cached or not."""

    def __init__(self, model: ImageModel, items: list[ImageItem], buckets: list[tuple[int, int]],
                 mode: str, device: torch.device, cache_dir: Path | None = None,
                 encode: Any = encode_images) -> None:
        self.model, self.items, self.buckets, self.mode = model, items, buckets, mode
        self.device, self.cache_dir = device, cache_dir
        self.encode = encode  # encode_images, or a video run's clip encoder (engine/image/clips.py)
        self._ram: list[Encoded] = []

    def build_cache(self, on_progress: Any = None) -> None:
        """Encodes every image once (batch 1, so the pass peaks low) into RAM or disk."""
        if self.mode == "off":
            return
        gen = torch.Generator().manual_seed(CACHE_SEED)
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        prompts: dict[str, tuple] = {}  # caption -> its embeddings (hidden, pooled, text mask)
        for i, (item, bucket) in enumerate(zip(self.items, self.buckets, strict=True)):
            enc = self.encode(self.model, [item], [bucket], self.device, sample=True,
                              generator=gen if self.device.type == "cpu" else None)
            enc = Encoded(*(None if t is None else t[0].detach().to("cpu", torch.float32) for t in
                            (enc.latents, enc.hidden, enc.pooled, enc.time_ids, enc.text_mask)))
            # a caption's embeddings do not depend on the image: held once per distinct caption
            # (one instance prompt for every image: one copy, not one per image; T5 embeddings
            # are 8 MiB an image at 512 tokens in float32)
            enc.hidden, enc.pooled, enc.text_mask = prompts.setdefault(
                item.caption, (enc.hidden, enc.pooled, enc.text_mask))
            if self.mode == "disk":
                save_file({k: v for k, v in vars(enc).items() if v is not None}, self._path(i))
            else:
                self._ram.append(enc)
            if on_progress:
                on_progress(i + 1, len(self.items))

    def _path(self, index: int) -> Path:
        assert self.cache_dir is not None
        return self.cache_dir / f"{index:06d}.safetensors"

    def _cached(self, index: int) -> Encoded:
        if self.mode == "ram":
            return self._ram[index]
        data = load_file(self._path(index))
        return Encoded(data["latents"], data["hidden"], data.get("pooled"), data.get("time_ids"),
                       data.get("text_mask"))

    def batch(self, indices: tuple[int, ...], dtype: torch.dtype, step: int = 0) -> Encoded:
        """The inputs of ``indices`` on the device (hidden states in the UNet's dtype). Without
        a cache each image's latent sample is drawn from a generator seeded by (``step``, image),
        so it is the same on any rank and in any micro-batch."""
        if self.mode == "off":
            gens = [torch.Generator().manual_seed((CACHE_SEED * 1_000_003 + step) * 1_000_033 + i)
                    for i in indices]
            enc = self.encode(self.model, [self.items[i] for i in indices],
                              [self.buckets[i] for i in indices], self.device, sample=True, generator=gens)
        else:
            parts = [self._cached(i) for i in indices]
            stack = lambda name: None if getattr(parts[0], name) is None else torch.stack(  # noqa: E731
                [getattr(p, name) for p in parts]).to(self.device)
            enc = Encoded(stack("latents"), stack("hidden"), stack("pooled"), stack("time_ids"),
                          stack("text_mask"))
        if self.model.info.get("train_text_encoder"):  # the encoders' LoRA trains: encode with autograd
            captions = [self.items[i].caption for i in indices]
            enc.hidden, enc.pooled = encode_prompts_with_grad(self.model, captions, self.device)
        cast = lambda t: None if t is None else t.to(dtype)  # noqa: E731
        return Encoded(enc.latents.float(), cast(enc.hidden), cast(enc.pooled), cast(enc.time_ids),
                       cast(enc.text_mask))


class EvalSet(list):
    """Held-out inputs whose text embeddings are encoded again at each evaluation (the text
    encoders' LoRA trains, so embeddings from the start of the run would be stale)."""

    def __init__(self, encoded: list[Encoded], model: ImageModel, captions: list[str],
                 device: torch.device) -> None:
        super().__init__(encoded)
        self.model, self.captions, self.device = model, captions, device

    def fresh(self, index: int) -> Encoded:
        """Item ``index`` with its caption encoded by the current text encoders."""
        enc = self[index]
        hidden, pooled = encode_prompts(self.model, [self.captions[index]], self.device)
        return Encoded(enc.latents, hidden.cpu(), None if pooled is None else pooled.cpu(), enc.time_ids)


@torch.no_grad()
def encode_eval_set(model: ImageModel, items: list[ImageItem], resolution: int,
                    device: torch.device) -> list[Encoded]:
    """Held-out images, square at ``resolution``, latent mean (no sampling), kept on the CPU."""
    out = []
    for item in items:
        enc = encode_images(model, [item], [(resolution, resolution)], device, sample=False)
        out.append(Encoded(*(None if t is None else t.cpu() for t in
                             (enc.latents, enc.hidden, enc.pooled, enc.time_ids))))
    return out


@torch.no_grad()
def eval_loss(unet, scheduler, encoded: list[Encoded], device: torch.device,
              dtype: torch.dtype) -> float | None:
    """Mean denoising loss on the held-out images at fixed timesteps with fixed noise."""
    if not encoded:
        return None
    was_training = unet.training
    unet.eval()
    gen = torch.Generator().manual_seed(EVAL_SEED)
    total = 0.0
    n = len(EVAL_TIMESTEPS)
    rep = lambda t: None if t is None else t.expand(n, *t.shape[1:]).to(device)  # noqa: E731
    for index, enc in enumerate(encoded):
        if isinstance(encoded, EvalSet):
            enc = encoded.fresh(index)
        batch = Encoded(rep(enc.latents).float(), rep(enc.hidden).to(dtype),
                        None if enc.pooled is None else rep(enc.pooled).to(dtype),
                        None if enc.time_ids is None else rep(enc.time_ids).to(dtype),
                        None if enc.text_mask is None else rep(enc.text_mask).to(dtype))
        noise = torch.randn(batch.latents.shape, generator=gen).to(device)
        steps = torch.tensor(EVAL_TIMESTEPS, device=device)
        total += unet_loss(unet, scheduler, batch, noise, steps).item()
    unet.train(was_training)
    return total / len(encoded)


def build_inputs(cfg: RunConfig, out: Path, model: ImageModel, data: Any, device: torch.device,
                 meter: PeakMeter, control: Any, dist: Dist) -> tuple[InputSource, list, dict]:
    """Encodes the held-out set (the main process, which evaluates) and, when caching, every
    training image; frees the VAE and text encoders afterwards. Measured by the meter: the
    pass's own peak is reported.

    Several processes: with ``ram`` every rank caches every image (the cache's latent sample is
    drawn from one seeded stream over all images, so each rank holds the latents one process
    would: 64 KiB an image at 512 px); with ``disk`` the main process writes the cache and the
    other ranks read it after a barrier (one writer per folder).

    Args:
        data: the run's ImageData (train, buckets, held_out).
        control: the run's TrainControl (phase events).
    """
    import functools

    from lora_gui.engine.image import clips

    mode = cfg.resolved_cache_latents()
    video = clips.is_video(data)
    encode = functools.partial(clips.encode_clips, how=cfg.clip_frames) if video else encode_images
    inputs = InputSource(model, data.train, data.buckets, mode, device,
                         out / "cache" if mode == "disk" else None, encode)
    control.phase("caching")
    start = time.perf_counter()
    with meter:
        meter.start_step()
        held = data.held_out if dist.is_main else []
        if video:  # each held-out clip at the run's size and its frame bucket
            eval_set = clips.encode_clip_eval_set(model, data, cfg.clip_frames, device) if held else []
        else:
            eval_set = encode_eval_set(model, held, cfg.resolution, device)
        if model.info.get("train_text_encoder"):
            eval_set = EvalSet(eval_set, model, [item.caption for item in held], device)
        if mode != "disk" or dist.is_main:
            inputs.build_cache()
        cache_peak = meter.step_peak()
    dist.barrier()
    seconds = time.perf_counter() - start if mode != "off" else 0.0
    if mode != "off":
        model.drop_encoders()  # latents and embeddings are cached: free VAE + text encoders
        free_memory()
    return inputs, eval_set, {"cache_seconds": seconds, "cache_peak_bytes": cache_peak}
