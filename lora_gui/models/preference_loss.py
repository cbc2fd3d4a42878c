"""Preference losses on a micro-batch of pairs: DPO (sigmoid, IPO, hinge), ORPO and SimPO.

A micro-batch of ``n`` pairs is one forward of ``2n`` rows: the chosen answers first, then the
rejected ones (concatenated along the batch, so no row attends to another). Each row's
log-probability is the sum over its answer tokens (labels other than -100, shifted by one as in
the causal-LM loss). DPO's reference is the same model with the adapter switched off, run under
``no_grad`` before the policy's forward, or read from the batch (``ref_logps``: precomputed).

The training engine and the memory trace call :func:`pair_losses` with the same batch, so the
trace holds exactly what the run holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100
REF_KEY = "ref_logps"  # batch key of precomputed reference log-probabilities, (2n,) float32


@dataclass(frozen=True)
class PreferenceLoss:
    """What a preference step computes (RunConfig's objective and loss settings)."""

    objective: str  # dpo, orpo or simpo
    beta: float = 0.1
    dpo_loss: str = "sigmoid"
    orpo_lambda: float = 0.1
    simpo_gamma: float = 0.5
    ref_logps: str = "on_the_fly"
    chunk: int = 0  # positions whose logits exist at once (0: the whole batch's logits)

    @property
    def needs_reference(self) -> bool:
        """DPO compares with the reference model; ORPO and SimPO do not need one."""
        return self.objective == "dpo"

    @property
    def reference_pass(self) -> bool:
        """Whether each step runs the reference forward (DPO with on-the-fly reference)."""
        return self.needs_reference and self.ref_logps == "on_the_fly"


def preference_loss_of(cfg: Any) -> PreferenceLoss | None:
    """The run's preference loss, or None for a next-token (sft) run."""
    if getattr(cfg, "objective", "sft") == "sft":
        return None
    return PreferenceLoss(cfg.objective, cfg.beta, cfg.dpo_loss, cfg.orpo_lambda, cfg.simpo_gamma,
                          cfg.ref_logps, cfg.resolved_loss_chunk())


def _unwrapped(model: nn.Module) -> nn.Module:
    seen = model
    for _ in range(3):  # DDP / accelerate wrappers -> PeftModel
        if hasattr(seen, "disable_adapter"):
            return seen
        seen = getattr(seen, "module", seen)
    raise ValueError("the reference pass needs a peft model (its adapter is switched off)")


@contextlib.contextmanager
def adapter_off(model: nn.Module) -> Iterator[None]:
    """The base model: the peft adapter (and its trained token rows) switched off."""
    with _unwrapped(model).disable_adapter():
        yield


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of each row's answer-token log-probabilities (rows,) float32, answer tokens per row).

    ``gather - logsumexp`` instead of a full ``log_softmax``: no second (rows, seq, vocab) tensor
    is kept for backward.
    """
    logits = logits[:, :-1]
    targets = labels[:, 1:]
    mask = targets != IGNORE_INDEX
    picked = torch.gather(logits, 2, targets.masked_fill(~mask, 0).unsqueeze(-1)).squeeze(-1)
    token = (picked.float() - torch.logsumexp(logits.float(), dim=-1)) * mask
    return token.sum(-1), mask.sum(-1)


def _chunk_token_logps(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = head(hidden)
    picked = torch.gather(logits, 1, targets.unsqueeze(1)).squeeze(1)
    return picked.float() - torch.logsumexp(logits.float(), dim=-1)


def chunked_sequence_logps(hidden: torch.Tensor, labels: torch.Tensor, head: nn.Module,
                           chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sequence_logps` of ``head(hidden)`` over ``chunk`` positions at a time: each chunk's
    logits are recomputed in backward (non-reentrant checkpointing), so at most one chunk's
    logits exist at once instead of the batch's (rows x seq x vocab)."""
    from lora_gui.models.cuda_autocast import checkpoint

    rows, seq = labels.shape
    targets = labels[:, 1:].reshape(-1)
    mask = targets != IGNORE_INDEX
    safe = targets.masked_fill(~mask, 0)
    flat = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    parts = [checkpoint(_chunk_token_logps, head, flat[s:s + chunk], safe[s:s + chunk], use_reentrant=False)
             if torch.is_grad_enabled() else _chunk_token_logps(head, flat[s:s + chunk], safe[s:s + chunk])
             for s in range(0, flat.shape[0], chunk)]
    token = (torch.cat(parts) * mask).view(rows, seq - 1)
    return token.sum(-1), mask.view(rows, seq - 1).sum(-1)


def row_logps(model: nn.Module, batch: dict[str, torch.Tensor],
              chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's answer log-probability under ``model`` (one forward of every row); with
    ``chunk``, the decoder then the head over ``chunk`` positions at a time (a peft model)."""
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "position_ids")}
    if chunk > 0 and hasattr(model, "get_base_model"):
        causal = model.get_base_model()
        decoder = getattr(causal, causal.base_model_prefix)
        hidden = decoder(**inputs, use_cache=False).last_hidden_state
        return chunked_sequence_logps(hidden, batch["labels"], causal.get_output_embeddings(), chunk)
    logits = model(**inputs, use_cache=False).logits
    return sequence_logps(logits, batch["labels"])


def reference_logps(model: nn.Module, batch: dict[str, torch.Tensor], chunk: int = 0) -> torch.Tensor:
    """Each row's answer log-probability under the reference (adapter off, no grad)."""
    with torch.no_grad(), adapter_off(model):
        return row_logps(model, batch, chunk)[0]


def losses_from_logps(spec: PreferenceLoss, logps: torch.Tensor, counts: torch.Tensor,
                      ref: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss per pair, chosen reward, rejected reward); rewards are detached.

    DPO: h = (log pi_c - log ref_c) - (log pi_r - log ref_r); sigmoid -log s(beta h), ipo
    (h - 1 / (2 beta))^2, hinge max(0, 1 - beta h); rewards beta (log pi - log ref).
    SimPO: -log s(beta (avg_c - avg_r) - gamma) over length-normalised log-probabilities.
    ORPO: -avg_c + lambda * -log s(log odds_c - log odds_r), odds = p / (1 - p) of the
    length-normalised probability. SimPO and ORPO rewards: beta x average log-probability.
    """
    n = logps.shape[0] // 2
    chosen, rejected = logps[:n], logps[n:]
    if spec.objective == "dpo":
        if ref is None:
            raise ValueError("DPO needs the reference log-probabilities")
        c_ratio, r_ratio = chosen - ref[:n], rejected - ref[n:]
        h = c_ratio - r_ratio
        if spec.dpo_loss == "ipo":
            losses = (h - 1 / (2 * spec.beta)) ** 2
        elif spec.dpo_loss == "hinge":
            losses = torch.relu(1 - spec.beta * h)
        else:
            losses = -F.logsigmoid(spec.beta * h)
        return losses, spec.beta * c_ratio.detach(), spec.beta * r_ratio.detach()
    avg = logps / counts.clamp(min=1)
    avg_c, avg_r = avg[:n], avg[n:]
    if spec.objective == "simpo":
        losses = -F.logsigmoid(spec.beta * (avg_c - avg_r) - spec.simpo_gamma)
    elif spec.objective == "orpo":
        c, r = avg_c.clamp(max=-1e-6), avg_r.clamp(max=-1e-6)  # log(1 - p) needs p < 1
        log_odds = (c - r) - (torch.log1p(-torch.exp(c)) - torch.log1p(-torch.exp(r)))
        losses = -avg_c - spec.orpo_lambda * F.logsigmoid(log_odds)
    else:
        raise ValueError(f"unknown preference objective {spec.objective!r}")
    return losses, spec.beta * avg_c.detach(), spec.beta * avg_r.detach()


def pair_losses(model: nn.Module, batch: dict[str, torch.Tensor],
                spec: PreferenceLoss) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One micro-batch's preference step before backward: the reference pass (DPO on the fly),
    the policy forward of both answers, the loss per pair and the two rewards."""
    ref = None
    if spec.needs_reference:
        ref = batch[REF_KEY] if REF_KEY in batch else reference_logps(model, batch, spec.chunk)
    logps, counts = row_logps(model, batch, spec.chunk)
    return losses_from_logps(spec, logps, counts, ref)
