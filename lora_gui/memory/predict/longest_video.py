"""`plan --longest` for a video run: the two inverse questions a clip shape has (source: predicted).

- the longest clip that fits: frames (``k * temporal + 1``) at the run's size;
- the largest size that fits at the run's frames (``video_frames``): width x height with the
  run's aspect ratio, sides multiples of the model's grid (VAE factor x patch: 16 px for Wan 2.1,
  32 px for LTX-Video).

Both at batch 1 with the run's switches, each probe one traced step of the transformer
(:func:`lora_gui.memory.predict.video_run.plan_video_shape`, the step `plan` traces for a clip
bucket), found by doubling and then halving the interval: about 2 log2(k) probes each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from lora_gui.config import RunConfig
from lora_gui.data.video_batches import clip_size
from lora_gui.data.videos import check_video_frames
from lora_gui.memory.predict.video_run import plan_video_shape, shape_config, shape_geometry
from lora_gui.units import gb

MOST_FRAMES = 1025  # the longest clip probed (frames)
LARGEST_SIDE = 4096  # px: the largest side a clip size may have (the resolution setting's range)
SMALLEST_SIDE = 16  # px: the smallest (the range's other end; a model with an 8 px grid starts at 2 steps)


def last_fitting(peak: Callable[[int], int], budget: int, top: int, first: int = 0) -> int | None:
    """The largest k in [first, top] with ``peak(k) <= budget`` (peak rising with k), or None when
    not even ``first`` fits: doubling until a k does not fit, then halving the interval."""
    if peak(first) > budget:
        return None
    low, high = first, max(first, 1)
    while high <= top and peak(high) <= budget:
        low, high = high, high * 2
    high = min(high, top + 1)
    while high - low > 1:  # peak(low) fits; peak(high) does not, or high is past the top
        mid = (low + high) // 2
        low, high = (mid, high) if peak(mid) <= budget else (low, mid)
    return low


def rope_positions(config: dict[str, Any]) -> int | None:
    """Wan's rotary table length (``rope_max_seq_len``): the most latent frames, and tokens a side,
    its transformer can place; None for a model without one (LTX-Video computes its positions)."""
    value = config.get("rope_max_seq_len")
    return int(value) if value else None


def switches_text(cfg: RunConfig) -> str:
    checkpointing = "gradient checkpointing" if cfg.gradient_checkpointing else "no gradient checkpointing"
    return f"{checkpointing}, latents cached, batch 1"


def longest_video(cfg: RunConfig, budget: int, device: str, config: dict[str, Any] | None = None,
                  most_frames: int = MOST_FRAMES) -> dict[str, Any]:
    """The longest clip (frames) at the run's size that fits ``budget`` at batch 1.

    Raises:
        ValueError: a model the video plan cannot trace.
    """
    config = config or shape_config(cfg)
    temporal = int(config["_vae"]["scale_factor_temporal"])
    peaks: dict[int, int] = {}

    def peak(k: int) -> int:
        if k not in peaks:
            one = dataclasses.replace(cfg, video_frames=k * temporal + 1, batch_size=1)
            peaks[k] = plan_video_shape(one, config, None, device).peak_bytes
        return peaks[k]

    width, height = clip_size(cfg)
    out = {"size": f"{width}x{height}", "source": "predicted", "budget_bytes": budget}
    top = (most_frames - 1) // temporal
    positions = rope_positions(config)
    if positions:  # k + 1 latent frames must have rotary positions
        top = min(top, positions - 1)
    low = last_fitting(peak, budget, top)
    if low is None:
        return {**out, "frames": 0, "peak_bytes_at_longest": peaks[0],
                "note": f"not even one frame fits: {gb(peaks[0])} at 1 frame"}
    frames = low * temporal + 1
    bound = "; the longest the model places" if low == top else ""
    return {**out, "frames": frames, "peak_bytes_at_longest": peaks[low],
            "note": f"longest clip at {width}x{height}: {frames} frames ({switches_text(cfg)}{bound})"}


def size_at(width: int, height: int, short: int, grid: int) -> tuple[int, int]:
    """The size whose shorter side is ``short`` px with the aspect ratio of ``width`` x ``height``,
    the longer side rounded to the nearest multiple of ``grid`` (at least ``short``)."""
    ratio = max(width, height) / min(width, height)
    long = max(short, round(short * ratio / grid) * grid)
    return (long, short) if width >= height else (short, long)


def largest_video_size(cfg: RunConfig, budget: int, device: str,
                       config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The largest clip size with the run's aspect ratio at ``video_frames`` frames that fits
    ``budget`` at batch 1.

    Raises:
        VideoDataError: ``video_frames`` off the model's frame grid (naming the value).
        ValueError: a model the video plan cannot trace.
    """
    config = config or shape_config(cfg)
    geometry = shape_geometry(config)
    check_video_frames(cfg.video_frames, geometry.temporal)
    width, height = clip_size(cfg)
    grid = geometry.grid
    ratio = max(width, height) / min(width, height)
    top = int(LARGEST_SIDE / ratio) // grid  # the shorter side in grid steps, the longer within range
    positions = rope_positions(config)
    if positions:  # tokens a side must have rotary positions: the longer side too
        top = min(top, int(positions / ratio))
    peaks: dict[int, int] = {}

    def peak(k: int) -> int:
        if k not in peaks:
            w, h = size_at(width, height, k * grid, grid)
            one = dataclasses.replace(cfg, video_size=f"{w}x{h}", batch_size=1)
            peaks[k] = plan_video_shape(one, config, None, device).peak_bytes
        return peaks[k]

    frames = cfg.video_frames
    out = {"frames": frames, "source": "predicted", "budget_bytes": budget, "grid_px": grid}
    first = -(-SMALLEST_SIDE // grid)
    k = last_fitting(peak, budget, max(top, first), first=first)
    if k is None:
        w, h = size_at(width, height, first * grid, grid)
        return {**out, "size": None, "peak_bytes_at_largest": peaks[first],
                "note": f"not even {w}x{h} fits at {frames} frames: {gb(peaks[first])}"}
    w, h = size_at(width, height, k * grid, grid)
    bound = "; the largest the model or the size setting allows" if k == max(top, first) else ""
    return {**out, "size": f"{w}x{h}", "peak_bytes_at_largest": peaks[k],
            "note": f"largest size at {frames} frames: {w}x{h} px ({switches_text(cfg)}{bound})"}


def video_limits(cfg: RunConfig, budget: int, device: str) -> dict[str, Any]:
    """Both answers: the longest clip at the run's size (the top-level keys, as before) and the
    largest size at the run's frames (``largest_size_at_frames``)."""
    config = shape_config(cfg)
    longest = longest_video(cfg, budget, device, config)
    return {**longest, "largest_size_at_frames": largest_video_size(cfg, budget, device, config)}
