"""Closed-form peak-memory estimate of a LoRA step, for instant feedback (source: predicted).

In the style of Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models"): activations are counted per token per layer from what autograd saves,
but for the step this project really runs (frozen base in ``dtype``, peft LoRA adapters in
float32, no autocast), not for full fine-tuning. The rules that follow from it (checked
against :mod:`lora_gui.memory.predict.trace`, exact on the Llama family):

- a frozen ``Linear`` saves no input (its weight gradient is never needed); only the LoRA
  branch saves its input, cast to float32 (one copy per adapted module when ``dtype`` is not
  float32; shared when it is; with ``lean_backward`` the ``dtype`` input itself, shared, the
  copy recomputed), plus the rank-r output of ``lora_A`` (4*r bytes per token); with
  ``lean_backward`` an input that is an RMSNorm's output is recomputed from the norm's input
  instead of kept (two hidden-size tensors a token in a layer): the estimate still counts it,
  an upper bound of the trace;
- RMSNorm saves its float32 input copy (with ``lean_backward``: the ``dtype`` input, the copy
  recomputed) and a float32 rsqrt per token;
- SwiGLU saves gate, act(gate) and up (3 * I * d bytes per token); with ``lean_backward``
  gate and up (act(gate) recomputed), and the product ``down_proj``'s LoRA reads is recomputed
  too instead of kept (plain LoRA, not int8; :mod:`lora_gui.models.lean_mlp`);
- SDPA (flash / memory-efficient on CUDA, flash on CPU) saves q, k, v, out and a float32
  logsumexp: no S x S term. Eager saves the float32 softmax and its ``dtype`` copy
  (nh * S * (4 + d) bytes per token) and GQA-repeated k/v;
- gradient checkpointing keeps only each layer's input (h * d bytes per token), and one
  layer's activations plus its backward transients while that layer is recomputed;
- logits and loss: 12 bytes per token per vocab entry at the start of backward (float32
  log-softmax output, its gradient and the upcast logits gradient), for any ``dtype``.

Supported in closed form: decoder configs with ``hidden_size``, ``intermediate_size``,
``num_attention_heads`` (Llama, Mistral, Qwen2, Gemma, Phi-3 style, gated MLP). Other
causal LMs (GPT-2, GPT-NeoX, ...) fall back to the Korthikanti full-training count
(34*h + 5*nh*S bytes per token per layer in 16-bit), which is coarser: use the trace there.
"""

from __future__ import annotations

import functools
from typing import Any

from lora_gui.memory.predict.long_estimate import long_context_terms
from lora_gui.memory.predict.model_configs import ModelConfig, is_unet_config, load_model_config
from lora_gui.memory.predict.trace import CATEGORIES, CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES, TraceResult

LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "olmo2", "granite", "cohere"}
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
F32 = 4  # bytes: LoRA weights, optimizer state, softmax, loss


def _bytes(dtype: Any) -> int:
    name = str(dtype).replace("torch.", "")
    table = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
    if name not in table:
        raise ValueError(f"dtype must be one of {sorted(table)}, got {dtype!r}")
    return table[name]


def _shapes(cfg: ModelConfig) -> dict[str, int]:
    h = cfg.hidden_size
    nh = cfg.num_attention_heads
    hd = getattr(cfg, "head_dim", None) or h // nh
    kv = getattr(cfg, "num_key_value_heads", None) or nh
    return {"h": h, "I": cfg.intermediate_size, "nh": nh, "q": nh * hd, "kv": kv * hd, "hd": hd,
            "L": cfg.num_hidden_layers, "V": cfg.vocab_size}


def _targets(target_modules: Any) -> tuple[str, ...]:
    if target_modules in ("all-linear", None):
        return LINEAR_NAMES
    names = (target_modules,) if isinstance(target_modules, str) else tuple(target_modules)
    unknown = [n for n in names if n not in LINEAR_NAMES]
    if unknown:
        raise ValueError(f"target_modules {unknown} unknown for this architecture; use {LINEAR_NAMES}")
    return names


