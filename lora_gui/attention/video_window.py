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
  a tile sees the keys of its halo, ``min(t + 2 f, n)`` tokens in each dimension (the halo's start
  clamped inside the clip, so no padded keys). Flash-style (a ``torch.autograd.Function``): the
  forward runs the tiles in chunks (``CHUNK_BYTES`` of float32 scores a chunk, or more where that
  would take over ``MAX_CHUNKS`` chunks), each chunk's output and float32 logsumexp, and keeps only q, k, v,
  the output and the logsumexp (O(N x D)); the backward recomputes each chunk's probabilities
  from the logsumexp and adds dK / dV back to the key tokens over the (overlapping) halos. The
  ``[N, N]`` scores never exist, and the ``N x halo`` ones exist one chunk at a time. The tile
  sides and chunks are chosen from the shapes alone (:func:`tile_sides`, :class:`_Layout`), so
  the plan's trace, which runs this code on fake tensors, picks the run's tiles and chunks.
* ``flex`` (CUDA): ``torch.nn.attention.flex_attention`` with a ``create_block_mask`` block mask
  of the window (cached per grid and window), compiled; it keeps the output and a float32
  logsumexp, as fused SDPA does. If it cannot run, one log line and ``blocked``.
* ``auto``: ``flex`` for CUDA tensors, else ``blocked``.

What it saves, honestly: against full attention the work (O(N x window) instead of O(N^2)); what
it keeps for the backward is what fused SDPA and FlexAttention keep (O(N x D)), so its memory
over SDPA is one chunk's transient scores. The plan of a CUDA run traces this kernel while the run
uses FlexAttention: the same kept tensors, but FlexAttention's transients are its block mask
(O(N^2 / 128^2) per grid) and on-chip tiles, not a chunk of scores; the plan counts the chunk.
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
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.overrides import TorchFunctionMode

from lora_gui.attention.windowed import _softmax  # float32 softmax for 16-bit scores

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
    if any(not 1 <= s for s in tiles):
        raise ValueError(f"tile sides must be >= 1, got {tiles!r}")
    tiles = tuple(min(s, g) for s, g in zip(tiles, grid, strict=True))
    return _BlockedAttention.apply(q, k, v, _Layout(grid, window, tiles, q.shape, q.device), scale)


CHUNK_BYTES = 64 * 2**20  # float32 scores of one chunk of tiles (all batches and heads)
MAX_CHUNKS = 32  # at most this many chunks a call (few Python iterations, so the plan's trace stays fast)


