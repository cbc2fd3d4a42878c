"""Windowed attention over the image tokens of a DiT (SD3 / Flux): 2D neighbourhoods plus the
text tokens as global tokens, without the full score matrix.

Semantics (the same in :func:`dense_image_window_attention`, the masked reference, and
:func:`image_window_attention`). A joint sequence holds ``T`` text tokens and ``h x w`` image
tokens (row-major), text first (Flux) or image first (SD3). Then:

* a text query attends to every key (text tokens are global queries and global keys);
* an image query at grid cell ``(r, c)`` attends to every text key and to the image keys
  ``(r', c')`` with ``|r - r'| <= radius`` and ``|c - c'| <= radius``: a (2 radius + 1)^2
  neighbourhood, clipped at the picture's borders (a corner query sees fewer keys).

This is :mod:`lora_gui.attention.windowed`'s sliding window + global tokens carried to two
dimensions, with the same blocked approach: image queries are cut into tiles of
``tile x tile`` tokens; a tile sees the ``(tile + 2 radius)^2`` keys of its halo (one strided
``unfold`` of the padded key grid, copied once) plus the ``T`` text keys (scored against all
tiles in one matmul, never copied per tile); one batched matmul and one softmax over
``halo + T`` columns serve every tile. Text queries are full rows: plain SDPA. Memory and
compute of the image rows O(N x ((tile + 2 radius)^2 + T)) per head instead of O(N x (N + T)).

What it saves, honestly: against eager attention (S x S scores kept) memory and compute;
against fused SDPA (flash / memory-efficient kernels keep O(S) memory) compute only, and only
when the picture has many more tokens than a halo; it keeps O(N x halo) scores for backward,
which fused SDPA does not. It changes the model's function (far image tokens no longer see
each other): an adapter trained with it is used with it; see docs/BENCHMARKS.md for the loss.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from lora_gui.attention.windowed import _softmax  # float32 softmax for 16-bit scores

DEFAULT_TILE = 8  # image tokens per tile side: 64 queries share one halo


@dataclass(frozen=True)
class ImageLayout:
    """Where the tokens of a joint DiT sequence are.

    Attributes:
        text_tokens: prompt-embedding tokens ``T`` (>= 0).
        grid: image tokens as (rows, columns).
        text_first: True for Flux ([text, image]), False for SD3 ([image, text]).
    """

    text_tokens: int
    grid: tuple[int, int]
    text_first: bool

    @property
    def seq_len(self) -> int:
        return self.text_tokens + self.grid[0] * self.grid[1]

    def split(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(text part, image part) of ``[B, H, S, D]`` along S."""
        n = self.grid[0] * self.grid[1]
        if self.text_first:
            return x[:, :, : self.text_tokens], x[:, :, self.text_tokens:]
        return x[:, :, n:], x[:, :, :n]

    def join(self, text: Tensor, image: Tensor) -> Tensor:
        return torch.cat([text, image] if self.text_first else [image, text], dim=2)


def check_radius(radius: int) -> None:
    """Raises ValueError naming a radius that is not a whole number >= 1 (tokens)."""
    if isinstance(radius, bool) or not isinstance(radius, int) or radius < 1:
        raise ValueError(f"image window radius must be a whole number >= 1 (image tokens), got {radius!r}")


def image_window_mask(layout: ImageLayout, radius: int, device: torch.device | None = None) -> Tensor:
    """The ``[S, S]`` bool mask (True = attend) of the semantics above."""
    rows, cols = layout.grid
    r = torch.arange(rows, device=device).repeat_interleave(cols)
    c = torch.arange(cols, device=device).repeat(rows)
    near = ((r[:, None] - r[None, :]).abs() <= radius) & ((c[:, None] - c[None, :]).abs() <= radius)
    t, n = layout.text_tokens, rows * cols
    mask = torch.ones(layout.seq_len, layout.seq_len, dtype=torch.bool, device=device)
    img = slice(t, t + n) if layout.text_first else slice(0, n)
    mask[img, img] = near
    return mask


