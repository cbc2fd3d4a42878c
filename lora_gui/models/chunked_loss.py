"""Chunked cross-entropy: the causal-LM loss without the batch's full float32 logits.

The usual head computes ``logits = lm_head(hidden)`` for every position, upcasts them to float32
and takes the cross-entropy: at the start of backward a step holds the float32 logits, their
log-softmax and two gradients of the same size, about 12 bytes per token per vocabulary entry
(16k tokens x 128k vocab: 24 GB). ``enable_chunked_loss(model, chunk)`` replaces the causal LM's
forward, when labels are given, by the decoder followed by the loss over ``chunk`` positions at a
time, so at most ``chunk`` rows of logits exist at once.

- Frozen ``nn.Linear`` head (the LoRA case: peft's ``all-linear`` skips the output layer): a fused
  autograd function computes each chunk's loss *and* its gradient with respect to the hidden
  states in the forward and keeps only that gradient (the size of the hidden states) for
  backward: no recompute, no logits kept. Cost: the hidden-state gradient is held from forward to
  backward (tokens x hidden x dtype bytes), and eval under ``no_grad`` skips it.
- Any other head (trainable, LoRA-wrapped, not a Linear): each chunk runs under non-reentrant
  activation checkpointing, so its logits are recomputed in backward (one extra head matmul).

The value is the same sum over the same terms as transformers' ``ForCausalLMLoss`` (labels shifted
by one, ``ignore_index`` -100, divided by ``num_items_in_batch`` or by the number of targets); only
the float summation order differs. Logit soft-capping (Gemma 2) is applied per chunk; heads that
rescale logits in other ways are refused with a clear error rather than trained wrongly.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lora_gui.models.cuda_autocast import checkpoint

IGNORE_INDEX = -100
UNSUPPORTED_SCALES = ("logit_scale", "logits_scaling")  # Cohere, Granite: heads we do not mimic


def _chunk_log_softmax(logits: torch.Tensor,
                       softcap: float | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """float32 log-softmax of one chunk of logits (soft-capped first when asked); the tanh for
    the soft-cap's derivative."""
    z = logits.float()
    t = None
    if softcap:
        t = torch.tanh(z / softcap)
        z = t * softcap
    return torch.log_softmax(z, dim=-1), t


