"""Useful FLOPs of an image step: the denoiser's forward and backward for one image of a bucket,
counted once per bucket on fake copies of a real image's inputs, times the step's images
(a step's matmuls and convolutions grow linearly with its images). The text encoders' pass
(train_text_encoder) and the VAE are not counted: the count is the denoiser's.

Every bucket the run will train is counted before its first step (:meth:`BucketFlops.count_buckets`):
a count is a fake-tensor forward and backward (about a second per bucket on the demo models, several
on a full-size one), which inside the loop would sit between two timed steps, and, under the CPU
memory tracker the loop runs in, cost about five times as much."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from lora_gui.engine.image.inputs import InputSource
from lora_gui.engine.image.ranks import image_noise
from lora_gui.models.denoise import step_flops
from lora_gui.models.diffusion import Encoded

log = logging.getLogger(__name__)


@dataclass
class BucketFlops:
    """Per-image useful FLOPs by latent shape; ``pending``: inputs of a bucket not yet counted,
    kept by the step (one image's slices) and counted after it, outside its timed part."""

    per_image: dict[tuple[int, ...], int | None] = field(default_factory=dict)
    pending: dict[tuple[int, ...], tuple] = field(default_factory=dict)
    last_key: tuple[int, ...] | None = None  # latent shape of the latest micro-batch

    def offer(self, enc: Encoded, noise: torch.Tensor, timesteps: torch.Tensor) -> None:
        """Keeps one image's inputs of a bucket that has no count yet (views: no copy)."""
        key = self.last_key = tuple(enc.latents.shape[1:])
        if key not in self.per_image and key not in self.pending:
            one = lambda t: None if t is None else t[:1].detach()  # noqa: E731
            self.pending[key] = (one(enc.latents), one(enc.hidden), one(enc.pooled), one(enc.time_ids),
                                 noise[:1], timesteps[:1])

    def count_pending(self, model: Any, scheduler: Any) -> None:
        """Counts every pending bucket (a failed count leaves that bucket without one)."""
        for key, inputs in self.pending.items():
            latents, hidden, pooled, time_ids, noise, timesteps = inputs
            try:
                self.per_image[key] = step_flops(model, scheduler, Encoded(latents, hidden, pooled, time_ids),
                                                 noise, timesteps)
            except Exception as err:  # noqa: BLE001 (a count is a report: the run goes on without it)
                # the message, not the error: a log handler that keeps records (pytest's, a UI
                # log) would keep the error's traceback, and with it the step's tensors, alive
                log.warning("no FLOP count for latents %s: %s", key, str(err))
                self.per_image[key] = None
        self.pending.clear()

    def count_buckets(self, inputs: InputSource, buckets: list[tuple[int, int]], dtype: torch.dtype,
                      seed: int, model: Any, scheduler: Any) -> None:
        """Counts each bucket of ``buckets`` (one per training image) on its first image, before
        training: the image's real inputs (cached, or encoded once) and its step-0 noise."""
        first: dict[tuple[int, int], int] = {}
        for index, bucket in enumerate(buckets):
            first.setdefault(bucket, index)
        for index in first.values():
            enc = inputs.batch((index,), dtype, 0)
            noise, timesteps = image_noise(seed, 0, (index,), enc.latents.shape[1:],
                                           scheduler.config.num_train_timesteps, enc.latents.device)
            self.offer(enc, noise, timesteps)
            del enc, noise
        self.count_pending(model, scheduler)
        self.last_key = None

    def step(self, images: int) -> int | None:
        """Useful FLOPs of a step of ``images`` images of the latest micro-batch's latent shape."""
        one = self.per_image.get(self.last_key) if self.last_key else None
        return None if one is None else one * images
