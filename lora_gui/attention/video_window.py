"""Windowed space-time attention over the video tokens of Wan / LTX-Video self-attention: each
token attends only to the tokens within a local window in frames, rows and columns.

Semantics (the same in :func:`dense_video_window_attention`, the masked reference, and every
``impl`` of :func:`video_window_attention`). A clip is ``T x R x C`` tokens after patching (latent
frames, rows, columns; row-major in (t, r, c), the order Wan's patch embedding and LTX-Video's
packing give). With half-widths ``(ft, fr, fc)`` the query at ``(t, r, c)`` attends to the key at
``(t', r', c')`` iff ``|t - t'| <= ft``, ``|r - r'| <= fr`` and ``|c - c'| <= fc``: a window of
``(2 ft + 1) x (2 fr + 1) x (2 fc + 1)`` tokens, clipped at the clip's borders. Cross-attention
to the text is unchanged.

Implementations:

* ``dense``: the reference, the ``[N, N]`` mask and scores (eager math, O(N^2)); tests only.
* ``blocked`` (CPU, and the memory plan's): queries are cut into tiles of ``tt x tr x tc`` tokens;
  a tile sees the keys of its halo, ``min(t + 2 f, n)`` tokens in each dimension, gathered once
  (advanced indexing with the halo's start clamped inside the clip, so no padded keys), then one
  batched matmul and one softmax serve every tile. The ``[N, N]`` scores never exist: the scores
  are ``N x halo`` per head. The tile sides are chosen from the shapes alone
  (:func:`tile_sides`, the smallest scores + K / V copies), so the plan's trace, which runs this
  code on fake tensors, picks the run's tiles.
* ``flex`` (CUDA): ``torch.nn.attention.flex_attention`` with a ``create_block_mask`` block mask
  of the window (cached per grid and window), compiled; it keeps the output and a float32
  logsumexp, as fused SDPA does. If it cannot run, one log line and ``blocked``.
* ``auto``: ``flex`` for CUDA tensors, else ``blocked``.

What it saves, honestly: against full attention the work (O(N x window) instead of O(N^2)); the
``blocked`` kernel keeps ``N x halo`` scores per head for the backward, which fused SDPA (O(N))
does not keep, so on a CPU against SDPA it costs memory at small windows and saves it only
where the window is far smaller than the clip and the scores are compared with eager attention.
It changes the model's function (far tokens no longer see each other): an adapter trained with it
is meant to be used with it; docs/guide/video.md states the loss measured with and without.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from lora_gui.attention.windowed import _softmax  # float32 softmax for 16-bit scores
from lora_gui.image_settings import parse_video_window  # noqa: F401 (the setting's parser, here too)

log = logging.getLogger(__name__)

Window = tuple[int, int, int]  # half-widths (frames, rows, columns), latent tokens after patching
Grid = tuple[int, int, int]  # tokens (frames, rows, columns)
VIDEO_WINDOW_IMPLS = ("auto", "dense", "blocked", "flex")
MAX_TILE = 64  # tokens a tile side may have (the tile chooser's largest candidate)


def check_window(window: Window) -> None:
    """Raises ValueError naming a window that is not three whole numbers >= 0, not all 0."""
    whole = lambda w: isinstance(w, int) and not isinstance(w, bool) and w >= 0  # noqa: E731
    if not isinstance(window, tuple) or len(window) != 3 or not all(map(whole, window)) or not any(window):
        raise ValueError(f"video window must be three whole numbers >= 0 (frames, rows, columns), not all 0; "
                         f"got {window!r}")


def _coords(grid: Grid, device: torch.device | None) -> tuple[Tensor, Tensor, Tensor]:
    t, r, c = grid
    idx = torch.arange(t * r * c, device=device)
    return idx // (r * c), (idx // c) % r, idx % c


def video_window_mask(grid: Grid, window: Window, device: torch.device | None = None) -> Tensor:
    """The ``[N, N]`` bool mask (True = attend) of the semantics above."""
    near = None
    for pos, half in zip(_coords(grid, device), window, strict=True):
        part = (pos[:, None] - pos[None, :]).abs() <= half
        near = part if near is None else near & part
    return near


def dense_video_window_attention(q: Tensor, k: Tensor, v: Tensor, grid: Grid, window: Window,
                                 scale: float | None = None) -> Tensor:
    """Reference: the full ``[N, N]`` scores with the mask applied (eager math, O(N^2))."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q * scale) @ k.transpose(-1, -2)
    scores = scores.masked_fill(~video_window_mask(grid, window, q.device), torch.finfo(scores.dtype).min)
    return _softmax(scores) @ v