def _softmax_rows_in_place(z: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Turns the float32 logits ``z`` (rows, vocab) into d(-log p_y)/dz = softmax - one_hot(y) in
    place, zero on rows whose target ``y`` is ignored; returns (that gradient, the rows' summed
    token losses).

    No second (rows, vocab) buffer: a row's loss is ``max + log(sum(exp(z - max))) - z_y``, from
    the target logit gathered first. A log-softmax would allocate one and need an exp pass more
    for the gradient (1.2x slower in float32, 1.5x in bf16, measured on a 4k vocabulary). The
    normalising pass also zeroes ignored rows (no host sync to find them)."""
    safe = y.clamp(min=0).unsqueeze(1)
    keep = (y != IGNORE_INDEX).unsqueeze(1).to(z.dtype)  # 1 for a target, 0 for an ignored row
    picked = z.gather(1, safe)
    top = z.amax(1, keepdim=True)
    z.sub_(top).exp_()
    total = z.sum(1, keepdim=True)
    loss = ((top + total.log() - picked) * keep).sum()
    z.mul_(keep / total)
    return z.scatter_add_(1, safe, keep.neg()), loss


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Sum of token losses of ``hidden @ weight.T (+ bias)``; gradient for ``hidden`` only."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk, softcap):  # noqa: ANN001, ANN205
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden)
        for start in range(0, hidden.shape[0], chunk):
            h, y = hidden[start:start + chunk], targets[start:start + chunk]
            logits = F.linear(h, weight, bias)
            if softcap:
                grad, loss = _softcapped_rows(logits, y, softcap)
            else:  # the float32 logits become their own gradient (the same buffer in float32)
                grad, loss = _softmax_rows_in_place(logits.float(), y)
            total = total + loss
            low = grad if grad.dtype == logits.dtype else logits.copy_(grad)  # into the logits' buffer
            del grad
            grad_hidden[start:start + chunk] = (low @ weight.to(logits.dtype)).to(hidden.dtype)
            del low, logits
        ctx.save_for_backward(grad_hidden)
        return total

    @staticmethod
    def backward(ctx, grad_out):  # noqa: ANN001, ANN205
        (grad_hidden,) = ctx.saved_tensors
        return grad_hidden * grad_out.to(grad_hidden.dtype), None, None, None, None, None


def _softcapped_rows(logits: torch.Tensor, y: torch.Tensor,
                     softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """As :func:`_softmax_rows_in_place` for soft-capped logits (Gemma 2): the tanh is kept for
    the cap's derivative, so this path holds log-probabilities beside it."""
    logp, t = _chunk_log_softmax(logits, softcap)
    valid = (y != IGNORE_INDEX).unsqueeze(1)
    safe = y.clamp(min=0).unsqueeze(1)
    loss = -(logp.gather(1, safe) * valid).sum()
    grad = logp.exp_()  # d(-log p_y)/dz = softmax - one_hot(y), zero where ignored
    grad.scatter_add_(1, safe, -torch.ones_like(safe, dtype=grad.dtype))
    grad.mul_(valid)
    grad.mul_(1 - t * t)
    return grad, loss


def _chunk_loss_sum(head: nn.Module, h: torch.Tensor, y: torch.Tensor, softcap: float | None) -> torch.Tensor:
    logp, _ = _chunk_log_softmax(head(h), softcap)
    return F.nll_loss(logp, y, ignore_index=IGNORE_INDEX, reduction="sum")


def _fusable(head: nn.Module) -> bool:
    return _own_class(head) is nn.Linear and not any(p.requires_grad for p in head.parameters())


def _own_class(module: nn.Module) -> type:
    """The module's class, under the subclass FSDP2's ``fully_shard`` makes of it (an FSDP head
    is still a plain Linear: its weight is gathered before the forward runs)."""
    from torch.distributed.fsdp import FSDPModule

    return next(c for c in type(module).__mro__ if not issubclass(c, FSDPModule))


def chunked_cross_entropy(hidden: torch.Tensor, labels: torch.Tensor, head: nn.Module, chunk: int,
                          num_items_in_batch: Any = None, softcap: float | None = None) -> torch.Tensor:
    """Causal-LM loss of ``head(hidden)`` against ``labels`` over ``chunk`` positions at a time.

    Args:
        hidden: (batch, seq, hidden) last hidden states.
        labels: (batch, seq) token ids, -100 where no loss is taken (shifted by one here).
        head: the output layer.
        chunk: positions per chunk (>= 1).
        num_items_in_batch: divisor of the summed loss (token-weighted accumulation); None: the
            number of target tokens (a mean).
        softcap: Gemma-2 style final logit soft-capping, or None.

    Returns:
        The scalar loss, equal to transformers' ``ForCausalLMLoss`` up to summation order.
    """
    if chunk < 1:
        raise ValueError(f"loss_chunk must be >= 1, got {chunk}")
    targets = F.pad(labels, (0, 1), value=IGNORE_INDEX)[:, 1:].reshape(-1).to(hidden.device)
    flat = hidden.reshape(-1, hidden.shape[-1])
    if not (torch.is_grad_enabled() and flat.requires_grad):  # eval: no gradient to keep
        total = sum(_chunk_loss_sum(head, flat[s:s + chunk], targets[s:s + chunk], softcap)
                    for s in range(0, flat.shape[0], chunk))
    elif _fusable(head):
        total = _FusedLinearCrossEntropy.apply(flat, head.weight, head.bias, targets, chunk, softcap)
    else:
        total = sum(checkpoint(_chunk_loss_sum, head, flat[s:s + chunk], targets[s:s + chunk], softcap,
                               use_reentrant=False) for s in range(0, flat.shape[0], chunk))
    if num_items_in_batch is None:
        return total / (targets != IGNORE_INDEX).sum()
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def enable_chunked_loss(model: nn.Module, chunk: int) -> nn.Module:
    """Makes a transformers causal LM compute its training loss in chunks (see module doc).

    Call it on the causal LM before peft wraps it (peft calls the wrapped model's ``forward``).
    Calls without labels (generation) run the original forward. Returns the same model.

    Raises:
        ValueError: chunk < 1, or a head that rescales logits in a way this loss does not mimic.
    """
    if chunk < 1:
        raise ValueError(f"loss_chunk must be >= 1, got {chunk}")
    config = model.config
    for key in UNSUPPORTED_SCALES:
        if getattr(config, key, None) not in (None, 1, 1.0):
            raise ValueError(f"loss_chunk: {config.model_type} rescales its logits ({key}); "
                             "the chunked loss does not support it, set loss_chunk=0")
    # kept on the model, not in the closure, so that a deep copy of the model runs its own
    # decoder and forward (copy.deepcopy rebinds a bound method held in the instance's dict);
    # enabled again (another chunk), the forward from before the first time stays
    if "_forward_without_chunked_loss" not in model.__dict__:
        model._forward_without_chunked_loss = model.forward
    softcap = getattr(config, "final_logit_softcapping", None)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None,  # noqa: ANN001, ANN202
                num_items_in_batch=None, **kwargs):
        if labels is None:
            return self._forward_without_chunked_loss(input_ids=input_ids, attention_mask=attention_mask,
                                                      position_ids=position_ids, **kwargs)
        from transformers.modeling_outputs import CausalLMOutputWithPast

        kwargs.pop("use_cache", None)
        kwargs.pop("logits_to_keep", None)
        out = getattr(self, self.base_model_prefix)(input_ids=input_ids, attention_mask=attention_mask,
                                                    position_ids=position_ids, use_cache=False, **kwargs)
        loss = chunked_cross_entropy(out.last_hidden_state, labels, self.get_output_embeddings(),
                                     chunk, num_items_in_batch, softcap)
        return CausalLMOutputWithPast(loss=loss, logits=None)

    model.forward = types.MethodType(forward, model)
    model.loss_chunk = chunk  # lets callers (and tests) see the switch is on
    return model