def dense_image_window_attention(q: Tensor, k: Tensor, v: Tensor, layout: ImageLayout, radius: int,
                                 scale: float | None = None) -> Tensor:
    """Reference: the full ``[S, S]`` scores with the mask applied (eager math, O(S^2))."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q * scale) @ k.transpose(-1, -2)
    scores = scores.masked_fill(~image_window_mask(layout, radius, q.device), torch.finfo(scores.dtype).min)
    return _softmax(scores) @ v


def image_window_attention(q: Tensor, k: Tensor, v: Tensor, layout: ImageLayout, radius: int,
                           scale: float | None = None, tile: int = DEFAULT_TILE) -> Tensor:
    """Blocked windowed attention on ``[B, H, S, D]`` tensors (see the module docstring).

    Raises:
        ValueError: a sequence that does not match ``layout``, or a bad radius / tile.
    """
    check_radius(radius)
    if q.shape[2] != layout.seq_len or k.shape[2] != layout.seq_len:
        raise ValueError(f"sequence of {q.shape[2]} tokens does not match {layout.text_tokens} text + "
                         f"{layout.grid[0]} x {layout.grid[1]} image tokens")
    if tile < 1:
        raise ValueError(f"tile must be >= 1, got {tile}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q_txt, q_img = layout.split(q)
    k_txt, k_img = layout.split(k)
    v_txt, v_img = layout.split(v)
    out_txt = F.scaled_dot_product_attention(q_txt, k, v, scale=scale) if layout.text_tokens else q_txt
    out_img = _tiled(q_img, k_img, v_img, k_txt, v_txt, layout.grid, radius, scale, tile)
    return layout.join(out_txt, out_img)


def _tiles(x: Tensor, grid: tuple[int, int], tile: int, pad: int, size: int) -> Tensor:
    """``[B, H, N, D]`` image tokens -> ``[B, H, n_tiles, size * size, D]`` windows of ``size``
    tokens a side starting every ``tile`` tokens, the grid padded by ``pad`` before it."""
    b, h, _, d = x.shape
    rows, cols = grid
    n_r, n_c = math.ceil(rows / tile), math.ceil(cols / tile)
    extra_r, extra_c = n_r * tile + size - tile - pad - rows, n_c * tile + size - tile - pad - cols
    x = F.pad(x.reshape(b, h, rows, cols, d), (0, 0, pad, extra_c, pad, extra_r))
    win = x.unfold(2, size, tile).unfold(3, size, tile)  # [B, H, n_r, n_c, D, size, size]
    return win.permute(0, 1, 2, 3, 5, 6, 4).reshape(b, h, n_r * n_c, size * size, d)


def _tile_mask(grid: tuple[int, int], radius: int, tile: int, device: torch.device) -> Tensor:
    """``[n_tiles, tile^2, halo^2]`` bool: halo slot allowed for the tile's query (in its
    neighbourhood and inside the picture). Queries past the picture's edge are cropped later."""
    rows, cols = grid
    n_r, n_c, halo = math.ceil(rows / tile), math.ceil(cols / tile), tile + 2 * radius
    ty = torch.arange(n_r, device=device).repeat_interleave(n_c)[:, None, None]
    tx = torch.arange(n_c, device=device).repeat(n_r)[:, None, None]
    qa = torch.arange(tile * tile, device=device)
    qr, qc = (qa // tile)[None, :, None], (qa % tile)[None, :, None]
    ka = torch.arange(halo * halo, device=device)
    kr, kc = (ka // halo)[None, None, :], (ka % halo)[None, None, :]
    key_row, key_col = ty * tile - radius + kr, tx * tile - radius + kc  # grid cell of each slot
    real_key = (key_row >= 0) & (key_row < rows) & (key_col >= 0) & (key_col < cols)
    near = ((kr - radius - qr).abs() <= radius) & ((kc - radius - qc).abs() <= radius)
    return near & real_key


def _tiled(q: Tensor, k: Tensor, v: Tensor, k_txt: Tensor, v_txt: Tensor, grid: tuple[int, int],
           radius: int, scale: float, tile: int) -> Tensor:
    b, h, n, d = q.shape
    rows, cols = grid
    tile = min(tile, max(rows, cols))
    halo = tile + 2 * radius
    q_t = _tiles(q * scale, grid, tile, 0, tile)  # [B, H, n_tiles, tile^2, D]
    k_h, v_h = _tiles(k, grid, tile, radius, halo), _tiles(v, grid, tile, radius, halo)
    allowed = _tile_mask(grid, radius, tile, q.device)
    bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device)
    bias.masked_fill_(~allowed, torch.finfo(q.dtype).min / 2)  # finite: no NaN in padded rows
    scores = q_t @ k_h.transpose(-1, -2)  # [B, H, n_tiles, tile^2, halo^2]
    scores = scores + bias
    if k_txt.shape[2]:  # text keys: every image query sees them, scored once for all tiles
        text_scores = q_t @ k_txt[:, :, None].transpose(-1, -2)  # [B, H, n_tiles, tile^2, T]
        scores = torch.cat([scores, text_scores], dim=-1)
    probs = _softmax(scores)
    out = probs[..., : halo * halo] @ v_h
    if k_txt.shape[2]:
        out = out + probs[..., halo * halo:] @ v_txt[:, :, None]
    n_r, n_c = math.ceil(rows / tile), math.ceil(cols / tile)
    out = out.view(b, h, n_r, n_c, tile, tile, -1).permute(0, 1, 2, 4, 3, 5, 6)
    out = out.reshape(b, h, n_r * tile, n_c * tile, -1)[:, :, :rows, :cols]
    return out.reshape(b, h, n, -1)  # every real query has itself in its window: no empty row


# -- inside a DiT ---------------------------------------------------------------------------------
_LAYOUT: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("dit_image_grid",
                                                                                  default=None)


@contextlib.contextmanager
def image_grid(rows: int, cols: int) -> Iterator[None]:
    """Tells the windowed processors the image-token grid of the forward run inside (the
    flow-matching loss knows it from the latents; the sequence alone does not say it)."""
    token = _LAYOUT.set((rows, cols))
    try:
        yield
    finally:
        _LAYOUT.reset(token)


# the builtin itself: a wrapper installed over F.scaled_dot_product_attention (the memory trace's
# kernel watch) still reaches this mode with the builtin as ``func``
_SDPA = torch._C._nn.scaled_dot_product_attention


class _WindowedSDPA(TorchFunctionMode):
    """Routes the processor's ``F.scaled_dot_product_attention`` calls to the windowed kernel."""

    def __init__(self, radius: int, text_first: bool, tile: int) -> None:
        super().__init__()
        self.radius, self.text_first, self.tile = radius, text_first, tile

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch API)
        kwargs = kwargs or {}
        grid = _LAYOUT.get()
        if func is not _SDPA or grid is None:
            return func(*args, **kwargs)
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
        named = dict(zip(names, args, strict=False))
        named.update(kwargs)
        plain = named.get("attn_mask") is None and not named.get("dropout_p") and not named.get("is_causal")
        if not plain:  # a mask, dropout or causality this switch does not model: leave the call alone
            return func(*args, **kwargs)
        q, k, v = named["query"], named["key"], named["value"]
        n = grid[0] * grid[1]
        text = q.shape[2] - n
        if text < 0 or k.shape[2] != q.shape[2]:
            return func(*args, **kwargs)
        layout = ImageLayout(text, grid, self.text_first)
        return image_window_attention(q, k, v, layout, self.radius, named.get("scale"), self.tile)


class WindowedImageAttention:
    """Wraps a DiT attention processor: its SDPA call becomes :func:`image_window_attention`
    while the flow-matching loss runs (inside :func:`image_grid`); elsewhere (sampling with a
    diffusers pipeline) the processor is unchanged."""

    def __init__(self, inner, radius: int, text_first: bool, tile: int = DEFAULT_TILE) -> None:
        check_radius(radius)
        self.inner, self.radius, self.text_first, self.tile = inner, radius, text_first, tile

    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204 (processor API)
        with _WindowedSDPA(self.radius, self.text_first, self.tile):
            return self.inner(*args, **kwargs)
