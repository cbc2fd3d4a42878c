"""Sliding-window + global-token attention (Longformer-style masks) that really cuts work.

Semantics (identical in every implementation). Query ``i`` attends to key ``j`` iff

* ``j`` is in the same document as ``i`` (documents are contiguous runs of equal ``doc_ids``
  in a row; without ``doc_ids`` the whole row is one document), and
* ``j`` is not padding (``key_padding_mask[b, j]`` is True for real tokens), and
* ``j`` is in the window: ``0 <= i - j < window`` when causal, ``|i - j| < window`` otherwise,
  **or** ``j`` is a global token: one of the first ``global_tokens`` positions *of its document*
  (per document, which is the natural meaning for packed rows), and ``j <= i`` when causal.

Globals are global *keys* only: every query sees them, but a global query still sees only its
own window (the symmetric Longformer variant would cost an extra O(S) row per global token).
A query with no allowed key (e.g. a left-padding position) returns zeros, never NaN.

Implementations behind :func:`windowed_attention`:

* ``dense``: the reference and the "traditional" behaviour. Materializes the S x S boolean mask
  and the S x S scores (eager math). Memory and compute O(S^2) per head.
* ``blocked``: pure PyTorch + autograd. Queries are cut into blocks of ``B`` tokens (128 at W=256); block
  ``n`` sees the ``B + W - 1`` keys ending at its last query (a strided ``unfold`` view of the
  padded keys) plus the ``G`` global keys. All blocks go through ONE batched matmul, so there is
  no Python loop over blocks and the backward of the unfold is a single fold, not one full-size
  gradient per slice. Memory and compute O(S * (B + W + G)) per head. CPU and CUDA.
* ``flex``: ``torch.nn.attention.flex_attention`` with a ``create_block_mask`` block mask,
  compiled, CUDA only (FlexAttention has no CPU backward in torch 2.13). Sequence lengths are
  bucketed (at most 4 buckets per octave, multiples of 128) so compilation happens rarely; the
  block masks of data-independent masks (no padding, no packed documents) are cached per
  (S, W, G, causal, device).
* ``auto``: ``flex`` for CUDA tensors, else ``blocked``.

What this saves, honestly: against a dense mask or eager attention it saves both memory
(O(S*W) instead of O(S^2)) and compute. Fused SDPA (flash / memory-efficient kernels) already
keeps memory O(S), so against SDPA the saving is compute only, and only at S well above W.

GQA: ``k``/``v`` may have fewer heads than ``q`` (``H_q % H_kv == 0``); ``dense`` and ``blocked``
repeat them internally (``repeat_interleave``, O(S * D) extra bytes per repeated head, same
head mapping as transformers' ``repeat_kv``); ``flex`` uses ``enable_gqa`` without copies.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

Impl = Literal["auto", "dense", "blocked", "flex"]
IMPLS: tuple[str, ...] = ("auto", "dense", "blocked", "flex")
# Queries per block in `blocked`: min(128, max(16, W // 2)). Keys seen per query block are
# B + W - 1 (+ G), so the wasted score columns are a (B - 1) / W fraction, while the k/v window
# copies made for the batched matmul hold (B + W + G) * D / B values per token; larger blocks
# also make the CPU/GPU batched matmuls more efficient. Measured in bench/long/windowed_scaling.py.
MAX_BLOCK_SIZE = 128


def default_block_size(window: int) -> int:
    """Query block length used by ``blocked`` for a window of ``window`` tokens."""
    return min(MAX_BLOCK_SIZE, max(16, window // 2))


@dataclass(frozen=True)
class WindowSpec:
    """What a windowed attention mask allows.

    Attributes:
        window: Keys per query in the sliding window, the query itself included (tokens, >= 1).
            Causal: keys ``i - window + 1 .. i``. Non-causal: ``|i - j| < window``.
        global_tokens: Leading tokens of each document that every query of that document may
            attend to (tokens, >= 0).
        causal: Whether queries may only look at keys at or before their own position.
    """

    window: int
    global_tokens: int = 4
    causal: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"WindowSpec.window must be an integer >= 1 (tokens), got {self.window!r}")
        if (
            isinstance(self.global_tokens, bool)
            or not isinstance(self.global_tokens, int)
            or self.global_tokens < 0
        ):
            raise ValueError(
                f"WindowSpec.global_tokens must be an integer >= 0 (tokens), got {self.global_tokens!r}"
            )
        if not isinstance(self.causal, bool):
            raise ValueError(f"WindowSpec.causal must be a bool, got {self.causal!r}")

    def validate_for_length(self, seq_len: int) -> None:
        """Rejects a window or a global count larger than the (maximum) sequence length.

        Call it at config time with the run's maximum sequence length. At run time shorter
        batches are fine: ``windowed_attention`` simply clips W and G to the batch length.

        Args:
            seq_len: Maximum sequence length of the run (tokens).

        Raises:
            ValueError: Naming the field, its value and the allowed range.
        """
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1 (tokens), got {seq_len!r}")
        if self.window > seq_len:
            raise ValueError(
                f"WindowSpec.window={self.window} is above the sequence length {seq_len}; allowed "
                f"range is 1..{seq_len} (a window that covers the whole sequence is full attention)"
            )
        if self.global_tokens > seq_len:
            raise ValueError(
                f"WindowSpec.global_tokens={self.global_tokens} is above the sequence length "
                f"{seq_len}; allowed range is 0..{seq_len}"
            )


def windowed_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    spec: WindowSpec,
    *,
    impl: Impl = "auto",
    key_padding_mask: Tensor | None = None,
    doc_ids: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Sliding-window + global-token attention on ``[batch, heads, seq, head_dim]`` tensors.

    Args:
        q: Queries ``[B, H, S, D]``.
        k: Keys ``[B, H_kv, S, D]`` with ``H % H_kv == 0`` (GQA handled here, see module doc).
        v: Values ``[B, H_kv, S, D_v]``.
        spec: The mask: window, global tokens, causality. W and G are clipped to S.
        impl: ``"auto"``, ``"dense"``, ``"blocked"`` or ``"flex"`` (see module doc).
        key_padding_mask: ``[B, S]`` bool (or 0/1), True for real tokens; padded keys are never
            attended to. Padded queries still produce an output (zeros if they see no key).
        doc_ids: ``[B, S]`` integers; each contiguous run of equal values is one packed
            document. No attention crosses a document boundary; globals are per document.
        scale: Score scale; default ``1 / sqrt(D)``.

    Returns:
        ``[B, H, S, D_v]`` attention output, same dtype as ``q``.

    Raises:
        ValueError: Bad shapes, an unknown ``impl``, or ``flex`` on a non-CUDA device.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    _check_shapes(q, k, v)
    batch, _, seq, head_dim = q.shape
    scale = head_dim**-0.5 if scale is None else float(scale)
    qdoc, kdoc, start = _token_tables(batch, seq, q.device, key_padding_mask, doc_ids)
    if impl == "auto":
        impl = "flex" if q.is_cuda else "blocked"
    if impl == "dense":
        return _dense(q, k, v, spec, qdoc, kdoc, start, scale)
    if impl == "blocked":
        return _blocked(q, k, v, spec, qdoc, kdoc, start, scale, packed=doc_ids is not None)
    static = key_padding_mask is None and doc_ids is None
    return _flex(q, k, v, spec, qdoc, kdoc, start, scale, static=static)


# -- shared helpers ---------------------------------------------------------------------------
def _check_shapes(q: Tensor, k: Tensor, v: Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be [batch, heads, seq, head_dim]; got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(
            "q, k, v must share batch and seq (windowed attention is self-attention without a "
            f"cache); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k head_dim differ: {q.shape[-1]} vs {k.shape[-1]}")
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads % kv_heads:
        raise ValueError(f"query heads ({heads}) must be a multiple of key/value heads ({kv_heads})")


def _repeat_kv(k: Tensor, v: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    rep = heads // k.shape[1]
    if rep == 1:
        return k, v
    return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)


def _token_tables(
    batch: int,
    seq: int,
    device: torch.device,
    key_padding_mask: Tensor | None,
    doc_ids: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token tables shared by all implementations, each ``[B, S]`` int64.

    Returns:
        ``qdoc``: document index (0, 1, ... per contiguous run) of each query;
        ``kdoc``: the same for keys, ``-1`` for padding keys (never equals a query's document);
        ``start``: position of the first token of each token's document.
    """
    if doc_ids is None:
        qdoc = torch.zeros(batch, seq, dtype=torch.long, device=device)
        start = torch.zeros(batch, seq, dtype=torch.long, device=device)
    else:
        if doc_ids.shape != (batch, seq):
            raise ValueError(f"doc_ids must be [batch, seq] = {(batch, seq)}, got {tuple(doc_ids.shape)}")
        doc_ids = doc_ids.to(device)
        is_start = torch.ones(batch, seq, dtype=torch.bool, device=device)
        is_start[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
        qdoc = is_start.long().cumsum(1) - 1
        positions = torch.arange(seq, device=device).expand(batch, seq)
        start = torch.where(is_start, positions, 0).cummax(dim=1).values
    kdoc = qdoc
    if key_padding_mask is not None:
        if key_padding_mask.shape != (batch, seq):
            raise ValueError(
                f"key_padding_mask must be [batch, seq] = {(batch, seq)}, got {tuple(key_padding_mask.shape)}"
            )
        kdoc = torch.where(key_padding_mask.to(device=device, dtype=torch.bool), qdoc, -1)
    return qdoc, kdoc, start


def _softmax(scores: Tensor) -> Tensor:
    # Low-precision scores: softmax in float32 (as transformers' eager path), cast back.
    if scores.dtype in (torch.float16, torch.bfloat16):
        return torch.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)
    return torch.softmax(scores, dim=-1)


