"""Attention of packed rows one document at a time, instead of through a dense block mask.

A packed row holds several documents; its position ids restart at each one. transformers' SDPA
path turns that into a (B, 1, S, S) block-diagonal mask, and a masked SDPA call computes every
query-key block of the row: S^2 scores where the documents need only sum(L_i^2) / 2 (causal,
within each document), and it keeps an additive float copy of the mask per layer. Here each
document gets its own causal SDPA call (the flash kernel on CPUs and GPUs, no mask), and the
outputs are joined into the layer's (B, S, H, D) output in one copy, as transformers' own
SDPA path makes one. The same scores, softmax and outputs up to float summation order: no
attention crosses a document, as with the mask.

Only models that opt in (:func:`enable_document_attention`, which marks their attention
modules) take this path, and only for one-row batches whose position ids restart (the engine's
packed micro-batches) and layers not split into head groups; every other call goes to the SDPA
function unchanged. Under fake tensors (the memory planner's trace) the boundaries
cannot be read: the row is traced as one document, one call over the whole row, which keeps
at least what the per-document calls keep (the same outputs and log-sum-exps, a larger kernel
workspace).

The dense mask is still built once per forward by transformers (it is built before the
attention function is known to skip it); the per-layer work and copies are what this saves.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lora_gui.attention.wrapping import already_wraps, mark_wrapper

DOCUMENTS_ATTR = "attention_by_document"  # set on a model's attention modules to opt in
GROUPS_ATTR = "attention_head_groups"  # head groups (long context) keep their own calls
_WRAPPED = "_lora_gui_documents"


def document_bounds(position_ids: Tensor | None, seq_len: int) -> list[tuple[int, int]] | None:
    """(start, end) of every document of a one-row batch whose positions restart, or None.

    None: no position ids, several rows, positions that never restart (one document), or fake
    tensors whose values cannot be read (the caller then treats the row as one document).
    """
    from transformers import masking_utils
    from transformers.utils.import_utils import is_tracing

    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[0] != 1 \
            or position_ids.shape[1] != seq_len:
        return None
    # looked up at call time: the planner's trace patches it to say whether rows are packed
    doc_ids = masking_utils.find_packed_sequence_indices(position_ids)
    if doc_ids is None or is_tracing(doc_ids):
        return None
    starts = torch.nonzero(torch.diff(doc_ids[0], prepend=doc_ids[0, :1] - 1)).flatten().tolist()
    return list(zip(starts, [*starts[1:], seq_len]))


def _packed_row(position_ids: Tensor | None, seq_len: int) -> bool:
    """True when the planner's trace (fake tensors) says this row holds several documents."""
    from transformers import masking_utils
    from transformers.utils.import_utils import is_tracing

    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[0] != 1 \
            or position_ids.shape[1] != seq_len or not is_tracing(position_ids):
        return False
    return masking_utils.find_packed_sequence_indices(position_ids) is not None


def attention_by_document(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                          bounds: list[tuple[int, int]], dropout: float = 0.0,
                          scaling: float | None = None) -> Tensor:
    """Causal SDPA of each document's slice of (1, H, S, D) query / key / value; returns the
    (1, S, H, D) output, as transformers' attention functions return it."""
    from transformers.integrations.sdpa_attention import repeat_kv, use_gqa_in_sdpa

    gqa: dict[str, Any] = {}
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:  # grouped-query attention, as transformers' SDPA path runs it
        if use_gqa_in_sdpa(None, key, value):
            gqa = {"enable_gqa": True}
        else:
            key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    # split, not sliced: one backward node joins each tensor's gradient in one copy, where a
    # slice's backward fills a zero tensor of the whole row per document and adds them up
    sizes = [e - s for s, e in bounds]
    pieces = [F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling, is_causal=True,
                                             **gqa)
              for q, k, v in zip(query.split(sizes, dim=2), key.split(sizes, dim=2),
                                 value.split(sizes, dim=2))]
    # one copy into the (B, S, H, D) layout, read straight from the pieces (their transposed views)
    return torch.cat([p.transpose(1, 2) for p in pieces], dim=1)


def with_documents(fn: Any) -> Any:
    """``fn`` (an SDPA attention function) wrapped so that an opted-in module attends each
    packed document on its own (``fn`` itself when it already is, under other wrappers too)."""
    if already_wraps(fn, _WRAPPED):  # under other wrappers too (lora_gui.attention.wrapping)
        return fn

    def attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                  attention_mask: Tensor | None, *args: Any, **kwargs: Any) -> tuple[Tensor, Any]:
        if not getattr(module, DOCUMENTS_ATTR, False) or args or kwargs.get("output_attentions") \
                or query.shape[2] != key.shape[2] or (getattr(module, GROUPS_ATTR, 1) or 1) > 1:
            return fn(module, query, key, value, attention_mask, *args, **kwargs)
        seq_len = query.shape[2]
        bounds = document_bounds(kwargs.get("position_ids"), seq_len)
        if bounds is None and _packed_row(kwargs.get("position_ids"), seq_len):
            bounds = [(0, seq_len)]  # traced: one document, an upper bound (see module doc)
        if bounds is None:
            return fn(module, query, key, value, attention_mask, *args, **kwargs)
        out = attention_by_document(module, query, key, value, bounds, kwargs.get("dropout", 0.0),
                                    kwargs.get("scaling"))
        return out, None

    return mark_wrapper(attention, fn, _WRAPPED)


def register_document_attention() -> None:
    """Wraps transformers' ``sdpa`` attention function with :func:`with_documents` (idempotent;
    modules that did not opt in see no change)."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    AttentionInterface.register("sdpa", with_documents(ALL_ATTENTION_FUNCTIONS["sdpa"]))


def enable_document_attention(model: nn.Module) -> int:
    """Marks every attention module of a (peft-wrapped) transformers model that runs ``sdpa``
    to attend packed documents one at a time; returns how many were marked (0: not sdpa)."""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    if getattr(getattr(base, "config", None), "_attn_implementation", None) != "sdpa":
        return 0
    register_document_attention()
    count = 0
    for module in base.modules():
        if hasattr(module, "num_key_value_groups") and hasattr(module, "k_proj"):
            setattr(module, DOCUMENTS_ATTR, True)
            count += 1
    return count
