"""A text run's data and its steps: the tokenized samples (or preference pairs), each epoch's plan
of optimizer steps, one step's forward and backward over its micro-batches, and the held-out loss.

Loss normalisation: every micro-batch's summed token loss is divided by the number of target
tokens in the whole optimizer step (``num_items_in_batch``), so a step's gradient is the same
however the step is cut into micro-batches (the accumulation bug Hugging Face fixed in 2024).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate import Accelerator

from lora_gui.config import ConfigError, RunConfig
from lora_gui.data.batching import Step, collate, count_targets, plan_epoch
from lora_gui.data.model_inputs import training_batch
from lora_gui.data.pairs import load_pairs
from lora_gui.data.shard import step_targets
from lora_gui.data.text import TokenizedSample
from lora_gui.data.training_data import load_samples
from lora_gui.engine.core import fsdp
from lora_gui.engine.text.preference import check_start_adapter
from lora_gui.memory.runtime.guard import MicroBatchOutOfMemory
from lora_gui.models.preference_loss import preference_loss_of

EVAL_TOKEN_BUDGET = 8192  # padded tokens per eval micro-batch (no activations kept: no_grad)


@dataclass
class TextData:
    """Tokenized train and held-out samples plus the pad id."""

    train: list[TokenizedSample]
    held_out: list[TokenizedSample]
    pad_id: int
    tokenizer: Any = None  # chat data: carries the chat template, saved with the adapter
    is_chat: bool = False
    # preference runs: train holds PairSamples, held_out the held-out pairs' chosen rows (eval loss)
    preference: Any = None  # models.preference_loss.PreferenceLoss
    held_out_pairs: list = field(default_factory=list)
    reference: Any = None  # precomputed reference log-probabilities (pairs, 2)


def load_text_data(cfg: RunConfig, tokenizer) -> TextData:
    if cfg.init_adapter:  # refused with the data, before a run folder is written
        check_start_adapter(cfg)
    if cfg.is_preference:  # pairs through the chat template (lora_gui.data.pairs)
        pairs = load_pairs(cfg.data_path(), tokenizer, max_seq_len=cfg.max_seq_len,
                           eval_fraction=cfg.eval_fraction, seed=cfg.seed,
                           chat_template=cfg.chat_template, long_pairs=cfg.long_pairs)
        return TextData(pairs.train, [p.chosen for p in pairs.held_out], tokenizer.pad_token_id,
                        tokenizer, True, preference_loss_of(cfg), pairs.held_out)
    loaded = load_samples(cfg.data_path(), tokenizer, data_format=cfg.data_format,
                          max_seq_len=cfg.max_seq_len, eval_fraction=cfg.eval_fraction, seed=cfg.seed,
                          chat_template=cfg.chat_template, train_on_prompt=cfg.train_on_prompt)
    if not loaded.train:
        raise ConfigError(f"data: {cfg.data_path()} has no document of 2 or more tokens")
    return TextData(loaded.train, loaded.held_out, tokenizer.pad_token_id, tokenizer, loaded.is_chat)


def steps_per_epoch(cfg: RunConfig, n_samples: int) -> int:
    return math.ceil(n_samples / cfg.batch_size)


def epoch_plan(cfg: RunConfig, data: TextData, epoch: int, planned: bool = False) -> list[Step]:
    """The epoch's steps. ``planned``: the planner's caps per bucket (applied by the guard)
    size the micro-batches instead of the token budget (adaptive batch under a VRAM budget)."""
    token_budget = cfg.batch_size * cfg.max_seq_len if planned else cfg.sample_token_budget()
    return plan_epoch([len(s) for s in data.train], cfg.resolved_batching(),
                      batch_size=cfg.batch_size, max_seq_len=cfg.max_seq_len, seed=cfg.seed,
                      epoch=epoch, token_budget=token_budget, pad_multiple=cfg.pad_multiple,
                      packed_row=cfg.packed_row_tokens())


@torch.no_grad()
def evaluate(model, samples: list[TokenizedSample], pad_id: int, device: torch.device,
             token_budget: int = EVAL_TOKEN_BUDGET) -> float | None:
    """Token-weighted mean loss over samples (bucketed: padded to the longest, 64-rounded)."""
    if not samples:
        return None
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    plan = plan_epoch([len(s) for s in samples], "bucketed", batch_size=len(samples),
                      max_seq_len=max(len(s) for s in samples), seed=0, epoch=0,
                      token_budget=token_budget)
    for step in plan:
        for mb in step.micro_batches:
            batch = {k: v.to(device) for k, v in collate(samples, mb, pad_id).items()}
            n = count_targets(batch)
            if n:
                total += model(**batch, num_items_in_batch=n).loss.item() * n
                count += n
    model.train(was_training)
    fsdp.reshard(model)  # no backward after a no_grad forward: free the gathered FSDP units now
    return total / count if count else None


def run_step(model, accelerator: Accelerator, data: TextData, step: Step,
             n_targets: int | None = None) -> dict[str, float]:
    """Forward and backward of every micro-batch of one optimizer step (no optimizer update).

    ``n_targets``: the loss normaliser; with several ranks, the target tokens of the *global*
    step (default: this step's own, from the samples, no tensors needed).
    """
    if n_targets is None:
        n_targets = step_targets(data.train, step)
    loss_sum = 0.0
    for mb in step.micro_batches:
        try:
            batch = training_batch(model, data.train, mb, data.pad_id, accelerator.device)
            loss = model(**batch, num_items_in_batch=n_targets).loss
            accelerator.backward(loss)
        except torch.OutOfMemoryError as err:
            raise MicroBatchOutOfMemory(mb, err) from None
        loss_sum += loss.item()
        del loss, batch
    real = sum(len(data.train[i]) for i in step.indices)  # fillers are not counted as trained
    padded = sum((1 if mb.packed else len(mb.indices)) * mb.seq_len for mb in step.micro_batches)
    return {"loss": loss_sum, "real_tokens": real, "padded_tokens": padded,
            "target_tokens": n_targets}


def probe_step(model, data: TextData) -> Callable[[], None]:
    """One forward+backward of the run's model on a small real batch (for the precision probe)."""
    sample = min(data.train[: 8], key=len)
    ids = torch.tensor([sample.input_ids[:64]] * 2)

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    return step
