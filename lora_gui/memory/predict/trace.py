"""Exact peak memory of one LoRA training step, traced on a CPU with fake tensors.

The real architecture is built from its config on the meta device, LoRA is attached with peft,
and every parameter and buffer is then given a fake CPU tensor (shape, dtype and storage size,
no data) under ``FakeTensorMode``. One real training step (forward, loss, backward, AdamW step,
``zero_grad``) runs through autograd exactly as it would on a GPU, and a
:class:`~lora_gui.memory.runtime.tracker.StorageTracker` counts every live storage. The same code with
``fake=False`` runs the step on real CPU tensors (random weights): that is how the trace is
checked (tests/memory, bench/memory/trace_accuracy.py).

The step that is traced (``_text_step`` / ``_unet_step``)::

    loss = model(input_ids=ids, labels=ids, use_cache=False).loss   # outputs object dropped
    loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

Steady state: from the second step on, AdamW's ``exp_avg``/``exp_avg_sq``/``step`` exist before
the forward. The trace materializes that state first (``_materialize_adamw_state``), so the
peak is the one every step after the first reaches.

Breakdown at the peak (sums exactly to ``traced_peak_bytes``): every counted storage gets a
category, and the bytes of the storages alive at the moment of the peak are summed per category:

- ``frozen_weights``: frozen parameters and all buffers (counted before the step).
- ``lora_params``: trainable parameters (peft keeps them float32).
- ``optimizer_state``: AdamW state, plus transients allocated inside ``optimizer.step()``.
- ``gradients``: storages that are a trainable parameter's ``.grad`` at the end of backward.
- ``temporaries``: logits and loss: everything allocated from the output head's input (the
  ``get_output_embeddings()`` pre-hook) to the loss in the forward, and in the backward until the
  gradient reaches the head's input. For a UNet: the loss computed from the predicted noise.
- ``activations``: everything else: batch inputs, tensors saved for backward, activation
  gradients and other transients of the layers.

CUDA mapping (``device="cuda"``, the default for planning): the trace runs CPU kernels, so the
choices a CUDA run makes are mimicked where they change memory. SDPA on CPU dispatches to
``_scaled_dot_product_flash_attention_for_cpu``, which keeps the output and a float32
logsumexp (B, H, S), the same as the CUDA flash / memory-efficient kernels; no S x S matrix is
stored. Eager attention materializes the S x S scores, float32 softmax and probabilities per
layer, on both. Dropout is rewritten to ``torch.native_dropout`` (bool mask, as on CUDA; the
CPU path keeps a mask in the input dtype). The batch's mask is the real batch's (``mask``): no
padding and one document a row: no mask; padding or packed documents: transformers builds a
(B, 1, S, S) mask; with padding SDPA keeps an additive copy per layer (see
``batch_trace.kernel_watch``), while a packed row runs each document's own causal call and the
mask goes unused (``lora_gui.attention.documents``; traced as one call over the row).
On CUDA the attention kernel is the one PyTorch's rule picks and its backward's scratch (flash:
float32 ``dq`` accumulator, expanded dK / dV for GQA) is allocated inside each layer's backward
(:mod:`lora_gui.memory.predict.cuda_kernels`); AdamW runs its ``foreach`` path, the CUDA default. What the
caching allocator reserves beyond this is :mod:`lora_gui.memory.predict.allocator`'s replay of the
trace's allocations and frees; see ``CUDA_OVERHEADS_DOC``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from lora_gui.memory.predict.model_configs import is_unet_config, load_model_config
from lora_gui.memory.predict.trace_build import (  # noqa: F401  (attach_lora, materialize: for the other traces)
    as_dtype,
    attach_lora,
    build_text_model,
    build_unet,
    materialize,
)
from lora_gui.memory.predict.trace_result import (  # noqa: F401  (the names every trace imports from here)
    BATCH_MASKS,
    CATEGORIES,
    CUBLAS_WORKSPACE_BYTES,
    CUDA_ALLOC_ROUNDING,
    CUDA_CONTEXT_BYTES,
    CUDA_OVERHEADS_DOC,
    UNET_LORA_TARGETS,
    TraceResult,
    _PhaseTracker,
    _Record,
)
from lora_gui.memory.predict.trace_step import run_autocast, trace_step

log = logging.getLogger(__name__)


# -- public entry points --------------------------------------------------------------------
def _check_common(batch_size: int, device: str) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")


def trace_text_step(config: Any, *, batch_size: int, seq_len: int, lora_rank: int = 16,
                    lora_alpha: float | None = None, target_modules: Any = "all-linear",
                    attn_implementation: str = "sdpa", gradient_checkpointing: bool = False,
                    dtype: torch.dtype | str = torch.bfloat16, device: str = "cuda",
                    lora_dropout: float = 0.0, fake: bool = True, warm_steps: int = 0,
                    loss_chunk: int = 0, quantization: str = "none", double_quant: bool = True,
                    optimizer: str = "adamw", mask: str = "none", grads_before: bool = False,
                    offload_checkpoints: bool = False, mlp_chunk: int = 0,
                    embeddings_on_host: bool = False, added_tokens: int = 0,
                    adapter: Any = None, preference: Any = None,
                    attention_head_groups: int = 0, lean_backward: bool = True,
                    cpu_autocast: str | None = None, checkpoint_layers: int = 0) -> TraceResult:
    """Traces one LoRA training step of a causal LM and returns its peak memory.

    Args:
        config: a transformers ``PretrainedConfig``, a config dict, a bundled name
            (``"llama-3.1-8b"``), a config.json path or a model directory.
        batch_size: micro-batch size (sequences).
        seq_len: tokens per sequence (padded length of the micro-batch).
        lora_rank: LoRA rank r.
        lora_alpha: LoRA alpha (default: r); does not change memory.
        target_modules: peft ``target_modules`` (default ``"all-linear"``).
        attn_implementation: ``"eager"`` (S x S scores kept per layer) or ``"sdpa"``.
        gradient_checkpointing: recompute each layer in backward (non-reentrant).
        dtype: dtype of the frozen weights (LoRA weights stay float32, as peft keeps them).
        device: ``"cuda"`` adds CUDA overheads and CUDA-like dropout; ``"cpu"`` adds nothing.
        lora_dropout: LoRA dropout probability (a mask of the layer input per LoRA layer).
        fake: False runs the same step on real CPU tensors with random weights (a measurement,
            slow for big models: use tiny configs).
        warm_steps: real steps run before the measured one (instead of materializing the
            AdamW state); used to check the steady-state shortcut.
        loss_chunk: chunked loss over this many positions (0: the model's own full-logits loss).
            The fused chunked loss does not call the head module, so its logits count as
            ``activations`` in the breakdown (the peak itself is exact).
        quantization: ``"nf4"`` / ``"int8"``: the decoder's Linear layers quantized by
            bitsandbytes with ``dtype`` as compute dtype (:mod:`lora_gui.memory.predict.quant`).
        double_quant: nf4: quantize the block scales too.
        optimizer: ``"adamw"``, ``"adamw8bit"`` or ``"paged_adamw8bit"`` (bitsandbytes).
        mask: what the real batch tells attention, as the engine collates it: ``"none"`` (no
            padding: transformers skips the mask), ``"padding"`` (a 2D attention mask with padded
            tokens: a (B, 1, S, S) mask is built) or ``"packed"`` (one row of several documents,
            positions restarting per document: a block-diagonal (1, 1, S, S) mask).
        grads_before: LoRA gradients exist before the forward (a micro-batch after the first
            of an accumulated step).
        offload_checkpoints, mlp_chunk, embeddings_on_host: the long-context switches
            (:mod:`lora_gui.models.long_context`); what they keep in host memory is
            ``info["host_bytes"]`` (peak), outside ``peak_bytes``.
        added_tokens: tokens a chat template added to the vocabulary: the embeddings grow by as
            many rows and those rows train (peft trainable tokens), as in the engine.
        attention_head_groups: attention as this many calls per layer, each over a share of the
            key/value heads (:mod:`lora_gui.attention.head_groups`); on CUDA each call's backward
            scratch is that of its own heads. 0: one call.
        adapter: the run's adapter variant (:class:`lora_gui.models.adapters.AdapterSpec`:
            DoRA, LoHa, LoKr, OFT, rsLoRA, LoRA-FA); its real peft layers run in the step.
            None: plain LoRA. Rank, alpha and dropout come from the arguments above.
        preference: a preference run's loss (:class:`lora_gui.models.preference_loss.PreferenceLoss`):
            ``batch_size`` counts pairs, the step runs ``2 x batch_size`` rows through the run's
            own :func:`~lora_gui.models.preference_loss.pair_losses` (the reference pass with the
            adapter off, or precomputed reference log-probabilities in the batch). None: next-token loss.
        lean_backward: LoRA layers keep their 16-bit input, not a float32 copy per adapter, as an
            optimized run's do (:mod:`lora_gui.models.lean_backward`).
        cpu_autocast: a CPU run's mixed precision, 'bf16' or 'fp16' (its weights stay float32
            and autocast keeps a 16-bit copy of each, as the run does); None: float32.
        checkpoint_layers: with ``gradient_checkpointing``, only the first N decoder layers are
            checkpointed (:mod:`lora_gui.models.checkpointing`); 0: every layer.

    Returns:
        A :class:`TraceResult`; ``info["kernel"]`` names the attention kernel on ``device``.
    """
    _check_common(batch_size, device)
    if mask not in BATCH_MASKS:
        raise ValueError(f"mask must be one of {BATCH_MASKS}, got {mask!r}")
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    cfg = load_model_config(config)
    if is_unet_config(cfg):
        raise ValueError("this is a UNet config: use trace_unet_step")
    from lora_gui.memory.predict import quant

    quant.check_quantization(quantization, optimizer)
    new_ids = None
    if added_tokens > 0:
        import copy

        cfg = copy.deepcopy(cfg)
        text = cfg.get_text_config()
        new_ids = list(range(text.vocab_size, text.vocab_size + added_tokens))
        text.vocab_size += added_tokens
    model = build_text_model(cfg, attn_implementation=attn_implementation, dtype=as_dtype(dtype),
                             lora_rank=lora_rank, lora_alpha=lora_alpha, target_modules=target_modules,
                             lora_dropout=lora_dropout, loss_chunk=loss_chunk,
                             lora=quantization == "none", new_token_ids=new_ids, adapter=adapter,
                             lean_backward=lean_backward)
    setup = None
    if quantization != "none":  # quantize on meta, then LoRA on the quantized layers (as the engine)
        quant.quantize_model(model, quantization, double_quant, as_dtype(dtype))
        model = attach_lora(model, lora_rank, lora_alpha, target_modules, lora_dropout, new_ids, adapter,
                            lean_backward)
        setup = quant.materialize_quant_states
    vocab = cfg.vocab_size

    rows = batch_size * (2 if preference is not None else 1)  # a pair is two rows

    def make_inputs() -> dict:  # the tensors the engine's collate() gives the model
        shape = (rows, seq_len)
        batch = {"input_ids": torch.randint(0, vocab, shape), "labels": torch.randint(0, vocab, shape)}
        if preference is not None and preference.needs_reference and not preference.reference_pass:
            batch["ref_logps"] = torch.zeros(rows)  # precomputed, float32, as the engine's batch
        if mask == "padding":  # a padded last token (real values matter with fake=False)
            batch["attention_mask"] = torch.ones(shape, dtype=torch.long)
            batch["attention_mask"][-1, -1] = 0
        elif mask == "packed":  # two documents in the row
            batch["position_ids"] = torch.arange(seq_len).remainder(max(1, seq_len // 2)).expand(shape)
        return batch

    def loss_fn(m: nn.Module, batch: dict, tracker: _PhaseTracker) -> torch.Tensor:
        inputs = batch  # held by the step until its backward ends
        if preference is not None:  # the preference run's own step (models.preference_loss)
            from lora_gui.models.preference_loss import REF_KEY, pair_losses, reference_logps

            if preference.reference_pass:  # what pair_losses runs first, here apart so that the
                ref = reference_logps(m, batch, preference.chunk)  # policy's layers count as
                batch = {**batch, REF_KEY: ref}  # activations
                tracker.category, tracker.head_entered = "activations", False
            losses, chosen, rejected = pair_losses(m, batch, preference)
            inputs["held"] = (losses, chosen, rejected)  # the pair loop holds them through its backward
            return losses.sum() / batch_size
        return m(**batch, use_cache=False).loss

    head = model.get_output_embeddings()
    res = trace_step(model, fake=fake, device=device, make_inputs=make_inputs, loss_fn=loss_fn, head=head,
                      gradient_checkpointing=gradient_checkpointing, warm_steps=warm_steps, setup=setup,
                      checkpoint_layers=checkpoint_layers if gradient_checkpointing else 0,
                      optimizer=optimizer, cuda_int8=quantization == "int8" and device == "cuda",
                      packed_rows=mask == "packed", grads_before=grads_before,
                      long_context={"offload_checkpoints": offload_checkpoints, "mlp_chunk": mlp_chunk,
                                    "embeddings_on_host": embeddings_on_host,
                                    "attention_head_groups": attention_head_groups},
                      autocast=run_autocast(device, as_dtype(dtype), cpu_autocast),
                      hold_inputs=True)  # the text loops hold their batch until the backward ends
    kernel = attn_implementation if attn_implementation != "sdpa" else "+".join(res.info["sdpa_kernels"])
    res.info.update(model_type=cfg.model_type, batch_size=batch_size, seq_len=seq_len, mask=mask,
                    attn_implementation=attn_implementation, kernel=kernel or "sdpa",
                    source="tracker" if not fake else "predicted", quantization=quantization,
                    optimizer=optimizer, objective=preference.objective if preference else "sft",
                    attention_head_groups=attention_head_groups)
    return res


def trace_unet_step(config: Any, *, batch_size: int, resolution: int | tuple[int, int],
                    lora_rank: int = 16, lora_alpha: float | None = None,
                    target_modules: Any = UNET_LORA_TARGETS, gradient_checkpointing: bool = False,
                    dtype: torch.dtype | str = torch.bfloat16, device: str = "cuda",
                    text_seq_len: int = 77, lora_dropout: float = 0.0, fake: bool = True,
                    warm_steps: int = 0, attention: str = "sdpa", adapter: Any = None,
                    lean_backward: bool = True,
                    grads_before: bool = False) -> TraceResult:
    """Traces one LoRA training step of a diffusers ``UNet2DConditionModel`` (noise-prediction MSE).

    Inputs: noisy latents (B, in_channels, res/8, res/8), timesteps, text-encoder hidden states
    (B, text_seq_len, cross_attention_dim) and, for SDXL (``addition_embed_type="text_time"``),
    ``added_cond_kwargs`` text_embeds (B, 1280) and time_ids (B, 6). The VAE and text encoders
    are not part of the step (latents and embeddings are assumed cached).

    Args:
        config: a UNet config dict / path / bundled name (``"sd15-unet"``, ``"sdxl-unet"``).
        batch_size: images per micro-batch.
        resolution: pixels (square) or (height, width); both must be multiples of 8.
        lora_rank, lora_alpha, target_modules, lora_dropout: LoRA settings (default targets:
            to_q, to_k, to_v, to_out.0).
        gradient_checkpointing: diffusers gradient checkpointing of the down/mid/up blocks.
        dtype: weights dtype; device, fake, warm_steps: as in :func:`trace_text_step`.
        text_seq_len: tokens of the text encoder hidden states (77 for CLIP).
        attention: 'sdpa' (diffusers' AttnProcessor2_0, the default) or 'eager' (AttnProcessor:
            the S x S score matrix is materialised).
        adapter: the run's :class:`lora_gui.models.adapters.AdapterSpec` (None: LoRA).
        lean_backward: frozen layers keep only what their backward reads, as an optimized run's
            do (``RunConfig.resolved_lean_backward``).
        grads_before: the LoRA gradients exist before the forward (a micro-batch after the
            first of an accumulated step).

    Returns:
        A :class:`TraceResult`.
    """
    _check_common(batch_size, device)
    h, w = (resolution, resolution) if isinstance(resolution, int) else resolution
    if h < 8 or w < 8 or h % 8 or w % 8:
        raise ValueError(f"resolution must be a positive multiple of 8, got {resolution}")
    cfg = load_model_config(config)
    if not is_unet_config(cfg):
        raise ValueError("not a UNet2DConditionModel config: use trace_text_step")
    dt = as_dtype(dtype)
    unet = build_unet(cfg, dtype=dt, lora_rank=lora_rank, lora_alpha=lora_alpha,
                      target_modules=target_modules, lora_dropout=lora_dropout, adapter=adapter,
                      lean_backward=lean_backward)
    if attention == "eager":
        from diffusers.models.attention_processor import AttnProcessor

        unet.get_base_model().set_attn_processor(AttnProcessor())
    elif attention != "sdpa":
        raise ValueError(f"attention must be 'sdpa' or 'eager', got {attention!r}")
    c = dict(cfg)
    ctx_dim = c.get("cross_attention_dim", 768)
    ctx_dim = ctx_dim[0] if isinstance(ctx_dim, (list, tuple)) else ctx_dim

    from diffusers import DDPMScheduler

    from lora_gui.models.denoise import unet_loss
    from lora_gui.models.diffusion import Encoded

    def make_inputs() -> dict:
        # as the image loop holds them (engine/image/train.py): float32 latents (cached), the
        # prompt embeddings (and SDXL's pooled embedding and time ids) in the weights' dtype,
        # float32 noise and int64 timesteps
        latents = (batch_size, c.get("in_channels", 4), h // 8, w // 8)
        pooled = time_ids = None
        if c.get("addition_embed_type") == "text_time":
            # pooled text embedding width = projection input - 6 time ids x time-embedding width
            proj_in = c.get("projection_class_embeddings_input_dim", 2816)
            pooled = torch.randn(batch_size, proj_in - 6 * c.get("addition_time_embed_dim", 256), dtype=dt)
            time_ids = torch.randn(batch_size, 6, dtype=dt)
        enc = Encoded(torch.randn(latents), torch.randn(batch_size, text_seq_len, ctx_dim, dtype=dt),
                      pooled, time_ids)
        # epsilon prediction, as SD 1.x / SDXL train; built here so that its noise schedule is a
        # tensor of the trace's own mode (a fake one indexes it with fake timesteps)
        return {"enc": enc, "noise": torch.randn(latents), "timesteps": torch.randint(0, 1000, (batch_size,)),
                "scheduler": DDPMScheduler()}

    def loss_fn(m: nn.Module, batch: dict, tracker: _PhaseTracker) -> torch.Tensor:
        # the MSE loss and its gradient are the temporaries: the phase turns at the UNet's output
        hook = m.register_forward_hook(lambda _mod, _args, out: tracker.enter_head(out.sample))
        try:
            loss = unet_loss(m, batch["scheduler"], batch["enc"], batch["noise"], batch["timesteps"],
                             reduction="sum")
        finally:
            hook.remove()
        loss.held_inputs = batch  # the loop holds its batch until the backward is done
        return loss

    res = trace_step(unet, fake=fake, device=device, make_inputs=make_inputs, loss_fn=loss_fn, head=None,
                      gradient_checkpointing=gradient_checkpointing, warm_steps=warm_steps,
                      autocast=run_autocast(device, dt), grads_before=grads_before)
    kernel = "+".join(res.info["sdpa_kernels"]) if attention == "sdpa" else "eager"
    res.info.update(model_type="unet2d-condition", batch_size=batch_size, resolution=(h, w), kernel=kernel,
                    source="tracker" if not fake else "predicted")
    return res
