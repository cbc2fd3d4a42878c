"""Windowed attention as a transformers 5.x attention backend named ``"windowed"``.

Mechanism (transformers 5.23): :func:`register_windowed_attention` registers

* an attention function with ``AttentionInterface.register("windowed", ...)``: every model whose
  attention layers dispatch through ``ALL_ATTENTION_FUNCTIONS.get_interface`` (Llama, Qwen2,
  Mistral, GPT-NeoX, ...) calls it instead of SDPA; and
* a mask function with ``AttentionMaskInterface.register("windowed", ...)``: ``create_causal_mask``
  / ``create_sliding_window_causal_mask`` call it instead of building an S x S mask. It returns
  only the ``[B, S]`` bool padding mask (or ``None`` when nothing is padded), so no O(S^2)
  tensor is ever built; the window, globals and documents are applied inside the attention.

Settings live on the model config (so they travel with the model and per-layer code can read
them from ``module.config``): ``windowed_window`` (default 256), ``windowed_global_tokens``
(default 4) and ``windowed_impl`` (``"auto"``). To turn it on::

    from lora_gui.attention import enable_windowed_attention
    model = enable_windowed_attention(model, window=256, global_tokens=4)

or, before building a model::

    configure_windowed(cfg, window=256, global_tokens=4)   # also registers the backend
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="windowed")

Packed rows: when no 2D ``attention_mask`` is given, ``position_ids`` that restart (0, 1, 2, 0,
1, ...) mark packed documents, exactly as transformers' own masks detect them; no attention
crosses a document and globals are per document. Padding: the 2D ``attention_mask`` is honoured.

Native sliding windows (Mistral / Qwen2 ``sliding_window`` layers): the layer's own window is
respected: the window used is ``min(native, windowed_window)``; the global tokens are added on
top (they widen what a layer sees, which is the point of asking for them).

Cached decoding (``q_len < kv_len``, generation) falls back to the dense reference for those
few query rows (no packed documents there); training never takes that path.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers import AttentionInterface, PretrainedConfig, PreTrainedModel
from transformers.masking_utils import (
    AttentionMaskInterface,
    find_packed_sequence_indices,
    prepare_padding_mask,
)
from transformers.utils.import_utils import is_tracing

from lora_gui.attention.windowed import (
    IMPLS,
    WindowSpec,
    _dense_from_tables,
    windowed_attention,
)

ATTENTION_NAME = "windowed"
DEFAULT_WINDOW = 256  # tokens
DEFAULT_GLOBAL_TOKENS = 4  # tokens
WINDOW_ATTR = "windowed_window"
GLOBAL_ATTR = "windowed_global_tokens"
IMPL_ATTR = "windowed_impl"


def register_windowed_attention() -> None:
    """Registers the ``"windowed"`` attention and mask functions with transformers (idempotent).

    The attention function is registered able to run in head groups (a module's
    ``attention_head_groups``, :mod:`lora_gui.attention.head_groups`; one call when it has none)."""
    from lora_gui.attention.head_groups import with_head_groups

    AttentionInterface.register(ATTENTION_NAME, with_head_groups(windowed_attention_forward))
    AttentionMaskInterface.register(ATTENTION_NAME, windowed_mask)


def spec_from_config(
    config: PretrainedConfig, sliding_window: int | None = None, causal: bool = True
) -> WindowSpec:
    """The :class:`WindowSpec` a layer uses: config settings, clipped to a native sliding window.

    Args:
        config: Model config carrying ``windowed_window`` / ``windowed_global_tokens`` (or not:
            defaults 256 / 4).
        sliding_window: The layer's native sliding window (tokens), if any.
        causal: Whether the layer is causal.

    Returns:
        The spec; its window is ``min(windowed_window, sliding_window)``.
    """
    window = getattr(config, WINDOW_ATTR, DEFAULT_WINDOW)
    if sliding_window is not None:
        window = min(window, int(sliding_window))
    return WindowSpec(window, getattr(config, GLOBAL_ATTR, DEFAULT_GLOBAL_TOKENS), causal)


def configure_windowed(
    config: PretrainedConfig,
    window: int = DEFAULT_WINDOW,
    global_tokens: int = DEFAULT_GLOBAL_TOKENS,
    impl: str = "auto",
    max_seq_len: int | None = None,
) -> WindowSpec:
    """Validates and stores the window settings on a config, and registers the backend.

    Args:
        config: The model config (top level; sub-configs are not touched).
        window: Sliding window (tokens, >= 1).
        global_tokens: Global tokens per document (>= 0).
        impl: ``"auto"``, ``"dense"``, ``"blocked"`` or ``"flex"``.
        max_seq_len: If given, W and G above it are rejected (config-time check).

    Returns:
        The validated spec.

    Raises:
        ValueError: Bad window, global count or impl, or a model that cannot take it.
    """
    spec = WindowSpec(window, global_tokens)
    if max_seq_len is not None:
        spec.validate_for_length(max_seq_len)
    if impl not in IMPLS:
        raise ValueError(f"windowed impl must be one of {IMPLS}, got {impl!r}")
    check_windowed_support(config)
    setattr(config, WINDOW_ATTR, spec.window)
    setattr(config, GLOBAL_ATTR, spec.global_tokens)
    setattr(config, IMPL_ATTR, impl)
    register_windowed_attention()
    return spec


def enable_windowed_attention(
    model: PreTrainedModel,
    window: int = DEFAULT_WINDOW,
    global_tokens: int = DEFAULT_GLOBAL_TOKENS,
    impl: str = "auto",
    max_seq_len: int | None = None,
) -> PreTrainedModel:
    """Switches a built model (or a peft wrapper of one) to windowed attention, in place.

    Args:
        model: A transformers model, or a peft model wrapping one.
        window: Sliding window (tokens, >= 1).
        global_tokens: Global tokens per document (>= 0).
        impl: ``"auto"``, ``"dense"``, ``"blocked"`` or ``"flex"``.
        max_seq_len: If given, W and G above it are rejected.

    Returns:
        The same model object.

    Raises:
        ValueError: Naming the model class when it cannot take a custom attention function.
    """
    base = _base_model(model)
    check_windowed_support(base)
    configure_windowed(base.config, window, global_tokens, impl, max_seq_len)
    base.set_attn_implementation(ATTENTION_NAME)
    if base.config._attn_implementation != ATTENTION_NAME:
        raise ValueError(f"{type(base).__name__} refused attn_implementation={ATTENTION_NAME!r}")
    return model


def check_windowed_support(model_or_config: Any) -> None:
    """Raises unless the model (class) can run the ``"windowed"`` attention function.

    Checks, before any weights are loaded: the model class dispatches through transformers'
    ``AttentionInterface`` (``_supports_attention_backend``), it is not an encoder-decoder, and
    it has no attention dropout (the windowed kernels do not implement dropout).

    Args:
        model_or_config: A model, a model class, a peft wrapper or a config (resolved through
            ``AutoModelForCausalLM``'s mapping).

    Raises:
        ValueError: Naming the model class and the reason.
    """
    model_cls, config = _resolve(model_or_config)
    name = model_cls.__name__
    backend_ok = getattr(model_cls, "_supports_attention_backend", False)
    if not backend_ok or not model_cls._can_set_attn_implementation():
        raise ValueError(
            f"windowed attention cannot be used with {name}: it does not dispatch its attention "
            "through transformers' AttentionInterface (its attention is hard-coded). Use "
            "attention=full for this model."
        )
    if config is not None and getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"windowed attention cannot be used with {name}: encoder-decoder models unsupported")
    dropout = getattr(config, "attention_dropout", 0.0) if config is not None else 0.0
    if isinstance(dropout, float | int) and dropout > 0:
        raise ValueError(
            f"windowed attention cannot be used with {name}: attention_dropout={dropout} but the "
            "windowed kernels do not implement attention dropout; set it to 0.0"
        )


# -- the functions transformers calls ---------------------------------------------------------
def windowed_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Any = None,
    attention_mask: Tensor | None = None,
    use_vmap: bool = False,
    **kwargs: Any,
) -> Tensor | None:
    """Mask interface: returns the ``[B, kv_length]`` bool padding mask, or ``None``.

    No S x S mask is built. ``use_vmap`` is set by transformers only when a model adds custom
    or/and mask functions (multimodal / prefix masks), which this backend cannot honour.
    """
    if use_vmap:
        raise ValueError(
            "windowed attention cannot honour this model's custom mask functions (or/and masks, "
            "e.g. multimodal or prefix attention); use attention=full"
        )
    if attention_mask is None:
        return None
    padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
    padding = padding[:, kv_offset : kv_offset + kv_length].to(torch.bool)
    if is_tracing(padding):  # values unknown (fake tensors, compile): keep it, as transformers does
        return padding
    return None if bool(padding.all()) else padding


def windowed_attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    sliding_window: int | None = None,
    position_ids: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Attention interface: ``[B, H, S, D]`` inputs -> ``([B, S, H, D]`` output, ``None``)."""
    if dropout:
        raise ValueError(
            f"windowed attention does not implement attention dropout (got {dropout}); set the "
            "model config's attention_dropout to 0.0"
        )
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            f"windowed attention expects the [batch, kv_len] padding mask made by its own mask "
            f"function, got a {attention_mask.dim()}D mask; pass a 2D attention_mask to the model"
        )
    config = module.config
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    spec = spec_from_config(config, sliding_window, causal)
    batch, q_len, kv_len = query.shape[0], query.shape[2], key.shape[2]
    if q_len != kv_len:  # cached decoding: a few query rows, dense reference is cheap
        out = _dense_from_tables(query, key, value, spec, attention_mask, scaling, q_offset=kv_len - q_len)
        return out.transpose(1, 2).contiguous(), None
    doc_ids = None
    if attention_mask is None and position_ids is not None:
        # Same packed-row detection as transformers' create_causal_mask (positions that restart).
        doc_ids = find_packed_sequence_indices(position_ids.expand(batch, -1))
    out = windowed_attention(
        query,
        key,
        value,
        spec,
        impl=getattr(config, IMPL_ATTR, "auto"),
        key_padding_mask=attention_mask,
        doc_ids=doc_ids,
        scale=scaling,
    )
    return out.transpose(1, 2).contiguous(), None


# -- helpers ----------------------------------------------------------------------------------
def _base_model(model: Any) -> Any:
    get_base = getattr(model, "get_base_model", None)  # peft wrappers
    return get_base() if callable(get_base) else model


def _resolve(model_or_config: Any) -> tuple[type, PretrainedConfig | None]:
    obj = _base_model(model_or_config)
    if isinstance(obj, PretrainedConfig):
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        try:
            return MODEL_FOR_CAUSAL_LM_MAPPING[type(obj)], obj
        except KeyError:
            raise ValueError(
                f"windowed attention cannot be used with {type(obj).__name__}: no causal-LM model "
                "class is registered for this config"
            ) from None
    if isinstance(obj, type) and issubclass(obj, PreTrainedModel):
        return obj, None
    if isinstance(obj, PreTrainedModel):
        return type(obj), obj.config
    raise ValueError(f"windowed attention cannot be used with {type(obj).__name__}: not a transformers model")
