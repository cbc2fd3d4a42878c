"""Image data: a folder of images with captions, aspect-ratio buckets, resize + crop to a bucket.

Captions come from a same-name ``.txt`` file next to each image (kohya convention) or from a
``metadata.jsonl`` in the folder (Hugging Face imagefolder convention: one JSON object a line
with ``file_name`` and ``text``). An image without a caption trains with an empty caption (one
warning with the count). Unreadable or truncated images are skipped with a warning naming the
file; when none are left the run stops with :class:`ImageDataError`.

Buckets (aspect-ratio bucketing, as NovelAI and kohya do it): for a target ``resolution`` R,
every (width, height) with both sides multiples of 64, area at most R^2 and as close to it as
the 64 grid allows, and a long/short ratio at most ``max_ratio``. Each image goes to the bucket
whose aspect ratio is nearest (in log space), is resized so that it covers the bucket and is
centre-cropped; the crop's top-left corner is kept for SDXL's micro-conditioning.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from lora_gui.errors import UserError

log = logging.getLogger(__name__)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
GRID = 64  # bucket sides are multiples of 64 px (8 latent pixels: UNet down/up-sampling is exact)
MIN_RESOLUTION, MAX_RESOLUTION = 64, 1536
MAX_UPSCALE = 2.0  # an image needing more than 2x upscaling per side is too small for the run


class ImageDataError(UserError, ValueError):
    """The image data cannot be used; the message names the folder or file."""


@dataclass(frozen=True)
class ImageItem:
    """One usable training image: its file, caption and original size (width, height)."""

    path: Path
    caption: str
    size: tuple[int, int]


def check_resolution(resolution: int) -> int:
    """64-1536 px in steps of 64.

    Raises:
        ImageDataError: naming the value.
    """
    if not MIN_RESOLUTION <= resolution <= MAX_RESOLUTION or resolution % GRID:
        raise ImageDataError(f"resolution: {resolution} must be {MIN_RESOLUTION}-{MAX_RESOLUTION} "
                             f"in steps of {GRID}")
    return resolution


def make_buckets(resolution: int, max_ratio: float = 2.0) -> list[tuple[int, int]]:
    """(width, height) buckets of about resolution^2 pixels, sides multiples of 64, sorted."""
    check_resolution(resolution)
    area = resolution * resolution
    buckets = set()
    for width in range(GRID, int(resolution * math.sqrt(max_ratio)) + GRID, GRID):
        height = min(area // width // GRID * GRID, resolution * 4)
        if height >= GRID and max(width, height) / min(width, height) <= max_ratio + 1e-9:
            buckets.add((width, height))
            buckets.add((height, width))
    return sorted(buckets)


def nearest_bucket(size: tuple[int, int], buckets: list[tuple[int, int]],
                   no_upscale: bool = False) -> tuple[int, int] | None:
    """The bucket with the nearest aspect ratio; with ``no_upscale`` only buckets that fit inside
    the image. None when no bucket can be used."""
    w, h = size
    usable = [b for b in buckets if not no_upscale or (b[0] <= w and b[1] <= h)]
    if not usable:
        return None
    ratio = math.log(w / h)
    return min(usable, key=lambda b: (abs(math.log(b[0] / b[1]) - ratio), -b[0] * b[1]))


def resize_crop(img: Image.Image, bucket: tuple[int, int]) -> tuple[Image.Image, tuple[int, int]]:
    """Resizes to cover ``bucket`` (width, height) and centre-crops; returns the image and the
    crop's top-left corner (top, left) in the resized image (SDXL crop coordinates)."""
    bw, bh = bucket
    scale = max(bw / img.width, bh / img.height)
    new = (max(bw, round(img.width * scale)), max(bh, round(img.height * scale)))
    img = img.resize(new, Image.Resampling.BICUBIC)
    left, top = (new[0] - bw) // 2, (new[1] - bh) // 2
    return img.crop((left, top, left + bw, top + bh)), (top, left)


