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

transformers builds that dense mask once per forward, before any attention function runs
(S^2 bytes: 4 MiB and 17 ms on a CPU at 2,048 tokens). A model whose every attention module
attends by document skips it: its modeling module's ``create_causal_mask`` returns no mask for a
packed row of such a model (every other model, and a model with a module split into head groups
or switched off, gets the mask as before).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lora_gui.attention.wrapping import already_wraps, mark_wrapper

DOCUMENTS_ATTR = "attention_by_document"  # set on a model's attention modules to opt in
GROUPS_ATTR = "attention_head_groups"  # head groups (long context) keep their own calls
_WRAPPED = "_lora_gui_documents"
_MASK_WRAPPED = "_lora_gui_documents_mask"
# id(config) -> (the config, the attention modules that opted in), weakly: a model that opted in
_OPTED: dict[int, tuple[weakref.ref, list[weakref.ref]]] = {}


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
    marked = []
    for module in base.modules():
        if hasattr(module, "num_key_value_groups") and hasattr(module, "k_proj"):
            setattr(module, DOCUMENTS_ATTR, True)
            marked.append(weakref.ref(module))
    modeling = sys.modules.get(type(base).__module__)
    inner = getattr(base, "model", None)  # the decoder stack (LlamaModel) builds the mask
    for owner in {modeling, sys.modules.get(type(inner).__module__) if inner is not None else None}:
        mask_fn = getattr(owner, "create_causal_mask", None)
        if mask_fn is not None and not already_wraps(mask_fn, _MASK_WRAPPED):
            owner.create_causal_mask = _without_packed_mask(mask_fn)
    if marked:
        key = id(base.config)
        _OPTED[key] = (weakref.ref(base.config), marked)
        weakref.finalize(base.config, _OPTED.pop, key, None)  # a planner's traced model goes away
    return len(marked)


def _every_module_by_document(config: Any) -> bool:
    """Whether ``config``'s model opted in and each of its attention modules attends by document."""
    entry = _OPTED.get(id(config))
    if entry is None or entry[0]() is not config:
        return False
    modules = [ref() for ref in entry[1]]
    return all(m is not None and getattr(m, DOCUMENTS_ATTR, False)
               and (getattr(m, GROUPS_ATTR, 1) or 1) <= 1 for m in modules)


def _without_packed_mask(fn: Any) -> Any:
    """transformers' ``create_causal_mask`` returning no mask for a packed one-row batch of a
    model whose every attention module attends by document (which reads the position ids)."""
    from transformers import masking_utils

    def create_causal_mask(config: Any, inputs_embeds: Tensor, attention_mask: Tensor | None,
                           past_key_values: Any, position_ids: Tensor | None = None,
                           *args: Any, **kwargs: Any) -> Any:
        if (attention_mask is None and not args and not kwargs and position_ids is not None
                and position_ids.dim() == 2 and position_ids.shape[0] == 1
                and (past_key_values is None or past_key_values.get_seq_length() == 0)
                and _every_module_by_document(config)
                and masking_utils.find_packed_sequence_indices(position_ids) is not None):
            return None
        return fn(config, inputs_embeds, attention_mask, past_key_values, position_ids, *args, **kwargs)

    return mark_wrapper(create_causal_mask, fn, _MASK_WRAPPED)