def video_window_attention(q: Tensor, k: Tensor, v: Tensor, grid: Grid, window: Window,
                           scale: float | None = None, impl: str = "auto",
                           tiles: Grid | None = None) -> Tensor:
    """Windowed space-time attention on ``[B, H, N, D]`` tensors (see the module docstring).

    Raises:
        ValueError: a sequence that does not match ``grid``, a bad window, tile or ``impl``.
    """
    check_window(window)
    n = math.prod(grid)
    if q.shape[2] != n or k.shape[2] != n or v.shape[2] != n:
        raise ValueError(f"sequence of {q.shape[2]} tokens does not match the clip's "
                         f"{grid[0]} x {grid[1]} x {grid[2]} tokens")
    if impl not in VIDEO_WINDOW_IMPLS:
        raise ValueError(f"impl must be one of {', '.join(VIDEO_WINDOW_IMPLS)}, got {impl!r}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if impl == "dense":
        return dense_video_window_attention(q, k, v, grid, window, scale)
    if impl == "flex" or (impl == "auto" and q.is_cuda):
        out = _flex_or_none(q, k, v, grid, window, scale, strict=impl == "flex")
        if out is not None:
            return out
    return _blocked(q, k, v, grid, window, scale, tiles or tile_sides(grid, window, q.shape[-1]))


# -- blocked ----------------------------------------------------------------------------------------
def _halo(n: int, tile: int, half: int) -> int:
    return min(tile + 2 * half, n)


def tile_sides(grid: Grid, window: Window, head_dim: int) -> Grid:
    """Query tile sides (frames, rows, columns) of the blocked kernel: the ones that keep the
    fewest values per head, the scores (padded queries x halo keys) plus the K and V copies
    (tiles x halo keys x head_dim x 2); a pure function of the shapes."""
    options = []
    for n in grid:
        sides = {n} | {s for s in (1, 2, 4, 8, 16, 32, MAX_TILE) if s < n}
        options.append(sorted(sides))
    best, best_cost = None, None
    for sides in itertools.product(*options):
        padded = math.prod(math.ceil(n / s) * s for n, s in zip(grid, sides, strict=True))
        halo = math.prod(_halo(n, s, h) for n, s, h in zip(grid, sides, window, strict=True))
        cost = padded * halo * (1 + 2 * head_dim / math.prod(sides))
        if best_cost is None or cost < best_cost:
            best, best_cost = sides, cost
    return best


def _halo_index(n: int, tile: int, half: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Per dimension: key positions ``[n_tiles, halo]`` of each tile's halo (start clamped inside
    the clip) and the bool ``[n_tiles, tile, halo]`` of the keys each query of the tile may see."""
    n_tiles, halo = math.ceil(n / tile), _halo(n, tile, half)
    first = torch.arange(n_tiles, device=device) * tile
    start = (first - half).clamp(0, n - halo)
    keys = start[:, None] + torch.arange(halo, device=device)  # [n_tiles, halo]
    queries = first[:, None] + torch.arange(tile, device=device)  # [n_tiles, tile]
    near = (queries[:, :, None] - keys[:, None, :]).abs() <= half
    return keys, near


def _blocked(q: Tensor, k: Tensor, v: Tensor, grid: Grid, window: Window, scale: float,
             tiles: Grid) -> Tensor:
    b, h, n, d = q.shape
    if any(not 1 <= s for s in tiles):
        raise ValueError(f"tile sides must be >= 1, got {tiles!r}")
    tiles = tuple(min(s, g) for s, g in zip(tiles, grid, strict=True))
    counts = [math.ceil(g / s) for g, s in zip(grid, tiles, strict=True)]
    (kt, nt), (kr, nr), (kc, nc) = (_halo_index(g, s, f, q.device)
                                    for g, s, f in zip(grid, tiles, window, strict=True))
    # the tile's allowed (query, key) pairs: the product of the three dimensions' [n_tiles, tile, halo]
    allowed = (nt[:, None, None, :, None, None, :, None, None]
               & nr[None, :, None, None, :, None, None, :, None]
               & nc[None, None, :, None, None, :, None, None, :])
    n_tiles, tile_vol = math.prod(counts), math.prod(tiles)
    halo_vol = kt.shape[1] * kr.shape[1] * kc.shape[1]
    bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device)
    bias.masked_fill_(~allowed, torch.finfo(q.dtype).min / 2)  # finite: padded queries give no NaN
    bias = bias.reshape(n_tiles, tile_vol, halo_vol)
    pad = [0, 0]  # F.pad's order: last dimension first (head_dim, then columns, rows, frames)
    for g, s, m in zip(reversed(grid), reversed(tiles), reversed(counts), strict=True):
        pad += [0, m * s - g]
    q_t = F.pad((q * scale).reshape(b, h, *grid, d), pad)
    q_t = q_t.view(b, h, counts[0], tiles[0], counts[1], tiles[1], counts[2], tiles[2], d)
    q_t = q_t.permute(0, 1, 2, 4, 6, 3, 5, 7, 8).reshape(b, h, n_tiles, tile_vol, d)
    index = (kt[:, None, None, :, None, None], kr[None, :, None, None, :, None],
             kc[None, None, :, None, None, :])

    def halo(x: Tensor) -> Tensor:  # [B, H, N, D] -> [B, H, n_tiles, halo_vol, D], one gather
        x = x.reshape(b, h, *grid, d)[:, :, index[0], index[1], index[2]]
        return x.reshape(b, h, n_tiles, halo_vol, d)

    scores = q_t @ halo(k).transpose(-1, -2)  # [B, H, n_tiles, tile_vol, halo_vol]
    out = _softmax(scores + bias) @ halo(v)  # [B, H, n_tiles, tile_vol, D]
    out = out.view(b, h, *counts, *tiles, -1).permute(0, 1, 2, 5, 3, 6, 4, 7, 8)
    out = out.reshape(b, h, counts[0] * tiles[0], counts[1] * tiles[1], counts[2] * tiles[2], -1)
    return out[:, :, : grid[0], : grid[1], : grid[2]].reshape(b, h, n, -1)  # each query sees itself


# -- flex (CUDA) ------------------------------------------------------------------------------------
_BLOCK_MASKS: dict[tuple, Any] = {}
_BLOCK_MASKS_MAX = 16  # (grid, window, device) entries
_FLEX: dict[str, Any] = {}  # the compiled flex_attention, or the reason it cannot run


def flex_mask_mod(grid: Grid, window: Window) -> Callable:
    """FlexAttention ``mask_mod`` of the window (token index -> (frame, row, column))."""
    _, rows, cols = grid
    ft, fr, fc = window

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        dt = q_idx // (rows * cols) - kv_idx // (rows * cols)
        dr = (q_idx // cols) % rows - (kv_idx // cols) % rows
        dc = q_idx % cols - kv_idx % cols
        return (dt.abs() <= ft) & (dr.abs() <= fr) & (dc.abs() <= fc)

    return mask_mod


def _flex_or_none(q: Tensor, k: Tensor, v: Tensor, grid: Grid, window: Window, scale: float,
                  strict: bool) -> Tensor | None:
    """FlexAttention on CUDA; None (after one log line) where it cannot run and ``strict`` is off."""
    if not q.is_cuda:
        if strict:
            raise ValueError(f"impl='flex' needs CUDA tensors, got device {q.device}; use 'blocked' or "
                             "'auto'")
        return None
    if "failed" in _FLEX and not strict:
        return None
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        if "fn" not in _FLEX:
            _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
        n = math.prod(grid)
        key = (grid, window, str(q.device))
        mask = _BLOCK_MASKS.get(key)
        if mask is None:
            mask = create_block_mask(flex_mask_mod(grid, window), None, None, n, n, device=q.device)
            if len(_BLOCK_MASKS) >= _BLOCK_MASKS_MAX:
                _BLOCK_MASKS.pop(next(iter(_BLOCK_MASKS)))
            _BLOCK_MASKS[key] = mask
        return _FLEX["fn"](q, k, v, block_mask=mask, scale=scale)
    except Exception as exc:  # noqa: BLE001 (any compile or kernel failure: the blocked kernel instead)
        if strict:
            raise
        _FLEX["failed"] = repr(exc)
        log.warning("video window: FlexAttention cannot run here (%s); using the blocked kernel", exc)
        return None


# -- inside a video transformer ---------------------------------------------------------------------
_SDPA = torch._C._nn.scaled_dot_product_attention  # the builtin (a wrapper over F.sdpa still reaches it)


class VideoGridState:
    """The token grid of the transformer's latest forward, set by a forward pre-hook and kept
    after it (a checkpointed block's recompute in the backward reads it again)."""

    def __init__(self) -> None:
        self.grid: Grid | None = None


class _WindowedSDPA(TorchFunctionMode):
    """Routes a self-attention processor's SDPA call (queries and keys: the clip's tokens) to
    :func:`video_window_attention` (entered only for self-attention: see
    :class:`WindowedVideoAttention`)."""

    def __init__(self, state: VideoGridState, window: Window, impl: str) -> None:
        super().__init__()
        self.state, self.window, self.impl = state, window, impl

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch API)
        kwargs = kwargs or {}
        if func is not _SDPA:
            return func(*args, **kwargs)
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
        named = dict(zip(names, args, strict=False))
        named.update(kwargs)
        q, k, v = named["query"], named["key"], named["value"]
        grid = self.state.grid
        if grid is None:
            raise RuntimeError("video window: self-attention ran before the transformer's forward said "
                               "the clip's grid (enable_video_window hooks that forward)")
        if q.shape[2] != math.prod(grid) or k.shape[2] != q.shape[2]:
            raise RuntimeError(f"video window: self-attention over {q.shape[2]} tokens, but the clip is "
                               f"{grid[0]} x {grid[1]} x {grid[2]} tokens")
        if named.get("attn_mask") is not None or named.get("dropout_p") or named.get("is_causal"):
            raise RuntimeError("video window: a self-attention call with a mask, dropout or causality "
                               "this window does not model")
        return video_window_attention(q, k, v, grid, self.window, named.get("scale"), self.impl)


class WindowedVideoAttention:
    """Wraps a Wan / LTX-Video attention processor: its self-attention SDPA call becomes
    :func:`video_window_attention` on the grid of the transformer's latest forward."""

    def __init__(self, inner: Any, state: VideoGridState, window: Window, impl: str = "auto") -> None:
        check_window(window)
        self.inner, self.state, self.window, self.impl = inner, state, window, impl

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # (attn, hidden_states, encoder_hidden_states, ...): the prompt given = cross-attention, unchanged
        text = kwargs["encoder_hidden_states"] if "encoder_hidden_states" in kwargs else \
            (args[2] if len(args) > 2 else None)
        if text is not None:
            return self.inner(*args, **kwargs)
        with _WindowedSDPA(self.state, self.window, self.impl):
            return self.inner(*args, **kwargs)


def token_grid_of(transformer: Any, args: tuple, kwargs: dict) -> Grid:
    """The clip's token grid of one transformer forward: Wan reads latents (B, C, T, H, W) and
    patchifies them by ``patch_size`` (t, h, w); LTX-Video reads packed tokens with ``num_frames``,
    ``height`` and ``width`` (latent sizes) and its ``patch_size_t`` / ``patch_size``."""
    config = transformer.config
    if "num_frames" in kwargs:  # LTX-Video
        pt, p = int(config.get("patch_size_t", 1)), int(config.get("patch_size", 1))
        return kwargs["num_frames"] // pt, kwargs["height"] // p, kwargs["width"] // p
    latents = kwargs.get("hidden_states", args[0] if args else None)
    pt, ph, pw = (int(x) for x in config.patch_size)
    _, _, t, hh, ww = latents.shape
    return t // pt, hh // ph, ww // pw


def enable_video_window(transformer: Any, window: Window, impl: str = "auto") -> VideoGridState:
    """Wraps every attention processor of a Wan / LTX-Video transformer (not peft-wrapped) and
    hooks its forward to record the clip's token grid; returns the shared state."""
    check_window(window)
    state = VideoGridState()

    def record(module: Any, args: tuple, kwargs: dict) -> None:
        state.grid = token_grid_of(module, args, kwargs)

    transformer.register_forward_pre_hook(record, with_kwargs=True)
    transformer.set_attn_processor({name: WindowedVideoAttention(p, state, window, impl)
                                    for name, p in transformer.attn_processors.items()})
    return state