def _linear_dims(s: dict[str, int]) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection of one decoder layer."""
    h, i, q, kv = s["h"], s["I"], s["q"], s["kv"]
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def _param_bytes(cfg: ModelConfig, s: dict[str, int], d: int, targets: tuple[str, ...],
                 r: int) -> dict[str, int]:
    dims = _linear_dims(s)
    per_layer = sum(a * b for a, b in dims.values()) + 2 * s["h"]  # projections + two norms
    if getattr(cfg, "attention_bias", False) or cfg.model_type == "qwen2":  # q/k/v biases
        per_layer += s["q"] + 2 * s["kv"]
    embed = s["V"] * s["h"] * (1 if getattr(cfg, "tie_word_embeddings", False) else 2)
    frozen = (s["L"] * per_layer + embed + s["h"]) * d + s["hd"] // 2 * F32 * 2  # + inv_freq bufs
    lora = s["L"] * sum(r * (dims[n][0] + dims[n][1]) for n in targets) * F32
    n_tensors = s["L"] * len(targets) * 2  # lora_A and lora_B per adapted module
    # AdamW: exp_avg + exp_avg_sq (float32, like the params) + a float32 `step` per tensor
    return {"frozen_weights": frozen, "lora_params": lora, "optimizer_state": 2 * lora + 4 * n_tensors}


def _variant(adapter: Any, s: dict[str, int], d: int, targets: tuple[str, ...], r: int,
             optimizer: str, params: dict[str, int]) -> dict[str, Any] | None:
    """An adapter variant's terms (None: plain LoRA); its parameters and optimizer state
    replace LoRA's in ``params``."""
    if adapter is None or (adapter.kind == "lora" and not adapter.fa):
        return None
    from lora_gui.memory.predict.adapter_estimate import variant_terms
    from lora_gui.memory.predict.quant import optimizer_state_bytes

    terms = variant_terms(adapter, _linear_dims(s), s["L"], d, targets, r)
    params["lora_params"] = F32 * sum(terms["numels"])
    params["optimizer_state"] = optimizer_state_bytes(terms["numels"], optimizer)
    return terms


def _layer_bytes_per_token(s: dict[str, int], d: int, targets: tuple[str, ...], r: int, attn: str,
                           seq: int, variant: dict[str, Any] | None = None, lean: bool = False,
                           lean_norms: bool = False, lean_mlp: tuple[bool, bool] = (False, False)) -> int:
    """Bytes autograd saves per token in one decoder layer (Llama family, LoRA, no recompute);
    ``lean``: plain LoRA keeps its ``d``-byte input once per distinct input instead of a float32
    copy per adapted module; ``lean_norms``: the RMSNorms keep their ``d``-byte input instead of
    its float32 copy (:mod:`lora_gui.models.lean_backward`); ``lean_mlp``: (act(gate)
    recomputed, the product ``down_proj``'s LoRA reads recomputed) (:mod:`lora_gui.models.lean_mlp`)."""
    h, i, q, kv, nh = s["h"], s["I"], s["q"], s["kv"], s["nh"]
    dims = _linear_dims(s)
    total = 2 * ((d if lean_norms else F32) * h + F32)  # two RMSNorms: float32 input copy + rsqrt
    total += (2 if lean_mlp[0] else 3) * d * i  # SwiGLU: gate (for act), act(gate) and up
    total += d * q + d * kv  # rotated q and k
    if attn == "sdpa":
        total += d * kv + d * q + F32 * nh  # v, output, float32 logsumexp
    else:
        rep = kv if kv == q else q  # repeat_kv copies k and v to all heads (GQA)
        total += (rep - kv) + d * rep + nh * seq * (F32 + (d if d != F32 else 0))  # softmax + copy
        total += d * kv if rep == kv else 0
    variant = variant or {"per_token": 0, "drop_a_outputs": False, "drop_input_copies": False}
    total += variant["per_token"]
    total += 0 if variant["drop_a_outputs"] else F32 * r * len(targets)  # lora_A outputs, saved by lora_B
    if variant["drop_input_copies"]:  # LoRA-FA: A is frozen, its input is not saved
        pass
    elif d != F32 and not lean:  # each adapted module saves its own float32 copy of its input
        total += sum(F32 * dims[n][0] for n in targets)
    else:  # float32 inputs (or lean 16-bit ones) are kept as they are: once per distinct input
        groups = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gu": ("gate_proj", "up_proj"),
                  "down": ("down_proj",)}
        total += sum(d * dims[g[0]][0] for g in groups.values() if any(n in targets for n in g))
        if lean_mlp[1] and "down_proj" in targets:
            total -= d * dims["down_proj"][0]  # the product is recomputed for down_proj's LoRA
        if attn == "sdpa" and "o_proj" in targets:
            total -= d * q  # the o_proj input is the SDPA output itself
    return total


