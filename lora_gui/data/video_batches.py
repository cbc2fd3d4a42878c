"""A video run's data: the clips read and split, their (width, height, frames) buckets, and the
seeded epoch plan (the image run's, keyed by a clip's latent tokens)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from lora_gui.config import RunConfig
from lora_gui.data import videos
from lora_gui.data.batching import Step
from lora_gui.data.image_batches import epoch_plan

Bucket = videos.Bucket  # (width px, height px, frames)


@dataclass(frozen=True)
class VideoGeometry:
    """How a video model turns a clip into tokens.

    Attributes:
        temporal: frames per latent frame after the first (the VAE's temporal factor: 4 for Wan,
            8 for LTX-Video).
        spatial: px per latent pixel side (the VAE's spatial factor: 8 for Wan 2.1, 16 for
            Wan 2.2 5B, 32 for LTX-Video).
        patch: latent pixels per token side (2 for Wan, 1 for LTX-Video).
        patch_t: latent frames per token (1 for both).
    """

    temporal: int = 4
    spatial: int = 8
    patch: int = 2
    patch_t: int = 1

    @property
    def grid(self) -> int:
        """px a bucket's sides are multiples of."""
        return self.spatial * self.patch

    def latent_shape(self, bucket: Bucket) -> tuple[int, int, int]:
        """(latent frames, latent height, latent width) of a (width, height, frames) bucket."""
        w, h, f = bucket
        return (f - 1) // self.temporal + 1, h // self.spatial, w // self.spatial

    def tokens(self, bucket: Bucket) -> int:
        """The transformer's video tokens for one clip of ``bucket``."""
        t, h, w = self.latent_shape(bucket)
        return math.ceil(t / self.patch_t) * (h // self.patch) * (w // self.patch)


@dataclass
class VideoData:
    """Training clips with their buckets, and the held-out clips (each with the bucket it is
    evaluated in)."""

    train: list[videos.ClipItem]
    buckets: list[Bucket]
    held_out: list[videos.ClipItem]
    held_buckets: list[Bucket]
    geometry: VideoGeometry


def clip_size(cfg: RunConfig) -> tuple[int, int]:
    """The run's clip size (width, height): ``video_size`` (WxH) or resolution x resolution."""
    return videos.parse_size(cfg.video_size or cfg.resolution)


def load_video_data(cfg: RunConfig, geometry: VideoGeometry) -> VideoData:
    """Reads and checks every clip (refusing a bad one by name), holds out ``eval_fraction``
    (seeded) and assigns buckets: sizes about the run's clip area (aspect buckets unless
    ``aspect_buckets`` is off: the run's size only), frames the longest ``k * temporal + 1`` a
    clip fills up to ``video_frames``.

    Raises:
        VideoDataError: naming the clip, caption or setting that cannot be used.
    """
    videos.check_video_frames(cfg.video_frames, geometry.temporal)
    target = clip_size(cfg)
    if target[0] % geometry.grid or target[1] % geometry.grid:
        raise videos.VideoDataError(f"resolution: {target[0]}x{target[1]} px is not a multiple of "
                                    f"{geometry.grid} px a side for this model")
    items = videos.load_clips(cfg.data_path(), min_frames=geometry.temporal + 1)
    order = list(range(len(items)))
    random.Random(cfg.seed).shuffle(order)
    n_eval = min(len(items) - 1, math.ceil(len(items) * cfg.eval_fraction)) if cfg.eval_fraction else 0
    held = [items[i] for i in sorted(order[:n_eval])]
    train = [items[i] for i in sorted(order[n_eval:])]
    sizes = (videos.size_buckets(target, geometry.grid, cfg.bucket_max_ratio)
             if cfg.resolved_aspect_buckets() else [target])
    train, buckets = videos.assign_clip_buckets(train, sizes, cfg.video_frames, geometry.temporal,
                                                cfg.clip_frames)
    held_buckets = [(*target, videos.frame_bucket(i.frames, cfg.video_frames, geometry.temporal))
                    for i in held]  # evaluated at the run's own size, as image runs do
    return VideoData(train, buckets, held, held_buckets, geometry)


def clip_tokens(bucket: Bucket) -> int:
    """A bucket's size key for the micro-batch caps: latent pixels x latent frames (Wan's
    factors; the order of buckets is what matters, and it is the same for every model)."""
    w, h, f = bucket
    return (w // 8) * (h // 8) * ((f - 1) // 4 + 1)


def video_epoch_plan(cfg: RunConfig, buckets: list[Bucket], epoch: int) -> list[Step]:
    """The image run's epoch plan over clip buckets (same seeded order, batch_size clips of one
    bucket a step)."""
    return epoch_plan(cfg, buckets, epoch, key=clip_tokens)


def bucket_names(buckets: list[Bucket]) -> dict[int, str]:
    """The W x H x F name of each size key the buckets use (run.json and events)."""
    names: dict[int, list[str]] = {}
    for b in sorted(set(buckets)):
        names.setdefault(clip_tokens(b), []).append(f"{b[0]}x{b[1]}x{b[2]}")
    return {k: "/".join(v) for k, v in sorted(names.items())}