class _Layout:
    """The tiles of one call, from the shapes alone: per tile the flat token index of its queries
    (``qidx [n_tiles, tile_vol]``, padded queries clamped to a real token, ``qvalid`` False) and of
    its halo's keys (``kidx [n_tiles, halo_vol]``), the per-dimension masks of the (query, key) pairs
    the window allows, ``perm`` (token -> its row in the tile layout) and the chunks of tiles."""

    def __init__(self, grid: Grid, window: Window, tiles: Grid, shape: torch.Size,
                 device: torch.device) -> None:
        b, h, _, _ = shape
        self.counts = [math.ceil(g / s) for g, s in zip(grid, tiles, strict=True)]
        halos = [_halo_index(g, s, f, device) for g, s, f in zip(grid, tiles, window, strict=True)]
        self.near = [near for _, near in halos]  # [n_tiles_dim, tile, halo_dim] each
        self.n_tiles, self.tile_vol = math.prod(self.counts), math.prod(tiles)
        self.halo_vol = math.prod(keys.shape[1] for keys, _ in halos)
        strides = (grid[1] * grid[2], grid[2], 1)
        (kt, _), (kr, _), (kc, _) = halos
        kidx = (kt[:, None, None, :, None, None] * strides[0] + kr[None, :, None, None, :, None] * strides[1]
                + kc[None, None, :, None, None, :])
        self.kidx = kidx.reshape(self.n_tiles, self.halo_vol)
        pos = [torch.arange(m * s, device=device).view(m, s) for m, s in zip(self.counts, tiles, strict=True)]
        valid = [p < g for p, g in zip(pos, grid, strict=True)]
        pos = [p.clamp(max=g - 1) for p, g in zip(pos, grid, strict=True)]
        qidx = (pos[0][:, None, None, :, None, None] * strides[0] + pos[1][None, :, None, None, :, None]
                * strides[1] + pos[2][None, None, :, None, None, :])
        self.qidx = qidx.reshape(self.n_tiles, self.tile_vol)
        qvalid = (valid[0][:, None, None, :, None, None] & valid[1][None, :, None, None, :, None]
                  & valid[2][None, None, :, None, None, :])
        self.qvalid = qvalid.reshape(self.n_tiles, self.tile_vol)
        # token (t, r, c) sits at tile (t // st, r // sr, c // sc), place (t % st, r % sr, c % sc)
        t, r, c = _coords(grid, device)
        tile = ((t // tiles[0]) * self.counts[1] + r // tiles[1]) * self.counts[2] + c // tiles[2]
        place = ((t % tiles[0]) * tiles[1] + r % tiles[1]) * tiles[2] + c % tiles[2]
        self.perm = tile * self.tile_vol + place
        per_tile = b * h * self.tile_vol * self.halo_vol * 4  # bytes of one tile's float32 scores
        size = max(CHUNK_BYTES // per_tile, math.ceil(self.n_tiles / MAX_CHUNKS), 1)
        self.chunks = [(i, min(i + size, self.n_tiles)) for i in range(0, self.n_tiles, size)]

    def allowed(self, lo: int, hi: int) -> Tensor:
        """Bool ``[hi - lo, tile_vol, halo_vol]``: the pairs the window allows in tiles lo..hi-1."""
        ids = torch.arange(lo, hi, device=self.kidx.device)
        ct, cr, cc = self.counts
        nt, nr, nc = self.near[0][ids // (cr * cc)], self.near[1][(ids // cc) % cr], self.near[2][ids % cc]
        both = (nt[:, :, None, None, :, None, None] & nr[:, None, :, None, None, :, None]
                & nc[:, None, None, :, None, None, :])
        return both.reshape(hi - lo, self.tile_vol, self.halo_vol)


def _chunk_scores(q: Tensor, k: Tensor, lay: _Layout, lo: int, hi: int, scale: float,
                  acc: torch.dtype) -> tuple[Tensor, Tensor]:
    """Tiles lo..hi-1: their queries ``[B, H, m, tile_vol, D]`` and their masked scores ``[B, H, m,
    tile_vol, halo_vol]`` in ``acc`` (float32 for 16-bit inputs), the same ops forward and backward."""
    qc = q[:, :, lay.qidx[lo:hi]]
    scores = ((qc * scale) @ k[:, :, lay.kidx[lo:hi]].transpose(-1, -2)).to(acc)
    # finite fill: a padded query may see no key; its row stays finite (and its output is dropped)
    return qc, scores.masked_fill_(~lay.allowed(lo, hi), -1e30)


class _BlockedAttention(torch.autograd.Function):
    """Flash-style blocked window attention: the forward runs the tiles chunk by chunk and keeps
    only q, k, v, the output and a float32 (float64 for float64 inputs) logsumexp per query; the
    backward recomputes each chunk's probabilities from the logsumexp (flash-attention's backward:
    ``delta = rowsum(dO * O)``, ``dS = P * (dP - delta)``) and adds dK, dV back to the key tokens
    with ``index_add_`` over the halos (which overlap)."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, lay: _Layout, scale: float) -> Tensor:
        b, h, n, d = q.shape
        acc = torch.promote_types(q.dtype, torch.float32)
        rows = lay.n_tiles * lay.tile_vol  # the tile layout's rows (padded queries included)
        out_t = q.new_empty(b, h, rows, v.shape[-1])
        lse = torch.empty(b, h, rows, dtype=acc, device=q.device)
        for lo, hi in lay.chunks:
            _, scores = _chunk_scores(q, k, lay, lo, hi, scale, acc)
            part = torch.logsumexp(scores, dim=-1)  # [B, H, m, tile_vol]
            probs = scores.sub_(part[..., None]).exp_().to(v.dtype)
            rows = slice(lo * lay.tile_vol, hi * lay.tile_vol)
            out_t[:, :, rows] = (probs @ v[:, :, lay.kidx[lo:hi]]).flatten(2, 3)
            lse[:, :, rows] = part.flatten(2, 3)
            del scores, probs, part
        out = out_t[:, :, lay.perm]  # tile layout -> token order (each token once)
        del out_t
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.lay, ctx.scale = lay, scale
        return out

    @staticmethod
    @once_differentiable  # first-order only (training needs no more)
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        lay, scale = ctx.lay, ctx.scale
        b, h, n, d = q.shape
        acc = lse.dtype
        delta = (grad.to(acc) * out.to(acc)).sum(-1)  # [B, H, N]
        dq_t = q.new_empty(b, h, lay.n_tiles * lay.tile_vol, d)
        dk = torch.zeros(k.shape, dtype=acc, device=k.device)
        dv = torch.zeros(v.shape, dtype=acc, device=v.device)
        for lo, hi in lay.chunks:
            rows = slice(lo * lay.tile_vol, hi * lay.tile_vol)
            qc, probs = _chunk_scores(q, k, lay, lo, hi, scale, acc)
            probs = probs.sub_(lse[:, :, rows].unflatten(2, (hi - lo, lay.tile_vol))[..., None]).exp_()
            keep = lay.qvalid[lo:hi, :, None].to(grad.dtype)  # padded queries: no gradient anywhere
            go = (grad[:, :, lay.qidx[lo:hi]] * keep).to(v.dtype)  # [B, H, m, tile_vol, Dv]; the grad
            # may come in float32 (a bfloat16 output's consumer upcast it)
            kidx = lay.kidx[lo:hi]
            vc = v[:, :, kidx]
            dv_c = probs.to(v.dtype).transpose(-1, -2) @ go  # [B, H, m, halo_vol, Dv]
            dv.index_add_(2, kidx.flatten(), dv_c.flatten(2, 3).to(acc))
            del dv_c
            dprobs = (go @ vc.transpose(-1, -2)).to(acc)
            dscores = dprobs.sub_(delta[:, :, lay.qidx[lo:hi]][..., None] * keep.to(acc)).mul_(probs)
            del probs, vc
            dscores = dscores.to(q.dtype)
            dq_t[:, :, rows] = ((dscores @ k[:, :, kidx]) * scale).flatten(2, 3)
            dk_c = (dscores.transpose(-1, -2) @ qc) * scale
            dk.index_add_(2, kidx.flatten(), dk_c.flatten(2, 3).to(acc))
            del dscores, dk_c, qc
        dq = dq_t[:, :, lay.perm]
        return dq, dk.to(k.dtype), dv.to(v.dtype), None, None


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