# -- dense reference --------------------------------------------------------------------------
def dense_mask(spec: WindowSpec, qdoc: Tensor, kdoc: Tensor, start: Tensor, q_offset: int = 0) -> Tensor:
    """Materialized ``[B, S_q, S_k]`` bool mask (True = attend) from the per-token tables.

    ``q_offset`` places query ``r`` at key position ``q_offset + r`` (cached decoding).
    """
    device = kdoc.device
    i = torch.arange(qdoc.shape[1], device=device)[:, None] + q_offset
    j = torch.arange(kdoc.shape[1], device=device)[None, :]
    diff = i - j  # [S_q, S_k]; > 0 means the key is in the past
    window = spec.window
    in_window = (diff >= 0) & (diff < window) if spec.causal else diff.abs() < window
    is_global = (j - start[:, None, : kdoc.shape[1]]) < spec.global_tokens  # [B, 1, S_k]
    if spec.causal:
        is_global = is_global & (diff >= 0)
    same_doc = qdoc[:, :, None] == kdoc[:, None, :]
    return same_doc & (in_window | is_global)


def _dense(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    spec: WindowSpec,
    qdoc: Tensor,
    kdoc: Tensor,
    start: Tensor,
    scale: float,
    q_offset: int = 0,
) -> Tensor:
    k, v = _repeat_kv(k, v, q.shape[1])
    allowed = dense_mask(spec, qdoc, kdoc, start, q_offset)[:, None]  # [B, 1, S_q, S_k]
    scores = (q * scale) @ k.transpose(-1, -2)  # [B, H, S_q, S_k]: the O(S^2) tensor
    # finfo.min instead of -inf: a fully masked row gives a uniform softmax (no NaN), zeroed below.
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    out = _softmax(scores) @ v
    return out * allowed.any(-1, keepdim=True).to(out.dtype)


