"""Closed-form terms of the long-context switches for the closed-form estimate
(:func:`lora_gui.memory.predict.estimate.estimate_text_step`).

What each switch changes (bytes; ``h`` hidden size, ``d`` weight dtype bytes, ``T`` tokens of
the micro-batch, ``L`` layers), as :mod:`lora_gui.models.long_context` runs it and the trace
counts it:

- ``offload_checkpoints``: the ``L`` checkpointed layer inputs (``d*h*T`` each) move to host
  memory, the first layer's too (the embedding output does not require grad:
  :mod:`lora_gui.models.checkpointing`). While a layer is recomputed the device holds its
  reloaded input (``d*h*T``). Without inputs to free as the backward walks down, the device
  peak moves to the last layers' backward, when nearly every LoRA gradient exists.
- ``mlp_chunk``: the MLP's saved tensors (:func:`estimate._mlp_bytes_per_token`) exist for one
  chunk of tokens, not ``T``; the MLP input is kept (``d*h*T``, the chunks are views of it).
  A layer's backward then peaks either in the attention's backward (its saved tensors plus
  ``ATTN_BACKWARD_HIDDEN`` float32 hidden vectors per token: gradients of the attention input
  and of the LoRA inputs; measured on the Llama-3.1-8B trace, nf4 and bf16, exact there), or in
  one MLP chunk's backward (the attention's saved tensors, the MLP input and output, and the
  whole-layer recompute rise of :mod:`estimate` over the chunk's tokens).
- ``embeddings_on_host``: the table (``V*h*d``) leaves the device; host memory also holds the
  looked-up rows (``d*h*T``) until they are copied to the device.
"""

from __future__ import annotations

RECOMPUTE_RISE = 1.2  # a recomputed layer's saved bytes plus its backward transients (estimate.py)
ATTN_BACKWARD_HIDDEN = 4.5  # float32 hidden vectors per token alive in the attention's backward


def long_context_terms(s: dict[str, int], d: int, layer: int, mlp: int, tokens: int, offload: bool,
                       mlp_chunk: int, embeddings_on_host: bool) -> dict[str, float]:
    """Per-switch terms: ``layer`` (saved bytes per token of one layer), ``device_inputs``
    (checkpointed inputs left on the device with offload), ``reloaded`` (bytes per token of the
    reloaded input), ``inside_fixed`` (bytes of one MLP chunk's recompute and backward),
    ``grads_at_peak`` (share of the LoRA gradients alive at a backward peak), ``frozen_on_host``
    and ``host_bytes``; with a tiled MLP also ``inside`` (bytes per token of a recomputed
    layer's backward peak, replacing the untiled rule)."""
    h, n_layers = s["h"], s["L"]
    tiled = 0 < mlp_chunk < tokens and mlp > 0
    table = s["V"] * h * d if embeddings_on_host else 0
    rows = d * h * tokens if embeddings_on_host else 0
    offloaded = n_layers * d * h * tokens if offload else 0
    out = {
        "layer": layer - mlp + d * h if tiled else layer,
        "inside_fixed": 0,
        "device_inputs": 0 if offload else 1,
        "reloaded": d * h if offload else 0,
        "grads_at_peak": (n_layers - 1) / n_layers if offload else 0.0,
        "frozen_on_host": table,
        "host_bytes": table + max(rows, offloaded),
    }
    if tiled:
        attention = layer - mlp  # saved by the attention half of the layer, per token
        in_attention = attention + int(ATTN_BACKWARD_HIDDEN * 4 * h)
        in_chunk = attention + 2 * d * h  # + the MLP input (kept) and its output
        chunk_bytes = int((RECOMPUTE_RISE * layer - attention) * mlp_chunk)  # one chunk's MLP backward
        if in_attention * tokens >= in_chunk * tokens + chunk_bytes:
            # the reloaded layer input is freed after the recompute, before this peak (trace)
            out["inside"], out["attention_peak"], out["reloaded"] = in_attention, True, 0
        else:
            out["inside"], out["inside_fixed"] = in_chunk, chunk_bytes
    return out
