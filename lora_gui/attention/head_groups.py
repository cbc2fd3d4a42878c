"""Attention in head groups: each layer's attention runs as N calls, each over a group of
key/value heads and the query heads that read them, instead of one call over all heads.

Why: on CUDA, the fused attention kernels allocate scratch in their backward that grows with the
number of query heads the call sees. FlashAttention-2's backward (PyTorch
``aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp``, ``mha_bwd``) holds a float32
``dq_accum`` of B x S x H x D x 4 bytes and, for grouped-query attention (fewer key/value heads than
query heads), ``dk_expanded`` / ``dv_expanded`` of B x S x H x D x 2 bytes each. With N groups each
call sees H / N query heads, so that scratch is N times smaller (Llama-3.1-8B, 8 key/value heads,
N = 8: 4 KiB a token instead of 32 KiB). The result is the same: attention heads are independent,
so the outputs of the groups, put side by side, are the output of the single call (exact up to
floating-point rounding of the kernels).

What it costs: N kernel launches instead of one per layer, and in the backward the gradients of
the groups' queries / keys / values are joined into one tensor (one more query-sized gradient for a
moment, where the kernel's scratch used to be). The CPU flash kernel has no such scratch, so on a
CPU the switch only costs time.

Mechanism (transformers 5.x): the model's attention function (``sdpa`` or this package's
``windowed``) is registered with ``AttentionInterface`` wrapped by :func:`with_head_groups`; the
wrapper reads ``attention_head_groups`` from the attention module that calls it and falls
through to the original function when it is absent or 1, so models without the switch are
untouched. :func:`enable_attention_head_groups` sets it on every attention module of a model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from lora_gui.attention.wrapping import already_wraps, mark_wrapper

log = logging.getLogger(__name__)

GROUPS_ATTR = "attention_head_groups"  # on each attention module: calls per layer
_WRAPPED = "_lora_gui_head_groups"  # marks a wrapped attention function


def grouped_attention(fn: Callable[..., tuple[Tensor, Any]], module: nn.Module, query: Tensor, key: Tensor,
                      value: Tensor, attention_mask: Tensor | None, groups: int,
                      **kwargs: Any) -> tuple[Tensor, None]:
    """Runs ``fn`` (a transformers attention function) once per group of key/value heads.

    Args:
        fn: attention function ``(module, q, k, v, mask, **kw) -> ((B, S, H, D) output, weights)``.
        module: the attention module (its ``num_key_value_groups`` stays valid per group).
        query: (B, H, S, D); key, value: (B, H_kv, S_kv, D).
        attention_mask: None, a 2D (B, S_kv) padding mask, or a 4D mask whose head dimension is
            1 (shared) or H (sliced with the query heads).
        groups: calls per layer; must divide H_kv.

    Returns:
        The (B, S, H, D) output (as ``fn`` returns it) and None (no attention weights).
    """
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads % groups or heads % kv_heads:
        raise ValueError(f"attention in {groups} head groups: the layer's {kv_heads} key/value heads "
                         f"(and {heads} query heads) do not split into {groups} equal groups")
    q_per, kv_per = heads // groups, kv_heads // groups
    masks: list[Tensor | None] = [attention_mask] * groups
    if attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[1] == heads > 1:
        masks = list(attention_mask.split(q_per, dim=1))
    outs = [fn(module, q, k, v, m, **kwargs)[0]
            for q, k, v, m in zip(query.split(q_per, dim=1), key.split(kv_per, dim=1),
                                  value.split(kv_per, dim=1), masks)]
    return torch.cat(outs, dim=2), None


def with_head_groups(fn: Callable[..., tuple[Tensor, Any]]) -> Callable[..., tuple[Tensor, Any]]:
    """``fn`` wrapped so that a module with ``attention_head_groups`` > 1 runs it in groups
    (``fn`` itself when it already is, under other wrappers too)."""
    if already_wraps(fn, _WRAPPED):  # under other wrappers too (lora_gui.attention.wrapping)
        return fn

    def attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                  attention_mask: Tensor | None, *args: Any, **kwargs: Any) -> tuple[Tensor, Any]:
        groups = getattr(module, GROUPS_ATTR, 1) or 1
        if groups <= 1 or args or kwargs.get("output_attentions"):
            return fn(module, query, key, value, attention_mask, *args, **kwargs)
        return grouped_attention(fn, module, query, key, value, attention_mask, groups, **kwargs)

    return mark_wrapper(attention, fn, _WRAPPED)


def register_head_groups(name: str) -> None:
    """Wraps the attention function registered as ``name`` with :func:`with_head_groups` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if name not in ALL_ATTENTION_FUNCTIONS:
        raise ValueError(f"attention in head groups: no attention function named {name!r} is registered")
    AttentionInterface.register(name, with_head_groups(ALL_ATTENTION_FUNCTIONS[name]))


def key_value_heads(config: Any) -> int:
    """Key/value heads of a model config (its query heads when it has no GQA)."""
    if isinstance(config, dict):  # a config.json read as a dict
        return int(config.get("num_key_value_heads") or config.get("num_attention_heads") or 1)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(getattr(text, "num_key_value_heads", None) or getattr(text, "num_attention_heads", 1))


def check_head_groups(config: Any, groups: int) -> None:
    """Raises unless ``groups`` splits the model's key/value heads evenly (0 and 1: off)."""
    if groups < 0:
        raise ValueError(f"attention_head_groups: must be >= 0, got {groups}")
    kv = key_value_heads(config)
    if groups > 1 and kv % groups:
        divisors = [n for n in range(2, kv + 1) if kv % n == 0]
        raise ValueError(f"attention_head_groups: {groups} does not divide this model's {kv} key/value "
                         f"heads; use one of {divisors or 'none (one key/value head)'} or 0 (off)")


def enable_attention_head_groups(model: nn.Module, groups: int) -> int:
    """Runs every attention layer of a (peft-wrapped) transformers model in ``groups`` calls.

    Args:
        model: the model; its ``config._attn_implementation`` must be ``sdpa`` or ``windowed``.
        groups: calls per layer (a divisor of the key/value heads); 0 or 1: one call (off).

    Returns:
        The number of attention modules switched.

    Raises:
        ValueError: a count that does not divide the key/value heads, or an attention
            implementation that cannot run in groups (eager keeps its own weights).
    """
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    check_head_groups(base.config, groups)
    if groups <= 1:
        return 0
    impl = base.config._attn_implementation
    if impl not in ("sdpa", "windowed"):
        raise ValueError(f"attention_head_groups: needs the sdpa or windowed attention, this model "
                         f"uses {impl!r}; set attn_backend=sdpa")
    register_head_groups(impl)
    count = 0
    for module in base.modules():
        if hasattr(module, "num_key_value_groups") and hasattr(module, "k_proj"):
            setattr(module, GROUPS_ATTR, groups)
            count += 1
    if not count:
        raise ValueError(f"attention_head_groups: {type(base).__name__} has no attention layers with "
                         "key/value projections (Llama, Qwen2, Mistral style); set it to 0")
    log.info("attention in %d head groups in %d layers", groups, count)
    return count