def _dense_from_tables(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    spec: WindowSpec,
    key_padding_mask: Tensor | None,
    scale: float | None,
    q_offset: int,
) -> Tensor:
    """Dense path for ``S_q <= S_k`` (cached decoding): query r sits at key ``q_offset + r``.

    One document per row (packed rows are a training-time format).
    """
    batch, _, q_len, head_dim = q.shape
    kv_len = k.shape[2]
    scale = head_dim**-0.5 if scale is None else float(scale)
    qdoc = torch.zeros(batch, q_len, dtype=torch.long, device=q.device)
    _, kdoc, start = _token_tables(batch, kv_len, q.device, key_padding_mask, None)
    return _dense(q, k, v, spec, qdoc, kdoc, start, scale, q_offset)


# -- blocked: O(S * (W + G)) ------------------------------------------------------------------
def _blocked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    spec: WindowSpec,
    qdoc: Tensor,
    kdoc: Tensor,
    start: Tensor,
    scale: float,
    *,
    packed: bool,
    block_size: int | None = None,
) -> Tensor:
    k, v = _repeat_kv(k, v, q.shape[1])
    batch, heads, seq, head_dim = q.shape
    window = min(spec.window, seq)
    n_glob = min(spec.global_tokens, seq)
    if packed and not spec.causal and n_glob > window:
        raise ValueError(
            f"impl='blocked' does not support non-causal packed documents with global_tokens "
            f"({n_glob}) > window ({window}); use impl='dense' or impl='flex'"
        )
    left = window - 1  # keys before the first query of a block
    right = 0 if spec.causal else window - 1  # keys after the last query of a block
    # With packed documents a block is at most W long. A query i whose globals lie outside its
    # window has its document start s <= i - W <= i - blk < (first query of its block), so s is
    # also the document start of the block's first query: one set of G global keys per block
    # serves every query that needs them (the others mask the slots out by document).
    block_size = default_block_size(window) if block_size is None else block_size
    blk = min(block_size, seq, window) if packed else min(block_size, seq)
    n_blk = math.ceil(seq / blk)
    seq_pad = n_blk * blk
    kw_len = blk + left + right  # window keys seen by one query block
    tail = seq_pad - seq + right
    device = q.device

    # Query blocks [B*H*n_blk, blk, D]: a view after padding the tail.
    q3 = F.pad(q * scale, (0, 0, 0, seq_pad - seq)).reshape(batch * heads * n_blk, blk, head_dim)
    # Key/value windows as overlapping strided views: window n starts at real key n*blk - left.
    # [B, H, n_blk, kw_len, D]; no copy yet.
    k_win = F.pad(k, (0, 0, left, tail)).unfold(2, kw_len, blk).transpose(-1, -2)
    v_win = F.pad(v, (0, 0, left, tail)).unfold(2, kw_len, blk).transpose(-1, -2)

    # Mask of window slots (no head dim). Slot t of block n is key j = n*blk - left + t, query a
    # of the block is i = n*blk + a, so i - j = a + left - t: the band a <= t <= a + left + right
    # is the same in every block; documents and padding come from the unfolded token tables.
    a = torch.arange(blk, device=device)[:, None]
    t = torch.arange(kw_len, device=device)[None, :]
    band = (t >= a) & (t <= a + left + right)  # [blk, kw_len]
    qd = F.pad(qdoc, (0, seq_pad - seq), value=-2).view(batch, n_blk, blk)  # -2: padded rows
    kd = F.pad(kdoc, (left, tail), value=-1).unfold(1, kw_len, blk)  # [B, n_blk, kw_len]
    mask = band & (qd[..., :, None] == kd[..., None, :])  # [B, n_blk, blk, kw_len]

    if n_glob:
        # Global keys of block n: the first G tokens of the document of its first query.
        j = start[:, ::blk, None] + torch.arange(n_glob, device=device)  # [B, n_blk, G]
        j_safe = j.clamp(max=seq - 1)
        rows = torch.arange(batch, device=device)[:, None, None]
        k_glob = k.transpose(1, 2)[rows, j_safe].permute(0, 3, 1, 2, 4)  # [B, H, n_blk, G, D]
        v_glob = v.transpose(1, 2)[rows, j_safe].permute(0, 3, 1, 2, 4)
        i = torch.arange(seq_pad, device=device).view(1, n_blk, blk, 1)
        dist = i - j[:, :, None, :]  # [B, n_blk, blk, G]
        # Keys inside the window are counted there already; causal also excludes future keys.
        outside = dist >= window if spec.causal else dist.abs() >= window
        kd_glob = kdoc.gather(1, j_safe.view(batch, -1)).view_as(j)
        g_mask = outside & (j < seq)[:, :, None, :] & (qd[..., :, None] == kd_glob[:, :, None, :])
        mask = torch.cat([mask, g_mask], dim=-1)
        # One materialized copy of each key list (the batched matmul would copy the overlapping
        # view anyway): [B, H, n_blk, kw_len + G, D], i.e. (W + B + G) * D / B values per token.
        k_all, v_all = torch.cat([k_win, k_glob], dim=-2), torch.cat([v_win, v_glob], dim=-2)
    else:
        k_all, v_all = k_win, v_win
    n_keys = mask.shape[-1]
    k3 = k_all.reshape(-1, n_keys, head_dim)
    v3 = v_all.reshape(-1, n_keys, v.shape[-1])

    # Additive mask added in place to the matmul output (one pass; a masked_fill would add a
    # pass in the backward too, while the softmax gradient is already exactly 0 where the
    # probability is 0). finfo.min / 2 keeps score + bias finite in fp16, so a fully masked row
    # is uniform, not NaN (it is zeroed below). The bias has no head dim: B * S * (K) values.
    bias = torch.zeros(mask.shape, dtype=q.dtype, device=device)
    bias.masked_fill_(~mask, torch.finfo(q.dtype).min / 2)
    scores = torch.bmm(q3, k3.transpose(1, 2))  # [B*H*n_blk, blk, n_keys]: ONE matmul, all blocks
    scores.view(batch, heads, n_blk, blk, n_keys).add_(bias[:, None])  # bmm backward needs no output
    out = torch.bmm(_softmax(scores), v3).view(batch, heads, seq_pad, -1)[:, :, :seq]
    row_ok = mask.any(-1).reshape(batch, 1, seq_pad, 1)[:, :, :seq]  # queries with >= 1 key
    return out * row_ok.to(out.dtype)


