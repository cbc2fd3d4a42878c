"""An image run's data: the folder read and split, aspect buckets, the seeded epoch plan, and
the per-bucket batch table (read by the run and by the planner the form calls)."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lora_gui.config import RunConfig
from lora_gui.data import images as image_data
from lora_gui.data.batching import MicroBatch, Step

Bucket = tuple[int, int]  # (width, height) px


@dataclass
class ImageData:
    """Training images with their buckets, and the held-out images."""

    train: list[image_data.ImageItem]
    buckets: list[Bucket]
    held_out: list[image_data.ImageItem]


def load_image_data(cfg: RunConfig) -> ImageData:
    """Reads the folder, holds out ``eval_fraction`` of it (seeded) and assigns buckets."""
    image_data.check_resolution(cfg.resolution)
    items = image_data.load_image_folder(cfg.data_path())
    order = list(range(len(items)))
    random.Random(cfg.seed).shuffle(order)
    n_eval = min(len(items) - 1, math.ceil(len(items) * cfg.eval_fraction)) if cfg.eval_fraction else 0
    held = sorted(order[:n_eval])
    train = [items[i] for i in sorted(order[n_eval:])]
    if cfg.resolved_aspect_buckets():
        choices = image_data.make_buckets(cfg.resolution, cfg.bucket_max_ratio)
    else:  # traditional: every image resized and centre-cropped to a square
        choices = [(cfg.resolution, cfg.resolution)]
    train, buckets = image_data.assign_buckets(train, choices, cfg.bucket_no_upscale)
    return ImageData(train, buckets, [items[i] for i in held])


def latent_tokens(bucket: Bucket) -> int:
    """Latent pixels of a bucket: the UNet's sequence length at its first level."""
    return (bucket[0] // 8) * (bucket[1] // 8)


def resolution_names(buckets: list[Bucket]) -> dict[int, str]:
    """The W x H px name of each latent size the buckets use ("640x384/384x640" when two
    resolutions share one): image runs key their micro-batch caps by latent size, and say them
    as resolutions."""
    names: dict[int, list[str]] = {}
    for w, h in sorted(set(buckets), key=lambda b: (-b[0], b[1])):
        names.setdefault(latent_tokens((w, h)), []).append(f"{w}x{h}")
    return {tokens: "/".join(n) for tokens, n in sorted(names.items())}


def table_batch(cfg: RunConfig, bucket: Bucket) -> int:
    """batch_table's micro-batch for the smallest listed resolution whose area covers the bucket."""
    table = cfg.batch_by_resolution()
    covering = [r for r in sorted(table) if r * r >= bucket[0] * bucket[1]]
    return table[covering[0]] if covering else 1


def epoch_plan(cfg: RunConfig, buckets: list[Bucket], epoch: int,
               key: Callable[[Any], int] | None = None) -> list[Step]:
    """Steps of ``batch_size`` same-bucket images (the last of a bucket may be smaller), in a
    seeded order; one micro-batch each (the caps of the guard cut them when adaptive).
    ``key``: a bucket's size key, which the caps are read by (default: :func:`latent_tokens`;
    a video run's clips: :func:`lora_gui.data.video_batches.clip_tokens`)."""
    key = key or latent_tokens
    groups: dict[Bucket, list[int]] = defaultdict(list)
    for i, b in enumerate(buckets):
        groups[b].append(i)
    rng = random.Random(cfg.seed * 1_000_003 + epoch)
    steps = []
    for bucket in sorted(groups):
        idx = groups[bucket]
        rng.shuffle(idx)
        for start in range(0, len(idx), cfg.batch_size):
            chunk = tuple(idx[start : start + cfg.batch_size])
            steps.append(Step((MicroBatch(chunk, key(bucket)),)))
    rng.shuffle(steps)
    return steps


def executed_bucket_sizes(cfg: RunConfig, buckets: list[Bucket], world_size: int = 1) -> dict[Bucket, int]:
    """For each bucket the run's steps train, the most images one process gets from one of its
    steps, over exactly the steps the run executes (``max_steps``, else ``epochs`` epochs of
    :func:`epoch_plan`; each step's images dealt over ``world_size`` processes). A bucket no
    executed step reaches is absent: a short run plans only the micro-batches it will train."""
    per_epoch = len(epoch_plan(cfg, buckets, 0))
    if not per_epoch:
        return {}
    total = cfg.max_steps or per_epoch * cfg.epochs
    sizes: dict[Bucket, int] = {}
    for epoch in range(math.ceil(total / per_epoch)):
        for step in epoch_plan(cfg, buckets, epoch)[: total - epoch * per_epoch]:
            indices = step.micro_batches[0].indices
            bucket = buckets[indices[0]]
            sizes[bucket] = max(sizes.get(bucket, 0), math.ceil(len(indices) / world_size))
    return sizes
