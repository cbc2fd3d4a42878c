"""Video data: a folder of clips with captions, or a jsonl of path + caption; frame and size
buckets; each clip cut to its bucket.

Clips are mp4 / webm / mov / gif files decoded with PyAV (``av``); still images in the folder
(png, jpg, webp, bmp) train as one-frame clips. Captions come from a same-name ``.txt`` file
next to each clip (the convention of the video trainers: musubi-tuner, diffusion-pipe), or from
a ``.jsonl`` file given as ``data``, one JSON object a line with ``path`` (relative to the jsonl's
folder, or absolute) and ``caption`` (``text`` is read too).

Unlike the image folder, which skips an unreadable picture, a clip that cannot be decoded, has
no frame, or has fewer frames than the model's shortest clip (1 + its temporal factor: 5 for
Wan, 9 for LTX-Video), and a caption that is not UTF-8, stop the run before anything starts,
with the file named: a video dataset is small and hand-made, and a silently dropped clip is the
complaint users of other trainers have.

Buckets:

- frames: a clip of ``n`` frames trains on ``k * t + 1`` frames (``t`` the VAE's temporal factor,
  4 for Wan, 8 for LTX-Video), the largest that is at most ``n`` and at most ``video_frames``;
  a still image is a 1-frame clip. The frames are the first ones (``clip_frames: first``) or
  spread evenly over the clip (``spaced``).
- size: (width, height) with both sides multiples of the model's grid (VAE factor x patch:
  16 for Wan 2.1, 32 for Wan 2.2 5B and LTX-Video), area at most the target's (``resolution``
  squared, or W x H) and as close as the grid allows, long/short side at most
  ``bucket_max_ratio``; each clip goes to the nearest aspect ratio and is resized to cover it and
  centre-cropped (the image code's resize).
- windows (``clip_frames: windows``): a clip that holds several buckets' worth of frames trains
  as that many clips, one a window of consecutive frames (frames 0-16, 17-33... of a 40-frame
  clip at 17 frames), so a long clip is not cut to its start.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from lora_gui.data import images as image_data
from lora_gui.errors import UserError

log = logging.getLogger(__name__)
CLIP_SUFFIXES = (".mp4", ".webm", ".mov", ".gif")
FRAME_CHOICES = ("first", "spaced", "windows")  # how a clip is cut to its frame bucket


class VideoDataError(UserError, ValueError):
    """The video data cannot be used; the message names the folder or file."""


@dataclass(frozen=True)
class ClipItem:
    """One training clip: its file, caption, frame size (width, height) px and frame count
    (1 for a still image); ``start``: the first frame it trains on (a window of a longer clip)."""

    path: Path
    caption: str
    size: tuple[int, int]
    frames: int
    start: int = 0

    @property
    def still(self) -> bool:
        return self.path.suffix.lower() in image_data.IMAGE_SUFFIXES


Bucket = tuple[int, int, int]  # (width px, height px, frames)


def parse_size(text: str | int) -> tuple[int, int]:
    """A clip size: a side (``512``: a 512 x 512 area) or ``WxH`` (``832x480``).

    Raises:
        VideoDataError: naming the value.
    """
    raw = str(text).strip().lower()
    try:
        if "x" in raw:
            w, h = (int(v) for v in raw.split("x"))
        else:
            w = h = int(raw)
    except ValueError:
        raise VideoDataError(f"resolution: {text!r} is not a side (512) or WxH (832x480)") from None
    if min(w, h) < 16 or max(w, h) > 4096:
        raise VideoDataError(f"resolution: {text!r} must have sides of 16-4096 px")
    return w, h


def frame_bucket(frames: int, longest: int, temporal: int) -> int:
    """The frames a clip of ``frames`` trains on: the largest ``k * temporal + 1`` at most
    ``frames`` and ``longest`` (1 for a still)."""
    top = min(frames, longest)
    return (top - 1) // temporal * temporal + 1 if top >= 1 else 0


def check_video_frames(longest: int, temporal: int) -> None:
    """``video_frames`` must be ``k * temporal + 1`` (the VAE encodes the first frame alone and
    each following ``temporal`` frames as one latent frame).

    Raises:
        VideoDataError: naming the value and the nearest usable ones.
    """
    if longest < 1 or (longest - 1) % temporal:
        low = max(1, (longest - 1) // temporal * temporal + 1)
        raise VideoDataError(f"video_frames: {longest} is not {temporal}k+1 frames for this model; "
                             f"use {low} or {low + temporal}")


def size_buckets(target: tuple[int, int], grid: int, max_ratio: float = 2.0) -> list[tuple[int, int]]:
    """(width, height) buckets of about the target's area, sides multiples of ``grid``, sorted;
    the target itself (rounded down to the grid) is one of them."""
    area = target[0] * target[1]
    out = {(target[0] // grid * grid, target[1] // grid * grid)}
    for width in range(grid, int(math.sqrt(area * max_ratio)) + grid, grid):
        height = area // width // grid * grid
        if height >= grid and max(width, height) / min(width, height) <= max_ratio + 1e-9:
            out.update({(width, height), (height, width)})
    return sorted(b for b in out if min(b) >= grid)


def _decode_error(path: Path, err: Exception) -> VideoDataError:
    return VideoDataError(f"{path}: cannot be decoded as a video ({type(err).__name__}: {err}); "
                          "re-encode it (e.g. ffmpeg -i in.mp4 -c:v libx264 out.mp4) or remove it")


def probe_clip(path: Path) -> tuple[tuple[int, int], int]:
    """(width, height) and the number of frames, decoding every frame (a truncated clip fails
    here, not in the middle of a run).

    Raises:
        VideoDataError: naming the file when it cannot be decoded or has no frame.
    """
    import av

    if path.suffix.lower() in image_data.IMAGE_SUFFIXES:
        try:
            with Image.open(path) as img:
                img.load()
                return img.size, 1
        except (OSError, ValueError) as err:
            raise VideoDataError(f"{path}: cannot be read as an image ({err})") from None
    frames, size = 0, (0, 0)
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise VideoDataError(f"{path}: holds no video stream")
            for frame in container.decode(video=0):
                frames += 1
                size = (frame.width, frame.height)
    except VideoDataError:
        raise
    except (av.FFmpegError, OSError, ValueError) as err:
        raise _decode_error(path, err) from None
    if not frames:
        raise VideoDataError(f"{path}: has no frames")
    return size, frames


def frame_indices(total: int, wanted: int, how: str = "first", start: int = 0) -> list[int]:
    """Which of ``total`` frames a clip cut to ``wanted`` keeps: the first ones (from ``start``,
    a window's first frame), or spread evenly from the first to the last."""
    if how == "windows":
        return list(range(start, min(start + wanted, total)))
    if wanted >= total or how == "first":
        return list(range(min(wanted, total)))
    if wanted == 1:
        return [0]
    return [round(i * (total - 1) / (wanted - 1)) for i in range(wanted)]


def read_frames(path: Path, indices: list[int]) -> list[Image.Image]:
    """The frames at ``indices`` (sorted, from 0) as RGB pictures."""
    import av

    if path.suffix.lower() in image_data.IMAGE_SUFFIXES:
        with Image.open(path) as img:
            return [img.convert("RGB")]
    wanted, out = set(indices), {}
    with av.open(str(path)) as container:
        for i, frame in enumerate(container.decode(video=0)):
            if i in wanted:
                out[i] = frame.to_image().convert("RGB")
            if i >= max(indices):
                break
    return [out[i] for i in indices]


def load_clip(item: ClipItem, bucket: Bucket, how: str = "first") -> torch.Tensor:
    """The clip cut to ``bucket`` (width, height, frames): (3, frames, H, W) in [-1, 1], the
    video VAE's input."""
    w, h, n = bucket
    frames = read_frames(item.path, frame_indices(item.frames, n, how, item.start))
    return torch.stack([image_data.to_tensor(image_data.resize_crop(f, (w, h))[0]) for f in frames], dim=1)


def _read_text(path: Path) -> str:
    """A caption or jsonl file as UTF-8 (the image code's reader), refused as video data."""
    try:
        return image_data.read_caption_text(path)
    except image_data.ImageDataError as err:
        raise VideoDataError(str(err)) from None


def _caption_beside(path: Path) -> str:
    txt = path.with_suffix(".txt")
    return _read_text(txt).strip() if txt.is_file() else ""


def _rows_of_jsonl(path: Path) -> list[tuple[Path, str]]:
    rows = []
    for n, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            clip = Path(row.get("path") or row["file_name"]).expanduser()
            caption = str(row.get("caption", row.get("text", "")))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
            raise VideoDataError(f"{path}:{n}: expected a JSON object with path and caption "
                                 f"({type(err).__name__}: {err})") from None
        rows.append((clip if clip.is_absolute() else path.parent / clip, caption.strip()))
    return rows


def load_clips(source: str | Path, min_frames: int = 1) -> list[ClipItem]:
    """Every clip of a folder (sorted by name; captions from same-name .txt files) or a jsonl
    (path + caption), each decoded once to check it.

    Args:
        min_frames: the fewest frames a video clip (not a still image) may have.

    Raises:
        VideoDataError: a missing folder or file, no clip, a clip that cannot be decoded, has no
            frames or fewer than ``min_frames``, a caption that is not UTF-8; naming the file.
    """
    source = Path(source)
    if source.is_file() and source.suffix.lower() == ".jsonl":
        rows = _rows_of_jsonl(source)
        for path, _ in rows:
            if not path.is_file():
                raise VideoDataError(f"{source}: the clip {path} does not exist")
    elif source.is_dir():
        suffixes = CLIP_SUFFIXES + image_data.IMAGE_SUFFIXES
        files = sorted(p for p in source.rglob("*") if p.suffix.lower() in suffixes and p.is_file())
        rows = [(p, _caption_beside(p)) for p in files]
    else:
        raise VideoDataError(f"data: {source} is not a folder of clips or a .jsonl of path + caption")
    if not rows:
        raise VideoDataError(f"data: {source} holds no clip ({', '.join(CLIP_SUFFIXES)} or a still image)")
    items = []
    for path, caption in rows:
        size, frames = probe_clip(path)
        item = ClipItem(path, caption, size, frames)
        if not item.still and frames < min_frames:
            raise VideoDataError(f"{path}: {frames} frames, fewer than the {min_frames} of this "
                                 "model's shortest clip; remove it, or save one frame of it as a "
                                 "picture (a still image trains as a one-frame clip)")
        items.append(item)
    uncaptioned = sum(not i.caption for i in items)
    if uncaptioned:
        log.warning("%s: %d of %d clips have no caption; they train with an empty caption",
                    source, uncaptioned, len(items))
    return items


def assign_clip_buckets(items: list[ClipItem], sizes: list[tuple[int, int]], longest: int,
                        temporal: int, how: str = "first") -> tuple[list[ClipItem], list[Bucket]]:
    """Each clip with its (width, height, frames) bucket (``how="windows"``: each window of a
    long clip, see the module docstring); a clip whose size bucket needs more than
    ``MAX_UPSCALE`` x upscaling is skipped with a warning naming it.

    Raises:
        VideoDataError: when no clip is left.
    """
    kept, chosen = [], []
    for item in items:
        size = image_data.nearest_bucket(item.size, sizes)
        scale = max(size[0] / item.size[0], size[1] / item.size[1]) if size else math.inf
        if scale > image_data.MAX_UPSCALE:
            log.warning("skipping %s: %dx%d px would be upscaled more than %gx", item.path, *item.size,
                        image_data.MAX_UPSCALE)
            continue
        frames = frame_bucket(item.frames, longest, temporal)
        windows = item.frames // frames if how == "windows" else 1
        for k in range(windows):
            kept.append(dataclasses.replace(item, start=k * frames))
            chosen.append((*size, frames))
    if not kept:
        raise VideoDataError("data: no clip is large enough for the chosen resolution; lower it")
    return kept, chosen


def frames_to_uint8(video: torch.Tensor) -> np.ndarray:
    """(3, F, H, W) in [-1, 1] -> (F, H, W, 3) uint8 (what a clip file holds)."""
    return ((video.clamp(-1, 1) + 1) * 127.5).round().byte().permute(1, 2, 3, 0).cpu().numpy()


def write_clip(path: Path, frames: np.ndarray, fps: int = 8) -> Path:
    """Writes (F, H, W, 3) uint8 frames as an H.264 mp4 / mov (yuv420p: even sides; plays in a
    browser), a VP9 webm, or a GIF, by the path's suffix."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    codec = {".gif": "gif", ".webm": "libvpx-vp9"}.get(suffix, "libx264")
    with av.open(str(path), mode="w") as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "rgb8" if codec == "gif" else "yuv420p"
        for array in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(array), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path