def _mlp_bytes_per_token(s: dict[str, int], d: int, targets: tuple[str, ...], r: int,
                         lean: bool = False, lean_mlp: tuple[bool, bool] = (False, False)) -> int:
    """The part of :func:`_layer_bytes_per_token` that the gated MLP saves (and its LoRA)."""
    h, i = s["h"], s["I"]
    gate, up, down = ("gate_proj" in targets), ("up_proj" in targets), ("down_proj" in targets)
    total = (2 if lean_mlp[0] else 3) * d * i + F32 * r * (gate + up + down)  # SwiGLU + lora_A outputs
    if d != F32 and not lean:  # each adapted module keeps its own float32 input copy
        total += F32 * (h * (gate + up) + i * down)
    else:  # float32 (or lean 16-bit) inputs kept once per distinct input
        total += d * (h * (gate or up) + i * down * (not lean_mlp[1]))
    return total


def _attention_peak_terms(s: dict[str, int], d: int, targets: tuple[str, ...], r: int,
                          quantization: str) -> tuple[int, float]:
    """At a peak in a layer's attention backward: the largest attention weight a quantized base
    dequantizes (bytes), and the share of all LoRA weights that the layer's MLP adapters hold
    (their gradients exist by then: the MLP's backward ran first)."""
    from lora_gui.memory.predict.quant import dequant_temporary_bytes

    dims = _linear_dims(s)
    attention = [dims[n] for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
    per_layer = {n: r * (dims[n][0] + dims[n][1]) for n in targets}
    mlp = sum(v for n, v in per_layer.items() if n in ("gate_proj", "up_proj", "down_proj"))
    return dequant_temporary_bytes(attention, quantization, d), mlp / max(1, sum(per_layer.values())) / s["L"]


def _generic_layer_bytes(s: dict[str, int], d: int, attn: str, seq: int) -> int:
    """Korthikanti 2022 per token per layer (16-bit: 34*h; + 5*nh*S for eager attention)."""
    per = 34 * s["h"] * d // 2
    return per + (5 * s["nh"] * seq * d // 2 if attn == "eager" else 0)


def _quant_terms(s: dict[str, int], d: int, targets: tuple[str, ...], r: int, attn: str,
                 quantization: str, double_quant: bool, optimizer: str) -> dict[str, int]:
    from lora_gui.memory.predict.quant import check_quantization, estimate_terms

    check_quantization(quantization, optimizer)
    dims = _linear_dims(s)
    numels = [r * dims[n][i] for n in targets for i in (0, 1)] * s["L"]  # lora_A, lora_B
    return estimate_terms(dims, s["L"], d, quantization, double_quant, optimizer, numels, attn, targets)


WINDOWED_BLOCK = 128  # query block of the blocked windowed kernel: each block sees block + W - 1 keys


def estimate_text_step(config: Any, *, batch_size: int, seq_len: int, lora_rank: int = 16,
                       target_modules: Any = "all-linear", attn_implementation: str = "sdpa",
                       gradient_checkpointing: bool = False, dtype: Any = "bfloat16",
                       device: str = "cuda", attention_window: int | None = None,
                       loss_chunk: int = 0, quantization: str = "none", double_quant: bool = True,
                       optimizer: str = "adamw", offload_checkpoints: bool = False, mlp_chunk: int = 0,
                       embeddings_on_host: bool = False, adapter: Any = None,
                       preference: Any = None, attention_head_groups: int = 0,
                       lean_backward: bool = True, cpu_autocast: str | None = None,
                       checkpoint_layers: int = 0) -> TraceResult:
    """Closed-form estimate of the peak of one LoRA training step of a causal LM.

    Args: as :func:`lora_gui.memory.predict.trace.trace_text_step` (no dropout, no fake run; a CPU
        run's ``cpu_autocast`` is not modelled: the run's prediction traces it), plus
        attention_window: keys per query of a windowed attention (sliding window / blocked
            kernel): the S x S terms of eager attention shrink to S x window. No effect on SDPA,
            which keeps no S x S term.
        loss_chunk: chunked loss (lora_gui.models.chunked_loss): the logits terms cover at most
            ``loss_chunk`` positions, plus the hidden-state gradient the fused loss keeps.
        quantization, double_quant, optimizer: as the trace (:mod:`lora_gui.memory.predict.quant`):
            quantized storage of the decoder's Linear weights, the dequantized weight of one
            layer in the backward, int8's kept layer inputs, and 8-bit optimizer states.
        offload_checkpoints, mlp_chunk, embeddings_on_host: the long-context switches
            (:mod:`lora_gui.models.long_context`): checkpointed layer inputs in host memory (one
            layer input reloaded at a time), the MLP's saved tensors for ``mlp_chunk`` tokens
            instead of all, the embedding table in host memory. ``info["host_bytes"]``: what
            they keep in host memory (peak).
        attention_head_groups: attention as this many calls per layer
            (:mod:`lora_gui.attention.head_groups`): on CUDA the kernel's backward workspace is one
            group's, plus the query gradient the groups' gradients are joined into.
        adapter: the run's adapter variant (:class:`lora_gui.models.adapters.AdapterSpec`;
            None: plain LoRA): its terms come from :mod:`lora_gui.memory.predict.adapter_estimate`.
        preference: a preference run's loss: ``batch_size`` pairs are estimated as twice the
            rows with full logits (the log-probabilities need every position's); the trace runs
            the real step.
        lean_backward: plain LoRA keeps its 16-bit input once per distinct input, not a float32
            copy per adapter (:mod:`lora_gui.models.lean_backward`). Counted only where the
            layers run outside another saved-tensor hook: not with gradient checkpointing or the
            chunked MLP, where the layers step aside (there the float32 copies are counted).
        checkpoint_layers: with checkpointing, only the first N layers recompute; the others
            keep their saved tensors as without checkpointing (:mod:`lora_gui.models.checkpointing`).
            The peak is then either at the start of the backward (those kept, N layer inputs) or
            in the last recompute, once the kept layers are freed. 0: every layer.

    Returns:
        A :class:`TraceResult` with the same breakdown keys as the trace; ``info["source"]`` is
        ``"predicted (closed form)"`` and ``info["exact_family"]`` says whether the Llama-family
        formula (checked against the trace) or the generic fallback was used. Allocator rounding
        is not estimated (0).
    """
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size and seq_len must be >= 1, got {batch_size}, {seq_len}")
    if preference is not None:
        batch_size, loss_chunk = 2 * batch_size, 0
    if attn_implementation not in ("eager", "sdpa", "windowed"):
        raise ValueError(f"attn_implementation must be 'eager', 'sdpa' or 'windowed', "
                         f"got {attn_implementation!r}")
    cfg = load_model_config(config)
    if attn_implementation == "windowed":  # blocked kernel: eager-like scores over W + G (+ a block)
        window = getattr(cfg, "windowed_window", 256) + getattr(cfg, "windowed_global_tokens", 4)
        attention_window = attention_window or window + WINDOWED_BLOCK
        attn_implementation = "eager"
    if is_unet_config(cfg):
        raise ValueError("this is a UNet config: use estimate_unet_step")
    d = _bytes(dtype)
    s = _shapes(cfg)
    family = cfg.model_type in LLAMA_LIKE
    targets = _targets(target_modules) if family else LINEAR_NAMES
    params = _param_bytes(cfg, s, d, targets, lora_rank)
    q = _quant_terms(s, d, targets, lora_rank, attn_implementation, quantization, double_quant, optimizer)
    params["frozen_weights"] += q["frozen_delta"]
    params["optimizer_state"] = q["optimizer_state"]
    tokens = batch_size * seq_len
    keys = min(seq_len, attention_window) if attention_window else seq_len  # key positions per query
    variant = _variant(adapter, s, d, targets, lora_rank, optimizer, params) if family else None
    lean = lean_backward and variant is None and not gradient_checkpointing and not mlp_chunk
    lean_norm = lean_backward and d != F32  # outside checkpointed layers (the final norm): always
    # the gated MLP: act(gate) recomputed in any adapter's run; the product for a plain LoRA
    # down_proj (int8's base layer keeps its input itself: bitsandbytes holds it)
    lean_mlp = (lean_backward and not gradient_checkpointing and not mlp_chunk,
                lean and quantization != "int8")
    if family:
        layer = _layer_bytes_per_token(s, d, targets, lora_rank, attn_implementation, keys, variant, lean,
                                       lean_norm and not gradient_checkpointing, lean_mlp)
        layer += q["saved_per_token"]
    else:
        layer = _generic_layer_bytes(s, d, attn_implementation, keys)
    head_in = (d if lean_norm else F32) * s["h"] + F32 + 2 * d * s["hd"]  # final norm + rotary cos/sin
    temporaries = 12 * tokens * s["V"]  # bytes: see module docstring
    if loss_chunk:  # one chunk's logits, plus the hidden-state gradient kept and then scaled
        # fused loss: a chunk's logits (d bytes) and, for 16-bit logits, their float32 copy that
        # becomes the gradient in place (+ 256 bytes a chunk row: targets, masks and gathered
        # logits, rounded up)
        logit_bytes = d if d == F32 else d + F32
        temporaries = (logit_bytes * s["V"] + 256) * min(tokens, loss_chunk) + 2 * tokens * s["h"] * d
    # Backward of one layer frees its saved tensors while it allocates gradients; the net rise
    # above "everything saved" measured with the trace on Llama-family configs is 0.1-0.33 x the
    # layer's saved bytes (0.25 used); with recompute, the recomputed layer plus 0.06-0.3 x (0.28:
    # the Llama-3.1-8B trace, nf4 and bf16, measures 0.276 at 4k-16k tokens, where long runs live).
    # Eager adds the gradients of the S x S scores (measured 1.3-5.2 bytes per head per key
    # position per token; 4 used for float32, 2.5 for 16-bit weights).
    eager_grad = (4.0 if d == F32 else 2.5) * s["nh"] * keys if attn_implementation == "eager" else 0
    mlp = _mlp_bytes_per_token(s, d, targets, lora_rank, lean, lean_mlp) if family else 0
    long = long_context_terms(s, d, layer, mlp, tokens, offload_checkpoints and gradient_checkpointing,
                              mlp_chunk if family else 0, embeddings_on_host)
    layer, params["frozen_weights"] = long["layer"], params["frozen_weights"] - long["frozen_on_host"]
    transient = layer // 4 + int(eager_grad)
    kept = 0  # layers left unchecked by checkpoint_layers (the last ones), and their saved bytes
    if gradient_checkpointing and 0 < checkpoint_layers < s["L"]:
        kept = s["L"] - checkpoint_layers
        kept_layer = _unchecked_layer_bytes(s, d, targets, lora_rank, attn_implementation, keys, variant,
                                            lean_backward, lean_norm, quantization, mlp_chunk, tokens,
                                            family) + q["saved_per_token"]
    if gradient_checkpointing:
        checkpointed = s["L"] - kept
        inputs = long["device_inputs"] if offload_checkpoints else checkpointed  # layer inputs on the device
        base = inputs * d * s["h"] + checkpointed * q["kept_under_checkpointing"] + head_in
        inside = long.get("inside", layer + layer * 7 // 25) + int(eager_grad) + long["reloaded"]
        if kept:  # the kept layers' tensors at the backward's start; freed before any recompute
            base += kept * kept_layer
            inside = max(inside - kept * kept_layer, kept_layer // 4 + int(eager_grad))
    else:
        base = s["L"] * layer + head_in
        inside = transient  # backward of the last layer while all others are still saved
    grads = int(params["lora_params"] * long["grads_at_peak"])  # LoRA gradients at a backward peak
    if kept and not offload_checkpoints:  # the kept layers' gradients exist at the last recompute
        grads = params["lora_params"] * kept // s["L"]
    kernel, workspace = _cuda_attention(s, d, attn_implementation, batch_size, seq_len, device,
                                        attention_head_groups)
    dequantized = q["transient"]
    if long.get("attention_peak"):  # the tiled layer peaks in its attention's backward
        dequantized, mlp_grads = _attention_peak_terms(s, d, targets, lora_rank, quantization)
        grads += int(params["lora_params"] * mlp_grads) if offload_checkpoints else 0
    in_backward = inside * tokens + long["inside_fixed"] + dequantized + grads + workspace
    if in_backward > temporaries:  # the peak is in a backward
        activations = (base + inside) * tokens + long["inside_fixed"] + dequantized + workspace
        temporaries = 0
        params["gradients"] = grads
    else:  # the peak is at the start of backward: logits and loss gradients live
        activations = base * tokens
    activations += variant["fixed"] if variant else 0
    breakdown = dict.fromkeys(CATEGORIES, 0)
    breakdown.update(params, activations=activations, temporaries=temporaries)
    _foreach_step(breakdown, device, optimizer)
    traced = sum(breakdown.values())
    host_bytes = long["host_bytes"]
    overheads = {"cuda_context": 0, "cublas_workspace": 0, "allocator_rounding": 0}
    if device == "cuda":
        overheads.update(cuda_context=CUDA_CONTEXT_BYTES, cublas_workspace=CUBLAS_WORKSPACE_BYTES,
                         allocator_cache=cache_allowance(traced + CUBLAS_WORKSPACE_BYTES))
    info = {"source": "predicted (closed form)", "exact_family": family, "model_type": cfg.model_type,
            "batch_size": batch_size, "seq_len": seq_len, "attn_implementation": attn_implementation,
            "host_bytes": host_bytes, "kernel": kernel, "attention_workspace_bytes": workspace,
            "quantization": quantization}
    return TraceResult(traced + sum(overheads.values()), traced, breakdown, overheads, device, 0.0, info)


def _unchecked_layer_bytes(s: dict[str, int], d: int, targets: tuple[str, ...], r: int, attn: str,
                           keys: int, variant: dict[str, Any] | None, lean_backward: bool,
                           lean_norm: bool, quantization: str, mlp_chunk: int, tokens: int,
                           family: bool) -> int:
    """Bytes a token of a layer saves when checkpointing leaves it out (``checkpoint_layers``):
    what it saves without checkpointing, the lean forms included; a tiled MLP still keeps only
    its input (each chunk is checkpointed on its own)."""
    if not family:
        return _generic_layer_bytes(s, d, attn, keys)
    lean = lean_backward and variant is None and not mlp_chunk
    lean_mlp = (lean_backward and not mlp_chunk, lean and quantization != "int8")
    layer = _layer_bytes_per_token(s, d, targets, r, attn, keys, variant, lean, lean_norm, lean_mlp)
    if 0 < mlp_chunk < tokens:
        layer += d * s["h"] - _mlp_bytes_per_token(s, d, targets, r, lean, lean_mlp)
    return layer


def cache_allowance(allocated: int) -> int:
    """Reserved beyond allocated that a closed form adds on CUDA (:func:`allocator.cache_allowance`)."""
    from lora_gui.memory.predict.allocator import cache_allowance as allowance

    return allowance(allocated)


def _cuda_attention(s: dict[str, int], d: int, attn: str, batch: int, seq: int,
                    device: str, groups: int = 0) -> tuple[str, int]:
    """The attention kernel on ``device`` and its backward's workspace (bytes, one layer at a time,
    :mod:`lora_gui.memory.predict.cuda_kernels`), for a batch without a mask (transformers passes K / V
    with their own heads: enable_gqa). 0 on a CPU, whose trace sees the kernel's memory itself.
    In ``groups`` > 1 head groups the workspace is one group's (H / groups query heads)."""
    from lora_gui.memory.predict.cuda_kernels import (
        FLASH_FWD_SAVED_PER_LAYER,
        attention_backward_bytes,
        sdpa_kernel,
    )

    if device != "cuda" or attn != "sdpa":
        return attn if device == "cuda" else "", 0
    dtype = {2: "bfloat16", 4: "float32"}[d]
    kernel = sdpa_kernel(mask=False, dtype=dtype, head_dim=s["hd"])
    n = groups if groups > 1 else 1
    workspace = attention_backward_bytes(kernel, batch=batch, seq=seq, heads=s["nh"] // n,
                                         kv_heads=s["kv"] // s["hd"] // n, head_dim=s["hd"], dtype=dtype)
    saved = s["L"] * FLASH_FWD_SAVED_PER_LAYER if kernel == "sdpa_flash" else 0  # rng state per layer
    return kernel, workspace + saved


def _foreach_step(breakdown: dict[str, int], device: str, optimizer: str) -> None:
    """On CUDA, AdamW's foreach step holds the gradients and a float32 sqrt(exp_avg_sq) copy of
    every LoRA tensor beside the state; when that is above the activations' peak, it is the peak."""
    if device != "cuda" or optimizer != "adamw":
        return
    lora = breakdown["lora_params"]
    step = {"gradients": lora, "optimizer_state": breakdown["optimizer_state"] + lora,
            "activations": 0, "temporaries": 0}
    if sum(step.values()) > sum(breakdown[k] for k in step):
        breakdown.update(step)


def _unet_key(config: Any) -> str:
    import json

    return json.dumps(dict(load_model_config(config)), sort_keys=True, default=str)


@functools.lru_cache(maxsize=16)
def _unet_calibration(cfg_json: str, lora_rank: int, gradient_checkpointing: bool, dtype: str,
                      text_seq_len: int, device: str = "cpu", adapter: Any = None,
                      lean_backward: bool = True) -> tuple[dict[str, int], float, float]:
    """Two fake traces (batch 1 at 256 and 512 px) -> fixed bytes, and per-image bytes a + b*pixels
    (traced for ``device``: on CUDA the attention kernels' backward workspaces are in them)."""
    import json

    from lora_gui.memory.predict.calibrated import fit_pixel_line
    from lora_gui.memory.predict.trace import trace_unet_step

    cfg = json.loads(cfg_json)
    kw = {"batch_size": 1, "lora_rank": lora_rank, "gradient_checkpointing": gradient_checkpointing,
          "dtype": dtype, "device": device, "text_seq_len": text_seq_len, "adapter": adapter,
          "lean_backward": lean_backward}
    return fit_pixel_line(lambda px: trace_unet_step(cfg, resolution=px, **kw), 256, 512)


def estimate_unet_step(config: Any, *, batch_size: int, resolution: int | tuple[int, int],
                       lora_rank: int = 16, gradient_checkpointing: bool = False,
                       dtype: Any = "bfloat16", device: str = "cuda", text_seq_len: int = 77,
                       adapter: Any = None, lean_backward: bool = True) -> TraceResult:
    """Trace-calibrated estimate for a UNet2DConditionModel step (linear in pixels and batch);
    ``adapter``: the run's :class:`lora_gui.models.adapters.AdapterSpec` (None: LoRA).

    A UNet's activations (convolutions, GroupNorm, SDPA attention: no S x S term) grow linearly
    with the pixel count and the batch, so two fake traces at batch 1 (256 and 512 px, cached
    per config) give the per-image line ``a + b * pixels``; the estimate is fixed weights +
    batch * (a + b * h * w). Default LoRA targets (to_q, to_k, to_v, to_out.0); ``lean_backward``
    as in :func:`lora_gui.memory.predict.trace.trace_unet_step`.

    Returns:
        A :class:`TraceResult` (``info["source"] = "predicted (trace-calibrated)"``).
    """
    from lora_gui.memory.predict.calibrated import calibrated_step

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    traced_on = "cuda" if device == "cuda" else "cpu"
    fit = _unet_calibration(_unet_key(config), lora_rank, gradient_checkpointing,
                            str(dtype).replace("torch.", ""), text_seq_len, traced_on, adapter,
                            lean_backward)
    return calibrated_step(fit, batch_size=batch_size, resolution=resolution, device=device)