# -- flex (CUDA) ------------------------------------------------------------------------------
_BLOCK_MASK_CACHE: dict[tuple, object] = {}
_BLOCK_MASK_CACHE_MAX = 32  # entries; a 32k block mask is ~1 MB of int32 block indices
_COMPILED_FLEX: Callable | None = None


def bucket_length(seq: int) -> int:
    """Length that ``flex`` pads a sequence to: a multiple of 128, at most 4 buckets per octave.

    Padding waste is at most 127 tokens or 25%, whichever is larger, and a run with lengths
    1..32k compiles at most ~30 shapes instead of one per length.
    """
    if seq <= 128:
        return 128
    half = 2 ** (math.ceil(math.log2(seq)) - 1)
    step = max(128, half // 4)
    return math.ceil(seq / step) * step


def flex_mask_mod(spec: WindowSpec, qdoc: Tensor, kdoc: Tensor, start: Tensor) -> Callable:
    """FlexAttention ``mask_mod`` for the tables of :func:`_token_tables` (index-based)."""
    window, n_glob, causal = spec.window, spec.global_tokens, spec.causal

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        diff = q_idx - kv_idx
        in_window = ((diff >= 0) & (diff < window)) if causal else ((diff < window) & (diff > -window))
        is_global = (kv_idx - start[b, kv_idx]) < n_glob
        if causal:
            is_global = is_global & (diff >= 0)
        return (qdoc[b, q_idx] == kdoc[b, kv_idx]) & (in_window | is_global)

    return mask_mod


def _flex(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    spec: WindowSpec,
    qdoc: Tensor,
    kdoc: Tensor,
    start: Tensor,
    scale: float,
    *,
    static: bool,
) -> Tensor:
    if q.device.type != "cuda":
        raise ValueError(
            f"impl='flex' needs CUDA tensors (FlexAttention has no CPU backward in this torch), got "
            f"device {q.device}; use impl='blocked' or impl='auto'"
        )
    global _COMPILED_FLEX
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
    batch, heads, seq, _ = q.shape
    seq_b = bucket_length(seq)
    pad = seq_b - seq
    qp, kp, vp = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    # Bucket padding: padded keys get document -1 (never attended), padded queries -2 (no key,
    # output 0, sliced away below).
    qdoc_b = F.pad(qdoc, (0, pad), value=-2)
    kdoc_b = F.pad(kdoc, (0, pad), value=-1)
    start_b = F.pad(start, (0, pad))
    spec_eff = WindowSpec(min(spec.window, seq), min(spec.global_tokens, seq), spec.causal)
    if static:  # every row is the same: keep one
        qdoc_b, kdoc_b, start_b = qdoc_b[:1], kdoc_b[:1], start_b[:1]
    mask_mod = flex_mask_mod(spec_eff, qdoc_b, kdoc_b, start_b)
    if static:
        # The mask depends on (S, W, G, causal) only: build once per shape and device.
        key = (seq, seq_b, spec_eff, str(q.device))
        block_mask = _BLOCK_MASK_CACHE.get(key)
        if block_mask is None:
            zero = torch.zeros((), dtype=torch.long, device=q.device)

            def static_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
                return mask_mod(zero, h, q_idx, kv_idx)

            block_mask = create_block_mask(static_mod, None, None, seq_b, seq_b, device=q.device)
            if len(_BLOCK_MASK_CACHE) >= _BLOCK_MASK_CACHE_MAX:
                _BLOCK_MASK_CACHE.pop(next(iter(_BLOCK_MASK_CACHE)))
            _BLOCK_MASK_CACHE[key] = block_mask
    else:
        # Padding / documents make the mask data-dependent: rebuilt per call (cheap on GPU).
        block_mask = create_block_mask(mask_mod, batch, None, seq_b, seq_b, device=q.device)
    out = _COMPILED_FLEX(
        qp, kp, vp, block_mask=block_mask, scale=scale, enable_gqa=heads != k.shape[1]
    )
    return out[:, :, :seq]
