"""Several processes for image runs: what the image loop (engine/image/train.py) adds to the rank
helpers of :mod:`lora_gui.engine.core.distributed`.

- **the data order is global**: every global step of ``batch_size`` images of one bucket is dealt
  to the ranks (:func:`rank_share`, the same snake deal and micro-batch cut as text runs, via
  :func:`lora_gui.data.shard.split_step`), so every image is seen once per epoch across ranks and
  a checkpoint resumes under any number of processes (:func:`image_sampler_state`);
- **the noise is the image's, not the rank's**: the noise and timestep of an image are drawn from
  a generator seeded by (seed, step, image index) (:func:`image_noise`), so an image gets the same
  noise whichever rank, and whichever micro-batch, trains it; with the loss divided by the global
  image count of the step and the gradients summed over ranks, N processes compute the gradient
  one process computes for the same global batch;
- **a rank may have no image in a step** (a bucket's last step can hold fewer images than there
  are ranks): it runs nothing and contributes zero gradients to the all-reduce
  (:func:`zero_missing_grads`);
- **FSDP is refused for images** (:func:`refuse_fsdp`): the UNet has no sharding layout here yet.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType

from lora_gui.config import ConfigError, RunConfig
from lora_gui.data.batching import Step
from lora_gui.data.shard import split_step
from lora_gui.engine.core import fsdp
from lora_gui.engine.core.distributed import Dist, enable_autocast
from lora_gui.engine.core.resume import sampler_state

FSDP_MESSAGE = ("fsdp: image runs (task=image) do not support FSDP yet; launch them with the "
                "data-parallel config (presets/accelerate/multi-gpu.yaml): the UNet's frozen weights "
                "are replicated on every process")


def refuse_fsdp(accelerator_type: DistributedType | None = None) -> None:
    """Raises ConfigError when an FSDP launch (accelerate config or --use_fsdp) started an image run."""
    if fsdp.fsdp_requested() or accelerator_type == DistributedType.FSDP:
        raise ConfigError(FSDP_MESSAGE)


def image_sampler_state(cfg: RunConfig, buckets: list[tuple[int, int]]) -> dict[str, Any]:
    """What the global image order depends on: seed, global batch and every image's bucket (the
    fingerprint changes when the folder or the bucketing changes)."""
    state = sampler_state(cfg, [])
    digest = hashlib.sha1(",".join("x".join(map(str, b)) for b in buckets).encode()).hexdigest()[:16]
    return {**state, "train_samples": len(buckets), "data_fingerprint": digest}


def rank_share(step: Step, dist: Dist, cap_for_len) -> Step:
    """This rank's share of a global step (caps applied): images dealt snake-wise, each share cut
    by the cap, the same number of micro-batches on every rank (fillers, which train nothing)."""
    tokens = step.micro_batches[0].seq_len  # one bucket a step: every image has this many latents
    lengths = dict.fromkeys(step.indices, tokens)
    shares = split_step(step, dist.world_size, lengths, batching="fixed", max_seq_len=tokens,
                        cap_for_len=cap_for_len)
    return shares[dist.rank]


def image_noise(seed: int, step: int, indices: tuple[int, ...], latent_shape: torch.Size,
                num_timesteps: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Noise ``(B, *latent_shape)`` and timesteps ``(B,)`` of images ``indices`` at 1-based
    ``step``: one seeded CPU generator per image (the same on any rank, in any micro-batch)."""
    noises, timesteps = [], []
    for index in indices:
        gen = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 1_000_033 + index) % 2**63)
        timesteps.append(torch.randint(0, num_timesteps, (1,), generator=gen))
        noises.append(torch.randn(tuple(latent_shape), generator=gen))
    return torch.stack(noises).to(device), torch.cat(timesteps).to(device)




def prepare_image(accelerator: Accelerator, dist: Dist, unet, optimizer, scheduler):
    """One process: accelerate as before. Several: LoRA weights broadcast from the main process,
    no DDP wrapper (the loop all-reduces once a step, see engine/core/distributed.py), the scheduler
    left unprepared (accelerate would step it once per process; the global batch is one step)."""
    refuse_fsdp(accelerator.distributed_type)
    if not dist.active:
        return accelerator.prepare(unet, optimizer, scheduler)
    dist.broadcast_params(p for p in unet.parameters() if p.requires_grad)
    optimizer = accelerator.prepare(optimizer)
    enable_autocast(unet, accelerator)
    return unet, optimizer, scheduler