def to_tensor(img: Image.Image) -> torch.Tensor:
    """(3, H, W) float in [-1, 1], the VAE's input range."""
    array = np.asarray(img.convert("RGB"), dtype=np.float32) / 127.5 - 1.0
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def read_caption_text(path: Path) -> str:
    """A caption or metadata file as UTF-8 (a BOM is dropped), like the text data loaders.

    Raises:
        ImageDataError: naming the file, line and byte when it is not UTF-8 or cannot be read.
    """
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ImageDataError(f"{path}: cannot read caption file ({err.strerror or err})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ImageDataError(f"{path}:{line}: not valid UTF-8 (byte {err.start}); save the file "
                             "as UTF-8") from None


def _read_metadata(folder: Path) -> dict[str, str]:
    meta = folder / "metadata.jsonl"
    if not meta.is_file():
        return {}
    captions = {}
    for n, line in enumerate(read_caption_text(meta).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            captions[row["file_name"]] = str(row.get("text", row.get("caption", "")))
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ImageDataError(f"{meta}:{n}: expected a JSON object with file_name and text "
                                 f"({type(err).__name__}: {err})") from None
    return captions


def _probe(path: Path) -> tuple[int, int] | None:
    """The image's (width, height) after a full decode (truncated files fail here), or None."""
    try:
        with Image.open(path) as img:
            img.load()
            return img.size
    except (OSError, UnidentifiedImageError, ValueError) as err:
        log.warning("skipping %s: unreadable image (%s)", path, err)
        return None


def load_image_folder(folder: str | Path) -> list[ImageItem]:
    """Every readable image in ``folder`` (sorted by name) with its caption.

    Raises:
        ImageDataError: the folder is missing or holds no readable image.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ImageDataError(f"data: {folder} is not a folder of images")
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ImageDataError(f"data: {folder} holds no image ({', '.join(IMAGE_SUFFIXES)})")
    metadata = _read_metadata(folder)
    items, uncaptioned = [], 0
    for path in files:
        size = _probe(path)
        if size is None:
            continue
        txt = path.with_suffix(".txt")
        caption = read_caption_text(txt).strip() if txt.is_file() else \
            metadata.get(path.relative_to(folder).as_posix(), "").strip()
        uncaptioned += not caption
        items.append(ImageItem(path, caption, size))
    if uncaptioned:
        log.warning("%s: %d of %d images have no caption (no .txt, not in metadata.jsonl); they "
                    "train with an empty caption", folder, uncaptioned, len(items))
    if not items:
        raise ImageDataError(f"data: none of the {len(files)} images in {folder} could be read")
    return items


def assign_buckets(items: list[ImageItem], buckets: list[tuple[int, int]],
                   no_upscale: bool = False) -> tuple[list[ImageItem], list[tuple[int, int]]]:
    """Each usable item with its bucket; images that are too small are skipped with a warning.

    Too small: with ``no_upscale``, no bucket fits inside the image; otherwise its bucket would
    need more than ``MAX_UPSCALE`` x upscaling per side.

    Raises:
        ImageDataError: when no image is left.
    """
    kept, chosen = [], []
    for item in items:
        bucket = nearest_bucket(item.size, buckets, no_upscale)
        if bucket is not None and not no_upscale:
            scale = max(bucket[0] / item.size[0], bucket[1] / item.size[1])
            bucket = bucket if scale <= MAX_UPSCALE else None
        if bucket is None:
            smallest = min(buckets, key=lambda b: b[0] * b[1])
            log.warning("skipping %s: %dx%d px is smaller than the smallest usable bucket (%dx%d%s)",
                        item.path, *item.size, *smallest,
                        ", no_upscale" if no_upscale else f" at most {MAX_UPSCALE:g}x upscaled")
            continue
        kept.append(item)
        chosen.append(bucket)
    if not kept:
        raise ImageDataError("data: no image is large enough for the chosen resolution; lower "
                             "resolution or switch off bucket_no_upscale")
    return kept, chosen


def load_pixels(item: ImageItem, bucket: tuple[int, int]) -> tuple[torch.Tensor, tuple[int, int]]:
    """The image resized and cropped to ``bucket`` as a (3, H, W) tensor, and the crop corner."""
    with Image.open(item.path) as img:
        cropped, corner = resize_crop(img.convert("RGB"), bucket)
    return to_tensor(cropped), corner
